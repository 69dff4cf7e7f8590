"""Hardening: commands that would lose a secret refuse before they change anything, input
that is too deep or too big is one error line, a host daemon stays bounded under a flood of
control messages, the command runner refuses arguments a remote shell or an option parser
would take as code, the Redis password need not be on the command line, and a bulk submit
cut short by a full queue says which tasks it queued."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from deviceq import Client, PoolAdmin, TaskStatus
from deviceq.cli.task_files import SUBMIT_FILE_CHUNK
from deviceq.core.errors import QueueFull
from deviceq.core.input_files import MAX_INPUT_BYTES
from deviceq.core.keys import Keys
from deviceq.core.redis_server import RedisServer
from deviceq.host.redis_link import CTL_DRAIN
from harness import CLI, REPO_DIR, SRC_DIR, Deployment, deviceq, wait_for


def _one_error_line(stderr: str) -> str:
    """The single ``error: ...`` line a refused command prints (never a traceback)."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


# -- an output file that cannot be written changes nothing -------------------------------------
def test_host_add_to_a_missing_directory_creates_no_host(
    redis_url: str, pool: str, real_r: redis.Redis, tmp_path: Path
) -> None:
    out = deviceq(redis_url, pool, "host", "add", "lab-1", "-o", str(tmp_path / "no" / "f"))
    assert out.returncode == 1, out
    assert "no such directory" in _one_error_line(out.stderr)
    assert out.stdout == ""
    assert PoolAdmin(real_r, pool).hosts() == []
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    out = deviceq(redis_url, pool, "host", "add", "lab-1", "-o", str(not_a_dir / "f"))
    assert out.returncode == 1 and "is not a directory" in _one_error_line(out.stderr)
    assert PoolAdmin(real_r, pool).hosts() == []
    # the same command with a writable path works
    out = deviceq(redis_url, pool, "host", "add", "lab-1", "-o", str(tmp_path / "lab-1.token"))
    assert out.returncode == 0, out.stderr
    assert [h.host_id for h in PoolAdmin(real_r, pool).hosts()] == ["lab-1"]


def test_rotate_token_to_a_missing_directory_keeps_the_old_token(
    redis_url: str, pool: str, real_r: redis.Redis, tmp_path: Path
) -> None:
    admin = PoolAdmin(real_r, pool)
    admin.add_host("lab-1")
    before = real_r.hgetall(admin.keys.host("lab-1"))
    out = deviceq(
        redis_url, pool, "host", "rotate-token", "lab-1", "-o", str(tmp_path / "no" / "f")
    )
    assert out.returncode == 1, out
    assert "no such directory" in _one_error_line(out.stderr)
    assert real_r.hgetall(admin.keys.host("lab-1")) == before
    out = deviceq(redis_url, pool, "host", "rotate-token", "lab-1", "-o", str(tmp_path / "t"))
    assert out.returncode == 0, out.stderr
    assert real_r.hgetall(admin.keys.host("lab-1")) != before


# -- a bulk submit cut short by a full queue says what it queued -------------------------------
def test_submit_many_queue_full_part_way_carries_the_queued_ids(
    real_r: redis.Redis, pool: str
) -> None:
    client = Client(real_r, pool)
    PoolAdmin(real_r, pool).set_config("max_queue_depth", 5)
    with pytest.raises(QueueFull) as info:
        client.submit_many([{"goal": f"g{i}"} for i in range(9)], chunk=2)
    queued = info.value.queued_ids
    assert len(queued) == 4  # two chunks of 2; the third would make 6 > 5
    assert [client.get(t, attempts=False).goal for t in queued] == ["g0", "g1", "g2", "g3"]
    assert real_r.zcard(Keys(pool).status("queued")) == 4
    # a QueueFull from a plain submit carries none
    client.submit("g4")
    with pytest.raises(QueueFull) as one:
        client.submit("g5")
    assert one.value.queued_ids == []


def test_submit_file_prints_the_ids_queued_before_the_queue_filled(
    redis_url: str, pool: str, real_r: redis.Redis, tmp_path: Path
) -> None:
    PoolAdmin(real_r, pool).set_config("max_queue_depth", SUBMIT_FILE_CHUNK + 10)
    lines = [json.dumps({"goal": f"g{i}"}) for i in range(SUBMIT_FILE_CHUNK + 20)]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    out = deviceq(redis_url, pool, "submit", "--file", str(tasks))
    assert out.returncode == 1, out
    line = _one_error_line(out.stderr)
    # the file goes in whole chunks sized by call time: what fitted before the refused one
    got = re.search(rf"\((\d+) of {len(lines)} tasks submitted, ids above\)", line)
    assert "QueueFull" in line and got, line
    printed = out.stdout.split()
    assert 0 < len(printed) == int(got.group(1)) <= SUBMIT_FILE_CHUNK + 10
    queued = {str(t) for t in real_r.zrange(Keys(pool).status("queued"), 0, -1)}
    assert set(printed) == queued


# -- input nested too deeply, or too big, is one error line ------------------------------------
def test_deeply_nested_input_is_one_error_line(
    redis_url: str, pool: str, real_r: redis.Redis, tmp_path: Path
) -> None:
    lines = tmp_path / "tasks.jsonl"
    lines.write_text(json.dumps({"goal": "fine"}) + "\n" + "[" * 100_000 + "\n")
    out = deviceq(redis_url, pool, "submit", "--file", str(lines))
    assert out.returncode == 1, out
    assert "line 2: nested too deeply" in _one_error_line(out.stderr)
    assert out.stdout == ""
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 200_000)
    out = deviceq(redis_url, pool, "workflow", "put", str(deep))
    assert out.returncode == 1, out
    assert "nested too deeply" in _one_error_line(out.stderr)
    out = deviceq(redis_url, pool, "host", "run", "--config", str(deep))
    assert out.returncode == 1, out
    assert "nested too deeply" in _one_error_line(out.stderr)
    block = tmp_path / "block.yaml"  # block style: `- - - ...` lists
    block.write_text("- " * 200_000 + "x\n")
    out = deviceq(redis_url, pool, "workflow", "put", str(block))
    assert out.returncode == 1, out
    assert "nested too deeply" in _one_error_line(out.stderr)
    assert real_r.exists(Keys(pool).workflows, Keys(pool).status("queued")) == 0


