"""Job results on real nodes (docs/semantics.md "Job results"): an ack's result over HTTP and the
session, `GET /v1/jobs/{id}` at the leader and at a follower, the long poll `GET
/v1/jobs/{id}/result` at either (woken by the ack's apply, not by a timer), its refusals, the
per-queue bound; and across a leader kill (-9): a result acked before it is read from the next
leader, and a `Client.result` waiting through the kill gets the result acked after it.
Dependencies (docs/semantics.md "Dependencies") on the same cluster: a chain of 20 across a leader
kill, a fan-in at a follower with a failed member, refusals.

One three-node cluster serves the module; each test uses its own queue names and leaves the
cluster whole (`heal`).
"""
from __future__ import annotations

import asyncio
import base64
import re
import urllib.request
import threading
import time

import pytest

from raftq.cluster.client import Client, InvalidArgument, NotFound, Result, job_request
from raftq.cluster.worker import Worker
from raftq.cluster.local import LocalCluster
from tests.cluster.test_cli_consume import raftq
from tests.conftest import Api, heal, poll

RETAIN_MS = 120_000


def retaining(name: str, **extra) -> dict:
    return {"name": name, "result_retention_ms": RETAIN_MS, **extra}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("results"),
                     limits={"max_result_bytes": 4096},
                     storage={"dead_letter_retention_ms": 600_000},
                     queues=[retaining("res"), retaining("res-s"), retaining("res-f"), retaining("res-wait"),
                             retaining("res-kill"), retaining("res-dead"), retaining("res-cli"), retaining("res-w"),
                             retaining("res-bound", max_retained_result_bytes=10)])
    c.launch()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def healthy(cluster):
    return heal(cluster, 30)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def run_one(api: Api, queue: str, result: bytes | None = None, encoding="application/json") -> str:
    """Enqueue, reserve and ack one job of `queue` over HTTP (with `result`); its id."""
    status, out = api.enqueue(queue)
    assert status == 200, out
    status, out = api.reserve([queue])
    job = out["jobs"][0]
    body = {"attempt": job["attempt"]}
    if result is not None:
        body["result"] = {"data_b64": b64(result), "encoding": encoding}
    status, out = api.post(f"/v1/jobs/{job['id']}/ack", body)
    assert status == 200, out
    return job["id"]


def followers(c: LocalCluster) -> list[int]:
    leader = c.wait_leader(20)
    return [i for i in range(c.n) if i != leader]


def test_an_acked_result_is_shown_at_the_leader_and_at_a_follower(healthy):
    c, api = healthy, Api(healthy)
    jid = run_one(api, "res", b'{"rows": 3}')
    status, view = api.get(f"/v1/jobs/{jid}")
    assert status == 200 and view["state"] == "succeeded", view
    assert view["result"] == {"data_b64": b64(b'{"rows": 3}'), "encoding": "application/json"}
    assert view["result_dropped"] is False and view["retained_until_ms"] == view["finished_at_ms"] + RETAIN_MS
    for f in followers(c):
        assert api.get(f"/v1/jobs/{jid}", node=f) == (200, view)              # forwarded to the leader
        status, out = api.get(f"/v1/jobs/{jid}/result", node=f)                # its own state, or the leader's
        assert status == 200 and out["state"] == "succeeded", out
        assert out["result"] == view["result"] and out["job"] == view, out
    status, out = api.get(f"/v1/jobs/{jid}/result")
    assert status == 200 and out["state"] == "succeeded" and out["job"] == view


def test_refusals_and_the_answers_of_an_unfinished_and_an_unknown_job(healthy):
    api = Api(healthy)
    status, out = api.enqueue("res")
    jid = out["job_id"]
    assert api.get(f"/v1/jobs/{jid}/result") == (200, {"job_id": jid, "state": "pending", "job": None})
    started = time.monotonic()
    assert api.get(f"/v1/jobs/{jid}/result?wait_ms=300")[1]["state"] == "pending"
    assert time.monotonic() - started >= 0.25
    for f in followers(healthy):
        assert api.get(f"/v1/jobs/{jid}/result?wait_ms=200", node=f)[1]["state"] == "pending"
    unknown = "00000000-0000-4000-8000-0000000000aa"
    for node in (None, *followers(healthy)):
        status, out = api.get(f"/v1/jobs/{unknown}/result", node=node)
        assert status == 404 and out["error"]["code"] == "not_found", out
    assert api.get("/v1/jobs/nope/result")[0] == 400
    assert api.get(f"/v1/jobs/{jid}/result?wait_ms=-1")[0] == 400
    job = api.reserve(["res"])[1]["jobs"][0]
    status, out = api.post(f"/v1/jobs/{jid}/ack", {"attempt": job["attempt"],
                                                    "result": {"data_b64": b64(b"x" * 4097), "encoding": "e"}})
    assert status == 400 and out["error"]["field"] == "result" and out["error"]["limit"] == 4096, out
    assert api.get(f"/v1/jobs/{jid}")[1]["state"] == "in_flight"                 # nothing applied
    assert api.post(f"/v1/jobs/{jid}/ack", {"attempt": job["attempt"]})[0] == 200
    assert api.get(f"/v1/jobs/{jid}/result")[1]["result"] is None


