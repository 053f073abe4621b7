"""The `raftq` command line against a real cluster, run as subprocesses like a user would."""
import base64
import json
import re
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from raftq.cluster.client import Retry, SyncClient
from raftq.cluster.local import LocalCluster, free_ports
from tests.conftest import poll

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("cli"), storage={"dead_letter_retention_ms": 3_600_000},
                     queues=[{"name": "jsononly", "allowed_encodings": ["application/json"]},
                             {"name": "tiny", "max_queue_depth": 5}]).launch()
    yield c
    c.close()


@pytest.fixture(scope="module")
def client(cluster):
    with SyncClient(cluster.urls, transport="http", timeout=15) as c:
        yield c


def raftq(*args, urls=None, input=None, env=None, timeout=60):
    """Run `python -m raftq.cluster.cli ARGS`; return (exit code, stdout, stderr)."""
    cmd = [sys.executable, "-m", "raftq.cluster.cli", *args]
    if urls is not None:
        cmd += ["--urls", ",".join(urls)]
    e = {k: v for k, v in os.environ.items() if k not in ("RAFTQ_URLS", "RAFTQ_API_KEY")}
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    p = subprocess.run(cmd, input=input if input is not None else "", capture_output=True, text=True,
                       env=e, cwd=str(ROOT), timeout=timeout)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def qname():
    return "cli-" + uuid.uuid4().hex[:8]


def make_dead_letters(client, queue, n):
    ids = [client.enqueue(queue, "fail", f"payload {i}".encode()).job_id for i in range(n)]
    jobs = client.reserve([queue], 30_000, max_jobs=n)
    assert sorted(j.id for j in jobs) == sorted(ids)
    for j in jobs:
        assert client.nack(j, reason="boom", retry=Retry.dead_letter()) is True
    return ids


# ---------------------------------------------------------------------------- status
def test_status_table_and_json(cluster):
    code, out, err = raftq("status", urls=cluster.urls)
    assert code == 0, err
    leader = cluster.ids[cluster.wait_leader()]
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "URL", "ROLE", "TERM", "COMMIT", "APPLIED", "DIGEST", "PEERS", "LEADER",
                                "CONFIG"]
    for i, node in enumerate(cluster.ids):
        row = next(line.split() for line in lines[1:] if line.split()[:1] == [node])
        assert row[1] == cluster.urls[i]
        assert row[2] == ("leader" if node == leader else "follower")
        assert row[7] == "2/2" and row[8] == leader and row[9] == "1"     # the seeded config, as the TOML
    assert "differs from the configuration in force" not in out
    assert f"leader: {leader} at {cluster.urls[cluster.ids.index(leader)]}" in out

    # One URL is enough: the others are found through the members list. Options work before the command.
    code, out, err = raftq("--json", "status", "--urls", cluster.urls[0])
    assert code == 0, err
    views = json.loads(out)
    assert sorted(v["node_id"] for v in views) == cluster.ids
    assert sorted(v["url"] for v in views) == sorted(cluster.urls)
    assert [v["role"] for v in views].count("leader") == 1
    assert all(v["leader"]["id"] == leader and v["digest"] for v in views)


# ---------------------------------------------------------------------------- enqueue, job, queues
def test_enqueue_one_and_inspect_it(cluster):
    q = qname()
    code, out, err = raftq("enqueue", q, "welcome", "--data", '{"user": 42}', "--priority", "7",
                           "--custom", "tenant=acme", "--custom", "n=3", "--custom", 'zip="01234"',
                           "--max-attempts", "5", urls=cluster.urls)
    assert code == 0, err
    job_id = out.strip()
    assert str(uuid.UUID(job_id)) == job_id

    code, out, err = raftq("job", job_id, urls=cluster.urls)
    assert code == 0, err
    assert "state        ready" in out and "priority     7" in out and "attempt      1 of 5" in out
    assert "12 bytes, application/json" in out
    # The JSON payload pretty-printed under its key, not one escaped string.
    assert re.search(r'^data +\{\n +"user": 42\n +\}$', out, re.M), out

    code, out, err = raftq("job", job_id, "--json", urls=cluster.urls)
    job = json.loads(out)
    assert job["id"] == job_id and job["queue"] == q and job["state"] == "ready"
    assert job["custom"] == {"tenant": "acme", "n": 3, "zip": "01234"}
    assert base64.b64decode(job["payload"]["data_b64"]) == b'{"user": 42}'

    code, out, err = raftq("job", job_id, "--payload", urls=cluster.urls)
    assert code == 0 and out == '{"user": 42}'

    # A delayed job; an idempotency key deduplicates, and --json shows it.
    code, out, err = raftq("enqueue", q, "later", "--delay-ms", "60000", "--idempotency-key", "k1", "--json",
                           urls=cluster.urls)
    first = json.loads(out)
    assert code == 0 and first["deduplicated"] is False
    code, out, err = raftq("enqueue", q, "later", "--delay-ms", "60000", "--idempotency-key", "k1", "--json",
                           urls=cluster.urls)
    assert json.loads(out) == {"job_id": first["job_id"], "deduplicated": True}
    code, out, err = raftq("job", first["job_id"], urls=cluster.urls)
    fields = dict(line.split(None, 1) for line in out.splitlines() if not line.startswith(("job type", "scheduled")))
    assert fields["state"] == "scheduled" and "scheduled at" in out
    assert re.search(r"\(in (5\d|60)(\.\d+)?s\)", out), out      # 60 s delay, read a moment later


