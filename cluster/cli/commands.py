"""The client-side `raftq` subcommands: status, enqueue, queues, job, cancel, dlq, pause/resume.

Each command is an `async def cmd_*(ctx)` that talks to the cluster through the official
`Client` (plain HTTP transport: one short call per command, leader discovery, redirects and
retries included) and prints a human table, or the API's JSON with `--json`. `run()` turns every
expected failure into one `raftq: ...` line on stderr that says what to do, and an exit code:

    0  success
    1  the cluster answered and refused (rejected enqueue, unknown job, missing dead letters...)
    2  usage error, or no node could be reached at all
    3  nodes answered but no leader served the request in time (election, lost majority)
    130 interrupted
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as _dt
import json
import os
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from ..client import (BatchRejected, Client, Conflict, Internal, InvalidArgument, LeaseLost, NotFound,
                     PermissionDenied, RaftqError, Rejected, RequestTooLarge, TlsError, Unauthenticated, Unavailable,
                     Unreachable, _tls_error, _tls_refusal, describe_refused, error_from, job_request, tls_context,
                     tls_problem)
from ..local import digest_at, digest_cell
from ..progress import Progress, progress_enabled

DEFAULT_URLS = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003"
DEFAULT_TLS_URLS = DEFAULT_URLS.replace("http://", "https://")
EXIT_OK, EXIT_FAILED, EXIT_UNREACHABLE, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
MAX_ADMIN_IDS = 1000          # ids per requeue/delete request (node/base/validate.py)
PAGE = 100                    # largest page of the listing endpoints


class CliError(Exception):
    """An expected failure: printed as `raftq: <message>`, no traceback."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------- context
def parse_urls(text: str) -> list[str]:
    urls = []
    for part in (text or "").split(","):
        part = part.strip().rstrip("/")
        if not part:
            continue
        if "://" not in part:
            part = "http://" + part
        if not part.startswith(("http://", "https://")):
            raise CliError(f"--urls: {part!r} is not an http:// or https:// URL", EXIT_UNREACHABLE)
        if part not in urls:
            urls.append(part)
    if not urls:
        raise CliError("--urls is empty: give comma-separated node URLs, e.g. " + DEFAULT_URLS, EXIT_UNREACHABLE)
    return urls


@dataclass
class NodeAnswer:
    url: str
    status: int | None = None     # HTTP status, None when nothing answered
    view: dict | None = None      # the 200 body
    error: str | None = None      # why there is no view
    tls: str | None = None        # a TLS problem with this node (then `error` says the same)


class Ctx:
    def __init__(self, args):
        self.args = args
        self.tls_options = tls_options(args)
        self.urls = parse_urls(getattr(args, "urls", None) or os.environ.get("RAFTQ_URLS")
                               or (DEFAULT_TLS_URLS if self.tls_options else DEFAULT_URLS))
        self.json = bool(getattr(args, "json", False))
        self.timeout = float(getattr(args, "timeout", None) or 10.0)
        if self.timeout <= 0:
            raise CliError("--timeout must be a positive number of seconds", EXIT_UNREACHABLE)
        self.probe_timeout = min(self.timeout, 3.0)
        self.api_key = getattr(args, "api_key", None) or os.environ.get("RAFTQ_API_KEY") or None
        self.progress = progress_enabled(True if getattr(args, "progress", False) else None)
        self.ssl = tls_context(**self.tls_options)
        self.client: Client | None = None
        self.doing = args.command          # what we were doing, for error messages
        self.mutating = False              # an error now leaves the outcome unknown

    # ------------------------------------------------------------------ output
    def out(self, text: str = "") -> None:
        print(text)

    def err(self, text: str) -> None:
        print(text, file=sys.stderr)

    def dump(self, obj) -> None:
        sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")

    # ------------------------------------------------------------------ cluster access
    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def probe(self, urls: list[str], digest: bool = False) -> list[NodeAnswer]:
        """GET /v1/cluster from every URL at once, each answered by that node itself; with the
        state digest only when asked (it costs the node O(state): seconds at a million jobs)."""
        timeout = self.probe_timeout
        path = "/v1/cluster" if digest else "/v1/cluster?digest=false"

        async def one(session: aiohttp.ClientSession, url: str) -> NodeAnswer:
            try:
                async with session.get(url + path, headers=self._headers(), allow_redirects=False,
                                       timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                    raw = await r.read()
                    try:
                        body = orjson.loads(raw) if raw else {}
                    except orjson.JSONDecodeError:
                        return NodeAnswer(url, r.status, None, f"HTTP {r.status}, not JSON: is this a raftq node?")
                    if r.status == 200 and isinstance(body, dict) and "role" in body:
                        return NodeAnswer(url, 200, body)
                    refusal = _tls_refusal(r.status, body, r.headers)
                    if refusal is not None:
                        return NodeAnswer(url, r.status, None, f"TLS: {refusal}", tls=refusal)
                    err = body.get("error", {}) if isinstance(body, dict) else {}
                    return NodeAnswer(url, r.status, None,
                                      f"HTTP {r.status} {err.get('code', '')}: {err.get('message', '')}".strip())
            except asyncio.TimeoutError:
                return NodeAnswer(url, None, None, f"no answer within {timeout:g}s")
            except aiohttp.ClientConnectorError as e:
                tls = tls_problem(e, url)
                if tls is not None:
                    return NodeAnswer(url, None, None, f"TLS: {tls}", tls=tls)
                return NodeAnswer(url, None, None, connect_reason(e))
            except (aiohttp.ClientError, OSError, ValueError) as e:
                return NodeAnswer(url, None, None, f"{type(e).__name__}: {e}")

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl)) as session:
            return list(await asyncio.gather(*(one(session, u) for u in urls)))

    async def connect(self) -> Client:
        """A Client for leader-routed calls, after checking that some node answers at all."""
        answers = await self.probe(self.urls)
        if not any(a.view for a in answers) and any(a.tls for a in answers):
            raise _tls_error([(a.url, a.tls) for a in answers if a.tls])
        answered = [a for a in answers if a.status is not None]
        if not answered:
            raise CliError(unreachable_message(self.urls, answers), EXIT_UNREACHABLE)
        for a in answered:
            if a.status in (401, 403):
                raise error_from(a.status, {"error": {"code": "unauthenticated" if a.status == 401
                                                      else "permission_denied", "message": a.error or ""}})
        self.client = Client(self.urls, api_key=self.api_key, transport="http", timeout=self.timeout,
                             connect_timeout=self.probe_timeout, **self.tls_options)
        leaders = Counter(a.view["leader"]["url"].rstrip("/") for a in answered if a.view and a.view.get("leader"))
        if leaders:
            self.client.leader = leaders.most_common(1)[0][0]
        return self.client

    async def call(self, op: str, method: str, path: str, body=None, *, mutating: bool = False):
        """One raw API call through the client (wire JSON in and out)."""
        self.mutating = mutating
        out = await self.client.call(op, method, path, body, mutating=mutating)
        self.mutating = False
        return out


