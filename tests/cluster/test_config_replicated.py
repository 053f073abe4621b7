"""The configuration in force is replicated state (docs/semantics.md "Configuration is
replicated state"), operator moves and the audit trail, keys, request ids scoped to the caller: on real
node processes. (The pure rules are in test_core_configuration.py and the model test.)"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from raftq.cluster.local import LocalCluster, http_json
from raftq.node.replication.fault_hooks import RELEASE_SEED

from conftest import Api, poll

FIXTURES = Path(__file__).parent.parent / "fixtures"


def views(c, digest=True):
    return [c.cluster_view(i, digest=digest) for i in range(c.n)]


def rewrite_toml(c, i, limits=None, storage=None):
    """Node i's TOML with other [limits] / [storage] (the LocalCluster writes them)."""
    if limits is not None:
        c.limits = limits
    if storage is not None:
        c.storage = storage
    c.write_config(i)


# ---------------------------------------------------------------------------- the data-loss repro
def test_a_restart_with_smaller_limits_in_the_toml_loses_nothing(make_cluster):
    """deploy/README.md used to say: edit all three files, then restart all three at once. A
    journal replayed under the new numbers dropped accepted jobs (depth check again), shortened
    dedup records and dropped dead letters. Now the TOML only seeded version 1: every job, dedup
    record and dead letter is still there, at the same index with the same digest."""
    storage = {"dead_letter_retention_ms": 7 * 86_400_000, "dedup_window_ms": 3_600_000,
               "sweep_interval_ms": 3_600_000}      # no sweep during the test: the index stays put
    c = make_cluster(storage=storage)
    api = Api(c)
    ids = []
    for i in range(5):
        status, out = api.enqueue("emails", idempotency_key=f"k{i}")
        assert status == 200, out
        ids.append(out["job_id"])
    # A dead letter (retention on): reserve one and nack it to the dead letters.
    status, got = api.reserve(["emails"])
    dead = got["jobs"][0]["id"]
    assert api.post(f"/v1/jobs/{dead}/nack", {"attempt": 1, "retry": {"strategy": "dead_letter"}})[0] == 200
    before = c.wait_converged()
    index, digest = before[0]["last_applied"], before[0]["digest"]
    queue_before = api.get("/v1/queues/emails")[1]
    assert queue_before["ready"] == 4 and queue_before["dead_lettered"] == 1

    c.stop_all()
    for i in range(c.n):
        rewrite_toml(c, i, limits={"max_queue_depth": 2},
                     storage={**storage, "dedup_window_ms": 1, "dead_letter_retention_ms": 0})
    # One node alone replays its journal up to the commit index it stored: the same state (the
    # same digest) under the TOML's new numbers. At the same index, or one more when n1 led:
    # a leader that stops hands leadership over, and the new leader's first entry (Raft's
    # no-op, nothing the state machine applies) reaches it before it exits.
    c.start(0)
    alone = poll(lambda: (v := c.cluster_view(0)) and v["last_applied"] >= index
                 and v["digest_index"] == v["last_applied"] and v, 30, what="n1's replay")
    assert alone["last_applied"] in (index, index + 1) and alone["digest"] == digest, (alone, index)
    assert alone["toml_differs"] and alone["config_version"] == 1
    c.start(1)
    c.start(2)
    c.wait_leader(30)
    after = c.wait_converged(30)
    # (A new leader's first entry of its term is Raft's, not a command: the digest, which hashes
    # the count of applied commands, is the same.)
    assert {v["digest"] for v in after} == {digest}
    assert all(v["toml_differs"] and v["config_version"] == 1 for v in after)
    assert api.get("/v1/queues/emails")[1] == queue_before
    records = api.get("/v1/dead-letters")[1]["records"]
    assert [r["job"]["id"] for r in records] == [dead]
    for i, jid in enumerate(ids):              # every dedup record still has its hour
        assert api.enqueue("emails", idempotency_key=f"k{i}")[1] == {"job_id": jid, "deduplicated": True}
    # The configuration in force is the log's, not the TOML's: a sixth job fits.
    assert api.enqueue("emails")[0] == 200
    assert api.get("/v1/server-info")[1]["dead_letter_retention_enabled"] is True


