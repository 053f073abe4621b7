import time
import random
import os
import sys
import threading
import weakref
import collections
import functools
import struct
import logging
import copy
import types
import errno
import queue as Queue

from . import pickle
from .dns_resolver import globalDnsResolver
from .poller import createPoller
from .pipe_notifier import PipeNotifier
from .serializer import Serializer, SERIALIZER_STATE, SNAPSHOT_FORMAT, SNAPSHOT_VERSION, LegacyObject, \
    EXIT_EIO, EXIT_ENOSPC, verifyPath
from .node import Node, TCPNode
from .transport import Transport, TCPTransport, TransportNotReadyError
from .journal import createJournal, StorageFailure
from .config import SyncObjConf, FAIL_REASON
from .encryptor import HAS_CRYPTO, getEncryptor
from .version import VERSION
from .fast_queue import FastQueue

monotonicTime = time.monotonic
perfCounter = time.perf_counter

logger = logging.getLogger(__name__)

# raftq: committed entries are applied in slices (see __applyLogEntries).
APPLY_CHUNK = 16            # entries applied between two checks of the time budget
APPLY_BUDGET_S = 0.02       # at most this much applying per tick, then the network gets a turn
APPLY_MAX_ENTRIES = 4096    # entries fetched from the log per tick


class _RAFT_STATE:
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2

class _COMMAND_TYPE:
    REGULAR = 0
    NO_OP = 1
    MEMBERSHIP = 2
    VERSION = 3

_bchr = functools.partial(struct.pack, 'B')


class SyncObjException(Exception):
    def __init__(self, errorCode, *args, **kwargs):
        Exception.__init__(self, errorCode, *args, **kwargs)
        self.errorCode = errorCode

class SyncObjExceptionWrongVer(SyncObjException):
    def __init__(self, ver):
        SyncObjException.__init__(self, 'wrongVer')
        self.ver = ver

class SyncObjConsumer(object):
    def __init__(self):
        self._syncObj = None
        self.__properies = set()
        for key in self.__dict__:
            self.__properies.add(key)

    def _destroy(self):
        self._syncObj = None

    def _serialize(self):
        # raftq: runs in the forked snapshot child; what it returns must be builtins only
        # (serializer.py: the snapshot is written by a pickler that refuses anything else).
        return dict([(k, v) for k, v in self.__dict__.items() if k not in self.__properies])

    def _deserialize(self, data):
        for k, v in data.items():
            self.__dict__[k] = v

    # raftq: reading a snapshot in upstream's format (pickled objects, serializer.py).
    #: (module, class name) pairs that such a snapshot of this consumer may name; each becomes
    #: a serializer.LegacyObject, every other global is refused.
    _legacySnapshotClasses = ()

    def _upgradeLegacySnapshot(self, data):
        """This consumer's part of a legacy snapshot (its pickled attributes, with legacy
        objects in it) -> what _deserialize takes."""
        return data


# https://github.com/bakwc/PySyncObj

