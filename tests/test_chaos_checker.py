"""The chaos checker's whole result on one synthetic history that breaks many invariants at once
(cluster/chaos/checker.py; docs/chaos.md "Invariants"): every invariant's name, order, count,
examples, skip reason and power-cut excuses, as a golden record. tests/test_chaos.py holds each
invariant alone on its own history; this one holds the result as a whole, so that a change to
how `check` is put together (not to what it judges) shows here as any difference at all."""
from __future__ import annotations

import hashlib
import json

from raftq.cluster.chaos.checker import INVARIANTS, check

RETRY = {"retry_delay_ms": 100, "retry_backoff": "exponential", "retry_delay_max_ms": 1000,
         "max_schedule_horizon_ms": 2_592_000_000}


class H:
    """A tiny history builder (the one of tests/test_chaos.py): times explicit, ids in order."""

    def __init__(self):
        self.ops = []

    def op(self, f, t0, t1, outcome="ok", **kw):
        op = {"id": len(self.ops), "proc": kw.pop("proc", "p"), "f": f, "t0": t0, "t1": t1,
              "w0": int(1_000_000 + t0 * 1000), "w1": int(1_000_000 + t1 * 1000), "outcome": outcome, **kw}
        self.ops.append(op)
        return op

    def enq(self, value, job_id=None, t=(0.0, 0.1), outcome="ok", key=None, dedup=False, queue="a",
            max_attempts=3, scheduled_at=None, tenant=None):
        item = {"value": value, "key": key, "queue": queue, "job_type": "work", "max_attempts": max_attempts,
                "scheduled_at": scheduled_at, "delay_ms": None, "tenant": tenant}
        kw = {"items": [item], "batch": False}
        if outcome == "ok":
            kw["results"] = [{"job_id": job_id, "dedup": dedup}]
        return self.op("enqueue", *t, outcome, **kw)

    @staticmethod
    def job(job_id, attempt, value, lease_expires=1_002_000, key=None, queue="a", max_attempts=3,
            scheduled_at=None, releases=0, resource=None, tenant=None):
        return {"job_id": job_id, "attempt": attempt, "max_attempts": max_attempts, "queue": queue,
                "job_type": "work", "value": value, "key": key, "lease_expires": lease_expires,
                "scheduled_at": scheduled_at, "enqueued_at": 1_000_000, "releases": releases,
                "resource": resource, "tenant": tenant}

    def res(self, jobs, t=(0.2, 0.3), lease_ms=2000):
        return self.op("reserve", *t, lease_ms=lease_ms, jobs=jobs)

    def settle(self, f, job_id, attempt, t=(0.4, 0.5), outcome="ok", **kw):
        return self.op(f, *t, outcome, job_id=job_id, attempt=attempt, **kw)

    def nack(self, job_id, attempt, t=(0.4, 0.5), outcome="ok", strategy="default", delay_ms=None,
             reason=None, dead=False, max_attempts=3):
        kw = {"strategy": strategy, "delay_ms": delay_ms, "reason": reason or f"r-{job_id}-{attempt}",
              "max_attempts": max_attempts}
        if outcome == "ok":
            kw["dead_lettered"] = dead
        return self.settle("nack", job_id, attempt, t, outcome, **kw)


def dl(job_id, value, cause, final_attempt, reason=None, max_attempts=3, failed_at=1_005_000):
    return {"job_id": job_id, "cause": cause, "final_attempt": final_attempt, "last_reason": reason,
            "failed_at": failed_at, "value": value, "key": None, "queue": "a", "job_type": "work",
            "max_attempts": max_attempts, "attempt": final_attempt}


GATES = {"resource_limits": {"r0": 1}, "circuit": {"queue": "cb", "failures": 1, "open_ms": 1500},
         "windows": {"queue": "win", "open": [[1_000_000, 1_001_000]]}}
KEYS = {"kq": {"key_concurrency": 1, "key_rate": {"count": 1, "period_ms": 1000},
               "rate": {"count": 2, "period_ms": 1000}}}
# One memory-mode power cut: what was answered from wall ms 1_020_000 (t = 20 s) until the
# restart at t = 30 s may have been erased.
CUTS = [{"kind": "power-loss", "durability": "memory", "durable_from_wall_ms": 1_020_000, "t_restart": 30.0,
         "w_cut": 1_025_000, "t_inject": 25.0}]


