"""Answers: results (node/core/ops.py) rendered into what the API sends, and back.

The state machine returns results of codes and fields and keeps them under request ids; the
node renders them into `(http_status, body)` when it sends the answer (node/replication/proposer.py, the
bridge that hands committed results to the waiting requests). Every message text of an answer
that apply decides lives here, so a wording change never changes replicated state, the
request-id store or the digest, and a replay renders the very same answer as the first time.

`render` passes an answer that is already rendered (`(int status, dict body)`: the node's own
errors, such as `overloaded` or `unavailable`) through unchanged.

`result_of_answer` goes the other way, for snapshots of release 0.1.0, whose request-id store
kept most answers rendered (`(status, body)`, English messages included): they are read back
into the results this version would have kept, so the same replays come out.
"""
from __future__ import annotations

import inspect
import re
from binascii import a2b_base64, b2a_base64
from itertools import starmap

from .errors import error
from . import ops
from .ops import (ACKED_BATCH, ANSWER, ATTEMPT_MISMATCH, BATCH_FULL, CANCEL_IN_FLIGHT, CANCEL_NOT_FOUND,
                  DELETED, DRAINED, ENQUEUED, ENQUEUED_BATCH, EXTENDED, FAILED, JOB_ID, JOB_NOT_FOUND,
                  MALFORMED, NACKED, PAUSED, REJECTED, REQUEST_ID_REUSED, REQUEUED, RESERVED, SWEEP_STEPS,
                  SWEPT, CONFIGURED, CONFIG_CONFLICT, CONFIG_INVALID, KEY_ADDED, KEY_REMOVED, KEY_REFUSED,
                  KEY_NOT_FOUND, MOVED, PURGED, QUEUE_DELETED, RECORDED, QUEUE_NOT_FOUND, QUEUE_REFUSED, REQUEST_MISMATCH,
                  REPLACED, DUPLICATE_STARTED)

# ---------------------------------------------------------------------------- messages
JOB_NOT_FOUND_MESSAGE = "job not found: it is not in flight (acked, expired, dead-lettered or unknown)"
CANCEL_NOT_FOUND_MESSAGE = "no ready or scheduled job with this id"
CANCEL_IN_FLIGHT_MESSAGE = "the job is in flight; it can only be acked, nacked or left to expire"
BATCH_FULL_MESSAGE = "the batch was refused: queue full"
BATCH_DUPLICATE_MESSAGE = "the batch was refused: an idempotency key hit its duplicate policy (reject, or replace of a started job)"
DUPLICATE_STARTED_MESSAGE = ("duplicate_policy replace: the job with this idempotency key has been delivered, "
                             "is in flight, finished or dead-lettered; it can no longer be replaced")


def batch_full_message(errors) -> str:
    if any(e.get("rejection", {}).get("reason") in ("duplicate", "duplicate_started") for e in errors):
        return BATCH_DUPLICATE_MESSAGE
    return BATCH_FULL_MESSAGE
MALFORMED_MESSAGE = "malformed command"


def attempt_mismatch_message(attempt: int, asked: int) -> str:
    return f"attempt mismatch: the job is in flight under attempt {attempt}, not {asked}"


def rejected_message(rejection: dict) -> str:
    return f"job refused: {rejection['reason']}"


def request_id_reused_message(request_id: str, op: str) -> str:
    return f"Request-Id {request_id!r} was already used for a different operation ({op})"


def failed_message(op, exception: str) -> str:
    return f"command {op!r} failed and was not applied: {exception}"


def request_mismatch_message(request_id: str, route: str, what: str) -> str:
    if what == "operation":
        return (f"Request-Id {request_id!r} was already used for another operation ({route}); "
                "use a new Request-Id for each request")
    return (f"Request-Id {request_id!r} was already used for a request with another body ({route}); "
            "a retry must send the same request, a new request a new Request-Id")


