"""Dependencies between jobs (docs/semantics.md "Workflows", "Dependencies").

A job enqueued with `depends_on` ((job id, policy), ...) names jobs that exist (live, dead-lettered,
or retained after their ack: node/core/results.py); one the machine knows nothing of refuses the
job (`dependency_not_found`). Each dependency that has not ended keeps the job WAITING (counted in
its queue's `waiting`, part of its depth) until it ends, in the very command that ends it:

* it succeeds (an ack): every policy is satisfied;
* it is dead-lettered, or removed while live (cancel, purge): `complete` and `ignore` are
  satisfied; `success` fails the dependent, dead-lettered at once with cause `dependency_failed`,
  and so on down the graph (a work list, not recursion: a chain of any length).

A dependent whose dependencies are all satisfied leaves WAITING: scheduled when its
`scheduled_at` is still ahead, else ready in its place (its enqueue time and sequence). A
dependency that has already ended when the dependent is enqueued counts at once. A deadline runs
out for a waiting job like for any other (dead-lettered, cause expired).

A job keeps the pairs it was enqueued with (`job.depends_on`) for its life, and reads its
dependencies' results while it lives: a dependency acked while a live job names it is retained
(node/core/results.py), whatever its queue's result_retention_ms, until the last live job that
names it ends (`pin`, `unpin`; a dead-lettered dependent no longer reads, a requeued one reads
again).

State (replicated, in snapshots and the digest, only when there is some):
* `m.pending_deps`: job id -> {dependency id: policy}, the dependencies of each WAITING job that
  have not ended;
* `m.dependents`: dependency id -> {job id: policy}, the same pairs the other way round;
* derived from the live jobs' `depends_on` (rebuilt at restore): `m.pins`, dependency id ->
  {live job id naming it: None}.
`m.resolving` is the work list of the command being applied (not state).
"""
from __future__ import annotations

from . import results
from .jobs import DEAD, GONE, S_DEPENDS_ON, WAITING
from .ops import DEP_SUCCESS

# What a resolution does to a job, from node/core/handlers.py (which imports this module, so it
# hands them over with `bind` at its import instead of this module importing it back).
_dead_letter = _make_ready = _schedule = None


def bind(dead_letter, make_ready, schedule) -> None:
    global _dead_letter, _make_ready, _schedule
    _dead_letter, _make_ready, _schedule = dead_letter, make_ready, schedule


def missing(m, depends_on, made=()) -> str | None:
    """The first dependency the machine knows nothing of (neither a job, dead-lettered
    included, nor retained, nor one of `made`, the ids an atomic batch makes before), or None."""
    jobs, kept = m.jobs, m.results
    for dep_id, _ in depends_on:
        if dep_id not in jobs and dep_id not in kept and dep_id not in made:
            return dep_id
    return None


def waits(m, depends_on) -> bool:
    """Whether a job with these (known) dependencies must wait, or fails at once: False when
    every one has ended in a way its policy takes (the job is then made as if it had none)."""
    jobs = m.jobs
    for dep_id, policy in depends_on:
        dep = jobs.get(dep_id)
        if dep is not None and (dep.state != DEAD or policy == DEP_SUCCESS):
            return True
    return False


def fails_at_once(m, depends_on) -> bool:
    """Whether a job with these (known) dependencies is dead-lettered as it is made: a
    `success` one is a dead letter already (`attach`)."""
    jobs = m.jobs
    for dep_id, policy in depends_on:
        dep = jobs.get(dep_id)
        if dep is not None and dep.state == DEAD and policy == DEP_SUCCESS:
            return True
    return False


def attach(m, q, job, depends_on) -> None:
    """A job just made, taken out of its count again (`waits` said so): WAITING on the
    dependencies that have not ended, or dead-lettered at once (cause dependency_failed) when a
    `success` dependency is dead-lettered already. A dependency retained after its ack (not in
    `m.jobs`) has succeeded."""
    jobs = m.jobs
    pending = {}
    for dep_id, policy in depends_on:
        dep = jobs.get(dep_id)
        if dep is None:
            continue
        if dep.state == DEAD:
            if policy == DEP_SUCCESS:
                _dead_letter(m, job, q, "dependency_failed", None)
                return
            continue
        pending[dep_id] = policy                # (a later pair for one dependency wins)
    m._set(job, "state", WAITING)
    m._put(m.pending_deps, job.id, pending)
    for dep_id, policy in pending.items():
        per = m.dependents.get(dep_id)
        if per is None:
            per = {}
            m._put(m.dependents, dep_id, per)
        m._put(per, job.id, policy)
    m._add(q, "waiting", 1)


def leave(m, q, job) -> None:
    """A WAITING job leaves its state other than by its dependencies (cancel, deadline): its
    pending pairs go, its queue counts one waiting job less."""
    pending = m._pop(m.pending_deps, job.id)
    for dep_id in pending:
        per = m.dependents[dep_id]
        m._pop(per, job.id)
        if not per:
            m._pop(m.dependents, dep_id)
    m._add(q, "waiting", -1)


def ended(m, job_id: str, ok: bool) -> None:
    """Job `job_id` has ended (ok: succeeded; else dead-lettered or removed): its dependents
    are satisfied or failed, transitively, within this command."""
    work = m.resolving
    if work is not None:                # inside a resolution already: its loop takes this one
        work.append((job_id, ok))
        return
    m.resolving = work = [(job_id, ok)]
    try:
        while work:
            dep_id, ok = work.pop()
            per = m.dependents.get(dep_id)
            if per is None:
                continue
            m._pop(m.dependents, dep_id)
            for dependent_id, policy in sorted(per.items()):     # a fixed order on every node
                _one(m, dep_id, ok, dependent_id, policy)
    finally:
        m.resolving = None


