"""Reserve's gating (docs/semantics.md, Reserve; docs/api.md "Gating"): throttles (resource
limits), circuit breakers and execution windows, and how every other way out of ready keeps the
held-back marks in step, driven through request validation and QueueMachine.apply
(tests/helpers_core.py)."""
from __future__ import annotations

import pickle
from datetime import datetime, timezone

import pytest

from raftq.node.core.jobs import READY
from raftq.node.core.limits import ConfigError, Limits
from raftq.node.core.machine import QueueMachine as PlainMachine
from raftq.node.core.windows import load_zone

from helpers_core import T0, Core, err, payload

RETAIN = {"dead_letter_retention_ms": 10**12}


def gated(limits=None, queues=None, storage=None) -> Core:
    c = Core(limits=limits, storage={**RETAIN, **(storage or {})}, queues=queues)
    c.seed()
    return c


def ids(jobs) -> list:
    return [j["id"] for j in jobs]


def check(c: Core):
    c.m.check_invariants()
    # a snapshot round trip keeps everything, blocked entries included
    m2 = PlainMachine.from_builtins(c.m.limits, c.m.to_builtins())
    m2.check_invariants()
    assert m2.digest() == c.m.digest()
    # (heaps are written in their layout, which a restore may change: compare the gating part)
    assert m2.to_builtins().get("gating") == c.m.to_builtins().get("gating")


# ============================================================================ throttles

def test_a_full_resource_is_skipped_and_the_next_eligible_job_taken_in_priority_then_age_order():
    c = gated(limits={"resource_limits": {"db": 1}})
    a = c.enqueue_id("q", resource="db", priority=5)
    b = c.enqueue_id("q", resource="db", priority=5)
    c.advance(1)
    d = c.enqueue_id("q", priority=1)                 # no resource
    e = c.enqueue_id("q", resource="api", priority=3)  # unlimited resource
    f = c.enqueue_id("q", priority=3)
    first = c.reserve_one()
    assert first["id"] == a and first["resource"] == "db" and first["attempt"] == 1
    got = c.reserve_jobs(max_jobs=10)
    # b is held back (db full); the others come in priority, then age order
    assert ids(got) == [e, f, d]
    assert c.stats()["throttled"] == 1 and c.stats()["throttle_deferred_total"] == 1
    assert c.stats()["ready"] == 1 and c.state(b) == "ready" and c.view(b)["attempt"] == 1
    assert c.reserve_jobs() == []
    check(c)
    # a's ack frees the slot: b comes back, with its attempt unused
    assert c.ack(a, 1)[0] == 200
    assert c.stats()["throttled"] == 0
    assert c.reserve_one()["id"] == b and c.view(b)["attempt"] == 1
    assert c.m.in_use == {"db": 1, "api": 1}
    check(c)


def test_the_queue_resource_is_the_default_and_the_job_can_name_its_own():
    c = gated(limits={"resource_limits": {"db": 1, "x": 5}}, queues=[{"name": "q", "resource": "db"}])
    a = c.enqueue_id("q")
    b = c.enqueue_id("q", resource="x")
    assert c.view(a)["resource"] == "db" and c.view(b)["resource"] == "x"
    c.enqueue_id("q")
    assert len(c.reserve_jobs(max_jobs=10)) == 2       # a (db) and b (x); the second db job waits
    assert c.stats()["throttled"] == 1
    check(c)


@pytest.mark.parametrize("how", ["ack", "acks", "nack", "nack_dead_letter", "lease_expiry"])
def test_every_way_out_of_flight_frees_the_slot(how):
    c = gated(limits={"resource_limits": {"db": 1}, "retry_delay_ms": 0})
    a = c.enqueue_id("q", resource="db")
    b = c.enqueue_id("q", resource="db")
    job = c.reserve_one(lease_ms=1000)
    assert job["id"] == a and c.reserve_jobs() == [] and c.stats()["throttled"] == 1
    if how == "ack":
        assert c.ack(a, 1)[0] == 200
    elif how == "acks":
        assert c.acks([(a, 1)])[0] == 200
    elif how == "nack":
        assert c.nack(a, 1, reason="x")[0] == 200
    elif how == "nack_dead_letter":
        assert c.nack(a, 1, retry={"strategy": "dead_letter"})[1]["dead_lettered"] is True
    else:
        c.advance(1001)
        assert c.sweep()["leases_expired"] == 1
    assert c.stats()["throttled"] == 0 and c.m.in_use == {}
    # b was enqueued after a, but a retried keeps its place: the best ready job goes first
    nxt = c.reserve_one()
    assert nxt["id"] == (a if how in ("nack", "lease_expiry") else b)
    assert c.m.in_use == {"db": 1}
    check(c)


