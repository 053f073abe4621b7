"""Dependencies between jobs in the core (node/core/deps.py, docs/semantics.md "Dependencies"): a
job enqueued with `depends_on` waits until each dependency ends; `success` fails it (dead-lettered,
cause dependency_failed, down the graph) when one is dead-lettered or removed, `complete` and
`ignore` run it either way; unknown dependencies refuse it; a dependency acked while a live job
names it is kept, with its result, until the last such job ends. Jobs are enqueued through the
request bodies (validate.py's `depends_on` and `ref`); a few tests build items themselves
(ops.item's `depends_on`). Every command below is also faulted at each of its mutation points
(tests/test_core_faults.py `faulted`), and the state goes through a snapshot round trip and a
replay."""
from __future__ import annotations

import pytest

from helpers_core import RETAIN, Core, err, payload, restored
from raftq.node.base import validate as C
from raftq.node.core import ops
from raftq.node.core.jobs import DEPENDENCY_FAILED
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
        """Enqueue one job depending on `deps` ((job id, policy), ...), through the request body: the answer."""
        body = {"queue": queue, "job_type": "t", **fields}
        if deps:
            body["depends_on"] = [{"job_id": d, "policy": p} for d, p in deps]
        return self.apply(C.enqueue(body, self.m.limits, self.now, self.new_id))

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
    before = c.snapshot_state()
    status, body = c.cancel(a)              # d waits on it: refused, nothing changed
    assert status == 409 and body["error"]["reason"] == "has_dependents" and body["error"]["dependents"] == [d]
    assert c.snapshot_state() == before
    status, body = c.cancel(a, cascade="true")
    assert status == 200 and body == {"job_id": a, "cancelled": [d]}
    assert c.view(a) is None and c.view(d) is None and c.m.dependents == {} and c.m.pins == {}
    assert c.audit()[0]["details"] == {"queue": "q", "cascade": 1}
    e = c.enq_id()
    assert c.cancel(e, cascade="true")[1] == {"job_id": e, "cancelled": []}
    assert c.cancel(c.enq_id(), cascade="maybe")[0] == 400


def test_a_cascade_cancels_a_whole_graph_deepest_first_and_fails_nothing():
    """A diamond and a chain under one root: every waiting job goes, none is dead-lettered (the
    deepest are removed before what they wait on); a job waiting on something else too goes as
    well (it waited on a cancelled one)."""
    c = Deps(storage=RETAIN)
    root, other = c.enq_id(), c.enq_id()
    left = c.enq_id(deps=[(root, S)])
    right = c.enq_id(deps=[(root, CO)])
    join = c.enq_id(deps=[(left, S), (right, S), (other, S)])
    chain = [join]
    for _ in range(30):
        chain.append(c.enq_id(deps=[(chain[-1], S)]))
    status, body = c.cancel(root, cascade="true")
    assert status == 200 and body["cancelled"] == sorted([left, right] + chain)
    assert c.dead_letters() == [] and c.m.pending_deps == {} and c.m.dependents == {}
    assert state(c, other) == "ready"


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


# ---------------------------------------------------------------------------- the request bodies
def test_depends_on_takes_ids_or_objects_and_the_job_shows_it():
    c = Deps()
    a, x = c.enq_id(), c.enq_id()
    b = c.enqueue_id(depends_on=[a, {"job_id": x.upper(), "policy": "complete"}])
    v = c.view(b)
    assert v["depends_on"] == [{"job_id": a, "policy": "success"}, {"job_id": x, "policy": "complete"}]
    assert v["state"] == "waiting" and v["waiting_on"] == [a, x]
    assert c.stats()["waiting"] == 1
    c.finish(a)
    c.finish(x)
    job = c.reserve_one()
    assert job["id"] == b and job["depends_on"] == v["depends_on"]     # a worker sees what it depends on
    assert "depends_on" not in c.view(a) and "waiting" not in c.stats()


@pytest.mark.parametrize("depends_on, says", [
    ("x", "must be a list"),
    ([{"job_id": "00000000-0000-4000-8000-0000000000aa", "policy": "maybe"}], "policy"),
    ([{"job_id": "00000000-0000-4000-8000-0000000000aa", "ref": "r"}], "one of job_id or ref"),
    ([{"policy": "success"}], "one of job_id or ref"),
    (["not-a-uuid"], "canonical UUID"),
    (["00000000-0000-4000-8000-0000000000aa"] * 2, "twice"),
    ([{"ref": "r"}], "ref"),
])
def test_a_bad_depends_on_refuses_the_job_naming_the_field(depends_on, says):
    c = Deps()
    before = c.snapshot_state()
    status, body = c.enqueue(depends_on=depends_on)
    rej = body["error"]["rejection"]
    assert status == 422 and rej["reason"] == "invalid_request" and says in rej["message"], body
    assert c.snapshot_state() == before


