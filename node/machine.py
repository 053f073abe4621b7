"""The replicated queue state machine: every rule of SEMANTICS.md, and nothing else.

Pure and deterministic: no I/O, no clock, no randomness, no threads. Time and job ids arrive in
commands (built by `node.commands`), so every node that applies the same commands in the same
order holds the same state, and `digest()` proves it.

Commands are tuples `(op, request_id, *args)` of builtins (they cross Raft as pickles); results
are `(http_status, body)`, ready to serialize.

Two rules shape the code:
* `apply` never raises. pysyncobj wedges the whole cluster when an apply raises, so each command
  runs under an undo log: every mutation is recorded, before it is made, with how to revert
  it (through a primitive, or inline on the hot paths), and an unexpected exception reverts
  the command and yields an `internal` result.
* Cost does not grow with the work. Ready jobs are ordered by (-priority, enqueued_at,
  sequence) in a FIFO plus a heap per queue (see `Queue`); schedules, leases, deadlines and
  dedup windows sit in heaps keyed by time. Indexes are lazy: an entry whose job has moved on
  is skipped when it surfaces, which keeps cancel, extend and requeue O(log n) too.
"""
from __future__ import annotations

import hashlib
import heapq
from binascii import a2b_base64, b2a_base64
from heapq import heappop, heappush
from collections import OrderedDict, deque
from itertools import chain
from operator import attrgetter

import orjson

from .errors import error
from .limits import Limits
from .retry import policy_delay_ms

READY, SCHEDULED, IN_FLIGHT, DEAD, GONE = 0, 1, 2, 3, 4
STATE_NAMES = ("ready", "scheduled", "in_flight", "dead_lettered", "gone")

# Enqueue modes.
SINGLE, BATCH, ATOMIC = 0, 1, 2


class Job:
    """One job. `run_at` is when a scheduled job becomes ready; `scheduled_at` is what the
    producer asked for (shown to workers); `deadline` is cleared by the first delivery."""
    __slots__ = ("id", "queue", "job_type", "payload", "encoding", "priority", "custom", "trace",
                 "enqueued_at", "scheduled_at", "attempt", "max_attempts", "lease_expires",
                 "state", "seq", "run_at", "deadline", "last_reason")

    FIELDS = __slots__

    def to_tuple(self) -> tuple:
        return _job_fields(self)        # tuple(getattr(self, f) for f in Job.FIELDS), in C

    @classmethod
    def from_tuple(cls, t) -> "Job":
        job = cls.__new__(cls)
        if type(t) is tuple and len(t) == 18:      # the snapshot's own form: one unpacking
            (job.id, job.queue, job.job_type, job.payload, job.encoding, job.priority, job.custom,
             job.trace, job.enqueued_at, job.scheduled_at, job.attempt, job.max_attempts,
             job.lease_expires, job.state, job.seq, job.run_at, job.deadline, job.last_reason) = t
            return job
        for f, v in zip(Job.FIELDS, t):
            setattr(job, f, v)
        return job

    def render(self) -> dict:
        """The Job shape of API.md."""
        return render_job(*_render_fields(self))


# The fields the Job shape shows, in render_job's order. A reserve keeps these (a tuple of
# atomic values, which the cyclic GC does not track) under its request id instead of the
# rendered jobs: see QueueMachine.apply_one.
RENDER_FIELDS = ("id", "queue", "job_type", "payload", "encoding", "priority", "custom", "trace",
                 "enqueued_at", "scheduled_at", "attempt", "max_attempts", "lease_expires", "deadline")
_render_fields = attrgetter(*RENDER_FIELDS)


def render_job(id, queue, job_type, payload, encoding, priority, custom, trace, enqueued_at,
               scheduled_at, attempt, max_attempts, lease_expires, deadline) -> dict:
    """The Job shape of API.md from RENDER_FIELDS."""
    if payload is not None and trace is None:
        # The common shape, built in one go (same keys, same order as below).
        out = {"id": id, "queue": queue, "job_type": job_type,
               "payload": {"data_b64": b2a_base64(payload, newline=False).decode("ascii"), "encoding": encoding},
               "priority": priority, "custom": custom if custom is not None else {},
               "enqueued_at_ms": enqueued_at, "scheduled_at_ms": scheduled_at,
               "attempt": attempt, "max_attempts": max_attempts, "lease_expires_at_ms": lease_expires}
        if deadline is not None:
            out["deadline_at_ms"] = deadline
        return out
    out = {"id": id, "queue": queue, "job_type": job_type}
    if payload is not None:
        out["payload"] = {"data_b64": b2a_base64(payload, newline=False).decode("ascii"), "encoding": encoding}
    out["priority"] = priority
    out["custom"] = custom if custom is not None else {}
    if trace is not None:
        out["trace_context"] = {"traceparent": trace[0], "tracestate": trace[1]}
    out["enqueued_at_ms"] = enqueued_at
    out["scheduled_at_ms"] = scheduled_at
    out["attempt"] = attempt
    out["max_attempts"] = max_attempts
    out["lease_expires_at_ms"] = lease_expires
    if deadline is not None:
        out["deadline_at_ms"] = deadline
    return out


def render_fields_of(shown: dict) -> tuple:
    """RENDER_FIELDS back from a rendered job (render_job's inverse, for snapshots that kept
    rendered jobs under request ids)."""
    p = shown.get("payload")
    t = shown.get("trace_context")
    return (shown["id"], shown["queue"], shown["job_type"],
            a2b_base64(p["data_b64"]) if p is not None else None, p["encoding"] if p is not None else None,
            shown["priority"], shown["custom"] or None, (t["traceparent"], t["tracestate"]) if t is not None else None,
            shown["enqueued_at_ms"], shown["scheduled_at_ms"], shown["attempt"], shown["max_attempts"],
            shown["lease_expires_at_ms"], shown.get("deadline_at_ms"))


