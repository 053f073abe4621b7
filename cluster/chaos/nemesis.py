"""The nemesis: a fault schedule drawn from a seed, faults that inject and heal themselves, and a
sampler that records who claims leadership in which term.

Fault kinds (`KINDS`):

| kind | inject | heal |
|---|---|---|
| kill-leader | SIGKILL the leader | restart it |
| kill-follower | SIGKILL a follower | restart it |
| kill-all | SIGKILL every node | restart them all |
| pause-leader | SIGSTOP the leader past the election timeout | SIGCONT |
| wipe-node | SIGKILL a node once the others provably hold every committed entry, delete its data dir | restart it empty |
| partition-leader | cut the leader off from every peer (both directions) | reconnect |
| partition-minority | a clean split: a random minority (with or without the leader) vs the rest | reconnect |
| partition-oneway | one node's outgoing (or incoming) Raft traffic stalls | reconnect (connections cut) |
| partition-ring | non-transitive: A-B and B-C work, A-C does not (5 nodes: each sees only its ring neighbours) | reconnect |
| latency | 50-400 ms (with jitter) on the Raft links | back to 0 |
| reset | connection resets (RST) on random Raft links every 0.2-1 s | stop |
| clock-skew | restart one node with its clock shifted ([testing] clock_offset_ms), then nudge leadership | restart it without |
| power-loss | (opt-in) freeze every node at once, SIGKILL them, roll each data dir back to its last durable point (node/replication/sync_shadow.py) | restart them all |
| bitflip | (opt-in, `disk`) SIGKILL one node, flip 1-8 bits in its journal (end marker or records), snapshot or meta file | restart it |
| truncate | (opt-in, `disk`) SIGKILL one node, cut its journal at a random offset below its end marker | restart it |
| rollback | (opt-in, `disk`) copy one node's whole data dir (frozen), let the cluster go on, SIGKILL it and put the old copy back | restart it |
| fsync-eio | (opt-in, `disk`) make one node's next journal fsync fail with EIO (node/replication/fault_hooks.py); it must exit with code 74; roll its data dir back to its last good sync (what the kernel dropping the pages leaves) | restart it |
| disk-full | (opt-in, `disk`) fill one node's data filesystem (a small loop-mounted ext4 per node, made and removed by the run; without root, a test hook tells the node its free space) below its reserve or to the last block | free it (restart the node if it exited) |
| clock-strobe | (opt-in, `disk`) one node's clock jumps between +A and -A (0.5-5 s) every 20-250 ms (node/replication/fault_hooks.py) | stop |

Steps alternate a quiet period with either one fault or a mix of up to three compatible ones
(kill-all, wipe-node, clock-skew and power-loss always run alone; at most one partition and one
fault that damages or fills a disk at a time, and none while another node's log is still
untrusted: two damaged nodes of three could out-vote the one that holds what they lost). The schedule (kinds, timings, holds) comes from `random.Random(seed)`; targets that
depend on who leads are resolved when the fault fires, with a second seeded stream for the
random picks. `KINDS` ("all") are the twelve kinds the tool started with; `OPT_IN_KINDS` are
drawn only when listed, so every seed keeps replaying the schedule it always did.
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from pathlib import Path

from ...node.replication import fault_hooks, sync_shadow

from . import diskfaults
from .proxy import NetState, ProxyNet
from ..local import LocalCluster

KINDS = ("kill-leader", "kill-follower", "kill-all", "pause-leader", "wipe-node", "partition-leader",
         "partition-minority", "partition-oneway", "partition-ring", "latency", "reset", "clock-skew")
# Kinds drawn only when listed by name (`--faults all,power-loss`): "all" stays the twelve
# above, so a seed replays the same schedule it always did (plan_step draws from the listed
# kinds, in order), and runs without them do not pay for the test hook they need.
# The faults of the disk (and the clock strobe, added with them), drawn only when listed; `disk`
# names them all (`--faults all,power-loss,disk`).
DISK_KINDS = ("bitflip", "truncate", "rollback", "fsync-eio", "disk-full", "clock-strobe")
OPT_IN_KINDS = ("power-loss",) + DISK_KINDS
ALL_KINDS = KINDS + OPT_IN_KINDS
GROUPS = {"all": KINDS, "disk": DISK_KINDS}
EXCLUSIVE = frozenset(("kill-all", "wipe-node", "clock-skew", "power-loss"))
PARTITIONS = frozenset(("partition-leader", "partition-minority", "partition-oneway", "partition-ring"))
# Faults that leave one node's disk damaged, failed or full: one at a time.
DISK_DAMAGE = frozenset(("bitflip", "truncate", "rollback", "fsync-eio", "disk-full"))
STROBE_AMPLITUDES_MS = (500, 2000, 5000)
STROBE_PERIODS_MS = (20, 100, 250)
HOLD_S = {"kill-leader": (0.5, 5.0), "kill-follower": (0.5, 5.0), "kill-all": (0.5, 3.0),
          "pause-leader": (2.5, 6.0), "wipe-node": (0.5, 2.0), "partition-leader": (3.0, 8.0),
          "partition-minority": (3.0, 8.0), "partition-oneway": (3.0, 8.0), "partition-ring": (3.0, 8.0),
          "latency": (3.0, 8.0), "reset": (3.0, 8.0), "clock-skew": (4.0, 8.0), "power-loss": (0.5, 3.0),
          "bitflip": (0.5, 3.0), "truncate": (0.5, 3.0), "rollback": (1.0, 4.0), "fsync-eio": (0.5, 3.0),
          "disk-full": (3.0, 8.0), "clock-strobe": (3.0, 8.0)}
CLOCK_OFFSETS_MS = (2000, 3000, -3000, -8000)


# ---------------------------------------------------------------------------- the cluster side
class Env:
    """What faults act on: the node processes (through LocalCluster, in threads), the proxies,
    and fresh views of every node."""

    def __init__(self, cluster: LocalCluster, net: ProxyNet, history, log=None):
        self.cluster = cluster
        self.net = net
        self.h = history
        self.n = cluster.n
        self.log = log or (lambda msg: None)
        self.down: set[int] = set()
        self.paused: set[int] = set()
        self.skewed: dict[int, int] = {}
        self.max_forward_skew_ms = 0
        self.net_faults: dict[int, NetState] = {}
        self.http: aiohttp.ClientSession | None = None
        self.proc_lock = asyncio.Lock()
        self.disks = None               # diskfaults.SmallDisks when the run mounted one per node
        self.reserve_bytes = 0          # the nodes' storage.min_free_bytes
        self.filled: set[int] = set()
        self.strobed: set[int] = set()
        self.stash_dir = None           # where rollback keeps its copies

    async def open(self):
        self.http = aiohttp.ClientSession()

    async def close(self):
        if self.http is not None:
            await self.http.close()

    # ---------------------------------------------------------------- views
    async def view(self, i: int, timeout: float = 0.6):
        if i in self.down or i in self.paused:
            return None
        try:
            async with self.http.get(self.cluster.urls[i] + "/v1/cluster?digest=false",
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                if r.status != 200:
                    return None
                return orjson.loads(await r.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return None

    async def views(self, timeout: float = 0.6) -> dict:
        res = await asyncio.gather(*(self.view(i, timeout) for i in range(self.n)))
        return dict(enumerate(res))

    async def leader(self, wait: float = 5.0, among=None) -> int | None:
        """The node that says it leads (highest term wins), waiting up to `wait` seconds."""
        end = time.monotonic() + wait
        while True:
            views = await self.views()
            best = None
            for i, v in views.items():
                if v and v.get("role") == "leader" and (among is None or i in among):
                    if best is None or v["term"] > views[best]["term"]:
                        best = i
            if best is not None or time.monotonic() >= end:
                return best
            await asyncio.sleep(0.1)

    def up(self) -> list[int]:
        return [i for i in range(self.n) if i not in self.down and i not in self.paused]

    # ---------------------------------------------------------------- processes
    async def kill(self, i: int):
        async with self.proc_lock:
            self.down.add(i)
            self.paused.discard(i)
            await asyncio.to_thread(self.cluster.kill, i)

    async def start(self, i: int):
        async with self.proc_lock:
            await asyncio.to_thread(self.cluster.start, i)
            self.down.discard(i)

    async def pause(self, i: int):
        async with self.proc_lock:
            self.cluster.pause(i)
            self.paused.add(i)

    async def resume(self, i: int):
        async with self.proc_lock:
            self.cluster.resume(i)
            self.paused.discard(i)

    async def wipe(self, i: int):
        await asyncio.to_thread(self.cluster.wipe, i)

    # ---------------------------------------------------------------- network
    async def apply_net(self):
        blocked: set = set()
        latency: dict = {}
        for st in self.net_faults.values():
            blocked |= st.blocked
            for pair, lat in st.latency.items():
                if lat[0] + lat[1] > sum(latency.get(pair, (0.0, 0.0))):
                    latency[pair] = lat
        await asyncio.to_thread(self.net.apply, NetState(blocked, latency))

    async def set_net(self, key: int, state: NetState | None):
        if state is None:
            self.net_faults.pop(key, None)
        else:
            self.net_faults[key] = state
        await self.apply_net()

    # ---------------------------------------------------------------- waiting
    async def wait_write_after(self, t: float, timeout: float) -> bool:
        """Wait for an ok write invoked at or after history time t."""
        end = time.monotonic() + timeout
        scanned = 0
        while time.monotonic() < end:
            ops = self.h.ops
            for op in ops[max(scanned - 50, 0):]:
                if op["f"] == "enqueue" and op["t0"] >= t and op.get("outcome") == "ok":
                    return True
            scanned = len(ops)
            await asyncio.sleep(0.05)
        return False

    async def wait_healthy(self, timeout: float = 30.0) -> float | None:
        """Wait for every node up, every log trusted (the disk checks) and one leader; seconds
        it took, or None."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if not self.down and not self.paused:
                views = await self.views()
                if all(views.values()) and all((v.get("disk") or {}).get("log_verified", True) for v in views.values()):
                    leaders = [i for i, v in views.items() if v["role"] == "leader"]
                    agree = leaders and sum(1 for v in views.values()
                                            if v.get("leader") and v["leader"]["id"] == views[leaders[0]]["node_id"])
                    if len(leaders) == 1 and agree * 2 > self.n:
                        return time.monotonic() - t0
            await asyncio.sleep(0.1)
        return None


