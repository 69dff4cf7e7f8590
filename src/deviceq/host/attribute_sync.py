"""`AttributeSync`: the device attributes a host daemon reports. What each device's source
says (`DeviceConfig.attributes`: devices file, discovery) and what its health check printed
(``{"attributes": {...}}``, which win) make the attributes `reported` with each heartbeat,
whose rows carry only what changed since the last heartbeat that got through
(`deviceq.host.heartbeat_sync`: an unchanged attribute costs nothing)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..core import json_bounded
from ..core.attributes import Value, check_attributes, encode
from ..core.errors import DeviceqError
from .device_config import DeviceConfig


@dataclass
class AttributeSync:
    """The attributes each device's health check reported, and the stored forms of what
    each device's source said last (so an unchanged device is not encoded again)."""

    checked: dict[str, dict[str, Value]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _encoded: dict[str, tuple[tuple[tuple[str, Value], ...], dict[str, str]]] = field(
        default_factory=dict
    )

    def from_check(self, device_id: str, values: Mapping[str, object]) -> None:
        """Attributes a health check printed for ``device_id`` (they win over its
        source's; checked: InvalidInput when they are not valid)."""
        checked = check_attributes(values)
        with self.lock:
            self.checked[device_id] = {**self.checked.get(device_id, {}), **checked}
            self._encoded.pop(device_id, None)

    def reported(self, devices: Iterable[DeviceConfig]) -> dict[str, dict[str, str]]:
        """The attributes ``devices`` report, in their stored form, by device (a device
        without any is left out): what a heartbeat carries (`HostLink.heartbeat`)."""
        out: dict[str, dict[str, str]] = {}
        with self.lock:
            for d in devices:
                have = self._encoded.get(d.device_id)
                if have is None or have[0] is not d.attributes:
                    want = {**dict(d.attributes), **self.checked.get(d.device_id, {})}
                    have = (d.attributes, {k: encode(v) for k, v in want.items()})
                    self._encoded[d.device_id] = have
                if have[1]:
                    out[d.device_id] = have[1]
        return out


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
