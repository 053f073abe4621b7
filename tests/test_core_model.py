"""Model-based test of the queue state machine (node/core/machine.py) against a naive reference model.

Hypothesis drives random request sequences through the real path (`node.base.validate`
validation -> `QueueMachine.apply_batch`) and through `Model`, a deliberately simple
reimplementation of docs/semantics.md and docs/api.md written for obviousness, not speed: plain
dicts and lists, O(n) scans, "sort every ready job of the queue and take the first". The model
never uses node.core.machine (nor node.core.retry: it recomputes the documented jitter formula
itself).

After every step every answer (status and body; error `message` texts aside, they are prose) must
match, and invariants compare per-queue stats, a job-by-job view, the dead-letter store, the
paged listings, the bookkeeping counts, the sweep due time, and the snapshot round trip.

Configuration changes (PUT /v1/config), key changes and operator moves (dead-letter move,
purge, queue delete) are commands among the others: the model changes its own copy of the
configuration at that point and every later decision reads it, while what earlier commands fixed
(dedup and request-id expiries, leases, run times) stays. Request ids are scoped to a caller
(`who`, drawn per request) and bound to the route and body. The audit trail is compared entry by
entry (who, action, target). At the end of every run the whole history is replayed on a fresh
machine from the bootstrap configuration: every answer and the digest must come out the same.

Schedules (node/core/schedules.py) are commands among the others too: PUT (create / replace,
with or without expect_version), DELETE, pause / resume and trigger on a few names, through
node/base/validate_schedule.py. The model keeps its own record per schedule and fires ticks inside its
sweep by brute force (every tick of the rule listed, then the catch-up and overlap policies applied
to that list), enqueueing each tick's job through its own enqueue; every schedule view is compared
field by field.

Dependencies (docs/semantics.md "Dependencies") are drawn into enqueue, batch and atomic bodies:
`depends_on` entries naming live jobs, dead letters, kept (retained) jobs, gone or unknown ids, and
in a batch earlier jobs by `ref` (now and then a ref to nothing, or a job twice: refused), as bare
ids or objects with each of the three policies; a `workflow` rule enqueues chains and fan-ins by ref
and works them. The model keeps its own `waiting` state (`waiting_on` per job), follows each end (an
ack; a dead letter of any cause, the deadline and the operator's move included; a removal by
cancel, purge or a tick's replace) to the jobs waiting on it, dependency_failed down the graph,
and keeps an acked dependency while a live job names it (`readers`, a scan), even where its queue
keeps no results, until its retention has ended and no live job names it (a requeued dependent
names it again). Views (`depends_on`, `waiting_on`, `live_dependents`), stats (`waiting`,
`dependency_failed`) and counts are compared like the rest; `dependencies_hold` checks after every
step that a waiting job waits on live jobs only and that no job runs (unless requeued) before all
its dependencies ended (and so does every reserve's answer).

Batches with callbacks (docs/semantics.md "Batches") come by a `batches` rule: opened (first
members as an atomic batch, refs and dependencies included; callbacks, now and then a refused one;
open or closed; a timeout), added to, closed, cancelled, on batches live, finished, dropped or
unknown, then worked by a round of workers. The model keeps its own batches (`MBatch`: members
pending / succeeded / failed / removed, the callbacks fired, a timeout closed by the sweep, a
finished batch dropped FINISHED_RETENTION_MS after it finished) and follows every member's end
(ack, dead letter of any cause, removal) to its batch; a callback is a job of the model, made past
its queue's depth. Members acked are kept while their batch is (`kept_for_batch`), even where the
queue keeps no results. Every answer and every batch view is compared; `callbacks_hold` checks
after every step that a callback has fired iff its condition holds, at most once per kind and
batch; the sweep's due time counts the batches' timers (an open batch's timeout, a finished one's
drop).

Where the spec is silent the model follows the code's choice; each such place is marked
"(code's choice)" below.

Run size: RAFTQ_MODEL_EXAMPLES (default 300; 40 unless RAFTQ_TEST_PROFILE=full, tests/conftest.py)
x RAFTQ_MODEL_STEPS (default 100) steps, e.g.
    RAFTQ_MODEL_EXAMPLES=2000 RAFTQ_MODEL_STEPS=100 .venv/bin/python -m pytest -q tests/test_core_model.py
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from raftq.node.base import validate as C
from raftq.node.base import validate_batch as VB
from raftq.node.base import validate_schedule as VS
from raftq.node.core.jobs import IN_FLIGHT, READY, SCHEDULED                # system under test only
from raftq.node.core.schedules import job_id_of                              # a tick's job id (code's choice)
from raftq.node.core.errors import ApiError
from raftq.node.core.limits import Limits
from raftq.node.core.retry import policy_delay_ms                                 # checked against the spec formula

from helpers_core import QueueMachine                                        # node/core/machine.py, answering as the node does

T0 = 1_764_500_000_000
NAMES = ("a", "b", "c")
SCHEDULES = ("s1", "s2", "s3")         # schedule names: few, so replaces, conflicts and re-creates happen
MINUTE = 60_000
UNKNOWN_ID = "ffffffff-ffff-4fff-bfff-ffffffffffff"
EXAMPLES = int(os.environ.get("RAFTQ_MODEL_EXAMPLES", "300"))
STEPS = int(os.environ.get("RAFTQ_MODEL_STEPS", "100"))

# (name, [limits], [storage], [[queues]]) over queues "a", "b", "c"; an undeclared one runs on [limits].
CONFIGS = [
    ("no-retention, immediate retries",
     {"max_reserve_batch": 3, "request_id_window_ms": 4000, "max_batches": 2, "max_batch_members": 4},
     {"dead_letter_retention_ms": 0, "dedup_window_ms": 5000},
     [{"name": "a", "max_queue_depth": 3, "max_lease_duration_ms": 2000},
      {"name": "b", "default_priority": 3, "max_attempts_ceiling": 2, "default_max_attempts": 2,
       "max_schedule_horizon_ms": 20000}]),
    ("retention, exponential retry policy, sweep budget of 2 per phase, 1 schedule per sweep, 2 catch-up ticks",
     {"max_reserve_batch": 3, "request_id_window_ms": 4000, "retry_delay_ms": 1000, "max_schedule_horizon_ms": 25000,
      "retry_backoff": "exponential", "retry_delay_max_ms": 3000, "max_schedules_per_sweep": 1,
      "max_catchup_ticks": 2},
     {"dead_letter_retention_ms": 8000, "dedup_window_ms": 6000, "sweep_limit": 2},
     [{"name": "a", "max_queue_depth": 2, "dedup_window_ms": 2500, "max_lease_duration_ms": 3000,
       "result_retention_ms": 3000, "max_retained_result_bytes": 6},
      {"name": "b", "retry_backoff": "none", "retry_delay_ms": 400, "retry_delay_max_ms": 400,
       "max_attempts_ceiling": 2, "default_max_attempts": 2}]),
    ("short retention, policy capped by the schedule horizon, at most 2 schedules",
     {"request_id_window_ms": 3000, "max_schedule_horizon_ms": 8000, "retry_delay_ms": 2000,
      "retry_backoff": "exponential", "retry_delay_max_ms": 60000, "default_priority": 5, "max_schedules": 2,
      "max_batches": 1, "max_batch_members": 3},
     {"dead_letter_retention_ms": 3000, "dedup_window_ms": 4000},
     [{"name": "b", "max_queue_depth": 1, "default_max_attempts": 1}]),
    ("long retention, immediate retries (jobs die after several attempts and get requeued); 2 schedules per sweep",
     {"max_reserve_batch": 4, "request_id_window_ms": 5000, "max_lease_duration_ms": 3000,
      "max_schedules_per_sweep": 2, "max_catchup_ticks": 3},
     {"dead_letter_retention_ms": 60_000, "dedup_window_ms": 3000},
     [{"name": "a", "max_queue_depth": 5, "default_max_attempts": 2, "result_retention_ms": 20_000},
      {"name": "c", "max_schedule_horizon_ms": 10_000, "retry_delay_ms": 100, "result_retention_ms": 6000,
       "max_retained_result_bytes": 8}]),
]


# Configuration changes the model test proposes: every config above, and ones the existing state
# may not fit (a smaller depth, a lower ceiling, retention off, a declaration dropped, a small
# audit trail); `None` marks the ones validation refuses (400 naming the key).
CHANGES = [(None, c[1], c[2], c[3]) for c in CONFIGS] + [
    ("tight", {"max_reserve_batch": 2, "request_id_window_ms": 2000, "max_attempts_ceiling": 1,
               "default_max_attempts": 1, "max_lease_duration_ms": 1000, "max_schedules": 1,
               "max_schedules_per_sweep": 1, "max_catchup_ticks": 1},
     {"dead_letter_retention_ms": 0, "dedup_window_ms": 1500, "audit_max_entries": 3, "audit_retention_ms": 4000},
     [{"name": "c", "max_queue_depth": 0, "result_retention_ms": 1000, "max_retained_result_bytes": 3}]),
    ("audit kept briefly", {"request_id_window_ms": 6000}, {"dead_letter_retention_ms": 2000, "audit_retention_ms": 1500,
                                                          "sweep_limit": 1}, []),
    ("invalid", {"default_max_attempts": 5, "max_attempts_ceiling": 2}, {}, []),
    ("invalid", {}, {"dedup_window_ms": 0}, []),
    ("invalid", {}, {}, [{"name": "a", "result_retention_ms": -1}]),
]
KEY_NAMES = ("k1", "k2", "k3")
DIGESTS = tuple(hashlib.sha256(n.encode()).hexdigest() for n in ("d1", "d2", "d3"))
WHO = (None, None, "alice", "bob")


def build_limits(i: int) -> Limits:
    _, lim, sto, qs = CONFIGS[i]
    return Limits.build(limits=lim, storage=sto, queues=qs)


def counter_id(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# ====================================================================================== model
# Everything from here to the harness is the reference model. It reads its own copy of the
# config (not node.limits) and knows the documented defaults.

DEFAULTS = {
    "max_lease_duration_ms": 300_000, "default_max_attempts": 3, "max_attempts_ceiling": 100,
    "default_priority": 0, "retry_delay_ms": 0, "retry_backoff": "none",
    "retry_delay_max_ms": 3_600_000, "max_queue_depth": None,
    "max_schedule_horizon_ms": 2_592_000_000, "max_reserve_batch": 256,
    "request_id_window_ms": 60_000, "dead_letter_retention_ms": 0, "dedup_window_ms": 86_400_000,
    "audit_retention_ms": 2_592_000_000, "audit_max_entries": 10_000,
    "max_schedules": 10_000, "max_schedules_per_sweep": 1_000, "max_catchup_ticks": 100,
    "result_retention_ms": 0, "max_retained_result_bytes": 64 * 1024 * 1024,
    "max_batches": 100_000, "max_batch_members": 10_000,
}
CALLBACK_KINDS = ("on_complete", "on_success", "on_failure")     # the order validation makes them in
FINISHED_RETENTION_MS = 3_600_000
# docs/api.md "Errors".
STATUS = {"invalid_argument": 400, "job_not_found": 404, "not_found": 404, "attempt_mismatch": 409,
          "failed_precondition": 409, "rejected": 422, "batch_rejected": 422, "overloaded": 429, "internal": 500}
# The route each request comes by (node/service/node_service.py): a request id is bound to it and to the
# request (path parameter and body), so the three enqueue endpoints and pause / resume are told
# apart although they share an op code.
ROUTE_OF = {"enqueue": "enqueue", "batch": "enqueue_batch", "atomic": "enqueue_atomic", "reserve": "reserve",
            "ack": "ack", "acks": "ack_batch", "nack": "nack", "extend": "extend", "drain": "drain",
            "requeue": "requeue", "dldel": "dead_letters_delete", "cancel": "cancel", "move": "dead_letter_move",
            "purge": "purge", "qdel": "queue_delete", "config": "config", "keyadd": "key_add",
            "keydel": "key_remove", "sput": "schedule_put", "sdel": "schedule_delete", "strig": "schedule_trigger",
            "bopen": "batch_open", "badd": "batch_add", "bclose": "batch_close", "bcancel": "batch_cancel"}


def route_of(kind: str, args: dict) -> str:
    if kind == "pause":
        return "pause" if args["paused"] else "resume"
    if kind == "spause":
        return "schedule_pause" if args["paused"] else "schedule_resume"
    return ROUTE_OF[kind]


def request_of(kind: str, args: dict):
    """(path parameter, body) as the node hashes them for a request id."""
    if kind in ("ack", "nack", "extend"):
        return args["job_id"], args["body"]
    if kind == "cancel":
        return args["job_id"], args.get("cascade")          # ?cascade= as sent, or None
    if kind in ("pause", "move", "purge", "qdel"):
        return args["queue"], args.get("body")
    if kind == "keydel":
        return args["name"], None
    if kind == "sput":
        return args["name"], args["body"]
    if kind == "sdel":
        return args["name"], args["expect"]
    if kind in ("spause", "strig"):
        return args["name"], None
    if kind in ("badd", "bclose", "bcancel"):
        return args["batch_id"], args.get("body")
    return None, args.get("body")


def err(code: str, **details):
    return STATUS[code], {"error": {"code": code, **details}}


def spec_policy_delay(job_id: str, attempt: int, base: int, backoff: str, max_ms: int, horizon: int) -> int:
    """docs/semantics.md "Retry policy (the timing of `default` nacks)", with H as documented in
    node/core/retry.py (blake2b-64 of "<job_id>:<attempt>", big-endian)."""
    if base == 0:
        return 0
    grown = base * 2 ** (attempt - 1) if backoff == "exponential" else base
    capped = min(grown, max_ms, horizon)
    h = int.from_bytes(hashlib.blake2b(f"{job_id}:{attempt}".encode(), digest_size=8).digest(), "big")
    delay = capped - h % (capped // 4 + 1)
    assert 0.75 * capped <= delay <= capped          # "up to 25 % subtracted"
    return delay


@dataclass
class MJob:
    id: str
    queue: str
    job_type: str
    payload: dict | None          # as sent: {"data_b64", "encoding"}
    priority: int
    custom: dict | None
    trace: dict | None            # {"traceparent", "tracestate"}
    enqueued_at: int
    scheduled_at: int | None      # what the producer asked for (after "past = now")
    attempt: int
    max_attempts: int
    state: str                    # ready | scheduled | in_flight | dead_lettered
    order: int                    # per-enqueue (and per-requeue) sequence: the stable tie-break
    deadline: int | None
    run_at: int | None = None     # when a scheduled job becomes ready
    lease_expires: int | None = None   # last lease given (kept after the job leaves in-flight)
    last_reason: str | None = None
    # Tie-breaks among jobs due in the same ms (code's choice): a lease by the first lease given
    # to this job with that expiry, a schedule by the job's sequence when it was first
    # scheduled for that time. (An earlier grant with the same time counts: its timer is live
    # again once the job has that time again.)
    first_lease: dict = field(default_factory=dict)   # expiry -> lease grant number
    first_sched: dict = field(default_factory=dict)   # run at -> job order at the time
    # Dependencies (docs/semantics.md "Dependencies"): what it was enqueued with, for life, as
    # [(job id, policy)] in the request's order (None: none); while `waiting`, the ones that
    # have not ended (id -> policy).
    depends_on: list | None = None
    waiting_on: dict = field(default_factory=dict)
    born: int = 0                 # its order at enqueue: the tie-break of deadlines due at once (code's choice)
    requeued: bool = False        # requeued from the dead letters: runs whatever its dependencies


@dataclass
class MDead:
    id: str
    cause: str
    failed_at: int
    final_attempt: int
    reason: str | None


@dataclass
class MSched:
    """A schedule as the model keeps it (docs: node/core/schedules.py and node/base/validate_schedule.py)."""
    name: str
    d: dict                       # the definition: what the model's prepare_schedule made of the PUT body
    version: int
    incarnation: int              # names its ticks' job ids (code's choice: a machine counter, see put_schedule)
    created_at: int
    updated_at: int = 0
    paused: bool = False
    next_fire: int | None = None  # planned even while paused (shown as None then)
    stamp: int = 0                # when it was last planned: the tie-break among schedules due at once
    fired: int = 0
    skipped: int = 0
    last_tick: int | None = None
    last_fired_at: int | None = None
    last_job_id: str | None = None
    last_error: str | None = None


@dataclass
class MKept:
    """A finished job kept for its queue's result_retention_ms: its view at the ack, its result
    ({data_b64, encoding} as sent, or None) and the result's size in bytes."""
    view: dict
    result: dict | None
    size: int
    finished_at: int
    expires: int
    order: int
    dropped: bool = False
    timer_done: bool = False      # its retention ended in a sweep while live jobs still named it


