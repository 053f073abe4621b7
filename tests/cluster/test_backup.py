"""`raftq backup` / `raftq restore` on real clusters: a backup taken from a follower while
producers and workers run, restored into every node of a fresh cluster, which then holds the
backup's digest; the file refuses to restore when damaged, cut short or aimed at a node's data."""
from __future__ import annotations

import os
import socket
import struct
import threading
from pathlib import Path

import pytest

from raftq.cluster.client import SyncClient
from raftq.cluster.local import LocalCluster, http_json
from raftq.node.replication import backup as fmt
from tests.attacks import hits
from tests.conftest import poll
from tests.cluster.test_up import raftq

# No sweep falls due during the test (leases of 30 s, request ids kept 60 s, no timer-driven
# sweep for an hour), so a restored cluster's state stays the backup's until a client acts.
STORAGE = {"sweep_interval_ms": 3_600_000, "dead_letter_retention_ms": 86_400_000}


def load(urls, stop: threading.Event, counts: dict):
    """A producer and a worker in one loop: enqueue two, reserve one, ack it."""
    with SyncClient(urls, transport="http", timeout=20) as c:
        while not stop.is_set():
            c.enqueue("q", "t", b"x" * 64)
            c.enqueue("q", "t", b"y" * 64)
            counts["enqueued"] += 2
            for job in c.reserve(["q"], 30_000, max_jobs=1):
                c.ack(job)
                counts["acked"] += 1


@pytest.fixture
def source(tmp_path):
    with LocalCluster(tmp_path / "src", storage=STORAGE) as c:
        c.launch()
        yield c


def test_backup_under_load_restores_into_a_fresh_cluster_with_the_same_digest(source, tmp_path):
    stop, counts = threading.Event(), {"enqueued": 0, "acked": 0}
    t = threading.Thread(target=load, args=(source.urls, stop, counts), daemon=True)
    t.start()
    try:
        while counts["acked"] < 200:           # the load is running
            t.join(0.05)
            assert t.is_alive()
        out = tmp_path / "b.backup"
        code, text, err = raftq("backup", "--out", str(out), "--urls", ",".join(source.urls))
        assert code == 0, err
        during = counts["acked"]
        while counts["acked"] < during + 100:  # and went on while the backup was taken
            t.join(0.05)
            assert t.is_alive()
    finally:
        stop.set()
        t.join(30)
    header = fmt.verify(out)
    assert f"at index {header['index']}" in text and header["digest"] in text
    leader = source.leader()
    assert header["node"] != source.ids[leader]           # from a follower: the leader serves
    assert header["index"] > 0 and header["term"] >= 1 and os.path.getsize(out) > 200 * 64

    dest = LocalCluster(tmp_path / "dst", storage=STORAGE)
    try:
        for i in range(dest.n):
            code, text, err = raftq("restore", str(out), "--data-dir", str(dest.data_dir(i)))
            assert code == 0, err
            assert f"restored index {header['index']}" in text
        dest.launch()
        views = dest.wait_converged()
        assert {v["digest"] for v in views} == {header["digest"]}
        assert all(v["last_applied"] >= header["index"] for v in views)
        # And it serves: the backup's ready jobs are there to reserve and ack.
        with SyncClient(dest.urls, transport="http", timeout=20) as c:
            jobs = c.reserve(["q"], 30_000, max_jobs=5)
            assert len(jobs) == 5
            for j in jobs:
                c.ack(j)
    finally:
        dest.close()


