"""Dead-letter forwarding, the expired counter and dead letters by cause, rule by rule in the
pure core (docs/semantics.md "Dead-letter forwarding", "Dead letters")."""
from __future__ import annotations

import base64
import json
import pickle

import pytest

from raftq.node.base import validate as C
from raftq.node.core.jobs import Queue
from raftq.node.core.limits import ConfigError, Limits

from helpers_core import T0, Core, QueueMachine, payload
from test_core_faults import snapshot

RETAIN = {"dead_letter_retention_ms": 10**12}
FWD = [{"name": "work", "dead_letter_forward": "dlq-records", "default_max_attempts": 2},
       {"name": "dlq-records"}]


def core(storage=RETAIN, queues=FWD, **kw) -> Core:
    return Core(storage=storage, queues=queues, **kw)


def records(c: Core, queue="dlq-records") -> list[dict]:
    """The record jobs waiting in the forward queue, their payloads decoded."""
    out = []
    for view in c.m.list_jobs(queue, 0, 100, None)[0]:
        p = view["payload"]
        assert p["encoding"] == "application/json" and view["job_type"] == "raftq.dead_letter"
        out.append({"job": view, "record": json.loads(base64.b64decode(p["data_b64"]))})
    return out


def lease_lost_on_last_attempt(c: Core, **fields) -> str:
    jid = c.enqueue_id("work", payload=payload(b'{"n": 1}'), custom={"tenant": "acme"}, **fields)
    for attempt in (1, 2):
        job = c.reserve_one(["work"], lease_ms=1000)
        assert job["attempt"] == attempt
        c.advance(1000)
        c.sweep()
    return jid


# ---------------------------------------------------------------------------- each cluster-decided cause
def test_a_lease_lost_on_the_last_attempt_forwards_one_record_in_the_same_command():
    c = core()
    jid = lease_lost_on_last_attempt(c)
    assert c.state(jid) == "dead_lettered"
    [r] = records(c)
    rec, job = r["record"], r["job"]
    assert rec["cause"] == "lease_expired" and rec["last_reason"] is None and rec["final_attempt"] == 2
    assert rec["failed_at_ms"] == c.now and rec["dead_letter_kept"] is True
    # the original job as the API shows it (its dead-letter record's job, byte for byte)
    [dl] = c.dead_letters("work")
    assert rec["job"] == dl["job"] and rec["job"]["id"] == jid and rec["job"]["custom"] == {"tenant": "acme"}
    assert base64.b64decode(rec["job"]["payload"]["data_b64"]) == b'{"n": 1}'
    assert job["state"] == "ready" and job["attempt"] == 1 and job["queue"] == "dlq-records"
    assert job["custom"] == {"dead_letter_cause": "lease_expired", "dead_letter_queue": "work",
                             "dead_letter_job_id": jid}
    # GET /v1/jobs/{id} takes the record's id; it is the machine's, not random: a twin that
    # applies the same commands makes the same one
    assert C.canonical_uuid(job["id"]) == job["id"]
    twin = QueueMachine(c.limits)
    for now, cmd in c.log:
        twin.apply(now, cmd)
    assert twin.job_view(job["id"]) == c.view(job["id"]) and twin.digest() == c.m.digest()
    c.m.check_invariants()


def test_a_deadline_that_passes_forwards_and_counts_expired_at_the_sweep_and_at_a_reserve():
    c = core()
    swept = c.enqueue_id("work", deadline_at_ms=c.now + 500)
    c.advance(600)
    assert c.sweep()["deadlines_expired"] == 1
    # a reserve that meets a job past its deadline before the sweep does dead-letters it too
    late = c.enqueue_id("work", deadline_at_ms=c.now + 100)
    c.advance(200)
    assert c.reserve_jobs(["work"]) == []
    got = records(c)
    assert [r["record"]["job"]["id"] for r in got] == [swept, late]
    assert {r["record"]["cause"] for r in got} == {"expired"}
    st = c.stats("work")
    assert st["expired_total"] == 2 and st["dead_lettered_by_cause"]["expired"] == 2
    assert c.stats("dlq-records")["enqueued"] == 2
    c.m.check_invariants()


def test_an_operator_move_forwards_with_its_reason():
    c = core()
    jid = c.enqueue_id("work")
    assert c.move("work", [jid], reason="bad input")[0] == 200
    [r] = records(c)
    assert (r["record"]["cause"], r["record"]["last_reason"]) == ("admin", "bad input")


