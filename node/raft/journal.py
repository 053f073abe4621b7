import logging
import os
import mmap
import errno
import struct
import zlib

from .version import VERSION
from .pickle import to_bytes, loadsBuiltins, dumps

logger = logging.getLogger(__name__)

# raftq: fdatasync where there is one (macOS has none).
datasync = getattr(os, 'fdatasync', os.fsync)


# raftq: bytes of the newest entries' commands a FileJournal keeps in memory (the rest are read
# back from the file when asked for); SyncObjConf.journalMemoryBytes overrides it.
HOT_BYTES = 16 << 20


class StorageFailure(Exception):
    """raftq: a write or a sync of a file the node's promises depend on failed (EIO, ENOSPC, ...).

    Never retried: after a failed fsync the kernel may have dropped the dirty pages and marked
    them clean, so a second fsync can report success for data that is gone (PostgreSQL's
    "fsyncgate"). SyncObj stops ticking when one reaches it (so nothing written since the last
    good sync is ever acknowledged) and calls SyncObjConf.onStorageFailure; raftq's node exits,
    and a restart reads what the disk really holds."""

    def __init__(self, path, op, error):
        self.path = path
        self.op = op
        self.errno = getattr(error, 'errno', None)
        self.strerror = getattr(error, 'strerror', None) or str(error)
        name = errno.errorcode.get(self.errno, '?') if self.errno is not None else '?'
        Exception.__init__(self, '%s of %s failed: [Errno %s %s] %s' % (op, path, self.errno, name, self.strerror))


def fsyncDir(path):
    try:
        fd = os.open(path or '.', os.O_RDONLY)
    except OSError as e:
        raise StorageFailure(path or '.', 'open (directory)', e)
    try:
        os.fsync(fd)
    except OSError as e:
        raise StorageFailure(path or '.', 'fsync (directory)', e)
    finally:
        os.close(fd)


class Journal(object):

    def add(self, command, idx, term):
        raise NotImplementedError

    def clear(self):
        raise NotImplementedError

    def deleteEntriesFrom(self, entryFrom):
        raise NotImplementedError

    def deleteEntriesTo(self, entryTo):
        raise NotImplementedError

    def __getitem__(self, item):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError

    def _destroy(self):
        raise NotImplementedError

    def setRaftCommitIndex(self, raftCommitIndex):
        raise NotImplementedError

    def getRaftCommitIndex(self):
        raise NotImplementedError

    def setCurrentTerm(self, term, votedForNodeId):
        raise NotImplementedError

    def getCurrentTerm(self):
        raise NotImplementedError

    def getVotedForNodeId(self):
        raise NotImplementedError

    def onOneSecondTimer(self):
        pass

    def sync(self):
        """raftq: make every entry added so far durable (a no-op unless the journal is a file
        in fsync durability)."""
        pass

    @property
    def syncs(self):
        return 0

    # raftq: what the journal found wrong with its files when it read them (see FileJournal).
    @property
    def findings(self):
        return []

    def getUnverified(self):
        """raftq: why this node's log is not trusted for voting yet (a dict), or None."""
        return None

    def setUnverified(self, info):
        pass


class MemoryJournal(Journal):

    def __init__(self):
        self.__journal = []
        self.__bytesSize = 0
        self.__lastCommitIndex = 0
        self.__currentTerm = 0
        self.__votedForNodeId = None

    def add(self, command, idx, term):
        self.__journal.append((command, idx, term))

    def clear(self):
        self.__journal = []

    def deleteEntriesFrom(self, entryFrom):
        del self.__journal[entryFrom:]

    def deleteEntriesTo(self, entryTo):
        self.__journal = self.__journal[entryTo:]

    def __getitem__(self, item):
        return self.__journal[item]

    def __len__(self):
        return len(self.__journal)

    def _destroy(self):
        pass

    def setRaftCommitIndex(self, raftCommitIndex):
        pass

    def getRaftCommitIndex(self):
        return 1

    def setCurrentTerm(self, term, votedForNodeId):
        self.__currentTerm = term
        self.__votedForNodeId = votedForNodeId

    def getCurrentTerm(self):
        return self.__currentTerm

    def getVotedForNodeId(self):
        return self.__votedForNodeId


GROW_BYTES = 2 << 20        # zero-filled ahead of the write offset per step (~1 ms of writing and syncing)
_ZEROS = bytes(1 << 20)