def test_raising_or_removing_a_limit_by_configuration_frees_blocked_jobs():
    c = gated(limits={"resource_limits": {"db": 1}})
    jobs = [c.enqueue_id("q", resource="db") for _ in range(4)]
    assert ids(c.reserve_jobs(max_jobs=10)) == jobs[:1]
    assert c.stats()["throttled"] == 3
    assert c.configure(limits={"resource_limits": {"db": 2}})[0] == 200
    assert c.stats()["throttled"] == 2 and ids(c.reserve_jobs(max_jobs=10)) == jobs[1:2]
    check(c)
    assert c.configure(limits={})[0] == 200             # no limit: unlimited
    assert c.stats()["throttled"] == 0
    assert ids(c.reserve_jobs(max_jobs=10)) == jobs[2:]
    check(c)


def test_a_lowered_limit_leaves_jobs_in_flight_and_admits_no_more():
    c = gated(limits={"resource_limits": {"db": 3}})
    jobs = [c.enqueue_id("q", resource="db") for _ in range(4)]
    got = c.reserve_jobs(max_jobs=3)
    c.m.check_invariants()
    status, body = c.configure(limits={"resource_limits": {"db": 1}})
    assert status == 200 and body["warnings"] == [{"code": "resource_above_limit", "field": "limits.resource_limits.db",
                                                   "resource": "db", "in_flight": 3, "limit": 1}]
    assert c.reserve_jobs() == [] and c.m.in_use == {"db": 3}
    c.m.check_invariants()
    c.ack(got[0]["id"], 1)
    c.ack(got[1]["id"], 1)
    assert c.reserve_jobs() == []                     # 1 in flight, limit 1
    c.ack(got[2]["id"], 1)
    assert ids(c.reserve_jobs()) == jobs[3:]
    check(c)


def test_cancel_purge_move_and_deadline_of_a_blocked_job():
    c = gated(limits={"resource_limits": {"db": 1}})
    holder = c.enqueue_id("q", resource="db")
    a = c.enqueue_id("q", resource="db")
    b = c.enqueue_id("q", resource="db", deadline_at_ms=T0 + 500)
    d = c.enqueue_id("q", resource="db")
    e = c.enqueue_id("q", resource="db")
    assert ids(c.reserve_jobs(max_jobs=10)) == [holder]
    assert c.stats()["throttled"] == 4
    assert c.cancel(a)[0] == 200 and c.stats()["throttled"] == 3 and c.state(a) is None
    check(c)
    c.advance(600)
    assert c.sweep()["deadlines_expired"] == 1          # the deadline runs while it is held back
    assert c.state(b) == "dead_lettered" and c.stats()["throttled"] == 2
    assert [r["cause"] for r in c.dead_letters()] == ["expired"]
    check(c)
    assert c.move("q", [d])[1]["dead_lettered"] == [d] and c.stats()["throttled"] == 1
    check(c)
    listed = c.m.list_jobs("q", READY, 10, None)[0]
    assert [j["id"] for j in listed] == [e]            # a blocked job is listed as ready
    assert c.purge("q")[1]["purged"] == 1 and c.stats()["throttled"] == 0 and c.stats()["ready"] == 0
    check(c)
    # the slot frees later: nothing stale comes back
    c.ack(holder, 1)
    assert c.reserve_jobs() == [] and c.stats()["ready"] == 0
    check(c)


def test_snapshot_round_trip_with_blocked_entries_and_a_replay_gives_the_same_state():
    c = gated(limits={"resource_limits": {"db": 1, "api": 2}})
    for i in range(6):
        c.enqueue_id("q" if i % 2 else "r", resource="db" if i % 3 else "api", priority=i % 3)
    c.reserve_jobs(("q", "r"), max_jobs=10)
    assert c.m.blocked and c.m.blocked_ids
    check(c)
    m2 = PlainMachine.from_builtins(c.m.limits, c.m.to_builtins())
    m3 = pickle.loads(pickle.dumps(c.m))
    assert m3.digest() == c.m.digest()
    # both go on the same way
    fresh = PlainMachine(c.m.limits.__class__.build())
    for now, cmd in c.log:
        fresh.apply(now, cmd)
    assert fresh.digest() == c.m.digest()
    held = sorted(c.m.blocked_ids)
    assert sorted(m2.blocked_ids) == held
    assert m2.queues["q"].throttled + m2.queues["r"].throttled == len(held)


