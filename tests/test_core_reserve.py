"""Reserve: the order jobs are handed out in, max_jobs and the lease clamp, the attempt
a reserved job keeps (docs/semantics.md, Reserve; its gating is in
test_core_reserve_gating.py, keys in test_core_keys.py)."""
from __future__ import annotations

from helpers_core import Core, descending_ids, ids_of


def test_reserve_orders_by_priority_then_age_then_batch_sequence():
    c = Core(ids=descending_ids())                  # ids sort against creation order
    old_low = c.enqueue_id(priority=0)
    c.advance(10)
    hi_1 = c.enqueue_id(priority=5)
    c.advance(10)
    hi_2 = c.enqueue_id(priority=5)
    c.advance(10)
    top = c.enqueue_id(priority=9)
    c.advance(10)
    status, body = c.batch([{"queue": "q", "job_type": "t"} for _ in range(4)])
    batch = [r["job_id"] for r in body["results"]]
    assert batch == sorted(batch, reverse=True)     # an id tie-break would reverse them
    assert ids_of(c.reserve_jobs(max_jobs=10)) == [top, hi_1, hi_2, old_low] + batch


def test_jobs_of_the_same_millisecond_keep_submission_order():
    c = Core(ids=descending_ids())
    ids = [c.enqueue_id() for _ in range(6)]
    assert ids_of(c.reserve_jobs(max_jobs=6)) == ids


def test_queues_are_polled_in_listed_order_without_fairness():
    c = Core()
    a = [c.enqueue_id("a", priority=0) for _ in range(2)]
    b = [c.enqueue_id("b", priority=9) for _ in range(2)]
    jobs = c.reserve_jobs(["a", "b"], max_jobs=3)
    assert ids_of(jobs) == a + b[:1]                 # a is drained first despite b's priority
    assert [j["queue"] for j in jobs] == ["a", "a", "b"]
    c2 = Core()
    a = [c2.enqueue_id("a") for _ in range(2)]
    b = [c2.enqueue_id("b") for _ in range(2)]
    assert ids_of(c2.reserve_jobs(["b", "a"], max_jobs=3)) == b + a[:1]


def test_reserve_on_empty_or_unknown_queues_returns_an_empty_list():
    c = Core()
    assert c.reserve(["nothing-here"]) == (200, {"jobs": []})
    assert c.stats("nothing-here") is None          # reserving does not create a queue


def test_max_jobs_default_one_and_clamped_to_max_reserve_batch():
    c = Core(limits={"max_reserve_batch": 3})
    for _ in range(6):
        c.enqueue_id()
    assert len(c.reserve_jobs()) == 1
    assert len(c.reserve_jobs(max_jobs=100)) == 3
    assert len(c.reserve_jobs(max_jobs=2)) == 2
    assert c.counts()["in_flight"] == 6


def test_lease_is_clamped_to_the_smallest_max_lease_of_the_listed_queues():
    c = Core(queues=[{"name": "long", "max_lease_duration_ms": 60_000},
                     {"name": "short", "max_lease_duration_ms": 5_000}])
    for _ in range(3):
        c.enqueue_id("long")
    job = c.reserve_one(["long", "short"], lease_ms=50_000)
    assert job["queue"] == "long" and job["lease_expires_at_ms"] == c.now + 5_000
    assert c.reserve_one(["long"], lease_ms=50_000)["lease_expires_at_ms"] == c.now + 50_000
    assert c.reserve_one(["long"], lease_ms=90_000)["lease_expires_at_ms"] == c.now + 60_000
    # an undeclared queue takes the global maximum (300 s by default)
    c.enqueue_id("free")
    assert c.reserve_one(["free"], lease_ms=10**9)["lease_expires_at_ms"] == c.now + 300_000


def test_reserved_job_keeps_the_attempt_of_its_ready_entry():
    c = Core()
    jid = c.enqueue_id(max_attempts=5)
    for attempt in (1, 2, 3):
        job = c.reserve_one()
        assert job["id"] == jid and job["attempt"] == attempt
        c.nack(jid, attempt)
