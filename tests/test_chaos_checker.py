"""The chaos checker's whole result on one synthetic history that breaks many invariants at once
(cluster/chaos/checker.py; docs/chaos.md "Invariants"): every invariant's name, order, count,
examples, skip reason and power-cut excuses, as a golden record. tests/test_chaos.py holds each
invariant alone on its own history; this one holds the result as a whole, so that a change to
how `check` is put together (not to what it judges) shows here as any difference at all. The
workflow judges (dependents_wait, dependency_failed_never_runs, fan_in_runs_once) are also held
one by one here, at the end, each on histories that keep to it and on ones that break it, and so
are the batch judges (batch_callbacks_once, callback_after_members). The golden history's batch
events come last but one; without them and the two batch judges (and the stats' batches) the
result hashes to the hash of before them, e68a251d..."""
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
    # workflows: a dependent handed out before its dependency's ack was invoked; a success
    # dependent of a dead letter handed out; a fan-in handed out before its last member ended
    graph(h, [("wa", "jwa", []), ("wb", "jwb", [["wa", "success"]])], gid="gw1")
    h.res([step("jwa", 1, "wa"), step("jwb", 1, "wb", {"jwa": "success"})], t=(0.2, 0.3))
    h.settle("ack", "jwa", 1, t=(0.4, 0.5))
    h.settle("ack", "jwb", 1, t=(0.4, 0.5))
    graph(h, [("wc", "jwc", []), ("wd", "jwd", [["wc", "success"]])], gid="gw2")
    h.res([step("jwc", 1, "wc")], t=(0.2, 0.3))
    h.nack("jwc", 1, strategy="dead_letter", reason="wno", dead=True)
    h.res([step("jwd", 1, "wd", {"jwc": "success"}, lease_expires=1_002_700)], t=(0.6, 0.7))
    h.settle("ack", "jwd", 1, t=(0.8, 0.9))
    graph(h, [("we", "jwe", []), ("wf", "jwf", []), ("wg", "jwg", [["we", "success"], ["wf", "complete"]])],
          gid="gw3", shape="fan-in")
    h.res([step("jwe", 1, "we"), step("jwf", 1, "wf")], t=(0.2, 0.3))
    h.settle("ack", "jwe", 1, t=(0.4, 0.5))
    h.res([step("jwg", 1, "wg", {"jwe": "success", "jwf": "complete"}, lease_expires=1_002_600)], t=(0.55, 0.6))
    h.settle("ack", "jwf", 1, t=(0.7, 0.8))
    h.settle("ack", "jwg", 1, t=(0.7, 0.8))
    # batches: an on_complete handed out before the members' acks were invoked; two on_success jobs
    batch_op(h, "B1", [("bv1", "jbm1"), ("bv2", "jbm2")])
    h.res([member("jbm1", 1, "bv1"), member("jbm2", 1, "bv2")], t=(0.2, 0.3))
    h.res([callback("jcb1", "B1", "on_complete")], t=(0.5, 0.6))
    h.settle("ack", "jbm1", 1, t=(0.8, 0.9))
    h.settle("ack", "jbm2", 1, t=(0.8, 0.9))
    h.res([callback("jcb2", "B1", "on_success"), callback("jcb3", "B1", "on_success")], t=(1.0, 1.1))
    for jid in ("jcb1", "jcb2", "jcb3"):
        h.settle("ack", jid, 1, t=(1.2, 1.3))
    # no_internal_errors
    h.op("enqueue", 3.0, 3.1, "fail", error="internal", items=[{"value": "i", "key": None, "queue": "a"}])
    dead = [dl("jx", "x", "rejected", 1, "nope"), wf_dl("jwc", "wc", "rejected", 1, "wno", failed_at=1_000_450)]
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
    "dependents_wait": (2, None, None),
    "dependency_failed_never_runs": (1, None, None),
    "fan_in_runs_once": (1, None, None),
    "batch_callbacks_once": (1, None, None),
    "callback_after_members": (1, None, None),
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
GOLDEN_SHA256 = "21fe017bc388db6132f2eb83909041102465bca7ed68703590e588627c26239d"


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