def test_enqueue_count_uses_batches_and_shows_progress(cluster):
    q = qname()
    code, out, err = raftq("enqueue", q, "bulk", "--data", "x", "--count", "300", "--batch-size", "64",
                           "--progress", urls=cluster.urls)
    assert code == 0, err
    ids = out.split()
    assert len(ids) == len(set(ids)) == 300
    assert "300/300" in err and "[####" in err and "enqueued 300 jobs" in err
    code, out, err = raftq("queues", q, "--json", urls=cluster.urls)
    assert json.loads(out)["ready"] == 300 and json.loads(out)["enqueued"] == 300


def test_rejections_say_why(cluster):
    code, out, err = raftq("enqueue", "jsononly", "t", "--data", "plain text", urls=cluster.urls)
    assert code == 1 and out == ""
    assert "enqueue rejected: encoding_not_allowed" in err and "application/json" in err and "--encoding" in err

    # Best-effort batches stop at the first rejection and report what went in.
    code, out, err = raftq("enqueue", "tiny", "t", "--count", "8", "--batch-size", "3", urls=cluster.urls)
    assert code == 1
    assert len(out.split()) == 5
    assert "enqueued 5 of 8" in err and "queue_full" in err

    code, out, err = raftq("enqueue", "q", "t", "--count", "2", "--idempotency-key", "k", urls=cluster.urls)
    assert code == 2 and "--idempotency-key" in err
    code, out, err = raftq("enqueue", "q", "t", "--data", "", urls=cluster.urls)
    assert code == 2 and "at least one byte" in err


def test_queues_table_detail_and_json(cluster, client):
    q = qname()
    for _ in range(2):
        client.enqueue(q, "t", b"x")
    code, out, err = raftq("queues", urls=cluster.urls)
    assert code == 0, err
    assert out.splitlines()[0].split()[:6] == ["QUEUE", "PAUSED", "READY", "SCHEDULED", "IN_FLIGHT", "DEAD"]
    row = next(line.split() for line in out.splitlines() if line.startswith(q + " "))
    assert row[1:4] == ["no", "2", "0"]
    assert "queue(s);" in out.splitlines()[-1]
    code, out, err = raftq("queues", "--json", urls=cluster.urls)
    assert next(x for x in json.loads(out) if x["name"] == q)["enqueued"] == 2

    code, out, err = raftq("queues", "tiny", urls=cluster.urls)
    assert code == 0 and re.search(r"^declared +yes$", out, re.M) and "limits:" in out, out
    assert re.search(r"^  max_queue_depth +5$", out, re.M), out
    assert re.search(r"^  dead_letter_forward +none$", out, re.M), out
    assert re.search(r"^  allowed_encodings +any$", out, re.M), out      # unset: any encoding
    code, out, err = raftq("queues", "jsononly", urls=cluster.urls)
    assert re.search(r"^  allowed_encodings +application/json$", out, re.M) and \
        re.search(r"^  max_queue_depth +unlimited$", out, re.M), out
    code, out, err = raftq("queues", "tiny", "--json", urls=cluster.urls)
    assert json.loads(out)["limits"]["max_queue_depth"] == 5


