"""The hostile-input suite (docs/limits.md "Checked by"): hypothesis over raw bytes, request heads and
headers, JSON bodies for every route of the OpenAPI document, and frames for every session op,
against a real three-node cluster with API keys on.

Each case asserts: no 5xx (and every error in the API's JSON shape); the node that took it still
runs and answers; and a refused request left the state as it was. Refused means refused by the
node itself, before anything is proposed (400 but for a reused Request-Id, 401, 403, 405, 408, 413,
415, an unknown route, a 307 of a follower, and every GET): the leader's (last_applied, digest)
must be the same after it. A refusal the replicated state decides (404 of an ack for an unknown
job, 409, 422 on a full queue) commits a no-op that moves the state's clock, so it is checked
for its status only. The cluster runs with `[testing] sweeps = false` (no sweep can land between
the two digests) and `max_wait_timeout_ms = 200` (a long poll the fuzz makes ends quickly).

RAFTQ_HOSTILE_EXAMPLES (default 15) sets the examples per route and per session op; the raw
byte and header tests take four times as many.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import string
import struct
import urllib.parse
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftq.cluster.local import LocalCluster, http_json
from tests.conftest import poll
from raftq.node.api import openapi
from raftq.node.api.session import ALL_OPS
from tests.attacks import (API_KEYS, KEYS, SECRET, ClosedByNode, RawWs, bearer, json_body, raw_exchange, read_response,
                           request_bytes)

EXAMPLES = int(os.environ.get("RAFTQ_HOSTILE_EXAMPLES", "15"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.filter_too_much, HealthCheck.data_too_large])
MORE = settings(SETTINGS, max_examples=4 * EXAMPLES)
DOC = openapi.document()
ROUTES = [(method.upper(), path, op) for path, ops in DOC["paths"].items() for method, op in ops.items()
          if path != "/v1/session"]
SESSION_OPS = DOC["paths"]["/v1/session"]["get"]["x-raftq-session-ops"]
NODE_SIDE = {400, 401, 403, 405, 408, 413, 415}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("hostile-input"), durability="memory", api_keys=API_KEYS,
                     secret=SECRET, testing={"sweeps": False},
                     limits={"max_wait_timeout_ms": 200}).launch()
    PROBES[id(c)] = Probe(c)
    yield c
    c.close()


# ------------------------------------------------------------------------------ checks
class Probe:
    """Keep-alive connections to each node for the checks of every case (a fresh connection
    and a leader search per check would cost more than the case itself)."""

    def __init__(self, c: LocalCluster):
        self.c = c
        self.conns: dict[int, http.client.HTTPConnection] = {}
        self.leader = c.wait_leader()

    def get(self, i: int, path: str) -> tuple[int, bytes]:
        for attempt in range(2):
            conn = self.conns.get(i)
            if conn is None:
                conn = self.conns[i] = http.client.HTTPConnection("127.0.0.1", self.c.http_ports[i], timeout=15)
            try:
                conn.request("GET", path, headers=bearer("viewer"))
                r = conn.getresponse()
                return r.status, r.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                del self.conns[i]
                if attempt:
                    raise

    def state(self) -> tuple:
        """The leader's (last_applied, digest)."""
        status, raw = self.get(self.leader, "/v1/cluster")
        v = json.loads(raw)
        if status != 200 or v["role"] != "leader":
            self.leader = self.c.wait_leader()
            return self.state()
        return v["last_applied"], v["digest"]


PROBES: dict = {}


def leader_state(c: LocalCluster) -> tuple:
    return PROBES.setdefault(id(c), Probe(c)).state()


def check_answer(status, headers: dict, body: bytes, what) -> dict | None:
    """No 5xx; an error is JSON {"error": {"code", "message"}}. The error object, if any."""
    assert status is None or status < 500, (what, status, body[:500])
    if status is not None and status >= 400:
        assert headers.get("content-type", "").startswith("application/json"), (what, status, headers)
        err = (json_body(body) or {}).get("error")
        assert isinstance(err, dict) and isinstance(err.get("code"), str) and isinstance(err.get("message"), str), \
            (what, status, body[:500])
        return err
    return None


