import errno
import logging
import socket
import time

from .poller import POLL_EVENT_TYPE
from .tcp_connection import TcpConnection, _getAddrType

log = logging.getLogger(__name__)

# raftq: accept errors that say the process (or the system) is out of descriptors or memory for
# now. Upstream unbound the server on any accept error, for good: a flood of connections on any
# port of the process (the HTTP API's included) could leave the node unreachable by its peers.
# On these the server stops accepting for ACCEPT_PAUSE seconds instead (the listening socket is
# level-triggered: it would be reported again at once) and then resumes.
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# Errors of the one connection being accepted (it went away before accept returned).
_CONNECTION_GONE = (errno.ECONNABORTED, errno.EPROTO, errno.ECONNRESET, errno.EPERM)
ACCEPT_PAUSE = 0.5


class SERVER_STATE:
    UNBINDED = 0,
    BINDED = 1


class TcpServer(object):

    def __init__(
            self, poller, host, port, onNewConnection,
            sendBufferSize = 2 ** 13,
            recvBufferSize = 2 ** 13,
            connectionTimeout = 3.5,
            keepalive = None,
            compressionLevel = 0,
            backlog = 128,
    ):
        self.__poller = poller
        self.__host = host
        self.__port = int(port)
        self.__hostAddrType = _getAddrType(host)
        self.__sendBufferSize = sendBufferSize
        self.__recvBufferSize = recvBufferSize
        self.__socket = None
        self.__fileno = None
        self.__keepalive = keepalive
        self.__state = SERVER_STATE.UNBINDED
        self.__onNewConnectionCallback = onNewConnection
        self.__connectionTimeout = connectionTimeout
        self.__compressionLevel = compressionLevel
        self.__backlog = backlog
        self.__resumeAt = None
        self.__lastAcceptWarning = 0.0

    def bind(self):
        self.__socket = socket.socket(self.__hostAddrType, socket.SOCK_STREAM)
        self.__socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.__sendBufferSize)
        self.__socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.__recvBufferSize)
        self.__socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.__socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.__socket.setblocking(0)
        self.__socket.bind((self.__host, self.__port))
        # raftq: upstream's backlog of 5 let six connections that never speak fill it.
        self.__socket.listen(self.__backlog)
        self.__fileno = self.__socket.fileno()
        self.__poller.subscribe(self.__fileno,
                                self.__onNewConnection,
                                POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)
        self.__state = SERVER_STATE.BINDED

    def unbind(self):
        self.__state = SERVER_STATE.UNBINDED
        if self.__fileno is not None:
            self.__poller.unsubscribe(self.__fileno)
            self.__fileno = None
        if self.__socket is not None:
            self.__socket.close()

    def resumeAccepting(self):
        """raftq: called every tick; accepting again once an out-of-resources pause is over."""
        if self.__resumeAt is not None and time.monotonic() >= self.__resumeAt:
            self.__resumeAt = None
            if self.__fileno is not None:
                self.__poller.subscribe(self.__fileno, self.__onNewConnection,
                                        POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def __onNewConnection(self, descr, event):
        if event & POLL_EVENT_TYPE.READ:
            try:
                sock, addr = self.__socket.accept()
            except socket.error as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK) or e.errno in _CONNECTION_GONE:
                    return
                if e.errno in _OUT_OF_RESOURCES:
                    now = time.monotonic()
                    if now - self.__lastAcceptWarning >= 10.0:
                        self.__lastAcceptWarning = now
                        log.warning('Raft port: cannot accept a connection (%s); accepting again in %.1f s',
                                    errno.errorcode.get(e.errno, e.errno), ACCEPT_PAUSE)
                    self.__poller.unsubscribe(self.__fileno)
                    self.__resumeAt = now + ACCEPT_PAUSE
                    return
                self.unbind()
                return
            # raftq: a connection reset before its options are set fails alone; upstream let
            # the error unbind the server.
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.__sendBufferSize)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.__recvBufferSize)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(0)
                conn = TcpConnection(
                    poller=self.__poller,
                    socket=sock,
                    timeout=self.__connectionTimeout,
                    sendBufferSize=self.__sendBufferSize,
                    recvBufferSize=self.__recvBufferSize,
                    keepalive=self.__keepalive,
                    compressionLevel=self.__compressionLevel,
                )
            except socket.error:
                sock.close()
                return
            conn.peer = addr
            self.__onNewConnectionCallback(conn)

        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()
            return
