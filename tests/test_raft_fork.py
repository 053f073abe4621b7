"""The seam to the Raft fork (node/raft, FORK.md): its diff against pysyncobj 0.3.17 is current,
nothing outside it reaches its internals or patches it, and only node/replication/replica.py imports it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from raftq.node.raft import diff

ROOT = Path(__file__).resolve().parent.parent
RAFT = ROOT / "node" / "raft"
# Name-mangled internals of the fork's classes (written in two parts so this file has none).
MANGLED = tuple("_" + name + "__" for name in ("SyncObj", "TcpConnection", "FileJournal", "TcpServer",
                                               "Serializer", "MetaStorer", "JournalFile", "TCPNode"))


def sources(*dirs, exclude=()):
    for d in dirs:
        for path in sorted((ROOT / d).rglob("*.py")):
            if RAFT in path.parents or path in exclude or ".venv" in path.parts:
                continue
            yield path


def test_the_checked_in_upstream_diff_is_current():
    try:
        text = diff.render()
    except LookupError as e:
        pytest.skip(f"no reference to diff against: {e}")
    assert diff.DIFF_FILE.read_text() == text, "node/raft/upstream.diff is stale: run python -m raftq.node.raft.diff"


def test_nothing_outside_the_fork_reaches_its_name_mangled_internals():
    found = [(str(p.relative_to(ROOT)), m) for p in sources("node", "cluster", "tests") for m in MANGLED
             if m in p.read_text()]
    assert found == []


def _imports(path: Path, package: str):
    """Absolute names of the modules (and `from X import name` as X.name) a file imports."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            yield module
            for a in node.names:
                yield f"{module}.{a.name}"


def test_only_the_replica_imports_the_fork_and_nothing_imports_pysyncobj():
    offenders = []
    for path in sources("node", "cluster"):
        rel = path.relative_to(ROOT)
        package = "raftq." + ".".join(rel.parts[:-1])
        for name in _imports(path, package):
            if name.split(".")[0] == "pysyncobj":
                offenders.append((str(rel), name))
            if (name == "raftq.node.raft" or name.startswith("raftq.node.raft.")) and rel != Path("node/replication/replica.py"):
                offenders.append((str(rel), name))
    assert offenders == []
    # ... and the fork imports nothing of raftq's outside itself.
    for path in sorted(RAFT.glob("*.py")):
        for name in _imports(path, "raftq.node.raft"):
            assert name.split(".")[0] != "pysyncobj", (path.name, name)
            assert not name.startswith("raftq.") or name.startswith("raftq.node.raft"), (path.name, name)


def test_the_fork_keeps_its_licence_and_documents_every_module_it_keeps():
    assert "Copyright (c) 2016 Filipp Ozinov" in (RAFT / "LICENSE.txt").read_text()
    fork = (RAFT / "FORK.md").read_text()
    assert {p.stem for p in RAFT.glob("*.py")} == set(diff.MODULES) | set(diff.OWN) | {"diff"}
    for name in list(diff.DROPPED) + list(diff.OWN):
        assert f"{name}.py" in fork, name
    assert not set(diff.OWN) & set(diff.MODULES)      # raftq's own modules are not in the diff