# ---------------------------------------------------------------------------- online changes
ADMIN, VIEWER, WORKER = "admin-" + uuid.uuid4().hex, "viewer-" + uuid.uuid4().hex, "worker-" + uuid.uuid4().hex
KEYS = [{"name": "root", "key": ADMIN, "role": "admin"}, {"name": "ro", "key": VIEWER, "role": "viewer"},
        {"name": "w", "key": WORKER, "role": "worker"}]


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keyed(make_cluster):
    return make_cluster(api_keys=KEYS, storage={"dead_letter_retention_ms": 600_000})


def test_config_changes_are_checked_and_versioned(keyed):
    c = keyed
    api = Api(c)
    status, cfg = api.get("/v1/config", headers=bearer(VIEWER))
    assert status == 200 and cfg["version"] == 1
    assert cfg["config"]["storage"]["dead_letter_retention_ms"] == 600_000
    assert cfg["config"]["limits"]["max_queue_depth"] is None and cfg["config"]["queues"] == []
    wanted = {"limits": {"max_queue_depth": 3}, "storage": {"dead_letter_retention_ms": 600_000},
              "queues": [{"name": "emails", "default_max_attempts": 5}]}
    # Viewer and worker keys cannot change it; a follower refuses before redirecting.
    for key in (VIEWER, WORKER):
        status, out = api.call("PUT", "/v1/config", {"config": wanted, "expect_version": 1}, headers=bearer(key))
        assert status == 403 and out["error"]["required_role"] == "admin"
    # Invalid: refused with the key named, exactly as the TOML would be; nothing changes.
    bad = {**wanted, "limits": {"default_max_attempts": 200}}
    status, out = api.call("PUT", "/v1/config", {"config": bad, "expect_version": 1}, headers=bearer(ADMIN))
    assert status == 400 and out["error"]["message"] == \
        "limits.default_max_attempts: 200 is above max_attempts_ceiling (100)", out
    status, out = api.call("PUT", "/v1/config", {"config": {**wanted, "storage": {"sweep_limt": 1}},
                                                 "expect_version": 1}, headers=bearer(ADMIN))
    assert status == 400 and "storage.sweep_limt: unknown key" in out["error"]["message"]
    assert api.get("/v1/config", headers=bearer(VIEWER))[1] == cfg
    # A good one: version 2 on every node at the same index.
    status, out = api.call("PUT", "/v1/config", {"config": wanted, "expect_version": 1}, headers=bearer(ADMIN))
    assert (status, out) == (200, {"version": 2, "warnings": []})
    # Stale: refused, nothing changes.
    status, out = api.call("PUT", "/v1/config", {"config": {}, "expect_version": 1}, headers=bearer(ADMIN))
    assert status == 409 and out["error"]["code"] == "failed_precondition" and out["error"]["version"] == 2
    converged = c.wait_converged()
    assert {v["config_version"] for v in converged} == {2}
    for url in c.urls:          # every node serves it (server-info, queue views) without a restart
        assert http_json("GET", url + "/v1/server-info", headers=bearer(VIEWER))[1]["strict_queues"] is False
    assert api.get("/v1/queues/emails", headers=bearer(VIEWER))[1]["limits"]["default_max_attempts"] == 5
    for _ in range(3):
        assert api.enqueue("emails", headers=bearer(WORKER))[0] == 200
    status, out = api.enqueue("emails", headers=bearer(WORKER))
    assert status == 422 and out["error"]["rejection"] == {"reason": "queue_full", "queue": "emails", "limit": 3}
    # A depth below the current depth is accepted, says so, and refuses new enqueues only.
    lower = {**wanted, "limits": {"max_queue_depth": 1}}
    status, out = api.call("PUT", "/v1/config", {"config": lower, "expect_version": 2}, headers=bearer(ADMIN))
    assert status == 200 and out["version"] == 3
    assert out["warnings"] == [{"code": "depth_above_limit", "field": "max_queue_depth", "queue": "emails",
                                "depth": 3, "limit": 1}]
    assert api.get("/v1/queues/emails", headers=bearer(VIEWER))[1]["ready"] == 3


