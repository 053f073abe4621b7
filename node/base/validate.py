"""From request bodies to state-machine commands: validation exactly as docs/api.md
"Shapes" lists it.

Runs on the leader before proposing (so a bad request costs no Raft round and changes nothing)
and is pure: the caller passes `now_ms` and a `new_id` function. Request-level problems raise
`ApiError` (400 `invalid_argument`, 409 `unknown_queues`); everything wrong with one job of an
enqueue becomes that job's rejection, first failing check wins, in the order of docs/api.md
"Shapes". Checks that depend on the state (dedup, `queue_full`) happen at apply.

A command is `(op, request_id, *fields)` of builtins, built by the constructors of
`node.core.ops` (which names every field); see `node.core.handlers` for what each op does.
"""
from __future__ import annotations

import binascii
import hashlib
import re
import sys

from . import bounds
import orjson

from ..core.errors import ApiError, invalid
from ..core.limits import MAX_RESOURCE_BYTES, ConfigError, Limits, check_key, check_queue_name
from ..core import ops
from ..core.ops import ATOMIC, BATCH, SINGLE

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
MAX_ADMIN_IDS = 1000
_HEX = frozenset("0123456789abcdefABCDEF")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def valid_request_id(rid) -> bool:
    """A Request-Id (header or session frame field): 1..128 visible ASCII characters
    (0x21-0x7E): ASCII, printable and no space, three C-speed checks (a per-character generator
    cost ~5 µs a frame, more than the rest of a frame's checks together)."""
    return type(rid) is str and 1 <= len(rid) <= 128 and rid.isascii() and rid.isprintable() and " " not in rid


