"""``--otel-endpoint URL`` of the daemons (``host run``, ``scheduler run``, ``api``): their spans
go over OTLP/HTTP to URL (``deviceq.core.tracing``); without it, the standard
``OTEL_EXPORTER_OTLP_ENDPOINT``; without either, no tracing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..core.errors import ConfigError


def otel_option(service: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The option, for a command whose spans are service ``service``'s: it configures the
    process's tracing as it is parsed (the command itself never sees it)."""

    def configure(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if ctx.resilient_parsing:
            return
        from ..core import tracing

        try:
            tracing.setup(value, service)
        except ConfigError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return click.option(
        "--otel-endpoint",
        metavar="URL",
        expose_value=False,
        is_eager=False,
        callback=configure,
        help="Export OpenTelemetry traces (one per task) over OTLP/HTTP to URL (its "
        "/v1/traces); default: env OTEL_EXPORTER_OTLP_ENDPOINT, else none. Needs the otel "
        "extra (pip install 'deviceq[otel]').",
    )
