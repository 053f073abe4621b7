"""The hostile-client attacks of the security review, as a rerunnable measurement.

    .venv/bin/python tools/attacks.py [--attack NAME ...] [--json]

Run it with the venv of the checkout to measure: it imports `raftq` from there (so
`/work/base/.venv/bin/python tools/attacks.py` measures the base commit with this very script).
Each attack gets a fresh local three-node cluster with API keys on (loopback, memory durability),
and a probe that enqueues one job every 20 ms over one keep-alive HTTP connection to the leader
throughout. Reported per attack: what the attack observed (`outcome`), the leader's CPU seconds
during the attack and the settle time after it, its RSS growth (VmRSS from /proc/PID/status, in MB,
after the attack and after settling), the probe's enqueue p50/p99 in ms before, during and after,
and the number of Raft term changes on the leader.

Attacks (the review's findings):
  waiters     1,500 long-poll reserves, each naming 32 random queues, that time out
  wakeup      300 parked reserves whose clients went away, then a live one, then one enqueue
  session     a WebSocket client (viewer key) that sends 50,000 frames and never reads
  fields      enqueues with an 8 MB traceparent, an 8 MB payload encoding, an 8 MB nack reason
  idle        900 connections that send nothing and 100 that send half a request head
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
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from raftq.cluster.local import LocalCluster, http_json

KEYS = [{"name": "w", "key": "worker-" + os.urandom(12).hex(), "role": "worker"},
        {"name": "v", "key": "viewer-" + os.urandom(12).hex(), "role": "viewer"},
        {"name": "a", "key": "admin-" + os.urandom(12).hex(), "role": "admin"}]
WORKER, VIEWER, ADMIN = (k["key"] for k in KEYS)
# A strong secret: the fixed nodes refuse weak ones (the base commit takes anything).
SECRET = os.urandom(24).hex()


def auth(key):
    return {"Authorization": f"Bearer {key}"}


# ------------------------------------------------------------------------------ measurement
def proc_stat(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MB) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return cpu, rss


class Probe(threading.Thread):
    """Enqueues one small job every 20 ms on one keep-alive connection; records latencies."""

    def __init__(self, host: str, port: int):
        super().__init__(daemon=True)
        self.host, self.port = host, port
        self.samples: list[tuple[float, float]] = []     # (time, latency s); inf for an error
        self.stop = threading.Event()
        self.phase = "before"
        self.by_phase: dict[str, list[float]] = {"before": [], "during": [], "after": []}

    def run(self):
        conn = None
        body = json.dumps({"queue": "probe", "job_type": "p"}).encode()
        headers = {"Content-Type": "application/json", **auth(WORKER)}
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                conn.request("POST", "/v1/jobs", body, headers)
                r = conn.getresponse()
                r.read()
                lat = time.perf_counter() - t0 if r.status == 200 else float("inf")
            except Exception:
                lat = float("inf")
                conn = None
            self.by_phase[self.phase].append(lat)
            self.stop.wait(max(0.0, 0.02 - (time.perf_counter() - t0)))


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    v = xs[min(len(xs) - 1, int(q * len(xs)))]
    return None if v == float("inf") else round(v * 1000, 1)


def summary(xs):
    errors = sum(1 for x in xs if x == float("inf"))
    return {"n": len(xs), "p50_ms": pct(xs, 0.5), "p99_ms": pct(xs, 0.99), "errors": errors}


class Bench:
    """A fresh cluster with the probe running; `measure(attack)` runs one attack."""

    def __init__(self, directory, **kw):
        self.cluster = LocalCluster(directory, durability="memory", api_keys=KEYS, secret=SECRET, **kw).launch()
        self.leader = self.cluster.wait_leader()
        self.url = self.cluster.urls[self.leader]
        self.port = self.cluster.http_ports[self.leader]
        self.pid = self.cluster.procs[self.leader].pid

    def term(self):
        view = self.cluster.cluster_view(self.leader, digest=False) or {}
        return view.get("term")

    def measure(self, attack, settle_s: float = 5.0) -> dict:
        probe = Probe("127.0.0.1", self.port)
        probe.start()
        time.sleep(3.0)
        term0 = self.term()
        cpu0, rss0 = proc_stat(self.pid)
        probe.phase = "during"
        t0 = time.monotonic()
        try:
            outcome = attack(self)
        finally:
            took = time.monotonic() - t0
            cpu1, rss1 = proc_stat(self.pid)
            probe.phase = "after"
        time.sleep(settle_s)
        cpu2, rss2 = proc_stat(self.pid)
        probe.stop.set()
        probe.join(15)
        term1 = self.term()
        return {"outcome": outcome, "attack_s": round(took, 1),
                "cpu_s_attack": round(cpu1 - cpu0, 2), "cpu_s_after": round(cpu2 - cpu1, 2),
                "rss_mb_start": round(rss0, 1), "rss_growth_mb_attack": round(rss1 - rss0, 1),
                "rss_growth_mb_after": round(rss2 - rss0, 1),
                "enqueue_before": summary(probe.by_phase["before"]),
                "enqueue_during": summary(probe.by_phase["during"]),
                "enqueue_after": summary(probe.by_phase["after"]),
                "term_changes": (term1 - term0) if term0 is not None and term1 is not None else None}

    def close(self):
        self.cluster.close()


# ------------------------------------------------------------------------------ raw HTTP helpers
def raw_request(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
                if b"\r\n\r\n" in out:
                    head, _, rest = out.partition(b"\r\n\r\n")
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:") and len(rest) >= int(line.split(b":")[1]):
                            return out
        except socket.timeout:
            pass
        return out


def http_req(method, path, body: bytes | None, headers: dict) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def status_of(resp: bytes):
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


# ------------------------------------------------------------------------------ a raw WebSocket client
def ws_connect(port: int, key: str, path: str = "/v1/session", rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:                      # before connecting: the window the node may fill
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    nonce = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {nonce}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {key}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("closed during the handshake")
        head += chunk
    if b" 101 " not in head.split(b"\r\n")[0]:
        raise ConnectionError(head[:200])
    return s


def ws_frame(payload: bytes, opcode: int = 1) -> bytes:
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, 0x80 | n])
    elif n < 65536:
        head = bytes([0x80 | opcode, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + n.to_bytes(8, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


# ------------------------------------------------------------------------------ the attacks
def attack_waiters(b: Bench) -> dict:
    """1,500 reserves with wait_ms 300 under 32 random queue names each (they all time out)."""
    import aiohttp

    async def run():
        statuses = {}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as s:
            async def one():
                names = ["".join(random.choices(string.ascii_lowercase, k=24)) for _ in range(32)]
                body = json.dumps({"queues": names, "lease_ms": 1000, "wait_ms": 300}).encode()
                async with s.post(b.url + "/v1/reserve", data=body,
                                  headers={"Content-Type": "application/json", **auth(WORKER)}) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
            for _ in range(15):
                await asyncio.gather(*(one() for _ in range(100)))
        return statuses
    return {"reserve_statuses": asyncio.run(run())}


def attack_wakeup(b: Bench) -> dict:
    """300 parked reserves whose clients leave, then a live reserve and one enqueue."""
    socks = []
    body = json.dumps({"queues": ["wake"], "lease_ms": 60000, "wait_ms": 30000}).encode()
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", b.port))
        s.sendall(http_req("POST", "/v1/reserve", body, {"Content-Type": "application/json", **auth(WORKER)}))
        socks.append(s)
    time.sleep(1.0)                  # all parked
    for s in socks:
        s.close()                    # ... and their clients gone
    time.sleep(0.5)
    result = {}

    def live():
        t0 = time.monotonic()
        st, out = http_json("POST", b.url + "/v1/reserve", {"queues": ["wake"], "lease_ms": 60000, "wait_ms": 5000},
                            timeout=15, headers=auth(WORKER))
        result["status"], result["jobs"] = st, len(out.get("jobs", [])) if isinstance(out, dict) else out
        result["took_s"] = round(time.monotonic() - t0, 2)
    t = threading.Thread(target=live)
    t.start()
    time.sleep(0.5)
    http_json("POST", b.url + "/v1/jobs", {"queue": "wake", "job_type": "t"}, headers=auth(WORKER))
    t.join(20)
    return {"live_reserve": result}


def attack_session(b: Bench, frames: int = 50_000) -> dict:
    """A viewer's session that sends frames and never reads an answer."""
    s = ws_connect(b.port, VIEWER)
    s.settimeout(10.0)
    sent = 0
    t_end = time.monotonic() + 60
    try:
        for i in range(frames):
            s.sendall(ws_frame(json.dumps({"id": i, "op": "server_info"}).encode()))
            sent += 1
            if time.monotonic() > t_end:
                break
    except (socket.timeout, OSError) as e:
        why = type(e).__name__
    else:
        why = "all sent"
    time.sleep(2.0)
    _, rss = proc_stat(b.pid)
    closed_by_node = False
    try:
        s.setblocking(False)
        s.recv(1)
    except BlockingIOError:
        pass
    except OSError:
        closed_by_node = True
    s.close()
    return {"frames_sent": sent, "stopped": why, "leader_rss_mb_while_open": round(rss, 1),
            "closed_by_node": closed_by_node}


