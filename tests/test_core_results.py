"""Job results (docs/semantics.md "Workflows", "Job results"): an ack's result, kept with the
finished job for its queue's result_retention_ms, bounded per queue by max_retained_result_bytes
(the oldest results dropped, never an ack refused), expired by the sweep at log time, and
everything of it in snapshots, the digest and a replay."""
from __future__ import annotations

import tracemalloc

import pytest

from helpers_core import RETAIN, T0, Core, b64, err, payload, restored
from raftq.node.core import ops
from raftq.node.core.limits import ConfigError, Limits


def core(retention=10_000, bound=None, storage=None, **limits) -> Core:
    q = {"name": "q", "result_retention_ms": retention}
    if bound is not None:
        q["max_retained_result_bytes"] = bound
    return Core(limits=limits or None, storage=storage, queues=[q, {"name": "plain"}])


def done(c: Core, queue="q", result=None, rid=None) -> str:
    """A job enqueued, reserved and acked (with `result`, a payload object); its id."""
    jid = c.enqueue_id(queue)
    job = c.reserve_one([queue])
    assert job["id"] == jid
    status, body = c.ack(jid, job["attempt"], rid=rid, result=result)
    assert status == 200 and body == {"job_id": jid}, body
    return jid


def outcome(c: Core, jid: str):
    return c.m.job_outcome(jid)[0]


# ----------------------------------------------------------------------------- retention
def test_an_acked_job_is_kept_succeeded_with_its_result_for_the_retention():
    c = core()
    jid = done(c, result=payload(b'{"ok": 1}'))
    v = c.view(jid)
    assert v["state"] == "succeeded" and v["result"] == payload(b'{"ok": 1}') and v["result_dropped"] is False
    assert v["finished_at_ms"] == T0 and v["retained_until_ms"] == T0 + 10_000
    assert v["id"] == jid and v["queue"] == "q" and v["attempt"] == 1 and v["lease_expires_at_ms"] is None
    assert outcome(c, jid) == "succeeded"
    assert c.counts() == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 0}
    assert c.stats()["acked"] == 1
    c.m.check_invariants()


def test_an_ack_without_a_result_keeps_the_job_succeeded_with_a_null_result():
    c = core()
    jid = done(c)
    v = c.view(jid)
    assert v["state"] == "succeeded" and v["result"] is None and v["result_dropped"] is False


def test_a_queue_without_retention_keeps_nothing_and_drops_the_result():
    c = core()
    jid = done(c, "plain", result=payload(b"r"))
    assert c.view(jid) is None and outcome(c, jid) is None and c.m.results == {}
    assert c.m.to_builtins().get("results") is None


def test_retention_ends_at_log_time_in_the_sweep():
    c = core(retention=5000)
    jid = done(c, result=payload(b"r"))
    c.advance(4999)
    assert c.sweep()["results_expired"] == 0 and c.view(jid)["state"] == "succeeded"
    assert c.m.next_due_ms() == T0 + 5000
    c.advance(1)
    assert c.sweep()["results_expired"] == 1
    assert c.view(jid) is None and c.m.results == {} and c.m.result_bytes == {} and c.m.results_by_queue == {}
    c.m.check_invariants()


def test_the_sweep_expires_at_most_sweep_limit_results():
    c = core(retention=1000, storage={"sweep_limit": 2})
    ids = [done(c, result=payload(b"r")) for _ in range(3)]
    c.advance(1000)
    assert c.sweep()["results_expired"] == 2
    assert c.sweep()["results_expired"] == 1
    assert all(c.view(j) is None for j in ids)


def test_a_retention_change_applies_to_later_acks_only():
    c = core(retention=5000)
    first = done(c, result=payload(b"a"))
    assert c.configure(queues=[{"name": "q", "result_retention_ms": 0}])[0] == 200
    second = done(c, result=payload(b"b"))
    assert c.view(second) is None                   # retention 0: kept nothing
    assert c.view(first)["retained_until_ms"] == T0 + 5000     # kept with the window of its ack
    c.advance(5000)
    c.sweep()
    assert c.view(first) is None


