"""A follower serves every call itself and forwards what needs the leader (docs/api.md
"Followers", node/service/forwarding.py): real nodes, real network, one shared cluster where the
test leaves it whole."""
import asyncio
import base64
import concurrent.futures
import threading
import time
import uuid

import aiohttp
import orjson
import pytest

from raftq.cluster.client import Client
from raftq.cluster.local import LocalCluster, http_json
from raftq.cluster.chaos.proxy import NetState
from raftq.node.replication.fault_hooks import RELEASE_SEED
from raftq.node.service.forwarding import forward_token
from tests.attacks import metrics
from tests.conftest import Api, poll, proxied_cluster

pytestmark = pytest.mark.cluster

KEYS = {"worker": "w-" + "k" * 30, "operator": "o-" + "k" * 30, "admin": "a-" + "k" * 30, "viewer": "v-" + "k" * 30}


def bearer(role):
    return {"Authorization": f"Bearer {KEYS[role]}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # request_id_window_ms of an hour: no record expires while the module runs (a test counts them).
    c = LocalCluster(tmp_path_factory.mktemp("fwd"), storage={"dead_letter_retention_ms": 3_600_000},
                     limits={"request_id_window_ms": 3_600_000},
                     api_keys=[{"name": f"{r}-app", "key": k, "role": r} for r, k in KEYS.items()]).launch()
    yield c
    c.close()


def q():
    return "q-" + uuid.uuid4().hex[:8]


def follower_of(c) -> tuple[int, int]:
    leader = c.wait_leader()
    follower = (leader + 1) % c.n

    def ready():
        return http_json("GET", c.urls[follower] + "/readyz")[0] == 200
    poll(ready, timeout=20, what="the follower ready (its link to the leader open)")
    return leader, follower


def call(c, node, method, path, body=None, role="admin", headers=None, timeout=10.0):
    return http_json(method, c.urls[node] + path, body, timeout=timeout, headers={**bearer(role), **(headers or {})})


def test_every_http_write_and_read_at_a_follower_gives_the_leaders_answer(cluster):
    c = cluster
    leader, f = follower_of(c)
    name = q()
    s, out = call(c, f, "POST", "/v1/jobs", {"queue": name, "job_type": "t", "priority": 3,
                                             "payload": {"data_b64": base64.b64encode(b"hi").decode(),
                                                         "encoding": "text/plain"}}, "worker")
    assert s == 200 and out["deduplicated"] is False, out
    first = out["job_id"]
    s, out = call(c, f, "POST", "/v1/jobs/batch", {"jobs": [{"queue": name, "job_type": "t"}] * 2}, "worker")
    assert s == 200 and len(out["results"]) == 2, out
    s, out = call(c, f, "POST", "/v1/jobs/atomic", {"jobs": [{"queue": name, "job_type": "t"}]}, "worker")
    assert s == 200, out
    # Every read of the leader's state: the leader's own answer, byte for byte in JSON.
    for path in (f"/v1/queues/{name}", f"/v1/jobs/{first}", f"/v1/queues/{name}/jobs", "/v1/config", "/v1/keys",
                 "/v1/audit", "/v1/schedules", f"/v1/dead-letters?queue={name}", f"/v1/queues/{name}/keys"):
        at_f, at_l = call(c, f, "GET", path), call(c, leader, "GET", path)
        assert at_f[0] == 200 and at_f == at_l, (path, at_f, at_l)
    assert call(c, f, "GET", "/v1/queues")[0] == 200
    # The job operations, fenced by attempt as at the leader.
    s, out = call(c, f, "POST", "/v1/reserve", {"queues": [name], "lease_ms": 30000, "max_jobs": 4}, "worker")
    assert s == 200 and len(out["jobs"]) == 4 and out["jobs"][0]["id"] == first, out
    jobs = out["jobs"]
    j = jobs[0]
    s, out = call(c, f, "POST", f"/v1/jobs/{j['id']}/ack", {"attempt": j["attempt"] + 1}, "worker")
    assert s == 409 and out["error"]["code"] == "attempt_mismatch", out
    assert call(c, f, "POST", f"/v1/jobs/{j['id']}/extend", {"attempt": 1, "lease_ms": 60000}, "worker")[0] == 200
    assert call(c, f, "POST", f"/v1/jobs/{j['id']}/ack", {"attempt": 1}, "worker")[0] == 200
    s, out = call(c, f, "POST", f"/v1/jobs/{j['id']}/ack", {"attempt": 1}, "worker")
    assert s in (404, 409), out          # no longer in flight: as the leader answers it
    assert call(c, f, "POST", f"/v1/jobs/{jobs[1]['id']}/release", {"attempt": 1}, "worker")[0] == 200
    s, out = call(c, f, "POST", f"/v1/jobs/{jobs[2]['id']}/nack",
                  {"attempt": 1, "reason": "no", "retry": {"strategy": "dead_letter"}}, "worker")
    assert s == 200, out
    s, out = call(c, f, "POST", "/v1/acks", {"acks": [{"job_id": jobs[3]["id"], "attempt": 1}]}, "worker")
    assert s == 200, out
    s, out = call(c, f, "POST", "/v1/dead-letters/drain", {"queue": name, "max_records": 5}, "operator")
    assert s == 200 and len(out["records"]) == 1, out
    # Operator moves and configuration writes (forwarded as HTTP).
    assert call(c, f, "POST", f"/v1/queues/{name}/pause", None, "operator")[1] == {"queue": name, "paused": True}
    assert call(c, f, "POST", f"/v1/queues/{name}/resume", None, "operator")[0] == 200
    conf = call(c, f, "GET", "/v1/config")[1]
    body = {"expect_version": conf["version"], "config": conf["config"]}
    s, out = call(c, f, "PUT", "/v1/config", body)
    assert s == 200 and out["version"] == conf["version"] + 1, out
    s, out = call(c, f, "PUT", "/v1/config", body)
    assert s == 409, out                 # the same body again: stale expect_version, the leader's 409
    # Keys and roles are the leader's: a worker may not drain, an unknown key gets 401.
    assert call(c, f, "POST", "/v1/dead-letters/drain", {"queue": name}, "worker")[0] == 403
    assert http_json("POST", c.urls[f] + "/v1/jobs", {"queue": name, "job_type": "t"},
                     headers={"Authorization": "Bearer nope"})[0] == 401
    at_f = call(c, f, "POST", "/v1/jobs", {"queue": name}, "worker")
    assert at_f[0] in (400, 422) and at_f == call(c, leader, "POST", "/v1/jobs", {"queue": name}, "worker")


def test_a_long_poll_at_a_follower_wakes_when_a_job_arrives(cluster):
    c = cluster
    leader, f = follower_of(c)
    name = q()
    t0 = time.monotonic()

    def later():
        time.sleep(0.5)
        call(c, leader, "POST", "/v1/jobs", {"queue": name, "job_type": "t"}, "worker")
    threading.Thread(target=later).start()
    s, out = call(c, f, "POST", "/v1/reserve", {"queues": [name], "lease_ms": 30000, "wait_ms": 5000}, "worker")
    took = time.monotonic() - t0
    assert s == 200 and len(out["jobs"]) == 1 and 0.4 < took < 3, (took, out)
    s, out = call(c, f, "POST", "/v1/reserve", {"queues": [name], "lease_ms": 30000, "wait_ms": 300}, "worker")
    assert s == 200 and out["jobs"] == [], out
    # Read your writes: a reserve without a wait right after an enqueue, both at the follower
    # (whose own state may not have the job yet), takes it.
    for _ in range(20):
        assert call(c, f, "POST", "/v1/jobs", {"queue": name, "job_type": "t"}, "worker")[0] == 200
        s, out = call(c, f, "POST", "/v1/reserve", {"queues": [name], "lease_ms": 30000}, "worker")
        assert s == 200 and len(out["jobs"]) == 1, out


def test_a_request_id_replayed_through_a_follower(cluster):
    c = cluster
    leader, f = follower_of(c)
    name = q()
    rid = {"Request-Id": "fwd-" + uuid.uuid4().hex}
    body = {"queue": name, "job_type": "t"}
    first = call(c, f, "POST", "/v1/jobs", body, "worker", rid)
    assert first[0] == 200
    assert call(c, f, "POST", "/v1/jobs", body, "worker", rid) == first
    assert call(c, leader, "POST", "/v1/jobs", body, "worker", rid) == first      # the same slot as at the leader
    s, out = call(c, f, "POST", "/v1/jobs", {**body, "priority": 2}, "worker", rid)
    assert s == 400 and "another body" in out["error"]["message"], out          # the same id, another body
    assert call(c, leader, "GET", f"/v1/queues/{name}")[1]["ready"] == 1
    # An operator write forwarded as HTTP replays the same way.
    rid = {"Request-Id": "fwd-" + uuid.uuid4().hex}
    a = call(c, f, "POST", f"/v1/queues/{name}/purge", None, "operator", rid)
    assert a[0] == 200 and call(c, f, "POST", f"/v1/queues/{name}/purge", None, "operator", rid) == a


async def _session(url, key, frames, timeout=10.0):
    """Send `frames` over one session to `url`; their answers by frame id."""
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url + "/v1/session?batch=1", headers={"Authorization": f"Bearer {key}"}) as ws:
            await ws.send_bytes(orjson.dumps(frames))
            answers = {}
            async with asyncio.timeout(timeout):
                while len(answers) < len(frames):
                    msg = await ws.receive()
                    data = orjson.loads(msg.data)
                    for a in data if isinstance(data, list) else [data]:
                        answers[a["id"]] = (a["status"], a["body"])
            return answers


