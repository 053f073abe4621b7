"""Jobs, queues and dead-letter records: the state the machine is made of.

A job is in exactly one state (docs/semantics.md "States"); GONE marks an object that has left the
machine (acked, cancelled, drained, dropped), so that stale index entries that still point at
it are recognised as stale.
"""
from __future__ import annotations

from collections import deque

READY, SCHEDULED, IN_FLIGHT, DEAD, GONE, WAITING = 0, 1, 2, 3, 4, 5
# WAITING: a job whose dependencies have not all ended (node/core/deps.py; docs/semantics.md
# "Workflows").
STATE_NAMES = ("ready", "scheduled", "in_flight", "dead_lettered", "gone", "waiting")
# Why a job was dead-lettered (a DeadLetter's `cause`), as docs/semantics.md "Dead letters" names them.
DEAD_LETTER_CAUSES = ("attempts_exhausted", "rejected", "lease_expired", "admin", "expired", "dependency_failed")
DEPENDENCY_FAILED = "dependency_failed"     # a dependency failed (node/core/deps.py)
ALWAYS_SHOWN_CAUSES = DEAD_LETTER_CAUSES[:5]    # a queue's stats show these even at 0
# The causes the cluster decides (no worker reported them): what a queue's dead_letter_forward
# forwards unless dead_letter_forward_causes says otherwise.
CLUSTER_CAUSES = ("lease_expired", "expired", "admin")
# The job type of a dead-letter record job (a forward, node/core/handlers.py `forward`).
DEAD_LETTER_RECORD_TYPE = "raftq.dead_letter"


# What a job was enqueued with and rarely changes: one tuple, shared by every job of a batch
# that was enqueued alike (one queue, type, priority, millisecond, options), so a queued job
# holds 6 slots instead of 21 (120 bytes a job less, docs/performance.md). A change to one of
# these fields gives the job a copy of its own (`Job`'s properties): `attempt` and `run_at`
# change only when a job is retried, released, redelivered or replaced, never on the way of a
# job that is reserved and acked once.
SPEC_FIELDS = ("queue", "job_type", "encoding", "priority", "custom", "trace", "enqueued_at",
               "scheduled_at", "max_attempts", "deadline", "timeout_ms", "resource", "last_reason",
               "releases", "attempt", "run_at", "key", "depends_on")
(S_QUEUE, S_JOB_TYPE, S_ENCODING, S_PRIORITY, S_CUSTOM, S_TRACE, S_ENQUEUED_AT, S_SCHEDULED_AT,
 S_MAX_ATTEMPTS, S_DEADLINE, S_TIMEOUT_MS, S_RESOURCE, S_LAST_REASON, S_RELEASES, S_ATTEMPT,
 S_RUN_AT, S_KEY, S_DEPENDS_ON) = range(18)


def _spec_property(k: int, name: str) -> property:
    def get(job):
        return job.spec[k]

    def put(job, value):
        spec = job.spec
        if spec[k] is not value:        # copy on write: the old tuple may be shared
            job.spec = spec[:k] + (value,) + spec[k + 1:]
    return property(get, put, doc=f"{name}: the job's spec[{k}] (SPEC_FIELDS)")


