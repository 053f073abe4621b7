"""Schedules (docs/semantics.md "Schedules"): cron and interval jobs as replicated state.

A schedule is created, replaced, paused, resumed, triggered and deleted by commands, and its
ticks fire inside the sweep (node/core/sweep.py), on the replicated clock: a tick is due when
the clock has reached it, and firing it is part of the sweep that the apply decides. A tick's
job gets an id and an idempotency key derived from (schedule, incarnation, tick), and the
schedule's `next_fire` moves past every tick a sweep handled, so a replay, a second leader's
sweep or a restarted cluster never fires a tick twice; ticks are dropped only as the catch-up
and overlap policies say.

The definition (`Schedule.definition`) is a dict of builtins that node/base/validate.py built and
checked (`DEFINITION_KEYS`); the apply checks it again where a wrong value could make it raise
or fire wrongly, and parses the cron rule (node/core/cron.py, pure: time zones from tzdata).
"""
from __future__ import annotations

import uuid

from . import cron
from . import audit, gating, ops
from .answers import render_template
from .handlers import _enqueue_one, _replaceable, forget
from .jobs import IN_FLIGHT, READY, SCHEDULED, STATE_NAMES, TIMER_AT

# The policies (docs/semantics.md "Schedules").
CATCHUP_POLICIES = ("skip", "one", "all")
OVERLAP_POLICIES = ("allow", "skip", "replace")
DEFINITION_KEYS = ("cron", "time_zone", "every_ms", "start_at_ms", "end_at_ms", "max_count",
                   "catchup", "catchup_window_ms", "misfire_after_ms", "overlap", "paused", "job")
# The job template (what check_job made of the request's `job`, without the per-job fields).
TEMPLATE_KEYS = ("queue", "job_type", "payload", "encoding", "priority", "max_attempts", "custom",
                 "timeout_ms", "resource", "deadline_after_ms")      # and "key" when the jobs have one
# The custom fields every tick's job carries, so its worker knows what it runs for.
SCHEDULE_FIELD, TICK_FIELD = "raftq.schedule", "raftq.tick_ms"
# Ticks enumerated per schedule and sweep at most (on time, or the latest missed one's search).
MAX_TICKS_SCANNED = 10_000
_ID_NAMESPACE = uuid.UUID("0d6c1f6e-2b8a-4f4e-9a57-3c9e1d2b7f31")


class Schedule:
    """One schedule's state. `rule` is derived (node/core/cron.py), not state: rebuilt at restore."""
    __slots__ = ("name", "definition", "version", "incarnation", "created_at", "updated_at",
                 "anchor", "paused", "next_fire", "stamp", "fired", "skipped", "handled_to",
                 "last_tick", "last_fired_at", "last_job_id", "last_error", "rule")
    FIELDS = __slots__[:-1]             # all but `rule`: the state, in snapshot order

    def to_tuple(self) -> tuple:
        return tuple(getattr(self, f) for f in self.FIELDS)

    @classmethod
    def from_tuple(cls, t) -> "Schedule":
        s = cls()
        for f, v in zip(cls.FIELDS, t):
            setattr(s, f, v)
        s.rule = rule_of(s.definition, s.anchor)
        return s


def rule_of(d: dict, anchor: int):
    """The cron rule or the interval of a definition; CronError if it has neither that works."""
    if d["cron"] is not None:
        return cron.parse(d["cron"], d["time_zone"])
    return cron.Every(anchor, d["every_ms"])


def anchor_of(d: dict, created_at: int) -> int:
    """An interval fires at anchor + k * every_ms, k >= 1: from its start time on, the first fire
    at start_at_ms itself; without one, one interval after its creation."""
    if d["every_ms"] is not None and d["start_at_ms"] is not None:
        return d["start_at_ms"] - d["every_ms"]
    return created_at


def job_id_of(name: str, incarnation: int, tick: int) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, f"{name}/{incarnation}/{tick}"))


def idempotency_key_of(name: str, tick: int) -> str:
    """A user who enqueues this tick's job himself (same queue, same key) deduplicates with it."""
    return f"schedule:{name}:{tick}"


# ---------------------------------------------------------------------------- ticks
def next_tick(s, after: int) -> int | None:
    """The first tick strictly after `after` within the start, end and count, or None."""
    d = s.definition
    if d["max_count"] is not None and s.fired >= d["max_count"]:
        return None
    if d["start_at_ms"] is not None and after < d["start_at_ms"] - 1:
        after = d["start_at_ms"] - 1
    t = s.rule.next_fire(after)
    if t is None or (d["end_at_ms"] is not None and t > d["end_at_ms"]):
        return None
    return t


