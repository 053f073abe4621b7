"""NexJob's delivery guarantees (docs/glossary.md) that raftq shows and forwards, through real clusters
(docs/guarantees.md "Visibility and forwarders"):

* the node dies on the job's last attempt: dead letter cause lease_expired, and one record job
  with the cause and the original job in the queue's forward queue;
* its deadline passes before it starts (the queue paused meanwhile): expired, never run, counted
  in expired_total and by cause, listed by the Expired filter, forwarded, in the metrics;
* a job is waiting: no_workers until a worker reserves (a long poll counts while it waits), then
  the workers count, and no_workers again a window later (shortened here);
* a forward across a leader kill: the records of dead letters made before and after the kill
  are on the new leader, one per dead letter, the same on every node.

Plus the leader's worker tracking (node/service/workers_seen.py) on its own, with a hand-driven clock.
"""
from __future__ import annotations

import base64
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from raftq.cluster.local import LocalCluster, http_json
from raftq.node.service.workers_seen import WorkersSeen
from tests.conftest import Api, poll

ROOT = Path(__file__).resolve().parents[2]
WINDOW_MS = 2000            # [testing] workers_window_ms of the module's cluster
LEASE = 1500
SOURCES = ("vis-dies", "vis-expires", "vis-failover")
QUEUES = ([{"name": s, "dead_letter_forward": f"{s}-records", "max_lease_duration_ms": LEASE} for s in SOURCES]
          + [{"name": f"{s}-records"} for s in SOURCES] + [{"name": "vis-wait"}])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("visibility"), storage={"dead_letter_retention_ms": 3_600_000},
                     queues=QUEUES, testing={"workers_window_ms": WINDOW_MS}).launch()
    yield c
    c.close()


@pytest.fixture(scope="module")
def api(cluster):
    return Api(cluster)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def records_in(api, queue, node=None) -> list[dict]:
    """The record jobs waiting in a forward queue, each with its decoded record."""
    status, out = api.get(f"/v1/queues/{queue}/jobs?state=ready&limit=100", node=node)
    assert status == 200, out
    got = []
    for j in out["jobs"]:
        assert j["job_type"] == "raftq.dead_letter" and j["payload"]["encoding"] == "application/json", j
        got.append({**j, "record": json.loads(base64.b64decode(j["payload"]["data_b64"]))})
    return got


def dead_record(api, job_id, node=None) -> dict | None:
    status, out = api.get("/v1/dead-letters?limit=100", node=node)
    return next((r for r in out["records"] if r["job"]["id"] == job_id), None)


