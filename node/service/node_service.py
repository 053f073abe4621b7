"""One node's operations: each API operation once, shared by HTTP (and the session transport).

Every method returns `(status, body)`. Leader-only operations assume the caller checked
leadership (the HTTP layer redirects otherwise); if leadership is lost in between, the proposal
fails and maps to 503, never to a false success.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import logging
import os
import sys
import threading
import time

import orjson

from ..base import bounds, validate, validate_schedule
from ..replication import fault_hooks
from ..base.auth import Auth
from ..core import ops
from ..core.jobs import DEAD_LETTER_CAUSES, IN_FLIGHT, READY, SCHEDULED, Queue
from ..core.errors import ApiError, error
from ..replication.proposer import Proposer, wall_ms
from ..replication.replica import RAFT_ROLES, Replica
from ..base.settings import Settings
from .workers_seen import WorkersSeen

log = logging.getLogger("raftq.node")
from ... import __version__ as VERSION
WAKING_OPS = ops.WAKING_OPS
RELEASING_OPS = ops.RELEASING_OPS
ENQUEUE_ITEMS = ops.reader(ops.ENQUEUE, "items")
ITEM_QUEUE = ops.ITEM_QUEUE
# Beyond this many queue names with parked reserves, an apply of enqueues wakes only the
# waiters of the queues it enqueued to (below it, looking at every name costs less).
TARGETED_WAKE_NAMES = 64
PEER_VIEW_TIMEOUT_S = 1.5       # a stopped peer must not hold up the others' rows for long

# The node's exit status after a failed write or sync of its data dir (EX_IOERR): distinct from
# 1 (cannot listen) and 2 (config or limits), so a supervisor or an operator can tell a disk
# that failed from a node that was misconfigured.
EXIT_STORAGE = 74
DISK_CHECK_S = 0.5          # how often the free space of the data disk is looked at


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


def _log_digest_failure(task: asyncio.Task) -> None:
    """A digest child started for a poller that was already answered with the older digest:
    nobody awaits it, so its failure is logged here (the next call starts another)."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("state digest child failed: %r", task.exception())


def _page_limit(query) -> int | None:
    """A listing's `limit` (default 50), or None when it is not an integer 1..100."""
    try:
        limit = int(query.get("limit", "50"))
    except ValueError:
        return None
    return limit if 1 <= limit <= 100 else None


def _page_args(query, decode):
    """A listing's (limit, cursor decoded by `decode`, or None when none came), and None; or None
    and the 400 answer naming what is wrong. `decode` returns None or raises ValueError for a
    cursor this server did not make."""
    limit = _page_limit(query)
    if limit is None:
        return None, error("invalid_argument", "limit must be an integer 1..100")
    cursor = query.get("cursor")
    if not cursor:
        return (limit, None), None
    try:
        after = decode(cursor)
    except ValueError:
        after = None
    if after is None:
        return None, error("invalid_argument", "cursor is not one this server returned")
    return (limit, after), None


def _key_cursor_encode(after) -> str:
    """A keys page's cursor: [ready, key] as base64url JSON (a key may hold any character but
    the control ones, so the cursor is made safe to put in a query as it is)."""
    return base64.urlsafe_b64encode(orjson.dumps(after)).decode().rstrip("=")