def machine_refusal(err: dict | None) -> bool:
    """A 400 the replicated state decides: a request id used before for another request."""
    return bool(err) and err["message"].startswith("Request-Id ") and "already used" in err["message"]


def node_side_refusal(method: str, status, err: dict | None) -> bool:
    if method == "GET" or status == 307:
        return True
    if status in NODE_SIDE:
        return not machine_refusal(err)
    return status == 404 and bool(err) and err["message"].startswith("no route")


def check_node(c: LocalCluster, i: int, what):
    """Node i runs and answers. (The leader answers the state check that follows every case.)"""
    assert c.alive(i), (what, "the node process ended")
    probe = PROBES.setdefault(id(c), Probe(c))
    if i != probe.leader:
        status, _ = probe.get(i, "/healthz")
        assert status == 200, (what, "the node does not answer /healthz")


# ------------------------------------------------------------------------------ strategies
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=5)
                           | st.dictionaries(st.text(max_size=12), kids, max_size=5), max_leaves=12)
ids = st.one_of(st.uuids().map(str), st.text(max_size=40), st.just(openapi.EXAMPLE_ID))
names = st.one_of(st.sampled_from(["emails", "q", "a" * 300, ".", "..", "a/b", "\x00", "é"]), st.text(max_size=40))


def mutated(example):
    """The route's example with fields replaced, dropped or added (most refusals are near misses)."""
    if not isinstance(example, dict):
        return json_values

    @st.composite
    def build(draw):
        out = dict(example)
        for key in list(out):
            r = draw(st.integers(0, 5))
            if r == 0:
                del out[key]
            elif r == 1:
                out[key] = draw(json_values)
        if draw(st.booleans()):
            out[draw(st.text(max_size=12))] = draw(json_values)
        return out
    return build()


def example_of(op) -> object:
    rb = op.get("requestBody")
    if rb is None:
        return None
    schema = rb["content"]["application/json"]["schema"]
    while "$ref" in schema:
        schema = DOC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema.get("example")


def bodies(op):
    """Raw body bytes for a route: mutated examples, any JSON, broken JSON, deep nesting."""
    ex = example_of(op)
    as_json = st.one_of(mutated(ex), json_values).map(lambda v: json.dumps(v).encode())
    return st.one_of(as_json, as_json, st.binary(max_size=300), st.just(b""),
                     st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
                     st.just(b'{"a": 1e999999}'), st.just(b'{"queue": "q", "queue": "r", "job_type": "t"}'),
                     st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")))


def fill_path(path: str, draw) -> str:
    out = path
    if "{id}" in out:
        out = out.replace("{id}", urllib.parse.quote(draw(ids), safe=""))
    if "{name}" in out:
        out = out.replace("{name}", urllib.parse.quote(draw(names), safe=""))
    return out


def query(op, draw) -> str:
    params = {p["name"]: draw(st.one_of(st.text(max_size=20), st.integers(-5, 500).map(str), st.just("")))
              for p in op.get("parameters", []) if p.get("in") == "query" and draw(st.booleans())}
    if draw(st.integers(0, 4)) == 0:
        params[draw(st.text(string.ascii_letters, min_size=1, max_size=8))] = draw(st.text(max_size=10))
    return ("?" + urllib.parse.urlencode(params)) if params else ""


header_values = st.one_of(st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=60),
                          st.sampled_from(["application/json", "text/plain", "application/json; charset=latin-1",
                                           "chunked", "gzip", "-1", "99999999999999999999", "0", "100-continue",
                                           "websocket", "Upgrade", "close", "keep-alive"]))
header_names = st.sampled_from(["Content-Type", "Content-Length", "Transfer-Encoding", "Authorization", "Request-Id",
                                "Host", "Connection", "Upgrade", "Origin", "Expect", "Content-Encoding",
                                "Accept-Encoding", "X-Forwarded-For", "Cookie", "Range"]) | \
    st.text(st.sampled_from(string.ascii_letters + "-_"), min_size=1, max_size=20)


