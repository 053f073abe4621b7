"""cluster.worker.Worker against a real three-node cluster: every handler outcome, automatic
lease extension against the real (clamped) expiry, lease loss, graceful shutdown.

One cluster serves the whole module (each test uses its own queues): starting real node
processes is the slow part on a small machine.
"""
import asyncio
import os
import signal
import time

import pytest

from raftq.cluster.client import Client, LeaseLost
from raftq.cluster.local import LocalCluster
from raftq.cluster.worker import Permanent, Retry, RetryAfter, Worker
from helpers_worker import Running, until

LEASE = 1500     # max_lease_duration_ms of the "fast" queues


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("worker"),
                      queues=[{"name": n, "max_lease_duration_ms": LEASE} for n in ("fast", "lost", "stuck")],
                      storage={"dead_letter_retention_ms": 3_600_000}).launch() as c:
        yield c


@pytest.fixture
async def client(cluster):
    c = Client(cluster.urls)
    yield c
    await c.close()


async def queue_stats(client, name):
    return await client.queue(name)


async def drain_dead(client, queue):
    return await client.drain(queue, max_records=100)


# ---------------------------------------------------------------------------- outcomes
async def test_return_acks_each_job_once_with_bounded_concurrency(client):
    ids = {(await client.enqueue("w-ack", "echo", f"{i}")).job_id for i in range(10)}
    seen, running, peak = [], [0], [0]

    async def echo(job):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        seen.append((job.id, job.attempt, job.payload))
        await asyncio.sleep(0.15)
        running[0] -= 1
        return "ok"

    w = Worker(client, ["w-ack"], {"echo": echo}, concurrency=3, wait_ms=500)
    r = Running(w)
    await until(lambda: w.stats.acked == 10, what="10 acks")
    stats = await r.finish()
    assert sorted(i for i, _, _ in seen) == sorted(ids)            # each delivered once
    assert all(a == 1 for _, a, _ in seen)
    assert peak[0] == 3                                             # bounded, and used
    assert (stats.reserved, stats.acked, stats.nacked, stats.failed, stats.lease_lost) == (10, 10, 0, 0, 0)
    q = await queue_stats(client, "w-ack")
    assert (q["ready"], q["in_flight"], q["acked"]) == (0, 0, 10)


async def test_retry_redelivers_with_next_attempt(client):
    job_id = (await client.enqueue("w-retry", "flaky")).job_id
    attempts = []

    async def flaky(job):
        attempts.append(job.attempt)
        if job.attempt == 1:
            raise Retry("try again")

    w = Worker(client, ["w-retry"], {"flaky": flaky}, wait_ms=500)
    r = Running(w)
    await until(lambda: w.stats.acked == 1, what="ack of attempt 2")
    stats = await r.finish()
    assert attempts == [1, 2]
    assert (stats.nacked, stats.acked, stats.dead_lettered, stats.failed) == (1, 1, 0, 0)
    q = await queue_stats(client, "w-retry")
    assert (q["ready"], q["in_flight"], q["scheduled"], q["nacked"], q["acked"]) == (0, 0, 0, 1, 1)
    assert job_id


async def test_retry_after_is_not_redelivered_before_the_delay(client):
    await client.enqueue("w-after", "later")
    seen = []
    raised_at = []

    async def later(job):
        seen.append((job.attempt, time.time()))
        if job.attempt == 1:
            raised_at.append(time.time())
            raise RetryAfter(800, "not yet")

    w = Worker(client, ["w-after"], {"later": later}, wait_ms=300)
    r = Running(w)
    await until(lambda: w.stats.acked == 1, what="ack after the delay")
    await r.finish()
    assert [a for a, _ in seen] == [1, 2]
    # Wall clocks of this process and of the (local) leader are the same clock; the nack was
    # sent after `raised_at`, so the job was scheduled for at least raised_at + 0.8 s.
    assert seen[1][1] - raised_at[0] >= 0.8 - 0.002, seen[1][1] - raised_at[0]