def test_a_queue_without_retention_keeps_nothing_and_a_dead_letter_is_an_outcome(healthy):
    api = Api(healthy)
    jid = run_one(api, "plain", b"r")
    assert api.get(f"/v1/jobs/{jid}")[0] == 404 and api.get(f"/v1/jobs/{jid}/result")[0] == 404
    status, out = api.enqueue("res-dead", max_attempts=1)
    dead = out["job_id"]
    job = api.reserve(["res-dead"])[1]["jobs"][0]
    api.post(f"/v1/jobs/{dead}/nack", {"attempt": job["attempt"], "reason": "boom"})
    status, out = api.get(f"/v1/jobs/{dead}/result")
    assert out["state"] == "dead_lettered" and out["job"]["last_reason"] == "boom", out


def test_the_bound_drops_the_oldest_results_and_every_ack_succeeds(healthy):
    api = Api(healthy)
    first = run_one(api, "res-bound", b"aaaaaa")
    second = run_one(api, "res-bound", b"bbbbbb")           # 12 > 10: the first's result goes
    assert api.get(f"/v1/jobs/{first}")[1]["result_dropped"] is True
    assert api.get(f"/v1/jobs/{first}")[1]["state"] == "succeeded"
    assert api.get(f"/v1/jobs/{second}")[1]["result"]["data_b64"] == b64(b"bbbbbb")
    views = poll(lambda: healthy.wait_converged(30), 30, what="converged")
    assert len({v["digest"] for v in views}) == 1
    assert all(v["state"]["retained_jobs"] >= 2 for v in views), [v["state"] for v in views]


async def test_a_long_poll_is_woken_by_the_ack_at_the_leader_and_at_a_follower(healthy):
    c = healthy
    async with Client(c.urls) as client:
        for node in (c.wait_leader(20), followers(c)[0]):
            r = await client.enqueue("res-wait", "t", b"x")
            got = {}

            def wait(node=node, jid=r.job_id):
                got["answer"] = Api(c).get(f"/v1/jobs/{jid}/result?wait_ms=20000", node=node, timeout=30)
                got["at"] = time.monotonic()
            t = threading.Thread(target=wait)
            t.start()
            (job,) = await client.reserve(["res-wait"], lease_ms=30_000)
            await asyncio.sleep(0.3)                # parked by now (the answer would say pending otherwise)
            acked = time.monotonic()
            await client.ack(job, result="done", encoding="text/plain")
            await asyncio.to_thread(t.join, 25)
            status, out = got["answer"]
            assert status == 200 and out["state"] == "succeeded", out
            assert base64.b64decode(out["result"]["data_b64"]) == b"done"
            assert got["at"] - acked < 5, "woken by the apply, not by the end of the wait"


async def test_the_session_and_the_client_carry_results(healthy):
    c = healthy
    async with Client(c.urls, transport="session") as client:
        r = await client.enqueue("res-s", "t", b"x")
        (job,) = await client.reserve(["res-s"], lease_ms=30_000)
        waiter = asyncio.create_task(client.result(r.job_id, timeout=20))
        await client.ack(job, result=b"\x00\x01", encoding="application/octet-stream")
        res = await waiter
        assert res.succeeded and res.result == b"\x00\x01" and res.encoding == "application/octet-stream"
        assert res.job.id == r.job_id and res.job.state == "succeeded"
        r2 = await client.enqueue("res-s", "t", b"y")
        (job2,) = await client.reserve(["res-s"], lease_ms=30_000)
        with pytest.raises(InvalidArgument):
            await client.ack(job2, result=b"z" * 5000)
        assert await client.ack_batch([(job2, None, "batched")]) == [None]
        assert (await client.result(r2.job_id, timeout=5)).result == b"batched"
        with pytest.raises(TimeoutError):
            await client.result((await client.enqueue("res-s", "t", b"w")).job_id, timeout=0.5)
        with pytest.raises(NotFound):
            await client.result("00000000-0000-4000-8000-0000000000bb", timeout=1)