# ---------------------------------------------------------------------------- faults
class Fault:
    kind = ""

    def __init__(self, env: Env, rng: random.Random, fid: int):
        self.env, self.rng, self.fid = env, rng, fid
        self.t_inject: float | None = None
        self.t_heal: float | None = None
        self.details: dict = {}
        self.skipped: str | None = None

    def mark(self):
        self.t_inject = self.env.h.now()

    def name(self, i: int) -> str:
        return self.env.cluster.ids[i]

    async def inject(self):
        raise NotImplementedError

    async def heal(self):
        raise NotImplementedError

    def record(self) -> dict:
        d = {"id": self.fid, "kind": self.kind, "t_inject": self.t_inject, "t_heal": self.t_heal, **self.details}
        if self.skipped:
            d["skipped"] = self.skipped
        return d

    async def _leader_or_any(self, exclude=()) -> int | None:
        env = self.env
        cands = [i for i in env.up() if i not in exclude]
        i = await env.leader(wait=3.0, among=cands)
        if i is None and cands:
            i = self.rng.choice(cands)
            self.details["leader_unknown"] = True
        return i


class OneNodeFault(Fault):
    """A fault on one node: `pick` chooses it (None = skip, with `skip_reason`), `act` hurts it,
    `undo` heals it."""
    skip_reason = "no node up"

    async def pick(self) -> int | None:
        raise NotImplementedError

    async def act(self, i: int):
        raise NotImplementedError

    async def undo(self, i: int):
        raise NotImplementedError

    async def inject(self):
        i = await self.pick()
        if i is None:
            self.skipped = self.skip_reason
            return
        self.target = i
        self.details["node"] = self.name(i)
        self.mark()
        await self.act(i)

    async def heal(self):
        if not self.skipped:
            await self.undo(self.target)


