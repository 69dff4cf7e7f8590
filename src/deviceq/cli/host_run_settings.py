"""The settings of ``host run``: its options and config file merged into a `WorkerSettings`
and token per pool served (the devices and token files of each pool sorted out)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError, InvalidInput
from ..core.input_files import nesting_guard

if TYPE_CHECKING:
    from ..host.device_config import DeviceConfig
    from ..host.settings import WorkerSettings

SIM_KEYS = ("duration", "min", "max", "fail_rate", "error_rate", "seed")


def load_config_file(path: str) -> dict[str, Any]:
    """A YAML or JSON file of ``host run`` settings (keys as the options, with underscores)."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        with nesting_guard(path, ConfigError):
            data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path} is not valid YAML/JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def read_token(token: str | None, token_file: str | None) -> str:
    """The host token: --token, else --token-file, else DEVICEQ_HOST_TOKEN."""
    if token:
        return token.strip()
    if token_file:
        try:
            value = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read token file {token_file}: {exc.strerror}") from None
        if not value:
            raise ConfigError(f"token file {token_file} is empty")
        return value
    env = os.environ.get("DEVICEQ_HOST_TOKEN", "").strip()
    if env:
        return env
    raise ConfigError("a host token is required: --token, --token-file or DEVICEQ_HOST_TOKEN")


def _parse_options(items: tuple[str, ...] | list[str] | dict[str, Any]) -> dict[str, Any]:
    import yaml

    if isinstance(items, dict):
        return dict(items)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"bad runner option {item!r}: use KEY=VALUE")
        out[key.replace("-", "_")] = yaml.safe_load(value) if value else ""
    return out


def build_settings(cli: dict[str, Any], file_cfg: dict[str, Any]) -> tuple[WorkerSettings, str]:
    """Merge command-line values (None = not given) over the config file; returns the settings
    and the token."""
    from ..host.runners import RunnerSpec
    from ..host.settings import WorkerSettings

    cfg = dict(file_cfg)
    for key, value in cli.items():
        if value is not None and value != ():
            cfg[key] = value
    sim = dict(cfg.pop("sim", None) or {})
    for key in SIM_KEYS:
        if cfg.get(f"sim_{key}") is not None:
            sim[key] = cfg.pop(f"sim_{key}")
        cfg.pop(f"sim_{key}", None)
    token = read_token(cfg.pop("token", None), cfg.pop("token_file", None))
    host_id = cfg.pop("host_id", None)
    if not host_id:
        raise ConfigError("--host-id is required (or host_id in --config)")
    devices = cfg.pop("devices", None) or cfg.pop("device", None) or []
    if isinstance(devices, str):
        devices = [devices]
    command = cfg.pop("command", None)
    goal_name = cfg.pop("goal_runner", None) or ("command" if command else None)
    if goal_name is None:
        raise ConfigError(
            "say how tasks run: --command 'TEMPLATE' (or --goal-runner package.module:callable); "
            "--goal-runner sim only simulates work (demos, benchmarks)"
        )
    runner_options = _parse_options(cfg.pop("runner_option", None) or
                                    cfg.pop("runner_options", None) or {})  # fmt: skip
    cfg.pop("runner_options", None)
    async_runs = cfg.pop("async_runs", None)
    if async_runs is None:
        async_runs = cfg.pop("async", None)
    cfg.pop("async", None)
    if async_runs is not None and not isinstance(async_runs, bool):
        raise ConfigError(f"async must be true or false, not {async_runs!r}")
    if async_runs:
        if goal_name not in ("command", "sim"):
            raise ConfigError(
                "--async applies to the built-in runners (--command, --goal-runner sim); a "
                "Python runner is async when it is an `async def`"
            )
        runner_options = {**runner_options, "async": True}
    infra = cfg.pop("infra_exit_code", None) or cfg.pop("infra_exit_codes", None) or ()
    if isinstance(infra, int | str):
        infra = [infra]
    if infra and goal_name != "command":
        raise ConfigError("--infra-exit-code applies to the command runner (--command)")
    if goal_name == "command":
        if not command:
            raise ConfigError("the command runner needs --command 'TEMPLATE'")
        goal_opts: dict[str, Any] = {"template": command, **runner_options}
        if infra:
            goal_opts["infra_exit_codes"] = [int(c) for c in infra]
    elif goal_name == "sim":
        if "min" in sim or "max" in sim:
            if "duration" in sim:
                raise ConfigError("give --sim-duration or --sim-min/--sim-max, not both")
            lo = float(sim.pop("min", 0.0))
            hi = float(sim.pop("max", lo))
            if hi < lo:
                raise ConfigError("--sim-max must be >= --sim-min")
            sim["duration"] = f"uniform:{lo},{hi}"
        goal_opts = {**sim, **runner_options}
    else:
        goal_opts = runner_options
    known = {n for n, f in WorkerSettings.__dataclass_fields__.items() if f.init}
    unknown = sorted(set(cfg) - known - {"workflow_runner"})
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
    settings = WorkerSettings(
        host_id=host_id,
        devices=list(devices),
        goal_runner=RunnerSpec(goal_name, goal_opts),
        workflow_runner=RunnerSpec(cfg.pop("workflow_runner", None) or "steps"),
        **{k: v for k, v in cfg.items() if k in known},
    )
    return settings, token


