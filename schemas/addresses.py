"""A network address as events carry it: `host:port` and nothing else.

A `started` event names the endpoint where `adapterd logs` sends the fleet's logs token. Whatever
else an address could hold (a scheme, a user before `@`, a path, a query, a fragment, spaces,
control characters) would change where a URL built from it leads, so an address is a DNS name, an
IPv4 address or a bracketed IPv6 address, then a port from 1 to 65535, and nothing more.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, Field

# A DNS label (underscores too: container and host names carry them), dot-separated; or [IPv6].
_HOST_PORT = re.compile(
    r"((?:[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*"
    r"|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})"
)
HOST_PORT_PATTERN = rf"^{_HOST_PORT.pattern}$"
MAX_HOST_CHARS = 253


def split_host_port(address: str) -> tuple[str, int]:
    """(host, port) of a `host:port` address, an IPv6 host without its brackets; ValueError says
    what is wrong with anything else."""
    match = _HOST_PORT.fullmatch(address) if len(address) <= MAX_HOST_CHARS + 6 else None
    if match is None:
        raise ValueError(
            "expected host:port (a host name or IP address and a port, no scheme, user, "
            f"path or query), got {address!r}"
        )
    host, port = match.group(1), int(match.group(2))
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} of {address!r} is not between 1 and 65535")
    if host.startswith("["):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{address!r}: {host!r} is not an IPv6 address") from None
    return host, port


def _check(address: str) -> str:
    split_host_port(address)
    return address


HostPort = Annotated[str, Field(pattern=HOST_PORT_PATTERN, max_length=MAX_HOST_CHARS + 6), AfterValidator(_check)]
