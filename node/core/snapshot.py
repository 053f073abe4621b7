"""Snapshots and the digest: the whole state as plain builtins, and a hash of it.

`to_builtins` writes version 2. Version 1 (release 0.1.0, and this code up to the results of
node/core/ops.py) differs only in what the request-id store holds: most answers rendered, as
`(status, body)` with English messages. `from_builtins` reads both; it turns every rendered
answer into the result this version keeps (node/core/answers.py `result_of_answer`), so a
restored node replays exactly the answers that were given and has the digest of a node that
lived through the same history.

Version 3 adds the configuration in force (its version, canonical document and API keys), the
audit trail, and request-id records keyed by (caller, request id) with their route and body
hash. The request-id expiry index is a heap in the machine (a change to a shorter window makes
insertion order differ from expiry order) and the same list in expiry order in every version. A snapshot of version 1 or 2 holds no configuration: it restores at version 0, the
bootstrap configuration of the machine it is restored into (the node's TOML), as it ran then.

The digest is unchanged from version 1 for a state without those additions (version 0, no
audit entry, no scoped request id): a state that holds the same results hashes the same.

A queue's counters are a list in `Queue.COUNTERS` order; counters added later (`expired`) are
at its end, so a snapshot's shorter list loads with them at 0 (within version 3), and the
digest hashes them only once one is not 0. The per-cause counts of the dead-letter store are
derived from the store: not kept, rebuilt at restore.
"""
from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict, deque

import orjson

from . import batches, deps, results
from .limits import Limits
from .answers import result_of_answer
from .config import KeyRecord
from .gating import Circuit
from .jobs import (DEDUP_BUCKET, DEDUP_JOB_ID, DEDUP_KEY, IN_FLIGHT, READY, SHOWN_FIELDS, DeadLetter,
                   ENTRY_JOB, TIMER_JOB, Job, Queue, entry_order, is_live_entry, ready_entry, dedup_expires, dedup_items,
                   dedup_queue, dedup_record)
from .ops import DRAINED, ENQUEUED_BATCH, RESERVED, compact_batch, expanded_batch, request_record
from .schedules import Schedule

VERSION = 3
READABLE = (1, 2, 3)


def to_builtins(m) -> dict:
    """The whole state as plain builtins (for Raft snapshots); heaps keep only the entries
    that are or can become live."""
    jobs = m.jobs
    return {
        "v": VERSION, "clock": m.clock, "seq": m.seq, "ctr": m.ctr, "applied": m.applied,
        "jobs": [j.to_tuple() for j in jobs.values()],
        "queues": [(q.name, _counters(q), _ready_rows(q, jobs)) for q in m.queues.values()],
        # Schedule and lease timers of a job that still exists are kept even when stale: the
        # job can get the same time again (re-reserved or re-extended to the same expiry,
        # requeued and nacked to the same run time), which makes the old timer live again
        # and orders it by its older tie-break on every node, so also on a restored one.
        "sched": [(at, seq, job.id) for at, seq, job in m.sched_heap if jobs.get(job.id) is job],
        "leases": [e for e in m.lease_heap if e[TIMER_JOB] in jobs],
        "deadlines": [(at, seq, job.id) for at, seq, job in m.deadline_heap
                      if job.deadline == at and jobs.get(job.id) is job],
        # The forms of before the records became heap entries (node/core/jobs.py DEDUP_*), so
        # snapshots stay readable both ways across versions.
        "dedup": [(dedup_queue(r), r[DEDUP_KEY], r[DEDUP_JOB_ID], dedup_expires(r))
                  for keyed in m.dedup.values() for r in keyed.values()],
        "dedup_heap": [r[DEDUP_BUCKET] + (r[DEDUP_KEY],) for r in m.dedup_heap
                       if dedup_record(m, dedup_queue(r), r[DEDUP_KEY]) is r],
        # (key, op, result, exp[, route, hash]); a batch's results as tuples, the form every
        # version reads (node/core/ops.py `enqueued_batch`).
        "rids": [(key, op, _written(result), *rest) for key, (op, result, *rest) in m.rids.items()],
        # The expiry index as a list in expiry order, oldest record first on ties, without the
        # orders (they are positions in this list once restored): a restored node writes the
        # same snapshot as the node it was restored from.
        "rid_fifo": [(expires, key) for expires, _, key in sorted(m.rid_heap) if _rid_expires(m, key) == expires],
        "dlq": [(rec.job.id,) + rec.fields() for rec in m.dlq.values()],
        # Version 0 keeps no document: a restore applies the bootstrap of the machine it fills.
        "config": {"version": m.config_version, "doc": m.limits.doc if m.config_version else None,
                   "keys": [(name,) + rec for name, rec in m.keys.items()]},
        "audit": list(m.audit), "audit_seq": m.audit_seq,
        **_gating(m),
        # Schedules only when there are some (a state without them writes what it did before);
        # the heap is rebuilt from the records (one live entry each: next_fire, stamp).
        **({"schedules": [s.to_tuple() for s in m.schedules.values()]} if m.schedules else {}),
        **({"schedules_seeded": True} if m.schedules_seeded else {}),
        **_keys(m),
        # Retained finished jobs (node/core/results.py), only when there are some.
        **({"results": results.to_rows(m)} if m.results else {}),
        # Jobs waiting on dependencies (node/core/deps.py), only when there are some.
        **({"deps": deps.to_rows(m)} if m.pending_deps else {}),
        **({"batches": batches.to_rows(m)} if m.batches else {}),
    }