async def test_permanent_dead_letters_with_cause_rejected(client):
    job_id = (await client.enqueue("w-perm", "bad", max_attempts=5)).job_id

    async def bad(job):
        raise Permanent("malformed input")

    w = Worker(client, ["w-perm"], {"bad": bad}, wait_ms=300)
    r = Running(w)
    await until(lambda: w.stats.dead_lettered == 1, what="dead letter")
    stats = await r.finish()
    assert (stats.nacked, stats.dead_lettered, stats.acked, stats.failed) == (1, 1, 0, 0)
    (rec,) = await drain_dead(client, "w-perm")
    assert (rec.job.id, rec.cause, rec.final_attempt, rec.last_reason) == (job_id, "rejected", 1, "malformed input")


async def test_other_exception_nacks_default_until_attempts_exhausted(client):
    job_id = (await client.enqueue("w-exc", "boom", max_attempts=2)).job_id
    attempts = []

    async def boom(job):
        attempts.append(job.attempt)
        raise ValueError("kaput")

    w = Worker(client, ["w-exc"], {"boom": boom}, wait_ms=300)
    r = Running(w)
    await until(lambda: w.stats.dead_lettered == 1, what="attempts exhausted")
    stats = await r.finish()
    assert attempts == [1, 2]
    assert (stats.failed, stats.nacked, stats.dead_lettered, stats.acked) == (2, 2, 1, 0)
    (rec,) = await drain_dead(client, "w-exc")
    assert (rec.job.id, rec.cause, rec.final_attempt) == (job_id, "attempts_exhausted", 2)
    assert rec.last_reason == "handler raised ValueError: kaput"


async def test_unknown_job_type_is_released_with_foreign_job_delay_or_goes_to_catch_all(client):
    # A job type without a handler is released (no attempt used), deferred by
    # foreign_job_delay, instead of nacked.
    job_id = (await client.enqueue("w-unknown", "mystery", max_attempts=1)).job_id

    async def known(job):
        raise AssertionError("not this one")

    w = Worker(client, ["w-unknown"], {"known": known}, wait_ms=300, foreign_job_delay=30.0)
    r = Running(w)
    await until(lambda: w.stats.releases == 1, what="release of the unknown type")
    stats = await r.finish()
    assert (stats.failed, stats.nacked, stats.dead_lettered, stats.acked) == (0, 0, 0, 0)
    view = await client.job(job_id)
    assert (view.state, view.attempt, view.releases, view.attempts_used) == ("scheduled", 2, 1, 1)
    assert await client.cancel(job_id) is None

    # With a catch-all, the unknown type is handled (and acked).
    await client.enqueue("w-unknown", "mystery")
    caught = []

    async def catch_all(job):
        caught.append(job.job_type)

    w = Worker(client, ["w-unknown"], {"known": known}, catch_all=catch_all, wait_ms=300)
    r = Running(w)
    await until(lambda: w.stats.acked == 1, what="catch-all ack")
    await r.finish()
    assert caught == ["mystery"]


# ---------------------------------------------------------------------------- leases
async def test_auto_extension_keeps_a_job_three_times_its_lease_alive(client, cluster):
    job_id = (await client.enqueue("fast", "slow")).job_id
    runs = []

    async def slow(job):
        runs.append((job.id, job.attempt, job.lease_expires_at_ms))
        await asyncio.sleep(3 * LEASE / 1000)
        return "done"

    # The worker asks for 30 s; the queue clamps to 1.5 s. It must budget against the real
    # expiry, or the lease lapses after 1.5 s and the job is redelivered.
    w = Worker(client, ["fast"], {"slow": slow}, lease_ms=30_000, wait_ms=300)
    r = Running(w)
    await until(lambda: runs, what="handler start")
    # A competitor polls the same queue the whole time: it must never get the job.
    stolen = []
    async with Client(cluster.urls) as rival:
        async def compete():
            while not w.stats.acked:
                stolen.extend(await rival.reserve(["fast"], lease_ms=LEASE, wait_ms=300))
        competitor = asyncio.create_task(compete())
        await until(lambda: w.stats.acked == 1, timeout=20, what="the slow job's ack")
        await competitor
    stats = await r.finish()
    assert stolen == []
    assert len(runs) == 1 and runs[0][:2] == (job_id, 1)
    # the real grant was the clamped one, not the 30 s asked for
    assert stats.extended >= 2, stats
    assert (stats.acked, stats.lease_lost, stats.nacked, stats.reserved) == (1, 0, 0, 1)
    q = await queue_stats(client, "fast")
    assert (q["ready"], q["in_flight"], q["acked"]) == (0, 0, 1)


