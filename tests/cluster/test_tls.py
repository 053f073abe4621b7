"""Native TLS of the HTTP API and the session, with real node processes and real TLS on loopback:
a client over https (session and HTTP, a follower's 307 to an https leader, the worker), plain
HTTP to a TLS node and https to a plain one, a client that does not trust the CA, mTLS with and
without a client certificate, SIGHUP reloads (a new CA while a client keeps calling, bad files
kept out), `raftq up --tls`, `raftq config init --tls`, and config errors naming the key."""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
import re
import shlex
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from raftq.cluster import certs as C
from raftq.cluster.client import Client, SyncClient, TlsError
from raftq.cluster.local import LocalCluster, free_ports, http_json
from raftq.cluster.worker import Worker
from raftq.node.core.limits import ConfigError
from raftq.node.base.settings import TlsFiles, load, parse
from raftq.node.base.tls import load as load_tls
from tests.conftest import poll
from tests.cluster.test_up import ROOT, Up, env, raftq


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("tls"), tls=True).launch()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def mtls_cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("mtls"), tls="mtls").launch()
    try:
        yield c
    finally:
        c.close()


def other_ca(directory: Path, name="other CA"):
    """A second CA with a certificate for 127.0.0.1 (server) and one for a client, in `directory`."""
    ca, ca_key = C.make_ca(name)
    C.write_pair(directory / "other-ca.pem", directory / "other-ca-key.pem", ca, ca_key)
    return ca, ca_key


def served_cert(port: int):
    """The certificate a new TLS connection to 127.0.0.1:port is served (not verified)."""
    from cryptography import x509
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s, ctx.wrap_socket(s) as t:
        return x509.load_der_x509_certificate(t.getpeercert(True))


def fingerprint(cert) -> str:
    from cryptography.hazmat.primitives import serialization
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def log_text(c: LocalCluster, i: int) -> str:
    return c.log_path(i).read_text(errors="replace")


# ---------------------------------------------------------------------------- a client over https
@pytest.mark.parametrize("transport", ["session", "http"])
async def test_a_client_enqueues_reserves_and_acks_over_tls(tls_cluster, transport):
    c = tls_cluster
    assert all(u.startswith("https://") for u in c.urls)
    async with Client(c.urls, transport=transport, **c.client_options()) as client:
        ids = [(await client.enqueue(f"tls-{transport}", "t", f"job {i}")).job_id for i in range(5)]
        got = []
        while len(got) < 5:
            for job in await client.reserve([f"tls-{transport}"], 30_000, max_jobs=5, wait_ms=1000):
                await client.ack(job)
                got.append(job.id)
        assert sorted(got) == sorted(ids)
        q = await client.queue(f"tls-{transport}")
        assert (q["acked"], q["ready"], q["in_flight"]) == (5, 0, 0)
        assert client.stats["sessions"] == (1 if transport == "session" else 0)
    assert "client closed the connection" not in log_text(c, 0)      # nothing was refused on the way


async def test_a_follower_redirects_to_the_https_leader_over_http_and_the_session(tls_cluster):
    c = tls_cluster
    leader = c.wait_leader()
    follower = (leader + 1) % c.n
    ctx = ssl.create_default_context(cafile=str(c.ca_file))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
        async with http.post(c.urls[follower] + "/v1/jobs", json={"queue": "redir", "job_type": "t"},
                             allow_redirects=False, headers={"Raftq-Redirect": "1"}) as r:
            assert r.status == 307
            assert r.headers["Location"] == c.urls[leader] + "/v1/jobs"
    for transport in ("http", "session"):
        async with Client(c.urls, transport=transport, **c.client_options()) as client:
            client.leader = c.urls[follower]          # as if it had led a moment ago
            await client.enqueue("redir", "t", b"x")
            assert client.stats["redirects"] >= 1
            assert client.leader == c.urls[leader]
            if transport == "session":
                assert client._session.url == c.urls[leader]


