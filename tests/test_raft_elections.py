"""PreVote and CheckQuorum in the Raft fork (FORK.md "PreVote and CheckQuorum"): a node that stops
hearing its leader asks for a pre-vote before it raises its term, and nodes that still hear the
leader refuse it, so a node cut off one way cannot depose a healthy leader; a leader that no
majority answers for an election timeout steps down and asks a follower to stand at once.
SyncObj driven by hand; the real clusters with a one-way cut in the chaos proxy are in
tests/cluster/test_raft_elections_cluster.py."""
from __future__ import annotations

import time

from raftq.cluster.local import free_ports
from raftq.node.raft import SyncObj, SyncObjConf
from raftq.node.raft.node import TCPNode
from raftq.node.raft.transport import Transport
from tests.conftest import poll

FOLLOWER, CANDIDATE, LEADER = 0, 1, 2


class RecordingTransport(Transport):
    def __init__(self):
        super().__init__(None, None, [])
        self.sent = []

    def send(self, node, message):
        self.sent.append((node, message))
        return True

    def of(self, kind):
        return [(n, m) for n, m in self.sent if m.get("type") == kind]


def node3(tmp_path, **conf):
    """A SyncObj with two peers, both 'connected', and short election timeouts."""
    ports = free_ports(3)
    t = RecordingTransport()
    conf = {"autoTick": False, "journalFile": str(tmp_path / "raft.journal"), "raftMinTimeout": 0.31,
            "raftMaxTimeout": 0.32, "appendEntriesPeriod": 0.1, **conf}
    so = SyncObj(f"127.0.0.1:{ports[0]}", [f"127.0.0.1:{p}" for p in ports[1:]], transport=t,
                 conf=SyncObjConf(**conf))
    peers = [TCPNode(f"127.0.0.1:{p}") for p in ports[1:]]
    for p in peers:
        t._onNodeConnected(p)
    return so, t, peers


def heartbeat(term, commit=1):
    return {"type": "append_entries", "term": term, "commit_index": commit, "prevLogIdx": 1, "prevLogTerm": 0,
            "entries": []}


def prevote(term, last_index=1, last_term=0):
    return {"type": "request_prevote", "term": term, "last_log_index": last_index, "last_log_term": last_term}


def lead(so, t, voter):
    """Make `so` the leader of term 1 with `voter`'s pre-vote and vote."""
    poll(lambda: so.doTick(0) or t.of("request_prevote"), timeout=5, what="a pre-vote")
    t._onMessageReceived(voter, {"type": "response_prevote", "term": 1})
    t._onMessageReceived(voter, {"type": "response_vote", "term": 1})
    assert so.raftState == LEADER


def test_a_pre_vote_neither_raises_the_term_nor_wins_without_a_majority(tmp_path):
    so, t, (a, b) = node3(tmp_path)
    try:
        poll(lambda: so.doTick(0) or t.of("request_prevote"), timeout=5, what="a pre-vote after the timeout")
        asks = t.of("request_prevote")
        assert {n for n, _ in asks} == {a, b} and all(m["term"] == 1 for _, m in asks)
        assert so.raftCurrentTerm == 0 and so.raftState == FOLLOWER and t.of("request_vote") == []
        # The same node granting twice (a late answer of an earlier round) counts once.
        t._onMessageReceived(a, {"type": "response_prevote", "term": 1})
        # 2 of 3 (itself and a): the real election, in term 1.
        assert so.raftCurrentTerm == 1 and so.raftState in (CANDIDATE, LEADER)
        assert {n for n, m in t.of("request_vote")} == {a, b}
    finally:
        so.destroy()


def test_a_node_that_hears_its_leader_refuses_pre_votes(tmp_path):
    so, t, (leader, other) = node3(tmp_path)
    try:
        t._onMessageReceived(leader, heartbeat(3))
        t._onMessageReceived(other, prevote(4, last_index=100, last_term=3))
        assert t.of("response_prevote") == [] and so.raftCurrentTerm == 3
        # No leader heard for an election timeout: granted, and still nothing changed here.
        granted = poll(lambda: so.doTick(0) or t._onMessageReceived(other, prevote(4, last_index=100, last_term=3))
                       or t.of("response_prevote"), timeout=5, what="a granted pre-vote")
        assert granted[0] == (other, {"type": "response_prevote", "term": 4})
        assert so.raftCurrentTerm == 3 and so.raftState == FOLLOWER
        # A log behind this node's is refused, as a vote would be.
        t.sent.clear()
        t._onMessageReceived(leader, {"type": "append_entries", "term": 3, "commit_index": 1, "prevLogIdx": 1,
                                      "prevLogTerm": 0, "entries": [(b"\x01", 2, 3)]})
        poll(lambda: so.doTick(0) or t._onMessageReceived(other, prevote(4, last_index=100, last_term=3))
             or t.of("response_prevote"), timeout=5, what="the timeout again")
        t.sent.clear()
        t._onMessageReceived(other, prevote(4, last_index=1, last_term=3))
        assert t.of("response_prevote") == []
    finally:
        so.destroy()