async def test_lease_loss_cancels_the_handler_and_sends_nothing(client, cluster):
    gate = asyncio.Event()                 # extends stall until this is set
    real_extend = client.extend
    sent = []                              # every ack/nack the worker sends
    real_ack, real_nack = client.ack, client.nack

    async def stalled_extend(*a, **kw):
        await gate.wait()
        return await real_extend(*a, **kw)

    async def spy_ack(job, *a, **kw):
        sent.append(("ack", job.id, job.attempt))
        return await real_ack(job, *a, **kw)

    async def spy_nack(job, *a, **kw):
        sent.append(("nack", job.id, job.attempt))
        return await real_nack(job, *a, **kw)

    client.extend, client.ack, client.nack = stalled_extend, spy_ack, spy_nack
    started, cancelled, release = [], [], asyncio.Event()
    outcomes = []

    async def blocker(job):
        started.append(job.id)
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(job.id)
            raise

    # One slot: while a handler blocks, the worker itself cannot reserve its lapsed job again
    # (with 16 it sometimes did, and the rival then got attempt 3).
    w = Worker(client, ["lost"], {"block": blocker}, lease_ms=LEASE, wait_ms=300, concurrency=1,
               on_outcome=lambda job, outcome, err: outcomes.append((job.id, outcome, err)))
    r = Running(w)
    async with Client(cluster.urls) as rival:
        # 1. Lost while running: the lease lapses (extends stalled), the sweep redelivers the
        #    job to a rival (attempt 2); the stalled extend then meets attempt_mismatch.
        job_id = (await client.enqueue("lost", "block")).job_id
        await until(lambda: started == [job_id], what="handler start")
        (again,) = await rival.reserve(["lost"], lease_ms=60_000, wait_ms=10_000)
        assert (again.id, again.attempt) == (job_id, 2)
        gate.set()
        await until(lambda: w.stats.lease_lost == 1, what="lease loss")
        assert cancelled == [job_id]
        assert sent == []                          # neither ack nor nack
        assert outcomes[0][:2] == (job_id, "lease_lost") and isinstance(outcomes[0][2], LeaseLost)
        await rival.ack(again)                     # the rival still owns it

        # 2. Lost, and the handler finishes anyway: its ack is refused with LeaseLost.
        gate.clear()
        k_id = (await client.enqueue("lost", "block")).job_id
        await until(lambda: started[-1:] == [k_id], what="second handler start")
        (k2,) = await rival.reserve(["lost"], lease_ms=60_000, wait_ms=10_000)
        assert (k2.id, k2.attempt) == (k_id, 2)
        release.set()
        await until(lambda: w.stats.lease_lost == 2, what="second lease loss")
        assert sent == [("ack", k_id, 1)]
        assert outcomes[1][:2] == (k_id, "lease_lost") and isinstance(outcomes[1][2], LeaseLost)
        await rival.ack(k2)
    gate.set()
    stats = await r.finish()
    assert (stats.lease_lost, stats.acked, stats.nacked, stats.errors) == (2, 0, 0, 0)