def request_slot(who, rid, route: str, body, param=None):
    """The request-id slot of a command (node/core/ops.py `request_id`), or None without a
    Request-Id: the caller's key name, the id, the route, and a short hash of the request (its
    body as orjson with sorted keys, and the path's job id or queue name), blake2b-128. A
    reuse of the id by the same caller with another route or body is refused at apply."""
    if rid is None:
        return None
    if " " in rid:
        # A follower's own id (node/service/forwarding.py: with spaces, never a client's) is made
        # for one call, re-sent only with that call's body: no hash to compare (its CPU, and 32
        # bytes of every record, spared on the path of every forwarded write).
        return ops.request_id(who, rid, route, "")
    try:
        data = orjson.dumps([param, body], option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        data = repr([param, body]).encode()
    return ops.request_id(who, rid, route, hashlib.blake2b(data, digest_size=16).hexdigest())


def is_int(v) -> bool:
    return type(v) is int and INT64_MIN <= v <= INT64_MAX


def canonical_uuid(value) -> str | None:
    """The lowercase form of a canonical UUID text, or None (docs/api.md "Conventions")."""
    if not isinstance(value, str) or len(value) != 36 or _UUID.fullmatch(value) is None:
        return None
    return value.lower()


def job_id_arg(value) -> str:
    jid = canonical_uuid(value)
    if jid is None:
        raise invalid(f"job id must be a canonical UUID (36 characters, hyphens at 8, 13, 18, 23), got {value!r}")
    return jid


def require_object(body) -> dict:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


def _opt_int(body: dict, key: str, default, minimum: int, what: str = ""):
    v = body.get(key)
    if v is None:               # absent or null: the default (docs/api.md "Conventions": null is left out)
        return default
    if not is_int(v) or v < minimum:
        raise invalid(f"{key} must be an integer >= {minimum}{what}, got {v!r}")
    return v


class _Reject(Exception):
    def __init__(self, rejection: dict):
        self.rejection = rejection


def _bad(message: str):
    raise _Reject({"reason": "invalid_request", "message": message})


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8")) if not s.isascii() else len(s)


def _too_long(field: str, key: str, limit: int, actual: int) -> dict:
    """What a string over its length limit gets: the field, the limit's key, the sizes."""
    bounds.hit(key)
    return {"message": f"{field} is {actual} bytes, more than {key} ({limit})", "field": field,
            "limit": limit, "actual": actual}


def _check_lengths(encoding, trace, limits: Limits) -> None:
    """The free-text fields a job carries to every replica (rejection `invalid_request`)."""
    if encoding is not None:
        n = _utf8_len(encoding)
        if n > limits.max_encoding_bytes:
            raise _Reject({"reason": "invalid_request",
                           **_too_long("payload.encoding", "max_encoding_bytes", limits.max_encoding_bytes, n)})
    if trace is not None:
        n = _utf8_len(trace[0]) + (_utf8_len(trace[1]) if trace[1] is not None else 0)
        if n > limits.max_trace_context_bytes:
            raise _Reject({"reason": "invalid_request", **_too_long(
                "trace_context", "max_trace_context_bytes", limits.max_trace_context_bytes, n)})


def _check_text(body: dict, key: str, limit_key: str, limits: Limits):
    """An optional non-empty string field of a request, within its byte limit (400 naming it)."""
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v:
        raise invalid(f"{key} must be a non-empty string")
    limit = getattr(limits, limit_key)
    n = _utf8_len(v)
    if n > limit:
        raise ApiError("invalid_argument", **_too_long(key, limit_key, limit, n))
    return v


def _structure(job) -> tuple:
    """Structural checks (rejection `invalid_request`); returns the parsed fields."""
    if not isinstance(job, dict):
        _bad("each job must be a JSON object")
    queue = job.get("queue")
    if not isinstance(queue, str) or not queue:
        _bad("queue is required and must be a non-empty string")
    why = check_queue_name(queue, 0)
    if why:
        _bad(why)
    job_type = job.get("job_type")
    if not isinstance(job_type, str) or not job_type:
        _bad("job_type is required and must be a non-empty string")
    payload = encoding = None
    p = job.get("payload")
    if p is not None:
        payload, encoding = _payload(p)
    key = job.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not key):
        _bad("idempotency_key must be a non-empty string")
    priority = job.get("priority")
    if priority is not None and (not is_int(priority) or not 0 <= priority <= 9):
        _bad(f"priority must be an integer 0..9, got {priority!r}")
    max_attempts = job.get("max_attempts")
    if max_attempts is not None and (not is_int(max_attempts) or max_attempts < 1):
        _bad(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
    custom = job.get("custom")
    if custom is not None:
        custom = _custom(custom)
    scheduled = job.get("scheduled_at_ms")
    if scheduled is not None and not is_int(scheduled):
        _bad(f"scheduled_at_ms must be an integer (ms since the epoch), got {scheduled!r}")
    delay = job.get("delay_ms")
    if delay is not None and (not is_int(delay) or delay < 0):
        _bad(f"delay_ms must be an integer >= 0, got {delay!r}")
    if scheduled is not None and delay is not None:
        _bad("give scheduled_at_ms or delay_ms, not both")
    trace = job.get("trace_context")
    if trace is not None:
        trace = _trace(trace)
    deadline = job.get("deadline_at_ms")
    if deadline is not None and not is_int(deadline):
        _bad(f"deadline_at_ms must be an integer (ms since the epoch), got {deadline!r}")
    return (queue, job_type, payload, encoding, key, priority, max_attempts, custom,
            scheduled, delay, trace, deadline)


def _payload(p) -> tuple[bytes, str]:
    """A job's `payload` {data_b64, encoding}: its bytes (at least one) and encoding."""
    if not isinstance(p, dict):
        _bad("payload must be an object {data_b64, encoding}")
    data = p.get("data_b64")
    encoding = p.get("encoding")
    if not isinstance(data, str):
        _bad("payload.data_b64 must be a base64 string")
    if not isinstance(encoding, str) or not encoding:
        _bad("payload.encoding must be a non-empty string")
    try:
        payload = binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        _bad("payload.data_b64 is not valid base64")
    if not payload:
        _bad("payload.data_b64 must decode to at least one byte (omit payload for a job without data)")
    return payload, sys.intern(encoding)


def _custom(custom) -> dict | None:
    """A job's `custom` fields: string, integer, float or boolean values (none: None)."""
    if not isinstance(custom, dict):
        _bad("custom must be an object of string, integer, float or boolean values")
    for k, v in custom.items():
        if not k:
            _bad("custom keys must be non-empty")
        if not (isinstance(v, (str, bool, float)) or is_int(v)):
            _bad(f"custom[{k!r}] must be a string, integer, float or boolean")
    return custom or None


def _trace(trace) -> tuple[str, str | None]:
    """A job's `trace_context` {traceparent, tracestate} (W3C Trace Context)."""
    if not isinstance(trace, dict):
        _bad("trace_context must be an object {traceparent, tracestate}")
    tp, ts = trace.get("traceparent"), trace.get("tracestate")
    if not isinstance(tp, str) or not tp:
        _bad("trace_context.traceparent must be a non-empty string")
    if ts is not None and not isinstance(ts, str):
        _bad("trace_context.tracestate must be a string or null")
    return tp, ts


def _lifecycle_fields(job: dict) -> tuple:
    """The enqueue fields of docs/semantics.md "Execution timeout" and "Duplicate policy":
    timeout_ms (integer >= 1 or null) and duplicate_policy (one of ops.DUPLICATE_POLICIES or
    null); rejection `invalid_request` otherwise."""
    timeout = job.get("timeout_ms")
    if timeout is not None and (not is_int(timeout) or timeout < 1):
        _bad(f"timeout_ms must be an integer >= 1 (ms), got {timeout!r}")
    policy = job.get("duplicate_policy")
    if policy is not None and policy not in ops.DUPLICATE_POLICIES:
        _bad(f"duplicate_policy must be \"return_existing\", \"reject\" or \"replace\", got {policy!r}")
    return timeout, policy


def check_job(job, limits: Limits, now_ms: int, new_id, refs=None) -> tuple:
    """One EnqueueRequest → an enqueue item (node.core.ops.ITEM); raises _Reject with the first
    failing check. `refs`: the ids of the request's earlier jobs by their `ref` (a batch's)."""
    (queue, job_type, payload, encoding, key, priority, max_attempts, custom,
     scheduled, delay, trace, deadline) = _structure(job)
    if encoding is not None or trace is not None:
        _check_lengths(encoding, trace, limits)
    if limits.strict_queues and queue not in limits.queues:
        raise _Reject({"reason": "unknown_queue", "queue": queue})
    n = len(queue) if queue.isascii() else len(queue.encode("utf-8"))        # _utf8_len, inline
    if n > limits.max_queue_name_bytes:
        raise _Reject({"reason": "queue_name_too_long", "limit": limits.max_queue_name_bytes, "actual": n})
    n = len(job_type) if job_type.isascii() else len(job_type.encode("utf-8"))
    if n > limits.max_job_type_bytes:
        raise _Reject({"reason": "job_type_name_too_long", "limit": limits.max_job_type_bytes, "actual": n})
    ql = limits.queue(queue)
    if ql.allowed_job_types is not None and job_type not in ql.allowed_job_types:
        raise _Reject({"reason": "job_type_not_allowed", "job_type": job_type, "allowed": list(ql.allowed_job_types)})
    if key is not None:
        n = _utf8_len(key)
        if n > limits.max_idempotency_key_bytes:
            raise _Reject({"reason": "idempotency_key_too_long", "limit": limits.max_idempotency_key_bytes, "actual": n})
    if payload is not None:
        if len(payload) > ql.max_payload_bytes:
            raise _Reject({"reason": "payload_too_large", "limit": ql.max_payload_bytes, "actual": len(payload)})
        if ql.allowed_encodings is not None and encoding not in ql.allowed_encodings:
            raise _Reject({"reason": "encoding_not_allowed", "encoding": encoding, "allowed": list(ql.allowed_encodings)})
    if custom is not None:
        if len(custom) > ql.max_custom_entries:
            raise _Reject({"reason": "custom_entries_too_many", "limit": ql.max_custom_entries, "actual": len(custom)})
        total = 0
        for k, v in custom.items():
            kn = _utf8_len(k)
            if kn > ql.max_custom_key_bytes:
                raise _Reject({"reason": "custom_key_too_long", "key": k, "limit": ql.max_custom_key_bytes, "actual": kn})
            total += kn + (_utf8_len(v) if isinstance(v, str) else 1 if isinstance(v, bool) else 8)
        if total > ql.max_custom_total_bytes:
            raise _Reject({"reason": "custom_map_too_large", "limit": ql.max_custom_total_bytes, "actual": total})
    if delay is not None:
        scheduled = now_ms + delay
    if scheduled is not None and scheduled > now_ms + ql.max_schedule_horizon_ms:
        raise _Reject({"reason": "scheduled_too_far", "horizon_ms": ql.max_schedule_horizon_ms,
                       "scheduled_at_ms": scheduled})
    if scheduled is not None and scheduled <= now_ms:
        scheduled = None          # past = now: an immediate job
    if priority is None:
        priority = ql.default_priority
    max_attempts = min(max_attempts if max_attempts is not None else ql.default_max_attempts,
                       ql.max_attempts_ceiling)
    resource = job.get("resource")          # the job's throttle resource, else its queue's
    resource = ql.resource if resource is None else _resource(resource)
    timeout = policy = None
    if "timeout_ms" in job or "duplicate_policy" in job:       # a plain job: the 12-field item
        timeout, policy = _lifecycle_fields(job)
    fair = job.get("key")
    if fair is not None or ql.key_field is not None:
        fair = job_key(fair, custom, ql, limits)
    if (depends_on := job.get("depends_on")) is not None:
        depends_on = _depends_on(depends_on, limits, refs)
    return ops.item(new_id(), sys.intern(queue), sys.intern(job_type), payload, encoding, priority,
                    max_attempts, custom, trace, scheduled, deadline, key, timeout, policy, resource, fair,
                    depends_on)


def _resource(resource) -> str:
    if not isinstance(resource, str) or not resource:
        _bad("resource must be a non-empty string")
    n = _utf8_len(resource)
    if n > MAX_RESOURCE_BYTES:
        _bad(f"resource is longer than {MAX_RESOURCE_BYTES} UTF-8 bytes ({n})")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in resource):
        _bad("resource must not contain control characters")
    return sys.intern(resource)


