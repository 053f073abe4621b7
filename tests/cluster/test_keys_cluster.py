"""Keys on a real three-node cluster (docs/semantics.md "Keys", node/core/keys.py): per-key
concurrency, a per-key rate and fair queueing across keys, each checked across a `kill -9` of
the leader, with the project's client (cluster/client.py) over loopback HTTP.

Times are the server's own: a reserved job's hand-out time on the leader's replicated clock is
`lease_expires_at_ms - lease_ms` (the leases asked for here are far below the queues'
max_lease_duration_ms, so none is clamped; test 1 checks each such time lies between the
reserve's send and its answer). Client and nodes share one host, so one wall clock: the time a
client sends an ack (taken before sending, floored to the ms as the leader's stamps are) is at
or before the leader's stamp of that ack.

One cluster serves the module, each test on its own queue; each test leaves all three nodes
running (the fixture `healthy` restarts any that is down). The fairness test runs last: it
leaves a restarted node catching up on a large log.
"""
from __future__ import annotations

import asyncio
import base64
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest

from raftq.cluster.client import Client, LeaseLost
from raftq.cluster.local import LocalCluster
from tests.conftest import heal
from tests.helpers_worker import until

CONC_Q, RATE_Q, FAIR_Q = "keys-conc", "keys-rate", "keys-fair"
RATE = {"count": 5, "period_ms": 1000}
# Key "slow" of the rate test: its own rate, a window longer than an election, so a new leader
# that forgot the window's log would show (the 1 s windows of the others end during the election).
SLOW_RATE = {"count": 5, "period_ms": 10_000}
QUEUES = [{"name": CONC_Q, "key_concurrency": 1},
          {"name": RATE_Q, "key_rate": RATE, "key_limits": {"slow": {"rate": SLOW_RATE}}},
          {"name": FAIR_Q}]
MAX_BATCH = 256                         # max_enqueue_batch and max_reserve_batch (defaults)


def wall_ms() -> int:
    """This host's wall clock as the leader stamps it (node/replication/proposer.py wall_ms)."""
    return time.time_ns() // 1_000_000


def job_req(queue: str, key: str, n: int) -> dict:
    """An EnqueueRequest of key `key` whose payload is `n` (its place in the key's order)."""
    return {"queue": queue, "job_type": "t", "key": key,
            "payload": {"data_b64": base64.b64encode(str(n).encode()).decode(),
                        "encoding": "application/octet-stream"}}


async def enqueue_all(client: Client, reqs: list, parallel: int = 4) -> list[str]:
    """Enqueue `reqs` in batches of MAX_BATCH, `parallel` batches in flight; the job ids in order."""
    batches = [reqs[i:i + MAX_BATCH] for i in range(0, len(reqs), MAX_BATCH)]
    out: list = [None] * len(batches)
    todo = iter(range(len(batches)))

    async def run():
        for b in todo:
            res = await client.enqueue_batch(batches[b], timeout=60)
            bad = [r for r in res if not hasattr(r, "job_id")]
            assert not bad, bad[:3]
            out[b] = [r.job_id for r in res]

    await asyncio.gather(*(run() for _ in range(parallel)))
    return [i for b in out for i in b]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("keys") / "c", queues=QUEUES).launch() as c:
        yield c


@pytest.fixture
def healthy(cluster):
    return heal(cluster, 60)


async def kill_leader(c: LocalCluster) -> tuple[int, int]:
    """kill -9 the leader, wait for a new one among the others, restart the old node:
    (the old leader's index, wall ms when the new leader was seen)."""
    old = await asyncio.to_thread(c.wait_leader, 15)
    await asyncio.to_thread(c.kill, old)
    await asyncio.to_thread(c.wait_leader, 30, None, old)
    seen = wall_ms()
    await asyncio.to_thread(c.start, old)
    return old, seen