class Job:
    """One job. `run_at` is when a scheduled job becomes ready; `scheduled_at` is what the
    producer asked for (shown to workers); `deadline` is cleared by the first delivery; `seq`
    is the per-machine sequence that breaks ties in the ready order (and names the job's live
    ready-index entry). The fields of SPEC_FIELDS live in the (shared) tuple `spec` and read and
    write as attributes; the hot paths index `spec` with the S_* constants instead.

    `timeout_ms` is the job's execution timeout (ms, None = none: the queue's
    execution_timeout_ms resolved at enqueue), `releases` the deliveries handed back without
    using an attempt (attempts used = attempt - releases), `resource` the throttle resource the
    job names (None = none), `key` its fairness and limits key (node/core/keys.py, None =
    none) and `depends_on` the ((job id, policy), ...) it was enqueued with (node/core/deps.py,
    None = none), kept for its life: what it shows and which results it reads."""
    __slots__ = ("id", "payload", "lease_expires", "state", "seq", "spec")

    # Every field, in the order of the snapshot's job tuples and the digest.
    FIELDS = ("id", "queue", "job_type", "payload", "encoding", "priority", "custom", "trace",
              "enqueued_at", "scheduled_at", "attempt", "max_attempts", "lease_expires",
              "state", "seq", "run_at", "deadline", "last_reason", "timeout_ms", "releases", "resource", "key", "depends_on")

    for _k, _name in enumerate(SPEC_FIELDS):
        locals()[_name] = _spec_property(_k, _name)
    del _k, _name

    def to_tuple(self) -> tuple:
        """FIELDS, or the 22 of before dependencies for a job without them (what snapshots
        held before: a node of the release before reads them)."""
        s = self.spec
        t = (self.id, s[0], s[1], self.payload, s[2], s[3], s[4], s[5], s[6], s[7],
             s[14], s[8], self.lease_expires, self.state, self.seq, s[15],
             s[9], s[12], s[10], s[13], s[11], s[16])
        return t if s[17] is None else t + (s[17],)

    @classmethod
    def from_tuple(cls, t, specs: dict | None = None) -> "Job":
        """A job from its FIELDS tuple (or the 18 of before 0.2.0, the 21 of before keys or the
        22 of before dependencies, the later ones taking their defaults). `specs`, when given, interns the spec tuples:
        equal ones are shared."""
        if len(t) < 23:
            t = tuple(t) + (None, 0, None, None, None)[len(t) - 18:]
        (id_, queue, job_type, payload, encoding, priority, custom, trace, enqueued_at,
         scheduled_at, attempt, max_attempts, lease_expires, state, seq, run_at, deadline,
         last_reason, timeout_ms, releases, resource, key, depends_on) = t
        if type(depends_on) is list:    # pairs, as the machine made them (JSON made them lists)
            depends_on = tuple(tuple(p) for p in depends_on)
        spec = (queue, job_type, encoding, priority, custom, trace, enqueued_at, scheduled_at,
                max_attempts, deadline, timeout_ms, resource, last_reason, releases, attempt, run_at, key,
                depends_on)
        if specs is not None and custom is None:       # a dict neither hashes nor compares strictly
            try:
                spec = specs.setdefault(spec, spec)
            except TypeError:           # an unhashable field (a list where a tuple belongs): unshared
                pass
        job = cls.__new__(cls)
        job.id, job.payload, job.lease_expires = id_, payload, lease_expires
        job.state, job.seq, job.spec = state, seq, spec
        return job

    def legacy_tuple(self) -> tuple:
        """The fields the digest hashes: the 18 of before 0.2.0 while the later slots hold
        their defaults (so a state that uses none of it hashes as it did), the 21 of before keys
        while the key is None, the 22 of before dependencies while it has none, else all of them."""
        t = self.to_tuple()
        if len(t) > 22:
            return t
        if t[21] is not None:
            return t
        return t[:18] if t[18] is None and t[19] == 0 and t[20] is None else t[:21]


# The fields the Job shape of docs/api.md "Shapes" shows, in `answers.render_job`'s order. A reserve's or a
# drain's result carries these (a tuple of atomic values, which the cyclic GC does not track,
# sharing the job's own strings and payload bytes) instead of rendered jobs.
SHOWN_FIELDS = ("id", "queue", "job_type", "payload", "encoding", "priority", "custom", "trace",
                "enqueued_at", "scheduled_at", "attempt", "max_attempts", "lease_expires", "deadline",
                "timeout_ms", "releases")


def shown_common(job) -> tuple:
    """Every job's SHOWN_FIELDS (the resource is added when set)."""
    s = job.spec
    return (job.id, s[0], s[1], job.payload, s[2], s[3], s[4], s[5], s[6], s[7], s[14],
            s[8], job.lease_expires, s[9], s[10], s[13])


def _check_field_orders():
    """to_tuple, from_tuple and shown_common index `spec` by hand: check them against FIELDS,
    SHOWN_FIELDS and the properties once, at import."""
    t = tuple(f"v{i}" for i in range(len(Job.FIELDS)))
    job = Job.from_tuple(t)
    if (job.to_tuple() != t or tuple(getattr(job, f) for f in Job.FIELDS) != t
            or shown_common(job) != tuple(getattr(job, f) for f in SHOWN_FIELDS)):
        raise RuntimeError("Job.to_tuple/from_tuple/shown_common disagree with FIELDS, SHOWN_FIELDS")


_check_field_orders()


def shown_fields(job) -> tuple:
    """SHOWN_FIELDS, then the job's `resource` when it has one, its `key` when it has one and
    its `depends_on` when it has some (each after the ones before, None when it has none): a job
    without any shows the fields results always kept, so kept results are unchanged."""
    t = shown_common(job)
    spec = job.spec
    r, k = spec[S_RESOURCE], spec[S_KEY]
    if spec[S_DEPENDS_ON] is not None:
        return t + (r, k, spec[S_DEPENDS_ON])
    if k is not None:
        return t + (r, k)
    return t if r is None else t + (r,)


