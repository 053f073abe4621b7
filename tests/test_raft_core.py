"""The pure Raft core (node/raft/core.py), rule by rule: each test a named behaviour, in the style
of etcd-io/raft's scenario tests. A tiny synchronous harness moves messages between cores by
hand, so a test decides exactly what is delivered, lost or delayed."""
from __future__ import annotations

import dataclasses
import random

import pytest

from raftq.node.raft.core import (ChangeType, ConfChange, Config, CoreInUse, Entry, EntryKind, HardState, Message,
                                  MessageType, NotLeader, ProgressState, RaftCore, RaftState, Refusal, Refused, Snapshot)

T = MessageType
CONF = Config(election_timeout_min=10, election_timeout_max=20, heartbeat_interval=2, max_inflight=3,
              max_append_entries=2, retransmit_timeout=4)


class Net:
    """Cores, their disks (what each advance() persisted) and the messages between them."""

    def __init__(self, ids=('a', 'b', 'c'), conf=CONF, logs=None, terms=None, newcomers=()):
        """`newcomers`: nodes started outside the configuration (to be added as learners)."""
        logs, terms = logs or {}, terms or {}
        everyone = tuple(ids) + tuple(newcomers)
        self.disks = {i: (HardState(terms.get(i, 0)), list(logs.get(i, ()))) for i in everyone}
        self.cores = {i: RaftCore(i, ids, random.Random(n), conf, hardState=self.disks[i][0],
                                  entries=self.disks[i][1]) for n, i in enumerate(everyone)}
        self.wire = []          # messages sent and not yet delivered
        self.applied = {i: [] for i in everyone}
        self.offsets = {}       # node -> the index its disk's log starts after (its snapshot's)

    def __getitem__(self, i):
        return self.cores[i]

    def flush(self, i):
        core = self.cores[i]
        while core.has_ready():
            rd = core.ready()
            self.wire += rd.messages
            self.persist(i, rd)
            self.wire += rd.messages_after_sync
            self.applied[i] += rd.committed_entries
            core.advance(rd)

    def persist(self, i, rd):
        hs, log = self.disks[i]
        if rd.snapshot:
            log = []                # the log starts after the snapshot (the core holds the snapshot)
            self.offsets[i] = rd.snapshot.index
        if rd.entries:
            del log[rd.entries[0].index - 1 - self.offsets.get(i, 0):]
            log += rd.entries
        self.disks[i] = (rd.hard_state or hs, log)

    def take(self, type=None, dst=None, src=None):
        """Remove the messages matching and return them (undelivered)."""
        out = [m for m in self.wire if (type is None or m.type == type) and (dst is None or m.dst == dst)
               and (src is None or m.src == src)]
        self.wire = [m for m in self.wire if m not in out]
        return out

    def deliver(self, cut=(), rounds=100, types=None):
        """Deliver everything (and what it provokes), but never over the links in `cut`, and
        only messages of `types` when given (the others are lost)."""
        for _ in range(rounds):
            if not self.wire:
                return
            batch, self.wire = self.wire, []
            for m in batch:
                if (m.src, m.dst) not in cut and (types is None or m.type in types):
                    self.cores[m.dst].step(m)
                    self.flush(m.dst)

    def tick(self, i, n=1):
        for _ in range(n):
            self.cores[i].tick()
            self.flush(i)

    def elect(self, i, cut=(), types=None):
        """Let i's election timer run out, then deliver until it leads."""
        self.tick(i, CONF.election_timeout_max)
        self.deliver(cut, types=types)
        assert self.cores[i].state == RaftState.LEADER, self.cores[i].state
        return self.cores[i]

    def forget_leader(self, i):
        """i's clock runs an election timeout without word from its leader."""
        for _ in range(CONF.election_timeout_min):
            self.cores[i].tick()
        self.flush(i)
        self.take(src=i)

    def propose(self, i, *datas):
        out = [self.cores[i].propose(d) for d in datas]
        self.flush(i)
        return out


def log_of(*terms):
    return [Entry(n, t, b'x%d' % n) for n, t in enumerate(terms, 1)]


def vote_request(src, dst, term, last_index=0, last_term=0, type=T.REQUEST_VOTE):
    return Message(type, src, dst, term, last_log_index=last_index, last_log_term=last_term)


# -- elections --------------------------------------------------------------------------------

def test_a_follower_votes_once_per_term():
    net = Net()
    net['a'].step(vote_request('b', 'a', 1))
    net.flush('a')
    net['a'].step(vote_request('c', 'a', 1))
    net.flush('a')
    votes = net.take(T.RESPONSE_VOTE)
    assert [(m.dst, m.granted) for m in votes] == [('b', True)]
    assert net.disks['a'][0] == HardState(1, 'b', 0)
    net['a'].step(vote_request('c', 'a', 2))      # a new term: a new vote
    net.flush('a')
    assert [m.dst for m in net.take(T.RESPONSE_VOTE)] == ['c']


def test_a_vote_leaves_only_once_it_is_on_disk():
    core = Net()['a']
    core.step(vote_request('b', 'a', 3))
    rd = core.ready()
    assert rd.hard_state == HardState(3, 'b', 0) and rd.must_sync
    assert rd.messages == () and [m.type for m in rd.messages_after_sync] == [T.RESPONSE_VOTE]


def test_a_candidate_whose_log_is_behind_gets_no_vote():
    net = Net(logs={'a': log_of(1, 2)}, terms={'a': 2})
    net['a'].step(vote_request('b', 'a', 3, last_index=5, last_term=1))    # longer but older
    net['a'].step(vote_request('c', 'a', 3, last_index=1, last_term=2))    # same term, shorter
    net.flush('a')
    assert net.take(T.RESPONSE_VOTE) == []
    assert net['a'].term == 3      # the term is still learnt


