"""The handlers: one function per command, named with docs/semantics.md's verbs.

Each takes the machine and the command's fields by the names node/core/ops.py gives them
(`COMMANDS`), mutates the state only through the undo log (node/core/undo.py; the hot paths
enqueue, reserve and ack write its entries inline), and returns a result of codes and fields
(`ops.RESULTS`), never an English message. The sweep's steps are in node/core/sweep.py.
"""
from __future__ import annotations

from collections import OrderedDict
from heapq import heappop, heappush

from collections import deque
from itertools import chain
import uuid

import orjson

from .retry import policy_delay_ms
from . import audit, batches, deps, gating, keys, ops, results
from .answers import render_dead_letter
from .jobs import (DEAD, DEAD_LETTER_RECORD_TYPE, GONE, IN_FLIGHT, READY, SCHEDULED, WAITING, DeadLetter, Job, Queue,
                   ENTRY_JOB, ENTRY_NEG_PRIORITY, ENTRY_SEQ, is_live_entry, known_queue, ready_entry, shown_fields)
from .jobs import (BUCKET_EXPIRES, DEDUP_BUCKET, DEDUP_JOB_ID, TIMER_AT, S_ATTEMPT, S_CUSTOM, S_DEADLINE,
                   S_DEPENDS_ON, S_ENCODING, S_ENQUEUED_AT, S_JOB_TYPE, S_KEY, S_MAX_ATTEMPTS, S_PRIORITY, S_QUEUE, S_RELEASES,
                   S_RESOURCE, S_SCHEDULED_AT, S_TIMEOUT_MS, S_TRACE, dedup_expires, dedup_record, shown_common)
from .ops import ATOMIC, DEAD_LETTER, DELAY, ENQUEUED, ITEM_LEGACY_LEN, JOB_ID, RESERVED, SINGLE, UNAUDITED
from .undo import drop_item, fifo_restore_head, fifo_unappend, heap_remove, heap_restore, restore_item

# ---------------------------------------------------------------------------- enqueue
def enqueue(m, mode: int, items):
    """docs/semantics.md "Enqueue": one job, a best-effort batch or an atomic batch."""
    now = m.clock
    if mode == ATOMIC:
        refused = _atomic_duplicates(m, items, now) or _atomic_missing_deps(m, items, now)
        if refused:         # a reject or refused replace rejects the whole batch, like batch_full
            return ops.batch_full(refused)
        full = _atomic_overflow(m, items, now)
        if full:
            return ops.batch_full(tuple({"index": i, "rejection": ops.queue_full(item[ops.ITEM_QUEUE], full[item[ops.ITEM_QUEUE]])}
                                        for i, item in enumerate(items) if item[ops.ITEM_QUEUE] in full))
        return ops.enqueued_batch(_enqueue_items(m, items, now, False))
    if mode == SINGLE:                        # the hot path: no list of one
        r = items[0]
        if not isinstance(r, dict):           # a dict: refused by validation before proposing
            r = _enqueue_one(m, r, now, True)
            if type(r) is str:
                return ENQUEUED, r, False
            if type(r) is tuple:
                return r
            if r["reason"] == "duplicate_started":      # a replace refused: 409, not a rejection
                return ops.duplicate_started(r["job_id"])
        r["reason"]                          # the answer names it: a rejection without one is malformed
        return ops.rejected(r)
    return ops.enqueued_batch(_enqueue_items(m, items, now, True))


def _enqueue_items(m, items, now: int, check_depth: bool) -> tuple:
    """A batch's items in order (a refused one, a dict, stays its rejection). A `ref` names the job
    its item stands for: when that item is an idempotency-key hit, the existing job, so a later
    item's dependency on it is rewritten to that job (`alias`): a graph sent again with its keys
    answers its existing jobs."""
    results, alias = [], None
    for item in items:
        if isinstance(item, dict):
            results.append(item)
            continue
        if alias and len(item) > _DEPENDS_ON and item[_DEPENDS_ON]:
            item = item[:_DEPENDS_ON] + (aliased(item[_DEPENDS_ON], alias),)
        r = _enqueue_one(m, item, now, check_depth)
        if type(r) is tuple and r[0] in (ENQUEUED, ops.REPLACED):      # a key hit: its existing job
            alias = alias or {}
            alias[item[0]] = r[1]
        results.append(r)
    return tuple(results)


def aliased(pairs, alias: dict) -> tuple:
    """Dependency pairs with the ids of key-hit items replaced by their existing jobs'."""
    return tuple((alias.get(dep_id, dep_id), policy) for dep_id, policy in pairs)


def _policy(m, item) -> str:
    """The duplicate policy of an item: its own, else its queue's (in force at this entry)."""
    p = item[ops.ITEM_DUPLICATE_POLICY] if len(item) > ops.ITEM_DUPLICATE_POLICY else None
    return p if p is not None else m.limits.queue(item[ops.ITEM_QUEUE]).duplicate_policy


def _replaceable(job) -> bool:
    """A job a `replace` may still change: waiting and never delivered."""
    return job is not None and job.state in (READY, SCHEDULED) and job.attempt == 1 and job.releases == 0


def _atomic_duplicates(m, items, now: int) -> tuple:
    """The items of an atomic batch whose idempotency-key hit refuses them (policy reject, or a
    replace of a job that has started), as batch_full errors; empty when none does. A key twice
    in the batch is a hit of the second on the first (which has not started)."""
    errors = []
    keys: dict = {}
    for i, item in enumerate(items):
        qname, key = item[ops.ITEM_QUEUE], item[ops.ITEM_IDEMPOTENCY_KEY]
        if key is None:
            continue
        rec = dedup_record(m, qname, key)
        live = rec is not None and dedup_expires(rec) > now
        if live or (qname, key) in keys:
            existing = rec[DEDUP_JOB_ID] if live else keys[(qname, key)]
            policy = _policy(m, item)
            if policy == ops.REJECT:
                errors.append({"index": i, "rejection": ops.duplicate(existing)})
            elif policy == ops.REPLACE and live and not _replaceable(m.jobs.get(existing)):
                errors.append({"index": i, "rejection": ops.duplicate_refused(existing)})
        keys.setdefault((qname, key), item[0])
    return tuple(errors)


