"""A fault-injecting TCP proxy for Raft links (chaos testing, no root needed).

pysyncobj opens exactly one TCP connection per pair of nodes, dialed by the node whose Raft
address string is larger. `ProxyNet` puts one `Link` (a listening socket that forwards to the
target's real Raft port) on every pair, and gives each dialer a `[testing] raft_dial_map` entry
`target_addr -> proxy_addr` (see node/replication/replica.py). Each link then carries both directions of
one pair: "fwd" = dialer -> target, "back" = target -> dialer.

Per direction a link can be
* passing (optionally with latency and jitter; order is kept),
* blocked: bytes are discarded (a one-way stall). pysyncobj's encrypted handshake needs frames in
  both directions before any Raft message flows, so the first handshake frames of each new
  connection still pass; everything after them is dropped. Once a stalled direction heals the
  connection is cut so that framing restarts clean.
Both directions blocked = the link is down: new connections are refused (accepted and reset at
once) and existing ones are cut. `reset()` cuts live connections with an RST.

Everything runs on a private event loop thread; the public methods are thread-safe and block
until applied.
"""
from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

FRAME_HEADER = struct.Struct("i")       # pysyncobj: native int length prefix


@dataclass
class LinkStats:
    accepted: int = 0
    refused: int = 0
    cut: int = 0
    bytes_fwd: int = 0
    bytes_back: int = 0
    dropped_fwd: int = 0
    dropped_back: int = 0


def _rst(writer: asyncio.StreamWriter | None):
    if writer is None:
        return
    try:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        writer.transport.abort()
    except Exception:
        pass


class _Conn:
    """One proxied TCP connection: two pumps (read side) and two senders (write side)."""

    def __init__(self, link: "Link", down_r, down_w, up_r, up_w):
        self.link = link
        self.down_r, self.down_w = down_r, down_w      # the dialer's side
        self.up_r, self.up_w = up_r, up_w              # the target's side
        self.dirty = {"fwd": False, "back": False}     # bytes were dropped in this direction
        self.closed = False
        self.tasks: list[asyncio.Task] = []

    def start(self):
        loop = asyncio.get_running_loop()
        for direction, reader, writer, hs in (("fwd", self.down_r, self.up_w, self.link.handshake_fwd),
                                              ("back", self.up_r, self.down_w, self.link.handshake_back)):
            q: asyncio.Queue = asyncio.Queue()
            self.tasks.append(loop.create_task(self._pump(direction, reader, q, hs)))
            self.tasks.append(loop.create_task(self._send(writer, q)))

    async def _pump(self, direction: str, reader: asyncio.StreamReader, q: asyncio.Queue, handshake_frames: int):
        link = self.link
        buf = b""
        frames_seen = 0
        last_due = 0.0
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                passing = data
                if frames_seen < handshake_frames:
                    # Count whole frames of the handshake; they pass even when blocked.
                    buf += data
                    passing = b""
                    while frames_seen < handshake_frames and len(buf) >= 4:
                        n = FRAME_HEADER.unpack(buf[:4])[0]
                        if n < 0 or len(buf) < 4 + n:
                            break
                        passing += buf[:4 + n]
                        buf = buf[4 + n:]
                        frames_seen += 1
                    if frames_seen < handshake_frames:
                        if passing:
                            q.put_nowait((time.monotonic(), passing))
                        continue
                    if passing:
                        q.put_nowait((time.monotonic(), passing))
                    passing, buf = buf, b""
                    if not passing:
                        continue
                if link.blocked(direction):
                    self.dirty[direction] = True
                    if direction == "fwd":
                        link.stats.dropped_fwd += len(passing)
                    else:
                        link.stats.dropped_back += len(passing)
                    continue
                if direction == "fwd":
                    link.stats.bytes_fwd += len(passing)
                else:
                    link.stats.bytes_back += len(passing)
                now = time.monotonic()
                due = now
                if link.latency > 0 or link.jitter > 0:
                    due = now + max(0.0, link.latency + link.rng.uniform(-link.jitter, link.jitter))
                due = max(due, last_due)           # keep the byte order
                last_due = due
                q.put_nowait((due, passing))
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            raise
        finally:
            q.put_nowait(None)

    async def _send(self, writer: asyncio.StreamWriter, q: asyncio.Queue):
        try:
            while True:
                item = await q.get()
                if item is None:
                    break
                due, data = item
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            raise
        finally:
            self.close(rst=False)

    def close(self, rst: bool = True):
        if self.closed:
            return
        self.closed = True
        self.link.conns.discard(self)
        for w in (self.down_w, self.up_w):
            if rst:
                _rst(w)
            else:
                try:
                    w.close()
                except Exception:
                    pass
        current = asyncio.current_task()
        for t in self.tasks:
            if t is not current:
                t.cancel()


