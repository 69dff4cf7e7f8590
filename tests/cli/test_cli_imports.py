"""What ``deviceq task show ID`` imports to run (a structural check of the import graph, not a
timing: the start time is measured in bench/cli/start.py): neither form builds the models
(pydantic), reads the client settings (pydantic_settings) or the scheduler, or prints with
rich."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from typing import Any

from harness import SRC_DIR

PROBE = """import sys
from deviceq.cli import main
watch = tuple(sys.argv.pop().split(","))
try:
    main(sys.argv[1:], prog_name="deviceq")
except SystemExit as exc:
    assert not exc.code, exc.code
print(sorted(m for m in sys.modules if m.startswith(watch)), file=sys.stderr)
"""


def imported(*args: str, watch: tuple[str, ...]) -> list[str]:
    """The modules out of ``watch`` (prefixes) that running ``deviceq ARGS`` imported."""
    env = {**os.environ, "PYTHONPATH": SRC_DIR, "COLUMNS": "80"}
    out = subprocess.run([sys.executable, "-c", PROBE, *args, ",".join(watch)],
                         capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return list(ast.literal_eval(out.stderr.strip().splitlines()[-1]))


def test_task_show_imports_neither_the_models_nor_the_scheduler(
    redis_url: str, real_fleet: Any
) -> None:
    tid = real_fleet.client.submit("g")
    heavy = ("pydantic", "pydantic_settings", "rich", "deviceq.core.models", "deviceq.producer",
             "deviceq.scheduler", "deviceq.host", "yaml", "httpx")  # fmt: skip
    base = ("--redis-url", redis_url, "--pool", real_fleet.pool, "task", "show", tid)
    assert imported(*base, "--json", watch=heavy) == []
    assert imported(*base, watch=heavy) == []
    reader = ("deviceq.core.task_record",)
    assert imported(*base, watch=reader) == list(reader)  # (the probe sees imports)
