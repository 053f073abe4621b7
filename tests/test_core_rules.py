"""Rule-by-rule tests of the state machine (SEMANTICS.md), driven through request validation
(node.validate) and QueueMachine.apply with a hand-driven replicated clock."""
from __future__ import annotations

import hashlib
import pickle
import random
import uuid

import pytest

from raftq.node.base import validate as C
from raftq.node.core.jobs import IN_FLIGHT, READY, SCHEDULED
from raftq.node.core.retry import jitter_hash, policy_delay_ms

from helpers_core import T0, Core, QueueMachine, counter_ids, descending_ids, err, payload, rejection

RETAIN = {"dead_letter_retention_ms": 10**12}      # a dead-letter store that keeps everything
UNKNOWN_ID = str(uuid.UUID(int=0xDEAD_BEEF, version=4))


def documented_hash(job_id: str, attempt: int) -> int:
    """retry.py's documented H, recomputed here so a change of hash is caught."""
    return int.from_bytes(hashlib.blake2b(f"{job_id}:{attempt}".encode("utf-8"), digest_size=8).digest(), "big")


def expected_delay(job_id: str, attempt: int, capped: int) -> int:
    return capped - documented_hash(job_id, attempt) % (capped // 4 + 1)


def dead_record(c: Core, job_id: str) -> dict:
    recs = [r for r in c.dead_letters() if r["job"]["id"] == job_id]
    assert len(recs) == 1, recs
    return recs[0]


def ids_of(jobs) -> list:
    return [j["id"] for j in jobs]


# ============================================================================ states and counts

def test_new_job_is_ready_with_attempt_1_and_full_job_shape():
    c = Core()
    status, body = c.enqueue("emails", "send", payload=payload(b'{"user":42}'), priority=3,
                             custom={"tenant": "acme", "n": 1, "f": 1.5, "b": True},
                             trace_context={"traceparent": "00-abc-def-01"})
    assert status == 200 and body["deduplicated"] is False
    jid = body["job_id"]
    assert uuid.UUID(jid).version == 4 and jid == jid.lower()
    v = c.view(jid)
    assert v["state"] == "ready" and v["attempt"] == 1 and v["max_attempts"] == 3
    assert v["enqueued_at_ms"] == T0 and v["scheduled_at_ms"] is None and v["lease_expires_at_ms"] is None
    job = c.reserve_one(["emails"], lease_ms=10_000)
    assert job == {
        "id": jid, "queue": "emails", "job_type": "send",
        "payload": {"data_b64": "eyJ1c2VyIjo0Mn0=", "encoding": "application/json"},
        "priority": 3, "custom": {"tenant": "acme", "n": 1, "f": 1.5, "b": True},
        "trace_context": {"traceparent": "00-abc-def-01", "tracestate": None},
        "enqueued_at_ms": T0, "scheduled_at_ms": None, "attempt": 1, "max_attempts": 3,
        "lease_expires_at_ms": T0 + 10_000,
    }
    assert c.state(jid) == "in_flight"


def test_job_without_payload_omits_it_and_custom_defaults_to_empty_map():
    c = Core()
    c.enqueue_id()
    job = c.reserve_one()
    assert "payload" not in job and job["custom"] == {} and "trace_context" not in job


def test_unknown_request_fields_are_ignored():
    c = Core()
    status, body = c.enqueue(colour="blue", extra={"x": 1})
    assert status == 200 and c.counts()["ready"] == 1


def test_counts_per_queue_and_state_exact_through_a_lifecycle():
    c = Core(storage=RETAIN)
    a, b, s = c.enqueue_id(max_attempts=1), c.enqueue_id(max_attempts=1), c.enqueue_id(delay_ms=1000)
    assert c.counts() == {"ready": 2, "scheduled": 1, "in_flight": 0, "dead_lettered": 0}
    c.reserve_jobs(max_jobs=2)
    assert c.counts() == {"ready": 0, "scheduled": 1, "in_flight": 2, "dead_lettered": 0}
    c.ack(a, 1)
    c.nack(b, 1)                                   # last attempt: dead-lettered
    assert c.counts() == {"ready": 0, "scheduled": 1, "in_flight": 0, "dead_lettered": 1}
    c.advance(1000)
    c.sweep()
    assert c.counts() == {"ready": 1, "scheduled": 0, "in_flight": 0, "dead_lettered": 1}
    st = c.stats()
    assert (st["enqueued"], st["acked"], st["nacked"], st["dead_lettered_total"]) == (3, 1, 1, 1)
    assert st["name"] == "q" and st["declared"] is False and st["paused"] is False
    assert c.stats("other-queue") is None


def _recount(c: Core, qname: str) -> dict:
    by_state = {}
    for state, name in ((READY, "ready"), (SCHEDULED, "scheduled"), (IN_FLIGHT, "in_flight")):
        by_state[name] = len(c.m.list_jobs(qname, state, 10**6, None)[0])
    by_state["dead_lettered"] = len(c.dead_letters(qname, 10**6))
    return by_state


@pytest.mark.parametrize("retention", [0, 5_000])
def test_counts_stay_exact_under_a_random_mix_of_operations(retention):
    """Counters vs a recount of the jobs by state after every step of a seeded random history."""
    rng = random.Random(20261130 + retention)
    c = Core(storage={"dead_letter_retention_ms": retention, "dedup_window_ms": 3_000},
             limits={"max_queue_depth": 25})
    queues = ["a", "b"]
    held: list = []                                     # (job_id, attempt) we hold leases for
    for step in range(400):
        r = rng.random()
        q = rng.choice(queues)
        if r < 0.30:
            fields = {"max_attempts": rng.randint(1, 3)}
            if rng.random() < 0.3:
                fields["delay_ms"] = rng.randint(0, 2000)
            if rng.random() < 0.3:
                fields["idempotency_key"] = f"k{rng.randint(0, 8)}"
            if rng.random() < 0.2:
                fields["deadline_at_ms"] = c.now + rng.randint(0, 3000)
            c.enqueue(q, **fields)
        elif r < 0.50:
            jobs = c.reserve_jobs([q], lease_ms=rng.randint(100, 3000), max_jobs=rng.randint(1, 3))
            held += [(j["id"], j["attempt"]) for j in jobs]
        elif r < 0.62 and held:
            c.ack(*held.pop(rng.randrange(len(held))))
        elif r < 0.74 and held:
            jid, att = held.pop(rng.randrange(len(held)))
            retry = rng.choice([None, {"strategy": "delay", "delay_ms": rng.randint(0, 1500)},
                                {"strategy": "dead_letter"}])
            c.nack(jid, att, retry=retry)
        elif r < 0.78 and held:
            jid, att = rng.choice(held)
            c.extend(jid, att, rng.randint(100, 3000))
        elif r < 0.82:
            c.drain(q, max=rng.randint(1, 3))
        elif r < 0.85:
            ids = [rec["job"]["id"] for rec in c.dead_letters(q)[:2]]
            if ids:
                c.requeue(ids)
        elif r < 0.88:
            jobs = c.m.list_jobs(q, rng.choice([READY, SCHEDULED]), 1, None)[0]
            if jobs:
                assert c.cancel(jobs[0]["id"])[0] == 200
        elif r < 0.90:
            (c.pause if rng.random() < 0.5 else c.resume)(q)
        else:
            c.advance(rng.randint(1, 800))
            c.sweep()
        for name in queues:
            if c.stats(name) is not None:
                assert c.counts(name) == _recount(c, name), (step, name)
    assert sum(c.stats(n)["enqueued"] for n in queues) > 50     # the history did something


# ============================================================================ reserve order

def test_reserve_orders_by_priority_then_age_then_batch_sequence():
    c = Core(ids=descending_ids())                  # ids sort against creation order
    old_low = c.enqueue_id(priority=0)
    c.advance(10)
    hi_1 = c.enqueue_id(priority=5)
    c.advance(10)
    hi_2 = c.enqueue_id(priority=5)
    c.advance(10)
    top = c.enqueue_id(priority=9)
    c.advance(10)
    status, body = c.batch([{"queue": "q", "job_type": "t"} for _ in range(4)])
    batch = [r["job_id"] for r in body["results"]]
    assert batch == sorted(batch, reverse=True)     # an id tie-break would reverse them
    assert ids_of(c.reserve_jobs(max_jobs=10)) == [top, hi_1, hi_2, old_low] + batch


def test_jobs_of_the_same_millisecond_keep_submission_order():
    c = Core(ids=descending_ids())
    ids = [c.enqueue_id() for _ in range(6)]
    assert ids_of(c.reserve_jobs(max_jobs=6)) == ids


def test_default_priority_comes_from_the_queue():
    c = Core(queues=[{"name": "urgent", "default_priority": 7}])
    c.enqueue_id("urgent")
    assert c.reserve_one(["urgent"])["priority"] == 7
    c.enqueue_id("plain")
    assert c.reserve_one(["plain"])["priority"] == 0


def test_queues_are_polled_in_listed_order_without_fairness():
    c = Core()
    a = [c.enqueue_id("a", priority=0) for _ in range(2)]
    b = [c.enqueue_id("b", priority=9) for _ in range(2)]
    jobs = c.reserve_jobs(["a", "b"], max_jobs=3)
    assert ids_of(jobs) == a + b[:1]                 # a is drained first despite b's priority
    assert [j["queue"] for j in jobs] == ["a", "a", "b"]
    c2 = Core()
    a = [c2.enqueue_id("a") for _ in range(2)]
    b = [c2.enqueue_id("b") for _ in range(2)]
    assert ids_of(c2.reserve_jobs(["b", "a"], max_jobs=3)) == b + a[:1]


def test_reserve_on_empty_or_unknown_queues_returns_an_empty_list():
    c = Core()
    assert c.reserve(["nothing-here"]) == (200, {"jobs": []})
    assert c.stats("nothing-here") is None          # reserving does not create a queue


def test_max_jobs_default_one_and_clamped_to_max_reserve_batch():
    c = Core(limits={"max_reserve_batch": 3})
    for _ in range(6):
        c.enqueue_id()
    assert len(c.reserve_jobs()) == 1
    assert len(c.reserve_jobs(max_jobs=100)) == 3
    assert len(c.reserve_jobs(max_jobs=2)) == 2
    assert c.counts()["in_flight"] == 6


def test_lease_is_clamped_to_the_smallest_max_lease_of_the_listed_queues():
    c = Core(queues=[{"name": "long", "max_lease_duration_ms": 60_000},
                     {"name": "short", "max_lease_duration_ms": 5_000}])
    for _ in range(3):
        c.enqueue_id("long")
    job = c.reserve_one(["long", "short"], lease_ms=50_000)
    assert job["queue"] == "long" and job["lease_expires_at_ms"] == c.now + 5_000
    assert c.reserve_one(["long"], lease_ms=50_000)["lease_expires_at_ms"] == c.now + 50_000
    assert c.reserve_one(["long"], lease_ms=90_000)["lease_expires_at_ms"] == c.now + 60_000
    # an undeclared queue takes the global maximum (300 s by default)
    c.enqueue_id("free")
    assert c.reserve_one(["free"], lease_ms=10**9)["lease_expires_at_ms"] == c.now + 300_000


def test_reserved_job_keeps_the_attempt_of_its_ready_entry():
    c = Core()
    jid = c.enqueue_id(max_attempts=5)
    for attempt in (1, 2, 3):
        job = c.reserve_one()
        assert job["id"] == jid and job["attempt"] == attempt
        c.nack(jid, attempt)


# ============================================================================ pause / resume

def test_paused_queue_is_skipped_keeps_accepting_enqueues_and_resumes():
    c = Core()
    a1 = c.enqueue_id("a")
    b1 = c.enqueue_id("b")
    assert c.pause("a") == (200, {"queue": "a", "paused": True})
    assert c.stats("a")["paused"] is True
    a2 = c.enqueue_id("a")
    assert ids_of(c.reserve_jobs(["a", "b"], max_jobs=5)) == [b1]
    assert c.reserve_jobs(["a"]) == []
    assert c.counts("a")["ready"] == 2
    assert c.resume("a") == (200, {"queue": "a", "paused": False})
    assert ids_of(c.reserve_jobs(["a", "b"], max_jobs=5)) == [a1, a2]


def test_pausing_an_unused_queue_creates_it_paused_only_when_asked():
    c = Core()
    assert err(c.pause("later"), 404, "not_found")["queue"] == "later"
    assert c.stats("later") is None
    assert c.pause("later", create=True) == (200, {"queue": "later", "paused": True})
    assert c.stats("later")["paused"] is True
    c.enqueue_id("later")
    assert c.reserve_jobs(["later"]) == []


def test_time_keeps_running_in_a_paused_queue():
    c = Core(storage=RETAIN)
    sched = c.enqueue_id(delay_ms=100)
    doomed = c.enqueue_id(deadline_at_ms=c.now + 100)
    c.pause("q")
    c.advance(100)
    c.sweep()
    assert c.state(sched) == "ready"
    assert c.state(doomed) == "dead_lettered" and dead_record(c, doomed)["cause"] == "expired"
    c.resume("q")
    assert ids_of(c.reserve_jobs()) == [sched]


# ============================================================================ fencing

def _fenced_call(c: Core, op: str):
    return {
        "ack": lambda jid, a: c.ack(jid, a),
        "nack": lambda jid, a: c.nack(jid, a, retry={"strategy": "dead_letter"}),
        "extend": lambda jid, a: c.extend(jid, a, 5_000),
    }[op]


@pytest.mark.parametrize("op", ["ack", "nack", "extend"])
def test_fencing_not_found_and_attempt_mismatch_change_nothing(op):
    c = Core(storage=RETAIN)
    jid = c.enqueue_id(max_attempts=5)
    ready = c.enqueue_id()
    c.reserve_one(lease_ms=1_000)
    call = _fenced_call(c, op)
    before = c.snapshot_state()
    e = err(call(UNKNOWN_ID, 1), 404, "job_not_found")
    assert e["job_id"] == UNKNOWN_ID
    err(call(ready, 1), 404, "job_not_found")                  # exists, but is not in flight
    e = err(call(jid, 2), 409, "attempt_mismatch")
    assert e["job_id"] == jid and e["attempt"] == 1
    assert c.snapshot_state() == before
    assert c.view(jid)["state"] == "in_flight" and c.view(ready)["state"] == "ready"


@pytest.mark.parametrize("op", ["ack", "nack", "extend"])
def test_fencing_after_expiry_then_after_re_reservation(op):
    c = Core()
    jid = c.enqueue_id(max_attempts=5)
    c.reserve_one(lease_ms=1_000)
    c.advance(1_000)
    c.sweep()                                   # back to ready under attempt 2
    call = _fenced_call(c, op)
    before = c.snapshot_state()
    err(call(jid, 1), 404, "job_not_found")
    assert c.snapshot_state() == before
    assert c.reserve_one()["attempt"] == 2
    before = c.snapshot_state()
    err(call(jid, 1), 409, "attempt_mismatch")
    assert c.snapshot_state() == before
    assert call(jid, 2)[0] == 200


@pytest.mark.parametrize("op", ["ack", "nack", "extend"])
def test_fencing_acked_and_dead_lettered_jobs_are_not_found(op):
    c = Core(storage=RETAIN)
    acked = c.enqueue_id()
    dead = c.enqueue_id()
    c.reserve_jobs(max_jobs=2)
    c.ack(acked, 1)
    c.nack(dead, 1, retry={"strategy": "dead_letter"})
    call = _fenced_call(c, op)
    err(call(acked, 1), 404, "job_not_found")
    err(call(dead, 1), 404, "job_not_found")
    assert c.state(dead) == "dead_lettered"


# ============================================================================ ack

def test_ack_removes_the_job_for_good():
    c = Core()
    jid = c.enqueue_id()
    c.reserve_one()
    assert c.ack(jid, 1) == (200, {"job_id": jid})
    assert c.view(jid) is None
    assert c.counts() == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 0}
    assert c.stats()["acked"] == 1
    err(c.ack(jid, 1), 404, "job_not_found")