def test_a_nack_a_release_an_extend_and_fencing_keep_nothing():
    c = core()
    jid = c.enqueue_id("q", max_attempts=2)
    job = c.reserve_one(["q"])
    err(c.ack(jid, job["attempt"] + 1, result=payload(b"r")), 409, "attempt_mismatch")
    assert c.m.results == {}
    c.nack(jid, 1)
    assert c.m.results == {} and c.state(jid) == "ready"
    job = c.reserve_one(["q"])
    c.nack(jid, job["attempt"])         # the last attempt: dead-lettered, kept as today (no store: gone)
    assert c.m.results == {} and c.view(jid) is None


def test_a_dead_lettered_job_shows_as_today_and_its_outcome_is_dead_lettered():
    c = Core(storage=RETAIN, queues=[{"name": "q", "result_retention_ms": 10_000}])
    jid = c.enqueue_id("q", max_attempts=1)
    c.reserve_one(["q"])
    c.nack(jid, 1, reason="boom")
    state, view = c.m.job_outcome(jid)
    assert state == "dead_lettered" and view["state"] == "dead_lettered" and view["last_reason"] == "boom"
    assert "result" not in view and c.m.results == {}


def test_outcome_of_a_live_job_and_of_an_unknown_one():
    c = core()
    jid = c.enqueue_id("q")
    assert c.m.job_outcome(jid) == ("live", None)
    c.reserve_one(["q"])
    assert c.m.job_outcome(jid) == ("live", None)
    assert c.m.job_outcome("00000000-0000-4000-8000-000000000000") == (None, None)


def test_a_batch_ack_carries_a_result_per_job():
    c = core()
    a, b = c.enqueue_id("q"), c.enqueue_id("q")
    jobs = c.reserve_jobs(["q"], max_jobs=2)
    status, body = c.acks([(a, 1, payload(b"ra")), (b, 1)])
    assert status == 200 and body == {"results": [{"job_id": a}, {"job_id": b}]}, body
    assert len(jobs) == 2 and c.view(a)["result"] == payload(b"ra") and c.view(b)["result"] is None


def test_a_retried_ack_replays_its_answer_and_keeps_one_record():
    c = core()
    jid = c.enqueue_id("q")
    c.reserve_one(["q"])
    first = c.ack(jid, 1, rid="r1", result=payload(b"r"))
    assert c.ack(jid, 1, rid="r1", result=payload(b"r")) == first
    assert len(c.m.results) == 1
    c.m.check_invariants()


# ----------------------------------------------------------------------------- the bound
def test_at_the_bound_the_oldest_results_are_dropped_and_the_ack_succeeds():
    c = core(bound=10)
    a = done(c, result=payload(b"aaaa"))
    b = done(c, result=payload(b"bbbb"))
    c3 = done(c, result=payload(b"cccccc"))        # 4 + 4 + 6 > 10: a's result goes (4 + 6 = 10)
    assert c.view(a)["state"] == "succeeded" and c.view(a)["result"] is None and c.view(a)["result_dropped"]
    assert c.view(b)["result"] == payload(b"bbbb") and c.view(c3)["result"] == payload(b"cccccc")
    assert c.m.result_bytes == {"q": 10}
    d = done(c, result=payload(b"d"))               # 11 > 10: b's goes too
    assert c.view(b)["result_dropped"] and c.m.result_bytes == {"q": 7} and c.view(d)["result"] == payload(b"d")
    c.m.check_invariants()


def test_a_result_larger_than_the_bound_on_its_own_is_not_kept_but_the_job_is():
    c = core(bound=3)
    a = done(c, result=payload(b"aa"))
    big = done(c, result=payload(b"toolarge"))
    assert c.view(big)["state"] == "succeeded" and c.view(big)["result"] is None and c.view(big)["result_dropped"]
    assert c.view(a)["result"] == payload(b"aa")    # nothing dropped for a result that could not fit
    assert c.m.result_bytes == {"q": 2}


