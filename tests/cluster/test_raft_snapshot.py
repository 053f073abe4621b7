"""Snapshots (node/raft/serializer.py, FORK.md "Snapshots"): a versioned document of builtins,
written by a pickler that refuses anything else and read by an unpickler that refuses every
global; snapshots of release 0.1.0 (pickled objects) still load, through stand-ins for exactly
the class paths it wrote."""
from __future__ import annotations

import base64
import gzip
import io
import json
import os
import pickle
import pickletools
import tarfile
import time
import zlib
from pathlib import Path

import pytest

from raftq.cluster.local import LocalCluster, http_json
from raftq.node.replication import replica
from raftq.node.core.limits import Limits
from raftq.node.raft import pickle as raft_pickle
from raftq.node.raft import serializer
from raftq.node.raft.serializer import SNAPSHOT_FORMAT, SNAPSHOT_VERSION, Serializer
from tests.conftest import Api, poll

FIXTURES = Path(__file__).parent.parent / "fixtures"
# Opcodes that name or call a global: a snapshot of builtins has none of them.
CODE_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD",
                "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"}
skip_cluster = pytest.mark.skipif(os.environ.get("RAFTQ_SKIP_CHAOS", "") not in ("", "0"),
                                  reason="RAFTQ_SKIP_CHAOS set")


def opcodes(data: bytes) -> set[str]:
    return {op.name for op, _, _ in pickletools.genops(data)}


def strings(data: bytes) -> list[str]:
    return [arg for op, arg, _ in pickletools.genops(data) if isinstance(arg, str)]


# ---------------------------------------------------------------------------- the loaders
def test_the_builtins_pickler_and_unpickler_refuse_everything_else():
    class Thing:
        pass

    doc = {"a": [1, 2.5, "x", b"y", None, True, (1, (2,)), {"k": {1, 2}}, frozenset([3]), bytearray(b"z")]}
    buf = io.BytesIO()
    raft_pickle.dumpBuiltins(doc, buf)
    assert raft_pickle.loadsBuiltins(buf.getvalue()) == doc
    assert not opcodes(buf.getvalue()) & CODE_OPCODES
    from collections import OrderedDict
    for bad in (Thing(), OrderedDict(), Limits.build(), complex(1, 2), print):
        with pytest.raises(pickle.PicklingError):
            raft_pickle.dumpBuiltins({"x": [bad]}, io.BytesIO())
    for bad in (Limits.build(), OrderedDict(a=1), print, complex(1, 2)):
        with pytest.raises(raft_pickle.GlobalRefused):
            raft_pickle.loadsBuiltins(pickle.dumps(bad, 5))
    evil = b"cos\nsystem\n(S'echo owned'\ntR."                      # protocol 0 GLOBAL + REDUCE
    with pytest.raises(raft_pickle.GlobalRefused):
        raft_pickle.loadsBuiltins(evil)


def snapshot_pickle(path: Path) -> bytes:
    """The pickled document inside a snapshot file (the checksummed format or a bare gzip)."""
    with open(path, "rb") as f, serializer.openDocument(f) as g:
        return g.read()


def _write_gz(path: Path, data: bytes):
    with gzip.open(path, "wb") as g:
        g.write(data)


def test_a_legacy_snapshot_may_name_only_the_known_classes(tmp_path):
    """The compat unpickler maps exactly the listed class paths to inert stand-ins and refuses
    every other global, os.system included."""
    upgraded = []
    s = Serializer(str(tmp_path / "raft.dump"), 1 << 20, False, legacyClasses=replica.LEGACY_SNAPSHOT_CLASSES,
                   upgradeLegacy=lambda old: upgraded.append(old) or {"format": SNAPSHOT_FORMAT,
                                                                       "version": SNAPSHOT_VERSION})
    _write_gz(tmp_path / "raft.dump", b"cos\nsystem\n(S'touch " + str(tmp_path / "owned").encode() + b"'\ntR.")
    with pytest.raises(pickle.UnpicklingError, match="os.system"):
        s.deserialize()
    assert not (tmp_path / "owned").exists() and upgraded == []
    _write_gz(tmp_path / "raft.dump", b"cnode.machine\nQueueMachine\n)\x81}b.")     # NEWOBJ + BUILD
    assert s.deserialize()["format"] == SNAPSHOT_FORMAT
    assert isinstance(upgraded[0], serializer.LegacyObject) and upgraded[0].state == {}
    _write_gz(tmp_path / "raft.dump", pickle.dumps({"format": "something else"}, 5))
    with pytest.raises(ValueError):
        s.deserialize()


