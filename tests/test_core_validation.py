"""Validation first (docs/semantics.md, Enqueue; docs/api.md "Shapes"): every check decided
before apply (node.validate), the rejection catalogue in its order with its fields, request-level
400s and the strict-mode 409. The configuration's own checks are in test_core_configuration.py."""
from __future__ import annotations

import uuid

import pytest

from raftq.node.base import validate as C
from raftq.node.core import ops
from raftq.node.core.errors import ApiError
from raftq.node.core.limits import Limits

from helpers_core import T0, Core, b64, err, payload, rejection

JID = str(uuid.UUID(int=42, version=4))


# ============================================================================ rejection order

CHAIN_LIMITS = {"max_queue_name_bytes": 8, "max_job_type_bytes": 8, "max_idempotency_key_bytes": 8}
CHAIN_QUEUES = [{"name": "q", "allowed_job_types": ["ok", "zzzzzzzzz"], "max_payload_bytes": 4,
                 "allowed_encodings": ["text/plain"], "max_custom_entries": 2,
                 "max_custom_key_bytes": 4, "max_custom_total_bytes": 20,
                 "max_schedule_horizon_ms": 1_000, "max_queue_depth": 1}]


def _rejection_via(c: Core, how: str, job) -> dict:
    if how == "single":
        return rejection(c.enqueue_body(job))
    if how == "batch":
        status, body = c.batch([job])
        assert status == 200, body
        return body["results"][0]["rejection"]
    status, body = c.atomic([{"queue": "q", "job_type": "ok"}, job])
    assert status == 422 and body["error"]["code"] == "batch_rejected", body
    assert [e["index"] for e in body["error"]["errors"]] == [1]
    return body["error"]["errors"][0]["rejection"]


@pytest.mark.parametrize("how", ["single", "batch", "atomic"])
def test_rejections_come_in_api_order_first_failing_check_wins(how):
    """One job that fails every check; fixing the reported problem reveals the next one."""
    c = Core(limits=CHAIN_LIMITS, queues=CHAIN_QUEUES)
    filler = c.enqueue_id("q", "ok")                      # the queue is now at its depth limit
    now = c.now
    job = {"queue": "q", "job_type": "bad", "idempotency_key": "k" * 9,
           "payload": payload(b"12345", "app/bin"),
           "custom": {"a": 1, "b": 2, "ccccc": "x" * 30}, "scheduled_at_ms": now + 1_001}
    got = _rejection_via(c, how, {**job, "priority": 10})
    assert got["reason"] == "invalid_request" and "priority" in got["message"]
    steps = [
        ({}, {"reason": "job_type_not_allowed", "job_type": "bad", "allowed": ["ok", "zzzzzzzzz"]}),
        ({"job_type": "ok"}, {"reason": "idempotency_key_too_long", "limit": 8, "actual": 9}),
        ({"idempotency_key": "k"}, {"reason": "payload_too_large", "limit": 4, "actual": 5}),
        ({"payload": payload(b"1234", "app/bin")},
         {"reason": "encoding_not_allowed", "encoding": "app/bin", "allowed": ["text/plain"]}),
        ({"payload": payload(b"1234", "text/plain")},
         {"reason": "custom_entries_too_many", "limit": 2, "actual": 3}),
        ({"custom": {"ccccc": "x" * 30}},
         {"reason": "custom_key_too_long", "key": "ccccc", "limit": 4, "actual": 5}),
        ({"custom": {"cccc": "x" * 30}}, {"reason": "custom_map_too_large", "limit": 20, "actual": 34}),
        ({"custom": {"cccc": "x"}},
         {"reason": "scheduled_too_far", "horizon_ms": 1_000, "scheduled_at_ms": now + 1_001}),
    ]
    for change, expected in steps:
        job = {**job, **change}
        assert _rejection_via(c, how, job) == expected, change
    job = {**job, "scheduled_at_ms": now + 1_000}
    if how == "atomic":                                   # decided at apply, for the whole batch
        status, body = c.atomic([job])
        assert status == 422 and body["error"]["errors"] == \
            [{"index": 0, "rejection": {"reason": "queue_full", "queue": "q", "limit": 1}}]
    else:
        assert _rejection_via(c, how, job) == {"reason": "queue_full", "queue": "q", "limit": 1}
    assert c.stats("q")["enqueued"] == 1 and c.counts("q")["ready"] == 1
    assert c.cancel(filler)[0] == 200
    send = {"single": c.enqueue_body, "batch": lambda j: c.batch([j]), "atomic": lambda j: c.atomic([j])}[how]
    status, body = send(job)
    assert status == 200 and "rejection" not in str(body)
    assert c.counts("q")["scheduled"] == 1


