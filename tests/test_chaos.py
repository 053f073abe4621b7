"""Chaos testing without a cluster: the checker on hand-made histories (each violation is
caught), the fault proxy on plain sockets, the fault schedule and the report. The chaos runs on
real clusters, one per fault kind, are in tests/cluster/test_chaos_runs.py.

The Raft fork's own fixes found by those runs are tested in tests/test_raft_*.py and
tests/cluster/test_raft_*.py.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from raftq.cluster.chaos.checker import check, percentile, unavailability
from raftq.cluster.chaos.proxy import NetState, ProxyNet


RETRY = {"retry_delay_ms": 100, "retry_backoff": "exponential", "retry_delay_max_ms": 1000,
         "max_schedule_horizon_ms": 2_592_000_000}


# ---------------------------------------------------------------------------- history builders
class H:
    """A tiny history builder: times are given explicitly, ids are assigned in order."""

    def __init__(self):
        self.ops = []

    def _op(self, f, t0, t1, outcome, **kw):
        op = {"id": len(self.ops), "proc": kw.pop("proc", "p"), "f": f, "t0": t0, "t1": t1,
              "w0": int(1_000_000 + t0 * 1000), "w1": int(1_000_000 + t1 * 1000), "outcome": outcome, **kw}
        self.ops.append(op)
        return op

    def enq(self, value, job_id=None, t=(0.0, 0.1), outcome="ok", key=None, dedup=False, queue="a",
            job_type="work", max_attempts=3, scheduled_at=None):
        item = {"value": value, "key": key, "queue": queue, "job_type": job_type, "max_attempts": max_attempts,
                "scheduled_at": scheduled_at, "delay_ms": None}
        kw = {"items": [item], "batch": False}
        if outcome == "ok":
            kw["results"] = [{"job_id": job_id, "dedup": dedup}]
        return self._op("enqueue", *t, outcome, **kw)

    @staticmethod
    def job(job_id, attempt, value, lease_expires=1_002_000, key=None, queue="a", max_attempts=3,
            scheduled_at=None, job_type="work", releases=0, resource=None):
        return {"job_id": job_id, "attempt": attempt, "max_attempts": max_attempts, "queue": queue,
                "job_type": job_type, "value": value, "key": key, "lease_expires": lease_expires,
                "scheduled_at": scheduled_at, "enqueued_at": 1_000_000, "releases": releases,
                "resource": resource}

    def res(self, jobs, t=(0.2, 0.3), lease_ms=2000, outcome="ok"):
        return self._op("reserve", *t, outcome, lease_ms=lease_ms, jobs=jobs if outcome == "ok" else None)

    def ack(self, job_id, attempt, t=(0.4, 0.5), outcome="ok"):
        return self._op("ack", *t, outcome, job_id=job_id, attempt=attempt)

    def nack(self, job_id, attempt, t=(0.4, 0.5), outcome="ok", strategy="default", delay_ms=None,
             reason=None, dead=False, max_attempts=3):
        kw = {"job_id": job_id, "attempt": attempt, "strategy": strategy, "delay_ms": delay_ms,
              "reason": reason or f"r-{job_id}-{attempt}", "max_attempts": max_attempts}
        if outcome == "ok":
            kw["dead_lettered"] = dead
        return self._op("nack", *t, outcome, **kw)

    def release(self, job_id, attempt, t=(0.4, 0.5), outcome="ok", delay_ms=0, releases=0):
        return self._op("release", *t, outcome, job_id=job_id, attempt=attempt, delay_ms=delay_ms,
                        releases=releases)

    def extend(self, job_id, attempt, t=(0.4, 0.5), outcome="ok", lease_ms=2000, lease_expires=None):
        return self._op("extend", *t, outcome, job_id=job_id, attempt=attempt, lease_ms=lease_ms,
                        lease_expires=lease_expires)


def dl(job_id, value, cause, final_attempt, reason=None, max_attempts=3, queue="a"):
    return {"job_id": job_id, "cause": cause, "final_attempt": final_attempt, "last_reason": reason,
            "failed_at": 1_005_000, "value": value, "key": None, "queue": queue, "job_type": "work",
            "max_attempts": max_attempts, "attempt": final_attempt}


def run(h: H, dead_letters=(), **kw):
    kw.setdefault("retry", RETRY)
    return check(h.ops, dead_letters=list(dead_letters), **kw)


def failed(result) -> dict:
    return {i["name"]: i for i in result["invariants"] if not i["ok"]}


def only(result, name):
    bad = failed(result)
    assert set(bad) == {name}, bad
    return bad[name]


# ---------------------------------------------------------------------------- checker: clean runs
def test_clean_history_with_redelivery_and_unknowns_is_valid():
    h = H()
    h.enq("v1", "j1")
    h.enq("v2", t=(0.0, 5.0), outcome="unknown")           # never happened
    h.enq("v3", t=(0.0, 5.0), outcome="unknown")           # happened: recovered
    h.res([h.job("j1", 1, "v1", lease_expires=1_002_200)], t=(0.2, 0.25))
    h.ack("j1", 1, t=(0.4, 8.0), outcome="unknown")       # not committed: redelivered
    h.res([h.job("j1", 2, "v1", lease_expires=1_010_000), h.job("j3", 1, "v3", lease_expires=1_010_000)],
          t=(7.9, 8.0))
    h.ack("j1", 2, t=(8.1, 8.2))
    h.ack("j3", 1, t=(8.1, 8.2), outcome="unknown")        # maybe completed: not lost
    r = run(h, drain={"ok": True, "queues": [{"name": "a", "ready": 0, "scheduled": 0, "in_flight": 0}]},
            views=[{"node_id": "n1", "last_applied": 9, "digest": "d", "state": {"jobs": 0}}] * 3,
            leader_claims={1: ["n1"], 2: ["n2"]}, liveness={"leader_after_heal_s": 1.2, "leader_bound_s": 10})
    assert r["valid"], failed(r)
    assert r["stats"]["recovered"] == 1 and r["stats"]["redeliveries"] == 1


def test_dead_letters_with_each_cause_are_valid():
    h = H()
    h.enq("a", "ja", max_attempts=1)
    h.enq("b", "jb", max_attempts=2)
    h.enq("c", "jc", max_attempts=1)
    h.res([h.job("ja", 1, "a", max_attempts=1), h.job("jb", 1, "b", max_attempts=2),
           h.job("jc", 1, "c", max_attempts=1)])
    h.nack("ja", 1, reason="boom", dead=True, max_attempts=1)                      # attempts exhausted
    h.nack("jb", 1, strategy="dead_letter", reason="no", dead=True, max_attempts=2)  # rejected
    r = run(h, dead_letters=[dl("ja", "a", "attempts_exhausted", 1, "boom", 1), dl("jb", "b", "rejected", 1, "no", 2),
                             dl("jc", "c", "lease_expired", 1, None, 1)])
    assert r["valid"], failed(r)
    assert r["stats"]["dead_letters"] == {"attempts_exhausted": 1, "rejected": 1, "lease_expired": 1}


# ---------------------------------------------------------------------------- checker: violations
def test_lost_ok_enqueue_is_caught():
    h = H()
    h.enq("v1", "j1")
    bad = only(run(h), "lost")
    assert bad["count"] == 1 and bad["examples"][0]["value"] == "v1"


def test_unknown_ack_of_an_older_attempt_does_not_excuse_a_loss():
    h = H()
    h.enq("v1", "j1")
    h.res([h.job("j1", 1, "v1", lease_expires=1_002_200)])
    h.ack("j1", 1, outcome="unknown")
    h.res([h.job("j1", 2, "v1", lease_expires=1_010_000)], t=(5.0, 5.1))   # so the ack did not commit
    only(run(h), "lost")


def test_unexpected_delivery_is_caught():
    h = H()
    h.res([h.job("jx", 1, "never-enqueued")])
    h.ack("jx", 1)
    only(run(h), "unexpected")


def test_one_value_as_two_jobs_is_caught():
    h = H()
    h.enq("v1", "j1")
    h.res([h.job("j1", 1, "v1"), h.job("j2", 1, "v1")])
    h.ack("j1", 1)
    h.ack("j2", 1)
    bad = only(run(h), "duplicate_jobs")
    assert bad["examples"][0]["job_ids"] == ["j1", "j2"]


def test_idempotency_violations_are_caught():
    h = H()
    h.enq("v1", "j1", key="k")
    h.enq("v2", "j2", key="k")                 # same key, new job, not deduplicated: two violations
    h.enq("v3", "j1", key="k", dedup=True)
    h.enq("v4", "j9", key="k", queue="b")     # another queue: a different key scope, fine
    for j, v, q in (("j1", "v1", "a"), ("j2", "v2", "a"), ("j9", "v4", "b")):
        h.res([h.job(j, 1, v, key="k", queue=q)])
        h.ack(j, 1)
    bad = only(run(h), "idempotency")
    assert bad["count"] == 2


def test_redelivery_with_same_or_lower_attempt_is_caught():
    h = H()
    h.enq("v1", "j1")
    h.res([h.job("j1", 2, "v1", lease_expires=1_003_000)], t=(0.2, 0.3))
    h.res([h.job("j1", 1, "v1", lease_expires=1_006_000)], t=(3.0, 3.1))    # lower, later
    h.res([h.job("j1", 2, "v1", lease_expires=1_009_000)], t=(6.0, 6.1))    # repeated attempt
    h.ack("j1", 2, t=(6.2, 6.3))
    r = run(h)
    assert "redelivery_attempts" in failed(r)


def test_stale_ok_extend_and_ack_are_caught():
    h = H()
    h.enq("v1", "j1")
    h.res([h.job("j1", 1, "v1", lease_expires=1_002_200)], t=(0.2, 0.3))
    h.res([h.job("j1", 2, "v1", lease_expires=1_010_000)], t=(3.0, 3.1))
    h.extend("j1", 1, t=(4.0, 4.1), lease_expires=1_006_000)       # ok with a stale attempt
    h.ack("j1", 2, t=(5.0, 5.1))
    only(run(h), "stale_attempt")


def test_delivery_after_ok_ack_is_caught():
    h = H()
    h.enq("v1", "j1")
    h.res([h.job("j1", 1, "v1", lease_expires=1_002_200)], t=(0.2, 0.3))
    h.ack("j1", 1, t=(0.4, 0.5))
    h.res([h.job("j1", 2, "v1", lease_expires=1_010_000)], t=(3.0, 3.1))
    h.ack("j1", 2, t=(3.2, 3.3))
    bad = failed(run(h))
    assert "no_delivery_after_ack" in bad


def test_dead_letter_of_an_acked_job_is_caught():
    h = H()
    h.enq("v1", "j1", max_attempts=1)
    h.res([h.job("j1", 1, "v1", max_attempts=1)])
    h.ack("j1", 1)
    bad = failed(run(h, dead_letters=[dl("j1", "v1", "lease_expired", 1, None, 1)]))
    assert "no_delivery_after_ack" in bad


def test_attempt_beyond_max_is_caught():
    h = H()
    h.enq("v1", "j1", max_attempts=1)
    h.res([h.job("j1", 2, "v1", max_attempts=1)])
    h.ack("j1", 2)
    only(run(h), "attempts_bound")


def test_a_release_uses_no_attempt():
    h = H()
    h.enq("v1", "j1", max_attempts=1)
    h.res([h.job("j1", 1, "v1", max_attempts=1)], t=(0.2, 0.3))
    h.release("j1", 1, t=(0.4, 0.5))
    h.res([h.job("j1", 2, "v1", max_attempts=1, releases=1)], t=(0.6, 0.7))   # used 1 of 1: fine
    h.ack("j1", 2, t=(0.8, 0.9))
    r = run(h)
    assert r["valid"], failed(r)
    h = H()
    h.enq("v1", "j1", max_attempts=3)
    h.res([h.job("j1", 1, "v1")], t=(0.2, 0.3))
    h.release("j1", 1, t=(0.4, 0.5))
    h.res([h.job("j1", 2, "v1", releases=0)], t=(0.6, 0.7))       # the release burned an attempt
    h.ack("j1", 2, t=(0.8, 0.9))
    assert only(run(h), "release_uses_no_attempt")["count"] == 1


GATES = {"resource_limits": {"r0": 2}, "circuit": {"queue": "cb", "failures": 2, "open_ms": 1500},
         "windows": {"queue": "win", "open": [[1_000_000, 1_060_000], [1_120_000, 1_180_000]]}}


def test_more_in_flight_than_a_resource_limit_is_caught():
    def history(settle_first: bool):
        h = H()
        for v in ("v1", "v2", "v3"):
            h.enq(v, "j" + v[1])
        # leased at 1_000_000 (lease_expires - lease_ms)
        h.res([h.job("j1", 1, "v1", resource="r0"), h.job("j2", 1, "v2", resource="r0")], t=(0.2, 0.3))
        if settle_first:
            h.ack("j1", 1, t=(0.35, 0.4))              # asked before the third was leased: may have freed a slot
        h.res([h.job("j3", 1, "v3", resource="r0", lease_expires=1_002_500)], t=(0.5, 0.6))
        if not settle_first:
            h.ack("j1", 1, t=(0.7, 0.8))
        h.ack("j2", 1, t=(0.7, 0.8))
        h.ack("j3", 1, t=(0.7, 0.8))
        return h
    assert run(history(True), gates=GATES)["valid"]
    bad = only(run(history(False), gates=GATES), "throttle_limit")
    assert bad["examples"][0]["job_id"] == "j3" and bad["examples"][0]["limit"] == 2


def test_an_open_circuit_handing_out_more_than_one_probe_is_caught():
    def history(apart_ms: int):
        h = H()
        for v in ("v1", "v2", "v3", "v4"):
            h.enq(v, "j" + v[1], queue="cb", max_attempts=5)
        h.res([h.job("j1", 1, "v1", queue="cb", max_attempts=5), h.job("j2", 1, "v2", queue="cb", max_attempts=5)],
              t=(0.2, 0.3))
        h.nack("j1", 1, t=(0.4, 0.5), max_attempts=5)
        h.nack("j2", 1, t=(0.4, 0.5), max_attempts=5)        # two failures: the breaker must be open
        h.res([h.job("j3", 1, "v3", queue="cb", max_attempts=5, lease_expires=1_004_000)], t=(0.6, 0.7))
        h.res([h.job("j4", 1, "v4", queue="cb", max_attempts=5, lease_expires=1_004_000 + apart_ms)], t=(0.8, 0.9))
        for j in ("j3", "j4"):
            h.ack(j, 1, t=(1.0, 1.1))
        h.res([h.job("j1", 2, "v1", queue="cb", max_attempts=5, lease_expires=1_010_000),
               h.job("j2", 2, "v2", queue="cb", max_attempts=5, lease_expires=1_010_000)], t=(1.2, 1.3))
        h._op("lift_gates", 1.15, 1.18, "ok")                # the drain's deliveries are not held to the gates
        h.ack("j1", 2, t=(1.4, 1.5))
        h.ack("j2", 2, t=(1.4, 1.5))
        return h
    assert run(history(1500), gates=GATES)["valid"]
    bad = only(run(history(200), gates=GATES), "circuit_open")
    assert bad["examples"][0]["job_id"] == "j4" and bad["examples"][0]["apart_ms"] == 200


def test_a_power_cut_that_erased_the_failures_excuses_a_circuit_seemingly_open():
    """Memory mode: the nacks that opened the breaker were answered after the last durable
    point and lost to the cut, so the cluster after the restart rightly knew no open circuit."""
    h = H()
    for v in ("v1", "v2", "v3", "v4"):
        h.enq(v, "j" + v[1], queue="cb", max_attempts=5, t=(0.0, 0.05))
    h.res([h.job("j1", 1, "v1", queue="cb", max_attempts=5), h.job("j2", 1, "v2", queue="cb", max_attempts=5)],
          t=(0.06, 0.08))
    h.nack("j1", 1, t=(0.4, 0.5), max_attempts=5)
    h.nack("j2", 1, t=(0.4, 0.5), max_attempts=5)
    h.res([h.job("j3", 1, "v3", queue="cb", max_attempts=5, lease_expires=1_004_000)], t=(0.6, 0.7))
    h.res([h.job("j4", 1, "v4", queue="cb", max_attempts=5, lease_expires=1_004_200)], t=(0.8, 0.9))
    for j in ("j3", "j4"):
        h.ack(j, 1, t=(1.0, 1.1))
    h._op("lift_gates", 1.15, 1.18, "ok")
    h.res([h.job("j1", 2, "v1", queue="cb", max_attempts=5, lease_expires=1_010_000),
           h.job("j2", 2, "v2", queue="cb", max_attempts=5, lease_expires=1_010_000)], t=(1.2, 1.3))
    h.ack("j1", 2, t=(1.4, 1.5))
    h.ack("j2", 2, t=(1.4, 1.5))
    cut = {"kind": "power-loss", "durability": "memory", "durable_from_wall_ms": 1_000_300, "t_restart": 0.55,
           "w_cut": 1_000_520, "t_inject": 0.52}
    r = run(h, gates=GATES, power_losses=[cut])
    inv = {i["name"]: i for i in r["invariants"]}["circuit_open"]
    assert inv["ok"] and inv.get("expected_after_power_loss") == 1, inv
    assert not run(h, gates=GATES)["valid"]          # without the cut: a violation


def test_a_job_handed_out_while_its_window_is_closed_is_caught():
    h = H()
    h.enq("v1", "j1", queue="win")
    h.enq("v2", "j2", queue="win")
    h.res([h.job("j1", 1, "v1", queue="win", lease_expires=1_030_000)], t=(0.2, 0.3), lease_ms=2000)   # open
    h.res([h.job("j2", 1, "v2", queue="win", lease_expires=1_090_000)], t=(0.4, 0.5), lease_ms=2000)   # closed
    h.ack("j1", 1, t=(0.6, 0.7))
    h.ack("j2", 1, t=(0.6, 0.7))
    bad = only(run(h, gates=GATES), "window_closed")
    assert [e["job_id"] for e in bad["examples"]] == ["j2"]


def test_job_leased_before_its_schedule_is_caught():
    h = H()
    h.enq("v1", "j1", scheduled_at=1_005_000)
    # Replicated clock: lease_expires - lease_ms = 1_003_000 < 1_005_000. Wall: answered at 1_000_300.
    h.res([h.job("j1", 1, "v1", lease_expires=1_005_000, scheduled_at=1_005_000)], t=(0.2, 0.3), lease_ms=2000)
    h.ack("j1", 1)
    bad = only(run(h), "schedule")
    assert {e["clock"] for e in bad["examples"]} == {"replicated", "wall"}


def test_redelivery_before_the_retry_delay_is_caught():
    h = H()
    h.enq("v1", "j1")
    h.res([h.job("j1", 1, "v1", lease_expires=1_002_000)], t=(0.0, 0.1))         # leased at 1_000_000
    h.nack("j1", 1, strategy="delay", delay_ms=1500)
    h.res([h.job("j1", 2, "v1", lease_expires=1_002_500)], t=(0.6, 0.7))         # leased at 1_000_500
    h.ack("j1", 2, t=(0.8, 0.9))
    only(run(h), "retry_delay")


def test_default_nack_uses_the_retry_policy_delay():
    h = H()
    h.enq("v1", "j1")
    h.res([h.job("j1", 1, "v1", lease_expires=1_002_000)], t=(0.0, 0.1))
    h.nack("j1", 1)                                                              # policy: 75..100 ms
    h.res([h.job("j1", 2, "v1", lease_expires=1_002_010)], t=(0.6, 0.7))         # 10 ms later
    h.ack("j1", 2, t=(0.8, 0.9))
    only(run(h), "retry_delay")


def test_lease_expired_early_is_caught():
    h = H()
    h.enq("v1", "j1")
    h.res([h.job("j1", 1, "v1", lease_expires=1_002_000)], t=(0.0, 0.1))
    h.extend("j1", 1, t=(1.0, 1.1), lease_expires=1_003_000)
    h.res([h.job("j1", 2, "v1", lease_expires=1_004_500)], t=(2.5, 2.6))         # leased at 1_002_500
    h.ack("j1", 2, t=(2.7, 2.8))
    bad = only(run(h), "lease_honoured")
    assert bad["examples"][0]["early_ms"] == 500


def test_wrong_dead_letters_are_caught():
    h = H()
    h.enq("a", "ja", max_attempts=3)
    h.enq("b", "jb", max_attempts=3)
    h.res([h.job("ja", 1, "a"), h.job("jb", 1, "b")])
    h.nack("ja", 1, reason="x", dead=True)                                # flag wrong: attempt 1 of 3
    h.nack("jb", 1, strategy="dead_letter", reason="y", dead=True)        # its record is missing
    r = run(h, dead_letters=[dl("ja", "a", "attempts_exhausted", 1, "x", 3)])
    bad = failed(r)
    assert "dead_letters" in bad and bad["dead_letters"]["count"] >= 3
    assert "lost" in bad         # jb is neither acked nor dead-lettered


def test_final_state_divergence_and_leftovers_are_caught():
    h = H()
    views = [{"node_id": "n1", "last_applied": 10, "digest": "aa", "state": {"jobs": 0}},
             {"node_id": "n2", "last_applied": 10, "digest": "bb", "state": {"jobs": 0}},
             {"node_id": "n3", "last_applied": 10, "digest": "aa", "state": {"jobs": 1}}]
    r = run(h, views=views, drain={"ok": False, "queues": [{"name": "a", "ready": 1, "scheduled": 0, "in_flight": 0}]})
    bad = failed(r)
    assert set(bad) == {"replicas_agree", "drained"}
    assert bad["drained"]["count"] == 3


def test_two_leaders_in_one_term_are_caught():
    bad = only(run(H(), leader_claims={3: ["n1"], 4: ["n1", "n2"]}), "one_leader_per_term")
    assert bad["examples"][0] == {"term": 4, "leaders": ["n1", "n2"]}


def test_liveness_failures_are_caught():
    r = run(H(), liveness={"leader_after_heal_s": 12.0, "leader_bound_s": 10.0,
                           "lease_probe": {"ok": False, "samples": [4.2]}})
    assert only(r, "liveness")["count"] == 2
    assert only(run(H(), liveness={"leader_after_heal_s": None, "leader_bound_s": 10.0}), "liveness")


# ---------------------------------------------------------------------------- checker: schedules
FIRST_TICK = 1_001_000            # the schedules' first tick (replicated ms; H's wall clock is 1_000_000 + t * 1000)


def sched_put(h: H, name: str, catchup: str, misfire_ms: int, every_ms: int = 1000, window_ms=None,
              first=FIRST_TICK):
    """A schedule_put op as the workload records it (ok: with its first tick)."""
    kw = {"name": name, "queue": "sched", "every_ms": every_ms, "catchup": catchup, "misfire_after_ms": misfire_ms,
          "next_fire_at_ms": first}
    if window_ms is not None:
        kw["catchup_window_ms"] = window_ms
    return h._op("schedule_put", 0.0, 0.01, "ok", proc="sched", **kw)


def tick_job(name: str, tick: int, enqueued_at=None, job_id=None, attempt=1, lease_ms=2000):
    """A delivered tick's job (what workload.delivery keeps): leased at its enqueue."""
    enq = tick + 20 if enqueued_at is None else enqueued_at
    return {"job_id": job_id or f"{name}@{tick}", "attempt": attempt, "max_attempts": 3, "queue": "sched",
            "job_type": "tick", "value": None, "key": None, "lease_expires": enq + attempt * 10 + lease_ms,
            "scheduled_at": None, "enqueued_at": enq, "releases": 0, "resource": None, "schedule": name, "tick": tick}