def test_job_ids_in_paths_match_case_insensitively():
    c = Core()
    jid = c.enqueue_id()
    c.reserve_one()
    assert c.ack(jid.upper(), 1) == (200, {"job_id": jid})


def test_ack_batch_answers_each_ack_in_order_in_one_command():
    c = Core()
    a, b = c.enqueue_id(), c.enqueue_id()
    c.reserve_jobs(max_jobs=2)
    n = c.m.applied
    status, body = c.acks([(a, 1), (UNKNOWN_ID, 1), (b, 2), (b, 1)])
    assert status == 200 and c.m.applied == n + 1
    r = body["results"]
    assert r[0] == {"job_id": a}
    assert r[1]["error"]["code"] == "job_not_found"
    assert r[2]["error"]["code"] == "attempt_mismatch"
    assert r[3] == {"job_id": b}
    assert c.counts()["in_flight"] == 0 and c.stats()["acked"] == 2


# ============================================================================ nack

def test_nack_default_without_policy_is_immediate_and_keeps_enqueued_at():
    c = Core()
    first = c.enqueue_id()
    t_first = c.now
    c.advance(100)
    newer = c.enqueue_id()
    c.advance(100)
    assert c.reserve_one()["id"] == first
    c.advance(100)
    assert c.nack(first, 1, reason="flaky") == (200, {"job_id": first, "dead_lettered": False})
    v = c.view(first)
    assert (v["state"], v["attempt"], v["enqueued_at_ms"], v["last_reason"]) == ("ready", 2, t_first, "flaky")
    higher = c.enqueue_id(priority=1)
    jobs = c.reserve_jobs(max_jobs=3)
    assert ids_of(jobs) == [higher, first, newer]   # ahead of newer jobs of its priority only
    assert jobs[1]["attempt"] == 2 and jobs[1]["enqueued_at_ms"] == t_first
    assert c.stats()["nacked"] == 1


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