def _atomic_missing_deps(m, items, now: int) -> tuple:
    """The items of an atomic batch that depend on a job the machine knows nothing of (nor an
    earlier item of the batch that makes a job that stays), as batch_full errors
    (node/core/deps.py). An item whose key hits (a live record, an earlier item's key) makes
    none: a dependency on it is one on the existing job (`_enqueue_items`); one dead-lettered at
    once without a store makes none either: a later item that depends on it would be refused as
    it is applied, and the batch is all or nothing."""
    errors, made, keys, alias = [], set(), {}, {}
    dropped = m.limits.dead_letter_retention_ms <= 0
    for i, item in enumerate(items):
        pairs = item[ops.ITEM_DEPENDS_ON] if len(item) > ops.ITEM_DEPENDS_ON else None
        if pairs:
            pairs = aliased(pairs, alias) if alias else pairs
            dep = deps.missing(m, pairs, made)
            if dep is not None:
                errors.append({"index": i, "rejection": ops.dependency_not_found(dep)})
        qname, key = item[ops.ITEM_QUEUE], item[ops.ITEM_IDEMPOTENCY_KEY]
        if key is not None:
            rec = dedup_record(m, qname, key)
            if (qname, key) in keys:            # a key hit stands for the existing job (_enqueue_items)
                alias[item[0]] = keys[(qname, key)]
                continue
            if rec is not None and dedup_expires(rec) > now:
                alias[item[0]] = rec[DEDUP_JOB_ID]
                continue
            keys[(qname, key)] = item[0]
        if not (dropped and pairs and deps.fails_at_once(m, pairs)):
            made.add(item[0])
    return tuple(errors)


def _atomic_overflow(m, items, now: int) -> dict:
    """The queues an atomic batch would overfill, with their limits. Capacity is checked up
    front for the whole batch, so it either fits entirely or not at all. Dedup hits never count
    (docs/semantics.md "Enqueue"), neither against a live record nor against an earlier job of this batch
    with the same key."""
    wanted: dict[str, int] = {}
    keys: set = set()
    for item in items:
        qname, key = item[ops.ITEM_QUEUE], item[ops.ITEM_IDEMPOTENCY_KEY]
        if key is not None:
            rec = dedup_record(m, qname, key)
            if (rec is not None and dedup_expires(rec) > now) or (qname, key) in keys:
                continue
            keys.add((qname, key))
        wanted[qname] = wanted.get(qname, 0) + 1
    full = {}
    for qname, n in wanted.items():
        limit = m.limits.queue(qname).max_queue_depth
        q = m.queues.get(qname)
        depth = q.depth() if q is not None else 0
        if limit is not None and depth + n > limit:
            full[qname] = limit
    return full


def _duplicate(m, item, job_id: str, now: int):
    """An idempotency-key hit on job `job_id`, decided by the duplicate policy: the existing
    job (return_existing), a `duplicate` rejection (reject), or the job replaced / a
    `duplicate_started` refusal (replace)."""
    policy = _policy(m, item)
    if policy == ops.REJECT:
        return ops.duplicate(job_id)
    if policy != ops.REPLACE:
        return ENQUEUED, job_id, True
    job = m.jobs.get(job_id)
    if not _replaceable(job):
        return ops.duplicate_refused(job_id)
    (_, qname, _, payload, encoding, priority, _, _, _, scheduled_at, _, _) = item[:ops.ITEM_LEGACY_LEN]
    q = m.queues[job.queue]
    gating.leave_waiting(m, q, job)
    m._set(job, "payload", payload)
    m._set(job, "encoding", encoding)
    m._set(job, "priority", priority)
    m._set(job, "scheduled_at", scheduled_at)
    m._set(job, "seq", m._new_seq())        # the old ready/schedule entry is stale from here on
    if scheduled_at is not None and scheduled_at > now:
        schedule(m, job, q, scheduled_at)
    else:
        m._set(job, "run_at", None)
        make_ready(m, job, q)
    return ops.replaced(job_id)             # (its deadline entry stays live: it names the job)


def _enqueue_one(m, item, now: int, check_depth: bool):
    """One job: its id when made (ops.enqueued_batch), an ENQUEUED or REPLACED result, or a rejection."""
    if (n := len(item)) > _DEPENDS_ON:      # with dependencies (node/core/deps.py)
        return _enqueue_with_deps(m, item, now, check_depth)
    legacy = n == ITEM_LEGACY_LEN           # an item of before 0.2.0 (and of every plain job)
    (job_id, qname, job_type, payload, encoding, priority, max_attempts, custom, trace, scheduled_at, deadline,
     idem_key) = item if legacy else item[:ITEM_LEGACY_LEN]
    timeout_ms, resource, key = _NO_LATER_FIELDS if legacy else _later_fields(item)
    ql = m.limits.queue(qname)
    if idem_key is not None:
        keyed = m.dedup.get(qname)
        rec = keyed.get(idem_key) if keyed is not None else None
        if rec is not None and rec[DEDUP_BUCKET][BUCKET_EXPIRES] > now:     # dedup_expires(rec), inline
            return _duplicate(m, item, rec[DEDUP_JOB_ID], now)
    q = m.queues.get(qname)
    limit = ql.max_queue_depth if check_depth else None
    if limit is not None and (q.depth() if q is not None else 0) >= limit:
        return ops.queue_full(qname, limit)
    if q is None:
        q = m.ensure_queue(qname)
    job = Job()
    job.id, job.payload, job.lease_expires = job_id, payload, None
    later = scheduled_at is not None and scheduled_at > now
    # The spec (jobs.py SPEC_FIELDS), the last job's when equal; not with custom fields (true == 1 == 1.0).
    spec = (qname, job_type, encoding, priority, custom, trace, now, scheduled_at, max_attempts,
            deadline, timeout_ms if timeout_ms is not None else ql.execution_timeout_ms, resource,
            None, 0, 1, scheduled_at if later else None, key, None)
    last = m._spec
    if custom is None and spec == last:
        spec = last
    else:
        m._spec = spec
    job.spec = spec
    undo, jobs, seq = m._undo, m.jobs, m.seq      # the hot path: the undo log written inline (undo.py)
    undo += (setattr, m, "seq", seq)
    m.seq = job.seq = seq = seq + 1
    undo += (drop_item, jobs, job_id, None)
    if jobs.setdefault(job_id, job) is not job:     # one probe of a dict of every job, not two
        del undo[-4:]                   # nothing went in: the job of that id must stay on a revert
        raise ValueError("job id collision")   # the leader's ids are fresh UUIDs
    if later or key is not None:
        _waiting_new(m, q, job, later)
    else:
        job.state = READY                   # ready_push(m, q, (-priority, now, seq, job)), inline
        negp = -priority
        if q.keys is not None:              # the jobs without a key take part in the rotation
            keys.plain_pushed(m, q, negp)
        fifo, tail = q.ready_fifo, q.fifo_tail
        if fifo and tail[0] == negp and tail[1] == now:     # the FIFO keeps no entry; a batch shares its tail
            undo += (fifo_unappend, q, job, tail)
            fifo.append(job)
            q.fifo_seqs.append(seq)
        elif not fifo or tail[0] < negp or (tail[0] == negp and tail[1] < now):
            undo += (fifo_unappend, q, job, tail)
            fifo.append(job)
            q.fifo_seqs.append(seq)
            q.fifo_tail = (negp, now)
        else:
            entry = (negp, now, seq, job)
            undo += (heap_remove, q.ready_heap, entry, None)
            heappush(q.ready_heap, entry)
        undo += (setattr, q, "ready", q.ready)
        q.ready += 1
    if deadline is not None:
        m._push(m.deadline_heap, (deadline, seq, job))
    undo += (setattr, q, "enqueued", q.enqueued)
    q.enqueued += 1
    if idem_key is not None:
        _dedup_put(m, q, keyed, rec, idem_key, job_id, now, ql.dedup_window_ms)
    return job_id


