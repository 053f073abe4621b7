"""The client gives up when nothing answers: with every node down a call raises `Unreachable`
(an `Unavailable`) within its connect budget, naming each URL and how long it has refused; with one
node down calls succeed; a node that answers without a leader still gets the whole deadline. Real
node processes (LocalCluster), nothing mocked."""
import asyncio
import time

import pytest

from raftq import Unreachable as ExportedUnreachable
from raftq.cluster.cli.commands import EXIT_UNREACHABLE, explain
from raftq.cluster.client import Client, SyncClient, Unavailable, Unreachable
from raftq.cluster.local import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("unreachable"), durability="memory").launch()
    try:
        yield c
    finally:
        c.close()


def restore(c: LocalCluster):
    for i in range(c.n):
        if not c.alive(i):
            c.start(i)
    c.wait_leader(30)
    c.wait_converged(30)


@pytest.mark.parametrize("transport", ["session", "http"])
async def test_every_node_down_fails_within_the_connect_budget_naming_the_urls(cluster, transport):
    c = cluster
    await asyncio.to_thread(restore, c)
    async with Client(c.urls, transport=transport) as client:
        await client.enqueue("u", "t", b"before")            # a working client: leader known, session open
        await asyncio.to_thread(c.kill_all)
        t0 = time.monotonic()
        with pytest.raises(Unreachable) as info:
            await client.enqueue("u", "t", b"after")
        took = time.monotonic() - t0
        assert took < 5.0, took                              # not the 30 s deadline
        e = info.value
        assert isinstance(e, Unavailable) and e.code == "unreachable"
        assert set(e.refused) == set(c.urls)
        for url in c.urls:
            assert url in e.message
            assert e.refused[url]["reason"] == "connection refused" and e.refused[url]["for_s"] >= 2.5
        assert "connection refused for " in e.message
        # Nothing reached a node during the call, unless the session's end raced the call.
        assert ("outcome is unknown" if e.maybe_sent else "nothing was sent") in e.message
        assert "raftq up" in e.message
        # The next call fails as fast, and says the nodes have been refusing for longer.
        t0 = time.monotonic()
        with pytest.raises(Unreachable) as again:
            await client.queues()
        assert time.monotonic() - t0 < 5.0
        assert min(r["for_s"] for r in again.value.refused.values()) > max(r["for_s"] for r in e.refused.values())
    await asyncio.to_thread(restore, c)


async def test_one_node_down_calls_succeed(cluster):
    c = cluster
    await asyncio.to_thread(restore, c)
    dead = c.wait_leader()
    c.kill(dead)                            # the leader, first in the client's list: refused every time
    urls = [c.urls[dead]] + [u for i, u in enumerate(c.urls) if i != dead]
    for transport in ("session", "http"):
        async with Client(urls, transport=transport, timeout=20) as client:
            for i in range(5):
                r = await client.enqueue("one-down", "t", str(i))
                assert r.job_id
            assert client.leader != c.urls[dead]
    await asyncio.to_thread(restore, c)


async def test_a_node_without_a_leader_gets_the_whole_deadline(cluster):
    c = cluster
    await asyncio.to_thread(restore, c)
    survivor = (c.wait_leader() + 1) % c.n
    for i in range(c.n):
        if i != survivor:
            c.kill(i)
    async with Client(c.urls, transport="http", timeout=8.0) as client:     # connect_budget 3 s
        t0 = time.monotonic()
        with pytest.raises(Unavailable) as info:
            await client.enqueue("no-leader", "t", b"x")
        took = time.monotonic() - t0
    assert not isinstance(info.value, Unreachable), info.value
    # An election could still come: it kept trying to the deadline (it stops before a pause that
    # would cross it, so up to backoff_max = 1 s early), far past the 3 s connect budget.
    assert 6.5 <= took <= 9.0, took
    await asyncio.to_thread(restore, c)


async def test_without_a_budget_a_client_waits_for_a_cluster_that_starts(cluster):
    c = cluster
    await asyncio.to_thread(restore, c)
    await asyncio.to_thread(c.kill_all)
    async with Client(c.urls, transport="http", timeout=60, connect_budget=None) as client:
        call = asyncio.create_task(client.enqueue("late", "t", b"x"))
        await asyncio.sleep(0)
        await asyncio.to_thread(c.start_all)
        r = await asyncio.wait_for(call, 90)
        assert r.job_id
    await asyncio.to_thread(restore, c)


def test_sync_client_and_the_cli_message(cluster):
    c = cluster
    restore(c)
    c.kill_all()
    try:
        with SyncClient(c.urls, connect_budget=1.0) as sc:
            t0 = time.monotonic()
            with pytest.raises(ExportedUnreachable) as info:
                sc.enqueue("sync", "t", b"x")
            assert time.monotonic() - t0 < 3.0
        msg, code = explain(info.value, None)
        assert code == EXIT_UNREACHABLE == 2
        assert "\n" not in msg and "raftq up" in msg and "--urls" in msg
        assert all(u in msg for u in c.urls) and "connection refused for" in msg
    finally:
        restore(c)
