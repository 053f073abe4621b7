"""The audit trail (docs/semantics.md "Operator moves and the audit trail"): replicated state.

Every operator action records one entry `(seq, at_ms, who, action, target, details)`: a
sequence number (the listing's cursor), the replicated time, the caller's key name (None
without auth; the leader puts it into the command), what was done, to what (a queue, a job
id, a key name or None) and a small dict of builtins. Entries are kept oldest first, at most
`storage.audit_max_entries` (the oldest go first) and for `storage.audit_retention_ms` (the
sweep drops older ones, node/core/sweep.py).

Recording an action is one line in its handler:

    audit.record(m, who, "member_add", target, {"raft": addr})

A command of release 0.1.0 has no `who` field: its handler sees `ops.UNAUDITED` and
`record` leaves the trail alone (those moves happened before there was one).
"""
from __future__ import annotations

from .ops import UNAUDITED

# How many job ids an entry lists (its counts are exact; a move of 1,000 jobs names 10).
IDS_SHOWN = 10
# An entry's first two places. Entries stay plain tuples: snapshots pickle the trail as it is
# and the digest hashes it with orjson, which writes a tuple but refuses a named tuple.
AUDIT_SEQ, AUDIT_AT = 0, 1


def record(m, who, action: str, target, details: dict) -> None:
    if who is UNAUDITED:
        return
    if who is not None and type(who) is not str:
        raise TypeError("who must be a key name or None")      # the command is reverted: malformed
    seq = m.audit_seq + 1
    m._set(m, "audit_seq", seq)
    m._append(m.audit, (seq, m.clock, who, action, target, details))
    trail, cap = m.audit, m.limits.audit_max_entries
    while len(trail) > cap:
        m._popleft(trail)


def ids_shown(ids) -> list:
    return list(ids[:IDS_SHOWN])


def render_entry(entry) -> dict:
    _, at_ms, who, action, target, details = entry
    return {"at_ms": at_ms, "who": who, "action": action, "target": target, "details": details}


def page(m, limit: int, before: int | None):
    """Up to `limit` entries newest first, older than sequence `before` (the previous page's
    cursor); and the next cursor (None at the end)."""
    out = []
    for entry in reversed(m.audit):
        if before is not None and entry[AUDIT_SEQ] >= before:
            continue
        if len(out) == limit:
            return [render_entry(e) for e in out], out[-1][AUDIT_SEQ]
        out.append(entry)
    return [render_entry(e) for e in out], None


def drop_past_retention(m, now: int, budget: int) -> int:
    """Sweep step: entries older than audit_retention_ms, oldest first."""
    trail, n = m.audit, 0
    horizon = now - m.limits.audit_retention_ms
    while trail and trail[0][AUDIT_AT] <= horizon and n < budget:
        m._popleft(trail)
        n += 1
    return n