def attack_fields(b: Bench) -> dict:
    big = "0" * (8 * 1024 * 1024)
    out = {}
    follower = next(i for i in range(3) if i != b.leader)
    fpid = b.cluster.procs[follower].pid
    _, frss0 = proc_stat(fpid)
    for name, job in (("traceparent", {"trace_context": {"traceparent": big}}),
                      ("encoding", {"payload": {"data_b64": "eA==", "encoding": big}})):
        st, body = http_json("POST", b.url + "/v1/jobs", {"queue": "f", "job_type": "t", **job}, timeout=30,
                             headers=auth(WORKER))
        out[name] = st
    http_json("POST", b.url + "/v1/jobs", {"queue": "n", "job_type": "t"}, headers=auth(WORKER))
    st, got = http_json("POST", b.url + "/v1/reserve", {"queues": ["n"], "lease_ms": 60000}, headers=auth(WORKER))
    job = got["jobs"][0]
    st, body = http_json("POST", b.url + f"/v1/jobs/{job['id']}/nack", {"attempt": 1, "reason": big}, timeout=30,
                         headers=auth(WORKER))
    out["nack_reason"] = st
    st, body = http_json("POST", b.url + "/v1/reserve", {"queues": ["n"], "lease_ms": 1000,
                                                          "worker_id": big}, timeout=30, headers=auth(WORKER))
    out["worker_id"] = st
    time.sleep(2.0)
    _, frss1 = proc_stat(fpid)
    out["follower_rss_growth_mb"] = round(frss1 - frss0, 1)
    return {"statuses": out, **{k: v for k, v in out.items() if k == "follower_rss_growth_mb"}}


