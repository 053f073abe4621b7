"""The replicated queue state machine: every rule of SEMANTICS.md, and nothing else.

Pure and deterministic: no I/O, no clock, no randomness, no threads. Time and job ids arrive in
commands (built by `node.validate`), so every node that applies the same commands in the same
order holds the same state, and `digest()` proves it.

`QueueMachine` lives here (snapshots of this and earlier releases name it by this path); its
parts are in node/core/:

| module | what |
|---|---|
| `ops.py` | commands and results: op codes, field names, constructors and readers |
| `jobs.py` | Job, Queue, DeadLetter and the job states |
| `undo.py` | the undo log and its mutation primitives (mixed into QueueMachine) |
| `handlers.py` | one handler per command, named with the spec's verbs |
| `sweep.py` | the sweep, one function per step |
| `answers.py` | results rendered into answers (status, body, messages), and back for old snapshots |
| `snapshot.py` | `to_builtins` / `from_builtins` and `digest` |
| `invariants.py` | `check_invariants()` |

Commands are tuples `(op, request_id, *fields)` of builtins (they cross Raft as pickles);
results are tuples `(kind, *fields)` of codes and values (node/core/ops.py), which the node
renders with `node.core.answers.render` when it sends the answer.

Two rules shape the code:
* `apply` never raises. Each command runs under an undo log (node/core/undo.py), and an
  unexpected exception reverts the command and yields an `internal` result.
* Cost does not grow with the work. Ready jobs are ordered by (-priority, enqueued_at,
  sequence) in a FIFO plus a heap per queue (see `Queue`); schedules, leases, deadlines and
  dedup windows sit in heaps keyed by time. Indexes are lazy: an entry whose job has moved on
  is skipped when it surfaces, which keeps cancel, extend and requeue O(log n) too.
"""
from __future__ import annotations

import heapq
import inspect
from collections import OrderedDict, deque
from itertools import chain

from .core import handlers, invariants, ops, snapshot
from .core import sweep as sweeping
from .core.answers import render_dead_letter, render_job
from .core.jobs import IN_FLIGHT, READY, SCHEDULED, STATE_NAMES, Job, Queue, shown_fields
from .core.ops import MALFORMED_RESULT, NOT_REMEMBERED, RESERVE
from .core.undo import UndoLog
from .limits import Limits
from .request_ids import SEP

# op code -> handler(machine, *fields): the handlers take the fields by their ops.COMMANDS names.
HANDLERS = {
    ops.ENQUEUE: handlers.enqueue,
    ops.RESERVE: handlers.reserve,
    ops.ACK: handlers.ack,
    ops.ACK_BATCH: handlers.ack_batch,
    ops.NACK: handlers.nack,
    ops.EXTEND: handlers.extend,
    ops.DRAIN: handlers.drain,
    ops.REQUEUE: handlers.requeue,
    ops.DELETE_DEAD_LETTERS: handlers.delete_dead_letters,
    ops.CANCEL: handlers.cancel,
    ops.PAUSE: handlers.pause,
    ops.SWEEP: sweeping.sweep,
}
for _op, _handler in HANDLERS.items():
    if tuple(inspect.signature(_handler).parameters)[1:] != ops.COMMANDS[_op]:
        raise RuntimeError(f"handler {_handler.__name__} does not take the fields of {_op!r} as ops.COMMANDS names them")
if tuple(HANDLERS) != ops.OPS:
    raise RuntimeError("every op of node/core/ops.py needs a handler here")


