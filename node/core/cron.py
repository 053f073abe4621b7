"""Schedules of periodic jobs: when a cron expression (or a fixed interval) fires next.

The replicated state machine decides from these functions when a schedule fires, so they are
pure: no clock (every time is an argument, integer milliseconds since the Unix epoch, UTC), no
randomness, no I/O but the time-zone rules, which come from the `tzdata` package through
`windows.load_zone` (never from the host), so every node of a cluster computes the same fires.

Cron expressions have the five classic fields, `minute hour day-of-month month day-of-week`.
There is no seconds field: fires are whole local minutes (second 0; whole UTC minutes in every
zone's current rules). Each field is a comma list of items: `*`, `n`, `a-b`, `*/s`, `a-b/s`, or
`a/s` (a through the field's last value, in steps of s). Months take JAN..DEC and days of the
week SUN..SAT (any case) as well as numbers; day-of-week is 0..7, 0 and 7 both Sunday (`*` and
`a/s` run through 6, Saturday; `7/s` is Sunday alone). An expression is at most 200 characters
(MAX_SPEC_CHARS); `Cron.spec` keeps it as given, `Cron.zone` the zone's name. The macros are `@yearly` (= `@annually`, `0 0 1 1 *`),
`@monthly` (`0 0 1 * *`), `@weekly` (`0 0 * * 0`), `@daily` (= `@midnight`, `0 0 * * *`) and
`@hourly` (`0 * * * *`); `@reboot` means nothing to a replicated queue and is refused.

Days, as in Vixie cron: when both day-of-month and day-of-week are restricted a day matches if
EITHER matches (`0 0 13 * FRI` fires on every 13th and on every Friday); when either is `*`, both
must (so only the other one counts). A field counts as unrestricted only when it is exactly `*`:
Vixie cron also treats `*/2` as unrestricted here, other implementations (robfig/cron, croniter)
do not; the literal reading is the one people expect from the text, and with it every expression
that parses fires at least once every 8 years (see the horizon below).

Time zones and daylight-saving time. An expression is evaluated in its zone's local wall time:
* a local time skipped by a spring-forward gap fires ONCE, at the first valid instant after the
  gap: `30 2 * * *` in New York on 2026-03-08 (02:00 jumps to 03:00) fires at 03:00 EDT. Several
  skipped times (`*/15` at 02:00..02:45) and a match at the gap's end (03:00) are that one fire;
* a local time that occurs twice in a fall-back fold fires ONCE, at its first occurrence (PEP 495
  fold=0): `30 1 * * *` in New York on 2026-11-01 fires at 01:30 EDT, not again at 01:30 EST, and
  `0 * * * *` fires at 00:00 EDT, 01:00 EDT, 02:00 EST (no second 01:00).
In other words every matching local minute fires exactly once, at the instant it first occurs or
would have occurred; that mapping never runs backwards, so fires stay in time order.

Horizon: `next_fire` searches the rest of the current local year and the 8 following years (it
skips by month, day and hour, as cron implementations do: the worst case takes well under a
millisecond). The longest wait of an expression that parses is 8 years (`0 0 29 2 *` across
2100, not a leap year), so None in practice means "past year 9999" (or a time before year 1).
An expression that can never fire (`0 0 30 2 *`, `0 0 31 4 *`) is refused by `parse`.

Intervals (`every_ms` from an anchor) are plain integer arithmetic: `every_next`, `Every`.
`Cron` and `Every` both answer `next_fire(after_ms)` (the `Schedule` protocol), which is all that
`fires_between` (the catch-up after a gap in the replicated clock) needs.
"""
from __future__ import annotations

import calendar
import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import NamedTuple, Protocol
from zoneinfo import ZoneInfo

from .windows import WindowError, load_zone

MINUTE_MS = 60_000
MAX_SPEC_CHARS = 200
HORIZON_YEARS = 8
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NUMBER = re.compile(r"[0-9]+")
_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)     # the most each month can have
_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
           "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
           "@hourly": "0 * * * *"}


class CronError(ValueError):
    """A schedule that cannot be used; the message names the field and what is wrong with it."""


