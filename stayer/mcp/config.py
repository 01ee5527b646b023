"""``[mcp.servers.NAME]`` in ``stayer.toml`` and ``task.toml``, and a run's ``mcp_servers``.

A server is either stdio (``command = [...]``, ``env``) or streamable HTTP (``url``,
``headers``). A stdio server runs in the run's sandbox unless ``trust = "host"``.
``call_timeout_s`` defaults to the run's command timeout (``bash``'s). A server name is
letters, digits, ``-`` and single ``_`` (its tools are ``NAME__tool``, so a name must not
hold ``__``). Any other key is an error naming the file and the key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from stayer.errors import ConfigError
from stayer.settings import McpSection, McpServer, describe

SEPARATOR = "__"

__all__ = ["SEPARATOR", "McpSection", "McpServer", "parse_servers", "run_servers"]


def parse_servers(data: Any, source: str) -> dict[str, McpServer]:
    """``data`` (the ``[mcp]`` table, or None) → servers by name; ConfigError naming
    ``source`` and the key when it is bad."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: [mcp] must be a table")
    try:
        return dict(_File.model_validate({"mcp": data}).mcp.servers)
    except ValidationError as e:
        err = e.errors()[0]
        if err["type"] == "extra_forbidden":
            key = ".".join(str(p) for p in err["loc"])
            allowed = McpServer.model_fields if len(err["loc"]) > 3 else ["servers"]
            raise ConfigError(
                f"{source}: unknown key {key!r}; allowed: {', '.join(allowed)}"
            ) from None
        raise ConfigError(describe(e, source)) from None


class _File(BaseModel):
    mcp: McpSection


def run_servers(
    task: dict[str, McpServer],
    task_source: str,
    config: dict[str, McpServer],
    config_source: str | None,
    inline: dict[str, Any] | None,
) -> dict[str, McpServer]:
    """A run's servers: ``task.toml``'s, ``stayer.toml``'s and the run's own
    (``mcp_servers``); a name given twice is an error naming both places."""
    servers: dict[str, McpServer] = {}
    where: dict[str, str] = {}
    sources = [(task_source, task), (config_source or "--config", config)]
    if inline:
        sources.append(("mcp_servers", parse_servers({"servers": inline}, "mcp_servers")))
    for source, named in sources:
        for name, server in named.items():
            if name in servers:
                raise ConfigError(
                    f"{source}: mcp server {name!r} is also named in {where[name]}; "
                    "name each server once"
                )
            servers[name], where[name] = server, source
    return servers


def check_api_servers(
    inline: dict[str, Any], url_problem: Callable[[str], str | None]
) -> dict[str, McpServer]:
    """A runtime run's ``mcp_servers``: what ``stayer.toml`` allows, less a process on the
    server's host (``trust = "host"``) and a URL to a non-public address (``url_problem``:
    the webhooks' rule). ConfigError naming the field."""
    servers = parse_servers({"servers": inline}, "mcp_servers")
    for name, server in servers.items():
        if server.trust == "host":
            raise ConfigError(
                f"mcp_servers.{name}.trust: 'host' is not available through the API; a "
                "stdio server runs in the run's sandbox"
            )
        if server.url is not None and (problem := url_problem(server.url)) is not None:
            problem = problem.replace("the server does not send webhooks there", "refused")
            raise ConfigError(f"mcp_servers.{name}.url: {problem}")
    return servers
