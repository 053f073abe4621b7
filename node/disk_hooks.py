"""Test hooks of the data disk, off unless the node's config has them in `[testing]`.

`fsync_eio = true`: the chaos tool's `fsync-eio` fault makes the node's *next* journal sync fail
with EIO, the way a failing disk reports a lost write (the node must then neither retry nor
acknowledge, and exit: node/raft/journal.py StorageFailure). It asks by creating the file
`FAIL_NEXT_SYNC` in the node's data dir; the node's journal checks for it before each sync
(a stat per sync, only with the hook on), removes it, and fails that sync without syncing. With
`sync_shadow` on as well, the harness then rolls the data dir back to the last sync that did
succeed (node/sync_shadow.py restore): what a kernel that dropped the dirty pages after the
failed fsync leaves on the disk.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

FAIL_NEXT_SYNC = "fail-next-fsync"


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
