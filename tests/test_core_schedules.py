"""Schedules in the pure core (docs/semantics.md "Schedules"): ticks on the replicated clock,
at most once per (schedule, tick), the catch-up and overlap policies, versions, bounds, and a
replay or a snapshot that gives the same ticks."""
from __future__ import annotations

import pickle

import pytest

from raftq.node.core.schedules import SCHEDULE_FIELD, TICK_FIELD, idempotency_key_of

from helpers_core import T0, Core

MIN = 60_000


def tick_jobs(c: Core, queue: str = "q") -> list[tuple[str, int]]:
    """(schedule, tick) of every job of `queue` a schedule made, ready or scheduled, in order."""
    jobs = c.m.list_jobs(queue, 0, 100_000, None)[0]
    return sorted((j["custom"][SCHEDULE_FIELD], j["custom"][TICK_FIELD]) for j in jobs
                  if SCHEDULE_FIELD in j.get("custom", {}))


def ok(result) -> dict:
    status, body = result
    assert status == 200, body
    return body


def test_an_interval_fires_each_tick_once_on_the_replicated_clock():
    c = Core()
    saved = ok(c.put_schedule("beat", every_ms=1000))
    assert saved == {"name": "beat", "version": 1, "created": True, "next_fire_at_ms": T0 + 1000}
    c.advance(999)
    assert c.sweep()["ticks_fired"] == 0
    c.advance(1)
    assert c.sweep()["ticks_fired"] == 1
    assert c.sweep()["ticks_fired"] == 0            # the same instant again: nothing more
    assert tick_jobs(c) == [("beat", T0 + 1000)]
    job = c.reserve_one()
    assert job["job_type"] == "tick" and job["custom"] == {SCHEDULE_FIELD: "beat", TICK_FIELD: T0 + 1000}
    view = c.schedule("beat")
    assert view["fired"] == 1 and view["last_tick_at_ms"] == T0 + 1000 and view["next_fire_at_ms"] == T0 + 2000
    assert view["last_job_id"] == job["id"] and view["last_job_state"] == "in_flight"
    c.ack(job["id"], 1)
    assert c.schedule("beat")["last_job_state"] == "finished"
    assert c.m.next_due_ms() == T0 + 2000
    c.m.check_invariants()


def test_a_cron_schedule_fires_at_its_minutes_in_its_zone():
    # 2026-03-08 in New York: 02:00 EST jumps to 03:00 EDT; "30 2 * * *" fires once, at 03:00 EDT.
    start = 1772938800000 - 2 * 3_600_000                  # 2026-03-08T05:00Z = 00:00 EST
    c = Core(now=start)
    ok(c.put_schedule("nightly", cron="30 2 * * *", time_zone="America/New_York"))
    gap_end = 1772953200000                                 # 2026-03-08T07:00Z = 03:00 EDT
    assert c.schedule("nightly")["next_fire_at_ms"] == gap_end
    c.now = gap_end
    assert c.sweep()["ticks_fired"] == 1
    assert c.schedule("nightly")["next_fire_at_ms"] == gap_end + 86_400_000 - 30 * MIN


@pytest.mark.parametrize("policy, expect", [
    # Down for 20 s at a 1 s interval, misfire_after_ms 5000: the ticks late by 5 s or less
    # (15..20) are on time under every policy; of the 14 missed before, skip fires none, one
    # the latest, all every one within the window.
    ("skip", list(range(15, 21))),
    ("one", [14] + list(range(15, 21))),
    ("all", list(range(1, 21))),
])
def test_catch_up_after_an_outage_follows_the_policy(policy, expect):
    c = Core()
    ok(c.put_schedule("s", every_ms=1000, catchup=policy, misfire_after_ms=5000))
    c.advance(20_000)
    assert c.sweep()["ticks_fired"] == len(expect)
    assert tick_jobs(c) == [("s", T0 + k * 1000) for k in expect]
    assert c.schedule("s")["next_fire_at_ms"] == T0 + 21_000
    c.advance(1000)
    assert c.sweep()["ticks_fired"] == 1


