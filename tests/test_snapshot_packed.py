"""A snapshot's machine in parts (node/replication/replica.py `pack_machine`): the long lists
written as compressed chunks and read back a chunk at a time build the machine a whole document
builds; documents without parts (earlier snapshots, backups) read as before; a chunk is builtins
only."""
import io
import pickle
import uuid
import itertools
import zlib

import pytest

from raftq.node.base import validate as C
from raftq.node.core.limits import Limits
from raftq.node.core.machine import QueueMachine
from raftq.node.raft import pickle as raft_pickle
from raftq.node.replication import replica as packed


def _machine(n: int = 40) -> tuple[Limits, QueueMachine]:
    limits = Limits.build(storage={"dedup_window_ms": 10**6})
    m = QueueMachine(limits)
    ids = itertools.count(1)
    now = 1_000_000
    for i in range(n):                  # jobs, dedup records and request ids: the three packed lists
        m.apply(now + i, C.enqueue({"queue": "q", "job_type": "t", "idempotency_key": f"k{i}",
                                    "priority": i % 3}, limits, now + i,
                                   lambda: str(uuid.UUID(int=next(ids))), rid=f"r{i}"))
    m.apply(now + 50, C.reserve({"queues": ["q"], "lease_ms": 100, "max_jobs": 3}, limits)[0])
    return limits, m


def _document(m: QueueMachine) -> dict:
    machine, parts = packed.pack_machine(m.to_builtins())
    # As a snapshot file holds it: through the builtins-only pickler and back.
    out = io.BytesIO()
    raft_pickle.dumpBuiltins({"machine": machine, "packed": parts}, out)
    return raft_pickle.loadsBuiltins(out.getvalue())


def test_a_packed_document_restores_the_machine_a_whole_one_does(monkeypatch):
    monkeypatch.setattr(packed, "CHUNK_ROWS", 7)        # 40 rows: six chunks, the last short
    limits, live = _machine()
    doc = _document(live)
    assert [len(doc["packed"][name]) for name in packed.PACKED] == [6, 6, 6]
    assert not set(packed.PACKED) & set(doc["machine"]) and "dedup_heap" not in doc["machine"]
    whole = {k: v for k, v in live.to_builtins().items() if k != "dedup_heap"}
    assert packed.machine_of(doc) == whole                  # a reader that looks gets lists
    restored = QueueMachine.from_builtins(limits, packed.machine_of(doc, consume=True), consume=True)
    assert restored.digest() == live.digest()
    assert restored.to_builtins() == live.to_builtins()
    assert all(set(doc["packed"][name]) == {None} for name in packed.PACKED)    # each chunk let go
    t = 1_000_000 + 5000
    assert restored.apply(t, C.sweep()) == live.apply(t, C.sweep())
    reserve = C.reserve({"queues": ["q"], "lease_ms": 100, "max_jobs": 50}, limits)[0]
    assert restored.apply(t + 1, reserve) == live.apply(t + 1, reserve)


def test_a_document_without_parts_is_read_as_before():
    limits, live = _machine(10)
    data = live.to_builtins()
    doc = {"machine": pickle.loads(pickle.dumps(data))}
    assert packed.machine_of(doc) is doc["machine"]
    restored = QueueMachine.from_builtins(limits, packed.machine_of(doc, consume=True), consume=True)
    assert restored.digest() == live.digest()


def test_a_chunk_that_names_a_global_is_refused():
    limits, live = _machine(5)
    doc = _document(live)
    doc["packed"]["jobs"][0] = zlib.compress(pickle.dumps([print], 5))
    with pytest.raises(raft_pickle.GlobalRefused):
        packed.machine_of(doc)


def test_packed_parts_are_smaller_than_the_whole_written_the_same_way():
    """The snapshot file gzips its document at level 1: chunks compressed on their own compress
    the rows of alike jobs better (docs/performance.md "Snapshots at 1M")."""
    import gzip
    limits, live = _machine(2000)
    machine, parts = packed.pack_machine(live.to_builtins())

    def size(doc) -> int:
        out = io.BytesIO()
        raft_pickle.dumpBuiltins(doc, out)
        return len(gzip.compress(out.getvalue(), 1))
    assert size({"machine": machine, "packed": parts}) < size({"machine": live.to_builtins()})


def test_a_restored_machine_keeps_no_object_of_the_rows_where_its_jobs_have_one():
    """The ready entries' seqs and the dedup records' job ids are the jobs' own objects after a
    restore, as in the machine that lived: a copy from the rows would keep the memory the
    document took (docs/performance.md "Snapshots at 1M")."""
    limits, live = _machine(30)
    restored = QueueMachine.from_builtins(limits, packed.machine_of(_document(live), consume=True), consume=True)
    q = restored.queues["q"]
    assert q.ready_heap and all(e[2] is e[3].seq for e in q.ready_heap)
    fifo_limits = Limits.build()
    m = QueueMachine(fifo_limits)
    ids = itertools.count(1)
    for i in range(20):
        m.apply(1_000 + i, C.enqueue({"queue": "f", "job_type": "t"}, fifo_limits, 1_000 + i,
                                     lambda: str(uuid.UUID(int=next(ids)))))
    again = QueueMachine.from_builtins(fifo_limits, packed.machine_of(_document(m), consume=True), consume=True)
    f = again.queues["f"]
    assert len(f.ready_fifo) == 20 and all(s is j.seq for s, j in zip(f.fifo_seqs, f.ready_fifo))
    records = [r for keyed in restored.dedup.values() for r in keyed.values()]
    assert len(records) == 30 and all(r[2] is restored.jobs[r[2]].id for r in records)
