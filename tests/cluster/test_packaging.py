"""The installed wheel, not the checkout: one import name, a client without the server's
dependencies, and a node plus a client started from a venv that holds only the wheel.

Editable installs with package-dir mappings have known setuptools pitfalls (the rest of the suite
runs on one), so this proves the other kind: the wheel is built from the checkout, installed
non-editable into fresh venvs, and used from a directory where the checkout is not importable.
Needs the package index (as the README's install does); CI has it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from raftq.cluster.local import free_ports

ROOT = Path(__file__).resolve().parents[2]


def run(cmd, cwd, timeout=600, env=None):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, ROOT], cwd=out)
    wheels = list(out.glob("raftq-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def make_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    return path / "bin" / "python"


def test_the_wheel_holds_one_package_named_raftq(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"raftq"}, tops
    for must in ("raftq/__init__.py", "raftq/node/core/machine.py", "raftq/cluster/client.py", "raftq/node/api/admin.html",
                 "raftq/cluster/cli/raftq.service"):     # the unit `raftq config init` writes
        assert must in names, must
    assert not any(n.startswith("raftq/tests/") for n in names)
    # Every module of the checkout is in the wheel (a subpackage missing from pyproject's list
    # would still work in the editable install the rest of the suite runs on).
    for folder in ("node", "cluster"):
        for path in (ROOT / folder).rglob("*.py"):
            assert f"raftq/{path.relative_to(ROOT).as_posix()}" in names, f"{path} is not in the wheel"


def test_a_client_install_has_no_server_dependencies_and_a_server_install_runs_a_node(wheel, tmp_path):
    work = tmp_path / "elsewhere"          # not the checkout: only the installed package is importable
    work.mkdir()
    py = make_venv(tmp_path / "client-venv")
    run([py, "-m", "pip", "install", "-q", wheel], cwd=work)
    out = run([py, "-c", "import importlib.util as u, raftq\n"
                         "from raftq import Client, SyncClient, Worker, Retry, RetryAfter, Permanent, LeaseLost\n"
                         "print(raftq.__version__, [m for m in ('pysyncobj', 'cryptography', 'uvloop', 'node', 'cluster')"
                         " if u.find_spec(m)])"], cwd=work)
    version, missing_ok = out.split(" ", 1)
    assert version.strip() and missing_ok.strip() == "[]", out
    # `raftq node` without the server extra says what to install.
    proc = subprocess.run([tmp_path / "client-venv" / "bin" / "raftq", "node", "--config", "x.toml"], cwd=work,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "raftq[server]" in proc.stderr, proc.stderr

    py = make_venv(tmp_path / "server-venv")
    run([py, "-m", "pip", "install", "-q", f"{wheel}[server]"], cwd=work)
    port, raft = free_ports(2)
    (work / "n1.toml").write_text(f"""
[node]
id = "n1"
http = "127.0.0.1:{port}"
raft = "127.0.0.1:{raft}"
data_dir = "data"

[cluster]
peers = [{{ id = "n1", raft = "127.0.0.1:{raft}", url = "http://127.0.0.1:{port}" }}]
""")
    log = open(work / "n1.log", "wb")
    node = subprocess.Popen([py, "-m", "raftq.node", "--config", "n1.toml"], cwd=work, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        script = f"""
from raftq import SyncClient
with SyncClient(["http://127.0.0.1:{port}"]) as c:
    r = c.enqueue("wheel", "t", b"hello")
    jobs = c.reserve(["wheel"], lease_ms=10_000)
    assert [j.id for j in jobs] == [r.job_id], jobs
    c.ack(jobs[0])
    print("ok", r.job_id)
"""
        out = run([py, "-c", script], cwd=work, timeout=120)
        assert out.startswith("ok "), out
    finally:
        node.terminate()
        node.wait(30)
        log.close()
    # The README's first command, from the installed wheel instead of the checkout.
    out = run([tmp_path / "server-venv" / "bin" / "raftq", "up", "--demo", "--exit-after-demo", "--base-port", "0",
               "--dir", work / "up"], cwd=work, timeout=180)
    assert "queue demo: ready 0, in flight 0, enqueued 3, acked 3" in out, out


def test_the_sdist_holds_the_checkout_and_builds_the_same_wheel(wheel, tmp_path):
    """The source release: built by setuptools' PEP 517 hook (what `python -m build --sdist`
    calls), it holds what a build needs, and a wheel built from it alone has the same files and
    metadata as the one built from the checkout."""
    out = tmp_path / "sdist"
    out.mkdir()
    name = run([sys.executable, "-c", f"import setuptools.build_meta as b; print(b.build_sdist({str(out)!r}))"],
               cwd=ROOT).strip().splitlines()[-1]
    import raftq
    assert name == f"raftq-{raftq.__version__}.tar.gz", name
    import tarfile
    with tarfile.open(out / name) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        tar.extractall(tmp_path / "src", filter="data")
    for must in ("pyproject.toml", "README.md", "__init__.py", "node/core/machine.py", "node/api/admin.html",
                 "node/raft/LICENSE.txt", "cluster/cli/raftq.service"):
        assert must in names, must
    again = tmp_path / "again"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", again,
         tmp_path / "src" / f"raftq-{raftq.__version__}"], cwd=tmp_path)
    [rebuilt] = list(again.glob("raftq-*.whl"))
    assert rebuilt.name == wheel.name
    files = lambda w: sorted(n for n in zipfile.ZipFile(w).namelist() if not n.endswith("RECORD"))
    assert files(rebuilt) == files(wheel)


def test_the_wheel_metadata_names_one_version_and_what_each_extra_needs(wheel):
    """One version, from raftq.__version__, in the wheel's name and metadata; the command and
    both extras declared."""
    import raftq
    z = zipfile.ZipFile(wheel)
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    fields = [line.split(": ", 1) for line in meta.split("\n\n")[0].splitlines() if ": " in line]
    get = lambda k: [v for f, v in fields if f == k]
    assert get("Name") == ["raftq"] and get("Version") == [raftq.__version__]
    assert wheel.name.startswith(f"raftq-{raftq.__version__}-py3-none-any")
    assert set(get("Provides-Extra")) >= {"server", "test"}
    requires = " ".join(get("Requires-Dist"))
    for dep in ("aiohttp", "orjson", "tzdata", "cryptography", "pytest"):
        assert dep in requires, dep
    assert get("Requires-Python") == [">=3.11"]
    entry = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "raftq = raftq.cluster.cli:main" in entry


def test_the_wheel_holds_the_raft_fork_with_its_licence(wheel):
    """node/raft is raftq's fork of pysyncobj (MIT): its modules, licence, FORK.md and diff ship."""
    names = zipfile.ZipFile(wheel).namelist()
    for must in ("raftq/node/raft/syncobj.py", "raftq/node/raft/LICENSE.txt", "raftq/node/raft/FORK.md",
                 "raftq/node/raft/upstream.diff"):
        assert must in names, must
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    server = [line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra == \"server\"" in line]
    assert server and not any("pysyncobj" in line for line in server), server