def ticks_in(s, after: int, upto: int, limit: int) -> list[int]:
    """Up to `limit` ticks in (after, upto], in order."""
    out: list[int] = []
    while len(out) < limit:
        t = next_tick(s, after)
        if t is None or t > upto:
            break
        out.append(t)
        after = t
    return out


def latest_tick(s, after: int, upto: int) -> int | None:
    """The last tick in (after, upto]: searched back from `upto` in windows that double (an hour
    first), so a long outage costs a few windows, not one step per tick missed."""
    window = 3_600_000
    while True:
        lo = max(after, upto - window)
        found = ticks_in(s, lo, upto, MAX_TICKS_SCANNED)
        while len(found) == MAX_TICKS_SCANNED:          # a dense rule: go on to the window's end
            more = ticks_in(s, found[-1], upto, MAX_TICKS_SCANNED)
            found = more or found[-1:]
            if len(more) < MAX_TICKS_SCANNED:
                break
        if found:
            return found[-1]
        if lo == after:
            return None
        window *= 2


def due_ticks(m, s, now: int) -> list[int]:
    """The ticks a sweep at `now` fires for s (whose next_fire <= now), oldest first: those late
    by at most misfire_after_ms always; of the missed ones (later than that) none (`skip`), the
    latest (`one`) or those within catchup_window_ms, oldest first, at most max_catchup_ticks
    (`all`)."""
    d = s.definition
    first, cutoff = s.next_fire, now - d["misfire_after_ms"]
    on_time = ticks_in(s, max(first, cutoff) - 1, now, MAX_TICKS_SCANNED)
    if first >= cutoff:
        return on_time
    policy, missed = d["catchup"], []
    if policy == "one":
        t = latest_tick(s, first - 1, cutoff - 1)
        missed = [t] if t is not None else []
    elif policy == "all":
        start = max(first, now - d["catchup_window_ms"])
        if start < cutoff:
            missed = ticks_in(s, start - 1, cutoff - 1, m.limits.max_catchup_ticks)
    return missed + on_time


def fire_due(m, now: int, budget: int) -> int:
    """The sweep's step: every schedule whose next tick is due fires its due ticks (at most
    `budget` schedules per sweep, the rest in the next); returns the ticks fired."""
    heap, schedules, handled, fired = m.tick_heap, m.schedules, 0, 0
    while heap and heap[0][TIMER_AT] <= now and handled < budget:
        due, stamp, name = m._heappop(heap)
        s = schedules.get(name)
        if s is None or s.stamp != stamp or s.paused or s.next_fire != due:
            continue                                    # stale: changed, paused or deleted since
        handled += 1
        for tick in due_ticks(m, s, now):
            if s.definition["max_count"] is not None and s.fired >= s.definition["max_count"]:
                break
            fired += fire_tick(m, s, tick)
        m._set(s, "handled_to", now)         # every tick up to now is decided: none fires again
        plan(m, s, next_tick(s, now))
    return fired


def fire_tick(m, s, tick: int) -> int:
    """One tick: its job, unless the overlap policy skips it. 1 if a job was made (or found by
    its idempotency key), else 0 (skipped, or refused: `last_error` says why)."""
    d = s.definition
    prev = m.jobs.get(s.last_job_id) if s.last_job_id is not None else None
    if prev is not None and d["overlap"] == "skip" and prev.state in (READY, SCHEDULED, IN_FLIGHT):
        m._set(s, "skipped", s.skipped + 1)
        return 0
    if prev is not None and d["overlap"] == "replace" and _replaceable(prev):
        gating.leave_waiting(m, m.queues[prev.queue], prev)
        forget(m, prev)
    job_id = job_id_of(s.name, s.incarnation, tick)
    made = enqueue_template(m, s, job_id, tick, idempotency_key_of(s.name, tick))
    if made is None:
        return 0
    m._set(s, "fired", s.fired + 1)
    m._set(s, "last_tick", tick)
    m._set(s, "last_fired_at", m.clock)
    return 1


