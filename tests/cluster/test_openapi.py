"""The OpenAPI document (node/api/openapi.py, docs/openapi.json, GET /v1/openapi.json) holds to the code.

Without a cluster:
* docs/openapi.json is exactly what `python -m raftq.node.api.openapi` prints;
* every route of the aiohttp app is described, and nothing else;
* the error codes, rejection reasons, dead-letter causes and session ops it lists are the ones
  the node's code produces (the codes from node/core/errors.py, reasons and causes found in node/);
* every schema is valid JSON Schema, every example fits its schema.

Against a live cluster with API keys (one per role):
* every node serves the document, to a viewer key and not without a key;
* the role each operation states is the one the node enforces: one role lower is 403, no key 401;
* every request example is accepted, and every required field, left out, is refused (400/422);
* schemathesis generates inputs from the document for every route (positive and negative) and
  finds no 5xx and no answer (status, content type, headers, body, error code) the document
  does not allow; RAFTQ_SCHEMA_EXAMPLES (default 20) sets the examples per route and mode;
* a Python client generated from the document by openapi-python-client (installed into a venv
  of its own, cached in the temp dir; skipped with the reason when it cannot be installed)
  finds the leader, enqueues, reserves and acks.
"""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from raftq.cluster.local import LocalCluster, http_json
from raftq.node.core import errors
from raftq.node.api import openapi
from raftq.node.core.limits import Limits

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:It is recommended to use web.AppKey")
DOC = openapi.document()
KEYS = {role: f"{role}-key-{uuid.uuid4().hex[:8]}" for role in ("viewer", "worker", "operator", "admin")}
ROLE_ORDER = ["viewer", "worker", "operator", "admin"]
OPERATIONS = [(path, method, op) for path, ops in DOC["paths"].items() for method, op in ops.items()]


# ------------------------------------------------------------------------------ helpers
def resolve(node):
    while isinstance(node, dict) and "$ref" in node:
        parts = node["$ref"].lstrip("#/").split("/")
        node = DOC
        for p in parts:
            node = node[p]
    return node


def validator(schema):
    import jsonschema_rs
    # $refs point into the document's components: validate against a root that holds them.
    return jsonschema_rs.Draft202012Validator({**schema, "components": DOC["components"]})


def body_schema(op):
    rb = op.get("requestBody")
    return None if rb is None else rb["content"]["application/json"]["schema"]


def example_of(op):
    schema = body_schema(op)
    return None if schema is None else resolve(schema).get("example")


def path_for(path: str) -> str:
    return path.replace("{id}", openapi.EXAMPLE_ID).replace("{name}", "emails")


def auth(role):
    return {"Authorization": f"Bearer {KEYS[role]}"} if role else {}


def check_answer(op, status: int, body, content_type: str = "application/json"):
    """The answer is one the document allows: a documented status, the content type, the schema,
    and for an error, a code listed for that status (and the status node/core/errors.py gives it)."""
    responses = op["responses"]
    assert str(status) in responses, f"{op['operationId']}: undocumented status {status}: {body!r}"
    resp = resolve(responses[str(status)])
    content = resp.get("content", {})
    media = next((m for m in content if content_type.startswith(m)), None)
    assert media is not None, f"{op['operationId']} {status}: content type {content_type} not in {list(content)}"
    schema = content[media]["schema"]
    if media == "application/json":
        errs = [e.message for e in validator(schema).iter_errors(body)]
        assert not errs, f"{op['operationId']} {status}: {errs[:3]} in {json.dumps(body)[:500]}"
    codes = resp.get("x-raftq-error-codes")
    if codes is not None:
        code = body["error"]["code"]
        assert code in codes, f"{op['operationId']} {status}: code {code} not in {codes}"
        assert errors.STATUS[code] == status


# ------------------------------------------------------------------------------ without a cluster
def test_checked_in_document_is_the_generated_one():
    assert (ROOT / "docs" / "openapi.json").read_bytes() == openapi.document_bytes(), (
        "docs/openapi.json is out of date: run `.venv/bin/python -m raftq.node.api.openapi > docs/openapi.json`")


