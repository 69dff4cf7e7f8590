"""An artifact is served only as the bytes its attempt recorded: real scheduler and host
daemons run a task that keeps files in a real ``file://`` store; a real ``deviceq api`` and a
real ``deviceq dashboard`` serve them; the store is then changed behind their back (a file
rewritten, a link put in place of a file or a folder), and a record lists both a folder and a
file inside it (``deviceq task artifacts --download`` as a real process, direct and through
the API)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
from pathlib import Path

import pytest
from test_api_logs_artifacts import get, via_api
from test_api_server import Api, start_api
from test_artifacts import artifacts_host, record, sha
from test_forwarded_addresses import start_dashboard

from deviceq import TaskStatus
from deviceq.api.tokens import TokenStore
from deviceq.host.redis_link import HostClient
from harness import Deployment, deviceq, wait_for


@pytest.fixture
def api(deploy: Deployment) -> Api:
    token = TokenStore(deploy.r, deploy.client.keys).add("tester", "producer")
    return Api(start_api(deploy, "api", "--max-wait", "3"), token)


def dashboard_get(base: str, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_changed_file_a_link_or_a_folder_in_the_store_is_never_served(
    deploy: Deployment, api: Api, tmp_path: Path
) -> None:
    d = deploy
    state = tmp_path / "state"
    d.admin.set_config("artifact_store", f"file://{state / 'artifacts'}")
    d.scheduler()
    artifacts_host(d, state)
    goal = ('mkdir "$DEVICEQ_ARTIFACTS_DIR/logs"; '
            'printf report > "$DEVICEQ_ARTIFACTS_DIR/report.txt"; '
            'printf deep > "$DEVICEQ_ARTIFACTS_DIR/logs/device.log"')  # fmt: skip
    tid = d.client.submit(goal, driver_type="x")
    assert d.client.wait(tid, timeout=60).status == TaskStatus.done
    wait_for(lambda: record(d, tid).get("artifacts"), 30, "artifacts recorded")
    dash = start_dashboard(d, "dash")
    folder = state / "artifacts" / d.pool / tid / "1"
    # as uploaded: served, with the recorded sha256 and length
    status, raw, headers = get(api, f"/tasks/{tid}/artifacts/1/report.txt")
    assert (status, raw, headers["x-deviceq-sha256"]) == (200, b"report", sha(b"report"))
    assert headers["content-length"] == "6"
    assert dashboard_get(dash, f"/tasks/{tid}/artifacts/1/report.txt") == (200, b"report")

    # rewritten in the store after upload (same size): refused, none of its bytes sent
    (folder / "report.txt").write_bytes(b"REPORT")
    status, raw, headers = get(api, f"/tasks/{tid}/artifacts/1/report.txt")
    assert status == 409 and b"REPORT" not in raw, raw
    body = json.loads(raw)
    assert body["error"]["code"] == "CORRUPT" and "does not match" in body["error"]["message"]
    assert "x-deviceq-sha256" not in headers
    status, raw = dashboard_get(dash, f"/tasks/{tid}/artifacts/1/report.txt")
    assert status == 409 and b"REPORT" not in raw
    (folder / "report.txt").write_bytes(b"report and more")  # longer
    assert get(api, f"/tasks/{tid}/artifacts/1/report.txt")[0] == 409
    (folder / "report.txt").write_bytes(b"report")

    # a link in place of the file, to a file with the very bytes recorded: still refused
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "device.log").write_bytes(b"deep")
    (folder / "logs" / "device.log").unlink()
    (folder / "logs" / "device.log").symlink_to(outside / "device.log")
    for status, raw in (
        get(api, f"/tasks/{tid}/artifacts/1/logs/device.log")[:2],
        dashboard_get(dash, f"/tasks/{tid}/artifacts/1/logs/device.log"),
    ):
        assert status == 409 and b"deep" not in raw and b"link" in raw, raw
        assert str(outside).encode() not in raw
    # a link in place of a folder on the way
    shutil.rmtree(folder / "logs")
    (folder / "logs").symlink_to(outside)
    status, raw, _ = get(api, f"/tasks/{tid}/artifacts/1/logs/device.log")
    assert status == 409 and b"deep" not in raw, raw
    assert dashboard_get(dash, f"/tasks/{tid}/artifacts/1/logs/device.log")[0] == 409
    (folder / "logs").unlink()
    (folder / "logs").mkdir()
    (folder / "logs" / "device.log").write_bytes(b"deep")
    assert get(api, f"/tasks/{tid}/artifacts/1/logs/device.log")[:2] == (200, b"deep")

    # a record naming a folder and a file inside it: the folder is refused on its own line,
    # the other files are still downloaded
    h1 = HostClient(d.r, d.pool, "h1", (d.tmp / "h1.token").read_text().strip())
    h1.record_artifacts(tid, 1, [("logs", 4, sha(b"deep")), ("logs/device.log", 4, sha(b"deep")),
                                 ("report.txt", 6, sha(b"report"))])  # fmt: skip
    status, raw, _ = get(api, f"/tasks/{tid}/artifacts/1/logs")
    assert status == 409 and b"folder" in raw, raw
    status, raw = dashboard_get(dash, f"/tasks/{tid}/artifacts/1/logs")
    assert status == 409 and b"folder" in raw
    for how, into in (("direct", tmp_path / "direct"), ("api", tmp_path / "via-api")):
        args = ("task", "artifacts", tid, "--download", str(into))
        res = deviceq(d.url, d.pool, *args) if how == "direct" else via_api(d, api, *args)
        assert res.returncode == 1, (how, res.stderr)
        assert "Traceback" not in res.stderr
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith("error: logs: "), (how, res.stderr)
        assert "folder" in errors[0]
        assert (into / "report.txt").read_bytes() == b"report"
        assert (into / "logs" / "device.log").read_bytes() == b"deep"
        assert not [p for p in into.rglob("*.part")]
    assert "Traceback" not in d.log("api") and "Traceback" not in d.log("dash")
    assert os.path.isdir(folder / "logs")
