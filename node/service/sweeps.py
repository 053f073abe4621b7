"""NodeService's sweeps: the leader proposes a sweep (leases, deadlines, schedules, retention) when
something is due."""
from __future__ import annotations

import asyncio
import logging

from ..base import validate
from ..replication.proposer import wall_ms

log = logging.getLogger("raftq.node")


class Sweeps:
    """Mixin of NodeService: the sweep loop."""

    async def sweep_loop(self):
        """While leader: propose a sweep when something is due, at most once per
        sweep_interval_ms unless a phase hit its budget. Nothing due, nothing proposed: an idle
        cluster with a large backlog (dedup records due in a day) keeps its applied index still,
        so its nodes' digests (seconds to compute at a million jobs) can be compared at all."""
        last = -1e9
        while not self.stopping:
            interval = self.limits.sweep_interval_ms / 1000.0      # the configuration in force
            delay = interval
            try:
                if self.replica.is_leader():
                    m = self.state.machine
                    due = m.next_due_ms()
                    # The replicated clock never goes backwards: due by it is due.
                    now = max(wall_ms() + self.clock_offset_ms, m.clock)
                    mono = self.loop.time()
                    if due is not None and due <= now and mono - last >= min(interval, 0.05):
                        last = mono
                        status, body = await self.proposer.run(validate.sweep(), internal=True)
                        self.stats["sweeps"] += 1
                        if status == 200 and any(v >= self.limits.sweep_limit for v in body.values()):
                            delay = 0            # a phase hit its budget: go again at once
                            last = -1e9
                            continue
                        due = m.next_due_ms()
                        now = max(wall_ms() + self.clock_offset_ms, m.clock)
                    if due is not None:
                        delay = min(interval, max(0.0, (due - now) / 1000.0))
            except Exception:
                log.exception("sweep loop error")
            await asyncio.sleep(max(delay, 0.002))
