"""The host worker daemon end to end, as real processes: `deviceq host run` hosts and the
`deviceq scheduler run` daemon on a private Redis server. Faults are real: SIGKILL, SIGTERM,
a Redis server restart, a runner holding the GIL."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deviceq import FailureKind, TaskStatus
from deviceq.cli import main
from deviceq.cli.host_run_settings import build_settings, load_config_file
from deviceq.core.errors import ConfigError
from deviceq.host.runners import Outcome, RunnerSpec, Task
from harness import CLI, Deployment, live_group_members, wait_for
from runner_kinds import KINDS, host_flags

# -- runners the daemons load by import path (PYTHONPATH includes tests/) ----------------------


def gil_or_hang(task: Task) -> str:
    """``hog N``: hold the GIL N seconds (libc sleep through PyDLL); ``hang``: never return,
    ignoring the cancellation signal."""
    if task.goal.startswith("hog"):
        ctypes.PyDLL(None).sleep(int(task.goal.split()[1]))
        return "hogged"
    while True:
        time.sleep(0.05)


# -- end to end ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_goal_and_workflow_tasks_end_to_end_with_command_runner(
    deploy: Deployment, kind: str
) -> None:
    marker = deploy.tmp / "never"
    deploy.client.put_workflow(
        {
            "name": "smoke",
            "steps": [
                {"name": "boot", "goal": "echo booted $DEVICEQ_WORKFLOW"},
                {"name": "check", "goal": "echo checked step $DEVICEQ_STEP on $DEVICEQ_DEVICE_ID"},
            ],
        }
    )
    deploy.client.put_workflow({"name": "broken", "steps": [
        {"goal": "echo step one fails >&2; exit 5"}, {"goal": f"touch {marker}"}]})  # fmt: skip
    deploy.scheduler()
    deploy.command_host("h1", "d1:android:wifi", "d2:android", env={"DEVICEQ_LOG_LEVEL": "debug"},
                        extra=host_flags(kind))  # fmt: skip
    ok = deploy.client.submit("echo hello from $DEVICEQ_DEVICE_ID", driver_type="android",
                              tags=["wifi"])  # fmt: skip
    bad = deploy.client.submit("echo broken >&2; exit 3")
    wf = deploy.client.submit(workflow="smoke", tags=["wifi"])
    wf_bad = deploy.client.submit(workflow="broken")
    t_ok, t_bad, t_wf, t_wf_bad = deploy.wait_all([ok, bad, wf, wf_bad], timeout=30)

    assert (t_ok.status, t_ok.result, t_ok.device_id) == (
        TaskStatus.done, "hello from d1\n", "d1")  # fmt: skip
    assert (t_bad.status, t_bad.failure_kind) == (TaskStatus.failed, FailureKind.runner_failed)
    assert t_bad.error == "exit code 3\nbroken"
    assert t_bad.attempt == 1  # a reported failure is final: no retry by the worker
    assert t_wf.status is TaskStatus.done
    assert t_wf.result == "step 1/2 (boot): booted smoke\nstep 2/2 (check): checked step 2 on d1"
    assert (t_wf_bad.status, t_wf_bad.failure_kind) == (
        TaskStatus.failed, FailureKind.runner_failed)  # fmt: skip
    assert t_wf_bad.error.startswith("step 1/2 failed: exit code 5\nstep one fails")
    assert not marker.exists()
    log = deploy.log("h1")
    assert f"task={ok}" in log and f"lease={ok}-a1" in log and "device=d1" in log
    assert deploy.admin.host("h1").alive


def test_sigkill_host_its_tasks_finish_on_another_host_after_lease_expiry(
    deploy: Deployment,
) -> None:
    # host_timeout well above lease_ttl: the dead host still looks alive by its heartbeat when
    # its leases expire; its devices are suspect from then on, so the retries go to hB
    deploy.configure(lease_ttl=2, claim_ttl=2, host_timeout=30)
    deploy.scheduler()
    goal = "sleep $DQ_SLEEP; echo ran on $DEVICEQ_DEVICE_ID"
    a = deploy.command_host("hA", "a1:android", "a2:android", env={"DQ_SLEEP": "20"})
    ids = [deploy.client.submit(goal, max_attempts=3) for _ in range(2)]
    wait_for(lambda: all(deploy.status(t) is TaskStatus.dispatched for t in ids), 20,
             "both tasks running on hA")  # fmt: skip
    deploy.command_host("hB", "b1:android", "b2:android", env={"DQ_SLEEP": "0.2"})
    wait_for(lambda: deploy.alive("hB"), 20, "hB alive")
    a.send_signal(signal.SIGKILL)
    a.wait(5)
    for t in deploy.wait_all(ids, timeout=30):
        assert t.status is TaskStatus.done, t
        assert t.attempt <= t.max_attempts
        assert t.host_id == "hB" and t.result == f"ran on {t.device_id}\n"
        first, last = t.attempts[0], t.attempts[-1]
        assert (first.host_id, first.outcome, first.failure_kind) == (
            "hA", "expired", "lease_expired")  # fmt: skip
        assert first.expired_in == "dispatched"
        assert (last.host_id, last.outcome) == ("hB", "done")


def test_restarted_host_hands_back_what_its_killed_run_left_without_waiting_for_expiry(
    deploy: Deployment,
) -> None:
    deploy.configure(lease_ttl=60, claim_ttl=60)  # expiry would take a minute
    started = deploy.tmp / "started"
    deploy.scheduler()
    h = deploy.command_host("h1", "d1:android")
    tid = deploy.client.submit(f"[ -e {started} ] || {{ touch {started}; sleep 30; }}; echo ok")
    wait_for(started.exists, 20, "first attempt running")
    h.send_signal(signal.SIGKILL)
    h.wait(5)
    begun = time.monotonic()
    deploy.command_host("h1", "d1:android")
    t = deploy.client.wait(tid, timeout=20)
    assert time.monotonic() - begun < 15
    assert (t.status, t.result, t.attempt) == (TaskStatus.done, "ok\n", 2)
    assert [a.outcome for a in t.attempts] == ["released", "done"]
    assert "(its daemon is gone)" in deploy.log("h1") and "handed_back=1" in deploy.log("h1")


@pytest.mark.parametrize("kind", KINDS)
def test_sigterm_running_tasks_finish_nothing_new_is_claimed_exit_0(
    deploy: Deployment, tmp_path: Path, kind: str
) -> None:
    deploy.scheduler()
    h = deploy.command_host("h1", "d1:android", "d2:android",
                            extra=("--grace", "20", *host_flags(kind)))  # fmt: skip
    go = tmp_path / "go"  # the running tasks end once the drain has begun, however slow
    script = f"touch {tmp_path}/started.$$; while [ ! -e {go} ]; do sleep 0.05; done; echo finished"
    running = [deploy.client.submit(script) for _ in range(2)]
    # running, not only claimed: an assignment claimed but not yet started when the SIGTERM
    # comes is handed back (its attempt not spent), as it should be
    wait_for(lambda: len(list(tmp_path.glob("started.*"))) == 2, 20, "tasks running")
    waiting = [deploy.client.submit("echo should not run here") for _ in range(2)]
    h.send_signal(signal.SIGTERM)
    wait_for(lambda: deploy.admin.host("h1").stopping, 20, "the host marked stopping")
    go.touch()
    assert h.wait(20) == 0, deploy.log("h1")
    for t in deploy.client.get_many(running):
        got = (t.status, t.result, t.host_id)
        assert got == (TaskStatus.done, "finished\n", "h1"), (got, deploy.log("h1"))
    time.sleep(0.5)  # a scheduler pass or two
    for t in (deploy.client.get(x) for x in waiting):
        assert t.status is TaskStatus.queued and t.attempt == 0 and t.attempts == [], (
            t.status, t.attempts, deploy.log("h1"))  # fmt: skip
    host = deploy.admin.host("h1")
    assert host.stopping and not host.draining and host.session is None
    assert "draining" in deploy.log("h1")


def test_json_logs_carry_task_lease_host_device_on_every_task_line(deploy: Deployment) -> None:
    import json

    deploy.scheduler()
    h = deploy.command_host(
        "h1", "d1:android", env={"DEVICEQ_LOG_FORMAT": "json", "DEVICEQ_LOG_LEVEL": "debug"}
    )
    tid = deploy.client.submit("echo hi")
    assert deploy.client.wait(tid, timeout=20).status is TaskStatus.done
    h.send_signal(signal.SIGTERM)
    assert h.wait(20) == 0
    lines = [json.loads(x) for x in deploy.log("h1").splitlines()]
    about_task = [x for x in lines if x.get("task") == tid]
    assert {x["msg"] for x in about_task} >= {"claimed", "runner started", "reported done"}
    for x in about_task:
        assert (x["lease"], x["host"], x["device"]) == (f"{tid}-a1", "h1", "d1"), x
    assert deploy.admin.host("h1").stopping
    assert not any(deploy.tokens_in(line) for line in deploy.log("h1").splitlines())


def test_worker_runs_in_process_and_stops_from_another_thread(deploy: Deployment) -> None:
    import threading

    from deviceq.host.daemon import HostWorker
    from deviceq.host.settings import WorkerSettings

    token = deploy.admin.add_host("h1")
    settings = WorkerSettings(
        "h1", ["d1:sim", "d2:sim:fast"], RunnerSpec("sim"), grace=5, poll_interval=0.5
    )
    worker = HostWorker(deploy.url, deploy.pool, settings, token)
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(worker.run()))
    t.start()
    try:
        ids = deploy.client.submit_many([{"goal": f"g{i}"} for i in range(6)])
        wait_for(lambda: deploy.alive("h1"), 10, "h1 alive")

        def dispatch(tid: str) -> bool:  # to whichever device is free (no scheduler here)
            return any(deploy.store.commit([(tid, d)])[0].startswith("ok:") for d in ("d1", "d2"))

        for tid in ids:
            wait_for(lambda tid=tid: dispatch(tid), 20, "a free device")
        assert all(x.status is TaskStatus.done for x in deploy.wait_all(ids, timeout=20))
    finally:
        worker.stop()
        t.join(20)
    assert codes == [0] and deploy.admin.host("h1").stopping


@pytest.mark.parametrize("kind", KINDS)
def test_sigterm_grace_over_hands_running_work_back_at_once(deploy: Deployment, kind: str) -> None:
    pidfile = deploy.tmp / "pid"
    deploy.configure(lease_ttl=30, claim_ttl=30)  # a release, not an expiry, must requeue
    deploy.scheduler()
    flags = ("--grace", "0.5", "--stop-grace", "1", *host_flags(kind))
    h = deploy.command_host("h1", "d1:android", extra=flags)
    tid = deploy.client.submit(f"echo $$ > {pidfile}; sleep 60")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 20, "command started")
    pgid = int(pidfile.read_text())
    started = time.monotonic()
    h.send_signal(signal.SIGTERM)
    assert h.wait(20) == 0
    assert time.monotonic() - started < 10
    t = deploy.client.get(tid)
    assert (t.status, t.attempt) == (TaskStatus.queued, 1)
    assert [a.outcome for a in t.attempts] == ["released"]
    assert live_group_members(pgid) == []


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_running_task_kills_its_process_group(deploy: Deployment, kind: str) -> None:
    pidfile = deploy.tmp / "pid"
    deploy.scheduler()
    deploy.command_host("h1", "d1:android", extra=host_flags(kind))
    # the group id (the command runs under its lease watchdog, which leads the group)
    tid = deploy.client.submit(
        f"cut -d' ' -f5 /proc/$$/stat > {pidfile}; sleep 60 & sleep 60; wait"
    )
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 20, "command started")
    pgid = int(pidfile.read_text())
    wait_for(lambda: len(live_group_members(pgid)) >= 3, 5, "watchdog, shell, background sleep")
    assert deploy.client.cancel(tid) == "requested"
    t = deploy.client.wait(tid, timeout=15)
    assert (t.status, t.failure_kind) == (TaskStatus.cancelled, FailureKind.cancelled)
    assert [a.outcome for a in t.attempts] == ["cancelled"]
    wait_for(lambda: live_group_members(pgid) == [], 5, "process group gone")
    # the device is free again: the next task runs
    nxt = deploy.client.submit("echo next")
    assert deploy.client.wait(nxt, timeout=15).status is TaskStatus.done


def test_gil_holding_or_hanging_runner_keeps_its_lease_while_host_lives(
    deploy: Deployment,
) -> None:
    deploy.configure(lease_ttl=1.5, claim_ttl=2.0)
    deploy.scheduler()
    deploy.host(
        "h1",
        "d1:android",
        "d2:android",
        extra=("--goal-runner", "test_worker:gil_or_hang", "--stop-grace", "1"),
    )
    hog = deploy.client.submit("hog 4", max_attempts=1)
    hang = deploy.client.submit("hang", max_attempts=1)
    t = deploy.client.wait(hog, timeout=30)
    assert (t.status, t.result, t.attempt) == (TaskStatus.done, "hogged", 1)
    assert [a.outcome for a in t.attempts] == ["done"]
    time.sleep(2.0)  # > lease_ttl more: the hanging runner's lease is still renewed
    h = deploy.client.get(hang)
    assert (h.status, h.attempt) == (TaskStatus.dispatched, 1)
    assert [a.outcome for a in h.attempts] == ["active"]
    assert deploy.client.cancel(hang) == "requested"
    h = deploy.client.wait(hang, timeout=15)
    assert h.status is TaskStatus.cancelled and [a.outcome for a in h.attempts] == ["cancelled"]
    assert not any(e.type == "expired" for e in deploy.client.events())


@pytest.mark.parametrize("kind", KINDS)
def test_lost_lease_stops_the_runner_and_reports_nothing(deploy: Deployment, kind: str) -> None:
    pidfile = deploy.tmp / "pid"
    h = deploy.command_host("h1", "d1:android", extra=host_flags(kind))  # dispatched by hand
    wait_for(lambda: deploy.alive("h1"), 20, "h1 alive")
    tid = deploy.client.submit(f"echo $$ > {pidfile}; sleep 60", max_attempts=3)
    deploy.admin.dispatch(tid, "d1")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 20, "command started")
    pgid = int(pidfile.read_text())
    # the lease runs out (as if the host had been cut off): force its expiry now
    deploy.r.hset(deploy.client.keys.task(tid), "lease_expires_at", 1)
    deploy.r.zadd(deploy.client.keys.leases, {tid: 1})
    assert deploy.store.expire()["requeued"] == 1
    wait_for(lambda: live_group_members(pgid) == [], 10, "runner stopped")
    wait_for(lambda: "lease lost" in deploy.log("h1"), 5, "lease lost logged")
    time.sleep(0.5)
    t = deploy.client.get(tid)
    assert (t.status, t.attempt) == (TaskStatus.queued, 1)
    assert [a.outcome for a in t.attempts] == ["expired"]
    assert 'msg="reported' not in deploy.log("h1")
    kinds = {e.type for e in deploy.client.events(task=tid)}
    assert "expired" in kinds and not kinds & {"done", "failed", "cancelled", "released"}
    assert h.poll() is None


def test_hosts_survive_a_redis_restart(private_redis: Any, pool: str, tmp_path: Path) -> None:
    deploy = Deployment(private_redis.url, pool, tmp_path)
    try:
        deploy.configure(lease_ttl=4.0, claim_ttl=4.0, host_timeout=4.0)
        deploy.scheduler()
        sim = ("--goal-runner", "sim", "--sim-duration", "0.2")
        hosts = [deploy.host("h1", "d1:sim", "d2:sim", extra=sim),
                 deploy.host("h2", "d3:sim", "d4:sim", extra=sim)]  # fmt: skip
        ids = deploy.client.submit_many([{"goal": f"job {i}"} for i in range(40)])
        wait_for(lambda: deploy.client.counts()["done"] >= 6, 30, "first tasks done")
        time.sleep(1.1)  # the AOF is fsynced every second
        done_before = deploy.client.counts()["done"]
        private_redis.restart(down_for=1.0)
        deploy.r.connection_pool.disconnect()
        for t in deploy.wait_all(ids, timeout=60):
            assert t.status is TaskStatus.done, t
        assert done_before < 40
        for h in hosts:
            assert h.poll() is None
        wait_for(lambda: deploy.alive("h1") and deploy.alive("h2"), 10, "hosts heartbeating")
        by_host = {t.host_id for t in deploy.client.get_many(ids)}
        assert by_host == {"h1", "h2"}
        logs = deploy.log("h1") + deploy.log("h2")
        assert "redis unreachable at" in logs and "redis reachable again after" in logs
    finally:
        deploy.close()


def test_report_during_a_redis_outage_is_retried_until_accepted(
    private_redis: Any, pool: str, tmp_path: Path
) -> None:
    deploy = Deployment(private_redis.url, pool, tmp_path)
    try:
        deploy.configure(lease_ttl=8.0, claim_ttl=8.0, host_timeout=8.0)
        h = deploy.command_host(  # no scheduler: dispatch by hand
            "h1", "d1:android", env={"DEVICEQ_LOG_LEVEL": "debug"}
        )
        wait_for(lambda: deploy.alive("h1"), 20, "h1 alive")
        started, go = deploy.tmp / "started", deploy.tmp / "go"
        tid = deploy.client.submit(
            f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done; echo survived"
        )
        deploy.admin.dispatch(tid, "d1")
        wait_for(started.exists, 20, "command started")
        time.sleep(2.1)  # the claim is in the AOF (fsynced every second)
        private_redis.kill()
        go.touch()  # the command ends while Redis is down: its report cannot get through
        wait_for(lambda: "redis unreachable at" in deploy.log("h1"), 10, "the outage seen")
        time.sleep(1.5)  # the command has ended, its report is being retried
        private_redis.start()
        deploy.r.connection_pool.disconnect()
        t = deploy.client.wait(tid, timeout=20)
        assert (t.status, t.result, t.attempt) == (TaskStatus.done, "survived\n", 1)
        assert [a.outcome for a in t.attempts] == ["done"]
        wait_for(lambda: "answer=ok:done" in deploy.log("h1"), 5, "report answer logged")
        log = deploy.log("h1")  # the outage said once (not once per retry), and its end
        assert log.count("redis unreachable at") == 1 and "redis reachable again after" in log
        assert h.poll() is None
    finally:
        deploy.close()


def test_failing_device_is_quarantined_and_released_with_the_cli(deploy: Deployment) -> None:
    deploy.configure(quarantine_after=2, max_quarantine_fraction=1)
    deploy.scheduler()
    deploy.command_host("h1", "d1:android", extra=("--infra-exit-code", "75"))
    # the tasks' own failures (exit 1) never count against the device ...
    own = [deploy.client.submit("exit 1", max_attempts=1) for _ in range(3)]
    for t in deploy.wait_all(own, timeout=30):
        assert t.failure_kind is FailureKind.runner_failed
    assert not deploy.admin.device("d1").quarantined
    # ... infrastructure failures (the declared exit code) do
    first = [deploy.client.submit("exit 75", max_attempts=1) for _ in range(2)]
    for t in deploy.wait_all(first, timeout=30):
        assert t.failure_kind is FailureKind.infrastructure
    wait_for(lambda: deploy.admin.device("d1").quarantined, 5, "d1 quarantined")
    third = deploy.client.submit("echo fine")
    time.sleep(1.0)
    assert deploy.status(third) is TaskStatus.queued
    wait_for(lambda: "device quarantined" in deploy.log("h1"), 10, "worker noticed")
    cli = CliRunner()
    base = ["--redis-url", deploy.url, "--pool", deploy.pool]
    res = cli.invoke(main, [*base, "device", "unquarantine", "d1"])
    assert res.exit_code == 0 and "released" in res.output
    assert deploy.client.wait(third, timeout=15).status is TaskStatus.done
    res = cli.invoke(main, [*base, "device", "quarantine", "d1", "--json"])
    assert res.exit_code == 0 and '"quarantined"' in res.output
    assert deploy.admin.device("d1").quarantined
    res = cli.invoke(main, [*base, "device", "quarantine", "nope"])
    assert res.exit_code == 1 and "NotFound" in res.output


def test_device_check_reports_busy_and_offline_devices_and_they_get_no_work(
    deploy: Deployment,
) -> None:
    states = deploy.tmp / "states"
    states.mkdir()
    (states / "d1").write_text("0")
    (states / "d2").write_text("1")  # broken
    deploy.scheduler()
    deploy.command_host("h1", "d1:android", "d2:android", extra=(
        "--device-check", f"sh -c 'exit $(cat {states}/$0)' {{device_id}}",
        "--device-check-interval", "0.2"))  # fmt: skip
    wait_for(lambda: deploy.alive("h1"), 20, "h1 alive")
    assert (deploy.admin.device("d1").state.value, deploy.admin.device("d2").state.value) == (
        "idle", "offline")  # fmt: skip
    ids = [deploy.client.submit("echo $DEVICEQ_DEVICE_ID") for _ in range(3)]
    assert {t.result for t in deploy.wait_all(ids, timeout=30)} == {"d1\n"}
    (states / "d1").write_text("3")  # in use outside deviceq
    (states / "d2").write_text("0")  # repaired
    wait_for(lambda: deploy.admin.device("d1").state.value == "busy", 10, "d1 busy")
    wait_for(lambda: deploy.admin.device("d2").state.value == "idle", 10, "d2 idle")
    ids = [deploy.client.submit("echo $DEVICEQ_DEVICE_ID") for _ in range(2)]
    assert {t.result for t in deploy.wait_all(ids, timeout=30)} == {"d2\n"}
    assert "device now offline" in deploy.log("h1")


# -- command line ----------------------------------------------------------------------------


def test_host_run_with_a_wrong_token_fails_in_one_line(deploy: Deployment) -> None:
    deploy.admin.add_host("h1")
    secret = "wrong-token-value-123"
    run = [*CLI, "host", "run", "--host-id", "h1", "--device", "d1:x", "--command", "true"]
    proc = subprocess.run(run,
                          env={**os.environ, "DEVICEQ_REDIS_URL": deploy.url,
                               "DEVICEQ_POOL": deploy.pool, "DEVICEQ_HOST_TOKEN": secret},
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 2
    assert "wrong token for host h1" in proc.stderr and secret not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = subprocess.run(run,
                          env={k: v for k, v in os.environ.items() if k != "DEVICEQ_HOST_TOKEN"},
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 2 and "a host token is required" in proc.stderr  # could not start


def test_host_run_config_file_merges_under_options(tmp_path: Path) -> None:
    cfg = tmp_path / "host.yaml"
    (tmp_path / "tok").write_text("t0ken\n")
    cfg.write_text(
        "host_id: lab-1\n"
        f"token_file: {tmp_path / 'tok'}\n"
        "devices: ['p7:android:wifi,cam', {id: e1, driver_type: emu}]\n"
        "goal_runner: sim\n"
        "sim: {duration: 'exp:0.2', fail_rate: 0.1}\n"
        "grace: 12\n"
    )
    settings, token = build_settings({"grace": 3.0, "sim_seed": 5}, load_config_file(str(cfg)))
    assert token == "t0ken" and settings.host_id == "lab-1" and settings.grace == 3.0
    assert [(d.device_id, d.driver_type, d.tags) for d in settings.devices] == [
        ("p7", "android", ("cam", "wifi")), ("e1", "emu", ())]  # fmt: skip
    assert settings.goal_runner.name == "sim"
    assert dict(settings.goal_runner.options) == {
        "duration": "exp:0.2", "fail_rate": 0.1, "seed": 5}  # fmt: skip
    s2, _ = build_settings({"host_id": "h", "token": "t", "devices": ("d:x",),
                            "command": "adb -s {device_id} {goal}"}, {})  # fmt: skip
    assert (s2.goal_runner.name, s2.goal_runner.options["template"]) == (
        "command", "adb -s {device_id} {goal}")  # fmt: skip
    for bad in (
        {"host_id": "h", "token": "t"},  # no device
        {"host_id": "h", "token": "t", "devices": ("d:x",), "goal_runner": "command"},
        {"host_id": "h", "token": "t", "devices": ("nocolon",)},
        {"host_id": "h", "token": "t", "devices": ("d:x",), "bogus": 1},
    ):
        with pytest.raises((ConfigError, ValueError)):
            build_settings(bad, {})


def test_a_config_files_durations_are_numbers_or_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "host.yaml"
    base = "host_id: h\ntoken: t\ndevices: ['d:x']\ncommand: 'true'\n"
    cfg.write_text(base + "report_linger: '0.01'\npoll_interval: 3\n")
    settings, _ = build_settings({}, load_config_file(str(cfg)))
    assert (settings.report_linger, settings.poll_interval) == (0.01, 3.0)
    for line, said in (
        ("report_linger: abc", "report_linger must be a number of seconds, not 'abc'"),
        ("poll_interval: [1]", "poll_interval must be a number of seconds"),
        ("grace: .nan", "grace must be a finite number of seconds"),
        ("report_linger: 2", "report_linger must be between 0 and 1"),
        ("heartbeat_interval: soon", "heartbeat_interval must be a number of seconds"),
    ):
        cfg.write_text(base + line + "\n")
        with pytest.raises(ConfigError, match=re.escape(said)):
            build_settings({}, load_config_file(str(cfg)))


def test_at_info_a_host_logs_a_summary_not_a_line_per_task(deploy: Deployment) -> None:
    deploy.scheduler()
    h = deploy.command_host("h1", "d1:android", "d2:android")
    ids = deploy.client.submit_many([{"goal": "true"}] * 6)
    for t in deploy.wait_all(ids, timeout=30):
        assert t.status is TaskStatus.done
    wait_for(lambda: "msg=tasks" in deploy.log("h1"), 15, "a summary line")
    log = deploy.log("h1")
    assert "msg=claimed" not in log and 'msg="reported done"' not in log
    line = next(x for x in log.splitlines() if "msg=tasks" in x)
    assert "claimed=6" in line and "done=6" in line, line
    h.send_signal(signal.SIGTERM)
    assert h.wait(20) == 0


def test_async_applies_to_the_built_in_runners_and_is_refused_in_one_line_elsewhere(
    deploy: Deployment, tmp_path: Path
) -> None:
    """``--async`` (or ``async: true`` in the config file) picks the built-in runner's async
    kind; with a Python runner it is refused at start: exit 2, one line, nothing written."""
    base = {"host_id": "h", "token": "t", "devices": ("d:x",)}
    s, _ = build_settings({**base, "command": "true", "async_runs": True}, {})
    assert s.goal_runner is not None and s.goal_runner.options["async"] is True
    cfg = tmp_path / "host.yaml"
    cfg.write_text("host_id: h\ntoken: t\ndevices: ['d:x']\ngoal_runner: sim\nasync: true\n")
    s, _ = build_settings({}, load_config_file(str(cfg)))
    assert s.goal_runner is not None and dict(s.goal_runner.options) == {"async": True}
    cfg.write_text("host_id: h\ntoken: t\ndevices: ['d:x']\ncommand: 'true'\nasync: 'yes'\n")
    with pytest.raises(ConfigError, match="async must be true or false"):
        build_settings({}, load_config_file(str(cfg)))
    token = tmp_path / "h1.token"
    token.write_text(deploy.admin.add_host("h1"))
    before = sorted(deploy.r.scan_iter(f"dq:{{{deploy.pool}}}:*"))
    run = [*CLI, "host", "run", "--host-id", "h1", "--token-file", str(token), "--device",
           "d1:x", "--goal-runner", "test_worker:gil_or_hang", "--async"]  # fmt: skip
    proc = subprocess.run(run, env={**os.environ, "DEVICEQ_REDIS_URL": deploy.url,
                                    "DEVICEQ_POOL": deploy.pool},
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--async applies to the built-in runners" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(deploy.r.scan_iter(f"dq:{{{deploy.pool}}}:*")) == before
    helped = subprocess.run([*CLI, "host", "run", "--help"], capture_output=True, text=True,
                            timeout=30).stdout  # fmt: skip
    assert "--async" in helped and "event loop" in helped


async def wait_then_answer(task: Task) -> Outcome:
    """An async runner: awaits its goal's seconds (or its stop) and says where it ran."""
    if await task.wait_cancel(float(task.goal)):
        return Outcome.failure(f"stopped on {task.device_id}")
    return Outcome.success(f"waited on {task.device_id}")


