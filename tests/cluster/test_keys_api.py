"""The visibility of keys (docs/semantics.md "Keys") over the API, the client and the CLI, against
one real cluster shared by the whole file.

* `key` on every job rendering (reserve, inspection, listings, dead-letter records), absent on a
  job without one; taken from the custom field the queue names in `key_field`;
* the three queue stats `keys`, `keys_at_limit`, `ready_held_by_keys` and their gauges in
  /metrics (labelled by queue only);
* GET /v1/queues/{name}/keys: most ready first then by key, the limits in force per key, paging
  with the opaque cursor (keys with spaces, `&`, `/` and non-ASCII included), 400 for a bad
  `limit` or `cursor`, 404 for a queue that neither exists nor is declared;
* a bad key refused (too long, a control character, not a string, empty);
* Client.queue_keys and `key=` on the client's enqueue calls; `raftq queues keys` and
  `raftq enqueue --job-key`.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

from raftq.cluster.client import DeadLetterRecord, NotFound, SyncClient, job_request
from raftq.cluster.local import LocalCluster
from tests.conftest import Api, poll

ROOT = Path(__file__).resolve().parents[2]
LONG = 600_000          # a rate window no test outlives: nothing leaves it meanwhile
# Each test its own declared queue: their keys and counts do not mix.
QUEUES = [
    {"name": "k-render", "key_field": "tenant"},
    {"name": "k-stats", "key_concurrency": 1},
    {"name": "k-order", "key_concurrency": 1, "key_weights": {"b": 4}},
    {"name": "k-limits", "key_rate": {"count": 2, "period_ms": LONG}, "key_weights": {"vip": 3},
     "key_limits": {"vip": {"concurrency": 5, "rate": {"count": 10, "period_ms": LONG}}}},
    {"name": "k-field", "key_field": "tenant"},
    {"name": "k-bad"},
    {"name": "k-empty", "key_concurrency": 1},
    {"name": "k-client", "key_concurrency": 1},
    {"name": "k-cli", "key_concurrency": 1},
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("keys"), durability="memory",
                     storage={"dead_letter_retention_ms": 3_600_000}, queues=QUEUES).launch()
    yield c
    c.close()


@pytest.fixture(scope="module")
def api(cluster):
    return Api(cluster)


def enqueue(api, queue, key=None, **fields):
    body = {"queue": queue, "job_type": "t", **fields}
    if key is not None:
        body["key"] = key
    status, out = api.post("/v1/jobs", body)
    assert status == 200, out
    return out["job_id"]


def reserve(api, queue, n=100):
    status, out = api.reserve([queue], lease_ms=300_000, max_jobs=n)
    assert status == 200, out
    return out["jobs"]


def key_counts(api, queue) -> tuple:
    status, q = api.get(f"/v1/queues/{queue}")
    assert status == 200, q
    return q["keys"], q["keys_at_limit"], q["ready_held_by_keys"]


def all_keys(api, queue, limit) -> list[list[dict]]:
    """Every page of the queue's keys, `limit` a page."""
    pages, cursor = [], None
    while True:
        status, out = api.get(f"/v1/queues/{queue}/keys?limit={limit}" + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200, out
        pages.append(out["keys"])
        cursor = out["next_cursor"]
        if cursor is None:
            return pages
        assert re.fullmatch(r"[A-Za-z0-9_-]+", cursor), cursor       # safe in a query as it is


# ---------------------------------------------------------------------------- the job's key
def test_key_is_shown_on_every_rendering_of_a_keyed_job_and_absent_without(api):
    q = "k-render"
    keyed = enqueue(api, q, key="acme")
    plain = enqueue(api, q)
    ready = api.get(f"/v1/queues/{q}/jobs?state=ready")[1]["jobs"]
    assert {j["id"]: j.get("key", "-") for j in ready} == {keyed: "acme", plain: "-"}
    assert api.get(f"/v1/jobs/{keyed}")[1]["key"] == "acme"
    assert "key" not in api.get(f"/v1/jobs/{plain}")[1]
    jobs = {j["id"]: j for j in reserve(api, q)}
    assert jobs[keyed]["key"] == "acme" and "key" not in jobs[plain]
    flying = api.get(f"/v1/queues/{q}/jobs?state=in_flight")[1]["jobs"]
    assert {j["id"]: j.get("key") for j in flying} == {keyed: "acme", plain: None}
    status, out = api.post(f"/v1/jobs/{keyed}/nack", {"attempt": 1, "retry": {"strategy": "dead_letter"}})
    assert status == 200 and out["dead_lettered"], out
    [record] = api.get(f"/v1/dead-letters?queue={q}")[1]["records"]
    assert record["job"]["id"] == keyed and record["job"]["key"] == "acme"


def test_key_from_the_queues_key_field_and_the_request_key_wins(api):
    q = "k-field"
    from_field = enqueue(api, q, custom={"tenant": "globex", "region": "eu"})
    given = enqueue(api, q, key="initech", custom={"tenant": "globex"})
    without = enqueue(api, q, custom={"region": "eu"})
    assert api.get(f"/v1/jobs/{from_field}")[1]["key"] == "globex"
    assert api.get(f"/v1/jobs/{given}")[1]["key"] == "initech"
    assert "key" not in api.get(f"/v1/jobs/{without}")[1]
    rows = all_keys(api, q, 10)[0]
    assert [(r["key"], r["ready"]) for r in rows] == [("globex", 1), ("initech", 1)]
    # The field's value must be a usable key, as `key` must.
    status, out = api.post("/v1/jobs", {"queue": q, "job_type": "t", "custom": {"tenant": 42}})
    assert status == 422 and out["error"]["rejection"]["reason"] == "invalid_request", out
    assert "custom['tenant']" in out["error"]["rejection"]["message"]
    # A queue without key_field leaves the same custom field alone.
    other = enqueue(api, "k-bad", custom={"tenant": "globex"})
    assert "key" not in api.get(f"/v1/jobs/{other}")[1]


@pytest.mark.parametrize("key,why", [
    ("k" * 257, "max_key_bytes"), ("é" * 129, "max_key_bytes"),           # 258 UTF-8 bytes
    ("a\x07b", "control characters"), ("a\x85b", "control characters"), ("tab\there", "control characters"),
    (5, "non-empty string"), (["a"], "non-empty string"), ("", "non-empty string"),
])
def test_a_bad_key_is_refused_and_enqueues_nothing(api, key, why):
    q = "k-bad"
    before = api.get(f"/v1/queues/{q}")[1]["enqueued"]
    status, out = api.post("/v1/jobs", {"queue": q, "job_type": "t", "key": key})
    assert status == 422 and out["error"]["code"] == "rejected", out
    rejection = out["error"]["rejection"]
    assert rejection["reason"] == "invalid_request" and rejection["message"].startswith("key ") \
        and why in rejection["message"], rejection
    status, out = api.post("/v1/jobs/batch", {"jobs": [{"queue": q, "job_type": "t", "key": key},
                                                       {"queue": q, "job_type": "t", "key": "fine"}]})
    assert status == 200 and out["results"][0]["rejection"]["reason"] == "invalid_request", out
    assert "job_id" in out["results"][1]
    assert api.get(f"/v1/queues/{q}")[1]["enqueued"] == before + 1


def test_a_key_of_exactly_max_key_bytes_is_taken(api):
    key = "é" * 128                     # 256 UTF-8 bytes
    jid = enqueue(api, "k-bad", key=key)
    assert api.get(f"/v1/jobs/{jid}")[1]["key"] == key


# ---------------------------------------------------------------------------- queue stats, metrics
def metrics_text(cluster) -> str:
    url = cluster.urls[cluster.wait_leader(20)] + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def gauge(text: str, name: str, queue: str):
    m = re.search(rf'^{name}\{{node="[^"]*",queue="{re.escape(queue)}"\}} (\S+)$', text, re.M)
    return None if m is None else float(m.group(1))


def test_queue_stats_count_keys_held_keys_and_their_held_ready_jobs(cluster, api):
    q = "k-stats"
    assert key_counts(api, q) == (0, 0, 0)
    for key in ("a", "a", "a", "b"):
        enqueue(api, q, key=key)
    enqueue(api, q)                                     # no key: no limit
    jobs = reserve(api, q)
    # key_concurrency 1: one job of each key, and the job without a key.
    assert sorted(j.get("key", "-") for j in jobs) == ["-", "a", "b"]
    assert key_counts(api, q) == (2, 2, 2)              # a: 2 ready held back; b: at its limit with none
    status, queues = api.get("/v1/queues")
    listed = {x["name"]: x for x in queues["queues"]}
    assert (listed[q]["keys"], listed[q]["keys_at_limit"], listed[q]["ready_held_by_keys"]) == (2, 2, 2)
    assert all({"keys", "keys_at_limit", "ready_held_by_keys"} <= set(x) for x in queues["queues"])
    assert (listed["k-empty"]["keys"], listed["k-empty"]["ready_held_by_keys"]) == (0, 0)
    text = poll(lambda: (t := metrics_text(cluster)) and gauge(t, "raftq_queue_ready_held_by_keys", q) == 2 and t,
                what="the keys gauges")
    assert gauge(text, "raftq_queue_keys", q) == 2 and gauge(text, "raftq_queue_keys_at_limit", q) == 2
    assert gauge(text, "raftq_queue_keys", "k-empty") == 0
    for name in ("raftq_queue_keys", "raftq_queue_keys_at_limit", "raftq_queue_ready_held_by_keys"):
        assert f"# TYPE {name} gauge" in text
        samples = [line for line in text.splitlines() if line.startswith(name + "{")]
        assert samples and all(re.fullmatch(rf'{name}\{{node="[^"]*",queue="[^"]*"\}} \S+', s) for s in samples)
    # a's job acked: its slot frees in the same apply, its ready jobs are served again.
    [a] = [j for j in jobs if j.get("key") == "a"]
    assert api.post(f"/v1/jobs/{a['id']}/ack", {"attempt": a["attempt"]})[0] == 200
    assert key_counts(api, q) == (2, 1, 0)
    [again] = reserve(api, q)
    assert again["key"] == "a"
    assert key_counts(api, q) == (2, 2, 1)
    # Every job of a key finished: the key goes.
    [b] = [j for j in jobs if j.get("key") == "b"]
    assert api.post(f"/v1/jobs/{b['id']}/ack", {"attempt": b["attempt"]})[0] == 200
    assert key_counts(api, q) == (1, 1, 1)


# ---------------------------------------------------------------------------- GET /v1/queues/{name}/keys
ODD = "x y&z/é?#%"          # a key that a cursor or a URL would break if they were not made safe


def test_keys_route_orders_by_ready_then_key_and_pages_with_its_cursor(api):
    q = "k-order"
    for key, n in (("b", 3), ("a", 3), ("c", 1), ("d", 2), (ODD, 2), ("e", 1)):
        for _ in range(n):
            enqueue(api, q, key=key)
    want = [("a", 3), ("b", 3), ("d", 2), (ODD, 2), ("c", 1), ("e", 1)]
    status, whole = api.get(f"/v1/queues/{q}/keys")
    assert status == 200 and whole["next_cursor"] is None
    assert [(r["key"], r["ready"]) for r in whole["keys"]] == want
    for r in whole["keys"]:
        assert r == {"key": r["key"], "ready": r["ready"], "in_flight": 0, "held": None, "concurrency": 1,
                     "weight": 4 if r["key"] == "b" else 1, "rate": None, "in_window": 0}
    for size in (1, 2, 4):
        pages = all_keys(api, q, size)
        assert [len(p) for p in pages[:-1]] == [size] * (len(pages) - 1) and 1 <= len(pages[-1]) <= size
        assert [(r["key"], r["ready"]) for p in pages for r in p] == want, size
    # A served key has one job fewer ready and one in flight, holds at its limit, and takes the
    # place its new ready count gives it.
    [job] = reserve(api, q, n=1)
    rows = api.get(f"/v1/queues/{q}/keys")[1]["keys"]
    served = next(r for r in rows if r["key"] == job["key"])
    assert (served["ready"], served["in_flight"], served["held"]) == (dict(want)[job["key"]] - 1, 1, "concurrency")
    assert [(r["key"], r["ready"]) for r in rows] == sorted(
        ((k, n - (k == job["key"])) for k, n in want), key=lambda x: (-x[1], x[0]))


def test_keys_route_shows_the_limits_in_force_per_key(api):
    q = "k-limits"
    for key in ("std", "std", "std", "vip"):
        enqueue(api, q, key=key)
    jobs = reserve(api, q)
    # std's rate admits 2 in its window; vip has its own (10) and weighs 3.
    assert sorted(j["key"] for j in jobs) == ["std", "std", "vip"]
    rows = {r["key"]: r for r in api.get(f"/v1/queues/{q}/keys")[1]["keys"]}
    assert rows["std"] == {"key": "std", "ready": 1, "in_flight": 2, "held": "rate", "concurrency": None,
                           "weight": 1, "rate": {"count": 2, "period_ms": LONG}, "in_window": 2}
    assert rows["vip"] == {"key": "vip", "ready": 0, "in_flight": 1, "held": None, "concurrency": 5,
                           "weight": 3, "rate": {"count": 10, "period_ms": LONG}, "in_window": 1}
    assert [r["key"] for r in api.get(f"/v1/queues/{q}/keys")[1]["keys"]] == ["std", "vip"]
    assert key_counts(api, q) == (2, 1, 1)
    limits = api.get(f"/v1/queues/{q}")[1]["limits"]
    assert limits["key_rate"] == {"count": 2, "period_ms": LONG} and limits["key_weights"] == {"vip": 3}
    assert limits["key_limits"] == {"vip": {"concurrency": 5, "rate": {"count": 10, "period_ms": LONG}}}
    assert limits["key_concurrency"] is None and limits["key_field"] is None and limits["rate"] is None


def test_keys_route_refuses_a_bad_limit_or_cursor_and_an_unknown_queue(api):
    q = "k-empty"
    for bad in ("0", "101", "-1", "x", "1.5", ""):
        status, out = api.get(f"/v1/queues/{q}/keys?limit={bad}")
        assert status == 400 and out["error"]["code"] == "invalid_argument", (bad, out)
        assert out["error"]["message"] == "limit must be an integer 1..100"
    forged = [base64.urlsafe_b64encode(json.dumps(v).encode()).decode().rstrip("=")
              for v in ([-1, "a"], [1], ["1", "a"], [True, "a"], {"ready": 1}, [1, 2], "a")]
    for bad in ["!!", "é", "abc", "W10", *forged]:
        status, out = api.get(f"/v1/queues/{q}/keys?cursor={quote(bad, safe='')}")
        assert status == 400 and out["error"]["message"] == "cursor is not one this server returned", (bad, out)
    name = "nowhere-" + uuid.uuid4().hex[:6]
    status, out = api.get(f"/v1/queues/{name}/keys")
    assert status == 404 and out["error"] == {"code": "not_found", "queue": name,
                                              "message": f"queue {name!r} neither exists nor is declared"}
    # Declared, no keyed job: an empty page. Undeclared but with keyed jobs: its keys.
    assert api.get("/v1/queues/k-empty/keys") == (200, {"keys": [], "next_cursor": None})
    loose = "loose-" + uuid.uuid4().hex[:6]
    enqueue(api, loose, key="k1")
    status, out = api.get(f"/v1/queues/{loose}/keys")
    assert status == 200 and [r["key"] for r in out["keys"]] == ["k1"] and out["keys"][0]["concurrency"] is None


# ---------------------------------------------------------------------------- the client
def test_client_queue_keys_and_key_on_its_enqueue_calls(cluster):
    q = "k-client"
    with SyncClient(cluster.urls, transport="http", timeout=15) as c:
        one = c.enqueue(q, "t", b"x", key="acme").job_id
        c.enqueue_request(job_request(q, "t", key="acme"))
        results = c.enqueue_batch([job_request(q, "t", key="globex"), job_request(q, "t")])
        c.enqueue_atomic([job_request(q, "t", key=ODD)])
        assert all(hasattr(r, "job_id") for r in results)
        assert c.job(one).key == "acme"
        page = c.queue_keys(q, limit=1)
        assert [r["key"] for r in page["keys"]] == ["acme"] and page["keys"][0]["ready"] == 2
        seen = [r["key"] for r in page["keys"]]
        while page["next_cursor"]:
            page = c.queue_keys(q, limit=1, cursor=page["next_cursor"])
            seen += [r["key"] for r in page["keys"]]
        assert seen == ["acme", "globex", ODD]
        assert [r["key"] for r in c.queue_keys(q)["keys"]] == seen
        jobs = c.reserve([q], 300_000, max_jobs=10)
        assert sorted(j.key or "-" for j in jobs) == sorted(["-", "acme", "globex", ODD])
        with pytest.raises(NotFound):
            c.queue_keys("nowhere-" + uuid.uuid4().hex[:6])
    # A dead letter replayed as a new job keeps its key; one without a key gets none.
    wire = {"id": one, "queue": q, "job_type": "t", "priority": 0, "attempt": 1, "max_attempts": 3,
            "enqueued_at_ms": 1, "custom": {}, "lease_expires_at_ms": None, "scheduled_at_ms": None}
    record = {"cause": "rejected", "failed_at_ms": 1, "final_attempt": 1, "last_reason": None}
    keyed = DeadLetterRecord.from_wire({**record, "job": {**wire, "key": "acme"}})
    assert keyed.job.key == "acme" and keyed.to_enqueue_request()["key"] == "acme"
    assert "key" not in DeadLetterRecord.from_wire({**record, "job": wire}).to_enqueue_request()


# ---------------------------------------------------------------------------- the CLI
def raftq(cluster, *args):
    """`raftq ARGS` as a user runs it, in a subprocess: (exit code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTQ_URLS", "RAFTQ_API_KEY")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "raftq.cluster.cli", *args, "--urls", ",".join(cluster.urls)],
                       capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=60)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def cli(cluster, capsys, *args):
    """The same command run in this process (a subprocess each costs seconds): (code, out, err)."""
    from raftq.cluster.cli.main import main
    capsys.readouterr()
    code = main([*args, "--urls", ",".join(cluster.urls)])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_enqueue_job_key_and_queues_keys(cluster, api, capsys, monkeypatch):
    monkeypatch.delenv("RAFTQ_API_KEY", raising=False)
    q = "k-cli"
    code, out, err = cli(cluster, capsys, "enqueue", q, "t", "--job-key", "acme", "--count", "3")
    assert code == 0, err
    code, out, err = cli(cluster, capsys, "enqueue", q, "t", "--job-key", "globex")
    assert code == 0, err
    jid = out.strip()
    assert api.get(f"/v1/jobs/{jid}")[1]["key"] == "globex"
    code, out, err = cli(cluster, capsys, "job", jid)
    assert code == 0 and re.search(r"^key +globex$", out, re.M), out
    reserve(api, q, n=1)                # one of acme's (the key made first): acme holds at its limit
    code, out, err = raftq(cluster, "queues", "keys", q)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["KEY", "READY", "IN_FLIGHT", "HELD", "CONCURRENCY", "RATE", "IN_WINDOW", "WEIGHT"]
    assert lines[1].split() == ["acme", "2", "1", "concurrency", "1", "-", "0", "1"], out
    assert lines[2].split() == ["globex", "1", "0", "-", "1", "-", "0", "1"], out
    assert lines[3] == f"queue {q}: 2 key(s), 1 at a limit, 2 ready job(s) held by their key's limit", out
    code, out, err = cli(cluster, capsys, "queues", "keys", q, "--limit", "1")
    assert code == 0 and len(out.splitlines()) == 3 and out.splitlines()[1].split()[0] == "acme"
    assert out.rstrip().endswith("; 1 shown, more remain (raise --limit, or --all)"), out
    code, out, err = cli(cluster, capsys, "queues", "keys", q, "--all", "--json")
    assert code == 0, err
    assert [(r["key"], r["ready"], r["held"]) for r in json.loads(out)] == [("acme", 2, "concurrency"),
                                                                          ("globex", 1, None)]
    code, out, err = cli(cluster, capsys, "queues", q)
    assert code == 0 and re.search(r"^keys +2 \(`raftq queues keys k-cli` lists them\)$", out, re.M), out
    assert re.search(r"^ready held by keys +2$", out, re.M) and re.search(r"^  key_concurrency +1$", out, re.M)
    code, out, err = cli(cluster, capsys, "queues")
    assert code == 0 and re.search(rf"^{q} .*2 held by keys$", out, re.M), out
    code, out, err = cli(cluster, capsys, "queues", "keys", "k-empty")
    assert code == 0 and out.splitlines()[0] == "no keys in queue k-empty (none of its jobs has a key now)", out
    code, out, err = cli(cluster, capsys, "queues", "keys", "nowhere-" + uuid.uuid4().hex[:6])
    assert code == 1 and "neither exists nor is declared" in err, (out, err)
    code, out, err = cli(cluster, capsys, "queues", q, "--limit", "3")
    assert code == 2 and "--limit and --all go with `raftq queues keys NAME`" in err, err