# ------------------------------------------------------------------------------ raw bytes and heads
@MORE
@given(data=st.one_of(st.binary(max_size=600),
                      st.tuples(st.sampled_from([b"GET", b"POST", b"DELETE", b"PUT", b"PRI", b"\x16\x03\x01", b""]),
                                st.binary(max_size=80), st.sampled_from([b" HTTP/1.1", b" HTTP/1.0", b" HTTP/2.0",
                                                                        b"", b" HTTP/9"]),
                                st.binary(max_size=300))
                      .map(lambda t: t[0] + b" " + t[1] + t[2] + b"\r\n" + t[3] + b"\r\n\r\n")),
       node=st.integers(0, 2))
def test_raw_bytes_on_the_http_port(cluster, data, node):
    before = leader_state(cluster)
    status, headers, body = raw_exchange(cluster.http_ports[node], data, half_close=True)
    check_answer(status, headers, body, data[:200])
    check_node(cluster, node, data[:200])
    assert leader_state(cluster) == before, data[:200]


@MORE
@given(st.data())
def test_any_headers_on_any_route(cluster, data):
    method, path, op = data.draw(st.sampled_from(ROUTES), label="route")
    target = fill_path(path, data.draw) + query(op, data.draw)
    hdrs = data.draw(st.lists(st.tuples(header_names, header_values), max_size=6), label="headers")
    if data.draw(st.booleans()):
        hdrs.append(("Authorization", f"Bearer {KEYS[data.draw(st.sampled_from(list(KEYS)))]}"))
    body = data.draw(bodies(op)) if data.draw(st.booleans()) else None
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in hdrs]
    if body is not None and not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in hdrs):
        lines.append(f"Content-Length: {len(body)}")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    node = data.draw(st.integers(0, 2), label="node")
    before = leader_state(cluster)
    status, headers, got = raw_exchange(cluster.http_ports[node], raw)
    err = check_answer(status, headers, got, raw[:300])
    check_node(cluster, node, raw[:300])
    after = leader_state(cluster)           # (also: the leader answers)
    if status is None or node_side_refusal(method, status, err):
        assert after == before, (raw[:300], status, got[:300])


# ------------------------------------------------------------------------------ JSON bodies, every route
@pytest.mark.parametrize("method,path,op", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_json_bodies_on_every_route(cluster, method, path, op):
    @SETTINGS
    @given(st.data())
    def run(data):
        target = fill_path(path, data.draw) + query(op, data.draw)
        body = data.draw(bodies(op), label="body") if method != "GET" else None
        role = data.draw(st.sampled_from(["admin", "admin", "worker", "viewer", None]), label="role")
        hdrs = {"Content-Type": "application/json"}
        if role:
            hdrs.update(bearer(role))
        if data.draw(st.booleans()):
            hdrs["Request-Id"] = data.draw(st.one_of(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E),
                                                             min_size=1, max_size=20),
                                                     st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF),
                                                             max_size=140)))
        node = data.draw(st.sampled_from([PROBES[id(cluster)].leader, data.draw(st.integers(0, 2))]), label="node")
        before = leader_state(cluster)
        raw = request_bytes(method, target, body, hdrs, close=True)
        # A valid member add waits for its (unreachable) learner until node/replication/membership.py
        # NO_PROGRESS_S (15 s) before it answers 503: wait longer than that for it.
        timeout = 30.0 if (method, path) == ("POST", "/v1/cluster/members") else 10.0
        status, headers, got = raw_exchange(cluster.http_ports[node], raw, timeout=timeout)
        if (method, path) == ("POST", "/v1/cluster/members") and status == 503:
            # A well-formed add of a node nobody runs: the documented refusal once the learner
            # made no progress (docs/cluster.md), and nothing changed.
            err = (json_body(got) or {}).get("error") or {}
            assert err.get("code") == "unavailable" and err.get("applied") is False, got[:300]
            assert leader_state(cluster) == before, got[:300]
            return
        err = check_answer(status, headers, got, (method, target, body))
        assert status is not None, (method, target, body, "no answer")
        check_node(cluster, node, (method, target))
        after = leader_state(cluster)
        if node_side_refusal(method, status, err):
            assert after == before, (method, target, body, status, got[:300])
    run()


