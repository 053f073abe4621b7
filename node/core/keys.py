"""Keys: per-key concurrency and rates, a queue-wide rate, fair queueing (docs/semantics.md "Keys").

A job may carry a key (a tenant, customer, account). A queue holding keyed jobs keeps a `Keys`
index beside its ordinary ready index: each key its own ready heap of entries (node/core/jobs.py
ENTRY_*), and a rotation `sched` of the keys that may be served now, a heap of
(level, vpass, since, turn, key) where level is -priority of the key's best ready job. Jobs without a
key stay in the queue's own index, which takes part in the rotation as one more key (`plain`,
no key limits).

Fairness is start-time fair queueing per priority level: reserve serves the best level first;
within a level, the key with the smallest virtual time `vpass`, on a tie the one served least
recently (`since`, a counter taken when the key is made and whenever it is served). Serving a key moves the
level's virtual time to the key's and the key's on by its stride (WEIGHT_SCALE / weight), so
keys of equal weight are served one job each in turn, and a key that comes back after a pause
starts at the level's virtual time: it neither lost its turn nor saved turns up. So with equal
weights no key is served twice in a row at a level while another key has a job ready there and
no limit holds it (node/core/invariants.py cannot see histories: tests/test_core_gating_model.py
checks this one).

A key at a limit leaves the rotation (`held`): "concurrency" while `key_concurrency` jobs are in
flight, "rate" while its window is full. Reserve never looks at it, so it costs nothing until a
slot frees (leave_in_flight, in the same apply) or its window admits one more (a timer on the
replicated clock: `m.key_timers`, fired by the sweep and by the next reserve). Rates are a
sliding window log: at most `count` hand-outs in any `period_ms` window, each hand-out's time kept
until it leaves the window; a burst of `count` at once is allowed.

A key's state exists while it has ready or in-flight jobs, or hand-outs still inside its
window (a timer drops it when the last one leaves); a queue's `Keys` index while any key does.

Pure: builtins only, every mutation through the machine's undo log. Entries are lazy like the
queue's: a key heap entry is live while its job is READY with the entry's seq; a rotation entry
while its key's `turn` (a counter taken whenever it enters the rotation) is the entry's. Unlike
the queue's own index in reserve's loop, a stale entry is dropped through the undo log too: the
command that drops it may have made it stale itself, and a fault after that revives it.
"""
from __future__ import annotations

from heapq import nsmallest

from .jobs import (ENTRY_JOB, ENTRY_NEG_PRIORITY, ENTRY_SEQ, IN_FLIGHT, READY, S_ENQUEUED_AT, S_KEY, S_PRIORITY,
                   S_RESOURCE, TIMER_AT, entry_order, is_live_entry)
from .undo import fifo_restore_head

WEIGHT_SCALE = 1_000_000
MAX_RATE_COUNT = 1000       # a rate's count at most (node/core/limits.py): the times a window log keeps
CONCURRENCY, RATE = "concurrency", "rate"
# A rotation entry (`Keys.sched`): (level, vpass, since, turn, key). A plain tuple read through
# these positions, not a named tuple: one is made on every hand-out of a keyed queue, and a
# named tuple costs about 0.2 µs more to make (six times a tuple's cost).
TURN_LEVEL, TURN_VPASS, TURN_SINCE, TURN, TURN_KEY = range(5)


class Key:
    """One key of one queue. `ready`: live entries of `heap` (its READY jobs not held back by a
    resource); `level`/`turn`: its rotation entry, None when out of the rotation; `vpass` the
    virtual time it counts at level `vlevel`; `log` the hand-out times inside the rate window,
    oldest first; `held` None or why it is out of the rotation; `timer` (time, ctr) of its live
    timer entry; `since` when it was made or last served."""
    __slots__ = ("name", "queue", "heap", "ready", "in_flight", "vpass", "vlevel", "vother", "since", "level",
                 "turn", "log", "held", "timer", "resources")

    def __init__(self, name, queue: str, since: int):
        self.name, self.queue, self.since = name, queue, since
        self.heap: list = []
        self.ready = self.in_flight = 0
        self.vpass = 0
        self.vlevel = self.level = self.turn = self.held = self.timer = None
        self.vother: dict | None = None     # level -> virtual time, of the levels other than vlevel
        self.log: tuple = ()
        # resource -> its ready jobs in `heap` (None while none has one): a key that a limit
        # holds passes their claims on free slots on (gating.key_held).
        self.resources: dict | None = None

    def to_tuple(self) -> tuple:
        """What snapshots keep; the heap and the counts are rebuilt from the jobs."""
        return (self.name, self.vpass, self.vlevel, self.since, self.level, self.turn, list(self.log),
                self.held, None if self.timer is None else list(self.timer),
                None if self.vother is None else sorted(self.vother.items()))

    @classmethod
    def from_tuple(cls, queue: str, t) -> "Key":
        k = cls(t[0], queue, t[3])
        _, k.vpass, k.vlevel, _, k.level, k.turn, log, k.held, timer, vother = t
        k.log = tuple(log)
        k.vother = None if vother is None else {lv: v for lv, v in vother}
        k.timer = None if timer is None else tuple(timer)
        return k


