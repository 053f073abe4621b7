"""Commands and results: their codes, their field names, their constructors and readers.

Commands cross Raft and live in journals and snapshots as pickles, so on the wire a command is
a plain tuple of builtins, `(op, request_id, *fields)`, never an object with a class path. The
op codes below are the wire codes release 0.1.0 wrote ("enq", "res", ...): journals of that
release replay as they are. `COMMANDS` names each command's fields in wire order, and the
handler of each op (node/core/handlers.py, node/core/sweep.py) takes exactly those names as
its parameters (node/core/machine.py checks this at import), so a handler reads names, not indexes.

Results are tuples too, `(kind, *fields)`, of codes and values, never of prose: they are what
the request-id store keeps (so what snapshots hold and `digest()` hashes) and what a replay
answers. `RESULTS` names their fields; node/core/answers.py renders a result into the HTTP
answer `(status, body)`, messages included, when the node sends it. So a message wording change
changes no replicated state.
"""
from __future__ import annotations

from operator import itemgetter
from typing import NamedTuple

# ---------------------------------------------------------------------------- commands
# Wire codes (journals of release 0.1.0 hold these: never change one).
ENQUEUE = "enq"
RESERVE = "res"
ACK = "ack"
ACK_BATCH = "acks"
NACK = "nack"
EXTEND = "ext"
DRAIN = "drain"
REQUEUE = "requeue"
DELETE_DEAD_LETTERS = "dldel"
CANCEL = "cancel"
PAUSE = "pause"
SWEEP = "sweep"
# Configuration, keys and operator moves (after release 0.1.0).
CONFIGURE = "config"
ADD_KEY = "keyadd"
REMOVE_KEY = "keydel"
MOVE_TO_DEAD_LETTERS = "dlmove"
PURGE = "purge"
DELETE_QUEUE = "qdel"
RECORD_ACTION = "record"        # an operator action done outside the machine (a membership change)
# 0.2.0 (docs/semantics.md "Release"; docs/api.md "Gating: throttles, circuit breakers, execution windows").
RELEASE = "rel"                 # a worker hands a job back without using an attempt
CLOSE_CIRCUIT = "cclose"        # an operator closes a queue's circuit breaker
# Schedules (node/core/schedules.py); their ticks fire in the sweep.
SCHEDULE_PUT = "schput"
SCHEDULE_DELETE = "schdel"
SCHEDULE_PAUSE = "schpause"
SCHEDULE_TRIGGER = "schrun"
SCHEDULE_SEED = "schseed"       # the [[schedules]] of a node's TOML, applied once per cluster
# Batches (node/core/batches.py).
BATCH_OPEN = "bopen"
BATCH_ADD = "badd"
BATCH_CLOSE = "bclose"
BATCH_CANCEL = "bcancel"

# `who` of an operator command: the caller's key name (None without auth), put in by the
# leader. Commands of release 0.1.0 have no such field: their handlers see UNAUDITED, and
# record nothing in the audit trail (node/core/audit.py).
UNAUDITED = False