def app_routes() -> set[tuple[str, str]]:
    from raftq.node.api.http import build_app
    from raftq.node.base.auth import Auth
    service = SimpleNamespace(limits=Limits.build(), settings=SimpleNamespace(api_keys=None),
                              leadership_lost_hooks=[], auth=Auth(None), config_hooks=[])
    app = build_app(service)
    out = set()
    for route in app.router.routes():
        path = route.resource.canonical
        if route.method in ("HEAD", "*"):       # HEAD comes with every GET; "*" is the catch-all
            continue
        out.add((route.method.lower(), path))
    return out


def test_every_route_of_the_app_is_described_and_no_other():
    described = {(m, p) for p, m, _ in OPERATIONS}
    routes = app_routes()
    assert routes - described == set(), "routes missing from node/api/openapi.py"
    assert described - routes == set(), "node/api/openapi.py describes routes the app does not have"


def test_every_route_a_follower_may_redirect_says_so():
    """The routes a follower may answer 307 (node/api/http.py's leader routes and the session's
    upgrade, with `Raftq-Redirect: 1` or `[api] followers = "redirect"`) take the Raftq-Redirect
    header and document the 307 with Location; the others do neither."""
    from raftq.node.api import http
    may = ({("post", p) for p, _, _ in http.LEADER_POST} | {(m.lower(), p) for m, p, _, _ in http.OPTIONAL_BODY}
           | {("put", p) for p, _, _ in http.LEADER_PUT} | {("get", p) for p, _, _ in http.LEADER_GET}
           | {("get", "/v1/session")})
    assert may <= {(m, p) for p, m, _ in OPERATIONS}
    for path, method, op in OPERATIONS:
        headers = [resolve(p)["name"] for p in op.get("parameters", []) if resolve(p)["in"] == "header"]
        redirect = resolve(op["responses"]["307"]) if "307" in op["responses"] else None
        if (method, path) in may:
            assert "Raftq-Redirect" in headers, (method, path)
            assert redirect is not None and redirect["headers"]["Location"]["required"], (method, path)
            assert "Leader-Url" in redirect["headers"] and "not_leader" in redirect["x-raftq-error-codes"]
        else:
            assert "Raftq-Redirect" not in headers and redirect is None, (method, path)
    param = DOC["components"]["parameters"]["RaftqRedirect"]
    assert param["in"] == "header" and not param["required"] and param["schema"] == {"type": "string"}


def test_error_codes_reasons_and_causes_are_the_codes():
    assert resolve({"$ref": "#/components/schemas/ErrorCode"})["enum"] == list(errors.STATUS)
    source = "\n".join(p.read_text() for p in (ROOT / "node").rglob("*.py") if p.name != "openapi.py")
    reasons = set(re.findall(r'"reason": "([a-z_]+)"', source))
    assert reasons == set(openapi.REJECTION_REASONS)
    # self._dead_letter(job, q, "cause", ...) or dead_letter(m, job, q, "cause", ...)
    causes = set(re.findall(r'(?<![A-Za-z])_?dead_letter\([^()]*?, "([a-z_]+)"', source))
    assert causes and causes == set(openapi.DEAD_LETTER_CAUSES)
    for code, status in errors.STATUS.items():
        assert code in openapi.CODE_MEANINGS, code


def test_session_ops_and_roles_are_the_sessions():
    from raftq.node.api.session import FAST_OPS, OP_ROLES, READ_OPS
    from raftq.node.base.settings import API_ROLES
    ops = DOC["paths"]["/v1/session"]["get"]["x-raftq-session-ops"]
    assert set(ops) == FAST_OPS | {"reserve"} | set(READ_OPS) == set(openapi.SESSION_HTTP)
    for name, spec in ops.items():
        method, path = openapi.SESSION_HTTP[name]
        assert spec["role"] == API_ROLES[OP_ROLES.get(name, 0)]
        assert DOC["paths"][path][method]["x-raftq-role"] == spec["role"], name   # as over HTTP


