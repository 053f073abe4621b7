"""`raftq bench`: the cluster benchmark with the sepp workload (sepp, the single-node job queue
whose semantics raftq follows, benchmarks P producers and W workers in a closed loop, one durable
op per request, 256-byte payloads, then the same with batches of 256). DESCRIPTION says what it
measures and how to read its output.

Phases: enqueue (P producers, one 256-byte job per request), drain (W workers, reserve one +
ack), mixed (P producers and W workers at once until N jobs are acked), latency (one connection,
sequential enqueue -> reserve -> ack), and batched enqueue/drain (256 per request). Closed loop:
each producer and worker has one request in flight; with the session transport they all share
one client (as users would), over HTTP each has its own connection. Also reports the leader's
CPU split (HTTP / Raft / apply) from its /v1/cluster view, and with --baseline the mixed phase
against a bare aiohttp server that does nothing (what HTTP alone costs here).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from ..client import Client, EnqueueResult, PermissionDenied, Unauthenticated, job_request
from ..local import LocalCluster
from ..progress import Progress

PAYLOAD = os.urandom(256)


class Clients:
    """Session transport: one client shared by every producer and worker of the process (as
    users would). HTTP: one client and one connection per producer/worker. `spread`: the
    producers and workers take the nodes in turn, each calling its node (a follower serves the
    call, forwarding to the leader what needs it: docs/api.md "Followers"); with the session
    transport one shared client per node."""

    def __init__(self, urls, transport: str, api_key: str | None = None, tls: dict | None = None,
                 spread: bool = False):
        self.urls, self.transport, self.api_key, self.tls = urls, transport, api_key, tls or {}
        self.spread, self.turn = spread, 0
        homes = [[u] for u in urls] if spread else [urls]
        self.shared = [Client(h, api_key=api_key, transport="session", spread=spread, **self.tls) for h in homes] \
            if transport == "session" else None
        self.made: list[Client] = []

    def get(self) -> Client:
        self.turn += 1
        if self.shared is not None:
            return self.shared[self.turn % len(self.shared)]
        urls = [self.urls[self.turn % len(self.urls)]] if self.spread else self.urls
        c = Client(urls, api_key=self.api_key, transport="http", connections=1, spread=self.spread, **self.tls)
        self.made.append(c)
        return c

    async def close(self):
        for c in self.made + (self.shared or []):
            await c.close()


def timed(lat: dict | None, op: str):
    """The list the latencies (s) of `op` go to, or None when they are not recorded."""
    return None if lat is None else lat.setdefault(op, [])


async def phase_enqueue(clients: Clients, queue, jobs, producers, batch, progress, lat: dict | None = None) -> float:
    left = [jobs]
    enqueue_lat = timed(lat, "enqueue")

    async def producer():
        c = clients.get()
        while left[0] > 0:
            k = min(batch, left[0])
            left[0] -= k
            if batch > 1:
                res = await c.enqueue_batch([job_request(queue, "bench", PAYLOAD)] * k)
                bad = [r for r in res if not isinstance(r, EnqueueResult)]
                if bad:
                    raise RuntimeError(f"enqueue refused: {bad[0]}")
            else:
                t = time.perf_counter()
                await c.enqueue(queue, "bench", PAYLOAD)
                if enqueue_lat is not None:
                    enqueue_lat.append(time.perf_counter() - t)
            progress.update(k)

    t0 = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    return time.perf_counter() - t0


async def phase_drain(clients: Clients, queue, jobs, workers, batch, progress, t0: float | None = None,
                      lat: dict | None = None) -> float:
    """Seconds from t0 (default: now) until the jobs-th ack. The clock stops there, not when
    the other workers' long polls on the then empty queue come back (up to wait_ms later).
    With `lat`, the latency of every reserve that got a job and of every ack is recorded."""
    acked = [0]
    done_at: list[float] = []
    reserve_lat, ack_lat = timed(lat, "reserve"), timed(lat, "ack")

    async def worker():
        c = clients.get()
        while acked[0] < jobs:
            t = time.perf_counter()
            got = await c.reserve([queue], 60_000, max_jobs=batch, wait_ms=200)
            if not got:
                continue
            if reserve_lat is not None:
                reserve_lat.append(time.perf_counter() - t)
            if batch > 1:
                res = await c.ack_batch(got)
                if any(r is not None for r in res):
                    raise RuntimeError(f"ack failed: {[r for r in res if r][0]}")
            else:
                t = time.perf_counter()
                await c.ack(got[0])
                if ack_lat is not None:
                    ack_lat.append(time.perf_counter() - t)
            acked[0] += len(got)
            progress.update(len(got))
            if acked[0] >= jobs and not done_at:
                done_at.append(time.perf_counter())

    if t0 is None:
        t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return (done_at[0] if done_at else time.perf_counter()) - t0


async def phase_mixed(clients: Clients, queue, jobs, producers, workers, progress, lat: dict | None = None) -> float:
    """Producers and workers at once, until the jobs-th ack."""
    t0 = time.perf_counter()
    _, secs = await asyncio.gather(phase_enqueue(clients, queue, jobs, producers, 1, Progress(jobs, enabled=False),
                                                 lat),
                                   phase_drain(clients, queue, jobs, workers, 1, progress, t0=t0, lat=lat))
    return secs


def percentiles(lat: dict) -> dict:
    """{op: {p50_ms, p99_ms, n}} of recorded latencies (seconds)."""
    out = {}
    for op, xs in lat.items():
        if xs:
            xs = sorted(xs)
            q = lambda p: round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1000, 2)
            out[op] = {"p50_ms": q(0.50), "p99_ms": q(0.99), "n": len(xs)}
    return out


def stage_means(before: dict, after: dict) -> dict:
    """The leader's commit stages over a phase (its /v1/cluster `proposer` figures before and
    after, node/replication/proposer.py STAGES): the mean per timed batch in ms, requests per batch, and the
    mean wait of a request between its submit and its batch's flush."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    batches = d.get("timed_batches", 0)
    if batches <= 0:
        return {}
    # node/replication/proposer.py STAGES, spelled out: the client side does not import the server's modules
    out = {k[:-3] + "_ms": round(d.get(k, 0) / batches / 1000, 3)
           for k in ("to_raft_us", "leader_sync_us", "replicate_us", "apply_us", "render_us", "to_loop_us")}
    out["batches"] = batches
    out["requests_per_batch"] = round(d.get("commands", 0) / max(d.get("batches", 0), 1), 1)
    out["queue_ms"] = round(d.get("queue_us", 0) / max(d.get("commands", 0), 1) / 1000, 3)
    return out