def test_invalid_request_wins_over_every_other_reason():
    c = Core(limits={"strict_queues": True, "max_job_type_bytes": 1})
    r = rejection(c.enqueue("undeclared", "long", priority=99))
    assert r["reason"] == "invalid_request" and "priority" in r["message"]


def test_unknown_queue_in_strict_mode_comes_before_the_size_checks():
    c = Core(limits={"strict_queues": True, "max_queue_name_bytes": 4, "max_job_type_bytes": 1},
             queues=[{"name": "ok"}])
    assert rejection(c.enqueue("zz", "long")) == {"reason": "unknown_queue", "queue": "zz"}
    assert rejection(c.enqueue("toolong", "long")) == {"reason": "unknown_queue", "queue": "toolong"}
    assert rejection(c.enqueue("ok", "long")) == {"reason": "job_type_name_too_long", "limit": 1, "actual": 4}
    assert c.enqueue("ok", "t")[0] == 200


def test_queue_name_too_long_comes_before_job_type_name_too_long_and_counts_utf8_bytes():
    c = Core(limits={"max_queue_name_bytes": 3, "max_job_type_bytes": 1})
    assert rejection(c.enqueue("éé", "long")) == {"reason": "queue_name_too_long", "limit": 3, "actual": 4}
    assert rejection(c.enqueue("abc", "éé")) == {"reason": "job_type_name_too_long", "limit": 1, "actual": 4}
    assert c.enqueue("abc", "t")[0] == 200


def test_job_type_name_too_long_comes_before_job_type_not_allowed():
    c = Core(limits={"max_job_type_bytes": 3}, queues=[{"name": "q", "allowed_job_types": ["a"]}])
    assert rejection(c.enqueue(job_type="long"))["reason"] == "job_type_name_too_long"
    assert rejection(c.enqueue(job_type="b")) == {"reason": "job_type_not_allowed", "job_type": "b", "allowed": ["a"]}
    assert c.enqueue(job_type="a")[0] == 200
    assert c.enqueue("other", job_type="b")[0] == 200         # the list is the queue's own


def test_idempotency_key_limit_is_in_utf8_bytes():
    c = Core(limits={"max_idempotency_key_bytes": 4})
    assert c.enqueue(idempotency_key="éé")[0] == 200
    assert rejection(c.enqueue(idempotency_key="ééé")) == {"reason": "idempotency_key_too_long", "limit": 4, "actual": 6}


def test_payload_size_is_of_the_decoded_bytes_and_per_queue():
    c = Core(limits={"max_payload_bytes": 10}, queues=[{"name": "small", "max_payload_bytes": 2}])
    assert c.enqueue(payload=payload(b"x" * 10))[0] == 200      # 16 base64 characters
    assert rejection(c.enqueue(payload=payload(b"x" * 11))) == {"reason": "payload_too_large", "limit": 10, "actual": 11}
    assert rejection(c.enqueue("small", payload=payload(b"abc")))["limit"] == 2


