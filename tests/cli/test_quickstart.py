"""The two quick-start commands (docs/getting-started.md; README.md shows the same two), run
verbatim, each from a fresh copy of the repository in a fresh virtual environment (as a
newcomer would on a fresh machine).

The first (install, then ``deviceq demo``) starts from an empty environment: it proves that
the project's own dependencies, without the test extras, make the demo work. The second
(install with the test extras, then the test command) runs in a fresh environment that sees
the packages of the one running this test (a ``.pth`` line, like ``--system-site-packages``):
its ``pip install -e ".[test]"`` still runs as written, resolves every requirement and
installs the project from the copy, but finds the dependencies already there instead of
installing some hundred packages again, which took 3-6 minutes of the suite on 2 cores. The
same install from an empty environment is what CI's ``.ci/run`` does before the suite starts.

The second command runs the test suite, this file included. To keep the inner run from
recursing and small, the outer test sets ``PYTEST_ADDOPTS`` (which pytest reads on top of the
command line, so the documented line itself stays verbatim) to ``-m "not slow" -k smoke``: the
process-starting end-to-end tests (this one and the demo test are marked ``slow``) are
deselected and only the smoke tests run. The inner run must still pass at least one test:
pytest exits 5 when nothing ran, which fails this test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
INNER_PYTEST_ADDOPTS = '-m "not slow" -k smoke'
pytestmark = pytest.mark.slow


def quickstart_commands(readme: str) -> list[str]:
    """The first two lines of the first ```sh block under the ``## Quick start`` heading."""
    m = re.search(r"^## Quick start[ \t]*$", readme, re.MULTILINE)
    assert m, "no '## Quick start' heading"
    section = readme[m.end() :]
    next_heading = re.search(r"^## ", section, re.MULTILINE)
    if next_heading:
        section = section[: next_heading.start()]
    block = re.search(r"^```sh[ \t]*\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert block, "no ```sh block under '## Quick start'"
    lines = block.group(1).splitlines()
    assert len(lines) >= 2, f"the quick-start block has fewer than two lines: {lines!r}"
    return lines[:2]


def fresh_copy(dest: Path) -> Path:
    """Copy the repository's files (tracked and untracked-but-not-ignored, as in a checkout) to
    ``dest``; without git, copy the tree minus build and environment folders."""
    dest.mkdir()
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
    if not files:
        skip = shutil.ignore_patterns(".git", "*venv*", "__pycache__", "*.egg-info", "build",
                                      "dist", ".pytest_cache")  # fmt: skip
        shutil.copytree(ROOT, dest, ignore=skip, dirs_exist_ok=True)
        return dest
    for rel in files:
        if any("venv" in part for part in Path(rel).parts[:-1]):  # a stray environment
            continue
        src = ROOT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def see_these_packages(env_dir: Path) -> None:
    """Make the virtual environment at ``env_dir`` see this interpreter's packages after its
    own (one ``.pth`` line per site-packages folder; their own ``.pth`` files are not run, so
    this environment's editable install of deviceq stays out)."""
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    inner = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", ask],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    (Path(inner) / "outer-packages.pth").write_text("".join(f"{p}\n" for p in sorted(here)))


def run_in_fresh_env(
    tmp: Path, name: str, command: str, *, see_packages: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` verbatim with bash from the root of a fresh copy of the repository, with
    a fresh virtual environment activated (its bin first on PATH, VIRTUAL_ENV set), empty or,
    with ``see_packages``, seeing this interpreter's packages (see the module doc)."""
    repo = fresh_copy(tmp / f"{name}-repo")
    env_dir = tmp / f"{name}-venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    if see_packages:
        see_these_packages(env_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVICEQ_", "PYTEST_"))}
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    env["VIRTUAL_ENV"] = str(env_dir)
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTEST_ADDOPTS"] = INNER_PYTEST_ADDOPTS
    env["TERM"] = "dumb"
    return subprocess.run(
        ["bash", "-c", command], cwd=repo, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def _explain(proc: subprocess.CompletedProcess[str]) -> str:
    return (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
        + (proc.stderr[-4000:])
    )


def documented_commands() -> list[str]:
    """The quick start of the getting-started page, the one these tests run."""
    return quickstart_commands(GETTING_STARTED.read_text())


def test_readme_quickstart_block_has_the_two_commands() -> None:
    first, second = documented_commands()
    assert "pip install" in first and "deviceq demo" in first
    assert "pip install" in second and "pytest" in second and ".[test]" in second
    # the README shows the same two, word for word
    assert quickstart_commands((ROOT / "README.md").read_text()) == [first, second]


@pytest.mark.timeout(600)
def test_quickstart_demo_command_runs_verbatim(tmp_path: Path) -> None:
    first, _ = documented_commands()
    proc = run_in_fresh_env(tmp_path, "demo", first)
    assert proc.returncode == 0, _explain(proc)
    out = proc.stdout + proc.stderr
    assert "deviceq demo summary" in out, _explain(proc)
    assert "every task done" in out, _explain(proc)


@pytest.mark.timeout(900)  # a fresh environment with every test extra, on a busy machine
def test_quickstart_test_command_runs_verbatim(tmp_path: Path) -> None:
    _, second = documented_commands()
    proc = run_in_fresh_env(tmp_path, "tests", second, see_packages=True)
    assert proc.returncode == 0, _explain(proc)
    summary = re.search(r"(\d+) passed", proc.stdout)
    assert summary and int(summary.group(1)) >= 1, _explain(proc)
    assert " failed" not in proc.stdout.splitlines()[-1], _explain(proc)
