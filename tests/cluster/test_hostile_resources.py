"""Each bound of docs/limits.md attacked on real node processes, and the bound asserted: the
documented status or close code, the bound's hit counted in /metrics, and the node's memory
and enqueue latency back near their baseline afterwards (tests/attacks.py).

Two clusters, three nodes each (memory durability, no sweeps), shared by the tests of this
module with bounds turned down so that each attack stays small:
* `keyed`: API keys on (one per role), the long-poll and session bounds;
* `keyless`: no keys, on loopback (the Host check), the connection cap and the HTTP deadlines.
Each test uses queue names of its own and leaves nothing parked or open behind it.
"""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from raftq.cluster.local import LocalCluster, http_json
from tests.attacks import (API_KEYS, KEYS, SECRET, Baseline, RawWs, Target, attack_fields, attack_idle, attack_session,
                           attack_waiters, attack_wakeup, bearer, closed_by_peer, digest, hits, metrics,
                           park_reserves, poll, raw_exchange, read_response, request_bytes, responsive,
                           rss_mb, still_open, weak_secret_refused, ws_frame)

KEYED_TUNING = {
    "max_parked_reserves": 400,
    "max_session_parked_reserves": 8,
    "max_session_inflight": 64,
    "max_session_queued_bytes": 64 * 1024,
    "max_queued_answer_bytes": 128 * 1024,
    "session_stall_timeout_s": 2.0,
}
KEYLESS_TUNING = {
    "max_connections": 300,
    "max_parked_reserves": 1000,
    "http_header_timeout_s": 4.0,
    "http_idle_timeout_s": 5.0,
    "http_body_timeout_s": 1.0,
    "http_write_stall_timeout_s": 2.0,
}

# The leader proposes a sweep every second while anything is pending (the configuration's audit
# entry is, from the start): without them the state changes only by requests, so a refused
# request can be checked to leave the digest as it was.
NO_SWEEPS = {"sweeps": False}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("keyed"), durability="memory", api_keys=API_KEYS, secret=SECRET,
                     tuning=KEYED_TUNING, testing=NO_SWEEPS).launch()
    yield c
    c.close()


@pytest.fixture(scope="module")
def keyless(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("keyless"), durability="memory", tuning=KEYLESS_TUNING,
                     testing=NO_SWEEPS).launch()
    yield c
    c.close()


def gauge(c: LocalCluster, i: int, name: str) -> float:
    return metrics(c, i)[name]


def quietly(fn, *args):
    """fn(*args), or None while the node answers 503 (its connections still full)."""
    import urllib.error
    try:
        return fn(*args)
    except urllib.error.HTTPError as e:
        if e.code == 503:
            return None
        raise


def nothing_parked(c: LocalCluster, i: int) -> bool:
    m = metrics(c, i)
    return m["raftq_parked_reserves"] == 0 and m["raftq_parked_reserve_queues"] == 0


# ------------------------------------------------------------------------------ long polls
def test_long_polls_that_time_out_leave_nothing_behind(keyed):
    """Finding: a reserve that timed out left its future under every queue name it named; 1,500
    of them added 68 MB to the leader and made every enqueue 10-30x slower."""
    t = Target(keyed)
    base = Baseline(keyed, t.node)
    out = attack_waiters(t, n=600, names=32, wait_ms=200, concurrency=50)
    assert out["reserve_statuses"] == {200: 600}
    # Each left the waiters map when its time was up: no parked reserve, no queue name.
    poll(lambda: nothing_parked(keyed, t.node), what="the waiters map to empty")
    base.wait_back()


def test_a_wake_up_goes_to_a_live_reserve_not_to_clients_that_left(keyed):
    """Finding: after 300 parked reserves whose clients went away, a live reserve waited its
    whole wait_ms and returned no job although one was enqueued meanwhile."""
    t = Target(keyed)
    parked0 = gauge(keyed, t.node, "raftq_parked_reserves")

    def settle(phase):
        want = {"parked": parked0 + 300, "gone": parked0, "live": parked0 + 1}[phase]
        poll(lambda: gauge(keyed, t.node, "raftq_parked_reserves") == want, what=f"{want} parked ({phase})")

    out = attack_wakeup(t, parked=300, queue="wake-live", live_wait_ms=30000, settle=settle)
    live = out["live_reserve"]
    assert live["enqueue_status"] == 200
    # The job went to the live reserve, long before its 30 s were up (a lost wake-up returns
    # empty at the end of wait_ms).
    assert live["status"] == 200 and live["jobs"] == 1, live
    poll(lambda: nothing_parked(keyed, t.node), what="nothing parked")


