"""Commands and results as they cross Raft and live in journals, the request-id store and
snapshots (node/core/ops.py):

* every command shape release 0.1.0 wrote still applies, and validation still writes exactly
  those shapes (so journals keep one format);
* commands and the builtins form of a snapshot are plain builtins: no class path in their
  pickles;
* results are codes and fields: a change of message wording changes the rendered answers and
  nothing replicated (state, request-id store, digest);
* a snapshot of builtins version 1 (answers kept rendered, English included) is read into the
  state of this version and replays exactly the answers that were given.
"""
from __future__ import annotations

import pickle
import pickletools
import uuid
from pathlib import Path

import orjson
import pytest

from raftq.node.base import validate as C
from raftq.node.core import answers, ops
from raftq.node.core.answers import render
from raftq.node.core.jobs import Job
from raftq.node.core.limits import Limits
from raftq.node.core.machine import HANDLERS, QueueMachine
from raftq.node.core.machine import QueueMachine as RawMachine

from helpers_core import Core

FIXTURES = Path(__file__).parent / "fixtures"
T0 = 1_764_500_000_000


def jid(n: int) -> str:
    return str(uuid.UUID(int=n, version=4))


def class_paths(obj) -> list:
    """The globals a pickle of `obj` would import (none for plain builtins)."""
    return [arg for op, arg, _ in pickletools.genops(pickle.dumps(obj, protocol=5))
            if op.name in ("GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX")]


def canon(state: dict) -> dict:
    """`to_builtins()` with heap layouts (which carry no meaning) sorted."""
    out = dict(state)
    for key in ("sched", "leases", "deadlines", "dedup_heap"):
        out[key] = sorted(state[key])
    out["queues"] = [(name, counters, sorted(heap)) for name, counters, heap in state["queues"]]
    return out


# ---------------------------------------------------------------------------- the 0.1.0 shapes