# A reserve's answer as the request-id store keeps it: (RESERVED, (RENDER_FIELDS tuple, ...)).
# Rendered, one job took ≈ 1.5 KB (the payload in base64 in a dict in a dict) for the whole
# request_id_window_ms: at 7,000 requests/s, ≈ 650 MB per node; as fields it shares the job's
# own strings and payload bytes.
RESERVED = "reserved"


# The two answers most requests get, kept as one small tuple of atomic values instead of
# (200, dict): ≈ 64 bytes instead of ≈ 240, for every enqueue and ack during the window.
JOB_ID = "job_id"                   # (JOB_ID, job id)  <-  200 {"job_id"}            (ack, cancel)
ENQUEUED = "enqueued"               # (ENQUEUED, job id, deduplicated)  <-  200 {"job_id", "deduplicated"}


def _compact(body):
    """A 200 answer's body as the request-id store keeps it (see replayed)."""
    if type(body) is dict:
        n = len(body)
        if n == 1 and "job_id" in body:
            return JOB_ID, body["job_id"]
        if n == 2 and "deduplicated" in body and "job_id" in body:
            return ENQUEUED, body["job_id"], body["deduplicated"]
    return 200, body


def _kept(op: str, result):
    """A snapshot's request-id entry in today's form (older snapshots kept rendered jobs and
    every answer as (status, body))."""
    if result and result[0] == 200 and isinstance(result[1], dict):
        if op == "res" and "jobs" in result[1]:
            return RESERVED, tuple(render_fields_of(j) for j in result[1]["jobs"])
        return _compact(result[1])
    return tuple(result)


def replayed(kept) -> tuple:
    """What the request-id store holds, as the answer to replay: (status, body)."""
    kind = kept[0]
    if kind == RESERVED:
        return 200, {"jobs": [render_job(*f) for f in kept[1]]}
    if kind == ENQUEUED:
        return 200, {"job_id": kept[1], "deduplicated": kept[2]}
    if kind == JOB_ID:
        return 200, {"job_id": kept[1]}
    return kept


_job_fields = attrgetter(*Job.FIELDS)
if Job.FIELDS != ("id", "queue", "job_type", "payload", "encoding", "priority", "custom", "trace",
                  "enqueued_at", "scheduled_at", "attempt", "max_attempts", "lease_expires",
                  "state", "seq", "run_at", "deadline", "last_reason"):
    raise RuntimeError("Job.from_tuple unpacks the fields in this order: keep it in step with __slots__")


class Queue:
    """Per-queue index and counters. Counts are exact; the ready index may hold stale entries.

    Ready entries `(-priority, enqueued_at, seq, job)` live in `ready_fifo`, a deque kept in
    ascending order, when they sort after its last entry (every new job of a queue that uses one
    priority: sequences only grow), and in the heap `ready_heap` otherwise (retries, which keep
    their place, and jobs of a higher priority than the last one). The next job is the smaller
    of the two heads, so a deep backlog costs O(1) per reserve instead of O(log n)."""
    __slots__ = ("name", "ready_heap", "ready_fifo", "ready", "scheduled", "in_flight", "dead",
                 "enqueued", "acked", "nacked", "dead_total", "paused")
    COUNTERS = ("ready", "scheduled", "in_flight", "dead", "enqueued", "acked", "nacked",
                "dead_total", "paused")

    def __init__(self, name: str):
        self.name = name
        self.ready_heap: list = []
        self.ready_fifo: deque = deque()
        self.ready = self.scheduled = self.in_flight = self.dead = 0
        self.enqueued = self.acked = self.nacked = self.dead_total = 0
        self.paused = False

    def depth(self) -> int:
        return self.ready + self.scheduled + self.in_flight

    def stats(self, declared: bool) -> dict:
        return {"name": self.name, "declared": declared, "paused": self.paused,
                "ready": self.ready, "scheduled": self.scheduled, "in_flight": self.in_flight,
                "dead_lettered": self.dead, "enqueued": self.enqueued, "acked": self.acked,
                "nacked": self.nacked, "dead_lettered_total": self.dead_total}


class InjectedFault(Exception):
    """Raised by the fault-injection hook in tests."""


