"""docker-compose.yml and the Dockerfile: structure (services, AOF, noeviction, ordering), every
deviceq command in them valid against the CLI, `docker compose config` when a compose client is
installed, and the whole stack run as local processes (no Docker engine needed) against a
private redis-server: init, scheduler with metrics, two hosts, producer."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from deviceq import Client
from deviceq.cli import main
from deviceq.embedded import free_port

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DEVICEQ_SERVICES = ("init", "scheduler", "host-1", "host-2", "producer")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


# -- reading the services' commands ------------------------------------------------------------
def is_shell(svc: dict[str, Any]) -> bool:
    return svc.get("entrypoint") in (["sh", "-ec"], ["sh", "-c"])


def shell_script(svc: dict[str, Any]) -> str:
    (script,) = svc["command"]
    return str(script).replace("$$", "$")  # compose's escape for a literal $


def deviceq_invocations(script: str) -> list[list[str]]:
    """The argument lists of every `deviceq ...` call in a shell script (redirections and
    shell variables resolved to sample values)."""
    out = []
    for line in script.splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        seg: list[str] = []
        for tok in [*lex, ";"]:
            if tok in ("&&", "||", ";", "|", "&"):
                if seg and seg[0] == "deviceq":
                    out.append(strip_redirections(seg[1:]))
                seg = []
            else:
                seg.append(re.sub(r"\$\{?(\w+)\}?", "host-1", tok))
    return out


def strip_redirections(tokens: list[str]) -> list[str]:
    out, skip = [], False
    for tok in tokens:
        if skip:
            skip = False
        elif tok in (">", ">>", "<", "2>"):
            skip = True
        else:
            out.append(tok)
    return out


def service_invocations(svc: dict[str, Any]) -> list[list[str]]:
    if is_shell(svc):
        return deviceq_invocations(shell_script(svc))
    assert "entrypoint" not in svc  # the image's entrypoint: deviceq
    return [[str(a) for a in svc["command"]]]


def check_cli(args: list[str]) -> click.Context:
    """Parse ``deviceq ARGS`` as the CLI would, without running it: unknown commands, unknown
    options, bad values and missing arguments raise click.UsageError."""

    def rest_of(c: click.Context) -> list[str]:
        return [*getattr(c, "_protected_args", []), *c.args]

    ctx = main.make_context("deviceq", list(args))
    cmd: click.Command = main
    rest = rest_of(ctx)
    while isinstance(cmd, click.Group):
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        cmd, rest = sub, rest_of(ctx)
    assert not ctx.args, f"extra arguments {ctx.args}"
    return ctx


def test_the_command_checker_catches_mistakes() -> None:
    assert check_cli(["scheduler", "run", "--metrics-port", "9108"]).params["metrics_port"] == 9108
    for bad in (["schedular", "run"], ["scheduler", "run", "--metrics-prt", "1"],
                ["scheduler", "run", "--metrics-port", "x"], ["submit", "a", "b"]):
        with pytest.raises(click.UsageError):
            check_cli(bad)
    assert deviceq_invocations('deviceq host add "$h" > "/t/$h.new" || deviceq a b\n'
                               "echo x | deviceq c --d") == [
        ["host", "add", "host-1"], ["a", "b"], ["c", "--d"]]


# -- structure ---------------------------------------------------------------------------------
def test_services_and_durability_settings(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"redis", *DEVICEQ_SERVICES}
    redis_cmd = [str(x) for x in services["redis"]["command"]]
    assert redis_cmd[0] == "redis-server"
    opts = dict(zip(redis_cmd[1::2], redis_cmd[2::2], strict=True))
    assert opts["--appendonly"] == "yes"
    assert opts["--maxmemory-policy"] == "noeviction"
    assert opts["--appendfsync"] in ("everysec", "always")
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    assert services["redis"]["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]
    for name in DEVICEQ_SERVICES:
        svc = services[name]
        assert svc["build"] == "." and svc["image"] == "deviceq:local", name
        assert svc["environment"]["DEVICEQ_REDIS_URL"] == "redis://redis:6379/0", name
        assert svc["environment"]["DEVICEQ_POOL"] == "demo", name
    # one-shots run once; hosts start only once init has written their tokens
    for name in ("init", "producer"):
        assert services[name]["restart"] == "no"
    for name in ("host-1", "host-2"):
        deps = services[name]["depends_on"]
        assert deps["init"]["condition"] == "service_completed_successfully"
        assert deps["redis"]["condition"] == "service_healthy"
        assert "tokens:/tokens:ro" in services[name]["volumes"]
        assert services[name]["stop_signal"] == "SIGTERM"  # the daemon drains on SIGTERM
    assert services["init"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "tokens:/tokens" in services["init"]["volumes"]
    assert set(compose["volumes"]) == {"redis-data", "tokens"}
    assert services["scheduler"]["ports"] == ["9108:9108"]


def test_every_deviceq_command_is_valid_against_the_cli(compose: dict[str, Any]) -> None:
    seen: dict[str, list[list[str]]] = {}
    for name in DEVICEQ_SERVICES:
        calls = service_invocations(compose["services"][name])
        assert calls, name
        for args in calls:
            check_cli(args)
        seen[name] = calls
    assert seen["scheduler"] == [["scheduler", "run", "--metrics-port", "9108"]]
    for host_id in ("host-1", "host-2"):
        (args,) = seen[host_id]
        params = check_cli(args).params
        assert params["host_id"] == host_id
        assert params["token_file"] == f"/tokens/{host_id}.token"
        assert params["goal_runner"] == "sim" and len(params["devices"]) >= 2
        assert all(len(d.split(":")) == 3 for d in params["devices"])
    assert [c[:2] for c in seen["init"]] == [["host", "add"], ["host", "rotate-token"],
                                             ["workflow", "put"]]
    assert ["submit", "--file", "/tmp/tasks.jsonl"] in seen["producer"]


def test_dockerfile_builds_the_package_with_deviceq_as_entrypoint() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.1[1-9]", text, re.M)
    for needed in ("pyproject.toml", "README.md", "lua", "src"):
        assert re.search(rf"^COPY .*\b{re.escape(needed)}\b", text, re.M), needed
        assert (ROOT / needed).exists(), needed
    assert "pip install ." in text
    assert re.search(r'^ENTRYPOINT \["deviceq"\]', text, re.M)
    assert re.search(r"^USER (?!root)", text, re.M)


def test_compose_config_validates(tmp_path: Path) -> None:
    """`docker compose config -q` with the compose plugin, else the standalone docker-compose;
    with neither installed (no Docker here) the structural tests above are what checks it."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, text=True)
        if probe.returncode != 0:
            continue
        res = subprocess.run([*cmd, "-f", str(COMPOSE), "config", "-q"], capture_output=True,
                             text=True, cwd=ROOT)
        assert res.returncode == 0, res.stderr
        broken = tmp_path / "docker-compose.yml"
        broken.write_text(COMPOSE.read_text().replace("services:", "servicez:", 1))
        res = subprocess.run([*cmd, "-f", str(broken), "config", "-q"], capture_output=True,
                             text=True, cwd=tmp_path)
        assert res.returncode != 0  # the validator does reject a bad file
        return
    assert yaml.safe_load(COMPOSE.read_text())["services"]


