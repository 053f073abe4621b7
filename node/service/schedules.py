"""NodeService's schedules: put, delete, pause, trigger, and their reads (docs/api.md "Schedules")."""
from __future__ import annotations

from ..base import validate_schedule
from ..core.errors import error
from .job_ops import _new_id
from .reads import _page_limit


class Schedules:
    """Mixin of NodeService: schedules."""

    async def put_schedule(self, name, body, rid=None, who=None):
        return await self._run(validate_schedule.put, name, body, self.limits, self.stamp(),
                               self.slot(rid, who, "schedule_put", body, name), who)

    async def delete_schedule(self, name, query, rid=None, who=None):
        version = query.get("expect_version")
        return await self._run(validate_schedule.delete, name, version,
                               self.slot(rid, who, "schedule_delete", version, name), who)

    async def pause_schedule(self, name, paused: bool, body=None, rid=None, who=None):
        route = "schedule_pause" if paused else "schedule_resume"
        return await self._run(validate_schedule.pause, name, paused, self.slot(rid, who, route, body, name), who)

    async def trigger_schedule(self, name, body=None, rid=None, who=None):
        return await self._run(validate_schedule.trigger, name, _new_id,
                               self.slot(rid, who, "schedule_trigger", body, name), who)

    def schedules(self, query):
        limit = _page_limit(query)
        if limit is None:
            return error("invalid_argument", "limit must be an integer 1..100")
        with self.state.lock:
            page, nxt = self.state.machine.list_schedules(limit, query.get("cursor") or None)
        return 200, {"schedules": page, "next_cursor": nxt}

    def schedule(self, name):
        with self.state.lock:
            view = self.state.machine.schedule_view(name)
        if view is None:
            return error("not_found", f"no schedule named {name!r}", name=name)
        return 200, view