def test_encodings_checked_only_with_a_payload_and_queue_list_replaces_global():
    c = Core(limits={"allowed_encodings": ["a"]},
             queues=[{"name": "b-only", "allowed_encodings": ["b"]}, {"name": "none", "allowed_encodings": []}])
    assert c.enqueue(payload=payload(b"1", "a"))[0] == 200
    assert rejection(c.enqueue("b-only", payload=payload(b"1", "a"))) == \
        {"reason": "encoding_not_allowed", "encoding": "a", "allowed": ["b"]}
    assert c.enqueue("b-only", payload=payload(b"1", "b"))[0] == 200
    assert rejection(c.enqueue("none", payload=payload(b"1", "a"))) == \
        {"reason": "encoding_not_allowed", "encoding": "a", "allowed": []}
    assert c.enqueue("none")[0] == 200                          # no payload, no check
    assert Core().enqueue(payload=payload(b"1", "anything/at-all"))[0] == 200


@pytest.mark.parametrize("custom,size", [
    ({"a": True}, 2), ({"a": 1}, 9), ({"a": 1.5}, 9), ({"é": "é"}, 4), ({"ab": "xyz", "c": False}, 7),
])
def test_custom_map_size_counts_key_and_value_bytes(custom, size):
    c = Core(limits={"max_custom_total_bytes": size})
    assert c.enqueue(custom=custom)[0] == 200
    c2 = Core(limits={"max_custom_total_bytes": size - 1})
    assert rejection(c2.enqueue(custom=custom)) == {"reason": "custom_map_too_large", "limit": size - 1, "actual": size}


def test_custom_entries_and_key_limits():
    c = Core(limits={"max_custom_entries": 2, "max_custom_key_bytes": 2})
    assert c.enqueue(custom={"ab": 1, "cd": 2})[0] == 200
    assert rejection(c.enqueue(custom={"a": 1, "b": 2, "c": 3})) == {"reason": "custom_entries_too_many", "limit": 2, "actual": 3}
    assert rejection(c.enqueue(custom={"a": 1, "éa": 2})) == {"reason": "custom_key_too_long", "key": "éa", "limit": 2, "actual": 3}
    assert c.enqueue(custom={})[0] == 200


def test_schedule_checks_use_the_queue_horizon():
    c = Core(queues=[{"name": "near", "max_schedule_horizon_ms": 10}])
    assert rejection(c.enqueue("near", delay_ms=11))["reason"] == "scheduled_too_far"
    assert c.enqueue("far", delay_ms=2_592_000_000)[0] == 200      # the 30-day default
    assert rejection(c.enqueue("far", delay_ms=2_592_000_001))["horizon_ms"] == 2_592_000_000


BAD_JOBS = [
    ("queue missing", {"queue": None}),
    ("queue not a string", {"queue": 5}),
    ("queue empty", {"queue": ""}),
    ("queue dot", {"queue": "."}),
    ("queue dotdot", {"queue": ".."}),
    ("queue slash", {"queue": "a/b"}),
    ("queue NUL", {"queue": "a\x00b"}),
    ("queue C0", {"queue": "a\x1fb"}),
    ("queue DEL", {"queue": "a\x7fb"}),
    ("queue C1", {"queue": "a\x85b"}),
    ("job_type missing", {"job_type": None}),
    ("job_type empty", {"job_type": ""}),
    ("job_type not a string", {"job_type": 7}),
    ("payload not an object", {"payload": "abc"}),
    ("payload without data", {"payload": {"encoding": "a"}}),
    ("data not a string", {"payload": {"data_b64": 123, "encoding": "a"}}),
    ("data not base64", {"payload": {"data_b64": "!!!!", "encoding": "a"}}),
    ("data empty", {"payload": {"data_b64": "", "encoding": "a"}}),
    ("encoding missing", {"payload": {"data_b64": b64(b"x")}}),
    ("encoding empty", {"payload": {"data_b64": b64(b"x"), "encoding": ""}}),
    ("key empty", {"idempotency_key": ""}),
    ("key not a string", {"idempotency_key": 5}),
    ("priority 10", {"priority": 10}),
    ("priority -1", {"priority": -1}),
    ("priority string", {"priority": "1"}),
    ("priority bool", {"priority": True}),
    ("priority float", {"priority": 1.0}),
    ("max_attempts 0", {"max_attempts": 0}),
    ("max_attempts string", {"max_attempts": "3"}),
    ("max_attempts beyond int64", {"max_attempts": 2**63}),
    ("custom not an object", {"custom": [1]}),
    ("custom empty key", {"custom": {"": 1}}),
    ("custom null value", {"custom": {"a": None}}),
    ("custom list value", {"custom": {"a": [1]}}),
    ("custom object value", {"custom": {"a": {}}}),
    ("scheduled not an int", {"scheduled_at_ms": "soon"}),
    ("scheduled float", {"scheduled_at_ms": 1.5}),
    ("delay negative", {"delay_ms": -1}),
    ("delay string", {"delay_ms": "5"}),
    ("schedule and delay", {"scheduled_at_ms": T0 + 10, "delay_ms": 10}),
    ("trace not an object", {"trace_context": "00-x"}),
    ("traceparent missing", {"trace_context": {}}),
    ("traceparent empty", {"trace_context": {"traceparent": ""}}),
    ("tracestate not a string", {"trace_context": {"traceparent": "t", "tracestate": 5}}),
    ("deadline not an int", {"deadline_at_ms": "x"}),
]


