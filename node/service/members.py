"""NodeService's membership part: the change under way, add and remove (node/replication/membership.py
carries them out), and what this node does once its own removal is committed."""
from __future__ import annotations

import logging

log = logging.getLogger("raftq.node")


class Members:
    """Mixin of NodeService: membership as the operations see it."""

    def _init_members(self):
        from ..replication.membership import Membership
        self.membership = Membership(self)
        self._removed_said = False
        self.replica.on_members_changed = self._members_changed_thread
        if self.replica.removed:
            self._removed_said = True

    def peer_url(self, peer) -> str:
        """Where this node calls member `peer`'s HTTP API (forwarding, the admin page's node
        table, a leader's take-over request): its `[node] peer_urls` entry, else the URL the
        member advertises. Clients keep seeing the advertised one (307s, /v1/cluster): under
        compose that is the host's port, which the containers cannot reach."""
        return self.settings.peer_urls.get(peer.id, peer.url)

    def leader_peer_url(self) -> str | None:
        """Where this node calls the leader: peer_url() of the leader; the leader's advertised
        URL (this node's own) when this node leads, since nothing dials it then and the callers
        tell "the leader is me" by comparing with settings.url; None when no leader is known."""
        peer = self.leader_member()
        if peer is None:
            return None
        return peer.url if peer.raft == self.settings.raft else self.peer_url(peer)

    @property
    def member_change_doing(self) -> str | None:
        return self.membership.doing

    async def add_member(self, body, rid, who):
        return await self.membership.add(body, rid, who)

    async def remove_member(self, member_id, rid, who, authorization=None):
        return await self.membership.remove(member_id, rid, authorization, who)

    def removed_reason(self) -> str:
        return (f"node {self.settings.node_id} was removed from the cluster: it serves nothing any more; ask "
                "another member (GET /v1/cluster there lists the members). To make this node a member again, "
                "stop it, empty its data dir and add it (raftq members add)")

    def _members_changed_thread(self):
        try:
            self.loop.call_soon_threadsafe(self._members_changed)
        except RuntimeError:
            pass

    def _members_changed(self):
        if self.replica.removed and not self._removed_said:
            self._removed_said = True
            log.critical("this node (%s, raft %s) was removed from the cluster (its removal is committed): it serves "
                         "nothing from now on (every API call answers 503 unavailable, /readyz 503) and stops Raft; "
                         "stop the process. To make it a member again, empty its data dir and add it",
                         self.settings.node_id, self.settings.raft)
            self._wake_all()
            self._leadership_lost()         # sessions are closed: their clients go to the members
            self.loop.run_in_executor(None, self.replica.destroy)
