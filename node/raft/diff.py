"""The fork's diff against upstream: `python -m raftq.node.raft.diff` writes node/raft/upstream.diff,
the unified diff of every module of node/raft against the module of the same name in the installed
pysyncobj 0.3.17 (the `test` extra installs it as the reference; nothing imports it at run time).
`--check` writes nothing and exits 1 when the checked-in diff is stale; tests/test_raft_fork.py
does the same. The tool itself, FORK.md, LICENSE.txt and the diff are not part of it, nor are
raftq's own modules in node/raft that have no upstream counterpart (OWN).
"""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import sys
from pathlib import Path

UPSTREAM = "pysyncobj"
UPSTREAM_VERSION = "0.3.17"
HERE = Path(__file__).resolve().parent
DIFF_FILE = HERE / "upstream.diff"
# The modules of the fork, each against upstream's module of the same name.
MODULES = ("__init__", "config", "dns_resolver", "encryptor", "fast_queue", "journal", "node", "pickle",
           "pipe_notifier", "poller", "serializer", "syncobj", "tcp_connection", "tcp_server", "transport",
           "version")
# raftq's own modules in node/raft, written new rather than changed from upstream's: no diff to
# show (FORK.md "The pure core and the Ready loop (in progress)" says what of syncobj.py each carries).
OWN = {
    "core": "the pure Raft core, syncobj.py's algorithm without its I/O (issue 36)",
    "sim": "the deterministic simulator of a cluster of cores",
    "loop": "the Ready loop: the core driven from the node's event loop (tuning.raft_engine = \"loop\")",
    "loop_link": "the Ready loop's Raft link over asyncio",
}
# Upstream's modules the fork does not have, and why.
DROPPED = {
    "atomic_replace": "os.replace (serializer.atomicReplace syncs around it in fsync durability)",
    "batteries": "replicated containers and locks; raftq has its own state machine",
    "monotonic": "time.monotonic",
    "syncobj_admin": "the admin tool of the utility protocol, which the fork removed",
    "utility": "the utility protocol's client",
    "win_inet_pton": "Windows",
}


def upstream_dir() -> Path:
    """Where the reference package is; raises LookupError when it is missing or another version."""
    spec = importlib.util.find_spec(UPSTREAM)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"{UPSTREAM} is not installed (pip install '{UPSTREAM}=={UPSTREAM_VERSION}', "
                          "or the test extra)")
    where = Path(list(spec.submodule_search_locations)[0])
    version = None
    for line in (where / "version.py").read_text().splitlines():
        if line.startswith("VERSION"):
            version = line.split("=", 1)[1].strip().strip("'\"")
    if version != UPSTREAM_VERSION:
        raise LookupError(f"{UPSTREAM} {version} is installed; the fork is of {UPSTREAM_VERSION}")
    return where


def _lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def render(upstream: Path | None = None) -> str:
    upstream = upstream or upstream_dir()
    out = [f"# node/raft (raftq's fork) against {UPSTREAM} {UPSTREAM_VERSION}, module by module.\n",
           "# Made by `python -m raftq.node.raft.diff`; tests/test_raft_fork.py fails when it is stale.\n",
           "# Why each change: node/raft/FORK.md. Upstream modules the fork does not have:\n"]
    out += [f"#   {name}.py: {why}\n" for name, why in sorted(DROPPED.items())]
    for name in MODULES:
        out += difflib.unified_diff(_lines(upstream / f"{name}.py"), _lines(HERE / f"{name}.py"),
                                    f"a/{UPSTREAM}/{name}.py", f"b/node/raft/{name}.py", n=3)
    return "".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m raftq.node.raft.diff", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if node/raft/upstream.diff is stale")
    args = p.parse_args(argv)
    try:
        text = render()
    except LookupError as e:
        print(f"raft diff: {e}", file=sys.stderr)
        return 2
    if args.check:
        if not DIFF_FILE.exists() or DIFF_FILE.read_text() != text:
            print(f"raft diff: {DIFF_FILE} is stale; run python -m raftq.node.raft.diff", file=sys.stderr)
            return 1
        return 0
    DIFF_FILE.write_text(text)
    print(f"wrote {DIFF_FILE} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
