"""Rule tests of issue 17's lifecycle additions in the state machine: release (no attempt used,
fenced, delayed), cancel of an in-flight job (see also test_core_rules), duplicate policies and
the execution timeout field."""
from __future__ import annotations

import pickle

import pytest

from raftq.node.base import validate as C
from raftq.node.core import ops
from raftq.node.core.jobs import READY, Job
from raftq.node.core.machine import QueueMachine as RawMachine

from helpers_core import Core, QueueMachine, err, payload, rejection

RETAIN = {"dead_letter_retention_ms": 10**12}


def restored(c: Core) -> QueueMachine:
    m = QueueMachine.from_builtins(c.limits, c.m.to_builtins())
    m.check_invariants()
    assert m.digest() == c.m.digest()
    return m


# ============================================================================ release

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


# ============================================================================ snapshots and legacy forms

def test_legacy_18_field_jobs_and_12_field_items_still_load_and_apply():
    c = Core()
    jid = c.enqueue_id()
    data = c.m.to_builtins()
    data["jobs"] = [tuple(t)[:18] for t in data["jobs"]]            # the snapshot form before issue 17
    m = RawMachine.from_builtins(c.limits, data)
    m.check_invariants()
    assert m.jobs[jid].releases == 0 and m.jobs[jid].timeout_ms is None
    assert m.digest() == c.m.digest()
    item = C.check_job({"queue": "q", "job_type": "t"}, c.limits, c.now, lambda: "11111111-1111-4111-8111-111111111111")
    assert len(item) == ops.ITEM_LEGACY_LEN
    assert m.apply(c.now, ops.enqueue(None, ops.SINGLE, [item]))[0] == ops.ENQUEUED
    m.check_invariants()


def test_a_job_that_uses_nothing_new_renders_and_hashes_as_before():
    c = Core()
    jid = c.enqueue_id()
    job = c.reserve_one()
    assert "timeout_ms" not in job and "releases" not in job
    assert c.m.jobs[jid].legacy_tuple() == c.m.jobs[jid].to_tuple()[:18]
    v = c.view(jid)
    assert v["timeout_ms"] is None and v["releases"] == 0     # the job view always shows both
    t = Job.from_tuple(c.m.jobs[jid].to_tuple())
    assert t.to_tuple() == c.m.jobs[jid].to_tuple()


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


# ============================================================================ execution timeout

def test_timeout_ms_shown_job_first_then_queue_then_null():
    c = Core(queues=[{"name": "slow", "execution_timeout_ms": 5000}])
    own = c.enqueue_id("slow", timeout_ms=1500)
    queued = c.enqueue_id("slow")
    none = c.enqueue_id("q")
    assert c.view(own)["timeout_ms"] == 1500
    assert c.view(queued)["timeout_ms"] == 5000
    assert c.view(none)["timeout_ms"] is None
    jobs = {j["id"]: j for j in c.reserve_jobs(["slow", "q"], max_jobs=3)}
    assert jobs[own]["timeout_ms"] == 1500 and jobs[queued]["timeout_ms"] == 5000
    assert "timeout_ms" not in jobs[none]
    assert rejection(c.enqueue(timeout_ms=0))["reason"] == "invalid_request"
    assert rejection(c.enqueue(timeout_ms="1s"))["reason"] == "invalid_request"
    restored(c)


def test_execution_timeout_and_duplicate_policy_config_keys_are_checked():
    from raftq.node.core.limits import ConfigError, Limits
    with pytest.raises(ConfigError, match="execution_timeout_ms"):
        Limits.build(queues=[{"name": "a", "execution_timeout_ms": 0}])
    with pytest.raises(ConfigError, match="duplicate_policy"):
        Limits.build(limits={"duplicate_policy": "ignore"})
    lim = Limits.build(limits={"duplicate_policy": "reject"}, queues=[{"name": "a", "duplicate_policy": "replace"}])
    assert lim.queue("a").duplicate_policy == "replace" and lim.queue("b").duplicate_policy == "reject"
    assert lim.queue("b").execution_timeout_ms is None


# ============================================================================ duplicate policy

def test_return_existing_is_the_default():
    c = Core()
    first = c.enqueue(idempotency_key="k")[1]["job_id"]
    assert c.enqueue(idempotency_key="k") == (200, {"job_id": first, "deduplicated": True})
    assert c.stats()["enqueued"] == 1


