"""Online membership change (docs/cluster.md "Membership changes") on real node processes, under load:
a producer and a worker loop on raftq's Client enqueue, reserve and ack the whole time. Each
change must cost no failed client call and no acknowledged job, and leave every member with the
same state digest. The write unavailability of each change (the longest gap between two
successful writes while it ran) is printed (`pytest -s`).
"""
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftq.cluster.client import Client
from raftq.cluster.local import LocalCluster, http_json

ROOT = Path(__file__).resolve().parents[2]
GAPS: dict[str, float] = {}


def call(c: LocalCluster, method, path, body=None, node=None, timeout=120.0, headers=None):
    """One API call to the leader (or `node`), following 307 like any HTTP client."""
    url = c.urls[node if node is not None else c.wait_leader(30)] + path
    for _ in range(5):
        status, out = http_json(method, url, body, timeout=timeout, headers=headers)
        if status == 307:
            url = out["error"]["leader_url"] + path
            continue
        return status, out
    raise AssertionError("redirect loop")


def ids_of(view):
    return sorted(m["id"] for m in view["members"])


def wait_members(c: LocalCluster, among, want, timeout=20.0):
    """Every node of `among` shows the membership `want` (ids)."""
    end = time.monotonic() + timeout
    views = []
    while time.monotonic() < end:
        views = c.cluster_views(among, digest=False)
        if all(v and ids_of(v) == sorted(want) for v in views):
            return views
        time.sleep(0.1)
    raise AssertionError(f"members never became {sorted(want)}: {[v and ids_of(v) for v in views]}")


class Load:
    """A producer and a worker on one Client (the session transport), recording every failure
    and when each write succeeded."""

    def __init__(self, c: LocalCluster, queue: str):
        self.c, self.queue = c, queue
        self.client = Client(c.urls, timeout=30)
        self.enqueued: dict[str, int] = {}      # job id -> payload index, for every enqueue that returned
        self.acked: set[str] = set()
        self.failures: list[str] = []
        self.writes: list[float] = []           # monotonic time of each successful write
        self.stopping = False
        self.tasks = []
        self.marks = []

    async def produce(self):
        i = 0
        while not self.stopping:
            try:
                r = await self.client.enqueue(self.queue, "m", str(i))
                self.enqueued[r.job_id] = i
                self.writes.append(time.monotonic())
            except Exception as e:
                self.failures.append(f"enqueue {i}: {e!r}")
            i += 1
            await asyncio.sleep(0.01)

    async def work(self):
        while not self.stopping:
            try:
                jobs = await self.client.reserve([self.queue], lease_ms=60_000, max_jobs=8, wait_ms=200)
            except Exception as e:
                self.failures.append(f"reserve: {e!r}")
                continue
            if jobs:
                self.writes.append(time.monotonic())
            for j in jobs:
                try:
                    await self.client.ack(j)
                    self.acked.add(j.id)
                    self.writes.append(time.monotonic())
                except Exception as e:
                    self.failures.append(f"ack {j.id}: {e!r}")

    async def __aenter__(self):
        self.tasks = [asyncio.create_task(self.produce()), asyncio.create_task(self.work())]
        await self.until(lambda: len(self.acked) >= 20, "the load to run")
        return self

    async def __aexit__(self, *exc):
        if exc[0] is None:      # enough load around the changes to judge
            await self.until(lambda: len(self.acked) > 80, "more load after the changes")
        self.stopping = True
        await asyncio.wait_for(asyncio.gather(*self.tasks), 60)
        await self.client.close()

    async def until(self, cond, what, timeout=30.0):
        end = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < end, f"timed out waiting for {what}; failures {self.failures[:3]}"
            await asyncio.sleep(0.05)

    async def change(self, name: str, fn):
        """Run the blocking change `fn` while the load goes on; record and print the write
        unavailability: the longest gap between successful writes from its start to its end."""
        t0 = time.monotonic()
        self.marks.append((name, time.time()))
        result = await asyncio.to_thread(fn)
        t1 = time.monotonic()
        n = len(self.writes)
        await self.until(lambda: len(self.writes) > n + 5, f"writes after {name}")
        t2 = self.writes[n + 5]
        marks = [t0] + [t for t in self.writes if t0 <= t <= t2] + [t2]
        gap = max(b - a for a, b in zip(marks, marks[1:]))
        GAPS[name] = gap
        print(f"\n[members] {name}: took {t1 - t0:.2f} s, longest gap between successful writes {gap * 1000:.0f} ms")
        return result

    async def check(self, c: LocalCluster, members):
        """No failed call; every acknowledged job is acked or still in the queue (drained here),
        none twice; the same digest on every member."""
        assert self.failures == [], self.failures[:5]
        assert len(self.acked) > 80 and len(self.enqueued) > 80
        drained = []
        async with Client([c.urls[i] for i in members], transport="http", timeout=30) as drainer:
            while True:
                jobs = await drainer.reserve([self.queue], lease_ms=60_000, max_jobs=256)
                if not jobs:
                    break
                drained += [j.id for j in jobs]
                assert await drainer.ack_batch(jobs) == [None] * len(jobs)
            stats = await drainer.queue(self.queue)
            missing = set(self.enqueued) - set(drained) - self.acked
            views = {}
            if missing:
                views = await drainer.call("jobs", "GET", f"/v1/queues/{self.queue}/jobs?state=in_flight", mutating=False)
                views["changes"] = self.marks
                views["now"] = time.time()
        assert not set(drained) & self.acked, "a job acked under load was delivered again"
        assert not missing, f"acknowledged jobs lost: {views} {stats}"
        assert stats["enqueued"] == len(self.enqueued) and stats["ready"] == 0 and stats["in_flight"] == 0
        views = c.wait_converged(30, among=members)
        assert len({v["digest"] for v in views}) == 1


