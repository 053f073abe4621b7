"""Gating: throttles, circuit breakers and execution windows, decided at reserve (what each does:
docs/api.md "Gating: throttles, circuit breakers, execution windows").

Throttles: the machine counts the in-flight jobs of each resource (`m.in_use`, n > 0 only).
Reserve moves the ready entry of a job whose resource is full, unchanged, to the blocked heap of
(resource, queue) (`m.blocked[resource][queue]`, `m.blocked_ids[job id] = resource`); a freed
slot or a raised limit moves the best blocked entries back to their queue's ready index
(`release_blocked`). Every path on which a waiting job leaves its state other than by reserve
or a due schedule calls `leave_waiting` (reserve's own drop of an expired job `leave_ready`),
every path out of IN_FLIGHT `leave_in_flight`: the counts, the slots and the breaker follow.
Blocked entries are lazy like ready entries. Circuit breakers: `Circuit`, the failures counted
on the replicated clock, half open computed from it (nothing is written when time passes).
Windows: node/core/windows.py.

`m.released` is not replicated state: the queues a command made a held-back job reservable in,
which the node (node/service/) reads to wake parked reserves. It never changes a decision.
"""
from __future__ import annotations

from heapq import heappush

from . import audit, keys, ops
from .jobs import ENTRY_ENQUEUED_AT, ENTRY_JOB, ENTRY_NEG_PRIORITY, ENTRY_SEQ, READY, S_KEY, SCHEDULED, entry_order, known_queue
from .undo import fifo_unappend, heap_remove

NEUTRAL, OK, FAILED = 0, 1, 2       # how a job left IN_FLIGHT, for the circuit breaker
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class Circuit:
    """A queue's breaker state. `failures`: the times of the failures counted (at most the
    configured number, oldest first); `open_until` None while closed; `probe`: the id of the
    half-open probe in flight."""
    __slots__ = ("failures", "opened_at", "open_until", "probe", "opened_total")

    def __init__(self):
        self.failures: tuple = ()
        self.opened_at = self.open_until = self.probe = None
        self.opened_total = 0

    def to_tuple(self) -> tuple:
        return (list(self.failures), self.opened_at, self.open_until, self.probe, self.opened_total)

    @classmethod
    def from_tuple(cls, t) -> "Circuit":
        c = cls()
        failures, c.opened_at, c.open_until, c.probe, c.opened_total = t
        c.failures = tuple(failures)
        return c


def circuit_state(c, now: int) -> str:
    if c is None or c.open_until is None:
        return CLOSED
    return OPEN if now < c.open_until else HALF_OPEN


# ---------------------------------------------------------------------------- reserve
def reserve_cap(m, q, now: int) -> int:
    """For a gated queue (a breaker or windows): 0 = skip it now, 1 = one probe job, -1 = no
    cap."""
    ql = m.limits.queue(q.name)
    w = ql.windows
    if w is not None and not w.open_at(now):
        return 0
    if ql.circuit_breaker is not None:
        c = q.circuit
        if c is not None and c.open_until is not None:
            if now < c.open_until or c.probe is not None:
                return 0
            return 1
    return -1


def reservable(m, q) -> bool:
    """Whether a reserve of queue q could take a job now (the node's long-poll wake, node/service/)."""
    held = q.keys.held_ready if q.keys is not None else 0
    if q.paused or q.ready - q.throttled - held <= 0:
        return False
    if q.name in m.limits.gated:
        rate = m.limits.queue(q.name).rate
        if rate is not None and keys.rate_room(q.rate_log, rate, m.clock) <= 0:
            return False
        return reserve_cap(m, q, m.clock) != 0
    return True


def set_probe(m, q, job_id: str) -> None:
    m._set(q.circuit, "probe", job_id)


def block(m, q, r: str, entry) -> None:
    """Reserve met a ready job whose resource r is full: hold its entry back."""
    per = m.blocked.get(r)
    if per is None:
        per = {}
        m._put(m.blocked, r, per)
    heap = per.get(q.name)
    if heap is None:
        heap = []
        m._put(per, q.name, heap)
    m._push(heap, entry)
    m._put(m.blocked_ids, entry[ENTRY_JOB].id, r)
    m._add(q, "throttled", 1)
    m._add(q, "deferred", 1)