async def test_results_survive_a_leader_kill_and_a_waiting_client_gets_one_acked_after_it(healthy):
    """A result acked before the leader is killed (-9) is read from the next leader; a
    Client.result started before the kill, on a job acked after it, returns that result."""
    c = healthy
    async with Client(c.urls) as client, Client(c.urls) as waiting:
        before = await client.enqueue("res-kill", "t", b"x")
        (job,) = await client.reserve(["res-kill"], lease_ms=60_000)
        await client.ack(job, result="before the kill")
        after = await client.enqueue("res-kill", "t", b"y")
        waiter = asyncio.create_task(waiting.result(after.job_id, timeout=90, poll_s=5))
        await asyncio.sleep(0.5)
        old = await asyncio.to_thread(c.wait_leader, 15)
        await asyncio.to_thread(c.kill, old)
        new = await asyncio.to_thread(c.wait_leader, 30, [i for i in range(c.n) if i != old])
        assert new != old
        res = await client.result(before.job_id, timeout=30)
        assert res.succeeded and res.result == b"before the kill"
        assert not waiter.done()
        (job,) = await client.reserve(["res-kill"], lease_ms=60_000, wait_ms=10_000)
        assert job.id == after.job_id
        await client.ack(job, result="after the kill")
        got = await asyncio.wait_for(waiter, 60)
        assert got.succeeded and got.result == b"after the kill"
        await asyncio.to_thread(c.start, old)
        await asyncio.to_thread(c.wait_converged, 30)
        status, view = Api(c).get(f"/v1/jobs/{before.job_id}/result", node=old)
        assert status == 200 and base64.b64decode(view["result"]["data_b64"]) == b"before the kill"


def test_the_command_line_acks_with_a_result_and_waits_for_it(healthy):
    c, api = healthy, Api(healthy)
    jid = api.enqueue("res-cli")[1]["job_id"]
    job = api.reserve(["res-cli"])[1]["jobs"][0]
    code, out, err = raftq(c, "ack", jid, "--attempt", str(job["attempt"]), "--result", '{"ok": true}',
                           "--result-encoding", "application/json")
    assert code == 0, err
    code, out, err = raftq(c, "result", jid, "--wait", "5")
    assert code == 0 and "succeeded" in out and '"ok": true' in out, (out, err)
    code, out, err = raftq(c, "job", jid)
    assert code == 0 and "succeeded" in out and "result data" in out, (out, err)
    code, out, err = raftq(c, "result", jid, "--raw")
    assert code == 0 and out == '{"ok": true}', (out, err)
    other = api.enqueue("res-cli")[1]["job_id"]
    code, out, err = raftq(c, "result", other, "--wait", "0.5")
    assert code == 1 and "has not finished" in err, (out, err)


async def test_a_worker_handler_that_returns_a_result_acks_with_it(healthy):
    c = healthy
    async with Client(c.urls) as client:
        async def render(job):
            return Result(b"rendered " + job.payload, "text/plain")

        async def plain(job):
            return "ignored: only a Result is sent"
        w = Worker(client, ["res-w"], {"render": render, "plain": plain}, wait_ms=300)
        task = asyncio.create_task(w.run())
        try:
            a = await client.enqueue("res-w", "render", b"page 1")
            b = await client.enqueue("res-w", "plain", b"x")
            got = await client.result(a.job_id, timeout=20)
            assert got.succeeded and got.result == b"rendered page 1" and got.encoding == "text/plain"
            other = await client.result(b.job_id, timeout=20)
            assert other.succeeded and other.result is None
        finally:
            w.stop()
            await asyncio.wait_for(task, 30)


# ---------------------------------------------------------------------------- dependencies
# docs/semantics.md "Dependencies", on the same cluster: queues dep-* keep no results of their
# own, so what a dependent reads is kept for it alone.

