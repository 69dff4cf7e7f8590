"""Artifacts end to end: real `deviceq host run` and `deviceq scheduler run` daemons on a real
Redis, a command runner writing files into ``$DEVICEQ_ARTIFACTS_DIR``, kept in a file store
or in a real S3 API server (moto's server mode on a loopback port, through s3fs: no mocked
client), recorded in the attempt record by lua/attempt_artifacts.lua."""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceq import TaskStatus
from deviceq.artifacts.records import recorded
from deviceq.artifacts.retention import prune
from deviceq.artifacts.store import ArtifactStore
from deviceq.core.errors import AuthError, ConfigError, InvalidInput
from deviceq.host.redis_link import HostClient
from deviceq.ops.verify import verify
from harness import Deployment, free_port, wait_for
from runner_kinds import KINDS, host_flags

moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

BUCKET = "dq-artifacts"


class S3:
    """moto's S3 API server on a loopback port, stopped and started again at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: Any = None

    def start(self) -> None:
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port)
        self.server.start()
        fs = self.fs()
        if not fs.exists(BUCKET):
            fs.mkdir(BUCKET)

    def stop(self) -> None:
        self.server.stop()
        self.server = None

    def fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(endpoint_url=self.url, skip_instance_cache=True)

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "DEVICEQ_S3_ENDPOINT_URL": self.url}  # fmt: skip


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    server = S3()
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    server.start()
    try:
        yield server
    finally:
        if server.server is not None:
            server.stop()


def artifacts_host(d: Deployment, state: Path, *extra: str, env: dict[str, str] | None = None,
                   name: str | None = None) -> Any:  # fmt: skip
    return d.host("h1", "d1:x", name=name, env=env, extra=(
        "--goal-runner", "command", "--command", "sh -c {goal}", "--state-dir", str(state),
        *extra))  # fmt: skip


def files_left(root: Path, pattern: str) -> bool:
    """Whether any file matching pattern is under root; a folder removed while it is walked
    counts as not yet done (the host removes them as the test looks)."""
    try:
        return any(root.rglob(pattern))
    except FileNotFoundError:
        return True


def record(d: Deployment, tid: str, attempt: int = 1) -> dict[str, Any]:
    raw = d.r.lindex(d.admin.keys.attempts(tid), attempt - 1)
    assert raw is not None
    rec: dict[str, Any] = json.loads(raw)
    return rec


def names(rec: dict[str, Any]) -> set[str]:
    return {f["name"] for f in rec.get("artifacts") or []}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_file_store_round_trip_list_and_download(
    deploy: Deployment, cli: Any, tmp_path: Path
) -> None:
    d = deploy
    state = tmp_path / "state"
    d.scheduler()
    artifacts_host(d, state)
    goal = ('echo hello; mkdir "$DEVICEQ_ARTIFACTS_DIR/logs"; '
            'printf report > "$DEVICEQ_ARTIFACTS_DIR/report.txt"; '
            'printf deep > "$DEVICEQ_ARTIFACTS_DIR/logs/device.log"')  # fmt: skip
    tid = d.client.submit(goal, driver_type="x")
    assert d.client.wait(tid, timeout=30).status == TaskStatus.done
    wait_for(lambda: record(d, tid).get("artifacts"), 30, "artifacts recorded")
    rec = record(d, tid)
    assert names(rec) == {"log.txt", "report.txt", "logs/device.log"}
    assert "artifacts_error" not in rec
    by_name = {f["name"]: f for f in rec["artifacts"]}
    assert by_name["report.txt"] == {"name": "report.txt", "size": 6, "sha256": sha(b"report")}
    store = state / "artifacts" / d.pool / tid / "1"
    assert (store / "logs" / "device.log").read_bytes() == b"deep"
    assert "hello" in (store / "log.txt").read_text()  # the run's output
    # the host's attempt folder is gone once uploaded and recorded
    wait_for(lambda: not files_left(state / d.pool / "h1" / "work", "*.txt"), 10, "cleanup")
    # the CLI: listed (the pool setting names the store), then downloaded and checked
    bad = cli("task", "artifacts", tid, "--download", str(tmp_path / "x"))
    assert bad.exit_code != 0 and "no artifact store" in bad.output
    url = f"file://{state / 'artifacts'}"
    assert cli("config", "set", "artifact_store", url).exit_code == 0
    out = cli("task", "artifacts", tid, "--json")
    assert out.exit_code == 0, out.output
    listed = json.loads(out.stdout)
    assert listed["attempt"] == 1 and {f["name"] for f in listed["artifacts"]} == names(rec)
    into = tmp_path / "down"
    got = cli("task", "artifacts", tid, "--attempt", "1", "--download", str(into))
    assert got.exit_code == 0, got.output
    assert (into / "report.txt").read_bytes() == b"report"
    assert (into / "logs" / "device.log").read_bytes() == b"deep"
    # a file changed in the store no longer matches its recorded sha256: refused
    (store / "report.txt").write_bytes(b"tampered")
    again = cli("task", "artifacts", tid, "--download", str(tmp_path / "down2"))
    assert again.exit_code != 0 and "does not match" in again.output
    assert not (tmp_path / "down2" / "report.txt").exists()
    assert cli("task", "artifacts", "no-such-task").exit_code != 0
    assert verify(d.admin).ok


@pytest.mark.parametrize("kind", KINDS)
def test_log_txt_is_the_whole_log_not_the_tail(
    deploy: Deployment, tmp_path: Path, kind: str
) -> None:
    """The attempt's ``log.txt`` holds every line the run printed (stdout and stderr), far
    more than the task's 8 KiB tail."""
    d = deploy
    state = tmp_path / "state"
    d.scheduler()
    store = f"file://{state / 'artifacts'}"
    artifacts_host(d, state, "--artifact-store", store, *host_flags(kind))
    tid = d.client.submit("seq 1 30000; echo to-stderr >&2", driver_type="x")
    t = d.client.wait(tid, timeout=60)
    assert t.status == TaskStatus.done and len(t.result or "") <= 8192 + 100
    wait_for(lambda: record(d, tid).get("artifacts"), 30, "artifacts recorded")
    whole = (state / "artifacts" / d.pool / tid / "1" / "log.txt").read_text()
    lines = whole.splitlines()
    assert lines[0] == "1" and "30000" in lines and "to-stderr" in lines
    assert len(whole) > 150_000
    assert not list((state / d.pool).rglob("*.log"))  # the host's copy moved, not left


