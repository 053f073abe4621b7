"""The operations a session (`GET /v1/session`, node/api/session.py) takes, and the role each
needs: tables that the session and the OpenAPI document (node/api/openapi.py) both read, kept
apart so that the document generator does not import the transport."""
from __future__ import annotations

from ..base.auth import OPERATOR, WORKER

# Answered without a task: prepared, proposed, and replied to from the future's callback.
FAST_OPS = frozenset(("enqueue", "enqueue_batch", "enqueue_atomic", "ack", "ack_batch", "nack", "extend", "drain",
                      "release"))
# The role each op needs when API keys are on (docs/api.md "Authentication"); read ops: viewer.
OP_ROLES = {**{op: WORKER for op in FAST_OPS}, "reserve": WORKER, "drain": OPERATOR}
READ_OPS = {
    "server_info": lambda s: s.server_info(),
    "cluster": lambda s: s.cluster_with_digest(),       # a coroutine: awaited
}
ALL_OPS = tuple(sorted(FAST_OPS | {"reserve"} | set(READ_OPS)))
