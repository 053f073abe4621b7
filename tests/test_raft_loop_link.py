"""The Ready loop's Raft link (node/raft/loop_link.py): its message encoding, and what it does
with frames that are not one of ours. Pure encoding tests plus one real loopback link."""
import asyncio
import pickle
import struct

import pytest

from raftq.cluster.local import free_ports
from raftq.node.raft.core import Entry, EntryKind, Message, MessageType, Snapshot
from raftq.node.raft.encryptor import getEncryptor
from raftq.node.raft.loop_link import Links, decode, encode
from raftq.node.raft.pickle import GlobalRefused


def _messages():
    yield Message(MessageType.REQUEST_VOTE, "a:1", "b:2", 7, last_log_index=10, last_log_term=6)
    yield Message(MessageType.RESPONSE_PREVOTE, "b:2", "a:1", 7, granted=True)
    yield Message(MessageType.APPEND_ENTRIES, "a:1", "b:2", 3, prev_log_index=4, prev_log_term=2,
                  entries=(Entry(5, 3, b"\x00cmd"), Entry(6, 3, b"\x01", EntryKind.NO_OP)), commit_index=4)
    yield Message(MessageType.NEXT_NODE_IDX, "b:2", "a:1", 3, success=False, next_node_idx=3, reject_index=4,
                  commit_index=2, log_unverified=True)
    yield Message(MessageType.INSTALL_SNAPSHOT, "a:1", "b:2", 9, commit_index=40,
                  snapshot=Snapshot(40, 8, frozenset({"a:1", "b:2", "c:3"}), b"\x00" * 100))


@pytest.mark.parametrize("m", list(_messages()), ids=lambda m: m.type.value)
def test_every_message_type_reads_back_as_it_was_sent(m):
    assert decode(encode(m)) == m


def test_a_frame_that_names_a_class_is_refused_not_run():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    with pytest.raises(GlobalRefused):
        decode(pickle.dumps(Evil()))


async def _link_pair(secret_a, secret_b, port_a, port_b):
    loop = asyncio.get_running_loop()
    got = []
    a = Links(loop, f"127.0.0.1:{port_a}", [f"127.0.0.1:{port_b}"], getEncryptor(secret_a) if secret_a else None,
              got.append, retry_s=0.05)
    b = Links(loop, f"127.0.0.1:{port_b}", [f"127.0.0.1:{port_a}"], getEncryptor(secret_b) if secret_b else None,
              got.append, retry_s=0.05)
    await a.start()
    await b.start()
    return a, b, got


async def _wait(cond, timeout=5.0):
    end = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_two_links_carry_messages_both_ways_with_the_cluster_secret():
    pa, pb = free_ports(2)
    a, b, got = await _link_pair("s3cret", "s3cret", pa, pb)
    try:
        await _wait(lambda: a.connected(f"127.0.0.1:{pb}") and b.connected(f"127.0.0.1:{pa}"))
        m1 = Message(MessageType.REQUEST_VOTE, f"127.0.0.1:{pa}", f"127.0.0.1:{pb}", 2, last_log_index=1)
        m2 = Message(MessageType.RESPONSE_VOTE, f"127.0.0.1:{pb}", f"127.0.0.1:{pa}", 2, granted=True)
        a.send(m1)
        a.flush()
        b.send(m2)
        b.flush()
        await _wait(lambda: len(got) == 2)
        assert sorted(got, key=lambda m: m.type.value) == sorted([m1, m2], key=lambda m: m.type.value)
    finally:
        await a.close()
        await b.close()


async def test_a_peer_with_another_secret_is_heard_as_nothing_and_counted():
    pa, pb = free_ports(2)
    a, b, got = await _link_pair("one", "other", pa, pb)
    try:
        await _wait(lambda: a.refusals["auth_failed"] + b.refusals["auth_failed"] >= 2)
        assert not a.connected(f"127.0.0.1:{pb}") and not b.connected(f"127.0.0.1:{pa}")
        a.send(Message(MessageType.REQUEST_VOTE, f"127.0.0.1:{pa}", f"127.0.0.1:{pb}", 2))
        a.flush()
        assert got == []
    finally:
        await a.close()
        await b.close()


async def test_a_connection_that_says_nothing_is_closed_after_the_handshake_timeout():
    (pa,) = free_ports(1)
    a = Links(asyncio.get_running_loop(), f"127.0.0.1:{pa}", [], None, lambda m: None, handshake_timeout_s=0.2)
    await a.start()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", pa)
        assert await asyncio.wait_for(r.read(), 5) == b""
        assert a.refusals["handshake_timeout"] == 1
    finally:
        await a.close()


async def test_handshakes_beyond_the_cap_close_the_oldest():
    (pa,) = free_ports(1)
    a = Links(asyncio.get_running_loop(), f"127.0.0.1:{pa}", [], None, lambda m: None, max_pending=2)
    await a.start()
    try:
        conns = [await asyncio.open_connection("127.0.0.1", pa) for _ in range(3)]
        assert await asyncio.wait_for(conns[0][0].read(), 5) == b""        # the oldest made room
        assert a.refusals["too_many_pending"] == 1 and len(a.pending) == 2
    finally:
        await a.close()