@dataclass
class MBatch:
    """A batch (docs/semantics.md "Batches"): its callbacks (kind -> prepared job fields), the
    members not ended (`pending`), the counts of the ended ones, the callbacks `fired` (kind ->
    job id, None for a key's hit), its timeout while open, its expiry once finished, and the
    succeeded members whose records it holds (`kept`)."""
    id: str
    callbacks: dict
    created_at: int
    open: bool = True
    timeout_at: int | None = None
    pending: set = field(default_factory=set)
    succeeded: int = 0
    failed: int = 0
    removed: int = 0
    fired: dict = field(default_factory=dict)
    finished_at: int | None = None
    expires: int | None = None
    kept: set = field(default_factory=set)


class Model:
    def __init__(self, limits: dict, storage: dict, queues: list):
        self.glob, self.storage = limits, storage
        self.qconf = {q["name"]: q for q in queues}
        self.version = 0                       # 0: the bootstrap (these), until a configuration is applied
        self.keys: dict[str, tuple] = {}       # name -> (role, digest)
        self.audit: list[dict] = []            # oldest first
        self.clock = 0
        self.seq = 0
        self.lease_seq = 0
        self.jobs: dict[str, MJob] = {}        # every live job, dead letters included
        self.dead: list[MDead] = []            # oldest first
        self.dedup: dict[tuple, tuple] = {}    # (queue, key) -> (job id, expires)
        self.rids: dict = {}                   # request key -> (route, request, result, expires, order stored)
        self.rid_order = 0
        self.known_queues: set[str] = set()    # queues that exist (a job was created, or paused)
        self.paused: set[str] = set()
        self.totals: dict[str, Counter] = {}
        self.scheds: dict[str, MSched] = {}
        self.stamps = 0                        # plan() counter: orders schedules due at the same ms
        # A schedule's incarnation is a machine counter shared with leases and dead letters (code's
        # choice, only used to derive job ids): the harness reads it from the machine when the model
        # creates a schedule; the model checks that no two creations share one.
        self.incarnation_of = lambda name: None
        self.incarnations: set = set()
        self.made_ids: list[str] = []          # ids of jobs made by schedules, for the harness's views
        self.tick_budget_used = False          # the last sweep stopped at max_schedules_per_sweep
        self.born_late = False                 # the last sweep made a job whose deadline had passed
        # Job results (docs/semantics.md "Job results"): job id -> MKept, in the order kept.
        self.kept: dict[str, MKept] = {}
        self.kept_order = 0
        self.resolving: list | None = None     # the dependencies' ends still to follow (see `end`)
        self.ended_ids: set[str] = set()       # every job that has ended once (acked, dead-lettered, removed)
        self.batches: dict[str, MBatch] = {}
        self.batch_of: dict[str, str] = {}     # pending member -> its batch
        self.callback_jobs: Counter = Counter()   # (batch id, kind) -> callbacks enqueued, for life

    # ---------------------------------------------------------------- config
    def qv(self, queue: str, key: str, conf=None):
        glob, storage, qconf = conf or (self.glob, self.storage, self.qconf)
        if key in qconf.get(queue, {}):
            return qconf[queue][key]
        if key == "dedup_window_ms":
            return storage.get(key, DEFAULTS[key])
        return glob.get(key, DEFAULTS[key])

    def gv(self, key: str):
        return self.glob.get(key, DEFAULTS[key])

    def sv(self, key: str):
        return self.storage.get(key, DEFAULTS[key])

    def record(self, who, action: str, target):
        """One audit entry; the oldest go first beyond audit_max_entries."""
        self.audit.append({"at": self.clock, "who": who, "action": action, "target": target})
        del self.audit[:max(0, len(self.audit) - self.sv("audit_max_entries"))]

    @property
    def retention(self) -> int:
        return self.storage.get("dead_letter_retention_ms", 0)

    @property
    def audit_retention(self) -> int:
        return self.sv("audit_retention_ms")

    @property
    def sweep_limit(self) -> int:
        return self.storage.get("sweep_limit", 10_000)

    # ---------------------------------------------------------------- helpers
    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def total(self, q: str) -> Counter:
        return self.totals.setdefault(q, Counter())

    def in_queue(self, q: str, state: str) -> list[MJob]:
        return [j for j in self.jobs.values() if j.queue == q and j.state == state]

    def depth(self, q: str) -> int:
        return sum(len(self.in_queue(q, s)) for s in ("ready", "scheduled", "in_flight", "waiting"))

    def render(self, j: MJob) -> dict:
        out = {"id": j.id, "queue": j.queue, "job_type": j.job_type}
        if j.payload is not None:
            out["payload"] = dict(j.payload)
        out["priority"] = j.priority
        out["custom"] = dict(j.custom or {})
        if j.trace is not None:
            out["trace_context"] = dict(j.trace)
        out.update(enqueued_at_ms=j.enqueued_at, scheduled_at_ms=j.scheduled_at, attempt=j.attempt,
                   max_attempts=j.max_attempts, lease_expires_at_ms=j.lease_expires)
        if j.deadline is not None:
            out["deadline_at_ms"] = j.deadline
        if j.depends_on is not None:
            out["depends_on"] = [{"job_id": d, "policy": p} for d, p in j.depends_on]
        return out

    def render_dead(self, d: MDead) -> dict:
        return {"job": self.render(self.jobs[d.id]), "cause": d.cause, "failed_at_ms": d.failed_at,
                "final_attempt": d.final_attempt, "last_reason": d.reason}

    def dead_letter(self, j: MJob, cause: str, reason):
        """A live job dead-lettered: stored (or dropped without a store); then what its end means
        for the jobs that depend on it and for the results it read."""
        self.total(j.queue)["dead_total"] += 1
        if cause == "expired":
            self.total(j.queue)["expired"] += 1
        if j.id in self.batch_of:           # its batch (on_failure) first, then its dependents (code's choice)
            self.member_ended(j.id, "failed")
        j.waiting_on = {}
        if self.retention == 0:
            del self.jobs[j.id]           # no store: dropped
        else:
            j.state = "dead_lettered"
            self.dead.append(MDead(j.id, cause, self.clock, j.attempt, reason))
        self.release_pins(j)
        self.end(j.id, False)

    def remove(self, j: MJob):
        """A live job removed (cancel, purge, a tick's replace): for its dependents, it failed."""
        if j.id in self.batch_of:
            self.member_ended(j.id, "removed")
        del self.jobs[j.id]
        self.release_pins(j)
        self.end(j.id, False)

    # ---------------------------------------------------------------- dependencies
    def readers(self, dep: str) -> int:
        """How many live jobs name `dep` among their dependencies (they read its result)."""
        return sum(1 for j in self.jobs.values()
                   if j.state != "dead_lettered" and j.depends_on and any(d == dep for d, _ in j.depends_on))

    def release_pins(self, j: MJob):
        """`j`, live until now, has ended: a dependency it named that is kept past its retention
        goes once no live job names it."""
        for dep, _ in j.depends_on or ():
            k = self.kept.get(dep)
            if k is not None and k.expires <= self.clock and not self.readers(dep) and not self.batch_holding(dep):
                event("model: a dependency's result dropped with its last live dependent")
                del self.kept[dep]

    def unknown_dependency(self, pairs, made=()):
        """The first dependency the model knows nothing of: not a job (dead letters included),
        not kept, not one of `made` (an atomic batch's earlier jobs)."""
        for dep, _ in pairs:
            if dep not in self.jobs and dep not in self.kept and dep not in made:
                return dep
        return None

    def attach(self, j: MJob, pairs: list):
        """A job just made with dependencies: dead-lettered at once when one it needs to succeed
        is a dead letter; else waiting on the ones that have not ended (a kept one succeeded)."""
        j.depends_on = list(pairs)
        dead = {d for d, _ in pairs if d in self.jobs and self.jobs[d].state == "dead_lettered"}
        if any(d in dead and p == "success" for d, p in pairs):
            event("model: a dependency already failed at enqueue")
            self.dead_letter(j, "dependency_failed", None)
            return
        pending = {d: p for d, p in pairs if d in self.jobs and d not in dead}
        if pending:
            event(f"model: a job waits on {min(len(pending), 2)}{'+' if len(pending) > 2 else ''} dependencies")
            j.state, j.waiting_on = "waiting", pending
        else:
            event("model: every dependency ended before the enqueue")

    def end(self, jid: str, ok: bool):
        """Job `jid` has ended (ok: acked; else dead-lettered or removed while live): each job
        waiting on it is satisfied, or (a `success` dependency that failed) dead-lettered,
        cause dependency_failed, and so on down the graph in this command. The order (code's
        choice): the ends to follow are a stack, the last one first; the jobs waiting on one end
        are taken in id order."""
        self.ended_ids.add(jid)
        if self.resolving is not None:
            self.resolving.append((jid, ok))
            return
        self.resolving = [(jid, ok)]
        while self.resolving:
            dep, ok = self.resolving.pop()
            for d in sorted((j for j in self.jobs.values() if j.state == "waiting" and dep in j.waiting_on),
                            key=lambda j: j.id):
                policy = d.waiting_on.pop(dep)
                if not ok and policy == "success":
                    event("model: dependency_failed")
                    self.dead_letter(d, "dependency_failed", None)
                elif not d.waiting_on:
                    event(f"model: a waiting job runs ({'acked' if ok else 'failed'} dependency, {policy})")
                    self.run_waiting(d)
        self.resolving = None

    def run_waiting(self, j: MJob):
        """Every dependency satisfied: scheduled while its time is ahead, else ready in its
        priority's place by its enqueue time; a new order (code's choice: after every job
        enqueued before, like a requeue's) among jobs of the same priority and enqueue time."""
        j.order = self.next_seq()
        if j.scheduled_at is not None and j.scheduled_at > self.clock:
            j.state, j.run_at = "scheduled", j.scheduled_at
            j.first_sched.setdefault(j.run_at, j.order)
        else:
            j.state, j.run_at = "ready", None

    def find_dead(self, jid: str):
        for d in self.dead:
            if d.id == jid:
                return d
        return None

    # ---------------------------------------------------------------- validation (before apply)
    def prepare_job(self, now: int, body: dict, new_ids: list, refs=None):
        """An EnqueueRequest -> ("job", fields) or ("reject", rejection). Only checks my
        generator can fail are modelled (scheduled_too_far, then a bad depends_on); `now` is the
        leader's stamp; `refs` the ids of a batch's earlier jobs by their ref (None: one job)."""
        q = body["queue"]
        sched = body.get("scheduled_at_ms")
        if body.get("delay_ms") is not None:
            sched = now + body["delay_ms"]
        horizon = self.qv(q, "max_schedule_horizon_ms")
        if sched is not None and sched > now + horizon:
            return "reject", {"reason": "scheduled_too_far", "horizon_ms": horizon, "scheduled_at_ms": sched}
        if sched is not None and sched <= now:
            sched = None                                  # past = now
        prio = body.get("priority")
        if prio is None:
            prio = self.qv(q, "default_priority")
        ma = body.get("max_attempts")
        if ma is None:
            ma = self.qv(q, "default_max_attempts")
        ma = min(ma, self.qv(q, "max_attempts_ceiling"))
        trace = None
        if body.get("trace_context") is not None:
            tc = body["trace_context"]
            trace = {"traceparent": tc["traceparent"], "tracestate": tc.get("tracestate")}
        deps = None
        if body.get("depends_on") is not None:
            deps = self.prepare_deps(body["depends_on"], refs)
            if deps == "bad":
                return "reject", {"reason": "invalid_request"}
        return "job", dict(id=new_ids.pop(0), queue=q, job_type=body["job_type"],
                           payload=body.get("payload"), priority=prio, custom=body.get("custom") or None,
                           trace=trace, scheduled_at=sched, max_attempts=ma,
                           deadline=body.get("deadline_at_ms"), key=body.get("idempotency_key"), deps=deps)

    @staticmethod
    def prepare_deps(entries: list, refs):
        """A depends_on -> [(job id, policy)] (None when empty), or "bad" (invalid_request): a ref
        outside a batch or to no earlier job of it, a job named twice. Ids as their canonical
        lower case; a bare id means policy success."""
        pairs = []
        for e in entries:
            policy = "success"
            if isinstance(e, dict):
                policy = e.get("policy", "success")
                if "ref" in e:
                    if refs is None or e["ref"] not in refs:
                        return "bad"
                    e = refs[e["ref"]]
                else:
                    e = e["job_id"]
            if any(d == e.lower() for d, _ in pairs):
                return "bad"
            pairs.append((e.lower(), policy))
        return pairs or None

    def handle(self, now: int, kind: str, args: dict, rid, new_ids: list, who=None):
        """One request: validation, then (if it passes) apply at the replicated clock."""
        if kind in ("enqueue", "batch", "atomic"):
            bodies = [args["body"]] if kind == "enqueue" else args["body"]["jobs"]
            refs = None if kind == "enqueue" else {}
            items = []
            for b in bodies:
                items.append(self.prepare_job(now, b, new_ids, refs))
                if items[-1][0] == "job" and refs is not None and b.get("ref") is not None:
                    refs[b["ref"]] = items[-1][1]["id"]
            if kind == "enqueue" and items[0][0] == "reject":
                return err("rejected", rejection=items[0][1])
            if kind == "atomic" and any(t == "reject" for t, _ in items):
                return err("batch_rejected", errors=[{"index": i, "rejection": r}
                                                     for i, (t, r) in enumerate(items) if t == "reject"])
            run = lambda: self.enqueue(kind, items)                              # noqa: E731
        elif kind == "reserve":
            b = args["body"]
            lease = min([b["lease_ms"]] + [self.qv(q, "max_lease_duration_ms") for q in b["queues"]])
            max_jobs = min(b.get("max_jobs", 1), self.gv("max_reserve_batch"))
            run = lambda: self.reserve(b["queues"], lease, max_jobs)             # noqa: E731
        elif kind in ("ack", "nack", "extend"):
            jid, b = args["job_id"].lower(), args["body"]
            if kind == "ack":
                run = lambda: self.ack(jid, b["attempt"], b.get("result"))       # noqa: E731
            elif kind == "extend":
                run = lambda: self.extend(jid, b["attempt"], b["lease_ms"])      # noqa: E731
            else:
                retry = b.get("retry") or {"strategy": "default"}
                reason = b.get("reason") or None                  # "" is sent as absent
                run = lambda: self.nack(jid, b["attempt"], reason, retry["strategy"],  # noqa: E731
                                        retry.get("delay_ms"))
        elif kind == "acks":
            if len(args["body"]["acks"]) > self.gv("max_reserve_batch"):
                return err("invalid_argument")                    # validation, before proposing
            pairs = [(a["job_id"].lower(), a["attempt"], a.get("result")) for a in args["body"]["acks"]]
            run = lambda: (200, {"results": [self.ack(j, a, r)[1] for j, a, r in pairs]})  # noqa: E731
        elif kind == "drain":
            b = args["body"]
            # `max` is clamped to max_reserve_batch (docs/api.md "Decisions where the rules above
            # leave room").
            run = lambda: self.drain(b.get("queue"), min(b.get("max", 1), self.gv("max_reserve_batch")))  # noqa: E731
        elif kind in ("requeue", "dldel"):
            ids = [i.lower() for i in args["body"]["ids"]]
            run = (lambda: self.requeue(ids)) if kind == "requeue" else (lambda: self.dldel(ids))
        elif kind == "cancel":
            run = lambda: self.cancel(args["job_id"].lower(), args.get("cascade") == "true", who)  # noqa: E731
        elif kind == "pause":
            run = lambda: self.pause(args["queue"], args["paused"], (args.get("body") or {}).get("create", False),  # noqa: E731
                                     who)
        elif kind == "move":
            b = args["body"]
            ids = [i.lower() for i in b["ids"]]
            run = lambda: self.move(args["queue"], ids, b.get("reason") or None, who)   # noqa: E731
        elif kind == "purge":
            run = lambda: self.purge(args["queue"], who)                         # noqa: E731
        elif kind == "qdel":
            run = lambda: self.delete_queue(args["queue"], who)                  # noqa: E731
        elif kind == "config":
            if args["change"][0] == "invalid":
                return err("invalid_argument")                    # validation, before proposing
            run = lambda: self.configure(args["body"]["expect_version"], args["change"], who)   # noqa: E731
        elif kind == "keyadd":
            b = args["body"]
            run = lambda: self.add_key(b["name"], b["role"], b["key_sha256"], who)   # noqa: E731
        elif kind == "keydel":
            run = lambda: self.remove_key(args["name"], who)                     # noqa: E731
        elif kind == "sweep":
            run = self.sweep
        elif kind == "sput":
            how, *rest = self.prepare_schedule(args["body"])
            if how == "invalid":
                return err("invalid_argument", field=rest[0])       # validation, before proposing
            d, expect = rest
            run = lambda: self.put_schedule(args["name"], d, expect, who)          # noqa: E731
        elif kind == "sdel":
            expect = args["expect"]
            if expect is not None:
                try:
                    expect = int(expect)
                except ValueError:
                    return err("invalid_argument", field="expect_version")
            run = lambda: self.delete_schedule(args["name"], expect, who)         # noqa: E731
        elif kind == "spause":
            run = lambda: self.pause_schedule(args["name"], args["paused"], who)  # noqa: E731
        elif kind == "strig":
            jid = new_ids.pop(0)                  # the leader names the job before it proposes
            run = lambda: self.trigger_schedule(args["name"], jid, who)           # noqa: E731
        elif kind in ("bopen", "badd", "bclose", "bcancel"):
            run = self.prepare_batch(now, kind, args, new_ids, who)
            if type(run) is tuple:
                return run                        # refused at validation
        else:
            raise AssertionError(kind)
        assert not new_ids, "the model did not account for every id the leader assigned"
        if kind in ("drain", "requeue", "dldel"):
            inner = run

            def run():
                result = inner()
                action = {"drain": "drain", "requeue": "requeue", "dldel": "dead_letters_delete"}[kind]
                self.record(who, action, args["body"].get("queue") if kind == "drain" else None)
                return result

        # ---- apply: the replicated clock never goes back
        self.clock = max(self.clock, now)
        if rid is not None:
            key = rid if who is None else (who, rid)
            route, request = route_of(kind, args), json.dumps(request_of(kind, args), sort_keys=True)
            stored = self.rids.get(key)
            if stored is not None and stored[3] > self.clock:
                if stored[0] != route or stored[1] != request:
                    event(f"model: request id reused for another {'route' if stored[0] != route else 'body'}")
                    return err("invalid_argument")
                event(f"model: request id replayed ({kind})")
                return stored[2]
        result = run()
        # An empty reserve is not remembered (code's choice, for long polls that re-propose).
        if rid is not None and not (kind == "reserve" and not result[1]["jobs"]):
            self.rid_order += 1
            self.rids[key] = (route, request, result, self.clock + self.gv("request_id_window_ms"), self.rid_order)
        return result

    # ---------------------------------------------------------------- operations
    def enqueue(self, kind: str, items: list):
        if kind == "atomic":
            # All or nothing: every dependency known first (an earlier job of the batch counts
            # when it makes a job that stays: not a key's hit, not a dead letter dropped at once,
            # without a store: code's choice, as the best-effort batch refuses the later job), then
            # capacity for the whole batch.
            # A key's hit stands for the existing job (docs/semantics.md "Dependencies"): a later
            # job's ref to it names that job.
            missing, made, seen, alias = [], set(), {}, {}
            for i, (_, f) in enumerate(items):
                dep = self.unknown_dependency([(alias.get(d, d), p) for d, p in f["deps"] or ()], made)
                if dep is not None:
                    missing.append({"index": i, "rejection": {"reason": "dependency_not_found", "job_id": dep}})
                k = (f["queue"], f["key"])
                hit = f["key"] is not None and (k in seen or (k in self.dedup and self.clock < self.dedup[k][1]))
                if hit:
                    alias[f["id"]] = seen[k] if k in seen else self.dedup[k][0]
                else:
                    seen[k] = f["id"]
                dropped = self.retention == 0 and any(p == "success" and d in self.jobs and
                                                      self.jobs[d].state == "dead_lettered" for d, p in f["deps"] or ())
                if not hit and not dropped:
                    made.add(f["id"])
                elif any(f["id"] in [d for d, _ in g["deps"] or ()] for _, g in items[i + 1:]):
                    event(f"model: atomic, a later job depends on one that makes none "
                          f"({'a key' if hit else 'dropped'})")
            if missing:
                return err("batch_rejected", errors=missing)
            # Dedup hits never count (docs/semantics.md "Enqueue"), whether they hit a live
            # record or an earlier job of the batch.
            wanted, seen = Counter(), set()
            for _, f in items:
                k = (f["queue"], f["key"])
                if f["key"] is not None and (k in seen or (k in self.dedup and self.clock < self.dedup[k][1])):
                    continue
                seen.add(k)
                wanted[f["queue"]] += 1
            full = {}
            for q, n in wanted.items():
                limit = self.qv(q, "max_queue_depth")
                if limit is not None and self.depth(q) + n > limit:
                    full[q] = limit
            if full:
                return err("batch_rejected", errors=[
                    {"index": i, "rejection": {"reason": "queue_full", "queue": f["queue"], "limit": full[f["queue"]]}}
                    for i, (_, f) in enumerate(items) if f["queue"] in full])
            return 200, {"results": self.enqueue_in_order([f for _, f in items], False)}
        results = self.enqueue_in_order([{"rejection": f} if t == "reject" else f for t, f in items], True)
        if kind == "enqueue":
            if "rejection" in results[0]:
                return err("rejected", rejection=results[0]["rejection"])
            return 200, results[0]
        return 200, {"results": results}

    def enqueue_in_order(self, fields: list, check_depth: bool) -> list:
        """A batch's jobs in order; a later job's dependency on a key's hit is one on the job the
        hit returned."""
        out, alias = [], {}
        for f in fields:
            if "rejection" in f:
                out.append(f)
                continue
            if f.get("deps"):
                f = {**f, "deps": [(alias.get(d, d), p) for d, p in f["deps"]]}
            r = self.enqueue_one(f, check_depth)
            if r.get("deduplicated"):
                alias[f["id"]] = r["job_id"]
            out.append(r)
        return out

    def enqueue_one(self, f: dict, check_depth: bool) -> dict:
        q, key, deps = f["queue"], f["key"], f.get("deps")
        if deps:
            # before the key and the depth (code's choice)
            dep = self.unknown_dependency(deps)
            if dep is not None:
                return {"rejection": {"reason": "dependency_not_found", "job_id": dep}}
        if key is not None:
            rec = self.dedup.get((q, key))
            if rec is not None and self.clock < rec[1]:
                return {"job_id": rec[0], "deduplicated": True}
            if rec is not None:
                event("model: dedup record past its window, not yet swept")
        limit = self.qv(q, "max_queue_depth")
        if check_depth and limit is not None and self.depth(q) + 1 > limit:
            return {"rejection": {"reason": "queue_full", "queue": q, "limit": limit}}
        sched = f["scheduled_at"]
        j = MJob(id=f["id"], queue=q, job_type=f["job_type"], payload=f["payload"], priority=f["priority"],
                 custom=f["custom"], trace=f["trace"], enqueued_at=self.clock, scheduled_at=sched,
                 attempt=1, max_attempts=f["max_attempts"], state="ready", order=self.next_seq(),
                 deadline=f["deadline"])
        j.born = j.order
        if sched is not None and sched > self.clock:
            j.state, j.run_at = "scheduled", sched
            j.first_sched.setdefault(sched, j.order)
        self.jobs[j.id] = j
        self.known_queues.add(q)
        self.total(q)["enqueued"] += 1
        if key is not None:
            self.dedup[(q, key)] = (j.id, self.clock + self.qv(q, "dedup_window_ms"))
        if deps:
            self.attach(j, deps)
        return {"job_id": j.id, "deduplicated": False}

    def reserve(self, queues: list, lease: int, max_jobs: int):
        out = []
        for q in queues:
            if q in self.paused:
                continue
            while len(out) < max_jobs:
                ready = sorted(self.in_queue(q, "ready"), key=lambda j: (-j.priority, j.enqueued_at, j.order))
                if not ready:
                    break
                j = ready[0]
                if j.deadline is not None and j.deadline <= self.clock:
                    event("model: deadline passed at reserve")
                    self.dead_letter(j, "expired", None)      # too late: it never runs
                    continue
                self.lease_seq += 1
                j.state, j.lease_expires, j.deadline = "in_flight", self.clock + lease, None
                j.first_lease.setdefault(j.lease_expires, self.lease_seq)
                out.append(self.render(j))
        return 200, {"jobs": out}

    def fenced(self, jid: str, attempt: int):
        j = self.jobs.get(jid)
        if j is None or j.state != "in_flight":
            return None, err("job_not_found", job_id=jid)
        if j.attempt != attempt:
            return None, err("attempt_mismatch", job_id=jid, attempt=j.attempt)
        return j, None

    def ack(self, jid: str, attempt: int, result=None):
        j, e = self.fenced(jid, attempt)
        if e:
            return e
        view = self.view(jid)
        del self.jobs[jid]
        self.total(j.queue)["acked"] += 1
        retention = self.qv(j.queue, "result_retention_ms")
        # Kept for its queue's retention; or, while live jobs name it, for them to read (its
        # retention then 0 where the queue keeps none), until they have ended too.
        if retention > 0 or self.readers(jid) or jid in self.batch_of:
            if retention == 0:
                event("model: a result kept for live dependents or a batch")
            self.keep(j.queue, view, result, retention)
        self.release_pins(j)
        self.end(jid, True)
        if jid in self.batch_of:            # after its dependents run (code's choice)
            self.member_ended(jid, "succeeded")
        return 200, {"job_id": jid}

    def keep(self, q: str, view: dict, result, retention: int):
        """The acked job kept with its result; at the queue's bound the oldest results are
        dropped first, and a result above the bound on its own is not kept."""
        size = len(base64.b64decode(result["data_b64"])) if result is not None else 0
        view = {**view, "state": "succeeded", "lease_expires_at_ms": None}
        self.kept_order += 1
        k = MKept(view, result, size, self.clock, self.clock + retention, self.kept_order)
        bound = self.qv(q, "max_retained_result_bytes")
        if size > bound:
            k.result, k.size, k.dropped = None, 0, True
            event("model: a result larger than its queue's bound")
        else:
            self.fit(q, bound - size)
        self.kept[view["id"]] = k
        event(f"model: jobs kept at once: {min(len(self.kept), 3)}{'+' if len(self.kept) > 3 else ''}")

    def fit(self, q: str, room: int):
        """Drop the oldest results of queue q until its kept results take at most `room` bytes."""
        for k in sorted((k for k in self.kept.values() if k.view["queue"] == q and k.size), key=lambda k: k.order):
            if sum(k.size for k in self.kept.values() if k.view["queue"] == q) <= room:
                break
            k.result, k.size, k.dropped = None, 0, True
            event("model: a kept result dropped at the bound")

    def kept_view(self, jid: str):
        k = self.kept[jid]
        out = {**k.view, "result": k.result, "result_dropped": k.dropped, "finished_at_ms": k.finished_at,
               "retained_until_ms": k.expires}
        if self.readers(jid):
            out["live_dependents"] = self.readers(jid)
        if self.batch_holding(jid):
            out["kept_for_batch"] = self.batch_holding(jid)
        return out

    def nack(self, jid: str, attempt: int, reason, strategy: str, delay_ms):
        j, e = self.fenced(jid, attempt)
        if e:
            return e
        self.total(j.queue)["nacked"] += 1          # every accepted nack (code's choice)
        j.last_reason = reason
        if strategy == "dead_letter":
            self.dead_letter(j, "rejected", reason)
            return 200, {"job_id": jid, "dead_lettered": True}
        if j.attempt >= j.max_attempts:
            self.dead_letter(j, "attempts_exhausted", reason)
            return 200, {"job_id": jid, "dead_lettered": True}
        q = j.queue
        if strategy == "delay":
            delay = min(delay_ms, self.qv(q, "max_schedule_horizon_ms"))
            if delay < delay_ms:
                event("model: nack delay clamped to the horizon")
        else:
            delay = spec_policy_delay(jid, j.attempt, self.qv(q, "retry_delay_ms"), self.qv(q, "retry_backoff"),
                                      self.qv(q, "retry_delay_max_ms"), self.qv(q, "max_schedule_horizon_ms"))
            event(f"model: policy delay {'0' if delay == 0 else '> 0'}")
        j.attempt += 1
        if delay == 0:
            j.state = "ready"            # keeps enqueued_at and order: ahead of newer jobs
        else:
            j.state, j.run_at = "scheduled", self.clock + delay
            j.first_sched.setdefault(j.run_at, j.order)
        return 200, {"job_id": jid, "dead_lettered": False}

    def extend(self, jid: str, attempt: int, lease_ms: int):
        j, e = self.fenced(jid, attempt)
        if e:
            return e
        self.lease_seq += 1
        j.lease_expires = self.clock + max(1, min(lease_ms, self.qv(j.queue, "max_lease_duration_ms")))
        j.first_lease.setdefault(j.lease_expires, self.lease_seq)
        return 200, {"job_id": jid, "lease_expires_at_ms": j.lease_expires}

    def drain(self, queue, mx: int):
        picked = [d for d in self.dead if queue is None or self.jobs[d.id].queue == queue][:mx]
        out = []
        for d in picked:
            out.append(self.render_dead(d))
            self.dead.remove(d)
            del self.jobs[d.id]
        return 200, {"records": out}

    def requeue(self, ids: list):
        requeued, missing = [], []
        for jid in ids:
            d = self.find_dead(jid)
            if d is None:
                missing.append(jid)
                continue
            event(f"model: requeued a job that died on attempt {'1' if self.jobs[jid].attempt == 1 else '2+'}")
            self.dead.remove(d)
            j = self.jobs[jid]
            j.attempt, j.enqueued_at, j.scheduled_at, j.deadline = 1, self.clock, None, None
            j.order, j.state = self.next_seq(), "ready"
            if j.depends_on:
                # it runs whatever its dependencies, and reads those still kept again
                event("model: a dead letter with dependencies requeued")
                j.requeued = True
            requeued.append(jid)
        return 200, {"requeued": requeued, "missing": missing}

    def dldel(self, ids: list):
        deleted, missing = [], []
        for jid in ids:
            d = self.find_dead(jid)
            if d is None:
                missing.append(jid)
                continue
            self.dead.remove(d)
            del self.jobs[jid]
            deleted.append(jid)
        return 200, {"deleted": deleted, "missing": missing}

    def waits_on(self, jid: str) -> list[str]:
        """The jobs waiting on `jid`, by id."""
        return sorted(j.id for j in self.jobs.values() if j.state == "waiting" and jid in j.waiting_on)

    def cancel(self, jid: str, cascade: bool = False, who=None):
        j = self.jobs.get(jid)
        # A dead letter is "not found" for cancel (docs/api.md, `DELETE /v1/jobs/{id}`).
        if j is None or j.state == "dead_lettered":
            return err("not_found", job_id=jid)
        if self.waits_on(jid) and not cascade:
            event("model: cancel refused, jobs wait on it")
            return err("failed_precondition", reason="has_dependents", job_id=jid, dependents=self.waits_on(jid)[:100])
        # With cascade, the jobs waiting on it, transitively, go first: each once no other of
        # them waits on it, so that none is failed by a removal.
        gone, todo = set(), self.waits_on(jid)
        while todo:
            d = todo.pop()
            if d not in gone:
                gone.add(d)
                todo += self.waits_on(d)
        left = set(gone)
        while left:
            leaf = min(d for d in left if not any(d in self.jobs[e].waiting_on for e in left))
            self.remove(self.jobs[leaf])
            left.remove(leaf)
        if gone:
            event(f"model: cancel with cascade of {min(len(gone), 3)}{'+' if len(gone) > 3 else ''} jobs")
        # an in-flight job is removed too (its worker's next call: job_not_found)
        if j.state == "waiting":
            event("model: a waiting job cancelled")
        self.remove(j)
        self.record(who, "cancel", jid)
        return (200, {"job_id": jid, "cancelled": sorted(gone)}) if cascade else (200, {"job_id": jid})

    def known(self, q: str) -> bool:
        return q in self.known_queues or q in self.qconf

    def pause(self, q: str, paused: bool, create: bool = False, who=None):
        if not create and not self.known(q):
            return err("not_found", queue=q)
        self.known_queues.add(q)
        (self.paused.add if paused else self.paused.discard)(q)
        self.record(who, "pause" if paused else "resume", q)
        return 200, {"queue": q, "paused": paused}

    def move(self, q: str, ids: list, reason, who=None):
        if not self.known(q):
            return err("not_found", queue=q)
        moved, missing = [], []
        for jid in ids:
            j = self.jobs.get(jid)
            if j is None or j.queue != q or j.state not in ("ready", "scheduled"):
                missing.append(jid)
                continue
            j.last_reason = reason
            self.dead_letter(j, "admin", reason)
            moved.append(jid)
        self.record(who, "dead_letter_move", q)
        return 200, {"dead_lettered": moved, "missing": missing}

    def purge(self, q: str, who=None):
        """The queue's ready and scheduled jobs go, each with what its removal means for its
        dependents (a `success` dependent of this queue fails: a dead letter, not purged); then
        every job of the queue still waiting, ready or scheduled (one a removal released
        included). Both in id order (code's choice: the order dependents fail in). A job made during
        the purge (a batch's callback, its last member removed here) stays (code's choice: a
        callback is never lost)."""
        if not self.known(q):
            return err("not_found", queue=q)
        n, before = 0, set(self.jobs)
        for jid in sorted(j.id for j in self.jobs.values() if j.queue == q and j.state in ("ready", "scheduled")):
            self.remove(self.jobs[jid])
            n += 1
        if any(j.queue == q and j.state in ("ready", "scheduled") for jid, j in self.jobs.items() if jid not in before):
            event("model: a callback made by a purge outlives it")
        while left := sorted(j.id for j in self.jobs.values() if j.id in before
                             and j.queue == q and j.state in ("ready", "scheduled", "waiting")):
            event(f"model: purge of a {self.jobs[left[0]].state} job left after the first pass")
            self.remove(self.jobs[left[0]])
            n += 1
        self.record(who, "purge", q)
        return 200, {"queue": q, "purged": n}

    def counts_of(self, q: str) -> dict:
        waiting = len(self.in_queue(q, "waiting"))
        return {"ready": len(self.in_queue(q, "ready")), "scheduled": len(self.in_queue(q, "scheduled")),
                "in_flight": len(self.in_queue(q, "in_flight")), "dead_lettered": len(self.in_queue(q, "dead_lettered")),
                **({"waiting": waiting} if waiting else {})}

    def delete_queue(self, q: str, who=None):
        if q in self.qconf:
            return err("failed_precondition", reason="declared", queue=q,
                       jobs=self.counts_of(q) if q in self.known_queues else {})
        if q not in self.known_queues:
            return err("not_found", queue=q)
        if any(self.counts_of(q).values()):
            return err("failed_precondition", reason="not_empty", queue=q, jobs=self.counts_of(q))
        self.known_queues.discard(q)
        self.paused.discard(q)
        self.totals.pop(q, None)
        self.record(who, "queue_delete", q)
        return 200, {"queue": q}

    # ---------------------------------------------------------------- configuration and keys
    def configure(self, expect: int, change, who=None):
        if expect != self.version:
            return err("failed_precondition", version=self.version)
        _, lim, sto, qs = change
        old = (self.glob, self.storage, self.qconf)
        new = (lim, sto, {q["name"]: q for q in qs})
        warnings = []
        for q in sorted(self.known_queues):
            depth = self.depth(q)
            limit = self.qv(q, "max_queue_depth", new)
            if limit is not None and depth > limit:
                warnings.append({"code": "depth_above_limit", "field": "max_queue_depth", "queue": q,
                                 "depth": depth, "limit": limit})
            if q in old[2] and q not in new[2] and depth + len(self.in_queue(q, "dead_lettered")) > 0:
                warnings.append({"code": "undeclared_queue_has_jobs", "field": f"queues[{q}]", "queue": q,
                                 "jobs": depth + len(self.in_queue(q, "dead_lettered"))})
        for q in sorted(self.known_queues):
            ceiling = self.qv(q, "max_attempts_ceiling", new)
            if ceiling < self.qv(q, "max_attempts_ceiling", old):
                n = sum(1 for j in self.jobs.values() if j.queue == q and j.max_attempts > ceiling)
                if n:
                    warnings.append({"code": "max_attempts_above_ceiling", "field": "max_attempts_ceiling",
                                     "queue": q, "jobs": n, "limit": ceiling})
        if self.dead and old[1].get("dead_letter_retention_ms", 0) > 0 and sto.get("dead_letter_retention_ms", 0) <= 0:
            warnings.append({"code": "dead_letters_kept", "field": "storage.dead_letter_retention_ms",
                             "dead_letters": len(self.dead)})
        if warnings:
            event("model: a configuration change with warnings")
        self.glob, self.storage, self.qconf = new
        for q in sorted({k.view["queue"] for k in self.kept.values() if k.size}):
            self.fit(q, self.qv(q, "max_retained_result_bytes"))
        self.version += 1
        self.record(who, "config_seed" if expect == 0 else "config_change", None)
        return 200, {"version": self.version, "warnings": warnings}

    def add_key(self, name: str, role: str, digest: str, who=None):
        if self.version < 1:
            return err("failed_precondition", reason="not_seeded", name=name)
        if name in self.keys:
            return err("failed_precondition", reason="exists", name=name)
        if any(d == digest for _, d in self.keys.values()):
            return err("failed_precondition", reason="digest_in_use", name=name)
        if not self.keys and role != "admin":
            return err("failed_precondition", reason="first_not_admin", name=name)
        self.keys[name] = (role, digest)
        self.version += 1
        self.record(who, "key_add", name)
        return 200, {"name": name, "role": role, "version": self.version}

    def remove_key(self, name: str, who=None):
        if name not in self.keys:
            return err("not_found", name=name)
        if self.keys[name][0] == "admin" and sum(1 for r, _ in self.keys.values() if r == "admin") == 1:
            return err("failed_precondition", reason="last_admin", name=name)
        del self.keys[name]
        self.version += 1
        self.record(who, "key_remove", name)
        return 200, {"name": name, "version": self.version}

    def sweep(self):
        """The phases in the order of docs/semantics.md "Lease expiry: the sweep" (deadlines
        after leases); each phase handles at most `sweep_limit` due entries, earliest due first,
        and leaves the rest to the next sweep. (Ties within one ms: see MJob; deadlines by
        enqueue order, dedup records by (queue, key), request ids by when they were stored:
        code's choice.)"""
        now, budget = self.clock, self.sweep_limit
        self.batch_timers(now, budget)
        n = Counter()
        for j in sorted((j for j in self.jobs.values() if j.state == "scheduled" and j.run_at <= now),
                        key=lambda j: (j.run_at, j.first_sched[j.run_at]))[:budget]:
            j.state = "ready"
            n["promoted"] += 1
        for j in sorted((j for j in self.jobs.values() if j.state == "in_flight" and j.lease_expires <= now),
                        key=lambda j: (j.lease_expires, j.first_lease[j.lease_expires]))[:budget]:
            n["leases_expired"] += 1
            if j.attempt >= j.max_attempts:
                event("model: lease expired on the final attempt")
                j.last_reason = None
                self.dead_letter(j, "lease_expired", None)
            else:
                event("model: lease expired, retried")
                j.attempt += 1
                j.state = "ready"        # at once: the retry policy does not apply to expiries
        # Deadlines: waiting jobs too. One at a time: a dead letter may fail a later one of the
        # list (dependency_failed, not counted here) or release one to ready or scheduled.
        while n["deadlines_expired"] < budget:
            due = [j for j in self.jobs.values() if j.state in ("ready", "scheduled", "waiting")
                   and j.deadline is not None and j.deadline <= now]
            if not due:
                break
            j = min(due, key=lambda j: (j.deadline, j.born))
            if j.state == "waiting":
                event("model: a waiting job's deadline passed")
            n["deadlines_expired"] += 1
            self.dead_letter(j, "expired", None)
        for expires, q, key in sorted((e, q, k) for (q, k), (_, e) in self.dedup.items() if e <= now)[:budget]:
            del self.dedup[(q, key)]
            n["dedup_expired"] += 1
        for expires, _, rid in sorted(((e, i, rid) for rid, (_, _, _, e, i) in self.rids.items() if e <= now),
                                      key=lambda t: t[:2])[:budget]:
            del self.rids[rid]
            n["request_ids_expired"] += 1
        if self.retention > 0:
            for d in [d for d in self.dead if d.failed_at <= now - self.retention][:budget]:
                self.dead.remove(d)
                del self.jobs[d.id]
                n["dead_letters_expired"] += 1
        old = [e for e in self.audit if e["at"] <= now - self.audit_retention][:budget]
        del self.audit[:len(old)]
        n["audit_expired"] = len(old)
        if old:
            event("model: audit entries past their retention")
        if any(v >= budget for v in n.values()):
            event("model: a sweep phase used its whole budget")
        keys = ("promoted", "leases_expired", "deadlines_expired", "dedup_expired",
                "request_ids_expired", "dead_letters_expired", "audit_expired")
        fired = self.fire_ticks(now)              # last: a tick's job waits for the next sweep's phases
        # kept results past their retention, earliest first (ties: the order kept), at most
        # `budget` removed; one live jobs still name stays for them (and is not counted)
        gone = 0
        for k in sorted((k for k in self.kept.values() if k.expires <= now and not k.timer_done),
                        key=lambda k: (k.expires, k.order)):
            if gone >= budget:
                break
            k.timer_done = True
            if self.batch_holding(k.view["id"]):
                event("model: a kept result past its retention stays for its batch")
            elif self.readers(k.view["id"]):
                event("model: a kept result past its retention stays for its live dependents")
            else:
                del self.kept[k.view["id"]]
                gone += 1
        if gone:
            event("model: kept results expired")
        return 200, {**{k: n[k] for k in keys}, "ticks_fired": fired, "key_timers_fired": 0,
                     "results_expired": gone}

    # ---------------------------------------------------------------- batches
    def prepare_batch(self, now: int, kind: str, args: dict, new_ids: list, who):
        """Validation of a batch request (node/base/validate_batch.py) -> what applies it, or the
        refusal: the batch id first, then the callbacks in CALLBACK_KINDS order, then the members."""
        body = args.get("body") or {}
        if kind in ("badd", "bclose", "bcancel"):
            bid = args["batch_id"].lower()
            if kind == "bclose":
                return lambda: self.close_batch(bid)
            if kind == "bcancel":
                return lambda: self.cancel_batch(bid, who)
        else:
            if body.get("timeout_ms", 1) == 0:     # the checks before the id is made (code's order)
                return err("invalid_argument", field="timeout_ms")
            bid = new_ids.pop(0)
            cbs = {}
            for k in CALLBACK_KINDS:
                cb = (body.get("callbacks") or {}).get(k)
                if cb is None:
                    continue
                if "depends_on" in cb:
                    return err("invalid_argument", field=f"callbacks.{k}")
                t, f = self.prepare_job(now, {**cb, "custom": {**(cb.get("custom") or {}), "batch_id": bid}}, new_ids)
                if t == "reject":
                    return err("invalid_argument", field=f"callbacks.{k}", rejection=f)
                cbs[k] = f
        items, refs = [], {}
        for b in body.get("jobs") or ():
            items.append(self.prepare_job(now, b, new_ids, refs))
            if items[-1][0] == "job" and b.get("ref") is not None:
                refs[b["ref"]] = items[-1][1]["id"]
        if any(t == "reject" for t, _ in items):
            return err("batch_rejected", errors=[{"index": i, "rejection": r}
                                                 for i, (t, r) in enumerate(items) if t == "reject"])
        if kind == "badd":
            return lambda: self.add_to_batch(bid, items)
        return lambda: self.open_batch(bid, cbs, not body.get("open", False),  # noqa: E731
                                       body.get("timeout_ms", 3_600_000), items)

    def open_batch(self, bid: str, cbs: dict, close: bool, timeout: int, items: list):
        if len(self.batches) >= self.gv("max_batches"):
            event("model: batch refused, too_many")
            return err("overloaded", reason="too_many", batch_id=bid, limit=self.gv("max_batches"))
        if len(items) > self.gv("max_batch_members"):
            event("model: batch refused, too_many_members")
            return err("overloaded", reason="too_many_members", batch_id=bid, limit=self.gv("max_batch_members"))
        results = []
        if items:
            status, answer = self.enqueue("atomic", items)
            if status != 200:
                return status, answer
            results = answer["results"]
        b = self.batches[bid] = MBatch(bid, cbs, self.clock)
        self.join(b, results)
        if close:
            self.close(b)
        else:
            b.timeout_at = self.clock + timeout
        return 200, {"batch_id": bid, "open": b.open, "results": results}

    def add_to_batch(self, bid: str, items: list):
        b = self.batches.get(bid)
        if b is None:
            return err("not_found", batch_id=bid)
        if not b.open:
            event("model: add to a closed batch")
            return err("failed_precondition", reason="closed", batch_id=bid)
        if self.members(b) + len(items) > self.gv("max_batch_members"):
            event("model: add refused, too_many_members")
            return err("overloaded", reason="too_many_members", batch_id=bid, limit=self.gv("max_batch_members"))
        status, answer = self.enqueue("atomic", items)
        if status != 200:
            return status, answer
        self.join(b, answer["results"])
        return 200, {"batch_id": bid, "open": True, "results": answer["results"]}

    @staticmethod
    def members(b: MBatch) -> int:
        return len(b.pending) + b.succeeded + b.failed + b.removed

    def join(self, b: MBatch, results: list):
        """The jobs made join the batch (a key's hit made none); one dead-lettered as it was made
        (or dropped at once without a store) joins as failed."""
        for r in results:
            if r.get("deduplicated") or "rejection" in r:
                continue
            j = self.jobs.get(r["job_id"])
            if j is None or j.state == "dead_lettered":
                event("model: a member dead-lettered as it was made")
                b.failed += 1
                self.fire_failure(b)
            else:
                b.pending.add(j.id)
                self.batch_of[j.id] = b.id

    def close_batch(self, bid: str):
        """Closing a closed or finished batch answers as closing it did (code's choice)."""
        b = self.batches.get(bid)
        if b is None:
            return err("not_found", batch_id=bid)
        if b.open:
            self.close(b)
        return 200, {"batch_id": bid, "open": False, "results": []}

    def cancel_batch(self, bid: str, who):
        """A finished batch's cancel removes nothing and is audited all the same (code's choice)."""
        b = self.batches.get(bid)
        if b is None:
            return err("not_found", batch_id=bid)
        cancelled, running = [], 0
        for jid in sorted(b.pending):
            if jid not in b.pending:
                continue                  # ended by an earlier removal (dependency_failed)
            j = self.jobs[jid]
            if j.state == "in_flight":
                running += 1
                continue
            self.remove(j)
            cancelled.append(jid)
        if b.open:
            self.close(b)
        self.record(who, "batch_cancel", bid)
        event(f"model: batch cancelled, {min(len(cancelled), 2)} removed, {min(running, 1)} running")
        return 200, {"batch_id": bid, "cancelled": cancelled, "running": running}

    def close(self, b: MBatch):
        b.open, b.timeout_at = False, None
        if not b.pending:
            self.finish(b)

    def member_ended(self, jid: str, how: str):
        b = self.batches[self.batch_of.pop(jid)]
        event(f"model: a member {how} ({'open' if b.open else 'closed'} batch)")
        b.pending.discard(jid)
        setattr(b, how, getattr(b, how) + 1)
        if how == "succeeded" and jid in self.kept:
            b.kept.add(jid)
        if how == "failed":
            self.fire_failure(b)
        if not b.open and not b.pending:
            self.finish(b)

    def fire_failure(self, b: MBatch):
        if "on_failure" in b.callbacks and "on_failure" not in b.fired:
            self.fire(b, "on_failure")

    def finish(self, b: MBatch):
        event(f"model: a batch finished ({'failed' if b.failed else 'removed' if b.removed else 'succeeded'})")
        b.finished_at = self.clock
        if "on_complete" in b.callbacks:
            self.fire(b, "on_complete")
        if "on_success" in b.callbacks and b.failed == 0 and b.removed == 0:
            self.fire(b, "on_success")
        b.expires = self.clock + FINISHED_RETENTION_MS

    def fire(self, b: MBatch, kind: str):
        """A callback: a job made past its queue's depth; a key's hit makes none and the view's
        job_id is then null (code's choice)."""
        event(f"model: callback {kind}")
        r = self.enqueue_one(b.callbacks[kind], False)
        b.fired[kind] = None if r.get("deduplicated") else r["job_id"]
        self.callback_jobs[(b.id, kind)] += 1

    def batch_holding(self, jid: str):
        """The batch that holds job `jid`'s record, or None."""
        for b in self.batches.values():
            if jid in b.kept:
                return b.id
        return None

    def batch_timers(self, now: int, budget: int):
        """The sweep's first step: open batches past their timeout closed, finished ones past
        their hour dropped (with the records they held, unless these are held otherwise), by
        (time, batch id), at most `budget`, before every other step and not in the answer (code's
        choice)."""
        due = sorted([(b.timeout_at, b.id) for b in self.batches.values() if b.open and b.timeout_at <= now]
                     + [(b.expires, b.id) for b in self.batches.values()
                        if b.finished_at is not None and b.expires <= now])[:budget]
        for _, bid in due:
            b = self.batches[bid]
            if b.open:
                event("model: an open batch's timeout closed it")
                self.close(b)
                continue
            event("model: a finished batch dropped")
            del self.batches[bid]
            for jid in sorted(b.kept):
                k = self.kept.get(jid)
                if k is not None and k.expires <= self.clock and not self.readers(jid):
                    del self.kept[jid]

    def batch_view(self, bid: str):
        b = self.batches.get(bid)
        if b is None:
            return None
        state = "open" if b.open else "closed" if b.finished_at is None else "finished"
        return {"id": b.id, "state": state, "created_at_ms": b.created_at, "finished_at_ms": b.finished_at,
                "members": self.members(b), "pending": len(b.pending), "succeeded": b.succeeded,
                "failed": b.failed, "removed": b.removed, "pending_ids": sorted(b.pending)[:100],
                "callbacks": {k: {"fired": k in b.fired, "job_id": b.fired.get(k)} for k in sorted(b.callbacks)}}

    # ---------------------------------------------------------------- schedules
    def prepare_schedule(self, body: dict):
        """A PUT body -> ("ok", definition, expect_version) or ("invalid", field): only the checks
        my generator can fail (an interval under 1 s, an end before the start), and the defaults
        (catchup one, misfire 5 s, window 1 h, overlap allow, UTC). The job template's priority and
        max_attempts are settled now, as an enqueue's would be, with the configuration in force. A
        field sent as null is taken as left out."""
        body = {k: v for k, v in body.items() if v is not None}
        every, spec = body.get("every_ms"), body.get("cron")
        if spec is None and every < 1000:
            return "invalid", "every_ms"
        start, end = body.get("start_at_ms"), body.get("end_at_ms")
        if start is not None and end is not None and end < start:
            return "invalid", "end_at_ms"
        job = body["job"]
        q = job["queue"]
        prio = job.get("priority")
        if prio is None:
            prio = self.qv(q, "default_priority")
        ma = job.get("max_attempts")
        if ma is None:
            ma = self.qv(q, "default_max_attempts")
        template = {"queue": q, "job_type": job["job_type"], "payload": job.get("payload"), "priority": prio,
                    "max_attempts": min(ma, self.qv(q, "max_attempts_ceiling")), "custom": job.get("custom") or None,
                    "deadline_after_ms": job.get("deadline_after_ms")}
        d = {"cron": spec, "time_zone": body.get("time_zone", "UTC") if spec is not None else None, "every_ms": every,
             "start_at_ms": start, "end_at_ms": end, "max_count": body.get("max_count"),
             "catchup": body.get("catchup", "one"), "catchup_window_ms": body.get("catchup_window_ms", 3_600_000),
             "misfire_after_ms": body.get("misfire_after_ms", 5000), "overlap": body.get("overlap", "allow"),
             "paused": body.get("paused", False), "job": template}
        return "ok", d, body.get("expect_version")

    def rule_ticks(self, s: MSched, lo: int, hi: int) -> range:
        """Every tick of s's rule in (lo, hi] within its start and end, oldest first: an interval's
        at anchor + k * every_ms, k >= 1 (the anchor: the schedule's creation clock, kept by a
        replace; with start_at_ms, start_at_ms - every_ms, so the first is at the start); the only
        cron rule drawn, "* * * * *" in UTC, at every whole minute. All of them as a range, cut to
        (lo, hi], start and end by bisection (a range, not a list: tick_to_due may jump 30 days)."""
        d = s.d
        if d["every_ms"] is not None:
            anchor = s.created_at if d["start_at_ms"] is None else d["start_at_ms"] - d["every_ms"]
            ticks = range(anchor + d["every_ms"], hi + 1, d["every_ms"])
        else:
            assert d["cron"] == "* * * * *" and d["time_zone"] == "UTC", d
            ticks = range(lo - lo % MINUTE, hi + 1, MINUTE)
        first = max(lo + 1, d["start_at_ms"] if d["start_at_ms"] is not None else lo + 1)
        last = min(hi, d["end_at_ms"] if d["end_at_ms"] is not None else hi)
        return ticks[bisect_left(ticks, first):bisect_right(ticks, last)]

    def next_tick(self, s: MSched, after: int):
        """The first tick after `after`, or None: past the end, or max_count ticks fired."""
        d = s.d
        if d["max_count"] is not None and s.fired >= d["max_count"]:
            return None
        period = d["every_ms"] if d["every_ms"] is not None else MINUTE
        start = d["start_at_ms"] if d["start_at_ms"] is not None else after
        ticks = self.rule_ticks(s, after, max(after, start) + period)     # holds the first one, if any
        return ticks[0] if ticks else None

    def plan(self, s: MSched, next_fire):
        s.next_fire = next_fire
        if next_fire is not None and not s.paused:
            self.stamps += 1
            s.stamp = self.stamps

    def due_ticks(self, s: MSched, now: int) -> list[int]:
        """The ticks a sweep at `now` fires for s, oldest first: those late by at most
        misfire_after_ms always; of the missed ones before: none (skip), the latest (one), or those
        within catchup_window_ms of now (a tick exactly at its edge counts: code's choice), oldest
        first, at most max_catchup_ticks (all)."""
        d = s.d
        cutoff = now - d["misfire_after_ms"]
        pending = self.rule_ticks(s, s.next_fire - 1, now)           # every tick not yet decided
        on_time = pending[bisect_left(pending, cutoff):]
        missed = pending[:bisect_left(pending, cutoff)]
        if missed:
            event(f"model: missed ticks, catchup {d['catchup']}")
        if d["catchup"] == "skip":
            missed = []
        elif d["catchup"] == "one":
            missed = missed[-1:]
        else:
            within = missed[bisect_left(missed, now - d["catchup_window_ms"]):]
            if len(within) > self.gv("max_catchup_ticks"):
                event("model: catch-up capped by max_catchup_ticks")
            missed = within[:self.gv("max_catchup_ticks")]
        return list(missed) + list(on_time)

    def fire_ticks(self, now: int) -> int:
        """The sweep's last step: the schedules with a due tick, by next tick then by when they were
        planned, at most max_schedules_per_sweep of them; each fires its due ticks (up to its
        max_count) and plans its next tick after now."""
        budget = self.gv("max_schedules_per_sweep")
        self.born_late = False
        due = sorted((s for s in self.scheds.values()
                      if not s.paused and s.next_fire is not None and s.next_fire <= now),
                     key=lambda s: (s.next_fire, s.stamp))
        self.tick_budget_used = len(due) >= budget
        if len(due) > budget:
            event("model: schedules left to the next sweep (max_schedules_per_sweep)")
        fired = 0
        for s in due[:budget]:
            for tick in self.due_ticks(s, now):
                if s.d["max_count"] is not None and s.fired >= s.d["max_count"]:
                    event("model: max_count reached within a sweep")
                    break
                fired += self.fire_tick(s, tick)
            self.plan(s, self.next_tick(s, now))
        return fired

    def fire_tick(self, s: MSched, tick: int) -> int:
        prev = self.jobs.get(s.last_job_id) if s.last_job_id is not None else None
        if prev is not None and s.d["overlap"] == "skip" and prev.state in ("ready", "scheduled", "in_flight"):
            event("model: tick skipped (overlap skip)")
            s.skipped += 1
            return 0
        # "Waiting and never delivered" is the replace duplicate policy's test: ready or scheduled on
        # attempt 1 (a requeued dead letter is attempt 1 again) (code's choice).
        if prev is not None and s.d["overlap"] == "replace" and prev.state in ("ready", "scheduled") \
                and prev.attempt == 1:
            event("model: tick replaced the previous job (overlap replace)")
            self.remove(prev)
        if self.enqueue_template(s, job_id_of(s.name, s.incarnation, tick), tick, f"schedule:{s.name}:{tick}") is None:
            return 0
        if s.d["cron"] is not None:
            event("model: a cron tick fired")
        s.fired += 1
        s.last_tick, s.last_fired_at = tick, self.clock
        return 1

    def enqueue_template(self, s: MSched, jid: str, tick: int, key):
        """The template's job through the model's enqueue (ready now, depth checked, the key's
        record returned when live); its id, or None with last_error saying why."""
        t = s.d["job"]
        if jid in self.jobs:
            s.last_error = "id_in_use"
            return None
        custom = dict(t["custom"] or {})
        custom["raftq.schedule"], custom["raftq.tick_ms"] = s.name, tick
        after = t["deadline_after_ms"]
        r = self.enqueue_one(dict(id=jid, queue=t["queue"], job_type=t["job_type"], payload=t["payload"],
                                  priority=t["priority"], custom=custom, trace=None, scheduled_at=None,
                                  max_attempts=t["max_attempts"], deadline=None if after is None else tick + after,
                                  key=key), check_depth=True)
        if "rejection" in r:
            event(f"model: schedule job refused ({r['rejection']['reason']})")
            s.last_error = r["rejection"]["reason"]
            return None
        if r["deduplicated"]:
            event("model: schedule job found by its idempotency key")
        else:
            self.made_ids.append(jid)
            if after is not None and tick + after <= self.clock:
                event("model: a tick's job made past its deadline")
                self.born_late = True
        s.last_job_id, s.last_error = r["job_id"], None
        return r["job_id"]

    def put_schedule(self, name: str, d: dict, expect, who=None):
        s = self.scheds.get(name)
        have = s.version if s is not None else 0
        if expect is not None and expect != have:
            return err("failed_precondition", name=name, version=have)
        if s is None and len(self.scheds) >= self.gv("max_schedules"):
            return err("overloaded", reason="too_many", limit=self.gv("max_schedules"))
        if s is None:
            inc = self.incarnation_of(name)
            assert inc not in self.incarnations, f"schedule {name!r} re-created with an old incarnation {inc}"
            self.incarnations.add(inc)
            s = self.scheds[name] = MSched(name=name, d=d, version=0, incarnation=inc, created_at=self.clock)
        else:
            event("model: schedule replaced")
        s.d, s.version, s.updated_at, s.paused, s.last_error = d, have + 1, self.clock, d["paused"], None
        # The next tick is the first after now: a replace never catches up (its fired count, last
        # tick and job stay). The answer shows it even when paused, the view shows none (code's choice).
        self.plan(s, self.next_tick(s, self.clock))
        self.record(who, "schedule_create" if have == 0 else "schedule_replace", name)
        return 200, {"name": name, "version": have + 1, "created": have == 0,
                     "next_fire_at_ms": None if s.paused else s.next_fire}

    def delete_schedule(self, name: str, expect, who=None):
        s = self.scheds.get(name)
        if s is None:
            return err("not_found", name=name)
        if expect is not None and expect != s.version:
            return err("failed_precondition", name=name, version=s.version)
        del self.scheds[name]
        self.record(who, "schedule_delete", name)
        return 200, {"name": name, "deleted": True}

    def pause_schedule(self, name: str, paused: bool, who=None):
        s = self.scheds.get(name)
        if s is None:
            return err("not_found", name=name)
        if s.paused != paused:
            s.paused, s.version, s.updated_at = paused, s.version + 1, self.clock
            self.plan(s, self.next_tick(s, self.clock))        # resumed: no catch-up of the pause
            self.record(who, "schedule_pause" if paused else "schedule_resume", name)
        return 200, {"name": name, "paused": paused, "version": s.version}

    def trigger_schedule(self, name: str, jid: str, who=None):
        """One extra job now (tick field: the clock; no key, no overlap, no count)."""
        s = self.scheds.get(name)
        if s is None:
            return err("not_found", name=name)
        before = s.last_error
        made = self.enqueue_template(s, jid, self.clock, None)
        if made is None:
            # A refused trigger leaves the schedule as it was, last_error too; the rejection names
            # the reason and the queue only (code's choice: no `limit`, unlike an enqueue's).
            why, s.last_error = s.last_error, before
            return err("rejected", rejection={"reason": why, "queue": s.d["job"]["queue"]})
        self.record(who, "schedule_trigger", name)
        return 200, {"name": name, "job_id": made}

    def schedule_view(self, name: str):
        s = self.scheds.get(name)
        if s is None:
            return None
        d, t = s.d, s.d["job"]
        last = self.jobs.get(s.last_job_id) if s.last_job_id is not None else None
        out = {"name": name, "version": s.version}
        out.update({k: d[k] for k in ("cron", "time_zone", "every_ms", "start_at_ms", "end_at_ms", "max_count",
                                      "catchup", "catchup_window_ms", "misfire_after_ms", "overlap")})
        out["job"] = {"queue": t["queue"], "job_type": t["job_type"],
                      "payload": None if t["payload"] is None else dict(t["payload"]),
                      "priority": t["priority"], "max_attempts": t["max_attempts"], "custom": dict(t["custom"] or {}),
                      "timeout_ms": None, "resource": None, "deadline_after_ms": t["deadline_after_ms"]}
        out.update({"paused": s.paused, "next_fire_at_ms": None if s.paused else s.next_fire,
                    "last_tick_at_ms": s.last_tick, "last_fired_at_ms": s.last_fired_at, "last_job_id": s.last_job_id,
                    "last_job_state": None if s.last_job_id is None else last.state if last is not None else "finished",
                    "fired": s.fired, "skipped": s.skipped, "last_error": s.last_error,
                    "created_at_ms": s.created_at, "updated_at_ms": s.updated_at})
        return out

    # ---------------------------------------------------------------- reads
    def stats(self, q: str):
        declared = q in self.qconf
        if q not in self.known_queues and not declared:
            return None
        t = self.total(q)
        # `waiting` and the cause dependency_failed only while there are some
        waiting = {"waiting": len(self.in_queue(q, "waiting"))} if self.in_queue(q, "waiting") else {}
        failed = sum(1 for d in self.dead if d.cause == "dependency_failed" and self.jobs[d.id].queue == q)
        return {**waiting, "name": q, "declared": declared, "paused": q in self.paused,
                "ready": len(self.in_queue(q, "ready")), "scheduled": len(self.in_queue(q, "scheduled")),
                "in_flight": len(self.in_queue(q, "in_flight")),
                "dead_lettered": len(self.in_queue(q, "dead_lettered")),
                "enqueued": t["enqueued"], "acked": t["acked"], "nacked": t["nacked"],
                "dead_lettered_total": t["dead_total"], "expired_total": t["expired"],
                "dead_lettered_by_cause": {**{c: sum(1 for d in self.dead
                                                     if d.cause == c and self.jobs[d.id].queue == q)
                                              for c in ("attempts_exhausted", "rejected", "lease_expired", "admin",
                                                        "expired")},
                                           **({"dependency_failed": failed} if failed else {})},
                # gating: the model uses no resource, breaker or window
                "throttled": 0, "throttle_deferred_total": 0, "circuit": None, "window_open": True,
                "keys": 0, "keys_at_limit": 0, "ready_held_by_keys": 0}

    def view(self, jid: str):
        j = self.jobs.get(jid)
        if j is None:
            return self.kept_view(jid) if jid in self.kept else None
        out = self.render(j)
        out["timeout_ms"] = None            # the model uses no timeouts and no releases
        out["releases"] = 0
        out["state"] = j.state
        out["last_reason"] = j.last_reason
        if j.state == "scheduled":
            out["run_at_ms"] = j.run_at
        if j.state == "waiting":
            out["waiting_on"] = sorted(j.waiting_on)
        if j.state != "in_flight":
            out["lease_expires_at_ms"] = None
        return out

    def listing(self, q: str, state: str) -> list[str]:
        key = {"ready": lambda j: (-j.priority, j.enqueued_at, j.order),
               "scheduled": lambda j: (j.run_at, j.order),
               "in_flight": lambda j: (j.lease_expires, j.order)}[state]
        return [j.id for j in sorted(self.in_queue(q, state), key=key)]

    def dead_records(self, q=None) -> list:
        return [self.render_dead(d) for d in self.dead if q is None or self.jobs[d.id].queue == q]

    def counts(self) -> dict:
        kept = ({"retained_jobs": len(self.kept), "retained_result_bytes": sum(k.size for k in self.kept.values())}
                if self.kept else {})
        waiting = sum(1 for j in self.jobs.values() if j.state == "waiting")
        return {"jobs": len(self.jobs), "dead_letters": len(self.dead), "dedup_records": len(self.dedup), **kept,
                **({"waiting_jobs": waiting} if waiting else {}),
                **({"batches": len(self.batches)} if self.batches else {}),
                "request_ids": len(self.rids), "audit_entries": len(self.audit), "schedules": len(self.scheds),
                "clock_ms": self.clock}

    def pending_times(self) -> dict[str, list[int]]:
        """Every instant at which something falls due (sweep work, or a dedup / request-id
        window end that changes an answer), by kind."""
        return {
            "schedule": [j.run_at for j in self.jobs.values() if j.state == "scheduled"],
            "lease": [j.lease_expires for j in self.jobs.values() if j.state == "in_flight"],
            "deadline": [j.deadline for j in self.jobs.values()
                         if j.state in ("ready", "scheduled", "waiting") and j.deadline is not None],
            "dedup": [e for _, e in self.dedup.values()],
            "request id": [e for _, _, _, e, _ in self.rids.values()],
            "retention": [d.failed_at + self.retention for d in self.dead] if self.retention > 0 else [],
            "audit": [e["at"] + self.audit_retention for e in self.audit],
            "tick": [s.next_fire for s in self.scheds.values() if not s.paused and s.next_fire is not None],
            "result": [k.expires for k in self.kept.values() if not k.timer_done],
            "batch": [b.timeout_at if b.open else b.expires for b in self.batches.values()
                      if b.open or b.finished_at is not None],
        }

    def next_due(self):
        due = [t for times in self.pending_times().values() for t in times]
        return min(due) if due else None


