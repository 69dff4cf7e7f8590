"""MkDocs hook: the HTTP API reference, made at build time from the service's own OpenAPI
document; and the command line reference's examples kept as code.

The command line page is mkdocs-click's rendering of the click commands. Click keeps a help
text's ``\\b`` paragraphs (``Example:`` and its indented command lines) as written, but
mkdocs-click drops the ``\\b`` and hands the lines to Markdown, which would run them together
into one paragraph: on that page, a line ending in a colon followed by indented lines becomes
that line and a code block of them (and click's "no default" marker reads "none").

The app is built as ``deviceq api`` builds it (on a Redis client that never connects: the
OpenAPI route reads no key) and ``GET /api/v1/openapi.json`` is asked of it in process,
through ASGI. A page holding the line ``<!-- openapi -->`` gets that marker replaced by one
section per operation (summary, description, token, path parameters, body); the document
itself is added to the site as ``reference/openapi.json``. Nothing of the spec is
copied by hand, so the page cannot drift from the routes."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

MARKER = "<!-- openapi -->"
PATH = "/api/v1/openapi.json"
_spec: dict[str, Any] | None = None


def openapi_document() -> dict[str, Any]:
    """The document the app serves at ``/api/v1/openapi.json``."""
    global _spec
    if _spec is not None:
        return _spec
    import redis

    from deviceq.api.app import create_app
    from deviceq.api.context import ApiContext

    app = create_app(ApiContext(redis.Redis(), "docs"))  # the client connects on first use
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "headers": [(b"host", b"docs")],
        "client": ("127.0.0.1", 0),
        "server": ("docs", 80),
        "root_path": "",
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = sent[0]["status"]
    if status != 200:
        raise RuntimeError(f"GET {PATH} answered {status}")
    _spec = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    return _spec


def _md(text: str) -> str:
    """A docstring's reStructuredText literals (``x``) as Markdown code."""
    return re.sub(r"``(.+?)``", r"`\1`", text, flags=re.S)


def _anchor(method: str, path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")


def render(spec: dict[str, Any]) -> str:
    """The operations of ``spec`` as Markdown: the producer protocol, then the host protocol."""
    groups: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
        "Producer protocol": [],
        "Host protocol": [],
    }
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            host = path.startswith("/api/v1/hosts/")
            groups["Host protocol" if host else "Producer protocol"].append((method, path, op))
    schemes = spec.get("components", {}).get("securitySchemes", {})
    out = [f"OpenAPI {spec['openapi']}, deviceq {spec['info']['version']}: "
           f"{sum(len(v) for v in groups.values())} operations.\n"]  # fmt: skip
    for title, ops in groups.items():
        out.append(f"## {title}\n")
        out.append("| operation | summary |\n|---|---|")
        for method, path, op in ops:
            link = f"[`{method.upper()} {path}`](#{_anchor(method, path)})"
            out.append(f"| {link} | {_md(op['summary']).replace('|', '&#124;')} |")
        out.append("")
        for method, path, op in ops:
            out.append(f"### `{method.upper()} {path}` {{ #{_anchor(method, path)} }}\n")
            out.append(_md(op["summary"]) + "\n")
            if op.get("description"):
                out.append(_md(op["description"]) + "\n")
            security = op.get("security") or []
            if not security:
                out.append("**Token:** none.\n")
            for requirement in security:
                for name in requirement:
                    what = schemes.get(name, {}).get("description", name)
                    out.append(f"**Token:** `Authorization: Bearer` {what} (`{name}`).\n")
            params = op.get("parameters") or []
            if params:
                out.append("| parameter | in | required | type |\n|---|---|---|---|")
                for p in params:
                    required = "yes" if p.get("required") else "no"
                    kind = p.get("schema", {}).get("type", "")
                    out.append(f"| `{p['name']}` | {p['in']} | {required} | {kind} |")
                out.append("")
            if "requestBody" in op:
                kinds = ", ".join(op["requestBody"].get("content", {})) or "any"
                out.append(f"**Body:** {kinds}.\n")
            codes = ", ".join(f"`{c}` {r['description']}" for c, r in op["responses"].items())
            out.append(f"**Answers:** {codes}.\n")
    return "\n".join(out)


_cli_page = False  # the page being rendered is the command line reference


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    global _cli_page
    _cli_page = "::: mkdocs-click" in markdown
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render(openapi_document()))


def fence_indented_blocks(lines: list[str]) -> list[str]:
    """Each run of lines indented by two or more spaces that follows a line ending in a colon,
    as a fenced code block (dedented by its first line's indent)."""
    out: list[str] = []
    i, fenced = 0, False
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        out.append(line)
        i += 1
        if fenced or not line.rstrip().endswith(":") or line.startswith(" "):
            continue
        block = []
        while i < len(lines) and lines[i].startswith("  ") and lines[i].strip():
            block.append(lines[i])
            i += 1
        if block:
            indent = len(block[0]) - len(block[0].lstrip())
            body = [b[indent:] if b[:indent].isspace() else b.lstrip() for b in block]
            out += ["", "```text", *body, "```", ""]
    return out


def on_config(config: Any) -> Any:
    from markdown import Extension
    from markdown.preprocessors import Preprocessor

    class HelpExamples(Preprocessor):
        def run(self, lines: list[str]) -> list[str]:
            if not _cli_page:
                return lines
            # click 8.3's marker of "no default" as mkdocs-click prints it
            lines = [ln.replace("`Sentinel.UNSET`", "none") for ln in lines]
            return fence_indented_blocks(lines)

    class HelpExamplesExtension(Extension):
        def extendMarkdown(self, md: Any) -> None:  # noqa: N802 (Markdown's name)
            # after mkdocs-click (141) has written the commands, before fenced code (25-30)
            md.preprocessors.register(HelpExamples(md), "deviceq_help_examples", 100)

    config.markdown_extensions.append(HelpExamplesExtension())
    return config


def on_files(files: Any, config: Any) -> Any:
    """The document itself, as the site's ``reference/openapi.json``."""
    from mkdocs.structure.files import File

    text = json.dumps(openapi_document(), indent=2) + "\n"
    files.append(File.generated(config, "reference/openapi.json", content=text))
    return files