class QueueMachine:
    def __init__(self, limits: Limits):
        self.limits = limits
        self.clock = 0                  # replicated time: max of every command's now_ms
        self.seq = 0                    # order of jobs within a priority and millisecond
        self.ctr = 0                    # unique tie-break for lease heap entries
        self.jobs: dict[str, Job] = {}
        self.queues: dict[str, Queue] = {}
        self.sched_heap: list = []      # (run_at, seq, job)
        self.lease_heap: list = []      # (lease_expires, ctr, job id): see _lease
        self.deadline_heap: list = []   # (deadline, seq, job)
        self.dedup: dict[tuple[str, str], tuple[str, int]] = {}   # (queue, key) -> (job_id, expires)
        self.dedup_heap: list = []      # (expires, queue, key)
        self.rids: dict[str, tuple[str, tuple, int]] = {}          # request id -> (op, result, expires)
        self.rid_fifo: deque = deque()  # (expires, request id); expiry order = insertion order
        self.reserved: list | tuple = ()  # the last reserve's jobs as RENDER_FIELDS, for the rid store
        # Whether anyone reads the answers of the commands being applied: a follower, or a
        # leader applying entries nobody on it waits for, leaves a reserve's jobs unrendered
        # (each costs a dict, a nested dict and a base64 of the payload). Not replicated state:
        # the node sets it per entry (node/replica.py), and it changes no state and no stored
        # answer, only the answer returned to nobody.
        self.render = True
        self.dlq: OrderedDict[str, tuple] = OrderedDict()          # job id -> (job, cause, failed_at, final_attempt, reason)
        self.dlq_by_queue: dict[str, OrderedDict] = {}
        self.applied = 0                # commands applied (for diagnostics, part of the state)
        self._undo: list = []
        self._fault_after: int | None = None   # tests: raise at the n-th mutation of a command

    # ------------------------------------------------------------------ undo log primitives
    # The undo log is a flat list of quadruples `fn, a, b, c`: reverting calls fn(a, b, c),
    # newest first. Each mutation is recorded *before* it is made, with one `undo += (...)`, so
    # logging allocates nothing that outlives the statement (no per-mutation tuples for the
    # cyclic GC to chase). Hot paths (enqueue, reserve, ack) write these entries inline; the
    # primitives below do the same for the rest.

    @property
    def _fault_after(self) -> int | None:
        """Tests: raise InjectedFault at the n-th mutation of a command (0 = the first)."""
        undo = self._undo
        return undo.left if type(undo) is _FaultLog else None

    @_fault_after.setter
    def _fault_after(self, n: int | None):
        undo = self._undo
        if n is None:
            if type(undo) is _FaultLog:
                self._undo = list(undo)
        else:
            log = _FaultLog(undo)
            log.left = n
            self._undo = log

    def _note(self, fn, *args):
        """Record `fn(*args)` as the undo of the mutation about to be made."""
        undo = self._undo
        undo += (_call, fn, args, None)

    def _set(self, obj, name: str, value):
        undo = self._undo
        undo += (setattr, obj, name, getattr(obj, name))
        setattr(obj, name, value)

    def _add(self, obj, name: str, delta: int):
        old = getattr(obj, name)
        undo = self._undo
        undo += (setattr, obj, name, old)
        setattr(obj, name, old + delta)

    def _put(self, d: dict, key, value):
        undo = self._undo
        if key in d:
            undo += (_restore_item, d, key, d[key])
        else:
            undo += (_drop_item, d, key, None)
        d[key] = value

    def _pop(self, d: dict, key):
        value = d[key]
        undo = self._undo
        undo += (_restore_item, d, key, value)
        del d[key]
        return value

    def _push(self, heap: list, entry):
        undo = self._undo
        undo += (_heap_remove, heap, entry, None)
        heappush(heap, entry)

    def _heappop(self, heap: list):
        entry = heap[0]
        undo = self._undo
        undo += (_heap_restore, heap, entry, None)
        return heappop(heap)

    def _odict_pop(self, od: OrderedDict, key):
        # Dead letters keep their order on undo: a reverted drain must not reorder the store.
        value = od[key]
        undo = self._undo
        undo += (_odict_restore, od, key, value)
        del od[key]
        return value

    def _new_seq(self) -> int:
        seq = self.seq
        undo = self._undo
        undo += (setattr, self, "seq", seq)
        self.seq = seq = seq + 1
        return seq

    def _new_ctr(self) -> int:
        ctr = self.ctr
        undo = self._undo
        undo += (setattr, self, "ctr", ctr)
        self.ctr = ctr = ctr + 1
        return ctr

    def _queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            q = Queue(name)
            self._put(self.queues, name, q)
        return q

    # ------------------------------------------------------------------ apply
    def apply_batch(self, now_ms: int, cmds) -> list:
        """Apply commands that share one leader stamp. Never raises."""
        try:
            if now_ms > self.clock:
                self.clock = now_ms
        except Exception:       # a non-integer stamp: keep the clock, still answer every command
            pass
        return [self.apply_one(cmd) for cmd in cmds]

    def apply(self, now_ms: int, cmd):
        try:                    # as apply_batch, for one command
            if now_ms > self.clock:
                self.clock = now_ms
        except Exception:
            pass
        return self.apply_one(cmd)

    def apply_one(self, cmd):
        try:
            op, rid = cmd[0], cmd[1]
            handler = _HANDLERS[op]
            if rid is not None and type(rid) is not str:
                raise TypeError("request id")     # (an unhashable one would raise below)
        except Exception:
            return error("internal", "malformed command")
        self.applied += 1
        if rid is not None:
            stored = self.rids.get(rid)
            if stored is not None and stored[2] > self.clock:
                if stored[0] != op:
                    return error("invalid_argument",
                                 f"Request-Id {rid!r} was already used for a different operation ({stored[0]})")
                return replayed(stored[1])
        self._undo.clear()
        try:
            result = handler(self, *cmd[2:])
        except Exception as exc:
            self._revert()
            self.applied -= 1                   # not applied: the state is exactly as before
            return error("internal", f"command {op!r} failed and was not applied: {type(exc).__name__}")
        self._undo.clear()
        if rid is not None and not (op == "res" and not result[1].get("jobs")):
            # An empty reserve is not remembered: a long poll re-proposes the same request id
            # until it gets jobs, and only that answer must be replayed.
            expires = self.clock + self.limits.request_id_window_ms
            if result[0] == 200:
                if op == "res":
                    kept, self.reserved = (RESERVED, tuple(self.reserved)), ()
                else:
                    kept = _compact(result[1])
            else:
                kept = result
            self.rids[rid] = (op, kept, expires)
            self.rid_fifo.append((expires, rid))
        return result

    def _revert(self):
        undo, self._undo = self._undo, []       # also ends fault injection
        for i in range(len(undo) - 4, -1, -4):
            undo[i](undo[i + 1], undo[i + 2], undo[i + 3])

    # ------------------------------------------------------------------ enqueue
    def _op_enq(self, mode: int, items):
        now = self.clock
        if mode == ATOMIC:
            # Capacity is checked up front for the whole batch, so it either fits entirely or
            # not at all. Dedup hits never count (SEMANTICS.md), neither against a live record
            # nor against an earlier job of this batch with the same key.
            wanted: dict[str, int] = {}
            keys: set = set()
            for item in items:
                if item[11] is not None:
                    rec = self.dedup.get((item[1], item[11]))
                    if (rec is not None and rec[1] > now) or (item[1], item[11]) in keys:
                        continue
                    keys.add((item[1], item[11]))
                wanted[item[1]] = wanted.get(item[1], 0) + 1
            full = {}
            for qname, n in wanted.items():
                limit = self.limits.queue(qname).max_queue_depth
                q = self.queues.get(qname)
                depth = q.depth() if q is not None else 0
                if limit is not None and depth + n > limit:
                    full[qname] = limit
            if full:
                errors = [{"index": i, "rejection": {"reason": "queue_full", "queue": item[1], "limit": full[item[1]]}}
                          for i, item in enumerate(items) if item[1] in full]
                return error("batch_rejected", "the batch was refused: queue full", errors=errors)
            return 200, {"results": [self._enqueue_one(item, now, check_depth=False) for item in items]}
        results = []
        for item in items:
            if isinstance(item, dict):            # refused by validation before proposing
                results.append({"rejection": item})
            else:
                results.append(self._enqueue_one(item, now, True))
        if mode == SINGLE:
            r = results[0]
            if "rejection" in r:
                return error("rejected", f"job refused: {r['rejection']['reason']}", rejection=r["rejection"])
            return 200, r
        return 200, {"results": results}

    def _enqueue_one(self, item, now: int, check_depth: bool) -> dict:
        (job_id, qname, job_type, payload, encoding, priority, max_attempts, custom, trace,
         scheduled_at, deadline, idem_key) = item
        ql = self.limits.queue(qname)
        if idem_key is not None:
            rec = self.dedup.get((qname, idem_key))
            if rec is not None and rec[1] > now:
                return {"job_id": rec[0], "deduplicated": True}
        q = self.queues.get(qname)
        if check_depth and ql.max_queue_depth is not None:
            depth = q.depth() if q is not None else 0
            if depth >= ql.max_queue_depth:
                return {"rejection": {"reason": "queue_full", "queue": qname, "limit": ql.max_queue_depth}}
        if q is None:
            q = self._queue(qname)
        if job_id in self.jobs:
            raise ValueError("job id collision")   # the leader's ids are fresh UUIDs
        job = Job()
        job.id, job.queue, job.job_type = job_id, qname, job_type
        job.payload, job.encoding, job.priority = payload, encoding, priority
        job.custom, job.trace = custom, trace
        job.enqueued_at, job.scheduled_at = now, scheduled_at
        job.attempt, job.max_attempts, job.lease_expires = 1, max_attempts, None
        job.deadline, job.last_reason = deadline, None
        # The hot path: the undo log is written inline (see the primitives).
        undo = self._undo
        seq = self.seq
        undo += (setattr, self, "seq", seq)
        self.seq = seq = seq + 1
        job.seq = seq
        jobs = self.jobs
        undo += (_drop_item, jobs, job_id, None)
        jobs[job_id] = job
        if scheduled_at is not None and scheduled_at > now:
            job.state, job.run_at = SCHEDULED, scheduled_at
            self._push(self.sched_heap, (scheduled_at, seq, job))
            self._add(q, "scheduled", 1)
        else:
            job.state, job.run_at = READY, None
            entry = (-priority, now, seq, job)
            fifo = q.ready_fifo
            if not fifo or fifo[-1] < entry:        # self._ready_push(q, entry), inline
                undo += (_fifo_remove, fifo, entry, None)
                fifo.append(entry)
            else:
                heap = q.ready_heap
                undo += (_heap_remove, heap, entry, None)
                heappush(heap, entry)
            n = q.ready
            undo += (setattr, q, "ready", n)
            q.ready = n + 1
        if deadline is not None:
            self._push(self.deadline_heap, (deadline, seq, job))
        n = q.enqueued
        undo += (setattr, q, "enqueued", n)
        q.enqueued = n + 1
        if idem_key is not None:
            expires = now + ql.dedup_window_ms
            self._put(self.dedup, (qname, idem_key), (job_id, expires))
            self._push(self.dedup_heap, (expires, qname, idem_key))
        return {"job_id": job_id, "deduplicated": False}

    # ------------------------------------------------------------------ reserve
    def _op_res(self, queue_names, lease_ms: int, max_jobs: int):
        now = self.clock
        out, kept = [], []
        render = self.render
        jobs, lease_heap = self.jobs, self.lease_heap
        undo = self._undo       # the hot path: the undo log is written inline
        for qname in queue_names:
            q = self.queues.get(qname)
            if q is None or q.paused:
                continue
            heap, fifo = q.ready_heap, q.ready_fifo
            while len(kept) < max_jobs:
                # The next job is the smaller head of the FIFO and the heap. Stale heads are
                # dropped on the way: that changes nothing logical, so it is not logged.
                while fifo:
                    entry = fifo[0]
                    job = entry[3]
                    if job.state == READY and job.seq == entry[2] and jobs.get(job.id) is job:
                        break
                    fifo.popleft()
                while heap:
                    entry = heap[0]
                    job = entry[3]
                    if job.state == READY and job.seq == entry[2] and jobs.get(job.id) is job:
                        break
                    heappop(heap)
                if fifo and not (heap and heap[0] < fifo[0]):
                    entry = fifo[0]
                    undo += (_appendleft, fifo, entry, None)
                    fifo.popleft()
                elif heap:
                    entry = heap[0]
                    undo += (_heap_restore, heap, entry, None)
                    heappop(heap)
                else:
                    break
                job = entry[3]
                if job.deadline is not None and job.deadline <= now:
                    self._add(q, "ready", -1)
                    self._dead_letter(job, q, "expired", None)   # too late to ever run
                    continue
                expires = now + lease_ms
                undo += (setattr, job, "state", job.state)
                job.state = IN_FLIGHT
                undo += (setattr, job, "lease_expires", job.lease_expires)
                job.lease_expires = expires
                if job.deadline is not None:
                    self._set(job, "deadline", None)
                n = q.ready
                undo += (setattr, q, "ready", n)
                q.ready = n - 1
                n = q.in_flight
                undo += (setattr, q, "in_flight", n)
                q.in_flight = n + 1
                # self._lease(job, expires), inline
                ctr = self.ctr
                undo += (setattr, self, "ctr", ctr)
                self.ctr = ctr = ctr + 1
                lease = (expires, ctr, job.id)
                undo += (_heap_remove, lease_heap, lease, None)
                heappush(lease_heap, lease)
                fields = _render_fields(job)
                if render:
                    out.append(render_job(*fields))
                kept.append(fields)
            if len(kept) >= max_jobs:
                break
        self.reserved = kept
        return 200, {"jobs": out if render else kept}

    def _lease(self, job: Job, expires: int):
        # A lease entry names its job by id, not by reference: an acked job is freed at once
        # (payload included) instead of living on in its stale entry until the lease would
        # have expired, and the entry, all atomic, is nothing the cyclic GC has to traverse.
        # An entry is live while jobs[id] is in flight with this expiry (ids are fresh UUIDs).
        ctr = self.ctr
        undo = self._undo
        undo += (setattr, self, "ctr", ctr)
        self.ctr = ctr = ctr + 1
        self._push(self.lease_heap, (expires, ctr, job.id))

    # ------------------------------------------------------------------ ack / nack / extend
    def _fenced(self, job_id: str, attempt: int):
        job = self.jobs.get(job_id)
        if job is None or job.state != IN_FLIGHT:
            return None, error("job_not_found", "job not found: it is not in flight (acked, expired, dead-lettered or unknown)",
                               job_id=job_id)
        if job.attempt != attempt:
            return None, error("attempt_mismatch",
                               f"attempt mismatch: the job is in flight under attempt {job.attempt}, not {attempt}",
                               job_id=job_id, attempt=job.attempt)
        return job, None

    def _op_ack(self, job_id: str, attempt: int):
        job = self.jobs.get(job_id)
        if job is None or job.state != IN_FLIGHT or job.attempt != attempt:
            return self._fenced(job_id, attempt)[1]
        # self._remove_in_flight(job) and the acked count, with the undo log written inline
        undo = self._undo
        undo += (setattr, job, "state", job.state)
        job.state = GONE
        jobs = self.jobs
        undo += (_restore_item, jobs, job.id, job)
        del jobs[job.id]
        q = self.queues[job.queue]
        n = q.in_flight
        undo += (setattr, q, "in_flight", n)
        q.in_flight = n - 1
        n = q.acked
        undo += (setattr, q, "acked", n)
        q.acked = n + 1
        return 200, {"job_id": job_id}

    def _op_acks(self, pairs):
        return 200, {"results": [self._op_ack(job_id, attempt)[1] for job_id, attempt in pairs]}

    def _remove_in_flight(self, job: Job):
        self._set(job, "state", GONE)
        self._pop(self.jobs, job.id)
        self._add(self.queues[job.queue], "in_flight", -1)

    def _op_nack(self, job_id: str, attempt: int, reason, strategy: str, delay_ms):
        job, err = self._fenced(job_id, attempt)
        if err:
            return err
        q = self.queues[job.queue]
        self._add(q, "nacked", 1)
        self._set(job, "last_reason", reason)
        if strategy == "dead_letter":
            self._add(q, "in_flight", -1)
            self._dead_letter(job, q, "rejected", reason)
            return 200, {"job_id": job_id, "dead_lettered": True}
        if job.attempt >= job.max_attempts:
            self._add(q, "in_flight", -1)
            self._dead_letter(job, q, "attempts_exhausted", reason)
            return 200, {"job_id": job_id, "dead_lettered": True}
        ql = self.limits.queue(job.queue)
        if strategy == "delay":
            delay = min(delay_ms, ql.max_schedule_horizon_ms)
        else:
            delay = policy_delay_ms(job.id, job.attempt, ql.retry_delay_ms, ql.retry_backoff,
                                    ql.retry_delay_max_ms, ql.max_schedule_horizon_ms)
        self._set(job, "attempt", job.attempt + 1)
        self._add(q, "in_flight", -1)
        if delay <= 0:
            self._make_ready(job, q)
        else:
            run_at = self.clock + delay
            self._set(job, "state", SCHEDULED)
            self._set(job, "run_at", run_at)
            self._push(self.sched_heap, (run_at, job.seq, job))
            self._add(q, "scheduled", 1)
        return 200, {"job_id": job_id, "dead_lettered": False}

    def _make_ready(self, job: Job, q: Queue):
        # A retried job keeps its enqueued_at and sequence: it goes ahead of newer jobs.
        self._set(job, "state", READY)
        self._ready_push(q, (-job.priority, job.enqueued_at, job.seq, job))
        self._add(q, "ready", 1)

    def _ready_push(self, q: Queue, entry):
        fifo = q.ready_fifo
        undo = self._undo
        if not fifo or fifo[-1] < entry:
            undo += (_fifo_remove, fifo, entry, None)
            fifo.append(entry)
        else:
            undo += (_heap_remove, q.ready_heap, entry, None)
            heappush(q.ready_heap, entry)

    def _op_ext(self, job_id: str, attempt: int, lease_ms: int):
        job, err = self._fenced(job_id, attempt)
        if err:
            return err
        lease = max(1, min(lease_ms, self.limits.queue(job.queue).max_lease_duration_ms))
        expires = self.clock + lease
        self._set(job, "lease_expires", expires)
        self._lease(job, expires)
        return 200, {"job_id": job_id, "lease_expires_at_ms": expires}

    # ------------------------------------------------------------------ dead letters
    def _dead_letter(self, job: Job, q: Queue, cause: str, reason):
        """Move a job that has already left its ready/scheduled/in-flight count."""
        self._add(q, "dead_total", 1)
        if self.limits.dead_letter_retention_ms <= 0:
            self._set(job, "state", GONE)
            self._pop(self.jobs, job.id)
            return
        self._set(job, "state", DEAD)
        self._add(q, "dead", 1)
        self._new_ctr()
        rec = (job, cause, self.clock, job.attempt, reason, self.ctr)
        self._put(self.dlq, job.id, rec)
        per_queue = self.dlq_by_queue.get(job.queue)
        if per_queue is None:
            per_queue = OrderedDict()
            self._put(self.dlq_by_queue, job.queue, per_queue)
        self._put(per_queue, job.id, rec)

    def _drop_dead_letter(self, job_id: str):
        rec = self._odict_pop(self.dlq, job_id)
        job = rec[0]
        self._odict_pop(self.dlq_by_queue[job.queue], job_id)
        self._add(self.queues[job.queue], "dead", -1)
        return rec

    def _op_drain(self, qname, max_records: int):
        source = self.dlq if qname is None else self.dlq_by_queue.get(qname, ())
        ids = []
        for job_id in source:
            if len(ids) >= max_records:
                break
            ids.append(job_id)
        records = []
        for job_id in ids:
            rec = self._drop_dead_letter(job_id)
            self._set(rec[0], "state", GONE)
            self._pop(self.jobs, job_id)
            records.append(render_dead_letter(rec))
        return 200, {"records": records}

    def _op_requeue(self, ids):
        requeued, missing = [], []
        for job_id in ids:
            if job_id not in self.dlq:
                missing.append(job_id)
                continue
            job = self._drop_dead_letter(job_id)[0]
            q = self.queues[job.queue]
            self._set(job, "attempt", 1)
            self._set(job, "enqueued_at", self.clock)
            self._set(job, "scheduled_at", None)
            self._set(job, "deadline", None)
            self._set(job, "seq", self._new_seq())
            self._make_ready(job, q)
            requeued.append(job_id)
        return 200, {"requeued": requeued, "missing": missing}

    def _op_dldel(self, ids):
        deleted, missing = [], []
        for job_id in ids:
            if job_id not in self.dlq:
                missing.append(job_id)
                continue
            job = self._drop_dead_letter(job_id)[0]
            self._set(job, "state", GONE)
            self._pop(self.jobs, job_id)
            deleted.append(job_id)
        return 200, {"deleted": deleted, "missing": missing}

    # ------------------------------------------------------------------ admin
    def _op_cancel(self, job_id: str):
        job = self.jobs.get(job_id)
        if job is None or job.state == DEAD:
            return error("not_found", "no ready or scheduled job with this id", job_id=job_id)
        if job.state == IN_FLIGHT:
            return error("failed_precondition", "the job is in flight; it can only be acked, nacked or left to expire",
                         job_id=job_id)
        q = self.queues[job.queue]
        self._add(q, "ready" if job.state == READY else "scheduled", -1)
        self._set(job, "state", GONE)
        self._pop(self.jobs, job_id)
        return 200, {"job_id": job_id}

    def _op_pause(self, qname: str, paused: bool):
        q = self._queue(qname)
        self._set(q, "paused", paused)
        return 200, {"queue": qname, "paused": paused}

    # ------------------------------------------------------------------ sweep
    def _op_sweep(self):
        now, budget = self.clock, self.limits.sweep_limit
        counts = {"promoted": 0, "leases_expired": 0, "deadlines_expired": 0,
                  "dedup_expired": 0, "request_ids_expired": 0, "dead_letters_expired": 0}
        # Budgets count live entries only: a node restored from a snapshot holds no stale heap
        # entries, so counting those would let replicas expire different sets in one sweep.
        heap, n = self.sched_heap, 0
        while heap and heap[0][0] <= now and n < budget:
            run_at, seq, job = self._heappop(heap)
            if job.state == SCHEDULED and job.run_at == run_at and self.jobs.get(job.id) is job:
                n += 1
                q = self.queues[job.queue]
                self._add(q, "scheduled", -1)
                self._set(job, "run_at", None)
                self._make_ready(job, q)
                counts["promoted"] += 1
        heap, n = self.lease_heap, 0
        while heap and heap[0][0] <= now and n < budget:
            expires, _, job_id = self._heappop(heap)
            job = self.jobs.get(job_id)
            if job is not None and job.state == IN_FLIGHT and job.lease_expires == expires:
                n += 1
                q = self.queues[job.queue]
                self._add(q, "in_flight", -1)
                counts["leases_expired"] += 1
                if job.attempt >= job.max_attempts:
                    self._set(job, "last_reason", None)
                    self._dead_letter(job, q, "lease_expired", None)
                else:
                    self._set(job, "attempt", job.attempt + 1)
                    self._make_ready(job, q)
        heap, n = self.deadline_heap, 0
        while heap and heap[0][0] <= now and n < budget:
            deadline, _, job = self._heappop(heap)
            if (job.deadline == deadline and job.state in (READY, SCHEDULED)
                    and self.jobs.get(job.id) is job):
                n += 1
                q = self.queues[job.queue]
                self._add(q, "ready" if job.state == READY else "scheduled", -1)
                counts["deadlines_expired"] += 1
                self._dead_letter(job, q, "expired", None)
        heap, n = self.dedup_heap, 0
        while heap and heap[0][0] <= now and n < budget:
            expires, qname, key = self._heappop(heap)
            rec = self.dedup.get((qname, key))
            if rec is not None and rec[1] == expires:
                n += 1
                self._pop(self.dedup, (qname, key))
                counts["dedup_expired"] += 1
        fifo, n = self.rid_fifo, 0
        while fifo and fifo[0][0] <= now and n < budget:
            entry = fifo[0]
            undo = self._undo
            undo += (_appendleft, fifo, entry, None)
            expires, rid = fifo.popleft()
            rec = self.rids.get(rid)
            if rec is not None and rec[2] == expires:
                n += 1
                self._pop(self.rids, rid)
                counts["request_ids_expired"] += 1
        retention = self.limits.dead_letter_retention_ms
        if retention > 0:
            n = 0
            while self.dlq and n < budget:
                first = next(iter(self.dlq))
                rec = self.dlq[first]
                if rec[2] > now - retention:
                    break
                n += 1
                self._drop_dead_letter(first)
                self._set(rec[0], "state", GONE)
                self._pop(self.jobs, first)
                counts["dead_letters_expired"] += 1
        return 200, counts

    def next_due_ms(self) -> int | None:
        """The earliest replicated time at which a sweep has work (stale entries may make it
        early, never late)."""
        due = [h[0][0] for h in (self.sched_heap, self.lease_heap, self.deadline_heap, self.dedup_heap) if h]
        if self.rid_fifo:
            due.append(self.rid_fifo[0][0])
        if self.limits.dead_letter_retention_ms > 0 and self.dlq:
            due.append(self.dlq[next(iter(self.dlq))][2] + self.limits.dead_letter_retention_ms)
        return min(due) if due else None

    # ------------------------------------------------------------------ reads (not replicated)
    def queue_names(self) -> list[str]:
        names = set(self.queues) | set(self.limits.queues)
        return sorted(names)

    def queue_stats(self, name: str) -> dict | None:
        q = self.queues.get(name)
        declared = name in self.limits.queues
        if q is None:
            return Queue(name).stats(declared) if declared else None
        return q.stats(declared)

    def job_view(self, job_id: str) -> dict | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        out = job.render()
        out["state"] = STATE_NAMES[job.state]
        out["last_reason"] = job.last_reason
        if job.state == SCHEDULED:
            out["run_at_ms"] = job.run_at
        if job.state != IN_FLIGHT:
            out["lease_expires_at_ms"] = None
        return out

    def list_jobs(self, qname: str, state: int, limit: int, after: tuple | None):
        """Jobs of one queue in one state, in delivery order (ready), run time (scheduled) or
        lease expiry (in flight); `after` is the sort key of the last job of the previous page."""
        if state == READY:
            q = self.queues.get(qname)
            cands = [((e[0], e[1], e[2]), e[3]) for e in (chain(q.ready_heap, q.ready_fifo) if q else ())
                     if e[3].state == READY and e[3].seq == e[2] and self.jobs.get(e[3].id) is e[3]]
        else:
            key = (lambda j: (j.run_at, j.seq)) if state == SCHEDULED else (lambda j: (j.lease_expires, j.seq))
            cands = [(key(j), j) for j in self.jobs.values() if j.queue == qname and j.state == state]
        if after is not None:
            cands = [c for c in cands if c[0] > after]
        page = heapq.nsmallest(limit + 1, cands, key=lambda c: c[0])
        more = len(page) > limit
        page = page[:limit]
        return [self.job_view(j.id) for _, j in page], (list(page[-1][0]) if more else None)

    def list_dead_letters(self, qname, limit: int, after_id):
        source = self.dlq if qname is None else self.dlq_by_queue.get(qname, OrderedDict())
        it = iter(source)
        if after_id is not None:
            if after_id not in source:
                return [], None
            for job_id in it:
                if job_id == after_id:
                    break
        page = []
        for job_id in it:
            if len(page) > limit:
                break
            page.append(source[job_id])
        more = len(page) > limit
        page = page[:limit]
        return [render_dead_letter(r) for r in page], (page[-1][0].id if more else None)

    def counts(self) -> dict:
        return {"jobs": len(self.jobs), "dead_letters": len(self.dlq), "dedup_records": len(self.dedup),
                "request_ids": len(self.rids), "clock_ms": self.clock}

    # ------------------------------------------------------------------ snapshot and digest
    def to_builtins(self) -> dict:
        """The whole state as plain builtins (for Raft snapshots); heaps keep only the entries
        that are or can become live."""
        jobs = [j.to_tuple() for j in self.jobs.values()]
        return {
            "v": 1, "clock": self.clock, "seq": self.seq, "ctr": self.ctr, "applied": self.applied,
            "jobs": jobs,
            "queues": [(q.name, [getattr(q, c) for c in Queue.COUNTERS],
                        [(e[0], e[1], e[2], e[3].id) for e in chain(q.ready_heap, q.ready_fifo)
                         if e[3].state == READY and e[3].seq == e[2] and self.jobs.get(e[3].id) is e[3]])
                       for q in self.queues.values()],
            # Schedule and lease timers of a job that still exists are kept even when stale: the
            # job can get the same time again (re-reserved or re-extended to the same expiry,
            # requeued and nacked to the same run time), which makes the old timer live again
            # and orders it by its older tie-break on every node, so also on a restored one.
            "sched": [(e[0], e[1], e[2].id) for e in self.sched_heap if self.jobs.get(e[2].id) is e[2]],
            "leases": [e for e in self.lease_heap if e[2] in self.jobs],
            "deadlines": [(e[0], e[1], e[2].id) for e in self.deadline_heap
                          if e[2].deadline == e[0] and self.jobs.get(e[2].id) is e[2]],
            "dedup": [(k[0], k[1], v[0], v[1]) for k, v in self.dedup.items()],
            "dedup_heap": [e for e in self.dedup_heap if self.dedup.get((e[1], e[2]), (0, None))[1] == e[0]],
            "rids": [(rid, op, result, exp) for rid, (op, result, exp) in self.rids.items()],
            "rid_fifo": [e for e in self.rid_fifo if self.rids.get(e[1], (0, 0, None))[2] == e[0]],
            "dlq": [(rec[0].id,) + rec[1:] for rec in self.dlq.values()],
        }

    @classmethod
    def from_builtins(cls, limits: Limits, data: dict) -> "QueueMachine":
        m = cls(limits)
        if data.get("v") != 1:
            raise ValueError(f"unknown snapshot version {data.get('v')!r}")
        m.clock, m.seq, m.ctr, m.applied = data["clock"], data["seq"], data["ctr"], data["applied"]
        for t in data["jobs"]:
            job = Job.from_tuple(t)
            m.jobs[job.id] = job
        for rec in data["dlq"]:
            job = m.jobs[rec[0]]
            r = (job,) + tuple(rec[1:])
            m.dlq[job.id] = r
            m.dlq_by_queue.setdefault(job.queue, OrderedDict())[job.id] = r
        for name, counters, heap in data["queues"]:
            q = Queue(name)
            for c, v in zip(Queue.COUNTERS, counters):
                setattr(q, c, v)
            # The ascending tail of the list (what was the FIFO) becomes the FIFO again; the rest
            # is heapified.
            k = len(heap) - 1
            while k > 0 and tuple(heap[k - 1]) < tuple(heap[k]):
                k -= 1
            k = max(k, 0)
            q.ready_heap = [(a, b, c, m.jobs[i]) for a, b, c, i in heap[:k]]
            heapq.heapify(q.ready_heap)
            q.ready_fifo = deque([(a, b, c, m.jobs[i]) for a, b, c, i in heap[k:]])
            m.queues[name] = q
        m.sched_heap = [(a, b, m.jobs[i]) for a, b, i in data["sched"]]
        m.lease_heap = [(a, b, m.jobs[i].id) for a, b, i in data["leases"]]
        m.deadline_heap = [(a, b, m.jobs[i]) for a, b, i in data["deadlines"]]
        for h in (m.sched_heap, m.lease_heap, m.deadline_heap):
            heapq.heapify(h)
        m.dedup = {(a, b): (c, d) for a, b, c, d in data["dedup"]}
        m.dedup_heap = [tuple(e) for e in data["dedup_heap"]]
        heapq.heapify(m.dedup_heap)
        m.rids = {rid: (op, _kept(op, result), exp) for rid, op, result, exp in data["rids"]}
        m.rid_fifo = deque(tuple(e) for e in data["rid_fifo"])
        return m

    def __getstate__(self):
        # Pickling (pysyncobj snapshots) goes through the builtins form; limits come from config.
        return {"limits": self.limits, "state": self.to_builtins()}

    def __setstate__(self, data):
        other = QueueMachine.from_builtins(data["limits"], data["state"])
        self.__dict__.update(other.__dict__)

    def digest(self) -> str:
        """A hash of the logical state, independent of heap layout and dict order where those do
        not change behaviour; equal on every node at the same applied index."""
        h = hashlib.sha256()
        h.update(orjson.dumps([self.clock, self.seq, self.applied]))
        for job_id in sorted(self.jobs):
            j = self.jobs[job_id]
            h.update(repr(j.to_tuple()).encode())
        for name in sorted(self.queues):
            q = self.queues[name]
            h.update(repr((name, [getattr(q, c) for c in Queue.COUNTERS])).encode())
        for k in sorted(self.dedup):
            h.update(repr((k, self.dedup[k])).encode())
        for rid in sorted(self.rids):
            op, kept, exp = self.rids[rid]
            h.update(repr((rid, op, exp)).encode())
            h.update(repr(kept).encode() if type(kept[0]) is str else orjson.dumps(kept, option=orjson.OPT_SORT_KEYS))
        for job_id, rec in self.dlq.items():       # order matters: drain is oldest first
            h.update(repr((job_id,) + rec[1:]).encode())
        return h.hexdigest()[:32]


