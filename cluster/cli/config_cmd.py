"""`raftq config ACTION`: node configs for a cluster on real machines.

    raftq config init --hosts 10.0.0.1,10.0.0.2,10.0.0.3 [--out DIR]

writes one node config per host (its HTTP and Raft addresses on that host, the peer list, a
fresh random secret shared by all), the systemd unit and a README.md with the commands that
install them, host by host. Every file is 0600 in a 0700 directory (the configs hold the secret),
and every config is loaded back with raftq.node.settings.load before the command says it is done.

`config` is a command group: add an action with `add_action(name, fn, help)` in `add_parser`.
"""
from __future__ import annotations

import datetime as _dt
import secrets
import sys
from importlib import resources
from pathlib import Path

from ...node.limits import ConfigError
from ...node.settings import load
from ..local import private_dir, toml_value, write_private
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


def node_config(i: int, ids: list[str], hosts: list[str], args, secret: str, sections: dict, stamp: str) -> str:
    peers = [{"id": ids[j], "raft": hostport(hosts[j], args.raft_port),
              "url": f"http://{hostport(hosts[j], args.http_port)}"} for j in range(len(hosts))]
    me = peers[i]
    members = ", ".join(f"{p['id']} {h}" for p, h in zip(peers, hosts))
    storage = {"dead_letter_retention_ms": DEFAULT_RETENTION_MS, **(sections.get("storage") or {})}
    lines = [
        f"# raftq node {ids[i]} on {hosts[i]}, written by `raftq config init` on {stamp}",
        f"# for the cluster {members}.",
        "# Install as /etc/raftq/node.toml (owner root:raftq, mode 0640): it holds the cluster secret.",
        "# The configs of the nodes differ only in [node]; everything else must stay identical on all of them.",
        "",
        "[node]",
        f"id = {toml_value(ids[i])}",
        f"http = {toml_value(hostport(hosts[i], args.http_port))}".ljust(36) + "# the API, for clients and the other nodes",
        f"url = {toml_value(me['url'])}".ljust(36) + "# where clients are redirected when this node leads",
        f"raft = {toml_value(me['raft'])}".ljust(36) + "# Raft, the other nodes only; bound to exactly this address",
        f"data_dir = {toml_value(args.data_dir)}".ljust(36) + "# journal, snapshot, term and vote",
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


def install_readme(out: Path, ids: list[str], hosts: list[str], args, stamp: str) -> str:
    urls = ",".join(f"http://{hostport(h, args.http_port)}" for h in hosts)
    members = ", ".join(f"{n} on {h}" for n, h in zip(ids, hosts))
    d = args.data_dir
    parts = [f"""# raftq cluster: {members}

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
"""]
    for n, h in zip(ids, hosts):
        ssh_host = f"[{h}]" if ":" in h else h
        parts.append(f"""
### {n} on {h}

From this directory (`cd {out}`):

```sh
scp {n}.toml {UNIT_NAME} root@{ssh_host}:/tmp/
```

Then on {h}, as root:

```sh
install -d -m 0750 -o root -g raftq /etc/raftq
install -m 0640 -o root -g raftq /tmp/{n}.toml /etc/raftq/node.toml
install -m 0644 /tmp/{UNIT_NAME} /etc/systemd/system/{UNIT_NAME}
rm /tmp/{n}.toml /tmp/{UNIT_NAME}
sudo -u raftq /opt/raftq/.venv/bin/python -c "from raftq.node.settings import load; s = load('/etc/raftq/node.toml'); print(s.node_id, s.raft, s.data_dir)"
systemctl daemon-reload && systemctl enable --now raftq
```
""")
    parts.append(f"""
## 3. Check

The order of the hosts does not matter: the cluster elects a leader as soon as a majority is up.
From any machine that reaches the HTTP ports (with raftq installed):

```sh
raftq status --urls {urls}
```

One leader, every node with the same applied index and digest once writes stop. On a host:
`journalctl -u raftq -f`. Clients take the same URLs: `Client("{urls}")`.
""")
    return "".join(parts)


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
    names = [f"{n}.toml" for n in ids] + [UNIT_NAME, "README.md"]
    if out.exists() and not out.is_dir():
        raise InitError(f"--out {out} is a file; give a directory")
    existing = [n for n in names if (out / n).exists()]
    if existing and not args.force:
        raise InitError(f"{out} already holds {', '.join(existing)}; give another --out, or --force to overwrite "
                        "(a new secret: every node must get the new files)")
    private_dir(out)
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
    i.add_argument("--force", action="store_true", help="overwrite the files of an earlier init in --out")

    if add_common is not None:
        from .admin_cmd import add_config_actions
        add_config_actions(add_action, add_common, run)

    # Add further actions above this line: `raftq config` alone then lists them all.
    csub.metavar = "{" + ",".join(csub.choices) + "}"