# The fields after (op, request_id), in wire order.
COMMANDS: dict[str, tuple[str, ...]] = {
    ENQUEUE: ("mode", "items"),                 # mode: SINGLE | BATCH | ATOMIC; items: ITEM tuples
                                                # (or, in a best-effort batch, a rejection dict)
    RESERVE: ("queue_names", "lease_ms", "max_jobs"),
    ACK: ("job_id", "attempt", "result"),      # result: None or (data bytes, encoding); absent before results
    ACK_BATCH: ("pairs",),                      # ((job_id, attempt[, result]), ...)
    NACK: ("job_id", "attempt", "reason", "strategy", "delay_ms"),
    EXTEND: ("job_id", "attempt", "lease_ms"),
    DRAIN: ("queue", "max_records", "who"),     # queue None = every queue
    REQUEUE: ("ids", "who"),
    DELETE_DEAD_LETTERS: ("ids", "who"),
    CANCEL: ("job_id", "who", "in_flight", "cascade"),  # in_flight: may remove an in-flight job (absent before
                                                # 0.2.0: no); cascade: its waiting dependents too (absent: no)
    PAUSE: ("queue", "paused", "create", "who"),  # create: also for a queue that neither exists nor is declared
    SWEEP: (),
    CONFIGURE: ("expect_version", "config", "keys", "who"),   # config: {limits, storage, queues};
                                                # keys: None (unchanged) or ((name, role, key_sha256), ...)
    ADD_KEY: ("name", "role", "key_sha256", "who"),
    REMOVE_KEY: ("name", "who"),
    MOVE_TO_DEAD_LETTERS: ("queue", "ids", "reason", "who"),
    PURGE: ("queue", "who"),
    DELETE_QUEUE: ("queue", "who"),
    RECORD_ACTION: ("action", "target", "details", "who"),   # action: one of RECORDED_ACTIONS
    RELEASE: ("job_id", "attempt", "delay_ms", "reason"),    # fenced like nack; delay_ms 0 = ready at once
    CLOSE_CIRCUIT: ("queue", "who"),
    SCHEDULE_PUT: ("name", "definition", "expect_version", "who"),  # definition: schedules.DEFINITION_KEYS
    SCHEDULE_DELETE: ("name", "expect_version", "who"),
    SCHEDULE_PAUSE: ("name", "paused", "who"),
    SCHEDULE_TRIGGER: ("name", "job_id", "who"),
    SCHEDULE_SEED: ("definitions",),            # ((name, definition), ...)
    BATCH_OPEN: ("batch_id", "callbacks", "close", "timeout_ms", "items"),   # callbacks: ((kind, ITEM), ...)
    BATCH_ADD: ("batch_id", "items"),
    BATCH_CLOSE: ("batch_id",),
    BATCH_CANCEL: ("batch_id", "who"),
}
# The fields a command of release 0.1.0 (and of this code before `who`) ends after: the
# handlers give the later ones defaults (who = UNAUDITED, create = True, as pause was then).
LEGACY_FIELDS = {DRAIN: 2, REQUEUE: 1, DELETE_DEAD_LETTERS: 1, CANCEL: 1, PAUSE: 2}
# Fields added after that, with the default a command without them gets: a cancel written before
# 0.2.0 refuses an in-flight job (409) on every replay, as it did then.
LATER_DEFAULTS = {CANCEL: {"in_flight": False, "cascade": False}, ACK: {"result": None}}
OPS = tuple(COMMANDS)

# Enqueue modes.
SINGLE, BATCH, ATOMIC = 0, 1, 2
# Nack strategies (docs/semantics.md "Ack, nack, extend and fencing").
DEFAULT, DELAY, DEAD_LETTER = "default", "delay", "dead_letter"
STRATEGIES = (DEFAULT, DELAY, DEAD_LETTER)

# One job of an enqueue, as validation made it (node/base/validate.py): everything is final
# (defaults applied, max_attempts clamped, a past schedule turned into None).
ITEM: tuple[str, ...] = ("job_id", "queue", "job_type", "payload", "encoding", "priority",
                         "max_attempts", "custom", "trace", "scheduled_at", "deadline",
                         "idempotency_key",
                         # 0.2.0; items of the 12 fields above (journals of before, and every
                         # job that uses none of these) apply with None for all three
                         "timeout_ms", "duplicate_policy", "resource",
                         # keys (node/core/keys.py); items of 15 fields apply with no key
                         "key",
                         # dependencies (node/core/deps.py): ((job id, policy), ...); items of 16
                         # fields apply with none
                         "depends_on")
ITEM_LEGACY_LEN = 12
ITEM_DUPLICATE_POLICY = ITEM.index("duplicate_policy")
# What an idempotency-key hit does (docs/semantics.md "Duplicate policy"); None in an item = return_existing.
RETURN_EXISTING, REJECT, REPLACE = "return_existing", "reject", "replace"
DUPLICATE_POLICIES = (RETURN_EXISTING, REJECT, REPLACE)
ITEM_QUEUE = ITEM.index("queue")
ITEM_DEPENDS_ON = ITEM.index("depends_on")
# What a dependency's end means to its dependent (docs/semantics.md "Dependencies"): `success`, it runs only
# if the dependency succeeded (a dead letter fails it, cause dependency_failed); `complete`, it runs
# whatever the end; `ignore`, likewise (the dependency's end is only waited for).
DEP_SUCCESS, DEP_COMPLETE, DEP_IGNORE = "success", "complete", "ignore"
DEPENDENCY_POLICIES = (DEP_SUCCESS, DEP_COMPLETE, DEP_IGNORE)
ITEM_IDEMPOTENCY_KEY = ITEM.index("idempotency_key")


def field_index(op: str, name: str) -> int:
    """Where field `name` of command `op` sits in the command tuple."""
    return 2 + COMMANDS[op].index(name)


def reader(op: str, name: str):
    """A function that reads field `name` of an `op` command."""
    return itemgetter(field_index(op, name))