def test_too_many_dependencies_is_refused_with_the_limit():
    c = Deps(limits={"max_dependencies_per_job": 2})
    ids = [c.enq_id() for _ in range(3)]
    status, body = c.enqueue(depends_on=ids)
    assert status == 422 and body["error"]["rejection"] == {"reason": "too_many_dependencies", "limit": 2, "actual": 3}
    assert c.enqueue(depends_on=ids[:2])[0] == 200


def test_an_atomic_graph_names_its_jobs_by_ref():
    """fetch -> (resize, tag) -> publish, one request; a ref names an earlier job only."""
    c = Deps()
    status, body = c.atomic([
        {"queue": "q", "job_type": "fetch", "ref": "fetch"},
        {"queue": "q", "job_type": "resize", "ref": "resize", "depends_on": [{"ref": "fetch"}]},
        {"queue": "q", "job_type": "tag", "ref": "tag", "depends_on": [{"ref": "fetch", "policy": "complete"}]},
        {"queue": "q", "job_type": "publish", "depends_on": [{"ref": "resize"}, {"ref": "tag"}]},
    ])
    assert status == 200, body
    fetch, resize, tag, publish = [r["job_id"] for r in body["results"]]
    assert c.view(publish)["depends_on"] == [{"job_id": resize, "policy": "success"},
                                             {"job_id": tag, "policy": "success"}]
    order = []
    while (jobs := c.reserve_jobs(max_jobs=10)):
        for j in jobs:
            order.append(j["job_type"])
            c.ack(j["id"], j["attempt"])
    assert order[0] == "fetch" and order[-1] == "publish" and sorted(order[1:3]) == ["resize", "tag"]
    before = c.snapshot_state()
    status, body = c.atomic([{"queue": "q", "job_type": "t", "depends_on": [{"ref": "later"}]},
                             {"queue": "q", "job_type": "t", "ref": "later"}])
    assert status == 422 and body["error"]["errors"][0]["index"] == 0      # no forward refs: no cycles
    status, body = c.atomic([{"queue": "q", "job_type": "t", "ref": "a"}, {"queue": "q", "job_type": "t", "ref": "a"}])
    assert status == 422 and "two jobs" in body["error"]["errors"][0]["rejection"]["message"]
    assert c.snapshot_state() == before


def test_a_batch_job_may_depend_on_an_earlier_one_by_ref():
    c = Deps()
    status, body = c.batch([{"queue": "q", "job_type": "t", "ref": "a"},
                            {"queue": "q", "job_type": "t", "depends_on": [{"ref": "a"}]}])
    a, b = [r["job_id"] for r in body["results"]]
    assert c.view(b)["waiting_on"] == [a]


# ---------------------------------------------------------------------------- results read by dependents
def test_a_dependency_is_kept_with_its_result_while_a_live_job_names_it():
    """In a queue that keeps no results: the dependency, once acked, stays (succeeded, with its
    result) until its last live dependent ends, then goes in that command."""
    c = Deps()
    a = c.enq_id()
    b = c.enq_id(deps=[(a, S)])
    d = c.enq_id(deps=[(a, CO)])
    job = c.reserve_one()
    assert c.ack(a, job["attempt"], result=payload(b"42"))[0] == 200
    v = c.view(a)
    assert v["state"] == "succeeded" and v["result"]["data_b64"] == payload(b"42")["data_b64"]
    assert v["live_dependents"] == 2
    c.advance(10_000)
    c.sweep()                               # past its (zero) retention: kept for b and d
    c.finish(b)
    assert c.view(a)["live_dependents"] == 1
    job = c.reserve_one()
    assert c.nack(d, job["attempt"], retry={"strategy": "dead_letter"})[0] == 200      # d ends too
    assert c.view(a) is None and c.m.pins == {}


def test_a_retained_dependency_outlives_neither_its_retention_nor_its_dependents():
    c = Deps(queues=[{"name": "q", "result_retention_ms": 5000}])
    a = c.enq_id()
    b = c.enq_id(deps=[(a, S)])
    c.finish(a)
    c.finish(b)                             # b ends before a's retention: a stays for it
    assert c.view(a)["state"] == "succeeded"
    c.advance(5000)
    c.sweep()
    assert c.view(a) is None


