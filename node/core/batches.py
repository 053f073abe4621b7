"""Batches with callbacks (docs/semantics.md "Batches"; requests: node/base/validate_batch.py).

A batch groups jobs (its members) and holds up to three callback jobs, enqueue items made at
validation with their ids: `on_complete` (every member ended), `on_success` (every member
succeeded) and `on_failure` (a member was dead-lettered). Members are added when the batch is
opened and, while it is open, later; `close` (or its timeout, in the sweep) says no more will come.

**Exactly once, never early.** A member's end (its ack, its dead letter, its removal) and what
follows from it for its batch are one command: the callback is enqueued in the command that ends
the batch's last member (or that closes a batch whose members have all ended), so every node
enqueues it at the same place of the log, once, whatever fails over or replays. `on_failure` is
enqueued by the first member's dead letter, at once (the batch may still be running). A cancelled
or purged member has ended without success: the batch completes without `on_success` and
without `on_failure`.

A callback is an ordinary job: made past its queue's depth limit (a callback is never lost, like
a dead-letter forward), with `batch_id` among its custom fields. A member enqueued as an
idempotency-key hit is not a member (no job was made).

State (replicated, in snapshots and the digest, only when there is some):
* `m.batches`: batch id -> Batch;
* `m.batch_of`: member job id -> batch id, for the members that have not ended;
* derived (rebuilt at restore): `m.batch_kept`, member id -> batch id, of the succeeded members
  whose records a batch holds (their results, for its callbacks to read);
* `m.batch_heap`: (time, batch id) timers: an open batch's timeout, a finished batch's expiry
  (kept FINISHED_RETENTION_MS after it finished, for its status); lazy, like the others (live
  while it is the batch's `timer`).
Batches kept at once, open or finished, are at most `limits.max_batches`; members of one at most
`limits.max_batch_members`.
"""
from __future__ import annotations

from . import audit, ops, results
from .jobs import DEAD, GONE, IN_FLIGHT, TIMER_AT

ON_COMPLETE, ON_SUCCESS, ON_FAILURE = "on_complete", "on_success", "on_failure"
CALLBACKS = (ON_COMPLETE, ON_SUCCESS, ON_FAILURE)
FINISHED_RETENTION_MS = 3_600_000       # a finished batch's status is kept an hour

# How a callback is enqueued and a member removed, from node/core/handlers.py (which imports
# this module): `bind`.
_enqueue_item = _enqueue_atomic = _remove = None


def bind(enqueue_item, enqueue_atomic, remove) -> None:
    global _enqueue_item, _enqueue_atomic, _remove
    _enqueue_item, _enqueue_atomic, _remove = enqueue_item, enqueue_atomic, remove


class Batch:
    """One batch: `open` (members may still be added), `timer` (its live heap entry, or None),
    `callbacks` {kind: enqueue item}, `pending` {member id: None} of members not ended, the
    counts of members `succeeded`, `failed` (dead-lettered) and `removed` (cancelled, purged),
    `fired` {kind: job id} of the callbacks enqueued, `created_at`, `finished_at`, and `kept`
    {member id: None}: the succeeded members whose records (node/core/results.py) it holds."""
    __slots__ = ("id", "open", "timer", "callbacks", "pending", "succeeded", "failed", "removed",
                 "fired", "created_at", "finished_at", "kept")

    def __init__(self, batch_id: str, callbacks: dict, created_at: int):
        self.id, self.open, self.timer, self.callbacks = batch_id, True, None, callbacks
        self.pending, self.succeeded, self.failed, self.removed = {}, 0, 0, 0
        self.fired, self.created_at, self.finished_at, self.kept = {}, created_at, None, {}

    def members(self) -> int:
        return len(self.pending) + self.succeeded + self.failed + self.removed

    def to_tuple(self) -> tuple:
        return (self.id, self.open, self.timer, tuple(sorted(self.callbacks.items())), tuple(sorted(self.pending)),
                self.succeeded, self.failed, self.removed, tuple(sorted(self.fired.items())), self.created_at,
                self.finished_at, tuple(sorted(self.kept)))

    @classmethod
    def from_tuple(cls, t) -> "Batch":
        (bid, is_open, timer, callbacks, pending, succeeded, failed, removed, fired, created_at, finished_at,
         kept) = t
        b = cls(bid, {k: tuple(v) for k, v in callbacks}, created_at)
        b.open, b.timer = is_open, tuple(timer) if timer is not None else None
        b.pending = dict.fromkeys(pending)
        b.succeeded, b.failed, b.removed, b.fired, b.finished_at = succeeded, failed, removed, dict(fired), finished_at
        b.kept = dict.fromkeys(kept)
        return b