def cluster(tmp_path, name, **kw) -> LocalCluster:
    return LocalCluster(tmp_path / name, **kw).launch()


def removed_view(c, i):
    v = c.cluster_view(i, digest=False)
    return v is not None and v.get("removed") is True and v["leader"] is None


# ---------------------------------------------------------------------------- replace a node
async def test_replace_a_node_by_one_at_a_new_address_under_load(tmp_path):
    c = cluster(tmp_path, "replace")
    try:
        async with Load(c, "replace") as load:
            new = c.add_node()          # a config naming n1..n3 and itself, new ports
            c.start(new)
            old = next(i for i in range(3) if i != c.wait_leader())
            status, out = await load.change("replace: add n4", lambda: call(c, "POST", "/v1/cluster/members", c.member(new)))
            assert status == 200 and out["changed"] is True, out
            assert [m["id"] for m in out["members"]] == ["n1", "n2", "n3", "n4"]
            c.members_count = 4
            await asyncio.to_thread(wait_members, c, range(4), ["n1", "n2", "n3", "n4"])
            status, out = await load.change(f"replace: remove {c.ids[old]}",
                                            lambda: call(c, "DELETE", f"/v1/cluster/members/{c.ids[old]}"))
            assert status == 200 and c.ids[old] not in [m["id"] for m in out["members"]], out
            c.members_count = 3
            rest = [i for i in range(4) if i != old]
            views = await asyncio.to_thread(wait_members, c, rest, [c.ids[i] for i in rest])
            for v in views:         # id, raft and url of every member, on every member
                assert {m["id"]: (m["raft"], m["url"]) for m in v["members"]} == \
                       {c.ids[i]: (c.member(i)["raft"], c.urls[i]) for i in rest}
            # The removed node says why and serves nothing.
            await asyncio.to_thread(lambda: poll_true(lambda: removed_view(c, old), "the removed node's view"))
            status, body = http_json("GET", c.urls[old] + "/v1/queues")
            assert status == 503 and body["error"]["code"] == "unavailable" and "removed" in body["error"]["message"]
            assert http_json("GET", c.urls[old] + "/readyz")[0] == 503
            assert "was removed from the cluster" in c.log_path(old).read_text()
        await load.check(c, rest)
        # A client that knows only the removed node learns the members from it, and uses them.
        async with Client([c.urls[old]], transport="http", timeout=15) as fresh:
            await fresh.enqueue("replace", "m", "after")
            assert c.urls[new] in fresh.urls and fresh.leader in [c.urls[i] for i in rest]
    finally:
        c.close()


def poll_true(fn, what, timeout=20.0):
    end = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)
    return True


# ---------------------------------------------------------------------------- grow and shrink
async def test_grow_3_to_5_and_shrink_back_to_3_under_load(tmp_path):
    c = cluster(tmp_path, "grow")
    try:
        async with Load(c, "grow") as load:
            for want in (4, 5):
                i = c.add_node()
                c.start(i)
                status, out = await load.change(f"grow: add {c.ids[i]}",
                                                lambda: call(c, "POST", "/v1/cluster/members", c.member(i)))
                assert status == 200 and len(out["members"]) == want, out
                c.members_count = want
                await asyncio.to_thread(wait_members, c, range(want), c.ids[:want])
            n = len(load.writes)
            await load.until(lambda: len(load.writes) > n + 50, "writes on five members")
            # Shrink by two of the original members (not the leader): the new ones hold the state now.
            leader = c.wait_leader()
            gone = [i for i in range(3) if i != leader][:2]
            for k, i in enumerate(gone):
                status, out = await load.change(f"shrink: remove {c.ids[i]}",
                                                lambda: call(c, "DELETE", f"/v1/cluster/members/{c.ids[i]}"))
                assert status == 200 and len(out["members"]) == 4 - k, out
                c.members_count = 4 - k
            rest = [i for i in range(5) if i not in gone]
            await asyncio.to_thread(wait_members, c, rest, [c.ids[i] for i in rest])
            for i in gone:
                await asyncio.to_thread(lambda: poll_true(lambda: removed_view(c, i), f"{c.ids[i]} removed"))
        await load.check(c, rest)
    finally:
        c.close()


