import errno
import time
import socket
from sys import platform
import zlib
import struct

from . import pickle
from .poller import POLL_EVENT_TYPE

monotonicTime = time.monotonic

# raftq: a socket is read at most this much at a time (see __processRead).
RECV_CHUNK = 1 << 16


class CONNECTION_STATE:
    DISCONNECTED = 0
    CONNECTING = 1
    CONNECTED = 2

def _getAddrType(addr):
    try:
        socket.inet_aton(addr)
        return socket.AF_INET
    except socket.error:
        pass
    try:
        socket.inet_pton(socket.AF_INET6, addr)
        return socket.AF_INET6
    except socket.error:
        pass
    raise Exception('unknown address type')

def set_keepalive_linux(sock, after_idle_sec=1, interval_sec=3, max_fails=5):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, after_idle_sec)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval_sec)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max_fails)

def set_keepalive_osx(sock, after_idle_sec=1, interval_sec=3, max_fails=5):
    TCP_KEEPALIVE = 0x10
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, TCP_KEEPALIVE, interval_sec)

def set_keepalive(sock, after_idle_sec=1, interval_sec=3, max_fails=5):
    if platform == "linux" or platform == "linux2":
        set_keepalive_linux(sock, after_idle_sec, interval_sec, max_fails)
    elif platform == "darwin":
        set_keepalive_osx(sock, after_idle_sec, interval_sec, max_fails)


