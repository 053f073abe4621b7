"""Online membership change (docs/cluster.md "Membership changes"; docs/api.md "Membership
changes": `POST /v1/cluster/members`, `DELETE /v1/cluster/members/{id}`): one member at a time,
through the Raft log.

On the leader. An add first makes the new node a *learner* (node/raft: sent the log, or the
snapshot, like a member, but neither counted toward the majority nor a voter), waits until its
match index is within CATCH_UP_LAG entries of the leader's log, and only then proposes the
'add' entry: the new member counts from the moment it holds nearly everything, so adding an
empty node never makes the cluster need it for a commit while it is still receiving the
snapshot. A remove proposes the 'rem' entry; removing the leader itself hands leadership over
first and answers 307 to the new leader, which then removes it. Both answer once the entry is
committed. Never more than one change at a time (the fork refuses a second one too).
"""
from __future__ import annotations

import asyncio
import logging
import re

from ..core import ops
from ..core.errors import error
from .replica import FAIL_REASON, READY_MAX_LAG
from ..base.settings import ConfigError, Peer, _hostport

log = logging.getLogger("raftq.members")

CATCH_UP_LAG = READY_MAX_LAG     # entries a learner may lack when its 'add' is proposed
NO_PROGRESS_S = 15.0             # a learner whose match index does not move for this long: the add is given up
CATCH_UP_MAX_S = 600.0           # and at most this long in all (a snapshot of millions of jobs takes tens of seconds)
COMMIT_TIMEOUT_S = 30.0          # from the proposal to the commit of the change
HANDOVER_S = 10.0                # removing the leader: how long it tries to hand leadership over
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def parse_member(body) -> tuple[Peer | None, tuple | None]:
    if not isinstance(body, dict):
        return None, error("invalid_argument", "the body must be a JSON object {\"id\", \"raft\", \"url\"}")
    unknown = sorted(set(body) - {"id", "raft", "url"})
    if unknown:
        return None, error("invalid_argument", f"unknown field {unknown[0]!r}: a member is {{\"id\", \"raft\", \"url\"}}")
    pid, raft, url = body.get("id"), body.get("raft"), body.get("url")
    if not isinstance(pid, str) or not ID_RE.match(pid):
        return None, error("invalid_argument", "id must be 1..64 characters: letters, digits, '.', '_', '-' "
                           f"(not first), got {pid!r}"[:300])
    try:
        if not isinstance(raft, str) or len(raft) > 300:
            raise ConfigError(f"raft: must be \"host:port\", got {raft!r}"[:300])
        _hostport("raft", raft)
    except ConfigError as e:
        return None, error("invalid_argument", str(e))
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 500 \
            or any(c.isspace() for c in url):
        return None, error("invalid_argument", f"url must be the node's http:// or https:// URL for clients, got {url!r}"[:300])
    return Peer(pid, raft, url.rstrip("/")), None


def members_view(members) -> list[dict]:
    return [{"id": p.id, "raft": p.raft, "url": p.url} for p in members]


