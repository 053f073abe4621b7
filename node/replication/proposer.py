"""Group commit: many requests, one Raft entry; and the bridge back into asyncio.

Requests hand their command to `Proposer.submit`, which returns a future. All commands that
arrive during one turn of the event loop (up to a count and byte bound) go out as one
replicated `apply_batch(now_ms, cmds)`. pysyncobj calls back on its tick thread; the bridge
queues the outcome and wakes the loop once per drain, not once per command.

This is where answers are rendered: the state machine's results are codes and fields
(node/core/ops.py), and `render_answers` turns each into the `(status, body)` its request is
answered with (node/core/answers.py `render`), in the commit callback, only for the batches
proposed on this node. That is on the Raft tick thread right after the apply, outside the
state lock, so the event loop only hands the answers to their requests. Everything a future of
this module holds is such an answer.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time

from .replica import FAIL_REASON

from ..base import bounds
from ..core.answers import render
from ..core.errors import error

# Outcomes that guarantee the command was never applied: safe to retry anywhere.
NOT_APPLIED = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER,
               FAIL_REASON.DISCARDED, FAIL_REASON.REQUEST_DENIED}


def outcome_error(fail_reason) -> tuple[int, dict]:
    if fail_reason == FAIL_REASON.QUEUE_FULL:
        return error("overloaded", "the node's proposal queue is full; retry after a moment")
    if fail_reason in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER):
        return error("no_leader", "no leader is known right now (election in progress?); retry shortly")
    if fail_reason in NOT_APPLIED:
        return error("unavailable", "the request was not applied (leadership changed before commit); "
                     "it is safe to retry", applied=False)
    return error("unavailable", "the outcome is unknown (leadership changed while the request was in flight); "
                 "retry with the same Request-Id", applied=None)


def render_answers(results) -> list:
    """The answers for a batch's results (an answer that is already one passes through)."""
    try:
        return [render(r) for r in results]
    except Exception:
        out = []
        for r in results:
            try:
                out.append(render(r))
            except Exception as exc:            # pragma: no cover - a result no renderer knows
                out.append(error("internal", f"could not render the result: {type(exc).__name__}"))
        return out


class Batch:
    """One proposed batch's futures, and whether its requests have left the in-flight count
    (once: at its commit, its failure or its timeout, whichever comes first); `answered_at` is
    when its answers were ready on the tick thread (perf_counter, for the hand-off stage)."""
    __slots__ = ("futures", "settled", "answered_at")

    def __init__(self, futures: list):
        self.futures = futures
        self.settled = False
        self.answered_at = 0.0


# Where a committed batch's time went, summed in µs over the batches timed (`timed_batches`)
# in Proposer.stats, shown in /v1/cluster `proposer` and turned into means by `raftq bench`
# (docs/performance.md "Where an operation's time goes"). From the flush of the batch on the
# event loop: to_raft (until the tick thread appended it to the leader's log), leader_sync
# (until that tick's journal sync ended), replicate (until a majority had it: followers'
# append, sync and reply, and the leader's next tick), apply (until its results were ready:
# earlier entries of the tick and its own apply), render (rendering its answers), to_loop
# (until the event loop took the answers). Requests wait `queue_us` (summed per request,
# over `commands`) between their submit and the flush.
STAGES = ("to_raft_us", "leader_sync_us", "replicate_us", "apply_us", "render_us", "to_loop_us")


