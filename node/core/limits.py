"""Queue limits: the `[limits]`, `[storage]` and `[[queues]]` keys (docs/configuration.md; their
names and defaults are sepp's, docs/glossary.md "sepp"), defaults and checks.

A `Limits` object is immutable once built and identical on every node of a cluster (nodes
compare `fingerprint()`), because validation and apply both depend on it. Anything wrong in it
raises `ConfigError` naming the key: a queue server that silently ignores a typo in a limit is
worse than one that refuses to start.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields

from .jobs import CLUSTER_CAUSES, DEAD_LETTER_CAUSES, DEAD_LETTER_RECORD_TYPE
from .keys import MAX_RATE_COUNT

MIB = 1024 * 1024

# Keys a [[queues]] entry may override (docs/configuration.md "[[queues]]"), with the global
# defaults (docs/configuration.md "[limits]").
QUEUE_KEYS: dict[str, object] = {
    "max_lease_duration_ms": 300_000,
    "default_max_attempts": 3,
    "max_attempts_ceiling": 100,
    "default_priority": 0,
    "retry_delay_ms": 0,
    "retry_backoff": "none",
    "retry_delay_max_ms": 3_600_000,
    "max_queue_depth": None,          # None = unlimited
    "max_payload_bytes": MIB,
    "max_custom_entries": 64,
    "max_custom_total_bytes": 16_384,
    "max_custom_key_bytes": 256,
    "max_schedule_horizon_ms": 2_592_000_000,
    "allowed_encodings": None,        # None = any; [] = no payload at all
    # the job's lifecycle (docs/semantics.md "Execution timeout", "Duplicate policy")
    "execution_timeout_ms": None,     # None = no execution timeout (a job's timeout_ms wins)
    "duplicate_policy": "return_existing",   # what an idempotency-key hit does: return_existing | reject | replace
}
DUPLICATE_POLICIES = ("return_existing", "reject", "replace")
# Keys that only exist globally.
GLOBAL_KEYS: dict[str, object] = {
    "max_reserve_batch": 256,
    "max_reserve_queues": 32,
    "max_wait_timeout_ms": 300_000,
    "max_enqueue_batch": 256,
    "max_queue_name_bytes": 512,
    "max_job_type_bytes": 256,
    "max_idempotency_key_bytes": 256,
    "strict_queues": False,
    "max_request_bytes": 16 * MIB,
    "request_id_window_ms": 60_000,
    "max_trace_context_bytes": 1024,
    "max_encoding_bytes": 128,
    "max_reason_bytes": 4096,
    "max_worker_id_bytes": 256,
    "resource_limits": {},            # resource name -> most jobs in flight at once; absent = unlimited
    # schedules (docs/semantics.md "Schedules")
    "max_schedules": 10_000,          # schedules in the cluster; a create beyond is 429
    "max_schedules_per_sweep": 1_000,  # schedules whose due ticks one sweep fires; the rest in the next
    "max_catchup_ticks": 100,         # missed ticks one schedule fires at once under catchup "all"
    # keys (docs/semantics.md "Keys")
    "max_key_bytes": 256,             # a job's key, in UTF-8 bytes
    # job results (docs/semantics.md "Job results")
    "max_result_bytes": MIB,          # an ack's result, in bytes (like a payload)
    # dependencies (docs/semantics.md "Dependencies")
    "max_dependencies_per_job": 1000,  # a job's depends_on entries
    # batches (docs/semantics.md "Batches")
    "max_batches": 100_000,           # batches kept at once, open or finished
    "max_batch_members": 10_000,      # members of one batch
}
# [limits] keys the canonical document names only when they differ from their default: keys added
# after a data directory could have been written, so that a configuration document (and the state
# digest, which covers it) of before them is the one this code makes from the same TOML.
DOC_WHEN_SET = ("max_result_bytes", "max_dependencies_per_job", "max_batches", "max_batch_members")
STORAGE_KEYS: dict[str, object] = {
    "dead_letter_retention_ms": 0,    # 0 = no dead-letter store
    "dedup_window_ms": 86_400_000,
    "sweep_interval_ms": 1000,
    "sweep_limit": 10_000,
    "audit_retention_ms": 2_592_000_000,   # 30 days
    "audit_max_entries": 10_000,
    "min_free_bytes": 128 * MIB,      # the data disk's free-space reserve (0 = no reserve)
}
# [storage] keys about this node's own disk, not the replicated rules: they may differ between
# the nodes of a cluster (their disks may), so they are left out of the fingerprint.
NODE_LOCAL_STORAGE_KEYS = ("min_free_bytes",)
QUEUE_ONLY_KEYS = ("name", "allowed_job_types", "dedup_window_ms", "dead_letter_forward",
                   "dead_letter_forward_causes", "resource", "circuit_breaker", "windows",
                   "key_field", "key_concurrency", "key_rate", "key_weights", "key_limits", "rate",
                   "result_retention_ms", "max_retained_result_bytes")
# Job results (docs/semantics.md "Job results"): how long a queue keeps a finished job and its
# result (0: none), and the most bytes of results it keeps at once (the oldest results beyond it
# are dropped, never an ack refused).
DEFAULT_MAX_RETAINED_RESULT_BYTES = 64 * MIB
# Bounds of the gating keys (docs/configuration.md).
MAX_BREAKER_FAILURES = 10_000
MAX_RESOURCE_BYTES = 256
# Bounds of the key settings (docs/configuration.md): a rate's count (MAX_RATE_COUNT: the window
# log keeps that many times per key), a key's weight, the keys key_weights and key_limits name.
MAX_KEY_WEIGHT = 1000
MAX_KEY_OVERRIDES = 10_000


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key and why."""