def test_a_session_at_a_follower(cluster):
    c = cluster
    leader, f = follower_of(c)
    name = q()
    rid = "s-" + uuid.uuid4().hex
    frames = [{"id": i, "op": "enqueue", "body": {"queue": name, "job_type": "t"}} for i in range(20)]
    frames.append({"id": 99, "op": "enqueue", "request_id": rid, "body": {"queue": name, "job_type": "t"}})
    frames.append({"id": 100, "op": "server_info", "body": {}})
    a = asyncio.run(_session(c.urls[f], KEYS["worker"], frames))
    assert all(a[i][0] == 200 for i in range(20)) and a[99][0] == 200 and a[100][0] == 200, a
    again = asyncio.run(_session(c.urls[f], KEYS["worker"], [{"id": 1, "op": "enqueue", "request_id": rid,
                                                               "body": {"queue": name, "job_type": "t"}}]))
    assert again[1] == a[99]
    got = asyncio.run(_session(c.urls[f], KEYS["worker"], [
        {"id": 1, "op": "reserve", "body": {"queues": [name], "lease_ms": 30000, "max_jobs": 30, "wait_ms": 1000}}]))
    jobs = got[1][1]["jobs"]
    assert got[1][0] == 200 and len(jobs) == 21
    acks = [{"id": i, "op": "ack", "body": {"job_id": j["id"], "attempt": 2 if i == 0 else 1}}
            for i, j in enumerate(jobs)]
    a = asyncio.run(_session(c.urls[f], KEYS["worker"], acks))
    assert a[0][0] == 409 and a[0][1]["error"]["code"] == "attempt_mismatch"
    assert all(a[i][0] == 200 for i in range(1, 21))
    a = asyncio.run(_session(c.urls[f], KEYS["viewer"], [{"id": 1, "op": "enqueue", "body": {"queue": name,
                                                                                            "job_type": "t"}}]))
    assert a[1][0] == 403


