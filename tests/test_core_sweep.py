"""Lease expiry and the sweep: a lapsed lease redelivers with the next attempt (or
dead-letters the last one), every phase has its own budget, the next due time
(docs/semantics.md, Lease expiry: the sweep)."""
from __future__ import annotations

from helpers_core import Core, RETAIN, T0, _kill, dead_record


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