def test_reject_policy_per_queue_and_per_enqueue():
    c = Core(queues=[{"name": "strict", "duplicate_policy": "reject"}])
    first = c.enqueue("strict", idempotency_key="k")[1]["job_id"]
    r = rejection(c.enqueue("strict", idempotency_key="k"))
    assert r == {"reason": "duplicate", "job_id": first}
    # the enqueue's own field overrides the queue's
    assert c.enqueue("strict", idempotency_key="k", duplicate_policy="return_existing") == \
        (200, {"job_id": first, "deduplicated": True})
    other = c.enqueue("q", idempotency_key="k")[1]["job_id"]
    assert rejection(c.enqueue("q", idempotency_key="k", duplicate_policy="reject"))["job_id"] == other
    assert rejection(c.enqueue("q", idempotency_key="x", duplicate_policy="sometimes"))["reason"] == "invalid_request"
    assert c.stats("strict")["enqueued"] == 1


def test_reject_in_a_batch_is_a_per_item_rejection_and_in_an_atomic_batch_rejects_the_batch():
    c = Core(queues=[{"name": "strict", "duplicate_policy": "reject"}])
    first = c.enqueue("strict", idempotency_key="k")[1]["job_id"]
    status, body = c.batch([{"queue": "strict", "job_type": "t", "idempotency_key": "k"},
                            {"queue": "strict", "job_type": "t", "idempotency_key": "new"}])
    assert status == 200
    assert body["results"][0] == {"rejection": {"reason": "duplicate", "job_id": first}}
    assert body["results"][1]["deduplicated"] is False
    before = c.snapshot_state()
    e = err(c.atomic([{"queue": "strict", "job_type": "t", "idempotency_key": "fresh"},
                      {"queue": "strict", "job_type": "t", "idempotency_key": "k"}]), 422, "batch_rejected")
    assert e["errors"] == [{"index": 1, "rejection": {"reason": "duplicate", "job_id": first}}]
    before.pop("rids"), before.pop("rid_fifo")
    after = c.snapshot_state()
    after.pop("rids"), after.pop("rid_fifo")
    assert after == before                  # nothing of the batch was enqueued
    # a key twice within one atomic batch: the second is a hit on the first
    e = err(c.atomic([{"queue": "strict", "job_type": "t", "idempotency_key": "twice"},
                      {"queue": "strict", "job_type": "t", "idempotency_key": "twice"}]), 422, "batch_rejected")
    assert e["errors"][0]["index"] == 1 and e["errors"][0]["rejection"]["reason"] == "duplicate"
    c.m.check_invariants()


def test_replace_changes_payload_priority_and_schedule_and_reindexes():
    c = Core(queues=[{"name": "r", "duplicate_policy": "replace"}])
    jid = c.enqueue("r", idempotency_key="k", payload=payload(b"old"), priority=0)[1]["job_id"]
    low = c.enqueue_id("r", priority=5)
    assert c.enqueue("r", idempotency_key="k", payload=payload(b"new", "text/plain"), priority=9) == \
        (200, {"job_id": jid, "deduplicated": True, "replaced": True})
    v = c.view(jid)
    assert v["payload"] == payload(b"new", "text/plain") and v["priority"] == 9 and v["state"] == "ready"
    assert c.stats("r")["ready"] == 2 and c.stats("r")["enqueued"] == 2
    c.m.check_invariants()
    # a new ready entry: priority 9 now goes ahead of the priority-5 job
    # now scheduled: leaves the ready index for the schedule
    assert c.enqueue("r", idempotency_key="k", delay_ms=5000)[1]["replaced"] is True
    assert c.view(jid)["state"] == "scheduled" and c.stats("r")["scheduled"] == 1 and c.stats("r")["ready"] == 1
    assert c.view(jid)["priority"] == 0             # a replace without priority: the queue's default
    c.m.check_invariants()
    assert c.reserve_one(["r"])["id"] == low        # the stale ready entry of jid is never handed out
    assert c.reserve_jobs(["r"]) == []
    # back to ready at once, priority 9
    c.enqueue("r", idempotency_key="k", priority=9)
    assert c.view(jid)["state"] == "ready" and c.stats("r")["scheduled"] == 0
    c.advance(6000)
    c.sweep()                                       # the stale schedule entry promotes nothing
    assert c.stats("r")["ready"] == 1
    assert c.reserve_one(["r"])["id"] == jid
    c.m.check_invariants()
    restored(c)


