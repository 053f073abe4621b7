"""NodeService's data disk: a failed write or sync ends the process (exit 74), the free-space
reserve (`[storage] min_free_bytes`, node-local) refuses writes and hands leadership on, and the
`disk` part of the cluster view (docs/cluster.md "Durability")."""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

from ..core.errors import error
from ..replication import fault_hooks

log = logging.getLogger("raftq.node")

# The node's exit status after a failed write or sync of its data dir (EX_IOERR): distinct from
# 1 (cannot listen) and 2 (config or limits), so a supervisor or an operator can tell a disk
# that failed from a node that was misconfigured.
EXIT_STORAGE = 74
DISK_CHECK_S = 0.5          # how often the free space of the data disk is looked at


class DataDisk:
    """Mixin of NodeService: the data disk."""

    def _init_disk(self):
        # The data disk's free-space reserve ([storage] min_free_bytes, node-local).
        self.min_free_bytes = int(self.settings.limits.storage.get("min_free_bytes", 0) or 0)
        self.free_bytes: int | None = None
        self.low_space = False
        self.disk_task: asyncio.Task | None = None
        self._measure_space()   # before Raft, which asks _may_lead, starts (the refusal: start())

    def _storage_failed(self, failure):
        """A write or sync of the data dir failed (node/raft/journal.py StorageFailure), on the
        Raft tick thread, which has stopped ticking. Nothing is retried and nothing written
        since the last good sync is acknowledged: the process exits at once, and a restart
        reads what the disk really holds (fsyncgate: a retried fsync can report success for
        pages the kernel already dropped)."""
        msg = (f"storage failure: {failure.op} of {failure.path} failed with errno {failure.errno} "
               f"({failure.strerror}); exiting with code {EXIT_STORAGE}, nothing written since the last good sync "
               "is acknowledged; a restart recovers from what the disk holds")
        try:
            log.critical(msg)
            for handler in logging.getLogger().handlers:
                handler.flush()
            print(f"raftq node {self.settings.node_id}: {msg}", file=sys.stderr, flush=True)
        finally:
            os._exit(EXIT_STORAGE)

    def _may_lead(self) -> bool:
        """Asked by Raft before this node stands for election (tick thread): not while its data
        disk is below the reserve."""
        return not self.low_space

    def _check_space(self):
        """Measure the free space, and refuse writes while it is below the reserve."""
        self._measure_space()
        self._refuse_writes_if_low()

    def _measure_space(self):
        """`free_bytes` and `low_space` (below storage.min_free_bytes), said in the log when it changes."""
        if self.min_free_bytes <= 0:
            return
        try:
            st = os.statvfs(self.settings.data_dir)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if self.settings.testing.free_space_file:       # [testing]: the disk-full fault without root
            told = fault_hooks.read_free(self.settings.data_dir)
            free = free if told is None else told
        self.free_bytes = free
        low = free < self.min_free_bytes
        if low != self.low_space:
            if low:
                log.warning("the data disk of %s has %d bytes free, below storage.min_free_bytes (%d): writes are "
                            "refused until space is freed", self.settings.data_dir, free, self.min_free_bytes)
            else:
                log.warning("the data disk of %s has %d bytes free again (storage.min_free_bytes %d): writes resume",
                            self.settings.data_dir, free, self.min_free_bytes)
        self.low_space = low

    def _refuse_writes_if_low(self):
        """The proposer's answer to every write while the disk is below its reserve (None: none)."""
        free = self.free_bytes
        self.proposer.refusal = None if not self.low_space else error(
            "unavailable", f"node {self.settings.node_id}'s data disk has {free} bytes free, below its reserve "
            f"storage.min_free_bytes ({self.min_free_bytes}): writes are refused until space is freed (leadership "
            "moves to a node with space); retry later", applied=False)

    async def disk_loop(self):
        """Watch the free space; while it is below the reserve on the leader, hand leadership to
        a peer that has space and a trusted log (asked over HTTP, every check until it moved: a
        transfer is refused while the peer has not acknowledged the leader's last entry)."""
        last_try = 0.0
        while not self.stopping:
            try:
                self._check_space()
                if self.low_space and self.replica.is_leader() and time.monotonic() - last_try >= DISK_CHECK_S:
                    last_try = time.monotonic()
                    await self._hand_over_leadership()
            except Exception:
                log.exception("disk check loop error")
            await asyncio.sleep(DISK_CHECK_S)

    async def _hand_over_leadership(self):
        import aiohttp
        from ..base.tls import peer_context
        try:
            ssl_ctx = peer_context(self.settings.tls)
        except Exception:
            ssl_ctx = None
        best = None
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=True if ssl_ctx is None else ssl_ctx)) as http:
            for p in self.others():
                if not self.replica.connected(p.raft):
                    continue
                try:
                    async with http.get(self.peer_url(p) + "/v1/cluster?digest=false",
                                        timeout=aiohttp.ClientTimeout(total=1)) as r:
                        view = await r.json()
                except Exception:
                    continue
                disk = view.get("disk") or {}
                if disk.get("low_space") or not disk.get("log_verified", True):
                    continue
                free = disk.get("free_bytes") or 0
                if best is None or free > best[0]:
                    best = (free, p)
        if best is None:
            log.warning("leader below its disk reserve, and no peer with space and a trusted log to hand "
                        "leadership to: writes stay refused")
            return
        log.warning("leader below its disk reserve: handing leadership to %s (%d bytes free)", best[1].id, best[0])
        self.replica.transfer_leadership(to=best[1].raft)

    def disk(self) -> dict:
        d = self.replica.disk()
        d.update(free_bytes=self.free_bytes, min_free_bytes=self.min_free_bytes, low_space=self.low_space)
        return d
