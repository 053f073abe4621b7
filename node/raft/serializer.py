import io
import os
import gzip
import errno
import struct
import zlib
import logging
import pickle as stdpickle
from . import pickle

from io import BytesIO
from .config import SERIALIZER_STATE
from .journal import fsyncDir, StorageFailure
import ctypes
import signal
import sys

logger = logging.getLogger(__name__)

# raftq: a snapshot (the full dump) is one versioned document of builtins, gzipped:
#   {'format': SNAPSHOT_FORMAT, 'version': SNAPSHOT_VERSION,
#    'raft': {'last': entry, 'prev': entry, 'members': [address, ...], 'code_version': int},
#    'consumers': [each consumer's _serialize(), builtins]}
# where an entry is (command bytes, index, term): the last applied entry and the one before it.
# It is written with a pickler that refuses anything but builtins and read with an unpickler
# that refuses every global, so a snapshot can neither break on a rename nor run code. Upstream
# pickles (data, last, prev, cluster) with whatever objects the consumers hold (raftq 0.1.0:
# node.machine.QueueMachine, node.limits.Limits and QueueLimits, pysyncobj.node.TCPNode); those
# files are still read, by an unpickler that maps exactly the known class paths to inert
# stand-ins (LegacyObject) and refuses every other global, then upgraded to the document.
SNAPSHOT_FORMAT = 'raftq-snapshot'
SNAPSHOT_VERSION = 2
LEGACY_CLASSES = (('pysyncobj.node', 'TCPNode'),)

# raftq: the file around the gzipped document carries a checksum:
#   FILE_MAGIC (16 bytes) + the gzip stream + payload length (8 bytes) + crc32 of the gzip stream (4)
# so a snapshot is verified as a whole before it is loaded, sent to a follower or installed from
# the leader. (gzip's own CRC covers the uncompressed bytes but is only checked once the stream
# is read to its end, which loading a pickle need not do, and a damaged header or deflate block
# shows up as whatever error the decompressor or unpickler happens to raise.) A bare gzip file
# (release 0.1.0's and the builtins format's first files) is still read: it is verified by
# decompressing it to its end, which checks gzip's CRC and length.
FILE_MAGIC = b'raftq-snapshot\x00\x03'
FILE_TRAILER = struct.Struct('<QI')
GZIP_MAGIC = b'\x1f\x8b'
EXIT_EIO = 74           # the forked writer's exit status when the disk failed (os.EX_IOERR)
EXIT_ENOSPC = 28        # ... when the disk was full


class _ChecksumWriter(object):
    """A file wrapper that counts and checksums what goes through it (gzip writes into it)."""

    def __init__(self, f):
        self.f = f
        self.crc = 0
        self.length = 0

    def write(self, data):
        self.crc = zlib.crc32(data, self.crc)
        self.length += len(data)
        return self.f.write(data)

    def flush(self):
        self.f.flush()


class _Slice(io.RawIOBase):
    """`length` bytes of `f` from its current position (the gzip stream inside the file)."""

    def __init__(self, f, length):
        self.f = f
        self.left = length

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), self.left)
        if n <= 0:
            return 0
        data = self.f.read(n)
        b[:len(data)] = data
        self.left -= len(data)
        return len(data)


def verifyFile(f):
    """What is wrong with the snapshot in the open binary file `f` (None: it verifies)."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(0)
    head = f.read(len(FILE_MAGIC))
    if head == FILE_MAGIC:
        n = size - len(FILE_MAGIC) - FILE_TRAILER.size
        if n < 0:
            return 'the file (%d bytes) is shorter than its header and trailer' % size
        crc, left = 0, n
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            left -= len(chunk)
        length, want = FILE_TRAILER.unpack(f.read(FILE_TRAILER.size))
        if length != n:
            return 'its trailer says %d bytes of payload, the file holds %d' % (length, n)
        if crc != want:
            return 'checksum mismatch over its %d bytes' % n
        return None
    if head[:2] == GZIP_MAGIC:
        f.seek(0)
        try:
            with gzip.GzipFile(fileobj=f, mode='rb') as g:
                while g.read(1 << 20):
                    pass
        except (OSError, EOFError, zlib.error, ValueError) as e:
            return 'a legacy (bare gzip) snapshot that does not decompress: %s: %s' % (type(e).__name__, e)
        return None
    return 'not a snapshot: the file (%d bytes) starts with %r' % (size, head[:8])


def verifyPath(path):
    try:
        with open(path, 'rb') as f:
            return verifyFile(f)
    except OSError as e:
        return 'cannot be read: %s' % e


def openDocument(f):
    """A readable gzip stream of the document in the (verified) snapshot file `f`."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(0)
    if f.read(len(FILE_MAGIC)) == FILE_MAGIC:
        payload = io.BufferedReader(_Slice(f, size - len(FILE_MAGIC) - FILE_TRAILER.size), 1 << 16)
        return gzip.GzipFile(fileobj=payload, mode='rb')
    f.seek(0)
    return gzip.GzipFile(fileobj=f, mode='rb')


