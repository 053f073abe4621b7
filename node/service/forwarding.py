"""NodeService's forwarding: a follower serves every call itself and sends what needs the leader
over one link (docs/api.md "Followers", docs/cluster.md "Design").

* The job operations (enqueue, reserve, ack, nack, extend, release, drain, their batches) go over
  `ForwardLink`: one session WebSocket to the leader (the protocol of docs/api.md "Session
  transport"), opened with the cluster's forward token (`Raftq-Forward`), each call a frame with
  its op, body, request id and the caller's Authorization (the leader checks the key and role
  itself). Every frame queued in one turn of the loop goes out as one message (a JSON array);
  answers come back by frame id. At most `tuning.max_forward_inflight` calls wait on the link
  (one more answers 429 `overloaded`).
* The other calls (operator writes, configuration, keys, members, reads of the leader's state)
  go as HTTP over a pooled connection to the leader (`forward_http`).
* Without a leader a call waits up to `tuning.forward_wait_s` and then answers 503 `unavailable`
  (not applied). A call sent to a leader that is lost before it answers is sent again to the next
  leader when it carries a request id (the leader's replay gives the first answer), else answered
  503 `unavailable` "retry with the same Request-Id": never a wrong answer.
* A reserve with `wait_ms` parks here, on the node the client is connected to (this node applies
  the same log, so its wake-ups say when a queue may have work), and each try is forwarded
  without a wait (`no_wait`).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging

import orjson

from ..base import bounds
from ..core.errors import error

log = logging.getLogger("raftq.forward")
FORWARD_HEADER = "Raftq-Forward"
REDIRECT_HEADER = "Raftq-Redirect"
FORWARD_WAIT_S = 5.0
MAX_FORWARD_INFLIGHT = 4096
MAX_MESSAGE_BYTES = 64 * 1024   # a message of frames (one frame alone may be larger: max_request_bytes)
_RETRY_S = 0.05
CONNECT_TIMEOUT_S = 2.0     # a paused leader takes the connection and never answers


def forward_token(secret: str | None) -> str:
    """What a follower's link shows the leader at the upgrade: an HMAC of the cluster secret."""
    return hmac.new((secret or "").encode(), b"raftq-forward-link", hashlib.sha256).hexdigest()


def _lost(rid) -> tuple[int, dict]:
    """A call the leader may have applied: the outcome is unknown (`applied: null`, docs/api.md;
    gRPC ABORTED, not UNAVAILABLE, which sepp-py retries even where a repeat is not harmless)."""
    if rid is None:
        return error("unavailable", "the leader was lost while this call was forwarded to it; it may have been "
                     "applied: send it again with a Request-Id to make a retry safe", applied=None)
    return error("unavailable", "the leader was lost while this call was forwarded to it; it may have been "
                 "applied: retry with the same Request-Id", applied=None)


def _no_leader(wait_s: float) -> tuple[int, dict]:
    return error("unavailable", f"no leader could be reached within tuning.forward_wait_s ({wait_s:g} s); "
                 "retry shortly", applied=False)


