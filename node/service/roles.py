"""NodeService's time and roles: the leader's stamp, who leads and where, what a change of Raft
role does (parked reserves leave, sessions are told where to go), and the [testing] clock strobe."""
from __future__ import annotations

import asyncio
import logging
import time

from ..replication import fault_hooks
from ..replication.proposer import wall_ms
from ..replication.replica import RAFT_ROLES

log = logging.getLogger("raftq.node")


class TimeAndRoles:
    """Mixin of NodeService: time and roles."""

    def _init_time(self):
        self.clock_offset_ms = self.settings.testing.clock_offset_ms  # [testing]: chaos clock-skew
        self.strober: asyncio.Task | None = None                      # [testing]: chaos clock-strobe
        self.last_stamp = 0

    def stamp(self) -> int:
        """The leader's stamp: wall clock, never behind replicated time or an earlier stamp."""
        now = max(wall_ms() + self.clock_offset_ms, self.state.machine.clock, self.last_stamp)
        self.last_stamp = now
        return now

    def is_leader(self) -> bool:
        return self.replica.is_leader() and not self.stopping and not self.replica.removed

    def leader_member(self):
        """The leader as a member (Peer: id, raft, url), or None (none known, or this node removed)."""
        if self.replica.removed:
            return None
        raft = self.replica.leader_raft()
        if raft is None:
            return None
        return self.replica.member_by_raft(raft) or self.settings.peer_by_raft(raft)

    def leader_url(self) -> str | None:
        """The URL the leader advertises (what clients are sent to); the nodes call it at
        leader_peer_url() (node/service/members.py)."""
        peer = self.leader_member()
        return peer.url if peer else None

    def others(self):
        """The other members in force."""
        return tuple(p for p in self.replica.members() if p.raft != self.settings.raft)

    async def strobe_loop(self):
        """[testing] clock_strobe (node/replication/fault_hooks.py): while the strobe file is there, the
        clock offset flips between +A and -A every period; stamp() reads the attribute as ever,
        and never goes behind replicated time or an earlier stamp."""
        base = self.clock_offset_ms
        sign = 1
        while not self.stopping:
            strobe = fault_hooks.read_strobe(self.settings.data_dir)
            if strobe is None:
                self.clock_offset_ms = base
                await asyncio.sleep(0.1)
                continue
            amplitude, period = strobe
            end = time.monotonic() + 0.5            # read the file again twice a second
            while time.monotonic() < end and not self.stopping:
                self.clock_offset_ms = base + sign * amplitude
                sign = -sign
                await asyncio.sleep(period / 1000.0)

    def _on_state_changed_thread(self, old, new):
        try:
            self.loop.call_soon_threadsafe(self._on_state_changed, old, new)
        except RuntimeError:
            pass

    def _on_state_changed(self, old, new):
        self.leader_epoch += 1
        # Role names, not the Raft layer's numbers: an operator reads this line.
        log.info("raft role %s -> %s", RAFT_ROLES.get(old, old), RAFT_ROLES.get(new, new))
        self._wake_all()
        if RAFT_ROLES.get(new) == "leader":
            self.workers_seen.lead()
        elif RAFT_ROLES.get(old) == "leader":
            self.workers_seen.follow()
        if RAFT_ROLES.get(old) == "leader" and RAFT_ROLES.get(new) != "leader":
            self._leadership_lost()

    def _leadership_lost(self):
        url = self.leader_url() or ""
        for hook in self.leadership_lost_hooks:
            self.loop.create_task(hook(url if url != self.settings.url else ""))
