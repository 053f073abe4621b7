"""The chaos checker: pure functions over a recorded history, the final drained state and the
nodes' own views. No cluster needed, so every invariant is unit-tested on hand-made histories.

An *op* (see workload.History) is a dict with `f` (enqueue, reserve, ack, nack, extend,
dlq_drain), `outcome` (ok / fail / unknown), `t0`/`t1` (monotonic invoke/complete seconds) and
`w0`/`w1` (wall ms), plus per-kind fields:
* enqueue: `items` [{value, key, queue, job_type, max_attempts, scheduled_at, delay_ms}] and,
  when ok, `results` [{job_id, dedup} | {rejected}] in the same order;
* reserve: `lease_ms`, and when ok `jobs` [{job_id, attempt, max_attempts, value, key, job_type,
  lease_expires, scheduled_at, enqueued_at}];
* ack / nack / extend / release: `job_id`, `attempt`; nack also `strategy`, `delay_ms`, `reason`
  and, when ok, `dead_lettered`; extend `lease_ms` and, when ok, `lease_expires`; release
  `delay_ms` and `releases` (the delivery's count of releases before it).
* a delivered job also carries `releases` (how many of its deliveries were released: attempts
  used = attempt - releases) and `resource` (its throttle resource, or None);
* an enqueue item of a workflow graph (docs/chaos.md "Workflows") also has `graph` (its graph's
  id), `shape`, `ref` and `deps` [[the dependency's value, policy], ...], its op `atomic`; a
  delivered job and a dead letter carry `depends_on` [{job_id, policy}] (None without any);
* a batch's request (docs/chaos.md "Batches") is an enqueue op of its members with `batch_op`
  (open / add) and `batch_id` (an open's once answered; `open` whether it was opened open), its
  close a `batch_close` op; a delivered callback job carries `batch_id` and its kind as job_type;
* lift_gates: the run's end lifting windows and the breaker before the final drain (deliveries
  reserved after it was invoked are not held to the gates).
* a delivered job (and a dead letter) also carries `schedule` and `tick` (the custom fields
  `raftq.schedule`, `raftq.tick_ms` of a schedule's job; None for the others) and `enqueued_at`;
* schedule_put: `name`, `every_ms`, `catchup`, `misfire_after_ms`, `catchup_window_ms` and, when
  ok, `next_fire_at_ms` (its first tick: the interval's grid); schedule_pause: `name`;
  schedule_views (after the final drain): when ok `schedules` [{name, fired, paused, ...}].

`gates` (optional) says what the run configured: `{"resource_limits": {name: max},
"circuit": {"queue", "failures", "open_ms"}, "windows": {"queue", "open": [[from_ms, to_ms], ...]}}`.

`keys` (optional) names the keyed queues and their key settings as configured: `{queue:
{"key_concurrency", "key_rate": {count, period_ms}, "rate": {count, period_ms}, "key_limits":
{key: {"concurrency", "rate"}}}}`; a delivered job of one (and its enqueue item) carries its key
as `tenant` (`key` is the idempotency key). `clock_lag_ms`: how far the replicated clock may be
behind the wall clock (the largest backward clock offset of any node in the run).

Unknown outcomes follow Jepsen: an unknown enqueue may or may not have created its job (a job
delivered anyway is "recovered"); an unknown ack may or may not have completed the job.

`check(...)` returns {"valid": bool, "invariants": [{name, ok, count, examples, about}], "stats",
"failures"}: `INVARIANTS` lists the invariants, `JUDGES` the function that judges each one (on
the `Evidence`, into its own `Inv`); `failures` (failed_ops) sorts the ops that did not
end ok into the expected (a fenced ack after a lapsed lease, an unknown outcome during a fault)
and the rest, for the report; they never decide `valid`.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

from ..local import digest_at
from ...node.core.retry import policy_delay_ms

MAX_EXAMPLES = 5
MAX_CATCHUP_TICKS = 100         # the cluster's max_catchup_ticks (node/core/limits.py); a chaos run keeps the default
MAX_LEASE_MS = 300_000          # the longest lease a chaos run asks for (its max_lease_duration_ms)


class Inv:
    def __init__(self, name: str, about: str):
        self.name, self.about = name, about
        self.count = 0
        self.examples: list = []
        self.skipped: str | None = None
        self.expected = 0                  # broken by a memory-mode power cut: documented, not a violation
        self.expected_examples: list = []

    def bad(self, example: dict):
        self.count += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(example)

    def bad_unless(self, excused: bool, example: dict):
        """A violation, unless a memory-mode power cut explains it (see PowerCuts)."""
        if not excused:
            return self.bad(example)
        self.expected += 1
        if len(self.expected_examples) < MAX_EXAMPLES:
            self.expected_examples.append(example)

    def out(self) -> dict:
        d = {"name": self.name, "ok": self.count == 0, "count": self.count, "examples": self.examples,
             "about": self.about}
        if self.skipped:
            d["skipped"] = self.skipped
        if self.expected:
            d["expected_after_power_loss"] = self.expected
            d["expected_examples"] = self.expected_examples
        return d


def _ok(op) -> bool:
    return op.get("outcome") == "ok"


class PowerCuts:
    """Which anomalies a memory-mode power cut explains.

    `durability = "memory"` promises nothing across the power loss of a majority (docs/cluster.md
    "Durability"):
    what every node had not written back to disk is gone. The `power-loss` fault records, per
    cut, the earliest last durable point of any node (`durable_from_wall_ms`, wall ms) and when
    the nodes were restarted (`t_restart`, history time). An ok op is *in the window* of a cut
    when it was answered at or after that durable point (w1 >= durable_from) and before the
    restart (t1 <= t_restart: nothing answers in between, so it was answered before the cut):
    its effect may not have been on any disk. An op answered before the earliest durable point
    was on the disk of every node that had it, a majority, and must survive.

    An anomaly is excused only when it is explained by such a loss: `lost_before(a, t)` says
    op a's effect may have been lost by a cut that came before time t (a in the cut's window,
    t after its restart). fsync-mode cuts excuse nothing."""

    def __init__(self, cuts: list | None):
        self.cuts = []
        for c in cuts or []:
            if c.get("durability") != "memory" or c.get("durable_from_wall_ms") is None:
                continue
            sep = c.get("t_restart", c.get("t_heal"))
            if sep is None:
                continue
            self.cuts.append({"lo": c["durable_from_wall_ms"], "sep": sep, "w_cut": c.get("w_cut")})

    def __bool__(self):
        return bool(self.cuts)

    def windows(self, op: dict) -> list:
        if not self.cuts or not _ok(op) or op.get("w1") is None or op.get("t1") is None:
            return []
        return self.at_risk(op["w1"], op["t1"])

    def at_risk(self, w1, t1) -> list:
        """The cuts that may have erased a write answered at wall ms w1, history time t1."""
        hit = [c for c in self.cuts if w1 >= c["lo"] and t1 <= c["sep"]]
        if hit:
            # What one cut may have erased from some disks is not durable again when the next cut
            # comes: a node restarted from its rolled-back disk (its "last durable point" is then
            # the restart) holds a copy re-replicated after that, in memory only, until its next
            # writeback. So an op at risk at one cut stays at risk at every later cut.
            first = min(c["sep"] for c in hit)
            hit += [c for c in self.cuts if c["sep"] > first and c not in hit]
        return hit

    def lost_before(self, op: dict, t: float) -> bool:
        return any(t > c["sep"] for c in self.windows(op))

    def lost_before_wall(self, op: dict, w_ms) -> bool:
        """The same with a replicated-clock stamp (e.g. a dead letter's failed_at) as the later time."""
        return any(w_ms is None or c["w_cut"] is None or w_ms >= c["w_cut"] for c in self.windows(op))


class Index:
    """The history indexed by value and job id."""

    def __init__(self, ops: list[dict], dead_letters: list[dict]):
        self.ops = ops
        self.attempted: dict[str, dict] = {}          # value -> item (any outcome)
        self.enq_op_of: dict[str, dict] = {}          # value -> enqueue op
        self.ok_items: list[tuple] = []               # (op, item, result) for ok enqueues, not rejected
        self.unknown_values: set = set()
        self.deliveries: dict[str, list] = defaultdict(list)   # job id -> [(op, job)] ok reserves
        self.acks: dict[str, list] = defaultdict(list)
        self.nacks: dict[str, list] = defaultdict(list)
        self.extends: dict[str, list] = defaultdict(list)
        self.releases: dict[str, list] = defaultdict(list)
        self.dlq: dict[str, list] = defaultdict(list)
        self.job_value: dict[str, set] = defaultdict(set)      # job id -> payload values seen
        self.job_key: dict[str, set] = defaultdict(set)
        self.job_type: dict[str, str] = {}
        self.job_queue: dict[str, str] = {}
        self.job_max: dict[str, int] = {}
        # Schedules: the jobs the cluster made itself, one per tick.
        self.tick_jobs: dict[tuple, set] = defaultdict(set)    # (schedule, tick) -> job ids
        self.job_ticks: dict[str, set] = defaultdict(set)      # job id -> {(schedule, tick)}
        self.job_enqueued: dict[str, tuple] = {}               # job id -> (t1, enqueued_at) of its last sighting
        self.schedule_puts: dict[str, list] = defaultdict(list)
        self.schedule_views: list | None = None
        for op in ops:
            f = op.get("f")
            if f == "enqueue":
                items = op.get("items") or []
                for i, item in enumerate(items):
                    self.attempted[item["value"]] = item
                    self.enq_op_of[item["value"]] = op
                    if op.get("outcome") == "ok":
                        res = (op.get("results") or [])[i] if i < len(op.get("results") or []) else None
                        if res and "job_id" in res:
                            self.ok_items.append((op, item, res))
                    elif op.get("outcome") == "unknown":
                        self.unknown_values.add(item["value"])
            elif f == "reserve" and _ok(op):
                for j in op.get("jobs") or []:
                    self.deliveries[j["job_id"]].append((op, j))
                    self._learn(j)
            elif f == "ack":
                self.acks[op["job_id"]].append(op)
            elif f == "nack":
                self.nacks[op["job_id"]].append(op)
            elif f == "extend":
                self.extends[op["job_id"]].append(op)
            elif f == "release":
                self.releases[op["job_id"]].append(op)
            elif f == "schedule_put":
                self.schedule_puts[op["name"]].append(op)
            elif f == "schedule_views" and _ok(op):
                self.schedule_views = op.get("schedules") or []
        for op in ops:
            if op.get("f") == "reserve" and _ok(op):
                for j in op.get("jobs") or []:
                    self._sighted(j, op.get("t1") or 0)
        for rec in dead_letters:
            self.dlq[rec["job_id"]].append(rec)
            self._learn(rec)
            self._sighted(rec, float("inf"))

    def _sighted(self, j: dict, t1: float):
        if j.get("schedule") is not None and j.get("enqueued_at") is not None:
            prev = self.job_enqueued.get(j["job_id"])
            if prev is None or t1 >= prev[0]:
                self.job_enqueued[j["job_id"]] = (t1, j["enqueued_at"])

    def _learn(self, j: dict):
        jid = j["job_id"]
        if j.get("batch_id") is not None and j.get("job_type") in CALLBACK_KINDS:
            pass                # a batch's callback: the cluster made it (batch_callbacks_once judges it)
        elif j.get("schedule") is not None:
            # A tick's job: the cluster made it, so it has no value of the workload's to trace.
            self.tick_jobs[(j["schedule"], j.get("tick"))].add(jid)
            self.job_ticks[jid].add((j["schedule"], j.get("tick")))
        else:
            self.job_value[jid].add(j.get("value"))
            self.job_key[jid].add(j.get("key"))
        if j.get("job_type") is not None:
            self.job_type[jid] = j["job_type"]
        if j.get("queue") is not None:
            self.job_queue[jid] = j["queue"]
        if j.get("max_attempts") is not None:
            self.job_max[jid] = j["max_attempts"]


# Every invariant the checker holds a run to, (name, what it says), in the order the report
# lists them. docs/chaos.md names each one and states their number (tests/test_chaos.py
# holds it to this tuple).
INVARIANTS = (
    ("lost", "every enqueue answered ok was acked, is dead-lettered, or is still there (drained at the end)"),
    ("unexpected", "every delivered or dead-lettered job was enqueue-attempted in this run"),
    ("duplicate_jobs", "one value never becomes two jobs, and a job carries the value that created it"),
    ("idempotency", "one job per idempotency key inside its window; at most one non-deduplicated answer per key"),
    ("redelivery_attempts", "each redelivery of a job carries a strictly higher attempt (no attempt delivered twice)"),
    ("stale_attempt", "no ok ack/nack/extend with an attempt older than one already delivered"),
    ("no_delivery_after_ack", "after an ok ack the job is never delivered again, never dead-lettered, never acked or nacked again"),
    ("attempts_bound", "1 <= attempts used (attempt - releases) <= max_attempts on every delivery and dead letter"),
    ("release_uses_no_attempt", "a released job comes back with the next attempt number and the same attempts used"),
    ("throttle_limit", "never more jobs of a resource in flight at once than its limit (replicated clock, across failovers)"),
    ("circuit_open", "once a queue's breaker must be open, its jobs are handed out one probe at a time, open_ms apart"),
    ("window_closed", "no job of a windowed queue handed out while its window is closed (replicated clock)"),
    ("key_concurrency_held", "never more jobs of one key in flight at once than its key_concurrency (replicated "
                             "clock: from its hand-out to the first settle sent or its lease end)"),
    ("key_rate_held", "never more hand-outs of one key than its key_rate's count in any period_ms (replicated "
                      "clock; redeliveries and released jobs count)"),
    ("queue_rate_held", "never more hand-outs of a queue than its rate's count in any period_ms (replicated clock)"),
    ("schedule", "no job leased before its scheduled time (replicated clock; wall clock within the skew tolerance)"),
    ("one_job_per_tick", "at most one job per (schedule, tick), ever: never two job ids for one tick, nor two ticks for one job"),
    ("no_tick_missed", "no tick missed beyond the catch-up policy (all: every tick; one: a gap only before the latest "
                       "missed tick, fired late; skip: nothing late), none off the grid or early, every fired tick seen"),
    ("dependents_wait", "no dependent handed out before each of its dependencies ended (acked or dead-lettered), "
                        "and each shows the dependencies it was enqueued with"),
    ("dependency_failed_never_runs", "a success dependent of a dead-lettered job is never handed out and ends "
                                     "dead-lettered, cause dependency_failed; that cause only then"),
    ("fan_in_runs_once", "a fan-in is handed out after its last member ended, its first attempt once, and runs "
                         "when every success member was acked (never stuck waiting, never dependency_failed)"),
    ("batch_callbacks_once", "per batch, each callback kind is one job, handed out first once; after the drain "
                             "on_complete came for every acknowledged batch, on_success iff no member failed, "
                             "on_failure iff a member was dead-lettered"),
    ("callback_after_members", "no batch callback is handed out before the batch's members ended (on_complete, "
                               "on_success: the last; on_failure: a dead-lettered one) nor a completion one "
                               "before its close"),
    ("retry_delay", "a nacked job is not redelivered before its retry delay (replicated clock)"),
    ("lease_honoured", "a lease is not expired early: a redelivery without a nack comes after the (extended) lease end"),
    ("dead_letters", "dead letters have the right cause, attempt and reason; every ok dead-lettering nack shows up"),
    ("drained", "after healing everything drains: no job left on any node, no dead letter left"),
    ("replicas_agree", "every node ends at the same applied index with the same state digest"),
    ("one_leader_per_term", "at most one node claims leadership in any term"),
    ("liveness", "a leader within the bound after healing; expired leases redelivered within lease + sweep"),
    ("no_internal_errors", "the cluster never answered `internal`"),
    ("no_critical_node_logs", "no node logged CRITICAL (e.g. pysyncobj truncating already-applied entries), "
                              "but a damaged node's disk-check and storage-failure lines"),
    ("checksum_failures_contained", "no node answered from, voted with or sent data that failed its checksum: "
                                    "every damage injected was found, no node led or stood for election with an "
                                    "untrusted log, no snapshot arrived damaged, only damaged nodes found damage"),
    ("failed_writes_stop", "a node whose fsync failed, or whose full disk failed a write, exited with code 74 "
                           "and said which file and errno"),
)

# The attempt number is the fencing token: these say a worker that no longer owns a job could
# not complete it, and that an attempt is handed out once. The report's verdict names them.
FENCING = ("redelivery_attempts", "stale_attempt", "no_delivery_after_ack")


def reserve_now(op: dict, job: dict):
    """The replicated time at which the reserve was applied: lease expiry minus the lease."""
    if job.get("lease_expires") is None or op.get("lease_ms") is None:
        return None
    return job["lease_expires"] - op["lease_ms"]


# ---------------------------------------------------------------------------- what the judges share
@dataclass
class Evidence:
    """What every invariant is judged on: the history indexed, the power cuts, check's other
    arguments (see its docstring), and what several judges derive from them (once, when first
    asked for)."""
    ix: Index
    pc: PowerCuts
    drain: dict | None = None
    views: list | None = None
    leader_claims: dict | None = None
    liveness: dict | None = None
    retry: dict | None = None
    clock_tolerance_ms: int = 100
    internal_errors: list | None = None
    node_logs: dict | None = None
    disk_faults: list | None = None
    untrusted_claims: list | None = None
    gates: dict | None = None
    max_catchup_ticks: int = MAX_CATCHUP_TICKS
    key_queues: dict | None = None
    clock_lag_ms: int = 0
    key_report: dict = field(default_factory=dict)    # keyed queue -> what its judges measured, for the report

    @cached_property
    def value_jobs(self) -> dict:
        """value -> ids of the jobs it became: fresh (not deduplicated) enqueue answers, deliveries."""
        out: dict[str, set] = defaultdict(set)
        for op, item, res in self.ix.ok_items:
            if not res.get("dedup"):
                out[item["value"]].add(res["job_id"])
        for jid, values in self.ix.job_value.items():
            for v in values:
                if v is not None:
                    out[v].add(jid)
        return out

    @cached_property
    def power_lost(self) -> set:
        return _power_lost_jobs(self.ix, self.pc, self.value_jobs)

    @cached_property
    def tick_erased(self) -> set:
        return _maybe_erased_tick_jobs(self.ix, self.pc)

    @cached_property
    def ok_jobs(self) -> dict:
        """job id -> (op, item) of the first ok enqueue answered with it."""
        out: dict[str, tuple] = {}
        for op, item, res in self.ix.ok_items:
            out.setdefault(res["job_id"], (op, item))
        return out

    @cached_property
    def gated(self) -> list:
        return _gated_deliveries(self.ix, self.gates)

    @cached_property
    def keyed(self) -> dict:
        return _keyed_hand_outs(self.ix, self.key_queues)

    @cached_property
    def deps(self) -> dict:
        return _dependency_graph(self.ix, self.value_jobs)

    @cached_property
    def critical_lines(self) -> list:
        return _critical_lines(self.node_logs, self.disk_faults)


def _power_lost_jobs(ix: Index, pc: PowerCuts, value_jobs: dict) -> set:
    """Jobs a memory-mode power cut may have erased: every enqueue that could have created one was
    answered in a cut's window, and nothing shows the job after that cut's restart."""
    power_lost: set = set()
    if not pc:
        return power_lost
    job_values: dict[str, set] = defaultdict(set)
    for v, jobs in value_jobs.items():
        for jid in jobs:
            job_values[jid].add(v)
    value_ops: dict[str, list] = defaultdict(list)
    job_ops: dict[str, list] = defaultdict(list)
    for op in ix.ops:
        if op.get("f") == "enqueue":
            for item in op.get("items") or []:
                value_ops[item["value"]].append(op)
            for res in (op.get("results") or []) if _ok(op) else []:
                if res and "job_id" in res:
                    job_ops[res["job_id"]].append(op)
        elif op.get("f") in ("ack", "nack", "extend") and _ok(op):
            job_ops[op["job_id"]].append(op)
    for jid, ds in ix.deliveries.items():
        job_ops[jid].extend(op for op, _ in ds)
    for jid in set(job_ops) | set(job_values):
        if jid in ix.dlq:
            continue
        creators = [op for v in job_values.get(jid, ()) for op in value_ops.get(v, ())] + \
            [op for op in job_ops.get(jid, ()) if op.get("f") == "enqueue"]
        first = min((op for op in creators if op.get("w1") is not None and op.get("t1") is not None),
                    key=lambda op: op["w1"], default=None)
        seen = [op for op in job_ops.get(jid, ()) if _ok(op)]
        if first is None or not seen:
            continue
        if any(all(op["t1"] <= c["sep"] for op in seen) for c in pc.at_risk(first["w1"], first["t1"])):
            power_lost.add(jid)
    return power_lost


# ---------------------------------------------------------------------------- identity
def judge_lost(ev: Evidence, inv: Inv):
    """`lost` (docs/chaos.md "Invariants"): every ok enqueue, and every tick's job seen, acked or dead-lettered."""
    ix = ev.ix
    for jid, (op, item) in ev.ok_jobs.items():
        if jid in ix.dlq or _maybe_acked(ix, jid):
            continue
        last = None
        if ix.deliveries.get(jid):
            lop, lj = ix.deliveries[jid][-1]
            last = {"op": lop["id"], "attempt": lj["attempt"], "t": round(lop["t1"], 3)}
        inv.bad_unless(jid in ev.power_lost,
                       {"job_id": jid, "value": item["value"], "enqueue_op": op["id"], "proc": op.get("proc"),
                        "t": round(op["t1"], 3), "last_delivery": last})
    # A tick's job, once seen, is acked or dead-lettered too (no enqueue answered for it: the
    # cluster made it; a memory-mode power cut may have erased its firing).
    for jid in ix.job_ticks:
        if jid in ix.dlq or _maybe_acked(ix, jid):
            continue
        name, tick = sorted(ix.job_ticks[jid], key=str)[0]
        lop, lj = ix.deliveries[jid][-1]
        inv.bad_unless(jid in ev.tick_erased, {"job_id": jid, "schedule": name, "tick": tick,
                                               "last_delivery": {"op": lop["id"], "attempt": lj["attempt"],
                                                                 "t": round(lop["t1"], 3)}})


def _maybe_acked(ix: Index, jid: str) -> bool:
    """An ok ack, or an unknown one of the job's latest attempt delivered (it may have completed it)."""
    top = max((j["attempt"] for _, j in ix.deliveries.get(jid, ())), default=0)
    return any(_ok(a) for a in ix.acks.get(jid, ())) or \
        any(a["outcome"] == "unknown" and a["attempt"] >= top for a in ix.acks.get(jid, ()))


def judge_unexpected(ev: Evidence, inv: Inv):
    """`unexpected` (docs/chaos.md "Invariants"): every job seen was enqueued, or ticked by a schedule, in this run."""
    ix = ev.ix
    for jid, values in ix.job_value.items():
        for v in values:
            if v is None or v not in ix.attempted:
                inv.bad({"job_id": jid, "value": v})
    for jid, ticks in ix.job_ticks.items():
        for name, tick in ticks:
            if name not in ix.schedule_puts:
                inv.bad({"job_id": jid, "schedule": name, "tick": tick, "why": "a schedule this run never created"})


def judge_duplicate_jobs(ev: Evidence, inv: Inv):
    """`duplicate_jobs` (docs/chaos.md "Invariants"): one value, one job, carrying that value."""
    ix = ev.ix
    for v, jobs in ev.value_jobs.items():
        if len(jobs) > 1:
            inv.bad_unless(len(jobs - ev.power_lost) <= 1, {"value": v, "job_ids": sorted(jobs)})
    for jid, values in ix.job_value.items():
        if len(values) > 1:
            inv.bad({"job_id": jid, "payload_values": sorted(map(str, values))})
    for op, item, res in ix.ok_items:
        if not res.get("dedup"):
            seen = ix.job_value.get(res["job_id"])
            if seen and item["value"] not in seen:
                inv.bad({"job_id": res["job_id"], "enqueued_value": item["value"],
                         "delivered_values": sorted(map(str, seen))})


def judge_idempotency(ev: Evidence, inv: Inv):
    """`idempotency` (docs/chaos.md "Invariants"): one job, one fresh answer, per idempotency key."""
    ix = ev.ix
    key_jobs: dict[tuple, set] = defaultdict(set)
    key_fresh: dict[tuple, list] = defaultdict(list)
    for op, item, res in ix.ok_items:
        if item.get("key"):
            k = (item.get("queue"), item["key"])          # keys are scoped to their queue
            key_jobs[k].add(res["job_id"])
            if not res.get("dedup"):
                key_fresh[k].append((op["id"], res["job_id"]))
    for jid, keys in ix.job_key.items():
        for k in keys:
            if k:
                key_jobs[(ix.job_queue.get(jid), k)].add(jid)
    for k, jobs in key_jobs.items():
        if len(jobs) > 1:
            inv.bad_unless(len(jobs - ev.power_lost) <= 1, {"queue": k[0], "key": k[1], "job_ids": sorted(jobs)})
    for k, fresh in key_fresh.items():
        if len(fresh) > 1:
            kept = [jid for _, jid in fresh if jid not in ev.power_lost]
            inv.bad_unless(len(kept) <= 1, {"queue": k[0], "key": k[1],
                                            "non_deduplicated_answers": [i for i, _ in fresh]})


# ---------------------------------------------------------------------------- deliveries
def judge_redelivery_attempts(ev: Evidence, inv: Inv):
    """`redelivery_attempts` (docs/chaos.md "Invariants"): each redelivery carries a strictly higher attempt."""
    pc = ev.pc
    for jid, ds in ev.ix.deliveries.items():
        by_attempt = defaultdict(list)
        for op, j in ds:
            by_attempt[j["attempt"]].append(op)
        for a, same in by_attempt.items():
            if len(same) > 1:
                # Excused when each earlier delivery of the attempt was lost to a cut before the next.
                same.sort(key=lambda op: op["t1"])
                excused = all(pc.lost_before(x, y["t1"]) for x, y in zip(same, same[1:]))
                inv.bad_unless(excused, {"job_id": jid, "attempt": a, "delivered_by_ops": [op["id"] for op in same]})
        for op1, j1 in ds:
            for op2, j2 in ds:
                if op1["t1"] < op2["t0"] and j1["attempt"] > j2["attempt"]:
                    inv.bad_unless(pc.lost_before(op1, op2["t1"]),
                                   {"job_id": jid, "first": {"op": op1["id"], "attempt": j1["attempt"]},
                                    "later": {"op": op2["id"], "attempt": j2["attempt"]}})


def judge_stale_attempt(ev: Evidence, inv: Inv):
    """`stale_attempt` (docs/chaos.md "Invariants"): no ok settle with an attempt older than one delivered."""
    ix = ev.ix
    for table in (ix.acks, ix.nacks, ix.extends, ix.releases):
        for jid, lst in table.items():
            for op in lst:
                if not _ok(op):
                    continue
                newer = [(d, j) for d, j in ix.deliveries.get(jid, ())
                         if d["t1"] < op["t0"] and j["attempt"] > op["attempt"]]
                if newer:
                    hit = newer[0]
                    inv.bad_unless(all(ev.pc.lost_before(d, op["t1"]) for d, _ in newer),
                                   {"job_id": jid, "op": op["id"], "f": op["f"], "attempt": op["attempt"],
                                    "newer_delivery": {"op": hit[0]["id"], "attempt": hit[1]["attempt"]}})


def judge_no_delivery_after_ack(ev: Evidence, inv: Inv):
    """`no_delivery_after_ack` (docs/chaos.md "Invariants"): an ok ack ends the job for good."""
    ix, pc = ev.ix, ev.pc

    def either_lost(x, y) -> bool:
        """One of two ok ops that cannot both have happened was lost to a cut before the other."""
        return pc.lost_before(x, y["t1"]) or pc.lost_before(y, x["t1"])

    for jid, lst in ix.acks.items():
        oks = sorted((op for op in lst if _ok(op)), key=lambda op: op["t1"])
        if len(oks) > 1:
            inv.bad_unless(all(pc.lost_before(x, y["t1"]) for x, y in zip(oks, oks[1:])),
                           {"job_id": jid, "ok_acks": [op["id"] for op in oks]})
        for ack in oks:
            a = ack["attempt"]
            for op, j in ix.deliveries.get(jid, ()):
                if j["attempt"] > a or (j["attempt"] <= a and op["t0"] > ack["t1"]):
                    inv.bad_unless(either_lost(ack, op), {"job_id": jid, "ack": ack["id"], "ack_attempt": a,
                                                          "delivery": op["id"], "attempt": j["attempt"]})
            if jid in ix.dlq:
                rec = ix.dlq[jid][0]
                inv.bad_unless(pc.lost_before_wall(ack, rec.get("failed_at")),
                               {"job_id": jid, "ack": ack["id"], "dead_letter": rec})
            for n in list(ix.nacks.get(jid, ())) + list(ix.releases.get(jid, ())):
                if _ok(n) and n["attempt"] >= a:
                    inv.bad_unless(either_lost(ack, n), {"job_id": jid, "ack": ack["id"], "ok_nack": n["id"]})


def judge_attempts_bound(ev: Evidence, inv: Inv):
    """`attempts_bound` (docs/chaos.md "Invariants"): 1 <= attempts used <= max_attempts, delivered or dead."""
    ix = ev.ix
    for jid, ds in ix.deliveries.items():
        for op, j in ds:
            mx = j.get("max_attempts")
            used = j["attempt"] - (j.get("releases") or 0)
            if not (1 <= used and (mx is None or used <= mx)):
                inv.bad({"job_id": jid, "attempt": j["attempt"], "releases": j.get("releases"),
                         "max_attempts": mx, "op": op["id"]})
    for jid, recs in ix.dlq.items():
        rec = recs[0]
        fa, mx = rec["final_attempt"], rec.get("max_attempts") or ix.job_max.get(jid)
        used = fa - (rec.get("releases") or 0)
        if not (1 <= used and (mx is None or used <= mx)):
            inv.bad({"job_id": jid, "dead_letter_final_attempt": fa, "max_attempts": mx})


def judge_schedule(ev: Evidence, inv: Inv):
    """`schedule` (docs/chaos.md "Invariants"): no job leased before its scheduled time."""
    ix = ev.ix
    for jid, ds in ix.deliveries.items():
        for op, j in ds:
            sched = j.get("scheduled_at")
            now = reserve_now(op, j)
            if sched is not None and now is not None and now < sched:
                inv.bad({"job_id": jid, "op": op["id"], "scheduled_at": sched, "leased_at": now,
                         "early_ms": sched - now, "clock": "replicated"})
            item = ix.attempted.get(j.get("value"))
            if item and item.get("scheduled_at") is not None:
                if sched is not None and sched != item["scheduled_at"]:
                    inv.bad({"job_id": jid, "op": op["id"], "asked": item["scheduled_at"], "got": sched})
                if op["w1"] is not None and op["w1"] < item["scheduled_at"] - ev.clock_tolerance_ms:
                    inv.bad({"job_id": jid, "op": op["id"], "scheduled_at": item["scheduled_at"],
                             "answered_at_wall": op["w1"], "early_ms": item["scheduled_at"] - op["w1"],
                             "clock": "wall"})


# ---------------------------------------------------------------------------- retry delay, lease honoured
def _next_attempts(ix: Index):
    """(job id, attempt a, (op, job) of a's first delivery, that of a + 1's, their replicated
    lease times) for every job delivered under two consecutive attempts with both times known."""
    for jid, ds in ix.deliveries.items():
        at = {}
        for op, j in ds:
            at.setdefault(j["attempt"], (op, j))
        for a, (op, j) in at.items():
            nxt = at.get(a + 1)
            if nxt is None:
                continue
            now_a, now_b = reserve_now(op, j), reserve_now(*nxt)
            if now_a is not None and now_b is not None:
                yield jid, a, (op, j), nxt, now_a, now_b


def _settled_again(ix: Index, jid: str, a: int) -> tuple[list, list]:
    """(ok nacks that did not dead-letter and ok releases, unknown nacks and releases) of attempt a."""
    nacks, rels = ix.nacks.get(jid, ()), ix.releases.get(jid, ())
    ok = [n for n in nacks if n["attempt"] == a and _ok(n) and not n.get("dead_lettered")] + \
        [r for r in rels if r["attempt"] == a and _ok(r)]
    maybe = [n for n in list(nacks) + list(rels) if n["attempt"] == a and n["outcome"] == "unknown"]
    return ok, maybe


def _retry_wait_ms(n: dict, jid: str, j: dict, retry: dict | None) -> int:
    """How long after nack or release n (of delivery j) the job may come back."""
    if n["f"] == "release":
        horizon = (retry or {}).get("max_schedule_horizon_ms")
        return min(n.get("delay_ms") or 0, horizon) if horizon else (n.get("delay_ms") or 0)
    if n["strategy"] == "delay":
        horizon = (retry or {}).get("max_schedule_horizon_ms")
        return min(n["delay_ms"] or 0, horizon) if horizon else (n["delay_ms"] or 0)
    if retry is not None:
        # The policy counts attempts used: a release uses none.
        return policy_delay_ms(jid, n["attempt"] - (j.get("releases") or 0), retry["retry_delay_ms"],
                               retry["retry_backoff"], retry["retry_delay_max_ms"], retry["max_schedule_horizon_ms"])
    return 0


def judge_retry_delay(ev: Evidence, inv: Inv):
    """`retry_delay` (docs/chaos.md "Invariants"): a nacked job is not redelivered before its retry delay."""
    pc = ev.pc
    for jid, a, (op, j), nxt, now_a, now_b in _next_attempts(ev.ix):
        ok_nacks, _ = _settled_again(ev.ix, jid, a)
        if not ok_nacks:
            continue
        n = ok_nacks[0]
        want = _retry_wait_ms(n, jid, j, ev.retry)
        if now_b < now_a + want:
            inv.bad_unless(pc.lost_before(n, nxt[0]["t1"]) or pc.lost_before(op, nxt[0]["t1"]),
                           {"job_id": jid, "attempt": a, "nack": n["id"], "delay_ms": want,
                            "redelivered_after_ms": now_b - now_a})


def judge_lease_honoured(ev: Evidence, inv: Inv):
    """`lease_honoured` (docs/chaos.md "Invariants"): no redelivery without a nack before the (extended) lease end."""
    pc = ev.pc
    for jid, a, (op, j), nxt, now_a, now_b in _next_attempts(ev.ix):
        ok_nacks, maybe_nacks = _settled_again(ev.ix, jid, a)
        if ok_nacks or maybe_nacks:
            continue
        expiry = kept = j.get("lease_expires")
        if pc.lost_before(op, nxt[0]["t1"]):
            kept = None
        for e in ev.ix.extends.get(jid, ()):
            if e["attempt"] == a and _ok(e) and e.get("lease_expires") is not None:
                expiry = max(expiry, e["lease_expires"])
                if kept is not None and not pc.lost_before(e, nxt[0]["t1"]):
                    kept = max(kept, e["lease_expires"])
        if expiry is not None and now_b < expiry:
            # Excused when only lease ends that a cut may have erased come after it.
            inv.bad_unless(kept is None or now_b >= kept, {"job_id": jid, "attempt": a, "lease_end": expiry,
                                                           "redelivered_at": now_b, "early_ms": expiry - now_b})


# ---------------------------------------------------------------------------- dead letters
def judge_dead_letters(ev: Evidence, inv: Inv):
    """`dead_letters` (docs/chaos.md "Invariants"): right cause, attempt and reason; each dead-lettering nack shows."""
    ix = ev.ix
    for jid, recs in ix.dlq.items():
        if len(recs) > 1:
            inv.bad({"job_id": jid, "records": len(recs)})
        _judge_dead_letter(ev, inv, jid, recs[0])
    for jid, lst in ix.nacks.items():
        for n in lst:
            if not _ok(n):
                continue
            mx = n.get("max_attempts") or ix.job_max.get(jid)
            used = n["attempt"] - (n.get("releases") or 0)
            expect = n["strategy"] == "dead_letter" or (mx is not None and used >= mx)
            if n.get("dead_lettered") != expect:
                inv.bad({"job_id": jid, "nack": n["id"], "attempt": n["attempt"], "max_attempts": mx,
                         "strategy": n["strategy"], "dead_lettered": n.get("dead_lettered"),
                         "why": "dead_lettered flag differs from the rules"})
            if n.get("dead_lettered"):
                recs = ix.dlq.get(jid)
                want = "rejected" if n["strategy"] == "dead_letter" else "attempts_exhausted"
                if not recs or recs[0]["cause"] != want or recs[0]["final_attempt"] != n["attempt"]:
                    inv.bad_unless(ev.pc.lost_before_wall(n, recs[0].get("failed_at") if recs else None),
                                   {"job_id": jid, "nack": n["id"], "want_cause": want,
                                    "found": recs[0] if recs else None,
                                    "why": "an ok dead-lettering nack without its dead letter"})


def _judge_dead_letter(ev: Evidence, inv: Inv, jid: str, rec: dict):
    """One dead letter against the nacks, acks and attempts of its job, by its cause."""
    ix = ev.ix
    fa, mx, cause = rec["final_attempt"], rec.get("max_attempts") or ix.job_max.get(jid), rec["cause"]
    used = fa - (rec.get("releases") or 0)
    nacks_at = [n for n in ix.nacks.get(jid, ()) if n["attempt"] == fa and n["outcome"] in ("ok", "unknown")]
    if cause == "rejected":
        match = [n for n in nacks_at if n["strategy"] == "dead_letter" and n["reason"] == rec.get("last_reason")]
        if not match:
            inv.bad({"job_id": jid, "cause": cause, "final_attempt": fa,
                     "why": "no dead_letter nack for this attempt with this reason",
                     "last_reason": rec.get("last_reason")})
    elif cause == "attempts_exhausted":
        match = [n for n in nacks_at if n["strategy"] != "dead_letter" and n["reason"] == rec.get("last_reason")]
        if mx is not None and used < mx or not match:
            inv.bad({"job_id": jid, "cause": cause, "final_attempt": fa, "max_attempts": mx,
                     "why": "not the last attempt, or no nack for it with this reason",
                     "last_reason": rec.get("last_reason")})
    elif cause == "lease_expired":
        done = [x for x in list(ix.acks.get(jid, ())) + list(ix.nacks.get(jid, ())) if x["attempt"] == fa and _ok(x)]
        if (mx is not None and used < mx) or rec.get("last_reason") is not None or done:
            excused = bool(done) and not ((mx is not None and used < mx) or rec.get("last_reason") is not None) \
                and all(ev.pc.lost_before_wall(x, rec.get("failed_at")) for x in done)
            inv.bad_unless(excused, {"job_id": jid, "cause": cause, "final_attempt": fa,
                                     "max_attempts": mx, "ok_ops": [x["id"] for x in done],
                                     "why": "not the last attempt, has a reason, or was acked/nacked ok"})
    elif cause != "dependency_failed":          # (that one is dependency_failed_never_runs')
        inv.bad({"job_id": jid, "cause": cause, "why": "a cause this workload never produces"})


# ---------------------------------------------------------------------------- final state
def judge_drained(ev: Evidence, inv: Inv):
    """`drained` (docs/chaos.md "Invariants"): after healing no job and no dead letter is left anywhere."""
    if ev.drain is not None:
        if not ev.drain.get("ok"):
            inv.bad({"why": "the final drain did not finish", "queues": ev.drain.get("queues")})
        for q in ev.drain.get("queues") or []:
            left = {k: q.get(k, 0) for k in ("ready", "scheduled", "in_flight", "waiting", "dead_lettered")
                    if q.get(k, 0)}
            if left:
                inv.bad({"queue": q.get("name"), "left": left})
    else:
        inv.skipped = "no final drain"
    for v in ev.views or []:
        if not v:
            continue                                      # replicas_agree's
        st = v.get("state") or {}
        if st.get("jobs", 0) or st.get("dead_letters", 0):
            inv.bad({"node": v.get("node_id"), "jobs": st.get("jobs"), "dead_letters": st.get("dead_letters")})


def judge_replicas_agree(ev: Evidence, inv: Inv):
    """`replicas_agree` (docs/chaos.md "Invariants"): every node ends at one applied index and state digest."""
    if ev.views is None:
        inv.skipped = "no node views"
        return
    for i, v in enumerate(ev.views):
        if not v:
            inv.bad({"node": i, "why": "no view (node down or not answering)"})
    got = [(v.get("node_id"),) + digest_at(v) for v in ev.views if v]
    if len({(a, d) for _, a, d in got}) > 1:
        inv.bad({"views": got})


def judge_one_leader_per_term(ev: Evidence, inv: Inv):
    """`one_leader_per_term` (docs/chaos.md "Invariants"): at most one node claims leadership in a term."""
    if ev.leader_claims is None:
        inv.skipped = "no samples"
        return
    # Strict in both modes: term and vote are synced before they are acted on in memory mode
    # too (node/replication/replica.py), so even a power cut cannot make a node vote twice in a term.
    for term, nodes in sorted(ev.leader_claims.items(), key=lambda kv: int(kv[0])):
        if len(set(nodes)) > 1:
            inv.bad({"term": term, "leaders": sorted(set(nodes))})


def judge_liveness(ev: Evidence, inv: Inv):
    """`liveness` (docs/chaos.md "Invariants"): a leader within the bound after healing; leases lapse in time."""
    if ev.liveness is None:
        inv.skipped = "not measured"
        return
    la, bound = ev.liveness.get("leader_after_heal_s"), ev.liveness.get("leader_bound_s")
    if la is None or (bound is not None and la > bound):
        inv.bad({"leader_after_heal_s": la, "bound_s": bound})
    lp = ev.liveness.get("lease_probe")
    if lp is not None and not lp.get("ok"):
        inv.bad({"lease_probe": lp})


def judge_no_internal_errors(ev: Evidence, inv: Inv):
    """`no_internal_errors` (docs/chaos.md "Invariants"): the cluster never answered `internal`."""
    for e in ev.internal_errors or []:
        inv.bad(e)
    for op in ev.ix.ops:
        if op.get("error") == "internal":
            inv.bad({"op": op["id"], "f": op["f"]})


# ---------------------------------------------------------------------------- disks
def _critical_lines(node_logs: dict | None, disk_faults: list | None) -> list:
    """(node, line, what) of every CRITICAL node log line: what is "snapshot_damaged" (a snapshot
    that arrived damaged), "damaged_node" (a damaged node's own disk-check or storage-failure line,
    as it must say), "undamaged_node" (such a line from a node no fault damaged) or "other"."""
    if node_logs is None:
        return []
    damaged_nodes = {f.get("node") for f in disk_faults or [] if not f.get("skipped")}
    by_node = node_logs.get("critical_by_node")
    if by_node is None:
        by_node = {None: node_logs.get("critical", [])}
    out = []
    for nid, lines in by_node.items():
        for line in lines:
            ours = "disk check:" in line or "storage failure:" in line
            if "disk check: snapshot_received_damaged" in line:
                what = "snapshot_damaged"
            elif ours:
                what = "damaged_node" if nid in damaged_nodes else "undamaged_node"
            else:
                what = "other"
            out.append((nid, line, what))
    return out


def judge_no_critical_node_logs(ev: Evidence, inv: Inv):
    """`no_critical_node_logs` (docs/chaos.md "Invariants"): no CRITICAL line but a damaged node's disk lines."""
    if ev.node_logs is None:
        inv.skipped = "no node logs"
        return
    for nid, line, what in ev.critical_lines:
        if what in ("undamaged_node", "other"):
            inv.bad({"line": line})


def judge_checksum_failures_contained(ev: Evidence, inv: Inv):
    """`checksum_failures_contained` (docs/chaos.md "Invariants"): damage found, never served, voted or sent."""
    for nid, line, what in ev.critical_lines:
        if what == "snapshot_damaged":
            inv.bad({"node": nid, "why": "a snapshot arrived damaged", "line": line})
        elif what == "undamaged_node":
            inv.bad({"node": nid, "why": "damage found on a node no fault damaged", "line": line})
    for f in ev.disk_faults or []:
        if f.get("skipped") or f.get("damage_skipped"):
            continue
        if f["kind"] in ("bitflip", "truncate") and not f.get("found"):
            inv.bad({"fault": f.get("id"), "kind": f["kind"], "node": f.get("node"),
                     "why": "damage the node did not find",
                     "damage": {k: f.get(k) for k in ("file", "bits", "cut_at")}})
    for claim in ev.untrusted_claims or []:
        inv.bad(dict(claim, why="led or stood for election with an untrusted log"))
    if ev.disk_faults is None:
        inv.skipped = "no disk faults"


def judge_failed_writes_stop(ev: Evidence, inv: Inv):
    """`failed_writes_stop` (docs/chaos.md "Invariants"): a failed fsync or full-disk write exits 74, saying why."""
    if ev.disk_faults is None:
        inv.skipped = "no disk faults"
    for f in ev.disk_faults or []:
        if f.get("skipped") or f.get("damage_skipped"):
            continue
        if f["kind"] == "fsync-eio" and "exit_code" in f:
            if f["exit_code"] != 74 or not f.get("logged"):
                inv.bad({"fault": f.get("id"), "node": f.get("node"), "exit_code": f["exit_code"],
                         "logged": f.get("logged")})
        if f["kind"] == "disk-full" and f.get("exit_code") is not None and f["exit_code"] != 74:
            inv.bad({"fault": f.get("id"), "node": f.get("node"), "exit_code": f["exit_code"]})


# ---------------------------------------------------------------------------- the driver
def check(ops: list[dict], *, dead_letters: list[dict], drain: dict | None = None, views: list | None = None,
          leader_claims: dict | None = None, liveness: dict | None = None, retry: dict | None = None,
          clock_tolerance_ms: int = 100, internal_errors: list | None = None,
          node_logs: dict | None = None, power_losses: list | None = None, disk_faults: list | None = None,
          untrusted_claims: list | None = None, gates: dict | None = None,
          max_catchup_ticks: int = MAX_CATCHUP_TICKS, keys: dict | None = None, clock_lag_ms: int = 0) -> dict:
    """All invariants. `retry` = {retry_delay_ms, retry_backoff, retry_delay_max_ms,
    max_schedule_horizon_ms}: the cluster's retry policy (to check default-nack delays).
    `leader_claims` = {term: [node ids that said they lead in that term]}. `power_losses` = the
    `power-loss` fault records: in memory mode, what a cut explains is counted apart as expected
    (PowerCuts), never hidden; fsync-mode cuts excuse nothing. `disk_faults` = the records of the
    faults that damaged, failed or filled a node's disk (bitflip, truncate, rollback, fsync-eio,
    disk-full), `untrusted_claims` = views of a node leading or standing for election while its
    log was untrusted (the sampler's). `max_catchup_ticks`: the cluster's (no_tick_missed).
    `keys`: the keyed queues' settings, `clock_lag_ms` how far the replicated clock may lag the
    wall clock (key_concurrency_held; see the module's docstring)."""
    ev = Evidence(Index(ops, dead_letters), PowerCuts(power_losses), drain=drain, views=views,
                  leader_claims=leader_claims, liveness=liveness, retry=retry, clock_tolerance_ms=clock_tolerance_ms,
                  internal_errors=internal_errors, node_logs=node_logs, disk_faults=disk_faults,
                  untrusted_claims=untrusted_claims, gates=gates, max_catchup_ticks=max_catchup_ticks,
                  key_queues=keys, clock_lag_ms=clock_lag_ms)
    invs = {name: Inv(name, about) for name, about in INVARIANTS}
    for name, judge in JUDGES.items():
        judge(ev, invs[name])
    out = [inv.out() for inv in invs.values()]
    return {"valid": all(i["ok"] for i in out), "invariants": out, "stats": _stats(ev, invs),
            "failures": failed_ops(ev.ix)}


def _stats(ev: Evidence, invs: dict) -> dict:
    """What the run did, for the report."""
    ix = ev.ix
    by_outcome: dict = defaultdict(lambda: defaultdict(int))
    for op in ix.ops:
        by_outcome[op["f"]][op.get("outcome") or "open"] += 1
    causes: dict = defaultdict(int)
    for recs in ix.dlq.values():
        causes[recs[0]["cause"]] += 1
    return {
        "ops": {f: dict(v) for f, v in sorted(by_outcome.items())},
        "lost_after_power_loss": invs["lost"].expected,
        "disk_critical_lines": sum(1 for _, _, what in ev.critical_lines if what == "damaged_node"),
        "expected_after_power_loss": sum(i.expected for i in invs.values()),
        "enqueued_ok_jobs": len(ev.ok_jobs),
        "attempted_values": len(ix.attempted),
        "recovered": sum(1 for v in ix.unknown_values if ev.value_jobs.get(v)),
        "jobs_delivered": len(ix.deliveries),
        "deliveries": sum(len(d) for d in ix.deliveries.values()),
        "redeliveries": sum(len(ds) - 1 for ds in ix.deliveries.values()),
        "acked_ok_jobs": sum(1 for lst in ix.acks.values() if any(_ok(a) for a in lst)),
        "dead_letters": dict(causes),
        "releases_ok": sum(1 for lst in ix.releases.values() for r in lst if _ok(r)),
        "gated_deliveries": {q: sum(1 for ds in ix.deliveries.values() for _, j in ds if j.get("queue") == q)
                             for q in ("thr", "cb", "win")} if ev.gates else None,
        "schedules": _schedule_stats(ev),
        "keys": _key_stats(ev),
        "workflows": _workflow_stats(ev),
        "batches": _batch_stats(ev),
    }


# ---------------------------------------------------------------------------- failed ops
SETTLES = ("ack", "nack", "extend", "release")
# A worker that lost its lease gets one of these for its ack, nack, extend or release.
FENCED_CODES = ("attempt_mismatch", "job_not_found")
WHY = {
    "fenced": "the worker's lease had lapsed (a deliberate stall, or a fault that held the call up) and the job "
              "had moved on: this attempt is fenced off; the job was redelivered, dead-lettered or acked, not lost",
    "unknown": "no answer in time (a fault, or the recovery after one): it may or may not have happened, and "
               "the checker accepts either",
    "cancelled": "still waiting for its answer when the workload stopped; the checker accepts either outcome",
    "unexplained_fence": "refused as no longer owned, but the job never showed up again (no later attempt, dead "
                         "letter or ok ack): unexplained",
    "internal": "the cluster answered `internal` (a bug; also counted by no_internal_errors)",
    "refused": "a definite refusal the workload does not expect",
}


def _moved_on(ix: Index, op: dict) -> bool:
    """The job of a refused settle op went on without it: delivered again under a newer attempt,
    dead-lettered, or completed by another ok op of the same or a newer attempt."""
    jid, a = op.get("job_id"), op.get("attempt")
    if jid is None or a is None:
        return False
    if jid in ix.dlq or any(j["attempt"] > a for _, j in ix.deliveries.get(jid, ())):
        return True
    done = list(ix.acks.get(jid, ())) + list(ix.nacks.get(jid, ())) + list(ix.releases.get(jid, ()))
    return any(_ok(x) and x["id"] != op["id"] and x["attempt"] >= a for x in done)


def _failure_cause(ix: Index, op: dict) -> str:
    """Why an op did not end ok: one of WHY's keys."""
    err = op.get("error")
    if err == "internal":
        return "internal"
    if op.get("outcome") == "unknown":
        return "cancelled" if err == "cancelled" else "unknown"
    if op.get("f") in SETTLES and err in FENCED_CODES:
        return "fenced" if _moved_on(ix, op) else "unexplained_fence"
    return "refused"


def failed_ops(ix: Index) -> list[dict]:
    """Every op that failed or whose outcome is unknown, grouped by (op, outcome, error, cause):
    [{f, outcome, error, count, expected, cause, why, examples}], the expected ones (what faults
    and the workload's own stalls must cause, and what the guarantees cover) apart from the
    rest. Not invariants: the invariants judge what these ops did to the jobs."""
    rows: dict = {}
    for op in ix.ops:
        if op.get("outcome") not in ("fail", "unknown"):
            continue
        cause = _failure_cause(ix, op)
        key = (op["f"], op["outcome"], op.get("error"), cause)
        row = rows.setdefault(key, {"f": op["f"], "outcome": op["outcome"], "error": op.get("error"), "count": 0,
                                    "expected": cause in ("fenced", "unknown", "cancelled"), "cause": cause,
                                    "why": WHY[cause], "examples": []})
        row["count"] += 1
        if len(row["examples"]) < MAX_EXAMPLES:
            row["examples"].append({k: op[k] for k in ("id", "proc", "job_id", "attempt") if op.get(k) is not None})
    return sorted(rows.values(), key=lambda r: (r["expected"], r["f"], r["outcome"], str(r["error"])))


# ---------------------------------------------------------------------------- releases
def judge_release_uses_no_attempt(ev: Evidence, inv: Inv):
    """`release_uses_no_attempt` (docs/chaos.md "Invariants"): a released job comes back, attempts used unchanged."""
    ix = ev.ix
    # An ok release of attempt a: the next delivery carries attempt a + 1 and one release more,
    # so the attempts used (attempt - releases) are those of the released delivery.
    for jid, lst in ix.releases.items():
        ds = ix.deliveries.get(jid, ())
        for r in lst:
            if not _ok(r):
                continue
            before = [j for _, j in ds if j["attempt"] == r["attempt"]]
            after = [(op, j) for op, j in ds if j["attempt"] == r["attempt"] + 1]
            if not before or not after:
                continue
            used_before = before[0]["attempt"] - (before[0].get("releases") or 0)
            op, j = after[0]
            used_after = j["attempt"] - (j.get("releases") or 0)
            if used_after != used_before:
                inv.bad_unless(ev.pc.lost_before(r, op["t1"]), {
                    "job_id": jid, "release": r["id"], "attempt": r["attempt"], "used_before": used_before,
                    "next_delivery": op["id"], "used_after": used_after})


# ---------------------------------------------------------------------------- gates
# The gates against the history. What a memory-mode power cut may have erased (a delivery, a
# failure) before the delivery being judged does not count against it: the cluster that made
# that delivery no longer knew of it (counted apart as expected, like the other invariants'
# power-cut echoes).
def _gated_deliveries(ix: Index, gates: dict) -> list:
    """(reserve op, job, replicated time it was leased) of every delivery made before the gates
    were lifted, in replicated-time order."""
    lifted = min((op["t0"] for op in ix.ops if op.get("f") == "lift_gates"), default=None)
    out = []
    for jid, ds in ix.deliveries.items():
        for op, j in ds:
            if lifted is not None and op["t0"] >= lifted:
                continue
            now = reserve_now(op, j)
            if now is not None:
                out.append((op, j, now))
    out.sort(key=lambda x: x[2])
    return out


def _settles(ix: Index, jid: str, attempt: int) -> list:
    return [x for table in (ix.acks, ix.nacks, ix.releases) for x in table.get(jid, ()) if x["attempt"] == attempt]


def _surely_in_flight(ix: Index, y: tuple, x: tuple) -> bool:
    """Delivery y was certainly still in flight when delivery x was leased: leased no later,
    its first lease not yet ended, and nothing that could have settled it invoked before x's
    reserve was answered."""
    (yop, yj, ynow), (xop, xj, xnow) = y, x
    if ynow > xnow or yj["lease_expires"] is None or xnow >= yj["lease_expires"]:
        return False
    return all(s["t0"] > xop["t1"] for s in _settles(ix, yj["job_id"], yj["attempt"]))


def judge_throttle_limit(ev: Evidence, inv: Inv):
    """`throttle_limit` (docs/chaos.md "Invariants"): never more jobs of a resource in flight than its limit."""
    if not ev.gates:
        inv.skipped = "no gates configured"
        return
    limits = ev.gates.get("resource_limits") or {}
    by_resource: dict = defaultdict(list)
    for d in ev.gated:
        r = d[1].get("resource")
        if r in limits:
            by_resource[r].append(d)
    for r, lst in by_resource.items():
        times = [d[2] for d in lst]
        for x in lst:
            # Only deliveries leased within a lease before x can still hold a slot at x.
            lo = bisect.bisect_left(times, x[2] - MAX_LEASE_MS)
            hi = bisect.bisect_right(times, x[2])
            held = [y for y in lst[lo:hi] if y is not x and y[1]["job_id"] != x[1]["job_id"]
                    and _surely_in_flight(ev.ix, y, x)]
            if len(held) + 1 > limits[r]:
                kept = [y for y in held if not ev.pc.lost_before(y[0], x[0]["t1"])]
                inv.bad_unless(len(kept) + 1 <= limits[r],
                               {"resource": r, "limit": limits[r], "job_id": x[1]["job_id"], "leased_at": x[2],
                                "also_in_flight": [y[1]["job_id"] for y in held]})


def judge_circuit_open(ev: Evidence, inv: Inv):
    """`circuit_open` (docs/chaos.md "Invariants"): an open breaker hands out one probe at a time, open_ms apart."""
    if not ev.gates:
        inv.skipped = "no gates configured"
        return
    cb, ix, pc = ev.gates.get("circuit"), ev.ix, ev.pc
    if not cb:
        return
    mine = [d for d in ev.gated if d[1].get("queue") == cb["queue"]]
    fail_ops = sorted((n for lst in ix.nacks.values() for n in lst
                       if _ok(n) and ix.job_queue.get(n["job_id"]) == cb["queue"] and n.get("proc") != "drain"),
                      key=lambda n: n["t1"])
    fails = [n["t1"] for n in fail_ops]
    prev = None
    for x in mine:
        surely = bisect.bisect_left(fails, x[0]["t0"])        # failures answered before x was asked for
        if prev is not None and surely >= cb["failures"] and x[2] - prev[2] < cb["open_ms"]:
            kept = sum(1 for n in fail_ops[:surely] if not pc.lost_before(n, x[0]["t1"]))
            inv.bad_unless(kept < cb["failures"] or pc.lost_before(prev[0], x[0]["t1"]),
                           {"queue": cb["queue"], "job_id": x[1]["job_id"], "leased_at": x[2],
                            "previous": prev[1]["job_id"], "previous_at": prev[2],
                            "apart_ms": x[2] - prev[2], "open_ms": cb["open_ms"], "failures_before": surely})
        prev = x


def judge_window_closed(ev: Evidence, inv: Inv):
    """`window_closed` (docs/chaos.md "Invariants"): no job of a windowed queue handed out while it is closed."""
    if not ev.gates:
        inv.skipped = "no gates configured"
        return
    win = ev.gates.get("windows")
    if not win:
        return
    spans = sorted(tuple(s) for s in win["open"])
    starts = [a for a, _ in spans]
    for op, j, now in ev.gated:
        if j.get("queue") != win["queue"]:
            continue
        i = bisect.bisect_right(starts, now) - 1
        if i < 0 or not (spans[i][0] <= now < spans[i][1]):
            inv.bad({"queue": win["queue"], "job_id": j["job_id"], "leased_at": now, "op": op["id"]})


# ---------------------------------------------------------------------------- keys
# key_concurrency_held, key_rate_held and queue_rate_held judge every hand-out of a keyed queue
# (the final drain's included: the limits hold then too). A hand-out a memory-mode power cut may
# have erased before the one judged does not count against it (the cluster that made that one
# no longer knew of it): counted apart as expected, like the gates' checks.
def _rate_of(x):
    """A configured rate ({count, period_ms} or [count, period_ms]) as (count, period_ms), or None."""
    if x is None:
        return None
    if isinstance(x, dict):
        return int(x["count"]), int(x["period_ms"])
    return int(x[0]), int(x[1])


def _key_limits(settings: dict, key) -> tuple:
    """(concurrency or None, (count, period_ms) or None) of `key` in a queue (node/core/keys.py
    key_limits: a key_limits entry overrides what it names)."""
    over = (settings.get("key_limits") or {}).get(key) or {}
    conc = over.get("concurrency") if over.get("concurrency") is not None else settings.get("key_concurrency")
    rate = over.get("rate") if over.get("rate") is not None else settings.get("key_rate")
    return conc, _rate_of(rate)


def _lease_end(ix: Index, j: dict):
    """The lease end of delivery j on the replicated clock: its own, or a later one an ok extend
    of the same attempt answered (the job was in flight when the extend applied)."""
    end = j.get("lease_expires")
    if end is None:
        return None
    for e in ix.extends.get(j["job_id"], ()):
        if e["attempt"] == j["attempt"] and _ok(e) and e.get("lease_expires") is not None:
            end = max(end, e["lease_expires"])
    return end


def _key_in_flight(ix: Index, y: tuple, x: tuple, lag_ms: int) -> bool:
    """Delivery y was certainly still in flight on the server when delivery x was handed out.

    Hand-outs are on the replicated clock (lease end minus the lease asked for, exact: the
    lease is never clamped). y was handed out no later than x (x's stamp is not earlier), and
    at x's stamp its lease had not lapsed (x's stamp before y's lease end: a lease lapses at the
    first sweep with now >= its end), and nothing that could end it had been applied: every
    ack, nack or release of y's attempt (whatever its outcome: a retried call may have applied)
    was invoked after x's reserve was answered, or sent (wall ms) more than `lag_ms` after x's
    stamp. The latter holds because the leader stamps a command no earlier than its own wall
    clock when it proposes it, which is after the command was sent, and a leader's clock is
    behind the true one by at most the run's largest backward offset (lag_ms); stamps are ms,
    so equal stamps say nothing about order (strictly greater)."""
    (yop, yj, ynow), (xop, xj, xnow) = y, x
    if ynow > xnow:
        return False
    end = _lease_end(ix, yj)
    if end is None or xnow >= end:
        return False
    for s in _settles(ix, yj["job_id"], yj["attempt"]):
        if not (s["t0"] > xop["t1"] or (s.get("w0") is not None and s["w0"] > xnow + lag_ms)):
            return False
    return True


def _densest(times: list, period: int) -> int:
    """The most of the sorted `times` inside one window of `period` ms (t[j] - t[i] < period)."""
    best = i = 0
    for j, t in enumerate(times):
        while t - times[i] >= period:
            i += 1
        best = max(best, j - i + 1)
    return best


def _keyed_hand_outs(ix: Index, keys: dict | None) -> dict:
    """keyed queue -> its hand-outs (reserve op, job, replicated time), one per attempt, in time order."""
    per_queue: dict = {q: [] for q in keys or {}}
    seen: set = set()
    for jid, ds in ix.deliveries.items():
        for op, j in ds:
            q = j.get("queue") or ix.job_queue.get(jid)
            if q not in per_queue or (jid, j["attempt"]) in seen:
                continue
            seen.add((jid, j["attempt"]))          # one hand-out per attempt (a second one: redelivery_attempts)
            now = reserve_now(op, j)
            if now is not None:
                per_queue[q].append((op, j, now))
    for lst in per_queue.values():
        lst.sort(key=lambda d: (d[2], d[0]["t1"]))
    return per_queue


def _by_key(hand_outs: list) -> dict:
    """key (the job's `tenant`; None for a job without one) -> its hand-outs, in their order."""
    by_key: dict = defaultdict(list)
    for d in hand_outs:
        by_key[d[1].get("tenant")].append(d)
    return by_key


def _held_at(ev: Evidence, kl: list, times: list, x: tuple, conc: int) -> tuple[list, bool]:
    """(the hand-outs of x's key certainly handed out before x and certainly still in flight at
    x's hand-out, whether one of them only counts as "either came second") of key hand-outs kl."""
    lo = bisect.bisect_left(times, x[2] - MAX_LEASE_MS)
    hi = bisect.bisect_right(times, x[2])
    # Those certainly handed out before x (an earlier stamp, the same reserve, or the same stamp
    # by a reserve answered before x's was asked for: the clock stands still while a leader's
    # clock is behind the replicated one) and certainly still in flight at x's hand-out: all of
    # them and x at once.
    held, either = [], False
    for y in kl[lo:hi]:
        if y is x or y[1]["job_id"] == x[1]["job_id"] or not _key_in_flight(ev.ix, y, x, ev.clock_lag_ms):
            continue
        if y[2] < x[2] or y[0] is x[0] or y[0]["t1"] < x[0]["t0"]:
            held.append(y)
        elif conc == 1 and _key_in_flight(ev.ix, x, y, ev.clock_lag_ms):
            # One stamp, two reserves in unknown order, each certainly in flight at the other's
            # hand-out: whichever came second, two at once.
            either = True
            held.append(y)
    return held, either


def judge_key_concurrency_held(ev: Evidence, inv: Inv):
    """`key_concurrency_held` (docs/chaos.md "Invariants"): never more jobs of a key in flight than its limit."""
    if not ev.key_queues:
        inv.skipped = "no keyed queues configured"
        return
    for q, lst in ev.keyed.items():
        peak = {"in_flight": 0, "key": None, "limit": None}
        for key, kl in _by_key(lst).items():
            conc = _key_limits(ev.key_queues[q] or {}, key)[0] if key is not None else None
            if conc is None:
                continue                           # a job without a key, or a key without a limit
            times = [d[2] for d in kl]
            for x in kl:
                held, either = _held_at(ev, kl, times, x, conc)
                if not either and len(held) + 1 > peak["in_flight"]:
                    peak = {"in_flight": len(held) + 1, "key": key, "limit": conc}
                if len(held) + 1 > conc:
                    kept = [y for y in held if not ev.pc.lost_before(y[0], x[0]["t1"])]
                    inv.bad_unless(len(kept) + 1 <= conc, {
                        "queue": q, "key": key, "key_concurrency": conc, "job_id": x[1]["job_id"],
                        "attempt": x[1]["attempt"], "handed_out_at": x[2], "op": x[0]["id"],
                        "also_in_flight": [{"job_id": y[1]["job_id"], "attempt": y[1]["attempt"],
                                            "handed_out_at": y[2], "lease_end": _lease_end(ev.ix, y[1])}
                                           for y in held]})
        ev.key_report.setdefault(q, {})["peak_in_flight"] = peak if peak["limit"] is not None else None


def _judge_rate(ev: Evidence, inv: Inv, hand_outs: list, rate: tuple, where: dict):
    """count + 1 consecutive hand-outs (sorted) inside one period_ms: one too many."""
    count, period = rate
    for i in range(len(hand_outs) - count):
        a, b = hand_outs[i], hand_outs[i + count]
        if b[2] - a[2] < period:
            inv.bad_unless(any(ev.pc.lost_before(d[0], b[0]["t1"]) for d in hand_outs[i:i + count]), dict(
                where, count=count, period_ms=period, span_ms=b[2] - a[2],
                hand_outs=[[d[1]["job_id"], d[1]["attempt"], d[2]] for d in hand_outs[i:i + count + 1]]))


def judge_key_rate_held(ev: Evidence, inv: Inv):
    """`key_rate_held` (docs/chaos.md "Invariants"): never more hand-outs of a key in a period than its rate."""
    if not ev.key_queues:
        inv.skipped = "no keyed queues configured"
        return
    for q, lst in ev.keyed.items():
        densest = {"hand_outs": 0, "key": None, "count": None, "period_ms": None}
        for key, kl in _by_key(lst).items():
            rate = _key_limits(ev.key_queues[q] or {}, key)[1] if key is not None else None
            if rate is None:
                continue
            _judge_rate(ev, inv, kl, rate, {"queue": q, "key": key})
            n = _densest([d[2] for d in kl], rate[1])
            if n > densest["hand_outs"]:
                densest = {"hand_outs": n, "key": key, "count": rate[0], "period_ms": rate[1]}
        ev.key_report.setdefault(q, {})["densest_key_window"] = densest if densest["key"] is not None else None


def judge_queue_rate_held(ev: Evidence, inv: Inv):
    """`queue_rate_held` (docs/chaos.md "Invariants"): never more hand-outs of a queue in a period than its rate."""
    if not ev.key_queues:
        inv.skipped = "no keyed queues configured"
        return
    for q, lst in ev.keyed.items():
        qrate = _rate_of((ev.key_queues[q] or {}).get("rate"))
        queue_densest = None
        if qrate is not None:
            _judge_rate(ev, inv, lst, qrate, {"queue": q})
            queue_densest = {"hand_outs": _densest([d[2] for d in lst], qrate[1]), "count": qrate[0],
                             "period_ms": qrate[1]}
        ev.key_report.setdefault(q, {})["densest_queue_window"] = queue_densest


def _key_stats(ev: Evidence) -> dict | None:
    """What each keyed queue did, for the report (with what its judges measured)."""
    if not ev.key_queues:
        return None
    ix, stats = ev.ix, {}
    for q, lst in ev.keyed.items():
        jobs = {d[1]["job_id"] for d in lst}
        measured = ev.key_report.get(q, {})
        stats[q] = {"keys": sum(1 for k in _by_key(lst) if k is not None),
                    "enqueued_ok_jobs": len({res["job_id"] for _, item, res in ix.ok_items if item.get("queue") == q}),
                    "hand_outs": len(lst), "jobs_handed_out": len(jobs),
                    "acked_ok_jobs": sum(1 for jid in jobs if any(_ok(a) for a in ix.acks.get(jid, ()))),
                    "releases_ok": sum(1 for jid in jobs for r in ix.releases.get(jid, ()) if _ok(r)),
                    "dead_lettered": sum(1 for jid in jobs if jid in ix.dlq),
                    "peak_in_flight": measured.get("peak_in_flight"),
                    "densest_key_window": measured.get("densest_key_window"),
                    "densest_queue_window": measured.get("densest_queue_window")}
    return stats


# ---------------------------------------------------------------------------- schedules
def _maybe_erased_tick_jobs(ix: Index, pc: PowerCuts) -> set:
    """The ids of tick jobs whose firing a memory-mode power cut may have erased: first seen
    in a cut's window, and nothing shows them after that cut's restart (fsync cuts: none)."""
    out: set = set()
    if not pc:
        return out
    for jid in ix.job_ticks:
        if jid in ix.dlq or not ix.deliveries.get(jid):
            continue
        seen = [op for op, _ in ix.deliveries[jid]] + \
            [x for table in (ix.acks, ix.nacks, ix.extends, ix.releases) for x in table.get(jid, ()) if _ok(x)]
        first = min((op for op, _ in ix.deliveries[jid] if op.get("w1") is not None and op.get("t1") is not None),
                     key=lambda op: op["w1"], default=None)
        if first is None:
            continue
        if any(all(op["t1"] <= c["sep"] for op in seen) for c in pc.at_risk(first["w1"], first["t1"])):
            out.add(jid)
    return out


def _judge_ticks(spec: dict, ticks: dict, max_catchup_ticks: int) -> list:
    """What is wrong with one schedule's observed ticks ({tick: enqueued_at of its job}, on the
    replicated clock), by its definition `spec` (a schedule_put op): [(example, ticks involved)].

    The rules (node/core/schedules.py `due_ticks`): a sweep at `now` fires every tick in
    [now - misfire_after_ms, now] on time; of the missed ones (older) none under `skip`, the
    latest under `one`, and under `all` those at most catchup_window_ms old, oldest first, at
    most max_catchup_ticks. A job's enqueued_at is its sweep's `now`, so a job is *late* when
    enqueued_at - tick > misfire_after_ms. Hence, on every schedule: each tick on the interval's
    grid (first tick + k * every_ms), none enqueued before its tick; and
    * `all`: no gap from the first tick to the last one seen, but where the policy itself drops
      ticks: older than catchup_window_ms when their sweep came (the tick after the gap enqueued
      more than that after the gap's first tick), or past max_catchup_ticks (the gap follows that
      many late ticks of one sweep);
    * `one`: a gap only before a late tick (the latest missed one of a sweep, which `one` fires);
      at most one late tick per sweep; and when every_ms <= misfire_after_ms + 1, the tick after a
      late one is there and on time (it is within the same sweep's on-time range);
    * `skip`: no late tick."""
    every, first = spec.get("every_ms"), spec.get("next_fire_at_ms")
    policy = spec.get("catchup") or "one"
    misfire = spec.get("misfire_after_ms") if spec.get("misfire_after_ms") is not None else 5000
    window = spec.get("catchup_window_ms") if spec.get("catchup_window_ms") is not None else 3_600_000

    def late(t) -> bool:
        e = ticks.get(t)
        return e is not None and e - t > misfire

    out = _judge_each_tick(ticks, first, every, policy, misfire, late)
    if not every or not ticks:
        return out
    out += _judge_tick_gaps(ticks, first, every, policy, window, max_catchup_ticks, late)
    if policy == "one":
        out += _judge_catchup_one_sweeps(ticks, every, misfire, late)
    return out


def _judge_each_tick(ticks: dict, first, every, policy: str, misfire: int, late) -> list:
    """Each tick on the grid, not enqueued before its time, and (under `skip`) not late."""
    out: list = []
    for t in sorted(ticks):
        e = ticks[t]
        if first is not None and every and (t < first or (t - first) % every):
            out.append(({"tick": t, "first_tick": first, "every_ms": every, "why": "a tick off the schedule's grid"},
                        {t}))
        if e is not None and e < t:
            out.append(({"tick": t, "enqueued_at": e, "early_ms": t - e, "why": "enqueued before its tick"}, {t}))
        if policy == "skip" and late(t):
            out.append(({"tick": t, "enqueued_at": e, "late_ms": e - t, "misfire_after_ms": misfire,
                         "why": "fired late under catchup skip"}, {t}))
    return out


def _judge_tick_gaps(ticks: dict, first, every: int, policy: str, window: int, max_catchup_ticks: int,
                     late) -> list:
    """The gaps between the ticks seen, from the schedule's first tick on (a virtual tick before
    it, never late): under `all` none but what the policy drops, under `one` only before a late tick."""
    out: list = []
    order = sorted(ticks)
    start = [first - every] if first is not None and first < order[0] and policy != "skip" else []
    seq = start + order
    for a, b in zip(seq, seq[1:]):
        if b - a <= every:
            continue
        gap = {"after": a, "next_seen": b, "missing": (b - a) // every - 1, "first_missing": a + every}
        if policy == "all":
            eb = ticks[b]
            by_window = eb is not None and eb - (a + every) > window
            run = 0
            if a in ticks and late(a):
                for t in reversed(order[:order.index(a) + 1]):
                    if not late(t) or ticks[t] != ticks[a]:
                        break
                    run += 1
            if not by_window and run < max_catchup_ticks:
                out.append((dict(gap, why="ticks missing under catchup all"), {a, b}))
        elif policy == "one" and not late(b):
            out.append((dict(gap, enqueued_at=ticks[b], why="a gap not closed by the latest missed tick, fired late "
                                                            "(catchup one)"), {a, b}))
    return out


def _judge_catchup_one_sweeps(ticks: dict, every: int, misfire: int, late) -> list:
    """Under `one`: at most one late tick per sweep, and the tick after a late one there and on time
    (when every_ms <= misfire_after_ms + 1 it is in the same sweep's on-time range)."""
    out: list = []
    order = sorted(ticks)
    by_sweep: dict = defaultdict(list)
    for t in order:
        if late(t):
            by_sweep[ticks[t]].append(t)
    for e, ts in by_sweep.items():
        if len(ts) > 1:
            out.append(({"ticks": ts, "enqueued_at": e, "why": "more than one missed tick fired by one sweep "
                                                               "(catchup one)"}, set(ts)))
    if every <= misfire + 1:
        for t in order:
            if late(t) and (t + every not in ticks or late(t + every)):
                out.append(({"tick": t, "enqueued_at": ticks[t], "next": t + every,
                             "next_enqueued_at": ticks.get(t + every),
                             "why": "the tick after a late one is missing or late too (catchup one)"},
                            {t, t + every}))
    return out


def _schedules_in_run(ix: Index) -> bool:
    return bool(ix.schedule_puts or ix.tick_jobs)


def _schedule_views(ix: Index) -> dict | None:
    """name -> the schedule's view read after the final drain; None when none was read."""
    return None if ix.schedule_views is None else {v.get("name"): v for v in ix.schedule_views}


def _schedule_ticks(ev: Evidence, name: str) -> tuple:
    """What the history saw of schedule `name`: ({tick: enqueued_at of its job}, the ticks whose
    every job a power cut may have erased, its job ids, the ids of its jobs without a tick)."""
    ticks: dict = {}
    erased_ticks: set = set()
    jobs: set = set()
    tickless: set = set()
    for (n, tick), jids in ev.ix.tick_jobs.items():
        if n != name:
            continue
        jobs |= jids
        if tick is None:
            tickless |= jids
            continue
        sighted = [ev.ix.job_enqueued[j] for j in jids if j in ev.ix.job_enqueued]
        ticks[tick] = max(sighted)[1] if sighted else None
        if all(j in ev.tick_erased for j in jids):
            erased_ticks.add(tick)
    return ticks, erased_ticks, jobs, tickless


def judge_one_job_per_tick(ev: Evidence, inv: Inv):
    """`one_job_per_tick` (docs/chaos.md "Invariants"): never two job ids for one tick, nor one job for two."""
    ix = ev.ix
    if not _schedules_in_run(ix):
        inv.skipped = "no schedules in this run"
        return
    for (name, tick), jids in sorted(ix.tick_jobs.items(), key=str):
        if len(jids) > 1:
            inv.bad({"schedule": name, "tick": tick, "job_ids": sorted(jids)})
    for jid, ticks in sorted(ix.job_ticks.items()):
        if len(ticks) > 1:
            inv.bad({"job_id": jid, "ticks": sorted(ticks, key=str), "why": "one job for two ticks"})


def judge_no_tick_missed(ev: Evidence, inv: Inv):
    """`no_tick_missed` (docs/chaos.md "Invariants"): no tick missed beyond the catch-up policy; each fired one seen."""
    ix = ev.ix
    if not _schedules_in_run(ix):
        inv.skipped = "no schedules in this run"
        return
    # What a memory-mode power cut may have erased (a tick fired, seen, then rolled back and fired
    # again later or never) counts apart as expected.
    views = _schedule_views(ix)
    for name, puts in sorted(ix.schedule_puts.items()):
        oks = [op for op in puts if _ok(op)]
        spec = oks[0] if oks else puts[0]
        ticks, erased_ticks, _, tickless = _schedule_ticks(ev, name)
        if tickless:
            inv.bad({"schedule": name, "job_ids": sorted(tickless), "why": "a schedule's job without its tick"})
        for ex, involved in _judge_ticks(spec, ticks, ev.max_catchup_ticks):
            inv.bad_unless(bool(involved & erased_ticks), dict(ex, schedule=name, catchup=spec.get("catchup")))
        view = views.get(name) if views is not None else None
        fired = view.get("fired") if view else None
        if views is not None and oks and view is None:
            inv.bad_unless(any(ev.pc.windows(op) for op in oks), {"schedule": name, "why": "the schedule is gone"})
        elif view is not None and view.get("paused") and fired is not None and (ev.drain is None or ev.drain.get("ok")):
            # Paused before the final drain, which took every job: each tick fired was seen.
            if fired > len(ticks):
                inv.bad({"schedule": name, "fired": fired, "seen": len(ticks),
                         "why": "ticks fired whose job was never seen"})
            elif fired < len(ticks):
                inv.bad_unless(fired >= len(ticks) - len(erased_ticks),
                               {"schedule": name, "fired": fired, "seen": len(ticks),
                                "why": "more ticks seen than the schedule fired"})


def _schedule_stats(ev: Evidence) -> dict | None:
    """What each schedule did, for the report."""
    ix = ev.ix
    if not _schedules_in_run(ix):
        return None
    views = _schedule_views(ix)
    stats: dict = {}
    for name, puts in sorted(ix.schedule_puts.items()):
        oks = [op for op in puts if _ok(op)]
        spec = oks[0] if oks else puts[0]
        ticks, _, jobs, _ = _schedule_ticks(ev, name)
        view = views.get(name) if views is not None else None
        every = spec.get("every_ms")
        order = sorted(ticks)
        misfire = spec.get("misfire_after_ms") if spec.get("misfire_after_ms") is not None else 5000
        stats[name] = {"catchup": spec.get("catchup"), "misfire_after_ms": spec.get("misfire_after_ms"),
                       "ticks": len(ticks), "jobs": len(jobs), "fired": view.get("fired") if view else None,
                       "late": sum(1 for t in order if ticks[t] is not None and ticks[t] - t > misfire),
                       "missing": ((order[-1] - order[0]) // every + 1 - len(order)) if order and every else 0,
                       "first_tick": order[0] if order else None, "last_tick": order[-1] if order else None}
    return stats


# ---------------------------------------------------------------------------- workflows
WORKFLOWS_SKIPPED = "no workflows in the run"
SUCCESS = "success"


def _dependency_graph(ix: Index, value_jobs: dict) -> dict:
    """The run's dependencies: {"edges": {dependent id: {dependency id: policy}}, "mismatch":
    [a job the cluster showed with other dependencies than its enqueue asked for], "in_run"}.
    An enqueue item of a graph (`graph`) names its dependencies by value (`deps` [[value,
    policy], ...]), mapped to job ids through value_jobs (fresh ok answers and deliveries: an
    unknown enqueue's jobs count once seen); each delivery and dead letter adds the `depends_on`
    the cluster showed (by id)."""
    edges: dict = defaultdict(dict)
    declared: dict = {}
    in_run = False
    for value, item in ix.attempted.items():
        if item.get("graph") is None and not item.get("deps"):
            continue
        in_run = True
        deps = item.get("deps") or ()
        resolved = all(len(value_jobs.get(dv, ())) == 1 for dv, _ in deps)
        for jid in value_jobs.get(value, ()):
            want = {did: policy for dv, policy in deps for did in value_jobs.get(dv, ())}
            if want:
                edges[jid].update(want)
            if resolved:
                declared[jid] = want
    mismatch, told = [], set()
    sightings = [j for lst in ix.deliveries.values() for _, j in lst] + [r for recs in ix.dlq.values() for r in recs]
    for j in sightings:
        if not j.get("depends_on"):
            continue                    # (a job without dependencies shows none)
        in_run = True
        jid = j["job_id"]
        got = {d["job_id"]: d["policy"] for d in j["depends_on"]}
        edges[jid].update(got)
        if jid in declared and got != declared[jid] and jid not in told:
            told.add(jid)
            mismatch.append({"job_id": jid, "shown": got, "enqueued": declared[jid],
                             "why": "shown with other dependencies than its enqueue asked for"})
    return {"edges": dict(edges), "mismatch": mismatch, "in_run": in_run}


def _could_end(op: dict) -> bool:
    """Whether an ack or nack may have ended its job: any ack; a nack answered dead_lettered, or
    one without a definite answer that would dead-letter (a retried call may have applied)."""
    if op["f"] == "ack":
        return True
    if _ok(op):
        return bool(op.get("dead_lettered"))
    mx = op.get("max_attempts")
    return op.get("strategy") == "dead_letter" or mx is None or op["attempt"] - (op.get("releases") or 0) >= mx


def _ended_after(ev: Evidence, dep_id: str, t1: float, stamp) -> dict | None:
    """Whether a hand-out answered at t1 (history time), stamped `stamp` (the replicated clock),
    certainly came before job dep_id ended: the hand-out's stamp is below the dependency's
    dead letter's failed_at (one clock, which never goes back: a hand-out applied after the
    dead-lettering is stamped no earlier), or the hand-out was answered before any op that may
    have ended it was invoked (for a dead letter of a nack, the nacks that may have
    dead-lettered it; else every ack and such nack, whatever their outcome). A dead letter of
    the sweep (lease_expired) or of its own dependency has no op: only its stamp says. A
    dependency neither acked ok nor dead-lettered when the final drain did not finish may have
    been dead-lettered unseen: not judged. An example, or None."""
    ix = ev.ix
    recs = ix.dlq.get(dep_id)
    nacks = [n for n in ix.nacks.get(dep_id, ()) if _could_end(n)]
    if recs:
        rec = recs[0]
        if stamp is not None and rec.get("failed_at") is not None and stamp < rec["failed_at"]:
            return {"handed_out_at": stamp, "dependency_dead_lettered_at": rec["failed_at"], "clock": "replicated"}
        if rec["cause"] not in ("rejected", "attempts_exhausted"):
            return None
        ops = nacks
    elif any(_ok(a) for a in ix.acks.get(dep_id, ())) or (ev.drain or {}).get("ok"):
        ops = list(ix.acks.get(dep_id, ())) + nacks
    else:
        return None
    first = min((op["t0"] for op in ops), default=None)
    if first is not None and t1 >= first:
        return None
    return {"delivery_answered_at": round(t1, 3), "first_end_invoked_at": None if first is None else round(first, 3),
            "clock": "history"}


def _early(ev: Evidence, jid: str, deps: dict) -> tuple[list, dict | None]:
    """(the dependencies whose end job jid's first hand-out certainly preceded, as examples;
    that first hand-out's op, or None when it was never seen handed out)."""
    ds = ev.ix.deliveries.get(jid)
    if not ds:
        return [], None
    first = min((op for op, _ in ds), key=lambda op: op["t1"])
    stamp = min((s for s in (reserve_now(op, j) for op, j in ds) if s is not None), default=None)
    out = []
    for dep_id in sorted(deps):
        e = _ended_after(ev, dep_id, first["t1"], stamp)
        if e is not None:
            out.append({"dependency": dep_id, "policy": deps[dep_id], **e})
    return out, first


def _cut_explains(ev: Evidence, jid: str, deps) -> bool:
    """A memory-mode power cut may have erased what a hand-out of jid came from: one of its
    hand-outs was answered in a cut's window, or a dependency may have been erased."""
    return any(ev.pc.windows(op) for op, _ in ev.ix.deliveries.get(jid, ())) or \
        any(d in ev.power_lost for d in deps)


def judge_dependents_wait(ev: Evidence, inv: Inv):
    """`dependents_wait` (docs/chaos.md "Invariants"): no dependent handed out before each dependency ended."""
    g = ev.deps
    if not g["in_run"]:
        inv.skipped = WORKFLOWS_SKIPPED
        return
    for jid, deps in sorted(g["edges"].items()):
        early, first = _early(ev, jid, deps)
        for e in early:
            inv.bad_unless(_cut_explains(ev, jid, [e["dependency"]]), {"job_id": jid, "delivery": first["id"], **e})
    for m in g["mismatch"]:
        inv.bad(m)


def _dead_lettering_nacks(ix: Index, jid: str) -> list:
    return [n for n in ix.nacks.get(jid, ()) if _ok(n) and n.get("dead_lettered")]


def judge_dependency_failed_never_runs(ev: Evidence, inv: Inv):
    """`dependency_failed_never_runs` (docs/chaos.md "Invariants"): a success dependent of a
    dead-lettered job is never handed out and ends dependency_failed; that cause only then."""
    g = ev.deps
    if not g["in_run"]:
        inv.skipped = WORKFLOWS_SKIPPED
        return
    ix = ev.ix
    for jid, deps in sorted(g["edges"].items()):
        failed = [d for d, p in sorted(deps.items()) if p == SUCCESS and (d in ix.dlq or _dead_lettering_nacks(ix, d))]
        if failed:
            _judge_failed_dependent(ev, inv, jid, failed)
    if (ev.drain or {}).get("ok"):
        for jid, recs in sorted(ix.dlq.items()):
            if recs[0]["cause"] == "dependency_failed":
                _judge_dependency_failed_cause(ev, inv, jid, recs[0])


def _judge_failed_dependent(ev: Evidence, inv: Inv, jid: str, failed: list):
    """Job jid, whose `success` dependencies `failed` were dead-lettered (a dead letter at the
    end, or an ok nack answered dead_lettered): no hand-out of it at all when one ends
    dead-lettered (it waited until then, and then failed), none invoked after a nack answered
    dead_lettered; with the final drain done, it ends dead-lettered, cause dependency_failed."""
    ix = ev.ix
    for op, j in ix.deliveries.get(jid, ()):
        for dep in failed:
            if dep in ix.dlq:
                rec = ix.dlq[dep][0]
                inv.bad_unless(bool(ev.pc.windows(op)) or dep in ev.power_lost,
                               {"job_id": jid, "delivery": op["id"], "attempt": j["attempt"], "dependency": dep,
                                "dependency_dead_letter": {"cause": rec["cause"], "failed_at": rec.get("failed_at")},
                                "why": "handed out, though a success dependency ended dead-lettered"})
                break
            seen = [n for n in _dead_lettering_nacks(ix, dep) if n["t1"] < op["t0"]]
            if seen:
                inv.bad_unless(ev.pc.lost_before(seen[0], op["t1"]),
                               {"job_id": jid, "delivery": op["id"], "attempt": j["attempt"], "dependency": dep,
                                "dead_lettering_nack": seen[0]["id"],
                                "why": "handed out after a success dependency was dead-lettered"})
                break
    ended = [d for d in failed if d in ix.dlq]
    if ended and (ev.drain or {}).get("ok"):
        mine = ix.dlq.get(jid)
        if not mine or mine[0]["cause"] != "dependency_failed":
            acked = any(_ok(a) for a in ix.acks.get(jid, ()))
            inv.bad_unless(jid in ev.power_lost or any(d in ev.power_lost for d in ended),
                           {"job_id": jid, "dependency": ended[0],
                            "ended": mine[0]["cause"] if mine else "acked" if acked else "no dead letter",
                            "why": "a success dependency ended dead-lettered, but it did not end dependency_failed"})


def _judge_dependency_failed_cause(ev: Evidence, inv: Inv, jid: str, rec: dict):
    """A dead letter of cause dependency_failed has a `success` dependency dead-lettered no
    later (its own command, or before it was enqueued)."""
    deps = ev.deps["edges"].get(jid, {})
    fa = rec.get("failed_at")
    why = [d for d, p in deps.items() if p == SUCCESS and d in ev.ix.dlq
           and (fa is None or ev.ix.dlq[d][0].get("failed_at") is None or ev.ix.dlq[d][0]["failed_at"] <= fa)]
    if not why:
        inv.bad({"job_id": jid, "failed_at": fa, "dependencies": deps,
                 "why": "dead-lettered dependency_failed, but no success dependency was dead-lettered before"})


def judge_fan_in_runs_once(ev: Evidence, inv: Inv):
    """`fan_in_runs_once` (docs/chaos.md "Invariants"): a fan-in (a job with two or more
    dependencies) is handed out only after its last member ended, its first attempt once, and
    (the final drain done) it ran when none of its success members was dead-lettered."""
    g = ev.deps
    if not g["in_run"]:
        inv.skipped = WORKFLOWS_SKIPPED
        return
    ix, drained = ev.ix, bool((ev.drain or {}).get("ok"))
    for jid, deps in sorted(g["edges"].items()):
        if len(deps) < 2:
            continue
        early, first = _early(ev, jid, deps)
        if early:
            inv.bad_unless(_cut_explains(ev, jid, [e["dependency"] for e in early]),
                           {"job_id": jid, "delivery": first["id"], "members_not_ended": early,
                            "why": "handed out before its last member ended"})
        ones = sorted((op for op, j in ix.deliveries.get(jid, ()) if j["attempt"] == 1), key=lambda op: op["t1"])
        if len(ones) > 1:
            inv.bad_unless(all(ev.pc.lost_before(x, y["t1"]) for x, y in zip(ones, ones[1:])),
                           {"job_id": jid, "deliveries": [op["id"] for op in ones],
                            "why": "its first attempt handed out more than once"})
        if drained and not any(p == SUCCESS and d in ix.dlq for d, p in deps.items()):
            _judge_fan_in_ran(ev, inv, jid, deps)


def _judge_fan_in_ran(ev: Evidence, inv: Inv, jid: str, deps: dict):
    """A fan-in none of whose success members was dead-lettered, every member ended (the final
    drain finished): handed out, or dead-lettered by its own attempts (a hand-out the history
    did not see), never dependency_failed."""
    ix = ev.ix
    rec = (ix.dlq.get(jid) or [None])[0]
    if rec is not None and rec["cause"] == "dependency_failed":
        inv.bad({"job_id": jid, "members": deps, "failed_at": rec.get("failed_at"),
                 "why": "dead-lettered dependency_failed, though none of its success members was dead-lettered"})
    elif rec is None and not ix.deliveries.get(jid):
        inv.bad_unless(jid in ev.power_lost or any(d in ev.power_lost for d in deps),
                       {"job_id": jid, "members": deps,
                        "why": "never handed out, though every member ended and no success member failed"})


def _workflow_stats(ev: Evidence) -> dict | None:
    """What the workflow graphs did, for the report."""
    g = ev.deps
    if not g["in_run"]:
        return None
    ix, edges = ev.ix, g["edges"]
    graphs = {item["graph"]: item.get("shape") for _, item, _ in ix.ok_items if item.get("graph") is not None}
    shapes: dict = defaultdict(int)
    for shape in graphs.values():
        shapes[shape] += 1
    fan_ins = [jid for jid, d in edges.items() if len(d) >= 2]
    cause = {jid: recs[0]["cause"] for jid, recs in ix.dlq.items()}
    failed = [jid for jid, c in cause.items() if c == "dependency_failed"]
    return {"graphs_ok": len(graphs), "by_shape": dict(sorted(shapes.items())),
            "jobs_ok": sum(1 for _, item, _ in ix.ok_items if item.get("graph") is not None),
            "dependents": len(edges), "dependents_handed_out": sum(1 for jid in edges if ix.deliveries.get(jid)),
            "ran_past_a_dead_dependency": sum(1 for jid, d in edges.items()
                                              if ix.deliveries.get(jid) and any(x in ix.dlq for x in d)),
            "dependency_failed": len(failed),
            "dependency_failed_transitive": sum(1 for jid in failed
                                                if any(cause.get(d) == "dependency_failed"
                                                       for d, p in edges.get(jid, {}).items() if p == SUCCESS)),
            "fan_ins": len(fan_ins), "fan_ins_handed_out": sum(1 for jid in fan_ins if ix.deliveries.get(jid)),
            "fan_ins_failed": sum(1 for jid in fan_ins if cause.get(jid) == "dependency_failed")}


# ---------------------------------------------------------------------------- the table
# The judge of each invariant, in INVARIANTS' order: check runs them all, each into its own Inv.


# ---------------------------------------------------------------------------- batches
BATCHES_SKIPPED = "no batches in the run"
CALLBACK_KINDS = ("on_complete", "on_success", "on_failure")
COMPLETION_KINDS = ("on_complete", "on_success")


def _batches(ix: Index) -> dict:
    """The run's batches (docs/chaos.md "Batches"), by id: {"members": [job ids answered ok],
    "ops": [its enqueue ops: open, then adds], "close": [its batch_close ops], "open": bool,
    "callbacks": {kind: {job id: [(reserve op, job)]}}}. Only an ok open names its batch;
    callbacks of a batch id never answered are kept under that id (their members unknown)."""
    out: dict = {}

    def get(bid):
        return out.setdefault(bid, {"members": [], "ops": [], "close": [], "open": False, "known": False,
                                    "callbacks": {k: {} for k in CALLBACK_KINDS}})
    for op in ix.ops:
        bid = op.get("batch_id")
        if bid is None:
            continue
        if op.get("f") == "enqueue" and op.get("batch_op") in ("open", "add"):
            b = get(bid)
            b["ops"].append(op)
            b["known"] = b["known"] or op["batch_op"] == "open"
            b["open"] = b["open"] or bool(op.get("open"))
            if _ok(op):
                b["members"] += [r["job_id"] for r in op.get("results") or () if "job_id" in r]
        elif op.get("f") == "batch_close":
            get(bid)["close"].append(op)
    for jid, ds in ix.deliveries.items():
        for op, j in ds:
            if j.get("batch_id") is not None and j.get("job_type") in CALLBACK_KINDS:
                get(j["batch_id"])["callbacks"][j["job_type"]].setdefault(jid, []).append((op, j))
    return out


def _batch_cut(ev: Evidence, b: dict) -> bool:
    """A memory-mode power cut may have erased part of the batch (a member, a callback's firing)."""
    ops = b["ops"] + b["close"] + [op for cb in b["callbacks"].values() for ds in cb.values() for op, _ in ds]
    return any(ev.pc.windows(op) for op in ops) or any(m in ev.power_lost for m in b["members"])


def judge_batch_callbacks_once(ev: Evidence, inv: Inv):
    """`batch_callbacks_once` (docs/chaos.md "Invariants"): one job per (batch, callback kind),
    and after a finished drain the callbacks the batch's end calls for (and no others)."""
    bs = _batches(ev.ix)
    if not bs:
        inv.skipped = BATCHES_SKIPPED
        return
    drained = bool((ev.drain or {}).get("ok"))
    for bid, b in sorted(bs.items()):
        cut = _batch_cut(ev, b)
        for kind, jobs in b["callbacks"].items():
            if len(jobs) > 1:
                inv.bad_unless(cut, {"batch_id": bid, "kind": kind, "job_ids": sorted(jobs),
                                     "why": "two callback jobs of one kind"})
        if not drained or not b["known"] or cut or not all(_ok(op) for op in b["ops"]):
            continue
        if b["open"] and not any(_ok(op) for op in b["close"]):
            continue
        failed = sorted(m for m in b["members"] if m in ev.ix.dlq)
        want = {"on_complete": True, "on_success": not failed, "on_failure": bool(failed)}
        for kind, w in want.items():
            got = bool(b["callbacks"][kind])
            if got != w:
                inv.bad({"batch_id": bid, "kind": kind, "delivered": got, "members": len(b["members"]),
                         "dead_lettered_members": failed[:5],
                         "why": "missing after the drain" if w else "delivered, yet the batch's end calls not for it"})


def _first_hand_out(ds: list) -> tuple[dict, object]:
    """(the first answered hand-out op of a job, the lowest stamp among its hand-outs)."""
    first = min((op for op, _ in ds), key=lambda op: op["t1"])
    return first, min((s for s in (reserve_now(op, j) for op, j in ds) if s is not None), default=None)


def _callback_early(ev: Evidence, b: dict, kind: str, ds: list) -> dict | None:
    """Why a callback's first hand-out certainly came too early, or None."""
    first, stamp = _first_hand_out(ds)
    if kind == "on_failure":
        dead = [m for m in b["members"] if m in ev.ix.dlq]
        early = [_ended_after(ev, m, first["t1"], stamp) for m in dead]
        if dead and all(e is not None for e in early):
            return {"before_dead_letters": dict(zip(dead[:5], early[:5]))}
        return None
    for m in b["members"]:
        e = _ended_after(ev, m, first["t1"], stamp)
        if e is not None:
            return {"before_member": m, **e}
    if b["open"]:
        closes = [op["t0"] for op in b["close"]]
        if not closes or first["t1"] < min(closes):
            return {"delivery_answered_at": round(first["t1"], 3),
                    "close_invoked_at": round(min(closes), 3) if closes else None, "why": "before its close"}
    return None


def judge_callback_after_members(ev: Evidence, inv: Inv):
    """`callback_after_members` (docs/chaos.md "Invariants"): a completion callback is not handed
    out certainly before its batch's last member ended (cluster_side: the dead letter's failed_at
    against the hand-out's stamp; else the history's times, against the first op that may have
    ended the member: `_ended_after`) nor before its close was invoked; an on_failure one not
    before every dead-lettered member's end."""
    bs = _batches(ev.ix)
    if not bs:
        inv.skipped = BATCHES_SKIPPED
        return
    for bid, b in sorted(bs.items()):
        if not b["known"] or not all(op["outcome"] in ("ok", "fail") for op in b["ops"]):
            continue            # (an unknown add may hold members the history never learnt)
        for kind, jobs in b["callbacks"].items():
            for jid, ds in sorted(jobs.items()):
                e = _callback_early(ev, b, kind, ds)
                if e is not None:
                    inv.bad_unless(_batch_cut(ev, b), {"batch_id": bid, "kind": kind, "job_id": jid, **e})


def _batch_stats(ev: Evidence) -> dict | None:
    bs = _batches(ev.ix)
    if not bs:
        return None
    cbs = {k: sum(1 for b in bs.values() if b["callbacks"][k]) for k in CALLBACK_KINDS}
    return {"batches": sum(1 for b in bs.values() if b["known"]), "opened_open": sum(1 for b in bs.values() if b["open"]),
            "members": sum(len(b["members"]) for b in bs.values()), **cbs}



JUDGES = {
    "lost": judge_lost,
    "unexpected": judge_unexpected,
    "duplicate_jobs": judge_duplicate_jobs,
    "idempotency": judge_idempotency,
    "redelivery_attempts": judge_redelivery_attempts,
    "stale_attempt": judge_stale_attempt,
    "no_delivery_after_ack": judge_no_delivery_after_ack,
    "attempts_bound": judge_attempts_bound,
    "release_uses_no_attempt": judge_release_uses_no_attempt,
    "throttle_limit": judge_throttle_limit,
    "circuit_open": judge_circuit_open,
    "window_closed": judge_window_closed,
    "key_concurrency_held": judge_key_concurrency_held,
    "key_rate_held": judge_key_rate_held,
    "queue_rate_held": judge_queue_rate_held,
    "schedule": judge_schedule,
    "one_job_per_tick": judge_one_job_per_tick,
    "no_tick_missed": judge_no_tick_missed,
    "dependents_wait": judge_dependents_wait,
    "dependency_failed_never_runs": judge_dependency_failed_never_runs,
    "fan_in_runs_once": judge_fan_in_runs_once,
    "batch_callbacks_once": judge_batch_callbacks_once,
    "callback_after_members": judge_callback_after_members,
    "retry_delay": judge_retry_delay,
    "lease_honoured": judge_lease_honoured,
    "dead_letters": judge_dead_letters,
    "drained": judge_drained,
    "replicas_agree": judge_replicas_agree,
    "one_leader_per_term": judge_one_leader_per_term,
    "liveness": judge_liveness,
    "no_internal_errors": judge_no_internal_errors,
    "no_critical_node_logs": judge_no_critical_node_logs,
    "checksum_failures_contained": judge_checksum_failures_contained,
    "failed_writes_stop": judge_failed_writes_stop,
}
if list(JUDGES) != [name for name, _ in INVARIANTS]:
    raise RuntimeError("checker: JUDGES must name every invariant of INVARIANTS, in its order")


# ---------------------------------------------------------------------------- availability
def unavailability(ops: list[dict], faults: list[dict]) -> list[dict]:
    """For each fault: seconds from its injection to the completion of the first successful
    write (enqueue) invoked at or after the injection; None if none before the run ended."""
    writes = sorted((op["t0"], op["t1"]) for op in ops if op.get("f") == "enqueue" and _ok(op))
    out = []
    starts = [w[0] for w in writes]
    for f in faults:
        t = f.get("t_inject")
        if t is None:
            continue
        i = bisect.bisect_left(starts, t)
        best = min((w[1] for w in writes[i:]), default=None)
        out.append({"kind": f["kind"], "t_inject": t, "mixed": bool(f.get("mixed")),
                    "unavailable_s": None if best is None else round(best - t, 3)})
    return out


def percentile(xs: list[float], p: float):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = max(0, min(len(xs) - 1, int(round(p / 100 * len(xs) + 0.5)) - 1))
    return xs[k]
