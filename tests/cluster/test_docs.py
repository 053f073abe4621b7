"""Every example of README.md and docs/*.md runs as pasted.

The shell (```sh) and Python (```python) blocks of each document run in document order against a
local cluster of real node processes that this test starts for that document (a fresh one per
document, so each one's examples start from an empty queue state, as a reader's first run does).

* Ports: the documents use the ports of `raftq up` (HTTP 7001-7003, Raft 7101-7103). Other
  clusters may hold those on a shared machine, so the test starts its cluster on free ports and
  rewrites 7001-7003 / 7101-7103 in the examples to them, and sets RAFTQ_URLS (the command
  line's default node list) to the cluster's URLs. A document whose cluster serves gRPC
  (`"grpc": true` in its directive, below) uses 50051-50053 for the nodes' gRPC ports: they are
  rewritten to the cluster's the same way. Nothing else in an example is changed.
* Working directory: a temporary one holding `.venv`, a link to the environment that runs the
  tests, so `.venv/bin/raftq` and `.venv/bin/python` work as in a checkout.
* Shell blocks run with bash `-euo pipefail`, one after the other, variables carrying over from
  block to block (a reader's shell); Python blocks run as scripts with the venv's python. A block
  that fails fails the test with its file, line, the script and its output.
* A block marked ```sh no-run (why) or ```python no-run (why) is not run: each is reported as a
  skipped test with its reason (`pytest -rs` lists them).
* A document can ask for a cluster config with an HTML comment, `<!-- doc-test cluster: {json
  of LocalCluster keyword arguments} -->`; the document itself says in words what it assumes.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raftq.cluster.local import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
DIRECTIVE = re.compile(r"<!--\s*doc-test cluster:\s*(\{.*?\})\s*-->", re.S)
RUNNABLE = {"sh", "python"}
PORTS = re.compile(r"(?<![0-9])(70[0-9][1-9]|710[1-9])(?![0-9])")
GRPC_PORTS = re.compile(r"(?<![0-9])(5005[1-9])(?![0-9])")
BLOCK_TIMEOUT = 120


def blocks(path: Path) -> list[dict]:
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        lang, info, body = m.group(1), m.group(2).strip(), m.group(3)
        if lang not in RUNNABLE:
            continue
        line = text.count("\n", 0, m.start()) + 1
        skip = None
        if info.startswith("no-run"):
            skip = info[len("no-run"):].strip(" :()") or "marked no-run"
        elif info:
            raise AssertionError(f"{path.name}:{line}: unknown fence info {info!r} (use `no-run (why)`)")
        out.append({"lang": lang, "code": body, "line": line, "skip": skip, "doc": path})
    return out


ALL = [b for d in DOCS for b in blocks(d)]
SKIPPED = [b for b in ALL if b["skip"]]
RUN_DOCS = [d for d in DOCS if any(b["doc"] == d and not b["skip"] for b in ALL)]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("block", SKIPPED, ids=[f"{rel(b['doc'])}:{b['line']}" for b in SKIPPED])
def test_marked_no_run(block):
    pytest.skip(f"{rel(block['doc'])}:{block['line']} ({block['lang']}) not run: {block['skip']}")


def rewrite(code: str, cluster: LocalCluster) -> str:
    ports = {7000 + i + 1: p for i, p in enumerate(cluster.http_ports)}
    ports.update({7100 + i + 1: p for i, p in enumerate(cluster.raft_ports)})

    def sub(m):
        port = int(m.group(1))
        if port not in ports:
            raise AssertionError(f"an example uses port {port}, which the local cluster does not have")
        return str(ports[port])
    code = PORTS.sub(sub, code)
    if cluster.grpc_ports:
        ports = {50051 + i: p for i, p in enumerate(cluster.grpc_ports)}     # what sub() looks up now
        code = GRPC_PORTS.sub(sub, code)
    return code


SH_PRELUDE = """set -euo pipefail
[ -f "$DOCTEST_STATE" ] && source "$DOCTEST_STATE"
"""
# Keep the variables (and functions) a block defined for the next one; $DOCTEST_BASE lists the
# names a fresh bash has, which are left alone.
SH_EPILOGUE = """
{ for __v in $(compgen -v); do
    case " $DOCTEST_BASE " in *" $__v "*) ;; *) declare -p "$__v" 2>/dev/null || true ;; esac
  done; declare -f; } > "$DOCTEST_STATE.new" && mv "$DOCTEST_STATE.new" "$DOCTEST_STATE"
