"""The Ready loop: the pure Raft core (node/raft/core.py) driven on the node's asyncio loop.

`[tuning] raft_engine = "loop"` (docs/configuration.md): instead of pysyncobj's tick thread,
proposals, peers' messages and ticks arrive on the event loop, and each turn takes one `Ready`
from the core and does its I/O in the order the core asks for (core.py's docstring): the
leader's appends leave at once, entries and hard state go to the journal and are synced once,
answers that promise something durable leave after the sync, committed entries are applied and
their proposers called back, `advance`. Everything that arrived during one turn of the loop is
in one Ready: one append, one fdatasync and one message per follower for all of it.

It keeps the fork's files: the journal (node/raft/journal.py FileJournal: same records, meta
file and checks) and snapshots (raft.dump, node/raft/serializer.py, written by a forked child as
the fork does); what it writes, a node of the thread engine reads, and the reverse. `LoopSyncObj` answers the part of SyncObj's interface
that node/replication/replica.py reads, so the rest of the node does not know which engine runs.

Membership changes (docs/cluster.md "Membership changes") are the core's (the configuration in
the log, in force once appended; learners); this module translates them to and from the fork's
journal records and snapshot fields, keeps the Raft link's peers those the core talks to, and
reports the membership to the node as the fork does (`membership`, `removedFromCluster`,
`conf.onMembershipChanged`). The engine of every node of a cluster must be the same (their
messages differ).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import errno
import concurrent.futures
import logging
import os
import random
import time
from types import SimpleNamespace

from . import pickle
from .config import FAIL_REASON
from .core import (ChangeType, ConfChange, Config, CoreInUse, Entry, EntryKind, HardState, NotLeader, RaftCore,
                   RaftState, Refused, Snapshot)
from .encryptor import getEncryptor
from .journal import HOT_BYTES, StorageFailure, createJournal
from .loop_link import Links
from .pickle import loadsBuiltins
from .config import SERIALIZER_STATE
from .serializer import EXIT_EIO, SNAPSHOT_FORMAT, SNAPSHOT_VERSION, LegacyObject, Serializer, atomicReplace, verifyPath

log = logging.getLogger("raftq.raft.loop")

_REGULAR, _NO_OP, _MEMBERSHIP, _VERSION = 0, 1, 2, 3
APPLY_SLICE_S = 0.01        # the longest the loop applies committed entries before it runs anything else
# A node whose applies are more than this many committed entries behind does not stand for
# election: as a leader it would commit its clients' calls but answer them only once its
# state machine caught up (a restart's replay), past their deadlines (docs/cluster.md
# "Raft engines"). A caught-up node is at most a slice's entries behind (replica.py's
# READY_MAX_LAG, the same bound), and one past it stands at the first tick it is back within.
APPLY_LAG_MAX = 64
# When a follower's connection to the leader closes (a killed leader's kernel closes its sockets
# at once) and is not back within LEADER_LOST_GRACE_S (a live leader's is: the dialing side dials
# again at once after a reset), the followers stand in turn LEADER_LOST_STAGGER_S apart instead
# of after an election timeout (core.peerLost; docs/cluster.md "Raft engines"): the first within
# half of it, the next after one more, so that two rarely split the vote.
LEADER_LOST_GRACE_S = 0.1
# a snapshot file's bytes, read to send it to a follower, are kept for its retransmissions, and
# let go this long after the last
SNAPSHOT_CACHE_S = 30.0
LEADER_LOST_STAGGER_S = 0.1
_KINDS = {_REGULAR: EntryKind.REGULAR, _NO_OP: EntryKind.NO_OP, _MEMBERSHIP: EntryKind.MEMBERSHIP,
          _VERSION: EntryKind.REGULAR}


def _command(entry: Entry) -> bytes:
    """The journal's record of an entry: the fork's type byte, then the command."""
    kind = entry.kind
    if kind is EntryKind.REGULAR:
        return entry.data
    if kind is EntryKind.MEMBERSHIP:
        return _fork_change_record(entry.data)
    return b"\x01"


def _fork_change_record(data: bytes) -> bytes:
    """A core membership entry's data (a ConfChange) as the fork's journal record: type byte 2,
    then the pickled ['add' | 'rem', address, address, info] (syncobj.py __membershipRequest), so
    the thread engine replays it (docs/cluster.md "Raft engines")."""
    change = ConfChange.decode(data)
    request = [change.type.value, change.node, change.node]
    if change.info is not None:
        request.append(dict(change.info))
    return bytes([_MEMBERSHIP]) + pickle.dumps(request)


def _core_change_data(record: bytes) -> bytes | None:
    """The fork's membership record (syncobj.py __parseChangeClusterRequest's) as a core
    ConfChange's data; None when it is not one (read as a no-op, as the fork skips it)."""
    try:
        request = loadsBuiltins(bytes(record[1:]))
        node = request[2] if len(request) >= 3 else request[1]
        info = request[3] if len(request) >= 4 and isinstance(request[3], dict) else None
        return ConfChange(ChangeType(request[0]), str(node), info).encode()
    except Exception:                   # noqa: BLE001 - a record this engine cannot read
        return None