def test_reserve_cost_stays_small_with_many_full_resources():
    """Each held-back job is looked at once per freed slot, not once per reserve."""
    c = gated(limits={"resource_limits": {f"r{i}": 1 for i in range(50)}})
    for i in range(50):
        for _ in range(20):
            c.enqueue_id("q", resource=f"r{i}")
    first = c.reserve_jobs(max_jobs=256)
    assert len(first) == 50 and c.stats()["throttled"] == 950
    deferred = c.stats()["throttle_deferred_total"]
    for _ in range(10):
        assert c.reserve_jobs(max_jobs=256) == []
    assert c.stats()["throttle_deferred_total"] == deferred       # nothing looked at again
    c.ack(first[0]["id"], 1)
    assert len(c.reserve_jobs(max_jobs=256)) == 1
    check(c)


def test_resource_config_and_enqueue_validation():
    with pytest.raises(ConfigError, match=r"limits.resource_limits.db"):
        Limits.build(limits={"resource_limits": {"db": -1}})
    with pytest.raises(ConfigError, match=r"limits.resource_limits"):
        Limits.build(limits={"resource_limits": 3})
    with pytest.raises(ConfigError, match=r"queues\[q\].resource"):
        Limits.build(queues=[{"name": "q", "resource": ""}])
    c = gated()
    status, body = c.enqueue("q", resource=5)
    assert status == 422 and "resource" in body["error"]["rejection"]["message"]
    assert "resource" not in c.view(c.enqueue_id("q"))          # shown only when the job has one


# ============================================================================ circuit breaker

BREAKER = [{"name": "q", "circuit_breaker": {"failures": 2, "window_ms": 1000, "open_ms": 5000}}]


def fail(c: Core, how="nack"):
    if not c.stats()["ready"]:
        c.enqueue_id("q", max_attempts=10)
    job = c.reserve_one(lease_ms=100)
    jid = job["id"]
    if how == "nack":
        c.nack(jid, job["attempt"], reason="boom")
    elif how == "dead_letter":
        c.nack(jid, job["attempt"], retry={"strategy": "dead_letter"})
    else:
        c.advance(101)
        assert c.sweep()["leases_expired"] == 1
    return jid


def test_the_circuit_opens_after_n_failures_within_the_window_and_reserve_skips_the_queue():
    c = gated(queues=BREAKER)
    assert c.stats()["circuit"] == {"state": "closed", "failures": 0, "opened_at_ms": None,
                                    "open_until_ms": None, "opened_total": 0}
    fail(c)
    c.advance(1500)                 # the first failure falls out of the window
    fail(c, "lease_expiry")
    assert c.stats()["circuit"]["state"] == "closed" and c.stats()["circuit"]["failures"] == 1
    c.advance(10)
    fail(c, "dead_letter")          # a dead_letter nack counts too
    s = c.stats()["circuit"]
    assert s["state"] == "open" and s["opened_at_ms"] == c.now and s["open_until_ms"] == c.now + 5000
    assert s["opened_total"] == 1
    c.enqueue_id("q")
    assert c.stats()["ready"] >= 1
    before = {j: c.view(j)["attempt"] for j in c.m.jobs if c.state(j) == "ready"}
    assert c.reserve_jobs(max_jobs=10) == []        # skipped: jobs wait, no attempt burned
    assert {j: c.view(j)["attempt"] for j in before} == before
    assert c.m.reservable(c.m.queues["q"]) is False
    check(c)