class Keys:
    """A queue's keyed index: `by_key` name -> Key, the rotation `sched`, each level's virtual
    time `vtimes`, the pseudo-key `plain` of the jobs without one; `held_ready` counts the ready
    jobs of held keys and `held_keys` the held keys."""
    __slots__ = ("by_key", "sched", "vtimes", "plain", "held_ready", "held_keys")

    def __init__(self, queue: str, since: int):
        self.by_key: dict = {}
        self.sched: list = []
        self.vtimes: dict = {}
        self.plain = Key(None, queue, since)
        self.held_ready = self.held_keys = 0


# ---------------------------------------------------------------------------- limits
def key_limits(ql, name) -> tuple:
    """(concurrency or None, (count, period_ms) or None, weight) of key `name` in a queue."""
    over = ql.key_limits.get(name) if ql.key_limits else None
    if over is None and not ql.key_weights:
        return ql.key_concurrency, ql.key_rate, 1
    conc = ql.key_concurrency if over is None or over[0] is None else over[0]
    rate = ql.key_rate if over is None or over[1] is None else over[1]
    weight = ql.key_weights.get(name, 1) if ql.key_weights else 1
    return conc, rate, weight


def window(log: tuple, rate, now: int) -> tuple:
    """The hand-outs of `log` still inside the rate's window at `now`."""
    period = rate[1]
    i = 0
    while i < len(log) and log[i] <= now - period:
        i += 1
    return log[i:] if i else log


def rate_room(log: tuple, rate, now: int) -> int:
    """How many more hand-outs the window admits at `now`."""
    return rate[0] - len(window(log, rate, now))


def rate_opens(log: tuple, rate) -> int:
    """When a full window admits one more: the oldest of its last `count` leaves it."""
    return log[-rate[0]] + rate[1]


def logged(log: tuple, rate, now: int) -> tuple:
    """The log after a hand-out at `now` (at most `count` times kept)."""
    kept = window(log, rate, now)
    return (kept + (now,))[-rate[0]:]


def over_limit(m, ql, key, now: int):
    """Why key `key` may not be served now (CONCURRENCY, RATE), or None."""
    return limit_reached(key, key_limits(ql, key.name), now)


def limit_reached(key, lim: tuple, now: int):
    """Why key `key`, whose limits are `lim` (key_limits), may not be served now, or None."""
    conc, rate, _ = lim
    if conc is not None and key.in_flight >= conc:
        return CONCURRENCY
    if rate is not None and rate_room(key.log, rate, now) <= 0:
        return RATE
    return None


# ---------------------------------------------------------------------------- the rotation
def schedule(m, qk: Keys, key: Key, level: int) -> None:
    """Key `key` (re-)enters the rotation at `level` (its best ready job's -priority)."""
    vt = qk.vtimes.get(level, 0)
    own = key.vpass
    if key.vlevel != level:             # the key's virtual time at each level is its own
        other = dict(key.vother or {})
        if key.vlevel is not None:
            other[key.vlevel] = key.vpass
        own = other.pop(level, None)
        m._set(key, "vother", other or None)
        m._set(key, "vlevel", level)
    vpass = own if own is not None and own > vt else vt
    turn = m._new_ctr()
    m._set(key, "vpass", vpass)
    m._set(key, "level", level)
    m._set(key, "turn", turn)
    m._push(qk.sched, (level, vpass, key.since, turn, key))


def unschedule(m, key: Key) -> None:
    if key.turn is not None:
        m._set(key, "level", None)
        m._set(key, "turn", None)       # its rotation entry is stale from here on


def served(m, key: Key) -> None:
    """A job without a key was handed out (`key` is the queue's `plain`, weight 1): its virtual
    time moves on by one stride (the level's follows: catch_up). Keyed hand-outs do this inline
    (handlers._served)."""
    m._set(key, "vpass", key.vpass + WEIGHT_SCALE)
    m._set(key, "since", m._new_ctr())


