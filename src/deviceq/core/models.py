"""Typed models of deviceq (task specs, tasks, devices, hosts, workflows, assignments); the
validation of ids, tags and goals they apply is in `validation`."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from . import validation
from .bounds import MAX_ATTEMPTS, MAX_PRIORITY, MAX_QUEUE_TIMEOUT
from .errors import InvalidInput
from .task_record import attempt_values, is_multi_device, task_values
from .validation import (
    ID_RE,
    _shown,
    check_task_timeout,
    validate_goal,
    validate_id,
    validate_tag_list,
    validate_tags,
)
from .vocabulary import FailureKind, TaskStatus
from .where import compiled_of, where_texts

M = TypeVar("M", bound=BaseModel)


def _named(what: str) -> Any:
    # before pydantic's own str validation: in lax mode it would turn b"x" into "x"
    return BeforeValidator(lambda v: validate_id(v, what))


def _opt_named(what: str) -> Any:
    return BeforeValidator(lambda v: None if v in (None, "") else validate_id(v, what))


Tags = Annotated[tuple[str, ...], BeforeValidator(validate_tag_list)]


def _not_bool(v: Any) -> Any:
    """A number field given ``True``/``False``: refused (Python would take it as 1/0)."""
    if isinstance(v, bool):
        raise InvalidInput(f"must be a number, not {v!r}")
    return v


_NOT_BOOL = BeforeValidator(_not_bool)
"""Tags: a list/tuple/set of tags, validated, deduplicated, sorted (a bare str is refused)."""
DriverType = Annotated[str, _named("driver_type")]
OptDriverType = Annotated[str | None, _opt_named("driver_type")]
Goal = Annotated[str, BeforeValidator(validate_goal)]


class DeviceState(StrEnum):
    idle = "idle"
    busy = "busy"
    offline = "offline"


class Constraints(BaseModel):
    """What a device must offer: its ``driver_type`` (if given) and every tag in ``tags``."""

    model_config = ConfigDict(frozen=True)

    driver_type: OptDriverType = None
    tags: Tags = ()
    where: tuple[str, ...] = ()  # canonical --where texts (deviceq.core.where), and-ed

    def signature(
        self, priority: int = 0, tenant: str | None = None, pin: str | None = None
    ) -> str:
        """Bucket id of the queued index: tasks with equal constraints (--where included),
        priority, tenant and pin (the one device they run on) share it (``signature`` in
        lua/lib/constraints.lua)."""
        raw = f"{self.driver_type or ''}|{','.join(self.tags)}|{priority}"
        if tenant:
            raw += f"|{tenant}"
        if self.where:
            raw += f"|w:{compiled_of(self.where)}"
        if pin:
            raw += f"|@{pin}"
        return hashlib.sha1(raw.encode()).hexdigest()[:16]

    def matches(self, driver_type: str, tags: Iterable[str]) -> bool:
        """True when a device of ``driver_type`` with ``tags`` satisfies these constraints
        (see `satisfies`)."""
        return satisfies(self.driver_type, self.tags, driver_type, tags)


def satisfies(
    task_driver: str | None,
    task_tags: Iterable[str],
    device_driver: str,
    device_tags: Iterable[str],
) -> bool:
    """THE constraint rule in Python: a device satisfies a task when the task names no driver
    type or the device's, and the device has every tag the task requires. ``satisfies`` in
    ``lua/lib/constraints.lua`` is the rule the scripts enforce (the truth); this mirror is tested
    against it on random inputs (tests/scheduler/test_constraints.py)."""
    if task_driver and task_driver != device_driver:
        return False
    have = device_tags if isinstance(device_tags, set | frozenset) else set(device_tags)
    return all(t in have for t in task_tags)


MAX_ROLES = 8


class Role(BaseModel):
    """One role of a multi-device task: the device it needs (and, once placed, where it runs
    and how its part is doing: ``device_id``, ``host_id``, ``status``)."""

    model_config = ConfigDict(extra="forbid")

    driver_type: OptDriverType = None
    tags: Tags = ()
    # --where expressions its device's attributes must satisfy (canonical, sorted)
    where: Annotated[tuple[str, ...], BeforeValidator(where_texts)] = ()
    device_id: str | None = None
    host_id: str | None = None
    status: str | None = None


def _role_name(value: object) -> str:
    if not isinstance(value, str) or len(value) > 32 or not ID_RE.fullmatch(value):
        raise InvalidInput(
            f"invalid role name {_shown(value)}: use 1-32 characters from A-Z a-z 0-9 . _ - "
            "starting with a letter or digit"
        )
    return value


def encode_roles(roles: dict[str, Role]) -> str:
    """The roles as submit.lua takes them: ``NAME=DRIVER:TAGS`` joined by ``;`` (first = leader)."""
    return ";".join(f"{n}={r.driver_type or ''}:{','.join(r.tags)}" for n, r in roles.items())


def encode_role_where(roles: dict[str, Role]) -> str | None:
    """The roles' --where clauses as submit.lua takes them (``role_where``): a JSON object of
    role name -> compiled clauses (`deviceq.core.where.compile_all`), None when no role has
    any."""
    import json

    out = {n: compiled_of(r.where) for n, r in roles.items() if r.where}
    return json.dumps(out, separators=(",", ":"), sort_keys=True) if out else None


def decode_role_where(text: str | None) -> dict[str, tuple[str, ...]]:
    """Role name -> its canonical --where texts, from a stored ``role_where``."""
    import json

    from .where import decompile

    try:
        raw = json.loads(text or "{}")
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(n): tuple(str(c) for c in decompile(str(v))) for n, v in raw.items()}


def spec_where_texts(body: Any) -> list[str]:
    """The --where texts of a raw submission (a mapping: its ``where`` and each role's), for
    warnings; what is not text is left out (the submission itself was validated)."""
    if not isinstance(body, Mapping):
        return []
    out: list[str] = []
    for part in (body, *((body.get("roles") or {}).values()
                         if isinstance(body.get("roles"), Mapping) else ())):  # fmt: skip
        if isinstance(part, str):  # a role as DRIVER[:TAGS] where EXPR
            out += _role_string(part)[2]
            continue
        w = part.get("where") if isinstance(part, Mapping) else None
        out += [w] if isinstance(w, str) else [x for x in (w or ()) if isinstance(x, str)]
    return out


def _role_string(spec: str) -> tuple[str, str, list[str]]:
    """A role as the command line writes it, ``DRIVER[:TAG,TAG][ where EXPR[ where EXPR]]``:
    its driver type, tags csv and --where expressions."""
    head, *where = spec.split(" where ")
    driver, _, tags = head.strip().partition(":")
    return driver, tags, [w.strip() for w in where]


def decode_roles(
    spec: str | None, placement: str | None = None, role_where: str | None = None
) -> dict[str, Role] | None:
    """The roles of a stored task (``roles``: its constraints; ``peers``: where each role was
    placed, ``NAME=DEVICE@HOST`` joined by ``;``; ``role_where``: their --where clauses), or
    None for a single-device task."""
    out: dict[str, Role] = {}
    wheres = decode_role_where(role_where) if role_where else {}
    for entry in filter(None, (spec or "").split(";")):
        name, _, rest = entry.partition("=")
        driver, _, tags = rest.partition(":")
        out[name] = trusted_model(
            Role,
            {"driver_type": driver or None, "tags": tuple(filter(None, tags.split(","))),
             "where": wheres.get(name, ()), "device_id": None, "host_id": None, "status": None},
        )  # fmt: skip
    for entry in filter(None, (placement or "").split(";")):
        name, _, where = entry.partition("=")
        device, _, host = where.partition("@")
        role = out.get(name) or trusted_model(
            Role, {"driver_type": None, "tags": (), "where": (), "device_id": None,
                   "host_id": None, "status": None}
        )  # fmt: skip
        role.__dict__.update(device_id=device or None, host_id=host or None)
        out[name] = role
    return out or None


def check_roles(v: Any) -> Any:
    """``roles`` of a submission: 1-8 named roles, each a `Role` or a mapping with
    ``driver_type`` and ``tags`` (or a ``DRIVER[:TAG,TAG]`` string, as on the command line)."""
    if v is None:
        return None
    if not isinstance(v, dict) or not v:
        raise InvalidInput("roles must be a non-empty mapping of role name -> constraints")
    if len(v) > MAX_ROLES:
        raise InvalidInput(f"a task has at most {MAX_ROLES} roles, not {len(v)}")
    out: dict[str, Role] = {}
    for name, spec in v.items():
        if isinstance(spec, str):
            driver, tags, where = _role_string(spec)
            spec = {"driver_type": driver or None, "tags": [t for t in tags.split(",") if t],
                    "where": where}  # fmt: skip
        role = spec if isinstance(spec, Role) else Role.model_validate(spec)
        if role.device_id or role.host_id or role.status:
            raise InvalidInput(f"role {name}: give only driver_type, tags and where")
        out[_role_name(name)] = role
    return out


class TaskSpec(BaseModel):
    """A submission: a ``goal`` or a ``workflow`` name, with constraints and options."""

    model_config = ConfigDict(extra="forbid")

    goal: Goal | None = None
    workflow: Annotated[str, _named("workflow name")] | None = None
    driver_type: OptDriverType = None
    tags: Tags = ()
    priority: Annotated[int, _NOT_BOOL] = Field(0, ge=0, le=MAX_PRIORITY)
    max_attempts: Annotated[int | None, _NOT_BOOL] = Field(None, ge=1, le=MAX_ATTEMPTS)
    idempotency_key: Annotated[str, _named("idempotency key")] | None = None
    queue_timeout: Annotated[float | None, _NOT_BOOL] = Field(
        None, gt=0, le=MAX_QUEUE_TIMEOUT, allow_inf_nan=False
    )
    timeout: Annotated[float | None, BeforeValidator(check_task_timeout)] = None
    reject_unmatched: bool | None = None
    retry_on: str | None = None
    retry_backoff: str | None = None
    tenant: Annotated[str, _named("tenant")] | None = None
    # a priority class (deviceq.core.priority_classes): the task gets its priority, and may
    # preempt or be preempted as the class says
    priority_class: Annotated[str, _named("priority class")] | None = None
    roles: Annotated[dict[str, Role] | None, BeforeValidator(check_roles)] = None
    # a Unix time (seconds): queued, but not assigned before then (submit.lua checks it is at
    # most a year ahead by the server's clock)
    not_before: Annotated[float | None, _NOT_BOOL] = Field(None, ge=0, le=1e13, allow_inf_nan=False)
    retry_of: Annotated[str, _named("task id")] | None = None  # the task this one runs again
    by: Annotated[str, _named("submitter")] | None = None  # who submitted it (recorded)
    # the one device it may run on: it waits for it (a bucket of its own), never runs elsewhere
    pin: Annotated[str, _named("device id")] | None = None
    # --where expressions over the device's attributes (and-ed; canonical, sorted)
    where: Annotated[tuple[str, ...], BeforeValidator(where_texts)] = ()
    # its list of test ids (a suite's shard): stored with it (task:ID:tests), returned with its
    # claim and written by the host into the file named by $DEVICEQ_TESTS_FILE (Task.tests_file)
    tests: Annotated[tuple[str, ...] | None, BeforeValidator(validation.check_test_list)] = None

    @field_validator("retry_on", mode="before")
    @classmethod
    def _retry_on(cls, v: Any) -> Any:
        if isinstance(v, list | tuple | set | frozenset):  # kinds as a list: a csv
            v = ",".join(sorted(str(x) for x in v)) or "none"
        return v if v is None else validation.check_retry_on(v) if isinstance(v, str) else v

    @field_validator("retry_backoff")
    @classmethod
    def _retry_backoff(cls, v: str | None) -> str | None:
        return v if v is None else validation.check_retry_backoff(v)

    @model_validator(mode="after")
    def _one_of(self) -> TaskSpec:
        if (self.goal is None) == (self.workflow is None):
            raise InvalidInput("give exactly one of a goal or a workflow name")
        if self.roles is not None and self.pin is not None:
            raise InvalidInput("a task with roles cannot be pinned to one device")
        if self.roles is not None and self.where:
            raise InvalidInput("a task with roles cannot have --where expressions of its own")
        if self.roles is not None and self.timeout is not None:
            raise InvalidInput("a task with roles cannot have a timeout of its own")
        if self.roles is not None and self.tests is not None:
            raise InvalidInput("a task with roles cannot have a list of tests")
        if self.roles is not None and (self.driver_type or self.tags or self.tenant):
            raise InvalidInput(
                "a task with roles has no driver_type, tags or tenant of its own: "
                "give the constraints per role"
            )
        return self

    @property
    def constraints(self) -> Constraints:
        return Constraints(driver_type=self.driver_type, tags=self.tags, where=self.where)

    def all_where(self) -> tuple[str, ...]:
        """Its --where texts and its roles' (for warnings about unknown attributes)."""
        return self.where + tuple(w for r in (self.roles or {}).values() for w in r.where)


class Attempt(BaseModel):
    """One bounded attempt of a task (its lease), kept for audit, expired ones included."""

    attempt: int
    lease_id: str
    host_id: str
    device_id: str
    assigned_at: int
    dispatched_at: int | None = None
    ended_at: int | None = None
    outcome: str = "active"
    failure_kind: str | None = None
    error: str | None = None
    expired_in: str | None = None
    retry: str | None = None
    eligible_at: int | None = None
    preempted_by: str | None = None  # outcome preempted: the task that took its device


def _opt_int(v: Any) -> int | None:
    return None if v in (None, "") else int(v)


def trusted_model(cls: type[M], values: dict[str, Any]) -> M:
    """A model instance from complete, already typed ``values`` without running pydantic
    (what ``model_construct`` does, minus its per-field overhead). Only for values that
    deviceq itself validated and stored."""
    m = cls.__new__(cls)
    object.__setattr__(m, "__dict__", values)
    object.__setattr__(m, "__pydantic_fields_set__", set(values))
    object.__setattr__(m, "__pydantic_extra__", None)
    object.__setattr__(m, "__pydantic_private__", None)
    return m


def _attempts(raw: list[str] | None, dispatched_at: int | None) -> list[Attempt]:
    return [Attempt.model_validate(a) for a in attempt_values(raw, dispatched_at)]


class ScheduledTask(BaseModel):
    """A submitted unit of work as stored in ``dq:{POOL}:task:ID``. Times are ms since epoch."""

    id: str
    status: TaskStatus
    kind: str
    goal: str | None = None
    workflow: str | None = None
    driver_type: str | None = None
    tags: tuple[str, ...] = ()
    priority: int = 0
    attempt: int = 0
    max_attempts: int = 1
    host_id: str | None = None
    device_id: str | None = None
    lease_id: str | None = None
    lease_expires_at: int | None = None
    failure_kind: FailureKind | None = None
    error: str | None = None
    result: str | None = None
    cancel_requested: bool = False
    handbacks: int = 0
    session: str | None = None
    avoid_devices: tuple[str, ...] = ()
    avoid_hosts: tuple[str, ...] = ()
    idempotency_key: str | None = None
    queue_deadline: int | None = None
    timeout: float | None = None  # seconds a run may take (the host's --task-timeout caps it)
    retry_on: str | None = None
    retry_backoff: str | None = None
    eligible_at: int | None = None
    tenant: str | None = None
    priority_class: str | None = None  # its priority class (deviceq.core.priority_classes)
    # the task that preempted its latest preempted run (or is preempting its run now)
    preempted_by: str | None = None
    preemptions: int = 0  # times it was preempted (max_preemptions_per_task)
    preempting: str | None = None  # the task whose run it preempted, until it gets the device
    retry_of: str | None = None  # submitted by `Client.retry` of this task
    rerun_by: str | None = None  # the latest task `Client.retry` submitted for this one
    submitted_by: str | None = None  # who submitted it, when recorded (a dashboard user)
    # how far the current (or last) attempt is, as its runner said: {fraction, text, at}
    progress: dict[str, Any] | None = None
    # the W3C trace context of its submission (deviceq.core.tracing), when it was traced
    traceparent: str | None = None
    where: tuple[str, ...] = ()  # its --where expressions (canonical)
    # a multi-device task: its roles (constraints, and where each runs once placed); for a
    # part (task ``GANG.ROLE``): its ``gang`` and ``role``; the ``leader`` part also gets every
    # role's placement in ``roles``
    roles: dict[str, Role] | None = None
    gang: str | None = None
    role: str | None = None
    leader: bool = False
    seq: int = 0
    submitted_at: int = 0
    updated_at: int = 0
    assigned_at: int | None = None
    dispatched_at: int | None = None
    finished_at: int | None = None
    attempts: list[Attempt] = Field(default_factory=list)

    @classmethod
    def from_hash(
        cls, h: dict[str, str], attempts: list[str] | None = None, *, trusted: bool = False
    ) -> ScheduledTask:
        """The task from its Redis hash (and attempt records). ``trusted``: the hash was just
        returned by a deviceq script, so the pydantic validation pass is skipped (an equal
        model, ~2 µs instead of ~50: the claim path builds one per claimed task)."""

        values = task_values(h)
        values["status"] = TaskStatus(values["status"])
        values["tags"] = tuple(values["tags"])
        kind = values["failure_kind"]
        values["failure_kind"] = FailureKind(kind) if kind else None
        values["avoid_devices"] = tuple(values["avoid_devices"])
        values["avoid_hosts"] = tuple(values["avoid_hosts"])
        values["where"] = tuple(values["where"])
        if is_multi_device(h):
            values["roles"] = decode_roles(h.get("roles"), h.get("peers"), h.get("role_where"))
        values["attempts"] = _attempts(attempts, values["dispatched_at"])
        return trusted_model(cls, values) if trusted else cls(**values)

    @property
    def constraints(self) -> Constraints:
        return Constraints(driver_type=self.driver_type, tags=self.tags, where=self.where)


class PooledDevice(BaseModel):
    """A device owned by one host, as stored in ``dq:{POOL}:device:ID``."""

    device_id: Annotated[str, _named("device id")]
    host_id: Annotated[str, _named("host id")]
    driver_type: DriverType
    tags: Tags = ()
    state: DeviceState = DeviceState.idle
    reason: str | None = None
    reserved_by: str | None = None
    quarantined: bool = False
    quarantine_reason: str | None = None
    held: str | None = None
    attention: str | None = None
    consecutive_failures: int = 0
    released_at: int | None = None
    last_assigned_at: int | None = None
    health: str | None = None  # healthy | unhealthy | checking (its host's health check)
    health_checked_at: int | None = None  # ms, the last check's end
    health_output: str | None = None  # the last check's output tail
    health_reason: str | None = None  # why it is unhealthy
    booked_until: int | None = None  # ms: reserved for a person until then (deviceq reserve)
    gated: str | None = None  # the gate holding it (deviceq gate)
    gated_reason: str | None = None  # its values that made the gate hold it ("battery 15")
    cool_until: int | None = None  # ms: a cooldown gate holds it until then

    @classmethod
    def from_hash(cls, h: dict[str, str]) -> PooledDevice:
        return cls(
            device_id=h["id"],
            host_id=h["host_id"],
            driver_type=h.get("driver_type") or "unknown",
            tags=validate_tags(h.get("tags") or ""),
            state=DeviceState(h.get("state") or "offline"),
            reason=h.get("reason") or None,
            reserved_by=h.get("reserved_by") or None,
            quarantined=h.get("quarantined") == "1",
            quarantine_reason=h.get("quarantine_reason") or None,
            held=h.get("held") or None,
            attention=(h.get("attention_reason") or None) if h.get("attention") == "1" else None,
            consecutive_failures=int(h.get("consecutive_failures") or 0),
            released_at=_opt_int(h.get("released_at")),
            last_assigned_at=_opt_int(h.get("last_assigned_at")),
            health=h.get("health") or None,
            health_checked_at=_opt_int(h.get("health_checked_at")),
            health_output=h.get("health_output") or None,
            health_reason=h.get("health_reason") or None,
            booked_until=_opt_int(h.get("booked_until")),
            gated=h.get("gated") or None,
            gated_reason=h.get("gated_reason") or None,
            cool_until=_opt_int(h.get("cool_until")),
        )


class Host(BaseModel):
    """A machine running the worker daemon. The token digest is never part of this model."""

    host_id: str
    last_heartbeat: int = 0
    draining: bool = False
    stopping: bool = False
    suspect: bool = False
    alive: bool = False
    session: str | None = None
    session_owner: str | None = None
    devices: list[str] = Field(default_factory=list)


class WorkflowStep(BaseModel):
    """One step of a workflow: a goal run through the goal runner."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    goal: Goal


class WorkflowDefinition(BaseModel):
    """A named, stored list of steps. A task may reference it instead of a goal."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, _named("workflow name")]
    description: str | None = None
    steps: list[WorkflowStep] = Field(min_length=1, max_length=1000)


class Assignment(BaseModel):
    """A claimed attempt, as handed to the host worker: the task plus its current lease."""

    task: ScheduledTask
    lease_id: str
    attempt: int
    device_id: str
    host_id: str
    lease_expires_at: int
    lease_ms: int = 0
    # the task's list of test ids (a suite's shard; None: it has none): the host writes it into
    # the run's file $DEVICEQ_TESTS_FILE before the run starts
    tests: list[str] | None = None