def history() -> tuple[H, list]:
    h = H()
    # lost: an ok enqueue never acked; and one a power cut erased (expected)
    h.enq("lost1", "jl1")
    h.enq("cut1", "jc1", t=(20.0, 20.5))
    h.res([h.job("jc1", 1, "cut1", lease_expires=1_024_000)], t=(21.0, 21.1))
    # unexpected: a delivered value nobody enqueued (acked, so only unexpected)
    h.res([h.job("ju", 1, "ghost")], t=(0.2, 0.3))
    h.settle("ack", "ju", 1)
    # duplicate_jobs: one value as two jobs
    h.enq("dup", "jd1")
    h.enq("dup", "jd2", t=(0.1, 0.2))
    for jid in ("jd1", "jd2"):
        h.res([h.job(jid, 1, "dup")], t=(0.3, 0.35))
        h.settle("ack", jid, 1, t=(0.5, 0.6))
    # idempotency: one key, two fresh answers
    h.enq("k1", "jk1", key="idem")
    h.enq("k2", "jk2", key="idem")
    for jid, v in (("jk1", "k1"), ("jk2", "k2")):
        h.res([h.job(jid, 1, v, key="idem")], t=(0.3, 0.35))
        h.settle("ack", jid, 1, t=(0.5, 0.6))
    # redelivery_attempts + stale_attempt + no_delivery_after_ack on one job
    h.enq("r", "jr")
    h.res([h.job("jr", 2, "r")], t=(0.2, 0.3))
    h.res([h.job("jr", 1, "r", lease_expires=1_003_000)], t=(1.0, 1.1))
    h.settle("ack", "jr", 1, t=(1.2, 1.3))
    h.res([h.job("jr", 3, "r", lease_expires=1_009_000)], t=(1.5, 1.6))
    h.settle("ack", "jr", 3, t=(1.7, 1.8))
    # attempts_bound + release_uses_no_attempt
    h.enq("b", "jb", max_attempts=1)
    h.res([h.job("jb", 1, "b", max_attempts=1)], t=(0.2, 0.3))
    h.settle("release", "jb", 1, delay_ms=0, releases=0)
    h.res([h.job("jb", 2, "b", max_attempts=1, releases=0, lease_expires=1_004_000)], t=(0.6, 0.7))
    h.settle("ack", "jb", 2, t=(0.8, 0.9))
    # schedule: leased before its time (replicated and wall)
    h.enq("s", "js", scheduled_at=1_050_000)
    h.res([h.job("js", 1, "s", scheduled_at=1_050_000)], t=(0.2, 0.3))
    h.settle("ack", "js", 1)
    # retry_delay: a delayed nack redelivered early; lease_honoured: a lease expired early
    h.enq("d", "jdl")
    h.res([h.job("jdl", 1, "d")], t=(0.2, 0.3))
    h.nack("jdl", 1, strategy="delay", delay_ms=5000)
    h.res([h.job("jdl", 2, "d", lease_expires=1_003_000)], t=(1.0, 1.1))
    h.settle("ack", "jdl", 2, t=(1.2, 1.3))
    h.enq("e", "je")
    h.res([h.job("je", 1, "e", lease_expires=1_005_000)], t=(0.2, 0.3))
    h.res([h.job("je", 2, "e", lease_expires=1_004_500)], t=(1.0, 1.1))
    h.settle("ack", "je", 2, t=(1.2, 1.3))
    # dead_letters: a rejected dead letter without its nack, and an ok dead-lettering nack without one
    h.enq("x", "jx")
    h.res([h.job("jx", 1, "x")])
    h.enq("y", "jy", max_attempts=1)
    h.res([h.job("jy", 1, "y", max_attempts=1)])
    h.nack("jy", 1, reason="boom", dead=True, max_attempts=1)
    # gates: a resource over its limit, a second delivery while the breaker is open, a closed window
    for v in ("g1", "g2"):
        h.enq(v, "j" + v, queue="thr")
    h.res([h.job("jg1", 1, "g1", queue="thr", resource="r0"), h.job("jg2", 1, "g2", queue="thr", resource="r0")])
    for v in ("g1", "g2"):
        h.settle("ack", "j" + v, 1, t=(0.7, 0.8))
    h.enq("c1", "jc1x", queue="cb", max_attempts=5)
    h.enq("c2", "jc2", queue="cb", max_attempts=5)
    h.res([h.job("jc1x", 1, "c1", queue="cb", max_attempts=5)], t=(0.2, 0.3))
    h.nack("jc1x", 1, t=(0.4, 0.5), max_attempts=5)
    h.res([h.job("jc2", 1, "c2", queue="cb", max_attempts=5, lease_expires=1_002_600)], t=(0.6, 0.7))
    h.res([h.job("jc1x", 2, "c1", queue="cb", max_attempts=5, lease_expires=1_002_700)], t=(0.8, 0.9))
    h.settle("ack", "jc2", 1, t=(1.0, 1.1))
    h.settle("ack", "jc1x", 2, t=(1.0, 1.1))
    h.enq("w", "jw", queue="win")
    h.res([h.job("jw", 1, "w", queue="win", lease_expires=1_030_000)], t=(0.2, 0.3), lease_ms=2000)
    h.settle("ack", "jw", 1)
    # keys: two jobs of one key in flight at once, over the key rate and the queue rate
    for v in ("q1", "q2", "q3"):
        h.enq(v, "j" + v, queue="kq", tenant="t0")
    h.res([h.job("jq1", 1, "q1", queue="kq", tenant="t0"), h.job("jq2", 1, "q2", queue="kq", tenant="t0"),
           h.job("jq3", 1, "q3", queue="kq", tenant="t0", lease_expires=1_002_100)])
    for v in ("q1", "q2", "q3"):
        h.settle("ack", "j" + v, 1, t=(0.7, 0.8))
    # schedules: two jobs for one tick, a tick missing under `all` (its `fired` is not judged: the
    # final drain did not finish)
    h.op("schedule_put", 0.0, 0.01, proc="sched", name="s-all", queue="sched", every_ms=1000, catchup="all",
         misfire_after_ms=600_000, next_fire_at_ms=1_001_000)
    for jid, tick in (("t1", 1_001_000), ("t1b", 1_001_000), ("t3", 1_003_000)):
        job = {"job_id": jid, "attempt": 1, "max_attempts": 3, "queue": "sched", "job_type": "tick", "value": None,
               "key": None, "lease_expires": tick + 2020, "scheduled_at": None, "enqueued_at": tick + 20,
               "releases": 0, "resource": None, "schedule": "s-all", "tick": tick}
        h.res([job], t=(2.0, 2.05))
        h.settle("ack", jid, 1, t=(2.1, 2.2))
    h.op("schedule_views", 50.0, 50.1, proc="drain", schedules=[{"name": "s-all", "fired": 5, "paused": True}])
    # no_internal_errors
    h.op("enqueue", 3.0, 3.1, "fail", error="internal", items=[{"value": "i", "key": None, "queue": "a"}])
    dead = [dl("jx", "x", "rejected", 1, "nope")]
    return h, dead


