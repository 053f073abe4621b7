"""The HTTP/JSON API of docs/api.md over aiohttp: thin adapters around `NodeService`."""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from pathlib import Path
from urllib.parse import urlsplit

import orjson
from aiohttp import HttpVersion11, web
from aiohttp.web_protocol import RequestPayloadError

from ..base import bounds, validate
from ..base.auth import ADMIN, OPERATOR, VIEWER, WORKER, Auth
from ..replication.backup import Backups, Busy
from ..core.errors import error
from .metrics import CONTENT_TYPE, render as render_metrics
from ..replication.proposer import wall_ms
from ..service.forwarding import FORWARD_HEADER, REDIRECT_HEADER, auto_request_id
from ..service.node_service import NodeService
from ..service.results import ASKED_HEADER
from .session import Sessions
from ..base.settings import TUNING_DEFAULTS

log = logging.getLogger("raftq.http")
JSON = "application/json"


def respond(status: int, body: dict, headers: dict | None = None) -> web.Response:
    if status in (429, 503) and (headers is None or "Retry-After" not in headers):
        headers = {**(headers or {}), "Retry-After": "1"}
    elif status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="raftq"'}
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON, headers=headers)


def request_id(request: web.Request):
    rid = request.headers.get("Request-Id")
    if rid is None:
        return None
    if not validate.valid_request_id(rid) and not (auto_request_id(rid) and _from_a_follower(request)):
        raise ValueError("Request-Id must be 1..128 visible ASCII characters")
    return rid


def _from_a_follower(request: web.Request) -> bool:
    """A call a follower forwarded (its forward token shown): it may carry a request id the
    follower made (node/service/forwarding.py)."""
    token = request.headers.get(FORWARD_HEADER)
    return token is not None and hmac.compare_digest(token, request.app["service"].forwarder.token)


def _too_large(request: web.Request) -> web.Response:
    bounds.hit("max_request_bytes")
    limit = request.app["service"].limits.max_request_bytes
    return respond(*error("request_too_large", f"the request body is larger than max_request_bytes ({limit})",
                          limit=limit))


def _declared_json(request: web.Request) -> bool:
    """Content-Type says JSON. The exact header value every client sends is compared as it is;
    anything else (parameters, other case) goes through aiohttp's parse, which costs several µs
    a request on the hot path."""
    return request.headers.get("Content-Type") == JSON or request.content_type == JSON


async def read_json(request: web.Request, optional: bool = False):
    """The body as JSON; (None, response) on failure. A body must be declared JSON (415
    otherwise: a web page's form or text/plain POST is not a request of this API) and arrive
    within tuning.http_body_timeout_s (408, and the connection is closed)."""
    if request.body_exists and not _declared_json(request):
        return None, respond(*error("unsupported_media_type", "a request body must be JSON sent with "
                                    f"'Content-Type: application/json', got {request.content_type!r}"[:300]))
    try:
        if request.content.is_eof():            # all here already: the usual small request
            raw = await request.read()
        else:
            async with asyncio.timeout(request.app["body_timeout_s"]):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return None, _too_large(request)
    except RequestPayloadError as e:        # e.g. a Content-Encoding the body does not decode as
        why = str(e).replace("\n", " ").split("message:", 1)[-1].strip()[:200]
        resp = respond(*error("invalid_argument", f"the request body could not be read: {why}"))
        resp.force_close()
        return None, resp
    except TimeoutError:
        bounds.hit("http_body_timeout_s")
        resp = respond(*error("request_timeout", "the request body did not arrive within "
                              f"tuning.http_body_timeout_s ({request.app['body_timeout_s']} s)"))
        resp.force_close()
        return None, resp
    if not raw:
        if optional:
            return {}, None
        return None, respond(*error("invalid_argument", "a JSON object body is required"))
    try:
        return orjson.loads(raw), None
    except orjson.JSONDecodeError as e:
        return None, respond(*error("invalid_argument", f"the body is not valid JSON: {e}"))


def _name(req: web.Request) -> str:
    return req.match_info["name"]


def _auth(req: web.Request):
    return req.headers.get("Authorization")