def test_the_forward_link_is_bounded(cluster):
    """More calls waiting on a follower's link than tuning.max_forward_inflight (4096): the
    rest are answered 429 overloaded at once. The leader is paused so that none is answered."""
    c = cluster
    leader, f = follower_of(c)
    name = q()

    async def flood():
        sessions = 10           # 10 x 500 frames: more than the link takes, under each session's bound
        return await asyncio.gather(*(_session(
            c.urls[f], KEYS["worker"], [{"id": i, "op": "enqueue", "request_id": f"b-{s}-{i}-{name}",
                                        "body": {"queue": name, "job_type": "t"}} for i in range(500)],
            timeout=30) for s in range(sessions)))

    refused = 'raftq_forward_refused_total{reason="max_forward_inflight"}'
    before = metrics(c, f)[refused]
    c.pause(leader)
    try:
        result = {}
        t = threading.Thread(target=lambda: result.update(a=asyncio.run(flood())))
        t.start()
        full = poll(lambda: (m := metrics(c, f))["raftq_forward_calls_in_flight"] == 4096 and m, timeout=20,
                    what="the follower's link full")
        poll(lambda: metrics(c, f)[refused] - before == 5000 - 4096, timeout=20, what="the rest refused")
    finally:
        c.resume(leader)
    t.join(60)
    answers = [a for s in result["a"] for a in s.values()]
    over = [b for s, b in answers if s == 429]
    assert len(over) == 5000 - 4096 and all(b["error"]["code"] == "overloaded" for b in over), len(over)
    assert all(s in (200, 429, 503) for s, _ in answers), {s for s, _ in answers}
    assert full['raftq_bound_hits_total{bound="max_forward_inflight"}'] >= 1
    c.wait_leader()
    poll(lambda: metrics(c, f)["raftq_forward_calls_in_flight"] == 0, timeout=20, what="the link drained")