def _depends_on(value, limits: Limits, refs) -> tuple | None:
    """A job's `depends_on` (docs/semantics.md "Dependencies"): a list of job ids, or of
    {job_id | ref, policy}; ((job id, policy), ...), None for an empty list. A `ref` names an
    earlier job of the same request (so no request can make a cycle)."""
    if not isinstance(value, list):
        _bad("depends_on must be a list of job ids or {job_id | ref, policy} objects")
    if len(value) > limits.max_dependencies_per_job:
        raise _Reject({"reason": "too_many_dependencies", "limit": limits.max_dependencies_per_job,
                       "actual": len(value)})
    pairs, seen = [], set()
    for d in value:
        policy = ops.DEP_SUCCESS
        if isinstance(d, dict):
            extra = set(d) - {"job_id", "ref", "policy"}
            if extra or ("job_id" in d) == ("ref" in d):
                _bad("each depends_on object names one of job_id or ref, and may give a policy")
            policy = d.get("policy", ops.DEP_SUCCESS)
            if policy not in ops.DEPENDENCY_POLICIES:
                _bad(f"a dependency's policy must be \"success\", \"complete\" or \"ignore\", got {policy!r}")
            d = d["job_id"] if "job_id" in d else _ref_id(d["ref"], refs)
        job_id = canonical_uuid(d)
        if job_id is None:
            _bad(f"depends_on: a job id must be a canonical UUID, got {d!r}")
        if job_id in seen:
            _bad(f"depends_on names job {job_id} twice")
        seen.add(job_id)
        pairs.append((job_id, policy))
    return tuple(pairs) or None


