import os
import mmap
import struct
import shutil

from .version import VERSION
from .pickle import to_bytes, loadsBuiltins, dumps

# raftq: fdatasync where there is one (macOS has none).
datasync = getattr(os, 'fdatasync', os.fsync)


def fsyncDir(path):
    fd = os.open(path or '.', os.O_RDONLY)
    try:
        os.fsync(fd)
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



class ResizableFile(object):

    def __init__(self, fileName, initialSize = 1024, resizeFactor = 2.0, defaultContent = None):
        self.__fileName = fileName
        self.__resizeFactor = resizeFactor
        if not os.path.exists(fileName):
            with open(fileName, 'wb') as f:
                if defaultContent is not None:
                    f.write(defaultContent)
        self.__f = open(fileName, 'r+b')
        self.__mm = mmap.mmap(self.__f.fileno(), 0)
        currSize = self.__mm.size()
        if currSize < initialSize:
            try:
                self.__mm.resize(initialSize)
            except (SystemError, OSError):
                self.__extand(initialSize - currSize)

    def write(self, offset, values):
        size = len(values)
        while offset + size > self.__mm.size():
            currSize = self.__mm.size()
            newSize = max(int(currSize * self.__resizeFactor), offset + size)
            try:
                self.__mm.resize(newSize)
            except (SystemError, OSError):
                self.__extand(newSize - currSize)
        self.__mm[offset:offset + size] = values

    def read(self, offset, size):
        return self.__mm[offset:offset + size]

    def __extand(self, bytesToAdd):
        self.__mm.close()
        self.__f.close()
        with open(self.__fileName, 'ab') as f:
            f.write(b'\0' * bytesToAdd)
        self.__f = open(self.__fileName, 'r+b')
        self.__mm = mmap.mmap(self.__f.fileno(), 0)

    def _destroy(self):
        self.__mm.flush()
        self.__mm.close()
        self.__f.close()

    def flush(self):
        self.__mm.flush()


GROW_BYTES = 2 << 20        # zero-filled ahead of the write offset per step (~1 ms of writing and syncing)
_ZEROS = bytes(1 << 20)