class _Field(NamedTuple):
    """How one of the five fields is read (its name is the one error messages use)."""
    name: str
    low: int
    high: int        # the largest value accepted (7 for day-of-week: Sunday again)
    last: int        # where `*` and `a/s` stop (6 for day-of-week: Saturday)
    names: tuple[str, ...] = ()     # names[i] stands for low + i


_FIELDS = (_Field("minute", 0, 59, 59), _Field("hour", 0, 23, 23), _Field("day-of-month", 1, 31, 31),
           _Field("month", 1, 12, 12, _MONTH_NAMES), _Field("day-of-week", 0, 7, 6, _DAY_NAMES))


class Fields(NamedTuple):
    """A parsed expression: the values of each field, sorted, and how days combine."""
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]           # days of the month, 1..31
    months: tuple[int, ...]         # 1..12
    weekdays: tuple[int, ...]       # 0 = Sunday .. 6 = Saturday
    any_day: bool                   # day-of-month is `*`
    any_weekday: bool               # day-of-week is `*`


class Schedule(Protocol):
    """What `fires_between` needs of a schedule: `Cron` and `Every` both provide it."""

    def next_fire(self, after_ms: int) -> int | None: ...


# ---------------------------------------------------------------------------------- parsing

def _value(field: _Field, text: str, item: str) -> int:
    """One number or name of `item`, checked against the field's range."""
    if _NUMBER.fullmatch(text):
        value = int(text)
    elif text.lower() in field.names:
        value = field.low + field.names.index(text.lower())
    elif not text:
        raise CronError(f"{field.name} field {item!r}: a value is missing")
    else:
        named = f" or a name ({field.names[0].upper()}-{field.names[-1].upper()})" if field.names else ""
        raise CronError(f"{field.name} field {text!r} is not a number{named}")
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name} field {text!r} is out of range {field.low}-{field.high}")
    return value


def _item(field: _Field, item: str) -> range:
    """The values of one comma-separated item: `*`, `n`, `a-b`, with an optional `/step`."""
    body, slash, step_text = item.partition("/")
    step = 1
    if slash:
        span = field.last - field.low + 1
        if not _NUMBER.fullmatch(step_text):
            raise CronError(f"{field.name} field {item!r}: step {step_text!r} is not a number")
        step = int(step_text)
        if not 1 <= step <= span:
            raise CronError(f"{field.name} field {item!r}: step {step} is out of range 1-{span}")
    if body == "*":
        return range(field.low, field.last + 1, step)
    start_text, dash, end_text = body.partition("-")
    first = _value(field, start_text, item)
    if dash:
        last = _value(field, end_text, item)
        if first > last:
            raise CronError(f"{field.name} field {item!r}: the range runs backwards ({first} > {last})")
    else:
        last = max(first, field.last) if slash else first     # `a/s`: a to the field's end (`7/s`: 7)
    return range(first, last + 1, step)


def _field(field: _Field, text: str) -> tuple[int, ...]:
    """The sorted values of a whole field (a comma list of items)."""
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"{field.name} field {text!r} has an empty item")
        values.update(_item(field, item))
    if field.high == 7:
        values = {v % 7 for v in values}            # day-of-week 7 is Sunday, 0
    return tuple(sorted(values))


def _parse(spec: str) -> Fields:
    """Check and read an expression (or macro); CronError names what is wrong."""
    if not isinstance(spec, str):
        raise CronError(f"a cron expression must be a string, got {type(spec).__name__}")
    if len(spec) > MAX_SPEC_CHARS:
        raise CronError(f"the cron expression is {len(spec)} characters long, at most {MAX_SPEC_CHARS}")
    text = spec.strip()
    if text.startswith("@"):
        if text.lower() not in _MACROS:
            raise CronError(f"unknown cron macro {text!r} (known: {', '.join(_MACROS)})")
        text = _MACROS[text.lower()]
    parts = text.split()
    if len(parts) != 5:
        raise CronError("a cron expression has 5 fields (minute hour day-of-month month day-of-week; "
                        f"no seconds), got {len(parts)} in {spec!r}")
    minutes, hours, days, months, weekdays = (_field(f, p) for f, p in zip(_FIELDS, parts))
    fields = Fields(minutes, hours, days, months, weekdays, parts[2] == "*", parts[4] == "*")
    if fields.any_weekday and not fields.any_day and days[0] > max(_MONTH_DAYS[m - 1] for m in months):
        # Only this combination can be empty: any restricted day-of-week matches a day every week.
        later = " or later" if len(days) > 1 else ""
        raise CronError(f"{spec!r} never fires: no month of month field {parts[3]!r} has a day {days[0]}{later}"
                        f" (day-of-month field {parts[2]!r})")
    return fields


