"""The texts a host's device list comes in, parsed into `DeviceConfig`s: a devices file
(``--devices-file``, YAML or JSON), the output of ``adb devices -l`` and a discovery
command's JSON lines; a device serial and the device id made of it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from typing import Any

import yaml

from ..core import json_bounded
from ..core.attributes import Value, check_text, infer
from ..core.errors import ConfigError, DeviceqError
from ..core.input_files import nesting_guard, read_input
from ..core.validation import ID_RE, TAG_RE
from .device_config import DeviceConfig

SERIAL_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:@+/=,-]{0,254}\Z")
"""A device serial as adb and the like print it (``emulator-5554``, ``192.168.1.5:5555``,
``adb-R5CT.._adb-tls-connect._tcp``): no whitespace, quote or shell metacharacter, so that it
is safe anywhere in a command's argument (``{serial}``)."""
ADB_TAG_KEYS = ("model", "product", "device")


class DeviceSourceError(ConfigError):
    """A devices file, a discovery spec or a device of them is not valid (at start: exit 2,
    nothing registered)."""


def validate_serial(value: object) -> str:
    if not isinstance(value, str) or not SERIAL_RE.fullmatch(value):
        raise DeviceSourceError(
            f"invalid serial {value!r}: use 1-255 characters from A-Z a-z 0-9 . _ : @ + / = , - "
            "starting with a letter or digit"
        )
    return value


def device_id_for_serial(serial: str) -> str:
    """A valid deviceq id for ``serial``, the same every time: the serial itself when it is
    one; else every character outside ``A-Z a-z 0-9 . _ -`` becomes ``-`` (``192.168.1.5:5555``
    -> ``192.168.1.5-5555``), a leading punctuation gets an ``d`` before it, and a result past
    128 characters is cut and ends with a hash of the serial (so two long serials differ)."""
    if ID_RE.fullmatch(serial):
        return serial
    out = re.sub(r"[^A-Za-z0-9._-]", "-", serial) or "-"
    if not out[0].isalnum():
        out = "d" + out
    if len(out) > 128:
        out = out[:119] + "-" + hashlib.sha1(serial.encode()).hexdigest()[:8]
    return out


def tag_for(key: str, value: str) -> str | None:
    """The tag ``key=value`` with characters a tag may not hold made ``_`` (cut to 64
    characters); None when nothing valid is left."""
    text = f"{key}=" + re.sub(r"[^A-Za-z0-9._=/+-]", "_", value)
    text = text[:64]
    return text if TAG_RE.fullmatch(text) and value else None


def parse_adb_devices(text: str) -> tuple[list[DeviceConfig], list[str]]:
    """The devices of an ``adb devices -l`` output: one per serial in state ``device``
    (``offline``, ``unauthorized``, ``recovery`` ... are skipped), driver type ``android``,
    tags ``model=``, ``product=``, ``device=`` from the line, the real serial as ``serial``.
    Returns (devices, warnings about the lines that could not be used)."""
    devices: list[DeviceConfig] = []
    warnings: list[str] = []
    seen: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("*") or line.startswith("List of devices"):
            continue
        words = line.split()
        if len(words) < 2:
            warnings.append(f"adb: unexpected line {line[:120]!r}")
            continue
        serial, state = words[0], words[1]
        if state != "device":
            continue  # offline, unauthorized, no permissions ...: not usable now
        try:
            validate_serial(serial)
        except ConfigError as exc:
            warnings.append(f"adb: skipped {line[:120]!r}: {exc}")
            continue
        attrs = dict(w.split(":", 1) for w in words[2:] if ":" in w)
        tags = tuple(sorted(t for k in ADB_TAG_KEYS if (t := tag_for(k, attrs.get(k, "")))))
        did = device_id_for_serial(serial)
        if did in seen:
            warnings.append(f"adb: serials {seen[did]!r} and {serial!r} map to the same id {did}")
            continue
        seen[did] = serial
        devices.append(DeviceConfig(did, "android", tags, serial=serial))
    return devices, warnings


def adb_unusable(text: str, usable: list[DeviceConfig]) -> list[DeviceConfig]:
    """The serials of an ``adb devices -l`` output that adb lists but that cannot be used now
    (``unauthorized``, ``offline``, ``no permissions``, ``recovery`` ...): each as an
    ``android`` device in state offline whose reason names its adb state, so that the lab
    sees it (device list) instead of losing it without a word. Serials that are no valid
    serial or map to an id of ``usable`` are left out (`parse_adb_devices` names the first)."""
    from ..core.models import DeviceState

    taken = {d.device_id for d in usable}
    out: list[DeviceConfig] = []
    for raw in text.splitlines():
        words = raw.strip().split()
        if len(words) < 2 or words[0].startswith("*") or raw.startswith("List of devices"):
            continue
        serial, state = words[0], words[1]
        if state == "device":
            continue
        if state == "no" and len(words) > 2 and words[2] == "permissions":
            state = "no permissions"
        try:
            validate_serial(serial)
        except ConfigError:
            continue
        did = device_id_for_serial(serial)
        if did in taken:
            continue
        taken.add(did)
        reason = f"adb state {state[:40]}: not usable until adb lists it as device"
        out.append(DeviceConfig(did, "android", (), DeviceState.offline, serial, reason))
    return out


