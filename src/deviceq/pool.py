"""Operator actions on a pool: hosts, devices, settings, and the read-only views the
scheduler, `status` and `explain` are built on."""

from __future__ import annotations

import secrets
from typing import Any

from .config import PoolConfig
from .connection import PoolConnection
from .errors import NotFound
from .host import token_digest
from .models import Host, PooledDevice, validate_id


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
        ids = sorted(str(h) for h in self.redis.smembers(self.keys.hosts))
        now = self.server_time_ms()
        timeout_ms = self.config().host_timeout * 1000
        pipe = self.redis.pipeline(transaction=False)
        for h in ids:
            pipe.hmget(
                self.keys.host(h), "last_heartbeat", "draining", "stopping", "suspect",
                "session", "session_owner",
            )  # fmt: skip
            pipe.smembers(self.keys.host_devices(h))
        res = pipe.execute()
        out = []
        for i, h in enumerate(ids):
            hb, draining, stopping, suspect, session, owner = res[2 * i]
            hb_ms = int(hb or 0)
            out.append(
                Host(
                    host_id=h,
                    last_heartbeat=hb_ms,
                    draining=draining == "1",
                    stopping=stopping == "1",
                    suspect=bool(suspect),
                    alive=hb_ms > 0 and now - hb_ms <= timeout_ms,
                    session=session or None,
                    session_owner=owner or None,
                    devices=sorted(res[2 * i + 1]),
                )
            )
        return out

    def host(self, host_id: str) -> Host:
        validate_id(host_id, "host id")
        for h in self.hosts():
            if h.host_id == host_id:
                return h
        raise NotFound(f"no host {host_id} in pool {self.pool}")

    # -- devices -------------------------------------------------------------------------------
    def devices(self) -> list[PooledDevice]:
        ids = sorted(str(d) for d in self.redis.smembers(self.keys.devices))
        pipe = self.redis.pipeline(transaction=False)
        for d in ids:
            pipe.hgetall(self.keys.device(d))
        return [PooledDevice.from_hash(h) for h in pipe.execute() if h]

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
    def set_config(self, key: str, value: Any) -> int | float:
        """Validate and store one pool setting; returns the stored value."""
        parsed = PoolConfig.parse_value(key, str(value))
        self.redis.hset(self.keys.config, key, str(parsed))
        return parsed

    def get_config(self, key: str | None = None) -> dict[str, int | float]:
        cfg = self.config().model_dump()
        if key is None:
            return cfg
        PoolConfig.parse_value(key, str(cfg.get(key, "")))  # raises ConfigError if unknown
        return {key: cfg[key]}

    def expire(self, limit: int = 1000) -> dict[str, int]:
        """Run one bounded expiry batch (the scheduler does this every tick)."""
        requeued, failed, cancelled, unsched, more, trimmed = self._run("expire", [str(limit)])
        return {
            "requeued": int(requeued),
            "failed": int(failed),
            "cancelled": int(cancelled),
            "unschedulable": int(unsched),
            "more": int(more),
            "trimmed": int(trimmed),
        }

    # -- assignment commit ---------------------------------------------------------------------
    def commit(self, pairs: list[tuple[str, str]], fence: int | str = "") -> list[str]:
        """Commit proposed (task_id, device_id) pairs atomically, each re-validated.
        Returns per pair ``ok:LEASE_ID`` or ``err:REASON``. With ``fence`` (the scheduler's
        leader epoch) the whole batch is refused with Fenced unless that epoch still leads."""
        args: list[Any] = [str(fence), str(len(pairs))]
        for task_id, device_id in pairs:
            args += [validate_id(task_id, "task id"), validate_id(device_id, "device id")]
        return [str(x) for x in self._run("assign", args)]

    def dispatch(self, task_id: str, device_id: str) -> str:
        """Manual dispatch: bind a queued task to a named idle device through the same atomic
        commit as the scheduler. Returns the lease id; raises InvalidInput with the reason."""
        from .errors import InvalidInput

        res = self.commit([(task_id, device_id)])[0]
        if res.startswith("ok:"):
            return res[3:]
        raise InvalidInput(f"cannot dispatch {task_id} to {device_id}: {res[4:]}")