def tls_options(args) -> dict:
    """Client(ca=, cert=) from --ca/--cert/--key or $RAFTQ_CA/$RAFTQ_CERT/$RAFTQ_KEY; {} when none."""
    ca = getattr(args, "ca", None) or os.environ.get("RAFTQ_CA") or None
    cert = getattr(args, "cert", None) or os.environ.get("RAFTQ_CERT") or None
    key = getattr(args, "key", None) or os.environ.get("RAFTQ_KEY") or None
    if key and not cert:
        raise CliError("--key (or $RAFTQ_KEY) needs --cert (or $RAFTQ_CERT): the client certificate it belongs to",
                       EXIT_UNREACHABLE)
    for what, path in (("--ca", ca), ("--cert", cert), ("--key", key)):
        if path and not os.path.isfile(path):
            raise CliError(f"{what} {path}: no such file", EXIT_UNREACHABLE)
    out: dict[str, Any] = {}
    if ca:
        out["ca"] = ca
    if cert:
        out["cert"] = (cert, key)
    return out


def connect_reason(e: aiohttp.ClientConnectorError) -> str:
    os_error = getattr(e, "os_error", None)
    if isinstance(os_error, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    if isinstance(os_error, socket.gaierror):
        return f"unknown host ({os_error.strerror})"
    if os_error is not None and os_error.strerror:
        return f"cannot connect ({os_error.strerror})"
    return f"cannot connect ({e})"


START_HINT = "start a local cluster with `raftq up`, or check --urls / RAFTQ_URLS"


def unreachable_message(urls: list[str], answers: list[NodeAnswer] | None = None) -> str:
    """One line: which nodes did not answer, why, and what to do."""
    reasons: dict[str, list[str]] = {}
    for a in answers or []:
        if a.error:
            reasons.setdefault(a.error, []).append(a.url)
    if len(reasons) == 1:
        why = f" ({next(iter(reasons))})"
    elif reasons:
        why = " (" + "; ".join(f"{', '.join(us)}: {r}" for r, us in reasons.items()) + ")"
    else:
        why = ""
    return f"cannot reach any node at {', '.join(urls)}{why}; is the cluster running? {START_HINT}"


# ---------------------------------------------------------------------------- formatting
def format_table(headers: list[str], rows: list[list], right: set[int] | None = None) -> str:
    """Aligned columns; `right` lists the column indexes to right-align (numbers)."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = right or set()
    lines = []
    for r in cells:
        parts = [r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i]) for i in range(len(headers))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def format_pairs(pairs: list[tuple[str, Any]], indent: str = "") -> str:
    """`key  value` lines; a multi-line value (pretty JSON) continues under its first line."""
    width = max((len(k) for k, _ in pairs), default=0)
    under = "\n" + indent + " " * (width + 2)
    return "\n".join(f"{indent}{k.ljust(width)}  {'-' if v is None else str(v).replace(chr(10), under)}"
                     for k, v in pairs)


def fmt_ms(ms: int | None, now_ms: int | None = None) -> str | None:
    """An instant as UTC ISO text with a relative hint: `2025-06-01T10:00:00.123Z (12s ago)`."""
    if ms is None:
        return None
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    t = _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc)
    text = t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return f"{text} ({fmt_rel(ms - now_ms)})"


def fmt_rel(delta_ms: int) -> str:
    s = abs(delta_ms) / 1000
    if s < 1:
        return "now"
    if s < 60:
        span = f"{s:.0f}s"
    elif s < 3600:
        span = f"{s / 60:.0f}m"
    elif s < 86400:
        span = f"{s / 3600:.1f}h"
    else:
        span = f"{s / 86400:.1f}d"
    return f"in {span}" if delta_ms > 0 else f"{span} ago"


def fmt_ms_duration(ms: int | None) -> str | None:
    if ms is None:
        return None
    if ms % 86_400_000 == 0 and ms >= 86_400_000:
        return f"{ms} ({ms // 86_400_000}d)"
    if ms % 3_600_000 == 0 and ms >= 3_600_000:
        return f"{ms} ({ms // 3_600_000}h)"
    if ms % 60_000 == 0 and ms >= 60_000:
        return f"{ms} ({ms // 60_000}m)"
    if ms % 1000 == 0 and ms >= 1000:
        return f"{ms} ({ms // 1000}s)"
    return str(ms)


def short(text: str | None, n: int = 60) -> str | None:
    if text is None:
        return None
    text = text.replace("\n", " ")
    return text if len(text) <= n else text[:n - 1] + "…"


REJECTION_HINTS = {
    "unknown_queue": "the cluster runs with strict_queues: declare the queue in the nodes' config ([[queues]]) "
                     "or use a declared one (`raftq queues`)",
    "queue_name_too_long": "use a shorter queue name",
    "job_type_name_too_long": "use a shorter job type",
    "job_type_not_allowed": "this queue accepts only the job types listed in `allowed`",
    "idempotency_key_too_long": "use a shorter --idempotency-key",
    "payload_too_large": "send a smaller payload (the queue's max_payload_bytes is `limit`)",
    "encoding_not_allowed": "pass --encoding with one of the allowed encodings",
    "custom_entries_too_many": "send fewer --custom entries",
    "dependency_not_found": "the job named by --depends-on is unknown: it never existed, or it was acked in a "
                            "queue that keeps no results, or its retention ended",
    "too_many_dependencies": "give fewer --depends-on (limits.max_dependencies_per_job is `limit`)",
    "custom_key_too_long": "use shorter --custom keys",
    "custom_map_too_large": "send smaller --custom values",
    "scheduled_too_far": "schedule within the queue's horizon (`horizon_ms` from now)",
    "queue_full": "the queue holds its max_queue_depth jobs: wait for workers to drain it, or raise the limit",
}


def format_rejection(rej: dict) -> str:
    reason = rej.get("reason", "?")
    fields = ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                       for k, v in rej.items() if k not in ("reason", "message"))
    text = reason + (f" ({fields})" if fields else "")
    if rej.get("message"):
        text += f": {rej['message']}"
    return text


def explain(e: RaftqError, ctx: Ctx | None) -> tuple[str, int]:
    """The one-line (or few-line) message and exit code for an error answered by the cluster."""
    doing = ctx.doing if ctx else "request"
    if isinstance(e, Rejected):
        rej = e.rejection or {"reason": e.message}
        hint = REJECTION_HINTS.get(rej.get("reason", ""))
        return f"enqueue rejected: {format_rejection(rej)}" + (f"\n  {hint}" if hint else ""), EXIT_FAILED
    if isinstance(e, BatchRejected):
        lines = [f"  job {x.get('index')}: {format_rejection(x.get('rejection', {}))}" for x in e.errors[:10]]
        return "batch rejected, nothing was enqueued:\n" + "\n".join(lines), EXIT_FAILED
    if isinstance(e, TlsError):
        return f"{doing}: TLS: {e.message}", EXIT_UNREACHABLE
    if isinstance(e, Unreachable):
        outcome = ("the outcome of the request is unknown" if e.maybe_sent else "nothing was sent")
        return (f"{doing}: no node accepts connections ({describe_refused(e.refused)}); {outcome}; "
                f"{START_HINT}"), EXIT_UNREACHABLE
    if isinstance(e, Unavailable):
        timeout = ctx.timeout if ctx else None
        detail = e.message.replace("no answer within the call's deadline; ", "")
        msg = (f"{doing}: the cluster did not serve the request"
               + (f" within {timeout:g}s" if timeout else "") + f" ({detail})\n"
               "  no leader answered: an election may be in progress, or a majority of nodes is down or cut off; "
               "check `raftq status`, then retry (or wait longer with --timeout)")
        if ctx is not None and ctx.mutating:
            msg += "\n  the outcome is unknown: the change may or may not have been applied"
            if doing == "enqueue":
                msg += " (give --idempotency-key to make a retry safe)"
        return msg, EXIT_UNAVAILABLE
    if isinstance(e, LeaseLost):
        return (f"lease lost ({e.code}): {e.message}; the job is no longer in flight under this attempt "
                "(acked, expired, dead-lettered or re-reserved)"), EXIT_FAILED
    if isinstance(e, NotFound):
        return f"not found: {e.message}", EXIT_FAILED
    if isinstance(e, Conflict):
        extra = f" (queues: {', '.join(e.details['queues'])})" if e.details.get("queues") else ""
        return f"{doing} refused ({e.code}): {e.message}{extra}", EXIT_FAILED
    if isinstance(e, InvalidArgument):
        return f"invalid argument: {e.message}", EXIT_FAILED
    if isinstance(e, RequestTooLarge):
        return f"request too large: {e.message}; send less at once", EXIT_FAILED
    if isinstance(e, Unauthenticated):
        return (f"unauthenticated: {e.message}; pass --api-key or set RAFTQ_API_KEY"), EXIT_FAILED
    if isinstance(e, PermissionDenied):
        return (f"permission denied: {e.message}; {doing} needs a key with a higher role "
                "(viewer < worker < operator < admin)"), EXIT_FAILED
    if isinstance(e, Internal):
        return f"the node hit an internal error (a bug): {e.message}; see the node's log", EXIT_FAILED
    return f"{doing} failed ({e.code}): {e.message}", EXIT_FAILED


# ---------------------------------------------------------------------------- running
def run(args, fn, *, needs_client: bool = True) -> int:
    """Run one async command and map every expected failure to a message and an exit code."""
    ctx = None
    try:
        ctx = Ctx(args)
        return asyncio.run(_run(ctx, fn, needs_client)) or EXIT_OK
    except CliError as e:
        _stderr(f"raftq: {e}")
        return e.code
    except RaftqError as e:
        msg, code = explain(e, ctx)
        _stderr(f"raftq: {msg}")
        return code
    except KeyboardInterrupt:
        _stderr("raftq: interrupted" + ("; the outcome of the last request is unknown"
                                        if ctx is not None and ctx.mutating else ""))
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout was closed early (`raftq ... | head`): not an error worth a traceback.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_OK


def _stderr(text: str) -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    print(text, file=sys.stderr)


async def _run(ctx: Ctx, fn, needs_client: bool):
    try:
        if needs_client:
            await ctx.connect()
        return await fn(ctx)
    finally:
        if ctx.client is not None:
            await ctx.client.close()


# ---------------------------------------------------------------------------- status
def _no_leader(ctx, msg: str) -> int:
    """`status` without a leader: the message on stdout (on stderr with --json), exit 1."""
    if ctx.json:
        ctx.err(f"raftq: {msg}")
    else:
        ctx.out(msg)
    return EXIT_FAILED


def _refused(a) -> bool:
    return a.status in (401, 403) and not a.tls


def _state(a) -> str:
    return "tls error" if a.tls else "refused" if _refused(a) else "down"


async def cmd_status(ctx: Ctx) -> int:
    answers, ids = await _status_answers(ctx)
    up = [a for a in answers if a.view]
    if not up and any(a.tls for a in answers):
        raise _tls_error([(a.url, a.tls) for a in answers if a.tls])
    _show_status(ctx, answers, ids)
    if not up and answers and all(_refused(a) for a in answers):
        raise CliError("the nodes answer but refuse the request: "
                       + ("give an API key with --api-key KEY or $RAFTQ_API_KEY (a viewer key is enough for status)"
                          if ctx.api_key is None else "the API key is unknown to them or its role is too low"),
                       EXIT_FAILED)
    if not up:
        raise CliError(unreachable_message(ctx.urls, answers), EXIT_UNREACHABLE)
    _warn_if_diverged(ctx, up)
    return _status_leader(ctx, up, answers)


async def _status_answers(ctx: Ctx) -> tuple[list, dict]:
    """Every node's answer (those --urls names and the members they list), one per node, sorted
    by node id; and url -> node id of every node known."""
    # status shows the digests (and warns when they differ at one index): a slower probe.
    timeout_was, ctx.probe_timeout = ctx.probe_timeout, max(ctx.probe_timeout, ctx.timeout)
    try:
        answers = await ctx.probe(ctx.urls, digest=True)
    finally:
        ctx.probe_timeout = timeout_was
    asked = {a.url for a in answers}
    more = [m["url"].rstrip("/") for a in answers if a.view for m in a.view.get("members", [])
            if m.get("url") and m["url"].rstrip("/") not in asked]
    more = list(dict.fromkeys(more))
    if more:
        answers += await ctx.probe(more, digest=True)
    ids = {}
    for a in answers:
        for m in (a.view or {}).get("members", []):
            if m.get("url"):
                ids.setdefault(m["url"].rstrip("/"), m.get("id"))
    for a in answers:
        if a.view:
            ids[a.url] = a.view.get("node_id")
    seen_ids: set = set()
    unique = []
    for a in answers:       # one row per node, even when --urls named it another way (localhost)
        node_id = a.view.get("node_id") if a.view else None
        if node_id is not None and node_id in seen_ids:
            continue
        seen_ids.add(node_id)
        unique.append(a)
    answers = sorted(unique, key=lambda a: (str(ids.get(a.url) or "~"), a.url))
    return answers, ids


def _show_status(ctx: Ctx, answers: list, ids: dict) -> None:
    """The answers as JSON, or as a table with a line for each node down and TOML that differs."""
    if ctx.json:
        out = []
        for a in answers:
            if a.view:
                out.append({"url": a.url, **a.view})
            else:
                out.append({"url": a.url, "node_id": ids.get(a.url), "role": _state(a),
                            "error": a.error})
        ctx.dump(out)
    else:
        rows = []
        for a in answers:
            v = a.view
            if v is None:
                rows.append([ids.get(a.url) or "?", a.url, _state(a),
                             None, None, None, None, None, None, None])
                continue
            peers = [m for m in v.get("members", []) if m.get("id") != v.get("node_id")]
            connected = sum(1 for m in peers if m.get("connected"))
            leader = v.get("leader")
            config = v.get("config_version")
            rows.append([v.get("node_id"), a.url, v.get("role"), v.get("term"), v.get("commit_index"),
                         v.get("last_applied"), digest_cell(v),
                         f"{connected}/{len(peers)}", leader["id"] if leader else "none",
                         None if config is None else f"{config}{'*' if v.get('toml_differs') else ''}"])
        ctx.out(format_table(["NODE", "URL", "ROLE", "TERM", "COMMIT", "APPLIED", "DIGEST", "PEERS", "LEADER", "CONFIG"],
                             rows, right={3, 4, 5}))
        for a in answers:
            if a.view is None:
                ctx.out(f"  {ids.get(a.url) or a.url} "
                        f"{'refused the key' if _refused(a) else 'cannot be reached over TLS' if a.tls else 'is down'}: "
                        f"{a.error}")
        differ = [a.view.get("node_id") for a in answers if a.view and a.view.get("toml_differs")]
        if differ:
            ctx.out(f"  * {', '.join(differ)}: the node's TOML differs from the configuration in force; it follows "
                    "the configuration in force (`raftq config diff FILE` shows how, `raftq config apply FILE` "
                    "makes a file the configuration)")


def _warn_if_diverged(ctx: Ctx, up: list) -> None:
    # Digests must agree at equal applied indexes.
    by_index: dict[int, dict[str, list[str]]] = {}
    for a in up:
        index, digest = digest_at(a.view)
        by_index.setdefault(index, {}).setdefault(digest, []).append(a.view.get("node_id"))
    for index, digests in sorted(by_index.items()):
        if len(digests) > 1:
            parts = "; ".join(f"{', '.join(nodes)}: {(d or '')[:12]}" for d, nodes in digests.items())
            ctx.err(f"raftq: WARNING: nodes disagree on the state at applied index {index} ({parts}); "
                    "the replicas have diverged, which is a bug: keep the data directories and the logs")


def _status_leader(ctx: Ctx, up: list, answers: list) -> int:
    """The leader the answering nodes name, or the exit for none (a leader that does not answer
    is none)."""
    seen = Counter(a.view["leader"]["id"] for a in up if a.view.get("leader"))
    if not seen:
        return _no_leader(ctx, f"no leader: none of the {len(up)} answering node(s) knows a leader "
                               f"({len(answers) - len(up)} of {len(answers)} down); an election may be in "
                               "progress, or a majority of nodes is down or cut off")
    leader_id, votes = seen.most_common(1)[0]
    leader_url = next(a.view["leader"]["url"] for a in up if a.view.get("leader", {}) and
                      a.view["leader"]["id"] == leader_id)
    term = next((a.view.get("term") for a in up if a.view.get("node_id") == leader_id), None)
    if len(seen) > 1:
        ctx.err("raftq: warning: nodes see different leaders ("
                + ", ".join(f"{n}: {c} node(s)" for n, c in seen.most_common()) + "); a leader change is under way")
    if not any(a.view.get("node_id") == leader_id for a in up):
        # The followers have not noticed yet (they wait an election timeout), but a leader that
        # does not answer cannot serve anything: report no leader.
        return _no_leader(ctx, f"no leader: the nodes still name {leader_id} ({leader_url}), but it does not "
                               "answer; an election should follow within seconds if a majority is up")
    if not ctx.json:
        ctx.out(f"leader: {leader_id} at {leader_url}" + (f", term {term}" if term is not None else "")
                + f"; {len(up)}/{len(answers)} nodes up")
    return EXIT_OK


# ---------------------------------------------------------------------------- enqueue
def parse_custom(items: list[str] | None) -> dict | None:
    if not items:
        return None
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise CliError(f"--custom {item!r}: write key=value", EXIT_UNREACHABLE)
        out[key] = custom_value(raw)
    return out


def custom_value(raw: str):
    """`42` -> int, `1.5` -> float, `true`/`false` -> bool, `"42"` (JSON-quoted) -> the string, else the text."""
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    if raw in ("true", "false"):
        return raw == "true"
    try:
        return int(raw)
    except ValueError:
        pass
    if any(c.isdigit() for c in raw) and raw.lower() not in ("nan", "inf", "-inf", "infinity"):
        try:
            return float(raw)
        except ValueError:
            pass
    return raw


def build_payload(args) -> tuple[bytes | None, str | None]:
    given = [x for x in (args.data is not None, args.data_file is not None, args.data_b64 is not None) if x]
    if len(given) > 1:
        raise CliError("give only one of --data, --data-file and --data-b64", EXIT_UNREACHABLE)
    encoding = args.encoding
    if args.data is not None:
        data = args.data.encode()
        if encoding is None:
            encoding = "text/plain"
            try:
                if isinstance(json.loads(args.data), (dict, list)):
                    encoding = "application/json"
            except ValueError:
                pass
    elif args.data_file is not None:
        try:
            if args.data_file == "-":
                data = sys.stdin.buffer.read()
            else:
                with open(args.data_file, "rb") as f:
                    data = f.read()
        except OSError as e:
            raise CliError(f"--data-file: cannot read {args.data_file}: {e.strerror or e}", EXIT_UNREACHABLE)
    elif args.data_b64 is not None:
        try:
            data = base64.b64decode(args.data_b64, validate=True)
        except (binascii.Error, ValueError):
            raise CliError("--data-b64 is not valid base64", EXIT_UNREACHABLE)
    else:
        if encoding is not None:
            raise CliError("--encoding needs a payload (--data, --data-file or --data-b64)", EXIT_UNREACHABLE)
        return None, None
    if not data:
        raise CliError("the payload is empty: a payload must have at least one byte; "
                       "leave out --data/--data-file/--data-b64 for a job without data", EXIT_UNREACHABLE)
    return data, encoding or "application/octet-stream"


def parse_depends_on(values) -> list | None:
    """--depends-on ID[:POLICY] (repeatable) as depends_on entries."""
    if not values:
        return None
    out = []
    for v in values:
        job_id, _, policy = v.partition(":")
        out.append({"job_id": job_id, "policy": policy or "success"})
    return out


def enqueue_request_from(args) -> dict:
    data, encoding = build_payload(args)
    fields: dict[str, Any] = {"priority": args.priority, "idempotency_key": args.idempotency_key,
                              "max_attempts": args.max_attempts, "custom": parse_custom(args.custom),
                              "delay_ms": args.delay_ms, "scheduled_at_ms": args.scheduled_at_ms,
                              "deadline_at_ms": args.deadline_at_ms, "key": getattr(args, "key_name", None),
                              "depends_on": parse_depends_on(getattr(args, "depends_on", None))}
    if data is not None:
        fields["encoding"] = encoding
    return job_request(args.queue, args.job_type, data, **fields)


async def cmd_enqueue(ctx: Ctx) -> int:
    args = ctx.args
    if args.count < 1:
        raise CliError("--count must be at least 1", EXIT_UNREACHABLE)
    if args.count > 1 and args.idempotency_key is not None:
        raise CliError("--idempotency-key with --count would make one job (the key deduplicates the rest); "
                       "leave one of them out", EXIT_UNREACHABLE)
    req = enqueue_request_from(args)
    if args.count == 1:
        out = await ctx.call("enqueue", "POST", "/v1/jobs", ctx.client._with_key(req), mutating=True)
        if ctx.json:
            ctx.dump(out)
        else:
            ctx.out(out["job_id"])
            if out.get("deduplicated"):
                ctx.err("raftq: note: deduplicated: a job with this idempotency key already exists; "
                        "that job's id is shown and nothing new was enqueued")
        return EXIT_OK

    info = await ctx.call("server_info", "GET", "/v1/server-info")
    one = len(orjson.dumps(req)) + 120            # plus the generated idempotency key and framing
    by_bytes = max(1, (int(info.get("max_request_bytes", 1 << 20)) // 2) // one)
    size = max(1, min(args.batch_size, int(info.get("max_enqueue_batch", 100)), by_bytes))
    results: list[dict] = []
    rejected: list[tuple[int, dict]] = []
    t0 = time.monotonic()
    bar = Progress(args.count, f"enqueue {args.queue}", unit="jobs", enabled=ctx.progress)
    try:
        done = 0
        while done < args.count:
            n = min(size, args.count - done)
            out = await ctx.call("enqueue_batch", "POST", "/v1/jobs/batch",
                                 {"jobs": [ctx.client._with_key(req) for _ in range(n)]}, mutating=True)
            for i, r in enumerate(out["results"]):
                results.append(r)
                if "job_id" in r:
                    if not ctx.json:
                        ctx.out(r["job_id"])
                else:
                    rejected.append((done + i, r.get("rejection", {})))
            done += n
            bar.update(n)
            if rejected:
                break
    finally:
        bar.close()
    accepted = sum(1 for r in results if "job_id" in r)
    if ctx.json:
        ctx.dump({"results": results, "enqueued": accepted, "rejected": len(rejected),
                  "requested": args.count})
    elapsed = time.monotonic() - t0
    if rejected:
        reasons = Counter(format_rejection(r) for _, r in rejected)
        first = rejected[0][1]
        hint = REJECTION_HINTS.get(first.get("reason", ""))
        ctx.err(f"raftq: enqueued {accepted} of {args.count} jobs; {len(rejected)} rejected, stopped: "
                + "; ".join(f"{reason} x{c}" for reason, c in reasons.most_common()) + (f"\n  {hint}" if hint else ""))
        return EXIT_FAILED
    ctx.err(f"raftq: enqueued {accepted} jobs to {args.queue} in {elapsed:.2f}s "
            f"({accepted / max(elapsed, 1e-9):,.0f}/s, batches of {size})")
    return EXIT_OK


# ---------------------------------------------------------------------------- queues, jobs
QUEUE_COLUMNS = [("QUEUE", "name"), ("PAUSED", "paused"), ("READY", "ready"), ("SCHEDULED", "scheduled"),
                 ("IN_FLIGHT", "in_flight"), ("DEAD", "dead_lettered"), ("ENQUEUED", "enqueued"),
                 ("ACKED", "acked"), ("NACKED", "nacked"), ("DEAD_TOTAL", "dead_lettered_total"),
                 ("EXPIRED", "expired_total"), ("WORKERS", "workers"), ("NOTES", "notes")]


# The CLI asks the leader; it answers null only in its first window as leader (it counts the
# workers it sees itself: node/service/workers_seen.py).
WORKERS_NOT_KNOWN = "not known yet (the leader counts the workers it sees for 30 s after it takes over)"


def queue_notes(q: dict) -> list[str]:
    """Why a queue's jobs may be waiting, as short notes: paused, no workers, the circuit, the
    window, throttled jobs. A field the cluster does not send (an older node) is left out; so is
    one it does not know yet (workers: null on a follower or a new leader)."""
    notes = []
    if q.get("paused"):
        notes.append("paused")
    if q.get("no_workers") is True and (q.get("ready") or 0) > 0:     # an idle queue is not in trouble
        notes.append("no workers")
    circuit = q.get("circuit")
    if isinstance(circuit, dict) and circuit.get("state") not in (None, "closed"):
        notes.append("circuit " + str(circuit["state"]).replace("_", " "))
    if q.get("window_open") is False:
        notes.append("window closed")
    if q.get("throttled"):
        notes.append(f"{q['throttled']} throttled")
    if q.get("ready_held_by_keys"):
        notes.append(f"{q['ready_held_by_keys']} held by keys")
    return notes


def _queue_cell(q: dict, key: str):
    if key == "paused":
        return "yes" if q.get(key) else "no"
    if key == "notes":
        return ", ".join(queue_notes(q)) or "-"
    v = q.get(key)
    return "-" if v is None else v


async def cmd_close_circuit(ctx: Ctx, name: str) -> int:
    """`raftq queues close-circuit NAME`: POST /v1/queues/{name}/circuit/close."""
    out = await ctx.call("circuit_close", "POST", f"/v1/queues/{_path(name)}/circuit/close", {}, mutating=True)
    if ctx.json:
        ctx.dump(out)
    else:
        ctx.out(f"circuit of queue {name} closed (was {out.get('was')})")
    return EXIT_OK


def fmt_rate(rate) -> str | None:
    """A rate {count, period_ms} as `5 per 1s` (None: no rate)."""
    if not isinstance(rate, dict):
        return None
    ms = rate.get("period_ms")
    period = fmt_ms_duration(ms) if isinstance(ms, int) else str(ms)
    if isinstance(ms, int) and "(" in period:
        period = period[period.index("(") + 1:-1]       # `1000 (1s)` -> `1s`
    elif isinstance(ms, int):
        period = f"{ms}ms"
    return f"{rate.get('count')} per {period}"


KEY_COLUMNS = ["KEY", "READY", "IN_FLIGHT", "HELD", "CONCURRENCY", "RATE", "IN_WINDOW", "WEIGHT"]


async def cmd_queue_keys(ctx: Ctx, name: str) -> int:
    """`raftq queues keys NAME [--limit N] [--all]`: GET /v1/queues/{name}/keys, most ready first."""
    a = ctx.args
    limit = 50 if a.limit is None else a.limit
    if limit < 1:
        raise CliError("--limit must be at least 1", EXIT_UNREACHABLE)
    rows, more = await collect_pages_more(ctx, "queue_keys", f"/v1/queues/{_path(name)}/keys", "keys",
                                          None if a.all else limit)
    if ctx.json:
        ctx.dump(rows)
        return EXIT_OK
    q = await ctx.call("queue", "GET", f"/v1/queues/{_path(name)}")
    summary = (f"queue {name}: {q.get('keys', 0)} key(s), {q.get('keys_at_limit', 0)} at a limit, "
               f"{q.get('ready_held_by_keys', 0)} ready job(s) held by their key's limit")
    if not rows:
        ctx.out(f"no keys in queue {name} (none of its jobs has a key now)")
        ctx.out(summary)
        return EXIT_OK
    ctx.out(format_table(KEY_COLUMNS, [[r.get("key"), r.get("ready"), r.get("in_flight"), r.get("held") or "-",
                                        r.get("concurrency"), fmt_rate(r.get("rate")), r.get("in_window"),
                                        r.get("weight")] for r in rows], right={1, 2, 4, 6, 7}))
    ctx.out(summary + (f"; {len(rows)} shown, more remain (raise --limit, or --all)" if more else ""))
    return EXIT_OK


async def cmd_queues(ctx: Ctx) -> int:
    name = ctx.args.name
    extra = getattr(ctx.args, "circuit_queue", None)
    if (getattr(ctx.args, "limit", None) is not None or getattr(ctx.args, "all", False)) and \
            not (name == "keys" and extra is not None):
        raise CliError("--limit and --all go with `raftq queues keys NAME`", EXIT_UNREACHABLE)
    if extra is not None:
        if name == "keys":
            return await cmd_queue_keys(ctx, extra)
        if name != "close-circuit":
            ctx.err(f"raftq: queues takes one NAME (or `close-circuit NAME`, `keys NAME`), got {name!r} and {extra!r}")
            return EXIT_FAILED
        return await cmd_close_circuit(ctx, extra)
    if name is None:
        queues = (await ctx.call("queues", "GET", "/v1/queues"))["queues"]
        if ctx.json:
            ctx.dump(queues)
            return EXIT_OK
        if not queues:
            ctx.out("no queues yet (a queue appears with its first job, or when declared in the config)")
            return EXIT_OK
        rows = [[_queue_cell(q, k) for _, k in QUEUE_COLUMNS] for q in queues]
        ctx.out(format_table([h for h, _ in QUEUE_COLUMNS], rows, right=set(range(2, len(QUEUE_COLUMNS) - 1))))
        totals = {k: sum(q.get(k) or 0 for q in queues) for _, k in QUEUE_COLUMNS[2:-1]}
        ctx.out(f"{len(queues)} queue(s); ready {totals['ready']}, scheduled {totals['scheduled']}, "
                f"in flight {totals['in_flight']}, dead {totals['dead_lettered']}; "
                f"enqueued {totals['enqueued']}, acked {totals['acked']}")
        return EXIT_OK
    q = await ctx.call("queue", "GET", f"/v1/queues/{_path(name)}")
    if ctx.json:
        ctx.dump(q)
        return EXIT_OK
    ctx.out(format_pairs(queue_detail_pairs(q)))
    limits = q.get("limits") or {}
    if limits:
        ctx.out("limits:")
        pairs = []
        for k in sorted(limits):
            v = limits[k]
            if k == "windows" and isinstance(v, list):
                v = "; ".join(f"{','.join(w.get('days') or ['every day'])} {w.get('start')}-{w.get('end')} "
                              f"{w.get('time_zone') or 'UTC'}" for w in v if isinstance(w, dict)) or "(none)"
            elif isinstance(v, list):
                v = ", ".join(map(str, v)) or "(none)"
            elif k.endswith("_ms") and isinstance(v, int):
                v = fmt_ms_duration(v)
            elif v is None:         # unset: no limit (a list: any value; a number: no maximum)
                v = ("any" if k.startswith("allowed_") else "always open" if k == "windows"
                     else "none" if k in ("dead_letter_forward", "resource", "circuit_breaker", "execution_timeout_ms",
                                          "key_field")
                     else "unlimited")
            elif k in ("key_rate", "rate"):
                v = fmt_rate(v)
            elif k == "key_weights" and isinstance(v, dict):
                v = ", ".join(f"{key} {w}" for key, w in v.items()) or "(none: every key weighs 1)"
            elif k == "key_limits" and isinstance(v, dict):
                v = "; ".join(f"{key}: " + ", ".join(x for x in (
                    f"concurrency {o.get('concurrency')}" if o.get("concurrency") is not None else None,
                    f"rate {fmt_rate(o.get('rate'))}" if o.get("rate") else None) if x)
                    for key, o in v.items() if isinstance(o, dict)) or "(none)"
            elif isinstance(v, dict):   # circuit_breaker
                v = ", ".join(f"{a} {fmt_ms_duration(b) if a.endswith('_ms') else b}" for a, b in v.items())
            pairs.append((k, v))
        ctx.out(format_pairs(pairs, indent="  "))
    return EXIT_OK


def queue_detail_pairs(q: dict) -> list[tuple[str, object]]:
    """`raftq queues NAME`: the queue's counts, and what may hold its jobs back."""
    state = "paused (reserve skips it; enqueues are still accepted)" if q.get("paused") else "active"
    pairs = [
        ("queue", q.get("name")), ("declared", "yes" if q.get("declared") else "no (default limits)"),
        ("state", state), ("ready", q.get("ready")), ("scheduled", q.get("scheduled")),
        ("in flight", q.get("in_flight")), ("dead letters", q.get("dead_lettered")),
        ("enqueued (total)", q.get("enqueued")), ("acked (total)", q.get("acked")),
        ("nacked (total)", q.get("nacked")), ("dead-lettered (total)", q.get("dead_lettered_total"))]
    if "expired_total" in q:
        pairs.append(("expired (total)", q["expired_total"]))
    by_cause = q.get("dead_lettered_by_cause")
    if by_cause:
        pairs.append(("dead letters by cause", ", ".join(f"{c} {n}" for c, n in by_cause.items() if n) or "none"))
    if "workers" in q:
        w = q["workers"]
        pairs.append(("workers (last 30 s)", WORKERS_NOT_KNOWN if w is None
                      else f"{w}" + (" - NO WORKERS: ready jobs wait and nothing reserves from this queue"
                                     if w == 0 and (q.get("ready") or 0) > 0 else "")))
    if "circuit" in q:
        c = q["circuit"]
        if c is None:
            pairs.append(("circuit", "no breaker"))
        else:
            text = f"{str(c.get('state')).replace('_', ' ')}, {c.get('failures', 0)} failure(s)"
            if c.get("open_until_ms"):
                text += f", open until {fmt_ms_time(c['open_until_ms'])}"
            text += f", opened {c.get('opened_total', 0)} time(s)"
            pairs.append(("circuit", text))
    if "window_open" in q:
        pairs.append(("execution window", "open" if q["window_open"] else "closed (reserve skips the queue)"))
    if "throttled" in q:
        pairs.append(("throttled now", q["throttled"]))
    if "throttle_deferred_total" in q:
        pairs.append(("throttle deferrals (total)", q["throttle_deferred_total"]))
    if "keys" in q:
        pairs.append(("keys", f"{q['keys']} (`raftq queues keys {q.get('name')}` lists them)" if q["keys"]
                      else 0))
        pairs.append(("keys at a limit", q.get("keys_at_limit", 0)))
        pairs.append(("ready held by keys", q.get("ready_held_by_keys", 0)))
    return pairs


def fmt_ms_time(ms) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(ms) / 1000)) + " UTC"
    except (TypeError, ValueError, OverflowError):
        return str(ms)


