"""sepp's gRPC API on a three-node cluster (node/api/sepp_grpc.py, docs/sepp.md), spoken by sepp's
own Python client (sepp-py, installed from the package index by the `grpc` extra): every RPC of
sepp.v1.QueueService, field by field, sepp's status codes, keys and roles, the health service, and
what a follower and a leader's death do. sepp-py's high-level client for the flows; its generated
stub (the same code underneath) where a test needs the exact status code or a request that the
client would refuse before sending it."""
from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta, timezone

import grpc
import pytest

from raftq.cluster.local import LocalCluster, http_json

pytest.importorskip("sepp", reason="the grpc extra (sepp-py) is not installed")
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from sepp import (EnqueueRequest, Payload, ReserveOptions, RetryDirective, SeppClient,  # noqa: E402
                  TraceContext)
from sepp.client import RetryPolicy  # noqa: E402
from sepp.v1 import queue_pb2 as pb  # noqa: E402
from sepp.v1 import queue_pb2_grpc as pb_grpc  # noqa: E402

from tests.conftest import heal  # noqa: E402

KEYS = {role: f"{role}-key-{uuid.uuid4().hex}" for role in ("admin", "operator", "worker", "viewer")}
Code = grpc.StatusCode


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("sepp-grpc"), grpc=True,
                     api_keys=[{"name": role, "key": key, "role": role} for role, key in KEYS.items()],
                     limits={"max_lease_duration_ms": 60_000, "max_enqueue_batch": 100},
                     storage={"dead_letter_retention_ms": 3_600_000},
                     queues=[{"name": "capped", "max_queue_depth": 2},
                             {"name": "typed", "allowed_job_types": ["a", "b"]},
                             {"name": "small", "max_payload_bytes": 8}],
                     tuning={"max_parked_reserves": 2}).launch()
    yield c
    c.close()


@pytest.fixture
def shared(cluster):
    """The module's cluster, whole and with a leader: (cluster, leader index)."""
    heal(cluster, converge_s=None)
    return cluster, cluster.wait_leader(30)