def test_nack_delay_strategy_is_exact_and_clamped_to_the_horizon():
    c = Core(limits={"retry_delay_ms": 9_000, "max_schedule_horizon_ms": 5_000})
    a, b, z = c.enqueue_id(max_attempts=3), c.enqueue_id(max_attempts=3), c.enqueue_id(max_attempts=3)
    c.reserve_jobs(max_jobs=3)
    assert c.nack(a, 1, retry={"strategy": "delay", "delay_ms": 1_234})[1]["dead_lettered"] is False
    assert c.view(a)["run_at_ms"] == c.now + 1_234              # no jitter, no policy
    c.nack(b, 1, retry={"strategy": "delay", "delay_ms": 99_999})
    assert c.view(b)["run_at_ms"] == c.now + 5_000              # clamped to the horizon
    c.nack(z, 1, retry={"strategy": "delay", "delay_ms": 0})
    assert c.state(z) == "ready" and c.view(z)["attempt"] == 2   # delay 0: ready at once


def test_nack_dead_letter_strategy_gives_cause_rejected_before_the_last_attempt():
    c = Core(storage=RETAIN)
    jid = c.enqueue_id(max_attempts=5, payload=payload(b"data"))
    c.reserve_one()
    c.advance(10)
    assert c.nack(jid, 1, reason="poison", retry={"strategy": "dead_letter"}) == \
        (200, {"job_id": jid, "dead_lettered": True})
    rec = dead_record(c, jid)
    assert rec["cause"] == "rejected" and rec["last_reason"] == "poison"
    assert rec["final_attempt"] == 1 and rec["failed_at_ms"] == c.now
    assert rec["job"]["payload"] == payload(b"data") and rec["job"]["queue"] == "q"
    assert c.counts() == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 1}
    assert c.stats()["dead_lettered_total"] == 1


@pytest.mark.parametrize("retry", [None, {"strategy": "default"}, {"strategy": "delay", "delay_ms": 500}])
def test_nack_on_the_last_attempt_is_attempts_exhausted_even_for_delay(retry):
    c = Core(storage=RETAIN, limits={"retry_delay_ms": 1_000})
    jid = c.enqueue_id(max_attempts=2)
    c.reserve_one()
    c.nack(jid, 1, retry=retry)
    c.advance(1_000)
    c.sweep()
    assert c.reserve_one()["attempt"] == 2
    assert c.nack(jid, 2, reason="again", retry=retry) == (200, {"job_id": jid, "dead_lettered": True})
    rec = dead_record(c, jid)
    assert (rec["cause"], rec["final_attempt"], rec["last_reason"]) == ("attempts_exhausted", 2, "again")
    assert c.state(jid) == "dead_lettered"


def test_nack_reason_becomes_last_reason_and_absent_reason_clears_it():
    c = Core()
    jid = c.enqueue_id(max_attempts=5)
    c.reserve_one()
    c.nack(jid, 1, reason="first")
    assert c.view(jid)["last_reason"] == "first"
    c.reserve_one()
    c.nack(jid, 2)
    assert c.view(jid)["last_reason"] is None      # the code's choice: the last nack's reason
    c.reserve_one()
    c.nack(jid, 3, reason="")                       # an empty reason is treated as absent
    assert c.view(jid)["last_reason"] is None


# ============================================================================ lease expiry

def test_lease_expiry_redelivers_with_next_attempt_at_once_ignoring_retry_policy():
    c = Core(limits={"retry_delay_ms": 60_000})
    jid = c.enqueue_id(max_attempts=3)
    c.reserve_one(lease_ms=1_000)
    c.advance(999)
    assert c.sweep()["leases_expired"] == 0
    assert c.state(jid) == "in_flight"
    c.advance(1)
    assert c.sweep()["leases_expired"] == 1
    v = c.view(jid)
    assert v["state"] == "ready" and v["attempt"] == 2 and v["enqueued_at_ms"] == T0
    assert c.counts() == {"ready": 1, "scheduled": 0, "in_flight": 0, "dead_lettered": 0}
    assert c.reserve_one()["attempt"] == 2


def test_lease_expiry_on_the_final_attempt_dead_letters_with_no_reason():
    c = Core(storage=RETAIN)
    jid = c.enqueue_id(max_attempts=2)
    c.reserve_one()
    c.nack(jid, 1, reason="had a reason")
    c.reserve_one(lease_ms=500)
    c.advance(500)
    c.sweep()
    rec = dead_record(c, jid)
    assert rec["cause"] == "lease_expired" and rec["last_reason"] is None
    assert c.view(jid)["last_reason"] is None
    assert rec["final_attempt"] == 2 and rec["failed_at_ms"] == c.now
    assert c.counts() == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 1}


# ============================================================================ extend

def test_extend_is_now_plus_lease_clamped_to_the_queue_max_and_keeps_the_attempt():
    c = Core(queues=[{"name": "q", "max_lease_duration_ms": 5_000}])
    jid = c.enqueue_id()
    c.reserve_one(lease_ms=1_000)
    c.advance(500)
    assert c.extend(jid, 1, 2_000) == (200, {"job_id": jid, "lease_expires_at_ms": c.now + 2_000})
    assert c.extend(jid, 1, 60_000) == (200, {"job_id": jid, "lease_expires_at_ms": c.now + 5_000})
    v = c.view(jid)
    assert v["attempt"] == 1 and v["lease_expires_at_ms"] == c.now + 5_000
    c.advance(4_999)                                # well past the first deadline
    c.sweep()
    assert c.state(jid) == "in_flight"
    c.advance(1)
    c.sweep()
    assert c.state(jid) == "ready" and c.view(jid)["attempt"] == 2


def test_extend_can_shorten_the_lease():
    c = Core()
    jid = c.enqueue_id()
    c.reserve_one(lease_ms=60_000)
    assert c.extend(jid, 1, 10)[1]["lease_expires_at_ms"] == c.now + 10
    c.advance(10)
    c.sweep()
    assert c.state(jid) == "ready"


def test_ack_and_extend_still_work_after_the_deadline_until_the_sweep():
    c = Core()
    a, b, d = c.enqueue_id(), c.enqueue_id(), c.enqueue_id()
    c.reserve_jobs(lease_ms=1_000, max_jobs=3)
    c.advance(5_000)                                # all three deadlines passed, no sweep yet
    assert c.ack(a, 1) == (200, {"job_id": a})
    assert c.extend(b, 1, 1_000) == (200, {"job_id": b, "lease_expires_at_ms": c.now + 1_000})
    assert c.sweep()["leases_expired"] == 1         # only d
    assert c.state(b) == "in_flight" and c.state(d) == "ready"
    err(c.ack(d, 1), 404, "job_not_found")


