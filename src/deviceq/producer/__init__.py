"""The producer role: submit, inspect, cancel and wait for tasks (`interface.Producer`), over
either transport —
`client.Client` straight to Redis, `http_client.ApiClient` through the HTTP service
``deviceq api`` (``Client("https://...", token=...)`` makes one) — with the submission's
checks and encoding (`submission`) and the task filter (`task_filter`).

The names are imported on first use: ``deviceq.producer.http_client`` stays free of the Redis
client's imports."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "FIND_MAX_SCAN": ".task_filter",
    "FIND_PAGE": ".task_filter",
    "SUBMIT_CHUNK": ".client",
    "ApiClient": ".http_client",
    "ApiError": "..core.http",
    "Client": ".client",
    "Producer": ".interface",
    "FindResult": ".task_filter",
    "TaskFilter": ".task_filter",
    "api_url_of": ".client",
    "new_task_id": ".submission",
    "not_before_of": ".submission",
    "spec_from": ".submission",
}
"""Each name -> the module of this package it is defined in."""

if TYPE_CHECKING:
    from ..core.http import ApiError
    from .client import SUBMIT_CHUNK, Client, api_url_of
    from .http_client import ApiClient
    from .interface import Producer
    from .submission import new_task_id, not_before_of, spec_from
    from .task_filter import FIND_MAX_SCAN, FIND_PAGE, FindResult, TaskFilter


def __getattr__(name: str) -> Any:
    """A name of the package imported on first use, then kept."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "FIND_MAX_SCAN",
    "FIND_PAGE",
    "SUBMIT_CHUNK",
    "ApiClient",
    "ApiError",
    "Client",
    "FindResult",
    "Producer",
    "TaskFilter",
    "api_url_of",
    "new_task_id",
    "not_before_of",
    "spec_from",
]