def op_of(cmd) -> str:
    return cmd[0]


# Constructors, one per command, with the fields as named arguments.
def enqueue(rid, mode: int, items: list) -> tuple:
    return ENQUEUE, rid, mode, items


def reserve(rid, queue_names: tuple, lease_ms: int, max_jobs: int) -> tuple:
    return RESERVE, rid, queue_names, lease_ms, max_jobs


def ack(rid, job_id: str, attempt: int, result: tuple | None = None) -> tuple:
    """An ack; with a result (data bytes, encoding) a field longer (an ack without one is the
    command of before results, what journals hold)."""
    if result is None:
        return ACK, rid, job_id, attempt
    return ACK, rid, job_id, attempt, result


def ack_batch(rid, pairs: tuple) -> tuple:
    """pairs: (job_id, attempt) per ack, or (job_id, attempt, result) for one with a result."""
    return ACK_BATCH, rid, pairs


def nack(rid, job_id: str, attempt: int, reason, strategy: str, delay_ms) -> tuple:
    return NACK, rid, job_id, attempt, reason, strategy, delay_ms


def extend(rid, job_id: str, attempt: int, lease_ms: int) -> tuple:
    return EXTEND, rid, job_id, attempt, lease_ms


def drain(rid, queue, max_records: int, who=None) -> tuple:
    return DRAIN, rid, queue, max_records, who


def requeue(rid, ids: tuple, who=None) -> tuple:
    return REQUEUE, rid, ids, who


def delete_dead_letters(rid, ids: tuple, who=None) -> tuple:
    return DELETE_DEAD_LETTERS, rid, ids, who


def cancel(rid, job_id: str, who=None, in_flight: bool = True, cascade: bool = False) -> tuple:
    """A cancel; with cascade a field longer (a cancel without it is the command of before)."""
    if cascade:
        return CANCEL, rid, job_id, who, in_flight, True
    return CANCEL, rid, job_id, who, in_flight


def pause(rid, queue: str, paused: bool, create: bool = False, who=None) -> tuple:
    return PAUSE, rid, queue, paused, create, who


def configure(rid, expect_version: int, config: dict, keys, who=None) -> tuple:
    return CONFIGURE, rid, expect_version, config, keys, who


def add_key(rid, name: str, role: str, key_sha256: str, who=None) -> tuple:
    return ADD_KEY, rid, name, role, key_sha256, who


def remove_key(rid, name: str, who=None) -> tuple:
    return REMOVE_KEY, rid, name, who


def move_to_dead_letters(rid, queue: str, ids: tuple, reason, who=None) -> tuple:
    return MOVE_TO_DEAD_LETTERS, rid, queue, ids, reason, who


def purge(rid, queue: str, who=None) -> tuple:
    return PURGE, rid, queue, who


def delete_queue(rid, queue: str, who=None) -> tuple:
    return DELETE_QUEUE, rid, queue, who


# The actions a RECORD_ACTION command may name: changes the node makes outside the state machine
# (a membership change goes through pysyncobj's own log entries), recorded in the audit trail
# once they are committed.
RECORDED_ACTIONS = frozenset(("member_add", "member_remove"))


def record_action(rid, action: str, target, details: dict, who=None) -> tuple:
    return RECORD_ACTION, rid, action, target, details, who


def close_circuit(rid, queue: str, who=None) -> tuple:
    return CLOSE_CIRCUIT, rid, queue, who


def sweep() -> tuple:
    return SWEEP, None


def schedule_put(rid, name: str, definition: dict, expect_version, who=None) -> tuple:
    return SCHEDULE_PUT, rid, name, definition, expect_version, who


def schedule_delete(rid, name: str, expect_version, who=None) -> tuple:
    return SCHEDULE_DELETE, rid, name, expect_version, who


def schedule_pause(rid, name: str, paused: bool, who=None) -> tuple:
    return SCHEDULE_PAUSE, rid, name, paused, who


def schedule_trigger(rid, name: str, job_id: str, who=None) -> tuple:
    return SCHEDULE_TRIGGER, rid, name, job_id, who


def schedule_seed(definitions: tuple) -> tuple:
    return SCHEDULE_SEED, None, definitions


def batch_open(rid, batch_id: str, callbacks: tuple, close: bool, timeout_ms: int, items: tuple) -> tuple:
    return BATCH_OPEN, rid, batch_id, callbacks, close, timeout_ms, items


def batch_add(rid, batch_id: str, items: tuple) -> tuple:
    return BATCH_ADD, rid, batch_id, items