def _ref_id(ref, refs) -> str:
    if refs is None:
        _bad("a dependency by ref is for /v1/jobs/batch and /v1/jobs/atomic (it names an earlier job of the request)")
    if not isinstance(ref, str) or ref not in refs:
        _bad(f"depends_on: ref {ref!r} is not an earlier job's ref in this request")
    return refs[ref]


def _take_ref(job, item, refs: dict) -> None:
    """A batch's job that names itself (`ref`, a string unique in the request) for later ones."""
    ref = job.get("ref") if isinstance(job, dict) else None
    if ref is None:
        return
    if not isinstance(ref, str) or not ref or len(ref) > 256:
        _bad("ref must be a non-empty string of at most 256 characters")
    if ref in refs:
        _bad(f"ref {ref!r} names two jobs of this request")
    refs[ref] = item[0]


def job_key(key, custom, ql, limits: Limits):
    """A job's key (docs/semantics.md "Keys"): the request's `key`, else the value of the custom
    field the queue names (`key_field`, a string), else None; when unusable, the job is refused
    naming the field (422 `rejected`, reason `invalid_request`, as any bad field of a job)."""
    where = "key"
    if key is None:
        if custom is None or ql.key_field is None or custom.get(ql.key_field) is None:
            return None
        key, where = custom[ql.key_field], f"custom[{ql.key_field!r}] (the queue's key_field)"
        if not isinstance(key, str):
            _bad(f"{where} must be a string to be the job's key, got {key!r}")
    why = check_key(key, limits.max_key_bytes)
    if why:
        _bad(f"{where} {why}")
    return sys.intern(key)


