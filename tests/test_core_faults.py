"""Fault injection into the state machine: a command that fails half-way leaves no trace.

docs/cluster.md "Design", "Apply never raises": a bug in one command returns an `internal` result
for that command and leaves the state as it was before it, because an exception inside a Raft
apply would stall the whole cluster for good. The machine's test hook `_fault_after = n` makes the n-th mutation of the next
command raise; these tests fault random commands after random histories at *every* mutation
point in turn and check that

* the answer is 500 `internal` (or, once n is past the command's last mutation, the normal
  answer, identical to the one of an un-faulted twin machine);
* after an `internal`, `digest()` and `to_builtins()` are what they were before the command;
* the machine keeps working: it stays in lock-step with the twin, which never saw the faulted
  attempts, for the rest of the run.

Plus: malformed commands (unknown op, wrong arity, wrong types, unhashable request ids) answer
`internal` and change nothing, and `apply_batch` never raises.

Size: RAFTQ_FAULT_EXAMPLES (default 120; 30 unless RAFTQ_TEST_PROFILE=full, tests/conftest.py).
"""
from __future__ import annotations

import itertools
import os

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, given, settings

from raftq.node.base import validate as C
from raftq.node.base import validate_schedule as VS
from raftq.node.core.invariants import InvariantViolation
from raftq.node.core.jobs import IN_FLIGHT, READY, SCHEDULED
from raftq.node.core.ops import OPS
from raftq.node.core.errors import ApiError
from raftq.node.core.limits import Limits

from helpers_core import QueueMachine, b64

