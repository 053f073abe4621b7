"""Duplicate policy: what an enqueue whose idempotency key hits a live dedup record does
(return_existing, reject, replace) (docs/semantics.md, Duplicate policy)."""
from __future__ import annotations

import pickle

from raftq.node.core.jobs import READY

from helpers_core import Core, RETAIN, err, payload, rejection, restored


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
