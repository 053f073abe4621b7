"""States: a job is in exactly one state, and the counts per queue and state are exact
(docs/semantics.md, States)."""
from __future__ import annotations

import random

import pytest

from raftq.node.core.jobs import IN_FLIGHT, READY, SCHEDULED

from helpers_core import Core, RETAIN


def _recount(c: Core, qname: str) -> dict:
    by_state = {}
    for state, name in ((READY, "ready"), (SCHEDULED, "scheduled"), (IN_FLIGHT, "in_flight")):
        by_state[name] = len(c.m.list_jobs(qname, state, 10**6, None)[0])
    by_state["dead_lettered"] = len(c.dead_letters(qname, 10**6))
    return by_state


def test_counts_per_queue_and_state_exact_through_a_lifecycle():
    c = Core(storage=RETAIN)
    a, b, s = c.enqueue_id(max_attempts=1), c.enqueue_id(max_attempts=1), c.enqueue_id(delay_ms=1000)
    assert c.counts() == {"ready": 2, "scheduled": 1, "in_flight": 0, "dead_lettered": 0}
    c.reserve_jobs(max_jobs=2)
    assert c.counts() == {"ready": 0, "scheduled": 1, "in_flight": 2, "dead_lettered": 0}
    c.ack(a, 1)
    c.nack(b, 1)                                   # last attempt: dead-lettered
    assert c.counts() == {"ready": 0, "scheduled": 1, "in_flight": 0, "dead_lettered": 1}
    c.advance(1000)
    c.sweep()
    assert c.counts() == {"ready": 1, "scheduled": 0, "in_flight": 0, "dead_lettered": 1}
    st = c.stats()
    assert (st["enqueued"], st["acked"], st["nacked"], st["dead_lettered_total"]) == (3, 1, 1, 1)
    assert st["name"] == "q" and st["declared"] is False and st["paused"] is False
    assert c.stats("other-queue") is None


@pytest.mark.parametrize("retention", [0, 5_000])
def test_counts_stay_exact_under_a_random_mix_of_operations(retention):
    """Counters vs a recount of the jobs by state after every step of a seeded random history."""
    rng = random.Random(20261130 + retention)
    c = Core(storage={"dead_letter_retention_ms": retention, "dedup_window_ms": 3_000},
             limits={"max_queue_depth": 25})
    queues = ["a", "b"]
    held: list = []                                     # (job_id, attempt) we hold leases for
    for step in range(400):
        r = rng.random()
        q = rng.choice(queues)
        if r < 0.30:
            fields = {"max_attempts": rng.randint(1, 3)}
            if rng.random() < 0.3:
                fields["delay_ms"] = rng.randint(0, 2000)
            if rng.random() < 0.3:
                fields["idempotency_key"] = f"k{rng.randint(0, 8)}"
            if rng.random() < 0.2:
                fields["deadline_at_ms"] = c.now + rng.randint(0, 3000)
            c.enqueue(q, **fields)
        elif r < 0.50:
            jobs = c.reserve_jobs([q], lease_ms=rng.randint(100, 3000), max_jobs=rng.randint(1, 3))
            held += [(j["id"], j["attempt"]) for j in jobs]
        elif r < 0.62 and held:
            c.ack(*held.pop(rng.randrange(len(held))))
        elif r < 0.74 and held:
            jid, att = held.pop(rng.randrange(len(held)))
            retry = rng.choice([None, {"strategy": "delay", "delay_ms": rng.randint(0, 1500)},
                                {"strategy": "dead_letter"}])
            c.nack(jid, att, retry=retry)
        elif r < 0.78 and held:
            jid, att = rng.choice(held)
            c.extend(jid, att, rng.randint(100, 3000))
        elif r < 0.82:
            c.drain(q, max=rng.randint(1, 3))
        elif r < 0.85:
            ids = [rec["job"]["id"] for rec in c.dead_letters(q)[:2]]
            if ids:
                c.requeue(ids)
        elif r < 0.88:
            jobs = c.m.list_jobs(q, rng.choice([READY, SCHEDULED]), 1, None)[0]
            if jobs:
                assert c.cancel(jobs[0]["id"])[0] == 200
        elif r < 0.90:
            (c.pause if rng.random() < 0.5 else c.resume)(q)
        else:
            c.advance(rng.randint(1, 800))
            c.sweep()
        for name in queues:
            if c.stats(name) is not None:
                assert c.counts(name) == _recount(c, name), (step, name)
    assert sum(c.stats(n)["enqueued"] for n in queues) > 50     # the history did something
