"""The chaos soak's short version: ``bench/faults/chaos.py`` with 300 tasks on 4 hosts x 4
devices, a fault every 2 s (host SIGKILL, leader scheduler SIGKILL, host SIGSTOP past its
lease, redis-server SIGKILL and restart from its AOF). Every task ends, none is lost, no device
or task ran two things at once, and ``deviceq verify`` finds nothing."""

from __future__ import annotations

import pytest
from bench.faults.chaos import FAULTS, parse, soak


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_chaos_soak_short() -> None:
    fig = soak(parse(["--tasks", "300", "--every", "2", "--max-seconds", "150"]))
    print(fig.text())
    assert fig.ok, fig.text()
    assert fig.tasks == 300 and sum(fig.statuses.values()) == 300, fig.text()
    assert fig.statuses.get("done", 0) >= 290, fig.text()  # a fault costs one attempt of 5
    assert all(fig.faults.get(kind, 0) >= 1 for kind in FAULTS), fig.text()
    assert fig.redis_restarts >= 1 and fig.runs >= 300, fig.text()