def test_keys_added_and_removed_take_effect_on_every_node(keyed):
    c = keyed
    api = Api(c)
    key = "rq_" + uuid.uuid4().hex
    digest = hashlib.sha256(key.encode()).hexdigest()
    status, out = api.post("/v1/keys", {"name": "ops", "role": "operator", "key_sha256": digest}, headers=bearer(WORKER))
    assert status == 403
    status, out = api.post("/v1/keys", {"name": "ops", "role": "operator", "key_sha256": digest}, headers=bearer(ADMIN))
    assert status == 200 and out == {"name": "ops", "role": "operator", "version": 2}
    listed = api.get("/v1/keys", headers=bearer(ADMIN))[1]["keys"]
    ops = next(k for k in listed if k["name"] == "ops")
    assert ops["added_by"] == "root" and ops["role"] == "operator" and ops["key_sha256_prefix"] == digest[:12]
    assert "key_sha256" not in ops and all(k["added_by"] is None for k in listed if k["name"] != "ops")
    index = api.get("/v1/cluster", headers=bearer(VIEWER))[1]["last_applied"]

    def everywhere(path, key, want):
        def check():
            out = []
            for u in c.urls:
                v = http_json("GET", u + "/v1/cluster?digest=false", headers=bearer(ADMIN))[1]
                if v["last_applied"] < index:
                    return None
                out.append(http_json("GET", u + path, headers=bearer(key))[0])
            return out == [want] * 3
        poll(check, 10, what=f"{path} answering {want} on every node")
    everywhere("/v1/cluster", key, 200)
    assert api.post("/v1/queues/emails/pause", {"create": True}, headers=bearer(key))[0] == 200
    # The node never had the key: only its digest is in the state.
    assert key not in json.dumps(api.get("/v1/config", headers=bearer(ADMIN))[1])
    # Duplicates and the first-admin rule.
    assert api.post("/v1/keys", {"name": "ops", "role": "viewer", "key_sha256": "0" * 64},
                    headers=bearer(ADMIN))[0] == 409
    assert api.post("/v1/keys", {"name": "twin", "role": "viewer", "key_sha256": digest},
                    headers=bearer(ADMIN))[1]["error"]["reason"] == "digest_in_use"
    # Remove it: 401 on every node from that entry on.
    status, out = api.call("DELETE", "/v1/keys/ops", headers=bearer(ADMIN))
    assert status == 200 and out["version"] == 3
    index = api.get("/v1/cluster", headers=bearer(VIEWER))[1]["last_applied"]
    everywhere("/v1/cluster", key, 401)
    assert api.post("/v1/queues/emails/resume", {}, headers=bearer(key))[0] == 401
    # The last admin key cannot go.
    status, out = api.call("DELETE", "/v1/keys/root", headers=bearer(ADMIN))
    assert status == 409 and out["error"]["reason"] == "last_admin"
    assert api.call("DELETE", "/v1/keys/nobody", headers=bearer(ADMIN))[0] == 404


def test_a_removed_key_is_refused_on_an_open_session(keyed):
    """A session checks each frame against the key set in force, not the one of its upgrade."""
    from raftq.cluster.client import Client, Unauthenticated
    c = keyed
    api = Api(c)
    key = "rq_" + uuid.uuid4().hex
    api.post("/v1/keys", {"name": "tmp", "role": "worker", "key_sha256": hashlib.sha256(key.encode()).hexdigest()},
             headers=bearer(ADMIN))

    async def go():
        async with Client(c.urls, api_key=key) as client:
            await client.enqueue("s", "t")
            assert api.call("DELETE", "/v1/keys/tmp", headers=bearer(ADMIN))[0] == 200
            with pytest.raises(Unauthenticated):
                await client.enqueue("s", "t")
    asyncio.run(go())


def test_request_ids_are_scoped_to_the_caller_and_bound_to_the_request(keyed):
    """The security review: key A replaying key W's Request-Id got W's stored reserve answer,
    payload included, and could ack the job. Now another caller's id is simply another id."""
    c = keyed
    api = Api(c)
    other = "rq_" + uuid.uuid4().hex
    api.post("/v1/keys", {"name": "other", "role": "worker", "key_sha256": hashlib.sha256(other.encode()).hexdigest()},
             headers=bearer(ADMIN))
    api.enqueue("rid", data=b"secret payload", headers=bearer(WORKER))
    rid = {"Request-Id": "reserve-" + uuid.uuid4().hex}
    body = {"queues": ["rid"], "lease_ms": 30_000}
    status, mine = api.post("/v1/reserve", body, headers={**bearer(WORKER), **rid})
    assert status == 200 and len(mine["jobs"]) == 1
    # The same caller, the same request: the stored answer.
    assert api.post("/v1/reserve", body, headers={**bearer(WORKER), **rid}) == (200, mine)
    # Another caller with the same id: a new request (nothing ready: no jobs, no payload).
    status, theirs = api.post("/v1/reserve", body, headers={**bearer(other), **rid})
    assert status == 200 and theirs == {"jobs": []}
    # The same caller, another body or route: refused, nothing changes.
    status, out = api.post("/v1/reserve", {**body, "lease_ms": 1000}, headers={**bearer(WORKER), **rid})
    assert status == 400 and "another body" in out["error"]["message"]
    jid = mine["jobs"][0]["id"]
    status, out = api.post(f"/v1/jobs/{jid}/ack", {"attempt": 1}, headers={**bearer(WORKER), **rid})
    assert status == 400 and "another operation (reserve)" in out["error"]["message"]
    assert api.get(f"/v1/jobs/{jid}", headers=bearer(VIEWER))[1]["state"] == "in_flight"