def test_a_requeued_dependent_reads_again_and_a_purge_takes_waiting_jobs():
    c = Deps(storage=RETAIN)
    a = c.enq_id("other")
    b = c.enq_id(deps=[(a, S)])
    x = c.enq_id(deps=[(a, CO)])
    c.finish(a, queue="other")
    c.finish(b, ok=False)                   # dead-lettered: reads no more
    assert c.m.pins == {a: {x: None}}
    assert c.requeue([b])[0] == 200
    assert c.m.pins == {a: {x: None, b: None}} or c.m.pins == {a: {b: None, x: None}}
    y = c.enq_id("q", deps=[(c.enq_id("other"), S)])
    assert c.purge("q")[1]["purged"] == 3   # x and b ready, y waiting
    assert c.view(y) is None and c.m.pending_deps == {} and c.m.pins == {}


def test_what_a_dependency_costs_in_memory():
    """docs/limits.md "Job results": a job with one dependency takes ~620 bytes more than a plain
    job (its own spec, its pending and dependents entries, its pin), each further one ~250."""
    import tracemalloc

    def per_job(n: int, jobs: int = 1000) -> float:
        c = Core()
        base = [c.enqueue_id() for _ in range(50)]
        bodies = [{"queue": "q", "job_type": "t", **({"depends_on": [base[(i + k) % 50] for k in range(n)]} if n else {})}
                  for i in range(jobs)]
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for body in bodies:
            assert c.m.apply(c.now, C.enqueue(body, c.limits, c.now, c.new_id))[0] == 200
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        return sum(s.size_diff for s in after.compare_to(before, "filename")) / jobs

    plain, one, ten = per_job(0), per_job(1), per_job(10)
    assert one - plain < 900 and (ten - one) / 9 < 400, (plain, one, ten)


# ---------------------------------------------------------------------------- found by the model (tests/test_core_model.py)
def test_a_purge_removes_the_waiting_jobs_its_own_removals_release():
    """A `complete` or `ignore` dependent of a purged job was waiting when the purge began: it goes
    too. (It used to be made ready by the removal and then lost with the ready index, counted
    ready and never reservable; a scheduled one stayed.) A `success` one fails with it."""
    c = Deps(storage=RETAIN)
    a = c.enq_id()
    b = c.enq_id(deps=[(a, CO)])
    d = c.enq_id(deps=[(a, IG)], delay_ms=5000)
    x = c.enq_id(deps=[(a, S)])
    status, body = c.purge("q")
    assert status == 200 and body["purged"] == 3            # a, b and d; x failed with a
    assert c.view(b) is None and c.view(d) is None and state(c, x) == "dead_lettered"
    stats = c.stats()
    assert (stats["ready"], stats["scheduled"], stats.get("waiting", 0)) == (0, 0, 0)
    assert c.reserve_jobs(max_jobs=5) == []


def test_a_purge_fails_dependents_in_one_order_on_every_node():
    """A purge removes its ready jobs in id order, so their dependents fail in the same order on a
    node restored from a snapshot (it went by the ready heap's array, which a restore rebuilds
    differently: the dead letters, and what drains them, differed between replicas)."""
    c = Core(storage=RETAIN)
    ids = [c.enqueue_id(priority=p) for p in (9, 0, 9, 1)]
    c.cancel(ids[2])                        # a stale entry in the heap, which a snapshot leaves out
    ids += [c.enqueue_id(priority=p) for p in (9, 1)]
    ready = [i for i in ids if c.state(i) == "ready"]
    for i in ready:
        c.enqueue_id("o", depends_on=[i])
    r = restored(c)
    cmd = C.purge("q", c.limits)
    for m in (c.m, r):
        assert m.apply(c.now, cmd)[1]["purged"] == len(ready)

    def failed(m):
        return [rec["job"]["depends_on"][0]["job_id"] for rec in m.list_dead_letters("o", 100, None)[0]]
    assert failed(c.m) == failed(r) == sorted(ready)
    assert r.digest() == c.m.digest()


