"""In-process benchmark of the state machine through the command interface (not a test).

    python -m raftq.node.bench [--json] [--quick] [--repeat N]

Every figure goes through what the leader does for a request: `node.base.validate` turns a request
body dict into a command, `QueueMachine.apply` applies it, `node.core.answers.render` renders its
result into the answer. No HTTP, no Raft, no JSON encoding of the answer. Jobs carry a 256-byte
payload, base64 in the request body as a client sends it.

Figures:
* cycle_jobs_per_s        enqueue one, reserve one (max_jobs 1), ack it; one job per command.
                          Includes uuid4 generation (the leader makes the ids), see
                          uuid4_us; cycle_jobs_per_s_pregen_ids is the same with ids made
                          before the clock starts.
* batch_cycle_jobs_per_s  the same in batches of 256: enqueue_batch, reserve max_jobs 256,
                          ack_batch.
* reserve_us_at_1k/_1m    median cost of one reserve (parse + apply + render, max_jobs 1) with 1,000 and
                          1,000,000 ready jobs; each reserved job is acked and replaced outside
                          the timed region, so the depth stays constant.
* bytes_per_job           tracemalloc: memory held by 100,000 ready jobs (payload included),
                          enqueued from JSON request bodies (orjson) in batches of 256.
* snapshot_s_at_100k      to_builtins + pickle.dumps of the 100k-job machine;
  restore_s_at_100k       pickle.loads + from_builtins; the digest must survive.

Throttles (docs/api.md "Gating: throttles, circuit breakers, execution windows"), run alone with
`--resources R --backlog N` (e.g. 10000 and 1000000):
* throttle_reserve_us_*   reserve cost (parse + apply + render, max_jobs 1) with N ready jobs spread
                          at random over R resources of limit 1 (`[limits] resource_limits`); half
                          the resources are held full all along (a job of each in flight, never
                          acked), and --workers jobs are in flight at once (each cycle acks the
                          oldest one), so reserve keeps meeting full resources: their jobs move to
                          the blocked heaps and back when a slot frees. Median, mean (the mean
                          carries the blocking) and p99, the deferrals per reserve, the ack's cost
                          (it frees a slot and moves the resource's best blocked job back), and
                          baseline_*: the same loop with jobs that name no resource. The cyclic
                          GC runs with the node's thresholds (node/server.py).

Schedules, run alone with `--schedules N [--firing F]` (e.g. 10000 and 1000):
* bytes_per_schedule, schedule_put_us, next_due_us (the sweep loop's check), sweep_ms_idle (a
                          sweep with no tick due), snapshot_ms / restore_ms and their bytes, and
                          sweep_ms_at_tick: one sweep where F schedules fire at once (F jobs made).

Keys (docs/semantics.md "Keys"), run alone with `--keys [N]` (N keys, 100,000 when given without
a value) and `--backlog J` ready jobs (default 1,000,000), e.g. `--keys 100000 --backlog 1000000`:
* keys_reserve_us_*       reserve cost (parse + apply + render, max_jobs 1) in a queue with
                          `key_concurrency = 1`, J ready jobs spread round-robin over N keys, and
                          --held-fraction of the keys (default half) at their limit all along (one
                          job of each in flight, never acked), so they stay out of the rotation.
                          Each timed reserve is followed, untimed, by its ack (timed apart as
                          *_ack_us_mean) and a fresh job of the same key, so the backlog and the
                          held keys stay as they were. plain_reserve_us_* is the same loop on a
                          queue WITHOUT keys holding the same ready jobs (and the same jobs in
                          flight). The two machines are built once and measured in --rounds
                          alternated blocks (keyed, plain, plain, keyed, ...) of --samples / --rounds
                          reserves each: median and p99 over all samples, the per-block ranges, and
                          the ratios keyed / plain (the target: median and p99 within 2x).
* bytes_per_key           tracemalloc: N jobs of N distinct keys, one ready job each, in a queue
                          with key_concurrency 1 and key_rate 10 per 60 s, against the same N jobs
                          without keys; then every job is reserved and acked (batches of 256), the
                          clock moved past the rate window and sweeps applied (one per simulated
                          second, as the leader proposes them) until the keys' timers have dropped
                          every key: keys_left_after_sweeps (0, and the queue's keyed index gone)
                          and leak_bytes_per_key (the drained keyed machine against the drained
                          plain one).

Workflows (docs/semantics.md "Dependencies"), run alone with `--graph [N]` (N jobs, 1,000 when
given without a value):
* graph_{plain,chain,fanin}_{validate,apply}_ms   one atomic enqueue of N jobs (max_enqueue_batch
                          raised to N): plain jobs; a chain by `ref`, each job depending on the one
                          before; a fan-in of N - 1 members and one job depending on all of them.
                          Median of --repeat runs (validate: the body into a command; apply: the
                          command on a fresh machine).

Throughput figures are the best of --repeat runs (the machine may be shared); *_per_cpu_s
divide by this process's CPU time instead, to show the code's cost when other processes steal
the core. loadavg (before) and loadavg_after say how busy the machine was. Request ids are
not used (rid None), and the simulated leader clock advances 1 ms per 32 jobs, with a sweep
command every 1000 ms of it, as the leader proposes one per sweep_interval_ms.
"""
from __future__ import annotations