def test_results_without_bytes_are_never_dropped_by_the_bound():
    c = core(bound=2)
    a = done(c)
    done(c, result=payload(b"xx"))
    done(c, result=payload(b"yy"))
    assert c.view(a)["result_dropped"] is False


def test_a_lowered_bound_drops_the_oldest_results_in_the_configuration_command():
    c = core(bound=100)
    a = done(c, result=payload(b"a" * 40))
    b = done(c, result=payload(b"b" * 40))
    status, _ = c.configure(queues=[{"name": "q", "result_retention_ms": 10_000, "max_retained_result_bytes": 50}])
    assert status == 200
    assert c.view(a)["result_dropped"] and c.view(b)["result"] is not None and c.m.result_bytes == {"q": 40}
    c.m.check_invariants()


def test_the_bound_is_per_queue():
    c = Core(queues=[{"name": "q", "result_retention_ms": 10_000, "max_retained_result_bytes": 4},
                     {"name": "r", "result_retention_ms": 10_000, "max_retained_result_bytes": 4}])
    a = done(c, "q", result=payload(b"aaaa"))
    b = done(c, "r", result=payload(b"bbbb"))
    assert c.view(a)["result"] is not None and c.view(b)["result"] is not None
    assert c.m.result_bytes == {"q": 4, "r": 4}


# ----------------------------------------------------------------------------- validation
def test_a_result_over_max_result_bytes_is_refused_400_and_changes_nothing():
    c = core(max_result_bytes=4)
    jid = c.enqueue_id("q")
    c.reserve_one(["q"])
    before = c.snapshot_state()
    e = err(c.ack(jid, 1, result=payload(b"12345")), 400, "invalid_argument")
    assert e["field"] == "result" and e["limit"] == 4 and e["actual"] == 5
    assert "max_result_bytes" in e["message"]
    assert c.snapshot_state() == before
    assert c.ack(jid, 1, result=payload(b"1234"))[0] == 200


@pytest.mark.parametrize("result, why", [
    ({"data_b64": "eA=="}, "result.encoding"),
    ({"encoding": "x"}, "result.data_b64"),
    ({"data_b64": "", "encoding": "x"}, "at least one byte"),
    ({"data_b64": "!!", "encoding": "x"}, "not valid base64"),
    ("text", "result must be an object"),
])
def test_a_malformed_result_is_refused_400(result, why):
    c = core()
    jid = c.enqueue_id("q")
    c.reserve_one(["q"])
    e = err(c.ack(jid, 1, result=result), 400, "invalid_argument")
    assert why in e["message"], e


def test_a_result_encoding_over_max_encoding_bytes_is_refused():
    c = core(max_encoding_bytes=4)
    jid = c.enqueue_id("q")
    c.reserve_one(["q"])
    e = err(c.ack(jid, 1, result=payload(b"x", "application/json")), 400, "invalid_argument")
    assert e["field"] == "result.encoding"


def test_a_batch_ack_names_the_item_whose_result_is_too_large():
    c = core(max_result_bytes=1)
    jid = c.enqueue_id("q")
    c.reserve_one(["q"])
    e = err(c.acks([(jid, 1, payload(b"xx"))]), 400, "invalid_argument")
    assert e["field"] == "acks[0].result"


@pytest.mark.parametrize("queue, why", [
    ({"name": "q", "result_retention_ms": -1}, "result_retention_ms"),
    ({"name": "q", "max_retained_result_bytes": 0}, "max_retained_result_bytes"),
])
def test_result_settings_are_checked(queue, why):
    with pytest.raises(ConfigError, match=why):
        Limits.build(queues=[queue])


