"""Named dashboard users end to end: ``deviceq dashboard user add|list|remove`` as a real
process, the dashboard as a real uvicorn server (in a thread of this process) on a private
Redis, logins and actions over real HTTP; a viewer is refused actions, an operator's cancel
is recorded with its name (``by``), and concurrent wrong logins are bounded by the shared
limiter (per client address and per user name)."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import uvicorn

import system_tools
from deviceq import Client, TaskStatus
from deviceq.core.errors import InvalidInput
from deviceq.dashboard import create_app
from deviceq.dashboard.limits import PER_ADDR, PER_USER
from deviceq.dashboard.users import UserStore
from deviceq.ops.admin import PoolAdmin
from harness import deviceq, free_port

TOKEN = "op-token-" + "5d0c2b7a9e4f1a3c8b6d2e0f4a7c9b1d"
PASSWORD = "correct horse battery"


class Browser:
    """One HTTP client (a cookie jar) from one source address."""

    def __init__(self, base: str, source: str = "127.0.0.1") -> None:
        u = urllib.parse.urlsplit(base)
        self.host, self.port, self.source = u.hostname or "", u.port or 80, source
        self.cookies: dict[str, str] = {}

    def request(
        self, method: str, path: str, form: dict[str, str] | None = None
    ) -> tuple[int, str, http.client.HTTPMessage]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30,
                                          source_address=(self.source, 0))  # fmt: skip
        headers = {"cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["content-type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode()
        finally:
            conn.close()
        for value in resp.headers.get_all("set-cookie") or []:
            name, _, rest = value.partition("=")
            val = rest.split(";", 1)[0].strip('"')
            if val and "max-age=0" not in value.lower():
                self.cookies[name] = val
            else:
                self.cookies.pop(name, None)
        return resp.status, text, resp.headers

    def login_form(self) -> dict[str, str]:
        status, html, _ = self.request("GET", "/login")
        assert status == 200, html
        nonce = re.search(r'name="nonce" value="([^"]+)"', html)
        assert nonce, html
        return {"nonce": nonce.group(1), "next": "/fleet"}

    def login(self, user: str, password: str) -> int:
        status, _, _ = self.request(
            "POST", "/login", {**self.login_form(), "user": user, "password": password}
        )
        return status

    def csrf(self, path: str) -> tuple[str, str]:
        status, html, _ = self.request("GET", path)
        assert status == 200, html
        m = re.search(r'name="csrf" value="([^"]+)"', html)
        return html, m.group(1) if m else ""


class Served:
    def __init__(self, url: str, pool: str, base: str) -> None:
        self.url, self.pool, self.base = url, pool, base
        self.client = Client(url, pool)
        self.users = UserStore(self.client.redis, self.client.keys)

    def cli(self, *args: str, input: str | None = None) -> Any:
        """The command line in-process (click's CliRunner): exit_code, stdout, stderr."""
        from click.testing import CliRunner

        from deviceq.cli import main

        return CliRunner().invoke(main, ["--redis-url", self.url, "--pool", self.pool, *args],
                                  input=input)  # fmt: skip


@pytest.fixture
def serve(redis_server: Any) -> Iterator[Callable[..., Served]]:
    """``serve(token=None)``: a dashboard of a fresh pool on a real uvicorn server."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(token: str | None = None) -> Served:
        pool = "du" + str(time.time_ns() % 10**12)
        port = free_port()
        app = create_app(Client(redis_server.url, pool), token)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="warning", access_log=False))  # fmt: skip
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.05)
        return Served(redis_server.url, pool, f"http://127.0.0.1:{port}")

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def test_user_add_list_remove_from_the_command_line(serve: Any, tmp_path: Path) -> None:
    s = serve()
    pw = tmp_path / "alice.pw"
    pw.write_text(PASSWORD + "\n")
    # the installed console script, as an operator runs it
    res = deviceq(s.url, s.pool, "dashboard", "user", "add", "alice", "--role", "operator",
                  "--password-file", str(pw))  # fmt: skip
    assert (res.returncode, res.stdout) == (0, "dashboard user alice added (operator)\n")
    assert s.users.verify("alice", PASSWORD) is not None  # the trailing newline is not in it
    assert s.users.verify("alice", PASSWORD + "\n") is None
    res = s.cli("dashboard", "user", "add", "bob", "--role", "viewer", "--json",
                "--password-file", str(pw))  # fmt: skip
    assert json.loads(res.stdout) == {"name": "bob", "role": "viewer"}
    res = s.cli("dashboard", "user", "list", "--json")
    assert json.loads(res.stdout) == [{"name": "alice", "role": "operator"},
                                      {"name": "bob", "role": "viewer"}]  # fmt: skip
    assert "argon2" not in res.stdout and "hash" not in res.stdout
    assert s.cli("dashboard", "user", "list").stdout == "alice  operator\nbob  viewer\n"
    stored = s.client.redis.hget(s.client.keys.dashboard_users, "alice")
    assert PASSWORD not in str(stored) and '"$argon2id$' in str(stored)

    taken = s.cli("dashboard", "user", "add", "alice", "--role", "viewer", "--password-file",
                  str(pw))  # fmt: skip
    assert taken.exit_code == 1 and taken.stderr.count("\n") == 1
    assert "exists" in taken.stderr
    empty = tmp_path / "empty.pw"
    empty.write_text("\n")
    res = s.cli("dashboard", "user", "add", "carol", "--role", "viewer", "--password-file",
                str(empty))  # fmt: skip
    assert res.exit_code == 1 and "is empty" in res.stderr
    short = tmp_path / "short.pw"
    short.write_text("hunter2\n")
    res = s.cli("dashboard", "user", "add", "carol", "--role", "viewer", "--password-file",
                str(short))  # fmt: skip
    assert res.exit_code == 1 and "shorter than 10 characters" in res.stderr
    assert res.stderr.count("\n") == 1 and "hunter2" not in res.stderr
    assert s.users.get("carol") is None  # nothing stored
    res = s.cli("dashboard", "user", "add", "bad/name", "--role", "viewer", "--password-file",
                str(pw))  # fmt: skip
    assert res.exit_code == 1 and "invalid user name" in res.stderr
    res = s.cli("dashboard", "user", "add", "carol", "--role", "admin", "--password-file",
                str(pw))  # fmt: skip
    assert res.exit_code == 2 and "'admin' is not one of" in res.stderr

    assert s.cli("dashboard", "user", "remove", "bob").stdout == "dashboard user bob removed\n"
    gone = s.cli("dashboard", "user", "remove", "bob")
    assert gone.exit_code == 1 and gone.stderr == "error: NotFound: no dashboard user named bob\n"
    assert [u.name for u in s.users.list()] == ["alice"]


def test_prompted_password_is_asked_twice_and_never_empty(serve: Any) -> None:
    s = serve()

    def run(stdin: str) -> Any:
        return s.cli("dashboard", "user", "add", "dan", "--role", "viewer", input=stdin)

    empty = run("\n")
    assert empty.exit_code == 1 and empty.stderr == "error: InvalidInput: the password is empty\n"
    differ = run("one passphrase\ntwo passphrase\n")
    assert differ.exit_code == 1 and "the two passwords differ" in differ.stderr
    assert s.users.list() == []
    short = run("s3cret\n")  # refused at once, not asked again
    assert short.exit_code == 1 and "shorter than 10 characters" in short.stderr
    assert short.output.count("Password") == 1 and "Repeat" not in short.output
    ok = run("s3cret-passphrase\ns3cret-passphrase\n")
    assert ok.exit_code == 0, ok.stderr
    assert "s3cret-passphrase" not in ok.output  # the prompt hides what is typed
    assert s.users.verify("dan", "s3cret-passphrase") is not None


def _task_page(b: Browser, task_id: str) -> tuple[str, str]:
    return b.csrf(f"/tasks/{task_id}")


def test_viewer_sees_no_actions_and_is_refused_one(serve: Any) -> None:
    s = serve()
    s.users.add("vic", "viewer", PASSWORD)
    task_id = s.client.submit("echo hi", driver_type="android")
    b = Browser(s.base)
    assert b.login("vic", "wrong password") == 403
    assert b.login("vic", PASSWORD) == 303
    html, csrf = _task_page(b, task_id)
    assert 'id="user"' in html and "vic (viewer)" in html
    assert f'id="cancel-{task_id}"' not in html and csrf  # logged in, no action button
    assert "to cancel or retry" not in html  # nor a login link: a viewer is logged in
    status, body, _ = b.request("POST", f"/tasks/{task_id}/cancel", {"csrf": csrf})
    assert status == 403 and "viewer" in body
    assert s.client.get(task_id).status == TaskStatus.queued
    # a viewer may log out (the logout form carries the session's CSRF token)
    assert b.request("POST", "/logout", {"csrf": csrf})[0] == 303
    assert 'id="login-link"' in b.request("GET", "/fleet")[1]


def test_operator_cancel_is_recorded_with_its_name(serve: Any) -> None:
    s = serve()
    s.users.add("alice", "operator", PASSWORD)
    task_id = s.client.submit("echo hi", driver_type="android")
    b = Browser(s.base)
    assert b.login("alice", PASSWORD) == 303
    html, csrf = _task_page(b, task_id)
    assert f'id="cancel-{task_id}"' in html and "alice (operator)" in html
    status, _, headers = b.request("POST", f"/tasks/{task_id}/cancel", {"csrf": csrf})
    assert status == 303 and headers["location"] == f"/tasks/{task_id}"
    t = s.client.get(task_id)
    assert t.status == TaskStatus.cancelled
    assert t.error == "cancelled from the dashboard by alice"
    got = [e for e in s.client.events(task=task_id) if e.type == "cancelled"]
    assert [e.fields.get("by") for e in got] == ["alice"]
    html, _ = _task_page(b, task_id)
    assert "by=alice" in html  # the task page's events table
    # a removed user's session acts no more
    other = s.client.submit("echo again", driver_type="android")
    _, csrf = _task_page(b, other)
    s.users.remove("alice")
    status, body, _ = b.request("POST", f"/tasks/{other}/cancel", {"csrf": csrf})
    assert status == 403 and s.client.get(other).status == TaskStatus.queued


def test_token_login_works_until_the_pool_has_users(serve: Any) -> None:
    s = serve(TOKEN)
    b = Browser(s.base)
    form = b.login_form()
    assert b.request("POST", "/login", {**form, "token": TOKEN})[0] == 303
    html, csrf = _task_page(b, s.client.submit("echo hi"))
    assert "operator (operator)" in html and csrf
    s.users.add("alice", "operator", PASSWORD)
    time.sleep(2.2)  # UserStore.configured caches its answer for 2 s
    assert 'id="login-link"' in b.request("GET", "/fleet")[1]  # the token session ended
    status, html, _ = b.request("GET", "/login")
    assert status == 200 and 'id="password"' in html and 'id="token"' not in html
    form = b.login_form()
    assert b.request("POST", "/login", {**form, "token": TOKEN})[0] == 403
    assert b.login("alice", PASSWORD) == 303


def test_actor_is_an_id_and_reaches_drain_and_quarantine_events(serve: Any) -> None:
    s = serve()
    admin = PoolAdmin(s.client.redis, s.pool)
    admin.add_host("lab-1")
    with pytest.raises(InvalidInput):
        admin.drain("lab-1", True, by="no spaces")
    with pytest.raises(InvalidInput):
        s.client.cancel(s.client.submit("echo"), by="a:b")
    assert admin.drain("lab-1", True, by="alice") == "draining"
    ev = [e for e in s.client.events() if e.type == "host_draining"]
    assert [e.fields.get("by") for e in ev] == ["alice"]
    assert admin.drain("lab-1", False) == "active"
    ev = [e for e in s.client.events() if e.type == "host_undrained"]
    assert [e.fields.get("by") for e in ev] == [None]  # no actor given: none recorded


def _guess(base: str, source: str, user: str, password: str) -> tuple[int, str | None]:
    b = Browser(base, source)
    form = b.login_form()  # GETs are not attempts
    status, _, headers = b.request("POST", "/login", {**form, "user": user,
                                                      "password": password})  # fmt: skip
    return status, headers.get("retry-after")


def test_concurrent_wrong_logins_are_bounded_per_address_and_per_name(serve: Any) -> None:
    s = serve()
    s.users.add("alice", "operator", PASSWORD)
    with ThreadPoolExecutor(40) as pool:
        got = list(pool.map(lambda i: _guess(s.base, "127.0.0.1", "alice", f"guess-{i}"),
                            range(40)))  # fmt: skip
    statuses = sorted(code for code, _ in got)
    assert statuses == [403] * PER_ADDR + [429] * (40 - PER_ADDR)
    waits = [int(w) for code, w in got if code == 429 and w is not None]
    assert len(waits) == 40 - PER_ADDR and all(1 <= w <= 60 for w in waits)
    # the address is spent: even the right password waits for the window to end
    assert _guess(s.base, "127.0.0.1", "alice", PASSWORD)[0] == 429
    # other addresses: each gets its own PER_ADDR, but the name "alice" only PER_USER in all
    sources = [f"127.0.0.{i}" for i in range(2, 2 + 4)]
    with ThreadPoolExecutor(40) as pool:
        got = list(pool.map(lambda i: _guess(s.base, sources[i % 4], "alice", f"g{i}"),
                            range(40)))  # fmt: skip
    assert sum(code == 403 for code, _ in got) == PER_USER - PER_ADDR  # 10 left of 20
    assert sum(code == 429 for code, _ in got) == 40 - (PER_USER - PER_ADDR)
    # another name from a fresh address is still checked (and a right password logs in)
    s.users.add("bob", "viewer", PASSWORD)
    assert _guess(s.base, "127.0.0.9", "bob", "nope")[0] == 403
    assert _guess(s.base, "127.0.0.9", "bob", PASSWORD)[0] == 303


def _chromium() -> Any:
    """A headless Chromium through chromedriver (Debian's chromium and chromium-driver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    tools = system_tools.browser()  # (installed first when the run may, else a failure)
    binary, driver = tools["chromium"], tools["chromedriver"]
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1360,900"):  # fmt: skip
        opts.add_argument(arg)
    b = webdriver.Chrome(options=opts, service=Service(driver))
    b.set_page_load_timeout(30)
    return b


def _wait(b: Any, css: str, timeout: float = 15) -> Any:
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while not (found := b.find_elements(By.CSS_SELECTOR, css)):
        assert time.monotonic() < deadline, f"no {css} on {b.current_url}"
        time.sleep(0.1)
    return found[0]


def _click(b: Any, css: str, timeout: float = 15) -> None:
    """Click an element a live refresh of the page may replace meanwhile (found again)."""
    from selenium.common.exceptions import (
        ElementNotInteractableException,
        StaleElementReferenceException,
    )

    deadline = time.monotonic() + timeout
    while True:
        try:
            _wait(b, css, timeout).click()
            return
        except (StaleElementReferenceException, ElementNotInteractableException):
            assert time.monotonic() < deadline, f"could not click {css}"
            time.sleep(0.1)


def _text(b: Any, css: str, timeout: float = 15) -> str:
    """An element's text, read again when a live refresh replaced it."""
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while True:
        try:
            return str(_wait(b, css, timeout).text)
        except StaleElementReferenceException:
            assert time.monotonic() < deadline, f"could not read {css}"
            time.sleep(0.1)


@pytest.mark.slow
def test_viewer_and_operator_in_a_real_browser(serve: Any) -> None:
    from selenium.webdriver.common.by import By

    s = serve()
    s.users.add("vic", "viewer", PASSWORD)
    s.users.add("alice", "operator", PASSWORD)
    tid = s.client.submit("echo hi", driver_type="android")
    b = _chromium()
    try:

        def login(name: str) -> None:
            b.get(s.base + "/login?" + urllib.parse.urlencode({"next": f"/tasks/{tid}"}))
            _wait(b, "#user-name").send_keys(name)
            b.find_element(By.ID, "password").send_keys(PASSWORD)
            b.find_element(By.ID, "login-submit").click()
            _wait(b, "#user")

        login("vic")
        assert b.find_element(By.ID, "user").text == "vic (viewer)"
        assert not b.find_elements(By.ID, f"cancel-{tid}")  # a viewer gets no action button
        assert PASSWORD not in b.page_source
        b.find_element(By.CSS_SELECTOR, "form[action='/logout'] button").click()
        _wait(b, "#login-link")
        login("alice")
        assert b.find_element(By.ID, "user").text == "alice (operator)"
        _click(b, f"#cancel-{tid}")
        b.switch_to.alert.accept()
        _wait(b, ".st-cancelled")
        assert "by=alice" in _text(b, "#task-events")
        assert s.client.get(tid).status == TaskStatus.cancelled
        _click(b, f"#retry-{tid}")  # the new task's page: who retried it, and of what
        assert _text(b, "#submitted-by") == "alice"
        assert _text(b, "#retry-of") == tid
        new_id = _text(b, "#task-id")
        assert s.client.get(new_id).submitted_by == "alice"
        assert "by=alice" in _text(b, "#task-events")  # its submitted event
    finally:
        b.quit()


def test_a_multi_device_task_cancelled_while_placed_records_by(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", ("d1", "web", ()), ("d2", "web", ()))
    g = f.client.submit("on two devices", roles={"a": "web", "b": "web"})
    assert f.store.commit_gang(g, ["d1", "d2"]) == "ok:1"
    assert f.client.cancel(g, "no longer needed", by="alice") == "cancelled"
    got = [e for e in f.client.events(task=g) if e.type == "cancelled"]
    assert [e.fields.get("by") for e in got] == ["alice"]
