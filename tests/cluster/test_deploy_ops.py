"""The operations artifacts of deploy/: the Prometheus alerting rules and their promtool unit tests,
the Grafana dashboard, the container image and compose file, the version they name.

* Every PromQL expression of the rules and the dashboard names only metrics that a live node's
  GET /metrics exports (a real node process, after traffic that makes the per-queue series).
* promtool checks the rules and runs their unit tests, where promtool is installed (Debian's
  `prometheus` package); the dashboard's expressions go through promtool's parser as well.
* The container image is built and three containers run the compose file's nodes, where podman
  can run containers here; otherwise that test skips and says why. The Dockerfile and compose
  file are checked statically everywhere.
"""
from __future__ import annotations

import base64
import json
import os
import re
import resource
import shutil
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

import raftq
from raftq.cluster.local import LocalCluster, free_ports, http_json
from raftq.node.base.settings import load

from conftest import poll

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ALERTS = DEPLOY / "prometheus" / "raftq-alerts.yaml"
ALERT_TESTS = DEPLOY / "prometheus" / "raftq-alerts.test.yaml"
DASHBOARD = DEPLOY / "grafana" / "raftq-dashboard.json"
DOCKERFILE = DEPLOY / "container" / "Dockerfile"
COMPOSE = DEPLOY / "container" / "compose.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
PLACEHOLDER = "CHANGE-ME-run-openssl-rand-hex-32"


# ---------------------------------------------------------------- the exposition's metric names

def exported_names(text: str) -> set[str]:
    """The metric names a PromQL query can use against this exposition: every family a `# TYPE`
    line declares (a family exists from its declaration on, even before its first sample, e.g.
    disk damage by kind), with a histogram's `_bucket`, `_sum` and `_count` (not its bare name)
    and a summary's bare name plus `_sum` and `_count`. Every sample must belong to a declared
    family, so a name exported without its TYPE line is an error here, not a silent pass."""
    kinds: dict[str, str] = {}
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
        kinds[m.group(1)] = m.group(2)
    names: set[str] = set()
    for family, kind in kinds.items():
        if kind == "histogram":
            names |= {family + "_bucket", family + "_sum", family + "_count"}
        elif kind == "summary":
            names |= {family, family + "_sum", family + "_count"}
        else:
            names.add(family)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        sample = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0)
        assert sample in names, f"sample {sample!r} belongs to no declared family"
    return names


def test_exported_names_follow_the_histogram_suffix_rules():
    text = ("# TYPE lat_seconds histogram\nlat_seconds_bucket{le=\"1\"} 1\nlat_seconds_sum 2\nlat_seconds_count 1\n"
            "# TYPE rpc summary\nrpc{quantile=\"0.5\"} 1\nrpc_sum 1\nrpc_count 1\n"
            "# TYPE jobs_count gauge\njobs_count 3\n# TYPE quiet_total counter\n")
    names = exported_names(text)
    assert names == {"lat_seconds_bucket", "lat_seconds_sum", "lat_seconds_count", "rpc", "rpc_sum", "rpc_count",
                     "jobs_count", "quiet_total"}
    assert "lat_seconds" not in names          # a histogram's bare name is no series
    with pytest.raises(AssertionError, match="no declared family"):
        exported_names("# TYPE a gauge\na 1\nb 2\n")


# ---------------------------------------------------------------- PromQL: which names an expression uses

FUNCTIONS = {
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "day_of_month",
    "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor", "histogram_quantile",
    "histogram_count", "histogram_sum", "histogram_fraction", "holt_winters", "hour", "idelta", "increase",
    "irate", "label_join", "label_replace", "ln", "log2", "log10", "minute", "month", "predict_linear", "rate",
    "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt", "time", "timestamp", "vector", "year",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "quantile_over_time",
    "stddev_over_time", "stdvar_over_time", "last_over_time", "present_over_time", "acos", "acosh", "asin",
    "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh", "deg", "rad", "pi",
    # Grafana's template-variable query
    "query_result",
}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                "topk", "quantile", "limitk", "limit_ratio"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
            "bool", "atan2", "inf", "nan", "start", "end"}
