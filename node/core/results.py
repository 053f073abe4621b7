"""Job results (docs/semantics.md "Workflows", "Job results"): a finished job kept, with the result
its ack carried, for its queue's `result_retention_ms`.

A queue with `result_retention_ms` > 0 keeps every job acked in it as a `Retained` record (the
job, state `succeeded`, and its result if the ack carried one) until the replicated clock passes
`expires` (the ack's time plus the retention in force at the ack: fixed then, like a dedup
record's window). Acks in a queue that keeps none keep nothing, a result sent there is dropped, unless a live job
depends on the acked one (node/core/deps.py `pin`): then it is kept like this (its retention 0)
and stays past its expiry until the last live job that names it ends.

The state, all of it replicated (snapshots, the digest):
* `m.results`: job id -> Retained, every record kept;
* `m.result_heap`: (expires, order, job id), the expiry timers, lazy like the others (an entry is
  live while `m.results[id].order` is its order);
* derived from the records (rebuilt at restore): `m.results_by_queue`, queue -> OrderedDict of
  the records whose result still holds bytes, oldest first (the next to drop at the bound), and
  `m.result_bytes`, queue -> those results' total bytes (no entry for 0).

The bound (`max_retained_result_bytes`, per queue): an ack never fails because of it. A result
that does not fit drops the results of the oldest records of its queue until it does (each
record stays, `succeeded`, with `result_dropped`); a result larger than the bound on its own is
not kept (its record says `result_dropped` at once). A configuration change that lowers the bound
drops the oldest results of each queue over it in the same command.
"""
from __future__ import annotations

from collections import OrderedDict

from .jobs import GONE, TIMER_AT


class Retained:
    """A finished job kept for its queue's retention: `job` (GONE, as it was acked), its result
    (`data` bytes and `encoding`, both None without one), `finished_at` (the ack's time), `expires`,
    `order` (a machine counter: the record's place, oldest first) and `dropped` (the result went to
    the bound)."""
    __slots__ = ("job", "data", "encoding", "finished_at", "expires", "order", "dropped")

    def __init__(self, job, data, encoding, finished_at: int, expires: int, order: int, dropped: bool = False):
        self.job, self.data, self.encoding = job, data, encoding
        self.finished_at, self.expires, self.order, self.dropped = finished_at, expires, order, dropped

    def size(self) -> int:
        """The bytes this record's result counts against its queue's bound."""
        return len(self.data) if self.data is not None else 0

    def fields(self) -> tuple:
        """Everything but the job, the form snapshots and the digest keep after the job's tuple."""
        return self.data, self.encoding, self.finished_at, self.expires, self.order, self.dropped


def well_formed(result) -> bool:
    """An ack's result as validation makes it: (data bytes, encoding str)."""
    return type(result) is tuple and len(result) == 2 and type(result[0]) is bytes and type(result[1]) is str


def retain(m, job, qname: str, result) -> None:
    """Keep the acked `job` of queue `qname` (which retains: result_retention_ms > 0) with its
    result (None, or (data, encoding)) until now + retention."""
    ql = m.limits.queue(qname)
    now = m.clock
    data, encoding = (None, None) if result is None else result
    order = m._new_ctr()
    rec = Retained(job, data, encoding, now, now + ql.result_retention_ms, order)
    size = rec.size()
    if size:
        if size > ql.max_retained_result_bytes:
            rec.data, rec.encoding, rec.dropped = None, None, True
            size = 0
        else:
            make_room(m, qname, ql.max_retained_result_bytes - size)
    old = m.results.get(job.id)
    if old is not None:                 # (ids are fresh: never, but never two records of one id)
        forget(m, old)
    m._put(m.results, job.id, rec)
    m._push(m.result_heap, (rec.expires, order, job.id))
    if size:
        _index(m, qname, rec, size)


