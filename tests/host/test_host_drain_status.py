"""`deviceq status` and `host list` while a host's daemon drains after SIGTERM: the host line
says it is draining (as its devices do), in ``--json`` too (``draining`` and ``stopping``),
and once the daemon has stopped it no longer does. A real `deviceq host run`, a long task
running."""

from __future__ import annotations

import json
import re
import signal

from deviceq import TaskStatus
from harness import Deployment, deviceq, wait_for


def host_row(text: str, host_id: str) -> list[str]:
    """The cells of ``host_id``'s row in a table printed by the CLI (piped: plain text)."""
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line)]
        if host_id in cells:
            return [c for c in cells if c]
    raise AssertionError(f"no row for {host_id} in:\n{text}")


def test_status_says_a_host_drains_while_its_daemon_finishes_after_sigterm(
    deploy: Deployment,
) -> None:
    deploy.configure(lease_ttl=30, claim_ttl=30, host_timeout=3)
    deploy.scheduler()
    h = deploy.command_host("h1", "d1:android", extra=("--grace", "60"))
    started, go = deploy.tmp / "started", deploy.tmp / "go"
    tid = deploy.client.submit(f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done")
    wait_for(started.exists, 30, "the task running")
    out = deviceq(deploy.url, deploy.pool, "status").stdout
    assert host_row(out, "h1")[:3] == ["h1", "yes", "no"]  # host, alive, draining

    h.send_signal(signal.SIGTERM)
    wait_for(lambda: deploy.admin.host("h1").stopping, 10, "the daemon draining")
    res = deviceq(deploy.url, deploy.pool, "status")
    assert res.returncode == 0, res.stderr
    assert host_row(res.stdout, "h1")[:3] == ["h1", "yes", "yes"], res.stdout
    data = json.loads(deviceq(deploy.url, deploy.pool, "status", "--json").stdout)
    (host,) = [x for x in data["hosts"] if x["host_id"] == "h1"]
    assert (host["draining"], host["stopping"]) == (True, True) and host["session"]
    listed = json.loads(deviceq(deploy.url, deploy.pool, "host", "list", "--json").stdout)
    assert [(x["draining"], x["stopping"]) for x in listed] == [(True, True)]
    assert host_row(deviceq(deploy.url, deploy.pool, "host", "list").stdout, "h1")[2] == "yes"
    devices = json.loads(deviceq(deploy.url, deploy.pool, "device", "list", "--json").stdout)
    assert [d["host_draining"] for d in devices] == [True]  # what the devices said already
    assert deploy.status(tid) is TaskStatus.dispatched  # still running through the drain

    go.touch()
    assert h.wait(30) == 0
    assert deploy.client.wait(tid, timeout=10).status is TaskStatus.done
    data = json.loads(deviceq(deploy.url, deploy.pool, "status", "--json").stdout)
    (host,) = data["hosts"]
    assert (host["draining"], host["stopping"], host["session"]) == (False, True, None)

    # an operator's drain is the other reason, and outlives the daemon
    deploy.admin.drain("h1")
    data = json.loads(deviceq(deploy.url, deploy.pool, "host", "list", "--json").stdout)
    assert [(x["draining"], x["stopping"]) for x in data] == [(True, True)]
    assert host_row(deviceq(deploy.url, deploy.pool, "status").stdout, "h1")[2] == "yes"
