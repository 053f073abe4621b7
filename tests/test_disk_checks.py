"""The disk checks in the Raft fork (FORK.md "Checksums"; docs/chaos.md "Faults of the disk"): a
node that finds its journal, snapshot or meta file damaged keeps what verifies, neither votes
nor stands for election until a leader's log matched its own up to the leader's commit index,
and says so; a damaged snapshot is neither sent nor installed; a failed sync stops the node
before anything it wrote is acknowledged. SyncObj driven by hand (no sockets) here; the same on
real clusters in tests/cluster/test_disk_faults.py."""
from __future__ import annotations

import errno
import io
import os
import random

import pytest

from raftq.cluster.chaos import diskfaults
from raftq.cluster.local import free_ports
from raftq.node.raft import SyncObj, SyncObjConf, serializer
from raftq.node.raft.journal import StorageFailure, createJournal
from raftq.node.raft.node import TCPNode
from raftq.node.raft.serializer import SNAPSHOT_FORMAT, SNAPSHOT_VERSION, Serializer
from raftq.node.raft.transport import Transport


class RecordingTransport(Transport):
    """A transport without sockets: the test hands the SyncObj its messages and reads its sends."""

    def __init__(self):
        super().__init__(None, None, [])
        self.sent = []

    def send(self, node, message):
        self.sent.append(message)
        return True

    def of(self, kind):
        return [m for m in self.sent if m.get("type") == kind]


def journal_of(tmp_path, n=60, commit=50, term=1):
    path = str(tmp_path / "raft.journal")
    j = createJournal(path)
    j.add(b"\x01", 1, 0)
    for i in range(2, n + 1):
        j.add(b"\x01" + os.urandom(40), i, term)
    j.setCurrentTerm(term, None)
    j.setRaftCommitIndex(commit)
    j.onOneSecondTimer()
    entries = [tuple(j[k]) for k in range(len(j))]
    offsets = j.recordOffsets
    j._destroy()
    return path, entries, offsets


def syncobj(tmp_path, transport, peers=2, **conf):
    ports = free_ports(peers + 1)
    conf.setdefault("journalFile", str(tmp_path / "raft.journal"))
    conf.setdefault("fullDumpFile", str(tmp_path / "raft.dump"))
    so = SyncObj(f"127.0.0.1:{ports[0]}", [f"127.0.0.1:{p}" for p in ports[1:]], transport=transport,
                 conf=SyncObjConf(autoTick=False, **conf))
    return so, [TCPNode(f"127.0.0.1:{p}") for p in ports[1:]]


def vote_request(term, last_index=10_000, last_term=99):
    return {"type": "request_vote", "term": term, "last_log_index": last_index, "last_log_term": last_term}


def test_a_truncated_journal_neither_votes_nor_leads_until_it_caught_up(tmp_path):
    path, entries, offsets = journal_of(tmp_path)
    os.truncate(path, offsets[29] + 5)                      # entries 30.. gone; the node knew 50 committed
    t = RecordingTransport()
    so, (leader, other) = syncobj(tmp_path, t)
    try:
        kinds = {f["what"] for f in so.diskFindings}
        assert kinds == {"journal_truncated", "journal_short_of_commit"}
        assert so.logUnverified["claimed_commit"] == 50 and so.raftCommitIndex == 29
        so.doTick(0)
        t._onMessageReceived(other, vote_request(5))
        assert t.of("response_vote") == []                  # never a vote from an untrusted log
        # A restart before it caught up: still untrusted (the state is in the meta file).
        so.destroy()
        so, (leader, other) = syncobj(tmp_path, t)
        assert so.logUnverified is not None and so.raftCurrentTerm == 5
        # The leader's log matches from 29 on and its commit index is 55: caught up at 60.
        t._onMessageReceived(leader, {"type": "append_entries", "term": 6, "commit_index": 55, "prevLogIdx": 29,
                                      "prevLogTerm": 1, "entries": entries[29:]})
        assert t.of("next_node_idx")[-1]["success"] and so.logUnverified is None
        t._onMessageReceived(other, vote_request(7))
        assert t.of("response_vote") == [{"type": "response_vote", "term": 7}]
    finally:
        so.destroy()


