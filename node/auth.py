"""API keys and roles (API.md "Authentication").

With `[auth] api_keys` configured, every `/v1/` request needs `Authorization: Bearer <key>`, and
the key's role must reach the operation's: viewer < worker < operator < admin. Without keys the
API is open (a node on loopback or behind a private network). Every node checks on its own, before
any redirect: all nodes of a cluster share one config, and a follower must not tell an unknown
caller where the leader is.
"""
from __future__ import annotations

import hashlib

from .errors import error
from .settings import ROLES

VIEWER, WORKER, OPERATOR, ADMIN = (ROLES.index(r) for r in ("viewer", "worker", "operator", "admin"))


def _digest(key: str) -> bytes:
    # Keys are looked up by their hash, so the lookup's timing says nothing about the keys.
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class Auth:
    def __init__(self, api_keys):
        self.enabled = bool(api_keys)
        self.keys = {_digest(k["key"]): (k["name"], ROLES.index(k["role"])) for k in api_keys or ()}

    def who(self, header: str | None) -> tuple[tuple[str, int] | None, tuple[int, dict] | None]:
        """((key name, role level), None) for a known key, else (None, the 401 error)."""
        if not header:
            return None, error("unauthenticated", "an API key is required: send the header "
                                                  "'Authorization: Bearer <key>'")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return None, error("unauthenticated", "the Authorization header must be 'Bearer <key>'")
        found = self.keys.get(_digest(key))
        if found is None:
            return None, error("unauthenticated", "unknown API key")
        return found, None

    def check(self, header: str | None, need: int) -> tuple[int, dict] | None:
        """None when the caller may do an operation that needs role level `need`, else the
        401/403 error to answer."""
        if not self.enabled:
            return None
        found, refused = self.who(header)
        return refused if found is None else self.permits(found, need)

    @staticmethod
    def permits(found: tuple[str, int], need: int) -> tuple[int, dict] | None:
        name, level = found
        if level >= need:
            return None
        return error("permission_denied", f"the API key {name!r} has the role {ROLES[level]}; "
                                          f"this needs {ROLES[need]} or higher",
                     role=ROLES[level], required_role=ROLES[need])
