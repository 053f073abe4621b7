"""The OpenAPI 3.1 description of the HTTP API: served at `GET /v1/openapi.json` by every node,
checked in as docs/openapi.json (`python -m raftq.node.api.openapi > docs/openapi.json`).

Built from the definitions the node itself uses wherever there is one: the error codes and
their statuses (node/core/errors.py), the roles (node/base/auth.py), the session ops and their roles
(node/api/session.py), the limits a server advertises and a queue shows (node/core/limits.py), the job
states (node/core/machine.py). The rest (routes, request bodies, what each answer holds) is written
here once, and tests/cluster/test_openapi.py holds it to the code: every route of the aiohttp app is
described and nothing else; the role each operation states is the one the node enforces; every
required field is refused when missing; every example is accepted; a schema-driven run
(schemathesis) against a live cluster finds no 5xx and no answer that breaks the document.

The document does not depend on a node's config: limits that the config sets (batch sizes,
name lengths, payload sizes...) are described with their defaults, not encoded as maxima.
"""
from __future__ import annotations

import json
import sys
from functools import lru_cache

from ... import __version__
from ..core import errors
from ..base import validate_schedule as vs
from ..base.auth import ADMIN, OPERATOR, VIEWER, WORKER
from ..core.limits import MAX_KEY_OVERRIDES, MAX_KEY_WEIGHT, MAX_RATE_COUNT, QUEUE_KEYS, Limits
from ..core.jobs import ALWAYS_SHOWN_CAUSES, DEAD_LETTER_CAUSES
from ..core.ops import DEPENDENCY_POLICIES
from ..core.machine import STATE_NAMES
from ..base.settings import API_ROLES
from .session_ops import FAST_OPS, OP_ROLES, READ_OPS

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
# Strict base64 (padding required, no whitespace), at least one byte.
B64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"
# A queue name: non-empty, no '/', no control character (C0, DEL, C1); '.' and '..' excluded below.
QUEUE_PATTERN = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
REQUEST_ID_PATTERN = "^[!-~]{1,128}$"
# A job's key (tenant, customer, account): non-empty, no control character (C0, DEL, C1).
KEY_PATTERN = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
EXAMPLE_ID = "8a3c2f8e-5b1d-4c47-9a51-0b7e2f3d9c10"

# What each error code means (the statuses come from node/core/errors.py).
CODE_MEANINGS = {
    "invalid_argument": "malformed JSON or HTTP, a body that is not an object, missing or mistyped request "
                        "fields, out-of-range values, a string over its length limit (`field` names it), an empty "
                        "or oversized batch, too many reserve queues, a non-canonical job id, a bad Request-Id, a "
                        "Request-Id reused for another route or body, an invalid configuration (the message names "
                        "the key)",
    "unauthenticated": "API keys are on and the request has no key or an unknown one",
    "permission_denied": "the key's role is below the operation's",
    "job_not_found": "ack/nack/extend/release of a job that is not in flight (acked, expired and not re-reserved, "
                     "dead-lettered, deleted, never existed): you no longer own it",
    "not_found": "an unknown resource (job, key, a queue that neither exists nor is declared, path)",
    "attempt_mismatch": "ack/nack/extend/release with a stale attempt: the job is in flight under a newer attempt; you "
                        "no longer own it",
    "failed_precondition": "the operation does not fit the state: a `replace` duplicate policy hit on a job "
                           "that has started (`reason` `duplicate_started`, `job_id`), a stale "
                           "`expect_version`, deleting a queue that holds jobs or is declared, removing the last "
                           "admin key",
    "unknown_queues": "reserve names queues that are not declared while `strict_queues` is on; `queues` "
                      "lists them",
    "method_not_allowed": "the path does not take this method; `Allow` lists those it takes",
    "request_timeout": "the request body did not arrive within `tuning.http_body_timeout_s` (30 s); the "
                       "connection is closed",
    "request_too_large": "the body is larger than `max_request_bytes`",
    "unsupported_media_type": "a request body that is not sent as `Content-Type: application/json`",
    "rejected": "the job was refused; `rejection` says why",
    "batch_rejected": "the atomic batch was refused; `errors` lists every failing job",
    "overloaded": "the node sheds load: too many requests waiting for commit, or too many long polls waiting "
                  "(on the node or in the session); retry after `Retry-After` seconds",
    "not_leader": "this node is a follower and redirects the request to the leader (asked for with "
                  "`Raftq-Redirect: 1`, or the node's `[api] followers` is `redirect`)",
    "no_leader": "no leader is known (election in progress, or this node is cut off); retry after "
                 "`Retry-After` seconds",
    "unavailable": "the change could not be committed in time (lost quorum, leadership lost mid-request; "
                   "`applied` null: the outcome is unknown, retry with the same Request-Id), or was not "
                   "proposed (`applied` false: a new cluster's leader is seeding its configuration, which "
                   "takes milliseconds)",
    "internal": "a bug in the server, never bad input",
}

# Why an enqueued job can be refused, first failing check wins (the order of the checks).
REJECTION_REASONS = {
    "invalid_request": "the job is malformed: a missing or mistyped field, an out-of-range value, both "
                       "`scheduled_at_ms` and `delay_ms` (`message` says which)",
    "unknown_queue": "strict mode and the queue is not declared (`queue`)",
    "queue_name_too_long": "`limit`, `actual` (UTF-8 bytes)",
    "job_type_name_too_long": "`limit`, `actual`",
    "job_type_not_allowed": "the queue restricts job types (`job_type`, `allowed`)",
    "idempotency_key_too_long": "`limit`, `actual`",
    "payload_too_large": "`limit`, `actual` (decoded bytes)",
    "encoding_not_allowed": "the queue restricts encodings (`encoding`, `allowed`)",
    "custom_entries_too_many": "`limit`, `actual`",
    "custom_key_too_long": "`key`, `limit`, `actual`",
    "custom_map_too_large": "`limit`, `actual`",
    "scheduled_too_far": "beyond now + `max_schedule_horizon_ms` (`horizon_ms`, `scheduled_at_ms`)",
    "queue_full": "the queue holds `max_queue_depth` live jobs (`queue`, `limit`)",
    "duplicate": "duplicate policy `reject`: the idempotency key names a live record (`job_id`: the existing job)",
    "duplicate_started": "duplicate policy `replace` in a batch: the existing job (`job_id`) has been delivered, "
                         "finished or dead-lettered (a single enqueue: 409 `failed_precondition`)",
    "too_many_dependencies": "`depends_on` has more than `max_dependencies_per_job` entries (`limit`, `actual`)",
    "dependency_not_found": "a dependency (`job_id`) is no job the cluster knows: never made, or acked in a queue "
                            "that keeps no results, or its retention ended (docs/semantics.md \"Dependencies\")",
}

# What a configuration change can warn about (node/core/config.py change_warnings).
CONFIG_WARNINGS = {
    "depth_above_limit": "a queue holds more live jobs than its new `max_queue_depth` (`queue`, `depth`, `limit`): "
                         "they stay, new enqueues are refused",
    "undeclared_queue_has_jobs": "a queue no longer declared still holds jobs (`queue`, `jobs`): they stay",
    "resource_above_limit": "more jobs of a resource are in flight than its new limit (`resource`, `in_flight`, "
                            "`limit`): they finish, no more are handed out until the count is under the limit",
    "max_attempts_above_ceiling": "jobs of a queue have a `max_attempts` above its new ceiling (`queue`, `jobs`, "
                                  "`limit`): they keep theirs",
    "dead_letters_kept": "dead-letter retention was turned off; the records kept (`dead_letters`) stay until "
                         "drained, requeued or deleted",
}
# The actions of the audit trail (node/core/*.py audit.record calls).
AUDIT_ACTIONS = ("config_seed", "config_change", "key_add", "key_remove", "pause", "resume", "cancel", "purge",
                 "queue_delete", "requeue", "dead_letters_delete", "dead_letter_move", "drain", "circuit_close",
                 "schedule_create", "schedule_replace", "schedule_delete", "schedule_pause", "schedule_resume",
                 "schedule_trigger", "batch_cancel")

# The session ops (node/api/session.py) and the HTTP route each one mirrors.
SESSION_HTTP = {
    "enqueue": ("post", "/v1/jobs"), "enqueue_batch": ("post", "/v1/jobs/batch"),
    "enqueue_atomic": ("post", "/v1/jobs/atomic"), "reserve": ("post", "/v1/reserve"),
    "ack": ("post", "/v1/jobs/{id}/ack"), "ack_batch": ("post", "/v1/acks"), "nack": ("post", "/v1/jobs/{id}/nack"),
    "extend": ("post", "/v1/jobs/{id}/extend"), "drain": ("post", "/v1/dead-letters/drain"),
    "release": ("post", "/v1/jobs/{id}/release"),
    "server_info": ("get", "/v1/server-info"), "cluster": ("get", "/v1/cluster"),
}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def integer(minimum: int | None = INT64_MIN, maximum: int = INT64_MAX, description: str = "", **kw) -> dict:
    s = {"type": "integer", "format": "int64"}
    if minimum is not None:
        s["minimum"] = minimum
    s["maximum"] = maximum
    if description:
        s["description"] = description
    s.update(kw)
    return s


def ms(description: str, minimum: int | None = 0, nullable: bool = False) -> dict:
    s = integer(minimum, description=description)
    if nullable:
        s["type"] = ["integer", "null"]
    return s


def obj(properties: dict, required=(), description: str = "", **kw) -> dict:
    s = {"type": "object", "properties": properties}
    if required:
        s["required"] = list(required)
    if description:
        s["description"] = description
    s.update(kw)
    return s


def string(description: str = "", **kw) -> dict:
    s = {"type": "string"}
    if description:
        s["description"] = description
    s.update(kw)
    return s


def nullable(schema: dict) -> dict:
    """The same, or JSON null: the node takes an optional field given as null as left out."""
    if "$ref" in schema:
        return {"oneOf": [schema, {"type": "null"}]}
    out = dict(schema)
    out["type"] = [schema["type"], "null"] if isinstance(schema["type"], str) else [*schema["type"], "null"]
    return out


def _json_type(value) -> dict:
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, (list, tuple)):
        return {"type": "array", "items": {"type": "string"}}
    raise TypeError(value)


def _rate_schema(description: str) -> dict:
    """A rate, `{count, period_ms}`: at most `count` hand-outs in any `period_ms` window."""
    return obj({"count": integer(1, MAX_RATE_COUNT), "period_ms": integer(1)}, ["count", "period_ms"],
               description, additionalProperties=False)


def _key_name_schema() -> dict:
    return string("a job's key: 1..`max_key_bytes` (256) UTF-8 bytes, no control characters", minLength=1,
                  pattern=KEY_PATTERN)


def _key_settings_schemas() -> dict:
    """The key settings of a `[[queues]]` entry (docs/configuration.md; node/core/limits.py
    `_key_settings`), each optional (null: unset)."""
    limit_override = obj({"concurrency": nullable(integer(0)),
                          "rate": nullable(_rate_schema("this key's rate"))},
                         description="this key's own limits, over the queue's `key_concurrency` and "
                                     "`key_rate` (either or both)", additionalProperties=False, minProperties=1)
    return {
        "key_field": nullable(string("the custom field a job's key is taken from when the enqueue gives no `key` "
                                     "(a string value)", minLength=1)),
        "key_concurrency": nullable(integer(0, description="most jobs of one key in flight at once")),
        "key_rate": nullable(_rate_schema("at most `count` jobs of one key handed out in any `period_ms` window")),
        "key_weights": nullable({"type": "object", "additionalProperties": integer(1, MAX_KEY_WEIGHT),
                                 "propertyNames": _key_name_schema(), "maxProperties": MAX_KEY_OVERRIDES,
                                 "description": "key -> weight (default 1): a key of weight w gets w turns to a "
                                                "weight-1 key's one"}),
        "key_limits": nullable({"type": "object", "additionalProperties": limit_override,
                                "propertyNames": _key_name_schema(), "maxProperties": MAX_KEY_OVERRIDES,
                                "description": "key -> its own limits"}),
        "rate": nullable(_rate_schema("at most `count` jobs of the queue handed out in any `period_ms` window")),
    }


def _queue_limits_schema() -> dict:
    """GET /v1/queues/{name} `limits`: QueueLimits.describe() of the default limits, typed from
    node/core/limits.py's defaults (a default of None is an optional value: null when unset)."""
    props = {}
    shown = Limits.build().default_queue.describe()
    rate = {"type": ["object", "null"], "properties": {"count": {"type": "integer"}, "period_ms": {"type": "integer"}},
            "required": ["count", "period_ms"]}
    keyed = {"key_field": {"type": ["string", "null"]}, "key_concurrency": {"type": ["integer", "null"]},
             "key_rate": rate, "rate": rate,
             "key_weights": {"type": "object", "additionalProperties": {"type": "integer"},
                             "description": "key -> weight; empty: every key weighs 1"},
             "key_limits": {"type": "object", "additionalProperties": {
                 "type": "object", "properties": {"concurrency": {"type": ["integer", "null"]}, "rate": rate},
                 "required": ["concurrency", "rate"]}, "description": "key -> its own limits (null: the queue's)"}}
    for key, value in shown.items():
        default = QUEUE_KEYS.get(key, value)
        if key in keyed:
            props[key] = keyed[key]
        elif default is None or value is None:
            kind = {"max_queue_depth": {"type": "integer"}, "execution_timeout_ms": {"type": "integer"},
                    "dead_letter_forward": {"type": "string"}, "resource": {"type": "string"},
                    "circuit_breaker": {"type": "object", "properties": {
                        "failures": {"type": "integer"}, "window_ms": {"type": "integer"},
                        "open_ms": {"type": "integer"}}},
                    "windows": {"type": "array", "items": {"type": "object"}}}.get(
                key, {"type": "array", "items": {"type": "string"}})
            props[key] = {**kind, "type": [kind["type"], "null"]}
        else:
            props[key] = _json_type(default)
    return obj(props, required=list(shown), description="The queue's effective limits and retry policy: its "
               "`[[queues]]` overrides merged over `[limits]` (see docs/configuration.md).")


