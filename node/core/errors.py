"""Error results: every failure is `(http_status, {"error": {"code", "message", ...details}})`."""
from __future__ import annotations

STATUS = {
    "invalid_argument": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "job_not_found": 404,
    "not_found": 404,
    "attempt_mismatch": 409,
    "failed_precondition": 409,
    "unknown_queues": 409,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "request_too_large": 413,
    "unsupported_media_type": 415,
    "rejected": 422,
    "batch_rejected": 422,
    "overloaded": 429,
    "not_leader": 307,
    "no_leader": 503,
    "unavailable": 503,
    "internal": 500,
}


def error(code: str, message: str, **details) -> tuple[int, dict]:
    return STATUS[code], {"error": {"code": code, "message": message, **details}}


class ApiError(Exception):
    """Raised by request parsing (never inside apply) to answer without touching the state."""

    def __init__(self, code: str, message: str, **details):
        super().__init__(message)
        self.code, self.message, self.details = code, message, details

    @property
    def result(self) -> tuple[int, dict]:
        return error(self.code, self.message, **self.details)


def invalid(message: str) -> ApiError:
    return ApiError("invalid_argument", message)
