"""Release: a worker hands a job back without using an attempt; the attempt stays the
delivery fence, the attempts used are attempt - releases (docs/semantics.md, Release)."""
from __future__ import annotations

from raftq.node.core import ops

from helpers_core import Core, RETAIN, err, restored


def test_release_uses_no_attempt_and_fences_the_releasing_worker():
    c = Core(storage=RETAIN, limits={"default_max_attempts": 2})
    jid = c.enqueue_id()
    job = c.reserve_one()
    assert job["attempt"] == 1
    assert c.release(jid, 1, reason="shutting down") == (200, {"job_id": jid})
    v = c.view(jid)
    assert v["state"] == "ready" and v["attempt"] == 2 and v["releases"] == 1 and v["last_reason"] == "shutting down"
    # the releasing worker's later calls are refused: the fence moved on
    for answer in (c.ack(jid, 1), c.nack(jid, 1), c.extend(jid, 1, 1000), c.release(jid, 1)):
        err(answer, 404, "job_not_found")                  # not in flight at all right now
    # the next delivery is attempt 2, with releases 1: attempts used 1 of 2
    again = c.reserve_one()
    assert again["attempt"] == 2 and again["releases"] == 1
    for answer in (c.ack(jid, 1), c.nack(jid, 1), c.extend(jid, 1, 1000), c.release(jid, 1)):
        assert err(answer, 409, "attempt_mismatch")["attempt"] == 2    # no stale holder acts on it
    # a failure now is the first used attempt: retried, not dead-lettered (max_attempts 2)
    assert c.nack(jid, 2) == (200, {"job_id": jid, "dead_lettered": False})
    third = c.reserve_one()
    assert third["attempt"] == 3 and third["releases"] == 1
    assert c.nack(jid, 3) == (200, {"job_id": jid, "dead_lettered": True})     # second used attempt
    rec = c.dead_letters()[0]
    assert rec["cause"] == "attempts_exhausted" and rec["final_attempt"] == 3 and rec["job"]["releases"] == 1
    c.m.check_invariants()
    restored(c)


def test_many_releases_never_exhaust_the_budget_and_lease_expiry_counts_attempts_used():
    c = Core(storage=RETAIN, limits={"default_max_attempts": 1})
    jid = c.enqueue_id()
    for n in range(1, 6):
        job = c.reserve_one()
        assert job["attempt"] == n
        assert c.release(jid, n)[0] == 200
    job = c.reserve_one(lease_ms=1000)
    assert job["attempt"] == 6 and job["releases"] == 5
    c.advance(2000)
    assert c.sweep()["leases_expired"] == 1
    rec = c.dead_letters()[0]               # the one used attempt was the last: lease_expired
    assert rec["cause"] == "lease_expired" and rec["final_attempt"] == 6
    c.m.check_invariants()


def test_release_keeps_its_place_or_is_scheduled_clamped_by_the_horizon():
    c = Core(limits={"max_schedule_horizon_ms": 10_000})
    first = c.enqueue_id()
    second = c.enqueue_id()
    c.reserve_one()
    c.release(first, 1)                     # delay 0: ready at once, ahead of the newer job
    assert c.reserve_one()["id"] == first
    c.release(first, 2, delay_ms=60_000)    # clamped to 10 s
    v = c.view(first)
    assert v["state"] == "scheduled" and v["run_at_ms"] == c.now + 10_000
    assert c.reserve_one()["id"] == second
    c.advance(10_000)
    c.sweep()
    assert c.reserve_one()["id"] == first and c.view(first)["attempt"] == 3
    c.m.check_invariants()
    restored(c)


def test_release_validation_and_request_id_replay():
    c = Core()
    jid = c.enqueue_id()
    c.reserve_one()
    err(c.release(jid, 0), 400, "invalid_argument")
    err(c.release(jid, 1, delay_ms=-1), 400, "invalid_argument")
    first = c.release(jid, 1, rid="r-rel")
    assert c.release(jid, 1, rid="r-rel") == first          # replayed, not applied twice
    assert c.view(jid)["releases"] == 1


def test_requeue_resets_releases_with_the_attempt():
    c = Core(storage=RETAIN, limits={"default_max_attempts": 1})
    jid = c.enqueue_id()
    c.reserve_one()
    c.release(jid, 1)
    c.reserve_one()
    c.nack(jid, 2, retry={"strategy": "dead_letter"})
    assert c.requeue([jid])[0] == 200
    v = c.view(jid)
    assert v["attempt"] == 1 and v["releases"] == 0
    c.m.check_invariants()


def test_release_is_a_command_of_its_own_wire_code():
    assert ops.RELEASE == "rel" and ops.COMMANDS[ops.RELEASE] == ("job_id", "attempt", "delay_ms", "reason")
    assert len(set(ops.OPS)) == len(ops.OPS)