def test_parked_reserves_are_bounded_per_node_and_per_session(keyed):
    t = Target(keyed)
    limit = KEYED_TUNING["max_parked_reserves"]
    hits0 = hits(keyed, t.node, "max_parked_reserves")
    socks = park_reserves(t, limit, "parked-bound")
    try:
        poll(lambda: gauge(keyed, t.node, "raftq_parked_reserves") >= limit, what="the node's bound reached")
        s = socket.create_connection(("127.0.0.1", t.port), timeout=10)
        s.sendall(request_bytes("POST", "/v1/reserve", json.dumps({"queues": ["parked-bound"], "lease_ms": 1000,
                                                                   "wait_ms": 10000}).encode(),
                                {"Content-Type": "application/json", **bearer("worker")}))
        status, headers, body = read_response(s)
        s.close()
        assert status == 429 and json.loads(body)["error"]["code"] == "overloaded", body
        assert headers.get("retry-after")
        assert hits(keyed, t.node, "max_parked_reserves") == hits0 + 1
    finally:
        for s in socks:
            s.close()
    poll(lambda: nothing_parked(keyed, t.node), what="nothing parked")

    # One session: max_session_parked_reserves long polls wait, the next is refused at once.
    per_session = KEYED_TUNING["max_session_parked_reserves"]
    hits0 = hits(keyed, t.node, "max_session_parked_reserves")
    ws = RawWs(t.port, bearer("worker"))
    try:
        for i in range(per_session):
            ws.send_json({"id": i, "op": "reserve", "body": {"queues": ["parked-session"], "lease_ms": 1000,
                                                            "wait_ms": 20000}})
        poll(lambda: gauge(keyed, t.node, "raftq_parked_reserves") == per_session, what="the session's reserves parked")
        answer = ws.call({"id": "extra", "op": "reserve", "body": {"queues": ["parked-session"], "lease_ms": 1000,
                                                                  "wait_ms": 20000}})
        assert answer["status"] == 429 and answer["body"]["error"]["code"] == "overloaded", answer
        assert "max_session_parked_reserves" in answer["body"]["error"]["message"]
        assert hits(keyed, t.node, "max_session_parked_reserves") == hits0 + 1
    finally:
        ws.close()
    poll(lambda: nothing_parked(keyed, t.node), what="the session's reserves gone with it")


def test_null_optional_integers_count_as_left_out(keyed):
    t = Target(keyed)
    status, body = http_json("POST", t.url + "/v1/reserve", {"queues": ["nulls"], "lease_ms": 1000, "wait_ms": None,
                                                             "max_jobs": None}, headers=bearer("worker"))
    assert status == 200 and body == {"jobs": []}


# ------------------------------------------------------------------------------ sessions
def test_a_session_that_never_reads_is_held_back_then_closed_4008(keyed):
    """Finding: a WebSocket client (a viewer key is enough) that sends frames and never reads
    the answers grew the leader without limit (10k frames: +36 MB)."""
    t = Target(keyed)
    base = Baseline(keyed, t.node)
    stalls0 = hits(keyed, t.node, "session_stall_timeout_s")
    held0 = hits(keyed, t.node, "max_session_queued_bytes") + hits(keyed, t.node, "max_session_inflight")
    out = attack_session(t, frames=50_000, seconds=30.0, key="viewer", rcvbuf=4096)
    ws = out["ws"]
    try:
        # The session stopped being read once its bounds were reached, and was closed when its
        # answers had not been read for session_stall_timeout_s.
        assert hits(keyed, t.node, "max_session_queued_bytes") + hits(keyed, t.node, "max_session_inflight") > held0
        poll(lambda: hits(keyed, t.node, "session_stall_timeout_s") > stalls0, timeout=30,
             what="the stalled session closed", interval=0.02)
        code = ws.close_code(15.0)
        # The close frame follows the answers queued before it; a client that reads on finds
        # it, one that does not finds the connection aborted.
        assert code in (4008, None), code
        assert closed_by_peer(ws.sock, 10.0)
    finally:
        ws.close()
    poll(lambda: gauge(keyed, t.node, "raftq_sessions") == 0, what="no session left")
    base.wait_back()