def catch_up(m, qk: Keys, level: int, start: int) -> None:
    """After a hand-out at `level` by a key whose virtual time was `start`: the level's virtual
    time is `start`, or the smallest virtual time of the keys waiting there when that is larger
    (the rotation's head, when it is at this level). So a key that comes back (or comes new)
    joins behind every key that has waited since, never ahead of them: a key dropped when idle
    keeps no virtual time of its own."""
    sched = qk.sched
    vt = start
    while sched:
        top = sched[0]
        if top[TURN_KEY].turn == top[TURN]:
            if top[TURN_LEVEL] == level and top[TURN_VPASS] > vt:
                vt = top[TURN_VPASS]
            break
        m._heappop(sched)               # stale (logged: key_head says why)
    vtimes = qk.vtimes
    if vtimes.get(level) != vt:
        m._put(vtimes, level, vt)


def key_head(m, key: Key):
    """The live head entry of a key's heap, or None. Stale heads are dropped on the way, logged:
    the command may have made one stale itself (a deadline that passed in the same sweep), and a
    fault later in it makes the job READY again."""
    heap, jobs = key.heap, m.jobs
    while heap:
        e = heap[0]
        job = e[ENTRY_JOB]
        if job.state == READY and job.seq == e[ENTRY_SEQ] and jobs.get(job.id) is job:
            return e
        m._heappop(heap)
    return None


def plain_head(m, q):
    """The live head of the queue's own ready index (FIFO or heap, the smaller), or None; stale
    heads dropped on the way, logged (as key_head)."""
    jobs = m.jobs
    fifo, seqs, heap = q.ready_fifo, q.fifo_seqs, q.ready_heap
    while fifo:
        job = fifo[0]
        if job.state == READY and job.seq == seqs[0] and jobs.get(job.id) is job:
            break
        m._undo += (fifo_restore_head, q, job, seqs[0])
        fifo.popleft()
        seqs.popleft()
    while heap:
        e = heap[0]
        job = e[ENTRY_JOB]
        if job.state == READY and job.seq == e[ENTRY_SEQ] and jobs.get(job.id) is job:
            break
        m._heappop(heap)
    if fifo:
        job = fifo[0]
        e = (-job.spec[S_PRIORITY], job.spec[S_ENQUEUED_AT], seqs[0], job)
        if not heap or e < heap[0]:
            return e
    return heap[0] if heap else None


def head(m, q, key: Key):
    return plain_head(m, q) if key.name is None else key_head(m, key)


def requeue(m, q, qk: Keys, key: Key) -> None:
    """After a key was served or passed over: back in the rotation at its best ready job's level
    if it has one and may be served."""
    if key.held is not None or (key.name is not None and key.ready <= 0):
        return
    e = head(m, q, key)
    if e is not None:
        schedule(m, qk, key, e[ENTRY_NEG_PRIORITY])


# ---------------------------------------------------------------------------- ready jobs
def ensure(m, q) -> Keys:
    qk = q.keys
    if qk is None:
        qk = Keys(q.name, m._new_ctr())
        m._set(q, "keys", qk)
        e = plain_head(m, q)
        if e is not None:                   # the jobs without a key join the rotation
            schedule(m, qk, qk.plain, e[ENTRY_NEG_PRIORITY])
    return qk


def push(m, q, entry) -> None:
    """A keyed job's entry into its key's heap (it has become READY, or a resource slot freed);
    the key enters the rotation, or moves up to the entry's level."""
    job = entry[ENTRY_JOB]
    qk = ensure(m, q)
    name = job.spec[S_KEY]
    key = qk.by_key.get(name)
    if key is None:
        key = Key(name, q.name, m._new_ctr())
        m._put(qk.by_key, name, key)
        why = over_limit(m, m.limits.queue(q.name), key, m.clock)
        if why is not None:             # a limit of 0
            hold(m, q, qk, key, why)
    m._push(key.heap, entry)
    m._add(key, "ready", 1)
    r = job.spec[S_RESOURCE]
    if r is not None:
        count_resource(m, key, r, 1)
    if key.held is not None:
        m._add(qk, "held_ready", 1)
    elif key.level is None or entry[ENTRY_NEG_PRIORITY] < key.level:
        schedule(m, qk, key, entry[ENTRY_NEG_PRIORITY])