async def test_a_chain_of_20_runs_in_order_across_a_leader_kill_and_each_job_reads_the_one_before(healthy):
    """Client.chain makes 20 jobs at once; a worker takes them one at a time from any node; the
    leader is killed (-9) after the 7th ack. Each job is delivered only once the one before was
    acked, reads its result, and the last one's result is gone once nothing names it."""
    c = healthy
    async with Client(c.urls) as client:
        ids = await client.chain(*[job_request("dep-chain", "step", str(i).encode()) for i in range(20)])
        assert len(set(ids)) == 20
        view = await client.job(ids[1])
        assert view.state == "waiting" and view.depends_on == ((ids[0], "success"),)
        order, old = [], None
        while len(order) < 20:
            jobs = await client.reserve(["dep-chain"], lease_ms=60_000, wait_ms=10_000, max_jobs=5)
            assert len(jobs) <= 1, [j.payload for j in jobs]          # never two steps at once
            for job in jobs:
                i = int(job.payload)
                if i:
                    assert job.depends_on == ((ids[i - 1], "success"),)
                    before = await client.result(ids[i - 1], timeout=30)      # kept for this job alone
                    assert before.succeeded and before.result == f"done {i - 1}".encode()
                order.append(i)
                await client.ack(job, result=f"done {i}")
            if len(order) == 7 and old is None:
                old = await asyncio.to_thread(c.wait_leader, 15)
                await asyncio.to_thread(c.kill, old)
                await asyncio.to_thread(c.wait_leader, 30, [i for i in range(c.n) if i != old])
        assert order == list(range(20))
        await asyncio.to_thread(poll, lambda: Api(c).get(f"/v1/jobs/{ids[18]}")[0] == 404, 10,
                                what="the 19th step's record goes once the 20th is acked")


def test_a_fan_in_at_a_follower_fails_on_a_dead_letter_and_its_complete_sibling_reads_every_result(healthy):
    """One atomic request at a follower: 6 members, a `success` fan-in and a `complete` fan-in by
    ref. One member is dead-lettered, then the leader is killed (-9): the success fan-in ends a
    dead letter (dependency_failed), the complete one runs once, after the last member ended, and
    reads the 5 results at another node."""
    c, api = healthy, Api(healthy)
    f = followers(c)[0]
    members = [{"queue": "dep-fan", "job_type": "member", "ref": f"m{i}"} for i in range(6)]
    deps = [{"ref": f"m{i}"} for i in range(6)]
    status, out = api.post("/v1/jobs/atomic", {"jobs": members + [
        {"queue": "dep-fan-in", "job_type": "all_ok", "depends_on": deps},
        {"queue": "dep-fan-in", "job_type": "report", "depends_on": [{**d, "policy": "complete"} for d in deps]}]},
        node=f)
    assert status == 200, out
    *ids, all_ok, report = [r["job_id"] for r in out["results"]]
    assert api.get("/v1/queues/dep-fan-in", node=f)[1]["waiting"] == 2
    for n in range(6):
        job = api.reserve(["dep-fan"], node=f)[1]["jobs"][0]
        assert api.reserve(["dep-fan-in"], node=f)[1]["jobs"] == []       # nothing before the last member
        if n == 2:
            body = {"attempt": job["attempt"], "retry": {"strategy": "dead_letter"}, "reason": "broken"}
            assert api.post(f"/v1/jobs/{job['id']}/nack", body, node=f)[0] == 200
            failed = job["id"]
            assert api.get(f"/v1/jobs/{all_ok}", node=f)[1]["state"] == "dead_lettered"
            old = c.wait_leader(15)         # the leader killed (-9) after the failure
            c.kill(old)
            c.wait_leader(30, [i for i in range(c.n) if i != old])
            f = f if f != old else next(i for i in range(c.n) if i != old)
            poll(lambda: api.get("/v1/queues/dep-fan-in", node=f)[0] == 200, 30, what="a leader answers through f")
            continue
        body = {"attempt": job["attempt"], "result": {"data_b64": b64(job["id"].encode()), "encoding": "text/plain"}}
        assert api.post(f"/v1/jobs/{job['id']}/ack", body, node=f)[0] == 200
    status, out = api.get("/v1/dead-letters?queue=dep-fan-in", node=f)
    assert [(r["job"]["id"], r["cause"]) for r in out["records"]] == [(all_ok, "dependency_failed")]
    (job,) = api.reserve(["dep-fan-in"], max_jobs=5, node=f)[1]["jobs"]
    assert job["id"] == report and [d["job_id"] for d in job["depends_on"]] == ids
    other = next(i for i in range(c.n) if i != f and c.alive(i))
    for dep in ids:                                 # read at another node than the one that enqueued
        status, res = api.get(f"/v1/jobs/{dep}/result", node=other)
        if dep == failed:
            assert res["state"] == "dead_lettered", res
        else:
            assert res["state"] == "succeeded" and base64.b64decode(res["result"]["data_b64"]) == dep.encode()
    assert api.post(f"/v1/jobs/{report}/ack", {"attempt": job["attempt"]}, node=f)[0] == 200
    assert api.get(f"/v1/jobs/{ids[0]}", node=f)[0] == 404                 # no live job names it now


