"""Execution timeout: the job's timeout_ms, else its queue's at enqueue (docs/semantics.md,
Execution timeout; the worker enforces it: tests/cluster/test_guarantees_lifecycle.py)."""
from __future__ import annotations

from helpers_core import Core, rejection, restored


def test_timeout_ms_shown_job_first_then_queue_then_null():
    c = Core(queues=[{"name": "slow", "execution_timeout_ms": 5000}])
    own = c.enqueue_id("slow", timeout_ms=1500)
    queued = c.enqueue_id("slow")
    none = c.enqueue_id("q")
    assert c.view(own)["timeout_ms"] == 1500
    assert c.view(queued)["timeout_ms"] == 5000
    assert c.view(none)["timeout_ms"] is None
    jobs = {j["id"]: j for j in c.reserve_jobs(["slow", "q"], max_jobs=3)}
    assert jobs[own]["timeout_ms"] == 1500 and jobs[queued]["timeout_ms"] == 5000
    assert "timeout_ms" not in jobs[none]
    assert rejection(c.enqueue(timeout_ms=0))["reason"] == "invalid_request"
    assert rejection(c.enqueue(timeout_ms="1s"))["reason"] == "invalid_request"
    restored(c)