# ============================================================================ deadlines

def test_deadline_expired_job_is_never_delivered_even_before_the_sweep():
    c = Core(storage=RETAIN)
    jid = c.enqueue_id(deadline_at_ms=c.now + 1_000)
    later = c.enqueue_id()
    c.advance(1_000)
    jobs = c.reserve_jobs(max_jobs=5)
    assert ids_of(jobs) == [later]
    rec = dead_record(c, jid)
    assert rec["cause"] == "expired" and rec["last_reason"] is None and rec["final_attempt"] == 1
    assert c.counts() == {"ready": 0, "scheduled": 0, "in_flight": 1, "dead_lettered": 1}


def test_sweep_dead_letters_due_deadlines_of_ready_and_scheduled_jobs():
    c = Core(storage=RETAIN)
    ready = c.enqueue_id(deadline_at_ms=c.now + 1_000)
    sched = c.enqueue_id(delay_ms=5_000, deadline_at_ms=c.now + 1_000)
    fine = c.enqueue_id(deadline_at_ms=c.now + 10_000)
    c.advance(999)
    assert c.sweep()["deadlines_expired"] == 0
    c.advance(1)
    assert c.sweep()["deadlines_expired"] == 2
    assert {dead_record(c, j)["cause"] for j in (ready, sched)} == {"expired"}
    assert c.state(fine) == "ready"
    assert c.counts() == {"ready": 1, "scheduled": 0, "in_flight": 0, "dead_lettered": 2}
    c.advance(10_000)
    c.sweep()
    assert ids_of(c.reserve_jobs(max_jobs=5)) == []       # `fine` expired too


def test_deadline_does_not_interrupt_an_in_flight_job():
    c = Core()
    jid = c.enqueue_id(deadline_at_ms=c.now + 1_000)
    c.reserve_one(lease_ms=60_000)
    c.advance(2_000)
    assert c.sweep()["deadlines_expired"] == 0
    assert c.state(jid) == "in_flight"
    assert c.ack(jid, 1) == (200, {"job_id": jid})


def test_deadline_no_longer_applies_after_the_first_delivery():
    """Code's choice (spec silent): the deadline only guards the first delivery, so a retry of a
    job that did start running is delivered even after the deadline."""
    c = Core()
    jid = c.enqueue_id(deadline_at_ms=c.now + 1_000)
    c.reserve_one(lease_ms=60_000)
    c.advance(2_000)
    c.nack(jid, 1)
    assert c.reserve_one()["id"] == jid


def test_deadline_expired_with_retention_off_drops_the_job():
    c = Core()
    jid = c.enqueue_id(deadline_at_ms=c.now + 10)
    c.advance(10)
    c.sweep()
    assert c.view(jid) is None and c.stats()["dead_lettered_total"] == 1
    assert c.counts() == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 0}


# ============================================================================ dedup

def test_dedup_returns_the_original_id_and_creates_nothing():
    c = Core()
    status, body = c.enqueue(idempotency_key="k", payload=payload(b"one"))
    jid = body["job_id"]
    assert body["deduplicated"] is False
    before = c.stats()
    assert c.enqueue(idempotency_key="k", payload=payload(b"two"), priority=9) == \
        (200, {"job_id": jid, "deduplicated": True})            # payload is not compared
    assert c.stats() == before                                   # nothing created or counted
    assert c.reserve_one()["payload"] == payload(b"one")


def test_dedup_is_scoped_to_the_queue():
    c = Core()
    a = c.enqueue_id("a", idempotency_key="k")
    status, body = c.enqueue("b", idempotency_key="k")
    assert body["deduplicated"] is False and body["job_id"] != a


def test_dedup_survives_ack_and_dead_letter():
    c = Core()
    acked = c.enqueue_id(idempotency_key="acked")
    dead = c.enqueue_id(idempotency_key="dead")
    c.reserve_jobs(max_jobs=2)
    c.ack(acked, 1)
    c.nack(dead, 1, retry={"strategy": "dead_letter"})
    assert c.view(acked) is None and c.view(dead) is None
    assert c.enqueue(idempotency_key="acked") == (200, {"job_id": acked, "deduplicated": True})
    assert c.enqueue(idempotency_key="dead") == (200, {"job_id": dead, "deduplicated": True})
    assert c.stats()["enqueued"] == 2 and c.counts()["ready"] == 0


def test_dedup_window_ends_then_a_new_job_with_a_fresh_window():
    c = Core(queues=[{"name": "q", "dedup_window_ms": 1_000}])
    first = c.enqueue_id(idempotency_key="k")
    c.advance(999)
    assert c.enqueue(idempotency_key="k")[1] == {"job_id": first, "deduplicated": True}
    c.advance(1)                                    # window over; no sweep needed
    status, body = c.enqueue(idempotency_key="k")
    second = body["job_id"]
    assert body["deduplicated"] is False and second != first
    c.advance(999)
    assert c.enqueue(idempotency_key="k")[1] == {"job_id": second, "deduplicated": True}
    c.sweep()                                       # the first window's end must not drop the new record
    assert c.enqueue(idempotency_key="k")[1]["job_id"] == second
    c.advance(1)
    assert c.sweep()["dedup_expired"] == 1
    assert c.m.counts()["dedup_records"] == 0


def test_a_dedup_record_is_one_tuple_shared_with_its_heap_entry_and_its_batch_bucket():
    """The memory layout issue 16 chose (node/core/jobs.py DEDUP_*): per queue a dict of records,
    each record the very object in the expiry heap, a batch's records sharing one (expires,
    queue) bucket; a queue's dict goes with its last record; snapshots keep the older flat form."""
    c = Core(queues=[{"name": "q", "dedup_window_ms": 1_000}])
    status, body = c.batch([{"queue": "q", "job_type": "t", "idempotency_key": f"k{i}"} for i in range(3)])
    ids = [r["job_id"] for r in body["results"]]
    records = [c.m.dedup["q"][f"k{i}"] for i in range(3)]
    assert records == [((T0 + 1_000, "q"), f"k{i}", ids[i]) for i in range(3)]
    assert {id(r) for r in records} == {id(e) for e in c.m.dedup_heap}
    assert len({id(r[0]) for r in records}) == 1          # one bucket for the batch's records
    state = c.m.to_builtins()
    assert sorted(state["dedup"]) == sorted(("q", f"k{i}", ids[i], T0 + 1_000) for i in range(3))
    assert sorted(state["dedup_heap"]) == sorted((T0 + 1_000, "q", f"k{i}") for i in range(3))
    restored = QueueMachine.from_builtins(c.limits, state)
    assert restored.dedup == c.m.dedup and restored.digest() == c.m.digest()
    assert {id(r) for r in restored.dedup["q"].values()} == {id(e) for e in restored.dedup_heap}
    assert len({id(r[0]) for r in restored.dedup["q"].values()}) == 1    # shared again
    assert c.batch([{"queue": "q", "job_type": "t", "idempotency_key": "later"}])[0] == 200
    c.advance(1)
    assert c.batch([{"queue": "q", "job_type": "t", "idempotency_key": "later2"}])[0] == 200
    assert c.m.dedup["q"]["later2"][0] is not c.m.dedup["q"]["k0"][0]    # another `now`, another bucket
    assert c.sweep()["dedup_expired"] == 0
    c.advance(999)
    assert c.sweep()["dedup_expired"] == 4                  # k0..k2 and later, not later2
    assert list(c.m.dedup["q"]) == ["later2"]
    c.advance(1)
    assert c.sweep()["dedup_expired"] == 1
    assert c.m.dedup == {} and c.m.dedup_heap == []
    c.m.check_invariants()


