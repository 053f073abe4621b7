"""A tiny harness around the pure core: requests go through `node.validate` (validation, exactly
as the leader does it) and then `QueueMachine.apply`, like a one-node cluster with a hand-driven
clock and deterministic job ids.

Every helper returns the `(status, body)` the HTTP layer would send, including the 4xx answers
that `node.validate` decides before apply (an `ApiError`'s `.result`). The machine's results are
codes and fields; `AnsweringMachine` renders them as the node does before it answers
(node/replication/proposer.py's bridge, with node/core/answers.py), so tests read answers.
"""
from __future__ import annotations

import base64
import uuid

from raftq.node.base import validate as C
from raftq.node.base import validate_schedule as VS
from raftq.node.core.answers import render
from raftq.node.core.errors import ApiError
from raftq.node.core.limits import Limits
from raftq.node.core.machine import QueueMachine as _QueueMachine

T0 = 1_764_500_000_000


class AnsweringMachine(_QueueMachine):
    """QueueMachine whose `apply` and `apply_batch` return the answers the node sends for the
    results (rendered by node.core.answers.render, as node/replication/proposer.py does)."""

    def apply(self, now_ms, cmd):
        return render(super().apply(now_ms, cmd))

    def apply_batch(self, now_ms, cmds) -> list:
        return [render(r) for r in super().apply_batch(now_ms, cmds)]


QueueMachine = AnsweringMachine


def counter_ids(start: int = 1):
    """UUID v4 texts from a counter: ascending, so they sort in creation order."""
    n = start
    while True:
        yield str(uuid.UUID(int=n, version=4))
        n += 1


def descending_ids(start: int = 10_000):
    """UUID v4 texts that sort in the reverse of creation order (to show that ties are not
    broken by id)."""
    n = start
    while n > 0:
        yield str(uuid.UUID(int=n << 96, version=4))
        n -= 1


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def payload(data: bytes = b"x", encoding: str = "application/json") -> dict:
    return {"data_b64": b64(data), "encoding": encoding}