@dataclass
class Delivery:
    job_id: str
    key: str
    attempt: int
    t: int                      # hand-out time, leader's replicated clock
    expiry: int                 # lease_expires_at_ms
    sent: int                   # wall ms the reserve was sent
    answered: int               # wall ms its answer arrived
    ack_sent: int | None = None
    acked: bool = False
    lost: bool = False          # the ack was answered LeaseLost

    @property
    def end(self) -> int:
        """Until when the job was certainly in flight: the earlier of the ack's send and the
        lease's end."""
        return self.expiry if self.ack_sent is None else min(self.ack_sent, self.expiry)


# ---------------------------------------------------------------------------- 1. concurrency
N_KEYS, HOT_KEYS, HOT_JOBS, COLD_JOBS = 1000, 10, 80, 2
WORKERS, CLIENTS = 50, 5
CONC_LEASE = 4000


async def test_key_concurrency_one_holds_for_50_workers_over_1000_keys_across_a_leader_kill(healthy):
    """1,000 keys, key_concurrency 1: ten hot keys with 80 jobs each (so that, once the others
    are done, 50 workers contend for ten keys) and 990 keys with 2; 50 concurrent reservers
    hold each job 0-5 ms and ack it; the leader is killed during the hot phase. No two
    hand-outs of one key overlap, on the server's own times; every job is acked exactly once."""
    c = healthy
    keys = [f"k{i:04d}" for i in range(N_KEYS)]
    reqs, key_of = [], {}
    for rnd in range(HOT_JOBS):
        for i, k in enumerate(keys):
            if rnd < (HOT_JOBS if i < HOT_KEYS else COLD_JOBS):
                reqs.append(job_req(CONC_Q, k, rnd))
    n = len(reqs)
    clients = [Client(c.urls, timeout=30) for _ in range(CLIENTS)]
    try:
        main = clients[0]
        ids = await enqueue_all(main, reqs)
        for jid, r in zip(ids, reqs):
            key_of[jid] = r["key"]
        assert len(set(ids)) == n
        q = await main.queue(CONC_Q)
        assert (q["ready"], q["keys"], q["keys_at_limit"], q["ready_held_by_keys"]) == (n, N_KEYS, 0, 0), q

        deliveries: list[Delivery] = []
        acked: Counter = Counter()

        def record(j, lease, sent, answered) -> Delivery:
            d = Delivery(j.id, key_of[j.id], j.attempt, j.lease_expires_at_ms - lease, j.lease_expires_at_ms,
                         sent, answered)
            deliveries.append(d)
            return d

        # Every key gets one job in flight: the first 1,000 hand-outs are one per key (the
        # limit allows no more), and then every key is at its limit with a job ready behind it.
        first: list[Delivery] = []
        while len(first) < N_KEYS:
            sent = wall_ms()
            jobs = await main.reserve(CONC_Q, 20_000, max_jobs=MAX_BATCH)
            answered = wall_ms()
            assert jobs, f"only {len(first)} jobs could be reserved, expected one per key"
            first += [record(j, 20_000, sent, answered) for j in jobs]
        assert sorted(d.key for d in first) == keys
        q = await main.queue(CONC_Q)
        assert (q["in_flight"], q["ready"], q["keys"], q["keys_at_limit"], q["ready_held_by_keys"]) == \
            (N_KEYS, n - N_KEYS, N_KEYS, N_KEYS, n - N_KEYS), q
        assert await main.reserve(CONC_Q, 20_000, max_jobs=MAX_BATCH) == [], "a key at its limit was served"
        pre_jobs = {d.job_id: d for d in first}

        done = asyncio.Event()
        rng = random.Random(11)
        errors: list = []

        async def ack(client, d: Delivery, j):
            d.ack_sent = wall_ms()
            try:
                await client.ack(j)
            except LeaseLost:
                d.lost = True
                return
            d.acked = True
            acked[d.job_id] += 1
            if len(acked) == n:
                done.set()

        async def worker(client):
            try:
                while not done.is_set():
                    sent = wall_ms()
                    jobs = await client.reserve(CONC_Q, CONC_LEASE, wait_ms=300, max_jobs=1)
                    answered = wall_ms()
                    for j in jobs:
                        d = record(j, CONC_LEASE, sent, answered)
                        await asyncio.sleep(rng.uniform(0, 0.005))
                        await ack(client, d, j)
            except Exception as e:          # judged below
                errors.append(e)
                done.set()

        # The first 1,000 are acked (in batches) as the workers start.
        async def ack_first():
            items = list(pre_jobs.values())
            for i in range(0, len(items), 100):
                chunk = items[i:i + 100]
                t = wall_ms()
                for d in chunk:
                    d.ack_sent = t
                res = await main.ack_batch([(d.job_id, d.attempt) for d in chunk])
                assert res == [None] * len(chunk), res
                for d in chunk:
                    d.acked = True
                    acked[d.job_id] += 1
            if len(acked) == n:
                done.set()

        tasks = [asyncio.create_task(worker(clients[w % CLIENTS])) for w in range(WORKERS)]
        await ack_first()
        # The kill comes once the cold keys are done and the hot ones are contended.
        kill_at = n - (HOT_JOBS - COLD_JOBS - 1) * HOT_KEYS // 2
        await until(lambda: len(acked) >= kill_at or done.is_set(), 60, what=f"{kill_at} jobs acked")
        acked_at_kill = len(acked)
        _, new_leader_ms = await kill_leader(c)
        await asyncio.wait_for(done.wait(), 90)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert not errors, [repr(e) for e in errors]
        assert acked_at_kill < n - 100, f"the kill came too late: {acked_at_kill} of {n} acked"
        after_kill = [d for d in deliveries if d.t >= new_leader_ms]
        assert after_kill, "no hand-out after the kill"

        # Every job acked exactly once, by its last delivery; earlier deliveries lost their lease.
        assert set(acked) == set(ids) and set(acked.values()) == {1}
        by_job = defaultdict(list)
        for d in deliveries:
            by_job[d.job_id].append(d)
        redelivered = 0
        for jid, ds in by_job.items():
            ds.sort(key=lambda d: d.attempt)
            assert [d.acked for d in ds] == [False] * (len(ds) - 1) + [True], (jid, ds)
            assert all(d.lost or d.ack_sent is None for d in ds[:-1]), (jid, ds)
            redelivered += len(ds) - 1
        # The hand-out times are the server's: each inside its reserve call.
        for d in deliveries:
            assert d.sent <= d.t <= d.answered, d
        # The check: no other hand-out of a key strictly inside a job's certain in-flight time.
        per_key = defaultdict(list)
        for d in deliveries:
            per_key[d.key].append(d)
        overlaps = []
        for k, ds in per_key.items():
            for a in ds:
                for b in ds:
                    if b is not a and a.t <= b.t < a.end:
                        overlaps.append((k, a, b))
        assert not overlaps, f"{len(overlaps)} overlapping hand-outs of one key, e.g. {overlaps[:3]}"
        # How closely a hot key's next hand-out followed the settle of its previous one.
        gaps = []
        for k in keys[:HOT_KEYS]:
            ds = sorted(per_key[k], key=lambda d: d.t)
            gaps += [b.t - a.end for a, b in zip(ds, ds[1:])]
        gaps.sort()

        q = await main.queue(CONC_Q)
        assert (q["ready"], q["in_flight"], q["acked"], q["keys"], q["keys_at_limit"], q["ready_held_by_keys"]) \
            == (0, 0, n, 0, 0, 0), q
        print(f"\n{n} jobs, {len(deliveries)} deliveries ({redelivered} after a lost lease), "
              f"{len(after_kill)} handed out after the kill; hot-key gap from a settle to the next "
              f"hand-out: median {gaps[len(gaps) // 2]} ms, min {gaps[0]} ms")
    finally:
        for cl in clients:
            await cl.close()


