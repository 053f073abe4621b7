"""API keys and roles (docs/api.md "Authentication") against a real three-node cluster."""
import asyncio
import json
import re
import urllib.request
import uuid

import pytest

from raftq.cluster.client import Client, PermissionDenied, Unauthenticated
from raftq.cluster.local import LocalCluster, http_json
from tests.conftest import Api

KEYS = {role: f"{role}-key-{uuid.uuid4().hex[:8]}" for role in ("viewer", "worker", "operator", "admin")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("auth"),
                     api_keys=[{"name": f"{r}-app", "key": k, "role": r} for r, k in KEYS.items()]).launch()
    yield c
    c.close()


@pytest.fixture
def api(cluster):
    return Api(cluster)


def bearer(role):
    return {"Authorization": f"Bearer {KEYS[role]}"}


def job(queue):
    return {"queue": queue, "job_type": "t"}


def ready_count(api, queue):
    status, out = api.get(f"/v1/queues/{queue}", headers=bearer("viewer"))
    return out["ready"] if status == 200 else 0


def test_no_key_unknown_key_and_malformed_header_are_401_on_every_node(cluster, api):
    leader = cluster.wait_leader(20)
    for node in range(3):                       # followers answer 401 too, before any redirect
        url = cluster.urls[node] + "/v1/jobs"
        for headers, words in (({}, "an API key is required"),
                               ({"Authorization": "Bearer nope"}, "unknown API key"),
                               ({"Authorization": f"Basic {KEYS['admin']}"}, "must be 'Bearer <key>'")):
            status, out = http_json("POST", url, job("q-401"), headers=headers)
            assert status == 401, (node, headers, out)
            assert out["error"]["code"] == "unauthenticated" and words in out["error"]["message"]
    assert ready_count(api, "q-401") == 0
    req = urllib.request.Request(cluster.urls[leader] + "/v1/queues", method="GET")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 401 and e.value.headers["WWW-Authenticate"].startswith("Bearer")


def test_each_role_reaches_what_api_md_gives_it_and_nothing_more(api):
    q = "q-" + uuid.uuid4().hex[:8]
    # viewer reads, but may not enqueue; the refused enqueue leaves no job behind
    status, out = api.post("/v1/jobs", job(q), headers=bearer("viewer"))
    assert status == 403 and out["error"]["code"] == "permission_denied"
    assert out["error"]["role"] == "viewer" and out["error"]["required_role"] == "worker"
    assert ready_count(api, q) == 0
    assert api.get("/v1/queues", headers=bearer("viewer"))[0] == 200
    assert api.get("/v1/cluster", headers=bearer("viewer"))[0] == 200
    # worker: enqueue, reserve, ack; not drain, pause or cancel
    status, out = api.post("/v1/jobs", job(q), headers=bearer("worker"))
    assert status == 200, out
    second = api.post("/v1/jobs", job(q), headers=bearer("worker"))[1]["job_id"]
    status, out = api.post("/v1/reserve", {"queues": [q], "lease_ms": 30000}, headers=bearer("worker"))
    got = out["jobs"][0]
    assert api.post(f"/v1/jobs/{got['id']}/ack", {"attempt": got["attempt"]}, headers=bearer("worker"))[0] == 200
    for method, path, body in (("POST", "/v1/dead-letters/drain", {}), ("POST", f"/v1/queues/{q}/pause", {}),
                               ("DELETE", f"/v1/jobs/{second}", None)):
        status, out = api.call(method, path, body, headers=bearer("worker"))
        assert status == 403 and out["error"]["required_role"] == "operator", (path, out)
    assert ready_count(api, q) == 1                     # the refused cancel left the job ready
    # operator: all of those
    assert api.post(f"/v1/queues/{q}/pause", {}, headers=bearer("operator"))[0] == 200
    assert api.post(f"/v1/queues/{q}/resume", {}, headers=bearer("operator"))[0] == 200
    assert api.call("DELETE", f"/v1/jobs/{second}", None, headers=bearer("operator"))[0] == 200
    assert api.post("/v1/dead-letters/drain", {}, headers=bearer("admin"))[0] == 200
    assert ready_count(api, q) == 0