def test_the_sync_client_and_the_worker_run_over_tls(tls_cluster):
    c = tls_cluster
    with SyncClient(c.urls, **c.client_options()) as sc:
        job_id = sc.enqueue("tls-worker", "echo", b"hello").job_id

    done = []

    async def run():
        async with Client(c.urls, **c.client_options()) as client:
            async def echo(job):
                done.append((job.id, job.payload))
            w = Worker(client, ["tls-worker"], {"echo": echo}, wait_ms=300)
            task = asyncio.create_task(w.run())
            end = time.monotonic() + 20
            while not done and time.monotonic() < end:
                await asyncio.sleep(0.05)
            w.stop()
            await asyncio.wait_for(task, 20)
            return await client.queue("tls-worker")

    q = asyncio.run(run())
    assert done == [(job_id, b"hello")]
    assert q["acked"] == 1


# ---------------------------------------------------------------------------- wrong scheme, untrusted CA
async def test_plain_http_to_a_tls_node_is_answered_clearly(tls_cluster):
    c = tls_cluster
    plain = [u.replace("https://", "http://") for u in c.urls]
    status, body = http_json("GET", plain[0] + "/v1/cluster")
    assert status == 400 and body["error"]["code"] == "tls_required"
    assert f"use {c.urls[0]}" in body["error"]["message"]
    if shutil.which("curl"):
        out = subprocess.run(["curl", "-sS", plain[0] + "/v1/queues"], capture_output=True, text=True, timeout=10)
        assert "serves HTTPS only" in out.stdout, out
    for transport in ("session", "http"):
        t0 = time.monotonic()
        with pytest.raises(TlsError) as e:
            async with Client(plain, transport=transport, **c.client_options()) as client:
                await client.enqueue("q", "t", b"x")
        assert time.monotonic() - t0 < 5                    # at once, not at the call's deadline
        assert "serves HTTPS only" in str(e.value) and plain[0] in str(e.value)
    assert c.leader() is not None                          # the nodes serve on