def test_worker_decided_causes_are_not_forwarded_unless_named():
    c = core()
    a = c.enqueue_id("work")
    job = c.reserve_one(["work"])
    c.nack(a, job["attempt"], reason="nope", retry={"strategy": "dead_letter"})
    b = c.enqueue_id("work", max_attempts=1)
    job = c.reserve_one(["work"])
    c.nack(b, job["attempt"], reason="boom")
    assert c.stats("work")["dead_lettered_by_cause"] == {"attempts_exhausted": 1, "rejected": 1,
                                                         "lease_expired": 0, "admin": 0, "expired": 0}
    assert records(c) == []
    # named: every nack that dead-letters forwards too
    c = core(queues=[{**FWD[0], "dead_letter_forward_causes": ["rejected", "attempts_exhausted"]}, FWD[1]])
    a = c.enqueue_id("work")
    c.nack(a, c.reserve_one(["work"])["attempt"], reason="nope", retry={"strategy": "dead_letter"})
    b = c.enqueue_id("work")
    c.move("work", [b])                          # admin is not among the named causes now
    assert [(r["record"]["cause"], r["record"]["last_reason"]) for r in records(c)] == [("rejected", "nope")]


def test_each_forwarded_dead_letter_makes_exactly_one_record_and_a_requeued_one_a_new_one():
    c = core()
    ids = [c.enqueue_id("work") for _ in range(3)]
    c.move("work", ids)
    first = records(c)
    assert sorted(r["record"]["job"]["id"] for r in first) == sorted(ids) and len(first) == 3
    c.requeue([ids[0]])
    c.move("work", [ids[0]])
    again = [r for r in records(c) if r["record"]["job"]["id"] == ids[0]]
    assert len(again) == 2 and again[0]["job"]["id"] != again[1]["job"]["id"]


# ---------------------------------------------------------------------------- whatever the store and the depth
def test_without_a_dead_letter_store_the_record_is_still_forwarded():
    c = core(storage={"dead_letter_retention_ms": 0})
    jid = lease_lost_on_last_attempt(c)
    assert c.view(jid) is None                   # dropped: no store
    [r] = records(c)
    assert r["record"]["cause"] == "lease_expired" and r["record"]["job"]["id"] == jid
    assert r["record"]["dead_letter_kept"] is False
    assert c.stats("work")["dead_lettered_by_cause"]["lease_expired"] == 0      # nothing kept
    assert c.stats("work")["dead_lettered_total"] == 1
    c.m.check_invariants()


def test_the_forward_queue_depth_limit_does_not_lose_a_record():
    c = core(queues=[FWD[0], {"name": "dlq-records", "max_queue_depth": 1}])
    c.enqueue_id("dlq-records")                  # the forward queue is full
    assert c.enqueue("dlq-records")[0] == 422
    ids = [c.enqueue_id("work") for _ in range(2)]
    c.move("work", ids)
    views = c.m.list_jobs("dlq-records", 0, 100, None)[0]
    assert [v["job_type"] for v in views] == ["t", "raftq.dead_letter", "raftq.dead_letter"]
    assert c.stats("dlq-records")["ready"] == 3              # past its limit of 1
    c.m.check_invariants()


def test_a_record_job_is_a_normal_job_of_the_forward_queue():
    c = core()
    jid = c.enqueue_id("work")
    c.move("work", [jid])
    job = c.reserve_one(["dlq-records"])
    assert job["job_type"] == "raftq.dead_letter" and job["attempt"] == 1 and job["max_attempts"] == 3
    assert c.ack(job["id"], 1)[0] == 200
    assert c.counts("dlq-records") == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 0}
    # its own dead-lettering (the forward queue forwards nothing) makes no further record
    r = c.enqueue_id("work")
    c.move("work", [r])
    rec = c.reserve_one(["dlq-records"])
    c.nack(rec["id"], 1, retry={"strategy": "dead_letter"})
    assert c.stats("dlq-records")["dead_lettered_total"] == 1 and records(c) == []


def test_the_trace_context_goes_with_the_record():
    c = core()
    jid = c.enqueue_id("work", trace_context={"traceparent": "00-abc-def-01"})
    c.move("work", [jid])
    [r] = records(c)
    assert r["job"]["trace_context"] == {"traceparent": "00-abc-def-01", "tracestate": None}
    assert r["record"]["job"]["trace_context"] == r["job"]["trace_context"]


# ---------------------------------------------------------------------------- undo, snapshots
def test_a_forward_that_fails_half_way_leaves_no_trace():
    """Fault injection at every mutation of the sweep that dead-letters and forwards."""
    c = core()
    jid = c.enqueue_id("work", max_attempts=1)
    c.reserve_one(["work"], lease_ms=1000)
    c.advance(1000)
    c.m.clock = c.now                            # the stamp moves the clock even for a failed command
    before = snapshot(c.m)
    n, faulted = 0, 0
    while True:
        m = pickle.loads(pickle.dumps(c.m))
        m._fault_after = n
        status, body = m.apply(c.now, C.sweep())
        m._fault_after = None
        if status == 200:
            break
        assert status == 500 and body["error"]["code"] == "internal"
        assert snapshot(m) == before                # exactly as before the command
        m.check_invariants()
        faulted += 1
        n += 1
    assert faulted >= 10                         # the dead letter, the record job, their counts
    assert m.job_view(jid)["state"] == "dead_lettered" and m.queue_stats("dlq-records")["ready"] == 1


