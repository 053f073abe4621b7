"""Config sections a user gives `raftq up --config FILE` and `raftq config init --include FILE`:
`[limits]`, `[storage]`, `[[queues]]`, `[auth]` (and `[tuning]`), checked exactly as a node's
config is (raftq.node.base.settings.parse, the same errors naming the key), then written into every
node config the command makes."""
from __future__ import annotations

import tomllib
from pathlib import Path

from ...node.core.limits import ConfigError
from ...node.base.settings import parse
from ..local import toml_key, toml_table, toml_value

SECTIONS = ("limits", "storage", "queues", "auth", "tuning")
WRITTEN_BY_US = ("node", "cluster")


def parse_sections(text: str, source: str) -> dict:
    """The sections of a TOML text, checked; raises ConfigError naming the file and the key."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: not valid TOML: {e}")
    for key in doc:
        if key in WRITTEN_BY_US:
            raise ConfigError(f"{source}: [{key}]: not allowed here, the command writes [node] and [cluster] "
                              f"itself; give only {', '.join(f'[{s}]' for s in SECTIONS)}")
        if key not in SECTIONS:
            raise ConfigError(f"{source}: {key}: unknown section (known: {', '.join(SECTIONS)})")
    check(doc, source)
    return doc


def load_sections(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the file ({e.strerror})")
    return parse_sections(text, str(path))


def check(sections: dict, source: str) -> None:
    """Validate the sections inside a complete node config, as a node would at start."""
    doc = {"node": {"id": "n1", "http": "127.0.0.1:1", "raft": "127.0.0.1:2", "data_dir": "data"},
           "cluster": {"peers": [{"id": "n1", "raft": "127.0.0.1:2", "url": "http://127.0.0.1:1"}]},
           **sections}
    try:
        parse(doc, source=source)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}")


def render(sections: dict) -> str:
    """The sections as TOML text (tables, then [[queues]]), for a node config."""
    out = []
    for name in ("limits", "storage", "tuning"):
        if sections.get(name):
            out.append(toml_table(name, sections[name]))
    auth = sections.get("auth")
    if auth:
        keys = auth.get("api_keys") or []
        out.append("[auth]\napi_keys = [\n" + "".join(f"  {toml_value(k)},\n" for k in keys) + "]\n")
    for q in sections.get("queues") or []:
        out.append("[[queues]]\n" + "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in q.items()))
    return "\n".join(out)