def test_a_body_nested_too_deep_to_forward_is_refused_and_the_link_goes_on(cluster):
    """A body the follower parses but cannot write again as JSON (nested past orjson's 254
    levels) is answered 400 at the follower, not queued: its frame failed the link's writer on
    every try, and the link reopened in a loop while the call never got an answer (found by
    tests/cluster/test_hostile_input.py)."""
    c = cluster
    leader, f = follower_of(c)
    deep = []
    for _ in range(300):
        deep = [deep]
    s, out = call(c, f, "POST", "/v1/acks", {"acks": deep})
    assert s == 400 and "cannot be forwarded" in out["error"]["message"], (s, out)
    s, out = call(c, f, "POST", "/v1/jobs", {"queue": q(), "job_type": "t"}, "worker")
    assert s == 200 and out["job_id"], (s, out)


def test_307_when_asked_for(cluster):
    c = cluster
    leader, f = follower_of(c)
    s, out = call(c, f, "POST", "/v1/jobs?x=1", {"queue": "a", "job_type": "t"}, "worker", {"Raftq-Redirect": "1"})
    assert s == 307 and out["error"]["code"] == "not_leader" and out["error"]["leader_url"] == c.urls[leader]
    s, out = call(c, f, "GET", "/v1/queues", headers={"Raftq-Redirect": "1"})
    assert s == 307
    # The project's client asks for it by default and goes to the leader itself.

    async def go(spread):
        async with Client([c.urls[f]], api_key=KEYS["worker"], spread=spread) as client:
            await client.enqueue(q(), "t", b"x")
            return client.stats["redirects"], client.leader
    redirects, found = asyncio.run(go(False))
    assert found == c.urls[leader]
    redirects, _ = asyncio.run(go(True))
    assert redirects == 0


def test_a_leader_kill_while_calls_go_through_a_follower(tmp_path):
    """Answers are right or 503, never wrong. Producers with request ids retry until each enqueue
    is applied, exactly once; producers without get the follower's ids: a 200 is applied once
    (the re-send to the next leader replays it, never a second job), a 503 at most once. The
    leader is paused first, so calls are in flight on the link when it dies."""
    c = LocalCluster(tmp_path / "c", tuning={"forward_wait_s": 4.0, "request_timeout_s": 3.0}).launch()
    try:
        leader, f = follower_of(c)
        name = q()
        stop = threading.Event()
        outcomes: list = []
        unknown: list = []

        def producer(p):
            n = ok = 0
            while not stop.is_set():
                rid = f"k-{p}-{n}"
                body = {"queue": name, "job_type": "t",
                        "payload": {"data_b64": base64.b64encode(rid.encode()).decode(), "encoding": "text/plain"}}
                for _ in range(40):
                    s, out = http_json("POST", c.urls[f] + "/v1/jobs", body, timeout=15,
                                       headers={"Request-Id": rid} if p % 2 else None)
                    outcomes.append(s)
                    assert s in (200, 503, 429, None), (s, out)
                    if s == 200 or p % 2 == 0:
                        ok += s == 200
                        if s != 200:
                            unknown.append(out)
                        break
                    time.sleep(0.2)
                else:
                    raise AssertionError(f"{rid} never applied")
                n += 1
            return ok

        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            futs = [ex.submit(producer, p) for p in range(4)]
            poll(lambda: len(outcomes) >= 20, timeout=20, what="calls flowing")
            c.pause(leader)
            poll(lambda: metrics(c, f)["raftq_forward_calls_in_flight"] >= 1, timeout=10, what="calls in flight")
            c.kill(leader)
            new = c.wait_leader(30, among=[i for i in range(3) if i != leader])
            poll(lambda: outcomes.count(200) >= 40, timeout=30, what="calls answered by the new leader")
            stop.set()
            applied = sum(fu.result(timeout=120) for fu in futs)
        m = metrics(c, f)
        assert m["raftq_forward_resent_total"] >= 1          # in flight when the leader died: sent again
        s, view = http_json("GET", c.urls[new] + f"/v1/queues/{name}")
        assert s == 200 and applied <= view["ready"] <= applied + len(unknown), (view, applied, unknown)
        assert all(isinstance(u, str) or u["error"]["code"] in ("unavailable", "no_leader", "overloaded")
                   for u in unknown), unknown
    finally:
        c.close()