async def collect_pages(ctx: "Ctx", op: str, path: str, key: str, limit: int | None = None) -> list:
    """Every item of a paged listing (`key` of each page, `next_cursor` to go on), or the first
    `limit` of them."""
    return (await collect_pages_more(ctx, op, path, key, limit))[0]


async def collect_pages_more(ctx: "Ctx", op: str, path: str, key: str,
                             limit: int | None = None) -> tuple[list, bool]:
    """collect_pages, and whether more items remain after the first `limit`."""
    items, cursor = [], None
    while limit is None or len(items) < limit:
        size = PAGE if limit is None else min(PAGE, limit - len(items))
        out = await ctx.call(op, "GET", f"{path}?limit={size}" + (f"&cursor={_path(cursor)}" if cursor else ""))
        items += out[key]
        cursor = out.get("next_cursor")
        if not cursor:
            return items, False
    return items, True


def _path(name: str) -> str:
    from urllib.parse import quote
    return quote(name, safe="")


JSON_LINES = 40     # a longer pretty-printed payload is cut: `raftq job ID --payload` has it all


def payload_preview(payload: dict | None, n: int = 200) -> tuple[int, str] | None:
    if not payload:
        return None
    try:
        data = base64.b64decode(payload.get("data_b64", ""))
    except (binascii.Error, ValueError):
        return 0, "(undecodable base64)"
    try:
        text = data.decode("utf-8")
        printable = all(c.isprintable() or c in "\n\t\r" for c in text)
    except UnicodeDecodeError:
        printable = False
    if printable and "json" in str(payload.get("encoding", "")).lower():
        # A person reads this: JSON indented, not one escaped string.
        try:
            lines = json.dumps(json.loads(text), indent=2, ensure_ascii=False).splitlines()
        except ValueError:
            pass                    # not JSON after all: shown as text below
        else:
            if len(lines) > JSON_LINES:
                lines = lines[:JSON_LINES] + [f"… ({len(lines) - JSON_LINES} more lines: --payload shows it all)"]
            return len(data), "\n".join(lines)
    if printable:
        return len(data), json.dumps(text if len(text) <= n else text[:n] + "…", ensure_ascii=False)
    return len(data), f"(binary) {data[:n // 4].hex()}" + ("…" if len(data) > n // 4 else "")


async def cmd_job(ctx: Ctx) -> int:
    job = await ctx.call("job", "GET", f"/v1/jobs/{_path(ctx.args.id)}")
    if ctx.args.payload:
        p = job.get("payload")
        if not p:
            raise CliError(f"job {job['id']} has no payload")
        sys.stdout.buffer.write(base64.b64decode(p["data_b64"]))
        sys.stdout.flush()
        return EXIT_OK
    if ctx.json:
        ctx.dump(job)
        return EXIT_OK
    now = int(time.time() * 1000)
    pairs = [("id", job.get("id")), ("queue", job.get("queue")), ("job type", job.get("job_type")),
             ("state", job.get("state")), ("priority", job.get("priority")),
             ("attempt", f"{job.get('attempt')} of {job.get('max_attempts')}"),
             ("enqueued at", fmt_ms(job.get("enqueued_at_ms"), now))]
    if job.get("key") is not None:
        pairs.insert(3, ("key", job["key"]))
    if job.get("scheduled_at_ms") is not None:
        pairs.append(("scheduled at", fmt_ms(job["scheduled_at_ms"], now)))
    if job.get("run_at_ms") is not None and job["run_at_ms"] != job.get("scheduled_at_ms"):
        pairs.append(("runs at", fmt_ms(job["run_at_ms"], now)))
    if job.get("lease_expires_at_ms") is not None:
        pairs.append(("lease expires", fmt_ms(job["lease_expires_at_ms"], now)))
    if job.get("deadline_at_ms") is not None:
        pairs.append(("deadline", fmt_ms(job["deadline_at_ms"], now)))
    if job.get("last_reason") is not None:
        pairs.append(("last reason", job["last_reason"].replace("\n", "\\n")))
    if job.get("custom"):
        pairs.append(("custom", ", ".join(f"{k}={json.dumps(v)}" for k, v in job["custom"].items())))
    if job.get("trace_context"):
        pairs.append(("traceparent", job["trace_context"].get("traceparent")))
    preview = payload_preview(job.get("payload"))
    if preview is None:
        pairs.append(("payload", "none"))
    else:
        size, text = preview
        pairs.append(("payload", f"{size} bytes, {job['payload'].get('encoding')}"))
        pairs.append(("data", text))
    if job.get("depends_on"):
        pairs.append(("depends on", ", ".join(f"{d['job_id']} ({d['policy']})" for d in job["depends_on"])))
    if job.get("waiting_on"):
        pairs.append(("waiting on", ", ".join(job["waiting_on"])))
    if job.get("state") == "succeeded":
        pairs += result_pairs(job, now)
    if job.get("live_dependents"):
        pairs.append(("kept for", f"{job['live_dependents']} live dependent job(s)"))
    ctx.out(format_pairs(pairs))
    return EXIT_OK


def result_pairs(job: dict, now: int) -> list:
    """A succeeded (retained) job's lines: when it finished, its retention, its result."""
    pairs = [("finished at", fmt_ms(job.get("finished_at_ms"), now)),
             ("retained until", fmt_ms(job.get("retained_until_ms"), now))]
    preview = payload_preview(job.get("result"))
    if preview is None:
        pairs.append(("result", "dropped (the queue's max_retained_result_bytes)" if job.get("result_dropped")
                      else "none"))
    else:
        size, text = preview
        pairs.append(("result", f"{size} bytes, {job['result'].get('encoding')}"))
        pairs.append(("result data", text))
    return pairs


async def cmd_batch(ctx: Ctx) -> int:
    b = await ctx.call("batch", "GET", f"/v1/batches/{_path(ctx.args.id)}")
    if ctx.json:
        ctx.dump(b)
        return EXIT_OK
    now = int(time.time() * 1000)
    pairs = [("id", b["id"]), ("state", b["state"]), ("created at", fmt_ms(b["created_at_ms"], now)),
             ("members", f"{b['members']}: {b['pending']} pending, {b['succeeded']} succeeded, {b['failed']} failed, "
                         f"{b['removed']} removed")]
    if b.get("finished_at_ms") is not None:
        pairs.append(("finished at", fmt_ms(b["finished_at_ms"], now)))
    for kind, cb in b["callbacks"].items():
        pairs.append((kind, f"enqueued: {cb['job_id']}" if cb["fired"] else "not yet"))
    if b["pending_ids"]:
        pairs.append(("pending", ", ".join(b["pending_ids"][:10]) + (" ..." if b["pending"] > 10 else "")))
    ctx.out(format_pairs(pairs))
    return EXIT_OK


async def cmd_result(ctx: Ctx) -> int:
    """`raftq result ID [--wait S]`: the job's outcome once it finished (exit 0 succeeded, 1 dead-lettered,
    and 1 with a message when it has not finished within --wait)."""
    a = ctx.args
    try:
        res = await ctx.client.result(_path(a.id), timeout=a.wait)
    except TimeoutError:
        raise CliError(f"job {a.id} has not finished within {a.wait} s", EXIT_FAILED) from None
    if a.raw:
        if res.result is None:
            raise CliError(f"job {res.job_id} has no result ({res.state})", EXIT_FAILED)
        sys.stdout.buffer.write(res.result)
        sys.stdout.flush()
    elif ctx.json:
        ctx.dump(res.wire)
    else:
        pairs = [("id", res.job_id), ("queue", res.job.queue), ("job type", res.job.job_type), ("state", res.state)]
        if res.succeeded:
            pairs += result_pairs(res.wire, int(time.time() * 1000))
        elif res.wire["job"].get("last_reason") is not None:
            pairs.append(("last reason", res.wire["job"]["last_reason"].replace("\n", "\\n")))
        ctx.out(format_pairs(pairs))
    return EXIT_OK if res.succeeded else EXIT_FAILED


def read_ids(ids: list[str]) -> list[str]:
    """Job ids from the arguments; `-` reads whitespace-separated ids from stdin."""
    out: list[str] = []
    for i in ids:
        if i == "-":
            out.extend(sys.stdin.read().split())
        else:
            out.append(i)
    out = list(dict.fromkeys(x.strip().lower() for x in out if x.strip()))
    if not out:
        raise CliError("no job ids given", EXIT_UNREACHABLE)
    return out


async def cmd_cancel(ctx: Ctx) -> int:
    ids = read_ids(ctx.args.ids)
    results, failed = [], 0
    for jid in ids:
        try:
            out = await ctx.call("cancel", "DELETE", f"/v1/jobs/{_path(jid)}" +
                                 ("?cascade=true" if ctx.args.cascade else ""), None, mutating=True)
            also = out.get("cancelled", []) if isinstance(out, dict) else []
            results.append({"job_id": jid, "cancelled": True, **({"dependents": also} if ctx.args.cascade else {})})
            if not ctx.json:
                ctx.out(f"cancelled {jid}" + (f" and {len(also)} job(s) waiting on it: {', '.join(also)}" if also else ""))
        except (NotFound, Conflict, InvalidArgument) as e:
            failed += 1
            results.append({"job_id": jid, "cancelled": False, "error": {"code": e.code, "message": e.message}})
            if not ctx.json:
                why = e.message
                ctx.err(f"raftq: cannot cancel {jid}: {why}")
    if ctx.json:
        ctx.dump(results)
    return EXIT_FAILED if failed else EXIT_OK


# ---------------------------------------------------------------------------- pause / resume
async def cmd_pause(ctx: Ctx) -> int:
    paused = ctx.args.command == "pause"
    out = await ctx.call(ctx.args.command, "POST", f"/v1/queues/{_path(ctx.args.queue)}/{ctx.args.command}",
                         {"create": True} if getattr(ctx.args, "create", False) else {}, mutating=True)
    if ctx.json:
        ctx.dump(out)
    elif paused:
        ctx.out(f"queue {ctx.args.queue} paused: reserve skips it; enqueues are still accepted "
                f"(undo with `raftq resume {ctx.args.queue}`)")
    else:
        ctx.out(f"queue {ctx.args.queue} resumed: workers get its jobs again")
    return EXIT_OK


# ---------------------------------------------------------------------------- dead letters
async def list_dead_letters(ctx: Ctx, queue: str | None, limit: int | None) -> tuple[list[dict], bool]:
    """Up to `limit` records (all with None), oldest first, and whether more remain."""
    records: list[dict] = []
    cursor = None
    while limit is None or len(records) < limit:
        page = PAGE if limit is None else min(PAGE, limit - len(records))
        q = f"?limit={page}" + (f"&queue={_path(queue)}" if queue else "") + (f"&cursor={cursor}" if cursor else "")
        out = await ctx.call("dead_letters", "GET", f"/v1/dead-letters{q}")
        records.extend(out["records"])
        cursor = out.get("next_cursor")
        if not cursor or not out["records"]:
            return records, False
    return records, True


async def _retention_hint(ctx: Ctx) -> str | None:
    info = await ctx.call("server_info", "GET", "/v1/server-info")
    if not info.get("dead_letter_retention_enabled", True):
        return ("note: the dead-letter store is off (storage.dead_letter_retention_ms = 0), "
                "so failed jobs are dropped instead of kept here")
    return None


async def cmd_dlq_list(ctx: Ctx) -> int:
    a = ctx.args
    if a.limit is not None and a.limit < 1:
        raise CliError("--limit must be at least 1", EXIT_UNREACHABLE)
    records, more = await list_dead_letters(ctx, a.queue, None if a.all else a.limit)
    if ctx.json:
        ctx.dump(records)
        return EXIT_OK
    if not records:
        ctx.out("no dead letters" + (f" in queue {a.queue}" if a.queue else ""))
        hint = await _retention_hint(ctx)
        if hint:
            ctx.out(hint)
        return EXIT_OK
    now = int(time.time() * 1000)
    rows = [[r["job"]["id"], r["job"]["queue"], r["job"]["job_type"], r["cause"], r["final_attempt"],
             fmt_rel(r["failed_at_ms"] - now), short(r.get("last_reason"), 40)] for r in records]
    ctx.out(format_table(["JOB", "QUEUE", "TYPE", "CAUSE", "ATTEMPT", "FAILED", "LAST REASON"], rows, right={4}))
    ctx.out(f"{len(records)} dead letter(s)" + (" shown; more remain (raise --limit, or --all)" if more else ""))
    return EXIT_OK


async def _dead_count(ctx: Ctx, queue: str | None) -> int:
    if queue:
        return int((await ctx.call("queue", "GET", f"/v1/queues/{_path(queue)}")).get("dead_lettered") or 0)
    return sum(int(q.get("dead_lettered") or 0) for q in (await ctx.call("queues", "GET", "/v1/queues"))["queues"])


def confirm(question: str, what: str) -> bool:
    if not sys.stdin.isatty():
        raise CliError(f"{what} needs confirmation, but stdin is not a terminal so I cannot ask: "
                       "pass --yes to confirm", EXIT_UNREACHABLE)
    sys.stderr.write(f"raftq: {question} [y/N] ")
    sys.stderr.flush()
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        return False
    return answer.strip().lower() in ("y", "yes")


async def cmd_dlq_drain(ctx: Ctx) -> int:
    a = ctx.args
    if a.max is not None and a.max < 1:
        raise CliError("--max must be at least 1", EXIT_UNREACHABLE)
    where = f"queue {a.queue}" if a.queue else "every queue"
    present = await _dead_count(ctx, a.queue)
    if present == 0:
        ctx.err(f"raftq: no dead letters in {f'queue {a.queue}' if a.queue else 'any queue'}; nothing drained")
        return EXIT_OK
    want = present if a.max is None else min(a.max, present)
    dest = a.out or "stdout"
    if not a.yes and not confirm(f"drain {want} dead letter(s) from {where}? They are deleted from the "
                                 f"cluster and written to {dest} as JSON lines.",
                                 f"dlq drain deletes dead letters ({want} in {where}); it"):
        ctx.err("raftq: not confirmed; nothing drained")
        return EXIT_FAILED
    try:
        sink = open(a.out, "ab") if a.out else sys.stdout.buffer
    except OSError as e:
        raise CliError(f"--out: cannot open {a.out}: {e.strerror or e}", EXIT_UNREACHABLE)
    limit = a.max  # None: until the store is empty
    drained = 0
    bar = Progress(want, "drain", unit="records", enabled=ctx.progress)
    try:
        while limit is None or drained < limit:
            n = 1000 if limit is None else min(1000, limit - drained)
            body: dict[str, Any] = {"max": n}
            if a.queue:
                body["queue"] = a.queue
            out = await ctx.call("drain", "POST", "/v1/dead-letters/drain", body, mutating=True)
            records = out["records"]
            if not records:
                break
            sink.write(b"".join(orjson.dumps(r) + b"\n" for r in records))
            sink.flush()
            drained += len(records)
            bar.update(len(records))
    finally:
        bar.close()
        if a.out:
            sink.close()
    ctx.err(f"raftq: drained {drained} dead letter(s) from {where}" + (f" into {a.out}" if a.out else ""))
    return EXIT_OK


async def _admin_ids(ctx: Ctx, op: str, path: str, ids: list[str], key: str) -> tuple[list[str], list[str]]:
    done, missing = [], []
    for i in range(0, len(ids), MAX_ADMIN_IDS):
        out = await ctx.call(op, "POST", path, {"ids": ids[i:i + MAX_ADMIN_IDS]}, mutating=True)
        done.extend(out.get(key, []))
        missing.extend(out.get("missing", []))
    return done, missing


async def cmd_dlq_requeue(ctx: Ctx) -> int:
    a = ctx.args
    if a.all:
        if a.ids:
            raise CliError("give job ids or --all, not both", EXIT_UNREACHABLE)
        records, _ = await list_dead_letters(ctx, a.queue, None)
        ids = [r["job"]["id"] for r in records]
        if not ids:
            ctx.err("raftq: no dead letters" + (f" in queue {a.queue}" if a.queue else "") + "; nothing requeued")
            if ctx.json:
                ctx.dump({"requeued": [], "missing": []})
            return EXIT_OK
    else:
        if a.queue:
            raise CliError("--queue goes with --all (ids name their jobs already)", EXIT_UNREACHABLE)
        ids = read_ids(a.ids)
    done, missing = await _admin_ids(ctx, "requeue", "/v1/dead-letters/requeue", ids, "requeued")
    return _report_ids(ctx, "requeued", done, missing, "ready now, attempt 1, same id")


async def cmd_dlq_delete(ctx: Ctx) -> int:
    ids = read_ids(ctx.args.ids)
    done, missing = await _admin_ids(ctx, "dldel", "/v1/dead-letters/delete", ids, "deleted")
    return _report_ids(ctx, "deleted", done, missing, None)


def _report_ids(ctx: Ctx, verb: str, done: list[str], missing: list[str], note: str | None) -> int:
    if ctx.json:
        ctx.dump({verb: done, "missing": missing})
    else:
        for jid in done:
            ctx.out(f"{verb} {jid}")
        for jid in missing:
            ctx.out(f"missing {jid} (not in the dead-letter store)")
        ctx.out(f"{len(done)} {verb}" + (f" ({note})" if note and done else "")
                + (f", {len(missing)} missing" if missing else ""))
    if missing:
        ctx.err(f"raftq: {len(missing)} id(s) were not dead letters (already requeued, deleted, drained, "
                "expired, or never dead-lettered); see `raftq dlq list`")
        return EXIT_FAILED
    return EXIT_OK
