"""`raftq config ACTION`: node configs for a cluster on real machines.

    raftq config init --hosts 10.0.0.1,10.0.0.2,10.0.0.3 [--out DIR]

writes one node config per host (its HTTP and Raft addresses on that host, the peer list, a
fresh random secret shared by all), the systemd unit and a README.md with the commands that
install them, host by host. With --tls also a CA (ca.pem, ca-key.pem) and a certificate per
host (n1-cert.pem, n1-key.pem ...: subjectAltName the host given), the configs serving https://;
with --mtls also a client certificate (client-cert.pem, client-key.pem) that the nodes require. Every file is 0600 in a 0700 directory (the configs hold the secret),
and every config is loaded back with raftq.node.base.settings.load before the command says it is done.

`config` is a command group: add an action with `add_action(name, fn, help)` in `add_parser`.
"""
from __future__ import annotations

import datetime as _dt
import secrets
import sys
from importlib import resources
from pathlib import Path

from ...node.core.limits import ConfigError
from ...node.base.settings import load
from ..files import private_dir, write_private
from ..local import toml_value
from . import sections as S

UNIT_NAME = "raftq.service"
DEFAULT_DATA_DIR = "/var/lib/raftq"
DEFAULT_RETENTION_MS = 7 * 86_400_000
EXIT_OK, EXIT_USAGE = 0, 2


class InitError(Exception):
    pass


def unit_text(data_dir: str = DEFAULT_DATA_DIR) -> str:
    """The systemd unit (the same file as deploy/systemd/raftq.service), for `data_dir`."""
    text = (resources.files(__package__) / UNIT_NAME).read_text()
    if data_dir != DEFAULT_DATA_DIR:
        text = text.replace("ReadWritePaths=/var/lib/raftq", f"ReadWritePaths={data_dir}")
        text = text.replace("WorkingDirectory=/var/lib/raftq", f"WorkingDirectory={data_dir}")
    return text


def parse_hosts(hosts: str, nodes: int | None) -> list[str]:
    if "{n}" in hosts:
        if nodes is None:
            raise InitError("--hosts with {n} is a pattern: give --nodes N too (e.g. --hosts 'raftq-{n}.internal' "
                            "--nodes 3)")
        if "," in hosts:
            raise InitError("--hosts: give either a comma-separated list or one pattern with {n}, not both")
        out = [hosts.replace("{n}", str(i + 1)) for i in range(nodes)]
    else:
        out = [h.strip() for h in hosts.split(",") if h.strip()]
        if nodes is not None and nodes != len(out):
            raise InitError(f"--nodes {nodes} but --hosts names {len(out)} host(s); leave out --nodes, or give "
                            "--hosts as a pattern with {n}")
    if not out:
        raise InitError("--hosts is empty: give the machines, e.g. --hosts 10.0.0.1,10.0.0.2,10.0.0.3")
    for h in out:
        if any(c.isspace() for c in h) or "/" in h or h.startswith("[") or h.count(":") == 1:
            raise InitError(f"--hosts: {h!r} is not a host name or IP address (give hosts without ports; "
                            "--http-port and --raft-port set the ports)")
    dups = sorted({h for h in out if out.count(h) > 1})
    if dups:
        raise InitError(f"--hosts: {', '.join(dups)} given more than once; one node per machine "
                        "(for a cluster on one machine use `raftq up`)")
    if len(out) % 2 == 0:
        raise InitError(f"--hosts: {len(out)} hosts; use an odd number (3 or 5) so a majority survives a split")
    return out


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def scheme(args) -> str:
    return "https" if args.tls else "http"