def _id(req: web.Request) -> str:
    return req.match_info["id"]


# (path, the role it needs, handler(service, request, body, request id, caller's key name)):
# writes the leader answers, with a body, with an optional one, and PUTs; then reads the leader
# answers (handler(service, request)). A follower forwards them (node/service/forwarding.py):
# the job operations of SERVICE_FORWARDS through NodeService's link, the others as HTTP; with
# `Raftq-Redirect: 1` it answers 307 to the leader instead (so does a node whose `[api] followers`
# is "redirect", unless the call says `Raftq-Redirect: 0`).
LEADER_POST = [
    ("/v1/jobs", WORKER, lambda s, req, b, rid, who: s.enqueue(b, rid, who, _auth(req))),
    ("/v1/jobs/batch", WORKER, lambda s, req, b, rid, who: s.enqueue_batch(b, rid, who, _auth(req))),
    ("/v1/jobs/atomic", WORKER, lambda s, req, b, rid, who: s.enqueue_atomic(b, rid, who, _auth(req))),
    ("/v1/reserve", WORKER, lambda s, req, b, rid, who: s.reserve(b, rid, alive=_alive(req), who=who,
                                                                      auth=_auth(req))),
    ("/v1/acks", WORKER, lambda s, req, b, rid, who: s.ack_batch(b, rid, who, _auth(req))),
    ("/v1/jobs/{id}/ack", WORKER, lambda s, req, b, rid, who: s.ack(_id(req), b, rid, who, _auth(req))),
    ("/v1/jobs/{id}/nack", WORKER, lambda s, req, b, rid, who: s.nack(_id(req), b, rid, who, _auth(req))),
    ("/v1/jobs/{id}/extend", WORKER, lambda s, req, b, rid, who: s.extend(_id(req), b, rid, who, _auth(req))),
    ("/v1/jobs/{id}/release", WORKER, lambda s, req, b, rid, who: s.release(_id(req), b, rid, who, _auth(req))),
    ("/v1/dead-letters/requeue", OPERATOR, lambda s, req, b, rid, who: s.requeue(b, rid, who)),
    ("/v1/dead-letters/delete", OPERATOR, lambda s, req, b, rid, who: s.delete_dead_letters(b, rid, who)),
    ("/v1/queues/{name}/dead-letter", OPERATOR,
     lambda s, req, b, rid, who: s.move_to_dead_letters(_name(req), b, rid, who)),
    ("/v1/keys", ADMIN, lambda s, req, b, rid, who: s.add_key(b, rid, who)),
    ("/v1/batches", WORKER, lambda s, req, b, rid, who: s.open_batch(b, rid, who)),
    ("/v1/batches/{id}/jobs", WORKER, lambda s, req, b, rid, who: s.add_to_batch(_id(req), b, rid, who)),
    ("/v1/cluster/members", ADMIN, lambda s, req, b, rid, who: s.add_member(b, rid, who)),
]
OPTIONAL_BODY = [
    ("POST", "/v1/dead-letters/drain", OPERATOR, lambda s, req, b, rid, who: s.drain(b, rid, who, _auth(req))),
    ("POST", "/v1/queues/{name}/pause", OPERATOR, lambda s, req, b, rid, who: s.pause(_name(req), True, rid, b, who)),
    ("POST", "/v1/queues/{name}/resume", OPERATOR,
     lambda s, req, b, rid, who: s.pause(_name(req), False, rid, b, who)),
    ("POST", "/v1/queues/{name}/purge", OPERATOR, lambda s, req, b, rid, who: s.purge(_name(req), b, rid, who)),
    ("POST", "/v1/queues/{name}/circuit/close", OPERATOR,
     lambda s, req, b, rid, who: s.close_circuit(_name(req), b, rid, who)),
    ("DELETE", "/v1/jobs/{id}", OPERATOR,
     lambda s, req, b, rid, who: s.cancel(req.match_info["id"], rid, who, req.query.get("cascade"))),
    ("DELETE", "/v1/batches/{id}", OPERATOR, lambda s, req, b, rid, who: s.cancel_batch(_id(req), rid, who)),
    ("DELETE", "/v1/queues/{name}", ADMIN, lambda s, req, b, rid, who: s.delete_queue(_name(req), rid, who)),
    ("DELETE", "/v1/keys/{name}", ADMIN, lambda s, req, b, rid, who: s.remove_key(_name(req), rid, who)),
    ("POST", "/v1/schedules/{name}/pause", OPERATOR,
     lambda s, req, b, rid, who: s.pause_schedule(_name(req), True, b, rid, who)),
    ("POST", "/v1/schedules/{name}/resume", OPERATOR,
     lambda s, req, b, rid, who: s.pause_schedule(_name(req), False, b, rid, who)),
    ("POST", "/v1/batches/{id}/close", WORKER, lambda s, req, b, rid, who: s.close_batch(_id(req), b, rid, who)),
    ("POST", "/v1/schedules/{name}/trigger", OPERATOR,
     lambda s, req, b, rid, who: s.trigger_schedule(_name(req), b, rid, who)),
    ("DELETE", "/v1/schedules/{name}", OPERATOR,
     lambda s, req, b, rid, who: s.delete_schedule(_name(req), req.query, rid, who)),
    ("DELETE", "/v1/cluster/members/{id}", ADMIN,
     lambda s, req, b, rid, who: s.remove_member(req.match_info["id"], rid, who,
                                                 req.headers.get("Authorization"))),
]
LEADER_PUT = [
    ("/v1/config", ADMIN, lambda s, req, b, rid, who: s.put_config(b, rid, who)),
    ("/v1/schedules/{name}", OPERATOR, lambda s, req, b, rid, who: s.put_schedule(_name(req), b, rid, who)),
]
LEADER_GET = [
    ("/v1/queues", VIEWER, lambda s, req: s.queues()),
    ("/v1/queues/{name}", VIEWER, lambda s, req: s.queue(req.match_info["name"])),
    ("/v1/queues/{name}/jobs", VIEWER, lambda s, req: s.queue_jobs(req.match_info["name"], req.query)),
    ("/v1/queues/{name}/keys", VIEWER, lambda s, req: s.queue_keys(req.match_info["name"], req.query)),
    ("/v1/jobs/{id}", VIEWER, lambda s, req: s.job(req.match_info["id"])),
    ("/v1/batches/{id}", VIEWER, lambda s, req: s.batch(req.match_info["id"])),
    ("/v1/dead-letters", VIEWER, lambda s, req: s.dead_letters(req.query)),
    ("/v1/config", VIEWER, lambda s, req: s.config()),
    ("/v1/keys", ADMIN, lambda s, req: s.keys()),
    ("/v1/audit", OPERATOR, lambda s, req: s.audit(req.query)),
    ("/v1/schedules", VIEWER, lambda s, req: s.schedules(req.query)),
    ("/v1/schedules/{name}", VIEWER, lambda s, req: s.schedule(req.match_info["name"])),
]


