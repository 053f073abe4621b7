"""The replicated queue state machine: every rule of docs/semantics.md, and nothing else.

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
| `config.py` | the configuration in force: configure, add_key, remove_key, change warnings |
| `audit.py` | the audit trail: record, page, its sweep step |
| `results.py` | job results: finished jobs kept with their results, their bound and expiry |
| `snapshot.py` | `to_builtins` / `from_builtins` and `digest` |
| `invariants.py` | `check_invariants()` |

Commands are tuples `(op, request_id, *fields)` of builtins (they cross Raft as pickles);
results are tuples `(kind, *fields)` of codes and values (node/core/ops.py), which the node
renders with `node.core.answers.render` when it sends the answer.

The configuration in force is state too (node/core/config.py): `limits` is the configuration
of the entry being applied, never the node's TOML (that only seeds version 1, and is the
bootstrap configuration `QueueMachine(limits)` applies entries under until the first
configuration command: journals of release 0.1.0 have none).

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
from itertools import islice

from . import audit, batches, config, gating, handlers, invariants, keys, ops, results, schedules, snapshot
from . import sweep as sweeping
from .answers import render_dead_letter, render_job
from .jobs import DEAD, ENTRY_JOB, IN_FLIGHT, READY, SCHEDULED, STATE_NAMES, WAITING, Job, Queue, entry_order, is_live_entry, shown_fields
from .ops import MALFORMED_RESULT, NOT_REMEMBERED, RESERVE, RequestRecord, ScopedRequestRecord
from .undo import UndoLog
from .limits import Limits

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
    ops.CONFIGURE: config.configure,
    ops.ADD_KEY: config.add_key,
    ops.REMOVE_KEY: config.remove_key,
    ops.MOVE_TO_DEAD_LETTERS: handlers.move_to_dead_letters,
    ops.PURGE: handlers.purge,
    ops.DELETE_QUEUE: handlers.delete_queue,
    ops.RECORD_ACTION: handlers.record_action,
    ops.RELEASE: handlers.release,
    ops.CLOSE_CIRCUIT: gating.close_circuit,
    ops.SCHEDULE_PUT: schedules.put_schedule,
    ops.SCHEDULE_DELETE: schedules.delete_schedule,
    ops.SCHEDULE_PAUSE: schedules.pause_schedule,
    ops.SCHEDULE_TRIGGER: schedules.trigger_schedule,
    ops.SCHEDULE_SEED: schedules.seed_schedules,
    ops.BATCH_OPEN: batches.open_batch,
    ops.BATCH_ADD: batches.add_to_batch,
    ops.BATCH_CLOSE: batches.close_batch,
    ops.BATCH_CANCEL: batches.cancel_batch,
}
for _op, _handler in HANDLERS.items():
    if tuple(inspect.signature(_handler).parameters)[1:] != ops.COMMANDS[_op]:
        raise RuntimeError(f"handler {_handler.__name__} does not take the fields of {_op!r} as ops.COMMANDS names them")
if tuple(HANDLERS) != ops.OPS:
    raise RuntimeError("every op of node/core/ops.py needs a handler here")


def _ready_key(entry: tuple) -> tuple:
    return entry_order(entry)               # (-priority, enqueued_at, seq): delivery order


def _is_live(job, seq: int, jobs: dict) -> bool:
    """An entry (job, seq) of a ready index still stands for its job: a job that left READY, was
    given a new entry (seq) or was replaced leaves its old entries behind (they are skipped, not
    removed)."""
    return job.state == READY and job.seq == seq and jobs.get(job.id) is job


def _live_entries(entries, jobs: dict):
    for e in entries:
        if is_live_entry(e, jobs):
            yield e


def _fifo_from(q, jobs: dict, after: tuple | None):
    """The FIFO's live entries after `after`, in order. The FIFO is kept
    ascending, but only a live entry's key is its job's (node/core/jobs.py Queue): the search
    goes by the key of the first live entry at or after each place, which grows along it."""
    fifo, seqs = q.ready_fifo, q.fifo_seqs
    start = 0
    if after is not None:
        def live_key(i):                    # None: no live entry from i on
            for k in range(i, len(fifo)):
                job, seq = fifo[k], seqs[k]
                if _is_live(job, seq, jobs):
                    return -job.priority, job.enqueued_at, seq
            return None
        lo, hi = 0, len(fifo)
        while lo < hi:
            mid = (lo + hi) // 2
            key = live_key(mid)
            if key is not None and key <= after:
                lo = mid + 1
            else:
                hi = mid
        start = lo
    for job, seq in zip(islice(fifo, start, None), islice(seqs, start, None)):
        # Live entries only: a stale one reads its job's key of now, which may sort after the
        # live entries behind it (a replace that lowered the priority), and the merge with
        # the heap takes its inputs as sorted.
        if _is_live(job, seq, jobs):
            yield -job.priority, job.enqueued_at, seq, job


def _heap_in_order(heap: list, after: tuple | None):
    """The heap's entries after `after` in ascending order, best first: only the entries up to
    the page's end (and their children) are visited, not the whole heap."""
    if not heap:
        return
    frontier = [(_ready_key(heap[0]), 0)]
    n = len(heap)
    while frontier:
        key, i = heapq.heappop(frontier)
        if after is None or key > after:
            yield heap[i]
        for c in (2 * i + 1, 2 * i + 2):    # a child sorts after its parent
            if c < n:
                heapq.heappush(frontier, (_ready_key(heap[c]), c))