def config_conflict_message(version: int, expected) -> str:
    return (f"expect_version {expected!r} is not the configuration in force (version {version}); "
            "read it again (GET /v1/config) and retry with its version")


KEY_REFUSED_MESSAGES = {
    "exists": "an API key with this name exists already (remove it first to replace it)",
    "digest_in_use": "another API key has this key (its SHA-256): make a new random key",
    "last_admin": "this is the last admin key: removing it would leave nobody who can change keys or config",
    "first_not_admin": "the first API key must be an admin key (turning auth on with a lesser key would lock "
                       "every admin action out)",
    "no_admin": "a non-empty key set needs at least one admin key (nobody could change keys or config)",
    "not_seeded": "the cluster has no configuration yet; retry in a moment",
}


def queue_refused_message(why: str, queue: str, jobs: dict) -> str:
    if why == "declared":
        return f"queue {queue!r} is declared in the configuration: remove its [[queues]] entry first"
    held = ", ".join(f"{n} {state}" for state, n in jobs.items() if n)
    return f"queue {queue!r} is not empty ({held}): only a queue with no job in any state can be deleted"


# ---------------------------------------------------------------------------- jobs
def render_job(id, queue, job_type, payload, encoding, priority, custom, trace, enqueued_at,
               scheduled_at, attempt, max_attempts, lease_expires, deadline, timeout_ms=None,
               releases=0, resource=None, key=None, depends_on=None) -> dict:
    """The Job shape of docs/api.md "Shapes" from SHOWN_FIELDS (node/core/jobs.py). `timeout_ms`
    and `releases` are shown when set (a job that uses neither renders byte for byte as in 0.1.0;
    GET /v1/jobs/{id} always shows both); `resource` when the job has one, like `deadline_at_ms`,
    and so its `key` and its `depends_on`."""
    if payload is not None and trace is None:
        # The common shape, built in one go (same keys, same order as below).
        out = {"id": id, "queue": queue, "job_type": job_type,
               "payload": {"data_b64": b2a_base64(payload, newline=False).decode("ascii"), "encoding": encoding},
               "priority": priority, "custom": custom if custom is not None else {},
               "enqueued_at_ms": enqueued_at, "scheduled_at_ms": scheduled_at,
               "attempt": attempt, "max_attempts": max_attempts, "lease_expires_at_ms": lease_expires}
        if deadline is not None:
            out["deadline_at_ms"] = deadline
        if timeout_ms is not None or releases:
            out["timeout_ms"] = timeout_ms
            out["releases"] = releases
        if resource is not None:
            out["resource"] = resource
        if key is not None:
            out["key"] = key
        if depends_on is not None:
            out["depends_on"] = render_depends_on(depends_on)
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
    if timeout_ms is not None or releases:
        out["timeout_ms"] = timeout_ms
        out["releases"] = releases
    if resource is not None:
        out["resource"] = resource
    if key is not None:
        out["key"] = key
    if depends_on is not None:
        out["depends_on"] = render_depends_on(depends_on)
    return out


def render_depends_on(pairs) -> list:
    return [{"job_id": job_id, "policy": policy} for job_id, policy in pairs]


def shown_fields_of(shown: dict) -> tuple:
    """SHOWN_FIELDS back from a rendered job (render_job's inverse, for snapshots that kept
    rendered jobs under request ids)."""
    p = shown.get("payload")
    t = shown.get("trace_context")
    return (shown["id"], shown["queue"], shown["job_type"],
            a2b_base64(p["data_b64"]) if p is not None else None, p["encoding"] if p is not None else None,
            shown["priority"], shown["custom"] or None, (t["traceparent"], t["tracestate"]) if t is not None else None,
            shown["enqueued_at_ms"], shown["scheduled_at_ms"], shown["attempt"], shown["max_attempts"],
            shown["lease_expires_at_ms"], shown.get("deadline_at_ms"), shown.get("timeout_ms"),
            shown.get("releases", 0)) + _later_shown(shown)


