"""Online backup: a consistent copy of one node's state while the cluster serves, and the file
format `raftq restore` reads back.

A backup is taken on the Raft tick thread between two ticks, where the state is exactly that of
the last applied entry (`Replica.fork_at_tick`): the node forks, and the child, holding a
copy-on-write image of that instant, writes the state as builtins into a pipe while the parent
goes on serving and streams what comes out of the pipe to the client. Nothing is copied in the
node itself, no lock is held while the state is written and no file is written on the node, so
a backup of a million jobs costs the node a fork (page tables), not seconds of stalled applies
or a second copy of the state on its disk.

The file (`raftq backup --out FILE`):

    RAFTQ-BACKUP 1\\n
    {header: format, version, index, term, node, taken_at_ms, raftq}\\n
    body: gzip (level 1) of the builtins-only pickle of {"machine": QueueMachine.to_builtins()}
    trailer, the last TRAILER_BYTES bytes: "RAFTQ-END " {body_bytes, body_sha256, digest},
                                           padded with spaces, "\\n"

`index` and `term` are the source node's last applied entry's index and the term it was in;
`digest` is the state digest at that index (the one `GET /v1/cluster` shows), so a restored
cluster proves it holds exactly the backup. The trailer comes last because the child knows the
checksum and the digest only once it has written the body, and the body is streamed as it is
made; a file without a good trailer is one whose stream was cut.
"""
from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import pickle

from ..base.readable import readable

MAGIC = b"RAFTQ-BACKUP 1\n"
FORMAT = "raftq-backup"
VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
TRAILER_MARK = b"RAFTQ-END "
TRAILER_BYTES = 256
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
    """A file descriptor that hashes and counts what is written through it."""

    def __init__(self, fd: int):
        self.fd, self.sha, self.size = fd, hashlib.sha256(), 0

    def writable(self):
        return True

    def write(self, b):
        b = bytes(b)
        self.sha.update(b)
        self.size += len(b)
        view = memoryview(b)
        while view:
            view = view[os.write(self.fd, view):]
        return len(b)


# ---------------------------------------------------------------------------- writing (child)
def child_write(machine, fd: int) -> int:
    """In the forked child: the body and the trailer into `fd`; the exit code. No logging (another
    thread may have held its lock at the fork)."""
    try:
        out = _HashingWriter(fd)
        with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=COMPRESSION_LEVEL, mtime=0) as g:
            _BuiltinsPickler(g, 5).dump({"machine": machine.to_builtins()})
        trailer = TRAILER_MARK + json.dumps({"body_bytes": out.size, "body_sha256": out.sha.hexdigest(),
                                             "digest": machine.digest()}, sort_keys=True).encode()
        os.write(fd, trailer.ljust(TRAILER_BYTES - 1) + b"\n")
        return 0
    except BaseException as e:         # noqa: BLE001 - the child must exit, whatever happened
        try:
            os.write(2, f"raftq backup child: {e!r}\n".encode())
        except OSError:
            pass
        return 1


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
    for key, kind in (("index", int), ("term", int), ("node", str)):
        if type(header.get(key)) is not kind:
            raise BackupError(f"the header has no valid {key!r}")
    return header


def _trailer(path, body_start: int) -> dict:
    size = os.path.getsize(path)
    if size < body_start + TRAILER_BYTES:
        raise BackupError("the file is cut short (no trailer): the stream ended before the node finished it")
    with open(path, "rb") as f:
        f.seek(size - TRAILER_BYTES)
        raw = f.read(TRAILER_BYTES)
    if not raw.startswith(TRAILER_MARK) or not raw.endswith(b"\n"):
        raise BackupError("the file is cut short (no trailer): the stream ended before the node finished it")
    try:
        trailer = json.loads(raw[len(TRAILER_MARK):])
    except ValueError as e:
        raise BackupError(f"the trailer is not JSON: {e}") from None
    for key, kind in (("body_bytes", int), ("body_sha256", str), ("digest", str)):
        if type(trailer.get(key)) is not kind:
            raise BackupError(f"the trailer has no valid {key!r}")
    return trailer