_DEPENDS_ON = ops.ITEM_DEPENDS_ON


def _enqueue_with_deps(m, item, now: int, check_depth: bool):
    """A job with dependencies (node/core/deps.py): refused while one is unknown (before anything
    changes), else made as without them and then put to wait (its ready or schedule entry goes
    stale) unless every dependency has ended already in a way its policy takes."""
    depends_on = item[ops.ITEM_DEPENDS_ON]
    if depends_on:
        dep = deps.missing(m, depends_on)
        if dep is not None:
            return ops.dependency_not_found(dep)
    made = _enqueue_one(m, item[:ops.ITEM_DEPENDS_ON], now, check_depth)
    if depends_on and type(made) is str:
        job = m.jobs[made]
        m._set(job, "depends_on", tuple((dep_id, policy) for dep_id, policy in depends_on))
        deps.pin(m, job)
        if deps.waits(m, depends_on):
            q = m.queues[job.queue]
            gating.leave_waiting(m, q, job)     # its ready or schedule entry goes stale
            deps.attach(m, q, job, depends_on)
    return made


# The fields after ops.ITEM_LEGACY_LEN, (timeout_ms, resource, key), of an item without them.
_NO_LATER_FIELDS = (None, None, None)


def _later_fields(item) -> tuple:
    """(timeout_ms, resource, key) of an item of 15 fields (before keys, and every job without
    one), of 16 (before dependencies) or of 17 (ops.ITEM); any other length is malformed
    (ValueError)."""
    if len(item) == 15:
        timeout_ms, _, resource = item[ITEM_LEGACY_LEN:]
        return timeout_ms, resource, None
    if len(item) == 17:
        timeout_ms, _, resource, key, _ = item[ITEM_LEGACY_LEN:]
        return timeout_ms, resource, key
    timeout_ms, _, resource, key = item[ITEM_LEGACY_LEN:]
    return timeout_ms, resource, key


def _waiting_new(m, q, job, later: bool) -> None:
    """A new job that waits outside its queue's own ready index: scheduled when it is `later`,
    else keyed (its key's heap, node/core/keys.py)."""
    if later:
        job.state = SCHEDULED
        m._push(m.sched_heap, (job.run_at, job.seq, job))
        m._add(q, "scheduled", 1)
    else:
        job.state = READY
        keys.push(m, q, ready_entry(job))
        m._add(q, "ready", 1)


def _dedup_put(m, q, keyed, old, idem_key: str, job_id: str, now: int, window: int) -> None:
    """The dedup record of a job just made. It is its own expiry-heap entry; its bucket
    (expires, queue) is shared by every record of the batch (one `now`, one window, one queue):
    node/core/jobs.py. m._put and m._push, inline: `old` is what the lookup found for the key
    (None, or a record past its window) in `keyed`, the queue's records (None: none yet), so the
    dict is not probed again."""
    undo = m._undo
    if keyed is None:
        keyed = {}
        m._put(m.dedup, q.name, keyed)
    rec = (m.shared_bucket(now, window, q.name), idem_key, job_id)
    undo += (drop_item, keyed, idem_key, None) if old is None else (restore_item, keyed, idem_key, old)
    keyed[idem_key] = rec
    heap = m.dedup_heap
    undo += (heap_remove, heap, rec, None)
    heappush(heap, rec)


# ---------------------------------------------------------------------------- reserve
def reserve(m, queue_names, lease_ms: int, max_jobs: int):
    """docs/semantics.md "Reserve": queues in the order listed, the best ready job of each first; the
    shown fields of each (jobs.py SHOWN_FIELDS). The hot path: hand_out and lease written inline."""
    now, kept = m.clock, []
    jobs, lease_heap, undo, gated = m.jobs, m.lease_heap, m._undo, m.limits.gated
    for qname in queue_names:
        q = m.queues.get(qname)
        if q is None or q.paused:
            continue
        cap, probe, rated = max_jobs, -1, False
        if gated and qname in gated:            # a circuit breaker, windows, a rate (node/core/gating.py)
            cap, probe, rated = _gated_cap(m, q, now, len(kept), max_jobs)
            if cap is None:
                continue
        if rated or q.keys is not None:         # the rotation of keys (node/core/keys.py)
            take(m, q, cap, kept, lease_ms, probe)
            if len(kept) < max_jobs:            # straight on: part of the keys figure's cost
                continue
            break
        heap, fifo, seqs = q.ready_heap, q.ready_fifo, q.fifo_seqs
        while len(kept) < cap:
            # The next job: the smaller head of the FIFO and the heap. Stale heads go (not logged: nothing logical).
            while fifo:
                job = fifo[0]
                if job.state == READY and job.seq == seqs[0] and jobs.get(job.id) is job:
                    break
                fifo.popleft()
                seqs.popleft()
            while heap:
                entry = heap[0]
                job = entry[ENTRY_JOB]
                if job.state == READY and job.seq == entry[ENTRY_SEQ] and jobs.get(job.id) is job:
                    break
                heappop(heap)
            if fifo and not (heap and heap[0] < (-fifo[0].spec[S_PRIORITY], fifo[0].spec[S_ENQUEUED_AT], seqs[0])):
                job, seq = fifo[0], seqs[0]     # a live head: its entry's key is the job's
                undo += (fifo_restore_head, q, job, seq)
                fifo.popleft()
                seqs.popleft()
                entry = None                    # made only for a job held back (gating.block)
            elif heap:
                entry = heap[0]
                undo += (heap_restore, heap, entry, None)
                heappop(heap)
                job = entry[ENTRY_JOB]
            else:
                break
            deadline, r = job.spec[S_DEADLINE], job.spec[S_RESOURCE]
            if (deadline is not None or r is not None) and _held_or_expired(m, q, job, entry, deadline, r, now):
                continue
            if probe == 1:
                gating.set_probe(m, q, job.id)
            expires = now + lease_ms
            undo += (setattr, job, "state", job.state, setattr, job, "lease_expires", job.lease_expires)
            job.state, job.lease_expires = IN_FLIGHT, expires
            if deadline is not None:
                m._set(job, "deadline", None)
            undo += (setattr, q, "ready", q.ready, setattr, q, "in_flight", q.in_flight)
            q.ready -= 1
            q.in_flight += 1
            ctr = m.ctr                         # lease(m, job, expires), inline
            undo += (setattr, m, "ctr", ctr)
            m.ctr = ctr = ctr + 1
            lease = (expires, ctr, job.id)
            undo += (heap_remove, lease_heap, lease, None)
            heappush(lease_heap, lease)
            kept.append(shown_common(job) if r is None and job.spec[S_DEPENDS_ON] is None else shown_fields(job))
        if len(kept) >= max_jobs:
            break
    return RESERVED, tuple(kept)