def test_dedup_window_defaults_to_storage_setting_for_undeclared_queues():
    c = Core(storage={"dedup_window_ms": 500}, queues=[{"name": "long", "dedup_window_ms": 5_000}])
    a = c.enqueue_id("free", idempotency_key="k")
    b = c.enqueue_id("long", idempotency_key="k")
    c.advance(500)
    assert c.enqueue("free", idempotency_key="k")[1]["job_id"] != a
    assert c.enqueue("long", idempotency_key="k")[1]["job_id"] == b


def test_same_key_twice_in_one_batch_dedups_to_the_first():
    c = Core()
    jobs = [{"queue": "q", "job_type": "t", "idempotency_key": "k"},
            {"queue": "q", "job_type": "t"},
            {"queue": "q", "job_type": "t", "idempotency_key": "k"}]
    for send in (c.batch, c.atomic):
        status, body = send([dict(j, queue=send.__name__) for j in jobs])
        r = body["results"]
        assert status == 200 and r[2] == {"job_id": r[0]["job_id"], "deduplicated": True}
        assert r[0]["deduplicated"] is False and r[1]["deduplicated"] is False
        assert c.counts(send.__name__)["ready"] == 2


def test_duplicate_that_fails_validation_is_rejected_not_deduplicated():
    c = Core(limits={"max_payload_bytes": 4})
    c.enqueue_id(idempotency_key="k")
    r = rejection(c.enqueue(idempotency_key="k", payload=payload(b"12345")))
    assert r["reason"] == "payload_too_large"


# ============================================================================ queue_full

def test_queue_full_counts_ready_scheduled_and_in_flight_not_dead_letters():
    c = Core(storage=RETAIN, queues=[{"name": "q", "max_queue_depth": 3}])
    r, s, f = c.enqueue_id(), c.enqueue_id(delay_ms=1_000), c.enqueue_id()
    c.reserve_one()                                  # r in flight
    assert rejection(c.enqueue()) == {"reason": "queue_full", "queue": "q", "limit": 3}
    c.nack(r, 1, retry={"strategy": "dead_letter"})  # dead letters do not count
    assert c.counts()["dead_lettered"] == 1
    assert c.enqueue()[0] == 200
    assert rejection(c.enqueue())["reason"] == "queue_full"
    assert c.stats()["enqueued"] == 4
    c.reserve_one()
    c.ack(f, 1)
    assert c.enqueue()[0] == 200


def test_queue_full_ignores_dedup_hits():
    c = Core(queues=[{"name": "q", "max_queue_depth": 1}])
    jid = c.enqueue_id(idempotency_key="k")
    assert c.enqueue(idempotency_key="k") == (200, {"job_id": jid, "deduplicated": True})
    status, body = c.batch([{"queue": "q", "job_type": "t", "idempotency_key": "k"}] * 2)
    assert body["results"] == [{"job_id": jid, "deduplicated": True}] * 2
    status, body = c.atomic([{"queue": "q", "job_type": "t", "idempotency_key": "k"}] * 2)
    assert (status, body) == (200, {"results": [{"job_id": jid, "deduplicated": True}] * 2})


def test_atomic_batch_does_not_count_dedup_hits_against_the_depth():
    c = Core(queues=[{"name": "q", "max_queue_depth": 2}])
    jid = c.enqueue_id(idempotency_key="k")
    status, body = c.atomic([{"queue": "q", "job_type": "t", "idempotency_key": "k"},
                             {"queue": "q", "job_type": "t", "idempotency_key": "new"},
                             {"queue": "q", "job_type": "t", "idempotency_key": "new"}])
    assert status == 200, body
    r = body["results"]
    assert r[0] == {"job_id": jid, "deduplicated": True}
    assert r[1]["deduplicated"] is False and r[2] == {"job_id": r[1]["job_id"], "deduplicated": True}
    assert c.counts()["ready"] == 2


def test_queue_depth_zero_rejects_every_enqueue():
    c = Core(queues=[{"name": "closed", "max_queue_depth": 0}])
    assert rejection(c.enqueue("closed")) == {"reason": "queue_full", "queue": "closed", "limit": 0}


def test_best_effort_batch_counts_earlier_jobs_of_the_same_batch():
    c = Core(queues=[{"name": "q", "max_queue_depth": 2}])
    status, body = c.batch([{"queue": "q", "job_type": "t"}] * 3 + [{"queue": "other", "job_type": "t"}])
    r = body["results"]
    assert status == 200 and [("job_id" in x) for x in r] == [True, True, False, True]
    assert r[2] == {"rejection": {"reason": "queue_full", "queue": "q", "limit": 2}}
    assert c.counts()["ready"] == 2 and c.counts("other")["ready"] == 1


def test_atomic_queue_full_rejects_the_whole_batch():
    c = Core(queues=[{"name": "q", "max_queue_depth": 2}])
    c.enqueue_id()
    before = c.snapshot_state()
    status, body = c.atomic([{"queue": "other", "job_type": "t"},
                             {"queue": "q", "job_type": "t"},
                             {"queue": "q", "job_type": "t"}])
    assert status == 422 and body["error"]["code"] == "batch_rejected"
    assert body["error"]["errors"] == [
        {"index": 1, "rejection": {"reason": "queue_full", "queue": "q", "limit": 2}},
        {"index": 2, "rejection": {"reason": "queue_full", "queue": "q", "limit": 2}}]
    after = c.snapshot_state()
    assert after["jobs"] == before["jobs"] and after["queues"] == before["queues"]
    assert c.stats("other") is None


# ============================================================================ batches

def test_atomic_validation_failure_lists_every_failing_index_and_changes_nothing():
    c = Core(limits={"max_job_type_bytes": 3})
    c.enqueue_id()
    before = c.snapshot_state()
    status, body = c.atomic([{"queue": "q", "job_type": "t"},
                             {"queue": "q", "job_type": "toolong"},
                             {"queue": "q", "job_type": "t"},
                             {"queue": "q"}])
    assert status == 422 and body["error"]["code"] == "batch_rejected"
    errors = body["error"]["errors"]
    assert [e["index"] for e in errors] == [1, 3]
    assert errors[0]["rejection"] == {"reason": "job_type_name_too_long", "limit": 3, "actual": 7}
    assert errors[1]["rejection"]["reason"] == "invalid_request"
    assert c.snapshot_state() == before


def test_atomic_success_returns_one_result_per_job_in_order():
    c = Core()
    status, body = c.atomic([{"queue": "q", "job_type": "t", "priority": p} for p in (1, 2, 3)])
    assert status == 200 and len(body["results"]) == 3
    assert all(r["deduplicated"] is False for r in body["results"])
    assert [c.view(r["job_id"])["priority"] for r in body["results"]] == [1, 2, 3]


def test_best_effort_batch_commits_accepted_jobs_and_reports_rejections_in_order():
    c = Core(limits={"max_job_type_bytes": 3})
    n = c.m.applied
    status, body = c.batch([{"queue": "q", "job_type": "a"}, {"queue": "q", "job_type": "toolong"},
                            "not an object", {"queue": "q", "job_type": "b"}])
    assert status == 200 and c.m.applied == n + 1           # one replicated command
    r = body["results"]
    assert r[0]["deduplicated"] is False and r[3]["deduplicated"] is False
    assert r[1] == {"rejection": {"reason": "job_type_name_too_long", "limit": 3, "actual": 7}}
    assert r[2]["rejection"]["reason"] == "invalid_request"
    assert [j["job_type"] for j in c.reserve_jobs(max_jobs=5)] == ["a", "b"]


def test_an_internal_failure_mid_batch_reverts_the_whole_command():
    c = Core()
    c.enqueue_id()
    before = c.snapshot_state()
    cmd = C.enqueue_atomic({"jobs": [{"queue": "q", "job_type": "t"}] * 5}, c.limits, c.now, c.new_id)
    c.m._fault_after = 12                           # fail somewhere in the middle
    status, body = c.apply(cmd)
    assert status == 500 and body["error"]["code"] == "internal"
    assert c.snapshot_state() == before


# ============================================================================ attempts, schedules