class KillLeader(OneNodeFault):
    kind = "kill-leader"
    pick = Fault._leader_or_any

    async def act(self, i):
        await self.env.kill(i)

    async def undo(self, i):
        await self.env.start(i)


class KillFollower(KillLeader):
    kind = "kill-follower"
    skip_reason = "no follower up"

    async def pick(self):
        leader = await self.env.leader(wait=2.0)
        cands = [i for i in self.env.up() if i != leader]
        return self.rng.choice(cands) if cands else None


class KillAll(Fault):
    kind = "kill-all"

    async def inject(self):
        order = list(range(self.env.n))
        self.rng.shuffle(order)
        self.details["nodes"] = [self.name(i) for i in order]
        self.mark()
        for i in order:
            await self.env.kill(i)

    async def heal(self):
        for i in range(self.env.n):
            await self.env.start(i)


class PauseLeader(OneNodeFault):
    kind = "pause-leader"
    pick = Fault._leader_or_any

    async def act(self, i):
        await self.env.pause(i)

    async def undo(self, i):
        await self.env.resume(i)


class WipeNode(Fault):
    """Kill a node, make sure the others hold every committed entry (an ok write after the kill,
    then every other node applied up to the leader's commit index), delete its data, restart it.
    Without that wait a wiped node could help elect a leader that lacks committed entries,
    which Raft does not promise to survive (a wipe is a lost disk, not a crash)."""
    kind = "wipe-node"

    async def inject(self):
        env = self.env
        ups = env.up()
        if len(ups) < env.n:
            self.skipped = "not every node is up"
            return
        self.target = self.rng.choice(ups)
        self.details["node"] = self.name(self.target)
        self.mark()
        await env.kill(self.target)
        others = [i for i in range(env.n) if i != self.target]
        t = env.h.now()
        ok = await env.wait_write_after(t, 20.0)
        safe = False
        if ok:
            end = time.monotonic() + 20.0
            while time.monotonic() < end and not safe:
                views = await env.views()
                lead = [views[i] for i in others if views[i] and views[i]["role"] == "leader"]
                if lead and all(views[i] for i in others):
                    c = lead[0]["commit_index"]
                    safe = all(views[i]["last_applied"] >= c for i in others)
                if not safe:
                    await asyncio.sleep(0.1)
        self.details["others_caught_up"] = safe
        if safe:
            await env.wipe(self.target)
            self.details["wiped"] = True
        else:
            self.details["wiped"] = False     # restarted with its data: a plain crash

    async def heal(self):
        if not self.skipped:
            await self.env.start(self.target)


class NetFault(Fault):
    async def heal(self):
        if not self.skipped:
            await self.env.set_net(self.fid, None)

    def pairs_between(self, a: list[int], b: list[int]) -> set:
        return {(x, y) for x in a for y in b} | {(y, x) for x in a for y in b}


class PartitionLeader(NetFault):
    kind = "partition-leader"

    async def inject(self):
        env = self.env
        i = await self._leader_or_any()
        if i is None:
            self.skipped = "no node up"
            return
        rest = [j for j in range(env.n) if j != i]
        self.details["isolated"] = self.name(i)
        self.mark()
        await env.set_net(self.fid, NetState(blocked=self.pairs_between([i], rest)))


