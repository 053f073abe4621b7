"""NexJob's delivery guarantees (docs/glossary.md), the lifecycle rows, through a real cluster: one test
per row (the event, then the job's state, its attempt and which handlers ran). docs/guarantees.md
"Lifecycle: release, timeout, delete, duplicates, dead-letter handlers" names each test.

One cluster serves the module (each test uses its own queues); the leader-kill test makes its own.
"""
import asyncio
import logging
import time

import pytest

from raftq.cluster.client import Client, Conflict, LeaseLost, Rejected
from raftq.cluster.local import LocalCluster
from raftq.cluster.worker import ExecutionTimeout, Worker
from tests.conftest import Api
from helpers_worker import Running, until

LEASE = 1500     # max_lease_duration_ms of the "lc-fast" queue


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("lifecycle"),
                      queues=[{"name": "lc-fast", "max_lease_duration_ms": LEASE},
                              {"name": "lc-timeout", "execution_timeout_ms": 400},
                              {"name": "lc-reject", "duplicate_policy": "reject"},
                              {"name": "lc-replace", "duplicate_policy": "replace"}],
                      storage={"dead_letter_retention_ms": 3_600_000}).launch() as c:
        yield c


@pytest.fixture
async def client(cluster):
    c = Client(cluster.urls)
    yield c
    await c.close()


async def state_of(client, job_id):
    return (await client.job(job_id)).state


# ---------------------------------------------------------------------------- clean shutdown
async def test_clean_shutdown_releases_in_flight_jobs_attempt_not_used(client):
    """NexJob: the host shuts down cleanly while it runs -> put back in the queue, attempt not used."""
    job_id = (await client.enqueue("lc-shutdown", "hang", max_attempts=1)).job_id
    started = []

    async def hang(job):
        started.append(job.attempt)
        await asyncio.sleep(3600)

    w = Worker(client, ["lc-shutdown"], {"hang": hang}, wait_ms=300, shutdown_timeout=0.3)
    r = Running(w)
    await until(lambda: started, what="the handler to start")
    stats = await r.finish()
    assert (stats.interrupted, stats.releases, stats.nacked, stats.dead_lettered) == (1, 1, 0, 0)
    view = await client.job(job_id)
    assert (view.state, view.attempt, view.releases, view.attempts_used) == ("ready", 2, 1, 1)
    # max_attempts 1: a nack would have dead-lettered it; released, it runs again and is acked
    done = []

    async def work(job):
        done.append((job.attempt, job.releases, job.is_last_attempt))

    w2 = Worker(client, ["lc-shutdown"], {"hang": work}, wait_ms=300)
    r2 = Running(w2)
    await until(lambda: w2.stats.acked == 1, what="the released job acked by another worker")
    await r2.finish()
    assert done == [(2, 1, True)]
    assert (await client.queue("lc-shutdown"))["dead_lettered"] == 0


async def test_clean_shutdown_releases_at_once_even_when_the_handler_ignores_its_cancellation(client):
    job_id = (await client.enqueue("lc-shutdown-stubborn", "hang")).job_id
    started, seen = [], []

    async def hang(job):
        started.append(job.id)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(2.0)            # ignores it; meanwhile the job is released already
            seen.append(await client.job(job.id))

    w = Worker(client, ["lc-shutdown-stubborn"], {"hang": hang}, wait_ms=300, shutdown_timeout=0.3,
               cancel_grace=0.2)             # the default 30 s lease: no extend wakes the supervisor
    r = Running(w)
    await until(lambda: started, what="the handler to start")
    stats = await r.finish()
    assert (stats.interrupted, stats.releases, stats.cancellation_ignored, stats.nacked) == (1, 1, 1, 0)
    (view,) = seen
    assert (view.id, view.state, view.attempt, view.releases) == (job_id, "ready", 2, 1)