def writeDocument(f, document, compressionLevel):
    """Write the snapshot file (FILE_MAGIC, gzip stream, trailer) of `document` into `f`."""
    f.write(FILE_MAGIC)
    w = _ChecksumWriter(f)
    with gzip.GzipFile(fileobj=w, mode='wb', compresslevel=compressionLevel) as g:
        pickle.dumpBuiltins(document, g)
    f.write(FILE_TRAILER.pack(w.length, w.crc))


class LegacyObject(object):
    """An inert stand-in for an object of a snapshot written before the builtins format: it
    keeps the state that unpickling hands it (in .state) and does nothing else."""

    def __setstate__(self, state):
        self.state = state


class _LegacyUnpickler(stdpickle.Unpickler):
    def __init__(self, file, classes):
        super(_LegacyUnpickler, self).__init__(file)
        self.__classes = frozenset(classes)

    def find_class(self, module, name):
        if (module, name) in self.__classes:
            return LegacyObject
        raise stdpickle.UnpicklingError('refusing the global %s.%s in a legacy snapshot' % (module, name))


# raftq: what a child forked off a node does first (the snapshot writer below, the digest
# hasher of node/replication/replica.py `fork_at_tick`). prctl is looked up here, in the parent: a child of a
# threaded process must not dlopen.
PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith('linux') else None
except (OSError, AttributeError):
    _prctl = None
try:
    _MAXFD = os.sysconf('SC_OPEN_MAX')
except (ValueError, OSError):
    _MAXFD = 65536


