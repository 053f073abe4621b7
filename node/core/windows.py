"""Execution windows of a queue (`[[queues]] windows`): when reserve may hand out its jobs.

A window is `{days = ["mon", ...], start = "HH:MM", end = "HH:MM", time_zone = "Area/City"}`:
open on each listed day (in that time zone) from `start` (inclusive) to `end` (exclusive). An
`end` before `start` spans midnight: the window opens on a listed day at `start` and closes at
`end` on the next day (`days` names the day it opens). `end = "24:00"` is the end of the day;
`start == end` is refused (say `"00:00"`..`"24:00"` for a whole day). A queue with several
windows is open while any of them is.

Determinism: the state machine evaluates windows at the replicated clock (`m.clock`) with the
replicated configuration, at minute granularity (the state at `floor(clock / 60 000) * 60 000`
holds for that whole minute), so every node decides the same. The time-zone rules come from
the `tzdata` package (a dependency of raftq), never from the host's /usr/share/zoneinfo: every
node of a cluster must run the same raftq environment (the same tzdata version), as it must run
the same raftq. `load_zone` reads a zone from tzdata's files directly, so `zoneinfo`'s TZPATH
(and the PYTHONTZPATH environment variable) plays no part.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from importlib import resources
from zoneinfo import ZoneInfo

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_TIME = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])|24:00")
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")
_zones: dict[str, ZoneInfo] = {}
MINUTE_MS = 60_000


class WindowError(ValueError):
    """A window that cannot be used; the message says what (the caller prefixes the key)."""


def load_zone(key: str) -> ZoneInfo:
    """The zone `key` from the tzdata package (cached); WindowError when it has none."""
    zone = _zones.get(key)
    if zone is not None:
        return zone
    if not isinstance(key, str) or not _ZONE_KEY.fullmatch(key) or ".." in key:
        raise WindowError(f"not a time zone name: {key!r}")
    try:
        import tzdata  # noqa: F401  (the package must be there: the zones come from it)
        path = resources.files("tzdata.zoneinfo").joinpath(*key.split("/"))
        with path.open("rb") as f:
            zone = ZoneInfo.from_file(f, key=key)
    except ModuleNotFoundError as e:
        raise WindowError("the tzdata package is not installed (raftq depends on it)") from e
    except (OSError, ValueError) as e:
        raise WindowError(f"unknown time zone {key!r} (IANA names such as \"Europe/Berlin\" or \"UTC\")") from e
    _zones[key] = zone
    return zone


def _minutes(where: str, value) -> int:
    if not isinstance(value, str) or not _TIME.fullmatch(value):
        raise WindowError(f"{where}: must be \"HH:MM\" (00:00..23:59, or 24:00 for an end), got {value!r}")
    h, m = value.split(":")
    return int(h) * 60 + int(m)


class Windows:
    """A queue's windows, checked and parsed; `open_at(ms)` answers, cached per minute."""
    __slots__ = ("spec", "_parsed", "_cache")

    def __init__(self, spec):
        if not isinstance(spec, (list, tuple)) or not spec:
            raise WindowError("must be a non-empty array of tables {days, start, end, time_zone}")
        parsed = []
        for i, w in enumerate(spec):
            where = f"[{i}]"
            if not isinstance(w, dict):
                raise WindowError(f"{where}: must be a table {{days, start, end, time_zone}}")
            unknown = set(w) - {"days", "start", "end", "time_zone"}
            if unknown:
                raise WindowError(f"{where}.{sorted(unknown)[0]}: unknown key")
            days = w.get("days", list(DAYS))
            if not isinstance(days, (list, tuple)) or not days or not all(d in DAYS for d in days):
                raise WindowError(f"{where}.days: must be a non-empty list of {', '.join(DAYS)}, got {days!r}")
            if "start" not in w or "end" not in w:
                raise WindowError(f"{where}: needs start and end")
            start, end = _minutes(f"{where}.start", w["start"]), _minutes(f"{where}.end", w["end"])
            if start == 24 * 60:
                raise WindowError(f"{where}.start: 24:00 is only an end")
            if start == end:
                raise WindowError(f"{where}: start equals end (for a whole day say \"00:00\" .. \"24:00\")")
            tz = w.get("time_zone", "UTC")
            try:
                zone = load_zone(tz)
            except WindowError as e:
                raise WindowError(f"{where}.time_zone: {e}") from None
            parsed.append((frozenset(DAYS.index(d) for d in days), start, end, zone))
        self.spec = [dict(w) for w in spec]
        self._parsed = tuple(parsed)
        self._cache = (None, True)       # (minute, open): derived, one tuple so a read sees a pair

    def __eq__(self, other) -> bool:            # two Limits built from one document are equal
        return isinstance(other, Windows) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(repr(self.spec))

    def __reduce__(self):                       # pickled as its spec: zones reload from tzdata
        return Windows, (self.spec,)

    def __repr__(self) -> str:
        return f"Windows({self.spec!r})"

    def open_at(self, ms: int) -> bool:
        """Whether any window is open in the minute of `ms` (a replicated time)."""
        minute = ms // MINUTE_MS
        cached = self._cache
        if cached[0] == minute:
            return cached[1]
        value = self._evaluate(minute * MINUTE_MS)
        self._cache = (minute, value)
        return value

    def _evaluate(self, ms: int) -> bool:
        utc = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
        for days, start, end, zone in self._parsed:
            local = utc.astimezone(zone)
            day, minute = local.weekday(), local.hour * 60 + local.minute
            if start < end:
                if day in days and start <= minute < end:
                    return True
            elif (day in days and minute >= start) or ((day - 1) % 7 in days and minute < end):
                return True
        return False

    def next_change_ms(self, ms: int) -> int:
        """The start of the next minute (when the state may change next)."""
        return (ms // MINUTE_MS + 1) * MINUTE_MS