class JournalFile(object):
    """raftq: the journal's file - upstream's ResizableFile interface (write, read, flush,
    _destroy) plus fileno(), written with pwrite into space that was filled with zeros ahead of
    time, so that syncing an append flushes data only. Used in both durabilities; `durable`
    (fsync) syncs the zero fill and flush() (memory durability never syncs the journal).

    ResizableFile keeps the journal in an mmap'd file that it grows with ftruncate: the file is
    sparse past what was written. On ext4 (delayed allocation) the first write into a hole
    allocates its blocks when the page is written back, so every fdatasync of a growing journal
    carries block allocation and commits the filesystem journal as well: it waits for the jbd2
    kernel thread, which on a busy machine waits for a CPU. Overwriting blocks that were already
    written needs no metadata, and fdatasync writes just the data. Measured on the project VM,
    one 6 KB append plus fdatasync, idle: into sparse space (mmap or pwrite) 59-67 us CPU and
    137-152 us wall; into fallocated space the same (unwritten extents are converted on first
    write, metadata again); with pwrite into zero-filled space 48 us CPU and 101-106 us wall.
    (mmap into zero-filled space was worse, 87 us and 280 us: each first store into a clean
    shared page faults.) Under the HTTP mixed benchmark, per sync on each node: 73-81 -> 46-55 us
    CPU, 775-867 -> 559-622 us wall. And the sync is fdatasync, not ResizableFile's mmap.flush(),
    which in CPython holds the GIL through the whole msync.

    Memory durability used ResizableFile until the disk checks: a store into an mmap'd page
    that the filesystem cannot allocate (a full disk) kills the process with SIGBUS, where
    pwrite returns ENOSPC, which the node reports (StorageFailure) and exits on. Every failed
    write, sync or fill raises StorageFailure naming the file.

    So the file is kept zero-filled GROW_BYTES ahead of the last write, and those zeros are
    synced when they are written (once per region: after log compaction the journal rewrites
    the file from its start, over blocks that are already there).
    """

    def __init__(self, fileName, initialSize=1024, resizeFactor=2.0, defaultContent=None, durable=True):
        self.__fileName = fileName
        self.__durable = durable
        try:
            if not os.path.exists(fileName):
                with open(fileName, 'wb') as f:
                    if defaultContent is not None:
                        f.write(defaultContent)
            self.__fd = os.open(fileName, os.O_RDWR)
        except OSError as e:
            raise StorageFailure(fileName, 'create', e)
        # Bytes that exist on disk as written blocks (data or zeros). A file that ResizableFile
        # grew may have holes below its size; they are filled as writes reach them only if they
        # lie past this mark, so such a file keeps the sparse file's costs until the next
        # compaction rewrites it from the start (harmless: correctness never depends on it).
        self.__filled = os.fstat(self.__fd).st_size
        if self.__filled < initialSize:
            self.__fill(initialSize)

    @property
    def fileName(self):
        return self.__fileName

    def fileno(self):
        return self.__fd

    def size(self):
        return os.fstat(self.__fd).st_size

    def write(self, offset, values):
        end = offset + len(values)
        if end > self.__filled:
            self.__fill(end + GROW_BYTES)
        view = memoryview(values)
        try:
            while view:
                n = os.pwrite(self.__fd, view, offset)
                view, offset = view[n:], offset + n
        except OSError as e:
            raise StorageFailure(self.__fileName, 'pwrite', e)

    def read(self, offset, size):
        return os.pread(self.__fd, size, offset)

    def __fill(self, end):
        """Write zeros from the filled mark to `end` and sync them (fsync durability), so later
        appends there overwrite allocated blocks."""
        pos = self.__filled
        try:
            while pos < end:
                n = os.pwrite(self.__fd, _ZEROS[:min(len(_ZEROS), end - pos)], pos)
                pos += n
        except OSError as e:
            raise StorageFailure(self.__fileName, 'pwrite (zero fill)', e)
        if self.__durable:
            self.flush()
        self.__filled = pos

    def flush(self):
        try:
            datasync(self.__fd)
        except OSError as e:
            raise StorageFailure(self.__fileName, 'fdatasync', e)

    def _destroy(self):
        if self.__fd >= 0:                  # as ResizableFile did (mmap.flush, then close)
            try:
                if self.__durable:
                    datasync(self.__fd)
            except OSError:
                pass                        # closing after a failure: nothing is promised any more
            os.close(self.__fd)
            self.__fd = -1


