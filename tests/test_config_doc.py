"""docs/configuration.md is generated from the config code and cannot drift from it.

* the checked-in file is exactly what `python -m raftq.node.config_doc` prints;
* every key the parser accepts is described, and nothing else is;
* every range, choice and required key the reference states is what the parser enforces: the
  bound itself is accepted, a value just outside is refused with an error naming the key;
* the defaults the reference states for keys read outside the default tables are the parser's;
* the example config in the reference is a valid config.
"""
import re
import tomllib
from pathlib import Path

import pytest

from raftq.node import config_doc as D
from raftq.node.core import limits as L
from raftq.node.base import settings as S
from raftq.node.core.limits import ConfigError

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"


def test_checked_in_reference_is_the_generated_one():
    assert DOC.read_text() == D.render(), (
        "docs/configuration.md is out of date: run `.venv/bin/python -m raftq.node.config_doc > docs/configuration.md`")


def test_every_key_of_the_code_is_described_and_no_other():
    assert D.check_schema() == []


def base_doc() -> dict:
    return {"node": {"id": "n1", "http": "127.0.0.1:7001", "raft": "127.0.0.1:7101", "data_dir": "d"},
            "cluster": {"peers": [{"id": "n1", "raft": "127.0.0.1:7101", "url": "http://127.0.0.1:7001"}]}}


# Keys bound to another key (the "rule" column): set that one out of the way.
COMPANIONS = {"max_attempts_ceiling": {"default_max_attempts": 1}, "max_request_bytes": {"max_payload_bytes": 1}}


def with_value(header: str, key: str, value) -> dict:
    doc = base_doc()
    if header == "[limits]" and key in COMPANIONS:
        doc["limits"] = {**COMPANIONS[key], key: value}
        return doc
    if header == "[node]":
        doc["node"][key] = value
    elif header == "[cluster]":
        doc["cluster"][key] = value
    elif header.startswith("[cluster] peers"):
        doc["cluster"]["peers"][0][key] = value
    elif header.startswith("[auth]"):
        doc["auth"] = {"api_keys": [{"name": "k", "key": "secret-key", key: value}]}
    elif header == "[[queues]]":
        doc["queues"] = [{"name": "q", key: value}]
    elif header == "[[schedules]]":
        doc["schedules"] = [{**schedule_base(key), key: value}]
    else:
        doc[header.strip("[]")] = {key: value}
    return doc


def schedule_base(key: str) -> dict:
    """A schedule that parses, with a cron rule when `key` belongs to one, else an interval."""
    rule = {"cron": "* * * * *"} if key in ("cron", "time_zone") else {"every_ms": 60000}
    return {"name": "s", **rule, "job": {"queue": "q", "job_type": "t"}}


def refused(doc, key):
    with pytest.raises(ConfigError) as e:
        S.parse(doc)
    assert key in str(e.value), f"the error does not name {key}: {e.value}"


CASES = [(h, k, spec) for h, keys, _, _ in D.SECTIONS for k, spec in keys.items()]


@pytest.mark.parametrize("header,key,spec", CASES, ids=[f"{h} {k}" for h, k, _ in CASES])
def test_stated_range_is_the_enforced_one(header, key, spec):
    step = 1 if spec.type == "integer" else 0.001
    if spec.minimum is not None:
        S.parse(with_value(header, key, spec.minimum))
        refused(with_value(header, key, spec.minimum - 1), key)
    if spec.maximum is not None:
        S.parse(with_value(header, key, spec.maximum))
        refused(with_value(header, key, spec.maximum + 1), key)
    if spec.positive:
        S.parse(with_value(header, key, step))
        refused(with_value(header, key, 0), key)
    if spec.choices:
        for c in spec.choices:
            S.parse(with_value(header, key, c))
        refused(with_value(header, key, "no-such-choice"), key)
    if spec.required:
        doc = base_doc()
        if header == "[node]":
            del doc["node"][key]
        elif header == "[cluster]":
            del doc["cluster"][key]
        elif header.startswith("[cluster] peers"):
            del doc["cluster"]["peers"][0][key]
        elif header.startswith("[auth]"):
            doc["auth"] = {"api_keys": [{k: v for k, v in (("name", "k"), ("key", "secret-key")) if k != key}]}
        elif header == "[[queues]]":
            doc["queues"] = [{}]
        elif header == "[[schedules]]":
            doc["schedules"] = [{k: v for k, v in schedule_base(key).items() if k != key}]
        refused(doc, key)
    if header not in ("[node]", "[cluster]", "[cluster] peers = [ { … } ]", "[auth] api_keys = [ { … } ]"):
        refused(with_value(header, "no_such_key_" + key, 1), "no_such_key_" + key)


TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "table"}


@pytest.mark.parametrize("header,keys,defaults", [(h, k, d) for h, k, d, _ in D.SECTIONS if d is not None],
                         ids=[h for h, _, d, _ in D.SECTIONS if d is not None])
def test_stated_type_is_the_default_values_type(header, keys, defaults):
    for key, spec in keys.items():
        value = defaults[key]
        if value is None:
            continue
        want = TYPES[type(value)]
        assert spec.type == want or (spec.type == "number" and want == "integer"), (header, key, spec.type, want)


def test_defaults_read_outside_the_tables():
    s = S.parse(with_value("[auth] api_keys = [ { … } ]", "name", "k"))
    assert s.durability == "fsync" and s.secret is None and s.url == "http://127.0.0.1:7001"
    assert s.api_keys[0]["role"] == "admin"
    text = DOC.read_text()
    assert '| `role` | string | `"admin"` |' in text and '| `durability` | string | `"fsync"` |' in text
    q = L.Limits.build(storage={"dedup_window_ms": 5000}, queues=[{"name": "q"}])
    assert q.queue("q").dedup_window_ms == 5000          # [[queues]] dedup_window_ms: the storage value


def test_example_config_is_valid():
    block = re.search(r"```toml\n(.*?)```", DOC.read_text(), re.S).group(1)
    s = S.parse(tomllib.loads(block))
    assert s.node_id == "n1" and len(s.peers) == 3 and "emails" in s.limits.queues


@pytest.mark.parametrize("limits,key", [
    ({"default_max_attempts": 5, "max_attempts_ceiling": 4}, "default_max_attempts"),
    ({"retry_delay_ms": 10, "retry_delay_max_ms": 9}, "retry_delay_ms"),
    ({"max_payload_bytes": 10, "max_request_bytes": 9}, "max_payload_bytes"),
])
def test_checks_between_keys(limits, key):
    doc = base_doc()
    doc["limits"] = limits
    refused(doc, key)
    doc = base_doc()
    doc["queues"] = [{"name": "q", **{k: v for k, v in limits.items() if k in L.QUEUE_KEYS}}]
    if "max_request_bytes" in limits:
        doc["limits"] = {"max_request_bytes": limits["max_request_bytes"], "max_payload_bytes": 1}
    refused(doc, key)
