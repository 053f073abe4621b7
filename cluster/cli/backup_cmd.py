"""`raftq backup` and `raftq restore`: an online backup of the state, and the data dirs of a new
cluster made from one (node/replication/backup.py has the file format)."""
from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import aiohttp

from .commands import EXIT_FAILED, EXIT_UNREACHABLE, CliError, Ctx, unreachable_message


def _pick(answers) -> list[str]:
    """Nodes to take the backup from, best first: caught-up followers (the leader serves the
    clients), then the leader; nodes that are not ready last."""
    def rank(a):
        v = a.view
        return (not v.get("ready"), v.get("role") == "leader", -(v.get("last_applied") or 0))
    return [a.url for a in sorted((a for a in answers if a.view), key=rank)]


async def cmd_backup(ctx: Ctx) -> int:
    a = ctx.args
    out = Path(a.out)
    if out.exists() and not a.force:
        raise CliError(f"{out} exists; choose another --out or add --force to overwrite it", EXIT_FAILED)
    if not a.wait >= 0:
        raise CliError("--wait must be a number of seconds, 0 or more", EXIT_UNREACHABLE)
    answers = await ctx.probe(ctx.urls)
    candidates = _pick(answers) if a.node is None else [a.node.rstrip("/")]
    if not candidates:
        raise CliError(unreachable_message(ctx.urls, answers), EXIT_UNREACHABLE)
    tmp = out.with_name(out.name + ".part")
    try:
        url, header, seconds = await _first_backup(ctx, candidates, tmp)
    except CliError:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    os.replace(tmp, out)
    size = out.stat().st_size
    if ctx.json:
        ctx.dump({"file": str(out), "bytes": size, "seconds": round(seconds, 3), "from": url,
                  **{k: header[k] for k in ("index", "term", "digest", "node", "body_sha256", "taken_at_ms")}})
    else:
        ctx.out(f"backup of {header['node']} at index {header['index']} (term {header['term']}), digest "
                f"{header['digest']}: {size:,} bytes in {seconds:.1f}s -> {out}")
        ctx.out(f"restore it into every node of a new cluster: raftq restore {out} --data-dir DIR")
    return 0


