"""`GET /v1/jobs/{id}/result` (docs/semantics.md "Job results"): a job's outcome, or a long poll
until it has one, on the node the call was sent to.

Any node's applied state is committed state: a job that has succeeded (retained) or been
dead-lettered there has done so for good, so such an answer is final wherever it is read. Only
"not finished" and "unknown" can lag: the leader answers those from its own state (it has applied
every entry it answered for), a follower asks the leader (a read without a wait) before it parks,
and again when its wait ends. Parked calls wait on this node's applies: after an apply the loop
looks at the job ids parked (cheap: a dict lookup each) and wakes those whose outcome changed.
"""
from __future__ import annotations

import asyncio

import orjson

from ..base import bounds, validate
from ..core.errors import error
from .forwarding import REDIRECT_HEADER

FINISHED = ("succeeded", "dead_lettered")
# Sent by a follower that asks the leader: a node that no longer leads answers 503 from its own
# state instead of asking on (no chain of nodes asking each other during an election).
ASKED_HEADER = "Raftq-Result-Asked"


def answer(job_id: str, state: str, view) -> tuple:
    """The 200 answer for an outcome; its job's result fields at the top level too."""
    body = {"job_id": job_id, "state": state, "job": view}
    if state == "succeeded":
        for k in ("result", "result_dropped", "finished_at_ms", "retained_until_ms"):
            body[k] = view[k]
    return 200, body


def not_found(job_id: str) -> tuple:
    return error("not_found", "no such job (never enqueued, acked in a queue that keeps no results, cancelled, "
                              "dropped, or past its retention)", job_id=job_id)


class ResultWaits:
    """The parked result calls of one node: job id -> {future: the outcome seen when parked}."""

    def __init__(self, loop, outcome):
        self.loop = loop
        self.outcome = lambda job_id: outcome(job_id)[0]     # the job's state on this node now
        self.parked: dict[str, dict] = {}
        self.scheduled = False

    def __bool__(self) -> bool:
        return bool(self.parked)

    def after_apply_thread(self):
        """On the Raft thread after an apply while calls are parked: look at them on the loop."""
        if self.scheduled:
            return
        self.scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._wake)
        except RuntimeError:            # the loop has closed
            pass

    def _wake(self):
        self.scheduled = False
        outcome = self.outcome
        for job_id, futs in list(self.parked.items()):
            now = outcome(job_id)
            for fut, seen in list(futs.items()):
                if now != seen and not fut.done():
                    fut.set_result(True)

    def park(self, job_id: str, seen):
        fut = self.loop.create_future()
        self.parked.setdefault(job_id, {})[fut] = seen
        return fut

    def unpark(self, job_id: str, fut) -> None:
        futs = self.parked.get(job_id)
        if futs is not None:
            futs.pop(fut, None)
            if not futs:
                del self.parked[job_id]

    def leave_all(self):
        for futs in self.parked.values():
            for fut in futs:
                if not fut.done():
                    fut.set_result(False)


class JobResults:
    """Mixin of NodeService: GET /v1/jobs/{id}/result."""

    def _outcome(self, job_id: str):
        with self.state.lock:
            return self.state.machine.job_outcome(job_id)

    async def _leader_outcome(self, job_id: str, auth) -> tuple:
        """A follower asks the leader, without a wait: its (status, body)."""
        headers = {REDIRECT_HEADER: "1", ASKED_HEADER: "1"}
        if auth is not None:
            headers["Authorization"] = auth
        status, raw, _ = await self.forward_http("GET", f"/v1/jobs/{job_id}/result?wait_ms=0", None, headers)
        try:
            return status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return error("unavailable", "the leader's answer could not be read; retry")

    async def job_result(self, job_id, query, auth=None, alive=None, asked=False):
        """The job's outcome now, or after waiting up to `wait_ms` for it to finish. `asked`: a
        follower asks this node as the leader."""
        jid = validate.canonical_uuid(job_id)
        if jid is None:
            return error("invalid_argument", f"job id must be a canonical UUID, got {job_id!r}")
        try:
            wait_ms = int(query.get("wait_ms", "0"))
        except ValueError:
            wait_ms = -1
        if wait_ms < 0:
            return error("invalid_argument", "wait_ms must be an integer >= 0")
        wait_ms = min(wait_ms, self.limits.max_wait_timeout_ms)
        state, view = self._outcome(jid)
        if state in FINISHED:
            return answer(jid, state, view)
        if not self.is_leader():        # a follower's "not finished" or "unknown" may lag: ask the leader
            if asked:
                return error("no_leader", "this node no longer leads; retry")
            got = await self._leader_outcome(jid, auth)
            if got[0] != 200 or got[1].get("state") != "pending" or wait_ms == 0:
                return got
        elif state is None:
            return not_found(jid)
        elif wait_ms == 0:
            return 200, {"job_id": jid, "state": "pending", "job": None}
        return await self._wait_result(jid, wait_ms, auth, alive)

    async def _wait_result(self, jid: str, wait_ms: int, auth, alive):
        """Park until this node's state shows the job finished (or gone), or the wait ends."""
        loop = self.loop
        deadline = loop.time() + wait_ms / 1000.0
        waits = self.result_waits
        while True:
            if self.parked >= self.max_parked:
                bounds.hit("max_parked_reserves")
                return error("overloaded", f"{self.max_parked} long polls are waiting on this node "
                                           "(tuning.max_parked_reserves); retry after a moment")
            # Parked before the state is read: an apply from here on schedules a look (an apply
            # between a read and the park would otherwise find nobody parked and wake nobody).
            fut = waits.park(jid, None)
            waits.parked[jid][fut] = self._outcome(jid)[0]
            self.parked += 1
            timer = loop.call_later(max(0.0, deadline - loop.time()), _time_up, fut)
            try:
                woken = await fut
            finally:
                timer.cancel()
                waits.unpark(jid, fut)
                self.parked -= 1
            state, view = self._outcome(jid)
            if state in FINISHED:
                return answer(jid, state, view)
            if woken is None or woken is False or (alive is not None and not alive()) \
                    or loop.time() >= deadline:
                break
            if state is None and self.is_leader():
                return not_found(jid)
        if self.is_leader() or self.stopping:
            return (200, {"job_id": jid, "state": "pending", "job": None}) if state is not None else not_found(jid)
        return await self._leader_outcome(jid, auth)


def _time_up(fut: asyncio.Future):
    if not fut.done():
        fut.set_result(None)
