"""The systemd units shipped in deploy/systemd: each passes ``systemd-analyze verify`` and its
ExecStart is a command line the real CLI accepts.

``systemd-analyze verify`` checks that the binary of ExecStart exists and is executable, so each
unit is verified as a copy whose ExecStart runs this environment's ``deviceq`` instead of
``/opt/deviceq/bin/deviceq`` (nothing else changes). The ExecStart lines are then expanded the
way systemd expands them (``%d``: the credentials folder, here a temporary one holding a file per
``LoadCredential=``; ``%S``: the state folder; ``$VAR``: the words of the shipped environment
file) and parsed by the CLI without running it, with the shipped host.yaml for
``/etc/deviceq/host.yaml``; that file itself goes through the host daemon's settings."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_check import check_cli
from deviceq.cli.host_run_settings import build_settings, load_config_file

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
SHIPPED_BIN = "/opt/deviceq/bin/deviceq"
DEVICEQ = Path(sys.executable).parent / "deviceq"
NAMES = ("deviceq-host", "deviceq-scheduler", "deviceq-api", "deviceq-dashboard")
SUBCOMMAND = {
    "deviceq-host": ["host", "run"],
    "deviceq-scheduler": ["scheduler", "run"],
    "deviceq-api": ["api"],
    "deviceq-dashboard": ["dashboard"],
}


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze is missing (Debian: apt-get install systemd; .ci/run does)"
    return found


def directives(text: str) -> list[tuple[str, str]]:
    """The ``Key=value`` lines of a unit, in order (comments and sections left out)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


def values(text: str, key: str) -> list[str]:
    return [v for k, v in directives(text) if k == key]


def environment_file() -> dict[str, str]:
    env = {}
    for line in (UNITS / "deviceq.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [systemd_analyze(), "verify", "--man=no", "--recursive-errors=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def local_copy(name: str, folder: Path) -> Path:
    """The unit with ExecStart running this environment's deviceq."""
    text = (UNITS / f"{name}.service").read_text()
    assert SHIPPED_BIN in text, name
    copy = folder / f"{name}.service"
    copy.write_text(text.replace(SHIPPED_BIN, str(DEVICEQ)))
    return copy


@pytest.mark.parametrize("name", NAMES)
def test_the_unit_passes_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    assert DEVICEQ.exists(), DEVICEQ
    res = verify(local_copy(name, tmp_path))
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr + res.stdout


def test_verify_refuses_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt setting and a missing binary are both refused."""
    copy = local_copy("deviceq-api", tmp_path)
    copy.write_text(copy.read_text().replace("KillMode=mixed", "KillMode=mixd"))
    res = verify(copy)
    assert res.returncode != 0 and "kill mode" in res.stderr.lower(), res.stderr
    missing = tmp_path / "deviceq-scheduler.service"
    missing.write_text((UNITS / "deviceq-scheduler.service").read_text())  # /opt/... absent
    if not Path(SHIPPED_BIN).exists():
        res = verify(missing)
        assert res.returncode != 0 and SHIPPED_BIN in res.stderr, res.stderr


@pytest.mark.parametrize("name", NAMES)
def test_the_unit_stops_drains_restarts_and_reads_secrets_from_files(name: str) -> None:
    text = (UNITS / f"{name}.service").read_text()
    assert values(text, "KillMode") == ["mixed"]  # SIGTERM to the daemon only
    assert values(text, "Restart") == ["on-failure"]
    assert "2" in values(text, "RestartPreventExitStatus")[0].split()  # usage errors stay down
    assert values(text, "EnvironmentFile") == ["/etc/deviceq/deviceq.env"]
    (exec_start,) = values(text, "ExecStart")
    credentials = {v.split(":", 1)[0] for v in values(text, "LoadCredential")}
    used = set(re.findall(r"%d/([\w.-]+)", exec_start))
    assert used and used == credentials, (used, credentials)
    assert "redis-password" in used
    # no secret on the command line: only options that read a file name one
    words = shlex.split(exec_start)
    for flag in ("--token", "--redis-url", "--api-token"):
        assert flag not in words, flag
    assert not re.search(r"://[^/\s]*:[^/\s]*@", exec_start)


def expanded(exec_start: str, creds: Path, state: Path) -> list[str]:
    """ExecStart's words as systemd would pass them: specifiers, then ``$VAR`` split into words
    (and ``${VAR}`` as one), from the shipped environment file."""
    env = environment_file()
    line = exec_start.replace("%d", str(creds)).replace("%S", str(state)).replace("%%", "%")
    line = line.replace("/etc/deviceq/host.yaml", str(UNITS / "host.yaml"))
    out: list[str] = []
    for word in shlex.split(line):
        whole = re.fullmatch(r"\$(\w+)", word)
        if whole:
            out += env[whole.group(1)].split()
        else:
            out.append(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_command_line_parses_with_the_real_cli(name: str, tmp_path: Path) -> None:
    text = (UNITS / f"{name}.service").read_text()
    creds = tmp_path / "credentials"
    creds.mkdir()
    for value in values(text, "LoadCredential"):
        (creds / value.split(":", 1)[0]).write_text("secret-from-a-file\n")
    (exec_start,) = values(text, "ExecStart")
    argv = expanded(exec_start, creds, tmp_path / "state")
    assert argv[0] == SHIPPED_BIN
    args = argv[1:]
    ctx = check_cli(args)  # raises click.UsageError on an unknown option or a missing file
    path, node = [], ctx
    while node.parent is not None:
        path.insert(0, node.info_name)
        node = node.parent
    assert path == SUBCOMMAND[name], path
    if name == "deviceq-scheduler":
        assert ctx.params["strategy"] == "priority_match"  # the env file's choice is read


def test_the_cli_check_refuses_an_option_the_cli_lacks(tmp_path: Path) -> None:
    import click

    with pytest.raises(click.UsageError):
        check_cli(["scheduler", "run", "--token-file", str(tmp_path / "x")])


def test_the_shipped_host_settings_load(tmp_path: Path) -> None:
    token = tmp_path / "host-token"
    token.write_text("t" * 43 + "\n")
    cfg = load_config_file(str(UNITS / "host.yaml"))
    assert cfg["devices_file"] == "/etc/deviceq/devices.yaml"
    cfg["devices_file"] = str(UNITS / "devices.yaml")  # the shipped example
    settings, read = build_settings({"token_file": str(token)}, cfg)
    assert read == "t" * 43
    assert settings.host_id == "lab-1"
    assert settings.goal_runner.name == "command"
    assert settings.goal_runner.options["template"] == "adb -s {serial} shell sh -c {goal:shell}"
    assert settings.goal_runner.options["infra_exit_codes"] == [75]
    assert [d.device_id for d in settings.devices] == ["board-1"]  # the file read
    assert settings.discover == ("adb",)


def test_the_environment_file_holds_no_secret() -> None:
    env = environment_file()
    assert {"DEVICEQ_REDIS_URL", "DEVICEQ_POOL"} <= set(env)
    assert not any("PASSWORD" in k or "TOKEN" in k for k in env)
    assert "@" not in env["DEVICEQ_REDIS_URL"]
    assert os.path.basename(str(UNITS / "deviceq.env")) == "deviceq.env"
