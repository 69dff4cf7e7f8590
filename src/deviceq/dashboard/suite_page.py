"""The dashboard's suite pages: ``/suites`` (the newest suites, with their counts) and
``/suites/ID`` (one suite: status and ETA, progress, failed tests first with the devices they
failed on, flaky ones, every shard with its task and device), read as ``deviceq suite show``
reads them (`deviceq.suites.store`)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import InvalidInput
from ..core.validation import validate_id
from ..producer.client import Client
from .site import Site

LISTED = 100
"""Suites the list page shows (the newest)."""
SHOWN = 200
"""Failed (and flaky) tests a suite page shows at most; ``suite show --json`` has them all."""


async def suites_page(dash: Site, request: Request) -> Response:
    """``GET /suites``: the newest suites."""
    if request.query_params:
        raise InvalidInput("the suites page takes no query parameters")
    client = Client(dash.admin.redis, dash.admin.pool)
    rows = await dash.call(client.suites, LISTED)
    return dash.render(request, "suites.html", rows=rows)


async def suite_page(dash: Site, request: Request) -> Response:
    """``GET /suites/ID``: one suite."""
    if request.query_params:
        raise InvalidInput("the suite page takes no query parameters")
    suite_id = validate_id(request.path_params["suite_id"], "suite id")
    client = Client(dash.admin.redis, dash.admin.pool)
    s = await dash.call(client.suite, suite_id)
    c = s.counts
    finished = c["passed"] + c["flaky"] + c["failed"] + c["skipped"]
    return dash.render(
        request,
        "suite.html",
        s=s,
        finished=finished,
        percent=round(100 * finished / s.tests) if s.tests else 0,
        failed=s.failed[:SHOWN],
        flaky=s.flaky[:SHOWN],
        more=max(0, len(s.failed) - SHOWN) + max(0, len(s.flaky) - SHOWN),
    )
