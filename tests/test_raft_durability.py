"""Durability in the Raft fork (node/raft, FORK.md "Durability"): what is on disk when a write is
acknowledged, in fsync and in memory durability, and the power-loss test hook's record of it."""
from __future__ import annotations

import os
import random

import pytest

from raftq.cluster.local import free_ports
from raftq.node.raft import SyncObj, SyncObjConf, journal, serializer
from raftq.node.raft.journal import MetaStorer, createJournal
from raftq.node.raft.node import TCPNode
from raftq.node.raft.transport import Transport


def test_fsync_mode_syncs_snapshots_before_the_rename(tmp_path, monkeypatch):
    """Found while working out what a power cut would lose: pysyncobj renamed its snapshot into
    place without fsync, then compacted the journal. In fsync mode the snapshot file and its
    directory are now synced around the rename."""
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    tmp, dst = tmp_path / "raft.dump.tmp", tmp_path / "raft.dump"
    tmp.write_bytes(b"snapshot")
    serializer.atomicReplace(str(tmp), str(dst), fsync=True)
    assert dst.read_bytes() == b"snapshot" and not tmp.exists()
    assert synced == [str(tmp), str(tmp_path)]
    tmp.write_bytes(b"again")                         # memory durability: a plain rename
    serializer.atomicReplace(str(tmp), str(dst))
    assert dst.read_bytes() == b"again" and len(synced) == 2


def test_memory_mode_syncs_term_and_vote_only_when_they_change(tmp_path, monkeypatch):
    """Memory mode: a power cut must not take a node's term or vote back (two leaders in one
    term), so they are fsynced when they change; the commit index alone is never written."""
    synced = []
    monkeypatch.setattr(journal.os, "fsync", lambda fd: synced.append(fd))
    m = MetaStorer(str(tmp_path / "raft.journal.meta"), termVoteOnly=True)
    m.storeMeta({"currentTerm": 3, "votedForNodeId": "a", "raftCommitIndex": 10})
    assert m.getMeta()["currentTerm"] == 3 and len(synced) == 2              # the file, then the directory
    m.storeMeta({"currentTerm": 3, "votedForNodeId": "a", "raftCommitIndex": 99})
    assert m.getMeta()["raftCommitIndex"] == 10 and len(synced) == 2         # commit index alone: nothing
    m.storeMeta({"currentTerm": 4, "votedForNodeId": None, "raftCommitIndex": 120})
    assert m.getMeta() == {"currentTerm": 4, "votedForNodeId": None, "raftCommitIndex": 120} and len(synced) == 4


