"""Batches with callbacks in the core (node/core/batches.py, docs/semantics.md "Batches"): a
callback is enqueued exactly once, in the command that ends the batch's last member (or closes a
batch whose members have all ended), never before; on_failure at the first dead letter. These tests build the commands
(ops.batch_open, ...) from enqueue items made by validation (tests/cluster/test_job_results.py
goes through the requests). Every command is also faulted at each of its mutation points (Deps, from
tests/test_core_dependencies.py), and the state goes through a snapshot round trip and a replay."""
from __future__ import annotations

from helpers_core import RETAIN, Core, payload, restored
from raftq.node.base import validate as C
from raftq.node.core import ops
from raftq.node.core.batches import FINISHED_RETENTION_MS
from test_core_dependencies import Deps

BATCH = "00000000-0000-4000-8000-0000000bac01"


def items(c: Core, n: int, queue="q", **fields) -> tuple:
    """n enqueue items of queue `queue`, as validation makes them."""
    return C.enqueue_atomic({"jobs": [{"queue": queue, "job_type": "member", **fields}] * n},
                            c.m.limits, c.now, c.new_id)[3]


def callback(c: Core, job_type: str, queue="cb") -> tuple:
    return C.enqueue({"queue": queue, "job_type": job_type}, c.m.limits, c.now, c.new_id)[3][0]


def open_batch(c: Core, n: int, close=True, kinds=("on_complete", "on_success", "on_failure"), timeout_ms=60_000,
               batch_id=BATCH):
    cbs = tuple((k, callback(c, k)) for k in kinds)
    status, body = c.apply(ops.batch_open(None, batch_id, cbs, close, timeout_ms, items(c, n)))
    assert status == 200, body
    return [r["job_id"] for r in body["results"]]


def fired(c: Core) -> list:
    """The callback jobs enqueued so far, by job type (each once)."""
    return sorted(c.view(i)["job_type"] for i in c.m.jobs if c.m.jobs[i].queue == "cb")


def batch(c: Core) -> dict:
    return c.m.batch_view(BATCH)


def run(c: Core, ok=True):
    job = c.reserve_one()
    if ok:
        assert c.ack(job["id"], job["attempt"])[0] == 200
    else:
        assert c.nack(job["id"], job["attempt"], retry={"strategy": "dead_letter"})[0] == 200
    return job["id"]


def test_the_completion_callbacks_come_once_with_the_last_member_and_not_before():
    c = Deps(storage=RETAIN)
    members = open_batch(c, 3)
    assert batch(c)["state"] == "closed" and batch(c)["pending"] == 3
    run(c)
    run(c)
    assert fired(c) == [] and batch(c)["pending_ids"] == [members[2]]
    run(c)
    assert fired(c) == ["on_complete", "on_success"]
    b = batch(c)
    assert b["state"] == "finished" and b["succeeded"] == 3 and b["callbacks"]["on_failure"] == {"fired": False, "job_id": None}
    assert c.m.batch_of == {}


def test_on_failure_comes_at_the_first_dead_letter_and_on_success_never():
    c = Deps(storage=RETAIN)
    open_batch(c, 3)
    run(c, ok=False)
    assert fired(c) == ["on_failure"]           # at once, the batch still running
    run(c, ok=False)
    assert fired(c) == ["on_failure"]           # once
    run(c)
    assert fired(c) == ["on_complete", "on_failure"]
    assert batch(c)["failed"] == 2 and batch(c)["succeeded"] == 1


def test_an_open_batch_completes_only_when_closed_and_members_may_be_added_until_then():
    c = Deps()
    open_batch(c, 1, close=False)
    run(c)
    assert fired(c) == [] and batch(c)["state"] == "open"
    status, body = c.apply(ops.batch_add(None, BATCH, items(c, 2)))
    assert status == 200 and body["open"] is True and len(body["results"]) == 2
    run(c)
    run(c)
    assert fired(c) == []
    status, body = c.apply(ops.batch_close(None, BATCH))
    assert status == 200 and body["open"] is False
    assert fired(c) == ["on_complete", "on_success"]    # in the close command: every member had ended
    assert c.apply(ops.batch_close(None, BATCH))[0] == 200 and fired(c) == ["on_complete", "on_success"]
    status, body = c.apply(ops.batch_add(None, BATCH, items(c, 1)))
    assert status == 409 and body["error"]["reason"] == "closed"


def test_a_batch_never_closed_is_closed_by_its_timeout_and_a_finished_one_kept_an_hour():
    c = Deps()
    open_batch(c, 1, close=False, timeout_ms=5000)
    run(c)
    c.advance(4999)
    c.sweep()
    assert fired(c) == []
    c.advance(1)
    c.sweep()
    assert fired(c) == ["on_complete", "on_success"] and batch(c)["state"] == "finished"
    c.advance(FINISHED_RETENTION_MS)
    c.sweep()
    assert batch(c) is None and c.m.batches == {} and c.m.batch_heap == []


def test_a_removed_member_ends_the_batch_without_success_or_failure():
    c = Deps(storage=RETAIN)
    members = open_batch(c, 2)
    assert c.cancel(members[0])[0] == 200
    run(c)
    assert fired(c) == ["on_complete"] and batch(c)["removed"] == 1


def test_a_lapsed_lease_on_the_last_attempt_fires_in_the_sweep():
    c = Deps(storage=RETAIN)
    cbs = (("on_failure", callback(c, "on_failure")), ("on_complete", callback(c, "on_complete")))
    c.apply(ops.batch_open(None, BATCH, cbs, True, 60_000, items(c, 1, max_attempts=1)))
    c.reserve_one(lease_ms=1000)
    c.advance(1000)
    assert c.sweep()["leases_expired"] == 1
    assert fired(c) == ["on_complete", "on_failure"]


