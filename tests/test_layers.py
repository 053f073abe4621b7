"""The layers of the code, as docs/cluster.md "Design" draws them, and that every import points
down: an `ast` walk over every import in node/ and cluster/ (those inside functions too).

node/ from the bottom up:
* node/core: the replicated state machine and the pure rules it applies (no I/O, no clock, no
  threads); node/raft: the Raft fork. Neither imports anything of raftq outside itself.
* node/base: what the layers above share: the node's settings file, TLS material, API keys and
  roles, requests validated into commands, the bounds that refuse them.
* node/replication: the Raft replica around the core, the proposer, membership, backups.
* node/service: what one node does for a call (NodeService), whatever the transport.
* node/api: the transports: HTTP, the WebSocket session, the OpenAPI document, metrics, guards.
* the entry points at node/'s top: the server process, the node benchmark, the config reference.
cluster/ talks to a cluster from outside and may use node/ (the command line starts a node);
node/ never imports cluster/. No two modules import each other, directly or round a cycle.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"node.core": 0, "node.raft": 0, "node.base": 1, "node.replication": 2, "node.service": 3,
          "node.api": 4, "node": 5, "cluster": 6}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> tuple[str, int]:
    """The deepest folder in LAYERS that holds `module`."""
    best = max((name for name in LAYERS if module == name or module.startswith(name + ".")), key=len)
    return best, LAYERS[best]


def imports_of(path: Path, module: str) -> set[str]:
    """raftq modules `module` imports (names resolved to modules where they are modules)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.Import):
            found |= {a.name[len("raftq."):] for a in n.names if a.name.startswith("raftq.")}
        elif isinstance(n, ast.ImportFrom):
            if n.level == 0:
                if not (n.module or "").startswith("raftq."):
                    continue
                base = n.module[len("raftq."):]
            else:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - n.level + 1] + ([n.module] if n.module else []))
            for a in n.names:
                sub = f"{base}.{a.name}" if base else a.name
                found.add(sub if (ROOT / (sub.replace(".", "/") + ".py")).exists()
                          or (ROOT / sub.replace(".", "/") / "__init__.py").exists() else base)
    return {m for m in found if m}


def graph() -> dict[str, set[str]]:
    files = [p for top in ("node", "cluster") for p in (ROOT / top).rglob("*.py")]
    return {module_of(p): imports_of(p, module_of(p)) for p in files}


def test_every_import_points_down_or_sideways_within_a_layer():
    up = []
    for module, deps in graph().items():
        here, rank = layer_of(module)
        for dep in deps:
            if not dep.startswith(("node", "cluster")):
                continue            # the package's own __init__ (its version), outside the layers
            there, dep_rank = layer_of(dep)
            if dep_rank > rank or (rank == 0 and there != here):
                up.append(f"{module} ({here}) imports {dep} ({there})")
    assert not up, "imports that point up (docs/cluster.md \"Design\"):\n" + "\n".join(sorted(up))


def test_no_import_cycles():
    g = graph()
    cycles, state = [], {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(g.get(m, ())):
            if d not in g:
                continue
            if state.get(d) == "open":
                cycles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_layers_cover_every_folder_of_node():
    folders = {module_of(p.parent / "__init__.py") for p in (ROOT / "node").rglob("__init__.py")}
    assert folders <= set(LAYERS), f"folders without a layer: {sorted(folders - set(LAYERS))}"
