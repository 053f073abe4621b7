"""A replica restored from a snapshot must stay identical to one that lived through the history,
even though the snapshot drops the stale heap entries the live replica still carries."""
import itertools
import uuid

from node import commands as C
from node.limits import Limits
from node.machine import QueueMachine


def _ids():
    c = itertools.count(1)
    return lambda: str(uuid.UUID(int=next(c)))


def test_sweep_budget_ignores_stale_entries_so_restored_replicas_do_not_diverge():
    limits = Limits.build(storage={"sweep_limit": 2, "dead_letter_retention_ms": 10**9,
                                   "dedup_window_ms": 1000})
    live = QueueMachine(limits)
    new_id = _ids()
    now = 1_000_000
    jobs = []
    for i in range(6):
        live.apply(now, C.enqueue({"queue": "q", "job_type": "t", "idempotency_key": f"k{i}",
                                   "delay_ms": 10 + i}, limits, now, new_id, rid=f"r{i}"))
    live.apply(now + 50, C.sweep())                      # promote all six (in budgets of two)
    live.apply(now + 50, C.sweep())
    live.apply(now + 50, C.sweep())
    got = live.apply(now + 60, C.reserve({"queues": ["q"], "lease_ms": 100, "max_jobs": 6}, limits)[0])[1]["jobs"]
    assert len(got) == 6
    for j in got:                                        # every extend leaves a stale lease entry
        for k in range(3):
            live.apply(now + 61 + k, C.extend(j["id"], {"attempt": 1, "lease_ms": 100 + k}))
        jobs.append(j["id"])
    restored = QueueMachine.from_builtins(limits, live.to_builtins())
    assert restored.digest() == live.digest()
    t = now + 5000
    for step in range(6):
        a = live.apply(t + step, C.sweep())
        b = restored.apply(t + step, C.sweep())
        assert a == b, (step, a, b)
        assert live.digest() == restored.digest(), step
    assert live.queue_stats("q")["ready"] == 6
