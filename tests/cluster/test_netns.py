"""A deploy on separate hosts, as far as one machine can make them: three network namespaces
joined by a bridge, each with an address this test assigns, one node in each from the configs
`raftq config init --tls` writes (secret on, Raft on non-loopback addresses, https://). A client
outside drives them; one namespace is cut off (nftables inside it drops its traffic) and healed; then
deploy/rolling-restart.sh restarts every node under load with no failed client call. Root only
(network namespaces); everything created is removed, and traffic only goes to the addresses
assigned here, inside the namespaces made here."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from raftq.cluster.client import SyncClient

ROOT = Path(__file__).resolve().parents[2]


def _can_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip`"
    name = f"rqprobe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if p.returncode != 0:
        return f"cannot make a network namespace here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


WHY_NOT = _can_make_namespaces()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


def sh(*args, check=True):
    p = subprocess.run(list(args), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip()}")
    return p


class Hosts:
    """Three namespaces on a bridge: 10.R.S.1 the bridge (where the client is), .11-.13 the hosts."""

    def __init__(self, base: Path):
        tag = f"{os.getpid() % 10000}{random.randrange(100)}"
        self.base = base
        self.bridge = f"rqbr{tag}"
        self.ns = [f"rq{tag}n{i}" for i in (1, 2, 3)]
        self.veth = [(f"rq{tag}h{i}", f"rq{tag}p{i}") for i in (1, 2, 3)]   # (in the namespace, on the bridge)
        taken = sh("ip", "-4", "addr").stdout
        for _ in range(50):
            net = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
            if f"inet {net}." not in taken:
                break
        self.net = net
        self.hosts = [f"{net}.{11 + i}" for i in range(3)]
        self.procs: dict[int, subprocess.Popen] = {}
        self.made: list[tuple] = []

    def make(self):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        sh("ip", "addr", "add", f"{self.net}.1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i, ns in enumerate(self.ns):
            inside, outside = self.veth[i]
            sh("ip", "netns", "add", ns)
            self.made.append(("netns", ns))
            sh("ip", "link", "add", inside, "type", "veth", "peer", "name", outside)
            self.made.append(("link", outside))
            sh("ip", "link", "set", outside, "master", self.bridge)
            sh("ip", "link", "set", outside, "up")
            sh("ip", "link", "set", inside, "netns", ns)
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.hosts[i]}/24", "dev", inside)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inside, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def cut(self, i: int, up: bool):
        """Cut host i off (or heal it) with a firewall inside its namespace: nftables drops
        everything in and out of its only link, as a host firewall or a dead switch port would;
        the link stays up. Without the nft tool, the link is taken down inside the namespace."""
        ns, link = self.ns[i], self.veth[i][0]
        if shutil.which("nft") is None:
            sh("ip", "netns", "exec", ns, "ip", "link", "set", link, "up" if up else "down")
            return
        if up:
            sh("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "raftq_cut")
            return
        rules = (f'table inet raftq_cut {{\n'
                 f'  chain input {{ type filter hook input priority 0; iifname "{link}" drop; }}\n'
                 f'  chain output {{ type filter hook output priority 0; oifname "{link}" drop; }}\n}}\n')
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules.encode(), check=True,
                       capture_output=True, timeout=30)

    def node_dir(self, i: int) -> Path:
        return self.base / f"host{i + 1}"

    def start(self, i: int):
        d = self.node_dir(i)
        log = open(d / "node.log", "ab")
        self.procs[i] = subprocess.Popen(
            ["ip", "netns", "exec", self.ns[i], sys.executable, "-m", "raftq.node", "--config", str(d / "node.toml")],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(d), start_new_session=True)
        log.close()

    def stop(self, i: int, timeout: float = 20.0):
        p = self.procs.get(i)
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)         # ip netns exec execs the node: the node gets it
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    def close(self):
        for i in list(self.procs):
            p = self.procs[i]
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for kind, name in reversed(self.made):
            if kind == "netns":
                sh("ip", "netns", "del", name, check=False)
            else:
                sh("ip", "link", "del", name, check=False)


@pytest.fixture
def hosts(tmp_path):
    h = Hosts(tmp_path)
    try:
        h.make()
        yield h
    finally:
        h.close()
        left = sh("ip", "netns", "list").stdout
        assert not any(ns in left for ns in h.ns), left          # nothing left behind


def wait_for(cond, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise TimeoutError(what)


def test_three_hosts_partition_and_rolling_restart_under_load(hosts, tmp_path):
    cfg = tmp_path / "cfg"
    p = subprocess.run([sys.executable, "-m", "raftq.cluster.cli", "config", "init", "--hosts", ",".join(hosts.hosts),
                        "--out", str(cfg), "--tls"], capture_output=True, text=True, cwd=str(ROOT))
    assert p.returncode == 0, p.stderr
    for i in range(3):
        d = hosts.node_dir(i)
        d.mkdir()
        text = (cfg / f"n{i + 1}.toml").read_text()
        assert 'data_dir = "/var/lib/raftq"' in text and "secret = " in text
        (d / "node.toml").write_text(text.replace('data_dir = "/var/lib/raftq"', f'data_dir = "{d / "data"}"'))
        shutil.copy(cfg / f"n{i + 1}-cert.pem", d / "cert.pem")
        shutil.copy(cfg / f"n{i + 1}-key.pem", d / "key.pem")
        shutil.copy(cfg / "ca.pem", d / "ca.pem")
    for i in range(3):
        hosts.start(i)
    urls = [f"https://{h}:7001" for h in hosts.hosts]
    ca = str(cfg / "ca.pem")

    failures: list[str] = []
    done = {"acked": 0}
    writes: list[float] = []             # when each enqueue was answered
    stop = threading.Event()

    def load():
        with SyncClient(urls, transport="http", timeout=60, ca=ca) as c:
            while not stop.is_set():
                try:
                    c.enqueue("q", "t", b"job")
                    writes.append(time.monotonic())
                    for job in c.reserve(["q"], 30_000, max_jobs=1):
                        c.ack(job)
                        done["acked"] += 1
                except Exception as e:            # noqa: BLE001 - every failed call is counted
                    failures.append(f"{type(e).__name__}: {e}")

    ctx = ssl.create_default_context(cafile=ca)

    def view(u):
        with urllib.request.urlopen(u + "/v1/cluster", context=ctx, timeout=10) as r:
            return json.loads(r.read())

    def ready(u):
        try:
            with urllib.request.urlopen(u + "/readyz", context=ctx, timeout=3) as r:
                return r.status == 200
        except OSError:
            return False
    wait_for(lambda: all(ready(u) for u in urls), 90,
             f"the nodes did not all become ready; logs in {tmp_path}/host*/node.log")
    with SyncClient(urls, transport="http", timeout=60, ca=ca) as c:
        t = threading.Thread(target=load, daemon=True)
        t.start()
        wait_for(lambda: done["acked"] >= 50, 60, "the load made no progress")

        # Cut the leader's host off, then heal it: the other two elect a leader and serve.
        leader = c.cluster()["leader"]["url"]
        li = urls.index(leader.rstrip("/"))
        hosts.cut(li, up=False)
        at = done["acked"]
        wait_for(lambda: done["acked"] >= at + 50, 90, "no progress with the leader's host cut off")
        hosts.cut(li, up=True)
        at = done["acked"]
        wait_for(lambda: done["acked"] >= at + 50, 90, "no progress after healing")

        # A rolling restart with the repository's script, a local restart command per host.
        restart = tmp_path / "restart.sh"
        restart.write_text("#!/bin/sh\nexec \"$PYTHON\" \"$RESTARTER\" \"$1\"\n")
        restart.chmod(0o755)
        restarter = tmp_path / "restarter.py"
        control = tmp_path / "control"
        control.mkdir()
        restarter.write_text(
            "import sys, time, pathlib\n"
            f"c = pathlib.Path({str(control)!r})\n"
            "req = c / (sys.argv[1] + '.restart'); req.write_text('')\n"
            "while req.exists(): time.sleep(0.05)\n")
        env = {**os.environ, "PORT": "7001", "SCHEME": "https", "CURL_OPTS": f"--cacert {ca}", "TIMEOUT": "120",
               "PYTHON": sys.executable, "RESTARTER": str(restarter), "RESTART": f'{restart} "$1"'}
        began = time.monotonic()
        script = subprocess.Popen(["sh", str(ROOT / "deploy" / "rolling-restart.sh"), *hosts.hosts], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        restarted = []
        while script.poll() is None:          # act on the script's restart requests
            for req in control.glob("*.restart"):
                i = hosts.hosts.index(req.stem)
                hosts.stop(i)
                hosts.start(i)
                restarted.append(i)
                req.unlink()
            time.sleep(0.05)
        out = script.stdout.read()
        ended = time.monotonic()
        assert script.returncode == 0, out
        during = [t for t in writes if began <= t <= ended]
        gap = max((b - a for a, b in zip(during, during[1:])), default=None)
        print(f"rolling restart: {ended - began:.1f}s, {len(during)} writes, longest gap between two "
              f"answered writes {gap:.2f}s")
        assert sorted(restarted) == [0, 1, 2] and "all restarted" in out, out
        at = done["acked"]
        wait_for(lambda: done["acked"] >= at + 50, 90, "no progress after the rolling restart")
        stop.set()
        t.join(60)
        assert failures == [], failures[:5]

        # Every node converges on one state.
        def same():
            # Read at once: the leader sweeps expired request ids every second for a minute
            # after the load, and three reads in a row would straddle a sweep.
            with ThreadPoolExecutor(3) as pool:
                vs = list(pool.map(view, urls))
            return len({(v["last_applied"], v["digest"]) for v in vs}) == 1 and vs
        wait_for(same, 120, "the nodes did not converge")