def test_schemas_are_valid_and_examples_fit():
    import jsonschema_rs
    for name, schema in DOC["components"]["schemas"].items():
        jsonschema_rs.meta.validate({k: v for k, v in schema.items() if k != "example"})
        if "example" in schema:
            errs = [e.message for e in validator(schema).iter_errors(schema["example"])]
            assert not errs, (name, errs)
    assert DOC["openapi"].startswith("3.1")


# ------------------------------------------------------------------------------ a live cluster
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("openapi"), durability="memory",
                      limits={"max_wait_timeout_ms": 200},             # generated long polls stay short
                      storage={"dead_letter_retention_ms": 600_000},
                      api_keys=[{"name": role, "key": key, "role": role} for role, key in KEYS.items()]).launch() as c:
        yield c


def leader_url(c) -> str:
    return c.urls[c.wait_leader(20)]


def call(c, method, path, body=None, role="admin", url=None, headers=None):
    url = url or leader_url(c)
    return http_json(method.upper(), url + path, body, timeout=10, headers={**auth(role), **(headers or {})})


def test_served_document_is_the_checked_in_one(cluster):
    want = json.loads((ROOT / "docs" / "openapi.json").read_text())
    for url in cluster.urls:
        assert call(cluster, "get", "/v1/openapi.json", role="viewer", url=url) == (200, want)
        status, body = call(cluster, "get", "/v1/openapi.json", role=None, url=url)
        assert status == 401 and body["error"]["code"] == "unauthenticated"


def example_for(cluster, op):
    """The operation's example as a request to this cluster: a configuration change is made
    against the version in force and is the cluster's own configuration (changing nothing)."""
    body = example_of(op)
    if op["operationId"] == "put_config":
        status, view = call(cluster, "get", "/v1/config", role="viewer")
        body = {"config": view["config"], "expect_version": view["version"]}
    if op["operationId"] == "add_member":               # a member already: 200, changing nothing
        body = cluster.member(0)
    if op["operationId"] == "add_key":                  # a name and a key not in use yet
        import hashlib
        body = {**body, "name": f"ci-{uuid.uuid4().hex[:8]}", "key_sha256": hashlib.sha256(uuid.uuid4().bytes).hexdigest()}
    return body


@pytest.mark.parametrize("path,method,op", OPERATIONS, ids=[f"{m.upper()} {p}" for p, m, _ in OPERATIONS])
def test_stated_role_is_enforced(cluster, path, method, op):
    role = op["x-raftq-role"]
    follower = cluster.urls[(cluster.wait_leader(20) + 1) % cluster.n]
    body = example_of(op)
    if op["operationId"] == "put_config":
        body = {**body, "expect_version": 10**9}          # refused as stale if it gets that far
    if op["operationId"] == "add_member":
        body = cluster.member(0)                        # a member already: changes nothing
    if role is None:
        assert op["security"] == []
        status, _ = call(cluster, method, path_for(path), body, role=None, url=follower)
        assert status not in (401, 403)
        return
    assert op["security"] == [{"bearer": []}]
    # Checked on every node before any redirect: ask a follower.
    status, out = call(cluster, method, path_for(path), body, role=None, url=follower)
    assert status == 401 and out["error"]["code"] == "unauthenticated"
    rank = ROLE_ORDER.index(role)
    if rank > 0:
        status, out = call(cluster, method, path_for(path), body, role=ROLE_ORDER[rank - 1], url=follower)
        assert status == 403 and out["error"]["code"] == "permission_denied", out
        assert out["error"]["required_role"] == role
    status, out = call(cluster, method, path_for(path), body, role=role)
    assert status not in (401, 403), out


BODY_OPS = [(p, m, op) for p, m, op in OPERATIONS if example_of(op) is not None]


@pytest.mark.parametrize("path,method,op", BODY_OPS, ids=[f"{m.upper()} {p}" for p, m, _ in BODY_OPS])
def test_example_is_accepted(cluster, path, method, op):
    status, out = call(cluster, method, path_for(path), example_for(cluster, op))
    assert status < 500
    check_answer(op, status, out)
    if op["operationId"] not in ("ack", "nack", "extend", "release"):      # these need a job in flight
        assert status == 200, out


