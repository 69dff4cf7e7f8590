"""Pool settings (stored in Redis, ``dq:{POOL}:config``) and client settings (environment)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .attributes import check_prefer
from .errors import ConfigError
from .validation import check_retry_backoff as check_retry_backoff
from .validation import check_retry_on as check_retry_on
from .vocabulary import RETRY_KINDS

YEAR = 365 * 86400.0


def check_store_url(v: str) -> str:
    """'' or an artifact store URL: ``file:///ABSOLUTE/PATH`` or ``s3://BUCKET[/PREFIX]``."""
    ok = v == "" or (
        v.isprintable()
        and " " not in v
        and (
            (v.startswith("file:///") and ".." not in v.split("/"))
            or re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9._/-]*)?", v)
            is not None
        )
    )
    if not ok:
        raise ValueError("must be file:///ABSOLUTE/PATH or s3://BUCKET[/PREFIX] (or empty)")
    return v


class PoolConfig(BaseModel):
    """Pool-wide settings. Durations are seconds (fractions allowed). These defaults and bounds
    are also the ones the Lua scripts use (``scripts.py`` generates their
    ``setting`` function from this class): a value outside the bounds that reached the config
    hash some other way (a raw ``HSET``) is clamped by the scripts, never trusted."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_queue_depth: int = Field(
        100_000, ge=1, le=1_000_000_000, description="queued tasks the pool accepts"
    )
    max_attempts: int = Field(3, ge=1, le=1000, description="attempts per task (default)")
    max_handbacks: int = Field(
        10,
        ge=0,
        le=1000,
        description="times a task may be handed back (refused, drained) before it fails "
        "as rejected",
    )
    claim_ttl: float = Field(
        30.0, ge=1, le=YEAR, description="seconds a host has to claim an assignment"
    )
    max_preemptions_per_minute: int = Field(
        10,
        ge=0,
        le=10_000,
        description="running tasks the scheduler may preempt for urgent ones in any minute "
        "(0 = no preemption)",
    )
    max_preemptions_per_task: int = Field(
        3,
        ge=0,
        le=1000,
        description="times one task may be preempted; after that it is not preemptible",
    )

    lease_ttl: float = Field(
        60.0, ge=1, le=YEAR, description="seconds a run lease lasts between renewals"
    )
    host_timeout: float = Field(
        30.0, ge=1, le=YEAR, description="heartbeat age after which a host is dead"
    )
    retention: float = Field(
        7 * 86400.0, ge=1, le=10 * YEAR, description="seconds terminal tasks are kept"
    )
    idempotency_ttl: float = Field(
        86400.0, ge=1, le=10 * YEAR, description="seconds an idempotency key holds"
    )
    event_maxlen: int = Field(
        100_000, ge=100, le=100_000_000, description="approximate cap of the event stream"
    )
    log_maxlen: int = Field(
        10_000,
        ge=10,
        le=1_000_000,
        description="approximate cap, in chunks, of one attempt's live log stream "
        "(log:ID:ATTEMPT; a chunk is at most 64 KiB)",
    )
    log_max_bytes: int = Field(
        64 << 20,
        ge=65536,
        le=1 << 30,
        description="bytes of output one attempt streams to its live log at most; past it "
        "the live log says where it stops and the whole log (log.txt artifact) keeps the rest",
    )
    quarantine_after: int = Field(
        3,
        ge=0,
        le=1000,
        description="consecutive infrastructure failures (runner crash, timeout, a failure "
        "the runner marks as the device's) that quarantine a device (0 = never)",
    )
    max_quarantine_fraction: float = Field(
        0.25,
        ge=0,
        le=1,
        description="largest share of one driver type's devices automatic quarantine may "
        "take out; beyond it a warning is raised instead",
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
    aging_seconds: float = Field(
        300.0,
        ge=0,
        le=YEAR,
        description="a queued task's effective priority rises by one level (up to 9) every "
        "this many seconds it waits, so a low-priority task is never starved (0 = off)",
    )
    retry_on: str = Field(
        "infrastructure,lease_expired",
        description="failure kinds after which a task with attempts left is retried (csv of "
        f"{', '.join(RETRY_KINDS)}; or none); a task may set its own",
    )
    retry_backoff: str = Field(
        "none",
        description="delay before a retry: none (at once, on another device where one is free) "
        "| fixed:SECONDS | exponential:BASE:MAX (BASE doubled per failed attempt up to MAX, "
        "with jitter: between half and all of it); a task may set its own",
    )
    prefer: str = Field(
        "none",
        description="which matching device a task gets first, after its constraints: none | "
        "max:ATTRIBUTE (e.g. max:battery, the fullest) | min:ATTRIBUTE (e.g. min:temperature, "
        "the coolest) | least_used (the fewest runs in the last 24 h); in every strategy",
    )
    retry_elsewhere_wait: float = Field(
        60.0,
        ge=0,
        le=YEAR,
        description="a retry after a failure blamed on the device (infrastructure, "
        "runner_error, timeout, lease_expired) waits up to this many seconds for a matching "
        "device it did not fail on before it may take that device again; at once when that "
        "device is the pool's only match (0 = never wait)",
    )
    leader_ttl: float = Field(
        10.0, ge=1, le=3600, description="seconds a scheduler leader lease lasts"
    )
    gang_reserve_after: float = Field(
        60.0,
        ge=0,
        le=YEAR,
        description="a multi-device task that waited this many seconds without all its roles "
        "matching idle devices at once gets idle matching devices kept for it (0 = at once)",
    )
    gang_hold_seconds: float = Field(
        30.0,
        ge=0,
        le=YEAR,
        description="longest a multi-device task keeps idle devices while waiting for the rest "
        "(then they serve other tasks for gang_reserve_after before it may keep any again; "
        "0 = never keep devices)",
    )
    max_tasks_per_host: int = Field(
        0,
        ge=0,
        le=100_000,
        description="leases (assigned or running) the tasks may hold on one host's devices at "
        "once; a multi-device task's devices on the host count one each (0 = no limit)",
    )
    max_tasks_per_tenant_per_host: int = Field(
        0,
        ge=0,
        le=100_000,
        description="leases (assigned or running) one tenant's tasks may hold on one host's "
        "devices at once; tasks without a tenant are not counted (0 = no limit)",
    )
    durability: Literal["none", "aof", "replica"] = Field(
        "none",
        description="none | aof | replica: submissions and reports wait until the write is "
        "in the AOF (WAITAOF; WAIT for a replica before Redis 7.2) or on a replica",
    )
    durability_timeout: float = Field(
        1.0, ge=0.01, le=60, description="seconds a durable write waits for its confirmation"
    )

    artifact_store: str = Field(
        "",
        max_length=1024,
        description="where hosts keep the files tasks write into $DEVICEQ_ARTIFACTS_DIR: an "
        "fsspec URL, file:///PATH or s3://BUCKET/PREFIX ('' = each host's state folder, "
        "unless its --artifact-store says otherwise)",
    )
    artifact_retention: float = Field(
        0.0,
        ge=0,
        le=10 * YEAR,
        description="seconds a task's artifacts are kept in the store after its attempt "
        "ended (0 = keep); removed by deviceq artifacts prune",
    )

    @field_validator("retry_on")
    @classmethod
    def _retry_on(cls, v: str) -> str:
        return check_retry_on(v)

    @field_validator("retry_backoff")
    @classmethod
    def _retry_backoff(cls, v: str) -> str:
        return check_retry_backoff(v)

    @field_validator("prefer")
    @classmethod
    def _prefer(cls, v: str) -> str:
        return check_prefer(v)

    @field_validator("artifact_store")
    @classmethod
    def _artifact_store(cls, v: str) -> str:
        return check_store_url(v)

    @classmethod
    def keys(cls) -> list[str]:
        return list(cls.model_fields)

    @classmethod
    def parse_value(cls, key: str, value: str) -> int | float | str:
        """Validate one setting given as text; raises ConfigError naming the problem."""
        if key not in cls.model_fields:
            raise ConfigError(f"unknown setting {key!r}; known: {', '.join(cls.keys())}")
        try:
            cfg = cls.model_validate({key: value})
        except ValidationError as exc:
            first = exc.errors()[0]["msg"]
            raise ConfigError(f"bad value for {key}: {value!r} ({first})") from None
        parsed: int | float | str = getattr(cfg, key)
        return parsed

    @classmethod
    def bounds(cls, key: str) -> tuple[float, float]:
        """The inclusive (lowest, highest) value of a setting."""
        lo: float = float("-inf")
        hi: float = float("inf")
        for m in cls.model_fields[key].metadata:
            for attr, setter in (("ge", "lo"), ("gt", "lo"), ("le", "hi"), ("lt", "hi")):
                v: Any = getattr(m, attr, None)
                if v is not None:
                    if setter == "lo":
                        lo = float(v)
                    else:
                        hi = float(v)
        return lo, hi

    @classmethod
    def lua_defaults(cls) -> str:
        """The settings' defaults and bounds, prepended to every script as two functions:
        ``setting(name)`` (a numeric setting's default, lower and upper bound) and
        ``text_default(name)``. Functions, not tables: a script's text is compiled once, but
        its tables are built at every call, and four tables of the settings cost a call about
        30,000 instructions (twice what an ``EVALSHA`` of ``return 1`` costs in all; counted
        with callgrind), where a chain of comparisons costs a lookup a few hundred."""
        fields = cls.model_fields

        def num(v: float) -> str:
            return repr(v) if abs(v) != float("inf") else ("-" if v < 0 else "") + "math.huge"

        numeric = [k for k, f in fields.items() if isinstance(f.default, int | float)]
        texts = [k for k, f in fields.items() if isinstance(f.default, str)]
        lines = [
            "-- a numeric pool setting's default, lower and upper bound (nil: no such setting)",
            "local function setting(name)",
        ]
        for k in numeric:
            lo, hi = cls.bounds(k)
            default = fields[k].default
            lines.append(f"  if name == '{k}' then return {default!r}, {num(lo)}, {num(hi)} end")
        lines += ["end", "-- a text pool setting's default", "local function text_default(name)"]
        for k in texts:
            lines.append(f"  if name == '{k}' then return {fields[k].default!r} end")
        lines.append("end")
        return "\n".join(lines) + "\n"


class Settings(BaseSettings):
    """Connection settings of a client process, from ``DEVICEQ_*`` environment variables.

    ``redis_ca``, ``redis_cert`` and ``redis_key`` (``DEVICEQ_REDIS_CA``, ``DEVICEQ_REDIS_CERT``,
    ``DEVICEQ_REDIS_KEY``) are TLS files (PEM) for ``rediss://`` URLs: the CA bundle that
    verifies the server, and the client certificate and its unencrypted key for servers that
    require one. ``deviceq.core.connection.connect`` reads them for every client and daemon
    whose URL (or call) does not name them; an empty value counts as unset."""

    model_config = SettingsConfigDict(env_prefix="DEVICEQ_")

    redis_url: str = "redis://localhost:6379/0"
    pool: str = "default"
    redis_ca: str | None = None
    redis_cert: str | None = None
    redis_key: str | None = None