def attack_idle(b: Bench) -> dict:
    """900 connections that send nothing, 100 that send half a request head; do they get closed,
    and can a new client still be served?"""
    idle = [socket.create_connection(("127.0.0.1", b.port)) for _ in range(900)]
    half = []
    for _ in range(100):
        s = socket.create_connection(("127.0.0.1", b.port))
        s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
        half.append(s)
    t0 = time.monotonic()
    st, _ = http_json("GET", b.url + "/v1/server-info", timeout=10, headers=auth(VIEWER))

    def open_count(socks):
        n = 0
        for s in socks:
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    continue
                n += 1              # answered something: still open
            except BlockingIOError:
                n += 1
            except OSError:
                pass
        return n

    closed_at = None
    deadline = t0 + 20
    while time.monotonic() < deadline:
        if open_count(half) == 0 and open_count(idle) == 0:
            closed_at = round(time.monotonic() - t0, 1)
            break
        time.sleep(1.0)
    out = {"served_while_held": st, "all_closed_after_s": closed_at,
           "still_open_after_20s": {"idle": open_count(idle), "half_head": open_count(half)}}
    for s in idle + half:
        s.close()
    return out


def attack_misc(b: Bench) -> dict:
    out = {}
    # A malformed request that carries a key: is the key in the log?
    canary = "canary-" + os.urandom(8).hex()
    raw_request(b.port, b"GET /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                + canary.encode() + b"\x01\r\n\r\n")
    raw_request(b.port, b"GET /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + WORKER.encode()
                + b"\r\nContent-Length: abc\r\n\r\n")
    time.sleep(0.5)
    log = b.cluster.log_path(b.leader).read_text(errors="replace")
    out["key_in_log"] = canary in log or WORKER in log
    # A session frame whose op is not a string.
    s = ws_connect(b.port, WORKER)
    s.sendall(ws_frame(json.dumps({"id": 1, "op": ["enqueue"]}).encode()))
    s.settimeout(3)
    try:
        data = s.recv(65536)
        out["non_string_op"] = "answered" if data and data[0] & 0x0F in (1, 2) else f"frame {data[:1]!r}"
        if data and data[0] & 0x0F == 8:
            out["non_string_op"] = "session closed"
    except (socket.timeout, OSError) as e:
        out["non_string_op"] = type(e).__name__
    s.close()
    # Bodies that are not declared JSON.
    for ct in ("text/plain", "application/x-www-form-urlencoded"):
        resp = raw_request(b.port, http_req("POST", "/v1/jobs", b'{"queue": "csrf", "job_type": "t"}',
                                            {"Content-Type": ct, **auth(WORKER)}))
        out[f"post_{ct}"] = status_of(resp)
    # GET /v1/session without upgrade.
    resp = raw_request(b.port, http_req("GET", "/v1/session", None, auth(WORKER)))
    out["session_without_upgrade"] = (status_of(resp), b"application/json" in resp.split(b"\r\n\r\n")[0])
    # null optional integers.
    st, body = http_json("POST", b.url + "/v1/reserve", {"queues": ["n"], "lease_ms": 1000, "wait_ms": None,
                                                          "max_jobs": None}, headers=auth(WORKER))
    out["null_wait_ms"] = st
    # A wrong method on a known path.
    resp = raw_request(b.port, http_req("PUT", "/v1/jobs", b"{}", {"Content-Type": "application/json", **auth(WORKER)}))
    out["wrong_method"] = status_of(resp)
    # Weak Raft secrets.
    weak = {}
    for secret in ("x", "change-me", "CHANGE-ME-run-openssl-rand-hex-32"):
        with tempfile.TemporaryDirectory() as d:
            c = LocalCluster(d, nodes=1, secret=secret)
            c.write_configs()
            p = subprocess.run([sys.executable, "-c", "import sys; from raftq.node.settings import load; "
                                "load(sys.argv[1]); print('loaded')", str(c.config_path(0))],
                               capture_output=True, text=True, timeout=30)
            weak[secret] = "accepted" if p.returncode == 0 else "refused"
    out["weak_secrets"] = weak
    return out


ATTACKS = {"waiters": attack_waiters, "wakeup": attack_wakeup, "session": attack_session,
           "fields": attack_fields, "idle": attack_idle, "misc": attack_misc}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attack", action="append", choices=sorted(ATTACKS), help="default: all")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    results = {}
    import raftq
    where = str(Path(raftq.__file__).parent)
    rev = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    for name in args.attack or list(ATTACKS):
        with tempfile.TemporaryDirectory(prefix=f"raftq-attack-{name}-") as d:
            b = Bench(d)
            try:
                results[name] = b.measure(ATTACKS[name])
            finally:
                b.close()
        if not args.json:
            print(f"== {name} ({rev})", json.dumps(results[name]), flush=True)
    if args.json:
        print(json.dumps({"rev": rev, "load": os.getloadavg(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