def figure(jobs: int, secs: float) -> dict:
    return {"jobs": jobs, "seconds": round(secs, 2), "jobs_per_s": round(jobs / secs, 1)}


async def mixed_round(urls, transport, api_key, queue, jobs, producers, workers, label, progress,
                      tls: dict | None = None) -> dict:
    """One mixed phase on fresh clients (a baseline round, against raftq or the bare server)."""
    clients = Clients(urls, transport, api_key, tls)
    p = Progress(jobs, label, unit="jobs", enabled=progress)
    try:
        return figure(jobs, await phase_mixed(clients, queue, jobs, producers, workers, p))
    finally:
        p.close()
        await clients.close()


async def phase_latency(clients: Clients, queue, rounds) -> dict:
    c = clients.get()
    lat = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await c.enqueue(queue, "bench", PAYLOAD)
        got = await c.reserve([queue], 60_000, wait_ms=1000)
        await c.ack(got[0])
        lat.append((time.perf_counter() - t0) * 1000)
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    return {"p50_ms": round(q(0.50), 3), "p99_ms": round(q(0.99), 3), "p999_ms": round(q(0.999), 3)}


async def _view(url, api_key=None, tls: dict | None = None) -> dict:
    async with Client([url], api_key=api_key, transport="http", **(tls or {})) as c:
        try:
            return await c._get_from(url, "/v1/cluster?digest=false")
        except Exception:
            return {}


