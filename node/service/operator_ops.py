"""NodeService's operator moves and configuration writes: requeue, dead letters, cancel, pause,
circuits, purge, queue delete, config and keys. Each command carries the caller's name for the
audit trail (docs/semantics.md "Operator moves and the audit trail")."""
from __future__ import annotations

from ..base import validate
from ..core.errors import ApiError


class OperatorOps:
    """Mixin of NodeService: operator moves."""

    def slot(self, rid, who, route: str, body, param=None):
        return validate.request_slot(who, rid, route, body, param)

    # Operator moves: each command carries the caller's name for the audit trail.
    async def requeue(self, body, rid=None, who=None):
        return await self._run(validate.requeue, body, self.slot(rid, who, "requeue", body), who)

    async def delete_dead_letters(self, body, rid=None, who=None):
        return await self._run(validate.delete_dead_letters, body, self.slot(rid, who, "dead_letters_delete", body), who)

    async def cancel(self, job_id, rid=None, who=None, cascade=None):
        return await self._run(validate.cancel, job_id, self.slot(rid, who, "cancel", cascade, job_id), who,
                               cascade)

    async def pause(self, queue, paused: bool, rid=None, body=None, who=None):
        route = "pause" if paused else "resume"
        return await self._run(validate.pause, queue, paused, self.limits,
                               self.slot(rid, who, route, body, queue), body, who)

    async def move_to_dead_letters(self, queue, body, rid=None, who=None):
        return await self._run(validate.move_to_dead_letters, queue, body, self.limits,
                               self.slot(rid, who, "dead_letter_move", body, queue), who)

    async def close_circuit(self, queue, body=None, rid=None, who=None):
        return await self._run(validate.close_circuit, queue, self.limits,
                               self.slot(rid, who, "circuit_close", body, queue), who)

    async def purge(self, queue, body=None, rid=None, who=None):
        return await self._run(validate.purge, queue, self.limits, self.slot(rid, who, "purge", body, queue), who)

    async def delete_queue(self, queue, rid=None, who=None):
        return await self._run(validate.delete_queue, queue, self.limits,
                               self.slot(rid, who, "queue_delete", None, queue), who)

    async def put_config(self, body, rid=None, who=None):
        return await self._run(validate.configure, body, self.slot(rid, who, "config", body), who)

    async def add_key(self, body, rid=None, who=None):
        return await self._run(validate.add_key, body, self.slot(rid, who, "key_add", body), who)

    async def remove_key(self, name, rid=None, who=None):
        return await self._run(validate.remove_key, name, self.slot(rid, who, "key_remove", None, name), who)

    async def _run(self, build, *args):
        try:
            cmd = build(*args)
        except ApiError as e:
            return e.result
        return await self.proposer.run(cmd)