def see_ticks(h: H, name: str, ticks, t=1.0, ack=True):
    """One reserve of the jobs of `ticks` ([tick] or [(tick, enqueued_at)]), each acked."""
    jobs = [tick_job(name, *(x if isinstance(x, tuple) else (x,))) for x in ticks]
    h.res(jobs, t=(t, t + 0.05))
    if ack:
        for j in jobs:
            h.ack(j["job_id"], j["attempt"], t=(t + 0.06, t + 0.08))
    return jobs


def views(h: H, **fired):
    """The schedule_views op after the final drain: each schedule paused, with its `fired`."""
    h._op("schedule_views", 50.0, 50.1, "ok", proc="drain",
          schedules=[{"name": n.replace("_", "-"), "fired": f, "paused": True} for n, f in fired.items()])


def grid(n: int, start=FIRST_TICK, every=1000) -> list:
    return [start + i * every for i in range(n)]


def test_schedules_that_keep_to_their_catch_up_policies_are_valid():
    """Four schedules through an outage of ~6 s (ticks 1_006_000..1_011_000 fall in it; the
    sweep after it runs at 1_012_500): `all` with a long misfire fires them on time, `all` with
    1 s catches them up late, `one` fires the latest missed one late, `skip` none. A redelivery
    of a tick's job (same id, next attempt) is fine."""
    h = H()
    sched_put(h, "s-all", "all", 600_000, window_ms=3_600_000)
    sched_put(h, "s-catchup", "all", 1000, window_ms=3_600_000)
    sched_put(h, "s-one", "one", 1000)
    sched_put(h, "s-skip", "skip", 1000)
    before, after = grid(5), grid(4, start=1_012_000)          # 1_001_000..1_005_000, 1_012_000..1_015_000
    late = [(t, 1_012_500) for t in grid(6, start=1_006_000)]
    see_ticks(h, "s-all", before + [t for t, _ in late] + after)
    see_ticks(h, "s-catchup", before + late + after, t=2.0)
    see_ticks(h, "s-one", before + [(1_011_000, 1_012_500)] + after, t=3.0)
    see_ticks(h, "s-skip", before + after, t=4.0)
    j = tick_job("s-skip", 1_016_000)
    h.res([j], t=(5.0, 5.1))                                 # its lease lapses: redelivered, same job id
    h.res([tick_job("s-skip", 1_016_000, attempt=2, lease_ms=2000) | {"lease_expires": j["lease_expires"] + 5000}],
          t=(8.0, 8.1))
    h.ack(j["job_id"], 2, t=(8.2, 8.3))
    views(h, s_all=15, s_catchup=15, s_one=10, s_skip=10)
    r = run(h)
    assert r["valid"], failed(r)
    st = r["stats"]["schedules"]
    assert (st["s-all"]["ticks"], st["s-all"]["late"], st["s-all"]["missing"]) == (15, 0, 0)
    assert (st["s-catchup"]["ticks"], st["s-catchup"]["late"], st["s-catchup"]["missing"]) == (15, 6, 0)
    assert (st["s-one"]["ticks"], st["s-one"]["late"], st["s-one"]["missing"]) == (10, 1, 5)
    assert (st["s-skip"]["ticks"], st["s-skip"]["late"], st["s-skip"]["missing"]) == (10, 0, 6)
    assert st["s-skip"]["fired"] == 10
    # Without schedules both invariants are skipped, and said so.
    inv = {i["name"]: i for i in run(H())["invariants"]}
    assert inv["one_job_per_tick"]["skipped"] == inv["no_tick_missed"]["skipped"] == "no schedules in this run"