# ====================================================================================== harness

def check_machine(m, model) -> None:
    """m.check_invariants() (a replace that lowers max_count below `fired` is a legal state: the
    counters stay and no tick fires more, which the machine's invariant allows)."""
    m.check_invariants()


def norm(x):
    """Results as comparable plain data; error and rejection `message` texts are prose and left out."""
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if k in ("error", "rejection") and isinstance(v, dict):
                v = {kk: vv for kk, vv in v.items() if kk != "message"}
            out[k] = norm(v)
        return out
    if isinstance(x, (list, tuple)):
        return [norm(v) for v in x]
    return x


def outcome(kind: str, result) -> str:
    """A label for --hypothesis-show-statistics: what the step exercised."""
    status, body = result
    if status != 200:
        return f"{kind}: {body['error']['code']}"
    if kind == "reserve":
        return f"reserve: {min(len(body['jobs']), 2)} jobs"
    if kind == "nack":
        return f"nack: dead_lettered={body['dead_lettered']}"
    if kind in ("enqueue", "batch", "atomic"):
        rs = body.get("results", [body])
        return f"{kind}: " + ",".join(sorted({"rejected" if "rejection" in r else
                                              "dedup" if r["deduplicated"] else "new" for r in rs}))
    if kind == "sweep":
        return "sweep: " + (",".join(k for k, v in body.items() if v) or "nothing")
    if kind == "drain":
        return f"drain: {min(len(body['records']), 2)} records"
    if kind in ("requeue", "dldel"):
        return f"{kind}: {'hit' if body.get('requeued') or body.get('deleted') else 'all missing'}"
    if kind == "acks":
        return "acks: " + ",".join(sorted({r.get("error", {}).get("code", "ok") for r in body["results"]}))
    return f"{kind}: ok"