def cpu_per_job(before: dict, after: dict, jobs: int) -> dict:
    """Each node's CPU (µs of its process) per job moved in a phase, from its /v1/cluster views
    before and after: {url: µs}, None where a view was missing."""
    out = {}
    for url, v0 in before.items():
        a, b = (v0.get("cpu") or {}).get("process_s"), ((after.get(url) or {}).get("cpu") or {}).get("process_s")
        out[url] = None if a is None or b is None else round((b - a) * 1e6 / max(jobs, 1), 1)
    return out


def cpu_split(before: dict, after: dict) -> dict:
    keys = ("process_s", "http_s", "raft_s", "apply_s")
    if not all(before.get(k) is not None and after.get(k) is not None for k in keys):
        return {}
    d = {k: after[k] - before[k] for k in keys}
    total = max(d["process_s"], 1e-9)
    return {"leader_cpu_s": round(d["process_s"], 2),
            "http_share": round(d["http_s"] / total, 3), "raft_share": round(d["raft_s"] / total, 3),
            "apply_share": round(d["apply_s"] / total, 3)}


async def run(urls, jobs, producers, workers, phases, latency_rounds, transport, progress, api_key=None,
              tls: dict | None = None, spread: bool = False) -> dict:
    probe = Client(urls, api_key=api_key, transport="http", **(tls or {}))
    try:
        view = await probe.cluster()
    finally:
        await probe.close()
    leader = (view.get("leader") or {}).get("url") or urls[0]
    out = {"leader": leader}
    tag = f"{int(time.time())}-{os.getpid()}"
    clients = Clients(urls, transport, api_key, tls, spread)

    async def views():
        return dict(zip(urls, await asyncio.gather(*(_view(u, api_key, tls) for u in urls))))

    async def measured(name, coro_fn, n):
        all0 = await views()
        p = Progress(n, name, unit="jobs", enabled=progress)
        lat: dict = {}
        secs = await coro_fn(p, lat)
        p.close()
        all1 = await views()
        v0, v1 = all0.get(leader) or {}, all1.get(leader) or {}
        out[name] = {**figure(n, secs), **cpu_split(v0.get("cpu") or {}, v1.get("cpu") or {}),
                     "cpu_us_per_job": cpu_per_job(all0, all1, n)}
        if lat:
            out[name]["op_latency"] = percentiles(lat)
        stages = stage_means(v0.get("proposer") or {}, v1.get("proposer") or {})
        if stages:
            out[name]["commit_stages"] = stages

    try:
        if "enqueue" in phases:
            await measured("enqueue", lambda p, lat: phase_enqueue(clients, f"b-{tag}", jobs, producers, 1, p, lat),
                           jobs)
        if "drain" in phases:
            await measured("drain", lambda p, lat: phase_drain(clients, f"b-{tag}", jobs, workers, 1, p, lat=lat), jobs)
        if "mixed" in phases:
            await measured("mixed", lambda p, lat: phase_mixed(clients, f"m-{tag}", jobs, producers, workers, p, lat),
                           jobs)
        if "batch" in phases:
            await measured("batch_enqueue", lambda p, lat: phase_enqueue(clients, f"bb-{tag}", jobs, producers, 256, p),
                           jobs)
            await measured("batch_drain", lambda p, lat: phase_drain(clients, f"bb-{tag}", jobs, workers, 256, p), jobs)
        if "latency" in phases:
            out["latency"] = await phase_latency(clients, f"l-{tag}", latency_rounds)
    finally:
        await clients.close()
    return out


class BareServer:
    """A bare aiohttp server that does nothing (cluster/bench/bare_server.py), in its own process."""

    async def __aenter__(self):
        from ..local import free_ports
        port = free_ports(1)[0]
        self.proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "raftq.cluster.bench.bare_server",
                                                         "--port", str(port))
        self.url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                async with Client([self.url], transport="http") as c:
                    await c.cluster(url=self.url)
                return self
            except Exception:
                await asyncio.sleep(0.1)
        raise RuntimeError(f"the bare aiohttp server at {self.url} did not come up")

    async def __aexit__(self, *exc):
        self.proc.terminate()
        await self.proc.wait()

    async def mixed(self, jobs, producers, workers, progress) -> dict:
        return await mixed_round([self.url], "http", None, "bare", jobs, producers, workers, "bare mixed", progress)


