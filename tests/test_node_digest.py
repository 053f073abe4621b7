"""The state digest of GET /v1/cluster off the event loop: a large state is hashed in a child
forked between two Raft ticks, that digest is the one hashing inline gives, and a poller is
answered with the newest one there is (and the index it belongs to) instead of waiting."""
from __future__ import annotations

import threading

from raftq.cluster.client import SyncClient, job_request
from raftq.cluster.local import LocalCluster, digest_at, http_json


def test_forked_digest_equals_the_inline_one_and_belongs_to_its_index(tmp_path):
    # No timer-driven sweep (it would change the state between two reads at rest).
    c = LocalCluster(tmp_path / "c", storage={"sweep_interval_ms": 3_600_000})
    try:
        c.write_configs()
        # Node 1 hashes every state in a child, nodes 2 and 3 inline (the state stays under
        # their 5,000 entries): converging means the two ways agree at every index.
        with open(c.config_path(0), "a") as f:
            f.write("\n[tuning]\ndigest_inline_max_entries = 0\n")
        c.start_all()
        c.wait_leader()
        with SyncClient(c.urls, transport="http", timeout=20) as cl:
            for _ in range(8):
                cl.enqueue_batch([job_request("q", "t", b"p" * 32) for _ in range(256)])
            views = c.wait_converged()
            assert len({v["digest"] for v in views}) == 1
            first = views[0]["digest"]

            # Under writes, node 1's answer pairs the digest with the index it was taken at
            # (`digest_index`, at most `last_applied`: a poller is answered with the newest
            # digest there is while the next one is hashed): every pair it gives is one an
            # inline node gives for that index.
            seen: dict[int, set] = {}
            stop = threading.Event()

            def poll(i):
                while not stop.is_set():
                    v = c.cluster_view(i, timeout=5)
                    if v:
                        index, digest = digest_at(v)
                        assert index <= v["last_applied"]
                        seen.setdefault(index, set()).add(digest)
            pollers = [threading.Thread(target=poll, args=(i,), daemon=True) for i in range(3)]
            for t in pollers:
                t.start()
            for _ in range(20):
                cl.enqueue("q", "t", b"x")
            stop.set()
            for t in pollers:
                t.join(10)
            assert all(len(d) == 1 for d in seen.values()), seen      # one digest per index
            views = c.wait_converged()
            assert views[0]["digest"] != first

        # At rest, the forked answer is the converged one.
        status, body = http_json("GET", c.urls[0] + "/v1/cluster")
        assert status == 200 and digest_at(body) == (views[0]["last_applied"], views[0]["digest"])
        assert body["digest_index"] == body["last_applied"]
        # An inline node's digest always belongs to its last_applied.
        status, body = http_json("GET", c.urls[1] + "/v1/cluster")
        assert status == 200 and body["digest_index"] == body["last_applied"]
        status, body = http_json("GET", c.urls[1] + "/v1/cluster?digest=false")
        assert status == 200 and body["digest"] is None and body["digest_index"] is None
    finally:
        c.close()


def test_status_shows_an_older_digest_with_its_index():
    from raftq.cluster.local import digest_cell
    current = {"last_applied": 40, "digest_index": 40, "digest": "0123456789abcdef"}
    assert digest_at(current) == (40, "0123456789abcdef") and digest_cell(current) == "0123456789ab"
    older = dict(current, digest_index=31)
    assert digest_at(older) == (31, "0123456789abcdef") and digest_cell(older) == "0123456789ab@31"
    assert digest_cell({"last_applied": 40, "digest_index": None, "digest": None}) is None
    # A node from before digest_index paired its digest with last_applied.
    assert digest_at({"last_applied": 7, "digest": "ff"}) == (7, "ff")