def without_each_required(schema, value, where=""):
    """(where, value with one required field removed) for every required field of every object
    the example holds, nested ones included."""
    schema = resolve(schema)
    if isinstance(value, dict) and schema.get("type") == "object":
        for field in schema.get("required", []):
            if field in value:
                yield f"{where}.{field}", {k: v for k, v in value.items() if k != field}
        for field, sub in schema.get("properties", {}).items():
            if field in value:
                for w, v in without_each_required(sub, value[field], f"{where}.{field}"):
                    yield w, {**value, field: v}
    elif isinstance(value, list) and "items" in schema and value:
        for w, v in without_each_required(schema["items"], value[0], f"{where}[0]"):
            yield w, [v] + value[1:]


REQUIRED_CASES = [(p, m, op, w, b) for p, m, op in BODY_OPS
                  for w, b in without_each_required(body_schema(op), copy.deepcopy(example_of(op)))]


@pytest.mark.parametrize("path,method,op,where,body", REQUIRED_CASES,
                         ids=[f"{m.upper()} {p} without {w}" for p, m, _, w, _ in REQUIRED_CASES])
def test_missing_required_field_is_refused(cluster, path, method, op, where, body):
    status, out = call(cluster, method, path_for(path), body)
    check_answer(op, status, out)
    if op["operationId"] == "enqueue_batch" and where.startswith(".jobs[0]."):
        # Best effort: the job is refused in its result, the others are enqueued.
        assert status == 200 and out["results"][0]["rejection"]["reason"] == "invalid_request", out
        return
    assert status in (400, 422), (status, out)


def test_request_id_replays_only_its_own_route(cluster):
    """A Request-Id replays the stored answer of the same route and request only: enqueue,
    batch and atomic enqueue (one op code in the state machine) and pause and resume are told
    apart by the route the record keeps; another body is refused too, and changes nothing."""
    rid = "replay-" + uuid.uuid4().hex
    headers = {"Request-Id": rid}
    status, first = call(cluster, "post", "/v1/jobs", {"queue": "replay", "job_type": "t"}, headers=headers)
    assert status == 200
    status, out = call(cluster, "post", "/v1/jobs/batch", {"jobs": [{"queue": "replay", "job_type": "t"}]},
                       headers=headers)
    check_answer(DOC["paths"]["/v1/jobs/batch"]["post"], status, out)
    assert status == 400 and out["error"]["code"] == "invalid_argument" and "another operation" in out["error"]["message"]
    status, out = call(cluster, "post", "/v1/jobs", {"queue": "replay", "job_type": "other"}, headers=headers)
    assert status == 400 and "another body" in out["error"]["message"], out
    assert call(cluster, "post", "/v1/jobs", {"queue": "replay", "job_type": "t"}, headers=headers) == (200, first)
    status, out = call(cluster, "get", "/v1/queues/replay")
    assert status == 200 and out["ready"] == 1, out
    prid = {"Request-Id": "pause-" + uuid.uuid4().hex}
    assert call(cluster, "post", "/v1/queues/replay/pause", {}, headers=prid)[0] == 200
    status, out = call(cluster, "post", "/v1/queues/replay/resume", {}, headers=prid)
    assert status == 400 and "another operation (pause)" in out["error"]["message"], out
    assert call(cluster, "get", "/v1/queues/replay")[1]["paused"] is True


# ------------------------------------------------------------------------------ schemathesis
EXAMPLES = int(os.environ.get("RAFTQ_SCHEMA_EXAMPLES", "20"))
# Everything but the WebSocket upgrade (described, not callable over plain HTTP), and the two
# operations that change what the fuzzing itself runs under: the configuration (a generated
# valid one with the right expect_version would change the limits under the other routes) and
# key removal (a generated name could be a role's key). test_config_replicated.py covers them.
# Membership changes likewise (a generated member would be waited for; a generated id could be a
# member's): test_members.py covers them.
FUZZ_OPS = [(p, m, op) for p, m, op in OPERATIONS
            if op["operationId"] not in ("session", "put_config", "remove_key", "add_member", "remove_member")]