async def run_baseline(urls, jobs, producers, workers, rounds, transport, progress, first_mixed=None,
                       api_key=None, tls: dict | None = None) -> dict:
    """The mixed phase against a bare aiohttp server that does nothing, in `rounds` rounds
    interleaved with raftq's own mixed phase (a fresh queue each round), the order flipping
    every round: the machine's speed drifts over minutes, and a single pair of runs minutes
    apart mostly measured that drift. Each round's ratio compares two runs taken side by side;
    the figure is their median."""
    out = {"rounds": []}
    async with BareServer() as bare:
        for i in range(rounds):
            mixed = first_mixed if i == 0 else None
            bare_first = i % 2 == 1
            b = await bare.mixed(jobs, producers, workers, progress) if bare_first else None
            if mixed is None:
                queue = f"m-{int(time.time())}-{os.getpid()}-{i}"
                mixed = await mixed_round(urls, transport, api_key, queue, jobs, producers, workers, "mixed", progress,
                                          tls)
            if b is None:
                b = await bare.mixed(jobs, producers, workers, progress)
            out["rounds"].append({"raftq_jobs_per_s": mixed["jobs_per_s"], "bare_jobs_per_s": b["jobs_per_s"],
                                  "ratio": round(mixed["jobs_per_s"] / b["jobs_per_s"], 3)})
    out["jobs_per_s"] = statistics.median(r["bare_jobs_per_s"] for r in out["rounds"])
    out["ratio"] = statistics.median(r["ratio"] for r in out["rounds"])
    return out


DESCRIPTION = """\
Benchmark a raftq cluster, a running one (--urls) or a fresh local one (--local),
with the sepp workload. sepp is the open-source single-node job queue whose semantics
raftq follows; its own benchmark is the shape used here: P producers and W workers in
a closed loop, each awaiting one durable operation per request (a 256-byte job), then
the same with batches of 256 jobs per request.

Phases (--phases; they run in this order):
  enqueue   P producers, one job per request.
  drain     W workers, reserve one job and ack it (takes the jobs enqueue left).
  mixed     P producers and W workers at once, until --jobs jobs are acked.
  batch     enqueue, then reserve and ack, 256 jobs per request.
  latency   one client, enqueue -> reserve -> ack in sequence, --latency-rounds times.

Reading the output: one row per phase with jobs/s (the phase's jobs over its wall
time; the clock stops at the last ack) and its seconds, and the leader's CPU over the
phase split into HTTP or session handling, Raft and apply. For the mixed phase, each
request's p50 / p99 latency and the leader's commit stages per batch; for the latency
phase p50 / p99 / p999 of one round trip. --baseline adds the mixed phase against a
bare aiohttp server that does nothing: what HTTP alone costs on this machine. --json
prints all of it as one JSON object. The clients share the machine with the nodes of
a --local cluster, and figures move by about 20 % from run to run: compare
interleaved runs (docs/performance.md).

--backlog N,N,... measures something else instead: what a node costs at each backlog
size (cluster/bench/scale.py).
"""