def test_pause_and_resume(cluster, client):
    q = qname()
    client.enqueue(q, "t", b"x")
    code, out, err = raftq("pause", q, urls=cluster.urls)
    assert code == 0 and f"queue {q} paused" in out
    code, out, err = raftq("queues", q, "--json", urls=cluster.urls)
    assert json.loads(out)["paused"] is True
    assert client.reserve([q], 10_000) == []
    code, out, err = raftq("resume", q, "--json", urls=cluster.urls)
    assert code == 0 and json.loads(out) == {"queue": q, "paused": False}
    assert len(client.reserve([q], 10_000)) == 1


def test_cancel(cluster, client):
    q = qname()
    ready = client.enqueue(q, "t", b"x").job_id
    code, out, err = raftq("cancel", ready, urls=cluster.urls)
    assert code == 0 and f"cancelled {ready}" in out
    code, out, err = raftq("cancel", ready, urls=cluster.urls)
    assert code == 1 and "cannot cancel" in err


# ---------------------------------------------------------------------------- dead letters
def test_dlq_list_requeue_delete_drain(cluster, client, tmp_path):
    q = qname()
    ids = make_dead_letters(client, q, 3)

    code, out, err = raftq("dlq", "list", "--queue", q, urls=cluster.urls)
    assert code == 0, err
    assert out.splitlines()[0].split()[:4] == ["JOB", "QUEUE", "TYPE", "CAUSE"]
    assert all(i in out for i in ids) and "rejected" in out and "boom" in out and "3 dead letter(s)" in out
    code, out, err = raftq("dlq", "list", "--queue", q, "--json", urls=cluster.urls)
    records = json.loads(out)
    assert [r["job"]["id"] for r in records] == ids and records[0]["last_reason"] == "boom"
    code, out, err = raftq("dlq", "list", "--queue", q, "--limit", "2", urls=cluster.urls)
    assert "2 dead letter(s) shown; more remain" in out

    # requeue: the job is ready again under the same id; an unknown id is reported and fails the command.
    missing = str(uuid.uuid4())
    code, out, err = raftq("dlq", "requeue", ids[0], missing, urls=cluster.urls)
    assert code == 1
    assert f"requeued {ids[0]}" in out and f"missing {missing}" in out and "not dead letters" in err
    code, out, err = raftq("job", ids[0], "--json", urls=cluster.urls)
    assert json.loads(out)["state"] == "ready" and json.loads(out)["attempt"] == 1

    code, out, err = raftq("dlq", "delete", ids[1], "--json", urls=cluster.urls)
    assert code == 0 and json.loads(out) == {"deleted": [ids[1]], "missing": []}

    # drain is destructive: without --yes and without a terminal it refuses and changes nothing.
    code, out, err = raftq("dlq", "drain", "--queue", q, urls=cluster.urls)
    assert code == 2 and "--yes" in err
    code, out, err = raftq("dlq", "list", "--queue", q, "--json", urls=cluster.urls)
    assert [r["job"]["id"] for r in json.loads(out)] == [ids[2]]

    dest = tmp_path / "drained.jsonl"
    code, out, err = raftq("dlq", "drain", "--queue", q, "--yes", "--out", str(dest), urls=cluster.urls)
    assert code == 0, err
    lines = dest.read_text().splitlines()
    assert [json.loads(x)["job"]["id"] for x in lines] == [ids[2]]
    assert "drained 1 dead letter(s)" in err
    code, out, err = raftq("dlq", "list", "--queue", q, urls=cluster.urls)
    assert code == 0 and "no dead letters" in out

    # Drain to stdout: JSON lines, at most --max.
    q2 = qname()
    more = make_dead_letters(client, q2, 2)
    code, out, err = raftq("dlq", "drain", "--queue", q2, "--max", "1", "-y", urls=cluster.urls)
    assert code == 0, err
    assert [json.loads(x)["job"]["id"] for x in out.splitlines()] == more[:1]
    code, out, err = raftq("dlq", "drain", "--queue", q2, "--yes", urls=cluster.urls)
    assert [json.loads(x)["job"]["id"] for x in out.splitlines()] == more[1:]
    code, out, err = raftq("dlq", "drain", "--queue", q2, "--yes", urls=cluster.urls)
    assert code == 0 and out == "" and "nothing drained" in err


