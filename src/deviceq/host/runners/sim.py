"""The built-in ``sim`` runner: simulated work for demos and benchmarks."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable

from ...core.errors import ConfigError
from .base import Outcome, Task


def parse_duration(spec: str | float | int) -> Callable[[random.Random], float]:
    """A duration distribution: ``0.5`` (fixed), ``uniform:A,B``, ``exp:MEAN``,
    ``normal:MEAN,SD`` or ``lognormal:MEAN,SD`` (seconds; never negative)."""
    if isinstance(spec, int | float):
        value = float(spec)
        return lambda rng: value
    text = str(spec).strip()
    kind, _, rest = text.partition(":")
    try:
        if not rest:
            value = float(text)
            if value < 0:
                raise ValueError("negative")
            return lambda rng: value
        nums = [float(x) for x in rest.split(",")]
        if kind == "uniform" and len(nums) == 2:
            a, b = nums
            return lambda rng: max(0.0, rng.uniform(a, b))
        if kind == "exp" and len(nums) == 1 and nums[0] > 0:
            mean = nums[0]
            return lambda rng: rng.expovariate(1.0 / mean)
        if kind == "normal" and len(nums) == 2:
            mu, sd = nums
            return lambda rng: max(0.0, rng.gauss(mu, sd))
        if kind == "lognormal" and len(nums) == 2 and nums[0] > 0:
            mean, sd = nums
            sigma2 = math.log(1 + (sd / mean) ** 2)
            mu = math.log(mean) - sigma2 / 2
            return lambda rng: rng.lognormvariate(mu, math.sqrt(sigma2))
    except ValueError:
        pass
    raise ConfigError(
        f"bad duration {text!r}: use SECONDS, uniform:A,B, exp:MEAN, normal:MEAN,SD "
        "or lognormal:MEAN,SD"
    )


class _Sim:
    """The draws of the ``sim`` runner (`SimRunner`, `AsyncSimRunner`)."""

    def __init__(
        self,
        duration: str | float = "0.1",
        fail_rate: float = 0.0,
        error_rate: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.draw = parse_duration(duration)
        for name, rate in (("fail_rate", fail_rate), ("error_rate", error_rate)):
            if not 0.0 <= float(rate) <= 1.0:
                raise ConfigError(f"{name} must be between 0 and 1, got {rate}")
        self.fail_rate = float(fail_rate)
        self.error_rate = float(error_rate)
        self.rng = random.Random(seed)
        self._lock = threading.Lock()

    def _drawn(self) -> tuple[float, float]:
        """The run's seconds and its roll of the dice."""
        with self._lock:
            return self.draw(self.rng), self.rng.random()

    def _outcome(self, task: Task, seconds: float, roll: float, stopped: bool) -> Outcome:
        if stopped:
            return Outcome.failure(f"simulated work stopped after less than {seconds:.3f}s")
        if roll < self.error_rate:
            raise RuntimeError("simulated runner error")
        if roll < self.error_rate + self.fail_rate:
            return Outcome.failure(f"simulated failure after {seconds:.3f}s")
        return Outcome.success(f"simulated {task.goal!r} on {task.device_id} in {seconds:.3f}s")


class SimRunner(_Sim):
    """Simulated work for demos and benchmarks: waits a duration drawn from ``duration`` (see
    `parse_duration`), then fails with probability ``fail_rate`` (a reported failure) or raises
    with probability ``error_rate`` (a runner error). Stops at once when cancelled."""

    def __call__(self, task: Task) -> Outcome:
        seconds, roll = self._drawn()
        return self._outcome(task, seconds, roll, task.cancel.wait(seconds))


class AsyncSimRunner(_Sim):
    """`SimRunner` as an async runner (``--goal-runner sim --async``): the same draws and
    outcomes, the wait awaited on the host's event loop."""

    async def __call__(self, task: Task) -> Outcome:
        seconds, roll = self._drawn()
        return self._outcome(task, seconds, roll, await task.wait_cancel(seconds))
