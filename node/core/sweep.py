"""The sweep (docs/semantics.md "Lease expiry: the sweep"): one function per step, in order.

Every step handles at most `sweep_limit` due entries per sweep (its own budget, so one backlog
cannot starve the rest) and leaves the rest to the next sweep. Budgets count live entries only:
a node restored from a snapshot holds no stale heap entries, so counting those would let
replicas expire different sets in one sweep. Stale entries met on the way are dropped (through
the undo log, like everything a command changes).
"""
from __future__ import annotations

from . import audit, batches, deps, gating, keys, ops, results, schedules
from .handlers import dead_letter, drop_dead_letter, forget, make_ready
from .jobs import DEDUP_KEY, IN_FLIGHT, READY, SCHEDULED, TIMER_AT, WAITING, dedup_expires, dedup_queue


def sweep(m):
    """Apply every step at the replicated clock; the result says what each did."""
    now, budget = m.clock, m.limits.sweep_limit
    if m.batch_heap:                    # (not counted in the answer: its steps are fixed)
        batches.fire_timers(m, now, budget)
    return ops.swept(promote_due_schedules(m, now, budget),
                     expire_leases(m, now, budget),
                     expire_deadlines(m, now, budget),
                     drop_dedup_records(m, now, budget),
                     drop_request_ids(m, now, budget),
                     drop_dead_letters_past_retention(m, now, budget),
                     audit.drop_past_retention(m, now, budget),
                     schedules.fire_due(m, now, m.limits.max_schedules_per_sweep),
                     keys.fire_timers(m, now, budget),
                     results.expire(m, now, budget))


def promote_due_schedules(m, now: int, budget: int) -> int:
    """1. Scheduled jobs whose time has come become ready."""
    heap, jobs, n = m.sched_heap, m.jobs, 0
    while heap and heap[0][TIMER_AT] <= now and n < budget:
        run_at, _, job = m._heappop(heap)
        if job.state == SCHEDULED and job.run_at == run_at and jobs.get(job.id) is job:
            n += 1
            q = m.queues[job.queue]
            m._add(q, "scheduled", -1)
            m._set(job, "run_at", None)
            make_ready(m, job, q)
    return n


def expire_leases(m, now: int, budget: int) -> int:
    """2. Lapsed leases: on the final attempt (attempts used, attempt - releases) the job is dead-lettered (cause lease_expired, no
    reason); otherwise it is ready at once with attempt + 1 (no retry policy for expiries)."""
    heap, jobs, n = m.lease_heap, m.jobs, 0
    while heap and heap[0][TIMER_AT] <= now and n < budget:
        expires, _, job_id = m._heappop(heap)
        job = jobs.get(job_id)
        if job is not None and job.state == IN_FLIGHT and job.lease_expires == expires:
            n += 1
            q = m.queues[job.queue]
            gating.leave_in_flight(m, job, q, gating.FAILED)
            if job.attempt - job.releases >= job.max_attempts:     # attempts used: releases use none
                m._set(job, "last_reason", None)
                dead_letter(m, job, q, "lease_expired", None)
            else:
                m._set(job, "attempt", job.attempt + 1)
                make_ready(m, job, q)
    return n


def expire_deadlines(m, now: int, budget: int) -> int:
    """Jobs whose deadline passed before they were reserved are dead-lettered, cause expired
    (a job in flight is not interrupted: its first delivery cleared the deadline)."""
    heap, jobs, n = m.deadline_heap, m.jobs, 0
    while heap and heap[0][TIMER_AT] <= now and n < budget:
        deadline, _, job = m._heappop(heap)
        if job.deadline == deadline and job.state in (READY, SCHEDULED, WAITING) and jobs.get(job.id) is job:
            n += 1
            q = m.queues[job.queue]
            if job.state == WAITING:        # on its dependencies (node/core/deps.py)
                deps.leave(m, q, job)
            else:
                gating.leave_waiting(m, q, job)
            dead_letter(m, job, q, "expired", None)
    return n


def drop_dedup_records(m, now: int, budget: int) -> int:
    """3a. Dedup records whose window has ended (the key creates a new job again)."""
    heap, dedup, n = m.dedup_heap, m.dedup, 0
    while heap and dedup_expires(heap[0]) <= now and n < budget:
        rec = m._heappop(heap)
        qname = dedup_queue(rec)
        keyed = dedup.get(qname)
        if keyed is not None and keyed.get(rec[DEDUP_KEY]) is rec:     # else a replaced record's
            n += 1
            m._pop(keyed, rec[DEDUP_KEY])
            if not keyed:
                m._pop(dedup, qname)
    return n


def drop_request_ids(m, now: int, budget: int) -> int:
    """3b. Request-id records past their window, earliest expiry first (a record's expiry is
    fixed when it is stored, with the window in force then)."""
    heap, rids, n = m.rid_heap, m.rids, 0
    while heap and heap[0][TIMER_AT] <= now and n < budget:
        expires, _, rid = m._heappop(heap)
        rec = rids.get(rid)
        if rec is not None and rec.expires == expires:
            n += 1
            m._pop(rids, rid)
    return n


def drop_dead_letters_past_retention(m, now: int, budget: int) -> int:
    """4. With retention on, dead letters older than dead_letter_retention_ms, oldest first
    (the retention in force at this sweep; with retention turned off by a configuration change,
    the records already kept stay until they are drained, requeued or deleted)."""
    retention = m.limits.dead_letter_retention_ms
    if retention <= 0:
        return 0
    dlq, n = m.dlq, 0
    while dlq and n < budget:
        first = next(iter(dlq))
        if dlq[first].failed_at > now - retention:
            break
        n += 1
        forget(m, drop_dead_letter(m, first).job)
    return n


def next_due_ms(m) -> int | None:
    """The earliest replicated time at which a sweep has work (stale entries may make it
    early, never late)."""
    due = [h[0][TIMER_AT] for h in (m.sched_heap, m.lease_heap, m.deadline_heap) if h]
    if m.dedup_heap:
        due.append(dedup_expires(m.dedup_heap[0]))
    if m.rid_heap:
        due.append(m.rid_heap[0][TIMER_AT])
    retention = m.limits.dead_letter_retention_ms
    if retention > 0 and m.dlq:
        due.append(m.dlq[next(iter(m.dlq))].failed_at + retention)
    if m.audit:
        due.append(m.audit[0][audit.AUDIT_AT] + m.limits.audit_retention_ms)
    if m.tick_heap:
        due.append(m.tick_heap[0][TIMER_AT])
    if m.key_timers:
        due.append(m.key_timers[0][TIMER_AT])
    if m.result_heap:
        due.append(m.result_heap[0][TIMER_AT])
    if m.batch_heap:                    # an open batch's timeout, a finished one's drop
        due.append(m.batch_heap[0][TIMER_AT])
    if m.limits.gated:
        g = gating.next_due_ms(m)
        if g is not None:
            due.append(g)
    return min(due) if due else None