def _local_cluster_options(p: argparse.ArgumentParser) -> None:
    """What a cluster the bench starts itself (--local, --backlog) runs with."""
    p.add_argument("--durability", choices=("fsync", "memory"), default="fsync",
                   help="with --local or --backlog: the nodes' durability mode; fsync syncs the journal before "
                        "answering, memory does not (default %(default)s).")
    p.add_argument("--raft-engine", choices=("thread", "loop"), default=None,
                   help="with --local or --backlog: the nodes' tuning.raft_engine (docs/cluster.md \"Raft engines\").")
    p.add_argument("--tuning", action="append", metavar="KEY=VALUE", type=_tuning_item,
                   help="with --local or --backlog: a [tuning] setting of the nodes (docs/configuration.md), "
                        "the value read as JSON when it is (a number, true) and as text otherwise; repeatable.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftq bench", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--urls", default=None,
                   help="comma-separated node URLs of a running cluster (give this or --local).")
    p.add_argument("--local", action="store_true",
                   help="start a fresh local 3-node cluster for the run, and remove it at the end.")
    _local_cluster_options(p)
    p.add_argument("--jobs", type=int, default=20000, metavar="N",
                   help="jobs each phase moves: enqueue, drain, mixed, batched enqueue and batched drain each "
                        "take N (default %(default)s).")
    p.add_argument("--producers", type=int, default=50, metavar="P",
                   help="producers in the enqueue, mixed and batch phases, each with one request in flight "
                        "(default %(default)s).")
    p.add_argument("--workers", type=int, default=50, metavar="W",
                   help="workers in the drain, mixed and batch phases, each with one request in flight: "
                        "reserve, then ack (default %(default)s).")
    p.add_argument("--phases", default="enqueue,drain,mixed,batch,latency", metavar="LIST",
                   help="comma-separated phases to run, of enqueue, drain, mixed, batch and latency; drain takes "
                        "the jobs enqueue left, so list both (default %(default)s).")
    p.add_argument("--latency-rounds", type=int, default=500, metavar="N",
                   help="round trips (enqueue, reserve, ack, one after the other) of the latency phase "
                        "(default %(default)s).")
    p.add_argument("--transport", choices=("session", "http"), default="session",
                   help="session: every producer and worker shares one client, its calls multiplexed over one "
                        "WebSocket to the leader, as users' clients do; http: one plain HTTP connection per "
                        "producer and worker (default %(default)s).")
    p.add_argument("--spread", action="store_true",
                   help="the producers and workers take the nodes in turn, each sending its calls to its own "
                        "node (followers forward to the leader what needs it), instead of all to the leader; "
                        "with the session transport one shared client per node.")
    p.add_argument("--baseline", action="store_true",
                   help="also run the mixed phase over HTTP against a bare aiohttp server that does nothing, and "
                        "report raftq's share of its rate (with --transport http).")
    p.add_argument("--baseline-rounds", type=int, default=1, metavar="K",
                   help="with --baseline: K rounds of raftq's mixed phase and the bare server's, interleaved; "
                        "the ratio reported is the median of the rounds' ratios (default %(default)s).")
    p.add_argument("--tls", action="store_true",
                   help="with --local: the nodes serve https:// (certificates from a CA made for the run), and the "
                        "clients trust that CA.")
    p.add_argument("--ca", default=os.environ.get("RAFTQ_CA") or None, metavar="FILE",
                   help="with --urls: https:// nodes' CA bundle (default: $RAFTQ_CA when set, else the system's CAs).")
    p.add_argument("--cert", default=os.environ.get("RAFTQ_CERT") or None, metavar="FILE",
                   help="with --urls: a client certificate for nodes that require one (default: $RAFTQ_CERT when "
                        "set, else none).")
    p.add_argument("--key", default=os.environ.get("RAFTQ_KEY") or None, metavar="FILE",
                   help="the client certificate's key (default: $RAFTQ_KEY when set, else the key is in the "
                        "--cert file).")
    p.add_argument("--api-key", default=os.environ.get("RAFTQ_API_KEY") or None, metavar="KEY",
                   help="a worker (or higher) key for a cluster with API keys (default: $RAFTQ_API_KEY when set, "
                        "else none).")
    p.add_argument("--backlog", metavar="N,N,...", default=None,
                   help="instead of the phases: fill a fresh local cluster to each backlog size in turn and measure "
                        "what a node costs there (fill rate, RSS and bytes per job, the state machine's share of "
                        "them measured in process, /v1/cluster latency, work beside the backlog, snapshot size, "
                        "wiped-follower catch-up, leader kill and restart of all nodes to the first write); see "
                        "cluster/bench/scale.py.")
    p.add_argument("--recovery-timeout", type=float, default=600.0, metavar="S",
                   help="with --backlog: seconds to wait for each recovery before reporting it as not reached "
                        "(default %(default)s).")
    p.add_argument("--dir", default=None,
                   help="with --backlog: the cluster's directory, kept (default: a temporary one, removed at the "
                        "end).")
    p.add_argument("--json", action="store_true",
                   help="print the results as one JSON object instead of the table, with no progress lines.")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.backlog is not None:
        return _main_backlog(p, args)
    if not args.urls and not args.local:
        p.error("give --urls of a running cluster or --local")
    if args.baseline_rounds < 1:
        p.error("--baseline-rounds must be at least 1")
    if args.tls and not args.local:
        p.error("--tls goes with --local (for a running cluster, give its https:// --urls and --ca)")
    result = _run_bench(args)
    if result is None:
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(args, result)
    return 0


