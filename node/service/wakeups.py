"""NodeService's long-poll wake-ups: reserves with `wait_ms` park per queue, and an apply that may
have made a job ready (an enqueue, a nack, a sweep, a resume, a gate released) wakes as many of
them, oldest first, as there are jobs ready. On the path of every enqueue: no extra calls here."""
from __future__ import annotations

import threading

from ..core import ops
from .results import ResultWaits

WAKING_OPS = ops.WAKING_OPS
RELEASING_OPS = ops.RELEASING_OPS
ENQUEUE_ITEMS = ops.reader(ops.ENQUEUE, "items")
ITEM_QUEUE = ops.ITEM_QUEUE
# Beyond this many queue names with parked reserves, an apply of enqueues wakes only the
# waiters of the queues it enqueued to (below it, looking at every name costs less).
TARGETED_WAKE_NAMES = 64


class Waiter:
    """One parked long-poll reserve: its future (True: a job may be ready, False: leave, None:
    its time is up), the queues it waits on, whether its client is still there, and what it is
    counted against (its session, or None)."""
    __slots__ = ("fut", "names", "alive", "owner")

    def __init__(self, fut, names, alive, owner):
        self.fut, self.names, self.alive, self.owner = fut, names, alive, owner


def _time_up(fut):
    if not fut.done():
        fut.set_result(None)


class Wakeups:
    """Mixin of NodeService: parked long polls and their wake-ups."""

    def _init_wakeups(self):
        # Parked long polls: queue name -> {Waiter: None} in park order. A waiter is in the map
        # under each of its queue names while it is parked, and nowhere once it leaves.
        self.waiters: dict[str, dict] = {}
        self.parked = 0
        self.max_parked = int(self.settings.tuning["max_parked_reserves"])
        self.wake_scheduled = False
        self._wake_names: set | None = set()    # what the next wake looks at; None: every name
        self._wake_lock = threading.Lock()
        # Parked GET /v1/jobs/{id}/result calls (results.py), looked at after every apply.
        self.result_waits = ResultWaits(self.loop, self._outcome)
        # While something waits here for this node's applies, a follower asks the leader to tell
        # it each commit at once, not with its next heartbeat (node/raft/syncobj.py _onTick): a
        # job enqueued anywhere wakes a reserve parked here within a few ms instead of ~20 more.
        self.replica.commit_wanted = self._waiting_for_applies

    def _waiting_for_applies(self) -> bool:
        """On the Raft thread (a dict's truth, no lock): long polls or result waits are parked."""
        return bool(self.waiters) or bool(self.result_waits.parked)

    def _after_apply_thread(self, cmds, results):
        """On the Raft thread after an apply: schedule a wake-up of the parked reserves when a
        command may have made a job ready. Enqueues name their queues; the other waking ops
        (nack, sweep, requeue, resume) make the wake look at every queue with waiters."""
        m = self.state.machine
        if (m.limits, m.config_version) != self._config_seen:
            self.follow_config()            # a config entry: in force here from this index on
        released = m.released
        if released:                        # gating: held-back jobs became reservable
            released = set(released)
            m.released.clear()
        if self.result_waits.parked:                # (a dict's truth: no call while none waits)
            self.result_waits.after_apply_thread()
        waiters = self.waiters
        if not waiters:
            return
        names: set | None = set()
        targeted = len(waiters) > TARGETED_WAKE_NAMES
        for c in cmds:
            op = ops.op_of(c)
            if op == ops.ENQUEUE:
                if not targeted:
                    names = None
                    break
                for it in ENQUEUE_ITEMS(c):
                    if type(it) is tuple:
                        names.add(it[ITEM_QUEUE])
            elif op in WAKING_OPS:
                names = None
                break
            elif op in RELEASING_OPS and released:
                names |= released
        if names is not None and not names:
            return
        with self._wake_lock:
            if names is None or self._wake_names is None:
                self._wake_names = None
            else:
                self._wake_names |= names
            if self.wake_scheduled:
                return
            self.wake_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            pass

    def _schedule_wake(self, names=None):
        """On the loop: wake the waiters of `names` (None: of every queue) soon."""
        with self._wake_lock:
            if names is None or self._wake_names is None:
                self._wake_names = None
            else:
                self._wake_names.update(names)
            if self.wake_scheduled:
                return
            self.wake_scheduled = True
        self.loop.call_soon(self._wake)

    def _wake(self):
        """Wake, per queue that has jobs ready, up to that many of its live waiters, oldest
        first. A waiter whose client has gone is told to leave and does not count: the wake-up
        goes to the next one."""
        with self._wake_lock:
            names, self._wake_names = self._wake_names, set()
            self.wake_scheduled = False
        waiters = self.waiters
        m = self.state.machine
        queues = m.queues
        for name in list(waiters) if names is None else names:
            parked = waiters.get(name)
            if not parked:
                continue
            q = queues.get(name)
            n = 0 if q is None or not m.reservable(q) else q.ready - q.throttled
            if n <= 0:
                continue
            for w in list(parked):
                fut = w.fut
                if fut.done():
                    continue
                if w.alive is not None and not w.alive():
                    fut.set_result(False)
                    continue
                fut.set_result(True)
                n -= 1
                if n <= 0:
                    break

    def _wake_all(self):
        """Leadership moved (or the node stops): every parked reserve leaves, empty (a parked
        result call only when the node stops: any node's applied state answers it)."""
        for parked in list(self.waiters.values()):
            for w in parked:
                if not w.fut.done():
                    w.fut.set_result(False)
        if self.stopping:
            self.result_waits.leave_all()

    def _park(self, names, alive, owner) -> Waiter:
        w = Waiter(self.loop.create_future(), names, alive, owner)
        for name in names:
            self.waiters.setdefault(name, {})[w] = None
        self.parked += 1
        if owner is not None:
            owner.parked += 1
        return w

    def _unpark(self, w: Waiter):
        for name in w.names:
            parked = self.waiters.get(name)
            if parked is not None:
                parked.pop(w, None)
                if not parked:
                    del self.waiters[name]
        self.parked -= 1
        if w.owner is not None:
            w.owner.parked -= 1

    def _has_ready(self, queue_names) -> bool:
        m = self.state.machine
        queues = m.queues
        gated = m.limits.gated
        for name in queue_names:
            q = queues.get(name)
            if q is not None and q.ready > q.throttled and not q.paused and (not gated or m.reservable(q)):
                return True
        return False