def test_an_async_python_runner_runs_many_tasks_on_one_loop_without_a_thread_each(
    deploy: Deployment,
) -> None:
    """A host of 20 devices whose runner is an ``async def`` runs 20 tasks at once, each a
    coroutine on its one event loop: the daemon's thread count stays as it was with one
    task running (a thread runner would add a thread per run)."""
    deploy.scheduler()
    devices = [f"d{i}:x" for i in range(20)]
    h = deploy.host("h1", *devices, extra=("--goal-runner", "test_worker:wait_then_answer"))
    wait_for(lambda: deploy.alive("h1"), 30, "h1 alive")
    first = deploy.client.submit("30", driver_type="x")
    wait_for(lambda: deploy.status(first) is TaskStatus.dispatched, 30, "one task running")
    time.sleep(0.5)
    one = threads_of(h.pid)
    ids = [deploy.client.submit("30", driver_type="x") for _ in range(19)]
    wait_for(lambda: all(deploy.status(t) is TaskStatus.dispatched for t in ids), 30, "20 running")
    time.sleep(0.5)
    assert threads_of(h.pid) <= one + 1  # (+1: a thread of the host's own that may start)
    for t in [first, *ids]:
        assert deploy.client.cancel(t) == "requested"
    done = deploy.wait_all([first, *ids], timeout=30)
    assert {t.status for t in done} == {TaskStatus.cancelled}


