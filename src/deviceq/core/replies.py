"""The scripts' per-item replies, parsed: ``ok:LEASE_ID``, ``ok:STATUS``, ``ok``, ``same``,
``dup:STATUS``, ``err:REASON``, ``err:REASON@ROLE``, ``rejected:REASON`` (the codes and their
reasons: `deviceq.core.vocabulary`) -> a `Reply`.

The replies stay strings where they are handed on (``PoolAdmin.set_priority``, the host API's
``answers``: names and values there are a contract); code that decides on one parses it here
instead of slicing the text."""

from __future__ import annotations

from dataclasses import dataclass

from .vocabulary import DEVICE_REFUSAL_PREFIXES, ReplyCode

_CODES = {c.value: c for c in ReplyCode}


@dataclass(frozen=True)
class Reply:
    """One per-item reply: its ``code``, the ``value`` after ``CODE:`` (the lease id, attempt
    or status of an ``ok``/``dup``; the reason of an ``err``/``rejected``, ``missing_tag:TAG``
    whole) and, for a multi-device task's refusal (``err:REASON@ROLE``), the ``role``."""

    code: ReplyCode
    value: str = ""
    role: str = ""

    @property
    def ok(self) -> bool:
        """Applied (``ok``/``ok:VALUE``)."""
        return self.code is ReplyCode.ok

    @property
    def refused(self) -> bool:
        """Not applied, with a reason (``err:REASON``, ``rejected:REASON``)."""
        return self.code in (ReplyCode.err, ReplyCode.rejected)

    @property
    def reason(self) -> str:
        """Why it was refused ('' when it was not)."""
        return self.value if self.refused else ""

    @property
    def device_refusal(self) -> bool:
        """Refused for something about the device (its state, driver type or tags)."""
        return self.refused and self.value.startswith(DEVICE_REFUSAL_PREFIXES)


def parse(raw: str | bytes) -> Reply:
    """The `Reply` of reply text ``raw``. A text with no known code is an ``err`` with the
    whole text as its reason (what it says is shown, not lost)."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    head, sep, rest = text.partition(":")
    code = _CODES.get(head)
    if code is None:
        return Reply(ReplyCode.err, text)
    if code is ReplyCode.err and "@" in rest:
        reason, _, role = rest.rpartition("@")
        return Reply(code, reason, role)
    return Reply(code, rest)