def q(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def md(role: str | None = "admin"):
    return (("authorization", f"Bearer {KEYS[role]}"),) if role else ()


async def connect(addr: str, role: str = "admin", **kw) -> SeppClient:
    return await SeppClient.connect(addr, api_key=KEYS[role], **kw)


class Raw:
    """sepp-py's generated stub on its own channel (exact status codes, requests the client would
    refuse to build)."""

    def __init__(self, addr: str):
        self.channel = grpc.aio.insecure_channel(addr)
        self.stub = pb_grpc.QueueServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.channel.close()

    async def code_of(self, rpc: str, request, role: str | None = "admin", **kw):
        try:
            await getattr(self.stub, rpc)(request, metadata=md(role), timeout=10, **kw)
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details()
        return Code.OK, ""


def job(queue: str, job_type: str = "t", **kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=queue, job_type=job_type, **kw)


def ms(d: timedelta) -> int:
    return int(d.total_seconds() * 1000)


# ------------------------------------------------------------------ server info, health
async def test_server_info_is_the_configuration_in_force(shared):
    cluster, leader = shared
    client = await connect(cluster.grpc_addr(leader), "viewer")      # a viewer may read it
    try:
        info = await client.get_server_info()
        assert info.supported_protocol_versions == ["v1"] and info.version
        assert info.max_enqueue_batch == 100 and info.max_lease_duration == timedelta(seconds=60)
        assert info.dead_letter_retention_enabled and not info.strict_queues
        assert abs(info.server_time - datetime.now(timezone.utc)) < timedelta(seconds=5)
        # A change of the configuration in force (PUT /v1/config) shows at once.
        headers = {"Authorization": f"Bearer {KEYS['admin']}"}
        _, cfg = http_json("GET", cluster.urls[leader] + "/v1/config", headers=headers)
        limits = {**cfg["config"]["limits"], "max_reserve_batch": 77}
        status, _ = http_json("PUT", cluster.urls[leader] + "/v1/config", headers=headers, timeout=10, body={
            "config": {**cfg["config"], "limits": limits}, "expect_version": cfg["version"]})
        assert status == 200
        assert (await client.get_server_info()).max_reserve_batch == 77
        for i in range(cluster.n):      # every node answers it from the configuration it applied
            deadline = time.monotonic() + 10
            while True:
                other = await connect(cluster.grpc_addr(i), "viewer")
                try:
                    got = (await other.get_server_info()).max_reserve_batch
                finally:
                    await other.close()
                if got == 77 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert got == 77, f"node {i}"
    finally:
        await client.close()


async def test_health_serving_at_the_leader_without_a_key(shared):
    cluster, leader = shared
    async with Raw(cluster.grpc_addr(leader)) as raw:
        for name in ("", "sepp.v1.QueueService"):
            r = await raw.health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw.health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert e.value.code() == Code.NOT_FOUND
        watch = raw.health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


async def test_health_serving_at_a_follower(shared):
    cluster, leader = shared
    follower = next(i for i in range(cluster.n) if i != leader)
    async with Raw(cluster.grpc_addr(follower)) as raw:
        r = await raw.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING


# ------------------------------------------------------------------ enqueue
async def test_enqueue_batch_every_field_round_trips(shared):
    cluster, leader = shared
    name = q("fields")
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    tc = TraceContext("00-0123456789abcdef0123456789abcdef-0123456789abcdef-01", "k=v")
    client = await connect(cluster.grpc_addr(leader), "worker")
    try:
        results = await client.enqueue_batch([
            EnqueueRequest(name, "low", payload=Payload(b"\x00\x01bytes", "application/octet-stream"), priority=1,
                           custom={"s": "x", "i": -7, "f": 1.5, "b": True}, trace_context=tc, max_attempts=1000),
            EnqueueRequest(name, "high", priority=9, idempotency_key="k1"),
            EnqueueRequest(name, "high", priority=9, idempotency_key="k1"),      # the same key: deduplicated
            EnqueueRequest(name, "later", scheduled_at=later),
        ])
        assert [r.deduplicated for r in results] == [False, False, True, False]
        assert results[2].job_id == results[1].job_id
        jobs = await client.reserve(ReserveOptions([name], timedelta(hours=1), max_jobs=10))
        assert [j.ctx.job_type for j in jobs] == ["high", "low"]         # priority first; the scheduled one waits
        low = jobs[1]
        assert low.payload == Payload(b"\x00\x01bytes", "application/octet-stream")
        assert low.ctx.custom == {"s": "x", "i": -7, "f": 1.5, "b": True}
        assert low.ctx.trace_context.traceparent == tc.traceparent and low.ctx.trace_context.tracestate == "k=v"
        assert low.ctx.max_attempts == 100              # clamped to max_attempts_ceiling, as sepp does
        assert low.ctx.priority.value == 1 and low.ctx.attempt == 1 and low.ctx.queue == name
        lease = low.ctx.lease_expires_at - datetime.now(timezone.utc)
        assert timedelta(seconds=50) < lease <= timedelta(seconds=61)      # clamped to max_lease_duration_ms
        assert jobs[0].payload is None and jobs[0].ctx.scheduled_at is None
        for j in jobs:
            await client.ack(j.ctx)
    finally:
        await client.close()


REJECTIONS = [
    (job("x", job_type=""), "invalid_request"),
    (job("x", payload=pb.Payload(data=b"", encoding="a")), "invalid_request"),
    (job("x", priority=10), "invalid_request"),
    (job("q" * 600), "queue_name_too_long"),
    (job("x", job_type="t" * 300), "job_type_name_too_long"),
    (job("typed", job_type="c"), "job_type_not_allowed"),
    (job("x", idempotency_key="k" * 300), "idempotency_key_too_long"),
    (job("small", payload=pb.Payload(data=b"123456789", encoding="a")), "payload_too_large"),
    (job("x", custom={f"k{i}": pb.PrimitiveValue(int_value=i) for i in range(65)}), "custom_entries_too_many"),
    (job("x", custom={"k" * 300: pb.PrimitiveValue(bool_value=True)}), "custom_key_too_long"),
    (job("x", custom={"k": pb.PrimitiveValue(string_value="v" * 17000)}), "custom_map_too_large"),
    (job("x", custom={"k": pb.PrimitiveValue()}), "invalid_request"),          # a value with no oneof set
]


async def test_per_job_rejections_are_sepps_oneof(shared):
    cluster, leader = shared
    far = pb.EnqueueRequest(queue="x", job_type="t")
    far.scheduled_at.FromDatetime(datetime.now(timezone.utc) + timedelta(days=31))
    cases = REJECTIONS + [(far, "scheduled_too_far")]
    async with Raw(cluster.grpc_addr(leader)) as raw:
        resp = await raw.stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[r for r, _ in cases] + [job("ok")]),
                                           metadata=md("worker"), timeout=10)
        got = [r.rejection.WhichOneof("reason") if r.HasField("rejection") else "success" for r in resp.results]
        assert got == [want for _, want in cases] + ["success"]
        r = {want: res.rejection for (_, want), res in zip(cases, resp.results)}
        assert (r["payload_too_large"].payload_too_large.limit, r["payload_too_large"].payload_too_large.actual) == (8, 9)
        assert list(r["job_type_not_allowed"].job_type_not_allowed.allowed) == ["a", "b"]
        assert r["scheduled_too_far"].scheduled_too_far.horizon.ToSeconds() == 30 * 86400
        assert r["custom_key_too_long"].custom_key_too_long.key == "k" * 300