def test_a_vote_that_arrives_twice_counts_once():
    net = Net(ids=('a', 'b', 'c', 'd', 'e'))
    net.tick('a', CONF.election_timeout_max)
    for m in net.take(T.REQUEST_PREVOTE):
        if m.dst in 'bc':
            net[m.dst].step(m)
            net.flush(m.dst)
    for m in net.take(T.RESPONSE_PREVOTE):
        net['a'].step(m)
    net.flush('a')
    assert net['a'].state == RaftState.CANDIDATE and net['a'].term == 1
    requests = {m.dst: m for m in net.take(T.REQUEST_VOTE)}
    for voter in 'bc':
        net[voter].step(requests[voter])
        net.flush(voter)
    b_vote, c_vote = sorted(net.take(T.RESPONSE_VOTE), key=lambda m: m.src)
    net['a'].step(b_vote)
    net['a'].step(b_vote)                             # delivered twice: a and b, 2 of 5
    assert net['a'].state == RaftState.CANDIDATE
    net['a'].step(c_vote)
    assert net['a'].state == RaftState.LEADER


def test_prevote_neither_raises_the_term_nor_wins_without_a_majority():
    net = Net()
    net.tick('a', CONF.election_timeout_max)
    prevotes = net.take(T.REQUEST_PREVOTE)
    assert {m.dst for m in prevotes} == {'b', 'c'} and all(m.term == 1 for m in prevotes)
    assert net['a'].term == 0 and net['a'].state == RaftState.FOLLOWER
    assert net.disks['a'][0].term == 0                # nothing persisted for a pre-vote
    net['b'].step(prevotes[0])                        # b grants, and changes nothing itself
    net.flush('b')
    assert net['b'].term == 0 and net['b'].votedForNodeId is None
    net.take()                                        # the grant is lost: a stays a follower
    assert net['a'].term == 0 and net['a'].state == RaftState.FOLLOWER


def test_prevote_does_not_disturb_a_healthy_leader():
    net = Net()
    leader = net.elect('a')
    term = leader.term
    cut = {('a', 'c'), ('c', 'a')}       # c no longer hears the leader; b does
    for _ in range(3 * CONF.election_timeout_max):
        for i in 'abc':
            net.tick(i)
        net.deliver(cut)
    assert net['c'].term == term                      # c asked for pre-votes, never got a majority
    assert leader.state == RaftState.LEADER and leader.term == term
    assert net['b'].term == term


def test_a_node_behind_in_term_learns_it_from_a_refused_prevote():
    """The simulator's seed 61: a (term 2, short log) and c (term 1, long log), b down. Neither
    can win a pre-vote from the other; c's refused pre-vote now teaches it term 2, and its next
    pre-vote (term 3) wins."""
    net = Net(logs={'a': log_of(1), 'c': log_of(1, 1, 1)}, terms={'a': 2, 'c': 1})
    down = {(x, 'b') for x in 'ac'} | {('b', x) for x in 'ac'}
    for _ in range(4 * CONF.election_timeout_max):
        net.tick('a')
        net.tick('c')
        net.deliver(down)
        if RaftState.LEADER in (net['a'].state, net['c'].state):
            break
    assert net['c'].state == RaftState.LEADER and net['c'].term >= 3
    assert net['a'].state == RaftState.FOLLOWER


def test_check_quorum_steps_a_leader_down_and_hands_over_with_timeout_now():
    net = Net()
    leader = net.elect('a')
    net.propose('a', b'x')
    net.deliver(cut={('c', 'a')})                     # b answers, c's answers are lost
    cut = {('b', 'a'), ('c', 'a')}                    # now nobody is heard (a's incoming cut)
    for _ in range(CONF.election_timeout_min + 1):
        net.tick('a')
        if leader.state != RaftState.LEADER:
            break
        net.deliver(cut)
    assert leader.state == RaftState.FOLLOWER and leader.leader is None
    handover = net.take(T.TIMEOUT_NOW)
    assert [m.dst for m in handover] == ['b']         # the follower with the highest match index
    net['b'].step(handover[0])
    net.tick('b')
    assert net['b'].state == RaftState.CANDIDATE      # at once, without a pre-vote
    net.deliver(cut)
    assert net['b'].state == RaftState.LEADER


def test_a_leader_a_majority_answers_keeps_leading():
    net = Net()
    leader = net.elect('a')
    for _ in range(5 * CONF.election_timeout_max):
        net.tick('a')
        net.deliver(cut={('c', 'a')})
    assert leader.state == RaftState.LEADER and leader.term == 1


def test_a_deposed_leader_waits_an_election_timeout_before_it_stands():
    net = Net()
    leader = net.elect('a')
    for _ in range(3 * CONF.election_timeout_max):    # its timer, last set before it led, expires
        net.tick('a')
        net.deliver()
    leader.step(vote_request('b', 'a', 5))            # a newer term; b's log is behind: no vote
    assert leader.state == RaftState.FOLLOWER and leader.term == 5 and leader.votedForNodeId is None
    assert leader.raftElectionDeadline - leader.ticks >= CONF.election_timeout_min
    net.flush('a')
    net.take()
    net.tick('a', CONF.election_timeout_min - 1)
    assert net.take(T.REQUEST_PREVOTE) == []          # it does not stand at its next tick


def test_a_leader_steps_down_on_an_answer_of_a_newer_term():
    net = Net()
    leader = net.elect('a')
    leader.step(Message(T.NEXT_NODE_IDX, 'b', 'a', 7, success=False, next_node_idx=1, reject_index=5))
    assert leader.state == RaftState.FOLLOWER and leader.term == 7


def test_a_node_not_eligible_or_with_an_untrusted_log_does_not_stand():
    net = Net()
    net['a'].setEligible(False)
    net.tick('a', 3 * CONF.election_timeout_max)
    assert net.take() == []
    untrusted = RaftCore('b', 'abc', random.Random(1), CONF, unverifiedClaim=0)
    for _ in range(3 * CONF.election_timeout_max):
        untrusted.tick()
    assert not untrusted.has_ready()