async def test_https_to_a_plain_node_says_it_does_not_answer_tls():
    async def hello(request):
        return web.json_response({"role": "leader"})
    app = web.Application()
    app.router.add_get("/v1/cluster", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_ports(1)[0]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        with pytest.raises(TlsError) as e:
            async with Client([f"https://127.0.0.1:{port}"], verify=False) as client:
                await client.enqueue("q", "t", b"x")
        assert "does not answer TLS" in str(e.value) and "use http://" in str(e.value)
    finally:
        await runner.cleanup()


async def test_a_client_that_does_not_trust_the_ca_is_refused_and_told_why(tls_cluster, tmp_path):
    c = tls_cluster
    other_ca(tmp_path)
    for kw in ({}, {"ca": str(tmp_path / "other-ca.pem")}):
        for transport in ("session", "http"):
            t0 = time.monotonic()
            with pytest.raises(TlsError) as e:
                async with Client(c.urls, transport=transport, **kw) as client:
                    await client.enqueue("q", "t", b"x")
            assert time.monotonic() - t0 < 5
            msg = str(e.value)
            assert "certificate is not trusted" in msg and "ca=" in msg and "--ca" in msg, msg
            assert "certificate verify failed" not in msg or "unable to get local issuer" in msg or "self" in msg
    # verify=False (tests only) talks to it anyway.
    async with Client(c.urls, verify=False) as client:
        assert (await client.enqueue("q", "t", b"x")).job_id
    code, out, err = raftq("--urls", ",".join(c.urls), "status")
    assert code == 2 and "TLS" in err and "not trusted" in err and "--ca" in err, (out, err)
    code, out, err = raftq("--urls", ",".join(c.urls), "--ca", str(c.ca_file), "status")
    assert code == 0 and "leader:" in out, (out, err)


# ---------------------------------------------------------------------------- mTLS
async def test_mtls_refuses_a_client_without_a_certificate_and_accepts_one_with(mtls_cluster, tmp_path):
    c = mtls_cluster
    ca = str(c.ca_file)
    for transport in ("session", "http"):
        with pytest.raises(TlsError) as e:
            async with Client(c.urls, transport=transport, ca=ca) as client:
                await client.enqueue("q", "t", b"x")
        assert "requires a client certificate" in str(e.value) and "cert=" in str(e.value)

    # A certificate the CA did not sign fails the handshake itself; the client says so.
    oca, okey = other_ca(tmp_path)
    cert, key = C.make_leaf(oca, okey, "stranger", [], server=False)
    C.write_pair(tmp_path / "stranger.pem", tmp_path / "stranger-key.pem", cert, key)
    stranger = (str(tmp_path / "stranger.pem"), str(tmp_path / "stranger-key.pem"))
    t0 = time.monotonic()
    with pytest.raises(TlsError) as e:
        async with Client(c.urls, ca=ca, cert=stranger, timeout=10) as client:
            await client.enqueue("q", "t", b"x")
    assert time.monotonic() - t0 < 5
    assert "does not accept this client certificate" in str(e.value)

    # At the TLS level: without a certificate nothing reaches the API (one 401, then closed).
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", c.http_ports[0]), timeout=5) as s, \
            ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
        t.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        answer = b""
        while chunk := t.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 401") and b"client_certificate_required" in answer
    # With the stranger's certificate the handshake (or the first read after it) fails.
    ctx.load_cert_chain(*stranger)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        with socket.create_connection(("127.0.0.1", c.http_ports[0]), timeout=5) as s, \
                ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
            t.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            if not t.recv(100):
                raise ConnectionError("closed")

    for transport in ("session", "http"):
        async with Client(c.urls, transport=transport, **c.client_options()) as client:
            job_id = (await client.enqueue(f"m-{transport}", "t", b"x")).job_id
            [job] = await client.reserve([f"m-{transport}"], 30_000, wait_ms=1000)
            assert job.id == job_id
            await client.ack(job)
    code, out, err = raftq("--urls", ",".join(c.urls), "--ca", ca, "status")
    assert code == 2 and "requires a client certificate" in err and "--cert" in err, err
    cert_file, key_file = c.client_cert
    code, out, err = raftq("--urls", ",".join(c.urls), "--ca", ca, "--cert", cert_file, "--key", key_file, "status")
    assert code == 0 and "leader:" in out, (out, err)
    code, out, err = raftq("enqueue", "m-env", "t", "--data", "x", "--urls", ",".join(c.urls),
                           extra_env={"RAFTQ_CA": ca, "RAFTQ_CERT": cert_file, "RAFTQ_KEY": key_file})
    assert code == 0 and re.fullmatch(r"[0-9a-f-]{36}\n", out), (out, err)
    # Every node, read over mTLS, applies the configuration its TOML seeded (version 1).
    views = c.wait_converged(30)
    assert [(v["config_version"], v["toml_differs"]) for v in views] == [(1, False)] * c.n


# ---------------------------------------------------------------------------- reload
def test_sighup_reload_to_a_certificate_from_another_ca_keeps_serving(tmp_path):
    c = LocalCluster(tmp_path / "c", tls=True).launch()
    try:
        ca2, ca2_key = other_ca(tmp_path, "second CA")
        bundle = tmp_path / "both.pem"
        bundle.write_text(c.ca_file.read_text() + (tmp_path / "other-ca.pem").read_text())
        pids = [c.procs[i].pid for i in range(c.n)]
        term = c.cluster_view(c.wait_leader())["term"]
        failures, calls = [], [0]

        async def traffic(stop: asyncio.Event):
            async with Client(c.urls, ca=str(bundle)) as session_client, \
                    Client(c.urls, ca=str(bundle), transport="http", connections=1) as http_client:
                while not stop.is_set():
                    for client in (session_client, http_client):
                        try:
                            await client.enqueue("rot", "t", b"x")
                            calls[0] += 1
                        except Exception as e:                # noqa: BLE001 - every failure counts
                            failures.append(repr(e))
                    await asyncio.sleep(0.01)
                return session_client.stats["sessions"]

        async def more_calls(n: int):
            want, end = calls[0] + n, time.monotonic() + 30
            while calls[0] < want:
                assert time.monotonic() < end and not failures, f"calls stalled: {failures}"
                await asyncio.sleep(0.02)

        async def rotate():
            stop = asyncio.Event()
            task = asyncio.create_task(traffic(stop))
            await more_calls(10)
            old = {i: served_cert(c.http_ports[i]) for i in range(c.n)}
            for i in range(c.n):
                cert, key = C.make_leaf(ca2, ca2_key, f"{c.ids[i]} second", ["127.0.0.1", "localhost"])
                C.write_pair(c.cert_path(i), c.key_path(i), cert, key)
                c.reload_tls(i)
                end = time.monotonic() + 10
                while served_cert(c.http_ports[i]).issuer != ca2.subject:
                    assert time.monotonic() < end, f"{c.ids[i]} still serves its old certificate"
                    await asyncio.sleep(0.05)
                assert fingerprint(served_cert(c.http_ports[i])) == fingerprint(cert)
                await more_calls(10)                  # the same clients go on after each switch
            stop.set()
            return old, await task

        old, sessions = asyncio.run(rotate())
        c.client_ssl = ssl.create_default_context(cafile=str(bundle))    # the harness's probes too
        assert failures == [] and calls[0] >= 40
        assert sessions == 1                       # the session opened before the reload went on
        assert [c.procs[i].pid for i in range(c.n)] == pids and all(c.alive(i) for i in range(c.n))
        assert c.cluster_view(c.wait_leader())["term"] == term
        for i in range(c.n):
            assert old[i].issuer != ca2.subject
            text = log_text(c, i)
            assert re.search(rf"TLS: reloaded: new connections get certificate CN={c.ids[i]} second,O=raftq "
                             r"\(issuer CN=second CA,O=raftq; .*not after \d{4}-\d\d-\d\dT", text), text[-2000:]
        # New connections of a client that trusts only the first CA are refused now.
        with pytest.raises(TlsError, match="not trusted"):
            with SyncClient(c.urls, **c.client_options()) as sc:
                sc.enqueue("rot", "t", b"x")
    finally:
        c.close()


BAD_RELOADS = ["garbage certificate", "key of another certificate", "expired certificate", "missing key"]


def test_a_bad_reload_keeps_the_old_certificate(tmp_path):
    c = LocalCluster(tmp_path / "c", tls=True).launch()
    try:
        good = fingerprint(served_cert(c.http_ports[0]))
        ca_cert, ca_key = C.load_pair(c.dir / "ca.pem", c.dir / "ca-key.pem")
        past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30)
        for n, case in enumerate(BAD_RELOADS, 1):
            cert_text, key_text = c.cert_path(0).read_text(), c.key_path(0).read_text()
            if case == "garbage certificate":
                c.cert_path(0).write_text("not a certificate\n")
                why = "holds no PEM certificate"
            elif case == "key of another certificate":
                _, other_key = C.make_leaf(ca_cert, ca_key, "x", ["127.0.0.1"])
                c.key_path(0).write_text(C.key_pem(other_key))
                why = "does not match the certificate"
            elif case == "expired certificate":
                cert, key = C.make_leaf(ca_cert, ca_key, "old", ["127.0.0.1"], days=1, now=past)
                C.write_pair(c.cert_path(0), c.key_path(0), cert, key)
                why = "expired on"
            else:
                c.key_path(0).unlink()
                why = "node.tls_key: cannot read"
            c.reload_tls(0)
            poll(lambda: log_text(c, 0).count("TLS: reload failed") >= n, what=f"the failed reload ({case})")
            line = [x for x in log_text(c, 0).splitlines() if "TLS: reload failed" in x][-1]
            assert why in line and "still serving the certificate loaded before" in line, line
            assert fingerprint(served_cert(c.http_ports[0])) == good, case
            with SyncClient([c.urls[0]], **c.client_options()) as sc:
                assert sc.cluster(url=c.urls[0])["node_id"] == "n1"
            c.cert_path(0).write_text(cert_text)         # back to the good files for the next case
            c.key_path(0).write_text(key_text)
        assert c.alive(0)
    finally:
        c.close()


