"""A worker loop on top of the async client: bounded concurrency, long-poll reserve, handler
dispatch by job type, automatic lease extension and graceful shutdown.

    async def send_welcome(job):
        await smtp.send(...)                 # return -> ack
        raise RetryAfter(60_000, "smtp down")  # or Retry(...), Permanent(...), any exception

    async with Client(urls) as client:
        worker = Worker(client, ["emails"], {"send_welcome": send_welcome}, concurrency=16)
        await worker.run(install_signal_handlers=True)     # until SIGTERM/SIGINT or worker.stop()

Outcomes of a handler:

| handler                         | the worker sends                                   |
|---------------------------------|----------------------------------------------------|
| returns (any value)             | ack                                                |
| returns `Result(data, encoding)` | ack with that result (kept if its queue retains results) |
| raises `Retry(reason)`          | nack, strategy `default` (the queue retry policy)  |
| raises `RetryAfter(ms, reason)` | nack, strategy `delay` with `delay_ms = ms`        |
| raises `Permanent(reason)`      | nack, strategy `dead_letter` (cause `rejected`)    |
| raises anything else            | nack `default`, reason "handler raised T: message" |
| raises a `no_retry` type        | nack, strategy `dead_letter` at once               |
| runs past the job's timeout_ms  | cancelled; nack `default`, reason "timeout", at once |
| no handler for the job type     | release (no attempt used) after `foreign_job_delay` (5 s), unless `catch_all` |
| lease lost (extend or ack/nack answered `LeaseLost`) | nothing: the handler is cancelled if still running |

On the last attempt a `default`/`delay` nack dead-letters the job (`attempts_exhausted`), as the
server decides (docs/semantics.md "Dead letters").

Lease extension — against the real expiry. The server clamps leases (to the queue's
`max_lease_duration_ms`), so the worker never budgets against the lease it asked for: it budgets
against `lease_expires_at_ms` from the reserve (and then from each extend), which is a time on
the *leader's* clock. To turn that into a local deadline the worker estimates the offset between
the server's clock and its own from `GET /v1/server-info` (`server_time_ms`), keeping the sample
with the shortest round trip out of a few, and refreshes it every `clock_refresh_s`. Half that
round trip is the estimate's uncertainty and is subtracted from every deadline. A grant is also
never longer than the lease requested, counted from the moment the reserve/extend answer
arrived (the grant happened before), so the local deadline is the smaller of the two — a clock
estimate that is off cannot make the worker believe in more lease than it can have. (The job's
own `enqueued_at_ms` was considered and rejected as a clock source: it is old for any job that
waited in the queue.) The worker extends a job when `extend_margin` (a fraction, default 1/3) of
its granted lease is left, but never with less than `min_extend_margin_ms` left, and asks for
`lease_ms` again each time. An extend that fails for a transient reason (no leader during an
election, timeouts) is retried while the handler keeps running: the worker gives up a job only
when the cluster says so (`LeaseLost`), never on a local guess — a lease that lapsed locally is
still the worker's until the leader's sweep expires it, and once it is expired the next extend
or the ack says `LeaseLost`. So every lease loss is observed as `LeaseLost`.

Shutdown: `stop()` (or SIGTERM/SIGINT with `install_signal_handlers=True`, or `run_forever()`)
stops reserving. A long-poll reserve already in flight is not cancelled — the cluster could
have leased jobs to it that a cancelled call would strand until their leases expire — so it is
allowed to end (at most `wait_ms`) and whatever it returned is processed like any other job.
In-flight jobs then get `shutdown_timeout` seconds to finish (their leases are still extended
meanwhile); handlers still running after that are cancelled and their jobs released (no
attempt used: "worker shutting down") so another worker takes them at once. A second signal
cuts the grace period short.

Dead-letter handlers (`dead_letter_handler(job_type)`, `dead_letter_handlers=`) run when this
worker's own nack dead-letters a job, with the job and the error; one that raises is logged and
swallowed, the others still run.

Request ids: every reserve, ack, nack and extend carries the client's own `Request-Id`, reused
across the client's retries, so a retry after a failover is applied once.

Not handled: a handler that blocks the event loop (CPU-bound code, blocking I/O) also blocks
the extender; run such work in a thread (`asyncio.to_thread`), or pass a plain function, which
the worker runs in a thread itself (a thread cannot be cancelled: on lease loss its result is
discarded).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Awaitable, Callable

from .client import (Client, Conflict, HandlerOutcome, InvalidArgument, Job, LeaseLost, Permanent,
                     PermissionDenied, Result, Retry, RetryAfter, Unauthenticated)

log = logging.getLogger("raftq.worker")

Handler = Callable[[Job], Awaitable[Any]]
FATAL_RESERVE_ERRORS = (InvalidArgument, Conflict, Unauthenticated, PermissionDenied)
MAX_REASON = 1000


# ---------------------------------------------------------------------------- counters
@dataclass
class WorkerStats:
    reserved: int = 0        # jobs received from reserve
    acked: int = 0           # acks the cluster accepted
    nacked: int = 0          # nacks the cluster accepted (dead-lettering ones included)
    dead_lettered: int = 0   # nacks that dead-lettered the job
    lease_lost: int = 0      # jobs given up because extend/ack/nack answered LeaseLost
    failed: int = 0          # handler raised an unexpected exception (or no handler)
    extended: int = 0        # successful lease extensions
    interrupted: int = 0     # handlers cancelled at the end of the shutdown grace period
    errors: int = 0          # calls that failed for good with something other than LeaseLost
    releases: int = 0        # jobs handed back by release (shutdown, foreign job type): no attempt used
    timeouts: int = 0        # handlers cancelled because the job's timeout_ms passed (nacked "timeout")
    cancellation_ignored: int = 0   # cancelled handlers still running after cancel_grace (slot kept)
    dead_letter_handler_errors: int = 0   # dead-letter handlers that raised (logged, swallowed)

    def as_dict(self) -> dict:
        return asdict(self)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class _InFlight:
    __slots__ = ("job", "task", "deadline", "extend_at", "lost", "interrupted", "timeout_at", "timed_out")

    def __init__(self, job: Job):
        self.job = job
        self.task: asyncio.Task | None = None
        self.deadline = 0.0      # local loop time by which the lease surely ends
        self.extend_at = 0.0     # local loop time of the next extension
        self.lost = False
        self.interrupted = False
        self.timeout_at: float | None = None     # local loop time the job's timeout_ms passes
        self.timed_out = False


class ExecutionTimeout(TimeoutError):
    """The error a dead-letter handler gets for a job whose handler ran past its timeout_ms."""


class Worker:
    def __init__(self, client: Client, queues, handlers: dict[str, Handler] | None = None, *,
                 catch_all: Handler | None = None, concurrency: int = 16, lease_ms: int = 30_000,
                 wait_ms: int = 5_000, extend_margin: float = 1 / 3, min_extend_margin_ms: int = 250,
                 shutdown_timeout: float = 30.0, worker_id: str | None = None,
                 reserve_error_backoff: float = 1.0, clock_refresh_s: float = 60.0,
                 on_outcome: Callable[[Job, str, BaseException | None], None] | None = None,
                 foreign_job_delay: float = 5.0, no_retry: tuple = (), cancel_grace: float = 1.0,
                 dead_letter_handlers: dict | None = None):
        if isinstance(queues, str):
            queues = [queues]
        if not queues:
            raise ValueError("give at least one queue")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if lease_ms <= 0 or wait_ms < 0:
            raise ValueError("lease_ms must be > 0 and wait_ms >= 0")
        if not 0 < extend_margin < 1:
            raise ValueError("extend_margin is the fraction of the lease left when extending: 0 < x < 1")
        self.client = client
        self.queues = list(queues)
        self.handlers = dict(handlers or {})
        self.catch_all = catch_all
        self.concurrency = concurrency
        self.lease_ms = int(lease_ms)
        self.wait_ms = int(wait_ms)
        self.extend_margin = extend_margin
        self.min_extend_margin_ms = min_extend_margin_ms
        self.shutdown_timeout = shutdown_timeout
        self.worker_id = worker_id or default_worker_id()
        self.reserve_error_backoff = reserve_error_backoff
        self.clock_refresh_s = clock_refresh_s
        self.on_outcome = on_outcome
        if foreign_job_delay < 0 or cancel_grace < 0:
            raise ValueError("foreign_job_delay and cancel_grace must be >= 0 (seconds)")
        self.foreign_job_delay = foreign_job_delay
        self.no_retry = tuple(no_retry)
        self.cancel_grace = cancel_grace
        # job_type (None: every type) -> [handler(job, error)], called when this worker's nack
        # dead-letters the job
        self.dead_letter_handlers: dict[str | None, list] = {}
        for jt, fns in (dead_letter_handlers or {}).items():
            for fn in (fns if isinstance(fns, (list, tuple)) else [fns]):
                self.dead_letter_handler(jt, fn)
        self.stats = WorkerStats()
        # server clock - local wall clock, and the uncertainty of that estimate (ms)
        self.clock_offset_ms = 0.0
        self.clock_error_ms = 0.0
        self._clock_synced_at: float | None = None
        self._inflight: dict[tuple[str, int], _InFlight] = {}
        self._tasks: set[asyncio.Task] = set()        # one per job
        self._background: set[asyncio.Task] = set()   # clock refreshes
        self._stopping: asyncio.Event | None = None
        self._capacity: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._running = False
        self._fatal: BaseException | None = None
        self._hurry_task: asyncio.Task | None = None
        self._interrupt: asyncio.Future | None = None   # set when the grace period ends: wakes supervisors
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ registration
    def handle(self, job_type: str, fn: Handler | None = None):
        """Register a handler; usable as a decorator: `@worker.handle("send")`."""
        def register(f):
            self.handlers[job_type] = f
            return f
        return register(fn) if fn is not None else register

    def dead_letter_handler(self, job_type: str | None = None, fn=None):
        """Register a dead-letter handler `fn(job, error)` (a coroutine function or a plain one)
        for `job_type`, or for every type with None; usable as a decorator:
        `@worker.dead_letter_handler("send")`. Called when this worker's own nack dead-letters
        the job (its last attempt failed, `Permanent`, a `no_retry` exception, a timeout on the
        last attempt) with the job and the error; the type's handlers first, then the ones for
        every type, in the order registered. One that raises is logged and swallowed; the
        others still run."""
        def register(f):
            self.dead_letter_handlers.setdefault(job_type, []).append(f)
            return f
        return register(fn) if fn is not None else register

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """Stop reserving; in-flight jobs get `shutdown_timeout` seconds to finish. A second
        call ends the grace period at once. Call it on the worker's event loop (or use
        `stop_threadsafe`)."""
        if self._stopping is None:
            self._stopping, self._capacity, self._hurry = asyncio.Event(), asyncio.Event(), asyncio.Event()
        if self._stopping.is_set():
            self._hurry.set()
        self._stopping.set()
        self._capacity.set()

    def stop_threadsafe(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.stop)

    def run_forever(self) -> WorkerStats:
        """Blocking: run on a new event loop until SIGTERM/SIGINT, then shut down gracefully."""
        async def main():
            try:
                await self.run(install_signal_handlers=True)
            finally:
                await self.client.close()
        asyncio.run(main())
        return self.stats

    async def run(self, install_signal_handlers: bool = False) -> WorkerStats:
        """Reserve and process jobs until `stop()`; then finish in-flight jobs within
        `shutdown_timeout`. Raises the reserve error that stopped it, if one did (bad queue
        names, authentication)."""
        if self._running:
            raise RuntimeError("this worker is already running")
        self._running = True
        self._loop = loop = asyncio.get_running_loop()
        if self._stopping is None:
            self._stopping, self._capacity, self._hurry = asyncio.Event(), asyncio.Event(), asyncio.Event()
        signals = []
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    signals.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass            # not the main thread, or no signal support
        self._hurry_task = loop.create_task(self._hurry.wait())
        self._interrupt = loop.create_future()
        try:
            await self._sync_clock()
            await self._reserve_loop()
            await self._finish_in_flight()
        except asyncio.CancelledError:
            # Not graceful: abandon the jobs; their leases expire and they are redelivered.
            for t in list(self._tasks):
                t.cancel()
            raise
        finally:
            self._hurry_task.cancel()
            for t in list(self._background):
                t.cancel()
            self._stopping = self._capacity = self._hurry = None     # runnable again
            self._interrupt = None
            for sig in signals:
                loop.remove_signal_handler(sig)
            self._running = False
        if self._fatal is not None:
            fatal, self._fatal = self._fatal, None
            raise fatal
        return self.stats

    def _on_signal(self, sig):
        log.info("worker %s: %s received, %s", self.worker_id, signal.Signals(sig).name,
                 "ending the grace period" if self.stopping else "shutting down gracefully")
        self.stop()

    async def _sleep_unless_stopping(self, seconds: float):
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    # ------------------------------------------------------------------ clock
    async def _sync_clock(self, samples: int = 3):
        """Estimate server clock - local clock from server-info round trips (best of a few)."""
        best = None
        for _ in range(samples):
            t0 = time.time() * 1000.0
            try:
                info = await self.client.call("server_info", "GET", "/v1/server-info", mutating=False,
                                              timeout=min(self.client.timeout, 5.0))
            except Exception as e:       # keep the old estimate (0 at first: same clock assumed)
                log.warning("worker %s: server-info failed, keeping clock offset %.0f ms: %s",
                            self.worker_id, self.clock_offset_ms, e)
                break
            t1 = time.time() * 1000.0
            rtt = max(0.0, t1 - t0)
            sample = (rtt, info["server_time_ms"] - (t0 + t1) / 2.0)
            if best is None or sample[0] < best[0]:
                best = sample
        if best is not None:
            self.clock_error_ms, self.clock_offset_ms = best[0] / 2.0, best[1]
        self._clock_synced_at = asyncio.get_running_loop().time()

    def _maybe_refresh_clock(self):
        loop = asyncio.get_running_loop()
        if self._clock_synced_at is not None and loop.time() - self._clock_synced_at >= self.clock_refresh_s:
            self._clock_synced_at = loop.time()
            t = loop.create_task(self._sync_clock())
            self._background.add(t)
            t.add_done_callback(self._background.discard)

    def _set_lease(self, rec: _InFlight, expires_at_ms: int | None):
        """Local deadline and next extension time from the real expiry (see the module doc)."""
        now = asyncio.get_running_loop().time()
        if expires_at_ms is None:
            left_ms = float(self.lease_ms)
        else:
            server_now = time.time() * 1000.0 + self.clock_offset_ms
            left_ms = expires_at_ms - server_now - self.clock_error_ms
        left_ms = min(left_ms, float(self.lease_ms))
        rec.deadline = now + left_ms / 1000.0
        margin_ms = max(left_ms * self.extend_margin, float(self.min_extend_margin_ms))
        rec.extend_at = rec.deadline - margin_ms / 1000.0

    # ------------------------------------------------------------------ reserving
    async def _reserve_loop(self):
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            free = self.concurrency - len(self._inflight)
            if free <= 0:
                self._capacity.clear()
                await self._capacity.wait()
                continue
            self._maybe_refresh_clock()
            t0 = loop.time()
            # Not cancelled by stop(): see the module doc. Only a second stop() (hurry) cuts it.
            rtask = loop.create_task(self.client.reserve(self.queues, self.lease_ms, wait_ms=self.wait_ms,
                                                         max_jobs=free, worker_id=self.worker_id))
            try:
                await asyncio.wait({rtask, self._hurry_task}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                rtask.cancel()
                raise
            if not rtask.done():
                rtask.cancel()
                try:
                    await rtask
                except BaseException:
                    pass
                break
            try:
                jobs = rtask.result()
            except FATAL_RESERVE_ERRORS as e:
                log.error("worker %s: reserve refused, stopping: %s", self.worker_id, e)
                self._fatal = e
                self.stats.errors += 1
                self.stop()
                break
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("worker %s: reserve failed, retrying in %.1fs: %s", self.worker_id,
                            self.reserve_error_backoff, e)
                self.stats.errors += 1
                await self._sleep_unless_stopping(self.reserve_error_backoff)
                continue
            for job in jobs:
                self._start(job)
            if not jobs and loop.time() - t0 < min(0.1, self.wait_ms / 2000.0):
                # An empty answer long before wait_ms: the node is stopping or leadership moved
                # while the reserve was parked. Do not spin.
                await self._sleep_unless_stopping(0.25)

    def _start(self, job: Job):
        self.stats.reserved += 1
        rec = _InFlight(job)
        self._set_lease(rec, job.lease_expires_at_ms)
        key = (job.id, job.attempt)
        self._inflight[key] = rec
        t = asyncio.get_running_loop().create_task(self._process(rec), name=f"raftq-job-{job.id}")
        self._tasks.add(t)

        def done(task):
            self._tasks.discard(task)
            self._inflight.pop(key, None)
            if self._capacity is not None:
                self._capacity.set()
            if not task.cancelled() and task.exception() is not None:      # a bug here, not in a handler
                log.error("worker %s: job %s: %r", self.worker_id, job.id, task.exception())
        t.add_done_callback(done)

    # ------------------------------------------------------------------ one job
    def _handler_for(self, job: Job) -> Handler | None:
        return self.handlers.get(job.job_type) or self.catch_all

    @staticmethod
    async def _invoke(handler, job: Job):
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
            return await handler(job)
        result = await asyncio.to_thread(handler, job)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _process(self, rec: _InFlight):
        job = rec.job
        handler = self._handler_for(job)
        if handler is None:
            # Another service's job: hand it back without using an attempt, after
            # foreign_job_delay, so a worker that has the handler takes it.
            await self._release(job, int(self.foreign_job_delay * 1000), f"no handler for job_type {job.job_type}")
            return
        loop = asyncio.get_running_loop()
        rec.task = loop.create_task(self._invoke(handler, job))
        if job.timeout_ms:
            rec.timeout_at = loop.time() + job.timeout_ms / 1000.0
        try:
            await self._supervise(rec)
        except asyncio.CancelledError:          # run() itself was cancelled: not graceful
            rec.task.cancel()
            raise
        if rec.lost:
            return                          # counted and reported by _supervise: send nothing
        task = rec.task
        if rec.timed_out:
            # Nacked at once (a failure, reason "timeout") so the job is retried elsewhere; the
            # slot stays taken until the handler really ends.
            self.stats.timeouts += 1
            log.info("worker %s: job %s (%s) attempt %d ran past its timeout of %d ms; cancelled",
                     self.worker_id, job.id, job.job_type, job.attempt, job.timeout_ms)
            err = ExecutionTimeout(f"the handler ran longer than timeout_ms ({job.timeout_ms})")
            await self._nack(job, Retry.default(), "timeout", err)
            await self._wait_cancelled(rec)
            return
        if rec.interrupted:
            # The grace period is over: handed back without using an attempt (a release, not a
            # nack), ready at once for another worker.
            await self._release(job, 0, "worker shutting down")
            await self._wait_cancelled(rec)
            return
        if task.cancelled():
            self.stats.failed += 1
            await self._nack(job, Retry.default(), "handler was cancelled", asyncio.CancelledError())
            return
        exc = task.exception()
        if exc is None:
            ret = task.result()
            await self._ack(job, ret if isinstance(ret, Result) else None)
        elif isinstance(exc, Permanent):
            await self._nack(job, Retry.dead_letter(), exc.reason, exc)
        elif isinstance(exc, RetryAfter):
            await self._nack(job, Retry.delay(exc.delay_ms), exc.reason, exc)
        elif isinstance(exc, Retry):
            await self._nack(job, Retry.default(), exc.reason, exc)
        elif self.no_retry and isinstance(exc, self.no_retry):
            self.stats.failed += 1
            log.info("worker %s: job %s (%s) attempt %d raised %r (no_retry): dead-lettering it",
                     self.worker_id, job.id, job.job_type, job.attempt, exc)
            await self._nack(job, Retry.dead_letter(), f"handler raised {type(exc).__name__}: {exc}", exc)
        else:
            self.stats.failed += 1
            log.info("worker %s: job %s (%s) attempt %d raised %r", self.worker_id, job.id, job.job_type,
                     job.attempt, exc)
            await self._nack(job, Retry.default(), f"handler raised {type(exc).__name__}: {exc}", exc)

    async def _wait_cancelled(self, rec: _InFlight):
        """After a cancel: wait for the handler to end. One still running after cancel_grace
        ignores its cancellation: logged once and counted, and it keeps its slot (this job's
        task, counted against `concurrency`) until it really ends."""
        task = rec.task
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=self.cancel_grace)
        if not done:
            self.stats.cancellation_ignored += 1
            log.warning("worker %s: ignored cancellation: job %s (%s) attempt %d still holds its worker slot",
                        self.worker_id, rec.job.id, rec.job.job_type, rec.job.attempt)
            await asyncio.wait({task})
        if not task.cancelled():
            task.exception()                # retrieved: no "exception never retrieved" warning

    async def _supervise(self, rec: _InFlight):
        """Wait for the handler, extending the lease as its real expiry approaches."""
        loop = asyncio.get_running_loop()
        task = rec.task
        retry_pause = 0.1
        while not task.done():
            if rec.interrupted:
                return                      # shutdown cancelled it: _process releases the job now
            if rec.timeout_at is not None and loop.time() >= rec.timeout_at:
                rec.timed_out = True        # _process nacks it ("timeout") and waits for the handler
                task.cancel()
                return
            delay = rec.extend_at - loop.time()
            if rec.timeout_at is not None:
                delay = min(delay, rec.timeout_at - loop.time())
            if delay > 0:
                await asyncio.wait({task, self._interrupt} if self._interrupt is not None else {task},
                                   timeout=delay, return_when=asyncio.FIRST_COMPLETED)
                continue
            ext = loop.create_task(self.client.extend(rec.job, self.lease_ms))
            try:
                await asyncio.wait({task, ext}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                ext.cancel()
                raise
            if not ext.done():
                ext.cancel()                # the handler finished: its ack/nack follows
                try:
                    await ext
                except BaseException:
                    pass
                break
            try:
                expires = ext.result()
            except LeaseLost as e:
                rec.lost = True
                self.stats.lease_lost += 1
                # job_not_found: the job was deleted (or expired); attempt_mismatch: redelivered.
                log.info("worker %s: job %s attempt %d lost its lease (%s); cancelling the handler",
                         self.worker_id, rec.job.id, rec.job.attempt, e.code)
                task.cancel()
                await self._wait_cancelled(rec)
                self._report(rec.job, "lease_lost", e)
                return
            except Exception as e:
                # Transient (no leader, timeout): the lease is ours until the cluster says
                # otherwise, so keep trying while the handler runs.
                log.warning("worker %s: extend of job %s failed, retrying: %s", self.worker_id, rec.job.id, e)
                rec.extend_at = loop.time() + retry_pause
                retry_pause = min(1.0, retry_pause * 2)
                continue
            retry_pause = 0.1
            self.stats.extended += 1
            self._set_lease(rec, expires)

    async def _ack(self, job: Job, result: Result | None = None):
        if await self._settle(job, "ack", self._ack_call(job, result)) is not None:
            self.stats.acked += 1
            self._report(job, "acked", None)

    async def _ack_call(self, job: Job, result: Result | None):
        """The ack; a handler that returned a Result acks with it (docs/semantics.md "Job
        results"). A result the cluster refuses (larger than max_result_bytes) is logged and the
        job acked without it: the work is done, and running it again would not make it smaller."""
        if result is not None:
            try:
                return await self.client.ack(job, result=result.data, encoding=result.encoding)
            except InvalidArgument as e:
                log.warning("worker %s: the result of job %s was refused (%s); acking without it",
                            self.worker_id, job.id, e)
        return await self.client.ack(job)

    async def _nack(self, job: Job, retry: dict, reason: str | None, error: BaseException | None = None):
        if reason is not None:
            reason = reason[:MAX_REASON]
        answer = await self._settle(job, "nack", self.client.nack(job, reason=reason, retry=retry))
        if answer is not None:
            dead = answer[0]
            self.stats.nacked += 1
            if dead:
                self.stats.dead_lettered += 1
            self._report(job, "dead_lettered" if dead else "nacked", None)
            if dead:
                await self._run_dead_letter_handlers(job, error)

    async def _run_dead_letter_handlers(self, job: Job, error: BaseException | None):
        """Every dead-letter handler for the job's type, then those for every type; one that
        raises is logged and swallowed, and the others still run."""
        for fn in self.dead_letter_handlers.get(job.job_type, []) + self.dead_letter_handlers.get(None, []):
            try:
                if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
                    await fn(job, error)
                else:
                    result = await asyncio.to_thread(fn, job, error)
                    if inspect.isawaitable(result):
                        await result
            except Exception:
                self.stats.dead_letter_handler_errors += 1
                log.exception("worker %s: dead-letter handler %r of job %s (%s) raised (swallowed)",
                              self.worker_id, getattr(fn, "__name__", fn), job.id, job.job_type)

    async def _release(self, job: Job, delay_ms: int, reason: str):
        """Hand the job back without using an attempt (not a failure: a circuit breaker counts
        no release)."""
        if await self._settle(job, "release", self.client.release(job, delay_ms=delay_ms, reason=reason)) is not None:
            self.stats.releases += 1
            self._report(job, "released", None)

    async def _settle(self, job: Job, what: str, call) -> tuple | None:
        """Await an ack or nack: (its answer,) on success, None after counting and reporting a
        lease loss or an error (the job is then redelivered by the cluster)."""
        try:
            return (await call,)
        except LeaseLost as e:
            self.stats.lease_lost += 1
            self._report(job, "lease_lost", e)
        except Exception as e:
            self.stats.errors += 1
            log.warning("worker %s: %s of job %s failed (it will be redelivered): %s", self.worker_id, what, job.id, e)
            self._report(job, "error", e)
        return None

    def _report(self, job: Job, outcome: str, error: BaseException | None):
        if self.on_outcome is not None:
            try:
                self.on_outcome(job, outcome, error)
            except Exception:
                log.exception("on_outcome hook failed")

    # ------------------------------------------------------------------ shutdown
    async def _finish_in_flight(self):
        if not self._tasks:
            return
        log.info("worker %s: waiting up to %.1fs for %d in-flight jobs", self.worker_id,
                 self.shutdown_timeout, len(self._tasks))
        await self._wait_all_or_hurry(set(self._tasks), self._hurry_task)
        for rec in list(self._inflight.values()):
            if rec.task is not None and not rec.task.done():
                rec.interrupted = True
                self.stats.interrupted += 1
                rec.task.cancel()
        if self._interrupt is not None and not self._interrupt.done():
            self._interrupt.set_result(None)    # wakes the supervisors: interrupted jobs are released now
        if self._tasks:
            # Releases of interrupted jobs (sent at once, before waiting for the handlers); a
            # handler that ignores cancellation is given up after this (its job already released).
            done, pending = await asyncio.wait(set(self._tasks), timeout=self.cancel_grace + self.client.timeout + 5.0)
            for t in pending:
                log.warning("worker %s: abandoning %s (ignores cancellation)", self.worker_id, t.get_name())
                t.cancel()

    async def _wait_all_or_hurry(self, pending: set, hurry: asyncio.Task):
        loop = asyncio.get_running_loop()
        end = loop.time() + self.shutdown_timeout
        while True:
            pending = {t for t in pending if not t.done()}
            left = end - loop.time()
            if not pending or left <= 0 or hurry.done():
                return
            await asyncio.wait(pending | {hurry}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
