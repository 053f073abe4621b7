"""sepp's gRPC API on a node: `sepp.v1.QueueService` (8 unary RPCs) and `grpc.health.v1.Health`
on the `[grpc] listen` port, served by grpcio's asyncio server on the node's own event loop.

A transport like node/api/http.py and session.py: each RPC is converted field by field into the
body the HTTP API takes, answered by the same NodeService method (job_ops.py, cluster_view.py),
and its `(status, body)` converted back into sepp's messages and status codes
(docs/sepp.md "What maps to what"). Keys are raftq's key set with the HTTP API's roles, sent
as `authorization: Bearer <key>` metadata. The message classes are sepp-py's generated code
(pyproject.toml, the `grpc` extra, says why).
"""
from __future__ import annotations

import asyncio
import logging
from binascii import a2b_base64, b2a_base64

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sepp.v1 import queue_pb2 as pb
from sepp.v1 import queue_pb2_grpc as pb_grpc

from ..base.auth import OPERATOR, VIEWER, WORKER
from ..base.validate import valid_request_id
from ..core.errors import error
from ..service.node_service import NodeService

log = logging.getLogger("raftq.grpc")
SERVICE_NAME = "sepp.v1.QueueService"
Code = grpc.StatusCode

# raftq's error codes (node/core/errors.py) → sepp's status codes (notes: sepp §1.12).
CODES = {
    "invalid_argument": Code.INVALID_ARGUMENT,
    "unauthenticated": Code.UNAUTHENTICATED,
    "permission_denied": Code.PERMISSION_DENIED,
    "job_not_found": Code.NOT_FOUND,
    "not_found": Code.NOT_FOUND,
    "attempt_mismatch": Code.FAILED_PRECONDITION,
    "failed_precondition": Code.FAILED_PRECONDITION,
    "unknown_queues": Code.FAILED_PRECONDITION,
    "request_too_large": Code.RESOURCE_EXHAUSTED,
    "overloaded": Code.RESOURCE_EXHAUSTED,
    "not_leader": Code.UNAVAILABLE,
    "no_leader": Code.UNAVAILABLE,
    "unavailable": Code.UNAVAILABLE,
    "request_timeout": Code.UNAVAILABLE,
    "internal": Code.INTERNAL,
}
CAUSES = {"attempts_exhausted": pb.DEAD_LETTER_CAUSE_ATTEMPTS_EXHAUSTED, "rejected": pb.DEAD_LETTER_CAUSE_REJECTED,
          "lease_expired": pb.DEAD_LETTER_CAUSE_LEASE_EXPIRED, "admin": pb.DEAD_LETTER_CAUSE_ADMIN}
# Rejections with {limit, actual}, under the same name in sepp's JobRejection oneof.
LIMIT_ACTUAL = ("queue_name_too_long", "job_type_name_too_long", "idempotency_key_too_long", "payload_too_large",
                "custom_entries_too_many", "custom_map_too_large")


class Refused(Exception):
    """An RPC answered with an error status: (grpc code, message, raftq's error code)."""

    def __init__(self, code: grpc.StatusCode, message: str, raftq_code: str = ""):
        super().__init__(message)
        self.code, self.message, self.raftq_code = code, message, raftq_code


def refused(status: int, body) -> Refused:
    """The status for a raftq error answer. A 503 whose outcome is unknown (`applied: null`: the
    leader changed while the command was in flight) is ABORTED, not UNAVAILABLE: sepp-py retries
    UNAVAILABLE for every call, and ABORTED only where a repeat is harmless (not for an enqueue
    without an idempotency key, which could then run twice)."""
    err = ((body or {}).get("error") or {}) if isinstance(body, dict) else {}
    code = err.get("code", "internal")
    grpc_code = CODES.get(code, Code.INTERNAL if status >= 500 else Code.UNKNOWN)
    if code == "unavailable" and "applied" in err and err["applied"] is None:
        grpc_code = Code.ABORTED
    return Refused(grpc_code, err.get("message", code), code)


def invalid(message: str) -> Refused:
    return Refused(Code.INVALID_ARGUMENT, message, "invalid_argument")


