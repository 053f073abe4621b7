"""NodeService's state digest for `/v1/cluster`: inline for a small state, in a child forked at a
tick boundary for a large one, with the index it belongs to (docs/cluster.md)."""
from __future__ import annotations

import asyncio
import logging
import os

log = logging.getLogger("raftq.node")


def _log_digest_failure(task: asyncio.Task) -> None:
    """A digest child started for a poller that was already answered with the older digest:
    nobody awaits it, so its failure is logged here (the next call starts another)."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("state digest child failed: %r", task.exception())


class Digests:
    """Mixin of NodeService: the state digest."""

    def _init_digests(self):
        self._digest_cache = (None, None)
        self._digest_job: asyncio.Task | None = None
        self._digest_next_at = 0.0      # loop time before which no new digest child is started

    async def cluster_with_digest(self):
        """`cluster(True)` without hashing a large state on the event loop or making the caller
        wait for it. A state of more than `tuning.digest_inline_max_entries` entries (5,000:
        ~20 ms inline, less than a fork costs) is hashed in a child forked at a tick boundary
        (Replica.fork_at_tick); at 1M jobs that takes tens of seconds of CPU. The view carries
        the newest digest this node has and `digest_index`, the applied index it belongs to:
        when that is older than `last_applied`, a new child is started (one at a time) and the
        caller is answered at once with the older pair, so a poller sees the digest catch up
        instead of waiting for it. Only a node that has never hashed its state makes the caller
        wait, for the first digest. A new child starts no sooner after the last one ended than
        that one took: pollers asking for the digest of a busy large state keep a child busy at
        most half the time (each costs a core while it runs, and its fork stalls the node for as
        long as the kernel takes to copy the page tables: tens of ms at 1.6 GB)."""
        m = self.state.machine
        with self.state.lock:
            key = (self.replica.applied_index(), m.applied)
            small = len(m.jobs) + len(m.rids) + len(m.dlq) <= self.settings.tuning["digest_inline_max_entries"]
        if small or self._digest_cache[0] == key:
            return self.cluster(True)
        if (self._digest_job is None or self._digest_job.done()) and (
                self._digest_cache[0] is None or self.loop.time() >= self._digest_next_at):
            self._digest_job = self.loop.create_task(self._forked_digest())
            self._digest_job.add_done_callback(_log_digest_failure)
        if self._digest_cache[0] is None:
            await asyncio.shield(self._digest_job)
        (index, _applied), digest = self._digest_cache
        status, view = self.cluster(False)
        view["digest_index"], view["digest"] = index, digest
        return status, view

    async def _forked_digest(self):
        started = self.loop.time()
        try:
            return await self._forked_digest_once()
        finally:
            self._digest_next_at = 2 * self.loop.time() - started

    async def _forked_digest_once(self):
        rfd, wfd = os.pipe()

        def work(machine) -> int:           # in the child, which keeps wfd alone (fork_at_tick)
            os.write(wfd, f"{machine.applied} {machine.digest()}".encode())
            return 0
        try:
            pid, index, _ = await self.replica.forked_at_tick(self.loop, work, keep_fds=(wfd,))
        except BaseException:
            os.close(rfd)
            os.close(wfd)
            raise
        os.close(wfd)

        def collect() -> bytes:
            try:
                chunks = []
                while chunk := os.read(rfd, 4096):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(rfd)
                os.waitpid(pid, 0)
        raw = await self.loop.run_in_executor(None, collect)
        applied, digest = raw.decode().split()
        self._digest_cache = ((index, int(applied)), digest)
        return index, int(applied), digest
