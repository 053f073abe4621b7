"""Data dirs written by commit 455e164 load in this code (docs/operations.md "Upgrades", "What is
on disk"): the journal, the snapshot and the meta file of a stopped three-node cluster
(tests/fixtures/data-dir-455e164.tar.gz, made by tests/fixtures/make_data_dir_455e164.py with
that commit's code), each node with a snapshot and journal entries after it, start three nodes
of this code. They converge on the digest 455e164 had, every queue, job, dead letter, key,
schedule, audit entry and the configuration show what it showed, the idempotency keys recorded
before and after the snapshot still deduplicate, a Request-Id still replays its answer, the jobs
in flight are still held (their keys and throttle slots too, the open circuit stays open), and
new writes work. A refactor that moves a module the snapshot or the journal names, or changes
how a command or the state is read back, fails here.

The snapshot names the members by Raft address (written under online membership change, so it
is the membership a node takes when it loads it): the nodes must listen on the Raft ports the
fixture was made with; the HTTP ports are free ones (the members' URLs come from the TOMLs).
The nodes' clock is put just after the fixture's last write, so its leases (300 s), dedup window
(24 h), request-id window (60 s) and open circuit are as they were; sweeps are off, as they were
when it was written, so only the test's requests change the state.
"""
from __future__ import annotations

import json
import socket
import tarfile
import time
from pathlib import Path

from raftq.cluster.local import LocalCluster, free_ports, http_json

FIXTURES = Path(__file__).parent.parent / "fixtures"
FIXTURE = FIXTURES / "data-dir-455e164.tar.gz"
EXPECTED = FIXTURES / "data-dir-455e164.json"
# A queue's `workers` is the leader's own count of recent reserves, not replicated: a new
# leader shows null for its first 30 s.
SOFT_QUEUE_FIELDS = {"workers", "no_workers"}