# The routes whose NodeService method forwards itself on a follower (over the forward link).
SERVICE_FORWARDS = frozenset(("/v1/jobs", "/v1/jobs/batch", "/v1/jobs/atomic", "/v1/reserve", "/v1/acks",
                              "/v1/jobs/{id}/ack", "/v1/jobs/{id}/nack", "/v1/jobs/{id}/extend",
                              "/v1/jobs/{id}/release", "/v1/dead-letters/drain"))
FORWARD = web.Response(status=599)      # a marker: this follower forwards the request


def build_app(service: NodeService) -> web.Application:
    # No middleware: aiohttp wraps every request in each one (two extra coroutine layers on
    # the hot path). Each handler catches its own errors (inline or `_guarded`), and a catch-all route
    # answers unknown paths and methods in the API's JSON error shape.
    # The body bound follows the configuration in force (max_request_bytes): aiohttp reads it
    # from the application for each request it makes.
    app = web.Application(client_max_size=service.limits.max_request_bytes)
    app["service"] = service
    tuning = getattr(service.settings, "tuning", None) or TUNING_DEFAULTS
    app["body_timeout_s"] = float(tuning["http_body_timeout_s"])
    # [api] followers = "redirect": a follower answers 307 unless the caller asks to be forwarded
    app["followers_redirect"] = getattr(service.settings, "followers", "forward") == "redirect"

    def follow_limits(limits):
        app._client_max_size = limits.max_request_bytes
    service.config_hooks.append(follow_limits)
    auth = service.auth
    sessions = Sessions(service)
    app["sessions"] = sessions
    service.leadership_lost_hooks.append(sessions.close_all)
    routes = [("POST", path, _leader_write(fn, auth, role, path=path)) for path, role, fn in LEADER_POST]
    routes += [(method, path, _leader_write(fn, auth, role, optional=True, path=path))
               for method, path, role, fn in OPTIONAL_BODY]
    routes += [("PUT", path, _leader_write(fn, auth, role, path=path)) for path, role, fn in LEADER_PUT]
    routes += [("GET", path, _leader_read(fn, auth, role)) for path, role, fn in LEADER_GET]
    # The hot handlers above guard themselves inline (one coroutine layer less per request).
    routes += [("GET", path, _guarded(handler)) for path, handler in (
        ("/v1/session", _session_route(service, sessions)),
        ("/v1/server-info", _authorized(auth, VIEWER, _any(lambda s: s.server_info()))),
        ("/v1/cluster", _authorized(auth, VIEWER, _cluster_route(service))),
        ("/v1/cluster/nodes", _authorized(auth, VIEWER, _cluster_nodes_route(service))),
        ("/metrics", _authorized(auth, VIEWER, _metrics_route(app, service, sessions))),
        ("/v1/openapi.json", _authorized(auth, VIEWER, _openapi)),
        ("/v1/backup", _authorized(auth, ADMIN, _backup_route(service))),
        ("/v1/jobs/{id}/result", _authorized(auth, VIEWER, _job_result_route(service))),
        ("/healthz", _healthz), ("/readyz", _readyz), ("/", _admin_page(service)))]
    r = app.router
    for method, path, handler in routes:
        if method == "GET":
            r.add_get(path, handler, expect_handler=_expect)    # and HEAD, as aiohttp does by default
        else:
            r.add_route(method, path, handler, expect_handler=_expect)
    # Every path, a percent-encoded newline in it included (`.*` stops at one: aiohttp's plain 404).
    r.add_route("*", r"/{tail:[\s\S]*}", _guarded(_fallback(list(r.resources()), auth)), expect_handler=_expect)
    return app


