"""The Raft journal's file (node/raft/journal.py JournalFile, FORK.md "Journal file"): upstream's
format, written into space that is already on disk, so an append's fdatasync carries no block
allocation. Compared both ways with the fork's mmap class (memory durability) and, when the
reference package is installed (the `test` extra), with pysyncobj 0.3.17 itself."""
import os

import pytest

from raftq.node.raft import journal as rj
from raftq.node.raft.journal import GROW_BYTES, JournalFile


def _upstream(path):
    pj = pytest.importorskip("pysyncobj.journal")
    return pj.FileJournal(str(path))


OPENERS = {
    "pwrite": lambda path: rj.FileJournal(str(path), durable=True),       # JournalFile
    "mmap": lambda path: rj.FileJournal(str(path), durable=False),        # ResizableFile, as upstream's
    "upstream": _upstream,
}


def journal_with(kind, path):
    return OPENERS[kind](path)


def entries(n, start=1):
    return [(os.urandom(50 + i % 300), start + i, 1 + i // 100) for i in range(n)]


@pytest.mark.parametrize("writer,reader", [("pwrite", "upstream"), ("upstream", "pwrite"), ("pwrite", "pwrite"),
                                           ("pwrite", "mmap"), ("mmap", "pwrite")])
def test_same_format_as_pysyncobj_both_ways(tmp_path, writer, reader):
    path = tmp_path / "raft.journal"
    j = journal_with(writer, path)
    written = entries(500)
    for e in written:
        j.add(*e)
    j.deleteEntriesFrom(450)            # a conflicting tail dropped, then rewritten
    rewritten = entries(20, start=451)
    for e in rewritten:
        j.add(*e)
    j._destroy()
    back = journal_with(reader, path)
    assert [tuple(back[i]) for i in range(len(back))] == written[:450] + rewritten
    back._destroy()


def test_space_ahead_of_the_last_write_is_written_not_sparse(tmp_path):
    path = tmp_path / "raft.journal"
    j = journal_with("pwrite", path)
    big = os.urandom(300_000)
    for i in range(20):                 # 6 MB: past the first zero-filled region several times
        j.add(big, i + 1, 1)
    j._destroy()
    st = os.stat(path)
    written_end = 40 + 20 * (300_000 + 8 + 16)
    assert written_end < st.st_size <= written_end + GROW_BYTES + (1 << 20)
    # Every byte up to the end is a written block: no hole for an append to allocate into.
    # (pysyncobj's mmap file is grown with ftruncate and fails this.)
    assert st.st_blocks * 512 >= st.st_size
    assert os.lseek(os.open(path, os.O_RDONLY), 0, os.SEEK_HOLE) == st.st_size


def test_compaction_rewrites_from_the_start_without_growing(tmp_path):
    path = tmp_path / "raft.journal"
    j = journal_with("pwrite", path)
    for e in entries(2000):
        j.add(*e)
    size = os.stat(path).st_size
    j.deleteEntriesTo(1900)             # log compaction: clear, then the kept entries again
    kept = [tuple(j[i]) for i in range(len(j))]
    for e in entries(100, start=2001):
        j.add(*e)
    j._destroy()
    assert os.stat(path).st_size == size
    back = journal_with("pwrite", path)
    assert [tuple(back[i]) for i in range(len(back))][:100] == kept
    assert back[len(back) - 1][1] == 2100
    back._destroy()


def test_reads_past_the_end_are_short_as_mmap_slices_are(tmp_path):
    f = JournalFile(str(tmp_path / "j"), defaultContent=b"h" * 40)
    f.write(40, b"abc")
    assert f.read(40, 3) == b"abc"
    size = os.fstat(f.fileno()).st_size
    assert f.read(size - 2, 10) == b"\0\0"
    f._destroy()


def test_sync_datasyncs_only_after_an_append_and_only_in_fsync_durability(tmp_path, monkeypatch):
    """One fdatasync per append-entries round, shared by every entry in it; none for a journal
    with nothing new, none in memory durability."""
    synced = []
    monkeypatch.setattr(rj, "datasync", lambda fd: synced.append(fd))
    j = journal_with("pwrite", tmp_path / "raft.journal")
    synced.clear()                      # the zero fill at open
    j.sync()
    assert synced == [] and j.syncs == 0
    for i in range(3):                  # small: inside the first zero-filled region (no fill sync)
        j.add(b"x" * 10, i + 1, 1)
    j.sync()
    j.sync()
    assert len(synced) == 1 and j.syncs == 1
    j._destroy()
    synced.clear()
    m = journal_with("mmap", tmp_path / "memory.journal")
    m.add(b"x", 1, 1)
    m.sync()
    assert synced == [] and m.syncs == 0
    m._destroy()
