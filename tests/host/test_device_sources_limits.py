"""A devices file is input like any other: read with the CLI's size cap and parsed with its
nesting guard, so a huge or deeply nested file is one clear error at start (exit 2) and one
warning while the daemon runs (the last good list kept), never a hang or a RecursionError
traceback. Real host and scheduler daemons on real Redis."""

from __future__ import annotations

from pathlib import Path

from deviceq import PoolAdmin, TaskStatus
from deviceq.ops.verify import verify
from harness import Deployment, deviceq, wait_for

DEPTH = 200_000


def deep_yaml(path: Path) -> None:
    path.write_text("[" * DEPTH + "]" * DEPTH + "\n")


def test_a_deep_or_huge_devices_file_at_start_is_one_line_exit_2_and_registers_nothing(
    redis_url: str, pool: str, tmp_path: Path
) -> None:
    deep = tmp_path / "deep.yaml"
    deep_yaml(deep)
    base = ["host", "run", "--host-id", "h1", "--token", "t" * 32, "--command", "true"]
    for path, msg in [
        (str(deep), f"devices file {deep}: nested too deeply to parse"),
        ("/dev/zero", "devices file /dev/zero is larger than 64 MiB: not read"),
    ]:
        out = deviceq(redis_url, pool, *base, "--devices-file", path)
        assert out.returncode == 2, out.stderr
        assert msg in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "RecursionError" not in out.stderr and "Traceback" not in out.stderr
    assert not list(PoolAdmin(redis_url, pool).redis.scan_iter(match=f"dq:{{{pool}}}:*"))


def test_a_devices_file_that_becomes_deep_is_one_warning_and_the_last_good_list_stays(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    f = tmp_path / "devices.yaml"
    f.write_text("- d1:x\n")
    d.scheduler()
    h = d.command_host("h1", extra=("--devices-file", str(f)))
    wait_for(lambda: d.admin.redis.hget(d.admin.keys.device("d1"), "state") == "idle", 20,
             "d1 served")  # fmt: skip
    deep_yaml(f)
    warning = f"devices file {f}: nested too deeply to parse; keeping the last good device list"
    wait_for(lambda: warning in d.log("h1"), 20, "the warning")
    t = d.client.wait(d.client.submit("echo still here", driver_type="x"), timeout=30)
    assert (t.status, t.device_id, t.result) == (TaskStatus.done, "d1", "still here\n")
    log = d.log("h1")
    assert log.count("nested too deeply") == 1, log
    assert "RecursionError" not in log and "Traceback" not in log
    assert h.poll() is None
    assert verify(d.admin).ok