# Keywords followed by a parenthesised list of label names.
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<var>\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>(?:0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)[A-Za-z0-9_]*)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<punct>[(){}\[\],@]|[-+*/%^]|==|!=|=~|!~|<=|>=|<|>|=)
""", re.X)


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers outside braces, brackets and strings
    that are neither a function or aggregation called, nor a keyword, nor label names of a
    by/without/on/ignoring/group_* list. Grafana variables ($job, ${x}) are skipped, and of
    Grafana's `label_values(selector, label)` only the selector is read."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", expr, re.S)
    if m:
        expr = m.group(1)
    tokens = []
    pos = 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            tokens.append((m.lastgroup, m.group()))
    names: set[str] = set()
    depth_brace = depth_bracket = 0
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "punct":
            depth_brace += {"{": 1, "}": -1}.get(text, 0)
            depth_bracket += {"[": 1, "]": -1}.get(text, 0)
        elif kind == "ident" and depth_brace == 0 and depth_bracket == 0:
            nxt = tokens[i + 1][1] if i + 1 < len(tokens) else None
            word = text.lower()
            if word in LABEL_LISTS and nxt == "(":
                close = next(j for j in range(i + 2, len(tokens)) if tokens[j][1] == ")")
                i = close + 1
                continue
            if word in KEYWORDS:
                pass
            elif nxt == "(" and (text in FUNCTIONS or text in AGGREGATIONS):
                pass
            elif text in AGGREGATIONS and nxt is not None and nxt.lower() in ("by", "without"):
                pass
            elif nxt == "(":
                raise ValueError(f"unknown function {text!r} in {expr!r}")
            else:
                names.add(text)
        i += 1
    assert depth_brace == 0 and depth_bracket == 0, f"unbalanced braces or brackets in {expr!r}"
    return names


def test_the_promql_extractor_finds_metrics_and_only_metrics():
    expr = ('max by (job, queue) (rate(raftq_queue_acked_total{job="$job", queue=~"a|b"}[5m] offset 1h)) '
            '/ ignoring (stage) group_left sum without (node) (raftq_bogus_metric) > 0 and on (job) '
            'absent(up) or vector(0) * 1e3 unless count(x_total == bool 2)')
    assert promql_metric_names(expr) == {"raftq_queue_acked_total", "raftq_bogus_metric", "up", "x_total"}
    assert promql_metric_names('label_values(raftq_queue_ready{job="$job"}, queue)') == {"raftq_queue_ready"}
    assert promql_metric_names("predict_linear(raftq_disk_free_bytes[6h], 24 * 3600) < 0") == {"raftq_disk_free_bytes"}
    with pytest.raises(ValueError, match="unknown function"):
        promql_metric_names("ratee(raftq_leader[5m])")


# ---------------------------------------------------------------- the expressions of the rules and the dashboard

def alert_rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, expr) for every query of the dashboard: panel targets (rows' panels too) and the
    template variables' queries."""
    dash = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"]))
            walk(p.get("panels", []))
    walk(dash["panels"])
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable {v['name']}", q))
    return out


@pytest.fixture(scope="module")
def live_exposition(tmp_path_factory):
    """GET /metrics of a real node after traffic: enqueues, a reserve with a worker id, an ack,
    a nack into the dead letters, a pause. One node (the leader: raftq_queue_workers is the
    leader's figure), with a 1 s workers window so the worker count is known soon."""
    with LocalCluster(tmp_path_factory.mktemp("metrics") / "c", nodes=1, tuning={},
                      storage={"dead_letter_retention_ms": 86_400_000},
                      testing={"workers_window_ms": 1000}).launch() as c:
        url = c.urls[c.wait_leader(20)]

        def post(path, body):
            status, out = http_json("POST", url + path, body, timeout=10)
            assert status == 200, (path, status, out)
            return out
        payload = {"data_b64": base64.b64encode(b"x").decode(), "encoding": "application/octet-stream"}
        for q in ("emails", "reports"):
            for _ in range(3):
                post("/v1/jobs", {"queue": q, "job_type": "t", "payload": payload})
        jobs = post("/v1/reserve", {"queues": ["emails"], "lease_ms": 30000, "max_jobs": 2, "wait_ms": 0,
                                    "worker_id": "w1"})["jobs"]
        assert len(jobs) == 2
        post(f"/v1/jobs/{jobs[0]['id']}/ack", {"attempt": jobs[0]["attempt"]})
        post(f"/v1/jobs/{jobs[1]['id']}/nack", {"attempt": jobs[1]["attempt"], "reason": "bad",
                                                 "retry": {"strategy": "dead_letter"}})
        post("/v1/queues/reports/pause", {})

        def scraped():
            status, _ = http_json("GET", url + "/v1/cluster?digest=false")
            with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                text = r.read().decode()
            # The workers figure is known once the leader has led for a whole window.
            return text if re.search(r'raftq_queue_workers\{[^}]*queue="emails"\} 1$', text, re.M) else None
        return poll(scraped, timeout=20, what="raftq_queue_workers of emails on the leader")