def _int(where: str, value, minimum: int | None = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{where}: must be <= {maximum}, got {value}")
    return value


def _str_list(where: str, value, allow_empty: bool = True) -> tuple[str, ...]:
    # a tuple is a list already checked at [limits] and merged into a [[queues]] entry
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: must be a list of non-empty strings, got {value!r}")
    if not value and not allow_empty:
        raise ConfigError(f"{where}: must not be empty")
    return tuple(value)


def _plain(v):
    """A value as the canonical document holds it (a checked list is a tuple inside Limits)."""
    return list(v) if isinstance(v, tuple) else v


def diff_docs(old: dict | None, new: dict | None) -> list[tuple[str, object, object]]:
    """What differs between two canonical configuration documents: (dotted key, old value, new
    value) sorted by key; a queue that is only in one of them is one entry `queues[name]` with
    its declaration (or None) on each side."""
    old, new = old or {}, new or {}
    out = []
    for section in ("limits", "storage"):
        a, b = old.get(section) or {}, new.get(section) or {}
        for key in sorted(set(a) | set(b)):
            if a.get(key, _MISSING) != b.get(key, _MISSING):
                out.append((f"{section}.{key}", a.get(key), b.get(key)))
    qa = {q.get("name"): q for q in old.get("queues") or () if isinstance(q, dict)}
    qb = {q.get("name"): q for q in new.get("queues") or () if isinstance(q, dict)}
    for name in sorted(set(qa) | set(qb), key=str):
        if name not in qa or name not in qb:
            out.append((f"queues[{name}]", qa.get(name), qb.get(name)))
            continue
        a, b = qa[name], qb[name]
        for key in sorted((set(a) | set(b)) - {"name"}):
            if a.get(key, _MISSING) != b.get(key, _MISSING):
                out.append((f"queues[{name}].{key}", a.get(key, _MISSING), b.get(key, _MISSING)))
    return [(k, None if a is _MISSING else a, None if b is _MISSING else b) for k, a, b in out]


_MISSING = type("Missing", (), {"__repr__": lambda self: "(not set)"})()


def check_queue_name(name, max_bytes: int) -> str | None:
    """Why `name` is not a usable queue name, or None when it is (docs/api.md "Shapes", EnqueueRequest)."""
    if not isinstance(name, str) or not name:
        return "queue name must be a non-empty string"
    if name in (".", "..") or "/" in name:
        return "queue name must not be '.' or '..' or contain '/'"
    if name.isascii() and name.isprintable():   # fast path: printable ASCII has no control character
        return None
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):   # Unicode Cc: C0, DEL, C1
        return "queue name must not contain control characters"
    return None


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """The effective limits of one queue: its overrides merged over `[limits]`."""
    name: str | None                    # None for the shared view of undeclared queues
    declared: bool
    max_lease_duration_ms: int
    default_max_attempts: int
    max_attempts_ceiling: int
    default_priority: int
    retry_delay_ms: int
    retry_backoff: str
    retry_delay_max_ms: int
    max_queue_depth: int | None
    max_payload_bytes: int
    max_custom_entries: int
    max_custom_total_bytes: int
    max_custom_key_bytes: int
    max_schedule_horizon_ms: int
    allowed_encodings: tuple[str, ...] | None
    execution_timeout_ms: int | None
    duplicate_policy: str
    allowed_job_types: tuple[str, ...] | None
    dedup_window_ms: int
    # Dead-letter forwarding (node/core/handlers.py `forward`): the queue that gets one record
    # job per dead letter of these causes; None: no forwarding (and no causes).
    dead_letter_forward: str | None = None
    dead_letter_forward_causes: tuple[str, ...] = ()
    # Gating (docs/api.md "Gating: throttles, circuit breakers, execution windows"): the default resource of the queue's jobs, the circuit breaker
    # (failures, window_ms, open_ms) and the execution windows (node/core/windows.py), or None.
    resource: str | None = None
    circuit_breaker: tuple | None = None
    windows: object = None
    # Keys (node/core/keys.py): the custom field a job's key is taken from, the in-flight limit
    # and rate (count, period_ms) per key, per-key weights and overrides {key: (concurrency,
    # rate)} (None = the queue's), and the queue-wide rate. Empty dicts when none.
    key_field: str | None = None
    key_concurrency: int | None = None
    key_rate: tuple | None = None
    key_weights: dict = field(default_factory=dict)
    key_limits: dict = field(default_factory=dict)
    rate: tuple | None = None
    # Job results (node/core/results.py): retention (0 = none) and the bound on retained bytes.
    result_retention_ms: int = 0
    max_retained_result_bytes: int = DEFAULT_MAX_RETAINED_RESULT_BYTES

    def describe(self) -> dict:
        """The effective limits and retry policy as shown by GET /v1/queues/{name}."""
        out = {k: getattr(self, k) for k in QUEUE_KEYS}
        out["allowed_encodings"] = list(self.allowed_encodings) if self.allowed_encodings is not None else None
        out["allowed_job_types"] = list(self.allowed_job_types) if self.allowed_job_types is not None else None
        out["dedup_window_ms"] = self.dedup_window_ms
        out["dead_letter_forward"] = self.dead_letter_forward
        out["dead_letter_forward_causes"] = list(self.dead_letter_forward_causes)
        out["resource"] = self.resource
        cb = self.circuit_breaker
        out["circuit_breaker"] = None if cb is None else {"failures": cb[0], "window_ms": cb[1], "open_ms": cb[2]}
        out["windows"] = None if self.windows is None else [dict(w) for w in self.windows.spec]
        out["key_field"] = self.key_field
        out["key_concurrency"] = self.key_concurrency
        out["key_rate"] = _rate_doc(self.key_rate)
        out["key_weights"] = dict(self.key_weights)
        out["key_limits"] = {k: {"concurrency": c, "rate": _rate_doc(r)} for k, (c, r) in self.key_limits.items()}
        out["rate"] = _rate_doc(self.rate)
        out["result_retention_ms"] = self.result_retention_ms
        out["max_retained_result_bytes"] = self.max_retained_result_bytes
        return out