def test_readyz_and_writes_at_a_follower_while_the_configuration_is_seeded(tmp_path):
    c = LocalCluster(tmp_path / "c", testing={"hold_seed": True})
    c.write_configs()
    c.start_all()
    try:
        def settled():
            vs = c.cluster_views(digest=False)
            return all(v and v["leader"] and v["last_applied"] >= v["commit_index"] for v in vs) and vs
        views = poll(settled, timeout=20, what="a leader known and applied on every node")
        f = next(i for i, v in enumerate(views) if v["role"] != "leader")
        s, out = http_json("GET", c.urls[f] + "/readyz")
        assert s == 503 and out["status"] == "not_ready", out
        s, out = http_json("POST", c.urls[f] + "/v1/jobs", {"queue": "a", "job_type": "t"}, timeout=10)
        assert s == 503 and out["error"]["code"] == "unavailable", out
        for i in range(c.n):
            (c.data_dir(i) / RELEASE_SEED).touch()
        poll(lambda: http_json("GET", c.urls[f] + "/readyz")[0] == 200, timeout=20, what="the follower ready")
        assert http_json("POST", c.urls[f] + "/v1/jobs", {"queue": "a", "job_type": "t"}, timeout=10)[0] == 200
    finally:
        c.close()


def request_id_records(c, node) -> int:
    return c.cluster_view(node, digest=False)["state"]["request_ids"]


