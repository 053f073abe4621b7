"""`raftq chaos`: prove that failover loses nothing.

Starts a local cluster (real node processes, every Raft link through a fault-injecting proxy),
runs a mixed workload through the client while a nemesis injects faults, heals, drains
everything, and checks the history against the invariants (cluster/chaos/checker.py).

    raftq chaos --duration 600                # all fault kinds, 3 nodes, fsync
    raftq chaos --duration 60 --faults kill-leader,pause-leader --seed 7 --json
    raftq chaos --nodes 5 --durability memory --dir /tmp/run1
    raftq chaos --duration 120 --faults power-loss,kill-leader --durability memory

The report opens with a one-line verdict (`verdict`: PASS or FAIL, acknowledged jobs lost,
fencing violations, what ran), sets the failed and unknown ops that faults and stalls must cause
(checker.failed_ops) apart from unexpected ones, and gives each fault one line in words
(nemesis.describe_fault). Exit status: 0 when every invariant holds (the verdict's PASS), 1 on
any violation, 2 when the run itself could not be set up. A run's directory (kept on failure, or with --dir/--keep) holds the node configs and
logs, `history.jsonl` (every op's invoke and completion) and `report.json`.

Power loss (`--faults power-loss`, opt-in): kill -9 of every node (`kill-all`) loses nothing in
either durability mode, because the page cache survives a process crash. A real power cut needs
root (LazyFS, dm-flakey), so the nodes run with a test hook instead (node/replication/sync_shadow.py,
`[testing] sync_shadow = true`): at every durable point (a journal sync in fsync mode; a simulated page
writeback every `--writeback` seconds, default 2, in memory mode) each node records what a disk
honouring only fsync would hold. The fault freezes every node at once, SIGKILLs them, rolls each
data dir back to its record (the journal's unsynced tail dropped, in memory mode the snapshot
too; term and vote are synced in both modes) and restarts them. fsync mode must then pass every
invariant. In memory mode, losing acknowledged writes is the documented cost: the report counts
what the cuts explain (acknowledged jobs lost, and their echoes: a redelivery of a job whose ack
was lost, a key that no longer deduplicates, ...) apart, as "lost after power loss (memory mode,
expected)", and only for ops answered after the earliest last durable point of any node and
before the restart; anything else is a violation as usual (chaos_checker.PowerCuts).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .checker import FENCING, check, percentile, unavailability
from ...node.replication import sync_shadow

from . import diskfaults
from .nemesis import ALL_KINDS, GROUPS, KINDS, Env, Nemesis, Sampler, ScheduleConfig, describe_fault
from .proxy import ProxyNet
from .workload import (History, WorkloadConfig, Workload, final_drain, gates_config, keys_config, lease_liveness_probe,
                       lift_gates, pause_schedules, wall_ms)
from ..local import LocalCluster, http_json

RETRY_LIMITS = {"retry_delay_ms": 100, "retry_backoff": "exponential", "retry_delay_max_ms": 1000}


@dataclass
class ChaosOptions:
    duration: float = 60.0
    nodes: int = 3
    seed: int | None = None
    faults: tuple = KINDS
    durability: str = "fsync"
    dir: str | None = None
    keep: bool = False
    progress: bool = True
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    sweep_interval_ms: int = 500
    leader_bound_s: float = 10.0
    lease_probe: bool = True
    tuning: dict = field(default_factory=dict)
    writeback_s: float = sync_shadow.DEFAULT_WRITEBACK_S   # memory mode's simulated page writeback (power-loss)
    disk_bytes: int = 384 << 20         # disk-full: each node's loop-mounted filesystem
    reserve_bytes: int = 32 << 20       # disk-full: the nodes' storage.min_free_bytes


class StatusLine:
    """The run's one status line (redrawn in place on a terminal, every 10 s otherwise) and its
    events (one line each)."""

    def __init__(self, enabled: bool, stream=sys.stderr):
        self.enabled = enabled
        self.stream = stream
        self.tty = enabled and stream.isatty()
        self.last_line = 0.0

    def line(self, text: str, force: bool = False):
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
            self.stream.flush()
        elif force or time.monotonic() - self.last_line >= 10:
            self.last_line = time.monotonic()
            self.stream.write(text + "\n")
            self.stream.flush()

    def event(self, text: str):
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[K" + text + "\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class Phases(dict):
    """The current phase's name (for the progress line) and how long each one took."""

    def __init__(self):
        super().__init__(name="start")
        self.t = time.monotonic()
        self.took: dict = {}

    def enter(self, name: str):
        now = time.monotonic()
        self.took[self["name"]] = round(self.took.get(self["name"], 0) + now - self.t, 3)
        self["name"], self.t = name, now


async def _progress_loop(h: History, nemesis: Nemesis, sampler: Sampler, progress: StatusLine, duration: float,
                         phase: dict):
    while True:
        c = Counter()
        for (f, outcome), n in h.counts.items():
            c[outcome] += n
        leader, term = sampler.leader_now()
        active = ",".join(f.kind for f in nemesis.active) or "-"
        progress.line(f"[{h.now():6.1f}/{duration:.0f}s {phase['name']}] faults {len(nemesis.faults)} "
                      f"active {active} | ops ok {c['ok']} fail {c['fail']} unknown {c['unknown']} | "
                      f"leader {leader or '-'} term {term if term is not None else '-'}")
        await asyncio.sleep(1.0)


