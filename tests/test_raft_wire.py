"""The Raft link (node/raft, FORK.md "Wire"): authenticated encryption with the cluster secret,
pickle protocol 5, no zlib call at compression level 0, lean socket reads."""
import pickle
import socket
import time

import pytest

from raftq.node.raft import encryptor, tcp_connection
from raftq.node.raft import pickle as raft_pickle
from raftq.node.raft.encryptor import AeadEncryptor
from raftq.node.raft.poller import PollPoller
from raftq.node.raft.tcp_connection import RECV_CHUNK, TcpConnection


def test_round_trip_and_timestamp():
    a, b = AeadEncryptor("s3cret"), AeadEncryptor("s3cret")
    token = a.encrypt_at_time(b"entries" * 50, 12345)
    assert b.extract_timestamp(token) == 12345
    assert b.decrypt(token) == b"entries" * 50
    assert b"entries" not in token                         # encrypted, not just signed


@pytest.mark.parametrize("where", [-1, 5, 20, 30])          # tag, timestamp, salt, nonce
def test_tampering_is_refused(where):
    a, b = AeadEncryptor("s3cret"), AeadEncryptor("s3cret")
    token = bytearray(a.encrypt_at_time(b"x" * 100, 7))
    token[where] ^= 1
    with pytest.raises(Exception):
        b.decrypt(bytes(token))


def test_wrong_secret_is_refused_and_nonces_never_repeat():
    a = AeadEncryptor("s3cret")
    token = a.encrypt_at_time(b"x", 1)
    with pytest.raises(Exception):
        AeadEncryptor("other").decrypt(token)
    nonces = {a.encrypt_at_time(b"x", 1)[25:37] for _ in range(1000)}
    assert len(nonces) == 1000
    # A restarted process (new salt) never reuses a key with the same nonce.
    assert a.encrypt_at_time(b"x", 1)[9:25] != AeadEncryptor("s3cret").encrypt_at_time(b"x", 1)[9:25]


def test_the_fork_uses_protocol_5_and_aead():
    assert vars(raft_pickle)["__protocol"] == 5
    assert raft_pickle.loads(raft_pickle.dumps(b"\xff" * 10)) == b"\xff" * 10
    assert raft_pickle.dumps(b"x")[:2] == b"\x80\x05"
    assert isinstance(encryptor.getEncryptor("s3cret"), AeadEncryptor)