def _floats_for_integers(value) -> bool:
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, dict):
        return any(_floats_for_integers(v) for v in value.values())
    if isinstance(value, list):
        return any(_floats_for_integers(v) for v in value)
    return False


def explained_refusal(case, body):
    """A request the document admits and the node refuses with 400: only where the document
    cannot say what the node checks. JSON Schema's "integer" admits 2.0, which the node refuses
    as a wrong type (the document says so in words); a paging cursor must be one the server
    returned; a string longer than a `max_*_bytes` limit of the config (written in the
    descriptions, not as maxima: the config sets them). Anything else is the document being
    looser than the validation."""
    message = (body or {}).get("error", {}).get("message", "")
    if "cursor is not one this server returned" in message:
        return
    if (body or {}).get("error", {}).get("field") and re.search(r"is \d+ bytes, more than max_\w+_bytes", message):
        return          # a length limit of the config (described in words, not encoded as a maximum)
    body_sent = case.body if isinstance(case.body, (dict, list)) else None
    if _floats_for_integers(body_sent) and "integer" in message:
        return
    field = (body or {}).get("error", {}).get("field")
    if case.path == "/v1/batches" and (field or "").startswith("callbacks.") and "job refused" in message:
        return          # a callback job's enqueue checks, in words
    if case.path.startswith("/v1/schedules/") and (
            field in ("cron", "time_zone", "end_at_ms")      # cron syntax, the zone names, the order of two times
            or (field == "job" and "refused as a job would be" in message)):   # an enqueue's checks, in words
        return
    raise AssertionError(f"the document admits this request, the node refused it: {message} "
                         f"(body {json.dumps(body_sent, default=str)[:300]}, query {case.query}, "
                         f"path {case.path_parameters})")


def not_a_bug(ctx, response, case):
    """No 5xx but a documented 503 (no_leader, unavailable: a busy machine can time a commit out,
    and the contract says to retry); check_answer holds its code to the document."""
    if response.status_code >= 500 and response.status_code != 503:
        raise AssertionError(f"server error {response.status_code}: {response.text[:500]}")


def batch_refusal(ctx, response, case):
    """negative_data_rejection for POST /v1/jobs/batch: a 4xx, or a 200 refusing some job."""
    if 400 <= response.status_code < 500:
        return None
    if response.status_code == 200 and any("rejection" in r for r in response.json()["results"]):
        return None
    raise AssertionError(f"invalid batch accepted whole: {response.status_code} {response.text[:300]}")


@pytest.fixture(scope="module")
def st_schema():
    schemathesis = pytest.importorskip("schemathesis")
    schema = schemathesis.openapi.from_dict(copy.deepcopy(DOC))
    # Authorization is added to every call (test_stated_role_is_enforced covers keys and roles);
    # unknown query parameters are ignored by design, as unknown body fields are: not "invalid".
    schema.config.generation.update(with_security_parameters=False, allow_extra_parameters=False)
    return schema


@pytest.mark.parametrize("mode", ["positive", "negative"])
@pytest.mark.parametrize("path,method,op", FUZZ_OPS, ids=[f"{m.upper()} {p}" for p, m, _ in FUZZ_OPS])
def test_schemathesis(cluster, st_schema, path, method, op, mode):
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.specs.openapi import checks as oc

    operation = st_schema[path][method.upper()]
    base_url = leader_url(cluster)
    checks = [not_a_bug, oc.status_code_conformance, oc.content_type_conformance,
              oc.response_headers_conformance, oc.response_schema_conformance]
    if mode == "negative":
        # A best-effort batch answers a job that does not fit the document with a rejection in
        # its 200 (by design): refused there, rather than with a 4xx.
        checks.append(batch_refusal if op["operationId"] == "enqueue_batch" else oc.negative_data_rejection)
    strategy = operation.as_strategy(GenerationMode(mode))
    seen = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        rid = (case.headers or {}).get("Request-Id")
        if isinstance(rid, str) and re.fullmatch(openapi.REQUEST_ID_PATTERN.strip("^$"), rid):
            # A valid generated id made distinct per case: one repeated on another route of the
            # same operation name replays that route's answer (see
            # test_request_id_replays_only_its_own_route). An invalid one is left as it is.
            case.headers["Request-Id"] = f"{rid[:90]}-{uuid.uuid4().hex}"
        response = case.call(base_url=base_url, headers=auth("admin"), timeout=15, allow_redirects=False)
        seen.append(response.status_code)
        case.validate_response(response, checks=checks)
        try:
            body = response.json()
        except ValueError:
            body = None
        ctype = {k.lower(): v for k, v in response.headers.items()}.get("content-type", "")
        if isinstance(ctype, list):
            ctype = ctype[0]
        if response.status_code != 101:
            check_answer(op, response.status_code, body, ctype)
        if mode == "positive" and response.status_code == 400:
            explained_refusal(case, body)

    try:
        run()
    except Unsatisfiable:
        if mode == "negative" and not seen:
            pytest.skip("the document admits every input of this route: there is no invalid one to generate")
        raise
    print(f"{method.upper()} {path} {mode}: {len(seen)} requests, statuses {sorted(set(seen))}")
    assert seen and not [s for s in seen if s >= 500 and s != 503]