def node_config(i: int, ids: list[str], hosts: list[str], args, secret: str, sections: dict, stamp: str) -> str:
    peers = [{"id": ids[j], "raft": hostport(hosts[j], args.raft_port),
              "url": f"{scheme(args)}://{hostport(hosts[j], args.http_port)}"} for j in range(len(hosts))]
    me = peers[i]
    members = ", ".join(f"{p['id']} {h}" for p, h in zip(peers, hosts))
    storage = {"dead_letter_retention_ms": DEFAULT_RETENTION_MS, **(sections.get("storage") or {})}
    lines = [
        f"# raftq node {ids[i]} on {hosts[i]}, written by `raftq config init` on {stamp}",
        f"# for the cluster {members}.",
        "# Install as /etc/raftq/node.toml (owner root:raftq, mode 0640): it holds the cluster secret.",
        "# The configs of the nodes differ only in [node]; everything else must stay identical on all of them.",
        "# [limits], [storage], [[queues]] and [auth] seed the cluster's configuration; after its first",
        "# election the cluster keeps its own and changes it online (`raftq config apply FILE`, `raftq keys`).",
        "",
        "[node]",
        f"id = {toml_value(ids[i])}",
        f"http = {toml_value(hostport(hosts[i], args.http_port))}".ljust(36) + "# the API, for clients and the other nodes",
        f"url = {toml_value(me['url'])}".ljust(36) + "# where clients are redirected when this node leads",
        f"raft = {toml_value(me['raft'])}".ljust(36) + "# Raft, the other nodes only; bound to exactly this address",
        f"data_dir = {toml_value(args.data_dir)}".ljust(36) + "# journal, snapshot, term and vote",
        *([
            "# TLS: paths relative to this file (/etc/raftq/cert.pem ...). SIGHUP reloads them.",
            f"tls_cert = {toml_value(TLS_FILES['cert'])}".ljust(36) + f"# this node's certificate, for {hosts[i]}",
            f"tls_key = {toml_value(TLS_FILES['key'])}".ljust(36) + "# its private key (0640 root:raftq)",
            f"tls_peer_ca = {toml_value(TLS_FILES['ca'])}".ljust(36) + "# the CA this node trusts when it calls the others",
        ] if args.tls else []),
        *([f"tls_client_ca = {toml_value(TLS_FILES['ca'])}".ljust(36)
           + "# clients must present a certificate signed by this CA"] if args.mtls else []),
        "",
        "[cluster]",
        "peers = [                           # every member, this node included; the same list on every node",
        *[f"  {toml_value(p)}," for p in peers],
        "]",
        "# The Raft transport's password (authenticated encryption): the same on every node, never in",
        "# version control. The Raft port speaks pickle: whoever has the secret can run code on the node.",
        f"secret = {toml_value(secret)}",
        f"durability = {toml_value(args.durability)}",
        "",
        "[storage]",
        *[f"{k} = {toml_value(v)}" + ("   # keep dead letters (0 = no dead-letter store)"
                                      if k == "dead_letter_retention_ms" else "") for k, v in storage.items()],
    ]
    rest = S.render({k: v for k, v in sections.items() if k != "storage"})
    return "\n".join(lines) + "\n" + ("\n" + rest if rest else "")


TLS_FILES = {"cert": "cert.pem", "key": "key.pem", "ca": "ca.pem"}     # next to /etc/raftq/node.toml


def make_certs(out: Path, ids: list[str], hosts: list[str], mtls: bool) -> list[str]:
    """The CA and one certificate per host (subjectAltName: the host as given), plus a client
    certificate with mTLS; every file 0600. Returns the file names."""
    try:
        from .. import certs as C
    except ImportError as e:            # a client-only install
        raise InitError(f"--tls needs the server extra (missing {e.name}): pip install 'raftq[server]'")
    ca, ca_key = C.make_ca("raftq CA", days=3650)
    C.write_pair(out / "ca.pem", out / "ca-key.pem", ca, ca_key)
    names = ["ca.pem", "ca-key.pem"]
    for n, h in zip(ids, hosts):
        cert, key = C.make_leaf(ca, ca_key, n, [h], days=825)
        C.write_pair(out / f"{n}-cert.pem", out / f"{n}-key.pem", cert, key)
        names += [f"{n}-cert.pem", f"{n}-key.pem"]
    if mtls:
        cert, key = C.make_leaf(ca, ca_key, "raftq client", [], days=825, server=False)
        C.write_pair(out / "client-cert.pem", out / "client-key.pem", cert, key)
        names += ["client-cert.pem", "client-key.pem"]
    return names