def test_every_command_shape_of_release_0_1_0_applies():
    """The commands exactly as 0.1.0 wrote them into journals (literal tuples), one of each op
    code, with the answers 0.1.0 gave."""
    m = QueueMachine(Limits.build(storage={"dead_letter_retention_ms": 10**9}, queues=[{"name": "one", "max_queue_depth": 1}]))
    a, b, c, d, e, f = (jid(n) for n in range(1, 7))

    def item(job_id, queue="q", priority=0, scheduled=None, key=None, payload=None):
        return (job_id, queue, "t", payload, "text/plain" if payload else None, priority, 3, None, None,
                scheduled, None, key)

    def apply(cmd, now=T0):
        return render(m.apply(now, cmd))

    assert apply(("enq", "r1", 0, [item(a, key="k", payload=b"hi")])) == (200, {"job_id": a, "deduplicated": False})
    assert apply(("enq", None, 0, [item(jid(99), key="k")])) == (200, {"job_id": a, "deduplicated": True})
    assert apply(("enq", None, 1, [item(b, priority=5), {"reason": "invalid_request", "message": "no"},
                                   item(c, scheduled=T0 + 1000)])) == (200, {"results": [
        {"job_id": b, "deduplicated": False}, {"rejection": {"reason": "invalid_request", "message": "no"}},
        {"job_id": c, "deduplicated": False}]})
    assert apply(("enq", None, 2, [item(d, queue="one"), item(e, queue="one")]))[1]["error"]["code"] == "batch_rejected"
    assert apply(("enq", None, 2, [item(d)])) == (200, {"results": [{"job_id": d, "deduplicated": False}]})
    got = apply(("res", "r2", ("q",), 30_000, 2))
    assert got[0] == 200 and [j["id"] for j in got[1]["jobs"]] == [b, a]
    assert got[1]["jobs"][1]["payload"] == {"data_b64": "aGk=", "encoding": "text/plain"}
    assert apply(("ack", "r3", b, 1)) == (200, {"job_id": b})
    assert apply(("acks", None, ((b, 1), (a, 2)))) == (200, {"results": [
        {"error": {"code": "job_not_found", "message": answers.JOB_NOT_FOUND_MESSAGE, "job_id": b}},
        {"error": {"code": "attempt_mismatch", "message": "attempt mismatch: the job is in flight under attempt 1, not 2",
                   "job_id": a, "attempt": 1}}]})
    assert apply(("ext", None, a, 1, 5000)) == (200, {"job_id": a, "lease_expires_at_ms": T0 + 5000})
    assert apply(("nack", None, a, 1, "why", "delay", 500)) == (200, {"job_id": a, "dead_lettered": False})
    assert apply(("sweep", None), T0 + 1000) == (200, {"promoted": 2, "leases_expired": 0, "deadlines_expired": 0,
                                                       "dedup_expired": 0, "request_ids_expired": 0,
                                                       "dead_letters_expired": 0, "audit_expired": 0,
                                                       "ticks_fired": 0, "key_timers_fired": 0,
                                                       "results_expired": 0})
    got = apply(("res", None, ("q",), 30_000, 3), T0 + 1000)
    assert sorted(j["id"] for j in got[1]["jobs"]) == sorted([a, c, d])
    assert apply(("nack", None, a, 2, None, "default", None), T0 + 1000) == (200, {"job_id": a, "dead_lettered": False})
    assert apply(("nack", None, c, 1, "bad", "dead_letter", None), T0 + 1000) == (200, {"job_id": c, "dead_lettered": True})
    assert apply(("nack", None, d, 1, "bad", "dead_letter", None), T0 + 1000)[1]["dead_lettered"] is True
    drained = apply(("drain", None, None, 1), T0 + 1000)
    assert [r["job"]["id"] for r in drained[1]["records"]] == [c] and drained[1]["records"][0]["cause"] == "rejected"
    assert apply(("requeue", None, (d, f))) == (200, {"requeued": [d], "missing": [f]})
    assert apply(("nack", None, a, 3, None, "dead_letter", None)) == (404, {"error": {
        "code": "job_not_found", "message": answers.JOB_NOT_FOUND_MESSAGE, "job_id": a}})
    assert apply(("dldel", None, (d, f))) == (200, {"deleted": [], "missing": [d, f]})
    assert apply(("cancel", None, d)) == (200, {"job_id": d})
    assert apply(("pause", None, "q", True)) == (200, {"queue": "q", "paused": True})
    assert apply(("pause", None, "q", False)) == (200, {"queue": "q", "paused": False})
    # the request ids remember what they answered
    assert apply(("enq", "r1", 0, [item(jid(50))])) == (200, {"job_id": a, "deduplicated": False})
    assert apply(("ack", "r1", a, 1))[1]["error"]["message"] == \
        "Request-Id 'r1' was already used for a different operation (enq)"
    m.check_invariants()


def test_validation_writes_the_0_1_0_shapes_and_the_operator_fields_after_them():
    """The commands of release 0.1.0 keep their fields in their places; operator commands carry
    `who` (and pause `create`) after them, which the handlers default for 0.1.0's shorter form."""
    limits = Limits.build()
    ids = iter([jid(1), jid(2)])
    a = jid(7)
    assert C.enqueue({"queue": "q", "job_type": "t"}, limits, T0, ids.__next__, rid="r") == \
        ("enq", "r", 0, [(jid(1), "q", "t", None, None, 0, 3, None, None, None, None, None)])
    assert C.reserve({"queues": ["q"], "lease_ms": 1000, "max_jobs": 2}, limits)[0] == ("res", None, ("q",), 1000, 2)
    assert C.ack(a, {"attempt": 1}) == ("ack", None, a, 1)
    assert C.ack_batch({"acks": [{"job_id": a, "attempt": 2}]}, limits) == ("acks", None, ((a, 2),))
    assert C.nack(a, {"attempt": 1}) == ("nack", None, a, 1, None, "default", None)
    assert C.extend(a, {"attempt": 1, "lease_ms": 9}) == ("ext", None, a, 1, 9)
    assert C.drain({}, limits) == ("drain", None, None, 1, None)
    assert C.requeue({"ids": [a]}, who="ops") == ("requeue", None, (a,), "ops")
    assert C.delete_dead_letters({"ids": [a]}) == ("dldel", None, (a,), None)
    assert C.cancel(a) == ("cancel", None, a, None, True)      # in_flight (absent before 0.2.0: no)
    assert C.pause("q", True, limits) == ("pause", None, "q", True, False, None)
    assert C.pause("q", True, limits, body={"create": True}) == ("pause", None, "q", True, True, None)
    assert C.sweep() == ("sweep", None)
    assert ops.OPS[:12] == ("enq", "res", "ack", "acks", "nack", "ext", "drain", "requeue", "dldel", "cancel",
                            "pause", "sweep")
    assert ops.OPS[12:] == ("config", "keyadd", "keydel", "dlmove", "purge", "qdel", "record", "rel", "cclose",
                            "schput", "schdel", "schpause", "schrun", "schseed", "bopen", "badd", "bclose", "bcancel")
    assert C.close_circuit("q", limits, who="ops") == ("cclose", None, "q", "ops")
    assert {op: n for op, n in ops.LEGACY_FIELDS.items()} == {"drain": 2, "requeue": 1, "dldel": 1, "cancel": 1,
                                                              "pause": 2}