# ---------------------------------------------------------------------------- foreign job type
async def test_foreign_job_type_is_deferred_attempt_not_used_and_the_owner_takes_it(client):
    """NexJob: the job type is not available in this process -> deferred by ForeignJobRetryDelay."""
    job_id = (await client.enqueue("lc-foreign", "billing", max_attempts=1)).job_id

    async def other(job):
        raise AssertionError("not this type")

    t0 = time.time() * 1000
    a = Worker(client, ["lc-foreign"], {"emails": other}, wait_ms=300, foreign_job_delay=1.0)
    ra = Running(a)
    await until(lambda: a.stats.releases == 1, what="the foreign job released")
    await ra.finish()
    view = await client.job(job_id)
    assert (view.state, view.attempt, view.releases, view.attempts_used) == ("scheduled", 2, 1, 1)
    assert (a.stats.failed, a.stats.nacked) == (0, 0)
    taken = []

    async def billing(job):
        taken.append((job.attempt, time.time() * 1000 - t0))

    b = Worker(client, ["lc-foreign"], {"billing": billing}, wait_ms=300)
    rb = Running(b)
    await until(lambda: b.stats.acked == 1, what="the owning worker's ack")
    await rb.finish()
    assert len(taken) == 1 and taken[0][0] == 2
    assert taken[0][1] >= 900                       # not before foreign_job_delay (1 s, server clock)


# ---------------------------------------------------------------------------- execution timeout
async def test_execution_timeout_cancels_the_handler_nacks_timeout_and_retries(client):
    """NexJob: it runs longer than its ExecutionTimeout -> cancelled, fails ("timeout"), retried."""
    job_id = (await client.enqueue("lc-timeout", "slow", max_attempts=3)).job_id
    queued = await client.job(job_id)
    assert queued.timeout_ms == 400                 # the queue's execution_timeout_ms, shown on the job
    own = (await client.enqueue("lc-timeout", "other", timeout_ms=5000)).job_id
    assert (await client.job(own)).timeout_ms == 5000
    await client.cancel(own)
    runs, cancelled = [], []

    async def slow(job):
        runs.append(job.attempt)
        if job.attempt == 1:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(job.attempt)
                raise
        seen = await client.job(job.id)
        runs.append(seen.state)

    w = Worker(client, ["lc-timeout"], {"slow": slow}, wait_ms=300)
    r = Running(w)
    await until(lambda: w.stats.acked == 1, what="the retry acked")
    stats = await r.finish()
    assert cancelled == [1] and runs[0] == 1 and runs[1] == 2
    assert (stats.timeouts, stats.nacked, stats.cancellation_ignored, stats.dead_lettered) == (1, 1, 0, 0)
    assert (await client.queue("lc-timeout"))["acked"] >= 1


async def test_a_handler_that_ignores_cancellation_keeps_its_slot_counted_and_logged_once(client, caplog):
    caplog.set_level(logging.WARNING, logger="raftq.worker")
    stuck = (await client.enqueue("lc-ignore", "stubborn", timeout_ms=200, max_attempts=1)).job_id
    ended = asyncio.Event()
    dead = []

    async def stubborn(job):
        if job.id != stuck:
            return
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(1.5)            # ignores the cancellation for a while
            ended.set()

    w = Worker(client, ["lc-ignore"], {"stubborn": stubborn}, concurrency=1, wait_ms=300, cancel_grace=0.2,
               dead_letter_handlers={"stubborn": lambda job, e: dead.append((job.id, type(e)))})
    r = Running(w)
    await until(lambda: w.stats.cancellation_ignored == 1, what="the ignored cancellation")
    # nacked at once (max_attempts 1: dead-lettered, the handler got the timeout) ...
    assert w.stats.timeouts == 1 and w.stats.dead_lettered == 1 and dead == [(stuck, ExecutionTimeout)]
    # ... while the slot stays taken: with concurrency 1 a new job waits
    other = (await client.enqueue("lc-ignore", "stubborn")).job_id
    assert w.in_flight == 1 and not ended.is_set()
    assert await state_of(client, other) == "ready"
    await until(lambda: ended.is_set(), what="the stubborn handler to end")
    await until(lambda: w.stats.acked == 1, what="the waiting job processed once the slot is free")
    await r.finish()
    ignored = [rec for rec in caplog.records if "ignored cancellation" in rec.getMessage()]
    assert len(ignored) == 1 and stuck in ignored[0].getMessage()