async def _link(c, node, frames, key=None, token=True):
    """Frames sent as a follower's forward link sends them (with the cluster's forward token),
    or as a client's session (token=False): their answers by frame id."""
    headers = {"Raftq-Forward": forward_token(c.secret)} if token else {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(c.urls[node] + "/v1/session?batch=1", headers=headers) as ws:
            await ws.send_bytes(orjson.dumps(frames))
            answers = {}
            async with asyncio.timeout(10):
                while len(answers) < len(frames):
                    data = orjson.loads((await ws.receive()).data)
                    for a in data if isinstance(data, list) else [data]:
                        answers[a["id"]] = (a["status"], a["body"])
            return answers


def test_a_follower_gives_each_forwarded_write_a_request_id_of_its_own(cluster):
    """A forwarded write without a Request-Id is stored under one the follower made (so a call
    lost with its leader is sent again safely); a client cannot send such an id; a second ack
    under the same one gets the first answer, not 404."""
    c = cluster
    leader, f = follower_of(c)
    name = q()
    before = request_id_records(c, leader)
    for _ in range(10):
        assert call(c, f, "POST", "/v1/jobs", {"queue": name, "job_type": "t"}, "worker")[0] == 200
    assert call(c, f, "POST", f"/v1/queues/{name}/pause", None, "operator")[0] == 200      # forwarded as HTTP
    assert request_id_records(c, leader) - before >= 11
    at_leader = request_id_records(c, leader)
    for _ in range(10):
        assert call(c, leader, "POST", "/v1/jobs", {"queue": name, "job_type": "t"}, "worker")[0] == 200
    assert request_id_records(c, leader) == at_leader     # a call sent to the leader itself keeps none
    # The leader replays an ack sent again under a follower's id: the first answer.
    assert call(c, leader, "POST", f"/v1/queues/{name}/resume", None, "operator")[0] == 200
    s, out = call(c, leader, "POST", "/v1/reserve", {"queues": [name], "lease_ms": 30000}, "worker")
    job = out["jobs"][0]
    ack = {"op": "ack", "request_id": f"fwd test {uuid.uuid4().hex[:12]} 1", "authorization": bearer("worker")[
        "Authorization"], "body": {"job_id": job["id"], "attempt": job["attempt"]}}
    a = asyncio.run(_link(c, leader, [{**ack, "id": 1}]))
    assert a[1][0] == 200 and a[1][1]["job_id"] == job["id"], a
    again = asyncio.run(_link(c, leader, [{**ack, "id": 2}]))
    assert again[2] == a[1]
    assert call(c, leader, "POST", f"/v1/jobs/{job['id']}/ack", {"attempt": job["attempt"]}, "worker")[0] in (404, 409)
    # A client's id is 1..128 visible ASCII characters: a follower's (with spaces) is refused.
    a = asyncio.run(_link(c, leader, [{**ack, "id": 3}], key=KEYS["worker"], token=False))
    assert a[3][0] == 400 and "request_id" in a[3][1]["error"]["message"], a
    s, out = call(c, leader, "POST", "/v1/jobs", {"queue": name, "job_type": "t"}, "worker",
                  {"Request-Id": "fwd test 0 1"})
    assert s == 400 and "Request-Id" in out["error"]["message"], out


def _calls_at(c, node, name, n, results):
    """n enqueues at `node`, each in a thread of its own (without a Request-Id): their (status, body)."""
    def one(k):
        results.append(call(c, node, "POST", "/v1/jobs", {"queue": name, "job_type": "t", "priority": k},
                            "worker", timeout=30))
    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    return threads


def test_calls_waiting_on_the_link_run_on_their_follower_once_it_is_elected(tmp_path):
    """The leader stops answering while calls wait on a follower's link, and that follower is
    elected (the third node's log is kept behind, so it cannot be): the calls run on it, each once,
    instead of 503. Then a node whose leader and link are gone answers 503 after forward_wait_s."""
    c, net = proxied_cluster(tmp_path / "c", api_keys=[{"name": f"{r}-app", "key": k, "role": r}
                                                      for r, k in KEYS.items()], tuning={"forward_wait_s": 2.0})
    try:
        leader, f = follower_of(c)
        t = 3 - leader - f
        net.apply(NetState(blocked={(leader, t), (t, leader)}))
        name = q()
        assert call(c, f, "POST", "/v1/jobs", {"queue": name, "job_type": "t"}, "worker")[0] == 200    # t lacks it
        before = metrics(c, f)
        c.pause(leader)
        results: list = []
        threads = _calls_at(c, f, name, 8, results)
        poll(lambda: metrics(c, f)["raftq_forward_calls_in_flight"] == 8, timeout=10, what="8 calls on the link")
        for th in threads:
            th.join(30)
        assert [s for s, _ in results] == [200] * 8, results
        after = metrics(c, f)
        assert c.cluster_view(f, digest=False)["role"] == "leader"
        assert after["raftq_forward_run_here_total"] - before["raftq_forward_run_here_total"] == 8
        assert after["raftq_forward_resent_total"] - before["raftq_forward_resent_total"] >= 8
        s, view = call(c, f, "GET", f"/v1/queues/{name}")
        assert s == 200 and view["ready"] == 9, view           # each call applied once
        # t follows f; with f and the old leader gone it has neither leader nor link: 503 after the wait.
        net.apply(NetState())
        c.resume(leader)
        poll(lambda: call(c, t, "POST", "/v1/jobs", {"queue": name, "job_type": "t"}, "worker")[0] == 200,
             timeout=20, what="t forwarding to f over its link")
        c.kill(f)
        c.kill(leader)
        t0 = time.monotonic()
        s, out = call(c, t, "POST", "/v1/jobs", {"queue": name, "job_type": "t"}, "worker", timeout=30)
        assert s == 503 and out["error"]["applied"] is False and "forward_wait_s" in out["error"]["message"], out
        assert 1.9 < time.monotonic() - t0 < 10
        m = metrics(c, t)
        assert m['raftq_forward_refused_total{reason="forward_wait_s"}'] >= 1
        assert m["raftq_forward_link_connected"] == 0 and m["raftq_forward_link_connects_total"] >= 1
    finally:
        c.close()
        net.close()


def test_forwarding_metrics(cluster):
    c = cluster
    leader, f = follower_of(c)
    before = metrics(c, f)
    name = q()
    for _ in range(5):
        assert call(c, f, "POST", "/v1/jobs", {"queue": name, "job_type": "t"}, "worker")[0] == 200
    assert call(c, f, "GET", f"/v1/queues/{name}")[0] == 200
    m = metrics(c, f)
    assert m['raftq_forwarded_calls_total{via="link"}'] - before['raftq_forwarded_calls_total{via="link"}'] == 5
    assert m['raftq_forwarded_calls_total{via="http"}'] - before['raftq_forwarded_calls_total{via="http"}'] == 1
    assert m["raftq_forward_link_connected"] == 1 and m["raftq_forward_link_connects_total"] >= 1
    assert m["raftq_forward_calls_in_flight"] == 0
    at_leader = metrics(c, leader)
    assert at_leader["raftq_forward_link_connected"] == 0 and at_leader["raftq_forward_calls_in_flight"] == 0
