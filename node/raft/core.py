"""The pure Raft core (issue 36, step 1): syncobj.py's algorithm without its I/O.

A `RaftCore` has no socket, file, thread, clock or randomness of its own. The caller drives it in
the style of etcd-io/raft's RawNode:

* `tick()` advances its logical clock by one tick (the caller decides how long a tick is);
* `step(message)` hands it a message from a peer;
* `propose(data)` appends a command on the leader;
* `ready()` returns a `Ready`: entries and hard state to persist, messages to send, committed
  entries to apply; `advance(ready)` tells it the Ready was handled.

The order the caller keeps (the Ready loop):
1. send `ready.messages` at once: they are the leader's appends, which may leave before the
   leader's own write (Raft thesis §10.2.1; the fork's "The leader syncs after sending");
2. persist `ready.entries` (drop the log from `entries[0].index` on, then append them), then
   `ready.hard_state`, and sync both when `ready.must_sync`. Entries first: the stored commit
   index must never cover entries that are not on disk (the fork syncs the journal before it
   stores the commit index); a crash between the two leaves the old hard state, which is safe;
3. send `ready.messages_after_sync`: every answer that promises something durable (a vote, an
   acknowledged append: the fork's "A follower syncs before it acknowledges", "Term and vote on
   disk") and everything else that is not the leader's append;
4. apply `ready.committed_entries` (only entries this node persisted: an entry is applied from
   its own disk's copy);
5. `advance(ready)`. One Ready at a time: `ready()` again before `advance()` raises
   `CoreInUse`. In between, while the disk syncs, the node may go on: `step`, `tick` and
   `propose` are allowed (what they produce goes into the next Ready, so an answer they make
   still waits for its own sync), and a follower's log cut meanwhile is handled in `advance`.
A leader counts its own copy of an entry toward the majority only from `advance()` on: answers
of followers that arrive while its own write is under way count at once, its own copy later.

Messages received since the last tick are stepped before the next `tick()`: "recently" (a
leader heard within the election timeout, a majority answered within it) is then measured
against messages the node has read, which is what the fork's `__lastPollEnd` ensured for a tick
thread that stalled.

Names follow syncobj.py's (`raftCurrentTerm`, `_sendAppendEntries`, `_onBecomeLeader`,
`_conflictStart`, ...) so that each rule can be read next to the code it was carved from; see
node/raft/FORK.md "The pure core and the Ready loop (in progress)" for where each of the fork's fixes lives here
and what is left to the Ready loop (step 2). The caller also calls `compact(index, data)` once it
wrote and synced a snapshot of its state machine at an applied index (the core then sends it to
a follower that needs what was dropped), and a Ready's `snapshot` (one installed from the
leader) is persisted and restored before anything else of that Ready.

The log's older entries (etcd-io/raft's Storage): a caller that gives a `storage` lets the core
hold the commands of only its newest entries, `Config.log_memory_bytes` of them; an older
command, on disk (the node persisted it), is let go and asked back through
`storage.data(index, term)` when the core needs it again (an append to a follower far behind,
an apply after a restart). Without a storage the core holds its whole log, as upstream did.
"""
from __future__ import annotations

import enum
import json
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple


class MessageType(enum.Enum):
    """syncobj.py's message types, by their wire names there."""
    REQUEST_PREVOTE = 'request_prevote'
    RESPONSE_PREVOTE = 'response_prevote'
    REQUEST_VOTE = 'request_vote'
    RESPONSE_VOTE = 'response_vote'
    APPEND_ENTRIES = 'append_entries'
    NEXT_NODE_IDX = 'next_node_idx'     # the answer to an append (upstream's name)
    TIMEOUT_NOW = 'timeout_now'
    INSTALL_SNAPSHOT = 'install_snapshot'   # upstream: an append_entries with 'serialized'


class RaftState(enum.IntEnum):
    """syncobj.py's _RAFT_STATE, same values."""
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2


class EntryKind(enum.IntEnum):
    """syncobj.py's _COMMAND_TYPE (VERSION, 3, is the state machine's, not Raft's)."""
    REGULAR = 0
    NO_OP = 1
    MEMBERSHIP = 2      # data: a ConfChange, encoded


class ChangeType(enum.Enum):
    """syncobj.py's change requests, by their names there."""
    ADD = 'add'
    REMOVE = 'rem'