def _gated_cap(m, q, now: int, n_kept: int, max_jobs: int) -> tuple:
    """(cap on the jobs kept after this queue, probe, rated) for a gated queue, cap None to skip
    it now: a circuit breaker (probe 1: one probe job; -1: no probe), windows, a queue-wide rate
    (rated: its hand-outs go through `take`, which logs them)."""
    probe = gating.reserve_cap(m, q, now)
    if probe == 0:
        return None, probe, False
    cap = n_kept + 1 if probe == 1 else max_jobs
    rate = m.limits.queue(q.name).rate
    if rate is None:
        return cap, probe, False
    room = keys.rate_room(q.rate_log, rate, now)
    if room <= 0:
        return None, probe, False
    return min(cap, n_kept + room), probe, True


def _held_or_expired(m, q, job, entry, deadline, r, now: int) -> bool:
    """Whether reserve passes over `job` (taken off the ready index; `entry` its heap entry, None
    from the FIFO): past its deadline (dead-lettered), or held back while its resource r is
    full. Else the job takes its slot of r."""
    if deadline is not None and deadline <= now:
        gating.leave_ready(m, q, job)
        dead_letter(m, job, q, "expired", None)   # too late to ever run
        return True
    if r is not None:                    # a throttle: hold it back while r is full
        n = m.in_use.get(r, 0)
        limit = m.limits.resource_limits.get(r)
        if limit is not None and n >= limit:
            gating.block(m, q, r, entry if entry is not None else ready_entry(job))
            return True
        m._put(m.in_use, r, n + 1)
    return False


def take(m, q, cap: int, kept: list, lease_ms: int, probe: int) -> None:
    """Reserve from a queue with keyed jobs or a queue-wide rate: the rotation (node/core/keys.py)
    names the key to serve, the rest is reserve's loop (the hand-out written inline, as there)."""
    now = m.clock
    if m.key_timers and m.key_timers[0][TIMER_AT] <= now:
        keys.fire_timers(m, now, m.limits.sweep_limit)
    ql = m.limits.queue(q.name)
    undo, lease_heap = m._undo, m.lease_heap
    while len(kept) < cap:
        qk = q.keys
        if qk is None:
            e = keys.plain_head(m, q)
            key = lim = None
        else:
            key, e, lim = _pick(m, q, qk, ql, now)
        if e is None:
            break
        if lim is not None:                  # off the key's heap
            heap = key.heap
            undo += (heap_restore, heap, e, None)
            heappop(heap)
        else:
            _pop_entry(m, q, e)
        job = e[ENTRY_JOB]
        deadline, r = job.spec[S_DEADLINE], job.spec[S_RESOURCE]
        if (deadline is not None or r is not None) and _passed_over(m, q, key, lim, e, deadline, r, now):
            continue
        if probe == 1:
            gating.set_probe(m, q, job.id)
        # hand_out(m, q, job, expires), inline
        expires = now + lease_ms
        undo += (setattr, job, "state", job.state)
        job.state = IN_FLIGHT
        undo += (setattr, job, "lease_expires", job.lease_expires)
        job.lease_expires = expires
        if deadline is not None:
            m._set(job, "deadline", None)
        n = q.ready
        undo += (setattr, q, "ready", n)
        q.ready = n - 1
        n = q.in_flight
        undo += (setattr, q, "in_flight", n)
        q.in_flight = n + 1
        ctr = m.ctr
        undo += (setattr, m, "ctr", ctr)
        m.ctr = ctr = ctr + 1
        entry = (expires, ctr, job.id)
        undo += (heap_remove, lease_heap, entry, None)
        heappush(lease_heap, entry)
        if ql.rate is not None:
            m._set(q, "rate_log", keys.logged(q.rate_log, ql.rate, now))
        if lim is not None:
            # shown_fields(job), inline, with literal positions (checked against jobs.S_* below
            # take): the keyed hand-out is the hot path of docs/performance.md's keys figure.
            s = job.spec
            t = (job.id, s[0], s[1], job.payload, s[2], s[3], s[4], s[5], s[6], s[7], s[14],
                 s[8], expires, s[9], s[10], s[13], r, key.name)
            kept.append(t if s[17] is None else t + (s[17],))
            _served(m, q, key, job, now, lim, ctr)
            continue
        kept.append(shown_fields(job))
        if key is not None:
            # The level served: requeue may move the key to another level (its next job's).
            level, vpass = key.vlevel, key.vpass
            keys.served(m, key)
            keys.requeue(m, q, qk, key)
            keys.catch_up(m, qk, level, vpass)


# The literal spec positions of take's inline shown_fields.
assert (S_QUEUE, S_JOB_TYPE, S_ENCODING, S_PRIORITY, S_CUSTOM, S_TRACE, S_ENQUEUED_AT, S_SCHEDULED_AT, S_ATTEMPT,
        S_MAX_ATTEMPTS, S_DEADLINE, S_TIMEOUT_MS, S_RELEASES, S_DEPENDS_ON) == (0, 1, 2, 3, 4, 5, 6, 7, 14, 8, 9, 10, 13, 17)


def _passed_over(m, q, key, lim, e, deadline, r, now: int) -> bool:
    """Whether `take` must pass over the job of entry `e` (of `key`, limits `lim`): past its
    deadline (dead-lettered), or held back while its resource r is full; the key goes back in
    the rotation. Else the job takes its slot of r."""
    job = e[ENTRY_JOB]
    if deadline is not None and deadline <= now:
        gating.leave_ready(m, q, job)
        dead_letter(m, job, q, "expired", None)   # too late to ever run
        _back(m, q, key)
        return True
    if r is not None:                    # a throttle: hold it back while r is full
        n = m.in_use.get(r, 0)
        limit = m.limits.resource_limits.get(r)
        if limit is not None and n >= limit:
            gating.block(m, q, r, e)
            if lim is not None:
                keys.left_ready(m, q, job)
            _back(m, q, key)
            return True
        m._put(m.in_use, r, n + 1)
    return False


