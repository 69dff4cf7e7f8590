"""Schedules on a real Redis: ``deviceq schedule add|list|remove|pause|resume``, bad input
refused with nothing changed, the `Firer` submitting one task per due run (one catch-up run for
a missed window), two schedulers racing and failing over without a run submitted twice, a
scheduler run under its ACL user, and real ``deviceq scheduler run`` processes (one pool, two
pools) submitting runs."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pytest
import redis

from deviceq import Client, SchedulerClient
from deviceq.core.errors import Fenced, InvalidInput
from deviceq.core.keys import Keys
from deviceq.services.schedules import (
    Firer,
    Schedule,
    ScheduleStore,
    due_before,
    idempotency_key,
    next_after,
)
from harness import Deployment, wait_for

MIN = 60


def queued(r: redis.Redis, pool: str) -> list[dict[str, str]]:
    """Every queued task hash of the pool."""
    k = Keys(pool)
    ids = r.zrange(k.status("queued"), 0, -1)
    return [r.hgetall(k.task(str(t))) for t in ids]  # type: ignore[misc]


def idem_keys(r: redis.Redis, pool: str) -> list[str]:
    return sorted(t.get("idempotency_key", "") for t in queued(r, pool))


def lead(r: redis.Redis, pool: str, owner: str) -> int:
    ans = SchedulerClient(r, pool).lead(owner, 30_000)
    assert ans.leads, (owner, ans)
    return ans.epoch


def schedules_hash(r: redis.Redis, pool: str) -> dict[str, str]:
    k = Keys(pool)
    return {**r.hgetall(k.schedules), **{f"last:{n}": v for n, v in r.hgetall(  # type: ignore[misc]
        k.schedule_last).items()}}  # type: ignore[union-attr]  # fmt: skip


# -- the command line ---------------------------------------------------------------------------
def test_add_list_pause_resume_remove_through_the_cli(cli: Any, real_r: redis.Redis,
                                                      pool: str) -> None:  # fmt: skip
    res = cli("schedule", "add", "nightly", "--cron", "0 2 * * *", "run the soak",
              "--driver-type", "android", "--tag", "wifi,camera", "--priority", "3",
              "--tenant", "qa", "--timeout", "600", "--max-attempts", "2")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("schedule nightly added: 0 2 * * * (UTC), next run 20")
    assert cli("schedule", "add", "hourly", "--cron", "@hourly", "--workflow", "wf").exit_code == 0

    res = cli("schedule", "list")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == ["NAME", "CRON", "NEXT", "RUN", "LAST", "RUN", "PAUSED", "GOAL"]
    assert lines[2].split()[:2] == ["nightly", "0"] and lines[2].split()[-4:] == [
        "no", "run", "the", "soak"]  # fmt: skip
    assert lines[1].startswith("hourly") and lines[1].endswith("workflow wf")

    rows = {d["name"]: d for d in json.loads(cli("schedule", "list", "--json").output)}
    n = rows["nightly"]
    assert n["cron"] == "0 2 * * *" and n["paused"] is False and n["last_run"] is None
    assert n["spec"] == {"goal": "run the soak", "driver_type": "android",
                         "tags": ["wifi", "camera"], "priority": 3, "tenant": "qa",
                         "timeout": 600.0, "max_attempts": 2}  # fmt: skip
    assert n["next_run_iso"].endswith("T02:00:00Z") and n["next_run"] % 86400 == 7200

    assert cli("schedule", "pause", "nightly").output == "schedule nightly paused\n"
    assert cli("schedule", "pause", "nightly").output == "schedule nightly was already paused\n"
    rows = {d["name"]: d for d in json.loads(cli("schedule", "list", "--json").output)}
    assert rows["nightly"]["paused"] is True and rows["nightly"]["next_run"] is None
    assert cli("schedule", "resume", "nightly").exit_code == 0
    assert cli("schedule", "resume", "nightly").output == "schedule nightly was not paused\n"
    assert json.loads(cli("schedule", "list", "--json").output)[1]["paused"] is False

    assert cli("schedule", "remove", "hourly").output == "schedule hourly removed\n"
    res = cli("schedule", "remove", "hourly")
    assert res.exit_code == 1 and res.stderr == "error: NotFound: no schedule hourly\n"
    assert [d["name"] for d in json.loads(cli("schedule", "list", "--json").output)] == ["nightly"]
    assert cli("schedule", "remove", "nightly").exit_code == 0
    assert "no schedules" in cli("schedule", "list").output
    assert real_r.hlen(Keys(pool).schedules) == 0


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["bad-cron", "--cron", "61 * * * *", "x"], "bad cron expression '61 * * * *'"),
        (["four", "--cron", "0 2 * *", "x"], "give five fields"),
        (["secs", "--cron", "0 0 2 * * *", "x"], "give five fields"),
        (["words", "--cron", "every night", "x"], "bad cron expression"),
        (["a:b", "--cron", "0 2 * * *", "x"], "invalid schedule name 'a:b'"),
        (["-x", "--cron", "0 2 * * *", "x"], ""),  # an option, not a name
        (["n" * 65, "--cron", "0 2 * * *", "x"], "use 1-64 characters"),
        (["nogoal", "--cron", "0 2 * * *"], "give exactly one of a goal or a workflow"),
        (["both", "--cron", "0 2 * * *", "x", "--workflow", "wf"], "exactly one of"),
        (["tag", "--cron", "0 2 * * *", "x", "--tag", "bad tag"], "tag"),
        (["prio", "--cron", "0 2 * * *", "x", "--priority", "10"], "--priority"),
        (["taken", "--cron", "0 3 * * *", "x"], "schedule taken exists: remove it first"),
    ],
)
def test_bad_input_is_refused_on_one_line_with_nothing_changed(
    cli: Any, real_r: redis.Redis, pool: str, args: list[str], why: str
) -> None:
    assert cli("schedule", "add", "taken", "--cron", "0 2 * * *", "x").exit_code == 0
    before = schedules_hash(real_r, pool)
    res = cli("schedule", "add", *args)
    assert res.exit_code == 2, res.output
    assert len(res.stderr.splitlines()) == 1 and why in res.stderr, res.stderr
    assert schedules_hash(real_r, pool) == before


def test_bad_names_for_remove_pause_resume(cli: Any) -> None:
    for cmd in ("remove", "pause", "resume"):
        res = cli("schedule", cmd, "no:such")
        assert res.exit_code == 2 and "invalid schedule name" in res.stderr, res.output
        res = cli("schedule", cmd, "nosuch")
        assert res.exit_code == 1 and res.stderr == "error: NotFound: no schedule nosuch\n"


# -- the firer ------------------------------------------------------------------------------------
def test_cron_times() -> None:
    t = 1_796_205_426  # 2026-12-02T09:57:06Z
    assert due_before("* * * * *", t) == t - t % 60
    assert due_before("* * * * *", t - t % 60) == t - t % 60  # a slot itself is due
    assert next_after("0 2 * * *", t) % 86400 == 7200 and next_after("0 2 * * *", t) > t
    assert due_before("0 2 * * *", t) == t - t % 86400 + 7200
    assert idempotency_key("nightly", 1_796_205_420) == "schedule.nightly.1796205420"


def test_the_firer_submits_one_task_per_due_run_with_its_spec(real_r: redis.Redis,
                                                              pool: str) -> None:  # fmt: skip
    store = ScheduleStore(real_r, Keys(pool))
    spec = {"goal": "scheduled soak", "driver_type": "android", "tags": ["wifi"],
            "priority": 4, "tenant": "qa", "timeout": 30.0, "max_attempts": 3,
            "retry_on": "infrastructure"}  # fmt: skip
    s = store.add("soak", "* * * * *", spec)
    epoch = lead(real_r, pool, "s1")
    f = Firer(real_r, Keys(pool), pool, lambda: epoch)
    t0 = s.created_at // 1000
    assert f.tick(t0) == []  # the slot before it was added is not run
    first = t0 - t0 % MIN + MIN
    (fired,) = f.tick(first + 1)
    assert fired.run_time == first and fired.task_id and fired.error is None
    assert f.tick(first + 30) == [] and f.tick(first + 59) == []  # that run is done
    task = Client(real_r, pool).get(fired.task_id)
    assert (task.goal, task.driver_type, task.tags, task.priority, task.tenant, task.timeout,
            task.max_attempts, task.retry_on) == (
        "scheduled soak", "android", ("wifi",), 4, "qa", 30.0, 3, "infrastructure")  # fmt: skip
    assert task.idempotency_key == f"schedule.soak.{first}"
    (second,) = f.tick(first + MIN)
    assert second.run_time == first + MIN and second.task_id != fired.task_id
    assert len(queued(real_r, pool)) == 2
    last = store.last_runs()["soak"]
    assert (last.run_time, last.task_id, last.pending) == (first + MIN, second.task_id, False)
    events = [e for _, e in real_r.xrange(Keys(pool).events) if e["type"] == "schedule_fired"]
    assert [(e["schedule"], int(e["run_time"]), e["task"]) for e in events] == [
        ("soak", first, fired.task_id), ("soak", first + MIN, second.task_id)]  # fmt: skip

    # not leading: nothing
    assert Firer(real_r, Keys(pool), pool, lambda: None).tick(first + 100 * MIN) == []


def test_nothing_runs_while_paused_and_missed_slots_are_not_caught_up_on_resume(
    real_r: redis.Redis, pool: str
) -> None:
    k = Keys(pool)
    store = ScheduleStore(real_r, k)
    s = store.add("p", "* * * * *", {"goal": "g"})
    t0 = s.created_at // 1000
    epoch = lead(real_r, pool, "s1")
    f = Firer(real_r, k, pool, lambda: epoch)
    assert store.set_paused("p", True) and not store.set_paused("p", True)
    assert store.get("p").paused and f.tick(t0 + 10 * MIN) == []
    assert store.set_paused("p", False) and store.get("p").since() >= t0
    # the record as resume writes it, resumed 1 s past a minute 30 minutes on (on a minute's
    # edge, not t0 + 30 min: from a t0 in a minute's last 5 s, +5 s would reach the next slot)
    back = (t0 // MIN + 30) * MIN + 1
    resumed = Schedule(s.name, s.cron, s.spec, s.created_at, False, back * 1000)
    real_r.hset(k.schedules, "p", resumed.to_json())
    assert f.tick(back + 5) == []  # that minute's slot was due before the resume
    (after,) = f.tick(back + MIN + 5)
    assert after.run_time == back - 1 + MIN
    assert idem_keys(real_r, pool) == [idempotency_key("p", after.run_time)]


def test_a_missed_window_submits_exactly_one_catch_up_run(real_r: redis.Redis,
                                                          pool: str) -> None:  # fmt: skip
    store = ScheduleStore(real_r, Keys(pool))
    s = store.add("every-minute", "* * * * *", {"goal": "g"})
    s2 = store.add("nightly", "0 2 * * *", {"goal": "n"})
    epoch = lead(real_r, pool, "s1")
    f = Firer(real_r, Keys(pool), pool, lambda: epoch)
    t0 = max(s.created_at, s2.created_at) // 1000
    first = t0 - t0 % MIN + MIN
    assert [x.name for x in f.tick(first)] == ["every-minute"]
    # no scheduler led for ten days: 14,400 minute slots and ten 02:00 slots missed
    later = first + 10 * 86400 + 17 * MIN + 5
    fired = {x.name: x for x in f.tick(later)}
    assert fired["every-minute"].run_time == later - later % MIN
    assert fired["nightly"].run_time == due_before("0 2 * * *", later)
    assert f.tick(later + 1) == [] and f.tick(later + 30) == []
    assert idem_keys(real_r, pool) == sorted([
        f"schedule.every-minute.{first}", f"schedule.every-minute.{later - later % MIN}",
        f"schedule.nightly.{due_before('0 2 * * *', later)}"])  # fmt: skip


def test_a_refused_submission_is_recorded_not_retried(real_r: redis.Redis, pool: str) -> None:
    store = ScheduleStore(real_r, Keys(pool))
    s = store.add("wf", "* * * * *", {"workflow": "not-stored"})
    epoch = lead(real_r, pool, "s1")
    f = Firer(real_r, Keys(pool), pool, lambda: epoch)
    t0 = s.created_at // 1000
    t = t0 - t0 % MIN + MIN  # a minute's start: t + 1 is no new slot (at hh:mm:59 it was)
    (fired,) = f.tick(t)
    assert fired.task_id is None and "NotFound" in (fired.error or "")
    assert f.tick(t + 1) == []
    assert store.last_runs()["wf"].error == fired.error
    assert [e["type"] for _, e in real_r.xrange(Keys(pool).events)].count("schedule_failed") == 1


def test_a_run_pending_after_its_owner_died_is_submitted_once_by_the_next_leader(
    real_r: redis.Redis, pool: str
) -> None:
    """The leader claims a run and dies before submitting it (or submits it after it was
    deposed): the next leader submits it with the same idempotency key: one task."""
    k = Keys(pool)
    store = ScheduleStore(real_r, k)
    s = store.add("nightly", "* * * * *", {"goal": "g"})
    run = int(s.created_at / 1000) - int(s.created_at / 1000) % MIN + MIN
    ea = lead(real_r, pool, "a")
    a = Firer(real_r, k, pool, lambda: ea)
    assert a._script("claim", ea, "nightly", run) is True
    assert store.last_runs()["nightly"].pending
    SchedulerClient(real_r, pool).step_down("a")
    eb = lead(real_r, pool, "b")
    b = Firer(real_r, k, pool, lambda: eb)
    (fired,) = b.tick(run + 5)
    assert fired.run_time == run and fired.task_id
    # the deposed leader wakes up and submits what it claimed: the same task, and its record
    # of the run is fenced
    with pytest.raises(Fenced):
        a._submit(store.get("nightly"), run, ea)
    assert idem_keys(real_r, pool) == [f"schedule.nightly.{run}"]
    assert a.tick(run + 6) == [] and b.tick(run + 7) == []
    assert store.last_runs()["nightly"].task_id == fired.task_id


def test_the_fire_script_gives_a_run_to_one_current_leader_once(real_r: redis.Redis,
                                                                 pool: str) -> None:  # fmt: skip
    """schedule_fire.lua on its own: a claim needs the current epoch and a run newer than the
    last one recorded; done records only the pending run."""
    k = Keys(pool)
    store = ScheduleStore(real_r, k)
    store.add("n", "* * * * *", {"goal": "g"})
    ea = lead(real_r, pool, "a")
    f = Firer(real_r, k, pool, lambda: ea)
    with pytest.raises(InvalidInput):
        f._script("claim", ea, "n:x", 120)
    assert f._script("claim", ea, "gone", 120) is False  # no such schedule
    assert f._script("claim", ea, "n", 120) is True
    assert f._script("claim", ea, "n", 120) is False  # once
    assert f._script("claim", ea, "n", 60) is False  # never an older run
    assert f._script("done", ea, "n", 60, "t1") is False  # not the pending run
    assert f._script("done", ea, "n", 120, "t1") is True
    assert f._script("done", ea, "n", 120, "t2") is False  # recorded already
    assert store.last_runs()["n"].task_id == "t1"
    SchedulerClient(real_r, pool).step_down("a")
    eb = lead(real_r, pool, "b")
    with pytest.raises(Fenced):
        f._script("claim", ea, "n", 180)  # the deposed leader's epoch
    assert store.last_runs()["n"].run_time == 120
    assert f._script("claim", eb, "n", 180) is True


def test_two_schedulers_racing_through_failovers_never_submit_a_run_twice(
    real_r: redis.Redis, redis_server: Any, pool: str
) -> None:
    """Two firers (schedulers "a" and "b", each with its own connection) tick the same
    times in threads while the lease moves between them; a deposed one keeps its stale epoch
    (it has not noticed yet). Every run is submitted at most once, every run some leader
    reached is submitted, and each task is recorded once."""
    k = Keys(pool)
    store = ScheduleStore(real_r, k)
    for name in ("s1", "s2", "s3"):
        store.add(name, "* * * * *", {"goal": name})
    t0 = max(s.created_at for s in store.all()) // 1000
    base = t0 - t0 % MIN + MIN
    times = [base + i * 20 for i in range(90)]  # 30 minute slots, 3 looks each
    epochs: dict[str, int] = {"a": lead(real_r, pool, "a")}
    conns = {o: redis.Redis.from_url(redis_server.url, decode_responses=True) for o in "ab"}
    firers = {o: Firer(conns[o], k, pool, lambda o=o: epochs.get(o)) for o in "ab"}  # type: ignore[misc]
    fired: dict[str, list[Any]] = {"a": [], "b": []}
    go = threading.Barrier(3)
    step = [threading.Event() for _ in times]

    def race(owner: str) -> None:
        go.wait()
        for i, t in enumerate(times):
            step[i].wait(10)
            fired[owner] += firers[owner].tick(t)

    threads = [threading.Thread(target=race, args=(o,)) for o in "ab"]
    for th in threads:
        th.start()
    go.wait()
    sc = SchedulerClient(real_r, pool)
    rng = random.Random(7)
    holder = "a"
    for i in range(len(times)):
        if i % 7 == 3:  # a failover: the leader steps down (or dies), the other one leads
            other = "b" if holder == "a" else "a"
            sc.step_down(holder)
            epochs[other] = lead(real_r, pool, other)
            holder = other
        step[i].set()
        threading.Event().wait(rng.uniform(0, 0.01))
    for th in threads:
        th.join(30)
    keys = idem_keys(real_r, pool)
    assert len(keys) == len(set(keys)), "a run was submitted twice"
    done = [x for o in "ab" for x in fired[o] if x.task_id]
    assert sorted(idempotency_key(x.name, x.run_time) for x in done) == keys
    assert fired["a"] and fired["b"], "both schedulers led at some point"
    # every schedule's runs follow each other (a catch-up may skip slots, never repeat one)
    for name in ("s1", "s2", "s3"):
        runs = sorted(x.run_time for x in done if x.name == name)
        assert runs and len(runs) == len(set(runs)) and runs[-1] == times[-1] - times[-1] % MIN
        assert len(runs) >= 20, runs  # most of the 30 slots: a leader looked at each
    events = [e for _, e in real_r.xrange(k.events) if e["type"] == "schedule_fired"]
    assert len(events) == len(keys)
    for c in conns.values():
        c.close()


def test_the_scheduler_role_fires_under_its_acl_user(
    redis_server: Any, real_r: redis.Redis, pool: str
) -> None:
    """The scheduler's ACL user (deviceq acl --role scheduler) may claim a run and submit it;
    only the operator adds schedules."""
    import uuid

    from deviceq.ops.acl import role_acl

    password = uuid.uuid4().hex
    users = []
    try:
        urls = {}
        for role in ("scheduler", "operator"):
            acl = role_acl(pool, role)
            user = f"{acl.user}-{uuid.uuid4().hex[:6]}"
            real_r.execute_command("ACL", "SETUSER", user, *acl.rules(f">{password}"))
            users.append(user)
            urls[role] = redis_server.url.replace("redis://", f"redis://{user}:{password}@")
        op = redis.Redis.from_url(urls["operator"], decode_responses=True)
        sched = redis.Redis.from_url(urls["scheduler"], decode_responses=True)
        s = ScheduleStore(op, Keys(pool)).add("nightly", "* * * * *", {"goal": "g"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            ScheduleStore(sched, Keys(pool)).add("other", "* * * * *", {"goal": "g"})
        epoch = SchedulerClient(sched, pool).lead("s1", 30_000).epoch
        (fired,) = Firer(sched, Keys(pool), pool, lambda: epoch).tick(s.created_at / 1000 + MIN)
        assert fired.task_id and fired.error is None
        assert idem_keys(real_r, pool) == [idempotency_key("nightly", fired.run_time)]
        op.close()
        sched.close()
    finally:
        for user in users:
            real_r.execute_command("ACL", "DELUSER", user)


def test_store_refuses_bad_specs_and_keeps_names_unique(real_r: redis.Redis, pool: str) -> None:
    store = ScheduleStore(real_r, Keys(pool))
    with pytest.raises(InvalidInput, match="no field 'idempotency_key'"):
        store.add("x", "* * * * *", {"goal": "g", "idempotency_key": "k"})
    with pytest.raises(InvalidInput, match="priority"):
        store.add("x", "* * * * *", {"goal": "g", "priority": 11})
    assert real_r.exists(Keys(pool).schedules) == 0
    s = store.add("x", "0 2 * * *", {"goal": "g"})
    assert Schedule.from_json(s.to_json()) == s
    with pytest.raises(InvalidInput, match="exists"):
        store.add("x", "0 3 * * *", {"goal": "g"})
    assert store.get("x").cron == "0 2 * * *"


# -- end to end -----------------------------------------------------------------------------------
def test_a_real_scheduler_process_submits_a_schedules_run(deploy: Deployment) -> None:
    """``deviceq scheduler run`` (a process) submits the run of a schedule whose latest slot
    was missed (added while no scheduler ran: its record says so), once."""
    r, k = deploy.r, Keys(deploy.pool)
    s = ScheduleStore(r, k).add("e2e", "* * * * *", {"goal": "from a schedule", "tags": ["x"]})
    # the schedule was added ten minutes ago, while no scheduler ran
    old = Schedule(s.name, s.cron, s.spec, s.created_at - 10 * MIN * 1000)
    r.hset(k.schedules, "e2e", old.to_json())
    deploy.scheduler()
    last = wait_for(lambda: (lr := ScheduleStore(r, k).last_runs().get("e2e")) and lr.task_id
                    and lr, 30, "the schedule's run")  # fmt: skip
    task = deploy.client.get(last.task_id)
    assert task.goal == "from a schedule" and task.tags == ("x",)
    assert task.idempotency_key == f"schedule.e2e.{last.run_time}"
    assert last.run_time > old.created_at / 1000
    threading.Event().wait(6)  # another look of the firer: nothing new in this minute
    keys = idem_keys(r, deploy.pool)
    assert keys[0] == task.idempotency_key and len(keys) == len(set(keys))
    assert all(int(x.rsplit(".", 1)[1]) > last.run_time for x in keys[1:])  # next minutes only


def test_one_scheduler_process_serving_two_pools_fires_each_pools_schedules(
    deploy: Deployment,
) -> None:
    """``deviceq --pool A --pool B scheduler run``: a firer per pool, each under its own
    scheduler's leader epoch."""
    r = deploy.r
    pools = [deploy.pool, deploy.pool + "-b"]
    for p in pools:
        k = Keys(p)
        s = ScheduleStore(r, k).add("e2e", "* * * * *", {"goal": f"in {p}"})
        old = Schedule(s.name, s.cron, s.spec, s.created_at - 10 * MIN * 1000)
        r.hset(k.schedules, "e2e", old.to_json())
    try:
        deploy.spawn("scheduler", "--pool", pools[0], "--pool", pools[1], "scheduler", "run")
        for p in pools:
            last = wait_for(lambda p=p: (lr := ScheduleStore(r, Keys(p)).last_runs().get("e2e"))
                            and lr.task_id and lr, 30, f"the run in {p}")  # fmt: skip
            assert Client(r, p).get(last.task_id).goal == f"in {p}"
    finally:
        for key in r.scan_iter(f"dq:{{{pools[1]}}}:*"):
            r.delete(key)