# ---------------------------------------------------------------------------- workflows
# Each judge of the workflow graphs (docs/chaos.md "Workflows") on a history that keeps to it and
# on ones that break it; every other invariant holds on them.
DRAINED = {"ok": True, "queues": []}


def graph(h: H, jobs, t=(0.0, 0.1), outcome="ok", gid="g0", shape="chain"):
    """One atomic graph enqueue: jobs [(value, job id, [[dependency value, policy], ...])]."""
    items = [{"value": v, "key": None, "queue": "wf", "job_type": "step", "max_attempts": 3, "scheduled_at": None,
              "delay_ms": None, "graph": gid, "shape": shape, "ref": f"s{i}", "deps": [list(d) for d in deps]}
             for i, (v, _, deps) in enumerate(jobs)]
    kw = {"items": items, "batch": True, "atomic": True}
    if outcome == "ok":
        kw["results"] = [{"job_id": jid, "dedup": False} for _, jid, _ in jobs]
    return h.op("enqueue", *t, outcome, **kw)


def step(job_id, attempt, value, depends_on=None, lease_expires=1_002_000, max_attempts=3):
    """A delivered workflow job, showing its dependencies {id: policy} as the cluster does."""
    j = H.job(job_id, attempt, value, lease_expires=lease_expires, queue="wf", max_attempts=max_attempts)
    j["job_type"] = "step"
    j["depends_on"] = [{"job_id": d, "policy": p} for d, p in (depends_on or {}).items()] or None
    return j


def wf_dl(job_id, value, cause, final_attempt, reason=None, failed_at=1_005_000, depends_on=None, max_attempts=3):
    rec = dl(job_id, value, cause, final_attempt, reason, failed_at=failed_at, max_attempts=max_attempts)
    rec.update(queue="wf", job_type="step",
               depends_on=[{"job_id": d, "policy": p} for d, p in (depends_on or {}).items()] or None)
    return rec


def wf_check(h: H, dead=(), drain=DRAINED) -> dict:
    return check(h.ops, dead_letters=list(dead), retry=RETRY, drain=drain)


def broken(r: dict) -> dict:
    """name -> count of every invariant that failed."""
    return {i["name"]: i["count"] for i in r["invariants"] if not i["ok"]}


def test_dependents_wait_holds_within_the_histories_uncertainty():
    h = H()
    graph(h, [("a", "ja", []), ("b", "jb", [["a", "success"]]), ("c", "jc", [["b", "complete"]])])
    h.res([step("ja", 1, "a")], t=(0.2, 0.3))
    # b's hand-out was answered (0.5) after a's ack was invoked (0.45), before that ack's answer
    # (0.6): the ack may well have been applied first, so nothing is certain, nothing is caught.
    h.settle("ack", "ja", 1, t=(0.45, 0.6))
    h.res([step("jb", 1, "b", {"ja": "success"}, lease_expires=1_002_400, max_attempts=1)], t=(0.4, 0.5))
    # b's lease lapses at its last attempt: the sweep dead-letters it (lease_expired, no op) at
    # 1_004_500; c (complete) is handed out no earlier on the replicated clock, though the
    # zombie's late ack of b is invoked after c's hand-out.
    h.res([step("jc", 1, "c", {"jb": "complete"}, lease_expires=1_006_500)], t=(4.5, 4.6))
    h.settle("ack", "jb", 1, t=(5.0, 5.1), outcome="fail", error="job_not_found")
    h.settle("ack", "jc", 1, t=(4.7, 4.8))
    dead = [wf_dl("jb", "b", "lease_expired", 1, failed_at=1_004_500, depends_on={"ja": "success"}, max_attempts=1)]
    r = wf_check(h, dead)
    assert r["valid"], broken(r)
    assert r["stats"]["workflows"]["dependents_handed_out"] == 2
    assert r["stats"]["workflows"]["ran_past_a_dead_dependency"] == 1