def result() -> dict:
    h, dead = history()
    return check(
        h.ops, dead_letters=dead, retry=RETRY, gates=GATES, keys=KEYS, power_losses=CUTS, clock_lag_ms=0,
        drain={"ok": False, "queues": [{"name": "a", "ready": 1, "scheduled": 0, "in_flight": 0}]},
        views=[{"node_id": "n1", "last_applied": 9, "digest": "aa", "state": {"jobs": 0}},
               {"node_id": "n2", "last_applied": 9, "digest": "bb", "state": {"jobs": 2}}, None],
        leader_claims={1: ["n1"], 2: ["n1", "n2"]},
        liveness={"leader_after_heal_s": 12.0, "leader_bound_s": 10.0, "lease_probe": {"ok": False}},
        internal_errors=[{"node": "n1", "why": "internal"}],
        node_logs={"critical_by_node": {"n1": ["CRITICAL truncating", "disk check: journal_truncated"],
                                        "n2": ["disk check: snapshot_received_damaged x"]}},
        disk_faults=[{"id": 1, "kind": "bitflip", "node": "n3", "found": False, "file": "journal", "bits": 2},
                     {"id": 2, "kind": "fsync-eio", "node": "n3", "exit_code": 1, "logged": False},
                     {"id": 3, "kind": "disk-full", "node": "n2", "exit_code": 0}],
        untrusted_claims=[{"node": "n3", "term": 2}])


# name -> (count, expected_after_power_loss or None, skipped or None), in the report's order
GOLDEN = {
    "lost": (2, 1, None),
    "unexpected": (1, None, None),
    "duplicate_jobs": (1, None, None),
    "idempotency": (2, None, None),
    "redelivery_attempts": (1, None, None),
    "stale_attempt": (1, None, None),
    "no_delivery_after_ack": (3, None, None),
    "attempts_bound": (1, None, None),
    "release_uses_no_attempt": (1, None, None),
    "throttle_limit": (2, None, None),
    "circuit_open": (2, None, None),
    "window_closed": (1, None, None),
    "key_concurrency_held": (3, None, None),
    "key_rate_held": (2, None, None),
    "queue_rate_held": (1, None, None),
    "schedule": (2, None, None),
    "one_job_per_tick": (1, None, None),
    "no_tick_missed": (1, None, None),
    "retry_delay": (1, None, None),
    "lease_honoured": (2, None, None),
    "dead_letters": (2, None, None),
    "drained": (3, None, None),
    "replicas_agree": (2, None, None),
    "one_leader_per_term": (1, None, None),
    "liveness": (2, None, None),
    "no_internal_errors": (2, None, None),
    "no_critical_node_logs": (2, None, None),
    "checksum_failures_contained": (4, None, None),
    "failed_writes_stop": (2, None, None),
}
# sha256 of the whole result (invariants with their examples, stats, failures) as canonical JSON
GOLDEN_SHA256 = "cf1daa6a162d8e43022c16ec3771815b8addde1513f9fb0263ccf50e305b5a54"


def canonical(r: dict) -> str:
    return json.dumps(r, sort_keys=True, default=repr)


def test_every_invariant_is_broken_as_recorded():
    r = result()
    assert not r["valid"]
    got = {i["name"]: (i["count"], i.get("expected_after_power_loss"), i.get("skipped")) for i in r["invariants"]}
    assert list(got) == [name for name, _ in INVARIANTS] == list(GOLDEN)
    assert got == GOLDEN


def test_the_whole_result_is_unchanged():
    assert hashlib.sha256(canonical(result()).encode()).hexdigest() == GOLDEN_SHA256