class Bridge:
    """Resolve asyncio futures from pysyncobj's tick thread with at most one loop wake-up per
    drain (measured: 24 µs instead of 44 µs per operation with one wake-up per future)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settle, stats):
        self.loop = loop
        self.settle = settle                # Proposer.settle: a batch's requests are answered
        self.stats = stats                  # Proposer.stats (to_loop_us)
        self.q: collections.deque = collections.deque()
        self.lock = threading.Lock()
        self.scheduled = False

    def complete(self, batch, results, fail_reason):
        self.q.append((batch, results, fail_reason))
        with self.lock:
            if self.scheduled:
                return
            self.scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:        # loop closed during shutdown
            pass

    def _drain(self):
        with self.lock:
            self.scheduled = False
        settle = self.settle
        now = time.perf_counter()
        to_loop = 0
        while self.q:
            batch, results, fail_reason = self.q.popleft()
            if batch.answered_at:           # a timed batch (see Proposer.flush)
                to_loop += now - batch.answered_at
            settle(batch)
            for i, fut in enumerate(batch.futures):
                if fut.done():
                    continue
                if fail_reason == FAIL_REASON.SUCCESS and results is not None:
                    fut.set_result(results[i])
                else:
                    fut.set_result(outcome_error(fail_reason))
        if to_loop:
            self.stats["to_loop_us"] += int(to_loop * 1e6)


class Proposer:
    def __init__(self, state, loop, clock_ms, *, kick=None, max_batch_commands=512, max_batch_bytes=262144,
                 max_inflight=20000, request_timeout_s=5.0, entry_stages=None):
        self.state = state                  # QueueState (its apply_batch is @replicated)
        # () -> [appended, synced, committed] of the entry being applied (node/raft), or None
        self.entry_stages = entry_stages
        self.loop = loop
        self.clock_ms = clock_ms            # () -> leader's stamp, never behind replicated time
        self.kick = kick                    # wakes the Raft tick thread after a proposal
        self.max_batch_commands = max_batch_commands
        self.max_batch_bytes = max_batch_bytes
        self.max_inflight = max_inflight
        self.request_timeout_s = request_timeout_s
        self.pending: list = []             # (cmd, future) waiting for the flush
        self.pending_bytes = 0
        self.pending_since = 0.0            # the sum of the pending requests' submit times
        self.inflight = 0
        self.flush_scheduled = False
        self.stats = collections.Counter()
        self.bridge = Bridge(loop, self.settle, self.stats)
        # (deadline, Batch) per proposed batch, in deadline order: one reaper answers what
        # timed out, instead of an asyncio.wait_for timer per request. A batch's requests
        # leave `inflight` together when it settles (one count per batch, not a done-callback
        # per request: a loop callback less for every request).
        self.outstanding: collections.deque = collections.deque()
        self.reaper: asyncio.Task | None = None
        # The answer every request gets while writes are refused (503 unavailable), or None.
        self.refusal: tuple | None = None

    def submit(self, cmd, size_hint: int = 64, internal: bool = False) -> asyncio.Future:
        fut = self.loop.create_future()
        if self.refusal is not None and not internal:
            # Writes are refused as a whole (the data disk is below its free-space reserve):
            # the answer is set by NodeService's disk monitor, and cleared when space is back.
            fut.set_result(self.refusal)
            self.stats["refused"] += 1
            return fut
        if self.inflight >= self.max_inflight:
            fut.set_result(error("overloaded", f"more than {self.max_inflight} requests in flight on this node; "
                                               "retry after a moment"))
            self.stats["overloaded"] += 1
            bounds.hit("max_inflight")
            return fut
        self.inflight += 1
        self.pending.append((cmd, fut))
        self.pending_bytes += size_hint
        self.pending_since += time.perf_counter()
        if len(self.pending) >= self.max_batch_commands or self.pending_bytes >= self.max_batch_bytes:
            self.flush()
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)
        return fut

    def settle(self, batch: Batch):
        if not batch.settled:
            batch.settled = True
            self.inflight -= len(batch.futures)

    def flush(self):
        self.flush_scheduled = False
        if not self.pending:
            return
        pending, self.pending, self.pending_bytes = self.pending, [], 0
        t_prop = time.perf_counter()
        self.stats["queue_us"] += int((t_prop * len(pending) - self.pending_since) * 1e6)
        self.pending_since = 0.0
        cmds = [c for c, _ in pending]
        futures = [f for _, f in pending]
        batch = Batch(futures)
        self.outstanding.append((self.loop.time() + self.request_timeout_s, batch))
        if self.reaper is None or self.reaper.done():
            self.reaper = self.loop.create_task(self._reap())
        self.stats["batches"] += 1
        self.stats["commands"] += len(cmds)
        bridge = self.bridge

        # Total proposal-to-commit time in µs (only ever added to on the tick thread), so
        # /v1/cluster shows the mean commit latency: commit_us / batches; and its stages.
        stats = self.stats
        entry_stages = self.entry_stages

        def callback(results, fail_reason):
            applied = time.perf_counter()
            stats["commit_us"] += int((applied - t_prop) * 1e6)
            answers = render_answers(results) if results is not None else None
            stamps = entry_stages() if entry_stages is not None and results is not None else None
            if stamps is not None and stamps[2]:
                batch.answered_at = done = time.perf_counter()
                appended, synced, committed = stamps
                stats["timed_batches"] += 1
                stats["to_raft_us"] += int((appended - t_prop) * 1e6)
                stats["leader_sync_us"] += int((synced - appended) * 1e6)
                stats["replicate_us"] += int((committed - synced) * 1e6)
                stats["apply_us"] += int((applied - committed) * 1e6)
                stats["render_us"] += int((done - applied) * 1e6)
            bridge.complete(batch, answers, fail_reason)

        try:
            self.state.apply_batch(self.clock_ms(), cmds, callback=callback)
            if self.kick is not None:
                self.kick()
        except Exception as exc:            # e.g. pickling failure: nothing was proposed
            self.settle(batch)
            for f in futures:
                if not f.done():
                    f.set_result(error("internal", f"could not propose: {type(exc).__name__}: {exc}"))

    async def _reap(self):
        while self.outstanding:
            await asyncio.sleep(0.1)
            now = self.loop.time()
            while self.outstanding and self.outstanding[0][0] <= now:
                _, batch = self.outstanding.popleft()
                self.settle(batch)
                for fut in batch.futures:
                    if not fut.done():
                        self.stats["timeouts"] += 1
                        fut.set_result(error("unavailable", "the request was not committed in time (lost quorum or "
                                             "leadership?); the outcome is unknown: retry with the same Request-Id",
                                             applied=None))
            while self.outstanding and self.outstanding[0][1].settled:
                self.outstanding.popleft()

    def answered(self, result) -> asyncio.Future:
        """A future that already holds `result` (an error found before proposing)."""
        fut = self.loop.create_future()
        fut.set_result(result)
        return fut

    async def run(self, cmd, size_hint: int = 64, internal: bool = False) -> tuple[int, dict]:
        """Propose one command and wait for its committed result, or a mapped failure (a
        request that is not committed within request_timeout_s is answered `unavailable`).
        `internal`: the node's own command (a sweep), proposed even while writes are refused."""
        return await self.submit(cmd, size_hint, internal)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000