def _jobs_list(body: dict, limits: Limits) -> list:
    jobs = body.get("jobs")
    if not isinstance(jobs, list):
        raise invalid("jobs must be a list of EnqueueRequest objects")
    if not jobs:
        raise invalid("batch must contain at least one job")
    if len(jobs) > limits.max_enqueue_batch:
        raise invalid(f"batch exceeds max_enqueue_batch ({limits.max_enqueue_batch}): {len(jobs)} jobs")
    return jobs


def enqueue(body, limits: Limits, now_ms: int, new_id, rid=None) -> tuple:
    """POST /v1/jobs. Raises ApiError; a refused job raises ApiError('rejected')."""
    require_object(body)
    try:
        job = check_job(body, limits, now_ms, new_id)
    except _Reject as r:
        raise ApiError("rejected", f"job refused: {r.rejection['reason']}", rejection=r.rejection)
    return ops.enqueue(rid, SINGLE, [job])


def enqueue_batch(body, limits: Limits, now_ms: int, new_id, rid=None) -> tuple:
    """POST /v1/jobs/batch: refused jobs ride along as their rejection, so the stored result of
    a request id is the whole answer."""
    jobs = _jobs_list(require_object(body), limits)
    items, refs = [], {}
    for j in jobs:
        try:
            item = check_job(j, limits, now_ms, new_id, refs)
            _take_ref(j, item, refs)
            items.append(item)
        except _Reject as r:
            items.append(r.rejection)
    return ops.enqueue(rid, BATCH, items)


def enqueue_atomic(body, limits: Limits, now_ms: int, new_id, rid=None) -> tuple:
    jobs = _jobs_list(require_object(body), limits)
    items, errors, refs = [], [], {}
    for i, j in enumerate(jobs):
        try:
            item = check_job(j, limits, now_ms, new_id, refs)
            _take_ref(j, item, refs)
            items.append(item)
        except _Reject as r:
            errors.append({"index": i, "rejection": r.rejection})
    if errors:
        raise ApiError("batch_rejected", f"the batch was refused: {len(errors)} job(s) failed validation",
                       errors=errors)
    return ops.enqueue(rid, ATOMIC, items)


def _queue_list(body: dict, limits: Limits) -> tuple:
    queues = body.get("queues")
    if not isinstance(queues, list) or not queues:
        raise invalid("queues must be a non-empty list of queue names")
    if len(queues) > limits.max_reserve_queues:
        raise invalid(f"too many queues: {len(queues)} > max_reserve_queues ({limits.max_reserve_queues})")
    for q in queues:
        why = check_queue_name(q, 0)
        if why:
            raise invalid(f"queues: {why}")
        if (len(q) if q.isascii() else len(q.encode("utf-8"))) > limits.max_queue_name_bytes:     # _utf8_len
            raise invalid(f"queues: name longer than max_queue_name_bytes ({limits.max_queue_name_bytes})")
    if limits.strict_queues:
        unknown = [q for q in queues if q not in limits.queues]
        if unknown:
            raise ApiError("unknown_queues", f"queue(s) not declared (strict mode): {unknown}", queues=unknown)
    return tuple(map(sys.intern, queues))