def test_sessions_share_a_node_wide_bound_on_unsent_answers(keyed):
    """Three sessions that do not read, each allowed 64 KiB of unsent answers, together above
    max_queued_answer_bytes (128 KiB): the one that comes last is held back by it; a session
    that reads is not. Each sends four batches of 2,000 frames (a batch is one WebSocket
    message, so that the three are under way together): 5 MB of answers each, beyond what the
    kernel's send buffer (up to 4 MB) takes before the node holds any."""
    t = Target(keyed)
    base = Baseline(keyed, t.node)
    hits0 = hits(keyed, t.node, "max_queued_answer_bytes")
    stalled = []
    batch = json.dumps([{"id": i, "op": "cluster"} for i in range(2000)]).encode()
    try:
        for _ in range(3):
            ws = RawWs(t.port, bearer("viewer"), rcvbuf=4096)
            stalled.append(ws)
            for _ in range(4):
                ws.send(batch, 1)
        poll(lambda: hits(keyed, t.node, "max_queued_answer_bytes") > hits0, what="the node-wide bound hit")
        reader = RawWs(t.port, bearer("viewer"))
        answer = reader.call({"id": "r", "op": "server_info"})
        assert answer["status"] == 200
        reader.close()
        poll(lambda: gauge(keyed, t.node, "raftq_sessions") == 0, timeout=40, what="the stalled sessions closed")
    finally:
        for ws in stalled:
            ws.close()
    base.wait_back()


def test_a_frame_with_a_non_string_op_is_answered_and_the_session_goes_on(keyed):
    """Finding: a session frame with a non-string op killed the session with a traceback."""
    t = Target(keyed)
    ws = RawWs(t.port, bearer("worker"))
    try:
        for i, op in enumerate([["enqueue"], {"x": 1}, 7, None, True]):
            a = ws.call({"id": i, "op": op})
            assert a["status"] == 400 and a["body"]["error"]["code"] == "invalid_argument", a
        assert ws.call({"id": "after", "op": "server_info"})["status"] == 200
    finally:
        ws.close()
    assert "Traceback" not in keyed.log_path(t.node).read_text(errors="replace")


# ------------------------------------------------------------------------------ fields
def test_free_text_fields_have_length_limits(keyed):
    """Finding: trace_context, payload.encoding and the nack reason had no length limit (an
    8 MB traceparent was accepted under a 1 MiB payload limit) and went to every replica."""
    t = Target(keyed)
    follower = next(i for i in range(keyed.n) if i != t.node)
    frss0 = rss_mb(keyed.procs[follower].pid)
    keys = ("max_trace_context_bytes", "max_encoding_bytes", "max_reason_bytes", "max_worker_id_bytes")
    hits0 = {k: hits(keyed, t.node, k) for k in keys}
    out = attack_fields(t, size=8 * 1024 * 1024)
    st, body = out["traceparent"]
    assert st == 422 and body["error"]["code"] == "rejected", body
    rejection = body["error"]["rejection"]
    assert rejection["reason"] == "invalid_request" and rejection["field"] == "trace_context"
    assert rejection["limit"] == 1024 and rejection["actual"] == 8 * 1024 * 1024
    st, body = out["encoding"]
    rejection = body["error"]["rejection"]
    assert st == 422 and rejection["field"] == "payload.encoding" and rejection["limit"] == 128, body
    st, body = out["nack_reason"]
    assert st == 400 and body["error"]["field"] == "reason" and body["error"]["limit"] == 4096, body
    st, body = out["worker_id"]
    assert st == 400 and body["error"]["field"] == "worker_id" and body["error"]["limit"] == 256, body
    for k in keys:
        assert hits(keyed, t.node, k) == hits0[k] + 1, k
    # The job nacked with the long reason is untouched: still in flight, attempt 1.
    st, job = http_json("GET", t.url + f"/v1/jobs/{out['job']['id']}", headers=bearer("viewer"))
    assert st == 200 and job["state"] == "in_flight" and job["attempt"] == 1, job
    # Nothing of it reached the followers.
    assert rss_mb(keyed.procs[follower].pid) < frss0 + 10
    # At the limit it is accepted; server-info lists every limit.
    st, body = http_json("POST", t.url + "/v1/jobs", {"queue": "fields-ok", "job_type": "t",
                                                      "trace_context": {"traceparent": "0" * 1024}},
                         headers=bearer("worker"))
    assert st == 200, body
    st, info = http_json("GET", t.url + "/v1/server-info", headers=bearer("viewer"))
    assert {k: info[k] for k in keys} == {"max_trace_context_bytes": 1024, "max_encoding_bytes": 128,
                                          "max_reason_bytes": 4096, "max_worker_id_bytes": 256}


