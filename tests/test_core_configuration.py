"""Configuration: the limits, their defaults and per-queue overrides, and a configuration
that is wrong fails loudly naming its key (docs/semantics.md, Configuration is
replicated state; docs/configuration.md)."""
from __future__ import annotations

import pytest

from raftq.node.core.limits import ConfigError, Limits


BAD_CONFIGS = [
    ("unknown limits key", dict(limits={"max_lease_ms": 5}), "limits.max_lease_ms"),
    ("unknown storage key", dict(storage={"persist": 1}), "storage.persist"),
    ("queue-only key in limits", dict(limits={"allowed_job_types": ["a"]}), "allowed_job_types"),
    ("storage key in limits", dict(limits={"dedup_window_ms": 5}), "dedup_window_ms"),
    ("unknown queue key", dict(queues=[{"name": "q", "colour": "red"}]), "colour"),
    ("global key in a queue", dict(queues=[{"name": "q", "max_reserve_batch": 5}]), "max_reserve_batch"),
    ("default attempts above ceiling", dict(limits={"default_max_attempts": 101}), "default_max_attempts"),
    ("queue ceiling below default", dict(queues=[{"name": "q", "max_attempts_ceiling": 2}]), "default_max_attempts"),
    ("queue default above ceiling", dict(queues=[{"name": "q", "default_max_attempts": 200}]), "default_max_attempts"),
    ("default attempts zero", dict(limits={"default_max_attempts": 0}), "default_max_attempts"),
    ("retry delay above max", dict(limits={"retry_delay_ms": 10, "retry_delay_max_ms": 5}), "retry_delay_ms"),
    ("queue retry delay above max", dict(queues=[{"name": "q", "retry_delay_ms": 4_000_000}]), "retry_delay_ms"),
    ("negative retry delay", dict(limits={"retry_delay_ms": -1}), "retry_delay_ms"),
    ("retry max zero", dict(limits={"retry_delay_max_ms": 0}), "retry_delay_max_ms"),
    ("bad backoff", dict(limits={"retry_backoff": "linear"}), "retry_backoff"),
    ("priority 10", dict(limits={"default_priority": 10}), "default_priority"),
    ("priority -1", dict(queues=[{"name": "q", "default_priority": -1}]), "default_priority"),
    ("lease zero", dict(limits={"max_lease_duration_ms": 0}), "max_lease_duration_ms"),
    ("lease string", dict(limits={"max_lease_duration_ms": "5"}), "max_lease_duration_ms"),
    ("lease bool", dict(limits={"max_lease_duration_ms": True}), "max_lease_duration_ms"),
    ("lease float", dict(limits={"max_lease_duration_ms": 5.0}), "max_lease_duration_ms"),
    ("reserve batch zero", dict(limits={"max_reserve_batch": 0}), "max_reserve_batch"),
    ("reserve queues zero", dict(limits={"max_reserve_queues": 0}), "max_reserve_queues"),
    ("enqueue batch zero", dict(limits={"max_enqueue_batch": 0}), "max_enqueue_batch"),
    ("wait zero", dict(limits={"max_wait_timeout_ms": 0}), "max_wait_timeout_ms"),
    ("request id window zero", dict(limits={"request_id_window_ms": 0}), "request_id_window_ms"),
    ("queue name bytes too big", dict(limits={"max_queue_name_bytes": 65_536}), "max_queue_name_bytes"),
    ("queue name bytes zero", dict(limits={"max_queue_name_bytes": 0}), "max_queue_name_bytes"),
    ("strict not a bool", dict(limits={"strict_queues": "yes"}), "strict_queues"),
    ("negative depth", dict(limits={"max_queue_depth": -1}), "max_queue_depth"),
    ("payload above request", dict(limits={"max_payload_bytes": 2_000, "max_request_bytes": 1_000}), "max_payload_bytes"),
    ("custom entries zero", dict(limits={"max_custom_entries": 0}), "max_custom_entries"),
    ("horizon zero", dict(queues=[{"name": "q", "max_schedule_horizon_ms": 0}]), "max_schedule_horizon_ms"),
    ("encodings not a list", dict(limits={"allowed_encodings": "json"}), "allowed_encodings"),
    ("encodings with empty", dict(limits={"allowed_encodings": [""]}), "allowed_encodings"),
    ("job types empty", dict(queues=[{"name": "q", "allowed_job_types": []}]), "allowed_job_types"),
    ("job types with empty", dict(queues=[{"name": "q", "allowed_job_types": ["a", ""]}]), "allowed_job_types"),
    ("negative retention", dict(storage={"dead_letter_retention_ms": -1}), "dead_letter_retention_ms"),
    ("dedup window zero", dict(storage={"dedup_window_ms": 0}), "dedup_window_ms"),
    ("queue dedup window zero", dict(queues=[{"name": "q", "dedup_window_ms": 0}]), "dedup_window_ms"),
    ("sweep limit zero", dict(storage={"sweep_limit": 0}), "sweep_limit"),
    ("sweep interval zero", dict(storage={"sweep_interval_ms": 0}), "sweep_interval_ms"),
    ("queue entry not a table", dict(queues=["q"]), "queues[0]"),
    ("queue without a name", dict(queues=[{"max_queue_depth": 1}]), "name"),
    ("queue name dot", dict(queues=[{"name": "."}]), "name"),
    ("queue name slash", dict(queues=[{"name": "a/b"}]), "name"),
    ("queue name control", dict(queues=[{"name": "a\nb"}]), "name"),
    ("queue name too long", dict(limits={"max_queue_name_bytes": 3}, queues=[{"name": "abcd"}]), "name"),
    ("queue declared twice", dict(queues=[{"name": "q"}, {"name": "q"}]), "twice"),
]


