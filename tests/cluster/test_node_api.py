"""The whole HTTP API against a real three-node cluster (real processes, Raft and HTTP)."""
import base64
import re
import threading
import urllib.request
import time
import uuid

import pytest

from raftq.cluster.local import LocalCluster, http_json
from tests.conftest import Api, poll


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("api"), storage={"dead_letter_retention_ms": 3_600_000},
                     limits={"max_request_bytes": 200_000, "max_payload_bytes": 100_000},
                     queues=[{"name": "short", "max_lease_duration_ms": 1000}]).launch()
    yield c
    c.close()


@pytest.fixture
def api(cluster):
    return Api(cluster)


def q():
    return "q-" + uuid.uuid4().hex[:8]


def test_follower_redirects_with_307_and_location(cluster, api):
    leader = cluster.wait_leader()
    follower = (leader + 1) % 3
    # wait_leader needs a majority to agree on the leader: on a fresh cluster this follower may
    # not have heard from it yet (it answers 503 until it has), so wait for it too.
    def knows_the_leader():
        view = cluster.cluster_view(follower, digest=False) or {}
        return (view.get("leader") or {}).get("id") == cluster.ids[leader] and view.get("config_version", 0) >= 1
    poll(knows_the_leader, timeout=20, what="the follower to know the leader")
    # The redirect is opt-in (Raftq-Redirect: 1); without it a follower forwards (test_forwarding.py).
    redirect = {"Raftq-Redirect": "1"}
    status, body = http_json("POST", cluster.urls[follower] + "/v1/jobs?x=1", {"queue": "a", "job_type": "t"},
                             headers=redirect)
    assert status == 307
    assert body["error"]["code"] == "not_leader"
    assert body["error"]["leader_url"] == cluster.urls[leader]
    # The Location header carries the same path and query.
    import urllib.request
    req = urllib.request.Request(cluster.urls[follower] + "/v1/queues?x=1", method="GET", headers=redirect)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None
    try:
        urllib.request.build_opener(NoRedirect).open(req, timeout=5)
        raise AssertionError("expected a redirect")
    except urllib.error.HTTPError as e:
        assert e.code == 307
        assert e.headers["Location"] == cluster.urls[leader] + "/v1/queues?x=1"
        assert e.headers["Leader-Url"] == cluster.urls[leader]


def test_any_node_accepts_any_request(cluster, api):
    name = q()
    ids = []
    for node in range(3):
        status, body = api.enqueue(name, node=node)
        assert status == 200, body
        ids.append(body["job_id"])
    status, body = api.reserve([name], max_jobs=10, node=(cluster.wait_leader() + 1) % 3)
    assert status == 200
    assert sorted(j["id"] for j in body["jobs"]) == sorted(ids)
    for job in body["jobs"]:
        for node in range(3):
            pass
        status, out = api.post(f"/v1/jobs/{job['id']}/ack", {"attempt": 1}, node=(cluster.wait_leader() + 2) % 3)
        assert status == 200 and out == {"job_id": job["id"]}
    # Reads that any node answers itself.
    for node in range(3):
        status, info = api.get("/v1/server-info", node=node, follow=False)
        assert status == 200 and info["node_id"] == cluster.ids[node]
        assert info["max_payload_bytes"] == 100_000 and info["dead_letter_retention_enabled"] is True
        status, view = api.get("/v1/cluster", node=node, follow=False)
        assert status == 200 and view["node_id"] == cluster.ids[node]