def build_command(kind: str, args: dict, rid, limits: Limits, now: int, new_id, who=None):
    """The leader's side: request -> command (may raise ApiError), with the request-id slot the
    node makes (node/base/validate.py request_slot: caller, id, route, request hash)."""
    if rid is not None:
        param, body = request_of(kind, args)
        rid = C.request_slot(who, rid, route_of(kind, args), body, param)
    if kind == "enqueue":
        return C.enqueue(args["body"], limits, now, new_id, rid=rid)
    if kind == "batch":
        return C.enqueue_batch(args["body"], limits, now, new_id, rid=rid)
    if kind == "atomic":
        return C.enqueue_atomic(args["body"], limits, now, new_id, rid=rid)
    if kind == "reserve":
        cmd, wait = C.reserve(args["body"], limits, rid=rid)
        assert wait == 0
        return cmd
    if kind == "ack":
        return C.ack(args["job_id"], args["body"], rid=rid, limits=limits)
    if kind == "acks":
        return C.ack_batch(args["body"], limits, rid=rid)
    if kind == "nack":
        return C.nack(args["job_id"], args["body"], rid=rid)
    if kind == "extend":
        return C.extend(args["job_id"], args["body"], rid=rid)
    if kind == "drain":
        return C.drain(args["body"], limits, rid=rid, who=who)
    if kind == "requeue":
        return C.requeue(args["body"], rid=rid, who=who)
    if kind == "dldel":
        return C.delete_dead_letters(args["body"], rid=rid, who=who)
    if kind == "cancel":
        return C.cancel(args["job_id"], rid=rid, who=who, cascade=args.get("cascade"))
    if kind == "pause":
        return C.pause(args["queue"], args["paused"], limits, rid=rid, body=args.get("body"), who=who)
    if kind == "move":
        return C.move_to_dead_letters(args["queue"], args["body"], limits, rid=rid, who=who)
    if kind == "purge":
        return C.purge(args["queue"], limits, rid=rid, who=who)
    if kind == "qdel":
        return C.delete_queue(args["queue"], limits, rid=rid, who=who)
    if kind == "config":
        return C.configure(args["body"], rid=rid, who=who)
    if kind == "keyadd":
        return C.add_key(args["body"], rid=rid, who=who)
    if kind == "keydel":
        return C.remove_key(args["name"], rid=rid, who=who)
    if kind == "sweep":
        return C.sweep()
    if kind == "sput":
        return VS.put(args["name"], args["body"], limits, now, rid=rid, who=who)
    if kind == "sdel":
        return VS.delete(args["name"], args["expect"], rid=rid, who=who)
    if kind == "spause":
        return VS.pause(args["name"], args["paused"], rid=rid, who=who)
    if kind == "strig":
        return VS.trigger(args["name"], new_id, rid=rid, who=who)
    if kind == "bopen":
        return VB.open_batch(args["body"], limits, now, new_id, rid=rid)
    if kind == "badd":
        return VB.add(args["batch_id"], args["body"], limits, now, new_id, rid=rid)
    if kind == "bclose":
        return VB.close(args["batch_id"], rid=rid)
    if kind == "bcancel":
        return VB.cancel(args["batch_id"], rid=rid, who=who)
    raise AssertionError(kind)


