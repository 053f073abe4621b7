"""Bounded in-flight work, and long polls that must not take jobs for nobody."""
import asyncio
import socket
import time

import aiohttp
import orjson

from raftq.cluster.local import http_json
from tests.conftest import Api, poll


def test_past_the_inflight_bound_requests_get_429_and_nothing_is_lost(make_cluster):
    c = make_cluster(tuning={"max_inflight": 3})
    leader = c.wait_leader()
    url = c.urls[leader]

    async def burst():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200)) as s:
            async def one(i):
                async with s.post(url + "/v1/jobs", data=orjson.dumps({"queue": "b", "job_type": f"t{i}"}),
                                  headers={"Content-Type": "application/json"}) as r:
                    return r.status, orjson.loads(await r.read()), r.headers.get("Retry-After")
            return await asyncio.gather(*(one(i) for i in range(150)))

    results = asyncio.run(burst())
    statuses = [r[0] for r in results]
    assert set(statuses) <= {200, 429}, statuses
    shed = [r for r in results if r[0] == 429]
    assert shed, "expected some requests to be shed with 429"
    assert all(r[1]["error"]["code"] == "overloaded" and r[2] for r in shed)
    ok = sum(1 for s in statuses if s == 200)
    status, stats = Api(c).get("/v1/queues/b")
    assert stats["ready"] == ok and stats["enqueued"] == ok


def test_parked_reserve_whose_client_left_takes_no_job(make_cluster):
    c = make_cluster()
    leader = c.wait_leader()
    host, port = "127.0.0.1", c.http_ports[leader]
    body = orjson.dumps({"queues": ["gone"], "lease_ms": 60000, "wait_ms": 20000})
    sock = socket.create_connection((host, port))
    sock.sendall(b"POST /v1/reserve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(0.5)                  # the reserve is parked on the leader
    sock.close()                     # ... and its client goes away
    time.sleep(0.3)
    api = Api(c)
    status, out = api.enqueue("gone")
    assert status == 200
    time.sleep(1.0)
    status, view = api.get(f"/v1/jobs/{out['job_id']}")
    assert view["state"] == "ready", view
    # A live long poll does get it.
    status, got = api.reserve(["gone"], wait_ms=2000)
    assert [j["id"] for j in got["jobs"]] == [out["job_id"]]


def test_parked_reserves_return_empty_when_leadership_moves(make_cluster):
    c = make_cluster()
    leader = c.wait_leader()
    url = c.urls[leader]
    result = {}

    async def park():
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            async with s.post(url + "/v1/reserve", data=orjson.dumps({"queues": ["x"], "lease_ms": 1000,
                                                                      "wait_ms": 20000}),
                              headers={"Content-Type": "application/json"}) as r:
                result["status"] = r.status
                result["body"] = orjson.loads(await r.read())
                result["took"] = time.monotonic() - t0

    import threading
    t = threading.Thread(target=lambda: asyncio.run(park()))
    t.start()
    time.sleep(0.5)
    assert c.stop(leader) == 0       # graceful: leadership is handed over first
    t.join(15)
    assert result.get("status") == 200 and result["body"] == {"jobs": []}, result
    assert result["took"] < 10
