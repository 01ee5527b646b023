"""Lazy MCP tools (``--mcp-tools lazy``): the prompt's prefix carries one ``tool_search``
tool, whose description lists every MCP tool's name with a one-line description, instead
of every schema. ``tool_search {"query": …}`` answers with the full schemas of the best
matches (a tool result: appended at the tail, the cached prefix intact);
``tool_search {"call": NAME, "arguments": {…}}`` calls one, checked against its schema;
such a call is journaled with that tool's effects (``spec_for``), a search as read-only.
``auto`` (the default) picks by :func:`choose`: the eager schemas' cost over the run's
expected steps against the catalogue's and the searches' (docs/mcp.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from stayer.mcp.tools import McpTool
from stayer.messages import ToolSpec
from stayer.pricing import Rates
from stayer.tokens import TokenCounter, canonical_tools
from stayer.tools.base import ToolContext, ToolResult

MODES = ("eager", "lazy", "auto")
MATCHES = 5  # schemas a search loads
# What ``auto`` assumes of a lazy run: searches made, and tools each loads.
SEARCHES, LOADED_PER_SEARCH, SEARCH_OUTPUT_TOKENS = 2, 3, 60


def one_line(text: str, limit: int = 24) -> str:
    """``text``'s first sentence on one line, at most ``limit`` characters: a longer one is
    cut at the end of a word, marked "…" (half a word costs tokens and says nothing)."""
    line = " ".join(text.split())
    cut = line.split(". ")[0]
    if len(cut) <= limit:
        return cut
    at = cut.rfind(" ", 0, limit)
    return (cut[:at].rstrip(",;:") if at > 0 else cut[: limit - 1]) + "…"


class ToolSearch:
    """``tools``: the catalogue its description lists (part of the prompt's prefix);
    ``live``: the servers' newest tools, which searches and calls are answered from
    (the catalogue's where not given)."""

    def __init__(
        self, tools: Sequence[McpTool], live: Callable[[], Mapping[str, McpTool]] | None = None
    ) -> None:
        self.listed = {t.spec.name: t for t in tools}
        self.live = live or (lambda: self.listed)
        catalogue = "\n".join(
            f"[{server}] "
            + "; ".join(
                f"{t.tool.name}: {one_line(t.spec.description)}"
                for t in tools
                if t.source == server
            )
            for server in dict.fromkeys(t.source for t in tools)
        )
        self.spec = ToolSpec(
            name="tool_search",
            description=(
                'Tools of MCP servers, loaded on demand. First search: {"query": words} '
                f"returns the full schemas of up to {MATCHES} matching tools. Then call one: "
                '{"call": NAME, "arguments": {...}} with arguments that fit its schema. '
                "Available, by [server] (a tool's NAME is SERVER__tool):\n" + catalogue
            ),
            parameters={
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Words to match."},
                    "call": {"type": "string", "description": "A tool's name, to call it."},
                    "arguments": {"type": "object", "description": "The call's arguments."},
                },
                "additionalProperties": False,
            },
            effects="read_only",
        )

    @property
    def by_name(self) -> Mapping[str, McpTool]:
        return self.live()

    def spec_for(self, args: dict[str, Any]) -> ToolSpec:
        """The spec of what a call with ``args`` runs: the MCP tool it calls, or the search."""
        tool = self.by_name.get(args["call"]) if "call" in args else None
        return tool.spec if tool is not None else self.spec

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        from stayer.tools import check_args

        if "call" in args:
            tool = self.by_name.get(args["call"])
            if tool is None and args["call"] in self.listed:
                return ToolResult(
                    f"tool_search: {args['call']!r} was removed by its server", is_error=True
                )
            if tool is None:
                return ToolResult(
                    f"tool_search: no tool {args['call']!r}; search for one first", is_error=True
                )
            arguments = args.get("arguments") or {}
            problem = check_args(tool.spec.parameters, arguments)
            if problem is not None:
                return ToolResult(f"{tool.spec.name}: {problem}", is_error=True)
            return await tool(arguments, ctx)
        query = str(args.get("query") or "").lower().split()
        if not query:
            return ToolResult("tool_search: give a query or a call", is_error=True)
        found = matches(self.by_name.values(), args)
        if not found:
            return ToolResult(f"tool_search: nothing matches {' '.join(query)!r}")
        return ToolResult(canonical_tools(t.spec for t in found))


def matches(tools: Iterable[McpTool], args: Mapping[str, Any]) -> list[McpTool]:
    """The tools a search with ``args`` answers with: the best ``MATCHES``, best first."""
    query = str(args.get("query") or "").lower().split()
    scored = [(_score(t, query), t) for t in tools]
    found = sorted((p for p in scored if p[0] > 0), key=lambda p: (-p[0], p[1].spec.name))
    return [t for _, t in found[:MATCHES]]


def _score(tool: McpTool, words: list[str]) -> int:
    text = f"{tool.spec.name} {tool.spec.description}".lower()
    return sum(text.count(w) for w in words) + 3 * sum(w in tool.spec.name.lower() for w in words)


def costs(
    tools: Sequence[McpTool], counter: TokenCounter, rates: Rates, steps: int, context: int
) -> dict[str, Decimal]:
    """The expected USD cost of the MCP part of a run of ``steps`` steps, eager and lazy:
    eager pays every schema's tokens on every step (written once, then read from cache);
    lazy pays the catalogue likewise, plus ``SEARCHES`` search calls, each an extra step
    re-reading a prompt of ``context`` tokens, writing a few output tokens and loading
    ``LOADED_PER_SEARCH`` schemas that stay in the context for the rest of the run."""
    m = Decimal(1_000_000)
    schemas = counter.count(canonical_tools(t.spec for t in tools))
    catalogue = counter.count(canonical_tools([ToolSearch(tools).spec]))
    per_tool = Decimal(schemas) / max(len(tools), 1)

    def held(tokens: Decimal, n: int) -> Decimal:  # written once, read on the n - 1 after
        return tokens * (rates.cache_write_5m + (n - 1) * rates.cache_read) / m

    eager = held(Decimal(schemas), steps)
    search = (Decimal(context) * rates.cache_read + SEARCH_OUTPUT_TOKENS * rates.output) / m
    loaded = held(per_tool * LOADED_PER_SEARCH, max(steps // 2, 1))
    lazy = held(Decimal(catalogue), steps) + SEARCHES * (search + loaded)
    return {"eager": eager, "lazy": lazy}


def choose(mode: str, priced: dict[str, Decimal] | None) -> str:
    """``eager`` or ``lazy``: ``mode`` itself, or for ``auto`` the cheaper by ``costs``
    (eager where they cannot be priced)."""
    if mode != "auto":
        return mode
    if priced is None:
        return "eager"
    return "lazy" if priced["lazy"] < priced["eager"] else "eager"
