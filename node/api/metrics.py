"""`GET /metrics`: this node's view in the Prometheus text exposition format (version 0.0.4).

Every node answers from its own state, like `/v1/cluster`: scrape all three and aggregate by the
`node` label. The queue figures are the node's applied state (a follower's trail the leader's by
its replication lag); take them from the node where `raftq_leader` is 1.
"""
from __future__ import annotations

from ..replication.proposer import STAGES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (metric suffix, key in the queue stats, help)
_QUEUE_GAUGES = (("ready", "ready", "jobs ready to be reserved"),
                 ("scheduled", "scheduled", "jobs waiting for their time"),
                 ("in_flight", "in_flight", "jobs reserved under a lease"),
                 ("dead_letters", "dead_lettered", "dead letters kept"))
_QUEUE_COUNTERS = (("enqueued", "jobs enqueued"), ("acked", "jobs acked"), ("nacked", "nacks"),
                   ("dead_lettered_total", "jobs dead-lettered"))


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Text:
    def __init__(self, node: str):
        self.node = _label(node)
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str, samples):
        """samples: [(labels dict, value)]; the node label is added to each."""
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            extra = "".join(f',{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f'{name}{{node="{self.node}"{extra}}} {_number(value)}')

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _number(v) -> str:
    if v is None:
        return "NaN"
    if isinstance(v, bool):
        return "1" if v else "0"
    return repr(float(v)) if isinstance(v, float) else str(int(v))


def render(view: dict, queues: list[dict], inflight: int, gauges: dict | None = None, hits=None,
           raft_refusals: dict | None = None, forwarding: dict | None = None) -> str:
    """`view` is NodeService.cluster()'s body (without digest), `queues` the queue stats;
    `gauges` the node's open connections, sessions, parked long polls and Raft handshakes,
    `hits` the bound hits (node/base/bounds.py), `raft_refusals` the Raft port's refused
    connections by reason (node/raft/transport.py REFUSALS), `forwarding` the follower's link
    to the leader (node/service/forwarding.py ForwardLink.figures)."""
    t = _Text(view["node_id"])
    _node(t, view)
    _proposer(t, view.get("proposer", {}), inflight)
    _connections(t, gauges or {}, raft_refusals or {}, hits or {})
    _forwarding(t, forwarding or {})
    _state(t, view)
    _queues(t, queues)
    _queue_limits(t, queues)
    return t.text()


def _node(t: _Text, view: dict) -> None:
    """Raft role, term and indexes, peers, the disk."""
    t.family("raftq_leader", "gauge", "1 on the node that leads the cluster", [({}, view["role"] == "leader")])
    t.family("raftq_ready", "gauge", "1 when the node knows a leader and has applied what it knows is committed",
             [({}, view["ready"])])
    t.family("raftq_raft_term", "gauge", "the node's current Raft term", [({}, view["term"])])
    t.family("raftq_raft_commit_index", "gauge", "the highest log index the node knows committed",
             [({}, view["commit_index"])])
    t.family("raftq_raft_last_applied", "gauge", "the highest log index applied to the node's state",
             [({}, view["last_applied"])])
    t.family("raftq_peer_connected", "gauge", "1 while the node's Raft link to the peer is up",
             [({"peer": m["id"]}, m["connected"]) for m in view["members"] if m["id"] != view["node_id"]])
    t.family("raftq_journal_syncs_total", "counter", "journal fsyncs (fsync durability)",
             [({}, view.get("journal_syncs", 0))])
    disk = view.get("disk") or {}
    t.family("raftq_disk_damage_found_total", "counter", "damage the disk checks found since the node started "
             "(journal, snapshot and meta file checksums), by kind",
             [({"kind": k}, n) for k, n in sorted((disk.get("findings") or {}).items())])
    t.family("raftq_log_verified", "gauge", "0 while the node's log is not trusted for voting (it was damaged and "
             "has not caught up with a leader yet)", [({}, disk.get("log_verified", True))])
    t.family("raftq_disk_free_bytes", "gauge", "free space of the data disk (NaN when no reserve is set)",
             [({}, disk.get("free_bytes"))])
    t.family("raftq_disk_low_space", "gauge", "1 while the data disk is below storage.min_free_bytes (writes refused)",
             [({}, disk.get("low_space", False))])


def _proposer(t: _Text, p: dict, inflight: int) -> None:
    """What this node proposed, and the stages of its commits (docs/performance.md)."""
    t.family("raftq_proposals_total", "counter", "Raft entries proposed by this node (each a batch of requests)",
             [({}, p.get("batches", 0))])
    t.family("raftq_proposed_requests_total", "counter", "requests proposed by this node",
             [({}, p.get("commands", 0))])
    t.family("raftq_commit_timed_batches_total", "counter", "batches this node proposed as leader and timed through "
             "the stages of raftq_commit_stage_seconds_total", [({}, p.get("timed_batches", 0))])
    t.family("raftq_commit_stage_seconds_total", "counter", "time the timed batches spent in each stage of a commit "
             "(docs/performance.md); divide by raftq_commit_timed_batches_total for the mean",
             [({"stage": stage[:-3]}, p.get(stage, 0) / 1e6) for stage in STAGES])
    t.family("raftq_overloaded_total", "counter", "requests refused with 429 overloaded",
             [({}, p.get("overloaded", 0))])
    t.family("raftq_commit_timeouts_total", "counter", "requests not committed within the request timeout",
             [({}, p.get("timeouts", 0))])
    t.family("raftq_refused_low_space_total", "counter", "requests refused with 503 unavailable because the data "
             "disk was below its reserve", [({}, p.get("refused", 0))])
    t.family("raftq_requests_in_flight", "gauge", "requests proposed and not yet answered", [({}, inflight)])


def _connections(t: _Text, g: dict, raft_refusals: dict, hits: dict) -> None:
    """Connections, sessions, long polls, the Raft port's refusals and the bounds hit (docs/limits.md)."""
    from ..base.bounds import BOUNDS
    t.family("raftq_http_connections", "gauge", "HTTP connections open on this node (sessions included)",
             [({}, g.get("connections"))])
    t.family("raftq_sessions", "gauge", "session WebSockets open on this node", [({}, g.get("sessions"))])
    t.family("raftq_parked_reserves", "gauge", "long-poll reserves waiting on this node",
             [({}, g.get("parked_reserves"))])
    t.family("raftq_parked_reserve_queues", "gauge", "queue names that long-poll reserves wait on (each named "
             "once however many wait on it; 0 when none waits)", [({}, g.get("parked_reserve_queues"))])
    t.family("raftq_raft_pending_handshakes", "gauge", "incoming Raft-port connections in their handshake",
             [({}, g.get("raft_pending_handshakes"))])
    # Every reason the transport knows is in raft_refusals (0 until it happens).
    refused = {r: n for r, n in raft_refusals.items() if r != "pending"}
    t.family("raftq_raft_refused_connections_total", "counter", "Raft-port connections refused or closed before or "
             "outside the protocol, by reason (auth_failed: a wrong secret or not the Raft protocol; see docs/limits.md)",
             [({"reason": r}, n) for r, n in refused.items()])
    t.family("raftq_bound_hits_total", "counter", "times a resource bound held a client back, by the bound's "
             "config key (docs/limits.md)", [({"bound": b}, hits.get(b, 0)) for b in BOUNDS])


def _forwarding(t: _Text, f: dict) -> None:
    """A follower's calls forwarded to the leader (docs/api.md "Followers"); 0 on a node whose
    clients all call it while it leads."""
    t.family("raftq_forwarded_calls_total", "counter", "calls this node forwarded to the leader, by way (link: the "
             "job operations over the forward link; http: the other calls)",
             [({"via": "link"}, f.get("forwarded", 0)), ({"via": "http"}, f.get("forwarded_http", 0))])
    t.family("raftq_forward_calls_in_flight", "gauge", "calls waiting on the forward link (sent and not answered, "
             "or waiting for a leader); at most tuning.max_forward_inflight", [({}, f.get("in_flight", 0))])
    t.family("raftq_forward_link_connected", "gauge", "1 while the forward link to the leader is open",
             [({}, f.get("connected", False))])
    t.family("raftq_forward_link_connects_total", "counter", "times the forward link was opened (once, then once "
             "per new leader or lost connection)", [({}, f.get("connects", 0))])
    t.family("raftq_forward_resent_total", "counter", "calls sent again, with their request ids, because the "
             "leader was lost while they were forwarded to it", [({}, f.get("resent", 0))])
    t.family("raftq_forward_run_here_total", "counter", "calls that waited on the forward link and ran on this "
             "node because it was elected", [({}, f.get("run_here", 0))])
    refused = f.get("refused") or {}
    t.family("raftq_forward_refused_total", "counter", "forwarded calls this node answered itself, by reason "
             "(max_forward_inflight: 429; forward_wait_s: 503, no leader within the wait; lost: 503 applied null, "
             "the leader lost and no other took the call within the wait)",
             [({"reason": r}, refused.get(r, 0)) for r in ("max_forward_inflight", "forward_wait_s", "lost")])


def _state(t: _Text, view: dict) -> None:
    """CPU by part and the sizes of the replicated state."""
    cpu = view.get("cpu", {})
    t.family("raftq_cpu_seconds_total", "counter", "process CPU time by part (http: event loop, raft: tick "
             "thread outside apply, apply: the state machine)",
             [({"part": part}, cpu.get(f"{part}_s")) for part in ("http", "raft", "apply")])
    state = view.get("state", {})
    t.family("raftq_jobs", "gauge", "jobs held (ready, scheduled and in flight)", [({}, state.get("jobs", 0))])
    t.family("raftq_dedup_records", "gauge", "idempotency records held", [({}, state.get("dedup_records", 0))])
    t.family("raftq_request_id_records", "gauge", "request-id records held", [({}, state.get("request_ids", 0))])
    t.family("raftq_schedules", "gauge", "schedules held (docs/semantics.md \"Schedules\")",
             [({}, state.get("schedules", 0))])
    # workflows (docs/semantics.md "Workflows")
    t.family("raftq_retained_jobs", "gauge", "finished jobs kept with their results (retention, or for live "
             "dependents)", [({}, state.get("retained_jobs", 0))])
    t.family("raftq_retained_result_bytes", "gauge", "bytes of the results kept, every queue",
             [({}, state.get("retained_result_bytes", 0))])
    t.family("raftq_waiting_jobs", "gauge", "jobs waiting on their dependencies", [({}, state.get("waiting_jobs", 0))])
    t.family("raftq_batches", "gauge", "batches kept, open or finished (limits.max_batches)",
             [({}, state.get("batches", 0))])


def _queues(t: _Text, queues: list[dict]) -> None:
    """Per queue: its gauges, paused, circuit and window."""
    for suffix, key, help_ in _QUEUE_GAUGES:
        t.family(f"raftq_queue_{suffix}", "gauge", help_, [({"queue": q["name"]}, q[key]) for q in queues])
    t.family("raftq_queue_paused", "gauge", "1 while the queue is paused", [({"queue": q["name"]}, q["paused"])
                                                                          for q in queues])
    # gating: circuit breakers, execution windows, throttles (docs/api.md "Gating: throttles,
    # circuit breakers, execution windows")
    t.family("raftq_queue_circuit_open", "gauge", "1 while the queue's circuit breaker is open or half open "
             "(reserve skips it, or takes one probe job); 0 when closed or without a breaker",
             [({"queue": q["name"]}, (q.get("circuit") or {}).get("state", "closed") != "closed") for q in queues])
    t.family("raftq_queue_window_open", "gauge", "1 while the queue is inside one of its execution windows "
             "(always 1 without windows)", [({"queue": q["name"]}, q.get("window_open", True)) for q in queues])


def _queue_limits(t: _Text, queues: list[dict]) -> None:
    """Per queue: throttles, keys, counters, dead letters and workers."""
    t.family("raftq_queue_throttled", "gauge", "ready jobs held back now because their resource is full",
             [({"queue": q["name"]}, q.get("throttled", 0)) for q in queues])
    t.family("raftq_throttle_deferred_total", "counter", "times reserve held a ready job back because its "
             "resource was full", [({"queue": q["name"]}, q.get("throttle_deferred_total", 0)) for q in queues])
    # keys (docs/semantics.md "Keys"): labelled by queue only, never one series per key
    t.family("raftq_queue_keys", "gauge", "keys with state in the queue (jobs ready or in flight, or hand-outs "
             "inside their rate window)", [({"queue": q["name"]}, q.get("keys", 0)) for q in queues])
    t.family("raftq_queue_keys_at_limit", "gauge", "keys held now at their concurrency or rate limit",
             [({"queue": q["name"]}, q.get("keys_at_limit", 0)) for q in queues])
    t.family("raftq_queue_ready_held_by_keys", "gauge", "ready jobs waiting because their key is at a limit",
             [({"queue": q["name"]}, q.get("ready_held_by_keys", 0)) for q in queues])
    for key, help_ in _QUEUE_COUNTERS:
        name = key if key.endswith("_total") else f"{key}_total"
        t.family(f"raftq_queue_{name}", "counter", f"{help_} since the queue was created",
                 [({"queue": q["name"]}, q[key]) for q in queues])
    t.family("raftq_jobs_expired_total", "counter", "jobs dead-lettered because their deadline passed before "
             "they started (cause expired), since the queue was created",
             [({"queue": q["name"]}, q.get("expired_total", 0)) for q in queues])
    t.family("raftq_dead_letters", "gauge", "dead letters kept, by cause",
             [({"queue": q["name"], "cause": c}, n) for q in queues
              for c, n in (q.get("dead_lettered_by_cause") or {}).items()])
    t.family("raftq_queue_workers", "gauge", "distinct workers that reserved from the queue in the last 30 s "
             "(the leader's count; NaN on a follower and in a new leader's first 30 s)",
             [({"queue": q["name"]}, q.get("workers")) for q in queues])