def test_half_open_hands_out_one_probe_and_its_ack_closes_the_circuit():
    c = gated(queues=BREAKER)
    fail(c)
    fail(c)
    for _ in range(3):
        c.enqueue_id("q")
    c.advance(5000)
    assert c.stats()["circuit"]["state"] == "open"        # m.clock: no command since
    c.sweep()                                             # a command's stamp moves it
    assert c.stats()["circuit"]["state"] == "half_open"
    probe = c.reserve_jobs(max_jobs=10)
    assert len(probe) == 1                          # exactly one probe
    assert c.reserve_jobs(max_jobs=10) == []
    check(c)
    assert c.ack(probe[0]["id"], probe[0]["attempt"])[0] == 200
    assert c.stats()["circuit"]["state"] == "closed" and c.stats()["circuit"]["failures"] == 0
    assert len(c.reserve_jobs(max_jobs=10)) >= 3
    check(c)


@pytest.mark.parametrize("how", ["nack", "lease_expiry"])
def test_a_failing_probe_opens_the_circuit_again(how):
    c = gated(queues=BREAKER)
    fail(c)
    fail(c)
    c.advance(5000)
    probe = c.reserve_one(lease_ms=100)
    if how == "nack":
        c.nack(probe["id"], probe["attempt"], reason="again")
    else:
        c.advance(101)
        c.sweep()
    s = c.stats()["circuit"]
    assert s["state"] == "open" and s["open_until_ms"] == c.now + 5000 and s["opened_total"] == 2
    assert c.reserve_jobs() == []
    check(c)


def test_a_probe_that_leaves_otherwise_lets_another_probe_go():
    from raftq.node.core import gating
    c = gated(queues=BREAKER)
    fail(c)
    fail(c)
    c.advance(5000)
    probe = c.reserve_one()
    assert c.reserve_jobs() == []
    # the lead's release (and delete of an in-flight job) leave through leave_in_flight, NEUTRAL
    m = c.m
    job = m.jobs[probe["id"]]
    q = m.queues["q"]
    gating.leave_in_flight(m, job, q, gating.NEUTRAL)
    from raftq.node.core.handlers import make_ready
    make_ready(m, job, q)
    m._undo.clear()
    assert m.queues["q"].circuit.probe is None and "q" in m.released
    assert len(c.reserve_jobs()) == 1
    check(c)


def test_an_operator_closes_the_circuit_replicated_and_audited():
    c = gated(queues=BREAKER)
    fail(c)
    fail(c)
    assert c.stats()["circuit"]["state"] == "open"
    from raftq.node.base import validate as C
    status, body = c.run(lambda: C.close_circuit("q", c.limits, who="ops"))
    assert (status, body) == (200, {"queue": "q", "circuit": "closed", "was": "open"})
    assert c.stats()["circuit"]["state"] == "closed"
    assert len(c.reserve_jobs(max_jobs=10)) == 1          # the failed job, retried
    entry = c.audit()[0]
    assert (entry["action"], entry["who"], entry["target"]) == ("circuit_close", "ops", "q")
    err(c.run(lambda: C.close_circuit("nope", c.limits)), 404, "not_found")
    check(c)


def test_breaker_config_is_checked_naming_the_key():
    with pytest.raises(ConfigError, match=r"queues\[q\].circuit_breaker.failures"):
        Limits.build(queues=[{"name": "q", "circuit_breaker": {"failures": 0, "window_ms": 1, "open_ms": 1}}])
    with pytest.raises(ConfigError, match=r"queues\[q\].circuit_breaker.open_ms: required"):
        Limits.build(queues=[{"name": "q", "circuit_breaker": {"failures": 1, "window_ms": 1}}])
    with pytest.raises(ConfigError, match=r"limits.circuit_breaker: unknown key"):
        Limits.build(limits={"circuit_breaker": {"failures": 1, "window_ms": 1, "open_ms": 1}})


# ============================================================================ windows

def ms(y, mo, d, h, mi, tz="UTC") -> int:
    return int(datetime(y, mo, d, h, mi, tzinfo=load_zone(tz) if tz != "UTC" else timezone.utc).timestamp() * 1000)


def windowed(windows, now) -> Core:
    c = Core(storage=RETAIN, queues=[{"name": "q", "windows": windows}], now=now)
    c.seed()
    return c


