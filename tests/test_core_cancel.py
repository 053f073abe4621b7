"""Cancel: a ready, scheduled or in-flight job is removed; the in-flight one's worker is
fenced off (docs/semantics.md, Cancel and Cancel of a running job; a cancel of a job
held back by gating or keys is in test_core_reserve_gating.py and test_core_keys.py)."""
from __future__ import annotations

from raftq.node.base import validate as C
from raftq.node.core import ops

from helpers_core import Core, RETAIN, UNKNOWN_ID, err


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
    """DELETE /v1/jobs/{id} also removes an in-flight job (409 before 0.2.0)."""
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


def test_a_cancel_written_before_issue_17_still_refuses_an_in_flight_job_on_replay():
    c = Core()
    jid = c.enqueue_id()
    c.reserve_one()
    legacy = (ops.CANCEL, None, jid, None)                  # no in_flight field: the old command
    assert err(c.apply(legacy), 409, "failed_precondition")["job_id"] == jid
    assert c.state(jid) == "in_flight"
    assert C.cancel(jid) == (ops.CANCEL, None, jid, None, True)     # what validation writes now
    assert c.cancel(jid) == (200, {"job_id": jid})