def _index(m, qname: str, rec: Retained, size: int) -> None:
    per = m.results_by_queue.get(qname)
    if per is None:
        per = OrderedDict()
        m._put(m.results_by_queue, qname, per)
    m._put(per, rec.job.id, rec)
    m._put(m.result_bytes, qname, m.result_bytes.get(qname, 0) + size)


def _unindex(m, qname: str, rec: Retained) -> None:
    """Take a record's result out of its queue's count and order (its result is still in it)."""
    per = m.results_by_queue[qname]
    m._odict_pop(per, rec.job.id)
    if not per:
        m._pop(m.results_by_queue, qname)
    left = m.result_bytes[qname] - rec.size()
    if left:
        m._put(m.result_bytes, qname, left)
    else:
        m._pop(m.result_bytes, qname)


def make_room(m, qname: str, room: int) -> int:
    """Drop the results of queue `qname`'s oldest records until its retained bytes are at most
    `room`; how many were dropped."""
    n = 0
    while m.result_bytes.get(qname, 0) > room:
        rec = next(iter(m.results_by_queue[qname].values()))
        _unindex(m, qname, rec)
        m._set(rec, "data", None)
        m._set(rec, "encoding", None)
        m._set(rec, "dropped", True)
        n += 1
    return n


def fit_bounds(m) -> None:
    """After a configuration change: every queue's retained results within its bound in force."""
    for qname in sorted(m.result_bytes):
        make_room(m, qname, m.limits.queue(qname).max_retained_result_bytes)


def forget(m, rec: Retained) -> None:
    """A record leaves (its retention ended)."""
    if rec.size():
        _unindex(m, rec.job.queue, rec)
    m._pop(m.results, rec.job.id)


def expire(m, now: int, budget: int) -> int:
    """Sweep step: records whose retention has ended, earliest expiry first. One that live jobs
    still name stays for them (deps.unpin removes it) and counts neither in the answer nor
    against the budget: a node restored from a snapshot has its timer again (restore cannot
    tell that it fired), so counting it would let replicas expire different sets."""
    heap, results, n = m.result_heap, m.results, 0
    while heap and heap[0][TIMER_AT] <= now and n < budget:
        _, order, job_id = m._heappop(heap)
        rec = results.get(job_id)
        if rec is not None and rec.order == order and not held(m, job_id):
            n += 1
            forget(m, rec)
    return n


def held(m, job_id: str) -> bool:
    """Whether a record is held past its retention: live jobs name it (node/core/deps.py), or it
    is a member of a batch still kept (node/core/batches.py)."""
    return job_id in m.pins or job_id in m.batch_kept


def release(m, job_id: str) -> None:
    """A hold on a record has ended: it goes now if its retention has and nothing else holds it."""
    rec = m.results.get(job_id)
    if rec is not None and rec.expires <= m.clock and not held(m, job_id):
        forget(m, rec)


def next_due_ms(m) -> int | None:
    return m.result_heap[0][TIMER_AT] if m.result_heap else None


def restore(m, rows) -> None:
    """The records of a snapshot (`to_rows`), with their timers and derived indexes."""
    from .jobs import Job
    for t, data, encoding, finished_at, expires, order, dropped in sorted(rows, key=lambda r: r[5]):
        job = Job.from_tuple(t)
        rec = Retained(job, data, encoding, finished_at, expires, order, dropped)
        m.results[job.id] = rec
        m.result_heap.append((expires, order, job.id))
        size = rec.size()
        if size:
            m.results_by_queue.setdefault(job.queue, OrderedDict())[job.id] = rec
            m.result_bytes[job.queue] = m.result_bytes.get(job.queue, 0) + size
    m.result_heap.sort()


def to_rows(m) -> list:
    """Every record as (job tuple, *fields), oldest first (the order does not depend on how
    the dicts were filled)."""
    return [(rec.job.to_tuple(),) + rec.fields() for rec in sorted(m.results.values(), key=lambda r: r.order)]


