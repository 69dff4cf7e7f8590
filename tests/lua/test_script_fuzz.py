"""Every Lua script called through EVALSHA with arbitrary argument lists (wrong counts, types,
huge and negative numbers, empty strings, newlines, non-UTF-8 bytes), mutated from a valid call
so that the fuzzing reaches past authentication into each script's checks. After each call:
either it was refused with one of deviceq's error codes and no key of the pool changed, or it
was accepted and the pool's invariants hold (the same checker as the state machine)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceq import Client, DeviceReport, HostClient, PoolAdmin, SchedulerClient
from deviceq.core.errors import error_codes
from deviceq.core.script_args import packb
from deviceq.core.scripts import names, source
from invariants import check_pool, dump

CODES = error_codes()

garbage = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="\n\r\t \x00,|:", max_size=5),
    st.binary(max_size=20),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        [
            "",
            "0",
            "-1",
            "1e-9",
            "1e309",
            "nan",
            "inf",
            "09",
            " 1",
            "1\n",
            "0x10",
            "10001",
            "4294967297",
            "done",
            "failed",
            "released",
            "idle",
            "busy",
        ]
    ),
)


packed_garbage = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(0, 9), max_size=3),
)
"""Values of other types inside packed items (a number for text, nil, a nested array...)."""


class Pool:
    """A pool with hosts, devices and tasks in every state, and a valid call per script."""

    def __init__(self, url: str) -> None:
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.raw = redis.Redis.from_url(url)  # replies may hold the non-UTF-8 bytes sent
        self.pool = "z" + uuid.uuid4().hex[:12]
        self.client = Client(self.r, self.pool)
        self.admin = PoolAdmin(self.r, self.pool)
        self.store = SchedulerClient(self.r, self.pool)
        self.keys = self.admin.keys
        self.token = self.admin.add_host("h1")
        self.admin.add_host("h2")
        h1 = HostClient(self.r, self.pool, "h1", self.token)
        h1.heartbeat([DeviceReport("d1", "android", ("wifi",)), DeviceReport("d2", "android"),
                      DeviceReport("d3", "web")])  # fmt: skip
        self.client.put_workflow({"name": "wf", "steps": [{"goal": "x"}]})
        self.queued = self.client.submit("waiting", driver_type="web")
        self.gang = self.client.submit("a multi-device task", roles={"web": "web"})
        self.run = self.client.submit("running", driver_type="android")
        self.store.commit([(self.run, "d1")])
        (a,) = h1.claim(1)
        self.lease = a.lease_id
        self.assigned = self.client.submit("assigned")
        self.store.commit([(self.assigned, "d2")])
        self.scripts = {n: self.raw.register_script(source(n)) for n in names()}
        shard = json.dumps({"task": self.queued, "tests": ["t1", "t2"], "round": 0})
        self.shard = shard  # (a suite su1 of one shard: the queued task)
        suite_args = ["su1", "nightly", "0", "{}", "2", "", "1", shard]
        self.scripts["suite_submit"](keys=[self.keys.prefix], args=suite_args)

    def with_joining(self) -> None:
        """A suite ``sj1`` on every device with a joining window (for suite_join)."""
        shard = json.dumps({"task": self.queued, "tests": ["t1"], "round": 0, "pin": "d1"})
        args = ["sj1", "every", "1", '{"include_joining_s": 600}', "1", "", "1", shard]
        self.scripts["suite_submit"](keys=[self.keys.prefix], args=args)

    def with_schedule(self) -> None:
        """A schedule ``nightly`` and a scheduler leading with epoch 7 (for schedule_fire)."""
        from deviceq.services.schedules import ScheduleStore

        ScheduleStore(self.r, self.keys).add("nightly", "0 2 * * *", {"goal": "nightly run"})
        self.r.set(self.keys.leader, "owner-1:7")

    def with_classes(self) -> None:
        """The running task of a preemptible class, a queued android one of a
        class that preempts, d1 running it, a scheduler leading with epoch 7 (for preempt)."""
        self.r.hset(self.keys.pclasses, mapping={"low": "1:0:1:5000", "high": "9:1:0:0"})
        self.urgent = self.client.submit("urgent", driver_type="android")
        self.r.hset(self.keys.task(self.run), mapping={"class": "low", "priority": "1"})
        self.r.hset(self.keys.task(self.urgent), mapping={"class": "high", "priority": "9"})
        self.r.set(self.keys.leader, "owner-1:7")

    def valid(self, name: str) -> list[Any]:
        """A valid call of script ``name``: its arguments, packed items as a list of their
        values (`wire` packs them; the fuzzing mutates each value)."""
        tok, run, lease = self.token, self.run, self.lease
        no = False  # (an optional item field not given)
        return {
            "submit": ["1", [uuid.uuid4().hex[:16], "goal", "hello", "", "android", "wifi", 3,
                             2, no, "10", no, no, no, no, no, no, no, no, no, no, no, no, no,
                             "c#a\nc#b", no]],
            "heartbeat": ["h1", tok, "", "full", "sync1", "first", "0", "2",
                          ["d1", "android", "wifi", "idle", "", "sdk=n:34\nmodel=s:P 8",
                           "d3", "web", "", "busy", "in use", no]],
            "session": ["h1", tok, "start", "s1", "m:b:1:2", ""],
            "claim": ["h1", tok, "", "2"],
            "renew": ["h1", tok, "", "1", [run, lease]],
            "log_append": ["h1", tok, "", "2", [run, lease, "stdout", "progress 1\n", 0, run,
                                                lease, "log", "", 1]],
            "progress": ["h1", tok, "", "2", [run, lease, "0.4", "step 3/7", run, lease, "1", ""]],
            "report": ["h1", tok, "", "1", [run, lease, "failed", "infrastructure", "usb"]],
            "expire": ["10", "3000"],
            "cancel": [self.queued, "no longer needed"],
            "assign": ["", "1", [self.queued, "d3"]],
            "plan_ahead": ["", "1", [self.queued, "d1"]],
            "gang_assign": ["", self.gang, "1", ["d3"]],
            "host_add": ["h9", "sha1:" + "a" * 40, "add"],
            "host_drain": ["h1", "1", "operator", "", ""],
            "pool_pause": ["pause", "maintenance"],
            "task_priority": ["5", "1", [self.queued]],
            "host_remove": ["h2", "0"],
            "device_remove": ["d1", "1"],
            "device_quarantine": ["d2", "1"],
            "gate_set": ["add", "low", '{"when_c":"battery\t<\tn:20","until_c":"",'
                         '"driver_type":""}', "16"],
            "gate_eval": ["d1", "d2", "d3"],
            "device_attrs": ["host", "h1", tok, "", "d1", "2", "1", "sdk", "n:34", "model",
                             "s:Pixel 8", "gps"],
            "device_reserve": ["reserve", "d3", "60000", "alice"],
            "device_health": ["h1", tok, "", "begin", "d3"],
            "heads": ["3", "1", [self.r.hget(self.keys.task(self.queued), "sig") or "", 0, 9]],
            "leader": ["owner-1", "1000", "acquire"],
            "login_attempt": ["charge", "60000", "a" * 64, "10", "b" * 64, "20"],
            "attempt_artifacts": ["h1", tok, run, "1", "", "1", ["log.txt", 3, "b" * 64]],
            # (a claim by the leader of epoch 7: see with_schedule)
            "schedule_fire": ["claim", "7", "nightly", "1700000000", "", ""],
            "suite_submit": [uuid.uuid4().hex[:12], "nightly", "0", '{"goal": "g {tests}"}', "2",
                             "60000", "1", self.shard],
            "suite_shard": ["", "su1", "0", "done", "d1", "", "2", "t1", "passed", "1200", "",
                            "t2", "failed", "", "boom"],
            "suite_cancel": ["su1"],
            # (a suite on every device with a joining window: see with_joining)
            "suite_join": ["", "sj1", "close"],
            # (the leader of epoch 7: see with_classes)
            "preempt": ["7", getattr(self, "urgent", self.queued), run, "d1"],
        }[name]  # fmt: skip


def wire(args: list[Any]) -> list[Any]:
    """A call's arguments as sent: a list (a script's items) packed as they are
    (`deviceq.core.script_args`), without the Python side's checks."""
    return [packb(a) if isinstance(a, list) else a for a in args]