async def test_queue_full_is_a_rejection_and_atomic_lists_every_failing_job(shared):
    cluster, leader = shared
    async with Raw(cluster.grpc_addr(leader)) as raw:
        resp = await raw.stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job("capped")] * 3),
                                           metadata=md("worker"), timeout=10)
        kinds = [r.WhichOneof("outcome") for r in resp.results]
        assert kinds == ["success", "success", "rejection"]
        full = resp.results[2].rejection.queue_full
        assert (full.queue, full.limit) == ("capped", 2)
        name = q("atomic")
        bad = await raw.stub.EnqueueAtomic(pb.EnqueueBatchRequest(jobs=[job(name), job(name, priority=12),
                                                                        job("capped")]),
                                           metadata=md("worker"), timeout=10)
        assert bad.WhichOneof("outcome") == "rejection"
        assert [(e.index, e.rejection.WhichOneof("reason")) for e in bad.rejection.errors] == [
            (1, "invalid_request")] or [e.index for e in bad.rejection.errors] == [1, 2]
        ok = await raw.stub.EnqueueAtomic(pb.EnqueueBatchRequest(jobs=[job(name), job(name)]),
                                          metadata=md("worker"), timeout=10)
        assert ok.WhichOneof("outcome") == "success" and len({r.job_id for r in ok.success.responses}) == 2
        got = await raw.stub.Reserve(pb.ReserveRequest(queues=[name], max_jobs=10,
                                                       lease_duration={"seconds": 30}),
                                     metadata=md("worker"), timeout=10)
        assert len(got.jobs) == 2           # the refused atomic batch left nothing behind