def test_snapshot_round_trip_keeps_the_counter_and_rebuilds_the_counts_by_cause():
    c = core()
    c.enqueue_id("work", deadline_at_ms=c.now + 10)
    a = c.enqueue_id("work")
    c.move("work", [a])
    c.advance(20)
    c.sweep()
    data = c.m.to_builtins()
    restored = QueueMachine.from_builtins(c.limits, data)
    restored.check_invariants()
    assert restored.queue_stats("work") == c.stats("work")
    assert restored.queue_stats("work")["expired_total"] == 1
    assert restored.queue_stats("work")["dead_lettered_by_cause"]["admin"] == 1
    assert restored.digest() == c.m.digest() and restored.to_builtins() == data


def test_a_snapshot_without_the_counter_loads_it_at_0_and_hashes_as_before():
    c = core()
    jid = c.enqueue_id("work")
    c.move("work", [jid])
    data = c.m.to_builtins()
    assert len(Queue.COUNTERS) > len(Queue.COUNTERS_V1)       # expired (and any later counter) at the end
    old = {**data, "queues": [(name, counters[:len(Queue.COUNTERS_V1)], heap) for name, counters, heap in data["queues"]]}
    m = QueueMachine.from_builtins(c.limits, old)
    m.check_invariants()
    assert m.queue_stats("work")["expired_total"] == 0 and m.digest() == c.m.digest()
    # the counter takes part in the digest once it is not 0
    m.queues["work"].expired = 1
    m.queues["work"].dead_total += 1
    assert m.digest() != c.m.digest()


def test_counts_by_cause_follow_requeue_delete_and_drain():
    c = core(queues=[{"name": "work"}])
    ids = [c.enqueue_id("work") for _ in range(4)]
    c.move("work", ids)
    assert c.stats("work")["dead_lettered_by_cause"]["admin"] == 4
    c.requeue(ids[:1])
    c.delete_dead(ids[1:2])
    c.drain("work", max=1)
    assert c.stats("work")["dead_lettered_by_cause"]["admin"] == 1 and c.stats("work")["dead_lettered"] == 1
    c.m.check_invariants()


# ---------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("queues,says", [
    ([{"name": "a", "dead_letter_forward": "a"}], "to itself"),
    ([{"name": "a", "dead_letter_forward": "b"}, {"name": "b", "dead_letter_forward": "c"},
      {"name": "c", "dead_letter_forward": "a"}], "circle (a -> b -> c -> a)"),
    ([{"name": "a", "dead_letter_forward": ""}], "queues[a].dead_letter_forward"),
    ([{"name": "a", "dead_letter_forward": "x/y"}], "queues[a].dead_letter_forward"),
    ([{"name": "a", "dead_letter_forward": 3}], "queues[a].dead_letter_forward"),
    ([{"name": "a", "dead_letter_forward_causes": ["admin"]}], "without dead_letter_forward"),
    ([{"name": "a", "dead_letter_forward": "b", "dead_letter_forward_causes": []}], "must not be empty"),
    ([{"name": "a", "dead_letter_forward": "b", "dead_letter_forward_causes": ["timeout"]}], "not a cause"),
    ([{"name": "a", "dead_letter_forward": "b"}, {"name": "b", "allowed_job_types": ["x"]}], "raftq.dead_letter"),
    ([{"name": "a", "dead_letter_forward": "b"}, {"name": "b", "allowed_encodings": ["text/plain"]}],
     "application/json"),
])
def test_forward_configuration_is_checked_naming_the_key(queues, says):
    with pytest.raises(ConfigError) as e:
        Limits.build(queues=queues)
    assert says in str(e.value)


def test_the_forward_queue_need_not_be_declared_except_under_strict_queues():
    lim = Limits.build(queues=[{"name": "a", "dead_letter_forward": "b"}])
    assert lim.queue("a").dead_letter_forward == "b"
    assert lim.queue("a").dead_letter_forward_causes == ("lease_expired", "expired", "admin")
    assert lim.queue("a").describe()["dead_letter_forward_causes"] == ["lease_expired", "expired", "admin"]
    with pytest.raises(ConfigError, match="strict_queues"):
        Limits.build(limits={"strict_queues": True}, queues=[{"name": "a", "dead_letter_forward": "b"}])
    Limits.build(limits={"strict_queues": True}, queues=[{"name": "a", "dead_letter_forward": "b"}, {"name": "b"}])
    with pytest.raises(ConfigError, match="unknown key"):
        Limits.build(limits={"dead_letter_forward": "b"})           # per queue only


def test_a_configuration_change_starts_and_stops_forwarding():
    c = Core(storage=RETAIN)
    c.seed()
    a = c.enqueue_id("work")
    c.move("work", [a])
    assert c.stats("dlq-records") is None
    assert c.configure(storage=RETAIN, queues=[{"name": "work", "dead_letter_forward": "dlq-records"}])[0] == 200
    b = c.enqueue_id("work")
    c.move("work", [b])
    assert [r["record"]["job"]["id"] for r in records(c)] == [b]
    assert c.stats("work")["dead_lettered_by_cause"]["admin"] == 2
