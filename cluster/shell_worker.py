"""`raftq work QUEUE... -- COMMAND ARGS...`: run a shell command per job, on top of `Worker`.

The `Worker` (cluster/worker.py) does the reserving, the concurrency, the lease extension, the
fencing and the graceful stop; this module only turns a job into a process and the process into
a handler outcome:

* the payload goes to the command's stdin, the job's fields to its environment (`job_env`);
* exit 0 is an ack; any other exit (or a signal) is a nack with the queue's retry policy, whose
  reason is the exit code and the end of the command's stderr; with `result_encoding` set
  (`--result`), the command's stdout (up to MAX_RESULT_READ bytes) is the ack's result
  (docs/semantics.md "Job results"), else stdout is the worker's;
* `--timeout` kills the command (its whole process group) and nacks;
* a handler cancelled by the Worker (shutdown grace period over, lease lost, the job's own
  `timeout_ms`) kills the command before it returns, so no command outlives its job's lease.

The command runs in a session of its own: a Ctrl-C in the terminal reaches the worker only, and
the worker decides what happens to running commands (they get the grace period). Killing is
SIGTERM to the command's process group, then SIGKILL after `KILL_AFTER_S`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field

from .client import Job, Result, Retry
from .worker import MAX_REASON, Worker, WorkerStats

KILL_AFTER_S = 2.0          # SIGTERM, then SIGKILL this much later
STDERR_TAIL_BYTES = 2048    # kept of a command's stderr for the nack reason
STDERR_DRAIN_S = 1.0        # a background grandchild may hold stderr open after the command exits
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_RESULT_READ = 16 * 1024 * 1024  # of a command's stdout taken as its result (the cluster's bound is smaller)


def job_env(job: Job, base: dict, urls: list[str], worker_id: str) -> dict:
    """The command's environment: the worker's own, and the job's fields as RAFTQ_* variables.
    Custom fields come both as one JSON object (RAFTQ_CUSTOM, every key and type kept) and, for
    keys that are valid variable names, one variable each (RAFTQ_CUSTOM_<key>, case kept;
    strings as they are, other values as JSON)."""
    env = {k: v for k, v in base.items() if not k.startswith("RAFTQ_CUSTOM")}
    env.update({
        "RAFTQ_JOB_ID": job.id, "RAFTQ_QUEUE": job.queue, "RAFTQ_JOB_TYPE": job.job_type,
        "RAFTQ_ATTEMPT": str(job.attempt), "RAFTQ_MAX_ATTEMPTS": str(job.max_attempts),
        "RAFTQ_ATTEMPTS_USED": str(job.attempts_used), "RAFTQ_PRIORITY": str(job.priority),
        "RAFTQ_ENCODING": job.encoding or "", "RAFTQ_ENQUEUED_AT_MS": str(job.enqueued_at_ms),
        "RAFTQ_CUSTOM": json.dumps(job.custom, ensure_ascii=False),
        # A command that enqueues follow-up work with `raftq enqueue` reaches the same cluster.
        "RAFTQ_URLS": ",".join(urls), "RAFTQ_WORKER_ID": worker_id})
    for key, value in job.custom.items():
        if ENV_NAME.fullmatch(key):
            env[f"RAFTQ_CUSTOM_{key}"] = value if isinstance(value, str) else json.dumps(value)
    # The environment cannot carry a NUL byte (the command would not start): such a value is left
    # out; RAFTQ_CUSTOM still has it, escaped.
    return {k: v for k, v in env.items() if "\0" not in v}


@dataclass
class Run:
    """What became of one command, for the progress line."""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    exit_code: int | None = None
    why: str | None = None          # "timed out", "killed": set when the worker ended it

    @property
    def duration(self) -> float:
        return (self.ended or time.monotonic()) - self.started


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def failure_reason(head: str, stderr_tail: bytes) -> str:
    """`head` and as much of the end of stderr as fits the Worker's reason limit."""
    text = stderr_tail.decode("utf-8", "replace").rstrip()
    if not text:
        return head[:MAX_REASON]
    prefix = f"{head}; stderr: "
    room = MAX_REASON - len(prefix)
    if len(text) > room:
        text = "…" + text[-(room - 1):]
    return prefix + text


async def _feed(stdin: asyncio.StreamWriter, data: bytes | None) -> None:
    # A command that exits without reading its stdin is not an error.
    try:
        if data:
            stdin.write(data)
            await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        try:
            stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass


async def _collect(stream: asyncio.StreamReader, tail: bytearray, echo) -> None:
    """Pass the command's stderr through to ours, keeping its last STDERR_TAIL_BYTES."""
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        tail.extend(chunk)
        del tail[:-STDERR_TAIL_BYTES]
        if echo is not None:
            try:
                echo.write(chunk)
                echo.flush()
            except (OSError, ValueError):
                echo = None


async def _read_all(stream: asyncio.StreamReader, out: bytearray) -> None:
    """A command's stdout, its result: the first MAX_RESULT_READ bytes kept, the rest read and dropped."""
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        out.extend(chunk[:MAX_RESULT_READ - len(out)])


