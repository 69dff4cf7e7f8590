"""Errors as the API answers them: one JSON shape, ``{"error": {"code", "message"}}``, and one
HTTP status per deviceq error code."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..core.errors import DeviceqError

STATUS = {
    "INVALID": 400,
    "CONFIG": 400,
    "UNMATCHABLE": 422,
    "AUTH": 401,
    "FORBIDDEN": 403,
    "NOT_FOUND": 404,
    "EXISTS": 409,
    "BUSY": 409,
    "DEVICE_OWNED": 409,
    "SESSION_ACTIVE": 409,
    "SUPERSEDED": 409,
    "FENCED": 409,
    "NOT_CONFIRMED": 409,
    "CORRUPT": 409,
    "TOO_LARGE": 413,
    "RATE_LIMITED": 429,
    "QUEUE_FULL": 503,
    "UNAVAILABLE": 503,
}
"""HTTP status of each error code (deviceq.core.errors codes plus the API's own)."""


def error(code: str, message: str, status: int | None = None) -> JSONResponse:
    """The API's error answer: one line of text, never a traceback or a secret."""
    return JSONResponse(
        {"error": {"code": code, "message": message.splitlines()[0] if message else code}},
        status_code=status or STATUS.get(code, 500),
    )


def from_exception(exc: DeviceqError) -> JSONResponse:
    """A deviceq error (a script's refusal, bad input) as the API's error answer (with
    Retry-After when the error names a wait)."""
    answer = error(exc.code, str(exc))
    retry_after = getattr(exc, "retry_after", None)
    if isinstance(retry_after, int):
        answer.headers["retry-after"] = str(retry_after)
    return answer