# ------------------------------------------------------------------------------ secrets
@pytest.mark.parametrize("secret", ["x", "change-me", "CHANGE-ME-run-openssl-rand-hex-32", "aaaaaaaaaaaaaaaaaaaaaaaa",
                                    "abcdabcdabcdabcdabcdabcd"])
def test_a_node_refuses_a_weak_or_placeholder_secret(secret):
    """Finding: the node took "x", "change-me" and the documented placeholder; a known secret on
    the Raft port is remote code execution (its messages are pickles)."""
    refused, text = weak_secret_refused(secret)
    assert refused, text
    assert "cluster.secret" in text
    if len(secret) > 8:                 # (a short one may be a word of the message)
        assert secret.lower() not in text.lower()       # not even a weak secret is repeated


def test_a_random_secret_is_taken():
    refused, text = weak_secret_refused(SECRET)
    assert not refused, text


# ------------------------------------------------------------------------------ HTTP connections
def test_idle_and_half_sent_connections_are_closed_and_new_clients_served(keyless):
    """Finding: idle and half-sent HTTP connections were never closed. 249 that send nothing and
    50 that send half a request head fill the node's 300 connections with a client's keep-alive
    connection: a new client is served (the connection quiet the longest, an idle one, is
    closed to make room, not the client's, though it is the oldest), and all of them are closed
    once the header deadline (4 s here) is past."""
    import http.client
    t = Target(keyless)
    base = Baseline(keyless, t.node)
    m0 = metrics(keyless, t.node)
    client = http.client.HTTPConnection("127.0.0.1", t.port, timeout=10)

    def use(conn):
        conn.request("GET", "/v1/server-info")
        r = conn.getresponse()
        r.read()
        return r.status
    assert use(client) == 200
    out = attack_idle(t, idle=249, half=0)          # its own call is the 251st connection
    socks = out["idle"]
    try:
        assert out["served_while_held"] == 200
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", t.port))
            s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
            socks.append(s)
        assert use(client) == 200       # the oldest connection, in use: now the 300th
        status, _ = http_json("GET", t.url + "/v1/server-info", timeout=15)
        assert status == 200            # the 301st: served, an idle one closed for it
        assert use(client) == 200       # the client's connection is still open
        poll(lambda: not any(still_open(s) for s in socks), timeout=30, interval=0.2,
             what="every idle and half-sent connection closed")
        m1 = metrics(keyless, t.node)
        timed_out = m1['raftq_bound_hits_total{bound="http_header_timeout_s"}'] - \
            m0['raftq_bound_hits_total{bound="http_header_timeout_s"}']
        evicted = m1['raftq_bound_hits_total{bound="max_connections_evicted"}'] - \
            m0['raftq_bound_hits_total{bound="max_connections_evicted"}']
        assert evicted >= 1 and timed_out + evicted >= 299, (timed_out, evicted)
    finally:
        client.close()
        for s in socks:
            s.close()
    base.wait_back()


