"""How often each resource bound held a client back: `raftq_bound_hits_total{bound="..."}`.

Every bound of docs/limits.md counts its hits here, under its config key's name, so an operator
sees which bound a client runs into (and a test sees that the bound it attacks is the one that
held). The counter is this process's only: a node's view, like every other metric.
"""
from __future__ import annotations

import collections

# The bounds, named by their config keys, in docs/limits.md's order. Each is always exported
# (0 until hit), so a dashboard can list them before the first hit.
BOUNDS = (
    "max_connections",                  # a new connection beyond the cap: 503 and closed
    "max_connections_evicted",          # an idle connection closed to make room for a new one
    "http_header_timeout_s",            # a request head not complete in time: connection closed
    "http_idle_timeout_s",              # an idle keep-alive connection closed
    "http_body_timeout_s",              # a request body not complete in time: 408
    "http_write_stall_timeout_s",       # an answer its client did not read for that long: closed
    "max_request_bytes",                # a body or frame too large: 413 / close 1009
    "max_inflight",                     # the node's proposals waiting for commit: 429
    "max_parked_reserves",              # long polls parked on this node: 429
    "max_session_parked_reserves",      # long polls parked by one session: 429
    "max_session_inflight",             # a session's unanswered frames: it is not read meanwhile
    "max_session_queued_bytes",         # a session's unsent answers: it is not read meanwhile
    "max_queued_answer_bytes",          # all sessions' unsent answers: those with some wait
    "session_stall_timeout_s",          # a session that read no answer for that long: closed 4008
    "max_forward_inflight",             # calls waiting on a follower's link to the leader: 429
    "max_trace_context_bytes",          # field lengths: invalid_request / 400 naming the field
    "max_encoding_bytes",
    "max_reason_bytes",
    "max_worker_id_bytes",
    "max_result_bytes",                 # an ack's result: 400 naming `result`
    # The Raft port, counted by the transport on the tick thread (raft_hits below).
    "raft_handshake_timeout_s",         # a handshake not done in time: connection closed
    "raft_max_pending_handshakes",      # the oldest handshake closed to make room for a new one
    "raft_handshake_max_frame",         # a length prefix beyond 4096 bytes before authentication
)

hits: collections.Counter = collections.Counter()

# transport refusal reason (node/raft/transport.py REFUSALS) -> the bound it is a hit of
RAFT_BOUNDS = {"handshake_timeout": "raft_handshake_timeout_s", "too_many_pending": "raft_max_pending_handshakes",
               "frame_too_large": "raft_handshake_max_frame"}


def all_hits(raft_refusals: dict) -> dict:
    """This process's hits, the Raft port's included."""
    out = dict(hits)
    for reason, bound in RAFT_BOUNDS.items():
        out[bound] = raft_refusals.get(reason, 0)
    return out


def hit(bound: str, n: int = 1) -> None:
    hits[bound] += n
