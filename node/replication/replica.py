"""The state machine inside Raft: the replicated consumer, its SyncObj, and what the node reads
of Raft.

Raft is raftq's fork of pysyncobj 0.3.17 in node/raft (node/raft/FORK.md says what changed and
why). This module is the only one outside node/raft that imports it: the rest of the node goes
through `Replica` (and `QueueState`, `FAIL_REASON`).

Threads: the fork's tick thread does all Raft work and runs `apply_batch` on every node; the
asyncio loop only proposes and reads. `lock` keeps readers from seeing a half-applied batch.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import io
import json
import logging
import os
import signal
import threading
import time
import zlib

import cryptography  # noqa: F401 - a node needs the server extra (the Raft link's AES-GCM), said at import

from . import fault_hooks, sync_shadow
from ..core.invariants import InvariantViolation
from ..core.machine import QueueMachine
from ..raft import pickle as raft_pickle
from ..raft import _RAFT_STATE, FAIL_REASON, StorageFailure, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from ..raft.serializer import atomicReplace, detachForkedChild
from ..base.settings import Peer, Settings

__all__ = ["FAIL_REASON", "QueueState", "Replica", "StorageFailure"]

log = logging.getLogger("raftq.replica")

# How far behind the leader's reported commit index a node may be and still be ready (/readyz).
READY_MAX_LAG = 64
# [testing] check_invariants skips its checks while the applies are further behind than a
# node that is ready (/readyz) may be: a replay, a catch-up.
REPLAY_LAG = READY_MAX_LAG

# The membership in force, as this node last saw it change (docs/cluster.md "Membership changes"):
# read at start instead of the TOML's peer list once it exists.
MEMBERS_FILE = "members.json"


def read_members_file(data_dir) -> dict | None:
    """{"members": [Peer, ...], "removed": bool} from the data dir, or None when there is none
    (a new node, or one from before online membership change: the TOML's peers are in force)."""
    path = os.path.join(str(data_dir), MEMBERS_FILE)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        members = tuple(Peer(m["id"], m["raft"], m["url"]) for m in doc["members"])
        return {"members": members, "removed": bool(doc.get("removed", False))}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.error("%s is unreadable (%s): using the TOML's peer list", path, e)
        return None


def write_members_file(data_dir, members, removed: bool, durable: bool) -> None:
    path = os.path.join(str(data_dir), MEMBERS_FILE)
    tmp = path + ".tmp"
    doc = {"members": [{"id": p.id, "raft": p.raft, "url": p.url} for p in members], "removed": removed}
    with open(tmp, "wb") as f:
        f.write(json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n")
    atomicReplace(tmp, path, fsync=durable)     # synced before the rename, its directory after

RAFT_ROLES = {_RAFT_STATE.FOLLOWER: "follower", _RAFT_STATE.CANDIDATE: "candidate", _RAFT_STATE.LEADER: "leader"}

# Class paths that snapshots written before the builtins format (release 0.1.0's `node.*`, and
# `raftq.node.*` from the one-package layout until the fork) name for the machine; each is read
# as an inert stand-in (node/raft/serializer.py LegacyObject) and nothing else is accepted.
LEGACY_SNAPSHOT_CLASSES = tuple((f"{package}.{module}", name)
                                for package in ("node", "raftq.node")
                                for module, name in (("machine", "QueueMachine"), ("limits", "Limits"),
                                                     ("limits", "QueueLimits")))


# ---------------------------------------------------------------------------- snapshots in parts
# The machine's longest lists written as compressed chunks, read back one chunk at a time while
# the machine is built (docs/performance.md "Snapshots at 1M"). A snapshot document loaded whole
# holds every job twice over while the machine is built from it (a 23-field row per job beside
# the job), and CPython keeps the arenas the rows took while any object the machine keeps sits in
# them. So the `jobs`, `dedup` and `rids` rows are written as chunks of `CHUNK_ROWS` rows, each a
# builtins-only pickle compressed with zlib (level 1), and a restore decodes a chunk only when
# the one before it is built into the machine. The document is then {"machine": the builtins
# without those lists, "packed": {name: [chunk, ...]}, "limits_fingerprint": ...}; one without
# "packed" (every snapshot before this format, and a backup) is read as before.
PACKED = ("jobs", "dedup", "rids")
CHUNK_ROWS = 4096
# The dedup heap's rows are written for readers older than this format (node/core/snapshot.py),
# which cannot read a packed document anyway: a packed one leaves them out.
FOR_OLDER_READERS = ("dedup_heap",)


def pack_machine(machine: dict) -> tuple[dict, dict]:
    """(the machine's builtins without its long lists, {name: chunks}) of `to_builtins` data."""
    rest = {k: v for k, v in machine.items() if k not in PACKED and k not in FOR_OLDER_READERS}
    return rest, {name: _chunks(machine[name]) for name in PACKED}


def _chunks(rows: list) -> list[bytes]:
    out = []
    for i in range(0, len(rows), CHUNK_ROWS):
        f = io.BytesIO()
        raft_pickle.dumpBuiltins(rows[i:i + CHUNK_ROWS], f)
        out.append(zlib.compress(f.getvalue(), 1))
    return out


def machine_of(doc: dict, consume: bool = False) -> dict:
    """The machine builtins of a replica's snapshot document, packed or not. `consume`: the long
    lists come back as iterators that decode a chunk at a time and let each chunk and row go
    once handed out (for `from_builtins(consume=True)`); else as lists (for a reader that looks)."""
    packed = doc.get("packed")
    if packed is None:
        return doc["machine"]
    machine = dict(doc["machine"])
    for name in PACKED:
        rows = _rows(packed[name], consume)
        machine[name] = rows if consume else list(rows)
    return machine


def _rows(chunks: list, consume: bool):
    for k in range(len(chunks)):
        rows = raft_pickle.loadsBuiltins(zlib.decompress(chunks[k]))
        if consume:
            chunks[k] = None
        for i in range(len(rows)):
            row = rows[i]
            if consume:
                rows[i] = None
            yield row


def _trim_heap() -> None:
    """After a restore: give the heap memory the snapshot's document left free back to the system
    (glibc keeps it otherwise; about 5 % of a restored node's memory at 200,000 jobs,
    docs/performance.md "Snapshots at 1M"). Nothing elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _run_hook(hook, what: str) -> None:
    """Call a node's hook (None: none set) on the tick thread; what it raises is logged, never
    let into pysyncobj (an exception there would stop this node's ticks)."""
    if hook is not None:
        try:
            hook()
        except Exception:                               # pragma: no cover
            log.exception("%s hook failed", what)


class QueueState(SyncObjConsumer):
    """The replicated consumer. Attributes set before `SyncObjConsumer.__init__` are not
    replicated state, which is where the lock and the hooks belong. Its one replicated method,
    `apply_batch`, keeps method id 0 (ids come from the sorted names of replicated methods):
    journals written by earlier releases replay."""

    _legacySnapshotClasses = LEGACY_SNAPSHOT_CLASSES

    def __init__(self, limits):
        self.lock = threading.Lock()
        self.limits = limits
        self.after_apply = None          # called on the tick thread after each applied batch
        self.after_restore = None        # called on the tick thread after a snapshot replaced the state
        self.apply_cpu_s = 0.0           # CPU spent in the state machine (for the benchmark split)
        self.applied_index = 0           # the Raft index of the last entry apply_batch applied
        # [testing] check_invariants: the checks' budget in entries (0: no checks), the entries
        # applied since the last check, the violations found, the problems last logged.
        self.check_invariants = 0
        self.since_check = 0
        self.invariant_violations = 0
        self._problems_said = None
        super().__init__()
        self.machine = QueueMachine(limits)

    @replicated
    def apply_batch(self, now_ms, cmds):
        # Never raises: QueueMachine.apply_batch answers `internal` for a broken command and
        # reverts it; this guard covers anything around it, because an exception here would
        # wedge every node of the cluster for good.
        try:
            t0 = time.thread_time()
            with self.lock:
                machine = self.machine
                # Answers nobody on this node reads (a follower's, or entries of an earlier
                # leader) are not rendered.
                machine.render = self._syncObj.answerWanted
                results = machine.apply_batch(now_ms, cmds)
                # The entry this is (Raft counts it applied only after this returns, outside
                # the lock): Replica.applied_index pairs the state with its index.
                self.applied_index = self._syncObj.raftLastApplied + 1
            self.apply_cpu_s += time.thread_time() - t0
        except Exception:                               # pragma: no cover - defence in depth
            log.exception("apply_batch failed outside the state machine")
            results = [(500, {"error": {"code": "internal", "message": "apply failed"}})] * len(cmds)
        if self.check_invariants:
            self._check_invariants()
        hook = self.after_apply
        if hook is not None:
            try:
                hook(cmds, results)
            except Exception:                           # pragma: no cover
                log.exception("after_apply hook failed")
        return results

    def _check_invariants(self):
        """[testing] check_invariants = N: the core's invariant checks (node/core/invariants.py)
        after an applied entry, on the tick thread (the only one that changes the machine), outside
        the lock. O(state): after every entry while the state holds at most N entries (jobs, dead
        letters, request ids), beyond that after every ceil(entries / N)-th, so a check costs about
        N entries' worth per applied entry. A violation never raises into the apply path: it is
        counted (`invariant_violations` in GET /v1/cluster) and logged CRITICAL with the problems
        (once while they stay the same). While the applies are more than REPLAY_LAG (64) entries behind
        the commit index (a restart's replay, a catch-up) no check runs; the first entry applied
        after it is checked: a replay with the checks took ten times as long, and kept a
        cluster whose nodes all restarted without a leader that could answer."""
        m = self.machine
        budget = self.check_invariants
        size = len(m.jobs) + len(m.dlq) + len(m.rids)
        self.since_check += 1
        if size > budget and self.since_check * budget < size:
            return
        s = self._syncObj
        if s is not None and s.raftCommitIndex - s.raftLastApplied > REPLAY_LAG:
            return          # a replay: checked once it has caught up (since_check has grown)
        self.since_check = 0
        failed = False
        try:
            m.check_invariants()
        except InvariantViolation as e:
            problems = str(e)
        except Exception as e:                          # noqa: BLE001 - a bug in the checks: said as loudly
            problems, failed = f"the invariant checks themselves failed: {e!r}", True
        else:
            self._problems_said = None
            return
        self.invariant_violations += 1
        if problems != self._problems_said:
            self._problems_said = problems
            log.critical("invariant violation after applied entry %d (%d so far): %s", self.applied_index,
                         self.invariant_violations, problems.replace("\n", "; "), exc_info=failed)

    # ---------------------------------------------------------------- snapshots
    def _serialize(self):
        # Runs in the snapshot child the fork forks off the tick thread: builtins only.
        # The long lists in compressed parts, read back a part at a time (pack_machine, above).
        machine, parts = pack_machine(self.machine.to_builtins())
        return {"machine": machine, "packed": parts, "limits_fingerprint": self.limits.fingerprint()}

    def _deserialize(self, data):
        # Read just now: ours to let go of as the machine is built.
        machine = QueueMachine.from_builtins(self.limits, machine_of(data, consume=True), consume=True)
        if machine.config_version == 0:
            # No configuration in the snapshot (release 0.1.0, or a cluster not seeded yet): its
            # entries ran under the bootstrap, which is this node's TOML. From version 1 on the
            # snapshot carries the configuration in force, and the TOML has no say.
            written = data.get("limits_fingerprint")
            if written is not None and written != self.limits.fingerprint():
                log.warning("snapshot was written with different limits; using this node's limits")
        with self.lock:
            self.machine = machine
        _trim_heap()
        # The keys and configuration in force came with it: a node that lost its data dir must
        # not answer under its TOML's (maybe no keys) a moment longer than it holds no state.
        _run_hook(self.after_restore, "after_restore")

    def _upgradeLegacySnapshot(self, data):
        # A snapshot of the pickled-objects format: {"machine": QueueMachine}, whose pickled
        # state (QueueMachine.__getstate__) was {"limits": Limits, "state": to_builtins()}. The
        # limits always came from this node's config.
        return {"machine": data["machine"].state["state"], "limits_fingerprint": None}


class Replica:
    """One node's SyncObj around a QueueState, and every view of Raft the node needs."""

    def __init__(self, settings: Settings, on_state_changed=None, on_ready=None, on_storage_failure=None,
                 election_eligible=None, accept_damaged_log: bool = False, loop=None):
        """`on_storage_failure(StorageFailure)`: called on the Raft tick thread when a write or
        sync of the data dir failed (the thread stops ticking); `election_eligible() -> bool`:
        asked before this node stands for election."""
        self.settings = settings
        self.state = QueueState(settings.limits)
        self.state.check_invariants = settings.testing.check_invariants
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        initial = self._members_at_start(settings)
        self.members_lock = threading.Lock()
        self._members = tuple(sorted(initial, key=lambda p: p.id))
        self.removed = self.removed_at_start
        self.on_members_changed = None      # called on the tick thread after a change (the service's hook)
        # () -> bool, asked on the tick thread (the service's hook): whether this node, as a
        # follower, wants to learn a moved commit index at once (long polls parked on it)
        self.commit_wanted = None
        self.shadow = None
        observers = []
        if settings.testing.sync_shadow:    # [testing]: the power-loss test hook (node/replication/sync_shadow.py)
            self.shadow = sync_shadow.SyncShadow(settings.data_dir, settings.durability,
                                                 settings.testing.sync_shadow_writeback_s)
            observers.append(self.shadow)
        if settings.testing.fsync_eio:      # [testing]: the fsync-EIO test hook (node/replication/fault_hooks.py)
            observers.append(fault_hooks.FailingSync(settings.data_dir))
        conf = self._conf(settings, initial, observers, on_state_changed, on_ready, on_storage_failure,
                          election_eligible, accept_damaged_log)
        others = [p.raft for p in initial if p.raft != settings.raft]
        self.engine = settings.tuning["raft_engine"]
        if self.engine == "loop":     # the Ready loop on the node's event loop (node/raft/loop.py)
            from ..raft.loop import LoopSyncObj
            self.syncobj = LoopSyncObj(loop, settings.raft, others, conf, [self.state])
        else:
            self.syncobj = SyncObj(settings.raft, others, conf=conf, consumers=[self.state])
        if self.removed_at_start:
            # Removed from the cluster before this start: Raft is not run at all (the peers
            # refuse this node; it would only knock at their doors).
            log.warning("this node (%s) was removed from the cluster (recorded in %s): it does not run Raft "
                        "and serves nothing; to make it a member again, empty its data dir and add it",
                        settings.node_id, MEMBERS_FILE)
            self.syncobj.destroy()
        if self.shadow is not None:
            self.syncobj.addOnTickCallback(self.shadow.tick)     # memory mode: the simulated page writeback
        self._fork_requests: list = []   # (work, keep_fds, Future) for the next tick: fork_at_tick
        self._fork_lock = threading.Lock()
        self.syncobj.addOnTickCallback(self._fork_tick)

    def _members_at_start(self, settings: Settings) -> tuple[Peer, ...]:
        """The membership in force: the data dir's record of the last change, else the TOML's
        peers (they only seed a new cluster). A TOML that lists other peers is said once."""
        stored = read_members_file(settings.data_dir)
        initial = tuple(settings.peers)
        self.removed_at_start = False
        if stored is not None:
            if stored["removed"]:
                self.removed_at_start = True
            elif {(p.id, p.raft, p.url) for p in stored["members"]} != {(p.id, p.raft, p.url) for p in settings.peers}:
                log.warning("this node's TOML lists the peers %s, but the membership in force (changed online, "
                            "recorded in %s) is %s: the node follows the membership in force",
                            ", ".join(f"{p.id}={p.raft}" for p in settings.peers), MEMBERS_FILE,
                            ", ".join(f"{p.id}={p.raft}" for p in stored["members"]))
            if any(p.raft == settings.raft for p in stored["members"]):
                initial = stored["members"]
        return initial

    def _conf(self, settings: Settings, initial, observers, on_state_changed, on_ready, on_storage_failure,
              election_eligible, accept_damaged_log) -> SyncObjConf:
        """The Raft fork's configuration from the node's settings (its [tuning] timers and bounds)."""
        t = settings.tuning
        return SyncObjConf(
            journalFile=str(settings.data_dir / "raft.journal"),
            fullDumpFile=str(settings.data_dir / "raft.dump"),
            password=settings.secret,
            bindAddress=settings.raft,
            autoTickPeriod=t["auto_tick_period_s"],
            appendEntriesPeriod=t["append_entries_period_s"],
            raftMinTimeout=t["raft_min_timeout_s"],
            raftMaxTimeout=t["raft_max_timeout_s"],
            leaderFallbackTimeout=t["leader_fallback_timeout_s"],
            connectionRetryTime=t["connection_retry_s"],
            connectionTimeout=max(3.5, t["raft_max_timeout_s"]),
            handshakeTimeout=t["raft_handshake_timeout_s"],
            maxPendingConnections=int(t["raft_max_pending_handshakes"]),
            commandsWaitLeader=False,
            commandsQueueSize=int(t["max_inflight"]),
            logCompactionMinEntries=int(t["log_compaction_min_entries"]),
            logCompactionMinTime=t["log_compaction_min_time_s"],
            journalMemoryBytes=int(t["journal_memory_bytes"]),
            logCompactionSplit=True,
            appendEntriesBatchSizeBytes=1 << 20,
            logCompactionBatchSize=1 << 20,
            sendBufferSize=1 << 21,
            recvBufferSize=1 << 21,
            onStateChanged=on_state_changed,
            onReady=on_ready,
            dynamicMembershipChange=True,
            memberInfo={p.raft: {"id": p.id, "url": p.url} for p in initial},
            onMembershipChanged=self._membership_changed,
            commitWanted=self._commit_wanted,
            dnsCacheTime=t["dns_cache_time_s"],
            dnsFailCacheTime=t["dns_fail_cache_time_s"],
            durability=settings.durability,
            compressionLevel=int(t["raft_compression_level"]),
            dialMap=settings.testing.raft_dial_map,        # [testing]: chaos proxies
            journalObserver=fault_hooks.observer_of(observers),
            onStorageFailure=on_storage_failure,
            acceptDamagedLog=accept_damaged_log,
            electionEligible=election_eligible,
        )

    def _commit_wanted(self) -> bool:
        hook = self.commit_wanted
        return hook is not None and hook()

    # ---------------------------------------------------------------- membership
    def _membership_changed(self):
        """On the tick thread, after Raft's membership changed (appended, rolled back, a
        snapshot loaded, or this node's own removal applied): record it in the data dir, so a
        restart uses it whatever the TOML lists."""
        s = self.syncobj
        members = []
        for raft, info in s.membership.items():
            known = next((p for p in self._members if p.raft == raft), None)
            pid = info.get("id") or (known.id if known else raft)
            url = info.get("url") or (known.url if known else "")
            members.append(Peer(pid, raft, url))
        members.sort(key=lambda p: p.id)
        removed = s.removedFromCluster
        with self.members_lock:
            self._members = tuple(members)
            self.removed = removed
        try:
            write_members_file(self.settings.data_dir, members, removed, self.settings.durability == "fsync")
        except (OSError, StorageFailure) as e:
            log.error("cannot record the membership in %s: %s", MEMBERS_FILE, e)
        log.info("membership in force: %s%s", ", ".join(f"{p.id}={p.raft}" for p in members),
                 "; this node was removed" if removed else "")
        _run_hook(self.on_members_changed, "members")

    def members(self) -> tuple[Peer, ...]:
        """The membership in force as this node knows it (sorted by id)."""
        return self._members

    def member_by_raft(self, raft_addr: str) -> Peer | None:
        for p in self._members:
            if p.raft == raft_addr:
                return p
        return None

    def membership_change_pending(self) -> bool:
        return self.syncobj.membershipChangePending

    def add_learner(self, raft_addr: str) -> None:
        self.syncobj.addLearner(raft_addr)

    def drop_learner(self, raft_addr: str) -> None:
        self.syncobj.dropLearner(raft_addr)

    def learner_match(self, raft_addr: str) -> int | None:
        return self.syncobj.learnerMatchIndex(raft_addr)

    def last_log_index(self) -> int:
        return self.syncobj.raftLastLogIndex

    def add_member(self, peer: Peer, callback) -> None:
        """Propose adding `peer` (a Raft log entry); callback(result, FAIL_REASON) at commit."""
        self.syncobj.addNodeToCluster(peer.raft, callback=callback, info={"id": peer.id, "url": peer.url})

    def remove_member(self, peer: Peer, callback) -> None:
        self.syncobj.removeNodeFromCluster(peer.raft, callback=callback, info={"id": peer.id, "url": peer.url})

    # ---------------------------------------------------------------- online backup
    def fork_at_tick(self, work, *, keep_fds: tuple) -> concurrent.futures.Future:
        """Fork a child at the next tick boundary that runs `work(machine) -> exit code` on the
        state as of the last applied entry and exits; the Future gets (pid, index, term). The
        child must not log (another thread may have held the logging lock at the fork). It
        keeps no descriptor of the node's but stdio and `keep_fds`, and dies with the node's
        tick thread (node/raft/serializer.py `detachForkedChild`). A Future cancelled before
        its tick forks nothing; one the tick has taken can no longer be cancelled."""
        fut = concurrent.futures.Future()
        with self._fork_lock:
            self._fork_requests.append((work, tuple(keep_fds), fut))   # taken within one tick period
        return fut

    async def forked_at_tick(self, loop, work, *, keep_fds: tuple) -> tuple[int, int, int]:
        """`fork_at_tick` awaited on `loop`: (pid, index, term). Cancelled, it leaves no child
        behind and returns only once no fork can still take `keep_fds`, so the caller may close
        them then (a closed descriptor's number is reused at once, by a client's socket as
        likely as anything, and a child forked later would write into that)."""
        forked = self.fork_at_tick(work, keep_fds=keep_fds)
        try:
            return await asyncio.wrap_future(forked)
        except asyncio.CancelledError:
            if not forked.cancel():         # the tick had taken it: the child exists, or the fork failed
                await asyncio.shield(loop.run_in_executor(None, _kill_and_reap_child_of, forked))
            raise

    def _fork_tick(self):
        # On the tick thread, after the tick's applies: the machine is exactly the state of
        # raftLastApplied, and stays so until this returns (applies run on this thread only).
        if not self._fork_requests:
            return
        with self._fork_lock:
            requests, self._fork_requests = self._fork_requests, []
        index, term = self.syncobj.raftLastApplied, self.syncobj.raftCurrentTerm
        parent = os.getpid()
        for work, keep_fds, fut in requests:
            if not fut.set_running_or_notify_cancel():      # its requester went away: no fork
                continue
            try:
                pid = os.fork()
            except OSError as e:
                fut.set_exception(e)
                continue
            if pid == 0:                                        # the child: work, exit
                code = 1
                try:
                    detachForkedChild(parent, keep_fds)
                    code = work(self.state.machine)
                finally:
                    os._exit(code)
            fut.set_result((pid, index, term))

    # ---------------------------------------------------------------- status
    def entry_stages(self):
        """[appended, synced, committed] (perf_counter) of the entry being applied, when it is
        one this node proposed as leader; else None. Only meaningful on the tick thread, inside
        the entry's callback (node/replication/proposer.py STAGES)."""
        return self.syncobj.entryStages

    @property
    def syncs(self) -> int:
        """Journal syncs so far (fsync durability)."""
        return self.syncobj.journalSyncs

    @property
    def raft_refusals(self) -> dict:
        """Raft-port connections refused or closed, by reason, and the handshakes under way
        ('pending'): node/raft/transport.py REFUSALS."""
        return self.syncobj.transportRefusals

    def is_leader(self) -> bool:
        return self.syncobj._isLeader()

    def leader_raft(self) -> str | None:
        s = self.syncobj
        leader = s._getLeader()
        if leader is None:
            return None
        if not s._isLeader():
            # Raft starts an election only while connected to some peer, so a follower cut off
            # from everyone keeps its last leader forever. A leader not heard from for longer
            # than the election timeout is not known any more.
            if s.raftElectionDeadline < time.monotonic():
                return None
        return str(leader.id if hasattr(leader, "id") else leader)

    def raft_role_term(self) -> tuple[str, int]:
        """Role and term as one consistent pair (see SyncObj.raftView)."""
        view = self.syncobj.raftView
        if view is None:
            return self.role(), self.syncobj.raftCurrentTerm
        return RAFT_ROLES.get(view[0], "follower"), view[1]

    def role(self) -> str:
        return RAFT_ROLES.get(self.syncobj.raftState, "follower")

    def last_applied(self) -> int:
        return self.syncobj.raftLastApplied

    def applied_index(self) -> int:
        """The index the machine's state is that of; call with the state lock held. Raft counts
        an entry applied only after apply_batch returned and released the lock, so in between
        the machine already holds entry raftLastApplied + 1. Entries without a command (a new
        leader's no-op) leave the state as it was: it is then that of raftLastApplied."""
        last = self.syncobj.raftLastApplied
        applying = self.state.applied_index
        return applying if applying == last + 1 else last

    def leader_commit_index(self) -> int:
        """The commit index the leader last reported (this node's own on the leader; 0 before
        any was heard)."""
        s = self.syncobj
        leader_commit = s.leaderCommitIndex
        return leader_commit or 0

    def caught_up(self) -> bool:
        """Heard a commit index from a leader, and applied all of it but at most READY_MAX_LAG
        entries. Not "all of it": under load a healthy follower is always a few entries behind
        the leader's last report (the next append is on its way), so /readyz would flap on every
        node and a rolling restart would stop at the first check. A node replaying its journal
        or receiving a snapshot is thousands of entries behind. Before it has heard a leader a
        restarted node knows nothing to be caught up with, and is not ready."""
        s = self.syncobj
        leader_commit = s.leaderCommitIndex
        if leader_commit is None:
            return False
        return s.raftLastApplied >= leader_commit - READY_MAX_LAG

    def connected(self, raft_addr: str) -> bool:
        if raft_addr == self.settings.raft:
            return True
        try:
            for node in self.syncobj.otherNodes:
                if node.id == raft_addr:
                    return bool(self.syncobj.isNodeConnected(node))
        except Exception:
            return False
        return False

    def status(self) -> dict:
        s = self.syncobj
        return {"term": s.raftCurrentTerm, "commit_index": s.raftCommitIndex,
                "last_applied": s.raftLastApplied}

    def cpu(self) -> dict:
        """CPU seconds of this process split by role: HTTP (the event loop thread), Raft (the
        tick thread outside apply; with the loop engine its turns and steps on the loop) and apply
        (the state machine)."""
        out = {"process_s": time.process_time(), "http_s": time.thread_time(), "raft_s": None,
               "apply_s": self.state.apply_cpu_s}
        if self.engine == "loop":       # one thread does it all: the engine counts its own share
            raft = self.syncobj.raft_cpu_s
            out["http_s"] = max(0.0, out["http_s"] - raft)
            out["raft_s"] = max(0.0, raft - self.state.apply_cpu_s)
            return out
        thread = self.syncobj.tickThread
        if thread is not None and thread.ident is not None:
            try:
                tick = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
                out["raft_s"] = max(0.0, tick - self.state.apply_cpu_s)
            except (OSError, AttributeError):
                pass
        return out

    def disk(self) -> dict:
        """What the disk checks found (node/raft: journal, snapshot and meta file checksums) and
        whether this node's log is trusted for voting."""
        s = self.syncobj
        findings: dict[str, int] = {}
        for f in s.diskFindings:
            findings[f["what"]] = findings.get(f["what"], 0) + 1
        unverified = s.logUnverified
        return {"log_verified": unverified is None, "unverified": unverified, "findings": findings,
                "journal_held_bytes": s.journalHeldBytes,
                "last_findings": [{k: f.get(k) for k in ("what", "file", "detail")} for f in s.diskFindings[-5:]]}

    def peer_node(self, raft_addr: str):
        for node in self.syncobj.otherNodes:
            if node.id == raft_addr:
                return node
        return None

    def transfer_leadership(self, callback=None, to: str | None = None):
        """Hand leadership to the peer at Raft address `to` (None: the most caught-up one)."""
        try:
            node = None if to is None else self.peer_node(to)
            if to is not None and node is None:
                return
            self.syncobj.transferLeadership(node, callback=callback)
        except Exception:
            log.exception("leadership transfer failed")

    def destroy(self, wait_s: float = 5.0):
        """Stop the tick thread and close the journal; wait (up to wait_s) until it is closed, so
        the meta file holds the commit index this node knew when the process exits."""
        self.syncobj.destroy()
        thread = self.syncobj.tickThread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait_s)


def write_restored_snapshot(data_dir, machine_builtins: dict, index: int) -> None:
    """`raftq restore`: write `raft.dump` in data_dir as the snapshot of a new cluster whose log
    starts at `index` with the backup's state. The entries it names are in term 1, the first
    term of the new cluster: its first leader's entries (term >= 1) follow them, so terms in the
    log never decrease (the source's term could exceed the new cluster's, and a log whose last
    term is higher than newer entries' would look more up to date than theirs in elections).
    Every node of the new cluster is restored from the same file, so their logs match."""
    from pathlib import Path

    from ..raft.serializer import SNAPSHOT_FORMAT, SNAPSHOT_VERSION, writeDocument
    path = Path(data_dir) / "raft.dump"
    document = {
        "format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION,
        "raft": {"last": (b"", index, 1), "prev": (b"", index - 1, 1), "members": [], "code_version": 0},
        "consumers": [{"machine": machine_builtins, "limits_fingerprint": None}],
    }
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        writeDocument(f, document, 1)           # the checksummed snapshot file (node/raft/serializer.py)
    atomicReplace(tmp, str(path), fsync=True)


def _kill_and_reap_child_of(forked: concurrent.futures.Future) -> None:
    """Once the tick has resolved `forked` (within one tick), kill and reap its child, if any."""
    try:
        pid = forked.result()[0]
    except Exception:                       # noqa: BLE001 - the fork's OSError: no child
        return
    kill_child(pid)
    os.waitpid(pid, 0)


def kill_child(pid: int) -> None:
    """SIGKILL a forked child (one that already exited is left to its waitpid)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