def test_an_atomic_batch_depending_on_an_earlier_job_that_makes_none_is_refused_whole():
    """An atomic batch is all or nothing: a job that depends (by ref) on an earlier one whose key
    hits a job that is gone, or which is dead-lettered at once without a store, refuses the batch
    (the later job used to be refused alone as it was applied, the rest of the batch made)."""
    c = Deps(storage=RETAIN)
    dead = c.enq_id()
    c.finish(dead, ok=False)
    gone = c.enq_id("q", idempotency_key="k")
    c.finish(gone)                          # acked: its key's record lives on, the job does not
    before = c.snapshot_state()
    status, body = c.atomic([{"queue": "q", "job_type": "t"},
                             {"queue": "q", "job_type": "t", "idempotency_key": "k", "ref": "hit"},
                             {"queue": "q", "job_type": "t", "depends_on": [{"ref": "hit"}]}])
    assert status == 422 and [e["index"] for e in body["error"]["errors"]] == [2], body
    assert body["error"]["errors"][0]["rejection"] == {"reason": "dependency_not_found", "job_id": gone}
    assert c.snapshot_state() == before
    assert c.configure(storage={"dead_letter_retention_ms": 0})[0] == 200     # the store stays
    before = c.snapshot_state()
    status, body = c.atomic([{"queue": "q", "job_type": "t", "ref": "doomed", "depends_on": [dead]},
                             {"queue": "q", "job_type": "t", "depends_on": [{"ref": "doomed", "policy": "complete"}]}])
    assert status == 422 and [e["index"] for e in body["error"]["errors"]] == [1], body
    assert c.snapshot_state() == before


def test_a_graph_sent_again_with_its_keys_answers_its_existing_jobs():
    """A `ref` names the job its item stands for: on an idempotency-key hit, the existing job. A
    keyed graph sent again (its answer lost, its request id's window past) is deduplicated whole,
    and a new job depending on a hit depends on the existing job."""
    c = Deps()
    graph = [{"queue": "q", "job_type": "t", "idempotency_key": "g1", "ref": "a"},
             {"queue": "q", "job_type": "t", "idempotency_key": "g2", "depends_on": [{"ref": "a"}]}]
    status, first = c.atomic(graph)
    a, b = [r["job_id"] for r in first["results"]]
    status, again = c.atomic(graph)
    assert status == 200 and [(r["job_id"], r["deduplicated"]) for r in again["results"]] == [(a, True), (b, True)]
    status, more = c.batch([{**graph[0]}, {"queue": "q", "job_type": "t", "depends_on": [{"ref": "a"}]}])
    new = more["results"][1]["job_id"]
    assert c.view(new)["depends_on"] == [{"job_id": a, "policy": "success"}] and c.view(new)["waiting_on"] == [a]


def test_a_queue_with_waiting_jobs_is_not_deleted_and_the_refusal_says_why():
    """The refusal's `jobs` counts the waiting jobs (it left them out: all zeros, "not empty ()")."""
    c = Deps(storage=RETAIN)
    a = c.enq_id("x")
    c.enq_id("w", deps=[(a, S)])
    status, body = c.delete_queue("w")
    assert status == 409 and body["error"]["reason"] == "not_empty"
    assert body["error"]["jobs"] == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 0, "waiting": 1}
    assert "1 waiting" in body["error"]["message"]


def test_a_dependency_kept_past_its_retention_costs_a_restored_node_no_sweep_budget():
    """A dependency kept for a live dependent past its retention is not counted by the sweep
    (results_expired) nor against sweep_limit. A node restored from a snapshot has its timer
    again; it used to count it there, and so expired fewer records than the others in a sweep."""
    c = Core(storage={"sweep_limit": 1}, queues=[{"name": "r", "result_retention_ms": 1000}])
    a = c.enqueue_id()
    c.enqueue_id(depends_on=[a])
    c.ack(a, c.reserve_one()["attempt"])    # kept for its dependent (its queue keeps none)
    assert c.sweep()["results_expired"] == 0 and c.state(a) == "succeeded"
    x = c.enqueue_id("r")
    c.ack(x, c.reserve_one(["r"])["attempt"])
    r = restored(c)
    c.advance(1000)
    got = [m.apply(c.now, C.sweep()) for m in (c.m, r)]
    assert got[0] == got[1] and got[0][1]["results_expired"] == 1
    assert c.view(x) is None and r.job_view(x) is None and r.digest() == c.m.digest()


def test_a_rendered_job_reads_back_with_its_key_and_dependencies():
    """answers.shown_fields_of (an answer kept rendered, read back into a result) keeps the
    trailing fields a job shows: resource, key, depends_on."""
    from raftq.node.core.answers import render_job, shown_fields_of
    from raftq.node.core.jobs import shown_fields
    c = Deps(queues=[{"name": "q", "key_field": "tenant"}])
    a = c.enq_id()
    b = c.enq_id(deps=[(a, CO)], custom={"tenant": "t1"}, resource="db")
    for job_id in (a, b):
        t = shown_fields(c.m.jobs[job_id])
        assert shown_fields_of(render_job(*t)) == t