class Link:
    def __init__(self, net: "ProxyNet", dialer: int, target: int, target_port: int,
                 handshake_fwd: int, handshake_back: int, rng: random.Random):
        self.net = net
        self.dialer, self.target = dialer, target
        self.target_port = target_port
        self.handshake_fwd, self.handshake_back = handshake_fwd, handshake_back
        self.block_fwd = False
        self.block_back = False
        self.latency = 0.0
        self.jitter = 0.0
        self.rng = rng
        self.conns: set[_Conn] = set()
        self.stats = LinkStats()
        self.server: asyncio.base_events.Server | None = None
        self.port: int | None = None

    @property
    def name(self) -> str:
        return f"{self.dialer}->{self.target}"

    def blocked(self, direction: str) -> bool:
        return self.block_fwd if direction == "fwd" else self.block_back

    async def start(self, host: str = "127.0.0.1", avoid: frozenset = frozenset()):
        """Listen on a port the kernel picks, but none of `avoid`: the cluster's own ports, chosen
        and released before its nodes bind them, which the kernel may hand out again meanwhile (a
        node would then dial itself for a peer and never join)."""
        for _ in range(100):
            server = await asyncio.start_server(self._accept, host, 0)
            port = server.sockets[0].getsockname()[1]
            if port not in avoid:
                self.server, self.port = server, port
                return
            server.close()
            await server.wait_closed()
        raise OSError(f"no free port outside the cluster's own for the proxy of {self.name}")

    async def _accept(self, reader, writer):
        if self.block_fwd and self.block_back:
            self.stats.refused += 1
            _rst(writer)
            return
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.target_port), 3.0)
        except (OSError, asyncio.TimeoutError):
            self.stats.refused += 1
            _rst(writer)
            return
        if self.block_fwd and self.block_back:       # went down while we connected
            self.stats.refused += 1
            _rst(writer)
            _rst(up_w)
            return
        self.stats.accepted += 1
        conn = _Conn(self, reader, writer, up_r, up_w)
        self.conns.add(conn)
        conn.start()

    def cut(self) -> int:
        n = 0
        for c in list(self.conns):
            c.close(rst=True)
            n += 1
        self.stats.cut += n
        return n

    def set_blocked(self, fwd: bool, back: bool):
        healed = (self.block_fwd and not fwd, self.block_back and not back)
        self.block_fwd, self.block_back = fwd, back
        if fwd and back:
            self.cut()
            return
        # A direction that stalled and now passes again: cut its connections so that the
        # receiver does not see the tail of a frame glued to the middle of another.
        for c in list(self.conns):
            if (healed[0] and c.dirty["fwd"]) or (healed[1] and c.dirty["back"]):
                c.close(rst=True)
                self.stats.cut += 1

    async def close(self):
        self.cut()
        if self.server is not None:
            self.server.close()
            try:
                await asyncio.wait_for(self.server.wait_closed(), 2.0)
            except (asyncio.TimeoutError, Exception):
                pass


@dataclass
class NetState:
    """What the network should look like: blocked directed edges (src, dst) between node
    indices, and latency (seconds, jitter) per undirected pair."""
    blocked: set = field(default_factory=set)
    latency: dict = field(default_factory=dict)


class ProxyNet:
    """One Link per pair of nodes, on a private event loop thread."""

    def __init__(self, raft_addrs: list[str], encrypted: bool = True, seed: int = 0, avoid=()):
        """`avoid`: ports the links must not listen on (the cluster's HTTP and gRPC ports; its
        Raft ports, in `raft_addrs`, are avoided anyway)."""
        self.addrs = list(raft_addrs)
        self.avoid = frozenset(avoid) | {int(a.rsplit(":", 1)[1]) for a in raft_addrs}
        self.n = len(raft_addrs)
        self.encrypted = encrypted
        self.rng = random.Random(seed)
        self.links: dict[tuple[int, int], Link] = {}    # (dialer, target) -> Link
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.state = NetState()

    # ---------------------------------------------------------------- topology
    def dialer_of(self, a: int, b: int) -> tuple[int, int]:
        """(dialer, target) of the pair: pysyncobj's larger address string dials."""
        return (a, b) if self.addrs[a] > self.addrs[b] else (b, a)

    def link(self, a: int, b: int) -> Link:
        return self.links[self.dialer_of(a, b)]

    def dial_maps(self) -> dict[int, dict[str, str]]:
        """Per node index, its [testing] raft_dial_map (only dialers have entries)."""
        out: dict[int, dict[str, str]] = {i: {} for i in range(self.n)}
        for (d, t), link in self.links.items():
            out[d][self.addrs[t]] = f"127.0.0.1:{link.port}"
        return out

    # ---------------------------------------------------------------- lifecycle
    def start(self):
        ready = threading.Event()

        def run():
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="chaos-proxy", daemon=True)
        self.thread.start()
        ready.wait()
        self._call(self._start_links())

    async def _start_links(self):
        hs_fwd, hs_back = (2, 1) if self.encrypted else (1, 0)
        for a in range(self.n):
            for b in range(a + 1, self.n):
                d, t = self.dialer_of(a, b)
                port = int(self.addrs[t].rsplit(":", 1)[1])
                link = Link(self, d, t, port, hs_fwd, hs_back, random.Random(self.rng.random()))
                await link.start(avoid=self.avoid)
                self.links[(d, t)] = link

    def _call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        if self.loop is None:
            return

        async def stop():
            for link in self.links.values():
                await link.close()

        try:
            self._call(stop())
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread is not None:
            self.thread.join(5)
        self.loop = None

    # ---------------------------------------------------------------- faults
    def apply(self, state: NetState):
        """Make the links look like `state` (idempotent)."""
        self.state = NetState(set(state.blocked), dict(state.latency))

        async def go():
            for (d, t), link in self.links.items():
                link.set_blocked((d, t) in state.blocked, (t, d) in state.blocked)
                lat = state.latency.get((min(d, t), max(d, t)), (0.0, 0.0))
                link.latency, link.jitter = lat

        self._call(go())

    def reset(self, pairs=None) -> int:
        """Cut (RST) the live connections of the given pairs (default: all links)."""
        async def go():
            n = 0
            for (d, t), link in self.links.items():
                if pairs is None or (d, t) in pairs or (t, d) in pairs:
                    n += link.cut()
            return n

        return self._call(go())

    def stats(self) -> dict:
        async def go():
            return {link.name: dict(vars(link.stats)) | {"live": len(link.conns)} for link in self.links.values()}

        return self._call(go())

    def connected(self, a: int, b: int) -> bool:
        async def go():
            return len(self.link(a, b).conns) > 0

        return self._call(go())