def _session_route(service: NodeService, sessions: Sessions):
    """GET /v1/session: the WebSocket upgrade, checked before the session takes it."""
    auth = service.auth

    async def session(request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization")
        link = request.headers.get(FORWARD_HEADER)
        if link is not None:            # a follower's forward link: to the leader only
            if not hmac.compare_digest(link, service.forwarder.token):
                return respond(*error("unauthenticated", "the forward token is not this cluster's"))
            if not service.is_leader():
                return respond(*error("unavailable", "this node is not the leader", applied=False))
            return await sessions.handle(request, None, forwarder=True)
        if auth.enabled:                # at the upgrade; then each frame against the set in force
            _, refused = auth.who(header)
            if refused is not None:
                return respond(*refused)
        if not web.WebSocketResponse().can_prepare(request).ok:
            return respond(*error("invalid_argument", "GET /v1/session is the session WebSocket: send a "
                                  "WebSocket upgrade (Connection: Upgrade, Upgrade: websocket)"))
        origin = request.headers.get("Origin")
        if origin is not None and not _same_origin(origin, request.headers.get("Host")):
            # A web page may open a WebSocket to any site (no CORS): only this node's own may.
            return respond(*error("permission_denied", f"a session from another origin ({origin[:100]}) is refused"))
        redirect = _not_leader(service, request)
        if redirect is not None and redirect is not FORWARD:
            return redirect
        return await sessions.handle(request, header)
    return session


def _metrics_route(app: web.Application, service: NodeService, sessions: Sessions):
    """GET /metrics: the Prometheus text (node/api/metrics.py)."""
    async def metrics(request: web.Request) -> web.Response:
        _, view = service.cluster(False)
        _, queues = service.queues()
        runner = app.get("runner")
        gauges = {"connections": getattr(runner, "connections", None), "sessions": len(sessions.open),
                  "parked_reserves": service.parked, "parked_reserve_queues": len(service.waiters)}
        refusals = service.replica.raft_refusals
        gauges["raft_pending_handshakes"] = refusals.get("pending", 0)
        text = render_metrics(view, queues["queues"], service.proposer.inflight, gauges, bounds.all_hits(refusals),
                              refusals, service.forwarder.figures())
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})
    return metrics