# ---------------------------------------------------------------------------- under load
def test_a_config_change_under_load_fails_no_client_call(make_cluster):
    """The bench's mixed phase runs while a configuration change is applied every ~0.25 s: no
    client call fails, and every node reports the last version at the same index."""
    from raftq.cluster.bench.runner import Clients, phase_mixed
    from raftq.cluster.client import Client
    from raftq.cluster.progress import Progress
    c = make_cluster(storage={"dead_letter_retention_ms": 60_000})
    jobs = 3000
    versions = []

    async def changer(done: asyncio.Event):
        async with Client(c.urls, transport="http") as admin:
            i = 0
            while not done.is_set():
                cfg = await admin.config()
                i += 1
                new = dict(cfg["config"])
                new["limits"] = {**new["limits"], "max_lease_duration_ms": 300_000 - i,
                                 "retry_delay_ms": i % 3}
                out = await admin.put_config(new, cfg["version"])
                versions.append(out["version"])
                try:
                    await asyncio.wait_for(done.wait(), 0.25)
                except asyncio.TimeoutError:
                    pass

    async def go():
        clients = Clients(c.urls, "session")
        done = asyncio.Event()
        task = asyncio.create_task(changer(done))
        try:
            secs = await phase_mixed(clients, "load", jobs, 8, 8, Progress(jobs, enabled=False))
        finally:
            done.set()
            await task
            await clients.close()
        return secs
    secs = asyncio.run(go())            # raises on the first failed call
    assert len(versions) >= 2, (versions, secs)
    final = c.wait_converged(30)
    assert {v["config_version"] for v in final} == {versions[-1]}
    assert len({(v["last_applied"], v["digest"]) for v in final}) == 1
    q = Api(c).get("/v1/queues/load")[1]
    assert q["acked"] == jobs and q["ready"] == q["in_flight"] == 0
    assert Api(c).get("/v1/config")[1]["config"]["limits"]["max_lease_duration_ms"] == 300_000 - len(versions)


