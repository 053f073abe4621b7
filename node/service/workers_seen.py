"""Which workers reserve from which queue: the leader's soft state behind `workers` and
`no_workers` in `GET /v1/queues` (docs/api.md "Queues").

Not replicated and not in the state machine: the leader notes, for each reserve it serves, the
pair (queue, worker) for every queue the reserve names, with the node's monotonic time. A
worker is the reserve's `worker_id`; reserves without one count together as one anonymous
worker (a consumer is there, whoever it is). A reserve parked in a long poll counts for as long
as it waits, however long that is. A pair not seen for `window_ms` (30 s) is forgotten.

Bounded: at most `MAX_PAIRS` pairs are kept; a new pair beyond that pushes out the pair seen
longest ago. Every operation is O(1) amortised (an ordered dict in last-seen order, pruned from
its old end), so the reserve path pays two dict operations per queue named.

`known()` says whether the counts mean anything yet: only on the leader, and only once it has
led for a whole window (before that, a worker that reserved from the previous leader may simply
not have come to this one yet). Until then the node reports `workers` and `no_workers` as null.
"""
from __future__ import annotations

import time
from collections import OrderedDict

WINDOW_MS = 30_000
MAX_PAIRS = 10_000
ANONYMOUS = ""          # the worker of reserves without a worker_id


class WorkersSeen:
    def __init__(self, window_ms: int = WINDOW_MS, max_pairs: int = MAX_PAIRS, clock=time.monotonic):
        self.window_ms = window_ms
        self.max_pairs = max_pairs
        self.clock = clock
        self.seen: OrderedDict = OrderedDict()     # (queue, worker) -> last seen (ms), oldest first
        self.per_queue: dict[str, dict] = {}        # queue -> {worker: None} of the pairs in `seen`
        self.parked: dict[str, dict] = {}           # queue -> {worker: reserves waiting now}
        self.since: float | None = None             # when this node became leader (ms), None: not leading

    def now_ms(self) -> float:
        return self.clock() * 1000.0

    # ------------------------------------------------------------------ leadership
    def lead(self) -> None:
        """This node leads from now on: start counting afresh."""
        self.forget()
        self.since = self.now_ms()

    def follow(self) -> None:
        self.forget()
        self.since = None

    def forget(self) -> None:
        self.seen.clear()
        self.per_queue.clear()
        self.parked.clear()

    def known(self) -> bool:
        return self.since is not None and self.now_ms() - self.since >= self.window_ms

    # ------------------------------------------------------------------ the reserve path
    def note(self, queues, worker: str | None) -> None:
        """A reserve naming `queues` by `worker` (None: anonymous)."""
        w = worker or ANONYMOUS
        now = self.now_ms()
        seen = self.seen
        for q in queues:
            key = (q, w)
            if key in seen:
                seen.move_to_end(key)
            else:
                if len(seen) >= self.max_pairs:
                    self._drop(*seen.popitem(last=False)[0])
                self.per_queue.setdefault(q, {})[w] = None
            seen[key] = now

    def park(self, queues, worker: str | None) -> None:
        w = worker or ANONYMOUS
        for q in queues:
            ws = self.parked.setdefault(q, {})
            ws[w] = ws.get(w, 0) + 1

    def unpark(self, queues, worker: str | None) -> None:
        w = worker or ANONYMOUS
        for q in queues:
            ws = self.parked.get(q)
            if ws is None or w not in ws:
                continue                    # forgotten meanwhile (leadership moved)
            if ws[w] > 1:
                ws[w] -= 1
            else:
                del ws[w]
                if not ws:
                    del self.parked[q]
        self.note(queues, worker)           # it was there until now

    # ------------------------------------------------------------------ reads
    def _drop(self, q, w) -> None:
        ws = self.per_queue.get(q)
        if ws is not None:
            ws.pop(w, None)
            if not ws:
                del self.per_queue[q]

    def prune(self) -> None:
        limit = self.now_ms() - self.window_ms
        seen = self.seen
        while seen:
            key, at = next(iter(seen.items()))
            if at >= limit:                 # seen within the window (its edge included)
                break
            del seen[key]
            self._drop(*key)

    def count(self, queue: str) -> int:
        """Distinct workers that reserved from `queue` in the last window (or wait on it now);
        call prune() first (once per read of many queues)."""
        ws = self.per_queue.get(queue) or {}
        waiting = self.parked.get(queue)
        if not waiting:
            return len(ws)
        return len(ws) + sum(1 for w in waiting if w not in ws)

    def stats(self, queue: str) -> tuple[int | None, bool | None]:
        """(workers, no_workers) for the queue's stats; (None, None) while not known()."""
        if not self.known():
            return None, None
        n = self.count(queue)
        return n, n == 0
