"""Retry policy: the timing of default nacks, per queue falling back to [limits]; base,
backoff, caps and the deterministic jitter (docs/semantics.md, Retry policy)."""
from __future__ import annotations

import hashlib

from raftq.node.core.retry import jitter_hash, policy_delay_ms

from helpers_core import Core, T0


def documented_hash(job_id: str, attempt: int) -> int:
    """retry.py's documented H, recomputed here so a change of hash is caught."""
    return int.from_bytes(hashlib.blake2b(f"{job_id}:{attempt}".encode("utf-8"), digest_size=8).digest(), "big")


def expected_delay(job_id: str, attempt: int, capped: int) -> int:
    return capped - documented_hash(job_id, attempt) % (capped // 4 + 1)


def test_nack_with_retry_none_policy_schedules_with_jitter():
    c = Core(limits={"retry_delay_ms": 2_000})
    jid = c.enqueue_id()
    c.reserve_one()
    assert c.nack(jid, 1, retry={"strategy": "default"}) == (200, {"job_id": jid, "dead_lettered": False})
    delay = expected_delay(jid, 1, 2_000)
    assert 1_500 <= delay <= 2_000
    v = c.view(jid)
    assert v["state"] == "scheduled" and v["attempt"] == 2 and v["run_at_ms"] == c.now + delay
    assert c.counts()["scheduled"] == 1
    assert c.reserve_jobs() == []
    c.advance(delay - 1)
    c.sweep()
    assert c.state(jid) == "scheduled"
    c.advance(1)
    assert c.sweep()["promoted"] == 1
    job = c.reserve_one()
    assert job["id"] == jid and job["attempt"] == 2 and job["enqueued_at_ms"] == T0


def test_retry_none_uses_the_base_delay_on_every_attempt():
    c = Core(limits={"retry_delay_ms": 1_000, "retry_backoff": "none"})
    jid = c.enqueue_id(max_attempts=5)
    for attempt in (1, 2, 3):
        c.reserve_one()
        c.nack(jid, attempt)
        assert c.view(jid)["run_at_ms"] - c.now == expected_delay(jid, attempt, 1_000)
        c.advance(1_000)
        c.sweep()


def test_exponential_example_base_1s_attempt_3_is_between_3_and_4_seconds():
    c = Core(limits={"retry_delay_ms": 1_000, "retry_backoff": "exponential"})
    jid = c.enqueue_id(max_attempts=5)
    expected = {1: (750, 1_000), 2: (1_500, 2_000), 3: (3_000, 4_000)}
    for attempt in (1, 2, 3):
        assert c.reserve_one()["attempt"] == attempt
        c.nack(jid, attempt)
        delay = c.view(jid)["run_at_ms"] - c.now
        lo, hi = expected[attempt]
        assert lo <= delay <= hi
        assert delay == expected_delay(jid, attempt, hi)
        c.advance(delay)
        c.sweep()


def test_jitter_is_within_a_quarter_deterministic_and_spreads_jobs():
    c = Core(limits={"retry_delay_ms": 10_000})
    ids = [c.enqueue_id() for _ in range(40)]
    c.reserve_jobs(max_jobs=40)
    for jid in ids:
        c.nack(jid, 1)
    delays = [c.view(jid)["run_at_ms"] - c.now for jid in ids]
    assert all(7_500 <= d <= 10_000 for d in delays)
    assert delays == [expected_delay(jid, 1, 10_000) for jid in ids]
    assert len(set(delays)) > 10                   # jobs failing together do not retry together


def test_policy_delay_is_capped_by_retry_delay_max():
    c = Core(limits={"retry_delay_ms": 1_000, "retry_backoff": "exponential", "retry_delay_max_ms": 2_500})
    jid = c.enqueue_id(max_attempts=5)
    for attempt in (1, 2):
        c.reserve_one()
        c.nack(jid, attempt)
        c.advance(10_000)
        c.sweep()
    c.reserve_one()
    c.nack(jid, 3)                                  # grown = 4 s, capped to 2.5 s
    delay = c.view(jid)["run_at_ms"] - c.now
    assert delay == expected_delay(jid, 3, 2_500) and 1_875 <= delay <= 2_500


def test_policy_delay_is_capped_by_the_schedule_horizon():
    c = Core(limits={"retry_delay_ms": 1_000, "retry_backoff": "exponential",
                     "max_schedule_horizon_ms": 1_500})
    jid = c.enqueue_id(max_attempts=5)
    c.reserve_one()
    c.nack(jid, 1)
    c.advance(10_000)
    c.sweep()
    c.reserve_one()
    c.nack(jid, 2)                                  # grown = 2 s, horizon 1.5 s
    delay = c.view(jid)["run_at_ms"] - c.now
    assert delay == expected_delay(jid, 2, 1_500) and 1_125 <= delay <= 1_500


def test_retry_policy_is_per_queue_falling_back_to_limits():
    c = Core(limits={"retry_delay_ms": 5_000},
             queues=[{"name": "fast", "retry_delay_ms": 0}, {"name": "slow", "retry_delay_ms": 60_000}])
    a, b, d = c.enqueue_id("fast"), c.enqueue_id("slow"), c.enqueue_id("dflt")
    c.reserve_jobs(["fast", "slow", "dflt"], max_jobs=3)
    for jid in (a, b, d):
        c.nack(jid, 1)
    assert c.state(a) == "ready"
    assert c.view(b)["run_at_ms"] - c.now == expected_delay(b, 1, 60_000)
    assert c.view(d)["run_at_ms"] - c.now == expected_delay(d, 1, 5_000)


def test_retry_module_hash_and_saturation():
    assert jitter_hash("x", 1) == documented_hash("x", 1)
    assert policy_delay_ms("x", 1, 0, "exponential", 10, 10) == 0
    huge = policy_delay_ms("id", 10**6, 1_000, "exponential", 3_600_000, 2_592_000_000)
    assert 2_700_000 <= huge <= 3_600_000
    assert policy_delay_ms("id", 1, 4, "none", 100, 100) == 4 - documented_hash("id", 1) % 2
