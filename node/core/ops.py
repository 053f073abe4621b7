"""Commands and results: their codes, their field names, their constructors and readers.

Commands cross Raft and live in journals and snapshots as pickles, so on the wire a command is
a plain tuple of builtins, `(op, request_id, *fields)`, never an object with a class path. The
op codes below are the wire codes release 0.1.0 wrote ("enq", "res", ...): journals of that
release replay as they are. `COMMANDS` names each command's fields in wire order, and the
handler of each op (node/core/handlers.py, node/core/sweep.py) takes exactly those names as
its parameters (node/machine.py checks this at import), so a handler reads names, not indexes.

Results are tuples too, `(kind, *fields)`, of codes and values, never of prose: they are what
the request-id store keeps (so what snapshots hold and `digest()` hashes) and what a replay
answers. `RESULTS` names their fields; node/core/answers.py renders a result into the HTTP
answer `(status, body)`, messages included, when the node sends it. So a message wording change
changes no replicated state.
"""
from __future__ import annotations

from operator import itemgetter

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

# The fields after (op, request_id), in wire order.
COMMANDS: dict[str, tuple[str, ...]] = {
    ENQUEUE: ("mode", "items"),                 # mode: SINGLE | BATCH | ATOMIC; items: ITEM tuples
                                                # (or, in a best-effort batch, a rejection dict)
    RESERVE: ("queue_names", "lease_ms", "max_jobs"),
    ACK: ("job_id", "attempt"),
    ACK_BATCH: ("pairs",),                      # ((job_id, attempt), ...)
    NACK: ("job_id", "attempt", "reason", "strategy", "delay_ms"),
    EXTEND: ("job_id", "attempt", "lease_ms"),
    DRAIN: ("queue", "max_records"),            # queue None = every queue
    REQUEUE: ("ids",),
    DELETE_DEAD_LETTERS: ("ids",),
    CANCEL: ("job_id",),
    PAUSE: ("queue", "paused"),
    SWEEP: (),
}
OPS = tuple(COMMANDS)

# Enqueue modes.
SINGLE, BATCH, ATOMIC = 0, 1, 2
# Nack strategies (SEMANTICS.md "Ack, nack, extend").
DEFAULT, DELAY, DEAD_LETTER = "default", "delay", "dead_letter"
STRATEGIES = (DEFAULT, DELAY, DEAD_LETTER)

# One job of an enqueue, as validation made it (node/validate.py): everything is final
# (defaults applied, max_attempts clamped, a past schedule turned into None).
ITEM: tuple[str, ...] = ("job_id", "queue", "job_type", "payload", "encoding", "priority",
                         "max_attempts", "custom", "trace", "scheduled_at", "deadline",
                         "idempotency_key")
ITEM_QUEUE = ITEM.index("queue")
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


def ack(rid, job_id: str, attempt: int) -> tuple:
    return ACK, rid, job_id, attempt


def ack_batch(rid, pairs: tuple) -> tuple:
    return ACK_BATCH, rid, pairs


def nack(rid, job_id: str, attempt: int, reason, strategy: str, delay_ms) -> tuple:
    return NACK, rid, job_id, attempt, reason, strategy, delay_ms


def extend(rid, job_id: str, attempt: int, lease_ms: int) -> tuple:
    return EXTEND, rid, job_id, attempt, lease_ms


def drain(rid, queue, max_records: int) -> tuple:
    return DRAIN, rid, queue, max_records


def requeue(rid, ids: tuple) -> tuple:
    return REQUEUE, rid, ids


def delete_dead_letters(rid, ids: tuple) -> tuple:
    return DELETE_DEAD_LETTERS, rid, ids


def cancel(rid, job_id: str) -> tuple:
    return CANCEL, rid, job_id


def pause(rid, queue: str, paused: bool) -> tuple:
    return PAUSE, rid, queue, paused


def sweep() -> tuple:
    return SWEEP, None


def item(job_id, queue, job_type, payload, encoding, priority, max_attempts, custom, trace,
         scheduled_at, deadline, idempotency_key) -> tuple:
    """One enqueue item, fields in ITEM order."""
    return (job_id, queue, job_type, payload, encoding, priority, max_attempts, custom, trace,
            scheduled_at, deadline, idempotency_key)


# Readers the node uses outside apply.
reserve_queue_names = reader(RESERVE, "queue_names")
ack_batch_pairs = reader(ACK_BATCH, "pairs")

# Ops after which a parked reserve may find a job ready (node/service.py wakes its waiters).
WAKING_OPS = frozenset((ENQUEUE, NACK, SWEEP, REQUEUE, PAUSE))

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
JOB_NOT_FOUND = "job_not_found"     # 404 job_not_found (fencing)
ATTEMPT_MISMATCH = "attempt_mismatch"   # 409 attempt_mismatch (fencing)
REJECTED = "rejected"               # 422 rejected: a single enqueue refused at apply
BATCH_FULL = "batch_full"           # 422 batch_rejected: an atomic batch that does not fit
CANCEL_NOT_FOUND = "cancel_not_found"   # 404 not_found: no ready or scheduled job
CANCEL_IN_FLIGHT = "cancel_in_flight"   # 409 failed_precondition
REQUEST_ID_REUSED = "request_id_reused"  # 400 invalid_argument (never stored)
MALFORMED = "malformed"             # 500 internal: not a command (never stored)
FAILED = "failed"                   # 500 internal: the handler raised and was reverted (never stored)
ANSWER = "answer"                   # an answer kept verbatim (only from snapshots of 0.1.0 that
                                    # held one this version no longer makes)

SWEEP_STEPS = ("promoted", "leases_expired", "deadlines_expired", "dedup_expired",
               "request_ids_expired", "dead_letters_expired")

RESULTS: dict[str, tuple[str, ...]] = {
    ENQUEUED: ("job_id", "deduplicated"),
    JOB_ID: ("job_id",),
    RESERVED: ("jobs",),                    # (SHOWN_FIELDS tuple, ...) of node/core/jobs.py
    NACKED: ("job_id", "dead_lettered"),
    EXTENDED: ("job_id", "lease_expires_at_ms"),
    ENQUEUED_BATCH: ("results",),           # (ENQUEUED result or rejection dict, ...)
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
    REQUEST_ID_REUSED: ("request_id", "op"),
    MALFORMED: (),
    FAILED: ("op", "exception"),
    ANSWER: ("status", "body"),
}
# Results a request id never remembers (SEMANTICS.md / README "Decisions").
NOT_REMEMBERED = frozenset((REQUEST_ID_REUSED, MALFORMED, FAILED))

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
    return ENQUEUED_BATCH, results


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
          request_ids_expired: int, dead_letters_expired: int) -> tuple:
    return (SWEPT, promoted, leases_expired, deadlines_expired, dedup_expired, request_ids_expired,
            dead_letters_expired)


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


def request_id_reused(request_id: str, op: str) -> tuple:
    return REQUEST_ID_REUSED, request_id, op


def failed(op, exception: str) -> tuple:
    return FAILED, op, exception


def queue_full(queue: str, limit: int) -> dict:
    """The `queue_full` rejection object of API.md (fields only)."""
    return {"reason": "queue_full", "queue": queue, "limit": limit}
