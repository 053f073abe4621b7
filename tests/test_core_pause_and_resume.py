"""Pause and resume: a paused queue keeps accepting enqueues, reserve skips it, time
keeps running (docs/semantics.md, Pause and resume)."""
from __future__ import annotations

from helpers_core import Core, RETAIN, dead_record, err, ids_of


def test_paused_queue_is_skipped_keeps_accepting_enqueues_and_resumes():
    c = Core()
    a1 = c.enqueue_id("a")
    b1 = c.enqueue_id("b")
    assert c.pause("a") == (200, {"queue": "a", "paused": True})
    assert c.stats("a")["paused"] is True
    a2 = c.enqueue_id("a")
    assert ids_of(c.reserve_jobs(["a", "b"], max_jobs=5)) == [b1]
    assert c.reserve_jobs(["a"]) == []
    assert c.counts("a")["ready"] == 2
    assert c.resume("a") == (200, {"queue": "a", "paused": False})
    assert ids_of(c.reserve_jobs(["a", "b"], max_jobs=5)) == [a1, a2]


def test_pausing_an_unused_queue_creates_it_paused_only_when_asked():
    c = Core()
    assert err(c.pause("later"), 404, "not_found")["queue"] == "later"
    assert c.stats("later") is None
    assert c.pause("later", create=True) == (200, {"queue": "later", "paused": True})
    assert c.stats("later")["paused"] is True
    c.enqueue_id("later")
    assert c.reserve_jobs(["later"]) == []


def test_time_keeps_running_in_a_paused_queue():
    c = Core(storage=RETAIN)
    sched = c.enqueue_id(delay_ms=100)
    doomed = c.enqueue_id(deadline_at_ms=c.now + 100)
    c.pause("q")
    c.advance(100)
    c.sweep()
    assert c.state(sched) == "ready"
    assert c.state(doomed) == "dead_lettered" and dead_record(c, doomed)["cause"] == "expired"
    c.resume("q")
    assert ids_of(c.reserve_jobs()) == [sched]