class PartitionMinority(NetFault):
    kind = "partition-minority"

    async def inject(self):
        env = self.env
        size = 1 if env.n <= 3 else self.rng.choice(range(1, (env.n - 1) // 2 + 1))
        leader = await env.leader(wait=2.0)
        nodes = list(range(env.n))
        self.rng.shuffle(nodes)
        if leader is not None and self.rng.random() < 0.5:
            nodes.remove(leader)
            nodes.insert(0, leader)
        minority, majority = nodes[:size], nodes[size:]
        self.details["minority"] = [self.name(i) for i in minority]
        self.details["with_leader"] = leader in minority
        self.mark()
        await env.set_net(self.fid, NetState(blocked=self.pairs_between(minority, majority)))


class PartitionOneway(NetFault):
    kind = "partition-oneway"

    async def inject(self):
        env = self.env
        leader = await env.leader(wait=2.0)
        i = leader if leader is not None and self.rng.random() < 0.6 else self.rng.randrange(env.n)
        direction = self.rng.choice(("out", "in"))
        rest = [j for j in range(env.n) if j != i]
        blocked = {(i, j) for j in rest} if direction == "out" else {(j, i) for j in rest}
        self.details.update(node=self.name(i), direction=direction, leader=i == leader)
        self.mark()
        await env.set_net(self.fid, NetState(blocked=blocked))


class PartitionRing(NetFault):
    kind = "partition-ring"

    async def inject(self):
        env = self.env
        leader = await env.leader(wait=2.0)
        if env.n == 3:
            a = leader if leader is not None and self.rng.random() < 0.6 else self.rng.randrange(3)
            b = self.rng.choice([j for j in range(3) if j != a])
            blocked = {(a, b), (b, a)}
            self.details["cut"] = [self.name(a), self.name(b)]
        else:
            ring = list(range(env.n))
            self.rng.shuffle(ring)
            adjacent = {frozenset((ring[k], ring[(k + 1) % env.n])) for k in range(env.n)}
            blocked = {(x, y) for x in range(env.n) for y in range(env.n)
                       if x != y and frozenset((x, y)) not in adjacent}
            self.details["ring"] = [self.name(i) for i in ring]
        self.mark()
        await env.set_net(self.fid, NetState(blocked=blocked))


class Latency(NetFault):
    kind = "latency"

    async def inject(self):
        env = self.env
        lat, jit = self.rng.choice(((0.05, 0.02), (0.1, 0.05), (0.2, 0.1), (0.4, 0.2)))
        pairs = [(a, b) for a in range(env.n) for b in range(a + 1, env.n)]
        if self.rng.random() < 0.4:
            pairs = self.rng.sample(pairs, self.rng.randint(1, len(pairs)))
        self.details.update(latency_ms=int(lat * 1000), jitter_ms=int(jit * 1000),
                            links=[f"{self.name(a)}-{self.name(b)}" for a, b in pairs])
        self.mark()
        await env.set_net(self.fid, NetState(latency={p: (lat, jit) for p in pairs}))


class Reset(Fault):
    kind = "reset"

    async def inject(self):
        self.details["resets"] = 0
        self.mark()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self):
        env = self.env
        pairs = [(a, b) for a in range(env.n) for b in range(a + 1, env.n)]
        while True:
            chosen = None if self.rng.random() < 0.3 else [self.rng.choice(pairs)]
            await asyncio.to_thread(env.net.reset, chosen)
            self.details["resets"] += 1
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))

    async def heal(self):
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):
            pass


class ClockSkew(Fault):
    """Restart a node with its clock shifted, then (usually) kill the leader once so the skewed
    node may take over; heal restarts it with the true clock."""
    kind = "clock-skew"

    async def inject(self):
        env = self.env
        leader = await env.leader(wait=2.0)
        i = leader if leader is not None and self.rng.random() < 0.5 else self.rng.randrange(env.n)
        offset = self.rng.choice(CLOCK_OFFSETS_MS)
        self.target = i
        self.details.update(node=self.name(i), offset_ms=offset)
        env.max_forward_skew_ms = max(env.max_forward_skew_ms, offset)
        self.mark()
        await env.kill(i)
        env.cluster.node_testing.setdefault(i, {})["clock_offset_ms"] = int(offset)
        env.skewed[i] = offset
        await env.start(i)
        # Let it catch up, then maybe move leadership so the skewed clock stamps commands.
        end = time.monotonic() + 10
        while time.monotonic() < end and not await env.view(i):
            await asyncio.sleep(0.1)
        lead = await env.leader(wait=5.0)
        nudges = []
        while lead is not None and lead != i and len(nudges) < 2 and self.rng.random() < 0.8:
            nudges.append(self.name(lead))
            await env.kill(lead)
            await asyncio.sleep(self.rng.uniform(0.0, 0.5))
            await env.start(lead)
            lead = await env.leader(wait=5.0, among=[j for j in range(env.n) if j != lead])
        if nudges:
            self.details["nudged"] = nudges
        self.details["skewed_leads"] = lead == i

    async def heal(self):
        env = self.env
        await env.kill(self.target)
        env.cluster.node_testing.get(self.target, {}).pop("clock_offset_ms", None)
        env.skewed.pop(self.target, None)
        await env.start(self.target)


