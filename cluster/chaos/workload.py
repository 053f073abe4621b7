"""The chaos workload: producers and workers on the real client, recording a history.

Every client operation becomes one *op* in the history: its invoke time, its completion time and
its outcome, Jepsen-style:
* `ok`      it happened (the cluster answered success);
* `fail`    it definitely did not happen (a definite refusal: `job_not_found`,
            `attempt_mismatch`, `rejected`, ...);
* `unknown` it may or may not have happened (the call's deadline passed: timeouts, lost
            leaders, lost quorum).

Producers enqueue unique values `"<proc>-<n>"` (in the payload, with the idempotency key when
there is one), so a delivered job can be traced back to the enqueue that made it even when that
enqueue's outcome was unknown. Three kinds of producers: `keyed` (explicit idempotency keys, and
now and then a deliberate re-send of an earlier key with a new value, which must deduplicate),
`auto` (the client's automatic keys) and `raw` (no key at all, plain HTTP: only request ids make
retries safe). Some jobs are scheduled, some are `poison` (workers never ack them, so they must
end dead-lettered). Workers ack, ack in batches, nack with each directive, extend, and sometimes
stall past their lease and then ack (a zombie that must be fenced off). A probe writes one small
job every 100 ms so that the report can say when writes work again after each fault.

Gated queues (docs/api.md "Gating: throttles, circuit breakers, execution windows"; on unless
`gated=False`): `thr` jobs name one of a few resources with a small in-flight limit; `cb` has a
circuit breaker and its jobs always fail, so after a few failures it is open for good and only
probes go out; `win` has an execution window that is open in every other UTC minute. Workers also
release some jobs (handed back, no attempt used). The checker holds the history to the limits, the
breaker and the window (checker.py `gates`), and before the final drain `lift_gates` takes the
window and the breaker off so everything drains.

Schedules (on unless `schedules=False`): `create_schedules` makes `SCHEDULES` at the start (one
tick a second each, into the queue `sched`, one per catch-up policy, `all` twice: with a
misfire_after_ms longer than any fault, and with 1 s so its missed ticks are caught up), recorded
as `schedule_put` ops; the workers take their jobs like any other and the history keeps each
delivery's schedule and tick (the custom fields `raftq.schedule`, `raftq.tick_ms`) and
`enqueued_at`. At the end `pause_schedules` pauses them before the final drain, which takes
their last jobs and then reads the schedules' views (`schedule_views`: `fired` per schedule).
The checker holds the ticks to one job per tick and to the catch-up policy (checker.py
`judge_one_job_per_tick`, `judge_no_tick_missed`).

Keyed queues (docs/semantics.md "Keys"; on unless `keys=False`): `KEY_QUEUES` are declared with
per-key limits (node/core/keys.py): `chaos-keyed` with `key_concurrency = 1` over 20 keys (one of
them allowed 2), `chaos-rated` with `key_rate = {count = 5, period_ms = 1000}` (one key 2 a second)
and a queue-wide `rate`. A key producer enqueues jobs with a `key` (a few hot keys get most of
them, sometimes in bursts of one key), key workers reserve from those queues only, with a fixed
lease (`KEY_LEASE_MS`, far below the clamp), hold each job a little and ack it, or nack, release,
or stall past the lease. A delivered job's key is recorded as `tenant` (the history's `key` is the
idempotency key): the server's when the client's Job carries it, else the copy the workload puts in
the payload (`g`). The checker holds the hand-outs to the limits on the replicated clock
(checker.py `judge_key_concurrency_held`, `judge_key_rate_held`, `judge_queue_rate_held`).

Workflows (docs/semantics.md "Dependencies"; on unless `workflows=False`): a workflow producer
enqueues small graphs into `WORKFLOW_QUEUE`, each all or nothing (`/v1/jobs/atomic`): chains of
2-4 jobs (half of them by `Client.chain`, all `success`; the others with refs and now and then a
`complete` link) and fan-ins (2-5 members and one job depending on all of them, each edge
`success`, `complete` or `ignore`); a tenth of the dependents also wait out a short delay. Each
job has a value of its own; the enqueue's items record the graph by values (`graph`, `shape`,
`ref`, `deps` [[the dependency's value, policy], ...]) and each delivery and dead letter the
`depends_on` the cluster shows. Two workflow workers take them (that queue only) and ack most,
nack some to the dead letters (`workflow_dead_rate`, so their `success` dependents end
`dependency_failed`), nack others (the last attempt dead-letters) or stall past the lease (a
task of its own acks late: the worker goes on). The final drain counts `waiting` jobs as not
drained. The checker holds the deliveries to the graph (checker.py `judge_dependents_wait`,
`judge_dependency_failed_never_runs`, `judge_fan_in_runs_once`).

Batches (docs/semantics.md "Batches"; on unless `batches=False`): a batch producer opens batches
of 2-6 members in `BATCH_QUEUE` with all three callbacks into `CALLBACK_QUEUE` (job_type the kind),
a third of them open, filled by a second request and closed; two batch workers take both queues,
ack the callbacks and most members and nack some members to the dead letters. The checker holds
the callbacks to the members (checker.py `judge_batch_callbacks_once`, `judge_callback_after_members`).
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import orjson

from ..client import (BatchRejected, Client, Conflict, Internal, InvalidArgument, Job, LeaseLost, NotFound,
                     RaftqError, Rejected, Retry, job_request)
from ...node.core.schedules import SCHEDULE_FIELD, TICK_FIELD

QUEUES = ("a", "b")
PROBE_QUEUE = "probe"
LIVE_QUEUE = "live"
THROTTLE_QUEUE, CIRCUIT_QUEUE, WINDOW_QUEUE = "thr", "cb", "win"
GATED_QUEUES = (THROTTLE_QUEUE, CIRCUIT_QUEUE, WINDOW_QUEUE)
RESOURCES = ("r0", "r1", "r2")
RESOURCE_LIMIT = 2
CIRCUIT = {"failures": 3, "window_ms": 3_600_000, "open_ms": 1500}
ALL_DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
SCHEDULE_QUEUE = "sched"
# The run's schedules: name -> the PUT body's options (each ticks every second into SCHEDULE_QUEUE).
# `chaos-all`'s misfire_after_ms is longer than any fault and its window longer than any run, so
# every tick must fire, on time; `chaos-catchup` misses ticks in outages and must catch up each.
SCHEDULES = {
    "chaos-all": {"every_ms": 1000, "catchup": "all", "misfire_after_ms": 600_000, "catchup_window_ms": 3_600_000},
    "chaos-catchup": {"every_ms": 1000, "catchup": "all", "misfire_after_ms": 1000, "catchup_window_ms": 3_600_000},
    "chaos-one": {"every_ms": 1000, "catchup": "one", "misfire_after_ms": 1000},
    "chaos-skip": {"every_ms": 1000, "catchup": "skip", "misfire_after_ms": 1000},
}
# Keyed queues (docs/semantics.md "Keys"): name -> the [[queues]] entry's key settings.
# `chaos-keyed`: at most one job of a key in flight (t00, the hottest key, two); `chaos-rated`: at
# most 5 hand-outs of a key in any second (r3 two), at most 12 of the queue.
KEYED_QUEUE, RATED_QUEUE = "chaos-keyed", "chaos-rated"
KEY_QUEUES = (KEYED_QUEUE, RATED_QUEUE)
KEY_QUEUE_SETTINGS = {
    KEYED_QUEUE: {"key_concurrency": 1, "key_limits": {"t00": {"concurrency": 2}}},
    RATED_QUEUE: {"key_rate": {"count": 5, "period_ms": 1000}, "rate": {"count": 12, "period_ms": 1000},
                  "key_limits": {"r3": {"rate": {"count": 2, "period_ms": 1000}}}},
}
QUEUE_KEYS = {KEYED_QUEUE: tuple(f"t{i:02d}" for i in range(20)), RATED_QUEUE: ("r0", "r1", "r2", "r3")}
# How often each key is picked: a few hot keys get most jobs, so limits bind.
KEY_WEIGHTS = {KEYED_QUEUE: tuple(1 / (i + 1) for i in range(20)), RATED_QUEUE: (4, 2, 2, 2)}
KEY_LEASE_MS = 2000                 # the key workers' lease: fixed, far below max_lease_duration_ms
WORKFLOW_QUEUE = "wf"               # the workflow graphs' jobs (docs/semantics.md "Dependencies")
WORKFLOW_TYPE = "step"
BATCH_QUEUE = "bt"                  # batch members (docs/semantics.md "Batches")
CALLBACK_QUEUE = "btcb"             # their callbacks: job_type is the kind, custom field batch_id
BATCH_TYPE = "member"
CALLBACK_KINDS = ("on_complete", "on_success", "on_failure")
BATCH_TIMEOUT_MS = 600_000          # an open batch's timeout: far past a run, so only close_batch closes it


def keys_config() -> tuple[list, dict]:
    """What a keyed run configures: ([[queues]] entries, the checker's `keys`: queue -> its key
    settings as configured)."""
    queues = [{"name": name, **settings} for name, settings in KEY_QUEUE_SETTINGS.items()]
    return queues, {name: dict(settings) for name, settings in KEY_QUEUE_SETTINGS.items()}


def gates_config(now_ms: int, minutes: int) -> tuple[dict, list, dict]:
    """What a gated run configures: ([limits] additions, [[queues]] entries, the checker's
    `gates`). The window is open in every even UTC minute from now for `minutes` minutes (a
    minute that would end at midnight is left out: a window ending at 00:00 would span it)."""
    spans, windows = [], []
    first = now_ms // 60_000
    for m in range(first, first + minutes):
        if m % 2 or (m % 1440) == 1439:
            continue
        start = m * 60_000
        spans.append([start, start + 60_000])
        hh, mm = divmod(m % 1440, 60)
        eh, em = divmod(m % 1440 + 1, 60)
        windows.append({"days": list(ALL_DAYS), "start": f"{hh:02d}:{mm:02d}", "end": f"{eh:02d}:{em:02d}",
                        "time_zone": "UTC"})
    limits = {"resource_limits": {r: RESOURCE_LIMIT for r in RESOURCES}}
    queues = [{"name": CIRCUIT_QUEUE, "circuit_breaker": dict(CIRCUIT)},
              {"name": WINDOW_QUEUE, "windows": windows}]
    gates = {"resource_limits": dict(limits["resource_limits"]),
             "circuit": {"queue": CIRCUIT_QUEUE, "failures": CIRCUIT["failures"], "open_ms": CIRCUIT["open_ms"]},
             "windows": {"queue": WINDOW_QUEUE, "open": spans}}
    return limits, queues, gates


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------------- history
class History:
    """Ops in invoke order. Times: `t0`/`t1` are monotonic seconds since the run started (one
    clock for the whole process, so real-time order between ops is exact); `w0`/`w1` are wall
    milliseconds (for comparisons with the cluster's clock)."""

    def __init__(self, url_to_node: dict | None = None, sink=None):
        self.ops: list[dict] = []
        self.start = time.monotonic()
        self.url_to_node = url_to_node or {}
        self.sink = sink                   # a file for JSONL events, or None
        self.counts: dict[tuple, int] = {}
        self.internal_errors: list[dict] = []

    def now(self) -> float:
        return time.monotonic() - self.start

    def _node(self, client: Client | None):
        if client is not None and client.spread and client._home is not None:
            return self.url_to_node.get(client._home, client._home)       # the node it called
        if client is None or client.leader is None:
            return None
        return self.url_to_node.get(client.leader, client.leader)

    def invoke(self, proc: str, f: str, client: Client | None = None, **fields) -> dict:
        op = {"id": len(self.ops), "proc": proc, "f": f, "t0": self.now(), "w0": wall_ms(),
              "t1": None, "w1": None, "outcome": None, "node": self._node(client), **fields}
        self.ops.append(op)
        if self.sink is not None:
            self.sink.write(orjson.dumps({"type": "invoke", **op}) + b"\n")
        return op

    def complete(self, op: dict, outcome: str, client: Client | None = None, **fields) -> dict:
        op["t1"], op["w1"], op["outcome"] = self.now(), wall_ms(), outcome
        node = self._node(client)
        if node is not None:
            op["node"] = node
        op.update(fields)
        key = (op["f"], outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.sink is not None:
            self.sink.write(orjson.dumps({"type": outcome, "id": op["id"], "t1": op["t1"], "w1": op["w1"],
                                          "node": op.get("node"), **fields}) + b"\n")
        return op

    def fail_from(self, op: dict, exc: BaseException, client: Client | None = None) -> dict:
        outcome, code = classify(exc)
        if isinstance(exc, Internal):
            self.internal_errors.append({"op": op["id"], "f": op["f"], "message": str(exc)})
        return self.complete(op, outcome, client, error=code)

    def close_open(self):
        """Ops that never completed (cancelled at shutdown) are unknown."""
        for op in self.ops:
            if op["outcome"] is None:
                self.complete(op, "unknown", error="cancelled")


DEFINITE_FAILURES = (LeaseLost, Rejected, BatchRejected, InvalidArgument, NotFound, Conflict)


def classify(exc: BaseException) -> tuple[str, str]:
    """(outcome, error code) of a failed call: a definite refusal is `fail`, anything that may
    have been applied (deadline passed, connection lost, internal error) is `unknown`."""
    if isinstance(exc, DEFINITE_FAILURES):
        return "fail", exc.code
    if isinstance(exc, RaftqError):
        return "unknown", exc.code
    if isinstance(exc, asyncio.CancelledError):
        return "unknown", "cancelled"
    return "unknown", type(exc).__name__


def payload_of(value: str, key: str | None, job_type: str, tenant: str | None = None) -> bytes:
    """The job's payload: its value, idempotency key and type; a keyed job's key as `g`."""
    if tenant is None:
        return orjson.dumps({"v": value, "k": key, "t": job_type})
    return orjson.dumps({"v": value, "k": key, "t": job_type, "g": tenant})


def delivery(job: Job) -> dict:
    """What the history keeps of a delivered job."""
    try:
        p = orjson.loads(job.payload) if job.payload else {}
    except orjson.JSONDecodeError:
        p = {}
    custom = getattr(job, "custom", None) or {}
    return {"job_id": job.id, "attempt": job.attempt, "max_attempts": job.max_attempts, "queue": job.queue,
            "job_type": job.job_type, "value": p.get("v"), "key": p.get("k"),
            "lease_expires": job.lease_expires_at_ms, "scheduled_at": job.scheduled_at_ms,
            "enqueued_at": job.enqueued_at_ms, "releases": getattr(job, "releases", 0) or 0,
            "resource": getattr(job, "resource", None), "tenant": getattr(job, "key", None) or p.get("g"),
            "schedule": custom.get(SCHEDULE_FIELD), "tick": custom.get(TICK_FIELD),
            "depends_on": [{"job_id": d, "policy": pol} for d, pol in getattr(job, "depends_on", ()) or ()] or None,
            "batch_id": custom.get("batch_id")}


# ---------------------------------------------------------------------------- workload
@dataclass
class WorkloadConfig:
    producers: int = 3                 # cycled through the kinds keyed, auto, raw
    workers: int = 4
    think_s: tuple = (0.03, 0.12)      # producer pause between enqueues
    op_timeout_s: float = 8.0          # a call's deadline (the client retries within it)
    attempt_timeout_s: float = 2.0     # one try against one node (a paused leader costs this much)
    lease_ms: int = 2000
    wait_ms: int = 500
    probe_interval_s: float = 0.1
    probe_timeout_s: float = 3.0
    probe_max_outstanding: int = 12
    sweep_interval_ms: int = 500
    poison_rate: float = 0.06
    scheduled_rate: float = 0.15
    max_schedule_ms: int = 2500
    transports: tuple = ("session", "http")
    gated: bool = True                 # also the gated queues (thr, cb, win) and releases
    gated_rate: float = 0.3            # share of producer jobs that go to a gated queue
    release_rate: float = 0.05         # share of work jobs a worker hands back
    schedules: bool = True             # also the schedules (SCHEDULES) and their queue
    keys: bool = True                  # also the keyed queues (KEY_QUEUES), their producer and workers
    key_producers: int = 1
    key_workers: int = 3
    key_think_s: tuple = (0.05, 0.15)  # key producer pause between enqueues
    key_hold_s: tuple = (0.05, 0.3)    # how long a key worker holds a job before it settles it
    workflows: bool = True             # also the workflow graphs (chains, fan-ins) in WORKFLOW_QUEUE
    workflow_producers: int = 1
    workflow_workers: int = 2
    workflow_think_s: tuple = (0.2, 0.5)   # workflow producer pause between graphs
    workflow_dead_rate: float = 0.12   # share of workflow deliveries nacked straight to the dead letters
    batches: bool = True               # also batches with callbacks (BATCH_QUEUE, CALLBACK_QUEUE)
    batch_workers: int = 2
    batch_think_s: tuple = (0.3, 0.7)  # batch producer pause between batches
    batch_dead_rate: float = 0.04      # share of member deliveries nacked straight to the dead letters
    spread: bool = True                # every other client calls one node of its own, which forwards
                                       # to the leader (Client(spread=True), docs/api.md "Followers")


class Workload:
    def __init__(self, urls: list[str], history: History, seed: int, config: WorkloadConfig | None = None):
        self.urls = list(urls)
        self.h = history
        self.cfg = config or WorkloadConfig()
        self.seed = seed
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.clients: list[Client] = []
        self.stalls = 0
        # What the key sampler saw of the keyed queues (GET /v1/queues/{name}): the most keys
        # held at a limit and ready jobs they held back at once, per queue.
        self.key_samples: dict = {q: {"samples": 0, "max_keys_at_limit": 0, "max_ready_held_by_keys": 0,
                                      "max_keys": 0} for q in KEY_QUEUES}

    def client(self, **kw) -> Client:
        kw.setdefault("timeout", self.cfg.op_timeout_s)
        kw.setdefault("connect_timeout", 1.0)
        kw.setdefault("attempt_timeout", self.cfg.attempt_timeout_s)
        if self.cfg.spread and len(self.clients) % 2:
            kw.setdefault("spread", True)
        c = Client(self.urls, **kw)
        self.clients.append(c)
        return c

    def start(self):
        loop = asyncio.get_running_loop()
        kinds = ("keyed", "auto", "raw")
        for i in range(self.cfg.producers):
            kind = kinds[i % len(kinds)]
            self.tasks.append(loop.create_task(self.producer(f"p{i}", kind, random.Random(f"{self.seed}-p{i}"))))
        for i in range(self.cfg.workers):
            self.tasks.append(loop.create_task(self.worker(f"w{i}", random.Random(f"{self.seed}-w{i}"))))
        if self.cfg.keys:
            for i in range(self.cfg.key_producers):
                self.tasks.append(loop.create_task(self.key_producer(f"kp{i}", random.Random(f"{self.seed}-kp{i}"))))
            for i in range(self.cfg.key_workers):
                self.tasks.append(loop.create_task(self.key_worker(f"kw{i}", random.Random(f"{self.seed}-kw{i}"))))
            self.tasks.append(loop.create_task(self.key_sampler()))
        if self.cfg.workflows:
            for i in range(self.cfg.workflow_producers):
                self.tasks.append(loop.create_task(
                    self.workflow_producer(f"wp{i}", random.Random(f"{self.seed}-wp{i}"))))
            for i in range(self.cfg.workflow_workers):
                self.tasks.append(loop.create_task(
                    self.workflow_worker(f"ww{i}", random.Random(f"{self.seed}-ww{i}"))))
        if self.cfg.batches:
            self.tasks.append(loop.create_task(self.batch_producer("bp0", random.Random(f"{self.seed}-bp0"))))
            for i in range(self.cfg.batch_workers):
                self.tasks.append(loop.create_task(self.batch_worker(f"bw{i}", random.Random(f"{self.seed}-bw{i}"))))
        self.tasks.append(loop.create_task(self.probe()))

    async def stop(self, grace_s: float = 15.0):
        """Stop producing and working; let the ops in flight finish (bounded), then cancel."""
        self.stopping.set()
        done, pending = await asyncio.wait(self.tasks, timeout=grace_s) if self.tasks else (set(), set())
        late = [t for t in self.tasks if t not in done and t not in pending]   # a zombie's ack begun meanwhile
        if late:
            pending |= (await asyncio.wait(late, timeout=5))[1]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
        for c in self.clients:
            try:
                await c.close()
            except Exception:
                pass
        self.clients.clear()

    async def create_schedules(self, tries: int = 5) -> list[str]:
        """Before the workers start: create SCHEDULES (create only, `expect_version` 0), each
        recorded as a `schedule_put` op with its options and, when ok, its first tick
        (`next_fire_at_ms`: the interval's grid). A try whose outcome is unknown is followed by
        another; a Conflict then means the first one made it (its view gives the first tick).
        The names of the schedules that exist."""
        if not self.cfg.schedules:
            return []
        c = self.client()
        made = []
        for name, options in SCHEDULES.items():
            template = {"queue": SCHEDULE_QUEUE, "job_type": "tick", "payload": orjson.dumps({"t": "tick", "s": name}),
                        "encoding": "application/json", "max_attempts": 3}
            for _ in range(tries):
                op = self.h.invoke("sched", "schedule_put", c, name=name, queue=SCHEDULE_QUEUE, **options)
                try:
                    out = await c.put_schedule(name, template, expect_version=0, **options)
                    self.h.complete(op, "ok", c, next_fire_at_ms=out.get("next_fire_at_ms"), version=out.get("version"))
                except Conflict:
                    try:
                        view = await c.schedule(name)
                    except Exception as e:
                        self.h.fail_from(op, e, c)
                        continue
                    # The first tick of an interval without a start: one interval after creation.
                    self.h.complete(op, "ok", c, existed=True, version=view.get("version"),
                                    next_fire_at_ms=view["created_at_ms"] + options["every_ms"])
                except Exception as e:
                    self.h.fail_from(op, e, c)
                    await asyncio.sleep(0.5)
                    continue
                made.append(name)
                break
        return made

    async def _sleep(self, s: float):
        try:
            await asyncio.wait_for(self.stopping.wait(), s)
        except asyncio.TimeoutError:
            pass

    # ------------------------------------------------------------------ producers
    def _request(self, rng: random.Random, value: str, key: str | None) -> dict:
        cfg = self.cfg
        job_type = "poison" if rng.random() < cfg.poison_rate else "work"
        fields = {"priority": rng.randint(0, 9), "max_attempts": rng.choice((1, 2, 3, 3, 4))}
        r = rng.random()
        if r < cfg.scheduled_rate * 0.6:
            fields["scheduled_at_ms"] = wall_ms() + rng.randint(200, cfg.max_schedule_ms)
        elif r < cfg.scheduled_rate:
            fields["delay_ms"] = rng.randint(200, cfg.max_schedule_ms)
        queue = rng.choice(QUEUES)
        resource = None
        if cfg.gated and rng.random() < cfg.gated_rate:
            queue = rng.choice(GATED_QUEUES)
            if queue == THROTTLE_QUEUE:
                resource = rng.choice(RESOURCES)
            elif queue == CIRCUIT_QUEUE:
                job_type = "cbfail"          # always fails: the breaker opens and stays open
        req = job_request(queue, job_type, payload_of(value, key, job_type),
                          encoding="application/json", idempotency_key=key, **fields)
        if resource is not None:
            req["resource"] = resource
        return req

    @staticmethod
    def _req_record(req: dict, value: str, key: str | None) -> dict:
        rec = {"value": value, "key": key, "queue": req["queue"], "job_type": req["job_type"],
               "max_attempts": req.get("max_attempts"), "scheduled_at": req.get("scheduled_at_ms"),
               "delay_ms": req.get("delay_ms")}
        if req.get("key") is not None:
            rec["tenant"] = req["key"]
        return rec

    def _key_request(self, rng: random.Random, value: str, queue: str, tenant: str) -> dict:
        fields = {"priority": rng.choice((0, 0, 0, 1, 2)), "max_attempts": rng.choice((2, 3, 3, 4))}
        if rng.random() < 0.1:
            fields["delay_ms"] = rng.randint(100, 1000)       # ready later: it joins its key's heap then
        req = job_request(queue, "work", payload_of(value, None, "work", tenant), encoding="application/json",
                          **fields)
        req["key"] = tenant
        return req

    async def key_producer(self, proc: str, rng: random.Random):
        """Keyed jobs into KEY_QUEUES (the client's automatic idempotency keys): one at a time, a
        batch of a few keys, or a burst of one key."""
        c = self.client()
        n = turn = 0
        while not self.stopping.is_set():
            queue = KEY_QUEUES[turn % len(KEY_QUEUES)]      # in turn: even a short run fills both
            turn += 1
            names, weights = QUEUE_KEYS[queue], KEY_WEIGHTS[queue]
            r = rng.random()
            if r < 0.15:
                tenants = [rng.choices(names, weights)[0]] * rng.randint(2, 5)       # a burst of one key
            elif r < 0.3:
                tenants = rng.choices(names, weights, k=rng.randint(2, 4))
            else:
                tenants = [rng.choices(names, weights)[0]]
            reqs, recs = [], []
            for tenant in tenants:
                value = f"{proc}-{n}"
                n += 1
                req = self._key_request(rng, value, queue, tenant)
                reqs.append(req)
                recs.append(self._req_record(req, value, None))
            await self._enqueue(c, proc, reqs, recs, batch=len(reqs) > 1)
            await self._sleep(rng.uniform(*self.cfg.key_think_s) * len(reqs))

    async def producer(self, proc: str, kind: str, rng: random.Random):
        transport = "http" if kind == "raw" and "http" in self.cfg.transports else "session"
        c = self.client(auto_idempotency=(kind != "raw"), transport=transport)
        n = 0
        keys: list[str] = []
        while not self.stopping.is_set():
            r = rng.random()
            reqs, recs = [], []
            if kind == "keyed" and keys and r < 0.12:
                # Re-send an earlier key (to its queue: keys are per queue) with a new value: it
                # must deduplicate to the first job.
                key, queue = rng.choice(keys[-200:])
                value = f"{proc}-{n}"
                n += 1
                req = self._request(rng, value, key)
                req["queue"] = queue
                reqs.append(req)
                recs.append(self._req_record(req, value, key) | {"dup_of_key": True})
            else:
                count = rng.randint(2, 4) if r < 0.2 else 1
                for _ in range(count):
                    value = f"{proc}-{n}"
                    n += 1
                    key = f"k-{value}" if kind == "keyed" else None
                    req = self._request(rng, value, key)
                    if key:
                        keys.append((key, req["queue"]))
                    reqs.append(req)
                    recs.append(self._req_record(req, value, key))
            await self._enqueue(c, proc, reqs, recs, batch=len(reqs) > 1)
            await self._sleep(rng.uniform(*self.cfg.think_s))

    # ------------------------------------------------------------------ workflows
    def _step(self, rng: random.Random, value: str, ref: str | None, deps: list, delay: bool) -> dict:
        """One job of a graph: `deps` [(ref, policy)] of earlier jobs of the same request."""
        return job_request(WORKFLOW_QUEUE, WORKFLOW_TYPE, payload_of(value, None, WORKFLOW_TYPE),
                           encoding="application/json", priority=rng.randint(0, 9),
                           max_attempts=rng.choice((2, 3, 3)), ref=ref,
                           depends_on=[{"ref": r, "policy": p} for r, p in deps] if deps else None,
                           delay_ms=rng.randint(100, 800) if delay else None)

    def _graph(self, rng: random.Random, proc: str, n: int, gid: str) -> tuple[str, list, list]:
        """One small graph: (its shape, the job_request bodies in order, the history's items).
        `chain`: 2-4 jobs, each depending on the one before (`success`, now and then
        `complete`); `client-chain` the same, all `success`, made by Client.chain (the bodies
        carry no refs); `fan-in`: 2-5 members and one job depending on every one of them, each
        edge `success` (60 %), `complete` (30 %) or `ignore`. An item's `deps` name the
        dependencies by value ([[value, policy], ...]): the checker maps values to job ids."""
        r = rng.random()
        shape = "fan-in" if r < 0.45 else "client-chain" if r < 0.7 else "chain"
        values = [f"{proc}-{n + i}" for i in range(rng.randint(2, 5) + 1 if shape == "fan-in" else rng.randint(2, 4))]
        if shape == "fan-in":
            policies = [rng.choices(("success", "complete", "ignore"), (6, 3, 1))[0] for _ in values[:-1]]
            edges = [[]] * (len(values) - 1) + [list(zip(values[:-1], policies))]
        else:
            edges = [[]] + [[(values[i - 1], "complete" if shape == "chain" and rng.random() < 0.25 else "success")]
                            for i in range(1, len(values))]
        reqs, recs = [], []
        for i, (value, deps) in enumerate(zip(values, edges)):
            ref = None if shape == "client-chain" else f"s{i}"
            by_ref = [(f"s{values.index(v)}", p) for v, p in deps] if shape != "client-chain" else []
            req = self._step(rng, value, ref, by_ref, bool(deps) and rng.random() < 0.1)
            reqs.append(req)
            recs.append(self._req_record(req, value, None) | {"graph": gid, "shape": shape, "ref": ref,
                                                              "deps": [[v, p] for v, p in deps]})
        return shape, reqs, recs

    async def workflow_producer(self, proc: str, rng: random.Random):
        """Small graphs (Workload._graph) into WORKFLOW_QUEUE, each all or nothing (the client's
        automatic idempotency keys)."""
        c = self.client()
        n = k = 0
        while not self.stopping.is_set():
            shape, reqs, recs = self._graph(rng, proc, n, f"{proc}-g{k}")
            n, k = n + len(reqs), k + 1
            await self._enqueue_graph(c, proc, shape, reqs, recs)
            await self._sleep(rng.uniform(*self.cfg.workflow_think_s))

    async def _enqueue_graph(self, c: Client, proc: str, shape: str, reqs: list[dict], recs: list[dict]) -> dict:
        """One graph in one atomic call (`Client.chain` for a client-chain), recorded as one
        enqueue op (`atomic`: all its jobs or none)."""
        op = self.h.invoke(proc, "enqueue", c, items=recs, batch=True, atomic=True)
        try:
            if shape == "client-chain":
                out = [{"job_id": jid, "dedup": False} for jid in await c.chain(*reqs)]
            else:
                out = [{"job_id": r.job_id, "dedup": r.deduplicated} for r in await c.enqueue_atomic(reqs)]
        except Exception as e:
            return self.h.fail_from(op, e, c)
        return self.h.complete(op, "ok", c, results=out)

    async def workflow_worker(self, proc: str, rng: random.Random):
        """Reserves from WORKFLOW_QUEUE only and settles each job it got in turn (workflow_handle)."""
        c = self.client(transport=rng.choice(self.cfg.transports))
        while not self.stopping.is_set():
            jobs = await self.reserve(c, proc, [WORKFLOW_QUEUE], self.cfg.lease_ms, rng.choice((1, 2, 4)),
                                      self.cfg.wait_ms)
            if jobs is None:
                await self._sleep(0.1)
                continue
            for job in jobs:
                await self.workflow_handle(c, proc, rng, job)

    async def workflow_handle(self, c: Client, proc: str, rng: random.Random, job: Job):
        """A workflow job: acked mostly; nacked to the dead letters (its `success` dependents
        then end dependency_failed), nacked to be retried (the last attempt dead-letters), or
        held past its lease and acked late (fenced off), by a task of its own: the worker goes on."""
        await asyncio.sleep(rng.uniform(0, 0.02))            # "work"
        r, dead = rng.random(), self.cfg.workflow_dead_rate
        if r < dead:
            await self.nack(c, proc, job, Retry.dead_letter())
        elif r < dead + 0.08:
            await self.nack(c, proc, job, Retry.default())
        elif r < dead + 0.11:
            self.stalls += 1
            stall_s = self.cfg.lease_ms / 1000 + self.cfg.sweep_interval_ms / 1000 + rng.uniform(0.2, 1.0)
            self.tasks.append(asyncio.get_running_loop().create_task(self._late_ack(c, proc, job, stall_s)))
        else:
            await self.ack(c, proc, job)

    async def _late_ack(self, c: Client, proc: str, job: Job, stall_s: float):
        await self._sleep(stall_s)                      # a zombie: acks after its lease lapsed
        await self.ack(c, proc, job)

    # ------------------------------------------------------------------ batches
    def _members(self, rng: random.Random, proc: str, n: int, count: int) -> tuple[list, list]:
        """`count` member bodies (values proc-n...) and their history items."""
        reqs, recs = [], []
        for i in range(count):
            value = f"{proc}-{n + i}"
            req = job_request(BATCH_QUEUE, BATCH_TYPE, payload_of(value, None, BATCH_TYPE),
                              encoding="application/json", max_attempts=rng.choice((2, 3)))
            reqs.append(req)
            recs.append(self._req_record(req, value, None))
        return reqs, recs

    async def batch_producer(self, proc: str, rng: random.Random):
        """Batches of 2-6 members into BATCH_QUEUE with all three callbacks into CALLBACK_QUEUE
        (job_type the kind); a third opened with some members, filled by a second request, then
        closed. Each request is an `enqueue` op (`batch_op` open or add, `batch_id`), the close a
        `batch_close` op."""
        c = self.client()
        n = 0
        while not self.stopping.is_set():
            size = rng.randint(2, 6)
            split = rng.randint(1, size - 1) if rng.random() < 0.35 else size
            reqs, recs = self._members(rng, proc, n, size)
            n += size
            cbs = {k: job_request(CALLBACK_QUEUE, k, None, max_attempts=5) for k in CALLBACK_KINDS}
            op = self.h.invoke(proc, "enqueue", c, items=recs[:split], batch=True, atomic=True, batch_op="open",
                               open=split < size)
            try:
                bid, ids = await c.open_batch(reqs[:split], open=split < size, timeout_ms=BATCH_TIMEOUT_MS, **cbs)
            except Exception as e:
                self.h.fail_from(op, e, c)
                await self._sleep(rng.uniform(*self.cfg.batch_think_s))
                continue
            self.h.complete(op, "ok", c, batch_id=bid, results=[{"job_id": j, "dedup": False} for j in ids])
            if split < size:
                await self._fill_batch(c, proc, bid, reqs[split:], recs[split:])
            await self._sleep(rng.uniform(*self.cfg.batch_think_s))

    async def _fill_batch(self, c: Client, proc: str, bid: str, reqs: list, recs: list):
        op = self.h.invoke(proc, "enqueue", c, items=recs, batch=True, atomic=True, batch_op="add", batch_id=bid)
        try:
            ids = await c.add_to_batch(bid, reqs)
            self.h.complete(op, "ok", c, results=[{"job_id": j, "dedup": False} for j in ids])
        except Exception as e:
            self.h.fail_from(op, e, c)
        op = self.h.invoke(proc, "batch_close", c, batch_id=bid)
        try:
            await c.close_batch(bid)
            self.h.complete(op, "ok", c)
        except Exception as e:
            self.h.fail_from(op, e, c)

    async def batch_worker(self, proc: str, rng: random.Random):
        """Reserves members and callbacks; acks callbacks, acks most members, nacks some to the
        dead letters (batch_dead_rate) and some to be retried (the last attempt dead-letters)."""
        c = self.client(transport=rng.choice(self.cfg.transports))
        while not self.stopping.is_set():
            jobs = await self.reserve(c, proc, [CALLBACK_QUEUE, BATCH_QUEUE], self.cfg.lease_ms, rng.choice((1, 2, 4)),
                                      self.cfg.wait_ms)
            if jobs is None:
                await self._sleep(0.1)
                continue
            for job in jobs:
                await asyncio.sleep(rng.uniform(0, 0.02))            # "work"
                r = rng.random()
                if job.queue == CALLBACK_QUEUE or r >= self.cfg.batch_dead_rate + 0.06:
                    await self.ack(c, proc, job)
                elif r < self.cfg.batch_dead_rate:
                    await self.nack(c, proc, job, Retry.dead_letter())
                else:
                    await self.nack(c, proc, job, Retry.default())

    async def _enqueue(self, c: Client, proc: str, reqs: list[dict], recs: list[dict], batch: bool,
                       timeout: float | None = None) -> dict:
        op = self.h.invoke(proc, "enqueue", c, items=recs, batch=batch)
        try:
            if batch:
                results = await c.enqueue_batch(reqs, timeout=timeout)
                out = [{"job_id": r.job_id, "dedup": r.deduplicated} if not isinstance(r, Exception)
                       else {"rejected": r.reason} for r in results]
            else:
                r = await c.enqueue_request(reqs[0], timeout=timeout)
                out = [{"job_id": r.job_id, "dedup": r.deduplicated}]
        except Rejected as e:
            return self.h.complete(op, "fail", c, error="rejected", results=[{"rejected": e.reason}])
        except Exception as e:
            return self.h.fail_from(op, e, c)
        return self.h.complete(op, "ok", c, results=out)

    async def probe(self):
        """One small write every `probe_interval_s` (bounded in flight): the availability signal."""
        c = self.client(timeout=self.cfg.probe_timeout_s, attempt_timeout=1.0)
        n = 0
        outstanding: set[asyncio.Task] = set()
        loop = asyncio.get_running_loop()
        try:
            while not self.stopping.is_set():
                if len(outstanding) < self.cfg.probe_max_outstanding:
                    value = f"probe-{n}"
                    n += 1
                    req = job_request(PROBE_QUEUE, "probe", payload_of(value, None, "probe"), encoding="application/json")
                    t = loop.create_task(self._enqueue(c, "probe", [req], [self._req_record(req, value, None)], False))
                    outstanding.add(t)
                    t.add_done_callback(outstanding.discard)
                await self._sleep(self.cfg.probe_interval_s)
        finally:
            if outstanding:
                await asyncio.wait(outstanding, timeout=self.cfg.probe_timeout_s + 2)

    # ------------------------------------------------------------------ workers
    async def worker(self, proc: str, rng: random.Random):
        c = self.client(transport=rng.choice(self.cfg.transports))
        queues = list(QUEUES) + [PROBE_QUEUE] + (list(GATED_QUEUES) if self.cfg.gated else []) + \
            ([SCHEDULE_QUEUE] if self.cfg.schedules else [])
        while not self.stopping.is_set():
            rng.shuffle(queues)             # reserve polls in order: vary it so no queue starves
            jobs = await self.reserve(c, proc, queues, self.cfg.lease_ms, rng.choice((1, 1, 1, 2, 4)),
                                      self.cfg.wait_ms)
            if jobs is None:
                await self._sleep(0.1)
                continue
            batch: list[Job] = []
            for job in jobs:
                await self.handle(c, proc, rng, job, batch)
            if batch:
                await self.ack_batch(c, proc, batch)

    async def key_sampler(self, interval_s: float = 0.5):
        """Reads the keyed queues' stats now and then (not recorded as ops: the report's evidence
        that the limits held keys back, in the server's own words)."""
        c = self.client(timeout=2.0, attempt_timeout=1.0)
        while not self.stopping.is_set():
            for q in KEY_QUEUES:
                try:
                    st = await c.queue(q)
                except Exception:
                    continue
                k = self.key_samples[q]
                k["samples"] += 1
                for f in ("keys_at_limit", "ready_held_by_keys", "keys"):
                    k[f"max_{f}"] = max(k[f"max_{f}"], st.get(f) or 0)
            await self._sleep(interval_s)

    async def key_worker(self, proc: str, rng: random.Random):
        """Reserves from KEY_QUEUES only, with the fixed KEY_LEASE_MS, and settles each job it got
        on its own (concurrently): so a slow one holds only its own key's slot."""
        c = self.client(transport=rng.choice(self.cfg.transports))
        queues = list(KEY_QUEUES)
        while not self.stopping.is_set():
            rng.shuffle(queues)
            jobs = await self.reserve(c, proc, queues, KEY_LEASE_MS, rng.choice((1, 2, 4)), self.cfg.wait_ms)
            if jobs is None:
                await self._sleep(0.1)
                continue
            if jobs:
                await asyncio.gather(*(self.key_handle(c, proc, random.Random(rng.random()), job) for job in jobs))

    async def key_handle(self, c: Client, proc: str, rng: random.Random, job: Job):
        cfg = self.cfg
        await asyncio.sleep(rng.uniform(*cfg.key_hold_s))               # holds its key's slot
        r = rng.random()
        if r < 0.75:
            await self.ack(c, proc, job)
        elif r < 0.82:
            await self.nack(c, proc, job, Retry.default())
        elif r < 0.86:
            await self.nack(c, proc, job, Retry.delay(rng.randint(50, 500)))
        elif r < 0.95:
            await self.release(c, proc, job, rng.choice((0, 0, rng.randint(50, 300))))
        else:
            self.stalls += 1
            await self._sleep(KEY_LEASE_MS / 1000 + cfg.sweep_interval_ms / 1000 + rng.uniform(0.2, 1.0))
            await self.ack(c, proc, job)                # a zombie: its lease lapsed, the slot freed

    async def reserve(self, c: Client, proc: str, queues, lease_ms: int, max_jobs: int, wait_ms: int):
        op = self.h.invoke(proc, "reserve", c, queues=list(queues), lease_ms=lease_ms, max_jobs=max_jobs)
        try:
            jobs = await c.reserve(queues, lease_ms, wait_ms=wait_ms, max_jobs=max_jobs, worker_id=proc)
        except Exception as e:
            self.h.fail_from(op, e, c)
            return None
        self.h.complete(op, "ok", c, jobs=[delivery(j) for j in jobs])
        return jobs

    async def handle(self, c: Client, proc: str, rng: random.Random, job: Job, batch: list):
        cfg = self.cfg
        stall_s = cfg.lease_ms / 1000 + cfg.sweep_interval_ms / 1000 + rng.uniform(0.2, 1.0)
        await asyncio.sleep(rng.uniform(0, 0.02))            # "work"
        r = rng.random()
        if job.job_type == "cbfail":
            await self.nack(c, proc, job, Retry.default())
            return
        if job.job_type == "work" and r < cfg.release_rate:
            await self.release(c, proc, job, rng.choice((0, 0, rng.randint(50, 300))))
            return
        r = rng.random()
        if job.job_type == "poison":
            if r < 0.55:
                await self.nack(c, proc, job, Retry.default())
            elif r < 0.75:
                await self.nack(c, proc, job, Retry.delay(rng.randint(0, 800)))
            elif r < 0.85:
                await self.nack(c, proc, job, Retry.dead_letter())
            else:
                self.stalls += 1
                await self._sleep(stall_s)              # crash-looping worker: the lease lapses
                await self.nack(c, proc, job, Retry.default())
            return
        if r < 0.62:
            await self.ack(c, proc, job)
        elif r < 0.72:
            batch.append(job)
        elif r < 0.77:
            await self.nack(c, proc, job, Retry.default())
        elif r < 0.82:
            await self.nack(c, proc, job, Retry.delay(rng.randint(50, 1500)))
        elif r < 0.85:
            await self.nack(c, proc, job, Retry.dead_letter())
        elif r < 0.95:
            for _ in range(rng.randint(1, 2)):
                await asyncio.sleep(rng.uniform(0, cfg.lease_ms / 2000))
                if not await self.extend(c, proc, job, cfg.lease_ms):
                    break
            await self.ack(c, proc, job)
        else:
            self.stalls += 1
            await self._sleep(stall_s)                  # a zombie: acks after its lease lapsed
            await self.ack(c, proc, job)

    async def ack(self, c: Client, proc: str, job: Job) -> bool:
        op = self.h.invoke(proc, "ack", c, job_id=job.id, attempt=job.attempt)
        try:
            await c.ack(job)
        except Exception as e:
            self.h.fail_from(op, e, c)
            return False
        self.h.complete(op, "ok", c)
        return True

    async def ack_batch(self, c: Client, proc: str, jobs: list[Job]):
        """One call, recorded as one `ack` op per job (same times, `batch` set)."""
        ops = [self.h.invoke(proc, "ack", c, job_id=j.id, attempt=j.attempt, batch=True) for j in jobs]
        try:
            results = await c.ack_batch(jobs)
        except Exception as e:
            for op in ops:
                self.h.fail_from(op, e, c)
            return
        for op, r in zip(ops, results):
            if r is None:
                self.h.complete(op, "ok", c)
            else:
                self.h.complete(op, "fail", c, error=r.code)

    async def nack(self, c: Client, proc: str, job: Job, retry: dict) -> bool:
        reason = f"{proc}:{job.id[:8]}:a{job.attempt}"
        op = self.h.invoke(proc, "nack", c, job_id=job.id, attempt=job.attempt, strategy=retry["strategy"],
                           delay_ms=retry.get("delay_ms"), reason=reason, max_attempts=job.max_attempts,
                           releases=getattr(job, "releases", 0) or 0)
        try:
            dead = await c.nack(job, reason=reason, retry=retry)
        except Exception as e:
            self.h.fail_from(op, e, c)
            return False
        self.h.complete(op, "ok", c, dead_lettered=dead)
        return True

    async def release(self, c: Client, proc: str, job: Job, delay_ms: int) -> bool:
        op = self.h.invoke(proc, "release", c, job_id=job.id, attempt=job.attempt, delay_ms=delay_ms,
                           releases=getattr(job, "releases", 0) or 0)
        try:
            await c.release(job, delay_ms=delay_ms, reason="chaos")
        except Exception as e:
            self.h.fail_from(op, e, c)
            return False
        self.h.complete(op, "ok", c)
        return True

    async def extend(self, c: Client, proc: str, job: Job, lease_ms: int) -> bool:
        op = self.h.invoke(proc, "extend", c, job_id=job.id, attempt=job.attempt, lease_ms=lease_ms)
        try:
            expires = await c.extend(job, lease_ms)
        except Exception as e:
            self.h.fail_from(op, e, c)
            return False
        self.h.complete(op, "ok", c, lease_expires=expires)
        return True


# ---------------------------------------------------------------------------- the final phase
async def final_drain(urls: list[str], h: History, *, timeout_s: float = 90.0, lease_ms: int = 30_000,
                      op_timeout_s: float = 15.0) -> dict:
    """After healing (and pausing the schedules): take every job left (waiting out leases and
    schedules), ack it (poison jobs are nacked until they are dead-lettered), then drain the
    dead letters, then read the schedules' views (a `schedule_views` op: how many ticks each
    fired). Returns what it saw: {"ok": bool, "dead_letters": [...], "queues": [...],
    "schedules": [...] or None, "seconds": s}."""
    c = Client(urls, timeout=op_timeout_s, connect_timeout=1.0)
    t0 = time.monotonic()
    queues = list(QUEUES) + [PROBE_QUEUE, LIVE_QUEUE] + list(GATED_QUEUES) + [SCHEDULE_QUEUE] + list(KEY_QUEUES) + \
        [WORKFLOW_QUEUE, BATCH_QUEUE, CALLBACK_QUEUE]
    try:
        ok, stats = await _drain_jobs(c, h, queues, t0, timeout_s, lease_ms)
        records, complete = await _drain_dead_letters(c, h)
        ok = ok and complete
        try:
            stats = await c.queues()
        except Exception:
            pass
        views = await read_schedules(c, h)
        return {"ok": ok, "dead_letters": records, "queues": stats, "schedules": views,
                "seconds": time.monotonic() - t0}
    finally:
        await c.close()


async def _drain_jobs(c: Client, h: History, queues: list, t0: float, timeout_s: float,
                      lease_ms: int) -> tuple[bool, list]:
    """Reserve and settle until every queue was empty twice in a row, or until timeout_s after
    t0: (whether they emptied, the queues' last stats)."""
    empty_rounds = 0
    stats: list = []
    while time.monotonic() - t0 < timeout_s:
        op = h.invoke("drain", "reserve", c, queues=queues, lease_ms=lease_ms, max_jobs=64)
        try:
            jobs = await c.reserve(queues, lease_ms, wait_ms=300, max_jobs=64, worker_id="drain")
        except Exception as e:
            h.fail_from(op, e, c)
            await asyncio.sleep(0.2)
            continue
        h.complete(op, "ok", c, jobs=[delivery(j) for j in jobs])
        await _settle_drained(c, h, jobs)
        if jobs:
            empty_rounds = 0
            continue
        try:
            stats = await c.queues()
        except Exception:
            await asyncio.sleep(0.2)
            continue
        live = sum(q["ready"] + q["scheduled"] + q["in_flight"] + q.get("waiting", 0) for q in stats)
        if live == 0:
            empty_rounds += 1
            if empty_rounds >= 2:
                return True, stats
        else:
            empty_rounds = 0
            await asyncio.sleep(0.1)
    return False, stats


async def _settle_drained(c: Client, h: History, jobs: list) -> None:
    """Nack the poison jobs of a drain's reserve (until they are dead-lettered), ack the rest in one batch."""
    acks = [j for j in jobs if j.job_type != "poison"]
    for j in jobs:
        if j.job_type == "poison":
            reason = f"drain:{j.id[:8]}:a{j.attempt}"
            nop = h.invoke("drain", "nack", c, job_id=j.id, attempt=j.attempt, strategy="default",
                           delay_ms=None, reason=reason, max_attempts=j.max_attempts,
                           releases=getattr(j, "releases", 0) or 0)
            try:
                dead = await c.nack(j, reason=reason, retry=Retry.default())
                h.complete(nop, "ok", c, dead_lettered=dead)
            except Exception as e:
                h.fail_from(nop, e, c)
    if acks:
        aops = [h.invoke("drain", "ack", c, job_id=j.id, attempt=j.attempt, batch=True) for j in acks]
        try:
            results = await c.ack_batch(acks)
            for aop, r in zip(aops, results):
                h.complete(aop, "ok" if r is None else "fail", c, **({} if r is None else {"error": r.code}))
        except Exception as e:
            for aop in aops:
                h.fail_from(aop, e, c)


async def _drain_dead_letters(c: Client, h: History) -> tuple[list, bool]:
    """The dead letters, all of them (each call with its own request id: a retry returns the
    same records, never loses them): (the records, False when a drain call failed)."""
    records = []
    while True:
        op = h.invoke("drain", "dlq_drain", c)
        try:
            got = await c.drain(max_records=500)
        except Exception as e:
            h.fail_from(op, e, c)
            return records, False
        recs = [_dead_letter_record(r) for r in got]
        h.complete(op, "ok", c, records=recs)
        records += recs
        if not got:
            return records, True


def _dead_letter_record(r) -> dict:
    """A drained dead letter as the history and the checker keep it."""
    d = delivery(r.job)
    return {"job_id": r.job.id, "cause": r.cause, "final_attempt": r.final_attempt,
            "last_reason": r.last_reason, "failed_at": r.failed_at_ms, "value": d["value"],
            "key": d["key"], "queue": r.job.queue, "job_type": r.job.job_type, "max_attempts": r.job.max_attempts,
            "attempt": r.job.attempt, "releases": getattr(r.job, "releases", 0) or 0,
            "schedule": d["schedule"], "tick": d["tick"], "enqueued_at": d["enqueued_at"],
            "tenant": d["tenant"], "depends_on": d["depends_on"]}


async def read_schedules(c: Client, h: History, tries: int = 3) -> list | None:
    """Every schedule's view, recorded as a `schedule_views` op (`schedules`: name, fired,
    paused, next and last tick); None if it could not be read."""
    for _ in range(tries):
        op = h.invoke("drain", "schedule_views", c)
        try:
            out, cursor = [], None
            while True:
                page = await c.schedules(limit=100, cursor=cursor)
                out += page["schedules"]
                cursor = page.get("next_cursor")
                if not cursor:
                    break
        except Exception as e:
            h.fail_from(op, e, c)
            await asyncio.sleep(0.5)
            continue
        views = [{k: v.get(k) for k in ("name", "fired", "skipped", "paused", "next_fire_at_ms", "last_tick_at_ms",
                                        "last_error", "catchup", "misfire_after_ms", "every_ms")} for v in out]
        h.complete(op, "ok", c, schedules=views)
        return views
    return None


async def pause_schedules(urls: list[str], h: History, names: list[str], *, op_timeout_s: float = 15.0,
                          tries: int = 5) -> bool:
    """Before the final drain: pause every schedule of the run (pause is idempotent: a try
    whose outcome is unknown is simply made again), so no tick fires after the drain has
    looked. Each try a `schedule_pause` op. A schedule the cluster does not know (a memory-mode
    power cut erased its creation: the checker judges that from the views) has nothing to
    pause: recorded ok with `found` false. True when every one is paused or gone."""
    c = Client(urls, timeout=op_timeout_s, connect_timeout=1.0)
    done = True
    try:
        for name in names:
            for _ in range(tries):
                op = h.invoke("drain", "schedule_pause", c, name=name)
                try:
                    out = await c.pause_schedule(name)
                except NotFound:
                    h.complete(op, "ok", c, found=False)
                    break
                except Exception as e:
                    h.fail_from(op, e, c)
                    await asyncio.sleep(0.5)
                    continue
                h.complete(op, "ok", c, paused=out.get("paused"), version=out.get("version"))
                break
            else:
                done = False
        return done
    finally:
        await c.close()


async def lift_gates(urls: list[str], h: History, *, op_timeout_s: float = 15.0, tries: int = 5) -> bool:
    """Before the final drain: take the execution window and the circuit breaker off the gated
    queues (an operator's configuration change, as `raftq config` makes it), so every job can be
    drained. Recorded as a `lift_gates` op: deliveries after it are not held to the gates."""
    c = Client(urls, timeout=op_timeout_s, connect_timeout=1.0)
    op = h.invoke("drain", "lift_gates", c)
    try:
        for i in range(tries):
            cur = await c.config()
            doc = cur["config"]
            queues = [{k: v for k, v in q.items() if k not in ("windows", "circuit_breaker")}
                      for q in doc.get("queues") or []]
            try:
                await c.put_config({**doc, "queues": queues}, cur["version"])
            except Conflict:
                continue                     # someone else changed it (never in a chaos run): read again
            h.complete(op, "ok", c)
            return True
        h.complete(op, "fail", c, error="conflict")
        return False
    except Exception as e:
        h.fail_from(op, e, c)
        return False
    finally:
        await c.close()


async def lease_liveness_probe(urls: list[str], h: History, *, jobs: int = 3, lease_ms: int = 1000,
                               sweep_interval_ms: int = 500, slack_s: float = 1.5) -> dict:
    """Lease jobs and let the leases lapse: each must be redelivered (attempt + 1) within
    lease + sweep interval (+ slack for the apply path on a busy machine)."""
    c = Client(urls, timeout=15.0, connect_timeout=1.0)
    out = {"ok": False, "bound_s": lease_ms / 1000 + sweep_interval_ms / 1000 + slack_s, "samples": []}
    try:
        for i in range(jobs):
            req = job_request(LIVE_QUEUE, "live", payload_of(f"live-{i}", None, "live"), encoding="application/json",
                              max_attempts=5)
            op = h.invoke("live", "enqueue", c, items=[Workload._req_record(req, f"live-{i}", None)], batch=False)
            try:
                r = await c.enqueue_request(req)
                h.complete(op, "ok", c, results=[{"job_id": r.job_id, "dedup": r.deduplicated}])
            except Exception as e:
                h.fail_from(op, e, c)
                out["error"] = f"enqueue: {e}"
                return out
        op = h.invoke("live", "reserve", c, queues=[LIVE_QUEUE], lease_ms=lease_ms, max_jobs=jobs)
        try:
            got = await c.reserve([LIVE_QUEUE], lease_ms, wait_ms=2000, max_jobs=jobs)
        except Exception as e:
            h.fail_from(op, e, c)
            out["error"] = f"reserve: {e}"
            return out
        h.complete(op, "ok", c, jobs=[delivery(j) for j in got])
        t_leased = time.monotonic()
        pending = {j.id: j.attempt for j in got}
        deadline = t_leased + out["bound_s"] * 3
        while pending and time.monotonic() < deadline:
            op = h.invoke("live", "reserve", c, queues=[LIVE_QUEUE], lease_ms=30_000, max_jobs=jobs)
            try:
                again = await c.reserve([LIVE_QUEUE], 30_000, wait_ms=500, max_jobs=jobs)
            except Exception as e:
                h.fail_from(op, e, c)
                continue
            h.complete(op, "ok", c, jobs=[delivery(j) for j in again])
            for j in again:
                if j.id in pending and j.attempt > pending[j.id]:
                    out["samples"].append(round(time.monotonic() - t_leased, 3))
                    del pending[j.id]
                aop = h.invoke("live", "ack", c, job_id=j.id, attempt=j.attempt)
                try:
                    await c.ack(j)
                    h.complete(aop, "ok", c)
                except Exception as e:
                    h.fail_from(aop, e, c)
        out["redelivered"] = len(got) - len(pending)
        out["leased"] = len(got)
        out["ok"] = bool(got) and not pending and all(s <= out["bound_s"] for s in out["samples"])
        return out
    finally:
        await c.close()