def plain_pushed(m, q, level: int) -> None:
    """A job without a key became READY in a keyed queue: the queue's own index joins the
    rotation, or moves up to its level."""
    qk = q.keys
    plain = qk.plain
    if plain.level is None:
        own = plain.vpass if plain.vlevel == level else (plain.vother or {}).get(level)
        if own is None or own <= qk.vtimes.get(level, 0):
            # Not served since the level's virtual time passed it: it comes back as a key made
            # now would (after the keys made before it, on a tie). One served just now (a job
            # nacked back) keeps its place, as a named key whose job is in flight does.
            m._set(plain, "since", m._new_ctr())
    if plain.level is None or level < plain.level:
        schedule(m, qk, plain, level)


def held(q, job) -> bool:
    """Whether job's key is held at a limit (a job without a key never is)."""
    name = job.spec[S_KEY]
    if name is None or q.keys is None:
        return False
    key = q.keys.by_key.get(name)
    return key is not None and key.held is not None


def left_ready(m, q, job) -> None:
    """A keyed job left READY other than by being handed out (its heap entry is stale now)."""
    qk = q.keys
    key = qk.by_key.get(job.spec[S_KEY]) if qk is not None else None
    if key is None:
        return
    m._add(key, "ready", -1)
    r = job.spec[S_RESOURCE]
    if r is not None:
        count_resource(m, key, r, -1)
    if key.held is not None:
        m._add(qk, "held_ready", -1)
    if key.ready <= 0:
        unschedule(m, key)
        m.unsettled.append(key)


def count_resource(m, key: Key, r: str, delta: int) -> None:
    res = key.resources
    if res is None:
        res = {}
        m._set(key, "resources", res)
    n = res.get(r, 0) + delta
    if n > 0:
        m._put(res, r, n)
    else:
        m._pop(res, r)
        if not res:
            m._set(key, "resources", None)


# ---------------------------------------------------------------------------- limits reached and freed
def hold(m, q, qk: Keys, key: Key, why: str) -> None:
    """Key `key` leaves the rotation: at its concurrency limit, or its rate window full."""
    if key.held is None:
        m._add(qk, "held_ready", key.ready)
        m._add(qk, "held_keys", 1)
    m._set(key, "held", why)
    unschedule(m, key)
    if why == RATE:
        _, rate, _ = key_limits(m.limits.queue(q.name), key.name)
        arm(m, key, rate_opens(key.log, rate))


def review(m, q, key: Key) -> None:
    """A held key's limit may have freed (a slot, the window, a configuration change): back in
    the rotation, or held for the other reason."""
    if key.held is None:
        return
    qk = q.keys
    why = over_limit(m, m.limits.queue(q.name), key, m.clock)
    if why is not None:
        if why != key.held or why == RATE:
            hold(m, q, qk, key, why)
        return
    m._add(qk, "held_ready", -key.ready)
    m._add(qk, "held_keys", -1)
    m._set(key, "held", None)
    if key.ready > 0:
        requeue(m, q, qk, key)
        m.released.add(q.name)


def left_in_flight(m, q, job) -> None:
    """A keyed job left IN_FLIGHT: its key's slot frees in the same apply."""
    qk = q.keys
    key = qk.by_key.get(job.spec[S_KEY]) if qk is not None else None
    if key is None:
        return
    m._add(key, "in_flight", -1)
    if key.held == CONCURRENCY:
        review(m, q, key)
    m.unsettled.append(key)


def arm(m, key: Key, at: int) -> None:
    """The key's one timer, at `at` (an earlier one of it goes stale)."""
    if key.timer is not None and key.timer[TIMER_AT] == at:
        return
    ctr = m._new_ctr()
    m._set(key, "timer", (at, ctr))
    m._push(m.key_timers, (at, ctr, key))


def settle_unsettled(m) -> None:
    """At the end of a command: the keys it left without a job (`m.unsettled`). Not at once: a
    job that leaves in flight and is ready again in the same command (a nack, a release, a
    lapsed lease) keeps its key's place in the rotation."""
    pending, m.unsettled = m.unsettled, []
    for key in pending:
        q = m.queues.get(key.queue)
        if q is not None and q.keys is not None and q.keys.by_key.get(key.name) is key:
            settle(m, q, key)


