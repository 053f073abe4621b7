"""The chaos checker: pure functions over a recorded history, the final drained state and the
nodes' own views. No cluster needed, so every invariant is unit-tested on hand-made histories.

An *op* (see chaos_workload.History) is a dict with `f` (enqueue, reserve, ack, nack, extend,
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
"failures"}: `INVARIANTS` lists the invariants; `failures` (failed_ops) sorts the ops that did not
end ok into the expected (a fenced ack after a lapsed lease, an unknown outcome during a fault)
and the rest, for the report; they never decide `valid`.
"""
from __future__ import annotations

import bisect
from collections import defaultdict

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

    `durability = "memory"` promises nothing across the power loss of a majority (CLUSTER.md):
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
        if j.get("schedule") is not None:
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
    ix = Index(ops, dead_letters)
    pc = PowerCuts(power_losses)
    key_queues = keys                       # (`keys` is reused below for idempotency keys)
    invs = {name: Inv(name, about) for name, about in INVARIANTS}

    # ------------------------------------------------------------------ identity
    value_jobs: dict[str, set] = defaultdict(set)
    for op, item, res in ix.ok_items:
        if not res.get("dedup"):
            value_jobs[item["value"]].add(res["job_id"])
    for jid, values in ix.job_value.items():
        for v in values:
            if v is not None:
                value_jobs[v].add(jid)

    # Jobs a memory-mode power cut may have erased: every enqueue that could have created one was
    # answered in a cut's window, and nothing shows the job after that cut's restart.
    power_lost: set = set()
    if pc:
        job_values: dict[str, set] = defaultdict(set)
        for v, jobs in value_jobs.items():
            for jid in jobs:
                job_values[jid].add(v)
        value_ops: dict[str, list] = defaultdict(list)
        job_ops: dict[str, list] = defaultdict(list)
        for op in ops:
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

    for v, jobs in value_jobs.items():
        if len(jobs) > 1:
            invs["duplicate_jobs"].bad_unless(len(jobs - power_lost) <= 1, {"value": v, "job_ids": sorted(jobs)})
    for jid, values in ix.job_value.items():
        if len(values) > 1:
            invs["duplicate_jobs"].bad({"job_id": jid, "payload_values": sorted(map(str, values))})
    for op, item, res in ix.ok_items:
        if not res.get("dedup"):
            seen = ix.job_value.get(res["job_id"])
            if seen and item["value"] not in seen:
                invs["duplicate_jobs"].bad({"job_id": res["job_id"], "enqueued_value": item["value"],
                                            "delivered_values": sorted(map(str, seen))})

    # unexpected: delivered values never attempted; ticks of a schedule never created
    for jid, values in ix.job_value.items():
        for v in values:
            if v is None or v not in ix.attempted:
                invs["unexpected"].bad({"job_id": jid, "value": v})
    for jid, ticks in ix.job_ticks.items():
        for name, tick in ticks:
            if name not in ix.schedule_puts:
                invs["unexpected"].bad({"job_id": jid, "schedule": name, "tick": tick,
                                        "why": "a schedule this run never created"})

    # idempotency
    key_jobs: dict[str, set] = defaultdict(set)
    key_fresh: dict[str, list] = defaultdict(list)
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
            invs["idempotency"].bad_unless(len(jobs - power_lost) <= 1,
                                           {"queue": k[0], "key": k[1], "job_ids": sorted(jobs)})
    for k, fresh in key_fresh.items():
        if len(fresh) > 1:
            kept = [jid for _, jid in fresh if jid not in power_lost]
            invs["idempotency"].bad_unless(len(kept) <= 1, {"queue": k[0], "key": k[1],
                                                            "non_deduplicated_answers": [i for i, _ in fresh]})

    # ------------------------------------------------------------------ deliveries
    redeliveries = 0
    for jid, ds in ix.deliveries.items():
        redeliveries += len(ds) - 1
        by_attempt = defaultdict(list)
        for op, j in ds:
            by_attempt[j["attempt"]].append(op)
            mx = j.get("max_attempts")
            used = j["attempt"] - (j.get("releases") or 0)
            if not (1 <= used and (mx is None or used <= mx)):
                invs["attempts_bound"].bad({"job_id": jid, "attempt": j["attempt"], "releases": j.get("releases"),
                                            "max_attempts": mx, "op": op["id"]})
        for a, same in by_attempt.items():
            if len(same) > 1:
                # Excused when each earlier delivery of the attempt was lost to a cut before the next.
                same.sort(key=lambda op: op["t1"])
                excused = all(pc.lost_before(x, y["t1"]) for x, y in zip(same, same[1:]))
                invs["redelivery_attempts"].bad_unless(excused, {"job_id": jid, "attempt": a,
                                                                 "delivered_by_ops": [op["id"] for op in same]})
        for op1, j1 in ds:
            for op2, j2 in ds:
                if op1["t1"] < op2["t0"] and j1["attempt"] > j2["attempt"]:
                    invs["redelivery_attempts"].bad_unless(
                        pc.lost_before(op1, op2["t1"]),
                        {"job_id": jid, "first": {"op": op1["id"], "attempt": j1["attempt"]},
                         "later": {"op": op2["id"], "attempt": j2["attempt"]}})

    for table in (ix.acks, ix.nacks, ix.extends, ix.releases):
        for jid, lst in table.items():
            for op in lst:
                if not _ok(op):
                    continue
                newer = [(d, j) for d, j in ix.deliveries.get(jid, ()) if d["t1"] < op["t0"] and j["attempt"] > op["attempt"]]
                if newer:
                    hit = newer[0]
                    invs["stale_attempt"].bad_unless(
                        all(pc.lost_before(d, op["t1"]) for d, _ in newer),
                        {"job_id": jid, "op": op["id"], "f": op["f"], "attempt": op["attempt"],
                         "newer_delivery": {"op": hit[0]["id"], "attempt": hit[1]["attempt"]}})

    # ------------------------------------------------------------------ acks
    def either_lost(x, y) -> bool:
        """One of two ok ops that cannot both have happened was lost to a cut before the other."""
        return pc.lost_before(x, y["t1"]) or pc.lost_before(y, x["t1"])

    for jid, lst in ix.acks.items():
        oks = sorted((op for op in lst if _ok(op)), key=lambda op: op["t1"])
        if len(oks) > 1:
            invs["no_delivery_after_ack"].bad_unless(all(pc.lost_before(x, y["t1"]) for x, y in zip(oks, oks[1:])),
                                                     {"job_id": jid, "ok_acks": [op["id"] for op in oks]})
        for ack in oks:
            a = ack["attempt"]
            for op, j in ix.deliveries.get(jid, ()):
                if j["attempt"] > a or (j["attempt"] <= a and op["t0"] > ack["t1"]):
                    invs["no_delivery_after_ack"].bad_unless(
                        either_lost(ack, op), {"job_id": jid, "ack": ack["id"], "ack_attempt": a,
                                               "delivery": op["id"], "attempt": j["attempt"]})
            if jid in ix.dlq:
                rec = ix.dlq[jid][0]
                invs["no_delivery_after_ack"].bad_unless(pc.lost_before_wall(ack, rec.get("failed_at")),
                                                         {"job_id": jid, "ack": ack["id"], "dead_letter": rec})
            for n in list(ix.nacks.get(jid, ())) + list(ix.releases.get(jid, ())):
                if _ok(n) and n["attempt"] >= a:
                    invs["no_delivery_after_ack"].bad_unless(either_lost(ack, n),
                                                             {"job_id": jid, "ack": ack["id"], "ok_nack": n["id"]})

    # ------------------------------------------------------------------ lost
    recovered = 0
    for v in ix.unknown_values:
        if value_jobs.get(v):
            recovered += 1
    ok_jobs: dict[str, tuple] = {}
    for op, item, res in ix.ok_items:
        ok_jobs.setdefault(res["job_id"], (op, item))
    for jid, (op, item) in ok_jobs.items():
        if jid in ix.dlq:
            continue
        top = max((j["attempt"] for _, j in ix.deliveries.get(jid, ())), default=0)
        acked = any(_ok(a) for a in ix.acks.get(jid, ())) or \
            any(a["outcome"] == "unknown" and a["attempt"] >= top for a in ix.acks.get(jid, ()))
        if not acked:
            last = None
            if ix.deliveries.get(jid):
                lop, lj = ix.deliveries[jid][-1]
                last = {"op": lop["id"], "attempt": lj["attempt"], "t": round(lop["t1"], 3)}
            invs["lost"].bad_unless(jid in power_lost,
                                    {"job_id": jid, "value": item["value"], "enqueue_op": op["id"], "proc": op.get("proc"),
                                     "t": round(op["t1"], 3), "last_delivery": last})
    # A tick's job, once seen, is acked or dead-lettered too (no enqueue answered for it: the
    # cluster made it; a memory-mode power cut may have erased its firing).
    tick_erased = _maybe_erased_tick_jobs(ix, pc)
    for jid in ix.job_ticks:
        if jid in ix.dlq:
            continue
        top = max((j["attempt"] for _, j in ix.deliveries.get(jid, ())), default=0)
        if any(_ok(a) for a in ix.acks.get(jid, ())) or \
                any(a["outcome"] == "unknown" and a["attempt"] >= top for a in ix.acks.get(jid, ())):
            continue
        name, tick = sorted(ix.job_ticks[jid], key=str)[0]
        lop, lj = ix.deliveries[jid][-1]
        invs["lost"].bad_unless(jid in tick_erased, {"job_id": jid, "schedule": name, "tick": tick,
                                                     "last_delivery": {"op": lop["id"], "attempt": lj["attempt"],
                                                                       "t": round(lop["t1"], 3)}})

    # ------------------------------------------------------------------ schedule
    for jid, ds in ix.deliveries.items():
        for op, j in ds:
            sched = j.get("scheduled_at")
            now = reserve_now(op, j)
            if sched is not None and now is not None and now < sched:
                invs["schedule"].bad({"job_id": jid, "op": op["id"], "scheduled_at": sched, "leased_at": now,
                                      "early_ms": sched - now, "clock": "replicated"})
            item = ix.attempted.get(j.get("value"))
            if item and item.get("scheduled_at") is not None:
                if sched is not None and sched != item["scheduled_at"]:
                    invs["schedule"].bad({"job_id": jid, "op": op["id"], "asked": item["scheduled_at"], "got": sched})
                if op["w1"] is not None and op["w1"] < item["scheduled_at"] - clock_tolerance_ms:
                    invs["schedule"].bad({"job_id": jid, "op": op["id"], "scheduled_at": item["scheduled_at"],
                                          "answered_at_wall": op["w1"], "early_ms": item["scheduled_at"] - op["w1"],
                                          "clock": "wall"})

    # ------------------------------------------------------------------ retry delay, lease honoured
    for jid, ds in ix.deliveries.items():
        at = {}
        for op, j in ds:
            at.setdefault(j["attempt"], (op, j))
        nacks = ix.nacks.get(jid, ())
        for a, (op, j) in at.items():
            nxt = at.get(a + 1)
            if nxt is None:
                continue
            now_a, now_b = reserve_now(op, j), reserve_now(*nxt)
            if now_a is None or now_b is None:
                continue
            rels = ix.releases.get(jid, ())
            ok_nacks = [n for n in nacks if n["attempt"] == a and _ok(n) and not n.get("dead_lettered")] + \
                [r for r in rels if r["attempt"] == a and _ok(r)]
            maybe_nacks = [n for n in list(nacks) + list(rels) if n["attempt"] == a and n["outcome"] == "unknown"]
            if ok_nacks:
                n = ok_nacks[0]
                if n["f"] == "release":
                    horizon = (retry or {}).get("max_schedule_horizon_ms")
                    want = min(n.get("delay_ms") or 0, horizon) if horizon else (n.get("delay_ms") or 0)
                elif n["strategy"] == "delay":
                    horizon = (retry or {}).get("max_schedule_horizon_ms")
                    want = min(n["delay_ms"] or 0, horizon) if horizon else (n["delay_ms"] or 0)
                elif retry is not None:
                    # The policy counts attempts used: a release uses none.
                    want = policy_delay_ms(jid, a - (j.get("releases") or 0), retry["retry_delay_ms"], retry["retry_backoff"],
                                           retry["retry_delay_max_ms"], retry["max_schedule_horizon_ms"])
                else:
                    want = 0
                if now_b < now_a + want:
                    invs["retry_delay"].bad_unless(
                        pc.lost_before(n, nxt[0]["t1"]) or pc.lost_before(op, nxt[0]["t1"]),
                        {"job_id": jid, "attempt": a, "nack": n["id"], "delay_ms": want,
                         "redelivered_after_ms": now_b - now_a})
            elif not maybe_nacks:
                expiry = kept = j.get("lease_expires")
                if pc.lost_before(op, nxt[0]["t1"]):
                    kept = None
                for e in ix.extends.get(jid, ()):
                    if e["attempt"] == a and _ok(e) and e.get("lease_expires") is not None:
                        expiry = max(expiry, e["lease_expires"])
                        if kept is not None and not pc.lost_before(e, nxt[0]["t1"]):
                            kept = max(kept, e["lease_expires"])
                if expiry is not None and now_b < expiry:
                    # Excused when only lease ends that a cut may have erased come after it.
                    invs["lease_honoured"].bad_unless(kept is None or now_b >= kept,
                                                      {"job_id": jid, "attempt": a, "lease_end": expiry,
                                                       "redelivered_at": now_b, "early_ms": expiry - now_b})

    # ------------------------------------------------------------------ dead letters
    causes = defaultdict(int)
    for jid, recs in ix.dlq.items():
        if len(recs) > 1:
            invs["dead_letters"].bad({"job_id": jid, "records": len(recs)})
        rec = recs[0]
        causes[rec["cause"]] += 1
        fa, mx, cause = rec["final_attempt"], rec.get("max_attempts") or ix.job_max.get(jid), rec["cause"]
        used = fa - (rec.get("releases") or 0)
        if not (1 <= used and (mx is None or used <= mx)):
            invs["attempts_bound"].bad({"job_id": jid, "dead_letter_final_attempt": fa, "max_attempts": mx})
        nacks_at = [n for n in ix.nacks.get(jid, ()) if n["attempt"] == fa and n["outcome"] in ("ok", "unknown")]
        if cause == "rejected":
            match = [n for n in nacks_at if n["strategy"] == "dead_letter" and n["reason"] == rec.get("last_reason")]
            if not match:
                invs["dead_letters"].bad({"job_id": jid, "cause": cause, "final_attempt": fa,
                                          "why": "no dead_letter nack for this attempt with this reason",
                                          "last_reason": rec.get("last_reason")})
        elif cause == "attempts_exhausted":
            match = [n for n in nacks_at if n["strategy"] != "dead_letter" and n["reason"] == rec.get("last_reason")]
            if mx is not None and used < mx or not match:
                invs["dead_letters"].bad({"job_id": jid, "cause": cause, "final_attempt": fa, "max_attempts": mx,
                                          "why": "not the last attempt, or no nack for it with this reason",
                                          "last_reason": rec.get("last_reason")})
        elif cause == "lease_expired":
            done = [x for x in list(ix.acks.get(jid, ())) + list(ix.nacks.get(jid, ()))
                    if x["attempt"] == fa and _ok(x)]
            if (mx is not None and used < mx) or rec.get("last_reason") is not None or done:
                excused = bool(done) and not ((mx is not None and used < mx) or rec.get("last_reason") is not None) \
                    and all(pc.lost_before_wall(x, rec.get("failed_at")) for x in done)
                invs["dead_letters"].bad_unless(excused, {"job_id": jid, "cause": cause, "final_attempt": fa,
                                                          "max_attempts": mx, "ok_ops": [x["id"] for x in done],
                                                          "why": "not the last attempt, has a reason, or was acked/nacked ok"})
        else:
            invs["dead_letters"].bad({"job_id": jid, "cause": cause, "why": "a cause this workload never produces"})
    for jid, lst in ix.nacks.items():
        for n in lst:
            if not _ok(n):
                continue
            mx = n.get("max_attempts") or ix.job_max.get(jid)
            expect = n["strategy"] == "dead_letter" or (mx is not None and n["attempt"] - (n.get("releases") or 0) >= mx)
            if n.get("dead_lettered") != expect:
                invs["dead_letters"].bad({"job_id": jid, "nack": n["id"], "attempt": n["attempt"], "max_attempts": mx,
                                          "strategy": n["strategy"], "dead_lettered": n.get("dead_lettered"),
                                          "why": "dead_lettered flag differs from the rules"})
            if n.get("dead_lettered"):
                recs = ix.dlq.get(jid)
                want = "rejected" if n["strategy"] == "dead_letter" else "attempts_exhausted"
                if not recs or recs[0]["cause"] != want or recs[0]["final_attempt"] != n["attempt"]:
                    invs["dead_letters"].bad_unless(
                        pc.lost_before_wall(n, recs[0].get("failed_at") if recs else None),
                        {"job_id": jid, "nack": n["id"], "want_cause": want, "found": recs[0] if recs else None,
                         "why": "an ok dead-lettering nack without its dead letter"})

    schedule_stats = _check_schedules(ix, invs, pc, tick_erased, drain, max_catchup_ticks)
    _check_releases(ix, invs, pc)
    if gates:
        _check_gates(ix, invs, gates, pc)
    else:
        for name in ("throttle_limit", "circuit_open", "window_closed"):
            invs[name].skipped = "no gates configured"
    if key_queues:
        key_stats = _check_keys(ix, invs, key_queues, pc, clock_lag_ms)
    else:
        key_stats = None
        for name in ("key_concurrency_held", "key_rate_held", "queue_rate_held"):
            invs[name].skipped = "no keyed queues configured"

    # ------------------------------------------------------------------ final state
    if drain is not None:
        if not drain.get("ok"):
            invs["drained"].bad({"why": "the final drain did not finish", "queues": drain.get("queues")})
        for q in drain.get("queues") or []:
            left = {k: q.get(k, 0) for k in ("ready", "scheduled", "in_flight", "dead_lettered") if q.get(k, 0)}
            if left:
                invs["drained"].bad({"queue": q.get("name"), "left": left})
    else:
        invs["drained"].skipped = "no final drain"
    if views is not None:
        for i, v in enumerate(views):
            if not v:
                invs["replicas_agree"].bad({"node": i, "why": "no view (node down or not answering)"})
                continue
            st = v.get("state") or {}
            if st.get("jobs", 0) or st.get("dead_letters", 0):
                invs["drained"].bad({"node": v.get("node_id"), "jobs": st.get("jobs"), "dead_letters": st.get("dead_letters")})
        got = [(v.get("node_id"),) + digest_at(v) for v in views if v]
        if len({(a, d) for _, a, d in got}) > 1:
            invs["replicas_agree"].bad({"views": got})
    else:
        invs["replicas_agree"].skipped = "no node views"

    if leader_claims is not None:
        # Strict in both modes: term and vote are synced before they are acted on in memory mode
        # too (node/replication/replica.py), so even a power cut cannot make a node vote twice in a term.
        for term, nodes in sorted(leader_claims.items(), key=lambda kv: int(kv[0])):
            if len(set(nodes)) > 1:
                invs["one_leader_per_term"].bad({"term": term, "leaders": sorted(set(nodes))})
    else:
        invs["one_leader_per_term"].skipped = "no samples"

    if liveness is not None:
        la, bound = liveness.get("leader_after_heal_s"), liveness.get("leader_bound_s")
        if la is None or (bound is not None and la > bound):
            invs["liveness"].bad({"leader_after_heal_s": la, "bound_s": bound})
        lp = liveness.get("lease_probe")
        if lp is not None and not lp.get("ok"):
            invs["liveness"].bad({"lease_probe": lp})
    else:
        invs["liveness"].skipped = "not measured"

    # ------------------------------------------------------------------ disks
    damaged_nodes = {f.get("node") for f in disk_faults or [] if not f.get("skipped")}
    disk_lines = 0
    if node_logs is not None:
        by_node = node_logs.get("critical_by_node")
        if by_node is None:
            by_node = {None: node_logs.get("critical", [])}
        for nid, lines in by_node.items():
            for line in lines:
                if "disk check: snapshot_received_damaged" in line:
                    invs["checksum_failures_contained"].bad({"node": nid, "why": "a snapshot arrived damaged", "line": line})
                    continue
                ours = "disk check:" in line or "storage failure:" in line
                if ours and nid in damaged_nodes:
                    disk_lines += 1                   # what a damaged node must say
                    continue
                if ours:
                    invs["checksum_failures_contained"].bad({"node": nid, "why": "damage found on a node no fault "
                                                                                "damaged", "line": line})
                invs["no_critical_node_logs"].bad({"line": line})
    else:
        invs["no_critical_node_logs"].skipped = "no node logs"
    for f in disk_faults or []:
        if f.get("skipped") or f.get("damage_skipped"):
            continue
        if f["kind"] in ("bitflip", "truncate") and not f.get("found"):
            invs["checksum_failures_contained"].bad({"fault": f.get("id"), "kind": f["kind"], "node": f.get("node"),
                                                     "why": "damage the node did not find", "damage": {
                                                         k: f.get(k) for k in ("file", "bits", "cut_at")}})
        if f["kind"] == "fsync-eio" and "exit_code" in f:
            if f["exit_code"] != 74 or not f.get("logged"):
                invs["failed_writes_stop"].bad({"fault": f.get("id"), "node": f.get("node"),
                                                "exit_code": f["exit_code"], "logged": f.get("logged")})
        if f["kind"] == "disk-full" and f.get("exit_code") is not None and f["exit_code"] != 74:
            invs["failed_writes_stop"].bad({"fault": f.get("id"), "node": f.get("node"), "exit_code": f["exit_code"]})
    for claim in untrusted_claims or []:
        invs["checksum_failures_contained"].bad(dict(claim, why="led or stood for election with an untrusted log"))
    if disk_faults is None:
        invs["checksum_failures_contained"].skipped = invs["failed_writes_stop"].skipped = "no disk faults"
    for e in internal_errors or []:
        invs["no_internal_errors"].bad(e)
    for op in ops:
        if op.get("error") == "internal":
            invs["no_internal_errors"].bad({"op": op["id"], "f": op["f"]})

    # ------------------------------------------------------------------ stats
    by_outcome: dict = defaultdict(lambda: defaultdict(int))
    for op in ops:
        by_outcome[op["f"]][op.get("outcome") or "open"] += 1
    stats = {
        "ops": {f: dict(v) for f, v in sorted(by_outcome.items())},
        "lost_after_power_loss": invs["lost"].expected,
        "disk_critical_lines": disk_lines,
        "expected_after_power_loss": sum(i.expected for i in invs.values()),
        "enqueued_ok_jobs": len(ok_jobs),
        "attempted_values": len(ix.attempted),
        "recovered": recovered,
        "jobs_delivered": len(ix.deliveries),
        "deliveries": sum(len(d) for d in ix.deliveries.values()),
        "redeliveries": redeliveries,
        "acked_ok_jobs": sum(1 for lst in ix.acks.values() if any(_ok(a) for a in lst)),
        "dead_letters": dict(causes),
        "releases_ok": sum(1 for lst in ix.releases.values() for r in lst if _ok(r)),
        "gated_deliveries": {q: sum(1 for ds in ix.deliveries.values() for _, j in ds if j.get("queue") == q)
                             for q in ("thr", "cb", "win")} if gates else None,
        "schedules": schedule_stats,
        "keys": key_stats,
    }
    out = [inv.out() for inv in invs.values()]
    return {"valid": all(i["ok"] for i in out), "invariants": out, "stats": stats, "failures": failed_ops(ix)}


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