# ------------------------------------------------------------------ sepp → raftq
def ms_of(d) -> int:
    """A Duration in ms; a positive part of a millisecond counts as one (a lease of 0.5 ms is not 0)."""
    ns = d.seconds * 1_000_000_000 + d.nanos
    return -((-ns) // 1_000_000)


def _value(v):
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)     # None: refused as invalid_request


def enqueue_body(r) -> dict:
    """One sepp EnqueueRequest as docs/api.md's EnqueueRequest."""
    job = {"queue": r.queue, "job_type": r.job_type}
    if r.HasField("payload"):
        job["payload"] = {"data_b64": b2a_base64(r.payload.data, newline=False).decode("ascii"),
                          "encoding": r.payload.encoding}
    if r.HasField("idempotency_key"):
        job["idempotency_key"] = r.idempotency_key
    if r.HasField("priority"):
        job["priority"] = r.priority
    if r.HasField("max_attempts"):
        job["max_attempts"] = r.max_attempts
    if r.HasField("trace_context"):
        t = r.trace_context
        job["trace_context"] = {"traceparent": t.traceparent,
                                "tracestate": t.tracestate if t.HasField("tracestate") else None}
    if r.custom:
        job["custom"] = {k: _value(v) for k, v in r.custom.items()}
    if r.HasField("scheduled_at"):
        job["scheduled_at_ms"] = r.scheduled_at.ToMilliseconds()
    return job


def _worker_id(r):
    if r.HasField("worker_id"):
        if not r.worker_id:
            raise invalid("worker_id must not be empty")
        return r.worker_id
    return None


def reserve_body(r) -> dict:
    if not r.HasField("lease_duration"):
        raise invalid("lease_duration is required")
    body = {"queues": list(r.queues), "lease_ms": ms_of(r.lease_duration),
            "wait_ms": ms_of(r.wait_timeout) if r.HasField("wait_timeout") else 0}
    if r.HasField("max_jobs"):
        body["max_jobs"] = r.max_jobs
    worker = _worker_id(r)
    if worker is not None:
        body["worker_id"] = worker
    return body


def nack_body(r) -> dict:
    _worker_id(r)
    body = {"attempt": r.attempt}
    if r.HasField("reason"):
        body["reason"] = r.reason
    if r.HasField("retry"):
        strategy = r.retry.WhichOneof("strategy")
        if strategy is None:
            raise invalid("retry strategy is required")
        body["retry"] = {"strategy": strategy}
        if strategy == "delay":
            body["retry"]["delay_ms"] = ms_of(r.retry.delay)
    return body


def extend_body(r) -> dict:
    _worker_id(r)
    if not r.HasField("lease_duration"):
        raise invalid("lease_duration is required")
    return {"attempt": r.attempt, "lease_ms": ms_of(r.lease_duration)}


def drain_body(r) -> dict:
    body = {}
    if r.HasField("queue"):
        body["queue"] = r.queue
    if r.HasField("max"):
        body["max"] = r.max
    return body


# ------------------------------------------------------------------ raftq → sepp
def _set_value(out, v) -> None:
    if isinstance(v, bool):
        out.bool_value = v
    elif isinstance(v, int):
        out.int_value = v
    elif isinstance(v, float):
        out.double_value = v
    else:
        out.string_value = str(v)


def job_message(j: dict, out=None):
    """docs/api.md's Job as sepp's Job."""
    out = pb.Job() if out is None else out
    out.id, out.queue, out.job_type = j["id"], j["queue"], j["job_type"]
    out.priority, out.attempt, out.max_attempts = j["priority"], j["attempt"], j["max_attempts"]
    p = j.get("payload")
    if p is not None:
        out.payload.data = a2b_base64(p["data_b64"])
        out.payload.encoding = p["encoding"]
    t = j.get("trace_context")
    if t is not None:
        out.trace_context.traceparent = t["traceparent"]
        if t.get("tracestate") is not None:
            out.trace_context.tracestate = t["tracestate"]
    out.enqueued_at.FromMilliseconds(j["enqueued_at_ms"])
    if j.get("lease_expires_at_ms") is not None:
        out.lease_expires_at.FromMilliseconds(j["lease_expires_at_ms"])
    if j.get("scheduled_at_ms") is not None:
        out.scheduled_at.FromMilliseconds(j["scheduled_at_ms"])
    for k, v in (j.get("custom") or {}).items():
        _set_value(out.custom[k], v)
    return out