# ---------------------------------------------------------------------------- operator moves and the audit
def test_operator_moves_and_the_audit_trail_survive_a_leader_kill(make_cluster):
    ops_key = "ops-" + uuid.uuid4().hex
    c = make_cluster(storage={"dead_letter_retention_ms": 600_000},
                     api_keys=KEYS + [{"name": "ops", "key": ops_key, "role": "operator"}])
    api = Api(c)
    ops = bearer(ops_key)
    ready = [api.enqueue("moves", headers=ops)[1]["job_id"] for _ in range(3)]
    later = api.enqueue("moves", delay_ms=600_000, headers=ops)[1]["job_id"]
    flying = api.enqueue("moves", priority=9, headers=ops)[1]["job_id"]
    assert api.reserve(["moves"], headers=ops)[1]["jobs"][0]["id"] == flying
    # dead-letter: ready and scheduled jobs move (cause admin); in flight and unknown are missing.
    status, out = api.post("/v1/queues/moves/dead-letter", {"ids": [ready[0], later, flying, str(uuid.uuid4())],
                                                             "reason": "poison"}, headers=ops)
    assert status == 200 and out["dead_lettered"] == [ready[0], later] and len(out["missing"]) == 2
    records = {r["job"]["id"]: r for r in api.get("/v1/dead-letters", headers=ops)[1]["records"]}
    assert records[ready[0]]["cause"] == "admin" and records[later]["last_reason"] == "poison"
    assert api.get(f"/v1/jobs/{flying}", headers=ops)[1]["state"] == "in_flight"
    assert api.post("/v1/dead-letters/requeue", {"ids": [later]}, headers=ops)[1]["requeued"] == [later]
    # purge: ready and scheduled go, the in-flight one finishes normally.
    status, out = api.post("/v1/queues/moves/purge", {}, headers=ops)
    assert (status, out) == (200, {"queue": "moves", "purged": 3})
    assert api.post(f"/v1/jobs/{flying}/ack", {"attempt": 1}, headers=ops)[0] == 200
    # delete: admin only; refused while a dead letter is there, then done.
    assert api.call("DELETE", "/v1/queues/moves", headers=ops)[0] == 403
    status, out = api.call("DELETE", "/v1/queues/moves", headers=bearer(ADMIN))
    assert status == 409 and out["error"]["reason"] == "not_empty" and out["error"]["jobs"]["dead_lettered"] == 1
    assert api.post("/v1/dead-letters/delete", {"ids": [ready[0]]}, headers=ops)[1]["deleted"] == [ready[0]]
    assert api.call("DELETE", "/v1/queues/moves", headers=bearer(ADMIN)) == (200, {"queue": "moves"})
    assert api.get("/v1/queues/moves", headers=ops)[1]["enqueued"] == 0       # gone, counters included
    # pause: refused for a queue that neither exists nor is declared, unless asked to create it.
    assert api.post("/v1/queues/typo/pause", {}, headers=ops)[0] == 404
    assert api.post("/v1/queues/typo/pause", {"create": True}, headers=ops)[1] == {"queue": "typo", "paused": True}
    assert api.post("/v1/queues/" + "x" * 600 + "/pause", {"create": True}, headers=ops)[0] == 400
    job = api.enqueue("other", headers=ops)[1]["job_id"]
    assert api.call("DELETE", f"/v1/jobs/{job}", headers=ops)[0] == 200
    api.post("/v1/dead-letters/drain", {"max": 5}, headers=ops)
    want = [("ops", "drain", None), ("ops", "cancel", job), ("ops", "pause", "typo"), ("root", "queue_delete", "moves"),
            ("ops", "dead_letters_delete", None), ("ops", "purge", "moves"), ("ops", "requeue", None),
            ("ops", "dead_letter_move", "moves"), (None, "config_seed", None)]

    def trail(node=None):
        status, out = api.get("/v1/audit?limit=100", headers=ops, node=node)
        assert status == 200, out
        return [(e["who"], e["action"], e["target"]) for e in out["entries"]]
    assert trail() == want
    assert api.get("/v1/audit", headers=bearer(WORKER))[0] == 403
    entries = api.get("/v1/audit?limit=3", headers=ops)[1]
    rest = api.get(f"/v1/audit?limit=100&cursor={entries['next_cursor']}", headers=ops)[1]
    assert [(e["who"], e["action"], e["target"]) for e in entries["entries"] + rest["entries"]] == want
    # The trail is replicated state: it survives the leader's death.
    leader = c.wait_leader()
    c.kill(leader)
    new = c.wait_leader(30, exclude=leader)
    assert trail(new) == want
    moved = [e for e in api.get("/v1/audit?limit=100", headers=ops, node=new)[1]["entries"]
             if e["action"] == "dead_letter_move"][0]
    assert moved["details"]["reason"] == "poison" and moved["details"]["dead_lettered"] == 2
    c.start(leader)
    c.wait_converged(30)