def test_a_dependent_handed_out_before_its_dependency_ended_is_caught():
    h = H()
    graph(h, [("a", "ja", []), ("b", "jb", [["a", "success"]])])
    h.res([step("ja", 1, "a"), step("jb", 1, "b", {"ja": "success"})], t=(0.2, 0.3))
    h.settle("ack", "ja", 1, t=(0.35, 0.4))           # invoked after b's hand-out was answered
    h.settle("ack", "jb", 1, t=(0.5, 0.6))
    r = wf_check(h)
    assert broken(r) == {"dependents_wait": 1}
    ex = [i for i in r["invariants"] if i["name"] == "dependents_wait"][0]["examples"][0]
    assert ex["job_id"] == "jb" and ex["dependency"] == "ja" and ex["clock"] == "history"
    # On the replicated clock: handed out (stamp 1_004_000) before its complete dependency was
    # dead-lettered by the sweep (1_004_500), which no op of the history bounds.
    h = H()
    graph(h, [("a", "ja", []), ("b", "jb", [["a", "complete"]])])
    h.res([step("ja", 1, "a", max_attempts=1)], t=(0.2, 0.3))
    h.res([step("jb", 1, "b", {"ja": "complete"}, lease_expires=1_006_000)], t=(4.0, 4.1))
    h.settle("ack", "jb", 1, t=(4.2, 4.3))
    r = wf_check(h, [wf_dl("ja", "a", "lease_expired", 1, failed_at=1_004_500, max_attempts=1)])
    assert broken(r) == {"dependents_wait": 1}
    # Shown with other dependencies than its enqueue asked for.
    h = H()
    graph(h, [("a", "ja", []), ("b", "jb", [["a", "success"]])])
    h.res([step("ja", 1, "a")], t=(0.2, 0.3))
    h.settle("ack", "ja", 1, t=(0.4, 0.5))
    h.res([step("jb", 1, "b", {"ja": "ignore"})], t=(0.6, 0.7))
    h.settle("ack", "jb", 1, t=(0.8, 0.9))
    assert broken(wf_check(h)) == {"dependents_wait": 1}


def test_a_failed_dependency_fails_its_success_dependents_down_the_chain():
    h = H()
    graph(h, [("a", "ja", []), ("b", "jb", [["a", "success"]]), ("c", "jc", [["b", "success"]]),
              ("d", "jd", [["a", "complete"]])])
    h.res([step("ja", 1, "a")], t=(0.2, 0.3))
    h.nack("ja", 1, t=(0.4, 0.5), strategy="dead_letter", reason="no", dead=True)
    h.res([step("jd", 1, "d", {"ja": "complete"}, lease_expires=1_002_600)], t=(0.55, 0.6))     # complete: runs
    h.settle("ack", "jd", 1, t=(0.7, 0.8))
    dead = [wf_dl("ja", "a", "rejected", 1, "no", failed_at=1_000_450),
            wf_dl("jb", "b", "dependency_failed", 1, failed_at=1_000_450, depends_on={"ja": "success"}),
            wf_dl("jc", "c", "dependency_failed", 1, failed_at=1_000_450, depends_on={"jb": "success"})]
    r = wf_check(h, dead)
    assert r["valid"], broken(r)
    wf = r["stats"]["workflows"]
    assert wf["dependency_failed"] == 2 and wf["dependency_failed_transitive"] == 1


def test_a_success_dependent_of_a_dead_letter_that_runs_or_ends_otherwise_is_caught():
    h = H()
    graph(h, [("a", "ja", []), ("b", "jb", [["a", "success"]]), ("c", "jc", [["a", "success"]])])
    h.res([step("ja", 1, "a")], t=(0.2, 0.3))
    h.nack("ja", 1, t=(0.4, 0.5), strategy="dead_letter", reason="no", dead=True)
    h.res([step("jb", 1, "b", {"ja": "success"}, lease_expires=1_002_600)], t=(0.55, 0.6))       # ran anyway
    h.settle("ack", "jb", 1, t=(0.7, 0.8))
    # b: handed out, and ended acked instead of dependency_failed; c: no dead letter at all
    r = wf_check(h, [wf_dl("ja", "a", "rejected", 1, "no", failed_at=1_000_450)])
    assert broken(r) == {"dependency_failed_never_runs": 3, "lost": 1}
    # a dependency_failed dead letter of a job whose only dependency was acked
    h = H()
    graph(h, [("a", "ja", []), ("b", "jb", [["a", "success"]])])
    h.res([step("ja", 1, "a")], t=(0.2, 0.3))
    h.settle("ack", "ja", 1, t=(0.4, 0.5))
    r = wf_check(h, [wf_dl("jb", "b", "dependency_failed", 1, failed_at=1_000_450, depends_on={"ja": "success"})])
    assert broken(r) == {"dependency_failed_never_runs": 1}