# The counters every snapshot of version 3 writes; the later ones (`waiting`) only up to the last
# one that is not 0, so a state that uses none of them writes what it did before.
_WRITTEN_COUNTERS = Queue.COUNTERS.index("expired") + 1


def _counters(q) -> list:
    out = [getattr(q, c) for c in Queue.COUNTERS]
    while len(out) > _WRITTEN_COUNTERS and not out[-1]:
        out.pop()
    return out


def _ready_rows(q, jobs: dict) -> list:
    """A queue's live ready entries as (-priority, enqueued_at, seq, job id), the heap's, then the
    FIFO's (an ascending run at the end, which becomes the FIFO again on restore). The FIFO is
    read from its two deques without making its entries: a deep backlog is most of a snapshot."""
    # zip would drop the jobs past the shorter deque: a snapshot must never lose one silently.
    assert len(q.ready_fifo) == len(q.fifo_seqs), f"queue {q.name!r}: the FIFO's deques are out of step"
    rows = [e[:ENTRY_JOB] + (e[ENTRY_JOB].id,) for e in q.ready_heap if is_live_entry(e, jobs)]
    rows += [(-job.priority, job.enqueued_at, seq, job.id) for job, seq in zip(q.ready_fifo, q.fifo_seqs)
             if job.state == READY and job.seq == seq and jobs.get(job.id) is job]
    return rows


def _keys(m) -> dict:
    """Keys' state, only when there is some: per queue its levels' virtual times, the pseudo-key
    of the jobs without a key, each key's rotation state, window and timer (node/core/keys.py
    Key.to_tuple), and the queue-wide rate's window. Heaps and counts are rebuilt from the
    jobs."""
    out = [(q.name, sorted(q.keys.vtimes.items()), q.keys.plain.to_tuple(),
            [k.to_tuple() for k in q.keys.by_key.values()])
           for q in m.queues.values() if q.keys is not None]
    rates = [(q.name, list(q.rate_log)) for q in m.queues.values() if q.rate_log]
    return {"keys": {"queues": out, "rates": rates}} if out or rates else {}


def _restore_keys(m, data) -> None:
    from .keys import Key, Keys
    keyed = data.get("keys")
    if keyed is None:
        return
    for qname, log in keyed["rates"]:
        m.queues[qname].rate_log = tuple(log)
    for qname, vtimes, plain, rows in keyed["queues"]:
        q = m.queues[qname]
        qk = q.keys = Keys(qname, 0)
        qk.vtimes = dict(tuple(v) for v in vtimes)
        qk.plain = Key.from_tuple(qname, plain)
        for t in rows:
            k = Key.from_tuple(qname, t)
            qk.by_key[k.name] = k
    jobs, blocked = m.jobs, m.blocked_ids
    for job in jobs.values():
        name = job.key
        if name is None or job.state not in (READY, IN_FLIGHT) or job.id in blocked:
            continue
        k = m.queues[job.queue].keys.by_key[name]
        if job.state == READY:
            k.heap.append(ready_entry(job))
            k.ready += 1
            if job.resource is not None:
                k.resources = k.resources or {}
                k.resources[job.resource] = k.resources.get(job.resource, 0) + 1
        else:
            k.in_flight += 1
    for q in m.queues.values():
        qk = q.keys
        if qk is None:
            continue
        for k in [qk.plain, *qk.by_key.values()]:
            heapq.heapify(k.heap)
            if k.held is not None:
                qk.held_keys += 1
                qk.held_ready += k.ready
            if k.turn is not None:
                qk.sched.append((k.level, k.vpass, k.since, k.turn, k))
            if k.timer is not None:
                m.key_timers.append(tuple(k.timer) + (k,))
        heapq.heapify(qk.sched)
    heapq.heapify(m.key_timers)