def _cluster_route(service: NodeService):
    async def cluster(request: web.Request) -> web.Response:
        if request.query.get("digest", "true").lower() in ("false", "0", "no"):
            return respond(*service.cluster(False))
        return respond(*await service.cluster_with_digest())
    return cluster


def _backup_route(service: NodeService):
    """GET /v1/backup: this node's applied state as a backup stream (docs/operations.md)."""
    backups = Backups(service)

    async def backup_handler(request: web.Request) -> web.StreamResponse:
        # Any node answers with its own applied state (a follower's is a committed prefix), so
        # `raftq backup` takes it from a follower and the leader is not loaded at all.
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})

        async def start(header: bytes, index: int, term: int):
            resp.headers["Content-Disposition"] = f'attachment; filename="raftq-{index}.backup"'
            resp.headers["Raftq-Backup-Index"], resp.headers["Raftq-Backup-Term"] = str(index), str(term)
            await resp.prepare(request)
            await resp.write(header)
        try:
            async with contextlib.aclosing(backups.stream(service.loop, wall_ms(), start)) as chunks:
                async for chunk in chunks:      # aclosing: a cut stream cleans up now, not at GC
                    await resp.write(chunk)     # a client that reads none: guard.py's write stall
            await resp.write_eof()      # inside: a client gone before the last chunk is no bug
        except Busy:
            return respond(*error("overloaded", "a backup is already being taken on this node; retry when it is done"))
        except OSError as e:
            if resp.prepared:       # the client went away, or the child failed: the stream is cut
                log.warning("backup stream ended early: %s", e)
                return resp
            log.error("backup failed: %s", e)
            return respond(*error("unavailable", f"the backup could not be taken on this node: {e}"))
        return resp
    return backup_handler


def _job_result_route(service: NodeService):
    """GET /v1/jobs/{id}/result?wait_ms=: served by any node, waiting on its own applied state
    (node/service/results.py); never a 307."""
    async def job_result(request: web.Request) -> web.Response:
        if service.stopping:
            return respond(*error("no_leader", "this node is shutting down; retry on another node"))
        if service.replica.removed:
            return respond(*error("unavailable", service.removed_reason(), removed=True))
        return respond(*await service.job_result(request.match_info["id"], request.query, _auth(request),
                                                 _alive(request), request.headers.get(ASKED_HEADER) == "1"))
    return job_result


def _cluster_nodes_route(service: NodeService):
    auth = service.auth

    async def cluster_nodes(request: web.Request) -> web.Response:
        return respond(*await service.cluster_nodes(request.headers.get("Authorization") if auth.enabled else None))
    return cluster_nodes


async def _expect(request: web.Request) -> None:
    """`Expect: 100-continue` is answered as aiohttp does; any other expectation is ignored (RFC
    9110 allows either). aiohttp's own handler answered it 417 in plain text, and 500 for a value
    it could not write back into that text (a value with the byte 0x80)."""
    if request.version == HttpVersion11 and request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0          # (as aiohttp does: the body has not started)


def _same_origin(origin: str, host: str | None) -> bool:
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return False
    return bool(host) and bool(netloc) and netloc.lower() == host.strip().lower()