def test_the_live_exposition_has_the_per_queue_series(live_exposition):
    for series in ('raftq_queue_enqueued_total{node="n1",queue="emails"} 3',
                   'raftq_queue_acked_total{node="n1",queue="emails"} 1',
                   'raftq_queue_dead_lettered_total{node="n1",queue="emails"} 1',
                   'raftq_queue_paused{node="n1",queue="reports"} 1',
                   'raftq_leader{node="n1"} 1'):
        assert series in live_exposition.splitlines(), series
    assert re.search(r'^raftq_dead_letters\{node="n1",queue="emails",cause="[a-z_]+"\} 1$', live_exposition, re.M)


def names_all_exported(named_exprs, exported: set) -> set:
    """The metric names the expressions use, each checked against what a node exports."""
    used = set()
    for where, expr in named_exprs:
        names = promql_metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - exported
        assert not unknown, f"{where} uses {sorted(unknown)}, which no node exports"
        used |= names
    return used


def test_alert_rules_use_only_exported_metrics(live_exposition):
    rules = alert_rules()
    assert len(rules) >= 10
    used = names_all_exported([(r["alert"], r["expr"]) for r in rules], exported_names(live_exposition))
    # The alerts the operations doc promises, on the metrics that carry them.
    for metric in ("raftq_leader", "raftq_raft_commit_index", "raftq_raft_last_applied", "raftq_disk_low_space",
                   "raftq_disk_free_bytes", "raftq_queue_dead_lettered_total", "raftq_queue_circuit_open",
                   "raftq_queue_ready", "raftq_queue_workers"):
        assert metric in used, f"no alert on {metric}"


def test_dashboard_uses_only_exported_metrics(live_exposition):
    exprs = dashboard_exprs()
    assert len(exprs) >= 30
    used = names_all_exported([(f"dashboard {w}", e) for w, e in exprs], exported_names(live_exposition))
    for metric in ("raftq_leader", "raftq_raft_term", "raftq_raft_commit_index", "raftq_raft_last_applied",
                   "raftq_queue_enqueued_total", "raftq_queue_acked_total", "raftq_queue_ready",
                   "raftq_queue_in_flight", "raftq_queue_dead_letters", "raftq_queue_circuit_open",
                   "raftq_queue_workers", "raftq_commit_stage_seconds_total"):
        assert metric in used, f"the dashboard shows no {metric}"


def test_a_bogus_metric_in_the_dashboard_would_be_caught(live_exposition):
    exported = exported_names(live_exposition)
    bogus = 'max by (queue) (rate(raftq_queue_enqued_total{job="$job"}[$__rate_interval]))'
    assert promql_metric_names(bogus) - exported == {"raftq_queue_enqued_total"}


def test_dashboard_structure():
    dash = json.loads(DASHBOARD.read_text())
    ids = []

    def walk(panels):
        for p in panels:
            ids.append(p["id"])
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
            if p["type"] != "row":
                assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
                assert p["targets"], p["title"]
                for t in p["targets"]:
                    assert t["datasource"]["uid"] == "${datasource}"
            walk(p.get("panels", []))
    walk(dash["panels"])
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"job", "queue"} <= set(variables)
    assert dash["uid"] and dash["title"]