# ---------------------------------------------------------------------------- raftq up --tls
def test_raftq_up_tls_end_to_end(tmp_path):
    d = tmp_path / "up"
    up = Up(d, "--tls", "--base-port", "0")
    try:
        up.wait_for(r"leader: n\d at https://127\.0\.0\.1:\d+ \(term")
        curl_line = up.wait_for(r"^\s+(curl --cacert \S+ https://\S+/v1/cluster)$").group(1)
        raftq_line = up.wait_for(r"^\s+(raftq --ca \S+ --urls \S+ status)$").group(1)
        assert f"--cacert {d}/ca.pem" in curl_line and f"--ca {d}/ca.pem" in raftq_line
        for name in ("ca.pem", "ca-key.pem", "n1-cert.pem", "n1-key.pem", "n3-key.pem", "n1.toml"):
            assert stat.S_IMODE((d / name).stat().st_mode) == 0o600, name
        if shutil.which("curl"):
            out = subprocess.run(shlex.split(curl_line), capture_output=True, text=True, timeout=20)
            assert out.returncode == 0 and '"role":' in out.stdout, out
        code, out, err = raftq(*shlex.split(raftq_line)[1:])
        assert code == 0 and "leader: n" in out and "https://127.0.0.1:" in out, (out, err)
        code, out, err = up.local("status")
        assert code == 0 and "https://127.0.0.1:" in out and "leader:" in out, (out, err)
        state = up.state()
        assert state["tls"]["mode"] == "tls" and state["tls"]["ca"] == str(d / "ca.pem")
        urls = up.urls
        assert all(u.startswith("https://") for u in urls)
        with SyncClient(urls, ca=str(d / "ca.pem")) as sc:
            job = sc.enqueue("up-tls", "t", b"x")
            [got] = sc.reserve(["up-tls"], 30_000, wait_ms=1000)
            assert got.id == job.job_id
            sc.ack(got)
        ca_before = (d / "ca.pem").read_bytes()
    finally:
        assert up.stop() == 0
    # The next run with --mtls keeps the CA and adds a client certificate the nodes require.
    up = Up(d, "--mtls")
    try:
        up.wait_for(r"leader: n\d at https://")
        assert "kept from an earlier run" in up.wait_for(r"TLS with client certificates.*").group(0)
        raftq_line = up.wait_for(r"^\s+(raftq --ca \S+ --cert \S+ --key \S+ --urls \S+ status)$").group(1)
        assert (d / "ca.pem").read_bytes() == ca_before
        assert stat.S_IMODE((d / "client-key.pem").stat().st_mode) == 0o600
        code, out, err = raftq(*shlex.split(raftq_line)[1:])
        assert code == 0 and "leader: n" in out, (out, err)
        code, out, err = raftq("--ca", str(d / "ca.pem"), "--urls", ",".join(up.urls), "status")
        assert code == 2 and "requires a client certificate" in err, err
        code, out, err = up.local("status")
        assert code == 0 and "leader:" in out, (out, err)
    finally:
        assert up.stop() == 0


