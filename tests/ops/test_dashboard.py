"""``deviceq dashboard`` end to end: a real pool (scheduler and a host daemon as processes on a
private Redis), the dashboard as a real server process (`deviceq dashboard --port N`), driven
by a real headless Chromium through chromedriver (Debian's ``chromium`` and
``chromium-driver``; ``.ci/run`` installs them). The tests write a screenshot of each page:
with ``DEVICEQ_SCREENSHOTS=1`` to ``docs/screenshots/`` (the README's), else to a temporary
folder (a test run leaves the checkout clean).

Never skipped: without Chromium or chromedriver they are installed first when the run may
(tests/system_tools.py), else the tests fail saying how to install them."""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import system_tools
from deviceq import Client, TaskStatus
from deviceq.core.errors import InvalidInput
from deviceq.dashboard import data, task_list
from harness import REPO_DIR, Deployment, deviceq, free_port, wait_for

# one worker runs them all (under pytest-xdist): one browser and one pair of dashboards
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dashboard")]


@pytest.fixture
def require_browser() -> None:
    """The browser tests run everywhere (never skipped): without the binaries (and no way to
    install them: tests/system_tools.py) they fail saying how to install them."""
    system_tools.browser()


needs_browser = pytest.mark.usefixtures("require_browser")

SHOTS = (
    Path(REPO_DIR) / "docs" / "screenshots"
    if os.environ.get("DEVICEQ_SCREENSHOTS") == "1"
    else Path(tempfile.mkdtemp(prefix="deviceq-screenshots-"))
)
TOKEN = "op-token-" + "7c1f4e2a9b3d8e60f5a1c2b4d6e8f0a1"


class Env:
    def __init__(self, d: Deployment, op_url: str, ro_url: str, browser: Any) -> None:
        self.d, self.op, self.ro, self.browser = d, op_url, ro_url, browser

    def cli(self, *args: str) -> str:
        res = deviceq(self.d.url, self.d.pool, *args)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    def submit(self, goal: str, *extra: str) -> str:
        return self.cli("submit", goal, *extra).split()[0]


def _http(
    url: str, data: dict[str, str] | None = None, cookie: str | None = None
) -> tuple[int, str, Any]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    if cookie:
        req.add_header("Cookie", cookie)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - local test server
            return resp.status, resp.read().decode(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers


@pytest.fixture(scope="module")
def env(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    tmp = tmp_path_factory.mktemp("dashboard")
    pool = "dash" + uuid.uuid4().hex[:12]
    d = Deployment(redis_server.url, pool, tmp)
    browser = None
    try:
        d.configure(lease_ttl=5.0, claim_ttl=5.0, host_timeout=5.0)
        d.scheduler()
        d.command_host("lab-1", "pixel-1:android:wifi", "pixel-2:android:wifi", "pixel-3:android")
        d.command_host("lab-2", "chrome-1:browser", "chrome-2:browser:gpu")
        token_file = tmp / "operator.token"
        token_file.write_text(TOKEN + "\n")
        op_port, ro_port = free_port(), free_port()
        d.spawn("dash-op", "dashboard", "--port", str(op_port),
                "--operator-token-file", str(token_file))  # fmt: skip
        d.spawn("dash-ro", "dashboard", "--port", str(ro_port))
        op, ro = f"http://127.0.0.1:{op_port}", f"http://127.0.0.1:{ro_port}"
        for base in (op, ro):
            wait_for(lambda b=base: _ok(b + "/healthz"), 20, f"dashboard at {base}")
        wait_for(lambda: len(d.admin.devices()) == 5, 20, "the hosts' devices")
        opts = webdriver.ChromeOptions()
        tools = system_tools.browser()
        opts.binary_location = tools["chromium"]
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--disable-gpu", "--window-size=1360,900", "--hide-scrollbars"):  # fmt: skip
            opts.add_argument(arg)
        browser = webdriver.Chrome(
            options=opts, service=Service(tools["chromedriver"], port=free_port())
        )
        browser.set_page_load_timeout(30)
        SHOTS.mkdir(parents=True, exist_ok=True)
        yield Env(d, op, ro, browser)
    finally:
        if browser is not None:
            browser.quit()
        d.close()
        for log in tmp.glob("*.log"):  # the operator token is never logged
            assert TOKEN not in log.read_text(errors="replace"), log.name


def _ok(url: str) -> bool:
    try:
        return _http(url)[0] == 200
    except OSError:
        return False


def _wait_css(browser: Any, css: str, timeout: float = 15) -> Any:
    from selenium.webdriver.common.by import By

    return wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, css), timeout, css)[0]