def check_certs(out: Path, ids: list[str], hosts: list[str], mtls: bool) -> None:
    """What a node will do with them: every certificate loads with its key (node/base/tls.py) and
    verifies against the CA for its host, as a client checks it."""
    import ssl
    from ...node.base.settings import TlsFiles
    from ...node.base.tls import load as load_tls
    for n, h in zip(ids, hosts):
        server = load_tls(TlsFiles(cert=out / f"{n}-cert.pem", key=out / f"{n}-key.pem",
                                   client_ca=out / "ca.pem" if mtls else None, peer_ca=out / "ca.pem")).context
        client = ssl.create_default_context(cafile=str(out / "ca.pem"))
        if mtls:
            client.load_cert_chain(str(out / "client-cert.pem"), str(out / "client-key.pem"))
        handshake(server, client, h)


def handshake(server, client, host: str) -> None:
    """A TLS handshake between two contexts in memory; raises ssl.SSLError when it fails."""
    import ssl
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=host)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = [False, False]
    for _ in range(10):
        for k, (obj, out, peer_in) in enumerate(((c, c_out, s_in), (s, s_out, c_in))):
            if not done[k]:
                try:
                    obj.do_handshake()
                    done[k] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done):
            return
    raise ssl.SSLError("the handshake did not finish")


def install_readme(out: Path, ids: list[str], hosts: list[str], args, stamp: str) -> str:
    urls = ",".join(f"{scheme(args)}://{hostport(h, args.http_port)}" for h in hosts)
    parts = [_readme_head(ids, hosts, args, stamp)]
    for n, h in zip(ids, hosts):
        parts.append(_readme_host(out, n, h, args))
    parts.append(_readme_check(urls, args))
    if args.tls:
        parts.append(tls_readme(ids, hosts, args))
    return "".join(parts)


def _readme_head(ids: list[str], hosts: list[str], args, stamp: str) -> str:
    """The README's title, the table of nodes and step 1 (Python, a user, the package)."""
    members = ", ".join(f"{n} on {h}" for n, h in zip(ids, hosts))
    d = args.data_dir
    return f"""# raftq cluster: {members}

Written by `raftq config init` on {stamp}. Every `nX.toml` here holds the cluster secret: keep this
directory private (it is mode 0700, its files 0600) and out of version control; put the files in your
secret store if you want to keep them. deploy/README.md in the raftq repository explains every step
(firewall, API keys, rolling restarts, backups).

| node | host | HTTP API | Raft | config |
|---|---|---|---|---|
""" + "".join(f"| {n} | {h} | {hostport(h, args.http_port)} | {hostport(h, args.raft_port)} | {n}.toml |\n"
               for n, h in zip(ids, hosts)) + f"""
Open the Raft port ({args.raft_port}) to the other nodes only, and the HTTP port ({args.http_port}) to your
clients and the other nodes.

## 1. On every host, as root: Python, a user, the package

```sh
apt-get install -y python3 python3-venv
useradd --system --home-dir {d} --no-create-home --shell /usr/sbin/nologin raftq
python3 -m venv /opt/raftq/.venv
/opt/raftq/.venv/bin/pip install '/path/to/raftq[server]'   # a checkout of raftq or its wheel, with the server extra
```

## 2. Each host's config and the unit
"""


def _readme_host(out: Path, n: str, h: str, args) -> str:
    """Step 2 for node n on host h: copy its config (and TLS files) and the unit, install, start."""
    ssh_host = f"[{h}]" if ":" in h else h
    tls_files = f" {n}-cert.pem {n}-key.pem ca.pem" if args.tls else ""
    tls_install = (f"""install -m 0640 -o root -g raftq /tmp/{n}-cert.pem /etc/raftq/{TLS_FILES['cert']}
install -m 0640 -o root -g raftq /tmp/{n}-key.pem /etc/raftq/{TLS_FILES['key']}
install -m 0644 /tmp/ca.pem /etc/raftq/{TLS_FILES['ca']}
""" if args.tls else "")
    check = ("sudo -u raftq /opt/raftq/.venv/bin/raftq node --config /etc/raftq/node.toml --check" if args.tls else
             "sudo -u raftq /opt/raftq/.venv/bin/python -c \"from raftq.node.base.settings import load; "
             "s = load('/etc/raftq/node.toml'); print(s.node_id, s.raft, s.data_dir)\"")
    return f"""
### {n} on {h}

From this directory (`cd {out}`):

```sh
scp {n}.toml{tls_files} {UNIT_NAME} root@{ssh_host}:/tmp/
```

Then on {h}, as root:

```sh
install -d -m 0750 -o root -g raftq /etc/raftq
install -m 0640 -o root -g raftq /tmp/{n}.toml /etc/raftq/node.toml
{tls_install}install -m 0644 /tmp/{UNIT_NAME} /etc/systemd/system/{UNIT_NAME}
rm /tmp/{n}.toml{tls_files.replace(' ', ' /tmp/')} /tmp/{UNIT_NAME}
{check}
systemctl daemon-reload && systemctl enable --now raftq
```
"""