def test_defaults_are_sepps():
    lim = Limits.build()
    q = lim.queue("anything")
    assert (q.max_lease_duration_ms, q.default_max_attempts, q.max_attempts_ceiling, q.default_priority,
            q.retry_delay_ms, q.retry_backoff, q.retry_delay_max_ms, q.max_queue_depth,
            q.max_payload_bytes, q.max_custom_entries, q.max_custom_total_bytes,
            q.max_custom_key_bytes, q.max_schedule_horizon_ms, q.allowed_encodings,
            q.allowed_job_types, q.dedup_window_ms, q.declared) == \
        (300_000, 3, 100, 0, 0, "none", 3_600_000, None, 1_048_576, 64, 16_384, 256,
         2_592_000_000, None, None, 86_400_000, False)
    assert (lim.max_reserve_batch, lim.max_reserve_queues, lim.max_wait_timeout_ms,
            lim.max_enqueue_batch, lim.max_queue_name_bytes, lim.max_job_type_bytes,
            lim.max_idempotency_key_bytes, lim.strict_queues, lim.max_request_bytes,
            lim.request_id_window_ms) == (256, 32, 300_000, 256, 512, 256, 256, False, 16 * 2**20, 60_000)
    assert (lim.dead_letter_retention_ms, lim.dedup_window_ms, lim.sweep_interval_ms, lim.sweep_limit) == \
        (0, 86_400_000, 1_000, 10_000)


def test_queue_overrides_merge_over_limits():
    lim = Limits.build(limits={"default_max_attempts": 5, "allowed_encodings": ["a"]},
                       storage={"dedup_window_ms": 1_000},
                       queues=[{"name": "emails", "max_lease_duration_ms": 9, "allowed_job_types": ["x"]}])
    q = lim.queue("emails")
    assert q.declared and q.name == "emails"
    assert (q.max_lease_duration_ms, q.default_max_attempts, q.allowed_encodings, q.allowed_job_types,
            q.dedup_window_ms) == (9, 5, ("a",), ("x",), 1_000)
    assert lim.queue("other").max_lease_duration_ms == 300_000
    d = q.describe()
    assert d["allowed_job_types"] == ["x"] and d["allowed_encodings"] == ["a"] and d["dedup_window_ms"] == 1_000


def test_fingerprint_changes_with_any_limit():
    assert Limits.build().fingerprint() == Limits.build().fingerprint()
    assert Limits.build().fingerprint() != Limits.build(limits={"max_reserve_batch": 7}).fingerprint()
    assert Limits.build().fingerprint() != Limits.build(queues=[{"name": "q"}]).fingerprint()


def test_server_info_limits():
    info = Limits.build(limits={"allowed_encodings": [], "strict_queues": True}).server_info()
    assert info["restricts_encodings"] is True and info["allowed_encodings"] == []
    assert info["strict_queues"] is True and info["max_lease_duration_ms"] == 300_000
    assert Limits.build().server_info()["restricts_encodings"] is False


@pytest.mark.parametrize("name,kwargs,mentions", BAD_CONFIGS, ids=[b[0] for b in BAD_CONFIGS])
def test_bad_configuration_fails_loudly_naming_the_key(name, kwargs, mentions):
    with pytest.raises(ConfigError) as exc:
        Limits.build(**kwargs)
    assert mentions in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_edge_configurations_are_accepted():
    Limits.build(limits={"max_queue_depth": 0, "retry_delay_ms": 5, "retry_delay_max_ms": 5,
                         "default_max_attempts": 100, "allowed_encodings": []})
    Limits.build(limits={"max_queue_depth": None, "max_queue_name_bytes": 65_535})
    Limits.build(queues=[{"name": "q", "max_attempts_ceiling": 2, "default_max_attempts": 2}])
    Limits.build(storage={"dead_letter_retention_ms": 0})


def test_execution_timeout_and_duplicate_policy_config_keys_are_checked():
    from raftq.node.core.limits import ConfigError, Limits
    with pytest.raises(ConfigError, match="execution_timeout_ms"):
        Limits.build(queues=[{"name": "a", "execution_timeout_ms": 0}])
    with pytest.raises(ConfigError, match="duplicate_policy"):
        Limits.build(limits={"duplicate_policy": "ignore"})
    lim = Limits.build(limits={"duplicate_policy": "reject"}, queues=[{"name": "a", "duplicate_policy": "replace"}])
    assert lim.queue("a").duplicate_policy == "replace" and lim.queue("b").duplicate_policy == "reject"
    assert lim.queue("b").execution_timeout_ms is None
