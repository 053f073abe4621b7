"""Fault injection into the state machine: a command that fails half-way leaves no trace.

CLUSTER.md: "a bug in one command returns an `internal` result for that command and leaves the
state as it was before it, because an exception inside a pysyncobj apply stalls the whole
cluster for good". The machine's test hook `_fault_after = n` makes the n-th mutation of the next
command raise; these tests fault random commands after random histories at *every* mutation
point in turn and check that

* the answer is 500 `internal` (or, once n is past the command's last mutation, the normal
  answer, identical to the one of an un-faulted twin machine);
* after an `internal`, `digest()` and `to_builtins()` are what they were before the command;
* the machine keeps working: it stays in lock-step with the twin, which never saw the faulted
  attempts, for the rest of the run.

Plus: malformed commands (unknown op, wrong arity, wrong types, unhashable request ids) answer
`internal` and change nothing, and `apply_batch` never raises.

Size: RAFTQ_FAULT_EXAMPLES (default 120).
"""
from __future__ import annotations

import itertools
import os

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, given, settings

from raftq.node import validate as C
from raftq.node import validate_schedule as VS
from raftq.node.core.jobs import IN_FLIGHT, READY, SCHEDULED
from raftq.node.core.ops import OPS
from raftq.node.errors import ApiError
from raftq.node.limits import Limits

from helpers_core import QueueMachine