# ------------------------------------------------------------------------------ session ops
class Session:
    """One session (admin key) to the leader, reopened when the fuzz closed it."""

    def __init__(self, c: LocalCluster):
        self.c, self.ws, self.n = c, None, 0

    def get(self) -> RawWs:
        if self.ws is None:
            self.ws = RawWs(self.c.http_ports[PROBES[id(self.c)].leader], bearer("admin"))
            assert self.ws.status == 101, self.ws.head
        return self.ws

    def drop(self):
        if self.ws is not None:
            self.ws.close()
        self.ws = None

    def exchange(self, payload: bytes, binary: bool, want_id) -> tuple[list, int | None]:
        """Send one message, then a sentinel frame; every answer until the sentinel's (and until
        the one for `want_id`, if given). (answers, close code or None)."""
        ws = self.get()
        self.n += 1
        sentinel = f"sentinel-{self.n}"
        got, seen = [], set()
        try:
            ws.send(payload, 2 if binary else 1)
            ws.send_json({"id": sentinel, "op": "server_info"})
            while sentinel not in seen or (want_id is not None and want_id not in seen):
                for a in ws.answers(15):
                    got.append(a)
                    seen.add(a.get("id") if isinstance(a.get("id"), (str, int)) else None)
        except ClosedByNode as e:
            self.drop()
            return got, e.code
        return got, None



def test_a_path_with_a_newline_in_a_segment_answers_json_404(cluster):
    """Regression (CI, the fuzz above): a percent-encoded newline in a path segment matched no
    route, not even the catch-all (its `.*` stops at a newline), and got aiohttp's plain-text 404."""
    for target in ("/v1/queues/%0A%7B/dead-letter", "/v1/jobs/%0A", "/%0A"):
        raw = request_bytes("POST", target, b"{}", {"Content-Type": "application/json", **bearer("admin")}, close=True)
        status, headers, got = raw_exchange(cluster.http_ports[0], raw)
        err = check_answer(status, headers, got, target)
        assert status in (400, 404, 405) and err is not None, (target, status, got[:300])


@pytest.fixture(scope="module")
def session(cluster):
    s = Session(cluster)
    yield s
    s.drop()


def session_body(op: str):
    route = SESSION_OPS[op]["route"]
    method, path = route.split(" ", 1)
    ex = example_of(DOC["paths"][path][method.lower()]) if method != "GET" else None
    if op in ("ack", "nack", "extend", "release") and isinstance(ex, dict):
        ex = {**ex, "job_id": openapi.EXAMPLE_ID}
    return st.one_of(mutated(ex), json_values)


@pytest.mark.parametrize("op", ALL_OPS)
def test_frames_for_every_session_op(cluster, session, op):
    @SETTINGS
    @given(st.data())
    def run(data):
        frame_id = f"f-{uuid.uuid4().hex[:8]}"
        frame = {"id": frame_id, "op": op, "body": data.draw(session_body(op), label="body")}
        if data.draw(st.booleans()):
            frame["request_id"] = data.draw(st.one_of(st.text(max_size=20), json_values), label="request_id")
        if data.draw(st.integers(0, 5)) == 0:
            del frame["body"]
        binary = data.draw(st.booleans(), label="binary")
        before = leader_state(cluster)
        answers, code = session.exchange(json.dumps(frame).encode(), binary, frame_id)
        assert code is None, (frame, code)
        mine = [a for a in answers if a.get("id") == frame_id]
        assert len(mine) == 1, (frame, answers)
        for a in answers:
            assert isinstance(a.get("status"), int) and a["status"] < 500, (frame, a)
            if a["status"] >= 400:
                assert isinstance(a["body"]["error"]["code"], str), a
        a = mine[0]
        err = a["body"].get("error") if a["status"] >= 400 else None
        check_node(cluster, PROBES[id(cluster)].leader, frame)
        after = leader_state(cluster)
        if a["status"] in NODE_SIDE and not machine_refusal(err):
            assert after == before, (frame, a)
    run()


@MORE
@given(payload=st.one_of(st.binary(max_size=300), st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
                         json_values.map(lambda v: json.dumps(v).encode()),
                         st.lists(json_values, max_size=5).map(lambda v: json.dumps(v).encode())),
       binary=st.booleans())
