"""Pool settings (stored in Redis, ``dq:{POOL}:config``) and client settings (environment)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import ConfigError

YEAR = 365 * 86400.0


class PoolConfig(BaseModel):
    """Pool-wide settings. Durations are seconds (fractions allowed). These defaults are also
    the defaults the Lua scripts use (``scripts.py`` generates their table from this class)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_queue_depth: int = Field(
        100_000, ge=1, le=1_000_000_000, description="queued tasks the pool accepts"
    )
    max_attempts: int = Field(3, ge=1, le=1000, description="attempts per task (default)")
    claim_ttl: float = Field(
        30.0, gt=0, le=YEAR, description="seconds a host has to claim an assignment"
    )
    lease_ttl: float = Field(
        60.0, gt=0, le=YEAR, description="seconds a run lease lasts between renewals"
    )
    host_timeout: float = Field(
        30.0, gt=0, le=YEAR, description="heartbeat age after which a host is dead"
    )
    retention: float = Field(
        7 * 86400.0, gt=0, le=10 * YEAR, description="seconds terminal tasks are kept"
    )
    idempotency_ttl: float = Field(
        86400.0, gt=0, le=10 * YEAR, description="seconds an idempotency key holds"
    )
    event_maxlen: int = Field(
        100_000, ge=100, le=100_000_000, description="approximate cap of the event stream"
    )
    quarantine_after: int = Field(
        3, ge=0, description="consecutive failed runs that quarantine a device (0 = never)"
    )
    queue_timeout: float = Field(
        0.0,
        ge=0,
        le=YEAR,
        description="seconds a task may wait queued before failing (0 = forever)",
    )
    reject_unmatchable: int = Field(
        0, ge=0, le=1, description="1: refuse submissions no registered device could run"
    )
    leader_ttl: float = Field(
        10.0, gt=0, le=3600, description="seconds a scheduler leader lease lasts"
    )

    @classmethod
    def keys(cls) -> list[str]:
        return list(cls.model_fields)

    @classmethod
    def parse_value(cls, key: str, value: str) -> int | float:
        """Validate one setting given as text; raises ConfigError naming the problem."""
        if key not in cls.model_fields:
            raise ConfigError(f"unknown setting {key!r}; known: {', '.join(cls.keys())}")
        try:
            cfg = cls.model_validate({key: value})
        except ValidationError as exc:
            first = exc.errors()[0]["msg"]
            raise ConfigError(f"bad value for {key}: {value!r} ({first})") from None
        parsed: int | float = getattr(cfg, key)
        return parsed

    @classmethod
    def lua_defaults(cls) -> str:
        items = ", ".join(f"{k} = {f.default!r}" for k, f in cls.model_fields.items())
        return "local DEFAULTS = {" + items + "}\n"


class Settings(BaseSettings):
    """Connection settings of a client process, from ``DEVICEQ_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="DEVICEQ_")

    redis_url: str = "redis://localhost:6379/0"
    pool: str = "default"