def test_an_untrusted_log_votes_again_once_a_leader_matched_it():
    """The fork's disk checks: matched up to the leader's commit index and the one it knew."""
    b = RaftCore('b', 'abc', random.Random(1), CONF, hardState=HardState(1), entries=log_of(1), unverifiedClaim=3)
    b.step(vote_request('a', 'b', 2, last_index=9, last_term=1))
    rd = b.ready()
    assert rd.messages_after_sync == () and rd.hard_state.vote is None   # the term learnt, no vote
    b.advance(rd)
    b.step(Message(T.APPEND_ENTRIES, 'a', 'b', 2, prev_log_index=1, prev_log_term=1,
                   entries=(Entry(2, 1, b'2'),), commit_index=2))
    rd = b.ready()
    assert not rd.log_verified and b.logUnverified          # matched 2: its own claim was 3
    b.advance(rd)
    b.step(Message(T.APPEND_ENTRIES, 'a', 'b', 2, prev_log_index=2, prev_log_term=1,
                   entries=(Entry(3, 2, b'3'),), commit_index=3))
    rd = b.ready()
    assert rd.log_verified and not b.logUnverified
    b.advance(rd)
    b.step(vote_request('c', 'b', 3, last_index=9, last_term=2))
    assert [m.granted for m in b.ready().messages_after_sync] == [True]


# -- leader transfer ----------------------------------------------------------------------------

def test_a_leader_hands_leadership_to_an_up_to_date_node_and_takes_no_proposal_meanwhile():
    net = Net()
    leader = net.elect('a')
    net.propose('a', b'x')
    net.deliver()
    assert leader.transferLeadership('b') == 'b' and leader.transferTarget == 'b'
    with pytest.raises(Refused) as refused:
        leader.propose(b'y')                          # thesis §3.10: the log stays as the target's
    assert refused.value.reason == Refusal.TRANSFER_IN_PROGRESS
    net.flush('a')
    handover, = net.take(T.TIMEOUT_NOW)
    assert handover.dst == 'b' and handover.term == 1
    net['b'].step(handover)
    net.tick('b')
    assert net['b'].state == RaftState.CANDIDATE and net['b'].term == 2     # no pre-vote
    net.deliver()
    assert net['b'].state == RaftState.LEADER and leader.state == RaftState.FOLLOWER
    assert leader.transferTarget is None and leader.leader == 'b'
    assert [e.data for e in net['b'].entries()] == [b'', b'x', b'']


def test_a_transfer_to_a_node_behind_or_unknown_is_refused():
    net = Net()
    with pytest.raises(NotLeader):
        net['a'].transferLeadership('b')
    leader = net.elect('a')
    net.deliver()
    net.propose('a', b'x')
    net.deliver(cut={('a', 'c')})                     # c lacks x
    for node, reason in (('c', Refusal.BEHIND), ('z', Refusal.UNKNOWN_NODE), ('a', Refusal.UNKNOWN_NODE)):
        with pytest.raises(Refused) as refused:
            leader.transferLeadership(node)
        assert refused.value.reason == reason
    assert leader.transferTarget is None and leader.propose(b'y') == (3, 1)
    net.flush('a')
    net.deliver(cut={('a', 'c')})
    assert leader.transferLeadership() == 'b'         # None: the most caught-up voter heard recently
    with pytest.raises(Refused) as refused:
        leader.transferLeadership('b')                # one at a time
    assert refused.value.reason == Refusal.TRANSFER_IN_PROGRESS


def test_a_transfer_that_does_not_complete_is_abandoned_after_an_election_timeout():
    net = Net()
    leader = net.elect('a')
    net.deliver()
    leader.transferLeadership('b')
    net.flush('a')
    assert net.take(T.TIMEOUT_NOW)                    # lost
    for _ in range(CONF.election_timeout_min - 1):
        net.tick('a')
        net.deliver()
        with pytest.raises(Refused):
            leader.propose(b'y')
    net.tick('a')
    assert leader.transferTarget is None and leader.state == RaftState.LEADER and leader.term == 1
    index, term = leader.propose(b'y')
    net.flush('a')
    net.deliver()
    assert leader.commitIndex == index and term == 1


# -- membership -----------------------------------------------------------------------------------

def _learner_caught_up(net):
    leader = net.elect('a')
    net.deliver()
    leader.addLearner('d')
    net.propose('a', b'x')
    for _ in range(3):
        net.tick('a', CONF.heartbeat_interval)
        net.deliver()
    return leader


def test_a_learner_is_replicated_to_but_neither_counts_nor_votes():
    net = Net(newcomers=('d',))
    leader = _learner_caught_up(net)
    assert leader.learnerMatchIndex('d') == 2 and net['d'].lastIndex == 2 and leader.learners == {'d'}
    net.propose('a', b'y')
    net.deliver(cut={('b', 'a'), ('c', 'a')})         # only the learner answers
    assert leader.progress('d').match == 3 and leader.commitIndex == 2    # a and d are not 2 of 3
    for _ in range(3 * CONF.election_timeout_max):
        net['d'].tick()
    net.flush('d')
    assert net.take(src='d') == [] and net['d'].state == RaftState.FOLLOWER    # never stands
    net['b'].step(vote_request('d', 'b', 9, last_index=1, last_term=1))
    net.flush('b')
    assert net.take(src='b') == [] and net['b'].term == 1        # nor is heard with a log behind
    candidate = RaftCore('b', 'abc', random.Random(3), CONF, hardState=HardState(1))
    candidate.step(Message(T.APPEND_ENTRIES, 'a', 'b', 1))      # its leader a asks it to stand at once
    candidate.step(Message(T.TIMEOUT_NOW, 'a', 'b', 1))
    candidate.tick()
    assert candidate.state == RaftState.CANDIDATE and candidate.term == 2
    candidate.step(Message(T.RESPONSE_VOTE, 'd', 'b', 2, granted=True))
    assert candidate.state == RaftState.CANDIDATE                                # a learner's vote: not counted


def test_an_added_member_counts_from_its_add_entry_on():
    net = Net(newcomers=('d',))
    leader = _learner_caught_up(net)
    index, _ = leader.proposeChange(ChangeType.ADD, 'd', {'url': 'http://d'})
    assert leader.voters == {'a', 'b', 'c', 'd'} and leader.learners == set()     # applied when appended
    assert leader.progress('d').match == 2                                        # kept from the learner
    net.flush('a')
    net.deliver(cut={('a', 'c')})
    assert net['d'].voters == {'a', 'b', 'c', 'd'} and leader.commitIndex == index   # a, b, d: 3 of 4
    entry = net['d'].entries(index, index)[0]
    assert entry.kind == EntryKind.MEMBERSHIP and ConfChange.decode(entry.data).info == {'url': 'http://d'}
    net.propose('a', b'z')
    net.deliver(cut={('a', 'c'), ('a', 'd')})
    assert leader.commitIndex == index                # a and b alone are no majority of four


