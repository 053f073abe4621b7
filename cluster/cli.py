"""The `raftq` command."""
from __future__ import annotations

import argparse
import base64
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from .local import LocalCluster, http_json


def cmd_node(args) -> int:
    from node.server import main as node_main
    argv = ["--config", args.config]
    if args.log_level:
        argv += ["--log-level", args.log_level]
    return node_main(argv)


def _demo(cluster: LocalCluster, leader: int):
    url = cluster.urls[leader]
    follower = (leader + 1) % cluster.n
    print(f"\ndemo: enqueue 3 jobs through follower {cluster.ids[follower]} (it redirects to the leader)")
    for i, prio in enumerate((0, 5, 9)):
        body = {"queue": "demo", "job_type": "greet", "priority": prio,
                "payload": {"data_b64": base64.b64encode(f"hello {i}".encode()).decode(), "encoding": "text/plain"}}
        status, out = http_json("POST", cluster.urls[follower] + "/v1/jobs", body)
        if status == 307:
            status, out = http_json("POST", out["error"]["leader_url"] + "/v1/jobs", body)
        print(f"  POST /v1/jobs priority {prio} -> {status} {out}")
    status, out = http_json("POST", url + "/v1/reserve", {"queues": ["demo"], "lease_ms": 30000, "max_jobs": 3})
    for job in out.get("jobs", []):
        data = base64.b64decode(job["payload"]["data_b64"]).decode()
        print(f"  reserved {job['id']} priority {job['priority']} attempt {job['attempt']}: {data!r}")
        s, _ = http_json("POST", url + f"/v1/jobs/{job['id']}/ack", {"attempt": job["attempt"]})
        print(f"  ack -> {s}")
    status, out = http_json("GET", url + "/v1/queues/demo")
    print(f"  queue demo: ready {out['ready']}, in flight {out['in_flight']}, enqueued {out['enqueued']}, acked {out['acked']}")
    views = cluster.wait_converged(10)
    print(f"  all {cluster.n} nodes at applied index {views[0]['last_applied']} with digest {views[0]['digest']}")


def cmd_up(args) -> int:
    made = args.dir is None
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="raftq-up-"))
    cluster = LocalCluster(directory, nodes=args.nodes, durability=args.durability,
                           base_port=args.base_port or None)
    cluster.write_configs()
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"raftq up: {args.nodes} nodes, durability {args.durability}, configs and data in {directory}")
    cluster.start_all()
    try:
        try:
            leader = cluster.wait_leader(args.timeout)
        except TimeoutError as e:
            dead = [cluster.ids[i] for i in range(cluster.n) if not cluster.alive(i)]
            print(f"raftq up: {e}" + (f"; nodes that exited: {', '.join(dead)} (ports in use? try --base-port)" if dead else ""),
                  file=sys.stderr)
            return 1
        for i in range(cluster.n):
            role = "leader" if i == leader else "follower"
            print(f"  {cluster.ids[i]}  {cluster.urls[i]}  raft 127.0.0.1:{cluster.raft_ports[i]}  {role}")
        print(f"leader: {cluster.ids[leader]} at {cluster.urls[leader]}")
        if args.demo:
            _demo(cluster, leader)
        if args.exit_after_demo:
            return 0
        print("press Ctrl-C to stop the cluster")
        last = leader
        while not stop["now"]:
            time.sleep(0.5)
            for i in range(cluster.n):
                if not cluster.alive(i):
                    print(f"raftq up: node {cluster.ids[i]} exited (code {cluster.procs[i].returncode}); "
                          f"see {directory}/{cluster.ids[i]}.log", file=sys.stderr)
                    stop["now"] = True
            cur = cluster.leader()
            if cur is not None and cur != last:
                print(f"leader is now {cluster.ids[cur]} at {cluster.urls[cur]}")
                last = cur
        return 0
    finally:
        print("stopping nodes...")
        cluster.stop_all()
        codes = {cluster.ids[i]: p.returncode for i, p in cluster.procs.items()}
        print("stopped: " + ", ".join(f"{k} exit {v}" for k, v in codes.items()))
        cluster.close()
        if made and not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftq", description="raftq: a replicated job queue")
    sub = p.add_subparsers(dest="command", required=True)
    n = sub.add_parser("node", help="run one node from its TOML config")
    n.add_argument("--config", required=True)
    n.add_argument("--log-level", default=None)
    n.set_defaults(fn=cmd_node)
    u = sub.add_parser("up", help="run a local cluster on loopback in the foreground")
    u.add_argument("--nodes", type=int, default=3)
    u.add_argument("--dir", default=None, help="configs and data here (default: a temporary directory, removed at exit)")
    u.add_argument("--keep", action="store_true", help="keep the temporary directory at exit")
    u.add_argument("--base-port", type=int, default=7001, help="HTTP ports from here, Raft ports from here+100 (0 = any free ports)")
    u.add_argument("--durability", choices=("fsync", "memory"), default="fsync")
    u.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a leader")
    u.add_argument("--demo", action="store_true", help="enqueue, reserve and ack a few jobs once the cluster is up")
    u.add_argument("--exit-after-demo", action="store_true", help=argparse.SUPPRESS)
    u.set_defaults(fn=cmd_up)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