def _check_releases(ix: Index, invs: dict, pc: PowerCuts):
    """An ok release of attempt a: the next delivery carries attempt a + 1 and one release more,
    so the attempts used (attempt - releases) are those of the released delivery."""
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
                invs["release_uses_no_attempt"].bad_unless(pc.lost_before(r, op["t1"]), {
                    "job_id": jid, "release": r["id"], "attempt": r["attempt"], "used_before": used_before,
                    "next_delivery": op["id"], "used_after": used_after})


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


def _check_gates(ix: Index, invs: dict, gates: dict, pc: PowerCuts):
    """The gates against the history. What a memory-mode power cut may have erased (a delivery,
    a failure) before the delivery being judged does not count against it: the cluster that
    made that delivery no longer knew of it (counted apart as expected, like the other
    invariants' power-cut echoes)."""
    ds = _gated_deliveries(ix, gates)
    limits = gates.get("resource_limits") or {}
    by_resource: dict = defaultdict(list)
    for d in ds:
        r = d[1].get("resource")
        if r in limits:
            by_resource[r].append(d)
    for r, lst in by_resource.items():
        times = [d[2] for d in lst]
        for i, x in enumerate(lst):
            # Only deliveries leased within a lease before x can still hold a slot at x.
            lo = bisect.bisect_left(times, x[2] - MAX_LEASE_MS)
            hi = bisect.bisect_right(times, x[2])
            held = [y for y in lst[lo:hi] if y is not x and y[1]["job_id"] != x[1]["job_id"]
                    and _surely_in_flight(ix, y, x)]
            if len(held) + 1 > limits[r]:
                kept = [y for y in held if not pc.lost_before(y[0], x[0]["t1"])]
                invs["throttle_limit"].bad_unless(len(kept) + 1 <= limits[r], {"resource": r, "limit": limits[r], "job_id": x[1]["job_id"],
                                            "leased_at": x[2], "also_in_flight": [y[1]["job_id"] for y in held]})
    cb = gates.get("circuit")
    if cb:
        mine = [d for d in ds if d[1].get("queue") == cb["queue"]]
        fail_ops = sorted((n for lst in ix.nacks.values() for n in lst
                           if _ok(n) and ix.job_queue.get(n["job_id"]) == cb["queue"] and n.get("proc") != "drain"),
                          key=lambda n: n["t1"])
        fails = [n["t1"] for n in fail_ops]
        prev = None
        for x in mine:
            surely = bisect.bisect_left(fails, x[0]["t0"])        # failures answered before x was asked for
            if prev is not None and surely >= cb["failures"] and x[2] - prev[2] < cb["open_ms"]:
                kept = sum(1 for n in fail_ops[:surely] if not pc.lost_before(n, x[0]["t1"]))
                invs["circuit_open"].bad_unless(kept < cb["failures"] or pc.lost_before(prev[0], x[0]["t1"]), {"queue": cb["queue"], "job_id": x[1]["job_id"], "leased_at": x[2],
                                          "previous": prev[1]["job_id"], "previous_at": prev[2],
                                          "apart_ms": x[2] - prev[2], "open_ms": cb["open_ms"],
                                          "failures_before": surely})
            prev = x
    win = gates.get("windows")
    if win:
        spans = sorted(tuple(s) for s in win["open"])
        starts = [a for a, _ in spans]
        for op, j, now in ds:
            if j.get("queue") != win["queue"]:
                continue
            i = bisect.bisect_right(starts, now) - 1
            if i < 0 or not (spans[i][0] <= now < spans[i][1]):
                invs["window_closed"].bad({"queue": win["queue"], "job_id": j["job_id"], "leased_at": now, "op": op["id"]})


