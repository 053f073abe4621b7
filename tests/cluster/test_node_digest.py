"""The state digest of GET /v1/cluster off the event loop: a large state is hashed in a child
forked between two Raft ticks, that digest is the one hashing inline gives, and a poller is
answered with the newest one there is (and the index it belongs to) instead of waiting."""
from __future__ import annotations

import os
import signal
import threading
import time

from raftq.cluster.client import SyncClient, job_request
from raftq.cluster.local import LocalCluster, digest_at, http_json
from tests.conftest import poll


def cluster_hashing_node_1_in_a_child(tmp_path) -> LocalCluster:
    """A running cluster whose node 1 hashes every state in a forked child, nodes 2 and 3 inline
    (under their 5,000 entries); no timer-driven sweep (it would change the state between two
    reads at rest)."""
    c = LocalCluster(tmp_path / "c", storage={"sweep_interval_ms": 3_600_000})
    try:
        c.write_configs()
        path = c.config_path(0)
        text = path.read_text()     # (a [tuning] table is there when RAFTQ_RAFT_ENGINE chose an engine)
        key = "\n[tuning]\ndigest_inline_max_entries = 0\n"
        path.write_text(text.replace("\n[tuning]\n", key, 1) if "\n[tuning]\n" in text else text + key)
        c.start_all()
        c.wait_leader()
    except BaseException:
        c.close()
        raise
    return c


def test_forked_digest_equals_the_inline_one_and_belongs_to_its_index(tmp_path):
    # Converging means the forked and the inline digests agree at every index.
    c = cluster_hashing_node_1_in_a_child(tmp_path)
    try:
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


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:      # the field after the state: ppid
                out.append(int(entry))
    return out


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"     # a zombie nobody reaped yet
    except OSError:
        return True


def _fd_links(pid: int) -> list[str]:
    """What the process's descriptors point at ([] once it is gone)."""
    links = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return links
    for fd in fds:
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return links


def _sockets(pid: int) -> list[str]:
    return [link for link in _fd_links(pid) if link.startswith("socket:")]


def test_a_digest_child_holds_no_socket_of_its_node_and_dies_with_it(tmp_path):
    """A node killed while a child of it hashes (or snapshots) a large state restarts
    on its ports at once; the child neither holds them nor outlives the node."""
    c = cluster_hashing_node_1_in_a_child(tmp_path)
    try:
        with SyncClient(c.urls, transport="http", timeout=20) as cl:
            for _ in range(120):            # 30,000 jobs: a digest long enough to catch its child
                cl.enqueue_batch([job_request("q", "t", b"p" * 64) for _ in range(256)])
            node = c.procs[0].pid
            child = None
            for _ in range(50):
                cl.enqueue("q", "t", b"x")                      # a new index: a new digest child
                asker = threading.Thread(target=c.cluster_view, args=(0,), kwargs={"timeout": 30}, daemon=True)
                asker.start()
                deadline = time.monotonic() + 5
                while child is None and time.monotonic() < deadline and (asker.is_alive() or _children(node)):
                    kids = [k for k in _children(node) if not _gone(k)]
                    if kids:
                        # Stopped once it has closed what it inherited (its first act after the
                        # fork; a child caught before that showed the node's sockets), or after
                        # a second with them still open (the failure this test is for).
                        seen, held = time.monotonic(), _sockets(kids[0])
                        while held and time.monotonic() < seen + 1:
                            now_held = _sockets(kids[0])
                            if not now_held and _gone(kids[0]):
                                break
                            held = now_held
                        assert not held or not _gone(kids[0]), f"a digest child kept its node's sockets until it exited: {held}"
                        try:
                            os.kill(kids[0], signal.SIGSTOP)    # it cannot finish (and exit) now
                        except ProcessLookupError:
                            continue
                        if not _gone(kids[0]):
                            child = kids[0]
                if child is not None:
                    break                   # (the asker waits on the stopped child: left behind)
                asker.join(30)
            assert child is not None, "no digest child was seen"
            links = _fd_links(child)
            assert not _sockets(child), links
            assert not [link for link in links if "raft.journal" in link], links
            c.kill(0)                                           # SIGKILL the node, its child stopped
            poll(lambda: _gone(child), timeout=10, what="the stopped child to die with its node")
        c.start(0)                                              # its ports are free at once
        poll(lambda: c.cluster_view(0, timeout=2) is not None, timeout=60, what="the node to serve again")
    finally:
        c.close()