def test_two_jobs_for_one_tick_are_caught():
    h = H()
    sched_put(h, "s-all", "all", 600_000)
    see_ticks(h, "s-all", grid(3))
    dup = tick_job("s-all", FIRST_TICK + 1000, job_id="another-id")        # the tick fired a second time
    h.res([dup], t=(2.0, 2.1))
    h.ack("another-id", 1, t=(2.2, 2.3))
    bad = only(run(h), "one_job_per_tick")
    assert bad["count"] == 1
    assert bad["examples"][0] == {"schedule": "s-all", "tick": FIRST_TICK + 1000,
                                  "job_ids": ["another-id", f"s-all@{FIRST_TICK + 1000}"]}
    # One job id carrying two ticks is as wrong.
    h = H()
    sched_put(h, "s-all", "all", 600_000)
    see_ticks(h, "s-all", grid(1))
    first = tick_job("s-all", FIRST_TICK + 1000, job_id="j")          # its lease lapses...
    h.res([first], t=(2.0, 2.1))
    again = tick_job("s-all", FIRST_TICK + 2000, job_id="j", attempt=2,   # ...and it comes back as another tick
                     enqueued_at=FIRST_TICK + 5000)
    h.res([again], t=(4.0, 4.1))
    h.ack("j", 2, t=(4.2, 4.3))
    assert only(run(h), "one_job_per_tick")["examples"][0]["why"] == "one job for two ticks"


