"""Model test of the core where its rules meet: every command with every policy (duplicate
policies return_existing / reject / replace, release, nack strategies, delete of a running job,
operator moves, purge, pauses, configuration changes) mixed with throttles, circuit breakers,
execution windows and keys (per-key concurrency and rates, a queue-wide rate, fair queueing),
driven by hypothesis through request validation and `QueueMachine.apply` (tests/helpers_core.py).

tests/test_core_model.py checks the plain rules against a reference model; the gating rules are
checked here by what must hold whatever the history (docs/api.md "Gating: throttles, circuit
breakers, execution windows"; docs/semantics.md "Keys"):

* after every step, `check_invariants()` (node/core/invariants.py): every count the queues keep
  recomputed from the jobs, held-back marks, slots per resource, probes;
* liveness: a queue that a reserve may serve now (not paused, its window open, its circuit not
  open, its rate not spent) and that holds a ready job whose resource and key have a free slot
  hands out a job (tried on a copy of the machine, so the history goes on unchanged): no queue
  waits on a slot nobody holds;
* keys, over the whole history: in flight per key never above its limit (unless the limit was
  lowered under running jobs: then it only falls); hand-outs per key and per queue never above
  the rate in any window (while the same key settings are in force); and no key handed out twice
  in a row at a level while another key had a job there that could run all along, from before
  the first hand-out (fairness, equal weights: a key that arrives after a hand-out joins the turn
  order behind it);
* a snapshot round trip keeps the digest, and a replay of the whole log ends in the same state.

Run size: RAFTQ_GATING_EXAMPLES (default 150; 25 unless RAFTQ_TEST_PROFILE=full, tests/conftest.py)
x RAFTQ_GATING_STEPS (default 60).
"""
from __future__ import annotations

import os

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftq.node.base import validate as C
from raftq.node.core import keys as K
from raftq.node.core.jobs import IN_FLIGHT, READY
from raftq.node.core.ops import RESERVED
from raftq.node.core.machine import QueueMachine as PlainMachine

from helpers_core import T0, Core, payload

EXAMPLES = int(os.environ.get("RAFTQ_GATING_EXAMPLES", "150"))
STEPS = int(os.environ.get("RAFTQ_GATING_STEPS", "60"))

# T0 is 10:53:20 UTC: queue "w"'s window closes at 11:00, 400 s in, and opens again at midnight.
QUEUES = [{"name": "a", "circuit_breaker": {"failures": 2, "window_ms": 3000, "open_ms": 1500}},
          {"name": "w", "windows": [{"start": "00:00", "end": "11:00"}], "resource": "db"},
          {"name": "p"}]
NAMES = ("a", "w", "p", "k")
# Queue "k"'s key settings, one per configuration (the last: none, so the queue is fair only).
KEYED = ({"key_concurrency": 1, "key_rate": {"count": 2, "period_ms": 1000}},
         {"key_concurrency": 2, "key_limits": {"t1": {"concurrency": 1, "rate": {"count": 1, "period_ms": 700}}},
          "rate": {"count": 3, "period_ms": 1000}},
         {"key_concurrency": 1, "key_limits": {"t2": {"concurrency": 0}}},
         {})
TENANTS = (None, "t1", "t2", "t3")
RESOURCES = ("db", "db", "api", None)
KEYS = ("k1", "k2", "k3")
LIMIT_SETS = ({"db": 1, "api": 1}, {"db": 2, "api": 1}, {"db": 0, "api": 2}, {"api": 1}, {})
STORAGE = {"dead_letter_retention_ms": 60_000, "dedup_window_ms": 20_000}
_NOBODY = object()


def limits_doc(resource_limits: dict, breaker: bool = True, keyed: int = 0) -> dict:
    queues = QUEUES if breaker else [{"name": "a"}] + QUEUES[1:]
    queues = queues + [{"name": "k", **KEYED[keyed]}]
    return {"limits": {"resource_limits": resource_limits, "retry_delay_ms": 0}, "queues": queues}


class GatingModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        doc = limits_doc(LIMIT_SETS[0])
        self.c = Core(limits=doc["limits"], storage=STORAGE, queues=doc["queues"])
        self.bootstrap = self.c.limits      # what the machine was built with (a replay's too)
        self.c.seed()
        self.held: list = []          # (job id, attempt) handed out, as a worker keeps them
        self.seen: list = []          # every job id made
        self.handed: dict = {}        # (queue, key) -> [(time, rate in force, epoch)] of every hand-out
        self.keyed, self.epoch = 0, 0  # queue k's key settings in force; bumped when they change
        self.last_served: dict = {}   # (queue, level) -> (the key served there last, the keys that could run then)
        self.in_flight_seen: dict = {}  # (queue, key) -> jobs in flight at the last check

    # ------------------------------------------------------------------ helpers
    @property
    def m(self):
        return self.c.m

    def job_body(self, data) -> dict:
        draw = data.draw
        body = {"queue": draw(st.sampled_from(NAMES), label="queue"), "job_type": "t",
                "payload": payload(draw(st.sampled_from((b"1", b"2")), label="payload")),
                "priority": draw(st.integers(0, 2), label="priority"),
                "max_attempts": draw(st.integers(1, 3), label="max_attempts")}
        r = draw(st.sampled_from(RESOURCES), label="resource")
        if r is not None:
            body["resource"] = r
        tenant = draw(st.sampled_from(TENANTS), label="tenant")
        if tenant is not None:
            body["key"] = tenant
        key = draw(st.sampled_from((None,) + KEYS), label="key")
        live = sorted((qname, k) for qname, keyed in self.m.dedup.items() for k in keyed)
        if key is not None and live and draw(st.booleans(), label="a key in use?"):
            body["queue"], key = draw(st.sampled_from(live), label="key in use")
        if key is not None:
            body["idempotency_key"] = key
            policy = draw(st.sampled_from((None, "return_existing", "reject", "replace", "replace")), label="policy")
            if policy is not None:
                body["duplicate_policy"] = policy
        later = draw(st.sampled_from((None, None, 0, 700, 4000)), label="scheduled in")
        if later is not None:
            body["scheduled_at_ms"] = self.c.now + later
        deadline = draw(st.sampled_from((None, None, 300, 5000)), label="deadline in")
        if deadline is not None:
            body["deadline_at_ms"] = self.c.now + deadline
        return body

    def note(self, body: dict) -> None:
        for j in body.get("jobs", []):
            if isinstance(j, dict) and "id" in j:
                self.held.append((j["id"], j["attempt"]))
        for r in body.get("results", []):
            if isinstance(r, dict) and r.get("job_id") and r["job_id"] not in self.seen:
                self.seen.append(r["job_id"])
        if body.get("job_id") and body["job_id"] not in self.seen:
            self.seen.append(body["job_id"])

    def pick_held(self, data):
        i = data.draw(st.integers(0, len(self.held) - 1), label="held")
        job_id, attempt = self.held.pop(i)
        if data.draw(st.integers(0, 9), label="stale attempt?") == 0:
            attempt += 1                    # a worker whose lease lapsed: fenced
        return job_id, attempt

    def any_job(self, data):
        return data.draw(st.sampled_from(self.seen), label="job")

    # ------------------------------------------------------------------ rules: producers
    @rule(data=st.data())
    def enqueue(self, data):
        status, body = self.c.enqueue_body(self.job_body(data))
        event(f"enqueue {status} {'replaced' if body.get('replaced') else 'dedup' if body.get('deduplicated') else ''}")
        self.note(body)

    @rule(data=st.data(), atomic=st.booleans())
    def enqueue_many(self, data, atomic):
        jobs = [self.job_body(data) for _ in range(data.draw(st.integers(2, 3), label="n"))]
        status, body = (self.c.atomic if atomic else self.c.batch)(jobs)
        self.note(body)

    @rule(data=st.data(), queue=st.sampled_from(("k", "k", "p", "a")), n=st.integers(2, 6))
    def tenants(self, data, queue, n):
        """Several tenants' jobs at once, then a reserve: the rotation at work."""
        jobs = [{"queue": queue, "job_type": "t", "priority": data.draw(st.integers(0, 1), label="priority"),
                 **({"key": t} if (t := data.draw(st.sampled_from(TENANTS), label="tenant")) else {})}
                for _ in range(n)]
        self.note(self.c.batch(jobs)[1])
        self.reserved([queue], 5000, data.draw(st.integers(1, 3), label="take"))

    # ------------------------------------------------------------------ rules: workers
    @rule(queues=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True),
          lease=st.sampled_from((300, 5000)), n=st.integers(1, 3))
    def reserve(self, queues, lease, n):
        self.reserved(queues, lease, n)

    def reserved(self, queues, lease, n) -> list:
        """A reserve, checked against the key rules: the rate of every hand-out, and fairness for
        its first job (the state before it is known)."""
        could = self.could_run()
        status, body = self.c.reserve(queues, lease_ms=lease, max_jobs=n)
        assert status == 200, body
        self.note(body)
        event(f"reserve got {len(body['jobs'])}")
        for i, job in enumerate(body["jobs"]):
            qname, tenant, level = job["queue"], job.get("key"), -job["priority"]
            if i == 0 and self.m.queues[qname].keys is not None:
                # Skipped: a key that could run at the last hand-out at this level and can still.
                last, then = self.last_served.get((qname, level), (_NOBODY, set()))
                others = (could.get((qname, level), set()) & then) - {tenant}
                if others:
                    event("fairness checked with other keys waiting")
                assert not (last == tenant and others), \
                    f"key {tenant!r} of queue {qname!r} served twice in a row at priority {-level} while {others} could run"
            self.last_served[(qname, level)] = (tenant, could.get((qname, level), set()))
            ql = self.m.limits.queue(qname)
            rate = K.key_limits(ql, tenant)[1] if tenant is not None else None
            self.handed.setdefault((qname, tenant), []).append((self.c.now, rate, self.epoch))
            self.handed.setdefault((qname, "(queue)"), []).append((self.c.now, ql.rate, self.epoch))
        return body["jobs"]

    def could_run(self) -> dict:
        """(queue, level) -> the keys (None for the jobs without one) with a job there that a
        reserve could hand out now: its key not held, not past its deadline, its resource free."""
        out: dict = {}
        for name in NAMES:
            q = self.m.queues.get(name)
            if q is None or q.keys is None:
                continue
            for job in self.m.jobs.values():
                if job.queue == name and job.state == READY and job.id not in self.m.blocked_ids \
                        and self.takeable(job):
                    out.setdefault((name, -job.priority), set()).add(job.key)
        return out

    @rule(queue=st.sampled_from(NAMES), n=st.integers(1, 2), lease=st.sampled_from((300, 5000)),
          outcome=st.sampled_from(("default", "dead_letter", "hold")), fresh=st.booleans())
    def work(self, queue, n, lease, outcome, fresh):
        """A worker that takes jobs of one queue (fresh ones, or what is there) and fails them (a
        circuit's failures) or keeps them (a resource's slots full)."""
        for _ in range(n if fresh else 0):
            self.note(self.c.enqueue(queue, payload=payload(b"w"), resource="db")[1])
        for job in self.reserved([queue], lease, n):
            self.held.remove((job["id"], job["attempt"]))
            if outcome == "hold":
                self.held.append((job["id"], job["attempt"]))
            else:
                assert self.c.nack(job["id"], job["attempt"], retry={"strategy": outcome})[0] == 200

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack(self, data):
        self.c.ack(*self.pick_held(data))

    @precondition(lambda self: self.held)
    @rule(data=st.data(), strategy=st.sampled_from(("default", "dead_letter", "delay")))
    def nack(self, data, strategy):
        job_id, attempt = self.pick_held(data)
        retry = {"strategy": strategy, "delay_ms": 800} if strategy == "delay" else {"strategy": strategy}
        self.c.nack(job_id, attempt, reason="boom", retry=retry)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), delay=st.sampled_from((None, 0, 900)))
    def release(self, data, delay):
        self.c.release(*self.pick_held(data), delay_ms=delay)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def extend(self, data):
        i = data.draw(st.integers(0, len(self.held) - 1), label="held")
        self.c.extend(*self.held[i], lease_ms=2000)

    # ------------------------------------------------------------------ rules: operators
    @precondition(lambda self: self.seen)
    @rule(data=st.data())
    def cancel(self, data):
        self.c.cancel(self.any_job(data))               # a running job too (in_flight)

    @precondition(lambda self: self.seen)
    @rule(data=st.data())
    def move(self, data):
        job_id = self.any_job(data)
        job = self.m.jobs.get(job_id)
        self.c.move(job.queue if job is not None else "p", [job_id], reason="op")

    @rule(queue=st.sampled_from(NAMES))
    def purge(self, queue):
        self.c.purge(queue)

    @rule(queue=st.sampled_from(NAMES), paused=st.booleans())
    def pause(self, queue, paused):
        (self.c.pause if paused else self.c.resume)(queue)

    @rule()
    def close_circuit(self):
        self.c.run(lambda: C.close_circuit("a", self.c.limits))

    @rule(data=st.data())
    def dead_letters(self, data):
        ids = list(self.m.dlq)[:2]
        how = data.draw(st.sampled_from(("requeue", "delete", "drain")), label="dead letters")
        if how == "requeue" and ids:
            self.c.requeue(ids)
        elif how == "delete" and ids:
            self.c.delete_dead(ids)
        elif how == "drain":
            self.c.drain(max=2)

    @rule(limits=st.sampled_from(range(len(LIMIT_SETS))), breaker=st.booleans(),
          keyed=st.sampled_from(range(len(KEYED))))
    def configure(self, limits, breaker, keyed):
        doc = limits_doc(LIMIT_SETS[limits], breaker, keyed)
        status, body = self.c.configure(limits=doc["limits"], storage=STORAGE, queues=doc["queues"])
        assert status == 200, body
        if keyed != self.keyed:     # hand-outs while a rate was away were not logged (docs/semantics.md "Keys")
            self.keyed, self.epoch = keyed, self.epoch + 1

    @rule(ms=st.sampled_from((0, 1, 250, 1000, 2500, 400_000)), sweep=st.booleans())
    def tick(self, ms, sweep):
        self.c.advance(ms)
        if sweep:
            self.c.sweep()

    # ------------------------------------------------------------------ what must hold
    @invariant()
    def machine_invariants(self):
        self.m.check_invariants()
        for name in NAMES:                  # a queue without keyed jobs starts its rotation afresh
            q = self.m.queues.get(name)
            if q is None or q.keys is None:
                self.last_served = {k: v for k, v in self.last_served.items() if k[0] != name}

    @invariant()
    def waiting_keys_seen_so_far(self):
        """Fairness bookkeeping: a key that could not run at some point since the last hand-out
        at a level (no job there, held, its resource full) is no longer one that waited."""
        could = self.could_run()
        self.last_served = {k: (last, then & could.get(k, set()))
                            for k, (last, then) in self.last_served.items()}

    @invariant()
    def keys_in_flight_within_their_limits(self):
        now: dict = {}
        for job in self.m.jobs.values():
            if job.state == IN_FLIGHT and job.key is not None:
                now[(job.queue, job.key)] = now.get((job.queue, job.key), 0) + 1
        for (qname, tenant), n in now.items():
            limit = K.key_limits(self.m.limits.queue(qname), tenant)[0]
            if limit is not None and n > limit:
                assert n <= self.in_flight_seen.get((qname, tenant), 0), \
                    f"key {tenant!r} of queue {qname!r}: {n} in flight, above its limit {limit}, and more than before"
        self.in_flight_seen = now

    @invariant()
    def hand_outs_within_the_rates_in_any_window(self):
        for (qname, tenant), times in self.handed.items():
            for i, (t, rate, epoch) in enumerate(times):
                if rate is None or i < rate[0]:
                    continue
                earlier = times[i - rate[0]]
                if earlier[2] == epoch:         # the same settings in force for the whole stretch
                    assert t - earlier[0] >= rate[1], \
                        f"{qname!r}/{tenant!r}: {rate[0] + 1} hand-outs within {t - earlier[0]} ms, rate {rate}"

    @invariant()
    def a_servable_queue_hands_out_a_job(self):
        """Tried on a copy: for each queue a reserve may serve now, with a ready job that is not
        past its deadline and whose resource has a free slot, a reserve of that queue alone gets
        a job."""
        m = self.m
        for name in NAMES:
            q = m.queues.get(name)
            if q is None or q.paused or not q.ready:
                continue
            view = m.queue_stats(name)
            if not view["window_open"] or (view["circuit"] or {}).get("state") == "open":
                continue
            rate = m.limits.queue(name).rate
            if rate is not None and K.rate_room(q.rate_log, rate, m.clock) <= 0:
                continue
            if (view["circuit"] or {}).get("state") == "half_open" and q.circuit.probe is not None:
                continue
            if not any(self.takeable(job) for job in m.jobs.values() if job.queue == name and job.state == READY):
                continue
            copy = PlainMachine.from_builtins(self.bootstrap, m.to_builtins())
            cmd = C.reserve({"queues": [name], "lease_ms": 1000, "max_jobs": 1}, m.limits)[0]
            result = copy.apply(m.clock, cmd)      # the time the view above was read at
            assert result[0] == RESERVED and result[1], \
                f"queue {name!r} holds a job that could run now, and a reserve got none ({m.queue_stats(name)})"

    def takeable(self, job) -> bool:
        if job.deadline is not None and job.deadline <= self.m.clock:
            return False
        r = job.resource
        limit = self.m.limits.resource_limits.get(r) if r is not None else None
        if job.key is not None:
            q = self.m.queues[job.queue]
            key = q.keys.by_key.get(job.key) if q.keys is not None else None      # none: no job, no window
            conc, rate, _ = K.key_limits(self.m.limits.queue(job.queue), job.key)
            if conc is not None and (key.in_flight if key else 0) >= conc:
                return False
            if rate is not None and K.rate_room(key.log if key else (), rate, self.m.clock) <= 0:
                return False
        return limit is None or self.m.in_use.get(r, 0) < limit

    def teardown(self):
        restored = PlainMachine.from_builtins(self.bootstrap, self.m.to_builtins())
        restored.check_invariants()
        assert restored.digest() == self.m.digest()
        fresh = PlainMachine(self.bootstrap)
        for now, cmd in self.c.log:
            fresh.apply(now, cmd)
        assert fresh.digest() == self.m.digest()
        fresh.check_invariants()
        event(f"throttled ever: {sum(q.deferred for q in self.m.queues.values()) > 0}")
        event(f"circuit opened: {any(q.circuit is not None and q.circuit.opened_total for q in self.m.queues.values())}")
        event(f"keyed hand-outs: {min(3, sum(len(v) for k, v in self.handed.items() if k[1] not in (None, '(queue)')))}")


GatingModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
TestGatingModel = GatingModel.TestCase
