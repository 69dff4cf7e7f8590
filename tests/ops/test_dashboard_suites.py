"""The dashboard's suite pages as a real server process over HTTP: the suites list, a suite's
page with its progress, failed tests (with their devices) before flaky ones before the shards,
and its ETA while it runs; an unknown suite is 404, a malformed id 400."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from test_dashboard_outage import _dashboard, _get, _stop

from deviceq.services.suite_watch import SuiteWatcher
from harness import free_port, wait_for


def test_the_suite_pages(real_fleet: Any, redis_url: str, tmp_path: Path) -> None:
    f = real_fleet
    store = tmp_path / "store"
    f.admin.set_config("artifact_store", f"file://{store}")
    h = f.add_host("h1", ("p1", "android", ()), ("p2", "android", ()))
    tests = ["com.A#ok", "com.A#bad", "com.A#late"]
    s = f.client.submit_suite("smoke", tests, command="run {tests}", driver_type="android",
                              shards=2)  # fmt: skip
    first = s.shards[0]
    bad = first.tests[0]
    f.store.commit([(first.task_id, "p1")])
    (a,) = h.claim(5)
    h.report(first.task_id, a.lease_id, "failed", "runner_failed", "a test failed")
    cases = "".join(
        f'<testcase classname="com.A" name="{t.split("#")[1]}" time="1">'
        + ('<failure message="boom"/>' if t == bad else "") + "</testcase>"
        for t in first.tests
    )  # fmt: skip
    data = f"<testsuite>{cases}</testsuite>".encode()
    path = store / f.pool / first.task_id / "1" / "junit.xml"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    h.record_artifacts(
        first.task_id, 1, [("junit.xml", len(data), hashlib.sha256(data).hexdigest())]
    )
    assert SuiteWatcher(f.client, lambda: None).look(s.id, None) == 1

    port = free_port()
    proc, _ = _dashboard(redis_url, f.pool, tmp_path, port)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(base + "/healthz")[0] == 200, 20, "the dashboard")
        status, page = _get(base + "/suites")
        assert status == 200 and f'href="/suites/{s.id}"' in page and "smoke" in page
        status, page = _get(base + f"/suites/{s.id}")
        assert status == 200, page
        assert 'id="suite-status">running' in page and 'id="suite-eta">in ' in page
        failed_at = page.index('id="suite-failed"')
        assert page.index(bad, failed_at) < page.index('id="suite-flaky"')
        assert 'failed on <a href="/devices/p1">p1</a>' in page
        assert page.index('id="suite-flaky"') < page.index('id="suite-shards"')
        assert f'href="/tasks/{s.shards[1].task_id}"' in page
        assert _get(base + "/suites/nosuch")[0] == 404
        assert _get(base + "/suites/bad%20id")[0] == 400
    finally:
        _stop(proc)