def enqueue_template(m, s, job_id: str, tick: int, idem_key) -> str | None:
    """The template's job (ready now): its id (a new one, or the job its idempotency key names),
    or None when refused (`last_error` says why: unknown_queue, queue_full, id_in_use)."""
    t = s.definition["job"]
    queue = t["queue"]
    if m.limits.strict_queues and queue not in m.limits.queues:
        m._set(s, "last_error", "unknown_queue")
        return None
    if job_id in m.jobs:            # only a trigger's id from outside can collide
        m._set(s, "last_error", "id_in_use")
        return None
    custom = dict(t["custom"] or {})
    custom[SCHEDULE_FIELD], custom[TICK_FIELD] = s.name, tick
    after = t["deadline_after_ms"]
    item = ops.item(job_id, queue, t["job_type"], t["payload"], t["encoding"], t["priority"],
                    t["max_attempts"], custom, None, None, tick + after if after is not None else None,
                    idem_key, t["timeout_ms"], ops.RETURN_EXISTING, t["resource"], t.get("key"))
    r = _enqueue_one(m, item, m.clock, True)
    if type(r) is dict:
        m._set(s, "last_error", r["reason"])
        return None
    made = r if type(r) is str else r[1]            # a str: made; a tuple: ENQUEUED, found by its key
    m._set(s, "last_job_id", made)
    m._set(s, "last_error", None)
    return made


def plan(m, s, next_fire) -> None:
    """Set s's next tick and give it a fresh heap entry (older entries go stale by their stamp)."""
    m._set(s, "next_fire", next_fire)
    if next_fire is not None and not s.paused:
        stamp = m._new_ctr()
        m._set(s, "stamp", stamp)
        m._push(m.tick_heap, (next_fire, stamp, s.name))


def next_due_ms(m) -> int | None:
    return m.tick_heap[0][TIMER_AT] if m.tick_heap else None


# ---------------------------------------------------------------------------- commands
def put_schedule(m, name: str, definition: dict, expect_version, who=ops.UNAUDITED):
    """Create or replace a schedule. expect_version: None (either), 0 (create only), n (replace
    version n only). Its next tick is the first after now: a replace never catches up."""
    if type(name) is not str or type(definition) is not dict:
        raise TypeError("schedule name or definition")
    s = m.schedules.get(name)
    have = s.version if s is not None else 0
    if expect_version is not None and expect_version != have:
        return ops.schedule_conflict(name, have, expect_version)
    if s is None and len(m.schedules) >= m.limits.max_schedules:
        return ops.schedule_refused("too_many", name, m.limits.max_schedules)
    if m.limits.strict_queues and definition["job"]["queue"] not in m.limits.queues:
        return ops.schedule_invalid("job", "unknown_queue")     # the field node/base/validate_schedule.py names
    created_at = s.created_at if s is not None else m.clock
    anchor = anchor_of(definition, created_at)
    try:
        rule = rule_of(definition, anchor)
    except cron.CronError as e:
        return ops.schedule_invalid("cron" if definition["cron"] is not None else "every_ms", str(e))
    if s is None:
        s = Schedule()
        for f in Schedule.__slots__:
            setattr(s, f, None)
        s.name, s.version, s.incarnation, s.created_at = name, 0, m._new_ctr(), created_at
        s.fired = s.skipped = 0
        m._put(m.schedules, name, s)
    for f, v in (("definition", definition), ("anchor", anchor), ("rule", rule), ("version", have + 1),
                 ("updated_at", m.clock), ("paused", bool(definition["paused"])), ("last_error", None)):
        m._set(s, f, v)
    plan(m, s, next_tick(s, m.clock))
    audit.record(m, who, "schedule_create" if have == 0 else "schedule_replace", name,
                 {"version": have + 1, "next_fire_at_ms": s.next_fire})
    return ops.schedule_saved(name, have + 1, have == 0, None if s.paused else s.next_fire)


def delete_schedule(m, name: str, expect_version, who=ops.UNAUDITED):
    s = m.schedules.get(name)
    if s is None:
        return ops.schedule_not_found(name)
    if expect_version is not None and expect_version != s.version:
        return ops.schedule_conflict(name, s.version, expect_version)
    m._pop(m.schedules, name)               # its heap entry goes stale with it
    audit.record(m, who, "schedule_delete", name, {"version": s.version, "fired": s.fired})
    return ops.schedule_deleted(name)