def _key_cursor_decode(cursor: str):
    """The [ready, key] of a cursor _key_cursor_encode made, or None."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        after = orjson.loads(raw)
    except (ValueError, binascii.Error, orjson.JSONDecodeError):
        return None
    if not (isinstance(after, list) and len(after) == 2 and type(after[0]) is int and after[0] >= 0
            and isinstance(after[1], str)):
        return None
    return after


# The routes a request id is bound to (node/base/validate.py request_slot): one per endpoint.
JOB_ID_OPS = frozenset(("ack", "nack", "extend", "release"))
SEED_RETRY_S = 0.05


class NodeService:
    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop, accept_damaged_log: bool = False):
        self.settings = settings
        self.clock_offset_ms = settings.testing.clock_offset_ms     # [testing]: chaos clock-skew
        self.strober: asyncio.Task | None = None                      # [testing]: chaos clock-strobe
        self.loop = loop
        self.last_stamp = 0
        # The data disk's free-space reserve ([storage] min_free_bytes, node-local).
        self.min_free_bytes = int(settings.limits.storage.get("min_free_bytes", 0) or 0)
        self.free_bytes: int | None = None
        self.low_space = False
        self.replica = Replica(settings, on_state_changed=self._on_state_changed_thread,
                               on_storage_failure=self._storage_failed, election_eligible=self._may_lead,
                               accept_damaged_log=accept_damaged_log)
        self.state = self.replica.state
        t = settings.tuning
        # A proposal wakes the Raft tick thread by itself (node/raft: event-driven replication).
        self.proposer = Proposer(self.state, loop, self.stamp,
                                 max_batch_commands=int(t["max_batch_commands"]),
                                 max_batch_bytes=int(t["max_batch_bytes"]),
                                 max_inflight=int(t["max_inflight"]),
                                 request_timeout_s=float(t["request_timeout_s"]),
                                 entry_stages=self.replica.entry_stages)
        # Parked long polls: queue name -> {Waiter: None} in park order. A waiter is in the map
        # under each of its queue names while it is parked, and nowhere once it leaves.
        self.waiters: dict[str, dict] = {}
        self.parked = 0
        self.max_parked = int(t["max_parked_reserves"])
        self.wake_scheduled = False
        # Which workers reserve from which queue (leader soft state: node/service/workers_seen.py).
        self.workers_seen = WorkersSeen(window_ms=settings.testing.workers_window_ms)
        self._wake_names: set | None = set()    # what the next wake looks at; None: every name
        self._wake_lock = threading.Lock()
        self.stopping = False
        self.leader_epoch = 0
        self.state.after_apply = self._after_apply_thread
        self.sweeper: asyncio.Task | None = None
        self.stats = collections.Counter()
        self._digest_cache = (None, None)
        self._digest_job: asyncio.Task | None = None
        self._digest_next_at = 0.0      # loop time before which no new digest child is started
        self.leadership_lost_hooks: list = []     # coroutine functions(new_leader_url or "")
        self.fatal: str | None = None
        self._peer_session = None                 # aiohttp client for GET /v1/cluster/nodes
        # The configuration in force as this node applied it: auth follows its keys (the TOML's
        # until version 1), `config_hooks` are called (on whichever thread saw the change) with
        # the new Limits, e.g. the HTTP app's body bound.
        self.auth = Auth(settings.api_keys)
        self.seeded = False
        self.config_hooks: list = []
        self._config_seen = (None, -1)
        self._toml_logged = -1
        self.toml_keys = {k["name"]: (validate.key_sha256(k["key"]), k["role"]) for k in settings.api_keys or ()}
        self.seeder: asyncio.Task | None = None
        self.schedule_seeder: asyncio.Task | None = None
        self.config_watch: asyncio.Task | None = None
        self.follow_config()
        self.state.after_restore = self.follow_config
        from ..replication.membership import Membership
        self.membership = Membership(self)
        self._removed_said = False
        self.replica.on_members_changed = self._members_changed_thread
        if self.replica.removed:
            self._removed_said = True

    # ---------------------------------------------------------------- membership
    @property
    def member_change_doing(self) -> str | None:
        return self.membership.doing

    async def add_member(self, body, rid, who):
        return await self.membership.add(body, rid, who)

    async def remove_member(self, member_id, rid, who, authorization=None):
        return await self.membership.remove(member_id, rid, authorization, who)

    def removed_reason(self) -> str:
        return (f"node {self.settings.node_id} was removed from the cluster: it serves nothing any more; ask "
                "another member (GET /v1/cluster there lists the members). To make this node a member again, "
                "stop it, empty its data dir and add it (raftq members add)")

    def _members_changed_thread(self):
        try:
            self.loop.call_soon_threadsafe(self._members_changed)
        except RuntimeError:
            pass

    def _members_changed(self):
        if self.replica.removed and not self._removed_said:
            self._removed_said = True
            log.critical("this node (%s, raft %s) was removed from the cluster (its removal is committed): it serves "
                         "nothing from now on (every API call answers 503 unavailable, /readyz 503) and stops Raft; "
                         "stop the process. To make it a member again, empty its data dir and add it",
                         self.settings.node_id, self.settings.raft)
            self._wake_all()
            self._leadership_lost()         # sessions are closed: their clients go to the members
            self.loop.run_in_executor(None, self.replica.destroy)

    # ---------------------------------------------------------------- the configuration in force
    @property
    def limits(self):
        """The configuration in force as this node has applied it (never the TOML after
        version 1): what validation, server-info and the queue views use."""
        return self.state.machine.limits

    def is_seeded(self) -> bool:
        if not self.seeded and self.state.machine.config_version >= 1:
            self.seeded = True
        return self.seeded

    def follow_config(self) -> None:
        """Follow a change of the configuration in force (a config or key command applied, or
        a snapshot restored): the key set for auth, the hooks, a log line when the node's TOML
        differs from it (once per version). Cheap when nothing changed; thread-safe enough (the
        tick thread and the loop may both call it; each does the same)."""
        m = self.state.machine
        seen = (m.limits, m.config_version)
        if seen == self._config_seen:
            return
        self._config_seen = seen
        if m.config_version >= 1:
            self.seeded = True
            self.auth.load((name, rec[0], rec[1]) for name, rec in m.keys.items())
        for hook in self.config_hooks:
            try:
                hook(m.limits)
            except Exception:                       # pragma: no cover
                log.exception("config hook failed")
        if m.config_version >= 1 and self._toml_logged != m.config_version:
            self._toml_logged = m.config_version
            differs = self.toml_differences()
            if differs:
                log.warning("this node's TOML differs from the cluster's configuration in force (version %d): %s; "
                            "the node follows the configuration in force (raftq config diff FILE shows it, "
                            "raftq config apply FILE changes it)", m.config_version, ", ".join(differs[:10])
                            + (f" and {len(differs) - 10} more" if len(differs) > 10 else ""))

    def toml_differences(self) -> list[str]:
        """The keys where this node's TOML differs from the configuration in force (after
        version 1; before it the TOML is what is in force)."""
        from ..core.limits import diff_docs
        m = self.state.machine
        if m.config_version < 1:
            return []
        key = (m.limits, m.config_version)
        cached = getattr(self, "_toml_diff", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        out = [k for k, _, _ in diff_docs(m.limits.doc, self.settings.limits.doc)]
        in_force = {name: (rec[0], rec[1]) for name, rec in m.keys.items()}
        for name in sorted(set(in_force) | set(self.toml_keys)):
            if in_force.get(name) != self.toml_keys.get(name):
                out.append(f"auth.api_keys[{name}]")
        self._toml_diff = (key, out)
        return out

    async def _watch_config(self):
        while not self.stopping:
            try:
                self.follow_config()
            except Exception:                       # pragma: no cover
                log.exception("config watch failed")
            await asyncio.sleep(0.2)

    async def _seed(self):
        """The first leader of a new cluster (or of one upgraded from 0.1.0) proposes version 1
        from its TOML; two leaders racing are decided by expect_version 0 at apply."""
        while not self.stopping and not self.is_seeded():
            held = self.settings.testing.hold_seed and fault_hooks.seed_held(self.settings.data_dir)
            if self.replica.is_leader() and not held:
                status, body = await self.proposer.run(validate.seed(self.settings.limits, self.settings.api_keys))
                if status == 200:
                    log.info("configuration version %d seeded from this node's TOML", body["version"])
                    self.follow_config()
                    continue
            await asyncio.sleep(SEED_RETRY_S)

    async def _seed_schedules(self):
        """The TOML's [[schedules]], proposed by a leader once the configuration is seeded until
        the cluster holds the mark that they were applied (once per cluster: schedules.seed_schedules)."""
        while not self.stopping and self.settings.schedules and not self.state.machine.schedules_seeded:
            if self.replica.is_leader() and self.is_seeded():
                status, body = await self.proposer.run(ops.schedule_seed(self.settings.schedules), internal=True)
                if status == 200:
                    if body["created"]:
                        log.info("schedules seeded from this node's TOML: %s", ", ".join(body["created"]))
                    continue
            await asyncio.sleep(SEED_RETRY_S)

    def not_seeded(self):
        return error("unavailable", "the cluster's configuration is being seeded (a new leader of a new cluster); "
                     "retry in a moment", applied=False)

    def slot(self, rid, who, route: str, body, param=None):
        return validate.request_slot(who, rid, route, body, param)
        self.disk_task: asyncio.Task | None = None
        self._check_space()

    # ---------------------------------------------------------------- time and roles
    def stamp(self) -> int:
        """The leader's stamp: wall clock, never behind replicated time or an earlier stamp."""
        now = max(wall_ms() + self.clock_offset_ms, self.state.machine.clock, self.last_stamp)
        self.last_stamp = now
        return now

    def is_leader(self) -> bool:
        return self.replica.is_leader() and not self.stopping and not self.replica.removed

    def leader_url(self) -> str | None:
        if self.replica.removed:
            return None
        raft = self.replica.leader_raft()
        if raft is None:
            return None
        peer = self.replica.member_by_raft(raft) or self.settings.peer_by_raft(raft)
        return peer.url if peer else None

    def others(self):
        """The other members in force."""
        return tuple(p for p in self.replica.members() if p.raft != self.settings.raft)

    async def strobe_loop(self):
        """[testing] clock_strobe (node/replication/fault_hooks.py): while the strobe file is there, the
        clock offset flips between +A and -A every period; stamp() reads the attribute as ever,
        and never goes behind replicated time or an earlier stamp."""
        base = self.clock_offset_ms
        sign = 1
        while not self.stopping:
            strobe = fault_hooks.read_strobe(self.settings.data_dir)
            if strobe is None:
                self.clock_offset_ms = base
                await asyncio.sleep(0.1)
                continue
            amplitude, period = strobe
            end = time.monotonic() + 0.5            # read the file again twice a second
            while time.monotonic() < end and not self.stopping:
                self.clock_offset_ms = base + sign * amplitude
                sign = -sign
                await asyncio.sleep(period / 1000.0)

    # ---------------------------------------------------------------- the data disk
    def _storage_failed(self, failure):
        """A write or sync of the data dir failed (node/raft/journal.py StorageFailure), on the
        Raft tick thread, which has stopped ticking. Nothing is retried and nothing written
        since the last good sync is acknowledged: the process exits at once, and a restart
        reads what the disk really holds (fsyncgate: a retried fsync can report success for
        pages the kernel already dropped)."""
        msg = (f"storage failure: {failure.op} of {failure.path} failed with errno {failure.errno} "
               f"({failure.strerror}); exiting with code {EXIT_STORAGE}, nothing written since the last good sync "
               "is acknowledged; a restart recovers from what the disk holds")
        try:
            log.critical(msg)
            for handler in logging.getLogger().handlers:
                handler.flush()
            print(f"raftq node {self.settings.node_id}: {msg}", file=sys.stderr, flush=True)
        finally:
            os._exit(EXIT_STORAGE)

    def _may_lead(self) -> bool:
        """Asked by Raft before this node stands for election (tick thread): not while its data
        disk is below the reserve."""
        return not self.low_space

    def _check_space(self):
        if self.min_free_bytes <= 0:
            return
        try:
            st = os.statvfs(self.settings.data_dir)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if self.settings.testing.free_space_file:       # [testing]: the disk-full fault without root
            told = fault_hooks.read_free(self.settings.data_dir)
            free = free if told is None else told
        self.free_bytes = free
        low = free < self.min_free_bytes
        if low != self.low_space:
            if low:
                log.warning("the data disk of %s has %d bytes free, below storage.min_free_bytes (%d): writes are "
                            "refused until space is freed", self.settings.data_dir, free, self.min_free_bytes)
            else:
                log.warning("the data disk of %s has %d bytes free again (storage.min_free_bytes %d): writes resume",
                            self.settings.data_dir, free, self.min_free_bytes)
        self.low_space = low
        self.proposer.refusal = None if not low else error(
            "unavailable", f"node {self.settings.node_id}'s data disk has {free} bytes free, below its reserve "
            f"storage.min_free_bytes ({self.min_free_bytes}): writes are refused until space is freed (leadership "
            "moves to a node with space); retry later", applied=False)

    async def disk_loop(self):
        """Watch the free space; while it is below the reserve on the leader, hand leadership to
        a peer that has space and a trusted log (asked over HTTP, every check until it moved: a
        transfer is refused while the peer has not acknowledged the leader's last entry)."""
        last_try = 0.0
        while not self.stopping:
            try:
                self._check_space()
                if self.low_space and self.replica.is_leader() and time.monotonic() - last_try >= DISK_CHECK_S:
                    last_try = time.monotonic()
                    await self._hand_over_leadership()
            except Exception:
                log.exception("disk check loop error")
            await asyncio.sleep(DISK_CHECK_S)

    async def _hand_over_leadership(self):
        import aiohttp
        from ..base.tls import peer_context
        try:
            ssl_ctx = peer_context(self.settings.tls)
        except Exception:
            ssl_ctx = None
        best = None
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=True if ssl_ctx is None else ssl_ctx)) as http:
            for p in self.others():
                if not self.replica.connected(p.raft):
                    continue
                try:
                    async with http.get(p.url + "/v1/cluster?digest=false", timeout=aiohttp.ClientTimeout(total=1)) as r:
                        view = await r.json()
                except Exception:
                    continue
                disk = view.get("disk") or {}
                if disk.get("low_space") or not disk.get("log_verified", True):
                    continue
                free = disk.get("free_bytes") or 0
                if best is None or free > best[0]:
                    best = (free, p)
        if best is None:
            log.warning("leader below its disk reserve, and no peer with space and a trusted log to hand "
                        "leadership to: writes stay refused")
            return
        log.warning("leader below its disk reserve: handing leadership to %s (%d bytes free)", best[1].id, best[0])
        self.replica.transfer_leadership(to=best[1].raft)

    def _on_state_changed_thread(self, old, new):
        try:
            self.loop.call_soon_threadsafe(self._on_state_changed, old, new)
        except RuntimeError:
            pass

    def _on_state_changed(self, old, new):
        self.leader_epoch += 1
        # Role names, not the Raft layer's numbers: an operator reads this line.
        log.info("raft role %s -> %s", RAFT_ROLES.get(old, old), RAFT_ROLES.get(new, new))
        self._wake_all()
        if RAFT_ROLES.get(new) == "leader":
            self.workers_seen.lead()
        elif RAFT_ROLES.get(old) == "leader":
            self.workers_seen.follow()
        if RAFT_ROLES.get(old) == "leader" and RAFT_ROLES.get(new) != "leader":
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
        m = self.state.machine
        if (m.limits, m.config_version) != self._config_seen:
            self.follow_config()            # a config entry: in force here from this index on
        released = m.released
        if released:                        # gating: held-back jobs became reservable
            released = set(released)
            m.released.clear()
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
        m = self.state.machine
        queues = m.queues
        gated = m.limits.gated
        for name in queue_names:
            q = queues.get(name)
            if q is not None and q.ready > q.throttled and not q.paused and (not gated or m.reservable(q)):
                return True
        return False

    # ---------------------------------------------------------------- job operations
    def prepare(self, op: str, body, rid, job_id=None, who=None):
        """The command for one operation (everything but reserve), or an immediate error:
        (cmd, size_hint) or (None, (status, body)). `job_id` comes from the HTTP path; a
        session frame carries it in the body. `rid` is the Request-Id as the client sent it,
        `who` the caller's key name (None without auth)."""
        try:
            limits = self.state.machine.limits          # the configuration in force, applied here
            if op in JOB_ID_OPS:
                if job_id is None:
                    if not isinstance(body, dict):
                        raise ApiError("invalid_argument", "body must be a JSON object with job_id")
                    job_id = body.get("job_id")
                if rid is not None:
                    hashed = {k: v for k, v in body.items() if k != "job_id"} if isinstance(body, dict) else body
                    rid = validate.request_slot(who, rid, op, hashed, job_id)
                if op == "nack":
                    return validate.nack(job_id, body, rid, limits), 64
                if op == "release":
                    return validate.release(job_id, body, rid, limits), 64
                build = validate.ack if op == "ack" else validate.extend
                return build(job_id, body, rid), 64
            if rid is not None:
                rid = validate.request_slot(who, rid, op, body)
            if op == "enqueue":
                return validate.enqueue(body, limits, self.stamp(), _new_id, rid), 256
            if op == "enqueue_batch":
                return validate.enqueue_batch(body, limits, self.stamp(), _new_id, rid), 4096
            if op == "enqueue_atomic":
                return validate.enqueue_atomic(body, limits, self.stamp(), _new_id, rid), 4096
            if op == "ack_batch":
                cmd = validate.ack_batch(body, limits, rid)
                return cmd, 64 * len(ops.ack_batch_pairs(cmd))
            if op == "drain":
                return validate.drain(body, limits, rid, who), 64
        except ApiError as e:
            return None, e.result
        return None, error("invalid_argument", f"unknown op {op!r}")

    # The job operations below are plain functions that return a future to await, not
    # coroutines: each `async def` layer costs a frame and a send() per request on the path
    # every enqueue, reserve and ack takes.
    def run(self, op: str, body, rid=None, job_id=None, who=None) -> asyncio.Future:
        """Prepare and propose one operation: a future of its committed result or the error."""
        cmd, extra = self.prepare(op, body, rid, job_id, who)
        if cmd is None:
            return self.proposer.answered(extra)
        return self.proposer.submit(cmd, extra)

    def enqueue(self, body, rid=None, who=None) -> asyncio.Future:
        return self.run("enqueue", body, rid, None, who)

    def enqueue_batch(self, body, rid=None, who=None) -> asyncio.Future:
        return self.run("enqueue_batch", body, rid, None, who)

    def enqueue_atomic(self, body, rid=None, who=None) -> asyncio.Future:
        return self.run("enqueue_atomic", body, rid, None, who)

    async def reserve(self, body, rid=None, alive=None, owner=None, who=None):
        """A reserve; with `wait_ms`, a long poll that parks until a job may be ready in one of
        its queues. `alive()` says whether the client is still there; `owner` (a session) has
        `parked` and `max_parked`, its own bound on parked reserves; `who` is the caller's key
        name (the request id's scope)."""
        try:
            cmd, wait_ms = validate.reserve(body, self.limits, validate.request_slot(who, rid, "reserve", body))
        except ApiError as e:
            return e.result
        slot = cmd[1]
        queue_names = ops.reserve_queue_names(cmd)
        worker = body.get("worker_id")
        seen = self.workers_seen
        seen.note(queue_names, worker)
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
                if slot is not None and self.state.machine.has_request(slot) or self._has_ready(queue_names):
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
                seen.park(w.names, worker)          # a worker waiting on a queue is there
                try:
                    woken = await fut
                finally:
                    timer.cancel()
                    seen.unpark(w.names, worker)
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

    def ack(self, job_id, body, rid=None, who=None) -> asyncio.Future:
        return self.run("ack", body, rid, job_id, who)

    def ack_batch(self, body, rid=None, who=None) -> asyncio.Future:
        return self.run("ack_batch", body, rid, None, who)

    def nack(self, job_id, body, rid=None, who=None) -> asyncio.Future:
        return self.run("nack", body, rid, job_id, who)

    def extend(self, job_id, body, rid=None, who=None) -> asyncio.Future:
        return self.run("extend", body, rid, job_id, who)

    def release(self, job_id, body, rid=None, who=None) -> asyncio.Future:
        return self.run("release", body, rid, job_id, who)

    def drain(self, body, rid=None, who=None) -> asyncio.Future:
        return self.run("drain", body, rid, None, who)

    # Operator moves: each command carries the caller's name for the audit trail.
    async def requeue(self, body, rid=None, who=None):
        return await self._run(validate.requeue, body, self.slot(rid, who, "requeue", body), who)

    async def delete_dead_letters(self, body, rid=None, who=None):
        return await self._run(validate.delete_dead_letters, body, self.slot(rid, who, "dead_letters_delete", body), who)

    async def cancel(self, job_id, rid=None, who=None):
        return await self._run(validate.cancel, job_id, self.slot(rid, who, "cancel", None, job_id), who)

    async def pause(self, queue, paused: bool, rid=None, body=None, who=None):
        route = "pause" if paused else "resume"
        return await self._run(validate.pause, queue, paused, self.limits,
                               self.slot(rid, who, route, body, queue), body, who)

    async def move_to_dead_letters(self, queue, body, rid=None, who=None):
        return await self._run(validate.move_to_dead_letters, queue, body, self.limits,
                               self.slot(rid, who, "dead_letter_move", body, queue), who)

    async def close_circuit(self, queue, body=None, rid=None, who=None):
        return await self._run(validate.close_circuit, queue, self.limits,
                               self.slot(rid, who, "circuit_close", body, queue), who)

    async def purge(self, queue, body=None, rid=None, who=None):
        return await self._run(validate.purge, queue, self.limits, self.slot(rid, who, "purge", body, queue), who)

    async def delete_queue(self, queue, rid=None, who=None):
        return await self._run(validate.delete_queue, queue, self.limits,
                               self.slot(rid, who, "queue_delete", None, queue), who)

    async def put_config(self, body, rid=None, who=None):
        return await self._run(validate.configure, body, self.slot(rid, who, "config", body), who)

    async def add_key(self, body, rid=None, who=None):
        return await self._run(validate.add_key, body, self.slot(rid, who, "key_add", body), who)

    async def remove_key(self, name, rid=None, who=None):
        return await self._run(validate.remove_key, name, self.slot(rid, who, "key_remove", None, name), who)

    # ---------------------------------------------------------------- schedules
    async def put_schedule(self, name, body, rid=None, who=None):
        return await self._run(validate_schedule.put, name, body, self.limits, self.stamp(),
                               self.slot(rid, who, "schedule_put", body, name), who)

    async def delete_schedule(self, name, query, rid=None, who=None):
        version = query.get("expect_version")
        return await self._run(validate_schedule.delete, name, version,
                               self.slot(rid, who, "schedule_delete", version, name), who)

    async def pause_schedule(self, name, paused: bool, body=None, rid=None, who=None):
        route = "schedule_pause" if paused else "schedule_resume"
        return await self._run(validate_schedule.pause, name, paused, self.slot(rid, who, route, body, name), who)

    async def trigger_schedule(self, name, body=None, rid=None, who=None):
        return await self._run(validate_schedule.trigger, name, _new_id,
                               self.slot(rid, who, "schedule_trigger", body, name), who)

    def schedules(self, query):
        limit = _page_limit(query)
        if limit is None:
            return error("invalid_argument", "limit must be an integer 1..100")
        with self.state.lock:
            page, nxt = self.state.machine.list_schedules(limit, query.get("cursor") or None)
        return 200, {"schedules": page, "next_cursor": nxt}

    def schedule(self, name):
        with self.state.lock:
            view = self.state.machine.schedule_view(name)
        if view is None:
            return error("not_found", f"no schedule named {name!r}", name=name)
        return 200, view

    async def _run(self, build, *args):
        try:
            cmd = build(*args)
        except ApiError as e:
            return e.result
        return await self.proposer.run(cmd)

    # ---------------------------------------------------------------- sweeps
    async def sweep_loop(self):
        """While leader: propose a sweep when something is due, at most once per
        sweep_interval_ms unless a phase hit its budget. Nothing due, nothing proposed: an idle
        cluster with a large backlog (dedup records due in a day) keeps its applied index still,
        so its nodes' digests (seconds to compute at a million jobs) can be compared at all."""
        last = -1e9
        while not self.stopping:
            interval = self.limits.sweep_interval_ms / 1000.0      # the configuration in force
            delay = interval
            try:
                if self.replica.is_leader():
                    m = self.state.machine
                    due = m.next_due_ms()
                    # The replicated clock never goes backwards: due by it is due.
                    now = max(wall_ms() + self.clock_offset_ms, m.clock)
                    mono = self.loop.time()
                    if due is not None and due <= now and mono - last >= min(interval, 0.05):
                        last = mono
                        status, body = await self.proposer.run(validate.sweep(), internal=True)
                        self.stats["sweeps"] += 1
                        if status == 200 and any(v >= self.limits.sweep_limit for v in body.values()):
                            delay = 0            # a phase hit its budget: go again at once
                            last = -1e9
                            continue
                        due = m.next_due_ms()
                        now = max(wall_ms() + self.clock_offset_ms, m.clock)
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
        removed = r.removed
        if leader_raft is not None and not removed:
            p = r.member_by_raft(leader_raft) or self.settings.peer_by_raft(leader_raft)
            if p is not None:
                leader = {"id": p.id, "url": p.url}
        members = []
        for p in r.members():       # the membership in force (changed online, or the TOML's seed)
            members.append({"id": p.id, "url": p.url, "raft": p.raft, "raft_addr": p.raft,
                            "connected": r.connected(p.raft)})
        with self.state.lock:
            applied = r.applied_index()
            cached_at, digest = self._digest_cache
            digest_index = applied
            if not with_digest:
                digest = digest_index = None
            elif cached_at != (applied, self.state.machine.applied):
                digest = self.state.machine.digest()
                self._digest_cache = ((applied, self.state.machine.applied), digest)
            machine_counts = self.state.machine.counts()
            config_version = self.state.machine.config_version
        toml_differs = bool(self.toml_differences())
        return 200, {"node_id": self.settings.node_id, "role": role,
                     "leader": leader, "term": term, "commit_index": status["commit_index"],
                     "last_applied": applied, "members": members, "ready": self.ready(),
                     "removed": removed, "membership_change": self.member_change_doing,
                     "digest": digest, "digest_index": digest_index, "durability": self.settings.durability,
                     "limits_fingerprint": self.limits.fingerprint(), "config_version": config_version,
                     "toml_differs": toml_differs, "state": machine_counts,
                     "cpu": r.cpu(), "proposer": dict(self.proposer.stats), "journal_syncs": r.syncs,
                     "disk": self.disk(),
                     "event_loop": "uvloop" if type(self.loop).__module__.startswith("uvloop") else "asyncio"}

    async def cluster_with_digest(self):
        """`cluster(True)` without hashing a large state on the event loop or making the caller
        wait for it. A state of more than `tuning.digest_inline_max_entries` entries (5,000:
        ~20 ms inline, less than a fork costs) is hashed in a child forked at a tick boundary
        (Replica.fork_at_tick); at 1M jobs that takes tens of seconds of CPU. The view carries
        the newest digest this node has and `digest_index`, the applied index it belongs to:
        when that is older than `last_applied`, a new child is started (one at a time) and the
        caller is answered at once with the older pair, so a poller sees the digest catch up
        instead of waiting for it. Only a node that has never hashed its state makes the caller
        wait, for the first digest. A new child starts no sooner after the last one ended than
        that one took: pollers asking for the digest of a busy large state keep a child busy at
        most half the time (each costs a core while it runs, and its fork stalls the node for as
        long as the kernel takes to copy the page tables: tens of ms at 1.6 GB)."""
        m = self.state.machine
        with self.state.lock:
            key = (self.replica.applied_index(), m.applied)
            small = len(m.jobs) + len(m.rids) + len(m.dlq) <= self.settings.tuning["digest_inline_max_entries"]
        if small or self._digest_cache[0] == key:
            return self.cluster(True)
        if (self._digest_job is None or self._digest_job.done()) and (
                self._digest_cache[0] is None or self.loop.time() >= self._digest_next_at):
            self._digest_job = self.loop.create_task(self._forked_digest())
            self._digest_job.add_done_callback(_log_digest_failure)
        if self._digest_cache[0] is None:
            await asyncio.shield(self._digest_job)
        (index, _applied), digest = self._digest_cache
        status, view = self.cluster(False)
        view["digest_index"], view["digest"] = index, digest
        return status, view

    async def _forked_digest(self):
        started = self.loop.time()
        try:
            return await self._forked_digest_once()
        finally:
            self._digest_next_at = 2 * self.loop.time() - started

    async def _forked_digest_once(self):
        rfd, wfd = os.pipe()

        def work(machine) -> int:           # in the child, which keeps wfd alone (fork_at_tick)
            os.write(wfd, f"{machine.applied} {machine.digest()}".encode())
            return 0
        try:
            pid, index, _ = await self.replica.forked_at_tick(self.loop, work, keep_fds=(wfd,))
        except BaseException:
            os.close(rfd)
            os.close(wfd)
            raise
        os.close(wfd)

        def collect() -> bytes:
            try:
                chunks = []
                while chunk := os.read(rfd, 4096):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(rfd)
                os.waitpid(pid, 0)
        raw = await self.loop.run_in_executor(None, collect)
        applied, digest = raw.decode().split()
        self._digest_cache = ((index, int(applied)), digest)
        return index, int(applied), digest

    def disk(self) -> dict:
        d = self.replica.disk()
        d.update(free_bytes=self.free_bytes, min_free_bytes=self.min_free_bytes, low_space=self.low_space)
        return d

    def ready(self) -> bool:
        """/readyz, `ready` in /v1/cluster, `raftq up`: this node can take writes now (docs/api.md
        "Health"): a member, a leader known, caught up with it, and the cluster's configuration
        seeded (before that every write answers 503)."""
        r = self.replica
        return not r.removed and r.leader_raft() is not None and r.caught_up() \
            and r.syncobj.logUnverified is None and self.is_seeded()

    def _with_workers(self, stats: dict) -> dict:
        """The leader's soft state next to the replicated stats: `workers`, `no_workers` (null
        on a follower and in a new leader's first window: node/service/workers_seen.py)."""
        stats["workers"], stats["no_workers"] = self.workers_seen.stats(stats["name"])
        return stats

    def queues(self):
        with self.state.lock:
            m = self.state.machine
            out = [m.queue_stats(n) for n in m.queue_names()]
        self.workers_seen.prune()
        return 200, {"queues": [self._with_workers(q) for q in out if q is not None]}

    def queue(self, name):
        with self.state.lock:
            stats = self.state.machine.queue_stats(name)
            limits = self.limits
        if stats is None:
            if name in limits.queues or not limits.strict_queues:
                with self.state.lock:
                    stats = self.state.machine.gating_view(name, Queue(name).stats(name in limits.queues))
            else:
                return error("not_found", f"queue {name!r} is not declared", queue=name)
        self.workers_seen.prune()
        self._with_workers(stats)
        stats["limits"] = limits.queue(name).describe()
        return 200, stats

    def config(self):
        with self.state.lock:
            return 200, self.state.machine.config_view()

    def keys(self):
        with self.state.lock:
            return 200, {"keys": self.state.machine.keys_view(), "version": self.state.machine.config_version}

    def audit(self, query):
        page, bad = _page_args(query, int)
        if bad:
            return bad
        limit, before = page
        with self.state.lock:
            entries, nxt = self.state.machine.audit_page(limit, before)
        return 200, {"entries": entries, "next_cursor": str(nxt) if nxt is not None else None}

    def queue_jobs(self, name, query):
        state = query.get("state", "ready")
        states = {"ready": READY, "scheduled": SCHEDULED, "in_flight": IN_FLIGHT}
        if state not in states:
            return error("invalid_argument", "state must be ready, scheduled or in_flight")
        page, bad = _page_args(query, lambda c: tuple(int(x) for x in c.split(".")))
        if bad:
            return bad
        limit, after = page
        with self.state.lock:
            jobs, nxt = self.state.machine.list_jobs(name, states[state], limit, after)
        return 200, {"jobs": jobs, "next_cursor": ".".join(str(x) for x in nxt) if nxt else None}

    def queue_keys(self, name, query):
        """GET /v1/queues/{name}/keys: the queue's keys, most ready jobs first, a page at a time
        (node/core/keys.py `view`); the cursor is the last row's [ready, key], opaque."""
        page, bad = _page_args(query, _key_cursor_decode)
        if bad:
            return bad
        limit, after = page
        with self.state.lock:
            page = self.state.machine.key_page(name, limit, after)
        if page is None:
            return error("not_found", f"queue {name!r} neither exists nor is declared", queue=name)
        rows, nxt = page
        return 200, {"keys": rows, "next_cursor": _key_cursor_encode(nxt) if nxt else None}

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
        cause = query.get("cause")      # present, it must name a cause (empty too: a typo, not "all")
        if cause is not None and cause not in DEAD_LETTER_CAUSES:
            return error("invalid_argument", f"cause must be one of {', '.join(DEAD_LETTER_CAUSES)}")
        with self.state.lock:
            records, nxt = self.state.machine.list_dead_letters(queue, limit, cursor, cause)
        return 200, {"records": records, "next_cursor": nxt}

    async def cluster_nodes(self, authorization: str | None):
        """Every member's own view (`GET /v1/cluster?digest=false` on each), asked by this node
        at once, so that one page served by one node can show them all (a browser page may
        only call its own origin). The caller's Authorization goes along: the peers check the
        key themselves, as they would the caller's own request."""
        import aiohttp
        from ..base.tls import peer_problem
        _, mine = self.cluster(False)
        headers = {"Authorization": authorization} if authorization else {}
        timeout = aiohttp.ClientTimeout(total=PEER_VIEW_TIMEOUT_S)

        async def one(peer):
            if peer.id == self.settings.node_id:
                return mine, None
            try:
                http = self._peer_http()
                async with http.get(peer.url + "/v1/cluster?digest=false", headers=headers,
                                    allow_redirects=False, timeout=timeout) as r:
                    body = await r.json(content_type=None)
                    if r.status != 200 or not isinstance(body, dict):
                        code = ((body or {}).get("error") or {}).get("code") if isinstance(body, dict) else None
                        return None, f"answered {r.status}" + (f" {code}" if code else "")
                    return body, None
            except asyncio.TimeoutError:
                return None, f"no answer within {PEER_VIEW_TIMEOUT_S:g} s"
            except Exception as e:
                why = peer_problem(e)
                if why is None:
                    cause = getattr(e, "os_error", e)
                    why = ("connection refused" if isinstance(cause, ConnectionRefusedError)
                           else f"cannot connect: {getattr(cause, 'strerror', None) or cause}"
                           if isinstance(e, (aiohttp.ClientConnectorError, OSError)) else f"{type(e).__name__}: {e}")
                return None, why

        members = self.replica.members()
        answers = await asyncio.gather(*(one(p) for p in members))
        views = [v for v, _ in answers if v is not None]
        top = max((v.get("commit_index") or 0 for v in views), default=0)
        nodes = []
        for peer, (view, why) in zip(members, answers):
            node = {"id": peer.id, "url": peer.url, "reachable": view is not None, "error": why}
            if view is not None:
                others = [m for m in view.get("members", []) if m.get("id") != peer.id]
                leader = view.get("leader")
                node.update(role=view.get("role"), term=view.get("term"), commit_index=view.get("commit_index"),
                            last_applied=view.get("last_applied"), ready=view.get("ready"),
                            leader_id=leader.get("id") if isinstance(leader, dict) else None,
                            peers_connected=sum(1 for m in others if m.get("connected")), peers=len(others),
                            durability=view.get("durability"),
                            lag=max(0, top - (view.get("last_applied") or 0)))
            nodes.append(node)
        return 200, {"node_id": self.settings.node_id, "nodes": nodes}

    def _peer_http(self):
        """One HTTP client for calls to the other nodes, made on first use (https peers: the
        tls_peer_ca trust and this node's certificate, as for the limits check)."""
        if self._peer_session is None or self._peer_session.closed:
            import aiohttp
            from ..base.tls import peer_context
            ctx = peer_context(self.settings.tls)
            self._peer_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=True if ctx is None else ctx, limit_per_host=4))
        return self._peer_session

    # ---------------------------------------------------------------- lifecycle
    def start(self, on_fatal=None):
        if self.settings.testing.sweeps:
            self.sweeper = self.loop.create_task(self.sweep_loop())
        self.seeder = self.loop.create_task(self._seed())
        self.schedule_seeder = self.loop.create_task(self._seed_schedules())
        self.config_watch = self.loop.create_task(self._watch_config())
        self.disk_task = self.loop.create_task(self.disk_loop())
        if self.settings.testing.clock_strobe:
            self.strober = self.loop.create_task(self.strobe_loop())

    async def stop(self, transfer_timeout_s: float = 3.0):
        """Stop taking requests, hand leadership over if leader, let in-flight work finish."""
        self.stopping = True
        self._wake_all()
        if self.replica.is_leader() and len(self.replica.members()) > 1:
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
        for task in (self.sweeper, self.seeder, self.schedule_seeder, self.config_watch):
            if task:
                task.cancel()
        if self._peer_session is not None:
            await self._peer_session.close()
        if self.disk_task:
            self.disk_task.cancel()
        if self.strober:
            self.strober.cancel()
        self.replica.destroy()