def verify(path) -> dict:
    """Check a backup file end to end (header, trailer, length, checksum); header and trailer
    fields in one dict."""
    with open(path, "rb") as f:
        header = read_header(f)
        start = f.tell()
    trailer = _trailer(path, start)
    length = os.path.getsize(path) - TRAILER_BYTES - start
    if length != trailer["body_bytes"]:
        raise BackupError(f"the body is {length} bytes, the trailer says {trailer['body_bytes']}")
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = length
        while left:
            chunk = f.read(min(1 << 20, left))
            if not chunk:
                raise BackupError("the file is cut short")
            sha.update(chunk)
            left -= len(chunk)
    if sha.hexdigest() != trailer["body_sha256"]:
        raise BackupError("the body fails its checksum (sha256): the file is damaged")
    return {**header, **trailer}


def load(path) -> tuple[dict, dict]:
    """(header and trailer fields, machine builtins) of a verified backup file."""
    fields = verify(path)
    with open(path, "rb") as f:
        read_header(f)
        body = io.BytesIO(f.read(fields["body_bytes"]))
    try:
        with gzip.GzipFile(fileobj=body, mode="rb") as g:
            doc = _BuiltinsUnpickler(g).load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as e:
        raise BackupError(f"the body cannot be read: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("machine"), dict):
        raise BackupError("the body holds no machine state")
    return fields, doc["machine"]


# ---------------------------------------------------------------------------- taking (node)
class Busy(Exception):
    """Another backup is being taken on this node."""


class Backups:
    """The node's side of `GET /v1/backup`: one backup at a time (each is a forked child with a
    copy-on-write image of the whole state, which the node's memory pays for as the parent's
    pages change while it runs)."""

    def __init__(self, service):
        self.service = service              # its replica and node id are read when a backup starts
        self.running = False
        self.taken = 0
        self.failed = 0

    async def stream(self, loop, wall_ms: int, start):
        """Fork the child, call `await start(header_bytes, index, term)` once the state's index
        is known, then yield the child's output in chunks; raises Busy or OSError before start.

        Safe to abandon at any await (the handler is cancelled when its client goes away; use
        it under `contextlib.aclosing`): the pipe's descriptors are closed only once no fork
        can still take them and no read is pending on them (a closed descriptor's number is
        reused at once, by a client's socket as likely as anything), and a child whose output
        nobody reads any more is killed and reaped before the next backup may start."""
        if self.running:
            raise Busy()
        self.running = True
        rfd, wfd = os.pipe()
        pid, whole = None, False
        try:
            def work(machine) -> int:       # in the child, which keeps wfd alone (fork_at_tick)
                return child_write(machine, wfd)
            pid, index, term = await self.service.replica.forked_at_tick(loop, work, keep_fds=(wfd,))
            os.close(wfd)
            wfd = None
            os.set_blocking(rfd, False)
            from ... import __version__
            await start(MAGIC + header_line({"index": index, "term": term, "node": self.service.settings.node_id,
                                             "taken_at_ms": wall_ms, "raftq": __version__}), index, term)
            while chunk := await _read_when_ready(loop, rfd):
                yield chunk
            whole = True
            self.taken += 1
        except BaseException:
            self.failed += 1
            raise
        finally:
            try:
                os.close(rfd)
                if wfd is not None:
                    os.close(wfd)
                if pid is not None:
                    if not whole:           # nobody reads it any more: no point finishing
                        from .replica import kill_child     # the node's side: the server extra
                        kill_child(pid)
                    await asyncio.shield(loop.run_in_executor(None, os.waitpid, pid, 0))
            finally:
                self.running = False


async def _read_when_ready(loop, fd: int) -> bytes:
    """The next chunk from the non-blocking pipe `fd` (b"" at its end), read on the loop when
    the pipe is readable: no thread holds the descriptor, so an abandoned read leaves nothing
    behind that could read from the number once it is reused."""
    while True:
        try:
            return os.read(fd, 1 << 20)
        except BlockingIOError:
            await readable(loop, fd)
