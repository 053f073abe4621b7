"""`raftq reserve | ack | nack | extend | release | work`: taking work off queues from the shell.

reserve prints JSON Lines on stdout, one compact object per job (nothing when no job came), so a
script reads them with `while read -r job` or jq; ack, nack, extend and release take the job id
and the attempt it was delivered with (the fence: a stale attempt is refused, exit 1) and print
one JSON object. `work` runs a command per job through the `Worker` (cluster/shell_worker.py).
The output is JSON with or without --json: these commands exist for scripts.
"""
from __future__ import annotations

import argparse
import base64
import os
import shutil
import sys
import uuid

import orjson

from ..client import Job, LeaseLost, Retry
from ..shell_worker import Run, ShellWorker, describe_exit, worker_log
from .commands import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, CliError, Ctx

WORK_USAGE = "raftq work [options] QUEUE [QUEUE ...] -- COMMAND [ARG ...]"


def line(obj) -> None:
    sys.stdout.write(orjson.dumps(obj).decode() + "\n")
    sys.stdout.flush()


def job_json(job: Job) -> dict:
    """A reserved job for scripts: the payload as text when it is UTF-8, else base64
    (`payload_base64` says which); every field present, null when the job has none."""
    payload, b64 = None, False
    if job.payload is not None:
        try:
            payload = job.payload.decode("utf-8")
        except UnicodeDecodeError:
            payload, b64 = base64.b64encode(job.payload).decode(), True
    return {"id": job.id, "queue": job.queue, "job_type": job.job_type, "attempt": job.attempt,
            "max_attempts": job.max_attempts, "releases": job.releases, "attempts_used": job.attempts_used,
            "priority": job.priority, "payload": payload, "payload_base64": b64, "encoding": job.encoding,
            "lease_expires_at_ms": job.lease_expires_at_ms, "enqueued_at_ms": job.enqueued_at_ms,
            "scheduled_at_ms": job.scheduled_at_ms, "deadline_at_ms": job.deadline_at_ms,
            "timeout_ms": job.timeout_ms, "custom": job.custom, "trace_context": job.trace_context}


def _positive(name: str, value, allow_zero: bool = False) -> None:
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise CliError(f"{name} must be {'at least 0' if allow_zero else 'positive'}", EXIT_UNREACHABLE)


# ---------------------------------------------------------------------------- reserve
async def cmd_reserve(ctx: Ctx) -> int:
    a = ctx.args
    _positive("--lease-ms", a.lease_ms)
    _positive("--max", a.max)
    _positive("--wait-ms", a.wait_ms, allow_zero=True)
    ctx.mutating = True          # a reserve that failed midway may have leased jobs
    jobs = await ctx.client.reserve(a.queues, a.lease_ms, wait_ms=a.wait_ms, max_jobs=a.max,
                                    worker_id=a.worker_id)
    ctx.mutating = False
    for job in jobs:
        line(job_json(job))
    return EXIT_OK


# ---------------------------------------------------------------------------- ack, nack, extend, release
def job_id(text: str) -> str:
    try:
        canonical = str(uuid.UUID(text.strip()))
    except ValueError:
        raise CliError(f"{text!r} is not a job id (a UUID, as `raftq reserve` prints it)", EXIT_UNREACHABLE)
    return canonical


async def _settle(ctx: Ctx, call, jid: str, attempt: int):
    """Run ack/nack/extend/release; a refusal of the fence says plainly that the job is not ours."""
    if attempt < 1:
        raise CliError("--attempt must be at least 1 (the attempt the job was delivered with)", EXIT_UNREACHABLE)
    ctx.mutating = True
    try:
        out = await call
    except LeaseLost as e:
        now = e.details.get("attempt") if e.code == "attempt_mismatch" else None
        where = f" (it is in flight under attempt {now})" if now is not None else ""
        raise CliError(f"{ctx.doing} refused ({e.code}): job {jid} is not in flight under attempt {attempt}{where}; "
                       "you no longer own it: it was acked, released, dead-lettered, deleted, its lease "
                       "expired, or it was reserved again", EXIT_FAILED) from None
    ctx.mutating = False
    return out


