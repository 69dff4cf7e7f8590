"""Commands of the host side: ``host run`` (the worker daemon) and ``device quarantine`` /
``device unquarantine``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..core import logs
from ..core.errors import ConfigError, InvalidInput
from .app import Ctx, device, echo_json, fail, host, nesting_guard, pass_ctx
from .options import usage_checked, usage_ids

if TYPE_CHECKING:
    from ..host.settings import DeviceConfig, WorkerSettings

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


def _check_health_checks(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> dict[str, Any] | tuple[str, ...]:
    """``--health-check DRIVER=TEMPLATE|python:PATH`` values, checked as they are parsed (a
    Python check is imported now): a bad one is a usage error (exit 2) before anything
    starts. The parsed mapping goes on (a Python check is not loaded twice); () when none."""
    from ..host.settings import parse_health_checks

    try:
        parsed = parse_health_checks(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    return parsed or ()


def _check_artifact_store(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """``--artifact-store URL`` / ``--artifact-store-option KEY=VALUE``, checked as they are
    parsed (an s3:// store needs s3fs installed): a bad one is a usage error (exit 2)."""
    from ..artifacts.store import check_store_settings, parse_store_options

    if value is None or value == ():
        return value
    try:
        if param.name == "artifact_store":
            check_store_settings(value, ())
            return value
        return parse_store_options(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _check_api_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--api-url``, checked as it is parsed: a malformed one is a usage error (exit 2)."""
    from ..host.http_client import check_api_url

    if value is None:
        return None
    try:
        return check_api_url(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


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
    from ..core.models import ID_RE

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
    from ..core.models import validate_id
    from ..host.settings import DeviceConfig

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


@host.command("run")
@click.option("--host-id", help="This host's id (as created with `deviceq host add`).")
@click.option("--token", help="The host token (prefer --token-file or DEVICEQ_HOST_TOKEN).")
@click.option(
    "--token-file",
    multiple=True,
    metavar="[POOL=]FILE",
    help="File holding the token. Serving several pools: POOL=FILE per pool (repeatable; the "
    "host has a token of its own in each pool), a plain FILE for the pools without one.",
)
@click.option(
    "--device",
    "devices",
    multiple=True,
    metavar="[POOL/]ID:DRIVER[:TAG,TAG]",
    help="A device this host serves (repeatable). Serving several pools: POOL/ID:DRIVER, "
    "each device in exactly one pool.",
)
@click.option(
    "--devices-file",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="YAML or JSON list of devices (ID:DRIVER[:TAGS] texts or mappings with id, "
    "driver_type, tags and optional serial), with --device's devices (an id in both is an "
    "error). Read again on SIGHUP and when it changes (looked at every second): devices "
    "added, removed and retagged while running; a removed device's running task is stopped "
    "and handed back, a retag applies to its next task. A bad file at start: exit 2; a file "
    "that becomes bad is logged and the last good list stays.",
)
@click.option(
    "--discover",
    multiple=True,
    metavar="adb|command:CMD",
    help="Find devices while running (repeatable; with --device/--devices-file: union). "
    "adb: `adb devices -l`, one android device per serial in state device, tags model=, "
    "product=, device=; a serial that is no valid id is mapped to one (192.168.1.5:5555 -> "
    "192.168.1.5-5555) and the real one is {serial} in --command and $ANDROID_SERIAL. "
    'command:CMD (no shell) prints one JSON device per line: {"id": ..., "driver_type": '
    '..., "tags": [...], "serial": ...} (serial optional). A device that appears joins (after '
    "its health check), one that disappears goes offline and its task is handed back; a "
    "failing command is logged and the last good list stays.",
)
@click.option(
    "--discover-every",
    type=click.FloatRange(min=0, min_open=True),
    metavar="S",
    help="Seconds between discoveries [default: 5].",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML/JSON file with the same settings (options given here win).",
)
@click.option(
    "--goal-runner",
    metavar="SPEC",
    help="command | package.module:callable | entry point name | sim (simulated "
    "work, for demos) [default: command with --command; required otherwise].",
)
@click.option(
    "--workflow-runner",
    metavar="SPEC",
    help="steps (each step through the goal runner) | package.module:callable.",
)
@click.option(
    "--command",
    metavar="TEMPLATE",
    help="Command per task for the command runner, split into arguments once; "
    "{device_id} {driver_type} {task_id} {attempt} {tags} {host_id} {serial} are "
    "substituted, {goal} must be a whole argument ({goal:shell} quotes it for "
    "a shell: sh -c '...', adb shell, ssh). Values are also in DEVICEQ_* env.",
)
@click.option(
    "--infra-exit-code",
    "infra_exit_code",
    multiple=True,
    type=click.IntRange(1, 255),
    metavar="CODE",
    help="Exit code of the command meaning the device or rig failed, not the task "
    "(counts toward quarantine_after); repeatable, e.g. 75.",
)
@click.option(
    "--runner-option",
    multiple=True,
    metavar="KEY=VALUE",
    help="Option passed to the goal runner (repeatable).",
)
@click.option(
    "--isolation",
    type=click.Choice(["auto", "process", "thread"]),
    help="Where Python runners run: auto = own process unless built in.",
)
@click.option(
    "--sim-duration",
    metavar="DIST",
    help="sim: SECONDS | uniform:A,B | exp:MEAN | normal:MEAN,SD | lognormal:MEAN,SD.",
)
@click.option("--sim-min", type=float, help="sim: shortest run (uniform with --sim-max).")
@click.option("--sim-max", type=float, help="sim: longest run.")
@click.option("--sim-fail-rate", type=click.FloatRange(0, 1), help="sim: share of failures.")
@click.option("--sim-error-rate", type=click.FloatRange(0, 1), help="sim: share of errors.")
@click.option("--sim-seed", type=int, help="sim: random seed.")
@click.option(
    "--grace",
    type=click.FloatRange(min=0, min_open=True),
    help="SIGTERM: seconds running tasks get to finish [default: 30].",
)
@click.option(
    "--task-timeout",
    type=click.FloatRange(min=0),
    help="Fail a run with `timeout` after SECONDS (0 = no limit) [default: 0]; a task's own "
    "`submit --timeout` may only shorten it.",
)
@click.option(
    "--stop-grace",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a stopped runner gets before it is killed [default: 5].",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0, min_open=True),
    help="Longest blocking inbox wait (jittered) [default: 2].",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0, min_open=True),
    help="[default: host_timeout/3 of the pool]",
)
@click.option(
    "--renew-interval",
    type=click.FloatRange(min=0, min_open=True),
    help="[default: lease_ttl/3 of the pool]",
)
@click.option(
    "--device-check",
    metavar="TEMPLATE",
    help="Health check per idle device ({device_id} {driver_type} {tags}): exit 0 "
    "idle, 3 busy (in use outside deviceq), else offline.",
)
@click.option(
    "--device-check-interval",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds between device checks [default: 30].",
)
@click.option(
    "--health-check",
    "health_check",
    multiple=True,
    metavar="DRIVER=TEMPLATE|python:PATH",
    callback=_check_health_checks,
    help="Health check of the devices of a driver type (repeatable): a command template "
    "like --command's ({device_id} {driver_type} {tags} {host_id}), exit 0 = healthy; or "
    "python:package.module:callable (a class is instantiated), called as check(task) in a "
    "thread: True, None or an ok Outcome = healthy; False, a failed Outcome or an "
    "exception = unhealthy. An unhealthy device is out of service until a check passes. "
    "Runs when a device joins, every --health-every-tasks tasks, every "
    "--health-every-seconds and after an infrastructure failure, never while a task holds "
    "the device. A Python check past --health-check-timeout is asked to stop (task.cancel) "
    "and the device is not checked again until it returns.",
)
@click.option(
    "--health-every-tasks",
    type=click.IntRange(min=0),
    help="Check a device again after N tasks on it (0 = not by count) [default: 0].",
)
@click.option(
    "--health-every-seconds",
    type=click.FloatRange(min=0),
    help="Check a device again every S seconds; an unhealthy one is re-checked every S "
    "(60 when not given) [default: 0].",
)
@click.option(
    "--health-check-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="A check running longer is killed and the device unhealthy [default: 60].",
)
@click.option(
    "--recover/--no-recover",
    default=None,
    help="At start, when the previous daemon of this host id ran on this machine and "
    "is gone, hand back its running attempts at once instead of waiting for "
    "their leases to expire [default: recover].",
)
@click.option(
    "--takeover",
    is_flag=True,
    default=None,
    help="Start even though another daemon of this host id is alive: it is fenced "
    "(its claims, renewals and reports are refused), stops its runners and "
    "exits; its running attempts come back when their leases expire.",
)
@click.option(
    "--api-url",
    metavar="URL",
    callback=_check_api_url,
    help="Talk to the HTTP service `deviceq api` at URL (http(s)://HOST[:PORT]) instead of "
    "Redis: this host then needs no Redis credentials, only its token (--token-file), and "
    "every call acts as this host only. Same daemon, same guarantees (leases, watchdog, "
    "takeover, drain, reports resent after an outage); an unreachable API is ridden out like "
    "an unreachable Redis. Serves one pool (the API's).",
)
@click.option(
    "--api-ca",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="PEM CA bundle the https:// API's certificate is checked against [default: the "
    "system's trust store].",
)
@click.option(
    "--artifact-store",
    metavar="URL",
    callback=_check_artifact_store,
    help="Where the files a run writes into $DEVICEQ_ARTIFACTS_DIR (task.artifacts_dir) are "
    "kept once its attempt ends, as STORE/POOL/TASK/ATTEMPT/NAME: file:///PATH or "
    "s3://BUCKET/PREFIX (needs deviceq[artifacts]) [default: the pool's artifact_store, "
    "else file://STATE_DIR/artifacts].",
)
@click.option(
    "--artifact-store-option",
    "artifact_store_option",
    multiple=True,
    callback=_check_artifact_store,
    metavar="KEY=VALUE",
    help="An option of the store's filesystem (repeatable), e.g. endpoint_url=http://HOST:PORT "
    "for an S3 API other than AWS's (or DEVICEQ_S3_ENDPOINT_URL); credentials come from the "
    "usual AWS_* variables.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="This host's folder for the attempts' artifact folders and the spool of pending "
    "uploads (a restarted daemon finishes them) [default: $XDG_STATE_HOME/deviceq or "
    "~/.local/state/deviceq].",
)
@pass_ctx
def host_run(ctx: Ctx, config_file: str | None, **options: Any) -> None:
    """Run the worker daemon of a host: heartbeat its devices, claim assignments, run them
    through the runners, renew leases, report. One daemon per host id: a second one is refused
    while the first is alive (--takeover fences it). SIGTERM drains: running tasks finish
    within --grace, the rest are handed back, exit 0. Exit 2: could not start; 3: another
    daemon took over; 4: the host was removed or its token rotated.

    Several pools in one process (--pool a --pool b): one worker per pool, each with its own
    session, inbox, heartbeats and reports; the host is added in each pool (`deviceq --pool a
    host add H`), with a token of its own: --token-file a=FILE per pool (a plain --token-file
    FILE, --token or DEVICEQ_HOST_TOKEN serves the pools without one). Every pool is a separate
    fleet: each device serves exactly one pool (--device POOL/ID:DRIVER), since pools do not
    see each other's reservations and two of them could start a task on a shared device at
    the same moment (for a device shared by teams, use one pool and tags). A pool without a
    token or a device, or a device given for two pools: exit 2 before anything starts.
    SIGTERM drains every pool, exit 0. When one pool's worker stops with an error (host
    removed from that pool, token rotated, taken over, refused at start), the other pools
    are drained and the process exits with that code, for a supervisor to restart it.

    \b
    Example:
      deviceq host run --host-id lab-1 --token-file lab-1.token \\
        --device pixel-7:android:wifi,camera --device emu-1:android \\
        --command 'adb -s {device_id} shell am start -d {goal:shell}' --infra-exit-code 75 \\
        --health-check 'android=adb -s {device_id} get-state' --health-every-tasks 20
      deviceq host run --config lab-1.yaml
      deviceq --pool lab-a --pool lab-b host run --host-id lab-1 \\
        --token-file lab-a=a.token --token-file lab-b=b.token \\
        --device lab-a/pixel-7:android --device lab-b/emu-1:android --command '...'

    \b
    Config file (YAML or JSON; keys as the options, with underscores):
      host_id: lab-1
      token_file: /etc/deviceq/lab-1.token
      devices: ["pixel-7:android:wifi,camera", "emu-1:android"]
      command: "run-test --serial {device_id} {goal}"
      infra_exit_code: [75]
      grace: 60
      health_check: {android: "adb -s {device_id} shell getprop sys.boot_completed"}
      health_every_tasks: 20
    """
    from ..host.daemon import HostWorker
    from ..host.device_sources import DeviceSourceError
    from ..host.multipool import MultiPoolHost
    from ..host.state import EXIT_START_REFUSED

    file_cfg = load_config_file(config_file) if config_file else {}
    options["runner_option"] = options.get("runner_option") or None
    pools = ctx.pools
    try:
        per_pool = build_pool_settings(options, file_cfg, pools)
    except (ConfigError, InvalidInput) as exc:
        if len(pools) == 1 and not isinstance(exc, DeviceSourceError):
            raise
        fail(str(exc), EXIT_START_REFUSED)  # nothing started, nothing written
    logs.configure(ctx.log_format, ctx.log_level.upper())
    first, _ = per_pool[pools[0]]
    if first.api_url:  # one API serves one pool; no Redis to check from here
        if len(pools) > 1:
            fail("--api-url serves one pool (the API's): run a daemon per pool",
                 EXIT_START_REFUSED)  # fmt: skip
        settings, token = per_pool[pools[0]]
        sys.exit(HostWorker("", pools[0], settings, token).run())
    # a wrong password fails now, not in a retry loop (one Redis for every pool: one PING)
    ctx.for_pool(pools[0]).preflight(need_reachable=False)
    if len(pools) == 1:
        settings, token = per_pool[pools[0]]
        sys.exit(HostWorker(ctx.redis_url, pools[0], settings, token).run())
    sys.exit(MultiPoolHost(ctx.redis_url, per_pool).run())


def _quarantine(ctx: Ctx, device_id: str, flag: bool, as_json: bool, reason: str = "") -> None:
    from ..ops.admin import check_reason

    usage_ids(device_id=device_id)
    usage_checked(lambda: check_reason(reason))
    res = ctx.admin.quarantine(device_id, flag, reason)
    if as_json:
        echo_json({"device_id": device_id, "result": res})
    elif flag:
        click.echo(f"{device_id} quarantined: it gets no new work")
    else:
        click.echo(f"{device_id} released from quarantine (failure count reset)")


@device.command("quarantine")
@click.argument("device_id")
@click.option(
    "--reason",
    default="",
    metavar="TEXT",
    help="Why (at most 200 bytes, no control characters): shown by device list/show and the "
    "dashboard, carried in the device_quarantined event. Default: operator.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_ctx
def device_quarantine(ctx: Ctx, device_id: str, reason: str, as_json: bool) -> None:
    """Take a device out of service: no new assignments (a running task finishes). Quarantining
    a device that is quarantined already changes nothing (its reason stays).

    \b
    Example:
      deviceq device quarantine pixel-7 --reason "cracked screen"
    """
    _quarantine(ctx, device_id, True, as_json, reason)


@device.command("unquarantine")
@click.argument("device_id")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_ctx
def device_unquarantine(ctx: Ctx, device_id: str, as_json: bool) -> None:
    """Put a quarantined device back into service and reset its failure count.

    \b
    Example:
      deviceq device unquarantine pixel-7
    """
    _quarantine(ctx, device_id, False, as_json)


__all__ = [
    "build_pool_settings",
    "build_settings",
    "host_run",
    "load_config_file",
    "read_token",
    "split_devices",
    "split_token_files",
]
