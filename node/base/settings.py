"""The node's TOML config file (every key: docs/configuration.md).

Unknown keys are errors so that typos do not pass silently; every error names the key.
"""
from __future__ import annotations

import collections
import ipaddress
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..core.config import API_ROLES
from ..core.limits import ConfigError, Limits

NODE_KEYS = {"id", "http", "url", "raft", "data_dir", "tls_cert", "tls_key", "tls_client_ca", "tls_peer_ca",
             "peer_urls"}
CLUSTER_KEYS = {"peers", "secret", "durability"}
PEER_KEYS = {"id", "raft", "url"}


@dataclass(frozen=True)
class Peer:
    id: str
    raft: str        # host:port
    url: str         # http(s)://host:port advertised to clients


@dataclass(frozen=True)
class TlsFiles:
    """`[node] tls_*`: the PEM files of the node's TLS (node/base/tls.py loads and checks them at
    start and on SIGHUP). Paths are absolute (relative ones are resolved against the config
    file's directory, like data_dir)."""
    cert: Path                      # tls_cert: the node's certificate (chain), leaf first
    key: Path                       # tls_key: its private key (unencrypted PEM)
    client_ca: Path | None = None   # tls_client_ca: set = clients must present a certificate it signed
    peer_ca: Path | None = None     # tls_peer_ca: what the node trusts when it calls its peers' https URLs


@dataclass(frozen=True)
class TestHooks:
    """`[testing]`: hooks for the chaos harness and the tests, all off by default. They change
    what one node believes (its clock, where it dials its peers, what it records about its
    disk), never the replicated rules; a production config has no such section."""
    clock_offset_ms: int = 0                # shifts this node's idea of now (never the system clock)
    raft_dial_map: dict = field(default_factory=dict)   # peer raft address -> address to dial (proxies)
    sync_shadow: bool = False               # record what a disk honouring only fsync holds (node/replication/sync_shadow.py)
    sync_shadow_writeback_s: float = 2.0    # memory mode: the simulated page writeback period
    fsync_eio: bool = False                 # fail the next journal sync on demand (node/replication/fault_hooks.py)
    clock_strobe: bool = False              # make the clock jump back and forth on demand (node/replication/fault_hooks.py)
    free_space_file: bool = False           # take the data disk's free space from a file (node/replication/fault_hooks.py)
    # false: the leader proposes no sweeps, so the state changes only by requests (the
    # hostile-input suite compares state digests around each refused request)
    sweeps: bool = True
    # how long a worker that reserved counts for its queues' `workers` (node/service/workers_seen.py)
    workers_window_ms: int = 30_000
    # true: a leader seeds a new cluster's configuration only once the file `release-seed` is in
    # its data dir (node/replication/fault_hooks.py), so a test can watch a cluster that is not seeded yet
    hold_seed: bool = False
    # N > 0: run the core's invariant checks after applied entries, about N state entries' worth
    # per entry (node/replication/replica.py QueueState._check_invariants); 0: never
    check_invariants: int = 0


TESTING_KEYS = {f: t for f, t in (("clock_offset_ms", int), ("raft_dial_map", dict), ("sync_shadow", bool),
                                  ("sync_shadow_writeback_s", (int, float)), ("fsync_eio", bool),
                                  ("clock_strobe", bool), ("free_space_file", bool), ("sweeps", bool),
                                  ("workers_window_ms", int), ("hold_seed", bool), ("check_invariants", int))}


@dataclass(frozen=True)
class Settings:
    node_id: str
    http_host: str
    http_port: int
    url: str
    raft: str
    data_dir: Path
    peers: tuple[Peer, ...]
    secret: str | None
    durability: str
    limits: Limits
    api_keys: tuple[dict, ...] | None = None
    # [[schedules]]: (name, definition) checked as PUT /v1/schedules/{name} is; seeded once per cluster
    schedules: tuple = ()
    source: str = ""
    tuning: dict = field(default_factory=dict)
    testing: TestHooks = field(default_factory=TestHooks)
    tls: TlsFiles | None = None
    # [grpc] listen: (host, port) of sepp's gRPC API (node/api/sepp_grpc.py), or None: off
    grpc_listen: tuple[str, int] | None = None
    # [api] followers: what a follower does with an HTTP call that needs the leader when the
    # caller does not say (Raftq-Redirect): "forward" it, or "redirect" (307) the caller there
    followers: str = "forward"
    # [node] peer_urls: member id -> the URL this node calls that member's HTTP API at, where it
    # is not the URL the member advertises (compose: the advertised ones are the host's ports)
    peer_urls: dict = field(default_factory=dict)

    @property
    def others(self) -> tuple[Peer, ...]:
        return tuple(p for p in self.peers if p.id != self.node_id)

    def peer_by_raft(self, raft_addr: str) -> Peer | None:
        for p in self.peers:
            if p.raft == raft_addr:
                return p
        return None


