"""The raftq client: finds the leader by itself and survives failover without losing or
duplicating work.

    async with Client(["http://127.0.0.1:7001", "http://127.0.0.1:7002"]) as c:
        r = await c.enqueue("emails", "welcome", b'{"user": 42}', encoding="application/json")
        for job in await c.reserve(["emails"], lease_ms=30_000, wait_ms=5_000):
            await c.ack(job)

* Transport: `"session"` (default) multiplexes every call over one WebSocket to the leader
  (`GET /v1/session`); `"http"` sends plain requests. Calls the session does not carry go over
  HTTP either way.
* Leader discovery: asks any node `GET /v1/cluster`, sends to the leader (with `Raftq-Redirect: 1`,
  so a follower answers 307 instead of forwarding), follows 307s and remembers the new leader;
  with `spread=True` it sends every call to one node of its own instead (picked at random, the
  next one when it fails), which forwards to the leader (`Raftq-Redirect: 0`, docs/client.md). On connection errors,
  `no_leader`, `unavailable` and `overloaded` it retries across nodes with capped, jittered
  backoff until the call's deadline.
* A cluster that is not there: when, during a call, no node accepts a connection for
  `connect_budget` seconds (3 by default), the call raises `Unreachable` (an `Unavailable`)
  naming every URL and how long it has refused, instead of retrying until its deadline. A node
  that answers without a leader, or takes the connection and does not answer (paused), keeps
  the call retrying to its deadline (an election takes 1-3 s).
* TLS: https:// URLs are verified against the system's CAs, or `ca=` (a PEM bundle) for a
  cluster with its own CA; `cert=(certfile, keyfile)` presents a client certificate to nodes
  that require one (mTLS). A TLS problem that retrying cannot fix (a certificate that is not
  trusted or does not name the host, a missing client certificate, an http:// URL for a node
  that serves https:// or the reverse) raises `TlsError` at once, saying what to give.
* Exactly-once in effect: every mutating call carries a `Request-Id` that stays the same across
  its retries, and an enqueue without an idempotency key gets a generated one (opt out with
  `auto_idempotency=False`), so a retry after an ambiguous failure cannot create a second job.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import os
import random
import socket
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson

SESSION_OPS = frozenset(("enqueue", "enqueue_batch", "enqueue_atomic", "reserve", "ack", "ack_batch",
                         "nack", "extend", "drain", "server_info", "cluster", "release"))
# request_timeout: the node did not get the whole body in time (so applied nothing).
RETRYABLE_CODES = frozenset(("no_leader", "unavailable", "overloaded", "request_timeout"))


def auto_idempotency_key() -> str:
    """A generated idempotency key: "~" and 80 random bits in URL-safe base64, 15 characters.
    Every node keeps the key of each job for the dedup window, so its length is memory: a
    15-character string is a 64-byte object, one more character makes it 80 (pymalloc's
    16-byte steps), a uuid4's 32 hex digits 96 (docs/performance.md). Two of 10^9 keys in one
    window (800 GB of dedup records per node) collide with odds below 1 in a million
    (n^2 / 2^81)."""
    return "~" + base64.urlsafe_b64encode(os.urandom(10)).decode("ascii")[:14]


# ---------------------------------------------------------------------------- errors


class RaftqError(Exception):
    """An error answered by the cluster (or the client's own deadline)."""

    def __init__(self, code: str, message: str, status: int | None = None, details: dict | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status, self.details = code, message, status, details or {}


class Unavailable(RaftqError):
    """No leader answered in time (election, lost quorum, overload). Safe to retry the call."""


class Unreachable(Unavailable):
    """No node accepted a connection for the call's `connect_budget` (or until its deadline):
    the cluster is down or the URLs are wrong. `refused` maps each URL to {"reason": ...,
    "for_s": seconds it has refused}; `maybe_sent` is False when no node took a connection
    during the whole call (nothing was applied), True when the call reached a node before they
    went away (its outcome is unknown, as after any Unavailable)."""

    @property
    def refused(self) -> dict:
        return self.details.get("refused", {})

    @property
    def maybe_sent(self) -> bool:
        return bool(self.details.get("maybe_sent", True))


def describe_refused(refused: dict) -> str:
    """`url, url: connection refused for 3.0s; url: unknown host (...) for 3.0s`, grouped."""
    groups: dict[tuple, list[str]] = {}
    for url, r in refused.items():
        groups.setdefault((r["reason"], r["for_s"]), []).append(url)
    return "; ".join(f"{', '.join(urls)}: {reason} for {for_s:.1f}s" for (reason, for_s), urls in groups.items())


class TlsError(RaftqError):
    """A TLS problem that retrying will not fix: the node's certificate is not trusted (give
    `ca=`) or does not name the host, the node requires a client certificate (give `cert=`), or
    the URL's scheme does not match the node (http:// to a node that serves https://, or the
    reverse). Nothing was sent to the API."""


TLS_CODES = frozenset(("tls_required", "client_certificate_required"))


def tls_context(ca: str | None = None, verify: bool = True, cert=None):
    """The client side of TLS: True (aiohttp's default verification against the system's CAs)
    when nothing is given, else an SSLContext trusting `ca` (a PEM file of CA certificates)
    instead, presenting `cert` (`(certfile, keyfile)`, or one file holding both), or, with
    `verify=False`, checking nothing at all (tests only: anyone on the path can read and change
    the traffic)."""
    if ca is None and verify and cert is None:
        return True
    try:
        ctx = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    except (OSError, ssl.SSLError) as e:
        raise TlsError("tls", f"ca={str(ca)!r}: cannot load the CA bundle ({getattr(e, 'strerror', None) or e})")
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert is not None:
        certfile, keyfile = (cert, None) if isinstance(cert, (str, bytes)) or not hasattr(cert, "__len__") \
            else tuple(cert)
        try:
            ctx.load_cert_chain(str(certfile), str(keyfile) if keyfile is not None else None)
        except (OSError, ssl.SSLError) as e:
            raise TlsError("tls", f"cert=({str(certfile)!r}, {str(keyfile)!r}): cannot load the client certificate "
                           f"({getattr(e, 'strerror', None) or getattr(e, 'reason', None) or e})")
    return ctx


def tls_problem(e: BaseException, url: str | None) -> str | None:
    """What went wrong in the TLS handshake with the node at `url` (without the URL), or None
    when `e` is not about TLS."""
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        ce = e.certificate_error
        why = getattr(ce, "verify_message", None) or str(ce)
        if "mismatch" in why:
            return (f"the node's certificate does not name this host ({why}); call it by a name or IP address its "
                    "certificate lists")
        return (f"the node's certificate is not trusted ({why}): give the CA that signed it (Client(ca=PATH); "
                "raftq --ca PATH or $RAFTQ_CA)")
    if isinstance(e, aiohttp.ClientSSLError):
        err = getattr(e, "os_error", None) or e.__cause__ or e
        reason = getattr(err, "reason", None) or ""
        if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
                      "HTTP_REQUEST", "UNKNOWN_PROTOCOL"):
            return (f"the node does not answer TLS ({reason.lower().replace('_', ' ')}): it serves plain HTTP, so "
                    "use http:// for it, or turn TLS on at the node (node.tls_cert)")
        return f"the TLS handshake failed ({reason.lower().replace('_', ' ') or err})"
    return None


def _tls_refusal(status: int, body, headers=None) -> str | None:
    """The message of a node's refusal at the TLS level (plain HTTP to its TLS port, no client
    certificate), or None."""
    code = headers.get("Raftq-Tls") if headers is not None else None
    if code is None and isinstance(body, dict):
        code = (body.get("error") or {}).get("code")
    if code == "client_certificate_required":
        return ("the node requires a client certificate (mTLS) signed by its tls_client_ca: give one "
                "(Client(cert=(CERTFILE, KEYFILE)); raftq --cert FILE --key FILE)")
    if code == "tls_required":
        return "the node serves HTTPS only: use https:// URLs (and ca= when its certificate is from a private CA)"
    return None


def _tls_error(failures: list[tuple[str, str]]) -> TlsError:
    """One TlsError for the (url, problem) pairs of a leader lookup, URLs grouped by problem."""
    groups: dict[str, list[str]] = {}
    for url, why in failures:
        groups.setdefault(why, []).append(url)
    return TlsError("tls", "; ".join(f"{', '.join(urls)}: {why}" for why, urls in groups.items()), None,
                    {"urls": [u for u, _ in failures]})


class LeaseLost(RaftqError):
    """`job_not_found` or `attempt_mismatch`: this worker no longer owns the job; stop."""


class Rejected(RaftqError):
    """An enqueue refused; `rejection` is the reason object (`reason` plus its fields)."""

    @property
    def rejection(self) -> dict:
        return self.details.get("rejection", {})

    @property
    def reason(self) -> str | None:
        return self.rejection.get("reason")

    @property
    def existing_job_id(self) -> str | None:
        """With reason `duplicate` (duplicate_policy reject): the job the idempotency key names."""
        return self.rejection.get("job_id")


class BatchRejected(RaftqError):
    """An atomic batch refused; `errors` lists `{"index", "rejection"}` for every failing job."""

    @property
    def errors(self) -> list:
        return self.details.get("errors", [])


class InvalidArgument(RaftqError):
    pass


class NotFound(RaftqError):
    pass


class Conflict(RaftqError):
    """409 `failed_precondition` / `unknown_queues`."""


class RequestTooLarge(RaftqError):
    pass


class Unauthenticated(RaftqError):
    pass


class PermissionDenied(RaftqError):
    pass


class Internal(RaftqError):
    """A 500: a bug in the server. Not retried."""


_ERRORS = {
    "job_not_found": LeaseLost, "attempt_mismatch": LeaseLost, "rejected": Rejected,
    "batch_rejected": BatchRejected, "invalid_argument": InvalidArgument, "not_found": NotFound,
    "failed_precondition": Conflict, "unknown_queues": Conflict, "request_too_large": RequestTooLarge,
    "unauthenticated": Unauthenticated, "permission_denied": PermissionDenied, "internal": Internal,
    "no_leader": Unavailable, "unavailable": Unavailable, "overloaded": Unavailable,
    "request_timeout": Unavailable, "method_not_allowed": InvalidArgument, "unsupported_media_type": InvalidArgument,
    "tls_required": TlsError, "client_certificate_required": TlsError,
}


def error_from(status: int, body) -> RaftqError:
    err = body.get("error", {}) if isinstance(body, dict) else {}
    code = err.get("code", "internal" if status >= 500 else "invalid_argument")
    details = {k: v for k, v in err.items() if k not in ("code", "message")}
    if code in TLS_CODES:
        return TlsError(code, _tls_refusal(status, body) or err.get("message", ""), status, details)
    return _ERRORS.get(code, RaftqError)(code, err.get("message", str(body)), status, details)


# ---------------------------------------------------------------------------- types
@dataclass
class EnqueueResult:
    job_id: str
    deduplicated: bool
    replaced: bool = False          # duplicate_policy replace: the existing job was replaced


@dataclass
class Job:
    """A reserved job and its context. `lease_expires_at_ms` is the real, clamped deadline:
    budget against it, not against the lease you asked for."""
    id: str
    queue: str
    job_type: str
    payload: bytes | None
    encoding: str | None
    priority: int
    attempt: int
    max_attempts: int
    enqueued_at_ms: int
    lease_expires_at_ms: int | None
    scheduled_at_ms: int | None = None
    custom: dict = field(default_factory=dict)
    trace_context: dict | None = None
    deadline_at_ms: int | None = None
    state: str | None = None            # only from job inspection
    timeout_ms: int | None = None       # the execution timeout (the job's, else its queue's)
    releases: int = 0                   # deliveries handed back by release (no attempt used)
    key: str | None = None              # the job's key (docs/semantics.md "Keys"), if it has one
    # the jobs it waited for, ((job id, policy), ...) (docs/semantics.md "Dependencies"): read
    # their results with Client.result
    depends_on: tuple = ()

    @classmethod
    def from_wire(cls, d: dict) -> "Job":
        p = d.get("payload")
        return cls(id=d["id"], queue=d["queue"], job_type=d["job_type"],
                   payload=base64.b64decode(p["data_b64"]) if p else None,
                   encoding=p["encoding"] if p else None, priority=d["priority"], attempt=d["attempt"],
                   max_attempts=d["max_attempts"], enqueued_at_ms=d["enqueued_at_ms"],
                   lease_expires_at_ms=d.get("lease_expires_at_ms"), scheduled_at_ms=d.get("scheduled_at_ms"),
                   custom=d.get("custom") or {}, trace_context=d.get("trace_context"),
                   deadline_at_ms=d.get("deadline_at_ms"), state=d.get("state"),
                   timeout_ms=d.get("timeout_ms"), releases=d.get("releases") or 0, key=d.get("key"),
                   depends_on=tuple((x["job_id"], x["policy"]) for x in d.get("depends_on") or ()))

    @property
    def attempts_used(self) -> int:
        """This delivery included: `attempt - releases` (a release uses no attempt)."""
        return self.attempt - self.releases

    @property
    def is_last_attempt(self) -> bool:
        return self.attempts_used >= self.max_attempts


@dataclass
class JobResult:
    """A finished job's outcome (GET /v1/jobs/{id}/result, docs/semantics.md "Job results"):
    `state` is "succeeded" (acked; `result` is the bytes its ack carried, None without one or
    once dropped at its queue's bound: `result_dropped`) or "dead_lettered" (`job.last_reason`
    says why). `job` is the job as `Client.job` shows it."""
    job_id: str
    state: str
    job: Job
    result: bytes | None = None
    encoding: str | None = None
    result_dropped: bool = False
    finished_at_ms: int | None = None
    retained_until_ms: int | None = None
    wire: dict = field(default_factory=dict, repr=False)     # the answer as it came (JobResult shape)

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"

    @classmethod
    def from_wire(cls, d: dict) -> "JobResult":
        r = d.get("result")
        return cls(job_id=d["job_id"], state=d["state"], job=Job.from_wire(d["job"]),
                   result=base64.b64decode(r["data_b64"]) if r else None, encoding=r["encoding"] if r else None,
                   result_dropped=bool(d.get("result_dropped")), finished_at_ms=d.get("finished_at_ms"),
                   retained_until_ms=d.get("retained_until_ms"), wire=d)


@dataclass
class Result:
    """What a Worker handler returns to ack its job with a result (docs/semantics.md "Job
    results"): `data` bytes (or str, sent as UTF-8) and its `encoding` (None: text/plain for a
    str, application/octet-stream for bytes)."""
    data: bytes | str
    encoding: str | None = None


def result_field(result: bytes | str, encoding: str | None = None) -> dict:
    """An ack's `result` object: str is sent as UTF-8 (text/plain unless `encoding` says), bytes
    as application/octet-stream unless `encoding` says."""
    if isinstance(result, str):
        return {"data_b64": base64.b64encode(result.encode()).decode(), "encoding": encoding or "text/plain"}
    return {"data_b64": base64.b64encode(result).decode(), "encoding": encoding or "application/octet-stream"}


@dataclass
class DeadLetterRecord:
    job: Job
    cause: str
    failed_at_ms: int
    final_attempt: int
    last_reason: str | None

    @classmethod
    def from_wire(cls, d: dict) -> "DeadLetterRecord":
        return cls(Job.from_wire(d["job"]), d["cause"], d["failed_at_ms"], d["final_attempt"], d.get("last_reason"))

    def to_enqueue_request(self) -> dict:
        """An EnqueueRequest that replays this job as a NEW job (new id, attempt 1): same queue,
        type, payload, priority, max_attempts, custom, trace context and key; no schedule."""
        j = self.job
        req: dict[str, Any] = {"queue": j.queue, "job_type": j.job_type, "priority": j.priority,
                               "max_attempts": j.max_attempts, "custom": dict(j.custom)}
        if j.payload is not None:
            req["payload"] = {"data_b64": base64.b64encode(j.payload).decode(), "encoding": j.encoding}
        if j.trace_context:
            req["trace_context"] = dict(j.trace_context)
        if j.key is not None:
            req["key"] = j.key
        return req


class HandlerOutcome(Exception):
    """Base of the exceptions a Worker's handler raises to choose its nack."""

    def __init__(self, reason: str | None = None):
        super().__init__(reason)
        self.reason = reason


class Retry(HandlerOutcome):
    """Two uses, one name. Raised by a Worker's handler: nack with the queue's retry policy
    (`default`): attempt + 1, or dead-lettered (`attempts_exhausted`) on the last attempt.
    Called as `Retry.default()`, `Retry.delay(ms)`, `Retry.dead_letter()`: the nack directive
    for `Client.nack(job, retry=...)`."""

    @staticmethod
    def default() -> dict:
        return {"strategy": "default"}

    @staticmethod
    def delay(delay_ms: int) -> dict:
        return {"strategy": "delay", "delay_ms": int(delay_ms)}

    @staticmethod
    def dead_letter() -> dict:
        return {"strategy": "dead_letter"}


class RetryAfter(HandlerOutcome):
    """Raised by a handler: nack with `delay`: redelivered not before `delay_ms` from now (last
    attempt: dead-lettered)."""

    def __init__(self, delay_ms: int, reason: str | None = None):
        super().__init__(reason)
        if int(delay_ms) < 0:
            raise ValueError("delay_ms must be >= 0")
        self.delay_ms = int(delay_ms)


class Permanent(HandlerOutcome):
    """Raised by a handler: nack with `dead_letter`: dead-lettered at once with cause `rejected`."""


def job_request(queue: str, job_type: str, payload: bytes | str | None = None, *,
                encoding: str = "application/octet-stream", priority: int | None = None,
                idempotency_key: str | None = None, max_attempts: int | None = None,
                custom: dict | None = None, scheduled_at_ms: int | None = None, delay_ms: int | None = None,
                trace_context: dict | None = None, deadline_at_ms: int | None = None,
                timeout_ms: int | None = None, duplicate_policy: str | None = None,
                key: str | None = None, depends_on: list | None = None, ref: str | None = None) -> dict:
    """Build an EnqueueRequest body. `key`: the job's key (a tenant, customer, account) for the
    queue's fairness and per-key limits (docs/semantics.md "Keys"). `depends_on`: job ids, or
    (job id, policy) pairs, or {"job_id" | "ref", "policy"} dicts; `ref`: this job's name for
    later jobs of the same batch (docs/semantics.md "Dependencies")."""
    req: dict[str, Any] = {"queue": queue, "job_type": job_type}
    if payload is not None:
        if isinstance(payload, str):
            payload = payload.encode()
        req["payload"] = {"data_b64": base64.b64encode(payload).decode(), "encoding": encoding}
    for k, v in (("priority", priority), ("idempotency_key", idempotency_key), ("max_attempts", max_attempts),
                 ("custom", custom), ("scheduled_at_ms", scheduled_at_ms), ("delay_ms", delay_ms),
                 ("trace_context", trace_context), ("deadline_at_ms", deadline_at_ms),
                 ("timeout_ms", timeout_ms), ("duplicate_policy", duplicate_policy), ("key", key), ("ref", ref)):
        if v is not None:
            req[k] = v
    if depends_on is not None:
        req["depends_on"] = [{"job_id": d[0], "policy": d[1]} if isinstance(d, tuple) else d for d in depends_on]
    return req


# ---------------------------------------------------------------------------- transport
_CONNECT_TIMEOUT = getattr(aiohttp, "ConnectionTimeoutError", ())     # aiohttp >= 3.10


def not_accepted(e: BaseException) -> str | None:
    """Why no connection to the node was made, or None when it accepted one (it answered, or
    took the connection and then failed or timed out: the request may have reached it)."""
    if isinstance(e, aiohttp.ClientSSLError):
        return None
    if isinstance(e, aiohttp.ClientConnectorError):
        os_error = getattr(e, "os_error", None)
        if isinstance(os_error, ConnectionRefusedError):
            return "connection refused"
        if isinstance(os_error, socket.gaierror):
            return f"unknown host ({os_error.strerror})"
        return f"cannot connect ({getattr(os_error, 'strerror', None) or e})"
    if _CONNECT_TIMEOUT and isinstance(e, _CONNECT_TIMEOUT):
        return "connect timed out"
    return None


async def _json_or_none(r):
    try:
        return orjson.loads(await r.read())
    except ValueError:
        return None


class SessionLost(Exception):
    def __init__(self, leader_url: str | None, sent: bool = True):
        super().__init__(f"session closed (leader now {leader_url or 'unknown'})")
        self.leader_url = leader_url
        self.sent = sent            # False: closed before this request went out


class _Session:
    """One WebSocket to the leader, many requests in flight, answered in any order."""

    def __init__(self, url: str, ws: aiohttp.ClientWebSocketResponse):
        self.url = url
        self.ws = ws
        self.pending: dict[int, asyncio.Future] = {}
        self.deadlines: collections.deque = collections.deque()   # (deadline, frame id), FIFO
        self.next_id = 0
        self.closed = False
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.outbox: list = []
        self.wake = asyncio.Event()
        self.reader = loop.create_task(self._read())
        self.reaper = loop.create_task(self._reap())
        self.writer = loop.create_task(self._write())

    async def _write(self):
        # Requests queued at one moment go out as one message (a JSON array of frames, the
        # session's batching extension): one syscall for many calls.
        try:
            while not self.closed:
                await self.wake.wait()
                self.wake.clear()
                while self.outbox and not self.closed:
                    frames, self.outbox = self.outbox, []
                    await self.ws.send_bytes(orjson.dumps(frames if len(frames) > 1 else frames[0]))
        except Exception:
            pass

    async def _reap(self):
        # One timer for every request of the session instead of an asyncio.wait_for each.
        # Deadlines are not monotone in the deque (calls differ), so expired ones are found
        # by a scan bounded by the queue's length.
        while not self.closed:
            await asyncio.sleep(0.1)
            now = self.loop.time()
            keep = collections.deque()
            while self.deadlines:
                deadline, fid = self.deadlines.popleft()
                fut = self.pending.get(fid)
                if fut is None or fut.done():
                    continue
                if deadline <= now:
                    self.pending.pop(fid, None)
                    fut.set_exception(asyncio.TimeoutError())
                else:
                    keep.append((deadline, fid))
            self.deadlines = keep

    async def _read(self):
        leader = None
        try:
            while True:
                msg = await self.ws.receive()
                if msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                    data = orjson.loads(msg.data)
                    for frame in (data if isinstance(data, list) else (data,)):
                        fut = self.pending.pop(frame.get("id"), None)
                        if fut is not None and not fut.done():
                            fut.set_result((frame["status"], frame["body"]))
                    continue
                if msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 4001 and msg.extra:
                    leader = str(msg.extra)      # the node moved leadership to this URL
                break
        except Exception:
            pass
        finally:
            self.closed = True
            err = SessionLost(leader)
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(err)
            self.pending.clear()
            if not self.ws.closed:
                try:
                    await self.ws.close()
                except Exception:
                    pass

    async def call(self, op: str, body, rid: str | None, timeout: float):
        if self.closed:
            raise SessionLost(None, sent=False)
        self.next_id += 1
        fid = self.next_id
        fut = asyncio.get_running_loop().create_future()
        self.pending[fid] = fut
        frame = {"id": fid, "op": op, "body": body}
        if rid is not None:
            frame["request_id"] = rid
        self.deadlines.append((self.loop.time() + timeout, fid))
        self.outbox.append(frame)
        self.wake.set()
        try:
            return await fut
        finally:
            self.pending.pop(fid, None)

    async def close(self):
        self.closed = True
        self.reaper.cancel()
        self.writer.cancel()
        await self.ws.close()


class Client:
    def __init__(self, urls, api_key: str | None = None, transport: str = "session", *,
                 timeout: float = 30.0, connect_timeout: float = 5.0, backoff_base: float = 0.05,
                 backoff_max: float = 1.0, auto_idempotency: bool = True, connections: int = 100,
                 attempt_timeout: float = 8.0, connect_budget: float | None = 3.0,
                 ca: str | None = None, verify: bool = True, cert=None, spread: bool = False):
        """`timeout`: each call's deadline (s). `connect_timeout`: bound of one leader lookup
        or session handshake. `attempt_timeout`: bound of one attempt. `connect_budget`: a call
        during which no node accepts a connection for this long raises `Unreachable` (None:
        retry until the deadline, for a client started before its cluster).
        TLS (https:// URLs): `ca` a PEM file of the CAs to trust instead of the system's,
        `cert` a client certificate `(certfile, keyfile)` for nodes that require one (mTLS),
        `verify=False` checks no certificate at all: for tests only, never in production
        (anyone on the path could read the API keys and change the traffic).
        `spread`: send every call to one node picked for this client (at random; the next one
        when it fails) and let it forward to the leader, instead of to the leader itself: many
        clients spread the parsing and answering over every node (docs/client.md)."""
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u]
        if not urls:
            raise ValueError("give at least one node URL")
        if transport not in ("session", "http"):
            raise ValueError("transport must be 'session' or 'http'")
        self.urls = [u.rstrip("/") for u in urls]
        self._given = frozenset(self.urls)      # the caller's; those learnt from members may be dropped again
        self.api_key = api_key
        self.transport = transport
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.auto_idempotency = auto_idempotency
        self.connections = connections
        self.attempt_timeout = attempt_timeout
        self.connect_budget = connect_budget
        self.ssl = tls_context(ca, verify, cert)
        self.has_cert = cert is not None
        self.leader: str | None = None
        self.spread = spread
        self._home: str | None = None                     # spread: the node this client calls
        self._refused: dict[str, tuple[float, str]] = {}   # url -> (refusing since, why), monotonic
        self._last_contact = float("-inf")                # when a node last accepted a connection
        self._last_refusal = float("-inf")                # when one last refused (or never took) one
        self._http: aiohttp.ClientSession | None = None
        self._session: _Session | None = None
        self._connect_lock: asyncio.Lock | None = None
        self._next = 0
        self.stats = {"retries": 0, "redirects": 0, "sessions": 0}

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self):
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _headers(self, rid: str | None) -> dict:
        h = {"Content-Type": "application/json"}
        # To the leader itself: a follower answers 307. Spread: the node called serves the call
        # and forwards it, also where the node's [api] followers is "redirect".
        h["Raftq-Redirect"] = "0" if self.spread else "1"
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if rid is not None:
            h["Request-Id"] = rid
        return h

    def _http_session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.connections, ssl=self.ssl),
                                               json_serialize=lambda o: orjson.dumps(o).decode())
        return self._http

    # ------------------------------------------------------------------ reachability
    def _contact(self, url: str) -> None:
        self._refused.pop(url, None)
        self._last_contact = time.monotonic()

    def _note_failure(self, url: str | None, e: BaseException) -> None:
        why = not_accepted(e)
        if why is None:
            if url is not None:
                self._contact(url)      # it took the connection; the request may have reached it
            return
        self._last_refusal = time.monotonic()
        if url is not None and url not in self._refused:
            self._refused[url] = (self._last_refusal, why)

    def _quiet(self, started: float) -> float | None:
        """Since when no node has taken a connection while some refused, during this call; or None."""
        since = max(started, self._last_contact)
        return since if self._last_refusal > since else None

    def _quiet_long(self, since: float) -> bool:
        return time.monotonic() - since >= (self.connect_budget if self.connect_budget is not None else 3.0)

    def _unreachable(self, started: float, quiet: float, rid: str | None) -> Unreachable:
        now = time.monotonic()
        # Counted from this URL's first refusal, or from the last time any node took a connection
        # (it may have been back in between without us asking it).
        refused = {u: {"reason": why, "for_s": round(now - max(since, self._last_contact), 1)}
                   for u, (since, why) in self._refused.items()}
        sent = self._last_contact >= started
        outcome = ("the request may have reached a node before they went away: its outcome is unknown" if sent
                   else "nothing was sent")
        return Unreachable("unreachable", f"no node accepted a connection for {now - quiet:.1f}s "
                           f"({describe_refused(refused)}); {outcome}. Start the nodes (on this machine: "
                           "`raftq up`) or check the client's URLs", None,
                           {"refused": refused, "request_id": rid, "maybe_sent": sent})

    # ------------------------------------------------------------------ leader discovery
    async def _find_leader(self, timeout: float) -> str | None:
        http = self._http_session()
        order = self.urls[self._next:] + self.urls[:self._next]
        self._next = (self._next + 1) % len(self.urls)
        tls_failures, auth_refusals, answered = [], [], False
        for url in order:
            try:
                # Without the digest: it is O(state) on the node, and a fleet of new clients
                # asking for it at once stalled the leader's event loop for a second.
                t = min(timeout, self.connect_timeout)
                async with http.get(url + "/v1/cluster?digest=false", headers=self._headers(None),
                                    timeout=aiohttp.ClientTimeout(total=t, sock_connect=t)) as r:
                    self._contact(url)
                    if r.status in (400, 401) and r.headers.get("Raftq-Tls"):
                        tls_failures.append((url, _tls_refusal(r.status, await _json_or_none(r), r.headers)))
                        continue
                    if r.status in (401, 403):
                        # The keys are replicated state: a follower that has not yet applied a key
                        # added a moment ago refuses it while the leader knows it. Ask on; the
                        # refusal stands only if no node points at a leader.
                        raw = await r.read()
                        try:
                            why = orjson.loads(raw)["error"]["message"]
                        except (ValueError, KeyError, TypeError):
                            why = raw[:200].decode(errors="replace")
                        code = "unauthenticated" if r.status == 401 else "permission_denied"
                        auth_refusals.append((r.status, {"error": {"code": code, "message": f"{url}: {why}"}}))
                        continue
                    if r.status != 200:
                        continue
                    view = orjson.loads(await r.read())
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                tls = tls_problem(e, url)
                if tls is None and url.startswith("https://") and isinstance(
                        e, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)) and await self._drops_after_handshake(url):
                    tls = ("the node closes the connection right after the TLS handshake without answering: it does "
                           "not accept " + ("this client certificate (mTLS: give one signed by its tls_client_ca)"
                                            if self.has_cert else "clients without a certificate (mTLS: give cert=)"))
                if tls is not None:
                    tls_failures.append((url, tls))
                self._note_failure(url, e)
                continue
            answered = True
            members = {m["url"].rstrip("/") for m in view.get("members", []) if m.get("url")}
            for m in sorted(members):
                if m not in self.urls:
                    self.urls.append(m)
            if view.get("removed"):
                continue        # a node removed from the cluster (its members are those it left): no leader
            if view.get("leader"):
                if members:
                    # The membership in force, as a node that follows a leader sees it: a member
                    # that was removed is forgotten (unless the caller named it).
                    self.urls = [u for u in self.urls if u in members or u in self._given]
                    self._next %= len(self.urls)
                return view["leader"]["url"].rstrip("/")
        if auth_refusals and not answered:    # every node that answered refused the key
            raise error_from(*auth_refusals[0])
        if tls_failures and not answered:     # the rest refused connections or timed out
            raise _tls_error(tls_failures)
        return None

    async def _drops_after_handshake(self, url: str) -> bool:
        """Whether the node at `url` completes a TLS handshake and then closes the connection
        without answering `GET /healthz`, which every node answers: the way a node (or a proxy)
        that checks client certificates inside the handshake refuses one under TLS 1.3. Asked
        only after a request to an https URL ended in a disconnect."""
        from yarl import URL
        u = URL(url)
        ctx = self.ssl if isinstance(self.ssl, ssl.SSLContext) else ssl.create_default_context()
        t = self.connect_timeout
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(u.host, u.port, ssl=ctx), t)
        except (OSError, asyncio.TimeoutError, ssl.SSLError):
            return False
        try:
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: {u.host}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            return await asyncio.wait_for(reader.read(12), t) == b""
        except (ConnectionError, ssl.SSLError):
            return True
        except (OSError, asyncio.TimeoutError):
            return False
        finally:
            writer.close()

    async def _session_to(self, leader: str, timeout: float) -> _Session:
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            s = self._session
            if s is not None and not s.closed and s.url == leader:
                return s
            if s is not None:
                await s.close()
                self._session = None
            # Bounded: a paused (SIGSTOP) node accepts the TCP connection and never answers.
            ws = await asyncio.wait_for(self._http_session().ws_connect(
                leader + "/v1/session?batch=1", headers=self._headers(None), max_msg_size=0,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0), autoping=True, heartbeat=20.0),
                min(timeout, self.connect_timeout))
            # aiohttp follows a follower's 307 during the handshake by itself: remember where
            # the session really went, or the client keeps calling the follower the leader.
            resp = getattr(ws, "_response", None)
            final = str(resp.url.with_query(None)) if resp is not None and resp.history else ""
            if final.endswith("/v1/session") and final[:-len("/v1/session")] != leader:
                leader = self.leader = final[:-len("/v1/session")]
                self.stats["redirects"] += 1
            self._session = _Session(leader, ws)
            self.stats["sessions"] += 1
            return self._session

    # ------------------------------------------------------------------ the call loop
    async def call(self, op: str, method: str, path: str, body=None, *, mutating: bool,
                   request_id: str | None = None, timeout: float | None = None, leader_only: bool = True,
                   extra_wait: float = 0.0):
        """One API call with leader discovery, redirects and retries; returns the 200 body.
        Each attempt gets at most `attempt_timeout` (+ `extra_wait` for a long poll), so a
        paused or partitioned node costs one attempt, not the whole deadline."""
        loop = asyncio.get_running_loop()
        attempt_timeout = self.attempt_timeout + extra_wait
        deadline = loop.time() + (timeout if timeout is not None else self.timeout)
        started = time.monotonic()
        rid = request_id or (uuid.uuid4().hex if mutating else None)
        attempt = 0
        last: Exception | None = None
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._out_of_time(started, self._quiet(started), rid, last)
            target = None
            try:
                target = self._home_node() if self.spread else self.leader if leader_only else (
                    self.leader or self.urls[0])
                if target is None:
                    target = await self._discover_leader(remaining)
                if self.transport == "session" and op in SESSION_OPS and leader_only:
                    session = await self._open_session(target, remaining)
                    if session is None:
                        continue                # the handshake named the leader: call it now
                    status, out = await session.call(op, body, rid, min(remaining, attempt_timeout))
                else:
                    status, out = await self._http_call(method, target + path, body, rid,
                                                        min(remaining, attempt_timeout))
            except SessionLost as e:
                self.leader = e.leader_url.rstrip("/") if e.leader_url else None
                if e.sent:
                    self._contact(target)
                last = e
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, Unavailable) as e:
                tls = tls_problem(e, target)
                if tls is not None:
                    raise _tls_error([(target, tls)]) from e
                if not isinstance(e, Unavailable):
                    self._note_failure(target, e)
                    self._move_home(target)
                self.leader = None
                last = e
            else:
                self._contact(target)
                if status == 200:
                    return out
                if status == 307:
                    self.leader = (out.get("error", {}).get("leader_url") or "").rstrip("/") or None
                    self.stats["redirects"] += 1
                    continue
                err = error_from(status, out)
                if err.code not in RETRYABLE_CODES:
                    raise err
                if err.code == "no_leader":
                    self.leader = None
                last = err
            attempt += 1
            self.stats["retries"] += 1
            await asyncio.sleep(self._retry_pause(attempt, started, deadline, rid, last))

    def _home_node(self) -> str:
        """spread: the node this client sends to."""
        if self._home is None or self._home not in self.urls:
            self._home = random.choice(self.urls)
        return self._home

    def _move_home(self, failed: str | None) -> None:
        """spread: a node that failed a call is left for the next one."""
        if self.spread and failed is not None and failed == self._home and len(self.urls) > 1:
            i = self.urls.index(failed) if failed in self.urls else -1
            self._home = self.urls[(i + 1) % len(self.urls)]

    async def _discover_leader(self, remaining: float) -> str:
        """Ask the nodes who leads (remembered as self.leader); Unavailable when none knows."""
        asked = time.monotonic()
        target = self.leader = await self._find_leader(remaining)
        if target is None:
            raise Unavailable("no_leader", "no node knows a leader (election in progress, or nodes down)"
                              if self._last_contact >= asked else "no node answered")
        return target

    async def _open_session(self, target: str, remaining: float) -> _Session | None:
        """The session to `target`, or None when its handshake redirected to the leader (now
        self.leader); a refused handshake raises what the refusal means."""
        try:
            return await self._session_to(target, remaining)
        except aiohttp.WSServerHandshakeError as e:
            self._contact(target)
            refusal = _tls_refusal(e.status, None, e.headers) if e.headers else None
            if refusal is not None:
                raise _tls_error([(target, refusal)])
            if e.status == 307 and e.headers and e.headers.get("Leader-Url"):
                self.leader = e.headers["Leader-Url"].rstrip("/")
                self.stats["redirects"] += 1
                return None
            if e.status == 401:
                raise Unauthenticated("unauthenticated", "the session was refused: missing or unknown "
                                      "API key (give Client(api_key=...))", 401)
            if e.status == 403:
                raise PermissionDenied("permission_denied", "the session was refused: the API key's "
                                       "role is too low", 403)
            self.leader = None
            raise Unavailable("unavailable", f"session refused: {e.status}")

    def _retry_pause(self, attempt: int, started: float, deadline: float, rid: str | None,
                     last: Exception | None) -> float:
        """Seconds to wait before the next attempt (a jittered exponential back-off); raises what
        ends the call instead when the wait would pass the deadline or the connect budget."""
        pause = min(self.backoff_max, self.backoff_base * (2 ** min(attempt, 10))) * random.uniform(0.5, 1.0)
        quiet = self._quiet(started)
        if quiet is not None and self.connect_budget is not None:
            # No node has taken a connection for a while, only refusals: give up at the
            # budget (the last try lands on it), not at the deadline.
            left = self.connect_budget - (time.monotonic() - quiet)
            if left <= 0:
                raise self._unreachable(started, quiet, rid)
            pause = min(pause, left)
        if asyncio.get_running_loop().time() + pause >= deadline:
            raise self._out_of_time(started, quiet, rid, last)
        return pause

    def _out_of_time(self, started: float, quiet: float | None, rid: str | None, last: Exception | None) -> Exception:
        """What a call that ran out of time raises: Unreachable when no node took a connection
        (quiet since `quiet`), else Unavailable with the last error."""
        if quiet is not None and (self._last_contact < started or self._quiet_long(quiet)):
            return self._unreachable(started, quiet, rid)
        return Unavailable("unavailable", f"no answer within the call's deadline; last error: {last}",
                           None, {"request_id": rid})

    async def _http_call(self, method, url, body, rid, timeout):
        data = None if body is None else orjson.dumps(body)
        async with self._http_session().request(method, url, data=data, headers=self._headers(rid),
                                                allow_redirects=False,
                                                timeout=aiohttp.ClientTimeout(
                                                    total=timeout, sock_connect=min(timeout, self.connect_timeout))) as r:
            raw = await r.read()
            try:
                return r.status, orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                return r.status, {"error": {"code": "internal", "message": raw[:200].decode(errors="replace")}}

    # ------------------------------------------------------------------ jobs
    def _with_key(self, req: dict) -> dict:
        if self.auto_idempotency and "idempotency_key" not in req:
            req = {**req, "idempotency_key": auto_idempotency_key()}
        return req

    async def enqueue(self, queue: str, job_type: str, payload: bytes | str | None = None, *,
                      request_id: str | None = None, timeout: float | None = None, **fields) -> EnqueueResult:
        req = self._with_key(job_request(queue, job_type, payload, **fields))
        out = await self.call("enqueue", "POST", "/v1/jobs", req, mutating=True, request_id=request_id, timeout=timeout)
        return EnqueueResult(out["job_id"], out["deduplicated"], out.get("replaced", False))

    async def enqueue_request(self, req: dict, *, request_id: str | None = None,
                              timeout: float | None = None) -> EnqueueResult:
        out = await self.call("enqueue", "POST", "/v1/jobs", self._with_key(req), mutating=True,
                              request_id=request_id, timeout=timeout)
        return EnqueueResult(out["job_id"], out["deduplicated"], out.get("replaced", False))

    async def enqueue_batch(self, reqs: list[dict], *, request_id: str | None = None,
                            timeout: float | None = None) -> list:
        """Best effort: one EnqueueResult or Rejected per job, in order."""
        out = await self.call("enqueue_batch", "POST", "/v1/jobs/batch", {"jobs": [self._with_key(r) for r in reqs]},
                              mutating=True, request_id=request_id, timeout=timeout)
        return [EnqueueResult(r["job_id"], r["deduplicated"], r.get("replaced", False)) if "job_id" in r
                else Rejected("rejected", r["rejection"].get("reason", ""), 422, {"rejection": r["rejection"]})
                for r in out["results"]]

    async def enqueue_atomic(self, reqs: list[dict], *, request_id: str | None = None,
                             timeout: float | None = None) -> list[EnqueueResult]:
        """All or nothing; raises BatchRejected listing every failing job."""
        out = await self.call("enqueue_atomic", "POST", "/v1/jobs/atomic", {"jobs": [self._with_key(r) for r in reqs]},
                              mutating=True, request_id=request_id, timeout=timeout)
        return [EnqueueResult(r["job_id"], r["deduplicated"], r.get("replaced", False)) for r in out["results"]]

    async def chain(self, *reqs: dict, request_id: str | None = None, timeout: float | None = None) -> list[str]:
        """Enqueue jobs (job_request bodies) all or nothing, each depending on the one before
        (policy success: a dead letter fails the rest, cause dependency_failed); their ids."""
        jobs = []
        for i, r in enumerate(reqs):
            r = {**r, "ref": f"chain-{i}"}
            if i:
                r["depends_on"] = list(r.get("depends_on") or ()) + [{"ref": f"chain-{i - 1}"}]
            jobs.append(r)
        return [r.job_id for r in await self.enqueue_atomic(jobs, request_id=request_id, timeout=timeout)]

    async def reserve(self, queues, lease_ms: int, *, wait_ms: int = 0, max_jobs: int = 1,
                      worker_id: str | None = None, request_id: str | None = None) -> list[Job]:
        body = {"queues": [queues] if isinstance(queues, str) else list(queues), "lease_ms": int(lease_ms),
                "wait_ms": int(wait_ms), "max_jobs": int(max_jobs)}
        if worker_id:
            body["worker_id"] = worker_id
        out = await self.call("reserve", "POST", "/v1/reserve", body, mutating=True, request_id=request_id,
                              timeout=wait_ms / 1000.0 + self.timeout, extra_wait=wait_ms / 1000.0)
        return [Job.from_wire(j) for j in out["jobs"]]

    @staticmethod
    def _fence(job, attempt):
        if isinstance(job, Job):
            return job.id, job.attempt if attempt is None else attempt
        if attempt is None:
            raise ValueError("give a Job, or a job id and its attempt")
        return job, attempt

    async def ack(self, job, attempt: int | None = None, *, result: bytes | str | None = None,
                  encoding: str | None = None, request_id: str | None = None) -> None:
        """Ack; with `result` (bytes, or str sent as UTF-8), kept with the finished job when its
        queue retains results (`result_retention_ms`; docs/semantics.md "Job results")."""
        job_id, attempt = self._fence(job, attempt)
        body: dict[str, Any] = {"job_id": job_id, "attempt": attempt}
        if result is not None:
            body["result"] = result_field(result, encoding)
        await self.call("ack", "POST", f"/v1/jobs/{job_id}/ack", body, mutating=True, request_id=request_id)

    async def ack_batch(self, jobs, *, request_id: str | None = None) -> list[LeaseLost | None]:
        """Ack many jobs in one replicated command: None per success, LeaseLost per failure. Each
        item is a Job, (job_id, attempt), or (job or job_id, attempt or None, result[, encoding])."""
        acks = []
        for j in jobs:
            if isinstance(j, Job):
                acks.append({"job_id": j.id, "attempt": j.attempt})
                continue
            job_id, attempt = self._fence(j[0], j[1])
            ack = {"job_id": job_id, "attempt": attempt}
            if len(j) > 2 and j[2] is not None:
                ack["result"] = result_field(j[2], j[3] if len(j) > 3 else None)
            acks.append(ack)
        out = await self.call("ack_batch", "POST", "/v1/acks", {"acks": acks}, mutating=True, request_id=request_id)
        return [None if "error" not in r else LeaseLost(r["error"]["code"], r["error"].get("message", ""), None,
                                                         {"job_id": r["error"].get("job_id")})
                for r in out["results"]]

    async def nack(self, job, attempt: int | None = None, *, reason: str | None = None, retry: dict | None = None,
                   request_id: str | None = None) -> bool:
        """Returns True when the job was dead-lettered."""
        job_id, attempt = self._fence(job, attempt)
        body: dict[str, Any] = {"job_id": job_id, "attempt": attempt}
        if reason is not None:
            body["reason"] = reason
        if retry is not None:
            body["retry"] = retry
        out = await self.call("nack", "POST", f"/v1/jobs/{job_id}/nack", body, mutating=True, request_id=request_id)
        return out["dead_lettered"]

    async def release(self, job, attempt: int | None = None, *, delay_ms: int | None = None,
                      reason: str | None = None, request_id: str | None = None) -> None:
        """Hand the job back without using an attempt (POST /v1/jobs/{id}/release): ready at
        once in its place, or after `delay_ms`. This delivery's attempt is fenced off: a later
        ack, nack or extend of it is refused (LeaseLost)."""
        job_id, attempt = self._fence(job, attempt)
        body: dict[str, Any] = {"job_id": job_id, "attempt": attempt}
        if delay_ms:
            body["delay_ms"] = int(delay_ms)
        if reason is not None:
            body["reason"] = reason
        await self.call("release", "POST", f"/v1/jobs/{job_id}/release", body, mutating=True, request_id=request_id)

    async def extend(self, job, lease_ms: int, attempt: int | None = None, *,
                     request_id: str | None = None) -> int:
        """Returns the new (clamped) lease expiry and updates a Job's `lease_expires_at_ms`."""
        job_id, attempt = self._fence(job, attempt)
        out = await self.call("extend", "POST", f"/v1/jobs/{job_id}/extend",
                              {"job_id": job_id, "attempt": attempt, "lease_ms": int(lease_ms)},
                              mutating=True, request_id=request_id)
        if isinstance(job, Job):
            job.lease_expires_at_ms = out["lease_expires_at_ms"]
        return out["lease_expires_at_ms"]

    async def drain(self, queue: str | None = None, max_records: int = 1, *,
                    request_id: str | None = None) -> list[DeadLetterRecord]:
        """Destructive: the returned dead letters are deleted. Retried only with its request id,
        so a retry returns the same records."""
        body: dict[str, Any] = {"max": int(max_records)}
        if queue is not None:
            body["queue"] = queue
        out = await self.call("drain", "POST", "/v1/dead-letters/drain", body, mutating=True, request_id=request_id)
        return [DeadLetterRecord.from_wire(r) for r in out["records"]]

    # ------------------------------------------------------------------ operations
    async def server_info(self, url: str | None = None) -> dict:
        if url:
            return await self._get_from(url, "/v1/server-info")
        return await self.call("server_info", "GET", "/v1/server-info", mutating=False)

    async def cluster(self, url: str | None = None) -> dict:
        if url:
            return await self._get_from(url, "/v1/cluster")
        return await self.call("cluster", "GET", "/v1/cluster", mutating=False)

    async def _get_from(self, url: str, path: str) -> dict:
        status, out = await self._http_call("GET", url.rstrip("/") + path, None, None, self.connect_timeout)
        if status != 200:
            raise error_from(status, out)
        return out

    async def queues(self) -> list[dict]:
        return (await self.call("queues", "GET", "/v1/queues", mutating=False))["queues"]

    async def queue(self, name: str) -> dict:
        return await self.call("queue", "GET", f"/v1/queues/{name}", mutating=False)

    async def queue_jobs(self, name: str, state: str = "ready", limit: int = 50, cursor: str | None = None) -> dict:
        q = f"?state={state}&limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        out = await self.call("queue_jobs", "GET", f"/v1/queues/{name}/jobs{q}", mutating=False)
        return {"jobs": [Job.from_wire(j) for j in out["jobs"]], "next_cursor": out["next_cursor"]}

    async def queue_keys(self, queue: str, limit: int | None = None, cursor: str | None = None) -> dict:
        """A page of the queue's keys (GET /v1/queues/{name}/keys): {"keys": [{"key", "ready",
        "in_flight", "held", "concurrency", "weight", "rate", "in_window"}, ...], "next_cursor"},
        most ready jobs first; `limit` 1..100 (the server's default 50). Raises NotFound for a
        queue that neither exists nor is declared."""
        params = {} if limit is None else {"limit": int(limit)}
        if cursor:
            params["cursor"] = cursor
        q = ("?" + urlencode(params)) if params else ""
        return await self.call("queue_keys", "GET", f"/v1/queues/{quote(queue, safe='')}/keys{q}", mutating=False)

    async def job(self, job_id: str) -> Job:
        return Job.from_wire(await self.call("job", "GET", f"/v1/jobs/{job_id}", mutating=False))

    async def result(self, job_id: str, timeout: float = 30.0, *, poll_s: float = 20.0) -> JobResult:
        """Wait up to `timeout` seconds for the job to finish: its JobResult once it succeeded
        (while its queue retains it) or was dead-lettered. Long polls of up to `poll_s` each
        (GET /v1/jobs/{id}/result?wait_ms=) on the node this client calls, again on another
        after a failover. Raises TimeoutError when the job has not finished in time, NotFound
        for a job the cluster knows nothing of (never enqueued, acked in a queue that keeps no
        results, cancelled, past its retention)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            wait_s = max(0.0, min(poll_s, deadline - loop.time()))
            out = await self.call("job_result", "GET", f"/v1/jobs/{job_id}/result?wait_ms={int(wait_s * 1000)}",
                                  mutating=False, timeout=wait_s + self.timeout, extra_wait=wait_s)
            if out["state"] != "pending":
                return JobResult.from_wire(out)
            if loop.time() >= deadline:
                raise TimeoutError(f"job {job_id} has not finished within {timeout} s")

    async def cancel(self, job_id: str, *, cascade: bool = False, request_id: str | None = None) -> list[str] | None:
        """Delete a job (operator); one that jobs wait on raises Conflict (reason has_dependents)
        unless `cascade`, which cancels them too and returns their ids (docs/semantics.md
        "Dependencies"); None without it."""
        out = await self.call("cancel", "DELETE", f"/v1/jobs/{job_id}" + ("?cascade=true" if cascade else ""),
                              None, mutating=True, request_id=request_id)
        return out.get("cancelled", []) if cascade else None

    async def pause(self, queue: str, *, create: bool = False) -> None:
        """Pause a queue (reserve skips it). A queue that neither exists nor is declared is
        NotFound unless `create`."""
        await self.call("pause", "POST", f"/v1/queues/{queue}/pause", {"create": True} if create else {},
                        mutating=True)

    async def resume(self, queue: str, *, create: bool = False) -> None:
        await self.call("resume", "POST", f"/v1/queues/{queue}/resume", {"create": True} if create else {},
                        mutating=True)

    # ------------------------------------------------------------------ operator moves
    async def move_to_dead_letters(self, queue: str, ids: list[str], reason: str | None = None) -> dict:
        """Ready or scheduled jobs of `queue` become dead letters (cause admin): {"dead_lettered",
        "missing"}."""
        body: dict[str, Any] = {"ids": list(ids)}
        if reason is not None:
            body["reason"] = reason
        return await self.call("dead_letter_move", "POST", f"/v1/queues/{queue}/dead-letter", body, mutating=True)

    async def close_circuit(self, queue: str) -> dict:
        """Close `queue`'s circuit breaker now (operator): {"queue", "circuit", "was"}."""
        return await self.call("circuit_close", "POST", f"/v1/queues/{queue}/circuit/close", {}, mutating=True)

    async def purge(self, queue: str) -> int:
        """Remove every ready and scheduled job of `queue`; the number removed."""
        return (await self.call("purge", "POST", f"/v1/queues/{queue}/purge", {}, mutating=True))["purged"]

    async def delete_queue(self, queue: str) -> None:
        await self.call("queue_delete", "DELETE", f"/v1/queues/{queue}", None, mutating=True)

    # ------------------------------------------------------------------ configuration, keys, audit
    async def config(self) -> dict:
        """The configuration in force: {"version", "fingerprint", "config": {limits, storage, queues}}."""
        return await self.call("config", "GET", "/v1/config", mutating=False)

    async def put_config(self, config: dict, expect_version: int, keys: list[dict] | None = None) -> dict:
        """A whole new configuration, in force once committed: {"version", "warnings"}; Conflict
        when `expect_version` is not the version in force."""
        body: dict[str, Any] = {"config": config, "expect_version": expect_version}
        if keys is not None:
            body["keys"] = keys
        return await self.call("config_put", "PUT", "/v1/config", body, mutating=True)

    async def keys(self) -> list[dict]:
        return (await self.call("keys", "GET", "/v1/keys", mutating=False))["keys"]

    async def add_key(self, name: str, role: str, key_sha256: str) -> dict:
        return await self.call("key_add", "POST", "/v1/keys", {"name": name, "role": role, "key_sha256": key_sha256},
                               mutating=True)

    async def remove_key(self, name: str) -> dict:
        return await self.call("key_remove", "DELETE", f"/v1/keys/{name}", None, mutating=True)

    async def audit(self, limit: int = 50, cursor: str | None = None) -> dict:
        q = f"?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        return await self.call("audit", "GET", f"/v1/audit{q}", mutating=False)

    # ------------------------------------------------------------------ schedules
    async def put_schedule(self, name: str, job: dict, *, cron: str | None = None, time_zone: str | None = None,
                           every_ms: int | None = None, expect_version: int | None = None, **options) -> dict:
        """Create or replace schedule `name` (docs/api.md "Schedules"): `job` is the template
        ({queue, job_type, payload?, encoding?, priority?, ...}; a bytes or str payload is sent as
        base64 like `enqueue`'s), then `cron` (with `time_zone`) or `every_ms`; `options` are the
        other fields (catchup, overlap, start_at_ms, max_count, paused, ...). `expect_version`:
        0 creates only, n replaces version n only (Conflict otherwise). Returns {"name",
        "version", "created", "next_fire_at_ms"}."""
        job = dict(job)
        if isinstance(job.get("payload"), (bytes, str)):
            data = job["payload"].encode() if isinstance(job["payload"], str) else job["payload"]
            job["payload"] = {"data_b64": base64.b64encode(data).decode(),
                              "encoding": job.pop("encoding", "application/octet-stream")}
        body: dict[str, Any] = {"job": job, **options}
        for key, value in (("cron", cron), ("time_zone", time_zone), ("every_ms", every_ms),
                           ("expect_version", expect_version)):
            if value is not None:
                body[key] = value
        return await self.call("schedule_put", "PUT", f"/v1/schedules/{name}", body, mutating=True)

    async def schedule(self, name: str) -> dict:
        """One schedule: its definition, next fire, last tick, last job and its state, counts."""
        return await self.call("schedule", "GET", f"/v1/schedules/{name}", mutating=False)

    async def schedules(self, limit: int = 100, cursor: str | None = None) -> dict:
        """A page of schedules by name: {"schedules": [...], "next_cursor"}."""
        q = f"?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        return await self.call("schedules", "GET", f"/v1/schedules{q}", mutating=False)

    async def delete_schedule(self, name: str, *, expect_version: int | None = None) -> dict:
        q = f"?expect_version={expect_version}" if expect_version is not None else ""
        return await self.call("schedule_delete", "DELETE", f"/v1/schedules/{name}{q}", None, mutating=True)

    async def pause_schedule(self, name: str) -> dict:
        return await self.call("schedule_pause", "POST", f"/v1/schedules/{name}/pause", {}, mutating=True)

    async def resume_schedule(self, name: str) -> dict:
        """Resume: the next tick is the first after now (the paused ones are not caught up)."""
        return await self.call("schedule_resume", "POST", f"/v1/schedules/{name}/resume", {}, mutating=True)

    async def trigger_schedule(self, name: str) -> str:
        """An extra run of the schedule's job now (audited); its job id."""
        out = await self.call("schedule_trigger", "POST", f"/v1/schedules/{name}/trigger", {}, mutating=True)
        return out["job_id"]

    # ------------------------------------------------------------------ batches (docs/semantics.md "Batches")
    async def open_batch(self, jobs: list[dict] = (), *, on_complete: dict | None = None,
                         on_success: dict | None = None, on_failure: dict | None = None, open: bool = False,
                         timeout_ms: int | None = None, request_id: str | None = None) -> tuple[str, list[str]]:
        """A batch of `jobs` (job_request bodies, enqueued all or nothing) with its callback jobs
        (job_request bodies); open=True lets add_to_batch add more until close_batch (or
        timeout_ms). (batch id, the member job ids)."""
        body: dict[str, Any] = {"jobs": [self._with_key(r) for r in jobs], "open": open}
        callbacks = {k: v for k, v in (("on_complete", on_complete), ("on_success", on_success),
                                       ("on_failure", on_failure)) if v is not None}
        if callbacks:
            body["callbacks"] = callbacks
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        out = await self.call("open_batch", "POST", "/v1/batches", body, mutating=True, request_id=request_id)
        return out["batch_id"], [r["job_id"] for r in out["results"]]

    async def add_to_batch(self, batch_id: str, jobs: list[dict], *, request_id: str | None = None) -> list[str]:
        out = await self.call("add_to_batch", "POST", f"/v1/batches/{batch_id}/jobs",
                              {"jobs": [self._with_key(r) for r in jobs]}, mutating=True, request_id=request_id)
        return [r["job_id"] for r in out["results"]]

    async def close_batch(self, batch_id: str) -> None:
        await self.call("close_batch", "POST", f"/v1/batches/{batch_id}/close", {}, mutating=True)

    async def cancel_batch(self, batch_id: str) -> dict:
        """Remove the members that have not started and close the batch (operator): {"batch_id",
        "cancelled": [ids], "running": n}."""
        return await self.call("cancel_batch", "DELETE", f"/v1/batches/{batch_id}", None, mutating=True)

    async def batch(self, batch_id: str) -> dict:
        """The batch's status (GET /v1/batches/{id}): state, counts, pending_ids, callbacks."""
        return await self.call("batch", "GET", f"/v1/batches/{batch_id}", mutating=False)

    async def dead_letters(self, queue: str | None = None, limit: int = 50, cursor: str | None = None) -> dict:
        q = f"?limit={limit}" + (f"&queue={queue}" if queue else "") + (f"&cursor={cursor}" if cursor else "")
        out = await self.call("dead_letters", "GET", f"/v1/dead-letters{q}", mutating=False)
        return {"records": [DeadLetterRecord.from_wire(r) for r in out["records"]], "next_cursor": out["next_cursor"]}

    async def requeue(self, ids: list[str]) -> dict:
        return await self.call("requeue", "POST", "/v1/dead-letters/requeue", {"ids": list(ids)}, mutating=True)

    async def delete_dead_letters(self, ids: list[str]) -> dict:
        return await self.call("dldel", "POST", "/v1/dead-letters/delete", {"ids": list(ids)}, mutating=True)


class SyncClient:
    """A blocking facade for scripts: the same methods, run on a private event loop thread."""

    def __init__(self, urls, **kwargs):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="raftq-client", daemon=True)
        self._thread.start()
        self._client = self._run(self._make(urls, kwargs))

    @staticmethod
    async def _make(urls, kwargs):
        return Client(urls, **kwargs)

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if asyncio.iscoroutinefunction(attr):
            return lambda *a, **k: self._run(attr(*a, **k))
        return attr

    def close(self):
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