# ---------------------------------------------------------------------------- keys
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


def _check_keys(ix: Index, invs: dict, keys: dict, pc: PowerCuts, lag_ms: int) -> dict:
    """key_concurrency_held, key_rate_held and queue_rate_held over every delivery of a keyed
    queue (the final drain's included: the limits hold then too); what each queue did, for the
    report. A hand-out a memory-mode power cut may have erased before the one judged does not
    count against it (the cluster that made that one no longer knew of it): counted apart as
    expected, like the gates' checks."""
    conc_inv, rate_inv, qrate_inv = invs["key_concurrency_held"], invs["key_rate_held"], invs["queue_rate_held"]
    per_queue: dict = {q: [] for q in keys}
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
    stats: dict = {}
    for q, lst in per_queue.items():
        settings = keys[q] or {}
        lst.sort(key=lambda d: (d[2], d[0]["t1"]))
        by_key: dict = defaultdict(list)
        for d in lst:
            by_key[d[1].get("tenant")].append(d)
        peak = {"in_flight": 0, "key": None, "limit": None}
        densest = {"hand_outs": 0, "key": None, "count": None, "period_ms": None}
        for key, kl in by_key.items():
            if key is None:
                continue                           # a job without a key: no key limit
            conc, rate = _key_limits(settings, key)
            times = [d[2] for d in kl]
            if conc is not None:
                for x in kl:
                    lo = bisect.bisect_left(times, x[2] - MAX_LEASE_MS)
                    hi = bisect.bisect_right(times, x[2])
                    # Those certainly handed out before x (an earlier stamp, the same reserve, or
                    # the same stamp by a reserve answered before x's was asked for: the clock
                    # stands still while a leader's clock is behind the replicated one) and
                    # certainly still in flight at x's hand-out: all of them and x at once.
                    held, either = [], False
                    for y in kl[lo:hi]:
                        if y is x or y[1]["job_id"] == x[1]["job_id"] or not _key_in_flight(ix, y, x, lag_ms):
                            continue
                        if y[2] < x[2] or y[0] is x[0] or y[0]["t1"] < x[0]["t0"]:
                            held.append(y)
                        elif conc == 1 and _key_in_flight(ix, x, y, lag_ms):
                            # One stamp, two reserves in unknown order, each certainly in flight at
                            # the other's hand-out: whichever came second, two at once.
                            either = True
                            held.append(y)
                    if not either and len(held) + 1 > peak["in_flight"]:
                        peak = {"in_flight": len(held) + 1, "key": key, "limit": conc}
                    if len(held) + 1 > conc:
                        kept = [y for y in held if not pc.lost_before(y[0], x[0]["t1"])]
                        conc_inv.bad_unless(len(kept) + 1 <= conc, {
                            "queue": q, "key": key, "key_concurrency": conc, "job_id": x[1]["job_id"],
                            "attempt": x[1]["attempt"], "handed_out_at": x[2], "op": x[0]["id"],
                            "also_in_flight": [{"job_id": y[1]["job_id"], "attempt": y[1]["attempt"],
                                                "handed_out_at": y[2], "lease_end": _lease_end(ix, y[1])}
                                               for y in held]})
            if rate is not None:
                count, period = rate
                for i in range(len(kl) - count):
                    a, b = kl[i], kl[i + count]
                    if b[2] - a[2] < period:
                        rate_inv.bad_unless(any(pc.lost_before(d[0], b[0]["t1"]) for d in kl[i:i + count]), {
                            "queue": q, "key": key, "count": count, "period_ms": period, "span_ms": b[2] - a[2],
                            "hand_outs": [[d[1]["job_id"], d[1]["attempt"], d[2]] for d in kl[i:i + count + 1]]})
                n = _densest(times, period)
                if n > densest["hand_outs"]:
                    densest = {"hand_outs": n, "key": key, "count": count, "period_ms": period}
        qrate = _rate_of(settings.get("rate"))
        queue_densest = None
        if qrate is not None:
            count, period = qrate
            for i in range(len(lst) - count):
                a, b = lst[i], lst[i + count]
                if b[2] - a[2] < period:
                    qrate_inv.bad_unless(any(pc.lost_before(d[0], b[0]["t1"]) for d in lst[i:i + count]), {
                        "queue": q, "count": count, "period_ms": period, "span_ms": b[2] - a[2],
                        "hand_outs": [[d[1]["job_id"], d[1]["attempt"], d[2]] for d in lst[i:i + count + 1]]})
            queue_densest = {"hand_outs": _densest([d[2] for d in lst], period), "count": count, "period_ms": period}
        jobs = {d[1]["job_id"] for d in lst}
        stats[q] = {"keys": sum(1 for k in by_key if k is not None),
                    "enqueued_ok_jobs": len({res["job_id"] for _, item, res in ix.ok_items if item.get("queue") == q}),
                    "hand_outs": len(lst), "jobs_handed_out": len(jobs),
                    "acked_ok_jobs": sum(1 for jid in jobs if any(_ok(a) for a in ix.acks.get(jid, ()))),
                    "releases_ok": sum(1 for jid in jobs for r in ix.releases.get(jid, ()) if _ok(r)),
                    "dead_lettered": sum(1 for jid in jobs if jid in ix.dlq),
                    "peak_in_flight": peak if peak["limit"] is not None else None,
                    "densest_key_window": densest if densest["key"] is not None else None,
                    "densest_queue_window": queue_densest}
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
    out: list = []
    every, first = spec.get("every_ms"), spec.get("next_fire_at_ms")
    policy = spec.get("catchup") or "one"
    misfire = spec.get("misfire_after_ms") if spec.get("misfire_after_ms") is not None else 5000
    window = spec.get("catchup_window_ms") if spec.get("catchup_window_ms") is not None else 3_600_000
    order = sorted(ticks)

    def late(t) -> bool:
        e = ticks.get(t)
        return e is not None and e - t > misfire

    for t in order:
        e = ticks[t]
        if first is not None and every and (t < first or (t - first) % every):
            out.append(({"tick": t, "first_tick": first, "every_ms": every, "why": "a tick off the schedule's grid"},
                        {t}))
        if e is not None and e < t:
            out.append(({"tick": t, "enqueued_at": e, "early_ms": t - e, "why": "enqueued before its tick"}, {t}))
        if policy == "skip" and late(t):
            out.append(({"tick": t, "enqueued_at": e, "late_ms": e - t, "misfire_after_ms": misfire,
                         "why": "fired late under catchup skip"}, {t}))
    if not every or not order:
        return out
    # Gaps, from the schedule's first tick on (a virtual tick before it, never late).
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
    if policy == "one":
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