def test_an_idle_keep_alive_connection_is_closed(keyless):
    t = Target(keyless)
    hits0 = hits(keyless, t.node, "http_idle_timeout_s")
    s = socket.create_connection(("127.0.0.1", t.port), timeout=10)
    try:
        s.sendall(request_bytes("GET", "/healthz"))
        status, _, _ = read_response(s)
        assert status == 200 and still_open(s)
        assert closed_by_peer(s, 20.0)
    finally:
        s.close()
    assert hits(keyless, t.node, "http_idle_timeout_s") > hits0


def test_a_body_that_does_not_arrive_in_time_is_408(keyless):
    t = Target(keyless)
    hits0 = hits(keyless, t.node, "http_body_timeout_s")
    before = digest(keyless, t.node)
    s = socket.create_connection(("127.0.0.1", t.port), timeout=10)
    try:
        head = request_bytes("POST", "/v1/jobs", None, {"Content-Type": "application/json", "Content-Length": "100"})
        s.sendall(head + b'{"queue": "slow",')
        status, _, body = read_response(s, timeout=20)
        assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout", body
        assert closed_by_peer(s, 10.0)
    finally:
        s.close()
    assert hits(keyless, t.node, "http_body_timeout_s") == hits0 + 1
    assert digest(keyless, t.node) == before


def test_an_answer_its_client_does_not_read_closes_the_connection_a_slow_reader_is_served(keyless):
    """A large answer (a page of 4 jobs of 1 MB payloads, 5.3 MB in JSON) asked for and never read: the
    connection is reset after tuning.http_write_stall_timeout_s (2 s here) instead of holding
    the answer for as long as the client likes; a client that reads it slowly (256 KiB every
    0.25 s: the node's buffer stays full for longer than the bound, but shrinks) gets all of it."""
    import base64
    t = Target(keyless)
    payloads = [os.urandom(1_000_000) for _ in range(4)]
    for payload in payloads:
        status, out = http_json("POST", t.url + "/v1/jobs", {"queue": "big-answer", "job_type": "t", "payload": {
            "data_b64": base64.b64encode(payload).decode(), "encoding": "application/octet-stream"}}, timeout=30)
        assert status == 200, out
    request = request_bytes("GET", "/v1/queues/big-answer/jobs?limit=4")

    def connect():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)     # before connect: a small window
        s.connect(("127.0.0.1", t.port))
        s.sendall(request)
        return s
    hits0 = hits(keyless, t.node, "http_write_stall_timeout_s")
    stalled, slow = connect(), connect()
    try:
        got, end, mark = b"", time.monotonic() + 60, 256 << 10
        while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < int(
                got.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0]):
            assert time.monotonic() < end, (len(got), "the slow reader did not get its answer")
            slow.settimeout(10)
            chunk = slow.recv(65536)
            assert chunk, (len(got), "the slow reader's connection was closed")
            got += chunk
            if len(got) >= mark:
                mark += 256 << 10
                time.sleep(0.25)
        answer = json.loads(got.split(b"\r\n\r\n", 1)[1])
        assert [base64.b64decode(j["payload"]["data_b64"]) for j in answer["jobs"]] == payloads
        assert hits(keyless, t.node, "http_write_stall_timeout_s") >= hits0 + 1    # the stalled one, meanwhile
        assert closed_by_peer(stalled, 10.0)
    finally:
        stalled.close()
        slow.close()
    assert responsive(keyless, t.node)


def test_past_the_connection_cap_with_every_connection_busy_a_client_gets_503(keyless):
    t = Target(keyless)
    cap = KEYLESS_TUNING["max_connections"]
    hits0 = hits(keyless, t.node, "max_connections")
    # Every connection busy: cap - 1 long polls in progress (seen parked) and one session
    # (upgraded once its 101 is back).
    socks = park_reserves(t, cap - 1, "cap-busy")
    ws = None
    try:
        poll(lambda: gauge(keyless, t.node, "raftq_parked_reserves") >= cap - 1, what="the long polls parked")
        ws = RawWs(t.port)
        assert ws.status == 101
        # A connection that was idle (a poll's, not yet seen closed) would be closed to make
        # room, once: the next attempt meets only busy ones.
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", t.port), timeout=10)
            s.sendall(request_bytes("GET", "/v1/server-info"))
            status, headers, body = read_response(s)
            s.close()
            if status != 200:
                break
        assert status == 503 and json.loads(body)["error"]["code"] == "unavailable", body
        assert headers.get("retry-after") == "1"
    finally:
        for s in socks:
            s.close()
        if ws is not None:
            ws.close()
    poll(lambda: quietly(nothing_parked, keyless, t.node), what="nothing parked")
    assert hits(keyless, t.node, "max_connections") > hits0
    assert responsive(keyless, t.node)