def view(m, job_id: str) -> dict | None:
    """GET /v1/jobs/{id} of a retained job: the job as shown at its ack, state `succeeded`, its
    result (null without one, or once dropped at the bound), `finished_at_ms`, `retained_until_ms`."""
    from .answers import render_job
    from .jobs import shown_fields
    rec = m.results.get(job_id)
    if rec is None:
        return None
    job = rec.job
    out = render_job(*shown_fields(job))
    out["timeout_ms"] = job.timeout_ms
    out["releases"] = job.releases
    out["state"] = "succeeded"
    out["last_reason"] = job.last_reason
    out["lease_expires_at_ms"] = None
    out.update(result_fields(rec))
    readers = m.pins.get(job_id)
    if readers:                         # kept for them past its retention (node/core/deps.py)
        out["live_dependents"] = len(readers)
    if job_id in m.batch_kept:          # kept for its batch's callbacks (node/core/batches.py)
        out["kept_for_batch"] = m.batch_kept[job_id]
    return out


def result_fields(rec: Retained) -> dict:
    from binascii import b2a_base64
    result = None
    if rec.data is not None:
        result = {"data_b64": b2a_base64(rec.data, newline=False).decode("ascii"), "encoding": rec.encoding}
    return {"result": result, "result_dropped": rec.dropped, "finished_at_ms": rec.finished_at,
            "retained_until_ms": rec.expires}


# ---------------------------------------------------------------------------- invariants
def check(m) -> list[str]:
    """The retained records' invariants (node/core/invariants.py)."""
    bad = []
    if m.retaining != m.limits.retaining:
        bad.append(f"the machine's retaining queues {sorted(m.retaining)} are not the configuration's")
    sizes: dict = {}
    live_timers = {(e[1], e[2]) for e in m.result_heap}
    for job_id, rec in m.results.items():
        job = rec.job
        where = f"retained job {job_id}"
        if job.id != job_id:
            bad.append(f"{where}: stored under another id ({job.id})")
        if job.state != GONE:
            bad.append(f"{where}: in state {job.state}, not gone")
        if job_id in m.jobs:
            bad.append(f"{where}: also a job of the machine ({m.jobs[job_id].state}): a retained job is not live")
        if not (rec.finished_at <= rec.expires and rec.finished_at <= m.clock):
            bad.append(f"{where}: finished at {rec.finished_at}, expires {rec.expires}, clock {m.clock}")
        if (rec.order, job_id) not in live_timers and not (held(m, job_id) and rec.expires <= m.clock):
            bad.append(f"{where}: no expiry timer, and not kept for a live dependent past its expiry")
        if (rec.data is None) != (rec.encoding is None) or (rec.dropped and rec.data is not None):
            bad.append(f"{where}: result {rec.size()} bytes, encoding {rec.encoding!r}, dropped {rec.dropped}")
        if rec.size():
            sizes[job.queue] = sizes.get(job.queue, 0) + rec.size()
            if m.results_by_queue.get(job.queue, {}).get(job_id) is not rec:
                bad.append(f"{where}: its result is not in its queue's order")
    if sizes != m.result_bytes:
        bad.append(f"retained result bytes per queue {m.result_bytes} != the sum of their results {sizes}")
    for qname, n in m.result_bytes.items():
        bound = m.limits.queue(qname).max_retained_result_bytes
        if n > bound:
            bad.append(f"queue {qname!r}: {n} bytes of retained results, over its bound {bound}")
    for qname, per in m.results_by_queue.items():
        orders = [rec.order for rec in per.values()]
        if orders != sorted(orders) or any(m.results.get(i) is not r or not r.size() for i, r in per.items()):
            bad.append(f"queue {qname!r}: its retained results' order is not the records', oldest first")
    heap = m.result_heap
    if any(heap[(i - 1) // 2] > heap[i] for i in range(1, len(heap))):
        bad.append("the results' expiry heap is out of order")
    return bad