def _fallback(resources, auth: Auth):
    """Unknown path: 404 not_found; known path, other method: 405 method_not_allowed with
    `Allow`, both in the API's JSON error shape. Under /v1/ only for a caller with a key:
    every /v1/ request needs one."""
    async def handler(request: web.Request) -> web.Response:
        if auth.enabled and request.path.startswith("/v1/") and \
                (refused := _refusal(auth, request, VIEWER)) is not None:
            return refused
        allowed = set()
        for res in resources:
            _, methods = await res.resolve(request)
            if methods:
                allowed |= methods
        if allowed:
            allow = ", ".join(sorted(allowed))
            return respond(*error("method_not_allowed", f"method {request.method[:20]} not allowed on "
                                  f"{request.path[:200]}; allowed: {allow}"), headers={"Allow": allow})
        return respond(*error("not_found", f"no route for {request.method[:20]} {request.path[:200]}"))
    return handler


def _alive(request: web.Request):
    def alive() -> bool:
        t = request.transport
        return t is not None and not t.is_closing()
    return alive


def _not_leader(service: NodeService, request: web.Request) -> web.Response | None:
    """None when this node should serve a leader-only request, FORWARD when it forwards it (a
    follower), else the redirect or 503. The redirect is asked for with `Raftq-Redirect: 1`,
    forwarding with `0`; without either (or another value) `[api] followers` decides."""
    if service.stopping:
        return respond(*error("no_leader", "this node is shutting down; retry on another node"))
    if service.replica.removed:
        return respond(*error("unavailable", service.removed_reason(), removed=True))
    if service.is_leader():
        return None
    ask = request.headers.get(REDIRECT_HEADER)
    if ask == "0" or (ask != "1" and not request.app["followers_redirect"]):
        return FORWARD
    url = service.leader_url()
    if url is None or url == service.settings.url:
        return respond(*error("no_leader", "no leader is known right now (election in progress?); retry shortly"))
    body = {"error": {"code": "not_leader", "message": f"this node is a follower; the leader is {url}",
                      "leader_url": url}}
    return web.Response(body=orjson.dumps(body), status=307, content_type=JSON,
                        headers={"Location": url + request.path_qs, "Leader-Url": url})


async def _forward_http(service: NodeService, request: web.Request) -> web.Response:
    """A follower sends the request to the leader as it came and answers with the leader's
    answer (node/service/forwarding.py forward_http)."""
    try:
        raw = await request.read() if request.body_exists else None
    except web.HTTPRequestEntityTooLarge:
        return _too_large(request)
    headers = {k: v for k in ("Authorization", "Request-Id", "Content-Type") if (v := request.headers.get(k))}
    headers[REDIRECT_HEADER] = "1"      # a node that no longer leads answers 307: sent again, no chain
    status, body, ctype = await service.forward_http(request.method, request.path_qs, raw, headers)
    extra = {"Retry-After": "1"} if status in (429, 503) else None
    return web.Response(body=body, status=status, headers={"Content-Type": ctype, **(extra or {})})


def _leader_write(fn, auth: Auth, need: int, optional: bool = False, path: str = ""):
    forwards_itself = path in SERVICE_FORWARDS

    async def handler(request: web.Request) -> web.Response:
        who = None
        if auth.enabled:
            found, refused = auth.who(request.headers.get("Authorization"))
            if found is None:
                return respond(*refused)
            denied = auth.permits(found, need)
            if denied is not None:
                return respond(*denied)
            who = found[0]
        service: NodeService = request.app["service"]
        redirect = _not_leader(service, request)
        if redirect is not None:
            if redirect is not FORWARD:
                return redirect
            if not forwards_itself:
                return await _forward_http(service, request)
        if not service.seeded and not service.is_seeded():
            return respond(*service.not_seeded())
        try:
            rid = request_id(request)
        except ValueError as e:
            return respond(*error("invalid_argument", str(e)))
        try:
            body, err = await read_json(request, optional=optional)
            if err is not None:
                return err
            status, out = await fn(service, request, body, rid, who)
        except Exception as exc:
            return _failure(request, exc)
        if status == 307:       # (the leader handed leadership over: removing itself)
            url = out["error"]["leader_url"]
            return respond(status, out, headers={"Location": url + request.path_qs, "Leader-Url": url})
        return respond(status, out)
    return handler


