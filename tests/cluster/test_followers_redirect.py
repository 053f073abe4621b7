"""A node that redirects by default (`[api] followers = "redirect"`, docs/api.md "Leader
redirect") and nodes that call each other at `[node] peer_urls` while they advertise other URLs
(docs/configuration.md; the compose layout of deploy/container): one shared cluster of real
nodes whose advertised URLs (127.0.0.2:port) are out of their own reach, as the host's loopback
is out of the containers' under compose. Whatever works between the nodes here went through
peer_urls; what a client is told is the advertised URL."""
import asyncio
import http.client
import uuid
from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest

from raftq.cluster.client import Client
from raftq.cluster.local import LocalCluster, free_ports, http_json
from raftq.node.replication.fault_hooks import clear_free, set_free
from tests.conftest import poll

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ports = free_ports(6)
    with LocalCluster(tmp_path_factory.mktemp("redirect"), http_ports=ports[:3], raft_ports=ports[3:],
                      api={"followers": "redirect"}, grpc=True, testing={"free_space_file": True},
                      advertise=[f"http://127.0.0.2:{p}" for p in ports[:3]]).launch() as c:
        yield c


def q():
    return "q-" + uuid.uuid4().hex[:8]


def call(url, method, path, body=None, headers=None):
    """(status, headers, JSON body) of one request, no redirect followed."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=15)
    try:
        conn.request(method, path, body=None if body is None else orjson.dumps(body),
                     headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        data = r.read()
        return r.status, dict(r.getheaders()), orjson.loads(data) if data else None
    finally:
        conn.close()


def follower_of(c) -> tuple[int, int]:
    leader = c.wait_leader()
    follower = (leader + 1) % c.n
    poll(lambda: http_json("GET", c.urls[follower] + "/readyz")[0] == 200, timeout=20, what="the follower ready")
    return leader, follower


def test_advertised_urls_are_out_of_the_nodes_reach(cluster):
    """The premise of the other tests: nothing listens at the advertised URLs."""
    for url in cluster.advertise:
        status, err = http_json("GET", url + "/healthz", timeout=2)
        assert status is None, (url, status, err)


def test_a_redirecting_follower_answers_307_unless_asked_to_forward(cluster):
    c = cluster
    leader, f = follower_of(c)
    name = q()
    job = {"queue": name, "job_type": "t"}
    for headers in ({}, {"Raftq-Redirect": "1"}, {"Raftq-Redirect": "yes"}):    # "yes": the node's setting
        status, h, out = call(c.urls[f], "POST", "/v1/jobs?x=1", job, headers)
        assert status == 307 and out["error"]["code"] == "not_leader", (headers, status, out)
        # The advertised URL, never peer_urls' (clients are sent where they can reach).
        assert h["Location"] == c.advertise[leader] + "/v1/jobs?x=1" and h["Leader-Url"] == c.advertise[leader]
        assert out["error"]["leader_url"] == c.advertise[leader]
    # Asked to forward: the follower answers with the leader's answer, over the link it opened at
    # the leader's peer_urls entry (the advertised URL refuses connections).
    status, _, out = call(c.urls[f], "POST", "/v1/jobs", job, {"Raftq-Redirect": "0"})
    assert status == 200 and out["deduplicated"] is False, out
    status, _, out = call(c.urls[f], "GET", f"/v1/queues/{name}")
    assert status == 307
    at_f = call(c.urls[f], "GET", f"/v1/queues/{name}", headers={"Raftq-Redirect": "0"})    # forwarded as HTTP
    at_l = call(c.urls[leader], "GET", f"/v1/queues/{name}")
    assert at_f[0] == 200 and at_f[2]["ready"] == 1 and at_f[2] == at_l[2], (at_f, at_l)
    # The leader serves either way; the header is for followers.
    for headers in ({}, {"Raftq-Redirect": "0"}, {"Raftq-Redirect": "1"}):
        assert call(c.urls[leader], "POST", "/v1/jobs", job, headers)[0] == 200
    # A follower's own reads are its own, setting or not.
    status, _, view = call(c.urls[f], "GET", "/v1/cluster?digest=false")
    assert status == 200 and view["role"] == "follower"


def test_a_session_at_a_redirecting_follower(cluster):
    """The upgrade is an HTTP request: 307 like the others; with Raftq-Redirect: 0 the session
    opens and its calls are forwarded."""
    c = cluster
    leader, f = follower_of(c)
    name = q()

    upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    status, h, out = call(c.urls[f], "GET", "/v1/session", headers=upgrade)
    assert status == 307 and h["Location"] == c.advertise[leader] + "/v1/session", (status, out)

    async def go():
        async with aiohttp.ClientSession() as http_:
            async with http_.ws_connect(c.urls[f] + "/v1/session", headers={"Raftq-Redirect": "0"}) as ws:
                await ws.send_bytes(orjson.dumps({"id": 1, "op": "enqueue", "body": {"queue": name, "job_type": "t"}}))
                await ws.send_bytes(orjson.dumps({"id": 2, "op": "reserve", "body": {
                    "queues": [name], "lease_ms": 30000, "wait_ms": 5000}}))
                answers = {}
                while len(answers) < 2:
                    a = orjson.loads((await asyncio.wait_for(ws.receive(), 15)).data)
                    answers[a["id"]] = (a["status"], a["body"])
                return answers
    answers = asyncio.run(go())
    assert answers[1][0] == 200 and answers[2][0] == 200, answers
    assert [j["id"] for j in answers[2][1]["jobs"]] == [answers[1][1]["job_id"]]


def test_grpc_at_a_redirecting_follower_is_forwarded(cluster):
    """gRPC has no redirect: sepp's clients are served at a follower whatever the setting."""
    sepp = pytest.importorskip("sepp")
    from datetime import timedelta
    c = cluster
    leader, f = follower_of(c)
    name = q()

    async def go():
        client = await sepp.SeppClient.connect(c.grpc_addr(f))
        try:
            await client.enqueue(sepp.EnqueueRequest(name, "t"))
            jobs = await client.reserve(sepp.ReserveOptions([name], timedelta(seconds=30),
                                                            wait_timeout=timedelta(seconds=5)))
            await client.ack(jobs[0].ctx)
            return len(jobs)
        finally:
            await client.close()
    assert asyncio.run(go()) == 1
    status, _, out = call(c.urls[leader], "GET", f"/v1/queues/{name}")
    assert status == 200 and out["acked"] == 1 and out["ready"] == out["in_flight"] == 0, out


