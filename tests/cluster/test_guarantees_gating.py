"""NexJob's rows on gating through a real three-node cluster (docs/guarantees.md, "Gating"):

* a throttle slot is not free: the job waits ready, no attempt used; it runs when a slot frees;
* the queue's circuit breaker is open: jobs wait, retries are not burned; half open, one probe;
* the execution window is closed: jobs wait until the window opens;
* the deadline passes while the window is closed / the circuit is open: expired, never run.

Each replicated behaviour also across a leader kill: a full resource stays full on the new
leader, an open circuit stays open.
"""
import threading
import time
import urllib.request

from tests.conftest import Api, poll

RETAIN = {"dead_letter_retention_ms": 3_600_000}


def now_ms() -> int:
    return int(time.time() * 1000)


def stats(api, queue, node=None):
    s, out = api.get(f"/v1/queues/{queue}", node=node)
    assert s == 200, out
    return out


def job(api, jid, node=None):
    s, out = api.get(f"/v1/jobs/{jid}", node=node)
    assert s == 200, out
    return out


def metrics(c, node) -> str:
    with urllib.request.urlopen(c.urls[node] + "/metrics", timeout=5) as r:
        return r.read().decode()


def kill_leader(c):
    c.wait_converged(15)
    leader = c.wait_leader()
    c.kill(leader)
    new = c.wait_leader(20, among=[i for i in range(3) if i != leader])
    return leader, new


def test_a_throttle_slot_not_free_holds_the_job_ready_without_an_attempt_across_a_leader_kill(make_cluster):
    c = make_cluster(limits={"resource_limits": {"db": 1}}, storage=RETAIN,
                     queues=[{"name": "q", "resource": "db"}])
    api = Api(c)
    s, a = api.enqueue("q", priority=5)
    s, b = api.enqueue("q")
    s, other = api.enqueue("q", resource="api")        # another resource: unaffected
    assert s == 200
    s, got = api.reserve(["q"], max_jobs=3)
    assert s == 200
    held = {j["id"]: j for j in got["jobs"]}
    assert set(held) == {a["job_id"], other["job_id"]} and held[a["job_id"]]["resource"] == "db"
    st = stats(api, "q")
    assert st["throttled"] == 1 and st["throttle_deferred_total"] == 1 and st["ready"] == 1
    assert job(api, b["job_id"])["state"] == "ready" and job(api, b["job_id"])["attempt"] == 1
    # A full resource stays full on the new leader.
    _, new = kill_leader(c)
    s, out = api.reserve(["q"], node=new)
    assert s == 200 and out["jobs"] == []
    st = stats(api, "q", node=new)
    assert st["throttled"] == 1
    text = metrics(c, new)
    assert any(line.startswith("raftq_queue_throttled{") and 'queue="q"' in line and line.endswith(" 1")
               for line in text.splitlines())
    assert any(line.startswith("raftq_throttle_deferred_total{") and 'queue="q"' in line and line.endswith(" 1")
               for line in text.splitlines())
    # A parked long poll wakes when the ack frees the slot; the job comes with its first attempt.
    result = {}
    t = threading.Thread(target=lambda: result.update(r=api.reserve(["q"], wait_ms=8000, node=new)))
    t.start()
    time.sleep(0.3)
    s, out = api.post(f"/v1/jobs/{a['job_id']}/ack", {"attempt": 1}, node=new)
    assert s == 200, out
    t.join(10)
    s, out = result["r"]
    assert s == 200 and [j["id"] for j in out["jobs"]] == [b["job_id"]] and out["jobs"][0]["attempt"] == 1
    assert stats(api, "q", node=new)["throttled"] == 0


BREAKER = {"name": "cb", "circuit_breaker": {"failures": 2, "window_ms": 60_000, "open_ms": 4_000}}


def open_circuit(api, queue="cb"):
    """Two failures: a nack and a dead_letter nack."""
    for strategy in ("default", "dead_letter"):
        s, _ = api.enqueue(queue, max_attempts=5)
        s, got = api.reserve([queue])
        j = got["jobs"][0]
        s, out = api.post(f"/v1/jobs/{j['id']}/nack", {"attempt": j["attempt"], "reason": "boom",
                                                        "retry": {"strategy": strategy}})
        assert s == 200, out


