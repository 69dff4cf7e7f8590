"""`AttributeSync`: a host daemon's device attributes sent as changes. What each device's
source says (`DeviceConfig.attributes`: devices file, discovery) and what its health check
printed (``{"attributes": {...}}``) are compared with what was last sent; only the difference
goes to Redis (``device_attrs.lua``), and nothing at all when nothing changed."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import json_bounded
from ..core.attributes import Value, check_attributes, encode
from ..core.errors import DeviceqError
from .device_config import DeviceConfig

Changes = dict[str, tuple[dict[str, Value], tuple[str, ...]]]


@dataclass
class AttributeSync:
    """The attributes last sent per device and those its health check reported."""

    sent: dict[str, dict[str, str]] = field(default_factory=dict)  # device -> name -> encoded
    checked: dict[str, dict[str, Value]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def from_check(self, device_id: str, values: Mapping[str, object]) -> None:
        """Attributes a health check printed for ``device_id`` (they win over its
        source's; checked: InvalidInput when they are not valid)."""
        checked = check_attributes(values)
        with self.lock:
            self.checked[device_id] = {**self.checked.get(device_id, {}), **checked}

    def changes(self, devices: Iterable[DeviceConfig]) -> Changes:
        """What differs from what was last sent, per device (served devices only)."""
        out: Changes = {}
        with self.lock:
            for d in devices:
                want = {**dict(d.attributes), **self.checked.get(d.device_id, {})}
                sent = self.sent.get(d.device_id, {})
                put = {k: v for k, v in want.items() if sent.get(k) != encode(v)}
                gone = tuple(k for k in sent if k not in want)
                if put or gone:
                    out[d.device_id] = (put, gone)
        return out

    def mark_sent(self, changes: Changes) -> None:
        with self.lock:
            for did, (put, gone) in changes.items():
                sent = self.sent.setdefault(did, {})
                sent.update({k: encode(v) for k, v in put.items()})
                for k in gone:
                    sent.pop(k, None)

    def forget(self, device_ids: Iterable[str] | None = None) -> None:
        """Send these devices' (all devices', for None) attributes in full next time (after
        a refused call, or when Redis may have lost them)."""
        with self.lock:
            for did in list(self.sent) if device_ids is None else device_ids:
                self.sent.pop(did, None)

    def send(self, link: Any, devices: Iterable[DeviceConfig]) -> int:
        """Send the changes of ``devices`` over ``link`` (`HostLink.send_attributes`);
        0 calls when nothing changed. Returns how many devices changed."""
        changes = self.changes(devices)
        if not changes:
            return 0
        try:
            n = int(link.send_attributes(changes))
        except Exception:
            self.forget(changes)
            raise
        self.mark_sent(changes)
        return n


def attributes_in_output(output: str) -> dict[str, Value] | None:
    """The attributes a health check printed: its last line that is a JSON object
    ``{"attributes": {...}}`` (None when there is none; a line whose attributes are not valid
    raises InvalidInput naming why)."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if not (line.startswith("{") and '"attributes"' in line):
            continue
        try:
            value = json_bounded.loads(line, "the line")
        except (ValueError, DeviceqError):
            continue
        if isinstance(value, dict) and "attributes" in value:
            return check_attributes(value["attributes"], "a health check's attributes")
    return None
