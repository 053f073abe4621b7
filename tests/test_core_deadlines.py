"""Deadlines: a job whose deadline passes before it is reserved never runs; the deadline
applies until the first delivery only (docs/semantics.md, Deadlines)."""
from __future__ import annotations

from helpers_core import Core, RETAIN, dead_record, err, ids_of


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