def _text_of(browser: Any, css: str, timeout: float = 15) -> str:
    """The text of the first element matching ``css``, read in one script (a live refresh
    may replace the element between two WebDriver calls)."""
    script = "var e = document.querySelector(arguments[0]); return e ? e.innerText : null;"
    got = wait_for(lambda: browser.execute_script(script, css), timeout, css)
    return str(got)


def _attrs_of(browser: Any, css: str, *names: str, timeout: float = 15) -> list[str | None]:
    """Attributes of the first element matching ``css``, read in one script (as `_text_of`)."""
    script = (
        "var e = document.querySelector(arguments[0]);"
        " return e ? arguments[1].map(function (n) { return e.getAttribute(n); }) : null;"
    )
    got = wait_for(lambda: browser.execute_script(script, css, list(names)), timeout, css)
    return list(got)


def _click_css(browser: Any, css: str, timeout: float = 15) -> None:
    """Click the first element matching ``css``, found again if a live refresh replaced it."""
    from selenium.common.exceptions import (
        ElementNotInteractableException,
        StaleElementReferenceException,
    )

    def go() -> bool:
        try:
            _wait_css(browser, css, timeout).click()
            return True
        except (StaleElementReferenceException, ElementNotInteractableException):
            return False

    wait_for(go, timeout, f"click {css}")


def _wait_live(browser: Any) -> None:
    _wait_css(browser, "body[data-stream='open']")


def _shot(browser: Any, name: str) -> None:
    browser.save_screenshot(str(SHOTS / f"{name}.png"))
    assert (SHOTS / f"{name}.png").stat().st_size > 5000


@needs_browser
def test_fleet_page_shows_hosts_and_devices(env: Env) -> None:
    from selenium.webdriver.common.by import By

    b = env.browser
    b.get(env.ro + "/fleet")
    _wait_css(b, "tr.host[data-host='lab-1']")
    assert len(b.find_elements(By.CSS_SELECTOR, "#hosts a.dev")) == 5
    assert "alive" in _text_of(b, "tr.host[data-host='lab-2']")
    # a busy device shows its current task
    tid = env.submit("sleep 20", "--driver-type", "browser", "--tag", "gpu")
    wait_for(lambda: env.d.client.get(tid).status == TaskStatus.dispatched, 20, "dispatched")
    cell = _wait_css(b, f"#hosts a.dev.s-reserved[data-task='{tid}']")
    assert "sleep 20" in (cell.get_attribute("title") or "")
    assert cell.get_attribute("href").endswith("/devices/chrome-2") and cell.text == "chrome-2"
    assert not b.find_elements(By.CSS_SELECTOR, "button.btn-drain")  # read-only
    _shot(b, "fleet")
    b.get(env.ro + "/fleet?host=lab-2")
    assert tid in _text_of(b, "#devices tr[data-device='chrome-2']")
    env.d.client.cancel(tid)