def reserve(body, limits: Limits, rid=None) -> tuple[tuple, int]:
    """POST /v1/reserve → (command, wait_ms). The lease is clamped to the smallest
    max_lease_duration_ms of the listed queues, wait and max_jobs to their global maxima."""
    body = require_object(body)
    queues = _queue_list(body, limits)
    lease = body.get("lease_ms")
    if not is_int(lease) or lease <= 0:
        raise invalid(f"lease_ms is required and must be an integer > 0, got {lease!r}")
    wait = _opt_int(body, "wait_ms", 0, 0)
    max_jobs = _opt_int(body, "max_jobs", 1, 1)
    if body.get("worker_id") is not None:
        _check_text(body, "worker_id", "max_worker_id_bytes", limits)     # counted by the leader (node/service/workers_seen.py)
    # The lease clamp; one queue (the common case) without building a generator.
    cap = (limits.queue(queues[0]).max_lease_duration_ms if len(queues) == 1
           else min(limits.queue(q).max_lease_duration_ms for q in queues))
    if lease > cap:
        lease = cap
    return (ops.reserve(rid, queues, lease, min(max_jobs, limits.max_reserve_batch)),
            min(wait, limits.max_wait_timeout_ms))


def _attempt(body: dict) -> int:
    a = body.get("attempt")
    if not is_int(a) or a < 1:
        raise invalid(f"attempt is required and must be an integer >= 1, got {a!r}")
    return a


def _result(body: dict, limits: Limits | None, where: str = "result"):
    """An ack's `result` {data_b64, encoding} (docs/semantics.md "Job results"): None when absent
    or null, else (data, encoding), its data 1..max_result_bytes bytes and its encoding at most
    max_encoding_bytes; 400 invalid_argument naming the field otherwise."""
    r = body.get("result")
    if r is None:
        return None
    try:
        data, encoding = _payload(r)
    except _Reject as e:
        raise invalid(e.rejection["message"].replace("payload", where)) from None
    limits = limits if limits is not None else Limits.build()
    n = _utf8_len(encoding)
    if n > limits.max_encoding_bytes:
        raise ApiError("invalid_argument", **_too_long(f"{where}.encoding", "max_encoding_bytes",
                                                       limits.max_encoding_bytes, n))
    if len(data) > limits.max_result_bytes:
        raise ApiError("invalid_argument", **_too_long(where, "max_result_bytes", limits.max_result_bytes, len(data)))
    return data, encoding


def ack(job_id, body, rid=None, limits: Limits | None = None) -> tuple:
    body = require_object(body)
    if "result" not in body:                # the hot path: ops.ack's command, inline
        return ops.ACK, rid, job_id_arg(job_id), _attempt(body)
    return ops.ack(rid, job_id_arg(job_id), _attempt(body), _result(body, limits))


def ack_batch(body, limits: Limits, rid=None) -> tuple:
    acks = require_object(body).get("acks")
    if not isinstance(acks, list) or not acks:
        raise invalid("acks must be a non-empty list of {job_id, attempt}")
    if len(acks) > limits.max_reserve_batch:
        raise invalid(f"too many acks: {len(acks)} > max_reserve_batch ({limits.max_reserve_batch})")
    pairs = []
    for i, a in enumerate(acks):
        if not isinstance(a, dict):
            raise invalid("each ack must be an object {job_id, attempt}")
        result = _result(a, limits, f"acks[{i}].result") if "result" in a else None
        pair = (job_id_arg(a.get("job_id")), _attempt(a))
        pairs.append(pair if result is None else pair + (result,))
    return ops.ack_batch(rid, tuple(pairs))