async def test_whole_request_errors(shared):
    cluster, leader = shared
    async with Raw(cluster.grpc_addr(leader)) as raw:
        assert (await raw.code_of("EnqueueBatch", pb.EnqueueBatchRequest()))[0] == Code.INVALID_ARGUMENT
        assert (await raw.code_of("EnqueueAtomic", pb.EnqueueBatchRequest()))[0] == Code.INVALID_ARGUMENT
        too_many = pb.EnqueueBatchRequest(jobs=[job("x")] * 101)
        assert (await raw.code_of("EnqueueBatch", too_many))[0] == Code.INVALID_ARGUMENT
        lease = {"seconds": 10}
        for bad in (pb.ReserveRequest(queues=["x"]),                                  # no lease
                    pb.ReserveRequest(queues=["x"], lease_duration={"seconds": 0}),
                    pb.ReserveRequest(queues=[], lease_duration=lease),
                    pb.ReserveRequest(queues=["x"] * 33, lease_duration=lease),
                    pb.ReserveRequest(queues=["x"], lease_duration=lease, max_jobs=0),
                    pb.ReserveRequest(queues=["x"], lease_duration=lease, worker_id=""),
                    pb.ReserveRequest(queues=["x"], lease_duration=lease, wait_timeout={"seconds": -1})):
            assert (await raw.code_of("Reserve", bad))[0] == Code.INVALID_ARGUMENT, bad
        for rpc, bad in (("Ack", pb.AckRequest(job_id="not-a-uuid", attempt=1)),
                         ("Ack", pb.AckRequest(job_id=str(uuid.uuid4()), attempt=0)),
                         ("Nack", pb.NackRequest(job_id=str(uuid.uuid4()), attempt=1, retry=pb.NackRetry())),
                         ("Extend", pb.ExtendRequest(job_id=str(uuid.uuid4()), attempt=1)),
                         ("DrainDeadLetters", pb.DrainDeadLettersRequest(max=0))):
            assert (await raw.code_of(rpc, bad))[0] == Code.INVALID_ARGUMENT, (rpc, bad)


# ------------------------------------------------------------------ reserve, ack, nack, extend
async def test_long_poll_wakes_on_enqueue_and_clamps_its_wait(shared):
    cluster, leader = shared
    name = q("poll")
    client = await connect(cluster.grpc_addr(leader), "worker")
    try:
        t0 = time.monotonic()
        task = asyncio.create_task(client.reserve(ReserveOptions([name], timedelta(seconds=30),
                                                                 wait_timeout=timedelta(seconds=20))))
        await asyncio.sleep(0.5)
        await client.enqueue(EnqueueRequest(name, "t"))
        jobs = await asyncio.wait_for(task, 10)
        assert jobs and time.monotonic() - t0 < 5
        await client.ack(jobs[0].ctx)
        t0 = time.monotonic()
        assert await client.reserve(ReserveOptions([name], timedelta(seconds=30),
                                                   wait_timeout=timedelta(milliseconds=300))) is None
        assert 0.25 < time.monotonic() - t0 < 3
    finally:
        await client.close()


async def test_parked_reserves_past_the_bound_are_resource_exhausted(shared):
    cluster, leader = shared
    name = q("parked")
    async with Raw(cluster.grpc_addr(leader)) as raw:
        wait = pb.ReserveRequest(queues=[name], lease_duration={"seconds": 10}, wait_timeout={"seconds": 3})
        parked = [asyncio.ensure_future(raw.stub.Reserve(wait, metadata=md("worker"), timeout=10)) for _ in range(2)]
        await asyncio.sleep(0.5)
        code, details = await raw.code_of("Reserve", wait, "worker")
        assert code == Code.RESOURCE_EXHAUSTED, details        # tuning.max_parked_reserves = 2 (429 overloaded)
        for t in parked:
            assert len((await t).jobs) == 0