def test_nodes_call_each_other_at_peer_urls_and_clients_see_the_advertised_ones(cluster):
    c = cluster
    leader, f = follower_of(c)
    status, _, view = call(c.urls[f], "GET", "/v1/cluster?digest=false")
    assert status == 200 and view["leader"]["url"] == c.advertise[leader]
    assert [m["url"] for m in view["members"]] == c.advertise
    # The node table: one node asked the two others for their views, at their peer_urls.
    status, _, nodes = call(c.urls[f], "GET", "/v1/cluster/nodes")
    assert status == 200 and [(n["url"], n["reachable"], n["error"]) for n in nodes["nodes"]] == \
        [(u, True, None) for u in c.advertise], nodes
    assert {n["role"] for n in nodes["nodes"]} == {"leader", "follower"}
    # raftq's client spread over the nodes sends Raftq-Redirect: 0, so a redirecting node serves it.

    async def spread():
        async with Client([c.urls[f]], spread=True) as client:
            name = q()
            await client.enqueue(name, "t", b"x")
            got = await client.reserve([name], lease_ms=30000)
            return client.stats["redirects"], len(got)
    redirects, reserved = asyncio.run(spread())
    assert redirects == 0 and reserved == 1


def test_a_leader_below_its_disk_reserve_hands_over_through_peer_urls(cluster):
    """The leader asks the others for their free space at peer_urls (the advertised URLs would
    refuse) and hands leadership to one of them. Last: it moves the leadership."""
    c = cluster
    leader = c.wait_leader()
    set_free(c.data_dir(leader), 1)
    try:
        new = c.wait_leader(20, exclude=leader)
        assert new != leader
    finally:
        clear_free(c.data_dir(leader))
    poll(lambda: not (c.cluster_view(leader, digest=False) or {}).get("disk", {}).get("low_space", True),
         what="the old leader's disk no longer low")
