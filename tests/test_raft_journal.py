"""The Raft journal's file (node/raft/journal.py, FORK.md "Journal file" and "Checksums"): format 2,
checksummed records written into space that is already on disk (so an append's fdatasync carries
no block allocation), upstream's format 1 read and rewritten, and what opening a damaged file
finds: every torn, cut or flipped file loads as a prefix of what was written and says so."""
import os
import random
import struct

import pytest

from raftq.node.raft import journal as rj
from raftq.node.raft.journal import FIRST_RECORD_OFFSET, GROW_BYTES, JournalFile, MetaStorer


def _upstream(path):
    pj = pytest.importorskip("pysyncobj.journal")
    return pj.FileJournal(str(path))


def journal(path, durable=True):
    return rj.FileJournal(str(path), durable=durable)


def entries(n, start=1, term=1):
    """Raft log entries: consecutive indices, terms that never go down."""
    return [(os.urandom(50 + i % 300), start + i, term + i // 100) for i in range(n)]


def loaded(j):
    return [tuple(j[i]) for i in range(len(j))]


def write(path, es, durable=True):
    j = journal(path, durable)
    for e in es:
        j.add(*e)
    j._destroy()


def end_marker(path):
    with open(path, "rb") as f:
        f.seek(rj.LAST_RECORD_OFFSET_OFFSET)
        return struct.unpack("<I", f.read(4))[0]


def kinds(j):
    return [f["what"] for f in j.findings]


@pytest.mark.parametrize("durable", [True, False])
def test_round_trip_with_a_conflicting_tail_rewritten(tmp_path, durable):
    path = tmp_path / "raft.journal"
    j = journal(path, durable)
    written = entries(500)
    for e in written:
        j.add(*e)
    j.deleteEntriesFrom(450)            # a conflicting tail dropped, then rewritten
    rewritten = entries(20, start=451, term=9)
    for e in rewritten:
        j.add(*e)
    j._destroy()
    back = journal(path)
    assert loaded(back) == written[:450] + rewritten and back.findings == []
    back._destroy()


def test_reads_pysyncobj_format_and_rewrites_it_as_format_2(tmp_path):
    """A journal of upstream's format (release 0.1.0's) is read and rewritten as format 2 when
    opened, through a new file renamed into place; what it held is kept, and a later open reads
    the new format."""
    path = tmp_path / "raft.journal"
    up = _upstream(path)
    written = entries(300)
    for e in written:
        up.add(*e)
    up.deleteEntriesFrom(250)
    rewritten = entries(10, start=251, term=9)
    for e in rewritten:
        up.add(*e)
    up._destroy()
    with open(path, "rb") as f:
        assert struct.unpack_from("<I", f.read(40), 32)[0] == 1
    j = journal(path)
    assert loaded(j) == written[:250] + rewritten and j.findings == [] and j.upgradedFrom == 1
    j.add(b"after", 261, 9)
    j._destroy()
    with open(path, "rb") as f:
        assert struct.unpack_from("<I", f.read(40), 32)[0] == 2
    assert not (tmp_path / "raft.journal.upgrade.tmp").exists()
    back = journal(path)
    assert loaded(back) == written[:250] + rewritten + [(b"after", 261, 9)] and back.upgradedFrom is None
    back._destroy()


def test_space_ahead_of_the_last_write_is_written_not_sparse(tmp_path):
    path = tmp_path / "raft.journal"
    j = journal(path)
    big = os.urandom(300_000)
    for i in range(20):                 # 6 MB: past the first zero-filled region several times
        j.add(big, i + 1, 1)
    j._destroy()
    st = os.stat(path)
    written_end = FIRST_RECORD_OFFSET + 20 * (300_000 + 8 + 20)
    assert written_end < st.st_size <= written_end + GROW_BYTES + (1 << 20)
    # Every byte up to the end is a written block: no hole for an append to allocate into.
    # (pysyncobj's mmap file is grown with ftruncate and fails this.)
    assert st.st_blocks * 512 >= st.st_size
    assert os.lseek(os.open(path, os.O_RDONLY), 0, os.SEEK_HOLE) == st.st_size


def test_compaction_rewrites_from_the_start_without_growing(tmp_path):
    path = tmp_path / "raft.journal"
    j = journal(path)
    for e in entries(2000):
        j.add(*e)
    size = os.stat(path).st_size
    j.deleteEntriesTo(1900)             # log compaction: clear, then the kept entries again
    kept = loaded(j)
    for e in entries(100, start=2001, term=30):
        j.add(*e)
    j._destroy()
    assert os.stat(path).st_size == size
    back = journal(path)
    assert loaded(back)[:100] == kept and back[len(back) - 1][1] == 2100 and back.findings == []
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
    with nothing new, none in memory durability (not even for the zero fill)."""
    synced = []
    monkeypatch.setattr(rj, "datasync", lambda fd: synced.append(fd))
    j = journal(tmp_path / "raft.journal")
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
    m = journal(tmp_path / "memory.journal", durable=False)
    m.add(os.urandom(3 * GROW_BYTES), 1, 1)         # past the zero-filled region
    m.sync()
    m._destroy()
    assert synced == [] and m.syncs == 0


# ---------------------------------------------------------------------------- damage
def test_a_torn_tail_is_cut_at_the_last_good_entry(tmp_path):
    """What a crash in the middle of an append leaves (the end marker already moved, the last
    record only partly on disk): the record is cut, the file's end moved back, and it is said."""
    path = tmp_path / "raft.journal"
    written = entries(50)
    write(path, written)
    end = end_marker(path)
    with open(path, "r+b") as f:        # the last record's second half never reached the disk
        f.seek(end - 40)
        f.write(bytes(40))
    j = journal(path)
    assert loaded(j) == written[:-1]
    assert kinds(j) == ["journal_torn_tail"] and j.findings[0]["last_good_index"] == 49
    j.add(b"next", 50, 1)
    j._destroy()
    back = journal(path)
    assert loaded(back) == written[:-1] + [(b"next", 50, 1)] and back.findings == []
    back._destroy()


def test_a_corrupted_entry_in_the_middle_is_told_from_a_torn_tail(tmp_path):
    path = tmp_path / "raft.journal"
    written = entries(80)
    write(path, written)
    j = journal(path)
    j._destroy()
    offsets = j.recordOffsets
    with open(path, "r+b") as f:        # one bit of entry 31's command
        f.seek(offsets[30] + 30)
        b = f.read(1)
        f.seek(offsets[30] + 30)
        f.write(bytes([b[0] ^ 0x10]))
    j = journal(path)
    assert loaded(j) == written[:30] and kinds(j) == ["journal_corrupt_entry"]
    j._destroy()


def test_a_damaged_size_field_does_not_hide_the_entries_after_it(tmp_path):
    path = tmp_path / "raft.journal"
    written = entries(40)
    write(path, written)
    j = journal(path)
    j._destroy()
    off = j.recordOffsets[10]
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(struct.pack("<I", 7))   # entry 11's leading size
    j = journal(path)
    assert loaded(j) == written[:10] and kinds(j) == ["journal_corrupt_entry"]
    j._destroy()


@pytest.mark.parametrize("short", [False, True])
def test_a_file_cut_below_its_end_marker_is_a_truncation(tmp_path, short):
    # short: under 1 KB (a journal just compacted), which opening zero-fills to its initial
    # size; the cut must still be told from a torn tail (CI once saw it reported as one).
    path = tmp_path / "raft.journal"
    written, keep = ([(b"x" * 40, i + 1, 1) for i in range(8)], 5) if short else (entries(60), 20)
    write(path, written)
    j = journal(path)
    j._destroy()
    if short:
        assert os.path.getsize(path) >= 1024 and end_marker(path) < 1024
    cut = j.recordOffsets[keep] + (3 if short else 7)
    os.truncate(path, cut)
    j = journal(path)
    assert loaded(j) == written[:keep] and kinds(j) == ["journal_truncated"]
    assert j.findings[0]["file_size"] == cut
    j._destroy()


def test_an_end_marker_that_fails_its_check_keeps_the_valid_entries(tmp_path):
    path = tmp_path / "raft.journal"
    written = entries(30)
    write(path, written)
    with open(path, "r+b") as f:
        f.seek(rj.LAST_RECORD_OFFSET_OFFSET + 1)
        b = f.read(1)
        f.seek(rj.LAST_RECORD_OFFSET_OFFSET + 1)
        f.write(bytes([b[0] ^ 1]))
    j = journal(path)
    assert loaded(j) == written and kinds(j) == ["journal_end_marker"]
    j._destroy()
    back = journal(path)                # the marker was written again
    assert loaded(back) == written and back.findings == []
    back._destroy()


def test_a_file_that_is_not_a_journal_is_moved_aside(tmp_path):
    path = tmp_path / "raft.journal"
    write(path, entries(10))
    with open(path, "r+b") as f:
        f.write(b"garbage!")
    j = journal(path)
    assert len(j) == 0 and kinds(j) == ["journal_header"]
    assert (tmp_path / "raft.journal.damaged").read_bytes()[:8] == b"garbage!"
    j._destroy()


@pytest.mark.parametrize("seed", range(12))
def test_any_cut_or_flip_loads_a_prefix_of_what_was_written_and_is_found(tmp_path, seed):
    """Random damage anywhere in the live part of the file (the end marker and the records): a
    cut at any offset, or 1-8 flipped bits. The journal then holds a prefix of the entries
    written (never an entry that was not written), and says it found something."""
    rng = random.Random(seed)
    path = tmp_path / "raft.journal"
    written = [(os.urandom(rng.randint(1, 3000)), i + 1, 1 + i // 7) for i in range(rng.randint(5, 120))]
    write(path, written)
    end = end_marker(path)
    if seed % 2:
        os.truncate(path, rng.randrange(FIRST_RECORD_OFFSET, end))
    else:
        data = bytearray(path.read_bytes())
        live = list(range(rj.LAST_RECORD_OFFSET_OFFSET, rj.LAST_RECORD_OFFSET_OFFSET + 8)) + \
            list(range(FIRST_RECORD_OFFSET, end))
        for _ in range(rng.randint(1, 8)):
            data[rng.choice(live)] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
    j = journal(path)
    got = loaded(j)
    assert got == written[:len(got)]
    assert j.findings, "damage that went unnoticed"
    j._destroy()


# ---------------------------------------------------------------------------- the meta file
def test_the_meta_file_is_checksummed_and_the_old_one_still_read(tmp_path):
    path = tmp_path / "raft.journal.meta"
    m = MetaStorer(str(path))
    m.storeMeta({"currentTerm": 7, "votedForNodeId": "a", "raftCommitIndex": 30})
    assert MetaStorer(str(path)).getMeta()["currentTerm"] == 7
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 4
    path.write_bytes(bytes(raw))
    m = MetaStorer(str(path))
    assert m.getMeta() == {} and "checksum" in m.damaged
    import pickle
    path.write_bytes(pickle.dumps({"currentTerm": 2, "votedForNodeId": None, "raftCommitIndex": 5}, 2))
    m = MetaStorer(str(path))
    assert m.getMeta()["currentTerm"] == 2 and m.legacy and m.damaged is None


def test_an_empty_file_is_a_journal_begun_again_not_damage(tmp_path):
    """A crash between creating the file and writing its header leaves 0 bytes: nothing was
    ever in it, and reporting it would make a fresh node's log untrusted for nothing."""
    path = tmp_path / "raft.journal"
    path.write_bytes(b"")
    j = journal(path)
    assert len(j) == 0 and j.findings == []
    j.add(b"x", 1, 1)
    j._destroy()
    back = journal(path)
    assert loaded(back) == [(b"x", 1, 1)] and back.findings == []
    back._destroy()


@pytest.mark.parametrize("durable", [True, False])
def test_only_the_newest_commands_stay_in_memory_and_older_ones_are_read_back(tmp_path, durable):
    path = tmp_path / "raft.journal"
    es = entries(400)
    j = rj.FileJournal(str(path), durable=durable, hotBytes=4000)
    for e in es:
        j.add(*e)
    assert j.heldBytes <= 4000 + 350 and j.heldBytes < sum(len(e[0]) for e in es) / 10
    assert loaded(j) == es                      # one at a time, the cold ones from the file
    assert [tuple(e) for e in j[10:20]] == es[10:20] and [tuple(e) for e in j[-5:]] == es[-5:]
    assert tuple(j[-1]) == es[-1] and tuple(j[0]) == es[0]
    # A conflicting tail replaced (a new leader's entries), then compaction (the prefix dropped).
    j.deleteEntriesFrom(300)
    more = entries(50, start=301, term=9)
    for e in more:
        j.add(*e)
    assert loaded(j) == es[:300] + more and j.heldBytes <= 4000 + 350
    j.deleteEntriesTo(100)
    assert loaded(j) == es[100:300] + more
    j._destroy()
    # Opened again: what was written, and still only the newest held.
    k = rj.FileJournal(str(path), durable=durable, hotBytes=4000)
    assert loaded(k) == es[100:300] + more and k.heldBytes <= 4000 + 350 and not k.findings
    k._destroy()


def test_a_cold_entry_the_disk_changed_after_opening_stops_the_node(tmp_path):
    path = tmp_path / "raft.journal"
    es = entries(100)
    j = rj.FileJournal(str(path), hotBytes=1000)
    for e in es:
        j.add(*e)
    assert tuple(j[5]) == es[5]
    with open(path, "r+b") as f:                # one bit of entry 5's command, at rest
        data = f.read()
        at = data.find(es[5][0])
        f.seek(at)
        f.write(bytes([data[at] ^ 0x01]))
    with pytest.raises(rj.StorageFailure, match="read back"):
        j[5]
    assert tuple(j[6]) == es[6] and tuple(j[-1]) == es[-1]      # the rest is still served
    j._destroy()
    k = rj.FileJournal(str(path))               # and opening finds it, keeping the prefix
    assert loaded(k) == es[:5] and k.findings and k.findings[0]["what"] == "journal_corrupt_entry"
    k._destroy()