# ---------------------------------------------------------------------------- raftq config init --tls
def handshake(server_ctx, client_ctx, host):
    from raftq.cluster.cli.config_cmd import handshake as hs
    hs(server_ctx, client_ctx, host)


def test_config_init_tls_output_loads_and_its_certificates_verify_against_its_ca(tmp_path):
    out = tmp_path / "cfg"
    hosts = ["10.0.0.1", "node2.example", "10.0.0.3"]
    code, text, err = raftq("config", "init", "--hosts", ",".join(hosts), "--out", str(out), "--mtls")
    assert code == 0, err
    files = {"ca.pem", "ca-key.pem", "client-cert.pem", "client-key.pem",
             *(f"n{i}-{k}.pem" for i in (1, 2, 3) for k in ("cert", "key"))}
    assert files <= {p.name for p in out.iterdir()}
    assert all(stat.S_IMODE((out / f).stat().st_mode) == 0o600 for f in files)
    ca_cert = C.load_pair(out / "ca.pem", out / "ca-key.pem")[0]
    for i, host in enumerate(hosts, 1):
        s = load(out / f"n{i}.toml")
        assert s.url == f"https://{host}:7001" and all(p.url.startswith("https://") for p in s.peers)
        assert (s.tls.cert, s.tls.key, s.tls.client_ca, s.tls.peer_ca) == \
               (out / "cert.pem", out / "key.pem", out / "ca.pem", out / "ca.pem")   # next to node.toml
        cert, _ = C.load_pair(out / f"n{i}-cert.pem", out / f"n{i}-key.pem")
        assert C.issued_by(cert, ca_cert)
        loaded = load_tls(TlsFiles(cert=out / f"n{i}-cert.pem", key=out / f"n{i}-key.pem", client_ca=out / "ca.pem"))
        assert loaded.cert.names == (host,)
        client = ssl.create_default_context(cafile=str(out / "ca.pem"))
        client.load_cert_chain(str(out / "client-cert.pem"), str(out / "client-key.pem"))
        handshake(loaded.context, client, host)             # verified for its host, as a client checks it
        with pytest.raises(ssl.SSLError):
            handshake(loaded.context, client, hosts[i % 3])  # and for no other
    # Installed as the README says (node.toml next to cert.pem, key.pem, ca.pem), a node accepts it.
    etc = tmp_path / "etc"
    etc.mkdir()
    shutil.copy(out / "n1.toml", etc / "node.toml")
    for src, dst in (("n1-cert.pem", "cert.pem"), ("n1-key.pem", "key.pem"), ("ca.pem", "ca.pem")):
        shutil.copy(out / src, etc / dst)
    p = subprocess.run([sys.executable, "-m", "raftq.cluster.cli", "node", "--config", str(etc / "node.toml"),
                        "--check"], capture_output=True, text=True, env=env(), timeout=60)
    assert p.returncode == 0 and "valid config for node n1 at https://10.0.0.1:7001" in p.stdout, p.stderr
    readme = (out / "README.md").read_text()
    assert "scp n1.toml n1-cert.pem n1-key.pem ca.pem raftq.service root@10.0.0.1:/tmp/" in readme
    assert "install -m 0640 -o root -g raftq /tmp/n1-key.pem /etc/raftq/key.pem" in readme
    assert "--ca ca.pem --cert client-cert.pem --key client-key.pem" in readme
    for b in re.findall(r"```sh\n(.*?)```", readme, re.S):
        subprocess.run(["bash", "-n"], input=b, text=True, check=True)
    if shutil.which("openssl"):                     # the README's renewal recipe makes a certificate nodes take
        first = fingerprint(C.load_pair(out / "n1-cert.pem", out / "n1-key.pem")[0])
        recipe = re.search(r"```sh\n(openssl req.*?)```", readme, re.S).group(1)
        subprocess.run(["bash", "-e", "-c", recipe], cwd=out, check=True, capture_output=True, timeout=60)
        renewed = load_tls(TlsFiles(cert=out / "n1-cert.pem", key=out / "n1-key.pem"))
        assert renewed.cert.names == ("10.0.0.1",) and renewed.cert.sha256 != first
        handshake(renewed.context, ssl.create_default_context(cafile=str(out / "ca.pem")), "10.0.0.1")