def _later_shown(shown: dict) -> tuple:
    """The trailing fields of jobs.shown_fields: resource, key and depends_on, as far as set."""
    r, k, d = shown.get("resource"), shown.get("key"), shown.get("depends_on")
    if d:
        return r, k, tuple((x["job_id"], x["policy"]) for x in d)
    if k is not None:
        return r, k
    return () if r is None else (r,)


def render_dead_letter(fields: tuple, cause: str, failed_at: int, final_attempt: int, reason) -> dict:
    """The DeadLetterRecord shape of docs/api.md "Shapes"."""
    return {"job": render_job(*fields), "cause": cause, "failed_at_ms": failed_at,
            "final_attempt": final_attempt, "last_reason": reason}


# ---------------------------------------------------------------------------- results -> answers
def render(result) -> tuple:
    """The answer `(http_status, body)` to send for a result (or an answer, unchanged)."""
    kind = result[0]
    # The answers most requests get, first.
    if kind == ENQUEUED:
        _, job_id, deduplicated = result
        return 200, {"job_id": job_id, "deduplicated": deduplicated}
    if kind == JOB_ID:
        _, job_id = result
        return 200, {"job_id": job_id}
    if kind == RESERVED:
        _, jobs = result
        if len(jobs) == 1:          # the common case, without building an iterator
            return 200, {"jobs": [render_job(*jobs[0])]}
        return 200, {"jobs": list(starmap(render_job, jobs))}
    if type(kind) is int:
        return result
    return _RENDER[kind](*result[1:])


def _enqueued_batch(results):
    # A job made is its bare id (node/core/ops.py `enqueued_batch`); a deduplicated or replaced
    # one its ENQUEUED or REPLACED result, answered as alone; a refused one its rejection.
    return 200, {"results": [{"job_id": x, "deduplicated": False} if type(x) is str
                             else render(x)[1] if type(x) is tuple else {"rejection": x} for x in results]}


def _acked_batch(results):
    # Each result answered as alone: {"job_id"}, or the fencing error's body.
    return 200, {"results": [render(x)[1] for x in results]}


def _swept(promoted, leases_expired, deadlines_expired, dedup_expired, request_ids_expired,
           dead_letters_expired, audit_expired, ticks_fired, key_timers_fired, results_expired=0):
    return 200, dict(zip(SWEEP_STEPS, (promoted, leases_expired, deadlines_expired, dedup_expired,
                                       request_ids_expired, dead_letters_expired, audit_expired, ticks_fired,
                                       key_timers_fired, results_expired)))


def _batch_refused(why, batch_id, limit):
    if why in ("too_many", "too_many_members"):
        what = "max_batches batches" if why == "too_many" else "max_batch_members members in one batch"
        return error("overloaded", f"the cluster holds {what} ({limit}) already", reason=why, batch_id=batch_id,
                     limit=limit)
    text = "a batch of this id exists" if why == "exists" else "the batch is closed: no member can be added"
    return error("failed_precondition", text, reason=why, batch_id=batch_id)


def _batch_saved(batch_id, results, open):
    return 200, {"batch_id": batch_id, "open": open, "results": _enqueued_batch(results)[1]["results"]}


def _schedule_refused(why, name, limit):
    return error("overloaded", f"the cluster holds max_schedules ({limit}) schedules already: "
                 "delete one first, or raise limits.max_schedules", reason=why, limit=limit)