async def _wait_clock_sane(env: Env, timeout: float) -> float:
    """After a forward clock skew the replicated clock runs ahead of the wall clock until real
    time catches up (it never goes back). Wait for that, so the liveness probe measures leases,
    not the skew."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        views = await env.views()
        clocks = [((v or {}).get("state") or {}).get("clock_ms") for v in views.values()]
        clocks = [c for c in clocks if c]
        if clocks and max(clocks) <= wall_ms() + 200:
            break
        await asyncio.sleep(0.2)
    return time.monotonic() - t0


def scan_node_logs(directory: Path, ids: list[str]) -> dict:
    """CRITICAL lines (all, and by node) and traceback counts from the node logs of a run."""
    out = {"critical": [], "critical_by_node": {}, "tracebacks": {}}
    for nid in ids:
        path = directory / f"{nid}.log"
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        out["tracebacks"][nid] = text.count("Traceback (most recent call last)")
        lines = [line.strip()[:300] for line in text.splitlines() if " CRITICAL " in line]
        out["critical"] += lines
        out["critical_by_node"][nid] = lines
    return out


# [testing] check_invariants of the run's nodes (docs/configuration.md): the core's own invariant
# checks after applied entries; a violation any node finds fails the run (add_core_invariants).
INVARIANT_CHECK_BUDGET = 1000


def add_core_invariants(result: dict, views: list, node_logs: dict) -> None:
    """The nodes' own invariant checks as one more of the checker's invariants: every violation
    a node logged (CRITICAL, from any of its processes: a restarted node's count starts again)
    or counts in its final view. Any fails the run."""
    logged = [line for line in node_logs["critical"] if "invariant violation after" in line]
    counted = sum((v or {}).get("invariant_violations") or 0 for v in views)
    examples = logged[:5] or [f"{(v or {}).get('node_id')}: {(v or {}).get('invariant_violations')} counted"
                              for v in views if (v or {}).get("invariant_violations")]
    count = max(len(logged), counted)
    result["invariants"].append({
        "name": "core_invariants_on_every_node", "ok": count == 0, "count": count, "examples": examples,
        "about": "every node ran the core's invariant checks (node/core/invariants.py) after applied entries "
                 "([testing] check_invariants) and found no violation"})
    result["valid"] = result["valid"] and count == 0


async def run_chaos(opts: ChaosOptions) -> dict:
    """One run, phase by phase (the _Run methods below, in this order); the report, whose `dir`
    the tear-down clears when it removed a passing run's temporary directory."""
    run = _Run(opts)
    try:
        await run.start()
        await run.workload_and_nemesis()
        liveness = await run.heal()
        drain, views = await run.final_drain()
        result, faults, cuts, node_logs = run.checks(liveness, drain, views)
        await run.fill_report(result, faults, cuts, node_logs, liveness, drain, views)
        return run.report
    finally:
        await run.tear_down()


class _Run:
    """A chaos run's state, from the set-up (the constructor: configs, the proxy, the history's
    files; nothing started) to the tear-down."""

    def __init__(self, opts: ChaosOptions):
        self.opts = opts
        self.seed = opts.seed if opts.seed is not None else random.randrange(1 << 31)
        self.made_dir = opts.dir is None
        self.directory = Path(opts.dir) if opts.dir else Path(tempfile.mkdtemp(prefix="raftq-chaos-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.progress = StatusLine(opts.progress)
        opts.workload.sweep_interval_ms = opts.sweep_interval_ms
        opts.schedule.kinds = tuple(opts.faults)
        self.cluster = self._cluster()
        self.disks = _testing_hooks(self.cluster, opts, self.directory)
        self._wire()

    def _cluster(self) -> LocalCluster:
        """The cluster's configuration (gated and keyed queues as the workload asks), not started."""
        opts = self.opts
        gate_limits, gate_queues, self.gates = {}, [], None
        if opts.workload.gated:
            # The window spans the whole run and its phases (open every other minute); lift_gates
            # takes it off before the final drain.
            minutes = int(opts.duration // 60) + 15
            gate_limits, gate_queues, self.gates = gates_config(time.time_ns() // 1_000_000, minutes)
        key_queues, self.keys = ([], None) if not opts.workload.keys else keys_config()
        return LocalCluster(self.directory, nodes=opts.nodes, durability=opts.durability,
                            limits={**RETRY_LIMITS, **gate_limits}, queues=gate_queues + key_queues,
                            storage={"dead_letter_retention_ms": 3_600_000,
                                     "sweep_interval_ms": opts.sweep_interval_ms},
                            tuning=dict(opts.tuning))

    def _wire(self):
        """The fault proxy (started), the history and views files, the nemesis and the sampler."""
        opts, cluster, directory = self.opts, self.cluster, self.directory
        raft_addrs = [f"127.0.0.1:{p}" for p in cluster.raft_ports]
        self.net = ProxyNet(raft_addrs, encrypted=bool(cluster.secret), seed=self.seed,
                            avoid=list(cluster.http_ports) + list(cluster.grpc_ports or ()))
        self.net.start()
        for i, m in self.net.dial_maps().items():
            if m:
                cluster.node_testing[i] = {"raft_dial_map": m}
        self.sink = open(directory / "history.jsonl", "wb")
        self.h = h = History({u: cluster.ids[i] for i, u in enumerate(cluster.urls)}, sink=self.sink)
        self.env = Env(cluster, self.net, h)
        self.env.disks, self.env.reserve_bytes = self.disks, int(opts.reserve_bytes)
        self.env.stash_dir = directory / "stash"
        self.report: dict = {"seed": self.seed, "nodes": opts.nodes, "durability": opts.durability,
                             "duration_s": opts.duration, "fault_kinds": list(opts.faults), "dir": str(directory),
                             "gates": self.gates, "keys": self.keys}
        self.phase = Phases()
        progress = self.progress
        self.nemesis = Nemesis(self.env, self.seed, opts.schedule,
                               on_event=lambda m: progress.event(f"[{h.now():6.1f}s] {m}"))
        self.views_sink = open(directory / "views.jsonl", "wb")
        self.sampler = Sampler(self.env, sink=self.views_sink)
        self.workload: Workload | None = None
        self.ptask = None
        self.t_start = time.monotonic()

    async def start(self):
        """The nodes (on their small disks for disk-full), a leader, the sampler, the schedules
        and the workload."""
        opts, cluster, report = self.opts, self.cluster, self.report
        self.progress.event(f"raftq chaos: seed {self.seed}, {opts.nodes} nodes, durability {opts.durability}, "
                            f"{opts.duration:.0f} s of faults ({', '.join(opts.faults)}); "
                            f"run directory {self.directory}")
        cluster.write_configs()
        if self.disks is not None:               # a small filesystem on every node's data dir
            for i in range(cluster.n):
                await asyncio.to_thread(self.disks.mount, cluster.ids[i], cluster.data_dir(i))
            report["disks"] = {"size_bytes": self.disks.size, "reserve_bytes": int(opts.reserve_bytes)}
        elif "disk-full" in opts.faults:
            report["disks"] = {"hook": "free_space_file", "reserve_bytes": int(opts.reserve_bytes)}
        cluster.start_all()
        await asyncio.to_thread(cluster.wait_leader, 40)
        status, info = http_json("GET", cluster.urls[0] + "/v1/server-info")
        self.horizon = info.get("max_schedule_horizon_ms", 2_592_000_000) if status == 200 else 2_592_000_000
        await self.env.open()
        self.sampler.start()
        self.workload = Workload(cluster.urls, self.h, self.seed, opts.workload)
        self.schedule_names = await self.workload.create_schedules()
        self.workload.start()

    async def workload_and_nemesis(self):
        """--duration seconds of faults under the workload, with the progress line."""
        h, opts = self.h, self.opts
        self.phase.enter("run")
        self.ptask = asyncio.get_running_loop().create_task(
            _progress_loop(h, self.nemesis, self.sampler, self.progress, opts.duration, self.phase))
        stop_at = h.now() + opts.duration
        await self.nemesis.run(stop_at)
        if h.now() < stop_at:
            await asyncio.sleep(stop_at - h.now())

    async def heal(self) -> dict:
        """Every fault healed, the workload stopped, then liveness: how soon a leader came, and
        (the clock caught up) how soon expired leases are redelivered."""
        opts, h, env = self.opts, self.h, self.env
        self.phase.enter("heal")
        await self.nemesis.heal_all()
        t_heal = h.now()
        healthy = await env.wait_healthy(timeout=max(opts.leader_bound_s * 3, 30))
        leader_after = None if healthy is None else round(h.now() - t_heal, 3)
        self.phase.enter("stop workload")
        await self.workload.stop()
        h.close_open()
        self.phase.enter("clock")
        clock_wait = await _wait_clock_sane(env, 15 + env.max_forward_skew_ms / 1000)
        lease_probe = None
        if opts.lease_probe:
            self.phase.enter("lease probe")
            lease_probe = await lease_liveness_probe(self.cluster.urls, h, lease_ms=1000,
                                                     sweep_interval_ms=opts.sweep_interval_ms)
        return {"leader_after_heal_s": leader_after, "leader_bound_s": opts.leader_bound_s,
                "lease_probe": lease_probe, "clock_wait_s": round(clock_wait, 3)}

    async def final_drain(self) -> tuple[dict, list]:
        """Gates lifted and schedules paused, everything drained; the nodes' final views."""
        urls, h = self.cluster.urls, self.h
        if self.gates is not None:
            self.phase.enter("lift gates")
            self.report["gates_lifted"] = await lift_gates(urls, h)
        if self.schedule_names:
            self.phase.enter("pause schedules")
            self.report["schedules_paused"] = await pause_schedules(urls, h, self.schedule_names)
        self.phase.enter("drain")
        drain = await final_drain(urls, h)
        self.phase.enter("converge")
        try:
            views = await asyncio.to_thread(self.cluster.wait_converged, 30)
        except TimeoutError:
            views = await asyncio.to_thread(self.cluster.cluster_views)
        await self.sampler.sample_once()
        await self.sampler.stop()
        return drain, views

    def checks(self, liveness: dict, drain: dict, views: list) -> tuple[dict, list, list, dict]:
        """The history against the checker's invariants, and the nodes' own checks."""
        self.phase.enter("check")
        h, sampler = self.h, self.sampler
        retry = dict(RETRY_LIMITS, max_schedule_horizon_ms=self.horizon)
        node_logs = scan_node_logs(self.directory, self.cluster.ids)
        faults = self.nemesis.records()
        cuts = [f for f in faults if f["kind"] == "power-loss" and f.get("t_inject") is not None]
        result = check(h.ops, dead_letters=drain["dead_letters"], drain=drain, views=views,
                       leader_claims={t: sorted(s) for t, s in sampler.claims.items()}, liveness=liveness,
                       retry=retry, clock_tolerance_ms=self.env.max_forward_skew_ms + 100,
                       internal_errors=h.internal_errors, node_logs=node_logs, power_losses=cuts,
                       disk_faults=[f for f in faults if f["kind"] in DISK_FAULT_KINDS],
                       untrusted_claims=sampler.untrusted_claims, gates=self.gates, keys=self.keys,
                       clock_lag_ms=clock_lag_ms(faults))
        add_core_invariants(result, views, node_logs)
        return result, faults, cuts, node_logs

    async def fill_report(self, result: dict, faults: list, cuts: list, node_logs: dict, liveness: dict,
                          drain: dict, views: list):
        """The report from the checks, the faults, the samples and the final views; its verdict."""
        report, nemesis, sampler, workload = self.report, self.nemesis, self.sampler, self.workload
        unav = _unavailability(self.h, faults, sampler)
        report.update({
            "valid": result["valid"],
            "elapsed_s": round(time.monotonic() - self.t_start, 1),
            "faults": {"total": sum(1 for f in faults if not f.get("skipped")),
                       "by_kind": dict(Counter(f["kind"] for f in faults if not f.get("skipped"))),
                       "skipped": sum(1 for f in faults if f.get("skipped")),
                       "mixed_steps": sum(1 for s in nemesis.steps if len(s["faults"]) > 1),
                       "list": faults},
            "steps": nemesis.steps,
            "ops": result["stats"]["ops"],
            "stats": result["stats"] | {"worker_stalls": workload.stalls, "leader_samples": sampler.samples,
                                        "terms_seen": len(sampler.claims),
                                        "key_samples": workload.key_samples if self.keys else None},
            "invariants": result["invariants"],
            "violations": sum(i["count"] for i in result["invariants"]),
            "failures": result["failures"],
            "unavailability": {"by_kind": _unavailability_summary(unav, alone=False),
                               "alone_by_kind": _unavailability_summary(unav, alone=True), "list": unav},
            "liveness": liveness,
            "power_loss": _power_loss_summary(cuts, result) if cuts else None,
            "disk": _disk_summary(faults, result),
            "node_logs": {"critical": len(node_logs["critical"]), "tracebacks": node_logs["tracebacks"]},
            "drain": {"ok": drain["ok"], "seconds": round(drain["seconds"], 3),
                      "dead_letters": len(drain["dead_letters"])},
            "final_views": [{"node": (v or {}).get("node_id"), "last_applied": (v or {}).get("last_applied"),
                             "digest": (v or {}).get("digest"),
                             "digest_index": (v or {}).get("digest_index"), "term": (v or {}).get("term")} for v in views],
            "proxy": await asyncio.to_thread(self.net.stats),
        })
        report["verdict"] = verdict(report)
        self.phase.enter("report")
        report["phases_s"] = self.phase.took

    async def tear_down(self):
        """Everything stopped and closed, report.json written, a passing run's temporary
        directory removed (then the report's `dir` is None)."""
        self.progress.done()
        if self.ptask is not None:
            self.ptask.cancel()
        if self.workload is not None and not self.workload.stopping.is_set():
            try:
                await self.workload.stop(grace_s=2)
            except Exception:
                pass
        await self.sampler.stop()
        await self.env.close()
        self.cluster.close()             # kill -9: the final views are taken, nothing else matters
        if self.disks is not None:
            self.disks.close()
        self.net.close()
        self.sink.close()
        self.views_sink.close()
        try:
            (self.directory / "report.json").write_text(json.dumps(self.report, indent=1, default=str))
        except OSError:
            pass
        if self.made_dir and not self.opts.keep and self.report.get("valid"):
            shutil.rmtree(self.directory, ignore_errors=True)
            self.report["dir"] = None


def _testing_hooks(cluster: LocalCluster, opts: ChaosOptions, directory: Path):
    """The nodes' [testing] settings the run and its fault kinds need; disk-full's small disks
    (not mounted yet), or None."""
    cluster.testing["check_invariants"] = INVARIANT_CHECK_BUDGET       # the core's own checks (add_core_invariants)
    if "power-loss" in opts.faults or "fsync-eio" in opts.faults:
        # The nodes record what a disk honouring only fsync would hold (power-loss; fsync-eio:
        # what the disk holds after a failed fsync).
        cluster.testing.update({"sync_shadow": True, "sync_shadow_writeback_s": float(opts.writeback_s)})
    if "fsync-eio" in opts.faults:
        cluster.testing["fsync_eio"] = True
    if "clock-strobe" in opts.faults:
        cluster.testing["clock_strobe"] = True
    disks = None
    if "disk-full" in opts.faults:
        cluster.storage["min_free_bytes"] = int(opts.reserve_bytes)
        why = diskfaults.SmallDisks.available()
        if why is None:
            disks = diskfaults.SmallDisks(directory / "disks", size_bytes=int(opts.disk_bytes))
        else:
            cluster.testing["free_space_file"] = True       # the hook instead (node/replication/fault_hooks.py)
    return disks


def _unavailability(h: History, faults: list, sampler: Sampler) -> list:
    """Each injected fault's unavailability, with the first leader of a newer term seen after it."""
    unav = unavailability(h.ops, [f for f in faults if not f.get("skipped")])
    for u in unav:          # when a leader of a newer term was first seen after the fault
        later = [(t, s) for t, s in sampler.first_seen.items() if s[1] >= u["t_inject"]]
        if later:
            term, (node, t) = min(later, key=lambda x: x[1][1])
            u["next_leader"] = {"node": node, "term": term, "after_s": round(t - u["t_inject"], 3)}
    return unav


def _unavailability_summary(unav: list, alone: bool) -> dict:
    """Per fault kind (with alone, only the faults that were the one of their step): how many,
    p50, p99, max, and how many saw no write again."""
    groups: dict = {}
    for u in unav:
        if not alone or not u["mixed"]:
            groups.setdefault(u["kind"], []).append(u["unavailable_s"])
    return {k: {"n": len(v), "p50": percentile(v, 50), "p99": percentile(v, 99),
                "max": max((x for x in v if x is not None), default=None),
                "never": sum(1 for x in v if x is None)}
            for k, v in sorted(groups.items())}


# ---------------------------------------------------------------------------- the report
def _power_loss_summary(cuts: list, result: dict) -> dict:
    """What the power cuts rolled back, and (memory mode) what they cost: counted apart from
    the violations, because losing unsynced writes is what memory mode documents."""
    nodes = [n for c in cuts for n in (c.get("nodes") or {}).values()]
    expected = {i["name"]: i["expected_after_power_loss"] for i in result["invariants"]
                if i.get("expected_after_power_loss")}
    return {"cuts": len(cuts),
            "cuts_with_unsynced_bytes": sum(1 for c in cuts if c.get("unsynced_at_cut")),
            "entries_dropped": sum(c.get("entries_dropped", 0) for c in cuts),
            "bytes_dropped": sum(c.get("bytes_dropped", 0) for c in cuts),
            "max_entries_dropped_on_a_node": max((n.get("entries_dropped", 0) for n in nodes), default=0),
            "restore_errors": sum(1 for n in nodes if n.get("error")),
            "lost_after_power_loss": result["stats"].get("lost_after_power_loss", 0),
            "expected_by_invariant": expected}


DISK_FAULT_KINDS = ("bitflip", "truncate", "rollback", "fsync-eio", "disk-full")


def clock_lag_ms(faults: list) -> int:
    """How far the replicated clock may have been behind the wall clock in this run: the
    largest backward offset of any node's clock (a clock-skew below zero, a strobe's amplitude),
    plus a margin; the checker's key_concurrency_held compares the workers' wall-clock send
    times with the cluster's stamps."""
    lag = 0
    for f in faults:
        if f.get("skipped"):
            continue
        if f["kind"] == "clock-skew" and (f.get("offset_ms") or 0) < 0:
            lag = max(lag, -f["offset_ms"])
        elif f["kind"] == "clock-strobe":
            lag = max(lag, f.get("amplitude_ms") or 0)
    return lag + 100 if lag else 0


def _disk_summary(faults: list, result: dict) -> dict | None:
    """What the disk faults did and what the nodes made of it."""
    mine = [f for f in faults if f["kind"] in DISK_FAULT_KINDS and not f.get("skipped")]
    if not mine:
        return None
    out: dict = {}
    for f in mine:
        k = out.setdefault(f["kind"], {"n": 0, "found": {}, "exit_codes": {}})
        k["n"] += 1
        for what, n in (f.get("found") or {}).items():
            k["found"][what] = k["found"].get(what, 0) + n
        if f.get("exit_code") is not None:
            code = str(f["exit_code"])
            k["exit_codes"][code] = k["exit_codes"].get(code, 0) + 1
    out["critical_lines_expected"] = result["stats"].get("disk_critical_lines", 0)
    return out


def _fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def _counts(d: dict) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(d.items())) or "none"


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count:,} {one if count == 1 else (many or one + 's')}"


def verdict(r: dict) -> str:
    """The report's first line, from the checker's results: PASS exactly when every invariant
    holds (the exit status says the same), and what that means for the data."""
    invs = r["invariants"]
    bad = {i["name"]: i for i in invs if not i["ok"]}
    f = r["faults"]
    s = r["stats"]
    dead = sum((s.get("dead_letters") or {}).values())
    tail = (f"{_n(f['total'], 'fault')} of {_n(len(f['by_kind']), 'kind')}, {_n(s.get('enqueued_ok_jobs', 0), 'job')} "
            f"enqueued, {s.get('acked_ok_jobs', 0):,} acked, {dead:,} dead-lettered")
    parts = []
    lost = bad.get("lost")
    if lost:
        ids = [str(e.get("job_id")) for e in lost["examples"]]
        more = f" and {lost['count'] - len(ids):,} more" if lost["count"] > len(ids) else ""
        parts.append(f"{_n(lost['count'], 'acknowledged job')} lost (ids {', '.join(ids)}{more})")
    else:
        parts.append("no acknowledged job lost")
    cut = (r.get("power_loss") or {}).get("lost_after_power_loss") if r.get("durability") == "memory" else 0
    if cut:
        parts[-1] += f" but the {cut:,} a memory-mode power cut erased (expected: memory mode does not survive one)"
    fencing = {n: bad[n]["count"] for n in FENCING if n in bad}
    parts.append(f"{_n(sum(fencing.values()), 'fencing violation')} ({_counts(fencing)})" if fencing
                 else "no fencing violation")
    other = {n: i["count"] for n, i in bad.items() if n != "lost" and n not in FENCING}
    if other:
        parts.append(f"{_n(sum(other.values()), 'other violation')} ({_counts(other)})")
    checked = [i for i in invs if not i.get("skipped")]
    if not bad and len(checked) == len(invs):
        parts.append(f"all {len(invs)} invariants hold")
    elif not bad:
        parts.append(f"every invariant checked holds ({len(checked)} of {len(invs)}; "
                     f"{len(invs) - len(checked)} skipped)")
    odd = sum(x["count"] for x in r.get("failures") or () if not x["expected"])
    if odd:
        parts.append(f"{_n(odd, 'unexpected failed op')} (not a violation; see below)")
    return f"{'PASS' if r['valid'] else 'FAIL'}: {', '.join(parts)}; {tail}"


def _faults_section(r: dict) -> list[str]:
    f = r["faults"]
    out = [f"\nfaults injected: {f['total']} ({f['mixed_steps']} mixed steps, {f['skipped']} skipped)",
           f"  {'kind':20} {'count':>5}  {'unavail p50':>11} {'p99':>6} {'max':>6} {'never':>5}   "
           f"{'alone: n':>8} {'p50':>6} {'p99':>6}"]
    ub = r["unavailability"]["by_kind"]
    ua = r["unavailability"].get("alone_by_kind", {})
    for kind in sorted(f["by_kind"]):
        u, a = ub.get(kind, {}), ua.get(kind, {})
        out.append(f"  {kind:20} {f['by_kind'][kind]:>5}  {_fmt(u.get('p50')):>11} {_fmt(u.get('p99')):>6} "
                   f"{_fmt(u.get('max')):>6} {u.get('never', 0):>5}   {a.get('n', 0):>8} {_fmt(a.get('p50')):>6} "
                   f"{_fmt(a.get('p99')):>6}")
    out.append("  (unavailability: seconds from the fault to the first successful write invoked after it;\n"
               "   'alone' = the fault was the only one of its step)")
    if f.get("list"):
        out.append("  one by one (times from the start of the workload):")
        out += [f"    {describe_fault(x)}" for x in f["list"]]
    return out


def _ops_section(r: dict) -> list[str]:
    out = ["\noperations by outcome", f"  {'op':14} {'ok':>8} {'fail':>8} {'unknown':>8}"]
    for op, c in r["ops"].items():
        out.append(f"  {op:14} {c.get('ok', 0):>8} {c.get('fail', 0):>8} {c.get('unknown', 0):>8}")
    s = r["stats"]
    out.append(f"  jobs enqueued ok {s['enqueued_ok_jobs']:,}, recovered (unknown enqueue, delivered anyway) "
               f"{s['recovered']:,}, deliveries {s['deliveries']:,}, redeliveries {s['redeliveries']:,}, "
               f"dead letters {_counts(s['dead_letters'])}, worker stalls {s.get('worker_stalls')}")
    for name, v in (s.get("keys") or {}).items():
        sample = (s.get("key_samples") or {}).get(name) or {}
        parts = [f"  keyed queue {name}: {v['keys']} keys, {v['enqueued_ok_jobs']:,} jobs enqueued, "
                 f"{v['hand_outs']:,} hand-outs of {v['jobs_handed_out']:,} jobs, {v['acked_ok_jobs']:,} acked, "
                 f"{v['releases_ok']:,} releases, {v['dead_lettered']:,} dead-lettered"]
        pk, dk, dq = v.get("peak_in_flight"), v.get("densest_key_window"), v.get("densest_queue_window")
        if pk:
            parts.append(f"at most {pk['in_flight']} of one key surely in flight at once ({pk['key']}, limit "
                         f"{pk['limit']})")
        if dk:
            parts.append(f"densest {dk['period_ms']} ms of one key {dk['hand_outs']} hand-outs ({dk['key']}, limit "
                         f"{dk['count']})")
        if dq:
            parts.append(f"of the queue {dq['hand_outs']} (limit {dq['count']})")
        if sample.get("samples"):
            parts.append(f"server stats: up to {_n(sample['max_keys_at_limit'], 'key')} at a limit holding "
                         f"{_n(sample['max_ready_held_by_keys'], 'ready job')} back")
        out.append("; ".join(parts))
    wf = s.get("workflows")
    if wf:
        shapes = ", ".join(f"{n:,} {k}" for k, n in wf["by_shape"].items())
        out.append(f"  workflows: {_n(wf['graphs_ok'], 'graph')} enqueued ok ({shapes}), {wf['jobs_ok']:,} jobs; "
                   f"{wf['dependents']:,} dependents, {wf['dependents_handed_out']:,} handed out "
                   f"({wf['ran_past_a_dead_dependency']:,} past a dead-lettered complete/ignore dependency), "
                   f"{wf['dependency_failed']:,} dead-lettered dependency_failed "
                   f"({wf['dependency_failed_transitive']:,} of them down a chain); {wf['fan_ins']:,} fan-ins, "
                   f"{wf['fan_ins_handed_out']:,} handed out, "
                   f"{wf['fan_ins_failed']:,} failed with a member")
    bt = s.get("batches")
    if bt:
        out.append(f"  batches: {bt['batches']:,} opened ok ({bt['opened_open']:,} open, filled, closed), "
                   f"{bt['members']:,} members; callbacks handed out: {bt['on_complete']:,} on_complete, "
                   f"{bt['on_success']:,} on_success, {bt['on_failure']:,} on_failure")
    for name, v in (s.get("schedules") or {}).items():
        out.append(f"  schedule {name} (catchup {v['catchup']}, misfire_after_ms {v['misfire_after_ms']}): "
                   f"{v['ticks']:,} ticks seen, {v['late']:,} fired late, {v['missing']:,} missing between the first "
                   f"and the last, fired {'-' if v['fired'] is None else format(v['fired'], ',')}")
    return out + _failures_section(r.get("failures") or [])


def _failures_section(failures: list) -> list[str]:
    """The ops that did not end ok, one block per cause: expected or not, why, then the rows."""
    if not failures:
        return []
    out = ["\nfailed and unknown operations, by cause (not violations: the invariants below judge what they "
           "did to the jobs)"]
    causes: dict = {}
    for x in failures:
        causes.setdefault(x["cause"], []).append(x)
    for cause, rows in sorted(causes.items(), key=lambda kv: kv[1][0]["expected"]):
        mark = "expected" if rows[0]["expected"] else "UNEXPECTED"
        out.append(f"  {mark}, {_n(sum(x['count'] for x in rows), 'op')}: {rows[0]['why']}")
        for x in rows:
            out.append(f"    {x['f']:10} {x['outcome']:8} {str(x['error']):24} {x['count']:>6,}")
            if not x["expected"]:
                out += [f"      e.g. {json.dumps(e, default=str)[:300]}" for e in x["examples"]]
    return out


def _liveness_section(r: dict) -> list[str]:
    lv = r["liveness"]
    lp = lv.get("lease_probe") or {}
    samples = ", ".join(f"{x:.2f}" for x in lp.get("samples") or ()) or "-"
    return [f"\nliveness: leader {_fmt(lv.get('leader_after_heal_s'))} s after healing (bound "
            f"{lv.get('leader_bound_s')} s); expired leases redelivered after {samples} s "
            f"(bound {lp.get('bound_s')} s)"]


def _disk_and_power_section(r: dict) -> list[str]:
    out = []
    dk = r.get("disk")
    if dk:
        parts = []
        for kind, d in sorted((k, v) for k, v in dk.items() if isinstance(v, dict)):
            found = ", ".join(f"{w} {n}" for w, n in sorted(d["found"].items())) or "nothing to find"
            codes = ", ".join(f"exit {c}: {n}" for c, n in sorted(d["exit_codes"].items()))
            parts.append(f"  {kind}: {d['n']} ({found}" + (f"; {codes}" if codes else "") + ")")
        out.append("\ndisk faults, and what the nodes found:\n" + "\n".join(parts)
                   + f"\n  ({dk.get('critical_lines_expected', 0)} CRITICAL disk-check/storage lines from the damaged nodes, expected)")
    pl = r.get("power_loss")
    if pl:
        out.append(f"\npower loss: {pl['cuts']} cut(s) of every node ({pl['cuts_with_unsynced_bytes']} with unsynced "
                   f"journal bytes), rolled back to the last durable point: {pl['entries_dropped']} journal entries, "
                   f"{pl['bytes_dropped']} bytes dropped (at most {pl['max_entries_dropped_on_a_node']} on one node)"
                   + (f"; {pl['restore_errors']} restore error(s)" if pl.get("restore_errors") else ""))
        if r["durability"] == "memory":
            out.append(f"  lost after power loss (memory mode, expected): {pl['lost_after_power_loss']} acknowledged "
                       f"job(s); other effects of lost writes (not violations): "
                       + (", ".join(f"{k} {v}" for k, v in pl["expected_by_invariant"].items() if k != "lost") or "none"))
    return out


def _invariants_section(r: dict) -> list[str]:
    out = [f"\ninvariants ({len(r['invariants'])})"]
    for inv in r["invariants"]:
        mark = "PASS" if inv["ok"] else "FAIL"
        extra = f" (skipped: {inv['skipped']})" if inv.get("skipped") else ""
        if inv.get("expected_after_power_loss"):
            extra += f" [+{inv['expected_after_power_loss']} after power loss, memory mode: expected]"
        out.append(f"  {mark} {inv['name']:28} {inv['count']:>5}  {inv['about']}{extra}")
        for ex in inv["examples"]:
            out.append(f"         e.g. {json.dumps(ex, default=str)[:300]}")
    return out


def format_report(r: dict) -> str:
    out = [r.get("verdict") or verdict(r),
           f"\nraftq chaos: seed {r['seed']}, {r['nodes']} nodes, durability {r['durability']}, "
           f"{r['duration_s']:.0f} s of faults (elapsed {r.get('elapsed_s', 0):.0f} s)"]
    out += _faults_section(r) + _ops_section(r) + _liveness_section(r) + _disk_and_power_section(r)
    out += _invariants_section(r)
    result = "PASS" if r["valid"] else f"FAIL: {r['violations']} violation(s)"
    out.append(f"\nresult: {result}" + (f"; run directory kept: {r['dir']}" if r.get("dir") else ""))
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftq chaos", description="Chaos test a local raftq cluster: faults, a "
                                "recorded workload, and a check of every invariant. The report opens with the "
                                "verdict (PASS or FAIL: acknowledged jobs lost, fencing violations); exit status 0 "
                                "on PASS, 1 on any violation, 2 when the run could not be set up.")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of faults (default 60)")
    p.add_argument("--nodes", type=int, default=3, choices=(3, 5), help="cluster size (default %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="replay a schedule (default: random, printed)")
    p.add_argument("--faults", default="all", help=f"comma-separated kinds or groups; 'all' = {','.join(KINDS)}; "
                   f"opt-in (only when listed, e.g. all,power-loss,disk): {','.join(k for k in ALL_KINDS if k not in KINDS)}; "
                   f"'disk' = {','.join(GROUPS['disk'])}")
    p.add_argument("--writeback", type=float, default=None,
                   help="memory mode, power-loss: seconds between simulated page-cache writebacks (default "
                        f"{sync_shadow.DEFAULT_WRITEBACK_S:g}; Linux writes dirty pages back after 5-30 s)")
    p.add_argument("--durability", choices=("fsync", "memory"), default="fsync",
                   help="the nodes' durability mode (default %(default)s; memory mode loses acknowledged jobs to a "
                        "power cut, which the report counts apart as expected)")
    p.add_argument("--raft-engine", choices=("thread", "loop"), default=None,
                   help="the nodes' tuning.raft_engine (docs/cluster.md \"Raft engines\"); default: the setting's")
    p.add_argument("--dir", default=None, help="run directory (kept); default: a temporary one, removed if the run passes")
    p.add_argument("--keep", action="store_true", help="keep the temporary run directory")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quiet-period", default=None, help="quiet time between fault steps, MIN,MAX seconds (default 2,6)")
    p.add_argument("--mix", type=float, default=None, help="probability that a step mixes faults (default 0.35)")
    p.add_argument("--producers", type=int, default=None,
                   help=f"producer tasks of the workload (default {WorkloadConfig.producers})")
    p.add_argument("--workers", type=int, default=None,
                   help=f"worker tasks of the workload (default {WorkloadConfig.workers})")
    p.add_argument("--no-gates", action="store_true", help="leave out the gated queues (throttles, a circuit "
                   "breaker, an execution window) and releases")
    p.add_argument("--no-schedules", action="store_true", help="leave out the schedules (one tick a second, one per "
                   "catch-up policy) and their checks")
    p.add_argument("--no-keys", action="store_true", help="leave out the keyed queues (per-key concurrency and rate "
                   "limits, a queue-wide rate) and their checks")
    p.add_argument("--no-workflows", action="store_true", help="leave out the workflow graphs (chains and fan-ins "
                   "of dependent jobs) and their checks")
    p.add_argument("--no-batches", action="store_true", help="leave out the batches with callbacks and their checks")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    return p


def options_from_args(args) -> ChaosOptions:
    kinds: list = []
    for k in (x.strip() for x in (args.faults or "all").split(",")):
        for kind in (GROUPS[k] if k in GROUPS else (k,) if k else ()):
            if kind not in kinds:
                kinds.append(kind)
    kinds = tuple(kinds)
    unknown = [k for k in kinds if k not in ALL_KINDS]
    if unknown:
        raise SystemExit(f"raftq chaos: unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(ALL_KINDS)}")
    opts = ChaosOptions(duration=args.duration, nodes=args.nodes, seed=args.seed, faults=kinds,
                        durability=args.durability, dir=args.dir, keep=args.keep, progress=not args.no_progress)
    if args.quiet_period:
        lo, hi = (float(x) for x in args.quiet_period.split(","))
        opts.schedule.quiet_s = (lo, hi)
    if args.mix is not None:
        opts.schedule.mix_prob = args.mix
    if args.writeback is not None:
        opts.writeback_s = args.writeback
    if args.producers is not None:
        opts.workload.producers = args.producers
    if args.workers is not None:
        opts.workload.workers = args.workers
    if args.no_gates:
        opts.workload.gated = False
    if args.no_schedules:
        opts.workload.schedules = False
    if args.no_keys:
        opts.workload.keys = False
    if args.no_workflows:
        opts.workload.workflows = False
    if args.no_batches:
        opts.workload.batches = False
    if args.raft_engine:
        opts.tuning["raft_engine"] = args.raft_engine
    return opts


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    opts = options_from_args(args)
    try:
        report = asyncio.run(run_chaos(opts))
    except KeyboardInterrupt:
        print("raftq chaos: interrupted", file=sys.stderr)
        return 2
    except (TimeoutError, OSError) as e:
        print(f"raftq chaos: the run could not be set up: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(format_report(report))
    return 0 if report.get("valid") else 1