class QueueMachine(UndoLog):
    def __init__(self, limits: Limits):
        # The configuration in force (node/core/config.py): `limits` starts as the bootstrap
        # configuration (version 0, the node's TOML) and is replaced by each configuration
        # command; `keys` holds the API keys in force from version 1 on (name -> config.KeyRecord).
        self.limits, self.retaining = limits, limits.retaining     # retaining: node/core/results.py
        self.config_version = 0
        self.keys: dict[str, config.KeyRecord] = {}
        self.audit: deque = deque()     # (seq, at_ms, who, action, target, details), oldest first
        self.audit_seq = 0
        self.clock = 0                  # replicated time: max of every command's now_ms
        self.seq = 0                    # order of jobs within a priority and millisecond
        self.ctr = 0                    # unique tie-break for lease entries and dead-letter order
        self.jobs: dict[str, Job] = {}
        self.queues: dict[str, Queue] = {}
        self.sched_heap: list = []      # (run_at, seq, job)
        self.lease_heap: list = []      # (lease_expires, ctr, job id): see handlers.lease
        self.deadline_heap: list = []   # (deadline, seq, job)
        # queue -> {idempotency key -> ((expires, queue), key, job_id)}, each record also an entry
        # of the expiry heap (node/core/jobs.py DEDUP_*); a queue's dict goes when it empties
        self.dedup: dict[str, dict[str, tuple]] = {}
        self.dedup_heap: list = []
        # (now, window, queue, (now + window, queue)): the bucket the dedup records of one batch
        # share. Not state (identity only saves memory; equal values hash and compare the same).
        self._bucket = (None, None, None, None)
        # The spec (node/core/jobs.py SPEC_FIELDS) of the job made last, which the next shares
        # when equal. Not state either.
        self._spec = None
        # request key -> ops.RequestRecord or ops.ScopedRequestRecord; the key is the request id,
        # or (caller's key name, request id) for a caller with a name (ops.request_key)
        self.rids: dict = {}
        # (expires, order stored, request key), a heap: a record's expiry is fixed when it is
        # stored, with the window in force then, so after a change to a shorter window a later
        # record can expire before an earlier one (insertion order is not expiry order). The
        # order stored (`applied` at the time, unique per record) breaks ties oldest first and
        # keeps keys of different types (str, tuple) from ever being compared.
        self.rid_heap: list = []
        # Whether anyone reads the answers of the commands being applied: a follower, or a
        # leader applying entries nobody on it waits for. Not replicated state: the node sets
        # it per entry (node/replication/replica.py). Results are rendered by the node that
        # sends them (node/core/answers.py), so nothing here depends on it.
        self.render = True
        self.dlq: OrderedDict[str, object] = OrderedDict()         # job id -> DeadLetter, oldest first
        self.dlq_by_queue: dict[str, OrderedDict] = {}
        self.applied = 0                # commands applied (for diagnostics, part of the state)
        # Gating (node/core/gating.py): jobs in flight per resource (n > 0 only), blocked ready
        # entries per (resource, queue), the blocked jobs' resources by id; `released` is soft
        # state for the node's long-poll wake (not replicated, not in snapshots or the digest).
        self.in_use: dict[str, int] = {}
        self.blocked: dict[str, dict[str, list]] = {}
        self.blocked_ids: dict[str, str] = {}
        self.released: set = set()
        # Schedules (node/core/schedules.py): name -> Schedule, and their next ticks as a heap
        # of (next_fire, stamp, name), lazy like the others (an entry whose stamp is not its
        # schedule's is stale).
        self.schedules: dict = {}
        self.tick_heap: list = []
        self.schedules_seeded = False   # the TOML's [[schedules]] were applied (schedules.seed_schedules)
        # Keys (node/core/keys.py): the timers of keys, a heap of (time, ctr, Key), lazy (an
        # entry is live while its key's `timer` is (time, ctr)).
        self.key_timers: list = []
        self._init_workflows()
        # The keys a command left without a job, settled when it ends (keys.settle_unsettled):
        # empty between commands, not state.
        self.unsettled: list = []
        self._undo: list = []

    def _init_workflows(self) -> None:
        # Job results (node/core/results.py: retained jobs by id, their expiry heap, and derived,
        # per queue, the records holding a result and their bytes), dependencies
        # (node/core/deps.py: pending ones per waiting job, dependents per dependency, the live
        # jobs reading each; `resolving` is a command's work list, not state) and batches
        # (node/core/batches.py: by id, the batch of each pending member, their timers).
        self.results, self.result_heap, self.results_by_queue, self.result_bytes = {}, [], {}, {}
        self.pending_deps, self.dependents, self.pins, self.resolving = {}, {}, {}, None
        self.batches, self.batch_of, self.batch_heap, self.batch_kept = {}, {}, [], {}

    def shared_bucket(self, now: int, window: int, queue: str) -> tuple:
        """The dedup bucket (now + window, queue), the same tuple object for every call with the
        same three (a batch's records share one, node/core/jobs.py DEDUP_BUCKET)."""
        cached = self._bucket
        if cached[0] == now and cached[1] == window and cached[2] == queue:
            return cached[3]
        bucket = (now + window, queue)
        self._bucket = (now, window, queue, bucket)
        return bucket

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
            if rid is not None:
                if type(rid) is str:            # a bare request id (0.1.0's form): no route, no hash
                    key = request_id = rid
                    route = body_hash = None
                else:                           # ops.request_id: (who, request id, route, body hash)
                    who, request_id, route, body_hash = rid
                    if type(request_id) is not str or type(route) is not str or type(body_hash) is not str \
                            or (who is not None and type(who) is not str):
                        raise TypeError("request id")
                    key = request_id if who is None else (who, request_id)
        except Exception:
            return MALFORMED_RESULT
        self.applied += 1
        if rid is not None:
            stored = self.rids.get(key)
            if stored is None and type(key) is tuple:
                # A record of a bare request id (kept from a journal or snapshot of an earlier
                # release, which knew no callers) still answers its retry.
                stored = self.rids.get(request_id)
                if stored is not None and type(stored) is not RequestRecord:
                    stored = None
            if stored is not None and stored.expires > self.clock:
                if route is not None and type(stored) is ScopedRequestRecord:
                    if stored.route != route:
                        return ops.request_mismatch(request_id, stored.route, "operation")
                    if stored.body_hash != body_hash:
                        return ops.request_mismatch(request_id, route, "body")
                if stored.op != op:
                    return ops.request_id_reused(request_id, stored.op)
                return stored.result
        self._undo.clear()
        try:
            result = handler(self, *cmd[2:])
            if self.unsettled:
                keys.settle_unsettled(self)
        except Exception as exc:
            self.unsettled = []
            self.resolving = None
            self._revert()
            self.applied -= 1                   # not applied: the state is exactly as before
            return ops.failed(op, type(exc).__name__)
        self._undo.clear()
        if rid is not None and not (op == RESERVE and not result[1]) and result[0] not in NOT_REMEMBERED:
            # An empty reserve is not remembered: a long poll re-proposes the same request id
            # until it gets jobs, and only that answer must be replayed.
            expires = self.clock + self.limits.request_id_window_ms
            self.rids[key] = (RequestRecord(op, result, expires) if route is None
                              else ScopedRequestRecord(op, result, expires, route, body_hash))
            heapq.heappush(self.rid_heap, (expires, self.applied, key))
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
            return gating.queue_view(self, name, None, Queue(name).stats(declared)) if declared else None
        return gating.queue_view(self, name, q, q.stats(declared))

    def gating_view(self, name: str, stats: dict) -> dict:
        """The gating fields for a queue's stats made outside the machine (node/service/)."""
        return gating.queue_view(self, name, self.queues.get(name), stats)

    def reservable(self, q) -> bool:
        """Whether a reserve could take a job of queue q now (paused, throttled, circuit, window)."""
        return gating.reservable(self, q)

    def key_page(self, name: str, limit: int, after) -> tuple[list, object] | None:
        """GET /v1/queues/{name}/keys: the queue's keys, most ready jobs first (node/core/keys.py
        `view`); None when the queue is unknown."""
        q = self.queues.get(name)
        if q is None and name not in self.limits.queues:
            return None
        return keys.view(self, q, limit, after)

    def batch_view(self, batch_id: str) -> dict | None:
        return batches.view(self, batch_id)

    def job_view(self, job_id: str) -> dict | None:
        job = self.jobs.get(job_id)
        if job is None:
            return results.view(self, job_id) if self.results else None
        out = render_job(*shown_fields(job))
        out["timeout_ms"] = job.timeout_ms          # always shown here (null: none)
        out["releases"] = job.releases
        out["state"] = STATE_NAMES[job.state]
        out["last_reason"] = job.last_reason
        if job.state == SCHEDULED:
            out["run_at_ms"] = job.run_at
        elif job.state == WAITING:
            out["waiting_on"] = sorted(self.pending_deps.get(job_id, ()))
        if job.state != IN_FLIGHT:
            out["lease_expires_at_ms"] = None
        return out

    def list_jobs(self, qname: str, state: int, limit: int, after: tuple | None):
        """Jobs of one queue in one state, in delivery order (ready), run time (scheduled) or
        lease expiry (in flight); `after` is the sort key of the last job of the previous page."""
        if state == READY:
            # Walked in order from `after` instead of sorted whole: a page of a deep backlog
            # costs O(page + position), not O(backlog), under the lock the apply thread waits on
            # (100k ready jobs: ~0.5 s per page sorted whole).
            q = self.queues.get(qname)
            if q is None:
                return [], None
            jobs, page = self.jobs, []
            # Every input yields live entries only (each checked once, where it is read).
            heaps = [q.ready_heap, *(h for per in self.blocked.values() for n, h in per.items() if n == qname)]
            if q.keys is not None:
                heaps += [k.heap for k in q.keys.by_key.values()]   # O(keys) heads: a page is not hot
            for e in heapq.merge(_fifo_from(q, jobs, after),
                                 *(_live_entries(_heap_in_order(h, after), jobs) for h in heaps), key=_ready_key):
                page.append(e)
                if len(page) > limit:
                    break
            more = len(page) > limit
            page = page[:limit]
            return [self.job_view(e[ENTRY_JOB].id) for e in page], (list(_ready_key(page[-1])) if more else None)
        else:
            key = (lambda j: (j.run_at, j.seq)) if state == SCHEDULED else (lambda j: (j.lease_expires, j.seq))
            cands = [(key(j), j) for j in self.jobs.values() if j.queue == qname and j.state == state]
        if after is not None:
            cands = [c for c in cands if c[0] > after]
        page = heapq.nsmallest(limit + 1, cands, key=lambda c: c[0])
        more = len(page) > limit
        page = page[:limit]
        return [self.job_view(j.id) for _, j in page], (list(page[-1][0]) if more else None)

    def list_dead_letters(self, qname, limit: int, after_id, cause: str | None = None,
                          scan_limit: int = 10_000):
        """Dead letters oldest first, of one queue or all, of one cause or all. With `cause`, at
        most `scan_limit` records are looked at per call (the lock is held meanwhile): a page may
        then hold fewer than `limit` records and still have a next cursor, the last id looked at."""
        source = self.dlq if qname is None else self.dlq_by_queue.get(qname, OrderedDict())
        it = iter(source)
        if after_id is not None:
            if after_id not in source:
                return [], None
            for job_id in it:
                if job_id == after_id:
                    break
        page = []
        scanned, last = 0, None
        for job_id in it:
            if len(page) > limit:
                break
            rec = source[job_id]
            if cause is not None:
                if scanned >= scan_limit:       # more may follow: go on from the last one seen
                    return self._render_dead(page), last
                scanned += 1
                last = job_id
                if rec.cause != cause:
                    continue
            page.append(rec)
        more = len(page) > limit
        page = page[:limit]
        return self._render_dead(page), (page[-1].job.id if more else None)

    @staticmethod
    def _render_dead(records) -> list[dict]:
        return [render_dead_letter(shown_fields(r.job), r.cause, r.failed_at, r.final_attempt, r.reason)
                for r in records]

    def job_outcome(self, job_id: str):
        """Where a job stands for GET /v1/jobs/{id}/result: ("live", None) while it may still
        run, ("succeeded", view) while retained, ("dead_lettered", view) while a dead letter,
        (None, None) when the machine knows nothing of it (never, or no longer)."""
        job = self.jobs.get(job_id)
        if job is not None:
            if job.state == DEAD:
                return "dead_lettered", self.job_view(job_id)
            return "live", None
        if job_id in self.results:
            return "succeeded", results.view(self, job_id)
        return None, None

    def counts(self) -> dict:
        # Retained jobs only when there are some (the view of a state without them is unchanged).
        retained = ({"retained_jobs": len(self.results), "retained_result_bytes": sum(self.result_bytes.values())}
                    if self.results else {})
        workflows = {**({"waiting_jobs": len(self.pending_deps)} if self.pending_deps else {}),
                     **({"batches": len(self.batches)} if self.batches else {})}
        return {"jobs": len(self.jobs), "dead_letters": len(self.dlq), "dedup_records": sum(map(len, self.dedup.values())),
                **retained, **workflows,
                "request_ids": len(self.rids), "audit_entries": len(self.audit), "schedules": len(self.schedules),
                "clock_ms": self.clock}

    def schedule_view(self, name: str) -> dict | None:
        s = self.schedules.get(name)
        return schedules.view(self, s) if s is not None else None

    def list_schedules(self, limit: int, after: str | None) -> tuple[list, str | None]:
        """Schedules by name, a page after the name `after`; and the next cursor (None at the end)."""
        names = sorted(n for n in self.schedules if after is None or n > after)
        page = names[:limit]
        return [schedules.view(self, self.schedules[n]) for n in page], (page[-1] if len(names) > limit else None)

    def config_view(self) -> dict:
        """GET /v1/config: the configuration in force."""
        doc = self.limits.doc
        return {"version": self.config_version, "fingerprint": self.limits.fingerprint(),
                "config": {"limits": dict(doc["limits"]), "storage": dict(doc["storage"]),
                           "queues": [dict(q) for q in doc["queues"]]}}

    def keys_view(self) -> list:
        return config.keys_view(self)

    def audit_page(self, limit: int, before: int | None):
        return audit.page(self, limit, before)

    def has_request(self, slot) -> bool:
        """Whether the request-id store holds a record for this command's request-id slot."""
        return ops.request_key(slot) in self.rids

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
    def from_builtins(cls, limits: Limits, data: dict, consume: bool = False) -> "QueueMachine":
        """The machine `data` describes; `consume`: the data is given up (snapshot.from_builtins)."""
        return snapshot.from_builtins(cls(limits), data, consume)

    def __getstate__(self):
        # Pickling goes through the builtins form (release 0.1.0's snapshots pickled the machine,
        # node/replication/replica.py reads those; tests copy machines this way). `limits` is the bootstrap:
        # from version 1 on the state's own configuration wins.
        return {"limits": self.limits, "state": self.to_builtins()}

    def __setstate__(self, data):
        other = QueueMachine.from_builtins(data["limits"], data["state"])
        self.__dict__.update(other.__dict__)

    def digest(self) -> str:
        """A hash of the logical state, equal on every node at the same applied index."""
        return snapshot.digest(self)
