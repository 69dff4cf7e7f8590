"""One constraint rule and one liveness rule: the Lua functions in ``lua/lib/`` are the
truth (the scripts enforce them); the Python mirrors (`deviceq.core.models.satisfies`,
`deviceq.core.liveness`) that the scheduler's snapshot, ``status`` and ``explain`` use must
agree with them on random inputs. Run against the real server."""

from __future__ import annotations

import uuid

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceq.core import liveness
from deviceq.core.models import satisfies
from deviceq.core.scripts import assemble
from deviceq.scheduler.strategies import Bucket, IdleDevice

DRIVERS = ["", "android", "ios", "web"]
TAGS = ["a", "b", "c", "wifi", "sim"]
tagsets = st.lists(st.sampled_from(TAGS), unique=True, max_size=4).map(sorted)


SETTINGS = settings(max_examples=300, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))  # fmt: skip


def test_python_constraint_rule_matches_lua(real_r: redis.Redis) -> None:
    sha = real_r.script_load(assemble(
        '--- @include "lib/constraints"\n'
        "return satisfies(ARGV[1], ARGV[2], ARGV[3], ARGV[4]) and 1 or 0"
    ))  # fmt: skip

    @SETTINGS
    @given(st.sampled_from(DRIVERS), tagsets, st.sampled_from(DRIVERS[1:]), tagsets)
    def check(t_driver: str, t_tags: list[str], d_driver: str, d_tags: list[str]) -> None:
        lua = real_r.evalsha(sha, 1, "dq:{c}:", t_driver, ",".join(t_tags), d_driver,
                             ",".join(d_tags)) == 1  # fmt: skip
        assert satisfies(t_driver or None, t_tags, d_driver, d_tags) == lua
        bucket = Bucket("s", t_driver or None, frozenset(t_tags), 0)
        device = IdleDevice("d", "h", d_driver, frozenset(d_tags))
        assert bucket.accepts(device) == lua

    check()


def test_python_liveness_rule_matches_lua(real_r: redis.Redis) -> None:
    pool = "c" + uuid.uuid4().hex[:10]
    prefix = f"dq:{{{pool}}}:"
    real_r.hset(prefix + "config", "host_timeout", "5")
    sha = real_r.script_load(assemble(
        '--- @include "lib/base"\n--- @include "lib/liveness"\n'
        "local r = host_placeable(k('host', 'h')) if r == true then return 'ok' end return r"
    ))  # fmt: skip
    # heartbeat ages well away from the 5 s boundary (the two clocks read a moment apart)
    ages = st.one_of(st.just(None), st.integers(0, 4500), st.integers(5500, 60_000))

    @SETTINGS
    @given(ages, st.sampled_from(["", "0", "1"]), st.sampled_from(["", "0", "1"]),
           st.sampled_from(["", "1796000000000"]))  # fmt: skip
    def check(age: int | None, draining: str, stopping: str, suspect: str) -> None:
        sec, usec = real_r.time()
        now = int(sec) * 1000 + int(usec) // 1000
        hb = "0" if age is None else str(now - age)
        real_r.hset(
            prefix + "host:h",
            mapping={
                "last_heartbeat": hb,
                "draining": draining,
                "stopping": stopping,
                "suspect": suspect,
            },
        )
        lua = real_r.evalsha(sha, 1, prefix)
        lua = None if lua in ("ok", b"ok") else (lua.decode() if isinstance(lua, bytes) else lua)
        row = {"last_heartbeat": hb, "draining": draining, "stopping": stopping,
               "suspect": suspect}  # fmt: skip
        assert liveness.unplaceable(row, now, 5000) == lua, (row, lua)
        assert liveness.host_alive(hb, now, 5000) == (age is not None and age <= 5000)

    check()
