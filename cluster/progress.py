"""A small progress bar for long work, drawn on stderr.

    with Progress(total=10_000, label="enqueue", unit="jobs") as bar:
        for batch in batches:
            send(batch)
            bar.update(len(batch))

It draws only when enabled: by default when the stream is a terminal; pass `enabled=True` to
force it (the CLI's `--progress`) or `enabled=False` to silence it (`--json` scripts keep their
stdout clean either way, since the bar goes to stderr). Redraws are rate-limited, the line is
rewritten in place with a carriage return, and `close()` ends it with a newline and an optional
summary. With `total=None` it shows a running count and rate instead of a bar.
"""
from __future__ import annotations

import shutil
import sys
import time


def progress_enabled(flag: bool | None = None, stream=None) -> bool:
    """`flag` True/False wins; None means "only when the stream is a terminal"."""
    if flag is not None:
        return bool(flag)
    stream = stream if stream is not None else sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _fmt_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    def __init__(self, total: int | None, label: str = "", *, unit: str = "", enabled: bool | None = None,
                 stream=None, min_interval: float = 0.1, width: int | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = progress_enabled(enabled, self.stream)
        self.total = total if total is None else max(0, int(total))
        self.label, self.unit = label, unit
        self.min_interval = min_interval
        self.width = width
        self.done = 0
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._last_len = 0
        self._drawn = -1            # `done` at the last draw
        self._closed = False

    # ------------------------------------------------------------------ updates
    def update(self, n: int = 1) -> None:
        self.set(self.done + n)

    def set(self, done: int) -> None:
        self.done = done
        if not self.enabled or self._closed:
            return
        now = time.monotonic()
        finished = self.total is not None and self.done >= self.total
        if (finished and self._drawn != self.done) or now - self._last_draw >= self.min_interval:
            self._last_draw = now
            self._draw(now)

    def close(self, message: str | None = None) -> None:
        """End the bar (final redraw and a newline) and print `message`, if any, on the stream."""
        if self._closed:
            return
        self._closed = True
        if self.enabled:
            if self._drawn != self.done or self._last_len == 0:
                self._draw(time.monotonic())
            self.stream.write("\n")
            if message:
                self.stream.write(message + "\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ drawing
    def render(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = max(now - self.t0, 1e-9)
        rate = self.done / elapsed
        unit = f" {self.unit}" if self.unit else ""
        label = f"{self.label} " if self.label else ""
        rate_text = f"{rate:,.0f}{unit}/s" if rate >= 10 else f"{rate:,.1f}{unit}/s"
        if self.total is None:
            return f"{label}{self.done:,}{unit} ({rate_text}, {_fmt_duration(elapsed)})"
        total = self.total
        frac = 1.0 if total == 0 else min(1.0, self.done / total)
        if self.done >= total:
            tail = f"in {_fmt_duration(elapsed)}"
        elif rate > 0 and self.done > 0:
            tail = f"ETA {_fmt_duration((total - self.done) / rate)}"
        else:
            tail = "ETA ?"
        text = f"{self.done:,}/{total:,}{unit} {frac * 100:3.0f}% {rate_text} {tail}"
        cols = self.width or shutil.get_terminal_size((80, 20)).columns
        bar_width = max(10, min(40, cols - len(label) - len(text) - 4))
        filled = int(round(frac * bar_width))
        return f"{label}[{'#' * filled}{'.' * (bar_width - filled)}] {text}"

    def _draw(self, now: float) -> None:
        line = self.render(now)
        self._drawn = self.done
        pad = max(0, self._last_len - len(line))
        self._last_len = len(line)
        try:
            self.stream.write("\r" + line + " " * pad)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False
