"""Makes ``docs/dashboard-live-log.png``: the dashboard's task page showing a live log.

A private redis-server, a real ``deviceq host run`` (command runner, two devices), a
``deviceq scheduler run`` and ``deviceq dashboard``; one task prints a progress line every
half second; headless Chromium (``/usr/bin/chromium`` through ``/usr/bin/chromedriver``, as
in tests/ops/test_dashboard.py) opens its task page while it runs and saves the screenshot once
a few lines are there (the log is still streaming: the page shows it live).

Run from the repository root: ``python -m bench.dashboard.screenshot_live_log [--out FILE]``."""

from __future__ import annotations

import argparse
import socket
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.support.deviceq_daemons import add_host  # noqa: E402
from bench.support.procs import REPO, Registry, child_env, cli, interrupt_on_signals, log  # noqa: E402
from deviceq import Client  # noqa: E402

POOL = "lab"
GOAL = (
    "echo flashing build 2026.12.01-rc2 onto $DEVICEQ_DEVICE_ID; "
    'for i in $(seq 1 60); do echo "[$(date +%T)] step $i/60: test_case_$i passed"; '
    '[ $((i % 7)) -eq 0 ] && echo "warning: retrying adb shell after a timeout" >&2; '
    "sleep 0.5; done"
)
LINES_BEFORE_SHOT = 12  # progress lines on the page before the screenshot


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = cond()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(0.1)
    raise TimeoutError(f"no {what} after {timeout:.0f} s")


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1360,900", "--hide-scrollbars"):  # fmt: skip
        opts.add_argument(arg)
    b = webdriver.Chrome(options=opts, service=Service("/usr/bin/chromedriver"))
    b.set_page_load_timeout(30)
    return b


def shoot(reg: Registry, out: Path) -> None:
    server = reg.redis_server()
    env = child_env({})
    base = [cli(), "--redis-url", server.url, "--pool", POOL]
    token_file = add_host(reg, base, env)
    reg.spawn("host", [
        *base, "host", "run", "--host-id", "bench-host", "--token-file", str(token_file),
        "--device", "pixel-7:android:wifi", "--device", "pixel-8:android:wifi,camera",
        "--goal-runner", "command", "--command", "sh -c {goal}",
        "--state-dir", str(reg.tmp / "state"),
    ], env)  # fmt: skip
    reg.spawn("scheduler", [*base, "scheduler", "run"], env)
    port = free_port()
    reg.spawn("dashboard", [*base, "dashboard", "--port", str(port)], env)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: urllib.request.urlopen(url + "/healthz", timeout=2).status == 200, 30,
             "dashboard")  # fmt: skip
    client = Client(server.url, POOL)
    task_id = client.submit(GOAL, driver_type="android", tags=["wifi"])
    wait_for(lambda: client.get(task_id).status.value == "dispatched", 30, "dispatched task")
    b = browser()
    try:
        from selenium.webdriver.common.by import By

        b.get(f"{url}/tasks/{task_id}")
        log_el = wait_for(
            lambda: b.find_elements(By.CSS_SELECTOR, "#task-log[data-log-stream]"), 20, "log"
        )[0]
        wait_for(lambda: f"step {LINES_BEFORE_SHOT}/" in (log_el.get_attribute("textContent")
                 or ""), 60, "progress lines")  # fmt: skip
        # the whole page, down to the log's last line (at most 2400 px high)
        time.sleep(0.5)  # let the page paint the last chunk
        height = int(b.execute_script("return document.documentElement.scrollHeight"))
        b.set_window_size(1360, min(2400, max(900, height + 60)))
        time.sleep(0.3)
        out.parent.mkdir(parents=True, exist_ok=True)
        b.save_screenshot(str(out))
    finally:
        b.quit()
        client.cancel(task_id)
        client.close()
    log(f"wrote {out} (task {task_id})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard-live-log.png",
                   help="where the PNG goes")  # fmt: skip
    a = p.parse_args()
    interrupt_on_signals()
    reg = Registry()
    try:
        shoot(reg, a.out)
    finally:
        reg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