def test_apply_batch_keeps_method_id_0_so_older_journals_replay():
    """pysyncobj numbers @replicated methods by their sorted names: a journal entry of release
    0.1.0 is (0, (now_ms, cmds)). QueueState must keep apply_batch as its only replicated method."""
    from raftq.cluster.local import free_ports
    from raftq.node.raft import SyncObj, SyncObjConf

    state = replica.QueueState(Limits.build())
    so = SyncObj(f"127.0.0.1:{free_ports(1)[0]}", [], conf=SyncObjConf(autoTick=False), consumers=[state])
    try:
        assert so._methodToID == {(id(state), "apply_batch_v0"): 0}
    finally:
        so.destroy()


# ---------------------------------------------------------------------------- a fresh snapshot
@skip_cluster
def test_a_fresh_snapshot_holds_builtins_only(tmp_path):
    """A raft.dump written by this code: no opcode that names or calls a global, no module path,
    and it loads with the unpickler that refuses every global into the versioned document."""
    c = LocalCluster(tmp_path / "c", storage={"dead_letter_retention_ms": 86_400_000},
                     queues=[{"name": "mail", "default_max_attempts": 2}],
                     tuning={"log_compaction_min_entries": 20, "log_compaction_min_time_s": 1}).launch()
    try:
        api = Api(c)
        for i in range(30):
            s, _ = api.enqueue("mail", data=os.urandom(64), idempotency_key=f"k{i}", priority=i % 10,
                               custom={"n": i, "tag": "x", "f": 1.5, "b": True}, headers={"Request-Id": f"r{i}"})
            assert s == 200
        s, got = api.reserve(("mail",), max_jobs=3)
        jobs = got["jobs"]
        assert api.post(f"/v1/jobs/{jobs[0]['id']}/nack", {"attempt": 1, "reason": "bad",
                                                            "retry": {"strategy": "dead_letter"}})[0] == 200
        assert api.post(f"/v1/jobs/{jobs[1]['id']}/ack", {"attempt": 1})[0] == 200
        assert api.enqueue("later", delay_ms=3_600_000)[0] == 200
        assert api.post("/v1/queues/later/pause", {})[0] == 200
        dump = c.data_dir(0) / "raft.dump"

        def fresh():
            """A snapshot taken after all of the above (snapshots are taken every 20 entries)."""
            for i in range(5):
                api.enqueue("filler")
            try:
                doc = raft_pickle.loadsBuiltins(snapshot_pickle(dump))
            except (OSError, EOFError):
                return False
            m = replica.machine_of(doc["consumers"][0])
            return len(m["jobs"]) >= 30 and m["dlq"] and any(q[0] == "later" for q in m["queues"])

        poll(fresh, timeout=60, interval=0.5, what="a snapshot of it all on node 1")
    finally:
        c.stop_all()
        c.close()
    assert serializer.verifyPath(str(dump)) is None
    raw = snapshot_pickle(dump)
    doc = raft_pickle.loadsBuiltins(raw)
    (consumer,) = doc["consumers"]
    # The machine's long lists are pickles of their own inside (node/replication/replica.py `pack_machine`): the
    # same holds for each.
    parts = [zlib.decompress(chunk) for chunks in consumer["packed"].values() for chunk in chunks]
    assert len(parts) >= 3
    for data in [raw] + parts:
        assert not opcodes(data) & CODE_OPCODES, opcodes(data) & CODE_OPCODES
        paths = [t for t in strings(data) if any(m in t for m in ("raftq.", "pysyncobj", "node.", "QueueMachine", "Limits", "TCPNode"))]
        assert paths == []
    assert (doc["format"], doc["version"]) == (SNAPSHOT_FORMAT, SNAPSHOT_VERSION)
    assert sorted(doc["raft"]["members"]) == sorted(f"127.0.0.1:{p}" for p in c.raft_ports)
    machine = replica.machine_of(consumer)
    assert len(machine["jobs"]) >= 30 and machine["dlq"] and machine["dedup"] and machine["rids"]