def nack(job_id, body, rid=None, limits: Limits | None = None) -> tuple:
    body = require_object(body)
    jid, attempt = job_id_arg(job_id), _attempt(body)
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise invalid("reason must be a string")
    if reason == "":
        reason = None           # sepp's clients send an empty reason as absent
    if reason is not None:
        limit = limits.max_reason_bytes if limits is not None else Limits.build().max_reason_bytes
        n = _utf8_len(reason)
        if n > limit:
            raise ApiError("invalid_argument", **_too_long("reason", "max_reason_bytes", limit, n))
    retry = body.get("retry")
    strategy, delay = ops.DEFAULT, None
    if retry is not None:
        if not isinstance(retry, dict):
            raise invalid("retry must be an object {strategy, delay_ms}")
        strategy = retry.get("strategy")
        if strategy not in ops.STRATEGIES:
            raise invalid(f"retry.strategy must be \"default\", \"delay\" or \"dead_letter\", got {strategy!r}")
        if strategy == ops.DELAY:
            delay = retry.get("delay_ms")
            if not is_int(delay) or delay < 0:
                raise invalid(f"retry.delay_ms is required with strategy \"delay\" and must be an integer >= 0, got {delay!r}")
    return ops.nack(rid, jid, attempt, reason, strategy, delay)


def release(job_id, body, rid=None, limits: Limits | None = None) -> tuple:
    """POST /v1/jobs/{id}/release {"attempt", "delay_ms"?, "reason"?}."""
    body = require_object(body)
    jid, attempt = job_id_arg(job_id), _attempt(body)
    delay = _opt_int(body, "delay_ms", 0, 0)
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise invalid("reason must be a string")
    if reason == "":
        reason = None
    if reason is not None:
        limit = limits.max_reason_bytes if limits is not None else Limits.build().max_reason_bytes
        n = _utf8_len(reason)
        if n > limit:
            raise ApiError("invalid_argument", **_too_long("reason", "max_reason_bytes", limit, n))
    return ops.release(rid, jid, attempt, delay, reason)


def extend(job_id, body, rid=None) -> tuple:
    body = require_object(body)
    jid, attempt = job_id_arg(job_id), _attempt(body)
    lease = body.get("lease_ms")
    if not is_int(lease) or lease <= 0:
        raise invalid(f"lease_ms is required and must be an integer > 0, got {lease!r}")
    return ops.extend(rid, jid, attempt, lease)


def drain(body, limits: Limits, rid=None, who=None) -> tuple:
    body = require_object(body) if body is not None else {}
    queue = body.get("queue")
    if queue is not None:
        why = check_queue_name(queue, 0)
        if why:
            raise invalid(f"queue: {why}")
        if _utf8_len(queue) > limits.max_queue_name_bytes:
            raise invalid(f"queue: name longer than max_queue_name_bytes ({limits.max_queue_name_bytes})")
    mx = _opt_int(body, "max", 1, 1)
    return ops.drain(rid, queue, min(mx, limits.max_reserve_batch), who)


def _ids(body) -> tuple:
    ids = require_object(body).get("ids")
    if not isinstance(ids, list) or not ids:
        raise invalid("ids must be a non-empty list of job ids")
    if len(ids) > MAX_ADMIN_IDS:
        raise invalid(f"too many ids: {len(ids)} > {MAX_ADMIN_IDS}")
    return tuple(job_id_arg(i) for i in ids)


def requeue(body, rid=None, who=None) -> tuple:
    return ops.requeue(rid, _ids(body), who)


def delete_dead_letters(body, rid=None, who=None) -> tuple:
    return ops.delete_dead_letters(rid, _ids(body), who)


def cancel(job_id, rid=None, who=None, cascade=None) -> tuple:
    """DELETE /v1/jobs/{id}[?cascade=true]."""
    if cascade not in (None, "true", "false"):
        raise invalid(f"cascade must be true or false, got {cascade!r}")
    return ops.cancel(rid, job_id_arg(job_id), who, cascade=cascade == "true")


def queue_arg(queue, limits: Limits) -> str:
    """A queue name from a path: the rules of EnqueueRequest.queue, max_queue_name_bytes included."""
    why = check_queue_name(queue, 0)
    if why:
        raise invalid(why)
    if _utf8_len(queue) > limits.max_queue_name_bytes:
        raise invalid(f"queue name longer than max_queue_name_bytes ({limits.max_queue_name_bytes})")
    return sys.intern(queue)


