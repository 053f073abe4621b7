from .config import FAIL_REASON
from .dns_resolver import globalDnsResolver
from .node import Node, TCPNode
from .tcp_connection import TcpConnection, CONNECTION_STATE
from .tcp_server import TcpServer
import functools
import logging
import os
import threading
import time
import random

monotonicTime = time.monotonic
log = logging.getLogger(__name__)

# raftq: the link keepalive (see TCPTransport._onTick). The message is ignored by the receiving
# SyncObj; only its arrival counts (it refreshes the connection's last read time).
KEEPALIVE = {'type': 'raftq_keepalive'}
KEEPALIVE_PERIOD = 1.0

# raftq: the largest frame a connection may send before its peer has authenticated. The
# handshake's frames are a 32-byte random key and a member's address (or 'readonly'), pickled
# and, with the secret, encrypted: about 100 bytes each; a DNS name is at most 253 characters.
HANDSHAKE_MAX_FRAME = 4096

# raftq: why the transport refused or closed a connection (TCPTransport.refusals, /metrics):
#  * frame_too_large - a length prefix beyond HANDSHAKE_MAX_FRAME before authentication (or a
#    negative one at any time): refused before anything of the frame is buffered;
#  * auth_failed - with the secret, a frame before authentication that does not decrypt (a
#    wrong secret, or not the Raft protocol at all);
#  * malformed - without the secret, a first frame that is not a message;
#  * unknown_peer - a first message that names no member;
#  * handshake_timeout - the handshake not done within handshakeTimeout of the start;
#  * too_many_pending - closed to make room: maxPendingConnections handshakes were under way;
#  * bad_frame - a frame that fails on an authenticated link (tampering, or a bug).
REFUSALS = ('frame_too_large', 'auth_failed', 'malformed', 'unknown_peer', 'handshake_timeout',
            'too_many_pending', 'bad_frame')
REFUSAL_LOG_PERIOD = 10.0


class TransportNotReadyError(Exception):
    """Transport failed to get ready for operation."""