def _pick(m, q, qk, ql, now: int):
    """(key, its best ready entry, the key's limits or None for the jobs without a key) that the
    rotation serves next, or (None, None, None): stale rotation entries are dropped, a key whose
    best job changed level moves, a key at a limit (a lowered limit) is held."""
    sched = qk.sched
    while sched:
        top = sched[0]
        level, _, _, turn, key = top
        if key.turn != turn:
            m._heappop(sched)               # stale: logged all the same (keys.key_head says why)
            continue
        name = key.name
        if name is None:
            e = keys.plain_head(m, q)
        else:
            heap = key.heap         # keys.key_head, inline
            e = heap[0] if heap else None
            if e is not None:
                job = e[ENTRY_JOB]
                if not (job.state == READY and job.seq == e[ENTRY_SEQ] and m.jobs.get(job.id) is job):
                    e = keys.key_head(m, key)
        if e is None:
            keys.unschedule(m, key)
            continue
        if e[ENTRY_NEG_PRIORITY] != level:
            keys.schedule(m, qk, key, e[ENTRY_NEG_PRIORITY])
            continue
        lim = None
        if name is not None:
            if ql.key_limits or ql.key_weights:
                lim = keys.key_limits(ql, name)
            else:                           # keys.key_limits, inline: every key alike
                lim = (ql.key_concurrency, ql.key_rate, 1)
            conc, rate, _ = lim
            if (conc is not None and key.in_flight >= conc) \
                    or (rate is not None and keys.rate_room(key.log, rate, now) <= 0):
                keys.hold(m, q, qk, key, keys.limit_reached(key, lim, now))
                gating.key_held(m, key)
                continue
        # m._heappop(sched) and keys.unschedule(m, key), inline: its entry is the one popped
        undo = m._undo
        undo += (heap_restore, sched, top, None)
        heappop(sched)
        undo += (setattr, key, "level", level)
        key.level = None
        undo += (setattr, key, "turn", turn)
        key.turn = None
        return key, e, lim
    return None, None, None


def _pop_entry(m, q, e) -> None:
    """Take head entry `e` of a job without a key off the queue's own FIFO or heap (a keyed
    job's entry leaves its key's heap inline, in take)."""
    fifo = q.ready_fifo
    if fifo and fifo[0] is e[ENTRY_JOB] and q.fifo_seqs[0] == e[ENTRY_SEQ]:
        m._undo += (fifo_restore_head, q, fifo[0], q.fifo_seqs[0])
        fifo.popleft()
        q.fifo_seqs.popleft()
    else:
        m._heappop(q.ready_heap)


def _back(m, q, key) -> None:
    """A key passed over (its job expired or held back by a resource) goes back in the rotation."""
    if key is not None and q.keys is not None:
        keys.requeue(m, q, q.keys, key)


def _served(m, q, key, job, now: int, lim: tuple, ctr: int) -> None:
    """A job of key `key` (limits `lim`) was handed out, its lease entry taking counter `ctr`: its
    counts, window and virtual time move (keys.served and the ready count, written inline: reserve's
    hot path; the lease's counter is the key's `since`, as fresh as a new one); it goes back in
    the rotation unless a limit now holds it."""
    qk = q.keys
    conc, rate, weight = lim
    undo = m._undo
    n = key.ready
    undo += (setattr, key, "ready", n)
    key.ready = n - 1
    n = key.in_flight
    undo += (setattr, key, "in_flight", n)
    key.in_flight = n + 1
    r = job.spec[S_RESOURCE]
    if r is not None:
        keys.count_resource(m, key, r, -1)
    if rate is not None:
        m._set(key, "log", keys.logged(key.log, rate, now))
    level, vpass = key.vlevel, key.vpass
    undo += (setattr, key, "vpass", vpass)
    key.vpass = vpass + keys.WEIGHT_SCALE // weight
    undo += (setattr, key, "since", key.since)
    key.since = ctr
    if conc is not None and key.in_flight >= conc and key.held is None:
        # keys.hold(m, q, qk, key, CONCURRENCY), inline: the key left the rotation when picked
        n = qk.held_ready
        undo += (setattr, qk, "held_ready", n)
        qk.held_ready = n + key.ready
        n = qk.held_keys
        undo += (setattr, qk, "held_keys", n)
        qk.held_keys = n + 1
        undo += (setattr, key, "held", None)
        key.held = keys.CONCURRENCY
        if key.resources is not None:
            gating.key_held(m, key)
    else:
        why = keys.limit_reached(key, lim, now)
        if why is not None:
            keys.hold(m, q, qk, key, why)
            gating.key_held(m, key)
        else:
            keys.requeue(m, q, qk, key)
    keys.catch_up(m, qk, level, vpass)


def hand_out(m, q, job: Job, expires: int) -> None:
    """A READY job goes in flight under a lease until `expires` (reserve's loop inlines this)."""
    m._set(job, "state", IN_FLIGHT)
    m._set(job, "lease_expires", expires)
    if job.deadline is not None:
        m._set(job, "deadline", None)
    m._add(q, "ready", -1)
    m._add(q, "in_flight", 1)
    lease(m, job, expires)


def lease(m, job: Job, expires: int):
    """A new lease entry. It names its job by id, not by reference: an acked job is freed at
    once (payload included) instead of living on in its stale entry until the lease would have
    expired, and the entry, all atomic, is nothing the cyclic GC has to traverse. An entry is
    live while jobs[id] is in flight with this expiry (ids are fresh UUIDs)."""
    m._push(m.lease_heap, (expires, m._new_ctr(), job.id))


# ---------------------------------------------------------------------------- ack / nack / extend
def fenced(m, job_id: str, attempt: int):
    """(job, None) for the in-flight job under this attempt, else (None, the fencing error)."""
    job = m.jobs.get(job_id)
    if job is None or job.state != IN_FLIGHT:
        return None, ops.job_not_found(job_id)
    if job.attempt != attempt:
        return None, ops.attempt_mismatch(job_id, job.attempt, attempt)
    return job, None


def ack(m, job_id: str, attempt: int, result=None):
    """The job is removed for good (its dedup record stays until the window ends); in a queue
    that retains finished jobs it is kept, with the ack's result, for the queue's
    result_retention_ms (node/core/results.py; elsewhere a result is dropped)."""
    if result is not None and not results.well_formed(result):
        raise TypeError("result")               # not a command validation makes: internal, nothing changed
    job = m.jobs.get(job_id)
    if job is None or job.state != IN_FLIGHT or job.spec[S_ATTEMPT] != attempt:
        return fenced(m, job_id, attempt)[1]
    # The job leaves in-flight and the acked count grows, with the undo log written inline.
    undo = m._undo
    undo += (setattr, job, "state", job.state)
    job.state = GONE
    jobs = m.jobs
    undo += (restore_item, jobs, job.id, job)
    del jobs[job.id]
    spec = job.spec
    q = m.queues[spec[S_QUEUE]]
    n = q.in_flight                     # gating.leave_in_flight(m, job, q, OK), inline
    undo += (setattr, q, "in_flight", n)
    q.in_flight = n - 1
    if spec[S_RESOURCE] is not None or q.circuit is not None or spec[S_KEY] is not None:
        gating.gate_leave(m, job, q, gating.OK)
    n = q.acked
    undo += (setattr, q, "acked", n)
    q.acked = n + 1
    retaining = m.retaining             # m.limits.retaining, kept on the machine: one load an ack
    pins = m.pins                       # live dependents that read this job's result (deps.py)
    if ((retaining and spec[S_QUEUE] in retaining) or (pins and job_id in pins)
            or (m.batch_of and job_id in m.batch_of)):      # its batch's callbacks read it (batches.py)
        results.retain(m, job, spec[S_QUEUE], result)
    if spec[S_DEPENDS_ON] is not None:
        deps.unpin(m, job)
    if m.dependents and job_id in m.dependents:
        deps.ended(m, job_id, True)         # its dependents, in this command (node/core/deps.py)
    if m.batch_of and job_id in m.batch_of:
        batches.member_ended(m, job_id, "succeeded")    # its batch's callbacks (node/core/batches.py)
    return JOB_ID, job_id


