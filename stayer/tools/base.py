"""The Tool protocol and what a tool call returns."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from stayer.messages import ToolSpec
from stayer.sandbox.base import Sandbox
from stayer.tools.effects import CallRef


@dataclass(frozen=True, slots=True)
class ToolResult:
    output: str
    is_error: bool = False
    submitted: bool = False  # the agent called ``submit``: the loop ends after this step
    # Retention hint for the context policy (``context.retention``): "observation" is
    # evictable tool output; "note" and "result" are kept verbatim through compactions.
    kind: str = "observation"
    # "unknown": a side-effecting call whose result was lost at a crash, not sent again
    # (``stayer.journal.effects``); None otherwise.
    outcome: str | None = None

    def raw(self) -> bytes:
        """The text as journals store it: UTF-8, a lone surrogate (a tool's JSON may decode
        to one) kept as is; ``text`` reads it back."""
        return self.output.encode("utf-8", "surrogatepass")

    @staticmethod
    def text(raw: bytes) -> str:
        return raw.decode("utf-8", "surrogatepass")

    def fields(self) -> dict[str, Any]:
        """Everything the result says besides its text (is_error, submitted, kind, ...): what
        a journal keeps beside the output, so that the result read back is equal to it.
        A field that is None is left out (as records written before it existed have it)."""
        return {k: v for k in _RESULT_FIELDS if (v := getattr(self, k)) is not None}

    @classmethod
    def of(cls, output: str, kept: Mapping[str, Any]) -> ToolResult:
        """The result of ``output`` and the ``fields()`` kept (those ``kept`` has)."""
        return cls(output, **{k: kept[k] for k in _RESULT_FIELDS if k in kept})


_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(ToolResult) if f.name != "output")


@dataclass(slots=True)
class ToolContext:
    sandbox: Sandbox
    workspace: str  # host path of the directory mounted at /app
    output_token_budget: int = 4096  # tool output beyond this is cut (head + tail)
    command_timeout: float = 120.0
    # The call being executed (its idempotency key): set per call by the agent loop.
    call: CallRef | None = None


class Tool(Protocol):
    spec: ToolSpec

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...
