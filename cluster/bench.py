"""Cluster benchmark after sepp's published method (notes/sepp.md §7), over plain HTTP.

Phases: enqueue (P producers, one 256-byte job per request), drain (W workers, reserve one +
ack), mixed (P producers and W workers at once until N jobs are acked), latency (one connection,
sequential enqueue -> reserve -> ack), and batched enqueue/drain (256 per request). Closed loop:
each connection has one request in flight. Also reports the leader's CPU split (HTTP / Raft /
apply) from its /v1/cluster view.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import tempfile
import time

import aiohttp
import orjson

from .local import LocalCluster

PAYLOAD = {"data_b64": base64.b64encode(os.urandom(256)).decode(), "encoding": "application/octet-stream"}


class Progress:
    def __init__(self, label: str, total: int, enabled: bool):
        self.label, self.total, self.enabled = label, total, enabled
        self.done = 0
        self.t0 = time.monotonic()
        self.last = 0.0

    def add(self, n: int = 1):
        self.done += n
        if self.enabled:
            now = time.monotonic()
            if now - self.last > 0.5 or self.done >= self.total:
                self.last = now
                rate = self.done / max(now - self.t0, 1e-9)
                print(f"\r  {self.label}: {self.done}/{self.total} ({rate:,.0f}/s)   ", end="", file=sys.stderr, flush=True)

    def end(self):
        if self.enabled:
            print(file=sys.stderr)


async def _leader_url(urls: list[str]) -> str:
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            for u in urls:
                try:
                    async with s.get(u + "/v1/cluster", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        view = await r.json()
                        if view.get("leader"):
                            return view["leader"]["url"]
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
            await asyncio.sleep(0.1)
    raise RuntimeError("no leader found; is the cluster up? (raftq status)")


async def _post(s: aiohttp.ClientSession, url: str, body) -> tuple[int, dict]:
    for _ in range(50):
        async with s.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as r:
            data = orjson.loads(await r.read())
            if r.status in (429, 503):
                await asyncio.sleep(0.05)
                continue
            return r.status, data
    return r.status, data


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1),
                                 timeout=aiohttp.ClientTimeout(total=60))


async def phase_enqueue(url, queue, jobs, producers, batch, progress) -> float:
    per = [jobs // producers + (1 if i < jobs % producers else 0) for i in range(producers)]

    async def producer(n):
        async with _session() as s:
            sent = 0
            while sent < n:
                if batch > 1:
                    k = min(batch, n - sent)
                    st, body = await _post(s, url + "/v1/jobs/batch",
                                           {"jobs": [{"queue": queue, "job_type": "bench", "payload": PAYLOAD}] * k})
                else:
                    k = 1
                    st, body = await _post(s, url + "/v1/jobs", {"queue": queue, "job_type": "bench", "payload": PAYLOAD})
                if st != 200:
                    raise RuntimeError(f"enqueue failed: {st} {body}")
                sent += k
                progress.add(k)

    t0 = time.perf_counter()
    await asyncio.gather(*(producer(n) for n in per if n))
    return time.perf_counter() - t0


async def phase_drain(url, queue, jobs, workers, batch, progress, stop_when_acked=None) -> float:
    acked = [0]
    target = stop_when_acked or jobs

    async def worker():
        async with _session() as s:
            while acked[0] < target:
                st, body = await _post(s, url + "/v1/reserve", {"queues": [queue], "lease_ms": 60000,
                                                                "max_jobs": batch, "wait_ms": 200})
                if st != 200:
                    raise RuntimeError(f"reserve failed: {st} {body}")
                got = body["jobs"]
                if not got:
                    continue
                if batch > 1:
                    st, body = await _post(s, url + "/v1/acks", {"acks": [{"job_id": j["id"], "attempt": j["attempt"]}
                                                                          for j in got]})
                else:
                    j = got[0]
                    st, body = await _post(s, url + f"/v1/jobs/{j['id']}/ack", {"attempt": j["attempt"]})
                if st != 200:
                    raise RuntimeError(f"ack failed: {st} {body}")
                acked[0] += len(got)
                progress.add(len(got))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return time.perf_counter() - t0


async def phase_latency(url, queue, rounds) -> dict:
    lat = []
    async with _session() as s:
        for _ in range(rounds):
            t0 = time.perf_counter()
            await _post(s, url + "/v1/jobs", {"queue": queue, "job_type": "bench", "payload": PAYLOAD})
            st, body = await _post(s, url + "/v1/reserve", {"queues": [queue], "lease_ms": 60000, "wait_ms": 1000})
            j = body["jobs"][0]
            await _post(s, url + f"/v1/jobs/{j['id']}/ack", {"attempt": j["attempt"]})
            lat.append((time.perf_counter() - t0) * 1000)
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    return {"p50_ms": round(q(0.50), 3), "p99_ms": round(q(0.99), 3), "p999_ms": round(q(0.999), 3)}


async def cpu_of(url) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/v1/cluster") as r:
            return (await r.json())["cpu"]


def cpu_split(before: dict, after: dict) -> dict:
    d = {k: (after[k] or 0) - (before[k] or 0) for k in ("process_s", "http_s", "raft_s", "apply_s")}
    total = max(d["process_s"], 1e-9)
    return {"leader_cpu_s": round(d["process_s"], 2),
            "http_share": round(d["http_s"] / total, 3), "raft_share": round(d["raft_s"] / total, 3),
            "apply_share": round(d["apply_s"] / total, 3)}


async def run(urls, jobs, producers, workers, phases, latency_rounds, progress) -> dict:
    url = await _leader_url(urls)
    out = {"leader": url}
    tag = f"{int(time.time())}-{os.getpid()}"

    async def measured(name, coro_fn, n):
        c0 = await cpu_of(url)
        p = Progress(name, n, progress)
        secs = await coro_fn(p)
        p.end()
        c1 = await cpu_of(url)
        out[name] = {"jobs": n, "seconds": round(secs, 2), "jobs_per_s": round(n / secs, 1), **cpu_split(c0, c1)}

    if "enqueue" in phases:
        await measured("enqueue", lambda p: phase_enqueue(url, f"b-{tag}", jobs, producers, 1, p), jobs)
    if "drain" in phases:
        await measured("drain", lambda p: phase_drain(url, f"b-{tag}", jobs, workers, 1, p), jobs)
    if "mixed" in phases:
        async def mixed(p):
            t0 = time.perf_counter()
            await asyncio.gather(phase_enqueue(url, f"m-{tag}", jobs, producers, 1, Progress("", jobs, False)),
                                 phase_drain(url, f"m-{tag}", jobs, workers, 1, p))
            return time.perf_counter() - t0
        await measured("mixed", mixed, jobs)
    if "batch" in phases:
        await measured("batch_enqueue", lambda p: phase_enqueue(url, f"bb-{tag}", jobs, producers, 256, p), jobs)
        await measured("batch_drain", lambda p: phase_drain(url, f"bb-{tag}", jobs, workers, 256, p), jobs)
    if "latency" in phases:
        out["latency"] = await phase_latency(url, f"l-{tag}", latency_rounds)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="raftq bench", description=__doc__.splitlines()[0])
    p.add_argument("--urls", default=None, help="comma-separated node URLs of a running cluster")
    p.add_argument("--local", action="store_true", help="start a fresh local 3-node cluster for the run")
    p.add_argument("--durability", choices=("fsync", "memory"), default="fsync")
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--producers", type=int, default=50)
    p.add_argument("--workers", type=int, default=50)
    p.add_argument("--phases", default="enqueue,drain,mixed,batch,latency")
    p.add_argument("--latency-rounds", type=int, default=500)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not args.urls and not args.local:
        p.error("give --urls of a running cluster or --local")
    phases = set(args.phases.split(","))
    cluster = None
    try:
        if args.local:
            cluster = LocalCluster(tempfile.mkdtemp(prefix="raftq-bench-"), durability=args.durability)
            cluster.write_configs()
            cluster.start_all()
            cluster.wait_leader(30)
            urls = cluster.urls
        else:
            urls = [u.strip().rstrip("/") for u in args.urls.split(",") if u.strip()]
        result = asyncio.run(run(urls, args.jobs, args.producers, args.workers, phases, args.latency_rounds,
                                 progress=not args.json))
        result.update({"durability": args.durability if args.local else None, "transport": "http",
                       "producers": args.producers, "workers": args.workers, "cores": os.cpu_count()})
    finally:
        if cluster is not None:
            cluster.stop_all()
            cluster.close()
    if args.json:
        print(json.dumps(result))
    else:
        print(f"raftq bench: {args.jobs} jobs, {args.producers} producers, {args.workers} workers, "
              f"durability {result['durability']}, transport http, leader {result['leader']}")
        print(f"{'phase':<14}{'jobs/s':>10}{'seconds':>9}{'leader cpu':>11}{'http':>7}{'raft':>7}{'apply':>7}")
        for k in ("enqueue", "drain", "mixed", "batch_enqueue", "batch_drain"):
            if k in result:
                r = result[k]
                print(f"{k:<14}{r['jobs_per_s']:>10,.0f}{r['seconds']:>9}{r['leader_cpu_s']:>10}s"
                      f"{r['http_share']:>7.0%}{r['raft_share']:>7.0%}{r['apply_share']:>7.0%}")
        if "latency" in result:
            l = result["latency"]
            print(f"latency (enqueue->reserve->ack): p50 {l['p50_ms']} ms, p99 {l['p99_ms']} ms, p999 {l['p999_ms']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