class Transport(object):
    """Base class for implementing a transport between PySyncObj nodes"""

    def __init__(self, syncObj, selfNode, otherNodes):
        """
        Initialise the transport

        :param syncObj: SyncObj
        :type syncObj: SyncObj
        :param selfNode: current server node, or None if this is a read-only node
        :type selfNode: Node or None
        :param otherNodes: partner nodes
        :type otherNodes: list of Node
        """

        self._onMessageReceivedCallback = None
        self._onNodeConnectedCallback = None
        self._onNodeDisconnectedCallback = None
        self._onReadonlyNodeConnectedCallback = None
        self._onReadonlyNodeDisconnectedCallback = None

    def setOnMessageReceivedCallback(self, callback):
        """
        Set the callback for when a message is received, or disable callback by passing None

        :param callback callback
        :type callback function(node: Node, message: any) or None
        """

        self._onMessageReceivedCallback = callback

    def setOnNodeConnectedCallback(self, callback):
        """
        Set the callback for when the connection to a (non-read-only) node is established, or disable callback by passing None

        :param callback callback
        :type callback function(node: Node) or None
        """

        self._onNodeConnectedCallback = callback

    def setOnNodeDisconnectedCallback(self, callback):
        """
        Set the callback for when the connection to a (non-read-only) node is terminated or is considered dead, or disable callback by passing None

        :param callback callback
        :type callback function(node: Node) or None
        """

        self._onNodeDisconnectedCallback = callback

    def setOnReadonlyNodeConnectedCallback(self, callback):
        """
        Set the callback for when a read-only node connects, or disable callback by passing None

        :param callback callback
        :type callback function(node: Node) or None
        """

        self._onReadonlyNodeConnectedCallback = callback

    def setOnReadonlyNodeDisconnectedCallback(self, callback):
        """
        Set the callback for when a read-only node disconnects (or the connection is lost), or disable callback by passing None

        :param callback callback
        :type callback function(node: Node) or None
        """

        self._onReadonlyNodeDisconnectedCallback = callback

    # Helper functions so you don't need to check for the callbacks manually in subclasses
    def _onMessageReceived(self, node, message):
        if self._onMessageReceivedCallback is not None:
            self._onMessageReceivedCallback(node, message)

    def _onNodeConnected(self, node):
        if self._onNodeConnectedCallback is not None:
            self._onNodeConnectedCallback(node)

    def _onNodeDisconnected(self, node):
        if self._onNodeDisconnectedCallback is not None:
            self._onNodeDisconnectedCallback(node)

    def _onReadonlyNodeConnected(self, node):
        if self._onReadonlyNodeConnectedCallback is not None:
            self._onReadonlyNodeConnectedCallback(node)

    def _onReadonlyNodeDisconnected(self, node):
        if self._onReadonlyNodeDisconnectedCallback is not None:
            self._onReadonlyNodeDisconnectedCallback(node)

    def tryGetReady(self):
        """
        Try to get the transport ready for operation. This may for example mean binding a server to a port.

        :raises TransportNotReadyError: if the transport fails to get ready for operation
        """

    @property
    def ready(self):
        """
        Whether the transport is ready for operation.

        :rtype bool
        """

        return True

    def waitReady(self):
        """
        Wait for the transport to be ready.

        :raises TransportNotReadyError: if the transport fails to get ready for operation
        """

    def addNode(self, node):
        """
        Add a node to the network

        :param node node to add
        :type node Node
        """

    def dropNode(self, node):
        """
        Remove a node from the network (meaning connections, buffers, etc. related to this node can be dropped)

        :param node node to drop
        :type node Node
        """

    def send(self, node, message):
        """
        Send a message to a node.
        The message should be picklable.
        The return value signifies whether the message is thought to have been sent successfully. It does not necessarily mean that the message actually arrived at the node.

        :param node target node
        :type node Node
        :param message message
        :type message any
        :returns success
        :rtype bool
        """

        raise NotImplementedError

    def destroy(self):
        """
        Destroy the transport
        """