class ConfChange(NamedTuple):
    """One membership change (syncobj.py's ('add' | 'rem', address, node, info)): one voter added
    or removed at a time (Raft thesis §4.1: any two majorities of the configurations before and
    after overlap). `info` is the member's builtins (raftq: its id and URL; the fork's member info)."""
    type: ChangeType
    node: str
    info: dict | None = None

    def encode(self):
        # builtins as JSON, never a pickle: a journal entry names no class (the fork's snapshots)
        return json.dumps([self.type.value, self.node, self.info], sort_keys=True).encode()

    @classmethod
    def decode(cls, data):
        kind, node, info = json.loads(data)
        return cls(ChangeType(kind), node, info)


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    data: bytes = b''
    kind: EntryKind = EntryKind.REGULAR


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state machine at `index` (upstream's raft.dump: its 'last' entry and its members);
    `data` is the caller's, opaque to the core."""
    index: int
    term: int
    voters: frozenset
    data: bytes = b''


@dataclass(frozen=True, slots=True)
class HardState:
    """What a node persists besides its log (the fork's meta file: term, vote, commit index)."""
    term: int = 0
    vote: str | None = None
    commit: int = 0


@dataclass(frozen=True, slots=True)
class Message:
    """One record for every type; the fields a type does not use keep their defaults, so the
    snapshot transfer and membership fields can be added later without touching a call site."""
    type: MessageType
    src: str
    dst: str
    term: int
    # REQUEST_PREVOTE, REQUEST_VOTE: the candidate's last entry
    last_log_index: int = 0
    last_log_term: int = 0
    # RESPONSE_PREVOTE, RESPONSE_VOTE
    granted: bool = False
    # APPEND_ENTRIES
    prev_log_index: int = 0
    prev_log_term: int = 0
    entries: tuple = ()
    commit_index: int = 0
    # NEXT_NODE_IDX (commit_index: the follower's, so a departing member's answer says it
    # knows its removal is committed): success, and the next index the follower wants; on a refusal the
    # prev_log_index it refused (to tell a late refusal from a current one) and, in
    # next_node_idx, the hint where the leader should try next (the fork's __conflictStart)
    success: bool = False
    next_node_idx: int = 0
    reject_index: int = 0
    log_unverified: bool = False    # the follower's log is untrusted: it may lack what it acknowledged
    want_commit: bool = True        # the follower wants each moved commit index at once (setCommitWanted)
    # INSTALL_SNAPSHOT (with commit_index)
    snapshot: Snapshot | None = None


@dataclass(frozen=True, slots=True)
class Ready:
    entries: tuple              # to persist: the log from entries[0].index on is replaced by them
    hard_state: HardState | None  # to persist, when it changed
    messages: tuple             # to send now, before or while persisting
    messages_after_sync: tuple  # to send once entries and hard state are on disk
    committed_entries: tuple    # to apply, in order
    must_sync: bool = False     # entries, term or vote changed (a commit index alone needs no
                                # sync: the fork's memory mode writes it unsynced)
    log_verified: bool = False  # an untrusted log (disk checks) was matched: clear its mark on disk
    snapshot: Snapshot | None = None    # installed from the leader: persist it and restore the state
                                        # machine from it before entries and committed_entries, and
                                        # drop the log it covers (it is the log's start from now on)

    def __bool__(self):
        return bool(self.snapshot or self.entries or self.hard_state or self.messages or self.messages_after_sync
                    or self.committed_entries or self.log_verified)


@dataclass(frozen=True, slots=True)
class Config:
    """Timeouts in ticks. Upstream's names: raftMinTimeout, raftMaxTimeout, appendEntriesPeriod,
    leaderFallbackTimeout, appendEntriesBatchSizeBytes, preVote, checkQuorum."""
    election_timeout_min: int = 10
    election_timeout_max: int = 20
    heartbeat_interval: int = 1
    leader_fallback_timeout: int | None = None   # None: CheckQuorum's window only
    max_append_bytes: int = 1 << 20
    max_append_entries: int = 4096
    max_inflight: int = 4       # appends with entries in flight per follower (flow control)
    retransmit_timeout: int = 5  # an append unanswered this long: probe the follower again
    departing_timeout: int = 500  # upstream's departingTimeout: replicate to a removed member this long at most
    pre_vote: bool = True
    check_quorum: bool = True
    # peerLost: ticks between the ranks of the followers that stand early when their link to
    # the leader closed (0: they wait out the election timeout, as upstream does)
    leader_lost_stagger: int = 0
    # with a storage: bytes of commands held in memory, the newest entries' (the rest are read
    # back through it; membership entries and no-ops are always held: they are small)
    log_memory_bytes: int = 16 << 20     # loop.py gives tuning.journal_memory_bytes


class NotLeader(Exception):
    """propose() on a node that does not lead; `leader` is the one it knows of, or None."""
    def __init__(self, leader):
        super().__init__(f'not the leader (leader: {leader})')
        self.leader = leader


class ProgressState(enum.Enum):
    """How the leader sends to a follower (etcd's Progress; SNAPSHOT comes with snapshots)."""
    PROBE = 'probe'             # one append at a time until one matches
    REPLICATE = 'replicate'     # pipelined: next index optimistic, up to max_inflight appends
    SNAPSHOT = 'snapshot'       # it needs entries the log no longer holds: a snapshot is out


class Progress:
    """The leader's view of one follower (upstream: raftNextIndex, raftMatchIndex,
    lastResponseTime, spread over dicts)."""
    __slots__ = ('match', 'next', 'state', 'inflight', 'paused', 'lastResponseTime', 'snapshotSent', 'wantsCommit')

    def __init__(self, nextIndex, now):
        self.match = 0
        self.next = nextIndex
        self.state = ProgressState.PROBE
        self.inflight = deque()     # (last index, tick sent) of each append in flight, ascending
        self.paused = False         # PROBE: a probe is out, wait for its answer or a heartbeat
        self.lastResponseTime = now
        self.snapshotSent = 0       # SNAPSHOT: when (ticks); sent again after retransmit_timeout
        self.wantsCommit = True     # it asks to hear a moved commit index at once (its last answer)

    def becomeProbe(self):
        self.state = ProgressState.PROBE
        self.next = self.match + 1
        self.inflight.clear()
        self.paused = False


class CoreInUse(RuntimeError):
    """Stepped, ticked or proposed to between ready() and advance()."""


class Refusal(enum.Enum):
    """Why the leader refused a request (upstream's FAIL_REASON.REQUEST_DENIED, told apart)."""
    TRANSFER_IN_PROGRESS = 'transfer in progress'   # proposals wait while leadership moves
    UNKNOWN_NODE = 'unknown node'                   # not a voter of this leader, or itself
    BEHIND = 'behind'                               # the target's log lacks some of the leader's
    NO_CANDIDATE = 'no candidate'                   # nobody answered recently to pick
    CHANGE_PENDING = 'change pending'               # the last change, or the leader's no-op, is uncommitted
    ALREADY_MEMBER = 'already a member'             # an add of a voter, or a learner asked for twice
    SELF = 'self'                                   # the leader removing itself: transfer leadership first


class Storage:
    """What the core reads back of its persisted log (etcd-io/raft's Storage.Entries): the
    command of the entry at `index`, which has `term`. It may raise (a disk that fails): the
    error reaches the core's caller."""
    def data(self, index, term):
        raise NotImplementedError


class Refused(Exception):
    """A request the leader refused; `reason` is a Refusal."""
    def __init__(self, reason):
        super().__init__(reason.value)
        self.reason = reason


class RaftCore:
    """One node's Raft algorithm. `voters` includes `nodeId`. `rng` is a random.Random (or any
    object with randint) the caller seeds: the election timeout's jitter is its only use.
    `hardState` and `entries` are what the node persisted (entries from index 1, contiguous);
    `applied` is the last index the caller's state machine already holds. `unverifiedClaim`:
    the disk checks found the log damaged (the fork's logUnverified); the commit index the node
    had claimed, or 0 when unknown."""

    def __init__(self, nodeId, voters, rng, config=None, hardState=None, entries=(), applied=0,
                 unverifiedClaim=None, snapshot=None, storage=None):
        self.id = nodeId
        self._storage = storage
        # (index, voters, change) of every configuration in the log; the first is the one before
        # the log's first entry (a node being added starts outside it: a learner; a snapshot's)
        self._snapshot = snapshot
        base = snapshot or Snapshot(0, 0, frozenset(voters))
        self._configs = [(base.index, frozenset(base.voters), None)]
        self._others = ()
        self._rng = rng
        self.conf = config or Config()
        hs = hardState or HardState()
        # upstream's raftLog[0]: the boundary, the snapshot's last entry (its entries follow)
        self._log = [Entry(base.index, base.term, kind=EntryKind.NO_OP)]
        self._log.extend(entries)
        self._checkContiguous(self._log)
        # commands held from _heldFrom on (_heldBytes of them); before it, a storage's are let
        # go (data None: the caller may pass them so, when it has a storage)
        self._heldFrom, self._heldBytes = base.index + 1, 0
        for entry in entries:
            self._applyChange(entry)
            if entry.data is None:
                self._heldFrom, self._heldBytes = entry.index + 1, 0
            else:
                self._heldBytes += len(entry.data)
        self.raftCurrentTerm = hs.term
        self.votedForNodeId = hs.vote
        self.raftCommitIndex = min(max(hs.commit, base.index), self._lastIndex())
        self.raftLastApplied = min(max(applied, base.index), self.raftCommitIndex)
        self._stableIndex = self._lastIndex()
        self._letGo()
        self._persisted = HardState(hs.term, hs.vote, self.raftCommitIndex)
        self._initVolatile(unverifiedClaim)
        self._onConfigChanged()

    def _initVolatile(self, unverifiedClaim):
        self.raftState = RaftState.FOLLOWER
        self.raftLeader = None
        self._now = 0
        self.raftElectionDeadline = self._generateRaftTimeout()
        self._lastLeaderContact = None
        self._progress = {}         # leader: every node it replicates to (voters, learners, departing)
        self._learners = set()      # leader: caught up before they are added (thesis §4.2.1)
        self._departing = {}        # leader: removed node -> (removal index, tick removed)
        self._noopIndex = None      # leader: its no-op (a change waits until it is committed)
        self._preVoteTerm = None
        self._preVoters = set()
        self._votes = set()
        self._transferInProgress = False   # a follower: TimeoutNow received, the election is forced
        self._transferTarget = None         # a leader: the node it hands leadership to ...
        self._transferPauseUntil = 0        # ... and until when (ticks) it takes no proposal
        self._eligible = True
        self._unverified = unverifiedClaim
        self._verifiedNews = False
        self._heartbeatDue = 0
        self._commitNotice = False
        self._wantCommit = getattr(self, '_wantCommit', True)
        self._msgs = []
        self._msgsAfterSync = []
        self._pending = None
        self._snapshotNews = None   # a snapshot installed, for the next Ready

    @staticmethod
    def _checkContiguous(log):
        for a, b in zip(log, log[1:]):
            if b.index != a.index + 1 or b.term < a.term:
                raise ValueError(f'log not contiguous at {a.index} -> {b.index} (terms {a.term} -> {b.term})')

    # -- what the caller reads ------------------------------------------------------------

    @property
    def state(self):
        return self.raftState

    @property
    def term(self):
        return self.raftCurrentTerm

    @property
    def leader(self):
        return self.raftLeader

    @property
    def commitIndex(self):
        return self.raftCommitIndex

    @property
    def lastIndex(self):
        return self._lastIndex()

    @property
    def ticks(self):
        """The core's clock: ticks since it started (raftElectionDeadline is on it)."""
        return self._now

    @property
    def logUnverified(self):
        return self._unverified is not None

    def entries(self, first=1, last=None):
        """The log's entries first..last, from the snapshot's on at most (a copy), with their
        commands (read back through the storage where the core let them go)."""
        first = max(first, self._log[0].index + 1)
        last = self._lastIndex() if last is None else last
        out = self._log[first - self._log[0].index:last - self._log[0].index + 1]
        if first < self._heldFrom:
            out = [self._whole(e) for e in out]
        return out

    @property
    def heldBytes(self):
        """Bytes of commands the core holds from its newest entries (with a storage; without
        one, those of its whole log)."""
        return self._heldBytes

    def _whole(self, entry):
        if entry.data is not None:
            return entry
        return Entry(entry.index, entry.term, self._storage.data(entry.index, entry.term), entry.kind)

    def _letGo(self):
        """With a storage: the oldest held commands past log_memory_bytes are let go, of
        entries on disk only (the storage holds them); membership entries and no-ops are kept."""
        if self._storage is None:
            return
        log, base, limit = self._log, self._log[0].index, self.conf.log_memory_bytes
        held, pos, last = self._heldBytes, self._heldFrom - base, min(self._stableIndex, self._lastIndex() - 1) - base
        while held > limit and pos <= last:
            e = log[pos]
            held -= len(e.data)
            if e.kind == EntryKind.REGULAR:
                log[pos] = Entry(e.index, e.term, None, e.kind)
            pos += 1
        self._heldBytes, self._heldFrom = held, pos + base

    def _forget(self, first, last):
        """Entries first..last leave the log (cut or compacted): their held bytes with them."""
        base, lo = self._log[0].index, max(first, self._heldFrom)
        self._heldBytes -= sum(len(e.data) for e in self._log[lo - base:last - base + 1])

    def progress(self, peer):
        return self._progress.get(peer)

    def setCommitWanted(self, wanted):
        """The fork's conf.commitWanted, asked by the caller: whether this node, as a follower,
        wants each moved commit index at once (raftq: while long polls are parked on it) rather
        than with the next append or heartbeat. Said to the leader in every answer to an append;
        the leader sends a commit notice only to followers that asked (True by default)."""
        self._wantCommit = bool(wanted)

    def setEligible(self, eligible):
        """upstream's conf.electionEligible, asked by the caller instead of called back: raftq
        says no while the data disk is below its free-space reserve."""
        self._eligible = bool(eligible)

    # -- the log --------------------------------------------------------------------------

    def _lastIndex(self):
        return self._log[-1].index

    def _lastTerm(self):
        return self._log[-1].term

    def _termAt(self, index):
        """The term of the entry at index, or None when the log does not hold it."""
        pos = index - self._log[0].index
        if 0 <= pos < len(self._log):
            return self._log[pos].term
        return None

    def _getEntries(self, fromIdx):
        """Entries from fromIdx, at most max_append_entries and max_append_bytes (at least one),
        as upstream's __getEntries with appendEntriesBatchSizeBytes."""
        pos = fromIdx - self._log[0].index
        end = min(len(self._log), pos + self.conf.max_append_entries)
        size, out = 0, []
        for entry in self._log[pos:end]:
            if entry.data is None:
                entry = self._whole(entry)
            size += len(entry.data)
            if out and size > self.conf.max_append_bytes:
                break
            out.append(entry)
        return tuple(out)

    def _deleteEntriesFrom(self, index):
        if index <= self.raftCommitIndex:
            # Raft never removes a committed entry; doing so is a safety violation, not a state
            # to carry on from (the fork logged it CRITICAL: "truncating already-applied").
            raise AssertionError(f'{self.id}: truncating committed entries from {index} '
                                 f'(commit index {self.raftCommitIndex})')
        self._forget(index, self._lastIndex())
        del self._log[index - self._log[0].index:]
        self._heldFrom = min(self._heldFrom, index)
        self._stableIndex = min(self._stableIndex, index - 1)
        self._rollBackChanges(index)

    # -- the caller's four calls -------------------------------------------------------------

    def tick(self):
        self._now += 1
        if self._transferTarget is not None and self._now >= self._transferPauseUntil:
            self._transferTarget = None     # abandoned: the target did not win in time
        if self.raftState == RaftState.LEADER:
            self._checkQuorum()
        if self.raftState == RaftState.LEADER and self._departing:
            self._tickDeparting()
        if self.raftState != RaftState.LEADER:
            self._tickElection()
        elif self._now >= self._heartbeatDue:
            self._heartbeat()

    def step(self, m):
        if m.dst != self.id:
            raise ValueError(f'{self.id}: message for {m.dst}')
        if m.type in (MessageType.REQUEST_PREVOTE, MessageType.REQUEST_VOTE) and m.src not in self.voters \
                and not self._isUpToDate(m):
            # The fork ignores every vote request of a node outside its configuration: a removed
            # node's higher term would depose a leader. Only when its log is behind, here: a node
            # whose log lacks the change that added the candidate must still be able to vote for
            # it (the simulator's seed 31: 4 voters, one down, the one behind in the log refused
            # the new member that held the longest log, and nobody could be elected). A removed
            # node whose log is not behind is refused by the vote rules anyway, or knows it is out.
            return
        if m.term > self.raftCurrentTerm and not self._isPreVoteTerm(m):
            # Raft §5.1, for every message (upstream did it for votes and appends only; a
            # stale leader now also steps down on an answer from a newer term)
            self._transferInProgress = False
            self._becomeFollower(m.term)
        self._HANDLERS[m.type](self, m)

    def peerLost(self, node):
        """The caller's connection to `node` closed (its process ended: the kernel closes a
        killed process's sockets at once; or the network cut it). A follower that loses its
        leader so stops counting on it: it grants pre-votes from now on, and stands after a
        short delay instead of a whole election timeout (docs/cluster.md "Raft engines").
        The followers stand in turn, by their addresses' order, `leader_lost_stagger` ticks
        apart with a jitter within half of it, so that two of them rarely split the vote. Only
        a hint: when the leader is alive, the others still hear it and refuse the pre-vote
        (PreVote), and nobody's term moves."""
        stagger = self.conf.leader_lost_stagger
        if stagger <= 0 or self.raftState != RaftState.FOLLOWER or node != self.raftLeader:
            return
        self.raftLeader = None
        self._lastLeaderContact = None
        rank = sorted(self.voters - {node}).index(self.id) if self.id in self.voters else 0
        soon = self._now + rank * stagger + self._rng.randint(1, max(1, stagger // 2))
        self.raftElectionDeadline = min(self.raftElectionDeadline, soon)

    def propose(self, data, kind=EntryKind.REGULAR):
        """Append a command on the leader; returns (index, term): the entry applied at that index
        with that term is this command (upstream's commandsWaitingCommit check)."""
        if self.raftState != RaftState.LEADER:
            raise NotLeader(self.raftLeader)
        if self._transferTarget is not None:
            raise Refused(Refusal.TRANSFER_IN_PROGRESS)
        if kind == EntryKind.MEMBERSHIP:
            raise ValueError('a membership change goes through proposeChange()')
        return self._appendEntry(bytes(data), kind)

    def _appendEntry(self, data, kind):
        entry = Entry(self._lastIndex() + 1, self.raftCurrentTerm, data, kind)
        self._log.append(entry)
        self._heldBytes += len(data)
        if self._applyChange(entry):
            self._onConfigChanged()
        return entry.index, entry.term

    @property
    def transferTarget(self):
        """The node this leader is handing leadership to, or None."""
        return self._transferTarget

    def transferLeadership(self, node=None):
        """syncobj.py's transferLeadership (Raft 'TimeoutNow', thesis §3.10): ask `node` (None:
        the voter heard recently with the highest match index) to stand at once. Refused
        (`Refused`) unless it holds every entry of the leader's log: behind, it would lose the
        election it is asked to start. Returns the target. Until it leads, or for at most
        election_timeout_min ticks (upstream's raftMinTimeout; then the transfer is abandoned),
        propose() refuses: entries appended meanwhile would make the target's log shorter than
        the leader's and of the followers' it had sent them to, which would refuse their votes
        (the fork measured two transfers and 600 ms without writes under load)."""
        if self.raftState != RaftState.LEADER:
            raise NotLeader(self.raftLeader)
        if self._transferTarget is not None:
            raise Refused(Refusal.TRANSFER_IN_PROGRESS)
        if node is None:
            node = self._transferCandidate()
        if node == self.id or node not in self._others:
            raise Refused(Refusal.UNKNOWN_NODE)
        if self._progress[node].match != self._lastIndex():
            raise Refused(Refusal.BEHIND)
        self._send(MessageType.TIMEOUT_NOW, node)
        self._transferTarget = node
        self._transferPauseUntil = self._now + self.conf.election_timeout_min
        return node

    def _transferCandidate(self):
        recent = [(self._progress[n].match, n) for n in self._others
                  if self._now - self._progress[n].lastResponseTime < self.conf.election_timeout_min]
        if not recent:
            raise Refused(Refusal.NO_CANDIDATE)
        return max(recent)[1]

    # -- membership (syncobj.py: __changeCluster, __doChangeCluster, addLearner, __tickDeparting) --

    @property
    def voters(self):
        """The configuration in force: the last one in the log, committed or not (thesis §4.1: a
        node uses the newest configuration in its log, applied when appended)."""
        return self._configs[-1][1]

    def votersAt(self, index):
        """The configuration in force at `index` (from the snapshot's on): the last change at
        or before it (a snapshot's members)."""
        return next(c[1] for c in reversed(self._configs) if c[0] <= index)

    @property
    def removedFromCluster(self):
        """This node's own removal is committed (the fork's removedFromCluster): it will never
        stand again, and the caller may stop it."""
        for index, _, change in reversed(self._configs):
            if change is not None and change.node == self.id and index <= self.raftCommitIndex:
                return change.type == ChangeType.REMOVE
        return False

    @property
    def learners(self):
        return frozenset(self._learners)

    def addLearner(self, node):
        """On the leader: replicate to `node` without counting it nor asking its vote, until the
        caller proposes its add (once learnerMatchIndex is close to the log's end). Leaving
        leadership drops every learner, as the fork's does."""
        self._checkLeader()
        if node == self.id or node in self.voters or node in self._progress:
            raise Refused(Refusal.ALREADY_MEMBER)
        self._learners.add(node)
        self._progress[node] = Progress(self._lastIndex() + 1, self._now)

    def dropLearner(self, node):
        if node in self._learners:
            self._learners.discard(node)
            del self._progress[node]

    def learnerMatchIndex(self, node):
        """The learner's match index on this leader, or None when it is none."""
        return self._progress[node].match if node in self._learners else None

    def proposeChange(self, type, node, info=None):
        """syncobj.py's __changeCluster on the leader: append one change; returns (index, term).
        Refused while the last change or this leader's no-op is uncommitted (one change at a
        time: two in flight could give majorities of the old and the new configuration that do
        not overlap; the no-op commits any change an earlier leader left), for an add of a voter,
        a removal of a non-voter, and a removal of the leader itself (the fork: hand leadership
        over first)."""
        self._checkLeader()
        if self._transferTarget is not None:
            raise Refused(Refusal.TRANSFER_IN_PROGRESS)
        if max(self._configs[-1][0], self._noopIndex) > self.raftCommitIndex:
            raise Refused(Refusal.CHANGE_PENDING)
        if type == ChangeType.ADD and node in self.voters:
            raise Refused(Refusal.ALREADY_MEMBER)
        if type == ChangeType.REMOVE and node == self.id:
            raise Refused(Refusal.SELF)
        if type == ChangeType.REMOVE and node not in self.voters:
            raise Refused(Refusal.UNKNOWN_NODE)
        return self._appendEntry(ConfChange(type, node, info).encode(), EntryKind.MEMBERSHIP)

    def _checkLeader(self):
        if self.raftState != RaftState.LEADER:
            raise NotLeader(self.raftLeader)

    def _applyChange(self, entry):
        """A membership entry takes effect as soon as it is in the log (§4.1), on every node;
        True when the configuration changed."""
        if entry.kind != EntryKind.MEMBERSHIP:
            return False
        change = ConfChange.decode(entry.data)
        voters = self.voters
        voters = voters | {change.node} if change.type == ChangeType.ADD else voters - {change.node}
        self._configs.append((entry.index, voters, change))
        return True

    def _rollBackChanges(self, index):
        """The log is cut from `index`: the changes there are undone (upstream's reverse
        __doChangeCluster), back to the configuration of what is left."""
        if self._configs[-1][0] >= index:
            while self._configs[-1][0] >= index:
                self._configs.pop()
            self._onConfigChanged()

    def _onConfigChanged(self):
        self._others = tuple(sorted(self.voters - {self.id}))
        if self.raftState != RaftState.LEADER:
            return
        for node in self._others:
            if node not in self._progress:
                self._progress[node] = Progress(self._lastIndex() + 1, self._now)
            # a learner added (or a departing member added back) keeps its progress: it counts
            # with what it already holds (the fork's add)
            self._learners.discard(node)
            self._departing.pop(node, None)
        for node in list(self._progress):
            if node not in self.voters and node not in self._learners and node not in self._departing:
                # the fork's "a removed member is told": replicated to until it knows its
                # removal is committed, never counted
                self._departing[node] = (self._configs[-1][0], self._now)

    def _tickDeparting(self):
        for node, (index, since) in list(self._departing.items()):
            if self._now - since > self.conf.departing_timeout:
                self._dropDeparting(node)

    def _dropDeparting(self, node):
        del self._departing[node]
        del self._progress[node]

    # -- snapshots (syncobj.py: __tryLogCompaction, __deleteEntriesTo, the 'serialized' install) --

    @property
    def snapshot(self):
        """The last snapshot this node took or installed, or None."""
        return self._snapshot

    def compact(self, index, data):
        """The caller wrote a snapshot of its state machine at `index` (applied, so on disk) and
        synced it; the core drops the log before it and sends the snapshot to a follower that
        needs what it dropped. The caller compacts its journal after the snapshot is on disk (the
        fork's "snapshots synced around the rename")."""
        start = self._log[0].index
        if index <= start:
            return
        if index > self.raftLastApplied:
            raise ValueError(f'{self.id}: compact({index}) past the last applied entry {self.raftLastApplied}')
        term = self._termAt(index)
        configs = [c for c in self._configs if c[0] <= index]
        base = configs[-1]
        self._configs = [(index, base[1], base[2])] + [c for c in self._configs if c[0] > index]
        self._snapshot = Snapshot(index, term, base[1], data)
        self._forget(start + 1, index)
        self._heldFrom = max(self._heldFrom, index + 1)
        self._log = [Entry(index, term, kind=EntryKind.NO_OP)] + self._log[index - start + 1:]

    def _sendSnapshot(self, node, pr):
        pr.state, pr.snapshotSent, pr.paused = ProgressState.SNAPSHOT, self._now, False
        pr.inflight.clear()
        self._send(MessageType.INSTALL_SNAPSHOT, node, afterSync=False, snapshot=self._snapshot,
                   commit_index=self.raftCommitIndex)

    def _onInstallSnapshot(self, m):
        if m.term < self.raftCurrentTerm:
            return
        self._hearLeader(m)
        snap = m.snapshot
        if snap.index > self.raftCommitIndex and self._termAt(snap.index) != snap.term:
            self._restore(snap)
        else:
            # it holds the snapshot's last entry (log matching: everything before it too), or has
            # committed past it: keep the log (a leader's old snapshot would cut entries)
            self.raftCommitIndex = max(self.raftCommitIndex, snap.index)
            if self._unverified is not None:
                self._checkCaughtUp(snap.index, m.commit_index)
        self._sendNextNodeIdx(m.src, True, snap.index + 1, 0)

    def _restore(self, snap):
        """Replace the log by the snapshot (upstream's __loadDumpFile(clearJournal=True)); the
        caller restores its state machine from the Ready's snapshot. An untrusted log is trusted
        again (the fork's disk checks: "or a snapshot was installed")."""
        # a member the snapshot's configuration leaves out was removed, and that is committed
        removed = self.id in self.voters and self.id not in snap.voters
        self._log = [Entry(snap.index, snap.term, kind=EntryKind.NO_OP)]
        self._heldFrom, self._heldBytes = snap.index + 1, 0
        change = ConfChange(ChangeType.REMOVE, self.id) if removed else None
        self._configs = [(snap.index, frozenset(snap.voters), change)]
        self.raftCommitIndex = self.raftLastApplied = self._stableIndex = snap.index
        self._snapshot = self._snapshotNews = snap
        if self._unverified is not None:
            self._unverified, self._verifiedNews = None, True
        self._onConfigChanged()

    def has_ready(self):
        """False while a Ready is being handled (nothing can be handed out before advance())."""
        if self._pending is not None:
            return False
        self._sendAppendEntries()
        hs = self._persisted
        return bool(self._msgs or self._msgsAfterSync or self._stableIndex < self._log[-1].index
                    or self._snapshotNews is not None
                    or self.raftLastApplied < min(self.raftCommitIndex, self._stableIndex)
                    or hs.term != self.raftCurrentTerm or hs.vote != self.votedForNodeId
                    or hs.commit != self.raftCommitIndex or self._verifiedNews)

    def ready(self):
        self._checkFree()
        self._sendAppendEntries()
        hs, old = self._hardState(), self._persisted
        applyTo = min(self.raftCommitIndex, self._stableIndex)
        entries = tuple(self.entries(self._stableIndex + 1))
        rd = Ready(entries=entries, hard_state=hs if hs != old else None,
                   messages=tuple(self._msgs), messages_after_sync=tuple(self._msgsAfterSync),
                   committed_entries=tuple(self.entries(self.raftLastApplied + 1, applyTo)),
                   must_sync=bool(entries) or (hs.term, hs.vote) != (old.term, old.vote) or
                   self._snapshotNews is not None,
                   log_verified=self._verifiedNews, snapshot=self._snapshotNews)
        self._msgs, self._msgsAfterSync, self._verifiedNews, self._snapshotNews = [], [], False, None
        self._pending = rd
        return rd

    def advance(self, rd):
        if rd is not self._pending:
            raise CoreInUse(f'{self.id}: advance() of a Ready that is not the last one handed out')
        self._pending = None
        if rd.entries:
            self._markStable(rd.entries)
            self._letGo()
        if rd.hard_state is not None:
            self._persisted = rd.hard_state
        if rd.committed_entries:
            # (max: a snapshot installed meanwhile moved it past them)
            self.raftLastApplied = max(self.raftLastApplied, rd.committed_entries[-1].index)
        if self.raftState == RaftState.LEADER:
            self._maybeCommit()     # the leader's own copy counts from now on

    def _markStable(self, written):
        """The log up to the last written entry that is still the log's is on disk. A follower
        may have cut its log while the write was under way: entries written at or after the
        cut are on disk only where the log still holds the same index and term (the same entry,
        by log matching); the rest go out again in the next Ready, from the cut on."""
        for entry in reversed(written):
            if self._termAt(entry.index) == entry.term:
                self._stableIndex = max(self._stableIndex, entry.index)
                return

    def _checkFree(self):
        if self._pending is not None:
            raise CoreInUse(f'{self.id}: a Ready is being handled; advance() it first')

    def _hardState(self):
        return HardState(self.raftCurrentTerm, self.votedForNodeId, self.raftCommitIndex)

    def _send(self, type, dst, afterSync=True, **fields):
        fields.setdefault('term', self.raftCurrentTerm)
        m = Message(type, self.id, dst, **fields)
        (self._msgsAfterSync if afterSync else self._msgs).append(m)

    # -- state ------------------------------------------------------------------------------

    def _generateRaftTimeout(self):
        return self._now + self._rng.randint(self.conf.election_timeout_min, self.conf.election_timeout_max)

    def _setCurrentTerm(self, term, votedForNodeId):
        self.raftCurrentTerm = term
        self.votedForNodeId = votedForNodeId

    def _setState(self, newState):
        oldState = self.raftState
        self.raftState = newState
        if oldState == RaftState.LEADER and newState != RaftState.LEADER:
            # the fork: a leader that steps down waits a whole election timeout before it
            # stands (as etcd's becomeFollower): its timer last ran before it led
            self.raftElectionDeadline = self._generateRaftTimeout()
            self._progress = {}
            self._learners.clear()          # the fork: leaving leadership drops every learner
            self._departing.clear()
            self._noopIndex = None
            self._transferTarget = None     # a transfer ends when leadership does

    def _becomeFollower(self, term):
        self._setCurrentTerm(term, None)
        self._setState(RaftState.FOLLOWER)
        self.raftLeader = None
        self._preVoteTerm = None

    def _isPreVoteTerm(self, m):
        """A pre-vote request, or a pre-vote granted, carries the term the candidate would
        take: it changes nobody's term (granting changes nothing, the fork's PreVote)."""
        return m.type == MessageType.REQUEST_PREVOTE or (m.type == MessageType.RESPONSE_PREVOTE and m.granted)

    def _mayStandForElection(self):
        # a learner, or a member whose removal is in its log, never stands
        return self._unverified is None and self._eligible and self.id in self.voters

    def _isUpToDate(self, m):
        """Raft §5.4.1: the candidate's log is at least as up to date as this node's."""
        if m.last_log_term != self._lastTerm():
            return m.last_log_term > self._lastTerm()
        return m.last_log_index >= self._lastIndex()

    # -- elections (upstream: _onTick, __startPreVote, __startElection, __onBecomeLeader) --

    def _tickElection(self):
        if self._now < self.raftElectionDeadline or not self._mayStandForElection():
            return
        self.raftElectionDeadline = self._generateRaftTimeout()
        if self.conf.pre_vote and not self._transferInProgress:
            self._startPreVote()
        else:
            # A leader's transfer request (TimeoutNow) skips the pre-vote: the leader itself
            # asked, so nobody is deposed against its will.
            self._startElection()

    def _startPreVote(self):
        """Ask, without raising the term, whether a majority would vote for this node: they
        would only if they too have not heard from a leader for an election timeout."""
        self.raftLeader = None
        self._preVoteTerm = self.raftCurrentTerm + 1
        self._preVoters = {self.id}
        for node in self._others:
            self._send(MessageType.REQUEST_PREVOTE, node, term=self._preVoteTerm,
                       last_log_index=self._lastIndex(), last_log_term=self._lastTerm())
        self._checkPreVotes()

    def _checkPreVotes(self):
        if len(self._preVoters & self.voters) > len(self.voters) / 2:
            self._startElection()

    def _startElection(self):
        self._preVoteTerm = None
        self._transferInProgress = False
        self.raftLeader = None
        self._setState(RaftState.CANDIDATE)
        self._setCurrentTerm(self.raftCurrentTerm + 1, self.id)
        self._votes = {self.id}     # a set: a vote that arrives twice counts once
        for node in self._others:
            # after the sync: the node's term and its own vote are on disk before anyone can
            # count on them
            self._send(MessageType.REQUEST_VOTE, node, last_log_index=self._lastIndex(),
                       last_log_term=self._lastTerm())
        self._checkVotes()

    def _checkVotes(self):
        if len(self._votes & self.voters) > len(self.voters) / 2:
            self._onBecomeLeader()

    def _onBecomeLeader(self):
        self.raftLeader = self.id
        self._setState(RaftState.LEADER)
        nextIndex = self._lastIndex() + 1
        self._progress = {node: Progress(nextIndex, self._now) for node in self._others}
        # No-op command after leader election: commits the previous terms' entries (§5.4.2).
        self._noopIndex, _ = self._appendEntry(b'', EntryKind.NO_OP)
        self._heartbeatDue = self._now      # an append to every follower in this Ready
        self._heartbeat()

    def _onPreVoteRequest(self, m):
        if m.term <= self.raftCurrentTerm:
            # Tell a pre-candidate of an older term the current one, as etcd does. The fork
            # ignores it, and the simulator found what follows (FORK.md "The pure core";
            # tests/test_raft_sim.py replays it): with one node of three down, a node whose term
            # fell behind (it missed the vote request of a failed election) while it holds the
            # longer log can never win a pre-vote nor learn the newer term, and the node with the
            # newer term but the shorter log cannot win either: no leader until the third is back.
            self._send(MessageType.RESPONSE_PREVOTE, m.src, granted=False)
            return
        if self._unverified is not None or self._heardFromLeaderRecently() or not self._isUpToDate(m):
            return      # granting changes nothing here: no term, no vote, no timer
        self._send(MessageType.RESPONSE_PREVOTE, m.src, term=m.term, granted=True)   # the term asked for

    def _onPreVoteResponse(self, m):
        if m.granted and m.term == self._preVoteTerm and self.raftState != RaftState.LEADER:
            self._preVoters.add(m.src)      # per node: a late answer to an earlier round counts once
            self._checkPreVotes()

    def _onVoteRequest(self, m):
        if m.term < self.raftCurrentTerm or self.raftState == RaftState.LEADER:
            return
        if not self._isUpToDate(m) or self.votedForNodeId not in (None, m.src):
            return      # (the same candidate asking again gets its vote again: Raft's rule)
        if self._unverified is not None:
            return      # the fork: never a vote from a log that is not trusted
        self._setCurrentTerm(self.raftCurrentTerm, m.src)
        self.raftElectionDeadline = self._generateRaftTimeout()
        self._send(MessageType.RESPONSE_VOTE, m.src, granted=True)

    def _onVoteResponse(self, m):
        if self.raftState == RaftState.CANDIDATE and m.term == self.raftCurrentTerm and m.granted:
            self._votes.add(m.src)
            self._checkVotes()

    def _heardFromLeaderRecently(self):
        if self.raftState == RaftState.LEADER:
            return True
        if self.raftLeader is None or self._lastLeaderContact is None:
            return False
        return self._now - self._lastLeaderContact < self.conf.election_timeout_min

    def _checkQuorum(self):
        """On the leader, every tick: step down when no majority answered within the window
        (CheckQuorum), and ask the most up-to-date follower to stand at once (TimeoutNow): if
        only this node's incoming traffic is cut, its followers still hear it."""
        window = self._quorumWindow()
        if window is None:
            return
        deadline = self._now - window
        count = (self.id in self.voters) + sum(1 for n in self._others if self._progress[n].lastResponseTime > deadline)
        if count > len(self.voters) / 2:
            return
        target = None
        if self.conf.check_quorum and self._others:
            target = max((self._progress[n].match, self._progress[n].lastResponseTime, n) for n in self._others)[2]
        self._setState(RaftState.FOLLOWER)
        self.raftLeader = None
        if target is not None:
            self._send(MessageType.TIMEOUT_NOW, target)

    def _quorumWindow(self):
        window = self.conf.leader_fallback_timeout
        if self.conf.check_quorum:
            window = self.conf.election_timeout_min if window is None else min(window, self.conf.election_timeout_min)
        return window

    def _onTimeoutNow(self, m):
        # Graceful leadership transfer (Raft 'TimeoutNow'): an immediate election, but only
        # on request of the current leader.
        if m.term == self.raftCurrentTerm and m.src == self.raftLeader and self._mayStandForElection():
            self.raftElectionDeadline = self._now
            self._transferInProgress = True

    # -- replication: the leader (upstream: __sendAppendEntries, next_node_idx) ---------------

    def _heartbeat(self):
        """Every heartbeat_interval ticks: an append to every follower, empty when it has
        nothing to receive; a follower whose oldest append in flight went unanswered for
        retransmit_timeout (lost) is probed again from its match index."""
        self._heartbeatDue = self._now + self.conf.heartbeat_interval
        for node, pr in self._progress.items():     # voters, learners and departing members
            if pr.state == ProgressState.SNAPSHOT and self._now - pr.snapshotSent >= self.conf.retransmit_timeout:
                pr.becomeProbe()        # unanswered: sent again
            if pr.state == ProgressState.REPLICATE and pr.inflight and \
                    self._now - pr.inflight[0][1] >= self.conf.retransmit_timeout:
                pr.becomeProbe()
            pr.paused = False
            if not self._sendTo(node, pr):
                self._sendEmpty(node, pr)

    def _sendAppendEntries(self):
        """What a Ready carries: for every follower what it may receive now (proposals of this
        turn in one append per follower), and the commit index to those waiting for nothing."""
        if self.raftState != RaftState.LEADER:
            return
        last = self._log[-1].index
        notice, self._commitNotice = self._commitNotice, False
        if not notice and all(pr.next > last for pr in self._progress.values()):
            return      # (the common case on a turn without proposals: nothing to look at)
        for node, pr in self._progress.items():
            if not self._sendTo(node, pr) and notice and pr.wantsCommit and not pr.inflight and \
                    pr.state == ProgressState.REPLICATE:
                self._sendEmpty(node, pr)

    def _sendTo(self, node, pr):
        """Appends from pr.next while flow control allows; True when one was sent. REPLICATE
        pipelines (next index optimistic, at most max_inflight appends unanswered); PROBE sends
        one and waits."""
        if pr.next <= self._log[0].index:
            # it needs entries compacted away (upstream: nextNodeIndex <= raftLog[0]): the snapshot
            if pr.state == ProgressState.SNAPSHOT:
                return False
            self._sendSnapshot(node, pr)
            return True
        sent = False
        while pr.next <= self._lastIndex() and self._maySend(pr):
            entries = self._getEntries(pr.next)
            self._sendEntries(node, pr.next - 1, entries)
            sent = True
            if pr.state == ProgressState.REPLICATE:
                pr.next = entries[-1].index + 1
                pr.inflight.append((entries[-1].index, self._now))
            else:
                pr.paused = True
        return sent

    def _maySend(self, pr):
        if pr.state == ProgressState.SNAPSHOT:
            return False
        if pr.state == ProgressState.PROBE:
            return not pr.paused
        return len(pr.inflight) < self.conf.max_inflight

    def _sendEmpty(self, node, pr):
        """A heartbeat: at the match index while replicating (known to match, so it is never
        refused while appends are in flight), at the next index while probing (a probe)."""
        prev = pr.match if pr.state == ProgressState.REPLICATE else pr.next - 1
        if prev < self._log[0].index or pr.state == ProgressState.SNAPSHOT:
            return      # its snapshot is out, or goes out at the next probe
        if pr.state == ProgressState.PROBE:
            pr.paused = True
        self._sendEntries(node, prev, ())

    def _sendEntries(self, node, prev, entries):
        # Sent at once, before the leader's own sync (thesis §10.2.1): it counts itself later.
        self._send(MessageType.APPEND_ENTRIES, node, afterSync=False, prev_log_index=prev,
                   prev_log_term=self._termAt(prev), entries=entries, commit_index=self.raftCommitIndex)

    def _onNextNodeIdx(self, m):
        if self.raftState != RaftState.LEADER or m.term != self.raftCurrentTerm:
            return      # an answer to an append of another term or leadership
        pr = self._progress.get(m.src)
        if pr is None:
            return
        pr.lastResponseTime = self._now
        pr.wantsCommit = m.want_commit
        if m.success:
            self._onAppendSucceeded(pr, m.next_node_idx - 1)
        else:
            self._onAppendRefused(pr, m)
        if m.src in self._departing and m.commit_index >= self._departing[m.src][0]:
            self._dropDeparting(m.src)      # it knows its removal is committed

    def _onAppendSucceeded(self, pr, matched):
        while pr.inflight and pr.inflight[0][0] <= matched:
            pr.inflight.popleft()
        if pr.state != ProgressState.REPLICATE:
            pr.state, pr.paused = ProgressState.REPLICATE, False
            pr.inflight.clear()
        if matched > pr.match:
            pr.match = matched
            self._maybeCommit()
        pr.next = max(pr.next, pr.match + 1)

    def _onAppendRefused(self, pr, m):
        if m.next_node_idx <= pr.match and (m.log_unverified or m.reject_index >= pr.match):
            # The follower's disk lost entries it had acknowledged: the fork's disk checks found
            # it, or it refused an append at or past its match with a log that ends before it (a
            # wiped data dir: a new node at a member's address). Its match index is no longer
            # true; without this its refusals would all look late and it would never be repaired
            # (the fork's leader takes every refusal's hint). A refusal that is merely late and
            # fits this only sends entries again: match only lowers what the leader counts.
            pr.match = m.next_node_idx - 1
        elif m.reject_index <= pr.match or pr.state == ProgressState.SNAPSHOT:
            return      # late: the follower has matched past it since, or its snapshot is out
        if pr.state == ProgressState.PROBE and m.reject_index != pr.next - 1:
            return      # an answer to an earlier probe
        # the follower's hint (its last index + 1, or the start of its conflicting term), never
        # past what it refused nor below what it matched
        pr.becomeProbe()
        pr.next = max(pr.match + 1, min(m.next_node_idx, m.reject_index))

    def _maybeCommit(self):
        """The commit rule (Figure 2; upstream's loop in _onTick): the highest index a majority
        holds, the leader's own copy counted once persisted, committed only if it is of the
        current term (§5.4.2: earlier terms' entries commit with it)."""
        own = [self._stableIndex] if self.id in self.voters else []
        matches = sorted(own + [self._progress[n].match for n in self._others], reverse=True)
        n = matches[len(self.voters) // 2]      # over the configuration in force: never a learner
        if n > self.raftCommitIndex and self._termAt(n) == self.raftCurrentTerm:
            self.raftCommitIndex = n
            self._commitNotice = True

    # -- replication: the follower (upstream: append_entries, _skipHeldEntries) --------------

    def _onAppendEntries(self, m):
        if m.term < self.raftCurrentTerm:
            return      # a stale leader (upstream ignores it too; CheckQuorum steps it down)
        self._hearLeader(m)
        prev, prevTerm, entries = m.prev_log_index, m.prev_log_term, m.entries
        start = self._log[0]
        if prev < start.index:
            # sent before this node's snapshot (a late append): what it covers is committed, so
            # the leader's log matches it there; the rest is handled as an append at its end
            prev, prevTerm, entries = start.index, start.term, tuple(e for e in entries if e.index > start.index)
        if prev > self._lastIndex():
            return self._sendNextNodeIdx(m.src, False, self._lastIndex() + 1, prev)
        myTerm = self._termAt(prev)
        if myTerm != prevTerm:
            return self._sendNextNodeIdx(m.src, False, self._conflictStart(prev, myTerm), prev)
        matched = self._appendNew(prev, entries)
        if m.commit_index > self.raftCommitIndex:
            # only what is known to match the leader's log (the fork capped it the same way)
            self.raftCommitIndex = max(self.raftCommitIndex, min(m.commit_index, matched))
        if self._unverified is not None:
            self._checkCaughtUp(matched, m.commit_index)
        self._sendNextNodeIdx(m.src, True, matched + 1, 0)

    def _hearLeader(self, m):
        if self.raftState == RaftState.LEADER:
            raise AssertionError(f'{self.id}: two leaders in term {m.term} ({m.src})')
        if not self._transferInProgress:
            # While a transfer is pending, same-term heartbeats of the outgoing leader do not
            # postpone the forced election.
            self.raftElectionDeadline = self._generateRaftTimeout()
        self.raftLeader = m.src
        self._lastLeaderContact = self._now
        self._preVoteTerm = None
        self._setState(RaftState.FOLLOWER)

    def _appendNew(self, prev, entries):
        """Raft's follower rule (Figure 2, AppendEntries 3-4; the fork's "keeps a matching
        tail"): entries already held are kept, the log is cut only at the first conflicting
        one. Returns the last index known to match the leader's log."""
        for pos, entry in enumerate(entries):
            mine = self._termAt(entry.index)
            if mine == entry.term:
                continue
            if mine is not None:
                self._deleteEntriesFrom(entry.index)
            self._log.extend(entries[pos:])
            self._heldBytes += sum(len(e.data) for e in entries[pos:])
            if any([self._applyChange(e) for e in entries[pos:]]):
                self._onConfigChanged()
            break
        return entries[-1].index if entries else prev

    def _conflictStart(self, prevLogIdx, term):
        """The first index of the run of entries of `term` that ends at prevLogIdx; never at or
        below the commit index (committed entries match the leader's) nor at the log's first
        entry (the leader's next append must find its prevLogIdx here)."""
        floor = max(self.raftCommitIndex + 1, self._log[0].index + 1)
        idx = prevLogIdx
        while idx - 1 >= floor and self._termAt(idx - 1) == term:
            idx -= 1
        return max(idx, floor) if prevLogIdx >= floor else prevLogIdx

    def _checkCaughtUp(self, matched, leaderCommitIndex):
        """The fork's disk checks: an untrusted log votes and stands again once it matched the
        leader's up to the leader's commit index and the one it knew itself."""
        if matched >= max(leaderCommitIndex, self._unverified):
            self._unverified = None
            self._verifiedNews = True

    def _sendNextNodeIdx(self, node, success, nextNodeIdx, rejectIndex):
        # after the sync: an acknowledged entry is on this follower's disk (the fork's
        # "A follower syncs before it acknowledges"); a refusal waits for nothing but goes the
        # same way, so the answers to one leader leave in the order they were made
        self._send(MessageType.NEXT_NODE_IDX, node, success=success, next_node_idx=nextNodeIdx,
                   reject_index=rejectIndex, log_unverified=self._unverified is not None,
                   commit_index=self.raftCommitIndex,   # (a departing member: told of its removal)
                   want_commit=self._wantCommit)

    _HANDLERS = {
        MessageType.REQUEST_PREVOTE: _onPreVoteRequest,
        MessageType.RESPONSE_PREVOTE: _onPreVoteResponse,
        MessageType.REQUEST_VOTE: _onVoteRequest,
        MessageType.RESPONSE_VOTE: _onVoteResponse,
        MessageType.APPEND_ENTRIES: _onAppendEntries,
        MessageType.NEXT_NODE_IDX: _onNextNodeIdx,
        MessageType.TIMEOUT_NOW: _onTimeoutNow,
        MessageType.INSTALL_SNAPSHOT: _onInstallSnapshot,
    }


__all__ = ['ChangeType', 'ConfChange', 'Config', 'CoreInUse', 'Entry', 'EntryKind', 'HardState', 'Message',
           'MessageType', 'NotLeader', 'Progress', 'ProgressState', 'RaftCore', 'RaftState', 'Ready', 'Refusal', 'Refused', 'Snapshot']