@needs_browser
def test_fleet_tiles_summarize_attributes_per_driver_type(env: Env) -> None:
    """A tile per driver type: its devices, how many a gate holds, and each numeric
    attribute's lowest, median and highest value (the devices' attributes as set here)."""

    for did, battery, temp in (("pixel-1", 90, 31), ("pixel-2", 56, 38.5), ("pixel-3", 12, 33)):
        env.cli("device", "set-attr", did, f"battery={battery}", f"temperature={temp}")
    env.cli("device", "set-attr", "chrome-1", "version=120")
    env.cli("gate", "add", "tile-low", "--when", "battery<20", "--driver-type", "android")
    try:
        b = env.browser
        b.get(env.ro + "/fleet")
        tile = "#attribute-tiles .tile[data-driver='android']"
        _wait_css(b, tile)
        assert "3 devices" in _text_of(b, tile + " .tile-head")
        # (each read in one script: a live refresh may replace the tiles between two calls)
        assert _attrs_of(b, tile + " .tile-gated", "data-gated") == ["1"]
        assert "tile-low 1" in _text_of(b, tile + " .tile-gated")
        bat = tile + " .tile-attr[data-attr='battery']"
        assert _attrs_of(b, bat, "data-min", "data-median", "data-max") == ["12", "56", "90"]
        temp = tile + " .tile-attr[data-attr='temperature']"
        assert _attrs_of(b, temp, "data-max") == ["38.5"]
        web = "#attribute-tiles .tile[data-driver='browser']"
        assert "none gated" in _text_of(b, web + " .tile-gated")
        assert "version" in _text_of(b, web + " .tile-attr[data-attr='version']")
        _shot(b, "fleet-tiles")
        b.get(env.ro + "/devices/pixel-2")  # the device page says who set each attribute
        row = _text_of(b, "#device-attributes tr[data-attr='temperature']")
        assert "38.5" in row and "operator" in row
    finally:
        env.cli("gate", "remove", "tile-low")
        for did in ("pixel-1", "pixel-2", "pixel-3"):
            env.cli("device", "unset-attr", did, "battery", "temperature")
        env.cli("device", "unset-attr", "chrome-1", "version")


