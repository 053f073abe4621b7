"""Keys (docs/semantics.md "Keys"): per-key concurrency and rates, a queue-wide rate, fair
queueing across keys, and how they meet throttles, priorities, breakers, windows, pause, release,
purge, schedules, snapshots and configuration changes. On the pure core (tests/helpers_core.py)."""
from __future__ import annotations

import pickle

import pytest

from raftq.node.core import keys as K
from raftq.node.core import ops
from raftq.node.core.machine import QueueMachine as PlainMachine

from helpers_core import T0, Core


def keyed(**q) -> Core:
    c = Core(queues=[{"name": "q", **q}], storage={"dead_letter_retention_ms": 60_000})
    c.m.check_invariants()
    return c


def put(c: Core, *names, queue="q", **fields) -> list[str]:
    ids = []
    for name in names:
        body = dict(fields)
        if name is not None:
            body["key"] = name
        ids.append(c.enqueue_id(queue, **body))
    c.m.check_invariants()
    return ids


def take(c: Core, n: int = 100, queues=("q",), lease_ms: int = 30_000) -> list[dict]:
    jobs = c.reserve_jobs(queues, lease_ms, n)
    c.m.check_invariants()
    return jobs


def keys_of(jobs) -> list:
    return [j.get("key") for j in jobs]


# ---------------------------------------------------------------------------- the key itself
def test_a_job_shows_its_key_and_a_job_without_one_shows_none():
    c = keyed()
    a, b = put(c, "acme", None)
    assert c.view(a)["key"] == "acme" and "key" not in c.view(b)
    assert keys_of(take(c)) == ["acme", None]


def refusal(answer) -> str:
    """The message of a job refused as invalid_request (422 rejected, as for every job field)."""
    status, body = answer
    assert status == 422 and body["error"]["rejection"]["reason"] == "invalid_request", body
    return body["error"]["rejection"]["message"]


@pytest.mark.parametrize("bad", ["", "x" * 257, "a\nb", 5, True, ["a"]])
def test_an_unusable_key_is_refused_and_nothing_changes(bad):
    c = keyed()
    before = c.m.digest()
    assert "key" in refusal(c.enqueue(key=bad))
    assert c.m.digest() == before


def test_the_key_may_come_from_the_custom_field_the_queue_names_and_an_explicit_key_wins():
    c = keyed(key_field="tenant")
    a = c.enqueue_id(custom={"tenant": "acme", "other": 1})
    b = c.enqueue_id(custom={"tenant": "acme"}, key="given")
    d = c.enqueue_id(custom={"other": "x"})                 # no such field: no key
    assert (c.view(a)["key"], c.view(b)["key"], c.view(d).get("key")) == ("acme", "given", None)
    assert "tenant" in refusal(c.enqueue(custom={"tenant": 7}))


def test_max_key_bytes_bounds_the_key():
    c = Core(limits={"max_key_bytes": 4}, queues=[{"name": "q"}])
    assert c.enqueue(key="abcd")[0] == 200
    assert "max_key_bytes" in refusal(c.enqueue(key="abcde"))


# ---------------------------------------------------------------------------- concurrency per key
def test_concurrency_per_key_skips_a_full_key_and_takes_the_next_eligible_job_without_an_attempt():
    c = keyed(key_concurrency=1)
    a1, a2, b1 = put(c, "a", "a", "b")
    got = take(c)
    assert [j["id"] for j in got] == [a1, b1]
    assert c.state(a2) == "ready" and c.view(a2)["attempt"] == 1
    s = c.stats()
    assert (s["keys"], s["keys_at_limit"], s["ready_held_by_keys"]) == (2, 2, 1)
    assert take(c) == []                      # a held key costs a reserve nothing: no job, no change


@pytest.mark.parametrize("how", ["ack", "nack", "nack_dead", "release", "cancel", "lease_expiry"])
def test_a_slot_frees_in_the_same_apply_as_the_job_leaves_in_flight(how):
    c = keyed(key_concurrency=1)
    a1, a2 = put(c, "a", "a")
    j = take(c, lease_ms=1000)[0]
    assert take(c) == []
    if how == "ack":
        c.ack(a1, 1)
    elif how == "nack":
        c.nack(a1, 1, retry={"strategy": "delay", "delay_ms": 60_000})
    elif how == "nack_dead":
        c.nack(a1, 1, retry={"strategy": "dead_letter"})
    elif how == "release":
        c.release(a1, 1, delay_ms=60_000)
    elif how == "cancel":
        assert c.apply(ops.cancel(None, a1, None, True))[0] == 200
    else:
        c.advance(1000)
        c.sweep()                               # a1 is ready again (attempt 2), in its place
    c.m.check_invariants()
    assert j["id"] == a1 and [x["id"] for x in take(c, 1)] == [a1 if how == "lease_expiry" else a2]


