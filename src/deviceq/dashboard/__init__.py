"""``deviceq dashboard``: a web view of one pool (fleet, queue, tasks, events) with live
updates over Server-Sent Events, and operator actions behind a token (see ``app``)."""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