def _one(m, dep_id: str, ok: bool, dependent_id: str, policy: str) -> None:
    job = m.jobs[dependent_id]
    q = m.queues[job.queue]
    pending = m.pending_deps[dependent_id]
    m._pop(pending, dep_id)                 # (the dependency's own entry has gone already)
    if not ok and policy == DEP_SUCCESS:
        leave(m, q, job)                    # its other dependencies forget it
        _dead_letter(m, job, q, "dependency_failed", None)    # its own dependents join the work list
        return
    if not pending:
        m._pop(m.pending_deps, dependent_id)
        m._add(q, "waiting", -1)
        _run(m, q, job)


def _run(m, q, job) -> None:
    """A dependent whose dependencies are all satisfied: scheduled if its time is ahead, else ready,
    with a new sequence (the ready entry it had when it was made is stale for good)."""
    m._set(job, "seq", m._new_seq())
    at = job.scheduled_at
    if at is not None and at > m.clock:
        _schedule(m, job, q, at)
    else:
        if job.run_at is not None:
            m._set(job, "run_at", None)
        _make_ready(m, job, q)
        m.released.add(q.name)          # soft state: wakes the queue's long polls (node/core/ops.py)


def waiting_dependents(m, job_id: str) -> list:
    """Every job waiting on `job_id`, transitively, the deepest first (each after all of its own
    waiting dependents): the order in which a cascade removes them, so that no removal fails one
    still to be removed. Children in id order: the same on every node."""
    order, done, stack = [], set(), [(job_id, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            if node != job_id:
                order.append(node)
            continue
        if node in done:
            continue
        done.add(node)
        stack.append((node, True))
        for child in sorted(m.dependents.get(node, ()), reverse=True):
            if child not in done:
                stack.append((child, False))
    return order


# ---------------------------------------------------------------------------- pins
def pin(m, job) -> None:
    """A live job that names dependencies: each is kept, once acked, while the job lives."""
    pins = m.pins
    for dep_id, _ in job.depends_on:
        per = pins.get(dep_id)
        if per is None:
            per = {}
            m._put(pins, dep_id, per)
        if job.id not in per:
            m._put(per, job.id, None)


def unpin(m, job) -> None:
    """A job that named dependencies has ended (acked, dead-lettered, removed): a dependency
    retained for it alone, whose own retention has run out, goes now."""
    pins = m.pins
    for dep_id, _ in job.depends_on:
        per = pins.get(dep_id)
        if per is None or job.id not in per:
            continue                    # (named twice: unpinned already)
        m._pop(per, job.id)
        if not per:
            m._pop(pins, dep_id)
            results.release(m, dep_id)


def pinned_jobs(m) -> dict:
    """The pins the live jobs make (what `m.pins` must hold; restore and the invariant)."""
    out: dict = {}
    for job in m.jobs.values():
        if job.spec[S_DEPENDS_ON] is not None and job.state != DEAD:
            for dep_id, _ in job.spec[S_DEPENDS_ON]:
                out.setdefault(dep_id, {})[job.id] = None
    return out


# ---------------------------------------------------------------------------- snapshots
def to_rows(m) -> list:
    """((job id, ((dependency id, policy), ...)), ...), sorted: the dependents index is derived."""
    return [(job_id, tuple(sorted(m.pending_deps[job_id].items()))) for job_id in sorted(m.pending_deps)]


def restore(m, rows) -> None:
    m.pins = pinned_jobs(m)
    for job_id, pairs in rows:
        m.pending_deps[job_id] = dict(tuple(p) for p in pairs)
        for dep_id, policy in pairs:
            m.dependents.setdefault(dep_id, {})[job_id] = policy


# ---------------------------------------------------------------------------- invariants
def check(m) -> list[str]:
    """Every WAITING job has pending dependencies, each a live job (not ended); the dependents
    index holds the same pairs; no other job has pending dependencies."""
    bad = []
    jobs = m.jobs
    pairs = set()
    for job_id, pending in m.pending_deps.items():
        job = jobs.get(job_id)
        if job is None or job.state != WAITING:
            bad.append(f"job {job_id} has pending dependencies but is not waiting")
        if not pending:
            bad.append(f"waiting job {job_id} with no pending dependency")
        for dep_id, policy in pending.items():
            dep = jobs.get(dep_id)
            if dep is None or dep.state in (DEAD, GONE):
                bad.append(f"job {job_id} waits on {dep_id}, which has ended")
            pairs.add((dep_id, job_id, policy))
    back = {(dep_id, job_id, policy) for dep_id, per in m.dependents.items() for job_id, policy in per.items()}
    if back != pairs:
        bad.append(f"the dependents index differs from the pending dependencies: {sorted(back ^ pairs)[:5]}")
    if any(not per for per in m.dependents.values()):
        bad.append("an empty entry in the dependents index")
    for job_id, job in jobs.items():
        if job.state == WAITING and job_id not in m.pending_deps:
            bad.append(f"waiting job {job_id} without pending dependencies")
    if m.pins != pinned_jobs(m):
        bad.append("the pins are not the live jobs' dependencies")
    return bad