# ---------------------------------------------------------------------------- commands
def open_batch(m, batch_id: str, callbacks, close: bool, timeout_ms, items):
    """A new batch with its callbacks ((kind, item), ...) and first members (enqueued all or
    nothing, as an atomic enqueue); closed at once when `close`, else closed by its timeout."""
    if batch_id in m.batches:
        return ops.batch_refused("exists", batch_id, None)
    if len(m.batches) >= m.limits.max_batches:
        return ops.batch_refused("too_many", batch_id, m.limits.max_batches)
    if len(items) > m.limits.max_batch_members:
        return ops.batch_refused("too_many_members", batch_id, m.limits.max_batch_members)
    b = Batch(batch_id, dict(callbacks), m.clock)
    made = _add_members(m, b, items) if items else ops.enqueued_batch(())
    if made[0] != ops.ENQUEUED_BATCH:       # refused before anything changed
        return made
    m._put(m.batches, batch_id, b)
    if close:
        _close(m, b)
    else:
        _set_timer(m, b, m.clock + timeout_ms)
    return ops.batch_saved(batch_id, made[1], b.open)


def add_to_batch(m, batch_id: str, items):
    """More members of an open batch, all or nothing."""
    b = m.batches.get(batch_id)
    if b is None:
        return ops.batch_not_found(batch_id)
    if not b.open:
        return ops.batch_refused("closed", batch_id, None)
    if b.members() + len(items) > m.limits.max_batch_members:
        return ops.batch_refused("too_many_members", batch_id, m.limits.max_batch_members)
    made = _add_members(m, b, items)
    if made[0] != ops.ENQUEUED_BATCH:
        return made
    return ops.batch_saved(batch_id, made[1], b.open)


def close_batch(m, batch_id: str):
    b = m.batches.get(batch_id)
    if b is None:
        return ops.batch_not_found(batch_id)
    if b.open:
        _close(m, b)
    return ops.batch_saved(batch_id, (), b.open)


def cancel_batch(m, batch_id: str, who=ops.UNAUDITED):
    """The members that have not started (ready, scheduled, waiting) are removed, in id order;
    the running ones run on; the batch is closed. Its completion callbacks come as for any
    closed batch (on_complete once the running ones end; never on_success)."""
    b = m.batches.get(batch_id)
    if b is None:
        return ops.batch_not_found(batch_id)
    cancelled, running = [], 0
    for job_id in sorted(b.pending):
        job = m.jobs.get(job_id)
        if job_id not in b.pending or job is None:
            continue                    # (ended by an earlier removal: a dependency_failed dead letter)
        if job.state == IN_FLIGHT:
            running += 1
            continue
        _remove(m, job)
        cancelled.append(job_id)
    if b.open:
        _close(m, b)
    audit.record(m, who, "batch_cancel", batch_id, {"cancelled": len(cancelled), "running": running,
                                                    "ids": audit.ids_shown(cancelled)})
    return ops.batch_cancelled(batch_id, tuple(cancelled), running)


def _add_members(m, b: Batch, items) -> tuple:
    """Enqueue `items` atomically; the jobs made join `b` (a dedup hit made none). A job
    dead-lettered as it was made (a `success` dependency had failed) joins as failed."""
    made = _enqueue_atomic(m, items)
    if made[0] != ops.ENQUEUED_BATCH:
        return made
    for r in made[1]:
        if type(r) is not str:
            continue
        job = m.jobs.get(r)
        if job is None or job.state == DEAD:
            m._add(b, "failed", 1)
            if ON_FAILURE in b.callbacks and ON_FAILURE not in b.fired:
                _fire(m, b, ON_FAILURE)
        else:
            m._put(b.pending, r, None)
            m._put(m.batch_of, r, b.id)
    return made


def _close(m, b: Batch) -> None:
    m._set(b, "open", False)
    m._set(b, "timer", None)
    if not b.pending:
        _finish(m, b)


# ---------------------------------------------------------------------------- a member ends
def member_ended(m, job_id: str, how: str) -> None:
    """Member `job_id` has ended: how is "succeeded", "failed" (dead-lettered) or "removed".
    What follows for its batch is decided here, in the command that ended it."""
    b = m.batches[m._pop(m.batch_of, job_id)]
    m._pop(b.pending, job_id)
    m._add(b, how, 1)
    if how == "succeeded" and job_id in m.results:      # its ack kept it (handlers.ack): held while b is
        m._put(b.kept, job_id, None)
        m._put(m.batch_kept, job_id, b.id)
    if how == "failed" and ON_FAILURE in b.callbacks and ON_FAILURE not in b.fired:
        _fire(m, b, ON_FAILURE)
    if not b.open and not b.pending:
        _finish(m, b)


def _finish(m, b: Batch) -> None:
    """Every member of a closed batch has ended: its completion callbacks, and its expiry."""
    m._set(b, "finished_at", m.clock)
    if ON_COMPLETE in b.callbacks:
        _fire(m, b, ON_COMPLETE)
    if ON_SUCCESS in b.callbacks and b.failed == 0 and b.removed == 0:
        _fire(m, b, ON_SUCCESS)
    _set_timer(m, b, m.clock + FINISHED_RETENTION_MS)


