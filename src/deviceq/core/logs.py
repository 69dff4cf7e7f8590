"""Structured log lines for the daemons: ``key=value`` text or one JSON object per line.
Every line about a task carries its task id, lease, host and device fields."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from typing import Any

_FORMAT = {"value": "text"}


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        if _FORMAT["value"] == "json":
            data = {
                # ISO 8601 with the UTC offset, e.g. 2026-12-01T02:50:20.540+00:00
                "ts": datetime.fromtimestamp(record.created)
                .astimezone()
                .isoformat(timespec="milliseconds"),
                "level": record.levelname.lower(),
                "logger": record.name,
                "msg": record.getMessage(),
                **fields,
            }
            if record.exc_info:
                data["exc"] = self.formatException(record.exc_info)
            return json.dumps(data, default=str)
        ts = self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}"
        parts = [ts, record.levelname.lower(), record.name, _kv("msg", record.getMessage())]
        parts += [_kv(k, v) for k, v in fields.items() if v is not None]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _kv(key: str, value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' ="'):
        text = json.dumps(text)
    return f"{key}={text}"


def configure(fmt: str = "text", level: int | str = logging.INFO) -> None:
    """Send deviceq's logs to stderr as ``text`` (key=value) or ``json`` lines, at ``level``
    (``logging.INFO`` or a name such as ``"DEBUG"``)."""
    _FORMAT["value"] = fmt
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    root = logging.getLogger("deviceq")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def log(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    """Log ``msg`` with structured fields, e.g. ``log(lg, INFO, "claimed", task=..., lease=...)``.
    Never pass secrets (tokens) as fields."""
    if logger.isEnabledFor(level):
        logger.log(level, msg, extra={"fields": fields})
