"""One agent's view of the run's MCP tools (every agent of a run has its own: the single
agent, each thread of a team, each sub-agent; they share the servers' connections).

``offered`` gives the tools for the agent's prompt: every schema (eager) or one
``tool_search`` (lazy). The view is the agent's ``tool_updates``: a server's new list
(``notifications/tools/list_changed``) is taken at the agent's next compaction, or at once
when a call ``needs`` it, never otherwise (docs/mcp.md, "The prompt prefix").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from stayer.context.compactor import ToolsTaken
from stayer.mcp.config import SEPARATOR
from stayer.mcp.lazy import ToolSearch, matches
from stayer.mcp.tools import McpTool, McpTools


class McpView:
    """The MCP tools one agent's prompt holds (``offered``), and the agent's
    ``tool_updates``: a server's new list is taken at the agent's next compaction, or at
    once when a call ``needs`` it. Eager: a call of a changed server's tool. Lazy: a
    ``tool_search`` that searches for, or calls, a tool that is new or changed; searches
    and calls are answered from the servers' newest lists whatever the prompt's
    catalogue says (a removed tool called is a tool error), so a change the agent does
    not need leaves its prefix as it is."""

    def __init__(self, mcp: McpTools, mode: str, wrap: Callable[[list[Any]], list[Any]]) -> None:
        self.mcp, self.mode, self.wrap = mcp, mode, wrap
        self.known = {t.spec.name: t for t in mcp.tools}  # what the agent's prompt holds
        self.seen = dict(mcp.versions)

    def offered(self) -> list[Any]:
        """The tools for the agent's prompt, not wrapped: every MCP tool, or one search."""
        if not self.known:
            return []
        if self.mode == "eager":
            return list(self.known.values())
        return [ToolSearch(list(self.known.values()), self.latest)]

    def latest(self) -> dict[str, McpTool]:
        return {t.spec.name: t for t in self.mcp.tools}

    def _changed(self) -> set[str]:
        v = self.mcp.versions
        return {
            c.name for c in self.mcp.connections if c.list_changed or v[c.name] != self.seen[c.name]
        }

    @property
    def pending(self) -> bool:
        return bool(self._changed())

    def _differs(self, name: str, latest: Mapping[str, McpTool]) -> bool:
        return name in latest and (
            name not in self.known or self.known[name].spec != latest[name].spec
        )

    async def needs(self, name: str, arguments: str) -> bool:
        changed = self._changed()
        if not changed:
            return False
        if self.mode == "eager":
            return SEPARATOR in name and name.split(SEPARATOR, 1)[0] in changed
        if name != "tool_search":
            return False
        try:
            args = json.loads(arguments)
        except ValueError:
            return False
        if not isinstance(args, dict):
            return False
        await self.mcp.refresh()
        latest = self.latest()
        if "call" in args:
            return self._differs(str(args["call"]), latest)
        return any(self._differs(t.spec.name, latest) for t in matches(latest.values(), args))

    async def take(self, when: str) -> tuple[list[Any], set[str], ToolsTaken]:
        """The changed servers' new tools (wrapped), the names they replace, and what
        changed (names of tools added, removed and changed)."""
        await self.mcp.refresh()
        changed = self._changed()
        old = {n: t for n, t in self.known.items() if t.source in changed}
        new = {t.spec.name: t for t in self.mcp.tools if t.source in changed}
        taken = ToolsTaken(
            when=when,
            added=sorted(set(new) - set(old)),
            removed=sorted(set(old) - set(new)),
            changed=sorted(n for n in set(old) & set(new) if old[n].spec != new[n].spec),
        )
        self.known = {n: t for n, t in self.known.items() if n not in old} | new
        self.known = dict(sorted(self.known.items()))
        self.seen.update({s: self.mcp.versions[s] for s in changed})
        if self.mode == "eager":
            return self.wrap(list(new.values())), set(old), taken
        return self.wrap(self.offered()), {"tool_search"}, taken