def test_the_live_log_stops_at_log_max_bytes_and_log_txt_keeps_the_rest(
    deploy: Deployment, tmp_path: Path
) -> None:
    """An attempt streams at most the pool's ``log_max_bytes`` to Redis, then one line that
    says so; the whole log (``log.txt``) still has every line."""
    from deviceq.host.log_stream import ENTRY_BYTES

    d = deploy
    d.configure(log_max_bytes=65536)
    state = tmp_path / "state"
    d.scheduler()
    artifacts_host(d, state, "--artifact-store", f"file://{state / 'artifacts'}")
    tid = d.client.submit("seq 1 30000", driver_type="x")
    assert d.client.wait(tid, timeout=60).status == TaskStatus.done
    rows = [f for _, f in d.r.xrange(d.admin.keys.log(tid, 1))]
    out = "".join(f["t"] for f in rows if f["s"] == "stdout")
    assert len(out.encode()) == 65536 and out.startswith("1\n2\n")
    assert all(len(f["t"].encode()) <= ENTRY_BYTES for f in rows)
    assert rows[-1]["s"] == "log" and "the live log stops here: 65,536 bytes" in rows[-1]["t"]
    wait_for(lambda: record(d, tid).get("artifacts"), 30, "artifacts recorded")
    whole = (state / "artifacts" / d.pool / tid / "1" / "log.txt").read_text()
    assert whole.splitlines() == [str(i) for i in range(1, 30001)]