# ---------------------------------------------------------------------------- shutdown
async def test_sigterm_stops_reserving_and_lets_in_flight_jobs_finish(client):
    for i in range(3):
        await client.enqueue("w-stop", "work", f"{i}")
    started, finished = [], []
    release = asyncio.Event()

    async def work(job):
        started.append(job.id)
        await release.wait()
        await asyncio.sleep(0.2)
        finished.append(job.id)

    w = Worker(client, ["w-stop"], {"work": work}, concurrency=3, wait_ms=500, shutdown_timeout=20)
    r = Running(w, install_signal_handlers=True)
    await until(lambda: len(started) == 3, what="3 handlers running")
    later = [(await client.enqueue("w-stop", "work", "late")).job_id for _ in range(2)]
    os.kill(os.getpid(), signal.SIGTERM)
    await until(lambda: w.stopping, what="the worker to see SIGTERM")
    await asyncio.sleep(0.3)
    assert not r.task.done()                       # it waits for the in-flight jobs
    release.set()
    stats = await asyncio.wait_for(r.task, 20)
    assert sorted(finished) == sorted(started) and len(finished) == 3
    assert (stats.reserved, stats.acked, stats.nacked, stats.interrupted) == (3, 3, 0, 0)
    q = await queue_stats(client, "w-stop")
    assert (q["ready"], q["in_flight"], q["acked"]) == (2, 0, 3)      # the late jobs were not taken
    for job_id in later:
        assert (await client.job(job_id)).state == "ready"


async def test_shutdown_deadline_interrupts_and_releases_stuck_jobs(client):
    # Leases are clamped to 1.5 s on "stuck": extension keeps running during the grace period.
    job_id = (await client.enqueue("stuck", "hang")).job_id
    started = []

    async def hang(job):
        started.append(job.id)
        await asyncio.sleep(3600)

    w = Worker(client, ["stuck"], {"hang": hang}, lease_ms=LEASE, wait_ms=300, shutdown_timeout=2.0)
    r = Running(w)
    await until(lambda: started == [job_id], what="handler start")
    t0 = time.monotonic()
    stats = await r.finish()
    assert 2.0 <= time.monotonic() - t0 < 10
    assert (stats.interrupted, stats.releases, stats.nacked, stats.acked, stats.lease_lost) == (1, 1, 0, 0, 0)
    assert stats.extended >= 1                    # the grace period outlived the 1.5 s lease
    view = await client.job(job_id)
    # released: ready at once, a new delivery fence, no attempt used
    assert (view.state, view.attempt, view.releases, view.attempts_used) == ("ready", 2, 1, 1)


# ---------------------------------------------------------------------------- lease budget
async def test_lease_budget_uses_the_real_expiry_and_never_trusts_more_than_was_asked():
    from raftq.cluster.worker import _InFlight
    w = Worker(Client(["http://127.0.0.1:9"]), ["q"], {}, lease_ms=3000, extend_margin=1 / 3)
    loop = asyncio.get_running_loop()
    now_ms = time.time() * 1000
    rec = _InFlight(None)
    # Clamped grant (server says 1.5 s left, the worker asked 3 s): budget the 1.5 s.
    w._set_lease(rec, int(now_ms + 1500))
    assert 1.3 < rec.deadline - loop.time() <= 1.5
    assert abs((rec.deadline - rec.extend_at) - 0.5) < 0.05          # extend at 1/3 left
    # A wrong clock estimate that makes the grant look longer than asked is capped at lease_ms.
    w.clock_offset_ms = -60_000
    w._set_lease(rec, int(now_ms + 1500))
    assert rec.deadline - loop.time() <= 3.0
    # The estimate's uncertainty is taken off the budget; a short lease keeps a minimum margin.
    w.clock_offset_ms, w.clock_error_ms = 0.0, 200.0
    w._set_lease(rec, int(now_ms + 600))
    assert rec.deadline - loop.time() <= 0.4
    assert abs((rec.deadline - rec.extend_at) - w.min_extend_margin_ms / 1000) < 0.01