def release_blocked(m, r: str) -> None:
    """Blocked entries of resource r back to their queues' ready indexes, best first, as many
    per queue as r has free slots (all of them when r has no limit)."""
    per = m.blocked.get(r)
    if per is None:
        return
    limit = m.limits.resource_limits.get(r)
    free = None if limit is None else limit - m.in_use.get(r, 0)
    if free is not None and free <= 0:
        return
    jobs, ids = m.jobs, m.blocked_ids
    for qname in list(per):
        heap = per[qname]
        q = m.queues.get(qname)
        moved = 0
        while heap and (free is None or moved < free):
            entry = m._heappop(heap)
            job = entry[ENTRY_JOB]
            if job.state == READY and job.seq == entry[ENTRY_SEQ] and jobs.get(job.id) is job and ids.get(job.id) == r:
                m._pop(ids, job.id)
                m._add(q, "throttled", -1)
                ready_push(m, q, entry)
                if not keys.held(q, job):       # a job its key's limit holds takes no slot yet
                    moved += 1
        if moved:
            m.released.add(qname)
        if not heap:
            m._pop_in_place(per, qname)
    if not per:
        m._pop_in_place(m.blocked, r)


def ready_push(m, q, entry) -> None:
    """An entry into its queue's ready index, in its place (the FIFO when it sorts after its
    last entry, else the heap), undo-logged; a keyed job's into its key's heap. Here rather than
    in handlers.py, which imports this module: the gating paths put held-back entries back with
    it too."""
    job = entry[ENTRY_JOB]
    if job.spec[S_KEY] is not None:
        keys.push(m, q, entry)
        return
    if q.keys is not None:
        keys.plain_pushed(m, q, entry[ENTRY_NEG_PRIORITY])
    fifo = q.ready_fifo
    undo = m._undo
    tail = q.fifo_tail
    if not fifo or (tail[0], tail[1], q.fifo_seqs[-1]) < entry_order(entry):
        # After the last entry: the FIFO (node/core/jobs.py Queue). A held-back entry keeps its
        # seq, which may be older than the last one's.
        undo += (fifo_unappend, q, job, tail)
        fifo.append(job)
        q.fifo_seqs.append(entry[ENTRY_SEQ])
        q.fifo_tail = (entry[ENTRY_NEG_PRIORITY], entry[ENTRY_ENQUEUED_AT])
    else:
        undo += (heap_remove, q.ready_heap, entry, None)
        heappush(q.ready_heap, entry)


def key_held(m, key) -> None:
    """A key's limit now holds it: claims its ready jobs had on free slots of their resources
    pass on to held-back jobs that can take them (as `leave_ready` does for a job that leaves)."""
    for r in list(key.resources or ()):
        if r in m.blocked:
            release_blocked(m, r)


def release_all(m) -> None:
    """After a configuration change: every resource whose limit now admits more."""
    for r in list(m.blocked):
        release_blocked(m, r)


def drop_queue_blocked(m, qname: str) -> None:
    """Purge: every blocked entry of queue qname goes (its jobs have just been forgotten)."""
    for r in list(m.blocked):
        per = m.blocked[r]
        if qname in per:
            m._pop_in_place(per, qname)
            if not per:
                m._pop_in_place(m.blocked, r)


# ---------------------------------------------------------------------------- leaving a state
def leave_waiting(m, q, job) -> None:
    """A READY or SCHEDULED job leaves its state other than by reserve or by a due schedule
    (replace, cancel, deadline, dead-letter move): the one place that keeps the counts, the
    held-back marks and the resource's free slots in step (docs/api.md "Gating: throttles,
    circuit breakers, execution windows")."""
    if job.state == SCHEDULED:
        m._add(q, "scheduled", -1)
    else:
        leave_ready(m, q, job)


def leave_ready(m, q, job) -> None:
    """A READY job leaves READY other than by being handed out: the ready count, and the
    throttled count when it was held back. A job of a resource that others wait on was in the
    ready index, perhaps put back there for a slot that freed (`release_blocked`): that claim
    passes to the next held-back job, else it would wait for a slot that nobody holds."""
    m._add(q, "ready", -1)
    ids = m.blocked_ids
    if ids and job.id in ids:
        m._pop(ids, job.id)
        m._add(q, "throttled", -1)
        return
    if job.spec[S_KEY] is not None:
        keys.left_ready(m, q, job)
    r = job.resource
    if r is not None and r in m.blocked:
        release_blocked(m, r)


def leave_in_flight(m, job, q, outcome: int = NEUTRAL) -> None:
    """A job leaves IN_FLIGHT: the in-flight count, its resource slot, the circuit breaker.
    Every such path calls this (ack's hot path inlines the count and calls `gate_leave`)."""
    m._add(q, "in_flight", -1)
    if job.resource is not None or q.circuit is not None or outcome == FAILED or job.spec[S_KEY] is not None:
        gate_leave(m, job, q, outcome)


