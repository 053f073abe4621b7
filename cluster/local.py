"""A local cluster on loopback: configs, node processes, faults. Used by `raftq up`, the tests,
the benchmark and the chaos tool, so every one of them runs real node processes."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path

from ..node.base.settings import API_ROLES
from .files import private_dir, write_private


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def toml_key(k: str) -> str:
    """A bare key when TOML allows one, else a quoted key."""
    return k if k and all(c.isascii() and (c.isalnum() or c in "-_") for c in k) else json.dumps(k)


def toml_table(name: str, d: dict) -> str:
    lines = [f"[{name}]"] + [f"{k} = {toml_value(v)}" for k, v in d.items() if v is not None]
    return "\n".join(lines) + "\n"


def digest_at(view: dict) -> tuple:
    """(index, digest) of a node's GET /v1/cluster view: the state digest and the applied index
    it belongs to. A node with a large state answers with the newest digest its child has
    hashed, which may be older than its `last_applied` (`digest_index` says which); nodes
    before `digest_index` existed paired the digest with `last_applied`."""
    return view.get("digest_index", view.get("last_applied")), view.get("digest")


def digest_cell(view: dict) -> str | None:
    """A view's digest as `raftq status` and `raftq local status` show it: 12 characters, and
    `@INDEX` when it belongs to an index older than the node's `last_applied`."""
    index, digest = digest_at(view)
    if not digest:
        return None
    return digest[:12] if index == view.get("last_applied") else f"{digest[:12]}@{index}"


