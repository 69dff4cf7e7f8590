"""A simulated test run for the suites benchmark (`bench/scheduler/suites.py`; a shard's
command runs ``python -c "from bench.support.suite_sim import main; main()" TEST...``): sleeps
each test id's duration (read from the JSON file ``$BENCH_SUITE_DURATIONS``, seconds) times a
jitter of +-``$BENCH_SUITE_JITTER`` (default 0.1), then writes the JUnit file of the run into
``$DEVICEQ_ARTIFACTS_DIR``."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path


def main(tests: list[str] | None = None) -> int:
    tests = sys.argv[1:] if tests is None else tests
    durations = json.loads(Path(os.environ["BENCH_SUITE_DURATIONS"]).read_text())
    jitter = float(os.environ.get("BENCH_SUITE_JITTER", "0.1"))
    cases = []
    for test in tests:
        secs = durations[test] * (1 + random.uniform(-jitter, jitter))
        time.sleep(secs)
        cls, _, name = test.partition("#")
        cases.append(f'<testcase classname="{cls}" name="{name}" time="{secs:.4f}"/>')
    out = Path(os.environ["DEVICEQ_ARTIFACTS_DIR"]) / "junit.xml"
    out.write_text(f'<testsuite name="bench">{"".join(cases)}</testsuite>')
    return 0