def test_max_attempts_default_and_clamp_to_ceiling():
    c = Core(limits={"max_attempts_ceiling": 50},
             queues=[{"name": "strict", "max_attempts_ceiling": 5, "default_max_attempts": 4}])
    assert c.view(c.enqueue_id())["max_attempts"] == 3
    assert c.view(c.enqueue_id(max_attempts=1_000))["max_attempts"] == 50
    assert c.view(c.enqueue_id("strict"))["max_attempts"] == 4
    assert c.view(c.enqueue_id("strict", max_attempts=9))["max_attempts"] == 5
    assert c.view(c.enqueue_id("strict", max_attempts=2))["max_attempts"] == 2


def test_a_job_is_delivered_at_most_max_attempts_times():
    c = Core()
    jid = c.enqueue_id(max_attempts=3)
    deliveries = 0
    while c.reserve_jobs():
        deliveries += 1
        c.nack(jid, deliveries)
    assert deliveries == 3 and c.view(jid) is None


def test_future_schedule_is_scheduled_then_promoted_by_the_sweep():
    c = Core()
    at = c.now + 5_000
    jid = c.enqueue_id(scheduled_at_ms=at)
    v = c.view(jid)
    assert v["state"] == "scheduled" and v["scheduled_at_ms"] == at and v["run_at_ms"] == at
    assert c.counts()["scheduled"] == 1 and c.reserve_jobs() == []
    c.advance(4_999)
    assert c.sweep()["promoted"] == 0
    c.advance(1)
    assert c.sweep()["promoted"] == 1
    job = c.reserve_one()
    assert job["id"] == jid and job["scheduled_at_ms"] == at and job["attempt"] == 1


def test_promoted_job_keeps_its_enqueue_time_and_goes_ahead_of_newer_jobs():
    c = Core()
    sched = c.enqueue_id(delay_ms=1_000)
    c.advance(500)
    newer = c.enqueue_id()
    c.advance(500)
    c.sweep()
    assert ids_of(c.reserve_jobs(max_jobs=2)) == [sched, newer]


def test_past_schedule_and_zero_delay_are_ready_now():
    c = Core()
    past = c.enqueue_id(scheduled_at_ms=c.now - 10_000)
    now = c.enqueue_id(scheduled_at_ms=c.now)
    zero = c.enqueue_id(delay_ms=0)
    for jid in (past, now, zero):
        v = c.view(jid)
        assert v["state"] == "ready" and v["scheduled_at_ms"] is None


def test_delay_ms_schedules_at_now_plus_delay():
    c = Core()
    jid = c.enqueue_id(delay_ms=2_500)
    v = c.view(jid)
    assert v["state"] == "scheduled" and v["scheduled_at_ms"] == c.now + 2_500


def test_schedule_at_exactly_the_horizon_is_accepted_beyond_is_scheduled_too_far():
    c = Core(queues=[{"name": "q", "max_schedule_horizon_ms": 10_000}])
    assert c.enqueue(scheduled_at_ms=c.now + 10_000)[0] == 200
    assert rejection(c.enqueue(scheduled_at_ms=c.now + 10_001)) == \
        {"reason": "scheduled_too_far", "horizon_ms": 10_000, "scheduled_at_ms": c.now + 10_001}
    assert rejection(c.enqueue(delay_ms=10_001)) == \
        {"reason": "scheduled_too_far", "horizon_ms": 10_000, "scheduled_at_ms": c.now + 10_001}
    assert c.stats()["enqueued"] == 1


# ============================================================================ dead letters

def _kill(c: Core, queue: str = "q", reason=None) -> str:
    jid = c.enqueue_id(queue, max_attempts=1)
    job = c.reserve_one([queue])
    assert job["id"] == jid
    c.nack(jid, 1, reason=reason)
    return jid


def test_drain_is_oldest_first_destructive_filtered_and_clamped():
    c = Core(storage=RETAIN, limits={"max_reserve_batch": 2})
    d1 = _kill(c, "a")
    c.advance(10)
    d2 = _kill(c, "b")
    c.advance(10)
    d3 = _kill(c, "a")
    c.advance(10)
    d4 = _kill(c, "a")
    status, body = c.drain(queue="a", max=1)
    assert status == 200 and [r["job"]["id"] for r in body["records"]] == [d1]
    assert c.counts("a")["dead_lettered"] == 2 and c.view(d1) is None
    recs = c.drain(max=10)[1]["records"]                          # clamped to max_reserve_batch
    assert [r["job"]["id"] for r in recs] == [d2, d3]
    assert recs[0]["failed_at_ms"] == T0 + 10 and recs[0]["cause"] == "attempts_exhausted"
    assert [r["job"]["id"] for r in c.drain(max=2)[1]["records"]] == [d4]
    assert c.drain(max=2) == (200, {"records": []})
    assert c.counts("a")["dead_lettered"] == 0 and c.counts("b")["dead_lettered"] == 0


def test_drain_default_max_is_one_and_unknown_queue_is_empty():
    c = Core(storage=RETAIN)
    _kill(c)
    _kill(c)
    assert c.drain(queue="nope") == (200, {"records": []})
    assert len(c.drain()[1]["records"]) == 1


def test_retention_zero_means_no_store_and_drain_is_always_empty():
    c = Core()
    assert c.limits.server_info()["dead_letter_retention_enabled"] is False
    jid = _kill(c)
    assert c.view(jid) is None and c.dead_letters() == []
    assert c.counts()["dead_lettered"] == 0 and c.stats()["dead_lettered_total"] == 1
    assert c.drain(max=10) == (200, {"records": []})
    assert Core(storage={"dead_letter_retention_ms": 1}).limits.server_info()["dead_letter_retention_enabled"] is True


def test_retention_deletes_old_dead_letters_in_the_sweep():
    c = Core(storage={"dead_letter_retention_ms": 1_000})
    old = _kill(c)
    c.advance(500)
    young = _kill(c)
    c.advance(499)
    assert c.sweep()["dead_letters_expired"] == 0
    c.advance(1)
    assert c.sweep()["dead_letters_expired"] == 1
    assert c.view(old) is None and c.state(young) == "dead_lettered"
    assert c.counts()["dead_lettered"] == 1
    c.advance(500)
    c.sweep()
    assert c.dead_letters() == [] and c.counts()["dead_lettered"] == 0


def test_dead_letter_listing_is_non_destructive_and_oldest_first():
    c = Core(storage=RETAIN)
    a = _kill(c, reason="r1")
    b = _kill(c)
    recs = c.dead_letters()
    assert [r["job"]["id"] for r in recs] == [a, b] and recs[0]["last_reason"] == "r1"
    assert len(c.dead_letters()) == 2


def test_requeue_keeps_the_id_resets_attempt_and_enqueue_time_and_drops_the_schedule():
    c = Core(storage=RETAIN)
    jid = c.enqueue_id(max_attempts=3, delay_ms=100, deadline_at_ms=c.now + 10**6)
    c.advance(100)
    c.sweep()
    c.reserve_one()
    c.nack(jid, 1)
    c.reserve_one()
    c.nack(jid, 2, retry={"strategy": "dead_letter"})
    assert dead_record(c, jid)["final_attempt"] == 2
    older = c.enqueue_id()
    c.advance(500)
    ready = c.enqueue_id()
    status, body = c.requeue([jid.upper(), UNKNOWN_ID, ready])
    assert (status, body) == (200, {"requeued": [jid], "missing": [UNKNOWN_ID, ready]})
    v = c.view(jid)
    assert (v["state"], v["attempt"], v["enqueued_at_ms"], v["scheduled_at_ms"]) == ("ready", 1, c.now, None)
    assert c.counts() == {"ready": 3, "scheduled": 0, "in_flight": 0, "dead_lettered": 0}
    jobs = c.reserve_jobs(max_jobs=3)
    assert ids_of(jobs) == [older, ready, jid] and jobs[2]["attempt"] == 1
    assert c.requeue([jid]) == (200, {"requeued": [], "missing": [jid]})


def test_delete_dead_letters_reports_missing():
    c = Core(storage=RETAIN)
    a, b = _kill(c), _kill(c)
    assert c.delete_dead([a, UNKNOWN_ID]) == (200, {"deleted": [a], "missing": [UNKNOWN_ID]})
    assert c.view(a) is None and c.state(b) == "dead_lettered"
    assert c.counts()["dead_lettered"] == 1
    assert c.delete_dead([a]) == (200, {"deleted": [], "missing": [a]})