def rejection_message(r: dict, out=None):
    """docs/api.md's Rejection as sepp's JobRejection (its oneof `reason`). raftq's own reasons
    (duplicate, duplicate_started: a queue's duplicate_policy) have no sepp variant: they are
    `invalid_request` with a message that names them (docs/sepp.md "What differs")."""
    out = pb.JobRejection() if out is None else out
    reason = r.get("reason")
    if reason in LIMIT_ACTUAL:
        m = getattr(out, reason)
        m.limit, m.actual = r["limit"], r["actual"]
    elif reason == "custom_key_too_long":
        out.custom_key_too_long.key, out.custom_key_too_long.limit = r["key"], r["limit"]
        out.custom_key_too_long.actual = r["actual"]
    elif reason in ("unknown_queue", "queue_closing"):
        getattr(out, reason).queue = r.get("queue", "")
    elif reason == "queue_full":
        out.queue_full.queue, out.queue_full.limit = r.get("queue", ""), r.get("limit", 0)
    elif reason == "job_type_not_allowed":
        out.job_type_not_allowed.job_type = r.get("job_type", "")
        out.job_type_not_allowed.allowed.extend(r.get("allowed") or ())
    elif reason == "encoding_not_allowed":
        out.encoding_not_allowed.encoding = r.get("encoding", "")
        out.encoding_not_allowed.allowed.extend(r.get("allowed") or ())
    elif reason == "scheduled_too_far":
        out.scheduled_too_far.horizon.FromMilliseconds(r["horizon_ms"])
        out.scheduled_too_far.actual.FromMilliseconds(r["scheduled_at_ms"])
    elif reason == "invalid_request":
        out.invalid_request.message = r.get("message", "")
    else:
        extra = ", ".join(f"{k} {v}" for k, v in r.items() if k != "reason")
        out.invalid_request.message = f"{reason}" + (f": {extra}" if extra else "")
    return out


def enqueue_response(a: dict, out=None):
    out = pb.EnqueueResponse() if out is None else out
    out.job_id, out.deduplicated = a["job_id"], bool(a.get("deduplicated"))
    return out


def batch_response(body: dict):
    resp = pb.EnqueueBatchResponse()
    for r in body["results"]:
        slot = resp.results.add()
        if "rejection" in r:
            rejection_message(r["rejection"], slot.rejection)
        else:
            enqueue_response(r, slot.success)
    return resp


def atomic_response(status: int, body: dict):
    resp = pb.EnqueueAtomicResponse()
    if status == 200:
        resp.success.SetInParent()
        for r in body["results"]:
            enqueue_response(r, resp.success.responses.add())
        return resp
    if status == 422 and body["error"].get("code") == "batch_rejected":
        resp.rejection.SetInParent()
        for e in body["error"]["errors"]:
            slot = resp.rejection.errors.add()
            slot.index = e["index"]
            rejection_message(e["rejection"], slot.rejection)
        return resp
    raise refused(status, body)


def dead_letter_message(rec: dict, out):
    job_message(rec["job"], out.job)
    out.cause = CAUSES.get(rec["cause"], pb.DEAD_LETTER_CAUSE_UNSPECIFIED)
    out.failed_at.FromMilliseconds(rec["failed_at_ms"])
    out.final_attempt = rec["final_attempt"]
    if rec.get("last_reason") is not None:
        out.last_reason = rec["last_reason"]
    return out