def pause(queue, paused: bool, limits: Limits, rid=None, body=None, who=None) -> tuple:
    """Pause or resume. A queue that neither exists nor is declared is refused at apply (404)
    unless the body says {"create": true}."""
    queue = queue_arg(queue, limits)
    create = (require_object(body) if body is not None else {}).get("create", False)
    if create is None:
        create = False
    if not isinstance(create, bool):
        raise invalid(f"create must be true or false, got {create!r}")
    if limits.strict_queues and queue not in limits.queues:
        raise ApiError("not_found", f"queue {queue!r} is not declared (strict mode)", queue=queue)
    return ops.pause(rid, queue, paused, create, who)


def move_to_dead_letters(queue, body, limits: Limits, rid=None, who=None) -> tuple:
    """POST /v1/queues/{name}/dead-letter {"ids", "reason"}."""
    queue = queue_arg(queue, limits)
    ids = _ids(body)
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise invalid("reason must be a string")
    return ops.move_to_dead_letters(rid, queue, ids, reason or None, who)


def close_circuit(queue, limits: Limits, rid=None, who=None) -> tuple:
    """POST /v1/queues/{name}/circuit/close."""
    return ops.close_circuit(rid, queue_arg(queue, limits), who)


def purge(queue, limits: Limits, rid=None, who=None) -> tuple:
    return ops.purge(rid, queue_arg(queue, limits), who)


def delete_queue(queue, limits: Limits, rid=None, who=None) -> tuple:
    return ops.delete_queue(rid, queue_arg(queue, limits), who)


# ---------------------------------------------------------------------------- configuration
def key_sha256(key: str) -> str:
    """The digest an API key is kept as (node/base/auth.py looks keys up by it)."""
    import hashlib
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def configure(body, rid=None, who=None) -> tuple:
    """PUT /v1/config {"config": {limits, storage, queues}, "expect_version", "keys"?}: checked
    exactly as the TOML sections are (Limits.from_doc is Limits.build), 400 naming the key."""
    body = require_object(body)
    expect = body.get("expect_version")
    if not is_int(expect) or expect < 0:
        raise invalid(f"expect_version is required and must be an integer >= 0 (the version in force, "
                      f"GET /v1/config), got {expect!r}")
    config = body.get("config")
    if not isinstance(config, dict):
        raise invalid("config is required: an object {limits, storage, queues}")
    try:
        Limits.from_doc(config)
    except ConfigError as e:
        raise invalid(str(e))
    keys = body.get("keys")
    if keys is not None:
        keys = tuple(_key_entry(k, f"keys[{i}]") for i, k in enumerate(keys if isinstance(keys, list) else [None]))
    return ops.configure(rid, expect, config, keys, who)


def _key_entry(k, where: str) -> tuple:
    from ..core.config import key_problem
    if not isinstance(k, dict):
        raise invalid(f"{where}: must be an object {{name, role, key_sha256}}")
    name, role, digest = k.get("name"), k.get("role"), k.get("key_sha256")
    why = key_problem(name, role, digest)
    if why:
        raise invalid(f"{where}: {why}")
    return name, role, digest


def add_key(body, rid=None, who=None) -> tuple:
    """POST /v1/keys {"name", "role", "key_sha256"}: the node never sees the key."""
    name, role, digest = _key_entry(require_object(body), "key")
    return ops.add_key(rid, name, role, digest, who)


def remove_key(name, rid=None, who=None) -> tuple:
    if not isinstance(name, str) or not name:
        raise invalid("key name must be a non-empty string")
    return ops.remove_key(rid, name, who)


def seed(limits: Limits, api_keys) -> tuple:
    """Version 1 from a node's TOML: its [limits], [storage], [[queues]] and [auth] keys (as
    digests). Proposed by the first leader; expect_version 0 decides a race between two."""
    keys = tuple((k["name"], k["role"], key_sha256(k["key"])) for k in api_keys or ())
    doc = limits.doc
    return ops.configure(None, 0, {"limits": doc["limits"], "storage": doc["storage"], "queues": doc["queues"]},
                         keys, None)


def sweep() -> tuple:
    return ops.sweep()
