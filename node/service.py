"""One node's operations: each API operation once, shared by HTTP (and the session transport).

Every method returns `(status, body)`. Leader-only operations assume the caller checked
leadership (the HTTP layer redirects otherwise); if leadership is lost in between, the proposal
fails and maps to 503, never to a false success.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading

from . import bounds, validate
from .core import ops
from .core.jobs import IN_FLIGHT, READY, SCHEDULED, Queue
from .errors import ApiError, error
from .proposer import Proposer, wall_ms
from .replica import Replica
from .request_ids import stored_key
from .settings import ROLES, Settings

log = logging.getLogger("raftq.node")
from .. import __version__ as VERSION
WAKING_OPS = ops.WAKING_OPS
ENQUEUE_ITEMS = ops.reader(ops.ENQUEUE, "items")
ITEM_QUEUE = ops.ITEM_QUEUE
# Beyond this many queue names with parked reserves, an apply of enqueues wakes only the
# waiters of the queues it enqueued to (below it, looking at every name costs less).
TARGETED_WAKE_NAMES = 64


_random = bytearray()


def _new_id() -> str:
    """A random UUID v4 (canonical lowercase text), from a buffered os.urandom: a quarter of
    uuid.uuid4()'s cost, which matters at one id per enqueued job."""
    global _random
    if len(_random) < 16:
        _random = bytearray(os.urandom(4096))
    b = _random[-16:]
    del _random[-16:]
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


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


def _page_limit(query) -> int | None:
    """A listing's `limit` (default 50), or None when it is not an integer 1..100."""
    try:
        limit = int(query.get("limit", "50"))
    except ValueError:
        return None
    return limit if 1 <= limit <= 100 else None