def pause_schedule(m, name: str, paused: bool, who=ops.UNAUDITED):
    """Paused, a schedule fires nothing; resumed, its next tick is the first after now (the
    ticks of the pause are not caught up)."""
    if type(paused) is not bool:
        raise TypeError("paused")
    s = m.schedules.get(name)
    if s is None:
        return ops.schedule_not_found(name)
    if s.paused != paused:
        m._set(s, "paused", paused)
        m._set(s, "version", s.version + 1)
        m._set(s, "updated_at", m.clock)
        plan(m, s, next_tick(s, m.clock))
        audit.record(m, who, "schedule_pause" if paused else "schedule_resume", name, {"version": s.version})
    return ops.schedule_paused(name, paused, s.version)


def trigger_schedule(m, name: str, job_id: str, who=ops.UNAUDITED):
    """An extra run now, outside the ticks (no overlap policy, no count): the job is the
    template's, with the current clock as its tick field."""
    if type(job_id) is not str:
        raise TypeError("job_id")
    s = m.schedules.get(name)
    if s is None:
        return ops.schedule_not_found(name)
    before = s.last_error
    made = enqueue_template(m, s, job_id, m.clock, None)
    if made is None:                    # refused: the schedule stays as it was (its last_error too)
        why = s.last_error
        m._set(s, "last_error", before)
        return ops.rejected({"reason": why, "queue": s.definition["job"]["queue"]})
    audit.record(m, who, "schedule_trigger", name, {"job_id": made})
    return ops.schedule_triggered(name, made)


def seed_schedules(m, definitions):
    """The [[schedules]] of the first leader's TOML (docs/configuration.md): applied once per
    cluster, like the configuration's seed. Each one that does not exist is created; later
    seeds (another leader, a restart, a changed TOML) change nothing."""
    if m.schedules_seeded:
        return ops.schedules_seeded(())
    created = []
    for name, definition in definitions:
        if name not in m.schedules and put_schedule(m, name, definition, 0, None)[0] == ops.SCHEDULE_SAVED:
            created.append(name)
    m._set(m, "schedules_seeded", True)
    return ops.schedules_seeded(tuple(created))


# ---------------------------------------------------------------------------- reads
def view(m, s) -> dict:
    """A schedule as GET /v1/schedules shows it (the template in the API's shape)."""
    d = s.definition
    last = m.jobs.get(s.last_job_id) if s.last_job_id is not None else None
    out = {"name": s.name, "version": s.version}
    out.update({k: d[k] for k in DEFINITION_KEYS if k not in ("job", "paused")})
    out.update({"job": render_template(d["job"]), "paused": s.paused, "next_fire_at_ms": None if s.paused else s.next_fire,
                "last_tick_at_ms": s.last_tick, "last_fired_at_ms": s.last_fired_at,
                "last_job_id": s.last_job_id,
                "last_job_state": None if s.last_job_id is None else STATE_NAMES[last.state] if last is not None else "finished",
                "fired": s.fired, "skipped": s.skipped, "last_error": s.last_error,
                "created_at_ms": s.created_at, "updated_at_ms": s.updated_at})
    return out


def check(m) -> list[str]:
    """The schedules' invariants (node/core/invariants.py)."""
    problems = []
    live = {(name, stamp) for _, stamp, name in m.tick_heap}
    for name, s in m.schedules.items():
        d = s.definition
        if s.name != name:
            problems.append(f"schedule {name!r} is filed under another name ({s.name!r})")
        if not s.paused and s.next_fire is not None and (name, s.stamp) not in live:
            problems.append(f"schedule {name!r}: next tick {s.next_fire} has no heap entry")
        if s.handled_to is not None and s.next_fire is not None and s.next_fire <= s.handled_to:
            problems.append(f"schedule {name!r}: next tick {s.next_fire} is not after the sweep that "
                            f"handled it ({s.handled_to}): it would fire a tick twice")
        if s.last_tick is not None and s.next_fire is not None and s.next_fire <= s.last_tick:
            problems.append(f"schedule {name!r}: next tick {s.next_fire} is not after the last fired {s.last_tick}")
        if d["max_count"] is not None and s.fired >= d["max_count"] and s.next_fire is not None:
            # (a replace keeps `fired`, so fired > max_count is a state it may leave: none fires more)
            problems.append(f"schedule {name!r}: fired {s.fired} of max_count {d['max_count']}, and a next "
                            f"tick at {s.next_fire}")
        if s.last_fired_at is not None and s.last_fired_at > m.clock:
            problems.append(f"schedule {name!r}: fired at {s.last_fired_at}, after the clock {m.clock}")
    return problems