def settle(m, q, key: Key) -> None:
    """An idle key (no ready or in-flight job) goes, unless hand-outs are still inside its
    window: then a timer drops it when the last one leaves."""
    if key.ready > 0 or key.in_flight > 0 or q.keys is None:
        return
    _, rate, _ = key_limits(m.limits.queue(q.name), key.name)
    now = m.clock
    if rate is not None and key.log and key.log[-1] + rate[1] > now:
        if key.held != RATE:
            arm(m, key, key.log[-1] + rate[1])
        return
    drop(m, q, key)


def drop(m, q, key: Key) -> None:
    qk = q.keys
    if key.held is not None:
        m._add(qk, "held_keys", -1)
    unschedule(m, key)
    m._set(key, "timer", None)
    m._pop(qk.by_key, key.name)
    if not qk.by_key:
        m._set(q, "keys", None)         # no keyed job left: the queue's own index alone again


def fire_timers(m, now: int, budget: int) -> int:
    """Due key timers: a rate window that admits one more, an idle key's last hand-out leaving
    its window. The sweep calls this, and reserve before it picks (so a window that opened is
    seen at once)."""
    heap, n = m.key_timers, 0
    while heap and heap[0][TIMER_AT] <= now and n < budget:
        at, ctr, key = m._heappop(heap)
        if key.timer != (at, ctr):
            continue
        q = m.queues.get(key.queue)
        if q is None or q.keys is None or q.keys.by_key.get(key.name) is not key:
            continue
        n += 1
        m._set(key, "timer", None)
        review(m, q, key)
        if key.held is None:
            settle(m, q, key)
    return n


def reconfigured(m) -> None:
    """After a configuration change: every held key whose limit may now admit more."""
    for q in list(m.queues.values()):
        if q.keys is not None:
            for key in list(q.keys.by_key.values()):
                if key.held is not None:
                    review(m, q, key)


def purged(m, q) -> None:
    """Purge: every ready job of the queue has gone; in-flight jobs keep their keys' slots."""
    qk = q.keys
    if qk is None:
        return
    unschedule(m, qk.plain)
    for key in list(qk.by_key.values()):
        if key.held is not None:
            m._add(qk, "held_ready", -key.ready)
        m._set(key, "ready", 0)
        m._set(key, "heap", [])
        m._set(key, "resources", None)
        unschedule(m, key)
        m.unsettled.append(key)


# ---------------------------------------------------------------------------- reads
def stats(q) -> dict:
    """The key fields of GET /v1/queues/{name}."""
    qk = q.keys if q is not None else None
    if qk is None:
        return {"keys": 0, "keys_at_limit": 0, "ready_held_by_keys": 0}
    return {"keys": len(qk.by_key), "keys_at_limit": qk.held_keys, "ready_held_by_keys": qk.held_ready}


def view(m, q, limit: int, after) -> tuple[list, object]:
    """GET /v1/queues/{name}/keys: keys by ready count, most first (then by name), a page after
    the cursor [ready, name] of the last one shown."""
    qk = q.keys if q is not None else None
    if qk is None:
        return [], None
    ql = m.limits.queue(q.name)
    rows = ((-k.ready, k.name, k) for k in qk.by_key.values())
    if after is not None:
        start = (-after[0], after[1])
        rows = (r for r in rows if (r[0], r[1]) > start)
    rows = nsmallest(limit + 1, rows)       # one pass, no sort of every key (a page under the lock)
    page = rows[:limit]
    out = []
    for _, name, k in page:
        conc, rate, weight = key_limits(ql, name)
        out.append({"key": name, "ready": k.ready, "in_flight": k.in_flight, "held": k.held,
                    "concurrency": conc, "weight": weight,
                    "rate": None if rate is None else {"count": rate[0], "period_ms": rate[1]},
                    "in_window": 0 if rate is None else len(window(k.log, rate, m.clock))})
    nxt = [page[-1][2].ready, page[-1][1]] if len(rows) > limit else None
    return out, nxt