def test_catch_up_all_is_bounded_by_its_window_and_max_catchup_ticks():
    c = Core(limits={"max_catchup_ticks": 3})
    ok(c.put_schedule("s", every_ms=1000, catchup="all", misfire_after_ms=0, catchup_window_ms=10_000))
    c.advance(60_000)
    c.sweep()
    # within the window: ticks 50..59 missed, the oldest 3 of them fire; tick 60 is on time
    assert tick_jobs(c) == [("s", T0 + k * 1000) for k in (50, 51, 52, 60)]


def test_overlap_skip_waits_for_the_previous_tick_and_replace_takes_its_place():
    c = Core()
    ok(c.put_schedule("skip", every_ms=1000, overlap="skip", job={"queue": "a", "job_type": "t"}))
    ok(c.put_schedule("repl", every_ms=1000, overlap="replace", job={"queue": "b", "job_type": "t"}))
    c.advance(1000)
    c.sweep()
    c.advance(1000)
    c.sweep()
    assert tick_jobs(c, "a") == [("skip", T0 + 1000)]       # tick 2 skipped: tick 1 still ready
    assert c.schedule("skip")["skipped"] == 1
    assert tick_jobs(c, "b") == [("repl", T0 + 2000)]       # tick 1's job replaced by tick 2's
    job = c.reserve_one(("b",))
    c.advance(1000)
    c.sweep()                                               # a running job is not replaced
    assert c.state(job["id"]) == "in_flight" and tick_jobs(c, "b") == [("repl", T0 + 3000)]
    first = c.reserve_one(("a",))
    c.ack(first["id"], 1)
    c.advance(1000)
    c.sweep()
    assert tick_jobs(c, "a") == [("skip", T0 + 4000)]
    c.m.check_invariants()


def test_versions_guard_replace_and_delete_and_refusals_change_nothing():
    c = Core()
    ok(c.put_schedule("s", every_ms=1000, expect_version=0))
    before = c.snapshot_state()
    status, body = c.put_schedule("s", every_ms=2000, expect_version=0)
    assert status == 409 and body["error"]["version"] == 1
    status, body = c.delete_schedule("s", expect_version="7")
    assert status == 409
    assert c.snapshot_state() == before
    assert ok(c.put_schedule("s", every_ms=2000, expect_version=1))["version"] == 2
    assert c.schedule("s")["every_ms"] == 2000
    assert ok(c.delete_schedule("s", expect_version="2")) == {"name": "s", "deleted": True}
    assert c.delete_schedule("s")[0] == 404 and c.schedule("s") is None
    c.advance(5000)
    assert c.sweep()["ticks_fired"] == 0
    actions = [e["action"] for e in c.audit()]
    assert {"schedule_create", "schedule_replace", "schedule_delete"} <= set(actions)


@pytest.mark.parametrize("body, field", [
    ({"cron": "61 * * * *"}, "cron"),
    ({"cron": "* * * * *", "time_zone": "Mars/Base"}, "time_zone"),
    ({"cron": "* * * * *", "every_ms": 1000}, "cron"),
    ({}, "cron"),
    ({"every_ms": 999}, "every_ms"),
    ({"every_ms": 1000, "catchup": "some"}, "catchup"),
    ({"every_ms": 1000, "overlap": "queue"}, "overlap"),
    ({"every_ms": 1000, "start_at_ms": 10, "end_at_ms": 5}, "end_at_ms"),
    ({"every_ms": 1000, "job": {"queue": "q", "job_type": "t", "delay_ms": 5}}, "job.delay_ms"),
    ({"every_ms": 1000, "job": {"queue": "q", "job_type": "t", "custom": {"raftq.x": 1}}}, "job.custom"),
    ({"every_ms": 1000, "job": {"queue": "q", "job_type": "t", "priority": 12}}, "job"),
    ({"every_ms": 1000, "job": {"queue": "q"}}, "job"),
    ({"every_ms": 1000, "colour": "red"}, "colour"),
])
def test_a_bad_definition_is_400_naming_the_field_and_changes_nothing(body, field):
    c = Core()
    before = c.snapshot_state()
    status, answer = c.put_schedule("s", **body)
    assert status == 400 and answer["error"]["code"] == "invalid_argument", answer
    assert answer["error"]["field"] == field, answer
    assert c.snapshot_state() == before