def test_one_change_at_a_time_and_the_refusals():
    net = Net(ids=('a', 'b', 'c', 'd'))
    votes = {T.REQUEST_PREVOTE, T.RESPONSE_PREVOTE, T.REQUEST_VOTE, T.RESPONSE_VOTE}
    leader = net.elect('a', types=votes)
    with pytest.raises(Refused) as refused:
        leader.proposeChange(ChangeType.REMOVE, 'd')  # the no-op of this term is not committed
    assert refused.value.reason == Refusal.CHANGE_PENDING
    net.tick('a', CONF.heartbeat_interval)
    net.deliver()
    for change, reason in (((ChangeType.ADD, 'b'), Refusal.ALREADY_MEMBER), ((ChangeType.REMOVE, 'a'), Refusal.SELF),
                           ((ChangeType.REMOVE, 'z'), Refusal.UNKNOWN_NODE)):
        with pytest.raises(Refused) as refused:
            leader.proposeChange(*change)
        assert refused.value.reason == reason
    leader.proposeChange(ChangeType.REMOVE, 'd')
    with pytest.raises(Refused) as refused:
        leader.proposeChange(ChangeType.REMOVE, 'c')  # the first is not committed yet
    assert refused.value.reason == Refusal.CHANGE_PENDING
    with pytest.raises(ValueError):
        leader.propose(ConfChange(ChangeType.REMOVE, 'c').encode(), EntryKind.MEMBERSHIP)
    net.flush('a')
    net.deliver()
    assert leader.voters == {'a', 'b', 'c'}
    leader.proposeChange(ChangeType.REMOVE, 'c')      # committed: the next one is taken


def test_a_removed_member_is_told_and_stands_no_more():
    net = Net(ids=('a', 'b', 'c', 'd'))
    leader = net.elect('a')
    net.deliver()
    index, _ = leader.proposeChange(ChangeType.REMOVE, 'd')
    net.flush('a')
    net.deliver()
    assert leader.commitIndex >= index and leader.progress('d') is not None     # not told yet
    for _ in range(2):
        net.tick('a', CONF.heartbeat_interval)        # the heartbeat carries the commit index
        net.deliver()
    assert net['d'].voters == {'a', 'b', 'c'} and leader.progress('d') is None   # told, then dropped
    assert net['d'].commitIndex >= index and net['d'].removedFromCluster
    assert not net['b'].removedFromCluster
    net.tick('a', 2 * CONF.heartbeat_interval)
    assert net.take(dst='d') == []                    # nothing more is sent to it
    net.tick('d', 3 * CONF.election_timeout_max)
    assert net.take(src='d') == []                    # and it elects nobody


def test_a_departing_member_that_never_answers_is_dropped_after_the_timeout():
    conf = dataclasses.replace(CONF, departing_timeout=30)
    net = Net(ids=('a', 'b', 'c', 'd'), conf=conf)
    leader = net.elect('a')
    net.deliver()
    leader.proposeChange(ChangeType.REMOVE, 'd')
    net.flush('a')
    cut = {('d', 'a'), ('a', 'd')}
    net.deliver(cut=cut)
    for _ in range(conf.departing_timeout):
        assert leader.progress('d') is not None       # still replicated to, in case it comes back
        net.tick('a')
        net.deliver(cut=cut)
    net.tick('a')
    assert leader.progress('d') is None and leader.state == RaftState.LEADER


def test_a_node_whose_log_lacks_a_new_members_add_still_votes_for_it():
    """The simulator's seed 31: voters a, b, c, d (d added at 2), a down, c's log without the add.
    d holds the longest log; c must grant it, or nobody has 3 of 4. A non-member with a log
    behind is still ignored: it would only raise everyone's term."""
    add = Entry(2, 1, ConfChange(ChangeType.ADD, 'd').encode(), EntryKind.MEMBERSHIP)
    c = RaftCore('c', 'abc', random.Random(1), CONF, hardState=HardState(1), entries=log_of(1))
    c.step(vote_request('d', 'c', 2, last_index=2, last_term=1))
    assert [m.granted for m in c.ready().messages_after_sync] == [True] and c.votedForNodeId == 'd'
    d = RaftCore('d', 'abc', random.Random(2), CONF, hardState=HardState(1), entries=log_of(1) + [add])
    d.step(vote_request('e', 'd', 5, last_index=1, last_term=1))
    assert d.term == 1 and not d.has_ready()


def test_a_change_is_undone_when_its_entry_is_cut_and_replayed_at_restart():
    follower = RaftCore('b', 'abc', random.Random(1), CONF, hardState=HardState(1), entries=log_of(1))
    add = Entry(2, 1, ConfChange(ChangeType.ADD, 'd').encode(), EntryKind.MEMBERSHIP)
    follower.step(Message(T.APPEND_ENTRIES, 'a', 'b', 1, prev_log_index=1, prev_log_term=1, entries=(add,)))
    assert follower.voters == {'a', 'b', 'c', 'd'}    # in force once appended, uncommitted
    again = RaftCore('b', 'abc', random.Random(1), CONF, hardState=HardState(1), entries=log_of(1) + [add])
    assert again.voters == {'a', 'b', 'c', 'd'}       # a restart replays the log's changes
    follower.step(Message(T.APPEND_ENTRIES, 'c', 'b', 2, prev_log_index=1, prev_log_term=1,
                          entries=(Entry(2, 2, b'other'),)))
    assert follower.voters == {'a', 'b', 'c'}         # a new leader's entry replaced it: undone


# -- snapshots ------------------------------------------------------------------------------------