def parse_json_lines(text: str, what: str = "discovery") -> tuple[list[DeviceConfig], list[str]]:
    """One JSON device per line (``{"id": ..., "driver_type": ..., "tags": [...],
    "serial": ...}``, serial optional; blank lines ignored). Returns (devices, warnings naming
    each bad line, which is skipped)."""
    devices: list[DeviceConfig] = []
    warnings: list[str] = []
    ids: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        try:
            value = json_bounded.loads(line, "the line")
            if not isinstance(value, dict):
                raise DeviceSourceError("not a JSON object")
            dev = coerce_device(value)
        except (ValueError, DeviceqError) as exc:
            warnings.append(f"{what}: line {n} {line[:120]!r} skipped: {exc}")
            continue
        if dev.device_id in ids:
            warnings.append(f"{what}: line {n}: device {dev.device_id} is listed twice; skipped")
            continue
        ids.add(dev.device_id)
        devices.append(dev)
    return devices, warnings


def coerce_device(value: Any) -> DeviceConfig:
    """A device of a devices file or a discovery line: ``ID:DRIVER[:TAGS]`` text or a mapping
    (``id``, ``driver_type``, ``tags``, optional ``serial`` and ``attributes``: a mapping of
    names to values, `deviceq.core.attributes`; nothing else)."""
    if isinstance(value, dict):
        fields = {"id", "device_id", "driver_type", "tags", "serial", "attributes"}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise DeviceSourceError(f"unknown field(s) {', '.join(map(str, unknown))}")
        serial = value.get("serial")
        dev = DeviceConfig.coerce({k: v for k, v in value.items() if k != "serial"})
        if serial is not None:
            dev = DeviceConfig(dev.device_id, dev.driver_type, dev.tags,
                               serial=validate_serial(serial),
                               attributes=dev.attributes)  # fmt: skip
        return dev
    if isinstance(value, str):
        return DeviceConfig.parse(value)
    raise DeviceSourceError(f"bad device {value!r}: use ID:DRIVER[:TAGS] or a mapping")


def parse_devices_text(text: str, path: str) -> list[DeviceConfig]:
    """The devices of a devices file's text (YAML or JSON list; empty = no device).
    ConfigError (one line naming the file and the problem) when it is not valid."""
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DeviceSourceError(f"devices file {path} is not valid YAML/JSON: {first}") from None
    if data is None:
        return []
    if not isinstance(data, list):
        raise DeviceSourceError(f"devices file {path} must hold a list of devices")
    out: list[DeviceConfig] = []
    ids: set[str] = set()
    for i, item in enumerate(data, 1):
        try:
            dev = coerce_device(item)
        except (ValueError, DeviceqError) as exc:
            raise DeviceSourceError(f"devices file {path}, device {i}: {exc}") from None
        if dev.device_id in ids:
            raise DeviceSourceError(f"devices file {path}: device {dev.device_id} is listed twice")
        ids.add(dev.device_id)
        out.append(dev)
    return out


def read_devices_file(path: str) -> tuple[list[DeviceConfig], bytes]:
    """The devices of ``path`` and its content (ConfigError when unreadable, larger than
    the CLI's input cap, not UTF-8, nested too deeply or invalid)."""
    try:
        text = read_input("./-" if path == "-" else path)  # a file named -, never stdin
    except DeviceqError as exc:
        where = "./-" if path == "-" else path
        raise DeviceSourceError(str(exc).replace(where, f"devices file {path}", 1)) from None
    with nesting_guard(f"devices file {path}", DeviceSourceError):
        return parse_devices_text(text, path), text.encode()


ADB_PROBE = (
    "getprop ro.build.version.sdk; getprop ro.product.model; getprop ro.build.version.release;"
    " dumpsys battery"
)
"""What ``--discover adb`` runs on each usable device (``adb -s SERIAL shell ...``) for its
attributes, one call a device and discovery round."""


def parse_adb_probe(text: str) -> dict[str, Value]:
    """The attributes of an `ADB_PROBE` output: ``sdk``, ``model``, ``release`` (the first
    three lines, getprop's answers) and from ``dumpsys battery`` ``battery`` (its level, %)
    and ``temperature`` (°C: dumpsys prints tenths). A value that is missing or not valid is
    left out."""
    lines = text.splitlines()
    out: dict[str, Value] = {}
    for key, raw in zip(("sdk", "model", "release"), lines[:3], strict=False):
        raw = raw.strip()
        if raw:
            with contextlib.suppress(DeviceqError):
                out[key] = infer(key, raw) if key != "model" else check_text(key, raw[:64])
    for line in lines[3:]:
        name, sep, raw = line.strip().partition(":")
        if not sep or not raw.strip().lstrip("-").isdigit():
            continue
        if name == "level":
            out["battery"] = int(raw)
        elif name == "temperature":
            out["temperature"] = int(raw) / 10
    return out