def test_handlers_take_the_fields_by_name_and_are_named_with_the_spec_verbs():
    names = {op: h.__name__ for op, h in HANDLERS.items()}
    assert names == {"enq": "enqueue", "res": "reserve", "ack": "ack", "acks": "ack_batch", "nack": "nack",
                     "ext": "extend", "drain": "drain", "requeue": "requeue", "dldel": "delete_dead_letters",
                     "cancel": "cancel", "pause": "pause", "sweep": "sweep", "config": "configure",
                     "keyadd": "add_key", "keydel": "remove_key", "dlmove": "move_to_dead_letters",
                     "purge": "purge", "qdel": "delete_queue", "record": "record_action", "rel": "release",
                     "cclose": "close_circuit", "schput": "put_schedule", "schdel": "delete_schedule",
                     "schpause": "pause_schedule", "schrun": "trigger_schedule", "schseed": "seed_schedules",
                     "bopen": "open_batch", "badd": "add_to_batch", "bclose": "close_batch",
                     "bcancel": "cancel_batch"}
    cmd = C.nack(jid(1), {"attempt": 2, "reason": "x", "retry": {"strategy": "delay", "delay_ms": 5}})
    assert ops.reader(ops.NACK, "delay_ms")(cmd) == 5 and ops.field_index(ops.NACK, "job_id") == 2


# ---------------------------------------------------------------------------- builtins only

def _busy(limits=None):
    limits = limits or Limits.build(storage={"dead_letter_retention_ms": 10**9})
    m = QueueMachine(limits)
    ids = (jid(n) for n in range(1, 10**6))
    cmds = [C.enqueue({"queue": "q", "job_type": "t", "idempotency_key": "k", "custom": {"a": 1.5},
                       "trace_context": {"traceparent": "00-x-y-01"}, "deadline_at_ms": T0 + 10**6,
                       "payload": {"data_b64": "aGk=", "encoding": "text/plain"}}, limits, T0, ids.__next__, rid="e"),
            C.enqueue_batch({"jobs": [{"queue": "q", "job_type": "t", "delay_ms": 50}, {"queue": 5}]}, limits, T0,
                            ids.__next__, rid="b"),
            C.reserve({"queues": ["q"], "lease_ms": 1000}, limits, rid="r")[0]]
    results = [m.apply(T0, c) for c in cmds]
    job = render(results[-1])[1]["jobs"][0]
    cmds2 = [C.ack(job["id"], {"attempt": 2}, rid="a"), C.nack(job["id"], {"attempt": 1, "reason": "x",
                                                                         "retry": {"strategy": "dead_letter"}}, rid="n"),
             C.drain({"max": 5}, limits, rid="d"), C.cancel(jid(999), rid="c"), C.pause("q", True, limits, rid="p"),
             C.ack_batch({"acks": [{"job_id": job["id"], "attempt": 1}]}, limits, rid="ab"),
             C.extend(job["id"], {"attempt": 1, "lease_ms": 5}, rid="x"), C.requeue({"ids": [job["id"]]}, rid="rq"),
             C.delete_dead_letters({"ids": [job["id"]]}, rid="dd"), C.sweep()]
    for c in cmds2:
        m.apply(T0 + 100, c)
    return m, cmds + cmds2


