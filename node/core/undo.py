"""The undo log: how `apply` never raises (README "Apply never raises").

pysyncobj wedges the whole cluster when an apply raises, so each command runs under an undo
log: every mutation is recorded, before it is made, with how to revert it, and an unexpected
exception reverts the command (newest entry first) and yields an `internal` result.

The log is a flat list of quadruples `fn, a, b, c`: reverting calls fn(a, b, c). Each mutation
is recorded with one `undo += (...)`, so logging allocates nothing that outlives the statement
(no per-mutation tuples for the cyclic GC to chase). The hot paths (enqueue, reserve, ack)
write these entries inline; `UndoLog`'s primitives do the same for the rest.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from heapq import heapify, heappop, heappush


class InjectedFault(Exception):
    """Raised by the fault-injection hook in tests."""


class FaultLog(list):
    """The undo log while a test injects a fault: the n-th mutation raises before it is made."""
    __slots__ = ("left",)

    def __iadd__(self, entry):
        if self.left <= 0:
            raise InjectedFault("injected fault")
        self.left -= 1
        return list.__iadd__(self, entry)


# ---------------------------------------------------------------------------- reverting functions
def restore_item(d, key, value):
    d[key] = value


def drop_item(d, key, _):
    d.pop(key, None)


def fifo_unappend(q, job, tail):
    """Undo a FIFO append of `job` (node/core/jobs.py Queue): its newest entry goes (a later one
    of the same command was undone first; when the command itself dropped it as a stale head,
    what goes is an older stale entry of the job, or nothing), and the tail is what it was."""
    fifo, seqs = q.ready_fifo, q.fifo_seqs
    if fifo and fifo[-1] is job:
        fifo.pop()
        seqs.pop()
    else:
        for i in range(len(fifo) - 1, -1, -1):
            if fifo[i] is job:
                del fifo[i]
                del seqs[i]
                break
    q.fifo_tail = tail


def fifo_restore_head(q, job, seq):
    """Undo a reserve's pop of the FIFO's head."""
    q.ready_fifo.appendleft(job)
    q.fifo_seqs.appendleft(seq)


def heap_restore(heap: list, entry, _):
    heappush(heap, entry)


def appendleft(dq: deque, entry, _):
    dq.appendleft(entry)


def pop_right(dq: deque, _a, _b):
    dq.pop()


def heap_remove(heap: list, entry, _=None):
    for i, e in enumerate(heap):
        if e is entry:
            heap[i] = heap[-1]
            heap.pop()
            heapify(heap)
            return


def restore_in_place(d: dict, key, kept):
    """Put an item back where it was: the keys that followed it move to the end after it."""
    value, after = kept
    d[key] = value
    for k in after:
        d[k] = d.pop(k)


def odict_restore(od: OrderedDict, key, record):
    """Put a dead-letter record back in its place (records know their order)."""
    od[key] = record
    order = record.order
    for k in [k for k, v in od.items() if v.order > order]:
        od.move_to_end(k)


class UndoLog:
    """Mutation primitives that record their undo first; mixed into QueueMachine."""
    __slots__ = ()
    _undo: list

    @property
    def _fault_after(self) -> int | None:
        """Tests: raise InjectedFault at the n-th mutation of a command (0 = the first)."""
        undo = self._undo
        return undo.left if type(undo) is FaultLog else None

    @_fault_after.setter
    def _fault_after(self, n: int | None):
        undo = self._undo
        if n is None:
            if type(undo) is FaultLog:
                self._undo = list(undo)
        else:
            log = FaultLog(undo)
            log.left = n
            self._undo = log

    def _revert(self):
        undo, self._undo = self._undo, []       # also ends fault injection
        for i in range(len(undo) - 4, -1, -4):
            undo[i](undo[i + 1], undo[i + 2], undo[i + 3])

    def _set(self, obj, name: str, value):
        undo = self._undo
        undo += (setattr, obj, name, getattr(obj, name))
        setattr(obj, name, value)

    def _add(self, obj, name: str, delta: int):
        old = getattr(obj, name)
        undo = self._undo
        undo += (setattr, obj, name, old)
        setattr(obj, name, old + delta)

    def _put(self, d: dict, key, value):
        undo = self._undo
        if key in d:
            undo += (restore_item, d, key, d[key])
        else:
            undo += (drop_item, d, key, None)
        d[key] = value

    def _pop(self, d: dict, key):
        value = d[key]
        undo = self._undo
        undo += (restore_item, d, key, value)
        del d[key]
        return value

    def _pop_in_place(self, d: dict, key):
        """`_pop` whose undo puts the key back in its place, not at the end: for small dicts
        whose order a later loop follows (gating's blocked heaps are released in dict order),
        so a reverted command leaves even the order as it was."""
        value = d[key]
        keys = list(d)
        undo = self._undo
        undo += (restore_in_place, d, key, (value, keys[keys.index(key) + 1:]))
        del d[key]
        return value

    def _push(self, heap: list, entry):
        undo = self._undo
        undo += (heap_remove, heap, entry, None)
        heappush(heap, entry)

    def _heappop(self, heap: list):
        entry = heap[0]
        undo = self._undo
        undo += (heap_restore, heap, entry, None)
        return heappop(heap)

    def _append(self, dq: deque, entry):
        undo = self._undo
        undo += (pop_right, dq, None, None)
        dq.append(entry)

    def _popleft(self, dq: deque):
        entry = dq[0]
        undo = self._undo
        undo += (appendleft, dq, entry, None)
        return dq.popleft()

    def _odict_pop(self, od: OrderedDict, key):
        # Dead letters keep their order on undo: a reverted drain must not reorder the store.
        value = od[key]
        undo = self._undo
        undo += (odict_restore, od, key, value)
        del od[key]
        return value

    def _new_seq(self) -> int:
        seq = self.seq
        undo = self._undo
        undo += (setattr, self, "seq", seq)
        self.seq = seq = seq + 1
        return seq

    def _new_ctr(self) -> int:
        ctr = self.ctr
        undo = self._undo
        undo += (setattr, self, "ctr", ctr)
        self.ctr = ctr = ctr + 1
        return ctr
