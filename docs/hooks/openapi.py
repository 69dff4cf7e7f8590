"""MkDocs hook: the HTTP API reference, made at build time from the service's own OpenAPI
document.

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
                    out.append(f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} "
                               f"| {p.get('schema', {}).get('type', '')} |")  # fmt: skip
                out.append("")
            if "requestBody" in op:
                kinds = ", ".join(op["requestBody"].get("content", {})) or "any"
                out.append(f"**Body:** {kinds}.\n")
            codes = ", ".join(f"`{c}` {r['description']}" for c, r in op["responses"].items())
            out.append(f"**Answers:** {codes}.\n")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render(openapi_document()))


def on_files(files: Any, config: Any) -> Any:
    """The document itself, as the site's ``reference/openapi.json``."""
    from mkdocs.structure.files import File

    text = json.dumps(openapi_document(), indent=2) + "\n"
    files.append(File.generated(config, "reference/openapi.json", content=text))
    return files