def test_inside_and_outside_a_window_and_its_days():
    # 2026-12-01 is a Tuesday
    w = [{"days": ["mon", "tue"], "start": "09:00", "end": "17:30", "time_zone": "UTC"}]
    c = windowed(w, ms(2026, 12, 1, 8, 59))
    c.enqueue_id("q")
    assert c.stats()["window_open"] is False and c.reserve_jobs() == []
    c.now = ms(2026, 12, 1, 9, 0)
    assert c.stats()["window_open"] is False          # the clock is the replicated one: no command yet
    assert len(c.reserve_jobs()) == 1                 # the reserve's stamp moves it
    assert c.stats()["window_open"] is True
    c.now = ms(2026, 12, 1, 17, 30)
    c.enqueue_id("q")
    assert c.reserve_jobs() == []                      # end is exclusive
    c.now = ms(2026, 12, 2, 10, 0)                     # Wednesday: not a listed day
    assert c.reserve_jobs() == []
    c.now = ms(2026, 12, 7, 10, 0)                     # Monday
    assert len(c.reserve_jobs()) == 1
    check(c)


def test_a_window_spanning_midnight_opens_on_the_listed_day():
    w = [{"days": ["fri"], "start": "22:00", "end": "06:00"}]
    c = windowed(w, ms(2026, 12, 4, 21, 0))            # Friday 21:00
    for _ in range(4):
        c.enqueue_id("q")
    assert c.reserve_jobs() == []
    c.now = ms(2026, 12, 4, 23, 0)
    assert len(c.reserve_jobs()) == 1
    c.now = ms(2026, 12, 5, 5, 59)                     # Saturday early: still Friday's window
    assert len(c.reserve_jobs()) == 1
    c.now = ms(2026, 12, 5, 6, 0)
    assert c.reserve_jobs() == []
    c.now = ms(2026, 12, 5, 23, 0)                     # Saturday night: not a listed day
    assert c.reserve_jobs() == []


def test_a_window_in_a_time_zone_across_dst():
    w = [{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"], "start": "09:00", "end": "10:00",
          "time_zone": "Europe/Berlin"}]
    # winter: Berlin is UTC+1, so 09:00 Berlin is 08:00 UTC
    c = windowed(w, ms(2026, 3, 27, 8, 30, "UTC"))
    c.enqueue_id("q")
    c.enqueue_id("q")
    assert len(c.reserve_jobs()) == 1
    # summer (DST began 2026-03-29): 08:30 UTC is 10:30 Berlin: closed; 07:30 UTC is 09:30: open
    c.now = ms(2026, 3, 30, 8, 30, "UTC")
    assert c.reserve_jobs() == []
    c.now = ms(2026, 3, 31, 7, 30, "UTC")
    assert len(c.reserve_jobs()) == 1
    assert c.now == ms(2026, 3, 31, 9, 30, "Europe/Berlin")


def test_a_deadline_passing_outside_the_window_expires_the_job():
    w = [{"start": "09:00", "end": "10:00"}]
    c = windowed(w, ms(2026, 12, 1, 7, 0))
    jid = c.enqueue_id("q", deadline_at_ms=ms(2026, 12, 1, 8, 0))
    c.now = ms(2026, 12, 1, 8, 1)
    assert c.sweep()["deadlines_expired"] == 1
    assert c.state(jid) == "dead_lettered" and c.dead_letters()[0]["cause"] == "expired"
    c.now = ms(2026, 12, 1, 9, 1)
    assert c.reserve_jobs() == []                      # it never runs


def test_the_sweep_is_due_while_a_gated_queue_waits():
    w = [{"start": "09:00", "end": "10:00"}]
    c = windowed(w, ms(2026, 12, 1, 8, 58, "UTC") + 123)
    c.enqueue_id("q")
    assert c.m.next_due_ms() == ms(2026, 12, 1, 8, 59)     # the next minute
    c2 = gated(queues=BREAKER)
    fail(c2)
    fail(c2)
    assert c2.m.next_due_ms() <= c2.now + 5000


def test_window_config_is_checked_naming_the_key():
    for bad, what in (([{"start": "9:00", "end": "10:00"}], r"windows\[0\].start"),
                      ([{"start": "09:00", "end": "09:00"}], r"windows\[0\]: start equals end"),
                      ([{"days": ["mo"], "start": "09:00", "end": "10:00"}], r"windows\[0\].days"),
                      ([{"start": "09:00", "end": "10:00", "time_zone": "Mars/Olympus"}], r"windows\[0\].time_zone"),
                      ([{"start": "09:00", "end": "10:00", "time_zone": "../../etc/passwd"}], r"windows\[0\].time_zone"),
                      ([], r"queues\[q\].windows")):
        with pytest.raises(ConfigError, match=what):
            Limits.build(queues=[{"name": "q", "windows": bad}])
    ok = Limits.build(queues=[{"name": "q", "windows": [{"start": "22:00", "end": "24:00", "time_zone": "Asia/Tokyo"}]}])
    assert ok.queue("q").describe()["windows"][0]["time_zone"] == "Asia/Tokyo"