class TCPTransport(Transport):
    def __init__(self, syncObj, selfNode, otherNodes):
        """
        Initialise the TCP transport. On normal (non-read-only) nodes, this will start a TCP server. On all nodes, it will initiate relevant connections to other nodes.

        :param syncObj: SyncObj
        :type syncObj: SyncObj
        :param selfNode: current node (None if this is a read-only node)
        :type selfNode: TCPNode or None
        :param otherNodes: partner nodes
        :type otherNodes: iterable of TCPNode
        """

        super(TCPTransport, self).__init__(syncObj, selfNode, otherNodes)
        self._syncObj = syncObj
        self._server = None
        self._connections = {} # Node object -> TcpConnection object
        self._unknownConnections = set() # set of TcpConnection objects
        self._selfNode = selfNode
        self._selfIsReadonlyNode = selfNode is None
        self._nodes = set() # set of TCPNode
        self._readonlyNodes = set() # set of Node
        self._nodeAddrToNode = {} # node ID/address -> TCPNode (does not include read-only nodes)
        self._lastConnectAttempt = {} # TPCNode -> float (seconds since epoch)
        self._preventConnectNodes = set() # set of TCPNode to which no (re)connection should be triggered on _connectIfNecessary; used via dropNode and destroy to cleanly remove a node
        self._readonlyNodesCounter = 0
        self._lastBindAttemptTime = 0
        self._bindAttempts = 0
        self._bindOverEvent = threading.Event() # gets triggered either when the server has either been bound correctly or when the number of bind attempts exceeds the config value maxBindRetries
        self._ready = False
        self._send_random_sleep_duration = 0
        self._nextKeepalive = 0
        self._encrypted = bool(syncObj.encryptor)
        self.refusals = dict.fromkeys(REFUSALS, 0)     # raftq: see REFUSALS
        self._refusalLogAt = 0.0
        self._refusalsUnlogged = 0

        self._syncObj.addOnTickCallback(self._onTick)

        for node in otherNodes:
            self.addNode(node)

        if not self._selfIsReadonlyNode:
            self._createServer()
        else:
            self._ready = True

    def _connToNode(self, conn):
        """
        Find the node to which a connection belongs.

        :param conn: connection object
        :type conn: TcpConnection
        :returns corresponding node or None if the node cannot be found
        :rtype Node or None
        """

        for node in self._connections:
            if self._connections[node] is conn:
                return node
        return None

    def tryGetReady(self):
        """
        Try to bind the server if necessary.

        :raises TransportNotReadyError if the server could not be bound
        """

        self._maybeBind()

    @property
    def ready(self):
        return self._ready

    def _createServer(self):
        """
        Create the TCP server (but don't bind yet)
        """

        conf = self._syncObj.conf
        bindAddr = conf.bindAddress
        seflAddr = getattr(self._selfNode, 'address')
        if bindAddr is not None:
            host, port = bindAddr.rsplit(':', 1)
        elif seflAddr is not None:
            host, port = seflAddr.rsplit(':', 1)
            if ':' in host:
                host = '::'
            else:
                host = '0.0.0.0'
        else:
            raise RuntimeError('Unable to determine bind address')
        
        if host != '0.0.0.0':
            host = globalDnsResolver().resolve(host)
        self._server = TcpServer(self._syncObj._poller, host, port, onNewConnection = self._onNewIncomingConnection,
                                 sendBufferSize = conf.sendBufferSize,
                                 recvBufferSize = conf.recvBufferSize,
                                 connectionTimeout = conf.connectionTimeout,
                                 compressionLevel = conf.compressionLevel,
                                 backlog = conf.listenBacklog)

    def _maybeBind(self):
        """
        Bind the server unless it is already bound, this is a read-only node, or the last attempt was too recently.

        :raises TransportNotReadyError if the bind attempt fails
        """

        if self._ready or self._selfIsReadonlyNode or monotonicTime() < self._lastBindAttemptTime + self._syncObj.conf.bindRetryTime:
            return
        self._lastBindAttemptTime = monotonicTime()
        try:
            self._server.bind()
        except Exception as e:
            self._bindAttempts += 1
            if self._syncObj.conf.maxBindRetries and self._bindAttempts >= self._syncObj.conf.maxBindRetries:
                self._bindOverEvent.set()
                raise TransportNotReadyError
        else:
            self._ready = True
            self._bindOverEvent.set()

    def _onTick(self):
        """
        Tick callback. Binds the server and connects to other nodes as necessary.
        """

        try:
            self._maybeBind()
        except TransportNotReadyError:
            pass
        self._connectIfNecessary()
        if self._server is not None:
            self._server.resumeAccepting()

        # raftq: the handshake deadline. Upstream checks a connection's timeout only when it
        # reads or sends, so a connection that sent a few bytes and went quiet was held forever
        # (incoming: in _unknownConnections; outgoing: CONNECTED to a peer that never sends its
        # key, and never dialled again). Either is closed handshakeTimeout after its start.
        now = monotonicTime()
        deadline = now - self._syncObj.conf.handshakeTimeout
        if self._unknownConnections:
            for conn in [c for c in self._unknownConnections if c.startTime < deadline]:
                self._refuse(conn, 'handshake_timeout')
        for conn in list(self._connections.values()):
            if conn.startTime < deadline and conn.state != CONNECTION_STATE.DISCONNECTED and \
                    not self._handshakeDone(conn):
                self._refuse(conn, 'handshake_timeout')

        # raftq: keep idle links alive. A connection whose last read is older than
        # connectionTimeout is dropped only when it next has to *send* (TcpConnection.
        # __trySendBuffer), and the message being sent is lost with it. Between two followers
        # nothing flows while the leader lives, so when the leader died the first request_vote
        # between the survivors was always lost and every election took a second round
        # (2.5-3.5 s instead of 1-2 s, the term going up by two). Every connected peer gets a
        # keepalive once every KEEPALIVE_PERIOD.
        if now >= self._nextKeepalive:
            self._nextKeepalive = now + KEEPALIVE_PERIOD
            for node, conn in list(self._connections.items()):
                if self._handshakeDone(conn):
                    conn.send(KEEPALIVE)

    def _handshakeDone(self, conn):
        """raftq: whether a connection may carry messages: connected and, with encryption, past
        the key exchange (an outgoing connection is CONNECTED as soon as TCP is; until the peer's
        key arrives and the address has gone out, the peer expects nothing else)."""
        return conn.state == CONNECTION_STATE.CONNECTED and (conn.sendRandKey or not self._encrypted)

    @property
    def pendingHandshakes(self):
        """raftq: incoming connections whose handshake is under way."""
        return len(self._unknownConnections)

    def _refuse(self, conn, reason):
        """raftq: close a connection for `reason` (REFUSALS); _onDisconnected counts and logs it."""
        conn.refusal = reason
        conn.disconnect()

    def _refused(self, conn, reason):
        """raftq: count a refusal and log it, at most one line per REFUSAL_LOG_PERIOD (a flood
        must not flood the log) with the number left out since the last. Only the peer's
        address and the reason: nothing of what it sent, and never the secret."""
        self.refusals[reason] += 1
        now = monotonicTime()
        if now - self._refusalLogAt < REFUSAL_LOG_PERIOD:
            self._refusalsUnlogged += 1
            return
        more = ' (%d more refusals since the last such line)' % self._refusalsUnlogged if self._refusalsUnlogged else ''
        self._refusalLogAt, self._refusalsUnlogged = now, 0
        peer = conn.peer
        peer = '%s:%s' % peer[:2] if isinstance(peer, tuple) else str(peer)
        log.warning('Raft link: closed the connection %s %s: %s%s', 'from' if conn.incoming else 'to', peer,
                    reason.replace('_', ' '), more)

    def _onNewIncomingConnection(self, conn):
        """
        Callback for connections initiated by the other side

        :param conn: connection object
        :type conn: TcpConnection
        """

        # raftq: at most maxPendingConnections handshakes at once; the oldest makes room (a
        # member's handshake takes one round trip, a connection that idles takes a slot until
        # its deadline). Every frame before authentication is at most HANDSHAKE_MAX_FRAME.
        if len(self._unknownConnections) >= self._syncObj.conf.maxPendingConnections:
            self._refuse(min(self._unknownConnections, key=lambda c: c.startTime), 'too_many_pending')
        conn.maxFrame = HANDSHAKE_MAX_FRAME
        self._unknownConnections.add(conn)
        encryptor = self._syncObj.encryptor
        if encryptor:
            conn.encryptor = encryptor
        conn.setOnMessageReceivedCallback(functools.partial(self._onIncomingMessageReceived, conn))
        conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))

    def _onIncomingMessageReceived(self, conn, message):
        """
        Callback for initial messages on incoming connections. Handles encryption and association of the connection with a Node.
        Once this initial setup is done, the relevant connected callback is executed, and further messages are deferred to the onMessageReceived callback.

        :param conn: connection object
        :type conn: TcpConnection
        :param message: received message
        :type message: any
        """

        if self._syncObj.encryptor and not conn.sendRandKey:
            conn.sendRandKey = message
            conn.recvRandKey = os.urandom(32)
            conn.send(conn.recvRandKey)
            return

        # At this point, message should be either a node ID (i.e. address) or 'readonly'
        # (raftq: no utility protocol, so anything else - e.g. an unhashable list - is refused)
        node = self._nodeAddrToNode.get(message) if isinstance(message, str) else None

        if node is None and message != 'readonly':
            self._refuse(conn, 'unknown_peer')
            self._unknownConnections.discard(conn)
            return

        readonly = node is None
        if readonly:
            nodeId = str(self._readonlyNodesCounter)
            node = Node(nodeId)
            self._readonlyNodes.add(node)
            self._readonlyNodesCounter += 1

        self._unknownConnections.discard(conn)
        conn.maxFrame = None                # raftq: authenticated (or, without the secret, identified)
        self._connections[node] = conn
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        if not readonly:
            self._onNodeConnected(node)
        else:
            self._onReadonlyNodeConnected(node)

    def _shouldConnect(self, node):
        """
        Check whether this node should initiate a connection to another node

        :param node: the other node
        :type node: Node
        """

        return isinstance(node, TCPNode) and node not in self._preventConnectNodes and (self._selfIsReadonlyNode or self._selfNode.address > node.address)

    def _connectIfNecessarySingle(self, node):
        """
        Connect to a node if necessary.

        :param node: node to connect to
        :type node: Node
        """

        if node in self._connections and self._connections[node].state != CONNECTION_STATE.DISCONNECTED:
            return True
        if not self._shouldConnect(node):
            return False
        assert node in self._connections # Since we "should connect" to this node, there should always be a connection object already in place.
        if node in self._lastConnectAttempt and monotonicTime() - self._lastConnectAttempt[node] < self._syncObj.conf.connectionRetryTime:
            return False
        self._lastConnectAttempt[node] = monotonicTime()
        # raftq test hook (SyncObjConf.dialMap, the chaos harness's proxies): dial a peer at
        # another address than its identity. Each link is one TCP connection dialed by the peer
        # with the larger address, so a proxy per link sees exactly one pair of nodes.
        dial = self._syncObj.conf.dialMap.get(node.address)
        if dial is not None:
            host, port = dial.rsplit(':', 1)
            return self._connections[node].connect(host, int(port))
        return self._connections[node].connect(node.ip, node.port)

    def _connectIfNecessary(self):
        """
        Connect to all nodes as necessary.
        """

        for node in self._nodes:
            self._connectIfNecessarySingle(node)

    def _sendSelfAddress(self, conn):
        if self._selfIsReadonlyNode:
            conn.send('readonly')
        else:
            conn.send(self._selfNode.address)

    def _onOutgoingConnected(self, conn):
        """
        Callback for when a new connection from this to another node is established. Handles encryption and informs the other node which node this is.
        If encryption is disabled, this triggers the onNodeConnected callback and messages are deferred to the onMessageReceived callback.
        If encryption is enabled, the first message is handled by _onOutgoingMessageReceived.

        :param conn: connection object
        :type conn: TcpConnection
        """

        if self._syncObj.encryptor:
            conn.maxFrame = HANDSHAKE_MAX_FRAME     # raftq: until the peer's key has decrypted
            conn.setOnMessageReceivedCallback(functools.partial(self._onOutgoingMessageReceived, conn)) # So we can process the sendRandKey
            conn.recvRandKey = os.urandom(32)
            conn.send(conn.recvRandKey)
        else:
            self._sendSelfAddress(conn)
            # The onMessageReceived callback is configured in addNode already.
            self._onNodeConnected(self._connToNode(conn))

    def _onOutgoingMessageReceived(self, conn, message):
        """
        Callback for receiving a message on a new outgoing connection. Used only if encryption is enabled to exchange the random keys.
        Once the key exchange is done, this triggers the onNodeConnected callback, and further messages are deferred to the onMessageReceived callback.

        :param conn: connection object
        :type conn: TcpConnection
        :param message: received message
        :type message: any
        """

        if not conn.sendRandKey:
            conn.sendRandKey = message
            conn.maxFrame = None
            self._sendSelfAddress(conn)

        node = self._connToNode(conn)
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        self._onNodeConnected(node)

    def _onDisconnected(self, conn):
        """
        Callback for when a connection is terminated or considered dead. Initiates a reconnect if necessary.

        :param conn: connection object
        :type conn: TcpConnection
        """

        # raftq: why the connection was closed, if it was refused (see REFUSALS). A frame that
        # failed before the handshake was done failed authentication (with the secret) or was
        # not a message (without); on an established link it is bad_frame.
        reason, conn.refusal = conn.refusal, None
        if reason is not None:
            if reason == 'bad_frame' and (conn in self._unknownConnections or conn.maxFrame is not None):
                reason = 'auth_failed' if self._encrypted else 'malformed'
            self._refused(conn, reason)
        self._unknownConnections.discard(conn)
        node = self._connToNode(conn)
        if node is not None:
            if node in self._nodes:
                self._onNodeDisconnected(node)
                self._connectIfNecessarySingle(node)
            else:
                self._readonlyNodes.discard(node)
                self._onReadonlyNodeDisconnected(node)

    def waitReady(self):
        """
        Wait for the TCP transport to become ready for operation, i.e. the server to be bound.
        This method should be called from a different thread than used for the SyncObj ticks.

        :raises TransportNotReadyError: if the number of bind tries exceeds the configured limit
        """

        self._bindOverEvent.wait()
        if not self._ready:
            raise TransportNotReadyError

    def addNode(self, node):
        """
        Add a node to the network

        :param node: node to add
        :type node: TCPNode
        """

        self._nodes.add(node)
        self._nodeAddrToNode[node.address] = node
        if self._shouldConnect(node):
            conn = TcpConnection(
                poller = self._syncObj._poller,
                timeout = self._syncObj.conf.connectionTimeout,
                sendBufferSize = self._syncObj.conf.sendBufferSize,
                recvBufferSize = self._syncObj.conf.recvBufferSize,
                keepalive = self._syncObj.conf.tcp_keepalive,
                compressionLevel = self._syncObj.conf.compressionLevel,
            )
            conn.encryptor = self._syncObj.encryptor
            conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
            conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
            self._connections[node] = conn

    def dropNode(self, node):
        """
        Drop a node from the network

        :param node: node to drop
        :type node: Node
        """

        conn = self._connections.pop(node, None)
        if conn is not None:
            # Calling conn.disconnect() immediately triggers the onDisconnected callback if the connection isn't already disconnected, so this is necessary to prevent the automatic reconnect.
            self._preventConnectNodes.add(node)
            conn.disconnect()
            self._preventConnectNodes.remove(node)
        if isinstance(node, TCPNode):
            self._nodes.discard(node)
            self._nodeAddrToNode.pop(node.address, None)
        else:
            self._readonlyNodes.discard(node)
        self._lastConnectAttempt.pop(node, None)

    def send(self, node, message):
        """
        Send a message to a node. Returns False if the connection appears to be dead either before or after actually trying to send the message.

        :param node: target node
        :type node: Node
        :param message: message
        :param message: any
        :returns success
        :rtype bool
        """

        # raftq: not before the handshake is done (upstream sent e.g. a request_vote in it: the
        # peer, expecting the address, raised on the unhashable message and dropped it).
        conn = self._connections.get(node)
        if conn is None or not self._handshakeDone(conn):
            return False
        if self._send_random_sleep_duration:
            time.sleep(random.random() * self._send_random_sleep_duration)
        conn.send(message)
        if conn.state != CONNECTION_STATE.CONNECTED:
            return False
        return True

    def destroy(self):
        """
        Destroy this transport
        """

        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        self.setOnReadonlyNodeConnectedCallback(None)
        self.setOnReadonlyNodeDisconnectedCallback(None)
        for node in self._nodes | self._readonlyNodes:
            self.dropNode(node)
        if self._server is not None:
            self._server.unbind()
        for conn in list(self._unknownConnections):
            conn.disconnect()
        self._unknownConnections = set()