class JournalFile(object):
    """raftq: the journal's file in fsync durability - ResizableFile's interface (write, read,
    flush, _destroy) plus fileno(), written with pwrite into space that was filled with zeros
    ahead of time, so that syncing an append flushes data only.

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

    So the file is kept zero-filled GROW_BYTES ahead of the last write, and those zeros are
    synced when they are written (once per region: after log compaction the journal rewrites
    the file from its start, over blocks that are already there). On-disk format and contents
    are upstream's: a journal written by either class is read by the other.
    """

    def __init__(self, fileName, initialSize=1024, resizeFactor=2.0, defaultContent=None):
        if not os.path.exists(fileName):
            with open(fileName, 'wb') as f:
                if defaultContent is not None:
                    f.write(defaultContent)
        self.__fd = os.open(fileName, os.O_RDWR)
        # Bytes that exist on disk as written blocks (data or zeros). A file that ResizableFile
        # grew may have holes below its size; they are filled as writes reach them only if they
        # lie past this mark, so such a file keeps the sparse file's costs until the next
        # compaction rewrites it from the start (harmless: correctness never depends on it).
        self.__filled = os.fstat(self.__fd).st_size
        if self.__filled < initialSize:
            self.__fill(initialSize)

    def fileno(self):
        return self.__fd

    def write(self, offset, values):
        end = offset + len(values)
        if end > self.__filled:
            self.__fill(end + GROW_BYTES)
        view = memoryview(values)
        while view:
            n = os.pwrite(self.__fd, view, offset)
            view, offset = view[n:], offset + n

    def read(self, offset, size):
        return os.pread(self.__fd, size, offset)

    def __fill(self, end):
        """Write zeros from the filled mark to `end` and sync them, so later appends there
        overwrite allocated blocks."""
        pos = self.__filled
        while pos < end:
            n = os.pwrite(self.__fd, _ZEROS[:min(len(_ZEROS), end - pos)], pos)
            pos += n
        datasync(self.__fd)
        self.__filled = pos

    def flush(self):
        datasync(self.__fd)

    def _destroy(self):
        if self.__fd >= 0:                  # as ResizableFile does (mmap.flush, then close)
            datasync(self.__fd)
            os.close(self.__fd)
            self.__fd = -1


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
    """

    def __init__(self, path, termVoteOnly=False):
        self.__path = path
        self.__termVoteOnly = termVoteOnly
        self.__stored = None

    def getMeta(self):
        meta = {}
        try:
            with open(self.__path, 'rb') as f:
                meta = loadsBuiltins(f.read())
        except:
            pass
        return meta

    def storeMeta(self, meta):
        if self.__termVoteOnly:
            key = (meta.get('currentTerm'), meta.get('votedForNodeId'))
            if self.__stored == key:
                return
            self.__stored = key
        with open(self.__path + '.tmp', 'wb') as f:
            f.write(dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        shutil.move(self.__path + '.tmp', self.__path)
        fsyncDir(os.path.dirname(self.__path))

    def getPath(self):
        return self.__path


JOURNAL_FORMAT_VERSION = 1
APP_NAME = b'PYSYNCOBJ'
APP_VERSION = str.encode(VERSION)

NAME_SIZE = 24
VERSION_SIZE = 8
assert len(APP_NAME) < NAME_SIZE
assert len(APP_VERSION) < VERSION_SIZE
FIRST_RECORD_OFFSET = NAME_SIZE + VERSION_SIZE + 4 + 4
LAST_RECORD_OFFSET_OFFSET = NAME_SIZE + VERSION_SIZE + 4

#
#  APP_NAME (24b) + APP_VERSION (8b) + FORMAT_VERSION (4b) + LAST_RECORD_OFFSET (4b) +
#      record1size + record1 + record1size   +  record2size + record2 + record2size   +  ...
#                (record1)                   |               (record2)                |  ...
#

class FileJournal(Journal):
    """raftq: `durable` (fsync durability) writes the file with JournalFile and makes sync()
    fdatasync it when something was added since the last sync; otherwise (memory durability)
    upstream's mmap'd ResizableFile, never synced. `observer` is a test hook (the chaos
    harness's power-loss simulation, node/sync_shadow.py): attach(journal, journalFile) once the
    file is read, before its first write; beforeWrite(offset) before every write to the file;
    durable() after every sync."""

    def __init__(self, journalFile, durable=True, observer=None):
        fileClass = JournalFile if durable else ResizableFile
        self.__journalFile = fileClass(journalFile, defaultContent=self.__getDefaultHeader())
        self.__durable = durable
        self.__dirty = False
        self.__syncs = 0
        self.__observer = None
        self.__journal = []
        self.__metaStorer = MetaStorer(journalFile + '.meta', termVoteOnly=not durable)
        self.__meta = self.__metaStorer.getMeta()
        self.__metaSaved = True
        currentOffset = FIRST_RECORD_OFFSET
        lastRecordOffset = self.__getLastRecordOffset()
        while currentOffset < lastRecordOffset:
            nextRecordSize = struct.unpack('<I', self.__journalFile.read(currentOffset, 4))[0]
            nextRecordData = self.__journalFile.read(currentOffset + 4, nextRecordSize)
            command = nextRecordData[16:]
            idx, term = struct.unpack('<QQ', nextRecordData[:16])
            self.__journal.append((command, idx, term))
            currentOffset += nextRecordSize + 8
        self.__currentOffset = currentOffset
        if observer is not None:
            observer.attach(self, self.__journalFile)
            self.__observer = observer

    def __getDefaultHeader(self):
        appName = APP_NAME + b'\0' * (NAME_SIZE - len(APP_NAME))
        appVersion = APP_VERSION + b'\0' * (VERSION_SIZE - len(APP_VERSION))
        header = appName + appVersion + struct.pack('<II', JOURNAL_FORMAT_VERSION, FIRST_RECORD_OFFSET)
        return header

    def __getLastRecordOffset(self):
        return struct.unpack('<I', self.__journalFile.read(LAST_RECORD_OFFSET_OFFSET, 4))[0]

    def __setLastRecordOffset(self, offset):
        self.__write(LAST_RECORD_OFFSET_OFFSET, struct.pack('<I', offset))

    def __write(self, offset, data):
        if self.__observer is not None:
            self.__observer.beforeWrite(offset)
        self.__journalFile.write(offset, data)

    def add(self, command, idx, term):
        self.__journal.append((command, idx, term))
        cmdData = struct.pack('<QQ', idx, term) + to_bytes(command)
        cmdLenData = struct.pack('<I', len(cmdData))
        cmdData = cmdLenData + cmdData + cmdLenData
        self.__write(self.__currentOffset, cmdData)
        self.__currentOffset += len(cmdData)
        self.__setLastRecordOffset(self.__currentOffset)
        self.__dirty = True

    def clear(self):
        self.__journal = []
        self.__setLastRecordOffset(FIRST_RECORD_OFFSET)
        self.__currentOffset = FIRST_RECORD_OFFSET

    def __getitem__(self, idx):
        return self.__journal[idx]

    def __len__(self):
        return len(self.__journal)

    def deleteEntriesFrom(self, entryFrom):
        entriesToRemove = len(self.__journal) - entryFrom
        del self.__journal[entryFrom:]
        currentOffset = self.__currentOffset
        removedEntries = 0
        while removedEntries < entriesToRemove:
            prevRecordSize = struct.unpack('<I', self.__journalFile.read(currentOffset - 4, 4))[0]
            currentOffset -= prevRecordSize + 8
            removedEntries += 1
            if removedEntries % 10 == 0:
                self.__setLastRecordOffset(currentOffset)
        self.__currentOffset = currentOffset
        self.__setLastRecordOffset(currentOffset)

    def deleteEntriesTo(self, entryTo):
        journal = self.__journal[entryTo:]
        self.clear()
        for entry in journal:
            self.add(*entry)

    def _destroy(self):
        self.__journalFile._destroy()

    def flush(self):
        self.__journalFile.flush()

    def sync(self):
        # Only when something was appended since the last sync: one fdatasync per
        # append-entries round, shared by every command in it (group commit). fdatasync
        # releases the GIL while the disk works.
        if self.__durable and self.__dirty:
            self.__dirty = False
            datasync(self.__journalFile.fileno())
            self.__syncs += 1
            if self.__observer is not None:
                self.__observer.durable()

    @property
    def syncs(self):
        return self.__syncs

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

    def onOneSecondTimer(self):
        if not self.__metaSaved:
            self.__metaStorer.storeMeta(self.__meta)
            self.__metaSaved = True


def createJournal(journalFile = None, durable = True, observer = None):
    if journalFile is None:
        return MemoryJournal()
    return FileJournal(journalFile, durable, observer)