def test_caught_up_means_up_to_the_commit_index_it_knew_as_well(tmp_path):
    path, entries, offsets = journal_of(tmp_path)
    os.truncate(path, offsets[39])
    t = RecordingTransport()
    so, (leader, other) = syncobj(tmp_path, t)
    try:
        # A new leader whose commit index is still behind what this node knew (50).
        t._onMessageReceived(leader, {"type": "append_entries", "term": 2, "commit_index": 20, "prevLogIdx": 39,
                                      "prevLogTerm": 1, "entries": entries[39:45]})
        assert so.logUnverified is not None
        t._onMessageReceived(leader, {"type": "append_entries", "term": 2, "commit_index": 20, "prevLogIdx": 45,
                                      "prevLogTerm": 1, "entries": entries[45:]})
        assert so.logUnverified is None
    finally:
        so.destroy()


def test_a_damaged_middle_entry_keeps_the_prefix_and_applies_it(tmp_path):
    path, entries, offsets = journal_of(tmp_path)
    diskfaults.flip(tmp_path / "raft.journal", [offsets[20] + 30], random.Random(1))
    t = RecordingTransport()
    so, _ = syncobj(tmp_path, t)
    try:
        assert [f["what"] for f in so.diskFindings] == ["journal_corrupt_entry", "journal_short_of_commit"]
        so.doTick(0)
        assert so.raftLastApplied == 20                     # the verified prefix is applied, not more
    finally:
        so.destroy()


def test_a_torn_tail_is_untrusted_too(tmp_path):
    """A torn last record after a crash held only unsynced entries; after a flip at rest it may
    have been acknowledged. The two look alike, so both make the log untrusted."""
    path, entries, offsets = journal_of(tmp_path, commit=10)
    diskfaults.flip(tmp_path / "raft.journal", [offsets[-1] + 30], random.Random(2))
    t = RecordingTransport()
    so, (_, other) = syncobj(tmp_path, t)
    try:
        assert [f["what"] for f in so.diskFindings] == ["journal_torn_tail"]
        t._onMessageReceived(other, vote_request(5))
        assert t.of("response_vote") == []
    finally:
        so.destroy()


def test_a_damaged_meta_file_counts_the_vote_of_its_term_as_given(tmp_path):
    journal_of(tmp_path, commit=10, term=3)
    diskfaults.flip(tmp_path / "raft.journal.meta", [12], random.Random(3))
    t = RecordingTransport()
    so, (_, other) = syncobj(tmp_path, t)
    try:
        assert [f["what"] for f in so.diskFindings] == ["meta_damaged"]
        assert so.raftCurrentTerm == 3 and so.logUnverified is not None     # the term from the log
        t._onMessageReceived(other, vote_request(3))
        assert t.of("response_vote") == []
    finally:
        so.destroy()


def _document(last=100, members=()):
    return {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION,
            "raft": {"last": (b"\x01", last, 2), "prev": (b"\x01", last - 1, 2), "members": list(members),
                     "code_version": 0},
            "consumers": []}


def _snapshot_bytes(doc):
    buf = io.BytesIO()
    serializer.writeDocument(buf, doc, 1)
    return buf.getvalue()


def test_a_damaged_snapshot_is_moved_aside_with_its_journal_and_installed_again(tmp_path):
    (tmp_path / "raft.dump").write_bytes(_snapshot_bytes(_document()))
    j = createJournal(str(tmp_path / "raft.journal"))
    for i in range(99, 110):
        j.add(b"\x01", i, 2)
    j.setCurrentTerm(2, None)
    j.setRaftCommitIndex(105)
    j.onOneSecondTimer()
    j._destroy()
    diskfaults.flip(tmp_path / "raft.dump", [40], random.Random(4))
    t = RecordingTransport()
    so, (leader, _) = syncobj(tmp_path, t)
    try:
        assert {f["what"] for f in so.diskFindings} == {"snapshot_damaged", "snapshot_missing", "journal_short_of_commit"}
        assert (tmp_path / "raft.dump.damaged").exists() and not (tmp_path / "raft.dump").exists()
        so.doTick(0)
        assert so.raftLastApplied == 1 and so.logUnverified is not None
        # The leader installs a snapshot (one chunk, then the end).
        good = _snapshot_bytes(_document(last=120))
        for chunk in ((good, True, False), (b"", False, True)):
            t._onMessageReceived(leader, {"type": "append_entries", "term": 3, "commit_index": 120,
                                          "serialized": chunk})
        assert so.raftLastApplied == 120 and so.logUnverified is None
    finally:
        so.destroy()