async def test_a_frame_longer_than_the_bound_closes_the_connection():
    (pa,) = free_ports(1)
    loop = asyncio.get_running_loop()
    a = Links(loop, f"127.0.0.1:{pa}", [], None, lambda m: None)
    await a.start()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", pa)
        w.write(struct.pack("i", 4097))        # before authentication: at most 4 KiB (the fork's bound)
        await w.drain()
        assert await asyncio.wait_for(r.read(), 5) == b""       # closed by the link
        assert a.refusals["frame_too_large"] == 1
    finally:
        await a.close()


async def test_peers_added_and_dropped_at_run_time_connect_and_are_closed():
    # a membership change (docs/cluster.md "Membership changes"): a new member is dialed or
    # accepted, a removed one's connection closed and its next connections refused
    loop = asyncio.get_running_loop()
    addr_a, addr_b = sorted(f"127.0.0.1:{p}" for p in free_ports(2))     # b dials: the larger address
    got = []
    a = Links(loop, addr_a, [], getEncryptor("s3cret"), got.append, retry_s=0.05)
    b = Links(loop, addr_b, [addr_a], getEncryptor("s3cret"), got.append, retry_s=0.05)
    await a.start()
    await b.start()
    try:
        await _wait(lambda: a.refusals["unknown_peer"] >= 1)
        assert not a.connected(addr_b) and not b.connected(addr_a)
        a.set_peers([addr_b, addr_a])           # (its own address is never a peer)
        assert list(a.peers) == [addr_b]
        await _wait(lambda: a.connected(addr_b) and b.connected(addr_a))
        m = Message(MessageType.REQUEST_VOTE, addr_a, addr_b, 2, last_log_index=1)
        a.send(m)
        a.flush()
        await _wait(lambda: got == [m])
        refused = a.refusals["unknown_peer"]
        a.set_peers([])
        await _wait(lambda: not b.connected(addr_a))
        await _wait(lambda: a.refusals["unknown_peer"] > refused)      # b dials again, and is refused
        assert not a.connected(addr_b) and a.peers == {}
        b.set_peers([])                         # the dialing side stops dialing
        assert b.dialers == {} and b.peers == {}
    finally:
        await a.close()
        await b.close()


async def test_a_connection_the_peer_closes_is_reported_lost_one_this_side_closes_is_not():
    # core.peerLost: a killed leader's sockets close at once, and its followers stand soon
    loop = asyncio.get_running_loop()
    addr_a, addr_b, addr_c = sorted(f"127.0.0.1:{p}" for p in free_ports(3))
    lost = {addr_a: [], addr_b: [], addr_c: []}
    links = {addr: Links(loop, addr, [x for x in lost if x != addr], getEncryptor("s3cret"), lambda m: None,
                         retry_s=0.05, on_lost=lost[addr].append) for addr in lost}
    a, b, c = links[addr_a], links[addr_b], links[addr_c]
    for link in links.values():
        await link.start()
    try:
        await _wait(lambda: a.connected(addr_b) and a.connected(addr_c) and b.connected(addr_c))
        await b.close()                         # b goes: a accepted b's connection, c dialed b
        await _wait(lambda: lost[addr_a] == [addr_b] and lost[addr_c] == [addr_b])
        assert lost[addr_b] == []               # b closed them itself
        c.set_peers([addr_b])                   # c drops a: its own choice, not a loss (for c)
        await _wait(lambda: not a.connected(addr_c))
        assert lost[addr_c] == [addr_b] and lost[addr_a] == [addr_b, addr_c]
    finally:
        for link in links.values():
            await link.close()


async def test_a_connection_that_carried_messages_and_was_reset_is_dialed_again_at_once():
    # so a live leader's followers see it back within LoopSyncObj's grace after a reset, long
    # before the retry period (here 30 s) a failed dial waits
    loop = asyncio.get_running_loop()
    addr_a, addr_b = sorted(f"127.0.0.1:{p}" for p in free_ports(2))     # b dials
    got, lost = [], []
    a = Links(loop, addr_a, [addr_b], getEncryptor("s3cret"), got.append, retry_s=30, on_lost=lost.append)
    b = Links(loop, addr_b, [addr_a], getEncryptor("s3cret"), got.append, retry_s=30)
    await a.start()
    await b.start()
    try:
        await _wait(lambda: a.connected(addr_b) and b.connected(addr_a))
        m = Message(MessageType.REQUEST_VOTE, addr_b, addr_a, 2, last_log_index=1)
        answer = Message(MessageType.RESPONSE_VOTE, addr_a, addr_b, 2, granted=True)
        b.send(m)
        b.flush()
        a.send(answer)
        a.flush()
        await _wait(lambda: got == [m, answer] or got == [answer, m])
        a.peers[addr_b].writer.transport.abort()        # a reset, as the chaos proxy's
        await _wait(lambda: lost == [addr_b])
        await _wait(lambda: a.connected(addr_b) and b.connected(addr_a))
    finally:
        await a.close()
        await b.close()