class PowerLoss(Fault):
    """A power cut of the whole cluster, without root (node/replication/sync_shadow.py). Every node runs with
    `[testing] sync_shadow = true` and records, at each durable point (a journal sync in fsync mode, a
    simulated page writeback every few seconds in memory mode), what a disk honouring only fsync
    would hold. The cut: every node's process group is frozen at once (SIGSTOP), then SIGKILLed,
    and each data dir is rolled back to its record: the journal to its last durable offset (and
    the durable bytes that in-place rewrites had overwritten), in memory mode also the snapshot
    (term and vote are synced in both modes). Heal restarts them all.

    The moment is chosen the way a nemesis would: the nodes are frozen every few ms until one of
    them holds journal bytes that are not durable (in fsync mode that is a short window: appended
    but not yet synced), for at most HUNT_S, then cut anyway. The whole cluster, because losing a
    minority's unsynced tail is masked by the majority (that is kill-follower)."""
    kind = "power-loss"
    HUNT_S = 3.0

    def _signal_all(self, ids, sig):
        for i in ids:
            self.env.cluster.signal(i, sig, group=True)

    def _wait_stopped(self, ids, timeout: float = 1.0) -> bool:
        """kill(SIGSTOP) returns before the target stops: wait until every thread of every node
        is stopped, so that what is read next is what the cut leaves."""
        end = time.monotonic() + timeout
        tasks = []
        for i in ids:
            p = self.env.cluster.procs.get(i)
            if p is not None and p.poll() is None:
                try:
                    tasks += [f"/proc/{p.pid}/task/{t}/stat" for t in os.listdir(f"/proc/{p.pid}/task")]
                except OSError:
                    pass
        while tasks and time.monotonic() < end:
            running = []
            for path in tasks:
                try:
                    with open(path, "rb") as f:
                        state = f.read().rsplit(b")", 1)[1].split()[0]
                except (OSError, IndexError):
                    continue                      # gone: not running either
                if state not in (b"T", b"t", b"Z", b"X"):
                    running.append(path)
            tasks = running
            if tasks:
                time.sleep(0.0005)
        return not tasks

    async def inject(self):
        env = self.env
        c = env.cluster
        hunt = random.Random(self.rng.random())
        ids = list(range(env.n))
        tries = 0
        async with env.proc_lock:
            end = time.monotonic() + self.HUNT_S
            while True:
                tries += 1
                t_cut, w_cut = env.h.now(), time.time_ns() // 1_000_000
                self._signal_all(ids, signal.SIGSTOP)
                if not self._wait_stopped(ids):
                    self.details["not_stopped"] = self.details.get("not_stopped", 0) + 1
                pending = {c.ids[i]: sync_shadow.unsynced(c.data_dir(i)) for i in ids}
                if any(pending.values()) or time.monotonic() >= end:
                    break
                self._signal_all(ids, signal.SIGCONT)
                await asyncio.sleep(hunt.uniform(0.002, 0.02))
            self._signal_all(ids, signal.SIGKILL)
            for i in ids:
                p = c.procs.get(i)
                if p is not None:
                    await asyncio.to_thread(p.wait, 10)
                env.down.add(i)
                env.paused.discard(i)
        self.t_inject = t_cut
        nodes = {}
        for i in ids:
            try:
                nodes[c.ids[i]] = await asyncio.to_thread(sync_shadow.restore, c.data_dir(i), c.durability)
            except Exception as e:                # reported, never fatal to the run
                nodes[c.ids[i]] = {"error": f"{type(e).__name__}: {e}"}
        durable = [n.get("durable_wall_ms") for n in nodes.values()]
        self.details.update(durability=c.durability, w_cut=w_cut, hunt_tries=tries,
                            unsynced_at_cut=sorted(k for k, v in pending.items() if v), nodes=nodes,
                            durable_from_wall_ms=min((x for x in durable if x is not None), default=None),
                            entries_dropped=sum(n.get("entries_dropped", 0) for n in nodes.values()),
                            bytes_dropped=sum(n.get("bytes_dropped", 0) for n in nodes.values()))
        errors = {k: n["error"] for k, n in nodes.items() if n.get("error")}
        if errors:
            self.details["restore_errors"] = errors

    async def heal(self):
        self.details["t_restart"] = self.env.h.now()
        for i in range(self.env.n):
            await self.env.start(i)


# ---------------------------------------------------------------------------- the disk
class DiskFault(OneNodeFault):
    """A fault on one node's disk. `pick`: the leader now and then, else any node that is up.
    After the node is back, `found` records what its disk checks reported (the checker's
    `checksum_failures_contained` wants every damage found)."""

    async def pick(self):
        env = self.env
        ups = env.up()
        if len(ups) < env.n:
            return None                 # another fault has a node down: keep to one at a time
        leader = await env.leader(wait=2.0)
        if leader is not None and self.rng.random() < 0.4:
            return leader
        return self.rng.choice(ups)

    skip_reason = "not every node is up"

    async def restart_and_look(self, i: int):
        env = self.env
        await env.start(i)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            v = await env.view(i, timeout=1.0)
            if v is not None:
                disk = v.get("disk") or {}
                self.details["found"] = disk.get("findings") or {}
                self.details["log_verified_at_start"] = disk.get("log_verified")
                return
            await asyncio.sleep(0.1)
        self.details["found"] = None


class Bitflip(DiskFault):
    kind = "bitflip"

    async def act(self, i):
        await self.env.kill(i)
        self.details.update(await asyncio.to_thread(diskfaults.bitflip, self.env.cluster.data_dir(i), self.rng))
        if "skipped" in self.details:
            self.details["damage_skipped"] = self.details.pop("skipped")

    async def undo(self, i):
        await self.restart_and_look(i)


class Truncate(Bitflip):
    kind = "truncate"

    async def act(self, i):
        await self.env.kill(i)
        self.details.update(await asyncio.to_thread(diskfaults.truncate, self.env.cluster.data_dir(i), self.rng))
        if "skipped" in self.details:
            self.details["damage_skipped"] = self.details.pop("skipped")


class Rollback(DiskFault):
    """Copy the node's data dir while it is frozen (a consistent image: nothing is halfway
    written by a stopped process), let the cluster go on, then kill it and put the old copy
    back: term, vote, journal and snapshot all from the past. Nothing fails a checksum; the node
    must catch up like any node that was down, and lose nothing anyone else relies on."""
    kind = "rollback"

    async def act(self, i):
        env, c = self.env, self.env.cluster
        stash = Path(env.stash_dir or c.dir) / f"rollback-{self.fid}"
        async with env.proc_lock:
            c.signal(i, signal.SIGSTOP, group=True)
            try:
                self.details.update(await asyncio.to_thread(diskfaults.stash, c.data_dir(i), stash))
            finally:
                c.signal(i, signal.SIGCONT, group=True)
        self.details["stashed_at"] = round(env.h.now(), 3)
        await asyncio.sleep(self.rng.uniform(1.0, 4.0))         # the cluster goes on without the copy
        self.mark()
        await env.kill(i)
        self.details.update(await asyncio.to_thread(diskfaults.rollback, c.data_dir(i), stash))

    async def undo(self, i):
        await self.restart_and_look(i)


