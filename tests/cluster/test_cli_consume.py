"""`raftq reserve | ack | nack | extend | release | work` against a real cluster, run as
subprocesses like a user would. One cluster serves the module; each test uses its own queues.
The leader-kill test comes last and restarts the node it killed (the fixture `healthy` checks
every node runs before each test)."""
import base64
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from raftq.cluster.client import NotFound, SyncClient
from raftq.cluster.local import LocalCluster
from tests.conftest import heal, poll

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("consume"), storage={"dead_letter_retention_ms": 3_600_000}).launch()
    yield c
    c.close()


@pytest.fixture
def healthy(cluster):
    return heal(cluster, None)


@pytest.fixture(scope="module")
def client(cluster):
    with SyncClient(cluster.urls, transport="http", timeout=20) as c:
        yield c


def cli_env(extra=None) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("RAFTQ_URLS", "RAFTQ_API_KEY")}
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra or {})
    return e


def cli_cmd(cluster, command, *args) -> list[str]:
    # --urls right after the command name: before `work`'s `--`, which ends its own options.
    return [sys.executable, "-m", "raftq.cluster.cli", command, "--urls", ",".join(cluster.urls), *args]


def raftq(cluster, *args, env=None, timeout=120):
    """Run the command line; return (exit code, stdout, stderr)."""
    p = subprocess.run(cli_cmd(cluster, *args), capture_output=True, text=True, env=cli_env(env), cwd=str(ROOT),
                       timeout=timeout, stdin=subprocess.DEVNULL)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def qname():
    return "sh-" + uuid.uuid4().hex[:8]


def counts(client, queue):
    q = client.queue(queue)
    return {k: q.get(k) for k in ("ready", "scheduled", "in_flight", "dead_lettered", "acked")}


def dead_letter(client, queue, job_id):
    return next(r for r in client.dead_letters(queue, limit=100)["records"] if r.job.id == job_id)


# ---------------------------------------------------------------------------- reserve, ack, nack, extend, release
def test_reserve_extend_ack_nack_release_round_trip(healthy, client):
    c, q = healthy, qname()
    text_id = client.enqueue(q, "text", "héllo wörld", custom={"tenant": "acme", "n": 3}).job_id
    blob = b"\xff\x00\xfe binary"
    blob_id = client.enqueue(q, "blob", blob).job_id

    code, out, err = raftq(c, "reserve", q, "--max", "5", "--lease-ms", "20000", "--worker-id", "script-1")
    assert code == 0, err
    jobs = {j["id"]: j for j in map(json.loads, out.splitlines())}
    assert set(jobs) == {text_id, blob_id}
    t, b = jobs[text_id], jobs[blob_id]
    assert (t["queue"], t["job_type"], t["attempt"], t["max_attempts"]) == (q, "text", 1, 3)
    assert t["payload"] == "héllo wörld" and t["payload_base64"] is False
    assert t["custom"] == {"tenant": "acme", "n": 3}
    assert b["payload_base64"] is True and base64.b64decode(b["payload"]) == blob
    now_ms = time.time() * 1000
    assert now_ms < t["lease_expires_at_ms"] <= now_ms + 20_000

    code, out, err = raftq(c, "extend", text_id, "--attempt", "1", "--lease-ms", "120000")
    assert code == 0, err
    extended = json.loads(out)
    assert extended["job_id"] == text_id and extended["lease_expires_at_ms"] > t["lease_expires_at_ms"] + 60_000
    assert client.job(text_id).lease_expires_at_ms == extended["lease_expires_at_ms"]

    code, out, err = raftq(c, "ack", text_id.upper(), "--attempt", "1")
    assert code == 0, err
    assert json.loads(out) == {"job_id": text_id, "attempt": 1, "acked": True}
    with pytest.raises(NotFound):
        client.job(text_id)

    # nack (queue policy: ready again at once, attempt 2) -> release (no attempt used) -> dead-letter
    code, out, err = raftq(c, "nack", blob_id, "--attempt", "1", "--error", "disk full")
    assert code == 0, err
    assert json.loads(out)["dead_lettered"] is False
    j = client.job(blob_id)
    assert (j.state, j.attempt) == ("ready", 2)
    [again] = client.reserve([q], 30_000)
    assert again.attempt == 2
    code, out, err = raftq(c, "release", blob_id, "--attempt", "2", "--reason", "not now")
    assert code == 0, err
    assert json.loads(out)["released"] is True
    j = client.job(blob_id)
    assert (j.state, j.attempt, j.releases, j.attempts_used) == ("ready", 3, 1, 2)
    [again] = client.reserve([q], 30_000)
    code, out, err = raftq(c, "nack", blob_id, "--attempt", str(again.attempt), "--dead-letter", "--reason", "corrupt")
    assert code == 0, err
    assert json.loads(out)["dead_lettered"] is True
    rec = dead_letter(client, q, blob_id)
    assert (rec.cause, rec.last_reason) == ("rejected", "corrupt")

    # Nothing left: no output, exit 0.
    code, out, err = raftq(c, "reserve", q, "--wait-ms", "200")
    assert (code, out) == (0, "")


