"""The Raft link encoding: authenticated encryption with the cluster secret, pickle protocol 5."""
import pytest

from raftq.node.wire import AeadEncryptor, install


def test_round_trip_and_timestamp():
    a, b = AeadEncryptor("s3cret"), AeadEncryptor("s3cret")
    token = a.encrypt_at_time(b"entries" * 50, 12345)
    assert b.extract_timestamp(token) == 12345
    assert b.decrypt(token) == b"entries" * 50
    assert b"entries" not in token                         # encrypted, not just signed


@pytest.mark.parametrize("where", [-1, 5, 20, 30])          # tag, timestamp, salt, nonce
def test_tampering_is_refused(where):
    a, b = AeadEncryptor("s3cret"), AeadEncryptor("s3cret")
    token = bytearray(a.encrypt_at_time(b"x" * 100, 7))
    token[where] ^= 1
    with pytest.raises(Exception):
        b.decrypt(bytes(token))


def test_wrong_secret_is_refused_and_nonces_never_repeat():
    a = AeadEncryptor("s3cret")
    token = a.encrypt_at_time(b"x", 1)
    with pytest.raises(Exception):
        AeadEncryptor("other").decrypt(token)
    nonces = {a.encrypt_at_time(b"x", 1)[25:37] for _ in range(1000)}
    assert len(nonces) == 1000
    # A restarted process (new salt) never reuses a key with the same nonce.
    assert a.encrypt_at_time(b"x", 1)[9:25] != AeadEncryptor("s3cret").encrypt_at_time(b"x", 1)[9:25]


def test_install_switches_pysyncobj_to_protocol_5_and_aead():
    install()
    import pysyncobj.pickle as pp
    import pysyncobj.syncobj as so
    assert vars(pp)["__protocol"] == 5
    assert pp.loads(pp.dumps(b"\xff" * 10)) == b"\xff" * 10
    assert so.getEncryptor is AeadEncryptor


def test_level_0_sends_the_bare_pickle_and_reads_both_forms():
    import pickle
    from raftq.node.replica import _Zlib
    message = pickle.dumps({"type": "append_entries", "entries": [(b"x" * 300, 7, 2)]}, 5)
    stored, deflated = _Zlib(0), _Zlib(3)
    assert stored.compress(message) is message              # no zlib call at level 0
    assert deflated.compress(message)[:1] == b"\x78" and len(deflated.compress(message)) < len(message)
    for sender in (stored, deflated):
        for receiver in (stored, deflated):
            assert receiver.decompress(sender.compress(message)) == message