async def test_fencing_codes_nack_extend_and_dead_letters(shared):
    cluster, leader = shared
    name = q("fence")
    client = await connect(cluster.grpc_addr(leader), "operator", retry_policy=RetryPolicy(max_attempts=1))
    async with Raw(cluster.grpc_addr(leader)) as raw:
        try:
            await client.enqueue(EnqueueRequest(name, "t", max_attempts=5))
            first = (await client.reserve(ReserveOptions([name], timedelta(milliseconds=300))))[0].ctx
            await asyncio.sleep(1.5)                   # the lease lapses; the sweep makes it ready again
            second = (await client.reserve(ReserveOptions([name], timedelta(seconds=30),
                                                          wait_timeout=timedelta(seconds=5))))[0].ctx
            assert second.id == first.id and second.attempt == 2
            stale = pb.AckRequest(job_id=first.id, attempt=1)
            assert (await raw.code_of("Ack", stale, "worker"))[0] == Code.FAILED_PRECONDITION
            assert (await raw.code_of("Extend", pb.ExtendRequest(job_id=first.id, attempt=1, lease_duration={
                "seconds": 5}), "worker"))[0] == Code.FAILED_PRECONDITION
            unknown = pb.AckRequest(job_id=str(uuid.uuid4()), attempt=1)
            assert (await raw.code_of("Ack", unknown, "worker"))[0] == Code.NOT_FOUND
            until = await client.extend(second, timedelta(seconds=45))
            assert timedelta(seconds=40) < until - datetime.now(timezone.utc) <= timedelta(seconds=46)
            assert await client.nack(second, RetryDirective.after(timedelta(milliseconds=200)), "later") is False
            assert (await raw.code_of("Ack", pb.AckRequest(job_id=second.id, attempt=2), "worker"))[0] == Code.NOT_FOUND
            third = (await client.reserve(ReserveOptions([name], timedelta(seconds=30),
                                                         wait_timeout=timedelta(seconds=5))))[0].ctx
            assert third.attempt == 3
            assert await client.nack(third, RetryDirective.DEAD_LETTER, "give up") is True
            records = await client.drain_dead_letters(queue=name, max_records=10)
            assert [(r.job_id, r.final_attempt, r.last_reason) for r in records] == [(first.id, 3, "give up")]
            assert records[0].cause.value == "rejected" and records[0].queue == name
            assert await client.drain_dead_letters(queue=name, max_records=10) == []       # drained: gone
        finally:
            await client.close()


# ------------------------------------------------------------------ keys and roles
async def test_keys_and_roles(shared):
    cluster, leader = shared
    addr = cluster.grpc_addr(leader)
    enqueue = pb.EnqueueBatchRequest(jobs=[job(q("keys"))])
    async with Raw(addr) as raw:
        assert (await raw.code_of("EnqueueBatch", enqueue, None))[0] == Code.UNAUTHENTICATED
        for bad in (("authorization", "Bearer nope"), ("authorization", KEYS["admin"])):   # unknown; no "Bearer "
            try:
                await raw.stub.EnqueueBatch(enqueue, metadata=(bad,), timeout=5)
                code = Code.OK
            except grpc.aio.AioRpcError as e:
                code = e.code()
            assert code == Code.UNAUTHENTICATED, bad
        assert (await raw.code_of("GetServerInfo", pb.GetServerInfoRequest(), None))[0] == Code.UNAUTHENTICATED
        assert (await raw.code_of("EnqueueBatch", enqueue, "viewer"))[0] == Code.PERMISSION_DENIED
        assert (await raw.code_of("Reserve", pb.ReserveRequest(queues=["x"], lease_duration={"seconds": 1}),
                                  "viewer"))[0] == Code.PERMISSION_DENIED
        drain = pb.DrainDeadLettersRequest(queue="x")
        assert (await raw.code_of("DrainDeadLetters", drain, "worker"))[0] == Code.PERMISSION_DENIED
        assert (await raw.code_of("DrainDeadLetters", drain, "operator"))[0] == Code.OK
        assert (await raw.code_of("EnqueueBatch", enqueue, "worker"))[0] == Code.OK
        assert (await raw.code_of("GetServerInfo", pb.GetServerInfoRequest(), "viewer"))[0] == Code.OK