def ack_batch(m, pairs):
    return ops.acked_batch(tuple([ack(m, *pair) for pair in pairs]))


def nack(m, job_id: str, attempt: int, reason, strategy: str, delay_ms):
    """Dead-letter (asked for, or attempts exhausted) or retry after a delay."""
    job, err = fenced(m, job_id, attempt)
    if err:
        return err
    q = m.queues[job.queue]
    m._add(q, "nacked", 1)
    m._set(job, "last_reason", reason)
    if strategy == DEAD_LETTER:
        gating.leave_in_flight(m, job, q, gating.FAILED)
        dead_letter(m, job, q, "rejected", reason)
        return ops.nacked(job_id, True)
    used = job.attempt - job.releases       # attempts used (a release uses none)
    if used >= job.max_attempts:
        gating.leave_in_flight(m, job, q, gating.FAILED)
        dead_letter(m, job, q, "attempts_exhausted", reason)
        return ops.nacked(job_id, True)
    ql = m.limits.queue(job.queue)
    if strategy == DELAY:
        delay = min(delay_ms, ql.max_schedule_horizon_ms)
    else:
        delay = policy_delay_ms(job.id, used, ql.retry_delay_ms, ql.retry_backoff,
                                ql.retry_delay_max_ms, ql.max_schedule_horizon_ms)
    m._set(job, "attempt", job.attempt + 1)
    gating.leave_in_flight(m, job, q, gating.FAILED)
    if delay <= 0:
        make_ready(m, job, q)
    else:
        schedule(m, job, q, m.clock + delay)
    return ops.nacked(job_id, False)


def release(m, job_id: str, attempt: int, delay_ms, reason):
    """The worker hands the job back without using an attempt (docs/semantics.md "Release"): the
    delivery fence `attempt` grows by one, as on a redelivery (so the releasing worker's later
    ack, nack or extend is refused with attempt_mismatch), and so does `releases`, so the
    attempts used (attempt - releases) stay as they were. delay_ms 0: ready at once, in its
    place (like a retry); > 0: scheduled, clamped to the queue's max_schedule_horizon_ms."""
    job, err = fenced(m, job_id, attempt)
    if err:
        return err
    q = m.queues[job.queue]
    m._set(job, "attempt", job.attempt + 1)
    m._set(job, "releases", job.releases + 1)
    if reason is not None:
        m._set(job, "last_reason", reason)
    gating.leave_in_flight(m, job, q, gating.NEUTRAL)     # its slot frees; not a breaker failure
    delay = min(delay_ms or 0, m.limits.queue(job.queue).max_schedule_horizon_ms)
    if delay <= 0:
        make_ready(m, job, q)
    else:
        schedule(m, job, q, m.clock + delay)
    return JOB_ID, job_id


def extend(m, job_id: str, attempt: int, lease_ms: int):
    """New lease deadline = now + lease, clamped to the queue's max; attempt unchanged."""
    job, err = fenced(m, job_id, attempt)
    if err:
        return err
    lease_ms = max(1, min(lease_ms, m.limits.queue(job.queue).max_lease_duration_ms))
    expires = m.clock + lease_ms
    m._set(job, "lease_expires", expires)
    lease(m, job, expires)
    return ops.extended(job_id, expires)


def make_ready(m, job: Job, q: Queue):
    """A job that has left its previous count becomes ready. A retried job keeps its
    enqueued_at and sequence: it goes ahead of newer jobs."""
    m._set(job, "state", READY)
    ready_push(m, q, ready_entry(job))
    m._add(q, "ready", 1)


def schedule(m, job: Job, q: Queue, run_at: int):
    """A job that has left its previous count waits until run_at."""
    m._set(job, "state", SCHEDULED)
    m._set(job, "run_at", run_at)
    m._push(m.sched_heap, (run_at, job.seq, job))
    m._add(q, "scheduled", 1)


ready_push = gating.ready_push


# ---------------------------------------------------------------------------- dead letters
def dead_letter(m, job: Job, q: Queue, cause: str, reason):
    """Move a job that has already left its ready/scheduled/in-flight count to the dead
    letters (or drop it, without a store); a queue with dead_letter_forward gets the record job
    of a forwarded cause in the same command. Its dependents (node/core/deps.py) learn it failed,
    after its own record (without a store: in `forget`)."""
    m._add(q, "dead_total", 1)
    if cause == "expired":
        m._add(q, "expired", 1)
    ql = m.limits.queue(job.queue)
    if ql.dead_letter_forward is not None and cause in ql.dead_letter_forward_causes:
        forward(m, job, cause, reason, ql.dead_letter_forward)
    if m.batch_of and job.id in m.batch_of:
        batches.member_ended(m, job.id, "failed")   # its batch's on_failure (node/core/batches.py)
    if m.limits.dead_letter_retention_ms <= 0:
        forget(m, job)
        return
    m._set(job, "state", DEAD)
    m._add(q, "dead", 1)
    m._put(q.dead_by_cause, cause, q.dead_by_cause.get(cause, 0) + 1)
    rec = DeadLetter(job, cause, m.clock, job.attempt, reason, m._new_ctr())
    m._put(m.dlq, job.id, rec)
    per_queue = m.dlq_by_queue.get(job.queue)
    if per_queue is None:
        per_queue = OrderedDict()
        m._put(m.dlq_by_queue, job.queue, per_queue)
    m._put(per_queue, job.id, rec)
    if job.spec[S_DEPENDS_ON] is not None:
        deps.unpin(m, job)
    if m.dependents and job.id in m.dependents:
        deps.ended(m, job.id, False)


def drop_dead_letter(m, job_id: str) -> DeadLetter:
    """Take a record out of the store (both indexes and the queue's counts)."""
    rec = m._odict_pop(m.dlq, job_id)
    job = rec.job
    m._odict_pop(m.dlq_by_queue[job.queue], job_id)
    q = m.queues[job.queue]
    m._add(q, "dead", -1)
    n = q.dead_by_cause.get(rec.cause, 0)
    if n > 1:
        m._put(q.dead_by_cause, rec.cause, n - 1)
    elif n == 1:
        m._pop(q.dead_by_cause, rec.cause)
    return rec