def test_an_open_circuit_holds_jobs_without_burning_retries_across_a_leader_kill_then_one_probe(make_cluster):
    c = make_cluster(storage=RETAIN, queues=[BREAKER])
    api = Api(c)
    open_circuit(api)
    st = stats(api, "cb")
    assert st["circuit"]["state"] == "open" and st["circuit"]["opened_total"] == 1
    waiting = poll(lambda: [j for j in [api.get("/v1/queues/cb/jobs?state=ready")[1]] if j["jobs"]], what="ready")
    jid = waiting[0]["jobs"][0]["id"]
    attempt = job(api, jid)["attempt"]
    s, out = api.reserve(["cb"])
    assert s == 200 and out["jobs"] == []
    # An open circuit stays open on the new leader.
    _, new = kill_leader(c)
    st = stats(api, "cb", node=new)
    assert st["circuit"]["state"] == "open"
    s, out = api.reserve(["cb"], node=new)
    assert out["jobs"] == [] and job(api, jid, node=new)["attempt"] == attempt      # no retry burned
    assert any(line.startswith("raftq_queue_circuit_open{") and 'queue="cb"' in line and line.endswith(" 1")
               for line in metrics(c, new).splitlines())
    # After open_ms: half open, exactly one probe (a parked long poll gets it); its ack closes it.
    s, _ = api.enqueue("cb", node=new)
    s, out = api.reserve(["cb"], max_jobs=5, wait_ms=10_000, node=new)
    assert s == 200 and len(out["jobs"]) == 1, out
    probe = out["jobs"][0]
    assert stats(api, "cb", node=new)["circuit"]["state"] == "half_open"
    s, more = api.reserve(["cb"], max_jobs=5, node=new)
    assert more["jobs"] == []
    s, _ = api.post(f"/v1/jobs/{probe['id']}/ack", {"attempt": probe["attempt"]}, node=new)
    assert s == 200
    assert stats(api, "cb", node=new)["circuit"]["state"] == "closed"
    s, out = api.reserve(["cb"], max_jobs=5, node=new)
    assert len(out["jobs"]) == 1