# ---------------------------------------------------------------------------- release 0.1.0's data
def _fixture_cluster(tmp_path):
    fx = json.loads((FIXTURES / "release-0.1.0.json").read_text())
    root = tmp_path / "c"
    with tarfile.open(FIXTURES / "release-0.1.0.tar.gz") as t:
        t.extractall(root)                       # data/n1, data/n2, data/n3
    # The cluster stopped at the fixture's last write; its leases (300 s), dedup window (1 h) and
    # schedules are relative to that time. The nodes' clock hook puts them a moment after it, so
    # the state they load is the state that was written, whenever the test runs.
    ends = [j["enqueued_at_ms"] for j in fx["jobs"].values()]
    ends += [j["lease_expires_at_ms"] - 300_000 for j in fx["jobs"].values() if j["state"] == "in_flight"]
    ends += [d["failed_at_ms"] for d in fx["dead_letters"]]
    offset = max(ends) + 2_000 - time.time_ns() // 1_000_000
    c = LocalCluster(root, limits=fx["limits"], storage=fx["storage"], queues=fx["queues_config"],
                     testing={"clock_offset_ms": offset})
    return fx, c


def _jobs(c: LocalCluster, leader: int, queues) -> dict:
    out = {}
    for q in queues:
        for state in ("ready", "scheduled", "in_flight"):
            cursor = None
            while True:
                path = f"/v1/queues/{q}/jobs?state={state}&limit=100" + (f"&cursor={cursor}" if cursor else "")
                s, page = http_json("GET", c.urls[leader] + path)
                assert s == 200, page
                out.update({j["id"]: j for j in page["jobs"]})
                cursor = page["next_cursor"]
                if not cursor:
                    break
    return out


@skip_cluster
def test_a_cluster_of_release_0_1_0_starts_from_its_data_dirs(tmp_path):
    """The data dirs of a three-node cluster written by release 0.1.0 (a snapshot of pickled
    objects on every node, journal entries after it, tests/fixtures/make_release_0_1_0.py) start
    a cluster of this code: every job in every state, the dead letter, the paused queue and the
    queue counts are there, an idempotency key recorded before the snapshot and one recorded
    after it (journal replay) still deduplicate, and new writes work."""
    fx, c = _fixture_cluster(tmp_path)
    c.write_configs()
    c.start_all()
    try:
        leader = c.wait_leader(30)
        c.wait_converged(30)
        url = c.urls[leader]
        s, queues = http_json("GET", url + "/v1/queues")
        # every field 0.1.0 showed is as it showed it (later releases add fields next to them)
        assert s == 200 and [{k: q[k] for k in f} for q, f in zip(queues["queues"], fx["queues"])] == fx["queues"]
        assert all(q["expired_total"] == 0 for q in queues["queues"])
        assert len(queues["queues"]) == len(fx["queues"]) == 4
        assert {q["name"] for q in queues["queues"] if q["paused"]} == {"later"}
        # every job as 0.1.0 showed it, each field it showed (later releases add timeout_ms, releases)
        jobs = _jobs(c, leader, [q["name"] for q in fx["queues"]])
        assert set(jobs) == set(fx["jobs"])
        assert {i: {k: jobs[i][k] for k in j} for i, j in fx["jobs"].items()} == fx["jobs"]
        assert all(j["timeout_ms"] is None and j["releases"] == 0 for j in jobs.values())
        s, dead = http_json("GET", url + "/v1/dead-letters?limit=100")
        assert s == 200 and dead["records"] == fx["dead_letters"]
        api = Api(c)
        # Payload "emails-0" is the first job of both keyed rounds: welcome-0 (before the
        # snapshot) and, later, after-snapshot-0 (in the journal after it).
        first = sorted((j["enqueued_at_ms"], j["id"]) for j in fx["jobs"].values()
                       if j["queue"] == "emails" and base64.b64decode(j["payload"]["data_b64"]) == b"emails-0")
        for key, job_id in (("welcome-0", first[0][1]), ("after-snapshot-0", first[-1][1])):
            s, r = api.enqueue("emails", data=b"again", idempotency_key=key)
            assert s == 200 and r["deduplicated"] is True and r["job_id"] == job_id, (key, r)
        s, r = api.enqueue("upgrade", data=b"new")
        assert s == 200 and not r["deduplicated"]
        s, got = api.reserve(("upgrade",))
        assert s == 200 and [j["id"] for j in got["jobs"]] == [r["job_id"]]
        assert api.post(f"/v1/jobs/{r['job_id']}/ack", {"attempt": 1})[0] == 200
        views = c.wait_converged(30)
        # The acked job is gone; the dead letter's job is held with its record.
        assert views[0]["state"]["jobs"] == len(fx["jobs"]) + len(fx["dead_letters"])
        assert views[0]["state"]["dead_letters"] == len(fx["dead_letters"])
        # The unchecksummed journals were rewritten in the checksummed format, found nothing
        # wrong, and every node's log is trusted (an upgrade is not damage).
        for i, v in enumerate(views):
            assert v["disk"]["findings"] == {} and v["disk"]["log_verified"], v["disk"]
            with open(c.data_dir(i) / "raft.journal", "rb") as f:
                assert int.from_bytes(f.read(36)[32:36], "little") == 2
    finally:
        c.stop_all()
        c.close()


