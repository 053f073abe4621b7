"""NodeService's views of the node and the cluster: server-info, this node's `/v1/cluster`,
readiness, and every member's view gathered by one node (`/v1/cluster/nodes`)."""
from __future__ import annotations

import asyncio

from ... import __version__ as VERSION
from ..replication.proposer import wall_ms

PEER_VIEW_TIMEOUT_S = 1.5       # a stopped peer must not hold up the others' rows for long


class ClusterView:
    """Mixin of NodeService: the node's and the cluster's views."""

    def _init_views(self):
        self._peer_session = None                 # aiohttp client for GET /v1/cluster/nodes

    def server_info(self):
        info = {"server_version": VERSION, "protocol_versions": ["v1"],
                "server_time_ms": wall_ms() + self.clock_offset_ms, "node_id": self.settings.node_id}
        info.update(self.limits.server_info())
        return 200, info

    def cluster(self, with_digest: bool = True):
        """This node's view. The state digest costs O(state) (cached per applied index);
        `with_digest=False` skips it for frequent polling."""
        r = self.replica
        status = r.status()
        # Role and term must belong together ("at most one leader per term" is checked from
        # these views), so both come from one snapshot the tick thread takes between messages.
        role, term = r.raft_role_term()
        leader_raft = r.leader_raft()
        leader = None
        removed = r.removed
        if leader_raft is not None and not removed:
            p = r.member_by_raft(leader_raft) or self.settings.peer_by_raft(leader_raft)
            if p is not None:
                leader = {"id": p.id, "url": p.url}
        members = []
        for p in r.members():       # the membership in force (changed online, or the TOML's seed)
            members.append({"id": p.id, "url": p.url, "raft": p.raft, "raft_addr": p.raft,
                            "connected": r.connected(p.raft)})
        with self.state.lock:
            applied = r.applied_index()
            cached_at, digest = self._digest_cache
            digest_index = applied
            if not with_digest:
                digest = digest_index = None
            elif cached_at != (applied, self.state.machine.applied):
                digest = self.state.machine.digest()
                self._digest_cache = ((applied, self.state.machine.applied), digest)
            machine_counts = self.state.machine.counts()
            config_version = self.state.machine.config_version
        toml_differs = bool(self.toml_differences())
        return 200, {"node_id": self.settings.node_id, "role": role,
                     "leader": leader, "term": term, "commit_index": status["commit_index"],
                     "last_applied": applied, "members": members, "ready": self.ready(),
                     "removed": removed, "membership_change": self.member_change_doing,
                     "digest": digest, "digest_index": digest_index, "durability": self.settings.durability,
                     "limits_fingerprint": self.limits.fingerprint(), "config_version": config_version,
                     "toml_differs": toml_differs, "state": machine_counts,
                     "cpu": r.cpu(), "proposer": dict(self.proposer.stats), "journal_syncs": r.syncs,
                     "disk": self.disk(),
                     "invariant_violations": self.state.invariant_violations if self.state.check_invariants else None,
                     "event_loop": "uvloop" if type(self.loop).__module__.startswith("uvloop") else "asyncio",
                     "raft_engine": self.replica.engine}

    def ready(self) -> bool:
        """/readyz, `ready` in /v1/cluster, `raftq up`: this node can take writes now (docs/api.md
        "Cluster and node", `GET /readyz`): a member, a leader known (a follower: its forward link
        to it open, or not needed), caught up with it, and the cluster's configuration seeded (before that every
        write answers 503)."""
        r = self.replica
        return not r.removed and r.leader_raft() is not None and r.caught_up() \
            and r.syncobj.logUnverified is None and self.is_seeded() \
            and (r.is_leader() or self.forwarder.reachable())

    async def cluster_nodes(self, authorization: str | None):
        """Every member's own view (`GET /v1/cluster?digest=false` on each), asked by this node
        at once, so that one page served by one node can show them all (a browser page may
        only call its own origin). The caller's Authorization goes along: the peers check the
        key themselves, as they would the caller's own request."""
        import aiohttp
        from ..base.tls import peer_problem
        _, mine = self.cluster(False)
        headers = {"Authorization": authorization} if authorization else {}
        timeout = aiohttp.ClientTimeout(total=PEER_VIEW_TIMEOUT_S)

        async def one(peer):
            if peer.id == self.settings.node_id:
                return mine, None
            try:
                http = self._peer_http()
                async with http.get(self.peer_url(peer) + "/v1/cluster?digest=false", headers=headers,
                                    allow_redirects=False, timeout=timeout) as r:
                    body = await r.json(content_type=None)
                    if r.status != 200 or not isinstance(body, dict):
                        code = ((body or {}).get("error") or {}).get("code") if isinstance(body, dict) else None
                        return None, f"answered {r.status}" + (f" {code}" if code else "")
                    return body, None
            except asyncio.TimeoutError:
                return None, f"no answer within {PEER_VIEW_TIMEOUT_S:g} s"
            except Exception as e:
                why = peer_problem(e)
                if why is None:
                    cause = getattr(e, "os_error", e)
                    why = ("connection refused" if isinstance(cause, ConnectionRefusedError)
                           else f"cannot connect: {getattr(cause, 'strerror', None) or cause}"
                           if isinstance(e, (aiohttp.ClientConnectorError, OSError)) else f"{type(e).__name__}: {e}")
                return None, why

        members = self.replica.members()
        answers = await asyncio.gather(*(one(p) for p in members))
        views = [v for v, _ in answers if v is not None]
        top = max((v.get("commit_index") or 0 for v in views), default=0)
        nodes = []
        for peer, (view, why) in zip(members, answers):
            node = {"id": peer.id, "url": peer.url, "reachable": view is not None, "error": why}
            if view is not None:
                others = [m for m in view.get("members", []) if m.get("id") != peer.id]
                leader = view.get("leader")
                node.update(role=view.get("role"), term=view.get("term"), commit_index=view.get("commit_index"),
                            last_applied=view.get("last_applied"), ready=view.get("ready"),
                            leader_id=leader.get("id") if isinstance(leader, dict) else None,
                            peers_connected=sum(1 for m in others if m.get("connected")), peers=len(others),
                            durability=view.get("durability"),
                            lag=max(0, top - (view.get("last_applied") or 0)))
            nodes.append(node)
        return 200, {"node_id": self.settings.node_id, "nodes": nodes}

    def _peer_http(self):
        """One HTTP client for calls to the other nodes, made on first use (https peers: the
        tls_peer_ca trust and this node's certificate, as for the limits check)."""
        if self._peer_session is None or self._peer_session.closed:
            import aiohttp
            from ..base.tls import peer_context
            ctx = peer_context(self.settings.tls)
            self._peer_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=True if ctx is None else ctx, limit_per_host=4))
        return self._peer_session
