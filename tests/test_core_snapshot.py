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


def test_a_reserve_is_kept_under_its_request_id_as_fields_and_replayed_exactly():
    """The request-id store keeps a reserve's jobs as plain field tuples (not rendered dicts:
    ≈ 1.5 KB each for 60 s), replays the very same answer, and reads snapshots that kept the
    rendered jobs (older versions) into the same state and digest."""
    from node.machine import RESERVED, render_fields_of, render_job, _render_fields
    limits = Limits.build()
    m = QueueMachine(limits)
    new_id = _ids()
    now = 1_000_000
    shapes = [{}, {"payload": {"data_b64": "aGk=", "encoding": "text/plain"}},
              {"custom": {"a": 1, "b": "x", "c": 1.5, "d": True}, "priority": 7},
              {"trace_context": {"traceparent": "00-ab-cd-01", "tracestate": None}, "deadline_at_ms": now + 10**6},
              {"trace_context": {"traceparent": "00-ab-cd-01", "tracestate": "k=v"},
               "payload": {"data_b64": "AAEC", "encoding": "application/octet-stream"}, "max_attempts": 9}]
    for shape in shapes:
        m.apply(now, C.enqueue({"queue": "q", "job_type": "t", **shape}, limits, now, new_id))
    first = m.apply(now + 1, C.reserve({"queues": ["q"], "lease_ms": 1000, "max_jobs": 5}, limits, rid="r")[0])
    assert len(first[1]["jobs"]) == 5
    op, kept, _ = m.rids["r"]
    assert op == "res" and kept[0] == RESERVED and all(type(f) is tuple for f in kept[1])
    for job, fields in zip(first[1]["jobs"], kept[1]):
        assert render_job(*fields) == job
        assert render_fields_of(job) == fields == _render_fields(m.jobs[job["id"]])
    again = m.apply(now + 2, C.reserve({"queues": ["q"], "lease_ms": 1000, "max_jobs": 5}, limits, rid="r")[0])
    assert again == first
    # A snapshot as older versions wrote it: the rendered answer under the request id.
    data = m.to_builtins()
    data["rids"] = [(rid, o, first if rid == "r" else k, e) for rid, o, k, e in data["rids"]]
    old = QueueMachine.from_builtins(limits, data)
    assert old.rids["r"][1] == kept and old.digest() == m.digest()
    assert old.apply(now + 3, C.reserve({"queues": ["q"], "lease_ms": 1000, "max_jobs": 5}, limits, rid="r")[0]) == first