def fan_in(h: H, policies=("success", "complete", "success")):
    """Members m0..m2 and f depending on all of them, enqueued at once."""
    members = [(f"m{i}", f"jm{i}", []) for i in range(len(policies))]
    graph(h, members + [("f", "jf", [[f"m{i}", p] for i, p in enumerate(policies)])], shape="fan-in")
    return {f"jm{i}": p for i, p in enumerate(policies)}


def test_a_fan_in_runs_once_after_its_last_member_ended():
    h = H()
    deps = fan_in(h)
    h.res([step("jm0", 1, "m0"), step("jm1", 1, "m1"), step("jm2", 1, "m2")], t=(0.2, 0.3))
    h.settle("ack", "jm0", 1, t=(0.4, 0.5))
    h.nack("jm1", 1, t=(0.4, 0.5), strategy="dead_letter", reason="no", dead=True)   # complete: f still runs
    h.settle("ack", "jm2", 1, t=(0.9, 1.0))
    h.res([step("jf", 1, "f", deps, lease_expires=1_003_050)], t=(1.0, 1.05))
    h.nack("jf", 1, t=(1.1, 1.2))                                        # retried: attempt 2 is not a second first
    h.res([step("jf", 2, "f", deps, lease_expires=1_004_500)], t=(2.4, 2.5))
    h.settle("ack", "jf", 2, t=(2.6, 2.7))
    r = wf_check(h, [wf_dl("jm1", "m1", "rejected", 1, "no", failed_at=1_000_450)])
    assert r["valid"], broken(r)
    wf = r["stats"]["workflows"]
    assert (wf["fan_ins"], wf["fan_ins_handed_out"], wf["fan_ins_failed"]) == (1, 1, 0)


def test_a_fan_in_early_twice_stuck_or_failed_is_caught():
    # handed out before its last member's ack was invoked (dependents_wait sees it too)
    h = H()
    deps = fan_in(h)
    h.res([step("jm0", 1, "m0"), step("jm1", 1, "m1"), step("jm2", 1, "m2")], t=(0.2, 0.3))
    h.settle("ack", "jm0", 1, t=(0.4, 0.5))
    h.settle("ack", "jm1", 1, t=(0.4, 0.5))
    h.res([step("jf", 1, "f", deps)], t=(0.6, 0.7))
    h.settle("ack", "jm2", 1, t=(0.8, 0.9))
    h.settle("ack", "jf", 1, t=(1.0, 1.1))
    assert broken(wf_check(h)) == {"dependents_wait": 1, "fan_in_runs_once": 1}
    # its first attempt handed out twice (redelivery_attempts sees it too)
    h = H()
    deps = fan_in(h)
    h.res([step("jm0", 1, "m0"), step("jm1", 1, "m1"), step("jm2", 1, "m2")], t=(0.2, 0.3))
    for i in range(3):
        h.settle("ack", f"jm{i}", 1, t=(0.4, 0.5))
    h.res([step("jf", 1, "f", deps)], t=(0.6, 0.7))
    h.res([step("jf", 1, "f", deps)], t=(0.8, 0.9))
    h.settle("ack", "jf", 1, t=(1.0, 1.1))
    assert broken(wf_check(h)) == {"redelivery_attempts": 1, "fan_in_runs_once": 1}
    # every member acked, the drain done, and it never ran (lost sees it too); then one that
    # ended dependency_failed though only a complete member failed
    h = H()
    fan_in(h)
    h.res([step("jm0", 1, "m0"), step("jm1", 1, "m1"), step("jm2", 1, "m2")], t=(0.2, 0.3))
    for i in range(3):
        h.settle("ack", f"jm{i}", 1, t=(0.4, 0.5))
    assert broken(wf_check(h)) == {"lost": 1, "fan_in_runs_once": 1}
    h = H()
    deps = fan_in(h)
    h.res([step("jm0", 1, "m0"), step("jm1", 1, "m1"), step("jm2", 1, "m2")], t=(0.2, 0.3))
    h.settle("ack", "jm0", 1, t=(0.4, 0.5))
    h.nack("jm1", 1, t=(0.4, 0.5), strategy="dead_letter", reason="no", dead=True)
    h.settle("ack", "jm2", 1, t=(0.4, 0.5))
    r = wf_check(h, [wf_dl("jm1", "m1", "rejected", 1, "no", failed_at=1_000_450),
                     wf_dl("jf", "f", "dependency_failed", 1, failed_at=1_000_450, depends_on=deps)])
    assert broken(r) == {"dependency_failed_never_runs": 1, "fan_in_runs_once": 1}