def _readme_check(urls: str, args) -> str:
    """Step 3: check the cluster from a client."""
    tls_opts = (" --ca ca.pem" + (" --cert client-cert.pem --key client-key.pem" if args.mtls else "")) if args.tls else ""
    tls_kwargs = ((', ca="ca.pem"' + (', cert=("client-cert.pem", "client-key.pem")' if args.mtls else ""))
                  if args.tls else "")
    return f"""
## 3. Check

The order of the hosts does not matter: the cluster elects a leader as soon as a majority is up.
From any machine that reaches the HTTP ports (with raftq installed):

```sh
raftq status --urls {urls}{tls_opts}
```

One leader, every node with the same applied index and digest once writes stop. On a host:
`journalctl -u raftq -f`. Clients take the same URLs: `Client("{urls}"{tls_kwargs})`.
"""


def tls_readme(ids: list[str], hosts: list[str], args) -> str:
    first, host = ids[0], hosts[0]
    san = f"IP:{host}" if _is_ip(host) else f"DNS:{host}"
    return f"""
## TLS

Every node serves https:// with its certificate (`nX-cert.pem`, for its host) from the CA made
here (`ca.pem`, valid 10 years; the node certificates 825 days){'; the nodes require a client certificate signed by it (mTLS): `client-cert.pem` and `client-key.pem` are one, give them to your clients (or make one per client as below, without serverAuth)' if args.mtls else ''}.
Clients trust `ca.pem` (`raftq --ca ca.pem`, `Client(..., ca="ca.pem")`). The Raft port does not
use TLS: it is encrypted and authenticated with the cluster secret.

Keep `ca-key.pem` off the nodes and offline (your secret store): whoever holds it can make
certificates that your nodes and clients trust. It is what you need to renew a certificate. To
renew {first}'s (and the same for the others, with their host), in this directory:

```sh
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/O=raftq/CN={first}" -keyout {first}-key.pem -out {first}.csr
printf 'subjectAltName={san}\\nextendedKeyUsage=serverAuth,clientAuth\\nbasicConstraints=critical,CA:FALSE\\nkeyUsage=critical,digitalSignature\\n' > {first}.ext
openssl x509 -req -in {first}.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 825 -sha256 -extfile {first}.ext -out {first}-cert.pem
```

then copy `{first}-cert.pem` and `{first}-key.pem` to {host} as in step 2 (the same `install` lines)
and reload them without a restart: `systemctl reload raftq` (SIGHUP: new connections get the new
certificate, established ones keep theirs; files that do not load are refused, logged, and the
old certificate stays).
"""


def _is_ip(host: str) -> bool:
    import ipaddress
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def cmd_init(args) -> int:
    try:
        return _init(args)
    except (InitError, ConfigError) as e:
        print(f"raftq config init: {e}", file=sys.stderr)
        return EXIT_USAGE


