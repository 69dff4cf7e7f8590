"""Every Lua script's header lists the keys it reads and writes (``-- Keys``). This runs each
script's transitions under ``MONITOR`` on the real server and checks that every key a script
touched is one its header names, and that all of them are keys of the pool (the ``dq:{POOL}:``
prefix: one hash tag, so one Redis Cluster slot)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from deviceq import (
    Client,
    DeviceReport,
    HostClient,
    PoolAdmin,
    Report,
    SchedulerClient,
    TaskScheduler,
)
from deviceq.core.limits import COUNTERS as LIMIT_COUNTERS
from deviceq.core.script_args import PLAN_AHEAD
from deviceq.core.scripts import lua_dir, names, source
from deviceq.host.log_stream import LogChunk
from deviceq.host.progress import ProgressUpdate
from deviceq.services.schedules import Firer, ScheduleStore

WILDCARDS = {"ID", "SIG", "KEY", "NAME", "STATUS", "DIGEST", "*"}
FILLER = {
    "(lib/limits)",
    "reads",
    "writes",
    "and",
    "also",
    "on",
    "a",
    "hand-back",
    "or",
    "hint",
    "the",
    "in",
    "dead",
}


def declared(name: str) -> list[re.Pattern[str]]:
    """The key patterns of a script's ``-- Keys`` header section."""
    text = (lua_dir() / f"{name}.lua").read_text()
    m = re.search(r"^-- Keys(.*?)^-- (Returns|Errors)", text, re.S | re.M)
    assert m, f"{name}.lua has no Keys section in its header"
    section = re.sub(r"^--", " ", m.group(1), flags=re.M)
    out = []
    for tok in re.split(r"[,;\s]+", section):
        if not tok or tok in FILLER:
            continue
        if tok == "LIMIT_COUNTERS":  # every declared limit's count hash (deviceq.core.limits)
            out.extend(re.compile(re.escape(c) + r"\Z") for c in LIMIT_COUNTERS)
            continue
        parts = [("[^:]+" if p in WILDCARDS else re.escape(p)) for p in tok.split(":")]
        out.append(re.compile(":".join(parts) + r"\Z"))
    return out


def cluster_slot(key: str) -> int:
    """Redis Cluster's slot of ``key`` (CRC16 of its hash tag, mod 16384)."""
    tag = key
    if "{" in key:
        start = key.index("{")
        end = key.find("}", start + 1)
        if end > start + 1:
            tag = key[start + 1 : end]
    crc = 0
    for b in tag.encode():
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc % 16384


