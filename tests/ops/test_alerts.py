"""The Prometheus alerting rules shipped in deploy/prometheus/: checked and unit-tested by
Debian's `promtool`, and evaluated by a real `prometheus` scraping a live pool's scheduler
(`deviceq scheduler run --metrics-port`)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import system_tools
from deviceq import HostClient
from deviceq.host.link import DeviceReport
from harness import Deployment, free_port, wait_for

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def tool(name: str) -> str:
    """The path of ``promtool`` or ``prometheus`` (Debian's prometheus package: installed by
    the first test that needs it when the run may, else the test fails saying how)."""
    return system_tools.prometheus()[name]


def test_the_rules_are_valid_and_their_unit_tests_pass() -> None:
    check = subprocess.run([tool("promtool"), "check", "rules", str(RULES / "alerts.yml")],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 7 rules found" in check.stdout
    unit = subprocess.run([tool("promtool"), "test", "rules", "alerts.test.yml"], cwd=RULES,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert unit.returncode == 0, unit.stdout + unit.stderr


class Prometheus:
    """A real prometheus scraping ``target`` every second, the shipped rules loaded with their
    ``for`` durations cut to 1 s (their expressions unchanged: the durations are what
    alerts.test.yml checks)."""

    def __init__(self, tmp: Path, target: str) -> None:
        rules = (RULES / "alerts.yml").read_text()
        lines = [
            ("        for: 1s" if line.strip().startswith("for:") else line)
            for line in rules.splitlines()
        ]
        (tmp / "alerts.yml").write_text("\n".join(lines) + "\n")
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "rule_files: [alerts.yml]\n"
            "scrape_configs:\n"
            "  - job_name: deviceq-scheduler\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.port = free_port()
        self.log = (tmp / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def firing(self) -> dict[str, dict[str, Any]]:
        """Firing alerts by name (empty while prometheus is still starting)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/alerts"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                alerts = json.load(resp)["data"]["alerts"]
        except OSError:
            return {}
        return {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def prom_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "prom"
    d.mkdir()
    yield d


def test_a_real_prometheus_fires_the_alerts_of_a_live_pool(
    deploy: Deployment, prom_dir: Path
) -> None:
    d = deploy
    port = free_port()
    scheduler = d.spawn("scheduler", "scheduler", "run", "--tick", "0.2",
                        "--metrics-port", str(port))  # fmt: skip
    d.command_host("h1", "d1:x", "d2:x")
    wait_for(lambda: len(d.admin.devices()) == 2, 30, "h1's devices")
    # a host that heartbeats once and then stops (dead after host_timeout, 2 s here)
    gone = HostClient(d.r, d.pool, "gone", d.admin.add_host("gone"))
    gone.heartbeat([DeviceReport("g1", "x", ())])
    d.admin.quarantine("d2", reason="usb flapping")
    prom = Prometheus(prom_dir, f"127.0.0.1:{port}")
    try:

        def both() -> dict[str, dict[str, Any]] | None:
            f = prom.firing()
            return f if {"DeviceqHostDead", "DeviceqDeviceQuarantined"} <= set(f) else None

        fired = wait_for(both, 60, "the host-dead and quarantine alerts")
        assert fired["DeviceqHostDead"]["labels"]["pool"] == d.pool
        assert fired["DeviceqDeviceQuarantined"]["labels"]["pool"] == d.pool
        assert fired["DeviceqDeviceQuarantined"]["annotations"]["summary"] == (
            f"deviceq pool {d.pool}: 1 device(s) quarantined"
        )
        # the scheduler leads and Redis answers: those alerts stay quiet
        time.sleep(3)
        quiet = prom.firing()
        for name in ("DeviceqNoLeader", "DeviceqSchedulerDown", "DeviceqRedisUnreachable"):
            assert name not in quiet, quiet[name]
        # the only scheduler dies: nothing can be scraped
        scheduler.send_signal(signal.SIGKILL)
        wait_for(lambda: "DeviceqSchedulerDown" in prom.firing(), 60, "scheduler-down alert")
    finally:
        prom.close()