def _tuning_item(item: str) -> tuple:
    """--tuning KEY=VALUE: the value as JSON when it reads as JSON, as text otherwise."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE, got {item!r}")
    try:
        return key.strip(), json.loads(text)
    except ValueError:
        return key.strip(), text


def _tuning(args) -> dict:
    """--raft-engine and --tuning as the local cluster's [tuning] table."""
    return {**({"raft_engine": args.raft_engine} if args.raft_engine else {}), **dict(args.tuning or ())}


def _run_bench(args) -> dict | None:
    """The benchmark's phases on the cluster (--local: one started here and removed after);
    None when the cluster refused the requests (said on stderr)."""
    phases = set(args.phases.split(","))
    cluster = None
    tls = {}
    try:
        if args.local:
            tuning = _tuning(args) or None
            cluster = LocalCluster(tempfile.mkdtemp(prefix="raftq-bench-"), durability=args.durability,
                                   tls=args.tls, tuning=tuning).launch()
            urls = cluster.urls
            tls = cluster.client_options()
        else:
            urls = [u.strip().rstrip("/") for u in args.urls.split(",") if u.strip()]
            if args.ca:
                tls["ca"] = args.ca
            if args.cert:
                tls["cert"] = (args.cert, args.key)
        result = asyncio.run(run(urls, args.jobs, args.producers, args.workers, phases, args.latency_rounds,
                                 args.transport, progress=not args.json, api_key=args.api_key, tls=tls,
                                 spread=args.spread))
        if args.baseline:
            base = asyncio.run(run_baseline(urls, args.jobs, args.producers, args.workers, args.baseline_rounds,
                                            args.transport, not args.json, first_mixed=result.get("mixed"),
                                            api_key=args.api_key, tls=tls))
            result["bare_http_mixed"] = base
            if args.transport == "http":
                result["mixed_vs_bare"] = base["ratio"]
        result.update({"durability": args.durability if args.local else None, "transport": args.transport,
                       "spread": args.spread,
                       "tls": bool(args.tls or any(u.startswith("https://") for u in urls)),
                       "producers": args.producers, "workers": args.workers, "cores": os.cpu_count()})
    except (Unauthenticated, PermissionDenied) as e:
        print(f"raftq bench: the cluster refused the benchmark's requests ({e.message}); give a key with the "
              "worker role or higher: --api-key KEY or $RAFTQ_API_KEY", file=sys.stderr)
        return None
    finally:
        if cluster is not None:
            cluster.stop_all()
            cluster.close()
            shutil.rmtree(cluster.dir, ignore_errors=True)   # a 200k-job run leaves ≈ 850 MB of journals
    return result