def test_zones_come_from_the_tzdata_package_not_the_host(monkeypatch):
    import zoneinfo
    from raftq.node.core import windows
    monkeypatch.setattr(windows, "_zones", {})
    zoneinfo.reset_tzpath(to=[])            # no system zone files at all
    try:
        z = load_zone("America/New_York")
        assert datetime(2026, 7, 1, 12, tzinfo=z).utcoffset().total_seconds() == -4 * 3600
    finally:
        zoneinfo.reset_tzpath()


def test_a_fault_at_any_mutation_of_a_gating_command_reverts_it_whole():
    """Blocking at reserve, unblocking at ack, a breaker opening at nack, the operator's close:
    an exception at the n-th mutation leaves the state exactly as before."""
    from raftq.node.base import validate as C
    c = gated(limits={"resource_limits": {"db": 1}}, queues=BREAKER)
    c.enqueue_id("q", resource="db")
    c.enqueue_id("q", resource="db")
    a = c.enqueue_id("q", resource="db", priority=3)     # reserved first; the other two held back
    steps = [lambda: C.reserve({"queues": ["q"], "lease_ms": 1000, "max_jobs": 5}, c.limits)[0],
             lambda: C.nack(a, {"attempt": 1, "reason": "x"}),
             lambda: C.reserve({"queues": ["q"], "lease_ms": 1000, "max_jobs": 5}, c.limits)[0],
             lambda: C.close_circuit("q", c.limits)]
    for build in steps:
        cmd = build()
        for n in range(200):
            before = c.snapshot_state()
            c.m._fault_after = n
            status, _ = c.apply(cmd)
            c.m._fault_after = None
            if status != 500:
                break
            assert c.snapshot_state() == before, (cmd, n)
            c.m.check_invariants()
        assert status == 200
        c.m.check_invariants()
    assert c.stats()["circuit"]["state"] == "closed" and c.stats()["throttled"] == 2


@pytest.mark.parametrize("seed", range(6))
def test_random_gating_histories_keep_the_invariants_and_replay_alike(seed):
    """Enqueues over a few resources, reserves, acks, nacks, expiries, cancels, purges, limit
    changes and circuit closes at random: the invariants hold after every step, a snapshot
    round trip keeps the digest, and a replay of the log ends in the same state."""
    import random
    from raftq.node.base import validate as C
    rng = random.Random(seed)
    queues = [{"name": "q", "circuit_breaker": {"failures": 3, "window_ms": 2000, "open_ms": 1500},
               "windows": [{"start": "00:00", "end": "24:00"}]}, {"name": "r", "resource": "db"}]
    c = gated(limits={"resource_limits": {"db": 2, "api": 1}, "retry_delay_ms": 0}, queues=queues)
    held: list = []
    for step in range(400):
        c.advance(rng.choice((0, 1, 10, 300)))
        k = rng.random()
        if k < 0.3:
            c.enqueue(rng.choice("qr"), resource=rng.choice(("db", "api", "free", None)),
                      priority=rng.randrange(3), deadline_at_ms=c.now + rng.randrange(1, 5000) if rng.random() < 0.2 else None,
                      max_attempts=rng.randrange(1, 4))
        elif k < 0.5:
            status, body = c.reserve(rng.sample(["q", "r"], 2), lease_ms=rng.choice((200, 5000)),
                                     max_jobs=rng.randrange(1, 4))
            held += [(j["id"], j["attempt"]) for j in body.get("jobs", [])]
        elif k < 0.62 and held:
            c.ack(*held.pop(rng.randrange(len(held))))
        elif k < 0.72 and held:
            jid, att = held.pop(rng.randrange(len(held)))
            c.nack(jid, att, retry={"strategy": rng.choice(("default", "dead_letter"))})
        elif k < 0.8:
            c.sweep()
        elif k < 0.84 and c.m.jobs:
            c.cancel(rng.choice(sorted(c.m.jobs)))
        elif k < 0.86:
            c.purge(rng.choice("qr"))
        elif k < 0.9:
            c.configure(limits={"resource_limits": {"db": rng.randrange(0, 4), "api": rng.randrange(0, 3)},
                                "retry_delay_ms": 0}, queues=queues)
        elif k < 0.92:
            c.run(lambda: C.close_circuit("q", c.limits))
        c.m.check_invariants()
        if step % 50 == 0:
            check(c)
    check(c)
    # the history did exercise the gating
    assert c.m.queues["q"].deferred + c.m.queues["r"].deferred > 0
    assert c.m.queues["q"].circuit is not None and c.m.queues["q"].circuit.opened_total > 0
    fresh = PlainMachine(Limits.build(limits={"resource_limits": {"db": 2, "api": 1}, "retry_delay_ms": 0},
                                      storage=RETAIN, queues=queues))
    for now, cmd in c.log:
        fresh.apply(now, cmd)
    assert fresh.digest() == c.m.digest()
    fresh.check_invariants()