def test_a_follower_too_far_behind_gets_the_snapshot_then_the_entries():
    net = Net()
    leader = net.elect('a')
    net.deliver()
    away = {('a', 'c'), ('c', 'a')}
    for n in range(6):
        net.propose('a', b'%d' % n)
        net.deliver(cut=away)
    assert leader.commitIndex == 7 and net['c'].lastIndex == 1
    leader.compact(5, b'state at 5')
    assert leader.entries()[0].index == 6 and leader.snapshot == Snapshot(5, 1, frozenset('abc'), b'state at 5')
    net.propose('a', b'after')
    net.tick('a', CONF.heartbeat_interval)
    installs = [m for m in net.wire if m.type == T.INSTALL_SNAPSHOT]
    assert [m.dst for m in installs] == ['c'] and leader.progress('c').state == ProgressState.SNAPSHOT
    net['c'].step(installs[0])
    net.wire.remove(installs[0])
    rd = net['c'].ready()
    assert rd.snapshot.index == 5 and rd.must_sync and rd.committed_entries == ()
    assert [m.next_node_idx for m in rd.messages_after_sync] == [6]      # acknowledged once on disk
    net.persist('c', rd)
    net['c'].advance(rd)
    net.wire += rd.messages_after_sync
    for _ in range(3):
        net.deliver()
        net.tick('a', CONF.heartbeat_interval)
    assert net['c'].lastIndex == leader.lastIndex == 8 and leader.progress('c').state == ProgressState.REPLICATE
    assert [e.data for e in net.applied['c']] == [b'4', b'5', b'after']   # 6-8: after the snapshot
    assert [e.index for e in net.disks['c'][1]] == [6, 7, 8]


def test_compaction_keeps_the_configuration_and_a_restart_starts_from_the_snapshot():
    add = Entry(2, 1, ConfChange(ChangeType.ADD, 'd').encode(), EntryKind.MEMBERSHIP)
    core = RaftCore('b', 'abc', random.Random(1), CONF, hardState=HardState(1, None, 3),
                    entries=log_of(1) + [add, Entry(3, 1, b'3')], applied=2)
    with pytest.raises(ValueError):
        core.compact(3, b'')                          # not applied yet
    core.compact(2, b'two')
    assert core.voters == {'a', 'b', 'c', 'd'} and [e.index for e in core.entries()] == [3]
    again = RaftCore('b', 'abc', random.Random(1), CONF, hardState=HardState(1, None, 3),
                     entries=[Entry(3, 1, b'3')], snapshot=core.snapshot)
    assert again.voters == {'a', 'b', 'c', 'd'} and again.lastIndex == 3 and again.commitIndex == 3
    assert [e.index for e in again.ready().committed_entries] == [3]      # 1-2 are in the snapshot


def test_an_append_from_before_the_followers_snapshot_is_taken_from_the_snapshots_end():
    follower = RaftCore('b', 'abc', random.Random(1), CONF, hardState=HardState(1, None, 5),
                        snapshot=Snapshot(5, 1, frozenset('abc'), b's'))
    follower.step(Message(T.APPEND_ENTRIES, 'a', 'b', 1, prev_log_index=3, prev_log_term=1,
                          entries=tuple(Entry(i, 1, b'%d' % i) for i in range(4, 8)), commit_index=7))
    rd = follower.ready()
    assert [e.index for e in rd.entries] == [6, 7] and follower.commitIndex == 7
    assert [(m.success, m.next_node_idx) for m in rd.messages_after_sync] == [(True, 8)]


def test_a_snapshot_the_follower_already_holds_cuts_nothing():
    follower = RaftCore('b', 'abc', random.Random(1), CONF, hardState=HardState(1, None, 2), entries=log_of(1, 1, 1))
    follower.step(Message(T.INSTALL_SNAPSHOT, 'a', 'b', 1, snapshot=Snapshot(2, 1, frozenset('abc'), b's')))
    rd = follower.ready()
    assert rd.snapshot is None and follower.lastIndex == 3                    # entry 3 kept
    assert [(m.success, m.next_node_idx) for m in rd.messages_after_sync] == [(True, 3)]


def test_an_installed_snapshot_replaces_a_conflicting_log_and_trusts_it_again():
    follower = RaftCore('b', 'abc', random.Random(1), CONF, hardState=HardState(2), entries=log_of(1, 2, 2),
                        unverifiedClaim=1)
    follower.step(Message(T.INSTALL_SNAPSHOT, 'a', 'b', 3, snapshot=Snapshot(4, 3, frozenset('abc'), b's'),
                          commit_index=4))
    rd = follower.ready()
    assert rd.snapshot.index == 4 and rd.log_verified and not follower.logUnverified
    assert follower.lastIndex == 4 and follower.entries() == [] and follower.commitIndex == 4
    removed = RaftCore('c', 'abc', random.Random(1), CONF, hardState=HardState(2), entries=log_of(1))
    removed.step(Message(T.INSTALL_SNAPSHOT, 'a', 'c', 3, snapshot=Snapshot(4, 3, frozenset('ab'), b's')))
    assert removed.removedFromCluster and not follower.removedFromCluster   # its removal is in the snapshot


# -- replication --------------------------------------------------------------------------------

def test_a_stale_leaders_entries_are_overwritten():
    net = Net()
    net.elect('a')
    net.propose('a', b'committed')
    net.deliver()
    isolated = {(x, y) for x in 'abc' for y in 'abc' if 'a' in (x, y) and x != y}
    net.propose('a', b'lost-1', b'lost-2')            # a leads alone: never replicated
    net.take()
    net.forget_leader('c')
    net.elect('b', cut=isolated)
    net.propose('b', b'new')
    net.deliver(cut=isolated)
    assert net['b'].commitIndex == 4                  # no-op 1, committed, no-op 3, new
    for _ in range(3):                                # a rejoins
        net.tick('b', CONF.heartbeat_interval)
        net.deliver()
    assert net['a'].state == RaftState.FOLLOWER
    assert [e.data for e in net['a'].entries()] == [b'', b'committed', b'', b'new']
    assert [e.data for e in net.disks['a'][1]] == [b'', b'committed', b'', b'new']


