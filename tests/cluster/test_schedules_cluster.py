"""Schedules on a real three-node cluster (docs/semantics.md "Schedules"): the HTTP API, the
client and the CLI; one job per tick across a leader kill, a leader pause and a partitioned
leader; and each catch-up policy after the whole cluster was down.

One cluster, its Raft links through a fault proxy (cluster/chaos/proxy.py), serves the module;
each test uses its own schedules and queues, and the fault tests restart what they stopped.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftq.cluster.chaos.proxy import NetState
from raftq.cluster.client import Conflict, NotFound, RaftqError, SyncClient
from raftq.node.core.schedules import SCHEDULE_FIELD, TICK_FIELD
from tests.conftest import poll, proxied_cluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def net_cluster(tmp_path_factory):
    c, net = proxied_cluster(tmp_path_factory.mktemp("schedules") / "c",
                             schedules=[{"name": "seeded", "cron": "0 3 * * *", "time_zone": "Asia/Tokyo",
                                         "job": {"queue": "seeded", "job_type": "nightly"}}])
    c.wait_leader(30)
    yield c, net
    c.close()
    net.close()


@pytest.fixture
def cluster(net_cluster):
    c, net = net_cluster
    net.apply(NetState())
    for i in range(c.n):
        if not c.alive(i):
            c.start(i)
    c.wait_leader(30)
    return c


@pytest.fixture(scope="module")
def client(net_cluster):
    with SyncClient(net_cluster[0].urls, transport="http", timeout=30) as c:
        yield c


def tick_jobs(client, queue: str) -> list:
    """Every ready job of `queue`, in the order of their ticks."""
    out, cursor = [], None
    while True:
        page = client.queue_jobs(queue, "ready", 100, cursor)
        out += page["jobs"]
        cursor = page["next_cursor"]
        if cursor is None:
            return sorted(out, key=lambda j: j.custom[TICK_FIELD])


def test_a_schedule_of_the_toml_is_seeded_once_per_cluster(cluster, client):
    seeded = poll(lambda: client.schedules()["schedules"], 30, what="the seeded schedule")
    assert [(s["name"], s["cron"], s["time_zone"], s["version"]) for s in seeded] == \
        [("seeded", "0 3 * * *", "Asia/Tokyo", 1)]
    client.delete_schedule("seeded")
    leader = cluster.wait_leader(20)
    cluster.kill(leader)                    # a new leader, whose TOML has it too, does not bring it back
    cluster.wait_leader(30, exclude=[leader])
    cluster.start(leader)
    cluster.wait_converged(30)
    assert client.schedules()["schedules"] == []


def test_the_api_client_and_cli_manage_a_schedule(cluster, client):
    saved = client.put_schedule("api-report", {"queue": "api-reports", "job_type": "report", "payload": b"{}",
                                               "encoding": "application/json", "priority": 3},
                                cron="0 6 * * MON-FRI", time_zone="Europe/Berlin", expect_version=0)
    assert saved["created"] and saved["version"] == 1 and saved["next_fire_at_ms"] > time.time() * 1000
    with pytest.raises(Conflict):
        client.put_schedule("api-report", {"queue": "api-reports", "job_type": "report"}, every_ms=5000,
                            expect_version=0)
    with pytest.raises(RaftqError) as e:
        client.put_schedule("api-bad", {"queue": "api-reports", "job_type": "report"}, cron="0 25 * * *")
    assert e.value.status == 400 and e.value.details.get("field") == "cron", e.value
    with pytest.raises(NotFound):
        client.schedule("api-bad")
    view = client.schedule("api-report")
    assert view["job"]["payload"] == {"data_b64": "e30=", "encoding": "application/json"} and view["job"]["priority"] == 3
    assert [s["name"] for s in client.schedules()["schedules"]] == ["api-report"]
    job_id = client.trigger_schedule("api-report")
    assert client.job(job_id).custom[SCHEDULE_FIELD] == "api-report"
    assert client.pause_schedule("api-report")["paused"] is True
    assert client.schedule("api-report")["next_fire_at_ms"] is None
    assert client.resume_schedule("api-report")["version"] == 3
    # the CLI, as a user runs it
    def cli(*args):
        p = subprocess.run([sys.executable, "-m", "raftq.cluster.cli", "schedules", *args, "--urls",
                            ",".join(cluster.urls)], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
        return p.returncode, p.stdout, p.stderr
    code, out, err = cli("put", "api-beat", "--every-ms", "60000", "--queue", "api-beats", "--type", "beat",
                         "--payload", '{"n":1}', "--overlap", "skip")
    assert code == 0 and "created (version 1)" in out, (out, err)
    code, out, err = cli("list")
    assert code == 0 and "api-beat" in out and "every 60000 ms" in out and "0 6 * * MON-FRI (Europe/Berlin)" in out
    code, out, err = cli("show", "api-beat", "--json")
    assert code == 0 and json.loads(out)["overlap"] == "skip"
    code, out, err = cli("put", "api-beat", "--cron", "61 * * * *", "--queue", "q", "--type", "t")
    assert code != 0 and "cron" in err, (out, err)
    code, out, err = cli("delete", "api-beat")
    assert code == 0 and "deleted" in out
    client.delete_schedule("api-report", expect_version=3)
    assert client.schedules()["schedules"] == []
    actions = [e["action"] for e in client.audit(limit=20)["entries"]]
    for action in ("schedule_create", "schedule_trigger", "schedule_pause", "schedule_resume", "schedule_delete"):
        assert action in actions


def _ticks_fired(client, name: str) -> int:
    return client.schedule(name)["fired"]


def test_one_job_per_tick_across_a_leader_kill_pause_and_partition(net_cluster, cluster, client):
    """Every second for about 30 s, with the leader killed, then paused, then cut off from the
    others: misfire_after_ms (10 s) covers every election, so every tick fires, and exactly once."""
    c, net = net_cluster
    client.put_schedule("failover-beat", {"queue": "failover-beats", "job_type": "beat"}, every_ms=1000,
                        misfire_after_ms=10_000)

    def run_for(seconds: float):
        target = _ticks_fired(client, "failover-beat") + int(seconds)
        poll(lambda: _ticks_fired(client, "failover-beat") >= target, seconds + 30, what=f"{target} ticks fired")

    run_for(3)
    leader = c.wait_leader(20)
    c.kill(leader)
    c.wait_leader(30, exclude=[leader])
    run_for(3)
    c.start(leader)
    leader = c.wait_leader(20)
    c.pause(leader)
    c.wait_leader(30, exclude=[leader])
    run_for(3)
    c.resume(leader)
    leader = c.wait_leader(20)
    net.apply(NetState(blocked={(j, x) for x in (leader,) for j in range(3) if j != x}
                       | {(leader, j) for j in range(3) if j != leader}))
    c.wait_leader(30, exclude=[leader])
    run_for(3)
    net.apply(NetState())
    run_for(2)
    client.pause_schedule("failover-beat")
    c.wait_converged(30)
    jobs = tick_jobs(client, "failover-beats")
    ticks = [j.custom[TICK_FIELD] for j in jobs]
    assert len(ticks) == len(set(ticks)), "a tick fired twice"
    first = ticks[0]
    assert ticks == list(range(first, first + 1000 * len(ticks), 1000)), "a tick was missed"
    assert len(ticks) == _ticks_fired(client, "failover-beat") >= 14


def test_each_catch_up_policy_after_the_whole_cluster_was_down(cluster, client):
    """Down for 8 s at a 1 s interval, misfire_after_ms 1000: `skip` fires no late tick, `one`
    exactly one (the latest missed), `all` every missed one."""
    for policy in ("skip", "one", "all"):
        client.put_schedule(f"down-{policy}", {"queue": f"down-{policy}", "job_type": "beat"}, every_ms=1000,
                            catchup=policy, misfire_after_ms=1000)
    poll(lambda: all(_ticks_fired(client, f"down-{p}") >= 2 for p in ("skip", "one", "all")), 30, what="ticks")
    for i in range(cluster.n):
        cluster.stop(i)
    time.sleep(8)                       # the outage itself, not a wait for something
    for i in range(cluster.n):
        cluster.start(i)
    cluster.wait_leader(30)
    restarted = time.time() * 1000
    for p in ("skip", "one", "all"):
        poll(lambda p=p: (client.schedule(f"down-{p}")["last_tick_at_ms"] or 0) > restarted + 1000, 30,
             what=f"down-{p} firing again")
        client.pause_schedule(f"down-{p}")
    for policy in ("skip", "one", "all"):
        jobs = tick_jobs(client, f"down-{policy}")
        ticks = [j.custom[TICK_FIELD] for j in jobs]
        late = [j.custom[TICK_FIELD] for j in jobs if j.enqueued_at_ms - j.custom[TICK_FIELD] > 1000]
        missing = (ticks[-1] - ticks[0]) // 1000 + 1 - len(ticks)
        assert len(ticks) == len(set(ticks)), (policy, ticks)
        if policy == "skip":
            assert late == [] and missing >= 5, (ticks, late)
        elif policy == "one":
            assert len(late) == 1 and missing >= 5, (ticks, late)
            assert late[0] + 1000 in ticks, "the one missed tick fired is the latest missed"
        else:
            assert len(late) >= 5 and missing == 0, (ticks, late)
