"""The proposer's in-flight count: each proposed batch leaves it exactly once, when it is
committed, fails or times out, whichever comes first (unit test: a stand-in for the
replicated call, answering from another thread as pysyncobj's tick thread does)."""
import asyncio
import threading

from raftq.node.replication.replica import FAIL_REASON

from raftq.node.replication.proposer import Proposer


class Recorder:
    def __init__(self):
        self.calls = []

    def apply_batch(self, now_ms, cmds, callback):
        self.calls.append((cmds, callback))


def answer_from_thread(callback, results, reason=FAIL_REASON.SUCCESS):
    t = threading.Thread(target=callback, args=(results, reason))
    t.start()
    t.join()


async def test_a_batch_leaves_inflight_once_committed_failed_or_timed_out():
    loop = asyncio.get_running_loop()
    state = Recorder()
    p = Proposer(state, loop, lambda: 1, request_timeout_s=0.2, max_inflight=5)
    first = [p.submit(("ack", None, str(i), 1)) for i in range(3)]
    assert p.inflight == 3
    await asyncio.sleep(0)                       # the flush: one batch
    assert len(state.calls) == 1 and p.inflight == 3
    first[1].cancel()                            # a handler that went away still counts until settled
    answer_from_thread(state.calls[0][1], [(200, {"n": i}) for i in range(3)])
    assert await first[0] == (200, {"n": 0}) and await first[2] == (200, {"n": 2})
    assert p.inflight == 0

    second = [p.submit(("ack", None, "x", 1)) for _ in range(5)]
    assert (await p.submit(("ack", None, "y", 1)))[1]["error"]["code"] == "overloaded"
    await asyncio.sleep(0)
    answer_from_thread(state.calls[1][1], None, FAIL_REASON.NOT_LEADER)
    assert {(await f)[1]["error"]["code"] for f in second} == {"no_leader"}
    assert p.inflight == 0

    third = p.submit(("ack", None, "z", 1))
    await asyncio.sleep(0)
    assert (await third)[1]["error"]["code"] == "unavailable"     # the reaper, after 0.2 s
    assert p.inflight == 0
    answer_from_thread(state.calls[2][1], [(200, {})])            # committed after all: counted once
    await asyncio.sleep(0.01)
    assert p.inflight == 0 and p.stats["timeouts"] == 1