class SyncObj(object):
    def __init__(self, selfNode, otherNodes, conf=None, consumers=None, nodeClass = TCPNode, transport = None, transportClass = TCPTransport):
        """
        Main SyncObj class, you should inherit your own class from it.

        :param selfNode: object representing the self-node or address of the current node server 'host:port'
        :type selfNode: Node or str
        :param otherNodes: objects representing the other nodes or addresses of partner nodes ['host1:port1', 'host2:port2', ...]
        :type otherNodes: iterable of Node or iterable of str
        :param conf: configuration object
        :type conf: SyncObjConf
        :param consumers: objects to be replicated
        :type consumers: list of SyncObjConsumer inherited objects
        :param nodeClass: class used for representation of nodes
        :type nodeClass: class
        :param transport: transport object; if None, transportClass is used to initialise such an object
        :type transport: Transport or None
        :param transportClass: the Transport subclass to be used for transferring messages to and from other nodes
        :type transportClass: class
        """

        if conf is None:
            self.__conf = SyncObjConf()
        else:
            self.__conf = conf

        self.__conf.validate()

        if self.__conf.password is not None:
            if not HAS_CRYPTO:
                raise ImportError("Please install 'cryptography' module")
            self.__encryptor = getEncryptor(self.__conf.password)
        else:
            self.__encryptor = None

        consumers = consumers or []
        newConsumers = []
        for c in consumers:
            if not isinstance(c, SyncObjConsumer) and getattr(c, '_consumer', None):
                c = c._consumer()
            if not isinstance(c, SyncObjConsumer):
                raise SyncObjException('Consumers must be inherited from SyncObjConsumer')
            newConsumers.append(c)
        consumers = newConsumers

        self.__consumers = consumers

        origSelfNode = selfNode
        if not isinstance(selfNode, Node) and selfNode is not None:
            selfNode = nodeClass(selfNode)
        self.__selfNode = selfNode
        self.__otherNodes = set() # set of Node
        for otherNode in otherNodes:
            if otherNode == origSelfNode:
                continue
            if not isinstance(otherNode, Node):
                otherNode = nodeClass(otherNode)
            self.__otherNodes.add(otherNode)
        self.__readonlyNodes = set() # set of Node
        self.__connectedNodes = set() # set of Node
        self.__nodeClass = nodeClass

        self.__raftState = _RAFT_STATE.FOLLOWER
        self.__raftCurrentTerm = 0
        self.__votedForNodeId = None
        self.__votesCount = 0
        self.__raftLeader = None
        self.__raftElectionDeadline = monotonicTime() + self.__generateRaftTimeout()
        # Set while a leadership transfer (Raft 'TimeoutNow') is pending, to stop
        # the outgoing leader's heartbeats from postponing the forced election.
        self.__transferInProgress = False
        # raftq: until when a leader that sent TimeoutNow appends no new command (transferLeadership)
        self.__transferPauseUntil = 0.0
        # raftq: PreVote and CheckQuorum (see __startPreVote, __checkQuorum)
        self.__preVoteTerm = None           # the term a pre-vote in progress asks for
        self.__preVoters = set()            # who granted it (a set: a late answer of an earlier round counts once)
        self.__lastLeaderContact = 0.0      # when a leader of this term was last heard (monotonic)
        self.__lastPollEnd = monotonicTime()    # when the last round of message handling ended
        # raftq (set before the replicated methods are enumerated: dir() reads the properties)
        self.__sentIndex = 0        # the last index the leader's tick sent (see _onTick)
        self.__commitUntold = False  # the leader's commit index moved since its last append (see _onTick)
        self.__commitWantedBy = set()   # followers that asked to learn a moved commit index at once
        self.__raftView = None      # (raft state, term) between two rounds of message handling
        # raftq: when each of the leader's own proposals (an entry with a local callback) was
        # appended, synced and committed ([appended, synced, committed], perf_counter), for the
        # per-stage commit latency (node/replication/proposer.py). `entryStages` is the entry's stamps while
        # its callbacks run on this thread (None for other entries). Cleared on leaving leadership.
        self.__stages = {}
        self.__stagesUnsynced = []
        self.__stagesUncommitted = collections.deque()      # (idx, stamps) in index order
        self.entryStages = None
        self.__thread = None
        #: Whether anyone on this node waits for the result of the entry being applied (a
        #: callback was registered when it was proposed); consumers may skip rendering results
        #: nobody reads. Set by __applyLogEntries for each entry.
        self.answerWanted = True
        self.__raftLog = createJournal(self.__conf.journalFile, self.__conf.durability == 'fsync',
                                       self.__conf.journalObserver, self.__conf.journalMemoryBytes)
        # raftq: what the journal found wrong with its files, and the snapshot's own check
        # (__checkDisk); acted on below, once the term and the commit index are read.
        self.__diskFindings = self.__checkDisk()
        if len(self.__raftLog) == 0:
            self.__raftLog.add(_bchr(_COMMAND_TYPE.NO_OP), 1, self.__raftCurrentTerm)
        # Restore raft persistent state (see raft paper §5 - currentTerm and votedFor
        # must survive restarts, otherwise already-committed entries may be overwritten
        # by a stale member after a simultaneous restart of the cluster). The max() with
        # the last log term covers journals written by versions that did not store the
        # term: currentTerm is always >= the term of the last log entry.
        self.__raftCurrentTerm = max(self.__raftLog.getCurrentTerm(), self.__getCurrentLogTerm())
        self.__votedForNodeId = self.__raftLog.getVotedForNodeId()
        # raftq: in memory durability a restarted node starts with the commit index unknown
        # (Raft's commitIndex is volatile state) instead of the one it stored. Upstream applies
        # its journal up to the stored index as soon as it starts, before it hears from any
        # leader. That is safe only if the entries it covers are on disk on a majority; in
        # memory durability, after the power loss of a majority, they may be on no other disk:
        # the node applied entries that the new leader does not have, then had to truncate them
        # ('truncating already-applied log entries', a state machine that differs from the
        # others' until it restarts; the chaos power-loss fault found it in every memory-mode
        # run). With the index unknown, a restarted node applies only what the current leader
        # reports committed, so after a power cut every replica loses the same writes. (Its
        # snapshot, if any, is loaded as before.)
        if self.__conf.durability == 'fsync':
            self.__raftCommitIndex = self.__raftLog.getRaftCommitIndex()
        else:
            self.__raftCommitIndex = 1
        self.__unverified = self.__judgeDisk()
        self.__raftLastApplied = 1
        self.__raftNextIndex = {}
        self.__lastResponseTime = {}
        self.__raftMatchIndex = {}
        self.__lastSerializedTime = monotonicTime()
        self.__lastSerializedEntry = None
        self.__forceLogCompaction = False
        self.__leaderCommitIndex = None
        self.__onReadyCalled = False
        self.__changeClusterIDx = None
        self.__noopIDx = None
        # raftq: online membership change (FORK.md "Membership")
        self.__memberInfo = dict(self.__conf.memberInfo or {})  # raft address -> builtins (raftq: id, url)
        self.__learners = {}            # leader: node -> when it began catching up (not a member yet)
        self.__learnerRequests = collections.deque()   # ('add' | 'drop', address), from any thread
        self.__departing = {}           # leader: removed node -> [removal index, since, when told it is committed]
        self.__removed = False          # this node's own removal was applied (committed)
        self.__destroying = False
        self.__recvTransmission = ''

        self.__onTickCallbacks = []
        self.__onTickCallbacksLock = threading.Lock()

        self.__startTime = monotonicTime()
        self.__numOneSecondDumps = 0
        globalDnsResolver().setTimeouts(self.__conf.dnsCacheTime, self.__conf.dnsFailCacheTime)
        globalDnsResolver().setPreferredAddrFamily(self.__conf.preferredAddrType)
        self.__serializer = Serializer(self.__conf.fullDumpFile,
                                       self.__conf.logCompactionBatchSize,
                                       self.__conf.useFork,
                                       self.__conf.durability == 'fsync',
                                       self.__conf.snapshotCompressionLevel,
                                       [c for consumer in consumers for c in consumer._legacySnapshotClasses],
                                       self.__upgradeLegacySnapshot,
                                       self.__onSnapshotDamaged)
        self.__lastInitTryTime = 0
        self._poller = createPoller(self.__conf.pollerType)

        if transport is not None:
            self.__transport = transport
        else:
            self.__transport = transportClass(self, self.__selfNode, self.__otherNodes)
        self.__transport.setOnNodeConnectedCallback(self.__onNodeConnected)
        self.__transport.setOnNodeDisconnectedCallback(self.__onNodeDisconnected)
        self.__transport.setOnMessageReceivedCallback(self.__onMessageReceived)
        self.__transport.setOnReadonlyNodeConnectedCallback(self.__onReadonlyNodeConnected)
        self.__transport.setOnReadonlyNodeDisconnectedCallback(self.__onReadonlyNodeDisconnected)

        self._methodToID = {}
        self._idToMethod = {}
        self._idToConsumer = {}

        methods = [m for m in dir(self) if callable(getattr(self, m)) and \
                   getattr(getattr(self, m), 'replicated', False) and \
                   m != getattr(getattr(self, m), 'origName')]
        currMethodID = 0
        self.__selfCodeVersion = 0
        self.__currentVersionFuncNames = {}

        methodsToEnumerate = []

        for method in methods:
            ver = getattr(getattr(self, method), 'ver')
            methodsToEnumerate.append((ver, 0, method, self))

        for consumerNum, consumer in enumerate(consumers):
            consumerMethods = [m for m in dir(consumer) if callable(getattr(consumer, m)) and\
                               getattr(getattr(consumer, m), 'replicated', False) and \
                               m != getattr(getattr(consumer, m), 'origName')]
            for method in consumerMethods:
                ver = getattr(getattr(consumer, method), 'ver')
                methodsToEnumerate.append((ver, consumerNum + 1, method, consumer))
            consumer._syncObj = self

        for ver, _, method, obj in sorted(methodsToEnumerate):
            self.__selfCodeVersion = max(self.__selfCodeVersion, ver)
            if obj is self:
                self._methodToID[method] = currMethodID
            else:
                self._methodToID[(id(obj), method)] = currMethodID
            self._idToMethod[currMethodID] = getattr(obj, method)
            currMethodID += 1

        self.__onSetCodeVersion(0)

        self.__thread = None
        self.__mainThread = None
        self.__initialised = None
        self.__commandsQueue = FastQueue(self.__conf.commandsQueueSize)
        # raftq: also in batch mode (see _applyCommand).
        self.__pipeNotifier = PipeNotifier(self._poller)
        self.__kicked = False
        self.__needLoadDumpFile = True

        self.__lastReadonlyCheck = 0
        self.__newAppendEntriesTime = 0

        self.__commandsWaitingCommit = collections.defaultdict(list)  # logID => [(termID, callback), ...]
        self.__commandsLocalCounter = 0
        self.__commandsWaitingReply = {}  # commandLocalCounter => callback

        self.__enabledCodeVersion = 0

        if self.__conf.autoTick:
            self.__mainThread = threading.current_thread()
            self.__initialised = threading.Event()
            self.__thread = threading.Thread(target=SyncObj._autoTickThread, args=(weakref.proxy(self),))
            self.__thread.start()
            self.__initialised.wait()
            # while not self.__initialised.is_set():
            #     pass
        else:
            try:
                while not self.__transport.ready:
                    self.__transport.tryGetReady()
            except TransportNotReadyError:
                logger.exception('failed to perform initialization')
                raise SyncObjException('BindError') # Backwards compatibility

    def destroy(self):
        """
        Correctly destroy SyncObj. Stop autoTickThread, close connections, etc.
        """
        if self.__conf.autoTick:
            self.__destroying = True
        else:
            self._doDestroy()

    def tick_thread_alive(self):
        """
        Check if the tick thread is alive.
        """
        if self.__thread and self.__thread.is_alive():
            return True
        return False

    def destroy_synchronous(self):
        """
        Correctly destroy SyncObj. Stop autoTickThread, close connections, etc. and ensure the threads are gone.
        """
        self.destroy()
        self.__thread.join()

    def waitReady(self):
        """
        Waits until the transport is ready for operation.

        :raises TransportNotReadyError: if the transport fails to get ready
        """
        self.__transport.waitReady()

    def waitBinded(self):
        """
        Waits until initialized (binded port).
        If success - just returns.
        If failed to initialized after conf.maxBindRetries - raise SyncObjException.
        """
        try:
            self.__transport.waitReady()
        except TransportNotReadyError:
            raise SyncObjException('BindError')
        if not self.__transport.ready:
            raise SyncObjException('BindError')

    def _destroy(self):
        self.destroy()

    def _doDestroy(self):
        self.__transport.destroy()
        for consumer in self.__consumers:
            consumer._destroy()
        self.__raftLog._destroy()

    def getCodeVersion(self):
        return self.__enabledCodeVersion

    def setCodeVersion(self, newVersion, callback = None):
        """Switch to a new code version on all cluster nodes. You
        should ensure that cluster nodes are updated, otherwise they
        won't be able to apply commands.

        :param newVersion: new code version
        :type int
        :param callback: will be called on success or fail
        :type callback: function(`FAIL_REASON <#pysyncobj.FAIL_REASON>`_, None)
        """
        assert isinstance(newVersion, int)
        if newVersion > self.__selfCodeVersion:
            raise Exception('wrong version, current version is %d, requested version is %d' % (self.__selfCodeVersion, newVersion))
        if newVersion < self.__enabledCodeVersion:
            raise Exception('wrong version, enabled version is %d, requested version is %d' % (self.__enabledCodeVersion, newVersion))
        self._applyCommand(pickle.dumps(newVersion), callback, _COMMAND_TYPE.VERSION)

    def addNodeToCluster(self, node, callback = None, info = None):
        """Add single node to cluster (dynamic membership changes). Async.
        You should wait until node successfully added before adding
        next node.

        :param node: node object or 'nodeHost:nodePort'
        :type node: Node | str
        :param callback: will be called on success or fail
        :type callback: function(`FAIL_REASON <#pysyncobj.FAIL_REASON>`_, None)
        """
        if not self.__conf.dynamicMembershipChange:
            raise Exception('dynamicMembershipChange is disabled')
        if not isinstance(node, Node):
            node = self.__nodeClass(node)
        # raftq: the address rather than the node object (a journal of builtins), and the
        # member's info (memberInfo) as a fourth element
        self._applyCommand(pickle.dumps(self.__membershipRequest('add', node, info)), callback, _COMMAND_TYPE.MEMBERSHIP)

    def removeNodeFromCluster(self, node, callback = None, info = None):
        """Remove single node from cluster (dynamic membership changes). Async.
        You should wait until node successfully added before adding
        next node.

        :param node: node object or 'nodeHost:nodePort'
        :type node: Node | str
        :param callback: will be called on success or fail
        :type callback: function(`FAIL_REASON <#pysyncobj.FAIL_REASON>`_, None)
        """
        if not self.__conf.dynamicMembershipChange:
            raise Exception('dynamicMembershipChange is disabled')
        if not isinstance(node, Node):
            node = self.__nodeClass(node)
        self._applyCommand(pickle.dumps(self.__membershipRequest('rem', node, info)), callback, _COMMAND_TYPE.MEMBERSHIP)

    @staticmethod
    def __membershipRequest(kind, node, info):
        request = [kind, node.id, node.id]
        if info is not None:
            request.append(dict(info))
        return request

    # raftq: learners (Raft thesis §4.2.1, "catching up new servers"). Upstream counts a new
    # member toward the majority as soon as its 'add' is appended, with nothing of the log: a
    # leader of three that adds an empty fourth needs three of four for every commit while the
    # new node receives the snapshot, so one more failure stops all writes. A learner is sent
    # the log like a member but neither counts nor votes; the caller proposes the 'add' once its
    # match index is close to the leader's log (learnerMatchIndex), and the add keeps its link
    # and indices. Requests are queued here and carried out by the tick thread.
    def addLearner(self, address):
        self.__learnerRequests.append(('add', address))
        self.__pipeNotifier.notify()

    def dropLearner(self, address):
        self.__learnerRequests.append(('drop', address))
        self.__pipeNotifier.notify()

    def learnerMatchIndex(self, address):
        """The match index of the learner at `address` on this leader, or None when it is none."""
        node = self.__nodeClass(address)
        if node not in self.__learners:
            return None
        return self.__raftMatchIndex.get(node, 0)

    def __handleLearnerRequests(self):
        while self.__learnerRequests:
            kind, address = self.__learnerRequests.popleft()
            node = self.__nodeClass(address)
            if kind == 'add':
                if self.__raftState != _RAFT_STATE.LEADER or node == self.__selfNode or \
                        node in self.__otherNodes or node in self.__learners or node in self.__departing:
                    continue
                self.__learners[node] = monotonicTime()
                self.__raftNextIndex[node] = self.__getCurrentLogIndex() + 1
                self.__raftMatchIndex[node] = 0
                self.__lastResponseTime[node] = monotonicTime()
                self.__transport.addNode(node)
            elif node in self.__learners:
                self.__dropOutsider(node)

    def __dropOutsider(self, node):
        """Stop replicating to a learner or a departing member (neither is a member)."""
        self.__learners.pop(node, None)
        self.__departing.pop(node, None)
        if node in self.__otherNodes:
            return
        self.__raftNextIndex.pop(node, None)
        self.__raftMatchIndex.pop(node, None)
        self.__lastResponseTime.pop(node, None)
        self.__serializer.cancelTransmisstion(node)
        self.__transport.dropNode(node)

    def __tickDeparting(self):
        """raftq: a removed member is told its removal is committed before the leader stops
        replicating to it (Raft keeps sending to it until then). Upstream dropped it when the
        'rem' was appended: it never received its own removal, and sat there believing it was
        a member, refused by every peer. Dropped once it acknowledged an append that carried a
        commit index covering its removal, or after departingTimeout."""
        now = monotonicTime()
        for node, (idx, since, told) in list(self.__departing.items()):
            # (an answer well after the telling append went out: to that append or a later one)
            if told is not None and self.__lastResponseTime.get(node, 0) > told + 5 * self.__conf.appendEntriesPeriod and \
                    self.__raftMatchIndex.get(node, 0) >= idx:
                self.__dropOutsider(node)
            elif now - since > self.__conf.departingTimeout:
                logger.warning('removed member %s did not acknowledge its removal within %.0f s: no longer '
                               'replicating to it', node.id, self.__conf.departingTimeout)
                self.__dropOutsider(node)

    @property
    def membership(self):
        """raftq: the members in force (this node included unless it was removed): address ->
        info (memberInfo; {} when none is known)."""
        nodes = set(self.__otherNodes)
        if self.__selfNode is not None and not self.__removed:
            nodes.add(self.__selfNode)
        return {node.id: dict(self.__memberInfo.get(node.id) or {}) for node in nodes}

    @property
    def removedFromCluster(self):
        """raftq: this node applied its own removal (a committed 'rem' of it)."""
        return self.__removed

    @property
    def membershipChangePending(self):
        """raftq: on the leader, whether a change would be refused now: the last one is not
        applied yet, or this leader's no-op is not (an earlier leader's change may be pending)."""
        if self.__noopIDx is None or self.__raftLastApplied < self.__noopIDx:
            return True
        return self.__changeClusterIDx is not None and self.__raftLastApplied < self.__changeClusterIDx

    @property
    def raftLastLogIndex(self):
        """raftq: the index of this node's last log entry."""
        return self.__getCurrentLogIndex()

    def __membershipChanged(self):
        callback = self.__conf.onMembershipChanged
        if callback is not None:
            try:
                callback()
            except Exception:
                logger.exception('onMembershipChanged failed')

    def transferLeadership(self, node=None, callback=None):
        """Gracefully transfer raft leadership to another node (Raft 'TimeoutNow').

        Must be called on the current leader. The target node must be fully
        caught up (matchIndex == leader's last log index), otherwise the
        request is denied. If node is None, the most caught-up connected
        follower is selected automatically. Async and best-effort: a
        successful callback only means the request was sent; poll
        getStatus()['leader'] to confirm the transfer completed.

        :param node: target node object or 'nodeHost:nodePort' (None = auto)
        :type node: Node | str | None
        :param callback: will be called on success or fail
        :type callback: function(`FAIL_REASON <#pysyncobj.FAIL_REASON>`_, None)
        """
        if self.__raftState != _RAFT_STATE.LEADER:
            self.__callErrCallback(FAIL_REASON.NOT_LEADER, callback)
            return
        if node is not None and not isinstance(node, Node):
            node = self.__nodeClass(node)
        if node is None:
            candidates = [(self.__raftMatchIndex.get(n, 0), n.id, n)
                          for n in self.__otherNodes if n in self.__connectedNodes]
            if not candidates:
                self.__callErrCallback(FAIL_REASON.REQUEST_DENIED, callback)
                return
            node = max(candidates)[2]
        if node == self.__selfNode or node not in self.__otherNodes:
            self.__callErrCallback(FAIL_REASON.REQUEST_DENIED, callback)
            return
        if self.__raftMatchIndex.get(node, 0) != self.__getCurrentLogIndex():
            # target is not fully synced - transferring would fail the election
            self.__callErrCallback(FAIL_REASON.REQUEST_DENIED, callback)
            return
        self.__transport.send(node, {
            'type': 'timeout_now',
            'term': self.__raftCurrentTerm,
        })
        # raftq: no new entries while the target stands (Raft thesis §3.10: the leader stops
        # accepting new requests during a transfer). Upstream went on appending, so under load
        # its log was longer than the target's by the time the vote request arrived: it and the
        # followers it had sent the new entries to refused their votes, the target lost, and the
        # old leader was elected again (measured: the leader's removal under load took two
        # transfers and 600 ms without writes). Commands wait in the queue; once the node is a
        # follower they go to the new leader. At most one election timeout, should it fail.
        self.__transferPauseUntil = monotonicTime() + self.__conf.raftMinTimeout
        if callback is not None:
            callback(None, FAIL_REASON.SUCCESS)

    def __onSetCodeVersion(self, newVersion):
        methods = [m for m in dir(self) if callable(getattr(self, m)) and\
                   getattr(getattr(self, m), 'replicated', False) and \
                   m != getattr(getattr(self, m), 'origName')]

        self.__currentVersionFuncNames = {}

        funcVersions = collections.defaultdict(set)
        for method in methods:
            ver = getattr(getattr(self, method), 'ver')
            origFuncName = getattr(getattr(self, method), 'origName')
            funcVersions[origFuncName].add(ver)

        for consumer in self.__consumers:
            consumerID = id(consumer)
            consumerMethods = [m for m in dir(consumer) if callable(getattr(consumer, m)) and \
                               getattr(getattr(consumer, m), 'replicated', False)]
            for method in consumerMethods:
                ver = getattr(getattr(consumer, method), 'ver')
                origFuncName = getattr(getattr(consumer, method), 'origName')
                funcVersions[(consumerID, origFuncName)].add(ver)

        for funcName, versions in funcVersions.items():
            versions = sorted(list(versions))
            for v in versions:
                if v > newVersion:
                    break
                realFuncName = funcName[1] if isinstance(funcName, tuple) else funcName
                self.__currentVersionFuncNames[funcName] = realFuncName + '_v' + str(v)

    def _getFuncName(self, funcName):
        return self.__currentVersionFuncNames[funcName]

    def _applyCommand(self, command, callback, commandType = None):
        try:
            if commandType is None:
                self.__commandsQueue.put_nowait((command, callback))
            else:
                self.__commandsQueue.put_nowait((_bchr(commandType) + command, callback))
            # raftq: event-driven replication. Upstream wakes the tick thread only when not
            # batching; in batch mode a command waited for the next tick (autoTickPeriod) and
            # then for the append-entries timer (appendEntriesPeriod). Now a command wakes the
            # tick thread at once (once per tick: the flag is cleared after the tick appended),
            # and the tick sends the new entries right after appending them (_onTick): tens of
            # ms less per write.
            if not self.__kicked:
                self.__kicked = True
                self.__pipeNotifier.notify()
        except Queue.Full:
            self.__callErrCallback(FAIL_REASON.QUEUE_FULL, callback)

    def _checkCommandsToApply(self):
        startTime = monotonicTime()

        while monotonicTime() - startTime < self.__conf.appendEntriesPeriod:
            if self.__raftLeader is None and self.__conf.commandsWaitLeader:
                break
            if self.__raftState == _RAFT_STATE.LEADER and monotonicTime() < self.__transferPauseUntil:
                break       # raftq: a leadership transfer is under way (transferLeadership)
            try:
                command, callback = self.__commandsQueue.get_nowait()
            except Queue.Empty:
                break

            requestNode, requestID = None, None
            if isinstance(callback, tuple):
                requestNode, requestID = callback

            if self.__raftState == _RAFT_STATE.LEADER:
                idx, term = self.__getCurrentLogIndex() + 1, self.__raftCurrentTerm

                if self.__conf.dynamicMembershipChange:
                    changeClusterRequest = self.__parseChangeClusterRequest(command)
                else:
                    changeClusterRequest = None

                if changeClusterRequest is None or self.__changeCluster(changeClusterRequest):

                    self.__raftLog.add(command, idx, term)
                    if changeClusterRequest is not None:
                        # raftq: upstream never set it, so a second change was accepted while
                        # the first was still uncommitted (two changes in flight: majorities of
                        # the old and the new membership need not overlap).
                        self.__changeClusterIDx = idx

                    if requestNode is None:
                        if callback is not None:
                            self.__commandsWaitingCommit[idx].append((term, callback))
                            stamps = [perfCounter(), 0.0, 0.0]
                            self.__stages[idx] = stamps
                            self.__stagesUnsynced.append(stamps)
                            self.__stagesUncommitted.append((idx, stamps))
                    else:
                        self.__transport.send(requestNode, {
                            'type': 'apply_command_response',
                            'request_id': requestID,
                            'log_idx': idx,
                            'log_term': term,
                        })
                    if not self.__conf.appendEntriesUseBatch:
                        self.__sendAppendEntries()
                else:

                    if requestNode is None:
                        if callback is not None:
                            callback(None, FAIL_REASON.REQUEST_DENIED)
                    else:
                        self.__transport.send(requestNode, {
                            'type': 'apply_command_response',
                            'request_id': requestID,
                            'error': FAIL_REASON.REQUEST_DENIED,
                        })

            elif self.__raftLeader is not None:
                if requestNode is None:
                    message = {
                        'type': 'apply_command',
                        'command': command,
                    }

                    if callback is not None:
                        self.__commandsLocalCounter += 1
                        self.__commandsWaitingReply[self.__commandsLocalCounter] = callback
                        message['request_id'] = self.__commandsLocalCounter

                    self.__transport.send(self.__raftLeader, message)
                else:
                    self.__transport.send(requestNode, {
                        'type': 'apply_command_response',
                        'request_id': requestID,
                        'error': FAIL_REASON.NOT_LEADER,
                    })
            else:
                self.__callErrCallback(FAIL_REASON.MISSING_LEADER, callback)

    def _autoTickThread(self):
        try:
            self.__transport.tryGetReady()
        except TransportNotReadyError:
            logger.exception('failed to perform initialization')
            return
        finally:
            self.__initialised.set()
        time.sleep(0.1)
        try:
            while True:
                # raftq: a destroy asked for is done before the main thread's end is looked at
                # (upstream's order): a process whose main thread returned right after destroy()
                # left with its journal unclosed and the commit index it knew unstored.
                if self.__destroying:
                    self._doDestroy()
                    break
                if not self.__mainThread.is_alive():
                    break
                try:
                    self._onTick(self.__conf.autoTickPeriod)
                except StorageFailure as e:
                    # raftq: never retried (see journal.StorageFailure): the tick thread stops
                    # here, so nothing written since the last good sync is ever acknowledged.
                    self.__storageFailed(e)
                    break
                except Exception:
                    # log, wait a little and retry
                    logger.exception('failed _onTick in _autoTickThread')
                    time.sleep(self.__conf.autoTickPeriod)
        except ReferenceError:
            pass

    def doTick(self, timeToWait=0.0):
        """Performs single tick. Should be called manually if `autoTick <#pysyncobj.SyncObjConf.autoTick>`_ disabled

        :param timeToWait: max time to wait for next tick. If zero - perform single tick without waiting for new events.
            Otherwise - wait for new socket event and return.
        :type timeToWait: float
        """
        assert not self.__conf.autoTick
        self._onTick(timeToWait)

    def _onTick(self, timeToWait=0.0):
        if not self.__transport.ready:
            try:
                self.__transport.tryGetReady()
            except TransportNotReadyError:
                # Implicitly handled in the 'if not self.__transport.ready' below
                pass

        if not self.__transport.ready:
            time.sleep(timeToWait)
            self.__applyLogEntries()
            return

        if self.__needLoadDumpFile:
            if self.__conf.fullDumpFile is not None and os.path.isfile(self.__conf.fullDumpFile):
                if not self.__loadDumpFile(clearJournal=False):
                    # raftq: a snapshot that verified but does not load is not trusted either
                    # (upstream logged it and went on with the compacted journal: an apply that
                    # could never start).
                    self.__discardSnapshotAtStart('the snapshot verifies but does not load (see the error above)')
            self.__needLoadDumpFile = False

        workTime = monotonicTime() - self.__startTime
        if workTime > self.__numOneSecondDumps:
            self.__numOneSecondDumps += 1
            self.__raftLog.onOneSecondTimer()

        if self.__raftState in (_RAFT_STATE.FOLLOWER, _RAFT_STATE.CANDIDATE) and self.__selfNode is not None:
            if self.__raftElectionDeadline < monotonicTime() and self.__connectedToAnyone() and \
                    self.__mayStandForElection():
                self.__raftElectionDeadline = monotonicTime() + self.__generateRaftTimeout()
                if self.__conf.preVote and not self.__transferInProgress:
                    self.__startPreVote()
                else:
                    # A leader's transfer request (TimeoutNow) skips the pre-vote: the leader
                    # itself asked, so nobody is deposed against its will.
                    self.__startElection()

        if self.__raftState == _RAFT_STATE.LEADER:

            commitIdx = self.__raftCommitIndex
            nextCommitIdx = self.__raftCommitIndex

            while commitIdx < self.__getCurrentLogIndex():
                commitIdx += 1
                count = 1
                for node in self.__otherNodes:
                    if self.__raftMatchIndex[node] >= commitIdx:
                        count += 1
                if count <= (len(self.__otherNodes) + 1) / 2:
                    break
                entries = self.__getEntries(commitIdx, 1)
                if not entries:
                    continue
                commitTerm = entries[0][2]
                if commitTerm != self.__raftCurrentTerm:
                    continue
                nextCommitIdx = commitIdx

            if self.__raftCommitIndex != nextCommitIdx:
                self.__raftCommitIndex = nextCommitIdx
                self.__raftLog.setRaftCommitIndex(self.__raftCommitIndex)
                self.__commitUntold = True
                uncommitted = self.__stagesUncommitted
                if uncommitted:
                    now = perfCounter()
                    while uncommitted and uncommitted[0][0] <= nextCommitIdx:
                        uncommitted.popleft()[1][2] = now

            self.__leaderCommitIndex = self.__raftCommitIndex
            self.__lastLeaderContact = monotonicTime()
            self.__checkQuorum()

        # raftq: learners and departing members (membership change)
        if self.__learnerRequests:
            self.__handleLearnerRequests()
        if self.__raftState == _RAFT_STATE.LEADER:
            if self.__departing:
                self.__tickDeparting()
        elif self.__learners or self.__departing:
            for node in list(self.__learners) + list(self.__departing):
                self.__dropOutsider(node)

        needSendAppendEntries = self.__applyLogEntries()

        if self.__raftState == _RAFT_STATE.LEADER:
            if monotonicTime() > self.__newAppendEntriesTime or needSendAppendEntries:
                self.__sendAppendEntries()

        if not self.__onReadyCalled and self.__raftLastApplied == self.__leaderCommitIndex:
            if self.__conf.onReady:
                self.__conf.onReady()
            self.__onReadyCalled = True

        self._checkCommandsToApply()
        self.__tryLogCompaction()

        # raftq: role and term as the tick thread sees them between two rounds of message
        # handling, so the pair belongs together (raftView). And from here on a proposal wakes
        # the tick thread again (_applyCommand): one that arrives while the leader sends and
        # syncs below is appended in the very next tick.
        self.__raftView = (self.__raftState, self.__raftCurrentTerm)
        self.__kicked = False

        if self.__raftState == _RAFT_STATE.LEADER:
            # raftq: send what this tick appended at once (event-driven replication, see
            # _applyCommand), then sync the leader's own copy: its disk write overlaps the
            # followers'. It is still durable before it counts: entries are appended in this
            # tick (_checkCommandsToApply) and the commit index is computed at the start of a
            # later tick, after this sync.
            lastIdx = self.__getCurrentLogIndex()
            if lastIdx > self.__sentIndex:
                self.__sentIndex = lastIdx
                self.__sendAppendEntries()
            elif self.__commitUntold and self.__commitWantedBy:
                # raftq: a follower that asked (SyncObjConf.commitWanted: raftq's long polls are
                # parked on it) learns a moved commit index at once, not with the next heartbeat
                # (appendEntriesPeriod): it applies an entry only once it knows it committed, so
                # a job enqueued anywhere reached a reserve parked on a follower ~30 ms after the
                # enqueue (~5 ms on the leader). Nobody asking, nothing more is sent.
                self.__sendAppendEntries()
            self.__raftLog.sync()
            if self.__stagesUnsynced:
                now = perfCounter()
                for stamps in self.__stagesUnsynced:
                    stamps[1] = now
                self.__stagesUnsynced.clear()
        else:
            self.__sentIndex = 0

        with self.__onTickCallbacksLock:
            for callback in self.__onTickCallbacks:
                callback()

        self._poller.poll(timeToWait)
        self.__lastPollEnd = monotonicTime()

    def __applyLogEntries(self):
        # raftq: upstream applies every committed entry it has not applied yet in one tick and
        # handles no message meanwhile. A node that restarts replays its whole journal that way
        # (53,000 entries after a 10-minute chaos run: 1.3 s on an idle machine, several on a
        # busy one), and so does a follower that catches up after a partition. Meanwhile it
        # answers no heartbeat (a leader that is down another node loses its majority: the chaos
        # run saw a follower kill cost 6-7 s of writes) and, once done, finds its election timer
        # long expired and calls an election (after a kill-all every node does, at once: split
        # votes). So this tick applies for at most APPLY_BUDGET_S (checked every APPLY_CHUNK
        # entries), the rest in the next ticks, messages handled in between.
        commit, last = self.__raftCommitIndex, self.__raftLastApplied
        if commit <= last:
            return False
        waiting = self.__commandsWaitingCommit
        end = monotonicTime() + APPLY_BUDGET_S
        for entry in self.__entriesToApply(last + 1, min(commit, last + APPLY_MAX_ENTRIES), end):
            try:
                currentTermID = entry[2]
                subscribers = waiting.pop(entry[1], [])
                self.answerWanted = bool(subscribers)
                self.entryStages = self.__stages.pop(entry[1], None) if subscribers else None
                res = self.__doApplyCommand(entry[0])
                for subscribeTermID, callback in subscribers:
                    if subscribeTermID == currentTermID:
                        callback(res, FAIL_REASON.SUCCESS)
                    else:
                        callback(None, FAIL_REASON.DISCARDED)

                self.__raftLastApplied += 1
            except SyncObjExceptionWrongVer as e:
                logger.error(
                    'request to switch to unsupported code version (self version: %d, requested version: %d)' %
                    (self.__selfCodeVersion, e.ver))

        return not self.__conf.appendEntriesUseBatch

    def __entriesToApply(self, first, last, end):
        """The entries first..last, fetched APPLY_CHUNK at a time until monotonicTime() passes
        `end` (at least one chunk). raftq: fetched by chunk, not all at once, because entries
        past what the journal holds in memory are read back from its file (journal.FileJournal):
        fetching APPLY_MAX_ENTRIES per tick and applying the few the budget allows read the
        whole unapplied tail back on every tick, quadratic in a restart's replay."""
        idx = first
        while idx <= last:
            chunk = self.__getEntries(idx, min(APPLY_CHUNK, last - idx + 1))
            if not chunk:
                return
            yield from chunk
            idx += len(chunk)
            if monotonicTime() >= end:
                return

    def addOnTickCallback(self, callback):
        with self.__onTickCallbacksLock:
            self.__onTickCallbacks.append(callback)

    def removeOnTickCallback(self, callback):
        with self.__onTickCallbacksLock:
            try:
                self.__onTickCallbacks.remove(callback)
            except ValueError:
                # callback not in list, ignore
                pass

    def isNodeConnected(self, node):
        """
        Checks if the given node is connected
        :param node: node to check
        :type node: Node
        :rtype: bool
        """
        return node in self.__connectedNodes

    @property
    def selfNode(self):
        """
        :rtype: Node
        """
        return self.__selfNode

    @property
    def otherNodes(self):
        """
        :rtype: set of Node
        """
        return self.__otherNodes.copy()

    @property
    def readonlyNodes(self):
        """
        :rtype: set of Node
        """
        return self.__readonlyNodes.copy()

    @property
    def raftLastApplied(self):
        """
        :rtype: int
        """
        return self.__raftLastApplied

    @property
    def raftCommitIndex(self):
        """
        :rtype: int
        """
        return self.__raftCommitIndex

    @property
    def raftCurrentTerm(self):
        """
        :rtype: int
        """
        return self.__raftCurrentTerm

    @property
    def hasQuorum(self):
        '''
        Does the cluster have a quorum according to this node

        :rtype: bool
        '''

        nodes = self.__otherNodes
        node_count = len(nodes)
        # Get number of connected nodes that participate in cluster quorum
        connected_count = len(nodes.intersection(self.__connectedNodes))

        if self.__selfNode is not None:
            # This node participates in cluster quorum
            connected_count += 1
            node_count += 1

        return connected_count > node_count / 2

    def getStatus(self):
        """Dumps different debug info about cluster to dict and return it"""

        status = {}
        status['version'] = VERSION
        status['revision'] = 'deprecated'
        status['self'] = self.selfNode
        status['state'] = self.__raftState
        status['leader'] = self.__raftLeader
        status['has_quorum'] = self.hasQuorum
        status['partner_nodes_count'] = len(self.__otherNodes)
        for node in self.__otherNodes:
            status['partner_node_status_server_' + node.id] = 2 if self.isNodeConnected(node) else 0
        status['readonly_nodes_count'] = len(self.__readonlyNodes)
        for node in self.__readonlyNodes:
            status['readonly_node_status_server_' + node.id] = 2 if self.isNodeConnected(node) else 0
        status['log_len'] = len(self.__raftLog)
        status['last_applied'] = self.raftLastApplied
        status['commit_idx'] = self.raftCommitIndex
        status['raft_term'] = self.raftCurrentTerm
        status['next_node_idx_count'] = len(self.__raftNextIndex)
        for node, idx in self.__raftNextIndex.items():
            status['next_node_idx_server_' + node.id] = idx
        status['match_idx_count'] = len(self.__raftMatchIndex)
        for node, idx in self.__raftMatchIndex.items():
            status['match_idx_server_' + node.id] = idx
        status['leader_commit_idx'] = self.__leaderCommitIndex
        status['uptime'] = int(monotonicTime() - self.__startTime)
        status['self_code_version'] = self.__selfCodeVersion
        status['enabled_code_version'] = self.__enabledCodeVersion
        return status

    def printStatus(self):
        """Dumps different debug info about cluster to default logger"""
        status = self.getStatus()
        for k, v in status.items():
            logger.info('%s: %s' % (str(k), str(v)))

    def _printStatus(self):
        self.printStatus()

    def forceLogCompaction(self):
        """Force to start log compaction (without waiting required time or required number of entries)"""
        self.__forceLogCompaction = True

    def _forceLogCompaction(self):
        self.forceLogCompaction()

    def __doApplyCommand(self, command):
        commandType = ord(command[:1])
        # Skip no-op and membership change commands
        if commandType == _COMMAND_TYPE.VERSION:
            ver = pickle.loads(command[1:])
            if self.__selfCodeVersion < ver:
                raise SyncObjExceptionWrongVer(ver)
            oldVer = self.__enabledCodeVersion
            self.__enabledCodeVersion = ver
            callback = self.__conf.onCodeVersionChanged
            self.__onSetCodeVersion(ver)
            if callback is not None:
                callback(oldVer, ver)
            return

        #  This is required only after node restarts and apply journal
        # for normal case it is already done earlier and calls will be ignored
        clusterChangeRequest = self.__parseChangeClusterRequest(command)
        if clusterChangeRequest is not None:
             self.__doChangeCluster(clusterChangeRequest)
             # raftq: this node's own removal, committed: it is no member any more (upstream
             # ignored a 'rem' of itself and went on as a member nobody talks to)
             if clusterChangeRequest[0] == 'rem' and self.__selfNode is not None and \
                     self.__nodeClass(clusterChangeRequest[1]) == self.__selfNode and not self.__removed:
                 self.__removed = True
                 logger.warning('this node (%s) was removed from the cluster', self.__selfNode.id)
                 self.__membershipChanged()
             return

        if commandType != _COMMAND_TYPE.REGULAR:
            return
        command = pickle.loads(command[1:])
        args = []
        kwargs = {
            '_doApply': True,
        }
        if not isinstance(command, tuple):
            funcID = command
        elif len(command) == 2:
            funcID, args = command
        else:
            funcID, args, newKwArgs = command
            kwargs.update(newKwArgs)

        return self._idToMethod[funcID](*args, **kwargs)

    def __onMessageReceived(self, node, message):

        if message['type'] == 'raftq_keepalive':
            return  # raftq: a link keepalive (transport.py); its arrival is all that counts

        if message['type'] == 'timeout_now' and self.__selfNode is not None:
            # Graceful leadership transfer (Raft 'TimeoutNow'): trigger an
            # immediate election, but only on request of the current leader.
            if message['term'] >= self.__raftCurrentTerm and node == self.__raftLeader and \
                    self.__mayStandForElection():
                self.__raftElectionDeadline = 0
                self.__transferInProgress = True

        if message['type'] in ('request_prevote', 'request_vote') and node not in self.__otherNodes:
            return      # raftq: a learner or a removed node is no voter and elects nobody

        if message['type'] == 'request_prevote' and self.__selfNode is not None:
            self.__onPreVoteRequest(node, message)

        if message['type'] == 'prevote_refused' and message['term'] > self.__raftCurrentTerm:
            self.__onNewerTermRefusal(message['term'])

        if message['type'] == 'response_prevote' and self.__preVoteTerm is not None and \
                message['term'] == self.__preVoteTerm and self.__raftState != _RAFT_STATE.LEADER:
            self.__preVoters.add(node)
            if len(self.__preVoters) + 1 > (len(self.__otherNodes) + 1) / 2:
                self.__startElection()

        if message['type'] == 'request_vote' and self.__selfNode is not None:

            if message['term'] > self.__raftCurrentTerm:
                self.__setCurrentTerm(message['term'], None)
                self.__setState(_RAFT_STATE.FOLLOWER)
                self.__raftLeader = None

            if self.__raftState in (_RAFT_STATE.FOLLOWER, _RAFT_STATE.CANDIDATE):
                lastLogTerm = message['last_log_term']
                lastLogIdx = message['last_log_index']
                if message['term'] >= self.__raftCurrentTerm:
                    if lastLogTerm < self.__getCurrentLogTerm():
                        return
                    if lastLogTerm == self.__getCurrentLogTerm() and \
                            lastLogIdx < self.__getCurrentLogIndex():
                        return
                    if self.__votedForNodeId is not None:
                        return
                    if self.__unverified is not None:
                        return          # raftq: never a vote from a log that is not trusted

                    self.__setCurrentTerm(self.__raftCurrentTerm, node.id)

                    self.__raftElectionDeadline = monotonicTime() + self.__generateRaftTimeout()
                    self.__transport.send(node, {
                        'type': 'response_vote',
                        'term': message['term'],
                    })

        if message['type'] == 'append_entries' and message['term'] >= self.__raftCurrentTerm:
            replyNextIdx = None
            if message.get('entries'):
                # raftq: keep a matching tail (see _skipHeldEntries)
                message, replyNextIdx = self._skipHeldEntries(message)
            if message['term'] > self.__raftCurrentTerm:
                # A new leader at a higher term supersedes any pending transfer.
                self.__transferInProgress = False
            if not self.__transferInProgress:
                # While a transfer is pending, ignore same-term heartbeats from
                # the outgoing leader so they can't postpone the forced election.
                self.__raftElectionDeadline = monotonicTime() + self.__generateRaftTimeout()
            if self.__raftLeader != node:
                self.__onLeaderChanged()
            self.__raftLeader = node
            self.__lastLeaderContact = monotonicTime()
            self.__preVoteTerm = None
            if message['term'] > self.__raftCurrentTerm:
                self.__setCurrentTerm(message['term'], None)
            self.__setState(_RAFT_STATE.FOLLOWER)
            newEntries = message.get('entries', [])
            serialized = message.get('serialized', None)
            self.__leaderCommitIndex = leaderCommitIndex = message['commit_index']
            matched = None          # raftq: the index up to which the leader's log is now ours

            # Regular append entries
            if 'prevLogIdx' in message:
                transmission = message.get('transmission', None)
                if transmission is not None:
                    if transmission == 'start':
                        self.__recvTransmission = message['data']
                        self.__sendNextNodeIdx(node, success=False, reset=False)
                        return
                    elif transmission == 'process':
                        self.__recvTransmission += message['data']
                        self.__sendNextNodeIdx(node, success=False, reset=False)
                        return
                    elif transmission == 'finish':
                        self.__recvTransmission += message['data']
                        newEntries = [pickle.loads(self.__recvTransmission)]
                        self.__recvTransmission = ''
                    else:
                        raise Exception('Wrong transmission type')

                prevLogIdx = message['prevLogIdx']
                prevLogTerm = message['prevLogTerm']
                prevEntries = self.__getEntries(prevLogIdx)
                if not prevEntries:
                    self.__sendNextNodeIdx(node, success=False, reset=True)
                    return
                if prevEntries[0][2] != prevLogTerm:
                    # raftq: back off past the whole conflicting term at once (Raft §5.3's
                    # optimisation). Upstream backed off one entry per round trip: a node that
                    # had led alone for a while (its outgoing traffic cut one way) held thousands
                    # of entries of its own term, and with leaders changing every few seconds the
                    # repair never finished (the chaos run's one-way partitions stalled for good).
                    self.__sendNextNodeIdx(node, nextNodeIdx=self.__conflictStart(prevLogIdx, prevEntries[0][2]),
                                           success=False, reset=True)
                    return
                if len(prevEntries) > 1:
                    # rollback cluster changes
                    if self.__conf.dynamicMembershipChange:
                        for entry in reversed(prevEntries[1:]):
                            clusterChangeRequest = self.__parseChangeClusterRequest(entry[0])
                            if clusterChangeRequest is not None:
                                self.__doChangeCluster(clusterChangeRequest, reverse=True)

                    if prevLogIdx + 1 <= self.__raftLastApplied:
                        logger.critical(
                            'truncating already-applied log entries from index %d '
                            '(last applied: %d) - state machine may have diverged from '
                            'other cluster members', prevLogIdx + 1, self.__raftLastApplied)
                    self.__deleteEntriesFrom(prevLogIdx + 1)
                for entry in newEntries:
                    self.__raftLog.add(*entry)

                # apply cluster changes
                if self.__conf.dynamicMembershipChange:
                    for entry in newEntries:
                        clusterChangeRequest = self.__parseChangeClusterRequest(entry[0])
                        if clusterChangeRequest is not None:
                            self.__doChangeCluster(clusterChangeRequest)

                nextNodeIdx = prevLogIdx + 1
                if newEntries:
                    nextNodeIdx = newEntries[-1][1] + 1
                if replyNextIdx is not None:
                    nextNodeIdx = replyNextIdx

                self.__sendNextNodeIdx(node, nextNodeIdx=nextNodeIdx, success=True)
                matched = nextNodeIdx - 1

            # Install snapshot
            elif serialized is not None:
                if self.__serializer.setTransmissionData(serialized):
                    if self.__loadDumpFile(clearJournal=True):
                        matched = self.__getCurrentLogIndex()
                    self.__sendNextNodeIdx(node, success=True)

            # If the log was truncated below the commit index, don't persist a commit
            # index covering entries that are no longer the committed ones.
            if self.__raftCommitIndex > self.__getCurrentLogIndex():
                self.__raftCommitIndex = self.__getCurrentLogIndex()

            if leaderCommitIndex > self.__raftCommitIndex:
                self.__raftCommitIndex = min(leaderCommitIndex, self.__getCurrentLogIndex())

            self.__raftLog.setRaftCommitIndex(self.__raftCommitIndex)

            if self.__unverified is not None and matched is not None:
                self.__checkCaughtUp(node, matched, leaderCommitIndex)

        if message['type'] == 'apply_command':
            if 'request_id' in message:
                self._applyCommand(message['command'], (node, message['request_id']))
            else:
                self._applyCommand(message['command'], None)

        if message['type'] == 'apply_command_response':
            requestID = message['request_id']
            error = message.get('error', None)
            callback = self.__commandsWaitingReply.pop(requestID, None)
            if callback is not None:
                if error is not None:
                    callback(None, error)
                else:
                    idx = message['log_idx']
                    term = message['log_term']
                    if idx <= self.__raftLastApplied:
                        # Stale apply_command_response:
                        # The log position was already applied (e.g. via snapshot installed after leader reconnect)
                        # before this response was processed. Or the leader was restarted without notice (and remains leader).
                        # The command outcome cannot be tracked; signal the caller so it can retry rather than hanging
                        # forever.
                        callback(None, FAIL_REASON.UNKNOWN_OUTCOME)
                    else:
                        self.__commandsWaitingCommit[idx].append((term, callback))

        if self.__raftState == _RAFT_STATE.CANDIDATE:
            if message['type'] == 'response_vote' and message['term'] == self.__raftCurrentTerm:
                self.__votesCount += 1

                if self.__votesCount > (len(self.__otherNodes) + 1) / 2:
                    self.__onBecomeLeader()

        if self.__raftState == _RAFT_STATE.LEADER:
            if message['type'] == 'next_node_idx' and node in self.__raftMatchIndex:
                # raftq: (not from a node dropped meanwhile: a learner or a departing member)
                reset = message['reset']
                nextNodeIdx = message['next_node_idx']
                success = message['success']
                if message.get('commit_wanted'):        # raftq: see _onTick
                    self.__commitWantedBy.add(node)
                else:
                    self.__commitWantedBy.discard(node)

                currentNodeIdx = nextNodeIdx - 1
                if reset:
                    self.__raftNextIndex[node] = nextNodeIdx
                if success:
                    if self.__raftMatchIndex[node] < currentNodeIdx:
                        self.__raftMatchIndex[node] = currentNodeIdx
                        self.__raftNextIndex[node] = nextNodeIdx
                self.__lastResponseTime[node] = monotonicTime()

    def __callErrCallback(self, err, callback):
        if callback is None:
            return
        if isinstance(callback, tuple):
            requestNode, requestID = callback
            self.__transport.send(requestNode, {
                'type': 'apply_command_response',
                'request_id': requestID,
                'error': err,
            })
            return
        callback(None, err)

    def _skipHeldEntries(self, m):
        """raftq: Raft's follower rule (Figure 2, AppendEntries step 3) deletes existing entries
        only from the first one that *conflicts* with a new one. Upstream instead deletes
        everything after prevLogIdx whenever the follower has more, even when every new entry
        matches. A leader whose nextIndex went stale (a reset reply that arrived late, a cut
        connection, a 1 MB batch) then makes a follower drop entries it had already acknowledged
        and applied, and the follower stays without them until the leader sends them again; were
        the leader to die in between, an election could pass over committed entries (chaos runs
        with connection resets logged 'truncating already-applied log entries').

        So before the append is handled, the entries the follower already holds are cut from it
        (returns the append to handle and the next index to reply with, or None):
        * a conflict at index k: the message starts at k (it truncates from k, as Raft does);
        * no conflict, the log shorter than the message: it starts after the follower's last entry;
        * no conflict, the log as long or longer: it becomes a heartbeat at the follower's last
          entry (nothing truncated), the commit index capped at the message's last entry, and the
          success reply names that entry + 1, as Raft's would (the follower's own tail beyond it
          is not known to match the leader's).
        A mismatching prevLogIdx, a heartbeat or a chunked transmission goes through unchanged."""
        try:
            if 'prevLogIdx' not in m or 'transmission' in m or m['term'] < self.__raftCurrentTerm:
                return m, None
            entries = m['entries']
            prev = m['prevLogIdx']
            last = self.__getCurrentLogIndex()
            if last <= prev:
                return m, None                      # nothing held after prev: nothing to keep
            have = self.__getEntries(prev, len(entries) + 1)
            if not have or have[0][1] != prev or have[0][2] != m['prevLogTerm']:
                return m, None                      # rejected below as upstream does
            skip = 0
            for mine, theirs in zip(have[1:], entries):
                if mine[1] != theirs[1] or mine[2] != theirs[2]:
                    break                           # first conflict: truncate from here
                skip += 1
            if skip == 0:
                return m, None
            if skip < len(entries):
                held = entries[skip - 1]
                return dict(m, prevLogIdx=held[1], prevLogTerm=held[2], entries=entries[skip:]), None
            lastNew = entries[-1][1]
            tail = self.__getEntries(last, 1)
            if not tail or tail[0][1] != last:
                return m, None
            return dict(m, prevLogIdx=last, prevLogTerm=tail[0][2], entries=[],
                        commit_index=min(m['commit_index'], lastNew)), lastNew + 1
        except Exception:                           # never worse than upstream
            return m, None

    def __sendNextNodeIdx(self, node, reset=False, nextNodeIdx = None, success = False):
        if nextNodeIdx is None:
            nextNodeIdx = self.__getCurrentLogIndex() + 1
        if success:
            # raftq: a follower's journal is on disk before it acknowledges entries (fsync
            # durability; the leader syncs in _onTick). Upstream never syncs.
            self.__raftLog.sync()
        message = {
            'type': 'next_node_idx',
            'next_node_idx': nextNodeIdx,
            'reset': reset,
            'success': success,
        }
        wanted = self.__conf.commitWanted
        if wanted is not None and wanted():
            message['commit_wanted'] = True     # raftq: see _onTick (absent: not wanted)
        self.__transport.send(node, message)

    def __generateRaftTimeout(self):
        minTimeout = self.__conf.raftMinTimeout
        maxTimeout = self.__conf.raftMaxTimeout
        return minTimeout + (maxTimeout - minTimeout) * random.random()

    def __onReadonlyNodeConnected(self, node):
        self.__readonlyNodes.add(node)
        self.__connectedNodes.add(node)
        self.__raftNextIndex[node] = self.__getCurrentLogIndex() + 1
        self.__raftMatchIndex[node] = 0

    def __onReadonlyNodeDisconnected(self, node):
        self.__readonlyNodes.discard(node)
        self.__connectedNodes.discard(node)
        self.__raftNextIndex.pop(node, None)
        self.__raftMatchIndex.pop(node, None)
        node._destroy()

    def __onNodeConnected(self, node):
        self.__connectedNodes.add(node)

    def __onNodeDisconnected(self, node):
        self.__connectedNodes.discard(node)

    def __getCurrentLogIndex(self):
        return self.__raftLog[-1][1]

    def __getCurrentLogTerm(self):
        return self.__raftLog[-1][2]

    def __getPrevLogIndexTerm(self, nextNodeIndex):
        prevIndex = nextNodeIndex - 1
        entries = self.__getEntries(prevIndex, 1)
        if entries:
            return prevIndex, entries[0][2]
        return None, None

    def __getEntries(self, fromIDx, count=None, maxSizeBytes = None):
        firstEntryIDx = self.__raftLog[0][1]
        if fromIDx is None or fromIDx < firstEntryIDx:
            return []
        diff = fromIDx - firstEntryIDx
        if maxSizeBytes is not None:
            # raftq: entry by entry up to the size. The journal reads entries past what it holds
            # in memory back from its file (journal.FileJournal), so slicing the whole tail, as
            # upstream did, read a far-behind follower's entire backlog for every batch sent.
            log = self.__raftLog
            end = len(log) if count is None else min(len(log), diff + count)
            result = []
            totalSize = 0
            for i in range(diff, end):
                entry = log[i]
                result.append(entry)
                totalSize += len(entry[0])
                if totalSize >= maxSizeBytes:
                    break
            return result
        if count is None:
            return self.__raftLog[diff:]
        return self.__raftLog[diff:diff + count]

    # raftq: read-only views for the node (node/replication/replica.py), so nothing outside reaches internals.
    @property
    def raftState(self):
        """:rtype: int (_RAFT_STATE)"""
        return self.__raftState

    @property
    def raftView(self):
        """(raft state, term) as one consistent pair, as the tick thread saw them between two
        rounds of message handling, or None before the first tick. Read separately they can mix
        two moments: a leader that hears a higher term sets the term before it steps down (and
        fsyncs it in between), so a reader could see a leader in a term it never led."""
        return self.__raftView

    @property
    def raftElectionDeadline(self):
        """When this node will call an election unless it hears from a leader (monotonic)."""
        return self.__raftElectionDeadline

    @property
    def leaderCommitIndex(self):
        """The commit index the leader last reported (this node's own on the leader), or None."""
        return self.__leaderCommitIndex

    @property
    def tickThread(self):
        """The thread that runs the ticks (None with autoTick off)."""
        return self.__thread

    @property
    def journalSyncs(self):
        """How many times the journal was synced (fsync durability)."""
        return self.__raftLog.syncs

    @property
    def journalHeldBytes(self):
        """raftq: bytes of log commands the journal holds in memory (None: a memory journal)."""
        return getattr(self.__raftLog, 'heldBytes', None)

    @property
    def transportRefusals(self):
        """Connections the transport refused or closed, by reason (transport.REFUSALS), and
        the handshakes under way now ('pending'); {} for a transport without them."""
        t = self.__transport
        refusals = getattr(t, 'refusals', None)
        if refusals is None:
            return {}
        return dict(refusals, pending=t.pendingHandshakes)

    def _isLeader(self):
        """ Check if current node has a leader state.
        WARNING: there could be multiple leaders at the same time!

        :return: True if leader, False otherwise
        :rtype: bool
        """
        return self.__raftState == _RAFT_STATE.LEADER

    def _getLeader(self):
        """ Returns last known leader.

        WARNING: this information could be outdated, eg. there could be another leader selected!
        WARNING: there could be multiple leaders at the same time!

        :return: the last known leader node.
        :rtype: Node
        """
        return self.__raftLeader

    def isReady(self):
        """Check if current node is initially synced with others and has an actual data.

        :return: True if ready, False otherwise
        :rtype: bool
        """
        return self.__onReadyCalled

    def _isReady(self):
        return self.isReady()

    def _getTerm(self):
        return self.__raftCurrentTerm

    def _getRaftLogSize(self):
        return len(self.__raftLog)

    def __deleteEntriesFrom(self, fromIDx):
        firstEntryIDx = self.__raftLog[0][1]
        diff = fromIDx - firstEntryIDx
        if diff < 0:
            return
        self.__raftLog.deleteEntriesFrom(diff)

    def __deleteEntriesTo(self, toIDx):
        firstEntryIDx = self.__raftLog[0][1]
        diff = toIDx - firstEntryIDx
        if diff < 0:
            return
        self.__raftLog.deleteEntriesTo(diff)

    def __onBecomeLeader(self):
        self.__raftLeader = self.__selfNode
        self.__transferPauseUntil = 0.0
        self.__setState(_RAFT_STATE.LEADER)

        self.__lastResponseTime.clear()
        for node in self.__otherNodes | self.__readonlyNodes:
            self.__raftNextIndex[node] = self.__getCurrentLogIndex() + 1
            self.__raftMatchIndex[node] = 0
            self.__lastResponseTime[node] = monotonicTime()

        # No-op command after leader election.
        idx, term = self.__getCurrentLogIndex() + 1, self.__raftCurrentTerm
        self.__raftLog.add(_bchr(_COMMAND_TYPE.NO_OP), idx, term)
        self.__noopIDx = idx
        if not self.__conf.appendEntriesUseBatch:
            self.__sendAppendEntries()

        self.__sendAppendEntries()

    def __setCurrentTerm(self, term, votedForNodeId):
        self.__raftCurrentTerm = term
        self.__votedForNodeId = votedForNodeId
        self.__raftLog.setCurrentTerm(term, votedForNodeId)

    def __setState(self, newState):
        oldState = self.__raftState
        self.__raftState = newState
        if oldState == _RAFT_STATE.LEADER and newState != _RAFT_STATE.LEADER:
            # raftq: a leader that steps down (a higher term, CheckQuorum) waits a whole election
            # timeout before it stands, as etcd's becomeFollower. Its timer last ran before it
            # led, long expired: it asked for a pre-vote in its first tick as a follower, and a
            # node that had just voted for the new leader and not yet heard from it granted it -
            # a leader paused (SIGSTOP, a VM stall) and resumed deposed its successor that way.
            self.__raftElectionDeadline = monotonicTime() + self.__generateRaftTimeout()
        if newState != _RAFT_STATE.LEADER:
            self.__stages.clear()
            self.__stagesUnsynced.clear()
            self.__stagesUncommitted.clear()
        callback = self.__conf.onStateChanged
        if callback is not None and oldState != newState:
            callback(oldState, newState)

    def __onLeaderChanged(self):
        for id in sorted(self.__commandsWaitingReply):
            self.__commandsWaitingReply[id](None, FAIL_REASON.LEADER_CHANGED)
        self.__commandsWaitingReply = {}

    def __sendAppendEntries(self):
        self.__newAppendEntriesTime = monotonicTime() + self.__conf.appendEntriesPeriod
        self.__commitUntold = False     # every append carries the commit index

        startTime = monotonicTime()

        batchSizeBytes = self.__conf.appendEntriesBatchSizeBytes

        departing = self.__departing
        for node in self.__otherNodes | self.__readonlyNodes | set(self.__learners) | set(departing):
            if node not in self.__connectedNodes:
                self.__serializer.cancelTransmisstion(node)
                continue
            if node in departing and departing[node][2] is None and self.__raftCommitIndex >= departing[node][0]:
                departing[node][2] = monotonicTime()    # raftq: this append tells it (__tickDeparting)

            sendSingle = True
            sendingSerialized = False
            nextNodeIndex = self.__raftNextIndex[node]

            while nextNodeIndex <= self.__getCurrentLogIndex() or sendSingle or sendingSerialized:
                if nextNodeIndex > self.__raftLog[0][1]:
                    prevLogIdx, prevLogTerm = self.__getPrevLogIndexTerm(nextNodeIndex)
                    entries = []
                    if nextNodeIndex <= self.__getCurrentLogIndex():
                        entries = self.__getEntries(nextNodeIndex, None, batchSizeBytes)
                        self.__raftNextIndex[node] = entries[-1][1] + 1

                    if len(entries) == 1 and len(entries[0][0]) >= batchSizeBytes:
                        entry = pickle.dumps(entries[0])
                        for pos in range(0, len(entry), batchSizeBytes):
                            currData = entry[pos:pos + batchSizeBytes]
                            if pos == 0:
                                transmission = 'start'
                            elif pos + batchSizeBytes >= len(entries[0][0]):
                                transmission = 'finish'
                            else:
                                transmission = 'process'
                            message = {
                                'type': 'append_entries',
                                'transmission': transmission,
                                'data': currData,
                                'term': self.__raftCurrentTerm,
                                'commit_index': self.__raftCommitIndex,
                                'prevLogIdx': prevLogIdx,
                                'prevLogTerm': prevLogTerm,
                            }
                            self.__transport.send(node, message)
                            if node not in self.__connectedNodes:
                                break
                    else:
                        message = {
                            'type': 'append_entries',
                            'term': self.__raftCurrentTerm,
                            'commit_index': self.__raftCommitIndex,
                            'entries': entries,
                            'prevLogIdx': prevLogIdx,
                            'prevLogTerm': prevLogTerm,
                        }
                        self.__transport.send(node, message)
                        if node not in self.__connectedNodes:
                            break
                else:
                    transmissionData = self.__serializer.getTransmissionData(node)
                    message = {
                        'type': 'append_entries',
                        'term': self.__raftCurrentTerm,
                        'commit_index': self.__raftCommitIndex,
                        'serialized': transmissionData,
                    }
                    self.__transport.send(node, message)
                    if node not in self.__connectedNodes:
                        break

                    if transmissionData is not None:
                        isLast = transmissionData[2]
                        if isLast:
                            self.__raftNextIndex[node] = self.__raftLog[1][1] + 1
                            sendingSerialized = False
                        else:
                            sendingSerialized = True
                    else:
                        sendingSerialized = False

                nextNodeIndex = self.__raftNextIndex[node]

                sendSingle = False

                delta = monotonicTime() - startTime
                if delta > self.__conf.appendEntriesPeriod:
                    break

    def __connectedToAnyone(self):
        return len(self.__connectedNodes) > 0 or len(self.__otherNodes) == 0

    def _getConf(self):
        return self.__conf

    @property
    def conf(self):
        return self.__conf

    def _getEncryptor(self):
        return self.__encryptor

    @property
    def encryptor(self):
        return self.__encryptor

    def __changeCluster(self, request):
        if self.__raftLastApplied < self.__noopIDx:
            # No-op entry was not commited yet
            return False

        if self.__changeClusterIDx is not None:
            if self.__raftLastApplied >= self.__changeClusterIDx:
                self.__changeClusterIDx = None

        # Previous cluster change request was not commited yet
        if self.__changeClusterIDx is not None:
            return False

        return self.__doChangeCluster(request)

    def __setCodeVersion(self, newVersion):
        self.__enabledCodeVersion = newVersion

    def __doChangeCluster(self, request, reverse = False):
        requestType = request[0]
        requestNodeId = request[1]
        if len(request) >= 3:
            requestNode = request[2]
            if not isinstance(requestNode, Node): # Actually shouldn't be necessary, but better safe than sorry.
                requestNode = self.__nodeClass(requestNode)
        else:
            requestNode = self.__nodeClass(requestNodeId)

        info = request[3] if len(request) >= 4 and isinstance(request[3], dict) else None

        if requestType == 'add':
            adding = not reverse
        elif requestType == 'rem':
            adding = reverse
        else:
            return False

        if adding:
            newNode = requestNode
            # Node already exists in cluster
            if newNode == self.__selfNode or newNode in self.__otherNodes:
                return False
            self.__otherNodes.add(newNode)
            # raftq: a learner that caught up (or a departing member added back) keeps its link
            # and its indices: it counts with what it already holds
            kept = self.__learners.pop(newNode, None) is not None or \
                self.__departing.pop(newNode, None) is not None
            if not kept:
                self.__raftNextIndex[newNode] = self.__getCurrentLogIndex() + 1
                self.__raftMatchIndex[newNode] = 0
                if self._isLeader():
                    self.__lastResponseTime[newNode] = monotonicTime()
                self.__transport.addNode(newNode)
            if info is not None:
                self.__memberInfo[newNode.id] = info
            self.__membershipChanged()
            return True
        else:
            oldNode = requestNode
            if oldNode == self.__selfNode:
                return False
            if oldNode not in self.__otherNodes:
                return False
            self.__otherNodes.discard(oldNode)
            self.__memberInfo.pop(oldNode.id, None)
            if not reverse and self.__raftState == _RAFT_STATE.LEADER:
                # raftq: the leader appends this removal next (_checkCommandsToApply) and keeps
                # replicating to the node until it learnt that it is committed (__tickDeparting)
                self.__departing[oldNode] = [self.__getCurrentLogIndex() + 1, monotonicTime(), None]
            else:
                self.__raftNextIndex.pop(oldNode, None)
                self.__raftMatchIndex.pop(oldNode, None)
                self.__transport.dropNode(oldNode)
            self.__membershipChanged()
            return True

    def __parseChangeClusterRequest(self, command):
        commandType = ord(command[:1])
        if commandType != _COMMAND_TYPE.MEMBERSHIP:
            return None
        return pickle.loads(command[1:])

    def __tryLogCompaction(self):
        currTime = monotonicTime()
        serializeState, serializeID = self.__serializer.checkSerializing()

        if serializeState == SERIALIZER_STATE.SUCCESS:
            self.__lastSerializedTime = currTime
            self.__deleteEntriesTo(serializeID)
            self.__lastSerializedEntry = serializeID

        if serializeState == SERIALIZER_STATE.FAILED:
            failure = self.__serializer.lastFailure
            if failure == EXIT_EIO:
                # raftq: the disk failed the snapshot's write or sync: fatal, as any failed write
                raise StorageFailure(self.__conf.fullDumpFile + '.tmp', 'write and fsync (snapshot)',
                                     OSError(errno.EIO, os.strerror(errno.EIO)))
            if failure == EXIT_ENOSPC:
                # The old snapshot and the whole journal are still there; a later compaction
                # writes a new file (nothing is retried on the same pages).
                logger.error('Failed to store full dump: the disk is full (ENOSPC); the journal keeps everything')
            else:
                logger.warning('Failed to store full dump')

        if serializeState != SERIALIZER_STATE.NOT_SERIALIZING:
            return

        if len(self.__raftLog) <= self.__conf.logCompactionMinEntries and \
                                currTime - self.__lastSerializedTime <= self.__conf.logCompactionMinTime and \
                not self.__forceLogCompaction:
            return

        if self.__conf.logCompactionSplit:
            allNodeIds = sorted([node.id for node in (self.__otherNodes | {self.__selfNode})])
            nodesCount = len(allNodeIds)
            selfIdx = allNodeIds.index(self.__selfNode.id)
            interval = self.__conf.logCompactionMinTime
            periodStart = int(currTime / interval ) * interval
            nodeInterval = float(interval) / nodesCount
            nodeIntervalStart = periodStart + selfIdx * nodeInterval
            nodeIntervalEnd = nodeIntervalStart + 0.3 * nodeInterval
            if currTime < nodeIntervalStart or currTime >= nodeIntervalEnd:
                return

        self.__forceLogCompaction = False

        lastAppliedEntries = self.__getEntries(self.__raftLastApplied - 1, 2)
        if len(lastAppliedEntries) < 2 or lastAppliedEntries[0][1] == self.__lastSerializedEntry:
            self.__lastSerializedTime = currTime
            return

        # raftq: the snapshot is a document of builtins (serializer.py), built in the forked
        # child: the consumers' state is read there, off the tick thread. Upstream pickles
        # (data, last, prev, cluster): the SyncObj subclass's own attributes and each consumer's,
        # as objects, and the members as TCPNode objects.
        consumers = list(self.__consumers)
        raft = {
            'last': tuple(lastAppliedEntries[1]),
            'prev': tuple(lastAppliedEntries[0]),
            'members': sorted(str(node.id) for node in self.__otherNodes | {self.__selfNode}),
            # raftq: each member's info (memberInfo), builtins
            'member_info': {node.id: dict(self.__memberInfo[node.id])
                            for node in self.__otherNodes | {self.__selfNode} if node.id in self.__memberInfo},
            'code_version': self.__enabledCodeVersion,
        }

        def buildDocument():
            return {
                'format': SNAPSHOT_FORMAT,
                'version': SNAPSHOT_VERSION,
                'raft': raft,
                'consumers': [consumer._serialize() for consumer in consumers],
            }

        self.__serializer.serialize(buildDocument, lastAppliedEntries[0][1])

    # raftq: PreVote and CheckQuorum (Raft thesis §9.6 and §6.2; FORK.md "PreVote and
    # CheckQuorum"). Upstream has neither: a node that stops hearing the leader (its incoming
    # traffic cut one way) raises its term and deposes a healthy leader again and again, and a
    # leader that no majority hears from stays leader for leaderFallbackTimeout.
    def __startPreVote(self):
        """Ask, without raising the term, whether a majority would vote for this node: they
        would only if they too have not heard from a leader for an election timeout."""
        if self.__raftLeader is not None:
            self.__raftLeader = None
            self.__onLeaderChanged()
        self.__preVoteTerm = self.__raftCurrentTerm + 1
        self.__preVoters = set()
        for node in self.__otherNodes:
            self.__transport.send(node, {
                'type': 'request_prevote',
                'term': self.__preVoteTerm,
                'last_log_index': self.__getCurrentLogIndex(),
                'last_log_term': self.__getCurrentLogTerm(),
            })
        if 1 > (len(self.__otherNodes) + 1) / 2:
            self.__startElection()

    def __startElection(self):
        # upstream's election, as it was in _onTick
        self.__preVoteTerm = None
        self.__transferInProgress = False
        self.__raftLeader = None
        self.__setState(_RAFT_STATE.CANDIDATE)
        self.__setCurrentTerm(self.__raftCurrentTerm + 1, self.__selfNode.id)
        self.__votesCount = 1
        for node in self.__otherNodes:
            self.__transport.send(node, {
                'type': 'request_vote',
                'term': self.__raftCurrentTerm,
                'last_log_index': self.__getCurrentLogIndex(),
                'last_log_term': self.__getCurrentLogTerm(),
            })
        self.__onLeaderChanged()
        if self.__votesCount > (len(self.__otherNodes) + 1) / 2:
            self.__onBecomeLeader()

    def __conflictStart(self, prevLogIdx, term):
        """The first index of the run of entries of `term` that ends at prevLogIdx; never at or
        below the commit index (committed entries match the leader's) nor at the log's first
        entry (the leader's next append must find its prevLogIdx here)."""
        floor = max(self.__raftCommitIndex + 1, self.__raftLog[0][1] + 1)
        idx = prevLogIdx
        while idx - 1 >= floor:
            entries = self.__getEntries(idx - 1, 1)
            if not entries or entries[0][2] != term:
                break
            idx -= 1
        return max(idx, floor) if prevLogIdx >= floor else prevLogIdx

    def __heardFromLeaderRecently(self):
        """A leader (this node, or one of this term) was heard within the shortest election
        timeout. Measured against the end of the last round of message handling when that is
        earlier: a node whose tick thread stalled has not read what its leader sent meanwhile."""
        if self.__raftState == _RAFT_STATE.LEADER:
            return True
        if self.__raftLeader is None:
            return False
        now = min(monotonicTime(), self.__lastPollEnd)
        return now - self.__lastLeaderContact < self.__conf.raftMinTimeout

    def __onPreVoteRequest(self, node, message):
        # Granting changes nothing here: no term, no vote, no timer.
        if self.__unverified is not None:
            return                      # never from a log that is not trusted (disk checks)
        if message['term'] <= self.__raftCurrentTerm:
            # raftq: tell a pre-candidate behind in term the term (etcd answers so too): else a
            # node with the newer term and the shorter log and one with the older term and the
            # longer log refuse each other for good, one of three nodes down (FORK.md "PreVote
            # and CheckQuorum"). A message type of its own: a node of before counts every
            # response_prevote of its round's term as granted.
            self.__transport.send(node, {'type': 'prevote_refused', 'term': self.__raftCurrentTerm})
            return
        if self.__heardFromLeaderRecently():
            return
        lastLogTerm, lastLogIdx = message['last_log_term'], message['last_log_index']
        if lastLogTerm < self.__getCurrentLogTerm():
            return
        if lastLogTerm == self.__getCurrentLogTerm() and lastLogIdx < self.__getCurrentLogIndex():
            return
        self.__transport.send(node, {'type': 'response_prevote', 'term': message['term']})

    def __onNewerTermRefusal(self, term):
        """raftq: a pre-vote refused by a node of a newer term: take the term as a follower
        (with no vote and no leader known) and stand again, a pre-vote for the term after it,
        at the next election timeout."""
        self.__preVoteTerm = None
        self.__setCurrentTerm(term, None)
        if self.__raftState != _RAFT_STATE.FOLLOWER:
            self.__setState(_RAFT_STATE.FOLLOWER)
        if self.__raftLeader is not None:
            self.__raftLeader = None
            self.__onLeaderChanged()

    def __checkQuorum(self):
        """On the leader, every tick: step down when no majority answered within the window
        (CheckQuorum: the shortest election timeout; upstream: leaderFallbackTimeout only), and
        ask the most up-to-date follower to stand at once (TimeoutNow): if only this node's
        incoming traffic is cut, the followers still hear it and would otherwise wait for their
        own timers, with no leader meanwhile. Measured from the end of the last round of message
        handling, so a tick thread that stalled does not step down over answers it has not read."""
        window = self.__conf.leaderFallbackTimeout
        if self.__conf.checkQuorum:
            window = min(window, self.__conf.raftMinTimeout)
        deadline = min(monotonicTime(), self.__lastPollEnd) - window
        count = 1
        for node in self.__otherNodes:
            if self.__lastResponseTime[node] > deadline:
                count += 1
        if count > (len(self.__otherNodes) + 1) / 2:
            return
        logger.warning('no majority heard from for %.2f s: stepping down (term %d)', window, self.__raftCurrentTerm)
        target = None
        if self.__conf.checkQuorum:
            candidates = [(self.__raftMatchIndex.get(n, 0), self.__lastResponseTime.get(n, 0), n.id, n)
                          for n in self.__otherNodes if n in self.__connectedNodes]
            if candidates:
                target = max(candidates)[3]
        self.__setState(_RAFT_STATE.FOLLOWER)
        self.__raftLeader = None
        if target is not None:
            self.__transport.send(target, {'type': 'timeout_now', 'term': self.__raftCurrentTerm})

    # raftq: the disk checks (FORK.md "Checksums"). What the journal found (journal.FileJournal),
    # the snapshot's check, and the commit index the node knew: anything found makes the log
    # untrusted - the node keeps the good part, neither votes nor stands for election, and
    # becomes a voter again once a leader's log has been matched up to the leader's commit
    # index and the one it knew itself. The state is in the meta file, so a restart before
    # that keeps it.
    def __checkDisk(self):
        log = self.__raftLog
        findings = list(log.findings)
        dump = self.__conf.fullDumpFile
        if dump is not None and os.path.exists(dump):
            problem = verifyPath(dump)
            if problem is not None:
                findings.append(self.__moveSnapshotAside('snapshot_damaged', problem))
        if dump is not None and len(log) and log[0][1] > 1 and not os.path.exists(dump):
            findings.append({'what': 'snapshot_missing', 'file': dump,
                             'detail': 'the journal starts at index %d, after a snapshot, and there is no snapshot: '
                                       'the journal is discarded too (%d entries)' % (log[0][1], len(log))})
            log.clear()
        return findings

    def __moveSnapshotAside(self, what, problem):
        dump = self.__conf.fullDumpFile
        aside = dump + '.damaged'
        try:
            os.replace(dump, aside)
        except OSError as e:
            raise StorageFailure(dump, 'rename to .damaged', e)
        return {'what': what, 'file': dump, 'moved_to': aside, 'detail': '%s; moved aside' % problem}

    def __judgeDisk(self):
        findings = self.__diskFindings
        log = self.__raftLog
        last = self.__getCurrentLogIndex()
        stored = log.getRaftCommitIndex() if self.__conf.durability == 'fsync' else 0
        if stored > last:
            # In fsync durability the journal is synced before the commit index is stored, so
            # this is lost data, not a crash artefact.
            findings.append({'what': 'journal_short_of_commit', 'file': self.__conf.journalFile,
                             'detail': 'the journal ends at index %d but the node knew index %d committed' % (
                                 last, stored)})
        if self.__raftCommitIndex > last:
            self.__raftCommitIndex = last
        if any(f['what'] == 'meta_damaged' for f in findings) and self.__selfNode is not None:
            # The vote of this term is unknown: count it as given, so none is given again.
            self.__votedForNodeId = self.__selfNode.id
        previous = log.getUnverified()
        info = previous if isinstance(previous, dict) else None
        if findings:
            found = {f['what'] for f in findings} | set((info or {}).get('found', ()))
            claimed = max(stored, (info or {}).get('claimed_commit', 0))
            info = {'since_ms': int(time.time() * 1000), 'found': sorted(found), 'claimed_commit': claimed}
            log.setUnverified(info)
        for f in findings:
            logger.critical('disk check: %s in %s: %s', f['what'], f.get('file'), f['detail'])
        if info is not None and self.__conf.acceptDamagedLog:
            logger.critical('disk check: the operator accepts this log as it is (acceptDamagedLog): it votes and '
                            'stands for election again; entries cut from it (%s) may have been acknowledged',
                            ', '.join(info['found']))
            log.setUnverified(None)
            info = None
        if info is not None:
            logger.critical('disk check: this node neither votes nor stands for election until its log matches a '
                            'leader\'s up to that leader\'s commit index (and index %d): it was damaged (%s)',
                            info['claimed_commit'], ', '.join(info['found']))
        return info

    def __discardSnapshotAtStart(self, problem):
        finding = self.__moveSnapshotAside('snapshot_damaged', problem)
        self.__raftLog.clear()
        self.__raftLog.add(_bchr(_COMMAND_TYPE.NO_OP), 1, 0)
        self.__raftLastApplied = 1
        self.__raftCommitIndex = 1
        self.__enabledCodeVersion = 0
        self.__onSetCodeVersion(0)
        finding['detail'] += '; the journal is discarded with it'
        self.__diskFindings.append(finding)
        self.__unverified = self.__judgeDiskAgain(finding)

    def __judgeDiskAgain(self, finding):
        logger.critical('disk check: %s in %s: %s', finding['what'], finding.get('file'), finding['detail'])
        previous = self.__raftLog.getUnverified() or {}
        info = {'since_ms': int(time.time() * 1000),
                'found': sorted(set(previous.get('found', ())) | {finding['what']}),
                'claimed_commit': max(previous.get('claimed_commit', 0),
                                      self.__raftLog.getRaftCommitIndex() if self.__conf.durability == 'fsync' else 0)}
        self.__raftLog.setUnverified(info)
        logger.critical('disk check: this node neither votes nor stands for election until it has caught up with a '
                        'leader (index %d at least)', info['claimed_commit'])
        return info

    def __checkCaughtUp(self, node, matched, leaderCommitIndex):
        need = max(leaderCommitIndex, self.__unverified.get('claimed_commit', 0))
        if matched >= need:
            self.__unverified = None
            self.__raftLog.setUnverified(None)
            logger.warning('disk check: the log matches the leader %s up to index %d (its commit index %d): this node '
                           'votes and stands for election again', node, matched, leaderCommitIndex)

    def __mayStandForElection(self):
        if self.__unverified is not None:
            return False
        eligible = self.__conf.electionEligible
        return eligible is None or eligible()

    def __onSnapshotDamaged(self, what, detail):
        """The serializer found the node's own snapshot damaged when about to send it, or one
        received from the leader (dropped; the leader sends it again)."""
        self.__diskFindings.append({'what': what, 'file': self.__conf.fullDumpFile, 'detail': detail})
        if what == 'snapshot_damaged':
            self.__forceLogCompaction = True        # write a good one; nothing is sent meanwhile

    def __storageFailed(self, failure):
        logger.critical('storage failure: %s; the node stops: nothing written since its last good sync is '
                        'acknowledged, and nothing is retried', failure)
        callback = self.__conf.onStorageFailure
        if callback is not None:
            callback(failure)

    @property
    def diskFindings(self):
        """raftq: what the disk checks found since the start (dicts: what, file, detail, ...)."""
        return list(self.__diskFindings)

    @property
    def logUnverified(self):
        """raftq: why the log is not trusted for voting yet ({'found', 'claimed_commit', ...}), or None."""
        return self.__unverified

    def __upgradeLegacySnapshot(self, old):
        """raftq: upstream's (data, last, prev, cluster) -> the snapshot document. `data` is the
        SyncObj's own attributes ({'_SyncObj__enabledCodeVersion': v}), followed by each
        consumer's when there are consumers; `cluster` a set of TCPNode (legacy objects here)."""
        data, last, prev, cluster = old
        if self.__consumers:
            selfData, consumersData = data[0], data[1:]
        else:
            selfData, consumersData = data, []
        members = sorted(node.state['_id'] if isinstance(node, LegacyObject) else str(node) for node in cluster)
        return {
            'format': SNAPSHOT_FORMAT,
            'version': SNAPSHOT_VERSION,
            'raft': {'last': tuple(last), 'prev': tuple(prev), 'members': members,
                     'code_version': (selfData or {}).get('_SyncObj__enabledCodeVersion', 0)},
            'consumers': [consumer._upgradeLegacySnapshot(d) for consumer, d in zip(self.__consumers, consumersData)],
        }

    def __loadDumpFile(self, clearJournal):
        try:
            doc = self.__serializer.deserialize()
            raft = doc['raft']
            last, prev = tuple(raft['last']), tuple(raft['prev'])
            self.__enabledCodeVersion = raft['code_version']
            consumersData = doc['consumers']
            if len(consumersData) != len(self.__consumers):
                raise ValueError('the snapshot holds %d consumers, this node has %d' % (
                    len(consumersData), len(self.__consumers)))
            for i, consumer in enumerate(self.__consumers):
                consumer._deserialize(consumersData[i])

            # raftq: a journal that holds the snapshot's two entries keeps the entries after
            # them. Upstream cleared it unless they were its first two: after a crash between
            # the snapshot's rename and the journal's compaction, the entries past the snapshot,
            # committed ones included, were gone from this node.
            held = None if clearJournal else self.__snapshotInJournal(prev, last)
            if held is None:
                self.__raftLog.clear()
                self.__raftLog.add(*prev)
                self.__raftLog.add(*last)
            elif held > 0:
                self.__raftLog.deleteEntriesTo(held)

            self.__raftLastApplied = last[1]

            if self.__raftCommitIndex > self.__getCurrentLogIndex():
                logger.warning('raftCommitIndex (%d) exceeds journal end (%d) after loading dump, '
                               'likely due to unsynced journal entries lost on crash; '
                               'clamping to journal end',
                               self.__raftCommitIndex, self.__getCurrentLogIndex())
                self.__raftCommitIndex = self.__getCurrentLogIndex()
                self.__raftLog.setRaftCommitIndex(self.__raftCommitIndex)

            # raftq: only a snapshot written under online membership change (it has member_info)
            # says what the membership is. One that names no members (raftq restore's) or one of
            # a release with a fixed peer list (whose members may have moved to other addresses
            # since, the TOMLs edited and every node restarted) leaves it as configured; upstream
            # made the first a cluster of one and took the second's old addresses.
            if self.__conf.dynamicMembershipChange and raft['members'] and 'member_info' in raft:
                for address, info in (raft.get('member_info') or {}).items():
                    if isinstance(info, dict):
                        self.__memberInfo[address] = info
                self.__updateClusterConfiguration([node for node in raft['members'] if node != self.__selfNode.id])
            self.__onSetCodeVersion(0)
            return True
        except StorageFailure:
            raise
        except:
            logger.exception('failed to load full dump')
            return False

    def __snapshotInJournal(self, prev, last):
        """raftq: the position of the snapshot's `prev` entry in the journal, followed by its
        `last` entry, or None."""
        if not len(self.__raftLog):
            return None
        k = prev[1] - self.__raftLog[0][1]
        if k < 0 or k + 1 >= len(self.__raftLog):
            return None
        if tuple(self.__raftLog[k]) != prev or tuple(self.__raftLog[k + 1]) != last:
            return None
        return k

    def __updateClusterConfiguration(self, newNodes):
        # newNodes: list of Node or node ID
        newNodes = {self.__nodeClass(node) if not isinstance(node, Node) else node for node in newNodes}
        nodesToRemove = self.__otherNodes - newNodes
        nodesToAdd = newNodes - self.__otherNodes
        for node in nodesToRemove:
            self.__raftNextIndex.pop(node, None)
            self.__raftMatchIndex.pop(node, None)
            self.__transport.dropNode(node)
        self.__otherNodes = newNodes
        for node in nodesToAdd:
            self.__transport.addNode(node)
            self.__raftNextIndex[node] = self.__getCurrentLogIndex() + 1
            self.__raftMatchIndex[node] = 0
        for node in nodesToRemove:
            self.__memberInfo.pop(node.id, None)
        if nodesToAdd or nodesToRemove:
            self.__membershipChanged()

