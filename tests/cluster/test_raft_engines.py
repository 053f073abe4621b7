"""Both Raft engines (docs/cluster.md "Raft engines"): `tuning.raft_engine = "loop"`, the pure
core on the node's event loop, serves across a leader kill and restarts from its journal; a
cluster moves between the engines on its data dirs, both ways, with the same state; the loop
engine changes membership, and a cluster keeps the membership across restarts and engines."""
import json

from raftq.cluster.local import http_json
from tests.conftest import Api, poll


def _digests(c, among=None):
    views = c.wait_converged(30, among=among)
    digests = {v["digest"] for v in views}
    assert len(digests) == 1, views
    return digests.pop(), views


def _restart_all_with(c, engine):
    for i in range(c.n):
        assert c.stop(i) == 0, f"node {i} did not stop cleanly"
    c.tuning["raft_engine"] = engine
    c.write_configs()
    c.start_all()
    c.wait_leader(30)


def test_the_loop_engine_serves_across_a_leader_kill_and_restarts_from_its_journal(make_cluster):
    # election timeouts of 4-8 s: the followers must elect a leader on the killed leader's closed
    # connections (core.peerLost), not on their timers, to lead within 3 s of the kill.
    # journal_memory_bytes 1: the cores hold only their newest command; every other one they need
    # (the restarted node's applies, the new leader's appends to it) is read back from the journal
    c = make_cluster(tuning={"raft_engine": "loop", "raft_min_timeout_s": 4.0, "raft_max_timeout_s": 8.0,
                             "journal_memory_bytes": 1})
    api = Api(c)
    leader = c.wait_leader()
    assert {c.cluster_view(i, digest=False)["raft_engine"] for i in range(3)} == {"loop"}
    acked = []
    for i in range(20):
        s, out = api.enqueue("q", idempotency_key=f"k{i}")
        assert s == 200, out
        acked.append(out["job_id"])
    s, got = api.reserve(["q"], lease_ms=60_000, max_jobs=5)
    assert s == 200 and len(got["jobs"]) == 5
    held = got["jobs"]
    _digests(c)

    term = c.cluster_view(leader, digest=False)["term"]
    c.kill(leader)
    survivors = [i for i in range(3) if i != leader]
    new = c.wait_leader(3, among=survivors)
    assert c.cluster_view(new, digest=False)["term"] > term
    # the leases, attempts and dedup index came through: ack on the new leader with the attempt
    for job in held:
        s, out = api.post(f"/v1/jobs/{job['id']}/ack", {"attempt": job["attempt"]}, node=new)
        assert s == 200, out
    s, dup = api.enqueue("q", idempotency_key="k3", node=new)
    assert s == 200 and dup == {"job_id": acked[3], "deduplicated": True}
    s, stats = api.get("/v1/queues/q", node=new)
    assert stats["ready"] == 15, stats

    c.start(leader)                 # replays its journal, then catches up with the new leader
    digest, views = _digests(c)
    assert len({v["last_applied"] for v in views}) == 1
    s, stats = api.get("/v1/queues/q", node=leader)
    assert s == 200 and stats["ready"] == 15, stats


def test_a_cluster_moves_between_the_engines_on_its_data_dirs_both_ways(make_cluster):
    c = make_cluster(tuning={"raft_engine": "thread"})     # (RAFTQ_RAFT_ENGINE may set another default)
    api = Api(c)
    assert {c.cluster_view(i, digest=False)["raft_engine"] for i in range(3)} == {"thread"}
    for i in range(10):
        assert api.enqueue("q", idempotency_key=f"t{i}")[0] == 200
    s, got = api.reserve(["q"], lease_ms=300_000, max_jobs=2)
    held = got["jobs"]
    before, _ = _digests(c)

    _restart_all_with(c, "loop")
    assert {c.cluster_view(i, digest=False)["raft_engine"] for i in range(3)} == {"loop"}
    assert _digests(c)[0] == before          # the thread engine's journal, read as it is
    s, out = api.post(f"/v1/jobs/{held[0]['id']}/ack", {"attempt": held[0]["attempt"]})
    assert s == 200, out
    for i in range(5):
        assert api.enqueue("q", idempotency_key=f"l{i}")[0] == 200
    s, dup = api.enqueue("q", idempotency_key="t1")
    assert s == 200 and dup["deduplicated"], dup
    after_loop, _ = _digests(c)

    _restart_all_with(c, "thread")
    assert _digests(c)[0] == after_loop      # and the loop engine's, by the thread engine
    s, out = api.post(f"/v1/jobs/{held[1]['id']}/ack", {"attempt": held[1]["attempt"]})
    assert s == 200, out
    s, stats = api.get("/v1/queues/q")
    assert stats["ready"] == 13 and stats["in_flight"] == 0, stats


def _members_of(c, i):
    view = c.cluster_view(i, digest=False)
    return view and sorted(m["id"] for m in view["members"])


