"""The docs site builds strictly and its generated references are whole: the command line page
names every click command of ``deviceq`` and the HTTP API page every operation of the service's
OpenAPI document. The README stays short and points into the site."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from deviceq.cli import main
from docs_pages import README, ROOT, pages, rel

MAX_README_LINES = 300


def command_paths(group: click.Command, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's path under ``group`` (``("host", "run")``), groups included."""
    out = [prefix]
    if isinstance(group, click.Group):
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            sub = group.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                out += command_paths(sub, (*prefix, name))
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def test_the_cli_reference_has_every_command(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text()
    anchors = set(re.findall(r'<h\d id="([^"]+)"', page))
    paths = command_paths(main)
    assert len(paths) > 50, len(paths)
    missing = [" ".join(p) for p in paths if "-".join(("deviceq", *p)) not in anchors]
    assert not missing, f"not in the CLI reference: {missing}"
    # options come from the commands themselves: one only `host run` has
    text = html.unescape(page)
    assert "--infra-exit-code" in text
    # a help text's example lines stay lines of code, not one run-together paragraph
    blocks = [html.unescape(b) for b in re.findall(r"<pre[^>]*>(.*?)</pre>", page, re.S)]
    assert any("deviceq host run --config lab-1.yaml\n" in re.sub(r"<[^>]+>", "", b)
               for b in blocks), "the host run examples are not a code block"  # fmt: skip
    assert "Sentinel.UNSET" not in text


def test_the_http_api_reference_has_every_operation(site: Path) -> None:
    spec = json.loads((site / "reference" / "openapi.json").read_text())
    page = html.unescape((site / "reference" / "http-api" / "index.html").read_text())
    ops = [(m.upper(), p) for p, o in spec["paths"].items() for m in o]
    assert len(ops) > 20 and ("POST", "/api/v1/tasks") in ops
    missing = [f"{m} {p}" for m, p in ops if f"{m} {p}" not in page]
    assert not missing, f"not in the HTTP API reference: {missing}"
    summary = spec["paths"]["/api/v1/tasks"]["post"]["summary"]
    assert summary in page


def test_the_home_page_is_built(site: Path) -> None:
    home = (site / "index.html").read_text()
    assert "deviceq" in home and "getting-started/" in home


def test_the_readme_is_short_and_links_into_the_site() -> None:
    text = README.read_text()
    assert text.count("\n") <= MAX_README_LINES
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", text))
    assert {"docs/getting-started.md", "docs/reference/cli.md"} <= linked
    missing = [p for p in linked if not (ROOT / p).is_file()]
    assert not missing, missing
    assert re.search(r"^## Quick start$", text, re.M) and re.search(r"^## Security$", text, re.M)


def test_every_page_is_in_the_nav() -> None:
    import yaml

    nav = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s+([\w/-]+\.md)\s*$", nav, re.M))
    on_disk = {rel(p).removeprefix("docs/") for p in pages()}
    assert on_disk == listed, (on_disk - listed, listed - on_disk)
    assert yaml.safe_load(nav)["nav"][0] == {"Home": "index.md"}