# ---------------------------------------------------------------------------- config errors
CONFIG = """
[node]
id = "n1"
http = "127.0.0.1:7001"
raft = "127.0.0.1:7101"
data_dir = "data"
{tls}
[cluster]
peers = [
  {{ id = "n1", raft = "127.0.0.1:7101", url = "{url}" }},
  {{ id = "n2", raft = "127.0.0.1:7102", url = "https://127.0.0.1:7002" }},
  {{ id = "n3", raft = "127.0.0.1:7103", url = "https://127.0.0.1:7003" }},
]
"""
TLS = 'tls_cert = "cert.pem"\ntls_key = "key.pem"\n'

SHAPE_CASES = [
    ("key without certificate", 'tls_key = "key.pem"\n', "https://127.0.0.1:7001", "node.tls_cert: missing"),
    ("certificate without key", 'tls_cert = "cert.pem"\n', "https://127.0.0.1:7001", "node.tls_key: missing"),
    ("client CA without certificate", 'tls_client_ca = "ca.pem"\n', "https://127.0.0.1:7001", "node.tls_cert: missing"),
    ("tls with an http url", TLS + 'url = "http://127.0.0.1:7001"\n', "https://127.0.0.1:7001", "node.url"),
    ("an https url without tls", 'url = "https://127.0.0.1:7001"\n', "http://127.0.0.1:7001", "node.url"),
    ("tls and this node's peer entry says http", TLS, "http://127.0.0.1:7001", "cluster.peers[0].url"),
]


