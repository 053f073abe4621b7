"""A bare aiohttp server that answers raftq's job endpoints without doing anything.

The benchmark runs the same workload against it to show what HTTP itself costs on this machine:
raftq over HTTP should reach a large share of this ceiling (issue: ≥ 70 %).
"""
from __future__ import annotations

import argparse
import base64
import itertools
import uuid

import orjson
from aiohttp import web

_ids = itertools.count()
PAYLOAD = {"data_b64": base64.b64encode(b"x" * 256).decode(), "encoding": "application/octet-stream"}


def _json(body) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def enqueue(request: web.Request) -> web.Response:
    await request.read()
    return _json({"job_id": str(uuid.UUID(int=next(_ids))), "deduplicated": False})


async def reserve(request: web.Request) -> web.Response:
    await request.read()
    job = {"id": str(uuid.UUID(int=next(_ids))), "queue": "q", "job_type": "bench", "payload": PAYLOAD,
           "priority": 0, "custom": {}, "enqueued_at_ms": 0, "scheduled_at_ms": None, "attempt": 1,
           "max_attempts": 3, "lease_expires_at_ms": 0}
    return _json({"jobs": [job]})


async def ack(request: web.Request) -> web.Response:
    await request.read()
    return _json({"job_id": request.match_info["id"]})


async def cluster(request: web.Request) -> web.Response:
    url = f"http://{request.host}"
    return _json({"node_id": "bare", "role": "leader", "leader": {"id": "bare", "url": url}, "members": [],
                  "cpu": {"process_s": 0, "http_s": 0, "raft_s": 0, "apply_s": 0}})


def main(argv=None):
    p = argparse.ArgumentParser(prog="raftq bare-server")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    app = web.Application()
    app.router.add_post("/v1/jobs", enqueue)
    app.router.add_post("/v1/reserve", reserve)
    app.router.add_post("/v1/jobs/{id}/ack", ack)
    app.router.add_get("/v1/cluster", cluster)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