# ------------------------------------------------------------------------------ a generated client
GENERATOR = "openapi-python-client==0.29.1"


def generator_venv() -> Path:
    """A venv with the generator, made once per machine (in the temp dir), since it is not a
    dependency of raftq; pytest.skip with the reason when it cannot be installed."""
    venv = Path(tempfile.gettempdir()) / "raftq-openapi-python-client-0.29.1"
    done = venv / ".installed"
    if done.exists():
        return venv
    import shutil
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", GENERATOR], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        pytest.skip(f"cannot install {GENERATOR}: {(r.stderr or r.stdout).strip()[-500:]}")
    done.write_text(GENERATOR + "\n")
    return venv


def test_generated_client_enqueues_and_reserves(cluster, tmp_path):
    venv = generator_venv()
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}"}
    r = subprocess.run([str(venv / "bin" / "openapi-python-client"), "generate", "--path",
                        str(ROOT / "docs" / "openapi.json"), "--meta", "none", "--output-path",
                        str(tmp_path / "raftq_api")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Warning" not in r.stdout + r.stderr, r.stdout + r.stderr
    follower = cluster.urls[(cluster.wait_leader(20) + 1) % cluster.n]
    script = textwrap.dedent(f"""
        import base64
        from raftq_api import AuthenticatedClient
        from raftq_api.api.cluster import cluster
        from raftq_api.api.jobs import enqueue, reserve, ack
        from raftq_api.models import EnqueueRequest, Payload, ReserveRequest, AckRequest

        # Ask any node where the leader is. (Following a follower's 307 would work without API
        # keys; with keys, HTTP clients drop the Authorization header on a redirect to another
        # origin, so a client with a key talks to the leader itself.)
        view = cluster.sync(client=AuthenticatedClient(base_url={follower!r}, token={KEYS['viewer']!r}))
        client = AuthenticatedClient(base_url=view.leader.url, token={KEYS['worker']!r})
        data = base64.b64encode(b'{{"user": 42}}').decode()
        made = enqueue.sync(client=client, body=EnqueueRequest(
            queue="generated", job_type="welcome", priority=5,
            payload=Payload(data_b64=data, encoding="application/json")))
        assert hasattr(made, "job_id"), made
        print("enqueued", made.job_id, made.deduplicated)
        got = reserve.sync(client=client, body=ReserveRequest(queues=["generated"], lease_ms=30000, wait_ms=100))
        job = got.jobs[0]
        assert str(job.id) == str(made.job_id), (job.id, made.job_id)
        assert base64.b64decode(job.payload.data_b64) == b'{{"user": 42}}'
        print("reserved", job.id, "attempt", job.attempt, "lease until", job.lease_expires_at_ms)
        done = ack.sync(id=job.id, client=client, body=AckRequest(attempt=job.attempt))
        print("acked", done.job_id)
    """)
    r = subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "acked" in r.stdout
    status, queue = call(cluster, "get", "/v1/queues/generated", role="viewer")
    assert status == 200 and queue["acked"] == 1 and queue["in_flight"] == 0