# ------------------------------------------------------------------------------ malformed and cross-site
def test_malformed_requests_get_json_errors_and_leave_no_key_in_the_log(keyed):
    """Finding: a malformed request made aiohttp log its raw header lines, API keys included."""
    t = Target(keyed)
    canary = "canary-" + KEYS["admin"][-12:] + "x"
    answers = [raw_exchange(t.port, data) for data in (
        b"GET /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + canary.encode() + b"\x01\r\n\r\n",
        b"GET /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEYS["worker"].encode()
        + b"\r\nContent-Length: abc\r\n\r\n",
        b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEYS["admin"].encode()
        + b"\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nzz\r\n",
    )]
    for status, headers, body in answers:
        assert status == 400 and headers["content-type"].startswith("application/json"), (status, body)
        assert json.loads(body)["error"]["code"] == "invalid_argument"
    assert responsive(keyed, t.node)
    text = keyed.log_path(t.node).read_text(errors="replace")
    assert "malformed HTTP request" in text
    for secret in (canary, KEYS["worker"], KEYS["admin"]):
        assert secret not in text


def test_bodies_not_declared_json_are_415_and_change_nothing(keyed):
    t = Target(keyed)
    before = digest(keyed, t.node)
    for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        status, _, body = raw_exchange(t.port, request_bytes("POST", "/v1/jobs", b'{"queue": "csrf", "job_type": "t"}',
                                                             {"Content-Type": ct, **bearer("worker")}, close=True))
        assert status == 415 and json.loads(body)["error"]["code"] == "unsupported_media_type", (ct, body)
    assert digest(keyed, t.node) == before


def test_wrong_methods_are_405_with_allow_and_a_session_needs_an_upgrade(keyed):
    t = Target(keyed)
    status, headers, body = raw_exchange(t.port, request_bytes("PUT", "/v1/jobs", b"{}", {
        "Content-Type": "application/json", **bearer("worker")}, close=True))
    assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"
    assert "POST" in headers["allow"]
    status, headers, body = raw_exchange(t.port, request_bytes("GET", "/v1/session", None, bearer("worker"), close=True))
    assert status == 400 and headers["content-type"].startswith("application/json")
    assert "upgrade" in json.loads(body)["error"]["message"].lower()


def test_a_keyless_loopback_node_answers_only_its_own_host_names_and_origins(keyless):
    """Finding: text/plain and form bodies reached a keyless local cluster from any web page.
    Beyond 415, the node checks the Host header (DNS rebinding) and a session's Origin."""
    t = Target(keyless)
    before = digest(keyless, t.node)
    body = json.dumps({"queue": "rebind", "job_type": "t"}).encode()
    status, _, raw = raw_exchange(t.port, request_bytes("POST", "/v1/jobs", body, {"Content-Type": "application/json"},
                                                        host="attacker.example:8080", close=True))
    assert status == 400 and "Host" in json.loads(raw)["error"]["message"]
    assert digest(keyless, t.node) == before
    for host in ("127.0.0.1", "localhost", f"127.0.0.1:{t.port}"):
        status, _, _ = raw_exchange(t.port, request_bytes("GET", "/v1/server-info", host=host, close=True))
        assert status == 200, host
    ws = RawWs(t.port, {"Origin": "http://attacker.example"})
    assert ws.status == 403, ws.head
    ws.close()
    ws = RawWs(t.port, {"Origin": "http://127.0.0.1"})       # (RawWs sends Host: 127.0.0.1)
    assert ws.status == 101, ws.head
    ws.close()