def batch_close(rid, batch_id: str) -> tuple:
    return BATCH_CLOSE, rid, batch_id


def batch_cancel(rid, batch_id: str, who=None) -> tuple:
    return BATCH_CANCEL, rid, batch_id, who


def release(rid, job_id: str, attempt: int, delay_ms: int, reason) -> tuple:
    return RELEASE, rid, job_id, attempt, delay_ms, reason


def item(job_id, queue, job_type, payload, encoding, priority, max_attempts, custom, trace,
         scheduled_at, deadline, idempotency_key, timeout_ms=None, duplicate_policy=None,
         resource=None, key=None, depends_on=None) -> tuple:
    """One enqueue item, fields in ITEM order. Without a timeout, a duplicate policy or a
    resource it is the 12-field item of before 0.2.0 (what journals hold), so nothing changes
    for such a job; without a key, the 15-field item of before keys; without dependencies, the
    16-field item of before them."""
    if depends_on is not None:
        return (job_id, queue, job_type, payload, encoding, priority, max_attempts, custom, trace,
                scheduled_at, deadline, idempotency_key, timeout_ms, duplicate_policy, resource, key, depends_on)
    if key is not None:
        return (job_id, queue, job_type, payload, encoding, priority, max_attempts, custom, trace,
                scheduled_at, deadline, idempotency_key, timeout_ms, duplicate_policy, resource, key)
    if timeout_ms is None and duplicate_policy is None and resource is None:
        return (job_id, queue, job_type, payload, encoding, priority, max_attempts, custom, trace,
                scheduled_at, deadline, idempotency_key)
    return (job_id, queue, job_type, payload, encoding, priority, max_attempts, custom, trace,
            scheduled_at, deadline, idempotency_key, timeout_ms, duplicate_policy, resource)


# Readers the node uses outside apply.
reserve_queue_names = reader(RESERVE, "queue_names")
ack_batch_pairs = reader(ACK_BATCH, "pairs")

# Ops after which a parked reserve may find a job ready (the node, node/service/, wakes its waiters).
# An ack can make a held-back job reservable too (a throttle slot freed, a probe closed the
# circuit): it wakes only the queues the machine says it released (`QueueMachine.released`,
# node/core/gating.py), so acks cost nothing more when no job is held back; so does the
# delete of a running job. A release makes its job ready (and frees a slot), like a nack.
# A configuration change wakes them all (it may open a window, remove a breaker, raise a limit).
# A dependent made ready, or a batch's callback enqueued, by a job's end is `released` too
# (node/core/deps.py, node/core/batches.py): an ack, a cancel, a purge or a move may do it.
WAKING_OPS = frozenset((ENQUEUE, NACK, SWEEP, REQUEUE, PAUSE, RELEASE, CLOSE_CIRCUIT, CONFIGURE, SCHEDULE_TRIGGER,
                        BATCH_OPEN, BATCH_ADD, BATCH_CLOSE))
RELEASING_OPS = frozenset((ACK, ACK_BATCH, CANCEL, PURGE, MOVE_TO_DEAD_LETTERS, BATCH_CANCEL))
# Ops that change the configuration in force (the node, node/service/, follows it).
CONFIG_OPS = frozenset((CONFIGURE, ADD_KEY, REMOVE_KEY))


# ---------------------------------------------------------------------------- request ids
# The request-id slot of a command (its second element) is None, a bare request id (commands
# of release 0.1.0 and of this code until request ids were scoped), or a RequestId tuple
# (who, request_id, route, body_hash): the caller's key name (None without auth), the id the
# client sent, the route it came by ("enqueue", "enqueue_batch", "pause", "resume", ...) and a
# short hash of its request (made by the node, node/service/). The store keys a record by the
# request id alone for a caller without a name (and for bare ids), by (who, request id) else.
def request_id(who, rid: str, route: str, body_hash: str) -> tuple:
    return who, rid, route, body_hash


def request_key(slot):
    """The request-id store's key for a command's request-id slot (not None)."""
    if type(slot) is str:
        return slot
    who, rid = slot[0], slot[1]
    return rid if who is None else (who, rid)


# The request-id store's records (QueueMachine.rids: request key -> record): what the command
# was, its result and when the record expires; a scoped request id's record adds the route and
# the body hash its retries must match. Records live in memory only: snapshots and the digest
# write their fields as plain tuples (node/core/snapshot.py), as they did before they had names.
class RequestRecord(NamedTuple):
    """The record of a bare request id (0.1.0's form, kept from old journals and snapshots)."""
    op: str
    result: tuple
    expires: int


