"""Power-loss simulation without root: what a disk honouring only fsync would hold.

A test hook, off unless the node's config says `[testing] sync_shadow = true` (the chaos harness sets it for
its `power-loss` fault); unset, the node only pays an `is None` test per tick and per sync.

kill -9 loses nothing in either durability mode: the page cache outlives the process. A power
cut loses whatever the kernel had not written back. To show that without root (no LazyFS, no
dm-flakey), the node records, at every *durable point*, what its data dir would hold on a disk
that keeps only what was synced; after SIGKILL of every node the harness rolls each data dir
back to that record (`restore`) and restarts the nodes.

Durable points of the journal
* `fsync` mode: every real journal sync (the journal's `sync()`: a follower before it acknowledges
  entries, the leader after sending them and before it counts itself). It counts from when its
  record is written, after the sync returned and before anything acts on the sync, so a cut in
  between drops entries that nobody has counted yet (as a cut during the sync would).
* `memory` mode: raftq never syncs the journal, so the kernel's dirty-page writeback is
  simulated: every `[testing] sync_shadow_writeback_s` seconds (default 2, first one at a random
  phase; Linux writes dirty pages back 5-30 s after they were dirtied) the journal and the
  snapshot become durable at once. The snapshot (`raft.dump`, which pysyncobj replaces by
  rename) is kept through a hard link and put back by `restore`.
The meta file (term, vote, commit index) is synced whenever it is written, in both modes
(node/raft/journal.py MetaStorer; memory mode writes it only when term or vote change), and
fsync mode syncs snapshots before they replace the old one: neither is rolled back there.

The journal (node/raft/journal.py FileJournal, one file: a 48-byte header holding the end marker
LAST_RECORD_OFFSET and its CRC at byte 36, then length-framed, checksummed records; release
0.1.0's format 1 had a 40-byte header and no checksums) is rewritten *in place*: appends move the
header's offset forward, `deleteEntriesFrom` (a follower dropping a conflicting tail) moves it
back and later appends overwrite the old bytes, `clear` (a snapshot received from the leader)
and `deleteEntriesTo` (log compaction: clear, then append the kept entries again) rewrite the
file from its first record. The journal tells its observer (this class, passed in as
`SyncObjConf.journalObserver`) before every write to the file. The durable image is "the file's bytes below `preserved_from`, then the saved
`tail` bytes up to `offset`, with the header saying `offset`": when a write is about to
overwrite durable bytes (offset < preserved_from), those bytes are first saved to a tail file
(a real disk still holds them: the overwrite is only in the page cache) and the record names
it. At the next durable point the image is simply the current file again.

The record, `raft.journal.synced` in the data dir, is JSON written by write-temp + rename (so a
SIGKILL never leaves half a record; it is not fsynced itself: this is a simulation on a machine
that does not lose power). Tail files and snapshot links are written before the record that
names them and removed after the record that stops naming them.

Not simulated: torn or reordered writeback. A real cut may keep any subset of the dirty pages
(some later pages, or half of an in-place compaction); here exactly nothing after the last
durable point survives, which is one outcome a real disk may produce, and the one that loses
the most. Memory mode's writeback is one instant for the whole data dir, not per page or per
file. Temporary files are left as they are (pysyncobj rewrites them before reading them).
"""
from __future__ import annotations

import json
import os
import random
import struct
import time
import zlib
from pathlib import Path

# The journal file's layout (node/raft/journal.py, format 2): name (24 bytes), version (8),
# format version (4), LAST_RECORD_OFFSET (4) and its crc32 (4), 4 reserved, then records of
# size (4), crc (4), index (8), term (8), command, size (4). Format 1 (upstream pysyncobj's,
# raftq 0.1.0's; the node rewrites it as format 2 when it opens it): the header ends after
# LAST_RECORD_OFFSET and a record is size, index, term, command, size. The harness side below
# reads the file itself, without the node's code; a test checks these against the journal's.
FORMAT_VERSION_OFFSET = 24 + 8
LAST_RECORD_OFFSET_OFFSET = 24 + 8 + 4
FIRST_RECORD_OFFSET = LAST_RECORD_OFFSET_OFFSET + 4 + 8
LEGACY_FIRST_RECORD_OFFSET = LAST_RECORD_OFFSET_OFFSET + 4
DEFAULT_WRITEBACK_S = 2.0
JOURNAL = "raft.journal"
META = "raft.journal.meta"
DUMP = "raft.dump"
RECORD = "raft.journal.synced"
TAIL_PREFIX = "raft.journal.synced.tail."
DUMP_LINK_PREFIX = "raft.dump.synced."


def _write_atomic(path: Path, data: bytes):
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _header_offset(read) -> int:
    return struct.unpack("<I", read(LAST_RECORD_OFFSET_OFFSET, 4))[0]


def end_marker(offset: int, fmt: int = 2) -> bytes:
    """The bytes written at LAST_RECORD_OFFSET_OFFSET for an end at `offset`."""
    packed = struct.pack("<I", offset)
    return packed if fmt == 1 else packed + struct.pack("<I", zlib.crc32(packed))