def exercise(url: str, pool: str) -> None:
    """Every transition at least once, through the public clients (write paths included)."""
    r = redis.Redis.from_url(url, decode_responses=True)
    admin, client, store = PoolAdmin(r, pool), Client(r, pool), SchedulerClient(r, pool)
    token = admin.add_host("h1")
    admin.add_host("h2")
    token = admin.rotate_token("h1")
    h = HostClient(r, pool, "h1", token)
    h.start_session("s1", "start", "m:b:1:1", "")
    h.heartbeat([DeviceReport("d1", "android", ("wifi",)), DeviceReport("d2", "android"),
                 DeviceReport("d3", "web")])  # fmt: skip
    client.put_workflow({"name": "wf", "steps": [{"goal": "x"}]})
    t1 = client.submit("one", driver_type="android", idempotency_key="k1", queue_timeout=100)
    t2 = client.submit(workflow="wf", tags=["wifi"])
    t3 = client.submit("three", driver_type="web")
    store.lead("sched-1", 5000)
    fence = store.lead("sched-1", 5000).epoch
    assert all(x.startswith("ok:") for x in store.commit([(t1, "d2"), (t2, "d1"), (t3, "d3")],
                                                         fence))  # fmt: skip
    got = {a.task.id: a for a in h.claim(3)}
    h.renew([(t, a.lease_id) for t, a in got.items()])
    assert h.log_append(
        [
            LogChunk(t1, got[t1].lease_id, "stdout", "progress\n"),
            LogChunk(t1, got[t1].lease_id, "log", "", True),
        ]
    ) == ["ok", "ok"]
    assert h.progress([ProgressUpdate(t1, got[t1].lease_id, 0.5, "half")]) == ["ok"]
    client.cancel(t3)
    h.renew([(t3, got[t3].lease_id)])
    h.report_many([Report(t1, got[t1].lease_id, "done"),
                   Report(t3, got[t3].lease_id, "cancelled")])  # fmt: skip
    h.release(t2, got[t2].lease_id, "refused")
    h.record_artifacts(t1, 1, [("out/report.txt", 5, "a" * 64)], "")
    h.heartbeat([DeviceReport("d1", "android", ("wifi",)), DeviceReport("d2", "android"),
                 DeviceReport("d3", "web")])  # fmt: skip
    admin.set_config("max_quarantine_fraction", 1)
    admin.set_config("quarantine_after", 1)
    store.commit([(t2, "d1")], fence)
    (a,) = h.claim(1)
    h.report(t2, a.lease_id, "failed", "infrastructure", "usb")
    admin.quarantine("d1", False)
    admin.quarantine("d2", True)
    admin.drain("h1")
    admin.drain("h1", False)
    t4 = client.submit("four", driver_type="web")
    assert admin.set_priority([t4], 7) == {t4: "ok"}
    admin.pause("maintenance")
    assert store.commit([(t3, "d3")], fence) == ["err:pool_paused"]
    admin.resume()
    h.set_draining(True)
    t5 = client.submit("cancelled while queued", driver_type="nowhere")
    client.cancel(t5)
    h.set_draining(False)
    beat = [DeviceReport("d1", "android", ("wifi",)), DeviceReport("d3", "web")]
    h.heartbeat(beat)
    t6 = client.submit("cancelled while assigned", driver_type="web")
    store.commit([(t6, "d3")], fence)
    client.cancel(t6)
    h.heartbeat(beat)
    t7 = client.submit("refused at claim", driver_type="web")
    store.commit([(t7, "d3")], fence)
    admin.quarantine("d3", True)
    assert h.claim(1) == []  # handed back: its device was quarantined meanwhile
    admin.quarantine("d3", False)
    admin.set_config("claim_ttl", 1)
    admin.set_config("lease_ttl", 1)
    h.heartbeat(beat)
    t4 = client.submit("expires assigned")
    t8 = client.submit("expires running", driver_type="web", max_attempts=1)
    store.commit([(t4, "d1"), (t8, "d3")], fence)
    h.claim(1)  # one of them runs; the other stays assigned
    time.sleep(1.2)
    store.expire(100)
    h2 = HostClient(r, pool, "h1", token)
    h2.start_session("s2", "dead", "m:b:2:1", "s1")
    h2.end_session()
    # a schedule's run: claimed (schedule_fire.lua), submitted, recorded
    sched_store = ScheduleStore(r, admin.keys)
    nightly = sched_store.add("nightly", "* * * * *", {"goal": "scheduled", "driver_type": "web"})
    firer = Firer(r, admin.keys, pool, lambda: fence)
    assert len(firer.tick(nightly.created_at / 1000 + 60)) == 1
    store.step_down("sched-1")
    admin.remove_host("h2")
    h3 = HostClient(r, pool, "h1", token)
    h3.heartbeat(beat)  # the expired leases' devices are back
    h3.health_begin("d1")  # health checks: begin, end (unhealthy, then healthy), clear
    h3.health_end("d1", False, "no usb", "exit code 1")
    h3.health_begin("d1")
    h3.health_end("d1", True, "ok")
    h3.health_clear("d1")
    admin.dispatch(client.submit("by hand", driver_type="web"), "d3")
    admin.reserve("d1", 60_000, "alice")  # reservations: reserve, extend, release, expire
    admin.extend("d1", 1000)
    admin.release("d1")
    admin.reserve("d1", 1000, "bob")
    time.sleep(1.1)
    store.expire(100)
    h3.heartbeat(beat)
    # a multi-device task: placed, one part fails (the gang is retried), placed again, done;
    # another is cancelled while it runs
    beat4 = [*beat, DeviceReport("d4", "web")]
    h3.heartbeat(beat4)
    roles = {"phone": "android:wifi", "web": "web"}
    g = client.submit("on two devices", roles=roles, max_attempts=2, retry_on="runner_failed")
    assert store.commit_gang(g, ["d1", "d4"]) == "ok:1"
    parts = {a.task.id: a for a in h3.claim(5)}
    assert (
        h3.report(f"{g}.web", parts[f"{g}.web"].lease_id, "failed", "runner_failed") == "ok:queued"
    )
    assert store.commit_gang(g, ["d1", "d4"]) == "ok:2"
    parts = {a.task.id: a for a in h3.claim(5)}
    assert h3.report(f"{g}.phone", parts[f"{g}.phone"].lease_id, "done") == "ok:done"
    g2 = client.submit("cancelled while it runs", roles={"web": "web"})
    assert store.commit_gang(g2, ["d4"]) == "ok:1"
    h3.claim(5)
    assert client.cancel(g2) == "cancelled"
    # preemption: a running task of a preemptible class stopped for an urgent one
    # (preempt.lua), reported preempted, its device given to the urgent task
    admin.add_priority_class("low", 1)
    admin.add_priority_class("high", 9, preempts=True)
    low = client.submit("preemptible", driver_type="web", priority_class="low")
    assert store.commit([(low, "d4")])[0].startswith("ok:")
    assert [a.task.id for a in h3.claim(1)] == [low]
    high = client.submit("urgent", driver_type="web", priority_class="high")
    epoch = store.lead("sched-2", 5000).epoch
    assert store.preempt(high, low, "d4", epoch) == "ok"
    lease = client.get(low).lease_id or ""
    assert [x.status for x in h3.renew([(low, lease)])] == ["preempt:30000"]
    assert h3.report(low, lease, "preempted") == "ok:queued"
    assert store.commit([(high, "d4")], epoch)[0].startswith("ok:")
    # a next-task hint (plan_ahead.lua) that the report freeing its device assigns (report.lua)
    (running,) = h3.claim(1)
    nxt = client.submit("next on d4", driver_type="web")
    hint = PLAN_AHEAD.pack([{"task_id": nxt, "device_id": "d4"}])
    assert store._run("plan_ahead", [str(epoch), "1", hint]) == 1
    assert h3.report(high, running.lease_id, "done") == "ok:done"
    assert client.get(nxt).status == "assigned"
    store.step_down("sched-2")
    # attributes (an operator's, a host's) and a gate that holds a device, then goes
    from deviceq.ops.gates import add_gate, remove_gate

    admin.set_attributes("d3", {"battery": 50, "sdk": 34})
    h3.send_attributes({"d4": ({"battery": 90}, ())})
    add_gate(admin, "low", ["battery<20"])
    admin.set_attributes("d3", {"battery": 15})
    remove_gate(admin, "low")
    admin.unset_attributes("d3", ["sdk"])
    # a device removed while it runs (its task handed back), then its host with the rest
    t9 = client.submit("on a device that is removed", driver_type="web")
    store.commit([(t9, "d3")])
    h3.claim(1)
    admin.remove_device("d3", force=True)
    client.submit("read by the scheduler", driver_type="android")  # lua/heads.lua
    snap = TaskScheduler(admin).snapshot()
    assert any(b.heads for b in snap.buckets), "the scheduler read no heads"
    from deviceq.dashboard.limits import LoginLimiter  # the dashboard's login limit

    limiter = LoginLimiter(r, admin.keys, per_addr=1)
    limiter.refund(limiter.charge("127.0.0.1", "alice"))
    assert limiter.charge("::1", None).allowed and not limiter.charge("::1", None).allowed
    # a suite: submitted (suite_submit.lua), a cancelled shard recorded (suite_shard.lua), the
    # suite cancelled (suite_cancel.lua)
    from deviceq.services.suite_watch import SuiteWatcher

    suite = client.submit_suite("nightly", ["c#a", "c#b"], goal="run {tests}", shards=2)
    client.cancel(suite.shards[0].task_id)
    assert SuiteWatcher(client, lambda: None).look(suite.id, None) == 1
    client.cancel_suite(suite.id)
    # a suite on every device with a joining window (suite_join.lua: a device registered
    # before it was submitted is refused; the window closed)
    each = client.submit_suite("every", ["c#a"], goal="run {tests}", each_device=True,
                               include_joining=600)  # fmt: skip
    sh = each.shards[0]
    shard = json.dumps({"task": sh.task_id, "tests": sh.tests, "round": 0, "pin": sh.pin})
    assert client._run("suite_join", ["", each.id, "add", sh.pin, shard]) == "closed"
    assert client._run("suite_join", ["", each.id, "close"]) == "running"
    client.cancel_suite(each.id)
    r.close()