# ------------------------------------------------------------------ followers, no leader, a leader's death
async def test_a_follower_serves(shared):
    """A follower serves sepp's calls itself (forwarding what needs the leader to it)."""
    cluster, leader = shared
    follower = next(i for i in range(cluster.n) if i != leader)
    async with Raw(cluster.grpc_addr(follower)) as raw:
        code, details = await raw.code_of("EnqueueBatch", pb.EnqueueBatchRequest(jobs=[job(q("f"))]), "worker")
        assert code == Code.OK, details
        assert (await raw.code_of("GetServerInfo", pb.GetServerInfoRequest(), "viewer"))[0] == Code.OK


async def sepp_loop(addr: str, name: str, n: int, **kw) -> int:
    """sepp-py's enqueue → reserve → ack, n times on `addr`, as a worker does it: a reserve that
    comes back empty (a leader change ends a parked reserve) is sent again, and a job whose
    reserve answer was lost with a dying leader comes back when its short lease lapses. The jobs
    done."""
    client = await connect(addr, "worker", **kw)
    done = 0
    try:
        for i in range(n):
            await client.enqueue(EnqueueRequest(name, "t", idempotency_key=f"{name}-{i}"))
            deadline = time.monotonic() + 20
            jobs = None
            while not jobs and time.monotonic() < deadline:
                jobs = await client.reserve(ReserveOptions([name], timedelta(seconds=3),
                                                           wait_timeout=timedelta(seconds=5)))
            assert jobs, f"job {i}: nothing to reserve for 20 s"
            await client.ack(jobs[0].ctx)
            done += 1
    finally:
        await client.close()
    return done


async def test_sepp_py_loop_at_a_follower(shared):
    cluster, leader = shared
    follower = next(i for i in range(cluster.n) if i != leader)
    assert await sepp_loop(cluster.grpc_addr(follower), q("at-follower"), 20) == 20


def status_of(e: BaseException):
    """The gRPC status behind an error sepp-py raised (its own errors wrap the AioRpcError)."""
    while e is not None and not isinstance(e, grpc.aio.AioRpcError):
        e = e.__cause__
    return e.code() if e is not None else None


async def worker_through_failures(addr: str, name: str, n: int, seen: list, give_up_s: float = 60, **kw) -> int:
    """sepp_loop's jobs as a worker that keeps going: a failure sepp-py raises is noted in `seen`
    (its status) and the job tried again (its enqueue has an idempotency key: no duplicate)."""
    from sepp.errors import SeppError
    done, end = 0, time.monotonic() + give_up_s
    while done < n:
        try:
            done += await sepp_loop(addr, f"{name}-{done}", 1, **kw)
        except (SeppError, grpc.aio.AioRpcError) as e:
            seen.append(status_of(e))
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.2)
    return done


async def test_sepp_py_loop_at_a_follower_across_a_leader_kill(shared):
    """A client of a follower keeps working while the leader is killed: what it sees in between
    is only what sepp-py's retry policy treats as transient (never a NOT_FOUND for its own ack
    that a dying leader applied without answering)."""
    from sepp.errors import RETRYABLE_CODES
    cluster, leader = shared
    follower = next(i for i in range(cluster.n) if i != leader)
    policy = RetryPolicy(max_attempts=20, initial_backoff=timedelta(milliseconds=100),
                         max_backoff=timedelta(seconds=1))
    assert await sepp_loop(cluster.grpc_addr(follower), q("before-kill"), 1) == 1
    seen: list = []
    task = asyncio.create_task(worker_through_failures(cluster.grpc_addr(follower), q("kill"), 60, seen,
                                                       retry_policy=policy))
    await asyncio.sleep(0.5)
    cluster.kill(leader)
    try:
        try:
            assert await asyncio.wait_for(task, 120) == 60
        except AssertionError as e:
            raise AssertionError(f"{e} (the failures sepp-py raised before: {seen})") from e
        assert set(seen) <= RETRYABLE_CODES, seen
    finally:
        heal(cluster)


