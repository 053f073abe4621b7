"""`GET /v1/session`: the operations of the HTTP API as WebSocket frames, many in flight.

An HTTP request costs far more CPU than the work behind it; one WebSocket carrying many small
frames is where per-operation speed comes from (docs/api.md "Session transport (WebSocket)").
Each frame is answered by the same `NodeService` method as the matching endpoint, with the same
status and body. A follower serves sessions too: its job operations are forwarded to the leader
(node/service/forwarding.py). When this node stops leading, every session it has is closed with
code 4001 and the new leader's URL as the reason, and the client re-sends its unanswered
requests there (or to any node). A follower's forward link is a session too (`forwarder`):
opened with the cluster's forward token, each frame carrying its caller's Authorization.
"""
from __future__ import annotations

import asyncio
import logging

import orjson
from aiohttp import WSMsgType, web

from ..base import bounds
from ..base.auth import VIEWER
from ..core.errors import error
from ..service.forwarding import MAX_FORWARD_INFLIGHT, auto_request_id
from ..service.node_service import NodeService
from ..base.settings import TUNING_DEFAULTS
from ..base.validate import valid_request_id
from .session_ops import ALL_OPS, FAST_OPS, OP_ROLES, READ_OPS

log = logging.getLogger("raftq.session")
CLOSE_NOT_LEADER = 4001
CLOSE_NOT_READ = 4008       # the client did not read its answers for session_stall_timeout_s


class SessionState:
    """One session's bounds and counters: parked long polls (`tuning.max_session_parked_reserves`),
    frames taken and not yet answered (`max_session_inflight`) and answer bytes not yet sent
    (`max_session_queued_bytes`, and all sessions' together `max_queued_answer_bytes`, which
    holds back only sessions that have answers waiting). While a bound is reached the session
    takes no frame: its socket is not read (TCP pushes back on the client) until its answers
    drain."""
    __slots__ = ("parked", "max_parked", "inflight", "max_inflight", "queued", "max_queued", "room", "shared",
                 "sent", "closed")

    def __init__(self, tuning: dict, shared: "Sessions", forwarder: bool = False):
        self.parked = 0
        self.max_parked = int(tuning["max_session_parked_reserves"])
        self.inflight = 0
        # A follower's link carries all its clients' calls: bounded as the follower bounds them.
        self.max_inflight = int(tuning.get("max_forward_inflight", MAX_FORWARD_INFLIGHT) if forwarder
                                else tuning["max_session_inflight"])
        self.queued = 0
        self.max_queued = int(tuning["max_session_queued_bytes"])
        self.shared = shared
        self.sent = 0               # answer messages sent (the stall check's progress mark)
        self.closed = False
        self.room = asyncio.Event()
        self.room.set()

    def queue(self, n: int):
        """`n` answer bytes more (negative: less) waiting to be sent."""
        self.queued += n
        self.shared.queued += n
        self.update()

    def update(self):
        if self.inflight < self.max_inflight and self.queued < self.max_queued and (
                self.queued == 0 or self.shared.queued < self.shared.max_queued):
            if not self.room.is_set():
                self.room.set()
        elif self.room.is_set():
            self.room.clear()
            bounds.hit("max_session_inflight" if self.inflight >= self.max_inflight else
                       "max_session_queued_bytes" if self.queued >= self.max_queued else "max_queued_answer_bytes")


def _frame_bytes(frame_id, status, body) -> bytes:
    """An answer frame as compact bytes. orjson's output keeps the buffer it was written into
    (4 KiB for a small answer with orjson 3.13, by tracemalloc; about 7x the length for a large
    one), so an answer that waits in the outbox is copied into a bytes object of its own
    length: what the queued-bytes bounds count is what the node holds."""
    try:
        data = orjson.dumps({"id": frame_id, "status": status, "body": body})
    except (TypeError, orjson.JSONEncodeError):      # an id orjson cannot write back (never a JSON one)
        data = orjson.dumps({"id": None, "status": 400, "body": error(
            "invalid_argument", "the frame's id cannot be written back: use an integer")[1]})
    return bytes(memoryview(data))


def _not_leading(forwarder: bool) -> tuple[int, dict]:
    """A frame this node takes after it stopped leading (not applied). A follower's link sends
    a call answered `no_leader` again, to the next leader (node/service/forwarding.py)."""
    if forwarder:
        return error("no_leader", "this node is no longer the leader")
    return error("unavailable", "this node is no longer the leader; reconnect", applied=False)