# ---------------------------------------------------------------------------- dead-letter handlers
async def test_throws_on_last_attempt_calls_the_dead_letter_handler_with_the_error(client):
    job_id = (await client.enqueue("lc-last", "boom", max_attempts=2)).job_id
    calls = []

    async def boom(job):
        raise RuntimeError(f"broken {job.attempt}")

    w = Worker(client, ["lc-last"], {"boom": boom}, wait_ms=300)

    @w.dead_letter_handler("boom")
    async def on_dead(job, error):
        calls.append((job.id, job.attempt, type(error), str(error)))

    r = Running(w)
    await until(lambda: calls, what="the dead-letter handler")
    stats = await r.finish()
    assert calls == [(job_id, 2, RuntimeError, "broken 2")]     # only on the last attempt
    assert (stats.nacked, stats.dead_lettered) == (2, 1)
    (rec,) = await client.drain("lc-last", max_records=10)
    assert (rec.cause, rec.final_attempt) == ("attempts_exhausted", 2)


async def test_a_no_retry_exception_dead_letters_at_once_and_calls_the_handler(client):
    job_id = (await client.enqueue("lc-noretry", "parse", max_attempts=5)).job_id
    calls = []

    async def parse(job):
        raise ValueError("bad input")

    w = Worker(client, ["lc-noretry"], {"parse": parse}, wait_ms=300, no_retry=(ValueError,),
               dead_letter_handlers={None: lambda job, e: calls.append((job.id, job.attempt, type(e)))})
    r = Running(w)
    await until(lambda: calls, what="the dead-letter handler")
    await r.finish()
    assert calls == [(job_id, 1, ValueError)]
    (rec,) = await client.drain("lc-noretry", max_records=10)
    assert (rec.cause, rec.final_attempt, rec.last_reason) == ("rejected", 1, "handler raised ValueError: bad input")


async def test_a_dead_letter_handler_that_raises_is_swallowed_and_the_others_still_run(client, caplog):
    caplog.set_level(logging.ERROR, logger="raftq.worker")
    first = (await client.enqueue("lc-dlraise", "fail", max_attempts=1)).job_id
    second = (await client.enqueue("lc-dlraise", "fail", max_attempts=1)).job_id
    ran = []

    async def fail(job):
        raise RuntimeError("no")

    def raising(job, error):
        ran.append(("raising", job.id))
        raise OSError("the alerting service is down")

    async def recording(job, error):
        ran.append(("recording", job.id))

    w = Worker(client, ["lc-dlraise"], {"fail": fail}, wait_ms=300, concurrency=1,
               dead_letter_handlers={"fail": [raising], None: recording})
    r = Running(w)
    await until(lambda: len(ran) == 4, what="both handlers for both jobs")
    stats = await r.finish()
    assert ran == [("raising", first), ("recording", first), ("raising", second), ("recording", second)]
    assert stats.dead_letter_handler_errors == 2 and stats.dead_lettered == 2
    assert sum("raised (swallowed)" in rec.getMessage() for rec in caplog.records) == 2
    states = {rec.job.id: rec.cause for rec in await client.drain("lc-dlraise", max_records=10)}
    assert states == {first: "attempts_exhausted", second: "attempts_exhausted"}     # the job stays failed


# ---------------------------------------------------------------------------- delete while running
async def test_delete_while_running_cancels_the_handler_and_the_job_never_comes_back(client):
    job_id = (await client.enqueue("lc-fast", "long")).job_id
    started, cancelled = [], []

    async def long(job):
        started.append(job.id)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(job.id)
            raise

    w = Worker(client, ["lc-fast"], {"long": long}, lease_ms=LEASE, wait_ms=300)
    r = Running(w)
    await until(lambda: started, what="the handler to start")
    assert await state_of(client, job_id) == "in_flight"
    await client.cancel(job_id)                     # DELETE /v1/jobs/{id} of an in-flight job
    await until(lambda: cancelled, what="the handler cancelled on the extend's job_not_found")
    assert w.stats.lease_lost == 1
    # past two lease durations: no redelivery, no dead letter
    await asyncio.sleep(2 * LEASE / 1000)
    stats = await r.finish()
    assert started == [job_id] and (stats.acked, stats.nacked) == (0, 0)
    q = await client.queue("lc-fast")
    assert (q["ready"], q["in_flight"], q["scheduled"], q["dead_lettered"]) == (0, 0, 0, 0)
    with pytest.raises(Exception) as e:
        await client.job(job_id)
    assert getattr(e.value, "status", None) == 404