def _rate_doc(rate):
    return None if rate is None else {"count": rate[0], "period_ms": rate[1]}


def check_key(value, max_bytes: int) -> str | None:
    """Why `value` is not a usable job key, or None when it is (docs/api.md EnqueueRequest)."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    n = len(value.encode("utf-8"))
    if n > max_bytes:
        return f"is longer than max_key_bytes ({max_bytes}): {n} bytes"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        return "must not contain control characters"
    return None


def _rate(where: str, value) -> tuple:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table {{count, period_ms}}, got {value!r}")
    for key in value:
        if key not in ("count", "period_ms"):
            raise ConfigError(f"{where}.{key}: unknown key")
    for key in ("count", "period_ms"):
        if key not in value:
            raise ConfigError(f"{where}.{key}: required")
    return _int(f"{where}.count", value["count"], 1, MAX_RATE_COUNT), _int(f"{where}.period_ms", value["period_ms"])


def _key_table(where: str, value, max_key_bytes: int) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table {{key = ...}}, got {value!r}")
    if len(value) > MAX_KEY_OVERRIDES:
        raise ConfigError(f"{where}: names {len(value)} keys, at most {MAX_KEY_OVERRIDES}")
    for k in value:
        why = check_key(k, max_key_bytes)
        if why:
            raise ConfigError(f"{where}.{k}: the key {why}")
    return value


def _key_settings(where: str, entry: dict, max_key_bytes: int) -> dict:
    """A [[queues]] entry's key settings, checked (QueueLimits' key fields)."""
    out = {}
    kf = entry.get("key_field")
    if kf is not None:
        if not isinstance(kf, str) or not kf:
            raise ConfigError(f"{where}.key_field: must be a non-empty string (a custom field's name), got {kf!r}")
        out["key_field"] = kf
    if entry.get("key_concurrency") is not None:
        out["key_concurrency"] = _int(f"{where}.key_concurrency", entry["key_concurrency"], 0)
    for name in ("key_rate", "rate"):
        if entry.get(name) is not None:
            out[name] = _rate(f"{where}.{name}", entry[name])
    weights = entry.get("key_weights")
    if weights is not None:
        weights = _key_table(f"{where}.key_weights", weights, max_key_bytes)
        out["key_weights"] = {k: _int(f"{where}.key_weights.{k}", w, 1, MAX_KEY_WEIGHT) for k, w in weights.items()}
    overrides = entry.get("key_limits")
    if overrides is not None:
        overrides = _key_table(f"{where}.key_limits", overrides, max_key_bytes)
        limits = {}
        for k, v in overrides.items():
            w = f"{where}.key_limits.{k}"
            if not isinstance(v, dict) or not v:
                raise ConfigError(f"{w}: must be a table {{concurrency, rate}} (either or both), got {v!r}")
            for key in v:
                if key not in ("concurrency", "rate"):
                    raise ConfigError(f"{w}.{key}: unknown key")
            conc = v.get("concurrency")
            rate = v.get("rate")
            limits[k] = (None if conc is None else _int(f"{w}.concurrency", conc, 0),
                         None if rate is None else _rate(f"{w}.rate", rate))
        out["key_limits"] = limits
    return out


def _forward_of(where: str, entry: dict, name: str, max_name_bytes: int) -> tuple[str | None, tuple]:
    """A [[queues]] entry's dead_letter_forward and dead_letter_forward_causes, checked."""
    fwd = entry.get("dead_letter_forward")
    causes = entry.get("dead_letter_forward_causes")
    if fwd is None:
        if causes is not None:
            raise ConfigError(f"{where}.dead_letter_forward_causes: has no effect without dead_letter_forward")
        return None, ()
    why = check_queue_name(fwd, max_name_bytes)
    if why:
        raise ConfigError(f"{where}.dead_letter_forward: {why}")
    if len(fwd.encode()) > max_name_bytes:
        raise ConfigError(f"{where}.dead_letter_forward: longer than max_queue_name_bytes ({max_name_bytes})")
    if fwd == name:
        raise ConfigError(f"{where}.dead_letter_forward: a queue cannot forward its dead letters to itself")
    if causes is None:
        return fwd, CLUSTER_CAUSES
    causes = _str_list(f"{where}.dead_letter_forward_causes", causes, allow_empty=False)
    for c in causes:
        if c not in DEAD_LETTER_CAUSES:
            raise ConfigError(f"{where}.dead_letter_forward_causes: {c!r} is not a cause "
                              f"(one of {', '.join(DEAD_LETTER_CAUSES)})")
    return fwd, tuple(c for c in DEAD_LETTER_CAUSES if c in causes)     # each once, in a fixed order