# ============================================================================ cancel

def test_cancel_ready_and_scheduled_jobs():
    c = Core()
    ready = c.enqueue_id()
    sched = c.enqueue_id(delay_ms=5_000)
    assert c.cancel(ready) == (200, {"job_id": ready})
    assert c.cancel(sched.upper()) == (200, {"job_id": sched})
    assert c.view(ready) is None and c.view(sched) is None
    assert c.counts() == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 0}
    c.advance(5_000)
    assert c.sweep()["promoted"] == 0 and c.reserve_jobs() == []
    err(c.cancel(ready), 404, "not_found")


def test_cancel_in_flight_removes_the_job_and_fences_its_worker_unknown_is_not_found():
    """Issue 17: DELETE /v1/jobs/{id} also removes an in-flight job (before, a 409)."""
    c = Core(storage=RETAIN)
    jid = c.enqueue_id()
    c.reserve_one()
    assert c.cancel(jid) == (200, {"job_id": jid})
    assert c.view(jid) is None
    assert c.counts() == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 0}
    for answer in (c.extend(jid, 1, 1000), c.ack(jid, 1), c.nack(jid, 1), c.release(jid, 1)):
        assert err(answer, 404, "job_not_found")["job_id"] == jid
    c.advance(60_000)
    c.sweep()                       # its lease entry is stale: no redelivery, no dead letter
    assert c.reserve_jobs() == [] and c.dead_letters() == [] and c.view(jid) is None
    assert [e for e in c.audit() if e["action"] == "cancel"][-1]["target"] == jid
    before = c.snapshot_state()
    err(c.cancel(UNKNOWN_ID), 404, "not_found")
    assert c.snapshot_state() == before
    # code's choice (spec silent): a dead-lettered job is not cancellable and answers 404
    other = c.enqueue_id()
    c.reserve_one()
    c.nack(other, 1, retry={"strategy": "dead_letter"})
    err(c.cancel(other), 404, "not_found")
    assert c.state(other) == "dead_lettered"
    c.m.check_invariants()


# ============================================================================ request ids

def test_request_id_replays_an_enqueue_without_applying_it_again():
    c = Core()
    first = c.enqueue(rid="r-1")
    assert c.enqueue(rid="r-1") == first
    assert c.enqueue(rid="r-1", job_type="other") == first     # the stored result, not a new job
    assert c.stats()["enqueued"] == 1


def test_request_id_replays_batches_and_apply_time_rejections():
    c = Core(limits={"max_job_type_bytes": 2}, queues=[{"name": "full", "max_queue_depth": 1}])
    jobs = [{"queue": "q", "job_type": "t"}, {"queue": "q", "job_type": "long"}]
    first = c.batch(jobs, rid="b")
    assert c.batch(jobs, rid="b") == first and c.stats()["enqueued"] == 1
    a = c.enqueue_id("full")
    rej = c.enqueue("full", rid="single")
    assert rejection(rej)["reason"] == "queue_full"
    c.reserve_one(["full"])
    c.ack(a, 1)                                     # room again, but the retry is a replay
    assert c.enqueue("full", rid="single") == rej
    assert c.stats("full")["enqueued"] == 1


def test_request_id_replays_reserve():
    c = Core()
    a, b = c.enqueue_id(), c.enqueue_id()
    first = c.reserve(rid="res")
    assert ids_of(first[1]["jobs"]) == [a]
    c.advance(10)
    assert c.reserve(rid="res") == first
    assert c.counts() == {"ready": 1, "scheduled": 0, "in_flight": 1, "dead_lettered": 0}
    assert ids_of(c.reserve_jobs()) == [b]


def test_empty_reserve_is_not_remembered_under_its_request_id():
    """A long poll re-proposes its request id until jobs arrive; only that answer is replayed."""
    c = Core()
    assert c.reserve(rid="poll") == (200, {"jobs": []})
    jid = c.enqueue_id()
    got = c.reserve(rid="poll")
    assert ids_of(got[1]["jobs"]) == [jid]
    c.enqueue_id()
    assert c.reserve(rid="poll") == got and c.counts()["ready"] == 1


def test_request_id_replays_ack_nack_and_extend():
    c = Core()
    a, n, e = c.enqueue_id(), c.enqueue_id(max_attempts=5), c.enqueue_id()
    c.reserve_jobs(max_jobs=3)
    assert c.ack(a, 1, rid="ack") == (200, {"job_id": a})
    assert c.ack(a, 1, rid="ack") == (200, {"job_id": a})
    err(c.ack(a, 1), 404, "job_not_found")                      # without the id it would fail
    assert c.nack(n, 1, rid="nack") == (200, {"job_id": n, "dead_lettered": False})
    assert c.nack(n, 1, rid="nack") == (200, {"job_id": n, "dead_lettered": False})
    assert c.view(n)["attempt"] == 2 and c.stats()["nacked"] == 1
    first = c.extend(e, 1, 1_000, rid="ext")
    c.advance(300)
    assert c.extend(e, 1, 1_000, rid="ext") == first
    assert c.view(e)["lease_expires_at_ms"] == first[1]["lease_expires_at_ms"]
    assert c.stats()["acked"] == 1


def test_request_id_replays_a_drain_with_the_same_records():
    c = Core(storage=RETAIN)
    ids = [_kill(c) for _ in range(3)]
    first = c.drain(max=2, rid="d")
    assert [r["job"]["id"] for r in first[1]["records"]] == ids[:2]
    assert c.drain(max=2, rid="d") == first
    assert c.counts()["dead_lettered"] == 1
    assert [r["job"]["id"] for r in c.drain(max=2)[1]["records"]] == ids[2:]


def test_request_id_expires_after_its_window():
    c = Core(limits={"request_id_window_ms": 1_000})
    first = c.enqueue(rid="r")
    c.advance(999)
    assert c.enqueue(rid="r") == first
    c.advance(1)
    again = c.enqueue(rid="r")                      # window over: applied as a new request
    assert again[1]["job_id"] != first[1]["job_id"] and c.stats()["enqueued"] == 2
    assert c.m.counts()["request_ids"] == 1
    c.advance(1_000)
    assert c.sweep()["request_ids_expired"] == 1
    assert c.m.counts()["request_ids"] == 0


def test_a_shorter_request_id_window_expires_later_records_first_and_keeps_earlier_expiries():
    """A record's expiry is fixed when it is stored. After a change to a shorter window, a
    record stored later expires before one stored earlier: the sweep drops each at its own
    expiry (it used to stop at the older record and keep the newer one past its window), and
    a snapshot keeps that order."""
    c = Core(limits={"request_id_window_ms": 10_000})
    c.seed()
    long = c.enqueue(rid="long")                                # expires at T0 + 10 s
    assert c.configure(limits={"request_id_window_ms": 1_000})[0] == 200
    c.advance(100)
    c.enqueue(rid="short")                                      # expires at T0 + 1.1 s
    assert c.m.next_due_ms() == T0 + 1_100
    restored = QueueMachine.from_builtins(c.limits, c.m.to_builtins())
    assert restored.to_builtins() == c.m.to_builtins()
    c.advance(1_000)
    for m in (c.m, restored):
        assert m.apply(c.now, C.sweep())[1]["request_ids_expired"] == 1
        assert m.counts()["request_ids"] == 1                   # "long" only
        m.check_invariants()
    assert restored.digest() == c.m.digest()
    assert c.enqueue(rid="long") == long                        # its 10 s window still holds
    c.advance(8_900)
    assert c.sweep()["request_ids_expired"] == 1 and c.m.counts()["request_ids"] == 0


def test_request_id_reused_for_another_operation_is_refused():
    """Code's choice (spec silent): the same id on a different operation is a client bug."""
    c = Core()
    jid = c.enqueue(rid="same")[1]["job_id"]
    c.reserve_one()
    status, body = c.ack(jid, 1, rid="same")
    assert status == 400 and body["error"]["code"] == "invalid_argument"
    assert c.state(jid) == "in_flight"