def test_a_stale_attempt_or_a_bad_id_is_refused(healthy, client):
    c, q = healthy, qname()
    jid = client.enqueue(q, "t", "x").job_id
    [first] = client.reserve([q], 30_000)
    client.release(first)
    [second] = client.reserve([q], 30_000)
    assert second.attempt == 2

    code, out, err = raftq(c, "ack", jid, "--attempt", "1")
    assert code == 1 and out == ""
    assert "ack refused (attempt_mismatch)" in err and "in flight under attempt 2" in err, err
    assert "you no longer own it" in err
    assert client.job(jid).state == "in_flight"          # the real holder still has it

    code, out, err = raftq(c, "extend", "not-a-job", "--attempt", "1", "--lease-ms", "1000")
    assert code == 2 and "is not a job id" in err, err
    code, out, err = raftq(c, "work", q, "sh")
    assert code == 2 and "give the command after `--`" in err, err
    code, out, err = raftq(c, "work", q, "--", "no-such-command-here")
    assert code == 2 and "cannot run 'no-such-command-here': not found on PATH" in err, err
    assert client.job(jid).state == "in_flight" and client.queue(q)["nacked"] == 0


# ---------------------------------------------------------------------------- work
def test_work_runs_the_command_once_per_job_and_acks(healthy, client, tmp_path):
    c, q = healthy, qname()
    payloads = [f"job {i}\n".encode() for i in range(5)] + [b"\x00\xff raw bytes"]
    ids = [client.enqueue(q, "copy", p, custom={"tenant": f"t{i}"}).job_id for i, p in enumerate(payloads)]
    script = ('cat > "$OUT_DIR/$RAFTQ_JOB_ID"; '
              'printf "%s|%s|%s|%s|%s" "$RAFTQ_QUEUE" "$RAFTQ_JOB_TYPE" "$RAFTQ_ATTEMPT" "$RAFTQ_CUSTOM_tenant" '
              '"$RAFTQ_CUSTOM" > "$OUT_DIR/$RAFTQ_JOB_ID.env"')
    code, out, err = raftq(c, "work", q, "--concurrency", "2", "--wait-ms", "300", "--exit-when-empty",
                           "--", "sh", "-c", script, env={"OUT_DIR": str(tmp_path)})
    assert code == 0, err
    for i, (jid, p) in enumerate(zip(ids, payloads)):
        assert (tmp_path / jid).read_bytes() == p
        assert (tmp_path / f"{jid}.env").read_text() == f'{q}|copy|1|t{i}|{{"tenant": "t{i}"}}'
        assert f"raftq work: {jid} attempt 1: exit code 0 after " in err
    assert err.count(": acked") == len(ids)
    assert "stopped: 6 acked, 0 nacked, 0 dead-lettered" in err
    assert counts(client, q) == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 0, "acked": 6}


def test_work_acks_with_the_commands_stdout_as_the_result_a_dependent_reads(healthy, client):
    """--result: the command's stdout is the ack's result; here kept for the job that depends on it
    (docs/semantics.md "Dependencies"), in a queue that keeps no results of its own."""
    c, q = healthy, qname()
    first = client.enqueue(q, "upper", b"hello").job_id
    then = client.enqueue(q + "-next", "use", b"x", depends_on=[first]).job_id
    code, out, err = raftq(c, "work", q, "--max-jobs", "1", "--result", "text/plain", "--", "tr", "a-z", "A-Z")
    assert code == 0 and "stopped: 1 acked" in err, err
    res = client.result(first, timeout=10)
    assert res.succeeded and res.result == b"HELLO" and res.encoding == "text/plain"
    assert client.job(then).state == "ready"


def test_work_nacks_a_failing_command_with_its_exit_code_and_stderr_tail(healthy, client):
    c, q = healthy, qname()
    fail_id = client.enqueue(q, "fail", "x", max_attempts=1).job_id
    slow_id = client.enqueue(q, "slow", "x", max_attempts=1).job_id
    script = ('case "$RAFTQ_JOB_TYPE" in '
              'fail) echo "first line" >&2; head -c 3000 /dev/zero | tr "\\0" x >&2; echo "the end" >&2; exit 3;; '
              'slow) exec sleep 60;; esac')
    t0 = time.monotonic()
    code, out, err = raftq(c, "work", q, "--concurrency", "2", "--max-jobs", "2", "--job-timeout", "1",
                           "--", "sh", "-c", script)
    assert code == 0, err
    assert time.monotonic() - t0 < 40          # the sleep was killed, not waited for
    assert f"{fail_id} attempt 1: exit code 3 after" in err and f"{slow_id} attempt 1: timed out after 1s" in err
    assert err.count(": dead-lettered") == 2

    reason = dead_letter(client, q, fail_id).last_reason
    assert reason.startswith("exit code 3; stderr: …xxx") and reason.endswith("xxxthe end"), reason
    assert "first line" not in reason and len(reason) <= 1000
    reason = dead_letter(client, q, slow_id).last_reason
    assert reason.startswith("timed out after 1s, killed (killed by SIGTERM)"), reason
    assert counts(client, q)["dead_lettered"] == 2