def _leader_read(fn, auth: Auth, need: int):
    async def handler(request: web.Request) -> web.Response:
        if auth.enabled and (refused := _refusal(auth, request, need)) is not None:
            return refused
        service: NodeService = request.app["service"]
        redirect = _not_leader(service, request)
        if redirect is not None:
            return redirect if redirect is not FORWARD else await _forward_http(service, request)
        try:
            return respond(*fn(service, request))
        except Exception as exc:
            return _failure(request, exc)
    return handler


def _authorized(auth: Auth, need: int, handler):
    # Auth can go on or off with the configuration in force: checked per request.
    async def authorized(request: web.Request) -> web.StreamResponse:
        if auth.enabled and (refused := _refusal(auth, request, need)) is not None:
            return refused
        return await handler(request)
    return authorized


def _refusal(auth: Auth, request: web.Request, need: int) -> web.Response | None:
    """The 401/403 answer for a caller whose key may not do what needs role level `need`."""
    denied = auth.check(request.headers.get("Authorization"), need)
    return None if denied is None else respond(*denied)


def _any(fn):
    async def handler(request: web.Request) -> web.Response:
        return respond(*fn(request.app["service"]))
    return handler


_ADMIN_PAGE: bytes | None = None


def _origin(url: str) -> str:
    from urllib.parse import urlsplit
    u = urlsplit(url)
    return f"{u.scheme}://{u.netloc}"


def _admin_page(service: NodeService):
    """The admin UI: one static page that calls this node's /v1 API from the browser (with the
    key the user types in, when keys are on), so it needs no key itself. Its policy lets it
    call only this node, plus a bodiless probe of the other nodes' /healthz: how the page finds
    a live node to move to when this one dies."""
    csp = None

    async def page(request: web.Request) -> web.Response:
        global _ADMIN_PAGE
        nonlocal csp
        if _ADMIN_PAGE is None:
            _ADMIN_PAGE = (Path(__file__).parent / "admin.html").read_bytes()
        if csp is None:             # at the first request: building the app needs no peers
            peers = " ".join(sorted({_origin(p.url) for p in service.settings.others + service.others()}))
            csp = (f"default-src 'self'; connect-src 'self' {peers}; script-src 'self' 'unsafe-inline'; "
                   "style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'self'; "
                   "frame-ancestors 'none'")
        return web.Response(body=_ADMIN_PAGE, content_type="text/html", charset="utf-8",
                            headers={"Content-Security-Policy": csp, "Cache-Control": "no-cache",
                                     "Referrer-Policy": "no-referrer"})
    return page


_OPENAPI: bytes | None = None


async def _openapi(request: web.Request) -> web.Response:
    """This API's OpenAPI 3.1 document (node/api/openapi.py; the same as docs/openapi.json)."""
    global _OPENAPI
    if _OPENAPI is None:
        from .openapi import document_bytes
        _OPENAPI = document_bytes()
    return web.Response(body=_OPENAPI, content_type=JSON)


async def _healthz(request: web.Request) -> web.Response:
    return respond(200, {"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    service: NodeService = request.app["service"]
    if service.ready() and not service.stopping:
        return respond(200, {"status": "ready", "leader": service.leader_url()})
    return respond(503, {"status": "not_ready", "leader": service.leader_url()})


def _guarded(handler):
    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except Exception as exc:
            return _failure(request, exc)
    return guarded


def _failure(request: web.Request, exc: Exception) -> web.StreamResponse:
    """A bug in a handler answers 500 `internal` in the API's shape (and is logged), never a
    bare aiohttp error page; a 413 from the body reader answers request_too_large."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return _too_large(request)
    if isinstance(exc, web.HTTPException):
        raise exc
    if isinstance(exc, ConnectionError) and (request.transport is None or request.transport.is_closing()):
        # The client hung up while its answer was being written (aiohttp's "Cannot write to
        # closing transport"): nobody to answer, and no bug. aiohttp drops what is returned.
        log.debug("%s %s: the client left before its answer was written: %s", request.method, request.path, exc)
        return respond(*error("unavailable", "the connection closed before the answer was written"))
    log.exception("unhandled error in %s %s", request.method, request.path, exc_info=exc)
    return respond(*error("internal", "internal error (a bug): see the node's log"))
