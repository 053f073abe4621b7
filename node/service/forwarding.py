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
* Every forwarded write has a request id: the caller's, else one this node makes
  (`auto_request_id`: node id, a random incarnation, a counter, with spaces, so that no client's
  id can be one). A call the leader is lost with (the link closes, or the leader answers that it
  stopped leading or that the outcome is unknown) is sent again to the next leader, whose
  request-id replay gives the first answer should the first leader have applied it.
* Without a leader a call waits up to `tuning.forward_wait_s` and then answers 503 `unavailable`
  (not applied; `applied: null` for a call a lost leader may have applied): never a wrong answer.
  Should this node itself be elected meanwhile, the calls waiting on the link run here
  (`run_here`), under the same request ids.
* A reserve with `wait_ms` parks here, on the node the client is connected to (this node applies
  the same log, so its wake-ups say when a queue may have work), and each try is forwarded
  without a wait (`no_wait`).
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import logging
import os

import orjson

from ..base import bounds, validate
from ..core.errors import ApiError, error

log = logging.getLogger("raftq.forward")
FORWARD_HEADER = "Raftq-Forward"
REDIRECT_HEADER = "Raftq-Redirect"
FORWARD_WAIT_S = 5.0
MAX_FORWARD_INFLIGHT = 4096
MAX_MESSAGE_BYTES = 64 * 1024   # a message of frames (one frame alone may be larger: max_request_bytes)
_RETRY_S = 0.05
CONNECT_TIMEOUT_S = 2.0     # a paused leader takes the connection and never answers
# The request ids a follower makes begin so. A client's id is 1..128 visible ASCII characters
# (docs/api.md "Conventions"), so one with a space is never a client's: the two cannot collide,
# in any caller's scope. The leader takes such an id on a forward link only.
AUTO_ID_PREFIX = "fwd "


def forward_token(secret: str | None) -> str:
    """What a follower's link shows the leader at the upgrade: an HMAC of the cluster secret."""
    return hmac.new((secret or "").encode(), b"raftq-forward-link", hashlib.sha256).hexdigest()


def auto_request_id(rid) -> bool:
    """A request id a follower gave a forwarded call (ForwardLink.call)."""
    return type(rid) is str and rid.startswith(AUTO_ID_PREFIX) and len(rid) <= 128


def _lost(rid) -> tuple[int, dict]:
    """A call the leader may have applied: the outcome is unknown (`applied: null`, docs/api.md;
    gRPC ABORTED, not UNAVAILABLE, which sepp-py retries even where a repeat is not harmless)."""
    if rid is None or auto_request_id(rid):
        return error("unavailable", "the leader was lost while this call was forwarded to it, and no leader took it "
                     "again within tuning.forward_wait_s; it may have been applied: send a Request-Id to make a "
                     "retry safe", applied=None)
    return error("unavailable", "the leader was lost while this call was forwarded to it; it may have been "
                 "applied: retry with the same Request-Id", applied=None)


def _no_leader(wait_s: float) -> tuple[int, dict]:
    return error("unavailable", f"no leader could be reached within tuning.forward_wait_s ({wait_s:g} s); "
                 "retry shortly", applied=False)


def _leader_lost(status: int, body) -> bool:
    """A leader's answer that is not the call's outcome: the leader stopped leading before the
    call was committed (`no_leader`), or does not know whether it was (`applied: null`). The
    call goes again, with its request id."""
    if status != 503 or type(body) is not dict:
        return False
    err = body.get("error")
    return type(err) is dict and (err.get("code") == "no_leader" or (
        err.get("code") == "unavailable" and "applied" in err and err["applied"] is None))


def _chain(src: asyncio.Future, dst: asyncio.Future) -> None:
    def done(f):
        if not dst.done():
            dst.set_result(f.result())
    src.add_done_callback(done)


class _Call:
    """One call on the link: its future and frame, when it was sent (None: waiting to be), since
    when it waits for a leader, whether a leader was lost with it, and the caller's key name
    (which the call needs to run here should this node be elected)."""
    __slots__ = ("fut", "frame", "data", "sent", "since", "lost", "who")

    def __init__(self, fut, frame: dict, data: bytes, who, now: float):
        self.fut, self.frame, self.data, self.who, self.since = fut, frame, data, who, now
        self.sent = None
        self.lost = False


