import base64
import os
import sys
import time
from pathlib import Path

import pytest

# tests/ on sys.path whatever the import mode, so that the tests in tests/cluster/ import
# conftest (poll, heal, ...), helpers_core, helpers_worker and attacks as the others do.
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# How many examples the property tests (hypothesis) try: RAFTQ_TEST_PROFILE=fast, the default,
# a light run for developers; =full, CI's (.ci/run sets it), each test's own counts, the ones in
# its file (test_core_model: 300 examples of 100 steps, test_core_gating_model: 150 of 60,
# test_core_faults: 120, test_cron: 60). A count given by its own variable wins in both.
# Set here, before the test modules read them at import.
FAST_EXAMPLES = {"RAFTQ_MODEL_EXAMPLES": "40", "RAFTQ_GATING_EXAMPLES": "25", "RAFTQ_FAULT_EXAMPLES": "30",
                 "RAFTQ_CRON_EXAMPLES": "20"}
TEST_PROFILE = os.environ.get("RAFTQ_TEST_PROFILE", "fast")
if TEST_PROFILE not in ("fast", "full"):
    raise pytest.UsageError(f"RAFTQ_TEST_PROFILE={TEST_PROFILE!r}: fast or full")
if TEST_PROFILE == "fast":
    for name, count in FAST_EXAMPLES.items():
        os.environ.setdefault(name, count)

from raftq.cluster.local import LocalCluster, http_json

# Every cluster the suite starts runs the core's invariant checks after applied entries
# (docs/configuration.md `[testing] check_invariants`), and a test fails when one of its
# clusters' nodes found a violation (no_invariant_violations below).
INVARIANT_CHECK_BUDGET = 1000
LocalCluster.default_testing = {"check_invariants": INVARIANT_CHECK_BUDGET}


class Api:
    """A tiny synchronous client for tests: follows 307 like any HTTP client would."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster

    def call(self, method, path, body=None, node=None, headers=None, timeout=10.0, follow=True):
        if node is None:
            node = self.cluster.wait_leader(20)
        url = self.cluster.urls[node] + path
        for _ in range(5):
            status, out = http_json(method, url, body, timeout=timeout, headers=headers)
            if status == 307 and follow:
                url = out["error"]["leader_url"] + path
                continue
            return status, out
        raise AssertionError("redirect loop")

    def post(self, path, body=None, **kw):
        return self.call("POST", path, body if body is not None else {}, **kw)

    def get(self, path, **kw):
        return self.call("GET", path, **kw)

    def enqueue(self, queue="q", job_type="t", data=b"x" * 16, headers=None, node=None, **fields):
        body = {"queue": queue, "job_type": job_type, **fields}
        if data is not None:
            body["payload"] = {"data_b64": base64.b64encode(data).decode(), "encoding": "application/octet-stream"}
        return self.post("/v1/jobs", body, headers=headers, node=node)

    def reserve(self, queues=("q",), lease_ms=30000, max_jobs=1, wait_ms=0, **kw):
        return self.post("/v1/reserve", {"queues": list(queues), "lease_ms": lease_ms, "max_jobs": max_jobs,
                                         "wait_ms": wait_ms}, **kw)


def poll(fn, timeout=10.0, interval=0.05, what="condition"):
    """Poll until fn() returns something truthy; return it."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value {last!r})")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Each phase's report on the test item, so a fixture's teardown can tell that the test
    # failed (tests/cluster/test_admin_ui.py saves a screenshot then).
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_report_header(config):
    counts = ", ".join(f"{n}={os.environ.get(n, 'its default')}" for n in FAST_EXAMPLES)
    return f"raftq test profile: {TEST_PROFILE} ({counts})"


def pytest_collection_modifyitems(config, items):
    # Every test under tests/cluster/ starts real node processes: marked `cluster`, so that
    # `pytest -m "not cluster"` is the fast run (README.md).
    cluster_dir = TESTS / "cluster"
    for item in items:
        if cluster_dir in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(autouse=True)
def no_invariant_violations():
    """After each test: no node of any cluster the suite started found an invariant violation
    while the test ran (counted by its running process, or logged by any of its processes)."""
    yield
    found = {}
    for c in list(LocalCluster.checked):
        found.update({f"{c.dir.name}/{node}": said for node, said in c.invariant_violations().items()})
    assert not found, f"the core's invariant checks failed on {found}"


@pytest.fixture
def make_cluster(tmp_path):
    made = []

    def make(**kw):
        kw.setdefault("tuning", {})
        c = LocalCluster(tmp_path / f"c{len(made)}", **kw).launch()
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def heal(cluster, converge_s: float | None = 30):
    """A module's shared LocalCluster made whole again for the next test: every node running, a
    leader, and (unless converge_s is None) every node caught up with it."""
    for i in range(cluster.n):
        if not cluster.alive(i):
            cluster.start(i)
    cluster.wait_leader(30)
    if converge_s is not None:
        cluster.wait_converged(converge_s)
    return cluster


def proxied_cluster(directory, **kw):
    """A LocalCluster whose Raft links go through a fault proxy (cluster/chaos/proxy.py), started:
    (cluster, net); `net.apply(NetState(...))` cuts links, the caller closes both."""
    from raftq.cluster.chaos.proxy import ProxyNet
    from raftq.cluster.local import LocalCluster
    c = LocalCluster(directory, nodes=3, **kw)
    net = ProxyNet([f"127.0.0.1:{p}" for p in c.raft_ports], avoid=c.http_ports)
    net.start()
    for i, m in net.dial_maps().items():
        if m:
            c.node_testing[i] = {"raft_dial_map": m}
    c.write_configs()
    c.start_all()
    return c, net