class FsyncEio(DiskFault):
    """The node's next journal fsync fails with EIO (node/replication/fault_hooks.py, `[testing] fsync_eio`).
    It must neither retry nor acknowledge, and exit with code 74; what its disk then holds is
    what a kernel that dropped the dirty pages leaves: its data dir rolled back to the last sync
    that succeeded (node/replication/sync_shadow.py restore, the nodes run with `sync_shadow`)."""
    kind = "fsync-eio"
    WAIT_S = 15.0

    async def act(self, i):
        env, c = self.env, self.env.cluster
        p = c.procs.get(i)
        await asyncio.to_thread(fault_hooks.arm, c.data_dir(i))
        end = time.monotonic() + self.WAIT_S
        code = None
        while time.monotonic() < end and p is not None:
            code = p.poll()
            if code is not None or i in env.down:
                break
            await asyncio.sleep(0.02)
        if code is None or code < 0 or i in env.down and code != 74:
            # Not this fault's doing: no sync came, or another fault of the step killed the node
            # first. Disarm, so that no later life of the node fails a sync for it.
            fault_hooks_disarm(c.data_dir(i))
            if code is None and i not in env.down:
                self.details["not_triggered"] = f"no journal sync within {self.WAIT_S:g} s"
            else:
                self.details["interrupted"] = "another fault of the step killed the node first"
            if i not in env.down:
                await env.kill(i)
        else:
            env.down.add(i)
            self.details["exit_code"] = code
            self.details["logged"] = _storage_failure_logged(c.log_path(i))
        async with env.proc_lock:
            if c.alive(i):                  # restarted meanwhile by another fault: leave it
                self.details["restore"] = {"skipped": "the node is running again"}
                return
            self.details["restore"] = await asyncio.to_thread(sync_shadow.restore, c.data_dir(i), c.durability)

    async def undo(self, i):
        await self.restart_and_look(i)


def fault_hooks_disarm(data_dir):
    try:
        os.unlink(Path(data_dir) / fault_hooks.FAIL_NEXT_SYNC)
    except OSError:
        pass