# ---------------------------------------------------------------------------- errors
def test_errors_say_what_to_do(cluster):
    code, out, err = raftq("job", str(uuid.uuid4()), urls=cluster.urls)
    assert code == 1 and "not found" in err
    code, out, err = raftq("job", "not-a-uuid", urls=cluster.urls)
    assert code == 1 and "invalid argument" in err and "canonical UUID" in err

    dead = [f"http://127.0.0.1:{p}" for p in free_ports(2)]
    for args in (["status"], ["enqueue", "q", "t"], ["queues"], ["dlq", "list"]):
        code, out, err = raftq(*args, urls=dead)
        assert code == 2, (args, err)
        assert "cannot reach any node at " + dead[0] in err and "raftq up" in err, err
        assert err.count("\n") == 1 and "connection refused" in err, err      # one line says it all
    # RAFTQ_URLS is the default for --urls.
    code, out, err = raftq("queues", env={"RAFTQ_URLS": ",".join(dead)})
    assert code == 2 and dead[1] in err


def test_bench_passes_its_arguments_through():
    code, out, err = raftq("bench", "--help")
    assert code == 0 and "raftq bench" in out and "--jobs" in out


def test_status_and_requests_without_a_leader(make_cluster):
    c = make_cluster(durability="memory")
    leader = c.wait_leader()
    survivor = (leader + 1) % 3
    for i in range(3):
        if i != survivor:
            c.kill(i)

    def no_leader():
        code, out, err = raftq("status", urls=c.urls)
        return (code, out, err) if code == 1 else None

    code, out, err = poll(no_leader, timeout=20, interval=0.5, what="status to report no leader")
    assert "no leader" in out
    assert out.count(" down ") == 2 or out.count("down") >= 2
    code, out, err = raftq("status", "--json", urls=c.urls)
    views = json.loads(out)
    assert code == 1 and sorted(v["role"] for v in views).count("down") == 2

    t0 = time.monotonic()
    code, out, err = raftq("enqueue", "q", "t", "--timeout", "2", urls=c.urls)
    assert code == 3, err
    assert "raftq status" in err and "outcome is unknown" in err and time.monotonic() - t0 < 15


def test_progress_bar_helper():
    import io
    from raftq.cluster.progress import Progress

    quiet = io.StringIO()
    with Progress(10, "x", stream=quiet) as bar:       # not a terminal: draws nothing
        bar.update(10)
    assert quiet.getvalue() == ""

    out = io.StringIO()
    bar = Progress(200, "copy", unit="jobs", stream=out, enabled=True, min_interval=0, width=80)
    bar.update(50)
    assert "\rcopy [" in out.getvalue() and "50/200 jobs  25%" in out.getvalue() and "ETA" in out.getvalue()
    bar.update(150)
    bar.close("done")
    text = out.getvalue()
    assert "200/200 jobs 100%" in text and text.endswith("\ndone\n") and text.count("200/200") == 1
    assert "[" + "#" * 10 in text

    counter = io.StringIO()
    with Progress(None, "scan", stream=counter, enabled=True, min_interval=0) as bar:
        bar.update(7)
    assert "scan 7 (" in counter.getvalue()


def test_status_warns_when_digests_differ_at_one_index(monkeypatch, capsys):
    """Synthetic views (a real divergence is a bug we cannot provoke): the warning names the nodes."""
    from raftq.cluster import cli
    from raftq.cluster.cli import commands

    def view(node, role, digest, applied=7):
        members = [{"id": f"n{i}", "url": f"http://h{i}", "raft_addr": "", "connected": True} for i in (1, 2, 3)]
        return {"node_id": node, "role": role, "leader": {"id": "n1", "url": "http://h1"}, "term": 4,
                "commit_index": 7, "last_applied": applied, "members": members, "ready": True, "digest": digest}

    async def probe(self, urls, digest=False):
        views = {"http://h1": view("n1", "leader", "a" * 64), "http://h2": view("n2", "follower", "a" * 64),
                 "http://h3": view("n3", "follower", "b" * 64)}
        return [commands.NodeAnswer(u, 200, views[u]) for u in urls]

    monkeypatch.setattr(commands.Ctx, "probe", probe)
    assert cli.main(["status", "--urls", "http://h1,http://h2,http://h3"]) == 0
    out, err = capsys.readouterr()
    assert "leader: n1 at http://h1, term 4; 3/3 nodes up" in out and "aaaaaaaaaaaa" in out
    assert "disagree on the state at applied index 7" in err and "n3: bbbbbbbbbbbb" in err