# ---------------------------------------------------------------------------- duplicate policies
async def test_same_idempotency_key_again_return_existing_reject_replace(client):
    first = await client.enqueue("lc-dup", "t", "a", idempotency_key="k")
    again = await client.enqueue("lc-dup", "t", "b", idempotency_key="k")
    assert (again.job_id, again.deduplicated, again.replaced) == (first.job_id, True, False)
    # reject (the queue's policy): 422, the existing job's id in the answer
    kept = await client.enqueue("lc-reject", "t", "a", idempotency_key="k")
    with pytest.raises(Rejected) as e:
        await client.enqueue("lc-reject", "t", "b", idempotency_key="k")
    assert e.value.status == 422 and e.value.reason == "duplicate" and e.value.existing_job_id == kept.job_id
    # per enqueue: the field overrides the queue's
    over = await client.enqueue("lc-reject", "t", "c", idempotency_key="k", duplicate_policy="return_existing")
    assert (over.job_id, over.deduplicated) == (kept.job_id, True)
    # replace: payload, priority and schedule of a job that has not started
    orig = await client.enqueue("lc-replace", "t", "old", idempotency_key="k", delay_ms=600_000)
    rep = await client.enqueue("lc-replace", "t", "new", idempotency_key="k", priority=7)
    assert (rep.job_id, rep.deduplicated, rep.replaced) == (orig.job_id, True, True)
    view = await client.job(orig.job_id)
    assert (view.state, view.payload, view.priority) == ("ready", b"new", 7)
    (job,) = await client.reserve("lc-replace", 30_000)
    assert job.id == orig.job_id and job.payload == b"new"
    with pytest.raises(Conflict) as e:              # started: refused
        await client.enqueue("lc-replace", "t", "newer", idempotency_key="k")
    assert e.value.status == 409 and e.value.details["reason"] == "duplicate_started"
    assert e.value.details["job_id"] == orig.job_id
    await client.ack(job)


# ---------------------------------------------------------------------------- across a leader kill
def test_release_and_delete_running_across_a_leader_kill(make_cluster):
    c = make_cluster()
    api = Api(c)
    leader = c.wait_leader()
    s, rel = api.enqueue("lk", max_attempts=1)
    s, gone = api.enqueue("lk")
    s, got = api.reserve(["lk"], lease_ms=60_000, max_jobs=2)
    jobs = {j["id"]: j for j in got["jobs"]}
    assert set(jobs) == {rel["job_id"], gone["job_id"]}
    s, out = api.post(f"/v1/jobs/{rel['job_id']}/release", {"attempt": 1, "reason": "shutting down"})
    assert (s, out) == (200, {"job_id": rel["job_id"]})
    s, out = api.call("DELETE", f"/v1/jobs/{gone['job_id']}")
    assert (s, out) == (200, {"job_id": gone["job_id"]})
    c.wait_converged(10)
    c.kill(leader)
    new = c.wait_leader(15, among=[i for i in range(3) if i != leader])
    s, view = api.get(f"/v1/jobs/{rel['job_id']}", node=new)
    assert s == 200 and (view["state"], view["attempt"], view["releases"]) == ("ready", 2, 1)
    assert view["attempt"] - view["releases"] == 1            # attempts used: unchanged by the release
    s, out = api.post(f"/v1/jobs/{rel['job_id']}/ack", {"attempt": 1}, node=new)
    assert s == 404 and out["error"]["code"] == "job_not_found"
    s, got = api.reserve(["lk"], lease_ms=60_000, node=new)
    (job,) = got["jobs"]
    assert (job["id"], job["attempt"], job["releases"]) == (rel["job_id"], 2, 1)
    s, out = api.post(f"/v1/jobs/{rel['job_id']}/ack", {"attempt": 1}, node=new)
    assert s == 409 and out["error"]["code"] == "attempt_mismatch"         # the releasing worker is fenced
    s, out = api.post(f"/v1/jobs/{rel['job_id']}/nack", {"attempt": 2}, node=new)
    assert (s, out["dead_lettered"]) == (200, True)            # max_attempts 1: its one used attempt
    # the deleted job is gone on the new leader too
    s, _ = api.get(f"/v1/jobs/{gone['job_id']}", node=new)
    assert s == 404
    s, out = api.post(f"/v1/jobs/{gone['job_id']}/ack", {"attempt": 1}, node=new)
    assert s == 404 and out["error"]["code"] == "job_not_found"
    s, q = api.get("/v1/queues/lk", node=new)
    assert (q["ready"], q["in_flight"], q["scheduled"]) == (0, 0, 0)
    c.start(leader)
    views = c.wait_converged(20)
    assert len({v["digest"] for v in views}) == 1