def test_the_loop_engine_changes_membership_and_keeps_it_across_restarts_and_engines(make_cluster):
    # small compaction thresholds: snapshots taken after the changes carry the membership too
    c = make_cluster(tuning={"raft_engine": "loop", "log_compaction_min_entries": 40, "log_compaction_min_time_s": 2})
    api = Api(c)
    for i in range(10):
        assert api.enqueue("q", idempotency_key=f"a{i}")[0] == 200
    first = c.wait_leader()
    # the leader dropped its log before a snapshot: the new node catches up from the snapshot
    poll(lambda: (c.data_dir(first) / "raft.dump").exists(), 20, what="the leader's snapshot")
    new = c.add_node()          # a config naming n1..n3 and itself
    c.start(new)
    s, out = api.post("/v1/cluster/members", c.member(new), timeout=60)
    assert s == 200 and out["changed"] and [m["id"] for m in out["members"]] == ["n1", "n2", "n3", "n4"], out
    c.members_count = 4
    poll(lambda: all(_members_of(c, i) == ["n1", "n2", "n3", "n4"] for i in range(4)), 20, what="four members")
    leader = c.wait_leader()
    follower = next(i for i in range(3) if i != leader)
    s, out = api.call("DELETE", f"/v1/cluster/members/{c.ids[follower]}", timeout=60)
    assert s == 200 and c.ids[follower] not in [m["id"] for m in out["members"]], out
    c.members_count = 3
    s, out = api.call("DELETE", f"/v1/cluster/members/{c.ids[leader]}", timeout=60)    # handed over, then removed
    assert s == 200 and c.ids[leader] not in [m["id"] for m in out["members"]], out
    c.members_count = 2
    live = [i for i in range(4) if i not in (leader, follower)]
    want = sorted(c.ids[i] for i in live)
    poll(lambda: all(_members_of(c, i) == want for i in live), 20, what="the two members left")
    for gone in (leader, follower):
        poll(lambda: (c.cluster_view(gone, digest=False) or {}).get("removed"), 20, what="the removed node stopped")
        assert http_json("GET", c.urls[gone] + "/v1/queues")[0] == 503
    for i in range(60):             # writes go on, on the two members left
        assert api.enqueue("q", idempotency_key=f"b{i}")[0] == 200
    poll(lambda: all((c.data_dir(i) / "raft.dump").exists() for i in live), 20, what="snapshots on the members")
    digest = _digests(c, live)[0]

    def same_after_restart(engine):
        assert {c.cluster_view(i, digest=False)["raft_engine"] for i in live} == {engine}
        poll(lambda: all(_members_of(c, i) == want for i in live), 20, what=f"the members under {engine}")
        assert all((c.cluster_view(gone, digest=False) or {}).get("removed") for gone in (leader, follower))
        assert _digests(c, live)[0] == digest

    _restart_all_with(c, "loop")            # the membership from members.json; the TOMLs say n1..n3
    assert "n4" not in c.config_path(live[0]).read_text()
    same_after_restart("loop")
    for engine in ("thread", "loop"):
        for i in live:              # rebuilt from the other engine's journal and snapshot alone
            (c.data_dir(i) / "members.json").unlink()
        _restart_all_with(c, engine)
        same_after_restart(engine)
    for i in live:
        stored = json.loads((c.data_dir(i) / "members.json").read_text())
        assert sorted(m["id"] for m in stored["members"]) == want and not stored["removed"]
    s, out = api.enqueue("q", idempotency_key="a1")
    assert s == 200 and out["deduplicated"], out
    assert api.enqueue("q", idempotency_key="c0")[0] == 200


def test_the_loop_engine_compacts_its_log_and_sends_the_snapshot_to_a_follower_behind(make_cluster):
    c = make_cluster(tuning={"raft_engine": "loop", "log_compaction_min_entries": 40,
                             "log_compaction_min_time_s": 1})
    api = Api(c)
    leader = c.wait_leader()
    behind = next(i for i in range(3) if i != leader)
    assert c.stop(behind) == 0
    for i in range(150):
        assert api.enqueue("q", idempotency_key=f"s{i}")[0] == 200
    # every running node writes a snapshot and drops the log before it
    for i in range(3):
        if i != behind:
            poll(lambda i=i: (c.data_dir(i) / "raft.dump").exists(), 20, what=f"node {i}'s snapshot")
    poll(lambda: c.cluster_view(leader, digest=False)["commit_index"] > 150, 10)
    c.wipe(behind)                  # it needs everything: the leader has only its snapshot and what followed
    c.start(behind)
    digest, _ = _digests(c)
    assert (c.data_dir(behind) / "raft.dump").exists()      # installed from the leader's
    # every node restarts from its snapshot and the journal after it
    for i in range(3):
        assert c.stop(i) == 0
    c.start_all()
    c.wait_leader(30)
    assert _digests(c)[0] == digest
    s, stats = api.get("/v1/queues/q")
    assert stats["ready"] == 150, stats
