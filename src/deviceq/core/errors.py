"""Typed errors. Every Lua error reply starts with a CODE that maps to one class here."""

from __future__ import annotations

from typing import Any


class DeviceqError(Exception):
    """Base class of every deviceq error."""

    code = "ERROR"


class InvalidInput(DeviceqError, ValueError):
    """Malformed id, tag, goal or argument. Nothing was changed."""

    code = "INVALID"


class NotFound(DeviceqError, LookupError):
    """The task, host, device or workflow does not exist."""

    code = "NOT_FOUND"


class AlreadyExists(DeviceqError):
    """The host (or task id) already exists."""

    code = "EXISTS"


class QueueFull(DeviceqError):
    """The pool already holds ``max_queue_depth`` queued tasks.

    ``queued_ids``: the ids a bulk submit (`Client.submit_many`) queued, in order, before the
    chunk that was refused (that chunk and the rest were not written); empty otherwise."""

    code = "QUEUE_FULL"

    def __init__(self, *args: object, queued_ids: list[str] | None = None) -> None:
        super().__init__(*args)
        self.queued_ids: list[str] = list(queued_ids or [])


class AuthError(DeviceqError, PermissionError):
    """Unknown host or wrong token. The message never contains the token."""

    code = "AUTH"


class Unmatchable(DeviceqError):
    """Rejecting unmatched tasks, and no registered device could ever run this one."""

    code = "UNMATCHABLE"


class DeviceOwned(DeviceqError):
    """A host reported a device id that another host registered."""

    code = "DEVICE_OWNED"


class Busy(DeviceqError):
    """The operation would disturb running work (e.g. removing a host with reserved devices)."""

    code = "BUSY"


class Fenced(DeviceqError):
    """A scheduler that is no longer the leader tried to commit assignments."""

    code = "FENCED"


class SessionActive(DeviceqError):
    """Another daemon holds a live session for this host id (start with ``--takeover`` to fence
    it), or started at the same moment."""

    code = "SESSION_ACTIVE"


class SessionSuperseded(DeviceqError):
    """This daemon's host session was superseded (takeover, a newer daemon, token rotation):
    its claims, renewals and reports are refused; it must stop its runners and exit."""

    code = "SUPERSEDED"


class NotConfirmed(DeviceqError):
    """The write was applied but the pool's durability (``aof`` / ``replica``) could not be
    confirmed in time: it may be lost if Redis crashes now. ``result`` is what the write
    answered (e.g. the submitted task ids, the report answers); ``claimed``, the assignments a
    report that also claimed took (start them: they are this host's now)."""

    code = "NOT_CONFIRMED"

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result: Any = result
        self.claimed: list[Any] = []


class ConfigError(DeviceqError):
    """Bad configuration: unknown setting, bad value, unknown strategy or runner."""

    code = "CONFIG"


_BY_CODE: dict[str, type[DeviceqError]] = {
    cls.code: cls
    for cls in (
        InvalidInput,
        NotFound,
        AlreadyExists,
        QueueFull,
        Unmatchable,
        AuthError,
        DeviceOwned,
        Busy,
        Fenced,
        SessionActive,
        SessionSuperseded,
        NotConfirmed,
        ConfigError,
    )
}


def from_reply(message: str) -> DeviceqError | None:
    """Turn a Lua ``error_reply("CODE text")`` message into a typed error, or None if foreign."""
    # Redis may prefix script errors with context; the CODE is the first word we produced.
    text = message.strip()
    for code, cls in _BY_CODE.items():
        if text.startswith(code + " "):
            return cls(text[len(code) + 1 :])
    return None


def error_codes() -> tuple[str, ...]:
    """Every CODE a script may return."""
    return tuple(_BY_CODE)