def test_fsync_mode_syncs_every_meta_write(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(journal.os, "fsync", lambda fd: synced.append(fd))
    m = MetaStorer(str(tmp_path / "raft.journal.meta"))
    m.storeMeta({"currentTerm": 3, "votedForNodeId": "a", "raftCommitIndex": 10})
    m.storeMeta({"currentTerm": 3, "votedForNodeId": "a", "raftCommitIndex": 99})
    assert m.getMeta()["raftCommitIndex"] == 99 and len(synced) == 4


@pytest.mark.parametrize("durability", ["fsync", "memory"])
def test_memory_mode_restarts_with_the_commit_index_unknown(tmp_path, durability):
    """Regression (the power-loss fault, memory mode: "truncating already-applied log entries"
    on a node that had replayed entries the new leader did not have): pysyncobj applies its
    journal up to the commit index it stored, before hearing from any leader. In memory mode
    that index may cover entries no other disk has after a power cut, so a restarted node starts
    with it unknown; in fsync mode those entries are on a majority's disk and it is kept."""
    path = str(tmp_path / "raft.journal")
    j = createJournal(path)
    for i in range(1, 61):
        j.add(b"\x00", i, 1)
    j.setCurrentTerm(1, None)
    j.setRaftCommitIndex(50)
    j.onOneSecondTimer()
    j._destroy()
    port = free_ports(1)[0]
    so = SyncObj(f"127.0.0.1:{port}", [], conf=SyncObjConf(autoTick=False, journalFile=path, durability=durability))
    try:
        assert so.raftCommitIndex == (50 if durability == "fsync" else 1)
    finally:
        so.destroy()


class RecordingTransport(Transport):
    """A transport without sockets: the test hands the SyncObj its messages and reads its sends."""

    def __init__(self, events):
        super().__init__(None, None, [])
        self.events = events

    def send(self, node, message):
        self.events.append(("send", message))
        return True


def test_a_follower_syncs_its_journal_before_it_acknowledges_entries(tmp_path, monkeypatch):
    """fsync mode: a follower's success reply to an append (what lets the leader count it) is
    sent only after its journal reached the disk; a rejected append is not synced for."""
    events = []
    monkeypatch.setattr(journal, "datasync", lambda fd: events.append(("sync", fd)))
    t = RecordingTransport(events)
    me, leader = free_ports(2)
    so = SyncObj(f"127.0.0.1:{me}", [f"127.0.0.1:{leader}"], transport=t,
                 conf=SyncObjConf(autoTick=False, journalFile=str(tmp_path / "raft.journal")))
    try:
        node = TCPNode(f"127.0.0.1:{leader}")
        events.clear()
        t._onMessageReceived(node, {"type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": 1,
                                    "prevLogTerm": 0, "entries": [(b"\x00", 2, 1), (b"\x00", 3, 1)]})
        assert [e[0] for e in events] == ["sync", "send"], events
        assert events[1][1]["success"] and events[1][1]["next_node_idx"] == 4
        events.clear()
        t._onMessageReceived(node, {"type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": 9,
                                    "prevLogTerm": 1, "entries": [(b"\x00", 10, 1)]})
        assert [e[0] for e in events] == ["send"] and not events[0][1]["success"]
        assert so.journalSyncs == 1
    finally:
        so.destroy()


# ---------------------------------------------------------------------------- the power-loss hook
def test_the_sync_shadow_reads_the_journal_layout_the_fork_writes():
    from raftq.node.replication import sync_shadow
    assert sync_shadow.FIRST_RECORD_OFFSET == journal.FIRST_RECORD_OFFSET
    assert sync_shadow.LAST_RECORD_OFFSET_OFFSET == journal.LAST_RECORD_OFFSET_OFFSET


@pytest.mark.parametrize("mode", ["fsync", "memory"])
@pytest.mark.parametrize("seed", range(20))
def test_sync_shadow_restores_exactly_the_durable_journal(tmp_path, mode, seed):
    """The node-side record of what a disk honouring only fsync holds, against a model: random
    appends, conflict truncations (deleteEntriesFrom), compactions (deleteEntriesTo), snapshot
    installs (clear), term changes, snapshot replacements, process restarts and durable points
    on a real FileJournal (the file class the node uses in that mode); after `restore`, the
    journal loads exactly the entries of the last durable point, and (memory mode) the snapshot
    of that moment."""
    from raftq.node.replication.sync_shadow import SyncShadow, restore

    rng = random.Random(seed)
    d = tmp_path

    def open_journal():
        shadow = SyncShadow(d, mode, writeback=1000)
        journal = createJournal(str(d / "raft.journal"), durable=mode == "fsync", observer=shadow)
        return shadow, journal

    def dump():
        return (d / "raft.dump").read_bytes() if (d / "raft.dump").exists() else None

    shadow, j = open_journal()
    model, durable, durable_dump = [], [], None
    for _ in range(300):
        r = rng.random()
        if r < 0.45:
            # A Raft log: consecutive indices, terms that never go down (the journal checks both).
            e = (rng.randbytes(rng.randint(0, 300)), (model[-1][1] if model else 0) + 1,
                 (model[-1][2] if model else 1) + rng.choice((0, 0, 0, 1)))
            j.add(*e)
            model.append(e)
        elif r < 0.52 and model:
            k = rng.randrange(len(model))
            j.deleteEntriesFrom(k)
            del model[k:]
        elif r < 0.56 and model:
            k = rng.randrange(len(model))
            j.deleteEntriesTo(k)
            model = model[k:]
        elif r < 0.58:
            j.clear()
            model = []
        elif r < 0.62:
            j.setCurrentTerm(rng.randint(1, 99), "n1")
        elif r < 0.66:
            (d / "raft.dump.tmp").write_bytes(rng.randbytes(40))
            os.replace(d / "raft.dump.tmp", d / "raft.dump")
        elif r < 0.70:
            j._destroy()                                 # a process restart: the page cache stays
            shadow, j = open_journal()
        elif r < 0.85:
            if mode == "fsync":
                j.flush()
            shadow.durable()
            durable, durable_dump = list(model), dump()
    j._destroy()
    latest_dump = dump()
    out = restore(d, mode)
    assert "error" not in out, out
    loaded = createJournal(str(d / "raft.journal"))
    assert [(bytes(c), i, t) for c, i, t in (loaded[k] for k in range(len(loaded)))] == durable
    loaded._destroy()
    assert dump() == (durable_dump if mode == "memory" else latest_dump)
    shadow, j = open_journal()                            # the restored dir carries on
    j.add(b"x", 10_000, 9)
    shadow.durable()
    j._destroy()


def test_a_journal_sync_is_a_durable_point_of_the_shadow(tmp_path):
    """fsync mode: the observer hears of every real sync (FileJournal.sync), nothing else."""
    from raftq.node.replication.sync_shadow import SyncShadow, read_record

    shadow = SyncShadow(tmp_path, "fsync")
    j = createJournal(str(tmp_path / "raft.journal"), durable=True, observer=shadow)
    first = read_record(tmp_path)["gen"]
    j.sync()                                             # nothing new: no sync, no durable point
    assert read_record(tmp_path)["gen"] == first and shadow.durable_points == 1
    j.add(b"x", 1, 1)
    j.sync()
    rec = read_record(tmp_path)
    assert rec["gen"] > first and rec["last_index"] == 1 and shadow.durable_points == 2
    j._destroy()