def write_files(task: Any) -> str:
    """A Python goal runner (run by the daemons): writes into ``task.artifacts_dir``."""
    (task.artifacts_dir / "py").mkdir()
    (task.artifacts_dir / "py" / "goal.txt").write_text(task.goal)
    return "written"


async def write_files_async(task: Any) -> str:
    """`write_files` as an async runner (on the host's event loop, or a child's)."""
    return write_files(task)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_python_runner_writes_into_task_artifacts_dir(
    deploy: Deployment, tmp_path: Path, isolation: str, kind: str
) -> None:
    d = deploy
    state = tmp_path / "state"
    d.scheduler()
    runner = "test_artifacts:write_files" + ("_async" if kind == "async" else "")
    d.host("h1", "d1:x", extra=("--goal-runner", runner, "--isolation",
                                isolation, "--state-dir", str(state)))  # fmt: skip
    tid = d.client.submit("from python", driver_type="x")
    assert d.client.wait(tid, timeout=30).status == TaskStatus.done
    wait_for(lambda: record(d, tid).get("artifacts"), 30, "artifacts recorded")
    assert names(record(d, tid)) == {"py/goal.txt", "log.txt"}
    root = state / "artifacts" / d.pool / tid / "1"
    assert (root / "py" / "goal.txt").read_text() == "from python"
    assert (root / "log.txt").read_text() == "written"