def test_bench_local_runs_every_phase_and_leaves_no_data_behind(tmp_path):
    code, out, err = raftq("bench", "--local", "--jobs", "300", "--producers", "5", "--workers", "5",
                           "--latency-rounds", "20", "--json", env={"TMPDIR": str(tmp_path)}, timeout=120)
    assert code == 0, err
    result = json.loads(out)
    for phase in ("enqueue", "drain", "mixed", "batch_enqueue", "batch_drain"):
        assert result[phase]["jobs"] == 300 and result[phase]["jobs_per_s"] > 0, (phase, result)
    assert 0 < result["latency"]["p50_ms"] <= result["latency"]["p99_ms"]
    assert result["durability"] == "fsync" and result["transport"] == "session"
    assert not list(tmp_path.glob("raftq-bench-*")), "the local cluster's data dir was left behind"


def test_bench_spread_sends_each_client_to_a_node_of_its_own(tmp_path):
    """--spread: the clients call every node (followers forward), and each node's CPU per job is
    reported."""
    code, out, err = raftq("bench", "--local", "--jobs", "300", "--producers", "6", "--workers", "6",
                           "--phases", "mixed", "--spread", "--json", env={"TMPDIR": str(tmp_path)}, timeout=120)
    assert code == 0, err
    result = json.loads(out)
    assert result["spread"] is True and result["mixed"]["jobs"] == 300
    per = result["mixed"]["cpu_us_per_job"]
    assert len(per) == 3 and result["leader"] in per and all(v is not None and v > 0 for v in per.values()), per


def test_bench_baseline_rounds_interleave_raftq_and_the_bare_server(tmp_path):
    code, out, err = raftq("bench", "--local", "--jobs", "200", "--producers", "4", "--workers", "4",
                           "--phases", "mixed", "--transport", "http", "--baseline", "--baseline-rounds", "3",
                           "--json", env={"TMPDIR": str(tmp_path)}, timeout=120)
    assert code == 0, err
    result = json.loads(out)
    base = result["bare_http_mixed"]
    rounds = base["rounds"]
    assert len(rounds) == 3
    assert rounds[0]["raftq_jobs_per_s"] == result["mixed"]["jobs_per_s"]      # round 1 reuses the phase
    for r in rounds:
        assert r["raftq_jobs_per_s"] > 0 and r["bare_jobs_per_s"] > 0
        assert r["ratio"] == round(r["raftq_jobs_per_s"] / r["bare_jobs_per_s"], 3)
    assert result["mixed_vs_bare"] == base["ratio"] == sorted(r["ratio"] for r in rounds)[1]
    assert base["jobs_per_s"] == sorted(r["bare_jobs_per_s"] for r in rounds)[1]


def test_bench_refuses_zero_baseline_rounds():
    code, out, err = raftq("bench", "--local", "--baseline", "--baseline-rounds", "0")
    assert code == 2 and "--baseline-rounds must be at least 1" in err


def test_bench_backlog_measures_every_figure_at_each_size_and_cleans_up(tmp_path):
    code, out, err = raftq("bench", "--backlog", "0,600", "--recovery-timeout", "60", "--json",
                           "--tuning", "raft_compression_level=1", env={"TMPDIR": str(tmp_path)}, timeout=300)
    assert code == 0, err
    result = json.loads(out)
    assert result["tuning"].get("raft_compression_level") == 1       # --tuning reached the nodes' TOML
    assert [s["backlog"] for s in result["steps"]] == [0, 600]
    full = result["steps"][1]
    assert full["fill"]["jobs"] == 600 and full["fill"]["jobs_per_s"] > 0
    assert full["elections_during_fill"] == 0
    assert all(b and b > 0 for b in full["bytes_per_job"]), full["bytes_per_job"]
    # The state machine's own share, measured in process: at least the 256-byte payload, its id
    # and key, at most what the docs say it was before the bare-id results and the tuple-less FIFO.
    assert 256 + 36 + 21 < result["state_machine_bytes_per_job"] < 1087, result["state_machine_bytes_per_job"]
    assert all(v["ms"] is not None for v in full["cluster_ms"].values()), full["cluster_ms"]
    assert 0 < full["beside_backlog"]["p50_ms"] <= full["beside_backlog"]["p99_ms"]
    for key in ("wiped_follower_catch_up", "leader_kill_to_write", "restart_all_to_write"):
        assert full[key]["seconds"] is not None and full[key]["seconds"] > 0, (key, full[key])
    assert all(r and r > 0 for r in full["rss_mb_after_restart"]), full["rss_mb_after_restart"]
    assert not list(tmp_path.glob("raftq-scale-*")), "the cluster's directory was left behind"