def test_only_the_current_terms_entries_commit_by_counting():
    """Figure 8: the leader of term 3 holds an entry of term 2 that a majority holds; it
    commits only once an entry of term 3 is on a majority, and the older one with it."""
    logs = {'a': log_of(1, 2), 'b': log_of(1, 2), 'c': log_of(1)}
    net = Net(logs=logs, terms={'a': 2, 'b': 2, 'c': 2})
    votes = {T.REQUEST_PREVOTE, T.RESPONSE_PREVOTE, T.REQUEST_VOTE, T.RESPONSE_VOTE}
    leader = net.elect('a', cut={('a', 'b'), ('b', 'a')}, types=votes)    # c's vote; no append arrives
    assert leader.term == 3 and leader.lastIndex == 3 and leader.commitIndex == 0
    leader.step(Message(T.NEXT_NODE_IDX, 'b', 'a', 3, success=True, next_node_idx=3))   # b has 2
    assert leader.progress('b').match == 2 and leader.commitIndex == 0
    leader.step(Message(T.NEXT_NODE_IDX, 'b', 'a', 3, success=True, next_node_idx=4))   # b has 3
    assert leader.commitIndex == 3


def test_the_leaders_own_copy_counts_only_once_it_is_persisted():
    net = Net()
    leader = net.elect('a')
    net.deliver()
    leader.propose(b'x')
    rd = leader.ready()                               # its write is "under way"
    assert [e.data for e in rd.entries] == [b'x'] and rd.messages
    for m in rd.messages:                             # the appends left before the write
        net['b'].step(m) if m.dst == 'b' else None
    net.flush('b')
    for m in net.take(T.NEXT_NODE_IDX, dst='a', src='b'):
        leader.step(m)                                # b's answer arrives first
    assert leader.progress('b').match == 2
    assert leader.commitIndex == 1                    # b and not yet a: 1 of 3
    leader.advance(rd)
    assert leader.commitIndex == 2                    # a's own copy on disk: 2 of 3


def test_a_follower_acknowledges_only_after_its_sync():
    net = Net()
    net.elect('a')
    net.deliver()
    net.propose('a', b'x')
    append = net.take(T.APPEND_ENTRIES, dst='b')
    net['b'].step(append[0])
    rd = net['b'].ready()
    assert [e.data for e in rd.entries] == [b'x'] and rd.must_sync
    assert [m.type for m in rd.messages_after_sync] == [T.NEXT_NODE_IDX] and rd.messages == ()


def test_proposals_of_one_turn_go_in_one_append_per_follower():
    net = Net(conf=dataclasses.replace(CONF, max_append_entries=64))
    net.elect('a')
    net.deliver()
    for n in range(10):
        net['a'].propose(b'%d' % n)
    net.flush('a')
    appends = net.take(T.APPEND_ENTRIES)
    assert sorted(m.dst for m in appends) == ['b', 'c'] and all(len(m.entries) == 10 for m in appends)


def test_pipelining_sends_ahead_of_acknowledgements_and_flow_control_bounds_it():
    net = Net()
    net.elect('a')
    net.deliver()
    for n in range(20):
        net.propose('a', b'%d' % n)                   # one turn each: an append each time allowed
    to_b = net.take(T.APPEND_ENTRIES, dst='b')
    assert len(to_b) == CONF.max_inflight             # 3 in flight, the rest waits
    assert [m.prev_log_index for m in to_b] == [1, 2, 3]          # next index optimistic
    pr = net['a'].progress('b')
    assert pr.state == ProgressState.REPLICATE and pr.next == 5 and pr.match == 1
    for m in to_b:
        net['b'].step(m)
    net.flush('b')
    for m in net.take(T.NEXT_NODE_IDX, dst='a', src='b'):
        net['a'].step(m)
    net.flush('a')
    assert net['a'].progress('b').match == 4
    again = net.take(T.APPEND_ENTRIES, dst='b')           # the window moved on: 2 entries an append
    assert [(m.prev_log_index, len(m.entries)) for m in again] == [(4, 2), (6, 2), (8, 2)]


def test_a_lost_append_is_sent_again_after_the_retransmit_timeout():
    net = Net()
    net.elect('a')
    net.deliver()
    net.propose('a', b'x')
    net.take(T.APPEND_ENTRIES, dst='b')               # lost
    net.take()
    for _ in range(CONF.retransmit_timeout + CONF.heartbeat_interval):
        net.tick('a')
        net.deliver(cut={('a', 'c'), ('c', 'a')})
    assert net['a'].progress('b').match == 2 and net['b'].lastIndex == 2


def test_a_conflicting_tail_is_skipped_a_term_at_a_time():
    ids = ('a', 'b', 'c')
    follower = RaftCore('b', ids, random.Random(1), CONF, hardState=HardState(2), entries=log_of(1, 2, 2, 2, 2))
    follower.step(Message(T.APPEND_ENTRIES, 'a', 'b', 3, prev_log_index=5, prev_log_term=3))
    rd = follower.ready()
    answer, = rd.messages_after_sync
    assert (answer.success, answer.reject_index, answer.next_node_idx) == (False, 5, 2)   # all of term 2 at once
    follower.advance(rd)
    follower.step(Message(T.APPEND_ENTRIES, 'a', 'b', 3, prev_log_index=9, prev_log_term=3))
    answer, = follower.ready().messages_after_sync
    assert (answer.success, answer.next_node_idx) == (False, 6)                            # its last + 1


def test_a_late_refusal_does_not_move_the_next_index_back():
    net = Net()
    leader = net.elect('a')
    net.deliver()
    net.propose('a', b'x', b'y')
    net.deliver()
    pr = leader.progress('b')
    assert pr.match == 3 and pr.state == ProgressState.REPLICATE
    leader.step(Message(T.NEXT_NODE_IDX, 'b', 'a', 1, success=False, next_node_idx=1, reject_index=2))
    assert (pr.match, pr.next, pr.state) == (3, 4, ProgressState.REPLICATE)