def journal_format(read) -> int:
    return struct.unpack("<I", read(FORMAT_VERSION_OFFSET, 4))[0]


def read_record(data_dir) -> dict | None:
    try:
        return json.loads((Path(data_dir) / RECORD).read_bytes())
    except (OSError, ValueError):
        return None


class SyncShadow:
    """The node side: the journal's observer (node/raft/journal.py FileJournal: attached as the
    journal is opened, before its first write, told before every write to the file and after
    every sync), and ticked by the Replica (memory mode's writeback). All calls come from the
    Raft tick thread (the journal is only written there), except `attach`, which runs before it
    starts."""

    def __init__(self, data_dir, durability: str, writeback: float | None = None):
        self.dir = Path(data_dir)
        self.mode = durability
        self.writeback_s = (writeback if writeback is not None else DEFAULT_WRITEBACK_S) if durability == "memory" else None
        self.file = None                 # the journal's file (read(offset, size))
        self.journal = None
        self.rec: dict = {}
        self.tail = b""                  # durable bytes [preserved_from, offset) overwritten in the page cache
        # Each machine's flusher runs on its own schedule: the first writeback at a random phase
        # (nodes restarted together after a cut would otherwise write back in lockstep).
        self.next_writeback = time.monotonic() + random.uniform(0, self.writeback_s or 0)
        self.durable_points = 0

    # ---------------------------------------------------------------- attaching
    def attach(self, journal, file):
        """Called by the FileJournal once it has read its file, before its first write."""
        self.journal = journal
        self.file = file
        rec = read_record(self.dir)
        if rec is not None and rec.get("tail"):
            try:
                self.tail = (self.dir / rec["tail"]).read_bytes()
            except OSError:
                rec = None
        if rec is None:
            # No record: a first start, or a data dir written without the hook. What is there
            # now is taken as durable (it is whatever an earlier life left on the disk).
            self.rec = {"v": 1, "gen": 0}
            self.durable(initial=True)
        else:
            self.rec = rec

    # ---------------------------------------------------------------- events
    def beforeSync(self):
        """Before every journal sync (the observer API); nothing to do here."""

    def beforeWrite(self, offset: int):
        """The journal is about to write to its file at `offset` (the journal's observer API)."""
        if FIRST_RECORD_OFFSET <= offset < self.rec["preserved_from"]:
            self._preserve(offset)

    def _preserve(self, offset: int):
        """Durable bytes from `offset` are about to be overwritten in the page cache: the disk
        still has them, so keep them (a conflict truncation, a snapshot install, compaction)."""
        rec = self.rec
        lo = rec["preserved_from"]
        self.tail = self.file.read(offset, lo - offset) + self.tail
        gen = rec["gen"] + 1
        name = f"{TAIL_PREFIX}{gen}"
        _write_atomic(self.dir / name, self.tail)
        old = rec.get("tail")
        self.rec = dict(rec, gen=gen, preserved_from=offset, tail=name)
        _write_atomic(self.dir / RECORD, json.dumps(self.rec).encode())
        if old:
            _unlink(self.dir / old)

    def tick(self):
        """Memory mode: the simulated kernel writeback (called every pysyncobj tick)."""
        if self.writeback_s is None:
            return
        now = time.monotonic()
        if now >= self.next_writeback:
            self.next_writeback = now + self.writeback_s
            self.durable()

    def durable(self, initial: bool = False):
        """Everything in the data dir is on disk now (fsync mode: the journal was just synced;
        memory mode: a simulated writeback)."""
        old = self.rec
        gen = old.get("gen", 0) + 1
        offset = _header_offset(self.file.read)
        rec = {"v": 1, "gen": gen, "mode": self.mode, "wall_ms": time.time_ns() // 1_000_000,
               "offset": offset, "preserved_from": offset, "tail": None, "initial": initial}
        try:
            rec["last_index"] = self.journal[-1][1] if len(self.journal) else None
        except Exception:
            rec["last_index"] = None
        if self.mode == "memory":
            rec["dump"] = self._link_dump(gen, old)
        _write_atomic(self.dir / RECORD, json.dumps(rec).encode())
        self.rec, self.tail = rec, b""
        self.durable_points += 1
        if old.get("tail"):
            _unlink(self.dir / old["tail"])
        if old.get("dump") and old["dump"] != rec.get("dump"):
            _unlink(self.dir / old["dump"])

    def _link_dump(self, gen: int, old: dict):
        dump = self.dir / DUMP
        try:
            st = os.stat(dump)
        except OSError:
            return None
        prev = old.get("dump")
        if prev:
            try:
                if os.path.samestat(st, os.stat(self.dir / prev)):
                    return prev
            except OSError:
                pass
        name = f"{DUMP_LINK_PREFIX}{gen}"
        try:
            _unlink(self.dir / name)
            os.link(dump, self.dir / name)
        except OSError:
            return None
        return name