def _init(args) -> int:
    hosts = parse_hosts(args.hosts, args.nodes)
    for name in ("http_port", "raft_port"):
        port = getattr(args, name)
        if not 1 <= port <= 65535:
            raise InitError(f"--{name.replace('_', '-')} {port}: a port is 1..65535")
    if args.http_port == args.raft_port:
        raise InitError("--http-port and --raft-port must differ")
    if not args.data_dir.startswith("/"):
        raise InitError(f"--data-dir {args.data_dir}: give an absolute path (the unit runs the node in it)")
    sections = S.load_sections(args.include) if args.include else {}
    out = Path(args.out)
    ids = [f"n{i + 1}" for i in range(len(hosts))]
    if args.mtls:
        args.tls = True
    names = [f"{n}.toml" for n in ids] + [UNIT_NAME, "README.md"]
    if args.tls:
        names += ["ca.pem", "ca-key.pem"] + [f"{n}-{k}.pem" for n in ids for k in ("cert", "key")]
        if args.mtls:
            names += ["client-cert.pem", "client-key.pem"]
    if out.exists() and not out.is_dir():
        raise InitError(f"--out {out} is a file; give a directory")
    existing = [n for n in names if (out / n).exists()]
    if existing and not args.force:
        raise InitError(f"{out} already holds {', '.join(existing)}; give another --out, or --force to overwrite "
                        "(a new secret: every node must get the new files)")
    private_dir(out)
    if args.tls:
        make_certs(out, ids, hosts, args.mtls)
        check_certs(out, ids, hosts, args.mtls)
    secret = secrets.token_hex(32)
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    for i in range(len(hosts)):
        write_private(out / f"{ids[i]}.toml", node_config(i, ids, hosts, args, secret, sections, stamp))
    write_private(out / UNIT_NAME, unit_text(args.data_dir))
    write_private(out / "README.md", install_readme(out, ids, hosts, args, stamp))
    for i in range(len(hosts)):                 # what the node will do with it at start
        s = load(out / f"{ids[i]}.toml")
        assert s.node_id == ids[i] and s.secret == secret
    print(f"raftq config init: wrote the configs of a {len(hosts)}-node cluster to {out}/ "
          "(files 0600: they hold a new random secret)")
    for i, h in enumerate(hosts):
        print(f"  {out / (ids[i] + '.toml')}  {ids[i]} on {h}: HTTP {hostport(h, args.http_port)}, "
              f"Raft {hostport(h, args.raft_port)}")
    if args.tls:
        print(f"  {out / 'ca.pem'}  the CA (its key {out / 'ca-key.pem'}: keep it offline, not on the nodes)")
        print(f"  {out / 'n1-cert.pem'} ...  a certificate and key per host, for the name or IP given"
              + ("; client-cert.pem and client-key.pem for your clients (mTLS)" if args.mtls else ""))
    print(f"  {out / UNIT_NAME}  the systemd unit\n  {out / 'README.md'}  how to install them, host by host")
    print(f"next: follow {out / 'README.md'}")
    return EXIT_OK


def add_parser(sub, add_common=None, run=None) -> None:
    c = sub.add_parser("config", help="node configs (init) and the cluster's configuration in force (show, diff, "
                       "apply)", description="Node configs for a cluster on real machines, and the configuration "
                       "in force on a running cluster.")
    csub = c.add_subparsers(dest="config_action", required=True, title="actions")

    def add_action(name: str, fn, help: str):
        a = csub.add_parser(name, help=help, description=help)
        a.set_defaults(fn=fn, command=f"config {name}")
        return a

    i = add_action("init", cmd_init, "write one node config per host, the systemd unit and install steps")
    i.add_argument("--hosts", required=True, metavar="H1,H2,H3",
                   help="the machines, one node each (IPs or DNS names); or a pattern with {n} and --nodes N")
    i.add_argument("--nodes", type=int, metavar="N", help="the node count, with a --hosts pattern such as "
                   "'raftq-{n}.internal'")
    i.add_argument("--out", default="raftq-config", metavar="DIR", help="write here (default ./raftq-config)")
    i.add_argument("--http-port", type=int, default=7001, help="the API port on every host (default 7001)")
    i.add_argument("--raft-port", type=int, default=7101, help="the Raft port on every host (default 7101)")
    i.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"data_dir on every host (default {DEFAULT_DATA_DIR})")
    i.add_argument("--durability", choices=("fsync", "memory"), default="fsync")
    i.add_argument("--include", metavar="FILE", help="[limits], [storage], [[queues]], [auth], [tuning] to put "
                   "in every config (checked as a node checks its config)")
    i.add_argument("--tls", action="store_true", help="the nodes serve https://: a CA and a certificate per host "
                   "(subjectAltName: the host as given) are made too")
    i.add_argument("--mtls", action="store_true", help="--tls, and the nodes require client certificates signed by "
                   "that CA (one is made: client-cert.pem)")
    i.add_argument("--force", action="store_true", help="overwrite the files of an earlier init in --out")

    if add_common is not None:
        from .admin_cmd import add_config_actions
        add_config_actions(add_action, add_common, run)

    # Add further actions above this line: `raftq config` alone then lists them all.
    csub.metavar = "{" + ",".join(csub.choices) + "}"