META_MAGIC = b'RQMETA\x00\x02'   # raftq's meta file: magic, crc32 of the pickle, the pickle
META_HEAD = struct.Struct('<8sI')


class MetaStorer(object):
    """Term, vote and the commit index in one small file (`<journal>.meta`), written by
    setCurrentTerm (before a vote or a new term is acted on) and once a second when the commit
    index moved.

    raftq: upstream writes it without fsync; a power cut could then take a node's term and vote
    back (two leaders elected in one term, two different entries with the same index and term:
    logs that Raft can never reconcile), and an unsynced rewrite could even leave the file
    empty. Every write is now synced (the file, then its directory after the rename). With
    `termVoteOnly` (memory durability) it is written, and synced, only when the term or the vote
    changed (elections: rare), never for the commit index alone, which memory durability does
    not trust after a restart anyway (SyncObj.__init__). The file is read back with an
    unpickler that refuses every global: it holds builtins only.

    raftq: the file carries a CRC-32 of its pickle (META_MAGIC, crc, pickle); upstream's bare
    pickle is still read. getMeta() reports a file that fails its check or does not load
    (`damaged`): a node that cannot trust its term and vote must not vote (SyncObj). A failed
    write raises StorageFailure.
    """

    def __init__(self, path, termVoteOnly=False):
        self.__path = path
        self.__termVoteOnly = termVoteOnly
        self.__stored = None
        self.damaged = None          # what was wrong with the file when it was read, or None
        self.legacy = False          # the file was upstream's bare pickle

    def getMeta(self):
        meta = {}
        self.damaged = None
        try:
            with open(self.__path, 'rb') as f:
                raw = f.read()
        except FileNotFoundError:
            return meta
        except OSError as e:
            self.damaged = 'cannot be read: %s' % e
            return meta
        try:
            if raw[:len(META_MAGIC)] == META_MAGIC:
                _, crc = META_HEAD.unpack_from(raw)
                body = raw[META_HEAD.size:]
                if zlib.crc32(body) != crc:
                    self.damaged = 'fails its checksum (%d bytes)' % len(raw)
                    return {}
            else:
                body = raw
                self.legacy = True
            meta = loadsBuiltins(body)
            if not isinstance(meta, dict):
                raise ValueError('not a dict')
        except Exception as e:
            self.damaged = 'does not load (%s: %s)' % (type(e).__name__, e)
            return {}
        return meta

    def storeMeta(self, meta):
        if self.__termVoteOnly:
            key = (meta.get('currentTerm'), meta.get('votedForNodeId'), meta.get('unverified'))
            if self.__stored == key:
                return
            self.__stored = key
        body = dumps(meta)
        tmp = self.__path + '.tmp'
        try:
            with open(tmp, 'wb') as f:
                f.write(META_HEAD.pack(META_MAGIC, zlib.crc32(body)) + body)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise StorageFailure(tmp, 'write and fsync', e)
        try:
            os.replace(tmp, self.__path)
        except OSError as e:
            raise StorageFailure(self.__path, 'rename', e)
        fsyncDir(os.path.dirname(self.__path))

    def getPath(self):
        return self.__path


# raftq: format 2, checksummed. Upstream's format 1 (still read, and rewritten as format 2 when
# a journal is opened):
#  APP_NAME (24b) + APP_VERSION (8b) + FORMAT_VERSION (4b) + LAST_RECORD_OFFSET (4b) +
#      record1size + record1 + record1size   +  record2size + record2 + record2size   +  ...
#  where a record is idx (8b) + term (8b) + command.
# Format 2:
#  APP_NAME (24b) + APP_VERSION (8b) + FORMAT_VERSION=2 (4b) + LAST_RECORD_OFFSET (4b) +
#      crc32(LAST_RECORD_OFFSET) (4b) + 0 (4b) +
#      size + crc + idx (8b) + term (8b) + command + size   +  ...
#  where size = 4 + 16 + len(command) (crc to command) and crc = crc32(size, idx, term,
#  command). The end marker and its crc are one 8-byte write, inside one sector.
JOURNAL_FORMAT_VERSION = 2
LEGACY_FORMAT_VERSION = 1
APP_NAME = b'PYSYNCOBJ'
APP_VERSION = str.encode(VERSION)