def test_an_unknown_dependency_is_refused_at_any_node(healthy):
    c, api = healthy, Api(healthy)
    unknown = "00000000-0000-4000-8000-0000000000ab"
    for node in (c.wait_leader(20), followers(c)[0]):
        status, out = api.post("/v1/jobs", {"queue": "dep-bad", "job_type": "t", "depends_on": [unknown]}, node=node)
        assert status == 422 and out["error"]["rejection"] == {"reason": "dependency_not_found", "job_id": unknown}
    code, out, err = raftq(c, "enqueue", "dep-bad", "t", "--depends-on", unknown)
    assert code != 0 and "dependency_not_found" in err, (out, err)


def test_cancelling_a_graphs_root_at_a_follower_needs_cascade_and_takes_the_graph(healthy):
    c, api = healthy, Api(healthy)
    f = followers(c)[0]
    status, out = api.post("/v1/jobs/atomic", {"jobs": [
        {"queue": "dep-cc", "job_type": "root", "ref": "r"},
        {"queue": "dep-cc", "job_type": "a", "ref": "a", "depends_on": [{"ref": "r"}]},
        {"queue": "dep-cc", "job_type": "b", "depends_on": [{"ref": "a"}, {"ref": "r", "policy": "ignore"}]}]}, node=f)
    root, a, b = [r["job_id"] for r in out["results"]]
    status, out = api.call("DELETE", f"/v1/jobs/{root}", node=f)
    assert status == 409 and out["error"]["reason"] == "has_dependents" and out["error"]["dependents"] == sorted([a, b])
    status, out = api.call("DELETE", f"/v1/jobs/{root}?cascade=true", node=f)
    assert status == 200 and out == {"job_id": root, "cancelled": sorted([a, b])}, out
    assert all(api.get(f"/v1/jobs/{j}", node=f)[0] == 404 for j in (root, a, b))
    ids = [api.enqueue("dep-cc")[1]["job_id"]]
    ids.append(api.post("/v1/jobs", {"queue": "dep-cc", "job_type": "t", "depends_on": ids})[1]["job_id"])
    code, out, err = raftq(c, "cancel", ids[0])
    assert code != 0 and "cascade" in err, (out, err)
    code, out, err = raftq(c, "cancel", ids[0], "--cascade")
    assert code == 0 and f"and 1 job(s) waiting on it: {ids[1]}" in out, (out, err)


# ---------------------------------------------------------------------------- batches
async def test_a_fan_in_of_1000_gets_each_callback_once_after_the_last_member_across_a_leader_kill(healthy):
    """docs/semantics.md "Batches": an open batch filled with 1,000 members in four requests and
    closed; workers ack them in hundreds; the leader is killed (-9) after 400. No callback job
    exists before the last member's ack; then on_complete and on_success, once each, and no
    on_failure."""
    c = healthy
    async with Client(c.urls) as client:
        cbs = {k: job_request("bat-cb", k) for k in ("on_complete", "on_success", "on_failure")}
        bid, first = await client.open_batch([job_request("bat-m", "part", b"0")], open=True, **cbs)
        members = list(first)
        for n in range(4):
            members += await client.add_to_batch(bid, [job_request("bat-m", "part", str(n).encode())] *
                                                 (250 if n < 3 else 249))
        await client.close_batch(bid)
        assert len(set(members)) == 1000 and (await client.batch(bid))["state"] == "closed"
        acked, old = 0, None
        while acked < 1000:
            jobs = await client.reserve(["bat-m"], lease_ms=120_000, wait_ms=5_000, max_jobs=100)
            assert (await client.queue("bat-cb"))["ready"] == 0          # nothing before the last member
            if not jobs:
                continue
            if acked + len(jobs) == 1000:
                assert (await client.batch(bid))["pending"] == len(jobs)
            assert all(r is None for r in await client.ack_batch([(j, None, j.id) for j in jobs]))
            acked += len(jobs)
            if acked >= 400 and old is None:
                old = await asyncio.to_thread(c.wait_leader, 15)
                await asyncio.to_thread(c.kill, old)
                await asyncio.to_thread(c.wait_leader, 30, [i for i in range(c.n) if i != old])
        view = await client.batch(bid)
        assert view["state"] == "finished" and view["succeeded"] == 1000 and view["pending"] == 0, view
        assert {k: v["fired"] for k, v in view["callbacks"].items()} == \
            {"on_complete": True, "on_success": True, "on_failure": False}
        got = await client.reserve(["bat-cb"], lease_ms=60_000, max_jobs=10)
        assert sorted(j.job_type for j in got) == ["on_complete", "on_success"]
        assert {j.id for j in got} == {view["callbacks"]["on_complete"]["job_id"],
                                       view["callbacks"]["on_success"]["job_id"]}
        assert all(j.custom["batch_id"] == bid for j in got)
        for member in members[::97]:        # a callback reads the members' results, kept for the batch
            res = await client.result(member, timeout=10)
            assert res.succeeded and res.result == member.encode()


