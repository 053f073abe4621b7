import os
import gzip
import logging
import pickle as stdpickle
from . import pickle

from io import BytesIO
from .config import SERIALIZER_STATE
from .journal import fsyncDir

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


def atomicReplace(oldPath, newPath, fsync=False):
    """os.replace; raftq: with `fsync` the file is synced before the rename and its directory
    after it. Upstream renames without any sync, then compacts the journal: a power cut after the
    compacted journal reached the disk but before the snapshot did would lose committed entries."""
    if fsync:
        fd = os.open(oldPath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(oldPath, newPath)
    if fsync:
        fsyncDir(os.path.dirname(newPath))


class Serializer(object):
    """raftq: `fsync` syncs snapshots around their rename (fsync durability); `compressionLevel`
    is gzip's; `legacyClasses` and `upgradeLegacy(old) -> document` read snapshots in upstream's
    format (see above). serialize() takes a function that builds the document: it runs in the
    forked child, off the tick thread."""

    def __init__(self, fileName, transmissionBatchSize, tryUseFork, fsync=False, compressionLevel=1,
                 legacyClasses=(), upgradeLegacy=None):
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
            return SERIALIZER_STATE.FAILED, self.__currentID
        if rpid == pid:
            if status == 0:
                self.__transmissions = {}
                self.__pid = 0
                return SERIALIZER_STATE.SUCCESS, self.__currentID
            self.__pid = 0
            return SERIALIZER_STATE.FAILED, self.__currentID
        return SERIALIZER_STATE.SERIALIZING, self.__currentID

    def serialize(self, buildDocument, id):
        if self.__pid != 0:
            return

        self.__currentID = id

        # In-memory case
        if self.__fileName is None:
            with BytesIO() as io:
                with gzip.GzipFile(fileobj=io, mode='wb', compresslevel=self.__compressionLevel) as g:
                    pickle.dumpBuiltins(buildDocument(), g)
                self.__inMemorySerializedData = io.getvalue()
            self.__pid = -1
            return

        # File case
        if self.__useFork:
            pid = os.fork()
            if pid != 0:
                self.__pid = pid
                return

        try:
            tmpFile = self.__fileName + '.tmp'
            with open(tmpFile, 'wb') as f:
                with gzip.GzipFile(fileobj=f, mode='wb', compresslevel=self.__compressionLevel) as g:
                    pickle.dumpBuiltins(buildDocument(), g)

            atomicReplace(tmpFile, self.__fileName, self.__fsync)
            if self.__useFork:
                os._exit(0)
            else:
                self.__pid = -1
        except Exception as e:
            if self.__useFork:
                # raftq: say why (upstream's child exits silently; the parent logs only
                # 'Failed to store full dump').
                try:
                    logger.exception('failed to write the full dump')
                finally:
                    os._exit(-1)
            else:
                logger.exception('failed to write the full dump')
                self.__pid = -2

    def __open(self):
        if self.__fileName is None:
            return gzip.GzipFile(fileobj=BytesIO(self.__inMemorySerializedData), mode='rb')
        return gzip.open(self.__fileName, 'rb')

    def deserialize(self):
        """The snapshot as a document (see SNAPSHOT_FORMAT); one in upstream's format is read
        through the legacy unpickler and upgraded."""
        try:
            with self.__open() as g:
                doc = pickle.loadBuiltins(g)
        except pickle.GlobalRefused:
            if self.__upgradeLegacy is None:
                raise
            with self.__open() as g:
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
                self.__inMemorySerializedData = self.__incomingTransmissionFile
                self.__incomingTransmissionFile = None
                return True
            return False

        # File case
        tmpFile = self.__fileName + '.1.tmp'
        if isFirst:
            if self.__incomingTransmissionFile is not None:
                self.__incomingTransmissionFile.close()
            try:
                self.__incomingTransmissionFile = open(tmpFile, 'wb')
            except:
                logger.exception('Failed to open file for incoming transition')
                self.__incomingTransmissionFile = None
                return False
        elif self.__incomingTransmissionFile is None:
            return False
        try:
            self.__incomingTransmissionFile.write(data)
        except:
            logger.exception('Failed to write incoming transition data')
            self.__incomingTransmissionFile = None
            return False
        if isLast:
            self.__incomingTransmissionFile.close()
            self.__incomingTransmissionFile = None
            try:
                atomicReplace(tmpFile, self.__fileName, self.__fsync)
            except:
                logger.exception('Failed to rename temporary incoming transition file')
                return False
            return True
        return False

    def cancelTransmisstion(self, id):
        self.__transmissions.pop(id, None)