"""


@pytest.mark.parametrize("doc", RUN_DOCS, ids=[rel(d) for d in RUN_DOCS])
def test_examples_run(doc: Path, tmp_path):
    directive = DIRECTIVE.search(doc.read_text())
    kwargs = json.loads(directive.group(1)) if directive else {}
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    base = subprocess.run(["bash", "-c", "compgen -v"], capture_output=True, text=True).stdout.split()
    state = tmp_path / "shell-state.sh"
    ran = []
    with LocalCluster(tmp_path / "cluster", **kwargs).launch() as cluster:
        env = {**os.environ, "RAFTQ_URLS": ",".join(cluster.urls), "DOCTEST_STATE": str(state),
               "DOCTEST_BASE": " ".join(base + ["__v", "BASH_REMATCH", "PIPESTATUS", "_"]),
               "PYTHONUNBUFFERED": "1"}
        env.pop("RAFTQ_API_KEY", None)
        for b in (b for b in ALL if b["doc"] == doc and not b["skip"]):
            code = rewrite(b["code"], cluster)
            where = f"{rel(doc)}:{b['line']}"
            if b["lang"] == "sh":
                cmd = ["bash", "-c", SH_PRELUDE + code + SH_EPILOGUE]
            else:
                script = tmp_path / f"block_{b['line']}.py"
                script.write_text(code)
                cmd = [str(work / ".venv" / "bin" / "python"), str(script)]
            try:
                r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
            except subprocess.TimeoutExpired as e:
                raise AssertionError(f"{where}: the example did not finish within {BLOCK_TIMEOUT} s\n{code}\n"
                                     f"--- output\n{e.stdout}\n{e.stderr}")
            assert r.returncode == 0, (f"{where}: the example failed (exit {r.returncode})\n--- example\n{code}\n"
                                       f"--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-4000:]}")
            ran.append(where)
            if os.environ.get("DOCTEST_VERBOSE"):
                print(f"--- {where}\n{r.stdout}{r.stderr}")
    print(f"{rel(doc)}: ran {len(ran)} examples; "
          f"{sum(1 for b in SKIPPED if b['doc'] == doc)} marked no-run")


def test_count():
    """How many examples there are, and that the documents have them at all."""
    run = [b for b in ALL if not b["skip"]]
    print(f"{len(run)} examples run ({sum(b['lang'] == 'sh' for b in run)} sh, "
          f"{sum(b['lang'] == 'python' for b in run)} python), {len(SKIPPED)} marked no-run")
    assert len(run) >= 20
    for doc in ("api.md", "semantics.md", "cluster.md", "client.md"):
        assert any(b["doc"].name == doc for b in run), f"docs/{doc} has no example that runs"


def test_docs_name_every_route_code_reason_and_key():
    """docs/api.md covers the whole API: every route of the OpenAPI document, every error code,
    every rejection reason, every session op."""
    from raftq.node.core import errors
    from raftq.node.api import openapi
    api = (ROOT / "docs" / "api.md").read_text()
    doc = openapi.document()
    for path, ops in doc["paths"].items():
        for method in ops:
            assert re.search(rf"`{method.upper()} {re.escape(path)}[`?\[]", api), \
                f"docs/api.md does not describe {method.upper()} {path}"
    for code in errors.STATUS:
        assert f"`{code}`" in api, f"docs/api.md does not describe the error code {code}"
    for reason in openapi.REJECTION_REASONS:
        assert f"`{reason}`" in api, f"docs/api.md does not describe the rejection reason {reason}"
    for op in openapi.SESSION_HTTP:
        assert f"`{op}`" in api, f"docs/api.md does not describe the session op {op}"


def test_links_between_docs_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{rel(doc)}: broken link to {target}"