# kind -> renderer(*fields): each takes its result's fields by their ops.RESULTS names (checked
# below), so a renderer reads names, not positions.
_RENDER = {
    NACKED: lambda job_id, dead_lettered: (200, {"job_id": job_id, "dead_lettered": dead_lettered}),
    EXTENDED: lambda job_id, lease_expires_at_ms: (200, {"job_id": job_id, "lease_expires_at_ms": lease_expires_at_ms}),
    ENQUEUED_BATCH: _enqueued_batch,
    ACKED_BATCH: _acked_batch,
    DRAINED: lambda records: (200, {"records": list(starmap(render_dead_letter, records))}),
    REQUEUED: lambda requeued, missing: (200, {"requeued": list(requeued), "missing": list(missing)}),
    DELETED: lambda deleted, missing: (200, {"deleted": list(deleted), "missing": list(missing)}),
    PAUSED: lambda queue, paused: (200, {"queue": queue, "paused": paused}),
    SWEPT: _swept,
    JOB_NOT_FOUND: lambda job_id: error("job_not_found", JOB_NOT_FOUND_MESSAGE, job_id=job_id),
    ATTEMPT_MISMATCH: lambda job_id, attempt, asked: error("attempt_mismatch", attempt_mismatch_message(attempt, asked),
                                                           job_id=job_id, attempt=attempt),
    REJECTED: lambda rejection: error("rejected", rejected_message(rejection), rejection=rejection),
    ops.BATCH_SAVED: _batch_saved,
    ops.BATCH_NOT_FOUND: lambda batch_id: error("not_found", f"no batch {batch_id}", batch_id=batch_id),
    ops.BATCH_REFUSED: _batch_refused,
    ops.BATCH_CANCELLED: lambda batch_id, cancelled, running: (200, {"batch_id": batch_id, "cancelled": list(cancelled),
                                                                     "running": running}),
    BATCH_FULL: lambda errors: error("batch_rejected", batch_full_message(errors), errors=list(errors)),
    REPLACED: lambda job_id: (200, {"job_id": job_id, "deduplicated": True, "replaced": True}),
    DUPLICATE_STARTED: lambda job_id: error("failed_precondition", DUPLICATE_STARTED_MESSAGE,
                                            reason="duplicate_started", job_id=job_id),
    CANCEL_NOT_FOUND: lambda job_id: error("not_found", CANCEL_NOT_FOUND_MESSAGE, job_id=job_id),
    CANCEL_IN_FLIGHT: lambda job_id: error("failed_precondition", CANCEL_IN_FLIGHT_MESSAGE, job_id=job_id),
    ops.HAS_DEPENDENTS: lambda job_id, dependents: error(
        "failed_precondition", "jobs wait on this one (depends_on): cancel with cascade=true to cancel them too",
        reason="has_dependents", job_id=job_id, dependents=list(dependents)),
    ops.CANCELLED: lambda job_id, cancelled: (200, {"job_id": job_id, "cancelled": list(cancelled)}),
    REQUEST_ID_REUSED: lambda request_id, op: error("invalid_argument", request_id_reused_message(request_id, op)),
    MALFORMED: lambda: error("internal", MALFORMED_MESSAGE),
    FAILED: lambda op, exception: error("internal", failed_message(op, exception)),
    ANSWER: lambda status, body: (status, body),
    CONFIGURED: lambda version, warnings: (200, {"version": version, "warnings": list(warnings)}),
    CONFIG_CONFLICT: lambda version, expected: error("failed_precondition", config_conflict_message(version, expected),
                                                     version=version),
    CONFIG_INVALID: lambda message: error("invalid_argument", message),
    KEY_ADDED: lambda name, role, version: (200, {"name": name, "role": role, "version": version}),
    KEY_REMOVED: lambda name, version: (200, {"name": name, "version": version}),
    KEY_REFUSED: lambda why, name: error("failed_precondition", KEY_REFUSED_MESSAGES.get(why, why), reason=why, name=name),
    KEY_NOT_FOUND: lambda name: error("not_found", f"no API key named {name!r}", name=name),
    MOVED: lambda dead_lettered, missing: (200, {"dead_lettered": list(dead_lettered), "missing": list(missing)}),
    PURGED: lambda queue, purged: (200, {"queue": queue, "purged": purged}),
    QUEUE_DELETED: lambda queue: (200, {"queue": queue}),
    RECORDED: lambda action: (200, {"action": action}),
    ops.CIRCUIT_CLOSED: lambda queue, was: (200, {"queue": queue, "circuit": "closed", "was": was}),
    QUEUE_NOT_FOUND: lambda queue: error("not_found", f"queue {queue!r} neither exists nor is declared", queue=queue),
    QUEUE_REFUSED: lambda why, queue, jobs: error("failed_precondition", queue_refused_message(why, queue, jobs),
                                                  reason=why, queue=queue, jobs=jobs),
    REQUEST_MISMATCH: lambda request_id, route, what: error("invalid_argument",
                                                            request_mismatch_message(request_id, route, what)),
    ops.SCHEDULE_SAVED: lambda name, version, created, next_fire_at_ms: (
        200, {"name": name, "version": version, "created": created, "next_fire_at_ms": next_fire_at_ms}),
    ops.SCHEDULE_DELETED: lambda name: (200, {"name": name, "deleted": True}),
    ops.SCHEDULE_PAUSED: lambda name, paused, version: (200, {"name": name, "paused": paused, "version": version}),
    ops.SCHEDULE_TRIGGERED: lambda name, job_id: (200, {"name": name, "job_id": job_id}),
    ops.SCHEDULE_NOT_FOUND: lambda name: error("not_found", f"no schedule named {name!r}", name=name),
    ops.SCHEDULE_CONFLICT: lambda name, version, expected: error(
        "failed_precondition", schedule_conflict_message(name, version, expected), name=name, version=version),
    ops.SCHEDULE_INVALID: lambda field, why: error("invalid_argument", f"{field}: {SCHEDULE_INVALID_WHY.get(why, why)}",
                                                   field=field),
    ops.SCHEDULES_SEEDED: lambda created: (200, {"created": list(created)}),
    ops.SCHEDULE_REFUSED: _schedule_refused,
}
if set(_RENDER) | {ENQUEUED, JOB_ID, RESERVED} != set(ops.RESULTS):
    raise RuntimeError("every result kind of node/core/ops.py needs a renderer here")