def _check_forwards(declared: dict, default_queue: "QueueLimits", strict: bool) -> None:
    """Between queues: a forward queue that takes the record jobs (its job types and encodings),
    declared under strict_queues (else no worker could reserve from it), and no chain of forwards
    that comes back to where it started (a record of a record of a record ...)."""
    for name, ql in declared.items():
        fwd = ql.dead_letter_forward
        if fwd is None:
            continue
        where = f"queues[{name}].dead_letter_forward"
        target = declared.get(fwd)
        if target is None and strict:
            raise ConfigError(f"{where}: queue {fwd!r} is not declared (strict_queues: declare it)")
        target = target or default_queue
        if target.allowed_job_types is not None and DEAD_LETTER_RECORD_TYPE not in target.allowed_job_types:
            raise ConfigError(f"{where}: queue {fwd!r} does not allow job type {DEAD_LETTER_RECORD_TYPE!r} "
                              "(add it to its allowed_job_types)")
        if target.allowed_encodings is not None and "application/json" not in target.allowed_encodings:
            raise ConfigError(f"{where}: queue {fwd!r} does not allow encoding 'application/json' "
                              "(the record's payload)")
        seen, at = [name], fwd
        while at is not None:
            if at in seen:
                raise ConfigError(f"{where}: the forwards go round in a circle ({' -> '.join(seen + [at])})")
            seen.append(at)
            at = declared[at].dead_letter_forward if at in declared else None