def test_strict_queues_and_the_schedule_bound_refuse_a_create():
    c = Core(limits={"strict_queues": True, "max_schedules": 1}, queues=[{"name": "q"}])
    status, body = c.put_schedule("s", every_ms=1000, job={"queue": "nope", "job_type": "t"})
    assert status == 400 and body["error"]["field"] == "job", body
    ok(c.put_schedule("s", every_ms=1000))
    status, body = c.put_schedule("t", every_ms=1000)
    assert status == 429 and body["error"]["reason"] == "too_many", body
    assert c.schedule("t") is None
    ok(c.put_schedule("s", every_ms=5000))                 # a replace is not a new one


def test_pause_fires_nothing_and_resume_does_not_catch_up():
    c = Core()
    ok(c.put_schedule("s", every_ms=1000))
    assert ok(c.pause_schedule("s")) == {"name": "s", "paused": True, "version": 2}
    c.advance(10_000)
    assert c.sweep()["ticks_fired"] == 0 and c.m.tick_heap == []
    ok(c.pause_schedule("s", paused=False))
    assert c.schedule("s")["next_fire_at_ms"] == T0 + 11_000
    c.advance(1000)
    assert c.sweep()["ticks_fired"] == 1


def test_trigger_runs_once_now_and_is_audited():
    c = Core()
    ok(c.put_schedule("s", every_ms=60_000, job={"queue": "q", "job_type": "t", "priority": 7}))
    body = ok(c.trigger_schedule("s", rid="r1"))
    assert ok(c.trigger_schedule("s", rid="r1")) == body    # a retry: the same answer, no second job
    job = c.reserve_one()
    assert job["id"] == body["job_id"] and job["priority"] == 7 and job["custom"][TICK_FIELD] == T0
    assert c.schedule("s")["fired"] == 0                    # not a tick
    assert c.trigger_schedule("nope")[0] == 404
    assert [e["action"] for e in c.audit()][0] == "schedule_trigger"


def test_start_end_and_max_count_bound_the_ticks():
    c = Core()
    ok(c.put_schedule("w", every_ms=1000, start_at_ms=T0 + 5000, end_at_ms=T0 + 7000))
    ok(c.put_schedule("n", every_ms=1000, max_count=2, job={"queue": "n", "job_type": "t"}))
    for _ in range(10):
        c.advance(1000)
        c.sweep()
    assert tick_jobs(c) == [("w", T0 + 5000), ("w", T0 + 6000), ("w", T0 + 7000)]
    assert tick_jobs(c, "n") == [("n", T0 + 1000), ("n", T0 + 2000)]
    assert c.schedule("n")["next_fire_at_ms"] is None and c.schedule("w")["next_fire_at_ms"] is None
    c.m.check_invariants()


def test_a_tick_submitted_by_hand_with_its_key_is_not_made_twice():
    c = Core()
    ok(c.put_schedule("s", every_ms=1000))
    mine = c.enqueue_id("q", "tick", idempotency_key=idempotency_key_of("s", T0 + 1000))
    c.advance(1000)
    assert c.sweep()["ticks_fired"] == 1
    assert c.schedule("s")["last_job_id"] == mine and c.counts()["ready"] == 1


def test_a_full_queue_refuses_the_tick_and_the_schedule_says_why():
    c = Core(queues=[{"name": "q", "max_queue_depth": 1}])
    ok(c.put_schedule("s", every_ms=1000))
    c.advance(1000)
    c.sweep()
    c.advance(1000)
    assert c.sweep()["ticks_fired"] == 0
    assert c.schedule("s")["last_error"] == "queue_full"
    c.ack(c.reserve_one()["id"], 1)
    c.advance(1000)
    assert c.sweep()["ticks_fired"] == 1 and c.schedule("s")["last_error"] is None