def shown(got, want, where="") -> list[str]:
    """Where `got` differs from `want`, looking only at the fields `want` has (this code may show
    more fields than 455e164 did, never other values for the fields it showed)."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{where}: {got!r} is not an object"]
        return [d for k, v in want.items()
                for d in (shown(got[k], v, f"{where}.{k}") if k in got else [f"{where}.{k}: missing"])]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: {got!r} != {want!r}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in shown(g, w, f"{where}[{i}]")]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


def assert_shown(got, want, what):
    diffs = shown(got, want, what)
    assert not diffs, "\n".join(diffs[:20])


def assert_ports_free(ports):
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as the node's Raft server binds
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                raise AssertionError(f"Raft port {port} is taken ({e}): the fixture's snapshot names its members by "
                                     "these addresses, so the nodes must listen on them") from None


def test_data_dirs_of_455e164_load_with_every_job_key_and_schedule(tmp_path):
    fx = json.loads(EXPECTED.read_text())
    toml = fx["toml"]
    raft_ports = [int(n["raft"].rsplit(":", 1)[1]) for n in fx["nodes"]]
    assert_ports_free(raft_ports)
    offset = fx["stopped_at_ms"] + 1000 - time.time_ns() // 1_000_000
    c = LocalCluster(tmp_path / "c", limits=toml["limits"], storage=toml["storage"], queues=toml["queues"],
                     api_keys=toml["api_keys"], raft_ports=raft_ports, http_ports=free_ports(3),
                     testing={**toml["testing"], "clock_offset_ms": offset})
    with tarfile.open(FIXTURE) as t:
        t.extractall(c.dir, filter="data")           # data/n1, data/n2, data/n3
    c.write_configs()
    c.start_all()
    try:
        leader = c.wait_leader(30)
        # Each node loaded its snapshot and replayed its journal after it: the state 455e164 had.
        views = c.wait_converged(30)
        assert {v["digest"] for v in views} == {fx["digest"]}, [v["digest"] for v in views]
        for v in views:
            assert v["last_applied"] >= fx["last_applied"] and v["config_version"] == fx["config_version"]
            assert v["state"] == fx["state_counts"], v["state"]
            assert v["disk"]["findings"] == {} and v["disk"]["log_verified"], v["disk"]
            assert sorted(m["raft"] for m in v["members"]) == sorted(n["raft"] for n in fx["nodes"])
        check_what_it_shows(c, leader, fx)
        check_writes(c, leader, fx)
        views = c.wait_converged(30)
        assert len({v["digest"] for v in views}) == 1
    finally:
        c.stop_all()
        c.close()


def caller(c: LocalCluster, leader: int, key: dict):
    def call(method, path, body=None, rid=None):
        headers = {"Authorization": f"Bearer {key['key']}", **({"Request-Id": rid} if rid else {})}
        return http_json(method, c.urls[leader] + path, body, headers=headers, timeout=10)
    return call


def pages(call, path, field):
    out, cursor = [], None
    while True:
        status, page = call("GET", path + ("&" if "?" in path else "?") + "limit=100"
                            + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200, (path, status, page)
        out += page[field]
        cursor = page.get("next_cursor")
        if not cursor:
            return out


def check_what_it_shows(c: LocalCluster, leader: int, fx: dict):
    admin = caller(c, leader, fx["api_keys"]["admin"])
    status, queues = admin("GET", "/v1/queues")
    assert status == 200, queues
    got = {q["name"]: q for q in queues["queues"]}
    assert sorted(got) == sorted(q["name"] for q in fx["queues"])
    for q in fx["queues"]:
        assert_shown(got[q["name"]], {k: v for k, v in q.items() if k not in SOFT_QUEUE_FIELDS}, f"queue {q['name']}")
        assert_shown(admin("GET", f"/v1/queues/{q['name']}")[1]["limits"], fx["queue_limits"][q["name"]],
                     f"limits of {q['name']}")
    jobs = {}
    for q in got:
        for state in ("ready", "scheduled", "in_flight"):
            jobs.update({j["id"]: j for j in pages(admin, f"/v1/queues/{q}/jobs?state={state}", "jobs")})
    assert sorted(jobs) == sorted(fx["jobs"])
    assert_shown(jobs, fx["jobs"], "jobs")
    assert_shown(pages(admin, "/v1/dead-letters", "records"), fx["dead_letters"], "dead letters")
    assert_shown(pages(admin, "/v1/queues/tenant-reports/keys", "keys"), fx["queue_keys"]["tenant-reports"],
                 "keys of tenant-reports")
    assert_shown(pages(admin, "/v1/schedules", "schedules"), fx["schedules"], "schedules")
    assert_shown(pages(admin, "/v1/audit", "entries"), fx["audit"], "audit")
    assert_shown(admin("GET", "/v1/config")[1], fx["config"], "config")
    assert_shown(admin("GET", "/v1/keys")[1], fx["keys"], "API keys")
    # A few of them by name, as their tests below use them.
    named = fx["named"]
    states = {jid: admin("GET", f"/v1/jobs/{jid}")[1].get("state") for jid in
              (named["dead"], named["admin_dead"], named["later"], named["export_throttled"], named["rich"],
               *named["emails_in_flight"], *(k["id"] for k in named["keyed_in_flight"].values()))}
    assert states == {named["dead"]: "dead_lettered", named["admin_dead"]: "dead_lettered",
                      named["later"]: "scheduled", named["export_throttled"]: "ready", named["rich"]: "in_flight",
                      **{jid: "in_flight" for jid in named["emails_in_flight"]},
                      **{k["id"]: "in_flight" for k in named["keyed_in_flight"].values()}}
    assert admin("GET", f"/v1/jobs/{named['acked']}")[0] == 404


def check_writes(c: LocalCluster, leader: int, fx: dict):
    admin, app = caller(c, leader, fx["api_keys"]["admin"]), caller(c, leader, fx["api_keys"]["worker"])
    named = fx["named"]

    def reserve(queue, n=10):
        status, out = app("POST", "/v1/reserve", {"queues": [queue], "lease_ms": 60_000, "max_jobs": n})
        assert status == 200, out
        return out["jobs"]

    # Idempotency keys recorded before the snapshot (welcome-*) and after it (after-snapshot-*,
    # in the journal only) still deduplicate.
    for key, job_id in [*named["welcome"].items(), *named["after_snapshot"].items()]:
        status, out = app("POST", "/v1/jobs", {"queue": "emails", "job_type": "t", "idempotency_key": key})
        assert status == 200 and out == {"job_id": job_id, "deduplicated": True}, (key, status, out)
    # A request id (after the snapshot) replays its answer instead of acking again (a 404).
    rid = named["rid_ack"]
    assert app("POST", f"/v1/jobs/{rid['job_id']}/ack", {"attempt": 1}, rid=rid["request_id"]) == (200, rid["answer"])
    # Jobs in flight are still under their leases; their keys and the throttle's slot are held.
    assert reserve("tenant-reports") == [] and reserve("exports") == [] and reserve("fragile") == []
    acme = named["keyed_in_flight"]["acme"]
    assert app("POST", f"/v1/jobs/{acme['id']}/ack", {"attempt": acme["attempt"]})[0] == 200
    got = reserve("tenant-reports")
    assert [j["key"] for j in got] == ["acme"] and got[0]["id"] != acme["id"]
    assert app("POST", f"/v1/jobs/{named['export_in_flight']}/ack", {"attempt": 1})[0] == 200
    assert [j["id"] for j in reserve("exports")] == [named["export_throttled"]]
    for jid in named["emails_in_flight"]:
        assert app("POST", f"/v1/jobs/{jid}/ack", {"attempt": 1}) == (200, {"job_id": jid})
    # The dead letters can be requeued.
    status, out = admin("POST", "/v1/dead-letters/requeue", {"ids": [named["dead"], named["admin_dead"]]})
    assert status == 200 and sorted(out["requeued"]) == sorted([named["dead"], named["admin_dead"]]), out
    assert admin("GET", f"/v1/jobs/{named['dead']}")[1]["state"] == "ready"
    # The key added online still lets its holder in; an unknown key does not.
    assert http_json("GET", c.urls[leader] + "/v1/queues",
                     headers={"Authorization": "Bearer not-a-key-of-this-cluster"})[0] == 401
    # The schedule still makes jobs, and a new queue works end to end.
    status, out = admin("POST", "/v1/schedules/nightly-report/trigger", {})
    assert status == 200, out
    assert admin("GET", f"/v1/jobs/{out['job_id']}")[1]["state"] == "ready"
    status, out = app("POST", "/v1/jobs", {"queue": "after-the-upgrade", "job_type": "t"})
    assert status == 200 and not out["deduplicated"], out
    assert [j["id"] for j in reserve("after-the-upgrade")] == [out["job_id"]]
    assert app("POST", f"/v1/jobs/{out['job_id']}/ack", {"attempt": 1})[0] == 200