def test_health_checks_need_no_key_and_unknown_v1_paths_do(cluster):
    url = cluster.urls[0]
    assert http_json("GET", url + "/healthz")[0] == 200
    assert http_json("GET", url + "/readyz")[0] in (200, 503)
    assert http_json("GET", url + "/v1/nothing-here")[0] == 401
    assert http_json("GET", url + "/metrics")[0] == 401
    req = urllib.request.Request(url + "/metrics", headers=bearer("viewer"))
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200 and b"raftq_leader" in r.read()
    status, out = http_json("GET", url + "/v1/nothing-here", headers=bearer("viewer"))
    assert status == 404 and out["error"]["code"] == "not_found"


def test_client_sends_its_key_over_http_and_session_and_reports_refusals(cluster):
    q = "q-" + uuid.uuid4().hex[:8]

    async def go():
        for transport in ("http", "session"):
            async with Client(cluster.urls, api_key=KEYS["worker"], transport=transport, timeout=10) as c:
                await c.enqueue(q, "t", b"x")
                got = await c.reserve([q], 30000, wait_ms=1000)
                await c.ack(got[0])
                with pytest.raises(PermissionDenied):      # a session frame checked against its op
                    await c.drain(q)
            async with Client(cluster.urls, api_key=KEYS["viewer"], transport=transport, timeout=10) as c:
                with pytest.raises(PermissionDenied):
                    await c.enqueue(q, "t", b"x")
            async with Client(cluster.urls, api_key="wrong", transport=transport, timeout=10) as c:
                t0 = asyncio.get_running_loop().time()
                with pytest.raises(Unauthenticated):
                    await c.enqueue(q, "t", b"x")
                assert asyncio.get_running_loop().time() - t0 < 5, "a refused key is not retried"
            async with Client(cluster.urls, transport=transport, timeout=10) as c:
                with pytest.raises(Unauthenticated):
                    await c.queues()

    asyncio.run(go())