def test_a_damaged_or_short_backup_is_refused_and_a_node_data_dir_is_not_overwritten(source, tmp_path):
    with SyncClient(source.urls, transport="http", timeout=20) as c:
        for _ in range(20):
            c.enqueue("q", "t", b"payload")
    out = tmp_path / "b.backup"
    code, text, err = raftq("backup", "--out", str(out), "--urls", ",".join(source.urls))
    assert code == 0, err
    code, text, err = raftq("backup", "--out", str(out), "--urls", ",".join(source.urls))
    assert code == 1 and "exists" in err and "--force" in err

    code, text, err = raftq("restore", str(out), "--check")
    assert code == 0 and "a good backup" in text

    raw = out.read_bytes()
    flipped = tmp_path / "flipped.backup"
    mid = len(raw) // 2                       # inside the body
    flipped.write_bytes(raw[:mid] + bytes([raw[mid] ^ 0x10]) + raw[mid + 1:])
    code, text, err = raftq("restore", str(flipped), "--data-dir", str(tmp_path / "d1"))
    assert code == 1 and "checksum" in err and not (tmp_path / "d1").exists()

    short = tmp_path / "short.backup"
    short.write_bytes(raw[: len(raw) // 2])
    code, text, err = raftq("restore", str(short), "--data-dir", str(tmp_path / "d2"))
    assert code == 1 and "cut short" in err

    code, text, err = raftq("restore", str(tmp_path / "nothing"), "--data-dir", str(tmp_path / "d3"))
    assert code == 2 and "no such file" in err

    # A data dir that holds a node's Raft files is not replaced without --force.
    node_dir = source.data_dir(0)
    before = sorted(p.name for p in node_dir.iterdir())
    code, text, err = raftq("restore", str(out), "--data-dir", str(node_dir))
    assert code == 1 and "--force" in err
    assert sorted(p.name for p in node_dir.iterdir()) == before


def test_backup_wait_must_be_seconds():
    code, _, stderr = raftq("backup", "--out", "/tmp/never.backup", "--wait", "-1", "--urls", "http://127.0.0.1:9")
    assert code == 2 and "--wait must be a number of seconds, 0 or more" in stderr


def test_backup_needs_an_admin_key(tmp_path):
    keys = [{"name": "ops", "key": "k-admin-0123456789abcdef", "role": "admin"},
            {"name": "w", "key": "k-worker-0123456789abcdef", "role": "worker"}]
    with LocalCluster(tmp_path / "auth", api_keys=keys) as c:
        c.launch()
        status, body = http_json("GET", c.urls[0] + "/v1/backup",
                                 headers={"Authorization": "Bearer k-worker-0123456789abcdef"})
        assert status == 403, body
        out = tmp_path / "a.backup"
        code, text, err = raftq("backup", "--out", str(out), "--urls", ",".join(c.urls),
                                "--api-key", "k-admin-0123456789abcdef")
        assert code == 0, err
        assert fmt.verify(out)["index"] > 0


def test_a_client_that_leaves_mid_backup_is_no_error_and_the_next_backup_is_served(source, tmp_path):
    """Hang up after the request, after the headers, after part of the body: the node logs the
    cut stream as a warning (never a traceback or a 500) and serves the next backup whole."""
    with SyncClient(source.urls, transport="http", timeout=20) as c:
        for _ in range(200):
            c.enqueue("q", "t", os.urandom(4096))  # incompressible
    port = source.http_ports[0]
    request = (f"GET /v1/backup HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").encode()
    for keep in (0, 1, 200, 4096, 65536) * 4:       # bytes read before hanging up
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            s.sendall(request)
            got = b""
            while len(got) < keep:
                chunk = s.recv(keep - len(got))
                if not chunk:
                    break
                got += chunk
    out = tmp_path / "after.backup"
    code, text, err = poll(lambda: (lambda r: r if r[0] == 0 else None)(
        raftq("backup", "--out", str(out), "--force", "--urls", source.urls[0])), timeout=30, what="a whole backup")
    assert fmt.verify(out)["index"] > 0
    # Every abandoned child was killed and reaped: the node has no child left, running or not.
    node_pid = source.procs[0].pid
    poll(lambda: not children(node_pid), timeout=10, what=f"no children of the node (left: {children(node_pid)})")
    log_text = source.log_path(0).read_text(errors="replace")
    assert "Traceback" not in log_text and "unhandled error" not in log_text, log_text[-3000:]


def children(pid: int) -> list[str]:
    """The pids (with their state letter) of `pid`'s children, from /proc."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            stat = Path(f"/proc/{child}/stat")
            found.append(f"{child}:{stat.read_text().rsplit(')', 1)[1].split()[0]}" if stat.exists() else child)
    return found


def test_a_backup_its_client_does_not_read_is_cut_and_frees_the_slot(tmp_path):
    """A client that asks for a backup and reads nothing held the node's one backup slot (429
    for every other backup) and a child with a copy-on-write image of the state for as long
    as it kept the connection: after tuning.http_write_stall_timeout_s the stream is cut."""
    with LocalCluster(tmp_path / "c", storage=STORAGE, tuning={"http_write_stall_timeout_s": 2.0}) as c:
        c.launch()
        with SyncClient(c.urls, transport="http", timeout=20) as cl:
            for _ in range(60):                 # 12 MB of incompressible state: more than the socket buffers
                cl.enqueue("q", "t", os.urandom(200_000))
        port = c.http_ports[0]
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        try:
            stalled.sendall(f"GET /v1/backup HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            status, body = poll(lambda: (lambda r: r if r[0] == 429 else None)(
                http_json("GET", c.urls[0] + "/v1/backup", timeout=5)), what="the stalled backup holding the slot")
            assert body["error"]["code"] == "overloaded"
            # `raftq backup` asks the busy node again after its Retry-After (--wait, 60 s): one
            # call gets the whole backup once the stalled one was cut.
            out = tmp_path / "b.backup"
            code, stdout, stderr = raftq("backup", "--out", str(out), "--urls", c.urls[0])
            assert code == 0, stderr
            assert ("busy (HTTP 429: a backup is already being taken on this node; retry when it is done); "
                    "asking again every 1s for up to 60s (--wait)") in stderr
            assert fmt.verify(out)["index"] > 0 and not out.with_name("b.backup.part").exists()
            assert hits(c, 0, "http_write_stall_timeout_s") >= 1
            assert "it read nothing of its answer for 2.0 s" in c.log_path(0).read_text(errors="replace")
            poll(lambda: not children(c.procs[0].pid), timeout=10, what="the cut backup's child reaped")
        finally:
            stalled.close()
