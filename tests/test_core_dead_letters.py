"""Dead letters: the store and its retention, drain, listing, requeue and delete
(docs/semantics.md, Dead letters; forwarding is in test_core_dead_letter_forwarding.py)."""
from __future__ import annotations

from helpers_core import Core, RETAIN, T0, UNKNOWN_ID, _kill, dead_record, ids_of


def test_drain_is_oldest_first_destructive_filtered_and_clamped():
    c = Core(storage=RETAIN, limits={"max_reserve_batch": 2})
    d1 = _kill(c, "a")
    c.advance(10)
    d2 = _kill(c, "b")
    c.advance(10)
    d3 = _kill(c, "a")
    c.advance(10)
    d4 = _kill(c, "a")
    status, body = c.drain(queue="a", max=1)
    assert status == 200 and [r["job"]["id"] for r in body["records"]] == [d1]
    assert c.counts("a")["dead_lettered"] == 2 and c.view(d1) is None
    recs = c.drain(max=10)[1]["records"]                          # clamped to max_reserve_batch
    assert [r["job"]["id"] for r in recs] == [d2, d3]
    assert recs[0]["failed_at_ms"] == T0 + 10 and recs[0]["cause"] == "attempts_exhausted"
    assert [r["job"]["id"] for r in c.drain(max=2)[1]["records"]] == [d4]
    assert c.drain(max=2) == (200, {"records": []})
    assert c.counts("a")["dead_lettered"] == 0 and c.counts("b")["dead_lettered"] == 0


def test_drain_default_max_is_one_and_unknown_queue_is_empty():
    c = Core(storage=RETAIN)
    _kill(c)
    _kill(c)
    assert c.drain(queue="nope") == (200, {"records": []})
    assert len(c.drain()[1]["records"]) == 1


def test_retention_zero_means_no_store_and_drain_is_always_empty():
    c = Core()
    assert c.limits.server_info()["dead_letter_retention_enabled"] is False
    jid = _kill(c)
    assert c.view(jid) is None and c.dead_letters() == []
    assert c.counts()["dead_lettered"] == 0 and c.stats()["dead_lettered_total"] == 1
    assert c.drain(max=10) == (200, {"records": []})
    assert Core(storage={"dead_letter_retention_ms": 1}).limits.server_info()["dead_letter_retention_enabled"] is True


def test_retention_deletes_old_dead_letters_in_the_sweep():
    c = Core(storage={"dead_letter_retention_ms": 1_000})
    old = _kill(c)
    c.advance(500)
    young = _kill(c)
    c.advance(499)
    assert c.sweep()["dead_letters_expired"] == 0
    c.advance(1)
    assert c.sweep()["dead_letters_expired"] == 1
    assert c.view(old) is None and c.state(young) == "dead_lettered"
    assert c.counts()["dead_lettered"] == 1
    c.advance(500)
    c.sweep()
    assert c.dead_letters() == [] and c.counts()["dead_lettered"] == 0


def test_dead_letter_listing_is_non_destructive_and_oldest_first():
    c = Core(storage=RETAIN)
    a = _kill(c, reason="r1")
    b = _kill(c)
    recs = c.dead_letters()
    assert [r["job"]["id"] for r in recs] == [a, b] and recs[0]["last_reason"] == "r1"
    assert len(c.dead_letters()) == 2


def test_requeue_keeps_the_id_resets_attempt_and_enqueue_time_and_drops_the_schedule():
    c = Core(storage=RETAIN)
    jid = c.enqueue_id(max_attempts=3, delay_ms=100, deadline_at_ms=c.now + 10**6)
    c.advance(100)
    c.sweep()
    c.reserve_one()
    c.nack(jid, 1)
    c.reserve_one()
    c.nack(jid, 2, retry={"strategy": "dead_letter"})
    assert dead_record(c, jid)["final_attempt"] == 2
    older = c.enqueue_id()
    c.advance(500)
    ready = c.enqueue_id()
    status, body = c.requeue([jid.upper(), UNKNOWN_ID, ready])
    assert (status, body) == (200, {"requeued": [jid], "missing": [UNKNOWN_ID, ready]})
    v = c.view(jid)
    assert (v["state"], v["attempt"], v["enqueued_at_ms"], v["scheduled_at_ms"]) == ("ready", 1, c.now, None)
    assert c.counts() == {"ready": 3, "scheduled": 0, "in_flight": 0, "dead_lettered": 0}
    jobs = c.reserve_jobs(max_jobs=3)
    assert ids_of(jobs) == [older, ready, jid] and jobs[2]["attempt"] == 1
    assert c.requeue([jid]) == (200, {"requeued": [], "missing": [jid]})


def test_delete_dead_letters_reports_missing():
    c = Core(storage=RETAIN)
    a, b = _kill(c), _kill(c)
    assert c.delete_dead([a, UNKNOWN_ID]) == (200, {"deleted": [a], "missing": [UNKNOWN_ID]})
    assert c.view(a) is None and c.state(b) == "dead_lettered"
    assert c.counts()["dead_lettered"] == 1
    assert c.delete_dead([a]) == (200, {"deleted": [], "missing": [a]})
