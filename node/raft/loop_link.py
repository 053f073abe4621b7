"""The Raft link of the Ready loop (node/raft/loop.py): messages between nodes over asyncio.

A frame is a 4-byte length and a body; with the cluster secret the body is
an AES-GCM token of the fork's encryptor (node/raft/encryptor.py: authenticated, keyed by the
secret), so a frame that does not decrypt closes its connection. A message is a tuple of builtins
pickled, read back with the builtins-only unpickler (node/raft/pickle.py): nothing read from the
network names a class.

What is sent to a peer that is not connected, or whose socket has more than `max_buffered`
bytes unsent, is dropped: Raft sends again what was not answered (the core's retransmits and
heartbeats), so the link never queues without bound.
"""
from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import struct
import time

from .core import Entry, EntryKind, Message, MessageType, Snapshot
from .pickle import loadsBuiltins
from .transport import HANDSHAKE_MAX_FRAME, REFUSAL_LOG_PERIOD, REFUSALS

log = logging.getLogger("raftq.raft.link")

_LEN = struct.Struct("i")         # pysyncobj's length prefix (the chaos proxy reads it)
MAX_FRAME = 256 << 20            # a snapshot travels in one frame
_TYPES = {t.value: t for t in MessageType}


def encode(m: Message) -> bytes:
    snap = m.snapshot
    return pickle.dumps((
        m.type.value, m.src, m.dst, m.term, m.last_log_index, m.last_log_term, m.granted,
        m.prev_log_index, m.prev_log_term, tuple((e.index, e.term, e.data, int(e.kind)) for e in m.entries),
        m.commit_index, m.success, m.next_node_idx, m.reject_index, m.log_unverified, m.want_commit,
        None if snap is None else (snap.index, snap.term, tuple(sorted(snap.voters)), snap.data)), 5)


def decode(data: bytes) -> Message:
    (kind, src, dst, term, lli, llt, granted, pli, plt, entries, commit, success, nni, reject, unverified, want,
     snap) = loadsBuiltins(data)
    return Message(_TYPES[kind], src, dst, term, lli, llt, granted, pli, plt,
                   tuple(Entry(i, t, d, EntryKind(k)) for i, t, d, k in entries), commit, success, nni, reject,
                   unverified, want, None if snap is None else Snapshot(snap[0], snap[1], frozenset(snap[2]), snap[3]))


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


class _Peer:
    __slots__ = ("addr", "writer", "frames")

    def __init__(self, addr):
        self.addr = addr
        self.writer = None
        self.frames: list = []