# ------------------------------------------------------------------------------ request ids
def test_request_ids_are_the_callers_own_and_bound_to_their_request(keyed):
    """Finding: key A replaying key W's Request-Id received W's stored reserve answer, payload
    included, and could ack the job. Now an id is scoped to the key that sent it and bound to
    the operation and its body (a reuse with another body is refused)."""
    t = Target(keyed)
    w, other = bearer("worker"), bearer("operator")

    def post(path, body, headers, rid):
        return http_json("POST", t.url + path, body, headers={**headers, "Request-Id": rid})

    st, _ = http_json("POST", t.url + "/v1/jobs", {"queue": "rid-scope", "job_type": "t",
                                                   "payload": {"data_b64": "c2VjcmV0", "encoding": "text/plain"}},
                     headers=w)
    assert st == 200
    reserve = {"queues": ["rid-scope"], "lease_ms": 60000}
    st, mine = post("/v1/reserve", reserve, w, "rid-1")
    assert st == 200 and len(mine["jobs"]) == 1
    job = mine["jobs"][0]
    # Another key with the same id gets an answer of its own (nothing left to reserve), not W's.
    st, theirs = post("/v1/reserve", reserve, other, "rid-1")
    assert st == 200 and theirs == {"jobs": []}, theirs
    # W's retry of the same request is answered from the store; another body or another
    # operation under the same id is refused.
    assert post("/v1/reserve", reserve, w, "rid-1") == (200, mine)
    st, body = post("/v1/reserve", {**reserve, "lease_ms": 1000}, w, "rid-1")
    assert st == 400 and body["error"]["code"] == "invalid_argument" and "rid-1" in body["error"]["message"], body
    assert "\x1f" not in body["error"]["message"]
    st, body = post("/v1/jobs", {"queue": "rid-scope", "job_type": "t"}, w, "rid-1")
    assert st == 400 and "already used" in body["error"]["message"], body
    st, job_view = http_json("GET", t.url + f"/v1/jobs/{job['id']}", headers=w)
    assert job_view["state"] == "in_flight" and job_view["attempt"] == 1
    # One request over HTTP and over the session is one request: the same answer.
    enqueue = {"queue": "rid-scope", "job_type": "both-ways"}
    st, first = post("/v1/jobs", enqueue, w, "rid-2")
    assert st == 200
    ws = RawWs(t.port, w)
    try:
        again = ws.call({"id": 1, "op": "enqueue", "request_id": "rid-2", "body": enqueue})
        assert again["status"] == 200 and again["body"] == first, (again, first)
        ack = ws.call({"id": 2, "op": "ack", "request_id": "rid-3", "body": {"job_id": job["id"], "attempt": 1}})
        assert ack["status"] == 200, ack
    finally:
        ws.close()
    st, out = http_json("POST", t.url + f"/v1/jobs/{job['id']}/ack", {"job_id": job["id"], "attempt": 1},
                        headers={**w, "Request-Id": "rid-3"})
    assert (st, out) == (200, ack["body"])


def test_tls_handshakes_in_progress_are_bounded_too(make_cluster):
    """On a TLS node a connection joins the server's connections only after its handshake; until
    then at most max_connections are held, the oldest closed to make room, each at most the
    header deadline. 60 connections that never send a byte against 20: a client still gets in."""
    c = make_cluster(durability="memory", tls=True, tuning={"max_connections": 20, "http_header_timeout_s": 2.0})
    t = Target(c)
    m0 = metrics(c, t.node)
    socks = [socket.create_connection(("127.0.0.1", t.port), timeout=10) for _ in range(60)]
    try:
        status, _ = http_json("GET", t.url + "/v1/server-info", timeout=15, context=c.client_ssl)
        assert status == 200
        poll(lambda: not any(still_open(s) for s in socks), timeout=30, interval=0.2,
             what="every idle connection closed")
    finally:
        for s in socks:
            s.close()
    m1 = metrics(c, t.node)
    key = 'raftq_bound_hits_total{bound="max_connections_evicted"}'
    assert m1[key] - m0[key] >= 40, (m0[key], m1[key])