def __copy_func(f, name):
    res = types.FunctionType(f.__code__, f.__globals__, name, f.__defaults__, f.__closure__)
    res.__dict__ = f.__dict__
    return res

class AsyncResult(object):
    def __init__(self):
        self.result = None
        self.error = None
        self.event = threading.Event()

    def onResult(self, res, err):
        self.result = res
        self.error = err
        self.event.set()


def replicated(*decArgs, **decKwargs):
    """Replicated decorator. Use it to mark your class members that modifies
    a class state. Function will be called asynchronously. Function accepts
    flowing additional parameters (optional):
        'callback': callback(result, failReason), failReason - `FAIL_REASON <#pysyncobj.FAIL_REASON>`_.
        'sync': True - to block execution and wait for result, False - async call. If callback is passed,
            'sync' option is ignored.
        'timeout': if 'sync' is enabled, and no result is available for 'timeout' seconds -
            SyncObjException will be raised.
    These parameters are reserved and should not be used in kwargs of your replicated method.

    :param func: arbitrary class member
    :type func: function
    :param ver: (optional) - code version (for zero deployment)
    :type ver: int
    """
    def replicatedImpl(func):
        def newFunc(self, *args, **kwargs):

            if kwargs.pop('_doApply', False):
                return func(self, *args, **kwargs)
            else:
                if isinstance(self, SyncObj):
                    applier = self._applyCommand
                    funcName = self._getFuncName(func.__name__)
                    funcID = self._methodToID[funcName]
                elif isinstance(self, SyncObjConsumer):
                    consumerId = id(self)
                    funcName = self._syncObj._getFuncName((consumerId, func.__name__))
                    funcID = self._syncObj._methodToID[(consumerId, funcName)]
                    applier = self._syncObj._applyCommand
                else:
                    raise SyncObjException("Class should be inherited from SyncObj or SyncObjConsumer")

                callback = kwargs.pop('callback', None)
                if kwargs:
                    cmd = (funcID, args, kwargs)
                elif args and not kwargs:
                    cmd = (funcID, args)
                else:
                    cmd = funcID
                sync = kwargs.pop('sync', False)
                if callback is not None:
                    sync = False

                if sync:
                    asyncResult = AsyncResult()
                    callback = asyncResult.onResult

                timeout = kwargs.pop('timeout', None)
                applier(pickle.dumps(cmd), callback, _COMMAND_TYPE.REGULAR)

                if sync:
                    res = asyncResult.event.wait(timeout)
                    if not res:
                        raise SyncObjException('Timeout')
                    if not asyncResult.error == 0:
                        raise SyncObjException(asyncResult.error)
                    return asyncResult.result

        func_dict = newFunc.__dict__
        func_dict['replicated'] = True
        func_dict['ver'] = int(decKwargs.get('ver', 0))
        func_dict['origName'] = func.__name__

        callframe = sys._getframe(1 if decKwargs else 2)
        namespace = callframe.f_locals
        newFuncName = func.__name__ + '_v' + str(func_dict['ver'])
        namespace[newFuncName] = __copy_func(newFunc, newFuncName)
        functools.update_wrapper(newFunc, func)
        return newFunc

    if len(decArgs) == 1 and len(decKwargs) == 0 and callable(decArgs[0]):
        return replicatedImpl(decArgs[0])

    return replicatedImpl

def replicated_sync(*decArgs, **decKwargs):
    def replicated_sync_impl(func, timeout = None):
        """Same as replicated, but synchronous by default.

        :param func: arbitrary class member
        :type func: function
        :param timeout: time to wait (seconds). Default: None
        :type timeout: float or None
        """

        def newFunc(self, *args, **kwargs):
            if kwargs.get('_doApply', False):
                return replicated(func)(self, *args, **kwargs)
            else:
                kwargs.setdefault('timeout', timeout)
                kwargs.setdefault('sync', True)
                return replicated(func)(self, *args, **kwargs)
        func_dict = newFunc.__dict__
        func_dict['replicated'] = True
        func_dict['ver'] = int(decKwargs.get('ver', 0))
        func_dict['origName'] = func.__name__

        callframe = sys._getframe(1 if decKwargs else 2)
        namespace = callframe.f_locals
        newFuncName = func.__name__ + '_v' + str(func_dict['ver'])
        namespace[newFuncName] = __copy_func(newFunc, newFuncName)
        functools.update_wrapper(newFunc, func)
        return newFunc

    if len(decArgs) == 1 and len(decKwargs) == 0 and callable(decArgs[0]):
        return replicated_sync_impl(decArgs[0])

    return replicated_sync_impl