# The SHOWN_FIELDS 0.2.0 appended (timeout_ms, releases) and the values a job of before it has.
_SHOWN_DEFAULTS = (None, 0)
_SHOWN_LEGACY = len(SHOWN_FIELDS) - len(_SHOWN_DEFAULTS)


def _shown(t) -> tuple:
    """A job's shown fields as this version keeps them (an older result kept fewer)."""
    t = tuple(t)
    return t + _SHOWN_DEFAULTS[len(t) - _SHOWN_LEGACY:] if len(t) < len(SHOWN_FIELDS) else t


def _live_blocked(m):
    """(resource, queue, live entries) of the blocked heaps, in the machine's order."""
    jobs, ids = m.jobs, m.blocked_ids
    for r, per in m.blocked.items():
        for qname, heap in per.items():
            live = [e for e in heap if is_live_entry(e, jobs) and ids.get(e[ENTRY_JOB].id) == r]
            if live:
                yield r, qname, live


def _gating(m) -> dict:
    """Gating's state, only when there is some (a state without it writes what it did before):
    the blocked entries per (resource, queue) and each queue's deferral count and circuit. The
    in-flight count per resource is rebuilt from the jobs."""
    blocked = [(r, qname, [e[:ENTRY_JOB] + (e[ENTRY_JOB].id,) for e in sorted(live, key=entry_order)])
               for r, qname, live in _live_blocked(m)]
    queues = [(q.name, q.deferred, q.circuit.to_tuple() if q.circuit is not None else None)
              for q in m.queues.values() if q.deferred or q.circuit is not None]
    return {"gating": {"blocked": blocked, "queues": queues}} if blocked or queues else {}


def _written(kept) -> tuple:
    """A kept result as snapshots and the digest see it: a batch's jobs made as ENQUEUED tuples."""
    return (ENQUEUED_BATCH, expanded_batch(kept[1])) if kept[0] == ENQUEUED_BATCH else kept


def kept_result(op, kept) -> tuple:
    """A request-id entry of a snapshot as this version keeps it. Reserve and drain results kept
    by code before 0.2.0 hold shorter job fields: they get the new fields' defaults, and a
    batch's jobs made are their bare ids, so the request-id store is the one a node that lived
    through the same history holds."""
    if type(kept[0]) is int:                    # a rendered answer (version 1)
        kept = result_of_answer(op, kept)
    if kept[0] == ENQUEUED_BATCH:
        return ENQUEUED_BATCH, compact_batch(kept[1])
    if kept[0] == RESERVED:
        return RESERVED, tuple(_shown(t) for t in kept[1])
    if kept[0] == DRAINED:
        return DRAINED, tuple((_shown(r[0]),) + tuple(r[1:]) for r in kept[1])
    return tuple(kept)


def from_builtins(m, data: dict, consume: bool = False):
    """Fill the empty machine `m` from `to_builtins` data of a readable version. `consume`: the
    data is the caller's to give up (a snapshot just read): its large lists are emptied as they
    are read (`_drain`)."""
    assert not m.jobs and not m.queues and not m.rids, "from_builtins fills a new machine only"
    if data.get("v") not in READABLE:
        raise ValueError(f"unknown snapshot version {data.get('v')!r}")
    m.clock, m.seq, m.ctr, m.applied = data["clock"], data["seq"], data["ctr"], data["applied"]
    jobs, specs = m.jobs, {}
    for t in _drain(data["jobs"], consume):
        job = Job.from_tuple(t, specs)      # jobs enqueued alike share their spec again
        jobs[job.id] = job
    for rec in data["dlq"]:
        job = jobs[rec[0]]
        r = DeadLetter(job, *rec[1:])
        m.dlq[job.id] = r
        m.dlq_by_queue.setdefault(job.queue, OrderedDict())[job.id] = r
    for name, counters, rows in data["queues"]:
        m.queues[name] = _restored_queue(name, counters, rows, jobs, consume)
    for rec in m.dlq.values():          # derived from the store, not kept in the snapshot
        d = m.queues[rec.job.queue].dead_by_cause
        d[rec.cause] = d.get(rec.cause, 0) + 1
    m.sched_heap = [(a, b, jobs[i]) for a, b, i in data["sched"]]
    m.lease_heap = [(a, b, jobs[i].id) for a, b, i in data["leases"]]
    m.deadline_heap = [(a, b, jobs[i]) for a, b, i in data["deadlines"]]
    for h in (m.sched_heap, m.lease_heap, m.deadline_heap):
        heapq.heapify(h)
    _restore_dedup(m, data, consume)
    _restore_request_ids(m, data, consume)
    cfg = data.get("config")
    if cfg is not None and cfg["version"] > 0:
        m.limits = Limits.from_doc(cfg["doc"])
        m.retaining = m.limits.retaining
        m.config_version = cfg["version"]
        m.keys = {name: KeyRecord(*rec) for name, *rec in cfg["keys"]}
    m.audit = deque(tuple(e) for e in data.get("audit", ()))
    m.audit_seq = data.get("audit_seq", 0)
    _restore_gating(m, data)
    for t in data.get("schedules", ()):
        s = Schedule.from_tuple(t)
        m.schedules[s.name] = s
        if not s.paused and s.next_fire is not None:
            m.tick_heap.append((s.next_fire, s.stamp, s.name))
    heapq.heapify(m.tick_heap)
    m.schedules_seeded = data.get("schedules_seeded", False)
    _restore_keys(m, data)
    results.restore(m, data.get("results", ()))
    deps.restore(m, data.get("deps", ()))
    batches.restore(m, data.get("batches", ()))
    return m