def render_dead_letter(rec) -> dict:
    job, cause, failed_at, final_attempt, reason, _order = rec
    return {"job": job.render(), "cause": cause, "failed_at_ms": failed_at,
            "final_attempt": final_attempt, "last_reason": reason}


class _FaultLog(list):
    """The undo log while a test injects a fault: the n-th mutation raises before it is made."""
    __slots__ = ("left",)

    def __iadd__(self, entry):
        if self.left <= 0:
            raise InjectedFault("injected fault")
        self.left -= 1
        return list.__iadd__(self, entry)


def _call(fn, args, _):
    fn(*args)


def _restore_item(d, key, value):
    d[key] = value


def _drop_item(d, key, _):
    d.pop(key, None)


def _fifo_remove(fifo: deque, entry, _):
    if fifo and fifo[-1] is entry:
        fifo.pop()
        return
    for i, e in enumerate(fifo):
        if e is entry:
            del fifo[i]
            return


def _heap_restore(heap: list, entry, _):
    heappush(heap, entry)


def _appendleft(dq: deque, entry, _):
    dq.appendleft(entry)


def _heap_remove(heap: list, entry, _=None):
    for i, e in enumerate(heap):
        if e is entry:
            heap[i] = heap[-1]
            heap.pop()
            heapq.heapify(heap)
            return


def _odict_restore(od: OrderedDict, key, value):
    """Put a dead-letter record back in its place (records carry their order last)."""
    od[key] = value
    for k in [k for k, v in od.items() if v[-1] > value[-1]]:
        od.move_to_end(k)


_HANDLERS = {
    "enq": QueueMachine._op_enq,
    "res": QueueMachine._op_res,
    "ack": QueueMachine._op_ack,
    "acks": QueueMachine._op_acks,
    "nack": QueueMachine._op_nack,
    "ext": QueueMachine._op_ext,
    "drain": QueueMachine._op_drain,
    "requeue": QueueMachine._op_requeue,
    "dldel": QueueMachine._op_dldel,
    "cancel": QueueMachine._op_cancel,
    "pause": QueueMachine._op_pause,
    "sweep": QueueMachine._op_sweep,
}
OPS = tuple(_HANDLERS)
