"""The figures of ``python -m bench.fleet``: one pass's measurement (`Pass`), one fleet size's
(`Size`), and their JSON object (`summary`) and markdown tables (`markdown`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.fleet.daemons import Utilization
from bench.fleet.probes import SLOWER_THAN_US, Probes

UTILIZATION_NOTE = "not measured in this run (--no-daemons)"


@dataclass
class Pass:
    wall_ms: float
    cpu_ms: float
    cmd_ms: float
    assigned: int
    seen_idle: int  # AssignResult.idle_devices
    pool_idle: int  # ZCARD idle just before the pass


@dataclass
class Size:
    devices: int
    hosts: int = 0
    register_s: float = 0.0
    load_s: float = 0.0
    fill_passes: int = 0
    fill_assigned: int = 0
    fill_wall_s: float = 0.0
    fill_cpu_s: float = 0.0
    fill_first: Pass | None = None
    ten: list[Pass] = field(default_factory=list)
    empty: list[Pass] = field(default_factory=list)
    commit: list[Pass] = field(default_factory=list)  # the commit call alone, 200 pairs
    slow_max_ms: float | None = None
    slow_script: str | None = None
    slow_by_script: dict[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def fill_per_s(self) -> float:
        return self.fill_assigned / self.fill_wall_s if self.fill_wall_s else float("nan")

    @property
    def fill_cpu_us_per(self) -> float:
        return self.fill_cpu_s * 1e6 / self.fill_assigned if self.fill_assigned else float("nan")

    @staticmethod
    def med(ps: list[Pass], attr: str) -> float:
        return float(statistics.median(getattr(p, attr) for p in ps)) if ps else float("nan")

    def as_dict(self) -> dict[str, Any]:
        def passes(ps: list[Pass]) -> dict[str, Any]:
            return {
                "passes": len(ps),
                "wall_ms": self.med(ps, "wall_ms"),
                "redis_cpu_ms": self.med(ps, "cpu_ms"),
                "redis_cmd_ms": self.med(ps, "cmd_ms"),
                "assigned": self.med(ps, "assigned"),
                "idle_seen": self.med(ps, "seen_idle"),
                "idle_in_pool": self.med(ps, "pool_idle"),
            }

        return {
            "devices": self.devices,
            "hosts": self.hosts,
            "register_s": self.register_s,
            "load_s": self.load_s,
            "fill": {
                "passes": self.fill_passes,
                "assigned": self.fill_assigned,
                "wall_s": self.fill_wall_s,
                "per_s": self.fill_per_s,
                "redis_cpu_us_per_placement": self.fill_cpu_us_per,
                "first_pass_idle_seen": self.fill_first.seen_idle if self.fill_first else None,
                "first_pass_idle_in_pool": self.fill_first.pool_idle if self.fill_first else None,
            },
            "ten": passes(self.ten),
            "empty": passes(self.empty),
            "commit_200": passes(self.commit),
            "slowlog_max_ms": self.slow_max_ms,
            "slowlog_max_script": self.slow_script,
            "slowlog_by_script": {
                k: {"entries": n, "max_ms": m} for k, (n, m) in self.slow_by_script.items()
            },  # fmt: skip
        }


def label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def ratio(a: float, b: float) -> float | None:
    return a / b if b and a == a and b == b else None


def summary(
    sizes: list[Size],
    probes: Probes | None,
    util: Utilization | None,
    util_async: Utilization | None = None,
) -> dict[str, Any]:
    """The JSON object: headline keys per size label, then every raw figure."""
    base = next((s for s in sizes if s.devices == 1000), sizes[0])
    out: dict[str, Any] = {}
    for n in sorted({1000, 10_000, 100_000, *(x.devices for x in sizes)}):
        s = next((x for x in sizes if x.devices == n), None)
        k = label(n)

        def get(f: Any, s: Size | None = s) -> Any:
            return f(s) if s else None

        out[f"fill_per_s_{k}"] = get(lambda x: x.fill_per_s)
        out[f"ten_pass_ms_{k}"] = get(lambda x: x.med(x.ten, "wall_ms"))
        out[f"ten_pass_redis_cpu_ms_{k}"] = get(lambda x: x.med(x.ten, "cpu_ms"))
        out[f"empty_pass_ms_{k}"] = get(lambda x: x.med(x.empty, "wall_ms"))
        out[f"empty_pass_redis_cpu_ms_{k}"] = get(lambda x: x.med(x.empty, "cpu_ms"))
        out[f"ten_pass_ratio_{k}"] = get(
            lambda x: ratio(x.med(x.ten, "wall_ms"), base.med(base.ten, "wall_ms"))
        )
        out[f"ten_pass_redis_ratio_{k}"] = get(
            lambda x: ratio(x.med(x.ten, "cpu_ms"), base.med(base.ten, "cpu_ms"))
        )
        out[f"empty_pass_ratio_{k}"] = get(
            lambda x: ratio(x.med(x.empty, "wall_ms"), base.med(base.empty, "wall_ms"))
        )
        out[f"empty_pass_redis_ratio_{k}"] = get(
            lambda x: ratio(x.med(x.empty, "cpu_ms"), base.med(base.empty, "cpu_ms"))
        )
        out[f"commit_200_redis_cpu_ms_{k}"] = get(lambda x: x.med(x.commit, "cpu_ms"))
        out[f"idle_seen_{k}"] = get(lambda x: x.med(x.empty, "seen_idle"))
        out[f"idle_in_pool_{k}"] = get(lambda x: x.med(x.empty, "pool_idle"))
    longest = probes.longest if probes else None
    out["max_script_ms"] = longest[1].duration_ms if longest else None
    out["max_script"] = f"{longest[1].script} ({longest[0]})" if longest else None
    out["slowlog_threshold_ms"] = SLOWER_THAN_US / 1000
    beats = probes.heartbeats if probes else []
    paced = {str(h.devices): h for h in beats if h.paced_ms}
    at_once = {str(h.devices): h for h in beats if not h.paced_ms}
    out["heartbeat_unchanged_us"] = {n: paced[n].cmd_us if n in paced else None
                                     for n in ("10", "5000")}  # fmt: skip
    out["heartbeat_unchanged_cpu_us"] = {n: h.cpu_us for n, h in paced.items()} or None
    out["heartbeat_unchanged_back_to_back_us"] = {n: h.cmd_us for n, h in at_once.items()} or None
    out["heartbeat_unchanged_alone_us"] = (probes.alone_us or None) if probes else None
    out["script_floor_us"] = (probes.floor_us or None) if probes else None
    out["host_cpu_us_per_task"] = util.host_cpu_us_per_task if util else None
    out["scheduler_cpu_us_per_task"] = util.scheduler_cpu_us_per_task if util else None
    out["utilization"] = util.utilization if util else None
    # the same with an async runner (on the host's event loop), measured in the same run
    out["host_cpu_us_per_task_async"] = util_async.host_cpu_us_per_task if util_async else None
    out["scheduler_cpu_us_per_task_async"] = (
        util_async.scheduler_cpu_us_per_task if util_async else None
    )
    out["utilization_async"] = util_async.utilization if util_async else None
    out["utilization_note"] = (
        f"real daemons, one host of {util.devices} devices, tasks of {util.task_s} s, "
        f"{util.tasks} tasks in a {util.window_s:.1f} s steady-state window"
        if util
        else UTILIZATION_NOTE
    )
    out["sizes"] = [s.as_dict() for s in sizes]
    out["slowlog"] = {s.name: s.as_dict() for s in probes.scenarios} if probes else None
    return out


def fmt(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def markdown(
    sizes: list[Size],
    probes: Probes | None,
    util: Utilization | None,
    meta: str,
    util_async: Utilization | None = None,
) -> str:
    base = next((s for s in sizes if s.devices == 1000), sizes[0])
    lines = [
        "| devices | hosts | fill placements/s | ratio | fill Redis CPU µs/placement "
        "| 10-task pass wall ms | ratio | Redis CPU ms | ratio "
        "| empty pass wall ms | ratio | Redis CPU ms | ratio | 200-pair commit alone: Redis CPU ms "
        "| ratio | idle seen / in pool "
        "| longest script call on this server (setup included) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in sizes:
        tw, tc = s.med(s.ten, "wall_ms"), s.med(s.ten, "cpu_ms")
        ew, ec = s.med(s.empty, "wall_ms"), s.med(s.empty, "cpu_ms")
        cc = s.med(s.commit, "cpu_ms")
        slow = f"{s.slow_max_ms:.1f} ms {s.slow_script}" if s.slow_max_ms else "none over 5 ms"
        lines.append(
            f"| {s.devices:,} | {s.hosts} | {fmt(s.fill_per_s, 0)} "
            f"| {fmt(ratio(s.fill_per_s, base.fill_per_s), 2)} | {fmt(s.fill_cpu_us_per, 0)} "
            f"| {fmt(tw)} | {fmt(ratio(tw, base.med(base.ten, 'wall_ms')), 2)} | {fmt(tc, 2)} "
            f"| {fmt(ratio(tc, base.med(base.ten, 'cpu_ms')), 2)} "
            f"| {fmt(ew)} | {fmt(ratio(ew, base.med(base.empty, 'wall_ms')), 2)} "
            f"| {fmt(ec, 2)} | {fmt(ratio(ec, base.med(base.empty, 'cpu_ms')), 2)} "
            f"| {fmt(cc, 2)} | {fmt(ratio(cc, base.med(base.commit, 'cpu_ms')), 2)} "
            f"| {fmt(s.med(s.empty, 'seen_idle'), 0)} / {fmt(s.med(s.empty, 'pool_idle'), 0)} "
            f"| {slow} |"
        )
    if probes:
        lines += [
            "",
            f"Longest script calls (SLOWLOG, over {SLOWER_THAN_US / 1000:.0f} ms):",
            "",
            "| scenario | wall s | Redis CPU ms | longest call ms | script "
            "| script calls over 5 ms (calls, longest ms) | longest other command | what ran |",
            "|---|---:|---:|---:|---|---|---|---|",
        ]
        for sc in probes.scenarios:
            lo, inner = sc.longest, sc.longest_inner
            per = ", ".join(f"{k} {n}x {m:.1f}" for k, (n, m) in sc.by_script().items())
            inn = f"{inner.script} {inner.duration_ms:.1f} ms" if inner else "-"
            lines.append(
                f"| {sc.name} | {sc.wall_s:.1f} | {sc.redis_cpu_ms:,.0f} "
                f"| {fmt(lo.duration_ms if lo else None)} | {lo.script if lo else '-'} "
                f"| {per or '-'} | {inn} | {sc.note} |"
            )
        lines += [
            "",
            "Heartbeat with nothing changed:",
            "",
            "| devices | heartbeats | started | Redis command µs/heartbeat "
            "| Redis CPU µs/heartbeat | client wall ms/heartbeat |",
            "|---:|---:|---|---:|---:|---:|",
        ]
        for h in probes.heartbeats:
            how = f"every {h.paced_ms:.0f} ms" if h.paced_ms else "back to back"
            lines.append(
                f"| {h.devices:,} | {h.beats} | {how} | {h.cmd_us:,.0f} | {h.cpu_us:,.0f} "
                f"| {h.wall_ms:.2f} |"
            )
        lines += [
            "",
            "Paced, Redis is idle between beats (as between a real host's) and both sizes are "
            "measured alike; back to back, the 5,000-device host's own client time spaces its "
            "beats while the 10-device host's follow at once, and an idle Redis serves a call "
            "slower (its caches cold).",
        ]
        if probes.alone_us or probes.floor_us:
            alone = ", ".join(f"{int(d):,} devices {us:,.0f}" for d, us in probes.alone_us.items())
            fl = probes.floor_us
            lines += [
                "",
                f"The heartbeat script's own calls, back to back with their arguments built "
                f"first (Redis command µs per call): {alone or '-'}. A script of two commands "
                f"(a read and a write of the host's hash, the least a heartbeat can do): "
                f"{fl.get('back_to_back', float('nan')):,.0f} back to back, "
                f"{fl.get('paced', float('nan')):,.0f} paced as the heartbeats above.",
            ]
    if util:
        lines += [
            "",
            "Utilization with the real daemons (`deviceq scheduler run` + one `deviceq host run`, "
            "goal runner `bench.fleet.runners:hold` in threads, `hold_async` on the host's "
            "event loop):",
            "",
            "| runner | devices | task s | window s | tasks | utilization "
            "| host daemon CPU µs/task | scheduler CPU µs/task |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for u in (util, util_async):
            if u is not None:
                lines.append(
                    f"| `{u.runner.rpartition(':')[2]}` | {u.devices} | {u.task_s} "
                    f"| {u.window_s:.1f} | {u.tasks:,} | {u.utilization:.3f} "
                    f"| {u.host_cpu_us_per_task:,.0f} | {u.scheduler_cpu_us_per_task:,.0f} |"
                )
    else:
        lines += ["", f"Utilization with the real daemons: {UTILIZATION_NOTE}."]
    lines += ["", meta]
    return "\n".join(lines) + "\n"