# ---------------------------------------------------------------------------- leaving READY keeps the queue live
@pytest.mark.parametrize("to", ["ready", "scheduled"])
def test_a_replaced_held_back_job_is_handed_out_when_a_slot_frees(to):
    """docs/api.md "Gating" (throttles): a held-back job stays ready and is reservable when a slot
    frees; a replace (docs/api.md duplicate_policy) of it must not leave its held-back mark."""
    c = gated(limits={"resource_limits": {"db": 2}})
    running = [c.enqueue_id("q", resource="db") for _ in range(2)]
    assert len(c.reserve_jobs(max_jobs=2)) == 2
    held = c.enqueue_id("q", resource="db", idempotency_key="k")
    assert c.reserve_jobs() == [] and c.stats()["throttled"] == 1
    later = {"scheduled_at_ms": T0 + 1000} if to == "scheduled" else {}
    status, body = c.enqueue("q", resource="db", idempotency_key="k", duplicate_policy="replace",
                             payload=payload(b"new"), **later)
    assert status == 200 and body["replaced"] is True and body["job_id"] == held
    c.m.check_invariants()
    assert c.stats()["throttled"] == 0
    for job_id in running:
        assert c.ack(job_id, 1)[0] == 200
    c.advance(1000)
    c.sweep()
    got = c.reserve_jobs(max_jobs=5)
    assert ids(got) == [held] and got[0]["attempt"] == 1
    other = c.enqueue_id("q")                         # the queue serves others as well
    assert ids(c.reserve_jobs(max_jobs=5)) == [other]
    check(c)


@pytest.mark.parametrize("how", ["cancel", "move", "deadline", "replace_later", "reserve_past_deadline"])
def test_a_released_job_that_leaves_otherwise_passes_its_slot_on(how):
    """A slot frees and hands one held-back job back to ready; if that job then leaves READY
    without being reserved (cancelled, moved, expired, replaced into the future), the next
    held-back job gets the slot: the queue never waits on a slot nobody holds."""
    c = gated(limits={"resource_limits": {"db": 1}})
    holder = c.enqueue_id("q", resource="db")
    first = c.enqueue_id("q", resource="db", idempotency_key="k", deadline_at_ms=T0 + 500)
    second = c.enqueue_id("q", resource="db")
    assert ids(c.reserve_jobs(max_jobs=5)) == [holder] and c.stats()["throttled"] == 2
    assert c.ack(holder, 1)[0] == 200               # `first` goes back to ready, `second` stays held
    assert c.stats()["throttled"] == 1
    if how == "cancel":
        assert c.cancel(first)[0] == 200
    elif how == "move":
        assert c.move("q", [first])[0] == 200
    elif how == "deadline":
        c.advance(600)
        assert c.sweep()["deadlines_expired"] == 1
    elif how == "replace_later":
        status, body = c.enqueue("q", resource="db", idempotency_key="k", duplicate_policy="replace",
                                 scheduled_at_ms=T0 + 60_000)
        assert status == 200 and body["replaced"] is True
    else:
        c.advance(600)                               # reserve meets `first` past its deadline
    c.m.check_invariants()
    assert c.stats()["throttled"] == (1 if how == "reserve_past_deadline" else 0)
    assert ids(c.reserve_jobs(max_jobs=5)) == [second]      # (the same reserve, past the expired one)
    assert c.state(first) in (None, "dead_lettered", "scheduled") and c.stats()["throttled"] == 0
    check(c)