def _entry(command: bytes, index: int, term: int) -> Entry:
    kind = _KINDS.get(command[0] if command else _NO_OP, EntryKind.NO_OP)
    if kind is EntryKind.MEMBERSHIP:
        data = _core_change_data(command)
        if data is None:
            log.error("journal entry %d: a membership record that does not read; taken as a no-op", index)
            return Entry(index, term, b"\x01", EntryKind.NO_OP)
        return Entry(index, term, data, kind)
    return Entry(index, term, bytes(command), kind)


class JournalStorage:
    """The core's storage (core.Storage) over the journal: an entry's command read back from
    the file, checked (the journal's CRC, then its index and term: the core let go of only what
    the journal holds)."""

    def __init__(self, journal, path):
        self.journal, self.path = journal, path

    def data(self, index, term):
        j = self.journal
        first = j.firstIndex
        held = first is not None and 0 <= index - first < len(j)
        cmd, idx, t = j[index - first] if held else (None, None, None)
        if (idx, t) != (index, term):
            raise StorageFailure(self.path,
                                 f"read back entry {index} (term {term}): the journal holds {idx} (term {t})",
                                 OSError(errno.EIO, os.strerror(errno.EIO)))
        return _entry(cmd, idx, t).data


class LoopSyncObj:
    """One node's Raft on the event loop; attribute names are SyncObj's where replica.py reads them."""

    def __init__(self, loop, self_addr, others, conf, consumers):
        self.loop = loop
        self.conf = conf
        self.selfAddr = self_addr
        self.consumers = list(consumers)
        self.durable = conf.durability == "fsync"
        self.tick_s = conf.appendEntriesPeriod / 2
        self.answerWanted = True
        self.entryStages = None
        self.tickThread = None
        self.raft_cpu_s = 0.0               # CPU of this loop's Raft work (turns, steps), applies included
        self.raftLastApplied = 0
        self.removedFromCluster = False         # this node applied its own removal (a committed 'rem' of it)
        self.members = sorted([self_addr, *others])     # the members in force and this node (compaction slots)
        self._info = {a: dict(i) for a, i in (conf.memberInfo or {}).items()}   # raft address -> {id, url}
        self.membership = {a: dict(self._info.get(a, {})) for a in self.members}
        self._reported = (self.membership, False)      # what onMembershipChanged last said
        self._last_change = 0                   # the index of the last membership entry written
        self._lead_from = None                  # leading: the log's end when it began (its no-op is there or before)
        self._register(self.consumers)
        self._callbacks: dict = {}          # index -> (term, callback, stamps)
        self._tick_callbacks: list = []
        self._scheduled = False
        self._failed = False
        self._destroyed = False
        self._last_state = RaftState.FOLLOWER
        self._led_term = None               # the term this node leads in
        self.serializer = Serializer(conf.fullDumpFile, 1 << 20, True, self.durable, conf.snapshotCompressionLevel,
                                     [k for c in self.consumers for k in c._legacySnapshotClasses],
                                     self._upgrade_legacy)
        self._last_compaction = time.monotonic()
        self._compacted_at = None           # the `prev` index of the last snapshot written
        self.journal = createJournal(conf.journalFile, self.durable, conf.journalObserver, conf.journalMemoryBytes)
        self.core = self._load(self_addr, others)
        self._voters = self.core.voters
        self.otherNodes = [SimpleNamespace(id=a) for a in sorted(self._voters - {self_addr})]
        enc = getEncryptor(conf.password) if conf.password else None
        self.links = Links(loop, self_addr, sorted(self._voters), enc, self._on_message, dial_map=conf.dialMap,
                           retry_s=min(conf.connectionRetryTime, 0.2), handshake_timeout_s=conf.handshakeTimeout,
                           max_pending=conf.maxPendingConnections, on_lost=self._on_lost)
        self._snapshot_cache, self._snapshot_used = None, 0.0     # the snapshot file's bytes, while sent
        self._syncing = False
        self._to_apply = collections.deque()     # committed, not yet applied (_apply_some)
        self._apply_scheduled = False
        self._sync_thread = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="raft-sync")
                             if os.environ.get("RAFTQ_LOOP_SYNC") == "thread" else None)
        self._tick_handle = None
        self._ticks, self._ticks_per_s = 0, max(1, round(1 / self.tick_s))
        loop.create_task(self._start())

    # ------------------------------------------------------------------ start: what the disk holds
    def _register(self, consumers):
        """The replicated methods' ids, as SyncObj numbers them (sorted names, one id each):
        journals written by either engine replay on the other."""
        self._methodToID, self._idToMethod = {}, {}
        found = []
        for num, c in enumerate(consumers):
            for m in dir(c):
                f = getattr(c, m)
                if callable(f) and getattr(f, "replicated", False) and m != getattr(f, "origName"):
                    found.append((getattr(f, "ver"), num + 1, m, c))
            c._syncObj = self
        for i, (_, _, m, c) in enumerate(sorted(found, key=lambda t: t[:3])):
            self._methodToID[(id(c), m)] = i
            self._idToMethod[i] = getattr(c, m)

    def _getFuncName(self, name):
        return name[1] + "_v0" if isinstance(name, tuple) else name + "_v0"

    def _load(self, self_addr, others) -> RaftCore:
        j = self.journal
        self.diskFindings = self._check_disk()
        if len(j) == 0:
            j.add(b"\x01", 1, j.getCurrentTerm())          # the fork's first entry: every node has it
        snapshot = self._load_snapshot()
        entries = []
        # the commands the journal let go of (older than its newest journal_memory_bytes) the
        # core lets go too, and reads back through it (JournalStorage) when it needs them
        storage = JournalStorage(j, self.conf.journalFile) if hasattr(j, "heldFrom") else None
        held_from = j.heldFrom if storage else 0
        for i in range(len(j)):
            cmd, idx, term = j[i]
            if snapshot is None or idx > snapshot.index:
                entry = _entry(cmd, idx, term)
                if entry.kind is EntryKind.MEMBERSHIP:
                    self._note_change(entry)
                elif i < held_from and entry.kind is EntryKind.REGULAR:
                    entry = Entry(idx, term, None, entry.kind)
                entries.append(entry)
        last = entries[-1] if entries else None
        last_term = last.term if last else (snapshot.term if snapshot else 0)
        unverified, vote = self._judge_disk(last.index if last else snapshot.index)
        commit = j.getRaftCommitIndex() if self.durable else 0
        hs = HardState(max(j.getCurrentTerm(), last_term), vote, commit)
        c = self.conf
        ticks = lambda s: max(1, round(s / self.tick_s))       # noqa: E731
        config = Config(election_timeout_min=ticks(c.raftMinTimeout), election_timeout_max=ticks(c.raftMaxTimeout),
                        heartbeat_interval=2, leader_fallback_timeout=ticks(c.leaderFallbackTimeout),
                        max_append_bytes=c.appendEntriesBatchSizeBytes, retransmit_timeout=max(5, ticks(0.1)),
                        leader_lost_stagger=ticks(LEADER_LOST_STAGGER_S),
                        log_memory_bytes=HOT_BYTES if c.journalMemoryBytes is None else c.journalMemoryBytes)
        claim = unverified.get("claimed_commit", 0) if unverified is not None else None
        applied = snapshot.index if snapshot else 0
        self.raftLastApplied = applied
        return RaftCore(self_addr, frozenset([self_addr, *others]), random.Random(), config, hs, entries,
                        applied=applied, unverifiedClaim=claim, snapshot=snapshot, storage=storage)

    def _check_disk(self) -> list:
        """syncobj.py's __checkDisk: what the journal found, a snapshot that does not verify (moved
        aside), a journal that starts after a snapshot that is not there (discarded)."""
        j, findings = self.journal, list(self.journal.findings)
        dump = self.conf.fullDumpFile
        if dump and os.path.exists(dump):
            problem = verifyPath(dump)
            if problem is not None:
                aside = dump + ".damaged"
                try:
                    os.replace(dump, aside)
                except OSError as e:
                    raise StorageFailure(dump, "rename to .damaged", e)
                findings.append({"what": "snapshot_damaged", "file": dump, "moved_to": aside,
                                 "detail": f"{problem}; moved aside"})
        if dump and len(j) and j[0][1] > 1 and not os.path.exists(dump):
            findings.append({"what": "snapshot_missing", "file": dump,
                             "detail": f"the journal starts at index {j[0][1]}, after a snapshot, and there is no "
                                       f"snapshot: the journal is discarded too ({len(j)} entries)"})
            j.clear()
        return findings

    def _judge_disk(self, last_index):
        """syncobj.py's __judgeDisk: (why the log is not trusted for voting or None, the vote)."""
        j, findings = self.journal, self.diskFindings
        stored = j.getRaftCommitIndex() if self.durable else 0
        if stored > last_index:
            findings.append({"what": "journal_short_of_commit", "file": self.conf.journalFile,
                             "detail": f"the journal ends at index {last_index} but the node knew index {stored} "
                                       "committed"})
        vote = j.getVotedForNodeId()
        if any(f["what"] == "meta_damaged" for f in findings):
            vote = self.selfAddr            # this term's vote is unknown: count it as given
        previous = j.getUnverified()
        info = previous if isinstance(previous, dict) else None
        if findings:
            found = {f["what"] for f in findings} | set((info or {}).get("found", ()))
            claimed = max(stored, (info or {}).get("claimed_commit", 0))
            info = {"since_ms": int(time.time() * 1000), "found": sorted(found), "claimed_commit": claimed}
            j.setUnverified(info)
        for f in findings:
            log.critical("disk check: %s in %s: %s", f["what"], f.get("file"), f["detail"])
        if info is not None and self.conf.acceptDamagedLog:
            log.critical("disk check: the operator accepts this log as it is (acceptDamagedLog): it votes and "
                         "stands for election again; entries cut from it (%s) may have been acknowledged",
                         ", ".join(info["found"]))
            j.setUnverified(None)
            info = None
        if info is not None:
            log.critical("disk check: this node neither votes nor stands for election until its log matches a "
                         "leader's up to that leader's commit index (and index %d): it was damaged (%s)",
                         info["claimed_commit"], ", ".join(info["found"]))
        return info, vote

    def _load_snapshot(self):
        path = self.conf.fullDumpFile
        if not path or not os.path.exists(path):
            return None
        doc = self.serializer.deserialize()
        self._restore_consumers(doc)
        _, index, term = doc["raft"]["last"]
        # the file's bytes are read only when a follower needs them (_with_snapshot_data)
        return Snapshot(index, term, frozenset(self._snapshot_members(doc) or self.members), b"")

    def _snapshot_members(self, doc):
        """The members a snapshot holds, and their info noted; None when it does not say (the
        fork's __loadDumpFile: only a snapshot written under online membership change, with
        `member_info`, says; `raftq restore`'s names no members, an older release's may name old
        addresses: the members configured are in force then)."""
        raft = doc["raft"]
        if not raft.get("members") or "member_info" not in raft:
            return None
        for address, info in (raft.get("member_info") or {}).items():
            if isinstance(info, dict):
                self._info[address] = dict(info)
        return list(raft["members"])

    def _upgrade_legacy(self, old):
        """Upstream's (data, last, prev, cluster) snapshot -> the document (as syncobj.py's
        __upgradeLegacySnapshot: release 0.1.0's data dirs)."""
        data, last, prev, cluster = old
        consumers_data = data[1:] if self.consumers else []
        members = sorted(n.state["_id"] if isinstance(n, LegacyObject) else str(n) for n in cluster)
        return {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION,
                "raft": {"last": tuple(last), "prev": tuple(prev), "members": members, "code_version": 0},
                "consumers": [c._upgradeLegacySnapshot(d) for c, d in zip(self.consumers, consumers_data)]}

    def _restore_consumers(self, doc):
        for consumer, data in zip(self.consumers, doc["consumers"]):
            consumer._deserialize(data)

    async def _start(self):
        if self._destroyed:         # a node removed from the cluster before this start runs no Raft
            return
        try:
            await self.links.start()
        except OSError as e:
            log.error("cannot listen on the Raft address %s: %s", self.selfAddr, e)
            raise
        self._tick_handle = self.loop.call_later(self.tick_s, self._tick)
        self._report_membership()       # the journal's changes may have moved it from what was configured
        self._kick()

    # ------------------------------------------------------------------ the loop's inputs
    def _tick(self):
        if self._destroyed or self._failed:
            return
        self._tick_handle = self.loop.call_later(self.tick_s, self._tick)
        self.core.setEligible(self._may_stand())
        self._ticks += 1
        try:
            self.core.tick()            # a heartbeat may carry entries read back (JournalStorage)
            if self._ticks % self._ticks_per_s == 0:
                self.journal.onOneSecondTimer()
                self._set_link_peers()          # a departing member the core stopped replicating to
            self._compaction()
        except StorageFailure as e:
            return self._storage_failed(e)
        for cb in self._tick_callbacks:
            try:
                cb()
            except Exception:                   # noqa: BLE001 - a hook never stops Raft
                log.exception("tick callback failed")
        self._kick()

    def _may_stand(self) -> bool:
        """Whether this node may stand for election now, asked before each tick: not while its
        applies are more than APPLY_LAG_MAX entries behind its commit index, nor when the node
        says no (conf.electionEligible: its data disk below the free-space reserve)."""
        if self.core.commitIndex - self.raftLastApplied > APPLY_LAG_MAX:
            return False
        eligible = self.conf.electionEligible
        return eligible is None or bool(eligible())

    # ------------------------------------------------------------------ log compaction
    def _compaction(self):
        """Every tick (a node's slot below may be shorter than a second): a snapshot written by a forked child (the fork's serializer and file)
        when the journal holds more than log_compaction_min_entries entries or
        log_compaction_min_time_s passed, each node in its own slot of that period (the fork's
        logCompactionSplit: not all nodes at once); once it is on disk, the core drops the log
        before it and the journal keeps the snapshot's last two entries, as the fork's does."""
        state, prev = self.serializer.checkSerializing()
        if state == SERIALIZER_STATE.SUCCESS:
            self._last_compaction = time.monotonic()
            self._compacted(prev)
        elif state == SERIALIZER_STATE.FAILED:
            if self.serializer.lastFailure == EXIT_EIO:
                raise StorageFailure(self.conf.fullDumpFile + ".tmp", "write and fsync (snapshot)",
                                     OSError(errno.EIO, os.strerror(errno.EIO)))
            log.error("a snapshot could not be written (exit %s): the journal keeps everything",
                      self.serializer.lastFailure)
        if self._snapshot_cache is not None and time.monotonic() - self._snapshot_used > SNAPSHOT_CACHE_S:
            self._snapshot_cache = None         # sent: not held for the node's lifetime
        if state == SERIALIZER_STATE.SERIALIZING or not self._compaction_due():
            return
        j, index = self.journal, self.raftLastApplied      # what the state machine holds
        start = j[0][1]
        if index - 1 <= start or index - 1 == self._compacted_at:
            return
        prev, last = tuple(j[index - 1 - start]), tuple(j[index - start])
        members = sorted(self._voters_at(index))
        raft = {"last": last, "prev": prev, "members": members,
                "member_info": {a: dict(self._info[a]) for a in members if a in self._info}, "code_version": 0}
        consumers = self.consumers

        def build():            # in the forked child
            return {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, "raft": raft,
                    "consumers": [c._serialize() for c in consumers]}
        self.serializer.serialize(build, prev[1])

    def _voters_at(self, index) -> set:
        """The configuration in force at `index` (a snapshot's)."""
        return set(self.core.votersAt(index))

    def _compaction_due(self) -> bool:
        c, now = self.conf, time.monotonic()
        if len(self.journal) <= c.logCompactionMinEntries and now - self._last_compaction <= c.logCompactionMinTime:
            return False
        members = self.members
        slot = c.logCompactionMinTime / len(members)
        start = int(now / c.logCompactionMinTime) * c.logCompactionMinTime + members.index(self.selfAddr) * slot
        return start <= now < start + max(0.3 * slot, 1.5)

    def _compacted(self, prev):
        j = self.journal
        self._compacted_at = prev
        last = prev + 1
        snap = self.core.snapshot
        if snap is not None and last <= snap.index:
            return              # a snapshot installed meanwhile is newer
        self.core.compact(last, b"")
        if prev - j[0][1] > 0:
            j.deleteEntriesTo(prev - j[0][1])

    def _with_snapshot_data(self, m):
        """An install message with the snapshot file's bytes (the core holds the snapshot empty)."""
        if m.snapshot.data:
            return m
        path = self.conf.fullDumpFile
        st = os.stat(path)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._snapshot_cache is None or self._snapshot_cache[0] != key:
            with open(path, "rb") as f:
                self._snapshot_cache = (key, f.read())
        self._snapshot_used = time.monotonic()
        return dataclasses.replace(m, snapshot=dataclasses.replace(m.snapshot, data=self._snapshot_cache[1]))

    def _on_message(self, m):
        if self._destroyed or self._failed:
            return
        t0 = time.thread_time()
        try:
            self.core.step(m)
        except (ValueError, KeyError):
            log.warning("dropped a malformed Raft message from %s", m.src)
            return
        except StorageFailure as e:     # an append to a follower behind reads entries back
            return self._storage_failed(e)
        finally:
            self.raft_cpu_s += time.thread_time() - t0
        self._kick()

    def _on_lost(self, addr):
        """A peer's connection closed: if it is not back within the grace and the peer was the
        leader, stand soon (core.peerLost)."""
        self.loop.call_later(LEADER_LOST_GRACE_S, self._still_lost, addr)

    def _still_lost(self, addr):
        if not (self._destroyed or self._failed or self.links.connected(addr)):
            self.core.peerLost(addr)

    def _applyCommand(self, command, callback, commandType=None):
        if commandType is not None:
            command = bytes([commandType]) + command
        self._submit(callback, self.core.propose, command)

    def _submit(self, callback, propose, *args):
        """A proposal (a command, a membership change) to the core; callback(result, FAIL_REASON)
        once its entry is applied, or at once when the core refuses it."""
        if self._failed or self._destroyed:
            return self._fail(callback, FAIL_REASON.NOT_LEADER)
        try:
            index, term = propose(*args)
        except NotLeader as e:
            return self._fail(callback, FAIL_REASON.NOT_LEADER if e.leader else FAIL_REASON.MISSING_LEADER)
        except Refused:
            return self._fail(callback, FAIL_REASON.REQUEST_DENIED)
        if callback is not None:
            self._callbacks[index] = (term, callback, [time.perf_counter(), 0.0, 0.0])
        self._kick()

    @staticmethod
    def _fail(callback, reason):
        if callback is not None:
            callback(None, reason)

    def _kick(self):
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._turn)

    # ------------------------------------------------------------------ one turn: one Ready
    def _turn(self):
        self._scheduled = False
        if self._destroyed or self._failed or self._syncing:
            return
        t0 = time.thread_time()
        try:
            self._ready_turn()
        finally:
            self.raft_cpu_s += time.thread_time() - t0

    def _ready_turn(self):
        core = self.core
        wanted = self.conf.commitWanted
        core.setCommitWanted(wanted is not None and wanted())
        try:
            while core.has_ready():
                rd = core.ready()
                self._write(rd)
                if rd.must_sync and self.durable and self._sync_thread is not None:
                    # the journal's fdatasync off the loop: meanwhile requests are parsed and
                    # proposed, peers' messages stepped; all of it goes into the next Ready.
                    # Not the default: on 2 cores the hand-off cost more than it overlapped
                    # (docs/performance.md "Raft engines")
                    self._syncing = True
                    fut = self.loop.run_in_executor(self._sync_thread, self.journal.sync)
                    fut.add_done_callback(lambda f, rd=rd: self._synced(rd, f))
                    break
                if rd.must_sync and self.durable:
                    self.journal.sync()
                self._finish(rd)
        except StorageFailure as e:
            self._storage_failed(e)
            return
        except CoreInUse:                       # pragma: no cover - one Ready at a time, always
            log.exception("Ready loop re-entered")
        self.links.flush()
        self._state_changed()
        if self.core.voters is not self._voters:
            self._config_changed()

    def _synced(self, rd, fut):
        self._syncing = False
        if self._destroyed or self._failed:
            return
        try:
            fut.result()
            self._finish(rd)
        except StorageFailure as e:
            return self._storage_failed(e)
        self._turn()

    def _write(self, rd):
        """Before the sync: the leader's appends leave, the entries are written (not synced)."""
        links, j = self.links, self.journal
        for m in rd.messages:
            links.send(m if m.snapshot is None else self._with_snapshot_data(m))
        links.flush()                           # the leader's appends leave before its own sync
        if rd.snapshot is not None:
            self._install(rd.snapshot)
        if rd.entries:
            first = rd.entries[0].index
            start = j[0][1]
            if first - start < len(j):
                j.deleteEntriesFrom(first - start)
            regular = EntryKind.REGULAR
            for e in rd.entries:
                j.add(e.data if e.kind is regular else self._record(e), e.index, e.term)

    def _finish(self, rd):
        """After the sync: the hard state, the answers that promise what is now on disk, the
        applies and their callbacks, `advance`."""
        links, j = self.links, self.journal
        hs = rd.hard_state          # after the entries: a stored commit index never covers unsynced ones
        if hs is not None:
            if (hs.term, hs.vote) != (j.getCurrentTerm(), j.getVotedForNodeId()):
                j.setCurrentTerm(hs.term, hs.vote)      # stored and synced at once (the meta file)
            j.setRaftCommitIndex(hs.commit)             # stored once a second (_tick), as the fork does
        if rd.log_verified:
            j.setUnverified(None)
        if self._callbacks:
            now = time.perf_counter()
            for e in rd.entries:
                waiting = self._callbacks.get(e.index)
                if waiting is not None and not waiting[2][1]:
                    waiting[2][1] = now
        for m in rd.messages_after_sync:
            links.send(m if m.snapshot is None else self._with_snapshot_data(m))
        if rd.messages_after_sync:
            links.flush()           # a follower's acknowledgement leaves before its applies
        self._to_apply.extend(rd.committed_entries)
        self.core.advance(rd)
        self._apply_some()

    def _apply_some(self):
        """Apply committed entries for at most APPLY_SLICE_S, the rest in later turns of the loop.
        Raft goes on meanwhile (the core was advanced: it votes, replicates and commits while a
        restart's replay catches up, as the fork's tick applies in budgets), and so do HTTP and
        the Raft link. The state machine is at `raftLastApplied`, the core may be ahead of it."""
        queue, apply = self._to_apply, self._apply
        end = time.perf_counter() + APPLY_SLICE_S
        while queue:
            apply(queue.popleft())
            if queue and time.perf_counter() >= end:
                if not self._apply_scheduled:
                    self._apply_scheduled = True
                    self.loop.call_soon(self._apply_more)
                return

    def _apply_more(self):
        self._apply_scheduled = False
        if self._destroyed or self._failed:
            return
        t0 = time.thread_time()
        try:
            self._apply_some()
        finally:
            self.raft_cpu_s += time.thread_time() - t0

    def _apply(self, e: Entry):
        waiting = self._callbacks.pop(e.index, None) if self._callbacks else None
        if waiting is not None and waiting[0] != e.term:
            self._fail(waiting[1], FAIL_REASON.DISCARDED)       # another leader's entry took its index
            waiting = None
        result = None
        if e.kind == EntryKind.REGULAR and e.data and e.data[0] == _REGULAR:
            self.answerWanted = waiting is not None
            self.raftLastApplied = e.index - 1
            cmd = pickle.loads(e.data[1:])
            func_id, args = (cmd, ()) if not isinstance(cmd, tuple) else (cmd[0], cmd[1])
            result = self._idToMethod[func_id](*args, _doApply=True)
        elif e.kind is EntryKind.MEMBERSHIP:
            self._change_applied(e)
        self.raftLastApplied = e.index
        if waiting is not None:
            stamps = waiting[2]
            stamps[2] = time.perf_counter()
            self.entryStages = stamps if stamps[1] else None
            try:
                waiting[1](result, FAIL_REASON.SUCCESS)
            finally:
                self.entryStages = None

    def _install(self, snap: Snapshot):
        """A snapshot from the leader (its raft.dump's bytes): written as this node's, the state
        restored from it, the journal restarted at its last entry."""
        path = self.conf.fullDumpFile
        while self.serializer.checkSerializing()[0] == SERIALIZER_STATE.SERIALIZING:
            time.sleep(0.005)       # our own snapshot's child must not rename an older file over this one
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(snap.data)
        atomicReplace(tmp, path, fsync=self.durable)
        doc = self.serializer.deserialize()
        self._restore_consumers(doc)
        j = self.journal
        j.clear()
        j.add(*doc["raft"]["prev"])
        j.add(*doc["raft"]["last"])
        self._snapshot_members(doc)             # (the core took the members from the message)
        self.raftLastApplied = snap.index
        while self._to_apply and self._to_apply[0].index <= snap.index:
            self._to_apply.popleft()
        for index in [i for i in self._callbacks if i <= snap.index]:
            self._fail(self._callbacks.pop(index)[1], FAIL_REASON.UNKNOWN_OUTCOME)

    def _state_changed(self):
        state = self.core.state
        if state == self._last_state:
            return
        old, self._last_state = self._last_state, state
        # (Entries this node proposed may still commit under the next leader: their callbacks
        # stay until their index is applied: with their term, success; another, discarded.)
        term = self.core.term
        if old == RaftState.LEADER and term == self._led_term:      # CheckQuorum, as the fork logs it
            log.warning("no majority heard from for %.2f s: stepping down (term %d)",
                        self.core.conf.election_timeout_min * self.tick_s, term)
        self._led_term = term if state == RaftState.LEADER else None
        self._lead_from = self.core.lastIndex if state == RaftState.LEADER else None
        self._set_link_peers()          # a leader's learners and departing members are dropped with it
        hook = self.conf.onStateChanged
        if hook is not None:
            try:
                hook(int(old), int(state))
            except Exception:                   # noqa: BLE001
                log.exception("onStateChanged failed")

    def _storage_failed(self, e):
        self._failed = True
        log.critical("storage failure: %s; Raft stops on this node", e)
        hook = self.conf.onStorageFailure
        if hook is not None:
            hook(e)

    # ------------------------------------------------------------------ what replica.py reads
    @property
    def raftState(self):
        return int(self.core.state)

    @property
    def raftCurrentTerm(self):
        return self.core.term

    @property
    def raftCommitIndex(self):
        return self.core.commitIndex

    @property
    def raftLastLogIndex(self):
        return self.core.lastIndex

    @property
    def raftView(self):
        return int(self.core.state), self.core.term

    @property
    def leaderCommitIndex(self):
        return self.core.commitIndex if self.core.leader is not None else None

    @property
    def raftElectionDeadline(self):
        core = self.core
        return time.monotonic() + (core.raftElectionDeadline - core.ticks) * self.tick_s

    @property
    def transportRefusals(self):
        """The Raft link's refusals by reason (the fork's transport.REFUSALS) and the handshakes under way."""
        return dict(self.links.refusals, pending=len(self.links.pending))

    @property
    def journalSyncs(self):
        return self.journal.syncs

    @property
    def journalHeldBytes(self):
        return getattr(self.journal, "heldBytes", 0)

    @property
    def logUnverified(self):
        return self.journal.getUnverified() if self.core.logUnverified else None

    def _isLeader(self):
        return self.core.state == RaftState.LEADER

    def _getLeader(self):
        return self.core.leader

    def isNodeConnected(self, node):
        return self.links.connected(node.id)

    def addOnTickCallback(self, cb):
        self._tick_callbacks.append(cb)

    def transferLeadership(self, node=None, callback=None):
        try:
            self.core.transferLeadership(None if node is None else node.id)
        except (NotLeader, Refused) as e:
            log.info("leadership transfer refused: %s", e)
            return self._fail(callback, FAIL_REASON.REQUEST_DENIED)
        self._kick()
        if callback is not None:
            callback(True, FAIL_REASON.SUCCESS)

    # ------------------------------------------------------------------ membership changes
    # (docs/cluster.md "Membership changes"; the fork's are syncobj.py's addNodeToCluster,
    # removeNodeFromCluster, addLearner, dropLearner, learnerMatchIndex, membershipChangePending)
    def addNodeToCluster(self, node, callback=None, info=None):
        self._propose_change(ChangeType.ADD, node, callback, info)

    def removeNodeFromCluster(self, node, callback=None, info=None):
        self._propose_change(ChangeType.REMOVE, node, callback, info)

    def _propose_change(self, kind, node, callback, info):
        """One change through the log; callback(None, FAIL_REASON) once it is applied, as for
        any command (REQUEST_DENIED: another change or this leader's no-op is not committed)."""
        self._submit(callback, self.core.proposeChange, kind, getattr(node, "id", node),
                     None if info is None else dict(info))

    @property
    def membershipChangePending(self) -> bool:
        """Whether a change would be refused now: this node does not lead, or its no-op or the
        last change is not applied yet (the fork's rule: one change at a time)."""
        if self._lead_from is None or self.core.state != RaftState.LEADER:
            return True
        return self.raftLastApplied < max(self._lead_from, self._last_change)

    def addLearner(self, node):
        """On the leader: replicate to `node` without counting it (the add's catch-up)."""
        try:
            self.core.addLearner(node)
        except (NotLeader, Refused):
            return                  # not the leader, or a member already: the fork ignores it too
        self._set_link_peers()
        self._kick()

    def dropLearner(self, node):
        self.core.dropLearner(node)
        self._set_link_peers()

    def learnerMatchIndex(self, node):
        return self.core.learnerMatchIndex(node)

    def _record(self, e: Entry) -> bytes:
        """The journal record of an entry that is no command (a no-op, a membership change)."""
        if e.kind is EntryKind.MEMBERSHIP:
            self._note_change(e)
        return _command(e)

    def _note_change(self, e: Entry):
        """A membership entry written to the journal (or read from it): its member's info."""
        self._last_change = max(self._last_change, e.index)
        change = ConfChange.decode(e.data)
        if change.type == ChangeType.ADD and isinstance(change.info, dict):
            self._info[change.node] = dict(change.info)

    def _change_applied(self, e: Entry):
        """A committed change applied: this node's own removal ends its membership (the node
        stops: docs/cluster.md "Membership changes"). Never raises (an apply)."""
        try:
            change = ConfChange.decode(e.data)
        except (ValueError, TypeError):         # pragma: no cover - the core decoded it when appended
            return
        if change.type == ChangeType.REMOVE and change.node == self.selfAddr and not self.removedFromCluster:
            self._removed()

    def _removed(self):
        self.removedFromCluster = True
        log.warning("this node (%s) was removed from the cluster", self.selfAddr)
        self.loop.call_soon(self._report_membership)

    def _config_changed(self):
        """The configuration in the core's log changed (appended, cut, a snapshot installed)."""
        self._voters = voters = self.core.voters
        self.otherNodes = [SimpleNamespace(id=a) for a in sorted(voters - {self.selfAddr})]
        self.members = sorted(voters | {self.selfAddr})
        self._set_link_peers()
        self._report_membership()

    def _set_link_peers(self):
        """The link's peers: the voters, and on a leader its learners and the removed members it
        still tells of their removal (those the core replicates to)."""
        core, links = self.core, self.links
        wanted = set(core.voters) | core.learners
        wanted.update(a for a in links.peers if core.progress(a) is not None)
        wanted.discard(self.selfAddr)
        if wanted != links.peers.keys():
            links.set_peers(wanted)

    def _report_membership(self):
        """conf.onMembershipChanged when the members (with their info) or this node's removal
        changed: replica.py records them in members.json."""
        nodes = set(self._voters) - {self.selfAddr}
        if not self.removedFromCluster:
            nodes.add(self.selfAddr)
        membership = {a: dict(self._info.get(a) or {}) for a in sorted(nodes)}
        reported = (membership, self.removedFromCluster)
        if reported == self._reported:
            return
        self.membership, self._reported = membership, reported
        hook = self.conf.onMembershipChanged
        if hook is not None:
            try:
                hook()
            except Exception:               # noqa: BLE001 - a hook never stops Raft
                log.exception("onMembershipChanged failed")

    def destroy(self):
        """Stop Raft on this node. From another thread (a removed node's service stops it from
        an executor) it is done on the loop, which owns the journal and the link."""
        if self._destroyed:
            return
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if not on_loop and self.loop.is_running():
            self.loop.call_soon_threadsafe(self.destroy)
            return
        self._destroyed = True
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        self.loop.create_task(self.links.close())
        try:
            if self.durable and not self._failed:
                self.journal.setRaftCommitIndex(self.core.commitIndex)
            self.journal._destroy()
        except (StorageFailure, OSError) as e:
            log.error("closing the journal: %s", e)
