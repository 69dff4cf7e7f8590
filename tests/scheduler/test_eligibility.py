"""One eligibility rule: ``device_blocker`` / ``refresh_idle`` in ``lua/lib/eligibility.lua`` decide
whether a device is an idle candidate (the truth: every script that changes a device flag
calls them); `deviceq.core.eligibility` mirrors the rule for status, explain, verify, the
dashboard and the scheduler's snapshot. Every combination of the device flags is driven
through both, on the real server, and through the scripts' own entry points (the idle index
after ``refresh_idle``, ``assign.lua``'s refusal reason, ``verdict`` on the stored hash)."""

from __future__ import annotations

import itertools
import uuid

import redis

from deviceq.core import eligibility
from deviceq.core.models import DeviceState, Host, PooledDevice
from deviceq.core.scripts import assemble

STATES = [None, "idle", "busy", "offline"]
RESERVED = ["", "t1"]
QUARANTINED = [None, "0", "1"]
HELD = [None, "", "suspect", "refused"]
BOOKED = [None, "", "1796000000000"]
HEALTH = [None, "", "healthy", "checking", "unhealthy"]
GATED = [None, "", "low-battery"]

PROBE = """--- @include "lib/base"
--- @include "lib/eligibility"
--- @include "lib/placement"
local did = ARGV[1]
local d = gate(did)
local why = device_blocker(d)
local cand = refresh_idle(did, d)
local member = redis.call('ZSCORE', k('idle'), did) and 1 or 0
local _, err = device_assignable(did, {})
return {why or '', cand and 1 or 0, member, err or ''}
"""


def _combos() -> list[dict[str, str | None]]:
    out = []
    combos = itertools.product(STATES, RESERVED, QUARANTINED, HELD, BOOKED, HEALTH, GATED)
    for s, r, q, h, b, he, g in combos:
        out.append(
            {
                "state": s,
                "reserved_by": r,
                "quarantined": q,
                "held": h,
                "booked_until": b,
                "health": he,
                "gated": g,
            }  # fmt: skip
        )
    return out


def test_every_flag_combination_gets_the_same_answer_in_lua_and_python(
    real_r: redis.Redis,
) -> None:
    pool = "elig" + uuid.uuid4().hex[:10]
    prefix = f"dq:{{{pool}}}:"
    sha = real_r.script_load(assemble(PROBE))
    dk = prefix + "device:d1"
    combos = _combos()
    assert len(combos) == 4320
    seen: set[str | None] = set()
    try:
        for fields in combos:
            real_r.delete(dk, prefix + "idle")
            stored = {k: v for k, v in fields.items() if v is not None}
            real_r.hset(dk, mapping={"id": "d1", "host_id": "h1", "driver_type": "android",
                                     **stored})  # fmt: skip
            why, cand, member, err = real_r.evalsha(sha, 1, prefix, "d1")
            py = eligibility.device_blocker(fields)
            seen.add(py)
            assert (why or None) == py, fields
            assert cand == member == (py is None), fields
            # every reason the device has, first one the rule's answer
            all_ = eligibility.device_blockers(fields)
            assert (all_[0] if all_ else None) == py, fields
            # assign.lua refuses with the rule's reason (the host is unknown: host_dead after)
            if py is None:
                assert err == "host_dead", fields
            elif py in ("busy", "offline"):
                assert err == "device_not_idle", fields
            else:
                assert err == "device_" + ("held" if py == "suspect" else py), fields
            # the stored hash read as a model gets the same verdict on a live, idle host
            dev = PooledDevice.from_hash(real_r.hgetall(dk))  # type: ignore[arg-type]
            host = Host(host_id="h1", alive=True, last_heartbeat=1)
            v = eligibility.verdict(dev, host)
            assert v.reasons == tuple(all_), fields
            assert v.state == (py or "idle"), fields
    finally:
        real_r.delete(dk, prefix + "idle")
    assert seen == {None, *eligibility.DEVICE_REASONS}


def test_host_reasons_follow_the_device_precedence() -> None:
    dev = PooledDevice(device_id="d1", host_id="h1", driver_type="android")
    alive = Host(host_id="h1", alive=True, last_heartbeat=1)
    assert eligibility.verdict(dev, alive) == eligibility.Verdict("idle", ())
    assert eligibility.verdict(dev, None).state == "host_dead"
    drained = alive.model_copy(update={"draining": True})
    assert eligibility.verdict(dev, drained) == eligibility.Verdict("draining", ("host_draining",))
    suspect = alive.model_copy(update={"suspect": True})
    assert eligibility.verdict(dev, suspect).state == "suspect"
    busy = dev.model_copy(update={"state": DeviceState.busy})
    assert eligibility.verdict(busy, drained).reasons == ("busy", "host_draining")
    q = dev.model_copy(update={"quarantined": True, "reserved_by": "t1"})
    assert eligibility.verdict(q, None).reasons == ("quarantined", "host_dead", "reserved")