def threads_of(pid: int) -> int:
    """The number of threads of process ``pid``."""
    return len(os.listdir(f"/proc/{pid}/task"))


def waits_for_its_stop(task: Task) -> Outcome:
    """A runner that runs until it is told to stop."""
    task.cancel.wait(600)
    return Outcome.failure("stopped")


def test_control_messages_in_quick_succession_are_each_acted_on_at_once(
    deploy: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two cancels of running tasks one right after the other: the second is acted on at once
    too, not held back with the heartbeats for control messages (pushed out to an hour here;
    the leases, of 10 minutes, would bring the cancel only at their renewal)."""
    import threading

    import deviceq.host.upkeep as upkeep
    from deviceq.host.daemon import HostWorker
    from deviceq.host.settings import WorkerSettings

    monkeypatch.setattr(upkeep, "CTL_MIN_INTERVAL", 3600.0)
    deploy.configure(lease_ttl=600, claim_ttl=600)
    token = deploy.admin.add_host("h1")
    runner = RunnerSpec("test_worker:waits_for_its_stop")
    settings = WorkerSettings("h1", ["d1:sim", "d2:sim"], runner, grace=5, poll_interval=0.5,
                              isolation="thread")  # fmt: skip
    worker = HostWorker(deploy.url, deploy.pool, settings, token)
    t = threading.Thread(target=worker.run)
    t.start()
    try:
        wait_for(lambda: deploy.alive("h1"), 10, "h1 alive")
        ids = deploy.client.submit_many([{"goal": "a"}, {"goal": "b"}])
        for tid, did in zip(ids, ("d1", "d2"), strict=True):
            assert deploy.store.commit([(tid, did)])[0].startswith("ok:")
        for tid in ids:
            wait_for(lambda tid=tid: deploy.status(tid) is TaskStatus.dispatched, 30, "its run")
        for tid in ids:
            assert deploy.client.cancel(tid) == "requested"
            wait_for(lambda tid=tid: deploy.status(tid) is TaskStatus.cancelled, 60, "the cancel")
    finally:
        worker.stop()
        t.join(20)