class ForwardLink:
    """A follower's one link to the leader: pending calls by frame id, [future, frame, sent at
    (None: not yet), made at]; frames not yet sent in `unsent`. One task connects and reads, one
    writes, one expires calls that waited too long."""

    def __init__(self, service):
        self.service = service
        self.loop = service.loop
        t = service.settings.tuning
        self.wait_s = float(t.get("forward_wait_s", FORWARD_WAIT_S))
        self.max_inflight = int(t.get("max_forward_inflight", MAX_FORWARD_INFLIGHT))
        self.timeout_s = float(t["request_timeout_s"]) + 1.0
        self.token = forward_token(service.settings.secret)
        self.pending: dict[int, list] = {}
        self.unsent: list[int] = []
        self.next_id = 0
        self.ws = None
        self.url: str | None = None
        self.wake = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.reader: asyncio.Task | None = None
        self.http = None
        self.sent = 0               # messages written (each a batch)
        self.forwarded = 0          # calls forwarded

    # ------------------------------------------------------------ calls
    def call(self, op: str, body, rid=None, auth=None, extra: dict | None = None) -> asyncio.Future:
        """Forward one call: a future of the leader's (status, body), or of the 429/503 here."""
        fut = self.loop.create_future()
        if len(self.pending) >= self.max_inflight:
            bounds.hit("max_forward_inflight")
            fut.set_result(error("overloaded", f"{self.max_inflight} calls are being forwarded from this node "
                                 "(tuning.max_forward_inflight); retry after a moment"))
            return fut
        self.next_id += 1
        i = self.next_id
        frame = {"id": i, "op": op, "body": body}
        if rid is not None:
            frame["request_id"] = rid
        if auth:
            frame["authorization"] = auth
        if extra:
            frame.update(extra)
        self.pending[i] = [fut, frame, None, self.loop.time()]
        self.unsent.append(i)
        self.forwarded += 1
        self.start()
        if self.ws is not None:
            self.wake.set()
        return fut

    def start(self):
        """The link's tasks, from the first forwarded call on (a cluster whose clients all call
        the leader has no link); again should one have ended (a failure that is a bug: calls would
        otherwise wait for a link that nothing opens)."""
        if not self.tasks or any(t.done() for t in self.tasks):
            for t in self.tasks:
                t.cancel()
            self.tasks = [self.loop.create_task(self._run()), self.loop.create_task(self._expire_loop())]

    def _answer(self, i: int, result) -> None:
        p = self.pending.pop(i, None)
        if p is not None and not p[0].done():
            p[0].set_result(result)

    def connected(self) -> bool:
        return self.ws is not None and not self.ws.closed

    def reachable(self) -> bool:
        """The leader takes this follower's link, or no call has needed it for a while: False
        while calls wait for a link that cannot be opened (/readyz)."""
        return self.connected() or not self.pending or self.loop.time() - min(
            p[3] for p in self.pending.values()) < 1.0

    # ------------------------------------------------------------ the link
    async def _run(self):
        while not self.service.stopping:
            try:
                await self._link_once()
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise                       # close(): the node stops
                log.warning("forward link: a connection attempt was cancelled; trying again")
                await asyncio.sleep(_RETRY_S)
            except Exception:                   # pragma: no cover: a bug; the link must live on
                log.exception("forward link failed")
                await asyncio.sleep(_RETRY_S)

    async def _link_once(self):
        """One link's life: wait for a leader, connect, send and read until it closes."""
        service = self.service
        url = service.leader_peer_url()
        if url is None or url == service.settings.url or service.is_leader():
            self._leading_or_none(url)
            await asyncio.sleep(_RETRY_S)
            return
        try:
            ws = await asyncio.wait_for(self._client().ws_connect(
                url + "/v1/session?batch=1", headers={FORWARD_HEADER: self.token}, heartbeat=5.0,
                max_msg_size=0, autoping=True), CONNECT_TIMEOUT_S)
        except Exception as e:
            log.debug("forward link to %s: %s", url, e)
            await asyncio.sleep(_RETRY_S)
            return
        log.info("forward link open to the leader at %s", url)
        self.ws, self.url = ws, url
        self.unsent = sorted(i for i, p in self.pending.items() if p[2] is None)
        writer = self.loop.create_task(self._writer(ws))
        self.reader = self.loop.create_task(self._reader(ws))
        self.wake.set()
        try:    # ends when the link closes, or _check_leader or a failed writer cancels the reader
            await asyncio.wait((self.reader,))
        finally:
            writer.cancel()
            self.ws = None
            self._link_lost()
            if not ws.closed:
                self.loop.create_task(ws.close())

    def _leading_or_none(self, url):
        """No link while this node leads (a call made meanwhile is answered 503, not applied)."""
        if url is not None and url == self.service.settings.url or self.service.is_leader():
            for i, p in list(self.pending.items()):
                if p[2] is None:
                    self._answer(i, _lost(p[1].get("request_id")) if len(p) > 4 else error(
                        "unavailable", "this node became the leader while the call waited to be forwarded; "
                        "retry", applied=False))

    async def _writer(self, ws):
        wake, pending, dumps = self.wake, self.pending, orjson.dumps
        try:
            while not ws.closed:
                await wake.wait()
                wake.clear()
                if not self.unsent:
                    continue
                ids, self.unsent = self.unsent, []
                now = self.loop.time()
                parts, size = [], 0
                for i in ids:
                    p = pending.get(i)
                    if p is not None and p[2] is None:
                        p[2] = now
                        data = dumps(p[1])
                        if parts and size + len(data) > MAX_MESSAGE_BYTES:     # under the leader's bound
                            await self._send(ws, parts)
                            parts, size = [], 0
                        parts.append(data)
                        size += len(data) + 1
                if parts:
                    await self._send(ws, parts)
        except (ConnectionError, RuntimeError):
            return                              # the link is closing: the reader ends with it
        except Exception:                       # a bug: end this link (calls left unsent would wait on it)
            log.exception("forward link to %s: writing failed", self.url)
            if self.reader is not None:
                self.reader.cancel()

    async def _send(self, ws, parts: list):
        await ws.send_bytes(b"[" + b",".join(parts) + b"]")
        self.sent += 1

    async def _reader(self, ws):
        try:
            await self._read(ws)
        except Exception:
            log.exception("forward link to %s: reading failed", self.url)

    async def _read(self, ws):
        import aiohttp
        answer = self._answer
        async for msg in ws:
            if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                break
            try:
                data = orjson.loads(msg.data)
            except orjson.JSONDecodeError:
                continue
            for a in data if isinstance(data, list) else (data,):
                if isinstance(a, dict) and a.get("id") is not None:
                    answer(a["id"], (a["status"], a["body"]))
        if ws.close_code not in (None, 1000):
            log.info("forward link to %s closed (%s %s)", self.url, ws.close_code, ws.exception() or "")

    def _link_lost(self):
        """The link closed: a call sent and not answered goes again with its request id (safe),
        else it is answered 503, "retry with the same Request-Id"."""
        for i, p in list(self.pending.items()):
            if p[2] is None:
                continue
            rid = p[1].get("request_id")
            if rid is None:
                self._answer(i, _lost(None))
            else:
                p[2] = None
                if len(p) == 4:
                    p.append(True)          # sent once: its expiry answers "retry with the same Request-Id"

    async def _expire_loop(self):
        while not self.service.stopping:
            await asyncio.sleep(0.1)
            try:
                self._expire()
            except Exception:                   # pragma: no cover
                log.exception("forward link: expiry failed")
        for i in list(self.pending):
            self._answer(i, error("no_leader", "this node is shutting down; retry on another node"))

    def _expire(self):
        """Calls that waited longer than their bound are answered 503; the link follows the leader."""
        self._check_leader()
        if not self.pending:
            return
        now = self.loop.time()
        for i, p in list(self.pending.items()):
            if p[2] is None and now - p[3] > self.wait_s:
                self._answer(i, _lost(p[1].get("request_id")) if len(p) > 4 else _no_leader(self.wait_s))
            elif p[2] is not None and now - p[2] > self.timeout_s:
                self._answer(i, _lost(p[1].get("request_id")))

    def _check_leader(self):
        """The link goes to the leader this node knows: another one known (or this node leading)
        closes it (its calls go again or are answered as _link_lost says). Calls still unsent on
        an open link wake the writer (a missed wake-up must not leave them until forward_wait_s)."""
        ws = self.ws
        if ws is None or ws.closed:
            return
        url = self.service.leader_peer_url()
        if url is not None and url != self.url or self.service.is_leader():
            log.info("forward link to %s closed: the leader is now %s", self.url, url)
            if self.reader is not None:
                self.reader.cancel()
        elif self.unsent:
            self.wake.set()

    def _client(self):
        """A pooled HTTP client to the leader (the link's WebSocket and forwarded HTTP)."""
        if self.http is None or self.http.closed:
            import aiohttp
            from ..base.tls import peer_context
            ctx = peer_context(self.service.settings.tls)
            self.http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=True if ctx is None else ctx, limit_per_host=64),
                timeout=aiohttp.ClientTimeout(total=None))
        return self.http

    async def close(self):
        """The node stops: every call still waiting is answered (503, or "retry with the same
        Request-Id" for one the leader may have applied)."""
        for t in self.tasks:
            t.cancel()
        for i, p in list(self.pending.items()):
            self._answer(i, _lost(p[1].get("request_id")) if p[2] is not None or len(p) > 4 else error(
                "no_leader", "this node is shutting down; retry on another node"))
        if self.ws is not None:
            await self.ws.close()
        if self.http is not None:
            await self.http.close()


