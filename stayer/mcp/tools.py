"""MCP servers' tools as the agent's tools: ``NAME__tool`` next to stayer's own.

:class:`McpTools` connects to every server of a run (concurrently) and gives one
:class:`McpTool` per tool listed, in a canonical form (keys sorted, so that the pinned
prefix is byte-stable whatever order a server sends). A tool whose name is not
``[A-Za-z0-9_-]``, whose full name is over 64 characters, or that collides with stayer's
own tools or another tool is refused: the run does not start (:class:`McpRefused`). A call
is a tool result under the same output budget and timeout as ``bash`` (``call_timeout_s``
overrides the latter per server); a server that died, hung or sent garbage is an error
result, never an exception; calls of one server go one at a time (its agents share it).
The MCP annotations are on each tool as ``read_only_hint``, ``destructive_hint``,
``idempotent_hint`` and ``open_world_hint`` (None: not said).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from stayer.errors import ConfigError
from stayer.mcp.client import Connection, McpCallError, ServerTool
from stayer.mcp.config import SEPARATOR, McpServer
from stayer.messages import ToolSpec
from stayer.sandbox.base import Sandbox
from stayer.tokens import TokenCounter, truncate_middle
from stayer.tools.base import ToolContext, ToolResult
from stayer.tools.effects import from_mcp_annotations

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_NAME = 64  # what Anthropic's and OpenAI's APIs accept


#: stayer's own tools beside the default ones (sub-agents, teams, lazy MCP tools).
OTHER_OWN_TOOLS = ("subagent", "send_message", "wait_for_message", "handoff", "tool_search")


def reserved_names(counter: TokenCounter) -> set[str]:
    """Every name a tool of stayer's own has or may have in a run."""
    from stayer.tools import default_tools

    return {t.spec.name for t in default_tools(counter)} | set(OTHER_OWN_TOOLS)


class McpRefused(ConfigError):
    """A server whose tools cannot be offered: a name that collides or is malformed."""


