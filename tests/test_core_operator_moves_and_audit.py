"""Operator moves and the audit trail (docs/semantics.md, Operator moves and the audit
trail; an operator's circuit close is in test_core_reserve_gating.py)."""
from __future__ import annotations

from helpers_core import Core


# ---------------------------------------------------------------------------- recorded actions
def test_a_recorded_action_is_one_audit_entry_and_anything_else_is_refused_untouched():
    """RECORD_ACTION (a membership change, committed outside the machine) adds one audit entry
    with the caller and the replicated time; an unknown action or a non-builtins field is
    refused as `internal` and leaves the state, digest included, as it was."""
    from raftq.node.core import ops
    c = Core()
    cmd = ops.record_action(None, "member_add", "n4", {"raft": "10.0.0.14:7101", "url": "http://10.0.0.14:7001"}, "root")
    assert c.apply(cmd) == (200, {"action": "member_add"})
    assert [(e["action"], e["target"], e["who"], e["at_ms"]) for e in c.m.audit_page(10, None)[0]] == \
        [("member_add", "n4", "root", c.now)]
    before = c.m.digest()
    for bad in (ops.record_action(None, "config_change", None, {}, "root"),      # not a recordable action
                ops.record_action(None, "member_add", 5, {}, "root"),
                ops.record_action(None, "member_add", "n4", {"raft": object()}, "root"),
                ops.record_action(None, "member_add", "n4", ["not", "a", "dict"], "root"),
                ops.record_action(None, "member_remove", "n4", {}, 7)):           # who: a name or None
        status, body = c.apply(bad)
        assert status == 500 and body["error"]["code"] == "internal", (bad, body)
        assert c.m.digest() == before
    c.m.check_invariants()