# A ready entry, of a queue's ready heap, a key's heap (node/core/keys.py) or a blocked heap
# (node/core/gating.py): (-priority, enqueued_at, seq, job), the delivery order and the job.
# Heaps compare entries as tuples, the job never (seqs are unique). Live while its job is READY,
# still in the machine and has the entry's seq (`is_live_entry`); the rest are stale, skipped
# when they surface. A plain tuple read through these positions, not a named tuple: a named
# tuple is made at six times a tuple's cost (about 0.2 us more), takes 8 bytes more (a heap of
# keyed or held-back jobs holds one per job), and reads slower (CPython 3.11 specializes
# indexing and unpacking for exact tuples only). Reserve makes one for every job it holds back
# on a full resource: with a named tuple, `python -m raftq.node.bench --resources 10000 --backlog
# 100000` measured its reserve 8 % slower (median, mean 9 %), with this tuple 2 % (mean 0 %).
ENTRY_NEG_PRIORITY, ENTRY_ENQUEUED_AT, ENTRY_SEQ, ENTRY_JOB = range(4)


def ready_entry(job: Job) -> tuple:
    """A new entry for a READY job, in its place (its priority, enqueue time and seq)."""
    return -job.priority, job.enqueued_at, job.seq, job


def entry_order(e: tuple) -> tuple:
    """(-priority, enqueued_at, seq) of entry `e`: the delivery order, without the job."""
    return e[:ENTRY_JOB]


def is_live_entry(e: tuple, jobs: dict) -> bool:
    """Whether entry `e` still stands for its job (the hot paths write this test inline)."""
    job = e[ENTRY_JOB]
    return job.state == READY and job.seq == e[ENTRY_SEQ] and jobs.get(job.id) is job


class Queue:
    """Per-queue index and counters. Counts are exact; the ready index may hold stale entries.

    Ready entries (-priority, enqueued_at, seq, job: ENTRY_*) live in the FIFO, kept in ascending
    order, when they sort after its last entry (every new job of a queue that uses one priority:
    sequences only grow), and in the heap `ready_heap` otherwise (retries, which keep their
    place, and jobs of a higher priority than the last one). The next job is the smaller of the
    two heads, so a deep backlog costs O(1) per reserve instead of O(log n). An entry is live
    while its job is READY, still in the machine and has the entry's seq.

    The FIFO holds most of a deep backlog, so it keeps no entry tuples (72 bytes a job): its
    entries are two deques in step, `ready_fifo` the jobs and `fifo_seqs` their seqs (the job's
    own int). A live entry's priority and enqueue time are its job's (node/core/invariants.py
    checks it); `fifo_tail` is (-priority, enqueued_at) of the last entry appended, which the
    next must not sort before even when that entry has gone stale (`fifo_entries` rebuilds the
    tuples, for the paths that are not hot)."""
    __slots__ = ("name", "ready_heap", "ready_fifo", "fifo_seqs", "fifo_tail", "ready", "scheduled",
                 "in_flight", "dead", "enqueued", "acked", "nacked", "dead_total", "paused", "expired",
                 "dead_by_cause", "throttled", "deferred", "circuit", "keys", "rate_log", "waiting")
    COUNTERS = ("ready", "scheduled", "in_flight", "dead", "enqueued", "acked", "nacked",
                "dead_total", "paused", "expired", "waiting")
    # The counters of the snapshots and digests written before `expired` existed: a snapshot's
    # shorter list loads with the later counters at 0, and the digest hashes a later counter only
    # once it is not 0 (a state without expiries hashes as it did).
    COUNTERS_V1 = COUNTERS[:9]

    def __init__(self, name: str):
        self.name = name
        self.ready_heap: list = []
        self.ready_fifo: deque = deque()        # the FIFO's jobs ...
        self.fifo_seqs: deque = deque()         # ... and their entries' seqs, in step
        self.fifo_tail: tuple | None = None     # (-priority, enqueued_at) of the last one appended
        self.ready = self.scheduled = self.in_flight = self.dead = 0
        self.enqueued = self.acked = self.nacked = self.dead_total = 0
        self.paused = False
        self.expired = 0                # jobs dead-lettered with cause expired, ever (replicated)
        self.waiting = 0                # jobs waiting on their dependencies (node/core/deps.py)
        # The dead-letter store's records of this queue by cause: derived from the store (kept
        # in step by dead_letter / drop_dead_letter, rebuilt from it by a snapshot restore).
        self.dead_by_cause: dict[str, int] = {}
        # Gating (node/core/gating.py): ready jobs held in blocked heaps because their resource
        # is full, deferrals so far, and the circuit-breaker state (a Circuit, or None).
        self.throttled = self.deferred = 0
        self.circuit = None
        # Keys (node/core/keys.py): the keyed index while the queue holds keyed jobs (else None),
        # and the hand-out times inside the queue-wide rate's window.
        self.keys = None
        self.rate_log: tuple = ()

    def fifo_entries(self):
        """The FIFO as ready entries (ENTRY_*), in order; a stale entry's first two are its job's
        now, not what they were."""
        for job, seq in zip(self.ready_fifo, self.fifo_seqs):
            yield -job.priority, job.enqueued_at, seq, job

    def depth(self) -> int:
        return self.ready + self.scheduled + self.in_flight + self.waiting

    def stats(self, declared: bool) -> dict:
        """The QueueStats of docs/api.md. `waiting` and the cause `dependency_failed` are shown
        while there are some (a queue that never used dependencies shows what it showed before)."""
        by_cause = {c: self.dead_by_cause.get(c, 0) for c in ALWAYS_SHOWN_CAUSES}
        if self.dead_by_cause.get(DEPENDENCY_FAILED):
            by_cause[DEPENDENCY_FAILED] = self.dead_by_cause[DEPENDENCY_FAILED]
        out = {"name": self.name, "declared": declared, "paused": self.paused,
               "ready": self.ready, "scheduled": self.scheduled, "in_flight": self.in_flight,
               "dead_lettered": self.dead, "enqueued": self.enqueued, "acked": self.acked,
               "nacked": self.nacked, "dead_lettered_total": self.dead_total,
               "expired_total": self.expired, "dead_lettered_by_cause": by_cause,
               "throttled": self.throttled, "throttle_deferred_total": self.deferred}
        if self.waiting:
            out["waiting"] = self.waiting
        return out


