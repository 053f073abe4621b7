"""`raftq local status|kill|pause|resume|restart|wipe`: act on the cluster a `raftq up` runs, from
another terminal (see cluster/cli/up.py for how the two talk)."""
from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from pathlib import Path

from ...node.core.limits import ConfigError
from ...node.base.settings import API_ROLES
from ..files import write_private
from ..local import digest_at, digest_cell, http_json
from . import sections as S
from .up import (CONFIG, CONTROL, EXIT_FAILED, EXIT_OK, EXIT_USAGE, STATE, UpError, dir_option, lock_holder,
                 pid_runs, proc_stopped, read_state, resolve_dir)

ACTIONS = {
    "status": "each node's process and own view: PID, state, role, term, applied index, digest, restarts",
    "kill": "kill a node's process (SIGKILL unless --signal); raftq up restarts it after its back-off "
            "unless it runs with --no-restart",
    "pause": "freeze a node with SIGSTOP: it keeps its connections and answers nothing",
    "resume": "continue a paused node (SIGCONT) and wait until it has caught up",
    "restart": "stop a node cleanly (a leader hands over first), start it and wait until it has caught up",
    "wipe": "stop a node, empty its data dir, start it and wait until it has caught up by snapshot",
}
WAITS = ("resume", "restart", "wipe")


def _fail(message: str, code: int = EXIT_FAILED):
    raise UpError(message, code)


def cluster_state(directory: Path) -> dict:
    state = read_state(directory)
    if state is None:
        _fail(f"no raftq up cluster in {directory} (no {STATE}); start one with `raftq up{dir_option(directory)}`",
              EXIT_USAGE)
    return state


def request(directory: Path, action: str, node: str, timeout: float = 40.0, **extra) -> dict:
    """Hand a request to the running `raftq up` and wait for its answer."""
    if not lock_holder(directory):
        _fail(f"raftq up is not running on {directory}; start it with `raftq up{dir_option(directory)}` "
              "(it continues this cluster)", EXIT_USAGE)
    control = directory / CONTROL
    rid = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}"
    write_private(control / f"{rid}.req", json.dumps({"action": action, "node": node, **extra}))
    reply = control / f"{rid}.reply"
    end = time.monotonic() + timeout
    checked = time.monotonic()
    while time.monotonic() < end:
        try:
            body = json.loads(reply.read_text())
            reply.unlink()
            return body
        except FileNotFoundError:
            pass
        except ValueError:
            pass                            # being written: read it again
        if time.monotonic() - checked > 1:
            checked = time.monotonic()
            if not lock_holder(directory):
                _fail(f"raftq up on {directory} stopped before it answered")
        time.sleep(0.05)
    try:
        (control / f"{rid}.req").unlink()
    except FileNotFoundError:
        pass
    _fail(f"raftq up did not answer within {timeout:g}s; see its terminal")


def probe_headers(directory: Path) -> dict:
    """The strongest API key of the cluster's [auth], for probes (the nodes may require one)."""
    try:
        secs = S.load_sections(directory / CONFIG) if (directory / CONFIG).exists() else {}
    except ConfigError:
        return {}
    keys = (secs.get("auth") or {}).get("api_keys") or []
    best = max(keys, key=lambda k: API_ROLES.index(k.get("role", "admin")), default=None)
    return {"Authorization": f"Bearer {best['key']}"} if best else {}


def tls_context(state: dict):
    """The ssl.SSLContext for the nodes of a `raftq up --tls` cluster (up.json "tls"), else None."""
    tls = state.get("tls")
    if not tls:
        return None
    import ssl
    try:
        ctx = ssl.create_default_context(cafile=tls["ca"])
        if tls.get("client_cert"):
            ctx.load_cert_chain(*tls["client_cert"])
    except (OSError, ssl.SSLError) as e:
        _fail(f"cannot load the TLS files of the cluster ({tls.get('ca')}): {e}")
    return ctx


