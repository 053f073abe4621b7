"""A rolling upgrade from the previous release, as docs/operations.md "Upgrades" describes it:
three nodes of release 0.2.0 (tests/fixtures/release-0.2.0-node.tar.gz, the server side of tag
v0.2.0) take a producer's and a worker's load; each node in turn is stopped and started on its
own data dir with this release, the followers first and the leader last, while the load runs.
Nothing is lost: every enqueue that returned is acked exactly once, the idempotency keys written
by the old release still deduplicate, its dead letters are still there, and the nodes converge
on one digest. The nodes compact their logs often, so the new ones start from snapshots the old
release wrote.
"""
import asyncio
import os
import tarfile
from pathlib import Path

from raftq import __version__
from raftq.cluster.client import Client, Retry
from raftq.cluster.local import LocalCluster, http_json
from raftq.cluster.worker import Worker

from conftest import poll
from helpers_worker import until

FIXTURE = Path(__file__).parent.parent / "fixtures" / "release-0.2.0-node.tar.gz"
OLD = "0.2.0"


def node_version(c: LocalCluster, i: int) -> str | None:
    try:
        status, info = http_json("GET", c.urls[i] + "/v1/server-info", headers=c.probe_headers)
    except OSError:
        return None
    return info.get("server_version") if status == 200 else None


def wait_version(c: LocalCluster, i: int, version: str):
    poll(lambda: node_version(c, i) == version, 30, what=f"node {c.ids[i]} answering as {version}")


def upgrade(c: LocalCluster, i: int, new_env: dict):
    """Stop node i (SIGTERM, as systemctl does), start it on the same data dir with this release."""
    assert c.stop(i) is not None
    assert (c.data_dir(i) / "raft.dump").exists(), "no snapshot of the old release to start from"
    c.env = new_env
    c.start(i)
    wait_version(c, i, __version__)
    leader = c.wait_leader(30)
    caught_up(c, i, c.cluster_view(leader, digest=False)["commit_index"])


def caught_up(c: LocalCluster, i: int, index: int):
    """Node i has applied `index` (the load keeps the log moving, so the nodes' applied indexes
    are seldom equal at one moment while it runs)."""
    poll(lambda: (c.cluster_view(i, digest=False) or {}).get("last_applied", -1) >= index, 30,
         what=f"node {c.ids[i]} applying index {index}")


async def test_a_cluster_of_the_previous_release_is_upgraded_node_by_node_under_load(tmp_path):
    assert __version__ != OLD, "bump raftq.__version__ (or the fixture) before testing an upgrade to it"
    old = tmp_path / "release-0.2.0"
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(old, filter="data")
    new_env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    c = LocalCluster(tmp_path / "c", env={"PYTHONPATH": str(old)}, storage={"dead_letter_retention_ms": 86_400_000},
                     tuning={"log_compaction_min_entries": 200, "log_compaction_min_time_s": 1})
    c.launch()
    try:
        for i in range(c.n):
            wait_version(c, i, OLD)
        await roll_under_load(c, new_env)
    finally:
        c.close()


async def roll_under_load(c: LocalCluster, new_env: dict):
    returned: dict[int, str] = {}          # enqueue index -> job id
    acked: list[str] = []
    stop = asyncio.Event()
    async with Client(c.urls, timeout=30) as client:
        # Written by the old release: a key that must still deduplicate, a dead letter to keep.
        keyed = await client.enqueue("up", "w", b"keyed", idempotency_key="before-the-roll")
        dead = await client.enqueue("doomed", "w", b"x")
        (doomed,) = await client.reserve(["doomed"], 30_000)
        await client.nack(doomed, reason="before the roll", retry=Retry.dead_letter())

        async def produce():
            i = 0
            while not stop.is_set():
                returned[i] = (await client.enqueue("up", "w", str(i).encode())).job_id
                i += 1
                await asyncio.sleep(0.005)

        async def work(job):
            acked.append(job.id)

        w = Worker(client, ["up"], {"w": work}, concurrency=4, wait_ms=500)
        producer, worker = asyncio.create_task(produce()), asyncio.create_task(w.run())
        await until(lambda: len(acked) > 100, 60, what="the load running on the old release")
        # The old release compacts in the background: wait for its snapshots (a loaded machine
        # may not have written one yet), so that every new node starts from one.
        await until(lambda: all((c.data_dir(i) / "raft.dump").exists() for i in range(c.n)), 60,
                    what="a snapshot written by the old release on every node")
        leader = await asyncio.to_thread(c.wait_leader, 30)
        for i in [j for j in range(c.n) if j != leader] + [leader]:
            before = len(returned)
            await asyncio.to_thread(upgrade, c, i, new_env)
            await until(lambda: len(returned) > before + 50, 60, what=f"enqueues after upgrading {c.ids[i]}")
        stop.set()
        await asyncio.wait_for(producer, 60)
        await until(lambda: set(returned.values()) <= set(acked), 60, what="every returned enqueue acked")
        w.stop()
        await asyncio.wait_for(worker, 60)

        assert len(acked) == len(set(acked)), "a job was acked twice"
        assert set(acked) == set(returned.values()) | {keyed.job_id}
        again = await client.enqueue("up", "w", b"keyed", idempotency_key="before-the-roll")
        assert again.deduplicated and again.job_id == keyed.job_id
        letters = (await client.dead_letters("doomed"))["records"]
        stats = await client.queue("up")
        assert (stats["enqueued"], stats["acked"], stats["ready"], stats["in_flight"]) == (len(acked), len(acked), 0, 0)
    assert all(node_version(c, i) == __version__ for i in range(c.n))
    await asyncio.to_thread(c.wait_converged, 30)     # one applied index, one digest on all three
    assert [d.job.id for d in letters] == [dead.job_id] and letters[0].last_reason == "before the roll"
