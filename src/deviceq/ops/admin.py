"""`PoolAdmin`: the operator's API on a pool — hosts (add, rotate, remove, drain), devices
(list, quarantine), settings, manual dispatch — and the read-only views `status` and `explain`
are built on. What only the scheduler does (commit, expiry, leadership) is
`deviceq.scheduler.client.SchedulerClient`."""

from __future__ import annotations

import secrets
from typing import Any

from ..core import fleet
from ..core.config import PoolConfig
from ..core.connection import PoolConnection
from ..core.errors import InvalidInput, NotFound
from ..core.models import Host, PooledDevice, validate_id
from ..host.client import token_digest


class PoolAdmin(PoolConnection):
    """Hosts, devices and settings of one pool."""

    # -- hosts ---------------------------------------------------------------------------------
    def add_host(self, host_id: str) -> str:
        """Create a host and return its fresh secret token (shown once; only a digest is
        stored). Raises AlreadyExists."""
        validate_id(host_id, "host id")
        token = secrets.token_urlsafe(32)
        self._run("host_add", [host_id, token_digest(token), "add"])
        return token

    def rotate_token(self, host_id: str) -> str:
        """Replace a host's token; the old one stops working at once."""
        validate_id(host_id, "host id")
        token = secrets.token_urlsafe(32)
        self._run("host_add", [host_id, token_digest(token), "rotate"])
        return token

    def remove_host(self, host_id: str) -> int:
        """Delete a host and its devices (refused with Busy while one runs a task)."""
        return int(self._run("host_remove", [validate_id(host_id, "host id")]))

    def drain(self, host_id: str, draining: bool = True) -> str:
        """No new assignments to the host (``draining=False`` resumes them)."""
        return str(
            self._run(
                "host_drain",
                [validate_id(host_id, "host id"), "1" if draining else "0", "operator", "", ""],
            )
        )

    def hosts(self) -> list[Host]:
        """Every host of the pool with its liveness, flags and session (sorted by id)."""
        return fleet.read_hosts(self)

    def host(self, host_id: str) -> Host:
        validate_id(host_id, "host id")
        for h in self.hosts():
            if h.host_id == host_id:
                return h
        raise NotFound(f"no host {host_id} in pool {self.pool}")

    # -- devices -------------------------------------------------------------------------------
    def devices(self) -> list[PooledDevice]:
        """Every device of the pool (sorted by id)."""
        return fleet.read_devices(self)

    def device(self, device_id: str) -> PooledDevice:
        h: dict[str, str] = self.redis.hgetall(  # type: ignore[assignment]
            self.keys.device(validate_id(device_id, "device id"))
        )
        if not h:
            raise NotFound(f"no device {device_id} in pool {self.pool}")
        return PooledDevice.from_hash(h)

    def quarantine(self, device_id: str, quarantined: bool = True) -> str:
        """Take a device out of assignment (or release it and reset its failure count)."""
        return str(
            self._run(
                "device_quarantine",
                [validate_id(device_id, "device id"), "1" if quarantined else "0"],
            )
        )

    # -- settings and maintenance --------------------------------------------------------------
    def set_config(self, key: str, value: Any) -> int | float | str:
        """Validate and store one pool setting; returns the stored value."""
        parsed = PoolConfig.parse_value(key, str(value))
        self.redis.hset(self.keys.config, key, str(parsed))
        return parsed

    def stored_settings(self) -> set[str]:
        """The settings this pool has set (the others are at their defaults)."""
        return {k for k in self.redis.hgetall(self.keys.config) if k in PoolConfig.model_fields}

    def get_config(self, key: str | None = None) -> dict[str, int | float | str]:
        cfg = self.config().model_dump()
        if key is None:
            return cfg
        PoolConfig.parse_value(key, str(cfg.get(key, "")))  # raises ConfigError if unknown
        return {key: cfg[key]}

    def dispatch(self, task_id: str, device_id: str) -> str:
        """Manual dispatch: bind a queued task to a named idle device through the same atomic
        commit as the scheduler. Returns the lease id; raises InvalidInput with the reason."""
        res = str(
            self._run(
                "assign",
                ["", "1", validate_id(task_id, "task id"), validate_id(device_id, "device id")],
            )[0]
        )
        if res.startswith("ok:"):
            return res[3:]
        raise InvalidInput(f"cannot dispatch {task_id} to {device_id}: {res[4:]}")