# A forward's record job id: a name-based UUID (version 5) of the dead-lettered job's id and the
# machine's counter at the forward, so every replica makes the same id and a job dead-lettered
# again (after a requeue) forwards a record with a new one.
_RECORD_NAMESPACE = uuid.UUID("5b0f8c1e-3c1d-4d7e-9a43-6d2f0c7a9e11")


def record_job_id(job_id: str, ctr: int) -> str:
    return str(uuid.uuid5(_RECORD_NAMESPACE, f"{job_id}/{ctr}"))


def forward(m, job: Job, cause: str, reason, fwd: str):
    """One record job of this dead letter into queue `fwd` (docs/semantics.md "Dead-letter
    forwarding"): job type raftq.dead_letter, a JSON payload with the cause, the last reason,
    when, the final attempt and the job as the API shows it. It is an ordinary ready job of
    the forward queue (its default priority and max_attempts), made past the queue's depth limit
    (a forward is never lost) and none of the enqueue checks (the cluster makes it); it carries
    no deadline, so nothing in this command dead-letters it in turn."""
    kept = m.limits.dead_letter_retention_ms > 0
    record = render_dead_letter(shown_fields(job), cause, m.clock, job.attempt, reason)
    record["dead_letter_kept"] = kept
    body = orjson.dumps(record)
    fl = m.limits.queue(fwd)
    custom = {"dead_letter_cause": cause, "dead_letter_queue": job.queue, "dead_letter_job_id": job.id}
    item = ops.item(record_job_id(job.id, m._new_ctr()), fwd, DEAD_LETTER_RECORD_TYPE, body, "application/json",
                    fl.default_priority, fl.default_max_attempts, custom, job.trace, None, None, None)
    return _enqueue_one(m, item, m.clock, False)


def forget(m, job: Job):
    """The job leaves the machine (a live one's dependents, node/core/deps.py, count it failed;
    a live one's dependencies are no longer read by it; a member's batch counts it removed)."""
    if job.spec[S_DEPENDS_ON] is not None and job.state != DEAD:
        deps.unpin(m, job)
    if m.batch_of and job.id in m.batch_of:
        batches.member_ended(m, job.id, "removed")
    m._set(job, "state", GONE)
    m._pop(m.jobs, job.id)
    if m.dependents and job.id in m.dependents:
        deps.ended(m, job.id, False)


def drain(m, queue, max_records: int, who=UNAUDITED):
    """Up to max_records dead letters, oldest first, removed in the same command."""
    source = m.dlq if queue is None else m.dlq_by_queue.get(queue, ())
    ids = []
    for job_id in source:
        if len(ids) >= max_records:
            break
        ids.append(job_id)
    records = []
    for job_id in ids:
        rec = drop_dead_letter(m, job_id)
        forget(m, rec.job)
        records.append((shown_fields(rec.job), rec.cause, rec.failed_at, rec.final_attempt, rec.reason))
    audit.record(m, who, "drain", queue, {"drained": len(ids), "ids": audit.ids_shown(ids)})
    return ops.drained(tuple(records))


def requeue(m, ids, who=UNAUDITED):
    """Back to ready: same id, attempt 1, enqueued now, no schedule, no deadline."""
    requeued, missing = [], []
    for job_id in ids:
        if job_id not in m.dlq:
            missing.append(job_id)
            continue
        job = drop_dead_letter(m, job_id).job
        q = m.queues[job.queue]
        m._set(job, "attempt", 1)
        if job.releases:
            m._set(job, "releases", 0)
        m._set(job, "enqueued_at", m.clock)
        m._set(job, "scheduled_at", None)
        m._set(job, "deadline", None)
        m._set(job, "seq", m._new_seq())
        make_ready(m, job, q)
        if job.spec[S_DEPENDS_ON] is not None:
            deps.pin(m, job)                # live again: it reads its dependencies' results
        requeued.append(job_id)
    audit.record(m, who, "requeue", None, {"requeued": len(requeued), "missing": len(missing),
                                           "ids": audit.ids_shown(requeued)})
    return ops.requeued(tuple(requeued), tuple(missing))


def delete_dead_letters(m, ids, who=UNAUDITED):
    deleted, missing = [], []
    for job_id in ids:
        if job_id not in m.dlq:
            missing.append(job_id)
            continue
        forget(m, drop_dead_letter(m, job_id).job)
        deleted.append(job_id)
    audit.record(m, who, "dead_letters_delete", None, {"deleted": len(deleted), "missing": len(missing),
                                                       "ids": audit.ids_shown(deleted)})
    return ops.deleted(tuple(deleted), tuple(missing))


# ---------------------------------------------------------------------------- operator moves
def cancel(m, job_id: str, who=UNAUDITED, in_flight=False, cascade=False):
    """A ready, scheduled or in-flight job is removed for good. An in-flight job's lease is
    dropped with it (its entry is stale once the job has left): its worker's next extend, ack,
    nack or release is answered job_not_found, and it is never redelivered (docs/semantics.md
    "Cancel of a running job"). A cancel command of a 0.1.0 journal has no `in_flight` field: it
    refuses an in-flight job with failed_precondition, as it did then, so old journals replay
    unchanged. A job that others wait on (docs/semantics.md "Dependencies") is refused unless
    `cascade`: then its waiting dependents, transitively, are removed first (the deepest first,
    so none is failed by another's removal) and named in the answer."""
    if type(in_flight) is not bool or type(cascade) is not bool:
        raise TypeError("in_flight, cascade")
    job = m.jobs.get(job_id)
    if job is None or job.state == DEAD:
        return ops.cancel_not_found(job_id)
    if job.state == IN_FLIGHT and not in_flight:
        return ops.cancel_in_flight(job_id)
    waiting = m.dependents.get(job_id) if m.dependents else None
    if waiting and not cascade:
        return ops.has_dependents(job_id, tuple(sorted(waiting)[:100]))
    gone = deps.waiting_dependents(m, job_id) if waiting else ()
    for dependent_id in gone:
        remove(m, m.jobs[dependent_id])
    remove(m, job)
    audit.record(m, who, "cancel", job_id, {"queue": job.queue, **({"cascade": len(gone)} if cascade else {})})
    return ops.cancelled(job_id, tuple(sorted(gone))) if cascade else (JOB_ID, job_id)


def remove(m, job) -> None:
    """A live job leaves its state and the machine (cancel; a batch's cancel)."""
    q = m.queues[job.queue]
    if job.state == IN_FLIGHT:              # a running job: its slot and probe go too
        gating.leave_in_flight(m, job, q, gating.NEUTRAL)
    elif job.state == WAITING:              # on its dependencies (node/core/deps.py)
        deps.leave(m, q, job)
    else:
        gating.leave_waiting(m, q, job)
    forget(m, job)