def metric(cluster, node, line_start: str) -> float | None:
    with urllib.request.urlopen(cluster.urls[node] + "/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


# ---------------------------------------------------------------------------- the node dies on the last attempt
WORKER = """
import asyncio, sys
from pathlib import Path
from raftq.cluster.client import Client
from raftq.cluster.worker import Worker

async def main(urls, queue, marker):
    async def hang(job):
        Path(marker).write_text(f"{job.id} {job.attempt}")
        await asyncio.sleep(3600)
    c = Client(urls)
    await Worker(c, [queue], {"work": hang}, lease_ms=1500, wait_ms=500, worker_id="doomed").run()

asyncio.run(main(sys.argv[1].split(","), sys.argv[2], sys.argv[3]))
"""


def test_the_node_dies_on_the_jobs_last_attempt(cluster, api, tmp_path):
    q = "vis-dies"
    status, out = api.post("/v1/jobs", {"queue": q, "job_type": "work", "max_attempts": 1, "custom": {"k": "v"},
                                        "payload": {"data_b64": base64.b64encode(b'{"n": 7}').decode(),
                                                    "encoding": "application/json"}})
    assert status == 200, out
    jid = out["job_id"]
    marker = tmp_path / "running"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen([sys.executable, "-c", WORKER, ",".join(cluster.urls), q, str(marker)], env=env,
                         cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        poll(lambda: marker.exists(), timeout=30, what="the worker running the job")
        assert marker.read_text() == f"{jid} 1"
        # the worker was seen reserving from the queue (once the leader has led a window)
        poll(lambda: (api.get(f"/v1/queues/{q}")[1]["workers"] or 0) >= 1, timeout=WINDOW_MS / 1000 + 10,
             what="the worker counted")
        p.send_signal(signal.SIGKILL)            # the process running the job dies: no ack, no nack
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    rec = poll(lambda: dead_record(api, jid), timeout=LEASE / 1000 + 15, what="the orphaned job dead-lettered")
    assert rec["cause"] == "lease_expired" and rec["final_attempt"] == 1 and rec["last_reason"] is None
    assert api.get(f"/v1/jobs/{jid}")[1]["state"] == "dead_lettered"
    stats = api.get(f"/v1/queues/{q}")[1]
    assert stats["dead_lettered_by_cause"]["lease_expired"] == 1 and stats["expired_total"] == 0
    # the forwarder: one record job, with the cause and the original job as the API shows it
    [r] = poll(lambda: records_in(api, f"{q}-records"), timeout=5, what="the record job")
    assert r["record"]["cause"] == "lease_expired" and r["record"]["final_attempt"] == 1
    assert r["record"]["job"] == rec["job"] and r["record"]["failed_at_ms"] == rec["failed_at_ms"]
    assert base64.b64decode(r["record"]["job"]["payload"]["data_b64"]) == b'{"n": 7}'
    assert r["custom"] == {"dead_letter_cause": "lease_expired", "dead_letter_queue": q, "dead_letter_job_id": jid}
    # a record job is a normal job: a worker reserves it from the forward queue and acks it;
    # GET /v1/jobs/{id} takes its id
    assert api.get(f"/v1/jobs/{r['id']}")[1]["state"] == "ready"
    status, got = api.post("/v1/reserve", {"queues": [f"{q}-records"], "lease_ms": 5000, "worker_id": "reader"})
    assert status == 200 and [j["id"] for j in got["jobs"]] == [r["id"]]
    assert api.post(f"/v1/jobs/{r['id']}/ack", {"attempt": 1})[0] == 200


# ---------------------------------------------------------------------------- the deadline passes before it starts
def test_the_deadline_passes_before_it_starts_even_while_paused(cluster, api):
    q = "vis-expires"
    assert api.post(f"/v1/queues/{q}/pause")[0] == 200
    status, out = api.post("/v1/jobs", {"queue": q, "job_type": "t", "deadline_at_ms": now_ms() + 400})
    assert status == 200, out
    jid = out["job_id"]
    rec = poll(lambda: dead_record(api, jid), timeout=15, what="the job past its deadline dead-lettered")
    assert rec["cause"] == "expired" and rec["final_attempt"] == 1
    assert api.post(f"/v1/queues/{q}/resume")[0] == 200
    assert api.reserve([q])[1]["jobs"] == []                    # it never runs
    stats = api.get(f"/v1/queues/{q}")[1]
    assert stats["expired_total"] == 1 and stats["dead_lettered_by_cause"]["expired"] == 1
    assert stats["dead_lettered_by_cause"]["lease_expired"] == 0
    # what the Expired tab asks for
    status, out = api.get(f"/v1/dead-letters?queue={q}&cause=expired")
    assert [r["job"]["id"] for r in out["records"]] == [jid]
    [r] = records_in(api, f"{q}-records")
    assert r["record"]["cause"] == "expired" and r["record"]["job"]["id"] == jid
    assert r["record"]["job"]["deadline_at_ms"] == rec["job"]["deadline_at_ms"]
    # the metrics (the leader's) and raftq queues
    lead = cluster.wait_leader(10)
    node = cluster.ids[lead]
    assert metric(cluster, lead, f'raftq_jobs_expired_total{{node="{node}",queue="{q}"}}') == 1
    assert metric(cluster, lead, f'raftq_dead_letters{{node="{node}",queue="{q}",cause="expired"}}') == 1
    assert metric(cluster, lead, f'raftq_dead_letters{{node="{node}",queue="{q}",cause="admin"}}') == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("RAFTQ_API_KEY", None)
    p = subprocess.run([sys.executable, "-m", "raftq.cluster.cli", "queues", "--urls", ",".join(cluster.urls)],
                       capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=60)
    assert p.returncode == 0, p.stderr
    head = p.stdout.splitlines()[0].split()
    row = next(line.split() for line in p.stdout.splitlines() if line.startswith(q + " "))
    assert row[head.index("EXPIRED")] == "1"


# ---------------------------------------------------------------------------- a job is waiting
def queue_view(api, q, node=None) -> dict:
    status, out = api.get(f"/v1/queues/{q}", node=node)
    assert status == 200, out
    return out


def test_a_waiting_job_shows_no_workers_until_a_worker_reserves_and_again_a_window_later(cluster, api):
    q = "vis-wait"
    assert api.enqueue(q)[0] == 200
    lead = cluster.wait_leader(10)
    follower = next(i for i in range(cluster.n) if i != lead)
    # the leader knows once it has led a whole window; no worker has reserved from the queue
    v = poll(lambda: (x := queue_view(api, q)) and x["no_workers"] is True and x, timeout=WINDOW_MS / 1000 + 10,
             what="no_workers on the leader")
    assert v["workers"] == 0 and v["ready"] == 1
    # a follower redirects the queue reads; its metrics do not see reserves, and do not say
    assert http_json("GET", cluster.urls[follower] + f"/v1/queues/{q}", headers={"Raftq-Redirect": "1"})[0] == 307
    assert math.isnan(metric(cluster, follower, f'raftq_queue_workers{{node="{cluster.ids[follower]}",queue="{q}"}}'))
    assert metric(cluster, lead, f'raftq_queue_workers{{node="{cluster.ids[lead]}",queue="{q}"}}') == 0
    # a worker reserves (it takes the job): the badge goes
    status, out = api.post("/v1/reserve", {"queues": [q], "lease_ms": 60_000, "worker_id": "w1"})
    assert status == 200 and len(out["jobs"]) == 1
    v = queue_view(api, q)
    assert (v["workers"], v["no_workers"]) == (1, False)
    assert metric(cluster, lead, f'raftq_queue_workers{{node="{cluster.ids[lead]}",queue="{q}"}}') == 1
    # two reserves of the same worker and one anonymous: two workers
    api.post("/v1/reserve", {"queues": [q], "lease_ms": 1000, "worker_id": "w1"})
    api.post("/v1/reserve", {"queues": [q], "lease_ms": 1000})
    assert queue_view(api, q)["workers"] == 2
    # nobody reserves for a window: no workers again
    t0 = time.monotonic()
    v = poll(lambda: (x := queue_view(api, q)) and x["no_workers"] is True and x, timeout=WINDOW_MS / 1000 + 10,
             what="no_workers again")
    assert v["workers"] == 0 and time.monotonic() - t0 >= WINDOW_MS / 1000 * 0.5
    # a long poll that waits longer than the window counts for as long as it waits
    done = {}
    t = threading.Thread(target=lambda: done.update(out=api.post(
        "/v1/reserve", {"queues": [q], "lease_ms": 1000, "wait_ms": 2 * WINDOW_MS + 1000, "worker_id": "poller"},
        timeout=30)))
    t.start()
    try:
        poll(lambda: queue_view(api, q)["workers"] == 1, timeout=5, what="the parked worker counted")
        time.sleep(WINDOW_MS / 1000 + 0.5)      # longer than the window: it still waits
        assert queue_view(api, q)["workers"] == 1 and "out" not in done
    finally:
        t.join(30)
    assert done["out"][0] == 200
    poll(lambda: queue_view(api, q)["no_workers"] is True, timeout=WINDOW_MS / 1000 + 10, what="the poller gone")


# ---------------------------------------------------------------------------- a forward across a leader kill
def test_a_forward_across_a_leader_kill(tmp_path):
    src, fwd = "vis-failover", "vis-failover-records"
    c = LocalCluster(tmp_path / "c", storage={"dead_letter_retention_ms": 0}, queues=QUEUES).launch()
    try:
        api = Api(c)
        # one dead-lettered (and forwarded) before the kill, one in flight on its last attempt at the kill
        before = api.enqueue(src, max_attempts=1)[1]["job_id"]
        assert api.post(f"/v1/queues/{src}/dead-letter", {"ids": [before], "reason": "by hand"})[0] == 200
        during = api.enqueue(src, max_attempts=1)[1]["job_id"]
        status, out = api.post("/v1/reserve", {"queues": [src], "lease_ms": LEASE, "worker_id": "gone"})
        assert status == 200 and [j["id"] for j in out["jobs"]] == [during]
        c.wait_converged(10)
        leader = c.wait_leader(10)
        c.kill(leader)
        new = c.wait_leader(15, among=[i for i in range(3) if i != leader])
        # the new leader's sweep finds the lapsed lease: the dead letter (dropped: no store) and
        # its record are made there
        got = poll(lambda: (r := records_in(api, fwd, node=new)) and len(r) == 2 and r, timeout=20,
                   what="both records on the new leader")
        by_job = {r["record"]["job"]["id"]: r for r in got}
        assert set(by_job) == {before, during}
        assert by_job[before]["record"]["cause"] == "admin" and by_job[before]["record"]["last_reason"] == "by hand"
        assert by_job[during]["record"]["cause"] == "lease_expired"
        assert all(r["record"]["dead_letter_kept"] is False for r in got)
        assert api.get(f"/v1/jobs/{during}", node=new)[0] == 404      # no store: the job itself is gone
        assert api.get(f"/v1/queues/{src}", node=new)[1]["dead_lettered_total"] == 2
        # every node holds the same records under the same ids
        c.start(leader)
        views = c.wait_converged(30)
        assert len({v["digest"] for v in views}) == 1
        for i in range(3):
            assert sorted(r["id"] for r in records_in(api, fwd, node=i)) == sorted(r["id"] for r in got)
    finally:
        c.close()


# ---------------------------------------------------------------------------- the leader's worker tracking
class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_workers_seen_counts_forgets_and_stays_bounded():
    clock = Clock()
    w = WorkersSeen(window_ms=30_000, max_pairs=3, clock=clock)
    assert w.stats("a") == (None, None)                       # not leading
    w.lead()
    w.note(("a", "b"), "w1")
    w.prune()
    assert w.stats("a") == (None, None)                       # a new leader: not known for a window
    clock.t += 30
    w.prune()
    assert w.stats("a") == (1, False)                         # seen 30 s ago: just inside
    clock.t += 0.001
    w.prune()
    assert w.stats("a") == (0, True) and w.stats("b") == (0, True)
    w.note(("a",), "w1")
    w.note(("a",), None)
    w.note(("a",), None)                                      # anonymous reserves: one worker
    w.prune()
    assert w.count("a") == 2
    # the cap: a fourth pair pushes out the one seen longest ago
    w.note(("b",), "w2")
    w.note(("c",), "w3")
    w.prune()
    assert len(w.seen) == 3 and w.count("a") == 1 and w.count("b") == 1 and w.count("c") == 1
    # a parked reserve counts however long it waits, and once more when it leaves
    w.park(("d",), "p")
    clock.t += 100
    w.prune()
    assert w.count("d") == 1 and w.count("a") == 0
    w.unpark(("d",), "p")
    w.prune()
    assert w.count("d") == 1 and w.parked == {}
    clock.t += 31
    w.prune()
    assert w.count("d") == 0
    # leadership lost: nothing is known any more
    w.follow()
    assert w.stats("d") == (None, None) and not w.seen