def test_a_key_limit_of_zero_holds_every_job_of_the_key_and_an_override_beats_the_queue_limit():
    c = keyed(key_concurrency=2, key_limits={"stopped": {"concurrency": 0}, "big": {"concurrency": 3}})
    put(c, "stopped", "big", "big", "big", "big", "x", "x", "x")
    got = keys_of(take(c))
    assert got.count("stopped") == 0 and got.count("big") == 3 and got.count("x") == 2
    assert c.m.key_page("q", 10, None)[0][0]["key"] == "big"


# ---------------------------------------------------------------------------- rates
def test_a_key_rate_admits_a_burst_of_count_then_one_more_as_each_leaves_the_window():
    c = keyed(key_rate={"count": 2, "period_ms": 1000})
    put(c, *["a"] * 5)
    assert len(take(c)) == 2
    assert c.stats()["keys_at_limit"] == 1 and c.m.next_due_ms() == T0 + 1000
    c.advance(999)
    assert take(c) == []
    c.advance(1)
    assert len(take(c)) == 2                    # both of the first burst left the window at T0+1000
    c.advance(500)
    assert take(c) == []


def test_hand_outs_never_exceed_the_rate_in_any_window_whatever_the_timing():
    c = keyed(key_rate={"count": 3, "period_ms": 1000})
    put(c, *["a"] * 40)
    times = []
    for step in [0, 100, 250, 400, 999, 1, 333, 667, 1000, 50, 950, 2] * 3:
        c.advance(step)
        if step % 2:
            c.sweep()
        times += [c.now] * len(take(c, 2))
    assert len(times) >= 20
    assert all(b - a >= 1000 for a, b in zip(times, times[3:])), times


def test_a_rate_held_key_comes_back_through_the_sweep_timer_and_wakes_its_queue():
    c = keyed(key_rate={"count": 1, "period_ms": 5000})
    put(c, "a", "a")
    take(c)
    c.advance(5000)
    c.m.released.clear()
    assert c.sweep()["key_timers_fired"] == 1
    assert "q" in c.m.released and c.stats()["keys_at_limit"] == 0
    assert c.m.reservable(c.m.queues["q"])


def test_a_queue_wide_rate_counts_every_hand_out_of_the_queue_keyed_or_not():
    c = keyed(rate={"count": 3, "period_ms": 1000})
    put(c, "a", "b", None, None, "c")
    assert len(take(c)) == 3
    assert not c.m.reservable(c.m.queues["q"]) and c.m.next_due_ms() == T0 + 1000
    c.advance(1000)
    assert len(take(c)) == 2


def test_release_frees_the_slot_but_refunds_no_rate_token():
    c = keyed(key_concurrency=1, key_rate={"count": 1, "period_ms": 10_000})
    a1, _ = put(c, "a", "a")
    take(c)
    c.release(a1, 1)
    c.m.check_invariants()
    assert take(c) == []                      # the slot is free, the window is not
    c.advance(10_000)
    assert [j["id"] for j in take(c)] == [a1]     # released: back in its place, attempt + 1
    assert c.view(a1)["attempt"] == 2 and c.view(a1)["releases"] == 1


# ---------------------------------------------------------------------------- fairness
def test_keys_are_served_round_robin_within_a_level_and_fifo_within_a_key():
    c = keyed()
    big = put(c, *["big"] * 6)
    small = put(c, "x", "y", "z")
    got = take(c)
    assert keys_of(got)[:6] == ["big", "x", "y", "z", "big", "big"]
    assert [j["id"] for j in got if j["key"] == "big"] == big


def test_a_key_with_a_deep_backlog_delays_another_by_one_job_per_key_in_turn():
    c = keyed()
    put(c, *["big"] * 500)
    late = put(c, *["k%d" % i for i in range(9) for _ in range(3)])
    order = [j["id"] for j in take(c, 40)]
    assert set(late) <= set(order[:30])         # 10 keys: each round one job of each


def test_priorities_go_first_across_keys_and_each_level_has_its_own_rotation():
    c = keyed()
    put(c, "a", "a", "b", priority=1)
    hi = put(c, "c", "c", priority=5)
    got = take(c)
    assert [j["id"] for j in got[:2]] == hi and keys_of(got[2:]) == ["a", "b", "a"]


def test_a_key_that_comes_back_starts_at_the_levels_virtual_time_not_with_saved_turns():
    c = keyed()
    put(c, "a")
    take(c)                                     # a served once, then idle and gone
    put(c, *["b"] * 4)
    take(c, 2)                                  # b twice: b is ahead
    put(c, "a", "a", "a")
    assert keys_of(take(c, 4)) == ["a", "b", "a", "b"]