NAME_SIZE = 24
VERSION_SIZE = 8
assert len(APP_NAME) < NAME_SIZE
assert len(APP_VERSION) < VERSION_SIZE
LAST_RECORD_OFFSET_OFFSET = NAME_SIZE + VERSION_SIZE + 4
FORMAT_VERSION_OFFSET = NAME_SIZE + VERSION_SIZE
LEGACY_FIRST_RECORD_OFFSET = NAME_SIZE + VERSION_SIZE + 4 + 4
FIRST_RECORD_OFFSET = LEGACY_FIRST_RECORD_OFFSET + 8
RECORD_HEAD = struct.Struct('<IIQQ')     # size, crc, idx, term
END_MARKER = struct.Struct('<II')        # offset, crc32(offset)
LENGTH = struct.Struct('<I')


def endMarker(offset):
    packed = LENGTH.pack(offset)
    return packed + LENGTH.pack(zlib.crc32(packed))


def packRecord(command, idx, term):
    """One format-2 record (see above)."""
    command = to_bytes(command)
    size = 20 + len(command)
    sizeData = LENGTH.pack(size)
    body = struct.pack('<QQ', idx, term) + command
    return sizeData + LENGTH.pack(zlib.crc32(body, zlib.crc32(sizeData))) + body + sizeData


def readRecord(data, pos, end):
    """The format-2 record at `pos` of `data` (bytes or an mmap) ending by `end`:
    ((command, idx, term), next position), or (None, what is wrong)."""
    if pos + RECORD_HEAD.size + 4 > end:
        return None, 'incomplete record'
    size, crc, idx, term = RECORD_HEAD.unpack_from(data, pos)
    if size < 20 or pos + 8 + size > end:
        return None, 'impossible record size %d' % size
    if LENGTH.unpack_from(data, pos + 4 + size)[0] != size:
        return None, 'record sizes at its two ends differ'
    view = memoryview(data)[pos + 8:pos + 4 + size]
    try:
        if zlib.crc32(view, zlib.crc32(data[pos:pos + 4])) != crc:
            return None, 'checksum mismatch'
        command = bytes(view[16:])
    finally:
        view.release()
    return (command, idx, term), pos + 8 + size


def readLegacyRecord(data, pos, end):
    """A format-1 record (no checksum: only its framing can be checked)."""
    if pos + 4 > end:
        return None, 'incomplete record'
    size = LENGTH.unpack_from(data, pos)[0]
    if size < 16 or pos + 8 + size > end:
        return None, 'impossible record size %d' % size
    if LENGTH.unpack_from(data, pos + 4 + size)[0] != size:
        return None, 'record sizes at its two ends differ'
    idx, term = struct.unpack_from('<QQ', data, pos + 4)
    return (bytes(data[pos + 20:pos + 4 + size]), idx, term), pos + 8 + size


def defaultHeader(formatVersion=JOURNAL_FORMAT_VERSION):
    appName = APP_NAME + b'\0' * (NAME_SIZE - len(APP_NAME))
    appVersion = APP_VERSION + b'\0' * (VERSION_SIZE - len(APP_VERSION))
    if formatVersion == LEGACY_FORMAT_VERSION:
        return appName + appVersion + struct.pack('<II', LEGACY_FORMAT_VERSION, LEGACY_FIRST_RECORD_OFFSET)
    return appName + appVersion + struct.pack('<I', formatVersion) + endMarker(FIRST_RECORD_OFFSET) + bytes(4)