def test_escaping_names_are_skipped_and_nothing_lands_outside_the_prefix(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    state = tmp_path / "state"
    secret = tmp_path / "secret.txt"
    secret.write_text("do not upload")
    d.scheduler()
    artifacts_host(d, state)
    goal = (f'echo ran; cd "$DEVICEQ_ARTIFACTS_DIR"; ln -s {secret} leak.txt; '
            f'ln -s {tmp_path} up; ln -s ../../.. parent; printf ok > kept.txt')  # fmt: skip
    tid = d.client.submit(goal, driver_type="x")
    assert d.client.wait(tid, timeout=30).status == TaskStatus.done
    wait_for(lambda: record(d, tid).get("artifacts"), 30, "artifacts recorded")
    rec = record(d, tid)
    assert names(rec) == {"kept.txt", "log.txt"}
    err = rec["artifacts_error"]
    assert "leak.txt (symlink)" in err and "up (symlink)" in err and "parent (symlink)" in err
    root = state / "artifacts"
    written = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert written == [f"{d.pool}/{tid}/1/kept.txt", f"{d.pool}/{tid}/1/log.txt"]
    assert all("do not upload" not in p.read_text() for p in root.rglob("*") if p.is_file())
    # the script refuses a name that escapes (and writes nothing)
    token = (d.tmp / "h1.token").read_text().strip()
    h1 = HostClient(d.r, d.pool, "h1", token)
    before = d.r.lrange(d.admin.keys.attempts(tid), 0, -1)
    for bad in ("../x", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\b"):
        with pytest.raises(InvalidInput):
            h1.record_artifacts(tid, 1, [(bad, 1, "a" * 64)])
    with pytest.raises(InvalidInput):
        h1.record_artifacts(tid, 1, [("x", 1, "a" * 64)] * 2)  # a name twice
    with pytest.raises(InvalidInput):
        h1.record_artifacts(tid, 1, [(f"f{i}", 1, "a" * 64) for i in range(1001)])
    assert d.r.lrange(d.admin.keys.attempts(tid), 0, -1) == before
    assert verify(d.admin).ok


def test_another_host_cannot_record_artifacts_for_this_attempt(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    d.scheduler()
    artifacts_host(d, tmp_path / "state")
    tid = d.client.submit('echo mine > "$DEVICEQ_ARTIFACTS_DIR/mine.txt"', driver_type="x")
    assert d.client.wait(tid, timeout=30).status == TaskStatus.done
    wait_for(lambda: record(d, tid).get("artifacts"), 30, "artifacts recorded")
    before = d.r.lrange(d.admin.keys.attempts(tid), 0, -1)
    other = HostClient(d.r, d.pool, "h2", d.admin.add_host("h2"))
    with pytest.raises(AuthError, match="not run by host h2"):
        other.record_artifacts(tid, 1, [("log.txt", 1, "b" * 64)], "overwritten")
    with pytest.raises(AuthError):  # h1's id with h2's token
        HostClient(d.r, d.pool, "h1", "x" * 32).record_artifacts(tid, 1, [])
    assert d.r.lrange(d.admin.keys.attempts(tid), 0, -1) == before
    assert verify(d.admin).ok


def test_without_a_named_store_a_run_that_wrote_no_file_keeps_nothing(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    state = tmp_path / "state"
    d.scheduler()
    artifacts_host(d, state)
    t1 = d.client.submit("echo only output", driver_type="x")
    assert d.client.wait(t1, timeout=30).status == TaskStatus.done
    t2 = d.client.submit('echo x > "$DEVICEQ_ARTIFACTS_DIR/x.txt"', driver_type="x")
    assert d.client.wait(t2, timeout=30).status == TaskStatus.done
    wait_for(lambda: record(d, t2).get("artifacts"), 30, "artifacts recorded")
    assert "artifacts" not in record(d, t1) and "artifacts_error" not in record(d, t1)
    assert not (state / "artifacts" / d.pool / t1).exists()
    assert not (state / d.pool / "h1" / "work" / t1).exists()  # its folder is gone
    assert verify(d.admin).ok


def test_retention_prunes_in_bounded_batches(deploy: Deployment, cli: Any, tmp_path: Path) -> None:
    d = deploy
    state = tmp_path / "state"
    url = f"file://{state / 'artifacts'}"
    d.scheduler()
    artifacts_host(d, state)
    ids = d.client.submit_many(
        [{"goal": 'echo x > "$DEVICEQ_ARTIFACTS_DIR/x.txt"', "driver_type": "x"}] * 3
    )
    finished = [t.finished_at for t in d.wait_all(ids, 30)]
    for tid in ids:
        wait_for(lambda tid=tid: record(d, tid).get("artifacts"), 30, "artifacts recorded")
    folder = state / "artifacts" / d.pool
    store = ArtifactStore(url)
    # retention 0 (the default): everything is kept
    out = cli("artifacts", "prune", "--artifact-store", url, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {"removed": [], "scanned": 0, "more": False}
    d.admin.set_config("artifact_retention", 60)
    latest = max(f for f in finished if f is not None)
    assert prune(d.admin, store, 2, now_ms=latest).removed == []  # not past it yet
    first = prune(d.admin, store, 2, now_ms=latest + 61_000)
    assert len(first.removed) == 2 and first.more
    second = prune(d.admin, store, 2, now_ms=latest + 61_000)
    assert len(second.removed) == 1 and not second.more
    assert sorted(first.removed + second.removed) == sorted(ids)
    assert not any(folder.iterdir())
    assert verify(d.admin).ok


def get(url: str) -> tuple[int, bytes, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - local test server
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def up(url: str) -> bool:
    try:
        return get(url)[0] == 200
    except urllib.error.URLError:  # not listening yet
        return False


def test_the_dashboard_links_and_streams_only_recorded_files(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    state = tmp_path / "state"
    d.admin.set_config("artifact_store", f"file://{state / 'artifacts'}")
    d.scheduler()
    artifacts_host(d, state)
    port = free_port()
    d.spawn("dash", "dashboard", "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: up(base + "/healthz"), 20, "the dashboard")
    goal = (
        'mkdir "$DEVICEQ_ARTIFACTS_DIR/sub"; '
        'printf "<b>hi</b>" > "$DEVICEQ_ARTIFACTS_DIR/sub/p.html"'
    )
    tid = d.client.submit(goal, driver_type="x")
    assert d.client.wait(tid, timeout=30).status == TaskStatus.done
    wait_for(lambda: record(d, tid).get("artifacts"), 30, "artifacts recorded")
    status, page, _ = get(f"{base}/tasks/{tid}")
    link = f"/tasks/{tid}/artifacts/1/sub/p.html"
    assert status == 200 and link.encode() in page
    status, body, headers = get(base + link)
    assert status == 200 and body == b"<b>hi</b>"
    assert headers["content-type"] == "application/octet-stream"
    assert headers["content-disposition"] == 'attachment; filename="p.html"'
    # a file in the store that the record does not list is not served; nor is anything else
    (state / "artifacts" / d.pool / tid / "1" / "extra.txt").write_text("not recorded")
    for path in (f"/tasks/{tid}/artifacts/1/extra.txt", f"/tasks/{tid}/artifacts/2/sub/p.html",
                 f"/tasks/{tid}/artifacts/1/../../../etc/passwd",
                 f"/tasks/{tid}/artifacts/1/%2e%2e/%2e%2e/x"):  # fmt: skip
        status, body, _ = get(base + path)
        assert status in (400, 404), (path, status)
        assert b"not recorded" not in body and b"root:" not in body


@pytest.mark.slow
def test_s3_round_trip_with_a_50_mb_artifact(
    deploy: Deployment, cli: Any, s3: S3, tmp_path: Path
) -> None:
    d = deploy
    d.scheduler()
    store = f"s3://{BUCKET}/runs"
    artifacts_host(d, tmp_path / "state", "--artifact-store", store, env=s3.env)
    goal = 'head -c 52428800 /dev/urandom > "$DEVICEQ_ARTIFACTS_DIR/big.bin"; echo made'
    tid = d.client.submit(goal, driver_type="x")
    assert d.client.wait(tid, timeout=60).status == TaskStatus.done
    wait_for(lambda: record(d, tid).get("artifacts"), 120, "artifacts recorded")
    rec = record(d, tid)
    big = {f["name"]: f for f in rec["artifacts"]}["big.bin"]
    assert big["size"] == 52428800
    fs = s3.fs()
    key = f"{BUCKET}/runs/{d.pool}/{tid}/1/big.bin"
    assert fs.info(key)["size"] == 52428800
    into = tmp_path / "down"
    got = cli("task", "artifacts", tid, "--artifact-store", store, "--download", str(into))
    assert got.exit_code == 0, got.output
    assert sha((into / "big.bin").read_bytes()) == big["sha256"]
    assert "made" in (into / "log.txt").read_text()
    assert verify(d.admin).ok


@pytest.mark.slow
def test_store_down_then_back_and_a_restart_with_an_upload_pending(
    deploy: Deployment, s3: S3, tmp_path: Path
) -> None:
    """The store goes down: the task is still done, the attempt records the failure and the
    upload lands once the store is back. Then, with another upload pending, the host is
    SIGKILLed: the restarted daemon uploads it from its spool."""
    d = deploy
    d.scheduler()
    state = tmp_path / "state"
    store = f"s3://{BUCKET}/p"
    host = artifacts_host(d, state, "--artifact-store", store, env=s3.env)
    s3.stop()
    t1 = d.client.submit('printf one > "$DEVICEQ_ARTIFACTS_DIR/one.txt"', driver_type="x")
    assert d.client.wait(t1, timeout=30).status == TaskStatus.done
    wait_for(lambda: record(d, t1).get("artifacts_error"), 60, "the upload failure recorded")
    assert "upload failed" in record(d, t1)["artifacts_error"]
    assert "artifacts" not in record(d, t1)
    s3.start()
    wait_for(lambda: record(d, t1).get("artifacts"), 60, "the retried upload recorded")
    assert "artifacts_error" not in record(d, t1)
    assert s3.fs().cat(f"{BUCKET}/p/{d.pool}/{t1}/1/one.txt") == b"one"
    # down again; an upload pending in the spool when the daemon is killed
    s3.stop()
    t2 = d.client.submit('printf two > "$DEVICEQ_ARTIFACTS_DIR/two.txt"', driver_type="x")
    assert d.client.wait(t2, timeout=30).status == TaskStatus.done
    wait_for(lambda: record(d, t2).get("artifacts_error"), 60, "the upload failure recorded")
    assert list((state / d.pool / "h1" / "spool").glob("*.json")), "nothing spooled"
    host.send_signal(signal.SIGKILL)
    host.wait(10)
    s3.start()
    artifacts_host(d, state, "--artifact-store", store, env=s3.env, name="h1-again")
    wait_for(lambda: record(d, t2).get("artifacts"), 60, "the restarted daemon's upload")
    assert names(record(d, t2)) == {"two.txt"}  # (no output: no log.txt)
    assert "artifacts_error" not in record(d, t2)
    assert s3.fs().cat(f"{BUCKET}/p/{d.pool}/{t2}/1/two.txt") == b"two"
    wait_for(lambda: not list((state / d.pool / "h1" / "spool").glob("*.json")), 10, "spool")
    assert recorded(d.admin, t2).files[0]["sha256"] == sha(b"two")
    assert verify(d.admin).ok


def test_a_bad_store_url_or_option_is_refused_in_one_line_before_anything_starts(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    cases = [("--artifact-store", "ftp://x/y"), ("--artifact-store", "file://../x"),
             ("--artifact-store-option", "no-equals")]  # fmt: skip
    for i, (opt, value) in enumerate(cases):
        proc = artifacts_host(d, tmp_path / "s", opt, value, name=f"bad-{i}")
        assert proc.wait(30) == 2
        assert value in d.log(f"bad-{i}") and "Traceback" not in d.log(f"bad-{i}")
    assert not d.r.exists(d.admin.keys.attempts("x"))
    assert d.admin.host("h1").alive is False


def test_an_s3_store_without_s3fs_installed_is_one_clear_line(
    cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """(sys.modules holding None: what Python does for a package that is not installed.)"""
    monkeypatch.setitem(sys.modules, "s3fs", None)
    token = tmp_path / "t"
    token.write_text("x" * 32)
    res = cli("host", "run", "--host-id", "h1", "--token-file", str(token), "--device", "d1:x",
              "--command", "true", "--artifact-store", "s3://bucket/prefix")  # fmt: skip
    assert res.exit_code == 2
    assert "needs s3fs: pip install 'deviceq[artifacts]'" in res.output
    assert "Traceback" not in res.output
    with pytest.raises(ConfigError, match="needs s3fs"):
        _ = ArtifactStore("s3://bucket/prefix").fs


def test_a_folder_or_whole_log_left_by_a_run_that_died_is_replaced_not_reused(
    tmp_path: Path,
) -> None:
    """A host killed mid-run leaves the attempt's folder and whole log on its disk; the next
    run of that attempt on the host starts from an empty folder and a fresh whole log."""
    from deviceq.host.artifacts import whole_log
    from deviceq.host.log_stream import LogStreamer, RunLog
    from deviceq.host.runners.base import Task

    folder = tmp_path / "work" / "t1" / "1"
    folder.mkdir(parents=True)
    (folder / "stale.txt").write_text("from the run that died\n")
    whole = whole_log(folder)
    assert whole is not None
    whole.write_text("old output\n")

    task = Task(goal="g", task_id="t1", device_id="d1", driver_type="x")
    task.artifacts_path = folder
    made = task.artifacts_dir
    assert made == folder and list(folder.iterdir()) == []

    class Sink:
        def log_append(self, chunks: Any) -> list[str]:
            return ["ok"] * len(chunks)

    streamer = LogStreamer(Sink())
    log = streamer.open("t1", "lease", whole)
    assert isinstance(log, RunLog) and not log.wrote
    log.write("stdout", "new line\n")
    streamer.close(log, wait=2.0)
    streamer.stop()
    assert log.wrote
    assert whole.read_text() == "new line\n"