# ---------------------------------------------------------------------------- the leader
async def test_removing_the_leader_hands_leadership_over_first(tmp_path):
    c = cluster(tmp_path, "leader")
    try:
        async with Load(c, "leader") as load:
            leader = c.wait_leader()
            term = c.cluster_view(leader, digest=False)["term"]
            status, out = await load.change("remove the leader",
                                            lambda: call(c, "DELETE", f"/v1/cluster/members/{c.ids[leader]}"))
            assert status == 200 and c.ids[leader] not in [m["id"] for m in out["members"]], out
            c.members_count = 2
            rest = [i for i in range(3) if i != leader]
            await asyncio.to_thread(wait_members, c, rest, [c.ids[i] for i in rest])
            new = c.wait_leader(among=rest)
            # One handover: the target stands at once (term + 1). On a loaded machine its first
            # elections can fail and a later one elect a member (term + 2 seen in a full suite
            # run, 1.35 s without writes; term + 3 twice on a machine running two suites at once,
            # 1.1-1.3 s without writes); more would be a handover that does not work.
            assert new != leader and term + 1 <= c.cluster_view(new, digest=False)["term"] <= term + 3
            text = c.log_path(leader).read_text()
            assert "handing leadership over first" in text and "was removed from the cluster" in text
            await asyncio.to_thread(lambda: poll_true(lambda: removed_view(c, leader), "the old leader removed"))
        await load.check(c, rest)
    finally:
        c.close()


# ---------------------------------------------------------------------------- restart
def test_a_restart_of_every_member_keeps_the_new_membership_whatever_the_tomls_say(tmp_path):
    # Small compaction thresholds: snapshots are taken after the change, so the restart loads
    # the membership from a snapshot as well as from the journal and the members file.
    c = cluster(tmp_path, "restart", tuning={"log_compaction_min_entries": 50, "log_compaction_min_time_s": 2})
    try:
        new = c.add_node()
        c.start(new)
        assert call(c, "POST", "/v1/cluster/members", c.member(new))[0] == 200
        c.members_count = 4
        assert call(c, "DELETE", "/v1/cluster/members/n3")[0] == 200
        c.members_count = 3
        live = [0, 1, 3]
        wait_members(c, live, ["n1", "n2", "n4"])
        for k in range(150):
            body = {"queue": "r", "job_type": "t", "payload": {"data_b64": "eA==", "encoding": "application/octet-stream"}}
            assert call(c, "POST", "/v1/jobs", body)[0] == 200
        poll_true(lambda: all((c.data_dir(i) / "raft.dump").exists() for i in live), "snapshots on every member", 30)
        members_file = json.loads((c.data_dir(0) / "members.json").read_text())
        assert [m["id"] for m in members_file["members"]] == ["n1", "n2", "n4"] and not members_file["removed"]
        assert "n3" in c.config_path(0).read_text() and "n4" not in c.config_path(0).read_text()
        c.stop_all()
        for i in live:              # the old TOMLs: n1 and n2 still list n1, n2, n3
            c.start(i)
        c.wait_leader(30, among=live)
        wait_members(c, live, ["n1", "n2", "n4"])
        assert call(c, "POST", "/v1/jobs", {"queue": "r", "job_type": "t"})[0] == 200
        assert "the membership in force (changed online" in c.log_path(0).read_text()
        c.wait_converged(30, among=live)
        # The removed node, restarted with its own old TOML, stays out and says so.
        c.start(2)
        poll_true(lambda: removed_view(c, 2), "n3 removed after its restart")
        assert http_json("GET", c.urls[2] + "/v1/queues")[0] == 503
        wait_members(c, live, ["n1", "n2", "n4"])
    finally:
        c.close()


