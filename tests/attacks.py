"""The hostile-client attacks on the bounds of docs/limits.md, as helpers the tests import and
as a rerunnable measurement.

The tests (tests/cluster/test_hostile_*.py, tests/cluster/test_raft_hostile.py) import the
raw-socket clients, the probes of a node's state (digest, RSS, CPU, /metrics) and the attacks
themselves, each with its size as a parameter, and assert on what the attack observed.

As a measurement, from the root of a checkout:

    .venv/bin/python tests/attacks.py [--attack NAME ...] [--json]

It imports `raftq` from the venv that runs it, so another checkout's venv measures that
checkout's nodes with this very script (the figures before and after a fix). Each attack gets a
fresh local three-node cluster with API keys on (loopback, memory durability) and a probe that
enqueues one job every 20 ms over one keep-alive HTTP connection to the leader throughout.
Reported per attack: what the attack observed (`outcome`), the leader's CPU seconds during the
attack and in the settle time after it, its RSS growth (VmRSS, MB) after the attack and after
settling, the probe's enqueue p50/p99 in ms before, during and after, and the Raft term changes.

Attacks (the review's findings):
  waiters     1,500 long-poll reserves, each naming 32 random queues, that time out
  wakeup      300 parked reserves whose clients went away, then a live one, then one enqueue
  session     a WebSocket client (viewer key) that sends 50,000 frames and never reads
  fields      enqueues with an 8 MB traceparent and payload encoding, an 8 MB nack reason
  idle        900 connections that send nothing and 100 that send half a request head
  raft_flood  a Raft-port connection with a 0x7fffffff length prefix, then 64 MB of zeros
  raft_idle   300 Raft-port connections that send 3 bytes each and then nothing
  misc        the small findings: a key in the log of a malformed request, a non-string op,
              text/plain and form bodies, GET /v1/session without upgrade, null wait_ms, a
              wrong method, weak Raft secrets
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import os
import random
import re
import socket
import statistics
import string
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from raftq.cluster.local import LocalCluster, digest_at, http_json

ROLES = ("viewer", "worker", "operator", "admin")
KEYS = {role: f"{role}-key-{os.urandom(8).hex()}" for role in ROLES}
API_KEYS = [{"name": role, "key": key, "role": role} for role, key in KEYS.items()]
# A strong secret: nodes refuse weak ones (a checkout from before the fix takes anything).
SECRET = os.urandom(24).hex()


def bearer(role: str = "admin") -> dict:
    return {"Authorization": f"Bearer {KEYS[role]}"}


# ------------------------------------------------------------------------------ raw HTTP
def request_bytes(method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                  host: str = "127.0.0.1", close: bool = False) -> bytes:
    """One HTTP/1.1 request exactly as written (a Content-Length when there is a body)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    if close:
        lines.append("Connection: close")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def read_response(sock: socket.socket, timeout: float = 10.0) -> tuple[int | None, dict, bytes]:
    """(status, headers, body) of one HTTP response; (None, {}, raw) when the node closed the
    connection without a complete one."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionResetError):
            return None, {}, data
        if not chunk:
            return None, {}, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        return None, {}, data
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0") or 0)
    while len(body) < n:
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not chunk:
            break
        body += chunk
    return status, headers, body


def raw_exchange(port: int, data: bytes, timeout: float = 10.0, half_close: bool = False):
    """Send `data` on a fresh connection, read one response (or the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass
        if half_close:
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        return read_response(s, timeout)


def json_body(raw: bytes):
    try:
        return json.loads(raw or b"null")
    except ValueError:
        return None


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the other end closes (EOF or reset) within `timeout`; what arrives before the
    close is read and dropped."""
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            return False
        except OSError:
            return True


def still_open(sock: socket.socket) -> bool:
    """Whether the other end has not closed the connection (nothing is waited for)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


# ------------------------------------------------------------------------------ raw WebSocket
class ClosedByNode(Exception):
    def __init__(self, code, reason):
        super().__init__(f"closed by the node: {code} {reason}")
        self.code, self.reason = code, reason


def ws_frame(payload: bytes, opcode: int = 1) -> bytes:
    """A masked client frame."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, 0x80 | n])
    elif n < 65536:
        head = bytes([0x80 | opcode, 0x80 | 126]) + struct.pack(">H", n)
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + struct.pack(">Q", n)
    m = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    masked = (int.from_bytes(payload, "big") ^ m).to_bytes(n, "big") if n else b""
    return head + mask + masked


class RawWs:
    """A WebSocket client over a plain socket: sends masked frames, reads the node's frames.
    `rcvbuf` (set before connecting) is the window the node can fill before it must wait."""

    def __init__(self, port: int, headers: dict | None = None, path: str = "/v1/session",
                 rcvbuf: int | None = None, timeout: float = 10.0):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)     # frames go out as sent (no Nagle wait)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        s.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n").encode())
        self.sock = s
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = s.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        self.status = int(head.split(b" ", 2)[1])
        self.head = head.decode("latin-1")

    def send(self, payload: bytes | str, opcode: int | None = None):
        if isinstance(payload, str):
            payload, opcode = payload.encode(), opcode or 1
        self.sock.sendall(ws_frame(payload, opcode or 2))

    def send_json(self, obj, binary: bool = False):
        self.send(json.dumps(obj).encode(), 2 if binary else 1)

    def _need(self, n: int, timeout: float):
        end = time.monotonic() + timeout
        while len(self.buf) < n:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk

    def recv(self, timeout: float = 10.0) -> tuple[int, bytes]:
        """(opcode, payload) of the node's next frame."""
        self._need(2, timeout)
        b0, b1 = self.buf[0], self.buf[1]
        n, off = b1 & 0x7F, 2
        if n == 126:
            self._need(4, timeout)
            n, off = struct.unpack(">H", self.buf[2:4])[0], 4
        elif n == 127:
            self._need(10, timeout)
            n, off = struct.unpack(">Q", self.buf[2:10])[0], 10
        self._need(off + n, timeout)
        payload, self.buf = self.buf[off:off + n], self.buf[off + n:]
        return b0 & 0x0F, payload

    def answers(self, timeout: float = 10.0) -> list:
        """The next data frame's answers (a list, batched or not); raises ClosedByNode on a close."""
        end = time.monotonic() + timeout
        while True:
            # One deadline for the whole wait: pings (answered here) must not extend it.
            op, payload = self.recv(max(0.0, end - time.monotonic()))
            if op in (1, 2):
                data = json.loads(payload)
                return data if isinstance(data, list) else [data]
            if op == 8:
                code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
                raise ClosedByNode(code, payload[2:].decode(errors="replace"))
            if op == 9:                                 # ping: answer it
                self.send(payload, 10)

    def call(self, frame: dict, timeout: float = 10.0) -> dict:
        """Send one frame, return its answer (answers to other ids are skipped)."""
        self.send_json(frame)
        end = time.monotonic() + timeout
        while True:
            for a in self.answers(max(0.1, end - time.monotonic())):
                if a.get("id") == frame.get("id"):
                    return a

    def close_code(self, timeout: float) -> int | None:
        """Read and drop frames until the node's close frame; its code (None: the connection
        ended without one)."""
        end = time.monotonic() + timeout
        try:
            while time.monotonic() < end:
                self.answers(max(0.1, end - time.monotonic()))
        except ClosedByNode as e:
            return e.code
        except (ConnectionError, OSError, TimeoutError):
            return None
        return None

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# ------------------------------------------------------------------------------ a node's state
def proc_stat(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MB) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu, rss_mb(pid)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def view(cluster: LocalCluster, i: int, digest: bool = True) -> dict:
    status, body = http_json("GET", cluster.urls[i] + ("/v1/cluster" if digest else "/v1/cluster?digest=false"),
                             timeout=15, headers=cluster.probe_headers)
    assert status == 200, (status, body)
    return body


def digest(cluster: LocalCluster, i: int) -> tuple:
    """(index, digest) of node i's state: the digest and the applied index it belongs to."""
    return digest_at(view(cluster, i))


def term(cluster: LocalCluster, i: int) -> int:
    return view(cluster, i, digest=False)["term"]


def responsive(cluster: LocalCluster, i: int) -> bool:
    """The process runs and answers /healthz."""
    status, _ = http_json("GET", cluster.urls[i] + "/healthz", timeout=10)
    return status == 200 and cluster.alive(i)


def metrics(cluster: LocalCluster, i: int) -> dict:
    """Node i's /metrics samples: {'name{labels}': value}, the node label left out."""
    import urllib.request
    req = urllib.request.Request(cluster.urls[i] + "/metrics", headers=cluster.probe_headers)
    with urllib.request.urlopen(req, timeout=15, context=cluster.client_ssl) as r:
        return metrics_text(r.read().decode())


def metrics_text(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        key, value = line.rsplit(" ", 1)
        key = re.sub(r'node="[^"]*",?', "", key).replace("{}", "")
        out[key] = float(value)
    return out


def hits(cluster: LocalCluster, i: int, bound: str) -> float:
    """How often node i's bound `bound` (its config key) held a client back."""
    return metrics(cluster, i).get(f'raftq_bound_hits_total{{bound="{bound}"}}', 0.0)


def enqueue_latency_ms(cluster: LocalCluster, i: int, n: int = 15, queue: str = "latency-probe") -> float:
    """The median of `n` sequential enqueues on node i over one connection, in ms; every one
    must succeed."""
    conn = http.client.HTTPConnection("127.0.0.1", cluster.http_ports[i], timeout=15)
    body = json.dumps({"queue": queue, "job_type": "p"}).encode()
    headers = {"Content-Type": "application/json", **cluster.probe_headers}
    times = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            conn.request("POST", "/v1/jobs", body, headers)
            r = conn.getresponse()
            r.read()
            assert r.status == 200, r.status
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        conn.close()
    return statistics.median(times)


class Baseline:
    """A node's RSS and enqueue latency before an attack; `wait_back()` polls until both are
    back near them. Latency is judged relative to the node's own (the machine may be busy):
    within 3x or +25 ms, the attacks' own effect being 10-30x."""

    def __init__(self, cluster: LocalCluster, i: int):
        self.cluster, self.i = cluster, i
        enqueue_latency_ms(cluster, i, 5)          # warm up (first connection, code paths)
        self.rss = rss_mb(cluster.procs[i].pid)
        self.latency = enqueue_latency_ms(cluster, i)

    def wait_back(self, rss_slack_mb: float = 15.0, timeout: float = 30.0) -> tuple[float, float]:
        end = time.monotonic() + timeout
        rss = lat = None
        while time.monotonic() < end:
            rss = rss_mb(self.cluster.procs[self.i].pid)
            lat = enqueue_latency_ms(self.cluster, self.i)
            if rss <= self.rss + rss_slack_mb and lat <= max(3 * self.latency, self.latency + 25):
                return rss, lat
            time.sleep(0.5)
        raise AssertionError(f"not back to baseline within {timeout}s: RSS {rss:.1f} MB (baseline {self.rss:.1f}), "
                             f"enqueue p50 {lat:.1f} ms (baseline {self.latency:.1f})")


def poll(fn, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"):
    """Poll until fn() returns something truthy; return it."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value {last!r})")


# ------------------------------------------------------------------------------ the attacks
class Target:
    """A cluster and the node attacked (its leader by default)."""

    def __init__(self, cluster: LocalCluster, node: int | None = None):
        self.cluster = cluster
        self.node = cluster.wait_leader() if node is None else node
        self.url = cluster.urls[self.node]
        self.port = cluster.http_ports[self.node]
        self.raft_port = cluster.raft_ports[self.node]
        self.pid = cluster.procs[self.node].pid


def attack_waiters(t: Target, n: int = 1500, names: int = 32, wait_ms: int = 300, concurrency: int = 100,
                   key: str = "worker") -> dict:
    """`n` reserves with `wait_ms`, each under `names` random queue names (they all time out)."""
    import aiohttp

    async def run():
        statuses: dict = {}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
            async def one():
                qs = ["".join(random.choices(string.ascii_lowercase, k=24)) for _ in range(names)]
                body = json.dumps({"queues": qs, "lease_ms": 1000, "wait_ms": wait_ms}).encode()
                async with s.post(t.url + "/v1/reserve", data=body,
                                  headers={"Content-Type": "application/json", **bearer(key)}) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
            left = n
            while left > 0:
                k = min(left, concurrency)
                await asyncio.gather(*(one() for _ in range(k)))
                left -= k
        return statuses
    return {"reserve_statuses": asyncio.run(run())}


def park_reserves(t: Target, n: int, queue: str, wait_ms: int = 30000, key: str = "worker") -> list:
    """`n` long-poll reserves on `queue`, each on a connection of its own, left waiting; the
    sockets (close them to make the clients go away)."""
    socks = []
    body = json.dumps({"queues": [queue], "lease_ms": 60000, "wait_ms": wait_ms}).encode()
    req = request_bytes("POST", "/v1/reserve", body, {"Content-Type": "application/json", **bearer(key)})
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", t.port))
        s.sendall(req)
        socks.append(s)
    return socks


def attack_wakeup(t: Target, parked: int = 300, queue: str = "wake", live_wait_ms: int = 20000,
                  settle=None) -> dict:
    """`parked` long polls whose clients leave, then a live reserve and one enqueue: does the
    live one get the job? `settle(phase)` is called once the reserves are parked ("parked"),
    once their clients are gone ("gone"), and once the live one waits ("live"); without it the
    attack sleeps a moment instead."""
    settle = settle or (lambda phase: time.sleep(1.0))
    socks = park_reserves(t, parked, queue)
    settle("parked")
    for s in socks:
        s.close()
    settle("gone")
    result: dict = {}

    def live():
        t0 = time.monotonic()
        st, out = http_json("POST", t.url + "/v1/reserve", {"queues": [queue], "lease_ms": 60000,
                                                             "wait_ms": live_wait_ms},
                            timeout=live_wait_ms / 1000 + 15, headers=bearer("worker"))
        result["status"] = st
        result["jobs"] = len(out.get("jobs", [])) if isinstance(out, dict) else out
        result["took_s"] = round(time.monotonic() - t0, 2)
    th = threading.Thread(target=live)
    th.start()
    settle("live")
    st, out = http_json("POST", t.url + "/v1/jobs", {"queue": queue, "job_type": "t"}, headers=bearer("worker"))
    result["enqueue_status"] = st
    th.join(live_wait_ms / 1000 + 20)
    return {"live_reserve": result}


def attack_session(t: Target, frames: int = 50_000, seconds: float = 60.0, key: str = "viewer",
                   rcvbuf: int = 4096, frame: dict | None = None) -> dict:
    """A session that sends frames and never reads an answer. Sending stops when the node
    stops reading (the socket's send times out), after `frames`, or after `seconds`."""
    ws = RawWs(t.port, bearer(key), rcvbuf=rcvbuf)
    assert ws.status == 101, ws.head
    ws.sock.settimeout(3.0)
    sent, why = 0, "all sent"
    t_end = time.monotonic() + seconds
    try:
        for i in range(frames):
            ws.sock.sendall(ws_frame(json.dumps({"id": i, **(frame or {"op": "server_info"})}).encode()))
            sent += 1
            if time.monotonic() > t_end:
                why = "time up"
                break
    except (socket.timeout, OSError) as e:
        why = "node stopped reading" if isinstance(e, socket.timeout) else type(e).__name__
    return {"frames_sent": sent, "stopped": why, "ws": ws}


def attack_fields(t: Target, size: int = 8 * 1024 * 1024) -> dict:
    """Enqueues with a `size`-byte traceparent and payload encoding; a nack with a `size`-byte
    reason; a reserve with a `size`-byte worker id. Their statuses and bodies."""
    big = "0" * size
    out = {}
    for name, job in (("traceparent", {"trace_context": {"traceparent": big}}),
                      ("encoding", {"payload": {"data_b64": "eA==", "encoding": big}})):
        out[name] = http_json("POST", t.url + "/v1/jobs", {"queue": "fields", "job_type": "t", **job}, timeout=60,
                              headers=bearer("worker"))
    st, _ = http_json("POST", t.url + "/v1/jobs", {"queue": "fields-n", "job_type": "t"}, headers=bearer("worker"))
    assert st == 200
    st, got = http_json("POST", t.url + "/v1/reserve", {"queues": ["fields-n"], "lease_ms": 60000},
                        headers=bearer("worker"))
    job = got["jobs"][0]
    out["nack_reason"] = http_json("POST", t.url + f"/v1/jobs/{job['id']}/nack", {"attempt": 1, "reason": big},
                                   timeout=60, headers=bearer("worker"))
    out["worker_id"] = http_json("POST", t.url + "/v1/reserve", {"queues": ["fields-n"], "lease_ms": 1000,
                                                                 "worker_id": big}, timeout=60,
                                 headers=bearer("worker"))
    out["job"] = job
    return out


def attack_idle(t: Target, idle: int = 900, half: int = 100) -> dict:
    """`idle` connections that send nothing and `half` that send half a request head; the
    sockets (the caller watches them close) and whether a new client is served meanwhile."""
    idle_socks = [socket.create_connection(("127.0.0.1", t.port)) for _ in range(idle)]
    half_socks = []
    for _ in range(half):
        s = socket.create_connection(("127.0.0.1", t.port))
        s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
        half_socks.append(s)
    st, _ = http_json("GET", t.url + "/v1/server-info", timeout=15, headers=bearer("viewer"))
    return {"served_while_held": st, "idle": idle_socks, "half": half_socks}


def raft_flood(t: Target, mb: int = 64, prefix: int = 0x7FFFFFFF) -> dict:
    """One Raft-port connection: a 4-byte length prefix (native byte order, as the transport
    reads it), then `mb` MB of zeros. How much the node took before it closed the connection."""
    s = socket.create_connection(("127.0.0.1", t.raft_port), timeout=10)
    sent, chunk = 0, b"\0" * (1 << 20)
    try:
        s.sendall(struct.pack("i", prefix))
        for _ in range(mb):
            s.sendall(chunk)
            sent += len(chunk)
        closed = closed_by_peer(s, 15.0)
    except OSError:
        closed = True                       # reset: the node closed while we were sending
    finally:
        s.close()
    return {"sent_mb": round(sent / (1 << 20), 1), "closed_by_node": closed}


def raft_idle(t: Target, n: int = 300, data: bytes = b"\x01\x02\x03") -> list:
    """`n` Raft-port connections that send `data` (3 bytes: not even a length prefix) and then
    nothing; the sockets."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", t.raft_port), timeout=10)
        s.sendall(data)
        socks.append(s)
    return socks


def weak_secret_refused(secret: str, python: str | None = None) -> tuple[bool, str]:
    """Whether a node process refuses to start with `secret` (its exit status 2 and message)."""
    with tempfile.TemporaryDirectory() as d:
        c = LocalCluster(d, nodes=1, secret=secret, python=python)
        c.write_configs()
        p = subprocess.run([c.python, "-m", "raftq.node", "--config", str(c.config_path(0)), "--check"],
                           capture_output=True, text=True, timeout=60)
        return p.returncode == 2, (p.stdout + p.stderr).strip()


# ------------------------------------------------------------------------------ the measurement
class Probe(threading.Thread):
    """Enqueues one small job every 20 ms on one keep-alive connection; records latencies."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.phase = "before"
        self.by_phase: dict[str, list[float]] = {"before": [], "during": [], "after": []}

    def run(self):
        conn = None
        body = json.dumps({"queue": "probe", "job_type": "p"}).encode()
        headers = {"Content-Type": "application/json", **bearer("worker")}
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("POST", "/v1/jobs", body, headers)
                r = conn.getresponse()
                r.read()
                lat = time.perf_counter() - t0 if r.status == 200 else float("inf")
            except Exception:
                lat = float("inf")
                conn = None
            self.by_phase[self.phase].append(lat)
            self.stop.wait(max(0.0, 0.02 - (time.perf_counter() - t0)))


def _pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    v = xs[min(len(xs) - 1, int(q * len(xs)))]
    return None if v == float("inf") else round(v * 1000, 1)


def _summary(xs):
    return {"n": len(xs), "p50_ms": _pct(xs, 0.5), "p99_ms": _pct(xs, 0.99),
            "errors": sum(1 for x in xs if x == float("inf"))}


def measure(target: Target, attack, settle_s: float = 5.0) -> dict:
    """Run `attack(target)` with the probe going; the figures of the module docstring."""
    probe = Probe(target.port)
    probe.start()
    time.sleep(3.0)
    term0 = term(target.cluster, target.node)
    cpu0, rss0 = proc_stat(target.pid)
    probe.phase = "during"
    t0 = time.monotonic()
    try:
        outcome = attack(target)
    finally:
        took = time.monotonic() - t0
        cpu1, rss1 = proc_stat(target.pid)
        probe.phase = "after"
    time.sleep(settle_s)
    cpu2, rss2 = proc_stat(target.pid)
    probe.stop.set()
    probe.join(15)
    try:
        term1 = term(target.cluster, target.cluster.wait_leader())
    except Exception:
        term1 = None
    return {"outcome": outcome, "attack_s": round(took, 1),
            "cpu_s_attack": round(cpu1 - cpu0, 2), "cpu_s_after": round(cpu2 - cpu1, 2),
            "rss_mb_start": round(rss0, 1), "rss_growth_mb_attack": round(rss1 - rss0, 1),
            "rss_growth_mb_after": round(rss2 - rss0, 1),
            "enqueue_before": _summary(probe.by_phase["before"]),
            "enqueue_during": _summary(probe.by_phase["during"]),
            "enqueue_after": _summary(probe.by_phase["after"]),
            "term_changes": (term1 - term0) if term1 is not None else None}


def _open_count(socks) -> int:
    return sum(1 for s in socks if still_open(s))


def _figure_session(t: Target) -> dict:
    out = attack_session(t)
    ws = out.pop("ws")
    time.sleep(2.0)
    out["leader_rss_mb_while_open"] = round(rss_mb(t.pid), 1)
    out["close_code"] = ws.close_code(25.0)
    ws.close()
    return out


def _figure_fields(t: Target) -> dict:
    follower = next(i for i in range(t.cluster.n) if i != t.node)
    fpid = t.cluster.procs[follower].pid
    rss0 = rss_mb(fpid)
    out = attack_fields(t)
    time.sleep(2.0)
    return {"statuses": {k: v[0] for k, v in out.items() if k != "job"},
            "follower_rss_growth_mb": round(rss_mb(fpid) - rss0, 1)}


def _figure_idle(t: Target) -> dict:
    out = attack_idle(t)
    t0 = time.monotonic()
    closed_at = None
    while time.monotonic() < t0 + 20:
        if _open_count(out["half"]) == 0 and _open_count(out["idle"]) == 0:
            closed_at = round(time.monotonic() - t0, 1)
            break
        time.sleep(1.0)
    res = {"served_while_held": out["served_while_held"], "all_closed_after_s": closed_at,
           "still_open_after_20s": {"idle": _open_count(out["idle"]), "half_head": _open_count(out["half"])}}
    for s in out["idle"] + out["half"]:
        s.close()
    return res


def _figure_raft_idle(t: Target) -> dict:
    socks = raft_idle(t)
    t0 = time.monotonic()
    closed_at = None
    while time.monotonic() < t0 + 30:
        if _open_count(socks) == 0:
            closed_at = round(time.monotonic() - t0, 1)
            break
        time.sleep(0.5)
    res = {"all_closed_after_s": closed_at, "still_open_after_30s": _open_count(socks)}
    for s in socks:
        s.close()
    return res


def _figure_misc(t: Target) -> dict:
    out = {}
    canary = "canary-" + os.urandom(8).hex()
    raw_exchange(t.port, b"GET /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                 + canary.encode() + b"\x01\r\n\r\n")
    raw_exchange(t.port, b"GET /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                 + KEYS["worker"].encode() + b"\r\nContent-Length: abc\r\n\r\n")
    time.sleep(0.5)
    text = t.cluster.log_path(t.node).read_text(errors="replace")
    out["key_in_log"] = canary in text or KEYS["worker"] in text
    ws = RawWs(t.port, bearer("worker"))
    try:
        a = ws.call({"id": 1, "op": ["enqueue"]}, timeout=5)
        out["non_string_op"] = a.get("status")
    except Exception as e:
        out["non_string_op"] = type(e).__name__
    ws.close()
    for ct in ("text/plain", "application/x-www-form-urlencoded"):
        st, _, _ = raw_exchange(t.port, request_bytes("POST", "/v1/jobs", b'{"queue": "csrf", "job_type": "t"}',
                                                      {"Content-Type": ct, **bearer("worker")}, close=True))
        out[f"post_{ct}"] = st
    st, headers, _ = raw_exchange(t.port, request_bytes("GET", "/v1/session", None, bearer("worker"), close=True))
    out["session_without_upgrade"] = (st, headers.get("content-type"))
    out["null_wait_ms"] = http_json("POST", t.url + "/v1/reserve", {"queues": ["n"], "lease_ms": 1000, "wait_ms": None,
                                                                    "max_jobs": None}, headers=bearer("worker"))[0]
    out["wrong_method"] = raw_exchange(t.port, request_bytes("PUT", "/v1/jobs", b"{}", {
        "Content-Type": "application/json", **bearer("worker")}, close=True))[0]
    out["weak_secrets"] = {s: "refused" if weak_secret_refused(s)[0] else "accepted"
                           for s in ("x", "change-me", "CHANGE-ME-run-openssl-rand-hex-32")}
    return out


FIGURES = {
    "waiters": lambda t: attack_waiters(t),
    "wakeup": lambda t: attack_wakeup(t),
    "session": _figure_session,
    "fields": _figure_fields,
    "idle": _figure_idle,
    "raft_flood": lambda t: raft_flood(t),
    "raft_idle": _figure_raft_idle,
    "misc": _figure_misc,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attack", action="append", choices=sorted(FIGURES), help="default: all")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    import raftq
    where = str(Path(raftq.__file__).parent)
    rev = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    results = {}
    for name in args.attack or list(FIGURES):
        with tempfile.TemporaryDirectory(prefix=f"raftq-attack-{name}-") as d:
            c = LocalCluster(d, durability="memory", api_keys=API_KEYS, secret=SECRET).launch()
            try:
                results[name] = measure(Target(c), FIGURES[name])
            finally:
                c.close()
        if not args.json:
            print(f"== {name} ({rev})", json.dumps(results[name], default=str), flush=True)
    if args.json:
        print(json.dumps({"rev": rev, "load": os.getloadavg(), "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
