"""What must hold between any two commands: `QueueMachine.check_invariants()`.

O(state): for tests (the model test after every step, fault injection after every revert, the
snapshot round trip), never on the apply path. Each problem is one line naming what is wrong;
`check` runs every check of `CHECKS`, in order, and returns their problems;
`QueueMachine.check_invariants` raises InvariantViolation with them.

On the lazy indexes: a ready job has exactly one live ready-index entry (reserve consumes it,
every move back to ready pushes a new one). An in-flight job has at least one live lease entry
and a scheduled job at least one live schedule entry, not exactly one: an extend to the very
expiry the lease already has adds a second entry with the same time, and a timer of a job that
left in-flight (or scheduled) comes back to life when the job gets the same time again (see
`to_builtins`); whichever fires first moves the job, after which the others are stale.
"""
from __future__ import annotations

from collections import Counter

from .audit import AUDIT_AT, AUDIT_SEQ
from .limits import Limits
from .config import key_problem
from .jobs import (DEAD, DEDUP_BUCKET, DEDUP_KEY, IN_FLIGHT, READY, SCHEDULED, SPEC_FIELDS, STATE_NAMES, WAITING,
                   ENTRY_JOB, ENTRY_SEQ, TIMER_SEQ, dedup_expires, dedup_queue, entry_order, is_live_entry)
from .ops import ENQUEUED_BATCH, ScopedRequestRecord, compact_batch
from .keys import check as key_problems
from .schedules import check as schedule_problems
from .results import check as results_problems
from .deps import check as deps_problems
from .batches import check as batch_problems


class InvariantViolation(AssertionError):
    pass


class Seen:
    """What the checks count on the way, for the checks after them: the jobs per queue and
    state, the live ready-index entries per job id (blocked and key heaps included), the ready
    jobs per (resource, queue) that can take a free slot, the held-back jobs per (resource,
    queue)."""
    __slots__ = ("counted", "live_ready", "ready_of", "held_back")

    def __init__(self):
        self.counted: dict[str, Counter] = {}
        self.live_ready: Counter = Counter()
        self.ready_of: Counter = Counter()
        self.held_back: Counter = Counter()


def check(m) -> list[str]:
    """Every problem of every check, in the order of CHECKS."""
    seen = Seen()
    bad: list[str] = []
    for invariant in CHECKS:
        bad.extend(invariant(m, seen))
    return bad


