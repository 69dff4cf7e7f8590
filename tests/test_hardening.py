"""Hardening: commands that would lose a secret refuse before they change anything, input
that is too deep or too big is one error line, a host daemon stays bounded under a flood of
control messages, the command runner refuses arguments a remote shell or an option parser
would take as code, the Redis password need not be on the command line, and a bulk submit
cut short by a full queue says which tasks it queued."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from deviceq import Client, PoolAdmin
from deviceq.cli.app import MAX_INPUT_BYTES
from deviceq.cli.ops_cmds import SUBMIT_FILE_CHUNK
from deviceq.core.errors import QueueFull
from deviceq.core.keys import Keys
from harness import deviceq


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
    assert "QueueFull" in line and f"{SUBMIT_FILE_CHUNK} of {len(lines)}" in line
    printed = out.stdout.split()
    assert len(printed) == SUBMIT_FILE_CHUNK
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
