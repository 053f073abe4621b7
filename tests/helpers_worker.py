"""Helpers for tests that run a Worker against a real cluster: poll a condition, run a worker in
a task."""
from __future__ import annotations

import asyncio
import time


async def until(cond, timeout=15.0, what="condition", interval=0.02):
    """Poll `cond` (a function, or one returning a coroutine) until it is truthy; its value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Running:
    """A worker running in a task; `finish()` stops it and returns its stats."""

    def __init__(self, worker, **run_kw):
        self.worker = worker
        self.task = asyncio.create_task(worker.run(**run_kw))

    async def finish(self, timeout=20.0):
        self.worker.stop()
        return await asyncio.wait_for(self.task, timeout)
