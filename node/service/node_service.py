"""One node's operations: each API operation once, shared by HTTP (and the session transport).

Every method returns `(status, body)`. On a follower the job operations forward themselves to
the leader (forwarding.py: pass the caller's Authorization as `auth`); the other leader-only
operations assume the caller checked leadership (the HTTP layer forwards or redirects
otherwise); if leadership is lost in between, the proposal fails and maps to 503, never to a
false success.

NodeService is made of one part per job, each a mixin in a module of this folder, all working on
the one object's attributes (no call in between on the hot path):
* members.py: membership changes and this node's removal;
* config_follow.py: the configuration in force, auth's keys, seeding version 1 and schedules;
* roles.py: the leader's stamp, roles and leader, what a change of role does;
* disk.py: failed writes (exit 74), the free-space reserve, the `disk` view;
* wakeups.py: parked long-poll reserves and their wake-ups after an apply;
* forwarding.py: a follower's link to the leader: what a follower serves by forwarding;
* job_ops.py: enqueue, reserve, ack, nack, extend, release, drain (the hot path);
* operator_ops.py, schedules.py: operator moves and configuration writes; schedules;
* sweeps.py: the leader's sweep loop;
* reads.py, cluster_view.py, digests.py: reads of the state, the node's and cluster's views, the
  state digest.
This module puts them together and holds the lifecycle: start and stop.
"""
from __future__ import annotations

import asyncio
import collections

from ..base.settings import Settings
from ..replication.proposer import Proposer
from ..replication.replica import Replica
from .cluster_view import ClusterView
from .config_follow import ConfigFollow
from .digests import Digests
from .disk import EXIT_STORAGE, DataDisk
from .forwarding import Forwarding
from .job_ops import JobOps
from .members import Members
from .operator_ops import OperatorOps
from .reads import Reads
from .roles import TimeAndRoles
from .batches import Batches
from .schedules import Schedules
from .sweeps import Sweeps
from .wakeups import Wakeups
from .workers_seen import WorkersSeen

__all__ = ["EXIT_STORAGE", "NodeService"]


class NodeService(JobOps, Wakeups, OperatorOps, Schedules, Batches, Reads, ClusterView, Digests, Sweeps, ConfigFollow,
                  TimeAndRoles, DataDisk, Members, Forwarding):
    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop, accept_damaged_log: bool = False):
        self.settings = settings
        self.loop = loop
        self._init_time()
        self._init_disk()
        self.replica = Replica(settings, on_state_changed=self._on_state_changed_thread,
                               on_storage_failure=self._storage_failed, election_eligible=self._may_lead,
                               accept_damaged_log=accept_damaged_log, loop=loop)
        self.state = self.replica.state
        t = settings.tuning
        # A proposal wakes the Raft tick thread by itself (node/raft: event-driven replication).
        self.proposer = Proposer(self.state, loop, self.stamp,
                                 max_batch_commands=int(t["max_batch_commands"]),
                                 max_batch_bytes=int(t["max_batch_bytes"]),
                                 max_inflight=int(t["max_inflight"]),
                                 request_timeout_s=float(t["request_timeout_s"]),
                                 entry_stages=self.replica.entry_stages)
        self._init_wakeups()
        # Which workers reserve from which queue (leader soft state: node/service/workers_seen.py).
        self.workers_seen = WorkersSeen(window_ms=settings.testing.workers_window_ms)
        self.stopping = False
        self.leader_epoch = 0
        self.state.after_apply = self._after_apply_thread
        self.sweeper: asyncio.Task | None = None
        self.stats = collections.Counter()
        self._init_digests()
        self.leadership_lost_hooks: list = []     # coroutine functions(new_leader_url or "")
        self.fatal: str | None = None
        self._init_views()
        # The configuration in force as this node applied it (config_follow.py).
        self._init_config()
        self._init_members()
        self._init_forwarding()

    # ---------------------------------------------------------------- lifecycle
    def start(self, on_fatal=None):
        if self.settings.testing.sweeps:
            self.sweeper = self.loop.create_task(self.sweep_loop())
        self.seeder = self.loop.create_task(self._seed())
        self.schedule_seeder = self.loop.create_task(self._seed_schedules())
        self.config_watch = self.loop.create_task(self._watch_config())
        self._check_space()     # the proposer's refusal while the disk is below its reserve
        self.disk_task = self.loop.create_task(self.disk_loop())
        if self.settings.testing.clock_strobe:
            self.strober = self.loop.create_task(self.strobe_loop())

    async def stop(self, transfer_timeout_s: float = 3.0):
        """Stop taking requests, hand leadership over if leader, let in-flight work finish."""
        self.stopping = True
        self._wake_all()
        if self.replica.is_leader() and len(self.replica.members()) > 1:
            self.replica.transfer_leadership()
            end = self.loop.time() + transfer_timeout_s
            while self.replica.is_leader() and self.loop.time() < end:
                await asyncio.sleep(0.02)
        end = self.loop.time() + 1.0
        while self.leader_url() in (None, self.settings.url) and self.loop.time() < end:
            await asyncio.sleep(0.02)
        self._leadership_lost()      # sessions learn where to go (the state change may not have fired)
        end = self.loop.time() + self.proposer.request_timeout_s
        while self.proposer.inflight and self.loop.time() < end:
            await asyncio.sleep(0.02)
        for task in (self.sweeper, self.seeder, self.schedule_seeder, self.config_watch):
            if task:
                task.cancel()
        if self._peer_session is not None:
            await self._peer_session.close()
        await self.forwarder.close()
        if self.disk_task:
            self.disk_task.cancel()
        if self.strober:
            self.strober.cancel()
        self.replica.destroy()