@pytest.mark.parametrize("name,tls,url,says", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_tls_keys_of_the_wrong_shape_are_refused_naming_the_key(name, tls, url, says):
    import tomllib
    with pytest.raises(ConfigError) as e:
        parse(tomllib.loads(CONFIG.format(tls=tls, url=url)))
    assert says in str(e.value)


def test_tls_paths_are_relative_to_the_config_file_and_the_url_defaults_to_https(tmp_path):
    path = tmp_path / "conf" / "node.toml"
    path.parent.mkdir()
    path.write_text(CONFIG.format(tls=TLS + 'tls_client_ca = "/abs/ca.pem"\n', url="https://127.0.0.1:7001"))
    s = load(path)
    assert s.url == "https://127.0.0.1:7001"
    assert (s.tls.cert, s.tls.key, s.tls.client_ca, s.tls.peer_ca) == \
           (path.parent / "cert.pem", path.parent / "key.pem", Path("/abs/ca.pem"), None)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, ca_key = C.make_ca("test CA")
    C.write_pair(d / "ca.pem", d / "ca-key.pem", ca, ca_key)
    cert, key = C.make_leaf(ca, ca_key, "n1", ["127.0.0.1"])
    C.write_pair(d / "cert.pem", d / "key.pem", cert, key)
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=400)
    old, old_key = C.make_leaf(ca, ca_key, "old", ["127.0.0.1"], days=30, now=past)
    C.write_pair(d / "old.pem", d / "old-key.pem", old, old_key)
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=10)
    soon, soon_key = C.make_leaf(ca, ca_key, "later", ["127.0.0.1"], now=future)
    C.write_pair(d / "later.pem", d / "later-key.pem", soon, soon_key)
    old_ca, old_ca_key = C.make_ca("old CA", days=30, now=past)
    C.write_pair(d / "old-ca.pem", d / "old-ca-key.pem", old_ca, old_ca_key)
    _, other_key = C.make_leaf(ca, ca_key, "other", ["127.0.0.1"])
    (d / "other-key.pem").write_text(C.key_pem(other_key))
    from cryptography.hazmat.primitives import serialization
    (d / "encrypted-key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    (d / "garbage.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    (d / "empty.pem").write_text("")
    (d / "a-dir").mkdir()
    return d


FILE_CASES = [
    ("missing certificate", dict(cert="nope.pem"), "node.tls_cert: cannot read", "No such file"),
    ("certificate is a directory", dict(cert="a-dir"), "node.tls_cert: cannot read", "directory"),
    ("certificate file is empty", dict(cert="empty.pem"), "node.tls_cert:", "is empty"),
    ("certificate is not PEM", dict(cert="garbage.pem"), "node.tls_cert:", "holds no PEM certificate"),
    ("certificate expired", dict(cert="old.pem", key="old-key.pem"), "node.tls_cert:", "expired on"),
    ("certificate not valid yet", dict(cert="later.pem", key="later-key.pem"), "node.tls_cert:", "not valid before"),
    ("missing key", dict(key="nope-key.pem"), "node.tls_key: cannot read", "No such file"),
    ("key is a certificate", dict(key="cert.pem"), "node.tls_key:", "no usable PEM private key"),
    ("key is encrypted", dict(key="encrypted-key.pem"), "node.tls_key:", "is encrypted"),
    ("key does not match", dict(key="other-key.pem"), "node.tls_key:", "does not match the certificate"),
    ("client CA missing", dict(client_ca="nope.pem"), "node.tls_client_ca: cannot read", "No such file"),
    ("client CA is not PEM", dict(client_ca="garbage.pem"), "node.tls_client_ca:", "holds no PEM certificate"),
    ("client CA expired", dict(client_ca="old-ca.pem"), "node.tls_client_ca:", "expired on"),
    ("peer CA missing", dict(peer_ca="nope.pem"), "node.tls_peer_ca: cannot read", "No such file"),
]


@pytest.mark.parametrize("name,files,key,says", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_tls_files_that_cannot_serve_are_refused_naming_the_key(pki, name, files, key, says):
    given = {"cert": "cert.pem", "key": "key.pem", **files}
    tf = TlsFiles(**{k: pki / v for k, v in given.items()})
    with pytest.raises(ConfigError) as e:
        load_tls(tf)
    assert str(e.value).startswith(key) and says in str(e.value), str(e.value)


def test_the_good_files_load(pki):
    loaded = load_tls(TlsFiles(cert=pki / "cert.pem", key=pki / "key.pem", client_ca=pki / "ca.pem",
                               peer_ca=pki / "ca.pem"))
    assert loaded.cert.subject == "CN=n1,O=raftq" and loaded.cert.names == ("127.0.0.1",)
    assert loaded.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert [c.subject for c in loaded.client_ca] == ["CN=test CA,O=raftq"]


def test_a_node_with_an_expired_certificate_stops_at_start_with_one_line(pki, tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(CONFIG.format(tls=f'tls_cert = "{pki / "old.pem"}"\ntls_key = "{pki / "old-key.pem"}"\n',
                                  url="https://127.0.0.1:7001"))
    p = subprocess.run([sys.executable, "-m", "raftq.node", "--config", str(path)], capture_output=True, text=True,
                       env=env(), cwd=str(ROOT), timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raftq node: config error: node.tls_cert: ") and \
        "expired on" in lines[0], p.stderr