def test_a_tick_missing_under_catchup_all_is_caught():
    h = H()
    sched_put(h, "s-all", "all", 600_000, window_ms=3_600_000)
    ticks = grid(6)
    see_ticks(h, "s-all", ticks[:2] + ticks[3:])           # the third tick never fired
    bad = only(run(h), "no_tick_missed")
    assert bad["count"] == 1
    ex = bad["examples"][0]
    assert (ex["schedule"], ex["missing"], ex["first_missing"], ex["why"]) == (
        "s-all", 1, ticks[2], "ticks missing under catchup all")
    # The first tick itself counts: a schedule whose first tick never showed up.
    h = H()
    sched_put(h, "s-all", "all", 600_000)
    see_ticks(h, "s-all", grid(3, start=FIRST_TICK + 1000))
    assert only(run(h), "no_tick_missed")["examples"][0]["first_missing"] == FIRST_TICK
    # What the policy itself drops is no violation: ticks older than the catch-up window when
    # their sweep came (here a 3 s window, and the sweep at 1_010_000 after an outage).
    h = H()
    sched_put(h, "s-all", "all", 1000, window_ms=3000)
    see_ticks(h, "s-all", grid(2) + [(t, 1_010_000) for t in grid(3, start=1_007_000)] + [1_010_000])
    r = run(h)
    assert r["valid"], failed(r)
    # ... or past max_catchup_ticks of one sweep (here 3: the oldest three missed ones fired).
    h = H()
    sched_put(h, "s-all", "all", 1000, window_ms=3_600_000)
    see_ticks(h, "s-all", grid(2) + [(t, 1_012_000) for t in grid(3, start=1_003_000)] + [1_011_000, 1_012_000])
    assert run(h, max_catchup_ticks=3)["valid"]
    assert only(run(h), "no_tick_missed")["examples"][0]["missing"] == 5     # the default (100) fires them all


def test_catchup_one_breaking_its_rules_is_caught():
    def history(ticks):
        h = H()
        sched_put(h, "s-one", "one", 1000)
        see_ticks(h, "s-one", ticks)
        return h

    ok = grid(3) + [(1_008_000, 1_009_500), 1_009_000, 1_010_000]    # gap, then the latest missed (late)
    assert run(history(ok))["valid"]
    # A gap closed by an on-time tick: the latest missed tick was never fired.
    bad = only(run(history(grid(3) + [1_009_000, 1_010_000])), "no_tick_missed")
    assert bad["examples"][0]["why"].startswith("a gap not closed by the latest missed tick")
    # Every missed tick fired (as `all` would): more than one late per sweep.
    allfired = grid(3) + [(t, 1_009_500) for t in grid(5, start=1_004_000)] + [1_009_000]
    whys = {e["why"] for e in only(run(history(allfired)), "no_tick_missed")["examples"]}
    assert "more than one missed tick fired by one sweep (catchup one)" in whys
    # The tick after the late one is missing (it was in that sweep's on-time range).
    bad = only(run(history(grid(3) + [(1_008_000, 1_009_500), 1_010_000])), "no_tick_missed")
    assert "the tick after a late one is missing or late too (catchup one)" in {e["why"] for e in bad["examples"]}
    # ... or late too.
    bad = only(run(history(grid(3) + [(1_008_000, 1_009_500), (1_009_000, 1_010_500)])), "no_tick_missed")
    assert {e["why"] for e in bad["examples"]} == {"the tick after a late one is missing or late too (catchup one)"}


def test_catchup_skip_firing_late_is_caught():
    h = H()
    sched_put(h, "s-skip", "skip", 1000)
    see_ticks(h, "s-skip", grid(3) + [(1_008_000, 1_009_500), 1_009_000])
    bad = only(run(h), "no_tick_missed")
    assert bad["count"] == 1 and bad["examples"][0]["late_ms"] == 1500
    h = H()
    sched_put(h, "s-skip", "skip", 1000)
    see_ticks(h, "s-skip", grid(3) + [1_009_000, 1_010_000])         # a gap, then on time: what skip does
    assert run(h)["valid"]


def test_ticks_off_the_grid_early_or_unseen_are_caught():
    h = H()
    sched_put(h, "s-all", "all", 600_000)
    see_ticks(h, "s-all", grid(3) + [(FIRST_TICK + 3000, FIRST_TICK + 2990)] + [FIRST_TICK + 3500])
    whys = sorted(e["why"] for e in only(run(h), "no_tick_missed")["examples"])
    assert whys == ["a tick off the schedule's grid", "enqueued before its tick"], whys
    # After the pause and the drain, the schedule's `fired` and the ticks seen must agree.
    h = H()
    sched_put(h, "s-all", "all", 600_000)
    see_ticks(h, "s-all", grid(4))
    views(h, s_all=5)
    bad = only(run(h), "no_tick_missed")
    assert bad["examples"][0] == {"schedule": "s-all", "fired": 5, "seen": 4, "why": "ticks fired whose job was never seen"}
    h.ops[-1]["schedules"][0]["fired"] = 3
    assert only(run(h), "no_tick_missed")["examples"][0]["why"] == "more ticks seen than the schedule fired"
    h.ops[-1]["schedules"][0]["fired"] = 4
    assert run(h)["valid"]
    h.ops[-1]["schedules"][0]["fired"] = 5
    assert set(failed(run(h, drain={"ok": False, "queues": []}))) == {"drained"}   # an unfinished drain: drained judges it


def test_a_tick_job_is_held_to_lost_and_unexpected():
    h = H()
    sched_put(h, "s-all", "all", 600_000)
    jobs = see_ticks(h, "s-all", grid(2), ack=False)
    h.ack(jobs[0]["job_id"], 1, t=(1.1, 1.2))
    bad = only(run(h), "lost")
    assert bad["examples"][0]["job_id"] == jobs[1]["job_id"] and bad["examples"][0]["tick"] == FIRST_TICK + 1000
    h = H()
    see_ticks(h, "nobody-made-me", [FIRST_TICK])
    bad = failed(run(h))
    assert set(bad) == {"unexpected"} and bad["unexpected"]["examples"][0]["schedule"] == "nobody-made-me"