class ScopedRequestRecord(NamedTuple):
    """The record of an ops.request_id slot: the route and body hash its retries must match."""
    op: str
    result: tuple
    expires: int
    route: str
    body_hash: str


def request_record(op, result, expires, *scope):
    """A record from its fields as snapshots write them: (op, result, expires[, route, body_hash])."""
    return ScopedRequestRecord(op, result, expires, *scope) if scope else RequestRecord(op, result, expires)

# ---------------------------------------------------------------------------- results
# Kinds (the first three are also the forms release 0.1.0 kept under request ids).
ENQUEUED = "enqueued"               # 200 {"job_id", "deduplicated"}
JOB_ID = "job_id"                   # 200 {"job_id"}: ack, cancel
RESERVED = "reserved"               # 200 {"jobs": [Job...]}
NACKED = "nacked"                   # 200 {"job_id", "dead_lettered"}
EXTENDED = "extended"               # 200 {"job_id", "lease_expires_at_ms"}
ENQUEUED_BATCH = "enqueued_batch"   # 200 {"results": [...]}
ACKED_BATCH = "acked_batch"         # 200 {"results": [...]}
DRAINED = "drained"                 # 200 {"records": [DeadLetterRecord...]}
REQUEUED = "requeued"               # 200 {"requeued", "missing"}
DELETED = "deleted"                 # 200 {"deleted", "missing"}
PAUSED = "paused"                   # 200 {"queue", "paused"}
SWEPT = "swept"                     # 200 {"promoted", ...}: what each sweep step did
CONFIGURED = "configured"           # 200 {"version", "warnings"}
CONFIG_CONFLICT = "config_conflict"  # 409 failed_precondition: expect_version is not the version in force
CONFIG_INVALID = "config_invalid"   # 400 invalid_argument: the message names the key
KEY_ADDED = "key_added"             # 200 {"name", "role", "version"}
KEY_REMOVED = "key_removed"         # 200 {"name", "version"}
KEY_REFUSED = "key_refused"         # 409 failed_precondition: why (a code), the key's name
KEY_NOT_FOUND = "key_not_found"     # 404 not_found
MOVED = "moved"                     # 200 {"dead_lettered", "missing"}
PURGED = "purged"                   # 200 {"queue", "purged"}
QUEUE_DELETED = "queue_deleted"     # 200 {"queue"}
RECORDED = "recorded"               # 200 {"action"}: an audit entry of an action done elsewhere
CIRCUIT_CLOSED = "circuit_closed"   # 200 {"queue", "was"}: the circuit's state before the close
QUEUE_NOT_FOUND = "queue_not_found"  # 404 not_found: neither exists nor is declared
QUEUE_REFUSED = "queue_refused"     # 409 failed_precondition: why (declared, not_empty), counts
REQUEST_MISMATCH = "request_mismatch"   # 400 invalid_argument: same caller and id, another route or body (never stored)
JOB_NOT_FOUND = "job_not_found"     # 404 job_not_found (fencing)
ATTEMPT_MISMATCH = "attempt_mismatch"   # 409 attempt_mismatch (fencing)
REJECTED = "rejected"               # 422 rejected: a single enqueue refused at apply
BATCH_FULL = "batch_full"           # 422 batch_rejected: an atomic batch that does not fit
CANCEL_NOT_FOUND = "cancel_not_found"   # 404 not_found: no ready or scheduled job
CANCEL_IN_FLIGHT = "cancel_in_flight"   # 409 failed_precondition (no longer made: cancel removes an
                                        # in-flight job since 0.2.0; kept for stored results)