def _heap_broken_at(heap: list, width: int):
    """The first index whose entry sorts before its parent's (on the first `width` fields), or None."""
    for i in range(1, len(heap)):
        if heap[(i - 1) // 2][:width] > heap[i][:width]:
            return i
    return None


# ---------------------------------------------------------------------------- time
def clock_moves_forward(m, seen: Seen) -> list[str]:
    """The replicated clock never goes back, and no command leaves its undo log behind
    (docs/semantics.md "Time"; apply never raises: docs/cluster.md "Design")."""
    bad = []
    last = getattr(m, "_checked_clock", None)
    if last is not None and m.clock < last:
        bad.append(f"clock went back: {m.clock} after {last}")
    if m._undo:
        bad.append(f"undo log not empty between commands ({len(m._undo) // 4} entries)")
    return bad


# ---------------------------------------------------------------------------- jobs and counts
def jobs_are_well_formed(m, seen: Seen) -> list[str]:
    """Each job is stored under its id in one state of the machine, of a queue that exists, no
    later than the clock; its attempts, releases and timeout within their bounds; a scheduled
    job has a run time and an in-flight one no deadline (docs/semantics.md "States"). Counts
    the jobs per queue and state into `seen.counted`."""
    bad = []
    say = bad.append
    clock = m.clock
    for job_id, job in m.jobs.items():
        if job.id != job_id:
            say(f"job {job_id} stored under another id ({job.id})")
        if type(job.spec) is not tuple or len(job.spec) != len(SPEC_FIELDS):
            say(f"job {job_id} has spec {job.spec!r}, not a tuple of {SPEC_FIELDS}")
            continue
        if job.state not in (READY, SCHEDULED, IN_FLIGHT, DEAD, WAITING):
            say(f"job {job_id} in the machine in state {STATE_NAMES[job.state] if 0 <= job.state < 6 else job.state}")
        if job.queue not in m.queues:
            say(f"job {job_id} of queue {job.queue!r}, which does not exist")
        seen.counted.setdefault(job.queue, Counter())[job.state] += 1
        if job.enqueued_at > clock:
            say(f"job {job_id} enqueued at {job.enqueued_at}, after the clock {clock}")
        if job.seq > m.seq:
            say(f"job {job_id} has sequence {job.seq} > the machine's {m.seq}")
        releases = job.releases
        if type(releases) is not int or not 0 <= releases < job.attempt:
            say(f"job {job_id} has {releases!r} releases at attempt {job.attempt}")
        elif not 1 <= job.attempt - releases <= max(job.max_attempts, 1):
            say(f"job {job_id} at attempt {job.attempt} ({releases} released) of {job.max_attempts}")
        if job.timeout_ms is not None and (type(job.timeout_ms) is not int or job.timeout_ms < 1):
            say(f"job {job_id} with execution timeout {job.timeout_ms!r}")
        if job.state == SCHEDULED and job.run_at is None:
            say(f"scheduled job {job_id} without a run time")
        if job.state == IN_FLIGHT and job.deadline is not None:
            say(f"in-flight job {job_id} keeps its deadline (the first delivery clears it)")
    return bad


def queue_counts_match_jobs(m, seen: Seen) -> list[str]:
    """Each queue counts exactly the jobs it holds in each state, its totals are never
    negative, and its dead letters by cause are those of the store (docs/semantics.md
    "States", "Dead letters")."""
    bad = []
    say = bad.append
    for name, q in m.queues.items():
        if q.name != name:
            say(f"queue {name!r} stored under another name ({q.name!r})")
        c = seen.counted.get(name, Counter())
        for state, attr in ((READY, "ready"), (SCHEDULED, "scheduled"), (IN_FLIGHT, "in_flight"), (DEAD, "dead"),
                            (WAITING, "waiting")):
            if getattr(q, attr) != c[state]:
                say(f"queue {name!r} counts {getattr(q, attr)} {attr}, holds {c[state]}")
        for attr in ("enqueued", "acked", "nacked", "dead_total", "expired"):
            if getattr(q, attr) < 0:
                say(f"queue {name!r} total {attr} is negative")
        if q.expired > q.dead_total:
            say(f"queue {name!r} counts {q.expired} expired of {q.dead_total} dead-lettered")
        by_cause = Counter(rec.cause for rec in m.dlq_by_queue.get(name, {}).values())
        if {c: n for c, n in q.dead_by_cause.items()} != dict(by_cause):
            say(f"queue {name!r} counts dead letters by cause {dict(q.dead_by_cause)}, holds {dict(by_cause)}")
    return bad


# ---------------------------------------------------------------------------- the ready index
def ready_index_in_order(m, seen: Seen) -> list[str]:
    """Each queue's ready FIFO ascends along its live entries, after its tail, and its heap
    keeps the heap property; a live entry is of its queue's job and keyed by the job's
    priority and enqueue time, so reserve hands out the best job first (docs/semantics.md
    "Reserve"). Counts the live entries into `seen.live_ready` and `seen.ready_of`."""
    bad = []
    say = bad.append
    jobs = m.jobs
    for name, q in m.queues.items():
        if len(q.ready_fifo) != len(q.fifo_seqs):
            say(f"queue {name!r}: the ready FIFO holds {len(q.ready_fifo)} jobs and {len(q.fifo_seqs)} seqs")
        fifo = list(q.fifo_entries())
        # Along the FIFO the keys of its live entries grow (a stale entry's priority and enqueue
        # time are its job's now, not its entry's).
        live = [e for e in fifo if is_live_entry(e, jobs)]
        for a, b in zip(live, live[1:]):
            if not entry_order(a) < entry_order(b):
                say(f"queue {name!r}: ready FIFO out of order at {entry_order(a)} then {entry_order(b)}")
        if live and (q.fifo_tail is None or tuple(q.fifo_tail) < live[-1][:ENTRY_SEQ]):
            say(f"queue {name!r}: the ready FIFO's tail {q.fifo_tail} sorts before its last live entry "
                f"{entry_order(live[-1])}")
        heap = q.ready_heap
        for i in range(1, len(heap)):
            if entry_order(heap[(i - 1) // 2]) > entry_order(heap[i]):
                say(f"queue {name!r}: ready heap property broken at {i}")
        for e in fifo + heap:
            if is_live_entry(e, jobs):
                job = e[ENTRY_JOB]
                seen.live_ready[job.id] += 1
                seen.ready_of[(job.resource, name)] += 1
                if job.queue != name:
                    say(f"ready entry of job {job.id} (queue {job.queue!r}) in queue {name!r}")
                if e[:ENTRY_SEQ] != (-job.priority, job.enqueued_at):
                    say(f"ready entry of job {job.id} keyed {entry_order(e)}, not by its priority and enqueue time")
    return bad


def blocked_jobs_are_counted(m, seen: Seen) -> list[str]:
    """A job held back on a full resource sits in exactly one blocked heap, of its queue and
    resource, named in `blocked_ids`, counted as throttled by its queue (docs/api.md "Gating:
    throttles, circuit breakers, execution windows"). Counts the live blocked entries into
    `seen.live_ready` and `seen.held_back`."""
    bad = []
    say = bad.append
    jobs = m.jobs
    live_blocked: Counter = Counter()
    throttled: Counter = Counter()
    for r, per in m.blocked.items():
        if not isinstance(per, dict):
            say(f"blocked entries of resource {r!r} are not per queue")
            continue
        for qname, heap in per.items():
            i = _heap_broken_at(heap, 3)
            if i is not None:
                say(f"blocked heap ({r!r}, {qname!r}) property broken at {i}")
            for e in heap:
                job = e[ENTRY_JOB]
                if is_live_entry(e, jobs) and m.blocked_ids.get(job.id) == r:
                    seen.live_ready[job.id] += 1
                    live_blocked[job.id] += 1
                    throttled[qname] += 1
                    seen.held_back[(r, qname)] += 1
                    if job.queue != qname:
                        say(f"blocked entry of job {job.id} (queue {job.queue!r}) under queue {qname!r}")
                    if job.resource != r:
                        say(f"blocked entry of job {job.id} (resource {job.resource!r}) under resource {r!r}")
    for job_id, r in m.blocked_ids.items():
        if live_blocked[job_id] != 1:
            say(f"job {job_id} is named blocked on {r!r} with {live_blocked[job_id]} live blocked entries")
    for name, q in m.queues.items():
        if q.throttled != throttled[name]:
            say(f"queue {name!r} counts {q.throttled} throttled, holds {throttled[name]} blocked jobs")
        if q.deferred < q.throttled:
            say(f"queue {name!r}: {q.deferred} deferrals in total, fewer than the {q.throttled} held now")
    return bad


def circuits_are_consistent(m, seen: Seen) -> list[str]:
    """A circuit has a probe only while half open, and an open time with its end (docs/api.md
    "Gating: throttles, circuit breakers, execution windows")."""
    bad = []
    for name, q in m.queues.items():
        c = q.circuit
        if c is None:
            continue
        if c.probe is not None and (c.open_until is None or c.open_until > m.clock):
            bad.append(f"queue {name!r}: a probe {c.probe} while the circuit is not half open")
        if (c.opened_at is None) != (c.open_until is None):
            bad.append(f"queue {name!r}: circuit opened_at {c.opened_at} but open_until {c.open_until}")
    return bad


def keys_are_consistent(m, seen: Seen) -> list[str]:
    """The keyed index of each queue (docs/semantics.md "Keys"): node/core/keys.py `check`,
    which counts the keys' live entries into `seen.live_ready` and `seen.ready_of`."""
    return key_problems(m, seen.live_ready, seen.ready_of)


def ready_jobs_have_one_entry(m, seen: Seen) -> list[str]:
    """A ready job has exactly one live entry, in its queue's ready index, its key's heap or a
    blocked heap (docs/semantics.md "Reserve")."""
    return [f"ready job {job_id} has {seen.live_ready[job_id]} live ready-index entries (blocked ones included)"
            for job_id, job in m.jobs.items() if job.state == READY and seen.live_ready[job_id] != 1]


def held_back_jobs_can_move(m, seen: Seen) -> list[str]:
    """No queue waits on a slot that nobody holds (docs/api.md "Gating: throttles, circuit
    breakers, execution windows"): a job is held back only while its resource is full, and every
    slot that frees hands a held-back job of each queue back to the ready index
    (`gating.release_blocked`), where it stays until it is reserved or passes the claim on
    (`gating.leave_ready`). So while resource r has `free` slots, each queue holding jobs of r
    back has at least `free` jobs of r in its ready index."""
    out = []
    for (r, qname), n in seen.held_back.items():
        limit = m.limits.resource_limits.get(r)
        if limit is None:
            out.append(f"{n} jobs of queue {qname!r} held back on {r!r}, which has no limit")
            continue
        free = limit - m.in_use.get(r, 0)
        if free <= 0:
            continue
        waiting = seen.ready_of[(r, qname)]
        if waiting < free:
            out.append(f"queue {qname!r} holds {n} jobs back on {r!r} with {free} slots free and "
                       f"{waiting} of its jobs ready to take them: nothing would hand them out")
    return out


def probes_are_running(m, seen: Seen) -> list[str]:
    """A half-open circuit's probe is a job of its queue in flight (every way out of flight
    clears or settles it: `gating.gate_leave`); its failures are times in order, none ahead."""
    out = []
    for name, q in m.queues.items():
        c = q.circuit
        if c is None:
            continue
        job = None if c.probe is None else m.jobs.get(c.probe)
        if c.probe is not None and (job is None or job.state != IN_FLIGHT or job.queue != name):
            out.append(f"queue {name!r}: the circuit's probe {c.probe} is not a running job of the queue")
        if any(t > m.clock for t in c.failures) or list(c.failures) != sorted(c.failures):
            out.append(f"queue {name!r}: the circuit's failures {c.failures} are not in order up to the clock")
    return out


def resources_within_limits(m, seen: Seen) -> list[str]:
    """The machine counts the jobs in flight per resource, and a count above the limit in force
    only falls (the limit was lowered under jobs already in flight); checked against the
    previous check of this machine (a machine checked for the first time, say just restored,
    has none; nor has one whose configuration changed since: a limit raised and lowered again
    between two checks leaves more in flight than before, lawfully). docs/api.md "Gating: throttles, circuit breakers, execution windows"."""
    bad = []
    in_use: Counter = Counter(j.resource for j in m.jobs.values() if j.state == IN_FLIGHT and j.resource is not None)
    if dict(in_use) != m.in_use:
        bad.append(f"in flight per resource {dict(in_use)}, the machine counts {m.in_use}")
    last_in_use = getattr(m, "_checked_in_use", None)
    if getattr(m, "_checked_limits", None) is not m.limits:
        last_in_use = None
    for r, n in in_use.items():
        limit = m.limits.resource_limits.get(r)
        if last_in_use is not None and limit is not None and n > limit and n > last_in_use.get(r, 0):
            bad.append(f"resource {r!r}: {n} in flight, above its limit {limit} and more than before "
                       f"({last_in_use.get(r, 0)})")
    m._checked_in_use, m._checked_limits = dict(in_use), m.limits
    return bad


# ---------------------------------------------------------------------------- timers
def timers_are_live(m, seen: Seen) -> list[str]:
    """A scheduled job has a live schedule entry, an in-flight job a live lease entry and a lease
    expiry, a waiting job with a deadline a live deadline entry (docs/semantics.md "Lease
    expiry: the sweep", "Deadlines"); lease tie-breaks come from the machine's counter."""
    bad = []
    say = bad.append
    jobs = m.jobs
    live_sched = Counter(job.id for run_at, _, job in m.sched_heap
                         if job.state == SCHEDULED and job.run_at == run_at and jobs.get(job.id) is job)
    live_lease = Counter(job_id for expires, _, job_id in m.lease_heap
                         if job_id in jobs and jobs[job_id].state == IN_FLIGHT and jobs[job_id].lease_expires == expires)
    live_deadline = Counter(job.id for deadline, _, job in m.deadline_heap
                            if job.deadline == deadline and jobs.get(job.id) is job)
    for e in m.lease_heap:
        if e[TIMER_SEQ] > m.ctr:
            say(f"lease entry {e} has a tie-break beyond the machine's counter {m.ctr}")
    for job_id, job in jobs.items():
        if job.state == SCHEDULED and not live_sched[job_id]:
            say(f"scheduled job {job_id} has no live schedule entry")
        if job.state == IN_FLIGHT:
            if not live_lease[job_id]:
                say(f"in-flight job {job_id} has no live lease entry")
            if job.lease_expires is None:
                say(f"in-flight job {job_id} without a lease expiry")
        if job.state in (READY, SCHEDULED, WAITING) and job.deadline is not None and not live_deadline[job_id]:
            say(f"{STATE_NAMES[job.state]} job {job_id} with a deadline has no live deadline entry")
    return bad


def timer_heaps_in_order(m, seen: Seen) -> list[str]:
    """The schedule, lease, deadline and dedup heaps keep the heap property, so the sweep meets
    the earliest first (docs/semantics.md "Lease expiry: the sweep")."""
    bad = []
    for h, what in ((m.sched_heap, "schedule"), (m.lease_heap, "lease"), (m.deadline_heap, "deadline"),
                    (m.dedup_heap, "dedup")):
        i = _heap_broken_at(h, 2)
        if i is not None:
            bad.append(f"{what} heap property broken at {i}")
    return bad


# ---------------------------------------------------------------------------- dedup and request ids
def dedup_records_are_indexed(m, seen: Seen) -> list[str]:
    """Each dedup record is ((expires, queue), key, job id), under its queue and key, and is its
    own entry of the expiry heap (docs/semantics.md "Enqueue", idempotency)."""
    bad = []
    dedup_entries = set(map(id, m.dedup_heap))
    for qname, keyed in m.dedup.items():
        if not keyed:
            bad.append(f"queue {qname!r} keeps an empty dict of dedup records")
        for key, rec in keyed.items():
            if (type(rec) is not tuple or len(rec) != 3 or type(rec[DEDUP_BUCKET]) is not tuple
                    or len(rec[DEDUP_BUCKET]) != 2 or dedup_queue(rec) != qname or rec[DEDUP_KEY] != key):
                bad.append(f"dedup record ({qname!r}, {key!r}) is {rec!r}, not ((expires, queue), key, job id)")
            elif id(rec) not in dedup_entries:
                bad.append(f"dedup record ({qname!r}, {key!r}) has no heap entry for its expiry {dedup_expires(rec)}")
    return bad


def request_ids_are_kept(m, seen: Seen) -> list[str]:
    """Each request-id record keeps a result under its key with an expiry entry; a scoped record
    (and only it, under a (caller, id) key) its route and body hash; the expiry heap keeps the
    heap property with unique orders (docs/semantics.md "Request ids")."""
    bad = []
    say = bad.append
    rid_entries = {(expires, key) for expires, _, key in m.rid_heap}
    for rid, rec in m.rids.items():
        if len(rec) not in (3, 5):
            say(f"request id {rid!r} keeps {len(rec)} fields")
            continue
        op, result, expires = rec[:3]
        if (expires, rid) not in rid_entries:
            say(f"request id {rid!r} has no expiry entry for {expires}")
        if type(result) is not tuple or not result or type(result[0]) is not str:
            say(f"request id {rid!r} keeps {result!r}, not a result")
        elif result[0] == ENQUEUED_BATCH and compact_batch(result[1]) != result[1]:
            # A restored node must hold what a node that lived through the history holds.
            say(f"request id {rid!r} keeps a job its batch made as a tuple, not as its bare id")
        if type(rid) not in (str, tuple):
            say(f"request key {rid!r} is neither a request id nor (caller, request id)")
        scoped = len(rec) == len(ScopedRequestRecord._fields)
        if scoped:
            _, _, _, route, body_hash = rec
            if type(route) is not str or type(body_hash) is not str:
                say(f"request id {rid!r}: a scoped record without its route and body hash")
        # (caller, id) keys only come from scoped requests; a bare id may be either (a caller
        # without a name, or a record of an earlier release)
        if type(rid) is tuple and (len(rid) != 2 or not scoped):
            say(f"request key {rid!r}: (caller, id) keys are scoped records")
    i = _heap_broken_at(m.rid_heap, 2)
    if i is not None:
        say(f"request-id expiry heap property broken at {i}")
    if len({order for _, order, _ in m.rid_heap}) != len(m.rid_heap):
        say("two request-id expiry entries share an order")
    return bad


# ---------------------------------------------------------------------------- dead letters
def dead_letters_are_indexed(m, seen: Seen) -> list[str]:
    """The dead-letter store holds exactly the dead jobs, and its per-queue indexes the same
    records, in store order, each under its job's queue (docs/semantics.md "Dead letters").
    Records can outlive a change that turned retention off: they stay until drained."""
    bad = []
    say = bad.append
    dead_jobs = {job_id for job_id, job in m.jobs.items() if job.state == DEAD}
    if set(m.dlq) != dead_jobs:
        say(f"dead-letter store holds {len(m.dlq)} records, the machine {len(dead_jobs)} dead jobs")
    per_queue_total = 0
    for name, od in m.dlq_by_queue.items():
        per_queue_total += len(od)
        orders = [rec.order for rec in od.values()]
        if orders != sorted(orders):
            say(f"dead letters of queue {name!r} out of order")
        for job_id, rec in od.items():
            if m.dlq.get(job_id) is not rec:
                say(f"dead letter {job_id} of queue {name!r} is not in the store")
            if rec.job.queue != name:
                say(f"dead letter {job_id} of queue {rec.job.queue!r} indexed under {name!r}")
    bad.extend(_dead_letter_store_in_order(m))
    if per_queue_total != len(m.dlq):
        say(f"per-queue dead-letter indexes hold {per_queue_total} records, the store {len(m.dlq)}")
    for name in m.dlq_by_queue:
        if name not in m.queues:
            say(f"dead-letter index of queue {name!r}, which does not exist")
    return bad


def _dead_letter_store_in_order(m) -> list[str]:
    """Each record of the store holds the machine's job, is in its queue's index, and follows
    the one before in order and failure time, up to the machine's counter and clock."""
    bad = []
    say = bad.append
    previous = None
    for job_id, rec in m.dlq.items():
        if rec.job.id != job_id or m.jobs.get(job_id) is not rec.job:
            say(f"dead letter {job_id} does not hold the machine's job")
        if m.dlq_by_queue.get(rec.job.queue, {}).get(job_id) is not rec:
            say(f"dead letter {job_id} is missing from the index of queue {rec.job.queue!r}")
        if rec.order > m.ctr:
            say(f"dead letter {job_id} ordered {rec.order}, beyond the machine's counter {m.ctr}")
        if rec.failed_at > m.clock:
            say(f"dead letter {job_id} failed at {rec.failed_at}, after the clock {m.clock}")
        if previous is not None and (rec.order <= previous.order or rec.failed_at < previous.failed_at):
            say(f"dead letters out of order at {job_id}")
        previous = rec
    return bad


# ---------------------------------------------------------------------------- configuration, audit, schedules
def configuration_is_valid(m, seen: Seen) -> list[str]:
    """The configuration in force is the one its document builds, with API keys only from
    version 1 on, each a valid record, no two of one digest (docs/semantics.md "Configuration
    is replicated state")."""
    bad = []
    say = bad.append
    if type(m.config_version) is not int or m.config_version < 0:
        say(f"configuration version {m.config_version!r}")
    if m.config_version == 0 and m.keys:
        say("API keys in force before the first configuration")
    if m.config_version and (m.limits.doc is None or Limits.from_doc(m.limits.doc).doc != m.limits.doc):
        say("the configuration in force is not the one its document builds")
    digests = [rec.key_sha256 for rec in m.keys.values()]
    if len(set(digests)) != len(digests):
        say("two API keys share a digest")
    for name, rec in m.keys.items():
        why = key_problem(name, rec.role, rec.key_sha256)
        if why:
            say(f"API key {name!r}: {why}")
    return bad


def audit_trail_in_order(m, seen: Seen) -> list[str]:
    """The audit trail is in sequence and time order, within its cap, up to the machine's
    sequence and clock (docs/semantics.md "Operator moves and the audit trail")."""
    bad = []
    trail = list(m.audit)
    if len(trail) > m.limits.audit_max_entries:
        bad.append(f"audit trail holds {len(trail)} entries, above audit_max_entries ({m.limits.audit_max_entries})")
    for a, b in zip(trail, trail[1:]):
        if not (a[AUDIT_SEQ] < b[AUDIT_SEQ] and a[AUDIT_AT] <= b[AUDIT_AT]):
            bad.append(f"audit trail out of order at {a[:2]} then {b[:2]}")
            break
    if trail and (trail[-1][AUDIT_SEQ] > m.audit_seq or trail[-1][AUDIT_AT] > m.clock):
        bad.append(f"audit entry {trail[-1][:2]} beyond the machine's sequence {m.audit_seq} or clock {m.clock}")
    return bad


def schedules_are_consistent(m, seen: Seen) -> list[str]:
    """The schedules and their tick heap (docs/semantics.md "Schedules"): node/core/schedules.py
    `check`."""
    return schedule_problems(m)


def retained_results_are_consistent(m, seen: Seen) -> list[str]:
    """Retained finished jobs (node/core/results.py): no retained job is live, each has its
    expiry timer, the bytes per queue are the sum of its results and never over its bound, the
    order to drop them in is theirs."""
    return results_problems(m)


def dependencies_are_consistent(m, seen: Seen) -> list[str]:
    """Jobs waiting on dependencies (node/core/deps.py): each waits on live jobs only, and the
    dependents index holds the same pairs."""
    return deps_problems(m)


def batches_are_consistent(m, seen: Seen) -> list[str]:
    """Batches (node/core/batches.py): pending members are live jobs of their batch, each callback
    fired iff its condition holds, timers live."""
    return batch_problems(m)


# Every check, in the order `check` runs them: a check that reads what `Seen` counts runs after
# the checks that count it.
CHECKS = (
    clock_moves_forward,
    jobs_are_well_formed,
    queue_counts_match_jobs,
    ready_index_in_order,
    blocked_jobs_are_counted,
    circuits_are_consistent,
    keys_are_consistent,
    ready_jobs_have_one_entry,
    held_back_jobs_can_move,
    probes_are_running,
    resources_within_limits,
    timers_are_live,
    timer_heaps_in_order,
    dedup_records_are_indexed,
    request_ids_are_kept,
    dead_letters_are_indexed,
    configuration_is_valid,
    audit_trail_in_order,
    schedules_are_consistent,
    retained_results_are_consistent,
    dependencies_are_consistent,
    batches_are_consistent,
)