def test_attribute_tiles_read_a_bounded_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `data.SUMMARY_DEVICES` devices the tiles read an even sample (one round trip)."""

    class D:
        def __init__(self, i: int) -> None:
            self.device_id, self.driver_type = f"d{i}", "android" if i % 3 else "web"
            self.gated = "low" if i % 10 == 1 else None

    read: list[list[str]] = []

    def fake(admin: Any, ids: list[str], with_times: bool = False) -> dict[str, Any]:
        read.append(ids)
        return {d: ({"battery": int(d[1:]) % 101, "ok": True}, {}) for d in ids}

    monkeypatch.setattr(data, "read_attributes", fake)
    monkeypatch.setattr(data, "SUMMARY_DEVICES", 100)
    tiles = data.attribute_tiles(None, [(D(i), "idle") for i in range(1000)])  # type: ignore[arg-type]
    assert len(read) == 1 and len(read[0]) == 100
    android = next(t for t in tiles if t["driver"] == "android")
    gated = sum(1 for i in range(1000) if i % 10 == 1 and i % 3)
    assert (android["devices"], android["gated"], android["sampled"]) == (666, gated, True)
    assert [a["name"] for a in android["attributes"]] == ["battery"]  # (booleans: no tile row)


@needs_browser
def test_task_submitted_from_cli_appears_without_reload(env: Env) -> None:
    b = env.browser
    b.get(env.ro + "/tasks")
    _wait_live(b)
    b.execute_script("window.dqMarker = 42;")
    tid = env.submit("echo '<b>not bold</b> & done'", "--driver-type", "android")
    row = _wait_css(b, f"#tasks tr[data-task='{tid}']")
    assert "<b>not bold</b> & done" in row.text  # escaped: shown as text
    assert b.execute_script("return window.dqMarker;") == 42  # the page was not reloaded
    wait_for(lambda: env.d.client.get(tid).status == TaskStatus.done, 20, "done")
    _wait_css(b, f"#tasks tr[data-task='{tid}'] .st-done")
    _shot(b, "tasks")
    # filters: by status and text; a bad filter value is a 400 page, not a traceback
    b.get(env.ro + "/tasks?" + urllib.parse.urlencode({"status": "done", "q": "NOT BOLD"}))
    _wait_css(b, f"#tasks tr[data-task='{tid}']")
    b.get(env.ro + "/tasks?" + urllib.parse.urlencode({"status": "done", "q": "zzz-nothing"}))
    _wait_css(b, "#tasks td.empty")
    # by tenant (the form's field, and the query string)
    mine = env.submit("echo for team-a", "--tenant", "team-a", "--driver-type", "nothing-here")
    b.get(env.ro + "/tasks?" + urllib.parse.urlencode({"tenant": "team-a"}))
    _wait_css(b, f"#tasks tr[data-task='{mine}']")
    rows = b.find_elements("css selector", "#tasks tbody tr[data-task]")
    assert [r.get_attribute("data-task") for r in rows] == [mine]
    assert b.find_element("id", "f-tenant").get_attribute("value") == "team-a"
    for bad in ("status=bogus", "limit=7", "host=%3Cx%3E", "tenant=a%20b", "after=queued:x:y",
                "nope=1"):  # fmt: skip
        code, body, _ = _http(env.ro + "/tasks?" + bad)
        assert code == 400, bad
        assert "Traceback" not in body and 'id="error-message"' in body
    # the task page: fields, attempts, explain, events, result
    b.get(env.ro + f"/tasks/{tid}")
    _wait_css(b, "#attempts tbody tr")
    assert "&lt;b&gt;" not in _text_of(b, "#goal")
    assert "not bold" in _text_of(b, "#result")
    assert "done" in _text_of(b, "#explain")
    events = _text_of(b, "#task-events")
    for kind in ("submitted", "assigned", "dispatched", "done"):
        assert kind in events
    _shot(b, "task")
    assert _http(env.ro + "/tasks/no-such-task")[0] == 404


@needs_browser
def test_cancel_from_the_browser(env: Env) -> None:
    from selenium.webdriver.common.by import By

    b = env.browser
    tid = env.submit("sleep 30", "--driver-type", "android", "--tag", "wifi")
    wait_for(lambda: env.d.client.get(tid).status == TaskStatus.dispatched, 20, "dispatched")
    b.get(env.op + f"/tasks/{tid}")
    assert not b.find_elements(By.ID, f"cancel-{tid}")  # not logged in: no action
    b.get(env.op + "/login?" + urllib.parse.urlencode({"next": f"/tasks/{tid}"}))
    b.find_element(By.ID, "token").send_keys("wrong-token-wrong-token")
    b.find_element(By.ID, "login-submit").click()
    _wait_css(b, "#login-failed")
    b.find_element(By.ID, "token").send_keys(TOKEN)
    b.find_element(By.ID, "login-submit").click()
    _wait_css(b, f"#cancel-{tid}")
    assert TOKEN not in b.page_source
    _click_css(b, f"#cancel-{tid}")
    wait_for(lambda: b.switch_to.alert, 5, "the confirmation").accept()
    wait_for(lambda: env.d.client.get(tid).status == TaskStatus.cancelled, 20, "cancelled")
    _wait_css(b, ".st-cancelled")
    # retry from the browser: a new task with the same goal
    _click_css(b, f"#retry-{tid}")
    _wait_css(b, ".flash")
    new_id = _text_of(b, "#task-id")
    assert new_id != tid and env.d.client.get(new_id).goal == "sleep 30"
    env.d.client.cancel(new_id)


@needs_browser
def test_actions_without_the_token_are_refused(env: Env) -> None:
    tid = env.submit("queued forever", "--driver-type", "gpu-rig")  # no such device
    for base in (env.op, env.ro):
        code, body, _ = _http(base + f"/tasks/{tid}/cancel", {"csrf": "x"})
        assert code == 403
    code, body, _ = _http(env.ro + "/hosts/lab-1/drain", {})
    assert code == 403 and "read-only" in body
    # a logged-in session still needs the form's CSRF token
    code, body, headers = _http(env.op + "/login")
    nonce = body.split('name="nonce" value="')[1].split('"')[0]
    login_cookie = headers["set-cookie"].split(";")[0]
    req = urllib.request.Request(
        env.op + "/login",
        data=urllib.parse.urlencode({"nonce": nonce, "token": TOKEN, "next": "/fleet"}).encode(),
    )
    req.add_header("Cookie", login_cookie)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as info:
        opener.open(req, timeout=10)
    assert info.value.code == 303
    session = info.value.headers["set-cookie"].split(";")[0]
    assert TOKEN not in session
    code, _, _ = _http(env.op + f"/tasks/{tid}/cancel", {"csrf": "forged"}, cookie=session)
    assert code == 403
    assert env.d.client.get(tid).status == TaskStatus.queued
    # with the session's CSRF token (from a page) it goes through the cancel script
    _, page, _ = _http(env.op + f"/tasks/{tid}", cookie=session)
    assert TOKEN not in page
    form = page.split(f'action="/tasks/{tid}/cancel"')[1]
    csrf = form.split('name="csrf" value="')[1].split('"')[0]
    code, _, _ = _http(env.op + f"/tasks/{tid}/cancel", {"csrf": csrf}, cookie=session)
    assert code == 200  # followed the redirect to the task page
    assert env.d.client.get(tid).status == TaskStatus.cancelled
    # drain / undrain a host, quarantine / unquarantine a device: the admin scripts
    for path, check in (
        ("/hosts/lab-2/drain", lambda: env.d.admin.host("lab-2").draining),
        ("/hosts/lab-2/undrain", lambda: not env.d.admin.host("lab-2").draining),
        ("/devices/chrome-1/quarantine", lambda: env.d.admin.device("chrome-1").quarantined),
        ("/devices/chrome-1/unquarantine", lambda: not env.d.admin.device("chrome-1").quarantined),
    ):
        code, page, _ = _http(env.op + path, {"csrf": csrf}, cookie=session)
        assert code == 200 and 'class="flash"' in page, path
        assert check(), path
    code, _, _ = _http(env.op + "/hosts/lab-2/explode", {"csrf": csrf}, cookie=session)
    assert code == 404


@needs_browser
def test_queue_and_events_pages(env: Env) -> None:
    from selenium.webdriver.common.by import By

    b = env.browser
    env.submit("needs a rig", "--driver-type", "gpu-rig")
    b.get(env.ro + "/queue")
    _wait_css(b, "#unmatchable")
    rows = _text_of(b, "#queues")
    assert "gpu-rig" in rows and "none" in rows
    assert b.find_elements(By.CSS_SELECTOR, "#chart-throughput svg rect.bar")
    _shot(b, "queue")
    b.get(env.ro + "/events")
    _wait_live(b)
    tid = env.submit("echo events", "--driver-type", "android")
    _wait_css(b, f"#event-rows a[href='/tasks/{tid}']")
    wait_for(lambda: env.d.client.get(tid).status == TaskStatus.done, 20, "done")
    wait_for(lambda: "done" in _text_of(b, "#event-rows"), 10, "done event")
    _shot(b, "events")
    # filtered: only this task's events, live
    b.get(env.ro + "/events?" + urllib.parse.urlencode({"task": tid, "type": "done"}))
    _wait_css(b, "#event-rows tr")
    assert len(b.find_elements(By.CSS_SELECTOR, "#event-rows tr")) == 1
    code, _, _ = _http(env.ro + "/events?type=%3Cscript%3E")
    assert code == 400
    # a daemon session id is shown by its first characters (the whole id in the title)
    session = str(env.d.admin.host("lab-1").session)
    code, html, _ = _http(env.ro + "/events?" + urllib.parse.urlencode(
        {"type": "session_started", "host": "lab-1"}))  # fmt: skip
    assert code == 200 and f'title="{session}">{session[:8]}…</span>' in html
    assert f"session={session}" not in html


def test_task_pages_are_bounded_and_never_skip_or_repeat(
    real_r: Any, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task list walks the status indexes from a cursor: every task once across pages,
    also when many finished in the same millisecond (ties in score) and when a selective
    filter stops a page at the scan bound."""
    client = Client(real_r, pool)
    ids = client.submit_many(
        [
            {"goal": f"job {i}{' needle' if i % 10 == 0 else ''}", "driver_type": "android"}
            for i in range(130)
        ]  # fmt: skip
    )
    for tid in ids[:90]:
        client.cancel(tid)
    real_r.zadd(client.keys.status("cancelled"), dict.fromkeys(ids[:90], 1))  # one tie

    def walk(flt: task_list.TaskFilter) -> list[str]:
        seen: list[str] = []
        after = None
        for _ in range(100):
            page = task_list.list_tasks(client, flt, after)
            assert len(page.tasks) <= flt.limit and page.scanned <= task_list.MAX_SCAN
            seen += [t.id for t in page.tasks]
            if page.next_cursor is None:
                return seen
            after = page.next_cursor
        raise AssertionError("no end")

    everything = walk(task_list.TaskFilter(limit=25))
    assert sorted(everything) == sorted(ids) and len(set(everything)) == len(ids)
    cancelled = walk(task_list.TaskFilter(status=TaskStatus.cancelled, limit=25))
    assert sorted(cancelled) == sorted(ids[:90])
    queued = walk(task_list.TaskFilter(status=TaskStatus.queued, limit=25))
    assert queued == ids[90:][::-1]  # newest first
    oldest = walk(task_list.TaskFilter(status=TaskStatus.queued, limit=25, order="oldest"))
    assert oldest == ids[90:]
    monkeypatch.setattr(task_list, "MAX_SCAN", 30)
    needles = walk(task_list.TaskFilter(text="NEEDLE", limit=25))
    assert sorted(needles) == sorted(ids[::10])
    with pytest.raises(InvalidInput):
        task_list.list_tasks(client, task_list.TaskFilter(status=TaskStatus.queued), "done:1:x")
    for bad in ({"status": "nope"}, {"limit": "0"}, {"tag": "a b"}, {"q": "x" * 201}):
        with pytest.raises(InvalidInput):
            task_list.TaskFilter.parse(bad)


