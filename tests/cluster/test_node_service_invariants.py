"""`[testing] check_invariants` (docs/configuration.md): a node runs the core's invariant checks
after applied entries, counts and logs what they find without raising into the apply, and shows
the count as `invariant_violations` in GET /v1/cluster (null when the checks are off).

The suite's clusters all run with the checks on (tests/conftest.py fails a test whose clusters
found a violation); here: the count is there and 0 after real traffic on every node, and a
violation is counted, logged and never raised.
"""
import logging

import pytest

from conftest import Api, poll
from raftq.cluster.local import http_json
from raftq.node.core.limits import Limits
from raftq.node.replication.replica import QueueState


@pytest.mark.cluster
def test_a_node_that_checks_after_every_apply_reports_no_violation_after_real_traffic(make_cluster):
    c = make_cluster(durability="memory", testing={"check_invariants": 1},
                     storage={"dead_letter_retention_ms": 3_600_000})
    api = Api(c)
    ids = [api.enqueue(queue="inv", priority=i % 10)[1]["job_id"] for i in range(12)]
    status, out = api.post("/v1/jobs/batch", {"jobs": [{"queue": "inv", "job_type": "t"} for _ in range(20)]})
    assert status == 200, out
    status, out = api.reserve(("inv",), max_jobs=10, lease_ms=200)
    assert status == 200 and len(out["jobs"]) == 10, out
    jobs = out["jobs"]
    for job in jobs[:4]:
        assert api.post(f"/v1/jobs/{job['id']}/ack", {"attempt": job["attempt"]})[0] == 200
    for job in jobs[4:6]:
        assert api.post(f"/v1/jobs/{job['id']}/nack", {"attempt": job["attempt"], "retry": {"strategy": "dead_letter"}})[0] == 200
    status, out = api.post("/v1/dead-letters/requeue", {"ids": [jobs[4]["id"]]})
    assert status == 200 and out["requeued"] == [jobs[4]["id"]], out
    # The other four leases lapse: the leader's sweep redelivers them (a sweep entry, checked too).
    poll(lambda: api.get("/v1/queues/inv")[1].get("in_flight") == 0, 15, what="the lapsed leases swept")
    c.wait_converged(30)
    views = [http_json("GET", u + "/v1/cluster?digest=false")[1] for u in c.urls]
    assert [v["invariant_violations"] for v in views] == [0, 0, 0], views
    assert min(v["last_applied"] for v in views) > 10


@pytest.mark.cluster
def test_without_the_setting_the_view_says_null(make_cluster):
    c = make_cluster(durability="memory", nodes=1, testing={"check_invariants": 0})
    status, view = http_json("GET", c.urls[0] + "/v1/cluster?digest=false")
    assert status == 200 and view["invariant_violations"] is None


def state(budget: int) -> QueueState:
    s = QueueState(Limits.build())
    s.check_invariants = budget
    return s


def test_a_violation_is_counted_and_logged_critical_never_raised(caplog):
    s = state(1)
    s._check_invariants()
    assert s.invariant_violations == 0
    s.machine._undo.extend([None] * 4)           # broken on purpose: an undo log left between commands
    with caplog.at_level(logging.CRITICAL, logger="raftq.replica"):
        s._check_invariants()
        s._check_invariants()                   # the same problems: counted again, said once
    assert s.invariant_violations == 2
    said = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(said) == 1 and "invariant violation after applied entry" in said[0].getMessage()
    assert "undo log not empty" in said[0].getMessage()


def test_a_check_that_fails_by_itself_is_counted_too(caplog, monkeypatch):
    s = state(1)
    monkeypatch.setattr(s.machine, "check_invariants", lambda: 1 / 0)
    with caplog.at_level(logging.CRITICAL, logger="raftq.replica"):
        s._check_invariants()
    assert s.invariant_violations == 1 and "checks themselves failed" in caplog.text


def test_a_large_state_is_checked_every_size_over_budget_entries(monkeypatch):
    s = state(10)
    calls = []
    monkeypatch.setattr(s.machine, "check_invariants", lambda: calls.append(1))
    for _ in range(5):
        s._check_invariants()
    assert len(calls) == 5                      # at most 10 entries: after every apply
    monkeypatch.setattr(s.machine, "jobs", {i: None for i in range(35)})
    calls.clear()
    for _ in range(40):
        s._check_invariants()
    assert len(calls) == 10                     # 35 entries, budget 10: every 4th apply


def test_no_check_runs_during_a_replay_and_the_first_entry_after_it_is_checked(monkeypatch):
    from types import SimpleNamespace
    from raftq.node.replication.replica import REPLAY_LAG
    s = state(10)
    calls = []
    monkeypatch.setattr(s.machine, "check_invariants", lambda: calls.append(1))
    raft = s._syncObj = SimpleNamespace(raftCommitIndex=50_000, raftLastApplied=1)
    for _ in range(100):
        s._check_invariants()
        raft.raftLastApplied += 1
    assert calls == []                          # far behind the commit index: a replay
    raft.raftLastApplied = raft.raftCommitIndex - REPLAY_LAG
    s._check_invariants()
    assert calls == [1]                         # caught up: checked at once


def test_raftq_chaos_fails_a_run_whose_nodes_found_a_violation():
    from raftq.cluster.chaos.runner import add_core_invariants
    clean = {"valid": True, "invariants": []}
    add_core_invariants(clean, [{"node_id": "n1", "invariant_violations": 0}, None], {"critical": ["x CRITICAL y"]})
    assert clean["valid"] and clean["invariants"][-1]["ok"]
    line = "2026-01-01 raftq.replica CRITICAL invariant violation after applied entry 7 (1 so far): clock went back"
    logged = {"valid": True, "invariants": []}
    add_core_invariants(logged, [{"node_id": "n1", "invariant_violations": 0}], {"critical": [line]})
    assert not logged["valid"] and logged["invariants"][-1]["count"] == 1
    counted = {"valid": True, "invariants": []}
    add_core_invariants(counted, [{"node_id": "n2", "invariant_violations": 3}], {"critical": []})
    assert not counted["valid"] and counted["invariants"][-1]["examples"] == ["n2: 3 counted"]