for _kind, _renderer in _RENDER.items():
    if tuple(inspect.signature(_renderer).parameters) != ops.RESULTS[_kind]:
        raise RuntimeError(f"the renderer of {_kind!r} does not take the fields ops.RESULTS names")
del _kind, _renderer


SCHEDULE_INVALID_WHY = {"unknown_queue": "the queue is not declared and strict_queues is on: declare it first"}


def schedule_conflict_message(name: str, version: int, expected) -> str:
    if version == 0:
        return f"expect_version {expected!r}: there is no schedule named {name!r} (expect_version 0 creates one)"
    return (f"expect_version {expected!r} is not schedule {name!r}'s version ({version}); read it again "
            "(GET /v1/schedules/{name}) and retry with its version")


def render_template(t: dict) -> dict:
    """A schedule's job template in the API's shape (the payload as base64, like a Job's)."""
    out = {k: v for k, v in t.items() if k not in ("payload", "encoding")}
    out["payload"] = (None if t["payload"] is None else
                      {"data_b64": b2a_base64(t["payload"], newline=False).decode("ascii"), "encoding": t["encoding"]})
    out["custom"] = t["custom"] if t["custom"] is not None else {}
    return out


# ---------------------------------------------------------------------------- answers -> results
_MISMATCH = re.compile(r"attempt mismatch: the job is in flight under attempt (-?\d+), not (-?\d+)")