def test_a_batch_at_a_follower_fails_once_across_a_leader_kill_and_refuses_what_it_should(healthy):
    c, api = healthy, Api(healthy)
    f = followers(c)[0]
    body = {"jobs": [{"queue": "bat-f", "job_type": "t"}] * 3,
            "callbacks": {"on_failure": {"queue": "bat-fcb", "job_type": "failed"},
                          "on_complete": {"queue": "bat-fcb", "job_type": "done"}}}
    status, out = api.post("/v1/batches", body, node=f)
    assert status == 200 and out["open"] is False and len(out["results"]) == 3, out
    bid = out["batch_id"]
    for n in range(3):
        job = api.reserve(["bat-f"], node=f)[1]["jobs"][0]
        nack = {"attempt": job["attempt"], "retry": {"strategy": "dead_letter"}}
        assert api.post(f"/v1/jobs/{job['id']}/nack", nack, node=f)[0] == 200
        assert api.get("/v1/queues/bat-fcb", node=f)[1]["ready"] == (1 if n < 2 else 2)    # on_failure once
        if n == 0:                          # the leader killed (-9) after the first failure
            old = c.wait_leader(15)
            c.kill(old)
            c.wait_leader(30, [i for i in range(c.n) if i != old])
            f = f if f != old else next(i for i in range(c.n) if i != old)
            poll(lambda: api.get("/v1/queues/bat-fcb", node=f)[0] == 200, 30, what="a leader answers through f")
    status, view = api.get(f"/v1/batches/{bid}", node=f)
    assert view["failed"] == 3 and view["state"] == "finished"
    assert api.post(f"/v1/batches/{bid}/jobs", {"jobs": [{"queue": "bat-f", "job_type": "t"}]}, node=f)[1][
        "error"]["reason"] == "closed"
    status, out = api.post("/v1/batches", {"jobs": [], "callbacks": {"on_success": {"queue": "x"}}}, node=f)
    assert status == 400 and out["error"]["field"] == "callbacks.on_success", out
    status, out = api.post("/v1/batches", {"jobs": [{"queue": "bat-f", "job_type": "t",
                                                     "depends_on": ["00000000-0000-4000-8000-0000000000ab"]}]}, node=f)
    assert status == 422 and out["error"]["code"] == "batch_rejected"
    assert api.get("/v1/batches/00000000-0000-4000-8000-0000000000ab", node=f)[0] == 404
    code, out, err = raftq(c, "batch", bid)
    assert code == 0 and "3 failed" in out and "on_failure" in out, (out, err)
    status, out = api.post("/v1/batches", {"open": True, "jobs": [{"queue": "bat-c", "job_type": "t"}] * 2,
                                           "callbacks": {"on_complete": {"queue": "bat-fcb", "job_type": "gone"}}},
                           node=f)
    status, out = api.call("DELETE", f"/v1/batches/{out['batch_id']}", node=f)
    assert status == 200 and len(out["cancelled"]) == 2 and out["running"] == 0, out
    assert api.get("/v1/queues/bat-c", node=f)[1]["ready"] == 0
    text = urllib.request.urlopen(c.urls[f] + "/metrics", timeout=10).read().decode()
    assert re.search(r"^raftq_batches(\{[^}]*\})? [1-9]", text, re.M), "the batches gauge"
