"""How Raft messages are encoded between nodes: faster than pysyncobj's defaults, as safe.

* Pickle protocol 5 instead of pysyncobj's protocol 2. Protocol 2 has no bytes type: every job
  payload went through `codecs.encode(latin-1 text)`, 10x slower to pickle and unpickle and 1.5x
  bigger (measured: a 256-job command, 380 µs → 40 µs to pickle, 116 KB → 75 KB).
* AES-256-GCM instead of Fernet for the cluster secret. Fernet base64-encodes every token and
  pysyncobj decodes it twice per message (once for the timestamp, once to decrypt), which took
  ~40 % of a follower's CPU under batched enqueues. The replacement keeps pysyncobj's interface
  (`encrypt_at_time`, `extract_timestamp`, `decrypt`) and its guarantees: authenticated
  encryption, the key derived from the secret with PBKDF2-HMAC-SHA256 (100,000 rounds), and a
  timestamp bound into every message (pysyncobj refuses timestamps going backwards on a
  connection, together with its per-connection random keys, against replays).

Token: version (1) | timestamp (8) | salt (16) | nonce (12) | ciphertext + tag (16). Each
process draws a random salt and derives its sending key with HKDF(secret key, salt); nonces are
a counter under that key, so a (key, nonce) pair is never reused, even across restarts. The
header is authenticated as associated data.

Every node of a cluster must run this same encoding (they run the same raftq).
"""
from __future__ import annotations

import itertools
import os
import struct
import threading

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

PICKLE_PROTOCOL = 5
_VERSION = b"\x01"
_HEADER = struct.Struct(">cQ16s12s")     # version, timestamp, salt, nonce
# pysyncobj's fixed salt for the password KDF, kept so the secret means the same thing.
_KDF_SALT = b'\x15%q\xe6\xbb\x02\xa6\xf8\x13q\x90\xcf6+\x1e\xeb'


class InvalidToken(Exception):
    pass


def _subkey(master: bytes, salt: bytes) -> AESGCM:
    return AESGCM(HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=b"raftq raft link").derive(master))


class AeadEncryptor:
    def __init__(self, secret: str | bytes):
        if not isinstance(secret, bytes):
            secret = secret.encode()
        self._master = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=_KDF_SALT,
                                  iterations=100_000).derive(secret)
        self._salt = os.urandom(16)
        self._send = _subkey(self._master, self._salt)
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._recv: dict[bytes, AESGCM] = {}

    def encrypt_at_time(self, data: bytes, timestamp: int) -> bytes:
        with self._lock:
            n = next(self._counter)
        header = _HEADER.pack(_VERSION, max(0, int(timestamp)), self._salt, n.to_bytes(12, "big"))
        return header + self._send.encrypt(header[-12:], data, header)

    def extract_timestamp(self, token: bytes) -> int:
        if len(token) < _HEADER.size + 16 or token[:1] != _VERSION:
            raise InvalidToken("not a raftq link token")
        return _HEADER.unpack_from(token)[1]

    def decrypt(self, token: bytes) -> bytes:
        if len(token) < _HEADER.size + 16 or token[:1] != _VERSION:
            raise InvalidToken("not a raftq link token")
        _, _, salt, nonce = _HEADER.unpack_from(token)
        key = self._recv.get(salt)
        if key is None:
            if len(self._recv) > 64:          # peers restart with new salts: keep the cache small
                self._recv.clear()
            key = self._recv[salt] = _subkey(self._master, salt)
        header = bytes(token[:_HEADER.size])
        return key.decrypt(nonce, bytes(token[_HEADER.size:]), header)


def install():
    """Make pysyncobj use this encoding (before any SyncObj is built)."""
    import pysyncobj.pickle as pp
    import pysyncobj.syncobj as so
    vars(pp)["__protocol"] = PICKLE_PROTOCOL
    so.getEncryptor = AeadEncryptor
