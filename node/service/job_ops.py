"""NodeService's job operations: enqueue, reserve (a long poll with `wait_ms`), ack, nack, extend,
release, drain. The hot path: each is a plain function returning the proposer's future, with no
layer between the transport and the proposal (docs/performance.md)."""
from __future__ import annotations

import asyncio
import os

from ..base import bounds, validate
from ..core import ops
from ..core.errors import ApiError, error
from .wakeups import _time_up

_random = bytearray()


def _new_id() -> str:
    """A random UUID v4 (canonical lowercase text), from a buffered os.urandom: a quarter of
    uuid.uuid4()'s cost, which matters at one id per enqueued job."""
    global _random
    if len(_random) < 16:
        _random = bytearray(os.urandom(4096))
    b = _random[-16:]
    del _random[-16:]
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# The routes a request id is bound to (node/base/validate.py request_slot): one per endpoint.
JOB_ID_OPS = frozenset(("ack", "nack", "extend", "release"))
_NO_WAIT = {"no_wait": True}        # a forwarded reserve's try: the follower waits, not the leader


class JobOps:
    """Mixin of NodeService: the job operations."""

    def prepare(self, op: str, body, rid, job_id=None, who=None):
        """The command for one operation (everything but reserve), or an immediate error:
        (cmd, size_hint) or (None, (status, body)). `job_id` comes from the HTTP path; a
        session frame carries it in the body. `rid` is the Request-Id as the client sent it,
        `who` the caller's key name (None without auth)."""
        try:
            limits = self.state.machine.limits          # the configuration in force, applied here
            if op in JOB_ID_OPS:
                if job_id is None:
                    if not isinstance(body, dict):
                        raise ApiError("invalid_argument", "body must be a JSON object with job_id")
                    job_id = body.get("job_id")
                if rid is not None:
                    hashed = {k: v for k, v in body.items() if k != "job_id"} if isinstance(body, dict) else body
                    rid = validate.request_slot(who, rid, op, hashed, job_id)
                if op == "nack":
                    return validate.nack(job_id, body, rid, limits), 64
                if op == "release":
                    return validate.release(job_id, body, rid, limits), 64
                if op == "ack":
                    cmd = validate.ack(job_id, body, rid, limits)
                    return cmd, 64 if len(cmd) == 4 else 64 + len(cmd[4][0])     # a result's bytes
                return validate.extend(job_id, body, rid), 64
            if rid is not None:
                rid = validate.request_slot(who, rid, op, body)
            if op == "enqueue":
                return validate.enqueue(body, limits, self.stamp(), _new_id, rid), 256
            if op == "enqueue_batch":
                return validate.enqueue_batch(body, limits, self.stamp(), _new_id, rid), 4096
            if op == "enqueue_atomic":
                return validate.enqueue_atomic(body, limits, self.stamp(), _new_id, rid), 4096
            if op == "ack_batch":
                cmd = validate.ack_batch(body, limits, rid)
                pairs = ops.ack_batch_pairs(cmd)
                return cmd, 64 * len(pairs) + sum(len(p[2][0]) for p in pairs if len(p) == 3)
            if op == "drain":
                return validate.drain(body, limits, rid, who), 64
        except ApiError as e:
            return None, e.result
        return None, error("invalid_argument", f"unknown op {op!r}")

    # The job operations below are plain functions that return a future to await, not
    # coroutines: each `async def` layer costs a frame and a send() per request on the path
    # every enqueue, reserve and ack takes.
    def run(self, op: str, body, rid=None, job_id=None, who=None, auth=None) -> asyncio.Future:
        """Prepare and propose one operation: a future of its committed result or the error. On
        a follower: forwarded to the leader with the caller's Authorization `auth`."""
        if not self.replica.is_leader() and self.must_forward():
            return self.forward(op, body, rid, job_id, auth, who=who)
        cmd, extra = self.prepare(op, body, rid, job_id, who)
        if cmd is None:
            return self.proposer.answered(extra)
        return self.proposer.submit(cmd, extra)

    def enqueue(self, body, rid=None, who=None, auth=None) -> asyncio.Future:
        return self.run("enqueue", body, rid, None, who, auth)

    def enqueue_batch(self, body, rid=None, who=None, auth=None) -> asyncio.Future:
        return self.run("enqueue_batch", body, rid, None, who, auth)

    def enqueue_atomic(self, body, rid=None, who=None, auth=None) -> asyncio.Future:
        return self.run("enqueue_atomic", body, rid, None, who, auth)

    async def reserve(self, body, rid=None, alive=None, owner=None, who=None, auth=None, no_wait=False):
        """A reserve; with `wait_ms`, a long poll that parks until a job may be ready in one of
        its queues. `alive()` says whether the client is still there; `owner` (a session) has
        `parked` and `max_parked`, its own bound on parked reserves; `who` is the caller's key
        name (the request id's scope). On a follower the reserve parks here and each try is
        forwarded to the leader without a wait, with the caller's Authorization `auth`
        (forwarding.py); `no_wait`: such a try (the wait is the follower's)."""
        try:
            cmd, wait_ms = validate.reserve(body, self.limits, validate.request_slot(who, rid, "reserve", body))
        except ApiError as e:
            return e.result
        if no_wait:
            wait_ms = 0
        if self.must_forward():
            def submit(_cmd):
                return self.forward("reserve", body, rid, None, auth, _NO_WAIT, who)
        else:
            submit = self.proposer.submit
        return await self._reserve_loop(cmd, wait_ms, body, alive, owner, submit, submit is not self.proposer.submit)

    async def _reserve_loop(self, cmd, wait_ms, body, alive, owner, submit, force=False):
        """reserve's tries and parking: `submit(cmd)` proposes (or forwards) one try. `force`: the
        first try goes whatever this node's state says (a follower's may lag the leader's by the
        entry the client has just had committed: read your writes)."""
        slot = cmd[1]
        queue_names = ops.reserve_queue_names(cmd)
        worker = body.get("worker_id")
        seen = self.workers_seen
        seen.note(queue_names, worker)
        loop = self.loop
        deadline = loop.time() + wait_ms / 1000.0
        epoch = self.leader_epoch
        wake_owed = False        # woken for a ready job and not (yet) reserved: pass it on when leaving
        try:
            while True:
                if alive is not None and not alive():
                    return 200, {"jobs": []}        # the client has gone: take nothing for it
                if self.stopping or epoch != self.leader_epoch:
                    return 200, {"jobs": []}        # leadership moved while parked
                if force or slot is not None and self.state.machine.has_request(slot) or self._has_ready(queue_names):
                    force = False
                    result = await submit(cmd)
                    if result[0] != 200:
                        return result
                    wake_owed = False
                    if result[1]["jobs"]:
                        return result
                else:
                    wake_owed = False               # taken by another reserve meanwhile
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return 200, {"jobs": []}
                if self.parked >= self.max_parked:
                    bounds.hit("max_parked_reserves")
                    return error("overloaded", f"{self.max_parked} long polls are waiting on this node "
                                               "(tuning.max_parked_reserves); retry after a moment")
                if owner is not None and owner.parked >= owner.max_parked:
                    bounds.hit("max_session_parked_reserves")
                    return error("overloaded", f"{owner.max_parked} long polls are waiting in this session "
                                               "(tuning.max_session_parked_reserves); retry after a moment")
                w = self._park(tuple(dict.fromkeys(queue_names)), alive, owner)
                fut = w.fut
                if self._has_ready(queue_names):    # an apply slipped in before we parked
                    fut.set_result(True)
                timer = loop.call_later(remaining, _time_up, fut)
                seen.park(w.names, worker)          # a worker waiting on a queue is there
                try:
                    woken = await fut
                finally:
                    timer.cancel()
                    seen.unpark(w.names, worker)
                    self._unpark(w)
                    if not fut.done():
                        fut.cancel()
                    elif not fut.cancelled() and fut.result() is True:
                        wake_owed = True
                if woken is None:
                    return 200, {"jobs": []}        # the time is up
        finally:
            if wake_owed:
                self._schedule_wake(queue_names)

    def ack(self, job_id, body, rid=None, who=None, auth=None) -> asyncio.Future:
        return self.run("ack", body, rid, job_id, who, auth)

    def ack_batch(self, body, rid=None, who=None, auth=None) -> asyncio.Future:
        return self.run("ack_batch", body, rid, None, who, auth)

    def nack(self, job_id, body, rid=None, who=None, auth=None) -> asyncio.Future:
        return self.run("nack", body, rid, job_id, who, auth)

    def extend(self, job_id, body, rid=None, who=None, auth=None) -> asyncio.Future:
        return self.run("extend", body, rid, job_id, who, auth)

    def release(self, job_id, body, rid=None, who=None, auth=None) -> asyncio.Future:
        return self.run("release", body, rid, job_id, who, auth)

    def drain(self, body, rid=None, who=None, auth=None) -> asyncio.Future:
        return self.run("drain", body, rid, None, who, auth)
