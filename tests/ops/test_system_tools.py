"""The programs the suite drives beyond Python (tests/system_tools.py): a missing one is
installed when the run may (root, apt-get: tests/ops/test_alerts.py then runs on a fresh
machine), else the test that needs it fails with a line saying how to install it, never a
skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO_DIR
from system_tools import find, provide


def test_found_programs_are_given_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = tmp_path / "sometool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert provide({"sometool": ("sometool",)}, "somepackage", "a test") == {"sometool": str(tool)}
    assert find("/nonexistent/tool", "sometool") == str(tool)


def test_a_missing_program_that_cannot_be_installed_fails_saying_how(tmp_path: Path) -> None:
    """Without apt-get (an empty PATH) the test that needs the program fails: a failure in the
    run's summary naming the package and the command, not a skip."""
    inner = tmp_path / "test_needs_tool.py"
    inner.write_text(
        "from system_tools import provide\n"
        "def test_needs():\n"
        "    provide({'nosuchtool': ('nosuchtool',)}, 'nosuchpkg', 'a test needs it')\n"
    )
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": os.pathsep.join(
        [str(Path(REPO_DIR) / "tests"), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rA", str(inner)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "1 failed" in out and "skipped" not in out, out
    assert "nosuchtool not found (a test needs it) and no apt-get on this machine" in out
    assert "apt-get install nosuchpkg" in out