def check_resource_name(where: str, value) -> str:
    if not isinstance(value, str) or not value or len(value.encode("utf-8")) > MAX_RESOURCE_BYTES \
            or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        raise ConfigError(f"{where}: must be a non-empty string of at most {MAX_RESOURCE_BYTES} UTF-8 bytes "
                          f"without control characters, got {value!r}")
    return value


def _resource_limits(where: str, value) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table {{resource = max in flight}}, got {value!r}")
    for name, n in value.items():
        check_resource_name(f"{where}.{name}", name)
        _int(f"{where}.{name}", n, 0)
    return dict(value)


def _circuit_breaker(where: str, value) -> tuple:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table {{failures, window_ms, open_ms}}, got {value!r}")
    for key in value:
        if key not in ("failures", "window_ms", "open_ms"):
            raise ConfigError(f"{where}.{key}: unknown key")
    for key in ("failures", "window_ms", "open_ms"):
        if key not in value:
            raise ConfigError(f"{where}.{key}: required")
    return (_int(f"{where}.failures", value["failures"], 1, MAX_BREAKER_FAILURES),
            _int(f"{where}.window_ms", value["window_ms"]), _int(f"{where}.open_ms", value["open_ms"]))


def _windows(where: str, value):
    from .windows import WindowError, Windows
    try:
        return Windows(value)
    except WindowError as e:
        msg = str(e)
        raise ConfigError(f"{where}{msg}" if msg.startswith("[") else f"{where}: {msg}") from None


def _check_queue_values(where: str, v: dict, max_request_bytes: int) -> None:
    _int(f"{where}.max_lease_duration_ms", v["max_lease_duration_ms"])
    _int(f"{where}.max_attempts_ceiling", v["max_attempts_ceiling"])
    _int(f"{where}.default_max_attempts", v["default_max_attempts"])
    if v["default_max_attempts"] > v["max_attempts_ceiling"]:
        raise ConfigError(
            f"{where}.default_max_attempts: {v['default_max_attempts']} is above "
            f"max_attempts_ceiling ({v['max_attempts_ceiling']})")
    _int(f"{where}.default_priority", v["default_priority"], 0, 9)
    _int(f"{where}.retry_delay_max_ms", v["retry_delay_max_ms"])
    _int(f"{where}.retry_delay_ms", v["retry_delay_ms"], 0)
    if v["retry_delay_ms"] > v["retry_delay_max_ms"]:
        raise ConfigError(
            f"{where}.retry_delay_ms: {v['retry_delay_ms']} is above retry_delay_max_ms "
            f"({v['retry_delay_max_ms']})")
    if v["retry_backoff"] not in ("none", "exponential"):
        raise ConfigError(f"{where}.retry_backoff: must be \"none\" or \"exponential\", got {v['retry_backoff']!r}")
    if v["max_queue_depth"] is not None:
        _int(f"{where}.max_queue_depth", v["max_queue_depth"], 0)
    _int(f"{where}.max_payload_bytes", v["max_payload_bytes"])
    if v["max_payload_bytes"] > max_request_bytes:
        raise ConfigError(
            f"{where}.max_payload_bytes: {v['max_payload_bytes']} is above max_request_bytes "
            f"({max_request_bytes}); such a payload could never be sent")
    _int(f"{where}.max_custom_entries", v["max_custom_entries"])
    _int(f"{where}.max_custom_total_bytes", v["max_custom_total_bytes"])
    _int(f"{where}.max_custom_key_bytes", v["max_custom_key_bytes"])
    _int(f"{where}.max_schedule_horizon_ms", v["max_schedule_horizon_ms"])
    if v["allowed_encodings"] is not None:
        v["allowed_encodings"] = _str_list(f"{where}.allowed_encodings", v["allowed_encodings"])
    if v["execution_timeout_ms"] is not None:
        _int(f"{where}.execution_timeout_ms", v["execution_timeout_ms"])
    if v["duplicate_policy"] not in DUPLICATE_POLICIES:
        raise ConfigError(f"{where}.duplicate_policy: must be \"return_existing\", \"reject\" or \"replace\", "
                          f"got {v['duplicate_policy']!r}")


