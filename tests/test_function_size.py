"""A size rule that keeps functions readable at once: outside node/raft (the Raft fork, kept close
to upstream), no function grows past 70 lines (docs/cluster.md "Design"). LONG lists any that
are longer, with their length; the list only shrinks: a listed function may get shorter (then
lower its number, or drop it once it is within the rule), never longer, and no new one joins.
Every function was split to fit when the rule came in, so the list starts empty.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 70
# "path:qualified name": lines (`python tests/test_function_size.py` prints the ones over LIMIT).
LONG: dict[str, int] = {}


def functions():
    """(path:qualname, lines) of every function in node/ (but node/raft) and cluster/."""
    for top in ("node", "cluster"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("node/raft/"):
                continue
            yield from _walk(ast.parse(path.read_text(), rel), rel, "")


def _walk(node, rel, prefix):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                yield f"{rel}:{name}", child.end_lineno - child.lineno + 1
            yield from _walk(child, rel, name + ".")


def test_no_function_grows_past_the_limit():
    grown = []
    for where, n in functions():
        allowed = LONG.get(where, LIMIT)
        if n > allowed:
            grown.append(f"{where}: {n} lines (allowed {allowed})")
    assert not grown, (f"functions over {LIMIT} lines (split them; tests/test_function_size.py):\n"
                       + "\n".join(grown))


def test_the_list_of_long_functions_is_current():
    """A listed function that got shorter lowers its number (or leaves the list)."""
    now = dict(functions())
    stale = [f"{where}: listed {n}, now {now.get(where, 'gone')}" for where, n in LONG.items()
             if now.get(where, 0) < n]
    assert not stale, "shrink tests/test_function_size.py's LONG:\n" + "\n".join(stale)


if __name__ == "__main__":
    for where, n in sorted(functions(), key=lambda f: -f[1]):
        if n > LIMIT:
            print(f"    {where!r}: {n},")
