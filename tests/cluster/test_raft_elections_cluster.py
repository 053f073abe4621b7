"""PreVote and CheckQuorum in the Raft fork (FORK.md "PreVote and CheckQuorum") on real clusters
with a one-way cut in the chaos proxy: a follower cut off one way does not depose the leader, and
a leader that nobody answers steps down and another node leads. SyncObj driven by hand is in
tests/test_raft_elections.py."""
from __future__ import annotations

import os
import threading
import time

import pytest

from raftq.cluster.chaos.proxy import NetState
from raftq.cluster.local import http_json

from conftest import poll, proxied_cluster

skip_cluster = pytest.mark.skipif(os.environ.get("RAFTQ_SKIP_CHAOS", "") not in ("", "0"),
                                  reason="RAFTQ_SKIP_CHAOS set")


# ---------------------------------------------------------------------------- real clusters
def _cluster_with_proxies(tmp_path):
    return proxied_cluster(tmp_path / "c")


def _watch(c, stop, claims):
    def run(i):
        while not stop.is_set():
            s, v = http_json("GET", c.urls[i] + "/v1/cluster?digest=false", timeout=1)
            if s == 200:
                claims.append((i, v["role"], v["term"]))
            time.sleep(0.05)
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(c.n)]
    for th in threads:
        th.start()
    return threads


@skip_cluster
def test_a_follower_cut_off_one_way_does_not_depose_the_leader(tmp_path):
    """A follower that hears nothing (its incoming Raft traffic stalls) while it can still send:
    without PreVote it raised its term every election timeout and each vote request deposed the
    leader. With it, the leader and its term stay as they were for the whole cut."""
    c, net = _cluster_with_proxies(tmp_path)
    stop, claims = threading.Event(), []
    try:
        leader = c.wait_leader(30)
        term = c.cluster_view(leader)["term"]
        x = next(i for i in range(3) if i != leader)
        # wait_leader needs a majority only: x may not have heard the leader yet, and cut off
        # before it does it stays in term 0 (rightly: PreVote keeps it from raising its term).
        poll(lambda: all(v and v["term"] == term for v in c.cluster_views(digest=False)), timeout=10,
             what="every node in the leader's term")
        threads = _watch(c, stop, claims)
        net.apply(NetState(blocked={(j, x) for j in range(3) if j != x}))
        poll(lambda: (v := c.cluster_view(x, digest=False)) and v["leader"] is None, timeout=10,
             what="the cut-off follower losing its leader")
        deadline = time.monotonic() + 5.0     # several election timeouts of the cut-off node
        while time.monotonic() < deadline:
            v = c.cluster_view(leader, digest=False)
            assert v["role"] == "leader" and v["term"] == term, v
            time.sleep(0.2)
        net.apply(NetState())
        c.wait_converged(20)
        assert c.cluster_view(leader, digest=False)["term"] == term
        stop.set()
        for th in threads:
            th.join(5)
        assert {t for _, _, t in claims} == {term}, "a term changed during or after the cut"
    finally:
        stop.set()
        c.close()
        net.close()


@skip_cluster
def test_a_leader_nobody_answers_steps_down_and_another_node_leads(tmp_path):
    """The leader's incoming Raft traffic stalls: the followers still hear it, so they would wait
    for it forever; CheckQuorum makes it step down, and its TimeoutNow has a follower stand at
    once. Another node leads in a higher term while the cut lasts, and the old leader follows it."""
    c, net = _cluster_with_proxies(tmp_path)
    try:
        old = c.wait_leader(30)
        term = c.cluster_view(old)["term"]
        net.apply(NetState(blocked={(j, old) for j in range(3) if j != old}))
        new = c.wait_leader(15, exclude=old, among=[j for j in range(3) if j != old])
        assert c.cluster_view(new)["term"] > term
        poll(lambda: (v := c.cluster_view(old, digest=False)) and v["role"] != "leader", timeout=10,
             what="the old leader stepping down")
        assert "stepping down" in c.log_path(old).read_text(errors="replace")
        net.apply(NetState())
        c.wait_converged(20)
    finally:
        c.close()
        net.close()