def _global_limits(limits: dict) -> dict:
    """The `[limits]` keys that only exist globally, with their defaults, checked."""
    g = {**GLOBAL_KEYS, **{k: v for k, v in limits.items() if k in GLOBAL_KEYS}}
    for key in ("max_reserve_batch", "max_reserve_queues", "max_wait_timeout_ms",
                "max_enqueue_batch", "max_job_type_bytes", "max_idempotency_key_bytes",
                "max_request_bytes", "request_id_window_ms", "max_trace_context_bytes",
                "max_encoding_bytes", "max_reason_bytes", "max_worker_id_bytes", "max_schedules_per_sweep",
                "max_catchup_ticks"):
        _int(f"limits.{key}", g[key])
    _int("limits.max_schedules", g["max_schedules"], 0)
    _int("limits.max_key_bytes", g["max_key_bytes"], 1, 65535)
    _int("limits.max_queue_name_bytes", g["max_queue_name_bytes"], 1, 65535)
    _int("limits.max_result_bytes", g["max_result_bytes"])
    _int("limits.max_dependencies_per_job", g["max_dependencies_per_job"], 1, 100_000)
    _int("limits.max_batches", g["max_batches"], 0)
    _int("limits.max_batch_members", g["max_batch_members"], 1, 1_000_000)
    if "max_result_bytes" in limits and g["max_result_bytes"] > g["max_request_bytes"]:     # (its default may be)
        raise ConfigError(f"limits.max_result_bytes: {g['max_result_bytes']} is above max_request_bytes "
                          f"({g['max_request_bytes']}); such a result could never be sent")
    g["resource_limits"] = _resource_limits("limits.resource_limits", g["resource_limits"])
    if not isinstance(g["strict_queues"], bool):
        raise ConfigError(f"limits.strict_queues: must be true or false, got {g['strict_queues']!r}")
    return g


def _storage_limits(storage: dict) -> dict:
    """The `[storage]` keys with their defaults, checked."""
    s = {**STORAGE_KEYS, **storage}
    _int("storage.dead_letter_retention_ms", s["dead_letter_retention_ms"], 0)
    _int("storage.dedup_window_ms", s["dedup_window_ms"])
    _int("storage.sweep_interval_ms", s["sweep_interval_ms"])
    _int("storage.sweep_limit", s["sweep_limit"])
    _int("storage.audit_retention_ms", s["audit_retention_ms"])
    _int("storage.audit_max_entries", s["audit_max_entries"])
    _int("storage.min_free_bytes", s["min_free_bytes"], 0)
    return s


