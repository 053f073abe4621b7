"""Faults of the disk on real clusters (docs/chaos.md "Faults of the disk";
docs/cluster.md "Durability"): a node whose files were
damaged while it was down finds it, says so (CRITICAL log line, /metrics, /v1/cluster), does not
vote with the damaged log, and recovers from the leader; a failed journal sync makes the node
exit with code 74 naming the file and errno, and a restart recovers; below its free-space
reserve a node refuses writes (503 unavailable + Retry-After), a leader hands leadership to a
node with space, and writes resume by themselves when space is back.

Real node processes on loopback (cluster/local.py LocalCluster), no mocks."""
from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import time

import pytest

from raftq.cluster.chaos import diskfaults
from raftq.cluster.local import LocalCluster, http_json
from raftq.node.replication import fault_hooks
from raftq.node.service.disk import EXIT_STORAGE
from tests.conftest import Api, poll

skip_cluster = pytest.mark.skipif(os.environ.get("RAFTQ_SKIP_CHAOS", "") not in ("", "0"),
                                  reason="RAFTQ_SKIP_CHAOS set")


def enqueue_many(api: Api, n: int, prefix: str) -> list[str]:
    ids = []
    for i in range(n):
        s, out = api.enqueue("q", data=os.urandom(200), idempotency_key=f"{prefix}{i}")
        assert s == 200, out
        ids.append(out["job_id"] if "job_id" in out else out["id"])
    return ids


def all_there(api: Api, ids: list[str]):
    missing = [j for j in ids if api.get(f"/v1/jobs/{j}")[0] != 200]
    assert missing == [], f"{len(missing)} acknowledged jobs missing"


def disk_view(c: LocalCluster, i: int) -> dict | None:
    v = c.cluster_view(i, digest=False)
    return v["disk"] if v else None