class Core:
    def __init__(self, limits: dict | None = None, storage: dict | None = None,
                 queues: list | None = None, now: int = T0, ids=None):
        self.limits = Limits.build(limits=limits, storage=storage, queues=queues)
        self.m = QueueMachine(self.limits)
        self.now = now
        self._ids = ids if ids is not None else counter_ids()
        self.log: list = []            # every (now, command) applied, for replays
        self.ids_issued = 0

    # -------------------------------------------------------------- plumbing
    def new_id(self) -> str:
        self.ids_issued += 1
        return next(self._ids)

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now

    def apply(self, cmd, now: int | None = None):
        now = self.now if now is None else now
        self.log.append((now, cmd))
        return self.m.apply(now, cmd)

    def run(self, build):
        """`build()` makes the command (may raise ApiError); then apply it."""
        try:
            cmd = build()
        except ApiError as e:
            return e.result
        return self.apply(cmd)

    # -------------------------------------------------------------- job endpoints
    def enqueue(self, queue: str = "q", job_type: str = "t", rid=None, **fields):
        body = {"queue": queue, "job_type": job_type, **fields}
        return self.enqueue_body(body, rid=rid)

    def enqueue_body(self, body, rid=None):
        return self.run(lambda: C.enqueue(body, self.limits, self.now, self.new_id, rid=rid))

    def enqueue_id(self, queue: str = "q", job_type: str = "t", **fields) -> str:
        status, body = self.enqueue(queue, job_type, **fields)
        assert status == 200, body
        return body["job_id"]

    def batch(self, jobs, rid=None):
        return self.run(lambda: C.enqueue_batch({"jobs": jobs}, self.limits, self.now, self.new_id, rid=rid))

    def atomic(self, jobs, rid=None):
        return self.run(lambda: C.enqueue_atomic({"jobs": jobs}, self.limits, self.now, self.new_id, rid=rid))

    def reserve(self, queues=("q",), lease_ms: int = 30_000, max_jobs: int | None = None,
                rid=None, **extra):
        body = {"queues": list(queues), "lease_ms": lease_ms, **extra}
        if max_jobs is not None:
            body["max_jobs"] = max_jobs
        return self.reserve_body(body, rid=rid)

    def reserve_body(self, body, rid=None):
        return self.run(lambda: C.reserve(body, self.limits, rid=rid)[0])

    def reserve_jobs(self, queues=("q",), lease_ms: int = 30_000, max_jobs: int | None = None) -> list:
        status, body = self.reserve(queues, lease_ms, max_jobs)
        assert status == 200, body
        return body["jobs"]

    def reserve_one(self, queues=("q",), lease_ms: int = 30_000) -> dict:
        jobs = self.reserve_jobs(queues, lease_ms, 1)
        assert len(jobs) == 1, jobs
        return jobs[0]

    def ack(self, job_id, attempt, rid=None, result=None):
        """An ack; `result`: the ack's result object ({data_b64, encoding}, see `payload`)."""
        body = {"attempt": attempt} if result is None else {"attempt": attempt, "result": result}
        return self.run(lambda: C.ack(job_id, body, rid=rid, limits=self.limits))

    def acks(self, pairs, rid=None):
        """pairs: (job_id, attempt) or (job_id, attempt, result object)."""
        body = {"acks": [{"job_id": p[0], "attempt": p[1], **({"result": p[2]} if len(p) > 2 else {})}
                         for p in pairs]}
        return self.run(lambda: C.ack_batch(body, self.limits, rid=rid))

    def nack(self, job_id, attempt, reason=None, retry=None, rid=None):
        body = {"attempt": attempt}
        if reason is not None:
            body["reason"] = reason
        if retry is not None:
            body["retry"] = retry
        return self.run(lambda: C.nack(job_id, body, rid=rid))

    def release(self, job_id, attempt, delay_ms=None, reason=None, rid=None):
        body = {"attempt": attempt}
        if delay_ms is not None:
            body["delay_ms"] = delay_ms
        if reason is not None:
            body["reason"] = reason
        return self.run(lambda: C.release(job_id, body, rid=rid))

    def extend(self, job_id, attempt, lease_ms, rid=None):
        return self.run(lambda: C.extend(job_id, {"attempt": attempt, "lease_ms": lease_ms}, rid=rid))

    def drain(self, queue=None, max=None, rid=None, who=None):
        body = {}
        if queue is not None:
            body["queue"] = queue
        if max is not None:
            body["max"] = max
        return self.run(lambda: C.drain(body, self.limits, rid=rid, who=who))

    # -------------------------------------------------------------- operations
    def requeue(self, ids, rid=None, who=None):
        return self.run(lambda: C.requeue({"ids": list(ids)}, rid=rid, who=who))

    def delete_dead(self, ids, rid=None, who=None):
        return self.run(lambda: C.delete_dead_letters({"ids": list(ids)}, rid=rid, who=who))

    def cancel(self, job_id, rid=None, who=None, cascade=None):
        return self.run(lambda: C.cancel(job_id, rid=rid, who=who, cascade=cascade))

    def pause(self, queue, rid=None, create=False, who=None):
        return self.run(lambda: C.pause(queue, True, self.limits, rid=rid, body={"create": create}, who=who))

    def resume(self, queue, rid=None, create=False, who=None):
        return self.run(lambda: C.pause(queue, False, self.limits, rid=rid, body={"create": create}, who=who))

    def move(self, queue, ids, reason=None, rid=None, who=None):
        body = {"ids": list(ids)}
        if reason is not None:
            body["reason"] = reason
        return self.run(lambda: C.move_to_dead_letters(queue, body, self.limits, rid=rid, who=who))

    def purge(self, queue, rid=None, who=None):
        return self.run(lambda: C.purge(queue, self.limits, rid=rid, who=who))

    def delete_queue(self, queue, rid=None, who=None):
        return self.run(lambda: C.delete_queue(queue, self.limits, rid=rid, who=who))

    # -------------------------------------------------------------- configuration
    def configure(self, limits=None, storage=None, queues=None, expect=None, keys=None, rid=None, who=None):
        """PUT /v1/config with these sections (expect_version: the version in force unless given)."""
        body = {"config": {"limits": limits or {}, "storage": storage or {}, "queues": queues or []},
                "expect_version": self.m.config_version if expect is None else expect}
        if keys is not None:
            body["keys"] = keys
        out = self.run(lambda: C.configure(body, rid=rid, who=who))
        self.limits = self.m.limits         # validation follows the configuration in force
        return out

    def seed(self, api_keys=None):
        out = self.apply(C.seed(self.limits, api_keys))
        self.limits = self.m.limits
        return out

    def add_key(self, name, role, key_sha256, rid=None, who=None):
        return self.run(lambda: C.add_key({"name": name, "role": role, "key_sha256": key_sha256}, rid=rid, who=who))

    def remove_key(self, name, rid=None, who=None):
        return self.run(lambda: C.remove_key(name, rid=rid, who=who))

    def audit(self, limit=100):
        return self.m.audit_page(limit, None)[0]

    def sweep(self):
        status, body = self.apply(C.sweep())
        assert status == 200, body
        return body

    # -------------------------------------------------------------- schedules
    def put_schedule(self, name, rid=None, who=None, **body):
        """PUT /v1/schedules/{name} with this body (a job template on queue q by default)."""
        body.setdefault("job", {"queue": "q", "job_type": "tick"})
        return self.run(lambda: VS.put(name, body, self.limits, self.now, rid=rid, who=who))

    def delete_schedule(self, name, expect_version=None, rid=None, who=None):
        return self.run(lambda: VS.delete(name, expect_version, rid=rid, who=who))

    def pause_schedule(self, name, paused=True, rid=None, who=None):
        return self.run(lambda: VS.pause(name, paused, rid=rid, who=who))

    def trigger_schedule(self, name, rid=None, who=None):
        return self.run(lambda: VS.trigger(name, self.new_id, rid=rid, who=who))

    def schedule(self, name) -> dict | None:
        return self.m.schedule_view(name)

    # -------------------------------------------------------------- reads
    def view(self, job_id):
        return self.m.job_view(job_id)

    def state(self, job_id):
        v = self.m.job_view(job_id)
        return None if v is None else v["state"]

    def stats(self, queue: str = "q") -> dict:
        return self.m.queue_stats(queue)

    def counts(self, queue: str = "q") -> dict:
        s = self.m.queue_stats(queue)
        if s is None:
            return {"ready": 0, "scheduled": 0, "in_flight": 0, "dead_lettered": 0}
        return {k: s[k] for k in ("ready", "scheduled", "in_flight", "dead_lettered")}

    def dead_letters(self, queue=None, limit: int = 100) -> list:
        return self.m.list_dead_letters(queue, limit, None)[0]

    def snapshot_state(self) -> dict:
        """The whole replicated state minus the applied-command counter (which every command,
        even a refused one, advances): equal before and after a command that changes nothing."""
        s = self.m.to_builtins()
        s.pop("applied")
        return s


