"""``--trusted-proxy`` of ``deviceq api`` and ``deviceq dashboard``: the reverse proxies whose
``X-Forwarded-For`` / ``X-Forwarded-Proto`` headers are believed. Without one, no forwarding
header is trusted (uvicorn's own default trusts them from loopback): a client's address is
its connection's, so a client cannot choose the address its failed logins count against."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import click

TRUSTED_PROXY_HELP = (
    "A reverse proxy (an address or a CIDR network) whose X-Forwarded-For and "
    "X-Forwarded-Proto headers are believed: the client address (which the login and "
    "authentication rate limits count by) is then the one it forwards. Repeatable. "
    "Default: none (every client is its connection's address)."
)


def _networks(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for value in values:
        try:
            net = ipaddress.ip_network(value.strip(), strict=False)
        except ValueError:
            raise click.BadParameter(
                f"{value[:60]!r} is not an IP address or CIDR network (e.g. 10.0.0.5 or "
                "10.0.0.0/24)"
            ) from None
        out.append(str(net.network_address) if net.num_addresses == 1 else str(net))
    return out


def trusted_proxy_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--trusted-proxy ADDR`` option (a list of normalized addresses and networks)."""
    return click.option(
        "--trusted-proxy",
        "trusted_proxies",
        multiple=True,
        metavar="ADDR",
        callback=_networks,
        help=TRUSTED_PROXY_HELP,
    )(fn)


def proxy_settings(trusted: list[str]) -> dict[str, Any]:
    """uvicorn's keyword arguments for ``trusted``: forwarding headers read only from them."""
    if not trusted:
        return {"proxy_headers": False, "forwarded_allow_ips": ""}
    return {"proxy_headers": True, "forwarded_allow_ips": list(trusted)}