def test_a_memory_mode_power_cut_excuses_an_erased_tick_only():
    """`one`: tick 1_004_000 fired late (the latest missed) with the next in its sweep on time
    and seen, then a cut rolled both back; after the restart a later sweep fired the latest
    missed one (1_009_000). Seen: the erased late tick without its successor. Excused in
    memory mode (expected), a violation without the cut; and `fired` is one short of the
    ticks seen for the same reason."""
    h = H()
    sched_put(h, "s-one", "one", 1000)
    see_ticks(h, "s-one", grid(2), t=1.0)
    see_ticks(h, "s-one", [(1_004_000, 1_005_100)], t=4.5)          # answered after the durable point
    see_ticks(h, "s-one", [(1_009_000, 1_010_200), 1_010_000], t=7.0)
    views(h, s_one=4)
    cut = _cut()
    r = run(h, power_losses=[cut])
    inv = {i["name"]: i for i in r["invariants"]}["no_tick_missed"]
    assert r["valid"] and inv["expected_after_power_loss"] == 2, inv
    assert only(run(h), "no_tick_missed")["count"] == 2
    assert only(run(h, power_losses=[dict(cut, durability="fsync")]), "no_tick_missed")["count"] == 2


def test_a_schedule_gone_at_the_end_is_caught_unless_a_cut_erased_its_creation():
    h = H()
    sched_put(h, "s-all", "all", 600_000)
    see_ticks(h, "s-all", grid(2), t=0.5)
    views(h)                                      # no schedule left after the drain
    bad = only(run(h), "no_tick_missed")
    assert bad["examples"][0] == {"schedule": "s-all", "why": "the schedule is gone"}
    r = run(h, power_losses=[_cut(durable_from=1_000_000, t_inject=1.0, t_restart=2.0, w_cut=1_001_000)])
    assert r["valid"], failed(r)                  # created after the last durable point: erased by the cut
    exp = {i["name"]: i.get("expected_after_power_loss", 0) for i in r["invariants"]}
    assert exp["no_tick_missed"] == 1 and exp["lost"] == 0     # its two jobs were acked before the cut


# ---------------------------------------------------------------------------- checker: keys
KEYS = {"chaos-keyed": {"key_concurrency": 1, "key_limits": {"hot": {"concurrency": 2}}},
        "chaos-rated": {"key_rate": {"count": 2, "period_ms": 1000}, "rate": {"count": 3, "period_ms": 1000},
                        "key_limits": {"slow": {"rate": {"count": 1, "period_ms": 1000}}}}}


def kjob(job_id, attempt, tenant, handed_at, queue="chaos-keyed", lease_ms=2000, releases=0):
    """A delivered keyed job, handed out at `handed_at` (replicated ms: its lease end minus the lease)."""
    return H.job(job_id, attempt, "v" + job_id[1:], lease_expires=handed_at + lease_ms, queue=queue,
                 releases=releases) | {"tenant": tenant}


def kenq(h: H, job_ids, queue="chaos-keyed"):
    for jid in job_ids:
        h.enq("v" + jid[1:], jid, queue=queue)["items"][0]["tenant"] = "?"


def test_keyed_hand_outs_within_their_limits_are_valid():
    """One key's jobs one after the other: each handed out once the previous one's ack was sent,
    or once its lease lapsed (a stalled worker; the zombie's ack is fenced, the job redelivered);
    two jobs of a key allowed two at once; jobs of different keys at once; hand-outs of a rated
    key just a period apart. H's wall clock is 1_000_000 + 1000 t."""
    h = H()
    kenq(h, ["j1", "j2", "j3", "j4", "j5", "j6"])
    h.res([kjob("j1", 1, "a", 1_000_200), kjob("j3", 1, "b", 1_000_200)], t=(0.2, 0.21))
    h.ack("j1", 1, t=(0.5, 0.51))                            # sent at 1_000_500
    h.ack("j3", 1, t=(0.5, 0.51))
    h.res([kjob("j2", 1, "a", 1_000_500)], t=(0.5, 0.52))   # the same ms as the ack was sent: not sure
    h.res([kjob("j4", 1, "a", 1_003_000)], t=(3.0, 3.01))   # j2's lease (to 1_002_500) lapsed
    h.ack("j2", 1, t=(3.1, 3.11), outcome="fail")["error"] = "attempt_mismatch"
    h.res([kjob("j2", 2, "a", 1_005_500)], t=(5.5, 5.51))   # after j4's ack
    h.ack("j4", 1, t=(5.2, 5.21))
    h.ack("j2", 2, t=(5.6, 5.61))
    h.res([kjob("j5", 1, "hot", 1_006_000), kjob("j6", 1, "hot", 1_006_000)], t=(6.0, 6.01))    # limit 2
    h.ack("j5", 1, t=(6.1, 6.11))
    h.ack("j6", 1, t=(6.1, 6.11))
    kenq(h, ["j7", "j8", "j9", "j10"], queue="chaos-rated")
    for jid, at in (("j7", 1_010_000), ("j8", 1_010_400), ("j9", 1_011_000)):
        h.res([kjob(jid, 1, "r", at, queue="chaos-rated")], t=(at / 1000 - 1000, at / 1000 - 999.99))
        h.ack(jid, 1, t=(at / 1000 - 999.9, at / 1000 - 999.89))
    h.res([kjob("j10", 1, "s", 1_012_000, queue="chaos-rated")], t=(12.0, 12.01))
    h.ack("j10", 1, t=(12.1, 12.11))
    r = run(h, keys=KEYS)
    assert r["valid"], failed(r)
    st = r["stats"]["keys"]
    assert st["chaos-keyed"]["peak_in_flight"] == {"in_flight": 2, "key": "hot", "limit": 2}
    assert (st["chaos-keyed"]["hand_outs"], st["chaos-keyed"]["jobs_handed_out"], st["chaos-keyed"]["acked_ok_jobs"]) == (7, 6, 6)
    assert st["chaos-rated"]["densest_key_window"] == {"hand_outs": 2, "key": "r", "count": 2, "period_ms": 1000}
    # Without keyed queues the three are skipped, and said so.
    inv = {i["name"]: i for i in run(H())["invariants"]}
    assert {inv[n].get("skipped") for n in ("key_concurrency_held", "key_rate_held", "queue_rate_held")} == {
        "no keyed queues configured"}


def test_two_jobs_of_one_key_in_flight_at_once_are_caught():
    def history(second_at: float, first_ack_at: float = 0.5, lease_ms: int = 2000):
        h = H()
        kenq(h, ["j1", "j2"])
        h.res([kjob("j1", 1, "a", 1_000_200, lease_ms=lease_ms)], t=(0.2, 0.21))
        at = int(1_000_000 + second_at * 1000)
        h.res([kjob("j2", 1, "a", at)], t=(second_at, second_at + 0.05))
        h.ack("j1", 1, t=(first_ack_at, first_ack_at + 0.01))
        h.ack("j2", 1, t=(max(first_ack_at, second_at) + 0.1, max(first_ack_at, second_at) + 0.11))
        return h
    assert run(history(0.6), keys=KEYS)["valid"]                    # after j1's ack was sent
    bad = only(run(history(0.3), keys=KEYS), "key_concurrency_held")
    ex = bad["examples"][0]
    assert (ex["job_id"], ex["key"], ex["key_concurrency"], ex["handed_out_at"]) == ("j2", "a", 1, 1_000_300)
    assert ex["also_in_flight"] == [{"job_id": "j1", "attempt": 1, "handed_out_at": 1_000_200, "lease_end": 1_002_200}]
    # Its lease lapsed (at 1_000_700, the ack of j1 comes late): the slot was free.
    assert run(history(0.7, first_ack_at=1.0, lease_ms=500), keys=KEYS)["valid"]
    bad = only(run(history(0.699, first_ack_at=1.0, lease_ms=500), keys=KEYS), "key_concurrency_held")
    # The ack was invoked (0.5) before j2's reserve was answered (0.55), but sent (1_000_500 wall)
    # after j2's stamp (1_000_450): certain, unless the cluster's clock may lag the wall clock.
    assert only(run(history(0.45, first_ack_at=0.5), keys=KEYS), "key_concurrency_held")
    assert run(history(0.45, first_ack_at=0.5), keys=KEYS, clock_lag_ms=100)["valid"]
    # Any settle of the attempt counts, whatever its outcome: a nack or release, or an ack that
    # failed (a retried call may have applied).
    for f in ("nack", "release", "failed ack"):
        h = history(0.6)
        ack = next(op for op in h.ops if op["f"] == "ack" and op["job_id"] == "j1")
        if f == "failed ack":
            ack.update(outcome="fail", error="attempt_mismatch")
            h.res([kjob("j1", 2, "a", 1_002_300)], t=(2.3, 2.31))       # after its lease
        else:
            ack.update(f=f, strategy="default", delay_ms=0, reason="r", max_attempts=3, dead_lettered=False,
                       releases=0)
            h.res([kjob("j1", 2, "a", 1_001_000, releases=int(f == "release"))], t=(1.0, 1.01))
        h.ack("j1", 2, t=(2.4, 2.41))
        assert run(h, keys=KEYS)["valid"], (f, failed(run(h, keys=KEYS)))
        ack.update(t0=0.62, w0=1_000_620, t1=0.63, w1=1_000_630)      # sent after j2's hand-out (1_000_600)
        assert only(run(h, keys=KEYS), "key_concurrency_held"), f
    # Three of the `hot` key (limit 2) at once.
    h = H()
    kenq(h, ["j1", "j2", "j3"])
    h.res([kjob("j1", 1, "hot", 1_000_200), kjob("j2", 1, "hot", 1_000_200), kjob("j3", 1, "hot", 1_000_200)],
          t=(0.2, 0.21))
    for j in ("j1", "j2", "j3"):
        h.ack(j, 1, t=(0.5, 0.51))
    bad = only(run(h, keys=KEYS), "key_concurrency_held")
    assert bad["examples"][0]["key_concurrency"] == 2 and len(bad["examples"][0]["also_in_flight"]) == 2