def test_the_workflow_judges_are_skipped_without_workflows():
    h = H()
    h.enq("v", "j")
    h.res([h.job("j", 1, "v")])
    h.settle("ack", "j", 1)
    r = wf_check(h)
    skipped = {i["name"]: i.get("skipped") for i in r["invariants"]}
    assert r["valid"] and r["stats"]["workflows"] is None
    assert {skipped[n] for n in ("dependents_wait", "dependency_failed_never_runs", "fan_in_runs_once")} == \
        {"no workflows in the run"}


def test_the_graphs_the_workflow_producer_builds_and_the_no_workflows_switch():
    import random

    from raftq.cluster.chaos.runner import build_parser, options_from_args
    from raftq.cluster.chaos.workload import WORKFLOW_QUEUE, History, Workload

    assert options_from_args(build_parser().parse_args([])).workload.workflows
    assert not options_from_args(build_parser().parse_args(["--no-workflows"])).workload.workflows
    w, rng, n, shapes = Workload(["http://x"], History(), 1), random.Random(3), 0, set()
    for k in range(60):
        shape, reqs, recs = w._graph(rng, "wp0", n, f"g{k}")
        n += len(reqs)
        shapes.add(shape)
        values = [r["value"] for r in recs]
        assert len(set(values)) == len(values) and all(r["queue"] == WORKFLOW_QUEUE for r in reqs)
        for i, (req, rec) in enumerate(zip(reqs, recs)):
            # each dependency an earlier job of the same request, named by ref in the body and
            # by value in the history
            assert all(values.index(v) < i and p in ("success", "complete", "ignore") for v, p in rec["deps"])
            if shape == "client-chain":
                assert "ref" not in req and "depends_on" not in req     # Client.chain adds them
                assert rec["deps"] == ([[values[i - 1], "success"]] if i else [])
            else:
                assert req["ref"] == f"s{i}"
                assert req.get("depends_on", []) == [{"ref": f"s{values.index(v)}", "policy": p}
                                                     for v, p in rec["deps"]]
        if shape == "fan-in":
            assert [len(r["deps"]) for r in recs] == [0] * (len(recs) - 1) + [len(recs) - 1] and len(recs) >= 3
    assert shapes == {"chain", "client-chain", "fan-in"}


# ---------------------------------------------------------------------------- batches
# Each judge of the batches (docs/chaos.md "Batches") on a history that keeps to it and on ones
# that break it; every other invariant holds on them.
def batch_op(h: H, bid, members, t=(0.0, 0.1), outcome="ok", kind="open", is_open=False):
    """One batch request (`open` or `add`) of members [(value, job id)], recorded as the workload does."""
    items = [{"value": v, "key": None, "queue": "bt", "job_type": "member", "max_attempts": 3, "scheduled_at": None,
              "delay_ms": None} for v, _ in members]
    kw = {"items": items, "batch": True, "atomic": True, "batch_op": kind}
    if kind == "open":
        kw["open"] = is_open
    if outcome == "ok" or kind == "add":
        kw["batch_id"] = bid
    if outcome == "ok":
        kw["results"] = [{"job_id": jid, "dedup": False} for _, jid in members]
    return h.op("enqueue", *t, outcome, **kw)


def member(job_id, attempt, value, lease_expires=1_002_000):
    j = H.job(job_id, attempt, value, lease_expires=lease_expires, queue="bt")
    j["job_type"] = "member"
    return j


def callback(job_id, bid, kind, attempt=1, lease_expires=1_009_000):
    """A delivered callback job: no value of the workload's, its kind as job_type, custom batch_id."""
    j = H.job(job_id, attempt, None, lease_expires=lease_expires, queue="btcb", max_attempts=5)
    j.update(job_type=kind, batch_id=bid)
    return j