def pause(m, queue: str, paused: bool, create: bool = True, who=UNAUDITED):
    """Reserve skips a paused queue; enqueues are still accepted. A queue that neither exists
    nor is declared is made only when the command says so (`create`; 0.1.0 always made it)."""
    if not create and not known_queue(m, queue):
        return ops.queue_not_found(queue)
    q = m.ensure_queue(queue)
    m._set(q, "paused", paused)
    audit.record(m, who, "pause" if paused else "resume", queue, {})
    return ops.paused_result(queue, paused)


def _live_waiting(m, q: Queue) -> tuple[list, list]:
    """The ready and the scheduled jobs of queue q (each once)."""
    jobs = m.jobs
    blocked = [h for per in m.blocked.values() for n, h in per.items() if n == q.name]
    if q.keys is not None:
        blocked += [k.heap for k in q.keys.by_key.values()]      # keyed jobs: their keys' heaps
    ready = [e[ENTRY_JOB] for e in chain(q.ready_heap, q.fifo_entries(), *blocked) if is_live_entry(e, jobs)]
    name = q.name
    scheduled = list({id(job): job for run_at, _, job in m.sched_heap
                      if job.queue == name and job.state == SCHEDULED and job.run_at == run_at
                      and jobs.get(job.id) is job}.values())
    return ready, scheduled


def move_to_dead_letters(m, queue: str, ids, reason, who=UNAUDITED):
    """Ready or scheduled jobs of `queue` become dead letters, cause admin, the reason as their
    last_reason; any other id (in flight included) is missing and left alone."""
    if not known_queue(m, queue):
        return ops.queue_not_found(queue)
    moved, missing = [], []
    for job_id in ids:
        job = m.jobs.get(job_id)
        if job is None or job.queue != queue or job.state not in (READY, SCHEDULED):
            missing.append(job_id)
            continue
        q = m.queues[queue]
        gating.leave_waiting(m, q, job)
        m._set(job, "last_reason", reason)
        dead_letter(m, job, q, "admin", reason)
        moved.append(job_id)
    audit.record(m, who, "dead_letter_move", queue, {"dead_lettered": len(moved), "missing": len(missing),
                                                     "reason": reason, "ids": audit.ids_shown(moved)})
    return ops.moved(tuple(moved), tuple(missing))


def _purge_waiting(m, q, ids) -> int:
    """Purge, after its ready and scheduled jobs: the jobs of `ids` (those waiting on
    dependencies when it began, in id order: the same on every node, whatever order a restore
    filled `pending_deps` in) still waiting, or ready or scheduled since a removal of this purge
    released them; not one failed by a removal (a dead letter). Their dependents count them failed."""
    jobs = m.jobs
    n = 0
    for job_id in ids:
        job = jobs.get(job_id)
        if job is None or job.state not in (WAITING, READY, SCHEDULED):
            continue
        if job.state == WAITING:
            deps.leave(m, q, job)
        else:
            gating.leave_waiting(m, q, job)
        forget(m, job)
        n += 1
    return n


def purge(m, queue: str, who=UNAUDITED):
    """Every ready, scheduled and waiting job of the queue is removed; in-flight jobs finish
    normally. The ready and scheduled ones go first, in id order (a removal's dependents are
    resolved as it goes: the order must be the same on every node, and a heap's or a restored
    heap's is not), out of their indexes before any goes, so that a job a removal makes ready
    is indexed; then the waiting ones (`_purge_waiting`)."""
    if not known_queue(m, queue):
        return ops.queue_not_found(queue)
    q = m.queues.get(queue)
    n = 0
    if q is not None:
        waiting = sorted(i for i in m.pending_deps if m.jobs[i].queue == queue) if m.pending_deps else ()
        ready, scheduled = _live_waiting(m, q)
        ids = m.blocked_ids
        for job in ready:
            if ids and job.id in ids:
                m._pop(ids, job.id)
        if ready:
            m._add(q, "ready", -len(ready))
            # Every entry of the ready index is stale now: drop them at once.
            m._set(q, "ready_heap", [])
            m._set(q, "ready_fifo", deque())
            m._set(q, "fifo_seqs", deque())
            if q.throttled:
                m._set(q, "throttled", 0)
                gating.drop_queue_blocked(m, q.name)
            keys.purged(m, q)
        if scheduled:
            m._add(q, "scheduled", -len(scheduled))
        for job in sorted(ready + scheduled, key=_job_id):
            forget(m, job)
        n = len(ready) + len(scheduled) + _purge_waiting(m, q, waiting)
    audit.record(m, who, "purge", queue, {"purged": n})
    return ops.purged(queue, n)


def _job_id(job) -> str:
    return job.id


def delete_queue(m, queue: str, who=UNAUDITED):
    """An undeclared queue with no job in any state leaves the machine (counters included)."""
    q = m.queues.get(queue)
    if queue in m.limits.queues:
        return ops.queue_refused("declared", queue, {} if q is None else _queue_jobs(q))
    if q is None:
        return ops.queue_not_found(queue)
    if q.depth() or q.dead:
        return ops.queue_refused("not_empty", queue, _queue_jobs(q))
    m._pop(m.queues, queue)
    if queue in m.dlq_by_queue:
        m._pop(m.dlq_by_queue, queue)
    audit.record(m, who, "queue_delete", queue, {})
    return ops.queue_deleted(queue)


def _queue_jobs(q) -> dict:
    """A refused queue delete's `jobs`: its counts by state, `waiting` (on dependencies) while
    there are some (it counted in the refusal but was left out of the answer)."""
    jobs = {"ready": q.ready, "scheduled": q.scheduled, "in_flight": q.in_flight, "dead_lettered": q.dead}
    if q.waiting:
        jobs["waiting"] = q.waiting
    return jobs


# ---------------------------------------------------------------------------- actions done elsewhere
def record_action(m, action: str, target, details: dict, who=UNAUDITED):
    """An audit entry for an operator action the node did outside the machine (a membership
    change, committed through pysyncobj's own entries). Only the leader builds this command;
    anything but a known action with builtins fields is malformed (reverted, nothing kept)."""
    if action not in ops.RECORDED_ACTIONS or (target is not None and type(target) is not str) \
            or type(details) is not dict \
            or not all(type(k) is str and (v is None or type(v) in (str, int, bool)) for k, v in details.items()):
        raise ValueError("not a recordable action")
    audit.record(m, who, action, target, dict(details))
    return ops.recorded(action)


deps.bind(dead_letter, make_ready, schedule)
batches.bind(lambda m, item: _enqueue_one(m, item, m.clock, False),     # a callback: past the depth limit
             lambda m, items: enqueue(m, ATOMIC, items), remove)       # what a dependency's end does (node/core/deps.py)
