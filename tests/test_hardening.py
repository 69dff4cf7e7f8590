"""Hardening: commands that would lose a secret refuse before they change anything, input
that is too deep or too big is one error line, a host daemon stays bounded under a flood of
control messages, the command runner refuses arguments a remote shell or an option parser
would take as code, the Redis password need not be on the command line, and a bulk submit
cut short by a full queue says which tasks it queued."""

from __future__ import annotations

from pathlib import Path

import redis

from deviceq import PoolAdmin
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
