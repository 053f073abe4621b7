"""The `raftq` command."""
from __future__ import annotations

import argparse
import sys

from . import commands as C
from . import admin_cmd, backup_cmd, config_cmd, consume_cmd, local_cmd, members_cmd, schedules_cmd
from .commands import DEFAULT_URLS
from .up import cmd_up, default_dir


def cmd_node(args) -> int:
    try:
        from ...node.server import main as node_main
    except ImportError as e:          # a client-only install: pip install raftq
        print(f"raftq node: this install has the client only (missing {e.name}); a node needs the server "
              "extra: pip install 'raftq[server]'", file=sys.stderr)
        return 2
    argv = ["--config", args.config]
    if args.log_level:
        argv += ["--log-level", args.log_level]
    if args.check:
        argv.append("--check")
    return node_main(argv)


COMMON_WITH_VALUE = ("--urls", "--timeout", "--api-key", "--ca", "--cert", "--key")


def add_common(p: argparse.ArgumentParser, top: bool) -> None:
    """The options every client command takes. On the subcommands their default is SUPPRESS, so
    `raftq --json status` and `raftq status --json` both work (a subparser default would
    otherwise overwrite what was given before the command)."""
    d = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    g = p.add_argument_group("cluster options") if not top else p
    g.add_argument("--urls", default=d(None), metavar="URL,...",
                   help="comma-separated node URLs (default: $RAFTQ_URLS, else the `raftq up` defaults "
                        f"{DEFAULT_URLS})")
    g.add_argument("--json", action="store_true", default=d(False), help="print JSON for scripts instead of tables")
    g.add_argument("--timeout", type=float, default=d(10.0), metavar="SECONDS",
                   help="how long to wait for the cluster to serve a request (default 10)")
    g.add_argument("--api-key", default=d(None), metavar="KEY", help="API key (default: $RAFTQ_API_KEY)")
    g.add_argument("--ca", default=d(None), metavar="FILE",
                   help="https:// nodes: trust the CAs in this PEM file instead of the system's (default: $RAFTQ_CA); "
                        "without --urls, the `raftq up` defaults as https://")
    g.add_argument("--cert", default=d(None), metavar="FILE",
                   help="a client certificate (PEM) for nodes that require one, mTLS (default: $RAFTQ_CERT)")
    g.add_argument("--key", default=d(None), metavar="FILE",
                   help="the client certificate's key, unless --cert holds it too (default: $RAFTQ_KEY)")
    g.add_argument("--progress", action="store_true", default=d(False),
                   help="draw progress bars on stderr even when it is not a terminal")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="raftq", description="raftq: a replicated job queue",
        epilog="exit codes: 0 ok; 1 the cluster refused (rejected, not found, no leader for `status`); "
               "2 usage error or no node reachable; 3 no leader served the request in time")
    add_common(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_node(sub)
    _add_up(sub)
    local_cmd.add_parser(sub, argparse.SUPPRESS)
    config_cmd.add_parser(sub, add_common, C.run)
    client_cmd = _client_commands(sub)
    client_cmd("status", C.cmd_status, "every node's own view of the cluster: role, term, indexes, digest, "
               "peers, leader (exit 1 when no node knows a leader)", needs_client=False)
    backup_cmd.add_parsers(sub, client_cmd)
    _add_enqueue(client_cmd)
    _add_queue_and_job_commands(client_cmd)
    admin_cmd.add_parsers(sub, add_common, C.run)
    members_cmd.add_parsers(sub, add_common, C.run)
    schedules_cmd.add_parsers(sub, add_common, C.run)
    consume_cmd.add_parsers(sub, add_common, C.run)
    _add_dlq(sub)
    _add_tools(sub)
    return p


def _client_commands(sub):
    """A function that adds a client command (one that calls the cluster through C.run) to `sub`."""
    def client_cmd(name, fn, help, needs_client=True):
        c = sub.add_parser(name, help=help, description=help)
        add_common(c, top=False)
        c.set_defaults(fn=lambda a, fn=fn: C.run(a, fn, needs_client=needs_client))
        return c
    return client_cmd


def _add_node(sub) -> None:
    n = sub.add_parser("node", help="run one node from its TOML config")
    n.add_argument("--config", required=True)
    n.add_argument("--log-level", default=None)
    n.add_argument("--check", action="store_true", help="check the config and the TLS files it names, then exit "
                   "(0: the node would start)")
    n.set_defaults(fn=cmd_node)


def _add_up(sub) -> None:
    u = sub.add_parser("up", help="run a local cluster on loopback in the foreground: a lab for failover",
                       description="Run a local cluster on loopback in the foreground. A node that dies is "
                                   "reported and restarted after a back-off; `raftq local` acts on it from another "
                                   "terminal; its configs, data, logs and state stay in --dir, and the next "
                                   "`raftq up` on that directory continues the same cluster.")
    u.add_argument("--dir", default=None, metavar="DIR",
                   help=f"configs, data, logs and state (default {default_dir()}; from $XDG_STATE_HOME)")
    u.add_argument("--fresh", action="store_true", help="start over: remove the directory's cluster first")
    u.add_argument("--config", metavar="FILE", help="[limits], [storage], [[queues]], [auth] (and [tuning]) for "
                   "every node, checked as a node checks its config; remembered in DIR/up.toml")
    u.add_argument("--no-restart", action="store_true", help="leave a node that dies down (default: restart it "
                   "after 1 s, longer if it keeps dying)")
    u.add_argument("--nodes", type=int, default=None, help="how many nodes for a new cluster (default 3)")
    u.add_argument("--base-port", type=int, default=None,
                   help="HTTP ports from here, Raft ports from here+100, for a new cluster (default 7001; 0 = any "
                        "free ports); a continued cluster keeps its ports")
    u.add_argument("--durability", choices=("fsync", "memory"), default=None, help="default fsync (or the "
                   "directory's last choice)")
    u.add_argument("--tls", action="store_true", help="the nodes serve https:// with certificates from a throwaway CA "
                   "made in DIR (ca.pem; kept and reused), and it prints how to call them")
    u.add_argument("--mtls", action="store_true", help="--tls, and the nodes require a client certificate signed by "
                   "that CA (DIR/client-cert.pem and client-key.pem are made for you)")
    u.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a leader at start (default 30)")
    u.add_argument("--demo", action="store_true", help="enqueue, reserve and ack a few jobs once the cluster is up")
    u.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)   # the directory is always kept now
    u.add_argument("--exit-after-demo", action="store_true", help=argparse.SUPPRESS)
    u.set_defaults(fn=cmd_up)


