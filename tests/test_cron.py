"""node/core/cron.py: cron expressions and intervals, the fires of periodic jobs ("schedules").

A table of expressions with their next fires (syntax, macros, the day-of-month / day-of-week OR
rule, month ends, leap days, daylight-saving gaps and folds in three zones), the errors (each
message names the problem), and properties checked by hypothesis against oracles written here
independently of the module: a generated field is rendered as text together with the set of
values it means, and a fire is recognised minute by minute from the zone's own conversion (a
local minute that matches, at its first occurrence, or the first minute after a gap that skipped
a matching one).

Size: RAFTQ_CRON_EXAMPLES (default 60; 20 unless RAFTQ_TEST_PROFILE=full, tests/conftest.py)
scales the property tests.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from raftq.node.core import cron as cron_module
from raftq.node.core.cron import Cron, CronError, Every, every_next, fires_between, parse
from raftq.node.core.windows import load_zone

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MINUTE = 60_000
HOUR = 60 * MINUTE
EXAMPLES = int(os.environ.get("RAFTQ_CRON_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def ms(text: str) -> int:
    """An ISO time with its UTC offset (the offset says which of a fold's two times it is)."""
    return (datetime.fromisoformat(text) - EPOCH) // timedelta(milliseconds=1)


def local(instant: int, zone: str) -> str:
    """An instant as the zone's local ISO time with offset: failures read like the table."""
    return (EPOCH + timedelta(milliseconds=instant)).astimezone(load_zone(zone)).isoformat(timespec="minutes")


# ============================================================================ the table

# (spec, zone, after, the next fires in order, each from the one before). Times are local with
# their offset, so a DST case shows which side of the change each fire is on.
NY, BERLIN, LORD_HOWE = "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"
CASES = [
    # every minute; strictly after, and at second 0 even from the middle of a minute
    ("* * * * *", "UTC", "2026-01-01T00:00+00:00", ["2026-01-01T00:01+00:00", "2026-01-01T00:02+00:00"]),
    ("* * * * *", "UTC", "2026-01-01T00:00:30.5+00:00", ["2026-01-01T00:01+00:00"]),
    ("* * * * *", "UTC", "2026-12-31T23:59+00:00", ["2027-01-01T00:00+00:00"]),
    ("*/15 * * * *", "UTC", "2026-01-01T00:07+00:00",
     ["2026-01-01T00:15+00:00", "2026-01-01T00:30+00:00", "2026-01-01T00:45+00:00", "2026-01-01T01:00+00:00"]),
    # macros (any case)
    ("@hourly", "UTC", "2026-01-01T10:30+00:00", ["2026-01-01T11:00+00:00", "2026-01-01T12:00+00:00"]),
    ("@daily", "UTC", "2026-01-01T00:00+00:00", ["2026-01-02T00:00+00:00", "2026-01-03T00:00+00:00"]),
    ("@midnight", "UTC", "2026-01-31T23:59+00:00", ["2026-02-01T00:00+00:00"]),
    ("@weekly", "UTC", "2026-01-01T00:00+00:00", ["2026-01-04T00:00+00:00", "2026-01-11T00:00+00:00"]),  # Sundays
    ("@monthly", "UTC", "2026-01-15T00:00+00:00", ["2026-02-01T00:00+00:00", "2026-03-01T00:00+00:00"]),
    ("@yearly", "UTC", "2026-01-01T00:00+00:00", ["2027-01-01T00:00+00:00", "2028-01-01T00:00+00:00"]),
    ("@ANNUALLY", "UTC", "2025-12-31T23:59+00:00", ["2026-01-01T00:00+00:00"]),
    ("@daily", BERLIN, "2026-01-01T00:00+01:00", ["2026-01-02T00:00+01:00"]),       # local midnight
    # ranges, lists, steps, `a/s`
    ("0 9-11 * * *", "UTC", "2026-01-01T10:30+00:00",
     ["2026-01-01T11:00+00:00", "2026-01-02T09:00+00:00", "2026-01-02T10:00+00:00"]),
    ("5,10,50 * * * *", "UTC", "2026-01-01T00:10+00:00", ["2026-01-01T00:50+00:00", "2026-01-01T01:05+00:00"]),
    ("10-30/10 8 * * *", "UTC", "2026-01-01T08:00+00:00",
     ["2026-01-01T08:10+00:00", "2026-01-01T08:20+00:00", "2026-01-01T08:30+00:00", "2026-01-02T08:10+00:00"]),
    ("7/20 * * * *", "UTC", "2026-01-01T00:00+00:00",
     ["2026-01-01T00:07+00:00", "2026-01-01T00:27+00:00", "2026-01-01T00:47+00:00", "2026-01-01T01:07+00:00"]),
    ("0 0 1 */4 *", "UTC", "2026-01-01T00:00+00:00", ["2026-05-01T00:00+00:00", "2026-09-01T00:00+00:00"]),
    ("0 22 * * 1-5", "UTC", "2026-01-02T23:00+00:00", ["2026-01-05T22:00+00:00"]),          # Fri -> Mon
    ("0 0 * * 0-7/2", "UTC", "2026-01-01T00:00+00:00",                                        # Sun Tue Thu Sat
     ["2026-01-03T00:00+00:00", "2026-01-04T00:00+00:00", "2026-01-06T00:00+00:00", "2026-01-08T00:00+00:00"]),
    # names, any case, in lists and ranges
    ("0 0 * jan,JUL Mon-fri", "UTC", "2026-01-30T00:00+00:00",
     ["2026-07-01T00:00+00:00", "2026-07-02T00:00+00:00"]),
    ("0 0 1 Feb-Apr *", "UTC", "2026-01-01T00:00+00:00",
     ["2026-02-01T00:00+00:00", "2026-03-01T00:00+00:00", "2026-04-01T00:00+00:00", "2027-02-01T00:00+00:00"]),
    ("0 0 * * SAT,sun", "UTC", "2026-01-01T00:00+00:00", ["2026-01-03T00:00+00:00", "2026-01-04T00:00+00:00"]),
    # day-of-week 7 is Sunday, like 0
    ("0 0 * * 7", "UTC", "2026-01-01T00:00+00:00", ["2026-01-04T00:00+00:00", "2026-01-11T00:00+00:00"]),
    ("0 0 * * 5-7", "UTC", "2026-01-01T00:00+00:00",
     ["2026-01-02T00:00+00:00", "2026-01-03T00:00+00:00", "2026-01-04T00:00+00:00", "2026-01-09T00:00+00:00"]),
    # both day fields restricted: either matches (the 13th, a Tuesday, and every Friday)
    ("0 0 13 * FRI", "UTC", "2026-01-01T00:00+00:00",
     ["2026-01-02T00:00+00:00", "2026-01-09T00:00+00:00", "2026-01-13T00:00+00:00", "2026-01-16T00:00+00:00"]),
    ("0 0 1,15 * 3", "UTC", "2026-01-12T00:00+00:00",       # 14 Wed, 15 Thu, 21 Wed, 28 Wed, 1 Feb Sun
     ["2026-01-14T00:00+00:00", "2026-01-15T00:00+00:00", "2026-01-21T00:00+00:00", "2026-01-28T00:00+00:00",
      "2026-02-01T00:00+00:00"]),
    # only one restricted: only it counts (`*` day-of-month with Friday: Fridays only)
    ("0 0 * * FRI", "UTC", "2026-02-12T00:00+00:00", ["2026-02-13T00:00+00:00", "2026-02-20T00:00+00:00"]),
    ("0 0 13 * *", "UTC", "2026-01-13T00:00+00:00", ["2026-02-13T00:00+00:00"]),
    # a field counts as unrestricted only when it is exactly `*`: `*/10` with Monday is OR
    ("0 0 */10 * MON", "UTC", "2026-01-01T00:00+00:00",     # 5 Mon, 11, 12 Mon, 19 Mon, 21
     ["2026-01-05T00:00+00:00", "2026-01-11T00:00+00:00", "2026-01-12T00:00+00:00", "2026-01-19T00:00+00:00",
      "2026-01-21T00:00+00:00"]),
    # month ends: the 31st only in months that have one; the 30th skips February
    ("0 0 31 * *", "UTC", "2026-01-31T00:00+00:00",
     ["2026-03-31T00:00+00:00", "2026-05-31T00:00+00:00", "2026-07-31T00:00+00:00", "2026-08-31T00:00+00:00",
      "2026-10-31T00:00+00:00", "2026-12-31T00:00+00:00", "2027-01-31T00:00+00:00"]),
    ("0 0 30 * *", "UTC", "2026-01-30T00:00+00:00", ["2026-03-30T00:00+00:00"]),
    ("59 23 31 12 *", "UTC", "2026-12-31T23:59+00:00", ["2027-12-31T23:59+00:00"]),
    # leap days: every fourth year, and 2100 is not a leap year (the 8-year wait)
    ("0 12 29 2 *", "UTC", "2025-01-01T00:00+00:00", ["2028-02-29T12:00+00:00", "2032-02-29T12:00+00:00"]),
    ("0 12 29 2 *", "UTC", "2028-02-29T12:00+00:00", ["2032-02-29T12:00+00:00"]),
    ("0 0 29 2 *", "UTC", "2096-02-29T00:00+00:00", ["2104-02-29T00:00+00:00"]),
    ("0 0 29 2 *", "UTC", "2000-01-01T00:00+00:00", ["2000-02-29T00:00+00:00"]),        # 2000 is one

    # --- New York, spring forward 2026-03-08: 02:00 EST jumps to 03:00 EDT
    # a job at 02:30 fires once, at 03:00 EDT, then at 02:30 EDT again
    ("30 2 * * *", NY, "2026-03-07T03:00-05:00",
     ["2026-03-08T03:00-04:00", "2026-03-09T02:30-04:00"]),
    # hourly: 02:00 does not exist and is the same fire as 03:00
    ("0 * * * *", NY, "2026-03-08T00:30-05:00",
     ["2026-03-08T01:00-05:00", "2026-03-08T03:00-04:00", "2026-03-08T04:00-04:00"]),
    # every 15 minutes: 02:00, 02:15, 02:30, 02:45 and 03:00 are one fire at 03:00
    ("*/15 * * * *", NY, "2026-03-08T01:30-05:00",
     ["2026-03-08T01:45-05:00", "2026-03-08T03:00-04:00", "2026-03-08T03:15-04:00"]),
    # only hour 2: its fire comes at the end of the gap, once
    ("*/20 2 * * *", NY, "2026-03-07T02:40-05:00", ["2026-03-08T03:00-04:00", "2026-03-09T02:00-04:00"]),
    # --- New York, fall back 2026-11-01: 02:00 EDT goes back to 01:00 EST (01:00-01:59 twice)
    # 01:30 fires once, at the first 01:30 (EDT); the second (EST) does not fire
    ("30 1 * * *", NY, "2026-10-31T12:00-04:00", ["2026-11-01T01:30-04:00", "2026-11-02T01:30-05:00"]),
    # asked from inside the second occurrence: tomorrow
    ("30 1 * * *", NY, "2026-11-01T01:10-05:00", ["2026-11-02T01:30-05:00"]),
    # hourly across the fold: 00:00 EDT, 01:00 EDT, 02:00 EST (no second 01:00, two hours apart)
    ("0 * * * *", NY, "2026-10-31T23:30-04:00",
     ["2026-11-01T00:00-04:00", "2026-11-01T01:00-04:00", "2026-11-01T02:00-05:00", "2026-11-01T03:00-05:00"]),
    ("0 * * * *", NY, "2026-11-01T01:00-05:00", ["2026-11-01T02:00-05:00"]),
    ("*/20 * * * *", NY, "2026-11-01T00:50-04:00",
     ["2026-11-01T01:00-04:00", "2026-11-01T01:20-04:00", "2026-11-01T01:40-04:00", "2026-11-01T02:00-05:00"]),

    # --- Berlin, spring forward 2026-03-29: 02:00 CET jumps to 03:00 CEST
    ("30 2 * * *", BERLIN, "2026-03-28T12:00+01:00", ["2026-03-29T03:00+02:00", "2026-03-30T02:30+02:00"]),
    ("0 * * * *", BERLIN, "2026-03-29T01:30+01:00", ["2026-03-29T03:00+02:00", "2026-03-29T04:00+02:00"]),
    # --- Berlin, fall back 2026-10-25: 03:00 CEST goes back to 02:00 CET (02:00-02:59 twice)
    ("30 2 * * *", BERLIN, "2026-10-24T12:00+02:00", ["2026-10-25T02:30+02:00", "2026-10-26T02:30+01:00"]),
    ("0 * * * *", BERLIN, "2026-10-25T01:30+02:00",
     ["2026-10-25T02:00+02:00", "2026-10-25T03:00+01:00", "2026-10-25T04:00+01:00"]),
    ("@daily", BERLIN, "2026-10-24T00:00+02:00", ["2026-10-25T00:00+02:00", "2026-10-26T00:00+01:00"]),

    # --- Lord Howe: half-hour DST. 2026-10-04 02:00 jumps to 02:30; 2026-04-05 02:00 back to 01:30
    ("15 2 * * *", LORD_HOWE, "2026-10-03T12:00+10:30", ["2026-10-04T02:30+11:00", "2026-10-05T02:15+11:00"]),
    ("45 1 * * *", LORD_HOWE, "2026-04-04T12:00+11:00", ["2026-04-05T01:45+11:00", "2026-04-06T01:45+10:30"]),
    ("0,30 * * * *", LORD_HOWE, "2026-04-05T00:45+11:00",      # 01:30 once (+11), then 02:00 (+10:30)
     ["2026-04-05T01:00+11:00", "2026-04-05T01:30+11:00", "2026-04-05T02:00+10:30"]),
]


@pytest.mark.parametrize("spec, zone, after, expected", CASES,
                         ids=[f"{s}|{z}|{a}" for s, z, a, _ in CASES])
def test_next_fires(spec, zone, after, expected):
    cron = parse(spec, zone)
    got, t = [], ms(after)
    for _ in expected:
        t = cron.next_fire(t)
        assert t is not None
        got.append(local(t, zone))
    assert got == [local(ms(e), zone) for e in expected]
    assert [ms(e) for e in expected] == fires_between(cron, ms(after), ms(expected[-1]), len(expected) + 5)


def test_gap_fire_is_whole_minute_and_once():
    """The 02:30 job on the New York spring-forward day: exactly one fire that day, 07:00 UTC."""
    cron = parse("30 2 * * *", NY)
    day = fires_between(cron, ms("2026-03-08T00:00-05:00"), ms("2026-03-09T00:00-04:00"), 10)
    assert day == [ms("2026-03-08T07:00+00:00")]


def test_fold_day_fires_once():
    """The 01:30 job on the New York fall-back day (25 hours long): one fire, at 05:30 UTC."""
    cron = parse("30 1 * * *", NY)
    day = fires_between(cron, ms("2026-11-01T00:00-04:00"), ms("2026-11-02T00:00-05:00"), 10)
    assert day == [ms("2026-11-01T05:30+00:00")]
    start, end = ms("2026-11-01T00:00-04:00") - 1, ms("2026-11-02T00:00-05:00") - 1
    hourly = fires_between(parse("0 * * * *", NY), start, end, 50)
    assert len(hourly) == 24                   # a 25-hour day, the repeated 01:00 left out
    assert ms("2026-11-01T01:00-05:00") not in hourly


def test_horizon_and_edges():
    """None only past the horizon or year 9999; the worst case is quick."""
    leap = parse("0 0 29 2 *")
    assert leap.next_fire(ms("9997-01-01T00:00+00:00")) is None          # 9996 was the last one
    assert parse("* * * * *").next_fire(ms("9999-12-31T23:59+00:00")) is None
    assert parse("* * * * *").next_fire(10**20) is None
    assert parse("* * * * *", NY).next_fire(-10**20) is None
    assert parse("* * * * *").next_fire(-1) == 0
    assert parse("* * * * *").next_fire(-MINUTE) == 0
    for spec, after in (("0 0 29 2 *", "2096-02-29T00:00+00:00"), ("0 0 29 2 *", "9997-01-01T00:00+00:00"),
                        ("59 23 31 12 *", "2026-12-31T23:59+00:00"), ("0 0 31 * *", "2026-01-31T00:00+00:00")):
        cron, t = parse(spec, NY), ms(after)
        best = min(_timed(cron, t) for _ in range(5))
        assert best < 0.02, (spec, best)        # ~0.1 ms measured; generous for a shared CPU


def _timed(cron: Cron, t: int) -> float:
    start = time.perf_counter()
    cron.next_fire(t)
    return time.perf_counter() - start


# ============================================================================ errors

ERRORS = [
    ("61 * * * *", "UTC", "minute field '61' is out of range 0-59"),
    ("0 24 * * *", "UTC", "hour field '24' is out of range 0-23"),
    ("0 0 0 * *", "UTC", "day-of-month field '0' is out of range 1-31"),
    ("0 0 32 * *", "UTC", "day-of-month field '32' is out of range 1-31"),
    ("0 0 * 13 *", "UTC", "month field '13' is out of range 1-12"),
    ("0 0 * * 8", "UTC", "day-of-week field '8' is out of range 0-7"),
    ("5-70 * * * *", "UTC", "minute field '70' is out of range 0-59"),
    ("*/0 * * * *", "UTC", "minute field '*/0': step 0 is out of range 1-60"),
    ("0 */25 * * *", "UTC", "hour field '*/25': step 25 is out of range 1-24"),
    ("*/x * * * *", "UTC", "minute field '*/x': step 'x' is not a number"),
    ("1-5/ * * * *", "UTC", "minute field '1-5/': step '' is not a number"),
    ("1,,2 * * * *", "UTC", "minute field '1,,2' has an empty item"),
    ("0 0 , * *", "UTC", "day-of-month field ',' has an empty item"),
    ("/5 * * * *", "UTC", "minute field '/5': a value is missing"),
    ("0 3- * * *", "UTC", "hour field '3-': a value is missing"),
    ("5-3 * * * *", "UTC", "minute field '5-3': the range runs backwards (5 > 3)"),
    ("0 0 * FOO *", "UTC", "month field 'FOO' is not a number or a name (JAN-DEC)"),
    ("0 0 * * MONDAY", "UTC", "day-of-week field 'MONDAY' is not a number or a name (SUN-SAT)"),
    ("0 x * * *", "UTC", "hour field 'x' is not a number"),
    ("0 -1 * * *", "UTC", "hour field '-1': a value is missing"),
    ("0 0 * * * *", "UTC", "5 fields (minute hour day-of-month month day-of-week; no seconds), got 6"),
    ("0 0 * *", "UTC", "got 4"),
    ("", "UTC", "got 0"),
    ("@reboot", "UTC", "unknown cron macro '@reboot'"),
    ("@daily 5", "UTC", "unknown cron macro '@daily 5'"),
    ("0 0 30 2 *", "UTC", "'0 0 30 2 *' never fires: no month of month field '2' has a day 30"),
    ("0 0 31 4 *", "UTC", "'0 0 31 4 *' never fires: no month of month field '4' has a day 31"),
    ("0 0 31 4,6,9,11 *", "UTC", "never fires"),
    ("0 0 30,31 feb *", "UTC", "never fires: no month of month field 'feb' has a day 30 or later"),
    ("* * * * *", "Mars/Olympus_Mons", "time zone: unknown time zone 'Mars/Olympus_Mons'"),
    ("* * * * *", "../../etc/passwd", "time zone: not a time zone name"),
    ("* * * * *", "", "time zone: not a time zone name"),
    ("0 " * 100 + "0", "UTC", "the cron expression is 201 characters long, at most 200"),
    (5, "UTC", "a cron expression must be a string, got int"),
]


@pytest.mark.parametrize("spec, zone, message", ERRORS, ids=[str(s)[:40] + "|" + z for s, z, _ in ERRORS])
def test_errors(spec, zone, message):
    with pytest.raises(CronError) as e:
        parse(spec, zone)
    assert message in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("spec", ["0 0 29 2 *", "0 0 30 2 MON", "0 0 31 2,3 *", "0 0 30,31 1-12 *",
                                  "59 23 31 DEC SAT", " 0  0 * * *\t", "0 0 1/10 * *", "0 0 * * 7-7",
                                  "00 08 01 01 00", "*/60 */24 */31 */12 */7"])
def test_accepted(spec):
    cron = parse(spec)
    assert cron.next_fire(ms("2026-01-01T00:00+00:00")) is not None


def test_interval_errors():
    with pytest.raises(CronError, match="every_ms must be positive, got 0"):
        every_next(0, 0, 5)
    with pytest.raises(CronError, match="every_ms must be positive, got -5"):
        Every(0, -5)
    with pytest.raises(CronError, match="every_ms must be an integer, got float"):
        Every(0, 1.5)
    with pytest.raises(CronError, match="anchor_ms must be an integer, got bool"):
        every_next(True, 10, 5)
    with pytest.raises(ValueError, match="limit"):
        fires_between(Every(0, 10), 0, 100, -1)


# ============================================================================ oracles

class Matcher:
    """The meaning of a generated expression, written independently of the module."""

    def __init__(self, minutes, hours, days=None, months=None, weekdays=None):
        self.minutes, self.hours = set(minutes), set(hours)
        self.days = set(range(1, 32)) if days is None else set(days)        # None: the field is `*`
        self.months = set(range(1, 13)) if months is None else set(months)
        self.weekdays = set(range(7)) if weekdays is None else set(weekdays)
        self.either = days is not None and weekdays is not None

    def day(self, d: datetime) -> bool:
        dom, dow = d.day in self.days, d.isoweekday() % 7 in self.weekdays
        return d.month in self.months and ((dom or dow) if self.either else (dom and dow))

    def __call__(self, wall: datetime) -> bool:
        return wall.minute in self.minutes and wall.hour in self.hours and self.day(wall)


def is_fire(instant: int, zone: str, match: Matcher) -> bool:
    """Whether the whole minute `instant` is a fire: the local minute matches and this is its
    first occurrence (fold 0), or the minutes just before were skipped by a gap and one of the
    skipped ones matches."""
    return fires_at(walls_at(instant, zone), match)


def walls_at(instant: int, zone: str) -> tuple[datetime, int, datetime]:
    """The local wall time of `instant`, its fold, and the wall time a minute earlier."""
    tz = load_zone(zone)
    here = (EPOCH + timedelta(milliseconds=instant)).astimezone(tz)
    before = (EPOCH + timedelta(milliseconds=instant - MINUTE)).astimezone(tz)
    return here.replace(tzinfo=None, fold=0), here.fold, before.replace(tzinfo=None, fold=0)


def fires_at(walls: tuple[datetime, int, datetime], match: Matcher) -> bool:
    wall, fold, wall_before = walls
    if match(wall) and fold == 0:
        return True
    skipped = (wall - wall_before) // timedelta(minutes=1) - 1
    return any(match(wall_before + timedelta(minutes=k)) for k in range(1, skipped + 1))


@st.composite
def field(draw, low: int, last: int, names: tuple[str, ...] = (), high: int | None = None):
    """(text, values) for one field: every syntax, and the values it means."""
    high = last if high is None else high

    def value():
        v = draw(st.integers(low, high))
        if names and v - low < len(names) and draw(st.booleans()):
            name = names[v - low]
            return draw(st.sampled_from([name, name.upper(), name.capitalize()])), v
        return str(v), v

    kind = draw(st.sampled_from(["star", "value", "range", "star_step", "range_step", "start_step", "list"]))
    if kind == "star":
        return "*", set(range(low, last + 1))
    if kind == "star_step":
        step = draw(st.integers(1, last - low + 1))
        return f"*/{step}", set(range(low, last + 1, step))
    if kind == "list":
        item = field(low, last, names, high).filter(lambda f: f[0] != "*")
        parts = [draw(item) for _ in range(draw(st.integers(2, 3)))]
        return ",".join(p[0] for p in parts), set().union(*(p[1] for p in parts))
    (a_text, a), (b_text, b) = value(), value()
    if kind == "value":
        return a_text, {a}
    step = draw(st.integers(1, last - low + 1))
    if kind == "start_step":                           # a through the field's end (7/s: Sunday)
        return f"{a_text}/{step}", set(range(a, max(a, last) + 1, step))
    (a_text, a), (b_text, b) = sorted([(a_text, a), (b_text, b)], key=lambda p: p[1])
    if kind == "range":
        return f"{a_text}-{b_text}", set(range(a, b + 1))
    return f"{a_text}-{b_text}/{step}", set(range(a, b + 1, step))


def meaning(f):
    """The values a generated field means for Matcher, None when it is `*` (or left out)."""
    return None if f is None or f[0] == "*" else f[1]


def dow(f):
    """A day-of-week field: 7 means Sunday."""
    text, values = f
    return text, {v % 7 for v in values}


MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
ZONES = ["UTC", NY, BERLIN, LORD_HOWE]
# The 2026 transitions (in UTC) of those zones, gap then fold. (zone, time) pairs are drawn
# mostly just before one of its zone's transitions, so that the next fires cross it.
CHANGES = [(NY, "2026-03-08T07:00"), (NY, "2026-11-01T06:00"), (BERLIN, "2026-03-29T01:00"),
           (BERLIN, "2026-10-25T01:00"), (LORD_HOWE, "2026-10-03T15:30"), (LORD_HOWE, "2026-04-04T15:00")]
YEAR_2026 = st.tuples(st.sampled_from(ZONES),
                      st.integers(ms("2026-01-01T00:00+00:00"), ms("2027-01-01T00:00+00:00")))
NEAR_CHANGE = st.builds(lambda change, d: (change[0], ms(change[1] + "+00:00") + d),
                        st.sampled_from(CHANGES), st.integers(-4 * HOUR, HOUR))
WHEN = st.one_of(YEAR_2026, NEAR_CHANGE, NEAR_CHANGE, NEAR_CHANGE)
# hour fields, often the hours that the transitions above skip or repeat (1 and 2)
HOURS = st.one_of(field(0, 23),
                  st.sampled_from([("2", {2}), ("1", {1}), ("1-2", {1, 2}), ("2,3", {2, 3}), ("2/22", {2})]))


# ============================================================================ properties

@SETTINGS
@given(minute=field(0, 59), hour=HOURS, when=WHEN)
def test_next_fire_is_the_next_fire(minute, hour, when):
    """Minute and hour fields, every day: the answer is after t, a whole minute, a fire, and no
    whole minute between t and it is a fire (checked one minute at a time)."""
    zone, t = when
    cron, match = parse(f"{minute[0]} {hour[0]} * * *", zone), Matcher(minute[1], hour[1])
    nxt = cron.next_fire(t)
    assert nxt is not None and nxt > t and nxt % MINUTE == 0
    assert is_fire(nxt, zone, match), local(nxt, zone)
    for u in range(t // MINUTE * MINUTE + MINUTE, nxt, MINUTE):
        assert not is_fire(u, zone, match), (local(u, zone), local(nxt, zone))


GRID_SPECS = [("*/15 * * * *", Matcher(range(0, 60, 15), range(24))), ("0 * * * *", Matcher([0], range(24))),
              ("* 2 * * *", Matcher(range(60), [2])), ("30 1-3 * * *", Matcher([30], [1, 2, 3])),
              ("0,59 1,2 * * *", Matcher([0, 59], [1, 2]))]
GRID_SPECS += [(f"{m} {h} * * *", Matcher([m], [h])) for h in (1, 2) for m in (0, 15, 30, 45)]


@pytest.mark.parametrize("zone, change", CHANGES, ids=[f"{z}|{c}" for z, c in CHANGES])
def test_next_fire_around_each_transition(zone, change):
    """Deterministic companion of the property above: simple expressions, asked every 20 minutes
    from 3 hours before a transition to 1 hour after, against the minute-by-minute oracle."""
    center = ms(change + "+00:00")
    walls = {u: walls_at(u, zone) for u in range(center - 3 * HOUR, center + 27 * HOUR, MINUTE)}
    for spec, match in GRID_SPECS:
        cron = parse(spec, zone)
        fires = {u for u, w in walls.items() if fires_at(w, match)}
        for t in range(center - 3 * HOUR, center + HOUR + 1, 20 * MINUTE):
            expected = min(u for u in fires if u > t)
            assert cron.next_fire(t) == expected, (spec, local(t, zone), local(expected, zone))


@SETTINGS
@given(minute=field(0, 59).filter(lambda f: len(f[1]) <= 3), hour=field(0, 23).filter(lambda f: len(f[1]) <= 3),
       dom=st.none() | field(1, 31), month=st.none() | field(1, 12, MONTH_NAMES),
       weekday=st.none() | field(0, 6, DAY_NAMES, high=7).map(dow),
       t=st.integers(ms("1990-01-01T00:00+00:00"), ms("2110-01-01T00:00+00:00")))
def test_full_expressions_in_utc(minute, hour, dom, month, weekday, t):
    """All five fields in UTC, checked day by day against the oracle (a `None` field is `*`);
    an expression refused as never firing has indeed no day in any year."""
    text = " ".join(f[0] if f else "*" for f in (minute, hour, dom, month, weekday))
    match = Matcher(minute[1], hour[1], meaning(dom), meaning(month), meaning(weekday))
    try:
        cron = parse(text)
    except CronError as e:
        assert "never fires" in str(e)
        days = [datetime(y, 1, 1) + timedelta(days=k) for y in (2023, 2024) for k in range(365)]
        assert not any(match.day(d) for d in days)     # 2024: a leap year, so 29 Feb is in
        return
    nxt = cron.next_fire(t)
    assert nxt is not None and nxt > t and nxt % MINUTE == 0
    assert match((EPOCH + timedelta(milliseconds=nxt)).replace(tzinfo=None)), local(nxt, "UTC")
    day_ms = t // (24 * HOUR) * (24 * HOUR)
    while day_ms <= nxt:
        if match.day((EPOCH + timedelta(milliseconds=day_ms)).replace(tzinfo=None)):
            for u in (day_ms + h * HOUR + m * MINUTE for h in match.hours for m in match.minutes):
                assert not t < u < nxt, (text, local(u, "UTC"), local(nxt, "UTC"))
        day_ms += 24 * HOUR


@SETTINGS
@given(minute=field(0, 59), hour=HOURS, dom=st.none() | field(1, 31),
       weekday=st.none() | field(0, 6, DAY_NAMES, high=7).map(dow),
       when=WHEN)
def test_fires_between_chains_next_fire(minute, hour, dom, weekday, when):
    """fires_between is next_fire applied in a chain: increasing, inside (start, end], each a fire."""
    zone, t = when
    text = " ".join(f[0] if f else "*" for f in (minute, hour, dom, None, weekday))
    match = Matcher(minute[1], hour[1], meaning(dom), None, meaning(weekday))
    cron = parse(text, zone)
    end = t + 3 * 24 * HOUR
    fires = fires_between(cron, t, end, 20)
    assert all(t < f <= end for f in fires) and fires == sorted(set(fires))
    chain, x = [], t
    while len(chain) < len(fires):
        x = cron.next_fire(x)
        chain.append(x)
    assert chain == fires
    assert all(is_fire(f, zone, match) for f in fires)
    if len(fires) < 20:
        later = cron.next_fire(fires[-1] if fires else t)
        assert later is None or later > end


@SETTINGS
@given(anchor=st.integers(-10**13, 10**13), every=st.integers(1, 10**10),
       after=st.integers(-2 * 10**13, 2 * 10**13))
def test_every_next(anchor, every, after):
    nxt = every_next(anchor, every, after)
    k, rest = divmod(nxt - anchor, every)
    assert rest == 0 and k >= 1 and nxt > after
    assert k == 1 or nxt - every <= after             # the first one past `after`
    if after < anchor:
        assert nxt == anchor + every
    assert Every(anchor, every).next_fire(after) == nxt
    few = fires_between(Every(anchor, every), after, nxt + 4 * every, 10)
    assert few == [nxt + i * every for i in range(5)]
    assert fires_between(Every(anchor, every), after, nxt + 4 * every, 3) == few[:3]
    assert fires_between(Every(anchor, every), after, nxt - 1, 10) == []


def test_every_examples():
    assert every_next(1000, 100, 0) == 1100                   # before the anchor: the first one
    assert every_next(1000, 100, 1000) == 1100                # the anchor is not a fire
    assert every_next(1000, 100, 1099) == 1100
    assert every_next(1000, 100, 1100) == 1200                # strictly after
    assert fires_between(Every(0, MINUTE), 0, HOUR, 1000) == list(range(MINUTE, HOUR + 1, MINUTE))
    assert fires_between(Every(0, MINUTE), HOUR, 0, 10) == []
    assert fires_between(Every(0, MINUTE), 0, HOUR, 0) == []


# ============================================================================ determinism

PROBES = [("*/7 3-5 * * *", "UTC"), ("30 2 * * *", NY), ("0 * * * *", NY), ("0 0 13 * FRI", BERLIN),
          ("15 2 * * *", LORD_HOWE), ("0 12 29 2 *", "Asia/Kolkata"), ("@weekly", "Pacific/Chatham")]
PROBE_TIMES = [ms("2026-03-08T06:00+00:00"), ms("2026-10-31T23:00+00:00"), ms("2025-12-31T23:59:59+00:00")]


def _probe_fires() -> list:
    out = []
    for spec, zone in PROBES:
        cron = parse(spec, zone)
        for t in PROBE_TIMES:
            out.append(fires_between(cron, t, t + 40 * 24 * HOUR, 12))
    return out


def test_same_inputs_same_outputs_and_pickling():
    first = _probe_fires()
    assert _probe_fires() == first
    for spec, zone in PROBES:
        cron = parse(spec, zone)
        for copy in (pickle.loads(pickle.dumps(cron)), Cron(cron.spec, cron.zone)):
            assert copy == cron and hash(copy) == hash(cron) and repr(copy) == repr(cron)
            assert (copy.spec, copy.zone) == (spec, zone)
            assert [copy.next_fire(t) for t in PROBE_TIMES] == [cron.next_fire(t) for t in PROBE_TIMES]
    assert parse("@daily") != parse("0 0 * * *")          # equal as (spec, zone) only
    assert parse("@daily", "UTC") != parse("@daily", NY)
    assert pickle.loads(pickle.dumps(Every(5, 7))) == Every(5, 7)


def test_host_time_zone_plays_no_part():
    """Another process with another host zone and no zoneinfo path computes the same fires."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_cron; "
            "print(json.dumps(test_cron._probe_fires()))")
    env = {**os.environ, "TZ": "Pacific/Kiritimati", "PYTHONTZPATH": "/nonexistent"}
    out = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__)], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    import json
    assert json.loads(out.stdout) == _probe_fires()


def test_module_reads_no_clock():
    source = open(cron_module.__file__, encoding="utf-8").read()
    for forbidden in ("time.time", "monotonic", ".now(", "utcnow", "today(", "import random", "open("):
        assert forbidden not in source, forbidden
