"""NodeService's part that follows the configuration in force (docs/semantics.md "Configuration
is replicated state"): the key set auth checks, the hooks of the layers above, the log line when
the node's TOML differs, and the first leader's seeding of version 1 and of the TOML's schedules."""
from __future__ import annotations

import asyncio
import logging

from ..base import validate
from ..base.auth import Auth
from ..core import ops
from ..core.errors import error
from ..replication import fault_hooks

log = logging.getLogger("raftq.node")
SEED_RETRY_S = 0.05


class ConfigFollow:
    """Mixin of NodeService: the configuration in force as this node applied it."""

    def _init_config(self):
        """auth follows the keys in force (the TOML's until version 1); `config_hooks` are called
        (on whichever thread saw the change) with the new Limits, e.g. the HTTP app's body bound."""
        settings = self.settings
        self.auth = Auth(settings.api_keys)
        self.seeded = False
        self.config_hooks: list = []
        self._config_seen = (None, -1)
        self._toml_logged = -1
        self.toml_keys = {k["name"]: (validate.key_sha256(k["key"]), k["role"]) for k in settings.api_keys or ()}
        self.seeder: asyncio.Task | None = None
        self.schedule_seeder: asyncio.Task | None = None
        self.config_watch: asyncio.Task | None = None
        self.follow_config()
        self.state.after_restore = self.follow_config

    @property
    def limits(self):
        """The configuration in force as this node has applied it (never the TOML after
        version 1): what validation, server-info and the queue views use."""
        return self.state.machine.limits

    def is_seeded(self) -> bool:
        if not self.seeded and self.state.machine.config_version >= 1:
            self.seeded = True
        return self.seeded

    def follow_config(self) -> None:
        """Follow a change of the configuration in force (a config or key command applied, or
        a snapshot restored): the key set for auth, the hooks, a log line when the node's TOML
        differs from it (once per version). Cheap when nothing changed; thread-safe enough (the
        tick thread and the loop may both call it; each does the same)."""
        m = self.state.machine
        seen = (m.limits, m.config_version)
        if seen == self._config_seen:
            return
        self._config_seen = seen
        if m.config_version >= 1:
            self.seeded = True
            self.auth.load((name, rec[0], rec[1]) for name, rec in m.keys.items())
        for hook in self.config_hooks:
            try:
                hook(m.limits)
            except Exception:                       # pragma: no cover
                log.exception("config hook failed")
        if m.config_version >= 1 and self._toml_logged != m.config_version:
            self._toml_logged = m.config_version
            differs = self.toml_differences()
            if differs:
                log.warning("this node's TOML differs from the cluster's configuration in force (version %d): %s; "
                            "the node follows the configuration in force (raftq config diff FILE shows it, "
                            "raftq config apply FILE changes it)", m.config_version, ", ".join(differs[:10])
                            + (f" and {len(differs) - 10} more" if len(differs) > 10 else ""))

    def toml_differences(self) -> list[str]:
        """The keys where this node's TOML differs from the configuration in force (after
        version 1; before it the TOML is what is in force)."""
        from ..core.limits import diff_docs
        m = self.state.machine
        if m.config_version < 1:
            return []
        key = (m.limits, m.config_version)
        cached = getattr(self, "_toml_diff", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        out = [k for k, _, _ in diff_docs(m.limits.doc, self.settings.limits.doc)]
        in_force = {name: (rec[0], rec[1]) for name, rec in m.keys.items()}
        for name in sorted(set(in_force) | set(self.toml_keys)):
            if in_force.get(name) != self.toml_keys.get(name):
                out.append(f"auth.api_keys[{name}]")
        self._toml_diff = (key, out)
        return out

    async def _watch_config(self):
        while not self.stopping:
            try:
                self.follow_config()
            except Exception:                       # pragma: no cover
                log.exception("config watch failed")
            await asyncio.sleep(0.2)

    async def _seed(self):
        """The first leader of a new cluster (or of one upgraded from 0.1.0) proposes version 1
        from its TOML; two leaders racing are decided by expect_version 0 at apply."""
        while not self.stopping and not self.is_seeded():
            held = self.settings.testing.hold_seed and fault_hooks.seed_held(self.settings.data_dir)
            if self.replica.is_leader() and not held:
                status, body = await self.proposer.run(validate.seed(self.settings.limits, self.settings.api_keys))
                if status == 200:
                    log.info("configuration version %d seeded from this node's TOML", body["version"])
                    self.follow_config()
                    continue
            await asyncio.sleep(SEED_RETRY_S)

    async def _seed_schedules(self):
        """The TOML's [[schedules]], proposed by a leader once the configuration is seeded until
        the cluster holds the mark that they were applied (once per cluster: schedules.seed_schedules)."""
        while not self.stopping and self.settings.schedules and not self.state.machine.schedules_seeded:
            if self.replica.is_leader() and self.is_seeded():
                status, body = await self.proposer.run(ops.schedule_seed(self.settings.schedules), internal=True)
                if status == 200:
                    if body["created"]:
                        log.info("schedules seeded from this node's TOML: %s", ", ".join(body["created"]))
                    continue
            await asyncio.sleep(SEED_RETRY_S)

    def not_seeded(self):
        return error("unavailable", "the cluster's configuration is being seeded (a new leader of a new cluster); "
                     "retry in a moment", applied=False)