def test_weights_serve_a_key_in_proportion():
    c = keyed(key_weights={"heavy": 3})
    put(c, *["heavy"] * 9)
    put(c, *["light"] * 9)
    got = keys_of(take(c, 8))
    assert got.count("heavy") == 6 and got.count("light") == 2


def test_jobs_without_a_key_take_part_as_one_more_key():
    c = keyed()
    put(c, None, None, None, None)
    put(c, "a", "b")
    assert keys_of(take(c)) == [None, "a", "b", None, None, None]


def test_no_key_is_served_twice_in_a_row_while_another_has_a_ready_job_even_after_its_head_left():
    c = keyed()
    a = put(c, "a", "a", "a")
    b = put(c, "b", "b", "b", priority=0)
    put(c, "b", priority=3)
    assert keys_of(take(c, 2)) == ["b", "a"]     # b's priority-3 job first
    c.cancel(b[0])                              # b's head at level 0 leaves: its entry is stale
    c.m.check_invariants()
    got = keys_of(take(c, 4))
    assert all(x != y for x, y in zip(got, got[1:])), got


def test_jobs_without_a_key_served_at_one_level_leave_another_levels_turn_order_alone():
    """Found by tests/test_core_gating_model.py: a job without a key handed out at one level,
    whose next job is at another, moved that other level's virtual time (the level was read
    after the queue's own index had moved), so a key there was served twice in a row."""
    c = keyed()
    put(c, "a", "a", "a")
    put(c, None, None)
    assert keys_of(take(c, 1)) == ["a"]            # level 0: a; the jobs without a key are next there
    put(c, None, None, priority=1)
    assert keys_of(take(c, 2)) == [None, None]     # level -1, then the index's next job is at level 0
    put(c, None, priority=1)
    assert keys_of(take(c, 1)) == [None]
    assert keys_of(take(c, 2)) == [None, "a"]      # level 0: not a twice in a row
    assert c.m.queues["q"].keys.vtimes[-1] == 2 * K.WEIGHT_SCALE


# ---------------------------------------------------------------------------- bounds: key state exists only while needed
def test_key_state_goes_with_the_last_job_and_a_queue_without_keyed_jobs_is_plain_again():
    c = keyed(key_concurrency=1)
    ids = put(c, *("k%d" % i for i in range(50)))
    for j in take(c):
        c.ack(j["id"], 1)
    c.m.check_invariants()
    assert c.m.queues["q"].keys is None and c.stats()["keys"] == 0
    assert all(c.state(i) is None for i in ids)


def test_a_drained_key_with_a_rate_is_kept_until_its_window_passes_then_dropped_by_the_sweep():
    c = keyed(key_rate={"count": 5, "period_ms": 2000})
    for i in range(200):
        put(c, "once-%d" % i)
    for j in take(c, 256):
        c.ack(j["id"], 1)
    assert c.stats()["keys"] == 200
    c.advance(2000)
    assert c.sweep()["key_timers_fired"] == 200
    c.m.check_invariants()
    assert c.m.queues["q"].keys is None and c.m.key_timers == []


def test_held_keys_are_out_of_the_rotation_so_reserve_never_looks_at_them():
    c = keyed(key_concurrency=1)
    put(c, *["a"] * 100)
    put(c, *["b"] * 100)
    take(c)
    qk = c.m.queues["q"].keys
    live = [e for e in qk.sched if e[4].turn == e[3]]
    assert live == [] and qk.held_keys == 2 and qk.held_ready == 198


# ---------------------------------------------------------------------------- how keys meet the rest
def test_a_keyed_job_whose_resource_is_full_waits_in_the_resource_and_comes_back_to_its_key():
    c = Core(limits={"resource_limits": {"db": 1}}, queues=[{"name": "q", "key_concurrency": 5}])
    put(c, "a", "a", resource="db")
    put(c, "b")
    got = take(c)
    assert keys_of(got) == ["a", "b"] and c.stats()["throttled"] == 1
    c.ack(got[0]["id"], 1)
    c.m.check_invariants()
    assert keys_of(take(c)) == ["a"]


def test_a_paused_queue_an_open_circuit_and_a_closed_window_hold_keyed_jobs_too():
    c = Core(queues=[{"name": "q", "key_concurrency": 1,
                      "circuit_breaker": {"failures": 1, "window_ms": 10_000, "open_ms": 5000}}])
    a1, a2, b1 = put(c, "a", "a", "b")
    c.pause("q")
    assert take(c) == []
    c.resume("q")
    j = take(c, 1)[0]
    c.nack(j["id"], 1, retry={"strategy": "dead_letter"})     # one failure opens the circuit
    assert take(c) == []
    c.advance(5000)
    assert len(take(c)) == 1                    # half open: one probe, of a key with a free slot
    c.m.check_invariants()