def _check_schedules(ix: Index, invs: dict, pc: PowerCuts, erased: set, drain: dict | None,
                     max_catchup_ticks: int) -> dict | None:
    """one_job_per_tick and no_tick_missed; what each schedule did, for the report. What a
    memory-mode power cut may have erased (a tick fired, seen, then rolled back and fired again
    later or never) counts apart as expected."""
    once, missed = invs["one_job_per_tick"], invs["no_tick_missed"]
    if not ix.schedule_puts and not ix.tick_jobs:
        once.skipped = missed.skipped = "no schedules in this run"
        return None
    for (name, tick), jids in sorted(ix.tick_jobs.items(), key=str):
        if len(jids) > 1:
            once.bad({"schedule": name, "tick": tick, "job_ids": sorted(jids)})
    for jid, ticks in sorted(ix.job_ticks.items()):
        if len(ticks) > 1:
            once.bad({"job_id": jid, "ticks": sorted(ticks, key=str), "why": "one job for two ticks"})
    views = None if ix.schedule_views is None else {v.get("name"): v for v in ix.schedule_views}
    stats: dict = {}
    for name, puts in sorted(ix.schedule_puts.items()):
        oks = [op for op in puts if _ok(op)]
        spec = oks[0] if oks else puts[0]
        ticks: dict = {}
        erased_ticks: set = set()
        jobs: set = set()
        for (n, tick), jids in ix.tick_jobs.items():
            if n != name:
                continue
            jobs |= jids
            if tick is None:
                missed.bad({"schedule": name, "job_ids": sorted(jids), "why": "a schedule's job without its tick"})
                continue
            sighted = [ix.job_enqueued[j] for j in jids if j in ix.job_enqueued]
            ticks[tick] = max(sighted)[1] if sighted else None
            if all(j in erased for j in jids):
                erased_ticks.add(tick)
        for ex, involved in _judge_ticks(spec, ticks, max_catchup_ticks):
            missed.bad_unless(bool(involved & erased_ticks), dict(ex, schedule=name, catchup=spec.get("catchup")))
        view = views.get(name) if views is not None else None
        fired = view.get("fired") if view else None
        if views is not None and oks and view is None:
            missed.bad_unless(any(pc.windows(op) for op in oks), {"schedule": name, "why": "the schedule is gone"})
        elif view is not None and view.get("paused") and fired is not None and (drain is None or drain.get("ok")):
            # Paused before the final drain, which took every job: each tick fired was seen.
            if fired > len(ticks):
                missed.bad({"schedule": name, "fired": fired, "seen": len(ticks),
                            "why": "ticks fired whose job was never seen"})
            elif fired < len(ticks):
                missed.bad_unless(fired >= len(ticks) - len(erased_ticks),
                                  {"schedule": name, "fired": fired, "seen": len(ticks),
                                   "why": "more ticks seen than the schedule fired"})
        every = spec.get("every_ms")
        order = sorted(ticks)
        misfire = spec.get("misfire_after_ms") if spec.get("misfire_after_ms") is not None else 5000
        stats[name] = {"catchup": spec.get("catchup"), "misfire_after_ms": spec.get("misfire_after_ms"),
                       "ticks": len(ticks), "jobs": len(jobs), "fired": fired,
                       "late": sum(1 for t in order if ticks[t] is not None and ticks[t] - t > misfire),
                       "missing": ((order[-1] - order[0]) // every + 1 - len(order)) if order and every else 0,
                       "first_tick": order[0] if order else None, "last_tick": order[-1] if order else None}
    return stats


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