def _server_info_schema() -> dict:
    props = {"server_version": string(), "protocol_versions": {"type": "array", "items": string()},
             "server_time_ms": ms("this node's clock (the worker estimates its offset from it)"),
             "node_id": string()}
    info = Limits.build().server_info()
    for key, value in info.items():
        props[key] = _json_type(value)
    return obj(props, required=list(props), description="What a client needs to know before it sends: the "
               "global limits (values of `[limits]`, the queue defaults for per-queue keys), whether encodings "
               "are restricted, strict mode, and whether the dead-letter store is on.")


def _config_schema() -> dict:
    from ..core.limits import GLOBAL_KEYS, QUEUE_ONLY_KEYS, STORAGE_KEYS
    special = {"max_queue_depth": {"type": ["integer", "null"], "minimum": 0, "description": "null: unlimited"},
               "allowed_encodings": {"type": ["array", "null"], "items": string(minLength=1),
                                     "description": "null: any"},
               "allowed_job_types": {"type": ["array", "null"], "items": string(minLength=1), "minItems": 1,
                                     "description": "null: any"},
               "dedup_window_ms": integer(1),
               "execution_timeout_ms": {"type": ["integer", "null"], "minimum": 1,
                                        "description": "null: no execution timeout"},
               "duplicate_policy": {"type": "string", "enum": ["return_existing", "reject", "replace"]},
               "dead_letter_forward": {"type": ["string", "null"], "minLength": 1,
                                       "description": "the queue that gets a record job per forwarded dead letter; "
                                                      "null: none"},
               "dead_letter_forward_causes": {"type": ["array", "null"], "minItems": 1, "items": {
                   "enum": list(DEAD_LETTER_CAUSES)},
                   "description": "null: lease_expired, expired, admin"},
               "resource_limits": {"type": "object", "additionalProperties": integer(0),
                                   "description": "resource name -> most jobs in flight at once (a resource "
                                                  "without an entry is unlimited)"},
               "resource": {"type": ["string", "null"], "minLength": 1,
                            "description": "the default resource of this queue's jobs"},
               "circuit_breaker": {"type": ["object", "null"], "required": ["failures", "window_ms", "open_ms"],
                                   "additionalProperties": False,
                                   "properties": {"failures": integer(1), "window_ms": integer(1),
                                                  "open_ms": integer(1)}},
               "windows": {"type": ["array", "null"], "minItems": 1, "items": {
                   "type": "object", "additionalProperties": False, "required": ["start", "end"],
                   "properties": {"days": {"type": "array", "minItems": 1, "items": {
                       "enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]}},
                       "start": string(), "end": string(), "time_zone": string()}}},
               "result_retention_ms": integer(0, description="how long a job acked in this queue is kept, "
                                              "`succeeded`, with its result; 0 (default): none"),
               "max_retained_result_bytes": integer(1, description="most bytes of results the queue keeps "
                                                    "(default 64 MiB); beyond, the oldest results are dropped")}

    def props(defaults: dict) -> dict:
        return {k: special.get(k) or _json_type(v) for k, v in defaults.items()}
    limits = obj(props({**GLOBAL_KEYS, **QUEUE_KEYS}), description="`[limits]`: every key optional (default "
                 "when left out); docs/configuration.md")
    limits["additionalProperties"] = False
    storage = obj(props(STORAGE_KEYS), description="`[storage]`")
    storage["additionalProperties"] = False
    special.update(_key_settings_schemas())
    queue = obj({"name": ref("QueueName"), **props(QUEUE_KEYS),
                 **{k: special[k] for k in QUEUE_ONLY_KEYS if k != "name"}}, ["name"],
                "A `[[queues]]` entry: the name and the keys it overrides")
    queue["additionalProperties"] = False
    return obj({"limits": limits, "storage": storage, "queues": {"type": "array", "items": queue}},
               description="A configuration: the `[limits]`, `[storage]` and `[[queues]]` sections of a node's "
               "TOML, checked exactly as the TOML is (a missing section or key takes its default)")


def schemas() -> dict:
    """The component schemas, in the document's order: one helper per group, merged here."""
    queue_name = {"type": "string", "minLength": 1, "pattern": QUEUE_PATTERN, "not": {"enum": [".", ".."]},
                  "description": "1..`max_queue_name_bytes` (512) UTF-8 bytes; not `.` or `..`; no `/`; no control "
                                 "characters"}
    custom_value = {"type": ["string", "integer", "number", "boolean"]}
    return {**_enqueue_schemas(queue_name, custom_value), **_batch_schemas(),
            **_reserve_schemas(queue_name, custom_value), **_ack_schemas(),
            **_dead_letter_and_queue_op_schemas(queue_name), **_config_and_key_schemas(),
            **_queue_schemas(), **_page_schemas(), **_membership_schemas(), **_cluster_view_schemas(),
            **_node_schemas(), **_error_schemas(), **_session_schemas(),
            **_schedule_schemas(queue_name, custom_value), **_workflow_batch_schemas(queue_name, custom_value)}


def _workflow_batch_schemas(queue_name: dict, custom_value: dict) -> dict:
    """Batches with callbacks (docs/semantics.md "Batches")."""
    counts = {k: integer(0, description=d) for k, d in (
        ("members", "jobs that joined it"), ("pending", "members not ended"), ("succeeded", "members acked"),
        ("failed", "members dead-lettered"), ("removed", "members cancelled or purged"))}
    fired = obj({"fired": {"type": "boolean"}, "job_id": {"type": ["string", "null"], "format": "uuid",
                                                           "description": "the callback job, once enqueued"}},
                ["fired", "job_id"])
    enqueue = _enqueue_schemas(queue_name, custom_value)
    callback = {k: v for k, v in enqueue["EnqueueRequest"]["properties"].items() if k not in ("depends_on", "ref")}
    return {
        "CallbackJob": obj(callback, ["queue", "job_type"], "A callback job: an EnqueueRequest without "
                           "`depends_on` or `ref`; anything its queue would refuse is 400 naming the callback."),
        "BatchRequest": obj({
            "jobs": {"type": "array", "items": ref("EnqueueRequest"), "description": "the first members, enqueued "
                     "all or nothing as by `POST /v1/jobs/atomic` (refs and depends_on included); none: a closed "
                     "batch without members finishes at once"},
            "callbacks": obj({k: ref("CallbackJob") for k in ("on_complete", "on_success", "on_failure")}, [],
                             "the callback jobs; each gets `batch_id` among its custom fields",
                             additionalProperties=False),
            "open": {"type": "boolean", "default": False, "description": "more members may be added until "
                     "`close` or `timeout_ms`"},
            "timeout_ms": integer(1, description="an open batch never closed is closed this long after it was "
                                  "made", default=3600000)}, [], "A batch: members and callbacks. Unknown fields "
                                  "are 400.", additionalProperties=False),
        "CancelResponse": obj({"job_id": string(format="uuid"),
                               "cancelled": {"type": "array", "items": string(format="uuid"),
                                             "description": "cascade=true: the waiting dependents cancelled too"}},
                              ["job_id"]),
        "BatchCancelled": obj({"batch_id": string(format="uuid"),
                               "cancelled": {"type": "array", "items": string(format="uuid"),
                                             "description": "the members removed"},
                               "running": integer(0, description="members in flight, left to run")},
                              ["batch_id", "cancelled", "running"]),
        "BatchJobsRequest": obj({"jobs": {"type": "array", "items": ref("EnqueueRequest"), "minItems": 1}},
                                ["jobs"]),
        "BatchSaved": obj({"batch_id": string(format="uuid"), "open": {"type": "boolean"},
                           "results": {"type": "array", "items": ref("EnqueueResult"),
                                       "description": "the members this request enqueued, in order"}},
                          ["batch_id", "open", "results"]),
        "BatchView": obj({"id": string(format="uuid"), "state": {"type": "string",
                                                                  "enum": ["open", "closed", "finished"]},
                          "created_at_ms": ms("when it was made"),
                          "finished_at_ms": ms("when its last member ended after its close", None, nullable=True),
                          **counts, "pending_ids": {"type": "array", "items": string(format="uuid"),
                                                    "description": "the first 100 members not ended, by id"},
                          "callbacks": obj({k: fired for k in ("on_complete", "on_success", "on_failure")}, [])},
                         ["id", "state", "created_at_ms", "finished_at_ms", *counts, "pending_ids", "callbacks"],
                         "A batch's status; kept an hour after it finished."),
    }


def _enqueue_schemas(queue_name: dict, custom_value: dict) -> dict:
    """Enqueue: the payload, the trace context, a queue's name, the request and its result."""
    return {
        "Payload": obj({
            "data_b64": string("standard base64 with padding, decoding to at least one byte", minLength=4,
                               pattern=B64_PATTERN, contentEncoding="base64"),
            "encoding": string("a hint for the worker, usually a MIME type; at most `max_encoding_bytes` (128) "
                               "UTF-8 bytes", minLength=1),
        }, ["data_b64", "encoding"], "Opaque bytes with an encoding hint. A job without data has no payload."),
        "TraceContext": obj({"traceparent": string(minLength=1), "tracestate": {"type": ["string", "null"]}},
                            ["traceparent"], "W3C trace context, carried through to the worker; `traceparent` and "
                            "`tracestate` together at most `max_trace_context_bytes` (1024) UTF-8 bytes."),
        "QueueName": queue_name,
        "EnqueueRequest": obj({
            "queue": queue_name,
            "job_type": string("1..`max_job_type_bytes` (256) UTF-8 bytes", minLength=1),
            "payload": nullable(ref("Payload")),
            "idempotency_key": nullable(string("1..`max_idempotency_key_bytes` (256) bytes, scoped to the queue: while its "
                                      "dedup record lives (`dedup_window_ms`, 24 h) the same key returns the first "
                                      "job's id", minLength=1)),
            "priority": nullable(integer(0, 9, "default: the queue's `default_priority`")),
            "max_attempts": nullable(integer(1, description="default: the queue's `default_max_attempts`; silently clamped "
                                    "to `max_attempts_ceiling`")),
            "custom": nullable({"type": "object", "additionalProperties": custom_value, "propertyNames": {"minLength": 1},
                       "description": "string, integer, float or boolean values; at most `max_custom_entries` (64) "
                                      "entries, keys of at most `max_custom_key_bytes` (256), "
                                      "`max_custom_total_bytes` (16384) in all"}),
            "scheduled_at_ms": nullable(ms("earliest run time; in the past = now; beyond now + `max_schedule_horizon_ms` is "
                                  "`scheduled_too_far`", INT64_MIN)),
            "delay_ms": nullable(ms("run no earlier than now + delay_ms; not together with scheduled_at_ms")),
            "trace_context": nullable(ref("TraceContext")),
            "deadline_at_ms": nullable(ms("a job not reserved by then never runs: it is dead-lettered with cause `expired`",
                                 INT64_MIN)),
            "timeout_ms": nullable(integer(1, description="execution timeout (ms) the Worker enforces; default: the "
                                           "queue's `execution_timeout_ms`")),
            "duplicate_policy": nullable({"type": "string", "enum": ["return_existing", "reject", "replace"],
                                          "description": "what a hit of `idempotency_key` does; default: the "
                                                         "queue's `duplicate_policy` (`return_existing`)"}),
            "resource": nullable(string("the throttle resource the job holds while in flight (`[limits] "
                                        "resource_limits`); default: its queue's `resource`; 1..256 UTF-8 bytes",
                                        minLength=1)),
            "key": nullable(string("the job's key (a tenant, customer, account) for fairness and the queue's "
                                   "per-key limits (docs/semantics.md \"Keys\"); 1..`max_key_bytes` (256) UTF-8 "
                                   "bytes, no control characters; default: the value of the custom field the "
                                   "queue's `key_field` names, else none", minLength=1, pattern=KEY_PATTERN)),
            "depends_on": {"type": "array", "maxItems": 1000, "items": {"oneOf": [
                string("a job id (policy `success`)", format="uuid"),
                obj({"job_id": string(format="uuid"),
                     "ref": string("an earlier job of the same batch request, by its `ref`"),
                     "policy": {"type": "string", "enum": list(DEPENDENCY_POLICIES), "default": "success"}},
                    [], "one of `job_id` and `ref`")]},
                "description": "jobs this one waits for (state `waiting`) until each has ended, with what their "
                               "end means (docs/semantics.md \"Dependencies\"); at most "
                               "`max_dependencies_per_job` (1000)"},
            "ref": string("batch and atomic requests: this job's name for later jobs' `depends_on`, unique in the "
                          "request", minLength=1, maxLength=256),
        }, ["queue", "job_type"], "One job to enqueue. Unknown fields are ignored. Anything wrong with it is a "
           "rejection (422 for a single enqueue), never a 400.", example={
            "queue": "emails", "job_type": "welcome", "priority": 5,
            "payload": {"data_b64": "eyJ1c2VyIjo0Mn0=", "encoding": "application/json"},
            "idempotency_key": "welcome-42", "custom": {"tenant": "acme"}, "key": "acme"}),
        "EnqueueResult": obj({"job_id": string(format="uuid"), "deduplicated": {
            "type": "boolean", "description": "true: the idempotency key matched a live record; no job was made"},
            "replaced": {"type": "boolean", "const": True, "description": "duplicate policy `replace`: the "
                         "existing job's payload, priority and schedule were replaced (present only then)"}},
            ["job_id", "deduplicated"]),
    }


def _batch_schemas() -> dict:
    """Rejections and batch enqueues."""
    return {
        "Rejection": obj({"reason": {"type": "string", "enum": list(REJECTION_REASONS)},
                          "message": string(), "queue": string(), "job_type": string(), "encoding": string(),
                          "key": string(), "allowed": {"type": "array", "items": string()},
                          "limit": {"type": "integer"}, "actual": {"type": "integer"},
                          "field": string("invalid_request of a string over its length limit: the field"),
                          "horizon_ms": {"type": "integer"}, "scheduled_at_ms": {"type": "integer"},
                          "job_id": string("duplicate, duplicate_started: the existing job; dependency_not_found: "
                                           "the unknown dependency", format="uuid")},
                         ["reason"], "Why a job was refused; first failing check wins, in this order:\n\n"
                         + "\n".join(f"* `{k}`: {v}" for k, v in REJECTION_REASONS.items())),
        "RejectedItem": obj({"rejection": ref("Rejection")}, ["rejection"]),
        "EnqueueBatchRequest": obj({"jobs": {"type": "array", "items": ref("EnqueueRequest"), "minItems": 1,
                                             "description": "1..`max_enqueue_batch` (256) jobs"}}, ["jobs"],
                                   example={"jobs": [{"queue": "emails", "job_type": "welcome"},
                                                     {"queue": "emails", "job_type": "digest", "delay_ms": 60000}]}),
        "EnqueueBatchResponse": obj({"results": {"type": "array", "items": {
            "oneOf": [ref("EnqueueResult"), ref("RejectedItem")]}}}, ["results"],
            "One result per job, in order: accepted jobs committed together, refused ones not."),
        "EnqueueAtomicResponse": obj({"results": {"type": "array", "items": ref("EnqueueResult")}}, ["results"]),
        "BatchRejection": obj({"index": integer(0), "rejection": ref("Rejection")}, ["index", "rejection"]),
    }


def _job_props(custom_value: dict) -> dict:
    """The fields of the Job shape (docs/api.md "Shapes")."""
    return {
        "id": string("assigned by the cluster: a UUID v4, lowercase", format="uuid"),
        "queue": string(), "job_type": string(),
        "payload": ref("Payload"),
        "priority": integer(0, 9, "0..9, 9 served first"),
        "custom": {"type": "object", "additionalProperties": custom_value},
        "trace_context": ref("TraceContext"),
        "enqueued_at_ms": ms("when it was enqueued (or requeued); a retry keeps it"),
        "scheduled_at_ms": ms("the schedule the producer asked for, if any", None, nullable=True),
        "attempt": integer(1, description="this delivery's attempt, 1 for the first; the fence of ack, nack "
                           "and extend"),
        "max_attempts": integer(1),
        "lease_expires_at_ms": ms("in flight: the real, clamped lease deadline (budget against it, not against "
                                  "the lease asked for)", None, nullable=True),
        "deadline_at_ms": ms("present until the first delivery when the producer set one", None),
        "timeout_ms": {"type": ["integer", "null"], "minimum": 1, "description": "the execution timeout: the "
                       "job's `timeout_ms`, else its queue's `execution_timeout_ms` at enqueue, else null; in a "
                       "reserve answer present only when set or when `releases` > 0"},
        "releases": integer(0, description="deliveries handed back by release; attempts used = attempt - "
                            "releases (in a reserve answer present only when > 0 or with a timeout)"),
        "resource": string("the job's throttle resource; present when it has one"),
        "key": string("the job's key (a tenant, customer, account: docs/semantics.md \"Keys\"); present when it "
                      "has one"),
        "depends_on": {"type": "array", "items": obj({"job_id": string(format="uuid"), "policy": {
            "type": "string", "enum": list(DEPENDENCY_POLICIES)}}, ["job_id", "policy"]),
            "description": "the jobs it waits or waited for (docs/semantics.md \"Dependencies\"); present when it "
                           "has some"},
    }


def _reserve_schemas(queue_name: dict, custom_value: dict) -> dict:
    """Reserve and the job as workers and listings see it."""
    job_props = _job_props(custom_value)
    job_required = ["id", "queue", "job_type", "priority", "custom", "enqueued_at_ms", "scheduled_at_ms",
                    "attempt", "max_attempts", "lease_expires_at_ms"]
    view_states = [s for s in STATE_NAMES if s != "gone"]
    return {
        "ReserveRequest": obj({
            "queues": {"type": "array", "items": queue_name, "minItems": 1,
                       "description": "polled in this order; 1..`max_reserve_queues` (32)"},
            "lease_ms": integer(1, description="clamped to the smallest `max_lease_duration_ms` of the queues"),
            "wait_ms": nullable(integer(0, description="long poll: wait up to this long for a job (clamped to "
                                        "`max_wait_timeout_ms`)", default=0)),
            "max_jobs": nullable(integer(1, description="clamped to `max_reserve_batch` (256)", default=1)),
            "worker_id": nullable(string("names the worker in the queues' `workers` count (the leader's; reserves "
                                         "without one count as one worker); at most `max_worker_id_bytes` (256) UTF-8 bytes",
                                         minLength=1)),
        }, ["queues", "lease_ms"], example={"queues": ["emails"], "lease_ms": 30000, "wait_ms": 1000, "max_jobs": 10}),
        "ReserveResponse": obj({"jobs": {"type": "array", "items": ref("Job")}}, ["jobs"],
                               "Possibly empty when nothing was ready within `wait_ms`."),
        "Job": obj(job_props, job_required, "A job as a worker sees it (reserve, dead-letter records).",
                   example={"id": EXAMPLE_ID, "queue": "emails", "job_type": "welcome",
                            "payload": {"data_b64": "eyJ1c2VyIjo0Mn0=", "encoding": "application/json"},
                            "priority": 5, "custom": {"tenant": "acme"}, "key": "acme", "enqueued_at_ms": 1764500000000,
                            "scheduled_at_ms": None, "attempt": 1, "max_attempts": 3,
                            "lease_expires_at_ms": 1764500030000}),
        "JobView": obj({**job_props,
                        "state": {"type": "string", "enum": view_states + ["succeeded"],
                                  "description": "`succeeded`: acked in a queue that retains finished jobs "
                                                 "(`result_retention_ms`), while it is retained"},
                        "last_reason": {"type": ["string", "null"], "description": "the last nack's reason"},
                        "run_at_ms": ms("scheduled: when it becomes ready (a delayed retry included)"),
                        "waiting_on": {"type": "array", "items": string(format="uuid"),
                                       "description": "waiting: the dependencies that have not ended"},
                        "live_dependents": integer(1, description="succeeded: the live jobs that name it in "
                                                   "`depends_on`, for which it is kept past its retention; "
                                                   "present while there are some"),
                        "kept_for_batch": string("succeeded: the batch that keeps it past its retention (until the "
                                                 "batch goes)", format="uuid"),
                        **_result_props()},
                       job_required + ["state", "last_reason"],
                       "A job and its state (inspection, listings); `lease_expires_at_ms` is null unless in flight."),
        "JobResult": obj({"job_id": string(format="uuid"),
                          "state": {"type": "string", "enum": ["succeeded", "dead_lettered", "pending"],
                                    "description": "`pending`: the job has not finished within `wait_ms`"},
                          "job": {"oneOf": [ref("JobView"), {"type": "null"}],
                                  "description": "the job as `GET /v1/jobs/{id}` shows it; null while pending"},
                          **_result_props()},
                         ["job_id", "state", "job"],
                         "A job's outcome: its result once it succeeded (while retained), its dead letter, or "
                         "`pending`."),
    }


def _result_props() -> dict:
    """The fields of a retained (succeeded) job: docs/semantics.md "Job results"."""
    return {
        "result": {"oneOf": [ref("Payload"), {"type": "null"}],
                   "description": "succeeded: the result its ack carried; null without one or once dropped"},
        "result_dropped": {"type": "boolean", "description": "succeeded: its result was dropped at the queue's "
                           "`max_retained_result_bytes`"},
        "finished_at_ms": ms("succeeded: when it was acked (the replicated clock)"),
        "retained_until_ms": ms("succeeded: when its retention ends"),
    }


def _ack_schemas() -> dict:
    """Ack, nack (and its retry strategies), extend, release."""
    return {
        "AckRequest": obj({"attempt": integer(1, description="the attempt the job was delivered with"),
                           "result": nullable(ref("Result"))}, ["attempt"],
                          example={"attempt": 1, "result": {"data_b64": "eyJvayI6dHJ1ZX0=",
                                                            "encoding": "application/json"}}),
        "Result": {**ref("Payload"), "description": "the job's result (docs/semantics.md \"Job results\"): kept "
                   "with the finished job when its queue retains them (`result_retention_ms`), else dropped; "
                   "1..`max_result_bytes` (1 MiB) bytes"},
        "JobIdResponse": obj({"job_id": string(format="uuid")}, ["job_id"]),
        "AckItem": obj({"job_id": string(format="uuid", pattern=UUID_PATTERN), "attempt": integer(1),
                        "result": nullable(ref("Result"))},
                       ["job_id", "attempt"]),
        "AcksRequest": obj({"acks": {"type": "array", "items": ref("AckItem"), "minItems": 1,
                                     "description": "1..`max_reserve_batch` (256) acks"}}, ["acks"],
                           example={"acks": [{"job_id": EXAMPLE_ID, "attempt": 1}]}),
        "AckOutcome": {"oneOf": [ref("JobIdResponse"), obj({"error": ref("ErrorDetail")}, ["error"])],
                       "description": "`{job_id}` or `{error: {code: job_not_found | attempt_mismatch, ...}}`"},
        "AcksResponse": obj({"results": {"type": "array", "items": ref("AckOutcome")}}, ["results"],
                            "One outcome per ack, in order, all committed in one replicated command."),
        "RetryDefault": obj({"strategy": {"const": "default"}}, ["strategy"],
                            "the queue's retry policy (immediate unless `retry_delay_ms` is set)"),
        "RetryDelay": obj({"strategy": {"const": "delay"},
                           "delay_ms": ms("redeliver no earlier than now + delay_ms (clamped to the schedule "
                                          "horizon, no jitter); 0 = at once")},
                          ["strategy", "delay_ms"]),
        "RetryDeadLetter": obj({"strategy": {"const": "dead_letter"}}, ["strategy"],
                               "dead-letter at once (cause `rejected`), whatever attempts remain"),
        "NackRequest": obj({"attempt": integer(1),
                            "reason": nullable(string("becomes the job's `last_reason`; empty = none; at most "
                                                      "`max_reason_bytes` (4096) UTF-8 bytes")),
                            "retry": {"oneOf": [ref("RetryDefault"), ref("RetryDelay"), ref("RetryDeadLetter"),
                                                {"type": "null"}],
                                      "description": "default (and null): `{\"strategy\": \"default\"}`"}},
                           ["attempt"], example={"attempt": 1, "reason": "smtp down",
                                                 "retry": {"strategy": "delay", "delay_ms": 60000}}),
        "NackResponse": obj({"job_id": string(format="uuid"), "dead_lettered": {
            "type": "boolean", "description": "true when this nack ended the job (dead_letter, or its last attempt)"}},
            ["job_id", "dead_lettered"]),
        "ExtendRequest": obj({"attempt": integer(1), "lease_ms": integer(1, description="new deadline = now + "
                              "lease_ms, clamped to the queue's `max_lease_duration_ms`")},
                             ["attempt", "lease_ms"], example={"attempt": 1, "lease_ms": 30000}),
        "ReleaseRequest": obj({"attempt": integer(1),
                               "delay_ms": nullable(ms("0 or absent: ready at once, in its place; > 0: scheduled "
                                                       "(clamped to `max_schedule_horizon_ms`)")),
                               "reason": nullable(string("becomes the job's `last_reason`; at most "
                                                         "`max_reason_bytes` (4096) UTF-8 bytes"))},
                              ["attempt"], example={"attempt": 1, "delay_ms": 5000, "reason": "shutting down"}),
        "ExtendResponse": obj({"job_id": string(format="uuid"), "lease_expires_at_ms": ms("the new deadline")},
                              ["job_id", "lease_expires_at_ms"]),
    }


def _dead_letter_and_queue_op_schemas(queue_name: dict) -> dict:
    """Dead letters (drain, requeue, delete, move) and queue operations (pause, purge, circuit, delete)."""
    return {
        "DrainRequest": obj({"queue": nullable({**queue_name, "description": "only this queue's dead letters"}),
                             "max": nullable(integer(1, description="clamped to `max_reserve_batch` (256)",
                                                     default=1))},
                            example={"queue": "emails", "max": 100}),
        "DeadLetterRecord": obj({"job": ref("Job"), "cause": {"type": "string", "enum": list(DEAD_LETTER_CAUSES)},
                                 "failed_at_ms": ms("when it was dead-lettered"),
                                 "final_attempt": integer(1),
                                 "last_reason": {"type": ["string", "null"]}},
                                ["job", "cause", "failed_at_ms", "final_attempt", "last_reason"]),
        "DrainResponse": obj({"records": {"type": "array", "items": ref("DeadLetterRecord")}}, ["records"],
                             "Oldest first; these records were deleted in the same commit."),
        "IdsRequest": obj({"ids": {"type": "array", "minItems": 1, "maxItems": 1000,
                                   "items": string(format="uuid", pattern=UUID_PATTERN)}}, ["ids"],
                          example={"ids": [EXAMPLE_ID]}),
        "RequeueResponse": obj({"requeued": {"type": "array", "items": string(format="uuid")},
                                "missing": {"type": "array", "items": string(format="uuid")}},
                               ["requeued", "missing"]),
        "DeleteDeadLettersResponse": obj({"deleted": {"type": "array", "items": string(format="uuid")},
                                          "missing": {"type": "array", "items": string(format="uuid")}},
                                         ["deleted", "missing"]),
        "PauseResponse": obj({"queue": string(), "paused": {"type": "boolean"}}, ["queue", "paused"]),
        "PauseRequest": obj({"create": nullable({"type": "boolean", "default": False, "description": "also for "
                                                 "a queue that neither exists nor is declared (404 otherwise)"})},
                            example={"create": True}),
        "MoveRequest": obj({"ids": {"type": "array", "minItems": 1, "maxItems": 1000,
                                    "items": string(format="uuid", pattern=UUID_PATTERN)},
                            "reason": nullable(string("kept as the dead letter's `last_reason`"))}, ["ids"],
                           example={"ids": [EXAMPLE_ID], "reason": "bad input, moved by hand"}),
        "MoveResponse": obj({"dead_lettered": {"type": "array", "items": string(format="uuid")},
                             "missing": {"type": "array", "items": string(format="uuid")}},
                            ["dead_lettered", "missing"]),
        "PurgeResponse": obj({"queue": string(), "purged": integer(0)}, ["queue", "purged"]),
        "CircuitClosed": obj({"queue": string(), "circuit": {"type": "string", "enum": ["closed"]},
                              "was": {"type": "string", "enum": ["closed", "open", "half_open"]}},
                             ["queue", "circuit", "was"]),
        "QueueDeleted": obj({"queue": string()}, ["queue"]),
    }


def _config_and_key_schemas() -> dict:
    """The configuration, API keys and the audit log."""
    return {
        "Config": _config_schema(),
        "ConfigView": obj({"version": integer(0, description="bumped by every change (config or keys); 1 is "
                                              "the first leader's TOML"),
                           "fingerprint": string("hash of the configuration"),
                           "config": ref("Config")}, ["version", "fingerprint", "config"],
                          "The configuration in force, every [limits] and [storage] key with its effective value "
                          "and the [[queues]] entries as declared."),
        "KeyEntry": obj({"name": string("1..128 characters, no control characters", minLength=1, maxLength=128,
                                        pattern="^[^\\u0000-\\u001f\\u007f-\\u009f]+$"),
                         "role": {"type": "string", "enum": list(API_ROLES)},
                         "key_sha256": string("the SHA-256 of the key, 64 lowercase hex digits",
                                              pattern="^[0-9a-f]{64}$")}, ["name", "role", "key_sha256"],
                        example={"name": "ci", "role": "viewer", "key_sha256": "9f86d081884c7d659a2feaa0c55ad015"
                                                                               "a3bf4f1b2b0b822cd15d6c15b0f00a08"}),
        "ConfigRequest": obj({"config": ref("Config"),
                              "expect_version": integer(0, description="the version the change is made against "
                                                        "(GET /v1/config); 409 when another is in force"),
                              "keys": {"type": "array", "items": ref("KeyEntry"),
                                       "description": "optional: the whole new key set (left out: unchanged)"}},
                             ["config", "expect_version"],
                             example={"config": {"limits": {"max_queue_depth": 100000},
                                                 "storage": {"dead_letter_retention_ms": 604800000},
                                                 "queues": [{"name": "emails", "default_max_attempts": 5}]},
                                      "expect_version": 1}),
        "ConfigWarning": obj({"code": {"type": "string", "enum": list(CONFIG_WARNINGS)}, "field": string(),
                              "queue": string(), "depth": integer(0), "limit": integer(0), "jobs": integer(0),
                              "dead_letters": integer(0), "resource": string(), "in_flight": integer(0)},
                             ["code", "field"],
                             "\n".join(f"* `{c}`: {d}" for c, d in CONFIG_WARNINGS.items())),
        "ConfigChanged": obj({"version": integer(1), "warnings": {"type": "array", "items": ref("ConfigWarning")}},
                             ["version", "warnings"]),
        "Key": obj({"name": string(), "role": {"type": "string", "enum": list(API_ROLES)},
                    "added_by": {"type": ["string", "null"], "description": "the admin key's name; null for the "
                                 "keys of the first TOML and without auth"},
                    "added_at_ms": ms("replicated time"),
                    "key_sha256_prefix": string("the first 12 hex digits of the key's SHA-256")},
                   ["name", "role", "added_by", "added_at_ms", "key_sha256_prefix"]),
        "KeysResponse": obj({"keys": {"type": "array", "items": ref("Key")}, "version": integer(0)},
                            ["keys", "version"]),
        "KeyAdded": obj({"name": string(), "role": {"type": "string", "enum": list(API_ROLES)}, "version": integer(1)},
                        ["name", "role", "version"]),
        "KeyRemoved": obj({"name": string(), "version": integer(1)}, ["name", "version"]),
        "AuditEntry": obj({"at_ms": ms("replicated time"),
                           "who": {"type": ["string", "null"], "description": "the caller's key name; null without "
                                   "auth (and for the seed)"},
                           "action": {"type": "string", "enum": list(AUDIT_ACTIONS)},
                           "target": {"type": ["string", "null"], "description": "a queue, a job id, a key name"},
                           "details": {"type": "object"}}, ["at_ms", "who", "action", "target", "details"]),
        "AuditPage": obj({"entries": {"type": "array", "items": ref("AuditEntry")},
                          "next_cursor": {"type": ["string", "null"]}}, ["entries", "next_cursor"],
                         "Newest first."),
    }


def _queue_schemas() -> dict:
    """A queue's stats, limits and detail."""
    return {
        "QueueStats": obj({
            "name": string(), "declared": {"type": "boolean", "description": "declared in `[[queues]]`"},
            "paused": {"type": "boolean"},
            **{k: integer(0, description=d) for k, d in (
                ("ready", "jobs that can be reserved now"), ("scheduled", "jobs waiting for their time"),
                ("waiting", "jobs waiting for their dependencies to end (shown while there are some)"),
                ("in_flight", "jobs under a lease"), ("dead_lettered", "dead letters kept"),
                ("enqueued", "jobs enqueued, total"), ("acked", "acks, total"), ("nacked", "nacks, total"),
                ("dead_lettered_total", "jobs dead-lettered, total (kept or not)"),
                ("expired_total", "jobs dead-lettered because their deadline passed before they started, total"),
                ("throttled", "ready jobs held back now because their resource is full (counted in `ready`)"),
                ("throttle_deferred_total", "times reserve held a ready job back for a full resource, total"),
                ("keys", "keys with state in the queue now: jobs ready or in flight, or hand-outs inside their rate "
                         "window (docs/semantics.md \"Keys\")"),
                ("keys_at_limit", "keys held now at their concurrency or rate limit"),
                ("ready_held_by_keys", "ready jobs waiting because their key is at a limit (counted in `ready`)"))},
            "dead_lettered_by_cause": obj({c: integer(0) for c in DEAD_LETTER_CAUSES}, list(ALWAYS_SHOWN_CAUSES),
                                          "the dead letters kept, by cause (`dependency_failed` while there are some)"),
            "workers": {"type": ["integer", "null"], "minimum": 0,
                        "description": "distinct workers that reserved from the queue in the last 30 s (the "
                                       "leader's soft state; null on a follower and in a new leader's first 30 s)"},
            "no_workers": {"type": ["boolean", "null"], "description": "workers is 0 (null when workers is)"},
            "window_open": {"type": "boolean", "description": "inside one of the queue's execution windows (true "
                            "without windows)"},
            "circuit": {"type": ["object", "null"], "description": "null without a circuit breaker", "properties": {
                "state": {"type": "string", "enum": ["closed", "open", "half_open"]},
                "failures": integer(0, description="failures counted within the window"),
                "opened_at_ms": {"type": ["integer", "null"]}, "open_until_ms": {"type": ["integer", "null"]},
                "opened_total": integer(0)},
                "required": ["state", "failures", "opened_at_ms", "open_until_ms", "opened_total"]}},
            ["name", "declared", "paused", "ready", "scheduled", "in_flight", "dead_lettered", "enqueued", "acked",
             "nacked", "dead_lettered_total", "expired_total", "dead_lettered_by_cause", "workers", "no_workers",
             "throttled", "throttle_deferred_total", "window_open", "circuit", "keys", "keys_at_limit",
             "ready_held_by_keys"],
            "Counts are exact; totals count since the queue first appeared."),
        "QueuesResponse": obj({"queues": {"type": "array", "items": ref("QueueStats")}}, ["queues"]),
        "QueueLimits": _queue_limits_schema(),
        "QueueDetail": {"allOf": [ref("QueueStats"), obj({"limits": ref("QueueLimits")}, ["limits"])]},
    }


def _page_schemas() -> dict:
    """Pages of jobs, keys and dead letters."""
    return {
        "JobPage": obj({"jobs": {"type": "array", "items": ref("JobView")},
                        "next_cursor": {"type": ["string", "null"], "description": "pass as `cursor` for the next "
                                        "page; null on the last"}}, ["jobs", "next_cursor"]),
        "KeyRow": obj({
            "key": string("the key"),
            "ready": integer(0, description="its jobs ready now (held back by its limit or not)"),
            "in_flight": integer(0, description="its jobs under a lease"),
            "held": {"type": ["string", "null"], "enum": ["concurrency", "rate", None],
                     "description": "why reserve passes it over now: `concurrency` (its `concurrency` jobs are in "
                                    "flight), `rate` (its rate window is full); null: it is served"},
            "concurrency": {"type": ["integer", "null"], "minimum": 0,
                            "description": "its concurrency limit in force (its own in `key_limits`, else the "
                                           "queue's `key_concurrency`); null: none"},
            "weight": integer(1, MAX_KEY_WEIGHT, "its weight in the fair rotation (`key_weights`, default 1)"),
            "rate": nullable(_rate_schema("its rate limit in force (its own in `key_limits`, else the queue's "
                                          "`key_rate`); null: none")),
            "in_window": integer(0, description="its hand-outs inside the rate window now (0 without a rate)"),
        }, ["key", "ready", "in_flight", "held", "concurrency", "weight", "rate", "in_window"],
            "One key of a queue and where it stands against its limits."),
        "KeyPage": obj({"keys": {"type": "array", "items": ref("KeyRow")},
                        "next_cursor": {"type": ["string", "null"], "description": "pass as `cursor` for the next "
                                        "page; null on the last"}}, ["keys", "next_cursor"],
                       "Keys by ready jobs, most first, then by key."),
        "DeadLetterPage": obj({"records": {"type": "array", "items": ref("DeadLetterRecord")},
                               "next_cursor": {"type": ["string", "null"]}}, ["records", "next_cursor"]),
    }


def _membership_schemas() -> dict:
    """The server's info and the cluster's membership."""
    return {
        "ServerInfo": _server_info_schema(),
        "Member": obj({"id": string(), "url": string(), "raft": string("the member's Raft address, host:port"),
                       "raft_addr": string("the same as `raft` (the older name)"),
                       "connected": {"type": "boolean", "description": "this node's Raft link to it is up (itself: "
                                     "true)"}},
                      ["id", "url", "raft", "raft_addr", "connected"],
                      "A member of the membership in force as this node knows it (changed online or, until the "
                      "first change, the TOML's peers)."),
        "MemberRequest": obj({"id": string("the new node's `node.id`: 1..64 letters, digits, `.`, `_`, `-`",
                                           minLength=1, maxLength=64, pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"),
                              "raft": string("its `node.raft`, host:port", minLength=3, maxLength=300),
                              "url": string("its `node.url`, the address clients use", minLength=8, maxLength=500,
                                            pattern="^https?://")},
                             ["id", "raft", "url"], "A node to add. It must be running with a config whose "
                             "`[cluster] peers` name the current members and itself, with the cluster's secret.",
                             additionalProperties=False,
                             example={"id": "n4", "raft": "10.0.0.14:7001", "url": "http://10.0.0.14:7000"}),
        "MembersChanged": obj({"members": {"type": "array", "items": obj(
                                   {"id": string(), "raft": string(), "url": string()}, ["id", "raft", "url"])},
                               "changed": {"type": "boolean", "description": "false: the node was a member already "
                                           "with the same id, Raft address and URL (a retried add)"},
                               "caught_up_s": {"type": "number", "description": "an add: how long the new node took "
                                               "to catch up before it was proposed"}},
                              ["members", "changed"], "The membership in force once the change is committed."),
    }


def _cluster_view_schemas() -> dict:
    """This node's own view of the cluster."""
    return {
        "ClusterView": obj({
            "node_id": string(), "role": {"type": "string", "enum": ["leader", "follower", "candidate"]},
            "leader": {"type": ["object", "null"], "properties": {"id": string(), "url": string()},
                       "required": ["id", "url"]},
            "term": integer(0), "commit_index": integer(0), "last_applied": integer(0),
            "members": {"type": "array", "items": ref("Member")},
            "ready": {"type": "boolean", "description": "as /readyz"},
            "digest": {"type": ["string", "null"], "description": "hash of the replicated state at "
                       "`digest_index`, equal on every node at the same index; null with `?digest=false`"},
            "digest_index": {"type": ["integer", "null"], "description": "the applied index `digest` belongs to: "
                             "`last_applied`, or older while a large state's next digest is hashed in a child; "
                             "null with `?digest=false`"},
            "durability": {"type": "string", "enum": ["fsync", "memory"]},
            "limits_fingerprint": string("hash of the configuration in force as this node applied it"),
            "config_version": integer(0, description="the configuration version this node has applied (0: "
                                      "none yet, the leader is seeding it)"),
            "toml_differs": {"type": "boolean", "description": "this node's TOML [limits], [storage], [[queues]] "
                             "or [auth] differ from the configuration in force (which the node follows)"},
            "state": obj({k: integer(None) for k in ("jobs", "dead_letters", "dedup_records", "request_ids",
                                                      "audit_entries", "clock_ms", "schedules", "retained_jobs",
                                                      "retained_result_bytes", "waiting_jobs", "batches")},
                         description="sizes of the replicated state; `retained_jobs`, `retained_result_bytes`, "
                                     "`waiting_jobs` and `batches` while there are some"),
            "cpu": {"type": "object", "additionalProperties": {"type": ["number", "null"]}},
            "proposer": {"type": "object", "additionalProperties": {"type": "integer"}},
            "journal_syncs": integer(0),
            "invariant_violations": {"type": ["integer", "null"], "description": "applies after which the core's "
                                     "invariant checks found a problem ([testing] check_invariants; null when off)"},
            "disk": obj({
                "log_verified": {"type": "boolean", "description": "false while the node's log is untrusted: it "
                                 "found damage and no leader has repaired it yet; it neither votes nor leads"},
                "unverified": {"type": ["object", "null"], "description": "what was found and the commit index "
                               "to catch up to"},
                "findings": {"type": "object", "additionalProperties": {"type": "integer"},
                             "description": "damage found since the node started, by kind"},
                "last_findings": {"type": "array", "items": {"type": "object"}},
                "journal_held_bytes": {"type": ["integer", "null"], "description": "bytes of Raft log commands "
                                       "held in memory (tuning.journal_memory_bytes); older entries are read "
                                       "back from the journal file"},
                "free_bytes": {"type": ["integer", "null"], "description": "the data disk's free space"},
                "min_free_bytes": integer(0),
                "low_space": {"type": "boolean", "description": "below min_free_bytes: writes refused"},
            }, description="The disk checks and the free-space reserve"),
            "event_loop": {"type": "string", "enum": ["uvloop", "asyncio"]},
            "raft_engine": {"type": "string", "enum": ["thread", "loop"]},
            "removed": {"type": "boolean", "description": "this node was removed from the cluster: it serves "
                        "nothing (every other call answers 503 `unavailable`), and `members` are those it left"},
            "membership_change": {"type": ["string", "null"], "description": "on the leader, the membership change "
                                  "under way (e.g. `adding n4 at 10.0.0.14:7001`), else null"},
        }, ["node_id", "role", "leader", "term", "commit_index", "last_applied", "members", "ready", "digest"],
            "This node's own view of the cluster."),
    }


def _node_schemas() -> dict:
    """Every member's view, liveness and readiness."""
    return {
        "NodeRow": obj({
            "id": string(), "url": string(),
            "reachable": {"type": "boolean", "description": "the node answered this node's request"},
            "error": {"type": ["string", "null"], "description": "why it did not (refused, timed out, an HTTP "
                      "status such as `401 unauthenticated`)"},
            "role": {"type": "string", "enum": ["leader", "follower", "candidate"]},
            "term": integer(0), "commit_index": integer(0), "last_applied": integer(0),
            "ready": {"type": "boolean"},
            "leader_id": {"type": ["string", "null"], "description": "the leader as that node knows it"},
            "peers_connected": integer(0, description="that node's Raft links that are up"),
            "peers": integer(0, description="that node's peers"),
            "durability": {"type": "string", "enum": ["fsync", "memory"]},
            "lag": integer(0, description="the highest commit index among the nodes that answered, minus "
                              "this node's `last_applied`: entries it has yet to apply"),
        }, ["id", "url", "reachable", "error"], "One member: its own view when it answered (the fields after "
           "`error`), else only `id`, `url`, `reachable` false and `error`."),
        "ClusterNodes": obj({"node_id": string("the node that asked"),
                             "nodes": {"type": "array", "items": ref("NodeRow")}}, ["node_id", "nodes"],
                            "Every member's own view, asked by the node that answers."),
        "Health": obj({"status": {"const": "ok"}}, ["status"]),
        "Readiness": obj({"status": {"type": "string", "enum": ["ready", "not_ready"]},
                          "leader": {"type": ["string", "null"], "description": "the leader's URL as this node "
                                     "knows it"}}, ["status", "leader"]),
    }


def _error_schemas() -> dict:
    """Error codes and the error shape."""
    return {
        "ErrorCode": {"type": "string", "enum": list(errors.STATUS),
                      "description": "\n".join(f"* `{c}` ({errors.STATUS[c]}): {CODE_MEANINGS[c]}"
                                               for c in errors.STATUS)},
        "ErrorDetail": obj({"code": ref("ErrorCode"), "message": string("for people; do not parse"),
                            "rejection": ref("Rejection"),
                            "errors": {"type": "array", "items": ref("BatchRejection")},
                            "queues": {"type": "array", "items": string()},
                            "leader_url": string(), "job_id": string(), "attempt": {"type": "integer"},
                            "limit": {"type": "integer"}, "actual": {"type": "integer"}, "field": string(),
                            "role": {"type": "string", "enum": list(API_ROLES)},
                            "required_role": {"type": "string", "enum": list(API_ROLES)},
                            "queue": string(), "version": {"type": "integer"}, "reason": string(),
                            "name": {"type": ["string", "null"]}, "jobs": {"type": "object"},
                            "applied": {"type": ["boolean", "null"]}},
                           ["code", "message"], "Further fields by code: `rejection` (rejected), `errors` "
                           "(batch_rejected), `queues` (unknown_queues), `leader_url` (not_leader), `job_id` and "
                           "`attempt` (job_not_found, attempt_mismatch), `limit` (request_too_large), `field`, "
                           "`limit` and `actual` (invalid_argument of a string over its length limit), `role` and "
                           "`required_role` (permission_denied), `version` (a stale `expect_version`), `queue`, "
                           "`reason` and `jobs` (a queue that cannot be deleted), `reason` and `name` (a key "
                           "change refused), `applied` (unavailable: false when the request was certainly not "
                           "applied)."),
        "Error": obj({"error": ref("ErrorDetail")}, ["error"], "Every error has this shape."),
    }


def _session_schemas() -> dict:
    """The frames of a session."""
    return {
        "SessionRequestFrame": obj({"id": {"type": "integer", "description": "chosen by the client, unique in the "
                                           "session"},
                                    "op": {"type": "string", "enum": sorted(SESSION_HTTP)},
                                    "request_id": string("as the Request-Id header", pattern=REQUEST_ID_PATTERN),
                                    "body": {"type": "object", "description": "the JSON body of the matching HTTP "
                                             "request; ack, nack and extend carry `job_id` in it"}},
                                   ["id", "op"]),
        "SessionResponseFrame": obj({"id": {"type": ["integer", "null"]}, "status": {"type": "integer"},
                                     "body": {"type": "object", "description": "what the HTTP endpoint answers, "
                                              "errors included"}}, ["id", "status", "body"]),
    }


def _schedule_schemas(queue_name: dict, custom_value: dict) -> dict:
    """Schedules (docs/api.md "Schedules")."""
    job = _schedule_job_fields(queue_name, custom_value)
    policies = _schedule_policies()
    definition = _schedule_definition(policies)
    view = _schedule_view(policies)
    return {
        "ScheduleJob": obj(job, ["queue", "job_type"], "The job each tick enqueues (validated as an enqueue of it "
                           "would be; no id, idempotency key, schedule or deadline of its own)."),
        "ScheduleRequest": obj({**definition, "job": ref("ScheduleJob"),
                                "expect_version": nullable(integer(0, description="0: create only; n: replace "
                                                                   "version n only (409 otherwise)"))},
                               ["job"], "Give `cron` (with `time_zone`) or `every_ms`. Unknown fields are 400 "
                               "here. `end_at_ms` before `start_at_ms` is 400.",
                               additionalProperties=False,
                               oneOf=[{"required": ["cron"]},
                                      {"required": ["every_ms"], "not": {"required": ["time_zone"]}}],
                               example={"cron": "0 6 * * MON-FRI", "time_zone": "Europe/Berlin",
                                        "job": {"queue": "reports", "job_type": "daily_report"}}),
        "ScheduleTemplate": obj({**job, "custom": {"type": "object"}}, ["queue", "job_type"],
                                "A schedule's job as it keeps it (defaults applied)."),
        "Schedule": obj(view, ["name", "version", "job", "paused", "next_fire_at_ms", "fired"]),
        "SchedulesPage": obj({"schedules": {"type": "array", "items": ref("Schedule")},
                              "next_cursor": {"type": ["string", "null"]}}, ["schedules", "next_cursor"], "By name."),
        "ScheduleSaved": obj({"name": string(), "version": integer(1), "created": {"type": "boolean"},
                              "next_fire_at_ms": {"type": ["integer", "null"]}},
                             ["name", "version", "created", "next_fire_at_ms"]),
        "ScheduleDeleted": obj({"name": string(), "deleted": {"const": True}}, ["name", "deleted"]),
        "SchedulePaused": obj({"name": string(), "paused": {"type": "boolean"}, "version": integer(1)},
                              ["name", "paused", "version"]),
        "ScheduleTriggered": obj({"name": string(), "job_id": string(format="uuid")}, ["name", "job_id"]),
    }


def _schedule_job_fields(queue_name: dict, custom_value: dict) -> dict:
    """The fields of a schedule's job (ScheduleJob, ScheduleTemplate)."""
    return {
        "queue": queue_name, "job_type": string("as an enqueue's", minLength=1),
        "payload": nullable(ref("Payload")),
        "priority": nullable(integer(0, 9, "default: the queue's `default_priority` when the schedule is saved")),
        "max_attempts": nullable(integer(1, description="default: the queue's `default_max_attempts`")),
        "custom": nullable({"type": "object", "additionalProperties": custom_value, "propertyNames": {"minLength": 1},
                            "description": "as an enqueue's, no key starting with `raftq.`; each tick's job also "
                                           "gets `raftq.schedule` (the name) and `raftq.tick_ms` (the tick)"}),
        "timeout_ms": nullable(integer(1, description="execution timeout of each job")),
        "resource": nullable(string("throttle resource of each job", minLength=1)),
        "deadline_after_ms": nullable(integer(1, description="each job's deadline: its tick + this")),
    }


def _schedule_policies() -> dict:
    """The catch-up and overlap policies."""
    return {
        "catchup": {"type": "string", "enum": ["skip", "one", "all"], "default": "one",
                    "description": "ticks missed (late by more than `misfire_after_ms`, the cluster down or "
                                   "leaderless): `skip` none, `one` the latest, `all` those within "
                                   "`catchup_window_ms`, oldest first, at most `max_catchup_ticks`"},
        "overlap": {"type": "string", "enum": ["allow", "skip", "replace"], "default": "allow",
                    "description": "while the previous tick's job is not finished: `allow` fire anyway, `skip` "
                                   "fire nothing, `replace` take the place of a job that has not started"},
    }


def _schedule_definition(policies: dict) -> dict:
    """The fields that define a schedule (ScheduleRequest)."""
    return {
        "cron": string("5-field cron (minute hour day-of-month month day-of-week; names, ranges, steps, lists; "
                       "@hourly @daily @weekly @monthly @yearly); give this or `every_ms`. Its syntax is checked "
                       "by the node (400 naming `cron`)", minLength=1, maxLength=200),
        "time_zone": string("IANA zone of `cron` (default UTC), from the tzdata the nodes run; an unknown one is "
                            "400 naming `time_zone`", minLength=1),
        "every_ms": integer(vs.MIN_EVERY_MS, description="a fixed interval instead of `cron`: ticks at creation + k x "
                            "every_ms (k >= 1), or start_at_ms + k x every_ms (k >= 0)"),
        "start_at_ms": nullable(ms("no tick before")), "end_at_ms": nullable(ms("no tick after")),
        "max_count": nullable(integer(1, description="fire at most this many ticks")),
        **{k: nullable(v) for k, v in policies.items()},
        "catchup_window_ms": nullable(integer(1, vs.MAX_CATCHUP_WINDOW_MS, f"default {vs.DEFAULT_CATCHUP_WINDOW_MS}")),
        "misfire_after_ms": nullable(integer(0, vs.MAX_MISFIRE_AFTER_MS, "a tick fired later than this after its time "
                                             f"counts as missed; default {vs.DEFAULT_MISFIRE_AFTER_MS}")),
        "paused": nullable({"type": "boolean", "default": False}),
    }


def _schedule_view(policies: dict) -> dict:
    """A schedule as it is read (Schedule)."""
    maybe_int = {"type": ["integer", "null"]}
    return {"name": string(), "version": integer(1),
            "cron": {"type": ["string", "null"]}, "time_zone": {"type": ["string", "null"]},
            **{k: maybe_int for k in ("every_ms", "start_at_ms", "end_at_ms", "max_count")},
            "catchup_window_ms": integer(1), "misfire_after_ms": integer(0),
            **policies, "paused": {"type": "boolean"},
            "job": ref("ScheduleTemplate"),
            "next_fire_at_ms": {"type": ["integer", "null"], "description": "null: paused, or no tick left"},
            "last_tick_at_ms": maybe_int, "last_fired_at_ms": maybe_int,
            "last_job_id": {"type": ["string", "null"]},
            "last_job_state": {"type": ["string", "null"], "description": "ready, scheduled, in_flight, "
                               "dead_lettered, or finished (acked or deleted); null before the first job"},
            "fired": integer(0), "skipped": integer(0, description="ticks the overlap policy skipped"),
            "last_error": {"type": ["string", "null"], "description": "why the last tick made no job "
                           "(queue_full, unknown_queue, ...); null once one did"},
            "created_at_ms": ms("replicated time"), "updated_at_ms": ms("replicated time")}


# ------------------------------------------------------------------------------------------ routes
ROLE_NAMES = {VIEWER: "viewer", WORKER: "worker", OPERATOR: "operator", ADMIN: "admin", None: None}


def _route(method, path, op_id, summary, description, role, *, leader=True, body=None, body_required=True,
           ok=None, ok_status=200, params=(), errors_=(), write=False, tags=("jobs",), ok_type="application/json",
           extra_responses=None):
    return dict(method=method, path=path, op_id=op_id, summary=summary, description=description, role=role,
                leader=leader, body=body, body_required=body_required, ok=ok, ok_status=ok_status, params=params,
                errors=errors_, write=write, tags=tags, ok_type=ok_type, extra=extra_responses or {})


ID_PARAM = {"name": "id", "in": "path", "required": True, "description": "the job id (a canonical UUID, any case)",
            "schema": {"type": "string", "format": "uuid", "pattern": UUID_PATTERN}}
NAME_PARAM = {"name": "name", "in": "path", "required": True, "description": "the queue name",
              "schema": {"$ref": "#/components/schemas/QueueName"}}
LIMIT_PARAM = {"name": "limit", "in": "query", "description": "page size, 1..100 (default 50)",
               "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 50}}
CURSOR_PARAM = {"name": "cursor", "in": "query", "description": "`next_cursor` of the previous page",
                "schema": {"type": "string"}}

BATCH_PARAM = {"name": "id", "in": "path", "required": True, "description": "the batch id (a canonical UUID)",
               "schema": {"type": "string", "format": "uuid", "pattern": UUID_PATTERN}}
SCHEDULE_PARAM = {"name": "name", "in": "path", "required": True, "description": "the schedule's name",
                  "schema": {"type": "string", "pattern": vs.NAME_PATTERN}}

ROUTES = [
    _route("post", "/v1/jobs", "enqueue", "Enqueue a job",
           "Validated first (a refused job changes nothing); with an idempotency key whose dedup record lives, "
           "the first job's id comes back with `deduplicated: true` (duplicate policy `return_existing`; `reject`: "
           "422 `rejected`, reason `duplicate`; `replace`: `replaced: true`, or 409 once the job has started).",
           WORKER, body="EnqueueRequest",
           ok="EnqueueResult", write=True, errors_=[(409, ["failed_precondition"]), (422, ["rejected"])]),
    _route("post", "/v1/jobs/batch", "enqueue_batch", "Enqueue jobs, best effort",
           "Accepted jobs are committed together in one replicated command; refused ones are answered with their "
           "rejection. Two jobs with one idempotency key: the second deduplicates to the first.", WORKER,
           body="EnqueueBatchRequest", ok="EnqueueBatchResponse", write=True),
    _route("post", "/v1/jobs/atomic", "enqueue_atomic", "Enqueue jobs, all or none",
           "Every job is accepted, or none is enqueued (422 `batch_rejected` lists every failing job).", WORKER,
           body="EnqueueBatchRequest", ok="EnqueueAtomicResponse", write=True, errors_=[(422, ["batch_rejected"])]),
    _route("post", "/v1/reserve", "reserve", "Reserve jobs under a lease",
           "Queues are polled in the order given; within a queue highest priority first, then oldest, then "
           "enqueue order. Paused queues are skipped. With `wait_ms` the request waits on the node it was sent to until a job "
           "is ready or the time is up (then `jobs` is empty).", WORKER, body="ReserveRequest",
           ok="ReserveResponse", write=True, errors_=[(409, ["unknown_queues"])]),
    _route("post", "/v1/acks", "ack_batch", "Ack many jobs",
           "Each ack is fenced like a single one; the outcome of each is in `results`.", WORKER,
           body="AcksRequest", ok="AcksResponse", write=True),
    _route("post", "/v1/jobs/{id}/ack", "ack", "Ack a job", "The job is removed for good (its idempotency "
           "record stays until its window ends); in a queue with `result_retention_ms` it is kept, `succeeded`, "
           "with the `result` the ack carries, for that long.", WORKER, body="AckRequest", ok="JobIdResponse", write=True,
           params=[ID_PARAM], errors_=[(404, ["job_not_found"]), (409, ["attempt_mismatch"])]),
    _route("post", "/v1/jobs/{id}/nack", "nack", "Nack a job",
           "`dead_letter` dead-letters it (cause `rejected`). Otherwise on its last attempt it is dead-lettered "
           "(cause `attempts_exhausted`), else it comes back with attempt + 1 after the delay (`delay`: the one "
           "given; `default`: the queue's retry policy).", WORKER, body="NackRequest", ok="NackResponse",
           write=True, params=[ID_PARAM], errors_=[(404, ["job_not_found"]), (409, ["attempt_mismatch"])]),
    _route("post", "/v1/jobs/{id}/extend", "extend", "Extend a lease", "New deadline = now + lease_ms, "
           "clamped to the queue's `max_lease_duration_ms`; the attempt is unchanged.", WORKER,
           body="ExtendRequest", ok="ExtendResponse", write=True, params=[ID_PARAM],
           errors_=[(404, ["job_not_found"]), (409, ["attempt_mismatch"])]),
    _route("post", "/v1/jobs/{id}/release", "release", "Release a job without using an attempt",
           "Hands the job back: `attempt` (the delivery fence) and `releases` both grow by one, so the attempts "
           "used (`attempt - releases`) are unchanged and this delivery's later ack, nack, extend or release is "
           "409 `attempt_mismatch`. Ready at once in its place, or scheduled after `delay_ms`.", WORKER,
           body="ReleaseRequest", ok="JobIdResponse", write=True, params=[ID_PARAM],
           errors_=[(404, ["job_not_found"]), (409, ["attempt_mismatch"])]),
    _route("post", "/v1/dead-letters/drain", "drain", "Remove and return dead letters",
           "Destructive: the records returned are deleted in the same commit, so a lost answer loses them. "
           "Send a Request-Id and retry with the same one: the retry returns the same records. Returns nothing "
           "when the dead-letter store is off (`dead_letter_retention_enabled` in server-info).", OPERATOR,
           body="DrainRequest", body_required=False, ok="DrainResponse", write=True, tags=("dead letters",)),
    _route("post", "/v1/dead-letters/requeue", "requeue", "Requeue dead letters",
           "Same job id, attempt back to 1, ready now (no schedule, no deadline); ignores `max_queue_depth`. Ids "
           "that are not dead letters are listed in `missing`. At most 1000 ids.", OPERATOR, body="IdsRequest",
           ok="RequeueResponse", write=True, tags=("dead letters",)),
    _route("post", "/v1/dead-letters/delete", "delete_dead_letters", "Delete dead letters",
           "At most 1000 ids; ids that are not dead letters are listed in `missing`.", OPERATOR, body="IdsRequest",
           ok="DeleteDeadLettersResponse", write=True, tags=("dead letters",)),
    _route("post", "/v1/queues/{name}/pause", "pause", "Pause a queue",
           "Reserve skips a paused queue; enqueues are still accepted and time keeps running for schedules and "
           "deadlines. The state is replicated. A queue that neither exists nor is declared is 404 `not_found` "
           "unless the body says `{\"create\": true}`.", OPERATOR, body="PauseRequest", body_required=False,
           ok="PauseResponse", write=True, params=[NAME_PARAM], tags=("queues",),
           errors_=[(404, ["not_found"])]),
    _route("post", "/v1/queues/{name}/resume", "resume", "Resume a paused queue", "As pause (`create` included).",
           OPERATOR, body="PauseRequest", body_required=False, ok="PauseResponse", write=True, params=[NAME_PARAM],
           tags=("queues",), errors_=[(404, ["not_found"])]),
    _route("post", "/v1/queues/{name}/dead-letter", "dead_letter_move", "Move jobs to the dead letters",
           "Ready or scheduled jobs of this queue become dead letters with cause `admin` and the reason as "
           "`last_reason` (kept only when retention is on, like every dead letter); requeue works on them. An id "
           "that is not ready or scheduled in this queue (in flight included) is listed in `missing` and left "
           "alone. At most 1000 ids.", OPERATOR, body="MoveRequest", ok="MoveResponse", write=True,
           params=[NAME_PARAM], tags=("queues",), errors_=[(404, ["not_found"])]),
    _route("post", "/v1/queues/{name}/purge", "purge", "Purge a queue",
           "Removes every ready and scheduled job of the queue; in-flight jobs finish normally. A body, if any, "
           "is ignored.", OPERATOR, body_required=False, ok="PurgeResponse", write=True, params=[NAME_PARAM],
           tags=("queues",), errors_=[(404, ["not_found"])]),
    _route("post", "/v1/queues/{name}/circuit/close", "circuit_close", "Close a queue's circuit breaker",
           "The circuit closes now, whatever its state: its failures are forgotten and reserve takes the queue's "
           "jobs again (`was`: the state before). Replicated and audited (`circuit_close`). A body, if any, is "
           "ignored.", OPERATOR, body_required=False, ok="CircuitClosed", write=True, params=[NAME_PARAM],
           tags=("queues",), errors_=[(404, ["not_found"])]),
    _route("delete", "/v1/queues/{name}", "delete_queue", "Delete a queue",
           "Only a queue with no job in any state (dead letters included) and not declared in the configuration; "
           "409 `failed_precondition` otherwise (`reason`: `declared` or `not_empty`, `jobs`: its counts).", ADMIN,
           ok="QueueDeleted", write=True, params=[NAME_PARAM], tags=("queues",),
           errors_=[(404, ["not_found"]), (409, ["failed_precondition"])]),
    _route("get", "/v1/config", "get_config", "The configuration in force",
           "What every node applies, at the version this leader has applied.", VIEWER, ok="ConfigView",
           tags=("configuration",)),
    _route("put", "/v1/config", "put_config", "Change the configuration",
           "The whole new configuration, validated exactly as the TOML sections are (400 `invalid_argument` "
           "naming the key), proposed through the log and in force on every node from its entry on, with no "
           "restart. 409 `failed_precondition` when `expect_version` is not the version in force. A change "
           "that the existing state does not fit applies from then on (existing jobs untouched): `warnings` "
           "says where.", ADMIN, body="ConfigRequest", ok="ConfigChanged", write=True, tags=("configuration",),
           errors_=[(409, ["failed_precondition"])]),
    _route("get", "/v1/keys", "list_keys", "The API keys in force",
           "Names, roles, who added them and when (never a key).", ADMIN, ok="KeysResponse",
           tags=("configuration",)),
    _route("post", "/v1/keys", "add_key", "Add an API key",
           "The node never sees the key: send its SHA-256 (`raftq keys add NAME ROLE` makes a random key and "
           "prints it once). In force on every node once committed; the first key must be an admin key (409 "
           "otherwise), and a name or a digest in use is 409.", ADMIN, body="KeyEntry", ok="KeyAdded", write=True,
           tags=("configuration",), errors_=[(409, ["failed_precondition"])]),
    _route("delete", "/v1/keys/{name}", "remove_key", "Remove an API key",
           "Refused on every node from its entry on (401). The last admin key cannot be removed (409).", ADMIN,
           ok="KeyRemoved", write=True, tags=("configuration",),
           params=[{"name": "name", "in": "path", "required": True, "description": "the key's name",
                    "schema": {"type": "string", "minLength": 1}}],
           errors_=[(404, ["not_found"]), (409, ["failed_precondition"])]),
    _route("get", "/v1/audit", "audit", "The audit trail",
           "Operator actions, newest first, with who (the caller's key name, null without auth) and the "
           "replicated time; kept for `audit_retention_ms` (30 days), at most `audit_max_entries` (10,000).",
           OPERATOR, ok="AuditPage", tags=("configuration",), errors_=[(400, ["invalid_argument"])],
           params=[LIMIT_PARAM, CURSOR_PARAM]),
    _route("get", "/v1/schedules", "list_schedules", "List schedules",
           "Every schedule by name, with its next fire, last tick, last job and its state.", VIEWER,
           ok="SchedulesPage", tags=("schedules",), params=[LIMIT_PARAM, CURSOR_PARAM],
           errors_=[(400, ["invalid_argument"])]),
    _route("get", "/v1/schedules/{name}", "get_schedule", "One schedule", "As in the list.", VIEWER,
           ok="Schedule", tags=("schedules",), params=[SCHEDULE_PARAM], errors_=[(404, ["not_found"])]),
    _route("put", "/v1/schedules/{name}", "put_schedule", "Create or replace a schedule",
           "Replicated state, in force on every node once committed; its next tick is the first after now (a "
           "replace never catches up). 400 `invalid_argument` names the `field`; 409 `failed_precondition` when "
           "`expect_version` is not its version (0: none exists); 429 `overloaded` at `max_schedules`. Audited.",
           OPERATOR, body="ScheduleRequest", ok="ScheduleSaved", write=True, tags=("schedules",),
           params=[SCHEDULE_PARAM], errors_=[(409, ["failed_precondition"])]),
    _route("delete", "/v1/schedules/{name}", "delete_schedule", "Delete a schedule",
           "It fires nothing more; the jobs it made stay. Audited.", OPERATOR, ok="ScheduleDeleted", write=True,
           tags=("schedules",), errors_=[(404, ["not_found"]), (409, ["failed_precondition"])],
           params=[SCHEDULE_PARAM, {"name": "expect_version", "in": "query", "description": "only if it is at "
                                    "this version (409 otherwise)", "schema": {"type": "integer"}}]),
    _route("post", "/v1/schedules/{name}/pause", "pause_schedule", "Pause a schedule",
           "No tick fires until it is resumed. A body, if any, is ignored. Audited.", OPERATOR, body_required=False,
           ok="SchedulePaused", write=True, tags=("schedules",), params=[SCHEDULE_PARAM],
           errors_=[(404, ["not_found"])]),
    _route("post", "/v1/schedules/{name}/resume", "resume_schedule", "Resume a schedule",
           "Its next tick is the first after now: the ticks of the pause are not caught up. A body, if any, is "
           "ignored. Audited.", OPERATOR, body_required=False, ok="SchedulePaused", write=True, tags=("schedules",),
           params=[SCHEDULE_PARAM], errors_=[(404, ["not_found"])]),
    _route("post", "/v1/schedules/{name}/trigger", "trigger_schedule", "Run a schedule's job now",
           "One extra job from the template, outside the ticks (no overlap policy, not counted in `fired`); "
           "422 `rejected` when its queue refuses it. A body, if any, is ignored. Audited.", OPERATOR,
           body_required=False, ok="ScheduleTriggered", write=True, tags=("schedules",), params=[SCHEDULE_PARAM],
           errors_=[(404, ["not_found"]), (422, ["rejected"])]),
    _route("post", "/v1/batches", "open_batch", "Make a batch",
           "Its members enqueued all or nothing (422 `batch_rejected` as for an atomic enqueue) and its callbacks "
           "kept: `on_failure` is enqueued with its first dead-lettered member, `on_complete` (and `on_success` "
           "when none failed or was removed) with the last member's end once it is closed, exactly once "
           "(docs/semantics.md \"Batches\"). 429 `overloaded` at `max_batches` or `max_batch_members`.", WORKER,
           body="BatchRequest", ok="BatchSaved", write=True, tags=("batches",),
           errors_=[(422, ["batch_rejected"])]),
    _route("post", "/v1/batches/{id}/jobs", "add_to_batch", "Add members to an open batch",
           "All or nothing; 409 `failed_precondition` (reason `closed`) once it is closed.", WORKER,
           body="BatchJobsRequest", ok="BatchSaved", write=True, tags=("batches",), params=[BATCH_PARAM],
           errors_=[(404, ["not_found"]), (409, ["failed_precondition"]), (422, ["batch_rejected"])]),
    _route("post", "/v1/batches/{id}/close", "close_batch", "Close a batch",
           "No more members; its completion callbacks come with its last member's end (at once when every member "
           "has ended). Closing a closed batch changes nothing. A body, if any, is ignored.", WORKER,
           body_required=False, ok="BatchSaved", write=True, tags=("batches",), params=[BATCH_PARAM],
           errors_=[(404, ["not_found"])]),
    _route("delete", "/v1/batches/{id}", "cancel_batch", "Cancel a batch",
           "Its members that have not started (ready, scheduled, waiting) are removed, in id order; running ones "
           "run on; the batch is closed. It completes as any closed batch: `on_complete` once the running members "
           "end, never `on_success`. Audited.", OPERATOR, ok="BatchCancelled", write=True, tags=("batches",),
           params=[BATCH_PARAM], errors_=[(404, ["not_found"])]),
    _route("get", "/v1/batches/{id}", "get_batch", "A batch's status",
           "Counts per end, pending members, callbacks fired; 404 once it finished more than an hour ago.",
           VIEWER, ok="BatchView", tags=("batches",), params=[BATCH_PARAM], errors_=[(404, ["not_found"])]),
    _route("delete", "/v1/jobs/{id}", "cancel", "Cancel (delete) a job",
           "A ready, scheduled or in-flight job is removed for good. In flight (since 0.2.0; before, 409): "
           "its lease is dropped, its worker's next extend, ack, nack or release is 404 `job_not_found`, and it "
           "is never redelivered nor dead-lettered. A dead-lettered or unknown job is 404 `not_found`. A job "
           "other jobs wait on (`depends_on`) is 409 `failed_precondition` (reason `has_dependents`, "
           "`dependents`) unless `cascade=true`: then those jobs, transitively, are cancelled too and listed in "
           "`cancelled` (docs/semantics.md \"Dependencies\").", OPERATOR,
           ok="CancelResponse", write=True, params=[ID_PARAM, {
               "name": "cascade", "in": "query", "description": "also cancel the jobs waiting on it, transitively",
               "schema": {"type": "string", "enum": ["true", "false"]}}],
           errors_=[(404, ["not_found"]), (409, ["failed_precondition"])]),
    _route("get", "/v1/queues", "list_queues", "List queues",
           "Every queue that has had a job or is declared, with its counts and totals.", VIEWER,
           ok="QueuesResponse", tags=("queues",)),
    _route("get", "/v1/queues/{name}", "get_queue", "One queue with its limits",
           "An undeclared queue that never had a job shows zeros (404 in strict mode).", VIEWER, ok="QueueDetail",
           params=[NAME_PARAM], tags=("queues",), errors_=[(404, ["not_found"])]),
    _route("get", "/v1/queues/{name}/jobs", "list_queue_jobs", "List a queue's jobs",
           "Ready jobs in delivery order, scheduled ones by run time, in-flight ones by lease expiry.", VIEWER,
           ok="JobPage", tags=("queues",), errors_=[(400, ["invalid_argument"])],
           params=[NAME_PARAM, {"name": "state", "in": "query", "schema": {
               "type": "string", "enum": ["ready", "scheduled", "in_flight"], "default": "ready"}},
                   LIMIT_PARAM, CURSOR_PARAM]),
    _route("get", "/v1/queues/{name}/keys", "list_queue_keys", "List a queue's keys",
           "The keys of the queue's jobs (docs/semantics.md \"Keys\") with state now: by ready jobs, most first, "
           "then by key; per key its ready and in-flight jobs, whether a limit holds it, the limits in force and "
           "its weight. A queue with no keyed job answers an empty page; one that neither exists nor is declared "
           "is 404 `not_found`.", VIEWER, ok="KeyPage", tags=("queues",),
           errors_=[(400, ["invalid_argument"]), (404, ["not_found"])],
           params=[NAME_PARAM, LIMIT_PARAM, CURSOR_PARAM]),
    _route("get", "/v1/jobs/{id}", "get_job", "Inspect a job",
           "A job acked in a queue that retains finished jobs shows `succeeded` with its result while retained; "
           "404 `not_found` once it is acked elsewhere, cancelled, drained, dropped or past its retention.", VIEWER,
           ok="JobView", params=[ID_PARAM], errors_=[(400, ["invalid_argument"]), (404, ["not_found"])]),
    _route("get", "/v1/jobs/{id}/result", "get_job_result", "Wait for a job's result",
           "The job's outcome: `succeeded` with its result (while retained), `dead_lettered`, or, while it has "
           "not finished, a long poll of up to `wait_ms` on the node the call was sent to (a follower waits on its "
           "own applied state, and asks the leader when that shows the job unfinished or unknown), then "
           "`pending`. 404 `not_found` for a job the cluster knows nothing of (never enqueued, acked in a queue "
           "that keeps none, cancelled, past its retention). Any node answers it (never a 307).", VIEWER,
           ok="JobResult", leader=False,
           params=[ID_PARAM, {"name": "wait_ms", "in": "query", "description": "wait up to this long for the job "
                              "to finish (clamped to `max_wait_timeout_ms`); 0 (default): answer at once",
                              "schema": {"type": "integer", "minimum": 0, "default": 0}}],
           errors_=[(400, ["invalid_argument"]), (404, ["not_found"]), (429, ["overloaded"]),
                    (503, ["no_leader", "unavailable"])]),
    _route("get", "/v1/dead-letters", "list_dead_letters", "List dead letters",
           "Oldest first, without removing them.", VIEWER, ok="DeadLetterPage", tags=("dead letters",),
           errors_=[(400, ["invalid_argument"])],
           params=[{"name": "queue", "in": "query", "description": "only this queue's", "schema": {"type": "string"}},
                   {"name": "cause", "in": "query", "description": "only this cause's; at most 10000 records are "
                    "looked at per call, so a page may hold fewer than `limit` records and still have a "
                    "`next_cursor`", "schema": {"type": "string", "enum": list(DEAD_LETTER_CAUSES)}},
                   LIMIT_PARAM, CURSOR_PARAM]),
    _route("get", "/v1/session", "session", "Open a session (WebSocket)",
           "Upgrades to a WebSocket that carries the operations of this API as JSON frames, many in flight at "
           "once, answered in any order: a request frame `{\"id\", \"op\", \"request_id\"?, \"body\"}` "
           "(SessionRequestFrame), a response frame `{\"id\", \"status\", \"body\"}` (SessionResponseFrame) with "
           "the status and body the HTTP endpoint would give. `x-raftq-session-ops` lists the ops, the route "
           "each mirrors and the role each needs. Send a JSON array of frames (or connect with `?batch=1`) to "
           "get answers batched the same way. When this node stops leading it closes the session with code 4001 "
           "and the new leader's URL as the reason: reconnect there and re-send unanswered frames with their "
           "request ids. With API keys the key is checked at the upgrade (any role) and each frame against its "
           "op's role. A plain GET that is not an upgrade is answered 400 `invalid_argument`; an upgrade whose "
           "`Origin` is another site's is 403. A session takes at most `tuning.max_session_inflight` (512) frames "
           "unanswered and `tuning.max_session_queued_bytes` (1 MiB) of answers unsent: at either bound the node "
           "stops reading the socket until answers drain (TCP pushes back), and a session whose answers stay "
           "unread for `tuning.session_stall_timeout_s` (20 s) is closed with code 4008. A frame larger than "
           "`max_request_bytes` closes the session with code 1009.", VIEWER,
           ok=None, ok_status=101, tags=("session",), params=[{"name": "batch", "in": "query",
                                                                 "schema": {"type": "string", "enum": ["1"]}}]),
    _route("get", "/v1/server-info", "server_info", "Server info and limits", "Any node answers.", VIEWER,
           leader=False, ok="ServerInfo", tags=("cluster",)),
    _route("get", "/v1/cluster", "cluster", "This node's view of the cluster",
           "Any node answers from its own view. The digest costs O(state) on the node: pollers pass "
           "`digest=false`.", VIEWER, leader=False, ok="ClusterView", tags=("cluster",),
           params=[{"name": "digest", "in": "query", "description": "`false`, `0` or `no` leaves the digest out",
                    "schema": {"type": "string", "default": "true"}}]),
    _route("get", "/v1/cluster/nodes", "cluster_nodes", "Every node's view",
           "Any node answers: it asks every member for its own view (`GET /v1/cluster?digest=false`) at once, "
           "passing the caller's `Authorization` on (each node checks the key itself), and answers a row per "
           "member; a member that does not answer within 1.5 s has `reachable` false and `error`. The admin UI's "
           "node table reads it (a browser page may only call its own node).", VIEWER, leader=False,
           ok="ClusterNodes", tags=("cluster",)),
    _route("post", "/v1/cluster/members", "add_member", "Add a member",
           "Online membership change, one member at a time, through the Raft log. The leader first sends the new "
           "node the log (or its snapshot) without counting it toward the majority, and proposes the change only "
           "once it is within 64 entries of the leader's log; the answer comes once the change is committed (the "
           "call can take as long as the snapshot's transfer). A node that never answers, or makes no progress for "
           "15 s, is given up (503 `unavailable`, nothing changed). 409 `failed_precondition`: another change is "
           "under way or not committed yet, or the id, Raft address or URL is a member's (the same member again "
           "is 200 with `changed: false`).", ADMIN, body="MemberRequest", ok="MembersChanged", write=True,
           tags=("cluster",), errors_=[(409, ["failed_precondition"])]),
    _route("delete", "/v1/cluster/members/{id}", "remove_member", "Remove a member",
           "Through the Raft log; answered once committed. The removed node learns it, logs why and serves nothing "
           "from then on. Removing the leader: it hands leadership to a caught-up member first and answers 307 "
           "to the new leader, which removes it. 404 `not_found`: no member with this id; 409 "
           "`failed_precondition`: the last member, or another change under way.", ADMIN, ok="MembersChanged",
           write=True, tags=("cluster",),
           params=[{"name": "id", "in": "path", "required": True, "description": "the member's id",
                    "schema": {"type": "string", "minLength": 1}}],
           errors_=[(404, ["not_found"]), (409, ["failed_precondition"])]),
    _route("get", "/v1/openapi.json", "openapi", "This document", "Any node answers.", VIEWER, leader=False,
           ok=None, tags=("cluster",)),
    _route("get", "/v1/backup", "backup", "An online backup of the state",
           "Any node answers with its own applied state, consistent at one applied index (taken between two "
           "Raft ticks by a forked child, while the node serves), streamed as it is made: `RAFTQ-BACKUP 1`, a JSON "
           "header line (index, term, node), the gzip'd body, a 256-byte trailer `RAFTQ-END {body_bytes, "
           "body_sha256, digest}`. `raftq backup` takes it from a "
           "caught-up follower and verifies it; `raftq restore` writes it into a new cluster's data dirs. One "
           "backup at a time per node (429 `overloaded` while one is taken). A stream its client reads nothing "
           "of for `tuning.http_write_stall_timeout_s` (30 s) is cut: the connection closes.", ADMIN, leader=False, ok=None,
           ok_type="application/octet-stream", tags=("cluster",),
           errors_=[(429, ["overloaded"]), (503, ["unavailable"])]),
    _route("get", "/metrics", "metrics", "Prometheus metrics",
           "This node's Raft, proposer, CPU and applied queue figures, labelled `node`; read queue figures "
           "where `raftq_leader` is 1.", VIEWER, leader=False, ok=None, ok_type="text/plain", tags=("cluster",)),
    _route("get", "/healthz", "healthz", "Liveness", "200 while the process serves HTTP. No key needed.", None,
           leader=False, ok="Health", tags=("cluster",)),
    _route("get", "/readyz", "readyz", "Readiness",
           "200 when this node can take writes: the cluster's configuration is seeded, this node knows a leader, has "
           "heard a commit index from it and has applied all of it but at most 64 entries; 503 "
           "otherwise. No key needed.", None, leader=False, ok="Readiness", tags=("cluster",),
           extra_responses={"503": {"description": "not ready", "headers": {"Retry-After": {"$ref": "#/components/headers/RetryAfter"}},
                                    "content": {"application/json": {"schema": ref("Readiness")}}}}),
    _route("get", "/", "admin_page", "The admin UI",
           "One static page over this node's API; asks for a key when API keys are on.", None, leader=False,
           ok=None, ok_type="text/html", tags=("cluster",)),
]


def _error_response(status: int, codes: list[str]) -> dict:
    r = {"description": "; ".join(f"`{c}`: {CODE_MEANINGS[c]}" for c in codes),
         "content": {"application/json": {"schema": ref("Error")}}, "x-raftq-error-codes": list(codes)}
    headers = {}
    if status in (429, 503):
        headers["Retry-After"] = {"$ref": "#/components/headers/RetryAfter"}
    if status == 401:
        headers["WWW-Authenticate"] = {"required": True, "schema": {"type": "string"},
                                       "description": "`Bearer realm=\"raftq\"`"}
    if status == 307:
        headers["Location"] = {"required": True, "schema": {"type": "string"},
                               "description": "the leader's URL with the same path and query"}
        headers["Leader-Url"] = {"required": True, "schema": {"type": "string"}, "description": "the leader's URL"}
    if headers:
        r["headers"] = headers
    return r


# Error answers many operations share, kept once in components/responses.
SHARED_RESPONSES = {
    (400, ("invalid_argument",)): "InvalidArgument", (401, ("unauthenticated",)): "Unauthenticated",
    (403, ("permission_denied",)): "PermissionDenied", (307, ("not_leader",)): "NotLeader",
    (413, ("request_too_large",)): "RequestTooLarge", (429, ("overloaded",)): "Overloaded",
    (408, ("request_timeout",)): "RequestTimeout", (415, ("unsupported_media_type",)): "UnsupportedMediaType",
    (503, ("no_leader",)): "NoLeader", (503, ("no_leader", "unavailable")): "Unavailable",
    (500, ("internal",)): "Internal",
}


def _responses(route) -> dict:
    codes: dict[int, list[str]] = {}

    def add(status, *cs):
        for c in cs:
            assert errors.STATUS[c] == status, (c, status)
            codes.setdefault(status, [])
            if c not in codes[status]:
                codes[status].append(c)

    if route["role"] is not None:
        add(401, "unauthenticated")
        if route["role"] > VIEWER:
            add(403, "permission_denied")
    if route["leader"]:
        add(307, "not_leader")
        add(503, "no_leader")
    if route["write"]:
        add(400, "invalid_argument")
        add(408, "request_timeout")
        add(413, "request_too_large")
        add(415, "unsupported_media_type")
        add(429, "overloaded")
        add(503, "no_leader", "unavailable")
    if route["params"] and any(p["in"] == "path" and p["name"] == "id" for p in route["params"]):
        add(400, "invalid_argument")
    for status, cs in route["errors"]:
        add(status, *cs)
    add(500, "internal")
    out: dict[str, dict] = {}
    ok_status = str(route["ok_status"])
    if route["ok_status"] == 101:
        out[ok_status] = {"description": "Switching Protocols: the session is open"}
        out["400"] = _error_response(400, ["invalid_argument"])
        out["400"]["description"] = "not a WebSocket upgrade request: " + out["400"]["description"]
        out["403"] = _error_response(403, ["permission_denied"])
        out["403"]["description"] = ("the key's role, or an upgrade from a web page of another origin: "
                                     + out["403"]["description"])
    elif route["ok"] is not None:
        out[ok_status] = {"description": "OK", "content": {route["ok_type"]: {"schema": ref(route["ok"])}}}
    elif route["op_id"] == "openapi":
        out[ok_status] = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
    else:
        out[ok_status] = {"description": "OK", "content": {route["ok_type"]: {"schema": {"type": "string"}}}}
    for status in sorted(codes):
        if str(status) in out:
            continue
        name = SHARED_RESPONSES.get((status, tuple(codes[status])))
        out[str(status)] = ({"$ref": f"#/components/responses/{name}"} if name is not None
                            else _error_response(status, codes[status]))
    out.update(route["extra"])
    return dict(sorted(out.items()))


def _operation(route) -> dict:
    role = ROLE_NAMES[route["role"]]
    desc = route["description"]
    if role is not None:
        desc += f"\n\nRole: `{role}` or higher (when API keys are on)."
    if route["leader"]:
        desc += (" Needs the leader: a follower forwards it, or answers 307 to the leader when the call sends "
                 "`Raftq-Redirect: 1` or the node's `[api] followers` is `redirect` (without `Raftq-Redirect: 0`).")
    op = {"operationId": route["op_id"], "summary": route["summary"], "description": desc,
          "tags": list(route["tags"]), "x-raftq-role": role, "x-raftq-leader-only": route["leader"]}
    params = list(route["params"])
    if route["method"] in ("post", "delete", "put"):
        params.append({"$ref": "#/components/parameters/RequestId"})
    if route["leader"]:                 # the routes that may answer 307 (responses: NotLeader)
        params.append({"$ref": "#/components/parameters/RaftqRedirect"})
    if params:
        op["parameters"] = params
    if route["body"] is not None:
        schema = ref(route["body"])
        if not route["body_required"]:          # an optional body: JSON null is taken as none
            schema = {"oneOf": [schema, {"type": "null"}]}
        op["requestBody"] = {"required": route["body_required"],
                             "content": {"application/json": {"schema": schema}}}
    elif route["method"] == "post" and not route["body_required"]:
        op["requestBody"] = {"required": False, "description": "ignored (any JSON value)",
                             "content": {"application/json": {"schema": {}}}}
    op["responses"] = _responses(route)
    op["security"] = [{"bearer": []}] if role is not None else []
    if route["op_id"] == "session":
        ops = sorted(FAST_OPS | {"reserve"} | set(READ_OPS))
        op["x-raftq-session-ops"] = {o: {"route": f"{SESSION_HTTP[o][0].upper()} {SESSION_HTTP[o][1]}",
                                         "role": API_ROLES[OP_ROLES.get(o, VIEWER)]} for o in ops}
    return op


# Request headers many operations take, kept once in components/parameters.
PARAMETERS = {
    "RequestId": {
        "name": "Request-Id", "in": "header", "required": False,
        "description": "1..128 visible ASCII characters, scoped to the caller (the API key's name). A "
                       "repeat of the same request within `request_id_window_ms` returns the stored answer "
                       "and applies nothing; reused for another route or another body it is 400 and "
                       "changes nothing.",
        "schema": {"type": "string", "pattern": REQUEST_ID_PATTERN}},
    # Any string: a value other than 1 and 0 is taken as none (docs/api.md "Leader redirect"), so
    # no value is invalid.
    "RaftqRedirect": {
        "name": "Raftq-Redirect", "in": "header", "required": False,
        "description": "What a follower does with this call, which needs the leader: `1` asks for `307` to "
                       "the leader (`Location`, `Leader-Url`), `0` for the call to be forwarded and answered "
                       "with the leader's answer. Without it (or with another value) the node's `[api] "
                       "followers` decides (`forward` by default). The leader ignores it.",
        "schema": {"type": "string"}, "examples": {"redirect": {"value": "1"}, "forward": {"value": "0"}}},
}


@lru_cache(maxsize=1)
def document() -> dict:
    paths: dict[str, dict] = {}
    for route in ROUTES:
        paths.setdefault(route["path"], {})[route["method"]] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "raftq HTTP API", "version": __version__,
            "summary": "A durable job queue replicated by Raft",
            "description": "Every node serves the whole API: a follower forwards what needs the leader, or "
                           "answers it 307 to the leader when asked (`Raftq-Redirect: 1`, or the node's "
                           "`[api] followers` is `redirect`; follow redirects keeping method and body). JSON bodies, "
                           "snake_case fields, unknown request fields ignored, an optional field given as null "
                           "taken as left out; a request body must be sent as `Content-Type: application/json` "
                           "(415 otherwise); a method a path does not take is 405 `method_not_allowed` with "
                           "`Allow`; integers are written as JSON integers (`1`, not `1.0`: a number "
                           "with a fraction or exponent is refused as a wrong type, which JSON Schema cannot "
                           "express); instants are integer ms since the "
                           "Unix epoch (`*_at_ms`), durations integer ms (`*_ms`). Any POST, PUT or DELETE may "
                           "carry `Request-Id`: a repeat by the same caller of the same request within "
                           "`request_id_window_ms` (60 s) gets the stored answer and applies nothing. See "
                           "docs/api.md.",
            "license": {"name": "see the repository"},
        },
        "tags": [{"name": t} for t in ("jobs", "batches", "dead letters", "queues", "schedules", "session", "cluster",
                                                 "configuration")],
        "paths": paths,
        "components": {
            "schemas": schemas(),
            "responses": {name: _error_response(status, list(codes))
                          for (status, codes), name in SHARED_RESPONSES.items()},
            "parameters": PARAMETERS,
            "headers": {"RetryAfter": {"required": True, "description": "seconds to wait before retrying",
                                       "schema": {"type": "string", "pattern": "^[0-9]+$"}}},
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "Only when the nodes have `[auth] api_keys`: `Authorization: Bearer <key>`; the "
                               "key's role (viewer < worker < operator < admin) must reach the operation's "
                               "(`x-raftq-role`). Without keys the API is open."}},
        },
    }


def document_bytes() -> bytes:
    return (json.dumps(document(), indent=2, ensure_ascii=False) + "\n").encode()


def main() -> int:
    sys.stdout.buffer.write(document_bytes())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