def test_a_lowered_limit_revokes_no_lease_and_a_raised_one_frees_held_keys_at_once():
    c = keyed(key_concurrency=2)
    put(c, *["a"] * 5)
    assert len(take(c)) == 2
    assert c.configure(queues=[{"name": "q", "key_concurrency": 1}])[0] == 200
    c.m.check_invariants()
    assert take(c) == [] and c.stats()["in_flight"] == 2
    assert c.configure(queues=[{"name": "q", "key_concurrency": 4}])[0] == 200
    assert "q" in c.m.released
    c.m.check_invariants()
    assert len(take(c)) == 2
    assert c.configure(queues=[{"name": "q"}])[0] == 200        # no limit at all
    assert len(take(c)) == 1


def test_purge_moves_and_deadlines_keep_the_keys_counts():
    c = keyed(key_concurrency=1)
    a = put(c, "a", "a", "a")
    b = put(c, "b", "b", deadline_at_ms=T0 + 1000)
    take(c)
    c.move("q", [a[1]])
    c.advance(1000)
    c.sweep()                                   # b[1] expires while ready
    c.m.check_invariants()
    c.purge("q")
    c.m.check_invariants()
    assert c.stats()["ready"] == 0 and c.stats()["keys"] == 2      # in flight: a[0] and b[0]
    c.ack(a[0], 1)
    c.ack(b[0], 1)
    c.m.check_invariants()
    assert c.m.queues["q"].keys is None


def test_a_replaced_job_keeps_its_key_and_place_in_its_key():
    c = keyed()
    a = c.enqueue_id(key="a", idempotency_key="i", duplicate_policy="replace")
    put(c, "a")
    assert c.enqueue(key="a", idempotency_key="i", duplicate_policy="replace", priority=3)[0] == 200
    c.m.check_invariants()
    assert [j["id"] for j in take(c, 1)] == [a]


def test_a_schedule_template_carries_its_key_to_every_tick():
    c = keyed(key_concurrency=1)
    c.seed()
    assert c.put_schedule("s", every_ms=1000, job={"queue": "q", "job_type": "t", "key": "tenant-1"})[0] == 200
    c.advance(1000)
    c.sweep()
    c.advance(1000)
    c.sweep()
    c.m.check_invariants()
    got = take(c)
    assert keys_of(got) == ["tenant-1"]         # the second tick's job waits for the key's slot
    assert c.schedule("s")["job"]["key"] == "tenant-1"


# ---------------------------------------------------------------------------- state: snapshots, digests, reverts
def test_a_snapshot_and_a_pickle_restore_the_rotation_exactly():
    c = keyed(key_concurrency=2, key_rate={"count": 3, "period_ms": 1000}, key_weights={"w": 2})
    put(c, *["a", "b", "w", None] * 6)
    take(c, 9)
    restored = PlainMachine.from_builtins(c.limits, c.m.to_builtins())
    restored.check_invariants()
    assert restored.digest() == c.m.digest()
    copy = pickle.loads(pickle.dumps(c.m))
    # the same next choices on the restored machine as on the original
    for now in (T0, T0 + 1000, T0 + 2500):
        cmd = ops.reserve(None, ("q",), 30_000, 4)
        assert restored.apply(now, cmd) == PlainMachine.apply(c.m, now, cmd) == PlainMachine.apply(copy, now, cmd)
        restored.check_invariants()
    assert restored.digest() == c.m.digest() == copy.digest()


def test_a_state_without_keys_snapshots_and_hashes_as_before():
    c = Core()
    put(c, None, None)
    data = c.m.to_builtins()
    assert "keys" not in data
    assert all(len(t) == 22 for t in data["jobs"])


@pytest.mark.parametrize("n", range(0, 60, 3))
def test_a_keyed_reserve_that_fails_midway_leaves_the_state_as_it_was(n):
    c = keyed(key_concurrency=1, key_rate={"count": 2, "period_ms": 1000})
    put(c, "a", "a", "b", None, "c", "c")
    before = c.m.digest()
    c.m._fault_after = n
    r = PlainMachine.apply(c.m, c.now, ops.reserve(None, ("q",), 30_000, 10))
    c.m._fault_after = None
    if r[0] == ops.RESERVED:
        assert len(r[1]) == 4                  # no fault hit: the whole reserve applied
    else:
        assert c.m.digest() == before
    c.m.check_invariants()


def test_the_ready_listing_shows_keyed_jobs_in_priority_and_enqueue_order():
    c = keyed(key_concurrency=1)
    ids = put(c, "a", None, "b", "a")
    hi = put(c, "c", priority=4)
    take(c, 1)                                  # hi
    rows, _ = c.m.list_jobs("q", 0, 10, None)
    assert [r["id"] for r in rows] == ids and hi[0] not in [r["id"] for r in rows]
    assert c.purge("q")[1]["purged"] == 4
    c.m.check_invariants()