def _fire(m, b: Batch, kind: str) -> None:
    item = b.callbacks[kind]
    made = _enqueue_item(m, item)
    m._put(b.fired, kind, made if type(made) is str else None)
    m.released.add(item[ops.ITEM_QUEUE])    # soft state: wakes the queue's long polls (node/core/ops.py)


def _set_timer(m, b: Batch, at: int) -> None:
    timer = (at, b.id)
    m._set(b, "timer", timer)
    m._push(m.batch_heap, timer)


# ---------------------------------------------------------------------------- the sweep
def fire_timers(m, now: int, budget: int) -> int:
    """Open batches past their timeout are closed; finished batches past their retention go."""
    heap, n = m.batch_heap, 0
    while heap and heap[0][TIMER_AT] <= now and n < budget:
        timer = m._heappop(heap)
        b = m.batches.get(timer[1])
        if b is None or b.timer != timer:
            continue
        n += 1
        if b.open:
            _close(m, b)
        else:
            _drop(m, b)
    return n


def _drop(m, b: Batch) -> None:
    """A finished batch's hour is over: it goes, and the records of its members with it, unless
    their own retention or live dependents keep them (results.release)."""
    m._pop(m.batches, b.id)
    for job_id in sorted(b.kept):
        m._pop(m.batch_kept, job_id)
        results.release(m, job_id)


# ---------------------------------------------------------------------------- views
def view(m, batch_id: str) -> dict | None:
    b = m.batches.get(batch_id)
    if b is None:
        return None
    state = "open" if b.open else "closed" if b.finished_at is None else "finished"
    return {"id": b.id, "state": state, "created_at_ms": b.created_at, "finished_at_ms": b.finished_at,
            "members": b.members(), "pending": len(b.pending), "succeeded": b.succeeded, "failed": b.failed,
            "removed": b.removed, "pending_ids": sorted(b.pending)[:100],
            "callbacks": {k: {"fired": k in b.fired, "job_id": b.fired.get(k)} for k in sorted(b.callbacks)}}


# ---------------------------------------------------------------------------- snapshots
def to_rows(m) -> list:
    return [m.batches[bid].to_tuple() for bid in sorted(m.batches)]


def restore(m, rows) -> None:
    for t in rows:
        b = Batch.from_tuple(t)
        m.batches[b.id] = b
        for job_id in b.pending:
            m.batch_of[job_id] = b.id
        for job_id in b.kept:
            m.batch_kept[job_id] = b.id
        if b.timer is not None:
            m.batch_heap.append(b.timer)
    m.batch_heap.sort()


# ---------------------------------------------------------------------------- invariants
def check(m) -> list[str]:
    """Pending members are live jobs indexed to their batch; callbacks fired iff their condition
    holds (docs/semantics.md "Batches"); timers live."""
    bad = []
    live_timers = set(m.batch_heap)
    for bid, b in m.batches.items():
        where = f"batch {bid}"
        for job_id in b.pending:
            job = m.jobs.get(job_id)
            if job is None or job.state == GONE or m.batch_of.get(job_id) != bid:
                bad.append(f"{where}: pending member {job_id} is not a live job of it")
        done = not b.open and not b.pending
        if (b.finished_at is not None) != done:
            bad.append(f"{where}: finished_at {b.finished_at} but open {b.open}, {len(b.pending)} pending")
        want = {ON_COMPLETE: done, ON_SUCCESS: done and b.failed == 0 and b.removed == 0, ON_FAILURE: b.failed > 0}
        for kind in b.callbacks:
            if (kind in b.fired) != want[kind]:
                bad.append(f"{where}: callback {kind} fired {kind in b.fired}, its condition {want[kind]}")
        if set(b.fired) - set(b.callbacks):
            bad.append(f"{where}: fired {sorted(b.fired)} beyond its callbacks {sorted(b.callbacks)}")
        if (b.timer is None) != (not b.open and b.finished_at is None):
            bad.append(f"{where}: timer {b.timer}, open {b.open}, finished at {b.finished_at}: an open batch "
                       "has its timeout, a finished one its expiry, a closed one none")
        if b.timer is not None and b.timer not in live_timers:
            bad.append(f"{where}: its timer {b.timer} is not in the heap")
    if any(m.batches.get(bid) is None or job_id not in m.batches[bid].pending for job_id, bid in m.batch_of.items()):
        bad.append("the member index names a batch or member that is not pending")
    kept = {job_id: bid for bid, b in m.batches.items() for job_id in b.kept}
    if kept != m.batch_kept or any(job_id not in m.results for job_id in kept):
        bad.append("the records batches hold are not the batches' kept members, or are gone")
    return bad
