"""Batch requests (docs/api.md "Batches"): checked here, before anything is proposed, into the
commands node/core/batches.py applies. A wrong field is 400 `invalid_argument` naming it
(`field`); a refused member is 422 `batch_rejected` listing them, as for an atomic enqueue.
"""
from __future__ import annotations

from ..core import ops
from ..core.batches import CALLBACKS
from ..core.errors import ApiError
from ..core.limits import Limits
from .validate import _Reject, canonical_uuid, check_job, enqueue_atomic, is_int, require_object

DEFAULT_TIMEOUT_MS = 3_600_000          # an open batch never closed is closed after an hour
MAX_TIMEOUT_MS = 30 * 86_400_000
BODY_KEYS = frozenset(("jobs", "callbacks", "open", "timeout_ms"))


def bad(field: str, message: str) -> ApiError:
    return ApiError("invalid_argument", f"{field}: {message}", field=field)


def batch_id_arg(value) -> str:
    bid = canonical_uuid(value)
    if bid is None:
        raise bad("batch_id", f"a batch id is a canonical UUID, got {value!r}")
    return bid


def _members(jobs, limits: Limits, now_ms: int, new_id, required: bool) -> tuple:
    """The member items, checked as an atomic enqueue's (refs and depends_on included); none
    when not `required` and not given."""
    if jobs is None and not required:
        return ()
    if not isinstance(jobs, list) or (not jobs and required):
        raise bad("jobs", "a list of EnqueueRequest objects" + (", at least one" if required else ""))
    if not jobs:
        return ()
    return tuple(enqueue_atomic({"jobs": jobs}, limits, now_ms, new_id)[3])


def _callbacks(value, limits: Limits, now_ms: int, new_id, batch_id: str) -> tuple:
    """((kind, item), ...): each an EnqueueRequest without `depends_on` or `ref`; its custom
    fields gain `batch_id`."""
    if value is None:
        return ()
    if not isinstance(value, dict) or set(value) - set(CALLBACKS):
        raise bad("callbacks", f"an object of at most {', '.join(CALLBACKS)}, each an EnqueueRequest")
    out = []
    for kind in CALLBACKS:
        job = value.get(kind)
        if job is None:
            continue
        where = f"callbacks.{kind}"
        if not isinstance(job, dict) or "depends_on" in job or "ref" in job:
            raise bad(where, "an EnqueueRequest object, without depends_on or ref")
        custom = job.get("custom")
        if custom is not None and not isinstance(custom, dict):
            raise bad(where, "custom must be an object")
        job = {**job, "custom": {**(custom or {}), "batch_id": batch_id}}
        try:
            out.append((kind, check_job(job, limits, now_ms, new_id)))
        except _Reject as r:
            raise ApiError("invalid_argument", f"{where}: job refused: {r.rejection['reason']}", field=where,
                           rejection=r.rejection)
    return tuple(out)


def open_batch(body, limits: Limits, now_ms: int, new_id, rid=None) -> tuple:
    """POST /v1/batches: a new batch (its id made here), its callbacks and first members."""
    require_object(body)
    extra = set(body) - BODY_KEYS
    if extra:
        raise bad(sorted(extra)[0], f"unknown field (a batch takes {', '.join(sorted(BODY_KEYS))})")
    is_open = body.get("open", False)
    if type(is_open) is not bool:
        raise bad("open", "true or false")
    timeout = body.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if not is_int(timeout) or not 1 <= timeout <= MAX_TIMEOUT_MS:
        raise bad("timeout_ms", f"an integer 1..{MAX_TIMEOUT_MS} (ms), got {timeout!r}")
    batch_id = new_id()
    callbacks = _callbacks(body.get("callbacks"), limits, now_ms, new_id, batch_id)
    items = _members(body.get("jobs"), limits, now_ms, new_id, required=False)
    return ops.batch_open(rid, batch_id, callbacks, not is_open, timeout, items)


def add(batch_id, body, limits: Limits, now_ms: int, new_id, rid=None) -> tuple:
    """POST /v1/batches/{id}/jobs: more members of an open batch, all or nothing."""
    bid = batch_id_arg(batch_id)
    require_object(body)
    return ops.batch_add(rid, bid, _members(body.get("jobs"), limits, now_ms, new_id, required=True))


def close(batch_id, rid=None) -> tuple:
    """POST /v1/batches/{id}/close."""
    return ops.batch_close(rid, batch_id_arg(batch_id))


def cancel(batch_id, rid=None, who=None) -> tuple:
    """DELETE /v1/batches/{id}: its members not started are removed, the batch closed."""
    return ops.batch_cancel(rid, batch_id_arg(batch_id), who)