class ForwardLink:
    """A follower's one link to the leader: pending calls by frame id (`_Call`), frames not yet
    sent in `unsent`. One task connects and reads, one writes, one expires calls that waited too
    long and follows the leader."""

    def __init__(self, service):
        self.service = service
        self.loop = service.loop
        t = service.settings.tuning
        self.wait_s = float(t.get("forward_wait_s", FORWARD_WAIT_S))
        self.max_inflight = int(t.get("max_forward_inflight", MAX_FORWARD_INFLIGHT))
        self.timeout_s = float(t["request_timeout_s"]) + 1.0
        self.token = forward_token(service.settings.secret)
        # This node's request ids: its id, a random part (a restarted node counts from 0 again;
        # 48 bits make a repeat within request_id_window_ms out of reach) and the frame id.
        self.id_prefix = f"{AUTO_ID_PREFIX}{service.settings.node_id[:40]} {os.urandom(6).hex()} "
        self.pending: dict[int, _Call] = {}
        self.unsent: list[int] = []
        self.next_id = 0
        self.ws = None
        self.url: str | None = None
        self.wake = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.reader: asyncio.Task | None = None
        self.http = None
        self.sent = 0               # messages written (each a batch)
        self.forwarded = 0          # calls forwarded over the link
        # /metrics (figures()): link opens, calls sent again, run here, and the answers made
        # here: 429 at max_forward_inflight, 503 after forward_wait_s, 503 applied null (lost)
        self.counts: collections.Counter = collections.Counter()

    def auto_id(self) -> str:
        self.next_id += 1
        return self.id_prefix + str(self.next_id)

    # ------------------------------------------------------------ calls
    def call(self, op: str, body, rid=None, auth=None, extra: dict | None = None, who=None) -> asyncio.Future:
        """Forward one call: a future of the leader's (status, body), or of the 429/503 here.
        Without a request id the call gets one of this node's (module docstring)."""
        if self.service.is_leader():    # elected meanwhile (a parked reserve's next try)
            return self.service.run_here(op, body, rid, who)
        fut = self.loop.create_future()
        if len(self.pending) >= self.max_inflight:
            bounds.hit("max_forward_inflight")
            self.counts["max_forward_inflight"] += 1
            fut.set_result(error("overloaded", f"{self.max_inflight} calls are being forwarded from this node "
                                 "(tuning.max_forward_inflight); retry after a moment"))
            return fut
        self.next_id += 1
        i = self.next_id
        frame = {"id": i, "op": op, "body": body, "request_id": self.id_prefix + str(i) if rid is None else rid}
        if auth:
            frame["authorization"] = auth
        if extra:
            frame.update(extra)
        try:
            data = orjson.dumps(frame)
        except orjson.JSONEncodeError as e:     # parsed here, yet not JSON again: nested past orjson's 254 levels
            fut.set_result(error("invalid_argument", f"the request body cannot be forwarded to the leader: {e}; "
                                 "send a body nested less deeply"))
            return fut
        self.pending[i] = _Call(fut, frame, data, who, self.loop.time())
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
        c = self.pending.pop(i, None)
        if c is not None and not c.fut.done():
            c.fut.set_result(result)

    def _again(self, c: _Call, now: float) -> None:
        """A call the leader was lost with goes again (to the next leader): it waits for one
        from the first loss on, for forward_wait_s at most."""
        c.sent = None
        if not c.lost:
            c.lost = True
            c.since = now
        self.counts["resent"] += 1

    def connected(self) -> bool:
        return self.ws is not None and not self.ws.closed

    def reachable(self) -> bool:
        """The leader takes this follower's link, or no call has needed it for a while: False
        while calls wait for a link that cannot be opened (/readyz)."""
        return self.connected() or not self.pending or self.loop.time() - min(
            c.since for c in self.pending.values()) < 1.0

    def figures(self) -> dict:
        """The link's counters and gauges for /metrics (node/api/metrics.py)."""
        c = self.counts
        return {"forwarded": self.forwarded, "forwarded_http": c["http"], "in_flight": len(self.pending),
                "connected": self.connected(), "connects": c["connects"], "resent": c["resent"],
                "run_here": c["run_here"], "refused": {k: c[k] for k in ("max_forward_inflight", "forward_wait_s",
                                                                         "lost")}}

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
        """One link's life: wait for a leader, connect, send and read until it closes. While
        this node leads, the calls that wait run here."""
        service = self.service
        if service.is_leader():
            self._run_here()
            await asyncio.sleep(_RETRY_S)
            return
        url = service.leader_peer_url()
        if url is None or url == service.settings.url:
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
        self.counts["connects"] += 1
        self.ws, self.url = ws, url
        self.unsent = sorted(i for i, c in self.pending.items() if c.sent is None)
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

    def _run_here(self):
        """This node leads: the calls waiting on the link run here, with their request ids (one
        a lost leader may have applied is in this node's log if it was committed, before the run
        here: the replay answers it)."""
        for i in [i for i, c in self.pending.items() if c.sent is None]:
            c = self.pending.pop(i)
            rid = c.frame["request_id"]
            if not c.lost and auto_request_id(rid):
                rid = None                      # never sent: nothing to replay, no record to keep
            self.counts["run_here"] += 1
            _chain(self.service.run_here(c.frame["op"], c.frame["body"], rid, c.who), c.fut)
        self.unsent = []

    async def _writer(self, ws):
        wake, pending = self.wake, self.pending
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
                    c = pending.get(i)
                    if c is not None and c.sent is None:
                        c.sent = now
                        data = c.data
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
        answered = self._answered
        async for msg in ws:
            if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                break
            try:
                data = orjson.loads(msg.data)
            except orjson.JSONDecodeError:
                continue
            for a in data if isinstance(data, list) else (data,):
                if isinstance(a, dict) and a.get("id") is not None:
                    answered(a["id"], a["status"], a["body"])
        if ws.close_code not in (None, 1000):
            log.info("forward link to %s closed (%s %s)", self.url, ws.close_code, ws.exception() or "")

    def _answered(self, i, status, body):
        """The leader's answer to frame `i`: the call's, unless it says the leader was lost
        meanwhile (_leader_lost); then the call goes again after a pause (a node that answers
        so at once is not called in a loop)."""
        c = self.pending.get(i)
        if c is None:
            return
        if not _leader_lost(status, body):
            del self.pending[i]
            if not c.fut.done():
                c.fut.set_result((status, body))
            return
        self._again(c, self.loop.time())
        self.loop.call_later(_RETRY_S, self._resend, i)

    def _resend(self, i):
        c = self.pending.get(i)
        if c is not None and c.sent is None:
            self.unsent.append(i)
            self.wake.set()

    def _link_lost(self):
        """The link closed: the calls sent and not answered go again (each has its request id)."""
        now = self.loop.time()
        for c in self.pending.values():
            if c.sent is not None:
                self._again(c, now)

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
        now, counts = self.loop.time(), self.counts
        for i, c in list(self.pending.items()):
            if c.sent is None and now - c.since > self.wait_s:
                counts["lost" if c.lost else "forward_wait_s"] += 1
                self._answer(i, _lost(c.frame["request_id"]) if c.lost else _no_leader(self.wait_s))
            elif c.sent is not None and now - c.sent > self.timeout_s:
                counts["lost"] += 1
                self._answer(i, _lost(c.frame["request_id"]))

    def _check_leader(self):
        """The link goes to the leader this node knows: another one known (or this node leading)
        closes it (its calls go again, _link_lost). Calls waiting while this node leads run here;
        calls still unsent on an open link wake the writer (a missed wake-up must not leave them
        until forward_wait_s)."""
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
        for i, c in list(self.pending.items()):
            self._answer(i, _lost(c.frame["request_id"]) if c.sent is not None or c.lost else error(
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

    def forward(self, op: str, body, rid=None, job_id=None, auth=None, extra=None, who=None) -> asyncio.Future:
        """`auth`: the caller's Authorization (the leader checks it); `who`: its key name, as
        checked here (for a call that runs here should this node be elected first)."""
        if job_id is not None:
            body = {**body, "job_id": job_id} if isinstance(body, dict) else body
        return self.forwarder.call(op, body, rid, auth, extra, who)

    def run_here(self, op: str, body, rid, who) -> asyncio.Future:
        """A call that waited on the link, run by this node now that it leads, as the leader runs a
        forwarded frame (its key and role were checked here when it came; a reserve is one try)."""
        proposer = self.proposer
        if not self.seeded and not self.is_seeded():
            return proposer.answered(self.not_seeded())
        if op != "reserve":
            cmd, extra = self.prepare(op, body, rid, None, who)
            return proposer.answered(extra) if cmd is None else proposer.submit(cmd, extra)
        try:
            cmd, _ = validate.reserve(body, self.limits, validate.request_slot(who, rid, "reserve", body))
        except ApiError as e:
            return proposer.answered(e.result)
        return proposer.submit(cmd)

    async def forward_http(self, method: str, path_qs: str, raw: bytes | None, headers: dict):
        """One HTTP call sent to the leader as it came: (status, body bytes, content type). A
        write without a Request-Id gets one of this node's (shown with the forward token, which
        lets the leader take it), so every call goes again to the next leader when the leader is
        lost meanwhile (or answers that it was), within forward_wait_s."""
        import aiohttp
        link = self.forwarder
        link.counts["http"] += 1
        deadline = self.loop.time() + link.wait_s
        write = method not in ("GET", "HEAD")
        if write and "Request-Id" not in headers:
            headers = {**headers, "Request-Id": link.auto_id(), FORWARD_HEADER: link.token}
        maybe_sent = False      # a leader may have taken it: at the deadline its outcome is unknown
        while True:
            url = self.leader_peer_url()
            if self.stopping:
                return _json(error("no_leader", "this node is shutting down; retry on another node"))
            if url is None or url == self.settings.url:
                if self.loop.time() > deadline:
                    return _json(_lost(headers["Request-Id"]) if write and maybe_sent else _no_leader(link.wait_s))
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
                maybe_sent = maybe_sent or not isinstance(e, aiohttp.ClientConnectorError)
                if self.loop.time() > deadline:
                    return _json(_lost(headers["Request-Id"]) if write and maybe_sent else _no_leader(link.wait_s))
                await asyncio.sleep(_RETRY_S)
                continue
            if (status == 307 or status == 503 and _leader_lost(status, _loads(body))) \
                    and self.loop.time() <= deadline:
                maybe_sent = maybe_sent or status == 503
                await asyncio.sleep(_RETRY_S)
                continue
            return status, body, ctype


def _loads(body: bytes):
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _json(result):
    status, body = result
    return status, orjson.dumps(body), "application/json"
