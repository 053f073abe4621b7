"""A snapshot's machine in parts: its longest lists written as compressed chunks, read back one
chunk at a time while the machine is built (docs/performance.md "Snapshots at 1M").

A snapshot document loaded whole holds every job twice over while the machine is built from it
(a 23-field row per job beside the job itself), and CPython keeps the arenas the rows took as
long as any object the machine keeps (a job's strings, made by the same unpickler) sits in them:
a node restarted from a snapshot held 42-50 % more memory than before. Here the machine's
`jobs`, `dedup` and `rids` rows are written as chunks of `CHUNK_ROWS` rows, each a builtins-only
pickle compressed with zlib (level 1), and a restore decodes a chunk only when the one before it
has been built into the machine, so the rows of one chunk at a time are alive.

The replica's snapshot document is then {"machine": the builtins without those lists,
"packed": {name: [chunk, ...]}, "limits_fingerprint": ...}; a document without "packed" (every
snapshot before this format, and a backup) is read as before. Pure: no I/O; builtins only on
both sides (node/raft/pickle.py refuses any global when a chunk is read).
"""
from __future__ import annotations

import io
import zlib

from ..raft import pickle as raft_pickle

PACKED = ("jobs", "dedup", "rids")
CHUNK_ROWS = 4096
# The dedup heap's rows are written for readers older than this format (node/core/snapshot.py),
# which cannot read a packed document anyway: a packed one leaves them out.
FOR_OLDER_READERS = ("dedup_heap",)


def pack(machine: dict) -> tuple[dict, dict]:
    """(the machine's builtins without its long lists, {name: chunks}) of `to_builtins` data."""
    rest = {k: v for k, v in machine.items() if k not in PACKED and k not in FOR_OLDER_READERS}
    return rest, {name: [_chunk(rows[i:i + CHUNK_ROWS]) for i in range(0, len(rows), CHUNK_ROWS)]
                  for name, rows in ((n, machine[n]) for n in PACKED)}


def _chunk(rows: list) -> bytes:
    out = io.BytesIO()
    raft_pickle.dumpBuiltins(rows, out)
    return zlib.compress(out.getvalue(), 1)


def machine_of(doc: dict, consume: bool = False) -> dict:
    """The machine builtins of a replica's snapshot document, packed or not. `consume`: the long
    lists come back as iterators that decode a chunk at a time and let each chunk and row go
    once handed out (for `from_builtins(consume=True)`); else as lists (for a reader that looks)."""
    packed = doc.get("packed")
    if packed is None:
        return doc["machine"]
    machine = dict(doc["machine"])
    for name in PACKED:
        rows = _rows(packed[name], consume)
        machine[name] = rows if consume else list(rows)
    return machine


def _rows(chunks: list, consume: bool):
    for k in range(len(chunks)):
        chunk = chunks[k]
        if consume:
            chunks[k] = None
        rows = raft_pickle.loadsBuiltins(zlib.decompress(chunk))
        chunk = None
        for i in range(len(rows)):
            row = rows[i]
            if consume:
                rows[i] = None
            yield row