def test_a_follower_whose_disk_lost_acknowledged_entries_is_repaired():
    """A follower restarted with its log cut by the disk checks refuses appends at the match
    index the leader holds for it; those refusals are not late ones: the leader sends again."""
    net = Net()
    leader = net.elect('a')
    net.deliver()
    net.propose('a', b'x', b'y', b'z')
    net.deliver()
    assert leader.progress('b').match == 4
    hs, log = net.disks['b']
    net.cores['b'] = RaftCore('b', 'abc', random.Random(5), CONF, hardState=hs, entries=log[:2], unverifiedClaim=hs.commit)
    net.disks['b'] = (hs, log[:2])
    for _ in range(4):
        net.tick('a', CONF.heartbeat_interval)
        net.deliver()
    assert net['b'].lastIndex == 4 and leader.progress('b').match == 4
    assert not net['b'].logUnverified


def test_a_follower_keeps_a_matching_tail():
    """An append it already holds (late, or sent twice) cuts nothing: Figure 2's rule, the
    fork's "keeps a matching tail"."""
    net = Net()
    net.elect('a')
    net.deliver()
    net.propose('a', b'x')
    first = net.take(T.APPEND_ENTRIES, dst='b')
    net.propose('a', b'y')
    net.deliver(cut={('a', 'c')})
    assert net['b'].lastIndex == 3
    commit = net['b'].commitIndex
    net['b'].step(first[0])                           # the old append again
    net.flush('b')
    assert net['b'].lastIndex == 3 and [e.data for e in net.disks['b'][1]] == [b'', b'x', b'y']
    answer = [m for m in net.take(T.NEXT_NODE_IDX, src='b')][-1]
    assert answer.success and answer.next_node_idx == 3                       # matched 2, not 3
    assert net['b'].commitIndex == commit


def test_a_follower_commits_only_what_matches_the_leader():
    ids = ('a', 'b', 'c')
    follower = RaftCore('b', ids, random.Random(1), CONF, hardState=HardState(2), entries=log_of(1, 1, 2, 2))
    # a heartbeat of term 3 matching at 2, commit 4: entries 3-4 of b are not known to match
    follower.step(Message(T.APPEND_ENTRIES, 'a', 'b', 3, prev_log_index=2, prev_log_term=1, commit_index=4))
    assert follower.commitIndex == 2 and follower.lastIndex == 4


def test_committed_entries_are_never_cut():
    ids = ('a', 'b', 'c')
    follower = RaftCore('b', ids, random.Random(1), CONF, hardState=HardState(2, None, 2), entries=log_of(1, 2))
    with pytest.raises(AssertionError, match='truncating committed'):
        follower.step(Message(T.APPEND_ENTRIES, 'a', 'b', 3, prev_log_index=1, prev_log_term=1,
                              entries=(Entry(2, 3, b'z'),)))


def test_a_log_cut_while_its_write_was_under_way_is_written_again():
    ids = ('a', 'b', 'c')
    follower = RaftCore('b', ids, random.Random(1), CONF, hardState=HardState(1), entries=log_of(1))
    follower.step(Message(T.APPEND_ENTRIES, 'a', 'b', 1, prev_log_index=1, prev_log_term=1,
                          entries=(Entry(2, 1, b'old2'), Entry(3, 1, b'old3'))))
    rd = follower.ready()                                            # writing 2-3
    follower.step(Message(T.APPEND_ENTRIES, 'c', 'b', 2, prev_log_index=2, prev_log_term=1,
                          entries=(Entry(3, 2, b'new3'),)))          # 3 replaced meanwhile
    follower.advance(rd)
    rd = follower.ready()
    assert [(e.index, e.data) for e in rd.entries] == [(3, b'new3')]  # entry 3 written again


def test_one_ready_at_a_time():
    core = Net()['a']
    core.step(vote_request('b', 'a', 1))
    rd = core.ready()
    assert not core.has_ready()
    with pytest.raises(CoreInUse):
        core.ready()
    core.step(vote_request('c', 'a', 2))          # stepping meanwhile is allowed...
    core.advance(rd)
    rd2 = core.ready()                            # ...and its answer goes out after its own sync
    assert rd2.hard_state == HardState(2, 'c', 0) and [m.dst for m in rd2.messages_after_sync] == ['c']
    with pytest.raises(CoreInUse):
        core.advance(rd)


def test_only_the_leader_takes_proposals_and_a_restart_keeps_term_vote_and_log():
    net = Net()
    with pytest.raises(NotLeader):
        net['a'].propose(b'x')
    net.elect('a')
    net.propose('a', b'x')
    net.deliver()
    hs, log = net.disks['b']
    again = RaftCore('b', 'abc', random.Random(9), CONF, hardState=hs, entries=log)
    assert (again.term, again.votedForNodeId, again.lastIndex) == (1, 'a', 2)
    assert [e.kind for e in again.entries()] == [EntryKind.NO_OP, EntryKind.REGULAR]
    assert again.commitIndex == hs.commit and again.state == RaftState.FOLLOWER


def test_a_single_node_leads_and_commits_alone_once_persisted():
    core = RaftCore('a', ['a'], random.Random(0), CONF)
    for _ in range(CONF.election_timeout_max):
        core.tick()
    assert core.state == RaftState.LEADER
    core.propose(b'x')
    rd = core.ready()
    assert rd.committed_entries == () and core.commitIndex == 0
    core.advance(rd)
    assert core.commitIndex == 2
    assert [e.data for e in core.ready().committed_entries] == [b'', b'x']


def test_a_wiped_follower_is_repaired_from_the_start():
    """A member's data dir emptied (a new node at its address, as `raftq chaos`'s wipe-node does):
    it refuses appends at or past the match the leader knew with a log that ends before it; the
    leader lowers its match and sends everything again (the fork's leader takes every hint)."""
    net = Net()
    leader = net.elect('a')
    net.deliver()
    for n in range(4):
        net.propose('a', b'%d' % n)
        net.deliver()
    assert leader.progress('c').match == leader.lastIndex == 5
    net.cores['c'] = RaftCore('c', 'abc', random.Random(9), CONF, hardState=HardState(leader.term))
    net.disks['c'], net.applied['c'] = (HardState(leader.term), []), []
    for _ in range(4):
        net.tick('a', CONF.heartbeat_interval)
        net.deliver()
    assert net['c'].lastIndex == 5 and leader.progress('c').match == 5
    assert [e.data for e in net.applied['c'] if e.kind == EntryKind.REGULAR] == [b'0', b'1', b'2', b'3']