def test_an_operator_closes_the_circuit(make_cluster):
    c = make_cluster(storage=RETAIN, queues=[{**BREAKER, "circuit_breaker": {**BREAKER["circuit_breaker"],
                                                                               "open_ms": 600_000}}])
    api = Api(c)
    open_circuit(api)
    assert stats(api, "cb")["circuit"]["state"] == "open"
    # raftq queues close-circuit NAME, as an operator types it
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTQ_URLS", "RAFTQ_API_KEY")}
    p = subprocess.run([sys.executable, "-m", "raftq.cluster.cli", "queues", "close-circuit", "cb",
                        "--urls", ",".join(c.urls)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and "circuit of queue cb closed (was open)" in p.stdout, (p.stdout, p.stderr)
    assert stats(api, "cb")["circuit"]["state"] == "closed"
    s, out = api.post("/v1/queues/cb/circuit/close")
    assert (s, out) == (200, {"queue": "cb", "circuit": "closed", "was": "closed"})
    s, got = api.reserve(["cb"])
    assert len(got["jobs"]) == 1
    s, trail = api.get("/v1/audit")
    assert trail["entries"][0]["action"] == "circuit_close" and trail["entries"][0]["target"] == "cb"


def closed_window() -> list:
    """A window that is not open now (an hour, starting two hours from now, UTC)."""
    t = time.gmtime(time.time() + 7200)
    return [{"start": f"{t.tm_hour:02d}:00", "end": f"{(t.tm_hour + 1) % 24:02d}:00" if t.tm_hour < 23 else "24:00",
             "time_zone": "UTC"}]


def test_a_closed_window_holds_jobs_until_it_opens_across_a_leader_kill(make_cluster):
    c = make_cluster(storage=RETAIN, queues=[{"name": "w", "windows": closed_window()}])
    api = Api(c)
    s, a = api.enqueue("w")
    assert s == 200
    st = stats(api, "w")
    assert st["window_open"] is False
    s, out = api.reserve(["w"])
    assert out["jobs"] == []
    _, new = kill_leader(c)
    assert stats(api, "w", node=new)["window_open"] is False
    assert any(line.startswith("raftq_queue_window_open{") and 'queue="w"' in line and line.endswith(" 0")
               for line in metrics(c, new).splitlines())
    s, out = api.reserve(["w"], node=new)
    assert out["jobs"] == [] and job(api, a["job_id"], node=new)["state"] == "ready"
    # The window opens (here: a configuration change that makes it all day); a parked reserve gets it.
    result = {}
    t = threading.Thread(target=lambda: result.update(r=api.reserve(["w"], wait_ms=8000, node=new)))
    t.start()
    time.sleep(0.3)
    s, cfg = api.get("/v1/config", node=new)
    doc = cfg["config"] if "config" in cfg else cfg
    body = {"expect_version": cfg["version"],
            "config": {"limits": doc["limits"], "storage": doc["storage"],
                       "queues": [{"name": "w", "windows": [{"start": "00:00", "end": "24:00"}]}]}}
    s, out = api.call("PUT", "/v1/config", body, node=new)
    assert s == 200, out
    t.join(10)
    s, out = result["r"]
    assert s == 200 and [j["id"] for j in out["jobs"]] == [a["job_id"]] and out["jobs"][0]["attempt"] == 1


def expired(api, jid) -> bool:
    s, out = api.get("/v1/dead-letters?queue=" + job(api, jid)["queue"])
    return any(r["job"]["id"] == jid and r["cause"] == "expired" for r in out["records"])


def test_a_deadline_passing_while_the_window_is_closed_expires_the_job(make_cluster):
    c = make_cluster(storage=RETAIN, queues=[{"name": "w", "windows": closed_window()}])
    api = Api(c)
    s, a = api.enqueue("w", deadline_at_ms=now_ms() + 1500)
    assert s == 200
    poll(lambda: job(api, a["job_id"])["state"] == "dead_lettered", timeout=15, what="expired")
    assert expired(api, a["job_id"])


def test_a_deadline_passing_while_the_circuit_is_open_expires_the_job(make_cluster):
    c = make_cluster(storage=RETAIN, queues=[{**BREAKER, "circuit_breaker": {**BREAKER["circuit_breaker"],
                                                                               "open_ms": 600_000}}])
    api = Api(c)
    open_circuit(api)
    s, a = api.enqueue("cb", deadline_at_ms=now_ms() + 1500)
    assert s == 200
    assert stats(api, "cb")["circuit"]["state"] == "open"
    poll(lambda: job(api, a["job_id"])["state"] == "dead_lettered", timeout=15, what="expired")
    assert expired(api, a["job_id"])
    assert stats(api, "cb")["circuit"]["state"] == "open"


def test_a_held_back_job_that_is_replaced_or_passes_its_slot_on_runs_across_a_leader_kill(make_cluster):
    """docs/api.md "Gating: throttles, circuit breakers, execution windows": a held-back job
    replaced by its idempotency key stays reservable, and a job handed a freed slot that is then
    deleted passes the slot on; neither wedges its queue (reserve skipping it for good)."""
    c = make_cluster(limits={"resource_limits": {"db": 2, "api": 1}}, storage=RETAIN)
    api = Api(c)
    running = [api.enqueue("q", resource="db")[1]["job_id"] for _ in range(2)]
    assert len(api.reserve(["q"], max_jobs=2)[1]["jobs"]) == 2
    s, held = api.enqueue("q", resource="db", idempotency_key="k")
    assert s == 200 and api.reserve(["q"])[1]["jobs"] == [] and stats(api, "q")["throttled"] == 1
    s, out = api.enqueue("q", resource="db", idempotency_key="k", data=b"replaced", duplicate_policy="replace")
    assert s == 200 and out == {"job_id": held["job_id"], "deduplicated": True, "replaced": True}
    # an api slot: the holder's ack hands it to `first`, which is deleted before it is reserved
    holder = api.enqueue("p", resource="api")[1]["job_id"]
    assert [j["id"] for j in api.reserve(["p"])[1]["jobs"]] == [holder]
    first = api.enqueue("p", resource="api")[1]["job_id"]
    second = api.enqueue("p", resource="api")[1]["job_id"]
    assert api.reserve(["p"])[1]["jobs"] == [] and stats(api, "p")["throttled"] == 2
    assert api.post(f"/v1/jobs/{holder}/ack", {"attempt": 1})[0] == 200
    assert api.call("DELETE", f"/v1/jobs/{first}")[0] == 200

    _, new = kill_leader(c)
    for job_id in running:
        s, out = api.post(f"/v1/jobs/{job_id}/ack", {"attempt": 1}, node=new)
        assert s == 200, out
    s, out = api.reserve(["q"], wait_ms=5000, node=new)
    assert s == 200 and [j["id"] for j in out["jobs"]] == [held["job_id"]], out
    assert out["jobs"][0]["attempt"] == 1 and out["jobs"][0]["payload"]["data_b64"] == "cmVwbGFjZWQ="
    s, out = api.reserve(["p"], wait_ms=5000, node=new)
    assert s == 200 and [j["id"] for j in out["jobs"]] == [second], out
    for q in ("q", "p"):
        st = stats(api, q, node=new)
        assert st["throttled"] == 0 and st["ready"] == 0, st