# ---------------------------------------------------------------------------- refusals and the CLI
def raftq(*args, urls, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("RAFTQ_URLS", "RAFTQ_API_KEY")}
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "raftq.cluster.cli", *args, "--urls", ",".join(urls)],
                       capture_output=True, text=True, env=e, cwd=str(ROOT), timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def test_refusals_one_change_at_a_time_and_the_cli(tmp_path):
    keys = [{"name": "root", "key": "admin-key-0123456789abcdef", "role": "admin"},
            {"name": "w", "key": "worker-key-0123456789abcdef", "role": "worker"}]
    admin = {"Authorization": f"Bearer {keys[0]['key']}"}
    c = cluster(tmp_path, "refuse", api_keys=keys)
    env = {"RAFTQ_API_KEY": keys[0]["key"]}
    try:
        new = c.add_node()          # not started yet: its add waits for it to catch up
        pool = __import__("concurrent.futures").futures.ThreadPoolExecutor(1)
        pending = pool.submit(call, c, "POST", "/v1/cluster/members", c.member(new), headers=admin)
        poll_true(lambda: (c.cluster_view(c.wait_leader()) or {}).get("membership_change"), "the add under way")
        status, out = call(c, "POST", "/v1/cluster/members", {"id": "n9", "raft": "127.0.0.1:1", "url": "http://x:1"},
                           headers=admin)
        assert status == 409 and out["error"]["code"] == "failed_precondition" and "under way" in out["error"]["message"]
        status, out = call(c, "DELETE", "/v1/cluster/members/n2", headers=admin)
        assert status == 409 and "one change at a time" in out["error"]["message"]
        # The node starts late: the add completes.
        c.start(new)
        status, out = pending.result(60)
        assert status == 200 and [m["id"] for m in out["members"]] == ["n1", "n2", "n3", "n4"], out
        c.members_count = 4
        # Refused: unknown id, an existing id or address, a worker's key, a malformed body.
        status, out = call(c, "DELETE", "/v1/cluster/members/nope", headers=admin)
        assert status == 404 and out["error"]["code"] == "not_found"
        status, out = call(c, "POST", "/v1/cluster/members", {**c.member(new), "id": "n5"}, headers=admin)
        assert status == 409 and "already has raft" in out["error"]["message"]
        status, out = call(c, "POST", "/v1/cluster/members", {**c.member(0), "raft": "127.0.0.1:2", "url": "http://a:2"},
                           headers=admin)
        assert status == 409 and "already has id" in out["error"]["message"]
        assert call(c, "POST", "/v1/cluster/members", c.member(new), headers=admin)[1]["changed"] is False
        status, out = call(c, "DELETE", "/v1/cluster/members/n2", headers={"Authorization": f"Bearer {keys[1]['key']}"})
        assert status == 403
        status, out = call(c, "POST", "/v1/cluster/members", {"id": "n5", "raft": "nope"}, headers=admin)
        assert status == 400
        # A follower redirects like every write, when asked to (else it forwards).
        follower = next(i for i in range(4) if i != c.wait_leader())
        status, out = http_json("DELETE", c.urls[follower] + "/v1/cluster/members/n4",
                                headers={**admin, "Raftq-Redirect": "1"})
        assert status == 307 and out["error"]["leader_url"]
        # The CLI: list, remove, add.
        code, text, err = raftq("members", "list", urls=c.urls[:1], env=env)
        assert code == 0 and all(i in text for i in ("n1", "n2", "n3", "n4")), (text, err)
        code, text, err = raftq("members", "remove", "n4", urls=c.urls[:1], env=env)
        assert code == 0 and "n4 removed" in text, err
        code, text, err = raftq("members", "remove", "n4", urls=c.urls[:1], env=env)
        assert code == 1 and "no member 'n4'" in err
        code, text, err = raftq("members", "list", "--json", urls=c.urls[:1], env=env)
        assert code == 0 and [m["id"] for m in json.loads(text)["members"]] == ["n1", "n2", "n3"]
        n5 = c.add_node(members=[0, 1, 2])
        c.start(n5)
        m = c.member(n5)
        code, text, err = raftq("members", "add", m["id"], m["raft"], m["url"], urls=c.urls[:1], env=env)
        assert code == 0 and "n5 added" in text, err
        wait_members(c, [0, 1, 2, n5], ["n1", "n2", "n3", "n5"])
        # Each committed change is an entry of the audit trail, with the caller's key name; the
        # refused ones and the add that changed nothing are not.
        status, out = call(c, "GET", "/v1/audit?limit=50", headers=admin)
        changes = [(e["action"], e["target"], e["who"], e["details"]) for e in out["entries"]
                   if e["action"].startswith("member_")]
        assert status == 200 and changes == [
            ("member_add", "n5", "root", {"raft": m["raft"], "url": m["url"]}),
            ("member_remove", "n4", "root", {"raft": c.member(new)["raft"], "url": c.member(new)["url"]}),
            ("member_add", "n4", "root", {"raft": c.member(new)["raft"], "url": c.member(new)["url"]})], changes
    finally:
        c.close()


def test_the_last_member_cannot_be_removed(tmp_path):
    c = cluster(tmp_path, "one", nodes=1)
    try:
        status, out = call(c, "DELETE", "/v1/cluster/members/n1")
        assert status == 409 and "last member" in out["error"]["message"]
        assert ids_of(c.cluster_view(0)) == ["n1"]
    finally:
        c.close()


def teardown_module():
    if GAPS:
        print("\n[members] write unavailability per change: "
              + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in GAPS.items()))