def test_submit_file_reads_at_most_its_cap(redis_url: str, pool: str, real_r: redis.Redis) -> None:
    out = deviceq(redis_url, pool, "submit", "--file", "/dev/zero")
    assert out.returncode == 1, out
    assert f"larger than {MAX_INPUT_BYTES // 2**20} MiB" in _one_error_line(out.stderr)
    assert real_r.exists(Keys(pool).status("queued")) == 0


# -- a flood of control messages costs a bounded number of script calls ------------------------
def _script_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("eval", "evalsha"))


def test_a_flood_of_control_messages_does_not_make_a_script_call_each(
    private_redis: RedisServer, pool: str, tmp_path: Path
) -> None:
    """200,000 raw LPUSHes to a host's control list (what any holder of a Redis user can do)
    while the host runs a task: the daemon drains the list with each wake-up and reacts a
    few times a second, so it renews and heartbeats a bounded number of times, not once per
    message. (Leases and heartbeats are slow here, so nearly every call counted is a
    reaction to the flood.)"""
    d = Deployment(private_redis.url, pool, tmp_path)
    try:
        d.configure(lease_ttl=300, host_timeout=120, claim_ttl=60)
        d.scheduler()
        d.command_host("h1", "d1:android")
        tid = d.client.submit("sleep 120", driver_type="android")
        wait_for(lambda: d.status(tid) == TaskStatus.dispatched, 30, "the task running")
        sched = d.procs.pop("scheduler")  # only the host daemon calls scripts from now on
        os.killpg(sched.pid, signal.SIGKILL)
        sched.wait(10)
        ctl = d.admin.keys.host_ctl("h1")
        flood = 200_000
        before = _script_calls(d.r)
        for _ in range(flood // 10_000):
            pipe = d.r.pipeline(transaction=False)
            for _ in range(10_000):
                pipe.lpush(ctl, "x")
            pipe.execute()
        wait_for(lambda: d.r.llen(ctl) == 0, 120, "the daemon draining its control list")
        calls = _script_calls(d.r) - before
        wakes = flood // CTL_DRAIN + 1
        assert calls <= 4 * wakes + 20, calls  # a renew and a heartbeat per reaction
        assert d.alive("h1") and d.status(tid) == TaskStatus.dispatched
        d.client.cancel(tid)  # still acted on at once after the flood
        assert d.client.wait(tid, timeout=30).status == TaskStatus.cancelled
    finally:
        d.close()


# -- the Redis password from a file or the environment, never on a command line ----------------
def _cmdlines_holding(secret: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if secret.encode() in cmdline:
                    found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_the_redis_password_from_a_file_or_the_environment(pool: str, tmp_path: Path) -> None:
    secret = "pw-" + uuid.uuid4().hex
    with RedisServer(password=secret) as server:
        bare = f"redis://127.0.0.1:{server.port}/0"  # no password in the URL
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVICEQ_REDIS_PASS")}
        pw_file = tmp_path / "redis.pw"
        pw_file.write_text(secret + "\n")

        def cli(*args: str, extra_env: dict[str, str] | None = None) -> Any:
            return subprocess.run(
                [*CLI, "--redis-url", bare, "--pool", pool, *args],
                capture_output=True, text=True, timeout=60, env={**env, **(extra_env or {})},
            )  # fmt: skip

        # without it: one line naming the ways to give it
        out = cli("host", "list")
        assert out.returncode == 1 and "--redis-password-file" in _one_error_line(out.stderr)
        # from a file (before or after the command), and from the environment
        out = cli("--redis-password-file", str(pw_file), "host", "add", "h1")
        assert out.returncode == 0, out.stderr
        token = out.stdout.strip()
        out = cli("host", "list", "--json", "--redis-password-file", str(pw_file))
        assert out.returncode == 0 and "h1" in out.stdout, out.stderr
        out = cli("host", "list", "--json", extra_env={"DEVICEQ_REDIS_PASSWORD": secret})
        assert out.returncode == 0 and "h1" in out.stdout, out.stderr
        out = cli("--redis-password-file", str(tmp_path / "nosuch"), "host", "list")
        assert out.returncode == 1
        assert "cannot read the Redis password file" in _one_error_line(out.stderr)
        # a daemon: works with the password from the file, which is on no process's cmdline
        (tmp_path / "h1.token").write_text(token)
        r = redis.Redis(port=server.port, password=secret, decode_responses=True)
        admin = PoolAdmin(r, pool)
        log = open(tmp_path / "h1.log", "ab")  # noqa: SIM115 - closed once the daemon has it
        proc = subprocess.Popen(
            [*CLI, "--redis-url", bare, "--pool", pool, "--redis-password-file", str(pw_file),
             "host", "run", "--host-id", "h1", "--token-file", str(tmp_path / "h1.token"),
             "--device", "d1:android", "--command", "true"],
            env={**env, "PYTHONPATH": os.pathsep.join((SRC_DIR, REPO_DIR))},
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        try:
            wait_for(lambda: proc.poll() is not None or admin.host("h1").alive, 30, "the host")
            assert proc.poll() is None, (tmp_path / "h1.log").read_text()
            assert _cmdlines_holding(secret) == []
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            r.close()