def canonical(value: Any) -> Any:
    """``value`` with every object's keys in sorted order (JSON-ready)."""
    if isinstance(value, Mapping):
        return {str(k): canonical(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


class McpTool:
    def __init__(
        self,
        connection: Connection,
        tool: ServerTool,
        counter: TokenCounter,
        lock: asyncio.Lock | None = None,
    ) -> None:
        self.connection, self.tool, self.counter = connection, tool, counter
        self.lock = lock or asyncio.Lock()  # one call at a time per server (McpTools)
        self.source = connection.name
        schema = dict(tool.input_schema)
        schema.setdefault("type", "object")
        self.spec = ToolSpec(
            name=f"{connection.name}{SEPARATOR}{tool.name}",
            description=tool.description.strip() or f"{tool.name} (MCP server {connection.name})",
            parameters=canonical(schema),
            effects=from_mcp_annotations(
                tool.read_only_hint, tool.destructive_hint, tool.idempotent_hint
            ),
        )
        self.read_only_hint = tool.read_only_hint
        self.destructive_hint = tool.destructive_hint
        self.idempotent_hint = tool.idempotent_hint
        self.open_world_hint = tool.open_world_hint

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        timeout = self.connection.server.call_timeout_s or ctx.command_timeout
        key = ctx.call.idempotency_key if ctx.call is not None else None
        try:
            async with self.lock:
                result = await self.connection.call(self.tool.name, args, timeout, key)
        except McpCallError as e:
            return ToolResult(str(e), is_error=True)
        text = render(result)
        if not text.strip():
            text = "(no output)"
        if self.counter.count(text) > ctx.output_token_budget:
            text, _ = truncate_middle(text, ctx.output_token_budget, self.counter)
        return ToolResult(text, is_error=bool(getattr(result, "is_error", False)))


def render(result: Any) -> str:
    """A ``CallToolResult`` as text: text parts as they are, other parts named."""
    parts: list[str] = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource":
            res = item.resource
            text = getattr(res, "text", None)
            parts.append(text if text is not None else f"[resource {res.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {getattr(item, 'uri', '')}]")
        else:
            mime = getattr(item, "mime_type", "") or ""
            parts.append(f"[{kind} content{' ' + mime if mime else ''} not shown]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, sort_keys=True))
    return "\n".join(parts)


class McpTools:
    """``async with McpTools(servers, sandbox, counter, reserved) as mcp: mcp.tools``.

    One connection per server for the whole run, shared by every agent of it (a team's
    threads, sub-agents): each agent sees the tools through its own view
    (:class:`stayer.mcp.views.McpView`)."""

    def __init__(
        self,
        servers: Mapping[str, McpServer],
        sandbox: Sandbox | None,
        counter: TokenCounter,
        reserved: Iterable[str] = (),
        public_only: Iterable[str] = (),
    ) -> None:
        """``public_only``: the servers whose URL must resolve to public addresses when
        they connect (a runtime run's own ``mcp_servers``, unless private ones are allowed)."""
        public = set(public_only)
        self.connections = [
            Connection(n, s, sandbox, allow_private=n not in public)
            for n, s in sorted(servers.items())
        ]
        self.counter = counter
        self.reserved = set(reserved)
        self.tools: list[McpTool] = []
        # Per server: calls one at a time (agents share the connection), and how many
        # new lists were taken (each view compares with what it has).
        self.locks = {c.name: asyncio.Lock() for c in self.connections}
        self.versions = {c.name: 0 for c in self.connections}
        self._refreshing = asyncio.Lock()

    async def __aenter__(self) -> McpTools:
        try:
            results = await asyncio.gather(
                *(c.start() for c in self.connections), return_exceptions=True
            )
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            self.tools = refuse_collisions(
                [self._tool(c, t) for c in self.connections for t in c.tools], self.reserved
            )
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        with contextlib.suppress(BaseException):
            await asyncio.gather(*(c.close() for c in self.connections))

    def _tool(self, c: Connection, t: ServerTool) -> McpTool:
        return McpTool(c, t, self.counter, self.locks[c.name])

    # --- tool lists that change mid-run ---------------------------------------------------

    async def refresh(self) -> None:
        """Read the changed servers' new lists into ``tools`` (each such server's version
        moves on). A server whose list cannot be read, or whose new list is refused, keeps
        its old tools."""
        async with self._refreshing:
            for c in self.connections:
                if not c.list_changed:
                    continue
                others = {t.spec.name for t in self.tools if t.source != c.name}
                try:
                    async with self.locks[c.name]:
                        listed = await c.relist()
                    new = refuse_collisions(
                        [self._tool(c, t) for t in listed], self.reserved | others
                    )
                except (McpCallError, McpRefused):
                    c.list_changed = False
                    continue
                c.tools = listed
                self.versions[c.name] += 1
                self.tools = sorted(
                    [t for t in self.tools if t.source != c.name] + new, key=lambda t: t.spec.name
                )


def refuse_collisions(tools: list[McpTool], reserved: set[str]) -> list[McpTool]:
    """``tools`` sorted by name; McpRefused for a malformed name or a collision."""
    seen: dict[str, McpTool] = {}
    for t in tools:
        name, server = t.spec.name, t.source
        if not TOOL_NAME.match(t.tool.name):
            raise McpRefused(
                f"mcp server {server}: tool {t.tool.name[:80]!r}: a tool name must be "
                "letters, digits, '_' and '-'"
            )
        if len(name) > MAX_NAME:
            raise McpRefused(f"mcp server {server}: tool name {name!r} is over {MAX_NAME} chars")
        if name in reserved:
            raise McpRefused(f"mcp server {server}: tool {name!r} collides with stayer's own")
        if name in seen:
            raise McpRefused(f"mcp server {server}: tool {name!r} is listed twice")
        seen[name] = t
    return [seen[n] for n in sorted(seen)]
