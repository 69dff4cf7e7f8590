"""What a measured redis-server did during a window: commands executed (``INFO
commandstats``, commands run inside scripts included) and CPU used (``INFO cpu``:
``used_cpu_user + used_cpu_sys``), without the harness's own INFO and counter polls.

The harness talks to the server through one ``Probe`` that counts every command it sends;
those counts are subtracted from the command deltas, and their CPU cost (calibrated on the
same server before the workers start) from the CPU delta."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis

from bench import COUNTER_KEY


@dataclass(frozen=True)
class Snapshot:
    calls: dict[str, int]
    cpu_s: float
    t: float


@dataclass
class Usage:
    """Server work between two snapshots, the harness's own commands taken out."""

    commands: dict[str, int]
    cpu_s: float
    harness_cpu_s: float  # what was subtracted for the harness's INFO and GET calls

    @property
    def total_commands(self) -> int:
        return sum(self.commands.values())

    def top(self, per: int, k: int = 6) -> str:
        """The ``k`` most frequent commands per job, e.g. ``EVALSHA:2 HSET:5.1``."""
        items = sorted(self.commands.items(), key=lambda cn: -cn[1])[:k]
        return " ".join(f"{c.upper()}:{n / per:.3g}" for c, n in items if n > 0)


@dataclass
class Probe:
    """The harness's connection to a measured server (no health-check PINGs)."""

    url: str
    sent: dict[str, int] = field(default_factory=dict)
    info_cost_s: float = 0.0
    get_cost_s: float = 0.0

    def __post_init__(self) -> None:
        self.r = redis.Redis.from_url(self.url, decode_responses=True)
        self.r.ping()  # connect (and its handshake) now, outside any window
        self.sent.clear()

    def _count(self, cmd: str) -> None:
        self.sent[cmd] = self.sent.get(cmd, 0) + 1

    def counter(self) -> int:
        self._count("get")
        return int(self.r.get(COUNTER_KEY) or 0)

    def snapshot(self) -> Snapshot:
        self._count("info")
        info = self.r.info("commandstats", "cpu")
        calls = {
            k.removeprefix("cmdstat_").lower(): int(v["calls"])
            for k, v in info.items()
            if k.startswith("cmdstat_")
        }
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return Snapshot(calls, cpu, time.perf_counter())

    def calibrate(self, infos: int = 20, gets: int = 400) -> None:
        """Measure the server CPU of one snapshot and of one counter poll."""
        first = self.snapshot()
        for _ in range(infos - 2):
            self.snapshot()
        last = self.snapshot()
        self.info_cost_s = max(0.0, (last.cpu_s - first.cpu_s) / (infos - 1))
        for _ in range(gets):
            self.counter()
        after = self.snapshot()
        self.get_cost_s = max(0.0, (after.cpu_s - last.cpu_s - self.info_cost_s) / gets)

    def mark(self) -> dict[str, int]:
        """Commands sent so far (pass to ``usage`` as the window's start)."""
        return dict(self.sent)

    def usage(self, a: Snapshot, b: Snapshot, sent_at_a: dict[str, int]) -> Usage:
        """Work between snapshots ``a`` and ``b``. ``sent_at_a`` is ``mark()`` taken just
        before snapshot ``a``: a command's stats count once it has run, so ``a``'s own INFO
        falls in the window and ``b``'s does not."""
        mine = {c: n - sent_at_a.get(c, 0) for c, n in self.sent.items()}
        mine["info"] = mine.get("info", 0) - 1  # b's own INFO is not in b's stats yet
        commands: dict[str, int] = {}
        for cmd, n in b.calls.items():
            d = n - a.calls.get(cmd, 0) - mine.get(cmd, 0)
            if d:
                commands[cmd] = d
        harness = mine.get("info", 0) * self.info_cost_s + mine.get("get", 0) * self.get_cost_s
        return Usage(commands, max(0.0, b.cpu_s - a.cpu_s - harness), harness)

    def close(self) -> None:
        self.r.close()