T0 = 1_764_500_000_000
NAMES = ("a", "b", "c")
UNKNOWN_ID = "ffffffff-ffff-4fff-bfff-ffffffffffff"
EXAMPLES = int(os.environ.get("RAFTQ_FAULT_EXAMPLES", "120"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

CONFIGS = [
    ({"max_reserve_batch": 3, "request_id_window_ms": 4000},
     {"dead_letter_retention_ms": 0, "dedup_window_ms": 5000},
     [{"name": "a", "max_queue_depth": 3, "max_lease_duration_ms": 2000, "result_retention_ms": 3000,
       "max_retained_result_bytes": 4},
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
    if "keys" in state:                # keyed queues: each queue's keys (a dict) in any order
        keyed = state["keys"]
        out["keys"] = {"queues": sorted(((name, vtimes, plain, sorted(rows, key=repr))
                                         for name, vtimes, plain, rows in keyed["queues"]), key=repr),
                       "rates": sorted(keyed["rates"], key=repr)}
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


def draw_result(data) -> dict:
    """An ack's optional result field (1 or 3 bytes against queue a's bound of 4)."""
    n = data.draw(st.sampled_from((0, 0, 1, 3)), label="result bytes")
    return {} if n == 0 else {"result": {"data_b64": b64(b"x" * n), "encoding": "text/plain"}}


def draw_command(data, m: QueueMachine, limits: Limits, now: int, new_id, kinds=ALL_KINDS, bodies=None):
    """A plausible next command for the machine as it is (built by node.validate, as the
    leader does), or None when validation refused the request."""
    kind = data.draw(st.sampled_from(kinds), label="kind")
    rid = data.draw(st.sampled_from((None, None, None, "r1", "r2", "r3")), label="rid")
    bodies = bodies or job_bodies
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
            return C.enqueue(data.draw(bodies(now)), limits, now, new_id, rid=rid)
        if kind in ("batch", "atomic"):
            body = {"jobs": data.draw(st.lists(bodies(now), min_size=1, max_size=5))}
            build = C.enqueue_batch if kind == "batch" else C.enqueue_atomic
            return build(body, limits, now, new_id, rid=rid)
        if kind == "reserve":
            body = {"queues": data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3)),
                    "lease_ms": data.draw(st.sampled_from((1, 1000, 5000))), "max_jobs": data.draw(st.integers(1, 4))}
            return C.reserve(body, limits, rid=rid)[0]
        if kind == "ack":
            jid, attempt = pick(inflight)
            return C.ack(jid, {"attempt": attempt, **draw_result(data)}, rid=rid, limits=limits)
        if kind == "acks":
            pairs = [pick(inflight) for _ in range(data.draw(st.integers(1, 4)))]
            return C.ack_batch({"acks": [{"job_id": j, "attempt": a, **draw_result(data)} for j, a in pairs]},
                               limits, rid=rid)
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
        if kind == "release":
            jid, attempt = pick(inflight)
            return C.release(jid, {"attempt": attempt, "delay_ms": data.draw(st.sampled_from((0, 900)))}, rid=rid)
        if kind == "purge":
            return C.purge(data.draw(st.sampled_from(NAMES)), limits, rid=rid)
        if kind == "config":
            queues = data.draw(st.sampled_from(KEYED_VARIANTS), label="config")
            body = {"config": {"limits": {"resource_limits": {"db": data.draw(st.sampled_from((1, 2)))}},
                               "storage": {"dead_letter_retention_ms": 5000}, "queues": queues},
                    "expect_version": m.config_version}
            return C.configure(body, rid=rid)
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

    def __init__(self, data, config: int, limits: Limits | None = None, kinds=ALL_KINDS, bodies=None):
        self.data, self.limits = data, limits or limits_of(config)
        self.m, self.twin = QueueMachine(self.limits), QueueMachine(self.limits)
        self.now = T0
        self._ids = itertools.count(1)
        self.kinds, self.bodies = kinds, bodies

    def new_id(self) -> str:
        return counter_id(next(self._ids))

    def command(self, kinds=None):
        for _ in range(10):
            # validation with the configuration in force (a keyed run changes it)
            cmd = draw_command(self.data, self.m, self.m.limits, self.now, self.new_id, kinds or self.kinds,
                               self.bodies)
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
    return faulted(m, twin, cmd)[0]


def faulted(m: QueueMachine, twin: QueueMachine, cmd) -> tuple:
    """fault_every_point, and the answer of the run that completed."""
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
        return n, result


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


# ----------------------------------------------------------------------------- keys
# Per-key limits (node/core/keys.py): scripted histories that reach every place a command changes
# key state, each command faulted at every one of its mutation points before it is applied
# (Pair.run), then a snapshot round trip; and random keyed histories like the ones above.

class Pair:
    """A machine `m` and its twin, driven alike: every command is first faulted on `m` at each
    of its mutation points in turn (faulted: each fault leaves `m` as it was, invariants hold),
    then applied to both (same answer, same state). Commands are built by node.validate with the
    configuration in force, at the replicated clock."""

    def __init__(self, queues, limits=None, storage=None):
        lim = Limits.build(limits=limits, storage=storage or {"dead_letter_retention_ms": 60_000}, queues=queues)
        self.m, self.twin = QueueMachine(lim), QueueMachine(lim)
        self._ids = itertools.count(1)
        self.points = []                # mutations of each command run
        self.at(0)

    # -------------------------------------------------------------- driving
    def new_id(self) -> str:
        return counter_id(next(self._ids))

    @property
    def now(self) -> int:
        return self.m.clock

    def at(self, ms: int) -> None:
        """Both replicated clocks `ms` on (an empty batch)."""
        now = max(T0, self.m.clock + ms)
        assert self.m.apply_batch(now, []) == self.twin.apply_batch(now, []) == []

    def run(self, cmd):
        n, result = faulted(self.m, self.twin, cmd)
        self.m.check_invariants()
        self.points.append(n)
        return result

    def ok(self, cmd) -> dict:
        status, body = self.run(cmd)
        assert status == 200, body
        return body

    # -------------------------------------------------------------- commands
    def enq(self, queue="q", key=None, **fields) -> str:
        body = {"queue": queue, "job_type": "t", **fields}
        if key is not None:
            body["key"] = key
        return self.ok(C.enqueue(body, self.m.limits, self.now, self.new_id))["job_id"]

    def batch(self, jobs, atomic=False) -> dict:
        body = {"jobs": [{"queue": "q", "job_type": "t", **j} for j in jobs]}
        build = C.enqueue_atomic if atomic else C.enqueue_batch
        return self.ok(build(body, self.m.limits, self.now, self.new_id))

    def take(self, queues=("q",), n=100, lease_ms=30_000) -> list:
        body = {"queues": list(queues), "lease_ms": lease_ms, "max_jobs": n}
        return self.ok(C.reserve(body, self.m.limits)[0])["jobs"]

    def ack(self, job):
        return self.ok(C.ack(job["id"], {"attempt": job["attempt"]}))

    def acks(self, jobs):
        return self.ok(C.ack_batch({"acks": [{"job_id": j["id"], "attempt": j["attempt"]} for j in jobs]},
                                   self.m.limits))

    def nack(self, job, strategy="default", delay_ms=None):
        retry = {"strategy": strategy} if delay_ms is None else {"strategy": strategy, "delay_ms": delay_ms}
        return self.ok(C.nack(job["id"], {"attempt": job["attempt"], "retry": retry}))

    def release(self, job, delay_ms=0):
        return self.ok(C.release(job["id"], {"attempt": job["attempt"], "delay_ms": delay_ms}))

    def cancel(self, job_id):
        return self.ok(C.cancel(job_id))

    def move(self, queue, ids):
        return self.ok(C.move_to_dead_letters(queue, {"ids": list(ids)}, self.m.limits))

    def requeue(self, ids):
        return self.ok(C.requeue({"ids": list(ids)}))

    def purge(self, queue="q"):
        return self.ok(C.purge(queue, self.m.limits))

    def sweep(self) -> dict:
        return self.ok(C.sweep())

    def configure(self, queues, limits=None):
        body = {"config": {"limits": limits or {}, "storage": {"dead_letter_retention_ms": 60_000},
                           "queues": queues}, "expect_version": self.m.config_version}
        return self.ok(C.configure(body))

    # -------------------------------------------------------------- reads
    def keys(self, queue="q"):
        return self.m.queues[queue].keys

    def key(self, name, queue="q"):
        qk = self.keys(queue)
        return None if qk is None else qk.by_key.get(name)

    def stats(self, queue="q") -> dict:
        return self.m.queue_stats(queue)

    def roundtrip(self, queues=("q",)) -> None:
        """A snapshot restores the same state, and the restored machine, the machine that took
        the faults and the twin decide alike from here on: time passes, sweeps fire the timers,
        every job is reserved and acked."""
        m, twin = self.m, self.twin
        restored = QueueMachine.from_builtins(m.limits, m.to_builtins())
        restored.check_invariants()
        assert snapshot(restored) == snapshot(m) == snapshot(twin)
        machines = (m, twin, restored)
        reserve = C.reserve({"queues": list(queues), "lease_ms": 60_000, "max_jobs": 100}, m.limits)[0]
        for _ in range(8):
            now = m.clock + 1500
            got = [x.apply_batch(now, [C.sweep(), reserve]) for x in machines]
            assert got[0] == got[1] == got[2]
            for job in got[0][1][1]["jobs"]:
                cmd = C.ack(job["id"], {"attempt": job["attempt"]})
                assert m.apply(now, cmd) == twin.apply(now, cmd) == restored.apply(now, cmd)
            restored.check_invariants()
        assert snapshot(restored) == snapshot(m) == snapshot(twin)
        m.check_invariants()


def test_job_results_fault_at_every_point():
    """Job results (node/core/results.py): an ack kept without and with a result, one that drops
    the oldest results at the bound, one too large for the bound on its own, a batch of acks, a
    lowered bound in a configuration change, the sweep expiring records; then a snapshot round trip."""
    queue = {"name": "q", "result_retention_ms": 5000, "max_retained_result_bytes": 6}
    p = Pair([queue])

    def result(data: bytes) -> dict:
        return {"result": {"data_b64": b64(data), "encoding": "text/plain"}}

    def done(n=1, data=None):
        for _ in range(n):
            p.enq()
        jobs = p.take(n=n)
        for job in jobs:
            p.ok(C.ack(job["id"], {"attempt": job["attempt"], **(result(data) if data else {})}, limits=p.m.limits))
        return [j["id"] for j in jobs]
    done()                                      # kept without a result
    first, = done(data=b"aaa")
    done(data=b"bbb")                           # 6 bytes: the bound
    done(data=b"cc")                            # the oldest result dropped
    assert p.m.job_view(first)["result_dropped"]
    done(data=b"x" * 7)                         # larger than the bound: not kept, nothing dropped
    for _ in range(2):
        p.enq()
    jobs = p.take()
    p.ok(C.ack_batch({"acks": [{"job_id": j["id"], "attempt": j["attempt"], **result(b"d")} for j in jobs]},
                     p.m.limits))
    assert p.m.result_bytes == {"q": 4}         # cc, d, d: bbb's result dropped
    p.configure([{**queue, "max_retained_result_bytes": 2}])        # the oldest over it dropped
    assert p.m.result_bytes == {"q": 2}
    p.at(2000)
    done(data=b"e")
    p.at(3500)
    assert p.sweep()["results_expired"] == 7    # the first ones, the later one stays
    assert len(p.m.results) == 1
    assert max(p.points) > 5
    p.roundtrip()


def test_keyed_enqueues_fault_at_every_point():
    """A keyed index made, a new key, a key joining the rotation or moving up, a key from the
    queue's key_field, a key with a limit of 0 (made held), a resource counted per key, batches,
    a replaced keyed job, a scheduled keyed job promoted by the sweep."""
    p = Pair([{"name": "q", "key_field": "tenant", "key_concurrency": 1,
               "key_limits": {"zero": {"concurrency": 0}}}])
    p.enq()                                     # a plain job: no keyed index yet
    assert p.keys() is None
    p.enq(key="a")                              # the index made, the plain jobs join the rotation
    assert p.keys().plain.turn is not None and p.key("a").turn is not None
    p.enq(key="a")
    p.enq(key="a", priority=5)                  # the key moves up to a better level
    assert p.key("a").level == -5
    p.enq(custom={"tenant": "t1"})              # from the key_field: a new key
    assert p.key("t1") is not None
    p.enq(key="zero")                           # a limit of 0: the key is made held
    p.enq(key="zero", resource="db")
    s = p.stats()
    assert (s["keys"], s["keys_at_limit"], s["ready_held_by_keys"]) == (3, 1, 2)
    assert p.key("zero").resources == {"db": 1}
    p.enq(priority=7)                           # a plain job in a keyed queue moves its level up
    assert p.keys().plain.level == -7
    p.batch([{"key": "b"}, {"key": "b", "priority": 2}, {"custom": {"tenant": "t2"}}, {"key": "zero"},
             {"key": "c", "resource": "db"}, {}, {"key": "d", "delay_ms": 500}])
    p.batch([{"key": "e"}, {"key": "a", "priority": 9}, {"key": "zero"}], atomic=True)
    first = p.enq(key="f", idempotency_key="i", duplicate_policy="replace")
    p.enq(key="f")
    p.enq(key="f", idempotency_key="i", duplicate_policy="replace", priority=3)     # replaced: out of its key, back in
    assert p.m.job_view(first)["priority"] == 3
    assert p.key("d") is None                   # scheduled: no key state yet
    p.at(500)
    assert p.sweep()["promoted"] == 1 and p.key("d").ready == 1
    assert p.stats()["ready_held_by_keys"] == 4
    p.roundtrip()


def test_keyed_reserves_fault_at_every_point():
    """The rotation (levels, weights, plain jobs as one more key), keys held at their
    concurrency, at their rate with a timer armed, a due timer fired by reserve itself, an
    expired keyed job, a resource-blocked
    keyed job, a key held while its resource's blocked jobs wait for a free slot (gating.key_held),
    and a queue-wide rate."""
    p = Pair([{"name": "q", "key_concurrency": 1, "key_weights": {"w": 2},
               "key_limits": {"r": {"concurrency": 5, "rate": {"count": 2, "period_ms": 1000}},
                              "w": {"concurrency": 3}}},
              {"name": "g", "rate": {"count": 3, "period_ms": 1000}, "key_concurrency": 2},
              {"name": "h", "key_concurrency": 1}],
             limits={"resource_limits": {"db": 1}})
    for name in ("a", "a", "b", "b", "w", "w", "w", "r", "r", "r", None, None):
        p.enq(key=name)
    assert len(p.take(n=3)) == 3                # one job each of the first three in turn
    got = p.take()
    assert sorted(j.get("key") or "" for j in got) == ["", "", "r", "r", "w", "w"]
    r = p.key("r")
    assert r.held == "rate" and r.timer is not None and r.ready == 1
    assert p.stats()["keys_at_limit"] == 4
    assert p.take() == []                       # everything held: changes nothing
    p.at(1000)
    assert [j["key"] for j in p.take()] == ["r"]    # the timer, due, fired by reserve before it picks
    # an expired keyed job, met by reserve before the sweep
    e = p.enq(key="e", deadline_at_ms=p.now + 100)
    p.enq(key="e")
    p.at(100)
    got = p.take()
    assert len(got) == 1 and p.m.job_view(e)["state"] != "ready"
    # a queue-wide rate counts every hand-out of its queue
    for name in ("a", "b", None, "c", "a"):
        p.enq("g", key=name)
    assert len(p.take(("g",))) == 3 and p.take(("g",)) == []
    p.at(1000)
    assert len(p.take(("g",))) == 2
    # resources: a blocked keyed job; a key held while its resource's blocked jobs wait
    for _ in range(3):
        p.enq("h", resource="db")
    first = p.take(("h",))
    assert len(first) == 1 and p.stats("h")["throttled"] == 2
    p.ack(first[0])                             # one blocked job back in its claim of the slot
    assert p.stats("h")["throttled"] == 1
    p.enq("h", key="k", priority=9)
    p.enq("h", key="k", priority=9, resource="db")
    got = p.take(("h",), n=1)
    assert got[0]["key"] == "k" and p.key("k", "h").held == "concurrency"
    assert p.stats("h")["throttled"] == 0       # k's claim on the slot passed on (gating.key_held)
    p.enq("h", key="m", resource="db")
    p.enq("h", key="m", resource="db")
    got = p.take(("h",))
    assert [j.get("key") for j in got] == [None]
    assert p.stats("h")["throttled"] == 3       # k's and m's jobs and a plain one wait for db
    p.ack(got[0])                               # a slot frees: a blocked keyed job back in its key
    p.ack(first := p.take(("h",))[0])
    p.roundtrip(("q", "g", "h"))


def test_keyed_jobs_leaving_in_flight_fault_at_every_point():
    """Ack, ack batch, nack (retry at once, later, dead letter), release (at once, later),
    cancel, move and requeue, lease expiry (again, and on the last attempt) of keyed jobs: a
    slot frees, a held key is back in the rotation, an idle key is dropped at the end of the
    command or kept with a timer while its hand-outs are inside its window, then dropped by the
    sweep."""
    p = Pair([{"name": "q", "key_concurrency": 1},
              {"name": "w", "key_rate": {"count": 2, "period_ms": 2000}, "key_concurrency": 1,
               "default_max_attempts": 1}],
             limits={"resource_limits": {"db": 2}})
    names = ("a", "a", "b", "c", "d", "e", "e", "f", "g", "h", "i", "j")
    for name in names:
        p.enq(key=name, resource="db" if name in "ae" else None)
    jobs = {j["key"]: j for j in p.take()}
    assert sorted(jobs) == sorted(set(names)) and p.stats()["keys_at_limit"] == len(jobs)
    p.ack(jobs["a"])                            # a's slot frees: back in the rotation
    assert p.key("a").held is None and p.key("a").turn is not None
    p.ack(jobs["b"])                            # b idle: dropped at the end of the command
    assert p.key("b") is None
    p.nack(jobs["c"])                           # ready again in the same command: c keeps its state
    assert p.key("c").ready == 1
    p.nack(jobs["d"], "delay", 5000)            # later: d idle, dropped
    assert p.key("d") is None
    p.nack(jobs["e"], "dead_letter")            # e's second job takes the slot next
    assert p.key("e").turn is not None
    p.release(jobs["f"])
    p.release(jobs["g"], delay_ms=5000)
    assert p.key("f").ready == 1 and p.key("g") is None
    p.cancel(jobs["h"]["id"])
    p.acks([jobs["i"], jobs["j"], jobs["e"]])   # the last one: attempt mismatch, nothing
    assert p.key("h") is p.key("i") is p.key("j") is None
    # lease expiry: ready again with attempt + 1, in the same apply
    again = p.take(lease_ms=1)
    assert sorted(j["key"] for j in again) == ["a", "c", "e", "f"]
    p.at(1)
    assert p.sweep()["leases_expired"] == 4
    assert p.stats()["keys"] == 4 and p.stats()["keys_at_limit"] == 0
    # cancel and move ready keyed jobs; requeue dead-lettered ones (a new key made)
    ready = [v["id"] for v in p.m.list_jobs("q", READY, 100, None)[0]]
    p.cancel(ready[0])
    p.move("q", ready[1:3])
    dead = [r["job"]["id"] for r in p.m.list_dead_letters("q", 100, None)[0]]
    assert len(dead) == 3
    p.requeue(dead)
    p.roundtrip()
    # rates: an idle key kept with a timer while its hand-outs are inside its window
    p.enq("w", key="k")
    p.enq("w", key="k")
    p.enq("w", key="l")
    got = p.take(("w",), lease_ms=1000)
    k = p.key("k", "w")
    assert len(got) == 2 and k.held == "concurrency"
    p.ack(got[0])                               # k's slot frees; its window is not full: back
    assert k.held is None and k.turn is not None
    p.ack(got[1])                               # l idle, inside its window: kept, timer armed
    l_ = p.key("l", "w")
    assert l_ is not None and l_.timer is not None and l_.ready == l_.in_flight == 0
    got = p.take(("w",), lease_ms=1000)
    assert k.held == "concurrency" and len(k.log) == 2    # in flight, and two hand-outs in the window
    p.at(1000)
    assert p.sweep()["leases_expired"] == 1     # the last attempt: dead-lettered; k now held at its rate
    assert k.held == "rate" and k.ready == k.in_flight == 0
    p.at(1000)
    swept = p.sweep()
    assert swept["key_timers_fired"] == 2 and p.keys("w") is None       # both windows passed: dropped
    p.roundtrip(("q", "w"))


def test_key_timers_fired_by_the_sweep_fault_at_every_point():
    """The sweep fires key timers: a rate-held key back in the rotation (its queue woken), a key
    held at its rate whose concurrency then holds it, an idle key dropped, a stale timer; and a
    keyed job whose deadline passes while it waits."""
    p = Pair([{"name": "q", "key_rate": {"count": 1, "period_ms": 1000}, "key_concurrency": 1,
               "key_limits": {"two": {"concurrency": 2}}}])
    for name in ("a", "a", "b", "two", "two", "two", "idle"):
        p.enq(key=name)
    p.enq(key="late")
    p.enq(key="late", deadline_at_ms=p.now + 500)
    got = {j["key"]: j for j in p.take()}
    assert sorted(got) == ["a", "b", "idle", "late", "two"]
    assert p.key("two").held == "rate"          # one hand-out fills its window; one slot of two used
    p.ack(got["a"])                             # a: its slot frees, its window is full: held at its rate
    assert p.key("a").held == "rate" and p.key("a").timer is not None
    p.ack(got["idle"])                          # idle: kept with a timer
    p.ack(got["b"])
    p.at(400)
    p.ack(got["late"])
    p.at(100)
    assert p.sweep()["deadlines_expired"] == 1
    p.at(500)
    p.m.released.clear()
    swept = p.sweep()
    assert swept["key_timers_fired"] == 5
    assert "q" in p.m.released and p.key("idle") is None and p.key("b") is None
    assert p.key("a").held is None and p.key("two").held is None and p.key("late") is None
    got = p.take()
    assert sorted(j["key"] for j in got) == ["a", "two"]
    assert p.key("two").held == "concurrency"  # both slots: concurrency is checked first
    p.ack(got[0] if got[0]["key"] == "two" else got[1])
    assert p.key("two").held == "rate"          # a slot frees, the window is full: held at its rate
    p.roundtrip()


def test_purge_of_a_keyed_queue_faults_at_every_point():
    """Purge forgets every ready job of every key (held or not, blocked by a resource or not,
    plain jobs too); in-flight jobs keep their keys' slots; idle keys go at the end of the
    command, or stay with a timer while hand-outs are in their window."""
    p = Pair([{"name": "q", "key_concurrency": 1,
               "key_limits": {"rated": {"concurrency": 3, "rate": {"count": 1, "period_ms": 1000}},
                              "zero": {"concurrency": 0}}}],
             limits={"resource_limits": {"db": 1}})
    for name in ("a", "a", "b", "rated", "rated", "zero", None, "c", "solo"):
        p.enq(key=name)
    p.enq(key="d", resource="db")
    p.enq(key="e", resource="db")
    got = {j.get("key"): j for j in p.take()}
    assert p.stats()["throttled"] == 1 and p.stats()["keys_at_limit"] == 7
    p.ack(got["solo"])
    p.enq(key="solo")
    p.ack(got["c"])
    assert p.purge()["purged"] == 5
    s = p.stats()
    assert (s["ready"], s["throttled"], s["ready_held_by_keys"]) == (0, 0, 0)
    assert p.key("zero") is None and p.key("rated").in_flight == 1
    p.enq(key="a", delay_ms=1000)
    p.at(1000)
    assert p.sweep()["promoted"] == 1           # a's scheduled job comes back to its key
    p.roundtrip()


def test_configuration_changes_of_key_limits_fault_at_every_point():
    """A configuration change reviews every held key: a lowered limit holds no more at once
    (reserve holds the key when it next meets it), a raised or removed one frees held keys, a
    lowered rate re-arms a rate-held key's timer, an override of 0 holds a key, a raised resource
    limit sends blocked keyed jobs back to their keys."""
    q = {"name": "q", "key_concurrency": 2, "key_rate": {"count": 2, "period_ms": 1000},
         "key_limits": {"big": {"concurrency": 3}}, "key_weights": {"big": 3}}
    lim = {"resource_limits": {"db": 1}}
    p = Pair([q], limits=lim)
    for name in ("a", "a", "a", "a", "b", "b", "b", "big", "big", "big", "big", "c", "c"):
        p.enq(key=name)
    p.enq(key="d", resource="db")
    p.enq(key="d", resource="db")
    got = p.take()
    assert p.stats()["keys_at_limit"] == 4 and p.stats()["throttled"] == 1
    flying = {}
    for j in got:
        flying.setdefault(j["key"], []).append(j)
    p.ack(flying["c"][0])                       # c: held at its rate now, with a timer
    assert p.key("c").held == "rate"
    # lowered: no lease revoked, held keys stay held, a rate-held key now at its concurrency
    p.configure([{**q, "key_concurrency": 1, "key_rate": {"count": 1, "period_ms": 3000}}], lim)
    assert p.key("c").held == "concurrency"    # held now for the other reason (its timer stale)
    p.ack(flying["a"][0])
    # an override of 0 for a key in the rotation: reserve holds it when it meets it
    p.enq(key="e")
    p.configure([{**q, "key_limits": {"e": {"concurrency": 0}}}], lim)
    assert "e" not in [j["key"] for j in p.take()]
    assert p.key("e").held == "concurrency"
    # raised: every held key whose limit now admits more is back at once
    p.m.released.clear()
    p.configure([{**q, "key_concurrency": 10, "key_rate": {"count": 100, "period_ms": 1000}}], {"resource_limits": {"db": 5}})
    assert p.stats()["keys_at_limit"] == 0 and p.stats()["throttled"] == 0 and "q" in p.m.released
    got = p.take()
    p.acks(got[:3])
    # removed: no key limits at all
    p.configure([{"name": "q"}], {"resource_limits": {"db": 5}})
    assert p.stats()["keys_at_limit"] == 0
    p.roundtrip()


# Random keyed histories: the kinds above plus release, purge and configuration changes, on
# queues with per-key concurrency, rates, weights, overrides (one of 0), a key_field, a queue-wide
# rate and a resource limit.
KEYED_VARIANTS = [
    [{"name": "a", "key_concurrency": 1, "key_rate": {"count": 2, "period_ms": 1000},
      "key_limits": {"k0": {"concurrency": 0}, "k3": {"concurrency": 2, "rate": {"count": 1, "period_ms": 2500}}},
      "max_lease_duration_ms": 3000},
     {"name": "b", "key_field": "tenant", "key_concurrency": 2, "key_weights": {"k1": 3},
      "rate": {"count": 3, "period_ms": 1000}, "default_max_attempts": 2}],
    [{"name": "a", "key_concurrency": 2, "key_limits": {"k1": {"concurrency": 0}}},       # lowered / raised
     {"name": "b", "key_field": "tenant", "key_rate": {"count": 1, "period_ms": 3000}}],
    [{"name": "a"}, {"name": "b"}],                                                        # removed
]
KEYED_KINDS = ("enqueue", "batch", "reserve", "reserve", "reserve", "ack", "acks", "nack", "release", "cancel",
               "extend", "sweep", "sweep", "purge", "config", "drain", "requeue")
KEYED_HEAVY = ("batch", "reserve", "reserve", "acks", "nack", "release", "cancel", "sweep", "sweep", "purge",
               "config")


@st.composite
def keyed_bodies(draw, now: int):
    body = draw(job_bodies(now))
    key = draw(st.sampled_from((None, "k0", "k1", "k2", "k2", "k3")), label="key")
    if key is not None:
        body["key"] = key
    body.update(draw(st.fixed_dictionaries({}, optional={
        "custom": st.sampled_from(({"tenant": "k1"}, {"tenant": "k2"}, {"x": 1})),
        "resource": st.just("db"),
    })))
    return body


def keyed_limits() -> Limits:
    return Limits.build(limits={"resource_limits": {"db": 1}, "request_id_window_ms": 4000},
                        storage={"dead_letter_retention_ms": 5000}, queues=KEYED_VARIANTS[0])


@settings(max_examples=max(10, EXAMPLES // 2), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(data=st.data())
def test_a_fault_at_any_mutation_of_a_keyed_command_leaves_no_trace(data):
    run = Run(data, 0, keyed_limits(), KEYED_KINDS, keyed_bodies)
    run.both(data.draw(st.integers(3, 30), label="history"))
    for _ in range(data.draw(st.integers(1, 3), label="faulted commands")):
        run.advance()
        cmd = run.command(KEYED_HEAVY)
        n = fault_every_point(run.m, run.twin, cmd)
        event(f"{cmd[0]}: {'0' if n == 0 else '1-9' if n < 10 else '10+'} mutations")
        keyed = run.m.to_builtins().get("keys")
        event(f"keyed queues: {0 if keyed is None else len(keyed['queues'])}")
        run.both(data.draw(st.integers(0, 5), label="between"))
    run.both(5)
    restored = QueueMachine.from_builtins(run.m.limits, run.m.to_builtins())
    restored.check_invariants()
    assert snapshot(restored) == snapshot(run.m)


# An index entry that the command itself made stale, dropped later in the same command: the drop
# is logged (node/core/keys.py key_head), so a fault after it revives the entry with its job.
def _level_moved(p: Pair):
    """x's best job leaves: its rotation entry is at a level it no longer has; reserve moves it
    (a new turn) and then drops the old entry."""
    p.enq(key="x")
    p.cancel(p.enq(key="x", priority=5))
    return C.reserve({"queues": ["q"], "lease_ms": 30_000, "max_jobs": 10}, p.m.limits)[0]


def _plain_left(p: Pair):
    """The jobs without a key have a rotation entry but no job: reserve unschedules the plain
    pseudo-key and then drops its entry."""
    p.enq(key="a")
    p.cancel(p.enq(priority=9))
    return C.reserve({"queues": ["q"], "lease_ms": 30_000, "max_jobs": 10}, p.m.limits)[0]


def _expired_at_the_head(p: Pair):
    """One sweep expires the head job of a rate-held key and then fires that key's timer:
    requeue's key_head drops the expired job's entry."""
    for fields in ({}, {"deadline_at_ms": p.now + 1000}, {}):
        p.enq(key="k", **fields)
    p.take()
    p.at(1000)
    return C.sweep()


@pytest.mark.parametrize("setup", [_level_moved, _plain_left, _expired_at_the_head])
def test_a_fault_after_the_command_made_an_entry_stale_and_dropped_it(setup):
    p = Pair([{"name": "q", "key_rate": {"count": 1, "period_ms": 1000}}])
    cmd = setup(p)
    p.run(cmd)          # fault_every_point: each fault must leave the state as it was, invariants holding


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
