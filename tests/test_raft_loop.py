"""The Ready loop's own rules (node/raft/loop.py), apart from the core and the link: when a node
stands for election (docs/cluster.md "Raft engines")."""
from types import SimpleNamespace

import pytest

from raftq.node.raft.loop import APPLY_LAG_MAX, LoopSyncObj


def _node(commit, applied, eligible=None):
    return SimpleNamespace(core=SimpleNamespace(commitIndex=commit), raftLastApplied=applied,
                           conf=SimpleNamespace(electionEligible=eligible))


@pytest.mark.parametrize("behind, stands", [(0, True), (APPLY_LAG_MAX, True), (APPLY_LAG_MAX + 1, False),
                                            (50_000, False)])
def test_a_node_far_behind_in_its_applies_does_not_stand_for_election(behind, stands):
    # as a leader it would commit its clients' calls and answer them only after its replay
    assert LoopSyncObj._may_stand(_node(60_000, 60_000 - behind)) is stands


def test_a_node_below_its_disk_reserve_does_not_stand_for_election():
    assert LoopSyncObj._may_stand(_node(10, 10, eligible=lambda: False)) is False
    assert LoopSyncObj._may_stand(_node(10, 10, eligible=lambda: True)) is True
    # the reserve is asked only of a node that could stand otherwise
    asked = []
    LoopSyncObj._may_stand(_node(5000, 10, eligible=lambda: asked.append(1) or True))
    assert asked == []