def server_info_message(info: dict):
    out = pb.GetServerInfoResponse(server_version=info["server_version"])
    out.supported_protocol_versions.extend(info.get("protocol_versions") or ["v1"])
    out.server_time.FromMilliseconds(info["server_time_ms"])
    for name in ("restricts_encodings", "max_payload_bytes", "max_custom_entries", "max_custom_total_bytes",
                 "max_custom_key_bytes", "max_queue_name_bytes", "max_job_type_bytes", "max_idempotency_key_bytes",
                 "max_enqueue_batch", "max_reserve_batch", "max_reserve_queues", "strict_queues",
                 "dead_letter_retention_enabled"):
        setattr(out, name, info[name])
    out.allowed_encodings.extend(info.get("allowed_encodings") or ())
    out.max_schedule_horizon.FromMilliseconds(info["max_schedule_horizon_ms"])
    out.max_wait_timeout.FromMilliseconds(info["max_wait_timeout_ms"])
    out.max_lease_duration.FromMilliseconds(info["max_lease_duration_ms"])
    return out


# ------------------------------------------------------------------ the calls
def follower_refusal(service: NodeService):
    """The error for a call this node cannot serve now, or None: stopping or removed, the
    configuration not seeded yet. A follower serves every call (NodeService forwards what needs
    the leader to it, node/service/forwarding.py)."""
    if service.stopping:
        return error("unavailable", "this node is shutting down; retry on another node", applied=False)
    if service.replica.removed:
        return error("unavailable", service.removed_reason())
    if not service.seeded and not service.is_seeded():
        return service.not_seeded()
    return None


class QueueService(pb_grpc.QueueServiceServicer):
    """sepp.v1.QueueService over one NodeService."""

    def __init__(self, service: NodeService):
        self.service = service

    def caller(self, context, need: int, leader: bool = True):
        """(key name or None, request id or None, the keyword arguments that carry the caller's
        Authorization on, for the leader to check when a follower forwards the call) for a call
        that needs role level `need`, or Refused: the key
        (`authorization` metadata), then this node's readiness to serve."""
        header = rid = None
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                header = value
            elif key == "request-id":
                rid = value
        service = self.service
        found, denied = service.auth.frame_check(header, need)
        if denied is not None:
            raise refused(*denied)
        if rid is not None and not valid_request_id(rid):
            raise invalid("request-id metadata must be 1..128 visible ASCII characters")
        if leader and (not_now := follower_refusal(service)) is not None:
            raise refused(*not_now)
        return (found[0] if found else None), rid, {"auth": header}

    async def _call(self, context, fn):
        """Run one RPC body: a Refused (or an unexpected failure) becomes its status."""
        try:
            return await fn()
        except Refused as e:
            await context.abort(e.code, e.message, trailing_metadata=(("raftq-error-code", e.raftq_code),))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gRPC call failed")
            await context.abort(Code.INTERNAL, "internal error (a bug): see the node's log")

    @staticmethod
    def answer(status: int, body):
        if status != 200:
            raise refused(status, body)
        return body

    def _jobs(self, request) -> dict:
        if not request.jobs:
            raise invalid("batch must contain at least one job")
        return {"jobs": [enqueue_body(r) for r in request.jobs]}

    async def EnqueueBatch(self, request, context):
        async def run():
            who, rid, kw = self.caller(context, WORKER)
            return batch_response(self.answer(*await self.service.enqueue_batch(self._jobs(request), rid, who, **kw)))
        return await self._call(context, run)

    async def EnqueueAtomic(self, request, context):
        async def run():
            who, rid, kw = self.caller(context, WORKER)
            return atomic_response(*await self.service.enqueue_atomic(self._jobs(request), rid, who, **kw))
        return await self._call(context, run)

    async def Reserve(self, request, context):
        async def run():
            who, rid, kw = self.caller(context, WORKER)
            body = self.answer(*await self.service.reserve(reserve_body(request), rid, who=who, **kw))
            resp = pb.ReserveResponse()
            for j in body["jobs"]:
                job_message(j, resp.jobs.add())
            return resp
        return await self._call(context, run)

    async def Ack(self, request, context):
        async def run():
            who, rid, kw = self.caller(context, WORKER)
            _worker_id(request)
            body = self.answer(*await self.service.ack(request.job_id, {"attempt": request.attempt}, rid, who, **kw))
            return pb.AckResponse(job_id=body["job_id"])
        return await self._call(context, run)

    async def Nack(self, request, context):
        async def run():
            who, rid, kw = self.caller(context, WORKER)
            body = self.answer(*await self.service.nack(request.job_id, nack_body(request), rid, who, **kw))
            return pb.NackResponse(job_id=body["job_id"], dead_lettered=bool(body.get("dead_lettered")))
        return await self._call(context, run)

    async def Extend(self, request, context):
        async def run():
            who, rid, kw = self.caller(context, WORKER)
            body = self.answer(*await self.service.extend(request.job_id, extend_body(request), rid, who, **kw))
            resp = pb.ExtendResponse(job_id=body["job_id"])
            resp.lease_expires_at.FromMilliseconds(body["lease_expires_at_ms"])
            return resp
        return await self._call(context, run)

    async def DrainDeadLetters(self, request, context):
        async def run():
            who, rid, kw = self.caller(context, OPERATOR)
            body = self.answer(*await self.service.drain(drain_body(request), rid, who, **kw))
            resp = pb.DrainDeadLettersResponse()
            for rec in body["records"]:
                dead_letter_message(rec, resp.records.add())
            return resp
        return await self._call(context, run)

    async def GetServerInfo(self, request, context):
        async def run():
            self.caller(context, VIEWER, leader=False)     # any node: the configuration it has applied
            return server_info_message(self.answer(*self.service.server_info()))
        return await self._call(context, run)