def rejection(result) -> dict:
    """The rejection object of a single enqueue's 422 answer."""
    status, body = result
    assert status == 422, result
    assert body["error"]["code"] == "rejected", body
    return body["error"]["rejection"]


def err(result, status: int, code: str) -> dict:
    got_status, body = result
    assert got_status == status and body["error"]["code"] == code, result
    return body["error"]


RETAIN = {"dead_letter_retention_ms": 10**12}      # a dead-letter store that keeps everything
UNKNOWN_ID = str(uuid.UUID(int=0xDEAD_BEEF, version=4))


def ids_of(jobs) -> list:
    return [j["id"] for j in jobs]


def dead_record(c: Core, job_id: str) -> dict:
    recs = [r for r in c.dead_letters() if r["job"]["id"] == job_id]
    assert len(recs) == 1, recs
    return recs[0]


def _kill(c: Core, queue: str = "q", reason=None) -> str:
    jid = c.enqueue_id(queue, max_attempts=1)
    job = c.reserve_one([queue])
    assert job["id"] == jid
    c.nack(jid, 1, reason=reason)
    return jid


def restored(c: Core) -> QueueMachine:
    m = QueueMachine.from_builtins(c.limits, c.m.to_builtins())
    m.check_invariants()
    assert m.digest() == c.m.digest()
    return m