def probe_all(nodes: list[dict], headers: dict, context=None) -> dict[str, dict | None]:
    views: dict[str, dict | None] = {}

    def one(node):
        status, body = http_json("GET", node["url"] + "/v1/cluster", timeout=1.5, headers=headers, context=context)
        views[node["id"]] = body if status == 200 and isinstance(body, dict) else None

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes
               if n.get("pid") and not proc_stopped(n.get("pid"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3)
    return views


def cmd_status(args, directory: Path) -> int:
    state = cluster_state(directory)
    running = lock_holder(directory)
    nodes = state.get("nodes", [])
    for n in nodes:
        if not running:
            n["state"] = "orphan" if pid_runs(n.get("pid"), n.get("config", "\0")) else "stopped"
            if n["state"] == "stopped":
                n["pid"] = None
        elif n.get("state") == "running" and proc_stopped(n.get("pid")):
            n["state"] = "paused"           # stopped from outside raftq up
    views = probe_all(nodes, probe_headers(directory), tls_context(state))
    leaders = {v["leader"]["id"] for v in views.values() if v and v.get("leader")}
    leader = next((n for n in nodes if (views.get(n["id"]) or {}).get("role") == "leader"), None)
    if args.json:
        print(json.dumps({"dir": str(directory), "running": running,
                          "supervisor_pid": state.get("supervisor_pid") if running else None,
                          "restart": state.get("restart"), "leader": leader["id"] if leader else None,
                          "nodes": [{**n, "view": views.get(n["id"])} for n in nodes]}, indent=2))
        return EXIT_OK if running and leader else EXIT_FAILED
    if running:
        print(f"raftq up: running (pid {state.get('supervisor_pid')}) on {directory} since {state.get('started_at')}"
              + ("" if state.get("restart", True) else ", --no-restart"))
    elif state.get("status") == "running":
        print(f"raftq up: not running on {directory}: it ended at {state.get('updated_at')} or later without "
              f"stopping its nodes (was it killed?); `raftq up{dir_option(directory)}` stops any left running and "
              "continues this cluster")
    else:
        print(f"raftq up: not running on {directory} (stopped at {state.get('updated_at')}); "
              f"`raftq up{dir_option(directory)}` continues this cluster")
    head = ["NODE", "PID", "STATE", "ROLE", "TERM", "APPLIED", "DIGEST", "RESTARTS", "URL", "LAST EXIT"]
    rows = []
    for n in nodes:
        v = views.get(n["id"]) or {}
        st = n.get("state")
        if st == "down" and n.get("restart_in_s") is not None:
            st = "down (restart due)"
        last = n.get("last_exit")
        if last and n.get("last_exit_at"):
            last += f" at {n['last_exit_at'][11:19]}"
        rows.append([n["id"], n.get("pid"), st, v.get("role"), v.get("term"), v.get("last_applied"),
                     digest_cell(v), n.get("restarts", 0), n["url"], last])
    cells = [head] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    by_index: dict = {}
    for nid, v in views.items():
        if v:
            index, digest = digest_at(v)
            by_index.setdefault(index, {}).setdefault(digest, []).append(nid)
    for index, digests in by_index.items():
        if len(digests) > 1:
            print(f"raftq local: WARNING: nodes disagree on the state at applied index {index}: "
                  + "; ".join(f"{', '.join(ids)}: {(d or '')[:12]}" for d, ids in digests.items()), file=sys.stderr)
    if leader:
        v = views[leader["id"]]
        print(f"leader: {leader['id']} at {leader['url']} (term {v.get('term')}); "
              f"{sum(1 for x in views.values() if x)}/{len(nodes)} nodes answer")
        return EXIT_OK if running else EXIT_FAILED
    if running:
        print("no leader: " + (f"the nodes still name {', '.join(sorted(leaders))}, which does not answer; an "
                               "election follows within seconds" if leaders else
                               "an election may be under way, or a majority of nodes is down or paused"))
    return EXIT_FAILED


def wait_ready(node: str, url: str, target: int, timeout: float, log: str | None, headers: dict,
               context=None) -> int:
    """Wait until the node says it is ready and has applied what the cluster had committed when
    it came back (`target`, from raftq up)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        status, body = http_json("GET", url + "/v1/cluster?digest=false", timeout=1.0, headers=headers,
                                 context=context)
        if status == 200 and body.get("ready") and int(body.get("last_applied") or 0) >= target:
            print(f"{node} is ready: caught up with the leader, applied index {body.get('last_applied')} "
                  f"({time.monotonic() - t0:.1f}s)", flush=True)
            return EXIT_OK
        time.sleep(0.1)
    print(f"raftq local: {node} is not ready after {timeout:g}s (it has no leader or has not caught up); "
          f"see `raftq local status` and its log{f' {log}' if log else ''}", file=sys.stderr)
    return EXIT_FAILED


def cmd_action(args, directory: Path) -> int:
    state = cluster_state(directory)
    extra = {}
    if args.local_action == "kill":
        extra["signal"] = args.signal
    body = request(directory, args.local_action, args.node, **extra)
    if args.json:
        print(json.dumps(body, indent=2))
    if not body.get("ok"):
        print(f"raftq local: {body.get('message')}", file=sys.stderr)
        return EXIT_FAILED
    if not args.json:
        print(body.get("message"), flush=True)
    if args.local_action in WAITS and not args.no_wait and body.get("url"):
        log = next((n.get("log") for n in state.get("nodes", []) if n["id"] == body.get("node")), None)
        return wait_ready(body["node"], body["url"], int(body.get("catch_up_to") or 0), args.timeout, log,
                          probe_headers(directory), tls_context(state))
    return EXIT_OK


def cmd_local(args) -> int:
    directory = resolve_dir(getattr(args, "dir", None))
    try:
        if args.local_action == "status":
            return cmd_status(args, directory)
        return cmd_action(args, directory)
    except UpError as e:
        print(f"raftq local: {e}", file=sys.stderr)
        return e.code


def add_parser(sub, suppress) -> None:
    from .up import default_dir
    loc = sub.add_parser("local", help="act on the cluster `raftq up` runs: status, kill, pause, resume, restart, wipe",
                         description="Act on the cluster a `raftq up` runs, from another terminal. NODE is a "
                                     "node id (n1, n2, ...), `leader` or `follower`.")
    loc.add_argument("--dir", default=None, help=f"the `raftq up` directory (default {default_dir()})")
    lsub = loc.add_subparsers(dest="local_action", required=True, metavar="ACTION")
    for name, help in ACTIONS.items():
        a = lsub.add_parser(name, help=help, description=help)
        if name != "status":
            a.add_argument("node", metavar="NODE", help="n1, n2, ..., or `leader` / `follower`")
        a.add_argument("--dir", default=suppress, help="the `raftq up` directory (default: its default)")
        a.add_argument("--json", action="store_true", default=suppress, help="print JSON for scripts")
        if name == "kill":
            a.add_argument("--signal", default="KILL", choices=("KILL", "TERM", "INT", "ABRT"),
                           help="the signal (default KILL: kill -9)")
        if name in WAITS:
            a.add_argument("--no-wait", action="store_true", help="return once it is started, without waiting "
                           "for it to catch up")
            a.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                           help="how long to wait for it to catch up (default 60)")
        a.set_defaults(fn=cmd_local)