# ---------------------------------------------------------------------------- 2. rate
RATE_LEASE = 30_000


async def test_key_rate_5_per_second_holds_in_every_window_and_is_reached_across_a_leader_kill(healthy):
    """Key "r" with key_rate 5 per 1,000 ms and 100 jobs, six concurrent reservers (some asking
    for 3 jobs at a time) that ack at once; about 3 s of hand-outs, a leader kill, about 3 s
    more. In the sorted hand-out times t of the key, t[i+5] - t[i] >= 1000 everywhere; and the
    rate is reached: at least 10 hand-outs in the first 3 s, and in the 3 s after the new
    leader. Beside it key "slow" (5 per 10,000 ms): its burst of 5 before the kill is all it gets
    until 10 s later (the test ends before), on the new leader too."""
    c = healthy
    async with Client(c.urls, timeout=30) as client:
        reqs = [job_req(RATE_Q, "r", i) for i in range(100)] + [job_req(RATE_Q, "slow", i) for i in range(20)]
        ids = await enqueue_all(client, reqs)
        key_of = {jid: r["key"] for jid, r in zip(ids, reqs)}
        deliveries: list[Delivery] = []
        stop = asyncio.Event()
        errors: list = []

        async def reserver(max_jobs: int):
            try:
                while not stop.is_set():
                    sent = wall_ms()
                    jobs = await client.reserve(RATE_Q, RATE_LEASE, wait_ms=300, max_jobs=max_jobs)
                    answered = wall_ms()
                    for j in jobs:
                        deliveries.append(Delivery(j.id, key_of[j.id], j.attempt, j.lease_expires_at_ms - RATE_LEASE,
                                                   j.lease_expires_at_ms, sent, answered))
                    if jobs:
                        assert await client.ack_batch(jobs) == [None] * len(jobs)
            except Exception as e:          # judged below
                errors.append(e)
                stop.set()

        def r_times():
            return [d.t for d in deliveries if d.key == "r"]

        tasks = [asyncio.create_task(reserver(3 if i % 2 else 1)) for i in range(6)]
        try:
            await until(lambda: r_times(), 10, what="a first hand-out")
            t0 = min(r_times())
            # About 3 s of hand-outs (the first one with t at or past t0 + 3000 shows it).
            await until(lambda: errors or len(r_times()) == 100 or max(r_times()) >= t0 + 3000, 10,
                        what="hand-outs for 3 s")
            _, new_leader_ms = await kill_leader(c)
            # 3 s of hand-outs after the new leader was seen: until one with t past that window,
            # or, if they stopped, a little longer than the window.
            await until(lambda: errors or len(r_times()) == 100 or max(r_times()) >= new_leader_ms + 3000
                        or wall_ms() > new_leader_ms + 5000, 15, what="hand-outs for 3 s after the kill")
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert not errors, [repr(e) for e in errors]

    ts = sorted(r_times())
    too_close = [(ts[i], ts[i + 5]) for i in range(len(ts) - 5) if ts[i + 5] - ts[i] < RATE["period_ms"]]
    assert not too_close, f"more than 5 hand-outs of key r within 1000 ms: {too_close[:5]}"
    before = sum(1 for t in ts if t0 <= t < t0 + 3000)
    after = sum(1 for t in ts if new_leader_ms <= t < new_leader_ms + 3000)
    assert before >= 10, f"only {before} hand-outs in the first 3 s (the rate allows 15)"
    assert after >= 10, f"only {after} hand-outs in the 3 s after the new leader (the rate allows 15)"
    slow = sorted(d.t for d in deliveries if d.key == "slow")
    assert len(slow) >= 5 and slow[4] < new_leader_ms - 1000, f"key slow's burst came too late: {slow}"
    assert new_leader_ms < slow[0] + SLOW_RATE["period_ms"] - 1000, \
        f"the new leader came {new_leader_ms - slow[0]} ms after key slow's burst: the kill proved nothing"
    assert all(t >= slow[0] + SLOW_RATE["period_ms"] for t in slow[5:]), \
        f"key slow: more than 5 hand-outs in {SLOW_RATE['period_ms']} ms: {[t - slow[0] for t in slow]}"
    assert len({d.job_id for d in deliveries}) == len(deliveries) <= len(ids)
    for d in deliveries:
        assert d.sent <= d.t <= d.answered and d.attempt == 1, d
    print(f"\n{len(ts)} hand-outs of r over {(ts[-1] - ts[0]) / 1000:.1f} s: {before} in the first 3 s, "
          f"{after} in the 3 s after the new leader; shortest span of 6 hand-outs "
          f"{min(ts[i + 5] - ts[i] for i in range(len(ts) - 5))} ms; key slow: "
          f"{[t - slow[0] for t in slow]} ms, new leader at {new_leader_ms - slow[0]} ms")