def test_deadline_after_ms_is_relative_to_the_tick():
    c = Core()
    ok(c.put_schedule("s", every_ms=1000, job={"queue": "q", "job_type": "t", "deadline_after_ms": 500}))
    c.advance(1200)
    c.sweep()
    assert c.view(c.schedule("s")["last_job_id"])["deadline_at_ms"] == T0 + 1500


def test_one_sweep_fires_at_most_max_schedules_per_sweep_schedules():
    c = Core(limits={"max_schedules_per_sweep": 2})
    for i in range(5):
        ok(c.put_schedule(f"s{i}", every_ms=1000))
    c.advance(1000)
    assert [c.sweep()["ticks_fired"] for _ in range(4)] == [2, 2, 1, 0]


def test_a_replay_and_a_snapshot_give_the_same_ticks():
    c = Core()
    ok(c.put_schedule("a", every_ms=1000, catchup="all", overlap="skip", misfire_after_ms=0))
    ok(c.put_schedule("b", cron="*/2 * * * *", time_zone="Europe/Berlin", catchup="one"))
    for step in (300, 700, 5000, 130_000, 10, 240_000):
        c.advance(step)
        c.sweep()
        if step == 5000:
            j = c.reserve_one()
            c.ack(j["id"], j["attempt"])
            restored = pickle.loads(pickle.dumps(c.m))
    twin = Core()
    for now, cmd in c.log:
        twin.apply(cmd, now)
    assert twin.m.digest() == c.m.digest() and tick_jobs(twin) == tick_jobs(c)
    # the snapshot taken half-way, fed the rest of the log, ends in the same state
    taken = next(i for i, (_, cmd) in enumerate(c.log) if cmd[0] == "ack") + 1
    for now, cmd in c.log[taken:]:
        restored.apply(now, cmd)
    assert restored.digest() == c.m.digest()
    restored.check_invariants()



def test_the_toml_seed_applies_once_per_cluster():
    from raftq.node.base import validate_schedule
    from raftq.node.core import ops
    seed = tuple((name, validate_schedule.definition(name, body, Core().limits, 0)) for name, body in (
        ("nightly", {"cron": "0 3 * * *", "time_zone": "Europe/Paris", "job": {"queue": "q", "job_type": "n"}}),
        ("beat", {"every_ms": 60000, "job": {"queue": "q", "job_type": "beat"}})))
    c = Core()
    assert ok(c.apply(ops.schedule_seed(seed))) == {"created": ["nightly", "beat"]}
    ok(c.delete_schedule("beat"))
    # another leader, a restart, a changed TOML: the seed is not applied again
    assert ok(c.apply(ops.schedule_seed(seed))) == {"created": []}
    assert c.schedule("beat") is None and c.schedule("nightly")["time_zone"] == "Europe/Paris"
    restored = pickle.loads(pickle.dumps(c.m))
    assert restored.schedules_seeded and restored.digest() == c.m.digest()


def test_a_refused_trigger_changes_nothing():
    c = Core(queues=[{"name": "q", "max_queue_depth": 1}])
    ok(c.put_schedule("s", every_ms=60_000))
    c.enqueue_id("q", "t")
    before = c.snapshot_state()
    status, body = c.trigger_schedule("s")
    assert status == 422 and body["error"]["rejection"]["reason"] == "queue_full", body
    assert c.snapshot_state() == before


def test_a_replace_below_the_count_fired_is_kept_and_fires_no_more():
    c = Core()
    ok(c.put_schedule("s", every_ms=1000, max_count=2))
    c.advance(2000)
    c.sweep()
    assert ok(c.put_schedule("s", every_ms=1000, max_count=1))["next_fire_at_ms"] is None
    c.m.check_invariants()
    c.advance(5000)
    assert c.sweep()["ticks_fired"] == 0 and c.schedule("s")["fired"] == 2
    assert ok(c.put_schedule("s", every_ms=1000, paused=True))["next_fire_at_ms"] is None   # as the view says