def test_a_snapshot_that_fails_its_checksum_is_neither_sent_nor_installed(tmp_path):
    damaged = []
    s = Serializer(str(tmp_path / "raft.dump"), 1 << 20, False, onDamaged=lambda what, d: damaged.append(what))
    good = _snapshot_bytes(_document())
    (tmp_path / "raft.dump").write_bytes(good)
    assert s.verify() is None and s.getTransmissionData("f1")[0] == good
    s.cancelTransmisstion("f1")
    for off in (0, 20, len(good) // 2, len(good) - 3):      # header, stream, trailer
        bad = bytearray(good)
        bad[off] ^= 0x40
        (tmp_path / "raft.dump").write_bytes(bytes(bad))
        assert s.verify() is not None
        assert s.getTransmissionData(f"f{off}") is None
    assert damaged == ["snapshot_damaged"] * 4
    # Received: checked before it replaces the node's own file.
    (tmp_path / "raft.dump").write_bytes(good)
    bad = bytearray(good)
    bad[len(good) // 2] ^= 1
    assert not s.setTransmissionData((bytes(bad), True, False))
    assert not s.setTransmissionData((b"", False, True))
    assert damaged[-1] == "snapshot_received_damaged" and (tmp_path / "raft.dump").read_bytes() == good
    assert not (tmp_path / "raft.dump.1.tmp").exists()


class FailingSync:
    def attach(self, journal, file):
        pass

    def beforeWrite(self, offset):
        pass

    def beforeSync(self):
        raise OSError(errno.EIO, "Input/output error")

    def durable(self):
        pass


def test_a_failed_sync_is_never_acknowledged_nor_retried(tmp_path):
    t = RecordingTransport()
    so, (leader, _) = syncobj(tmp_path, t, journalObserver=FailingSync())
    try:
        with pytest.raises(StorageFailure) as e:
            t._onMessageReceived(leader, {"type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": 1,
                                          "prevLogTerm": 0, "entries": [(b"\x01", 2, 1)]})
        assert e.value.errno == errno.EIO and e.value.path.endswith("raft.journal")
        assert t.of("next_node_idx") == [] and so.journalSyncs == 0
    finally:
        so.destroy()


def test_a_snapshot_writer_that_the_disk_failed_exits_with_its_errno(tmp_path, monkeypatch):
    s = Serializer(str(tmp_path / "raft.dump"), 1 << 20, False)
    real = serializer.atomicReplace

    def failing(old, new, fsync=False):
        raise StorageFailure(old, "fsync", OSError(errno.EIO, "Input/output error"))

    monkeypatch.setattr(serializer, "atomicReplace", failing)
    s.serialize(lambda: _document(), 7)
    assert s.checkSerializing()[0] == serializer.SERIALIZER_STATE.FAILED and s.lastFailure == serializer.EXIT_EIO
    monkeypatch.setattr(serializer, "atomicReplace", real)


def test_an_operator_may_accept_a_damaged_log(tmp_path):
    """`raftq node --accept-damaged-log`: for a majority damaged at once, where no trusted
    leader can repair anyone. The findings are still reported; the node votes at once."""
    path, entries, offsets = journal_of(tmp_path)
    os.truncate(path, offsets[29] + 5)
    t = RecordingTransport()
    so, (leader, other) = syncobj(tmp_path, t, acceptDamagedLog=True)
    try:
        assert {f["what"] for f in so.diskFindings} == {"journal_truncated", "journal_short_of_commit"}
        assert so.logUnverified is None
        t._onMessageReceived(other, vote_request(5))
        assert t.of("response_vote") == [{"type": "response_vote", "term": 5}]
    finally:
        so.destroy()