def _hostport(where: str, value) -> tuple[str, int]:
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(f"{where}: must be \"host:port\", got {value!r}")
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where}: must be \"host:port\" with a port 1..65535, got {value!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


MIN_SECRET_CHARS = 16
MIN_SECRET_BITS = 40
# Placeholders of the docs and deploy/ examples (and their like), refused wherever they appear.
PLACEHOLDER_WORDS = ("change-me", "changeme", "change_me", "replace-me", "replaceme", "replace_me",
                     "placeholder", "openssl rand", "local-secret", "your-secret", "yoursecret")


def weak_secret(secret: str) -> str | None:
    """Why `secret` is too weak for the Raft transport, or None. Refused: the placeholders of the
    docs and deploy/ examples, fewer than 16 characters, fewer than 8 distinct ones, a repeated
    pattern, and less than 40 bits by the characters' own frequencies (Shannon entropy times
    length: `openssl rand -hex 32` has about 230)."""
    import math
    low = secret.lower()
    for word in PLACEHOLDER_WORDS:
        if word in low:
            return "it is (or contains) a placeholder of the documentation: replace it with a random secret"
    if len(secret) < MIN_SECRET_CHARS:
        return f"it has {len(secret)} characters, fewer than {MIN_SECRET_CHARS}"
    if len(set(secret)) < 8:
        return f"it has {len(set(secret))} distinct characters, fewer than 8"
    if secret in (secret + secret)[1:-1]:
        return "it is a shorter string repeated"
    n = len(secret)
    bits = -sum(c / n * math.log2(c / n) for c in collections.Counter(secret).values()) * n
    if bits < MIN_SECRET_BITS:
        return f"it holds about {bits:.0f} bits of entropy, fewer than {MIN_SECRET_BITS}"
    return None