def bt_dl(job_id, value, failed_at=1_000_450):
    rec = dl(job_id, value, "rejected", 1, f"r-{job_id}-1", failed_at=failed_at)
    rec.update(queue="bt", job_type="member")
    return rec


def a_batch(h: H, bid="B", is_open=False, fail_second=False, cb_t=(2.0, 2.1)):
    """A batch of two members (the second added later when open), both ended by 1.0; its callbacks
    handed out at cb_t and acked. (The dead letters.)"""
    if is_open:
        batch_op(h, bid, [("v1", "m1")], is_open=True)
        batch_op(h, bid, [("v2", "m2")], t=(0.1, 0.15), kind="add")
        h.op("batch_close", 0.15, 0.2, batch_id=bid)
    else:
        batch_op(h, bid, [("v1", "m1"), ("v2", "m2")])
    h.res([member("m1", 1, "v1"), member("m2", 1, "v2")], t=(0.2, 0.3))
    h.settle("ack", "m1", 1, t=(0.4, 0.5))
    if fail_second:
        h.nack("m2", 1, t=(0.6, 0.7), strategy="dead_letter", reason="r-m2-1", dead=True)
    else:
        h.settle("ack", "m2", 1, t=(0.6, 0.7))
    kinds = ("on_complete", "on_failure") if fail_second else ("on_complete", "on_success")
    h.res([callback(f"c-{k}", bid, k) for k in kinds], t=cb_t)
    for k in kinds:
        h.settle("ack", f"c-{k}", 1, t=(cb_t[1] + 0.1, cb_t[1] + 0.2))
    return [bt_dl("m2", "v2")] if fail_second else []


def test_batch_callbacks_come_once_and_after_the_members():
    for is_open in (False, True):
        for fail in (False, True):
            h = H()
            dead = a_batch(h, is_open=is_open, fail_second=fail)
            r = wf_check(h, dead)
            assert r["valid"], (is_open, fail, broken(r))
            assert r["stats"]["batches"]["on_complete"] == 1
    # a completion callback handed out (0.65) after the last member's ack was invoked (0.6), before
    # its answer (0.7): it may have been applied first, nothing is certain; a redelivery of the same
    # callback job after a lapsed lease is fine.
    h = H()
    batch_op(h, "B", [("v1", "m1")])
    h.res([member("m1", 1, "v1")], t=(0.2, 0.3))
    h.settle("ack", "m1", 1, t=(0.6, 0.7))
    h.res([callback("c", "B", "on_complete", lease_expires=1_002_000)], t=(0.6, 0.65))
    h.res([callback("c", "B", "on_complete", attempt=2, lease_expires=1_009_000)], t=(3.0, 3.1))
    h.res([callback("s", "B", "on_success")], t=(0.6, 0.65))
    h.settle("ack", "c", 2, t=(3.2, 3.3))
    h.settle("ack", "s", 1, t=(3.2, 3.3))
    r = wf_check(h)
    assert r["valid"], broken(r)
    # an on_failure stamped (1_000_450) no earlier than its member's dead letter's failed_at: the
    # replicated clock does not say it was early, the history's times say whether it was
    h = H()
    batch_op(h, "B", [("v1", "m1")])
    h.res([member("m1", 1, "v1")], t=(0.2, 0.3))
    h.nack("m1", 1, t=(0.6, 0.7), strategy="dead_letter", reason="r-m1-1", dead=True)
    h.res([callback("f", "B", "on_failure", lease_expires=1_002_450)], t=(0.45, 0.5), lease_ms=2000)
    h.res([callback("c", "B", "on_complete")], t=(0.8, 0.9))
    h.settle("ack", "f", 1, t=(0.9, 1.0))
    h.settle("ack", "c", 1, t=(0.9, 1.0))
    r = wf_check(h, [bt_dl("m1", "v1", failed_at=1_000_450)])
    assert broken(r) == {"callback_after_members": 1}     # the answer (0.5) came before the nack's invoke (0.6)...
    h.ops[2]["t0"] = 0.45                                  # ...unless the nack may have been applied first
    assert wf_check(h, [bt_dl("m1", "v1", failed_at=1_000_450)])["valid"]


