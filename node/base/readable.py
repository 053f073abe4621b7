"""Waiting on the event loop for a descriptor to become readable, without a thread."""
from __future__ import annotations


async def readable(loop, fd: int) -> None:
    """Return once `fd` is readable. Cancelled, it leaves no reader behind (and a readiness
    callback already queued finds its future done and does nothing)."""
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)
