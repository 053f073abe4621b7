"""The Raft port against clients that do not know the secret (docs/limits.md "The Raft
port"; node/raft/FORK.md "Raft port before authentication"): a bounded pre-auth frame, a handshake deadline, a cap on pending
handshakes, refusals counted in /metrics and logged without the secret; and hypothesis over raw
frames. Real node processes (three, memory durability, a random secret), attacked on the
leader's Raft port and a follower's; no election may follow and the state must not change.
"""
from __future__ import annotations

import os
import pickle
import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftq.cluster.local import LocalCluster
from raftq.node.raft.encryptor import AeadEncryptor
from tests.attacks import (SECRET, Target, closed_by_peer, digest, metrics, poll, proc_stat, raft_flood, raft_idle,
                           still_open, view)

HANDSHAKE_TIMEOUT_S = 2.0
MAX_PENDING = 16
MAX_FRAME = 4096            # node/raft/transport.py HANDSHAKE_MAX_FRAME


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # [testing] sweeps = false: the state changes only by requests (the digest is compared).
    c = LocalCluster(tmp_path_factory.mktemp("raft-hostile"), durability="memory", secret=SECRET, testing={"sweeps": False},
                     tuning={"raft_handshake_timeout_s": HANDSHAKE_TIMEOUT_S,
                             "raft_max_pending_handshakes": MAX_PENDING}).launch()
    c.wait_converged()
    yield c
    c.close()


def terms(c: LocalCluster) -> list[int]:
    return [view(c, i, digest=False)["term"] for i in range(c.n)]


def refused(c: LocalCluster, i: int) -> dict:
    m = metrics(c, i)
    prefix = 'raftq_raft_refused_connections_total{reason="'
    return {k[len(prefix):-2]: v for k, v in m.items() if k.startswith(prefix)}


def refused_reaches(c: LocalCluster, i: int, reason: str, want: float) -> dict:
    """The refusal counts once `reason` reached `want`: the node closes a refused connection
    and then counts it (on its tick thread), so the peer can see the close first."""
    return poll(lambda: (r := refused(c, i))[reason] >= want and r, timeout=10, what=f"{reason} >= {want}")


def bound_hits(c: LocalCluster, i: int, bound: str) -> float:
    return metrics(c, i)[f'raftq_bound_hits_total{{bound="{bound}"}}']


def links_up(c: LocalCluster) -> bool:
    return all(all(m["connected"] for m in view(c, i, digest=False)["members"]) for i in range(c.n))


def test_a_huge_length_prefix_is_refused_before_anything_is_buffered(cluster):
    """Finding: a 0x7fffffff length prefix followed by streamed zeros was buffered whole (with
    a quadratic `bytes +=`) before the token was checked: 64 MB cost the node 12 s of CPU,
    missed heartbeats and forced elections (term 1 -> 7)."""
    t = Target(cluster)
    terms0 = terms(cluster)
    state0 = digest(cluster, t.node)
    r0 = refused(cluster, t.node)
    cpu0, _ = proc_stat(t.pid)
    out = raft_flood(t, mb=64)
    cpu1, _ = proc_stat(t.pid)
    assert out["closed_by_node"]
    # The node closed the connection on the prefix: most of the 64 MB never went out (what
    # did sat in the kernel's buffers), and it cost the node next to no CPU.
    assert out["sent_mb"] < 64, out
    assert cpu1 - cpu0 < 2.0, (cpu0, cpu1)
    assert refused_reaches(cluster, t.node, "frame_too_large", r0["frame_too_large"] + 1)["frame_too_large"] \
        == r0["frame_too_large"] + 1
    assert bound_hits(cluster, t.node, "raft_handshake_max_frame") == r0["frame_too_large"] + 1
    for prefix in (-1, MAX_FRAME + 1):
        s = socket.create_connection(("127.0.0.1", t.raft_port), timeout=10)
        s.sendall(struct.pack("i", prefix) + b"\0" * 100)
        assert closed_by_peer(s, 10.0), prefix
        s.close()
    assert refused_reaches(cluster, t.node, "frame_too_large", r0["frame_too_large"] + 3)["frame_too_large"] \
        == r0["frame_too_large"] + 3
    assert terms(cluster) == terms0 and links_up(cluster)
    assert digest(cluster, t.node) == state0