def test_job_lifecycle_over_http(api):
    name = q()
    status, body = api.enqueue(name, data=b"hello", priority=3, custom={"k": "v", "n": 1})
    assert status == 200 and body["deduplicated"] is False
    job_id = body["job_id"]
    status, view = api.get(f"/v1/jobs/{job_id.upper()}")
    assert status == 200 and view["state"] == "ready" and view["id"] == job_id
    status, body = api.reserve([name], lease_ms=60_000)
    job = body["jobs"][0]
    assert job["id"] == job_id and job["attempt"] == 1 and job["priority"] == 3
    assert base64.b64decode(job["payload"]["data_b64"]) == b"hello"
    assert job["custom"] == {"k": "v", "n": 1}
    status, out = api.post(f"/v1/jobs/{job_id}/extend", {"attempt": 1, "lease_ms": 10_000})
    assert status == 200 and out["lease_expires_at_ms"] > job["enqueued_at_ms"]
    status, out = api.post(f"/v1/jobs/{job_id}/nack", {"attempt": 2})
    assert status == 409 and out["error"]["code"] == "attempt_mismatch"
    status, out = api.post(f"/v1/jobs/{job_id}/nack", {"attempt": 1, "reason": "flaky"})
    assert status == 200 and out == {"job_id": job_id, "dead_lettered": False}
    status, body = api.reserve([name])
    assert body["jobs"][0]["attempt"] == 2
    status, out = api.post(f"/v1/jobs/{job_id}/nack", {"attempt": 2, "retry": {"strategy": "dead_letter"},
                                                          "reason": "poison"})
    assert status == 200 and out["dead_lettered"] is True
    status, out = api.post(f"/v1/jobs/{job_id}/ack", {"attempt": 2})
    assert status == 404 and out["error"]["code"] == "job_not_found"
    status, listing = api.get(f"/v1/dead-letters?queue={name}")
    assert status == 200 and [r["job"]["id"] for r in listing["records"]] == [job_id]
    assert listing["records"][0]["cause"] == "rejected" and listing["records"][0]["last_reason"] == "poison"
    status, out = api.post("/v1/dead-letters/requeue", {"ids": [job_id, str(uuid.uuid4())]})
    assert status == 200 and out["requeued"] == [job_id] and len(out["missing"]) == 1
    status, body = api.reserve([name])
    assert body["jobs"][0]["id"] == job_id and body["jobs"][0]["attempt"] == 1
    status, out = api.post(f"/v1/jobs/{job_id}/nack", {"attempt": 1, "retry": {"strategy": "dead_letter"}})
    status, out = api.post("/v1/dead-letters/drain", {"queue": name, "max": 10})
    assert status == 200 and [r["job"]["id"] for r in out["records"]] == [job_id]
    status, out = api.post("/v1/dead-letters/drain", {"queue": name, "max": 10})
    assert out["records"] == []
    status, stats = api.get(f"/v1/queues/{name}")
    assert status == 200
    assert (stats["ready"], stats["in_flight"], stats["dead_lettered"], stats["enqueued"]) == (0, 0, 0, 1)
    assert stats["nacked"] == 3 and stats["dead_lettered_total"] == 2
    assert stats["limits"]["max_lease_duration_ms"] == 300_000


def test_batches_and_acks(api):
    name = q()
    jobs = [{"queue": name, "job_type": "t", "idempotency_key": f"k{i % 3}"} for i in range(5)]
    jobs.append({"queue": name, "job_type": ""})
    status, body = api.post("/v1/jobs/batch", {"jobs": jobs})
    assert status == 200
    results = body["results"]
    assert [r.get("deduplicated") for r in results[:5]] == [False, False, False, True, True]
    assert results[3]["job_id"] == results[0]["job_id"]
    assert results[5]["rejection"]["reason"] == "invalid_request"
    status, body = api.post("/v1/jobs/atomic", {"jobs": [{"queue": name, "job_type": "t"},
                                                         {"queue": name, "job_type": "t", "priority": 12}]})
    assert status == 422 and body["error"]["code"] == "batch_rejected"
    assert body["error"]["errors"] == [{"index": 1, "rejection": {"reason": "invalid_request",
                                                                   "message": body["error"]["errors"][0]["rejection"]["message"]}}]
    status, stats = api.get(f"/v1/queues/{name}")
    assert stats["ready"] == 3
    status, body = api.reserve([name], max_jobs=10)
    acks = [{"job_id": j["id"], "attempt": j["attempt"]} for j in body["jobs"]]
    acks.append({"job_id": str(uuid.uuid4()), "attempt": 1})
    status, out = api.post("/v1/acks", {"acks": acks})
    assert status == 200
    assert [r.get("job_id") for r in out["results"][:3]] == [a["job_id"] for a in acks[:3]]
    assert out["results"][3]["error"]["code"] == "job_not_found"


def test_long_poll_reserve_is_woken_by_enqueue(api):
    name = q()
    result = {}

    def reserve():
        t0 = time.monotonic()
        result["resp"] = api.reserve([name], wait_ms=10_000)
        result["took"] = time.monotonic() - t0

    t = threading.Thread(target=reserve)
    t.start()
    time.sleep(0.5)
    assert t.is_alive()            # parked: nothing to take yet
    status, body = api.enqueue(name)
    t.join(10)
    assert result["resp"][0] == 200
    assert [j["id"] for j in result["resp"][1]["jobs"]] == [body["job_id"]]
    assert result["took"] < 5


def test_long_poll_times_out_empty(api):
    t0 = time.monotonic()
    status, body = api.reserve([q()], wait_ms=700)
    assert status == 200 and body == {"jobs": []}
    assert time.monotonic() - t0 >= 0.6


