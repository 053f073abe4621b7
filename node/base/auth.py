"""API keys and roles (docs/api.md "Authentication").

The keys in force are replicated state (node/core/config.py: names, roles and SHA-256 digests,
never the keys), seeded from `[auth] api_keys` of the first leader's TOML and changed with
`POST/DELETE /v1/keys`. Auth is on exactly when the key set in force is not empty: every `/v1/`
request then needs `Authorization: Bearer <key>`, and the key's role must reach the
operation's: viewer < worker < operator < admin. Without keys the API is open (a node on
loopback or behind a private network). Every node checks on its own, before any redirect, per
request and per session frame, against the set in force as it has applied it (`load`, called
when the configuration version changes): a removed key is refused everywhere from its entry on.
"""
from __future__ import annotations

import hashlib

from ..core.errors import error
from .settings import API_ROLES

VIEWER, WORKER, OPERATOR, ADMIN = (API_ROLES.index(r) for r in ("viewer", "worker", "operator", "admin"))


def _digest(key: str) -> bytes:
    # Keys are looked up by their hash, so the lookup's timing says nothing about the keys.
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class Auth:
    def __init__(self, api_keys=None):
        """`api_keys`: the TOML's [auth] keys ({name, key, role}), in force until the cluster's
        configuration version 1 is applied (the bootstrap)."""
        self.enabled = bool(api_keys)
        self.keys = {_digest(k["key"]): (k["name"], API_ROLES.index(k["role"])) for k in api_keys or ()}

    def load(self, records) -> None:
        """The key set in force: (name, key_sha256 hex, role) records. The dict is swapped whole
        (readers on the event loop see the old or the new one); auth goes on after its keys are
        there and off before they go."""
        keys = {bytes.fromhex(digest): (name, API_ROLES.index(role)) for name, digest, role in records}
        if keys:
            self.keys = keys
            self.enabled = True
        else:
            self.enabled = False
            self.keys = keys

    def lookup(self, key_digest: bytes):
        return self.keys.get(key_digest)

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

    def frame_check(self, header: str | None, need: int):
        """A session frame: ((name, level) or None without auth, None) or (None, the 401/403),
        against the set in force now (the key was checked at the upgrade, maybe under another)."""
        if not self.enabled:
            return None, None
        found, refused = self.who(header)
        if refused is not None:
            return None, refused
        denied = self.permits(found, need)
        return (None, denied) if denied is not None else (found, None)

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
        return error("permission_denied", f"the API key {name!r} has the role {API_ROLES[level]}; "
                                          f"this needs {API_ROLES[need]} or higher",
                     role=API_ROLES[level], required_role=API_ROLES[need])