class Links:
    """One connection per pair of nodes, dialed by the node whose address string is larger and
    used both ways (pysyncobj's topology, which the chaos proxy models: cluster/chaos/proxy.py).
    The dialer sends two handshake frames, its address and a random challenge; the other answers
    the challenge: with the cluster secret each side has shown the other it holds it before any
    message flows. `on_message(Message)` is called on the loop for every message read; `send`
    queues a frame and `flush` writes what each peer has queued in one write (once per Ready).
    `on_lost(addr)`, when given, is called on the loop when a peer's connection ends other than
    by this side's choice (the peer closed or reset it, a read failed, a frame was refused)."""

    def __init__(self, loop, self_addr, peers, encryptor, on_message, *, dial_map=None, retry_s=0.2,
                 max_buffered=64 << 20, handshake_timeout_s=5.0, max_pending=64, on_lost=None):
        self.loop = loop
        self.self_addr = self_addr
        self.peers = {p: _Peer(p) for p in peers if p != self_addr}
        self.encryptor = encryptor
        self.on_message = on_message
        self.on_lost = on_lost
        self.dial_map = dial_map or {}
        self.retry_s = retry_s
        self.max_buffered = max_buffered
        self.handshake_timeout_s = handshake_timeout_s
        self.max_pending = max_pending
        self.server = None
        self.dialers: dict = {}         # peer address -> its dialing task (this node dials the smaller addresses)
        self.conns: set = set()
        self.pending: dict = {}         # incoming connections in their handshake -> their task, oldest first
        self.closed = False
        self.refusals = dict.fromkeys(REFUSALS, 0)      # the fork's reasons (node/raft/transport.py)
        self.dropped = 0                # frames not sent: the peer's socket had max_buffered unsent
        self._refusal_log_at, self._refusals_unlogged = -REFUSAL_LOG_PERIOD, 0

    async def start(self):
        host, port = _split(self.self_addr)
        self.server = await asyncio.start_server(self._accept, host, port, reuse_address=True)
        for peer in self.peers.values():
            self._dial_if_ours(peer)

    def _dial_if_ours(self, peer: _Peer):
        if self.self_addr > peer.addr and not self.closed:
            self.dialers[peer.addr] = self.loop.create_task(self._dial(peer))

    def connected(self, addr) -> bool:
        peer = self.peers.get(addr)
        return peer is not None and peer.writer is not None

    def set_peers(self, addrs):
        """The peers from now on (a membership change, a learner: docs/cluster.md "Membership
        changes"): a new one is dialed or accepted, a dropped one's connection is closed and its
        connections are refused from now on as an unknown peer's."""
        wanted = set(addrs) - {self.self_addr}
        for addr in wanted - set(self.peers):
            peer = self.peers[addr] = _Peer(addr)
            if self.server is not None:         # (before start() the start dials it)
                self._dial_if_ours(peer)
        for addr in set(self.peers) - wanted:
            peer = self.peers.pop(addr)
            dialer = self.dialers.pop(addr, None)
            if dialer is not None:
                dialer.cancel()
            if peer.writer is not None:
                peer.writer.close()

    # ------------------------------------------------------------------ framing
    def _frame(self, body: bytes) -> bytes:
        if self.encryptor is not None:
            body = self.encryptor.encrypt_at_time(body, int(time.time()))
        return _LEN.pack(len(body)) + body

    async def _read_frame(self, reader, max_frame=MAX_FRAME) -> bytes:
        (size,) = _LEN.unpack(await reader.readexactly(4))
        if not 0 <= size <= max_frame:
            raise _Refused("frame_too_large")      # before anything of it is buffered
        body = await reader.readexactly(size)
        if self.encryptor is not None:
            try:
                body = self.encryptor.decrypt(body)
            except Exception:                   # noqa: BLE001 - another secret, or not ours
                raise _Refused("auth_failed")
        return body

    def _handshake_frame(self, reader):
        return asyncio.wait_for(self._read_frame(reader, HANDSHAKE_MAX_FRAME), self.handshake_timeout_s)

    def _refused(self, writer, incoming: bool, reason: str):
        """Count a refusal and log it, at most one line per REFUSAL_LOG_PERIOD with the number
        left out since (the fork's TCPTransport._refused): only the peer's address and the
        reason, nothing it sent, never the secret."""
        self.refusals[reason] += 1
        now = time.monotonic()
        if now - self._refusal_log_at < REFUSAL_LOG_PERIOD:
            self._refusals_unlogged += 1
            return
        more = f" ({self._refusals_unlogged} more refusals since the last such line)" if self._refusals_unlogged else ""
        self._refusal_log_at, self._refusals_unlogged = now, 0
        peer = writer.get_extra_info("peername")
        peer = "%s:%s" % peer[:2] if isinstance(peer, tuple) else str(peer)
        log.warning("Raft link: closed the connection %s %s: %s%s", "from" if incoming else "to", peer,
                    reason.replace("_", " "), more)

    # ------------------------------------------------------------------ sending
    def send(self, m: Message):
        peer = self.peers.get(m.dst)
        if peer is None or peer.writer is None:
            return
        peer.frames.append(self._frame(encode(m)))

    def flush(self):
        for peer in self.peers.values():
            if not peer.frames:
                continue
            frames, peer.frames = peer.frames, []
            w = peer.writer
            if w is None or w.is_closing():
                continue
            if w.transport.get_write_buffer_size() > self.max_buffered:
                self.dropped += len(frames)      # Raft sends them again
                continue
            w.write(b"".join(frames))

    # ------------------------------------------------------------------ connections
    def _current(self, peer: _Peer) -> bool:
        return not self.closed and self.peers.get(peer.addr) is peer

    async def _dial(self, peer: _Peer):
        while self._current(peer):
            target = self.dial_map.get(peer.addr, peer.addr)
            writer, heard = None, False
            try:
                host, port = _split(target)
                reader, writer = await asyncio.open_connection(host, port)
                _nodelay(writer)
                challenge = os.urandom(16)
                writer.write(self._frame(pickle.dumps(("hello", self.self_addr), 5)) +
                             self._frame(pickle.dumps(("challenge", challenge), 5)))
                answer = await self._handshake_frame(reader)
                if _load(answer) != ("answer", challenge):
                    raise _Refused("auth_failed")
                heard = await self._serve(peer, reader, writer, False)
            except _Refused as r:
                self._refused(writer, False, r.reason)
            except asyncio.TimeoutError:
                self._refused(writer, False, "handshake_timeout")
            except (OSError, ValueError, RuntimeError, asyncio.IncompleteReadError):
                pass                # (RuntimeError: uvloop's write to a transport already closed)
            finally:
                if writer is not None:
                    writer.close()
            # A connection that carried messages and ended (a reset) is dialed again at once: the
            # other side tells a live peer from a dead one by the connection coming back
            # (LoopSyncObj._on_lost). A failed dial, or a connection that carried nothing, waits.
            if self._current(peer) and not heard:
                await asyncio.sleep(self.retry_s)

    async def _accept(self, reader, writer):
        if self.closed:
            writer.close()
            return
        _nodelay(writer)
        if len(self.pending) >= self.max_pending:       # make room: the oldest handshake goes
            oldest = next(iter(self.pending))
            self.pending.pop(oldest).cancel()
            oldest.close()
            self._refused(oldest, True, "too_many_pending")
        self.pending[writer] = asyncio.current_task()
        try:
            hello, challenge = _load(await self._handshake_frame(reader)), _load(await self._handshake_frame(reader))
            if not (isinstance(hello, tuple) and len(hello) == 2 and hello[0] == "hello"):
                raise _Refused("malformed")
            peer = self.peers.get(hello[1])
            if peer is None:
                raise _Refused("unknown_peer")
            if not (isinstance(challenge, tuple) and len(challenge) == 2 and challenge[0] == "challenge"):
                raise _Refused("malformed")
            writer.write(self._frame(pickle.dumps(("answer", challenge[1]), 5)))
            self.pending.pop(writer, None)
            await self._serve(peer, reader, writer, True)
        except _Refused as r:
            self._refused(writer, True, r.reason)
        except asyncio.TimeoutError:
            self._refused(writer, True, "handshake_timeout")
        except (OSError, RuntimeError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass                    # (RuntimeError: uvloop's write to a transport the pending cap closed)
        finally:
            self.pending.pop(writer, None)
            writer.close()

    async def _serve(self, peer: _Peer, reader, writer, incoming: bool):
        """The connection is the pair's: messages both ways until it closes. Read in chunks and
        cut into frames here (one await per chunk, not two per frame: measured ≈ 10 µs a job on
        a follower with readexactly)."""
        if not self._current(peer):
            return          # dropped (set_peers) during the handshake
        old = peer.writer
        if old is not None:
            old.close()
        peer.writer, peer.frames = writer, []
        self.conns.add(writer)
        buf, heard = bytearray(), False
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                buf += data
                pos = self._frames_in(peer, buf)
                if pos:
                    del buf[:pos]
                    heard = True
        except _Refused as r:
            self._refused(writer, incoming, r.reason)
        except OSError:
            pass
        finally:
            self.conns.discard(writer)
            if peer.writer is writer:       # (not replaced by a newer connection of the pair)
                peer.writer, peer.frames = None, []
                if self.on_lost is not None and self._current(peer):
                    self.on_lost(peer.addr)
        return heard

    def _frames_in(self, peer, buf) -> int:
        """Hand every whole frame in `buf` on; how many bytes they took."""
        pos, end, enc = 0, len(buf), self.encryptor
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if not 0 <= size <= MAX_FRAME:
                raise _Refused("bad_frame")
            if end - pos - 4 < size:
                break
            body = bytes(buf[pos + 4:pos + 4 + size])
            pos += 4 + size
            try:
                m = decode(enc.decrypt(body) if enc is not None else body)
            except Exception:           # noqa: BLE001 - not one of ours: close, never crash the loop
                raise _Refused("bad_frame")
            if m.dst == self.self_addr and m.src == peer.addr:
                self.on_message(m)
        return pos

    async def close(self):
        self.closed = True
        for t in self.dialers.values():
            t.cancel()
        for w in list(self.conns):
            w.close()
        if self.server is not None:
            self.server.close()


class _Refused(Exception):
    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def _load(data):
    """A handshake frame: builtins only; anything else is `malformed`."""
    try:
        return loadsBuiltins(data)
    except Exception:                   # noqa: BLE001 - a pickle error, a global refused, garbage
        raise _Refused("malformed")


def _nodelay(writer):
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