import argparse
import base64
import gc
import json
import os
import pickle
import platform
import statistics
import sys
import time
import tracemalloc
import uuid

import orjson

from .base import validate
from .core.answers import render
from .core.limits import Limits
from .core.machine import QueueMachine

PAYLOAD_BYTES = 256
QUEUE = "email-outbound"
JOB_TYPE = "send_transactional_email"
LEASE_MS = 30_000
T0 = 1_760_000_000_000          # simulated leader clock, ms since the epoch
JOBS_PER_MS = 32                # the simulated clock advances 1 ms per 32 jobs
SWEEP_EVERY_MS = 1_000          # the leader proposes a sweep about once per sweep_interval_ms

TARGETS = {
    "cycle_jobs_per_s": (">=", 30_000),
    "batch_cycle_jobs_per_s": (">=", 100_000),
    "reserve_ratio_1m_over_1k": ("<=", 1.5),
    "bytes_per_job": ("<=", 1_000),
    "snapshot_s_at_100k": ("<=", 1.0),
}


def new_id() -> str:
    return str(uuid.uuid4())


def job_body(i: int) -> dict:
    """A realistic EnqueueRequest: queue, job type and a fresh 256-byte payload in base64."""
    return {
        "queue": QUEUE,
        "job_type": JOB_TYPE,
        "payload": {"data_b64": base64.b64encode(os.urandom(PAYLOAD_BYTES)).decode("ascii"),
                    "encoding": "application/json"},
    }


def bodies(n: int) -> list[dict]:
    # A pool of distinct bodies reused round-robin: parsing costs the same, building them doesn't.
    pool = [job_body(i) for i in range(min(n, 1024))]
    return [pool[i % len(pool)] for i in range(n)]


class IdSource:
    """Pre-generated uuid4 ids, handed out as `new_id` for the fill phases."""
    def __init__(self, n: int):
        self.ids = [str(uuid.uuid4()) for _ in range(n)]
        self.i = 0

    def __call__(self) -> str:
        i = self.i
        self.i = i + 1
        return self.ids[i]


def fill(m: QueueMachine, limits: Limits, n: int, now: int) -> int:
    """Enqueue n ready jobs with enqueue_batch commands of 256; returns the clock used."""
    ids = IdSource(n)
    body_list = bodies(n)
    for start in range(0, n, 256):
        cmd = validate.enqueue_batch({"jobs": body_list[start:start + 256]}, limits, now, ids)
        status, res = render(m.apply(now, cmd))
        assert status == 200 and all("job_id" in r for r in res["results"]), res
        now += 1
    return now


def _check(result, what):
    result = render(result)             # as the leader does before it answers
    if result[0] != 200:
        raise RuntimeError(f"{what} failed: {result}")
    return result[1]


# ---------------------------------------------------------------------------------- measures
def bench_cycle(n: int, pregen: bool) -> tuple[float, float]:
    limits = Limits.build()
    m = QueueMachine(limits)
    body_list = bodies(n)
    rbody = {"queues": [QUEUE], "lease_ms": LEASE_MS, "max_jobs": 1}
    make_id = IdSource(n) if pregen else new_id
    enqueue, reserve, ack, apply = validate.enqueue, validate.reserve, validate.ack, m.apply
    sweep = validate.sweep()
    now = T0
    next_sweep = now + SWEEP_EVERY_MS
    gc.collect()
    t, c = time.perf_counter(), time.process_time()
    for i in range(n):
        if i % JOBS_PER_MS == 0:
            now += 1
            if now >= next_sweep:
                apply(now, sweep)
                next_sweep = now + SWEEP_EVERY_MS
        _check(apply(now, enqueue(body_list[i], limits, now, make_id)), "enqueue")
        cmd, _ = reserve(rbody, limits)
        job = _check(apply(now, cmd), "reserve")["jobs"][0]
        _check(apply(now, ack(job["id"], {"attempt": job["attempt"]})), "ack")
    elapsed, cpu = time.perf_counter() - t, time.process_time() - c
    assert not m.queues[QUEUE].ready and not m.queues[QUEUE].in_flight and m.queues[QUEUE].acked == n
    return n / elapsed, n / cpu