def test_admin_page_is_served_by_every_node_without_a_key_and_its_calls_exist(cluster):
    for url in cluster.urls:
        with urllib.request.urlopen(url + "/", timeout=5) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
            page = r.read().decode()
        assert "<title>raftq admin</title>" in page and "Authorization" in page
    # Every API path the page calls (quoted or in a template, `${...}` for the variable parts) is a
    # real route that answers it (with a key), not the catch-all's "no route".
    leader = cluster.urls[cluster.wait_leader(20)]
    paths = {re.sub(r"\$\{[^}]*\}", "{}", m.group(1)) for m in re.finditer(r'["`](/v1/[^"`?]*)', page)}
    assert paths == {"/v1/cluster", "/v1/cluster/nodes", "/v1/server-info", "/v1/queues", "/v1/queues/{}/jobs",
                     "/v1/queues/{}/keys",
                     "/v1/queues/{}/{}", "/v1/queues/{}/purge", "/v1/queues/{}/dead-letter", "/v1/queues/{}",
                     "/v1/queues/{}/circuit/close",
                     "/v1/jobs", "/v1/jobs/{}", "/v1/jobs/{}/nack", "/v1/dead-letters", "/v1/dead-letters/{}",
                     "/v1/audit", "/v1/schedules", "/v1/schedules/{}", "/v1/batches/{}"}, paths
    unknown = str(uuid.uuid4())
    for method, path, body, want in (
            ("GET", "/v1/cluster?digest=false", None, 200), ("GET", "/v1/cluster/nodes", None, 200),
            ("GET", "/v1/server-info", None, 200), ("GET", "/v1/queues", None, 200),
            ("GET", "/v1/queues/ui-q/jobs?state=ready&limit=50", None, 200),
            ("POST", "/v1/queues/ui-q/pause", {"create": True}, 200), ("POST", "/v1/queues/ui-q/resume", {}, 200),
            ("GET", "/v1/queues/ui-q/keys?limit=10", None, 200),
            ("POST", "/v1/jobs", {"queue": "ui-q", "job_type": "t"}, 200),
            ("GET", f"/v1/jobs/{unknown}", None, 404), ("DELETE", f"/v1/jobs/{unknown}", None, 404),
            ("POST", f"/v1/jobs/{unknown}/nack", {"attempt": 1}, 404),
            ("GET", "/v1/dead-letters?limit=50&cause=rejected", None, 200),
            ("POST", "/v1/dead-letters/requeue", {"ids": [unknown]}, 200),
            ("POST", "/v1/dead-letters/delete", {"ids": [unknown]}, 200),
            ("POST", "/v1/queues/ui-q/dead-letter", {"ids": [unknown], "reason": "r"}, 200),
            ("POST", "/v1/queues/ui-q/purge", {}, 200), ("GET", "/v1/audit?limit=50", None, 200),
            ("POST", "/v1/queues/ui-q/circuit/close", {}, 200),
            ("GET", "/v1/schedules?limit=50", None, 200),
            ("PUT", "/v1/schedules/ui-s", {"every_ms": 60000, "job": {"queue": "ui-q", "job_type": "t"}}, 200),
            ("POST", "/v1/schedules/ui-s/pause", {}, 200), ("POST", "/v1/schedules/ui-s/resume", {}, 200),
            ("POST", "/v1/schedules/ui-s/trigger", {}, 200), ("DELETE", "/v1/schedules/ui-s?expect_version=3", None, 200),
            ("GET", "/v1/schedules/ui-s", None, 404), ("GET", f"/v1/batches/{unknown}", None, 404),
            ("DELETE", "/v1/queues/ui-q-never", None, 403)):      # admin only
        status, out = http_json(method, leader + path, body, headers=bearer("operator"))
        assert status == want, (path, out)
        assert "no route" not in json.dumps(out), (path, out)


def test_auth_rules_without_a_cluster():
    from raftq.node.base.auth import ADMIN, OPERATOR, VIEWER, WORKER, Auth
    assert Auth(None).check(None, ADMIN) is None                 # no keys configured: open
    a = Auth([{"name": "w", "key": "k1", "role": "worker"}, {"name": "a", "key": "k2", "role": "admin"}])
    assert a.check("Bearer k1", WORKER) is None and a.check("bearer  k1 ", VIEWER) is None
    status, body = a.check("Bearer k1", OPERATOR)
    assert status == 403 and body["error"]["required_role"] == "operator"
    assert a.check("Bearer k2", ADMIN) is None
    for header in (None, "", "Bearer", "Bearer ", "Token k1", "k1", "Bearer k3"):
        assert a.check(header, VIEWER)[0] == 401, header


def test_command_line_status_and_bench_with_and_without_a_key(cluster):
    from tests.cluster.test_cli import raftq
    code, out, err = raftq("status", urls=cluster.urls)
    assert code == 1 and "refused" in out and "give an API key with --api-key KEY or $RAFTQ_API_KEY" in err
    code, out, err = raftq("status", "--api-key", KEYS["viewer"], urls=cluster.urls)
    assert code == 0 and "3/3 nodes up" in out
    code, out, err = raftq("bench", "--jobs", "40", "--producers", "2", "--workers", "2", "--phases", "enqueue",
                           urls=cluster.urls)
    assert code == 1 and "give a key with the worker role or higher" in err and "an API key is required" in err
    code, out, err = raftq("bench", "--jobs", "40", "--producers", "2", "--workers", "2", "--phases", "mixed",
                           "--transport", "http", "--json", urls=cluster.urls, env={"RAFTQ_API_KEY": KEYS["worker"]})
    assert code == 0, err
    assert json.loads(out)["mixed"]["jobs"] == 40