def start_work(c, q, options, script, out_dir, err_file) -> subprocess.Popen:
    """`raftq work Q OPTIONS -- sh -c SCRIPT` in the background, $OUT_DIR set, stderr to err_file."""
    return subprocess.Popen(cli_cmd(c, "work", q, *options, "--", "sh", "-c", script),
                            stdout=subprocess.DEVNULL, stderr=err_file, stdin=subprocess.DEVNULL,
                            env=cli_env({"OUT_DIR": str(out_dir)}), cwd=str(ROOT))


def test_sigterm_lets_running_commands_finish_within_the_grace_then_releases(healthy, client, tmp_path):
    c, q = healthy, qname()
    quick_id = client.enqueue(q, "quick", "x").job_id
    slow_id = client.enqueue(q, "slow", "x").job_id
    script = ('touch "$OUT_DIR/started-$RAFTQ_JOB_TYPE"; '
              'if [ "$RAFTQ_JOB_TYPE" = slow ]; then echo $$ > "$OUT_DIR/slow.pid"; exec sleep 600; fi; '
              'while [ ! -e "$OUT_DIR/go" ]; do sleep 0.05; done')
    log = tmp_path / "stderr"
    with open(log, "w") as err_file:
        p = start_work(c, q, ["--concurrency", "2", "--wait-ms", "300", "--grace", "4"], script, tmp_path, err_file)
        try:
            poll(lambda: (tmp_path / "started-quick").exists() and (tmp_path / "slow.pid").exists(), 60,
                 what="both commands to start")
            slow_pid = int(poll(lambda: (tmp_path / "slow.pid").read_text().strip(), 10, what="the pid"))
            p.send_signal(signal.SIGTERM)
            poll(lambda: "SIGTERM received, shutting down gracefully" in log.read_text(), 20, what="the signal")
            (tmp_path / "go").touch()          # the quick command ends inside the grace period
            assert p.wait(60) == 0, log.read_text()
        finally:
            if p.poll() is None:
                p.kill()
    err = log.read_text()
    assert "Traceback" not in err, err
    assert f"{quick_id} attempt 1: exit code 0 after" in err and f"{slow_id} attempt 1: killed after" in err, err
    assert "released (no attempt used)" in err
    with pytest.raises(NotFound):
        client.job(quick_id)                   # acked
    j = client.job(slow_id)
    assert (j.state, j.attempt, j.releases, j.attempts_used) == ("ready", 2, 1, 1)
    with pytest.raises(ProcessLookupError):
        os.kill(slow_pid, 0)                   # the command was killed, not left behind


def test_work_through_a_leader_kill_does_every_job(healthy, client, tmp_path):
    c, q, n = healthy, qname(), 60
    ids = [r.job_id for r in client.enqueue_batch([{"queue": q, "job_type": "t",
                                                    "payload": {"data_b64": base64.b64encode(f"p{i}".encode()).decode(),
                                                                "encoding": "text/plain"}}
                                                   for i in range(n)])]
    script = 'cat > "$OUT_DIR/$RAFTQ_JOB_ID.$RAFTQ_ATTEMPT"; sleep 0.1'
    log = tmp_path / "stderr"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    done = lambda: {f.name.split(".")[0] for f in out_dir.iterdir()}      # noqa: E731
    killed = None
    with open(log, "w") as err_file:
        p = start_work(c, q, ["--concurrency", "3", "--wait-ms", "500", "--lease-ms", "5000"], script, out_dir,
                       err_file)
        try:
            poll(lambda: len(done()) >= 10, 60, what="a few jobs before the kill")
            killed = c.wait_leader(15)
            c.kill(killed)
            done_at_kill = len(done())
            c.wait_leader(30, [i for i in range(c.n) if i != killed])

            def drained():
                try:
                    return counts(client, q) == {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 0,
                                                 "acked": n}
                except Exception:
                    return False        # the election, seen from the test's own client
            poll(drained, 120, 0.2, what="the queue to drain")
            p.send_signal(signal.SIGTERM)
            assert p.wait(60) == 0, log.read_text()
        finally:
            if p.poll() is None:
                p.kill()
            if killed is not None:
                c.start(killed)
    assert done_at_kill < n, "the kill came too late to matter"
    assert done() == set(ids)                  # every job ran at least once
    for f in out_dir.iterdir():
        jid = f.name.split(".")[0]
        assert f.read_text() == f"p{ids.index(jid)}"
    err = log.read_text()
    assert "Traceback" not in err, err
    assert "stopped: " in err
