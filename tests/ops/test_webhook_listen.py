"""``deviceq webhook listen``: a receiver to try webhooks with, fed by a real scheduler's
deliveries, and its answers to a bad signature, a repeat and a body too large over real HTTP."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceq.core.vocabulary import TaskStatus
from deviceq.services import webhook_listen
from deviceq.services.webhook_listen import MAX_BODY, Listener
from deviceq.services.webhooks import sign
from harness import Deployment, deviceq, free_port


def listen(port: int, secret_file: Path, *extra: str) -> subprocess.Popen[str]:
    exe = Path(sys.executable).parent / "deviceq"
    args = [str(exe), "webhook", "listen", "--port", str(port), "--secret-file", str(secret_file)]
    proc = subprocess.Popen([*args, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stderr is not None
    started = proc.stderr.readline()  # the "listening on" line: the port is bound
    assert started.startswith(f"listening on http://127.0.0.1:{port}/"), started
    return proc


def test_listen_prints_a_schedulers_deliveries_checked_and_stops_after_count(
    deploy: Deployment, tmp_path: Path
) -> None:
    d, port = deploy, free_port()
    secret = tmp_path / "hook.secret"
    out = deviceq(d.url, d.pool, "webhook", "add", f"http://127.0.0.1:{port}/deviceq",
                  "--event", "failed,quarantined", "-o", str(secret))  # fmt: skip
    assert out.returncode == 0, out.stderr
    proc = listen(port, secret, "--count", "2")
    try:
        d.scheduler()
        d.command_host("h1", "d1:x", "d2:x")
        tid = d.client.submit("exit 3", driver_type="x", max_attempts=1)
        assert d.client.wait(tid, timeout=60).status == TaskStatus.failed
        d.admin.quarantine("d2", reason="usb flapping")
        stdout, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert stdout.splitlines() == [f"failed signature ok {tid}", "quarantined signature ok d2"]
    (row,) = json.loads(deviceq(d.url, d.pool, "webhook", "list", "--json").stdout)
    assert row["last_ok_at"] and row["last_error"] is None


def test_listen_with_the_wrong_secret_says_bad(deploy: Deployment, tmp_path: Path) -> None:
    d, port = deploy, free_port()
    out = deviceq(d.url, d.pool, "webhook", "add", f"http://127.0.0.1:{port}/deviceq",
                  "--event", "failed", "-o", str(tmp_path / "hook.secret"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    wrong = tmp_path / "wrong.secret"
    wrong.write_text("not-the-secret-of-this-hook\n")
    proc = listen(port, wrong, "--count", "1")
    try:
        d.scheduler()
        d.command_host("h1", "d1:x")
        tid = d.client.submit("exit 3", driver_type="x", max_attempts=1)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert stdout.splitlines() == [f"failed signature BAD {tid}"]


@pytest.fixture
def listener() -> Iterator[tuple[Listener, list[str]]]:
    lines: list[str] = []
    lst = Listener("the-secret-of-it", lines.append, port=0, count=4)
    thread = threading.Thread(target=lst.serve, daemon=True)
    thread.start()
    yield lst, lines
    lst.close()
    thread.join(5)


def post(port: int, body: bytes, signature: str, delivery: str) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/",
        data=body,
        headers={"X-Deviceq-Signature": signature, "X-Deviceq-Delivery": delivery},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_answers_ok_bad_repeat_and_too_large_over_http(
    listener: tuple[Listener, list[str]],
) -> None:
    lst, lines = listener
    body = json.dumps({"event": "quarantined", "data": {"device_id": "pixel-7"}}).encode()
    good = sign("the-secret-of-it", body)
    conn = http.client.HTTPConnection("127.0.0.1", lst.port, timeout=10)
    conn.putrequest("POST", "/")
    conn.putheader("Content-Length", str(MAX_BODY + 1))  # refused before the body is read
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()
    assert post(lst.port, body, good, "1-0") == 204
    assert post(lst.port, body, good, "1-0") == 204  # a retry of the same delivery
    assert post(lst.port, body, "sha256=" + "0" * 64, "2-0") == 401
    assert post(lst.port, body, "", "3-0") == 401
    assert lines == [
        "quarantined signature ok pixel-7",
        "quarantined signature ok pixel-7 (repeat)",
        "quarantined signature BAD pixel-7",
        "quarantined signature BAD pixel-7",
    ]


def test_a_busy_port_or_a_missing_secret_is_one_line(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("the-secret-of-it\n")
    exe = str(Path(sys.executable).parent / "deviceq")
    held = Listener("x", print, port=0)
    try:
        args = [exe, "webhook", "listen", "--secret-file", str(secret), "--port", str(held.port)]
        busy = subprocess.run(args, capture_output=True, text=True, timeout=30)
    finally:
        held.server.server_close()
    assert busy.returncode == 1
    assert busy.stderr.strip().splitlines() == [
        f"error: InvalidInput: cannot listen on 127.0.0.1:{held.port}: Address already in use"
    ]
    missing = subprocess.run([exe, "webhook", "listen", "--secret-file", str(tmp_path / "no")],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    empty = tmp_path / "empty"
    empty.write_text("\n")
    blank = subprocess.run([exe, "webhook", "listen", "--secret-file", str(empty)],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert blank.returncode != 0 and "is empty" in blank.stderr


def test_the_ids_kept_to_mark_repeats_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhook_listen, "REMEMBERED", 3)
    lines: list[str] = []
    lst = Listener("the-secret-of-it", lines.append, port=0)
    thread = threading.Thread(target=lst.serve, daemon=True)
    thread.start()
    try:
        body = json.dumps({"event": "failed", "data": {"task_id": "t1"}}).encode()
        good = sign("the-secret-of-it", body)
        for delivery in ("1-0", "2-0", "3-0", "3-0", "4-0", "1-0", "4-0"):
            assert post(lst.port, body, good, delivery) == 204
    finally:
        lst.close()
        thread.join(5)
    assert len(lst.seen) == 3
    # 3-0 and 4-0 are repeats; 1-0 was forgotten once 4-0 made four ids
    assert [ln.endswith("(repeat)") for ln in lines] == [False, False, False, True, False,
                                                         False, True]  # fmt: skip


def test_count_counts_distinct_deliveries_not_repeats() -> None:
    lines: list[str] = []
    lst = Listener("the-secret-of-it", lines.append, port=0, count=2)
    thread = threading.Thread(target=lst.serve, daemon=True)
    thread.start()
    try:
        port = lst.port
        body = json.dumps({"event": "failed", "data": {"task": "t1"}}).encode()
        sig = sign("the-secret-of-it", body)
        assert post(port, body, sig, "1-0") == 204
        assert post(port, body, sig, "1-0") == 204  # the sender's retry: a repeat
        assert not lst.done.is_set()
        assert post(port, body, sig, "2-0") == 204
        assert lst.done.wait(5)
        assert [ln.endswith("(repeat)") for ln in lines] == [False, True, False]
    finally:
        lst.close()
        thread.join(5)
