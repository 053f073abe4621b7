"""The HTTP server's own bounds, below the routes: connections, deadlines, malformed requests, logs.

aiohttp keeps a connection that never finishes its request head for its keep-alive timeout (an
hour by default), takes any number of connections, logs a malformed request with a traceback
that quotes its raw header lines (API keys included) and answers it in plain text. Here:

* `GuardedRunner` serves the app with `GuardedServer`/`GuardedHandler`: at most
  `tuning.max_connections` connections (beyond it the idle one quiet the longest is closed to make room,
  and when none is idle the new connection is answered 503 `unavailable` and closed); a request
  head must be complete within `tuning.http_header_timeout_s` of its first byte (of the
  connection's start for the first request) or the connection is closed; an idle keep-alive
  connection is closed after `tuning.http_idle_timeout_s`, one whose client reads nothing of its
  answer after `tuning.http_write_stall_timeout_s`; a malformed request is answered 400
  in the API's JSON error shape and logged as one line, without its headers.
* On a node without API keys that listens on loopback only, a request whose Host header names
  no address of this node is refused (400): a web page cannot reach the keyless local cluster
  through DNS rebinding.
* `install_redaction` puts a filter on the log handlers that removes Authorization values,
  Bearer tokens and the configured API keys from every record (message and traceback).
"""
from __future__ import annotations

import logging
import re

import orjson
from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from ..base import bounds

log = logging.getLogger("raftq.http")
JSON = "application/json"


def _canned(status: int, reason: str, code: str, message: str, **details) -> bytes:
    body = orjson.dumps({"error": {"code": code, "message": message, **details}})
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {JSON}\r\nContent-Length: {len(body)}\r\n"
            "Retry-After: 1\r\nConnection: close\r\n\r\n").encode() + body