# ---------------------------------------------------------------------------- snapshots
def test_the_configuration_keys_and_audit_travel_in_snapshots(make_cluster):
    """The configuration in force, the keys and the audit trail are part of the core's snapshot,
    inside the Raft fork's builtins document (raft.dump): a node restarted on a compacted log
    restores them from it (its journal no longer holds the change), and a node whose data dir
    is gone gets them in the leader's snapshot. Neither looks at its TOML for them."""
    from raftq.node.raft import pickle as raft_pickle
    from raftq.node.raft import serializer
    c = make_cluster(api_keys=KEYS[:1], tuning={"log_compaction_min_entries": 20, "log_compaction_min_time_s": 1})
    api = Api(c)
    wanted = {"limits": {"max_queue_depth": 50}, "storage": {"dead_letter_retention_ms": 600_000},
              "queues": [{"name": "emails", "default_max_attempts": 4}]}
    status, out = api.call("PUT", "/v1/config", {"config": wanted, "expect_version": 1}, headers=bearer(ADMIN))
    assert status == 200 and out["version"] == 2, out
    key = "rq_" + uuid.uuid4().hex
    assert api.post("/v1/keys", {"name": "ops", "role": "operator",
                                 "key_sha256": hashlib.sha256(key.encode()).hexdigest()},
                    headers=bearer(ADMIN))[1]["version"] == 3
    assert api.post("/v1/queues/emails/pause", {"create": True}, headers=bearer(key))[0] == 200
    cfg = api.get("/v1/config", headers=bearer(ADMIN))[1]
    trail = api.get("/v1/audit", headers=bearer(ADMIN))[1]["entries"]
    assert [e["action"] for e in trail] == ["pause", "key_add", "config_change", "config_seed"]

    def snapshot_of_it_all(i):
        """node i's raft.dump holds version 3 and the pause (snapshots every 20 entries)."""
        api.enqueue("filler", headers=bearer(ADMIN))
        try:
            with open(c.data_dir(i) / "raft.dump", "rb") as f, serializer.openDocument(f) as g:
                doc = raft_pickle.loadsBuiltins(g.read())
        except FileNotFoundError:
            return False
        m = doc["consumers"][0]["machine"]
        return m["config"]["version"] == 3 and any(e[3] == "pause" for e in m["audit"]) and m
    for i in range(c.n):
        m = poll(lambda: snapshot_of_it_all(i), 60, interval=0.2, what=f"a snapshot of version 3 on node {i}")
        assert key not in json.dumps(m["config"], default=str)      # its digest only
    # Every node restarts with other numbers and no keys in its TOML.
    c.stop_all()
    for i in range(c.n):
        c.api_keys = None
        rewrite_toml(c, i, limits={"max_queue_depth": 1}, storage={})
    c.start_all()
    c.wait_leader(30)
    after = c.wait_converged(30)
    assert all(v["config_version"] == 3 and v["toml_differs"] for v in after)
    assert api.get("/v1/config", headers=bearer(ADMIN))[1] == cfg
    assert api.get("/v1/config")[0] == 401              # the keys in force, not the TOML's (none)
    assert api.get("/v1/audit", headers=bearer(key))[1]["entries"][:4] == trail
    # A node that lost its data dir catches up from the leader's snapshot.
    leader = c.wait_leader(30)
    lost = (leader + 1) % c.n
    c.stop(lost)
    c.wipe(lost)
    for _ in range(30):                                 # past the next compaction
        assert api.enqueue("filler", headers=bearer(ADMIN))[0] == 200
    c.start(lost)
    views_ = c.wait_converged(30)
    assert len({v["digest"] for v in views_}) == 1 and views_[lost]["config_version"] == 3
    # Its auth is the key set in force: the key added online, no open API from its empty TOML.
    assert http_json("GET", c.urls[lost] + "/v1/cluster?digest=false", headers=bearer(key))[0] == 200
    assert http_json("GET", c.urls[lost] + "/v1/cluster?digest=false")[0] == 401


