"""Time: every time comes from the commands' stamps; the replicated clock never goes
backwards (docs/semantics.md, Time)."""
from __future__ import annotations

from raftq.node.base import validate as C

from helpers_core import Core, T0


def test_replicated_clock_never_goes_backwards():
    c = Core()
    late = T0 + 10_000
    c.apply(C.enqueue({"queue": "q", "job_type": "t"}, c.limits, late, c.new_id), now=late)
    cmd = C.enqueue({"queue": "q", "job_type": "t"}, c.limits, T0, c.new_id)
    status, body = c.apply(cmd, now=T0)            # a stamp from a node whose clock is behind
    assert c.m.clock == late
    assert c.view(body["job_id"])["enqueued_at_ms"] == late
    cmd, _ = C.reserve({"queues": ["q"], "lease_ms": 1_000}, c.limits)
    job = c.apply(cmd, now=T0 + 5)[1]["jobs"][0]
    assert job["lease_expires_at_ms"] == late + 1_000
    c.apply(C.sweep(), now=T0 + 2_000)              # far "after" the lease by that clock
    assert c.state(job["id"]) == "in_flight"


def test_apply_batch_shares_one_stamp():
    c = Core()
    cmds = [C.enqueue({"queue": "q", "job_type": "t"}, c.limits, T0, c.new_id) for _ in range(3)]
    results = c.m.apply_batch(T0 + 7, cmds)
    assert [r[0] for r in results] == [200, 200, 200]
    assert {c.view(r[1]["job_id"])["enqueued_at_ms"] for r in results} == {T0 + 7}