def _declared_queue(where: str, entry, base: dict, g: dict, s: dict, declared: dict) -> "QueueLimits":
    """One `[[queues]]` entry (`where` names it until its name is known) over the queue
    defaults `base`, checked against the global limits `g`, the storage `s` and the queues
    `declared` before it."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a table")
    name = entry.get("name")
    why = check_queue_name(name, g["max_queue_name_bytes"])
    if why:
        raise ConfigError(f"{where}.name: {why}")
    if len(name.encode()) > g["max_queue_name_bytes"]:
        raise ConfigError(f"{where}.name: longer than max_queue_name_bytes ({g['max_queue_name_bytes']})")
    if name in declared:
        raise ConfigError(f"{where}.name: queue {name!r} is declared twice")
    where = f"queues[{name}]"
    for key in entry:
        if key not in QUEUE_KEYS and key not in QUEUE_ONLY_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key (or not overridable per queue)")
    merged = {**base, **{k: v for k, v in entry.items() if k in QUEUE_KEYS}}
    _check_queue_values(where, merged, g["max_request_bytes"])
    job_types = entry.get("allowed_job_types")
    if job_types is not None:
        job_types = _str_list(f"{where}.allowed_job_types", job_types, allow_empty=False)
    window = _int(f"{where}.dedup_window_ms", entry.get("dedup_window_ms", s["dedup_window_ms"]))
    fwd, causes = _forward_of(where, entry, name, g["max_queue_name_bytes"])
    resource = entry.get("resource")
    if resource is not None:
        check_resource_name(f"{where}.resource", resource)
    breaker = entry.get("circuit_breaker")
    if breaker is not None:
        breaker = _circuit_breaker(f"{where}.circuit_breaker", breaker)
    windows = entry.get("windows")
    if windows is not None:
        windows = _windows(f"{where}.windows", windows)
    return QueueLimits(name=name, declared=True, **merged, **_result_settings(where, entry),
                       allowed_job_types=job_types, dedup_window_ms=window,
                       dead_letter_forward=fwd, dead_letter_forward_causes=causes,
                       resource=resource, circuit_breaker=breaker, windows=windows,
                       **_key_settings(where, entry, g["max_key_bytes"]))


# Queue keys added after data directories could have been written, with their defaults: a
# queue's fingerprint names them only when they differ, so a configuration that does not use
# them keeps the fingerprint it had (GET /v1/config, `toml_differs`).
_FINGERPRINT_WHEN_SET = {"result_retention_ms": 0, "max_retained_result_bytes": DEFAULT_MAX_RETAINED_RESULT_BYTES}


def _fingerprinted(ql: "QueueLimits") -> dict:
    return {k: v for k, v in ql.describe().items() if k not in _FINGERPRINT_WHEN_SET or v != _FINGERPRINT_WHEN_SET[k]}


def _result_settings(where: str, entry: dict) -> dict:
    """A [[queues]] entry's result retention and bound, checked (QueueLimits' result fields)."""
    out = {}
    if entry.get("result_retention_ms") is not None:
        out["result_retention_ms"] = _int(f"{where}.result_retention_ms", entry["result_retention_ms"], 0)
    if entry.get("max_retained_result_bytes") is not None:
        out["max_retained_result_bytes"] = _int(f"{where}.max_retained_result_bytes",
                                                entry["max_retained_result_bytes"], 1)
    return out


@dataclass(frozen=True)
class Limits:
    """Everything the state machine and the request validation read from the config."""
    globals: dict = field(default_factory=dict)
    storage: dict = field(default_factory=dict)
    queues: dict = field(default_factory=dict)          # name -> QueueLimits (declared)
    default_queue: QueueLimits | None = None            # view for undeclared queues
    # The canonical document of this configuration (`canonical`): every [limits] and [storage]
    # key with its effective value, and the [[queues]] entries as declared. What the replicated
    # state keeps, `GET /v1/config` shows and `raftq config diff` compares.
    doc: dict | None = field(default=None, compare=False)

    @classmethod
    def build(cls, limits: dict | None = None, storage: dict | None = None,
              queues: list | None = None) -> "Limits":
        """Check and merge the `[limits]`, `[storage]` and `[[queues]]` tables."""
        limits, storage, queues = dict(limits or {}), dict(storage or {}), list(queues or [])
        for key in limits:
            if key not in QUEUE_KEYS and key not in GLOBAL_KEYS:
                raise ConfigError(f"limits.{key}: unknown key")
        for key in storage:
            if key not in STORAGE_KEYS:
                raise ConfigError(f"storage.{key}: unknown key")
        g = _global_limits(limits)
        s = _storage_limits(storage)
        base = {**QUEUE_KEYS, **{k: v for k, v in limits.items() if k in QUEUE_KEYS}}
        _check_queue_values("limits", base, g["max_request_bytes"])
        default_queue = QueueLimits(name=None, declared=False, **base, allowed_job_types=None,
                                    dedup_window_ms=s["dedup_window_ms"])
        declared: dict[str, QueueLimits] = {}
        for i, entry in enumerate(queues):
            q = _declared_queue(f"queues[{i}]", entry, base, g, s, declared)
            declared[q.name] = q
        _check_forwards(declared, default_queue, g["strict_queues"])
        doc = {"limits": {**{k: _plain(v) for k, v in g.items()
                             if k not in DOC_WHEN_SET or v != GLOBAL_KEYS[k]},
                          **{k: _plain(base[k]) for k in QUEUE_KEYS}},
               "storage": dict(s),
               "queues": [{k: _plain(v) for k, v in entry.items()} for entry in queues]}
        return cls(globals=g, storage=s, queues=declared, default_queue=default_queue, doc=doc)

    @classmethod
    def from_doc(cls, doc) -> "Limits":
        """`build` from a configuration document {"limits", "storage", "queues"} (each optional,
        as the TOML sections are); raises ConfigError naming the key."""
        if not isinstance(doc, dict):
            raise ConfigError("config: must be an object {limits, storage, queues}")
        for key in doc:
            if key not in ("limits", "storage", "queues"):
                raise ConfigError(f"{key}: unknown section (a configuration has limits, storage and queues)")
        limits, storage, queues = doc.get("limits"), doc.get("storage"), doc.get("queues")
        if limits is not None and not isinstance(limits, dict):
            raise ConfigError("limits: must be a table")
        if storage is not None and not isinstance(storage, dict):
            raise ConfigError("storage: must be a table")
        if queues is not None and not isinstance(queues, list):
            raise ConfigError("queues: must be an array of tables [[queues]]")
        return cls.build(limits, storage, queues)

    def __post_init__(self):
        # Global and storage limits read like attributes (limits.max_enqueue_batch): they are
        # stored as plain attributes, globals winning. The class has no __getattr__ fallback on
        # purpose: one would make every attribute read of a Limits take CPython's slow path
        # (≈ 50 ns instead of 10 here, and `queue()` 260 ns instead of 56, called for every job an
        # enqueue applies). Names that are fields or class attributes keep their meaning.
        # The queues reserve must gate (a circuit breaker, windows or a queue-wide rate): one set
        # test per queue of a reserve, nothing more for the others.
        object.__setattr__(self, "gated", frozenset(
            n for n, ql in (self.queues or {}).items()
            if ql.circuit_breaker is not None or ql.windows is not None or ql.rate is not None))
        # The queues that keep finished jobs (result_retention_ms > 0): one set test per ack.
        object.__setattr__(self, "retaining", frozenset(
            n for n, ql in (self.queues or {}).items() if ql.result_retention_ms > 0))
        taken = {f.name for f in fields(self)} | set(dir(type(self)))
        for source in (self.storage, self.globals):
            if isinstance(source, dict):
                for key, value in source.items():
                    if isinstance(key, str) and key not in taken:
                        object.__setattr__(self, key, value)

    def queue(self, name: str) -> QueueLimits:
        return self.queues.get(name) or self.default_queue

    def fingerprint(self) -> str:
        """A hash of every limit; nodes of one cluster must agree on it."""
        doc = {"limits": {k: v for k, v in self.globals.items() if k not in DOC_WHEN_SET or v != GLOBAL_KEYS[k]},
               "storage": {k: v for k, v in self.storage.items() if k not in NODE_LOCAL_STORAGE_KEYS},
               "default": _fingerprinted(self.default_queue),
               "queues": {n: _fingerprinted(q) for n, q in sorted(self.queues.items())}}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def server_info(self) -> dict:
        """The limits part of GET /v1/server-info (global values, as sepp advertises them: docs/glossary.md "sepp")."""
        d = self.default_queue
        return {
            "max_payload_bytes": d.max_payload_bytes,
            "max_custom_entries": d.max_custom_entries,
            "max_custom_total_bytes": d.max_custom_total_bytes,
            "max_custom_key_bytes": d.max_custom_key_bytes,
            "max_queue_name_bytes": self.max_queue_name_bytes,
            "max_job_type_bytes": self.max_job_type_bytes,
            "max_idempotency_key_bytes": self.max_idempotency_key_bytes,
            "max_key_bytes": self.max_key_bytes,
            "max_schedule_horizon_ms": d.max_schedule_horizon_ms,
            "max_enqueue_batch": self.max_enqueue_batch,
            "max_reserve_batch": self.max_reserve_batch,
            "max_reserve_queues": self.max_reserve_queues,
            "max_wait_timeout_ms": self.max_wait_timeout_ms,
            "max_lease_duration_ms": d.max_lease_duration_ms,
            "max_request_bytes": self.max_request_bytes,
            "max_trace_context_bytes": self.max_trace_context_bytes,
            "max_encoding_bytes": self.max_encoding_bytes,
            "max_reason_bytes": self.max_reason_bytes,
            "max_worker_id_bytes": self.max_worker_id_bytes,
            "restricts_encodings": d.allowed_encodings is not None,
            "allowed_encodings": list(d.allowed_encodings or ()),
            "strict_queues": self.strict_queues,
            "dead_letter_retention_enabled": self.dead_letter_retention_ms > 0,
        }