@pytest.mark.parametrize("name,change", BAD_JOBS, ids=[b[0] for b in BAD_JOBS])
def test_structural_problems_are_invalid_request(name, change):
    c = Core()
    job = {"queue": "q", "job_type": "t", **change}
    job = {k: v for k, v in job.items() if v is not None}
    r = rejection(c.enqueue_body(job))
    assert r["reason"] == "invalid_request" and isinstance(r["message"], str) and r["message"]
    assert set(r) == {"reason", "message"}
    status, body = c.batch([job, {"queue": "q", "job_type": "t"}])
    assert body["results"][0] == {"rejection": r} and body["results"][1]["deduplicated"] is False


def test_valid_edge_values_are_accepted():
    c = Core()
    for fields in ({"priority": 0}, {"priority": 9}, {"max_attempts": 1},
                   {"custom": {"s": "", "i": -(2**63), "f": -0.5, "b": False}},
                   {"trace_context": {"traceparent": "t", "tracestate": None}},
                   {"scheduled_at_ms": 0}, {"deadline_at_ms": 0}, {"delay_ms": 0},
                   {"queue": "ünïcode name with spaces"}, {"idempotency_key": " "}):
        assert c.enqueue_body({"queue": "q", "job_type": "t", **fields})[0] == 200, fields


def test_a_batch_element_that_is_not_an_object_is_a_per_job_rejection():
    c = Core()
    status, body = c.batch([["not", "an", "object"], {"queue": "q", "job_type": "t"}])
    assert status == 200 and body["results"][0]["rejection"]["reason"] == "invalid_request"
    status, body = c.atomic([None])
    assert status == 422 and body["error"]["errors"][0]["index"] == 0


# ============================================================================ request-level 400s

def _bad(result):
    e = err(result, 400, "invalid_argument")
    assert isinstance(e["message"], str) and e["message"]


@pytest.mark.parametrize("body", [None, [], "x", 5])
def test_single_enqueue_body_must_be_an_object(body):
    c = Core()
    _bad(c.enqueue_body(body))
    assert c.m.applied == 0


@pytest.mark.parametrize("send", ["batch", "atomic"])
def test_batch_request_level_errors(send):
    c = Core(limits={"max_enqueue_batch": 3})
    builder = C.enqueue_batch if send == "batch" else C.enqueue_atomic
    for body in (None, [], {"jobs": None}, {"jobs": "x"}, {"jobs": {}}, {"jobs": []},
                 {"jobs": [{"queue": "q", "job_type": "t"}] * 4}):
        _bad(c.run(lambda: builder(body, c.limits, c.now, c.new_id)))
    assert c.m.applied == 0
    assert c.run(lambda: builder({"jobs": [{"queue": "q", "job_type": "t"}] * 3}, c.limits, c.now, c.new_id))[0] == 200