READ_ONLY = {"heads"}  # scripts that read for the scheduler and never write


def stable(d: dict[str, Any]) -> dict[str, Any]:
    """The dump without the leader lease, which a fuzzed `leader` call may give a TTL of a
    millisecond (it then vanishes on its own between two dumps)."""
    return {k: v for k, v in d.items() if not k.split("#")[0].endswith(":leader")}


@st.composite
def mutated_call(draw: Any, pool: Pool) -> tuple[str, list[Any]]:
    name = draw(st.sampled_from(sorted(pool.scripts)))
    args: list[Any] = list(pool.valid(name))
    if draw(st.integers(0, 3)) == 0:
        return name, wire(args)  # a valid call now and then: the pool's state moves on
    for i in range(len(args)):
        if isinstance(args[i], list):  # packed items: each value mutated, or the whole
            items = list(args[i])
            for j in range(len(items)):
                if draw(st.integers(0, 4)) == 0:
                    items[j] = draw(st.one_of(garbage, packed_garbage))
            args[i] = items
        if draw(st.integers(0, 4)) == 0:
            args[i] = draw(garbage)
    args = wire(args)
    cut = draw(st.integers(0, 3))
    if cut and draw(st.booleans()):
        args = args[: max(0, len(args) - cut)]
    elif cut:
        args += draw(st.lists(garbage, min_size=cut, max_size=cut))
    return name, args


