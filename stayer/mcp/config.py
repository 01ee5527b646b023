"""``[mcp.servers.NAME]`` in ``stayer.toml`` and ``task.toml``, and a run's ``mcp_servers``.

A server is either stdio (``command = [...]``, ``env``) or streamable HTTP (``url``,
``headers``). A stdio server runs in the run's sandbox unless ``trust = "host"``.
``call_timeout_s`` defaults to the run's command timeout (``bash``'s). A server name is
letters, digits, ``-`` and single ``_`` (its tools are ``NAME__tool``, so a name must not
hold ``__``). Any other key is an error naming the file and the key.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stayer.errors import ConfigError
from stayer.settings import describe

SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$")
SEPARATOR = "__"


class McpServer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    command: list[str] | None = Field(None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    trust: Literal["sandbox", "host"] = "sandbox"
    startup_timeout_s: float = Field(30.0, gt=0, le=600)
    call_timeout_s: float | None = Field(None, gt=0, le=86_400)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (stdio) or url (streamable HTTP)")
        if self.url is not None and (self.env or self.trust != "sandbox"):
            raise ValueError("env and trust are for stdio servers (command), not url")
        if self.command is not None and self.headers:
            raise ValueError("headers are for HTTP servers (url), not command")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must be http:// or https://")
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    @property
    def where(self) -> str:
        """Where it runs: ``sandbox``, ``host`` or ``remote`` (HTTP)."""
        return "remote" if self.url is not None else self.trust


class McpSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    servers: dict[str, McpServer] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names(self) -> McpSection:
        for name in self.servers:
            if not SERVER_NAME.match(name) or name.endswith("_"):
                raise ValueError(
                    f"server name {name!r}: use letters, digits, '-' and single '_' "
                    "(its tools are named NAME__tool)"
                )
        return self


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


def servers_record(servers: dict[str, McpServer]) -> dict[str, Any]:
    """JSON-ready, for a run's record (a resume connects to the same servers)."""
    return {name: s.model_dump(exclude_defaults=True) for name, s in servers.items()}


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