async def cmd_ack(ctx: Ctx) -> int:
    a = ctx.args
    jid = job_id(a.id)
    result = a.result
    if a.result_file is not None:
        with open(a.result_file, "rb") as f:
            result = f.read()
    await _settle(ctx, ctx.client.ack(jid, a.attempt, result=result, encoding=a.result_encoding), jid, a.attempt)
    line({"job_id": jid, "attempt": a.attempt, "acked": True})
    return EXIT_OK


async def cmd_nack(ctx: Ctx) -> int:
    a = ctx.args
    jid = job_id(a.id)
    if a.dead_letter:
        retry = Retry.dead_letter()
    elif a.delay_ms is not None:
        _positive("--delay-ms", a.delay_ms, allow_zero=True)
        retry = Retry.delay(a.delay_ms)
    else:
        retry = Retry.default()
    dead = await _settle(ctx, ctx.client.nack(jid, a.attempt, reason=a.reason, retry=retry), jid, a.attempt)
    line({"job_id": jid, "attempt": a.attempt, "nacked": True, "retry": retry, "dead_lettered": dead})
    return EXIT_OK


async def cmd_extend(ctx: Ctx) -> int:
    a = ctx.args
    jid = job_id(a.id)
    _positive("--lease-ms", a.lease_ms)
    expires = await _settle(ctx, ctx.client.extend(jid, a.lease_ms, a.attempt), jid, a.attempt)
    line({"job_id": jid, "attempt": a.attempt, "lease_expires_at_ms": expires})
    return EXIT_OK


async def cmd_release(ctx: Ctx) -> int:
    a = ctx.args
    jid = job_id(a.id)
    _positive("--delay-ms", a.delay_ms, allow_zero=True)
    await _settle(ctx, ctx.client.release(jid, a.attempt, delay_ms=a.delay_ms, reason=a.reason), jid, a.attempt)
    line({"job_id": jid, "attempt": a.attempt, "released": True})
    return EXIT_OK


# ---------------------------------------------------------------------------- work
OUTCOME_WORDS = {"acked": "acked", "nacked": "nacked (will be retried)", "dead_lettered": "dead-lettered",
                 "released": "released (no attempt used)", "lease_lost": "lease lost (not ours any more)",
                 "error": "not settled (the cluster redelivers it when the lease ends)"}