def test_lease_expiry_redelivers_through_the_leaders_sweep(api):
    name = "short"
    api.post("/v1/dead-letters/drain", {"queue": name, "max": 100})
    status, body = api.enqueue(name)
    job_id = body["job_id"]
    status, body = api.reserve([name], lease_ms=60_000)   # clamped to the queue's 1000 ms
    job = body["jobs"][0]
    assert job["id"] == job_id
    assert job["lease_expires_at_ms"] - 1000 <= job["enqueued_at_ms"] + 1000
    status, body = api.reserve([name], wait_ms=5000)
    assert status == 200 and body["jobs"][0]["id"] == job_id and body["jobs"][0]["attempt"] == 2
    status, out = api.post(f"/v1/jobs/{job_id}/ack", {"attempt": 1})
    assert status == 409 and out["error"]["code"] == "attempt_mismatch"
    status, out = api.post(f"/v1/jobs/{job_id}/ack", {"attempt": 2})
    assert status == 200


def test_scheduled_job_is_promoted(api):
    name = q()
    status, body = api.enqueue(name, delay_ms=600)
    status, view = api.get(f"/v1/jobs/{body['job_id']}")
    assert view["state"] == "scheduled"
    status, got = api.reserve([name])
    assert got["jobs"] == []
    status, got = api.reserve([name], wait_ms=5000)
    assert [j["id"] for j in got["jobs"]] == [body["job_id"]]


def test_request_id_replay_and_validation(api):
    name = q()
    rid = {"Request-Id": "req-" + uuid.uuid4().hex}
    s1, b1 = api.enqueue(name, headers=rid)
    s2, b2 = api.enqueue(name, headers=rid)
    assert (s1, b1) == (s2, b2)
    status, stats = api.get(f"/v1/queues/{name}")
    assert stats["enqueued"] == 1
    status, body = api.post("/v1/jobs", {"queue": name, "job_type": "t"}, headers={"Request-Id": "x" * 129})
    assert status == 400 and body["error"]["code"] == "invalid_argument"