def _str(where: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: must be a non-empty string, got {value!r}")
    return value


SECTIONS = ("node", "cluster", "limits", "storage", "auth", "queues", "schedules", "tuning", "testing", "grpc",
            "api")
GRPC_KEYS = {"listen"}
API_KEYS = {"followers"}
FOLLOWERS = ("forward", "redirect")


def parse(doc: dict, source: str = "", base_dir: Path | None = None) -> Settings:
    """Check a parsed TOML document and build the node's settings: one section after another,
    in this order (the first error found is the one raised)."""
    for key in doc:
        if key not in SECTIONS:
            raise ConfigError(f"{key}: unknown section")
    node = _node(doc.get("node"), base_dir)
    peers, secret, durability = _cluster(doc.get("cluster"), node)
    queues = doc.get("queues", [])
    if not isinstance(queues, list):
        raise ConfigError("queues: must be an array of tables [[queues]]")
    storage = doc.get("storage", {})
    limits = Limits.build(doc.get("limits", {}), storage, queues)
    api_keys = _auth(doc.get("auth"))
    # Without keys on a non-loopback address: not fatal (a firewalled private network is a
    # valid setup), and not said here.
    schedules = _schedules(doc.get("schedules", []), limits)
    tuning = _tuning(doc.get("tuning", {}))
    return Settings(node_id=node["id"], http_host=node["http_host"], http_port=node["http_port"], url=node["url"],
                    raft=node["raft"], data_dir=node["data_dir"], peers=peers, secret=secret, durability=durability,
                    limits=limits, api_keys=api_keys, schedules=schedules, source=source, tuning=tuning,
                    testing=_testing(doc.get("testing", {})), tls=node["tls"], grpc_listen=_grpc(doc.get("grpc"), node),
                    followers=_api(doc.get("api")), peer_urls=node["peer_urls"])


def _api(raw) -> str:
    """[api]: `followers`, what a follower does with an HTTP call that needs the leader when
    the call does not say (`Raftq-Redirect: 1` asks for the 307, `0` for forwarding)."""
    if raw is None:
        return "forward"
    if not isinstance(raw, dict):
        raise ConfigError("api: must be a table [api]")
    for key in raw:
        if key not in API_KEYS:
            raise ConfigError(f"api.{key}: unknown key (one of: {', '.join(sorted(API_KEYS))})")
    followers = raw.get("followers", "forward")
    if followers not in FOLLOWERS:
        raise ConfigError(f"api.followers: must be one of {', '.join(FOLLOWERS)}, got {followers!r}")
    return followers


def _grpc(raw, node: dict) -> tuple[str, int] | None:
    """[grpc]: `listen = "host:port"` serves sepp's gRPC API there (TLS as the HTTP API: the
    node's tls_* files); no section, or no `listen`, leaves it off."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError("grpc: must be a table [grpc]")
    for key in raw:
        if key not in GRPC_KEYS:
            raise ConfigError(f"grpc.{key}: unknown key (one of: {', '.join(sorted(GRPC_KEYS))})")
    if "listen" not in raw:
        return None
    listen = _hostport("grpc.listen", raw["listen"])
    if listen == (node["http_host"], node["http_port"]):
        raise ConfigError(f"grpc.listen: {raw['listen']!r} is node.http's address; gRPC needs a port of its own")
    return listen


def _node(node, base_dir: Path | None) -> dict:
    """[node]: id, http, url, raft, data_dir and the TLS files."""
    if not isinstance(node, dict):
        raise ConfigError("node: missing section [node]")
    for key in node:
        if key not in NODE_KEYS:
            raise ConfigError(f"node.{key}: unknown key")
    for key in ("id", "http", "raft", "data_dir"):
        if key not in node:
            raise ConfigError(f"node.{key}: missing (required)")
    node_id = _str("node.id", node["id"])
    http_host, http_port = _hostport("node.http", node["http"])
    raft = node["raft"]
    _hostport("node.raft", raft)
    data_dir = _path("node.data_dir", node["data_dir"], base_dir)
    tls = _tls(node, base_dir)
    url = _str("node.url", node.get("url", f"{'https' if tls else 'http'}://{node['http']}")).rstrip("/")
    _check_scheme("node.url", url, tls)
    return {"id": node_id, "http_host": http_host, "http_port": http_port, "raft": raft, "data_dir": data_dir,
            "tls": tls, "url": url, "peer_urls": _peer_urls(node.get("peer_urls", {}))}


def _peer_urls(raw) -> dict:
    """node.peer_urls: `{ member id = "http(s)://host:port" }`, where this node calls those
    members' HTTP API. Any id may be listed (a member added online later too); this node's own
    entry is never used (nothing calls it), so one table can serve every node's file."""
    if not isinstance(raw, dict):
        raise ConfigError(f"node.peer_urls: must be a table {{ id = \"http://host:port\" }}, got {raw!r}")
    out = {}
    for pid, url in raw.items():
        where = f"node.peer_urls.{pid}"
        given = _str(where, url)
        url = given.rstrip("/")
        u = urlsplit(url)
        try:
            u.port
        except ValueError:
            u = None
        if u is None or u.scheme not in ("http", "https") or not u.hostname or u.path or u.query or u.fragment:
            raise ConfigError(f"{where}: {given!r} must be http(s)://host[:port], with no path")
        out[pid] = url
    return out


def _cluster(cluster, node: dict) -> tuple[tuple[Peer, ...], str | None, str]:
    """[cluster]: the peers (this node among them), the secret, the durability."""
    if not isinstance(cluster, dict):
        raise ConfigError("cluster: missing section [cluster]")
    for key in cluster:
        if key not in CLUSTER_KEYS:
            raise ConfigError(f"cluster.{key}: unknown key")
    peers = _peers(cluster.get("peers"))
    me = [p for p in peers if p.id == node["id"]]
    if not me:
        raise ConfigError(f"cluster.peers: this node ({node['id']!r}) is not in the peer list; every member must be "
                          "listed, this node included")
    if me[0].raft != node["raft"]:
        raise ConfigError(f"cluster.peers: this node's raft address is {me[0].raft!r} there but node.raft is "
                          f"{node['raft']!r}")
    _check_scheme(f"cluster.peers[{peers.index(me[0])}].url", me[0].url, node["tls"])
    # An even number is allowed: a node that joins a running cluster lists the current members and
    # itself (docs/cluster.md "Membership changes"), 3 + 1 while a cluster grows from 3 to 5.
    secret = _secret(cluster.get("secret"), peers)
    durability = cluster.get("durability", "fsync")
    if durability not in ("fsync", "memory"):
        raise ConfigError(f"cluster.durability: must be \"fsync\" or \"memory\", got {durability!r}")
    return tuple(peers), secret, durability


def _peers(peers_raw) -> list[Peer]:
    """cluster.peers: every member {id, raft, url}, no id or raft address twice."""
    if not isinstance(peers_raw, list) or not peers_raw:
        raise ConfigError("cluster.peers: missing or empty; list every member, this node included")
    peers, ids, rafts = [], set(), set()
    for i, p in enumerate(peers_raw):
        where = f"cluster.peers[{i}]"
        if not isinstance(p, dict):
            raise ConfigError(f"{where}: must be a table {{id, raft, url}}")
        for key in p:
            if key not in PEER_KEYS:
                raise ConfigError(f"{where}.{key}: unknown key")
        for key in PEER_KEYS:
            if key not in p:
                raise ConfigError(f"{where}.{key}: missing (required)")
        pid = _str(f"{where}.id", p["id"])
        _hostport(f"{where}.raft", p["raft"])
        purl = _str(f"{where}.url", p["url"]).rstrip("/")
        if pid in ids:
            raise ConfigError(f"{where}.id: duplicate peer id {pid!r}")
        if p["raft"] in rafts:
            raise ConfigError(f"{where}.raft: duplicate raft address {p['raft']!r}")
        ids.add(pid)
        rafts.add(p["raft"])
        peers.append(Peer(pid, p["raft"], purl))
    return peers


def _secret(secret, peers: list[Peer]) -> str | None:
    """cluster.secret: not weak when set, and required unless every Raft address is loopback."""
    if secret is not None:
        secret = _str("cluster.secret", secret)
        why = weak_secret(secret)
        if why:
            raise ConfigError(f"cluster.secret: {why}; the Raft port speaks pickle, so whoever knows or guesses the "
                              "secret runs code on the node: use the output of `openssl rand -hex 32`, the same "
                              "on every node")
    if secret is None:
        for p in peers:
            if not is_loopback(_hostport("cluster.peers.raft", p.raft)[0]):
                raise ConfigError(
                    f"cluster.secret: required because raft address {p.raft!r} is not loopback "
                    "(the Raft port speaks pickle: without a secret anyone who reaches it runs code on the node)")
    return secret


def _auth(auth) -> tuple[dict, ...] | None:
    """[auth] api_keys: each {name, key, role}, no name or key twice; None without any."""
    if auth is None:
        return None
    if not isinstance(auth, dict):
        raise ConfigError("auth: must be a table")
    for key in auth:
        if key != "api_keys":
            raise ConfigError(f"auth.{key}: unknown key")
    raw = auth.get("api_keys")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ConfigError("auth.api_keys: must be a list of {name, key, role}")
    names, secrets, keys = set(), set(), []
    for i, k in enumerate(raw):
        key = _api_key(f"auth.api_keys[{i}]", k)
        if key["name"] in names or key["key"] in secrets:
            raise ConfigError(f"auth.api_keys[{i}]: duplicate name or key")
        names.add(key["name"])
        secrets.add(key["key"])
        keys.append(key)
    return tuple(keys)


def _api_key(where: str, k) -> dict:
    if not isinstance(k, dict):
        raise ConfigError(f"{where}: must be a table {{name, key, role}}")
    for kk in k:
        if kk not in ("name", "key", "role"):
            raise ConfigError(f"{where}.{kk}: unknown key")
    name = _str(f"{where}.name", k.get("name"))
    if len(name) > 128 or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        raise ConfigError(f"{where}.name: must be 1..128 characters, no control characters")
    key = _str(f"{where}.key", k.get("key"))
    if not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise ConfigError(f"{where}.key: must be visible ASCII characters only")
    role = k.get("role", "admin")
    if role not in API_ROLES:
        raise ConfigError(f"{where}.role: must be one of {', '.join(API_ROLES)}, got {role!r}")
    return {"name": name, "key": key, "role": role}


def _tuning(tuning) -> dict:
    """[tuning]: known keys only, each in its range; the defaults for the others."""
    if not isinstance(tuning, dict):
        raise ConfigError("tuning: must be a table")
    for key, value in tuning.items():
        if key not in TUNING_DEFAULTS:
            raise ConfigError(f"tuning.{key}: unknown key (known: {', '.join(sorted(TUNING_DEFAULTS))})")
        if key == "event_loop":
            if value not in EVENT_LOOPS:
                raise ConfigError(f"tuning.{key}: must be one of {', '.join(EVENT_LOOPS)}, got {value!r}")
        elif key == "raft_engine":
            if value not in RAFT_ENGINES:
                raise ConfigError(f"tuning.{key}: must be one of {', '.join(RAFT_ENGINES)}, got {value!r}")
        elif key == "raft_compression_level":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 9:
                raise ConfigError(f"tuning.{key}: must be an integer 0..9, got {value!r}")
        elif key == "digest_inline_max_entries":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"tuning.{key}: must be an integer >= 0, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"tuning.{key}: must be a positive number, got {value!r}")
    return {**TUNING_DEFAULTS, **tuning}


def _schedules(raw, limits: Limits) -> tuple:
    """[[schedules]]: each a table with `name` and the fields of PUT /v1/schedules/{name}
    (docs/api.md "Schedules"), checked the same way; a wrong one stops the node naming it."""
    from ..core.errors import ApiError
    from .validate_schedule import definition, name_arg
    if not isinstance(raw, list):
        raise ConfigError("schedules: must be an array of tables [[schedules]]")
    out, names = [], set()
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ConfigError(f"schedules[{i}]: must be a table")
        body = dict(entry)
        try:
            name = name_arg(body.pop("name", None))
            if "expect_version" in body:
                raise ApiError("invalid_argument", "a seed creates only: no expect_version", field="expect_version")
            out.append((name, definition(name, body, limits, 0)))
        except ApiError as e:
            field = e.details.get("field")
            raise ConfigError(f"schedules[{i}]{'.' + field if field else ''}: {e.message}") from None
        if name in names:
            raise ConfigError(f"schedules[{i}].name: schedule {name!r} is declared twice")
        names.add(name)
    return tuple(out)


def _path(where: str, value, base_dir: Path | None) -> Path:
    path = Path(_str(where, value))
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    return path


def _tls(node: dict, base_dir: Path | None) -> TlsFiles | None:
    """The [node] tls_* keys: tls_cert and tls_key together, or no TLS (then tls_client_ca and
    tls_peer_ca are errors too). Only the shape is checked here: node/base/tls.py reads the files at
    start, with errors naming the key."""
    if not any(k in node for k in ("tls_cert", "tls_key", "tls_client_ca", "tls_peer_ca")):
        return None
    for key, other in (("tls_cert", "tls_key"), ("tls_key", "tls_cert"),
                       ("tls_cert", "tls_client_ca"), ("tls_cert", "tls_peer_ca")):
        if other in node and key not in node:
            raise ConfigError(f"node.{key}: missing; node.{other} needs it "
                              + ("(the node's certificate, PEM)" if key == "tls_cert" else
                                 "(the certificate's private key, PEM)"))
    optional = {k: _path(f"node.{k}", node[k], base_dir) if k in node else None for k in ("tls_client_ca", "tls_peer_ca")}
    return TlsFiles(cert=_path("node.tls_cert", node["tls_cert"], base_dir),
                    key=_path("node.tls_key", node["tls_key"], base_dir),
                    client_ca=optional["tls_client_ca"], peer_ca=optional["tls_peer_ca"])


def _check_scheme(where: str, url: str, tls: TlsFiles | None) -> None:
    """A node with TLS is reached at https:// only, one without at http:// only."""
    serves = tls is not None
    if serves and not url.startswith("https://"):
        raise ConfigError(f"{where}: {url!r} must start with https:// because the node serves TLS (node.tls_cert)")
    if not serves and url.startswith("https://"):
        raise ConfigError(f"{where}: {url!r} is https:// but the node has no TLS: set node.tls_cert and "
                          "node.tls_key, or write http://")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: {url!r} must start with {'https' if serves else 'http'}://")


def _testing(raw) -> TestHooks:
    if not isinstance(raw, dict):
        raise ConfigError("testing: must be a table")
    for key, value in raw.items():
        kind = TESTING_KEYS.get(key)
        if kind is None:
            raise ConfigError(f"testing.{key}: unknown key (known: {', '.join(sorted(TESTING_KEYS))})")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"testing.{key}: wrong type, got {value!r}")
    if raw.get("workers_window_ms", 1) < 1:
        raise ConfigError(f"testing.workers_window_ms: must be >= 1, got {raw['workers_window_ms']}")
    if raw.get("check_invariants", 0) < 0:
        raise ConfigError(f"testing.check_invariants: must be >= 0, got {raw['check_invariants']}")
    dial = raw.get("raft_dial_map", {})
    for k, v in dial.items():
        _hostport(f"testing.raft_dial_map.{k}", v)
    return TestHooks(**raw)