def _drain(rows: list, consume: bool, start: int = 0, stop: int | None = None):
    """rows[start:stop], each let go by the list once handed out when `consume`: a restore's
    builtins die while the machine is built, so their memory holds the machine's objects
    instead of staying beside them (a 1M-job snapshot's rows are ≈ 500 MB; docs/performance.md
    "A 1M backlog under the engines"). An iterator (a snapshot read in parts,
    node/replication/replica.py `pack_machine`) is handed out as it comes."""
    if not isinstance(rows, list):
        yield from rows
        return
    stop = len(rows) if stop is None else stop
    if not consume:
        yield from rows[start:stop]
        return
    for k in range(start, stop):
        row = rows[k]
        rows[k] = None
        yield row


def _restored_queue(name: str, counters: list, rows: list, jobs: dict, consume: bool = False) -> Queue:
    """A queue from its snapshot row: its counters, and its ready entries (-priority,
    enqueued_at, seq, job id), whose ascending tail (what was the FIFO) becomes the FIFO again;
    the rest is heapified."""
    q = Queue(name)
    for c, v in zip(Queue.COUNTERS, counters):
        setattr(q, c, v)
    k = len(rows) - 1
    while k > 0 and tuple(rows[k - 1]) < tuple(rows[k]):
        k -= 1
    k = max(k, 0)
    # An entry's seq is its job's (a row is written for a live entry only): the job's own int,
    # not the row's, so that a consumed row leaves nothing of its own behind in the machine.
    heap = q.ready_heap = []
    for a, b, _, job_id in _drain(rows, consume, 0, k):
        job = jobs[job_id]
        heap.append((a, b, job.seq, job))
    heapq.heapify(heap)
    q.fifo_tail = (rows[-1][0], rows[-1][1]) if len(rows) > k else None
    fifo, seqs = q.ready_fifo, q.fifo_seqs
    for _, _, _, job_id in _drain(rows, consume, k):
        job = jobs[job_id]
        fifo.append(job)
        seqs.append(job.seq)
    return q


def _restore_dedup(m, data: dict, consume: bool = False) -> None:
    """The dedup records. Every record has exactly one live heap entry, so the heap is the
    records (`dedup_heap` names the same (expires, queue, key) set; it is written for older
    readers)."""
    m.dedup = {}
    buckets: dict = {}                  # the records of one (expires, queue) share their bucket again
    jobs = m.jobs
    for qname, key, job_id, expires in _drain(data["dedup"], consume):
        bucket = buckets.setdefault((expires, qname), (expires, qname))
        job = jobs.get(job_id)              # the job's own id when it is still there, as in a live
        if job is not None:                 # machine (a restore's rows may hold copies of it)
            job_id = job.id
        m.dedup.setdefault(qname, {})[key] = (bucket, key, job_id)
    m.dedup_heap = [r for keyed in m.dedup.values() for r in keyed.values()]
    heapq.heapify(m.dedup_heap)


