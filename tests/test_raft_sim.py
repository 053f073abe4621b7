"""The simulator of a cluster of pure Raft cores (node/raft/sim.py): hundreds of seeds keep Raft
safe and live, a seed replays exactly, the seeds that found bugs stay fixed, and bugs planted in
the core are caught (so the checks are not vacuous).

The seeds named here are the simulator's: a change to what it draws moves them. Then plant the
bug again (as the tests below do) and take the first seed of sim.run that reports it."""
from __future__ import annotations

import time

import pytest

from raftq.node.raft import sim
from raftq.node.raft.core import MessageType, RaftCore, Snapshot

SEEDS = 200             # ~10 s here: six simulated seconds each (a calm phase, a chaos phase, calm again)
SEED_MS = 6000


def test_hundreds_of_seeds_keep_raft_safe_and_live():
    start = time.perf_counter()
    failures, totals, simulated = [], {}, 0
    for seed in range(SEEDS):
        r = sim.run(seed, durationMs=SEED_MS)
        simulated += r.simulatedMs
        if r.violation:
            failures.append(f'seed {seed}: {r.violation}')
        for k, v in r.counts.items():
            totals[k] = totals.get(k, 0) + v
    assert failures == []
    # the runs did go through what they are meant to check
    assert totals['acked'] > 100 * SEEDS and totals['crashes'] > SEEDS and totals['calm_phases'] >= 2 * SEEDS
    assert totals['elections'] > SEEDS and totals['damaged'] > SEEDS // 10
    assert totals['transfers_done'] > SEEDS and totals['transfers_done'] > 0.9 * totals['transfers']
    assert totals['added'] > SEEDS // 2 and totals['removed'] > SEEDS // 2 and totals['removals_told'] > SEEDS // 3
    assert totals['compactions'] > 10 * SEEDS and totals['installs'] > SEEDS
    assert totals['losses_told'] > SEEDS            # closed connections told (core.peerLost)
    assert totals['read_back'] > 100 * SEEDS        # commands a core let go of, read back (core.Storage)
    print(f'{SEEDS} seeds, {simulated / 1000:.0f} simulated s in {time.perf_counter() - start:.1f} s')


def test_a_seed_replays_exactly():
    a, b = sim.run(7), sim.run(7)
    assert a.violation is None and a.counts == b.counts and a.applied == b.applied
    assert len(a.applied) > 100 and sim.run(8).applied != a.applied


def test_a_node_whose_log_lacks_an_add_votes_for_the_new_member_seed_10():
    """FORK.md "Found by the simulator": four voters, one down, the one whose log lacked the
    add refused the new member (which held the longest log): nobody could be elected."""
    r = sim.run(10)
    assert r.violation is None and r.counts['added'] >= 1


def test_a_node_behind_in_term_is_elected_seed_189():
    """FORK.md "Found by the simulator": with one node of three down, the node with the newer
    term and the shorter log and the one with the older term and the longer log elected nobody."""
    r = sim.run(189, nodes=3, durationMs=8000)
    assert r.violation is None and r.counts['calm_phases'] >= 2


def _fork_prevote(original):
    def onPreVoteRequest(self, m):
        if m.term <= self.raftCurrentTerm:
            return          # syncobj.py's rule: an older term is ignored, not answered
        return original(self, m)
    return onPreVoteRequest


def _ack_before_sync(self, node, success, nextNodeIdx, rejectIndex):
    self._send(MessageType.NEXT_NODE_IDX, node, afterSync=False, success=success, next_node_idx=nextNodeIdx,
               reject_index=rejectIndex)


def _fork_vote_filter(original):
    def step(self, m):
        if m.type in (MessageType.REQUEST_PREVOTE, MessageType.REQUEST_VOTE) and m.src not in self.voters:
            return          # syncobj.py's rule: every vote request of a non-member is ignored
        return original(self, m)
    return step


def _stale_snapshot(original):
    def compact(self, index, data):
        old = self._snapshot
        original(self, index, data)
        if old is not None:         # the new snapshot goes out with the old one's state
            new = self._snapshot
            self._snapshot = Snapshot(new.index, new.term, new.voters, old.data)
    return compact


def _counts_learners(self):
    """The commit rule over every node the leader replicates to (learners and departing members too)."""
    matches = sorted([self._stableIndex] + [pr.match for pr in self._progress.values()], reverse=True)
    n = matches[len(self.voters) // 2]
    if n > self.raftCommitIndex and self._termAt(n) == self.raftCurrentTerm:
        self.raftCommitIndex = n


@pytest.mark.parametrize('bug, seed, nodes, ms, found', [
    ('the fork\'s pre-vote rule', 189, 3, 8000, 'liveness: nothing proposed'),
    ('a follower acknowledges before its sync', 0, None, SEED_MS, 'commit rule'),
    ('the target ignores TimeoutNow', 0, None, SEED_MS, 'liveness: the transfer'),
    ('the leader counts learners', 2, None, SEED_MS, 'commit rule'),
    ('a snapshot sent with a stale state', 0, None, SEED_MS, 'state machine safety'),
    ('the fork\'s vote filter', 10, None, sim.DURATION_MS, 'liveness: nothing proposed'),
])
def test_the_checks_catch_a_bug_planted_in_the_core(monkeypatch, bug, seed, nodes, ms, found):
    if bug == 'the fork\'s pre-vote rule':
        handlers = dict(RaftCore._HANDLERS)
        handlers[MessageType.REQUEST_PREVOTE] = _fork_prevote(RaftCore._onPreVoteRequest)
        monkeypatch.setattr(RaftCore, '_HANDLERS', handlers)
    elif bug == 'the fork\'s vote filter':
        monkeypatch.setattr(RaftCore, 'step', _fork_vote_filter(RaftCore.step))
    elif bug == 'a snapshot sent with a stale state':
        monkeypatch.setattr(RaftCore, 'compact', _stale_snapshot(RaftCore.compact))
    elif bug == 'the leader counts learners':
        monkeypatch.setattr(RaftCore, '_maybeCommit', _counts_learners)
    elif bug == 'the target ignores TimeoutNow':
        monkeypatch.setattr(RaftCore, '_HANDLERS', {**RaftCore._HANDLERS, MessageType.TIMEOUT_NOW: lambda self, m: None})
    else:
        monkeypatch.setattr(RaftCore, '_sendNextNodeIdx', _ack_before_sync)
    r = sim.run(seed, nodes=nodes, durationMs=ms)
    assert r.violation is not None and found in r.violation, r.violation


def test_the_command_line_prints_a_summary_and_fails_on_a_violation(capsys, monkeypatch):
    assert sim.main(['--seeds', '2', '--duration-ms', '3000']) == 0
    out = capsys.readouterr().out
    assert '2 seeds, 0 failed' in out and 'simulated s per wall s' in out and 'seeds per minute' in out
    monkeypatch.setattr(RaftCore, '_sendNextNodeIdx', _ack_before_sync)
    assert sim.main(['--seed', '0', '--duration-ms', str(SEED_MS)]) == 1
    out = capsys.readouterr().out
    assert 'commit rule' in out and ' ms  n' in out       # the replay, event by event
