"""A deterministic simulator of a cluster of pure Raft cores (node/raft/core.py; issue 36, step 1).

N cores (3 or 5) on a simulated network (delay, loss, duplication, reordering, partitions, one
way too), each with a simulated disk (a Ready's entries and hard state are on it once its sync
completes; a crash loses what was not synced, or tears it: a prefix of the entries, or all of
it with the answers not yet sent; a restart may find the log's last synced entries damaged, cut
by the disk checks, the log untrusted), crashes (one node, or all at once) and restarts,
stalls (a paused process reads what arrived, then runs the ticks it missed), a client proposing
to whoever leads, an operator handing leadership to a random node (refused unless it holds the
leader's whole log) and changing the membership (a new node caught up as a learner, then added;
a member removed, the leader after handing leadership over; a removed member stopped for good;
never a change that leaves a majority of the new configuration down), log compaction (per seed:
never, or a snapshot every 12, 40 or 100 applied entries, on every node; a follower that needs
what was dropped installs the leader's), and a simulated clock (each node ticks at its own rate:
clock skew). A message lives on one connection: a crash of
either end loses it, and in some runs the other end is told, a network delay later, that the
connection closed (core.peerLost; so is each end of a partition cut both ways). Everything is
drawn from one seed, so a seed replays exactly.

A run alternates chaos phases (faults on) with calm ones (every node up, the network whole, no
loss; a minority of every configuration in play may stay down). Checked throughout: at most one
leader per term, at most one vote per term on any disk, the commit rule from outside (what a
leader commits is on the disks of a majority of the configuration its log holds), log
matching, leader completeness (a new leader holds every entry a node applied in an earlier
term), state machine
safety (no two nodes apply different entries at one index, nor hold different states after it:
each node's state machine is a hash chain of what it applied, and an installed snapshot's state
is the one every node had there), a commit index that never goes back; and liveness in calm
phases: a proposal made in one commits within `LIVENESS_MS`, every running member catches up by the phase's end, the target of a leadership transfer asked
for in one leads within `TRANSFER_MS` (unless it was down or a node was stalled), and a
member removed in one under a steady leader knows it within `RETIRE_MS`.

    python -m raftq.node.raft.sim --seeds 1000      # a summary; exit 1 on any violation
    python -m raftq.node.raft.sim --seed 17         # replay one seed, event by event

The core and the simulator import nothing of raftq outside node/raft.
"""
from __future__ import annotations

import argparse
import hashlib
import heapq
import random
import sys
import time
from dataclasses import dataclass, field, replace

from .core import (ChangeType, ConfChange, Config, CoreInUse, EntryKind, HardState, NotLeader, RaftCore, RaftState,
                   Refusal, Refused, Snapshot)

# A tick of 20 ms (raftq's append_entries_period_s), elections after 160-320 ms: the shape of
# raftq's settings (1-2 s) compressed, so that a seed goes through many elections.
CONFIG = Config(election_timeout_min=8, election_timeout_max=16, heartbeat_interval=2,
                max_append_entries=8, max_inflight=3, retransmit_timeout=4)
CHAOS_MS = (800, 2500)          # a chaos phase's length
CALM_MS = (2500, 3500)          # a calm phase's length; longer than LIVENESS_MS
LIVENESS_MS = 2000              # in a calm phase a proposal commits within this
CATCH_UP_MARK_MS = 1000         # ... and every running node holds by its end what was applied by then
DURATION_MS = 12_000
TRANSFER_EVERY_MS = (200, 1500)  # the client asks the leader to hand leadership over
TRANSFER_MS = 500               # ... and in a calm phase the up-to-date target leads within this
MEMBER_EVERY_MS = (300, 1500)   # the operator adds a node (a learner first) or removes one
NEW_NODES = 4                   # nodes added at most per run (each a new id: a removed one never returns)
LEARNER_LAG = 8                 # a learner this close to the leader's log is added
RETIRE_MS = 1000                # a member removed is stopped this long after its removal committed


class Violation(Exception):
    pass


@dataclass
class Disk:
    """What one node has persisted: its hard state, its snapshot, its log (the entries after the
    snapshot) and the fork's untrusted-log mark (the commit index it had claimed, kept until a
    leader matched it)."""
    hard_state: HardState = field(default_factory=HardState)
    entries: list = field(default_factory=list)
    unverified: int | None = None
    snapshot: Snapshot | None = None

    @property
    def first(self):
        """The index the log starts after (its snapshot's)."""
        return self.snapshot.index if self.snapshot else 0

    def holds(self, index, term):
        """The entry is on this disk: in its log, or covered by its snapshot (committed)."""
        if index <= self.first:
            return True
        pos = index - self.first - 1
        return pos < len(self.entries) and self.entries[pos].term == term

    def compact(self, snapshot):
        """A snapshot written and synced, then the journal compacted (the fork's order)."""
        del self.entries[:snapshot.index - self.first]
        self.snapshot = snapshot

    def write(self, rd, entries=None, hard_state=True):
        """Persist a Ready (or, for a torn write, a prefix of its entries, hard state or not)."""
        entries = rd.entries if entries is None else entries
        if rd.snapshot is not None:
            self.snapshot, self.entries = rd.snapshot, []
        if entries:
            del self.entries[entries[0].index - 1 - self.first:]
            self.entries.extend(entries)
        hs = rd.hard_state
        if hard_state and hs is not None:
            old = self.hard_state
            if hs.term < old.term or (hs.term == old.term and old.vote is not None and hs.vote != old.vote):
                raise Violation(f'disk: term/vote {old.term}/{old.vote} -> {hs.term}/{hs.vote}')
            self.hard_state = hs


