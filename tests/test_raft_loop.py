"""The Ready loop's own rules (node/raft/loop.py), apart from the core and the link: when a node
stands for election (docs/cluster.md "Raft engines"), and its membership entries in the fork's
journal records."""
from types import SimpleNamespace

import pytest

from raftq.node.raft import pickle
from raftq.node.raft.core import ChangeType, ConfChange, Entry, EntryKind
from raftq.node.raft.loop import APPLY_LAG_MAX, LoopSyncObj, _command, _entry


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


# ---------------------------------------------------------------------------- membership records
# A data dir written by one engine replays on the other (docs/cluster.md "Raft engines"): the
# loop engine's membership entries are the fork's journal records, read both ways.
def _fork_request(kind, address, info):
    """The change syncobj.py's __membershipRequest journals (after the type byte, pickled)."""
    return [kind, address, address] + ([info] if info is not None else [])


def _fork_parse(record):
    """As syncobj.py's __parseChangeClusterRequest reads a record back."""
    assert record[0] == 2
    return pickle.loads(record[1:])


@pytest.mark.parametrize("kind, info", [("add", {"id": "n4", "url": "http://h:4"}), ("rem", {"id": "n2", "url": "u"}),
                                        ("add", None)])
def test_a_membership_record_of_the_fork_is_read_as_the_cores_change(kind, info):
    record = b"\x02" + pickle.dumps(_fork_request(kind, "10.0.0.4:7104", info))
    e = _entry(record, 7, 3)
    assert (e.index, e.term, e.kind) == (7, 3, EntryKind.MEMBERSHIP)
    assert ConfChange.decode(e.data) == ConfChange(ChangeType(kind), "10.0.0.4:7104", info)


@pytest.mark.parametrize("change", [ConfChange(ChangeType.ADD, "10.0.0.4:7104", {"id": "n4", "url": "http://h:4"}),
                                    ConfChange(ChangeType.REMOVE, "10.0.0.2:7102", None)])
def test_a_membership_entry_of_the_core_is_written_as_the_fork_writes_it(change):
    record = _command(Entry(9, 2, change.encode(), EntryKind.MEMBERSHIP))
    assert _fork_parse(record) == _fork_request(change.type.value, change.node, change.info)
    assert _entry(record, 9, 2) == Entry(9, 2, change.encode(), EntryKind.MEMBERSHIP)


def test_a_membership_record_that_does_not_read_is_a_no_op():
    assert _entry(b"\x02not a pickle", 5, 1) == Entry(5, 1, b"\x01", EntryKind.NO_OP)
    assert _entry(b"\x02" + pickle.dumps(["move", "a:1", "a:1"]), 5, 1).kind is EntryKind.NO_OP