def test_two_hand_outs_of_one_key_in_the_same_ms_by_two_reserves():
    """One stamp for both: either was first, so a violation only when each was certainly still in
    flight at the other's hand-out."""
    h = H()
    kenq(h, ["j1", "j2"])
    h.res([kjob("j1", 1, "a", 1_000_200)], t=(0.2, 0.21))
    h.res([kjob("j2", 1, "a", 1_000_200)], t=(0.2, 0.22))
    h.ack("j1", 1, t=(0.5, 0.51))
    h.ack("j2", 1, t=(0.5, 0.51))
    assert only(run(h, keys=KEYS), "key_concurrency_held")["count"] == 2          # each one at the other
    h.ops[-1].update(t0=0.21, w0=1_000_200)          # j2's ack may have been applied before j1's hand-out
    assert run(h, keys=KEYS)["valid"]
    # A clock standing still (a leader whose clock is behind the replicated one): three of `hot`
    # (limit 2) with one stamp. j1 and j2 by one reserve, j3 by another that overlaps it, j1's
    # ack asked for before j3's reserve was answered: maybe j1, j2, ack j1, j3; never three at
    # once for certain. With j3's reserve asked for only after the first was answered, and j1's
    # ack after that, they were.
    h = H()
    kenq(h, ["j1", "j2", "j3"])
    h.res([kjob("j1", 1, "hot", 1_005_000), kjob("j2", 1, "hot", 1_005_000)], t=(0.2, 0.4))
    h.res([kjob("j3", 1, "hot", 1_005_000)], t=(0.3, 0.5))
    h.ack("j1", 1, t=(0.45, 0.46))
    h.ack("j2", 1, t=(0.6, 0.61))
    h.ack("j3", 1, t=(0.6, 0.61))
    r = run(h, keys=KEYS)
    assert r["valid"], failed(r)
    assert r["stats"]["keys"]["chaos-keyed"]["peak_in_flight"]["in_flight"] == 2
    h.ops[4].update(t0=0.41, w0=1_000_410)                            # j3's reserve
    h.ops[5].update(t0=0.55, t1=0.56, w0=1_000_550, w1=1_000_560)     # j1's ack
    bad = only(run(h, keys=KEYS), "key_concurrency_held")
    assert bad["examples"][0]["job_id"] == "j3" and len(bad["examples"][0]["also_in_flight"]) == 2


def test_more_hand_outs_of_a_key_or_a_queue_than_its_rate_are_caught():
    def history(times, tenants=None, queue="chaos-rated", release_first=False):
        h = H()
        jids = [f"j{i}" for i in range(len(times))]
        kenq(h, jids, queue=queue)
        for i, (jid, at) in enumerate(zip(jids, times)):
            t = (at - 1_000_000) / 1000
            tenant = (tenants or ["a"] * len(times))[i]
            h.res([kjob(jid, 1, tenant, at, queue=queue)], t=(t, t + 0.005))
            if release_first and i == 0:
                h.release(jid, 1, t=(t + 0.006, t + 0.007))
                h.res([kjob(jid, 2, tenant, at + 1, queue=queue, releases=1)], t=(t + 0.008, t + 0.009))
                h.ack(jid, 2, t=(t + 0.01, t + 0.011))
            else:
                h.ack(jid, 1, t=(t + 0.006, t + 0.007))
        return h
    assert run(history([1_000_000, 1_000_400, 1_001_000]), keys=KEYS)["valid"]
    bad = only(run(history([1_000_000, 1_000_400, 1_000_999]), keys=KEYS), "key_rate_held")
    ex = bad["examples"][0]
    assert (ex["key"], ex["count"], ex["period_ms"], ex["span_ms"]) == ("a", 2, 1000, 999)
    assert [x[0] for x in ex["hand_outs"]] == ["j0", "j1", "j2"]
    # A released job's next hand-out is a hand-out too (release refunds no rate token).
    bad = only(run(history([1_000_000, 1_000_500], release_first=True), keys=KEYS), "key_rate_held")
    assert [x[:2] for x in bad["examples"][0]["hand_outs"]] == [["j0", 1], ["j0", 2], ["j1", 1]]
    # A key's own override (slow: one a second).
    assert only(run(history([1_000_000, 1_000_900], tenants=["slow", "slow"]), keys=KEYS), "key_rate_held")
    # The queue-wide rate: 4 keys, one hand-out each, 4 within a second (limit 3).
    spread = history([1_000_000, 1_000_100, 1_000_200, 1_000_999], tenants=["a", "b", "c", "d"])
    bad = only(run(spread, keys=KEYS), "queue_rate_held")
    assert (bad["examples"][0]["count"], bad["examples"][0]["span_ms"]) == (3, 999)
    assert run(history([1_000_000, 1_000_100, 1_000_200, 1_001_000], tenants=["a", "b", "c", "d"]), keys=KEYS)["valid"]
    # chaos-keyed has no rate: as many hand-outs as it likes.
    assert run(history([1_000_000, 1_000_001, 1_000_002], tenants=["a", "b", "c"], queue="chaos-keyed"), keys=KEYS)["valid"]


def test_a_memory_mode_power_cut_that_erased_a_hand_out_excuses_the_next_one():
    """j1's hand-out was answered after the last durable point, and the cut rolled it back: the
    restarted cluster rightly handed out j2 of the same key (expected, counted apart)."""
    h = H()
    kenq(h, ["j1", "j2"])
    h.res([kjob("j1", 1, "a", 1_000_400)], t=(0.4, 0.41))
    h.res([kjob("j2", 1, "a", 1_001_000)], t=(1.0, 1.01))
    h.ack("j1", 1, t=(1.2, 1.21))
    h.ack("j2", 1, t=(1.2, 1.21))
    cut = {"kind": "power-loss", "durability": "memory", "durable_from_wall_ms": 1_000_300, "t_restart": 0.8,
           "w_cut": 1_000_500, "t_inject": 0.5}
    inv = {i["name"]: i for i in run(h, keys=KEYS, power_losses=[cut])["invariants"]}["key_concurrency_held"]
    assert inv["ok"] and inv.get("expected_after_power_loss") == 1, inv
    assert only(run(h, keys=KEYS), "key_concurrency_held")


def test_the_no_keys_switch_and_the_clock_lag_of_a_run():
    from raftq.cluster.chaos.runner import build_parser, clock_lag_ms, options_from_args
    from raftq.cluster.chaos.workload import KEY_QUEUE_SETTINGS, keys_config

    assert options_from_args(build_parser().parse_args([])).workload.keys
    assert not options_from_args(build_parser().parse_args(["--no-keys"])).workload.keys
    queues, spec = keys_config()
    assert [q["name"] for q in queues] == list(spec) == list(KEY_QUEUE_SETTINGS)
    assert spec["chaos-keyed"]["key_concurrency"] == 1 and spec["chaos-rated"]["key_rate"]["count"] == 5
    assert clock_lag_ms([{"kind": "kill-leader"}, {"kind": "clock-skew", "offset_ms": 3000}]) == 0
    assert clock_lag_ms([{"kind": "clock-skew", "offset_ms": -8000}, {"kind": "clock-strobe", "amplitude_ms": 500}]) == 8100
    assert clock_lag_ms([{"kind": "clock-skew", "offset_ms": -3000, "skipped": "no node"}]) == 0


def test_internal_errors_are_caught():
    h = H()
    h.enq("v1", t=(0, 1), outcome="unknown")
    h.ops[-1]["error"] = "internal"
    only(run(h), "no_internal_errors")


def test_unavailability_is_time_to_the_first_write_invoked_after_the_fault():
    h = H()
    h.enq("a", "ja", t=(0.9, 1.05))          # invoked before the fault: does not count
    h.enq("b", "jb", t=(1.1, 4.0))
    h.enq("c", "jc", t=(2.0, 3.5))
    h.enq("d", t=(1.2, 6.0), outcome="unknown")
    out = unavailability(h.ops, [{"kind": "kill-leader", "t_inject": 1.0}, {"kind": "latency", "t_inject": 9.0}])
    assert out[0]["unavailable_s"] == 2.5 and out[1]["unavailable_s"] is None
    assert percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 100], 99) == 100
    assert percentile([], 50) is None