class Sessions:
    """The open sessions of this node, closed together when leadership moves."""

    def __init__(self, service: NodeService):
        self.service = service
        self.open: set[web.WebSocketResponse] = set()
        self.links: set[web.WebSocketResponse] = set()     # followers' forward links (not in the gauge)
        self.queued = 0             # answer bytes waiting in every session's outbox
        tuning = getattr(service.settings, "tuning", None) or TUNING_DEFAULTS
        self.max_queued = int(tuning["max_queued_answer_bytes"])

    async def close_all(self, reason: str = ""):
        for ws in list(self.open) + list(self.links):
            try:
                await ws.close(code=CLOSE_NOT_LEADER, message=reason.encode()[:120])
            except Exception:
                pass

    async def handle(self, request: web.Request, header=None, forwarder: bool = False) -> web.StreamResponse:
        """`header`: the upgrade's Authorization header; each frame is checked with it against
        the key set in force when the frame arrives (a removed key stops working at once).
        `forwarder`: a follower's forward link (each frame checked with its own Authorization)."""
        service = self.service
        ws = web.WebSocketResponse(max_msg_size=service.limits.max_request_bytes + 4096, heartbeat=20.0,
                                   autoping=True)
        await ws.prepare(request)
        (self.links if forwarder else self.open).add(ws)
        session = Session(self, request, ws, header, forwarder)
        writer_task = asyncio.create_task(session.writer())
        try:
            await session.read_loop()
        finally:
            await session.close(writer_task)
        return ws