def test_a_callback_twice_missing_or_uncalled_for_is_caught():
    h = H()
    a_batch(h)
    h.res([callback("c-on_complete-2", "B", "on_complete")], t=(2.5, 2.6))
    h.settle("ack", "c-on_complete-2", 1, t=(2.7, 2.8))
    assert broken(wf_check(h)) == {"batch_callbacks_once": 1}
    # after a finished drain: a closed batch without on_complete; one with on_failure yet none failed
    h = H()
    a_batch(h)
    h.ops[:] = [op for op in h.ops if not (op["f"] == "reserve" and op["t0"] == 2.0)]
    r = wf_check(h)
    assert broken(r) == {"batch_callbacks_once": 2}     # on_complete and on_success missing
    assert {e["kind"] for e in next(i for i in r["invariants"] if i["name"] == "batch_callbacks_once")["examples"]} \
        == {"on_complete", "on_success"}
    h = H()
    dead = a_batch(h, fail_second=True)
    h.res([callback("c-x", "B", "on_success")], t=(3.0, 3.1))
    h.settle("ack", "c-x", 1, t=(3.2, 3.3))
    assert broken(wf_check(h, dead)) == {"batch_callbacks_once": 1}
    # not judged when the drain did not finish, nor for an open batch whose close was not answered
    assert "batch_callbacks_once" not in broken(wf_check(h, dead, drain={"ok": False, "queues": []}))
    h = H()
    a_batch(h, is_open=True, cb_t=(5.0, 5.1))
    h.ops[:] = [op for op in h.ops if not (op["f"] == "reserve" and op["t0"] == 5.0)]
    h.ops[2]["outcome"] = "unknown"
    assert wf_check(h)["valid"]


def test_a_callback_before_its_members_or_its_close_is_caught():
    h = H()
    a_batch(h, cb_t=(0.45, 0.55))            # answered before m2's ack was invoked (0.6)
    r = wf_check(h)
    assert broken(r) == {"callback_after_members": 2}          # on_complete and on_success
    h = H()
    dead = a_batch(h, fail_second=True, cb_t=(0.3, 0.35))     # on_failure stamped before the dead letter too
    assert broken(wf_check(h, dead)) == {"callback_after_members": 2}
    # an open batch: its on_complete answered before the close was invoked
    h = H()
    batch_op(h, "B", [("v1", "m1")], is_open=True)
    h.res([member("m1", 1, "v1")], t=(0.2, 0.3))
    h.settle("ack", "m1", 1, t=(0.3, 0.35))
    h.res([callback("c", "B", "on_complete"), callback("s", "B", "on_success")], t=(0.8, 0.9))
    h.op("batch_close", 1.0, 1.1, batch_id="B")
    for jid in ("c", "s"):
        h.settle("ack", jid, 1, t=(1.2, 1.3))
    r = wf_check(h)
    assert broken(r) == {"callback_after_members": 2}
    assert {e.get("why") for i in r["invariants"] for e in i["examples"] if i["name"] == "callback_after_members"} \
        == {"before its close"}


def test_the_batch_judges_are_skipped_without_batches_and_the_no_batches_switch():
    import random

    from raftq.cluster.chaos.runner import build_parser, options_from_args
    from raftq.cluster.chaos.workload import BATCH_QUEUE, History, Workload

    h = H()
    h.enq("v", "j")
    h.res([h.job("j", 1, "v")])
    h.settle("ack", "j", 1)
    r = wf_check(h)
    skipped = {i["name"]: i.get("skipped") for i in r["invariants"]}
    assert r["valid"] and r["stats"]["batches"] is None
    assert {skipped[n] for n in ("batch_callbacks_once", "callback_after_members")} == {"no batches in the run"}
    assert options_from_args(build_parser().parse_args([])).workload.batches
    assert not options_from_args(build_parser().parse_args(["--no-batches"])).workload.batches
    reqs, recs = Workload(["http://x"], History(), 1)._members(random.Random(1), "bp0", 4, 3)
    assert [r["value"] for r in recs] == ["bp0-4", "bp0-5", "bp0-6"]
    assert {r["queue"] for r in reqs} == {BATCH_QUEUE}