def test_max_result_bytes_is_at_most_max_request_bytes():
    with pytest.raises(ConfigError, match="max_result_bytes"):
        Limits.build(limits={"max_result_bytes": 2048, "max_request_bytes": 1024, "max_payload_bytes": 1024})


def test_the_configuration_document_names_max_result_bytes_only_when_set():
    assert "max_result_bytes" not in Limits.build().doc["limits"]
    assert Limits.build(limits={"max_result_bytes": 10}).doc["limits"]["max_result_bytes"] == 10
    assert Limits.build().max_result_bytes == 1024 * 1024


# ----------------------------------------------------------------------------- replication
def test_an_ack_without_a_result_is_the_command_of_before():
    assert ops.ack(None, "j", 1) == ("ack", None, "j", 1)
    assert ops.ack(None, "j", 1, (b"r", "e")) == ("ack", None, "j", 1, (b"r", "e"))


def test_snapshot_round_trip_keeps_records_bytes_order_and_timers():
    c = core(bound=10)
    ids = [done(c, result=payload(bytes([65 + i]) * 4)) for i in range(3)]   # the first's result dropped
    done(c)
    m = restored(c)
    assert m.result_bytes == c.m.result_bytes == {"q": 8}
    assert list(m.results_by_queue["q"]) == ids[1:]
    assert m.job_view(ids[0]) == c.view(ids[0]) and m.job_view(ids[2]) == c.view(ids[2])
    c.advance(10_000)
    assert c.sweep()["results_expired"] == 4
    assert m.apply(c.now, ops.sweep())[1]["results_expired"] == 4
    assert m.digest() == c.m.digest()


def test_a_state_without_retained_jobs_writes_and_hashes_as_before():
    c = core()
    done(c, "plain", result=payload(b"r"))
    data = c.m.to_builtins()
    assert "results" not in data
    c2 = core()
    done(c2)
    assert "results" in c2.m.to_builtins() and c2.m.digest() != core().m.digest()


def test_a_replay_of_the_log_gives_the_same_answers_and_state():
    c = core(bound=6)
    answers = []
    for i in range(4):
        jid = c.enqueue_id("q")
        c.reserve_one(["q"])
        answers.append(c.ack(jid, 1, rid=f"r{i}", result=payload(b"abc")))
        c.advance(4000)
    c.sweep()
    replay = core(bound=6)
    got = [replay.m.apply(now, cmd) for now, cmd in c.log]
    assert [a for (_, cmd), a in zip(c.log, got) if cmd[0] == ops.ACK] == answers
    assert replay.m.digest() == c.m.digest() and replay.m.to_builtins() == c.m.to_builtins()
    replay.m.check_invariants()


# ----------------------------------------------------------------------------- memory
class _NoLog(list):
    def append(self, _):
        pass


def held_after_acks(queue: str, n: int, result) -> int:
    """Bytes still allocated after n jobs of `queue` were enqueued, reserved and acked."""
    c = core(retention=10**9, bound=10**9)
    c.log = _NoLog()                    # the harness's replay log would count in both
    for _ in range(50):                 # dicts and heaps past their first growth steps
        done(c, queue, result=result)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(n):
        done(c, queue, result=result)
    c.m.rids.clear()
    c.m.rid_heap.clear()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return held


def test_memory_per_retained_job_is_measured():
    """docs/semantics.md "Job results" quotes this: a retained job costs its Job (kept from its
    time live, payload and all), its record, its timer and its dict entries: about 370 bytes
    without a result (64-bit CPython 3.11+, measured here), plus the result's bytes object (33 +
    its length) and its place in its queue's order."""
    n = 2000
    plain = held_after_acks("plain", n, None)
    kept = held_after_acks("q", n, None)
    with_result = held_after_acks("q", n, payload(b"x" * 100))
    per_job = (kept - plain) / n
    per_result = (with_result - kept) / n
    print(f"retained job: {per_job:.0f} bytes; a 100-byte result adds {per_result:.0f}")
    assert 200 < per_job < 500 and 100 <= per_result < 300