class _Busy(CliError):
    """429: the node is taking another backup (or at another bound): worth asking again after
    `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message, EXIT_FAILED)
        self.retry_after = retry_after


async def _first_backup(ctx: Ctx, candidates: list[str], tmp: Path) -> tuple[str, dict, float]:
    """The first whole backup from the candidates, in order. A node that fails otherwise is
    passed over; a node that answers 429 (one backup at a time per node) is asked again after its
    Retry-After once the others were tried, for up to --wait seconds in all."""
    deadline = time.monotonic() + ctx.args.wait
    pending, told = list(candidates), False
    while True:
        busy, last_error = [], None
        for url in pending:
            t0 = time.monotonic()
            try:
                return url, await _download(ctx, url, tmp), time.monotonic() - t0
            except _Busy as e:
                busy.append((url, e))
            except CliError as e:
                last_error = e
                ctx.err(f"raftq: {url}: {e}; trying the next node" if url != pending[-1] else f"raftq: {url}: {e}")
        if not busy:
            raise last_error
        pause = max(e.retry_after for _, e in busy)
        if time.monotonic() + pause > deadline:
            raise CliError(f"{', '.join(u for u, _ in busy)}: {busy[0][1]} (waited {ctx.args.wait:g}s: take it later, "
                           "or wait longer with --wait)", EXIT_FAILED)
        if not told:
            ctx.err(f"raftq: {', '.join(u for u, _ in busy)}: busy ({busy[0][1]}); asking again every "
                    f"{pause:g}s for up to {ctx.args.wait:g}s (--wait)")
            told = True
        pending = [u for u, _ in busy]
        await asyncio.sleep(pause)


async def _download(ctx: Ctx, url: str, tmp: Path) -> dict:
    from ...node.replication import backup as fmt
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=ctx.probe_timeout, sock_read=max(60.0, ctx.timeout))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx.ssl), timeout=timeout) as s:
            async with s.get(url + "/v1/backup", headers=ctx._headers(), allow_redirects=False) as r:
                if r.status != 200:
                    try:
                        body = await r.json(content_type=None)
                        msg = body["error"]["message"]
                    except Exception:
                        msg = (await r.text())[:200]
                    if r.status == 429:
                        raise _Busy(f"HTTP 429: {msg}", _retry_after(r.headers.get("Retry-After")))
                    raise CliError(f"HTTP {r.status}: {msg}", EXIT_FAILED)
                done, shown = 0, 0.0
                with open(tmp, "wb") as f:
                    async for chunk in r.content.iter_chunked(1 << 20):
                        f.write(chunk)
                        done += len(chunk)
                        if ctx.progress and time.monotonic() - shown > 0.5:
                            shown = time.monotonic()
                            print(f"\rbackup: {done / 1e6:,.1f} MB", end="", file=sys.stderr, flush=True)
                    f.flush()
                    os.fsync(f.fileno())
                if ctx.progress:
                    print(file=sys.stderr)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise CliError(f"the download failed: {type(e).__name__}: {e}", EXIT_FAILED) from None
    try:
        return fmt.verify(tmp)       # what arrived is what the node wrote, end to end
    except fmt.BackupError as e:
        raise CliError(f"the backup received does not verify: {e}", EXIT_FAILED) from None


def _retry_after(value: str | None) -> float:
    try:
        return min(max(float(value), 0.1), 10.0)
    except (TypeError, ValueError):
        return 1.0


def cmd_restore(args) -> int:
    """Make DIR the data dir of one node of a new cluster holding the backup's state."""
    try:
        from ...node.replication import backup as fmt
        from ...node.replication.replica import write_restored_snapshot
    except ImportError as e:
        print(f"raftq restore: this install has the client only (missing {e.name}); restoring needs the server "
              "extra: pip install 'raftq[server]'", file=sys.stderr)
        return 2
    try:
        header, machine = fmt.load(args.file)
    except FileNotFoundError:
        print(f"raftq restore: {args.file}: no such file", file=sys.stderr)
        return 2
    except fmt.BackupError as e:
        print(f"raftq restore: {args.file}: {e}", file=sys.stderr)
        return 1
    # The state must hash to the digest the source node had at that index: the file is the
    # state it claims to be (the checksum only proves it is the file the node wrote).
    from ...node.core.limits import Limits
    from ...node.core.machine import QueueMachine
    try:
        digest = QueueMachine.from_builtins(Limits.build(), machine).digest()
    except Exception as e:           # noqa: BLE001 - a state this version cannot read
        print(f"raftq restore: {args.file}: the state cannot be read by this raftq: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1
    if digest != header["digest"]:
        print(f"raftq restore: {args.file}: the state hashes to {digest}, the header says {header['digest']}",
              file=sys.stderr)
        return 1
    if args.check:
        print(f"{args.file}: a good backup of {header['node']} at index {header['index']} (term {header['term']}), "
              f"digest {header['digest']}")
        return 0
    data = Path(args.data_dir)
    held = [p.name for p in (data.iterdir() if data.is_dir() else []) if p.name.startswith("raft.")]
    if held and not args.force:
        print(f"raftq restore: {data} already holds {', '.join(sorted(held))}: restoring would replace that node's "
              "state. Stop the node; add --force to replace it (every node of the cluster must be restored from "
              "the same backup)", file=sys.stderr)
        return 1
    data.mkdir(parents=True, exist_ok=True)
    for name in held:
        (data / name).unlink()
    write_restored_snapshot(data, machine, header["index"])
    print(f"restored index {header['index']} (digest {header['digest']}) into {data}: do the same for every node "
          "of the cluster with this same file, then start them all")
    return 0


def add_parsers(sub, client_cmd) -> None:
    b = client_cmd("backup", cmd_backup, "stream a consistent backup of the state from a node (a caught-up "
                   "follower by default) while the cluster serves", needs_client=False)
    b.add_argument("--out", required=True, metavar="FILE", help="where to write it (FILE.part until verified)")
    b.add_argument("--node", metavar="URL", help="take it from this node instead of a caught-up follower")
    b.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    b.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long to keep asking a node that is taking another backup (default 60)")
    r = sub.add_parser("restore", help="prepare a node's data dir for a new cluster from a backup",
                       description="Write a backup's state into DIR as the node's snapshot. Restore the same "
                                   "file into the data dir of EVERY node of the new cluster, then start them: "
                                   "never one node beside empty ones (they could elect each other and "
                                   "overwrite it).")
    r.add_argument("file", metavar="FILE")
    r.add_argument("--data-dir", metavar="DIR", help="the node's data_dir (from its config)")
    r.add_argument("--check", action="store_true", help="only verify the file (checksum, format) and print its header")
    r.add_argument("--force", action="store_true", help="replace the Raft files DIR holds")
    r.set_defaults(fn=lambda a: cmd_restore(a) if a.check or a.data_dir else _need_dir())


def _need_dir() -> int:
    print("raftq restore: --data-dir DIR is required (or --check to verify the file only)", file=sys.stderr)
    return 2
