"""The operator's `raftq` commands for the replicated configuration, keys, moves and the audit:

    raftq config show | diff FILE | apply FILE [--yes]
    raftq keys add NAME ROLE | remove NAME | list
    raftq dlq move QUEUE ID... [--reason TEXT]
    raftq purge QUEUE [--yes]
    raftq queue delete NAME
    raftq audit [--limit N]

They talk to the cluster like every client command (commands.py: Ctx, run, the exit codes).
A configuration change goes through the log: `config apply` shows the difference between FILE
and the configuration in force, asks, and sends the whole new configuration with the version it
was compared against (a change made meanwhile by someone else is refused, not overwritten).
"""
from __future__ import annotations

import hashlib
import secrets
import time
import tomllib
from pathlib import Path

from ...node.core.config import API_ROLES
from ..local import toml_key, toml_value
from ...node.core.limits import ConfigError, Limits, diff_docs
from .commands import (EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, MAX_ADMIN_IDS, CliError, Ctx, _path, collect_pages,
                       confirm, fmt_rel, format_table, read_ids, short)

KEY_PREFIX = "rq_"


# ---------------------------------------------------------------------------- config files
def read_config_file(path: str) -> tuple[dict, list | None]:
    """FILE's [limits], [storage], [[queues]] as a configuration document (checked exactly as a
    node checks its TOML) and its [auth] api_keys as (name, role, key_sha256), or None when FILE
    has no [auth] (the keys in force are then left alone). A whole node config is fine: its
    [node], [cluster], [tuning] and [testing] are node-local and ignored here."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except OSError as e:
        raise CliError(f"{path}: cannot read the file ({e.strerror})", EXIT_UNREACHABLE)
    except tomllib.TOMLDecodeError as e:
        raise CliError(f"{path}: not valid TOML: {e}", EXIT_UNREACHABLE)
    config = {k: doc[k] for k in ("limits", "storage", "queues") if k in doc}
    try:
        limits = Limits.from_doc(config)
    except ConfigError as e:
        raise CliError(f"{path}: {e}", EXIT_FAILED)
    keys = None
    if "auth" in doc:
        auth = doc["auth"]
        raw = auth.get("api_keys", []) if isinstance(auth, dict) else None
        if not isinstance(raw, list):
            raise CliError(f"{path}: auth.api_keys: must be a list of {{name, key, role}}", EXIT_FAILED)
        keys = []
        for i, k in enumerate(raw):
            if not isinstance(k, dict) or not isinstance(k.get("name"), str) or not isinstance(k.get("key"), str):
                raise CliError(f"{path}: auth.api_keys[{i}]: must be a table {{name, key, role}}", EXIT_FAILED)
            role = k.get("role", "admin")
            if role not in API_ROLES:
                raise CliError(f"{path}: auth.api_keys[{i}].role: must be one of {', '.join(API_ROLES)}", EXIT_FAILED)
            keys.append((k["name"], role, hashlib.sha256(k["key"].encode("utf-8", "surrogateescape")).hexdigest()))
    return limits.doc, keys


def fmt_value(v) -> str:
    if v is None:
        return "(not set)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {fmt_value(x)}" for k, x in v.items() if k != "name") + "}"
    return repr(v) if isinstance(v, str) else str(v)


def key_changes(in_force: list[dict], wanted: list | None) -> list[tuple[str, str]]:
    """(name, what) for the keys FILE would change; nothing when FILE has no [auth]."""
    if wanted is None:
        return []
    have = {k["name"]: k for k in in_force}
    want = {name: (role, digest) for name, role, digest in wanted}
    out = []
    for name in sorted(set(have) | set(want)):
        if name not in want:
            out.append((name, f"removed ({have[name]['role']})"))
        elif name not in have:
            out.append((name, f"added ({want[name][0]})"))
        elif have[name]["role"] != want[name][0] or not want[name][1].startswith(have[name].get("key_sha256_prefix", "")):
            out.append((name, f"changed ({have[name]['role']} -> {want[name][0]}"
                              + (", another key" if not want[name][1].startswith(have[name].get("key_sha256_prefix", ""))
                                 else "") + ")"))
    return out


def render_diff(changes: list, keys: list) -> list[str]:
    lines = []
    for key, old, new in changes:
        if key.startswith("queues[") and key.endswith("]") and (old is None or new is None):
            lines.append(f"+ {key} {fmt_value(new)}" if old is None else f"- {key} {fmt_value(old)}")
        else:
            lines.append(f"~ {key}: {fmt_value(old)} -> {fmt_value(new)}")
    for name, what in keys:
        lines.append(f"~ auth.api_keys[{name}]: {what}")
    return lines


async def _compare(ctx: Ctx, path: str):
    wanted, wanted_keys = read_config_file(path)
    current = await ctx.call("config", "GET", "/v1/config")
    in_force_keys = (await ctx.call("keys", "GET", "/v1/keys"))["keys"] if wanted_keys is not None else []
    changes = diff_docs(current["config"], wanted)
    return current, wanted, wanted_keys, changes, key_changes(in_force_keys, wanted_keys)


async def cmd_config_show(ctx: Ctx) -> int:
    out = await ctx.call("config", "GET", "/v1/config")
    if ctx.json:
        ctx.dump(out)
        return EXIT_OK
    # Valid TOML (the version as a comment, unset keys commented out): `raftq config show >
    # FILE`, edit FILE, `raftq config apply FILE` is the way to change one value.
    cfg = out["config"]
    ctx.out(f"# configuration version {out['version']} (fingerprint {out['fingerprint']}), in force on every node")

    def lines(table: dict):
        for k, v in table.items():
            ctx.out(f"# {k}: not set" if v is None else f"{toml_key(k)} = {toml_value(v)}")
    for section in ("limits", "storage"):
        ctx.out(f"\n[{section}]")
        lines(cfg[section])
    for q in cfg["queues"]:
        ctx.out("\n[[queues]]")
        lines(q)
    return EXIT_OK


async def cmd_config_diff(ctx: Ctx) -> int:
    current, _, _, changes, keys = await _compare(ctx, ctx.args.file)
    if ctx.json:
        ctx.dump({"version": current["version"], "changes": [{"key": k, "in_force": a, "file": b} for k, a, b in changes],
                  "keys": [{"name": n, "change": w} for n, w in keys]})
        return EXIT_OK
    lines = render_diff(changes, keys)
    if not lines:
        ctx.out(f"{ctx.args.file} matches the configuration in force (version {current['version']})")
        return EXIT_OK
    ctx.out(f"{ctx.args.file} against the configuration in force (version {current['version']}): "
            f"{len(lines)} difference(s), in force -> file")
    for line in lines:
        ctx.out("  " + line)
    return EXIT_OK


async def cmd_config_apply(ctx: Ctx) -> int:
    current, wanted, wanted_keys, changes, keys = await _compare(ctx, ctx.args.file)
    lines = render_diff(changes, keys)
    if not lines:
        msg = f"nothing to apply: {ctx.args.file} matches the configuration in force (version {current['version']})"
        ctx.dump({"version": current["version"], "applied": False}) if ctx.json else ctx.out(msg)
        return EXIT_OK
    if not ctx.json:
        ctx.out(f"changes to the configuration in force (version {current['version']}), in force -> file:")
        for line in lines:
            ctx.out("  " + line)
    if not ctx.args.yes and not confirm(f"apply these {len(lines)} change(s) to every node?", "config apply"):
        ctx.err("raftq: not confirmed; nothing changed")
        return EXIT_FAILED
    body = {"config": wanted, "expect_version": current["version"]}
    if wanted_keys is not None:
        body["keys"] = [{"name": n, "role": r, "key_sha256": d} for n, r, d in wanted_keys]
    out = await ctx.call("config_put", "PUT", "/v1/config", body, mutating=True)
    if ctx.json:
        ctx.dump({**out, "applied": True})
        return EXIT_OK
    ctx.out(f"configuration version {out['version']} is in force on every node (no restart needed)")
    for w in out.get("warnings", []):
        ctx.out("  warning: " + describe_warning(w))
    return EXIT_OK


def describe_warning(w: dict) -> str:
    code = w.get("code")
    if code == "depth_above_limit":
        return (f"queue {w['queue']} holds {w['depth']} jobs, above its new max_queue_depth {w['limit']}: "
                "they stay; new enqueues are refused until it is below")
    if code == "undeclared_queue_has_jobs":
        return f"queue {w['queue']} is no longer declared but holds {w['jobs']} job(s): they stay"
    if code == "max_attempts_above_ceiling":
        return (f"{w['jobs']} job(s) of queue {w['queue']} have max_attempts above the new ceiling {w['limit']}: "
                "they keep theirs")
    if code == "dead_letters_kept":
        return (f"dead-letter retention is off now; the {w['dead_letters']} record(s) kept stay until drained, "
                "requeued or deleted")
    return str(w)


# ---------------------------------------------------------------------------- keys
async def cmd_keys_list(ctx: Ctx) -> int:
    keys = (await ctx.call("keys", "GET", "/v1/keys"))["keys"]
    if ctx.json:
        ctx.dump(keys)
        return EXIT_OK
    if not keys:
        ctx.out("no API keys: auth is off (every caller may do everything); add an admin key first: "
                "raftq keys add NAME admin")
        return EXIT_OK
    now = int(time.time() * 1000)
    ctx.out(format_table(["NAME", "ROLE", "ADDED BY", "ADDED"],
                         [[k["name"], k["role"], k["added_by"] or "-", fmt_rel(k["added_at_ms"] - now)] for k in keys]))
    return EXIT_OK


async def cmd_keys_add(ctx: Ctx) -> int:
    a = ctx.args
    if a.role not in API_ROLES:
        raise CliError(f"ROLE must be one of {', '.join(API_ROLES)}, got {a.role!r}", EXIT_UNREACHABLE)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    digest = hashlib.sha256(key.encode()).hexdigest()
    out = await ctx.call("key_add", "POST", "/v1/keys", {"name": a.name, "role": a.role, "key_sha256": digest},
                         mutating=True)
    if ctx.json:
        ctx.dump({**out, "key": key})
        return EXIT_OK
    ctx.out(key)
    ctx.err(f"raftq: key {a.name!r} ({a.role}) is in force on every node (configuration version {out['version']}). "
            "Store the key above now: it is shown only this once (the cluster keeps its SHA-256, not the key).")
    return EXIT_OK


async def cmd_keys_remove(ctx: Ctx) -> int:
    out = await ctx.call("key_remove", "DELETE", f"/v1/keys/{_path(ctx.args.name)}", None, mutating=True)
    if ctx.json:
        ctx.dump(out)
    else:
        ctx.out(f"key {ctx.args.name!r} removed: every node refuses it from now on "
                f"(configuration version {out['version']})")
    return EXIT_OK


# ---------------------------------------------------------------------------- operator moves
async def cmd_dlq_move(ctx: Ctx) -> int:
    a = ctx.args
    ids = read_ids(a.ids)
    moved, missing = [], []
    for i in range(0, len(ids), MAX_ADMIN_IDS):
        body = {"ids": ids[i:i + MAX_ADMIN_IDS]}
        if a.reason is not None:
            body["reason"] = a.reason
        out = await ctx.call("dead_letter_move", "POST", f"/v1/queues/{_path(a.queue)}/dead-letter", body,
                             mutating=True)
        moved += out["dead_lettered"]
        missing += out["missing"]
    if ctx.json:
        ctx.dump({"dead_lettered": moved, "missing": missing})
    else:
        for jid in moved:
            ctx.out(f"dead-lettered {jid}")
        for jid in missing:
            ctx.out(f"missing {jid} (not ready or scheduled in queue {a.queue}: in flight, elsewhere, or gone)")
        ctx.out(f"{len(moved)} moved to the dead letters (cause admin)" + (f", {len(missing)} missing" if missing else ""))
    return EXIT_FAILED if missing else EXIT_OK


async def cmd_purge(ctx: Ctx) -> int:
    a = ctx.args
    q = await ctx.call("queue", "GET", f"/v1/queues/{_path(a.queue)}")
    waiting = int(q.get("ready", 0)) + int(q.get("scheduled", 0))
    if not a.yes and not confirm(f"purge queue {a.queue}: remove its {q.get('ready', 0)} ready and "
                                 f"{q.get('scheduled', 0)} scheduled job(s) for good? (in-flight jobs finish)",
                                 f"purge removes jobs ({waiting} in queue {a.queue}); it"):
        ctx.err("raftq: not confirmed; nothing purged")
        return EXIT_FAILED
    out = await ctx.call("purge", "POST", f"/v1/queues/{_path(a.queue)}/purge", {}, mutating=True)
    if ctx.json:
        ctx.dump(out)
    else:
        ctx.out(f"purged {out['purged']} job(s) from queue {a.queue}")
    return EXIT_OK


async def cmd_queue_delete(ctx: Ctx) -> int:
    out = await ctx.call("queue_delete", "DELETE", f"/v1/queues/{_path(ctx.args.name)}", None, mutating=True)
    if ctx.json:
        ctx.dump(out)
    else:
        ctx.out(f"queue {ctx.args.name} deleted")
    return EXIT_OK


# ---------------------------------------------------------------------------- audit
async def cmd_audit(ctx: Ctx) -> int:
    limit = ctx.args.limit
    if limit < 1:
        raise CliError("--limit must be at least 1", EXIT_UNREACHABLE)
    entries = await collect_pages(ctx, "audit", "/v1/audit", "entries", limit)
    if ctx.json:
        ctx.dump(entries)
        return EXIT_OK
    if not entries:
        ctx.out("the audit trail is empty")
        return EXIT_OK
    now = int(time.time() * 1000)
    ctx.out(format_table(["WHEN", "WHO", "ACTION", "TARGET", "DETAILS"],
                         [[fmt_rel(e["at_ms"] - now), e["who"] or "-", e["action"], e["target"] or "-",
                           short(", ".join(f"{k}={v}" for k, v in e["details"].items()), 70)] for e in entries]))
    return EXIT_OK


# ---------------------------------------------------------------------------- parsers
def add_parsers(sub, add_common, run) -> None:
    """`raftq keys`, `dlq move` (added by commands' dlq group), `purge`, `queue`, `audit`."""
    def client(parser, fn):
        add_common(parser, top=False)
        parser.set_defaults(fn=lambda a, fn=fn: run(a, fn))
        return parser

    k = sub.add_parser("keys", help="API keys in force on every node: add, remove, list",
                       description="API keys in force on every node (replicated: no restart)")
    ksub = k.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    ka = client(ksub.add_parser("add", help="make a random key here, send its SHA-256, print the key once"), cmd_keys_add)
    ka.add_argument("name", metavar="NAME")
    ka.add_argument("role", metavar="ROLE", help="viewer, worker, operator or admin")
    ka.set_defaults(command="keys add")
    kr = client(ksub.add_parser("remove", help="remove a key (the last admin key cannot be removed)"), cmd_keys_remove)
    kr.add_argument("name", metavar="NAME")
    kr.set_defaults(command="keys remove")
    kl = client(ksub.add_parser("list", help="names, roles, who added them and when"), cmd_keys_list)
    kl.set_defaults(command="keys list")

    p = client(sub.add_parser("purge", help="remove every ready and scheduled job of a queue (in-flight jobs finish)"),
               cmd_purge)
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    q = sub.add_parser("queue", help="queue moves: delete", description="queue moves: delete")
    qsub = q.add_subparsers(dest="queue_command", required=True, metavar="ACTION")
    qd = client(qsub.add_parser("delete", help="delete an empty queue that is not declared in the config"),
                cmd_queue_delete)
    qd.add_argument("name", metavar="NAME")
    qd.set_defaults(command="queue delete")

    a = client(sub.add_parser("audit", help="the audit trail of operator actions, newest first"), cmd_audit)
    a.add_argument("--limit", type=int, default=50, help="show at most this many entries (default 50)")


def add_dlq_move(dlq_cmd) -> None:
    m = dlq_cmd("move", cmd_dlq_move, "move ready or scheduled jobs of a queue to the dead letters (cause admin)")
    m.add_argument("queue", metavar="QUEUE")
    m.add_argument("ids", nargs="+", metavar="ID", help="job ids; `-` reads them from stdin")
    m.add_argument("--reason", metavar="TEXT", help="kept as the dead letter's last_reason")


def add_config_actions(add_action, add_common, run) -> None:
    def action(name, fn, help):
        a = add_action(name, lambda args, fn=fn: run(args, fn), help)
        add_common(a, top=False)
        return a

    action("show", cmd_config_show, "the configuration in force on every node ([limits], [storage], [[queues]])")
    d = action("diff", cmd_config_diff, "FILE's [limits], [storage], [[queues]] (and [auth]) against the "
               "configuration in force")
    d.add_argument("file", metavar="FILE", help="a node config or a file with just those sections")
    ap = action("apply", cmd_config_apply, "show the diff, ask, then make FILE's sections the configuration in force "
                "(through the log: every node at once, no restart)")
    ap.add_argument("file", metavar="FILE")
    ap.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