def test_release_0_1_0_snapshots_upgrade_to_the_document(tmp_path):
    """Each node's raft.dump of the fixture, read by the fork's loader: the v1 envelope becomes
    the versioned document and the machine's builtins load through QueueMachine.from_builtins."""
    fx = json.loads((FIXTURES / "release-0.1.0.json").read_text())
    with tarfile.open(FIXTURES / "release-0.1.0.tar.gz") as t:
        t.extractall(tmp_path)
    limits = Limits.build(fx["limits"], fx["storage"], fx["queues_config"])
    for node in ("n1", "n2", "n3"):
        raw = gzip.decompress((tmp_path / "data" / node / "raft.dump").read_bytes())
        assert {"STACK_GLOBAL", "NEWOBJ", "BUILD"} <= opcodes(raw)        # the old format indeed
        from raftq.cluster.local import free_ports
        from raftq.node.raft import SyncObj, SyncObjConf

        state = replica.QueueState(limits)
        so = SyncObj(f"127.0.0.1:{free_ports(1)[0]}", [], consumers=[state],
                     conf=SyncObjConf(autoTick=False, fullDumpFile=str(tmp_path / "data" / node / "raft.dump")))
        try:
            so.doTick(0)                        # the first tick loads the dump
            assert so.raftLastApplied > 2
            m = state.machine
            assert m.counts()["jobs"] >= 50 and "later" in m.queues and m.queues["later"].paused
            assert len(m.dlq) == 1
        finally:
            so.destroy()


def test_a_forked_child_keeps_no_descriptor_of_its_node_and_dies_with_the_forking_thread():
    """serializer.detachForkedChild, which snapshot and digest children run first: they keep
    only stdio and what they were told to keep (not the node's listening sockets: a killed node
    could not be restarted on its ports while a child of it ran), and are killed when the thread
    that forked them (the node's tick thread) ends, instead of running on for tens of seconds."""
    import signal
    import socket
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    rfd, wfd = os.pipe()
    out: dict = {}

    def forker():                   # stands for the tick thread
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                serializer.detachForkedChild(parent, keepFds=(wfd,))
                os.write(wfd, " ".join(sorted(os.listdir("/proc/self/fd"), key=int)).encode() + b"\n")
                time.sleep(60)      # a long snapshot: it must not outlive the thread that forked it
            finally:
                os._exit(0)
        out["pid"] = pid
        out["fds"] = os.read(rfd, 4096).decode().split()     # the thread ends once the child is detached

    t = threading.Thread(target=forker)
    t.start()
    t.join(10)
    try:
        assert not t.is_alive()
        # stdio, the kept pipe end and the descriptor listdir itself opened; not the listener
        kept = set(map(int, out["fds"])) - {0, 1, 2, wfd}
        assert listener.fileno() not in kept and rfd not in kept and len(kept) <= 1, out["fds"]
        pid, status = os.waitpid(out["pid"], 0)     # killed, not after its 60 s
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    finally:
        listener.close()
        os.close(rfd)
        os.close(wfd)
