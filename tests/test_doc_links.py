"""Comments that stand in the repository: every `docs/<page>.md "<section>"` that code, tests or
deploy files point to names a page in docs/ and a heading on it, or the bold lead of one of its
paragraphs (a section renamed in the docs must take its references along)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r'docs/([a-z_-]+\.md) \\?"([^"\\]+)\\?"')


def headings(page: Path) -> set[str]:
    """A page's headings, and the bold leads that open its paragraphs as sections (docs/performance.md),
    without their backticks."""
    text = page.read_text()
    found = [m.group(1) for m in re.finditer(r"^#+ (.+)$", text, re.M)]
    found += [m.group(1) for m in re.finditer(r"^\*\*(.+?)\*\*", text, re.M)]
    return {h.replace("`", "").strip().rstrip(".") for h in found}


def references():
    for top in ("node", "cluster", "tests", "deploy"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".yaml", ".yml", ".toml", ".md") or "fixtures" in path.parts:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for m in REFERENCE.finditer(line):
                    yield f"{path.relative_to(ROOT)}:{n}", m.group(1), m.group(2)


def test_every_docs_section_named_in_the_code_exists():
    cache, missing = {}, []
    for where, page, section in references():
        if page not in cache:
            cache[page] = headings(ROOT / "docs" / page) if (ROOT / "docs" / page).exists() else None
        found = cache[page]
        # A heading may go on past the name a comment gives it ("Gating" for "Gating: throttles, ...").
        section = section.replace("`", "")
        if found is None or not any(h == section or h.startswith(section) for h in found):
            missing.append(f'{where}: docs/{page} "{section}"')
    assert not missing, "references to docs sections that do not exist:\n" + "\n".join(missing)
