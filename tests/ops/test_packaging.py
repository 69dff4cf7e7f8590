"""The Lua scripts load from the source checkout (editable install) and from a built wheel
installed into a fresh virtual environment; both run a real submit on the private server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest
import redis

import deviceq
from deviceq import Client
from deviceq.core.config import PoolConfig
from deviceq.core.scripts import Scripts, assemble, lua_dir, names, source

ROOT = Path(__file__).resolve().parents[2]
REPO_SCRIPTS = sorted(p.name for p in (ROOT / "lua").glob("*.lua"))
REPO_LUA = sorted(p.relative_to(ROOT / "lua").as_posix() for p in (ROOT / "lua").rglob("*.lua"))
"""Every Lua file: the scripts and the helper files they include (``lib/NAME.lua``)."""


def test_scripts_load_from_the_source_checkout(real_r: redis.Redis, pool: str) -> None:
    folder = lua_dir()
    assert sorted(p.name for p in folder.glob("*.lua")) == REPO_SCRIPTS
    assert any(n.startswith("lib/") for n in REPO_LUA)
    assert set(names()) == {n[:-4] for n in REPO_SCRIPTS if not n.startswith("_")}
    assert {"submit", "heartbeat", "assign", "claim", "renew", "report", "expire", "cancel"} <= set(
        names()
    )
    for name in names():
        text, body = source(name), (folder / f"{name}.lua").read_text()
        assert assemble(body, name, pruned=False).startswith(PoolConfig.lua_defaults())
        assert text.endswith(body) and "local function k(" in text
        assert (folder / f"{name}.lua").read_text() in text
    Scripts(real_r)  # every script registers
    tid = Client(real_r, pool).submit("from the checkout")
    assert real_r.hget(f"dq:{{{pool}}}:task:{tid}", "status") == "queued"


@pytest.mark.slow
def test_scripts_load_from_an_installed_wheel(tmp_path: Path, redis_server: Any, pool: str) -> None:
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("deviceq-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        packed = sorted(
            n.removeprefix("deviceq/lua/")
            for n in zf.namelist()
            if n.startswith("deviceq/lua/") and n.endswith(".lua")
        )
    assert packed == REPO_LUA, "the wheel carries every script and helper file under deviceq/lua/"

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # install the wheel itself (no deps); the dependencies come from this test's environment,
    # appended after the fresh site-packages so the wheel's deviceq wins over the editable one
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if install.returncode != 0 and "no such option: --python" in install.stderr:
        install = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "-q",
                "--target",
                str(site),
                str(wheel),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert install.returncode == 0, install.stderr
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    probe = textwrap.dedent(f"""
        import json, deviceq
        from deviceq import Client
        from deviceq.core.scripts import lua_dir, names
        tid = Client({redis_server.url!r}, {pool!r}).submit("from the wheel")
        print(json.dumps({{"file": deviceq.__file__, "lua": str(lua_dir()),
                          "names": list(names()), "tid": tid}}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    run = subprocess.run(
        [str(py), "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).resolve().is_relative_to(site.resolve()), out["file"]
    assert Path(out["lua"]).resolve().is_relative_to(site.resolve()), out["lua"]
    assert not Path(out["lua"]).resolve().is_relative_to(ROOT)
    assert sorted(out["names"]) == sorted(names())
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        assert r.hget(f"dq:{{{pool}}}:task:{out['tid']}", "status") == "queued"
    finally:
        r.close()
    assert Path(deviceq.__file__).resolve().is_relative_to(ROOT), "this process stays editable"