def split_token_files(value: Any, pools: tuple[str, ...]) -> tuple[dict[str, str], str | None]:
    """``--token-file`` values (or ``token_file`` of a config file: a path, a list, or a
    mapping pool -> path): the per-pool files (``POOL=FILE``) and the plain one (at most one,
    for every pool without a file of its own)."""
    from ..core.validation import ID_RE

    if value is None or value == ():
        return {}, None
    if isinstance(value, dict):
        items = [f"{k}={v}" for k, v in value.items()]
    elif isinstance(value, str):
        items = [value]
    else:
        items = [str(v) for v in value]
    per_pool: dict[str, str] = {}
    plain: list[str] = []
    for item in items:
        key, sep, rest = item.partition("=")
        if sep and ID_RE.fullmatch(key):
            if key not in pools:
                raise ConfigError(
                    f"--token-file {key}=...: this daemon does not serve pool {key!r} "
                    f"(it serves {', '.join(pools)})"
                )
            if key in per_pool:
                raise ConfigError(f"--token-file {key}=... is given twice")
            if not rest:
                raise ConfigError(f"--token-file {key}=: the file is missing")
            per_pool[key] = rest
        else:
            plain.append(item)
    if len(plain) > 1:
        raise ConfigError(
            "--token-file FILE is given more than once: one plain FILE serves every pool; "
            "give the others as POOL=FILE"
        )
    return per_pool, (plain[0] if plain else None)


def split_devices(value: Any, pools: tuple[str, ...]) -> dict[str, list[DeviceConfig]]:
    """The devices of each pool: ``POOL/ID:DRIVER[:TAGS]`` (in a config file also a mapping
    with ``pool``, ``id``, ``driver_type``, ``tags``); a device without a pool only when
    there is one pool. Each device id in one pool only, each pool with a device at least."""
    from ..core.validation import validate_id
    from ..host.device_config import DeviceConfig

    out: dict[str, list[DeviceConfig]] = {p: [] for p in pools}
    items: list[tuple[str | None, Any]] = []
    raw: Any
    for raw in [value] if isinstance(value, str | dict) else value or []:
        pool: str | None = None
        if isinstance(raw, str) and "/" in raw:
            pool, _, raw = raw.partition("/")
            validate_id(pool, "pool name")
        elif isinstance(raw, dict) and "pool" in raw:
            raw = dict(raw)
            pool = validate_id(raw.pop("pool"), "pool name")
        items.append((pool, raw))
    where: dict[str, str] = {}
    for pool, d in items:
        dev = DeviceConfig.coerce(d)
        if pool is None:
            if len(pools) > 1:
                raise ConfigError(
                    f"device {dev.device_id}: say which pool it serves (--device "
                    f"POOL/{dev.device_id}:{dev.driver_type}): serving several pools, each "
                    "device belongs to exactly one"
                )
            pool = pools[0]
        if pool not in out:
            raise ConfigError(
                f"device {pool}/{dev.device_id}: this daemon does not serve pool {pool!r} "
                f"(it serves {', '.join(pools)})"
            )
        if dev.device_id in where:
            other = where[dev.device_id]
            raise ConfigError(
                f"device {dev.device_id} is given twice"
                + (f" (pools {other} and {pool})" if other != pool else "")
                + ": a device serves one pool, since pools do not see each other's "
                "reservations (two of them could run a task on it at the same moment)"
            )
        where[dev.device_id] = pool
        out[pool].append(dev)
    if len(pools) > 1:
        empty = [p for p in pools if not out[p]]
        if empty:
            raise ConfigError(
                f"pool(s) {', '.join(empty)} have no device: --device POOL/ID:DRIVER[:TAGS]"
            )
    return out


def build_pool_settings(
    cli: dict[str, Any], file_cfg: dict[str, Any], pools: tuple[str, ...]
) -> dict[str, tuple[WorkerSettings, str]]:
    """`build_settings` for each pool a daemon serves: pool -> (settings, token). Each pool
    gets the devices given for it and its token: its own ``--token-file POOL=FILE``, else
    ``--token``, the plain ``--token-file FILE`` or DEVICEQ_HOST_TOKEN. Checked before
    anything starts: every pool has a token and a device (ConfigError otherwise)."""
    from ..host.device_sources import DeviceSourceError

    cfg = dict(file_cfg)
    for key, value in cli.items():
        if value is not None and value != ():
            cfg[key] = value
    if len(pools) > 1 and (cfg.get("devices_file") or cfg.get("discover")):
        raise DeviceSourceError(
            "--devices-file and --discover serve one pool: run a daemon per pool for them"
        )
    per_file, plain_file = split_token_files(cfg.pop("token_file", None), pools)
    token = cfg.pop("token", None)
    devices = split_devices(cfg.pop("devices", None) or cfg.pop("device", None) or [], pools)
    cfg.pop("device", None)
    general: str | None = None
    if token or plain_file or os.environ.get("DEVICEQ_HOST_TOKEN", "").strip():
        general = read_token(token, plain_file)
    missing = [p for p in pools if p not in per_file and general is None]
    if missing and len(pools) == 1:
        read_token(None, None)  # the one-pool message: a host token is required ...
    if missing:
        raise ConfigError(
            f"no host token for pool(s) {', '.join(missing)}: the host has a token of its own "
            "in each pool; give --token-file POOL=FILE for each (or one --token-file FILE, "
            "--token or DEVICEQ_HOST_TOKEN for the pools without one)"
        )
    out: dict[str, tuple[WorkerSettings, str]] = {}
    for pool in pools:
        tok = read_token(None, per_file[pool]) if pool in per_file else general
        assert tok is not None
        try:
            out[pool] = build_settings({**cfg, "devices": devices[pool], "token": tok}, {})
        except (ConfigError, InvalidInput) as exc:
            if len(pools) == 1:
                raise
            raise ConfigError(f"pool {pool}: {exc}") from None
    return out
