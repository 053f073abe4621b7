"""The configuration in force (docs/semantics.md "Configuration is replicated state").

The machine holds the configuration as state: `m.limits` (a Limits, node/core/limits.py, whose
`doc` is its canonical document), `m.config_version` and `m.keys` (API key name -> KeyRecord:
digests, never keys). Every handler reads
`m.limits`, so each entry applies under the configuration in force at that entry, on every
node and on every replay.

Version 0 is the bootstrap configuration the machine was constructed with (the node's TOML):
entries of a journal written before configurations were replicated (release 0.1.0) apply
under it, as they did then. The first leader proposes version 1 from its TOML
(`configure` with expect_version 0); every later change is a `configure`, `add_key` or
`remove_key` command and bumps the version by one. They are checked here again, at apply, with
the same `Limits.from_doc` as before proposing: deterministic, and an error result instead of
an exception.

A change never rewrites existing state: a depth below a queue's current depth refuses new
enqueues only, a ceiling below a job's max_attempts leaves that job as it is, a queue that is no
longer declared keeps its jobs. The result's `warnings` say so.
"""
from __future__ import annotations

from typing import NamedTuple

from .limits import ConfigError, Limits
from . import audit, gating, ops, results
from . import keys as keyed

API_ROLES = ("viewer", "worker", "operator", "admin")
_HEX = frozenset("0123456789abcdef")


class KeyRecord(NamedTuple):
    """An API key in force (`m.keys`: name -> KeyRecord): the SHA-256 of the key (never the key),
    its role, who added it (a key name, None without auth) and when. Snapshots and the digest
    write it as the plain tuple (name, key_sha256, role, added_by, added_at_ms)."""
    key_sha256: str
    role: str
    added_by: str | None
    added_at_ms: int


def valid_digest(value) -> bool:
    return type(value) is str and len(value) == 64 and _HEX.issuperset(value)


def key_problem(name, role, key_sha256) -> str | None:
    """Why (name, role, key_sha256) is not a key record, or None."""
    if type(name) is not str or not 1 <= len(name) <= 128 or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        return "name must be 1..128 characters, no control characters"
    if role not in API_ROLES:
        return f"role must be one of {', '.join(API_ROLES)}"
    if not valid_digest(key_sha256):
        return "key_sha256 must be 64 lowercase hex digits (the SHA-256 of the key)"
    return None


def _admins(keys: dict) -> int:
    return sum(1 for rec in keys.values() if rec.role == "admin")


def configure(m, expect_version, config, keys, who=None):
    """A whole new configuration (and, when `keys` is not None, a whole new key set)."""
    if type(expect_version) is not int or expect_version != m.config_version:
        return ops.config_conflict(m.config_version, expect_version)
    try:
        limits = Limits.from_doc(config)
    except ConfigError as e:
        return ops.config_invalid(str(e))
    except Exception as e:                      # not a document at all: as deterministic
        return ops.config_invalid(f"config: {type(e).__name__}")
    new_keys = None
    if keys is not None:
        new_keys = {}
        try:
            for name, role, digest in keys:
                why = key_problem(name, role, digest)
                if why is None and name in new_keys:
                    why = "named twice"
                if why is None and any(rec.key_sha256 == digest for rec in new_keys.values()):
                    why = "the same key as another one"
                if why is not None:
                    return ops.config_invalid(f"keys[{name!r}]: {why}")
                old = m.keys.get(name)
                if old is not None and old.key_sha256 == digest and old.role == role:
                    new_keys[name] = old            # unchanged: who added it and when stay
                else:
                    new_keys[name] = KeyRecord(digest, role, who if who is not ops.UNAUDITED else None, m.clock)
        except (TypeError, ValueError):
            return ops.config_invalid("keys: must be a list of (name, role, key_sha256)")
        if expect_version != 0 and new_keys and not _admins(new_keys):
            return ops.key_refused("no_admin", None)      # nobody could change keys any more
    warnings = change_warnings(m, m.limits, limits)
    version = m.config_version + 1
    changed = [k for k, _, _ in _diff(m, limits)]
    m._set(m, "limits", limits)
    m._set(m, "retaining", limits.retaining)
    m._set(m, "config_version", version)
    if m.blocked:
        gating.release_all(m)                   # a raised or removed resource limit frees slots
    keyed.reconfigured(m)                       # and a raised or removed key limit frees keys
    if m.result_bytes:
        results.fit_bounds(m)                   # a lowered bound drops the oldest results over it
    details = {"version": version, "changed": changed}
    if new_keys is not None and new_keys != m.keys:
        details["keys"] = sorted(n for n in set(new_keys) | set(m.keys) if new_keys.get(n) != m.keys.get(n))
        m._set(m, "keys", new_keys)
    audit.record(m, who, "config_seed" if expect_version == 0 else "config_change", None, details)
    return ops.configured(version, warnings)