def test_a_listing_of_ready_jobs_is_in_delivery_order_when_a_replace_left_a_stale_entry_behind():
    """The ready FIFO keeps jobs, not entry keys, so a stale entry reads its job's key of now:
    a replace that lowered a job's priority made its old entry sort after the live ones behind
    it, and the listing's merge of the FIFO with the heap listed a heap job too early (the
    model test found it: list_jobs disagreed with the order reserve hands jobs out in)."""
    c = Core(queues=[{"name": "r", "duplicate_policy": "replace"}])
    a = c.enqueue("r", idempotency_key="k", priority=5)[1]["job_id"]
    c.advance(1)
    b = c.enqueue_id("r", priority=5)
    c.advance(1)
    c.enqueue("r", idempotency_key="k", priority=0)     # a: a new entry; its old one is stale
    c.advance(1)
    h = c.enqueue_id("r", priority=3)                    # sorts before the FIFO's tail: the heap
    want = [b, h, a]
    views, cursor = c.m.list_jobs("r", READY, 100, None)
    assert [v["id"] for v in views] == want and cursor is None
    paged, after = [], None                              # the same page by page
    while True:
        views, cursor = c.m.list_jobs("r", READY, 1, after)
        paged += [v["id"] for v in views]
        if cursor is None:
            break
        after = tuple(cursor)                            # as the service reads a cursor back
    assert paged == want
    assert [c.reserve_one(["r"])["id"] for _ in want] == want     # the order reserve hands out
    c.m.check_invariants()


def test_replace_is_refused_once_the_job_has_been_delivered_finished_or_dead_lettered():
    c = Core(storage=RETAIN)
    jid = c.enqueue_id(idempotency_key="k")
    c.reserve_one()
    e = err(c.enqueue(idempotency_key="k", duplicate_policy="replace"), 409, "failed_precondition")
    assert e["reason"] == "duplicate_started" and e["job_id"] == jid
    c.release(jid, 1)                               # waiting again, but it has been delivered
    e = err(c.enqueue(idempotency_key="k", duplicate_policy="replace"), 409, "failed_precondition")
    assert e["job_id"] == jid
    c.reserve_one()
    c.nack(jid, 2, retry={"strategy": "dead_letter"})
    err(c.enqueue(idempotency_key="k", duplicate_policy="replace"), 409, "failed_precondition")
    # finished (acked): gone, the key still names it
    done = c.enqueue_id(idempotency_key="k2")
    c.reserve_one()
    c.ack(done, 1)
    err(c.enqueue(idempotency_key="k2", duplicate_policy="replace"), 409, "failed_precondition")
    # in a batch: a per-item rejection; in an atomic batch: the whole batch
    status, body = c.batch([{"queue": "q", "job_type": "t", "idempotency_key": "k2", "duplicate_policy": "replace"}])
    assert status == 200 and body["results"] == [{"rejection": {"reason": "duplicate_started", "job_id": done}}]
    e = err(c.atomic([{"queue": "q", "job_type": "t"},
                      {"queue": "q", "job_type": "t", "idempotency_key": "k2", "duplicate_policy": "replace"}]),
            422, "batch_rejected")
    assert e["errors"] == [{"index": 1, "rejection": {"reason": "duplicate_started", "job_id": done}}]
    assert c.counts()["ready"] == 0
    c.m.check_invariants()


def test_replace_in_batches_answers_replaced():
    c = Core()
    jid = c.enqueue_id(idempotency_key="k")
    status, body = c.batch([{"queue": "q", "job_type": "t", "idempotency_key": "k", "duplicate_policy": "replace",
                             "payload": payload(b"b")}])
    assert body["results"] == [{"job_id": jid, "deduplicated": True, "replaced": True}]
    status, body = c.atomic([{"queue": "q", "job_type": "t", "idempotency_key": "k", "duplicate_policy": "replace",
                              "payload": payload(b"c")}])
    assert status == 200 and body["results"][0]["replaced"] is True
    assert c.view(jid)["payload"] == payload(b"c")
    c.m.check_invariants()
    m = pickle.loads(pickle.dumps(c.m))
    assert m.digest() == c.m.digest()


def test_a_cancel_written_before_issue_17_still_refuses_an_in_flight_job_on_replay():
    c = Core()
    jid = c.enqueue_id()
    c.reserve_one()
    legacy = (ops.CANCEL, None, jid, None)                  # no in_flight field: the old command
    assert err(c.apply(legacy), 409, "failed_precondition")["job_id"] == jid
    assert c.state(jid) == "in_flight"
    assert C.cancel(jid) == (ops.CANCEL, None, jid, None, True)     # what validation writes now
    assert c.cancel(jid) == (200, {"job_id": jid})


def test_reserve_results_kept_by_older_code_get_the_new_fields_on_restore():
    c = Core()
    c.enqueue_id()
    c.reserve(rid="r-old")
    data = c.m.to_builtins()
    data["rids"] = [(key, op, (kept[0], tuple(t[:14] for t in kept[1])) if op == ops.RESERVE else kept, *rest)
                    for key, op, kept, *rest in data["rids"]]
    m = RawMachine.from_builtins(c.limits, data)
    assert m.rids == c.m.rids and m.digest() == c.m.digest()


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