# ---------------------------------------------------------------------------- invariants
def check(m, live_ready, ready_of) -> list[str]:
    """Keys' invariants (docs/semantics.md "Keys"; node/core/invariants.py runs them): each keyed
    ready job has one live entry, in its key's heap or a resource's blocked heap (counted into
    `live_ready`, and into `ready_of` when its key may be served: it can take a slot); counts
    match the jobs; a key is in the rotation exactly when it has ready jobs and no limit holds
    it, at a level no worse than its best job's; a held key is at its limit; a key exists only
    while it has jobs or a window to keep; no job of another queue's key; rate windows within
    their counts."""
    bad = []
    say = bad.append
    ready, in_flight = _keyed_jobs(m)
    seen = set()
    for qname, q in m.queues.items():
        if len(q.rate_log) > MAX_RATE_COUNT:
            say(f"queue {qname!r}: keeps {len(q.rate_log)} hand-out times, above {MAX_RATE_COUNT}")
        qk = q.keys
        if qk is None:
            continue
        if not qk.by_key:
            say(f"queue {qname!r} keeps a keyed index without keys")
        live_turns = {e[TURN] for e in qk.sched if e[TURN_KEY].turn == e[TURN]}
        held_keys = held_ready = 0
        for key in [qk.plain, *qk.by_key.values()]:
            where = f"queue {qname!r} key {key.name!r}"
            if key.turn is not None and key.turn not in live_turns:
                say(f"{where}: in the rotation (turn {key.turn}) without a live entry")
            if key.name is None:
                continue
            seen.add((qname, key.name))
            bad.extend(_key_problems(m, qname, key, where, ready.get((qname, key.name), 0),
                                     in_flight.get((qname, key.name), 0), live_ready, ready_of))
            if key.held is not None:
                held_keys += 1
                held_ready += key.ready
        if (held_keys, held_ready) != (qk.held_keys, qk.held_ready):
            say(f"queue {qname!r}: counts {qk.held_keys} held keys with {qk.held_ready} ready jobs, "
                f"holds {held_keys} with {held_ready}")
    for qname, name in set(ready) | set(in_flight):
        if (qname, name) not in seen:
            say(f"queue {qname!r}: key {name!r} has jobs but no state")
    return bad


def _keyed_jobs(m) -> tuple[dict, dict]:
    """The keyed jobs per (queue, key): ready (not held back by a resource), and in flight."""
    ready, in_flight = {}, {}
    for job in m.jobs.values():
        name = job.spec[S_KEY]
        if name is None:
            continue
        if job.state == READY and job.id not in m.blocked_ids:
            ready[(job.queue, name)] = ready.get((job.queue, name), 0) + 1
        elif job.state == IN_FLIGHT:
            in_flight[(job.queue, name)] = in_flight.get((job.queue, name), 0) + 1
    return ready, in_flight


def _key_problems(m, qname: str, key: Key, where: str, ready: int, in_flight: int, live_ready, ready_of) -> list[str]:
    """One key's invariants, given its queue's `ready` and `in_flight` jobs of the key."""
    bad = []
    say = bad.append
    jobs = m.jobs
    n = 0
    res: dict = {}
    for e in key.heap:
        if not is_live_entry(e, jobs):
            continue
        job = e[ENTRY_JOB]
        n += 1
        live_ready[job.id] += 1
        if job.resource is not None:
            res[job.resource] = res.get(job.resource, 0) + 1
            if key.held is None:        # a job that can take a free slot now
                ready_of[(job.resource, qname)] += 1
        if job.queue != qname or job.spec[S_KEY] != key.name:
            say(f"{where}: holds job {job.id} of queue {job.queue!r} key {job.spec[S_KEY]!r}")
        if e[:ENTRY_SEQ] != (-job.priority, job.enqueued_at):
            say(f"{where}: entry of job {job.id} keyed {entry_order(e)}, not by its priority and enqueue time")
    if n != key.ready or key.ready != ready:
        say(f"{where}: counts {key.ready} ready, holds {n} live entries of {ready} ready jobs")
    if (key.resources or {}) != res:
        say(f"{where}: counts {key.resources} ready per resource, holds {res}")
    if key.in_flight != in_flight:
        say(f"{where}: counts {key.in_flight} in flight, {in_flight} are")
    if key.held is not None:
        if over_limit(m, m.limits.queue(qname), key, m.clock) is None and not (key.held == RATE and key.timer is not None):
            say(f"{where}: held ({key.held}) though no limit holds it")
    elif key.ready > 0:
        best = min((e for e in key.heap if is_live_entry(e, jobs)), default=None)     # a read: nothing dropped
        if key.turn is None or best is None or key.level > best[ENTRY_NEG_PRIORITY]:
            say(f"{where}: has ready jobs but is not in the rotation at its best level")
    elif key.turn is not None:
        say(f"{where}: in the rotation without a ready job")
    if key.ready == 0 and key.in_flight == 0 and key.timer is None:
        say(f"{where}: idle, kept without a timer")
    if len(key.log) > MAX_RATE_COUNT:
        say(f"{where}: keeps {len(key.log)} hand-out times, above {MAX_RATE_COUNT}")
    return bad