# ---------------------------------------------------------------------------- 3. fairness
BIG_JOBS, SMALL_KEYS, SMALL_JOBS = 100_000, 9, 10


async def test_fair_queueing_serves_nine_small_keys_behind_100000_jobs_of_one_key_across_a_leader_kill(healthy):
    """One key with 100,000 ready jobs enqueued first, then nine keys with 10 each; a leader
    kill; then one job reserved at a time. Round-robin across keys: the 90 jobs of the small
    keys all come within the first 100 hand-outs (110 allowed), each key's in enqueue order."""
    c = healthy
    async with Client(c.urls, timeout=60) as client:
        t = time.monotonic()
        big_reqs = [job_req(FAIR_Q, "big", i) for i in range(BIG_JOBS)]
        # The first batch alone, the others several at a time (they may commit in any order):
        # fewer than MAX_BATCH jobs of the big key are reserved below, all of that first batch,
        # whose order is its payloads' order.
        big = await enqueue_all(client, big_reqs[:MAX_BATCH], parallel=1)
        big += await enqueue_all(client, big_reqs[MAX_BATCH:])
        enqueue_s = time.monotonic() - t
        small_keys = [f"small{i}" for i in range(SMALL_KEYS)]
        # Each small key's jobs in order, the keys interleaved, one request after the other.
        small_reqs = [job_req(FAIR_Q, k, n) for n in range(SMALL_JOBS) for k in small_keys]
        small = await enqueue_all(client, small_reqs, parallel=1)
        key_of = {jid: "big" for jid in big} | {jid: r["key"] for jid, r in zip(small, small_reqs)}
        q = await client.queue(FAIR_Q)
        assert (q["ready"], q["keys"]) == (BIG_JOBS + SMALL_KEYS * SMALL_JOBS, 1 + SMALL_KEYS), q
        await kill_leader(c)
        got = []                            # (key, payload n), in hand-out order
        t = time.monotonic()
        while len(got) < 110:
            # The raw answer (the client's Job has no key field): a reserved job shows its key.
            out = await client.call("reserve", "POST", "/v1/reserve",
                                    {"queues": [FAIR_Q], "lease_ms": 60_000, "max_jobs": 1, "wait_ms": 0},
                                    mutating=True)
            (job,) = out["jobs"]
            assert job["key"] == key_of[job["id"]], job
            got.append((job["key"], int(base64.b64decode(job["payload"]["data_b64"]))))
            await client.ack(job["id"], job["attempt"])
        reserve_s = time.monotonic() - t
        purged = await client.purge(FAIR_Q)
    small_got = [g for g in got if g[0] != "big"]
    assert len(small_got) == SMALL_KEYS * SMALL_JOBS, \
        f"{len(small_got)} of the small keys' 90 jobs among the first 110 hand-outs: {got}"
    last_small = max(i for i, g in enumerate(got) if g[0] != "big")
    for k in small_keys + ["big"]:
        seq = [n for key, n in got if key == k]
        assert seq == list(range(len(seq))), (k, seq)
    assert purged == BIG_JOBS - (len(got) - len(small_got))
    big_in_100 = sum(1 for g in got[:100] if g[0] == "big")
    print(f"\nenqueued {BIG_JOBS} jobs in {enqueue_s:.1f} s; the small keys' last job was hand-out "
          f"#{last_small + 1}, the big key had {big_in_100} of the first 100; 110 reserve+ack in {reserve_s:.1f} s")
