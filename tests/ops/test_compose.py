"""docker-compose.yml and the Dockerfile: structure (services, AOF, noeviction, a Redis password
used by every service, one token volume per host, ordering), every deviceq command in them
valid against the CLI, `docker compose config` when a compose client is installed, and the
whole stack run as local processes (no Docker engine needed) against a private,
password-protected redis-server: token one-shots, init, scheduler with metrics, two hosts,
producer."""

from __future__ import annotations

import json
import os
import re
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
import redis
import yaml

from cli_check import check_cli
from cli_check import deviceq_invocations as calls_in
from deviceq import Client
from deviceq.core.redis_server import RedisServer
from harness import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
HOSTS = ("host-1", "host-2")
DEVICEQ_SERVICES = (
    "token-host-1",
    "token-host-2",
    "init",
    "scheduler",
    "host-1",
    "host-2",
    "producer",
    "dashboard",
    "api",
)
PASSWORD_VAR = "DEVICEQ_REDIS_PASSWORD"


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution (``${VAR}``, ``${VAR:?error}``, ``${VAR:-default}``,
    ``$$``) for the values this file uses."""

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        value = env.get(name, "")
        if op == ":?" and not value:
            raise KeyError(f"{name}: {arg}")
        return value or (arg if op == ":-" else "")

    out = re.sub(r"\$\{(\w+)(?:(:[?-])([^}]*))?\}", sub, text.replace("$$", "\0"))
    return out.replace("\0", "$")


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
    return [call for line in script.splitlines() for call in calls_in(line, "host-1")]


def service_invocations(svc: dict[str, Any]) -> list[list[str]]:
    if is_shell(svc):
        return deviceq_invocations(shell_script(svc))
    assert "entrypoint" not in svc  # the image's entrypoint: deviceq
    return [[str(a) for a in svc["command"]]]


def test_the_command_checker_catches_mistakes() -> None:
    assert check_cli(["scheduler", "run", "--metrics-port", "9108"]).params["metrics_port"] == 9108
    for bad in (
        ["schedular", "run"],
        ["scheduler", "run", "--metrics-prt", "1"],
        ["scheduler", "run", "--metrics-port", "x"],
        ["submit", "a", "b"],
    ):
        with pytest.raises(click.UsageError):
            check_cli(bad)
    assert deviceq_invocations(
        'deviceq host add "$h" > "/t/$h.new" || deviceq a b\necho x | deviceq c --d'
    ) == [["host", "add", "host-1"], ["a", "b"], ["c", "--d"]]


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
    # a password, required (no default), the same one in Redis, its health check and every URL
    password = opts["--requirepass"]
    assert re.fullmatch(rf"\$\{{{PASSWORD_VAR}:\?[^}}]+\}}", password), password
    assert services["redis"]["environment"]["REDISCLI_AUTH"] == password
    with pytest.raises(KeyError, match=PASSWORD_VAR):
        interpolate(password, {})
    for name in DEVICEQ_SERVICES:
        svc = services[name]
        assert svc["build"] == "." and svc["image"] == "deviceq:local", name
        assert svc["environment"]["DEVICEQ_REDIS_URL"] == f"redis://:{password}@redis:6379/0"
        assert svc["environment"]["DEVICEQ_POOL"] == "demo", name
    # one-shots run once; a host starts only once its own token exists
    for name in ("init", "producer", "token-host-1", "token-host-2"):
        assert services[name]["restart"] == "no"
    for host in HOSTS:
        deps = services[host]["depends_on"]
        assert deps[f"token-{host}"]["condition"] == "service_completed_successfully"
        assert deps["redis"]["condition"] == "service_healthy"
        assert services[host]["stop_signal"] == "SIGTERM"  # the daemon drains on SIGTERM
        assert services[f"token-{host}"]["depends_on"]["redis"]["condition"] == "service_healthy"
    # one token volume per host: written by its one-shot, read (only) by that host
    token_mounts = {
        name: [v for v in svc.get("volumes", []) if "token" in v.split(":")[0]]
        for name, svc in services.items()
    }
    assert token_mounts == {
        "redis": [],
        "init": [],
        "scheduler": [],
        "producer": [],
        "dashboard": [],
        "api": [],
        "token-host-1": ["host-1-token:/tokens"],
        "token-host-2": ["host-2-token:/tokens"],
        "host-1": ["host-1-token:/tokens:ro"],
        "host-2": ["host-2-token:/tokens:ro"],
    }
    assert services["init"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert set(compose["volumes"]) == {"redis-data", "host-1-token", "host-2-token"}
    # metrics: every interface of the container, published on the Docker host's loopback only
    assert services["scheduler"]["ports"] == ["127.0.0.1:9108:9108"]
    assert services["dashboard"]["ports"] == ["127.0.0.1:8180:8180"]
    assert services["api"]["ports"] == ["127.0.0.1:8300:8300"]
    for name in ("dashboard", "api"):
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        assert services[name]["restart"] == "unless-stopped"


def test_every_deviceq_command_is_valid_against_the_cli(compose: dict[str, Any]) -> None:
    seen: dict[str, list[list[str]]] = {}
    for name in DEVICEQ_SERVICES:
        calls = service_invocations(compose["services"][name])
        assert calls, name
        for args in calls:
            check_cli(args)
        seen[name] = calls
    assert seen["scheduler"] == [
        ["scheduler", "run", "--metrics-port", "9108", "--metrics-host", "0.0.0.0"]
    ]
    for host_id in HOSTS:
        (args,) = seen[host_id]
        params = check_cli(args).params
        assert params["host_id"] == host_id
        assert params["token_file"] == (f"/tokens/{host_id}.token",)
        assert params["goal_runner"] == "sim" and len(params["devices"]) >= 2
        assert all(len(d.split(":")) == 3 for d in params["devices"])
        assert seen[f"token-{host_id}"] == [
            ["host", "add", host_id],
            ["host", "rotate-token", host_id],
        ]
    assert [c[:2] for c in seen["init"]] == [["workflow", "put"]]
    assert seen["dashboard"] == [["dashboard", "--host", "0.0.0.0", "--port", "8180"]]
    assert seen["api"] == [["api", "--host", "0.0.0.0", "--port", "8300"]]
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
    env = {**os.environ, PASSWORD_VAR: "0123abcd" * 8}
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, text=True)
        if probe.returncode != 0:
            continue
        res = subprocess.run(
            [*cmd, "-f", str(COMPOSE), "config", "-q"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
        )
        assert res.returncode == 0, res.stderr
        # without the password the file is refused (no default password)
        no_pw = {k: v for k, v in env.items() if k != PASSWORD_VAR}
        res = subprocess.run(
            [*cmd, "-f", str(COMPOSE), "config", "-q"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=no_pw,
        )
        assert res.returncode != 0 and PASSWORD_VAR in res.stderr, res.stderr
        broken = tmp_path / "docker-compose.yml"
        broken.write_text(COMPOSE.read_text().replace("services:", "servicez:", 1))
        res = subprocess.run(
            [*cmd, "-f", str(broken), "config", "-q"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        assert res.returncode != 0  # the validator does reject a bad file
        return
    assert yaml.safe_load(COMPOSE.read_text())["services"]


# -- the stack, as local processes -------------------------------------------------------------
@pytest.mark.slow
def test_the_stack_runs_as_local_processes(
    compose: dict[str, Any], pool: str, tmp_path: Path
) -> None:
    services = compose["services"]
    password = "0123abcd" * 8
    # Redis with the compose file's password (the value of its --requirepass)
    opts = [str(x) for x in services["redis"]["command"]]
    requirepass = interpolate(opts[opts.index("--requirepass") + 1], {PASSWORD_VAR: password})
    server = RedisServer(password=requirepass).start()
    bindir = str(Path(sys.executable).parent)
    # every service's URL as the file writes it, with the container name redis:6379 mapped
    url_of = {
        name: interpolate(
            services[name]["environment"]["DEVICEQ_REDIS_URL"], {PASSWORD_VAR: password}
        ).replace("@redis:6379/", f"@127.0.0.1:{server.port}/")
        for name in DEVICEQ_SERVICES
    }
    assert len(set(url_of.values())) == 1
    redis_url = url_of["scheduler"]
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "DEVICEQ_REDIS_URL": redis_url,
        "DEVICEQ_POOL": pool,
        "DEVICEQ_LOG_FORMAT": services["scheduler"]["environment"]["DEVICEQ_LOG_FORMAT"],
    }
    deviceq = shutil.which("deviceq", path=env["PATH"])
    assert deviceq
    # a volume per token: each service's /tokens is the directory of the volume it mounts
    volumes = {v: tmp_path / v for v in ("host-1-token", "host-2-token")}
    for d in volumes.values():
        d.mkdir()

    def local(name: str, text: str) -> str:  # the container's /tokens and /tmp, here
        mounts = [v.split(":") for v in services[name].get("volumes", [])]
        tokens = next((str(volumes[m[0]]) for m in mounts if m[1] == "/tokens"), "/nonexistent")
        dirs = {"tokens": tokens, "tmp": str(tmp_path)}
        return re.sub(r"(?<![\w/.-])/(tokens|tmp)/", lambda m: dirs[m.group(1)] + "/", text)

    def run_shell(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-ec", local(name, shell_script(services[name]))],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    try:
        with pytest.raises(redis.AuthenticationError):  # the password is in force
            redis.Redis(port=server.port).ping()
        without = subprocess.run(
            [deviceq, "status"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "DEVICEQ_REDIS_URL": f"redis://127.0.0.1:{server.port}/0"},
        )
        assert without.returncode == 1 and "requires a password" in without.stderr
        assert len(without.stderr.strip().splitlines()) == 1
        for name in ("token-host-1", "token-host-2", "init"):
            res = run_shell(name)
            assert res.returncode == 0, res.stderr
        # each host's volume holds its own token and nothing else, readable by its owner only
        for host in HOSTS:
            (token,) = volumes[f"{host}-token"].iterdir()
            assert token.name == f"{host}.token"
            assert token.stat().st_mode & 0o077 == 0
        again = run_shell("token-host-1")  # re-running a token one-shot rotates instead of failing
        assert again.returncode == 0, again.stderr
        _run_stack(services, env, deviceq, local, run_shell, redis_url, pool, tmp_path)
    finally:
        server.stop()


def _run_stack(
    services: dict[str, Any],
    env: dict[str, str],
    deviceq: str,
    local: Any,
    run_shell: Any,
    redis_url: str,
    pool: str,
    tmp_path: Path,
) -> None:
    port = free_port()
    web_ports = {"dashboard": free_port(), "api": free_port()}
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        started = ("scheduler", "host-1", "host-2", "dashboard", "api")
        for name in started:
            args = [local(name, str(a)) for a in services[name]["command"]]
            if name == "scheduler":
                args[args.index("--metrics-port") + 1] = str(port)
                args[args.index("--metrics-host") + 1] = "127.0.0.1"  # not every interface here
            if name in web_ports:
                args[args.index("--port") + 1] = str(web_ports[name])
                args[args.index("--host") + 1] = "127.0.0.1"
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115
            logs.append(log)
            procs.append(
                subprocess.Popen([deviceq, *args], env=env, stdout=log, stderr=subprocess.STDOUT)
            )
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
        status = subprocess.run(
            [deviceq, "status", "--json"], env=env, capture_output=True, text=True, timeout=30
        )
        data = json.loads(status.stdout)
        assert {h["host_id"]: h["alive"] for h in data["hosts"]} == {"host-1": True, "host-2": True}
        assert data["devices"]["total"] == 5
        # the dashboard shows the pool's hosts; the API describes itself without a token
        page = _get(f"http://127.0.0.1:{web_ports['dashboard']}/", 30)
        assert "host-1" in page and "host-2" in page
        spec = json.loads(_get(f"http://127.0.0.1:{web_ports['api']}/api/v1/openapi.json", 30))
        assert spec["openapi"].startswith("3.")
        for p in procs:  # what `docker compose stop` sends
            p.send_signal(signal.SIGTERM)
        for p, name in zip(procs, started, strict=True):
            # uvicorn shuts down cleanly, then re-raises the signal it caught
            assert p.wait(30) in ((0, -signal.SIGTERM) if name in web_ports else (0,)), name
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for log in logs:
            log.close()


def _get(url: str, wait: float) -> str:
    """The body of a GET of ``url``, retried until the server listens (at most ``wait`` s)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