# ---------------------------------------------------------------------------------- searching

def _next_in(values: tuple[int, ...], start: int) -> int | None:
    """The first of the sorted `values` that is >= start, or None."""
    i = bisect_left(values, start)
    return values[i] if i < len(values) else None


def _next_day(f: Fields, year: int, month: int, day: int) -> int | None:
    """The first day >= `day` of the month that the day fields accept, or None."""
    first_weekday, length = calendar.monthrange(year, month)    # Monday = 0
    if f.any_weekday:
        found = _next_in(f.days, day)
        return found if found is not None and found <= length else None
    for d in range(day, length + 1):
        weekday_ok = (first_weekday + d) % 7 in f.weekdays      # cron's Sunday = 0
        if weekday_ok if f.any_day else (weekday_ok or d in f.days):
            return d
    return None


def _next_wall(f: Fields, wall: datetime, last_year: int) -> datetime | None:
    """The first local wall minute >= `wall` that matches, up to the end of `last_year`.

    Pure calendar arithmetic on naive times (the zone plays no part): it skips whole months,
    days and hours that cannot match, so even a 29 February takes a handful of steps."""
    year, month, day, hour, minute = wall.year, wall.month, wall.day, wall.hour, wall.minute
    while year <= last_year:
        found_month = _next_in(f.months, month)
        if found_month != month:
            year, month = (year, found_month) if found_month is not None else (year + 1, f.months[0])
            day, hour, minute = 1, 0, 0
            continue
        found_day = _next_day(f, year, month, day)
        if found_day is None:
            year, month, day, hour, minute = year + month // 12, month % 12 + 1, 1, 0, 0
            continue
        if found_day != day:
            day, hour, minute = found_day, 0, 0
        found_hour = _next_in(f.hours, hour)
        if found_hour is None:
            day, hour, minute = day + 1, 0, 0           # _next_day answers None past the month's end
            continue
        if found_hour != hour:
            hour, minute = found_hour, 0
        found_minute = _next_in(f.minutes, minute)
        if found_minute is None:
            hour, minute = hour + 1, 0
            continue
        return datetime(year, month, day, hour, found_minute)
    return None


