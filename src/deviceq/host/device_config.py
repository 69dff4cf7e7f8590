"""A device a host serves, as configured: `DeviceConfig` (``ID:DRIVER[:TAG,TAG]`` on the
command line, or a mapping from a devices file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.attributes import Value, check_attributes
from ..core.errors import InvalidInput
from ..core.models import DeviceState
from ..core.validation import validate_id, validate_tags
from .link import DeviceReport


@dataclass(frozen=True)
class DeviceConfig:
    """A device this host serves: ``ID:DRIVER[:TAG,TAG]`` on the command line."""

    device_id: str
    driver_type: str
    tags: tuple[str, ...] = ()
    state: DeviceState = DeviceState.idle
    serial: str = ""  # the real serial of a discovered device ({serial}, $ANDROID_SERIAL)
    reason: str = ""  # why it is offline as its source sees it (e.g. adb state unauthorized)
    # what its source says about it (sorted name, value pairs): sent to Redis as attribute
    # changes, not part of the device's identity (a new battery level is no changed device)
    attributes: tuple[tuple[str, Value], ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, text: str) -> DeviceConfig:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise InvalidInput(f"bad device {text!r}: use ID:DRIVER or ID:DRIVER:TAG,TAG")
        tags = validate_tags(parts[2]) if len(parts) == 3 else ()
        return cls(validate_id(parts[0], "device id"), validate_id(parts[1], "driver_type"), tags)

    @classmethod
    def coerce(cls, value: Any) -> DeviceConfig:
        """From ``ID:DRIVER[:TAGS]`` text or a mapping (``id``/``device_id``, ``driver_type``,
        ``tags``, optional ``state`` and ``attributes``)."""
        if isinstance(value, DeviceConfig):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, dict):
            did = value.get("device_id", value.get("id"))
            return cls(
                validate_id(did, "device id"),
                validate_id(value.get("driver_type"), "driver_type"),
                validate_tags(value.get("tags") or ()),
                DeviceState(value.get("state", "idle")),
                attributes=attribute_pairs(value.get("attributes")),
            )
        raise InvalidInput(f"bad device {value!r}")

    def with_attributes(self, values: dict[str, Value]) -> DeviceConfig:
        """This device with ``values`` added to its attributes (they win)."""
        merged = {**dict(self.attributes), **values}
        return DeviceConfig(self.device_id, self.driver_type, self.tags, self.state,
                            self.serial, self.reason, tuple(sorted(merged.items())))  # fmt: skip

    def report(self) -> DeviceReport:
        return DeviceReport(self.device_id, self.driver_type, self.tags, self.state)


def attribute_pairs(values: object) -> tuple[tuple[str, Value], ...]:
    """A source's ``attributes`` mapping, checked, as sorted pairs."""
    return tuple(sorted(check_attributes(values).items()))