# Timer entries are plain tuples that start with their time, so `heap[0][TIMER_AT]` is a timer
# heap's earliest: the schedule and deadline heaps hold (time, seq, job), the lease heap
# (expires, ctr, job id), the request-id heap (expires, order, request key), the tick heap
# (next_fire, stamp, schedule name), the key timers (time, ctr, Key). Not named tuples: one is
# made for every scheduled job, every deadline and every lease (each reserve), and a named tuple
# costs about 0.2 µs more to make (six times a tuple's cost).
TIMER_AT, TIMER_SEQ, TIMER_JOB = range(3)


# A dedup record (docs/semantics.md "Enqueue", idempotency) is one tuple (bucket, key, job id), kept both
# in the machine's `dedup` (queue name -> {idempotency key -> record}) and, as the very same
# object, in the expiry heap `dedup_heap`: a heap entry is live while its queue's dict holds that
# object for its key. The bucket is (expires, queue), one tuple shared by the records a batch
# makes (QueueMachine.shared_bucket), so the heap orders records by (expires, queue, key) as
# before. One 3-tuple per record instead of a key tuple, a value tuple and a heap tuple, and
# the bucket instead of an expiry and a queue in each (152 bytes a record less at 1M jobs,
# docs/performance.md).
DEDUP_BUCKET, DEDUP_KEY, DEDUP_JOB_ID = range(3)
BUCKET_EXPIRES, BUCKET_QUEUE = range(2)


def dedup_expires(rec) -> int:
    return rec[DEDUP_BUCKET][BUCKET_EXPIRES]


def dedup_queue(rec) -> str:
    return rec[DEDUP_BUCKET][BUCKET_QUEUE]


def dedup_record(m, qname: str, key: str):
    """The dedup record of `key` in queue `qname`, live or past its window, or None."""
    keyed = m.dedup.get(qname)
    return keyed.get(key) if keyed is not None else None


def dedup_items(m):
    """((queue, key), (job_id, expires)) of every dedup record, in (queue, key) order: the form
    snapshots and the digest have always used."""
    for qname in sorted(m.dedup):
        keyed = m.dedup[qname]
        for key in sorted(keyed):
            rec = keyed[key]
            yield (qname, key), (rec[DEDUP_JOB_ID], dedup_expires(rec))


class DeadLetter:
    """A dead-letter record (docs/semantics.md "Dead letters"). `order` is its place in the store
    (a reverted removal puts it back there)."""
    __slots__ = ("job", "cause", "failed_at", "final_attempt", "reason", "order")

    def __init__(self, job: Job, cause: str, failed_at: int, final_attempt: int, reason, order: int):
        self.job, self.cause, self.failed_at = job, cause, failed_at
        self.final_attempt, self.reason, self.order = final_attempt, reason, order

    def fields(self) -> tuple:
        """Everything but the job: (cause, failed_at, final_attempt, reason, order), the form
        snapshots and the digest keep after the job's id."""
        return self.cause, self.failed_at, self.final_attempt, self.reason, self.order


def known_queue(m, queue) -> bool:
    """A queue that exists or that the configuration in force declares."""
    return queue in m.queues or queue in m.limits.queues
