"""Request ids scoped to their caller and bound to their request.

A client's `Request-Id` (API.md: 1..128 visible ASCII characters) makes its retry of a request
exactly-once in effect: the cluster stores the answer under the id and replays it. Stored under
the bare id, that answer was anybody's: a caller who learnt or guessed another's id got the
other's stored answer (a reserve's, payload included) and could act on the job; and a reuse of an
id with another body silently got the first request's answer.

So the id a command carries is `caller SEP id SEP fingerprint`:
* `caller` is the name of the API key that sent it ("" on a node without keys), so each key has
  ids of its own;
* `fingerprint` hashes the operation, its target (the job id or queue name of the path, or of the
  session frame) and the body as parsed, so that the same request over HTTP or over the session
  has the same one.

The machine (node/machine.py `apply_one`) stores the answer under `caller SEP id` with
`op SEP fingerprint` as the operation it was for, and refuses a reuse with another operation or
another fingerprint (400 `invalid_argument`). SEP cannot be in a client's id, so an id without it
(journals written before this) is a key of its own, as it always was.
"""
from __future__ import annotations

import hashlib

import orjson

SEP = "\x1f"
# The operations whose target is the job id a session frame carries in its body (over HTTP it is
# in the path): both forms of one request get one fingerprint.
JOB_OPS = frozenset(("ack", "nack", "extend"))


def key(caller: str, rid: str | None, op: str, target, body) -> str | None:
    """The request id a command carries for `rid` (None: none)."""
    if rid is None:
        return None
    try:
        data = orjson.dumps(body)
    except (TypeError, orjson.JSONEncodeError):     # (a body orjson parsed always dumps)
        data = repr(body).encode()
    h = hashlib.blake2b(digest_size=8)
    h.update(op.encode())
    h.update(b"\0" + str("" if target is None else target).encode("utf-8", "surrogatepass") + b"\0")
    h.update(data)
    return f"{caller}{SEP}{rid}{SEP}{h.hexdigest()}"


def session_target(op: str, body):
    return body.get("job_id") if op in JOB_OPS and isinstance(body, dict) else None


def stored_key(wire: str) -> str:
    """Where the machine stores the answer of a command with request id `wire`."""
    k, sep, _ = wire.rpartition(SEP)
    return k if sep else wire


def client_id(stored: str) -> str:
    """The client's own id of a stored key (for messages)."""
    return stored.rpartition(SEP)[2]


def op_of_tag(tag: str) -> str:
    return tag.partition(SEP)[0]