def test_a_wrong_secret_is_refused_counted_and_logged_without_the_secret(cluster):
    t = Target(cluster)
    r0 = refused(cluster, t.node)
    wrong = "another-secret-" + os.urandom(8).hex()
    token = AeadEncryptor(wrong).encrypt_at_time(pickle.dumps(os.urandom(32), 5), int(time.monotonic()))
    s = socket.create_connection(("127.0.0.1", t.raft_port), timeout=10)
    s.sendall(struct.pack("i", len(token)) + token)
    assert closed_by_peer(s, 10.0)
    s.close()
    assert refused_reaches(cluster, t.node, "auth_failed", r0["auth_failed"] + 1)["auth_failed"] == r0["auth_failed"] + 1

    def logged():
        text = cluster.log_path(t.node).read_text(errors="replace")
        return "Raft link: closed the connection from 127.0.0.1:" in text and text
    text = poll(logged, what="the refusal logged")
    assert SECRET not in text and wrong not in text


def test_idle_connections_are_closed_at_the_handshake_deadline_and_pending_ones_are_capped(cluster):
    """Finding: 300 idle connections that sent 3 bytes each were held indefinitely (no
    handshake deadline; listen backlog 5)."""
    t = Target(cluster)
    terms0 = terms(cluster)
    r0 = refused(cluster, t.node)
    socks = raft_idle(t, n=300)
    try:
        poll(lambda: not any(still_open(s) for s in socks), timeout=30, interval=0.2,
             what="every idle Raft connection closed")
    finally:
        for s in socks:
            s.close()
    r1 = poll(lambda: (r := refused(cluster, t.node))["handshake_timeout"] + r["too_many_pending"]
              - r0["handshake_timeout"] - r0["too_many_pending"] >= 300 and r, timeout=10, what="300 refusals counted")
    timed_out = r1["handshake_timeout"] - r0["handshake_timeout"]
    evicted = r1["too_many_pending"] - r0["too_many_pending"]
    # At most MAX_PENDING waited for their deadline; the others made room for newer ones.
    assert timed_out + evicted == 300 and 1 <= timed_out <= MAX_PENDING, (timed_out, evicted)
    assert metrics(cluster, t.node)["raftq_raft_pending_handshakes"] == 0
    assert terms(cluster) == terms0 and links_up(cluster)


# ------------------------------------------------------------------------------ hypothesis
def _frame(payload: bytes, length: int | None = None) -> bytes:
    return struct.pack("i", len(payload) if length is None else length) + payload


def _wrong_token(data: bytes) -> bytes:
    return AeadEncryptor("not-the-secret-0123456789abcdef").encrypt_at_time(data, 1)


frames = st.one_of(
    st.binary(max_size=2048),                                                # anything at all
    st.binary(max_size=2048).map(_frame),                                    # a well-formed length
    st.tuples(st.binary(max_size=512), st.integers(-2 ** 31, 2 ** 31 - 1)).map(lambda a: _frame(a[0], a[1])),
    st.binary(max_size=256).map(lambda b: _frame(_wrong_token(b))),          # the right shape, a wrong key
    st.binary(min_size=1, max_size=256).map(lambda b: _frame(b"\x01" + b)),  # the token's version byte
    st.binary(max_size=256).map(lambda b: _frame(pickle.dumps(b, 5))),       # a bare pickle, no token
)


@settings(max_examples=int(os.environ.get("RAFTQ_RAFT_FUZZ_EXAMPLES", "120")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.lists(frames, min_size=1, max_size=4), node=st.integers(0, 2),
       wait=st.integers(0, 9).map(lambda x: x == 0))          # 1 in 10: a deadline may take 2 s
def test_raw_frames_on_the_raft_port_change_nothing(cluster, data, node, wait):
    """Whatever bytes reach a node's Raft port from a client without the secret: the node
    stays up and answers, no election follows, the state does not change."""
    if not hasattr(cluster, "_fuzz0"):
        cluster._fuzz0 = (terms(cluster), digest(cluster, cluster.wait_leader()))
    port = cluster.raft_ports[node]
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        try:
            for d in data:
                s.sendall(d)
        except OSError:
            pass                                    # closed by the node mid-way
        if wait:                                    # the node ends it (refusal or deadline)
            assert closed_by_peer(s, HANDSHAKE_TIMEOUT_S + 10)
    finally:
        s.close()
    assert cluster.alive(node) and view(cluster, node, digest=False)["ready"]


def test_after_the_fuzz_no_election_and_the_same_state(cluster):
    """(Runs after the hypothesis test: the terms and the digest it started with.)"""
    if not hasattr(cluster, "_fuzz0"):
        pytest.skip("the fuzz test did not run")
    terms0, (applied0, digest0) = cluster._fuzz0
    assert terms(cluster) == terms0
    leader = cluster.wait_leader()
    assert digest(cluster, leader) == (applied0, digest0)
    cluster.wait_converged()
    poll(lambda: links_up(cluster), what="every Raft link up")
    total = sum(sum(refused(cluster, i).values()) for i in range(cluster.n))
    assert total > 0