T0 = 1_764_500_000_000
NAMES = ("a", "b", "c")
UNKNOWN_ID = "ffffffff-ffff-4fff-bfff-ffffffffffff"
EXAMPLES = int(os.environ.get("RAFTQ_FAULT_EXAMPLES", "120"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

CONFIGS = [
    ({"max_reserve_batch": 3, "request_id_window_ms": 4000},
     {"dead_letter_retention_ms": 0, "dedup_window_ms": 5000},
     [{"name": "a", "max_queue_depth": 3, "max_lease_duration_ms": 2000},
      {"name": "b", "max_attempts_ceiling": 2, "default_max_attempts": 2}]),
    ({"request_id_window_ms": 4000, "retry_delay_ms": 1000, "retry_backoff": "exponential",
      "retry_delay_max_ms": 3000},
     {"dead_letter_retention_ms": 5000, "dedup_window_ms": 3000},
     [{"name": "a", "max_queue_depth": 4, "max_lease_duration_ms": 3000},
      {"name": "b", "default_max_attempts": 1, "dead_letter_forward": "c",
       "dead_letter_forward_causes": ["lease_expired", "expired", "admin", "rejected", "attempts_exhausted"]}]),
]


def limits_of(i: int) -> Limits:
    lim, sto, qs = CONFIGS[i]
    return Limits.build(limits=lim, storage=sto, queues=qs)


def counter_id(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


def canon(state: dict) -> dict:
    """`to_builtins()` with the orders that carry no meaning sorted: heap array layouts and dict
    insertion orders (a reverted pop re-inserts at the end). The dead-letter store and the
    request-id FIFO keep their order, which is meaningful (drain is oldest first)."""
    out = dict(state)
    for key in ("jobs", "sched", "leases", "deadlines", "dedup", "dedup_heap", "rids", "schedules"):
        if key in state:
            out[key] = sorted(state[key], key=repr)
    out["queues"] = sorted(((name, counters, sorted(heap, key=repr)) for name, counters, heap in state["queues"]),
                           key=repr)
    return out


def snapshot(m: QueueMachine):
    return m.digest(), canon(m.to_builtins())


# ----------------------------------------------------------------------------- command source

@st.composite
def job_bodies(draw, now: int):
    body = {"queue": draw(st.sampled_from(NAMES)), "job_type": "t"}
    body.update(draw(st.fixed_dictionaries({}, optional={
        "priority": st.sampled_from((0, 5, 9)),
        "idempotency_key": st.sampled_from(("k1", "k2")),
        "max_attempts": st.integers(1, 3),
        "payload": st.just({"data_b64": "AAE=", "encoding": "application/octet-stream"}),
        "custom": st.just({"x": 1}),
        "deadline_at_ms": st.sampled_from((-1, 500, 4000)).map(lambda d: now + d),
        "delay_ms": st.sampled_from((0, 700, 3000)),
    })))
    return body


def _ids(m: QueueMachine, states) -> list:
    """(id, attempt) of the jobs in `states`, through the machine's read API."""
    out = []
    for q in NAMES:
        for s in states:
            out += [(v["id"], v["attempt"]) for v in m.list_jobs(q, s, 1000, None)[0]]
    return out


ALL_KINDS = ("enqueue", "batch", "atomic", "reserve", "reserve", "ack", "acks", "nack", "nack", "extend",
             "sweep", "sweep", "cancel", "pause", "drain", "requeue", "dldel",
             "schput", "schput", "schdel", "schpause", "schrun")
# Commands that usually make many mutations: the interesting ones to fault (a sweep fires the
# schedules' ticks).
HEAVY_KINDS = ("batch", "atomic", "reserve", "acks", "nack", "sweep", "sweep", "drain", "requeue", "dldel",
               "schput", "schrun")


def schedule_command(data, kind: str, limits: Limits, now: int, new_id, rid):
    """A schedule command on one of two names (built by node.validate_schedule)."""
    name = data.draw(st.sampled_from(("s1", "s2")), label="schedule")
    if kind == "schput":
        body = {"every_ms": data.draw(st.sampled_from((1000, 2500))),
                "catchup": data.draw(st.sampled_from(("skip", "one", "all"))),
                "overlap": data.draw(st.sampled_from(("allow", "skip", "replace"))),
                "misfire_after_ms": data.draw(st.sampled_from((0, 2000))),
                "job": {"queue": data.draw(st.sampled_from(NAMES)), "job_type": "t"}}
        body.update(data.draw(st.fixed_dictionaries({}, optional={
            "max_count": st.integers(1, 3), "expect_version": st.integers(0, 2), "paused": st.booleans()})))
        return VS.put(name, body, limits, now, rid=rid)
    if kind == "schdel":
        return VS.delete(name, None, rid=rid)
    if kind == "schpause":
        return VS.pause(name, data.draw(st.booleans()), rid=rid)
    return VS.trigger(name, new_id, rid=rid)


def draw_command(data, m: QueueMachine, limits: Limits, now: int, new_id, kinds=ALL_KINDS):
    """A plausible next command for the machine as it is (built by node.validate, as the
    leader does), or None when validation refused the request."""
    kind = data.draw(st.sampled_from(kinds), label="kind")
    rid = data.draw(st.sampled_from((None, None, None, "r1", "r2", "r3")), label="rid")
    inflight = _ids(m, (IN_FLIGHT,))
    dead = [(r["job"]["id"], r["final_attempt"]) for r in m.list_dead_letters(None, 1000, None)[0]]

    def pick(pool):
        pool = pool + [(UNKNOWN_ID, 1)]
        jid, attempt = data.draw(st.sampled_from(pool), label="job")
        return jid, data.draw(st.sampled_from((attempt, attempt, attempt + 1)), label="attempt")
    try:
        if kind.startswith("sch"):
            return schedule_command(data, kind, limits, now, new_id, rid)
        if kind == "enqueue":
            return C.enqueue(data.draw(job_bodies(now)), limits, now, new_id, rid=rid)
        if kind in ("batch", "atomic"):
            body = {"jobs": data.draw(st.lists(job_bodies(now), min_size=1, max_size=5))}
            build = C.enqueue_batch if kind == "batch" else C.enqueue_atomic
            return build(body, limits, now, new_id, rid=rid)
        if kind == "reserve":
            body = {"queues": data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3)),
                    "lease_ms": data.draw(st.sampled_from((1, 1000, 5000))), "max_jobs": data.draw(st.integers(1, 4))}
            return C.reserve(body, limits, rid=rid)[0]
        if kind == "ack":
            jid, attempt = pick(inflight)
            return C.ack(jid, {"attempt": attempt}, rid=rid)
        if kind == "acks":
            pairs = [pick(inflight) for _ in range(data.draw(st.integers(1, 4)))]
            return C.ack_batch({"acks": [{"job_id": j, "attempt": a} for j, a in pairs]}, limits, rid=rid)
        if kind == "nack":
            jid, attempt = pick(inflight)
            body = {"attempt": attempt, "reason": "r",
                    "retry": data.draw(st.sampled_from(({"strategy": "default"}, {"strategy": "dead_letter"},
                                                        {"strategy": "delay", "delay_ms": 0},
                                                        {"strategy": "delay", "delay_ms": 900})))}
            return C.nack(jid, body, rid=rid)
        if kind == "extend":
            jid, attempt = pick(inflight)
            return C.extend(jid, {"attempt": attempt, "lease_ms": data.draw(st.sampled_from((1, 2500)))}, rid=rid)
        if kind == "sweep":
            return C.sweep()
        if kind == "cancel":
            jid, _ = pick(_ids(m, (READY, SCHEDULED, IN_FLIGHT)))
            return C.cancel(jid, rid=rid)
        if kind == "pause":
            return C.pause(data.draw(st.sampled_from(NAMES)), data.draw(st.booleans()), limits, rid=rid)
        if kind == "drain":
            body = data.draw(st.fixed_dictionaries({}, optional={"queue": st.sampled_from(NAMES),
                                                                 "max": st.integers(1, 4)}))
            return C.drain(body, limits, rid=rid)
        ids = [pick(dead)[0] for _ in range(data.draw(st.integers(1, 3)))]
        return (C.requeue if kind == "requeue" else C.delete_dead_letters)({"ids": ids}, rid=rid)
    except ApiError:
        return None


class Run:
    """A machine and its twin, driven identically from random histories."""

    def __init__(self, data, config: int):
        self.data, self.limits = data, limits_of(config)
        self.m, self.twin = QueueMachine(self.limits), QueueMachine(self.limits)
        self.now = T0
        self._ids = itertools.count(1)

    def new_id(self) -> str:
        return counter_id(next(self._ids))

    def command(self, kinds=ALL_KINDS):
        for _ in range(10):
            cmd = draw_command(self.data, self.m, self.limits, self.now, self.new_id, kinds)
            if cmd is not None:
                return cmd
        return C.sweep()

    def both(self, steps: int):
        """Apply `steps` random commands to both machines; they must agree throughout."""
        for _ in range(steps):
            self.now += self.data.draw(st.integers(-1000, 3000), label="time step")
            cmd = self.command()
            assert self.m.apply(self.now, cmd) == self.twin.apply(self.now, cmd), cmd
        assert snapshot(self.m) == snapshot(self.twin)
        self.m.check_invariants()

    def advance(self):
        """Move both replicated clocks forward without a command (an empty batch), so that a
        sweep or an expiry has something to do."""
        self.now = max(self.now, self.m.clock) + self.data.draw(st.integers(0, 4000), label="advance")
        assert self.m.apply_batch(self.now, []) == self.twin.apply_batch(self.now, []) == []


def fault_every_point(m: QueueMachine, twin: QueueMachine, cmd) -> int:
    """Fault `cmd` at mutation 0, 1, 2, ... until it completes; returns how many mutations it
    makes. Applied at the replicated clock, so the clock itself does not move."""
    before = snapshot(m)
    now = m.clock
    for n in itertools.count():
        m._fault_after = n
        result = m.apply(now, cmd)
        m._fault_after = None          # a command that completes does not consume the hook
        if result[0] == 500:
            assert result[1]["error"]["code"] == "internal", result
            assert snapshot(m) == before, f"fault at mutation {n} of {cmd!r} left a trace"
            m.check_invariants()
            continue
        assert n < 10_000
        want = twin.apply(now, cmd)
        assert result == want, (cmd, n)
        assert snapshot(m) == snapshot(twin), (cmd, n)
        return n


@SETTINGS
@given(data=st.data(), config=st.sampled_from(range(len(CONFIGS))))
def test_a_fault_at_any_mutation_leaves_no_trace(data, config):
    run = Run(data, config)
    run.both(data.draw(st.integers(0, 30), label="history"))
    for _ in range(data.draw(st.integers(1, 3), label="faulted commands")):
        run.advance()
        n = fault_every_point(run.m, run.twin, run.command(HEAVY_KINDS))
        event(f"mutations in the faulted command: {'0' if n == 0 else '1-9' if n < 10 else '10+'}")
        run.both(data.draw(st.integers(0, 5), label="between"))
    run.both(5)                        # and the machine keeps working like its twin


@SETTINGS
@given(data=st.data(), config=st.sampled_from(range(len(CONFIGS))))
def test_a_fault_at_a_random_point_of_a_batch_reverts_only_that_command(data, config):
    """`_fault_after = n` counts mutations across the commands of one replicated batch: one
    command fails and is reverted, the others apply as if it had never been there."""
    run = Run(data, config)
    run.both(data.draw(st.integers(0, 25), label="history"))
    run.advance()
    cmds = [run.command(HEAVY_KINDS) for _ in range(data.draw(st.integers(2, 5), label="batch size"))]
    run.m._fault_after = data.draw(st.integers(0, 30), label="n")
    results = run.m.apply_batch(run.now, cmds)
    run.m._fault_after = None
    run.m.check_invariants()
    failed = [i for i, r in enumerate(results) if r[0] == 500]
    assert len(failed) <= 1, results
    assert all(results[i][1]["error"]["code"] == "internal" for i in failed)
    event(f"faulted: {'none' if not failed else 'one'}")
    kept = [c for i, c in enumerate(cmds) if i not in failed]
    assert [r for i, r in enumerate(results) if i not in failed] == run.twin.apply_batch(run.now, kept)
    assert snapshot(run.m) == snapshot(run.twin)
    run.both(5)


# ----------------------------------------------------------------------------- malformed commands

def _busy_machine() -> QueueMachine:
    """A machine with ready, scheduled, in-flight and dead-lettered jobs, dedup records and
    request ids (retention on)."""
    limits = limits_of(1)
    m = QueueMachine(limits)
    ids = (counter_id(n) for n in itertools.count(1))
    new_id = ids.__next__
    now = T0
    for body in ({"queue": "a", "job_type": "t", "idempotency_key": "k1"}, {"queue": "a", "job_type": "t"},
                 {"queue": "b", "job_type": "t", "max_attempts": 3}, {"queue": "b", "job_type": "t", "max_attempts": 3},
                 {"queue": "c", "job_type": "t", "delay_ms": 5000}, {"queue": "c", "job_type": "t"}):
        assert m.apply(now, C.enqueue(body, limits, now, new_id, rid=f"e{len(m.jobs)}"))[0] == 200
    cmd, _ = C.reserve({"queues": ["b"], "lease_ms": 1000, "max_jobs": 2}, limits)
    assert len(m.apply(now, cmd)[1]["jobs"]) == 2
    inflight = [v["id"] for v in m.list_jobs("b", IN_FLIGHT, 10, None)[0]]
    assert m.apply(now, C.nack(inflight[0], {"attempt": 1, "retry": {"strategy": "dead_letter"}}))[0] == 200
    assert m.list_dead_letters(None, 10, None)[0]
    return m


def _malformed(m: QueueMachine) -> list:
    ready = m.list_jobs("a", READY, 10, None)[0][0]["id"]
    flying = m.list_jobs("b", IN_FLIGHT, 10, None)[0][0]
    jid, attempt = flying["id"], flying["attempt"]
    return [
        # not a command at all / unknown op
        None, 42, "enq", b"sweep", {"op": "sweep"}, (), ("nope",), ("nope", None), (["sweep"], None),
        # wrong arity
        ("sweep",), ("sweep", None, 1), ("ack", None), ("ack", None, jid), ("ack", None, jid, 1, 2),
        ("res", None, ["a"], 1000), ("nack", None, jid, attempt), ("pause", None, "a"),
        ("cancel", None, ready, None, True, "extra"), ("cancel", None, ready, None, "yes"), ("enq", None, 0),
        # wrong types, failing before any mutation
        ("enq", None, 0, None), ("enq", None, 0, [("too", "short")]), ("res", None, 5, 1000, 1),
        ("acks", None, [1, 2]), ("requeue", None, None), ("requeue", None, [["unhashable"]]),
        ("dldel", None, 7), ("cancel", None, ["unhashable"]), ("pause", None, ["a"], True),
        ("pause", None, "a", True, False, ["who"]),
        ("ext", None, jid, attempt, "long"),
        # wrong types, failing after some mutations (which must be undone)
        ("res", None, ["a"], "long", 1),
        ("nack", None, jid, attempt, "why", "delay", "soon"),
        ("acks", None, [(jid, attempt), "junk"]),
        ("enq", None, 1, [(counter_id(900), "a", "t", None, None, 0, 3, None, None, None, None, None), ("x",)]),
        # a request id that cannot be a dict key
        ("sweep", ["rid"]), ("ack", {"r": 1}, jid, attempt),
    ]


def test_malformed_commands_answer_internal_and_change_nothing():
    m = _busy_machine()
    for cmd in _malformed(m):
        before = snapshot(m)
        result = m.apply(m.clock, cmd)
        assert result[0] == 500 and result[1]["error"]["code"] == "internal", (cmd, result)
        assert snapshot(m) == before, cmd
        m.check_invariants()
    # and it still works
    assert m.apply(m.clock + 1, C.sweep())[0] == 200


def test_apply_batch_never_raises_and_answers_every_command():
    m = _busy_machine()
    bad = _malformed(m)
    twin = QueueMachine.from_builtins(m.limits, m.to_builtins())
    good = C.reserve({"queues": ["a"], "lease_ms": 1000}, m.limits)[0]
    results = m.apply_batch(m.clock + 10, bad + [good] + bad)
    assert len(results) == 2 * len(bad) + 1
    assert all(r[0] == 500 for i, r in enumerate(results) if i != len(bad))
    assert results[len(bad)] == twin.apply(twin.clock + 10, good)
    assert snapshot(m) == snapshot(twin)
    # a stamp that is not a number keeps the clock and still answers
    clock = m.clock
    assert [r[0] for r in m.apply_batch(None, [C.sweep(), ("nope", None)])] == [200, 500]
    assert [r[0] for r in m.apply_batch("soon", [C.sweep()])] == [200]
    assert m.clock == clock


_garbage = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(("a", "b", "", "q", UNKNOWN_ID, counter_id(1)))
    | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(st.sampled_from("ab"), inner, max_size=2),
    max_leaves=10)


@settings(max_examples=EXAMPLES * 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(OPS + ("bogus",)), rid=st.one_of(st.none(), st.sampled_from(("r1", "e1")), _garbage),
       args=st.lists(_garbage, max_size=6))
def test_garbage_commands_never_raise_and_internal_means_unchanged(op, rid, args):
    m = _busy_machine()
    before = snapshot(m)
    results = m.apply_batch(m.clock, [(op, rid, *args)])
    assert len(results) == 1
    status, body = results[0]
    assert isinstance(status, int) and isinstance(body, dict)
    event(f"{op}: {status}")
    if status == 500:
        assert snapshot(m) == before
        m.check_invariants()