def test_a_member_dead_lettered_as_it_is_made_counts_failed():
    c = Deps(storage=RETAIN)
    bad = c.enqueue_id("other")
    job = c.reserve_one(["other"])
    c.nack(bad, job["attempt"], retry={"strategy": "dead_letter"})
    cbs = (("on_failure", callback(c, "on_failure")), ("on_complete", callback(c, "on_complete")))
    its = items(c, 1, depends_on=[bad])
    status, body = c.apply(ops.batch_open(None, BATCH, cbs, True, 60_000, its))
    assert status == 200 and fired(c) == ["on_complete", "on_failure"] and batch(c)["failed"] == 1


def test_refusals_change_nothing():
    c = Deps(limits={"max_batch_members": 3, "max_batches": 1})
    c.sweep()
    before = c.snapshot_state()
    bad = C.enqueue_atomic({"jobs": [{"queue": "q", "job_type": "t", "depends_on": ["00000000-0000-4000-8000-0000000000ee"]}]},
                           c.m.limits, c.now, c.new_id)[3]
    status, body = c.apply(ops.batch_open(None, BATCH, (), True, 1000, bad))
    assert status == 422 and body["error"]["code"] == "batch_rejected"
    status, body = c.apply(ops.batch_open(None, BATCH, (), True, 1000, items(c, 4)))
    assert status == 429 and body["error"]["reason"] == "too_many_members"
    assert c.apply(ops.batch_add(None, BATCH, items(c, 1)))[0] == 404
    assert c.apply(ops.batch_close(None, BATCH))[0] == 404
    assert c.snapshot_state() == before
    open_batch(c, 1, close=False, kinds=())
    status, body = c.apply(ops.batch_open(None, BATCH, (), True, 1000, ()))
    assert status == 409 and body["error"]["reason"] == "exists"
    status, body = c.apply(ops.batch_open(None, "00000000-0000-4000-8000-0000000bac02", (), True, 1000, ()))
    assert status == 429 and body["error"]["reason"] == "too_many"
    status, body = c.apply(ops.batch_add(None, BATCH, items(c, 3)))
    assert status == 429 and body["error"]["reason"] == "too_many_members"


def test_snapshot_round_trip_and_replay_keep_batches():
    c = Deps(storage=RETAIN)
    open_batch(c, 3)
    run(c, ok=False)
    run(c)
    m = restored(c)
    assert m.to_builtins() == c.m.to_builtins() and m.batch_of == c.m.batch_of
    replay = Core(storage=RETAIN)
    for now, cmd in c.log:
        replay.m.apply(now, cmd)
    assert replay.m.digest() == c.m.digest()
    run(c)
    assert fired(c) == ["on_complete", "on_failure"]


def test_a_state_without_batches_writes_and_hashes_as_before():
    c = Core()
    c.enqueue_id()
    assert "batches" not in c.m.to_builtins()


def test_cancelling_a_batch_removes_what_has_not_started_and_says_what_it_did():
    c = Deps(storage=RETAIN)
    members = open_batch(c, 4, close=False)
    running = c.reserve_one()
    done = run(c)
    status, body = c.apply(ops.batch_cancel(None, BATCH))
    assert status == 200 and body["running"] == 1
    assert body["cancelled"] == sorted(set(members) - {running["id"], done})
    assert batch(c)["state"] == "closed" and fired(c) == []
    assert c.audit()[0]["action"] == "batch_cancel"
    assert c.ack(running["id"], running["attempt"])[0] == 200
    assert fired(c) == ["on_complete"] and batch(c)["removed"] == 2     # never on_success
    assert c.apply(ops.batch_cancel(None, "00000000-0000-4000-8000-0000000bac09"))[0] == 404


def test_members_results_are_kept_while_their_batch_is_so_its_callbacks_read_them():
    """In a queue that keeps no results: a member acked while its batch is kept stays, with its
    result, until the batch goes (an hour after it finished); then it goes in that sweep."""
    c = Deps()
    members = open_batch(c, 2)
    for i in range(2):
        job = c.reserve_one()
        assert c.ack(job["id"], job["attempt"], result=payload(f"part {i}".encode()))[0] == 200
    assert fired(c) == ["on_complete", "on_success"]
    views = [c.view(m) for m in members]
    assert all(v["state"] == "succeeded" and v["kept_for_batch"] == BATCH for v in views)
    assert sorted(v["result"]["data_b64"] for v in views) == sorted(payload(f"part {i}".encode())["data_b64"] for i in range(2))
    c.advance(FINISHED_RETENTION_MS - 1)
    c.sweep()
    assert c.view(members[0]) is not None
    c.advance(1)
    c.sweep()
    assert [c.view(m) for m in members] == [None, None] and c.m.batch_kept == {} and c.m.results == {}


def test_an_idle_clusters_sweep_is_due_at_a_batch_timer():
    """The leader proposes a sweep when next_due_ms says work is due: an open batch's timeout and
    a finished batch's drop count (without them an idle cluster never closed nor dropped it)."""
    from raftq.node.core.sweep import next_due_ms
    c = Core()
    cbs = (("on_complete", callback(c, "on_complete")),)
    c.apply(ops.batch_open(None, BATCH, cbs, False, 5000, ()))
    assert next_due_ms(c.m) == c.now + 5000
    c.advance(5000)
    c.sweep()
    assert batch(c)["state"] == "finished" and next_due_ms(c.m) == c.now + FINISHED_RETENTION_MS