HAS_DEPENDENTS = "has_dependents"   # 409 failed_precondition: jobs wait on it (cancel without cascade)
CANCELLED = "cancelled"             # 200 {"job_id", "cancelled"}: a cascade's removed dependents
REPLACED = "replaced"               # 200 {"job_id", "deduplicated": true, "replaced": true}
DUPLICATE_STARTED = "duplicate_started"  # 409 failed_precondition: replace of a job already delivered
REQUEST_ID_REUSED = "request_id_reused"  # 400 invalid_argument (never stored)
MALFORMED = "malformed"             # 500 internal: not a command (never stored)
FAILED = "failed"                   # 500 internal: the handler raised and was reverted (never stored)
SCHEDULE_SAVED = "schedule_saved"   # 200 {"name", "version", "created", "next_fire_at_ms"}
SCHEDULE_DELETED = "schedule_deleted"   # 200 {"name"}
SCHEDULE_PAUSED = "schedule_paused"     # 200 {"name", "paused", "version"}
SCHEDULE_TRIGGERED = "schedule_triggered"   # 200 {"name", "job_id"}
SCHEDULE_NOT_FOUND = "schedule_not_found"   # 404 not_found
SCHEDULE_CONFLICT = "schedule_conflict"     # 409 failed_precondition: expect_version is not its version
SCHEDULE_INVALID = "schedule_invalid"       # 400 invalid_argument: the field and why
SCHEDULE_REFUSED = "schedule_refused"       # 429 overloaded: why (too_many), the bound
SCHEDULES_SEEDED = "schedules_seeded"       # 200 {"created": [names]}: empty once seeded before
BATCH_SAVED = "batch_saved"         # 200 {"batch_id", "results", "open"}: results as an atomic enqueue's
BATCH_NOT_FOUND = "batch_not_found"     # 404 not_found
BATCH_CANCELLED = "batch_cancelled"     # 200 {"batch_id", "cancelled", "running"}
BATCH_REFUSED = "batch_refused"     # 409 failed_precondition (exists, closed) or 429 overloaded (too_many,
                                    # too_many_members): why, the batch, the bound
ANSWER = "answer"                   # an answer kept verbatim (only from snapshots of 0.1.0 that
                                    # held one this version no longer makes)

SWEEP_STEPS = ("promoted", "leases_expired", "deadlines_expired", "dedup_expired",
               "request_ids_expired", "dead_letters_expired", "audit_expired", "ticks_fired",
               "key_timers_fired", "results_expired")

RESULTS: dict[str, tuple[str, ...]] = {
    ENQUEUED: ("job_id", "deduplicated"),
    JOB_ID: ("job_id",),
    RESERVED: ("jobs",),                    # (SHOWN_FIELDS tuple, ...) of node/core/jobs.py
    NACKED: ("job_id", "dead_lettered"),
    EXTENDED: ("job_id", "lease_expires_at_ms"),
    ENQUEUED_BATCH: ("results",),           # (job id, ENQUEUED or REPLACED result, or rejection dict, ...)
    ACKED_BATCH: ("results",),              # (JOB_ID, JOB_NOT_FOUND or ATTEMPT_MISMATCH result, ...)
    DRAINED: ("records",),                  # ((SHOWN_FIELDS tuple, cause, failed_at, final_attempt, reason), ...)
    REQUEUED: ("requeued", "missing"),
    DELETED: ("deleted", "missing"),
    PAUSED: ("queue", "paused"),
    SWEPT: SWEEP_STEPS,
    JOB_NOT_FOUND: ("job_id",),
    ATTEMPT_MISMATCH: ("job_id", "attempt", "asked"),   # attempt: the job's; asked: the request's
    REJECTED: ("rejection",),
    BATCH_FULL: ("errors",),                # ({"index", "rejection"}, ...)
    CANCEL_NOT_FOUND: ("job_id",),
    CANCEL_IN_FLIGHT: ("job_id",),
    HAS_DEPENDENTS: ("job_id", "dependents"),   # the first 100 waiting dependents, by id
    CANCELLED: ("job_id", "cancelled"),
    REPLACED: ("job_id",),
    DUPLICATE_STARTED: ("job_id",),
    REQUEST_ID_REUSED: ("request_id", "op"),
    MALFORMED: (),
    FAILED: ("op", "exception"),
    ANSWER: ("status", "body"),
    CONFIGURED: ("version", "warnings"),    # ({"code", ...fields}, ...)
    CONFIG_CONFLICT: ("version", "expected"),
    CONFIG_INVALID: ("message",),
    KEY_ADDED: ("name", "role", "version"),
    KEY_REMOVED: ("name", "version"),
    KEY_REFUSED: ("why", "name"),           # why: exists, digest_in_use, last_admin, first_not_admin, not_seeded
    KEY_NOT_FOUND: ("name",),
    MOVED: ("dead_lettered", "missing"),
    PURGED: ("queue", "purged"),
    QUEUE_DELETED: ("queue",),
    RECORDED: ("action",),
    CIRCUIT_CLOSED: ("queue", "was"),
    QUEUE_NOT_FOUND: ("queue",),
    QUEUE_REFUSED: ("why", "queue", "jobs"),   # why: declared, not_empty; jobs: {state: count}
    REQUEST_MISMATCH: ("request_id", "route", "what"),    # what: "operation" or "body"
    SCHEDULE_SAVED: ("name", "version", "created", "next_fire_at_ms"),
    SCHEDULE_DELETED: ("name",),
    SCHEDULE_PAUSED: ("name", "paused", "version"),
    SCHEDULE_TRIGGERED: ("name", "job_id"),
    SCHEDULE_NOT_FOUND: ("name",),
    SCHEDULE_CONFLICT: ("name", "version", "expected"),
    SCHEDULE_INVALID: ("field", "why"),
    SCHEDULE_REFUSED: ("why", "name", "limit"),
    SCHEDULES_SEEDED: ("created",),
    BATCH_SAVED: ("batch_id", "results", "open"),
    BATCH_NOT_FOUND: ("batch_id",),
    BATCH_REFUSED: ("why", "batch_id", "limit"),
    BATCH_CANCELLED: ("batch_id", "cancelled", "running"),
}
# Results a request id never remembers (docs/semantics.md "Request ids"; docs/api.md "Decisions
# where the rules above leave room").
NOT_REMEMBERED = frozenset((REQUEST_ID_REUSED, MALFORMED, FAILED, REQUEST_MISMATCH))