# ---------------------------------------------------------------------------- a real connection pair
class _Recording(socket.socket):
    """A socket that records its recv sizes and getsockopt calls."""

    def __init__(self, sock: socket.socket):
        super().__init__(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self.recvs, self.sockopts, self.sent = [], 0, bytearray()

    def recv(self, n, *a):
        data = super().recv(n, *a)
        self.recvs.append((n, len(data)))
        return data

    def getsockopt(self, *a):
        self.sockopts += 1
        return super().getsockopt(*a)

    def send(self, data, *a):
        n = super().send(data, *a)
        self.sent += bytes(data[:n])
        return n


def _pair(level_a=0, level_b=0, secret=None):
    x, y = socket.socketpair()
    for s in (x, y):
        s.setblocking(False)
    poller = PollPoller()
    got = {"a": [], "b": []}
    sa, sb = _Recording(x), _Recording(y)
    a = TcpConnection(poller, onMessageReceived=got["a"].append, socket=sa, timeout=30,
                      sendBufferSize=1 << 21, recvBufferSize=1 << 21, compressionLevel=level_a)
    b = TcpConnection(poller, onMessageReceived=got["b"].append, socket=sb, timeout=30,
                      sendBufferSize=1 << 21, recvBufferSize=1 << 21, compressionLevel=level_b)
    if secret:
        a.encryptor, b.encryptor = AeadEncryptor(secret), AeadEncryptor(secret)
    return poller, (a, sa), (b, sb), got


def _pump(poller, until, timeout=10.0):
    end = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < end, "messages did not arrive"
        poller.poll(0.05)


def _payload(sock: _Recording) -> bytes:
    """The first frame's payload as it went on the wire."""
    n = int.from_bytes(sock.sent[:4], "little", signed=True)
    return bytes(sock.sent[4:4 + n])


def test_level_0_sends_the_bare_pickle_and_reads_both_forms(monkeypatch):
    message = {"type": "append_entries", "entries": [(b"x" * 300, 7, 2)]}
    for level_a, level_b in ((0, 0), (0, 3), (3, 0), (3, 3)):
        poller, (a, sa), (b, sb), got = _pair(level_a, level_b)
        if level_a == 0:
            # No zlib call at level 0.
            monkeypatch.setattr(tcp_connection.zlib, "compress", lambda *a: pytest.fail("zlib called"))
        a.send(message)
        monkeypatch.undo()
        _pump(poller, lambda: got["b"])
        wire = _payload(sa)
        if level_a == 0:
            assert wire == pickle.dumps(message, 5)
        else:
            assert wire[:1] == b"\x78" and len(wire) < len(pickle.dumps(message, 5))
        assert got["b"] == [message]
        b.send(message)                                    # and back, the other level
        _pump(poller, lambda: got["a"])
        assert got["a"] == [message]


def test_reads_take_at_most_64_kb_and_skip_the_sockopt_check_once_connected():
    poller, (a, sa), (b, sb), got = _pair(secret="s3cret")
    messages = [{"type": "x", "data": bytes([i]) * size}
                for i, size in enumerate((10, RECV_CHUNK - 100, RECV_CHUNK, RECV_CHUNK + 1, 3 << 20, 5))]
    for m in messages:
        a.send(m)
    _pump(poller, lambda: len(got["b"]) == len(messages))
    assert got["b"] == messages
    assert sb.recvs and all(asked == RECV_CHUNK for asked, _ in sb.recvs)
    # A short read ends the loop: no recv that finds nothing, no SO_ERROR check per read. (The
    # first readiness event may carry WRITE too and pays the check, as upstream does.)
    assert all(n > 0 for _, n in sb.recvs)
    assert sb.sockopts <= 1


def test_the_utility_protocol_is_gone():
    """Upstream answered syncobj_admin's commands (status, add, remove, set_version, transfer)
    on the Raft port to anyone who completed the handshake. The fork refuses any first message
    that is not a member's address, and keeps serving."""
    from raftq.cluster.local import free_ports
    from raftq.node.raft import SyncObj, SyncObjConf

    port = free_ports(1)[0]
    so = SyncObj(f"127.0.0.1:{port}", [], conf=SyncObjConf(autoTick=False))
    try:
        for first in (["status"], ["add", "127.0.0.1:1"], "127.0.0.1:1"):
            c = socket.create_connection(("127.0.0.1", port))
            data = pickle.dumps(first, 5)
            c.sendall(len(data).to_bytes(4, "little", signed=True) + data)
            c.settimeout(0.05)
            closed, end = False, time.monotonic() + 5
            while not closed and time.monotonic() < end:
                so.doTick(0.01)
                try:
                    closed = c.recv(100) == b""
                except socket.timeout:
                    pass
            assert closed, first                # disconnected, no answer
            c.close()
        so.doTick(0)
    finally:
        so.destroy()


def test_nothing_but_the_handshake_goes_out_before_the_peer_answers_it():
    """An outgoing connection counts as connected as soon as TCP is, but with the secret set the
    peer expects the key exchange and the address first. Upstream could send a request_vote in
    between (the peer raised on it), and the link keepalive would; the fork sends nothing else
    until the handshake is done."""
    from raftq.cluster.local import free_ports
    from raftq.node.raft import SyncObj, SyncObjConf

    low, high = sorted(f"127.0.0.1:{p}" for p in free_ports(2))       # the larger address dials
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", int(low.rsplit(":", 1)[1])))
    srv.listen()
    srv.settimeout(0.01)
    so = SyncObj(high, [low], conf=SyncObjConf(autoTick=False, password="s3cret", connectionRetryTime=0.1))
    try:
        peer, end = None, time.monotonic() + 5
        while peer is None:
            assert time.monotonic() < end, "no connection"
            so.doTick(0.01)
            try:
                peer, _ = srv.accept()
            except socket.timeout:
                pass
        end = time.monotonic() + 1.5                  # past a keepalive period, never answering
        while time.monotonic() < end:
            so.doTick(0.02)
        peer.settimeout(0.2)
        got = b""
        try:
            while True:
                chunk = peer.recv(65536)
                if not chunk:
                    break
                got += chunk
        except socket.timeout:
            pass
        frames = []
        while len(got) >= 4:
            n = int.from_bytes(got[:4], "little", signed=True)
            frames.append(got[4:4 + n])
            got = got[4 + n:]
        assert len(frames) == 1 and got == b""       # the key, nothing else
        peer.close()
    finally:
        so.destroy()
        srv.close()