# -- a closed connection to the leader (peerLost: the loop engine's link reports it) ---------
LOST = dataclasses.replace(CONF, leader_lost_stagger=3)
KILLED_A = {(x, y) for x in 'abc' for y in 'abc' if 'a' in (x, y) and x != y}


def _ticks_until_a_new_leader(net, nodes, cut, most):
    for n in range(1, most + 1):
        for i in nodes:
            net.tick(i)
        net.deliver(cut)
        if any(net[i].state == RaftState.LEADER for i in nodes):
            return n
    return None


def test_followers_that_lose_the_leaders_connection_elect_one_before_an_election_timeout():
    net = Net(conf=LOST)
    net.elect('a')
    net.propose('a', b'x')
    net.deliver()
    for i in 'bc':
        net[i].peerLost('a')
        assert net[i].leader is None
    n = _ticks_until_a_new_leader(net, 'bc', KILLED_A, LOST.election_timeout_min - 1)
    assert n is not None and n < LOST.election_timeout_min
    # b stands first (the followers stand in their addresses' order); one election, no split
    assert net['b'].state == RaftState.LEADER and net['b'].term == 2
    assert net['c'].votedForNodeId == 'b' and net['c'].term == 2


def test_the_next_follower_stands_when_the_first_cannot_win():
    net = Net(conf=LOST)
    net.elect('a')
    net.propose('a', b'x')
    net.deliver(cut={('a', 'b')})                 # only c holds x: b's log is behind
    assert net['c'].lastIndex > net['b'].lastIndex
    for i in 'bc':
        net[i].peerLost('a')
    n = _ticks_until_a_new_leader(net, 'bc', KILLED_A, LOST.election_timeout_min - 1)
    assert n is not None and net['c'].state == RaftState.LEADER and net['c'].term == 2


def test_a_lost_connection_to_a_live_leader_deposes_nobody():
    net = Net(conf=LOST)
    leader = net.elect('a')
    cut = {('a', 'c'), ('c', 'a')}                # c's connection to a is cut; b still hears a
    net['c'].peerLost('a')
    for _ in range(3 * LOST.election_timeout_max):
        for i in 'abc':
            net.tick(i)
        net.deliver(cut)
    assert leader.state == RaftState.LEADER and leader.term == 1 and net['b'].term == 1
    assert net['c'].term == 1                     # its pre-votes were refused: b hears the leader


def test_a_lost_connection_to_another_node_or_without_the_setting_changes_nothing():
    for conf, lost in ((LOST, 'c'), (CONF, 'a')):
        net = Net(conf=conf)
        net.elect('a')
        net.deliver()
        b = net['b']
        before = (b.leader, b.raftElectionDeadline)
        b.peerLost(lost)
        assert (b.leader, b.raftElectionDeadline) == before
    net['a'].peerLost('b')                        # a leader losing a follower: still leads
    assert net['a'].state == RaftState.LEADER


class DiskReader:
    """A core's storage (core.Storage) over the harness's disk: what the core let go of and asks
    back must be there, the same entry."""

    def __init__(self, net, i):
        self.net, self.i, self.reads = net, i, 0

    def data(self, index, term):
        entry = self.net.disks[self.i][1][index - 1 - self.net.offsets.get(self.i, 0)]
        assert (entry.index, entry.term) == (index, term)
        self.reads += 1
        return entry.data


def net_with_storage(limit):
    net = Net(conf=dataclasses.replace(CONF, log_memory_bytes=limit))
    readers = {i: DiskReader(net, i) for i in 'abc'}
    net.cores = {i: RaftCore(i, 'abc', random.Random(n), net['a'].conf, storage=readers[i])
                 for n, i in enumerate('abc')}
    return net, readers


def test_a_core_with_a_storage_holds_its_newest_commands_and_reads_the_rest_back():
    """etcd-io/raft's Storage: past log_memory_bytes the oldest persisted commands are let go
    and read back when a follower far behind needs them; it gets the same commands."""
    net, readers = net_with_storage(10)
    a = net.elect('a')
    cut = {('a', 'c'), ('c', 'a')}
    datas = [b'%04d' % n for n in range(30)]
    for d in datas:
        net.propose('a', d)
        net.deliver(cut)
    assert a.heldBytes <= 10 + 4 and readers['a'].reads == 0      # nothing read back yet
    assert [e.data for e in a.entries(2)] == datas                 # read back whole (entry 1: the no-op)
    before = readers['a'].reads
    for _ in range(30):
        net.tick('a')
        net.deliver()
    assert [e.data for e in net.applied['c'] if e.kind == EntryKind.REGULAR] == datas
    assert readers['a'].reads > before                             # c's catch-up read them back


def test_a_core_never_lets_go_of_a_command_not_yet_on_disk():
    net, readers = net_with_storage(0)
    a = net.elect('a')
    for d in (b'aaaa', b'bbbb', b'cccc'):
        a.propose(d)
    assert a.heldBytes == 12                     # not persisted: held whatever the limit
    net.flush('a')
    assert a.heldBytes == 4                      # persisted: all but the newest let go
    assert [e.data for e in a.entries(2)] == [b'aaaa', b'bbbb', b'cccc']


def test_a_follower_cut_back_keeps_its_count_of_held_bytes():
    """A follower's uncommitted entries, let go and then cut by a new leader: what it holds is
    what its log holds (the count never runs below what is there)."""
    net, readers = net_with_storage(0)
    net.elect('a')
    cut = {('a', 'b'), ('a', 'c')}
    net.propose('a', b'lost1', b'lost2')        # a's alone, then a is cut off
    net.take(src='a')
    net.forget_leader('c')
    b = net.elect('b', cut=cut)
    net.propose('b', b'kept1', b'kept2', b'kept3')
    net.deliver(cut)
    for _ in range(3):
        net.tick('b')
        net.deliver()
    a = net['a']
    assert [e.data for e in a.entries(2)] == [e.data for e in b.entries(2)]
    assert 0 <= a.heldBytes <= max(len(e.data) for e in a.entries(a.lastIndex, a.lastIndex))