class DiskStorage:
    """A core's storage (core.Storage): its disk's entries; what it reads back must be the entry
    the core asks for (the same index and term): it let go of only what it had persisted."""
    def __init__(self, disk, counts):
        self.disk, self.counts = disk, counts

    def data(self, index, term):
        pos = index - self.disk.first - 1
        entry = self.disk.entries[pos] if 0 <= pos < len(self.disk.entries) else None
        if entry is None or (entry.index, entry.term) != (index, term):
            raise Violation(f'storage: the core asked for ({index}, term {term}), the disk holds {entry}')
        self.counts['read_back'] += 1
        return entry.data


class Node:
    def __init__(self, nodeId, period):
        self.id = nodeId
        self.period = period        # ms per tick: clocks run at slightly different rates
        self.disk = Disk()
        self.core = None
        self.up = False
        self.incarnation = 0
        self.pending = None         # the Ready whose sync is under way
        self.proposals = []         # (data, time proposed) waiting for the next turn
        self.pausedUntil = 0        # a stalled process (a VM pause, SIGSTOP): nothing runs until then
        self.resumesAt = 0          # when the last event a stall put off runs (a calm phase's start
                                    # ends the pause, not the ticks and syncs it put off)
        self.applied = 0
        self.checkedCommit = 0      # the leader's commit index whose majority was last checked
        self.digest = b''           # its state machine: a hash chain of what it applied
        self.folded = (None, 0, None)   # (term led, index, voters): its log's configuration, folded so far