def test_any_message_in_a_session(cluster, session, payload, binary):
    """Any message at all: answered (400 for what is not a frame), or the session closed with a
    WebSocket protocol code (1007: a text message that is not UTF-8), never 1011."""
    before = leader_state(cluster)
    answers, code = session.exchange(payload, binary, None)
    assert code in (None, 1002, 1007), (payload, code)
    for a in answers:
        assert isinstance(a.get("status"), int) and a["status"] < 500, (payload, a)
    check_node(cluster, PROBES[id(cluster)].leader, payload)
    after = leader_state(cluster)
    if all(a.get("status", 0) in NODE_SIDE and not machine_refusal(a["body"].get("error"))
           or str(a.get("id", "")).startswith("sentinel") for a in answers):
        assert after == before, (payload, answers)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_a_body_whose_content_encoding_does_not_decode_is_a_400_and_no_traceback(cluster, encoding):
    """aiohttp drains an answered request's unread body and logged the body's error as an
    "Unhandled exception" traceback (the fuzz found it): the answer is a 400, the log one line."""
    lead = cluster.wait_leader()
    body = b"\x1f\x8b" + b"not compressed" * 8
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Authorization: Bearer {KEYS['admin']}\r\n"
            f"Content-Type: application/json\r\nContent-Encoding: {encoding}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    status, headers, answer = raw_exchange(cluster.http_ports[lead], head + body)
    assert status == 400, (status, answer)
    log = cluster.log_path(lead)
    poll(lambda: "the rest of an answered request's body was not read" in log.read_text(errors="replace")
         or "Traceback" in log.read_text(errors="replace"), what="the node's log line")
    assert "Traceback" not in log.read_text(errors="replace")


HANG_UP_AFTER = ("the request", "the first byte of the answer", "half the body")


def test_a_client_that_hangs_up_at_any_point_of_any_route_is_no_error(cluster):
    """Every route, on the leader and on a follower, with the client gone (a reset) right after
    its request, after the first byte of its answer, or halfway through its body: the node
    logs no traceback (the WebSocket upgrade's "Cannot write to closing transport" was a 500
    `internal`, the backup's a traceback in the fuzz) and answers the next client."""
    lead = cluster.wait_leader()
    status, out = http_json("POST", cluster.urls[lead] + "/v1/jobs", {"queue": "hangup", "job_type": "t"},
                            headers=bearer("admin"))
    assert status == 200, out
    job_id = out["job_id"]
    upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    routes = [(m.upper(), p, op) for p, ops in DOC["paths"].items() for m, op in ops.items()
              if m == "get" or not p.startswith("/v1/cluster")]   # no membership or leadership moves
    sizes = {}
    for node in (lead, (lead + 1) % cluster.n):
        sizes[node] = cluster.log_path(node).stat().st_size
        for method, path, op in routes:
            target = path.replace("{id}", job_id).replace("{name}", "hangup")
            example = example_of(op)
            body = json.dumps(example).encode() if example is not None else None
            headers = {**bearer("admin"), **(upgrade if path == "/v1/session" else {}),
                       **({"Content-Type": "application/json"} if body is not None else {})}
            for when in HANG_UP_AFTER:
                raw = request_bytes(method, target, body, headers)
                if when == "half the body" and body:
                    raw = raw[:len(raw) - len(body) // 2]
                with socket.create_connection(("127.0.0.1", cluster.http_ports[node]), timeout=10) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
                    s.sendall(raw)
                    if when == "the first byte of the answer":
                        try:
                            s.recv(1)
                        except OSError:         # the node may refuse by closing: as good
                            pass
        check_node(cluster, node, "after the hang-ups")
    assert leader_state(cluster)                         # the leader answers
    for node, start in sizes.items():
        def tail():
            with cluster.log_path(node).open("rb") as f:
                f.seek(start)
                return f.read().decode(errors="replace")
        text = tail()
        assert "Traceback" not in text and "unhandled error" not in text, (node, text[-4000:])


def test_the_nodes_agree_after_the_fuzz(cluster):
    """Whatever the fuzz did, every replica holds the same state and no node logged a bug."""
    cluster.wait_converged()
    for i in range(cluster.n):
        text = cluster.log_path(i).read_text(errors="replace")
        assert "Traceback" not in text and "unhandled error" not in text and "CRITICAL" not in text, i
