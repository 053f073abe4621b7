"""Request ids: a repeated write returns the original answer and applies nothing, within
the window; a reuse for another operation is refused (docs/semantics.md, Request ids)."""
from __future__ import annotations

from raftq.node.base import validate as C

from helpers_core import Core, QueueMachine, RETAIN, T0, _kill, err, ids_of, rejection


def test_request_id_replays_an_enqueue_without_applying_it_again():
    c = Core()
    first = c.enqueue(rid="r-1")
    assert c.enqueue(rid="r-1") == first
    assert c.enqueue(rid="r-1", job_type="other") == first     # the stored result, not a new job
    assert c.stats()["enqueued"] == 1


def test_request_id_replays_batches_and_apply_time_rejections():
    c = Core(limits={"max_job_type_bytes": 2}, queues=[{"name": "full", "max_queue_depth": 1}])
    jobs = [{"queue": "q", "job_type": "t"}, {"queue": "q", "job_type": "long"}]
    first = c.batch(jobs, rid="b")
    assert c.batch(jobs, rid="b") == first and c.stats()["enqueued"] == 1
    a = c.enqueue_id("full")
    rej = c.enqueue("full", rid="single")
    assert rejection(rej)["reason"] == "queue_full"
    c.reserve_one(["full"])
    c.ack(a, 1)                                     # room again, but the retry is a replay
    assert c.enqueue("full", rid="single") == rej
    assert c.stats("full")["enqueued"] == 1


def test_request_id_replays_reserve():
    c = Core()
    a, b = c.enqueue_id(), c.enqueue_id()
    first = c.reserve(rid="res")
    assert ids_of(first[1]["jobs"]) == [a]
    c.advance(10)
    assert c.reserve(rid="res") == first
    assert c.counts() == {"ready": 1, "scheduled": 0, "in_flight": 1, "dead_lettered": 0}
    assert ids_of(c.reserve_jobs()) == [b]


def test_empty_reserve_is_not_remembered_under_its_request_id():
    """A long poll re-proposes its request id until jobs arrive; only that answer is replayed."""
    c = Core()
    assert c.reserve(rid="poll") == (200, {"jobs": []})
    jid = c.enqueue_id()
    got = c.reserve(rid="poll")
    assert ids_of(got[1]["jobs"]) == [jid]
    c.enqueue_id()
    assert c.reserve(rid="poll") == got and c.counts()["ready"] == 1


def test_request_id_replays_ack_nack_and_extend():
    c = Core()
    a, n, e = c.enqueue_id(), c.enqueue_id(max_attempts=5), c.enqueue_id()
    c.reserve_jobs(max_jobs=3)
    assert c.ack(a, 1, rid="ack") == (200, {"job_id": a})
    assert c.ack(a, 1, rid="ack") == (200, {"job_id": a})
    err(c.ack(a, 1), 404, "job_not_found")                      # without the id it would fail
    assert c.nack(n, 1, rid="nack") == (200, {"job_id": n, "dead_lettered": False})
    assert c.nack(n, 1, rid="nack") == (200, {"job_id": n, "dead_lettered": False})
    assert c.view(n)["attempt"] == 2 and c.stats()["nacked"] == 1
    first = c.extend(e, 1, 1_000, rid="ext")
    c.advance(300)
    assert c.extend(e, 1, 1_000, rid="ext") == first
    assert c.view(e)["lease_expires_at_ms"] == first[1]["lease_expires_at_ms"]
    assert c.stats()["acked"] == 1


def test_request_id_replays_a_drain_with_the_same_records():
    c = Core(storage=RETAIN)
    ids = [_kill(c) for _ in range(3)]
    first = c.drain(max=2, rid="d")
    assert [r["job"]["id"] for r in first[1]["records"]] == ids[:2]
    assert c.drain(max=2, rid="d") == first
    assert c.counts()["dead_lettered"] == 1
    assert [r["job"]["id"] for r in c.drain(max=2)[1]["records"]] == ids[2:]


def test_request_id_expires_after_its_window():
    c = Core(limits={"request_id_window_ms": 1_000})
    first = c.enqueue(rid="r")
    c.advance(999)
    assert c.enqueue(rid="r") == first
    c.advance(1)
    again = c.enqueue(rid="r")                      # window over: applied as a new request
    assert again[1]["job_id"] != first[1]["job_id"] and c.stats()["enqueued"] == 2
    assert c.m.counts()["request_ids"] == 1
    c.advance(1_000)
    assert c.sweep()["request_ids_expired"] == 1
    assert c.m.counts()["request_ids"] == 0


def test_a_shorter_request_id_window_expires_later_records_first_and_keeps_earlier_expiries():
    """A record's expiry is fixed when it is stored. After a change to a shorter window, a
    record stored later expires before one stored earlier: the sweep drops each at its own
    expiry (it used to stop at the older record and keep the newer one past its window), and
    a snapshot keeps that order."""
    c = Core(limits={"request_id_window_ms": 10_000})
    c.seed()
    long = c.enqueue(rid="long")                                # expires at T0 + 10 s
    assert c.configure(limits={"request_id_window_ms": 1_000})[0] == 200
    c.advance(100)
    c.enqueue(rid="short")                                      # expires at T0 + 1.1 s
    assert c.m.next_due_ms() == T0 + 1_100
    restored = QueueMachine.from_builtins(c.limits, c.m.to_builtins())
    assert restored.to_builtins() == c.m.to_builtins()
    c.advance(1_000)
    for m in (c.m, restored):
        assert m.apply(c.now, C.sweep())[1]["request_ids_expired"] == 1
        assert m.counts()["request_ids"] == 1                   # "long" only
        m.check_invariants()
    assert restored.digest() == c.m.digest()
    assert c.enqueue(rid="long") == long                        # its 10 s window still holds
    c.advance(8_900)
    assert c.sweep()["request_ids_expired"] == 1 and c.m.counts()["request_ids"] == 0


def test_request_id_reused_for_another_operation_is_refused():
    """Code's choice (spec silent): the same id on a different operation is a client bug."""
    c = Core()
    jid = c.enqueue(rid="same")[1]["job_id"]
    c.reserve_one()
    status, body = c.ack(jid, 1, rid="same")
    assert status == 400 and body["error"]["code"] == "invalid_argument"
    assert c.state(jid) == "in_flight"


def test_request_ids_refused_before_apply_are_not_remembered():
    c = Core(limits={"max_job_type_bytes": 2})
    bad = c.atomic([{"queue": "q", "job_type": "long"}], rid="a")
    assert bad[0] == 422
    assert c.atomic([{"queue": "q", "job_type": "ok"}], rid="a")[0] == 200