def test_bench_backlog_refuses_bad_sizes_and_urls():
    code, out, err = raftq("bench", "--backlog", "lots")
    assert code == 2 and "comma-separated job counts" in err
    code, out, err = raftq("bench", "--backlog", "10", "--urls", "http://127.0.0.1:1")
    assert code == 2 and "drop --urls" in err
    code, out, err = raftq("bench", "--backlog", "10", "--tuning", "no_value")
    assert code == 2 and "takes KEY=VALUE" in err


# ---------------------------------------------------------------------------- configuration, keys, moves, audit
def test_config_keys_moves_and_audit_commands(make_cluster, tmp_path):
    """config show | diff | apply, keys add | list | remove, dlq move, purge, queue delete,
    pause --create and audit, on a cluster of their own (they change its configuration and keys)."""
    c = make_cluster(storage={"dead_letter_retention_ms": 3_600_000})
    urls = c.urls
    # show prints TOML that applies back as it is.
    code, shown, err = raftq("config", "show", urls=urls)
    assert code == 0 and shown.startswith("# configuration version 1 "), (shown, err)
    path = tmp_path / "cluster.toml"
    path.write_text(shown)
    code, out, err = raftq("config", "diff", str(path), urls=urls)
    assert code == 0 and "matches the configuration in force (version 1)" in out, (out, err)
    path.write_text(shown.replace("max_reserve_batch = 256", "max_reserve_batch = 64")
                    + '\n[[queues]]\nname = "mail"\nmax_queue_depth = 1\n')
    code, out, err = raftq("config", "diff", str(path), urls=urls)
    assert code == 0 and "~ limits.max_reserve_batch: 256 -> 64" in out and "+ queues[mail]" in out, out
    # apply asks first; without a terminal it says to pass --yes, and nothing changes.
    code, out, err = raftq("config", "apply", str(path), urls=urls)
    assert code == 2 and "--yes" in err, err
    assert json.loads(raftq("config", "show", "--json", urls=urls)[1])["version"] == 1
    code, out, err = raftq("config", "apply", str(path), "--yes", urls=urls)
    assert code == 0 and "configuration version 2" in out, (out, err)
    views = c.wait_converged()
    assert [(v["config_version"], v["toml_differs"]) for v in views] == [(2, True)] * 3
    code, out, err = raftq("status", urls=urls)
    assert code == 0 and "2*" in out and "differs from the configuration in force" in out, out
    # A file a node would refuse: refused naming the key, exit 1, nothing changes.
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\ndefault_max_attempts = 200\n")
    code, out, err = raftq("config", "apply", str(bad), "--yes", urls=urls)
    assert code == 1 and "limits.default_max_attempts" in err, err
    assert json.loads(raftq("config", "show", "--json", urls=urls)[1])["version"] == 2

    # Moves: one job dead-lettered by hand, the rest purged, then the empty queue deleted.
    with SyncClient(urls, transport="http", timeout=15) as client:
        ids = [client.enqueue("reports", "t", b"x").job_id for _ in range(3)]
    code, out, err = raftq("dlq", "move", "reports", ids[0], "--reason", "bad input", urls=urls)
    assert code == 0 and f"dead-lettered {ids[0]}" in out, (out, err)
    code, out, err = raftq("dlq", "list", "--queue", "reports", "--json", urls=urls)
    [rec] = json.loads(out)
    assert (rec["job"]["id"], rec["cause"], rec["last_reason"]) == (ids[0], "admin", "bad input")
    code, out, err = raftq("purge", "reports", urls=urls)
    assert code == 2 and "--yes" in err
    code, out, err = raftq("purge", "reports", "--yes", urls=urls)
    assert code == 0 and "purged 2 job(s)" in out, (out, err)
    code, out, err = raftq("queue", "delete", "reports", urls=urls)
    assert code == 1 and "not empty" in err, err                  # its dead letter is still there
    assert raftq("dlq", "delete", ids[0], urls=urls)[0] == 0
    code, out, err = raftq("queue", "delete", "reports", urls=urls)
    assert code == 0 and "queue reports deleted" in out, (out, err)
    code, out, err = raftq("queue", "delete", "mail", urls=urls)
    assert code == 1 and "declared" in err, err
    code, out, err = raftq("pause", "nightly", urls=urls)
    assert code == 1 and "neither exists nor is declared" in err, err
    assert raftq("pause", "nightly", "--create", urls=urls)[0] == 0

    # Keys: the first must be admin; add prints the key once (stdout), the cluster keeps its digest.
    code, out, err = raftq("keys", "add", "ops", "operator", urls=urls)
    assert code == 1 and "first API key must be an admin key" in err, err
    code, root, err = raftq("keys", "add", "root", "admin", urls=urls)
    assert code == 0 and re.fullmatch(r"rq_\S{20,}\n", root) and "shown only this once" in err, (root, err)
    root = root.strip()
    assert raftq("queues", urls=urls)[0] != 0                     # auth is on now, on every node
    admin = {"RAFTQ_API_KEY": root}
    code, ops_key, err = raftq("keys", "add", "ops", "operator", urls=urls, env=admin)
    assert code == 0, err
    code, out, err = raftq("keys", "list", "--json", urls=urls, env=admin)
    assert {(k["name"], k["role"], k["added_by"]) for k in json.loads(out)} == {("root", "admin", None),
                                                                               ("ops", "operator", "root")}
    assert root not in out and ops_key.strip() not in out
    assert raftq("queues", urls=urls, env={"RAFTQ_API_KEY": ops_key.strip()})[0] == 0
    code, out, err = raftq("keys", "remove", "root", urls=urls, env=admin)
    assert code == 1 and "last admin key" in err, err
    assert raftq("keys", "remove", "ops", urls=urls, env=admin)[0] == 0
    assert raftq("queues", urls=urls, env={"RAFTQ_API_KEY": ops_key.strip()})[0] != 0

    # The audit trail names who did what, newest first.
    code, out, err = raftq("audit", "--json", "--limit", "100", urls=urls, env=admin)
    assert code == 0, err
    trail = [(e["who"], e["action"], e["target"]) for e in json.loads(out)]
    assert trail == [("root", "key_remove", "ops"), ("root", "key_add", "ops"), (None, "key_add", "root"),
                     (None, "pause", "nightly"), (None, "queue_delete", "reports"),
                     (None, "dead_letters_delete", None), (None, "purge", "reports"),
                     (None, "dead_letter_move", "reports"), (None, "config_change", None),
                     (None, "config_seed", None)], trail
    code, out, err = raftq("audit", "--limit", "3", urls=urls, env=admin)
    assert code == 0 and out.splitlines()[0].split()[:4] == ["WHEN", "WHO", "ACTION", "TARGET"], out
    assert "key_remove" in out.splitlines()[1] and "root" in out.splitlines()[1]


