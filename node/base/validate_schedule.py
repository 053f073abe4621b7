"""Schedule requests (docs/api.md "Schedules"): checked here, before anything is proposed, into
the definitions node/core/schedules.py keeps. A wrong field is 400 `invalid_argument` naming it
(`field`), and nothing is changed.
"""
from __future__ import annotations

import re

from ..core import cron
from ..core import ops
from ..core.schedules import CATCHUP_POLICIES, OVERLAP_POLICIES, SCHEDULE_FIELD, TICK_FIELD
from ..core.errors import ApiError
from ..core.limits import Limits
from .validate import _Reject, check_job, is_int, require_object

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
MIN_EVERY_MS = 1_000
MAX_CATCHUP_WINDOW_MS = 7 * 86_400_000
DEFAULT_CATCHUP_WINDOW_MS = 3_600_000
DEFAULT_MISFIRE_AFTER_MS = 5_000
MAX_MISFIRE_AFTER_MS = 3_600_000
# Fields of a job that a schedule decides itself (per tick), so a template may not hold them.
NOT_IN_TEMPLATE = ("scheduled_at_ms", "delay_ms", "deadline_at_ms", "idempotency_key", "duplicate_policy",
                   "trace_context")
BODY_KEYS = frozenset(("cron", "time_zone", "every_ms", "start_at_ms", "end_at_ms", "max_count", "catchup",
                       "catchup_window_ms", "misfire_after_ms", "overlap", "paused", "job", "expect_version"))


def bad(field: str, message: str) -> ApiError:
    return ApiError("invalid_argument", f"{field}: {message}", field=field)


def name_arg(name) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad("name", "a schedule name is 1..128 characters of A-Z a-z 0-9 . _ : @ -, starting with a letter "
                          f"or digit; got {name!r}")
    return name