# Timers and bounds of the node process. The defaults were measured on a 2-core machine: a 5 ms tick
# and 20 ms heartbeats keep failover near one election timeout without a busy tick thread.
TUNING_DEFAULTS = {
    "auto_tick_period_s": 0.005,
    "append_entries_period_s": 0.02,
    "raft_min_timeout_s": 1.0,
    "raft_max_timeout_s": 2.0,
    "leader_fallback_timeout_s": 3.0,
    "connection_retry_s": 1.0,
    "request_timeout_s": 5.0,
    "max_batch_commands": 512,
    "max_batch_bytes": 262144,
    "max_inflight": 20000,
    "log_compaction_min_entries": 50000,
    "log_compaction_min_time_s": 300,
    "journal_memory_bytes": 16 << 20,     # newest log entries held in memory; older ones read back
    "raft_compression_level": 0,     # zlib level of Raft messages (pysyncobj's own default: 3)
    "dns_cache_time_s": 30,          # pysyncobj caches peer addresses (default 600 s): a peer
    "dns_fail_cache_time_s": 5,      # that comes back on a new IP must be found quickly
    "event_loop": "uvloop",          # or "asyncio" (node/server.py run_loop)
    "raft_engine": "thread",         # or "loop": the Ready loop on the event loop (node/raft/loop.py)
    # Bounds a client meets (docs/limits.md): connections, deadlines, long polls, sessions.
    "max_connections": 1000,
    "http_header_timeout_s": 10.0,
    "http_idle_timeout_s": 60.0,
    "http_body_timeout_s": 30.0,
    "http_write_stall_timeout_s": 30.0,
    "max_parked_reserves": 2048,
    "max_session_parked_reserves": 256,
    "max_session_inflight": 512,
    "max_session_queued_bytes": 1024 * 1024,
    "max_queued_answer_bytes": 32 * 1024 * 1024,
    "session_stall_timeout_s": 20.0,
    # A follower's forward link to the leader (node/service/forwarding.py).
    "forward_wait_s": 5.0,
    "max_forward_inflight": 4096,
    # The Raft port before authentication (node/raft/transport.py): a connection's handshake
    # must be done within the timeout; at most this many handshakes at once.
    "raft_handshake_timeout_s": 5.0,
    "raft_max_pending_handshakes": 64,
    "digest_inline_max_entries": 5000,   # larger states are hashed in a forked child (service.py)
}
EVENT_LOOPS = ("uvloop", "asyncio")
RAFT_ENGINES = ("thread", "loop")


def load(path: str | Path) -> Settings:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file ({e.strerror})")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}")
    return parse(doc, source=str(path), base_dir=path.parent)
