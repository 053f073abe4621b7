"""Test hooks of the chaos tool's faults of the disk and the clock, off unless the node's config
has them in `[testing]`.

`fsync_eio = true`: the chaos tool's `fsync-eio` fault makes the node's *next* journal sync fail
with EIO, the way a failing disk reports a lost write (the node must then neither retry nor
acknowledge, and exit: node/raft/journal.py StorageFailure). It asks by creating the file
`FAIL_NEXT_SYNC` in the node's data dir; the node's journal checks for it before each sync
(a stat per sync, only with the hook on), removes it, and fails that sync without syncing. With
`sync_shadow` on as well, the harness then rolls the data dir back to the last sync that did
succeed (node/replication/sync_shadow.py restore): what a kernel that dropped the dirty pages after the
failed fsync leaves on the disk.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

FAIL_NEXT_SYNC = "fail-next-fsync"
CLOCK_STROBE = "clock-strobe"
FREE_BYTES = "disk-free-bytes"
RELEASE_SEED = "release-seed"


# `hold_seed = true`: the first leader of a new cluster proposes its configuration (version 1)
# only once the file RELEASE_SEED is in its data dir: a test sees a cluster with a leader whose
# configuration is not seeded yet (writes 503, /readyz 503) for as long as it likes.
def seed_held(data_dir) -> bool:
    return not (Path(data_dir) / RELEASE_SEED).exists()


# `clock_strobe = true`: the chaos tool's `clock-strobe` fault makes the node's idea of now jump back
# and forth rapidly (Jepsen's clock strobe), by writing "AMPLITUDE_MS PERIOD_MS" into the file
# CLOCK_STROBE in the node's data dir; while it is there the node's clock offset alternates
# between +AMPLITUDE and -AMPLITUDE every PERIOD (NodeService.strobe_loop), on top of any
# `clock_offset_ms`. Like that key it shifts what the node believes (the leader's stamps, its
# sweeps), never the system clock or Raft's monotonic timers.
def start_strobe(data_dir, amplitude_ms: int, period_ms: int) -> Path:
    path = Path(data_dir) / CLOCK_STROBE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{int(amplitude_ms)} {int(period_ms)}")
    os.replace(tmp, path)
    return path


def stop_strobe(data_dir):
    try:
        os.unlink(Path(data_dir) / CLOCK_STROBE)
    except OSError:
        pass


def read_strobe(data_dir) -> tuple[int, int] | None:
    """(amplitude ms, period ms) while the strobe is on, else None."""
    try:
        a, p = (Path(data_dir) / CLOCK_STROBE).read_text().split()
        return max(0, int(a)), max(1, int(p))
    except (OSError, ValueError):
        return None


# `free_space_file = true`: where the chaos tool cannot make a small filesystem per node (not
# root), its `disk-full` fault tells the node how much space its data disk has instead: while the
# file FREE_BYTES in the data dir holds a number, the node takes it as its free space (the
# reserve's refusals, the hand-over and the resumption are then what is tested, not ENOSPC).
def set_free(data_dir, free_bytes: int):
    path = Path(data_dir) / FREE_BYTES
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(int(free_bytes)))
    os.replace(tmp, path)


def clear_free(data_dir):
    try:
        os.unlink(Path(data_dir) / FREE_BYTES)
    except OSError:
        pass


def read_free(data_dir) -> int | None:
    try:
        return int((Path(data_dir) / FREE_BYTES).read_text())
    except (OSError, ValueError):
        return None


def arm(data_dir) -> Path:
    """The harness side: make the node's next journal sync fail."""
    path = Path(data_dir) / FAIL_NEXT_SYNC
    path.write_bytes(b"")
    return path


class FailingSync:
    """A journal observer (node/raft/journal.py FileJournal) whose beforeSync fails on demand."""

    def __init__(self, data_dir):
        self.trigger = str(Path(data_dir) / FAIL_NEXT_SYNC)
        self.failed = 0

    def attach(self, journal, file):
        pass

    def beforeWrite(self, offset):
        pass

    def beforeSync(self):
        if os.path.exists(self.trigger):
            try:
                os.unlink(self.trigger)
            except OSError:
                pass
            self.failed += 1
            raise OSError(errno.EIO, "Input/output error (raftq test hook: [testing] fsync_eio)")

    def durable(self):
        pass


class Observers:
    """Several journal observers as one, called in order."""

    def __init__(self, observers):
        self.observers = list(observers)

    def attach(self, journal, file):
        for o in self.observers:
            o.attach(journal, file)

    def beforeWrite(self, offset):
        for o in self.observers:
            o.beforeWrite(offset)

    def beforeSync(self):
        for o in self.observers:
            o.beforeSync()

    def durable(self):
        for o in self.observers:
            o.durable()


def observer_of(observers: list):
    """None, the one observer, or all of them as one."""
    if not observers:
        return None
    if len(observers) == 1:
        return observers[0]
    return Observers(observers)