def test_commands_and_snapshots_are_plain_builtins():
    m, cmds = _busy()
    for cmd in cmds:
        assert class_paths(cmd) == [], cmd
    assert class_paths(m.to_builtins()) == []
    assert {type(result) for _, result, _ in m.rids.values()} == {tuple}


def test_a_message_wording_change_changes_no_replicated_state(monkeypatch):
    m, cmds = _busy()
    state, digest = m.to_builtins(), m.digest()
    replays = [render(m.apply(m.clock, c)) for c in cmds if c[1] is not None]
    monkeypatch.setattr(answers, "JOB_NOT_FOUND_MESSAGE", "gone")
    monkeypatch.setattr(answers, "attempt_mismatch_message", lambda attempt, asked: "stale")
    monkeypatch.setattr(answers, "CANCEL_NOT_FOUND_MESSAGE", "nothing to cancel")
    m2, _ = _busy()
    assert m2.to_builtins() == state and m2.digest() == digest
    again = [render(m2.apply(m2.clock, c)) for c in cmds if c[1] is not None]
    assert again != replays                        # the answers did change
    messages = {a[1]["error"]["message"] for a in again if "error" in a[1]}
    assert {"gone", "nothing to cancel", "stale"} <= messages
    assert m2.to_builtins() == m.to_builtins() and m2.digest() == m.digest()


# ---------------------------------------------------------------------------- snapshots of version 1

def _v1_fixture():
    return pickle.loads((FIXTURES / "core-v1-snapshot.pickle").read_bytes())


def test_a_v1_snapshot_replays_the_answers_that_were_given():
    """tests/fixtures/core-v1-snapshot.pickle was written by the machine of commit 49119f6
    (make_core_v1_snapshot.py): builtins version 1 with rendered answers under request ids."""
    fx = _v1_fixture()
    assert fx["snapshot"]["v"] == 1
    limits = Limits.build(**fx["config"])
    restored = QueueMachine.from_builtins(limits, fx["snapshot"])
    restored.check_invariants()
    # The state of a machine of this version that lived through the same history.
    lived = QueueMachine(limits)
    for now, cmd, answer in fx["history"]:
        got = render(lived.apply(now, cmd))
        if cmd[0] == ops.SWEEP:
            # A sweep's answer (never a client's: the leader's sweep loop reads it, no request
            # id keeps it) now also counts the audit step, the schedules' ticks, the key timers
            # and the retained results (docs/semantics.md "Job results").
            assert got[1].pop("audit_expired") == 0 and got[1].pop("ticks_fired") == 0
            assert got[1].pop("key_timers_fired") == 0 and got[1].pop("results_expired") == 0
        assert got == answer and orjson.dumps(got) == orjson.dumps(answer), cmd     # byte for byte
    assert restored.rids == lived.rids
    assert canon(restored.to_builtins()) == canon(lived.to_builtins())
    assert restored.digest() == lived.digest()
    assert all(type(r[0]) is str and r[0] != ops.ANSWER for _, r, _ in restored.rids.values())
    # Every remembered request replays the answer it got the first time, on both.
    replayed = 0
    for now, cmd, answer in fx["history"]:
        rid = cmd[1]
        if rid is None or rid not in restored.rids or restored.rids[rid][0] != cmd[0]:
            continue
        first = next(a for n, c, a in fx["history"] if c[1] == rid)
        assert render(restored.apply(fx["clock"], cmd)) == first, rid
        assert render(lived.apply(fx["clock"], cmd)) == first, rid
        replayed += 1
    assert replayed >= 20
    assert restored.digest() == lived.digest()


def test_a_v1_answer_this_version_would_not_make_is_kept_verbatim():
    fx = _v1_fixture()
    data = dict(fx["snapshot"])
    odd = (418, {"error": {"code": "teapot", "message": "short and stout"}})
    data["rids"] = [(rid, op, odd if rid == "pause" else kept, exp) for rid, op, kept, exp in data["rids"]]
    m = QueueMachine.from_builtins(Limits.build(**fx["config"]), data)
    assert m.rids["pause"][1] == (ops.ANSWER, 418, odd[1])
    assert render(m.apply(fx["clock"], C.pause("q", True, m.limits, rid="pause"))) == odd


