"""Enqueue: the job an enqueue makes, idempotency keys and their dedup window,
max_attempts, schedules and delays, queue depth, best-effort and atomic batches
(docs/semantics.md, Enqueue)."""
from __future__ import annotations

import uuid

from raftq.node.base import validate as C
from raftq.node.core import ops

from helpers_core import Core, QueueMachine, RETAIN, T0, ids_of, payload, rejection, restored


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


def test_default_priority_comes_from_the_queue():
    c = Core(queues=[{"name": "urgent", "default_priority": 7}])
    c.enqueue_id("urgent")
    assert c.reserve_one(["urgent"])["priority"] == 7
    c.enqueue_id("plain")
    assert c.reserve_one(["plain"])["priority"] == 0


def test_jobs_enqueued_alike_share_their_spec_until_one_of_them_changes():
    c = Core()
    status, body = c.batch([{"queue": "q", "job_type": "t", "priority": 3} for _ in range(3)]
                           + [{"queue": "q", "job_type": "t", "custom": {"a": 1}},
                              {"queue": "q", "job_type": "t", "custom": {"a": True}}])
    assert status == 200, body
    a, b, d, e, f = (c.m.jobs[r["job_id"]] for r in body["results"])
    assert a.spec is b.spec is d.spec                       # one tuple for the three
    assert e.spec is not f.spec and f.custom == {"a": True} and type(f.custom["a"]) is bool
    job = c.reserve_one()                                   # a: the first of priority 3
    assert job["id"] == a.id
    c.nack(a.id, 1, reason="boom", retry={"strategy": "delay", "delay_ms": 1000})
    assert a.last_reason == "boom" and b.last_reason is None and d.last_reason is None
    assert b.spec is d.spec and a.spec is not b.spec
    c.m.check_invariants()
    m = restored(c)                                         # a restore shares them again
    assert m.jobs[b.id].spec is m.jobs[d.id].spec and m.jobs[a.id].last_reason == "boom"
    assert m.jobs[f.id].custom == {"a": True} and m.digest() == c.m.digest()


def test_an_enqueue_whose_id_is_taken_fails_and_leaves_the_job_of_that_id_alone():
    """Job ids are the leader's fresh UUIDs; a command that names a taken one anyway (a broken
    leader) is answered `internal` and reverted, and the job that holds the id stays as it was."""
    c = Core()
    jid = c.enqueue_id()
    before, job = c.m.digest(), c.m.jobs[jid]
    for mode, n in ((ops.SINGLE, 1), (ops.BATCH, 3), (ops.ATOMIC, 2)):
        ids = iter(["22222222-2222-4222-8222-222222222222"] * (n - 1) + [jid])
        items = [C.check_job({"queue": "q", "job_type": "t"}, c.limits, c.now, ids.__next__) for _ in range(n)]
        if n > 2:
            items[1] = C.check_job({"queue": "q", "job_type": "t"}, c.limits, c.now,
                                   lambda: "33333333-3333-4333-8333-333333333333")
        result = c.m.apply(c.now, ops.enqueue(None, mode, items))
        assert result[0] == 500 and result[1]["error"]["code"] == "internal", (mode, result)
        assert "ValueError" in result[1]["error"]["message"]
        assert c.m.jobs[jid] is job and c.m.digest() == before and len(c.m.jobs) == 1
        c.m.check_invariants()


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
    """The memory layout of dedup records (node/core/jobs.py DEDUP_*; docs/performance.md): per queue a dict of records,
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


def test_max_attempts_default_and_clamp_to_ceiling():
    c = Core(limits={"max_attempts_ceiling": 50},
             queues=[{"name": "strict", "max_attempts_ceiling": 5, "default_max_attempts": 4}])
    assert c.view(c.enqueue_id())["max_attempts"] == 3
    assert c.view(c.enqueue_id(max_attempts=1_000))["max_attempts"] == 50
    assert c.view(c.enqueue_id("strict"))["max_attempts"] == 4
    assert c.view(c.enqueue_id("strict", max_attempts=9))["max_attempts"] == 5
    assert c.view(c.enqueue_id("strict", max_attempts=2))["max_attempts"] == 2


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
