"""The state machine inside pysyncobj: the replicated consumer, its SyncObj and durability.

Threads: pysyncobj's tick thread does all Raft work and runs `apply_batch` on every node; the
asyncio loop only proposes and reads. `lock` keeps readers from seeing a half-applied batch.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.journal import MetaStorer
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.syncobj import SyncObjExceptionWrongVer
from pysyncobj.monotonic import monotonic as monotonicTime
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from . import journal_file, sync_shadow, wire
from .journal_file import datasync
from .machine import QueueMachine
from .settings import Settings

log = logging.getLogger("raftq.replica")


def _legacy_module_paths():
    """Snapshots of release 0.1.0 pickled the machine as `node.machine.QueueMachine` (with
    `node.limits.Limits`): that release's packages were `node` and `cluster`. Those paths name
    this package's modules, so pysyncobj can load such a raft.dump (until the in-tree Raft fork
    replaces pysyncobj with its own loader for exactly those class paths)."""
    import importlib
    import sys
    for old, new in (("node", "raftq.node"), ("node.machine", "raftq.node.machine"),
                     ("node.limits", "raftq.node.limits")):
        if old not in sys.modules:
            sys.modules[old] = importlib.import_module(new)


class QueueState(SyncObjConsumer):
    """The replicated consumer. Attributes set before `SyncObjConsumer.__init__` are left out of
    snapshots (pysyncobj's rule), which is where the lock and the hooks belong."""

    def __init__(self, limits):
        _legacy_module_paths()
        self.lock = threading.Lock()
        self.limits = limits
        self.after_apply = None          # called on the tick thread after each applied batch
        self.apply_cpu_s = 0.0           # CPU spent in the state machine (for the benchmark split)
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
                results = self.machine.apply_batch(now_ms, cmds)
            self.apply_cpu_s += time.thread_time() - t0
        except Exception:                               # pragma: no cover - defence in depth
            log.exception("apply_batch failed outside the state machine")
            results = [(500, {"error": {"code": "internal", "message": "apply failed"}})] * len(cmds)
        hook = self.after_apply
        if hook is not None:
            try:
                hook(cmds, results)
            except Exception:                           # pragma: no cover
                log.exception("after_apply hook failed")
        return results

    def _serialize(self):
        # Runs on the tick thread, right before pysyncobj forks to write the snapshot; the
        # child pickles the machine through QueueMachine.__getstate__.
        return {"machine": self.machine}

    def _deserialize(self, data):
        machine = data["machine"]
        if machine.config_version == 0:
            # No configuration in the snapshot (release 0.1.0, or a cluster not seeded yet): its
            # entries ran under the bootstrap, which is this node's TOML. From version 1 on the
            # snapshot carries the configuration in force, and the TOML has no say.
            try:
                differs = machine.limits.fingerprint() != self.limits.fingerprint()
            except Exception:                   # limits pickled by an older release
                differs = True
            if differs:
                log.warning("snapshot was written with different limits; using this node's limits")
            machine.limits = self.limits
        with self.lock:
            self.machine = machine


def _dialing_transport(base, dial_map: dict):
    """Test hook (chaos proxies): dial a peer at another address than its identity. Each Raft
    link is one TCP connection dialed by the peer with the larger address, so a proxy per link
    sees exactly one pair of nodes."""
    if not dial_map:
        return base

    class DialingTransport(base):
        def _connectIfNecessarySingle(self, node):
            if node in self._connections and self._connections[node].state != CONNECTION_STATE.DISCONNECTED:
                return True
            if not self._shouldConnect(node):
                return False
            if node in self._lastConnectAttempt and \
                    monotonicTime() - self._lastConnectAttempt[node] < self._syncObj.conf.connectionRetryTime:
                return False
            self._lastConnectAttempt[node] = monotonicTime()
            host, port = dial_map.get(node.address, f"{node.ip}:{node.port}").rsplit(":", 1)
            return self._connections[node].connect(host, int(port))

    return DialingTransport


KEEPALIVE = {"type": "raftq_keepalive"}
KEEPALIVE_PERIOD_S = 1.0


def _keepalive_transport(base):
    """Keep idle Raft links alive. pysyncobj drops a connection whose last read is older than
    `connectionTimeout` only when it next has to *send* on it (tcp_connection.__trySendBuffer),
    and the message being sent is lost with it. Between two followers nothing flows while the
    leader lives, so when the leader died the first `request_vote` between the survivors was
    always lost and every election took a second round (2.5-3.5 s instead of 1-2 s, the term
    going up by two). Each node now pings every connected peer once a second; the pings are
    swallowed here, before pysyncobj sees them."""

    class KeepaliveTransport(base):
        def _onMessageReceived(self, node, message):
            if type(message) is dict and message.get("type") == "raftq_keepalive":
                return
            super()._onMessageReceived(node, message)

        def keepalive(self):
            for node, conn in list(self._connections.items()):
                if conn.state == CONNECTION_STATE.CONNECTED:
                    conn.send(KEEPALIVE)

    return KeepaliveTransport


def _append_keeps_matching_tail(base):
    """Raft's follower rule (Figure 2, AppendEntries step 3): delete existing entries only from
    the first one that *conflicts* with a new one. pysyncobj instead deletes everything after
    `prevLogIdx` whenever the follower has more, even when every new entry matches. A leader
    whose nextIndex went stale (a reset reply that arrived late, a cut connection, a 1 MB
    batch) then makes a follower drop entries it had already acknowledged and applied, and
    the follower stays without them until the leader sends them again; were the leader to die
    in between, an election could pass over committed entries (chaos runs with connection
    resets logged "truncating already-applied log entries").

    Before pysyncobj sees an append, the entries the follower already holds are cut from it:
    * a conflict at index k: the message starts at k (pysyncobj truncates from k, as Raft does);
    * no conflict, the log shorter than the message: it starts after the follower's last entry;
    * no conflict, the log as long or longer: it becomes a heartbeat at the follower's last
      entry (nothing truncated), the commit index capped at the message's last entry, and the
      success reply names that entry + 1, as Raft's would (the follower's own tail beyond it
      is not known to match the leader's).
    A mismatching prevLogIdx, a heartbeat or a chunked transmission goes through unchanged."""

    class AppendTransport(base):
        def _onMessageReceived(self, node, message):
            if type(message) is dict and message.get("type") == "append_entries" and message.get("entries"):
                message, next_idx = self._skip_held_entries(message)
                if next_idx is not None:
                    replies = self.__dict__.setdefault("_reply_next", {})
                    replies[node] = next_idx
                    try:
                        return super()._onMessageReceived(node, message)
                    finally:
                        replies.pop(node, None)
            return super()._onMessageReceived(node, message)

        def _skip_held_entries(self, m: dict):
            s = self._syncObj
            try:
                if "prevLogIdx" not in m or "transmission" in m or m["term"] < s.raftCurrentTerm:
                    return m, None
                entries = m["entries"]
                prev = m["prevLogIdx"]
                last = s._SyncObj__getCurrentLogIndex()
                if last <= prev:
                    return m, None                      # nothing held after prev: nothing to keep
                have = s._SyncObj__getEntries(prev, len(entries) + 1)
                if not have or have[0][1] != prev or have[0][2] != m["prevLogTerm"]:
                    return m, None                      # pysyncobj rejects it as before
                skip = 0
                for mine, theirs in zip(have[1:], entries):
                    if mine[1] != theirs[1] or mine[2] != theirs[2]:
                        break                           # first conflict: truncate from here
                    skip += 1
                if skip == 0:
                    return m, None
                if skip < len(entries):
                    held = entries[skip - 1]
                    return dict(m, prevLogIdx=held[1], prevLogTerm=held[2], entries=entries[skip:]), None
                last_new = entries[-1][1]
                tail = s._SyncObj__getEntries(last, 1)
                if not tail or tail[0][1] != last:
                    return m, None
                return dict(m, prevLogIdx=last, prevLogTerm=tail[0][2], entries=[],
                            commit_index=min(m["commit_index"], last_new)), last_new + 1
            except Exception:                           # pragma: no cover - never worse than before
                return m, None

        def send(self, node, message):
            replies = self.__dict__.get("_reply_next")
            if replies and node in replies and type(message) is dict and \
                    message.get("type") == "next_node_idx" and message.get("success"):
                message = dict(message, next_node_idx=replies[node])
            return super().send(node, message)

    return AppendTransport


def _durable_transport(journal_holder: dict):
    """A transport that makes `durability = "fsync"` true on followers: the journal is synced
    before a follower acknowledges entries. (The leader syncs in its tick callback, after
    sending, so its disk write overlaps the followers'; see Replica._on_tick.) pysyncobj never
    syncs by itself."""

    class DurableTransport(TCPTransport):
        def send(self, node, message):
            kind = message.get("type")
            if kind == "next_node_idx" and message.get("success"):
                sync = journal_holder.get("sync")
                if sync is not None:
                    sync()
            return super().send(node, message)

    return DurableTransport


def _fsync_meta_storer(term_vote_only: bool = False):
    """Term and vote must be on disk before a vote is cast (Raft safety across power loss).

    pysyncobj keeps term, vote and its commit index in one small file (`raft.journal.meta`),
    written with setCurrentTerm (before a vote or a new term is acted on) and once a second when
    the commit index moved. fsync mode syncs every write. Memory mode (`term_vote_only`) writes
    and syncs it only when the term or the vote changed (elections: rare), and never for the
    commit index alone, which memory mode does not trust after a restart anyway (see
    `_volatile_commit_index`). Without that, a power cut could take a node's term and vote
    back (two leaders elected in one term, two different entries with the same index and term:
    logs that Raft can never reconcile); an unsynced rewrite could even leave the file empty."""
    import shutil
    from pysyncobj.pickle import dumps

    def storeMeta(self, meta):
        if term_vote_only:
            key = (meta.get("currentTerm"), meta.get("votedForNodeId"))
            if getattr(self, "_raftq_stored", None) == key:
                return
            self._raftq_stored = key
        tmp = self.getPath() + ".tmp"
        with open(tmp, "wb") as f:
            f.write(dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        shutil.move(tmp, self.getPath())
        dfd = os.open(os.path.dirname(self.getPath()) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    MetaStorer.storeMeta = storeMeta


def _volatile_commit_index(journal):
    """Memory mode: start with the commit index unknown (Raft's commitIndex is volatile state)
    instead of the one pysyncobj stored. pysyncobj applies its journal up to the stored commit
    index as soon as it starts, before it hears from any leader. That is safe only if the
    entries it covers are on disk on a majority; in memory mode, after the power loss of a
    majority, they may be on no other disk: the node applied entries that the new leader does
    not have, then had to truncate them ("truncating already-applied log entries", a state
    machine that differs from the others' until it restarts; the chaos `power-loss` fault found
    it in every memory-mode run). With the index unknown, a restarted node applies only what the
    current leader reports committed, so after a power cut every replica loses the same writes.
    (Its snapshot, if any, is loaded as before. pysyncobj reads the stored index only here.)"""
    journal.getRaftCommitIndex = lambda: 1
    return journal


class _JournalHooks:
    """Run `hooks` on the journal pysyncobj creates in SyncObj.__init__, before the tick thread
    starts and before the journal's first write or its first read of the commit index."""

    def __init__(self, hooks):
        import pysyncobj.syncobj as pso
        self.pso, self.hooks = pso, hooks

    def __enter__(self):
        self.original = original = self.pso.createJournal

        def create(path=None):
            journal = original(path)
            for hook in self.hooks:
                hook(journal)
            return journal

        if self.hooks:
            self.pso.createJournal = create
        return self

    def __exit__(self, *exc):
        self.pso.createJournal = self.original


def _fsync_snapshots():
    """Snapshots must be on disk before the journal entries they replace are dropped.
    pysyncobj writes `raft.dump` (its own snapshot, in a forked child, and one received from the
    leader) to a temporary file and renames it without any fsync, then compacts the journal; a
    power cut after the compacted journal reached the disk but before the snapshot did would
    lose committed entries. Sync the file before the rename and the directory after it."""
    import pysyncobj.serializer as serializer

    if getattr(serializer.atomicReplace, "raftq_durable", False):
        return
    original = serializer.atomicReplace

    def atomicReplace(old_path, new_path):
        fd = os.open(old_path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        result = original(old_path, new_path)
        dfd = os.open(os.path.dirname(new_path) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return result

    atomicReplace.raftq_durable = True
    serializer.atomicReplace = atomicReplace


RECV_CHUNK = 1 << 16


def _lean_socket_reads():
    """pysyncobj reads each Raft socket with recv(recvBufferSize), the same number it uses as
    the kernel's SO_RCVBUF (2 MB here, for bursts). A 2 MB recv allocates a 2 MB bytes object
    per call, message or not (each read also ends with one more recv that finds nothing), and
    costs ≈ 20 µs more per read than a 64 KB one on this machine. Reads take at most 64 KB at a
    time; the kernel buffer stays large. A read that returns less than it asked for has emptied
    the socket, so the loop stops there instead of paying a failing recv (and pysyncobj's
    SO_ERROR check after every read: data received means the socket is fine); the poller is
    level-triggered and reports the socket again when more arrives."""
    from pysyncobj import tcp_connection as tc
    if getattr(tc.TcpConnection, "_raftq_lean_reads", False):
        return                  # patched once per process (a second patch would wrap the first)
    tc.TcpConnection._raftq_lean_reads = True

    def processRead(self):
        try:
            chunk = min(self._TcpConnection__recvBufferSize, RECV_CHUNK)
            incoming = self._TcpConnection__socket.recv(chunk)
        except socket.error as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if not incoming:
            self.disconnect()
            return False
        self._TcpConnection__readBuffer += incoming
        return len(incoming) == chunk

    tc.TcpConnection._TcpConnection__processRead = processRead

    # pysyncobj also asks the kernel for SO_ERROR on every readiness event before it reads. That
    # check is needed while connecting (a refused connect shows up only there) and before a
    # write; for a read on a connected socket the recv itself reports any error.
    original = tc.TcpConnection._TcpConnection__processConnection
    R, W, E = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR

    def processConnection(self, descr, eventType):
        if (eventType & (R | W | E)) != R or descr != self._TcpConnection__fileno \
                or self._TcpConnection__state != CONNECTION_STATE.CONNECTED:
            return original(self, descr, eventType)
        self._TcpConnection__processConnectionTimeout()
        if self._TcpConnection__state == CONNECTION_STATE.DISCONNECTED:
            return
        self._TcpConnection__tryReadBuffer()
        if self._TcpConnection__state == CONNECTION_STATE.DISCONNECTED:
            return
        while True:
            message = self._TcpConnection__processParseMessage()
            if message is None:
                break
            if self._TcpConnection__onMessageReceived is not None:
                self._TcpConnection__onMessageReceived(message)
            if self._TcpConnection__state == CONNECTION_STATE.DISCONNECTED:
                return

    tc.TcpConnection._TcpConnection__processConnection = processConnection




class _Zlib:
    """pysyncobj compresses every Raft message at zlib level 3, which costs more CPU than
    anything else per message (≈ 100 µs for an 18 KB batch of 256-byte random payloads, saving
    a quarter of the bytes). CPU is what a Python Raft node runs out of, so the level is a
    tuning knob, 0 by default, and 0 means no zlib call at all: even at level 0 each
    zlib.compress sets up a fresh deflate state, about 45 µs per message whatever its size
    (four messages per replication round). A message is sent as the bare pickle then, which
    starts with the pickle PROTO opcode 0x80 where a zlib stream starts with 0x78, so the
    receiver tells them apart and reads either."""

    def __init__(self, level: int):
        import zlib
        self._zlib, self.level = zlib, level
        self.error = zlib.error

    def compress(self, data, _level=None):
        if self.level == 0:
            return data
        return self._zlib.compress(data, self.level)

    def decompress(self, data):
        if data[:1] == b"\x80":
            return data
        return self._zlib.decompress(data)


APPLY_CHUNK = 16            # entries applied between two checks of the time budget
APPLY_BUDGET_S = 0.02       # at most this much applying per tick, then the network gets a turn


class BoundedApplySyncObj(SyncObj):
    """pysyncobj applies every committed entry it has not applied yet in one tick
    (`__applyLogEntries`), and handles no message meanwhile. A node that restarts replays its
    whole journal that way (53,000 entries after a 10-minute chaos run: 1.3 s on an idle
    machine, several on a busy one), and so does a follower that catches up after a partition.
    Meanwhile it answers no heartbeat (a leader that is down another node loses its majority:
    the chaos run saw a follower kill cost 6-7 s of writes) and, once done, finds its election
    timer long expired and calls an election (after a kill-all every node does, at once: split
    votes). This is the same loop with a time budget: at most APPLY_BUDGET_S of applying per
    tick, the rest in the next ticks, messages handled in between. (A method of a subclass,
    not an attribute set on the instance: pysyncobj pickles the instance's __dict__ into its
    snapshots.)"""

    def _SyncObj__applyLogEntries(self):
        commit, last = self._SyncObj__raftCommitIndex, self._SyncObj__raftLastApplied
        if commit <= last:
            return False
        entries = self._SyncObj__getEntries(last + 1, min(commit - last, 4096))
        waiting = self._SyncObj__commandsWaitingCommit
        machine = self._SyncObj__consumers[0].machine
        end = monotonicTime() + APPLY_BUDGET_S
        for n, entry in enumerate(entries):
            if n and n % APPLY_CHUNK == 0 and monotonicTime() >= end:
                break
            try:
                term = entry[2]
                subscribers = waiting.pop(entry[1], [])
                machine.render = bool(subscribers)      # answers nobody reads are not rendered
                res = self._SyncObj__doApplyCommand(entry[0])
                for subscriber_term, callback in subscribers:
                    if subscriber_term == term:
                        callback(res, FAIL_REASON.SUCCESS)
                    else:
                        callback(None, FAIL_REASON.DISCARDED)
                self._SyncObj__raftLastApplied += 1
            except SyncObjExceptionWrongVer as e:         # as pysyncobj does
                log.error("request to switch to unsupported code version (requested version: %d)", e.ver)
        return not self._SyncObj__conf.appendEntriesUseBatch


class Replica:
    """One node's SyncObj around a QueueState."""

    def __init__(self, settings: Settings, on_state_changed=None, on_ready=None):
        self.settings = settings
        self.state = QueueState(settings.limits)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        t = settings.tuning
        self.syncs = 0
        conf = SyncObjConf(
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
            commandsWaitLeader=False,
            commandsQueueSize=int(t["max_inflight"]),
            logCompactionMinEntries=int(t["log_compaction_min_entries"]),
            logCompactionMinTime=t["log_compaction_min_time_s"],
            logCompactionSplit=True,
            appendEntriesBatchSizeBytes=1 << 20,
            logCompactionBatchSize=1 << 20,
            sendBufferSize=1 << 21,
            recvBufferSize=1 << 21,
            onStateChanged=on_state_changed,
            onReady=on_ready,
            dynamicMembershipChange=False,
            dnsCacheTime=t["dns_cache_time_s"],
            dnsFailCacheTime=t["dns_fail_cache_time_s"],
        )
        import pysyncobj.tcp_connection as tcp_connection
        tcp_connection.zlib = _Zlib(int(t["raft_compression_level"]))
        _lean_socket_reads()
        wire.install()
        holder: dict = {}
        transport = TCPTransport
        if settings.durability == "fsync":
            journal_file.install()
            _fsync_meta_storer()
            _fsync_snapshots()
            transport = _durable_transport(holder)
        else:
            _fsync_meta_storer(term_vote_only=True)
        dial_map = settings.testing.raft_dial_map          # [testing]: chaos proxies
        transport = _dialing_transport(_keepalive_transport(_append_keeps_matching_tail(transport)), dial_map)
        others = [p.raft for p in settings.others]
        hooks = [] if settings.durability == "fsync" else [_volatile_commit_index]
        self.shadow = None
        if settings.testing.sync_shadow:    # [testing]: the power-loss test hook (node/sync_shadow.py)
            self.shadow = sync_shadow.SyncShadow(settings.data_dir, settings.durability,
                                                 settings.testing.sync_shadow_writeback_s)
            hooks.append(self.shadow.attach)
        with _JournalHooks(hooks):
            self.syncobj = BoundedApplySyncObj(settings.raft, others, conf=conf, consumers=[self.state],
                                               transportClass=transport)
        if settings.durability == "fsync":
            self._install_journal_sync(holder)
        # Event-driven replication: pysyncobj in batch mode sends new entries only on its
        # append-entries timer; a proposal instead wakes the tick thread through a pipe and
        # the tick sends the new entries at once (tens of ms less per write).
        self._sync = holder.get("sync")
        self._wake_w = None
        self._kicked = False
        self._sent_index = 0
        self._keepalive_at = 0.0
        # (raft state, term) as the tick thread saw them between two rounds of message handling,
        # so the pair belongs together; see raft_role_term().
        self.raft_view: tuple | None = None
        self.syncobj.addOnTickCallback(self._on_tick)

    def _install_journal_sync(self, holder: dict):
        # Sync only when something was appended since the last sync: one msync per
        # append-entries round, shared by every command in it (group commit).
        journal = self.syncobj._SyncObj__raftLog
        dirty = [False]
        original_add = journal.add

        def add(*args, **kwargs):
            dirty[0] = True
            return original_add(*args, **kwargs)

        shadow = self.shadow

        # fdatasync of the journal file (node/journal_file.py, pwrite into zero-filled space:
        # data only, no filesystem metadata), which releases the GIL while the disk works.
        fd = journal._FileJournal__journalFile.fileno()

        def sync():
            if dirty[0]:
                dirty[0] = False
                datasync(fd)
                self.syncs += 1
                if shadow is not None:
                    shadow.durable()

        journal.add = add
        holder["sync"] = sync

    def _on_tick(self):
        s = self.syncobj
        if self._wake_w is None:
            # Subscribed from the tick thread itself, so the poller is never changed mid-poll.
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)

            def drain(fd, mask):
                try:
                    while os.read(r, 4096):
                        pass
                except BlockingIOError:
                    pass

            s._poller.subscribe(r, drain, POLL_EVENT_TYPE.READ)
            self._wake_w = w
        self._kicked = False
        self.raft_view = (getattr(s, "_SyncObj__raftState", 0), s.raftCurrentTerm)
        now = monotonicTime()
        if now - self._keepalive_at >= KEEPALIVE_PERIOD_S:
            self._keepalive_at = now
            transport = getattr(s, "_SyncObj__transport", None)
            if hasattr(transport, "keepalive"):
                transport.keepalive()
        if self.shadow is not None:
            self.shadow.tick()              # memory mode: the simulated page writeback
        if s._isLeader():
            last = s._SyncObj__getCurrentLogIndex()
            if last > self._sent_index:
                self._sent_index = last
                s._SyncObj__sendAppendEntries()
            # The leader's own copy is synced here, after the send: its disk write overlaps the
            # followers'. It is still durable before it counts: entries are appended in this
            # tick (step 8 of pysyncobj's _onTick) and the commit index is computed at the start
            # of a later tick, after this callback (step 10) has synced them.
            if self._sync is not None:
                self._sync()
        else:
            self._sent_index = 0

    def kick(self):
        """Wake the tick thread now (called after proposing)."""
        if self._wake_w is not None and not self._kicked:
            self._kicked = True
            try:
                os.write(self._wake_w, b"k")
            except (BlockingIOError, OSError):
                pass

    # ---------------------------------------------------------------- status
    def is_leader(self) -> bool:
        return self.syncobj._isLeader()

    def leader_raft(self) -> str | None:
        s = self.syncobj
        leader = s._getLeader()
        if leader is None:
            return None
        if not s._isLeader():
            # pysyncobj starts an election only while connected to some peer, so a follower cut
            # off from everyone keeps its last leader forever. A leader not heard from for longer
            # than the election timeout is not known any more.
            deadline = getattr(s, "_SyncObj__raftElectionDeadline", None)
            if deadline is not None and deadline < monotonicTime():
                return None
        return str(leader.id if hasattr(leader, "id") else leader)

    def raft_role_term(self) -> tuple[str, int]:
        """Role and term as one consistent pair. Read separately they can mix two moments:
        pysyncobj sets a higher term before it steps down (and fsyncs the term in between), so a
        reader could see a leader in the new term that it never led."""
        view = self.raft_view
        if view is None:
            return self.role(), self.syncobj.raftCurrentTerm
        return {0: "follower", 1: "candidate", 2: "leader"}.get(view[0], "follower"), view[1]

    def role(self) -> str:
        try:
            state = self.syncobj._SyncObj__raftState
        except AttributeError:
            state = 0
        return {0: "follower", 1: "candidate", 2: "leader"}.get(state, "follower")

    def connected(self, raft_addr: str) -> bool:
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
        tick thread outside apply) and apply (the state machine)."""
        out = {"process_s": time.process_time(), "http_s": time.thread_time(), "raft_s": None,
               "apply_s": self.state.apply_cpu_s}
        thread = getattr(self.syncobj, "_SyncObj__thread", None)
        if thread is not None and thread.ident is not None:
            try:
                tick = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
                out["raft_s"] = max(0.0, tick - self.state.apply_cpu_s)
            except (OSError, AttributeError):
                pass
        return out

    def transfer_leadership(self, callback=None):
        try:
            self.syncobj.transferLeadership(callback=callback)
        except Exception:
            log.exception("leadership transfer failed")

    def destroy(self):
        self.syncobj.destroy()