@st.composite
def job_bodies(draw, now: int):
    body = {"queue": draw(st.sampled_from(NAMES)), "job_type": draw(st.sampled_from(("t1", "t2")))}
    body.update(draw(st.fixed_dictionaries({}, optional={
        "priority": st.sampled_from((0, 1, 5, 9)),
        "idempotency_key": st.sampled_from(("k1", "k2", "k3")),
        "max_attempts": st.integers(1, 3),
        "payload": st.binary(min_size=1, max_size=4).map(
            lambda b: {"data_b64": b64(b), "encoding": "application/octet-stream"}),
        "custom": st.dictionaries(st.sampled_from(("x", "y")),
                                  st.one_of(st.integers(-5, 5), st.text(max_size=3), st.booleans()), max_size=2),
        "trace_context": st.sampled_from(({"traceparent": "00-aa-bb-01"},
                                          {"traceparent": "00-cc-dd-01", "tracestate": "k=v"})),
        "deadline_at_ms": st.sampled_from((-100, 0, 400, 2500, 9000, 60_000)).map(lambda d: now + d),
    })))
    sched = draw(st.sampled_from(("none", "none", "delay", "at")))
    if sched == "delay":
        body["delay_ms"] = draw(st.sampled_from((0, 300, 2000, 12000, 30000)))
    elif sched == "at":
        body["scheduled_at_ms"] = now + draw(st.sampled_from((-1500, 0, 1000, 5000, 25000)))
    return body