class Sim:
    def __init__(self, seed, nodes=None, durationMs=DURATION_MS, verbose=False):
        self.seed = seed
        self.rng = random.Random(seed)
        n = nodes or self.rng.choice((3, 3, 5))
        self.ids = [f'n{i}' for i in range(1, n + 1)]   # the nodes in play (members, learners, removed not yet stopped)
        self.initial = tuple(self.ids)      # every core's configuration before its log's first entry
        self.committedVoters = frozenset(self.ids)      # the configuration of the last change applied
        self.configHistory = [(0, self.committedVoters)]    # (index, voters) of every change applied
        self.joining = None         # the learner being caught up, until its add is committed
        self.gone = set()           # removed and stopped for good
        self.everDamaged = set()    # nodes whose disk lost synced entries (may lack what they acknowledged)
        # flow control and batching vary by seed: one entry per append, one append in flight, ...
        # but at least 8 entries a round trip: one entry per round trip (seed 981 of the first
        # 1,000) caught a restarted node up on 300 entries in more than LIVENESS_MS, slow and right
        entries, inflight = self.rng.choice(((1, 8), (2, 4), (8, 1), (8, 3), (64, 1), (64, 8)))
        # a closed connection told to its other end (core.peerLost: a crash closes a node's
        # connections at once, a partition cuts them), in some runs, from a stream of its own
        self.lossRng = random.Random(seed * 13 + 1)
        # the core holding only its newest commands (the rest read back from its disk), in
        # some runs, from a stream of its own: None holds the whole log
        self.memoryBytes = random.Random(seed * 11 + 5).choice((None, None, 0, 24, 200))
        self.config = replace(CONFIG, max_append_entries=entries, max_inflight=inflight,
                              leader_lost_stagger=self.lossRng.choice((0, 2, 4)),
                              log_memory_bytes=self.memoryBytes or 0)
        self.nodes = {i: Node(i, self.rng.choice((18, 19, 20, 20, 21, 22))) for i in self.ids}
        self.durationMs = durationMs
        self.verbose = verbose
        self.now = 0
        self.events = []
        self.seq = 0
        self.cut = set()            # (src, dst) pairs the network does not carry
        self.drop = self.dup = 0.0
        self.delay = (1, 5)
        self.diskMs = (0, 2)
        self.syncCrash = 0.0        # a node crashes instead of finishing a sync (chaos phases)
        self.leaders = {}           # term -> the node that led it
        self.appliedAt = {}         # index -> (term, kind, data) any node applied there
        self.digestAt = {}          # index -> the state machine's digest once it applied up to there
        self.appliedTerm = {}       # index -> the lowest term a node applied it in (>= the term it committed in)
        # compaction (a snapshot every that many applied entries; 0: never), from a stream of its
        # own so that runs without it draw what they drew before
        self.compactEvery = random.Random(seed * 7 + 3).choice((0, 12, 40, 100))
        self.acked = {}             # index -> data: acknowledged to the client
        self.calmSince = None
        self.calmCommitted = None
        self.damage = 0.0           # a restart finds its disk damaged (chaos phases)
        self.transfer = None        # (target, term, time asked, leader) of the transfer under way
        self.counts = {'messages': 0, 'proposals': 0, 'acked': 0, 'crashes': 0, 'damaged': 0, 'pauses': 0, 'elections': 0,
                       'calm_phases': 0, 'transfers': 0, 'transfers_done': 0, 'learners': 0, 'added': 0,
                       'removed': 0, 'removals_told': 0, 'compactions': 0, 'installs': 0, 'events': 0,
                       'losses_told': 0, 'read_back': 0}

    # -- the event queue ----------------------------------------------------------------------

    def at(self, t, kind, *args):
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, args))

    def log(self, what):
        if self.verbose:
            print(f'{self.now:7d} ms  {what}')

    def run(self):
        for node in self.nodes.values():
            self.restart(node.id)
        self.at(0, 'phase', 'calm')
        self.at(self.rng.randint(5, 40), 'propose')
        self.at(self.rng.randint(*TRANSFER_EVERY_MS), 'transfer')
        self.at(self.rng.randint(*MEMBER_EVERY_MS), 'member')
        while self.events and self.events[0][0] <= self.durationMs:
            t, _, kind, args = heapq.heappop(self.events)
            self.now = t
            self.counts['events'] += 1
            getattr(self, 'on_' + kind)(*args)
            if self.counts['events'] % 256 == 0:
                self.checkLogs()
        self.checkLogs()
        self.checkCalm(final=True)

    # -- nodes: the Ready loop -----------------------------------------------------------------

    def drive(self, node):
        """The node's loop: proposals of this turn, then one Ready at a time."""
        if not node.up or node.pausedUntil > self.now:
            return
        self.proposeQueued(node)
        core = node.core
        while core.has_ready():
            rd = core.ready()
            for m in rd.messages:
                self.send(m)
            node.pending = rd
            if rd.must_sync:
                # the node goes on stepping and ticking while its disk syncs (the core takes
                # them; its next Ready waits for this one's advance)
                self.at(self.now + self.rng.randint(*self.diskMs), 'synced', node.id, node.incarnation)
                self.checkLeader(node)
                return
            self.finish(node)
        self.checkLeader(node)

    def finish(self, node):
        rd, node.pending = node.pending, None
        node.disk.write(rd)
        if rd.log_verified:
            node.disk.unverified = None
        if rd.snapshot is not None:
            self.install(node, rd.snapshot)
        for m in rd.messages_after_sync:
            self.send(m)
        for entry in rd.committed_entries:
            self.apply(node, entry)
        before = node.core.commitIndex
        node.core.advance(rd)
        if node.core.commitIndex < before:
            raise Violation(f'{node.id}: commit index went back {before} -> {node.core.commitIndex}')
        self.maybeCompact(node)

    def install(self, node, snap):
        """State machine safety across installs: the snapshot's state is what every node that
        applied up to its index holds."""
        theirs = self.digestAt.setdefault(snap.index, snap.data)
        if theirs != snap.data:
            raise Violation(f'state machine safety: {node.id} installed a snapshot at {snap.index} that differs')
        node.digest, node.applied = snap.data, snap.index
        self.counts['installs'] += 1
        self.log(f'{node.id} installs a snapshot at {snap.index}')

    def maybeCompact(self, node):
        start = node.core.snapshot.index if node.core.snapshot else 0
        if self.compactEvery and node.applied - start >= self.compactEvery:
            node.core.compact(node.applied, node.digest)
            node.disk.compact(node.core.snapshot)
            self.counts['compactions'] += 1

    def stalled(self, node, kind, *args, later=0):
        """An event for a paused node waits for its resume: what arrived is read first, then
        the ticks it missed run (the Ready loop's order: step, then tick)."""
        if node.pausedUntil <= self.now:
            return False
        node.resumesAt = max(node.resumesAt, node.pausedUntil + later)
        self.at(node.pausedUntil + later, kind, *args)
        return True

    def on_synced(self, nodeId, incarnation):
        node = self.nodes[nodeId]
        if self.stalled(node, 'synced', nodeId, incarnation):
            return
        if node.up and node.incarnation == incarnation and node.pending is not None:
            if self.syncCrash and self.rng.random() < self.syncCrash:
                self.on_crash(nodeId)       # the window the durability rules are about
                self.at(self.now + self.rng.randint(10, 300), 'restart', nodeId)
                return
            self.finish(node)
            self.drive(node)

    def on_tick(self, nodeId, incarnation):
        node = self.nodes[nodeId]
        if not node.up or node.incarnation != incarnation or self.stalled(node, 'tick', nodeId, incarnation, later=1):
            return
        node.core.tick()
        self.drive(node)
        self.at(self.now + node.period, 'tick', nodeId, incarnation)

    def on_deliver(self, m, incarnations):
        node = self.nodes[m.dst]
        if not node.up or incarnations != (self.nodes[m.src].incarnation, node.incarnation):
            return      # sent to or from an earlier life of a node: the connection died with it
        if self.stalled(node, 'deliver', m, incarnations):
            return
        node.core.step(m)
        self.drive(node)

    def send(self, m):
        self.counts['messages'] += 1
        if (m.src, m.dst) in self.cut or self.rng.random() < self.drop:
            return
        # A message lives on one connection (raftq's transport is TCP): a crash of either end
        # loses it. Raft's safety does not need this; the fork's untrusted-log rule does (FORK.md
        # "The pure core", the simulator's seed 2): a leader's append sent before a damaged node
        # restarted, read after it, carries a commit index older than the node's acknowledgements.
        incarnations = (self.nodes[m.src].incarnation, self.nodes[m.dst].incarnation)
        self.at(self.now + self.rng.randint(*self.delay), 'deliver', m, incarnations)
        if self.rng.random() < self.dup:
            self.at(self.now + self.rng.randint(*self.delay), 'deliver', m, incarnations)

    def apply(self, node, entry):
        if entry.index != node.applied + 1:
            raise Violation(f'{node.id}: applied {entry.index} after {node.applied}')
        node.applied = entry.index
        node.digest = hashlib.blake2b(node.digest + b'%d %d %d ' % (entry.index, entry.term, entry.kind) + entry.data,
                                      digest_size=8).digest()
        if self.digestAt.setdefault(entry.index, node.digest) != node.digest:
            raise Violation(f'state machine safety: {node.id} holds another state after {entry.index}')
        mine = (entry.term, entry.kind, entry.data)
        self.appliedTerm[entry.index] = min(self.appliedTerm.get(entry.index, node.core.term), node.core.term)
        theirs = self.appliedAt.setdefault(entry.index, mine)
        if theirs != mine:
            raise Violation(f'state machine safety: {node.id} applied {mine} at {entry.index}, another {theirs}')
        if entry.kind == EntryKind.MEMBERSHIP and theirs is mine:
            self.onChangeCommitted(entry)
        if node.core.state == RaftState.LEADER and entry.term == node.core.term and entry.kind == EntryKind.REGULAR:
            if entry.index not in self.acked:
                self.acked[entry.index] = entry.data
                self.counts['acked'] += 1
            sent = int(entry.data.split(b'@')[1])
            if self.calmSince is not None and sent >= self.calmSince and self.calmCommitted is None:
                self.calmCommitted = self.now

    # -- crashes and restarts --------------------------------------------------------------------

    def on_crash(self, nodeId):
        node = self.nodes[nodeId]
        if not node.up:
            return
        self.counts['crashes'] += 1
        if node.pending is not None:
            self.tear(node)
        node.up, node.pending, node.core, node.pausedUntil = False, None, None, 0
        node.incarnation += 1
        self.log(f'{nodeId} crashes')
        self.tellLost(nodeId, [i for i in self.ids if i != nodeId])

    def tellLost(self, lost, nodes):
        """Each of `nodes` learns, a network delay later, that its connection to `lost` closed."""
        if self.config.leader_lost_stagger:
            for nodeId in nodes:
                incarnations = (self.nodes[lost].incarnation, self.nodes[nodeId].incarnation)
                self.at(self.now + self.lossRng.randint(*self.delay), 'lost', nodeId, lost, incarnations)

    def on_lost(self, nodeId, lost, incarnations):
        node = self.nodes[nodeId]
        if node.up and incarnations == (self.nodes[lost].incarnation, node.incarnation) \
                and not self.stalled(node, 'lost', nodeId, lost, incarnations):
            node.core.peerLost(lost)
            self.counts['losses_told'] += 1
            self.drive(node)

    def tear(self, node):
        """A crash during a sync: none of it on disk, a prefix of the entries (the hard state is
        written after them, core.py's order), or all of it (the answers never left). Nothing of
        it was acknowledged yet, so any of these is allowed."""
        rd = node.pending
        how = self.rng.randrange(3)
        if how == 1 and rd.entries:
            node.disk.write(rd, entries=rd.entries[:self.rng.randint(0, len(rd.entries))], hard_state=False)
        elif how == 2:
            node.disk.write(rd)

    def on_restart(self, nodeId):
        if self.calmSince is None and self.rng.random() < self.damage and \
                not any(n.disk.unverified is not None for n in self.nodes.values()):
            self.damageDisk(self.nodes[nodeId])
        self.restart(nodeId)

    def damageDisk(self, node):
        """The disk lost synced entries at rest (a flipped bit the journal's checksum finds: the
        log is cut before it). Acknowledged entries may be gone, so the node starts with its
        log untrusted (the fork's disk checks): no vote, no candidacy until a leader matched it.
        One node at a time: a majority damaged at once elects nobody (FORK.md: the operator's
        call), which the liveness check would report."""
        disk = node.disk
        if node.up or not disk.entries:
            return
        cut = self.rng.randrange(max(0, len(disk.entries) - 30), len(disk.entries))   # recent ones matter
        del disk.entries[cut:]
        disk.unverified = disk.hard_state.commit
        self.everDamaged.add(node.id)
        self.counts['damaged'] += 1
        self.log(f'{node.id} disk damaged: log cut to {cut} entries (commit index claimed {disk.unverified})')

    def restart(self, nodeId):
        node = self.nodes[nodeId]
        if node.up or nodeId in self.gone:
            return
        node.incarnation += 1
        node.checkedCommit, node.folded = 0, (None, 0, None)
        snap = node.disk.snapshot
        storage = None if self.memoryBytes is None else DiskStorage(node.disk, self.counts)
        node.core = RaftCore(nodeId, self.initial, random.Random(self.rng.getrandbits(64)), self.config,
                             hardState=node.disk.hard_state, entries=list(node.disk.entries),
                             unverifiedClaim=node.disk.unverified, snapshot=snap, applied=node.disk.first,
                             storage=storage)
        node.up, node.pending, node.applied, node.proposals = True, None, node.disk.first, []
        node.digest = snap.data if snap else b''
        self.at(self.now + self.rng.randint(1, node.period), 'tick', nodeId, node.incarnation)
        self.log(f'{nodeId} starts: term {node.core.term}, {node.core.lastIndex} entries, commit {node.core.commitIndex}')

    # -- the client -----------------------------------------------------------------------------

    def on_propose(self):
        leaders = [n for n in self.nodes.values() if n.up and n.core.state == RaftState.LEADER]
        if leaders:
            node = self.rng.choice(leaders)
            self.counts['proposals'] += 1
            node.proposals.append(b'c%d@%d' % (self.counts['proposals'], self.now))
            self.drive(node)
        self.at(self.now + self.rng.randint(5, 40), 'propose')

    def proposeQueued(self, node):
        waiting = []
        for data in node.proposals:
            try:
                node.core.propose(data)
            except NotLeader:
                pass        # the client would ask again elsewhere; this one is simply lost
            except Refused:
                waiting.append(data)    # a leadership transfer: the fork's commands wait in its queue
        node.proposals = waiting

    def on_transfer(self):
        """The operator hands leadership to a random node (raftq does before it removes the
        leader): refused unless that node holds the leader's whole log."""
        self.at(self.now + self.rng.randint(*TRANSFER_EVERY_MS), 'transfer')
        leaders = [n for n in self.nodes.values() if n.up and n.core.state == RaftState.LEADER]
        if not leaders:
            return
        node = self.rng.choice(leaders)
        target = self.rng.choice([i for i in self.ids if i != node.id])
        try:
            node.core.transferLeadership(target)
        except Refused as e:
            assert e.reason in (Refusal.BEHIND, Refusal.TRANSFER_IN_PROGRESS, Refusal.UNKNOWN_NODE), e.reason
            return
        self.counts['transfers'] += 1
        self.transfer = (target, node.core.term, self.now, node.id)
        self.log(f'{node.id} hands leadership to {target}')
        self.at(self.now + TRANSFER_MS, 'transfer_check', self.transfer)
        self.drive(node)

    def on_transfer_check(self, transfer):
        """Liveness: a transfer asked for in a calm phase, to a node that stayed up, completes."""
        if self.transfer != transfer:
            return
        self.transfer = None
        target, _, asked, source = transfer
        # a node whose stall put off its sync holds back its vote too (seed 885 of 1,000)
        stalled = any(n.up and n.resumesAt > asked for n in self.nodes.values())
        if self.calmSince is not None and self.calmSince <= asked and self.nodes[target].up and not stalled:
            raise Violation(f'liveness: the transfer to {target} asked at {asked} ms in a calm phase did not '
                            f'complete within {TRANSFER_MS} ms (states {self.states()})')

    # -- membership: the operator ------------------------------------------------------------

    def on_member(self):
        """Add a node (a new id, caught up as a learner, then added), or remove a member (the
        leader: hand leadership over first, as raftq does; the next leader removes it)."""
        self.at(self.now + self.rng.randint(*MEMBER_EVERY_MS), 'member')
        leaders = [n for n in self.nodes.values() if n.up and n.core.state == RaftState.LEADER]
        if not leaders:
            return
        leader = self.rng.choice(leaders)
        core = leader.core
        try:
            if self.joining is not None:
                self.promote(core)
            elif len(core.voters) < 5 and len(self.nodes) < len(self.initial) + NEW_NODES and self.rng.random() < 0.5:
                self.startLearner(core)
            elif len(core.voters) > 3:
                self.removeOne(leader)
        except Refused as e:
            assert e.reason in (Refusal.CHANGE_PENDING, Refusal.TRANSFER_IN_PROGRESS, Refusal.NO_CANDIDATE,
                                Refusal.BEHIND), e.reason
        self.drive(leader)

    def startLearner(self, core):
        nodeId = f'n{len(self.nodes) + 1}'
        self.nodes[nodeId] = Node(nodeId, self.rng.choice((18, 19, 20, 20, 21, 22)))
        self.ids.append(nodeId)
        self.restart(nodeId)
        self.joining = nodeId
        core.addLearner(nodeId)
        self.counts['learners'] += 1
        self.log(f'{core.id} replicates to the learner {nodeId}')

    def promote(self, core):
        nodeId = self.joining
        if nodeId in self.committedVoters:
            self.joining = None
        elif nodeId not in core.voters and self.nodes[nodeId].up:
            match = core.learnerMatchIndex(nodeId)
            if match is None:
                core.addLearner(nodeId)     # a new leader: learners are dropped with leadership
            elif match >= core.lastIndex - LEARNER_LAG and self.keepsMajority(core.voters | {nodeId}):
                core.proposeChange(ChangeType.ADD, nodeId, {'id': nodeId})
                self.log(f'{core.id} adds {nodeId} (match {match} of {core.lastIndex})')

    def removeOne(self, leader):
        nodeId = self.rng.choice(sorted(leader.core.voters))
        if nodeId == leader.id:
            target = leader.core.transferLeadership()
            self.log(f'{leader.id} hands leadership to {target} before its removal')
        elif self.keepsMajority(leader.core.voters - {nodeId}):
            leader.core.proposeChange(ChangeType.REMOVE, nodeId)
            self.log(f'{leader.id} removes {nodeId}')

    def onChangeCommitted(self, entry):
        change = ConfChange.decode(entry.data)
        voters = self.committedVoters
        self.committedVoters = voters | {change.node} if change.type == ChangeType.ADD else voters - {change.node}
        self.configHistory.append((entry.index, self.committedVoters))
        self.log(f'committed at {entry.index}: {change.type.value} {change.node}')
        if change.type == ChangeType.ADD:
            self.counts['added'] += 1
            return
        self.counts['removed'] += 1
        node = self.nodes[change.node]
        self.at(self.now + RETIRE_MS, 'retire', change.node, entry.term, self.now, node.incarnation)

    def on_retire(self, nodeId, term, committedAt, incarnation):
        """A removed member is stopped for good. Liveness: one that ran throughout a calm
        phase under the leader that removed it was told (the fork's "a removed member is told")."""
        node = self.nodes[nodeId]
        told = node.up and node.core.removedFromCluster
        self.counts['removals_told'] += told
        leader = self.nodes[self.leaders[term]]
        steady = self.calmSince is not None and self.calmSince <= committedAt and node.up and \
            node.incarnation == incarnation and node.resumesAt <= committedAt and leader.up and \
            leader.core.state == RaftState.LEADER and leader.core.term == term
        if steady and not told:
            raise Violation(f'liveness: {nodeId} was not told of its removal within {RETIRE_MS} ms in a calm phase')
        if nodeId in self.committedVoters:
            return      # added back meanwhile (not by this operator: new ids only)
        self.on_crash(nodeId)
        self.gone.add(nodeId)
        self.ids.remove(nodeId)

    def keepsMajority(self, voters):
        """The operator changes nothing that would leave a majority of the new configuration
        down (Raft could not help it: a calm phase would commit nothing)."""
        return sum(self.nodes[v].up for v in voters) > len(voters) / 2

    def configsInPlay(self):
        """The committed configuration and every running node's: a calm phase keeps a majority of each."""
        return [self.committedVoters] + [n.core.voters for n in self.nodes.values() if n.up]

    # -- faults ----------------------------------------------------------------------------------

    def on_phase(self, kind):
        self.checkCalm()
        if kind == 'calm':
            self.startCalm()
        else:
            self.startChaos()

    def startCalm(self):
        length = self.rng.randint(*CALM_MS)
        self.counts['calm_phases'] += 1
        self.cut.clear()
        self.drop = self.dup = self.syncCrash = self.damage = 0.0
        self.delay, self.diskMs = (1, 5), (0, 2)
        down = set()
        if self.rng.random() < 0.4 and not any(n.disk.unverified is not None for n in self.nodes.values()):
            # a minority stays down: a majority must make progress on its own
            configs = self.configsInPlay()
            pool = sorted(frozenset.intersection(*configs) & set(self.ids))
            most = min(len(c) - 1 for c in configs) // 2
            if pool and most:
                down = set(self.rng.sample(pool, self.rng.randint(1, min(most, len(pool)))))
        for node in self.nodes.values():
            node.pausedUntil = min(node.pausedUntil, self.now)
        for nodeId in self.ids:
            if nodeId in down:
                self.on_crash(nodeId)
            else:
                self.restart(nodeId)
        self.calmSince, self.calmCommitted, self.calmMark = self.now, None, None
        self.at(self.now + CATCH_UP_MARK_MS, 'mark', self.now)
        self.log(f'calm for {length} ms' + (f', {sorted(down)} down' if down else ''))
        self.at(self.now + length, 'phase', 'chaos')

    def startChaos(self):
        length = self.rng.randint(*CHAOS_MS)
        self.calmSince = None
        r = self.rng
        self.drop = r.choice((0.0, 0.01, 0.05, 0.2))
        self.dup = r.choice((0.0, 0.02, 0.1))
        self.delay = r.choice(((1, 5), (1, 20), (5, 60)))
        self.diskMs = r.choice(((0, 2), (0, 5), (2, 15), (5, 40)))
        self.syncCrash = r.choice((0.0, 0.0, 0.01, 0.05))
        self.damage = r.choice((0.0, 0.2, 0.5))
        self.log(f'chaos for {length} ms: drop {self.drop}, dup {self.dup}, delay {self.delay}, '
                 f'disk {self.diskMs}, crash in sync {self.syncCrash}')
        for _ in range(r.randint(1, 5)):
            t = self.now + r.randint(0, length)
            what = r.random()
            if what < 0.1:
                for nodeId in self.ids:     # a power loss: every node at once
                    self.at(t, 'crash', nodeId)
                    self.at(t + r.randint(10, 500), 'restart', nodeId)
            elif what < 0.25:
                self.at(t, 'pause', r.choice(self.ids), r.randint(100, 1500))
            elif what < 0.6:
                self.at(t, 'crash', r.choice(self.ids))
                self.at(t + r.randint(10, 800), 'restart', r.choice(self.ids))
            else:
                self.at(t, 'partition', r.getrandbits(32))
                self.at(t + r.randint(50, 1500), 'heal')
        self.at(self.now + length, 'phase', 'calm')

    def on_pause(self, nodeId, ms):
        node = self.nodes[nodeId]
        if node.up:
            node.pausedUntil = max(node.pausedUntil, self.now + ms)
            self.counts['pauses'] += 1
            self.log(f'{nodeId} paused for {ms} ms')

    def on_partition(self, bits):
        r = random.Random(bits)
        one = r.choice(self.ids)
        others = [i for i in self.ids if i != one]
        how = r.choice(('isolate', 'split', 'in', 'out'))
        if how == 'split':
            side = set(r.sample(self.ids, len(self.ids) // 2))
            pairs = {(a, b) for a in self.ids for b in self.ids if (a in side) != (b in side)}
        else:
            pairs = set()
            if how in ('isolate', 'out'):
                pairs |= {(one, o) for o in others}
            if how in ('isolate', 'in'):
                pairs |= {(o, one) for o in others}
        self.cut |= pairs
        self.log(f'partition {how} {one if how != "split" else sorted(side)}')
        for a, b in sorted(pairs):
            if (b, a) in self.cut:      # both ways: the connection is cut (chaos's proxy does so)
                self.tellLost(a, [b])

    def on_heal(self):
        self.cut.clear()
        self.log('network healed')

    # -- checks ----------------------------------------------------------------------------------

    def checkLeader(self, node):
        core = node.core
        if core.state != RaftState.LEADER:
            return
        leader = self.leaders.setdefault(core.term, node.id)
        if leader != node.id:
            raise Violation(f'election safety: {leader} and {node.id} both lead term {core.term}')
        self.checkCommitQuorum(node)
        if leader == node.id and getattr(node, 'ledTerm', None) != core.term:
            node.ledTerm = core.term
            self.counts['elections'] += 1
            self.log(f'{node.id} leads term {core.term} (last index {core.lastIndex})')
            self.checkCompleteness(node)
            if self.transfer is not None and self.transfer[0] == node.id and self.transfer[1] < core.term:
                self.counts['transfers_done'] += 1
                self.transfer = None

    def checkCommitQuorum(self, node):
        """The commit rule, checked from outside: what a leader commits is on the disks of a
        majority of the configuration in force, folded here from its log's changes (a learner
        or a removed member never counts). A node whose disk was damaged may have lost what it
        acknowledged: it is given the benefit of the doubt."""
        core = node.core
        commit = core.commitIndex
        if commit <= node.checkedCommit:
            return
        if node.folded[0] != core.term:
            # a new leader: what it knew committed was committed under the configuration then
            node.folded, node.checkedCommit = (core.term, 0, frozenset(self.initial)), commit
            return
        node.checkedCommit = commit
        _, last, voters = node.folded
        if core.snapshot is not None and core.snapshot.index > last:
            # compacted past what was folded: what a snapshot covers is committed, and the
            # simulator saw those changes commit
            last, voters = core.snapshot.index, self.committedConfigAt(core.snapshot.index)
        for entry in core.entries(last + 1):    # a leader's log only grows: fold what is new
            if entry.kind == EntryKind.MEMBERSHIP:
                change = ConfChange.decode(entry.data)
                voters = voters | {change.node} if change.type == ChangeType.ADD else voters - {change.node}
        node.folded = (core.term, core.lastIndex, voters)
        entries = core.entries(commit, commit)
        if not entries:
            return      # compacted at once (the snapshot's state is checked when it is installed)
        term = entries[0].term
        holders = [v for v in voters if v in self.everDamaged or self.nodes[v].disk.holds(commit, term)]
        if len(holders) <= len(voters) / 2:
            raise Violation(f'commit rule: {node.id} committed {commit} on {sorted(holders)} of {sorted(voters)}')

    def committedConfigAt(self, index):
        return [voters for at, voters in self.configHistory if at <= index][-1]

    def checkCompleteness(self, node):
        """Leader completeness (Raft's: an entry committed in a term is in the log of every leader
        of a later term): the new leader's log holds every entry a node applied in an earlier
        term. Not the entries of the leader's own term or later: a candidate that stalled may
        count its votes and lead an old term after a newer one committed more (seed 1155 of
        the 3-node runs); that leader commits nothing, its followers have moved on."""
        log = node.core.entries()
        start = node.core.snapshot.index if node.core.snapshot else 0     # (checked when it was taken)
        for index, (term, kind, data) in self.appliedAt.items():
            if index <= start or self.appliedTerm[index] >= node.core.term:
                continue
            if index > start + len(log) or (log[index - start - 1].term, log[index - start - 1].kind,
                                             log[index - start - 1].data) != (term, kind, data):
                raise Violation(f'leader completeness: {node.id} (term {node.core.term}) lacks applied entry {index}')

    def checkLogs(self):
        """Log matching: two logs that hold an entry of the same index and term are identical
        up to it. Checked on every pair of running nodes."""
        logs = [(n.id, n.core.entries()) for n in self.nodes.values() if n.up]
        for i, (a, la) in enumerate(logs):
            for b, lb in logs[i + 1:]:
                if not la or not lb:
                    continue
                # the indices both hold (what a snapshot covers is committed: the state checks)
                lo, hi = max(la[0].index, lb[0].index), min(la[-1].index, lb[-1].index)
                if lo > hi:
                    continue
                sa, sb = la[lo - la[0].index:hi - la[0].index + 1], lb[lo - lb[0].index:hi - lb[0].index + 1]
                k = len(sa)
                while k and sa[k - 1].term != sb[k - 1].term:
                    k -= 1
                if sa[:k] != sb[:k]:
                    raise Violation(f'log matching: {a} and {b} agree on entry {lo + k - 1} but not before it')

    def on_mark(self, calmSince):
        if self.calmSince == calmSince:
            self.calmMark = max(self.appliedAt, default=0)

    def checkCalm(self, final=False):
        """Liveness: in a calm phase a proposal commits within LIVENESS_MS of the phase's start,
        and by its end every running node holds what was applied CATCH_UP_MARK_MS into it."""
        if self.calmSince is None or self.now - self.calmSince < LIVENESS_MS:
            return
        if self.calmCommitted is None or self.calmCommitted - self.calmSince > LIVENESS_MS:
            raise Violation(f'liveness: nothing proposed after {self.calmSince} ms committed within {LIVENESS_MS} ms '
                            f'(states {self.states()})')
        if final or not self.calmMark:
            return
        for node in self.nodes.values():
            if node.id not in self.committedVoters:
                continue        # a learner being caught up, a removed member
            if node.up and not self.coreHolds(node.core, self.calmMark, self.appliedAt[self.calmMark][0]):
                raise Violation(f'liveness: {node.id} did not catch up to entry {self.calmMark} in a calm phase '
                                f'(states {self.states()})')

    @staticmethod
    def coreHolds(core, index, term):
        if core.snapshot is not None and index <= core.snapshot.index:
            return True
        entries = core.entries(index, index)
        return bool(entries) and entries[0].term == term

    def states(self):
        return {n.id: (n.core.state.name, n.core.term, n.core.lastIndex, n.core.commitIndex) if n.up else 'down'
                for n in self.nodes.values()}


@dataclass
class Result:
    seed: int
    violation: str | None
    simulatedMs: int
    counts: dict
    applied: dict           # index -> (term, kind, data): what the cluster applied


def run(seed, nodes=None, durationMs=DURATION_MS, verbose=False):
    """One seeded run; the violation found (its message), or None."""
    sim = Sim(seed, nodes, durationMs, verbose)
    try:
        sim.run()
        violation = None
    except (Violation, AssertionError, CoreInUse) as e:
        violation = f'{type(e).__name__}: {e}'
    return Result(seed, violation, sim.now, sim.counts, sim.appliedAt)


def main(argv=None):
    p = argparse.ArgumentParser(prog='python -m raftq.node.raft.sim', description=__doc__.split('\n\n')[0])
    p.add_argument('--seeds', type=int, default=100, help='how many seeds to run (from --first)')
    p.add_argument('--first', type=int, default=0, help='the first seed')
    p.add_argument('--seed', type=int, help='replay this seed, event by event')
    p.add_argument('--nodes', type=int, choices=(3, 5), help='cluster size (default: drawn from the seed)')
    p.add_argument('--duration-ms', type=int, default=DURATION_MS, help='simulated time per seed')
    args = p.parse_args(argv)
    if args.seed is not None:
        r = run(args.seed, args.nodes, args.duration_ms, verbose=True)
        print(f'seed {r.seed}: {r.violation or "no violation"}; {r.counts}')
        return 1 if r.violation else 0
    return summary(range(args.first, args.first + args.seeds), args.nodes, args.duration_ms)


def summary(seeds, nodes, durationMs):
    start = time.perf_counter()
    failures, simulated, totals = [], 0, {}
    for seed in seeds:
        r = run(seed, nodes, durationMs)
        simulated += r.simulatedMs
        for k, v in r.counts.items():
            totals[k] = totals.get(k, 0) + v
        if r.violation:
            failures.append(r)
            print(f'seed {seed}: {r.violation}', flush=True)
    wall = time.perf_counter() - start
    print(f'{len(seeds)} seeds, {len(failures)} failed{": " if failures else ""}'
          f'{" ".join(str(f.seed) for f in failures)}')
    print(f'{simulated / 1000:.0f} simulated s in {wall:.1f} wall s: {simulated / 1000 / wall:.0f} simulated s '
          f'per wall s, {len(seeds) / wall * 60:.0f} seeds per minute')
    print('totals: ' + ', '.join(f'{k} {v}' for k, v in totals.items()))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