def _add_enqueue(client_cmd) -> None:
    e = client_cmd("enqueue", C.cmd_enqueue, "enqueue a job (or --count N jobs) and print the job id(s)")
    e.add_argument("queue", metavar="QUEUE")
    e.add_argument("job_type", metavar="JOB_TYPE")
    data = e.add_argument_group("payload (at most one)")
    data.add_argument("--data", metavar="TEXT", help="the payload as text (encoding application/json when it is a "
                      "JSON object or array, else text/plain)")
    data.add_argument("--data-file", metavar="PATH", help="the payload from a file, `-` for stdin "
                      "(encoding application/octet-stream)")
    data.add_argument("--data-b64", metavar="B64", help="the payload as base64 (encoding application/octet-stream)")
    data.add_argument("--encoding", help="the payload's encoding hint, usually a MIME type")
    e.add_argument("--priority", type=int, help="0..9, 9 served first (default: the queue's default_priority)")
    e.add_argument("--idempotency-key", metavar="KEY", help="deduplicate: a second enqueue with this key "
                   "returns the first job's id")
    e.add_argument("--max-attempts", type=int, metavar="N")
    when = e.add_mutually_exclusive_group()
    when.add_argument("--delay-ms", type=int, metavar="MS", help="run no earlier than now + MS")
    when.add_argument("--scheduled-at-ms", type=int, metavar="EPOCH_MS", help="run no earlier than this instant")
    e.add_argument("--deadline-at-ms", type=int, metavar="EPOCH_MS",
                   help="dead-letter the job (cause expired) if it is not reserved by then")
    e.add_argument("--custom", action="append", metavar="KEY=VALUE", help="a custom field (repeatable); "
                   'numbers and true/false are typed, quote to keep a string: k=\'"42"\'')
    # (not --key: that is the client certificate's key file, an option of every command)
    e.add_argument("--job-key", dest="key_name", metavar="KEY", help="the job's key (a tenant, customer, account) "
                   "for the queue's fairness and per-key limits (default: the --custom field the queue's "
                   "key_field names, if any)")
    e.add_argument("--depends-on", action="append", metavar="ID[:POLICY]", help="wait for this job to end "
                   "(repeatable); POLICY success (the default: fail if it fails), complete or ignore")
    e.add_argument("--count", type=int, default=1, metavar="N",
                   help="enqueue N identical jobs in batches, with a progress bar")
    e.add_argument("--batch-size", type=int, default=256, metavar="N", help=argparse.SUPPRESS)