# ---------------------------------------------------------------------------- the proxy
def _frame(b: bytes) -> bytes:
    return struct.pack("i", len(b)) + b


@pytest.fixture
def echo():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue

            def handle(c=c):
                with c:
                    try:
                        while True:
                            d = c.recv(65536)
                            if not d:
                                break
                            c.sendall(d)
                    except OSError:
                        pass

            threading.Thread(target=handle, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield port
    stop.set()
    srv.close()


def _net(echo_port, encrypted=True):
    # Node 0's address string is the larger one, so node 0 dials node 1 (the echo server).
    net = ProxyNet(["127.0.0.1:9", f"127.0.0.1:{echo_port}"], encrypted=encrypted)
    net.start()
    return net, net.links[(0, 1)]


def _recv(sock, n, timeout=1.0):
    sock.settimeout(timeout)
    out = b""
    try:
        while len(out) < n:
            d = sock.recv(n - len(out))
            if not d:
                break
            out += d
    except (socket.timeout, ConnectionResetError):
        pass
    return out


def test_proxy_passes_delays_and_maps_dials(echo):
    net, link = _net(echo, encrypted=False)             # handshake: one frame forward
    try:
        assert net.dial_maps() == {0: {f"127.0.0.1:{echo}": f"127.0.0.1:{link.port}"}, 1: {}}
        c = socket.create_connection(("127.0.0.1", link.port))
        c.sendall(_frame(b"hello"))
        assert _recv(c, 9) == _frame(b"hello")
        net.apply(NetState(latency={(0, 1): (0.15, 0.0)}))
        t0 = time.monotonic()
        c.sendall(b"abc")
        assert _recv(c, 3) == b"abc"
        assert time.monotonic() - t0 >= 0.28          # both directions delayed
        c.close()
    finally:
        net.close()


def test_proxy_one_way_stall_passes_the_handshake_then_cuts_on_heal(echo):
    net, link = _net(echo)
    try:
        net.apply(NetState(blocked={(0, 1)}))            # dialer -> target stalls
        c = socket.create_connection(("127.0.0.1", link.port))
        # The handshake (2 frames forward, 1 back) still passes, so pysyncobj can connect...
        c.sendall(_frame(b"key") + _frame(b"addr"))
        assert _recv(c, 7 + 8) == _frame(b"key") + _frame(b"addr")
        # ...but nothing after it.
        c.sendall(_frame(b"append_entries"))
        assert _recv(c, 18, timeout=0.5) == b""
        net.apply(NetState())                            # heal: the dirty connection is cut
        assert _recv(c, 1, timeout=1.0) == b""
        assert link.stats.cut >= 1 and link.stats.dropped_fwd > 0
        c.close()
    finally:
        net.close()


def test_proxy_partition_refuses_and_cuts_and_reset_cuts(echo):
    net, link = _net(echo, encrypted=False)
    try:
        c = socket.create_connection(("127.0.0.1", link.port))
        c.sendall(_frame(b"me") + b"x")
        assert _recv(c, 7) == _frame(b"me") + b"x"
        net.apply(NetState(blocked={(0, 1), (1, 0)}))
        assert _recv(c, 1) == b""                         # cut
        c2 = socket.create_connection(("127.0.0.1", link.port))
        assert _recv(c2, 1) == b""                        # refused
        net.apply(NetState())
        c3 = socket.create_connection(("127.0.0.1", link.port))
        c3.sendall(_frame(b"me") + b"y")
        assert _recv(c3, 7) == _frame(b"me") + b"y"
        assert net.reset() == 1
        assert _recv(c3, 1) == b""
        assert link.stats.refused >= 1
    finally:
        net.close()


def test_disk_faults_are_opt_in_and_named_disk():
    from raftq.cluster.chaos.nemesis import DISK_KINDS, KINDS, ScheduleConfig, plan_step
    from raftq.cluster.chaos.runner import build_parser, options_from_args
    import random

    assert not set(DISK_KINDS) & set(KINDS)
    kinds = options_from_args(build_parser().parse_args(["--faults", "all,power-loss,disk"])).faults
    assert kinds == KINDS + ("power-loss",) + DISK_KINDS
    # At most one disk-damaging fault per step.
    rng, cfg = random.Random(3), ScheduleConfig(kinds=DISK_KINDS + ("kill-leader", "latency"), mix_prob=1.0)
    for _ in range(200):
        chosen = [k for k, _, _ in plan_step(rng, cfg).faults]
        assert sum(1 for k in chosen if k in ("bitflip", "truncate", "rollback", "fsync-eio", "disk-full")) <= 1


def test_the_checker_wants_every_damage_found_and_no_untrusted_leader():
    bad = failed(run(H(), disk_faults=[{"id": 1, "kind": "bitflip", "node": "n2", "found": {}, "file": "raft.journal"}]))
    assert set(bad) == {"checksum_failures_contained"}
    bad = failed(run(H(), disk_faults=[], untrusted_claims=[{"t": 1.0, "node": "n1", "role": "leader", "term": 4}]))
    assert set(bad) == {"checksum_failures_contained"}
    logs = {"critical": [], "critical_by_node": {
        "n2": ["n2 CRITICAL raftq.node.raft.syncobj: disk check: journal_torn_tail in x: ..."],
        "n3": ["n3 CRITICAL raftq.node.raft.syncobj: disk check: journal_torn_tail in y: ..."]}}
    r = run(H(), node_logs=logs, disk_faults=[{"id": 1, "kind": "truncate", "node": "n2", "found": {"journal_truncated": 1}}])
    bad = failed(r)
    assert set(bad) == {"checksum_failures_contained", "no_critical_node_logs"}     # n3 was not damaged
    assert r["stats"]["disk_critical_lines"] == 1
    bad = failed(run(H(), disk_faults=[{"id": 2, "kind": "fsync-eio", "node": "n1", "exit_code": 1, "logged": False}]))
    assert set(bad) == {"failed_writes_stop"}


def test_critical_node_log_lines_are_caught():
    r = run(H(), node_logs={"critical": ["n3 CRITICAL pysyncobj.syncobj: truncating already-applied log entries"]})
    only(r, "no_critical_node_logs")


# ---------------------------------------------------------------------------- power loss
def test_power_loss_is_opt_in_and_leaves_every_schedule_as_it_was():
    """`power-loss` is drawn only when listed: "all" is the twelve kinds it always was, and
    plan_step draws the same steps for a seed as before the kind existed (fingerprints of the
    first 40 steps, computed with the code before it)."""
    import hashlib
    import random

    from raftq.cluster.chaos.runner import build_parser, options_from_args
    from raftq.cluster.chaos.nemesis import ALL_KINDS, KINDS, ScheduleConfig, plan_step

    assert "power-loss" not in KINDS and "power-loss" in ALL_KINDS and len(KINDS) == 12
    assert options_from_args(build_parser().parse_args([])).faults == KINDS
    assert options_from_args(build_parser().parse_args(["--faults", "all,power-loss"])).faults == KINDS + ("power-loss",)

    def fingerprint(kinds, seed):
        rng, cfg = random.Random(seed), ScheduleConfig(kinds=kinds)
        steps = [plan_step(rng, cfg) for _ in range(40)]
        text = repr([(round(s.quiet_s, 9), [(k, round(o, 9), round(h, 9)) for k, o, h in s.faults]) for s in steps])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    assert fingerprint(KINDS, 1) == "bd6ed5ad8a2b6264"
    assert fingerprint(KINDS, 41) == "115f57f0377f40a6"
    assert fingerprint(("kill-leader",), 1) == "718e82d1992db2c2"
    assert fingerprint(("reset", "partition-minority"), 3) == "d76bdfbdaa6ec742"
    assert fingerprint(("kill-leader", "pause-leader", "partition-oneway", "latency", "reset"), 5) == "f5c5a7fe23136b1a"
    # Listed, it runs alone, like kill-all.
    rng, cfg = random.Random(7), ScheduleConfig(kinds=("power-loss", "kill-leader", "latency"), mix_prob=1.0)
    for _ in range(50):
        kinds = [k for k, _, _ in plan_step(rng, cfg).faults]
        assert kinds == ["power-loss"] or "power-loss" not in kinds


def _cut(t_inject=5.0, t_restart=6.0, durable_from=1_004_000, durability="memory", w_cut=1_005_000):
    return {"kind": "power-loss", "id": 0, "t_inject": t_inject, "t_restart": t_restart, "w_cut": w_cut,
            "durable_from_wall_ms": durable_from, "durability": durability}


def test_memory_mode_power_cut_excuses_only_writes_after_the_last_durable_point():
    h = H()
    h.enq("old", "j-old", t=(1.0, 1.1))              # answered before the durable point: must survive
    h.enq("new", "j-new", t=(4.5, 4.6))              # answered after it, before the cut: may be lost
    h.enq("later", "j-later", t=(7.0, 7.1))          # after the restart: must survive
    h.res([h.job("j-later", 1, "later")], t=(7.2, 7.3))
    h.ack("j-later", 1, t=(7.4, 7.5))
    r = run(h, power_losses=[_cut()])
    bad = only(r, "lost")
    assert bad["count"] == 1 and bad["examples"][0]["value"] == "old"
    assert bad["expected_after_power_loss"] == 1 and r["stats"]["lost_after_power_loss"] == 1
    # fsync mode: a cut excuses nothing.
    bad = only(run(h, power_losses=[_cut(durability="fsync")]), "lost")
    assert bad["count"] == 2 and "expected_after_power_loss" not in bad
    # A job seen after the restart was not lost by the cut.
    h.res([h.job("j-new", 1, "new")], t=(8.0, 8.1))
    bad = only(run(h, power_losses=[_cut()]), "lost")
    assert bad["count"] == 2


def test_memory_mode_second_cut_may_erase_what_the_first_cut_put_at_risk():
    """Two cuts: a write answered in the first cut's window that survived it (re-replicated
    from a node that had written it back) may still be gone after the second, even though it
    was answered before the second cut's durable point: the nodes restarted from rolled-back
    disks held the re-replicated copy in memory only. Writes durable before the first cut, or
    answered between the cuts before the second's durable point, must still survive."""
    h = H()
    h.enq("safe", "j-safe", t=(1.0, 1.1))            # before the first cut's durable point
    h.enq("twice", "j-twice", t=(4.5, 4.6))          # in the first cut's window
    h.enq("between", "j-between", t=(6.5, 6.6))      # after the first restart, before the second durable point
    h.enq("late", "j-late", t=(7.5, 7.6))            # in the second cut's window
    h.res([h.job(j, 1, v) for j, v in (("j-safe", "safe"), ("j-twice", "twice"), ("j-between", "between"),
                                        ("j-late", "late"))], t=(8.0, 8.1))      # all four survived the first cut
    cuts = [_cut(), _cut(t_inject=9.0, t_restart=10.0, durable_from=1_007_000, w_cut=1_009_000)]
    cuts[1]["id"] = 1
    bad = only(run(h, power_losses=cuts), "lost")
    assert sorted(e["value"] for e in bad["examples"]) == ["between", "safe"]
    assert bad["expected_after_power_loss"] == 2


def test_memory_mode_power_cut_excuses_redelivery_of_a_lost_ack_only_across_the_cut():
    h = H()
    h.enq("v1", "j1", t=(1.0, 1.1))
    h.res([h.job("j1", 1, "v1", lease_expires=1_006_500)], t=(4.4, 4.5))
    h.ack("j1", 1, t=(4.6, 4.7))                         # in the window: may be lost
    h.res([h.job("j1", 1, "v1", lease_expires=1_009_000)], t=(8.0, 8.1))    # so delivered again, same attempt
    h.ack("j1", 1, t=(8.2, 8.3))
    r = run(h, power_losses=[_cut()])
    assert r["valid"], failed(r)
    exp = {i["name"]: i.get("expected_after_power_loss", 0) for i in r["invariants"]}
    assert exp["redelivery_attempts"] >= 1 and exp["no_delivery_after_ack"] >= 1
    # The same history with the ack answered before the last durable point is a violation.
    r = run(h, power_losses=[_cut(durable_from=1_004_800)])
    assert {"redelivery_attempts", "no_delivery_after_ack"} <= set(failed(r))


# ---------------------------------------------------------------------------- the report
def _report(r: dict, faults=(), durability="fsync", power_loss=None) -> dict:
    """What run_chaos makes of a checker result, as far as the report's first line reads it."""
    from collections import Counter
    return {"valid": r["valid"], "invariants": r["invariants"], "stats": r["stats"], "failures": r["failures"],
            "durability": durability, "power_loss": power_loss,
            "faults": {"total": len(faults), "by_kind": dict(Counter(f["kind"] for f in faults)), "list": list(faults),
                       "mixed_steps": 0, "skipped": 0}}


def test_docs_name_and_count_every_invariant():
    """docs/chaos.md states the run's number of invariants wherever it gives one (the checker's,
    and last the nodes' own checks that the runner adds), and its Invariants table names each one,
    in that order; check() reports exactly the checker's."""
    import re
    from pathlib import Path
    from raftq.cluster.chaos.checker import INVARIANTS
    from raftq.cluster.chaos.runner import add_core_invariants

    names = [n for n, _ in INVARIANTS]
    assert len(set(names)) == len(names)
    result = run(H())
    assert [i["name"] for i in result["invariants"]] == names
    add_core_invariants(result, [], {"critical": []})
    names = [i["name"] for i in result["invariants"]]
    assert names[-1] == "core_invariants_on_every_node"
    text = (Path(__file__).resolve().parent.parent / "docs" / "chaos.md").read_text()
    stated = [int(n) for n in re.findall(r"\b(\d+) invariants\b", text)]
    assert stated and set(stated) == {len(names)}, stated
    section = text.split("\n## Invariants\n", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| `([a-z_]+)` \|", section, re.M) == names


def test_failed_ops_sort_the_expected_from_the_unexpected():
    h = H()
    h.enq("v1", "j1")
    h.enq("v2", t=(0.0, 5.0), outcome="unknown")
    h.res([h.job("j1", 1, "v1", lease_expires=1_002_200)])
    h.extend("j1", 1, t=(2.4, 2.5), outcome="fail")["error"] = "attempt_mismatch"   # lease lapsed: fenced
    h.res([h.job("j1", 2, "v1", lease_expires=1_010_000)], t=(2.3, 2.35))
    h.ack("j1", 1, t=(2.6, 2.7), outcome="fail")["error"] = "attempt_mismatch"
    h.ack("j1", 2, t=(2.8, 2.9))
    h.enq("v3", "j3")
    h.res([h.job("j3", 1, "v3")])
    h.ack("j3", 1, outcome="fail")["error"] = "job_not_found"       # and the job never came back
    r = run(h)
    rows = {(x["f"], x["error"], x["cause"]): x for x in r["failures"]}
    assert rows[("extend", "attempt_mismatch", "fenced")]["expected"]
    assert rows[("ack", "attempt_mismatch", "fenced")]["expected"]
    assert rows[("enqueue", None, "unknown")]["expected"]
    odd = rows[("ack", "job_not_found", "unexplained_fence")]
    assert not odd["expected"] and odd["examples"][0]["job_id"] == "j3"
    assert set(failed(r)) == {"lost"}            # the invariants judge the job, not the refusal


def test_the_report_opens_with_its_verdict():
    from raftq.cluster.chaos.runner import format_report, verdict

    h = H()
    h.enq("v1", "j1")
    h.res([h.job("j1", 1, "v1")])
    h.ack("j1", 1)
    faults = [{"id": 0, "kind": "kill-leader", "node": "n2", "t_inject": 12.31, "t_heal": 13.8, "mixed": False},
              {"id": 1, "kind": "latency", "latency_ms": 200, "jitter_ms": 100, "links": ["n1-n2"],
               "t_inject": 20.0, "t_heal": 24.0, "mixed": True}]
    good = _report(run(h), faults)
    line = verdict(good)
    # A hand-made history leaves out what needs a cluster (views, logs, gates): skipped, and said so.
    assert line.startswith("PASS: no acknowledged job lost, no fencing violation, every invariant checked holds "
                           "(14 of 34; 20 skipped)"), line
    assert "2 faults of 2 kinds, 1 job enqueued, 1 acked, 0 dead-lettered" in line
    h.enq("v2", "j2")
    h.ack("j1", 1, t=(0.6, 0.7))                                 # a second ok ack: a fencing violation
    bad = _report(run(h), faults)
    line = verdict(bad)
    assert line.startswith("FAIL: 1 acknowledged job lost (ids j2), "
                           "1 fencing violation (no_delivery_after_ack 1)"), line
    bad.update(seed=1, nodes=3, duration_s=30, violations=2, ops={}, unavailability={"by_kind": {}},
               liveness={}, dir=None)
    bad["stats"]["worker_stalls"] = 0
    text = format_report(bad)
    assert text.splitlines()[0] == line
    assert "    kill-leader n2 at 12.3 s, back after 1.5 s" in text.splitlines()
    assert "{" not in text.split("operations by outcome")[0]          # no dict reprs in the fault lines


def test_every_fault_kind_has_a_line_in_words():
    from raftq.cluster.chaos.nemesis import ALL_KINDS, describe_fault

    for kind in ALL_KINDS:
        line = describe_fault({"id": 0, "kind": kind, "node": "n1", "t_inject": 1.0, "t_heal": 2.5})
        assert line.startswith(f"{kind} ") and " at 1.0 s, " in line and "after 1.5 s" in line, line
        assert "{" not in line and "None" not in line, line
    skipped = describe_fault({"kind": "kill-follower", "skipped": "no follower up"})
    assert skipped == "kill-follower skipped: no follower up"