class Session:
    """One open session: its socket, bounds and counters, the answers waiting to be sent (one
    writer sends them) and the tasks of its slow frames. Steps: `read_loop` takes frames while
    the bounds leave room, `dispatch` checks each and answers or proposes it (`serve` runs a
    reserve or a read in a task), `reply` queues an answer, `writer` sends, `close` ends it."""
    __slots__ = ("sessions", "service", "auth", "header", "request", "ws", "batching", "state", "stall_s",
                 "outbox", "wake", "tasks", "forwarder")

    def __init__(self, sessions: Sessions, request: web.Request, ws: web.WebSocketResponse, header,
                 forwarder: bool = False):
        service = sessions.service
        tuning = service.settings.tuning
        self.sessions = sessions
        self.service = service
        self.auth = service.auth
        self.header = header
        self.request = request
        self.ws = ws
        # Extension: a client that sends a JSON array of frames (or connects with ?batch=1) gets
        # its answers batched the same way: every response ready at one moment goes out as one
        # WebSocket message, one syscall instead of one per response.
        self.batching = request.query.get("batch") == "1"
        self.state = SessionState(tuning, sessions, forwarder)
        self.forwarder = forwarder
        self.stall_s = float(tuning["session_stall_timeout_s"])
        self.outbox: list = []                # (answer frame as bytes, binary)
        self.wake = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()

    def alive(self) -> bool:
        return not self.ws.closed

    def reply(self, frame_id, status, body, binary):
        state = self.state
        if state.closed:                # a proposal committed after the session ended
            state.inflight -= 1
            return
        data = _frame_bytes(frame_id, status, body)
        self.outbox.append((data, binary))
        state.inflight -= 1
        state.queue(len(data))
        self.wake.set()

    async def writer(self):
        # One writer: aiohttp's WebSocket sends must not interleave.
        ws, outbox, wake, state = self.ws, self.outbox, self.wake, self.state
        try:
            while True:
                await wake.wait()
                wake.clear()
                while outbox:
                    if ws.closed:
                        return
                    if self.batching and len(outbox) > 1:
                        parts = [d for d, _ in outbox]
                        binary = outbox[0][1]
                        outbox.clear()
                        data = b"[" + b",".join(parts) + b"]"
                        size = len(data) - len(parts) - 1
                    else:
                        data, binary = outbox.pop(0)
                        size = len(data)
                    if binary:
                        await ws.send_bytes(data)
                    else:
                        await ws.send_str(data.decode())
                    state.sent += 1
                    state.queue(-size)
        except (ConnectionError, RuntimeError):
            return

    async def read_loop(self):
        """Take frames until the socket closes (or the session is closed for not reading its
        answers); a frame that is not JSON is answered here, the others go to `dispatch`."""
        ws, state, dispatch = self.ws, self.state, self.dispatch
        while not ws.closed:
            if not state.room.is_set() and not await self.room():
                break
            msg = await ws.receive()
            if msg.type == WSMsgType.BINARY:
                raw, binary = msg.data, True
            elif msg.type == WSMsgType.TEXT:
                raw, binary = msg.data, False
            else:
                if msg.type == WSMsgType.ERROR and getattr(msg.data, "code", None) == 1009:
                    bounds.hit("max_request_bytes")
                break
            try:
                frame = orjson.loads(raw)
            except orjson.JSONDecodeError:
                state.inflight += 1     # (reply takes it back)
                self.reply(None, *error("invalid_argument", "a frame must be JSON"), binary)
                continue
            if isinstance(frame, list):
                self.batching = True
                for f in frame:
                    if not state.room.is_set() and not await self.room():
                        break
                    dispatch(f, binary)
            else:
                dispatch(frame, binary)

    async def room(self) -> bool:
        """Wait until the session may take a frame; False when it is closed for not reading
        its answers (the queued-bytes bound held for session_stall_timeout_s)."""
        state, stall_s = self.state, self.stall_s
        while not state.room.is_set():
            sent = state.sent
            try:
                await asyncio.wait_for(state.room.wait(), stall_s)
            except asyncio.TimeoutError:
                if state.queued > 0 and state.sent == sent:     # answers waiting, none sent
                    bounds.hit("session_stall_timeout_s")
                    log.info("session closed: its answers were not read for %.0f s (%d bytes waiting)",
                             stall_s, state.queued)
                    try:
                        await asyncio.wait_for(self.ws.close(code=CLOSE_NOT_READ, message=b"answers not read"), 2.0)
                    except (asyncio.TimeoutError, Exception):
                        pass
                    if self.request.transport is not None:
                        self.request.transport.abort()
                    return False
        return True

    def dispatch(self, frame, binary):
        """One frame taken: answered at once when it is malformed or refused, else proposed
        (a fast op) or served in a task of its own (a reserve, a read)."""
        state = self.state
        state.inflight += 1             # every frame taken is answered once (reply)
        if state.inflight >= state.max_inflight:
            state.update()
        try:
            frame_id = frame["id"]
            op = frame["op"]
        except (KeyError, TypeError, IndexError):
            self.reply(None, *error("invalid_argument", "a frame is {\"id\", \"op\", \"request_id\"?, \"body\"}"),
                       binary)
            return
        if not isinstance(op, str):
            self.reply(frame_id, *error("invalid_argument", f"op must be a string, one of {', '.join(ALL_OPS)}"),
                       binary)
            return
        rid = frame.get("request_id")
        # (a follower's link also carries the request ids the follower made: forwarding.py)
        if rid is not None and not valid_request_id(rid) and not (self.forwarder and auto_request_id(rid)):
            self.reply(frame_id, *error("invalid_argument", "request_id must be 1..128 visible ASCII characters"),
                       binary)
            return
        who = None
        if self.auth.enabled:
            header = frame.get("authorization") if self.forwarder else self.header
            found, denied = self.auth.frame_check(header, OP_ROLES.get(op, VIEWER))
            if denied is not None:
                self.reply(frame_id, *denied, binary)
                return
            who = found[0]
        if op in FAST_OPS:
            self.propose(frame_id, op, frame.get("body"), rid, who, binary)
        elif op != "reserve" and op not in READ_OPS:
            self.reply(frame_id, *error("invalid_argument", f"unknown op {op[:64]!r}; one of {', '.join(ALL_OPS)}"),
                       binary)
        else:
            t = asyncio.create_task(self.serve(frame_id, op, frame.get("body"), rid, binary, who,
                                               self.forwarder and frame.get("no_wait") is True))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    def propose(self, frame_id, op, body, rid, who, binary):
        """A fast op (a write other than reserve): prepared and proposed here, answered when
        its entry is applied, without a task of its own."""
        service = self.service
        if not service.is_leader():
            if self.forwarder or not service.must_forward():
                self.reply(frame_id, *_not_leading(self.forwarder), binary)
                return
            fut = service.forward(op, body, rid, None, self.header, who=who)       # a follower's session
            reply = self.reply
            fut.add_done_callback(lambda f, i=frame_id, b=binary: reply(i, *f.result(), b))
            return
        if not service.seeded and not service.is_seeded():
            self.reply(frame_id, *service.not_seeded(), binary)
            return
        cmd, extra = service.prepare(op, body, rid, None, who)
        if cmd is None:
            self.reply(frame_id, *extra, binary)
            return
        fut = service.proposer.submit(cmd, extra)
        reply = self.reply
        fut.add_done_callback(lambda f, i=frame_id, b=binary: reply(i, *f.result(), b))

    async def serve(self, frame_id, op, body, rid, binary, who, no_wait=False):
        """A reserve (a long poll maybe) or a read, in a task of its own. On a follower a
        reserve parks here and its tries are forwarded (node/service/forwarding.py)."""
        service = self.service
        try:
            if not service.is_leader() and (self.forwarder or not service.must_forward()):
                status, out = _not_leading(self.forwarder)
            elif op == "reserve" and not service.is_seeded():
                status, out = service.not_seeded()
            elif op == "reserve":          # a long poll: needs its own task
                status, out = await service.reserve(body, rid, alive=self.alive, owner=self.state, who=who,
                                                    auth=self.header, no_wait=no_wait)
            else:
                answer = READ_OPS[op](service)
                status, out = await answer if asyncio.iscoroutine(answer) else answer
        except Exception:
            log.exception("session op %s failed", op)
            status, out = error("internal", "internal error (a bug): see the node's log")
        self.reply(frame_id, status, out, binary)

    async def close(self, writer_task: asyncio.Task):
        """The session ends: its unsent answers are dropped with it, and its unanswered requests
        abandoned: a proposal still commits (the client re-sends it with its request id and gets
        the stored answer); a parked reserve takes nothing."""
        sessions, state, ws = self.sessions, self.state, self.ws
        sessions.open.discard(ws)
        sessions.links.discard(ws)
        state.closed = True
        sessions.queued -= state.queued
        state.queued = 0
        for t in list(self.tasks):
            t.cancel()
        writer_task.cancel()
        if not ws.closed:
            await ws.close()
