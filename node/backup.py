"""Online backup: a consistent copy of one node's state while the cluster serves, and the file
format `raftq restore` reads back.

A backup is taken on the Raft tick thread between two ticks, where the state is exactly that of
the last applied entry (`Replica.fork_backup`): the node forks, and the child, holding a
copy-on-write image of that instant, writes the state as builtins while the parent goes on
serving. Nothing is copied in the node itself and no lock is held while the file is written, so
a backup of a million jobs costs the node a fork (page tables), not seconds of stalled applies.

The file (`raftq backup --out FILE`):

    RAFTQ-BACKUP 1\\n
    {header: format, version, index, term, digest, node, taken_at_ms, raftq, body_bytes, body_sha256}\\n
    body: gzip (level 1) of the builtins-only pickle of {"machine": QueueMachine.to_builtins()}

`index` and `term` are the source node's last applied entry's index and the term it was in;
`digest` is the state digest at that index (the one `GET /v1/cluster` shows), so a restored
cluster proves it holds exactly the backup. The checksum covers the body; the header is JSON so
that a person (and `raftq restore --check`) can read it without unpacking anything.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pickle

MAGIC = b"RAFTQ-BACKUP 1\n"
FORMAT = "raftq-backup"
VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
COMPRESSION_LEVEL = 1       # as raft.dump: level 9 costs ~1.7x the CPU for ~1 % less


class BackupError(Exception):
    """A backup file that cannot be trusted: what is wrong with it, for the operator."""


# ---------------------------------------------------------------------------- builtins only
class _BuiltinsPickler(pickle.Pickler):
    def reducer_override(self, obj):
        raise pickle.PicklingError(f"not a builtin: {type(obj).__module__}.{type(obj).__qualname__}")


class _BuiltinsUnpickler(pickle.Unpickler):
    # A backup file comes from outside the process: it must not be able to run code.
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing the global {module}.{name}: a backup holds builtins only")


class _HashingWriter(io.RawIOBase):
    """A file that hashes and counts what is written through it."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def writable(self):
        return True

    def write(self, b):
        self.sha.update(b)
        self.size += len(b)
        return self.f.write(b)


# ---------------------------------------------------------------------------- writing (child)
def write_body(machine, path: str) -> dict:
    """Write the state's body to `path` (synced) and return the header fields it fixes. Runs in
    the forked child: no logging (another thread may have held its lock at the fork)."""
    with open(path, "wb") as f:
        out = _HashingWriter(f)
        with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=COMPRESSION_LEVEL, mtime=0) as g:
            _BuiltinsPickler(g, 5).dump({"machine": machine.to_builtins()})
        f.flush()
        os.fsync(f.fileno())
    return {"digest": machine.digest(), "body_bytes": out.size, "body_sha256": out.sha.hexdigest()}


def header_line(fields: dict) -> bytes:
    return json.dumps({"format": FORMAT, "version": VERSION, **fields}, sort_keys=True).encode() + b"\n"


# ---------------------------------------------------------------------------- reading
def read_header(f) -> dict:
    """The header of a backup file open for reading (positioned at the body after it)."""
    magic = f.read(len(MAGIC))
    if magic != MAGIC:
        raise BackupError("not a raftq backup (it does not start with 'RAFTQ-BACKUP 1')")
    line = f.readline(MAX_HEADER_BYTES + 1)
    if not line.endswith(b"\n"):
        raise BackupError("the header is cut short or longer than 64 KiB")
    try:
        header = json.loads(line)
    except ValueError as e:
        raise BackupError(f"the header is not JSON: {e}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BackupError("the header does not name the raftq-backup format")
    if header.get("version") != VERSION:
        raise BackupError(f"backup format version {header.get('version')!r}; this raftq reads version {VERSION}")
    for key, kind in (("index", int), ("term", int), ("digest", str), ("body_bytes", int), ("body_sha256", str)):
        if type(header.get(key)) is not kind:
            raise BackupError(f"the header has no valid {key!r}")
    return header


def verify(path) -> dict:
    """Check a backup file end to end (header, length, checksum); its header."""
    with open(path, "rb") as f:
        header = read_header(f)
        sha, size = hashlib.sha256(), 0
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
    if size != header["body_bytes"]:
        raise BackupError(f"the body is {size} bytes, the header says {header['body_bytes']}: the file is cut short"
                          if size < header["body_bytes"] else
                          f"the body is {size} bytes, the header says {header['body_bytes']}")
    if sha.hexdigest() != header["body_sha256"]:
        raise BackupError("the body fails its checksum (sha256): the file is damaged")
    return header


def load(path) -> tuple[dict, dict]:
    """(header, machine builtins) of a verified backup file."""
    header = verify(path)
    with open(path, "rb") as f:
        read_header(f)
        try:
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                doc = _BuiltinsUnpickler(g).load()
        except (OSError, EOFError, pickle.UnpicklingError, ValueError) as e:
            raise BackupError(f"the body cannot be read: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("machine"), dict):
        raise BackupError("the body holds no machine state")
    return header, doc["machine"]


# ---------------------------------------------------------------------------- taking (node)
class Busy(Exception):
    """Another backup is being taken on this node."""


class Backups:
    """The node's side of `GET /v1/backup`: one backup at a time (each is a forked child with a
    copy-on-write image of the whole state, and a file of the state's size in the data dir);
    files are removed once sent, and at start-up if a node died while sending one."""

    def __init__(self, replica, data_dir, node_id: str):
        self.replica = replica
        self.dir = os.path.join(str(data_dir), "backups")
        self.node_id = node_id
        self.running = False
        self.taken = 0                  # /metrics
        self.failed = 0
        if os.path.isdir(self.dir):
            for name in os.listdir(self.dir):
                try:
                    os.unlink(os.path.join(self.dir, name))
                except OSError:
                    pass

    async def take(self, loop, wall_ms: int) -> tuple[bytes, str]:
        """(MAGIC + header line, body file path); the caller streams them and calls done(path)."""
        if self.running:
            raise Busy()
        self.running = True
        try:
            os.makedirs(self.dir, exist_ok=True)
            path = os.path.join(self.dir, f"backup-{os.getpid()}-{self.taken + self.failed}.body")
            import asyncio
            pid, index, term = await asyncio.wrap_future(self.replica.fork_backup(path))
            _, status = await loop.run_in_executor(None, os.waitpid, pid, 0)
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                raise OSError(f"the backup child exited with {code} (see the node's stderr)")
            with open(path + ".json", "rb") as f:
                fields = json.load(f)
            os.unlink(path + ".json")
            from .. import __version__
            header = MAGIC + header_line({**fields, "index": index, "term": term, "node": self.node_id,
                                          "taken_at_ms": wall_ms, "raftq": __version__})
            self.taken += 1
            return header, path
        except BaseException:
            self.failed += 1
            self.running = False
            self._remove(path if "path" in locals() else None)
            raise

    def done(self, path: str):
        self.running = False
        self._remove(path)

    @staticmethod
    def _remove(path):
        for p in (path, path and path + ".json"):
            if p:
                try:
                    os.unlink(p)
                except OSError:
                    pass


def child_write(machine, path: str) -> int:
    """In the forked child: write the body and its fields; the exit code."""
    try:
        fields = write_body(machine, path)
        with open(path + ".json", "w") as f:
            json.dump(fields, f)
        return 0
    except BaseException as e:         # noqa: BLE001 - the child must exit, whatever happened
        try:
            os.write(2, f"raftq backup child: {e!r}\n".encode())
        except OSError:
            pass
        return 1
