"""A replica restored from a snapshot must stay identical to one that lived through the history,
even though the snapshot drops the stale heap entries the live replica still carries."""
import itertools
import pickle
import uuid

import pytest

from raftq.node.base import validate as C
from raftq.node.core.limits import Limits

from helpers_core import Core, QueueMachine, RETAIN, _kill, counter_ids, payload


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
    from raftq.node.core.answers import render_job, shown_fields_of as render_fields_of
    from raftq.node.core.jobs import shown_fields as _render_fields
    from raftq.node.core.ops import RESERVED
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


def test_a_replica_that_renders_no_answers_keeps_the_same_state_and_replays_the_same_answers():
    """Followers apply with `render = False` (nobody reads their answers): the state, the
    digest and every stored answer must be those of the leader that rendered them."""
    limits = Limits.build()
    leader, follower = QueueMachine(limits), QueueMachine(limits)
    follower.render = False
    new_id = _ids()
    now = 1_000_000
    shapes = [{}, {"payload": {"data_b64": "aGk=", "encoding": "text/plain"}, "priority": 3},
              {"trace_context": {"traceparent": "00-ab-cd-01", "tracestate": "k=v"}, "deadline_at_ms": now + 10**6}]
    history = [C.enqueue({"queue": "q", "job_type": "t", **shapes[i % 3]}, limits, now, new_id, rid=f"e{i}")
               for i in range(9)]
    history += [C.reserve({"queues": ["q"], "lease_ms": 1000, "max_jobs": k}, limits, rid=f"r{k}")[0]
                for k in (1, 3, 9)]
    answers = []
    for i, cmd in enumerate(history):
        a = leader.apply(now + i, cmd)
        b = follower.apply(now + i, cmd)
        assert a[0] == b[0] and bool(a[1].get("jobs", True)) == bool(b[1].get("jobs", True))
        assert leader.digest() == follower.digest(), i
        answers.append(a)
    reserved = [j for a in answers[9:] for j in a[1]["jobs"]]
    assert len(reserved) == 9
    for j in reserved[:4]:
        cmd = C.ack(j["id"], {"attempt": j["attempt"]}, rid="a" + j["id"])
        assert leader.apply(now + 20, cmd) == follower.apply(now + 20, cmd)
    assert leader.digest() == follower.digest()
    follower.render = True      # it became the leader: replays answer exactly what was answered
    for i, cmd in enumerate(history):
        assert follower.apply(now + 30, cmd) == answers[i], i


def test_a_batch_keeps_the_jobs_it_made_as_bare_ids_and_snapshots_and_digests_see_the_tuples():
    """A request id keeps a batch's results for its window, a result per job: a job made is kept
    as its bare id (not an ENQUEUED tuple, 64 bytes a job more), replays the same answer, and a
    snapshot and the digest see the tuples every version wrote, so a snapshot of either form
    restores the state a node that lived through the history holds."""
    from raftq.node.core.invariants import check as check_invariants
    from raftq.node.core.ops import ENQUEUED, ENQUEUED_BATCH
    limits = Limits.build()
    m = QueueMachine(limits)
    new_id = _ids()
    now = 1_000_000
    m.apply(now, C.enqueue({"queue": "q", "job_type": "t", "idempotency_key": "k0"}, limits, now, new_id))
    body = {"jobs": [{"queue": "q", "job_type": "t", "idempotency_key": f"k{i}"} for i in range(3)]
            + [{"queue": "q", "job_type": "t", "max_attempts": 0}]}
    batch = C.enqueue_batch(body, limits, now, new_id, rid="b")
    answer = m.apply(now, batch)
    made = [r["job_id"] for r in answer[1]["results"][1:3]]
    assert [r.get("deduplicated") for r in answer[1]["results"]] == [True, False, False, None]
    kind, kept = m.rids["b"][1]
    assert kind == ENQUEUED_BATCH and list(kept[1:3]) == made and kept[0][:3:2] == (ENQUEUED, True)
    assert type(kept[3]) is dict and not check_invariants(m)
    assert m.apply(now + 1, batch) == answer
    data = m.to_builtins()
    written = next(k for rid, _, k, *_ in data["rids"] if rid == "b")
    assert [tuple(r) for r in written[1][1:3]] == [(ENQUEUED, i, False) for i in made]
    restored = QueueMachine.from_builtins(limits, data)
    assert restored.rids == m.rids and restored.digest() == m.digest() and not check_invariants(restored)
    assert restored.apply(now + 1, batch) == answer
    # The digest hashes the tuples: a machine that kept them (code before this form) hashes the same.
    tuples = QueueMachine.from_builtins(limits, data)
    tuples.rids["b"] = (tuples.rids["b"][0], written) + tuples.rids["b"][2:]
    assert tuples.digest() == m.digest()


