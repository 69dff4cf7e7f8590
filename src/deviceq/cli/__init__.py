"""The ``deviceq`` command line. Each ``*_cmds`` module adds its commands to the groups of
``app``; importing them here registers them all."""

from __future__ import annotations

import importlib

from . import acl_cmds  # noqa: F401  (registers ``deviceq acl``)
from . import api_cmds as _api_cmds  # noqa: F401  (``deviceq api``, ``--api-url``)
from . import completion_cmds as _completion_cmds  # noqa: F401  (``deviceq completion``)
from . import dashboard_cmds as _dashboard_cmds  # noqa: F401  (``deviceq dashboard``)
from . import dashboard_user_cmds as _dashboard_user_cmds  # noqa: F401  (``dashboard user``)
from . import verify_cmds as _verify_cmds  # noqa: F401  (registers `deviceq verify`)
from .app import main

for _module in (
    "submit_cmds",
    "task_cmds",
    "host_cmds",
    "host_run_cmds",
    "device_cmds",
    "config_cmds",
    "workflow_cmds",
    "status_cmds",
    "events_cmds",
    "scheduler_cmds",
    "reserve_cmds",
    "tenant_cmds",
    "gate_cmds",
    "limit_cmds",
    "demo_cmds",
    "logs_cmds",
    "artifact_cmds",
    "webhook_cmds",
    "schedule_cmds",
    "pause_cmds",
    "priority_cmds",
    "suite_cmds",
    "priority_class_cmds",
):
    try:
        importlib.import_module(f"{__name__}.{_module}")
    except ModuleNotFoundError as exc:  # a module not written yet
        if exc.name != f"{__name__}.{_module}":
            raise

__all__ = ["main"]