async def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM to the command's process group, SIGKILL after KILL_AFTER_S; returns once it ended."""
    for sig, wait in ((signal.SIGTERM, KILL_AFTER_S), (signal.SIGKILL, None)):
        if proc.returncode is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), wait)
            break
        except asyncio.TimeoutError:
            continue
    # Children that left the group keep running; the ones in it are gone with SIGKILL.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ShellWorker:
    """Runs `argv` once per job through a `Worker`. `max_jobs`: take no more than that many jobs,
    finish them, then stop. `exit_when_empty`: stop once a reserve waited `wait_ms` and found
    nothing while no job was running. `on_line(job, run, outcome, error)` reports each job."""

    def __init__(self, client, queues: list[str], argv: list[str], *, urls: list[str], concurrency: int = 1,
                 lease_ms: int = 30_000, wait_ms: int = 5_000, timeout: float | None = None,
                 grace: float = 10.0, max_jobs: int | None = None, exit_when_empty: bool = False,
                 worker_id: str | None = None, on_line=None, echo_stderr=None, result_encoding: str | None = None):
        self.argv = list(argv)
        self.result_encoding = result_encoding
        self.urls = list(urls)
        self.timeout = timeout
        self.max_jobs = max_jobs
        self.exit_when_empty = exit_when_empty
        self.on_line = on_line
        self.echo_stderr = echo_stderr
        self.taken = 0
        self.runs: dict[tuple[str, int], Run] = {}
        self.worker = Worker(_Budget(client, self), queues, catch_all=self._handle, concurrency=concurrency,
                             lease_ms=lease_ms, wait_ms=wait_ms, shutdown_timeout=grace, worker_id=worker_id,
                             on_outcome=self._outcome,
                             cancel_grace=KILL_AFTER_S + STDERR_DRAIN_S + 1.0)

    async def run(self) -> WorkerStats:
        return await self.worker.run(install_signal_handlers=True)

    # ------------------------------------------------------------------ one job
    async def _handle(self, job: Job) -> None:
        run = self.runs[(job.id, job.attempt)] = Run()
        env = job_env(job, dict(os.environ), self.urls, self.worker.worker_id)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
                stdout=asyncio.subprocess.PIPE if self.result_encoding else None, start_new_session=True)
        except OSError as e:
            run.ended, run.why = time.monotonic(), "not started"
            raise Retry(f"cannot run {self.argv[0]}: {e.strerror or e}") from None
        tail, out = bytearray(), bytearray()
        feeder = asyncio.create_task(_feed(proc.stdin, job.payload))
        reader = asyncio.create_task(_collect(proc.stderr, tail, self.echo_stderr))
        if self.result_encoding:        # read to its end like stderr (_finish_streams)
            reader = asyncio.gather(reader, _read_all(proc.stdout, out))
        try:
            await asyncio.wait_for(proc.wait(), self.timeout)
        except asyncio.TimeoutError:
            run.why = f"timed out after {self.timeout:g}s"
            await kill_group(proc)
        except asyncio.CancelledError:
            # Shutdown grace over, lease lost or the job's timeout_ms: the Worker decides what
            # to tell the cluster; the command must not outlive the decision.
            run.why = "killed"
            await kill_group(proc)
            raise
        finally:
            run.ended, run.exit_code = time.monotonic(), proc.returncode
            await self._finish_streams(feeder, reader)
        if run.why is not None:
            raise Retry(failure_reason(f"{run.why}, killed ({describe_exit(proc.returncode)})", bytes(tail)))
        if proc.returncode != 0:
            raise Retry(failure_reason(describe_exit(proc.returncode), bytes(tail)))
        if self.result_encoding and out:
            return Result(bytes(out), self.result_encoding)

    @staticmethod
    async def _finish_streams(feeder: asyncio.Task, reader: asyncio.Task) -> None:
        feeder.cancel()
        done, _ = await asyncio.wait({reader}, timeout=STDERR_DRAIN_S)
        if not done:
            reader.cancel()
        await asyncio.gather(feeder, reader, return_exceptions=True)

    def _outcome(self, job: Job, outcome: str, error: BaseException | None) -> None:
        run = self.runs.pop((job.id, job.attempt), None) or Run()
        if self.on_line is not None:
            self.on_line(job, run, outcome, error)


class _Budget:
    """The client as the Worker sees it, with --max-jobs and --exit-when-empty applied at
    reserve: the Worker asks for as many jobs as it has room for, which may be more than the
    budget left, and stopping it from outside would cut running jobs short after the grace period
    instead of letting them finish."""

    def __init__(self, client, shell: ShellWorker):
        self._client = client
        self._shell = shell

    def __getattr__(self, name):
        return getattr(self._client, name)

    async def _idle_then_stop(self) -> list:
        # Parked until the jobs taken are done (or a signal stops the worker), then stop.
        w = self._shell.worker
        while w.in_flight and not w.stopping:
            await asyncio.sleep(0.05)
        self._stop()
        return []

    def _stop(self) -> None:
        # Once only: a second stop() is the Worker's "hurry", which would cut the grace period.
        if not self._shell.worker.stopping:
            self._shell.worker.stop()

    async def reserve(self, queues, lease_ms: int, *, wait_ms: int = 0, max_jobs: int = 1, **kw) -> list[Job]:
        s = self._shell
        if s.max_jobs is not None:
            left = s.max_jobs - s.taken
            if left <= 0:
                return await self._idle_then_stop()
            max_jobs = min(max_jobs, left)
        t0 = time.monotonic()
        jobs = await self._client.reserve(queues, lease_ms, wait_ms=wait_ms, max_jobs=max_jobs, **kw)
        s.taken += len(jobs)
        # An empty answer well before wait_ms is a node stepping down, not an empty queue.
        waited = time.monotonic() - t0 >= 0.9 * wait_ms / 1000.0
        if not jobs and s.exit_when_empty and waited and s.worker.in_flight == 0:
            self._stop()
        return jobs


def worker_log(prefix: str) -> None:
    """The Worker's log (signals, shutdown, reserve retries during an election...) as `prefix: message`
    lines: what a person watching the worker wants to know, and no per-job noise (that is on_line)."""
    log = logging.getLogger("raftq.worker")
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter(f"{prefix}: %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False