class Membership:
    def __init__(self, service):
        self.service = service
        self.doing: str | None = None           # the change under way on this leader, said in refusals
        self._rid: str | None = None
        self._task: asyncio.Task | None = None

    # ---------------------------------------------------------------- refusals
    def _busy(self):
        r = self.service.replica
        if self.doing is not None:
            return error("failed_precondition", f"a membership change is under way ({self.doing}): one change at a "
                         "time; retry when it is done (GET /v1/cluster shows the membership in force)")
        if r.membership_change_pending():
            return error("failed_precondition", "the last membership change (or this new leader's first entry) is "
                         "not committed yet: one change at a time; retry in a moment")
        return None

    async def _joined(self, rid):
        """A retry of the change under way (the same Request-Id) waits for its answer."""
        if rid is not None and rid == self._rid and self._task is not None:
            return await asyncio.shield(self._task)
        return None

    def _done(self, task):
        self.doing = None
        self._rid = None

    # ---------------------------------------------------------------- add
    async def add(self, body, rid, who=None):
        peer, bad = parse_member(body)
        if bad is not None:
            return bad
        joined = await self._joined(rid)
        if joined is not None:
            return joined
        r = self.service.replica
        members = r.members()
        if peer in members:
            return 200, {"members": members_view(members), "changed": False}
        for m in members:
            for field in ("id", "raft", "url"):
                if getattr(m, field) == getattr(peer, field):
                    return error("failed_precondition", f"member {m.id} already has {field} {getattr(peer, field)!r}: "
                                 "a new member needs its own id, Raft address and URL (to move a member to a new "
                                 "address, add the new one under a new id, then remove the old)", member=m.id)
        busy = self._busy()
        if busy is not None:
            return busy
        task = self._start(rid, f"adding {peer.id} at {peer.raft}", self._audited(self._add(peer), who, "member_add", peer))
        return await asyncio.shield(task)

    async def _audited(self, change, who, action: str, peer: Peer):
        """The change, then its entry in the audit trail (docs/semantics.md "Operator moves and the audit
        trail": a membership change is an operator action) once it is committed; one entry per change, whoever waits for it. The
        change stands if the entry cannot be proposed (leadership lost at that moment): logged."""
        status, out = await change
        if status == 200 and out.get("changed"):
            rec_status, rec = await self.service.proposer.run(
                ops.record_action(None, action, peer.id, {"raft": peer.raft, "url": peer.url}, who), internal=True)
            if rec_status != 200:
                log.warning("%s of %s is committed but its audit entry was not: %s", action, peer.id, rec)
        return status, out

    def _start(self, rid, what, coro):
        self.doing, self._rid = what, rid
        self._task = asyncio.get_running_loop().create_task(coro)
        self._task.add_done_callback(self._done)
        return self._task

    async def _add(self, peer: Peer):
        s = self.service
        r = s.replica
        loop = asyncio.get_running_loop()
        log.info("adding %s (raft %s, %s): replicating to it as a learner until it caught up", peer.id, peer.raft,
                 peer.url)
        r.add_learner(peer.raft)
        start = progress_at = loop.time()
        last_match = None
        try:
            while True:
                await asyncio.sleep(0.05)
                now = loop.time()
                if not s.is_leader():
                    return error("unavailable", f"leadership moved while {peer.id} was catching up: nothing was "
                                 "changed; retry (on the new leader)", applied=False)
                match = r.learner_match(peer.raft)
                last = r.last_log_index()
                if match is not None and match > 1 and match >= last - CATCH_UP_LAG:
                    break
                if match != last_match:
                    last_match, progress_at = match, now
                if now - progress_at > NO_PROGRESS_S or now - start > CATCH_UP_MAX_S:
                    why = ("it never answered" if not match else f"it holds {match} of {last} entries and made no "
                           f"progress for {NO_PROGRESS_S:g} s")
                    log.warning("adding %s given up: %s", peer.id, why)
                    return error("unavailable", f"the new node {peer.id} at {peer.raft} did not catch up ({why}): is "
                                 "it running, with the cluster's secret and [cluster] peers naming the current members "
                                 "and itself? Nothing was changed", applied=False)
            caught_up = loop.time() - start
            log.info("%s caught up in %.1f s (%s of %s entries): proposing it as a member", peer.id, caught_up,
                     match, last)
            err = await self._propose(lambda cb: r.add_member(peer, cb))
        finally:
            r.drop_learner(peer.raft)     # nothing once it is a member (its link and indices stay)
        return self._answer(err, f"{peer.id} added", peer, caught_up_s=round(caught_up, 3))

    async def _propose(self, propose):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def callback(result, err):
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(err))
        propose(callback)
        try:
            return await asyncio.wait_for(fut, COMMIT_TIMEOUT_S)
        except asyncio.TimeoutError:
            return None

    def _answer(self, err, what: str, peer: Peer, **extra):
        r = self.service.replica
        if err == FAIL_REASON.SUCCESS:
            log.info("membership change committed: %s; members %s", what,
                     ", ".join(f"{p.id}={p.raft}" for p in r.members()))
            return 200, {"members": members_view(r.members()), "changed": True, **extra}
        if err == FAIL_REASON.REQUEST_DENIED:
            return error("failed_precondition", "Raft refused the change: another change (or a new leader's first "
                         "entry) is not committed yet; retry in a moment", applied=False)
        if err in (FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER):
            return error("unavailable", "the change was not proposed (no leader, or the leader is overloaded); "
                         "retry", applied=False)
        return error("unavailable", f"the outcome of '{what}' is unknown (leadership moved, or no commit within "
                     f"{COMMIT_TIMEOUT_S:g} s): GET /v1/cluster shows the membership in force", member=peer.id)

    # ---------------------------------------------------------------- remove
    async def remove(self, member_id: str, rid, authorization: str | None = None, who=None):
        joined = await self._joined(rid)
        if joined is not None:
            return joined
        s = self.service
        r = s.replica
        members = r.members()
        peer = next((p for p in members if p.id == member_id), None)
        if peer is None:
            return error("not_found", f"no member {member_id!r} (members: {', '.join(p.id for p in members)})"[:500],
                         member=member_id)
        if len(members) == 1:
            return error("failed_precondition", f"{peer.id} is the last member: a cluster cannot remove its last "
                         "member", member=peer.id)
        busy = self._busy()
        if busy is not None:
            return busy
        if peer.raft == s.settings.raft:
            task = self._start(rid, f"handing leadership over to remove {peer.id}", self._hand_over(peer, authorization))
        else:
            task = self._start(rid, f"removing {peer.id}", self._audited(self._remove(peer), who, "member_remove", peer))
        return await asyncio.shield(task)

    async def _remove(self, peer: Peer):
        log.info("removing %s (raft %s)", peer.id, peer.raft)
        err = await self._propose(lambda cb: self.service.replica.remove_member(peer, cb))
        return self._answer(err, f"{peer.id} removed", peer)

    async def _successor(self, authorization: str | None) -> str | None:
        """The Raft address of the member to hand leadership to: one that is ready and connected
        to every other member (a member added a moment ago may not have its links to the
        followers yet, and could not win the election it is asked to start), else None (the
        most caught-up one, chosen by Raft)."""
        import aiohttp
        s = self.service
        others = s.others()
        headers = {"Authorization": authorization} if authorization else {}

        async def view(p):
            try:
                async with s._peer_http().get(s.peer_url(p) + "/v1/cluster?digest=false", headers=headers,
                                              allow_redirects=False, timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                    return await resp.json(content_type=None) if resp.status == 200 else None
            except Exception:
                return None
        views = await asyncio.gather(*(view(p) for p in others))
        best = None
        for p, v in zip(others, views):
            if not isinstance(v, dict) or not v.get("ready") or v.get("removed"):
                continue
            links = {m.get("raft_addr"): m.get("connected") for m in v.get("members", []) if isinstance(m, dict)}
            if not all(links.get(q.raft) for q in s.replica.members()):
                continue
            rank = (v.get("last_applied") or 0, p.id)
            if best is None or rank > best[0]:
                best = (rank, p.raft)
        return best[1] if best else None

    async def _hand_over(self, peer: Peer, authorization: str | None):
        """The leader is to be removed: hand leadership to a caught-up member connected to the
        others, then send the caller there (307), where the removal is an ordinary one."""
        s = self.service
        r = s.replica
        loop = asyncio.get_running_loop()
        end = loop.time() + HANDOVER_S
        log.info("removing this node (%s), the leader: handing leadership over first", peer.id)
        target = await self._successor(authorization)
        while loop.time() < end:
            if r.is_leader():
                # refused while the target does not hold the last entry: asked again
                r.transfer_leadership(to=target)
            else:
                url = s.leader_url()
                if url is not None and url != s.settings.url:
                    log.info("leadership handed over to %s: the removal of %s goes there", url, peer.id)
                    return 307, {"error": {"code": "not_leader", "message": f"{peer.id} handed leadership over to "
                                           f"{url}; the removal goes there", "leader_url": url}}
            await asyncio.sleep(0.05)
        return error("unavailable", f"{peer.id} is the leader and could not hand leadership over within "
                     f"{HANDOVER_S:g} s (no follower caught up?): nothing was changed; retry", applied=False)