class NodeService:
    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop):
        self.settings = settings
        self.limits = settings.limits
        self.clock_offset_ms = settings.testing.clock_offset_ms     # [testing]: chaos clock-skew
        self.loop = loop
        self.last_stamp = 0
        self.replica = Replica(settings, on_state_changed=self._on_state_changed_thread)
        self.state = self.replica.state
        t = settings.tuning
        # A proposal wakes the Raft tick thread by itself (node/raft: event-driven replication).
        self.proposer = Proposer(self.state, loop, self.stamp,
                                 max_batch_commands=int(t["max_batch_commands"]),
                                 max_batch_bytes=int(t["max_batch_bytes"]),
                                 max_inflight=int(t["max_inflight"]),
                                 request_timeout_s=float(t["request_timeout_s"]))
        # Parked long polls: queue name -> {Waiter: None} in park order. A waiter is in the map
        # under each of its queue names while it is parked, and nowhere once it leaves.
        self.waiters: dict[str, dict] = {}
        self.parked = 0
        self.max_parked = int(t["max_parked_reserves"])
        self.wake_scheduled = False
        self._wake_names: set | None = set()    # what the next wake looks at; None: every name
        self._wake_lock = threading.Lock()
        self.stopping = False
        self.leader_epoch = 0
        self.state.after_apply = self._after_apply_thread
        self.sweeper: asyncio.Task | None = None
        self.stats = collections.Counter()
        self._digest_cache = (None, None)
        self.leadership_lost_hooks: list = []     # coroutine functions(new_leader_url or "")
        self.fatal: str | None = None

    # ---------------------------------------------------------------- time and roles
    def stamp(self) -> int:
        """The leader's stamp: wall clock, never behind replicated time or an earlier stamp."""
        now = max(wall_ms() + self.clock_offset_ms, self.state.machine.clock, self.last_stamp)
        self.last_stamp = now
        return now

    def is_leader(self) -> bool:
        return self.replica.is_leader() and not self.stopping

    def leader_url(self) -> str | None:
        raft = self.replica.leader_raft()
        if raft is None:
            return None
        peer = self.settings.peer_by_raft(raft)
        return peer.url if peer else None

    def _on_state_changed_thread(self, old, new):
        try:
            self.loop.call_soon_threadsafe(self._on_state_changed, old, new)
        except RuntimeError:
            pass

    def _on_state_changed(self, old, new):
        self.leader_epoch += 1
        log.info("raft state %s -> %s", old, new)
        self._wake_all()
        if old == 2 and new != 2:
            self._leadership_lost()

    def _leadership_lost(self):
        url = self.leader_url() or ""
        for hook in self.leadership_lost_hooks:
            self.loop.create_task(hook(url if url != self.settings.url else ""))

    # ---------------------------------------------------------------- long-poll wake-ups
    def _after_apply_thread(self, cmds, results):
        """On the Raft thread after an apply: schedule a wake-up of the parked reserves when a
        command may have made a job ready. Enqueues name their queues; the other waking ops
        (nack, sweep, requeue, resume) make the wake look at every queue with waiters."""
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
        queues = self.state.machine.queues
        for name in list(waiters) if names is None else names:
            parked = waiters.get(name)
            if not parked:
                continue
            q = queues.get(name)
            n = 0 if q is None or q.paused else q.ready
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
        """Leadership moved (or the node stops): every parked reserve leaves, empty."""
        for parked in list(self.waiters.values()):
            for w in parked:
                if not w.fut.done():
                    w.fut.set_result(False)

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
        queues = self.state.machine.queues
        for name in queue_names:
            q = queues.get(name)
            if q is not None and q.ready > 0 and not q.paused:
                return True
        return False

    # ---------------------------------------------------------------- job operations
    def prepare(self, op: str, body, rid, job_id=None):
        """The command for one operation (everything but reserve), or an immediate error:
        (cmd, size_hint) or (None, (status, body)). `job_id` comes from the HTTP path; a
        session frame carries it in the body."""
        try:
            if op == "enqueue":
                return validate.enqueue(body, self.limits, self.stamp(), _new_id, rid), 256
            if op == "enqueue_batch":
                return validate.enqueue_batch(body, self.limits, self.stamp(), _new_id, rid), 4096
            if op == "enqueue_atomic":
                return validate.enqueue_atomic(body, self.limits, self.stamp(), _new_id, rid), 4096
            if op == "ack_batch":
                cmd = validate.ack_batch(body, self.limits, rid)
                return cmd, 64 * len(ops.ack_batch_pairs(cmd))
            if op == "drain":
                return validate.drain(body, self.limits, rid), 64
            if op in ("ack", "nack", "extend"):
                if job_id is None:
                    if not isinstance(body, dict):
                        raise ApiError("invalid_argument", "body must be a JSON object with job_id")
                    job_id = body.get("job_id")
                if op == "nack":
                    return validate.nack(job_id, body, rid, self.limits), 64
                build = validate.ack if op == "ack" else validate.extend
                return build(job_id, body, rid), 64
        except ApiError as e:
            return None, e.result
        return None, error("invalid_argument", f"unknown op {op!r}")

    # The job operations below are plain functions that return a future to await, not
    # coroutines: each `async def` layer costs a frame and a send() per request on the path
    # every enqueue, reserve and ack takes.
    def run(self, op: str, body, rid=None, job_id=None) -> asyncio.Future:
        """Prepare and propose one operation: a future of its committed result or the error."""
        cmd, extra = self.prepare(op, body, rid, job_id)
        if cmd is None:
            return self.proposer.answered(extra)
        return self.proposer.submit(cmd, extra)

    def enqueue(self, body, rid=None) -> asyncio.Future:
        return self.run("enqueue", body, rid)

    def enqueue_batch(self, body, rid=None) -> asyncio.Future:
        return self.run("enqueue_batch", body, rid)

    def enqueue_atomic(self, body, rid=None) -> asyncio.Future:
        return self.run("enqueue_atomic", body, rid)

    async def reserve(self, body, rid=None, alive=None, owner=None):
        """A reserve; with `wait_ms`, a long poll that parks until a job may be ready in one of
        its queues. `alive()` says whether the client is still there; `owner` (a session) has
        `parked` and `max_parked`, its own bound on parked reserves."""
        try:
            cmd, wait_ms = validate.reserve(body, self.limits, rid)
        except ApiError as e:
            return e.result
        queue_names = ops.reserve_queue_names(cmd)
        loop = self.loop
        deadline = loop.time() + wait_ms / 1000.0
        epoch = self.leader_epoch
        wake_owed = False        # woken for a ready job and not (yet) reserved: pass it on when leaving
        try:
            while True:
                if alive is not None and not alive():
                    return 200, {"jobs": []}        # the client has gone: take nothing for it
                if self.stopping or epoch != self.leader_epoch:
                    return 200, {"jobs": []}        # leadership moved while parked
                if rid is not None and stored_key(rid) in self.state.machine.rids or self._has_ready(queue_names):
                    result = await self.proposer.submit(cmd)
                    if result[0] != 200:
                        return result
                    wake_owed = False
                    if result[1]["jobs"]:
                        return result
                else:
                    wake_owed = False               # taken by another reserve meanwhile
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return 200, {"jobs": []}
                if self.parked >= self.max_parked:
                    bounds.hit("max_parked_reserves")
                    return error("overloaded", f"{self.max_parked} long polls are waiting on this node "
                                               "(tuning.max_parked_reserves); retry after a moment")
                if owner is not None and owner.parked >= owner.max_parked:
                    bounds.hit("max_session_parked_reserves")
                    return error("overloaded", f"{owner.max_parked} long polls are waiting in this session "
                                               "(tuning.max_session_parked_reserves); retry after a moment")
                w = self._park(tuple(dict.fromkeys(queue_names)), alive, owner)
                fut = w.fut
                if self._has_ready(queue_names):    # an apply slipped in before we parked
                    fut.set_result(True)
                timer = loop.call_later(remaining, _time_up, fut)
                try:
                    woken = await fut
                finally:
                    timer.cancel()
                    self._unpark(w)
                    if not fut.done():
                        fut.cancel()
                    elif not fut.cancelled() and fut.result() is True:
                        wake_owed = True
                if woken is None:
                    return 200, {"jobs": []}        # the time is up
        finally:
            if wake_owed:
                self._schedule_wake(queue_names)

    def ack(self, job_id, body, rid=None) -> asyncio.Future:
        return self.run("ack", body, rid, job_id)

    def ack_batch(self, body, rid=None) -> asyncio.Future:
        return self.run("ack_batch", body, rid)

    def nack(self, job_id, body, rid=None) -> asyncio.Future:
        return self.run("nack", body, rid, job_id)

    def extend(self, job_id, body, rid=None) -> asyncio.Future:
        return self.run("extend", body, rid, job_id)

    def drain(self, body, rid=None) -> asyncio.Future:
        return self.run("drain", body, rid)

    async def requeue(self, body, rid=None):
        return await self._run(validate.requeue, body, rid)

    async def delete_dead_letters(self, body, rid=None):
        return await self._run(validate.delete_dead_letters, body, rid)

    async def cancel(self, job_id, rid=None):
        return await self._run(validate.cancel, job_id, rid)

    async def pause(self, queue, paused: bool, rid=None):
        return await self._run(validate.pause, queue, paused, self.limits, rid)

    async def _run(self, build, *args):
        try:
            cmd = build(*args)
        except ApiError as e:
            return e.result
        return await self.proposer.run(cmd)

    # ---------------------------------------------------------------- sweeps
    async def sweep_loop(self):
        """While leader: propose a sweep when something is due, and at least every
        sweep_interval_ms while anything is pending."""
        interval = self.limits.sweep_interval_ms / 1000.0
        last = 0.0
        while not self.stopping:
            delay = interval
            try:
                if self.replica.is_leader():
                    m = self.state.machine
                    due = m.next_due_ms()
                    now = wall_ms() + self.clock_offset_ms
                    mono = self.loop.time()
                    if due is not None and (due <= now or mono - last >= interval):
                        last = mono
                        status, body = await self.proposer.run(validate.sweep())
                        self.stats["sweeps"] += 1
                        if status == 200 and any(v >= self.limits.sweep_limit for v in body.values()):
                            delay = 0            # a phase hit its budget: go again at once
                            continue
                        due = m.next_due_ms()
                        now = wall_ms() + self.clock_offset_ms
                    if due is not None:
                        delay = min(interval, max(0.0, (due - now) / 1000.0))
            except Exception:
                log.exception("sweep loop error")
            await asyncio.sleep(max(delay, 0.002))

    # ---------------------------------------------------------------- reads
    def server_info(self):
        info = {"server_version": VERSION, "protocol_versions": ["v1"],
                "server_time_ms": wall_ms() + self.clock_offset_ms, "node_id": self.settings.node_id}
        info.update(self.limits.server_info())
        return 200, info

    def cluster(self, with_digest: bool = True):
        """This node's view. The state digest costs O(state) (cached per applied index);
        `with_digest=False` skips it for frequent polling."""
        r = self.replica
        status = r.status()
        # Role and term must belong together ("at most one leader per term" is checked from
        # these views), so both come from one snapshot the tick thread takes between messages.
        role, term = r.raft_role_term()
        leader_raft = r.leader_raft()
        leader = None
        if leader_raft is not None:
            p = self.settings.peer_by_raft(leader_raft)
            if p is not None:
                leader = {"id": p.id, "url": p.url}
        members = []
        for p in self.settings.peers:
            members.append({"id": p.id, "url": p.url, "raft_addr": p.raft,
                            "connected": True if p.id == self.settings.node_id else r.connected(p.raft)})
        with self.state.lock:
            applied = r.last_applied()
            cached_at, digest = self._digest_cache
            if not with_digest:
                digest = None
            elif cached_at != (applied, self.state.machine.applied):
                digest = self.state.machine.digest()
                self._digest_cache = ((applied, self.state.machine.applied), digest)
            machine_counts = self.state.machine.counts()
        return 200, {"node_id": self.settings.node_id, "role": role,
                     "leader": leader, "term": term, "commit_index": status["commit_index"],
                     "last_applied": applied, "members": members, "ready": self.ready(),
                     "digest": digest, "durability": self.settings.durability,
                     "limits_fingerprint": self.limits.fingerprint(), "state": machine_counts,
                     "cpu": r.cpu(), "proposer": dict(self.proposer.stats), "journal_syncs": r.syncs,
                     "event_loop": "uvloop" if type(self.loop).__module__.startswith("uvloop") else "asyncio"}

    def ready(self) -> bool:
        r = self.replica
        return r.leader_raft() is not None and r.caught_up()

    def queues(self):
        with self.state.lock:
            m = self.state.machine
            out = [m.queue_stats(n) for n in m.queue_names()]
        return 200, {"queues": [q for q in out if q is not None]}

    def queue(self, name):
        with self.state.lock:
            stats = self.state.machine.queue_stats(name)
        if stats is None:
            if name in self.limits.queues or not self.limits.strict_queues:
                stats = Queue(name).stats(name in self.limits.queues)
            else:
                return error("not_found", f"queue {name!r} is not declared", queue=name)
        stats["limits"] = self.limits.queue(name).describe()
        return 200, stats

    def queue_jobs(self, name, query):
        state = query.get("state", "ready")
        states = {"ready": READY, "scheduled": SCHEDULED, "in_flight": IN_FLIGHT}
        if state not in states:
            return error("invalid_argument", "state must be ready, scheduled or in_flight")
        limit = _page_limit(query)
        if limit is None:
            return error("invalid_argument", "limit must be an integer 1..100")
        after = None
        cursor = query.get("cursor")
        if cursor:
            try:
                after = tuple(int(x) for x in cursor.split("."))
            except ValueError:
                return error("invalid_argument", "cursor is not one this server returned")
        with self.state.lock:
            jobs, nxt = self.state.machine.list_jobs(name, states[state], limit, after)
        return 200, {"jobs": jobs, "next_cursor": ".".join(str(x) for x in nxt) if nxt else None}

    def job(self, job_id):
        jid = validate.canonical_uuid(job_id)
        if jid is None:
            return error("invalid_argument", f"job id must be a canonical UUID, got {job_id!r}")
        with self.state.lock:
            view = self.state.machine.job_view(jid)
        if view is None:
            return error("not_found", "no such job (acked, dropped, or never existed)", job_id=jid)
        return 200, view

    def dead_letters(self, query):
        queue = query.get("queue") or None
        limit = _page_limit(query)
        if limit is None:
            return error("invalid_argument", "limit must be an integer 1..100")
        cursor = query.get("cursor") or None
        if cursor is not None and validate.canonical_uuid(cursor) is None:
            return error("invalid_argument", "cursor is not one this server returned")
        with self.state.lock:
            records, nxt = self.state.machine.list_dead_letters(queue, limit, cursor)
        return 200, {"records": records, "next_cursor": nxt}

    # ---------------------------------------------------------------- lifecycle
    def start(self, on_fatal=None):
        if self.settings.testing.sweeps:
            self.sweeper = self.loop.create_task(self.sweep_loop())
        self.limits_check = self.loop.create_task(self.check_peer_limits(on_fatal))

    async def check_peer_limits(self, on_fatal):
        """Every node of a cluster must run the same limits (validation and apply depend on
        them). A node whose limits differ from a majority of the cluster refuses to serve; one
        that agrees with a majority carries on (a single misconfigured node cannot stop the rest)."""
        import aiohttp
        from .tls import peer_context, peer_problem
        mine = self.limits.fingerprint()
        n = len(self.settings.peers)
        seen: dict[str, str] = {}
        told: set[str] = set()
        try:
            ssl_ctx = peer_context(self.settings.tls)   # https peers: tls_peer_ca, this node's certificate
        except Exception as e:                          # the files changed since the start
            log.warning("cannot compare limits with the other nodes: their https client context: %s", e)
            return
        # With API keys on, /v1/cluster needs one: this node's own, the least privileged first
        # (a viewer's is enough). Without one every answer was a 401 and the check retried
        # forever: a node with other limits kept serving, and could lead.
        keys = sorted(self.settings.api_keys or (), key=lambda k: ROLES.index(k.get("role", "admin")))
        credentials = [{"Authorization": f"Bearer {k['key']}"} for k in keys] or [{}]
        which: dict[str, int] = {}          # peer id -> the credentials it took last
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=True if ssl_ctx is None else ssl_ctx)) as http:
            while not self.stopping:
                for p in self.settings.others:
                    if p.id in seen:
                        continue
                    k = which.get(p.id, 0)
                    try:
                        async with http.get(p.url + "/v1/cluster?digest=false", headers=credentials[k],
                                            timeout=aiohttp.ClientTimeout(total=2)) as r:
                            if r.status in (401, 403):
                                which[p.id] = (k + 1) % len(credentials)    # another of our keys next time
                                if p.id not in told and which[p.id] == 0:
                                    told.add(p.id)
                                    log.warning("cannot compare limits with %s at %s: it refuses every API key of "
                                                "this node (%d); give every node the same [auth] api_keys",
                                                p.id, p.url, r.status)
                                continue
                            theirs = (await r.json()).get("limits_fingerprint") if r.status == 200 else None
                    except Exception as e:
                        why = peer_problem(e)
                        if why is not None and p.id not in told:
                            told.add(p.id)
                            log.warning("cannot compare limits with %s at %s: %s", p.id, p.url, why)
                        continue
                    if theirs:
                        seen[p.id] = theirs
                agree = 1 + sum(1 for f in seen.values() if f == mine)
                if agree * 2 > n:
                    return
                differ = {pid: f for pid, f in seen.items() if f != mine}
                if len(differ) * 2 > n - 1 or (len(seen) == n - 1 and agree * 2 <= n):
                    self.fatal = (f"limits differ from those of {', '.join(sorted(differ))} ({mine} here); every node "
                                  "of a cluster must have the same [limits], [storage] and [[queues]]: fix this node's "
                                  "config and restart it")
                    log.critical(self.fatal)
                    if on_fatal is not None:
                        on_fatal()
                    return
                await asyncio.sleep(2.0)

    async def stop(self, transfer_timeout_s: float = 3.0):
        """Stop taking requests, hand leadership over if leader, let in-flight work finish."""
        self.stopping = True
        self._wake_all()
        if self.replica.is_leader() and len(self.settings.peers) > 1:
            self.replica.transfer_leadership()
            end = self.loop.time() + transfer_timeout_s
            while self.replica.is_leader() and self.loop.time() < end:
                await asyncio.sleep(0.02)
        end = self.loop.time() + 1.0
        while self.leader_url() in (None, self.settings.url) and self.loop.time() < end:
            await asyncio.sleep(0.02)
        self._leadership_lost()      # sessions learn where to go (the state change may not have fired)
        end = self.loop.time() + self.proposer.request_timeout_s
        while self.proposer.inflight and self.loop.time() < end:
            await asyncio.sleep(0.02)
        if self.sweeper:
            self.sweeper.cancel()
        self.replica.destroy()
