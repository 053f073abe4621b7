"""Dependencies between jobs in the core (node/core/deps.py, issue 34 point 2's first step): a job
enqueued with `depends_on` waits until each dependency ends; `success` fails it (dead-lettered,
cause dependency_failed, down the graph) when one is dead-lettered or removed, `complete` and
`ignore` run it either way; unknown dependencies refuse it. No request body makes such an item
yet, so these tests build the enqueue items themselves (ops.item's `depends_on`). Every
command below is also faulted at each of its mutation points (tests/test_core_faults.py
`faulted`), and the state goes through a snapshot round trip and a replay."""
from __future__ import annotations

import pytest

from helpers_core import RETAIN, Core, err, payload, restored
from raftq.node.base import validate as C
from raftq.node.core import ops
from raftq.node.core.deps import DEPENDENCY_FAILED
from raftq.node.core.jobs import WAITING
from test_core_faults import faulted


class Deps(Core):
    """A Core whose every command is first faulted at each of its mutation points on a twin
    machine pair (the real machine `m` takes the same commands afterwards)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.a, self.b = type(self.m)(self.limits), type(self.m)(self.limits)

    def apply(self, cmd, now=None):
        now = self.now if now is None else now
        self.a.apply_batch(now, [])
        self.b.apply_batch(now, [])
        faulted(self.a, self.b, cmd)
        self.a.check_invariants()
        out = super().apply(cmd, now)
        self.m.check_invariants()
        return out

    def enq(self, queue="q", deps=(), **fields) -> tuple:
        """Enqueue one job depending on `deps` ((job id, policy), ...): the answer."""
        cmd = C.enqueue({"queue": queue, "job_type": "t", **fields}, self.m.limits, self.now, self.new_id)
        return self.apply(with_deps(cmd, deps))

    def enq_id(self, queue="q", deps=(), **fields) -> str:
        status, body = self.enq(queue, deps, **fields)
        assert status == 200, body
        return body["job_id"]

    def finish(self, job_id: str, ok: bool = True, queue="q"):
        job = self.reserve_one([queue])
        assert job["id"] == job_id, (job, job_id)
        if ok:
            assert self.ack(job_id, job["attempt"])[0] == 200
        else:
            assert self.nack(job_id, job["attempt"], retry={"strategy": "dead_letter"})[0] == 200


def with_deps(cmd: tuple, deps, items=None) -> tuple:
    """An enqueue command whose items (all, or those of `items`) depend on `deps`."""
    op, rid, mode, its = cmd
    out = []
    for i, it in enumerate(its):
        if items is None or i in items:
            it = ops.item(*(tuple(it) + (None,) * (16 - len(it))), depends_on=tuple(deps))
        out.append(it)
    return op, rid, mode, tuple(out)


def state(c: Core, job_id: str):
    v = c.m.job_view(job_id)
    return None if v is None else v["state"]


S, CO, IG = ops.DEP_SUCCESS, ops.DEP_COMPLETE, ops.DEP_IGNORE


def test_a_dependent_waits_until_its_dependency_succeeds_then_runs():
    c = Deps()
    a = c.enq_id()
    b = c.enq_id(deps=[(a, S)])
    v = c.view(b)
    assert v["state"] == "waiting" and v["waiting_on"] == [a]
    assert c.m.queues["q"].waiting == 1 and c.m.queues["q"].depth() == 2
    assert c.reserve_jobs(max_jobs=5)[0]["id"] == a      # b is not reservable meanwhile
    assert c.reserve_jobs() == []
    c.ack(a, 1)
    assert state(c, b) == "ready" and c.m.queues["q"].waiting == 0
    assert c.reserve_one()["id"] == b


def test_every_dependency_must_end_and_they_may_be_in_other_queues():
    c = Deps()
    a, x = c.enq_id("q"), c.enq_id("other")
    b = c.enq_id("q", deps=[(a, S), (x, CO)])
    c.finish(x, queue="other")
    assert state(c, b) == "waiting" and c.view(b)["waiting_on"] == [a]
    c.finish(a)
    assert state(c, b) == "ready"


@pytest.mark.parametrize("policy, runs", [(S, False), (CO, True), (IG, True)])
def test_a_dead_lettered_dependency_fails_success_dependents_only(policy, runs):
    c = Deps(storage=RETAIN)
    a = c.enq_id()
    b = c.enq_id(deps=[(a, policy)])
    c.finish(a, ok=False)
    if runs:
        assert state(c, b) == "ready"
    else:
        assert state(c, b) == "dead_lettered"
        rec = next(r for r in c.dead_letters() if r["job"]["id"] == b)
        assert rec["cause"] == DEPENDENCY_FAILED


def test_a_failure_goes_down_the_graph_and_stops_at_complete():
    c = Deps(storage=RETAIN)
    a = c.enq_id()
    b = c.enq_id(deps=[(a, S)])
    d = c.enq_id(deps=[(b, S)])
    e = c.enq_id(deps=[(b, CO)])
    c.finish(a, ok=False)
    assert [state(c, j) for j in (b, d, e)] == ["dead_lettered", "dead_lettered", "ready"]
    assert [r["job"]["id"] for r in c.dead_letters()] == [a, b, d]      # in the order they ended


def test_a_long_chain_fails_without_recursion():
    c = Core(storage=RETAIN)                # (not faulted: 2,000 commands)
    ids = [c.enqueue_id()]
    for _ in range(2000):
        cmd = C.enqueue({"queue": "q", "job_type": "t"}, c.limits, c.now, c.new_id)
        status, body = c.apply(with_deps(cmd, [(ids[-1], S)]))
        ids.append(body["job_id"])
    job = c.reserve_one()
    c.nack(ids[0], job["attempt"], retry={"strategy": "dead_letter"})
    assert c.m.queues["q"].dead == 2001 and c.m.pending_deps == {} and c.m.dependents == {}
    c.m.check_invariants()


def test_dependencies_that_ended_before_count_at_once():
    c = Deps(storage=RETAIN, queues=[{"name": "q", "result_retention_ms": 60_000}])
    ok = c.enq_id()
    c.finish(ok)                            # retained: succeeded
    bad = c.enq_id()
    c.finish(bad, ok=False)                 # a dead letter
    assert state(c, c.enq_id(deps=[(ok, S)])) == "ready"
    assert state(c, c.enq_id(deps=[(bad, CO), (ok, S)])) == "ready"
    assert state(c, c.enq_id(deps=[(bad, S)])) == "dead_lettered"


def test_an_unknown_dependency_refuses_the_job_and_changes_nothing():
    c = Deps()
    gone = c.enq_id("plain")
    c.finish(gone, queue="plain")           # acked in a queue that keeps nothing: unknown now
    before = c.snapshot_state()
    for dep in (gone, "00000000-0000-4000-8000-0000000000ff"):
        status, body = c.enq(deps=[(dep, S)])
        assert status == 422 and body["error"]["rejection"] == {"reason": "dependency_not_found", "job_id": dep}
    after = c.snapshot_state()
    assert after == before


def test_an_atomic_batch_may_depend_on_its_own_earlier_jobs_and_is_refused_whole_otherwise():
    c = Deps()
    ids = iter(["00000000-0000-4000-8000-00000000a001", "00000000-0000-4000-8000-00000000a002"])
    cmd = C.enqueue_atomic({"jobs": [{"queue": "q", "job_type": "t"}] * 2}, c.limits, c.now, lambda: next(ids))
    status, body = c.apply(with_deps(cmd, [("00000000-0000-4000-8000-00000000a001", S)], items={1}))
    assert status == 200
    first, second = [r["job_id"] for r in body["results"]]
    assert state(c, first) == "ready" and state(c, second) == "waiting"
    before = c.snapshot_state()
    cmd = C.enqueue_atomic({"jobs": [{"queue": "q", "job_type": "t"}] * 2}, c.limits, c.now, c.new_id)
    status, body = c.apply(with_deps(cmd, [("00000000-0000-4000-8000-0000000000ee", S)], items={1}))
    assert status == 422 and body["error"]["errors"][0]["index"] == 1
    assert c.snapshot_state() == before


def test_cancel_of_a_waiting_job_and_of_a_dependency():
    c = Deps(storage=RETAIN)
    a = c.enq_id()
    b = c.enq_id(deps=[(a, S)])
    d = c.enq_id(deps=[(a, CO)])
    assert c.cancel(b)[0] == 200
    assert c.m.dependents == {a: {d: CO}} and c.m.queues["q"].waiting == 1
    assert c.cancel(a)[0] == 200            # removed: complete runs, success would fail
    assert state(c, d) == "ready"
    e = c.enq_id()
    f = c.enq_id(deps=[(e, S)])
    c.cancel(e)
    assert state(c, f) == "dead_lettered"


def test_a_deadline_runs_out_while_waiting():
    c = Deps(storage=RETAIN)
    a = c.enq_id()
    b = c.enq_id(deps=[(a, S)], deadline_at_ms=c.now + 1000)
    c.advance(1000)
    assert c.sweep()["deadlines_expired"] == 1
    assert state(c, b) == "dead_lettered" and c.m.dependents == {}
    assert next(r for r in c.dead_letters() if r["job"]["id"] == b)["cause"] == "expired"


def test_a_scheduled_dependent_keeps_its_time_and_a_purge_fails_dependents():
    c = Deps(storage=RETAIN)
    a = c.enq_id()
    b = c.enq_id(deps=[(a, S)], delay_ms=5000)
    c.finish(a)
    assert state(c, b) == "scheduled"
    c.advance(5000)
    c.sweep()
    assert state(c, b) == "ready"
    x = c.enq_id()
    y = c.enq_id(deps=[(x, S)])
    assert c.purge("q")[0] == 200           # removes the ready ones (x, b), not the waiting one ...
    assert state(c, y) == "dead_lettered"   # ... which fails with its dependency


def test_a_dependent_counts_against_the_queue_depth():
    c = Deps(queues=[{"name": "q", "max_queue_depth": 2}])
    a = c.enq_id()
    c.enq_id(deps=[(a, S)])
    status, body = c.enq(deps=[(a, S)])
    assert status == 422 and body["error"]["rejection"]["reason"] == "queue_full"


def test_snapshot_round_trip_and_replay_keep_the_graph():
    c = Deps(storage=RETAIN)
    a, x = c.enq_id(), c.enq_id()
    b = c.enq_id(deps=[(a, S), (x, IG)])
    c.enq_id(deps=[(b, CO)])
    m = restored(c)
    assert m.pending_deps == c.m.pending_deps and m.dependents == c.m.dependents
    assert m.to_builtins() == c.m.to_builtins()
    replay = Core(storage=RETAIN)
    for now, cmd in c.log:
        replay.m.apply(now, cmd)
    assert replay.m.digest() == c.m.digest()
    c.finish(a)
    assert state(c, b) == "waiting"         # x has not ended


def test_a_state_without_dependencies_writes_and_hashes_as_before():
    c = Core()
    c.enqueue_id()
    data = c.m.to_builtins()
    assert "deps" not in data and all(len(counters) == 10 for _, counters, _ in data["queues"])
    assert WAITING == 5