def test_request_ids_refused_before_apply_are_not_remembered():
    c = Core(limits={"max_job_type_bytes": 2})
    bad = c.atomic([{"queue": "q", "job_type": "long"}], rid="a")
    assert bad[0] == 422
    assert c.atomic([{"queue": "q", "job_type": "ok"}], rid="a")[0] == 200


# ============================================================================ time

def test_replicated_clock_never_goes_backwards():
    c = Core()
    late = T0 + 10_000
    c.apply(C.enqueue({"queue": "q", "job_type": "t"}, c.limits, late, c.new_id), now=late)
    cmd = C.enqueue({"queue": "q", "job_type": "t"}, c.limits, T0, c.new_id)
    status, body = c.apply(cmd, now=T0)            # a stamp from a node whose clock is behind
    assert c.m.clock == late
    assert c.view(body["job_id"])["enqueued_at_ms"] == late
    cmd, _ = C.reserve({"queues": ["q"], "lease_ms": 1_000}, c.limits)
    job = c.apply(cmd, now=T0 + 5)[1]["jobs"][0]
    assert job["lease_expires_at_ms"] == late + 1_000
    c.apply(C.sweep(), now=T0 + 2_000)              # far "after" the lease by that clock
    assert c.state(job["id"]) == "in_flight"


def test_apply_batch_shares_one_stamp():
    c = Core()
    cmds = [C.enqueue({"queue": "q", "job_type": "t"}, c.limits, T0, c.new_id) for _ in range(3)]
    results = c.m.apply_batch(T0 + 7, cmds)
    assert [r[0] for r in results] == [200, 200, 200]
    assert {c.view(r[1]["job_id"])["enqueued_at_ms"] for r in results} == {T0 + 7}


# ============================================================================ sweep budgets

def test_each_sweep_phase_has_its_own_budget_and_leftovers_go_next():
    c = Core(storage={"sweep_limit": 2, "dead_letter_retention_ms": 100, "audit_retention_ms": 100},
             limits={"request_id_window_ms": 100},
             queues=[{"name": "k", "dedup_window_ms": 100}])
    for _ in range(3):
        c.enqueue_id("w")
    c.reserve_jobs(["w"], lease_ms=100, max_jobs=3)                  # 3 leases
    for _ in range(5):
        c.enqueue_id("s", delay_ms=100)                               # 5 schedules
    for i in range(3):
        c.enqueue_id("k", idempotency_key=f"key{i}")                  # 3 dedup records
    for i in range(3):
        c.enqueue("r", rid=f"rid{i}")                                 # 3 request ids
    for _ in range(3):
        _kill(c, "d")                                                 # 3 dead letters
    for _ in range(3):
        c.enqueue_id("e", deadline_at_ms=c.now + 100)                # 3 deadlines
    for i in range(3):
        c.pause(f"p{i}", create=True)                                 # 3 audit entries
    c.advance(100)
    keys = ["promoted", "leases_expired", "deadlines_expired", "dedup_expired",
            "request_ids_expired", "dead_letters_expired", "audit_expired"]
    first = c.sweep()
    assert [first[k] for k in keys] == [2, 2, 2, 2, 2, 2, 2]
    second = c.sweep()
    assert [second[k] for k in keys] == [2, 1, 1, 1, 1, 1, 1]
    third = c.sweep()
    assert [third[k] for k in keys] == [1, 0, 0, 0, 0, 0, 0]
    assert c.m.audit_page(10, None) == ([], None)
    assert c.counts("s")["ready"] == 5 and c.counts("w")["ready"] == 3
    assert c.counts("d")["dead_lettered"] == 0 and c.m.counts()["dedup_records"] == 0


def test_next_due_is_the_earliest_pending_time():
    c = Core()
    assert c.m.next_due_ms() is None
    c.enqueue_id(delay_ms=5_000)
    assert c.m.next_due_ms() == c.now + 5_000
    c.enqueue_id()
    c.reserve_one(lease_ms=2_000)
    assert c.m.next_due_ms() == c.now + 2_000


# ============================================================================ snapshot and digest

def _rich_history(c: Core):
    ids = [c.enqueue_id(payload=payload(b"p%d" % i), custom={"i": i},
                        trace_context={"traceparent": "00-x-y-01", "tracestate": "s"})
           for i in range(4)]
    c.enqueue_id(delay_ms=5_000)
    c.enqueue_id(deadline_at_ms=c.now + 3_000)
    c.enqueue_id("keys", idempotency_key="k")
    c.enqueue("rid", rid="r1")
    c.reserve_jobs(max_jobs=2, lease_ms=2_000)
    c.advance(10)
    c.nack(ids[0], 1, reason="x", retry={"strategy": "dead_letter"})
    c.nack(ids[1], 1, retry={"strategy": "delay", "delay_ms": 1_000})
    c.reserve_one(lease_ms=2_000)
    _kill(c, "dead")
    c.pause("paused")
    c.advance(10)


def _more_history(c: Core):
    out = []
    for step in range(8):
        c.advance(700)
        out.append(c.sweep())
        out.append(c.reserve(max_jobs=2))
        out.append(c.enqueue("keys", idempotency_key="k"))
        out.append(c.enqueue("rid", rid="r1"))
    out.append(c.drain(max=10))
    return out


@pytest.mark.parametrize("how", ["builtins", "pickle"])
def test_snapshot_round_trip_keeps_the_digest_and_the_behaviour(how):
    c = Core(storage=RETAIN)
    _rich_history(c)
    if how == "builtins":
        m2 = QueueMachine.from_builtins(c.limits, c.m.to_builtins())
    else:
        m2 = pickle.loads(pickle.dumps(c.m))
    assert m2.digest() == c.m.digest()
    assert m2.to_builtins() == c.m.to_builtins()
    c.m.check_invariants()
    m2.check_invariants()
    # the restored machine continues exactly like the original
    twin = Core(storage=RETAIN, now=c.now, ids=counter_ids(c.ids_issued + 1))
    twin.m = m2
    results_a, results_b = _more_history(c), _more_history(twin)
    assert any(isinstance(r, tuple) and r[1].get("jobs") for r in results_a)   # it delivered jobs
    assert results_a == results_b
    assert twin.m.digest() == c.m.digest()


def test_digest_equal_for_equal_histories_and_different_otherwise():
    a = Core(storage=RETAIN)
    _rich_history(a)
    b = Core(storage=RETAIN)
    for now, cmd in a.log:
        b.m.apply(now, cmd)
    assert b.m.digest() == a.m.digest()
    jid = a.reserve_one(lease_ms=1_000)["id"]
    assert a.m.digest() != b.m.digest()
    b.m.apply(a.log[-1][0], a.log[-1][1])
    assert a.m.digest() == b.m.digest()
    a.ack(jid, 1)
    assert a.m.digest() != b.m.digest()


# ---------------------------------------------------------------------------- recorded actions
def test_a_recorded_action_is_one_audit_entry_and_anything_else_is_refused_untouched():
    """RECORD_ACTION (a membership change, committed outside the machine) adds one audit entry
    with the caller and the replicated time; an unknown action or a non-builtins field is
    refused as `internal` and leaves the state, digest included, as it was."""
    from raftq.node.core import ops
    c = Core()
    cmd = ops.record_action(None, "member_add", "n4", {"raft": "10.0.0.14:7101", "url": "http://10.0.0.14:7001"}, "root")
    assert c.apply(cmd) == (200, {"action": "member_add"})
    assert [(e["action"], e["target"], e["who"], e["at_ms"]) for e in c.m.audit_page(10, None)[0]] == \
        [("member_add", "n4", "root", c.now)]
    before = c.m.digest()
    for bad in (ops.record_action(None, "config_change", None, {}, "root"),      # not a recordable action
                ops.record_action(None, "member_add", 5, {}, "root"),
                ops.record_action(None, "member_add", "n4", {"raft": object()}, "root"),
                ops.record_action(None, "member_add", "n4", ["not", "a", "dict"], "root"),
                ops.record_action(None, "member_remove", "n4", {}, 7)):           # who: a name or None
        status, body = c.apply(bad)
        assert status == 500 and body["error"]["code"] == "internal", (bad, body)
        assert c.m.digest() == before
    c.m.check_invariants()