@st.composite
def schedule_bodies(draw, now: int):
    """A PUT /v1/schedules/{name} body: mostly an interval (500 ms is refused), sometimes the
    every-minute cron rule (the clock steps here are seconds, and tick_to_due jumps to its minutes).
    The policies are mostly explicit; start, end and max_count are rarer, so most schedules keep
    ticking (an end before the start is refused)."""
    if draw(st.integers(0, 7), label="cron?") == 0:
        body = {"cron": "* * * * *"}
        if draw(st.booleans(), label="explicit UTC"):
            body["time_zone"] = "UTC"
    else:
        body = {"every_ms": draw(st.sampled_from((1000, 1000, 1000, 2500, 4000) * 4 + (500,)), label="every_ms")}
    optional = {
        "start_at_ms": st.sampled_from((None, None, None, -4000, 0, 1500, 7000)),
        "end_at_ms": st.sampled_from((None, None, None, None, None, -1000, 2000, 6000, 20_000, 60_000)),
        "max_count": st.sampled_from((None, None, None, None, 1, 2, 4, "null")),
        "catchup": st.sampled_from((None, "skip", "one", "all", "null")),
        "catchup_window_ms": st.sampled_from((None, None, 1500, 5000, 60_000)),
        "misfire_after_ms": st.sampled_from((None, 0, 0, 2000)),
        "overlap": st.sampled_from((None, "allow", "skip", "skip", "replace", "replace")),
        "paused": st.sampled_from((None,) * 10 + (True, False)),
    }
    for key, values in optional.items():
        v = draw(values, label=key)
        if v is not None:
            body[key] = None if v == "null" else v              # null: as if left out
    if "start_at_ms" in body:
        body["start_at_ms"] += now
    if "end_at_ms" in body:
        body["end_at_ms"] += body.get("start_at_ms", now)         # -1000 after a start: refused
    job = {"queue": draw(st.sampled_from(NAMES), label="template queue"), "job_type": "tick"}
    job.update(draw(st.fixed_dictionaries({}, optional={
        "priority": st.sampled_from((0, 5, 9)),
        "max_attempts": st.integers(1, 3),
        "deadline_after_ms": st.sampled_from((300, 2500, 8000)),
        "payload": st.binary(min_size=1, max_size=3).map(
            lambda b: {"data_b64": b64(b), "encoding": "application/octet-stream"}),
        "custom": st.dictionaries(st.sampled_from(("x", "y")), st.one_of(st.integers(-5, 5), st.booleans()),
                                  max_size=2),
    })))
    body["job"] = job
    return body


