"""`GET /v1/session`: the operations of the HTTP API as WebSocket frames, many in flight.

An HTTP request costs far more CPU than the work behind it; one WebSocket carrying many small
frames is where per-operation speed comes from (API.md "Session transport"). Each frame is
answered by the same `NodeService` method as the matching endpoint, with the same status and
body. When this node stops leading, every session is closed with code 4001 and the new
leader's URL as the reason, and the client re-sends its unanswered requests there.
"""
from __future__ import annotations

import asyncio
import logging

import orjson
from aiohttp import WSMsgType, web

from .auth import OPERATOR, VIEWER, WORKER
from .errors import error
from .service import NodeService

log = logging.getLogger("raftq.session")
CLOSE_NOT_LEADER = 4001


# Answered without a task: prepared, proposed, and replied to from the future's callback.
FAST_OPS = frozenset(("enqueue", "enqueue_batch", "enqueue_atomic", "ack", "ack_batch", "nack", "extend", "drain"))
# The role each op needs when API keys are on (API.md "Authentication"); read ops: viewer.
OP_ROLES = {**{op: WORKER for op in FAST_OPS}, "reserve": WORKER, "drain": OPERATOR}
READ_OPS = {
    "server_info": lambda s: s.server_info(),
    "cluster": lambda s: s.cluster_with_digest(),       # a coroutine: awaited
}


class Sessions:
    """The open sessions of this node, closed together when leadership moves."""

    def __init__(self, service: NodeService):
        self.service = service
        self.open: set[web.WebSocketResponse] = set()

    async def close_all(self, reason: str = ""):
        for ws in list(self.open):
            try:
                await ws.close(code=CLOSE_NOT_LEADER, message=reason.encode()[:120])
            except Exception:
                pass

    async def handle(self, request: web.Request, header=None) -> web.StreamResponse:
        """`header`: the upgrade's Authorization header; each frame is checked with it against
        the key set in force when the frame arrives (a removed key stops working at once)."""
        service = self.service
        auth = service.auth
        ws = web.WebSocketResponse(max_msg_size=service.limits.max_request_bytes + 4096, heartbeat=20.0,
                                   autoping=True)
        await ws.prepare(request)
        self.open.add(ws)
        # Extension: a client that sends a JSON array of frames (or connects with ?batch=1) gets
        # its answers batched the same way: every response ready at one moment goes out as one
        # WebSocket message, one syscall instead of one per response.
        batching = [request.query.get("batch") == "1"]
        outbox: list = []
        wake = asyncio.Event()
        tasks: set[asyncio.Task] = set()

        def alive() -> bool:
            return not ws.closed

        def reply(frame_id, status, body, binary):
            outbox.append(({"id": frame_id, "status": status, "body": body}, binary))
            wake.set()

        async def writer():
            # One writer: aiohttp's WebSocket sends must not interleave.
            while True:
                await wake.wait()
                wake.clear()
                while outbox:
                    if ws.closed:
                        return
                    if batching[0] and len(outbox) > 1:
                        frames = [f for f, _ in outbox]
                        binary = outbox[0][1]
                        outbox.clear()
                        data = orjson.dumps(frames)
                    else:
                        frame, binary = outbox.pop(0)
                        data = orjson.dumps(frame)
                    if binary:
                        await ws.send_bytes(data)
                    else:
                        await ws.send_str(data.decode())

        async def serve(frame_id, op, body, rid, binary, who):
            try:
                if not service.is_leader():
                    status, out = error("unavailable", "this node is no longer the leader; reconnect",
                                        applied=False)
                elif op == "reserve" and not service.is_seeded():
                    status, out = service.not_seeded()
                elif op == "reserve":          # a long poll: needs its own task
                    status, out = await service.reserve(body, rid, alive=alive, who=who)
                else:
                    answer = READ_OPS[op](service)
                    status, out = await answer if asyncio.iscoroutine(answer) else answer
            except Exception:
                log.exception("session op %s failed", op)
                status, out = error("internal", "internal error (a bug): see the node's log")
            reply(frame_id, status, out, binary)

        def dispatch(frame, binary):
            try:
                frame_id = frame["id"]
                op = frame["op"]
            except (KeyError, TypeError):
                reply(None, *error("invalid_argument", "a frame is {\"id\", \"op\", \"request_id\"?, \"body\"}"), binary)
                return
            rid = frame.get("request_id")
            if rid is not None and (not isinstance(rid, str) or not 1 <= len(rid) <= 128
                                    or not all(0x21 <= ord(c) <= 0x7E for c in rid)):
                reply(frame_id, *error("invalid_argument", "request_id must be 1..128 visible ASCII characters"), binary)
                return
            who = None
            if auth.enabled:
                found, denied = auth.frame_check(header, OP_ROLES.get(op, VIEWER))
                if denied is not None:
                    reply(frame_id, *denied, binary)
                    return
                who = found[0]
            if op in FAST_OPS:
                if not service.is_leader():
                    reply(frame_id, *error("unavailable", "this node is no longer the leader; reconnect",
                                           applied=False), binary)
                    return
                if not service.seeded and not service.is_seeded():
                    reply(frame_id, *service.not_seeded(), binary)
                    return
                cmd, extra = service.prepare(op, frame.get("body"), rid, None, who)
                if cmd is None:
                    reply(frame_id, *extra, binary)
                    return
                fut = service.proposer.submit(cmd, extra)
                fut.add_done_callback(lambda f, i=frame_id, b=binary: reply(i, *f.result(), b))
                return
            if op != "reserve" and op not in READ_OPS:
                reply(frame_id, *error("invalid_argument", f"unknown op {op!r}; one of "
                                                           f"{', '.join(sorted(FAST_OPS) + ['reserve'] + list(READ_OPS))}"),
                      binary)
                return
            t = asyncio.create_task(serve(frame_id, op, frame.get("body"), rid, binary, who))
            tasks.add(t)
            t.add_done_callback(tasks.discard)

        writer_task = asyncio.create_task(writer())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    raw, binary = msg.data, True
                elif msg.type == WSMsgType.TEXT:
                    raw, binary = msg.data, False
                else:
                    break
                try:
                    frame = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    reply(None, *error("invalid_argument", "a frame must be JSON"), binary)
                    continue
                if isinstance(frame, list):
                    batching[0] = True
                    for f in frame:
                        dispatch(f, binary)
                else:
                    dispatch(frame, binary)
        finally:
            self.open.discard(ws)
            # Unanswered requests are abandoned: a proposal still commits (the client re-sends
            # it with its request id and gets the stored answer); a parked reserve takes nothing.
            for t in list(tasks):
                t.cancel()
            writer_task.cancel()
            if not ws.closed:
                await ws.close()
        return ws