def test_enqueue_and_ack_answers_are_kept_compact_and_replayed_exactly():
    """The answers most requests get are kept as small tuples, not (200, dict); a replay gives
    the same answer, and a snapshot that kept (200, dict) reads into the same state and digest."""
    from raftq.node.core.ops import ENQUEUED, JOB_ID
    limits = Limits.build()
    m = QueueMachine(limits)
    new_id = _ids()
    now = 1_000_000
    enq = C.enqueue({"queue": "q", "job_type": "t", "idempotency_key": "k"}, limits, now, new_id, rid="e1")
    first = m.apply(now, enq)
    dup = m.apply(now, C.enqueue({"queue": "q", "job_type": "t", "idempotency_key": "k"}, limits, now, new_id,
                                 rid="e2"))
    assert first[1]["deduplicated"] is False and dup[1]["deduplicated"] is True
    job = m.apply(now + 1, C.reserve({"queues": ["q"], "lease_ms": 1000}, limits, rid="r")[0])[1]["jobs"][0]
    ack = C.ack(job["id"], {"attempt": 1}, rid="a")
    acked = m.apply(now + 2, ack)
    assert acked == (200, {"job_id": job["id"]})
    assert m.rids["e1"][1] == (ENQUEUED, job["id"], False) and m.rids["e2"][1] == (ENQUEUED, job["id"], True)
    assert m.rids["a"][1] == (JOB_ID, job["id"])
    assert m.apply(now + 3, enq) == first and m.apply(now + 3, ack) == acked
    data = m.to_builtins()
    answers = {"e1": first, "e2": dup, "a": acked}
    data["rids"] = [(rid, o, answers.get(rid, k), e) for rid, o, k, e in data["rids"]]
    old = QueueMachine.from_builtins(limits, data)
    assert old.rids == m.rids and old.digest() == m.digest()
    assert old.apply(now + 4, enq) == first and old.apply(now + 4, ack) == acked


def _rich_history(c: Core):
    ids = [c.enqueue_id(payload=payload(b"p%d" % i), custom={"i": i},
                        trace_context={"traceparent": "00-x-y-01", "tracestate": "s"})
           for i in range(4)]
    c.enqueue_id(delay_ms=5_000)
    c.enqueue_id(deadline_at_ms=c.now + 3_000)
    c.enqueue_id("keys", idempotency_key="k")
    c.enqueue("rid", rid="r1")
    c.reserve_jobs(max_jobs=2, lease_ms=2_000)
    c.advance(10)
    c.nack(ids[0], 1, reason="x", retry={"strategy": "dead_letter"})
    c.nack(ids[1], 1, retry={"strategy": "delay", "delay_ms": 1_000})
    c.reserve_one(lease_ms=2_000)
    _kill(c, "dead")
    c.pause("paused")
    c.advance(10)


def _more_history(c: Core):
    out = []
    for step in range(8):
        c.advance(700)
        out.append(c.sweep())
        out.append(c.reserve(max_jobs=2))
        out.append(c.enqueue("keys", idempotency_key="k"))
        out.append(c.enqueue("rid", rid="r1"))
    out.append(c.drain(max=10))
    return out


@pytest.mark.parametrize("how", ["builtins", "pickle"])
def test_snapshot_round_trip_keeps_the_digest_and_the_behaviour(how):
    c = Core(storage=RETAIN)
    _rich_history(c)
    if how == "builtins":
        m2 = QueueMachine.from_builtins(c.limits, c.m.to_builtins())
    else:
        m2 = pickle.loads(pickle.dumps(c.m))
    assert m2.digest() == c.m.digest()
    assert m2.to_builtins() == c.m.to_builtins()
    c.m.check_invariants()
    m2.check_invariants()
    # the restored machine continues exactly like the original
    twin = Core(storage=RETAIN, now=c.now, ids=counter_ids(c.ids_issued + 1))
    twin.m = m2
    results_a, results_b = _more_history(c), _more_history(twin)
    assert any(isinstance(r, tuple) and r[1].get("jobs") for r in results_a)   # it delivered jobs
    assert results_a == results_b
    assert twin.m.digest() == c.m.digest()


def test_digest_equal_for_equal_histories_and_different_otherwise():
    a = Core(storage=RETAIN)
    _rich_history(a)
    b = Core(storage=RETAIN)
    for now, cmd in a.log:
        b.m.apply(now, cmd)
    assert b.m.digest() == a.m.digest()
    jid = a.reserve_one(lease_ms=1_000)["id"]
    assert a.m.digest() != b.m.digest()
    b.m.apply(a.log[-1][0], a.log[-1][1])
    assert a.m.digest() == b.m.digest()
    a.ack(jid, 1)
    assert a.m.digest() != b.m.digest()


def test_a_restore_that_consumes_its_data_builds_the_same_machine_and_empties_the_lists():
    """`consume` (a snapshot just read, node/replication/replica.py): the large lists are let go
    row by row as the machine is built, and the machine is the one a plain restore builds."""
    limits = Limits.build(storage={"dedup_window_ms": 10**6})
    live = QueueMachine(limits)
    new_id = _ids()
    now = 1_000_000
    for i in range(40):                 # priorities make a heap part, then a FIFO tail of equal ones
        live.apply(now + i, C.enqueue({"queue": "q", "job_type": "t", "idempotency_key": f"k{i}",
                                       "priority": i % 3 if i < 20 else 0}, limits, now + i, new_id, rid=f"r{i}"))
    live.apply(now + 50, C.reserve({"queues": ["q"], "lease_ms": 100, "max_jobs": 3}, limits)[0])
    data = live.to_builtins()
    plain = QueueMachine.from_builtins(limits, pickle.loads(pickle.dumps(data)))
    consumed = QueueMachine.from_builtins(limits, data, consume=True)
    assert consumed.digest() == plain.digest() == live.digest()
    assert consumed.to_builtins() == plain.to_builtins()
    rows = data["queues"][0][2]
    assert data["jobs"] and set(data["jobs"]) == {None} and rows and set(rows) == {None}
    assert set(data["dedup"]) == {None} and set(data["rids"]) == {None}
    t = now + 5000
    assert consumed.apply(t, C.sweep()) == plain.apply(t, C.sweep())
    got = [consumed.apply(t + 1, C.reserve({"queues": ["q"], "lease_ms": 100, "max_jobs": 50}, limits)[0]),
           plain.apply(t + 1, C.reserve({"queues": ["q"], "lease_ms": 100, "max_jobs": 50}, limits)[0])]
    assert got[0] == got[1] and len(got[0][1]["jobs"]) == 40      # the 3 leases lapsed: redelivered