MALFORMED_RESULT = (MALFORMED,)


def enqueued(job_id: str, deduplicated: bool) -> tuple:
    return ENQUEUED, job_id, deduplicated


def job_id_result(job_id: str) -> tuple:
    return JOB_ID, job_id


def reserved(jobs: tuple) -> tuple:
    return RESERVED, jobs


def nacked(job_id: str, dead_lettered: bool) -> tuple:
    return NACKED, job_id, dead_lettered


def extended(job_id: str, lease_expires_at_ms: int) -> tuple:
    return EXTENDED, job_id, lease_expires_at_ms


def enqueued_batch(results: tuple) -> tuple:
    """A batch's results, one per job in order: a job made is its bare id (it stands for
    `enqueued(job_id, False)`: a result a request id keeps for its window, 64 bytes a job less
    than that tuple, docs/performance.md), a deduplicated or replaced job its ENQUEUED or REPLACED
    result, a refused one its rejection dict. Snapshots and the digest see the tuples
    (`expanded_batch`): the form every snapshot version reads."""
    return ENQUEUED_BATCH, results


def expanded_batch(results: tuple) -> tuple:
    """An ENQUEUED_BATCH's results with each bare job id as the ENQUEUED tuple it stands for."""
    return tuple((ENQUEUED, r, False) if type(r) is str else r for r in results)


def compact_batch(results: tuple) -> tuple:
    """The inverse of `expanded_batch`: each ENQUEUED tuple of a job made as its bare id."""
    return tuple(r[1] if type(r) is tuple and r[0] == ENQUEUED and r[2] is False else r for r in results)


def acked_batch(results: tuple) -> tuple:
    return ACKED_BATCH, results


def drained(records: tuple) -> tuple:
    return DRAINED, records


def requeued(requeued_ids: tuple, missing: tuple) -> tuple:
    return REQUEUED, requeued_ids, missing


def deleted(deleted_ids: tuple, missing: tuple) -> tuple:
    return DELETED, deleted_ids, missing


def paused_result(queue: str, paused: bool) -> tuple:
    return PAUSED, queue, paused


def swept(promoted: int, leases_expired: int, deadlines_expired: int, dedup_expired: int,
          request_ids_expired: int, dead_letters_expired: int, audit_expired: int = 0,
          ticks_fired: int = 0, key_timers_fired: int = 0, results_expired: int = 0) -> tuple:
    return (SWEPT, promoted, leases_expired, deadlines_expired, dedup_expired, request_ids_expired,
            dead_letters_expired, audit_expired, ticks_fired, key_timers_fired, results_expired)


def job_not_found(job_id: str) -> tuple:
    return JOB_NOT_FOUND, job_id


def attempt_mismatch(job_id: str, attempt: int, asked: int) -> tuple:
    return ATTEMPT_MISMATCH, job_id, attempt, asked


def rejected(rejection: dict) -> tuple:
    return REJECTED, rejection


def batch_full(errors: tuple) -> tuple:
    return BATCH_FULL, errors


def cancel_not_found(job_id: str) -> tuple:
    return CANCEL_NOT_FOUND, job_id


def cancel_in_flight(job_id: str) -> tuple:
    return CANCEL_IN_FLIGHT, job_id


