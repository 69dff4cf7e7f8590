"""``deviceq host run``: the worker daemon of a host, one pool or several (its settings are
built by `host_run_settings`)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..core import logs
from ..core.errors import ConfigError, InvalidInput
from .app import host
from .context import Ctx, pass_ctx
from .errors import describe_error, fail
from .lazy import DurationRange
from .tracing_option import otel_option


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
    from ..core.http import check_api_url

    if value is None:
        return None
    try:
        return check_api_url(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


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
    type=DurationRange(min=0, min_open=True),
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
    "--async",
    "async_runs",
    is_flag=True,
    default=None,
    help="Run the built-in runner (--command, or sim) as an async runner: every run a "
    "coroutine on one event loop, no thread per run; for runs that mostly wait (adb, HTTP, "
    "Appium). Stop, timeout, live logs, progress and artifacts work as without it. A Python "
    "runner that is an `async def` runs so without this option.",
)
@click.option(
    "--isolation",
    type=click.Choice(["auto", "process", "thread"]),
    help="Where Python runners run: auto = own process unless built in or an async def "
    "(those run on the daemon's event loop).",
)
@click.option(
    "--sim-duration",
    metavar="DIST",
    help="sim: SECONDS | uniform:A,B | exp:MEAN | normal:MEAN,SD | lognormal:MEAN,SD.",
)
@click.option(
    "--sim-min", type=DurationRange(min=0), help="sim: shortest run (uniform with --sim-max)."
)
@click.option("--sim-max", type=DurationRange(min=0), help="sim: longest run.")
@click.option("--sim-fail-rate", type=click.FloatRange(0, 1), help="sim: share of failures.")
@click.option("--sim-error-rate", type=click.FloatRange(0, 1), help="sim: share of errors.")
@click.option("--sim-seed", type=int, help="sim: random seed.")
@click.option(
    "--grace",
    type=DurationRange(min=0, min_open=True),
    help="SIGTERM: seconds running tasks get to finish [default: 30].",
)
@click.option(
    "--task-timeout",
    type=DurationRange(min=0),
    help="Fail a run with `timeout` after SECONDS (0 = no limit) [default: 0]; a task's own "
    "`submit --timeout` may only shorten it.",
)
@click.option(
    "--stop-grace",
    type=DurationRange(min=0, min_open=True),
    help="Seconds a stopped runner gets before it is killed [default: 5].",
)
@click.option(
    "--poll-interval",
    type=DurationRange(min=0, min_open=True),
    help="Longest blocking inbox wait (jittered) [default: 2].",
)
@click.option(
    "--report-linger",
    type=DurationRange(min=0, max=1),
    metavar="SECONDS",
    help="While other runs still go, a report waits this long for those that end meanwhile "
    "(one call for them all); 0 = each at once [default: 0.005].",
)
@click.option(
    "--heartbeat-interval",
    type=DurationRange(min=0, min_open=True),
    help="[default: host_timeout/3 of the pool]",
)
@click.option(
    "--renew-interval",
    type=DurationRange(min=0, min_open=True),
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
    type=DurationRange(min=0, min_open=True),
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
    type=DurationRange(min=0),
    help="Check a device again every S seconds; an unhealthy one is re-checked every S "
    "(60 when not given) [default: 0].",
)
@click.option(
    "--health-check-timeout",
    type=DurationRange(min=0, min_open=True),
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
@click.option(
    "--live-log-budget",
    type=click.IntRange(64 << 10, 1 << 40),
    metavar="BYTES",
    help="Bytes the live logs of this host's running attempts may stream to Redis together "
    "(each attempt also stops at the pool's log_max_bytes); past it a run's live log says "
    "where it stops (its log.txt goes on) [default: 268435456, 256 MiB].",
)
@click.option(
    "--log-file-max",
    type=click.IntRange(64 << 10, 1 << 40),
    metavar="BYTES",
    help="Bytes of an attempt's log.txt kept in the artifact store; the rest is cut (a last "
    "line says so) and the cut recorded in the attempt's artifacts_error "
    "[default: 67108864, 64 MiB].",
)
@otel_option("deviceq-host")
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
      async: true              # (--async) the command runner on the event loop
      infra_exit_code: [75]
      grace: 60
      health_check: {android: "adb -s {device_id} shell getprop sys.boot_completed"}
      health_every_tasks: 20
    """
    from ..host.daemon import HostWorker
    from ..host.device_sources import DeviceSourceError
    from ..host.multipool import MultiPoolHost
    from ..host.state import EXIT_START_REFUSED
    from .host_run_settings import build_pool_settings, load_config_file

    file_cfg = load_config_file(config_file) if config_file else {}
    options["runner_option"] = options.get("runner_option") or None
    pools = ctx.pools
    try:
        per_pool = build_pool_settings(options, file_cfg, pools)
    except (ConfigError, InvalidInput) as exc:
        # could not start (exit 2, as --help says): nothing started, nothing written
        if len(pools) == 1 and not isinstance(exc, DeviceSourceError):
            fail(describe_error(exc) or str(exc), EXIT_START_REFUSED)
        fail(str(exc), EXIT_START_REFUSED)
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