RESERVE_BAD = [
    ("not an object", None),
    ("queues missing", {"lease_ms": 1}),
    ("queues empty", {"queues": [], "lease_ms": 1}),
    ("queues not a list", {"queues": "q", "lease_ms": 1}),
    ("too many queues", {"queues": ["a", "b", "c"], "lease_ms": 1}),
    ("queue name empty", {"queues": [""], "lease_ms": 1}),
    ("queue name dot", {"queues": ["."], "lease_ms": 1}),
    ("queue name slash", {"queues": ["a/b"], "lease_ms": 1}),
    ("queue name not a string", {"queues": [5], "lease_ms": 1}),
    ("queue name too long", {"queues": ["abcde"], "lease_ms": 1}),
    ("lease missing", {"queues": ["q"]}),
    ("lease zero", {"queues": ["q"], "lease_ms": 0}),
    ("lease negative", {"queues": ["q"], "lease_ms": -5}),
    ("lease string", {"queues": ["q"], "lease_ms": "5"}),
    ("lease bool", {"queues": ["q"], "lease_ms": True}),
    ("wait negative", {"queues": ["q"], "lease_ms": 1, "wait_ms": -1}),
    ("wait string", {"queues": ["q"], "lease_ms": 1, "wait_ms": "1"}),
    ("max_jobs zero", {"queues": ["q"], "lease_ms": 1, "max_jobs": 0}),
    ("max_jobs float", {"queues": ["q"], "lease_ms": 1, "max_jobs": 2.0}),
    ("worker_id empty", {"queues": ["q"], "lease_ms": 1, "worker_id": ""}),
    ("worker_id number", {"queues": ["q"], "lease_ms": 1, "worker_id": 5}),
]


@pytest.mark.parametrize("name,body", RESERVE_BAD, ids=[r[0] for r in RESERVE_BAD])
def test_reserve_request_level_errors(name, body):
    c = Core(limits={"max_reserve_queues": 2, "max_queue_name_bytes": 4})
    c.enqueue_id()
    _bad(c.reserve_body(body))
    assert c.counts()["ready"] == 1


def test_reserve_valid_request_and_clamps():
    lim = Limits.build(limits={"max_wait_timeout_ms": 1_000, "max_reserve_batch": 5})
    cmd, wait = C.reserve({"queues": ["q"], "lease_ms": 10, "worker_id": "w1"}, lim)
    assert wait == 0 and cmd[-1] == 1                       # defaults: no wait, one job
    cmd, wait = C.reserve({"queues": ["q"], "lease_ms": 10, "wait_ms": 50_000, "max_jobs": 99}, lim)
    assert wait == 1_000 and cmd[-1] == 5


def test_strict_reserve_on_undeclared_queues_is_409_listing_them_all():
    c = Core(limits={"strict_queues": True}, queues=[{"name": "known"}])
    e = err(c.reserve(["x", "known", "y"]), 409, "unknown_queues")
    assert e["queues"] == ["x", "y"]
    assert c.reserve(["known"]) == (200, {"jobs": []})
    # non-strict: undeclared queues are fine
    assert Core().reserve(["x"]) == (200, {"jobs": []})


BAD_IDS = [None, 5, "", JID[:-1], JID + "0", JID.replace("-", ""), "{" + JID[1:-1] + "}",
           JID[:8] + "0" + JID[9:], JID[:9] + "-" + JID[10:], JID[:-1] + "g", " " + JID[1:]]


@pytest.mark.parametrize("bad_id", BAD_IDS)
def test_non_canonical_job_ids_are_invalid_argument(bad_id):
    c = Core()
    _bad(c.ack(bad_id, 1))
    _bad(c.nack(bad_id, 1))
    _bad(c.extend(bad_id, 1, 10))
    _bad(c.cancel(bad_id))
    _bad(c.requeue([bad_id]))
    _bad(c.delete_dead([bad_id]))
    _bad(c.acks([(bad_id, 1)]))


def test_canonical_ids_match_case_insensitively():
    assert C.job_id_arg(JID.upper()) == JID
    assert C.canonical_uuid("ABCDEF01-2345-6789-ABCD-EF0123456789") == "abcdef01-2345-6789-abcd-ef0123456789"


