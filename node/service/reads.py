"""NodeService's reads of the replicated state: queues, keys, jobs, dead letters, the
configuration and the audit trail, a page at a time (docs/api.md)."""
from __future__ import annotations

import base64
import binascii

import orjson

from ..base import validate
from ..core.errors import error
from ..core.jobs import DEAD_LETTER_CAUSES, IN_FLIGHT, READY, SCHEDULED, Queue
from .results import JobResults


def _page_limit(query) -> int | None:
    """A listing's `limit` (default 50), or None when it is not an integer 1..100."""
    try:
        limit = int(query.get("limit", "50"))
    except ValueError:
        return None
    return limit if 1 <= limit <= 100 else None


def _page_args(query, decode):
    """A listing's (limit, cursor decoded by `decode`, or None when none came), and None; or None
    and the 400 answer naming what is wrong. `decode` returns None or raises ValueError for a
    cursor this server did not make."""
    limit = _page_limit(query)
    if limit is None:
        return None, error("invalid_argument", "limit must be an integer 1..100")
    cursor = query.get("cursor")
    if not cursor:
        return (limit, None), None
    try:
        after = decode(cursor)
    except ValueError:
        after = None
    if after is None:
        return None, error("invalid_argument", "cursor is not one this server returned")
    return (limit, after), None


def _key_cursor_encode(after) -> str:
    """A keys page's cursor: [ready, key] as base64url JSON (a key may hold any character but
    the control ones, so the cursor is made safe to put in a query as it is)."""
    return base64.urlsafe_b64encode(orjson.dumps(after)).decode().rstrip("=")


def _key_cursor_decode(cursor: str):
    """The [ready, key] of a cursor _key_cursor_encode made, or None."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        after = orjson.loads(raw)
    except (ValueError, binascii.Error, orjson.JSONDecodeError):
        return None
    if not (isinstance(after, list) and len(after) == 2 and type(after[0]) is int and after[0] >= 0
            and isinstance(after[1], str)):
        return None
    return after


class Reads(JobResults):
    """Mixin of NodeService: reads (and a job's result, results.py)."""

    def _with_workers(self, stats: dict) -> dict:
        """The leader's soft state next to the replicated stats: `workers`, `no_workers` (null
        on a follower and in a new leader's first window: node/service/workers_seen.py)."""
        stats["workers"], stats["no_workers"] = self.workers_seen.stats(stats["name"])
        return stats

    def queues(self):
        with self.state.lock:
            m = self.state.machine
            out = [m.queue_stats(n) for n in m.queue_names()]
        self.workers_seen.prune()
        return 200, {"queues": [self._with_workers(q) for q in out if q is not None]}

    def queue(self, name):
        with self.state.lock:
            stats = self.state.machine.queue_stats(name)
            limits = self.limits
        if stats is None:
            if name in limits.queues or not limits.strict_queues:
                with self.state.lock:
                    stats = self.state.machine.gating_view(name, Queue(name).stats(name in limits.queues))
            else:
                return error("not_found", f"queue {name!r} is not declared", queue=name)
        self.workers_seen.prune()
        self._with_workers(stats)
        stats["limits"] = limits.queue(name).describe()
        return 200, stats

    def config(self):
        with self.state.lock:
            return 200, self.state.machine.config_view()

    def keys(self):
        with self.state.lock:
            return 200, {"keys": self.state.machine.keys_view(), "version": self.state.machine.config_version}

    def audit(self, query):
        page, bad = _page_args(query, int)
        if bad:
            return bad
        limit, before = page
        with self.state.lock:
            entries, nxt = self.state.machine.audit_page(limit, before)
        return 200, {"entries": entries, "next_cursor": str(nxt) if nxt is not None else None}

    def queue_jobs(self, name, query):
        state = query.get("state", "ready")
        states = {"ready": READY, "scheduled": SCHEDULED, "in_flight": IN_FLIGHT}
        if state not in states:
            return error("invalid_argument", "state must be ready, scheduled or in_flight")
        page, bad = _page_args(query, lambda c: tuple(int(x) for x in c.split(".")))
        if bad:
            return bad
        limit, after = page
        with self.state.lock:
            jobs, nxt = self.state.machine.list_jobs(name, states[state], limit, after)
        return 200, {"jobs": jobs, "next_cursor": ".".join(str(x) for x in nxt) if nxt else None}

    def queue_keys(self, name, query):
        """GET /v1/queues/{name}/keys: the queue's keys, most ready jobs first, a page at a time
        (node/core/keys.py `view`); the cursor is the last row's [ready, key], opaque."""
        page, bad = _page_args(query, _key_cursor_decode)
        if bad:
            return bad
        limit, after = page
        with self.state.lock:
            page = self.state.machine.key_page(name, limit, after)
        if page is None:
            return error("not_found", f"queue {name!r} neither exists nor is declared", queue=name)
        rows, nxt = page
        return 200, {"keys": rows, "next_cursor": _key_cursor_encode(nxt) if nxt else None}

    def job(self, job_id):
        jid = validate.canonical_uuid(job_id)
        if jid is None:
            return error("invalid_argument", f"job id must be a canonical UUID, got {job_id!r}")
        with self.state.lock:
            view = self.state.machine.job_view(jid)
        if view is None:
            return error("not_found", "no such job (acked, dropped, or never existed)", job_id=jid)
        return 200, view

    def dead_letters(self, query):
        queue = query.get("queue") or None
        limit = _page_limit(query)
        if limit is None:
            return error("invalid_argument", "limit must be an integer 1..100")
        cursor = query.get("cursor") or None
        if cursor is not None and validate.canonical_uuid(cursor) is None:
            return error("invalid_argument", "cursor is not one this server returned")
        cause = query.get("cause")      # present, it must name a cause (empty too: a typo, not "all")
        if cause is not None and cause not in DEAD_LETTER_CAUSES:
            return error("invalid_argument", f"cause must be one of {', '.join(DEAD_LETTER_CAUSES)}")
        with self.state.lock:
            records, nxt = self.state.machine.list_dead_letters(queue, limit, cursor, cause)
        return 200, {"records": records, "next_cursor": nxt}