@pytest.fixture(scope="module")
def monitored(redis_server: Any) -> tuple[str, list[tuple[str, str]]]:
    """The exercise run once under MONITOR: the pool prefix and every (client, command)."""
    pool = "k" + uuid.uuid4().hex[:12]
    events: list[tuple[str, str]] = []
    mark = f"monitor-done-{uuid.uuid4().hex}"
    mr = redis.Redis.from_url(redis_server.url, decode_responses=True)
    ready = threading.Event()

    def watch() -> None:
        with mr.monitor() as m:
            ready.set()
            for e in m.listen():
                if mark in e["command"]:
                    return
                who = e.get("client_type") or e.get("client_address") or ""
                events.append((who, e["command"]))

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    ready.wait(5)
    time.sleep(0.1)
    try:
        exercise(redis_server.url, pool)
    finally:
        mr.echo(mark)
        th.join(10)
        mr.close()
    return f"dq:{{{pool}}}:", events


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(names()))
def test_each_script_touches_only_its_declared_keys_in_one_slot(
    monitored: tuple[str, list[tuple[str, str]]], name: str
) -> None:
    """MONITOR shows each EVALSHA line and then the commands its script ran (client
    ``lua``): every key those commands name must match the script's header and carry the
    pool's hash tag (one cluster slot)."""
    prefix, events = monitored
    shas = {hashlib.sha1(source(n).encode()).hexdigest(): n for n in names()}
    pats = declared(name)
    slot = cluster_slot(prefix + "x")
    current: str | None = None
    seen = 0
    ran = 0  # commands the current EVALSHA ran (none: it answered NOSCRIPT)
    for who, cmd in events:
        if who != "lua":
            m = re.match(r"(?:EVALSHA|EVALSHA_RO)\s+([0-9a-f]{40})", cmd, re.I)
            if m is None and current and ran == 0 and re.match(r"EVAL\s", cmd, re.I):
                continue  # the body sent after NOSCRIPT: the same script runs now
            current, ran = (shas.get(m.group(1)) if m else None), 0
            continue
        ran += 1
        if current != name:
            continue
        seen += 1
        for key in re.findall(r"dq:\{[^}\s]*\}:\S*", cmd):
            assert key.startswith(prefix), f"{name}.lua touched {key}, outside its pool"
            assert cluster_slot(key) == slot, key
            rest = key[len(prefix) :]
            assert any(p.match(rest) for p in pats), f"{name}.lua touched {rest}: {cmd}"
    assert seen, f"{name}.lua ran no command in the exercise"