def metric(c: LocalCluster, i: int, name: str) -> dict:
    import urllib.request
    text = urllib.request.urlopen(c.urls[i] + "/metrics", timeout=2).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(rf'{name}{{node="[^"]*"(?:,kind="([^"]*)")?}} (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def critical_lines(c: LocalCluster, i: int) -> list[str]:
    return [line for line in c.log_path(i).read_text(errors="replace").splitlines() if " CRITICAL " in line]


def follower_of(c: LocalCluster) -> tuple[int, int]:
    leader = c.wait_leader(20)
    return leader, next(i for i in range(c.n) if i != leader)


def damage(kind: str, d, rng: random.Random) -> set:
    """Damage data dir d; the findings the node must report (any one of them)."""
    if kind == "journal-middle":
        recs = diskfaults.journal_records(d / "raft.journal")
        off, size = recs[len(recs) // 2]
        diskfaults.flip(d / "raft.journal", [off + 8 + 16 + rng.randrange(size - 32)], rng)
        return {"journal_corrupt_entry"}
    if kind == "truncate":
        assert "skipped" not in diskfaults.truncate(d, rng)
        return {"journal_truncated"}
    if kind == "snapshot":
        size = (d / "raft.dump").stat().st_size
        diskfaults.flip(d / "raft.dump", [rng.randrange(size)], rng)
        return {"snapshot_damaged"}
    if kind == "meta":
        diskfaults.flip(d / "raft.journal.meta", [rng.randrange((d / "raft.journal.meta").stat().st_size)], rng)
        return {"meta_damaged"}
    raise ValueError(kind)


@skip_cluster
@pytest.mark.parametrize("kind", ["journal-middle", "truncate", "snapshot", "meta"])
def test_a_followers_damaged_files_are_found_and_repaired_from_the_leader(tmp_path, kind):
    rng = random.Random(kind)
    # Only the snapshot case needs a compaction. Elsewhere one would race the kill: a journal
    # compacted to a record or two has no middle record with valid ones after it (that damage
    # reads as a torn tail), nor records to cut (CI saw the first).
    tuning = {"log_compaction_min_entries": 40, "log_compaction_min_time_s": 1} if kind == "snapshot" else {}
    c = LocalCluster(tmp_path / "c", tuning=tuning).launch()
    try:
        api = Api(c)
        ids = enqueue_many(api, 120, "a")
        leader, f = follower_of(c)
        d = c.data_dir(f)
        if kind == "snapshot":
            poll(lambda: (d / "raft.dump").exists(), timeout=30, what="a snapshot on the follower")
        c.wait_converged(20)
        c.kill(f)
        expected = damage(kind, d, rng)
        ids += enqueue_many(api, 20, "b")                 # the cluster goes on without it
        c.start(f)
        found = poll(lambda: (v := disk_view(c, f)) and set(v["findings"]) & expected and v,
                     timeout=30, what=f"node {c.ids[f]} reporting {expected}")
        lines = critical_lines(c, f)
        assert any("disk check:" in line and any(k in line for k in expected) for line in lines), lines
        poll(lambda: (v := disk_view(c, f)) and v["log_verified"], timeout=40, what="the log trusted again")
        c.wait_converged(30)
        all_there(api, ids)
        assert set(metric(c, f, "raftq_disk_damage_found_total")) & expected
        assert metric(c, f, "raftq_log_verified") == {None: 1.0}
        if not found["log_verified"]:
            assert found["unverified"]["found"]
    finally:
        c.close()


@skip_cluster
def test_a_node_with_a_damaged_log_gives_no_vote_until_a_leader_repaired_it(tmp_path):
    """Two nodes up, one of them with a journal cut below what it knew committed: the healthy one
    needs the damaged one's vote and does not get it (no leader); once the third node is back,
    a leader is elected, repairs the damaged node, and nothing acknowledged is lost."""
    c = LocalCluster(tmp_path / "c").launch()
    try:
        api = Api(c)
        ids = enqueue_many(api, 60, "a")
        views = c.wait_converged(20)
        commit = views[0]["commit_index"]
        for i in range(3):
            c.stop(i)
        recs = diskfaults.journal_records(c.data_dir(0) / "raft.journal")
        os.truncate(c.data_dir(0) / "raft.journal", recs[len(recs) // 2][0] + 3)
        c.start(0)
        c.start(1)
        poll(lambda: (v := disk_view(c, 0)) and not v["log_verified"], timeout=20, what="n1 untrusted")
        end = time.monotonic() + 6.0                 # three election timeouts
        while time.monotonic() < end:
            for i in (0, 1):
                v = c.cluster_view(i, digest=False)
                assert v is None or v["role"] != "leader", v
            time.sleep(0.2)
        c.start(2)
        c.wait_leader(30)
        poll(lambda: (v := disk_view(c, 0)) and v["log_verified"], timeout=30, what="n1 repaired")
        views = c.wait_converged(30)
        assert views[0]["commit_index"] >= commit
        all_there(api, ids)
    finally:
        c.close()


# ---------------------------------------------------------------------------- failed syncs
@skip_cluster
@pytest.mark.parametrize("who", ["follower", "leader"])
def test_a_failed_journal_sync_stops_the_node_with_code_74_and_a_restart_recovers(tmp_path, who):
    c = LocalCluster(tmp_path / "c", testing={"fsync_eio": True, "sync_shadow": True}).launch()
    try:
        api = Api(c)
        ids = enqueue_many(api, 30, "a")
        leader, f = follower_of(c)
        target = leader if who == "leader" else f
        fault_hooks.arm(c.data_dir(target))
        # Writes go on; one of them makes the target sync its journal, which fails.
        deadline = time.monotonic() + 20
        while c.alive(target) and time.monotonic() < deadline:
            s, out = api.enqueue("q", data=b"x", idempotency_key=f"w{time.monotonic_ns()}")
            if s == 200:
                ids.append(out["job_id"] if "job_id" in out else out["id"])
        assert c.procs[target].wait(10) == EXIT_STORAGE
        text = c.log_path(target).read_text(errors="replace")
        lines = [x for x in text.splitlines() if "storage failure:" in x and "CRITICAL" in x]
        # The fork's line and the node's, each naming the file and the errno.
        assert len(lines) == 2 and all("raft.journal" in x and "rrno 5" in x for x in lines), lines
        assert f"exiting with code {EXIT_STORAGE}" in lines[1]
        assert not (c.data_dir(target) / fault_hooks.FAIL_NEXT_SYNC).exists()
        # What the disk holds after a failed fsync: the last sync that succeeded.
        from raftq.node.replication import sync_shadow
        out = sync_shadow.restore(c.data_dir(target), "fsync")
        assert "error" not in out, out
        ids += enqueue_many(api, 10, "b")                  # the others go on
        c.start(target)
        c.wait_converged(30)
        all_there(api, ids)
    finally:
        c.close()


# ---------------------------------------------------------------------------- the free-space reserve
def _root_can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mkfs.ext4") is not None


@skip_cluster
@pytest.mark.skipif(not _root_can_mount(), reason="needs root and mkfs.ext4 (loop-mounted filesystems)")
@pytest.mark.parametrize("engine", ["thread", "loop"])
def test_below_the_reserve_writes_are_refused_leadership_moves_and_writes_resume(tmp_path, engine):
    reserve = 16 << 20
    disks = diskfaults.SmallDisks(tmp_path / "disks", size_bytes=96 << 20)
    c = LocalCluster(tmp_path / "c", storage={"min_free_bytes": reserve}, tuning={"raft_engine": engine})
    try:
        for i in range(c.n):
            disks.mount(c.ids[i], c.data_dir(i))
        c.launch()
        api = Api(c)
        ids = enqueue_many(api, 20, "a")
        leader = c.wait_leader()
        disks.fill(c.ids[leader], leave_bytes=reserve // 2)
        # The leader refuses, then hands leadership to a node with space; writes go on there.
        new = c.wait_leader(20, exclude=leader)
        assert new != leader
        s, out = api.enqueue("q", data=b"x", idempotency_key="after-move")
        assert s == 200, out
        ids.append(out["job_id"] if "job_id" in out else out["id"])
        v = disk_view(c, leader)
        assert v["low_space"] and v["free_bytes"] < reserve
        # Every disk below the reserve: an outage of writes (503 unavailable, Retry-After), no restart.
        for i in range(c.n):
            disks.fill(c.ids[i], leave_bytes=reserve // 2)
        poll(lambda: all(disk_view(c, i)["low_space"] for i in range(c.n)), what="every node low on space")
        lead = c.wait_leader(20)
        status, body = http_json("POST", c.urls[lead] + "/v1/jobs", {"queue": "q", "job_type": "t"})
        assert status == 503 and body["error"]["code"] == "unavailable" and "min_free_bytes" in body["error"]["message"]
        import urllib.request
        req = urllib.request.Request(c.urls[lead] + "/v1/jobs", data=b'{"queue":"q","job_type":"t"}', method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=5)
        except urllib.error.HTTPError as e:
            assert e.code == 503 and e.headers["Retry-After"]
        assert metric(c, lead, "raftq_disk_low_space") == {None: 1.0}
        for i in range(c.n):
            disks.unfill(c.ids[i])
        s, out = poll(lambda: (r := api.enqueue("q", data=b"y", idempotency_key="resumed"))[0] == 200 and r,
                      timeout=20, what="writes resuming")
        ids.append(out["job_id"] if "job_id" in out else out["id"])
        assert all(c.alive(i) for i in range(c.n))
        c.wait_converged(20)
        all_there(api, ids)
    finally:
        c.close()
        disks.close()