def _int_field(body: dict, key: str, default, minimum: int, maximum: int | None = None):
    v = body.get(key, default)
    if v is None:
        return None
    if not is_int(v) or v < minimum or (maximum is not None and v > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise bad(key, f"must be an integer >= {minimum}{upper}, got {v!r}")
    return v


def _choice(body: dict, key: str, choices: tuple, default: str) -> str:
    v = body.get(key, default)
    if v not in choices:
        raise bad(key, f"must be one of {', '.join(choices)}; got {v!r}")
    return v


def _rule(body: dict) -> tuple:
    spec, every, zone = body.get("cron"), body.get("every_ms"), body.get("time_zone", "UTC")
    if (spec is None) == (every is None):
        raise bad("cron", "give either cron (a 5-field expression) or every_ms (an interval), not both or neither")
    if not isinstance(zone, str) or not zone:
        raise bad("time_zone", f"must be an IANA time zone name such as Europe/Berlin; got {zone!r}")
    if spec is not None:
        if not isinstance(spec, str):
            raise bad("cron", f"must be a string such as \"*/5 * * * *\"; got {spec!r}")
        try:
            cron.parse(spec, zone)
        except cron.CronError as e:
            text = str(e)
            raise bad("time_zone" if text.startswith("time zone:") else "cron", text)
    else:
        every = _int_field(body, "every_ms", None, MIN_EVERY_MS)
        if "time_zone" in body:
            raise bad("time_zone", "an interval (every_ms) has no time zone: it counts milliseconds")
    return spec, zone, every


def _template(job, name: str, limits: Limits, now_ms: int) -> dict:
    """The job template, checked as an enqueue of it would be (with the two fields each tick's job
    gets), then kept without a job id or per-job times."""
    if not isinstance(job, dict):
        raise bad("job", "is required: an object {queue, job_type, payload?, priority?, max_attempts?, custom?, "
                         "timeout_ms?, resource?, deadline_after_ms?}")
    for key in NOT_IN_TEMPLATE:
        if job.get(key) is not None:
            raise bad(f"job.{key}", "a schedule's job cannot have it: each tick sets its own (deadline_after_ms "
                                    "gives a deadline relative to the tick)")
    custom = job.get("custom")
    if isinstance(custom, dict) and any(isinstance(k, str) and k.startswith("raftq.") for k in custom):
        raise bad("job.custom", "keys starting with \"raftq.\" are the schedule's own (raftq.schedule, raftq.tick_ms)")
    after = job.get("deadline_after_ms")
    if after is not None and (not is_int(after) or after < 1):
        raise bad("job.deadline_after_ms", f"must be an integer >= 1 (ms after the tick), got {after!r}")
    probe = {k: v for k, v in job.items() if k != "deadline_after_ms"}
    probe["custom"] = {**(custom if isinstance(custom, dict) else {}), SCHEDULE_FIELD: name, TICK_FIELD: now_ms}
    if custom is not None and not isinstance(custom, dict):
        probe["custom"] = custom                    # let check_job say what is wrong with it
    try:
        item = check_job(probe, limits, now_ms, lambda: "template")
    except _Reject as r:
        raise ApiError("invalid_argument", f"job: refused as a job would be: {r.rejection['reason']}",
                       field="job", rejection=r.rejection)
    except ApiError as e:
        raise ApiError("invalid_argument", f"job: {e.message}", field="job")
    fields = dict(zip(ops.ITEM, item + (None,) * (len(ops.ITEM) - len(item))))
    kept = dict(fields["custom"] or {})
    kept.pop(SCHEDULE_FIELD), kept.pop(TICK_FIELD)
    out = {"queue": fields["queue"], "job_type": fields["job_type"], "payload": fields["payload"],
           "encoding": fields["encoding"], "priority": fields["priority"], "max_attempts": fields["max_attempts"],
           "custom": kept or None, "timeout_ms": fields["timeout_ms"], "resource": fields["resource"],
           "deadline_after_ms": after}
    if fields["key"] is not None:               # only when set: templates of before keys are unchanged
        out["key"] = fields["key"]
    return out


def definition(name: str, body, limits: Limits, now_ms: int) -> dict:
    """A PUT body -> the definition node/core/schedules.py keeps (schedules.DEFINITION_KEYS). A
    field given as null is taken as left out, as everywhere in the API; an unknown field is 400
    (a misspelt policy must not silently fall back to its default)."""
    body = {k: v for k, v in body.items() if v is not None}
    unknown = sorted(set(body) - BODY_KEYS)
    if unknown:
        raise bad(unknown[0], f"unknown field (a schedule has {', '.join(sorted(BODY_KEYS))})")
    spec, zone, every = _rule(body)
    start = _int_field(body, "start_at_ms", None, 0)
    end = _int_field(body, "end_at_ms", None, 0)
    if start is not None and end is not None and end < start:
        raise bad("end_at_ms", f"is before start_at_ms ({end} < {start})")
    paused = body.get("paused", False)
    if not isinstance(paused, bool):
        raise bad("paused", f"must be true or false, got {paused!r}")
    return {"cron": spec, "time_zone": zone if spec is not None else None, "every_ms": every,
            "start_at_ms": start, "end_at_ms": end, "max_count": _int_field(body, "max_count", None, 1),
            "catchup": _choice(body, "catchup", CATCHUP_POLICIES, "one"),
            "catchup_window_ms": _int_field(body, "catchup_window_ms", DEFAULT_CATCHUP_WINDOW_MS, 1,
                                            MAX_CATCHUP_WINDOW_MS),
            "misfire_after_ms": _int_field(body, "misfire_after_ms", DEFAULT_MISFIRE_AFTER_MS, 0,
                                           MAX_MISFIRE_AFTER_MS),
            "overlap": _choice(body, "overlap", OVERLAP_POLICIES, "allow"), "paused": paused,
            "job": _template(body.get("job"), name, limits, now_ms)}


def _expect(body: dict):
    v = body.get("expect_version")
    if v is not None and (not is_int(v) or v < 0):
        raise bad("expect_version", f"must be an integer >= 0 (0: create only; n: replace version n), got {v!r}")
    return v


def put(name, body, limits: Limits, now_ms: int, rid=None, who=None) -> tuple:
    """PUT /v1/schedules/{name}: create or replace."""
    name = name_arg(name)
    body = require_object(body)
    return ops.schedule_put(rid, name, definition(name, body, limits, now_ms), _expect(body), who)


NAME_PATTERN = "^" + NAME.pattern + "$"


def delete(name, query_version, rid=None, who=None) -> tuple:
    """DELETE /v1/schedules/{name}[?expect_version=n]."""
    name = name_arg(name)
    expect = None
    if query_version is not None:
        try:
            expect = int(query_version)
        except ValueError:
            raise bad("expect_version", f"must be an integer, got {query_version!r}") from None
    return ops.schedule_delete(rid, name, expect, who)


def pause(name, paused: bool, rid=None, who=None) -> tuple:
    return ops.schedule_pause(rid, name_arg(name), paused, who)


def trigger(name, new_id, rid=None, who=None) -> tuple:
    return ops.schedule_trigger(rid, name_arg(name), new_id(), who)