class CoreModel(RuleBasedStateMachine):

    @initialize(config=st.sampled_from(range(len(CONFIGS))))
    def setup(self, config):
        _, lim, sto, qs = CONFIGS[config]
        self.limits = build_limits(config)          # the bootstrap: version 0
        self.m = QueueMachine(self.limits)
        self.model = Model(lim, sto, qs)
        # code's choice: a new schedule's incarnation (its job ids' namespace) is the machine's
        self.model.incarnation_of = lambda name: getattr(self.m.schedules.get(name), "incarnation", None)
        self.history: list = []                     # (now, commands, answers) of every batch
        self.rid_origin: dict = {}                  # request id -> (who, kind, args) of its first use
        self.now = T0
        self.ids_given = 0
        self.all_ids: list[str] = []
        self.rids_used: dict[str, list[str]] = {}     # kind -> request ids used with it
        self.rid_count = 0
        self.requests = 0
        self.batch_ids: list[str] = []              # every batch opened (their views compared for life)

    # ---------------------------------------------------------------- plumbing
    def run(self, reqs: list, data=None):
        """Validate every request at the leader's `now` (with the configuration in force, as the
        leader has applied it), apply the valid ones as one batch (one Raft entry), and compare
        each answer with the model's. Each request comes from a caller (`who`); a replayed
        request id is mostly a client's retry: the same caller, the same request."""
        self.requests += len(reqs)
        cmds, slots, id_lists, whos = [], [], [], []
        reqs = list(reqs)
        for n, (kind, args, rid) in enumerate(reqs):
            who = data.draw(st.sampled_from(WHO), label="who") if data is not None else None
            origin = self.rid_origin.get(rid) if rid is not None else None
            if origin is not None and data is not None and data.draw(st.integers(0, 3), label="a retry?") > 0:
                who = origin[0]
                if origin[1] == kind:
                    args = origin[2]
                    reqs[n] = (kind, args, rid)
            elif rid is not None and origin is None:
                self.rid_origin[rid] = (who, kind, args)
            whos.append(who)
            given: list[str] = []

            def new_id(given=given):
                self.ids_given += 1
                given.append(counter_id(self.ids_given))
                return given[-1]
            try:
                slots.append(("cmd", len(cmds)))
                cmds.append(build_command(kind, args, rid, self.m.limits, self.now, new_id, who))
            except ApiError as e:
                slots[-1] = ("pre", e.result)
            id_lists.append(given)
            self.all_ids.extend(given)
        results = self.m.apply_batch(self.now, cmds) if cmds else []
        if cmds:
            self.history.append((self.now, cmds, results))
        answers = []
        for (kind, args, rid), (how, v), given, who in zip(reqs, slots, id_lists, whos):
            got = results[v] if how == "cmd" else v
            answers.append(got)
            want = self.model.handle(self.now, kind, args, rid, list(given), who)
            self.all_ids.extend(self.model.made_ids)          # jobs a schedule made: viewed like the rest
            self.model.made_ids.clear()
            assert norm(got) == norm(want), f"{kind} {args} rid={rid} who={who}\n machine: {got}\n model:   {want}"
            event(outcome(kind, got))
            if kind == "reserve" and got[0] == 200:
                self.check_reserved(got[1]["jobs"])
        return answers

    def check_reserved(self, jobs: list):
        """No job is reserved before every dependency it names has ended (acked, dead-lettered
        or removed), unless an operator requeued it from the dead letters."""
        for job in jobs:
            mj = self.model.jobs.get(job["id"])
            if job.get("depends_on") and mj is not None and not mj.requeued:
                event("reserved a job with dependencies")
                assert all(d["job_id"] in self.model.ended_ids for d in job["depends_on"]), job

    def rid(self, data, kind: str):
        """No request id, a fresh one, or a replay: mostly of the same endpoint (a client's
        retry), sometimes of another one (a client bug)."""
        c = data.draw(st.integers(0, 19), label="rid choice")
        same = self.rids_used.get(kind, [])
        every = [r for rs in self.rids_used.values() for r in rs]
        if c <= 11:
            return None
        if c <= 16 and same:
            return data.draw(st.sampled_from(same), label="replayed rid")
        if c == 19 and every:
            return data.draw(st.sampled_from(every), label="reused rid")
        self.rid_count += 1
        rid = f"rid-{self.rid_count}"
        self.rids_used.setdefault(kind, []).append(rid)
        return rid

    def pick_id(self, data, prefer: tuple = ("in_flight",)):
        pool = [j.id for j in self.model.jobs.values() if j.state in prefer]
        how = data.draw(st.sampled_from(("preferred", "preferred", "preferred", "any", "unknown")), label="id kind")
        if how == "preferred" and pool:
            jid = data.draw(st.sampled_from(pool), label="id")
        elif how != "unknown" and self.all_ids:
            jid = data.draw(st.sampled_from(self.all_ids), label="id")
        else:
            jid = UNKNOWN_ID
        return jid.upper() if data.draw(st.integers(0, 15), label="upper") == 0 else jid

    def pick_attempt(self, data, jid: str) -> int:
        j = self.model.jobs.get(jid.lower())
        cur = j.attempt if j is not None else 1
        return data.draw(st.sampled_from((cur, cur, cur, cur + 1, max(1, cur - 1), 3)), label="attempt")

    # ---------------------------------------------------------------- request makers
    def job_body(self, data, refs=None) -> dict:
        """An EnqueueRequest; `refs`, in a batch, the refs of its earlier jobs."""
        body = data.draw(job_bodies(self.now))
        if data.draw(st.integers(0, 9), label="depends_on?") < (5 if refs else 3):
            body["depends_on"] = self.depends_on(data, refs)
        if self.model.dedup and data.draw(st.integers(0, 3), label="reuse a key?") == 0:
            # the (queue, key) of a dedup record, live or past its window
            body["queue"], body["idempotency_key"] = data.draw(st.sampled_from(sorted(self.model.dedup)), label="key")
        ticks = sorted((s.d["job"]["queue"], f"schedule:{s.name}:{s.next_fire}") for s in self.model.scheds.values()
                       if s.next_fire is not None)
        if ticks and data.draw(st.integers(0, 5), label="a tick's key?") == 0:
            # the user enqueues a coming tick's job himself: the tick finds it by its key
            body["queue"], body["idempotency_key"] = data.draw(st.sampled_from(ticks), label="tick key")
        return body

    def depends_on(self, data, refs) -> list:
        """1 to 3 dependencies: jobs live, dead-lettered, kept, gone or unknown, or (in a batch)
        earlier jobs by ref, or a ref to nothing (refused); each a bare id (success) or an object
        with or without a policy. Mostly no job twice (refused)."""
        m = self.model
        pools = {"live": [j.id for j in m.jobs.values() if j.state != "dead_lettered"],
                 "dead": [d.id for d in m.dead], "kept": list(m.kept), "any": self.all_ids, "unknown": [UNKNOWN_ID]}
        entries = []
        for _ in range(data.draw(st.integers(1, 3), label="dependencies")):
            kind = data.draw(st.sampled_from(("live",) * 5 + ("dead", "dead", "kept", "kept", "any", "unknown")
                                             + (("ref",) * 6 if refs else ()) + ("no ref",)), label="dependency")
            policy = data.draw(st.sampled_from((None, "success", "success", "complete", "ignore")), label="policy")
            if kind in ("ref", "no ref"):
                entry = {"ref": data.draw(st.sampled_from(refs), label="ref") if kind == "ref" else "nothing"}
            else:
                pool = pools[kind] or pools["any"] or pools["unknown"]
                jid = data.draw(st.sampled_from(pool), label="dependency id")
                if data.draw(st.integers(0, 15), label="upper") == 0:
                    jid = jid.upper()
                if policy is None and data.draw(st.booleans(), label="bare id"):
                    entries.append(jid)
                    continue
                entry = {"job_id": jid}
            if policy is not None:
                entry["policy"] = policy
            entries.append(entry)
        if data.draw(st.integers(0, 7), label="a job twice?") > 0:
            seen, kept = set(), []
            for e in entries:
                name = (e if isinstance(e, str) else e.get("job_id", "ref:" + e.get("ref", ""))).lower()
                if name not in seen:
                    seen.add(name)
                    kept.append(e)
            entries = kept
        return entries

    def mk_enqueue(self, data):
        return "enqueue", {"body": self.job_body(data)}, self.rid(data, "enqueue")

    def mk_batch(self, data, atomic=False):
        """A batch whose jobs mostly name themselves (ref) for later ones to depend on."""
        jobs, refs = [], []
        for i in range(data.draw(st.integers(1, 4), label="batch size")):
            jobs.append(self.job_body(data, refs))
            if data.draw(st.integers(0, 2), label="ref?") > 0:
                jobs[-1]["ref"] = f"r{i}"
                refs.append(f"r{i}")
        kind = "atomic" if atomic else "batch"
        return kind, {"body": {"jobs": jobs}}, self.rid(data, kind)

    def mk_reserve(self, data):
        body = {"queues": data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3)),
                "lease_ms": data.draw(st.sampled_from((1, 400, 1500, 5000, 100_000)))}
        if data.draw(st.booleans()):
            body["max_jobs"] = data.draw(st.integers(1, 4))
        return "reserve", {"body": body}, self.rid(data, "reserve")

    def ack_body(self, data, attempt: int) -> dict:
        """An ack's body: mostly without a result, else one of 1 to 5 bytes (the configs' bounds
        are 3, 6 and 8 bytes)."""
        n = data.draw(st.sampled_from((0, 0, 1, 2, 3, 5)), label="result bytes")
        return {"attempt": attempt} if n == 0 else \
            {"attempt": attempt, "result": {"data_b64": b64(b"r" * n), "encoding": "text/plain"}}

    def mk_ack(self, data):
        jid = self.pick_id(data)
        return "ack", {"job_id": jid, "body": self.ack_body(data, self.pick_attempt(data, jid))}, self.rid(data, "ack")

    def mk_acks(self, data):
        acks = []
        for _ in range(data.draw(st.integers(1, 3))):
            jid = self.pick_id(data)
            acks.append({"job_id": jid, **self.ack_body(data, self.pick_attempt(data, jid))})
        return "acks", {"body": {"acks": acks}}, self.rid(data, "acks")

    def mk_nack(self, data, jid=None, attempt=None):
        jid = jid or self.pick_id(data)
        body = {"attempt": attempt or self.pick_attempt(data, jid)}
        reason = data.draw(st.sampled_from((None, "", "boom", "again")))
        if reason is not None:
            body["reason"] = reason
        retry = data.draw(st.sampled_from((None, {"strategy": "default"}, {"strategy": "dead_letter"},
                                           {"strategy": "delay", "delay_ms": 0},
                                           {"strategy": "delay", "delay_ms": 700},
                                           {"strategy": "delay", "delay_ms": 30_000})))
        if retry is not None:
            body["retry"] = retry
        return "nack", {"job_id": jid, "body": body}, self.rid(data, "nack")

    def mk_extend(self, data, jid=None, attempt=None):
        jid = jid or self.pick_id(data)
        body = {"attempt": attempt or self.pick_attempt(data, jid),
                "lease_ms": data.draw(st.sampled_from((1, 500, 2500, 100_000)))}
        return "extend", {"job_id": jid, "body": body}, self.rid(data, "extend")

    def mk_sweep(self, data):
        return "sweep", {}, None

    # ---------------------------------------------------------------- rules
    def sweep_now(self):
        (status, counts), = self.run([("sweep", {}, None)])
        # A tick's job may be born past its deadline (a late tick, a short deadline_after_ms): the
        # tick step comes last, so the next sweep expires it (or meets the stale entry of a job
        # a later tick of the same sweep replaced).
        if all(v < self.model.sweep_limit for v in counts.values()) and not self.model.tick_budget_used \
                and not self.model.born_late:
            due = self.m.next_due_ms()
            assert due is None or due > self.m.clock, "a sweep within its budgets left due work behind"

    @rule(delta=st.one_of(st.integers(-3000, 6000), st.sampled_from((0, 1, 1000, 2500, 4000))), sweep=st.booleans())
    def tick(self, delta, sweep):
        """The leader's wall clock moves, forward or (failover to a slower clock) backward; the
        leader sweeps when something is due."""
        self.now += delta
        if sweep:
            self.sweep_now()

    @rule(data=st.data(), sweep=st.booleans())
    def tick_to_due(self, data, sweep):
        """Jump to just before, at or just after something falls due (boundaries: < vs <=)."""
        pending = {k: v for k, v in self.model.pending_times().items() if v}
        if pending:
            times = pending[data.draw(st.sampled_from(sorted(pending)), label="due kind")]
            self.now = data.draw(st.sampled_from(sorted(set(times))), label="due") + data.draw(st.sampled_from((-1, 0, 1)))
        if sweep:
            self.sweep_now()

    @rule()
    def sweep(self):
        self.sweep_now()

    @rule(data=st.data())
    def enqueue(self, data):
        kind = data.draw(st.sampled_from(("enqueue", "enqueue", "batch", "atomic")), label="enqueue kind")
        self.run([self.mk_enqueue(data) if kind == "enqueue" else self.mk_batch(data, atomic=kind == "atomic")], data)

    @rule(data=st.data())
    def reserve(self, data):
        self.run([self.mk_reserve(data)], data)

    @rule(data=st.data())
    def worker(self, data):
        """A worker: reserve, then ack / nack / extend / abandon each job, mostly with the
        attempt it was given."""
        (status, body), = self.run([self.mk_reserve(data)], data)
        if status != 200:
            return
        # a worker whose handler keeps failing drives jobs through retries to exhaustion
        failing = data.draw(st.booleans(), label="failing worker")
        for job in body["jobs"]:
            jid, attempt = job["id"], job["attempt"]
            if data.draw(st.integers(0, 5), label="stale?") == 0:
                attempt = data.draw(st.sampled_from((attempt + 1, max(1, attempt - 1))), label="stale attempt")
            what = data.draw(st.sampled_from(("nack", "nack", "abandon") if failing else
                                             ("ack", "nack", "extend", "abandon")), label="outcome")
            if what == "ack":
                self.run([("ack", {"job_id": jid, "body": self.ack_body(data, attempt)}, self.rid(data, "ack"))], data)
            elif what == "nack":
                self.run([self.mk_nack(data, jid, attempt)], data)
            elif what == "extend":
                self.run([self.mk_extend(data, jid, attempt)], data)

    @rule(data=st.data())
    def finish_with_results(self, data):
        """Jobs of one queue run to their ack, each with a result or not, mostly as one batch of
        acks: what fills a queue's kept results up to its bound (docs/semantics.md "Job results")."""
        q = data.draw(st.sampled_from(NAMES), label="queue")
        self.run([("batch", {"body": {"jobs": [{"queue": q, "job_type": "t1"}] * data.draw(st.integers(1, 3))}},
                   None)], data)
        (status, body), = self.run([("reserve", {"body": {"queues": [q], "lease_ms": 5000, "max_jobs": 3}}, None)],
                                   data)
        if status != 200 or not body["jobs"]:
            return
        acks = [{"job_id": j["id"], **self.ack_body(data, j["attempt"])} for j in body["jobs"]]
        if data.draw(st.booleans(), label="one batch?"):
            self.run([("acks", {"body": {"acks": acks}}, self.rid(data, "acks"))], data)
        else:
            self.run([("ack", {"job_id": a.pop("job_id"), "body": a}, self.rid(data, "ack")) for a in acks], data)

    @rule(data=st.data())
    def workflow(self, data):
        """A graph in one request (a chain or a fan-in by ref, batch or atomic, now and then on
        a job that exists too), then a few rounds of workers that mostly ack what they get, with
        a result or not: dependencies end, dependents run and read results kept for them."""
        kind = data.draw(st.sampled_from(("batch", "atomic")), label="workflow request")
        fan_in = data.draw(st.booleans(), label="fan-in?")
        n = data.draw(st.integers(2, 4), label="workflow size")
        jobs = []
        for i in range(n):
            job = {"queue": data.draw(st.sampled_from(NAMES), label="queue"), "job_type": "w", "ref": f"r{i}"}
            if fan_in:                  # the last job on every one before it
                refs = [f"r{k}" for k in range(n - 1)] if i == n - 1 else []
            else:                       # a chain: each job on the one before
                refs = [f"r{i - 1}"] if i else []
            deps = [{"ref": r} for r in refs]
            for d in deps:
                policy = data.draw(st.sampled_from((None, None, "complete", "ignore")), label="policy")
                if policy is not None:
                    d["policy"] = policy
            if data.draw(st.integers(0, 4), label="on a job that exists?") == 0 and self.model.jobs:
                deps.append({"job_id": data.draw(st.sampled_from(sorted(self.model.jobs)), label="existing")})
            if deps:
                job["depends_on"] = deps
            job.update(data.draw(st.fixed_dictionaries({}, optional={
                "priority": st.sampled_from((0, 5)), "delay_ms": st.sampled_from((0, 2000)),
                "deadline_at_ms": st.sampled_from((1500, 9000)).map(lambda d: self.now + d)}), label="fields"))
            jobs.append(job)
        (status, answer), = self.run([(kind, {"body": {"jobs": jobs}}, self.rid(data, kind))], data)
        if status == 200 and "job_id" in answer["results"][0] and data.draw(st.integers(0, 3), label="cancel?") == 0:
            # the graph's first job cancelled: refused while jobs wait on it, unless with cascade
            args = {"job_id": answer["results"][0]["job_id"]}
            if data.draw(st.booleans(), label="cascade"):
                args["cascade"] = "true"
            self.run([("cancel", args, None)], data)
        for _ in range(data.draw(st.integers(0, 3), label="rounds")):
            (status, body), = self.run([("reserve", {"body": {"queues": list(NAMES), "lease_ms": 5000, "max_jobs": 3}},
                                         None)], data)
            reqs = []
            for job in body["jobs"]:
                what = data.draw(st.sampled_from(("ack", "ack", "ack", "dead", "keep")), label="outcome")
                if what == "ack":
                    reqs.append(("ack", {"job_id": job["id"], "body": self.ack_body(data, job["attempt"])}, None))
                elif what == "dead":
                    reqs.append(("nack", {"job_id": job["id"], "body": {"attempt": job["attempt"],
                                                                        "retry": {"strategy": "dead_letter"}}}, None))
            if reqs:
                self.run(reqs, data)

    def batch_members(self, data) -> list:
        jobs, refs = [], []
        for i in range(data.draw(st.integers(1, 4), label="members")):
            jobs.append(self.job_body(data, refs))
            if "depends_on" in jobs[-1] and data.draw(st.integers(0, 2), label="keep depends_on?"):
                # mostly on earlier members only (a refused member refuses them all)
                deps = [e for e in jobs[-1].pop("depends_on") if isinstance(e, dict) and e.get("ref") in refs]
                if deps:
                    jobs[-1]["depends_on"] = deps
            if data.draw(st.booleans(), label="ref?"):
                jobs[-1]["ref"] = f"r{i}"
                refs.append(f"r{i}")
        return jobs

    def mk_batch_open(self, data):
        """POST /v1/batches: members (none now and then), callbacks (now and then a refused
        one), open or closed, a short timeout or the default (now and then a bad one)."""
        body = {}
        if data.draw(st.integers(0, 4), label="members?") > 0:
            body["jobs"] = self.batch_members(data)
        cbs = {}
        for k in CALLBACK_KINDS:
            if data.draw(st.integers(0, 3), label=f"{k}?") > 0:
                cbs[k] = data.draw(job_bodies(self.now), label=k)
                if data.draw(st.integers(0, 3), label="a key?"):
                    cbs[k].pop("idempotency_key", None)
        if cbs and data.draw(st.integers(0, 19), label="bad callback?") == 0:
            cbs[sorted(cbs)[0]]["depends_on"] = [UNKNOWN_ID]
        if cbs or data.draw(st.booleans(), label="callbacks {}?"):
            body["callbacks"] = cbs
        if data.draw(st.booleans(), label="open?"):
            body["open"] = True
        t = data.draw(st.sampled_from((None, None, 1000, 1000, 2500, 2500, 0)), label="timeout")
        if t is not None:
            body["timeout_ms"] = t
        return "bopen", {"body": body}, self.rid(data, "bopen")

    def pick_batch(self, data) -> str:
        m = self.model
        live = sorted(m.batches)
        how = data.draw(st.sampled_from(("live",) * 6 + ("any", "unknown")), label="batch kind")
        if how == "live" and live:
            bid = data.draw(st.sampled_from(live), label="batch")
        elif how != "unknown" and self.batch_ids:
            bid = data.draw(st.sampled_from(self.batch_ids), label="batch")
        else:
            bid = UNKNOWN_ID
        return bid.upper() if data.draw(st.integers(0, 15), label="upper") == 0 else bid

    @rule(data=st.data())
    def batches(self, data):
        """A batch request (open, add, close, cancel), then a round of workers that mostly ack
        what they get, now and then dead-letter it."""
        reqs = []
        for _ in range(data.draw(st.integers(1, 2), label="batch requests")):
            op = data.draw(st.sampled_from(("open", "open", "add", "add", "close", "cancel")), label="batch op")
            if op == "open":
                reqs.append(self.mk_batch_open(data))
            elif op == "add":
                reqs.append(("badd", {"batch_id": self.pick_batch(data), "body": {"jobs": self.batch_members(data)}},
                             self.rid(data, "badd")))
            else:
                kind = "bclose" if op == "close" else "bcancel"
                reqs.append((kind, {"batch_id": self.pick_batch(data)}, self.rid(data, kind)))
        for (kind, _, _), (status, answer) in zip(reqs, self.run(reqs, data)):
            if kind == "bopen" and status == 200 and answer["batch_id"] not in self.batch_ids:
                self.batch_ids.append(answer["batch_id"])
        if data.draw(st.booleans(), label="work?"):
            (status, body), = self.run([("reserve", {"body": {"queues": list(NAMES), "lease_ms": 5000, "max_jobs": 3}},
                                         None)], data)
            reqs = []
            for job in body["jobs"]:
                what = data.draw(st.sampled_from(("ack", "ack", "dead", "keep")), label="outcome")
                if what == "ack":
                    reqs.append(("ack", {"job_id": job["id"], "body": self.ack_body(data, job["attempt"])}, None))
                elif what == "dead":
                    reqs.append(("nack", {"job_id": job["id"], "body": {"attempt": job["attempt"],
                                                                        "retry": {"strategy": "dead_letter"}}}, None))
            if reqs:
                self.run(reqs, data)
            if self.model.batches and data.draw(st.integers(0, 2), label="then cancel or close?") == 0:
                # with some members in flight now and then: they run on
                kind = data.draw(st.sampled_from(("bcancel", "bclose")), label="which")
                self.run([(kind, {"batch_id": data.draw(st.sampled_from(sorted(self.model.batches)), label="batch")},
                           None)], data)

    @rule(data=st.data())
    def fenced(self, data):
        """ack / batch ack / nack / extend of any job: in flight, gone, unknown, stale."""
        mk = data.draw(st.sampled_from((self.mk_ack, self.mk_acks, self.mk_nack, self.mk_extend)), label="op")
        self.run([mk(data)], data)

    @rule(data=st.data())
    def admin(self, data):
        """cancel a job (ready, scheduled, in flight, dead, unknown) or pause / resume a queue
        (one that neither exists nor is declared only with create)."""
        if data.draw(st.booleans(), label="cancel?"):
            jid = self.pick_id(data, prefer=("ready", "scheduled", "waiting", "in_flight"))
            args = {"job_id": jid}
            cascade = data.draw(st.sampled_from((None, None, "true", "false")), label="cascade")
            if cascade is not None:
                args["cascade"] = cascade
            self.run([("cancel", args, self.rid(data, "cancel"))], data)
        else:
            queue, paused = data.draw(st.sampled_from(NAMES)), data.draw(st.booleans())
            body = data.draw(st.sampled_from(({}, {"create": True}, {"create": False})), label="pause body")
            self.run([("pause", {"queue": queue, "paused": paused, "body": body}, self.rid(data, "pause"))], data)

    @rule(data=st.data())
    def operator_moves(self, data):
        """dead-letter jobs by hand, purge a queue, delete a queue."""
        kind = data.draw(st.sampled_from(("move", "move", "purge", "qdel")), label="move kind")
        queue = data.draw(st.sampled_from(NAMES + ("z",)), label="queue")
        if kind == "move":
            ids = [self.pick_id(data, prefer=("ready", "scheduled", "in_flight", "waiting"))
                   for _ in range(data.draw(st.integers(1, 3)))]
            body = {"ids": ids}
            reason = data.draw(st.sampled_from((None, "", "poison")), label="reason")
            if reason is not None:
                body["reason"] = reason
            args = {"queue": queue, "body": body}
        else:
            args = {"queue": queue, "body": {}} if kind == "purge" else {"queue": queue}
        self.run([(kind, args, self.rid(data, kind))], data)

    @rule(data=st.data())
    def reconfigure(self, data):
        """PUT /v1/config: one of CHANGES, against the version in force (or a stale / future one)."""
        change = data.draw(st.sampled_from(CHANGES), label="config change")
        _, lim, sto, qs = change
        v = self.model.version
        expect = data.draw(st.sampled_from((v, v, v, max(0, v - 1), v + 1)), label="expect_version")
        body = {"config": {"limits": lim, "storage": sto, "queues": qs}, "expect_version": expect}
        self.run([("config", {"body": body, "change": change}, self.rid(data, "config"))], data)

    @rule(data=st.data())
    def keys(self, data):
        """POST /v1/keys, DELETE /v1/keys/{name}."""
        name = data.draw(st.sampled_from(KEY_NAMES), label="key name")
        if data.draw(st.booleans(), label="add?"):
            body = {"name": name, "role": data.draw(st.sampled_from(("admin", "admin", "viewer", "operator"))),
                    "key_sha256": data.draw(st.sampled_from(DIGESTS), label="digest")}
            self.run([("keyadd", {"body": body}, self.rid(data, "keyadd"))], data)
        else:
            self.run([("keydel", {"name": name}, self.rid(data, "keydel"))], data)

    @rule(data=st.data())
    def dead_letters(self, data):
        """drain, requeue or delete dead letters."""
        kind = data.draw(st.sampled_from(("drain", "requeue", "dldel")), label="dead-letter op")
        if kind == "drain":
            body = data.draw(st.fixed_dictionaries({}, optional={"queue": st.sampled_from(NAMES),
                                                                 "max": st.integers(1, 5)}))
        else:
            body = {"ids": [self.pick_id(data, prefer=("dead_lettered",)) for _ in range(data.draw(st.integers(1, 3)))]}
        self.run([(kind, {"body": body}, self.rid(data, kind))], data)

    @rule(data=st.data())
    def group_commit(self, data):
        """Several requests in one replicated batch (one leader stamp)."""
        makers = data.draw(st.lists(st.sampled_from((self.mk_enqueue, self.mk_reserve, self.mk_ack, self.mk_nack,
                                                     self.mk_extend, self.mk_sweep, self.mk_batch)),
                                    min_size=2, max_size=4))
        self.run([mk(data) for mk in makers], data)

    def schedule_name(self, data) -> str:
        """Mostly a schedule that exists; else any of the names."""
        if self.model.scheds and data.draw(st.integers(0, 3), label="existing schedule?") > 0:
            return data.draw(st.sampled_from(sorted(self.model.scheds)), label="schedule")
        return data.draw(st.sampled_from(SCHEDULES), label="schedule")

    @rule(data=st.data())
    def schedule_put(self, data):
        """PUT /v1/schedules/{name}: create or replace, sometimes against a version (0: create only)."""
        name = data.draw(st.sampled_from(SCHEDULES), label="schedule")
        body = data.draw(schedule_bodies(self.now))
        have = self.model.scheds[name].version if name in self.model.scheds else 0
        expect = data.draw(st.sampled_from((None, None, None, 0, have, have, have + 1)), label="expect_version")
        if expect is not None:
            body["expect_version"] = expect
        self.run([("sput", {"name": name, "body": body}, self.rid(data, "sput"))], data)

    @rule(data=st.data())
    def schedule_admin(self, data):
        """DELETE a schedule (?expect_version=n), pause / resume one, or trigger a run now."""
        name = self.schedule_name(data)
        kind = data.draw(st.sampled_from(("sdel", "spause", "spause", "strig", "strig")), label="schedule op")
        if kind == "sdel":
            have = self.model.scheds[name].version if name in self.model.scheds else 0
            args = {"name": name, "expect": data.draw(st.sampled_from((None, None, str(have), str(have + 1), "0", "x")),
                                                      label="expect_version")}
        elif kind == "spause":
            args = {"name": name, "paused": data.draw(st.booleans(), label="paused")}
        else:
            args = {"name": name}
        self.run([(kind, args, self.rid(data, kind))], data)

    @rule(how=st.sampled_from(("builtins", "pickle")))
    def restore_snapshot(self, how):
        """Continue on a machine rebuilt from a snapshot (what a restarted node does)."""
        if how == "builtins":
            m2 = QueueMachine.from_builtins(self.limits, self.m.to_builtins())     # the bootstrap; the state's config wins
        else:
            m2 = pickle.loads(pickle.dumps(self.m))
        assert m2.digest() == self.m.digest()
        check_machine(m2, self.model)
        self.m = m2

    def teardown(self):
        if hasattr(self, "model"):
            n = self.requests
            event(f"requests in the run: {'<20' if n < 20 else '<50' if n < 50 else '<100' if n < 100 else '100+'}")
            event(f"configuration versions: {min(self.model.version, 3)}{'+' if self.model.version > 3 else ''}")
            # A replay of the whole history from an empty machine (a node replaying its journal
            # from the start, under the bootstrap it was constructed with) answers every command
            # as it was answered, and ends in the same state.
            fresh = QueueMachine(self.limits)
            for now, cmds, results in self.history:
                assert fresh.apply_batch(now, cmds) == results, (now, cmds)
            assert fresh.digest() == self.m.digest()
            check_machine(fresh, self.model)

    # ---------------------------------------------------------------- invariants
    @invariant()
    def same_state(self):
        m, model = self.m, self.model
        for q in NAMES + ("z",):
            assert m.queue_stats(q) == model.stats(q), q
        assert m.config_version == model.version
        assert [(e["who"], e["action"], e["target"]) for e in reversed(m.audit_page(100_000, None)[0])] == \
            [(e["who"], e["action"], e["target"]) for e in model.audit]
        assert {k["name"]: k["role"] for k in m.keys_view()} == {n: r for n, (r, _) in model.keys.items()}
        for jid in self.all_ids:
            assert m.job_view(jid) == model.view(jid), jid
        assert m.counts() == model.counts()
        for name in SCHEDULES:
            assert m.schedule_view(name) == model.schedule_view(name), name
        for bid in self.batch_ids:
            assert m.batch_view(bid) == model.batch_view(bid), bid
        names, after = [], None               # the listing, in pages of 2, by name
        while True:
            views, after = m.list_schedules(2, after)
            names += [v["name"] for v in views]
            if after is None:
                break
        assert names == sorted(model.scheds)
        for q in (None,) + NAMES:
            assert norm(m.list_dead_letters(q, 10_000, None)[0]) == norm(model.dead_records(q)), q
        # paged dead-letter listing: pages of 2 concatenate to the whole
        pages, after = [], None
        while True:
            recs, after = m.list_dead_letters(None, 2, after)
            pages += recs
            if after is None:
                break
        assert norm(pages) == norm(model.dead_records())
        # by cause (the admin UI's filter): pages of 2, scanning at most 2 records a call, still
        # concatenate to exactly the records of that cause. One cause per check, in turn (each
        # check pages the whole store: all four every time would double this test's run time).
        causes = ("attempts_exhausted", "rejected", "lease_expired", "expired", "dependency_failed")
        for cause in (causes[len(model.dead) % 5],):
            want = [r for r in model.dead_records() if r["cause"] == cause]
            pages, after = [], None
            while True:
                recs, after = m.list_dead_letters(None, 2, after, cause, scan_limit=2)
                assert len(recs) <= 2 and all(r["cause"] == cause for r in recs)
                pages += recs
                if after is None:
                    break
            assert norm(pages) == norm(want), cause
        for q in NAMES:
            for state, code in (("ready", READY), ("scheduled", SCHEDULED), ("in_flight", IN_FLIGHT)):
                want = model.listing(q, state)
                views, cursor = m.list_jobs(q, code, 10_000, None)
                assert [v["id"] for v in views] == want, (q, state)
                assert cursor is None
                got, cursor = [], None
                while True:
                    views, cursor = m.list_jobs(q, code, 2, None if cursor is None else tuple(cursor))
                    got += [v["id"] for v in views]
                    if cursor is None:
                        break
                assert got == want, (q, state, "paged")
        due = model.next_due()
        if due is not None:               # stale heap entries may make it early, never late
            assert m.next_due_ms() is not None and m.next_due_ms() <= due

    @invariant()
    def dependencies_hold(self):
        """A waiting job waits on live jobs only (none of them has ended), among those it names,
        in the model and on the machine; no job in flight (unless requeued) names a dependency
        that has not ended."""
        model = self.model
        for j in model.jobs.values():
            if j.state == "waiting":
                assert j.waiting_on and set(j.waiting_on) <= {d for d, _ in j.depends_on}, j
                assert all(d in model.jobs and model.jobs[d].state != "dead_lettered" for d in j.waiting_on), j
                for d in self.m.job_view(j.id)["waiting_on"]:
                    assert self.m.job_view(d)["state"] in ("ready", "scheduled", "in_flight", "waiting"), (j.id, d)
            else:
                assert not j.waiting_on, j
                if j.state == "in_flight" and j.depends_on and not j.requeued:
                    assert all(d in model.ended_ids for d, _ in j.depends_on), j

    @invariant()
    def callbacks_hold(self):
        """Every callback of a kept batch has fired iff its condition holds (on_failure: a member
        failed; on_complete: closed, every member ended; on_success: that, none failed or was
        removed), once at most per kind and batch, for life; a fired one made a job of the model
        and of the machine, with the batch's id among its custom fields."""
        model = self.model
        assert all(n == 1 for n in model.callback_jobs.values()), model.callback_jobs
        for b in model.batches.values():
            done = not b.open and not b.pending
            want = {"on_complete": done, "on_success": done and not b.failed and not b.removed,
                    "on_failure": b.failed > 0}
            assert set(b.fired) == {k for k in b.callbacks if want[k]}, (b, want)
            assert (b.finished_at is not None) == done, b
            for k, jid in b.fired.items():
                if jid is not None and jid in model.jobs:
                    assert model.jobs[jid].custom["batch_id"] == b.id
                    assert self.m.job_view(jid)["custom"]["batch_id"] == b.id, jid

    @invariant()
    def snapshot_round_trip(self):
        restored = QueueMachine.from_builtins(self.limits, self.m.to_builtins())
        check_machine(restored, self.model)
        assert restored.digest() == self.m.digest()

    @invariant()
    def machine_invariants(self):
        """node/core/invariants.py: counts agree with the indexes, every timer and record is
        indexed, the clock never goes back (checked after every step)."""
        check_machine(self.m, self.model)


CoreModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
TestCoreModel = CoreModel.TestCase


# ====================================================================================== retry formula

@settings(max_examples=300, deadline=None)
@given(job=st.integers(1, 2**40).map(counter_id), attempt=st.integers(1, 80),
       base=st.integers(0, 10_000_000), backoff=st.sampled_from(("none", "exponential")),
       max_ms=st.integers(1, 10**10), horizon=st.integers(1, 10**10))
def test_retry_policy_matches_spec_formula(job, attempt, base, backoff, max_ms, horizon):
    d = policy_delay_ms(job, attempt, base, backoff, max_ms, horizon)
    assert d == spec_policy_delay(job, attempt, base, backoff, max_ms, horizon)


@pytest.mark.parametrize("n", range(50))
def test_retry_policy_spec_examples(n):
    jid = counter_id(n + 1)
    # docs/semantics.md: base 1 s exponential, failing attempt 3 -> between 3 s and 4 s.
    assert 3000 <= policy_delay_ms(jid, 3, 1000, "exponential", 3_600_000, 2_592_000_000) <= 4000
    # sepp's tests: base 10 s fixed -> 7.5-10 s; a 10 s cap -> 7.5-10 s.
    assert 7500 <= policy_delay_ms(jid, 5, 10_000, "none", 3_600_000, 2_592_000_000) <= 10_000
    assert 7500 <= policy_delay_ms(jid, 30, 1000, "exponential", 10_000, 2_592_000_000) <= 10_000
    assert policy_delay_ms(jid, 3, 0, "exponential", 10_000, 2_592_000_000) == 0


# ====================================================================================== regressions

def _two_nodes_after(setup, then):
    """Run `setup` on a machine, restore a second one from its snapshot, run `then` on both;
    return both machines (a restored node must stay identical to the others)."""
    limits = Limits.build(storage={"sweep_limit": 1, "dead_letter_retention_ms": 60_000})
    ids = iter(counter_id(n) for n in range(1, 100))
    m = QueueMachine(limits)
    ctx = setup(m, limits, ids.__next__)
    r = QueueMachine.from_builtins(limits, m.to_builtins())
    for node in (m, r):
        then(node, limits, ctx)
    return m, r


def test_a_restored_node_keeps_a_stale_lease_timer_that_comes_back():
    """X and Y lease until 6000 (X's timer first); X is nacked and reserved again until 6000.
    X's first timer is live again and a sweep with budget 1 expires X first, on every node:
    the snapshot must carry that timer (it used to drop it, and a restored node expired Y)."""
    res = lambda limits: C.reserve({"queues": ["q"], "lease_ms": 5000}, limits)[0]   # noqa: E731

    def setup(m, limits, new_id):
        x = m.apply(1000, C.enqueue({"queue": "q", "job_type": "t", "priority": 9}, limits, 1000, new_id))[1]["job_id"]
        m.apply(1000, C.enqueue({"queue": "q", "job_type": "t"}, limits, 1000, new_id))
        m.apply(1000, res(limits))
        m.apply(1000, res(limits))
        assert m.apply(1000, C.nack(x, {"attempt": 1}))[0] == 200
        return x

    def then(node, limits, x):
        assert node.apply(1000, res(limits))[1]["jobs"][0]["id"] == x
        assert node.apply(6000, C.sweep())[1]["leases_expired"] == 1
    m, r = _two_nodes_after(setup, then)
    assert m.digest() == r.digest()


def test_a_restored_node_keeps_a_stale_schedule_timer_that_comes_back():
    """X is scheduled for 6000, dies of its deadline, is requeued, reserved and nacked to run at
    6000 again; Y is scheduled for 6000 in between. X's first timer is live again and orders X
    before Y on every node, restored ones included."""
    def setup(m, limits, new_id):
        x = m.apply(1000, C.enqueue({"queue": "q", "job_type": "t", "delay_ms": 5000, "deadline_at_ms": 1100},
                                    limits, 1000, new_id))[1]["job_id"]
        m.apply(1000, C.enqueue({"queue": "q", "job_type": "t", "delay_ms": 5000}, limits, 1000, new_id))
        assert m.apply(1100, C.sweep())[1]["deadlines_expired"] == 1
        assert m.apply(1100, C.requeue({"ids": [x]}))[1]["requeued"] == [x]
        return x

    def then(node, limits, x):
        assert node.apply(1100, C.reserve({"queues": ["q"], "lease_ms": 5000}, limits)[0])[1]["jobs"][0]["id"] == x
        node.apply(1100, C.nack(x, {"attempt": 1, "retry": {"strategy": "delay", "delay_ms": 4900}}))
        assert node.apply(6000, C.sweep())[1]["promoted"] == 1
        assert node.job_view(x)["state"] == "ready"
    m, r = _two_nodes_after(setup, then)
    assert m.digest() == r.digest()