# ---------------------------------------------------------------------------- upgrade from 0.1.0
def test_an_upgrade_from_release_0_1_0_keeps_everything_and_seeds_version_1(tmp_path):
    """Real nodes on the data dirs of release 0.1.0 (no configuration entry in their journals):
    the entries apply under the bootstrap (the TOML, as 0.1.0 did) to the digest 0.1.0 had, then
    the leader seeds version 1 from its TOML; every job, dead letter and idempotency key of
    release-0.1.0.json is still there."""
    fx = json.loads((FIXTURES / "release-0.1.0.json").read_text())
    nodes = fx["nodes"]
    # The fixture's clock: stamps stay there (leases of 300 s, dedup windows of 1 h are live).
    times = [j["enqueued_at_ms"] for j in fx["jobs"].values()] + [r["failed_at_ms"] for r in fx["dead_letters"]]
    offset = max(times) + 1000 - time.time_ns() // 1_000_000
    c = LocalCluster(tmp_path / "c", limits=fx["limits"], storage=fx["storage"], queues=fx["queues_config"],
                     http_ports=[int(n["url"].rsplit(":", 1)[1]) for n in nodes],
                     raft_ports=[int(n["raft"].rsplit(":", 1)[1]) for n in nodes],
                     testing={"clock_offset_ms": offset})
    with tarfile.open(FIXTURES / "release-0.1.0.tar.gz") as t:
        t.extractall(c.dir, filter="data")
    c.write_configs()
    try:
        # One node alone applies its journal up to the commit index it stored: 0.1.0's state.
        c.start(0)
        v = poll(lambda: (x := c.cluster_view(0)) and x["last_applied"] >= fx["last_applied"] and x, 30,
                 what="n1 replaying its 0.1.0 journal")
        assert (v["last_applied"], v["digest"], v["config_version"]) == (fx["last_applied"], fx["digest"], 0)
        for i in (1, 2):
            c.start(i)
        leader = c.urls[c.wait_leader(30)]
        views_ = c.wait_converged(30)
        assert {x["config_version"] for x in views_} == {1} and not any(x["toml_differs"] for x in views_)
        cfg = http_json("GET", leader + "/v1/config")[1]
        assert cfg["version"] == 1 and cfg["config"]["queues"] == fx["queues_config"]
        assert cfg["config"]["storage"]["dead_letter_retention_ms"] == fx["storage"]["dead_letter_retention_ms"]
        queues = {q["name"]: q for q in http_json("GET", leader + "/v1/queues")[1]["queues"]}
        # every field 0.1.0 showed is as it showed it (later releases add fields next to them)
        assert {n: {k: queues[n][k] for k in q} for n, q in ((q["name"], q) for q in fx["queues"])} == \
            {q["name"]: q for q in fx["queues"]} and set(queues) == {q["name"] for q in fx["queues"]}
        for jid, want in fx["jobs"].items():
            got = http_json("GET", leader + f"/v1/jobs/{jid}")[1]
            assert {k: got.get(k) for k in want} == want, jid
        assert http_json("GET", leader + "/v1/dead-letters?limit=100")[1]["records"] == fx["dead_letters"]
        # welcome-i was the key of the job with payload "emails-i" (the three enqueued after the
        # snapshot, with other keys, reuse payloads emails-0..2).
        by_payload: dict[str, set] = {}
        for jid, j in fx["jobs"].items():
            if j["queue"] == "emails":
                by_payload.setdefault(base64.b64decode(j["payload"]["data_b64"]).decode(), set()).add(jid)
        for key in fx["idempotency_keys"]:
            n = key.rsplit("-", 1)[1]
            status, out = http_json("POST", leader + "/v1/jobs", {"queue": "emails", "job_type": "t",
                                                                   "idempotency_key": key})
            assert status == 200 and out["deduplicated"] is True, (key, out)
            assert out["job_id"] in by_payload[f"emails-{n}"], key
        audit = http_json("GET", leader + "/v1/audit")[1]["entries"]
        assert [e["action"] for e in audit] == ["config_seed"]      # 0.1.0's moves predate the trail
    finally:
        c.close()
    shutil.rmtree(tmp_path / "c", ignore_errors=True)


def test_no_node_is_ready_until_the_configuration_is_seeded(tmp_path):
    """docs/api.md "Cluster and node": /readyz (and `ready` in /v1/cluster, which `raftq up` waits on) says
    a node can take writes; before a new cluster's configuration is seeded every write answers
    503, so no node may say ready then, though a leader is known and everyone has caught up."""
    c = LocalCluster(tmp_path / "c", tuning={}, testing={"hold_seed": True})
    c.write_configs()
    c.start_all()               # not launch(): that waits for a seeded leader
    api = Api(c)

    def settled():
        vs = c.cluster_views(digest=False)
        return all(v and v["leader"] and v["last_applied"] >= v["commit_index"] for v in vs) and vs
    try:
        for v in poll(settled, timeout=20, what="a leader known and applied on every node"):
            assert v["config_version"] == 0 and v["ready"] is False, v
        for i in range(c.n):
            s, out = http_json("GET", c.urls[i] + "/readyz")
            assert s == 503 and out["status"] == "not_ready", (i, out)
        leader = next(i for i, v in enumerate(c.cluster_views(digest=False)) if v["role"] == "leader")
        s, out = api.enqueue("q", node=leader)
        assert s == 503 and out["error"]["code"] == "unavailable" and "seeded" in out["error"]["message"], out
        for i in range(c.n):
            (c.data_dir(i) / RELEASE_SEED).touch()
        for i in range(c.n):
            poll(lambda: http_json("GET", c.urls[i] + "/readyz")[0] == 200, timeout=20, what=f"node {i} ready")
        assert c.cluster_view(c.n - 1, digest=False)["config_version"] == 1
        assert api.enqueue("q")[0] == 200
    finally:
        c.close()