class QueueMachine(UndoLog):
    def __init__(self, limits: Limits):
        self.limits = limits
        self.clock = 0                  # replicated time: max of every command's now_ms
        self.seq = 0                    # order of jobs within a priority and millisecond
        self.ctr = 0                    # unique tie-break for lease entries and dead-letter order
        self.jobs: dict[str, Job] = {}
        self.queues: dict[str, Queue] = {}
        self.sched_heap: list = []      # (run_at, seq, job)
        self.lease_heap: list = []      # (lease_expires, ctr, job id): see handlers.lease
        self.deadline_heap: list = []   # (deadline, seq, job)
        self.dedup: dict[tuple[str, str], tuple[str, int]] = {}   # (queue, key) -> (job_id, expires)
        self.dedup_heap: list = []      # (expires, queue, key)
        # request id -> (op, result, expires). A node-made id (node/request_ids.py) is stored
        # under "caller SEP id", its op as "op SEP fingerprint" (the request it answers).
        self.rids: dict[str, tuple[str, tuple, int]] = {}
        self.rid_fifo: deque = deque()  # (expires, request id); expiry order = insertion order
        # Whether anyone reads the answers of the commands being applied: a follower, or a
        # leader applying entries nobody on it waits for. Not replicated state: the node sets
        # it per entry (node/replica.py). Results are rendered outside the machine now, by the
        # node that sends them, so nothing here depends on it; it stays for that interface.
        self.render = True
        self.dlq: OrderedDict[str, object] = OrderedDict()         # job id -> DeadLetter, oldest first
        self.dlq_by_queue: dict[str, OrderedDict] = {}
        self.applied = 0                # commands applied (for diagnostics, part of the state)
        self._undo: list = []

    def ensure_queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            q = Queue(name)
            self._put(self.queues, name, q)
        return q

    # ------------------------------------------------------------------ apply
    def apply_batch(self, now_ms: int, cmds) -> list:
        """Apply commands that share one leader stamp; one result per command. Never raises."""
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
            handler = HANDLERS[op]
            if rid is not None and type(rid) is not str:
                raise TypeError("request id")     # (an unhashable one would raise below)
        except Exception:
            return MALFORMED_RESULT
        self.applied += 1
        if rid is not None:
            # "caller SEP id SEP fingerprint" (node/request_ids.py): each caller's ids are its
            # own, and a reuse with another operation or body is refused. An id without SEP (a
            # journal of an older version) is its own key and op, as before.
            k, sep, fp = rid.rpartition(SEP)
            if sep:
                rid, tag = k, op + SEP + fp
            else:
                tag = op
            stored = self.rids.get(rid)
            if stored is not None and stored[2] > self.clock:
                if stored[0] != tag:
                    return ops.request_id_reused(rid, stored[0])
                return stored[1]
        self._undo.clear()
        try:
            result = handler(self, *cmd[2:])
        except Exception as exc:
            self._revert()
            self.applied -= 1                   # not applied: the state is exactly as before
            return ops.failed(op, type(exc).__name__)
        self._undo.clear()
        if rid is not None and not (op == RESERVE and not result[1]) and result[0] not in NOT_REMEMBERED:
            # An empty reserve is not remembered: a long poll re-proposes the same request id
            # until it gets jobs, and only that answer must be replayed.
            expires = self.clock + self.limits.request_id_window_ms
            self.rids[rid] = (tag, result, expires)
            self.rid_fifo.append((expires, rid))
        return result

    def next_due_ms(self) -> int | None:
        """The earliest replicated time at which a sweep has work (stale entries may make it
        early, never late)."""
        return sweeping.next_due_ms(self)

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
        out = render_job(*shown_fields(job))
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
        return ([render_dead_letter(shown_fields(r.job), r.cause, r.failed_at, r.final_attempt, r.reason)
                 for r in page], (page[-1].job.id if more else None))

    def counts(self) -> dict:
        return {"jobs": len(self.jobs), "dead_letters": len(self.dlq), "dedup_records": len(self.dedup),
                "request_ids": len(self.rids), "clock_ms": self.clock}

    def check_invariants(self) -> None:
        """Raise InvariantViolation naming every invariant that does not hold (O(state): tests)."""
        problems = invariants.check(self)
        self._checked_clock = self.clock
        if problems:
            raise invariants.InvariantViolation("\n".join(problems))

    # ------------------------------------------------------------------ snapshot and digest
    def to_builtins(self) -> dict:
        """The whole state as plain builtins (for Raft snapshots): node/core/snapshot.py."""
        return snapshot.to_builtins(self)

    @classmethod
    def from_builtins(cls, limits: Limits, data: dict) -> "QueueMachine":
        return snapshot.from_builtins(cls(limits), data)

    def __getstate__(self):
        # Pickling (pysyncobj snapshots) goes through the builtins form; limits come from config.
        return {"limits": self.limits, "state": self.to_builtins()}

    def __setstate__(self, data):
        other = QueueMachine.from_builtins(data["limits"], data["state"])
        self.__dict__.update(other.__dict__)

    def digest(self) -> str:
        """A hash of the logical state, equal on every node at the same applied index."""
        return snapshot.digest(self)