class Forwarding:
    """Mixin of NodeService: a follower's forwarding (this module's docstring)."""

    def _init_forwarding(self):
        self.forwarder = ForwardLink(self)

    def must_forward(self) -> bool:
        """This node does not lead (a removed or stopping node answers for itself: 503)."""
        return not self.is_leader() and not self.stopping and not self.replica.removed

    def forward(self, op: str, body, rid=None, job_id=None, auth=None, extra=None) -> asyncio.Future:
        if job_id is not None:
            body = {**body, "job_id": job_id} if isinstance(body, dict) else body
        return self.forwarder.call(op, body, rid, auth, extra)

    async def forward_http(self, method: str, path_qs: str, raw: bytes | None, headers: dict):
        """One HTTP call sent to the leader as it came: (status, body bytes, content type). A
        read, or a write with a Request-Id, goes again to the next leader when the leader is lost
        meanwhile; a write without one answers 503 "retry with the same Request-Id"."""
        import aiohttp
        link = self.forwarder
        deadline = self.loop.time() + link.wait_s
        safe = method in ("GET", "HEAD") or "Request-Id" in headers
        while True:
            url = self.leader_peer_url()
            if self.stopping:
                return _json(error("no_leader", "this node is shutting down; retry on another node"))
            if url is None or url == self.settings.url:
                if self.loop.time() > deadline:
                    return _json(_no_leader(link.wait_s))
                await asyncio.sleep(_RETRY_S)
                continue
            try:
                async with link._client().request(
                        method, url + path_qs, data=raw, headers=headers, allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=link.timeout_s)) as r:
                    body = await r.read()
                    status, ctype = r.status, r.headers.get("Content-Type", "application/json")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                log.debug("forwarded %s %s to %s: %s", method, path_qs, url, e)
                if not safe or self.loop.time() > deadline:
                    return _json(_lost(headers.get("Request-Id")) if not safe else _no_leader(link.wait_s))
                await asyncio.sleep(_RETRY_S)
                continue
            if status == 307 or (status == 503 and b'"no_leader"' in body[:200]):
                if self.loop.time() <= deadline and (safe or status == 307):
                    await asyncio.sleep(_RETRY_S)
                    continue
            return status, body, ctype


def _json(result):
    status, body = result
    return status, orjson.dumps(body), "application/json"