def _add_queue_and_job_commands(client_cmd) -> None:
    """queues, job, cancel, pause and resume."""
    q = client_cmd("queues", C.cmd_queues, "every queue with its counts and totals, or one queue with its limits")
    q.add_argument("name", nargs="?", metavar="NAME", help="show this queue in detail, limits included; "
                   "`raftq queues close-circuit NAME` closes the queue's circuit breaker (operator); "
                   "`raftq queues keys NAME` lists the queue's keys, most ready jobs first")
    q.add_argument("circuit_queue", nargs="?", metavar="QUEUE", help=argparse.SUPPRESS)
    q.add_argument("--limit", type=int, default=None, metavar="N", help="with `keys NAME`: show at most N keys "
                   "(default 50)")
    q.add_argument("--all", action="store_true", help="with `keys NAME`: show every key")

    j = client_cmd("job", C.cmd_job, "one job: state, attempts, times, payload")
    j.add_argument("id", metavar="ID")
    j.add_argument("--payload", action="store_true", help="write only the raw payload bytes to stdout")

    b = client_cmd("batch", C.cmd_batch, "a batch's status: its counts, pending members and callbacks")
    b.add_argument("id", metavar="ID")
    r = client_cmd("result", C.cmd_result, "wait for a job to finish: its result (exit 0) or its dead letter (1)")
    r.add_argument("id", metavar="ID")
    r.add_argument("--wait", type=float, default=30.0, metavar="S",
                   help="wait up to S seconds for the job to finish (default 30; 0: answer at once); exit 1 "
                        "when it has not")
    r.add_argument("--raw", action="store_true", help="write only the raw result bytes to stdout")

    c = client_cmd("cancel", C.cmd_cancel, "delete jobs: ready, scheduled or in flight (an in-flight job's worker is fenced off; it never comes back)")
    c.add_argument("ids", nargs="+", metavar="ID", help="job ids; `-` reads them from stdin")
    c.add_argument("--cascade", action="store_true", help="also cancel the jobs that wait on it (depends_on), "
                   "transitively; without it such a job is refused")

    for name, help in (("pause", "pause a queue: reserve skips it, enqueues are still accepted"),
                       ("resume", "resume a paused queue")):
        pr = client_cmd(name, C.cmd_pause, help)
        pr.add_argument("queue", metavar="QUEUE")
        pr.add_argument("--create", action="store_true", help="also for a queue that neither exists nor is "
                        "declared (refused otherwise: a typo would make a new queue)")


def _add_dlq(sub) -> None:
    d = sub.add_parser("dlq", help="dead letters: list, drain, requeue, delete, move",
                       description="dead letters: list, drain, requeue, delete, move")
    dsub = d.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")

    def dlq_cmd(name, fn, help):
        c = dsub.add_parser(name, help=help, description=help)
        add_common(c, top=False)
        c.set_defaults(fn=lambda a, fn=fn: C.run(a, fn), command=f"dlq {name}")
        return c

    dl = dlq_cmd("list", C.cmd_dlq_list, "list dead letters, oldest first (non-destructive)")
    dl.add_argument("--queue", help="only this queue")
    dl.add_argument("--limit", type=int, default=50, help="show at most this many (default 50)")
    dl.add_argument("--all", action="store_true", help="show every dead letter")
    dd = dlq_cmd("drain", C.cmd_dlq_drain, "remove dead letters and write them out as JSON lines (destructive)")
    dd.add_argument("--queue", help="only this queue")
    dd.add_argument("--max", type=int, metavar="N", help="drain at most N (default: all)")
    dd.add_argument("--out", metavar="FILE", help="append the records to FILE (default: stdout)")
    dd.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    dr = dlq_cmd("requeue", C.cmd_dlq_requeue, "put dead letters back as ready jobs (same id, attempt 1)")
    dr.add_argument("ids", nargs="*", metavar="ID", help="job ids; `-` reads them from stdin")
    dr.add_argument("--all", action="store_true", help="requeue every dead letter (of --queue)")
    dr.add_argument("--queue", help="with --all: only this queue")
    dx = dlq_cmd("delete", C.cmd_dlq_delete, "delete dead letters by id")
    dx.add_argument("ids", nargs="+", metavar="ID", help="job ids; `-` reads them from stdin")
    admin_cmd.add_dlq_move(dlq_cmd)


def _add_tools(sub) -> None:
    """bench and chaos: their own parsers take the rest of the command line."""
    b = sub.add_parser("bench", help="benchmark a cluster (`raftq bench --help` for its options)", add_help=False)
    b.add_argument("bench_args", nargs=argparse.REMAINDER)
    b.set_defaults(fn=lambda a: cmd_bench(a.bench_args))
    ch = sub.add_parser("chaos", help="chaos-test a local cluster (`raftq chaos --help` for its options)",
                        add_help=False)
    ch.add_argument("chaos_args", nargs=argparse.REMAINDER)
    ch.set_defaults(fn=lambda a: cmd_chaos(a.chaos_args))


def cmd_chaos(argv: list[str]) -> int:
    from ..chaos import main as chaos_main
    return chaos_main(list(argv)) or 0


def cmd_bench(argv: list[str]) -> int:
    from ..bench import main as bench_main
    return bench_main(list(argv)) or 0


def _bench_split(argv: list[str]):
    """When the command is `bench`: (options before it, everything after it), else None.
    `raftq bench ...` hands its arguments to cluster/bench/runner.py untouched."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "bench":
            return argv[:i], argv[i + 1:]
        if a in COMMON_WITH_VALUE:
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return None
    return None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "chaos":           # its own options, untouched
        return cmd_chaos(argv[1:])
    split = _bench_split(argv)
    if split is not None:
        before, rest = split
        top = build_parser().parse_args(before + ["status"])     # validates the options before `bench`
        if top.urls and "--urls" not in rest and "--local" not in rest:
            rest = ["--urls", top.urls] + rest
        for opt in ("ca", "cert", "key"):
            if getattr(top, opt) and f"--{opt}" not in rest:
                rest = [f"--{opt}", getattr(top, opt)] + rest
        if top.json and "--json" not in rest:
            rest = rest + ["--json"]
        return cmd_bench(rest)
    args = build_parser().parse_args(argv)
    return args.fn(args) or 0