class Health(health_pb2_grpc.HealthServicer):
    """grpc.health.v1.Health, no key needed: SERVING while this node can serve sepp's calls (ready,
    as /readyz says, and not stopping: see follower_refusal), for "" and sepp.v1.QueueService."""
    WATCH_POLL_S = 0.5

    def __init__(self, service: NodeService):
        self.service = service

    def status(self, name: str):
        if name not in ("", SERVICE_NAME):
            return None
        ok = self.service.ready() and follower_refusal(self.service) is None
        return health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING

    async def Check(self, request, context):
        status = self.status(request.service)
        if status is None:
            await context.abort(Code.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request, context):
        last = None
        while True:
            status = self.status(request.service)
            if status is None:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await asyncio.sleep(self.WATCH_POLL_S)


class Certificates:
    """The TLS files as gRPC server credentials; `reload()` (SIGHUP) makes new connections get
    the files as they are then, established ones keep theirs (as the HTTP API's TlsSite)."""

    def __init__(self, files):
        self.files = files
        self.pending = None
        self.initial = self._config()

    def _config(self):
        f = self.files
        ca = f.client_ca.read_bytes() if f.client_ca is not None else None
        return grpc.ssl_server_certificate_configuration([(f.key.read_bytes(), f.cert.read_bytes())],
                                                         root_certificates=ca)

    def reload(self) -> None:
        self.pending = self._config()

    def fetch(self):
        pending, self.pending = self.pending, None
        return pending

    def credentials(self):
        return grpc.dynamic_ssl_server_credentials(self.initial, self.fetch,
                                                   require_client_authentication=self.files.client_ca is not None)


class GrpcServer:
    """The node's gRPC server: started after the HTTP site, stopped after NodeService."""

    def __init__(self, service: NodeService):
        settings = service.settings
        self.service = service
        self.host, self.port = settings.grpc_listen
        self.certificates = Certificates(settings.tls) if settings.tls is not None else None
        max_bytes = service.limits.max_request_bytes + 64 * 1024        # a batch of max_request_bytes of jobs
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", max_bytes), ("grpc.max_send_message_length", -1),
            ("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000),   # sepp's
            ("grpc.so_reuseport", 0)])
        pb_grpc.add_QueueServiceServicer_to_server(QueueService(service), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(Health(service), self.server)

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Listen and serve; OSError when the address cannot be bound."""
        try:
            if self.certificates is None:
                bound = self.server.add_insecure_port(self.address)
            else:
                bound = self.server.add_secure_port(self.address, self.certificates.credentials())
        except RuntimeError as e:
            raise OSError(f"cannot listen on {self.address}: {e}") from e
        if not bound:
            raise OSError(f"cannot listen on {self.address}")
        await self.server.start()

    def reload_tls(self) -> bool:
        if self.certificates is None:
            return False
        self.certificates.reload()
        return True

    async def stop(self, grace_s: float = 1.0) -> None:
        await self.server.stop(grace_s)