class TcpConnection(object):

    def __init__(self, poller, onMessageReceived = None, onConnected = None, onDisconnected = None,
                 socket=None, timeout=10.0, sendBufferSize = 2 ** 13, recvBufferSize = 2 ** 13,
                 keepalive=None, compressionLevel=0):
        self.sendRandKey = None
        self.recvRandKey = None
        self.recvLastTimestamp = 0
        self.encryptor = None
        # raftq: the transport's view of the handshake (transport.py). `maxFrame`: the largest
        # frame taken, None for no bound (the transport sets the handshake's bound until the
        # peer has authenticated); `refusal`: why this connection dropped a frame or was closed
        # by the transport, read by its disconnect callback; `peer`: the address of the other
        # end, for the log; `startTime`: when the connection was accepted or dialled; `incoming`:
        # accepted (given a socket) rather than dialled.
        self.maxFrame = None
        self.incoming = socket is not None
        self.refusal = None
        self.peer = None
        self.startTime = monotonicTime()

        self.__socket = socket
        # raftq: a bytearray, grown in place and consumed from the front (both amortised O(1));
        # upstream's bytes `+=` copied the whole buffer on every read, quadratic in a frame's
        # size (64 MB of a hostile frame cost 12 s of CPU).
        self.__readBuffer = bytearray()
        self.__writeBuffer = bytes()
        self.__lastReadTime = monotonicTime()
        self.__timeout = timeout
        self.__poller = poller
        self.__keepalive = keepalive
        if socket is not None:
            self.__socket = socket
            self.__fileno = socket.fileno()
            self.__state = CONNECTION_STATE.CONNECTED
            self.setSockoptKeepalive()
            self.__poller.subscribe(self.__fileno,
                                     self.__processConnection,
                                     POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)
        else:
            self.__state = CONNECTION_STATE.DISCONNECTED
            self.__fileno = None
            self.__socket = None

        self.__onMessageReceived = onMessageReceived
        self.__onConnected = onConnected
        self.__onDisconnected = onDisconnected
        self.__sendBufferSize = sendBufferSize
        self.__recvBufferSize = recvBufferSize
        self.__compressionLevel = compressionLevel

    def setSockoptKeepalive(self):
        if self.__socket is None:
            return
        if self.__keepalive is None:
            return
        set_keepalive(
            self.__socket,
            self.__keepalive[0],
            self.__keepalive[1],
            self.__keepalive[2],
        )

    def setOnConnectedCallback(self, onConnected):
        self.__onConnected = onConnected

    def setOnMessageReceivedCallback(self, onMessageReceived):
        self.__onMessageReceived = onMessageReceived

    def setOnDisconnectedCallback(self, onDisconnected):
        self.__onDisconnected = onDisconnected

    def connect(self, host, port):
        if host is None:
            return False
        self.__state = CONNECTION_STATE.DISCONNECTED
        self.__fileno = None
        self.__socket = socket.socket(_getAddrType(host), socket.SOCK_STREAM)
        self.__socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.__sendBufferSize)
        self.__socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.__recvBufferSize)
        self.__socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.setSockoptKeepalive()
        self.__socket.setblocking(0)
        self.__readBuffer = bytearray()
        self.__writeBuffer = bytes()
        self.__lastReadTime = monotonicTime()
        self.startTime = monotonicTime()
        self.refusal = None
        self.peer = (host, port)

        try:
            self.__socket.connect((host, port))
        except socket.error as e:
            if e.errno not in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                return False
        self.__fileno = self.__socket.fileno()
        self.__state = CONNECTION_STATE.CONNECTING
        self.__poller.subscribe(self.__fileno,
                                 self.__processConnection,
                                 POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)
        return True

    def send(self, message):
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        # raftq: upstream compresses every message at zlib level 3, which costs more CPU than
        # anything else per message (~100 us for an 18 KB batch of 256-byte random payloads,
        # saving a quarter of the bytes). The level is a setting (SyncObjConf.compressionLevel,
        # 0 by default), and 0 means no zlib call at all: even at level 0 each zlib.compress sets
        # up a fresh deflate state, ~45 us per message whatever its size. Such a message is the
        # bare pickle, which starts with the PROTO opcode 0x80 where a zlib stream starts with
        # 0x78, so the receiver tells them apart and reads either (__processParseMessage).
        data = pickle.dumps(message)
        if self.__compressionLevel:
            data = zlib.compress(data, self.__compressionLevel)
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(monotonicTime()))
        data = struct.pack('i', len(data)) + data
        self.__writeBuffer += data
        self.__trySendBuffer()

    def fileno(self):
        return self.__fileno

    def disconnect(self):
        needCallDisconnect = False
        if self.__onDisconnected is not None and self.__state != CONNECTION_STATE.DISCONNECTED:
            needCallDisconnect = True
        self.sendRandKey = None
        self.recvRandKey = None
        self.recvLastTimestamp = 0
        if self.__socket is not None:
            self.__socket.close()
            self.__socket = None
        if self.__fileno is not None:
            self.__poller.unsubscribe(self.__fileno)
            self.__fileno = None
        self.__writeBuffer = bytes()
        self.__readBuffer = bytearray()
        self.__state = CONNECTION_STATE.DISCONNECTED
        if needCallDisconnect:
            self.__onDisconnected()

    def getSendBufferSize(self):
        return len(self.__writeBuffer)

    def __processConnection(self, descr, eventType):
        # raftq: a read on a connected socket skips the SO_ERROR check below. That check is
        # needed while connecting (a refused connect shows up only there) and before a write;
        # for a read the recv itself reports any error. One syscall less per message.
        if eventType == POLL_EVENT_TYPE.READ and descr == self.__fileno and \
                self.__state == CONNECTION_STATE.CONNECTED:
            self.__processConnectionTimeout()
            if self.__state == CONNECTION_STATE.DISCONNECTED:
                return
            self.__tryReadBuffer()
            if self.__state == CONNECTION_STATE.DISCONNECTED:
                return
            while True:
                message = self.__processParseMessage()
                if message is None:
                    break
                if self.__onMessageReceived is not None:
                    self.__onMessageReceived(message)
                if self.__state == CONNECTION_STATE.DISCONNECTED:
                    return
            return

        poller = self.__poller
        if descr != self.__fileno:
            poller.unsubscribe(descr)
            return

        if eventType & POLL_EVENT_TYPE.ERROR:
            self.disconnect()
            return

        self.__processConnectionTimeout()
        if self.state == CONNECTION_STATE.DISCONNECTED:
            return

        if eventType & POLL_EVENT_TYPE.READ or eventType & POLL_EVENT_TYPE.WRITE:
            if self.__socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return

            if self.__state == CONNECTION_STATE.CONNECTING:
                if self.__onConnected is not None:
                    self.__onConnected()
                if self.__state == CONNECTION_STATE.DISCONNECTED:
                    return
                self.__state = CONNECTION_STATE.CONNECTED
                self.__lastReadTime = monotonicTime()
                return

        if eventType & POLL_EVENT_TYPE.WRITE:
            self.__trySendBuffer()
            if self.__state == CONNECTION_STATE.DISCONNECTED:
                return
            event = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
            if len(self.__writeBuffer) > 0:
                event |= POLL_EVENT_TYPE.WRITE
            poller.subscribe(descr, self.__processConnection, event)

        if eventType & POLL_EVENT_TYPE.READ:
            self.__tryReadBuffer()
            if self.__state == CONNECTION_STATE.DISCONNECTED:
                return

            while True:
                message = self.__processParseMessage()
                if message is None:
                    break
                if self.__onMessageReceived is not None:
                    self.__onMessageReceived(message)
                if self.__state == CONNECTION_STATE.DISCONNECTED:
                    return

    def __processConnectionTimeout(self):
        if monotonicTime() - self.__lastReadTime > self.__timeout:
            self.disconnect()
            return

    def __trySendBuffer(self):
        self.__processConnectionTimeout()
        if self.state == CONNECTION_STATE.DISCONNECTED:
            return
        while self.__processSend():
            pass

    def __processSend(self):
        if not self.__writeBuffer:
            return False
        try:
            res = self.__socket.send(self.__writeBuffer)
            if res < 0:
                self.disconnect()
                return False
            if res == 0:
                return False
            self.__writeBuffer = self.__writeBuffer[res:]
            return True
        except socket.error as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False

    def __tryReadBuffer(self):
        # raftq: with a frame bound (before authentication) reading stops as soon as the buffer
        # holds more than one frame of it, so that the length prefix is checked then; upstream
        # read for as long as the socket had data, which a sender streaming fast enough keeps
        # true: the whole 64 MB of a hostile frame before anything was parsed.
        bound = self.maxFrame
        while self.__processRead():
            if bound is not None and len(self.__readBuffer) > bound + 4:
                break
        self.__lastReadTime = monotonicTime()

    def __processRead(self):
        # raftq: upstream reads recv(recvBufferSize), the same number it uses as the kernel's
        # SO_RCVBUF (2 MB in raftq, for bursts). A 2 MB recv allocates a 2 MB bytes object per
        # call, message or not, and costs ~20 us more per read than a 64 KB one on the project
        # VM. Reads take at most RECV_CHUNK at a time; the kernel buffer stays large. A read that
        # returns less than it asked for has emptied the socket, so the loop stops there instead
        # of paying a failing recv (and the SO_ERROR check after every read: data received means
        # the socket is fine); the poller is level-triggered and reports the socket again when
        # more arrives.
        try:
            chunk = min(self.__recvBufferSize, RECV_CHUNK)
            incoming = self.__socket.recv(chunk)
        except socket.error as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if not incoming:
            self.disconnect()
            return False
        self.__readBuffer += incoming
        return len(incoming) == chunk

    def __processParseMessage(self):
        buf = self.__readBuffer
        if len(buf) < 4:
            return None
        l = struct.unpack_from('i', buf)[0]
        # raftq: a length is checked before its frame is buffered. Upstream waited for any
        # length (a negative one never completes, 0x7fffffff is 2 GB) before the token could be
        # checked; until the peer has authenticated, the transport sets maxFrame to what the
        # handshake needs.
        if l < 0 or (self.maxFrame is not None and l > self.maxFrame):
            self.refusal = 'frame_too_large'
            self.disconnect()
            return None
        if len(buf) - 4 < l:
            return None
        data = bytes(memoryview(buf)[4:4 + l])     # one copy (a bytearray slice and bytes() would be two)
        try:
            if self.encryptor:
                dataTimestamp = self.encryptor.extract_timestamp(data)
                assert dataTimestamp >= self.recvLastTimestamp
                self.recvLastTimestamp = dataTimestamp
                # Unfortunately we can't get a timestamp and data in one go
                data = self.encryptor.decrypt(data)
            if data[:1] != b'\x80':    # raftq: a zlib stream (level > 0), else the bare pickle
                data = zlib.decompress(data)
            message = pickle.loads(data)
            if self.recvRandKey:
                randKey, message = message
                assert randKey == self.recvRandKey
        except:
            # raftq: counted and logged by the transport (its disconnect callback reads why).
            self.refusal = 'bad_frame'
            self.disconnect()
            return None
        del buf[:4 + l]
        return message

    @property
    def state(self):
        return self.__state