class FileJournal(Journal):
    """raftq: one JournalFile in both durabilities; `durable` (fsync durability) makes sync()
    fdatasync it when something was added since the last sync. `observer` is a test hook (the
    chaos harness's power-loss simulation, node/sync_shadow.py, and the fsync-EIO hook):
    attach(journal, journalFile) once the file is read, before its first write;
    beforeWrite(offset) before every write to the file; beforeSync() before every sync (it may
    raise OSError, which fails the sync); durable() after every sync.

    raftq: every record carries a CRC-32 (format 2, above) and the end marker its own. Opening
    the file verifies all of it: each record's framing and checksum, indices that follow each
    other and terms that never go down. What it finds is in `findings` (what, where, what was
    cut), and the journal then holds the good prefix only:
    * a torn tail - the last records up to the end marker fail and nothing valid follows (what a
      crash in the middle of a write leaves): cut at the last good entry;
    * a corrupted entry with valid entries after it, or a file shorter than its end marker (cut
      from outside), or an end marker that fails its own check: cut at the last good entry too;
    * a header that is not a journal's: the file is moved aside (`.damaged`) and a new one begun.
    Any of them makes the node's log untrusted (SyncObj: no votes until it caught up with a
    leader): a torn tail after a crash holds only unsynced, never acknowledged entries, but the
    same bytes after a bit flip at rest may have been acknowledged, and the two cannot be told
    apart.

    raftq: only the newest entries keep their command in memory, up to `hotBytes` of commands
    (`tuning.journal_memory_bytes`); an older entry is kept as (None, index, term) with its
    file offset and is read back from the file, checksum verified, when it is asked for (a
    follower far behind, log compaction). Upstream held every command of the log in memory
    until the next snapshot: at a million jobs filled since the last one, ~350 bytes a job."""

    def __init__(self, journalFile, durable=True, observer=None, hotBytes=None):
        self.__fileName = journalFile
        self.__durable = durable
        self.__hotLimit = HOT_BYTES if hotBytes is None else hotBytes
        self.__hotFrom = 0           # entries [hotFrom:] hold their command; older ones: None
        self.__hotSize = 0           # bytes of the commands held
        self.__dirty = False
        self.__syncs = 0
        self.__observer = None
        self.__journal = []
        self.__offsets = []          # raftq: each entry's offset in the file
        self.__findings = []
        self.__metaStorer = MetaStorer(journalFile + '.meta', termVoteOnly=not durable)
        self.__meta = self.__metaStorer.getMeta()
        if self.__metaStorer.damaged:
            self.__findings.append({'what': 'meta_damaged', 'file': self.__metaStorer.getPath(),
                                    'detail': 'the meta file (term, vote, commit index) %s' % self.__metaStorer.damaged})
        self.__metaSaved = True
        fmt = self.__openFile()
        if fmt == LEGACY_FORMAT_VERSION:
            self.__upgrade()
        if observer is not None:
            observer.attach(self, self.__journalFile)
            self.__observer = observer

    # ---------------------------------------------------------------- reading the file
    def __openFile(self):
        """Open and verify the file; returns its format version as it was found."""
        exists = os.path.exists(self.__fileName)
        # An empty file is a journal whose creation was cut short (created, header not yet
        # written): nothing was ever in it, so it is begun again, not reported.
        # The size on disk, before JournalFile zero-fills a short file to its initial size: a
        # journal cut below its end marker by less than that would otherwise read as a torn tail.
        size = os.path.getsize(self.__fileName) if exists else 0
        empty = exists and size == 0
        self.__journalFile = JournalFile(self.__fileName, defaultContent=defaultHeader(), durable=self.__durable)
        if not exists or empty:
            if empty:
                self.__journalFile.write(0, defaultHeader())
            self.__currentOffset = FIRST_RECORD_OFFSET
            return JOURNAL_FORMAT_VERSION
        jf = self.__journalFile
        header = jf.read(0, FIRST_RECORD_OFFSET)
        fmt = None
        if len(header) >= LEGACY_FIRST_RECORD_OFFSET and header[:NAME_SIZE].rstrip(b'\0') == APP_NAME:
            fmt = struct.unpack_from('<I', header, FORMAT_VERSION_OFFSET)[0]
        if fmt not in (LEGACY_FORMAT_VERSION, JOURNAL_FORMAT_VERSION) or \
                (fmt == JOURNAL_FORMAT_VERSION and len(header) < FIRST_RECORD_OFFSET):
            self.__moveAside('the file does not start with a journal header (%d bytes)' % size)
            return JOURNAL_FORMAT_VERSION
        if fmt == LEGACY_FORMAT_VERSION:
            first, read = LEGACY_FIRST_RECORD_OFFSET, readLegacyRecord
            end = LENGTH.unpack_from(header, LAST_RECORD_OFFSET_OFFSET)[0]
            markerOk = True
        else:
            first, read = FIRST_RECORD_OFFSET, readRecord
            end, crc = END_MARKER.unpack_from(header, LAST_RECORD_OFFSET_OFFSET)
            markerOk = zlib.crc32(LENGTH.pack(end)) == crc
            if not markerOk:
                end = size          # read every valid record there is
        if end < first:
            markerOk, end = False, size
        data = self.__map(size)
        try:
            pos, problem = first, None
            while pos < min(end, size):
                record, nxt = read(data, pos, min(end, size))
                if record is None:
                    problem = nxt
                    break
                if self.__journal:
                    prevIdx, prevTerm = self.__journal[-1][1], self.__journal[-1][2]
                    if record[1] != prevIdx + 1 or record[2] < prevTerm:
                        problem = 'entry (%d, term %d) does not follow (%d, term %d)' % (
                            record[1], record[2], prevIdx, prevTerm)
                        break
                self.__journal.append(record)
                self.__offsets.append(pos)
                pos = nxt
                if read is readRecord:      # (a format-1 file is upgraded from memory)
                    self.__hold(record[0])
            if pos < end and markerOk:
                if problem is None:
                    problem = 'the file ends at %d' % size
                self.__found(data, pos, end, size, problem, read)
            elif not markerOk:
                self.__findings.append({
                    'what': 'journal_end_marker', 'file': self.__fileName, 'offset': LAST_RECORD_OFFSET_OFFSET,
                    'detail': 'the end marker fails its check; kept the %d valid entries up to offset %d' % (
                        len(self.__journal), pos)})
        finally:
            if isinstance(data, mmap.mmap):
                data.close()
        self.__currentOffset = pos
        if pos != end or not markerOk:
            self.__setLastRecordOffset(pos, fmt)
            if self.__durable:
                jf.flush()
        return fmt

    def __map(self, size):
        if size == 0:
            return b''
        try:
            return mmap.mmap(self.__journalFile.fileno(), size, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return self.__journalFile.read(0, size)

    def __found(self, data, pos, end, size, problem, read):
        """A bad record at `pos` before the end marker: what it is, for the findings."""
        last = self.__journal[-1][1] if self.__journal else None
        finding = {'file': self.__fileName, 'offset': pos, 'end_marker': end, 'file_size': size,
                   'kept_entries': len(self.__journal), 'last_good_index': last}
        if size < end:
            finding.update(what='journal_truncated', detail='the file is %d bytes, shorter than its end marker %d '
                           '(cut from outside); %s at offset %d' % (size, end, problem, pos))
        elif self.__validAfter(data, pos, min(end, size), last, read):
            finding.update(what='journal_corrupt_entry', detail='%s at offset %d, with valid entries after it' % (
                problem, pos))
        else:
            finding.update(what='journal_torn_tail', detail='%s at offset %d, nothing valid after it up to the end '
                           'marker %d' % (problem, pos, end))
        self.__findings.append(finding)

    @staticmethod
    def __validAfter(data, pos, end, last, read):
        """Is there a valid record of one of the next few indices between pos and end? (Found by
        its index bytes, so a damaged size field does not hide it.)"""
        if last is None or read is not readRecord:
            return False
        for idx in range(last + 2, last + 10):
            needle = struct.pack('<Q', idx)
            at = data.find(needle, pos) if isinstance(data, (bytes, mmap.mmap)) else -1
            while at != -1 and at < end:
                start = at - 8
                if start >= pos:
                    record, _ = read(data, start, end)
                    if record is not None and record[1] == idx:
                        return True
                at = data.find(needle, at + 1)
        return False

    def __moveAside(self, why):
        """The file is not a journal at all: keep it as `<file>.damaged` and start a new one."""
        self.__journalFile._destroy()
        aside = self.__fileName + '.damaged'
        try:
            os.replace(self.__fileName, aside)
        except OSError as e:
            raise StorageFailure(self.__fileName, 'rename to .damaged', e)
        self.__findings.append({'what': 'journal_header', 'file': self.__fileName, 'moved_to': aside,
                                'detail': '%s; moved aside, starting an empty journal' % why})
        self.__journalFile = JournalFile(self.__fileName, defaultContent=defaultHeader(), durable=self.__durable)
        self.__currentOffset = FIRST_RECORD_OFFSET

    def __upgrade(self):
        """A format-1 journal (upstream's, raftq 0.1.0's): rewrite it as format 2, through a
        new file renamed into place, so that a crash leaves one whole journal or the other."""
        entries = list(self.__journal)
        self.__journalFile._destroy()
        tmp = self.__fileName + '.upgrade.tmp'
        try:
            with open(tmp, 'wb') as f:
                f.write(defaultHeader())
                pos = FIRST_RECORD_OFFSET
                offsets = []
                for entry in entries:
                    rec = packRecord(*entry)
                    f.write(rec)
                    offsets.append(pos)
                    pos += len(rec)
                f.seek(LAST_RECORD_OFFSET_OFFSET)
                f.write(endMarker(pos))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.__fileName)
        except OSError as e:
            raise StorageFailure(tmp, 'upgrade to format 2', e)
        fsyncDir(os.path.dirname(self.__fileName))
        self.__journalFile = JournalFile(self.__fileName, defaultContent=defaultHeader(), durable=self.__durable)
        self.__offsets = offsets
        self.__currentOffset = pos
        self.upgradedFrom = LEGACY_FORMAT_VERSION
        for entry in self.__journal[self.__hotFrom:]:
            self.__hold(entry[0])

    upgradedFrom = None

    # ---------------------------------------------------------------- writing
    def __setLastRecordOffset(self, offset, fmt=JOURNAL_FORMAT_VERSION):
        if fmt == LEGACY_FORMAT_VERSION:
            self.__write(LAST_RECORD_OFFSET_OFFSET, LENGTH.pack(offset))
        else:
            self.__write(LAST_RECORD_OFFSET_OFFSET, endMarker(offset))

    def __write(self, offset, data):
        if self.__observer is not None:
            self.__observer.beforeWrite(offset)
        self.__journalFile.write(offset, data)

    def add(self, command, idx, term):
        self.__journal.append((command, idx, term))
        cmdData = packRecord(command, idx, term)
        self.__write(self.__currentOffset, cmdData)
        self.__offsets.append(self.__currentOffset)
        self.__currentOffset += len(cmdData)
        self.__setLastRecordOffset(self.__currentOffset)
        self.__dirty = True
        self.__hold(command)

    def clear(self):
        self.__journal = []
        self.__offsets = []
        self.__hotFrom = self.__hotSize = 0
        self.__setLastRecordOffset(FIRST_RECORD_OFFSET)
        self.__currentOffset = FIRST_RECORD_OFFSET

    # ---------------------------------------------------------------- commands in memory
    def __hold(self, command):
        """The newest entry's command is held; the oldest held ones are let go past the limit
        (the newest is always held: it is about to be applied and sent)."""
        self.__hotSize += len(command)
        journal = self.__journal
        while self.__hotSize > self.__hotLimit and self.__hotFrom < len(journal) - 1:
            command, idx, term = journal[self.__hotFrom]
            journal[self.__hotFrom] = (None, idx, term)
            self.__hotSize -= len(command)
            self.__hotFrom += 1

    def __readBack(self, i):
        """Entry i (>= 0) from the file, checked as on opening. A record that fails now was
        good when the file was opened: the disk changed it under the node, which stops (exit
        74, like a failed write); on restart the opening check cuts the log there and the node
        recovers from the leader."""
        start = self.__offsets[i]
        end = self.__offsets[i + 1] if i + 1 < len(self.__offsets) else self.__currentOffset
        try:
            data = self.__journalFile.read(start, end - start)
        except OSError as e:
            raise StorageFailure(self.__fileName, 'pread', e)
        record, problem = readRecord(data, 0, len(data))
        want = self.__journal[i]
        if record is None or record[1] != want[1] or record[2] != want[2]:
            why = problem if record is None else 'entry (%d, term %d) where (%d, term %d) was' % (
                record[1], record[2], want[1], want[2])
            logger.critical('journal %s: the entry at offset %d fails its check on reading back (%s): the disk '
                            'changed it since it was verified; stopping', self.__fileName, start, why)
            raise StorageFailure(self.__fileName, 'read back (%s)' % why, OSError(errno.EIO, os.strerror(errno.EIO)))
        return record

    def __getitem__(self, idx):
        if type(idx) is slice:
            start, stop, step = idx.indices(len(self.__journal))
            if start >= self.__hotFrom:
                return self.__journal[idx]
            return [self[i] for i in range(start, stop, step)]
        entry = self.__journal[idx]
        if entry[0] is None:
            return self.__readBack(idx if idx >= 0 else idx + len(self.__journal))
        return entry

    @property
    def heldBytes(self):
        """Bytes of commands held in memory (the rest are read back from the file)."""
        return self.__hotSize

    @property
    def heldFrom(self):
        """raftq: entries [heldFrom:] hold their command in memory; older ones are read back."""
        return self.__hotFrom

    @property
    def firstIndex(self):
        """raftq: the Raft index of entry 0 (None when empty), without reading it back."""
        return self.__journal[0][1] if self.__journal else None

    def __len__(self):
        return len(self.__journal)

    def deleteEntriesFrom(self, entryFrom):
        # raftq: the offsets are kept in memory; upstream walked back through the records'
        # trailing sizes, read from the file.
        if entryFrom >= len(self.__journal):
            return
        offset = self.__offsets[entryFrom] if entryFrom >= 0 else FIRST_RECORD_OFFSET
        self.__hotSize -= sum(len(e[0]) for e in self.__journal[entryFrom:] if e[0] is not None)
        del self.__journal[entryFrom:]
        del self.__offsets[entryFrom:]
        self.__hotFrom = min(self.__hotFrom, len(self.__journal))
        self.__currentOffset = offset
        self.__setLastRecordOffset(offset)

    def deleteEntriesTo(self, entryTo):
        journal = self[entryTo:]        # read back before the file is rewritten from its start
        self.clear()
        for entry in journal:
            self.add(*entry)

    def _destroy(self):
        # raftq: a node that stops stores the commit index it knows (otherwise written once a
        # second): restarted alone, it replays its journal up to there instead of an older one.
        if not self.__metaSaved:
            try:
                self.__metaStorer.storeMeta(self.__meta)
                self.__metaSaved = True
            except Exception:
                logger.exception('could not store the meta file at shutdown')
        self.__journalFile._destroy()

    def flush(self):
        self.__journalFile.flush()

    def sync(self):
        # Only when something was appended since the last sync: one fdatasync per
        # append-entries round, shared by every command in it (group commit). fdatasync
        # releases the GIL while the disk works.
        if self.__durable and self.__dirty:
            self.__dirty = False
            if self.__observer is not None:
                try:
                    self.__observer.beforeSync()
                except OSError as e:
                    raise StorageFailure(self.__fileName, 'fdatasync', e)
            self.__journalFile.flush()
            self.__syncs += 1
            if self.__observer is not None:
                self.__observer.durable()

    @property
    def syncs(self):
        return self.__syncs

    @property
    def findings(self):
        return list(self.__findings)

    @property
    def recordOffsets(self):
        """raftq: each entry's offset in the file (for tests)."""
        return list(self.__offsets)

    def setRaftCommitIndex(self, raftCommitIndex):
        self.__meta['raftCommitIndex'] = raftCommitIndex
        self.__metaSaved = False

    def getRaftCommitIndex(self):
        return self.__meta.get('raftCommitIndex', 1)

    def setCurrentTerm(self, term, votedForNodeId):
        self.__meta['currentTerm'] = term
        self.__meta['votedForNodeId'] = votedForNodeId
        # Raft requires currentTerm and votedFor to be durable before any message
        # reflecting them (vote request/grant) is sent, so store synchronously.
        self.__metaStorer.storeMeta(self.__meta)
        self.__metaSaved = True

    def getCurrentTerm(self):
        return self.__meta.get('currentTerm', 0)

    def getVotedForNodeId(self):
        return self.__meta.get('votedForNodeId', None)

    def getUnverified(self):
        return self.__meta.get('unverified')

    def setUnverified(self, info):
        """raftq: record (synced) why the log is not trusted for voting, or that it is again
        (None): a node that restarts before it caught up must still not vote."""
        if info is None:
            self.__meta.pop('unverified', None)
        else:
            self.__meta['unverified'] = info
        self.__metaStorer.storeMeta(self.__meta)
        self.__metaSaved = True

    def onOneSecondTimer(self):
        if not self.__metaSaved:
            self.__metaStorer.storeMeta(self.__meta)
            self.__metaSaved = True


def createJournal(journalFile = None, durable = True, observer = None, hotBytes = None):
    if journalFile is None:
        return MemoryJournal()
    return FileJournal(journalFile, durable, observer, hotBytes)
