"""`raftq bench --backlog 0,200000,1000000`: what a node costs as its backlog grows.

One local three-node cluster is filled step by step to each backlog size (ready jobs of 256
bytes in one queue, enqueued in batches of 256 by 8 producers with the client's defaults, so
each job also leaves an idempotency record and each batch a request-id record), and at each
size the run measures, in this order:

* fill: jobs/s of the step, and the Raft terms before and after it (an election during a fill
  is a failure of the node's timing, not of the workload);
* memory: RSS of every node, and bytes per queued job per node (RSS growth since the empty
  cluster over the backlog); once per run, before the cluster starts, what the state machine
  alone holds per job of the same fill (`state_machine_bytes_per_job`, tracemalloc in this
  process), so a node's figure splits into its state and the rest;
* reads: `GET /v1/cluster` latency on the leader and a follower, with and without the digest
  (median of a few calls, each bounded: a call that times out is reported as such);
* work beside the backlog: enqueue -> reserve -> ack p50/p99 on another queue;
* snapshot: the leader's raft.dump size;
* recovery: a follower wiped and restarted, seconds until it has applied the leader's commit
  index of that moment with the same digest (catch-up by snapshot install); a follower whose
  journal was cut at a random offset below its end marker (the chaos tool's `truncate`),
  seconds until it answers and until its log is trusted again and it applied the leader's
  commit index of that moment (the disk checks: verify, keep the good prefix, repair from the
  leader); the leader killed
  (SIGKILL), seconds until a write succeeds again; every node killed and restarted, seconds
  until a write succeeds again.

Every wait is bounded (--recovery-timeout); a figure that did not happen in time is reported as
null with the reason. Progress goes to stderr; `--json` prints the figures on stdout.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from ..client import Client, EnqueueResult, job_request
from ..local import LocalCluster, http_json
from ..progress import Progress

PAYLOAD = os.urandom(256)
BATCH = 256
PRODUCERS = 8


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Scale:
    def __init__(self, cluster: LocalCluster, progress: bool, recovery_timeout: float, say):
        self.c = cluster
        self.progress = progress
        self.recovery_timeout = recovery_timeout
        self.say = say
        self.filled = 0
        self.base_rss: list[int | None] = []

    # ---------------------------------------------------------------- helpers
    def leader(self, timeout: float = 60.0) -> int:
        return self.c.wait_leader(timeout)

    def views(self, timeout: float = 5.0) -> list[dict | None]:
        # Without the digest: at a large backlog it takes longer than the timeout, and terms
        # and indexes are all a step reads here.
        return [self.c.cluster_view(i, timeout=timeout, digest=False) if self.c.alive(i) else None
                for i in range(self.c.n)]

    def terms(self) -> list[int | None]:
        return [(v or {}).get("term") for v in self.views()]

    def rss(self) -> list[int | None]:
        return [rss_bytes(self.c.procs[i].pid) if self.c.alive(i) else None for i in range(self.c.n)]

    async def fill_to(self, target: int) -> dict:
        n = target - self.filled
        if n <= 0:
            return {"jobs": 0}
        left = [n]
        p = Progress(n, f"fill to {target:,}", unit="jobs", enabled=self.progress)

        async with Client(self.c.urls) as client:
            async def producer():
                while left[0] > 0:
                    k = min(BATCH, left[0])
                    left[0] -= k
                    res = await client.enqueue_batch([job_request("backlog", "bench", PAYLOAD)] * k, timeout=120)
                    bad = [r for r in res if not isinstance(r, EnqueueResult)]
                    if bad:
                        raise RuntimeError(f"enqueue refused: {bad[0]}")
                    p.update(k)

            t0 = time.perf_counter()
            await asyncio.gather(*(producer() for _ in range(PRODUCERS)))
            secs = time.perf_counter() - t0
        p.close()
        self.filled = target
        return {"jobs": n, "seconds": round(secs, 1), "jobs_per_s": round(n / secs)}

    def cluster_latency(self, i: int, digest: bool, calls: int = 3, timeout: float = 30.0) -> dict:
        """Median of `calls` calls, each after a write: a node caches its digest per applied index,
        and a cached answer would hide what a call costs after the state changed. A node with a
        large state answers at once with the newest digest it has (`digest_index`, older than
        the write) while a child hashes the current one: `first_ms` is the first call (it may
        wait for the node's first digest ever), `fresh_s` how long after the last write the
        node's digest belonged to its `last_applied` again."""
        url = self.c.urls[i] + "/v1/cluster" + ("" if digest else "?digest=false")
        lead = self.c.urls[self.leader()]
        times = []
        for n in range(calls):
            http_json("POST", lead + "/v1/jobs", {"queue": "probe", "job_type": "t"}, timeout=timeout,
                      headers=self.c.probe_headers)
            wrote = time.perf_counter()
            # The first call may wait for the node's first digest ever (O(state): a minute at 2M
            # jobs here): it gets the recovery timeout, the others the call timeout.
            wait = max(timeout, self.recovery_timeout) if digest and n == 0 else timeout
            status, _ = http_json("GET", url, timeout=wait, headers=self.c.probe_headers)
            if status != 200:
                return {"ms": None, "why": f"no answer within {wait:g} s ({status})"}
            times.append((time.perf_counter() - wrote) * 1000)
        out = {"ms": round(statistics.median(times), 1), "first_ms": round(times[0], 1)}
        if digest:
            end = wrote + self.recovery_timeout
            while time.perf_counter() < end:
                status, v = http_json("GET", url, timeout=timeout, headers=self.c.probe_headers)
                if status == 200 and v.get("digest_index") == v["last_applied"]:
                    out["fresh_s"] = round(time.perf_counter() - wrote, 2)
                    break
                time.sleep(0.1)
            else:
                out["fresh_s"] = None
        return out

    async def latency_beside(self, rounds: int = 200) -> dict:
        lat = []
        async with Client(self.c.urls) as client:
            for _ in range(rounds):
                t0 = time.perf_counter()
                await client.enqueue("beside", "bench", PAYLOAD)
                got = await client.reserve(["beside"], 60_000, wait_ms=1000)
                await client.ack(got[0])
                lat.append((time.perf_counter() - t0) * 1000)
        lat.sort()
        return {"p50_ms": round(lat[len(lat) // 2], 2), "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2)}

    def _caught_up(self, i: int, index: int, digest_of) -> bool:
        v = self.c.cluster_view(i, timeout=5.0)
        return bool(v) and v["last_applied"] >= index and digest_of(v)

    def wiped_follower(self) -> dict:
        lead = self.leader()
        f = (lead + 1) % self.c.n
        self.c.kill(f)
        self.c.wipe(f)
        lv = self.c.cluster_view(lead, timeout=30.0, digest=False)
        target = lv["commit_index"]
        t0 = time.monotonic()
        self.c.start(f)
        end = t0 + self.recovery_timeout
        while time.monotonic() < end:
            v = self.c.cluster_view(f, timeout=5.0, digest=False)
            if v and v["last_applied"] >= target:
                return {"seconds": round(time.monotonic() - t0, 1), "node": self.c.ids[f]}
            if not self.c.alive(f):
                return {"seconds": None, "why": f"{self.c.ids[f]} exited (code {self.c.procs[f].returncode})"}
            time.sleep(0.25)
        v = self.c.cluster_view(f, timeout=5.0, digest=False) or {}
        return {"seconds": None, "why": f"not caught up after {self.recovery_timeout:g} s "
                                       f"(applied {v.get('last_applied')} of {target})"}

    def truncated_follower(self) -> dict:
        import random
        from ..chaos import diskfaults
        lead = self.leader()
        f = (lead + 2) % self.c.n
        self.c.kill(f)
        d = self.c.data_dir(f)
        journal = d / "raft.journal"
        size = journal.stat().st_size if journal.exists() else None
        cut = diskfaults.truncate(d, random.Random(self.filled))
        lv = self.c.cluster_view(lead, timeout=30.0, digest=False)
        target = lv["commit_index"]
        t0 = time.monotonic()
        self.c.start(f)
        out = {"node": self.c.ids[f], "journal_bytes": size, "snapshot": (d / "raft.dump").exists(), **cut}
        end = t0 + self.recovery_timeout
        answered = None
        while time.monotonic() < end:
            v = self.c.cluster_view(f, timeout=5.0, digest=False)
            if v and answered is None:
                answered = round(time.monotonic() - t0, 1)
                out["found"] = v["disk"]["findings"]
            if v and v["disk"]["log_verified"] and v["last_applied"] >= target:
                return dict(out, answers_after_s=answered, seconds=round(time.monotonic() - t0, 1))
            if not self.c.alive(f):
                return dict(out, seconds=None, why=f"{self.c.ids[f]} exited (code {self.c.procs[f].returncode})")
            time.sleep(0.25)
        return dict(out, answers_after_s=answered, seconds=None,
                    why=f"not trusted and caught up after {self.recovery_timeout:g} s")

    async def _first_write(self, t0: float) -> dict:
        end = t0 + self.recovery_timeout
        async with Client(self.c.urls, timeout=self.recovery_timeout) as client:
            while time.monotonic() < end:
                try:
                    await client.enqueue("probe", "bench", b"x", timeout=max(1.0, end - time.monotonic()))
                    return {"seconds": round(time.monotonic() - t0, 2)}
                except Exception as e:            # Unavailable until a leader serves
                    last = e
                    await asyncio.sleep(0.05)
        return {"seconds": None, "why": f"no write within {self.recovery_timeout:g} s ({last})"}

    async def leader_kill(self) -> dict:
        lead = self.leader()
        t0 = time.monotonic()
        self.c.kill(lead)
        out = await self._first_write(t0)
        self.c.start(lead)
        return out

    async def restart_all(self) -> dict:
        self.c.kill_all()
        t0 = time.monotonic()
        for i in range(self.c.n):
            self.c.start(i)
        return await self._first_write(t0)

    def dump_size(self, i: int) -> int | None:
        p = self.c.data_dir(i) / "raft.dump"
        return p.stat().st_size if p.exists() else None

    def converge(self) -> None:
        self.c.wait_converged(self.recovery_timeout)

    # ---------------------------------------------------------------- one size
    async def step(self, size: int) -> dict:
        self.say(f"backlog {size:,}: filling")
        terms0 = self.terms()
        fill = await self.fill_to(size)
        terms1 = self.terms()
        lead = self.leader()
        follower = (lead + 1) % self.c.n
        rss = self.rss()
        per_job = None
        if size:
            per_job = [round((r - b) / size) if r is not None and b is not None else None
                       for r, b in zip(rss, self.base_rss)]
        out = {"backlog": size, "fill": fill, "terms_before": terms0, "terms_after": terms1,
               "elections_during_fill": None if None in terms0 + terms1 else max(terms1) - max(terms0),
               "rss_mb": _mb(rss), "bytes_per_job": per_job}
        self.say(f"backlog {size:,}: reads and latency")
        out["cluster_ms"] = {"leader_digest": self.cluster_latency(lead, True),
                             "leader_no_digest": self.cluster_latency(lead, False),
                             "follower_digest": self.cluster_latency(follower, True),
                             "follower_no_digest": self.cluster_latency(follower, False)}
        out["beside_backlog"] = await self.latency_beside()
        out["dump_bytes"] = self.dump_size(lead)
        self.say(f"backlog {size:,}: wiped follower catch-up")
        out["wiped_follower_catch_up"] = self.wiped_follower()
        self.say(f"backlog {size:,}: truncated journal, repair")
        self.converge()
        out["truncated_follower_repair"] = self.truncated_follower()
        self.converge()
        self.say(f"backlog {size:,}: leader kill to first write")
        out["leader_kill_to_write"] = await self.leader_kill()
        self.converge()
        self.say(f"backlog {size:,}: restart of every node to first write")
        out["restart_all_to_write"] = await self.restart_all()
        self.converge()
        # what each node holds once it has replayed: against rss_mb (the fill's end), what a
        # restart costs in memory (docs/performance.md "A 1M backlog under the engines")
        out["rss_mb_after_restart"] = _mb(self.rss())
        return out


def _mb(rss: list[int | None]) -> list[int | None]:
    """RSS in bytes per node -> in MB (None for a node not running)."""
    return [round(r / 2**20) if r else None for r in rss]


def state_machine_bytes_per_job(n: int = 50_000) -> int:
    """What the state machine alone holds per queued job of the fill (tracemalloc of a machine in
    this process that applied n of them as a leader does: each batch's body parsed from JSON,
    with the client's generated keys, a request id per batch, fresh uuid4 ids). Flat in the
    backlog: a node's bytes per job minus this is what the node holds beside its state
    (commands held in memory, allocator slack)."""
    import gc
    import tracemalloc
    import uuid

    import orjson

    from ...node.base import validate
    from ...node.core import ops
    from ...node.core.limits import Limits
    from ...node.core.machine import QueueMachine
    from ..client import auto_idempotency_key
    limits = Limits.build()
    job = job_request("backlog", "bench", PAYLOAD)
    blobs = [orjson.dumps({"jobs": [{**job, "idempotency_key": auto_idempotency_key()} for _ in range(BATCH)]})
             for _ in range(n // BATCH)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        m, now = QueueMachine(limits), 1_700_000_000_000
        for blob in blobs:
            rid = ops.request_id(None, uuid.uuid4().hex, "POST /v1/jobs/batch", uuid.uuid4().hex)
            m.apply(now, validate.enqueue_batch(orjson.loads(blob), limits, now, lambda: str(uuid.uuid4()), rid))
            now += 4
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    if len(m.jobs) != len(blobs) * BATCH:
        raise RuntimeError(f"the in-process fill made {len(m.jobs)} jobs of {len(blobs) * BATCH}")
    return round(held / len(m.jobs))


async def run_scale(sizes: list[int], durability: str, progress: bool, recovery_timeout: float,
                    directory: str | None, say, tuning: dict | None = None) -> dict:
    machine_per_job = state_machine_bytes_per_job()
    d = directory or tempfile.mkdtemp(prefix="raftq-scale-")
    cluster = LocalCluster(d, durability=durability, tuning=tuning).launch()
    try:
        s = Scale(cluster, progress, recovery_timeout, say)
        s.base_rss = s.rss()
        steps = []
        for size in sorted(sizes):
            steps.append(await s.step(size))
        return {"durability": durability, "tuning": cluster.tuning, "payload_bytes": len(PAYLOAD), "batch": BATCH, "producers": PRODUCERS,
                "base_rss_mb": _mb(s.base_rss),
                "state_machine_bytes_per_job": machine_per_job, "steps": steps, "dir": d}
    finally:
        cluster.stop_all()
        cluster.close()


def format_scale(result: dict) -> str:
    lines = [f"raftq bench --backlog: durability {result['durability']}, {result['payload_bytes']}-byte jobs in "
             f"batches of {result['batch']}, empty cluster RSS {result['base_rss_mb']} MB"]

    def sec(d):
        return f"{d['seconds']} s" if d.get("seconds") is not None else f"- ({d.get('why')})"

    for st in result["steps"]:
        f = st["fill"]
        lines.append(f"\nbacklog {st['backlog']:,}")
        if f.get("jobs"):
            lines.append(f"  fill             {f['jobs_per_s']:,} jobs/s ({f['jobs']:,} in {f['seconds']} s), "
                         f"terms {st['terms_before']} -> {st['terms_after']}")
        sm = result.get("state_machine_bytes_per_job")
        lines.append(f"  RSS per node     {st['rss_mb']} MB" +
                     (f", {st['bytes_per_job']} bytes per queued job" if st["bytes_per_job"] else "") +
                     (f": the state machine {sm}, the rest {[b - sm for b in st['bytes_per_job'] if b is not None]}"
                      if st["bytes_per_job"] and sm else ""))
        cm = st["cluster_ms"]
        lines.append("  /v1/cluster      " + ", ".join(
            f"{k.replace('_', ' ')} {v['ms']} ms" if v["ms"] is not None else f"{k.replace('_', ' ')} - ({v['why']})"
            for k, v in cm.items()))
        fresh = [f"{k.split('_')[0]} {v['fresh_s']} s" for k, v in cm.items() if "fresh_s" in v]
        if fresh:
            lines.append("  digest current   after a write: " + ", ".join(fresh)
                         + " (answers meanwhile carry the previous digest and its index)")
        b = st["beside_backlog"]
        lines.append(f"  beside backlog   enqueue->reserve->ack p50 {b['p50_ms']} ms, p99 {b['p99_ms']} ms")
        lines.append(f"  snapshot         {st['dump_bytes']} bytes (leader's raft.dump)")
        lines.append(f"  wiped follower   {sec(st['wiped_follower_catch_up'])}")
        t = st.get("truncated_follower_repair")
        if t:
            lines.append(f"  truncated journal answers after {t.get('answers_after_s')} s, trusted and caught up after "
                         f"{sec(t)} (journal {t.get('journal_bytes')} bytes cut at {t.get('cut_at')}, "
                         f"found {t.get('found')})")
        lines.append(f"  leader kill      first write after {sec(st['leader_kill_to_write'])}")
        lines.append(f"  restart all      first write after {sec(st['restart_all_to_write'])}; "
                     f"RSS per node after it {st.get('rss_mb_after_restart')} MB")
    return "\n".join(lines)