def free_slot(m, job) -> None:
    r = job.resource
    n = m.in_use.get(r, 0) - 1
    if n > 0:
        m._put(m.in_use, r, n)
    elif r in m.in_use:
        m._pop(m.in_use, r)
    if r in m.blocked:
        release_blocked(m, r)


def gate_leave(m, job, q, outcome: int) -> None:
    if job.resource is not None:
        free_slot(m, job)
    if job.spec[S_KEY] is not None:
        keys.left_in_flight(m, q, job)
    c = q.circuit
    if outcome == OK:
        if c is not None and c.probe == job.id:
            close(m, q)
        return
    if outcome == NEUTRAL:
        if c is not None and c.probe == job.id:
            m._set(c, "probe", None)
            m.released.add(q.name)
        return
    cb = m.limits.queue(q.name).circuit_breaker
    if cb is None:
        if c is not None and c.probe == job.id:
            m._set(c, "probe", None)            # the breaker was removed meanwhile
        return
    now = m.clock
    if c is None:
        c = Circuit()
        m._set(q, "circuit", c)
    if c.open_until is not None:
        if now >= c.open_until and c.probe == job.id:
            _open(m, c, now, cb)                    # the probe failed
        return                                      # open, or half open and not the probe
    n, window, _ = cb
    kept = tuple(t for t in c.failures if t > now - window)
    kept = kept[len(kept) - (n - 1):] if n > 1 else ()
    failures = kept + (now,)
    m._set(c, "failures", failures)
    if len(failures) >= n:
        _open(m, c, now, cb)


def _open(m, c, now: int, cb) -> None:
    m._set(c, "opened_at", now)
    m._set(c, "open_until", now + cb[2])
    m._set(c, "probe", None)
    m._add(c, "opened_total", 1)


def close(m, q) -> None:
    c = q.circuit
    m._set(c, "failures", ())
    m._set(c, "opened_at", None)
    m._set(c, "open_until", None)
    m._set(c, "probe", None)
    m.released.add(q.name)


# ---------------------------------------------------------------------------- the operator's close
def close_circuit(m, queue: str, who=ops.UNAUDITED):
    """POST /v1/queues/{name}/circuit/close: the circuit closes now (failures forgotten)."""
    if not known_queue(m, queue):
        return ops.queue_not_found(queue)
    q = m.queues.get(queue)
    c = q.circuit if q is not None else None
    was = circuit_state(c, m.clock)
    if c is not None:
        close(m, q)
    audit.record(m, who, "circuit_close", queue, {"was": was})
    return ops.circuit_closed(queue, was)


# ---------------------------------------------------------------------------- reads
def queue_view(m, name: str, q, stats: dict) -> dict:
    """The gating fields of GET /v1/queues: circuit, window_open (throttled and
    throttle_deferred_total come from Queue.stats)."""
    ql = m.limits.queue(name)
    now = m.clock
    cb = ql.circuit_breaker
    if cb is None:
        stats["circuit"] = None
    else:
        c = q.circuit if q is not None else None
        state = circuit_state(c, now)
        stats["circuit"] = {
            "state": state,
            "failures": 0 if c is None else sum(1 for t in c.failures if t > now - cb[1]),
            "opened_at_ms": None if state == CLOSED else c.opened_at,
            "open_until_ms": None if state == CLOSED else c.open_until,
            "opened_total": 0 if c is None else c.opened_total}
    stats["window_open"] = ql.windows is None or ql.windows.open_at(now)
    stats.update(keys.stats(q))
    return stats


def next_due_ms(m):
    """When a sweep should run for gating: a gated queue with jobs waiting, whose circuit turns
    half open at open_until or whose window may open at the next minute (the sweep's entry
    advances the replicated clock, which wakes the parked reserves)."""
    due = None
    for name in m.limits.gated:
        q = m.queues.get(name)
        if q is None or q.ready - q.throttled <= 0 or q.paused:
            continue
        ql = m.limits.queue(name)
        t = None
        if ql.rate is not None and keys.rate_room(q.rate_log, ql.rate, m.clock) <= 0:
            t = keys.rate_opens(q.rate_log, ql.rate)
        elif ql.windows is not None and not ql.windows.open_at(m.clock):
            t = ql.windows.next_change_ms(m.clock)
        elif ql.circuit_breaker is not None and q.circuit is not None and q.circuit.open_until is not None \
                and m.clock < q.circuit.open_until:
            t = q.circuit.open_until
        if t is not None and (due is None or t < due):
            due = t
    return due