def _print_table(args, result: dict) -> None:
    """The results as the table and lines of text (without --json)."""
    print(f"raftq bench: {args.jobs} jobs, {args.producers} producers, {args.workers} workers, "
          f"durability {result['durability']}, transport {args.transport}{' over TLS' if result['tls'] else ''}, "
          f"leader {result['leader']}{', clients spread over the nodes' if result.get('spread') else ''}")
    print(f"{'phase':<14}{'jobs/s':>10}{'seconds':>9}{'leader cpu':>11}{'http':>7}{'raft':>7}{'apply':>7}")
    for k in ("enqueue", "drain", "mixed", "batch_enqueue", "batch_drain"):
        if k in result:
            r = result[k]
            if "leader_cpu_s" in r:
                print(f"{k:<14}{r['jobs_per_s']:>10,.0f}{r['seconds']:>9}{r['leader_cpu_s']:>10}s"
                      f"{r['http_share']:>7.0%}{r['raft_share']:>7.0%}{r['apply_share']:>7.0%}")
            else:
                print(f"{k:<14}{r['jobs_per_s']:>10,.0f}{r['seconds']:>9}")
    _print_cpu_per_job(result)
    if "bare_http_mixed" in result:
        b = result["bare_http_mixed"]
        rounds = b["rounds"]
        if len(rounds) > 1:
            print(f"{'round':<7}{'raftq mixed':>12}{'bare mixed':>12}{'ratio':>7}")
            for i, r in enumerate(rounds, 1):
                print(f"{i:<7}{r['raftq_jobs_per_s']:>12,.0f}{r['bare_jobs_per_s']:>12,.0f}{r['ratio']:>7.0%}")
        median = " (median of the rounds)" if len(rounds) > 1 else ""
        extra = (f"; raftq {args.transport} mixed = {b['ratio']:.0%} of it{median}"
                 if args.transport == "http" else "")
        print(f"bare aiohttp server, mixed over http: {b['jobs_per_s']:,.0f} jobs/s{extra}")
    if "mixed" in result and "op_latency" in result["mixed"]:
        r = result["mixed"]
        ops = ", ".join(f"{op} p50 {v['p50_ms']} / p99 {v['p99_ms']} ms" for op, v in r["op_latency"].items())
        print(f"mixed, per request: {ops}")
        s = r.get("commit_stages")
        if s:
            print(f"leader, per batch ({s['requests_per_batch']} requests, {s['batches']} batches timed): "
                  f"queue {s['queue_ms']} ms (per request), to raft {s['to_raft_ms']}, leader sync "
                  f"{s['leader_sync_ms']}, replicate {s['replicate_ms']}, apply {s['apply_ms']}, render "
                  f"{s['render_ms']}, to loop {s['to_loop_ms']} ms")
    if "latency" in result:
        l = result["latency"]
        print(f"latency (enqueue->reserve->ack): p50 {l['p50_ms']} ms, p99 {l['p99_ms']} ms, p999 {l['p999_ms']} ms")


def _print_cpu_per_job(result: dict) -> None:
    """Each node's CPU per job in each phase, the leader's first."""
    for k in ("enqueue", "drain", "mixed", "batch_enqueue", "batch_drain"):
        per = (result.get(k) or {}).get("cpu_us_per_job")
        if per:
            lead = per.get(result["leader"])
            rest = [f"{v} ({u})" for u, v in per.items() if u != result["leader"]]
            print(f"{k}: CPU per job, µs: leader {lead}; followers {', '.join(rest)}")


def _main_backlog(p: argparse.ArgumentParser, args) -> int:
    from .scale import format_scale, run_scale
    try:
        sizes = [int(x.replace("_", "")) for x in args.backlog.split(",") if x.strip()]
    except ValueError:
        p.error(f"--backlog takes comma-separated job counts, got {args.backlog!r}")
    if not sizes or min(sizes) < 0:
        p.error("--backlog needs at least one size >= 0")
    if args.urls:
        p.error("--backlog starts a local cluster of its own (its recovery figures kill and wipe nodes); drop --urls")

    def say(text):
        if not args.json:
            print(f"raftq bench: {text}", file=sys.stderr, flush=True)

    made = args.dir is None
    result = asyncio.run(run_scale(sizes, args.durability, not args.json, args.recovery_timeout, args.dir, say,
                                   _tuning(args)))
    if made:
        shutil.rmtree(result["dir"], ignore_errors=True)
    print(json.dumps(result) if args.json else format_scale(result))
    return 0