def http_json(method: str, url: str, body=None, timeout: float = 2.0, headers: dict | None = None,
              context=None):
    """(status, json body) without following redirects; (None, error text) on connection errors.
    `context`: the ssl.SSLContext for https:// URLs (default: the system's CAs)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    handlers = [NoRedirect] + ([urllib.request.HTTPSHandler(context=context)] if context is not None else [])
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"null")
        except ValueError:
            return e.code, raw.decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, str(e)


class LocalCluster:
    # [testing] hooks every LocalCluster of this checkout's code starts with, beneath its own
    # `testing`: the test suite sets check_invariants here (tests/conftest.py), and keeps every
    # such cluster in `checked` to ask each for its invariant violations (invariant_violations).
    default_testing: dict = {}
    checked: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()

    def __init__(self, directory, nodes: int = 3, durability: str = "fsync", limits: dict | None = None,
                 storage: dict | None = None, queues: list | None = None, tuning: dict | None = None,
                 secret: str | None = "random", base_port: int | None = None,
                 python: str | None = None, env: dict | None = None, api_keys: list | None = None,
                 testing: dict | None = None, http_ports: list[int] | None = None,
                 raft_ports: list[int] | None = None, tls: bool | str = False, schedules: list | None = None,
                 grpc: bool = False, api: dict | None = None, advertise: list[str] | None = None):
        """Ports: `http_ports` and `raft_ports` as given, else from `base_port` (HTTP base..,
        Raft base+100..), else free ones. Every file it writes is 0600, its directories 0700,
        and the nodes run with umask 077 (their journals, snapshots and logs are private too:
        a config holds the cluster secret). `secret="random"` (the default): a fresh random one
        (nodes refuse weak secrets); None: none (loopback only).
        `tls`: True makes every node serve https:// with a certificate from a CA of the
        directory's own (ca.pem, n1-cert.pem, n1-key.pem...; kept and reused while valid),
        "mtls" also requires client certificates signed by it (client-cert.pem,
        client-key.pem). `client_options()` gives a Client what it needs to call them.
        `grpc`: every node also serves sepp's gRPC API ([grpc] listen) on a free port of its own
        (`grpc_addr(i)`). `api`: every node's `[api]` table. `advertise`: the URL each node
        advertises (its `url`, its peer entry), where that is not where it listens (`urls`, which
        the harness calls): every node then calls the others at `urls` (`[node] peer_urls`), as
        under compose, where the advertised URLs are out of the nodes' reach."""
        if tls not in (False, True, "mtls"):
            raise ValueError("tls must be False, True or 'mtls'")
        self.tls = tls
        self.dir = Path(directory).absolute()
        self.n = nodes
        self.durability = durability
        self.limits, self.storage, self.queues = limits or {}, storage or {}, queues or []
        self.schedules = list(schedules or ())          # [[schedules]]: seeded once per cluster
        self.tuning = dict(tuning or {})
        # RAFTQ_RAFT_ENGINE: run a cluster (the test suite's, `raftq chaos`'s) on the other Raft
        # engine without editing each one (docs/cluster.md "Raft engines")
        if os.environ.get("RAFTQ_RAFT_ENGINE") and "raft_engine" not in self.tuning:
            self.tuning["raft_engine"] = os.environ["RAFTQ_RAFT_ENGINE"]
        self.secret = secrets.token_hex(32) if secret == "random" else secret
        self.python = python or sys.executable
        self.env = env or {}
        # [auth] api_keys ({name, key, role}); the launcher's own probes use the strongest key.
        self.api_keys = api_keys or []
        best = max(self.api_keys, key=lambda k: API_ROLES.index(k.get("role", "admin")), default=None)
        self.probe_headers = {"Authorization": f"Bearer {best['key']}"} if best else {}
        # [testing] hooks (node/base/settings.py TestHooks): `testing` for every node, `node_testing[i]`
        # on top for node i; a node's config is rewritten when they changed since it was written.
        self.testing = testing or {}
        if self.default_testing and not self.env.get("PYTHONPATH"):     # not another release's nodes
            self.testing = {**self.default_testing, **self.testing}
            LocalCluster.checked.add(self)
        self._violations_seen: dict[int, int] = {}     # invariant_violations(): what was said already
        self._log_seen: dict[int, int] = {}
        self.node_testing: dict[int, dict] = {}
        self._written_testing: dict[int, dict] = {}
        http, raft = self._ports(nodes, http_ports, raft_ports, base_port)
        self.ids = [f"n{i + 1}" for i in range(nodes)]
        self.http_ports, self.raft_ports = http, raft
        self.urls = [f"{'https' if tls else 'http'}://127.0.0.1:{p}" for p in http]
        self.grpc_ports: list[int] | None = free_ports(nodes) if grpc else None
        self.api = dict(api or {})
        if advertise is not None and len(advertise) != nodes:
            raise ValueError(f"give {nodes} advertised URLs")
        self.advertise = list(advertise) if advertise is not None else None
        self._client_ssl = None
        self.procs: dict[int, subprocess.Popen] = {}
        self.logs: dict[int, object] = {}
        # Membership change (add_node): the peer list each node's TOML names (indices), where it
        # is not the first `nodes`; and how many members a leader needs the agreement of
        # (leader()), when the membership in force is not the `n` nodes.
        self.initial_n = nodes
        self.peers_of: dict[int, list[int]] = {}
        self.members_count: int | None = None

    @staticmethod
    def _ports(nodes: int, http_ports, raft_ports, base_port) -> tuple[list[int], list[int]]:
        """(HTTP ports, Raft ports): as given, else from `base_port`, else free ones."""
        if http_ports or raft_ports:
            if len(http_ports or ()) != nodes or len(raft_ports or ()) != nodes:
                raise ValueError(f"give {nodes} HTTP ports and {nodes} Raft ports")
            return list(http_ports), list(raft_ports)
        if base_port:
            return [base_port + i for i in range(nodes)], [base_port + 100 + i for i in range(nodes)]
        ports = free_ports(2 * nodes)
        return ports[:nodes], ports[nodes:]

    # ------------------------------------------------------------ configs
    def grpc_addr(self, i: int) -> str:
        """Node i's sepp gRPC address, host:port (a cluster made with grpc=True)."""
        if self.grpc_ports is None:
            raise ValueError("this cluster has no gRPC ports: LocalCluster(..., grpc=True)")
        return f"127.0.0.1:{self.grpc_ports[i]}"

    def config_path(self, i: int) -> Path:
        return self.dir / f"{self.ids[i]}.toml"

    def data_dir(self, i: int) -> Path:
        return self.dir / "data" / self.ids[i]

    def log_path(self, i: int) -> Path:
        return self.dir / f"{self.ids[i]}.log"

    def write_configs(self):
        private_dir(self.dir)
        self.certs_made = self.ensure_certs() if self.tls else []
        for i in range(self.n):
            self.write_config(i)

    # ------------------------------------------------------------ TLS
    @property
    def ca_file(self) -> Path | None:
        return self.dir / "ca.pem" if self.tls else None

    def cert_path(self, i: int) -> Path:
        return self.dir / f"{self.ids[i]}-cert.pem"

    def key_path(self, i: int) -> Path:
        return self.dir / f"{self.ids[i]}-key.pem"

    @property
    def client_cert(self) -> tuple[str, str] | None:
        """(certfile, keyfile) of the client certificate of an mTLS cluster, else None."""
        if self.tls != "mtls":
            return None
        return str(self.dir / "client-cert.pem"), str(self.dir / "client-key.pem")

    def client_options(self) -> dict:
        """Client(urls, **cluster.client_options()): the CA to trust and, with mTLS, the client
        certificate; {} without TLS."""
        if not self.tls:
            return {}
        return {"ca": str(self.ca_file), **({"cert": self.client_cert} if self.client_cert else {})}

    @property
    def client_ssl(self):
        """An ssl.SSLContext for urllib (http_json) calls to the nodes; None without TLS."""
        if not self.tls:
            return None
        if self._client_ssl is None:
            import ssl
            ctx = ssl.create_default_context(cafile=str(self.ca_file))
            if self.client_cert:
                ctx.load_cert_chain(*self.client_cert)
            self._client_ssl = ctx
        return self._client_ssl

    @client_ssl.setter
    def client_ssl(self, ctx) -> None:
        """Probe with this context instead (e.g. one trusting a new CA the nodes moved to)."""
        self._client_ssl = ctx

    def ensure_certs(self, days_left: float = 7.0) -> list[str]:
        """Make what is missing or about to expire: the CA, a certificate per node for
        127.0.0.1 and localhost, and with mTLS a client certificate. A new CA means new
        certificates for everything it signs. Returns the names of the files made."""
        from . import certs as C
        made = []
        ca_cert = ca_key = None
        try:
            ca_cert, ca_key = C.load_pair(self.dir / "ca.pem", self.dir / "ca-key.pem")
            if not C.valid_for(ca_cert, days_left):
                ca_cert = None
        except (OSError, ValueError):
            ca_cert = None
        if ca_cert is None:
            ca_cert, ca_key = C.make_ca(f"raftq local CA ({self.dir.name})", days=365)
            C.write_pair(self.dir / "ca.pem", self.dir / "ca-key.pem", ca_cert, ca_key)
            made += ["ca.pem", "ca-key.pem"]
        wanted = [(self.cert_path(i), self.key_path(i), self.ids[i], True) for i in range(self.n)]
        if self.tls == "mtls":
            wanted.append((self.dir / "client-cert.pem", self.dir / "client-key.pem", "raftq local client", False))
        for cert_path, key_path, name, server in wanted:
            try:
                cert, _ = C.load_pair(cert_path, key_path)
                if C.valid_for(cert, days_left) and C.issued_by(cert, ca_cert):
                    continue
            except (OSError, ValueError):
                pass
            cert, key = C.make_leaf(ca_cert, ca_key, name, ["127.0.0.1", "localhost"] if server else [],
                                    days=365, server=server, client=True)
            C.write_pair(cert_path, key_path, cert, key)
            made += [cert_path.name, key_path.name]
        self._client_ssl = None
        return made

    def reload_tls(self, i: int) -> None:
        """Ask node i to load its TLS files again (SIGHUP)."""
        self.signal(i, signal.SIGHUP)

    def _testing_of(self, i: int) -> dict:
        return {**self.testing, **self.node_testing.get(i, {})}

    def member(self, i: int) -> dict:
        """Node i as a member: {"id", "raft", "url"} (the body of POST /v1/cluster/members)."""
        return {"id": self.ids[i], "raft": f"127.0.0.1:{self.raft_ports[i]}", "url": self.advertised(i)}

    def advertised(self, i: int) -> str:
        """The URL node i advertises: `urls[i]` unless the cluster was made with `advertise`."""
        return self.advertise[i] if self.advertise is not None and i < len(self.advertise) else self.urls[i]

    def add_node(self, members: list[int] | None = None, node_id: str | None = None) -> int:
        """A node for an online membership change: new ports and id, and a config naming
        `members` (indices; default every node so far) and itself, as a joining node's must.
        Written, not started (start(i)); its index is returned. With TLS, its certificate too."""
        i = self.n
        members = list(range(self.n)) if members is None else list(members)
        http, raft = free_ports(2)
        self.ids.append(node_id or f"n{i + 1}")
        self.http_ports.append(http)
        self.raft_ports.append(raft)
        self.urls.append(f"{'https' if self.tls else 'http'}://127.0.0.1:{http}")
        if self.grpc_ports is not None:
            self.grpc_ports += free_ports(1)
        self.n += 1
        self.peers_of[i] = members + [i]
        if self.tls:
            self.ensure_certs()
        self.write_config(i)
        return i

    def write_config(self, i: int):
        peers = [self.member(j) for j in self.peers_of.get(i, range(self.initial_n))]
        node = {"id": self.ids[i], "http": f"127.0.0.1:{self.http_ports[i]}", "url": self.advertised(i),
                "raft": f"127.0.0.1:{self.raft_ports[i]}", "data_dir": str(self.data_dir(i))}
        if self.advertise is not None:
            node["peer_urls"] = {self.ids[j]: self.urls[j] for j in range(self.n)}
        if self.tls:        # paths relative to the config file, which is in the same directory
            node.update(tls_cert=self.cert_path(i).name, tls_key=self.key_path(i).name, tls_peer_ca="ca.pem")
            if self.tls == "mtls":
                node["tls_client_ca"] = "ca.pem"
        text = toml_table("node", node)
        text += "\n[cluster]\npeers = [\n" + "".join(f"  {toml_value(p)},\n" for p in peers) + "]\n"
        if self.secret:
            text += f"secret = {toml_value(self.secret)}\n"
        text += f"durability = {toml_value(self.durability)}\n"
        if self.limits:
            text += "\n" + toml_table("limits", self.limits)
        if self.storage:
            text += "\n" + toml_table("storage", self.storage)
        if self.tuning:
            text += "\n" + toml_table("tuning", self.tuning)
        if self.grpc_ports is not None:
            text += "\n" + toml_table("grpc", {"listen": self.grpc_addr(i)})
        if self.api:
            text += "\n" + toml_table("api", self.api)
        if self.api_keys:
            text += "\n[auth]\napi_keys = [\n" + "".join(f"  {toml_value(k)},\n" for k in self.api_keys) + "]\n"
        testing = self._testing_of(i)
        self._written_testing[i] = testing
        if testing:
            text += "\n" + toml_table("testing", testing)
        for q in self.queues:
            text += "\n[[queues]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in q.items())
        for s in self.schedules:
            text += "\n[[schedules]]\n" + "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in s.items())
        write_private(self.config_path(i), text)

    # ------------------------------------------------------------ processes
    def start(self, i: int):
        if i in self.procs and self.procs[i].poll() is None:
            return
        if self._written_testing.get(i) != self._testing_of(i):
            self.write_config(i)        # with this node's [testing] hooks as they are now
        old = self.logs.pop(i, None)
        if old is not None:
            old.close()             # the previous process's handle: one per start would leak
        fd = os.open(self.log_path(i), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        log = os.fdopen(fd, "ab")
        self.logs[i] = log
        env = {**os.environ, **self.env}
        self.procs[i] = subprocess.Popen([self.python, "-m", "raftq.node", "--config", str(self.config_path(i))],
                                         stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(self.dir),
                                         start_new_session=True, umask=0o077)

    def start_all(self):
        if not self.config_path(0).exists():
            self.write_configs()
        for i in range(self.n):
            self.start(i)

    def launch(self, timeout: float = 30.0) -> "LocalCluster":
        """Write the configs, start every node and wait for a leader (closing it all on failure)."""
        self.write_configs()
        self.start_all()
        try:
            self.wait_leader(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def alive(self, i: int) -> bool:
        p = self.procs.get(i)
        return p is not None and p.poll() is None

    def signal(self, i: int, sig, group: bool = False):
        """Signal node i's process, or with `group` its whole process group (each node leads
        its own: a snapshot child pysyncobj forks is in it)."""
        p = self.procs.get(i)
        if p is not None and p.poll() is None:
            try:
                (os.killpg if group else os.kill)(p.pid, sig)
            except ProcessLookupError:
                pass                    # died since poll()

    def kill(self, i: int):
        p = self.procs.get(i)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait(10)

    def pause(self, i: int):
        self.signal(i, signal.SIGSTOP)

    def resume(self, i: int):
        self.signal(i, signal.SIGCONT)

    def stop(self, i: int, timeout: float = 15.0) -> int | None:
        p = self.procs.get(i)
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        return p.returncode

    def stop_all(self):
        for i in list(self.procs):
            self.signal(i, signal.SIGCONT)
        for i in list(self.procs):
            self.stop(i)

    def kill_all(self):
        for i in list(self.procs):
            self.kill(i)

    def wipe(self, i: int):
        shutil.rmtree(self.data_dir(i), ignore_errors=True)

    def close(self):
        self.kill_all()
        for log in self.logs.values():
            try:
                log.close()
            except Exception:
                pass

    # ------------------------------------------------------------ observation
    def cluster_view(self, i: int, timeout: float = 1.0, digest: bool = True):
        """Node i's own GET /v1/cluster, or None; `digest=False` skips the O(state) digest
        (for frequent polling)."""
        path = "/v1/cluster" if digest else "/v1/cluster?digest=false"
        status, body = http_json("GET", self.urls[i] + path, timeout=timeout, headers=self.probe_headers,
                                 context=self.client_ssl)
        return body if status == 200 else None

    def cluster_views(self, among=None, digest: bool = True) -> list:
        """Every (listed) node's view, taken at the same moment (one thread each)."""
        import concurrent.futures
        among = list(range(self.n) if among is None else among)
        with concurrent.futures.ThreadPoolExecutor(len(among) or 1) as pool:
            return list(pool.map(lambda i: self.cluster_view(i, digest=digest), among))

    def invariant_violations(self) -> dict[str, str]:
        """What the nodes found with `[testing] check_invariants` since the last call: per node,
        a rise of the count its running process reports (`invariant_violations` in GET
        /v1/cluster) and the new CRITICAL lines of its log (from any of its processes, so a
        node restarted since is not missed); {} when nothing new was found."""
        found: dict[str, list] = {}
        live = [i for i in range(self.n) if self.alive(i)]
        for i, v in zip(live, self.cluster_views(live, digest=False)):
            count = (v or {}).get("invariant_violations") or 0
            if count > self._violations_seen.get(i, 0):
                found.setdefault(self.ids[i], []).append(f"{count} violation(s) counted")
            self._violations_seen[i] = count
        for i in range(self.n):
            try:
                with open(self.log_path(i), "rb") as f:
                    f.seek(self._log_seen.get(i, 0))
                    new = f.read()
            except OSError:
                continue
            self._log_seen[i] = self._log_seen.get(i, 0) + len(new)
            lines = [line.strip()[:2000] for line in new.decode(errors="replace").splitlines()
                     if "invariant violation after" in line]
            if lines:
                found.setdefault(self.ids[i], []).extend(lines[:3])
        return {node: "; ".join(said) for node, said in found.items()}

    def leader(self, among=None) -> int | None:
        """The index of the node that says it leads and that the others agree on, and that has
        applied a configuration (a new cluster's leader seeds version 1 first, in milliseconds,
        and answers writes 503 until then), or None."""
        among = range(self.n) if among is None else among
        # Without the digest: at a large backlog it takes longer than the probe's timeout, and
        # finding the leader needs only the roles.
        views = {i: self.cluster_view(i, digest=False) for i in among if self.alive(i)}
        leaders = [i for i, v in views.items() if v and v["role"] == "leader" and v.get("config_version", 1) >= 1]
        if len(leaders) != 1:
            return None
        lid = self.ids[leaders[0]]
        agree = sum(1 for v in views.values() if v and v["leader"] and v["leader"]["id"] == lid)
        return leaders[0] if agree * 2 > (self.members_count or self.n) else None

    def wait_leader(self, timeout: float = 20.0, among=None, exclude=None) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            i = self.leader(among)
            if i is not None and i != exclude:
                return i
            time.sleep(0.05)
        raise TimeoutError(f"no leader within {timeout}s; node logs are in {self.dir}")

    def wait_converged(self, timeout: float = 20.0, among=None) -> list[dict]:
        """Wait until every (listed, running) node reports the same applied index and the digest
        of that index."""
        among = [i for i in (range(self.n) if among is None else among)]
        end = time.monotonic() + timeout
        views = []
        while time.monotonic() < end:
            # All at once: the leader's sweeps keep committing entries, and views taken one
            # after the other on a busy machine would straddle one.
            views = self.cluster_views(among)
            if all(views) and len({digest_at(v) for v in views}) == 1 \
                    and all(digest_at(v)[0] == v["last_applied"] >= v["commit_index"] for v in views):
                return views
            time.sleep(0.1)
        raise TimeoutError(f"nodes did not converge within {timeout}s: "
                           + str([(v or {}).get("last_applied") for v in views]))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