def bench_batch_cycle(n: int, batch: int = 256) -> tuple[float, float]:
    limits = Limits.build()
    m = QueueMachine(limits)
    body_list = bodies(n)
    rbody = {"queues": [QUEUE], "lease_ms": LEASE_MS, "max_jobs": batch}
    enqueue_batch, reserve, ack_batch, apply = validate.enqueue_batch, validate.reserve, validate.ack_batch, m.apply
    sweep = validate.sweep()
    now = T0
    next_sweep = now + SWEEP_EVERY_MS
    done = 0
    gc.collect()
    t, c = time.perf_counter(), time.process_time()
    for start in range(0, n, batch):
        now += max(1, batch // JOBS_PER_MS)
        if now >= next_sweep:
            apply(now, sweep)
            next_sweep = now + SWEEP_EVERY_MS
        _check(apply(now, enqueue_batch({"jobs": body_list[start:start + batch]}, limits, now, new_id)),
               "enqueue_batch")
        cmd, _ = reserve(rbody, limits)
        jobs = _check(apply(now, cmd), "reserve")["jobs"]
        acks = {"acks": [{"job_id": j["id"], "attempt": j["attempt"]} for j in jobs]}
        _check(apply(now, ack_batch(acks, limits)), "ack_batch")
        done += len(jobs)
    elapsed, cpu = time.perf_counter() - t, time.process_time() - c
    assert done == n == m.queues[QUEUE].acked and not m.queues[QUEUE].ready
    return done / elapsed, done / cpu


def bench_reserve_at(depth: int, samples: int) -> float:
    """Median microseconds of one reserve (parse + apply + render) at a constant ready depth."""
    limits = Limits.build()
    m = QueueMachine(limits)
    now = fill(m, limits, depth, T0)
    rbody = {"queues": [QUEUE], "lease_ms": LEASE_MS, "max_jobs": 1}
    refill = bodies(256)
    ids = IdSource(samples)
    reserve, ack, apply, enqueue = validate.reserve, validate.ack, m.apply, validate.enqueue
    perf = time.perf_counter
    times = []
    gc.collect()
    for i in range(samples):
        t = perf()
        cmd, _ = reserve(rbody, limits)
        res = render(apply(now, cmd))
        times.append(perf() - t)
        job = res[1]["jobs"][0]
        # Untimed: ack it and put a fresh job in, so the ready depth stays `depth`.
        apply(now, ack(job["id"], {"attempt": job["attempt"]}))
        apply(now, enqueue(refill[i & 255], limits, now, ids))
        if i % JOBS_PER_MS == 0:
            now += 1
    assert m.queues[QUEUE].ready == depth
    return statistics.median(times) * 1e6


def _fill_bodies(m, limits, bodies_iter, now) -> int:
    batch = []
    for body in bodies_iter:
        batch.append(body)
        if len(batch) == 256:
            _check(m.apply(now, validate.enqueue_batch({"jobs": batch}, limits, now, new_id)), "enqueue_batch")
            batch = []
            now += 1
    if batch:
        _check(m.apply(now, validate.enqueue_batch({"jobs": batch}, limits, now, new_id)), "enqueue_batch")
    return now + 1


def bench_throttled_reserve(resources: int, backlog: int, samples: int, workers: int = 1000,
                            with_baseline: bool = True) -> dict:
    """Reserve cost with `backlog` ready jobs over `resources` resources of limit 1, half of them
    held full (see the module docstring)."""
    import random
    if workers >= resources // 2:
        raise SystemExit("--workers must be below half of --resources (the free resources, limit 1 each)")
    rng = random.Random(17)
    names = [f"res-{i}" for i in range(resources)]
    limits = Limits.build(limits={"resource_limits": {r: 1 for r in names}})
    pool = bodies(256)

    def body(i, r):
        return {**pool[i & 255], "resource": r} if r is not None else pool[i & 255]

    out = {"resources": resources, "backlog": backlog, "samples": samples, "workers": workers}
    # The cyclic GC as a node runs it (node/server.py): with a million long-lived jobs the
    # default thresholds make its pauses, not reserve, the tail of the figure.
    old_threshold = gc.get_threshold()
    gc.set_threshold(50_000, 50, 1000)
    runs = [("throttle", True)] + ([("baseline", False)] if with_baseline else [])
    for label, throttled in runs:
        m = QueueMachine(limits)
        now = T0
        t0 = time.perf_counter()
        if throttled:
            # Every other resource is held full: one job of each reserved and never acked.
            held = names[::2]
            now = _fill_bodies(m, limits, (body(i, r) for i, r in enumerate(held)), now)
            while True:
                cmd, _ = validate.reserve({"queues": [QUEUE], "lease_ms": 10**9, "max_jobs": 256}, limits)
                if not _check(m.apply(now, cmd), "reserve")["jobs"]:
                    break
        pick = (lambda: names[rng.randrange(resources)]) if throttled else (lambda: None)
        now = _fill_bodies(m, limits, (body(i, pick()) for i in range(backlog)), now)
        out[f"{label}_fill_s"] = round(time.perf_counter() - t0, 1)
        q = m.queues[QUEUE]
        deferred = _reserve_ack_samples(m, limits, now, workers, samples, body, out, label)
        if throttled:
            out["throttle_deferrals_per_reserve"] = round(deferred / samples, 3)
            out["throttle_held_back_at_end"] = q.throttled
            out["throttle_ready_at_end"] = q.ready
            out["throttle_resources_in_use"] = len(m.in_use)
        del m, q
        gc.collect()
    gc.set_threshold(*old_threshold)
    out["machine"] = machine_info()
    return out


def _reserve_ack_samples(m, limits, now: int, workers: int, samples: int, body, out: dict, label: str) -> int:
    """Times `samples` reserves and acks after `workers` hand-outs fill up; each acked job is
    replaced by a fresh one of the same resource (untimed), so the backlog stays as it was.
    Returns the hold-backs (deferrals) while sampling."""
    rbody = {"queues": [QUEUE], "lease_ms": 10**9, "max_jobs": 1}
    reserve, ack, apply, enqueue = validate.reserve, validate.ack, m.apply, validate.enqueue
    perf = time.perf_counter
    inflight: list = []
    # Warm-up: the workers fill up (reserve meets, and holds back, the jobs of the full
    # resources it comes across on the way).
    t0 = perf()
    for i in range(workers):
        inflight.append(_check(apply(now, reserve(rbody, limits)[0]), "reserve")["jobs"][0])
    out[f"{label}_warmup_s"] = round(perf() - t0, 2)
    res_t, ack_t = [], []
    deferred0 = m.queues[QUEUE].deferred
    gc.collect()
    for i in range(samples):
        t = perf()
        jobs = render(apply(now, reserve(rbody, limits)[0]))[1]["jobs"]
        res_t.append(perf() - t)
        inflight.append(jobs[0])
        done = inflight.pop(0)
        t = perf()
        render(apply(now, ack(done["id"], {"attempt": done["attempt"]})))
        ack_t.append(perf() - t)
        # Untimed: a fresh job of the same resource, so the backlog stays as it was.
        apply(now, enqueue(body(i, done.get("resource")), limits, now, new_id))
        if i % JOBS_PER_MS == 0:
            now += 1
    res_t.sort()
    out[f"{label}_reserve_us_median"] = round(statistics.median(res_t) * 1e6, 2)
    out[f"{label}_reserve_us_mean"] = round(statistics.fmean(res_t) * 1e6, 2)
    out[f"{label}_reserve_us_p99"] = round(res_t[int(len(res_t) * 0.99)] * 1e6, 2)
    out[f"{label}_ack_us_mean"] = round(statistics.fmean(ack_t) * 1e6, 2)
    return m.queues[QUEUE].deferred - deferred0


def bench_memory_and_snapshot(n: int) -> dict:
    # Request bodies arrive as JSON bytes and are parsed per request (as the server does), so
    # every stored string and bytes object is the job's own; ids are fresh uuid4 texts.
    limits = Limits.build()
    blobs = [orjson.dumps({"jobs": [job_body(i) for i in range(256)]}) for _ in range(16)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    m = QueueMachine(limits)
    now = T0
    for k, start in enumerate(range(0, n, 256)):
        body = orjson.loads(blobs[k % len(blobs)])
        body["jobs"] = body["jobs"][:n - start]
        cmd = validate.enqueue_batch(body, limits, now, new_id)
        _check(m.apply(now, cmd), "enqueue_batch")
        now += 8
        cmd = body = None
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(m.jobs) == n
    out = {"bytes_per_job": round((after - before) / n, 1)}

    digest = m.digest()
    snap, restore = [], []
    for _ in range(3):          # best of 3, as the rest
        gc.collect()
        t = time.perf_counter()
        blob = pickle.dumps(m.to_builtins(), protocol=pickle.HIGHEST_PROTOCOL)
        snap.append(time.perf_counter() - t)
        m2 = None
        gc.collect()
        t = time.perf_counter()
        m2 = QueueMachine.from_builtins(limits, pickle.loads(blob))
        restore.append(time.perf_counter() - t)
    out["snapshot_s_at_100k"] = round(min(snap), 4)
    out["snapshot_bytes_per_job"] = round(len(blob) / n, 1)
    out["restore_s_at_100k"] = round(min(restore), 4)
    out["digest_survives_snapshot"] = m2.digest() == digest
    if not out["digest_survives_snapshot"]:
        raise RuntimeError("digest changed across snapshot/restore")
    return out


def bench_schedules(n: int, firing: int) -> dict:
    """Schedules (docs/semantics.md "Schedules"): n interval schedules of one minute, `firing` of
    them due at one tick and the others spread over the minute, in a machine with no job."""
    from .base import validate_schedule
    limits = Limits.build(limits={"max_schedules": max(n, 1), "max_schedules_per_sweep": max(firing, 1)})
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    m = QueueMachine(limits)
    t = time.perf_counter()
    for i in range(n):
        # the first `firing` share one tick (T0 + 60 s); each other one its own second of the minute
        created = T0 if i < firing else T0 + 1 + (i * 59_000) // n
        body = {"every_ms": 60_000, "job": {"queue": f"q{i % 10}", "job_type": "tick", "priority": 3}}
        _check(m.apply(created, validate_schedule.put(f"s{i}", body, limits, created)), "put")
    put_us = (time.perf_counter() - t) / n * 1e6
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    out = {"schedules": n, "schedule_put_us": round(put_us, 1),
           "bytes_per_schedule": round((after - before) / n, 1)}
    t = time.perf_counter()
    for _ in range(1000):
        m.next_due_ms()
    out["next_due_us"] = round((time.perf_counter() - t) * 1000, 2)
    idle = T0 + 59_000                      # nothing due yet: what a sweep for something else costs
    t = time.perf_counter()
    _check(m.apply(idle, validate.sweep()), "sweep")
    out["sweep_ms_idle"] = round((time.perf_counter() - t) * 1000, 3)
    blob = pickle.dumps(m.to_builtins(), protocol=pickle.HIGHEST_PROTOCOL)
    t = time.perf_counter()
    blob = pickle.dumps(m.to_builtins(), protocol=pickle.HIGHEST_PROTOCOL)
    out["snapshot_ms"] = round((time.perf_counter() - t) * 1000, 1)
    out["snapshot_bytes_per_schedule"] = round(len(blob) / n, 1)
    t = time.perf_counter()
    restored = QueueMachine.from_builtins(limits, pickle.loads(blob))
    out["restore_ms"] = round((time.perf_counter() - t) * 1000, 1)
    if restored.digest() != m.digest():
        raise RuntimeError("digest changed across snapshot/restore")
    t = time.perf_counter()
    result = m.apply(T0 + 60_000, validate.sweep())
    out["sweep_ms_at_tick"] = round((time.perf_counter() - t) * 1000, 2)
    out["ticks_fired_at_tick"] = result[-1]
    out["jobs_made"] = len(m.jobs)
    out["machine"] = machine_info()
    return out


# ---------------------------------------------------------------------------------- keys
KEY_RATE = {"count": 10, "period_ms": 60_000}      # the memory figure's per-key rate window


def _key_name(i: int) -> str:
    return f"tenant-{i:07d}"


class _KeysSide:
    """One machine of the keys figure: keyed (J ready jobs over N keys, some held at their
    concurrency limit) or plain (the same jobs without keys), and its reserve loop's state."""

    def __init__(self, label: str, keyed: bool, n_keys: int, ready: int, held: int, limits: Limits):
        self.label, self.keyed, self.limits = label, keyed, limits
        self.pool = bodies(256)
        m = self.m = QueueMachine(limits)
        now = T0
        t0 = time.perf_counter()
        # The held keys: one job each reserved under a lease that never ends, never acked (for
        # the plain side the same number of jobs in flight, without a key).
        now = _fill_bodies(m, limits, (self.body(i, _key_name(i)) for i in range(held)), now)
        while True:
            cmd, _ = validate.reserve({"queues": [QUEUE], "lease_ms": 10**9, "max_jobs": 256}, limits)
            if not _check(m.apply(now, cmd), "reserve")["jobs"]:
                break
        now = _fill_bodies(m, limits, (self.body(i, _key_name(i % n_keys)) for i in range(ready)), now)
        self.build_s = round(time.perf_counter() - t0, 1)
        self.now = now
        self.i = 0
        self.res_t: list = []
        self.ack_t: list = []
        self.blocks: list = []          # (median, p99) of each block, µs
        q = m.queues[QUEUE]
        assert q.ready == ready and q.in_flight == held, (q.ready, q.in_flight)
        if keyed:
            assert q.keys is not None and len(q.keys.by_key) == n_keys and q.keys.held_keys == held
        else:
            assert q.keys is None

    def body(self, i: int, key) -> dict:
        b = self.pool[i & 255]
        return {**b, "key": key} if self.keyed else b

    def block(self, samples: int, held: int) -> None:
        m, limits, now = self.m, self.limits, self.now
        rbody = {"queues": [QUEUE], "lease_ms": 10**9, "max_jobs": 1}
        reserve, ack, apply, enqueue = validate.reserve, validate.ack, m.apply, validate.enqueue
        perf = time.perf_counter
        res_t, ack_t = [], []
        i = self.i
        gc.collect()
        for _ in range(samples):
            t = perf()
            jobs = render(apply(now, reserve(rbody, limits)[0]))[1]["jobs"]
            res_t.append(perf() - t)
            job = jobs[0]
            t = perf()
            render(apply(now, ack(job["id"], {"attempt": job["attempt"]})))
            ack_t.append(perf() - t)
            key = job.get("key")
            if self.keyed and int(key[7:]) < held:
                raise RuntimeError(f"reserve handed out a job of held key {key}")
            # Untimed: a fresh job of the same key, so the backlog stays as it was.
            apply(now, enqueue(self.body(i, key), limits, now, new_id))
            i += 1
            if i % JOBS_PER_MS == 0:
                now += 1
        self.now, self.i = now, i
        self.res_t += res_t
        self.ack_t += ack_t
        res_t.sort()
        self.blocks.append((statistics.median(res_t) * 1e6, res_t[int(len(res_t) * 0.99)] * 1e6))

    def figures(self, out: dict) -> None:
        p = self.label
        t = sorted(self.res_t)
        out[f"{p}_build_s"] = self.build_s
        out[f"{p}_reserve_us_median"] = round(statistics.median(t) * 1e6, 2)
        out[f"{p}_reserve_us_p99"] = round(t[int(len(t) * 0.99)] * 1e6, 2)
        out[f"{p}_reserve_us_mean"] = round(statistics.fmean(t) * 1e6, 2)
        out[f"{p}_block_medians_us"] = f"{min(b[0] for b in self.blocks):.2f}–{max(b[0] for b in self.blocks):.2f}"
        out[f"{p}_block_p99s_us"] = f"{min(b[1] for b in self.blocks):.2f}–{max(b[1] for b in self.blocks):.2f}"
        out[f"{p}_ack_us_mean"] = round(statistics.fmean(self.ack_t) * 1e6, 2)


def bench_keys(n_keys: int, ready: int, held_fraction: float, samples: int, rounds: int) -> dict:
    """Keys (see the module docstring): reserve with `ready` jobs over `n_keys` keys, a fraction
    of them held at their concurrency limit, against a queue without keys; then memory per key
    and what is left after a drain and the sweeps."""
    if not 0 <= held_fraction < 1:
        raise SystemExit("--held-fraction must be at least 0 and below 1 (some keys must be free to serve)")
    if rounds < 1 or samples < rounds:
        raise SystemExit("--rounds must be at least 1 and at most --samples")
    held = int(n_keys * held_fraction)
    out = {"keys": n_keys, "ready_jobs": ready, "held_keys": held, "samples": samples, "rounds": rounds}
    # The same configuration on both sides: the plain side's jobs have no key, so its queue
    # never makes a keyed index and reserve takes the queue's own inline loop.
    limits = Limits.build(queues=[{"name": QUEUE, "key_concurrency": 1}])
    # The cyclic GC as a node runs it (node/server.py), as the throttle figure.
    old_threshold = gc.get_threshold()
    gc.set_threshold(50_000, 50, 1000)
    try:
        keyed = _KeysSide("keys", True, n_keys, ready, held, limits)
        plain = _KeysSide("plain", False, n_keys, ready, held, limits)
        per_block = samples // rounds
        ratios_med, ratios_p99 = [], []
        for r in range(rounds):     # alternated, the order flipped every round: keyed, plain, plain, keyed, ...
            for side in ((keyed, plain) if r % 2 == 0 else (plain, keyed)):
                side.block(per_block, held)
            ratios_med.append(keyed.blocks[-1][0] / plain.blocks[-1][0])
            ratios_p99.append(keyed.blocks[-1][1] / plain.blocks[-1][1])
        keyed.figures(out)
        plain.figures(out)
        q = keyed.m.queues[QUEUE]
        out["keys_at_end"] = len(q.keys.by_key)
        out["held_keys_at_end"] = q.keys.held_keys
        out["ratio_median"] = round(out["keys_reserve_us_median"] / out["plain_reserve_us_median"], 2)
        out["ratio_p99"] = round(out["keys_reserve_us_p99"] / out["plain_reserve_us_p99"], 2)
        out["ratio_median_per_round"] = f"{min(ratios_med):.2f}–{max(ratios_med):.2f}"
        out["ratio_p99_per_round"] = f"{min(ratios_p99):.2f}–{max(ratios_p99):.2f}"
        out["within_2x"] = out["ratio_median"] <= 2 and out["ratio_p99"] <= 2
        del keyed, plain, q
        gc.collect()
    finally:
        gc.set_threshold(*old_threshold)
    out.update(bench_keys_memory(n_keys))
    out["machine"] = machine_info()
    return out


def _keys_memory_side(n: int, keyed: bool, limits: Limits) -> dict:
    """Traced bytes of n ready jobs (n distinct keys, or none), after a drain, after the sweeps."""
    # As bytes_per_job: request bodies parsed from JSON as the server does, so every stored
    # string is the job's own; the keys are made in the traced region too.
    blobs = [orjson.dumps({"jobs": [job_body(i) for i in range(256)]}) for _ in range(4)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    m = QueueMachine(limits)
    now = T0
    for k, start in enumerate(range(0, n, 256)):
        body = orjson.loads(blobs[k % len(blobs)])
        body["jobs"] = body["jobs"][:n - start]
        if keyed:
            for j, job in enumerate(body["jobs"]):
                job["key"] = _key_name(start + j)
        _check(m.apply(now, validate.enqueue_batch(body, limits, now, new_id)), "enqueue_batch")
        now += 8
        body = job = None
    gc.collect()
    out = {"filled": tracemalloc.get_traced_memory()[0] - before}
    q = m.queues[QUEUE]
    out["keys_filled"] = len(q.keys.by_key) if q.keys is not None else 0
    # Drain: reserve 256 and ack them, until nothing is ready.
    rbody = {"queues": [QUEUE], "lease_ms": LEASE_MS, "max_jobs": 256}
    while True:
        cmd, _ = validate.reserve(rbody, limits)
        jobs = _check(m.apply(now, cmd), "reserve")["jobs"]
        if not jobs:
            break
        acks = {"acks": [{"job_id": j["id"], "attempt": j["attempt"]} for j in jobs]}
        _check(m.apply(now, validate.ack_batch(acks, limits)), "ack_batch")
        now += 8
        cmd = jobs = acks = None
    assert q.ready == 0 and q.in_flight == 0 and q.acked == n, (q.ready, q.in_flight, q.acked)
    gc.collect()
    out["drained"] = tracemalloc.get_traced_memory()[0] - before
    out["keys_drained"] = len(q.keys.by_key) if q.keys is not None else 0
    # Past every rate window: one sweep a simulated second until the key timers are done.
    now += KEY_RATE["period_ms"]
    sweeps = 0
    t = time.perf_counter()
    while True:
        _check(m.apply(now, validate.sweep()), "sweep")
        sweeps += 1
        now += SWEEP_EVERY_MS
        if not m.key_timers or sweeps >= 10_000:
            break
    out["sweep_s"] = time.perf_counter() - t
    out["sweeps"] = sweeps
    gc.collect()
    out["swept"] = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    out["keys_left"] = len(q.keys.by_key) if q.keys is not None else 0
    out["keyed_index_gone"] = q.keys is None
    out["key_timers_left"] = len(m.key_timers)
    return out


def bench_keys_memory(n: int) -> dict:
    limits = Limits.build(queues=[{"name": QUEUE, "key_concurrency": 1, "key_rate": KEY_RATE}])
    t = time.perf_counter()
    plain = _keys_memory_side(n, False, limits)
    gc.collect()
    keyed = _keys_memory_side(n, True, limits)
    out = {"memory_keys": n, "memory_s": round(time.perf_counter() - t, 1),
           "bytes_per_job_without_key": round(plain["filled"] / n, 1),
           "bytes_per_job_with_own_key": round(keyed["filled"] / n, 1),
           "bytes_per_key": round((keyed["filled"] - plain["filled"]) / n, 1),
           "keys_in_index": keyed["keys_filled"],
           "keys_after_drain": keyed["keys_drained"],
           "bytes_per_idle_key_in_window": round((keyed["drained"] - plain["drained"]) / n, 1),
           "sweeps_to_drop_keys": keyed["sweeps"],
           "sweeps_s": round(keyed["sweep_s"], 2),
           "keys_left_after_sweeps": keyed["keys_left"],
           "keyed_index_gone": keyed["keyed_index_gone"],
           "key_timers_left": keyed["key_timers_left"],
           "plain_bytes_after_drain": plain["swept"],
           "keys_bytes_after_sweeps": keyed["swept"],
           "leak_bytes_per_key": round((keyed["swept"] - plain["swept"]) / n, 2)}
    return out


def bench_uuid(n: int = 100_000) -> float:
    t = time.perf_counter()
    for _ in range(n):
        str(uuid.uuid4())
    return (time.perf_counter() - t) / n * 1e6


# ---------------------------------------------------------------------------------- main
def machine_info() -> dict:
    try:
        load = os.getloadavg()
    except OSError:
        load = (None, None, None)
    return {"python": platform.python_version(), "implementation": platform.python_implementation(),
            "platform": platform.platform(), "processor": _cpu_model(), "nproc": os.cpu_count(),
            "loadavg": [round(x, 2) if x is not None else None for x in load]}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _best(runs) -> tuple[int, int]:
    """Best wall-clock rate of the runs, and the best CPU-time rate (this process only)."""
    runs = list(runs)
    return round(max(r[0] for r in runs)), round(max(r[1] for r in runs))


def run(quick: bool = False, repeat: int = 5) -> dict:
    scale = 10 if quick else 1
    out = machine_info()
    out["uuid4_us"] = round(bench_uuid(), 3)
    # Best of `repeat` runs: the machine is shared, the best run is the least disturbed one.
    # The *_cpu figures divide by this process's CPU time instead of the wall clock: they show
    # what the code costs when other processes steal the core.
    out["cycle_jobs_per_s"], out["cycle_jobs_per_cpu_s"] = _best(
        bench_cycle(50_000 // scale, False) for _ in range(repeat))
    out["cycle_jobs_per_s_pregen_ids"], _ = _best(bench_cycle(50_000 // scale, True) for _ in range(repeat))
    out["batch_cycle_jobs_per_s"], out["batch_cycle_jobs_per_cpu_s"] = _best(
        bench_batch_cycle(256 * 400 // scale) for _ in range(repeat))
    samples = 20_000 // scale
    out["reserve_us_at_1k"] = round(min(bench_reserve_at(1_000, samples) for _ in range(repeat)), 2)
    out["reserve_us_at_1m"] = round(bench_reserve_at(1_000_000 // scale, samples), 2)
    out["reserve_ratio_1m_over_1k"] = round(out["reserve_us_at_1m"] / out["reserve_us_at_1k"], 3)
    out.update(bench_memory_and_snapshot(100_000))
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out["targets_met"] = {k: (out[k] >= v if op == ">=" else out[k] <= v) for k, (op, v) in TARGETS.items()}
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line, with the module's description (what each figure is) as its help."""
    first, _, _, rest = __doc__.split("\n", 3)       # the summary, then all but the usage line
    ap = argparse.ArgumentParser(prog="python -m raftq.node.bench", description=f"{first}\n\n{rest.lstrip()}",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="Print the figures as one JSON line instead of a table.")
    ap.add_argument("--quick", action="store_true", help="Do a tenth of the work, one run each: a smoke test, not "
                    "a measurement.")
    ap.add_argument("--repeat", type=int, default=5, metavar="N", help="Runs per throughput figure; the best one "
                    "is kept (default %(default)s).")
    ap.add_argument("--resources", type=int, metavar="R", help="Measure the throttle figure only, with R distinct "
                    "resources.")
    ap.add_argument("--backlog", type=int, default=1_000_000, metavar="N",
                    help="The throttle and keys figures: N ready jobs (default %(default)s).")
    ap.add_argument("--samples", type=int, default=20_000, metavar="N", help="The throttle and keys figures: "
                    "timed reserve and ack cycles (default %(default)s; the keys figure runs as many on each "
                    "side).")
    ap.add_argument("--workers", type=int, default=1000, metavar="N", help="The throttle figure: jobs in flight "
                    "at once (default %(default)s).")
    ap.add_argument("--no-baseline", action="store_true", help="The throttle figure: skip the run without "
                    "resources.")
    ap.add_argument("--schedules", type=int, metavar="N", help="Measure the schedules figure only, with N "
                    "schedules: memory, snapshot, an idle sweep, and a sweep at a tick where --firing of them fire.")
    ap.add_argument("--firing", type=int, default=1000, metavar="F", help="The schedules figure: schedules due at "
                    "one tick (default %(default)s).")
    ap.add_argument("--keys", type=int, nargs="?", const=100_000, metavar="N", help="Measure the keys figure "
                    "only, with N keys (100000 when given without a value): reserve with --backlog ready jobs "
                    "spread over the N keys against a queue without keys, then memory per key and what a drain "
                    "and the sweeps leave of N one-off keys.")
    ap.add_argument("--held-fraction", type=float, default=0.5, metavar="F", help="The keys figure: the fraction "
                    "of the keys held at their concurrency limit all along (default %(default)s).")
    ap.add_argument("--rounds", type=int, default=4, metavar="R", help="The keys figure: alternated blocks of "
                    "reserves on each side, the order flipped every round (default %(default)s).")
    ap.add_argument("--graph", type=int, nargs="?", const=1000, metavar="N", help="Measure the workflows figure "
                    "only: one atomic enqueue of an N-job graph (1000 when given without a value), plain, a chain, "
                    "a fan-in.")
    return ap


def _graph_bodies(kind: str, n: int) -> list[dict]:
    if kind == "plain":
        return [{"queue": "q", "job_type": "t"} for _ in range(n)]
    if kind == "chain":
        return [{"queue": "q", "job_type": "t", "ref": f"j{i}", **({"depends_on": [{"ref": f"j{i - 1}"}]} if i else {})}
                for i in range(n)]
    return ([{"queue": "q", "job_type": "t", "ref": f"j{i}"} for i in range(n - 1)]
            + [{"queue": "q", "job_type": "t", "depends_on": [{"ref": f"j{i}"} for i in range(n - 1)]}])


def bench_graph(n: int, repeat: int) -> dict:
    """The --graph figures: one atomic enqueue of an n-job graph, validated then applied."""
    limits = Limits.build(limits={"max_enqueue_batch": max(n, 256)})
    out = {}
    for kind in ("plain", "chain", "fanin"):
        v, a = [], []
        for _ in range(max(repeat, 1)):
            m, body = QueueMachine(limits), {"jobs": _graph_bodies(kind, n)}
            t0 = time.perf_counter()
            cmd = validate.enqueue_atomic(body, limits, 1_764_500_000_000, new_id)
            t1 = time.perf_counter()
            _check(m.apply(1_764_500_000_000, cmd), f"graph {kind}")
            a.append((time.perf_counter() - t1) * 1000)
            v.append((t1 - t0) * 1000)
        out[f"graph_{kind}_validate_ms"] = round(statistics.median(v), 2)
        out[f"graph_{kind}_apply_ms"] = round(statistics.median(a), 2)
    return out


def _print_figures(out: dict, as_json: bool, width: int) -> int:
    """One figure a line (or one JSON line), for the single-figure modes."""
    if as_json:
        print(json.dumps(out, separators=(",", ":")))
    else:
        for k, v in out.items():
            print(f"{k:<{width}}  {v:,}" if isinstance(v, (int, float)) and not isinstance(v, bool)
                  else f"{k:<{width}}  {v}")
    return 0


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.schedules:
        return _print_figures(bench_schedules(args.schedules, args.firing), args.json, 28)
    if args.keys:
        return _print_figures(bench_keys(args.keys, args.backlog, args.held_fraction, args.samples, args.rounds),
                              args.json, 30)
    if args.graph:
        return _print_figures(bench_graph(args.graph, args.repeat), args.json, 28)
    if args.resources:
        return _print_figures(bench_throttled_reserve(args.resources, args.backlog, args.samples, args.workers,
                                                      not args.no_baseline), args.json, 34)
    out = run(quick=args.quick, repeat=1 if args.quick else args.repeat)
    if args.json:
        print(json.dumps(out, separators=(",", ":")))
        return 0
    width = max(len(k) for k in out)
    for k, v in out.items():
        if k == "targets_met":
            continue
        target = TARGETS.get(k)
        note = ""
        if target:
            note = f"   target {target[0]} {target[1]:,}  {'ok' if out['targets_met'][k] else 'MISSED'}"
        shown = f"{v:,}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
        print(f"{k:<{width}}  {shown}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