class GuardedHandler(RequestHandler):
    """aiohttp's connection handler with a header deadline, a connection cap and JSON errors."""

    def __init__(self, manager, **kwargs):
        super().__init__(manager, **kwargs)
        self._header_handle = None
        self._stall_handle = None           # armed while the transport's send buffer is full
        self._stall_left = 0                # its size when armed
        self._refused = False
        self._last_active = 0.0             # when the client last sent anything (evict_idle)

    # ------------------------------------------------------------------ the connection cap
    def connection_made(self, transport) -> None:
        server = self._manager
        if len(server._connections) >= server.max_connections and not server.evict_idle():
            self._refuse(transport)
            return
        super().connection_made(transport)
        self._last_active = self._loop.time()
        self._arm_header_timer(server.header_timeout_s)

    def _refuse(self, transport) -> None:
        """Answer 503 and close, without a handler: the connection never counts as one."""
        bounds.hit("max_connections")
        server = self._manager
        self._refused = True
        self._force_close = True            # data_received ignores what the client sends
        self.transport = transport
        transport.write(server.refusal)
        if server.refusing >= 256 or not transport.can_write_eof():
            transport.close()
            return
        # Half-close and read what the client sends for a moment before closing: closing a
        # socket with unread data resets it, and the client would see a reset instead of the 503.
        server.refusing += 1
        transport.write_eof()

        def done():
            server.refusing -= 1
            transport.close()
        self._loop.call_later(1.0, done)

    def connection_lost(self, exc) -> None:
        if self._refused:
            self.transport = None
            return
        self._cancel_header_timer()
        self._cancel_stall_timer()
        super().connection_lost(exc)

    # ------------------------------------------------------------------ the header deadline
    def _arm_header_timer(self, timeout: float) -> None:
        if self._header_handle is None and timeout > 0:
            self._header_handle = self._loop.call_later(timeout, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_handle is not None:
            self._header_handle.cancel()
            self._header_handle = None

    def _between_requests(self) -> bool:
        """No request head is waiting, none is being handled, the connection is not upgraded."""
        return not (self._messages or self._request_in_progress or self._upgraded
                    or self._payload_parser is not None)

    def data_received(self, data: bytes) -> None:
        self._last_active = self._loop.time()
        super().data_received(data)
        if not self._between_requests():
            if self._header_handle is not None:
                self._cancel_header_timer()
        elif data and self._header_handle is None:      # the first bytes of a request head
            self._arm_header_timer(self._manager.header_timeout_s)

    def _header_timeout(self) -> None:
        self._header_handle = None
        if self.transport is not None and not self._force_close and self._between_requests():
            bounds.hit("http_header_timeout_s")
            self.force_close()

    # ------------------------------------------------------------------ the write stall
    # asyncio pauses a protocol when its transport's send buffer passes the high-water mark
    # and resumes it once the buffer drained below the low one. A connection paused whose
    # buffer did not shrink at all in write_stall_s has a client that reads nothing, and every
    # handler writing to it waits in drain() with its answer (or a backup's child) held
    # meanwhile. One that shrank is a slow reader: the clock starts again.
    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm_stall_timer()

    def _arm_stall_timer(self) -> None:
        stall = self._manager.write_stall_s
        if self._stall_handle is None and stall > 0 and self.transport is not None:
            self._stall_left = self.transport.get_write_buffer_size()
            self._stall_handle = self._loop.call_later(stall, self._write_stalled)

    def resume_writing(self) -> None:
        self._cancel_stall_timer()
        super().resume_writing()

    def _cancel_stall_timer(self) -> None:
        if self._stall_handle is not None:
            self._stall_handle.cancel()
            self._stall_handle = None

    def _write_stalled(self) -> None:
        self._stall_handle = None
        if self.transport is None:
            return
        if self.transport.get_write_buffer_size() < self._stall_left:
            self._arm_stall_timer()         # some of it was taken
        else:
            bounds.hit("http_write_stall_timeout_s")
            log.info("closed a connection from %s: it read nothing of its answer for %s s "
                     "(tuning.http_write_stall_timeout_s)", self.transport.get_extra_info("peername"),
                     self._manager.write_stall_s)
            self.transport.abort()          # drain() waiters see the connection lost

    def _process_keepalive(self) -> None:
        closing = self._force_close
        super()._process_keepalive()
        if self._force_close and not closing:
            bounds.hit("http_idle_timeout_s")

    # ------------------------------------------------------------------ malformed requests
    def handle_error(self, request, status: int = 500, exc=None, message=None):
        """A request aiohttp could not parse (or, never expected, a handler that raised past its
        own guard): a JSON error, and one log line without the raw request."""
        if status == 500:
            log.error("unhandled error in %s %s: %s", request.method, request.path,
                      type(exc).__name__ if exc is not None else "?")
            code, text = "internal", "internal error (a bug): see the node's log"
        else:
            why = str(getattr(exc, "message", None) or message or "malformed request")
            why = re.split(r"[:\n'\"]", why, maxsplit=1)[0].strip()[:200] or "malformed request"
            _log_malformed(self._loop.time(), request.remote, why)
            code, status, text = "invalid_argument", 400, f"malformed HTTP request: {why}"
        resp = web.Response(status=status, content_type=JSON,
                            body=orjson.dumps({"error": {"code": code, "message": text}}))
        resp.force_close()
        return resp


_malformed = {"next": 0.0, "quiet": 0}


def _log_malformed(now: float, remote, why: str) -> None:
    """One line per malformed request, at most one a second (a flood of them must not flood the
    log); the lines left out are counted in the next one."""
    if now < _malformed["next"]:
        _malformed["quiet"] += 1
        return
    quiet, _malformed["quiet"], _malformed["next"] = _malformed["quiet"], 0, now + 1.0
    log.info("malformed HTTP request from %s: %s%s", remote, why,
             f" ({quiet} more since the last line)" if quiet else "")


class GuardedServer(web.Server):
    max_connections = 1000
    header_timeout_s = 10.0
    write_stall_s = 30.0

    def __call__(self) -> RequestHandler:
        return GuardedHandler(self, loop=self._loop, **self._kwargs)

    def evict_idle(self) -> bool:
        """Close the connection between requests (idle keep-alive, or a request head still
        arriving) whose client has been quiet the longest, to make room; False when every
        connection is busy. The longest quiet, not the oldest: a client that uses its keep-alive
        connection keeps it while connections that sent nothing for longer are there (the
        oldest connection is often the most useful one). Only at the bound: one pass over
        the connections."""
        quietest = None
        for handler in self._connections:
            if handler.transport is not None and not handler._force_close and handler._between_requests() \
                    and (quietest is None or handler._last_active < quietest._last_active):
                quietest = handler
        if quietest is None:
            return False
        bounds.hit("max_connections_evicted")
        quietest.force_close()
        return True


class GuardedRunner(web.AppRunner):
    """`web.AppRunner` serving with `GuardedServer`; `tuning` holds the bounds' values and
    `allowed_hosts` (None: any) the Host names this node answers to."""

    def __init__(self, app, *, tuning: dict, allowed_hosts=None, **kwargs):
        kwargs.setdefault("keepalive_timeout", float(tuning["http_idle_timeout_s"]))
        # A long poll whose client went away is cancelled at once (it leaves its wait list).
        kwargs.setdefault("handler_cancellation", True)
        # After an answer that closes the connection with the body unread (408, 413), aiohttp
        # reads and drops what the client still sends for lingering_time (10 s by default) so
        # that the client sees the answer rather than a reset; a slow sender kept it that long.
        kwargs.setdefault("lingering_time", 1.0)
        super().__init__(app, **kwargs)
        self._tuning = tuning
        self._allowed_hosts = allowed_hosts

    async def _make_server(self):
        server = await super()._make_server()
        server.__class__ = GuardedServer
        server.max_connections = int(self._tuning["max_connections"])
        server.header_timeout_s = float(self._tuning["http_header_timeout_s"])
        server.write_stall_s = float(self._tuning["http_write_stall_timeout_s"])
        server.refusing = 0
        server.refusal = _canned(503, "Service Unavailable", "unavailable",
                                 f"this node has {server.max_connections} connections open (tuning.max_connections); "
                                 "retry shortly or on another node", applied=False)
        if self._allowed_hosts is not None:
            server.request_handler = host_guard(server.request_handler, self._allowed_hosts)
        return server

    @property
    def connections(self) -> int:
        server = self.server
        return 0 if server is None else len(server._connections)


# ------------------------------------------------------------------------------ Host names
LOOPBACK_NAMES = frozenset(("localhost", "127.0.0.1", "::1"))


def host_name(host: str) -> str:
    """The name part of a Host header value: `[::1]:7001` -> `::1`, `a.b:80` -> `a.b`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def allowed_hosts(settings) -> frozenset | None:
    """The Host names a keyless node on loopback answers to (None: no check, a node with API
    keys or one listening beyond loopback, where proxies and names are the operator's)."""
    from urllib.parse import urlsplit
    from ..base.settings import is_loopback
    if settings.api_keys or not is_loopback(settings.http_host):
        return None
    names = set(LOOPBACK_NAMES) | {host_name(settings.http_host)}
    for url in [settings.url] + [p.url for p in settings.peers]:
        name = urlsplit(url).hostname
        if name:
            names.add(name.lower())
    return frozenset(names)


def host_guard(handler, names: frozenset):
    bad = (f"the Host header names no address of this node (a node without API keys on loopback answers only "
           f"requests addressed to {', '.join(sorted(names))}: a DNS-rebinding guard)")

    async def refuse(request):
        return web.Response(status=400, content_type=JSON,
                            body=orjson.dumps({"error": {"code": "invalid_argument", "message": bad}}))

    seen_ok: set = set()        # Host values already found allowed (a few per node: no parse per request)

    def guarded(request):       # a plain function: no coroutine layer on the hot path
        host = request.headers.get("Host")
        if host is not None and host not in seen_ok:
            name = host_name(host)
            if name not in names and not name.startswith("127."):
                return refuse(request)
            if len(seen_ok) < 64:
                seen_ok.add(host)
        return handler(request)
    return guarded


# ------------------------------------------------------------------------------ log redaction
_AUTH_VALUE = re.compile(r"(?i)(authorization['\"]?\s*[:=,]\s*['\"]?)([^\r\n'\"\\]*)")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s'\"\\,;]+")
REDACTED = "[redacted]"


def redact(text: str, keys=()) -> str:
    if not text:
        return text
    for key in keys:
        if key in text:
            text = text.replace(key, REDACTED)
    text = _AUTH_VALUE.sub(lambda m: m.group(1) + REDACTED, text)
    return _BEARER.sub(lambda m: m.group(1) + REDACTED, text)


class RedactingFilter(logging.Filter):
    """Removes Authorization values, Bearer tokens and the given keys from a record's message
    and traceback (a handler filter: it sees every record the handler writes)."""

    def __init__(self, keys=()):
        super().__init__()
        self.keys = tuple(sorted((k for k in keys if k), key=len, reverse=True))

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        clean = redact(message, self.keys)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.keys)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self.keys)
        return True


class AnsweredBodyErrorFilter(logging.Filter):
    """aiohttp, once a handler answered, reads what it left unread of the request's body
    ("lingering") and logs the body's stored error as "Unhandled exception", traceback and all.
    A body whose Content-Encoding does not decode was already answered 400 (`malformed HTTP
    request`, logged at INFO by raftq.http): such a record becomes one INFO line without the
    traceback, so a node's log keeps tracebacks for its own bugs (the fuzz tests check it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RequestPayloadError) and isinstance(exc.__cause__, ContentEncodingError):
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "the rest of an answered request's body was not read: %s", (
                str(exc).replace("\n", " "),)
        return True


def install_redaction(keys=()) -> RedactingFilter:
    """Filter every handler of the root logger (and aiohttp's and raftq's loggers, should they
    get handlers of their own)."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(g, AnsweredBodyErrorFilter) for g in server_log.filters):
        server_log.addFilter(AnsweredBodyErrorFilter())
    f = RedactingFilter(keys)
    for name in ("", "aiohttp", "aiohttp.server", "aiohttp.access", "aiohttp.web", "aiohttp.websocket", "raftq"):
        lg = logging.getLogger(name)
        lg.addFilter(f)
        for h in lg.handlers:
            h.addFilter(f)
    return f