def test_alert_rules_are_complete_and_documented():
    """Every alert has a severity, a summary, a description and a runbook link to a section of
    docs/operations.md that exists, and a promtool unit test that expects it to fire."""
    ops = OPERATIONS.read_text()
    anchors = {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", ops, re.M)}
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    firing = {c["alertname"] for t in tests["tests"] for c in t.get("alert_rule_test", []) if c.get("exp_alerts")}
    names = [r["alert"] for r in alert_rules()]
    assert len(names) == len(set(names)), "an alert name repeats"
    for r in alert_rules():
        assert r["labels"]["severity"] in ("critical", "warning"), r["alert"]
        assert {"summary", "description", "runbook"} <= set(r["annotations"]), r["alert"]
        doc, _, anchor = r["annotations"]["runbook"].partition("#")
        assert doc == "docs/operations.md" and anchor in anchors, f"{r['alert']}: no section #{anchor}"
        assert r["alert"] in firing, f"{r['alert']} has no promtool test where it fires"
    # The unit tests feed only series the nodes export (same names as the rules check).
    for t in tests["tests"]:
        for s in t["input_series"]:
            name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", s["series"]).group(0)
            assert name.startswith("raftq_"), name


# ---------------------------------------------------------------- promtool

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not on PATH (Debian: apt-get install -y --no-install-recommends prometheus)")


@needs_promtool
def test_promtool_checks_and_unit_tests_the_rules():
    r = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"SUCCESS: {len(alert_rules())} rules found" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([PROMTOOL, "test", "rules", ALERT_TESTS.name], cwd=ALERT_TESTS.parent,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@needs_promtool
def test_promtool_unit_tests_fail_on_a_broken_rule(tmp_path):
    """The unit tests are strict enough to catch a rule that fires on the wrong thing."""
    broken = ALERTS.read_text().replace("(max by (job, queue) (raftq_queue_paused) == 1)",
                                        "(max by (job, queue) (raftq_queue_paused) == 2)")
    assert broken != ALERTS.read_text()
    (tmp_path / ALERTS.name).write_text(broken)
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    r = subprocess.run([PROMTOOL, "test", "rules", ALERT_TESTS.name], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "RaftqQueueNoWorkers" in r.stdout + r.stderr, r.stdout + r.stderr


@needs_promtool
def test_promtool_parses_every_dashboard_expression(tmp_path):
    """Grafana's variables replaced by values, each query becomes a recording rule, which
    `promtool check rules` parses: a syntax error in a panel fails here."""
    subst = {"$__rate_interval": "1m", "$__range": "1h", "$job": "raftq", "$queue": ".*", "${datasource}": "x"}
    rules = []
    for i, (where, expr) in enumerate(dashboard_exprs()):
        if expr.startswith("label_values("):
            expr = expr[len("label_values("):].rsplit(",", 1)[0]
        for k, v in subst.items():
            expr = expr.replace(k, v)
        assert "$" not in expr, f"{where}: an unknown variable in {expr!r}"
        rules.append({"record": f"raftq:dashboard_{i}", "expr": expr})
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------- versions

# An image tag or a wheel's name: raftq:0.2.0, raftq-0.2.0-py3-none-any.whl, raftq==0.2.0rc1.
VERSION_MENTION = re.compile(r"\braftq(?::|==|@|-|_)v?(\d+\.\d+\.\d+(?:(?:a|b|rc)\d+|\.dev\d+|\.post\d+)?)")


def version_mentions(text: str) -> list[str]:
    return VERSION_MENTION.findall(text)


def test_every_version_in_deploy_is_the_package_version():
    assert version_mentions("image: registry.example.com/raftq:0.1.0 and raftq-0.2.0-py3-none-any.whl, "
                            "raftq==0.3.0rc1, raftq 0.1.0 (prose)") == ["0.1.0", "0.2.0", "0.3.0rc1"]
    found = {}
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()) + [OPERATIONS]:
        for v in version_mentions(path.read_text(errors="replace")):
            found.setdefault(str(path.relative_to(ROOT)), []).append(v)
    wrong = {p: vs for p, vs in found.items() if any(v != raftq.__version__ for v in vs)}
    assert not wrong, f"versions other than raftq.__version__ {raftq.__version__}: {wrong}"
    for must in ("deploy/kubernetes/raftq.yaml", "deploy/container/compose.yaml", "deploy/README.md"):
        assert must in found, f"{must} names no image version"
    assert len(found["deploy/kubernetes/raftq.yaml"]) == 2      # the init container and the node


# ---------------------------------------------------------------- Dockerfile and compose, statically

def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [(m.group(1).upper(), m.group(2)) for m in re.finditer(r"^([A-Za-z]+)\s+(.*)$", text, re.M)
            if not m.group(0).startswith("#")]


def test_dockerfile_builds_the_wheel_and_runs_unprivileged():
    ins = dockerfile_instructions()
    froms = [a for k, a in ins if k == "FROM"]
    assert len(froms) == 2 and froms[0].endswith("AS build"), froms
    runs = " ".join(a for k, a in ins if k == "RUN")
    assert "pip wheel --wheel-dir /wheels '.[server]'" in runs
    assert '--no-index --find-links /wheels "${wheel}[server]"' in runs       # the built wheel, with the extra
    assert "from=build,source=/wheels" in runs
    user = [a for k, a in ins if k == "USER"]
    assert user == ["10001:10001"], user                      # numeric: runAsNonRoot can verify it
    assert ins.index(("USER", "10001:10001")) > max(i for i, (k, _) in enumerate(ins) if k == "RUN")
    health = [a for k, a in ins if k == "HEALTHCHECK"]
    assert len(health) == 1 and '"/readyz"' in health[0]
    assert ["raftq", "node", "--config", "/etc/raftq/node.toml"] == json.loads(
        [a for k, a in ins if k == "ENTRYPOINT"][0])
    # No version written into the image recipe: it is the wheel's.
    assert not re.search(r"\d+\.\d+\.\d+", "\n".join(a for k, a in ins if k != "FROM" or "python:" not in a)
                         .replace("0.0.0.0", ""))
    # What COPY takes from the context is what the .dockerignore lets in.
    allowed = [line[1:] for line in (DEPLOY / "container" / "Dockerfile.dockerignore").read_text().splitlines()
               if line.startswith("!")]
    for k, a in ins:
        if k == "COPY" and "--from" not in a:
            for src in a.split()[:-1]:
                assert any(src == pat or pat.startswith(src.rstrip("/") + "/") for pat in allowed), \
                    f"COPY {src}: excluded from the build context by Dockerfile.dockerignore"
    # The health check script runs the same checks the image does.
    assert (DEPLOY / "container" / "healthcheck.py").exists()


def compose_nodes() -> list[dict]:
    """Each compose service with its config (loaded by the node's own settings.load, the
    placeholder secret replaced) and published ports."""
    doc = yaml.safe_load(COMPOSE.read_text())
    out = []
    for name, svc in doc["services"].items():
        mounts = [v.split(":") for v in svc["volumes"]]
        config = next(COMPOSE.parent / src for src, dst, *_ in mounts if dst == "/etc/raftq/node.toml")
        ports = []
        for p in svc["ports"]:
            host_ip, host_port, container_port = str(p).split(":")
            ports.append((host_ip, int(host_port), int(container_port)))
        out.append({"name": name, "svc": svc, "config": config, "ports": ports})
    return out


def load_with_secret(path: Path, tmp_path: Path, secret=os.urandom(32).hex()):
    copy = tmp_path / path.name
    copy.write_text(path.read_text().replace(PLACEHOLDER, secret))
    return load(copy)


def test_compose_nodes_advertise_their_published_host_ports(tmp_path):
    nodes = compose_nodes()
    assert [n["name"] for n in nodes] == ["n1", "n2", "n3"]
    host_ports = [p[1] for n in nodes for p in n["ports"]]
    assert len(host_ports) == len(set(host_ports)) == 3, "each node needs a published port of its own"
    peer_urls = set()
    for n in nodes:
        s = load_with_secret(n["config"], tmp_path)
        assert s.node_id == n["name"] == n["svc"]["hostname"]
        m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)", s.url)
        assert m, f"{n['name']} advertises {s.url}, which is not a port published on the host's loopback"
        (host_ip, host_port, container_port), = n["ports"]
        assert host_ip == "127.0.0.1" and host_port == int(m.group(1)), \
            f"{n['name']} advertises {s.url} but publishes {host_ip}:{host_port}"
        assert container_port == s.http_port, f"{n['name']}: port {host_port} goes to {container_port}, " \
                                              f"the node listens on {s.http_port}"
        # Raft between the containers by service name, never published.
        assert s.raft == f"{n['name']}:7101"
        assert all(p[2] != 7101 for p in n["ports"])
        peer_urls.add(tuple((p.id, p.raft, p.url) for p in s.peers))
        # The nodes call each other on the compose network, at each one's container name and the
        # port it listens on there (the advertised URLs are the host's, out of the containers' reach).
        assert s.peer_urls == {m["name"]: f"http://{m['svc']['hostname']}:{m['ports'][0][2]}" for m in nodes}, \
            f"{n['name']}: node.peer_urls {s.peer_urls}"
    assert len(peer_urls) == 1, "the peer lists differ between the three configs"
    assert {(p[0], p[2]) for p in next(iter(peer_urls))} == \
        {(n["name"], f"http://127.0.0.1:{n['ports'][0][1]}") for n in nodes}


def test_compose_runs_the_versioned_image_hardened():
    doc = yaml.safe_load(COMPOSE.read_text())
    for name, svc in doc["services"].items():
        assert svc["image"] == f"raftq:{raftq.__version__}", name
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in svc["security_opt"], name
        assert svc["stop_signal"] == "SIGTERM" and svc["stop_grace_period"] == "30s", name
        assert svc["build"]["dockerfile"] == "deploy/container/Dockerfile", name


# ---------------------------------------------------------------- the image, built and run (podman)

PODMAN = shutil.which("podman")
BASE_IMAGE = "localhost/raftq-base:bookworm"


def _run(args, timeout=600, check=True):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def _ulimits() -> list[str]:
    # Podman's defaults raise RLIMIT_NOFILE/NPROC above this sandbox's hard limits (no
    # CAP_SYS_RESOURCE), which the runtime may not do; stay within what this process has.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=4096:4096"]


def _podman_engine() -> list[str]:
    """The podman command that can run a container here, or pytest.skip with the reason found.
    Needs a base image with Python: BASE_IMAGE, made with debootstrap when missing (no image
    registry is reachable from here)."""
    if PODMAN is None:
        pytest.skip("podman is not on PATH (Debian: apt-get install -y podman runc debootstrap)")
    r = _run([PODMAN, "info"], timeout=60, check=False)
    if r.returncode != 0:
        pytest.skip(f"podman info fails: {r.stderr.strip()[-300:]}")
    if _run([PODMAN, "image", "exists", BASE_IMAGE], check=False).returncode != 0:
        debootstrap = shutil.which("debootstrap")
        if debootstrap is None or os.geteuid() != 0:
            pytest.skip(f"no image {BASE_IMAGE} and no root debootstrap to make one")
        root = Path(f"/var/tmp/raftq-base-{uuid.uuid4().hex[:8]}")
        try:
            r = _run([debootstrap, "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                      "bookworm", str(root), "http://deb.debian.org/debian"], timeout=900, check=False)
            if r.returncode != 0:
                pytest.skip(f"debootstrap failed: {r.stdout[-300:]} {r.stderr[-300:]}")
            tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            imp = subprocess.run([PODMAN, "import", "-", BASE_IMAGE], stdin=tar.stdout, capture_output=True,
                                 text=True, timeout=300)
            tar.stdout.close()
            assert tar.wait() == 0 and imp.returncode == 0, imp.stderr
        finally:
            shutil.rmtree(root, ignore_errors=True)
    errors = []
    # crun refuses cgroup v1+v2 hybrid hosts; runc runs there.
    for runtime in ([], ["--runtime", "runc"]):
        if runtime and shutil.which("runc") is None:
            errors.append("runc not installed")
            continue
        r = _run([PODMAN, *runtime, "run", "--rm", *_ulimits(), BASE_IMAGE, "python3", "-c", "print('ok')"],
                 timeout=120, check=False)
        if r.returncode == 0 and r.stdout.strip() == "ok":
            return [PODMAN, *runtime]
        errors.append(f"{runtime or 'default runtime'}: {r.stderr.strip()[-300:]}")
    pytest.skip("podman cannot run a container here: " + "; ".join(errors))


def _containers_report(engine, names) -> str:
    """Each container's state and the end of its log (for a failure's message)."""
    out = []
    for name in names:
        state = _run([*engine, "inspect", name, "--format", "{{.State.Status}} exit {{.State.ExitCode}}"],
                     timeout=60, check=False)
        logs = _run([*engine, "logs", "--tail", "30", name], timeout=60, check=False)
        out.append(f"--- {name}: {state.stdout.strip()}\n{(logs.stdout + logs.stderr)[-3000:]}")
    return "\n".join(out)


def _http(method, url, body=None, follow=False):
    """One call from the host; with `follow`, asking for and following a 307 as raftq's client
    does (the leader's URL is a host address); returns (status, body, urls)."""
    seen = [url]
    for _ in range(3):
        status, out = http_json(method, url, body, timeout=10, headers={"Raftq-Redirect": "1"} if follow else None)
        if status == 307 and follow:
            url = out["error"]["leader_url"] + "/" + url.split("/", 3)[3]
            seen.append(url)
            continue
        return status, out, seen
    raise AssertionError(f"redirect loop: {seen}")


@pytest.mark.skipif(os.environ.get("RAFTQ_SKIP_CONTAINER") == "1", reason="RAFTQ_SKIP_CONTAINER=1")
def test_the_image_runs_the_compose_cluster(tmp_path):
    """Build the image from the Dockerfile, run compose.yaml's three nodes as three containers
    with its settings (hostnames, fixed IPs, read-only root, no capabilities, the published
    ports), and use the cluster from the host through the advertised URLs."""
    engine = _podman_engine()
    tag = f"localhost/raftq:{raftq.__version__}-test{uuid.uuid4().hex[:6]}"
    # The build context as Dockerfile.dockerignore allows it (podman may not read that file).
    ctx = tmp_path / "ctx"
    for name in ("pyproject.toml", "README.md", "__init__.py"):
        (ctx / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, ctx / name)
    for d in ("node", "cluster"):
        shutil.copytree(ROOT / d, ctx / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (ctx / "deploy" / "container").mkdir(parents=True)
    for name in ("Dockerfile", "healthcheck.py"):
        shutil.copy(DEPLOY / "container" / name, ctx / "deploy" / "container" / name)
    # --layers=false: no cached intermediate images left behind (the build stage is ~300 MB).
    build = [*engine, "build", "--layers=false", "--format", "docker", *_ulimits(), "--build-arg", f"BASE={BASE_IMAGE}",
             "-f", str(ctx / "deploy" / "container" / "Dockerfile"), "-t", tag]
    # Reaching PyPI from the build the way this machine does (a mirror, a proxy's CA).
    if os.environ.get("PIP_INDEX_URL"):
        build += ["--build-arg", f"PIP_INDEX_URL={os.environ['PIP_INDEX_URL']}"]
    # pip in the build trusts the CA bundle pip here is told to, else this machine's trust store.
    cert = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    if Path(cert).is_file():
        build += ["--build-arg", "PIP_CERT=/build-ca.pem", "-v", f"{cert}:/build-ca.pem:ro"]
    _run(build + [str(ctx)], timeout=900)

    nodes = compose_nodes()
    doc = yaml.safe_load(COMPOSE.read_text())
    subnet = doc["networks"]["raftq"]["ipam"]["config"][0]["subnet"]
    ports = free_ports(len(nodes))
    secret = os.urandom(32).hex()
    suffix = uuid.uuid4().hex[:6]
    network = f"raftq-test-{suffix}"
    names, volumes = [], []
    try:
        _run([*engine, "network", "create", "--subnet", subnet, network])
        for n, port in zip(nodes, ports):
            # The config as shipped, with a real secret and, for this shared machine, a free host
            # port in place of 700N (the node listens on it and advertises it, as compose has it).
            (_, host_port, _), = n["ports"]
            text = n["config"].read_text().replace(PLACEHOLDER, secret)
            for m, p in zip(nodes, ports):
                text = text.replace(f"127.0.0.1:{m['ports'][0][1]}", f"127.0.0.1:{p}")
                # node.peer_urls: the other containers' port, which here is the free one too
                text = text.replace(f"http://{m['svc']['hostname']}:{m['ports'][0][2]}\"",
                                    f"http://{m['svc']['hostname']}:{p}\"")
            text = text.replace(f'http = "0.0.0.0:{host_port}"', f'http = "0.0.0.0:{port}"')
            config = tmp_path / f"{n['name']}.toml"
            config.write_text(text)
            config.chmod(0o644)                       # read by uid 10001 in the container
            svc = n["svc"]
            name, volume = f"raftq-test-{suffix}-{n['name']}", f"raftq-test-{suffix}-{n['name']}"
            _run([*engine, "volume", "create", volume])
            volumes.append(volume)
            args = [*engine, "run", "-d", "--name", name, "--hostname", svc["hostname"], "--network", network,
                    "--network-alias", n["name"], "--ip", svc["networks"]["raftq"]["ipv4_address"],
                    "-p", f"127.0.0.1:{port}:{port}", "-v", f"{config}:/etc/raftq/node.toml:ro",
                    "-v", f"{volume}:/var/lib/raftq", *_ulimits(), "--stop-signal", svc["stop_signal"]]
            # The other nodes by name, at their fixed addresses: a network's DNS needs a plugin
            # (aardvark-dns, CNI's dnsname) that a minimal podman install lacks, as compose's
            # engines provide it.
            for m in nodes:
                ip = m["svc"]["networks"]["raftq"]["ipv4_address"]
                for host in {m["name"], m["svc"]["hostname"]} - {svc["hostname"]}:
                    args += ["--add-host", f"{host}:{ip}"]
            if svc.get("read_only"):
                args.append("--read-only")
            args += [a for t in svc.get("tmpfs", []) for a in ("--tmpfs", t)]
            args += [a for c in svc.get("cap_drop", []) for a in ("--cap-drop", c)]
            args += [a for o in svc.get("security_opt", []) for a in ("--security-opt", o.replace(":true", ""))]
            _run(args + [tag])
            names.append(name)
        urls = [f"http://127.0.0.1:{p}" for p in ports]

        def all_ready():
            for u in urls:
                try:
                    with urllib.request.urlopen(u + "/readyz", timeout=3) as r:
                        if r.status != 200:
                            return False
                except (urllib.error.URLError, OSError):
                    return False
            return True
        try:
            poll(all_ready, timeout=90, interval=0.5, what="/readyz 200 on the three containers")
        except AssertionError as e:    # say why: each container's state and the end of its log
            raise AssertionError(f"{e}\n{_containers_report(engine, names)}") from None
        # The image's HEALTHCHECK (GET /readyz from inside) agrees.
        for name in names:
            r = _run([*engine, "healthcheck", "run", name], timeout=60, check=False)
            assert r.returncode == 0, f"{name}: healthcheck {r.returncode} {r.stdout} {r.stderr}"
            r = _run([*engine, "exec", name, "id", "-u"], timeout=60)
            assert r.stdout.strip() == "10001"

        _, view, _ = _http("GET", urls[0] + "/v1/cluster?digest=false")
        leader_url = view["leader"]["url"]
        assert leader_url in urls, f"the leader advertises {leader_url}, not a published host port {urls}"
        follower = next(u for u in urls if u != leader_url)
        # A follower forwards to the leader at its peer_urls entry (the container name): the call is
        # answered by the follower itself, no redirect.
        payload = {"data_b64": base64.b64encode(b"from the host").decode(), "encoding": "application/octet-stream"}
        status, out, hops = _http("POST", follower + "/v1/jobs", {"queue": "emails", "job_type": "welcome",
                                                                  "payload": payload})
        assert status == 200 and hops == [follower + "/v1/jobs"], (status, out, hops)
        status, got, hops = _http("POST", follower + "/v1/reserve", {"queues": ["emails"], "lease_ms": 30000,
                                                                     "max_jobs": 1, "wait_ms": 0})
        assert status == 200 and [j["id"] for j in got["jobs"]] == [out["job_id"]], got
        job = got["jobs"][0]
        assert base64.b64decode(job["payload"]["data_b64"]) == b"from the host"
        status, queue, hops = _http("GET", follower + "/v1/queues/emails")        # a read, forwarded as HTTP
        assert status == 200 and queue["in_flight"] == 1 and len(hops) == 1, (status, queue)
        status, acked, hops = _http("POST", follower + f"/v1/jobs/{job['id']}/ack", {"attempt": job["attempt"]})
        assert status == 200 and len(hops) == 1, acked
        # Asked for, the 307 still names the leader's host address, which the host follows.
        status, out, hops = _http("POST", follower + "/v1/jobs", {"queue": "emails", "job_type": "welcome"},
                                  follow=True)
        assert status == 200 and hops == [follower + "/v1/jobs", leader_url + "/v1/jobs"], (status, out, hops)
        # One node gathers every node's view at its peer_urls: all reachable, listed at the host URLs.
        status, nodes_view, _ = _http("GET", follower + "/v1/cluster/nodes")
        assert status == 200 and [(r["url"], r["reachable"]) for r in nodes_view["nodes"]] == \
            [(u, True) for u in urls], nodes_view
        # Graceful stop: SIGTERM, leadership handed over, exit 0.
        for name in names:
            _run([*engine, "stop", "-t", "30", name], timeout=90)
            r = _run([*engine, "inspect", name, "--format", "{{.State.ExitCode}}"], timeout=60)
            assert r.stdout.strip() == "0", f"{name} exited {r.stdout.strip()}"
    finally:
        for name in names:
            _run([*engine, "rm", "-f", "-t", "5", name], timeout=120, check=False)
        for volume in volumes:
            _run([*engine, "volume", "rm", "-f", volume], timeout=60, check=False)
        _run([*engine, "network", "rm", "-f", network], timeout=60, check=False)
        _run([*engine, "rmi", "-f", tag], timeout=120, check=False)
