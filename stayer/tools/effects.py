"""What a tool call does to the world outside the workspace, and the call's identity.

* ``ToolSpec.effects`` (``stayer.messages.Effects``) declares it per tool; :func:`effects_of`
  resolves it for one call (``sandboxed``: ``restorable`` in a sandbox without the network,
  ``destructive`` with it); :func:`from_mcp_annotations` maps an MCP tool's hints;
  :func:`call_spec` is the spec one call runs under (``tool_search`` running an MCP tool).
* :func:`side_effecting`: the calls the journal records before and after sending, so that a
  resumed run never repeats one silently (``stayer.journal.effects``).
* :class:`CallRef` (``ToolContext.call``): which call of which run and step a tool is
  executing, and its idempotency key, derived from those alone: the same on every resume.
  A tool that can pass the key on (an MCP server, under ``_meta[META_KEY]``) does so.

Rationale and the resume rules: docs/effects.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from stayer.messages import Effects, ToolSpec

#: The ``_meta`` field an MCP ``tools/call`` request carries the idempotency key in.
META_KEY = "io.stayer/idempotency-key"

#: Effects whose calls must not happen twice unless the key makes the repeat harmless.
SIDE_EFFECTING: frozenset[Effects] = frozenset({"idempotent", "additive", "destructive"})


@dataclass(frozen=True, slots=True)
class CallRef:
    """One tool call of a run: the run, the agent (``main``, a sub-agent's or a team
    thread's path), the step, the call's id in the model's reply and its place there."""

    run_id: str
    agent: str
    step: int
    call_id: str
    index: int = 0

    @property
    def idempotency_key(self) -> str:
        """``stayer-`` and 40 hex digits: a hash of the fields, stable across resumes and
        workers, unique per call of a run (an id a model repeats is told apart by index)."""
        raw = "\0".join((self.run_id, self.agent, str(self.step), self.call_id, str(self.index)))
        return "stayer-" + hashlib.sha256(raw.encode()).hexdigest()[:40]


def from_mcp_annotations(
    read_only: bool | None = None,
    destructive: bool | None = None,
    idempotent: bool | None = None,
) -> Effects:
    """An MCP tool's ``readOnlyHint``, ``destructiveHint`` and ``idempotentHint`` (None where
    the server left one out) as effects, with the MCP spec's defaults: a tool that says
    nothing may destroy and is not idempotent."""
    if read_only:
        return "read_only"
    if idempotent:
        return "idempotent"
    return "additive" if destructive is False else "destructive"


def call_spec(tool: Any, args: dict[str, Any]) -> ToolSpec:
    """The spec of what calling ``tool`` with ``args`` runs: a tool that runs another one
    says which by ``spec_for(args)`` (looked for through wrappers' ``inner``); any other
    tool runs under its own spec."""
    inner = tool
    while inner is not None:
        spec_for = getattr(inner, "spec_for", None)
        if spec_for is not None:
            return spec_for(args)  # type: ignore[no-any-return]
        inner = getattr(inner, "inner", None)
    return tool.spec  # type: ignore[no-any-return]


def effects_of(spec: ToolSpec, sandbox: Any) -> Effects:
    """``spec``'s effects for a call in ``sandbox``: a ``sandboxed`` tool (``bash``) is
    restorable unless the sandbox lets commands reach the network."""
    if spec.effects == "sandboxed":
        return "destructive" if getattr(sandbox, "allow_net", False) else "restorable"
    return spec.effects


def side_effecting(effects: Effects) -> bool:
    return effects in SIDE_EFFECTING
