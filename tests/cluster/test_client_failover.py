"""The client and the worker through a leader kill (-9), proven from the client's own records:
every enqueue that returned is delivered, none twice as a new job, retries add no jobs; every
lease loss surfaces as LeaseLost, every job is acked exactly once, redeliveries carry a higher
attempt. Plus leader discovery by redirect and the blocking facade.

One cluster serves the module; each test uses its own queues and leaves all three nodes
running and converged (the fixture `healthy` checks, and repairs, that before each test).
"""
import asyncio
import random
import time
from collections import defaultdict

import pytest

from raftq.cluster.client import Client, LeaseLost, SyncClient
from raftq.cluster.local import LocalCluster
from raftq.cluster.worker import Worker
from tests.conftest import heal

WF_LEASE = 2000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("failover"),
                      queues=[{"name": "wf", "max_lease_duration_ms": WF_LEASE}]).launch() as c:
        yield c


@pytest.fixture
def healthy(cluster):
    return heal(cluster, 30)


async def until(cond, timeout=30.0, what="condition", interval=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def kill_leader(c: LocalCluster) -> int:
    """kill -9 the leader, wait for a new one among the others, restart the old node."""
    old = await asyncio.to_thread(c.wait_leader, 15)
    await asyncio.to_thread(c.kill, old)
    await asyncio.to_thread(c.wait_leader, 15, [i for i in range(c.n) if i != old])
    await asyncio.to_thread(c.start, old)
    return old


async def settle(c: LocalCluster):
    await asyncio.to_thread(c.wait_leader, 30)
    await asyncio.to_thread(c.wait_converged, 30)


# ---------------------------------------------------------------------------- discovery
@pytest.mark.parametrize("transport", ["session", "http"])
async def test_client_follows_a_followers_redirect_and_remembers_the_leader(healthy, transport):
    c = healthy
    leader = c.wait_leader()
    follower = next(i for i in range(c.n) if i != leader)
    async with Client([c.urls[follower]], transport=transport) as client:
        client.leader = c.urls[follower]            # a stale belief: that node is a follower now
        r1 = await client.enqueue(f"redir-{transport}", "t", b"x")
        assert client.leader == c.urls[leader]
        assert client.stats["redirects"] == 1
        r2 = await client.enqueue(f"redir-{transport}", "t", b"y")
        (job,) = await client.reserve([f"redir-{transport}"], lease_ms=10_000)
        await client.ack(job)
        assert client.stats["redirects"] == 1        # remembered: no second redirect
        assert client.stats["retries"] == 0
        assert job.id == r1.job_id != r2.job_id
        # Discovery from scratch through a follower learns every member.
        async with Client([c.urls[follower]], transport=transport) as fresh:
            await fresh.enqueue(f"redir-{transport}", "t")
            assert fresh.leader == c.urls[leader]
            assert sorted(fresh.urls) == sorted(c.urls)


def test_sync_client_facade(healthy):
    c = healthy
    with SyncClient(c.urls) as sc:
        r = sc.enqueue("sync", "t", b"payload", priority=3)
        (job,) = sc.reserve(["sync"], lease_ms=10_000)
        assert (job.id, job.payload, job.priority, job.attempt) == (r.job_id, b"payload", 3, 1)
        assert sc.extend(job, 20_000) == job.lease_expires_at_ms
        sc.ack(job)
        with pytest.raises(LeaseLost):
            sc.ack(job)
        assert sc.server_info()["protocol_versions"] == ["v1"]
        assert sc.queue("sync")["acked"] == 1
        assert sc.leader in c.urls


# ---------------------------------------------------------------------------- producer loop
@pytest.mark.parametrize("transport", ["session", "http"])
async def test_producer_loop_through_a_leader_kill_delivers_every_returned_enqueue_once(healthy, transport):
    c = healthy
    queue, n, producers = f"prod-{transport}", 300, 16
    returned: dict[int, object] = {}          # enqueue index -> EnqueueResult
    errors: dict[int, BaseException] = {}     # enqueue index -> what it raised
    todo = iter(range(n))
    async with Client(c.urls, transport=transport, timeout=30) as client:
        async def produce():
            for i in todo:
                try:
                    returned[i] = await client.enqueue(queue, "p", str(i))
                except Exception as e:          # recorded, judged below
                    errors[i] = e
                await asyncio.sleep(0.03)       # keep the loop running through the kill

        tasks = [asyncio.create_task(produce()) for _ in range(producers)]
        await until(lambda: len(returned) >= n // 3, what="a third of the enqueues")
        before_kill = len(returned)
        await kill_leader(c)
        await asyncio.wait_for(asyncio.gather(*tasks), 90)
        retries = client.stats["retries"]
    assert before_kill < n - producers, "the kill came too late to matter"
    assert retries > 0, "no request was caught by the kill"

    # Every enqueue returned (the client retries through the election), with its own job.
    assert errors == {}, {i: repr(e) for i, e in errors.items()}
    ids = {i: r.job_id for i, r in returned.items()}
    assert len(ids) == n and len(set(ids.values())) == n

    # Drain the queue and compare with the records.
    delivered = []
    await settle(c)
    async with Client(c.urls, transport=transport) as drainer:
        while True:
            jobs = await drainer.reserve([queue], lease_ms=60_000, max_jobs=256)
            if not jobs:
                break
            delivered += jobs
            assert await drainer.ack_batch(jobs) == [None] * len(jobs)
        stats = await drainer.queue(queue)
    got = [j.id for j in delivered]
    assert len(got) == len(set(got)), "a job was delivered twice"
    assert set(got) == set(ids.values()), "delivered != returned"
    by_id = {j.id: j for j in delivered}
    for i, job_id in ids.items():
        assert by_id[job_id].payload == str(i).encode() and by_id[job_id].attempt == 1
    # No retry created a second job: the queue holds exactly the jobs of successful enqueues.
    assert stats["enqueued"] == n and (stats["ready"], stats["in_flight"], stats["acked"]) == (0, 0, n)
    await settle(c)


# ---------------------------------------------------------------------------- worker loop
async def test_worker_loop_through_a_leader_kill_acks_each_job_once_and_reports_lease_loss(healthy):
    c = healthy
    n = 60
    async with Client(c.urls) as client, Client(c.urls) as stale:
        ids = [(await client.enqueue("wf", "w", str(i), max_attempts=10)).job_id for i in range(n)]
        # A consumer that stalls: it reserves three jobs and never extends (lease 2 s).
        stale_jobs = await stale.reserve(["wf"], lease_ms=WF_LEASE, max_jobs=3)
        assert len(stale_jobs) == 3
        deliveries = defaultdict(list)          # job id -> attempts, in delivery order
        for j in stale_jobs:
            deliveries[j.id].append(j.attempt)
        outcomes = []                           # (job id, attempt, outcome, error)
        rng = random.Random(7)

        async def work(job):
            deliveries[job.id].append(job.attempt)
            await asyncio.sleep(rng.uniform(0.05, 0.35))

        w = Worker(client, ["wf"], {"w": work}, concurrency=8, lease_ms=WF_LEASE, wait_ms=500,
                   on_outcome=lambda job, o, err: outcomes.append((job.id, job.attempt, o, err)))
        run = asyncio.create_task(w.run())
        await until(lambda: w.stats.acked >= 12, what="a few acks before the kill")
        acked_before_kill = w.stats.acked
        killed = asyncio.create_task(kill_leader(c))
        # The stalled consumer acks its first job while the leader is being killed: the ack
        # may land before the kill, ride the election and win (the new leader has not expired
        # the lease yet), or be refused as LeaseLost. Any other answer is a bug.
        stale_results = {}
        try:
            await stale.ack(stale_jobs[0])
            stale_results[stale_jobs[0].id] = None
        except Exception as e:
            stale_results[stale_jobs[0].id] = e
        await killed
        # The other two are redelivered (lease expired) and acked by the worker; only then
        # does the stalled consumer ack them: that must be refused as LeaseLost.
        late = [j for j in stale_jobs[1:]]
        acked_ids = lambda: {o[0] for o in outcomes if o[2] == "acked"}
        await until(lambda: {j.id for j in late} <= acked_ids(), timeout=60, what="redelivery of stale jobs")
        for j in late:
            try:
                await stale.ack(j)
                stale_results[j.id] = None
            except Exception as e:
                stale_results[j.id] = e
        succeeded_stale = {jid for jid, e in stale_results.items() if e is None}
        await until(lambda: (acked_ids() | succeeded_stale) >= set(ids), timeout=60, what="every job acked")
        stats = await asyncio.wait_for(_stop(w, run), 30)
        await settle(c)
        q = await client.queue("wf")

    assert acked_before_kill < n - 8, "the kill came too late to matter"
    # Lease losses surfaced as LeaseLost, never as another error; no other outcome occurred.
    assert {o for _, _, o, _ in outcomes} <= {"acked", "lease_lost"}, outcomes
    assert all(isinstance(err, LeaseLost) for _, _, o, err in outcomes if o == "lease_lost")
    assert stats.lease_lost == sum(1 for o in outcomes if o[2] == "lease_lost")
    assert stats.errors == 0 and stats.nacked == 0 and stats.failed == 0
    for j in late:
        assert isinstance(stale_results[j.id], LeaseLost), repr(stale_results[j.id])
    first = stale_results[stale_jobs[0].id]
    assert first is None or isinstance(first, LeaseLost), repr(first)

    successes = defaultdict(list)               # job id -> attempts whose ack succeeded
    for jid, attempt, o, _ in outcomes:
        if o == "acked":
            successes[jid].append(attempt)
    for j in stale_jobs:
        if stale_results[j.id] is None:
            successes[j.id].append(j.attempt)
    for jid in ids:
        assert len(successes[jid]) == 1, (jid, successes[jid], deliveries[jid])     # acked exactly once
        seq = deliveries[jid]
        assert all(a < b for a, b in zip(seq, seq[1:])), (jid, seq)                   # strictly higher
        # no silent success for a superseded attempt, no redelivery after a success
        assert successes[jid][0] == max(seq), (jid, successes[jid], seq)
    assert sum(len(v) for v in deliveries.values()) > n, "no job was redelivered"
    assert (q["ready"], q["in_flight"], q["scheduled"], q["dead_lettered"]) == (0, 0, 0, 0)
    assert q["acked"] == n


async def _stop(worker, run):
    worker.stop()
    return await run