def test_a_pre_vote_for_a_term_not_above_this_nodes_is_refused_with_the_term(tmp_path):
    """A node with the newer term (here 3) and a pre-candidate with the older term and the longer
    log, one node of three down: the pre-vote asks for a term not above 3, and the refusal says
    3 (a message type of its own), else neither could ever be elected (FORK.md "PreVote and
    CheckQuorum")."""
    so, t, (a, b) = node3(tmp_path)
    try:
        t._onMessageReceived(a, heartbeat(3))
        t.sent.clear()
        t._onMessageReceived(b, prevote(2, last_index=100, last_term=2))
        assert t.of("prevote_refused") == [(b, {"type": "prevote_refused", "term": 3})]
        assert t.of("response_prevote") == [] and so.raftCurrentTerm == 3 and so.raftState == FOLLOWER
        t._onMessageReceived(b, prevote(3, last_index=100, last_term=2))      # equal: refused too
        assert [m["term"] for _, m in t.of("prevote_refused")] == [3, 3]
    finally:
        so.destroy()


def test_a_pre_candidate_refused_by_a_newer_term_takes_it_and_asks_for_the_next(tmp_path):
    so, t, (a, b) = node3(tmp_path)
    try:
        poll(lambda: so.doTick(0) or t.of("request_prevote"), timeout=5, what="a pre-vote for term 1")
        t._onMessageReceived(a, {"type": "prevote_refused", "term": 4})
        assert so.raftCurrentTerm == 4 and so.raftState == FOLLOWER
        # A late grant of the round before counts for nothing now.
        t._onMessageReceived(b, {"type": "response_prevote", "term": 1})
        assert so.raftCurrentTerm == 4 and t.of("request_vote") == []
        # A refusal of a term not above its own changes nothing.
        t._onMessageReceived(a, {"type": "prevote_refused", "term": 2})
        assert so.raftCurrentTerm == 4
        t.sent.clear()
        poll(lambda: so.doTick(0) or t.of("request_prevote"), timeout=5, what="the next pre-vote")
        assert all(m["term"] == 5 for _, m in t.of("request_prevote"))
    finally:
        so.destroy()


def test_a_leader_that_no_majority_answers_steps_down_and_hands_over(tmp_path):
    so, t, (a, b) = node3(tmp_path)
    try:
        lead(so, t, a)
        t._onMessageReceived(b, {"type": "next_node_idx", "next_node_idx": 3, "success": True, "reset": False})
        t.sent.clear()
        # Nobody answers any more: after an election timeout it steps down and asks the most
        # up-to-date follower (b acknowledged more) to stand at once.
        poll(lambda: so.doTick(0) or so.raftState != LEADER, timeout=5, what="the step down")
        assert [(n, m) for n, m in t.of("timeout_now")] == [(b, {"type": "timeout_now", "term": 1})]
        # ... and leaves b the time to win: no pre-vote of its own for an election timeout.
        assert so.raftElectionDeadline - time.monotonic() > 0.25
        so.doTick(0)
        assert t.of("request_prevote") == [] and so.raftCurrentTerm == 1
    finally:
        so.destroy()


def test_a_leader_deposed_by_a_higher_term_waits_an_election_timeout_before_it_stands(tmp_path):
    """A leader paused (SIGSTOP, a stalled VM) wakes up to its successor's request_vote. Its
    election timer last ran before it led, long expired: it stood for election in its first tick
    as a follower, and a node that had voted for the successor but not yet heard from it granted
    the pre-vote, so a resumed leader deposed the new one (CI, tests/test_up.py)."""
    so, t, (a, b) = node3(tmp_path)
    try:
        lead(so, t, a)
        stale = so.raftElectionDeadline   # the follower's timer, which stops while it leads
        ack = {"type": "next_node_idx", "next_node_idx": 3, "success": True, "reset": False}
        poll(lambda: t._onMessageReceived(a, ack) or so.doTick(0.01) or time.monotonic() > stale + 0.05,
             timeout=5, what="the old timer's deadline passing while it leads")
        assert so.raftState == LEADER
        t.sent.clear()
        # b stands in term 2 with a log behind this one's (the leader's own entry of term 1):
        # refused, but the higher term makes this node a follower.
        t._onMessageReceived(b, {"type": "request_vote", "term": 2, "last_log_index": 1, "last_log_term": 0})
        assert so.raftState == FOLLOWER and so.raftCurrentTerm == 2 and t.of("response_vote") == []
        assert so.raftElectionDeadline - time.monotonic() > 0.25
        so.doTick(0)
        assert t.of("request_prevote") == [] and t.of("request_vote") == []
        # It does stand once a whole election timeout passed without a leader.
        poll(lambda: so.doTick(0) or t.of("request_prevote"), timeout=5, what="a pre-vote after the timeout")
        assert all(m["term"] == 3 for _, m in t.of("request_prevote"))
    finally:
        so.destroy()


def test_a_leader_keeps_leading_while_a_majority_answers(tmp_path):
    so, t, (a, b) = node3(tmp_path)
    try:
        lead(so, t, a)
        end = time.monotonic() + 1.0          # three election timeouts, one follower answering
        while time.monotonic() < end:
            t._onMessageReceived(a, {"type": "next_node_idx", "next_node_idx": 3, "success": True, "reset": False})
            so.doTick(0.01)
            assert so.raftState == LEADER
        assert t.of("timeout_now") == []
    finally:
        so.destroy()
