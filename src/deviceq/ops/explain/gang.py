"""``explain`` for a queued multi-device (gang) task: per role, how many registered devices
the pipeline's filters accept for it (`devices.match`, the same filter stage as a single
task's) and how many of those are idle now (the others by what keeps them, the one rule);
whether the scheduler keeps devices for it (``gang_holds``) and until when; and the policy
that keeps it from starving (``gang_reserve_after``, ``gang_hold_seconds``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...core.config import PoolConfig
from ...core.connection import PoolConnection
from ...core.fleet import effective_state, read_devices, read_hosts
from ...core.models import ScheduledTask
from ...core.where import parse_all
from ...scheduler.placement.recorder import Need
from .devices import match, prefer_ranking
from .model import Explanation, Reason, at, secs
from .single import _plain, where_narrowed


def _setting(raw: Any, name: str) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError):
        return float(PoolConfig.model_fields[name].default)


def _want(driver_type: str | None, tags: Any) -> str:
    parts = [f"driver type {driver_type}" if driver_type else ""]
    if tags:
        parts.append("tags " + ",".join(tags))
    return " and ".join(p for p in parts if p) or "any device"


def explain_gang(admin: PoolConnection, task: ScheduledTask) -> Explanation:
    """Why queued multi-device task ``task`` is not placed yet."""
    r, k = admin.redis, admin.keys
    now = admin.server_time_ms()
    devices = read_devices(admin)
    hosts = {h.host_id: h for h in read_hosts(admin)}
    pipe = r.pipeline(transaction=False)
    pipe.hget(k.gang_holds, task.id)
    pipe.zrank(k.gangs, task.id)
    pipe.hmget(k.config, "gang_reserve_after", "gang_hold_seconds")
    pipe.get(k.leader)
    hold, rank, (reserve_raw, hold_raw), leader = pipe.execute()
    reserve_after = _setting(reserve_raw, "gang_reserve_after")
    hold_secs = _setting(hold_raw, "gang_hold_seconds")
    reasons: list[Reason] = []
    counts: dict[str, int] = {"devices": len(devices), "older_gangs": int(rank or 0)}
    unmatched: list[str] = []
    short: list[str] = []
    for name, role in (task.roles or {}).items():
        matching = match(Need(role.driver_type, frozenset(role.tags)), devices).matching
        stop: str | None = None
        if role.where and matching:
            matching, stop = where_narrowed(
                admin, _want(role.driver_type, role.tags), parse_all(list(role.where)), matching
            )
        states: Counter[str] = Counter()
        for d in matching:
            states[effective_state(d, hosts.get(d.host_id))] += 1
        want = (
            " and ".join(
                x
                for x in (
                    f"driver type {role.driver_type}" if role.driver_type else "",
                    "tags " + ",".join(role.tags) if role.tags else "",
                )
                if x
            )
            or "any device"
        )
        counts[f"{name}_matching"] = len(matching)
        counts[f"{name}_idle"] = states["idle"]
        if stop is not None:
            unmatched.append(name)
            reasons.append(
                Reason(
                    "where", f"role {name}: {stop}", 0, {"role": name, "where": list(role.where)}
                )
            )
            continue
        if not matching:
            unmatched.append(name)
            reasons.append(
                Reason(
                    "role_unmatched",
                    f"role {name}: no registered device offers {want}",
                    0,
                    {"role": name},
                )  # fmt: skip
            )
            continue
        others = ", ".join(f"{n} {s}" for s, n in states.most_common() if s != "idle")
        if not states["idle"]:
            short.append(name)
        reasons.append(
            Reason(
                "role_devices",
                f"role {name} ({want}): {len(matching)} matching device(s), "
                f"{states['idle']} idle" + (f" ({others})" if others else ""),
                states["idle"],
                {"role": name, "states": dict(states)},
            )
        )
        ranked = prefer_ranking(admin, matching, hosts, role=name)
        if ranked is not None:
            text, setting, order = ranked
            reasons.append(Reason("prefer", text, len(order), {
                "role": name, "prefer": setting,
                "ranking": [{"device_id": d, "value": _plain(v)} for d, v in order]}))  # fmt: skip
    if hold:
        until, _, kept = str(hold).partition("|")
        reasons.append(
            Reason(
                "kept_devices",
                f"the scheduler keeps {kept} for it (no other task gets them) until "
                f"{at(int(until))} (in {secs(int(until), now)})",
                len(kept.split(",")),
                {"devices": kept.split(","), "until": int(until)},
            )
        )
    reasons.append(
        Reason(
            "gang_policy",
            f"all roles are placed at once or none; after waiting {reserve_after:g} s "
            f"(gang_reserve_after) it keeps idle matching devices for at most {hold_secs:g} s "
            "(gang_hold_seconds)" + (f"; {rank} older multi-device task(s) first" if rank else ""),
            detail={"gang_reserve_after": reserve_after, "gang_hold_seconds": hold_secs},
        )
    )
    if task.attempt:
        reasons.append(
            Reason("retry", f"attempt {task.attempt} of {task.max_attempts} ended; queued again")
        )
    if unmatched:
        summary = f"no registered device could run role(s) {', '.join(unmatched)}"
    elif short:
        summary = (
            "waiting until every role has an idle device at once (none idle for: "
            + ", ".join(short)
            + ")"
        )
    elif not leader:
        summary = "every role has an idle device, but no scheduler is running"
    else:
        summary = "every role has an idle matching device: placed at a coming scheduler pass"
    return Explanation(task.id, task.status.value, summary, reasons, counts)