def _storage_failure_logged(path) -> bool:
    """The node's log names the file and the errno of the failed sync."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return False
    return any("storage failure:" in line and "raft.journal" in line and ("rrno 5" in line)
               for line in text.splitlines()[-50:])


class DiskFull(DiskFault):
    """Fill the node's data filesystem: below its free-space reserve (writes refused, a leader
    hands over) or to the last block (a write or sync fails: the node exits 74 and cannot start
    until space is back). Heal frees it and restarts the node if it exited."""
    kind = "disk-full"

    async def act(self, i):
        env, c = self.env, self.env.cluster
        full = self.rng.random() < 0.3
        self.details["to"] = "full" if full else "below the reserve"
        env.filled.add(i)
        if env.disks is not None:
            leave = 0 if full else max(1, env.reserve_bytes // 2)
            self.details.update(await asyncio.to_thread(env.disks.fill, c.ids[i], leave))
        else:
            self.details["hook"] = True
            await asyncio.to_thread(fault_hooks.set_free, c.data_dir(i), 0 if full else max(1, env.reserve_bytes // 2))
        # The node looks at its free space twice a second: the fault counts from when it says it
        # is low (or is gone: a full disk failed a write), so the unavailability is the outage.
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            v = await env.view(i, timeout=0.5)
            p = c.procs.get(i)
            if (v is not None and (v.get("disk") or {}).get("low_space")) or (p is not None and p.poll() is not None):
                self.mark()
                break
            await asyncio.sleep(0.05)

    async def undo(self, i):
        env, c = self.env, self.env.cluster
        if env.disks is not None:
            self.details["after"] = await asyncio.to_thread(env.disks.unfill, c.ids[i])
        else:
            await asyncio.to_thread(fault_hooks.clear_free, c.data_dir(i))
        env.filled.discard(i)
        p = c.procs.get(i)
        if p is not None and p.poll() is not None and i not in env.down:
            if p.returncode >= 0:           # a signal: another fault's kill, not the full disk
                self.details["exit_code"] = p.returncode
            env.down.add(i)
            await self.restart_and_look(i)


class ClockStrobe(OneNodeFault):
    kind = "clock-strobe"
    pick = Fault._leader_or_any

    async def act(self, i):
        env = self.env
        amplitude = self.rng.choice(STROBE_AMPLITUDES_MS)
        period = self.rng.choice(STROBE_PERIODS_MS)
        self.details.update(amplitude_ms=amplitude, period_ms=period)
        env.max_forward_skew_ms = max(env.max_forward_skew_ms, amplitude)
        env.strobed.add(i)
        await asyncio.to_thread(fault_hooks.start_strobe, env.cluster.data_dir(i), amplitude, period)

    async def undo(self, i):
        await asyncio.to_thread(fault_hooks.stop_strobe, self.env.cluster.data_dir(i))
        self.env.strobed.discard(i)


FAULTS = {cls.kind: cls for cls in (KillLeader, KillFollower, KillAll, PauseLeader, WipeNode, PartitionLeader,
                                      PartitionMinority, PartitionOneway, PartitionRing, Latency, Reset, ClockSkew,
                                      PowerLoss, Bitflip, Truncate, Rollback, FsyncEio, DiskFull, ClockStrobe)}


# ---------------------------------------------------------------------------- fault lines
def _nodes(xs) -> str:
    return ", ".join(xs or ()) or "?"


def _what(r: dict) -> tuple[str, str]:
    """(the target, the particulars) of a fault record, in words."""
    k, node = r["kind"], r.get("node", "?")
    if k in ("kill-leader", "kill-follower", "pause-leader"):
        return node, "leader not known, any node" if r.get("leader_unknown") else ""
    if k == "kill-all":
        return "every node", f"in the order {_nodes(r.get('nodes'))}"
    if k == "wipe-node":
        return node, "data deleted" if r.get("wiped") else "not wiped (the others had not caught up): a crash"
    if k == "partition-leader":
        return r.get("isolated", "?"), "cut off from every peer"
    if k == "partition-minority":
        lead = " (the leader on their side)" if r.get("with_leader") else ""
        return _nodes(r.get("minority")), f"cut off from the majority{lead}"
    if k == "partition-oneway":
        way = "outgoing" if r.get("direction") == "out" else "incoming"
        return node, f"its {way} traffic stalled" + (" (the leader)" if r.get("leader") else "")
    if k == "partition-ring":
        if r.get("cut"):
            return "-".join(r["cut"]), "this link cut, both still see the third node"
        return " - ".join(r.get("ring") or ()), "a ring: each node sees only its neighbours"
    if k == "latency":
        return _nodes(r.get("links")), f"{r.get('latency_ms', '?')} ms, jitter {r.get('jitter_ms', '?')} ms"
    if k == "reset":
        return "random links", f"{r.get('resets', 0)} rounds of connection resets"
    if k == "clock-skew":
        off = r.get("offset_ms", 0)
        return node, f"clock {'+' if off >= 0 else ''}{off / 1000:g} s" + (", it led" if r.get("skewed_leads") else "")
    if k == "power-loss":
        return "every node", f"{r.get('entries_dropped', 0)} unsynced journal entries dropped"
    if k == "bitflip":
        return node, f"{len(r.get('bits') or ())} bit(s) flipped in {r.get('file', '?')}" + _found(r)
    if k == "truncate":
        return node, f"{r.get('file', '?')} cut by {r.get('bytes_cut', '?')} bytes" + _found(r)
    if k == "rollback":
        return node, f"data dir put back to a copy {_secs(r.get('t_inject'), r.get('stashed_at'))} old"
    if k == "fsync-eio":
        if "exit_code" in r:
            return node, f"journal fsync failed, exit code {r['exit_code']}"
        return node, r.get("not_triggered") or r.get("interrupted") or "no sync failed"
    if k == "disk-full":
        to = "to the last block" if r.get("to") == "full" else "below its reserve"
        return node, f"disk filled {to}" + (f", exit code {r['exit_code']}" if "exit_code" in r else "")
    if k == "clock-strobe":
        return node, f"clock jumps +-{r.get('amplitude_ms', 0) / 1000:g} s every {r.get('period_ms', '?')} ms"
    return node, ""


def _found(r: dict) -> str:
    found = r.get("found")
    if r.get("damage_skipped"):
        return f" (skipped: {r['damage_skipped']})"
    if found:
        return "; found: " + ", ".join(sorted(found))
    return "; not found" if found is not None else ""


def _secs(a, b) -> str:
    return "?" if a is None or b is None else f"{a - b:.1f} s"


def describe_fault(r: dict) -> str:
    """One line for a fault record: `kill-leader n2 at 12.3 s, back after 1.5 s`."""
    k = r["kind"]
    if r.get("skipped"):
        return f"{k} skipped: {r['skipped']}"
    who, more = _what(r)
    line = k + (f" {who}" if who else "") + ("" if r.get("t_inject") is None else f" at {r['t_inject']:.1f} s")
    if r.get("t_heal") is not None and r.get("t_inject") is not None:
        back = "back" if k.startswith(("kill", "pause", "wipe", "power", "clock-skew")) else "healed"
        line += f", {back} after {r['t_heal'] - r['t_inject']:.1f} s"
    if r.get("error"):
        more = f"the fault failed: {r['error']}" + (f"; {more}" if more else "")
    return line + (f": {more}" if more else "") + (" (mixed)" if r.get("mixed") else "")


# ---------------------------------------------------------------------------- the schedule
@dataclass
class ScheduleConfig:
    kinds: tuple = KINDS
    quiet_s: tuple = (2.0, 6.0)
    mix_prob: float = 0.35
    max_mix: int = 3
    stagger_s: tuple = (0.0, 1.5)
    hold_scale: float = 1.0
    recovery_timeout_s: float = 30.0
    # Leader kills are the scenario that matters most (docs/cluster.md "What each fault does",
    # its first row): drawn more often alone.
    weights: dict = field(default_factory=lambda: {"kill-leader": 2.5})


@dataclass
class Step:
    quiet_s: float
    faults: list = field(default_factory=list)      # [(kind, offset_s, hold_s)]


def plan_step(rng: random.Random, cfg: ScheduleConfig) -> Step:
    """The next step of the schedule; depends only on the seeded rng and the config."""
    step = Step(quiet_s=rng.uniform(*cfg.quiet_s))
    kinds = list(cfg.kinds)
    mixable = [k for k in kinds if k not in EXCLUSIVE]
    chosen: list[str] = []
    if len(mixable) >= 2 and rng.random() < cfg.mix_prob:
        want = rng.randint(2, max(2, cfg.max_mix))
        pool = list(mixable)
        rng.shuffle(pool)
        for k in pool:
            if len(chosen) >= want:
                break
            if k in PARTITIONS and any(c in PARTITIONS for c in chosen):
                continue
            if k in DISK_DAMAGE and any(c in DISK_DAMAGE for c in chosen):
                continue
            chosen.append(k)
    else:
        chosen = rng.choices(kinds, weights=[cfg.weights.get(k, 1.0) for k in kinds])
    for n, k in enumerate(chosen):
        lo, hi = HOLD_S[k]
        hold = rng.uniform(lo, hi) * cfg.hold_scale
        if k == "pause-leader":
            hold = max(hold, 2.5)                    # past the election timeout
        offset = 0.0 if n == 0 else rng.uniform(*cfg.stagger_s)
        step.faults.append((k, offset, hold))
    return step


class Nemesis:
    def __init__(self, env: Env, seed: int, cfg: ScheduleConfig | None = None, on_event=None):
        self.env = env
        self.cfg = cfg or ScheduleConfig()
        self.sched = random.Random(seed)
        self.targets = random.Random(f"{seed}-targets")
        self.faults: list[Fault] = []
        self.active: list[Fault] = []
        self.steps: list[dict] = []
        self.on_event = on_event or (lambda msg: None)
        self.stop_at: float | None = None

    def records(self) -> list[dict]:
        return [f.record() for f in self.faults]

    async def run(self, stop_at: float):
        """Steps until history time `stop_at` (a step that started always finishes healing)."""
        self.stop_at = stop_at
        env = self.env
        while True:
            step = plan_step(self.sched, self.cfg)
            if env.h.now() + step.quiet_s >= stop_at:
                break
            await asyncio.sleep(step.quiet_s)
            await self.run_step(step)
            t = env.h.now()
            rec = await env.wait_healthy(self.cfg.recovery_timeout_s)
            self.steps[-1]["recovered_s"] = None if rec is None else round(env.h.now() - t, 3)
            if rec is None:
                self.on_event("cluster not healthy after a step; healing everything")
                await self.heal_all()
            if env.h.now() >= stop_at:
                break

    async def run_step(self, step: Step):
        fids = []

        async def one(kind, offset, hold):
            await asyncio.sleep(offset)
            fault = FAULTS[kind](self.env, self.targets, len(self.faults))
            fault.details["mixed"] = len(step.faults) > 1
            self.faults.append(fault)
            fids.append(fault.fid)
            self.active.append(fault)
            try:
                await fault.inject()
                if fault.skipped:
                    self.on_event(f"{kind} skipped: {fault.skipped}")
                    return
                self.on_event(describe_fault(fault.record()))
                await asyncio.sleep(hold)
                await fault.heal()
                fault.t_heal = self.env.h.now()
                self.on_event(f"healed: {describe_fault(fault.record())}")
            except Exception as e:                       # a fault must never kill the run
                fault.details["error"] = f"{type(e).__name__}: {e}"
                self.on_event(f"{kind} failed: {e}")
            finally:
                self.active.remove(fault)

        await asyncio.gather(*(one(*f) for f in step.faults))
        self.steps.append({"quiet_s": round(step.quiet_s, 3), "faults": fids,
                           "kinds": [f[0] for f in step.faults]})

    async def heal_all(self):
        """Make everything normal again: network, paused and dead nodes, clock offsets."""
        env = self.env
        env.net_faults.clear()
        await env.apply_net()
        for i in list(env.paused):
            await env.resume(i)
        for i in list(env.skewed):
            await env.kill(i)
            env.cluster.node_testing.get(i, {}).pop("clock_offset_ms", None)
            env.skewed.pop(i, None)
        for i in list(env.strobed):
            fault_hooks.stop_strobe(env.cluster.data_dir(i))
            env.strobed.discard(i)
        for i in list(env.filled):
            if env.disks is not None:
                env.disks.unfill(env.cluster.ids[i])
            else:
                fault_hooks.clear_free(env.cluster.data_dir(i))
            env.filled.discard(i)
        for i in range(env.n):
            if i in env.down or not env.cluster.alive(i):
                await env.start(i)


# ---------------------------------------------------------------------------- leader sampler
class Sampler:
    """Polls every node's /v1/cluster and records every (term, leader) claim."""

    def __init__(self, env: Env, interval_s: float = 0.15, sink=None):
        self.env = env
        self.sink = sink            # a file: one JSON line per node view that changed (diagnostics)
        self._prev: dict = {}
        self.interval_s = interval_s
        self.claims: dict[int, set] = {}
        self.first_seen: dict[int, tuple] = {}     # term -> (leader, history time first seen)
        # Views of a node leading or standing for election while its log was untrusted (the
        # disk checks): the checker's checksum_failures_contained wants none.
        self.untrusted_claims: list[dict] = []
        self.samples = 0
        self.last: dict = {}
        self.task: asyncio.Task | None = None

    def start(self):
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def sample_once(self):
        views = await self.env.views(timeout=0.5)
        self.samples += 1
        now = round(self.env.h.now(), 3)
        for i, v in views.items():
            self.last[i] = v
            if self.sink is not None:
                brief = None if v is None else (
                    v.get("role"), v.get("term"), (v.get("leader") or {}).get("id"), v.get("commit_index"),
                    v.get("last_applied"), "".join("1" if m.get("connected") else "0" for m in v.get("members", [])),
                    (v.get("disk") or {}).get("log_verified", True))
                if self._prev.get(i, "-") != brief:
                    self._prev[i] = brief
                    self.sink.write(orjson.dumps({"t": now, "node": self.env.cluster.ids[i], "view": brief}) + b"\n")
            if v is None:
                continue
            if v.get("role") in ("leader", "candidate") and (v.get("disk") or {}).get("log_verified") is False:
                self.untrusted_claims.append({"t": now, "node": v["node_id"], "role": v["role"], "term": v.get("term"),
                                              "unverified": (v.get("disk") or {}).get("unverified")})
            if v.get("role") == "leader":
                term = int(v["term"])
                self.claims.setdefault(term, set()).add(v["node_id"])
                self.first_seen.setdefault(term, (v["node_id"], round(self.env.h.now(), 3)))
        return views

    async def _run(self):
        while True:
            try:
                await self.sample_once()
            except Exception:
                pass
            await asyncio.sleep(self.interval_s)

    async def stop(self):
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass

    def leader_now(self) -> tuple[str | None, int | None]:
        best = None
        for v in self.last.values():
            if v and v.get("role") == "leader" and (best is None or v["term"] > best["term"]):
                best = v
        return (best["node_id"], best["term"]) if best else (None, None)