@pytest.fixture(scope="module")
def fuzz_pool(redis_server: Any) -> Pool:
    return Pool(redis_server.url)


def test_every_script_survives_arbitrary_arguments(fuzz_pool: Pool) -> None:
    pool = fuzz_pool
    seen: dict[str, int] = {}

    # derandomize: the same 600 calls every run (a random run may, rarely, never refuse one
    # script's call; the explicit empty calls below make that coverage certain anyway)
    @settings(max_examples=600, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(data=st.data())
    def run(data: Any) -> None:
        name, args = data.draw(mutated_call(pool))
        before = stable(dump(pool.r, pool.keys))
        try:
            pool.scripts[name](keys=[pool.keys.prefix], args=args)
        except redis.ResponseError as exc:
            msg = str(exc)
            assert msg.split(" ", 1)[0] in CODES, f"{name} {args!r}: not a deviceq error: {msg}"
            after = stable(dump(pool.r, pool.keys))
            assert after == before, f"{name} {args!r} refused ({msg}) but wrote"
            seen[name + ":refused"] = seen.get(name + ":refused", 0) + 1
        else:
            check_pool(pool.r, pool.keys)
            seen[name + ":accepted"] = seen.get(name + ":accepted", 0) + 1

    run()
    # every script refuses a call without arguments, with a deviceq error and nothing written
    for name in sorted(pool.scripts):
        before = stable(dump(pool.r, pool.keys))
        with pytest.raises(redis.ResponseError) as err:
            pool.scripts[name](keys=[pool.keys.prefix], args=[])
        assert str(err.value).split(" ", 1)[0] in CODES, f"{name}: not a deviceq error: {err.value}"
        assert stable(dump(pool.r, pool.keys)) == before, f"{name} refused an empty call but wrote"
        seen[name + ":refused"] = seen.get(name + ":refused", 0) + 1
    # the fuzzing reached both outcomes of most scripts
    accepted = {k.split(":")[0] for k in seen if k.endswith(":accepted")}
    refused = {k.split(":")[0] for k in seen if k.endswith(":refused")}
    assert len(refused) == len(pool.scripts), seen
    # (how many valid calls still succeed depends on where the fuzzing took the pool's state)
    assert len(accepted) >= len(pool.scripts) // 2, seen


def test_the_fuzzers_valid_calls_are_valid(redis_server: Any) -> None:
    """The calls the fuzzing mutates are accepted on a fresh pool: the mutations start from
    calls that reach every script's work, past authentication."""
    for name in sorted(names()):
        pool = Pool(redis_server.url)
        if name == "expire":  # time passes for the running task's lease
            pool.r.hset(pool.keys.task(pool.run), "lease_expires_at", 1)
            pool.r.zadd(pool.keys.leases, {pool.run: 1})
        if name == "schedule_fire":  # a schedule, and a leader to fire it
            pool.with_schedule()
        if name == "preempt":  # classes, and a leader to decide
            pool.with_classes()
        if name == "gate_eval":  # a gate, and a device it holds
            pool.admin._run("gate_set", pool.valid("gate_set"))
            pool.r.hset(pool.keys.device_attrs("d3"), "battery", "n:5")
        if name == "suite_join":
            pool.with_joining()
        before = dump(pool.r, pool.keys)
        pool.scripts[name](keys=[pool.keys.prefix], args=wire(pool.valid(name)))
        check_pool(pool.r, pool.keys)
        if name in READ_ONLY:
            assert dump(pool.r, pool.keys) == before, f"{name} is a read, but it wrote"
        else:
            assert dump(pool.r, pool.keys) != before, f"{name}'s valid call changed nothing"


def test_submit_refuses_a_goal_that_is_not_utf8_and_keeps_one_that_is(redis_server: Any) -> None:
    """Every client decodes a goal as UTF-8 (a host daemon would fail on the task): the
    script refuses other bytes, writing nothing, and keeps multi-byte text intact."""
    pool = Pool(redis_server.url)
    n, task = pool.valid("submit")
    bad_goals = (
        b"h\xbe8",
        b"\xc0\xaf",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"ok\xe2\x82",
        b"\xe1\xc2\x80\x80\x80",
        b"a\x80",
        b"\xc3\xa9\x80",
        b"\xf8\x88\x80\x80\x80",
    )
    for bad in bad_goals:
        before = dump(pool.r, pool.keys)
        call = wire([n, [*task[:2], bad, *task[3:]]])
        with pytest.raises(redis.ResponseError, match="^INVALID goal must be"):
            pool.scripts["submit"](keys=[pool.keys.prefix], args=call)
        assert dump(pool.r, pool.keys) == before
    text = "résumé ✓ 𝄞 日本 \ue000 \U0010fffd \u0800"
    pool.scripts["submit"](keys=[pool.keys.prefix], args=wire([n, [*task[:2], text, *task[3:]]]))
    assert pool.r.hget(pool.keys.task(task[0]), "goal") == text
