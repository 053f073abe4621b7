"""Ack, nack, extend and fencing: every call of a worker is fenced by the job's attempt;
what ack, nack (default, delay, dead_letter) and extend do (docs/semantics.md,
Ack, nack, extend and fencing; the timing of default nacks is in
test_core_retry_policy.py)."""
from __future__ import annotations

import pytest

from helpers_core import Core, RETAIN, UNKNOWN_ID, dead_record, err, ids_of, payload


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


def test_a_job_is_delivered_at_most_max_attempts_times():
    c = Core()
    jid = c.enqueue_id(max_attempts=3)
    deliveries = 0
    while c.reserve_jobs():
        deliveries += 1
        c.nack(jid, deliveries)
    assert deliveries == 3 and c.view(jid) is None


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