def _ms(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def _at(ms: int, zone: ZoneInfo) -> datetime:
    return (_EPOCH + timedelta(milliseconds=ms)).astimezone(zone)


def _gap_end(wall: datetime, zone: ZoneInfo) -> int:
    """The first whole minute after the spring-forward gap that swallows local time `wall`.

    Read with each of its two offsets (PEP 495 `fold`), `wall` names one instant before the
    transition and one after it; the transition lies between, found by bisecting on seconds."""
    low, high = sorted(_ms(wall.replace(tzinfo=zone, fold=fold)) // 1000 for fold in (0, 1))
    after = _at(high * 1000, zone).utcoffset()
    while high - low > 1:
        middle = (low + high) // 2
        if _at(middle * 1000, zone).utcoffset() == after:
            high = middle
        else:
            low = middle
    return -(-high * 1000 // MINUTE_MS) * MINUTE_MS


def _instant(wall: datetime, zone: ZoneInfo) -> int:
    """When local wall time `wall` fires: its first occurrence, or the end of the gap it is in."""
    moment = wall.replace(tzinfo=zone, fold=0)          # fold=0: the first of two occurrences
    if moment.astimezone(timezone.utc).astimezone(zone).replace(tzinfo=None) == wall:
        return _ms(moment)
    return _gap_end(wall, zone)                         # it does not exist: skipped by a gap


class Cron:
    """A parsed cron expression in a time zone; `next_fire(ms)` says when it fires next.

    Built from (spec, zone) alone, and pickled as them (the zone reloads from tzdata)."""
    __slots__ = ("spec", "zone", "fields", "_tz")

    def __init__(self, spec: str, zone: str = "UTC"):
        self.fields = _parse(spec)
        try:
            self._tz = load_zone(zone)
        except WindowError as e:
            raise CronError(f"time zone: {e}") from None
        self.spec, self.zone = spec, zone

    def __eq__(self, other) -> bool:
        return isinstance(other, Cron) and (other.spec, other.zone) == (self.spec, self.zone)

    def __hash__(self) -> int:
        return hash((self.spec, self.zone))

    def __reduce__(self):
        return Cron, (self.spec, self.zone)

    def __repr__(self) -> str:
        return f"Cron({self.spec!r}, {self.zone!r})"

    def next_fire(self, after_ms: int) -> int | None:
        """The first fire strictly after `after_ms`, or None if none within the horizon.

        Local wall minutes are visited in order from the one holding `after_ms`; each maps to
        its instant (first occurrence, or the end of its gap) and the first instant past
        `after_ms` wins. The mapping keeps time order, so that first one is the next fire; only
        inside a fold (after_ms in the second occurrence) are a few earlier minutes passed over."""
        try:
            local = _at(after_ms // MINUTE_MS * MINUTE_MS, self._tz)
            wall = local.replace(second=0, microsecond=0, tzinfo=None, fold=0)
            last_year = min(wall.year + HORIZON_YEARS, 9999)
            while (wall := _next_wall(self.fields, wall, last_year)) is not None:
                fire = _instant(wall, self._tz)
                if fire > after_ms:
                    return fire
                wall += timedelta(minutes=1)
        except OverflowError:                           # past year 9999 (or before year 1)
            pass
        return None


def parse(spec: str, zone: str = "UTC") -> Cron:
    """A cron expression `spec` in time zone `zone` (an IANA name); CronError if unusable."""
    return Cron(spec, zone)


# ---------------------------------------------------------------------------------- intervals

def _check_interval(anchor_ms: int, every_ms: int) -> None:
    for name, value in (("anchor_ms", anchor_ms), ("every_ms", every_ms)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise CronError(f"{name} must be an integer, got {type(value).__name__}")
    if every_ms <= 0:
        raise CronError(f"every_ms must be positive, got {every_ms}")


def every_next(anchor_ms: int, every_ms: int, after_ms: int) -> int:
    """The first of anchor + k * every_ms (k >= 1) strictly after `after_ms`.

    k starts at 1: the anchor itself (the schedule's creation, say) is not a fire."""
    _check_interval(anchor_ms, every_ms)
    k = max(1, (after_ms - anchor_ms) // every_ms + 1)
    return anchor_ms + k * every_ms


@dataclass(frozen=True)
class Every:
    """An interval schedule: fires at anchor_ms + k * every_ms for k >= 1."""
    anchor_ms: int
    every_ms: int

    def __post_init__(self):
        _check_interval(self.anchor_ms, self.every_ms)

    def next_fire(self, after_ms: int) -> int:
        # every_next's arithmetic without its checks, which __post_init__ made once
        anchor, every = self.anchor_ms, self.every_ms
        k = (after_ms - anchor) // every + 1
        return anchor + (k if k > 1 else 1) * every


def fires_between(schedule: Schedule, start_ms: int, end_ms: int, limit: int) -> list[int]:
    """Up to `limit` fires of `schedule` in (start_ms, end_ms], in order: the catch-up list.

    The bound is the caller's: a clock that jumped a year must not make a minutely schedule
    produce half a million fires (the caller decides whether to run the last few or one)."""
    if not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
    fires: list[int] = []
    t = start_ms
    while len(fires) < limit:
        fire = schedule.next_fire(t)
        if fire is None or fire > end_ms:
            break
        fires.append(fire)
        t = fire
    return fires