def _unlink(path: Path):
    try:
        os.unlink(path)
    except OSError:
        pass


# ---------------------------------------------------------------------------- the harness side
def read_journal(path) -> dict:
    """The header offset and the entries (index, term, crc of the command) of a journal file,
    stopping at the first malformed record."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return {"offset": None, "entries": []}
    if len(data) < LEGACY_FIRST_RECORD_OFFSET:
        return {"offset": None, "entries": []}
    fmt = journal_format(lambda o, n: data[o:o + n])
    end = _header_offset(lambda o, n: data[o:o + n])
    skip = 4 if fmt == 2 else 0                # the record's crc
    entries, pos = [], FIRST_RECORD_OFFSET if fmt == 2 else LEGACY_FIRST_RECORD_OFFSET
    while pos + 4 <= min(end, len(data)):
        size = struct.unpack("<I", data[pos:pos + 4])[0]
        if size < 16 + skip or pos + 8 + size > min(end, len(data)):
            break
        body = data[pos + 4 + skip:pos + 4 + size]
        idx, term = struct.unpack("<QQ", body[:16])
        entries.append((idx, term, zlib.crc32(body[16:])))
        pos += size + 8
    return {"offset": end, "entries": entries, "format": fmt}


def unsynced(data_dir) -> bool | None:
    """Does the node's journal hold bytes that are not durable? (None: no record.) Cheap: read
    while the node is frozen, to time a power cut."""
    d = Path(data_dir)
    rec = read_record(d)
    if rec is None:
        return None
    if rec.get("tail"):
        return True
    try:
        with open(d / JOURNAL, "rb") as f:
            f.seek(LAST_RECORD_OFFSET_OFFSET)
            offset = struct.unpack("<I", f.read(4))[0]
    except (OSError, struct.error):
        return None
    return offset != rec["offset"]


def _meta_term(raw: bytes | None):
    if not raw:
        return None
    try:
        m = _builtins_loads(raw)
        return {"term": m.get("currentTerm"), "voted_for": m.get("votedForNodeId"),
                "commit_index": m.get("raftCommitIndex")}
    except Exception:
        return None


def _builtins_loads(raw: bytes):
    """The meta file is a pickled dict of builtins: read it without accepting any global."""
    import io
    import pickle

    class Builtins(pickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError(f"refusing {module}.{name}")

    return Builtins(io.BytesIO(raw)).load()


def restore(data_dir, durability: str) -> dict:
    """Call only when every process of the node is dead: roll its data dir back to the last
    durable point. Returns what changed (for the chaos report)."""
    d = Path(data_dir)
    rec = read_record(d)
    if rec is None:
        return {"error": f"no {RECORD} in {d} (node not run with [testing] sync_shadow = true?): data dir left as it is"}
    jpath = d / JOURNAL
    before = read_journal(jpath)
    out = {"durable_wall_ms": rec.get("wall_ms"), "durable_gen": rec.get("gen"), "offset_before": before["offset"],
           "offset_after": rec["offset"], "last_index_before": before["entries"][-1][0] if before["entries"] else None}
    tail = b""
    if rec.get("tail"):
        tail = (d / rec["tail"]).read_bytes()
    lo, s = rec["preserved_from"], rec["offset"]
    if len(tail) != s - lo:
        return dict(out, error=f"tail of {len(tail)} bytes does not cover [{lo}, {s})")
    with open(jpath, "r+b") as f:
        f.seek(lo)
        f.write(tail)
        f.truncate(s)
        f.seek(LAST_RECORD_OFFSET_OFFSET)
        f.write(end_marker(s, before.get("format", 2)))
    after = read_journal(jpath)
    kept = set(after["entries"])
    had = set(before["entries"])
    out.update(
        last_index_after=after["entries"][-1][0] if after["entries"] else None,
        bytes_dropped=max(0, (before["offset"] or 0) - s),
        bytes_restored=len(tail),
        entries_dropped=sum(1 for e in before["entries"] if e not in kept),
        entries_restored=sum(1 for e in after["entries"] if e not in had),
    )
    try:
        out["meta"] = _meta_term((d / META).read_bytes())      # synced in both modes: kept
    except OSError:
        out["meta"] = None
    if durability == "memory":
        dump = d / DUMP
        link = rec.get("dump")
        if link is None:
            same = not dump.exists()
        else:
            try:
                same = os.path.samestat(os.stat(dump), os.stat(d / link))
            except OSError:
                same = False
        out["dump_rolled_back"] = not same
        if not same:
            if link is None:
                _unlink(dump)
            else:
                tmp = d / (DUMP + ".restore.tmp")
                _unlink(tmp)
                os.link(d / link, tmp)
                os.replace(tmp, dump)
    # The data dir is the durable image now: the next life starts from a clean record.
    new = dict(rec, preserved_from=s, tail=None, restored=True)
    _write_atomic(d / RECORD, json.dumps(new).encode())
    if rec.get("tail"):
        _unlink(d / rec["tail"])
    return out
