"""Commands of the host side: ``host run`` (the worker daemon) and ``device quarantine`` /
``device unquarantine``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from ..core import logs
from ..core.errors import ConfigError
from ..host.daemon import HostWorker
from ..host.runners import RunnerSpec
from ..host.settings import WorkerSettings
from .app import Ctx, device, echo_json, host, pass_ctx

SIM_KEYS = ("duration", "min", "max", "fail_rate", "error_rate", "seed")


def load_config_file(path: str) -> dict[str, Any]:
    """A YAML or JSON file of ``host run`` settings (keys as the options, with underscores)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
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
    known = set(WorkerSettings.__dataclass_fields__)
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


@host.command("run")
@click.option("--host-id", help="This host's id (as created with `deviceq host add`).")
@click.option("--token", help="The host token (prefer --token-file or DEVICEQ_HOST_TOKEN).")
@click.option("--token-file", type=click.Path(dir_okay=False), help="File holding the token.")
@click.option(
    "--device",
    "devices",
    multiple=True,
    metavar="ID:DRIVER[:TAG,TAG]",
    help="A device this host serves (repeatable).",
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
    "{device_id} {driver_type} {task_id} {attempt} {tags} {host_id} are "
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
    help="Fail a run with `timeout` after SECONDS (0 = no limit) [default: 0].",
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
@pass_ctx
def host_run(ctx: Ctx, config_file: str | None, **options: Any) -> None:
    """Run the worker daemon of a host: heartbeat its devices, claim assignments, run them
    through the runners, renew leases, report. One daemon per host id: a second one is refused
    while the first is alive (--takeover fences it). SIGTERM drains: running tasks finish
    within --grace, the rest are handed back, exit 0. Exit 2: could not start; 3: another
    daemon took over; 4: the host was removed or its token rotated.

    \b
    Example:
      deviceq host run --host-id lab-1 --token-file lab-1.token \\
        --device pixel-7:android:wifi,camera --device emu-1:android \\
        --command 'adb -s {device_id} shell am start -d {goal:shell}' --infra-exit-code 75
      deviceq host run --config lab-1.yaml

    \b
    Config file (YAML or JSON; keys as the options, with underscores):
      host_id: lab-1
      token_file: /etc/deviceq/lab-1.token
      devices: ["pixel-7:android:wifi,camera", "emu-1:android"]
      command: "run-test --serial {device_id} {goal}"
      infra_exit_code: [75]
      grace: 60
    """
    file_cfg = load_config_file(config_file) if config_file else {}
    options["runner_option"] = options.get("runner_option") or None
    settings, token = build_settings(options, file_cfg)
    logs.configure(ctx.log_format, ctx.log_level.upper())
    ctx.preflight(need_reachable=False)  # a wrong password fails now, not in a retry loop
    worker = HostWorker(ctx.redis_url, ctx.pool, settings, token)
    sys.exit(worker.run())


def _quarantine(ctx: Ctx, device_id: str, flag: bool, as_json: bool) -> None:
    res = ctx.admin.quarantine(device_id, flag)
    if as_json:
        echo_json({"device_id": device_id, "result": res})
    elif flag:
        click.echo(f"{device_id} quarantined: it gets no new work")
    else:
        click.echo(f"{device_id} released from quarantine (failure count reset)")


@device.command("quarantine")
@click.argument("device_id")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_ctx
def device_quarantine(ctx: Ctx, device_id: str, as_json: bool) -> None:
    """Take a device out of service: no new assignments (a running task finishes).

    \b
    Example:
      deviceq device quarantine pixel-7
    """
    _quarantine(ctx, device_id, True, as_json)


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


__all__ = ["build_settings", "host_run", "load_config_file", "read_token"]