def test_bad_input_gets_clear_errors(cluster, api):
    leader = cluster.wait_leader()
    url = cluster.urls[leader]
    import urllib.request
    req = urllib.request.Request(url + "/v1/jobs", data=b"{not json", method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("expected 400")
    except urllib.error.HTTPError as e:
        assert e.code == 400
    status, body = api.post("/v1/jobs", [1, 2])
    assert status == 400 and body["error"]["code"] == "invalid_argument"
    status, body = api.post("/v1/jobs", {"queue": "a", "job_type": "t", "priority": 10})
    assert status == 422 and body["error"]["rejection"]["reason"] == "invalid_request"
    big = base64.b64encode(b"x" * 150_000).decode()
    status, body = api.post("/v1/jobs", {"queue": "a", "job_type": "t", "payload": {"data_b64": big, "encoding": "b"}})
    assert status == 413 and body["error"]["code"] == "request_too_large"
    status, body = api.post("/v1/jobs/not-a-uuid/ack", {"attempt": 1})
    assert status == 400
    status, body = api.post("/v1/reserve", {"queues": [], "lease_ms": 10})
    assert status == 400
    status, body = api.get("/v1/nothing-here")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = api.call("PUT", "/v1/jobs")
    assert status == 405 and body["error"]["code"] == "method_not_allowed" and "not allowed" in body["error"]["message"]
    status, body = api.call("DELETE", "/v1/queues")
    assert status == 405 and "not allowed" in body["error"]["message"]
    req = urllib.request.Request(url + "/v1/queues", method="DELETE")
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("expected 405")
    except urllib.error.HTTPError as e:
        assert e.code == 405 and e.headers["Allow"] == "GET, HEAD"


def test_cancel_pause_resume_and_listing(api):
    name = q()
    ids = [api.enqueue(name)[1]["job_id"] for _ in range(3)]
    status, out = api.call("DELETE", f"/v1/jobs/{ids[0]}")
    assert status == 200 and out == {"job_id": ids[0]}
    status, out = api.call("DELETE", f"/v1/jobs/{ids[0]}")
    assert status == 404
    status, out = api.post(f"/v1/queues/{name}/pause")
    assert status == 200 and out["paused"] is True
    status, got = api.reserve([name])
    assert got["jobs"] == []
    status, page = api.get(f"/v1/queues/{name}/jobs?state=ready&limit=1")
    assert status == 200 and [j["id"] for j in page["jobs"]] == [ids[1]] and page["next_cursor"]
    status, page2 = api.get(f"/v1/queues/{name}/jobs?state=ready&limit=1&cursor={page['next_cursor']}")
    assert [j["id"] for j in page2["jobs"]] == [ids[2]] and page2["next_cursor"] is None
    api.post(f"/v1/queues/{name}/resume")
    status, got = api.reserve([name])
    assert got["jobs"][0]["id"] == ids[1]
    # an in-flight job is deleted too (409 before 0.2.0); its worker's next ack is job_not_found
    status, out = api.call("DELETE", f"/v1/jobs/{ids[1]}")
    assert status == 200 and out == {"job_id": ids[1]}
    status, out = api.post(f"/v1/jobs/{ids[1]}/ack", {"attempt": got["jobs"][0]["attempt"]})
    assert status == 404 and out["error"]["code"] == "job_not_found"
    status, stats = api.get(f"/v1/queues/{name}")
    assert (stats["in_flight"], stats["ready"]) == (0, 1)
    status, listing = api.get("/v1/queues")
    assert name in [x["name"] for x in listing["queues"]]


def test_the_leader_times_the_stages_of_its_commits(cluster, api):
    """`proposer` in /v1/cluster: every batch the leader proposed and committed is timed through
    its stages (node/replication/proposer.py STAGES), which add up to its proposal-to-commit time."""
    leader = cluster.wait_leader(20)
    before = http_json("GET", cluster.urls[leader] + "/v1/cluster?digest=false")[1]["proposer"]
    queue = q()
    for _ in range(5):
        assert api.enqueue(queue)[0] == 200
    leader_now = cluster.wait_leader(20)
    after = http_json("GET", cluster.urls[leader_now] + "/v1/cluster?digest=false")[1]["proposer"]
    if leader_now != leader:
        pytest.skip("leadership moved during the test")
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert d["timed_batches"] >= 5 and d["commands"] >= 5
    stages = ("to_raft_us", "leader_sync_us", "replicate_us", "apply_us", "render_us", "to_loop_us")
    assert all(d[s] >= 0 for s in stages) and d["replicate_us"] > 0 and d["queue_us"] >= 0
    # commit_us is proposal to applied; the first four stages are its parts (each truncated to µs)
    parts = d["to_raft_us"] + d["leader_sync_us"] + d["replicate_us"] + d["apply_us"]
    assert d["commit_us"] - 4 * d["timed_batches"] <= parts <= d["commit_us"]


def test_health_and_readiness(cluster, api):
    for i in range(3):
        assert http_json("GET", cluster.urls[i] + "/healthz")[0] == 200
        poll(lambda: http_json("GET", cluster.urls[i] + "/readyz")[0] == 200, what="readyz")


def _metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def test_metrics_in_prometheus_text_format(cluster, api):
    queue = q()
    for _ in range(2):
        assert api.enqueue(queue)[0] == 200
    status, out = api.reserve([queue])
    job = out["jobs"][0]
    assert api.post(f"/v1/jobs/{job['id']}/ack", {"attempt": job["attempt"]})[0] == 200
    leader = cluster.wait_leader(20)
    text = _metrics(cluster.urls[leader])
    sample = re.compile(r'^(raftq_[a-z_]+)\{node="n\d"(,[a-z]+="[^"]*")*\} (NaN|-?\d+(\.\d+)?(e[+-]?\d+)?)$')
    families, typed = set(), set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif not line.startswith("# HELP "):
            m = sample.match(line)
            assert m, line
            families.add(m.group(1))
    assert families <= typed
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}
    node = cluster.ids[leader]
    assert values[f'raftq_leader{{node="{node}"}}'] == 1
    assert values[f'raftq_queue_enqueued_total{{node="{node}",queue="{queue}"}}'] == 2
    assert values[f'raftq_queue_acked_total{{node="{node}",queue="{queue}"}}'] == 1
    assert values[f'raftq_queue_ready{{node="{node}",queue="{queue}"}}'] == 1
    assert sum(1 for k in values if k.startswith("raftq_peer_connected")) == 2
    assert values[f'raftq_commit_timed_batches_total{{node="{node}"}}'] >= 3
    assert values[f'raftq_commit_stage_seconds_total{{node="{node}",stage="replicate"}}'] > 0
    follower = next(i for i in range(3) if i != leader)
    fvalues = _metrics(cluster.urls[follower])
    assert f'raftq_leader{{node="{cluster.ids[follower]}"}} 0' in fvalues     # any node answers itself
