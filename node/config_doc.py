"""docs/configuration.md, generated from the config schema: `python -m raftq.node.config_doc`.

The keys, their defaults and their Python types come from the code that reads the config:
`node/core/limits.py` (QUEUE_KEYS, GLOBAL_KEYS, STORAGE_KEYS, QUEUE_ONLY_KEYS) and `node/base/settings.py`
(NODE_KEYS, CLUSTER_KEYS, PEER_KEYS, API_ROLES, TUNING_DEFAULTS, EVENT_LOOPS, TestHooks). What the
code cannot say (what a key means, its range) is written here, once per key, in `KEYS`.
Generating fails when a key of the code has no entry here or an entry names a key the code does
not have, and tests/test_config_doc.py checks that docs/configuration.md is what this prints and
that every range written here is the one the config checks enforce (a value just outside it is
refused naming the key, the bound itself accepted).
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from .core import limits as L
from .base import settings as S
from .base.validate_schedule import BODY_KEYS


@dataclass(frozen=True)
class Key:
    type: str                       # as TOML writes it: integer, string, boolean, float, table, array
    meaning: str
    default: str | None = None      # None: the code's default (or "required"); else as written here
    required: bool = False
    minimum: int | float | None = None      # checked by tests/test_config_doc.py
    maximum: int | float | None = None
    positive: bool = False                  # > 0 (the [tuning] rule)
    choices: tuple | None = None
    rule: str = ""                  # a constraint between keys, in words (also tested where it can be)


NODE = {
    "id": Key("string", "This node's id, unique in the cluster; it must appear in `cluster.peers`.", required=True),
    "http": Key("string", "`host:port` the HTTP API listens on.", required=True),
    "url": Key("string", "The URL clients reach this node at (redirects point there, `GET /v1/cluster` lists "
               "it), and where the other nodes call it unless their `peer_urls` say otherwise. Set it when a "
               "proxy or NAT sits in front of the node. `https://` exactly when the node serves TLS (`tls_cert`), "
               "else `http://`; so must this node's entry in `cluster.peers` be.",
               default="`http://<http>` (with TLS `https://<http>`)"),
    "peer_urls": Key("table", "Member id → the URL this node calls that member's HTTP API at, where the URL the "
                     "member advertises (its `url`) is not reachable from this node: under compose the advertised "
                     "URLs are the host's published ports, which the containers cannot reach "
                     "(deploy/container/config). Used for every HTTP call between nodes: a follower's forwarding "
                     "to the leader, `GET /v1/cluster/nodes` (the admin page's node table) and a leader's "
                     "questions to the others before it hands leadership over (below its disk reserve, or when it "
                     "is removed); clients keep seeing the advertised URLs (307s, `/v1/cluster`). "
                     "`http(s)://host[:port]`, no path; with TLS the member's certificate must name that host. A member not listed is called at its `url`; this node's own entry is never "
                     "used (nothing calls it), so one table can serve every node's file. Node-local: not "
                     "replicated, and a member added online can be listed ahead of time.", default="{}"),
    "raft": Key("string", "`host:port` the Raft transport listens on, bound to exactly this address; must equal "
                "this node's entry in `cluster.peers`.", required=True),
    "data_dir": Key("string", "Where the journal, snapshot, term and vote live. A relative path is relative to "
                    "the config file.", required=True),
    "tls_cert": Key("string", "PEM file of this node's certificate (the chain, leaf first): set, the API and the "
                    "session are served over TLS only (TLS 1.2 or newer; plain HTTP gets `400 tls_required`). "
                    "Checked at start (readable, a certificate, not expired, not before its start date) and "
                    "loaded again on SIGHUP: new connections get the new files, established ones keep theirs, "
                    "files that do not load are refused and logged. A relative path is relative to the config "
                    "file. With `tls_client_ca` it must also allow client authentication (nodes present it to "
                    "each other).", default="unset", rule="with `tls_key`"),
    "tls_key": Key("string", "PEM file of the certificate's private key, unencrypted (keep it 0600 or 0640 "
                   "root:raftq); must match `tls_cert`.", default="unset", rule="with `tls_cert`"),
    "tls_client_ca": Key("string", "PEM file of the CA(s) whose client certificates the node requires (mTLS): a "
                         "certificate it did not sign fails the handshake, a client without one gets `401 "
                         "client_certificate_required` and is disconnected before any request reaches the API. "
                         "Reloaded on SIGHUP.", default="unset", rule="needs `tls_cert`"),
    "tls_peer_ca": Key("string", "PEM file of the CA(s) of the other nodes' certificates, trusted when this "
                       "node calls its peers' https URLs (`GET /v1/cluster/nodes`, which the admin page uses to show "
                       "every member); this node's certificate is presented to them as a client certificate. The file "
                       "is checked at start.",
                       default="`tls_client_ca`, else the system's CAs", rule="needs `tls_cert`"),
}
CLUSTER = {
    "peers": Key("array of tables", "Every member, this node included: `{ id, raft, url }` each (below). An odd "
                 "number (3 or 5), so that a majority survives a split; ids and Raft addresses unique. It seeds a "
                 "new cluster: after an online membership change (`raftq members`) the node follows the membership "
                 "recorded in its data dir instead. A node joining a running cluster lists the current members "
                 "and itself (so an even number is accepted).",
                 required=True),
    "secret": Key("string", "The Raft transport password (AES-GCM, authenticated). The Raft port speaks pickle: a "
                  "node refuses to start without a secret when any peer's Raft address is not loopback, and "
                  "with a weak one anywhere: fewer than 16 characters or 8 distinct ones, a repeated pattern, "
                  "under 40 bits of entropy, or a placeholder of the docs (`change-me`, `CHANGE-ME-...`). Use "
                  "`openssl rand -hex 32`, the same on every node.", default="none"),
    "durability": Key("string", "`fsync`: a change is acknowledged once it is synced to disk on a majority "
                      "(survives a power loss of every node). `memory`: once it is in the page cache of a "
                      "majority (survives process crashes and the loss of a minority of machines).",
                      choices=("fsync", "memory")),
}
PEER = {
    "id": Key("string", "The member's node id.", required=True),
    "raft": Key("string", "Its Raft `host:port`.", required=True),
    "url": Key("string", "Its advertised HTTP URL (the `node.url` of that node).", required=True),
}
API_KEY = {
    "name": Key("string", "Who the key belongs to (error messages name it).", required=True),
    "key": Key("string", "The secret the client sends as `Authorization: Bearer <key>`; visible ASCII only.",
               required=True),
    "role": Key("string", "What the key may do; each role includes the ones before it: `viewer` reads, `worker` "
                "also enqueues, reserves, acks, nacks and extends, `operator` also drains, requeues and deletes "
                "dead letters, cancels jobs and pauses queues, `admin` everything.", default='"admin"',
                choices=S.API_ROLES),
}

LIMITS = {
    "max_lease_duration_ms": Key("integer", "Longest lease a reserve or extend gets: a longer request is clamped "
                                 "to it (a reserve over several queues: to the smallest of theirs).", minimum=1),
    "default_max_attempts": Key("integer", "Deliveries a job gets when it sets no `max_attempts`.", minimum=1,
                                rule="at most `max_attempts_ceiling`"),
    "max_attempts_ceiling": Key("integer", "A job's `max_attempts` is silently clamped to this.", minimum=1,
                                rule="at least `default_max_attempts`"),
    "default_priority": Key("integer", "Priority of a job that sets none (9 is served first).", minimum=0, maximum=9),
    "retry_delay_ms": Key("integer", "Base delay of a `default` nack's retry; 0 retries at once.", minimum=0,
                          rule="at most `retry_delay_max_ms`"),
    "retry_backoff": Key("string", "`none`: every retry waits `retry_delay_ms`; `exponential`: "
                         "`retry_delay_ms` × 2^(attempt − 1).", choices=("none", "exponential")),
    "retry_delay_max_ms": Key("integer", "Cap of the retry policy's delay.", minimum=1),
    "max_queue_depth": Key("integer", "Most live jobs (ready + scheduled + in flight) a queue may hold; more are "
                           "refused with `queue_full`. Unset: unlimited.", default="unset", minimum=0),
    "max_payload_bytes": Key("integer", "Largest payload (decoded bytes); larger is refused with "
                             "`payload_too_large`.", minimum=1, rule="at most `max_request_bytes`"),
    "max_custom_entries": Key("integer", "Most entries in a job's `custom` map.", minimum=1),
    "max_custom_total_bytes": Key("integer", "Largest `custom` map: key bytes plus value bytes (strings: their "
                                  "UTF-8 length, booleans 1, numbers 8).", minimum=1),
    "max_custom_key_bytes": Key("integer", "Longest `custom` key, in UTF-8 bytes.", minimum=1),
    "max_schedule_horizon_ms": Key("integer", "How far ahead a job may be scheduled (`scheduled_too_far` beyond); "
                                   "also caps nack delays and the retry policy.", minimum=1),
    "allowed_encodings": Key("array of strings", "Payload encodings accepted (`encoding_not_allowed` otherwise). "
                             "Unset: any; `[]`: no payloads at all.", default="unset"),
    "execution_timeout_ms": Key("integer", "Execution timeout of the queue's jobs that set no `timeout_ms` "
                                "(resolved at enqueue, shown as the job's `timeout_ms`): the Worker cancels a "
                                "handler that runs longer and nacks the job as a failure, reason `timeout` "
                                "(docs/semantics.md \"Execution timeout\"). Unset: none.", default="unset",
                                minimum=1),
    "duplicate_policy": Key("string", "What an enqueue whose `idempotency_key` hits a live dedup record does "
                            "when it sets no `duplicate_policy`: `return_existing` answers the existing job's id "
                            "(`deduplicated: true`), `reject` refuses it (422 `rejected`, reason `duplicate`), "
                            "`replace` replaces the payload, priority and schedule of a job never delivered yet "
                            "(409 once it has started); docs/semantics.md \"Duplicate policy\".",
                            choices=("return_existing", "reject", "replace")),
    "max_reserve_batch": Key("integer", "Most jobs one reserve returns (`max_jobs` is clamped to it); also the "
                             "largest `POST /v1/acks` and the most records one drain returns.", minimum=1),
    "max_reserve_queues": Key("integer", "Most queues one reserve may name (more is 400).", minimum=1),
    "max_wait_timeout_ms": Key("integer", "Longest long poll: a reserve's `wait_ms` is clamped to it.", minimum=1),
    "max_enqueue_batch": Key("integer", "Most jobs in one batch or atomic enqueue (more is 400).", minimum=1),
    "max_queue_name_bytes": Key("integer", "Longest queue name, in UTF-8 bytes.", minimum=1, maximum=65535),
    "max_job_type_bytes": Key("integer", "Longest job type, in UTF-8 bytes.", minimum=1),
    "max_idempotency_key_bytes": Key("integer", "Longest idempotency key, in UTF-8 bytes.", minimum=1),
    "strict_queues": Key("boolean", "`true`: only queues declared in `[[queues]]` exist; an enqueue to another is "
                         "refused with `unknown_queue`, a reserve naming one is 409 `unknown_queues`."),
    "max_request_bytes": Key("integer", "Largest request body (and session frame); larger is 413 "
                             "`request_too_large`.", minimum=1,
                             rule="at least every queue's `max_payload_bytes`"),
    "request_id_window_ms": Key("integer", "How long the answer to a `Request-Id` is remembered (and replayed to a "
                                "repeat of that id).", minimum=1),
    "max_trace_context_bytes": Key("integer", "Longest `trace_context` of a job: `traceparent` and `tracestate` "
                                   "together, in UTF-8 bytes; longer is refused with `invalid_request` naming "
                                   "`trace_context`.", minimum=1),
    "max_encoding_bytes": Key("integer", "Longest `payload.encoding`, in UTF-8 bytes; longer is refused with "
                              "`invalid_request` naming `payload.encoding`.", minimum=1),
    "max_reason_bytes": Key("integer", "Longest nack `reason` (it becomes the job's `last_reason`), in UTF-8 bytes; "
                            "longer is 400 `invalid_argument` naming `reason`.", minimum=1),
    "max_worker_id_bytes": Key("integer", "Longest reserve `worker_id`, in UTF-8 bytes; longer is 400 "
                               "`invalid_argument` naming `worker_id`.", minimum=1),
    "max_schedules": Key("integer", "Most schedules the cluster holds; creating one more is 429 `overloaded` "
                         "(reason `too_many`). 0 allows none. Lowering it removes no schedule.", minimum=0),
    "max_schedules_per_sweep": Key("integer", "Most schedules one sweep fires the due ticks of; the others fire "
                                   "in the next sweep, at once after it.", minimum=1),
    "max_catchup_ticks": Key("integer", "Most missed ticks a schedule with catchup `all` fires in one go, the "
                             "oldest first (docs/semantics.md \"Schedules\").", minimum=1),
    "max_result_bytes": Key("integer", "Largest result an ack may carry (`result.data_b64`, decoded), in bytes; "
                            "larger is 400 `invalid_argument` naming `result` (docs/semantics.md \"Job results\").",
                            minimum=1, rule="at most `max_request_bytes` when set"),
    "max_dependencies_per_job": Key("integer", "Most entries of a job's `depends_on`; more refuses the job "
                                    "(422 `rejected`, reason `too_many_dependencies`, docs/semantics.md "
                                    "\"Dependencies\").", minimum=1, maximum=100_000),
    "max_batches": Key("integer", "Most batches the cluster keeps at once, open or finished (a finished one is kept "
                       "an hour for its status); one more is 429 `overloaded` (reason `too_many`, docs/semantics.md "
                       "\"Batches\"). 0 allows none.", minimum=0),
    "max_batch_members": Key("integer", "Most members of one batch; more is 429 `overloaded` (reason "
                             "`too_many_members`).", minimum=1, maximum=1_000_000),
    "resource_limits": Key("table", "Throttles: `{resource = max}`, the most jobs naming that `resource` (theirs or "
                           "their queue's) in flight at once, across every queue and worker. A resource without "
                           "an entry is unlimited; 0 holds all its jobs back. Reserve skips a job whose resource "
                           "is full (no attempt used, it stays ready and counts in `throttled`) and takes the next "
                           "one; a slot frees on ack, nack, release, delete and lease expiry. A raised or removed "
                           "limit frees held-back jobs at once; a lowered one leaves jobs in flight alone. Global "
                           "only: a queue cannot cap a resource of its own (give it a resource of its own). Names: "
                           "1..256 UTF-8 bytes, no control characters.", default="`{}`"),
    "max_key_bytes": Key("integer", "Longest job key (an enqueue's `key`, or the value of its queue's `key_field`), "
                         "in UTF-8 bytes; also bounds the keys `key_weights` and `key_limits` name. A longer key is "
                         "refused with `invalid_request` naming `key` (docs/semantics.md \"Keys\").", minimum=1,
                         maximum=65535),
}
STORAGE = {
    "dead_letter_retention_ms": Key("integer", "How long dead letters are kept. 0: there is no dead-letter store; "
                                    "a dead-lettered job is dropped and drain returns nothing.", minimum=0),
    "dedup_window_ms": Key("integer", "How long an idempotency key deduplicates, from the first enqueue "
                           "(whatever became of the job).", minimum=1),
    "sweep_interval_ms": Key("integer", "The leader sweeps (promotes scheduled jobs, expires leases, deadlines, "
                             "dedup records, request ids and dead letters) when something is due, and looks this "
                             "often at least; nothing due, no sweep.", minimum=1),
    "sweep_limit": Key("integer", "Most entries each phase of one sweep handles; the rest waits for the next "
                       "sweep, which then follows at once.", minimum=1),
    "audit_retention_ms": Key("integer", "How long the audit trail (`GET /v1/audit`, `raftq audit`) keeps an "
                              "operator action; the sweep drops older entries.", minimum=1),
    "audit_max_entries": Key("integer", "Most entries the audit trail keeps; beyond that the oldest go first.",
                             minimum=1),
    "min_free_bytes": Key("integer", "The data disk's free-space reserve. While the filesystem of `data_dir` has "
                          "less free space than this (checked every half second), the node refuses writes with "
                          "503 `unavailable` and `Retry-After`, a leader hands leadership to a node that has "
                          "space, and the node does not stand for election; writes resume by themselves once "
                          "space is back. It keeps a filling disk an outage of writes, never a failed write "
                          "(which makes the node exit, code 74). 0: no reserve. This node's own, read from its TOML "
                          "(not the configuration in force: their disks may differ).", minimum=0),
}
SCHEDULE = {
    "name": Key("string", "The schedule's name: 1..128 characters of `A-Z a-z 0-9 . _ : @ -`.", required=True),
    "cron": Key("string", "5-field cron expression (or `@hourly`, `@daily`, ...); give this or `every_ms`.",
                default="unset"),
    "time_zone": Key("string", "IANA zone of `cron`.", default='"UTC"'),
    "every_ms": Key("integer", "A fixed interval instead of `cron`.", default="unset", minimum=1000),
    "start_at_ms": Key("integer", "No tick before.", default="unset", minimum=0),
    "end_at_ms": Key("integer", "No tick after.", default="unset", minimum=0),
    "max_count": Key("integer", "Fire at most this many ticks.", default="unset", minimum=1),
    "catchup": Key("string", "Missed ticks: `skip`, `one` or `all` (docs/semantics.md \"Schedules\").",
                   default='"one"'),
    "catchup_window_ms": Key("integer", "`all` fires missed ticks this recent.", default="3600000", minimum=1),
    "misfire_after_ms": Key("integer", "A tick fired later than this after its time counts as missed.",
                            default="5000", minimum=0),
    "overlap": Key("string", "While the last tick's job is unfinished: `allow`, `skip` or `replace`.",
                   default='"allow"'),
    "paused": Key("boolean", "Create it paused.", default="false"),
    "job": Key("table", "The job template: `queue`, `job_type`, and optionally `payload` ({data_b64, "
               "encoding}), `priority`, `max_attempts`, `custom`, `timeout_ms`, `resource`, "
               "`deadline_after_ms`.", required=True),
}

QUEUE_ONLY = {
    "name": Key("string", "The queue's name: non-empty, not `.` or `..`, no `/`, no control characters.",
                required=True),
    "allowed_job_types": Key("array of strings", "Job types this queue accepts (`job_type_not_allowed` "
                             "otherwise). Unset: any. Must not be empty.", default="unset"),
    "dedup_window_ms": Key("integer", "This queue's idempotency window.", default="`storage.dedup_window_ms`",
                           minimum=1),
    "dead_letter_forward": Key("string", "A queue into which the cluster enqueues one record job (job type "
                               "`raftq.dead_letter`, a JSON payload with the cause, the last reason, `failed_at_ms`, "
                               "`final_attempt` and the original job) for each of this queue's dead letters of a cause "
                               "in `dead_letter_forward_causes`, in the same command that dead-letters the job "
                               "(docs/semantics.md \"Dead-letter forwarding\"). Not this queue, and no chain of "
                               "forwards that comes back to it; need not be declared, except with `strict_queues`; "
                               "a declared one with `allowed_job_types` or `allowed_encodings` must allow "
                               "`raftq.dead_letter` and `application/json`. Record jobs are made past the forward "
                               "queue's `max_queue_depth` (a forward is never lost) and whether or not dead letters "
                               "are kept. Unset: no forwarding.", default="unset"),
    "dead_letter_forward_causes": Key("array of strings", "The causes `dead_letter_forward` forwards, of "
                                      "`attempts_exhausted`, `rejected`, `lease_expired`, `expired`, `admin`, "
                                      "`dependency_failed`; not empty, only with `dead_letter_forward`. The default "
                                      "is the causes the cluster decides (no worker saw them fail) of before "
                                      "dependencies; add `rejected` and `attempts_exhausted` to forward a worker's "
                                      "nacks too, `dependency_failed` for dependents failed by their dependencies.",
                                      default='`["lease_expired", "expired", "admin"]`'),
    "resource": Key("string", "The throttle resource of this queue's jobs that name none (`limits.resource_limits`). "
                    "Unset: none.", default="unset"),
    "circuit_breaker": Key("table", "`{failures = N, window_ms = W, open_ms = O}`: after N failures (nacks of any "
                           "strategy, dead_letter included, and lease expiries) within W ms of the replicated clock "
                           "the circuit opens and reserve skips the queue for O ms (jobs wait ready, no attempt is "
                           "used); then one probe job may go (half open): its ack closes the circuit, its failure "
                           "opens it again for O ms. `raftq queues close-circuit NAME` closes it. N: 1..10000; W, "
                           "O: >= 1. Per queue only. Unset: no breaker.", default="unset"),
    "windows": Key("array of tables", "Execution windows `[{days = [\"mon\", ...], start = \"09:00\", end = "
                   "\"17:30\", time_zone = \"Europe/Berlin\"}]`: outside all of them reserve skips the queue "
                   "(deadlines keep running). `days` default every day; `end` before `start` spans midnight "
                   "(the window opens on a listed day); `end = \"24:00\"` is the end of the day; `time_zone` "
                   "(default `UTC`) is an IANA name from the `tzdata` package, the same on every node. Evaluated "
                   "at the replicated clock, per minute. Per queue only. Unset: always open.", default="unset"),
    # keys (docs/semantics.md "Keys"): node/core/limits.py _key_settings
    "key_field": Key("string", "The custom field whose value is the key of a job that names no `key` of its own "
                     "(a string; any other value refuses the job with `invalid_request`; a job without the field "
                     "has no key). Keys are what the settings below limit and what reserve serves in turn: a "
                     "queue with keyed jobs serves its keys fairly within each priority (docs/semantics.md "
                     "\"Keys\"). Unset: only a job's `key` keys it.", default="unset"),
    "key_concurrency": Key("integer", "Most jobs of one key in flight at once, across every worker. Reserve passes "
                           "over a key at its limit (its jobs wait ready, no attempt used) and takes the next "
                           "eligible job; a slot frees on ack, nack, release, delete and lease expiry. 0 holds every "
                           "keyed job. A lowered limit takes no lease back. Unset: no limit.", default="unset",
                           minimum=0),
    "key_rate": Key("table", "`{count = N, period_ms = P}`: at most N jobs of one key handed out in any P ms of the "
                    "replicated clock (a sliding window: a burst of N at once is allowed, the next when the oldest "
                    "of them is P ms old). A held-back job waits ready, no attempt used; a release or nack gives "
                    "no hand-out back. Unset: no rate.", default="unset", rule="`count` 1..1000, `period_ms` ≥ 1"),
    "key_weights": Key("table", "`{key = weight}`: a key of weight w is served w jobs for each job of a key of "
                       "weight 1, among the keys of one priority that have jobs ready. Keys not named weigh 1.",
                       default="unset", rule="weights 1..1000; at most 10000 keys"),
    "key_limits": Key("table", "`{key = {concurrency = C, rate = {count, period_ms}}}` (either or both): one key's "
                      "own limits in place of `key_concurrency` and `key_rate`; 0 holds that key's jobs.",
                      default="unset", rule="as `key_concurrency` and `key_rate`; at most 10000 keys"),
    # job results (docs/semantics.md "Job results"): node/core/limits.py _result_settings
    "result_retention_ms": Key("integer", "How long a job acked in this queue is kept, `succeeded`, with the "
                               "result its ack carried (`GET /v1/jobs/{id}`, `GET /v1/jobs/{id}/result`), from its "
                               "ack on the replicated clock; the retention in force at the ack fixes its end. 0 "
                               "keeps none (a result sent is dropped). Per queue only.", default="`0`", minimum=0),
    "max_retained_result_bytes": Key("integer", "Most bytes of results this queue keeps at once. A result that does "
                                     "not fit drops the results of the queue's oldest retained jobs (they stay "
                                     "`succeeded`, `result_dropped`); the ack never fails for it. A lowered bound "
                                     "drops the oldest at once. Per queue only.", default="`67108864` (64 MiB)",
                                     minimum=1),
    "rate": Key("table", "`{count = N, period_ms = P}`: at most N jobs of this queue handed out in any P ms, keyed "
                "or not, all keys together (the same sliding window as `key_rate`); at the limit reserve skips "
                "the queue. Per queue only. Unset: no rate.", default="unset",
                rule="`count` 1..1000, `period_ms` ≥ 1"),
}
TUNING = {
    "auto_tick_period_s": Key("number", "Period of the Raft tick thread (pysyncobj `autoTickPeriod`).", positive=True),
    "append_entries_period_s": Key("number", "How often the leader sends appends and heartbeats to followers.",
                                   positive=True),
    "raft_min_timeout_s": Key("number", "Shortest election timeout: a follower that hears no leader for a random "
                              "time between the two starts an election.", positive=True),
    "raft_max_timeout_s": Key("number", "Longest election timeout.", positive=True),
    "leader_fallback_timeout_s": Key("number", "Upper bound of how long a leader that hears from no majority "
                                     "stays leader. CheckQuorum already makes it step down after `raft_min_timeout_s` "
                                     "(and ask a follower to stand at once): the shorter of the two applies.",
                                     positive=True),
    "connection_retry_s": Key("number", "How often a node retries a lost connection to a peer.", positive=True),
    "request_timeout_s": Key("number", "How long a request waits for its change to commit before it is "
                             "answered 503 `unavailable` (outcome unknown: retry with the same Request-Id).",
                             positive=True),
    "max_batch_commands": Key("integer", "Most requests in one Raft entry (group commit).", positive=True),
    "max_batch_bytes": Key("integer", "Largest Raft entry the group commit builds, in bytes (about).", positive=True),
    "max_inflight": Key("integer", "Most requests waiting for commit on a node; more are answered 429 "
                        "`overloaded`.", positive=True),
    "log_compaction_min_entries": Key("integer", "A snapshot is taken when the journal holds more entries than "
                                      "this, or `log_compaction_min_time_s` after the last one; each node takes "
                                      "it in its own slot of that period (with three nodes the first 30 % of "
                                      "each third), so the nodes of a cluster do not all write one at once.",
                                      positive=True),
    "journal_memory_bytes": Key("integer", "Bytes of the newest Raft log entries kept in memory; older entries "
                                "(until the next snapshot drops them) are read back from the journal file, "
                                "checksum verified, when a follower far behind or a log compaction needs "
                                "them (with `raft_engine = \"loop\"` the Raft core holds the same newest commands "
                                "and reads older ones back the same way, [cluster.md](cluster.md#raft-engines)). "
                                "16 MiB is about a second of the log at a fill's rate here (≈ 50,000 "
                                "256-byte jobs/s); it counts in a node's memory per queued job (≈ 17 bytes a "
                                "job at 1M jobs: [performance.md](performance.md)).", positive=True),
    "log_compaction_min_time_s": Key("number", "The period of the nodes' snapshot slots, and how long after its "
                                     "last snapshot a node takes one however few entries its journal holds.",
                                     positive=True),
    "raft_compression_level": Key("integer", "zlib level of Raft messages; 0 sends them uncompressed (zlib costs "
                                  "≈ 100 µs per 18 KB batch at pysyncobj's default 3).", minimum=0, maximum=9),
    "dns_cache_time_s": Key("number", "How long a peer's resolved address is cached; a peer that comes back on a "
                            "new IP is found after at most this long.", positive=True),
    "dns_fail_cache_time_s": Key("number", "How long a failed lookup of a peer's address is cached.", positive=True),
    "digest_inline_max_entries": Key("integer", "`GET /v1/cluster` hashes a state of at most this many entries "
                                     "(jobs, request ids, dead letters) on the event loop; a larger one in a child "
                                     "forked between two Raft ticks, so the node keeps serving (at 100k jobs the "
                                     "digest costs ≈ 0.4 s of CPU), and a call meanwhile gets the newest digest "
                                     "there is with its `digest_index`. 0: always in a child.", minimum=0),
    "event_loop": Key("string", "The node's event loop. `uvloop` (a dependency on Linux and macOS) answers each "
                      "request with ≈ 10 µs less CPU; a node without it runs on asyncio's loop and logs so. "
                      "`GET /v1/cluster` shows the loop in use.", choices=S.EVENT_LOOPS),
    "raft_engine": Key("string", "What runs Raft. `thread`: the fork's tick thread (node/raft/syncobj.py). "
                       "`loop`: the pure Raft core driven from the node's event loop, one Ready per turn "
                       "(node/raft/loop.py): same journal and snapshot files, so a data dir is read by either; "
                       "every node of a cluster must run the same engine ([cluster.md](cluster.md#raft-engines)). "
                       "`GET /v1/cluster` shows it.", choices=S.RAFT_ENGINES),
    "max_connections": Key("integer", "Most HTTP connections (session WebSockets included) open on the node. A new "
                           "one beyond it closes the idle connection quiet the longest (keep-alive, or a request head still "
                           "arriving); when none is idle it is answered 503 `unavailable` and closed.",
                           positive=True),
    "http_header_timeout_s": Key("number", "A request head must be complete this long after its first byte (after "
                                 "the connection opened, for the first request); else the connection is closed.",
                                 positive=True),
    "http_idle_timeout_s": Key("number", "An idle keep-alive connection is closed after this long.", positive=True),
    "http_body_timeout_s": Key("number", "A request body must have arrived this long after its head; else 408 "
                               "`request_timeout` and the connection is closed.", positive=True),
    "http_write_stall_timeout_s": Key("number", "A connection whose client reads nothing of an answer the node is "
                                      "sending (the node's send buffer full) for this long is closed: a client that "
                                      "asks for a large answer (a backup, a page of large jobs) and does not read it "
                                      "holds neither the answer's memory nor, for a backup, the node's one backup "
                                      "slot and its forked child.", positive=True),
    "max_parked_reserves": Key("integer", "Most long-poll reserves waiting on the node; one more that would wait is "
                               "answered 429 `overloaded`.", positive=True),
    "max_session_parked_reserves": Key("integer", "Most long-poll reserves one session may have waiting; one more "
                                       "is answered 429 `overloaded`.", positive=True),
    "max_session_inflight": Key("integer", "Most frames a session has taken and not answered; at the bound the node "
                                "stops reading the session's socket until answers go out.", positive=True),
    "max_session_queued_bytes": Key("integer", "Most answer bytes a session may have waiting to be sent; at the bound "
                                    "the node stops reading its socket until the client reads.", positive=True),
    "max_queued_answer_bytes": Key("integer", "Most answer bytes all sessions together may have waiting; beyond it "
                                   "every session with answers waiting stops being read (the others go on).",
                                   positive=True),
    "session_stall_timeout_s": Key("number", "A session held back with answers waiting that sends none for this long "
                                   "(its client does not read) is closed with code 4008.", positive=True),
    "forward_wait_s": Key("number", "A call a follower forwards waits this long for a reachable leader (an "
                          "election), then answers 503 `unavailable` (not applied); one whose leader was lost "
                          "before answering is sent again to the next leader for as long, then answered 503 "
                          "with `applied: null` (docs/api.md \"Followers\").", positive=True),
    "max_forward_inflight": Key("integer", "Most calls a follower's link to the leader carries unanswered; one more is "
                                "answered 429 `overloaded`. The leader bounds the link's session by it too.",
                                positive=True),
    "raft_handshake_timeout_s": Key("number", "A Raft-port connection (incoming or outgoing) must finish its "
                                    "handshake (key exchange and address) this long after it started; else it is "
                                    "closed (and an outgoing one dialled again).", positive=True),
    "raft_max_pending_handshakes": Key("integer", "Most incoming Raft-port connections in their handshake at once; "
                                       "a new one beyond it closes the oldest. Before its handshake a connection's "
                                       "frames are at most 4096 bytes (a longer length prefix closes it before "
                                       "anything of the frame is buffered).", positive=True),
}
GRPC = {
    "listen": Key("string", "`host:port` sepp's gRPC API (`sepp.v1.QueueService` and `grpc.health.v1.Health`) "
                  "listens on, a port of its own: sepp's clients (sepp-py and the others) work against the node "
                  "unchanged (docs/sepp.md). With `node.tls_cert` it serves TLS with the same files (and "
                  "`tls_client_ca` requires client certificates), reloaded on SIGHUP. Needs the `grpc` extra "
                  "(`pip install 'raftq[server,grpc]'`).", default="unset: no gRPC"),
}
API = {
    "followers": Key("string", "What this node does, while a follower, with an HTTP call that needs the leader and "
                     "does not say (`Raftq-Redirect: 1` asks for the 307, `0` for forwarding; docs/api.md "
                     "\"Leader redirect\"): `forward` serves it through the leader, `redirect` answers `307` to "
                     "the leader's URL (the session's upgrade likewise), for clients or load balancers that "
                     "expect the redirect. sepp's gRPC calls are forwarded either way (gRPC has no redirect).",
                     choices=S.FOLLOWERS),
}

TESTING = {
    "clock_offset_ms": Key("integer", "Shifts this node's idea of now (never the system clock): the chaos "
                           "tool's clock-skew fault."),
    "raft_dial_map": Key("table", "Peer Raft address → the address to dial instead (the chaos tool's fault "
                         "proxies).", default="{}"),
    "sync_shadow": Key("boolean", "Record what a disk honouring only fsync would hold (the chaos tool's "
                       "power-loss fault)."),
    "sync_shadow_writeback_s": Key("number", "With `sync_shadow` in memory mode: the simulated page writeback "
                                   "period."),
    "sweeps": Key("boolean", "`false`: the leader proposes no sweeps (leases, schedules and windows stop "
                  "expiring), so the state changes only by requests: the hostile-input tests compare state "
                  "digests around each refused request.", default="true"),
    "fsync_eio": Key("boolean", "Fail the next journal sync with EIO when the file `fail-next-fsync` appears in "
                     "the data dir (the chaos tool's fsync-eio fault)."),
    "clock_strobe": Key("boolean", "While the file `clock-strobe` in the data dir says `AMPLITUDE_MS PERIOD_MS`, this "
                        "node's idea of now jumps between +AMPLITUDE and -AMPLITUDE every PERIOD (the chaos tool's "
                        "clock-strobe fault); never the system clock."),
    "free_space_file": Key("boolean", "While the file `disk-free-bytes` in the data dir holds a number, take it as the "
                           "data disk's free space (the chaos tool's disk-full fault where it cannot mount a small "
                           "filesystem per node)."),
    "workers_window_ms": Key("integer", "How long a worker that reserved from a queue counts in the queue's "
                             "`workers` (and keeps `no_workers` false) on this node when it leads; the tests shorten "
                             "it.", minimum=1),
    "hold_seed": Key("boolean", "A leader of a new cluster seeds its configuration (version 1) only once the file "
                     "`release-seed` is in its data dir: the tests watch a cluster that has a leader and no "
                     "configuration yet (writes and `/readyz` answer 503)."),
    "check_invariants": Key("integer", "N > 0: after applied Raft entries the node runs the core's invariant "
                            "checks (node/core/invariants.py: counts, indexes, leases, keys, the clock), on the "
                            "Raft thread, never raising into the apply: a violation is logged CRITICAL with its "
                            "problems and counted in `GET /v1/cluster` `invariant_violations` (null when off). A "
                            "check costs O(state), so N bounds it: after every entry while the state holds at most "
                            "N entries (jobs, dead letters, request ids), after every ⌈entries / N⌉-th beyond, about "
                            "N entries' worth of checking per applied entry whatever the backlog. None while the node's "
                            "applies are more than 64 entries behind its commit index (a replay, a catch-up: "
                            "checked at the first entry after). The test suite's "
                            "clusters and `raftq chaos` run with 1000 and fail on any violation. 0: off.",
                            minimum=0),
}

# (TOML header, keys, where the code keeps them / their defaults, what the section is)
SECTIONS = [
    ("[node]", NODE, None, "This node: who it is, where it listens, where its data lives. The only section that "
     "differs between the nodes of a cluster."),
    ("[cluster]", CLUSTER, None, "The members and how they talk. Identical on every node."),
    ("[cluster] peers = [ { … } ]", PEER, None, "One entry per member."),
    ("[auth] api_keys = [ { … } ]", API_KEY, None, "Optional. Without `[auth]` the API is open (fine on loopback "
     "or a private network behind a firewall). With keys, every `/v1/` request needs `Authorization: Bearer "
     "<key>`; `/healthz`, `/readyz` and `/` (the admin page, which asks for a key) need none. `[auth]` has one "
     "key, `api_keys`, an array of these tables. Like `[limits]`, the keys seed the configuration in force "
     "(version 1, where each is kept as its SHA-256 digest, never the key); afterwards keys are added and "
     "removed online (`raftq keys add NAME ROLE`, `raftq keys remove NAME`) and this section changes nothing."),
    ("[limits]", LIMITS, {**L.QUEUE_KEYS, **L.GLOBAL_KEYS}, "Limits of requests and jobs. ★ marks the keys a "
     "`[[queues]]` entry may override for its queue. `[limits]`, `[storage]` and `[[queues]]` seed the "
     "configuration in force, version 1, when a new cluster's first leader is elected; from then on the "
     "configuration in force is replicated state, changed online with `raftq config apply FILE` (`PUT "
     "/v1/config`), and editing these sections in a node's file changes nothing: the node follows the "
     "configuration in force and reports the difference (`toml_differs`, see docs/cluster.md)."),
    ("[storage]", STORAGE, L.STORAGE_KEYS, "Retention, dedup window, the sweep, the audit trail and the disk's free-space "
     "reserve. Part of the configuration in force, like `[limits]`, except `min_free_bytes`, which each node "
     "reads from its own file."),
    ("[[queues]]", QUEUE_ONLY, None, "Optional, one table per declared queue: `name`, any ★ key of `[limits]` "
     "(its value for this queue), and the keys below. Undeclared queues use `[limits]` as they are (unless "
     "`strict_queues` is on). Part of the configuration in force, like `[limits]`."),
    ("[[schedules]]", SCHEDULE, None, "Optional, one table per schedule, with the fields of `PUT "
     "/v1/schedules/{name}` (docs/api.md \"Schedules\"), checked the same way (a wrong one stops the node, "
     "naming it). They seed a cluster once: the first leader that has them proposes them, each one that does "
     "not exist is created, and the cluster keeps the mark that this was done; afterwards schedules are changed "
     "online (`raftq schedules`) and this section changes nothing, even on a new leader."),
    ("[tuning]", TUNING, S.TUNING_DEFAULTS, "Timers and bounds of the node process; the defaults were measured "
     "on a 2-core machine and rarely need changing. Every value must be a positive number (the exceptions are "
     "noted)."),
    ("[grpc]", GRPC, None, "Optional: sepp's gRPC API on this node (docs/sepp.md), off without it. Each node has "
     "its own `listen`; API keys and roles are the HTTP API's, sent as `authorization: Bearer <key>` metadata."),
    ("[api]", API, None, "Optional: how this node's HTTP API answers, while it is a follower, the calls that need "
     "the leader. Node-local; set it the same on every node (any node may be a follower)."),
    ("[testing]", TESTING, {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                            for f in dataclasses.fields(S.TestHooks)},
     "Hooks for the chaos tool and the tests, all off by default. They change what one node believes, never the "
     "replicated rules; a production config has no such section."),
]


def _code_keys() -> dict[str, set]:
    """The keys each section has in the code (what the parser accepts)."""
    return {
        "[node]": set(S.NODE_KEYS),
        "[cluster]": set(S.CLUSTER_KEYS),
        "[cluster] peers = [ { … } ]": set(S.PEER_KEYS),
        "[auth] api_keys = [ { … } ]": {"name", "key", "role"},
        "[limits]": set(L.QUEUE_KEYS) | set(L.GLOBAL_KEYS),
        "[storage]": set(L.STORAGE_KEYS),
        "[[queues]]": set(L.QUEUE_ONLY_KEYS),
        "[[schedules]]": {"name"} | set(BODY_KEYS - {"expect_version"}),
        "[tuning]": set(S.TUNING_DEFAULTS),
        "[testing]": set(S.TESTING_KEYS),
        "[grpc]": set(S.GRPC_KEYS),
        "[api]": set(S.API_KEYS),
    }


def check_schema() -> list[str]:
    """Keys documented here but unknown to the code, or known to the code but undocumented."""
    problems = []
    code = _code_keys()
    for header, keys, _, _ in SECTIONS:
        have, want = set(keys), code[header]
        problems += [f"{header} {k}: in the code but not described in node/config_doc.py" for k in sorted(want - have)]
        problems += [f"{header} {k}: described in node/config_doc.py but not in the code" for k in sorted(have - want)]
    return problems


_TYPES = {bool: "boolean", int: "integer", float: "float", str: "string", dict: "table"}


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, dict):
        return "{}" if not v else repr(v)
    return str(v)


def _human(key: str, v) -> str:
    """A reading aid for large durations and sizes: 86400000 → 24 h."""
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        return ""
    if key.endswith("_ms"):
        for unit, ms in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
            if v >= ms and v % ms == 0 and (unit != "d" or v >= 2 * ms):
                return f" ({v // ms} {unit})"
    if key.endswith("_bytes") and v >= 1024 and v % 1024 == 0:
        return f" ({v // (1024 * 1024)} MiB)" if v % (1024 * 1024) == 0 else f" ({v // 1024} KiB)"
    return ""


def default_text(key: str, spec: Key, defaults: dict | None) -> str:
    if spec.required:
        return "required"
    if spec.default is not None:
        d = spec.default
        return d if d in ("unset", "none") or d.startswith("`") else f"`{d}`"
    if defaults is None or key not in defaults:
        if spec.choices:
            return f"`{_toml(spec.choices[0])}`"
        raise ValueError(f"{key}: no default in the code and none written in node/config_doc.py")
    v = defaults[key]
    return f"`{_toml(v)}`{_human(key, v)}"


def range_text(spec: Key) -> str:
    parts = []
    if spec.choices:
        parts.append("one of " + ", ".join(f"`{_toml(c)}`" for c in spec.choices))
    if spec.minimum is not None and spec.maximum is not None:
        parts.append(f"{spec.minimum}..{spec.maximum}")
    elif spec.minimum is not None:
        parts.append(f"≥ {spec.minimum}")
    if spec.positive:
        parts.append("> 0")
    if spec.rule:
        parts.append(spec.rule)
    return "; ".join(parts)


def render() -> str:
    problems = check_schema()
    if problems:
        raise SystemExit("node/config_doc.py is out of date with the config code:\n  " + "\n  ".join(problems))
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m raftq.node.config_doc > docs/configuration.md` from the config code",
        "     (node/core/limits.py, node/base/settings.py) and the key descriptions in node/config_doc.py.",
        "     Do not edit by hand: tests/test_config_doc.py fails when this file differs from what it prints. -->",
        "",
        "A node reads one TOML file: `raftq node --config FILE` (or `python -m raftq.node --config FILE`).",
        "Unknown sections and keys are errors, so a typo cannot pass silently: a bad config stops the node",
        "at start with one line naming the key and why, and exit code 2. Every section but `[node]` must be",
        "the same on every node of a cluster. Durations are integer milliseconds (`*_ms`) or seconds",
        "(`*_s`, may be fractional); sizes are bytes.",
        "",
        "A complete config for the first of three nodes on one machine (the layout `raftq up` uses):",
        "",
        "```toml",
        EXAMPLE.strip(),
        "```",
        "",
        "For three machines see `deploy/config/` and [cluster.md](cluster.md).",
    ]
    for header, keys, defaults, what in SECTIONS:
        out += ["", f"## `{header}`", "", what, ""]
        out += ["| key | type | default | range | meaning |", "|---|---|---|---|---|"]
        for key, spec in keys.items():
            star = " ★" if header == "[limits]" and key in L.QUEUE_KEYS else ""
            out.append(f"| `{key}`{star} | {spec.type} | {default_text(key, spec, defaults)} | "
                       f"{range_text(spec)} | {spec.meaning} |")
    out += ["", "## Checks between keys", "",
            "* `default_max_attempts` ≤ `max_attempts_ceiling`, `retry_delay_ms` ≤ `retry_delay_max_ms` and "
            "`max_payload_bytes` ≤ `max_request_bytes`, in `[limits]` and in each `[[queues]]` entry after its "
            "overrides are applied.",
            "* A `[[queues]]` name must be unique and no longer than `max_queue_name_bytes`.",
            "* The keys a `[[queues]]` entry's `key_weights` and `key_limits` name must be usable job keys: at most "
            "`max_key_bytes`, no control characters.",
            "* `cluster.peers` must list this node (`node.id`) with this node's `node.raft`.",
            "* API key names and keys must be unique.",
            "* `cluster.secret`, when set, must not be weak: at least 16 characters and 8 distinct ones, no "
            "repeated pattern, at least 40 bits of entropy by its characters' frequencies, and not a placeholder "
            "of the docs.",
            ""]
    return "\n".join(out)


EXAMPLE = """
[node]
id = "n1"
http = "127.0.0.1:7001"
url = "http://127.0.0.1:7001"
raft = "127.0.0.1:7101"
data_dir = "data/n1"

[cluster]
peers = [
  { id = "n1", raft = "127.0.0.1:7101", url = "http://127.0.0.1:7001" },
  { id = "n2", raft = "127.0.0.1:7102", url = "http://127.0.0.1:7002" },
  { id = "n3", raft = "127.0.0.1:7103", url = "http://127.0.0.1:7003" },
]
# The Raft secret, the same on every node: `openssl rand -hex 32` (a weak or placeholder one is refused).
# secret = "..."
durability = "fsync"

[auth]
api_keys = [
  { name = "app", key = "app-key-change-me", role = "worker" },
  { name = "ops", key = "ops-key-change-me", role = "admin" },
]

[limits]
default_max_attempts = 5
retry_delay_ms = 1000
retry_backoff = "exponential"

[storage]
dead_letter_retention_ms = 604800000

[[queues]]
name = "emails"
allowed_job_types = ["welcome", "digest"]
max_queue_depth = 100000
dedup_window_ms = 3600000

[[queues]]
name = "reports"
key_field = "tenant"
key_concurrency = 2
key_rate = { count = 10, period_ms = 1000 }
key_limits = { acme = { concurrency = 5 } }
"""


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
