"""The dashboard as an operator uses it, end to end in headless Chromium against a real pool
(scheduler and command hosts as processes) and the dashboard as a real server process (the
``env`` fixture of ``test_dashboard``): the task list failures first with each error, its
filters kept through a task's page and an action, bulk cancel and retry (a confirmation page,
exactly the ids it showed, the limit), a device's page (history, quarantine reason, booking,
health) linked from the labelled fleet grid, and every role of a multi-device task.

Screenshots go where ``test_dashboard``'s do (``DEVICEQ_SCREENSHOTS=1``: the README's)."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

import pytest
from test_dashboard import (  # the same deployment, browser and helpers
    TOKEN,
    Env,
    _http,
    _shot,
    _wait_css,
    env,
    needs_browser,
    require_browser,
)

from deviceq import TaskStatus
from harness import wait_for

__all__ = ["env", "require_browser"]  # fixtures, used by name

pytestmark = pytest.mark.slow


def _login(env: Env, next_path: str) -> None:
    from selenium.webdriver.common.by import By

    b = env.browser
    b.get(env.op + next_path)
    if b.find_elements(By.CSS_SELECTOR, "form[action='/logout']"):
        return
    b.get(env.op + "/login?" + urllib.parse.urlencode({"next": next_path}))
    b.find_element(By.ID, "token").send_keys(TOKEN)
    b.find_element(By.ID, "login-submit").click()
    _wait_css(b, "form[action='/logout']")


def _click(b: Any, css: str) -> None:
    """Click an element that a live refresh may replace meanwhile (found again if so)."""
    from selenium.common.exceptions import (
        ElementNotInteractableException,
        StaleElementReferenceException,
    )

    def go() -> bool:
        try:
            _wait_css(b, css).click()
            return True
        except (StaleElementReferenceException, ElementNotInteractableException):
            return False

    wait_for(go, 15, f"click {css}")


def _type(b: Any, css: str, text: str) -> None:
    """Set an input's text the way an operator types it, again if a live refresh replaced
    the input meanwhile (the replaced one is detached: stale, or "not interactable")."""
    from selenium.common.exceptions import (
        ElementNotInteractableException,
        StaleElementReferenceException,
    )

    def go() -> bool:
        try:
            el = _wait_css(b, css)
            el.clear()
            el.send_keys(text)
            return _wait_css(b, css).get_attribute("value") == text
        except (StaleElementReferenceException, ElementNotInteractableException):
            return False

    wait_for(go, 15, f"type into {css}")


def _row_ids(b: Any) -> list[str]:
    from selenium.common.exceptions import StaleElementReferenceException

    def read() -> list[str] | None:
        try:
            rows = b.find_elements("css selector", "#tasks tbody tr[data-task]")
            return [str(r.get_attribute("data-task")) for r in rows]
        except StaleElementReferenceException:
            return None

    return wait_for(read, 10, "the task rows")  # type: ignore[no-any-return]


def _attrs(b: Any, css: str) -> dict[str, str]:
    """An element's class, title and text read in one script (a live refresh may replace the
    element between two WebDriver calls)."""
    script = (
        "var e = document.querySelector(arguments[0]); return e && "
        "{cls: e.className, title: e.title, text: e.textContent.trim(), "
        "href: e.getAttribute('href') || '', bg: getComputedStyle(e).backgroundColor};"
    )
    return wait_for(lambda: b.execute_script(script, css), 15, css)  # type: ignore[no-any-return]


def _query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


@needs_browser
def test_the_newest_failure_comes_first_with_its_error(env: Env) -> None:
    b = env.browser
    c = env.d.client
    before = env.submit("echo fine", "--driver-type", "android", "--tenant", "ui")
    wait_for(lambda: c.get(before).status == TaskStatus.done, 60, "done")
    bad = env.submit("echo 'step 1 ok' >&2; echo 'boom: <b>disk</b> & full' >&2; exit 3",
                     "--driver-type", "android", "--tenant", "ui")  # fmt: skip
    wait_for(lambda: c.get(bad).status == TaskStatus.failed, 60, "failed")
    after = env.submit("echo later", "--driver-type", "android", "--tenant", "ui")
    wait_for(lambda: c.get(after).status == TaskStatus.done, 60, "done")
    b.get(env.ro + "/tasks")
    _wait_css(b, f"#tasks tr[data-task='{bad}']")
    ids = _row_ids(b)
    assert ids[0] == bad  # above the done tasks of before and after it
    assert ids.index(after) < ids.index(before)  # done ones newest first
    err = _attrs(b, f"#tasks tr[data-task='{bad}'] td.err")
    assert err["text"] == "boom: <b>disk</b> & full"  # its last line, escaped: shown as text
    assert "runner_failed" in _attrs(b, f"tr[data-task='{bad}']")["text"]
    assert "tab-failed" in _attrs(b, "#status-tabs a[data-status='failed']")["cls"]
    _shot(b, "tasks-failures")
    # a status tab keeps the other filters
    b.get(env.ro + "/tasks?" + urllib.parse.urlencode({"tenant": "ui", "limit": "25"}))
    _click(b, "#status-tabs a[data-status='done']")
    wait_for(lambda: _query(b.current_url).get("status") == "done", 10, "the done tab")
    assert _query(b.current_url) == {"status": "done", "tenant": "ui", "limit": "25"}
    assert set(_row_ids(b)) == {before, after}


@needs_browser
def test_filters_survive_a_task_page_and_an_action(env: Env) -> None:
    b = env.browser
    c = env.d.client
    tid = env.submit("parked", "--driver-type", "no-such-rig", "--tenant", "keep")
    _login(env, "/tasks")
    flt = {"status": "queued", "tenant": "keep", "limit": "25"}
    b.get(env.op + "/tasks?" + urllib.parse.urlencode(flt))
    _click(b, f"#tasks tr[data-task='{tid}'] a[href^='/tasks/{tid}']")
    _wait_css(b, f"#cancel-{tid}")
    assert _query(b.current_url) == flt  # the task page carries the list
    assert _query(_attrs(b, "#back-to-list")["href"]) == flt
    _click(b, f"#cancel-{tid}")
    wait_for(lambda: b.switch_to.alert, 5, "the confirmation").accept()
    wait_for(lambda: c.get(tid).status == TaskStatus.cancelled, 20, "cancelled")
    _wait_css(b, ".flash")
    assert urllib.parse.urlsplit(b.current_url).path == f"/tasks/{tid}"
    assert _query(b.current_url) == flt  # still the filtered list's
    # retry: the new task's page, the list still carried
    _click(b, f"#retry-{tid}")
    wait_for(lambda: urllib.parse.urlsplit(b.current_url).path != f"/tasks/{tid}", 15,
             "the new task's page")  # fmt: skip
    new_id = _attrs(b, "#task-id")["text"]
    assert new_id != tid and _query(b.current_url) == flt
    _click(b, "#back-to-list")
    wait_for(lambda: urllib.parse.urlsplit(b.current_url).path == "/tasks", 10, "the list")
    assert _query(b.current_url) == flt
    assert new_id in _row_ids(b)
    c.cancel(new_id)
    # a carried list query is validated like the list's own
    assert _http(env.ro + f"/tasks/{tid}?status=bogus")[0] == 400


@needs_browser
def test_bulk_cancel_of_a_filtered_set_is_confirmed_and_limited(env: Env) -> None:
    from selenium.webdriver.common.by import By

    b = env.browser
    c = env.d.client
    mine = [env.submit(f"bulk {i}", "--driver-type", "no-such-rig", "--tag", "bulk1")
            for i in range(5)]  # fmt: skip
    other = [env.submit(f"other {i}", "--driver-type", "no-such-rig") for i in range(2)]
    _login(env, "/tasks")
    flt = {"status": "queued", "tag": "bulk1"}
    b.get(env.op + "/tasks?" + urllib.parse.urlencode(flt))
    _wait_css(b, f"#tasks tr[data-task='{mine[0]}']")
    _type(b, "#bulk-limit", "3")
    _click(b, "#bulk-cancel-filter")
    count = _wait_css(b, "#bulk-count")
    assert count.text == "3"
    assert b.find_elements(By.ID, "bulk-limited")  # the limit cut the selection
    shown = [r.get_attribute("data-task") for r in
             b.find_elements(By.CSS_SELECTOR, "#bulk-tasks tr[data-task]")]  # fmt: skip
    assert len(shown) == 3 and set(shown) <= set(mine)
    assert "status=queued tag=bulk1" in _attrs(b, "#bulk-scope")["text"]
    assert [c.get(t).status for t in mine] == [TaskStatus.queued] * 5  # nothing done yet
    _shot(b, "bulk-confirm")
    _click(b, "#bulk-apply")
    _wait_css(b, ".flash")
    assert "3 cancelled" in _attrs(b, ".flash")["text"]
    assert _query(b.current_url) == flt  # back to the filtered list
    status = {t: c.get(t).status for t in mine + other}
    assert {t for t, s in status.items() if s == TaskStatus.cancelled} == set(shown)
    # checked boxes: exactly the checked one
    rest = [t for t in mine if t not in shown]
    _click(b, f"#pick-{rest[0]}")
    # a live refresh of the list (an event of the pool) keeps the check
    seen = int(b.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes") or 0)
    other.append(env.submit("an event meanwhile", "--driver-type", "no-such-rig"))
    wait_for(lambda: int(b.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes")
                         or 0) > seen, 15, "a live refresh")  # fmt: skip
    assert _wait_css(b, f"#pick-{rest[0]}").is_selected()
    _shot(b, "tasks-bulk")
    _click(b, "#bulk-cancel-selected")
    assert _attrs(b, "#bulk-count")["text"] == "1"
    _click(b, "#bulk-apply")
    _wait_css(b, ".flash")
    assert c.get(rest[0]).status == TaskStatus.cancelled
    assert c.get(rest[1]).status == TaskStatus.queued
    assert {c.get(t).status for t in other} == {TaskStatus.queued}
    # bulk retry of the cancelled ones of the filter: new tasks, the old ones unchanged
    b.get(env.op + "/tasks?" + urllib.parse.urlencode({"status": "cancelled", "tag": "bulk1"}))
    _click(b, "#bulk-retry-filter")
    assert _attrs(b, "#bulk-count")["text"] == "4"
    _click(b, "#bulk-apply")
    flash = _attrs(b, ".flash")["text"]
    new_ids = re.findall(r"\b[0-9a-f]{16}\b", flash)
    assert len(new_ids) == 4 and not set(new_ids) & set(mine)
    assert {c.get(t).goal for t in new_ids} == {c.get(t).goal for t in mine if t != rest[1]}
    c.cancel_many([*new_ids, rest[1], *other])
    # cancel on a status it does not apply to: an error page, nothing changed
    b.get(env.op + "/tasks?" + urllib.parse.urlencode({"status": "done"}))
    _click(b, "#bulk-cancel-filter")
    msg = _attrs(b, "#error-message")["text"]
    assert "only queued, assigned, dispatched tasks can be cancelled" in msg


def test_bulk_actions_need_the_session_and_its_csrf_token(env: Env) -> None:
    tid = env.submit("queued forever", "--driver-type", "no-such-rig")
    for base in (env.op, env.ro):
        code, _, _ = _http(base + "/bulk/apply", {"op": "cancel", "ids": tid, "csrf": "x"})
        assert code == 403
    assert env.d.client.get(tid).status == TaskStatus.queued
    env.d.client.cancel(tid)


@needs_browser
def test_device_page_and_the_labelled_fleet_grid(env: Env) -> None:
    b = env.browser
    c, admin = env.d.client, env.d.admin
    tid = env.submit("echo on a wifi phone", "--driver-type", "android", "--tag", "wifi")
    wait_for(lambda: c.get(tid).status == TaskStatus.done, 60, "done")
    dev = c.get(tid).device_id
    assert dev is not None
    admin.quarantine("pixel-3", True, "cracked <screen>")
    wait_for(lambda: _try_reserve(env, "chrome-1"), 30, "chrome-1 reserved")
    try:
        b.get(env.ro + "/fleet")
        square = _attrs(b, "#hosts a.dev[data-device='pixel-3']")
        assert square["text"] == "pixel-3"  # a label, not only a tooltip
        assert "s-quarantined" in square["cls"]
        booked = _attrs(b, "#hosts a.dev[data-device='chrome-1']")
        assert "s-booked" in booked["cls"] and "alice: demo" in booked["title"]
        chip = _attrs(b, "#device-counts .chip[data-state='booked']")
        assert _attrs(b, "#device-counts .chip[data-state='booked'] b")["text"] == "1"
        assert chip["bg"] == booked["bg"] != "rgba(0, 0, 0, 0)"
        _shot(b, "fleet-labels")
        # a square links to its device's page: its history
        _click(b, f"#hosts a.dev[data-device='{dev}']")
        _wait_css(b, f"#device-history tr[data-task='{tid}']")
        assert urllib.parse.urlsplit(b.current_url).path == f"/devices/{dev}"
        row = _attrs(b, f"#device-history tr[data-task='{tid}']")["text"]
        assert "done" in row and "echo on a wifi phone" in row
        assert "lab-1" in _attrs(b, "#device-host")["text"]
        assert "never checked" in _attrs(b, "#device-health")["text"]
        _shot(b, "device")
        # the quarantine reason, escaped, and the change log
        b.get(env.ro + "/devices/pixel-3")
        assert "cracked <screen>" in _attrs(b, "#device-quarantine")["text"]
        assert "quarantined" in _attrs(b, "#device-log")["text"]
        # the booking
        b.get(env.ro + "/devices/chrome-1")
        booking = _attrs(b, "#device-booking")["text"]
        assert "alice: demo" in booking and "left" in booking
        assert "booked" in _attrs(b, "#device-log")["text"]
        assert _http(env.ro + "/devices/no-such-device")[0] == 404
        assert _http(env.ro + "/devices/%3Cx%3E")[0] == 400
    finally:
        admin.quarantine("pixel-3", False)
        if admin.reservation("chrome-1") is not None:
            admin.release("chrome-1")


def _try_reserve(env: Env, device_id: str) -> bool:
    from deviceq.core.errors import Busy

    try:
        env.d.admin.reserve(device_id, 600_000, "alice: demo")
        return True
    except Busy:
        return False


@needs_browser
def test_gang_task_page_lists_every_role(env: Env) -> None:
    b = env.browser
    c = env.d.client
    gid = env.submit("echo both at once", "--role", "phone=android:wifi", "--role",
                     "web=browser:gpu")  # fmt: skip
    wait_for(lambda: c.get(gid).status.terminal, 40, "the multi-device task finished")
    t = c.get(gid)
    assert t.roles is not None
    b.get(env.ro + f"/tasks/{gid}")
    _wait_css(b, "#roles tr[data-role='web']")
    phone = _attrs(b, "#roles tr[data-role='phone']")["text"]
    web = _attrs(b, "#roles tr[data-role='web']")["text"]
    assert "android" in phone and "wifi" in phone and "(leader)" in phone
    assert "browser" in web and "gpu" in web and "chrome-2" in web and "lab-2" in web
    assert str(t.roles["phone"].device_id) in phone and "lab-1" in phone
    fields = _attrs(b, "#fields")["text"]
    assert "driver type any" not in fields and "2 roles" in fields
    assert "chrome-2" in fields and str(t.roles["phone"].device_id) in fields
    _shot(b, "task-gang")
    # the list shows its roles, not driver type "any"
    b.get(env.ro + "/tasks?" + urllib.parse.urlencode({"q": "both at once"}))
    row = _attrs(b, f"#tasks tr[data-task='{gid}']")["text"]
    assert "phone=android:wifi" in row and "web=browser:gpu" in row


@needs_browser
def test_device_page_shows_the_last_health_check(env: Env) -> None:
    b = env.browser
    env.d.command_host("lab-3", "rig-1:rig", extra=(
        "--health-check", "rig=sh -c 'echo \"probe: no usb <hub>\"; exit 1'"))  # fmt: skip
    wait_for(lambda: _health(env, "rig-1") == "unhealthy", 60, "rig-1's failed health check")
    b.get(env.ro + "/devices/rig-1")
    health = _attrs(b, "#device-health")["text"]
    assert "unhealthy" in health and "last check" in health
    assert "probe: no usb <hub>" in _attrs(b, "#health-output")["text"]
    assert "health" in _attrs(b, "#device-log")["text"]
    assert _attrs(b, "#device-state")["text"] == "unhealthy"


def _health(env: Env, device_id: str) -> str | None:
    try:
        return env.d.admin.device(device_id).health
    except Exception:  # not registered yet
        return None


def test_bulk_selection_limits_statuses_and_carried_queries(real_r: Any, pool: str) -> None:
    """What a bulk action selects and does, without the browser: the list's filter (its text
    too) through `Client.find`, the limit, the statuses an operation applies to, checked ids
    that cannot be acted on, and list queries carried through forms (validated)."""
    from deviceq import Client
    from deviceq.core.errors import InvalidInput
    from deviceq.dashboard import bulk
    from deviceq.dashboard.task_list import carried_query

    c = Client(real_r, pool)
    ids = c.submit_many(
        [
            {
                "goal": f"job {i}{' needle' if i % 3 == 0 else ''}",
                "driver_type": "nowhere",
                "tags": ["t1"],
            }
            for i in range(6)
        ]  # fmt: skip
    )
    needles = [t for i, t in enumerate(ids) if i % 3 == 0]
    sel = bulk.select(c, "cancel", "filter", [], "tag=t1&q=NEEDLE&after=queued", 10)
    assert [t.id for t in sel.tasks] == needles and not sel.hit_limit
    sel = bulk.select(c, "cancel", "filter", [], "tag=t1", 2)
    assert [t.id for t in sel.tasks] == ids[:2] and sel.hit_limit  # oldest first, as the CLI
    for args in (("retry", "filter", [], "status=queued"), ("cancel", "selected", [], "")):
        with pytest.raises(InvalidInput):
            bulk.select(c, *args, 10)  # type: ignore[arg-type]
    c.cancel(ids[0])
    sel = bulk.select(c, "retry", "selected", [ids[0], ids[1]], "", 10)
    assert [t.id for t in sel.tasks] == [ids[0]] and [t.id for t in sel.skipped] == [ids[1]]
    queued = c.counts()["queued"]
    with pytest.raises(InvalidInput, match="nothing was retried"):
        bulk.apply_op(c, "retry", [ids[0], ids[1]])  # every id checked first
    assert c.counts()["queued"] == queued
    assert "1 task(s) retried" in bulk.apply_op(c, "retry", [ids[0]])
    assert "2 cancelled" in bulk.apply_op(c, "cancel", ids[1:3])
    for bad in ("0", "1001", "x", ""):
        with pytest.raises(InvalidInput):
            bulk._limit(bad)
    assert carried_query("tag=t1&status=failed&after=failed") == "status=failed&tag=t1&after=failed"
    for bad in ("status=bogus", "nope=1", "host=%3Cx%3E", "after=failed:x:y", "q=" + "x" * 2001):
        assert carried_query(bad) == "", bad