def _diff(m, limits: Limits):
    from .limits import diff_docs
    if m.config_version == 0:
        return []                               # the seed: nothing was in force before it
    return diff_docs(m.limits.doc, limits.doc)


def add_key(m, name, role, key_sha256, who=None):
    if m.config_version < 1:
        return ops.key_refused("not_seeded", name)
    why = key_problem(name, role, key_sha256)
    if why is not None:
        return ops.config_invalid(f"key: {why}")
    if name in m.keys:
        return ops.key_refused("exists", name)
    if any(rec.key_sha256 == key_sha256 for rec in m.keys.values()):
        return ops.key_refused("digest_in_use", name)
    if not m.keys and role != "admin":
        return ops.key_refused("first_not_admin", name)
    version = m.config_version + 1
    m._put(m.keys, name, KeyRecord(key_sha256, role, who if who is not ops.UNAUDITED else None, m.clock))
    m._set(m, "config_version", version)
    audit.record(m, who, "key_add", name, {"role": role, "version": version})
    return ops.key_added(name, role, version)


def remove_key(m, name, who=None):
    rec = m.keys.get(name) if type(name) is str else None
    if rec is None:
        return ops.key_not_found(name)
    if rec.role == "admin" and _admins(m.keys) == 1:
        return ops.key_refused("last_admin", name)
    version = m.config_version + 1
    m._pop(m.keys, name)
    m._set(m, "config_version", version)
    audit.record(m, who, "key_remove", name, {"role": rec.role, "version": version})
    return ops.key_removed(name, version)


def change_warnings(m, old: Limits, new: Limits) -> tuple:
    """What in the existing state the new configuration would not admit (left as it is)."""
    out = []
    for name in sorted(m.queues):
        q = m.queues[name]
        depth = q.depth()
        limit = new.queue(name).max_queue_depth
        if limit is not None and depth > limit:
            out.append({"code": "depth_above_limit", "field": "max_queue_depth", "queue": name,
                        "depth": depth, "limit": limit})
        if name in old.queues and name not in new.queues and depth + q.dead > 0:
            out.append({"code": "undeclared_queue_has_jobs", "field": f"queues[{name}]", "queue": name,
                        "jobs": depth + q.dead})
    lowered = {name: new.queue(name).max_attempts_ceiling for name in m.queues
               if new.queue(name).max_attempts_ceiling < old.queue(name).max_attempts_ceiling}
    if lowered:
        above: dict[str, int] = {}
        for job in m.jobs.values():
            ceiling = lowered.get(job.queue)
            if ceiling is not None and job.max_attempts > ceiling:
                above[job.queue] = above.get(job.queue, 0) + 1
        for name in sorted(above):
            out.append({"code": "max_attempts_above_ceiling", "field": "max_attempts_ceiling", "queue": name,
                        "jobs": above[name], "limit": lowered[name]})
    for r in sorted(m.in_use):
        limit = new.resource_limits.get(r)
        if limit is not None and m.in_use[r] > limit:
            out.append({"code": "resource_above_limit", "field": f"limits.resource_limits.{r}", "resource": r,
                        "in_flight": m.in_use[r], "limit": limit})
    if m.dlq and old.dead_letter_retention_ms > 0 and new.dead_letter_retention_ms <= 0:
        out.append({"code": "dead_letters_kept", "field": "storage.dead_letter_retention_ms",
                    "dead_letters": len(m.dlq)})
    return tuple(out)


def keys_view(m) -> list:
    """GET /v1/keys: names, roles, who added them and when, and the first 12 hex digits of the
    key's SHA-256 (enough to tell two keys apart, as `raftq config diff` does; never the key)."""
    return [{"name": name, "role": rec.role, "added_by": rec.added_by, "added_at_ms": rec.added_at_ms,
             "key_sha256_prefix": rec.key_sha256[:12]}
            for name, rec in sorted(m.keys.items())]
