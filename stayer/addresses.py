"""Where an outgoing URL may go: resolved once, refused unless public, connected pinned.

``resolve`` looks ``url``'s host up once and gives every address it resolves to, or why
the URL is refused (not http(s), credentials in it, a host that does not resolve, or an
address that is not public while ``allow_private`` is off). ``pinned`` rewrites a URL to
one of those addresses, with the Host header and the TLS name (httpcore's
``sni_hostname``) of the original: a caller that connects to what ``resolve`` checked never
looks the name up a second time, so a DNS answer that changes between the check and the
connection (rebinding) cannot reach an address that was not checked. Used by webhooks
(``stayer.runtime.webhooks``) and streamable-HTTP MCP servers (``stayer.mcp.client``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_public(address: Address) -> bool:
    return address.is_global


def resolve(
    url: str,
    *,
    allow_private: bool,
    allowed: Callable[[Address], bool] | None = None,
    refused: str = "refused",
) -> tuple[list[str], str | None]:
    """The addresses ``url``'s host resolves to, all of them ``allowed`` (default:
    ``is_public``); or why not (``refused`` ends the sentence for an address that is not)."""
    allowed = allowed or is_public
    if any(c <= " " or c == "\x7f" for c in url):  # urlsplit drops CR, LF and tabs unsaid
        return [], "must not contain spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return [], f"not a URL ({e})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [], "must be an http:// or https:// URL with a host"
    if parts.username or parts.password:
        return [], "must not carry credentials"
    try:
        infos = socket.getaddrinfo(
            parts.hostname,
            port or (443 if parts.scheme == "https" else 80),
            type=socket.SOCK_STREAM,
        )
    except OSError:
        return [], f"host {parts.hostname!r} does not resolve"
    addresses: list[str] = []
    for info in infos:
        text = str(info[4][0]).split("%", 1)[0]
        address = ipaddress.ip_address(text)
        if not allow_private and not allowed(address):
            return [], f"resolves to a non-public address ({address}); {refused}"
        if text not in addresses:
            addresses.append(text)
    return addresses, None


def pinned(url: str, address: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """``url`` with its host replaced by ``address``, the Host header it had, and the TLS
    name to ask for and check (httpcore's ``sni_hostname``)."""
    parts = urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    original = parts.netloc.rpartition("@")[2]
    extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    return urlunsplit(parts._replace(netloc=netloc)), {"Host": original}, extensions