def _queue_stats(name, **extra):
    base = {"name": name, "declared": True, "paused": False, "ready": 3, "scheduled": 0, "in_flight": 1,
            "dead_lettered": 2, "enqueued": 9, "acked": 4, "nacked": 2, "dead_lettered_total": 2}
    return {**base, **extra}


def test_queues_shows_workers_expired_and_what_holds_jobs_back(monkeypatch, capsys):
    """Synthetic answers: a queue with the visibility fields and the gating ones (circuit, window,
    throttled) present, one of a node that sends none of them (older, or without the features)."""
    from raftq.cluster import cli
    from raftq.cluster.cli import commands

    full = _queue_stats("busy", paused=True, expired_total=5, workers=0, no_workers=True,
                        dead_lettered_by_cause={"attempts_exhausted": 0, "rejected": 0, "lease_expired": 1,
                                                "admin": 0, "expired": 1},
                        circuit={"state": "half_open", "failures": 3, "opened_at_ms": 1_700_000_000_000,
                                 "open_until_ms": None, "opened_total": 2},
                        window_open=False, throttled=7, throttle_deferred_total=11)
    bare = _queue_stats("plain")
    known = _queue_stats("served", expired_total=0, workers=2, no_workers=False, circuit=None, window_open=True,
                         throttled=0)
    idle = _queue_stats("idle", ready=0, workers=0, no_workers=True)      # nothing waits: no note

    async def call(self, op, method, path, body=None, *, mutating=False):
        if path == "/v1/queues":
            return {"queues": [full, bare, known, idle]}
        return {**{"/v1/queues/busy": full, "/v1/queues/plain": bare}[path], "limits": {}}

    async def connect(self):
        return None

    monkeypatch.setattr(commands.Ctx, "call", call)
    monkeypatch.setattr(commands.Ctx, "connect", connect)
    assert cli.main(["queues", "--urls", "http://h1"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0].split()
    assert head[:6] == ["QUEUE", "PAUSED", "READY", "SCHEDULED", "IN_FLIGHT", "DEAD"]
    assert head[-3:] == ["EXPIRED", "WORKERS", "NOTES"]
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.split() and line.split()[0] in
            ("busy", "plain", "served", "idle")}
    assert rows["busy"].rstrip().endswith("paused, no workers, circuit half open, window closed, 7 throttled")
    assert re.search(r"\b5\s+0\s+paused", rows["busy"]), rows["busy"]
    assert re.search(r"-\s+-\s+-$", rows["plain"].rstrip()), rows["plain"]       # nothing known: dashes
    assert re.search(r"\b0\s+2\s+-$", rows["served"].rstrip()), rows["served"]
    assert re.search(r"\b0\s+-$", rows["idle"].rstrip()), rows["idle"]
    assert cli.main(["queues", "busy", "--urls", "http://h1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^expired \(total\) +5$", out, re.M), out
    assert re.search(r"^dead letters by cause +lease_expired 1, expired 1$", out, re.M), out
    assert re.search(r"^workers \(last 30 s\) +0 - NO WORKERS", out, re.M), out
    assert re.search(r"^circuit +half open, 3 failure\(s\), opened 2 time\(s\)$", out, re.M), out
    assert re.search(r"^execution window +closed", out, re.M), out
    assert re.search(r"^throttled now +7$", out, re.M) and re.search(r"^throttle deferrals \(total\) +11$", out, re.M)
    assert cli.main(["queues", "plain", "--urls", "http://h1"]) == 0
    out = capsys.readouterr().out
    assert "workers" not in out and "circuit" not in out and "expired" not in out


# ---------------------------------------------------------------------------- the README's table
def _command_tree(parser) -> dict:
    """{command path: its parser} for every command `raftq --help` lists, nested ones included."""
    import argparse
    out = {}

    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                listed = {c.dest for c in a._choices_actions}
                for name, sp in a.choices.items():
                    if name in listed:
                        out[path + (name,)] = sp
                        walk(sp, path + (name,))
    walk(parser, ())
    return out


def _readme_command_spans() -> list[str]:
    """Every `raftq ...` code span in the first cell of the README's command table."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| command | what |"):]
    table = table[:table.index("\n\n")]
    spans = []
    for row in table.splitlines()[2:]:
        first = row.split(" | ")[0]
        spans += re.findall(r"`(raftq [^`]*)`", first)
    return spans


def test_the_readme_command_table_covers_every_command_with_real_options():
    """The table is checked against the parser: every command `raftq --help` offers has a row,
    and every option a row names is one that command takes."""
    from raftq.cluster.cli.main import build_parser
    tree = _command_tree(build_parser())
    groups = {path[:-1] for path in tree if len(path) > 1}
    leaves = {path for path in tree if path not in groups}
    covered = set()
    for span in _readme_command_spans():
        words = span.replace("\\|", "|").split()[1:]
        path, paths = (), []
        while words and any(p[:len(path) + 1] == path + (words[0].split("|")[0],) for p in tree):
            alternatives = words.pop(0).split("|")    # `raftq local pause|resume|restart|wipe NODE`
            paths = [path + (a,) for a in alternatives]
            path = paths[0]
        assert paths and all(p in tree for p in paths), f"README row {span!r} names no command"
        covered.update(paths)
        takes = {s for p in paths for a in tree[p]._actions for s in a.option_strings}
        for opt in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", span):
            assert opt in takes or path in (("bench",), ("chaos",)), f"README row {span!r}: {opt} is not an option"
    missing = sorted(" ".join(p) for p in leaves - covered)
    assert not missing, f"commands with no row in README.md's command table: {missing}"
