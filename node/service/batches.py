"""NodeService's batches: open, add, close, and the status read (docs/api.md "Batches")."""
from __future__ import annotations

from ..base import validate_batch
from ..core.errors import ApiError, error
from .job_ops import _new_id


class Batches:
    """Mixin of NodeService: batches."""

    async def open_batch(self, body, rid=None, who=None):
        return await self._run(validate_batch.open_batch, body, self.limits, self.stamp(), _new_id,
                               self.slot(rid, who, "batch_open", body))

    async def add_to_batch(self, batch_id, body, rid=None, who=None):
        return await self._run(validate_batch.add, batch_id, body, self.limits, self.stamp(), _new_id,
                               self.slot(rid, who, "batch_add", body, batch_id))

    async def close_batch(self, batch_id, body=None, rid=None, who=None):
        return await self._run(validate_batch.close, batch_id, self.slot(rid, who, "batch_close", body, batch_id))

    async def cancel_batch(self, batch_id, rid=None, who=None):
        return await self._run(validate_batch.cancel, batch_id, self.slot(rid, who, "batch_cancel", None, batch_id),
                               who)

    def batch(self, batch_id):
        try:
            bid = validate_batch.batch_id_arg(batch_id)
        except ApiError as e:
            return e.result
        with self.state.lock:
            view = self.state.machine.batch_view(bid)
        if view is None:
            return error("not_found", f"no batch {bid} (never made, or finished more than an hour ago)",
                         batch_id=bid)
        return 200, view