@needs_browser
def test_task_page_shows_the_live_log_and_then_the_whole_log(env: Env) -> None:
    from selenium.webdriver.common.by import By

    b = env.browser
    gate = env.d.tmp / f"gate-{uuid.uuid4().hex[:8]}"  # the run's last lines wait for it
    tid = env.submit(f"for i in $(seq 1 14); do echo step $i; sleep 0.2; done; "
                     f"while [ ! -e {gate} ]; do sleep 0.05; done; echo step 15; echo oops >&2",
                     "--driver-type", "android")  # fmt: skip
    wait_for(lambda: env.d.client.get(tid).status == TaskStatus.dispatched, 20, "dispatched")
    b.get(env.ro + f"/tasks/{tid}")
    log = _wait_css(b, "#task-log[data-log-stream]")
    # chunks arrive while it runs (the last line is not there yet)
    text = wait_for(lambda: (lambda t: t if "step 2\n" in t else "")(
        log.get_attribute("textContent") or ""), 20, "live log lines")  # fmt: skip
    assert "step 15" not in text
    gate.touch()
    _wait_css(b, "#task-log[data-log-state='ended']", 30)
    text = log.get_attribute("textContent") or ""
    assert [x for x in text.splitlines() if x.startswith("step")] == [
        f"step {i}" for i in range(1, 16)
    ]
    assert b.find_element(By.CSS_SELECTOR, "#task-log .log-stderr").text.strip() == "oops"
    _shot(b, "task-log")
    # after the end the page has the whole log at once (no stream)
    wait_for(lambda: env.d.client.get(tid).status.terminal, 20, "finished")
    b.get(env.ro + f"/tasks/{tid}")
    log = _wait_css(b, "#task-log")
    assert log.get_attribute("data-log-stream") is None
    assert "step 1\n" in (log.get_attribute("textContent") or "")
    assert "step 15\n" in (log.get_attribute("textContent") or "")


def test_every_device_state_has_a_colour_in_the_stylesheet() -> None:
    """The grid, the legend and the state chips colour a device by ``s-STATE``: a state the
    stylesheet does not style is an invisible square (as ``booked`` once was)."""
    import re

    from deviceq.core.fleet import DEVICE_STATES

    css = (Path(data.__file__).parent / "static" / "app.css").read_text()
    styled = set(re.findall(r"\.s-([a-z_]+)\s*\{\s*background:", css))
    assert set(DEVICE_STATES) <= styled, sorted(set(DEVICE_STATES) - styled)