def test_snapshot_versions():
    m, _ = _busy()
    data = m.to_builtins()
    assert data["v"] == 3
    with pytest.raises(ValueError):
        QueueMachine.from_builtins(m.limits, {**data, "v": 4})
    again = QueueMachine.from_builtins(m.limits, data)
    again.check_invariants()
    assert again.digest() == m.digest() and again.to_builtins() == data


# ---------------------------------------------------------------------------- invariants

@pytest.mark.parametrize("corrupt, says", [
    (lambda m: setattr(m.queues["q"], "ready", m.queues["q"].ready + 1), "counts"),
    (lambda m: m.lease_heap.clear(), "no live lease entry"),
    (lambda m: m.sched_heap.clear(), "no live schedule entry"),
    (lambda m: m.queues["q"].ready_fifo.clear() or m.queues["q"].fifo_seqs.clear() or m.queues["q"].ready_heap.clear(),
     "live ready-index entries"),
    (lambda m: m.queues["q"].fifo_seqs.pop(), "jobs and"),
    (lambda m: m.dedup_heap.clear(), "dedup record"),
    (lambda m: m.rid_heap.clear(), "no expiry entry"),
    (lambda m: m.dlq_by_queue["q"].popitem(), "missing from the index"),
    (lambda m: m.dlq.popitem(), "dead-letter store holds"),
    (lambda m: setattr(m, "clock", m.clock - 1), "clock went back"),
])
def test_check_invariants_finds_a_broken_index(corrupt, says):
    limits = Limits.build(storage={"dead_letter_retention_ms": 10**9})
    m = QueueMachine(limits)
    ids = (jid(n) for n in range(1, 100))
    for body in ({"idempotency_key": "k"}, {"delay_ms": 500}, {}, {}):
        m.apply(T0, C.enqueue({"queue": "q", "job_type": "t", **body}, limits, T0, ids.__next__, rid=f"e{len(m.jobs)}"))
    got = render(m.apply(T0, C.reserve({"queues": ["q"], "lease_ms": 1000, "max_jobs": 2}, limits)[0]))[1]["jobs"]
    m.apply(T0, C.nack(got[0]["id"], {"attempt": 1, "retry": {"strategy": "dead_letter"}}))
    m.check_invariants()
    corrupt(m)
    with pytest.raises(AssertionError, match=says):
        m.check_invariants()


def test_legacy_18_field_jobs_and_12_field_items_still_load_and_apply():
    c = Core()
    jid = c.enqueue_id()
    data = c.m.to_builtins()
    data["jobs"] = [tuple(t)[:18] for t in data["jobs"]]            # the snapshot form before 0.2.0
    m = RawMachine.from_builtins(c.limits, data)
    m.check_invariants()
    assert m.jobs[jid].releases == 0 and m.jobs[jid].timeout_ms is None
    assert m.digest() == c.m.digest()
    item = C.check_job({"queue": "q", "job_type": "t"}, c.limits, c.now, lambda: "11111111-1111-4111-8111-111111111111")
    assert len(item) == ops.ITEM_LEGACY_LEN
    assert m.apply(c.now, ops.enqueue(None, ops.SINGLE, [item]))[0] == ops.ENQUEUED
    m.check_invariants()


def test_a_job_that_uses_nothing_new_renders_and_hashes_as_before():
    c = Core()
    jid = c.enqueue_id()
    job = c.reserve_one()
    assert "timeout_ms" not in job and "releases" not in job
    assert c.m.jobs[jid].legacy_tuple() == c.m.jobs[jid].to_tuple()[:18]
    v = c.view(jid)
    assert v["timeout_ms"] is None and v["releases"] == 0     # the job view always shows both
    t = Job.from_tuple(c.m.jobs[jid].to_tuple())
    assert t.to_tuple() == c.m.jobs[jid].to_tuple()


def test_reserve_results_kept_by_older_code_get_the_new_fields_on_restore():
    c = Core()
    c.enqueue_id()
    c.reserve(rid="r-old")
    data = c.m.to_builtins()
    data["rids"] = [(key, op, (kept[0], tuple(t[:14] for t in kept[1])) if op == ops.RESERVE else kept, *rest)
                    for key, op, kept, *rest in data["rids"]]
    m = RawMachine.from_builtins(c.limits, data)
    assert m.rids == c.m.rids and m.digest() == c.m.digest()