def has_dependents(job_id: str, dependents: tuple) -> tuple:
    return HAS_DEPENDENTS, job_id, dependents


def cancelled(job_id: str, dependents: tuple) -> tuple:
    return CANCELLED, job_id, dependents


def replaced(job_id: str) -> tuple:
    return REPLACED, job_id


def duplicate_started(job_id: str) -> tuple:
    return DUPLICATE_STARTED, job_id


def duplicate(job_id: str) -> dict:
    """The rejection of an idempotency-key hit under the `reject` policy (fields only)."""
    return {"reason": "duplicate", "job_id": job_id}


def dependency_not_found(job_id: str) -> dict:
    """A dependency the machine knows nothing of (never made, or gone: past its retention) (fields only)."""
    return {"reason": "dependency_not_found", "job_id": job_id}


def duplicate_refused(job_id: str) -> dict:
    """A `replace` hit on a job that has been delivered, finished or dead-lettered (fields only)."""
    return {"reason": "duplicate_started", "job_id": job_id}


def request_id_reused(request_id: str, op: str) -> tuple:
    return REQUEST_ID_REUSED, request_id, op


def failed(op, exception: str) -> tuple:
    return FAILED, op, exception


def request_mismatch(request_id: str, route: str, what: str) -> tuple:
    return REQUEST_MISMATCH, request_id, route, what


def configured(version: int, warnings: tuple) -> tuple:
    return CONFIGURED, version, warnings


def config_conflict(version: int, expected) -> tuple:
    return CONFIG_CONFLICT, version, expected


def config_invalid(message: str) -> tuple:
    return CONFIG_INVALID, message


def key_added(name: str, role: str, version: int) -> tuple:
    return KEY_ADDED, name, role, version


def key_removed(name: str, version: int) -> tuple:
    return KEY_REMOVED, name, version


def key_refused(why: str, name) -> tuple:
    return KEY_REFUSED, why, name


def key_not_found(name: str) -> tuple:
    return KEY_NOT_FOUND, name


def moved(dead_lettered: tuple, missing: tuple) -> tuple:
    return MOVED, dead_lettered, missing


def purged(queue: str, n: int) -> tuple:
    return PURGED, queue, n


def queue_deleted(queue: str) -> tuple:
    return QUEUE_DELETED, queue


def recorded(action: str) -> tuple:
    return RECORDED, action


def circuit_closed(queue: str, was: str) -> tuple:
    return CIRCUIT_CLOSED, queue, was


def queue_not_found(queue: str) -> tuple:
    return QUEUE_NOT_FOUND, queue


def queue_refused(why: str, queue: str, jobs: dict) -> tuple:
    return QUEUE_REFUSED, why, queue, jobs


def queue_full(queue: str, limit: int) -> dict:
    """The `queue_full` rejection object of docs/api.md "Shapes" (fields only)."""
    return {"reason": "queue_full", "queue": queue, "limit": limit}


def schedule_saved(name: str, version: int, created: bool, next_fire_at_ms) -> tuple:
    return SCHEDULE_SAVED, name, version, created, next_fire_at_ms


def schedule_deleted(name: str) -> tuple:
    return SCHEDULE_DELETED, name


def schedule_paused(name: str, paused: bool, version: int) -> tuple:
    return SCHEDULE_PAUSED, name, paused, version


def schedule_triggered(name: str, job_id: str) -> tuple:
    return SCHEDULE_TRIGGERED, name, job_id


def schedule_not_found(name: str) -> tuple:
    return SCHEDULE_NOT_FOUND, name


def schedule_conflict(name: str, version: int, expected) -> tuple:
    return SCHEDULE_CONFLICT, name, version, expected


def schedule_invalid(field: str, why: str) -> tuple:
    return SCHEDULE_INVALID, field, why


def schedule_refused(why: str, name: str, limit: int) -> tuple:
    return SCHEDULE_REFUSED, why, name, limit


def schedules_seeded(created: tuple) -> tuple:
    return SCHEDULES_SEEDED, created


def batch_saved(batch_id: str, results: tuple, is_open: bool) -> tuple:
    return BATCH_SAVED, batch_id, results, is_open


def batch_not_found(batch_id: str) -> tuple:
    return BATCH_NOT_FOUND, batch_id


def batch_cancelled(batch_id: str, cancelled: tuple, running: int) -> tuple:
    return BATCH_CANCELLED, batch_id, cancelled, running


def batch_refused(why: str, batch_id: str, limit) -> tuple:
    return BATCH_REFUSED, why, batch_id, limit