@pytest.mark.parametrize("attempt", [None, 0, -1, "1", True, 1.5])
def test_bad_attempt_is_invalid_argument(attempt):
    c = Core()
    body = {} if attempt is None else {"attempt": attempt}
    _bad(c.run(lambda: C.ack(JID, body)))
    _bad(c.run(lambda: C.nack(JID, body)))
    _bad(c.run(lambda: C.extend(JID, {**body, "lease_ms": 10})))
    _bad(c.run(lambda: C.ack_batch({"acks": [{"job_id": JID, **body}]}, c.limits)))


@pytest.mark.parametrize("lease", [None, 0, -1, "10", 1.5])
def test_bad_extend_lease_is_invalid_argument(lease):
    c = Core()
    body = {"attempt": 1} if lease is None else {"attempt": 1, "lease_ms": lease}
    _bad(c.run(lambda: C.extend(JID, body)))


@pytest.mark.parametrize("body", [
    None, [], {"attempt": 1, "reason": 5}, {"attempt": 1, "retry": "later"},
    {"attempt": 1, "retry": {}}, {"attempt": 1, "retry": {"strategy": "later"}},
    {"attempt": 1, "retry": {"strategy": "delay"}}, {"attempt": 1, "retry": {"strategy": "delay", "delay_ms": -1}},
    {"attempt": 1, "retry": {"strategy": "delay", "delay_ms": "5"}},
])
def test_bad_nack_bodies_are_invalid_argument(body):
    _bad(Core().run(lambda: C.nack(JID, body)))


def test_nack_command_shapes():
    assert C.nack(JID, {"attempt": 2}) == ("nack", None, JID, 2, None, "default", None)
    assert C.nack(JID, {"attempt": 1, "retry": {"strategy": "dead_letter", "delay_ms": -5}})[5] == "dead_letter"
    assert C.nack(JID, {"attempt": 1, "retry": {"strategy": "delay", "delay_ms": 0}})[5:] == ("delay", 0)


@pytest.mark.parametrize("body", [None, {}, {"acks": []}, {"acks": "x"}, {"acks": [5]},
                                  {"acks": [{"job_id": JID, "attempt": 1}] * 3}])
def test_bad_ack_batches_are_invalid_argument(body):
    c = Core(limits={"max_reserve_batch": 2})
    _bad(c.run(lambda: C.ack_batch(body, c.limits)))


@pytest.mark.parametrize("body", [[], "x", {"max": 0}, {"max": -1}, {"max": "1"}, {"queue": ""}, {"queue": 5}])
def test_bad_drain_bodies_are_invalid_argument(body):
    c = Core()
    _bad(c.run(lambda: C.drain(body, c.limits)))


def test_drain_without_a_body_defaults_to_one_record_of_any_queue():
    assert C.drain(None, Limits.build()) == ("drain", None, None, 1, None)
    assert ops.reader(ops.DRAIN, "max_records")(C.drain({"max": 10**6}, Limits.build())) == 256


@pytest.mark.parametrize("body", [None, {}, {"ids": []}, {"ids": "x"}, {"ids": [JID] * 1001}])
def test_bad_id_lists_are_invalid_argument(body):
    c = Core()
    _bad(c.run(lambda: C.requeue(body)))
    _bad(c.run(lambda: C.delete_dead_letters(body)))


def test_pause_checks_the_name_and_strict_mode():
    c = Core()
    _bad(c.pause("a/b"))
    _bad(c.pause(""))
    s = Core(limits={"strict_queues": True}, queues=[{"name": "known"}])
    e = err(s.pause("unknown"), 404, "not_found")
    assert e["queue"] == "unknown"
    assert s.pause("known")[0] == 200


def test_api_error_result_shape():
    e = ApiError("unknown_queues", "nope", queues=["a"])
    assert e.result == (409, {"error": {"code": "unknown_queues", "message": "nope", "queues": ["a"]}})


# ============================================================================ configuration