def _error_result(body: dict):
    """The result behind a rendered error body, or None when it is not one apply makes."""
    e = body.get("error")
    if not isinstance(e, dict):
        return None
    code, message = e.get("code"), e.get("message")
    if code == "job_not_found" and set(e) == {"code", "message", "job_id"} and message == JOB_NOT_FOUND_MESSAGE:
        return ops.job_not_found(e["job_id"])
    if code == "attempt_mismatch" and set(e) == {"code", "message", "job_id", "attempt"}:
        m = _MISMATCH.fullmatch(message or "")
        if m is not None and int(m.group(1)) == e["attempt"]:
            return ops.attempt_mismatch(e["job_id"], e["attempt"], int(m.group(2)))
    if code == "rejected" and set(e) == {"code", "message", "rejection"}:
        if isinstance(e["rejection"], dict) and message == rejected_message(e["rejection"]):
            return ops.rejected(e["rejection"])
    if code == "batch_rejected" and set(e) == {"code", "message", "errors"} and message == BATCH_FULL_MESSAGE:
        return ops.batch_full(tuple(e["errors"]))
    if code == "not_found" and set(e) == {"code", "message", "job_id"} and message == CANCEL_NOT_FOUND_MESSAGE:
        return ops.cancel_not_found(e["job_id"])
    if (code == "failed_precondition" and set(e) == {"code", "message", "job_id"}
            and message == CANCEL_IN_FLIGHT_MESSAGE):
        return ops.cancel_in_flight(e["job_id"])
    return None


def _ok_result(op: str, body: dict):
    keys = set(body)
    if keys == {"job_id", "deduplicated"}:
        return ops.enqueued(body["job_id"], body["deduplicated"])
    if keys == {"job_id"}:
        return ops.job_id_result(body["job_id"])
    if op == ops.RESERVE and keys == {"jobs"}:
        return ops.reserved(tuple(shown_fields_of(j) for j in body["jobs"]))
    if op == ops.NACK and keys == {"job_id", "dead_lettered"}:
        return ops.nacked(body["job_id"], body["dead_lettered"])
    if op == ops.EXTEND and keys == {"job_id", "lease_expires_at_ms"}:
        return ops.extended(body["job_id"], body["lease_expires_at_ms"])
    if op == ops.ENQUEUE and keys == {"results"}:
        out = []
        for r in body["results"]:
            if set(r) == {"job_id", "deduplicated"}:
                out.append(ops.enqueued(r["job_id"], r["deduplicated"]))
            elif set(r) == {"rejection"} and isinstance(r["rejection"], dict):
                out.append(r["rejection"])
            else:
                return None
        return ops.enqueued_batch(tuple(out))
    if op == ops.ACK_BATCH and keys == {"results"}:
        out = []
        for r in body["results"]:
            x = ops.job_id_result(r["job_id"]) if set(r) == {"job_id"} else _error_result(r)
            if x is None:
                return None
            out.append(x)
        return ops.acked_batch(tuple(out))
    if op == ops.DRAIN and keys == {"records"}:
        return ops.drained(tuple((shown_fields_of(r["job"]), r["cause"], r["failed_at_ms"], r["final_attempt"],
                                  r["last_reason"]) for r in body["records"]))
    if op == ops.REQUEUE and keys == {"requeued", "missing"}:
        return ops.requeued(tuple(body["requeued"]), tuple(body["missing"]))
    if op == ops.DELETE_DEAD_LETTERS and keys == {"deleted", "missing"}:
        return ops.deleted(tuple(body["deleted"]), tuple(body["missing"]))
    if op == ops.PAUSE and keys == {"queue", "paused"}:
        return ops.paused_result(body["queue"], body["paused"])
    if op == ops.SWEEP and list(body) == list(SWEEP_STEPS):
        return ops.swept(*body.values())
    return None


def result_of_answer(op: str, answer) -> tuple:
    """The result to keep for a request id whose answer a snapshot holds rendered, as
    `(status, body)`. Whatever this version would not have made is kept verbatim (an ANSWER
    result), so its replay is still exactly what was answered."""
    try:
        status, body = answer
        result = None
        if status == 200:
            result = _ok_result(op, body)
        elif type(status) is int:
            result = _error_result(body)
        if result is not None and render(result) == (status, body):
            return result
    except Exception:           # not a shape apply ever made: keep it as it is
        pass
    return ops.ANSWER, answer[0], answer[1]