# -- the stack, as local processes -------------------------------------------------------------
@pytest.mark.slow
def test_the_stack_runs_as_local_processes(compose: dict[str, Any], redis_url: str, pool: str,
                                           tmp_path: Path) -> None:
    services = compose["services"]
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "DEVICEQ_REDIS_URL": redis_url, "DEVICEQ_POOL": pool,
           "DEVICEQ_LOG_FORMAT": services["scheduler"]["environment"]["DEVICEQ_LOG_FORMAT"]}
    deviceq = shutil.which("deviceq", path=env["PATH"])
    assert deviceq

    def local(text: str) -> str:  # the containers' /tokens and /tmp, here
        dirs = {"tokens": str(tokens), "tmp": str(tmp_path)}
        return re.sub(r"(?<![\w/.-])/(tokens|tmp)/", lambda m: dirs[m.group(1)] + "/", text)

    def script(name: str) -> str:
        return local(shell_script(services[name]))

    def run_shell(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-ec", script(name)], env=env, capture_output=True,
                              text=True, timeout=120)

    init = run_shell("init")
    assert init.returncode == 0, init.stderr
    assert sorted(p.name for p in tokens.iterdir()) == ["host-1.token", "host-2.token"]
    again = run_shell("init")  # re-running init rotates the tokens instead of failing
    assert again.returncode == 0, again.stderr

    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for name in ("scheduler", "host-1", "host-2"):
            args = [str(a) for a in services[name]["command"]]
            args = [local(a) for a in args]
            if name == "scheduler":
                args[args.index("--metrics-port") + 1] = str(port)
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115
            logs.append(log)
            procs.append(subprocess.Popen([deviceq, *args], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
        producer = run_shell("producer")
        assert producer.returncode == 0, producer.stderr
        ids = [line for line in producer.stdout.splitlines() if re.fullmatch(r"[0-9a-f]{16}", line)]
        assert len(ids) == 61  # 60 from the JSONL file, one workflow task

        client = Client(redis_url, pool)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            counts = client.counts()
            if counts["done"] + counts["failed"] == 61:
                break
            assert all(p.poll() is None for p in procs), "a service died"
            time.sleep(0.2)
        counts = client.counts()
        assert counts["done"] + counts["failed"] == 61, counts
        assert counts["done"] > 40  # 5% simulated failures (attempts are not retried on failure)
        wf = [t for t in client.get_many(ids) if t.kind == "workflow"]
        assert len(wf) == 1 and wf[0].device_id in ("pixel-1", "galaxy-1")  # needs camera

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assigned = re.search(rf'deviceq_assignments_total{{pool="{pool}"}} (\S+)', text)
        assert assigned and float(assigned.group(1)) >= 61
        assert f'deviceq_leader{{pool="{pool}"}} 1.0' in text
        status = subprocess.run([deviceq, "status", "--json"], env=env, capture_output=True,
                                text=True, timeout=30)
        data = json.loads(status.stdout)
        assert {h["host_id"]: h["alive"] for h in data["hosts"]} == {"host-1": True,
                                                                       "host-2": True}
        assert data["devices"]["total"] == 5
        for p in procs:  # what `docker compose stop` sends
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for log in logs:
            log.close()