def detachForkedChild(parentPid, keepFds=()):
    """raftq: in a child just forked off the node `parentPid`, before anything else. The child
    is killed (SIGKILL) when the thread that forked it ends: the node's tick thread, so when the
    node exits, fails or is killed, and not tens of seconds later when a snapshot or a digest of
    a large state is done. And it closes every descriptor inherited from the node but stdin,
    stdout, stderr and `keepFds`: the listening HTTP and Raft sockets (upstream's child held
    them, so a node killed while its child ran could not be restarted until the child exited),
    its connections and its journal. Where prctl is missing (not Linux) a child of a killed
    node still runs to its end, without the node's sockets."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parentPid:       # the node died before the prctl: nobody wants the work
        os._exit(1)
    low = 3
    for fd in sorted(set(k for k in keepFds if k >= 3)):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _MAXFD)


def atomicReplace(oldPath, newPath, fsync=False):
    """os.replace; raftq: with `fsync` the file is synced before the rename and its directory
    after it. Upstream renames without any sync, then compacts the journal: a power cut after the
    compacted journal reached the disk but before the snapshot did would lose committed entries.
    A failure raises StorageFailure."""
    if fsync:
        try:
            fd = os.open(oldPath, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise StorageFailure(oldPath, 'fsync', e)
    try:
        os.replace(oldPath, newPath)
    except OSError as e:
        raise StorageFailure(newPath, 'rename', e)
    if fsync:
        fsyncDir(os.path.dirname(newPath))


class Serializer(object):
    """raftq: `fsync` syncs snapshots around their rename (fsync durability); `compressionLevel`
    is gzip's; `legacyClasses` and `upgradeLegacy(old) -> document` read snapshots in upstream's
    format (see above). serialize() takes a function that builds the document: it runs in the
    forked child, off the tick thread.

    raftq: snapshots carry a checksum (FILE_MAGIC above). verify() checks the node's own file
    (SyncObj does at start, before anything is loaded); a transmission to a follower starts only
    from a file that verifies (checked once per file version), and `onDamaged(what, detail)` is
    told when it does not; a snapshot received from the leader is verified before it replaces
    the node's own. Failed writes raise StorageFailure; the forked writer exits EXIT_EIO or
    EXIT_ENOSPC when the disk failed it (lastFailure)."""

    def __init__(self, fileName, transmissionBatchSize, tryUseFork, fsync=False, compressionLevel=1,
                 legacyClasses=(), upgradeLegacy=None, onDamaged=None):
        self.__useFork = tryUseFork and hasattr(os, 'fork')
        self.__fileName = fileName
        self.__transmissionBatchSize = transmissionBatchSize
        self.__pid = 0
        self.__currentID = 0
        self.__transmissions = {}
        self.__incomingTransmissionFile = None
        self.__inMemorySerializedData = None
        self.__fsync = fsync
        self.__compressionLevel = compressionLevel
        self.__legacyClasses = tuple(LEGACY_CLASSES) + tuple(legacyClasses)
        self.__upgradeLegacy = upgradeLegacy
        self.__onDamaged = onDamaged
        self.__verified = None          # (st_ino, st_size, st_mtime_ns) of the file that last verified
        #: raftq: exit code of the last forked writer that failed (EXIT_EIO, EXIT_ENOSPC, other), or None
        self.lastFailure = None

    def checkSerializing(self):
        # In-memory case
        if self.__fileName is None or not self.__useFork:
            if self.__pid in (-1, -2):
                serializeState = SERIALIZER_STATE.SUCCESS if self.__pid == -1 else SERIALIZER_STATE.FAILED
                self.__pid = 0
                self.__transmissions = {}
                return serializeState, self.__currentID
            return SERIALIZER_STATE.NOT_SERIALIZING, None

        # File case
        pid = self.__pid
        if pid == 0:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        try:
            rpid, status = os.waitpid(pid, os.WNOHANG)
        except OSError:
            self.__pid = 0
            self.lastFailure = None
            return SERIALIZER_STATE.FAILED, self.__currentID
        if rpid == pid:
            if status == 0:
                self.__transmissions = {}
                self.__pid = 0
                return SERIALIZER_STATE.SUCCESS, self.__currentID
            self.__pid = 0
            self.lastFailure = os.waitstatus_to_exitcode(status)
            return SERIALIZER_STATE.FAILED, self.__currentID
        return SERIALIZER_STATE.SERIALIZING, self.__currentID

    def serialize(self, buildDocument, id):
        if self.__pid != 0:
            return

        self.__currentID = id

        # In-memory case
        if self.__fileName is None:
            with BytesIO() as io:
                writeDocument(io, buildDocument(), self.__compressionLevel)
                self.__inMemorySerializedData = io.getvalue()
            self.__pid = -1
            return

        # File case
        if self.__useFork:
            parentPid = os.getpid()
            pid = os.fork()
            if pid != 0:
                self.__pid = pid
                return
            detachForkedChild(parentPid)

        try:
            tmpFile = self.__fileName + '.tmp'
            with open(tmpFile, 'wb') as f:
                writeDocument(f, buildDocument(), self.__compressionLevel)

            atomicReplace(tmpFile, self.__fileName, self.__fsync)
            if self.__useFork:
                os._exit(0)
            else:
                self.__pid = -1
        except Exception as e:
            # raftq: the disk's verdict as the exit status, so the parent can tell a failed disk
            # (fatal) from a full one (the old snapshot and the whole journal are still there).
            code = getattr(e, 'errno', None)
            status = EXIT_EIO if code == errno.EIO else EXIT_ENOSPC if code in (errno.ENOSPC, errno.EDQUOT) else 255
            if self.__useFork:
                # raftq: say why (upstream's child exits silently; the parent logs only
                # 'Failed to store full dump').
                try:
                    logger.exception('failed to write the full dump')
                finally:
                    os._exit(status)
            else:
                logger.exception('failed to write the full dump')
                self.lastFailure = status
                self.__pid = -2

    def __rawFile(self):
        if self.__fileName is None:
            return BytesIO(self.__inMemorySerializedData)
        return open(self.__fileName, 'rb')

    def verify(self):
        """raftq: what is wrong with this node's snapshot (None: it verifies, or there is none)."""
        if self.__fileName is None:
            if self.__inMemorySerializedData is None:
                return None
            return verifyFile(BytesIO(self.__inMemorySerializedData))
        if not os.path.exists(self.__fileName):
            return None
        return verifyPath(self.__fileName)

    def __verifiedForSending(self):
        """The node's own file verifies (checked once per version of the file)."""
        if self.__fileName is None:
            return self.verify() is None
        try:
            st = os.stat(self.__fileName)
        except OSError:
            return False
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self.__verified == key:
            return True
        problem = verifyPath(self.__fileName)
        if problem is None:
            self.__verified = key
            return True
        logger.critical('disk check: snapshot_damaged in %s: %s; not sending it', self.__fileName, problem)
        if self.__onDamaged is not None:
            self.__onDamaged('snapshot_damaged', problem)
        return False

    def deserialize(self):
        """The snapshot as a document (see SNAPSHOT_FORMAT); one in upstream's format is read
        through the legacy unpickler and upgraded."""
        try:
            with self.__rawFile() as f, openDocument(f) as g:
                doc = pickle.loadBuiltins(g)
        except pickle.GlobalRefused:
            if self.__upgradeLegacy is None:
                raise
            with self.__rawFile() as f, openDocument(f) as g:
                old = _LegacyUnpickler(g, self.__legacyClasses).load()
            doc = self.__upgradeLegacy(old)
            logger.info('read a snapshot in the legacy (pickled objects) format')
        if not isinstance(doc, dict) or doc.get('format') != SNAPSHOT_FORMAT:
            raise ValueError('not a raftq snapshot')
        if doc.get('version') != SNAPSHOT_VERSION:
            raise ValueError('unknown snapshot version %r' % (doc.get('version'),))
        return doc

    def getTransmissionData(self, transmissionID):
        if self.__pid != 0:
            return None
        transmission = self.__transmissions.get(transmissionID, None)
        if transmission is None:
            # raftq: never send a snapshot that does not verify
            if not self.__verifiedForSending():
                return None
            try:
                if self.__fileName is None:
                    data = self.__inMemorySerializedData
                    assert data is not None
                    self.__transmissions[transmissionID] = transmission = {
                        'transmitted': 0,
                        'data': data,
                    }
                else:
                    self.__transmissions[transmissionID] = transmission = {
                        'file': open(self.__fileName, 'rb'),
                        'transmitted': 0,
                    }
            except:
                logger.exception('Failed to open file for transmission')
                self.__transmissions.pop(transmissionID, None)
                return None
        isFirst = transmission['transmitted'] == 0
        try:
            if self.__fileName is None:
                transmitted = transmission['transmitted']
                data = transmission['data'][transmitted:transmitted + self.__transmissionBatchSize]
            else:
                data = transmission['file'].read(self.__transmissionBatchSize)
        except:
            logger.exception('Error reading transmission file')
            self.__transmissions.pop(transmissionID, None)
            return False
        size = len(data)
        transmission['transmitted'] += size
        isLast = size == 0
        if isLast:
            self.__transmissions.pop(transmissionID, None)
        return data, isFirst, isLast

    def setTransmissionData(self, data):
        if data is None:
            return False
        data, isFirst, isLast = data

        # In-memory case
        if self.__fileName is None:
            if isFirst:
                self.__incomingTransmissionFile = bytes()
            elif self.__incomingTransmissionFile is None:
                return False
            self.__incomingTransmissionFile += pickle.to_bytes(data)
            if isLast:
                received, self.__incomingTransmissionFile = self.__incomingTransmissionFile, None
                problem = verifyFile(BytesIO(received))
                if problem is not None:
                    self.__receivedDamaged(problem)
                    return False
                self.__inMemorySerializedData = received
                return True
            return False

        # File case. raftq: a failed write of the received file is a StorageFailure, as every
        # write is (upstream logged it and went on).
        tmpFile = self.__fileName + '.1.tmp'
        if isFirst:
            if self.__incomingTransmissionFile is not None:
                self.__incomingTransmissionFile.close()
            try:
                self.__incomingTransmissionFile = open(tmpFile, 'wb')
            except OSError as e:
                self.__incomingTransmissionFile = None
                raise StorageFailure(tmpFile, 'create', e)
        elif self.__incomingTransmissionFile is None:
            return False
        try:
            self.__incomingTransmissionFile.write(data)
        except OSError as e:
            self.__incomingTransmissionFile = None
            raise StorageFailure(tmpFile, 'write', e)
        if isLast:
            try:
                self.__incomingTransmissionFile.close()
            except OSError as e:
                raise StorageFailure(tmpFile, 'write', e)
            finally:
                self.__incomingTransmissionFile = None
            # raftq: verified before it replaces the node's own snapshot
            problem = verifyPath(tmpFile)
            if problem is not None:
                self.__receivedDamaged(problem)
                try:
                    os.unlink(tmpFile)
                except OSError:
                    pass
                return False
            atomicReplace(tmpFile, self.__fileName, self.__fsync)
            return True
        return False

    def __receivedDamaged(self, problem):
        logger.critical('disk check: snapshot_received_damaged: the snapshot received from the leader %s; '
                        'dropped, the leader sends it again', problem)
        if self.__onDamaged is not None:
            self.__onDamaged('snapshot_received_damaged', problem)

    def cancelTransmisstion(self, id):
        self.__transmissions.pop(id, None)
