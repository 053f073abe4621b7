"""Damage to a stopped node's data dir, for the chaos tool's disk faults and the tests: bit flips in
the journal, the snapshot or the meta file, a journal cut at a random offset, a rollback to an
older copy of the whole directory. Harness side: it reads the files itself (the layout of
node/replication/sync_shadow.py, which a test checks against the journal's), never with the node's code.

Every damage lands where it matters: a flip in the journal hits the live part of the file (its
end marker or a record below it), never the zero-filled space past the end, and a cut is below
the end marker; so the node must find it when it starts (the checker's `disk_damage_found`).
"""
from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
from pathlib import Path

from ...node.replication import sync_shadow

JOURNAL = sync_shadow.JOURNAL
META = sync_shadow.META
DUMP = sync_shadow.DUMP


def journal_layout(path) -> dict | None:
    """The live parts of a journal file: its end marker's bytes and the records' bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(sync_shadow.FIRST_RECORD_OFFSET)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    if len(head) < sync_shadow.LEGACY_FIRST_RECORD_OFFSET:
        return None
    fmt = struct.unpack_from("<I", head, sync_shadow.FORMAT_VERSION_OFFSET)[0]
    end = struct.unpack_from("<I", head, sync_shadow.LAST_RECORD_OFFSET_OFFSET)[0]
    first = sync_shadow.FIRST_RECORD_OFFSET if fmt == 2 else sync_shadow.LEGACY_FIRST_RECORD_OFFSET
    marker = (sync_shadow.LAST_RECORD_OFFSET_OFFSET, sync_shadow.LAST_RECORD_OFFSET_OFFSET + (8 if fmt == 2 else 4))
    return {"format": fmt, "marker": marker, "first": first, "end": min(end, size), "size": size}


def flip(path: Path, offsets: list[int], rng: random.Random) -> list[tuple[int, int]]:
    """Flip one random bit at each offset; returns (offset, bit) pairs."""
    done = []
    with open(path, "r+b") as f:
        for off in offsets:
            f.seek(off)
            b = f.read(1)
            if not b:
                continue
            bit = rng.randrange(8)
            f.seek(off)
            f.write(bytes([b[0] ^ (1 << bit)]))
            done.append((off, bit))
        f.flush()
        os.fsync(f.fileno())
    return done


def bitflip(data_dir, rng: random.Random, target: str | None = None) -> dict:
    """Flip 1-8 bits in one of the node's files: the journal (most often), the snapshot or the
    meta file (`target` forces one). Returns what was done; `{"skipped": why}` when the file
    chosen has nothing to flip."""
    d = Path(data_dir)
    choices = [(JOURNAL, 0.6), (DUMP, 0.25), (META, 0.15)]
    have = [(n, w) for n, w in choices if (d / n).exists() and (d / n).stat().st_size > 0]
    if target is not None:
        have = [(n, w) for n, w in have if n == target]
    if not have:
        return {"skipped": "no file to flip bits in"}
    name = rng.choices([n for n, _ in have], weights=[w for _, w in have])[0]
    path = d / name
    n = rng.randint(1, 8)
    if name == JOURNAL:
        lay = journal_layout(path)
        if lay is None or lay["end"] <= lay["first"]:
            return {"skipped": "the journal has no records"}
        # Mostly the records; now and then the end marker.
        if rng.random() < 0.1:
            lo, hi = lay["marker"]
        else:
            lo, hi = lay["first"], lay["end"]
        offsets = [rng.randrange(lo, hi) for _ in range(n)]
    else:
        size = path.stat().st_size
        offsets = [rng.randrange(size) for _ in range(n)]
    done = flip(path, offsets, rng)
    clear_shadow_record(d)
    return {"file": name, "bits": [[o, b] for o, b in done]}


def truncate(data_dir, rng: random.Random) -> dict:
    """Cut the journal at a random offset below its end marker (a lost or torn write of data that
    was synced)."""
    d = Path(data_dir)
    path = d / JOURNAL
    lay = journal_layout(path)
    if lay is None or lay["end"] <= lay["first"]:
        return {"skipped": "the journal has no records"}
    cut = rng.randrange(lay["first"], lay["end"])
    os.truncate(path, cut)
    clear_shadow_record(d)
    return {"file": JOURNAL, "cut_at": cut, "end_marker": lay["end"], "bytes_cut": lay["end"] - cut}


def stash(data_dir, to) -> dict:
    """Copy the whole data dir aside (call with the node stopped or frozen)."""
    src, dst = Path(data_dir), Path(to)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    lay = journal_layout(dst / JOURNAL)
    return {"stashed_bytes": sum(p.stat().st_size for p in dst.iterdir() if p.is_file()),
            "journal_end": lay["end"] if lay else None}


def rollback(data_dir, stashed) -> dict:
    """Replace the data dir with the copy `stash` made (call with the node dead)."""
    d, src = Path(data_dir), Path(stashed)
    before = journal_layout(d / JOURNAL)
    empty_dir(d)                        # the directory itself may be a mount point (disk-full)
    shutil.copytree(src, d, dirs_exist_ok=True)
    shutil.rmtree(src, ignore_errors=True)
    clear_shadow_record(d)
    after = journal_layout(d / JOURNAL)
    return {"journal_end_before": before["end"] if before else None,
            "journal_end_after": after["end"] if after else None}


def empty_dir(d: Path):
    """Remove everything in directory d, but not d itself."""
    d.mkdir(parents=True, exist_ok=True)
    for p in d.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                p.unlink()
            except OSError:
                pass


def clear_shadow_record(data_dir):
    """Forget the power-loss hook's record (node/replication/sync_shadow.py) of a data dir damaged from
    outside: the next life takes what is there as durable, as after a start without the hook."""
    d = Path(data_dir)
    for p in list(d.glob(sync_shadow.RECORD + "*")) + list(d.glob(sync_shadow.DUMP_LINK_PREFIX + "*")):
        try:
            p.unlink()
        except OSError:
            pass


def journal_records(path) -> list[tuple[int, int]]:
    """(offset, size) of every record below the end marker, stopping at the first malformed one."""
    lay = journal_layout(path)
    if lay is None:
        return []
    data = Path(path).read_bytes()
    out, pos, end = [], lay["first"], lay["end"]
    while pos + 4 <= end:
        size = struct.unpack_from("<I", data, pos)[0]
        if size < 16 or pos + 8 + size > end:
            break
        out.append((pos, size + 8))
        pos += size + 8
    return out


# ---------------------------------------------------------------------------- small filesystems
FILLER = "disk-full.filler"


class SmallDisks:
    """One small ext4 filesystem per node: a sparse image file, loop-mounted on the node's data
    dir, made and removed by the harness (root only; `available()` says whether it can). `fill`
    leaves a given number of bytes free (a filler file in the data dir), `unfill` frees them
    again. Everything is unmounted and deleted by `close`."""

    def __init__(self, directory, size_bytes: int = 256 << 20):
        self.dir = Path(directory)
        self.size = size_bytes
        self.mounts: dict[str, Path] = {}

    @staticmethod
    def available() -> str | None:
        """None when loop-mounted filesystems can be made here, else why not."""
        if os.geteuid() != 0:
            return "not root"
        for tool in ("mkfs.ext4", "mount", "umount"):
            if shutil.which(tool) is None:
                return f"no {tool}"
        return None

    def mount(self, name: str, target) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        image = self.dir / f"{name}.img"
        with open(image, "wb") as f:
            f.truncate(self.size)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,nodiscard", str(image)],
                       check=True, capture_output=True)
        target = Path(target)
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(target)], check=True, capture_output=True)
        os.chmod(target, 0o700)
        self.mounts[name] = target
        return target

    def free(self, name: str) -> int:
        st = os.statvfs(self.mounts[name])
        return st.f_bavail * st.f_frsize

    def fill(self, name: str, leave_bytes: int) -> dict:
        """Leave about `leave_bytes` free on the node's filesystem (0: full, writes fail ENOSPC)."""
        target = self.mounts[name]
        filler = target / FILLER
        have = filler.stat().st_size if filler.exists() else 0
        want = max(0, have + self.free(name) - leave_bytes)
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            if want > have:
                try:
                    os.posix_fallocate(fd, 0, want)
                except OSError:
                    pass
            if leave_bytes == 0:            # the last blocks, one at a time
                os.lseek(fd, 0, os.SEEK_END)
                block = bytes(4096)
                try:
                    while True:
                        os.write(fd, block)
                except OSError:
                    pass
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"free_bytes": self.free(name), "filler_bytes": filler.stat().st_size}

    def unfill(self, name: str) -> dict:
        try:
            (self.mounts[name] / FILLER).unlink()
        except OSError:
            pass
        return {"free_bytes": self.free(name)}

    def close(self):
        for name, target in list(self.mounts.items()):
            r = subprocess.run(["umount", str(target)], capture_output=True)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(target)], capture_output=True)
            self.mounts.pop(name, None)
        shutil.rmtree(self.dir, ignore_errors=True)