def _restore_request_ids(m, data: dict, consume: bool = False) -> None:
    """The request-id records, and their expiry heap from `rid_fifo`: (expires, key) in expiry
    order, oldest first on ties. Orders below any later record's (those take `applied`, >= 0)
    keep that order; a sorted list is a heap."""
    m.rids = {_key(key): request_record(op, kept_result(op, kept), exp, *rest)
              for key, op, kept, exp, *rest in _drain(data["rids"], consume)}
    fifo = data["rid_fifo"]
    m.rid_heap = [(expires, i - len(fifo), _key(key)) for i, (expires, key) in enumerate(fifo)]


def _restore_gating(m, data: dict) -> None:
    """The slots in use (from the jobs in flight), the blocked heaps, deferrals and circuits."""
    jobs = m.jobs
    for job in jobs.values():
        if job.resource is not None and job.state == IN_FLIGHT:
            m.in_use[job.resource] = m.in_use.get(job.resource, 0) + 1
    gating = data.get("gating")
    if gating is None:
        return
    for r, qname, entries in gating["blocked"]:
        heap = [(a, b, c, jobs[i]) for a, b, c, i in entries]      # sorted: a heap already
        m.blocked.setdefault(r, {})[qname] = heap
        q = m.queues[qname]
        for e in heap:
            m.blocked_ids[e[ENTRY_JOB].id] = r
        q.throttled += len(heap)
    for qname, deferred, circuit in gating["queues"]:
        q = m.queues[qname]
        q.deferred = deferred
        q.circuit = Circuit.from_tuple(circuit) if circuit is not None else None


def _rid_expires(m, key):
    """When the record of request key `key` expires, None without one."""
    rec = m.rids.get(key)
    return None if rec is None else rec.expires


def _key(key):
    return key if type(key) is str else tuple(key)


def digest(m) -> str:
    """A hash of the logical state, independent of heap layout and dict order where those do
    not change behaviour; equal on every node at the same applied index."""
    h = hashlib.sha256()
    h.update(orjson.dumps([m.clock, m.seq, m.applied]))
    for job_id in sorted(m.jobs):
        h.update(repr(m.jobs[job_id].legacy_tuple()).encode())
    for name in sorted(m.queues):
        q = m.queues[name]
        counters = [getattr(q, c) for c in Queue.COUNTERS_V1]
        later = [getattr(q, c) for c in Queue.COUNTERS[len(Queue.COUNTERS_V1):]]
        while later and not later[-1]:     # up to the last one not 0: earlier states hash as they did
            later.pop()
        counters += later
        h.update(repr((name, counters)).encode())
    for record in dedup_items(m):
        h.update(repr(record).encode())
    for key in sorted(m.rids, key=_key_order):
        op, kept, exp, *scope = m.rids[key]
        h.update(repr((key, op, exp, *scope)).encode())
        h.update(repr(_written(kept)).encode() if type(kept[0]) is str
                 else orjson.dumps(kept, option=orjson.OPT_SORT_KEYS))
    for job_id, rec in m.dlq.items():       # order matters: drain is oldest first
        h.update(repr((job_id,) + rec.fields()).encode())
    # What version 3 added, only when present (so the digest of an earlier state is unchanged).
    if m.config_version or m.keys:
        h.update(orjson.dumps(["config", m.config_version, m.limits.doc, sorted((n,) + r for n, r in m.keys.items())],
                              option=orjson.OPT_SORT_KEYS))
    if m.audit or m.audit_seq:
        h.update(orjson.dumps(["audit", m.audit_seq, list(m.audit)], option=orjson.OPT_SORT_KEYS))
    g = _gating(m).get("gating")
    if g is not None:           # gating, only when present; blocked ids per (resource, queue) sorted
        h.update(orjson.dumps(["gating", sorted((r, qn, sorted(job_id for *_, job_id in es)) for r, qn, es in g["blocked"]),
                               sorted(g["queues"], key=lambda x: x[0])]))
    if m.schedules or m.schedules_seeded:       # only when present, like the rest
        h.update(repr(["schedules", m.schedules_seeded, sorted(s.to_tuple() for s in m.schedules.values())]).encode())
    k = _keys(m).get("keys")
    if k is not None:           # only when present, like the rest
        h.update(repr(["keys", sorted((n, v, p, sorted(rows, key=repr)) for n, v, p, rows in k["queues"]),
                       sorted(k["rates"])]).encode())
    if m.results:               # only when present, like the rest
        h.update(repr(["results", results.to_rows(m)]).encode())
    if m.pending_deps:
        h.update(repr(["deps", deps.to_rows(m)]).encode())
    if m.batches:
        h.update(repr(["batches", batches.to_rows(m)]).encode())
    return h.hexdigest()[:32]


def _key_order(key):
    return (0, key) if type(key) is str else (1, key)