def progress_printer(as_json: bool):
    """One line per job on stderr: stdout is the commands'."""
    def report(job: Job, run: Run, outcome: str, error: BaseException | None) -> None:
        if as_json:
            text = orjson.dumps({"job_id": job.id, "attempt": job.attempt, "queue": job.queue,
                                 "job_type": job.job_type, "exit_code": run.exit_code, "ended_by": run.why,
                                 "duration_s": round(run.duration, 3), "outcome": outcome,
                                 "error": str(error) if error else None}).decode()
        else:
            how = run.why if run.why else describe_exit(run.exit_code) if run.exit_code is not None else "not run"
            text = (f"raftq work: {job.id} attempt {job.attempt}: {how} after {run.duration:.2f}s: "
                    f"{OUTCOME_WORDS.get(outcome, outcome)}" + (f" ({error})" if error else ""))
        try:
            print(text, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
    return report


async def cmd_work(ctx: Ctx) -> int:
    a = ctx.args
    for name, value, zero in (("--concurrency", a.concurrency, False), ("--lease-ms", a.lease_ms, False),
                              ("--wait-ms", a.wait_ms, True), ("--job-timeout", a.job_timeout, False),
                              ("--grace", a.grace, True), ("--max-jobs", a.max_jobs, False)):
        _positive(name, value, allow_zero=zero)
    check_command(a.argv[0])
    worker_log("raftq work")
    shell = ShellWorker(ctx.client, a.queues, a.argv, urls=ctx.urls, concurrency=a.concurrency,
                        lease_ms=a.lease_ms, wait_ms=a.wait_ms, timeout=a.job_timeout, grace=a.grace,
                        max_jobs=a.max_jobs, exit_when_empty=a.exit_when_empty, worker_id=a.worker_id,
                        on_line=progress_printer(ctx.json), echo_stderr=sys.stderr.buffer,
                        result_encoding=a.result_encoding)
    s = await shell.run()
    print(f"raftq work: stopped: {s.acked} acked, {s.nacked - s.dead_lettered} nacked, {s.dead_lettered} "
          f"dead-lettered, {s.releases} released, {s.lease_lost} lease lost", file=sys.stderr, flush=True)
    return EXIT_OK


def check_command(name: str) -> None:
    """A command that cannot run would fail every job until each is dead-lettered: refuse it first."""
    found = (os.path.isfile(name) and os.access(name, os.X_OK)) if os.sep in name else shutil.which(name)
    if not found:
        raise CliError(f"work: cannot run {name!r}: " + ("not an executable file" if os.sep in name
                                                         else "not found on PATH"), EXIT_UNREACHABLE)


def split_work_args(args, head_parser: argparse.ArgumentParser) -> None:
    """`work` takes everything after its options as one list (argparse would drop the `--` and
    with it the line between queue names and the command): split it at the first `--`, and
    parse what comes before (queue names, options given after them) into the same namespace."""
    words = list(args.words)
    if "--" not in words:
        head_parser.error("give the command after `--`: " + WORK_USAGE)
    cut = words.index("--")
    head, args.argv = words[:cut], words[cut + 1:]
    if not args.argv:
        head_parser.error("no COMMAND after `--`: " + WORK_USAGE)
    head_parser.parse_args(head, namespace=args)


# ---------------------------------------------------------------------------- parsers
def _fence_args(p) -> None:
    p.add_argument("id", metavar="ID", help="the job id, as `raftq reserve` printed it")
    p.add_argument("--attempt", type=int, required=True, metavar="N",
                   help="the attempt the job was delivered with (`attempt` in the reserve output): the fence")


def _work_options(p, suppress: bool) -> None:
    """The options of `work`, on its parser and (defaults suppressed) on the parser of what
    comes before `--`, so they are accepted on both sides of the queue names."""
    d = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
    p.add_argument("--concurrency", type=int, default=d(1), metavar="N", help="run up to N commands at once "
                   "(default 1)")
    p.add_argument("--lease-ms", type=int, default=d(30_000), metavar="MS", help="the lease asked for, "
                   "extended while the command runs (default 30000)")
    p.add_argument("--wait-ms", type=int, default=d(5_000), metavar="MS", help="each reserve waits up to MS "
                   "for a job (default 5000)")
    p.add_argument("--job-timeout", dest="job_timeout", type=float, default=d(None), metavar="SECONDS",
                   help="kill a command running longer and nack its job (default: no limit; the job's own "
                        "timeout_ms applies either way; --timeout is how long to wait for the cluster)")
    p.add_argument("--grace", type=float, default=d(10.0), metavar="SECONDS", help="on SIGTERM/SIGINT, let "
                   "running commands finish for this long, then kill them and release their jobs (default 10; "
                   "a second signal ends it at once)")
    p.add_argument("--max-jobs", type=int, default=d(None), metavar="N", help="take at most N jobs, finish "
                   "them, exit")
    p.add_argument("--exit-when-empty", action="store_true", default=d(False), help="exit once a reserve "
                   "waited --wait-ms, found nothing, and no command is running")
    p.add_argument("--worker-id", default=d(None), metavar="TEXT", help="name this worker in the cluster's "
                   "worker counts (default HOST-PID-RANDOM)")
    p.add_argument("--result", dest="result_encoding", nargs="?", const="text/plain", default=d(None),
                   metavar="ENCODING", help="ack with the command's stdout as the job's result, with this "
                   "encoding (default text/plain); kept when the queue keeps results or a live job depends on "
                   "the job (docs/semantics.md \"Job results\")")


def add_parsers(sub, add_common, run) -> None:
    def client(name, fn, help, description=None):
        p = sub.add_parser(name, help=help, description=description or help)
        add_common(p, top=False)
        p.set_defaults(fn=lambda a, fn=fn: run(a, fn))
        return p

    r = client("reserve", cmd_reserve, "take jobs under a lease; print each as one JSON line",
               "Take up to --max jobs from the queues (polled in the order given) under a lease, and print "
               "each as one line of JSON on stdout: id, attempt (give it to ack, nack, extend, release), "
               "payload (text, or base64 when payload_base64 is true), encoding, lease_expires_at_ms, "
               "custom... Nothing is printed when no job came within --wait-ms (exit 0).")
    r.add_argument("queues", nargs="+", metavar="QUEUE")
    r.add_argument("--lease-ms", type=int, default=30_000, metavar="MS",
                   help="lease length (default 30000; clamped to the queue's max_lease_duration_ms)")
    r.add_argument("--max", type=int, default=1, metavar="N", help="take up to N jobs (default 1)")
    r.add_argument("--wait-ms", type=int, default=0, metavar="MS",
                   help="wait up to MS for a job when none is ready (default 0: answer at once)")
    r.add_argument("--worker-id", metavar="TEXT", help="name the worker in the cluster's worker counts")

    k = client("ack", cmd_ack, "the job is done: remove it (fenced by --attempt)")
    _fence_args(k)
    res = k.add_mutually_exclusive_group()
    res.add_argument("--result", metavar="TEXT", help="the job's result (kept when its queue retains results: "
                     "`raftq result ID`)")
    res.add_argument("--result-file", metavar="FILE", help="the job's result, the bytes of FILE")
    k.add_argument("--result-encoding", metavar="TYPE", help="the result's encoding (default text/plain for "
                   "--result, application/octet-stream for --result-file)")
    n = client("nack", cmd_nack, "the job failed: retry it by the queue's policy, later, or dead-letter it "
               "(fenced by --attempt)")
    _fence_args(n)
    how = n.add_mutually_exclusive_group()
    how.add_argument("--delay-ms", type=int, metavar="MS", help="retry no earlier than MS from now")
    how.add_argument("--dead-letter", action="store_true", help="dead-letter it now (cause rejected)")
    n.add_argument("--reason", "--error", dest="reason", metavar="TEXT", help="why: becomes the job's last_reason")
    e = client("extend", cmd_extend, "more time: a new lease from now (fenced by --attempt)")
    _fence_args(e)
    e.add_argument("--lease-ms", type=int, required=True, metavar="MS", help="the new lease, from now")
    rl = client("release", cmd_release, "hand the job back without using an attempt (fenced by --attempt)")
    _fence_args(rl)
    rl.add_argument("--delay-ms", type=int, default=None, metavar="MS", help="ready again after MS (default: at once)")
    rl.add_argument("--reason", metavar="TEXT", help="why: becomes the job's last_reason")

    w = sub.add_parser("work", usage=WORK_USAGE, help="run a command per job: payload on stdin, ack on exit 0",
                       description="Run COMMAND once per job, with the payload on stdin and the job's fields in "
                                   "RAFTQ_* variables; exit 0 acks the job, anything else nacks it (the exit code "
                                   "and the end of stderr are its reason). The lease is extended while the command "
                                   "runs. One line per job on stderr. docs/client.md \"From the shell\".")
    add_common(w, top=False)
    _work_options(w, suppress=False)
    w.add_argument("words", nargs=argparse.REMAINDER, metavar="QUEUE ... -- COMMAND ...")
    head = argparse.ArgumentParser(prog="raftq work", usage=WORK_USAGE)
    add_common(head, top=False)
    _work_options(head, suppress=True)
    head.add_argument("queues", nargs="+", metavar="QUEUE")

    def work(a):
        split_work_args(a, head)
        return run(a, cmd_work)
    w.set_defaults(fn=work)