async def test_no_leader_is_unavailable(shared):
    cluster, leader = shared
    survivor = next(i for i in range(cluster.n) if i != leader)
    for i in range(cluster.n):
        if i != survivor:
            cluster.kill(i)
    try:
        async with Raw(cluster.grpc_addr(survivor)) as raw:
            deadline = time.monotonic() + 15
            while True:     # until the survivor notices that its leader is gone
                code, details = await raw.code_of("EnqueueBatch", pb.EnqueueBatchRequest(jobs=[job(q("nl"))]),
                                                  "worker")
                if code != Code.OK or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert code == Code.UNAVAILABLE, details
            r = await raw.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        heal(cluster)


# ------------------------------------------------------------------ TLS
def test_tls_with_the_nodes_files(tmp_path):
    c = LocalCluster(tmp_path / "tls", nodes=1, tls=True, grpc=True).launch()
    try:
        ca = c.ca_file.read_bytes()

        async def run():
            client = await SeppClient.connect(c.grpc_addr(0), tls_ca_cert=ca, tls_domain="localhost")
            try:
                ack = await client.enqueue(EnqueueRequest("tls", "t"))
                jobs = await client.reserve(ReserveOptions(["tls"], timedelta(seconds=10)))
                assert jobs[0].ctx.id == ack.job_id
                await client.ack(jobs[0].ctx)
            finally:
                await client.close()
            plain = grpc.aio.insecure_channel(c.grpc_addr(0))     # no TLS: refused
            try:
                with pytest.raises(grpc.aio.AioRpcError):
                    await pb_grpc.QueueServiceStub(plain).GetServerInfo(pb.GetServerInfoRequest(), timeout=3)
            finally:
                await plain.close()
        asyncio.run(run())
    finally:
        c.close()


def test_mtls_requires_a_client_certificate(tmp_path):
    """tls_client_ca: the gRPC port takes only clients with a certificate its CA signed (sepp has
    no client certificates; docs/sepp.md "What differs")."""
    c = LocalCluster(tmp_path / "mtls", nodes=1, tls="mtls", grpc=True).launch()
    try:
        ca = c.ca_file.read_bytes()
        cert, key = (open(p, "rb").read() for p in c.client_cert)
        options = (("grpc.ssl_target_name_override", "localhost"),)

        async def info(credentials):
            channel = grpc.aio.secure_channel(c.grpc_addr(0), credentials, options=options)
            try:
                return await pb_grpc.QueueServiceStub(channel).GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
            finally:
                await channel.close()

        async def run():
            got = await info(grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert))
            assert got.supported_protocol_versions == ["v1"]
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await info(grpc.ssl_channel_credentials(root_certificates=ca))
            assert e.value.code() == Code.UNAVAILABLE
        asyncio.run(run())
    finally:
        c.close()


def test_sighup_gives_new_grpc_connections_the_new_certificate(tmp_path):
    """The gRPC port takes the node's TLS files again on SIGHUP, as the HTTP API does."""
    import ssl
    c = LocalCluster(tmp_path / "reload", nodes=1, tls=True, grpc=True).launch()
    try:
        host, port = c.grpc_addr(0).rsplit(":", 1)

        def served() -> str:
            return ssl.get_server_certificate((host, int(port)), ca_certs=str(c.ca_file), timeout=5)
        before = served()
        c.cert_path(0).unlink()
        c.key_path(0).unlink()
        assert c.ensure_certs() and c.cert_path(0).exists()      # a new certificate from the same CA
        c.reload_tls(0)
        deadline = time.monotonic() + 10
        while served() == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert served() != before
    finally:
        c.close()


def test_a_call_lost_with_its_leader_is_aborted_not_unavailable():
    """A follower's call that its leader may have applied before it was lost has an unknown
    outcome (applied: null): ABORTED, which sepp-py does not retry for an enqueue without an
    idempotency key, with or without a request id."""
    from raftq.node.api.sepp_grpc import refused
    from raftq.node.service.forwarding import _lost
    for rid in (None, "r-1"):
        status, body = _lost(rid)
        assert status == 503 and body["error"]["applied"] is None, body
        assert refused(status, body).code == Code.ABORTED
