"""The Tool protocol and what a tool call returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, get_args

import msgspec
from msgspec import UNSET, UnsetType

from stayer.messages import ToolSpec
from stayer.records import Record
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

    def fields(self) -> ResultFields:
        """Everything the result says besides its text (is_error, submitted, kind, ...): what
        a journal keeps beside the output, so that the result read back is equal to it."""
        outcome = UNSET if self.outcome is None else self.outcome
        return ResultFields(self.is_error, self.submitted, self.kind, outcome)

    @classmethod
    def of(cls, output: str, kept: ResultFields) -> ToolResult:
        """The result of ``output`` and the ``fields()`` kept."""
        outcome = None if isinstance(kept.outcome, UnsetType) else kept.outcome
        return cls(output, kept.is_error, kept.submitted, kept.kind, outcome)


class ResultFields(Record):
    """A ``ToolResult``'s fields besides its text, as journals keep them: a field missing
    from a document written before it existed reads as its default, and an outcome that
    is None is left out."""

    is_error: bool = False
    submitted: bool = False
    kind: str = "observation"
    outcome: str | UnsetType = UNSET


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


A = TypeVar("A", bound=msgspec.Struct)


class TypedTool(Generic[A]):
    """A tool whose arguments are a record: the model's JSON, already checked against
    ``spec.parameters`` by ``run_tool``, is read into ``Args`` (the record that a subclass
    names as its type parameter: ``class BashTool(TypedTool[BashArgs])``) and handed to
    ``run``."""

    spec: ToolSpec
    Args: type[A]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            named = get_args(base)
            if named and isinstance(named[0], type) and issubclass(named[0], msgspec.Struct):
                cls.Args = named[0]  # type: ignore[assignment]  # A, bound at run time

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self.run(msgspec.convert(args, self.Args, strict=False), ctx)

    async def run(self, args: A, ctx: ToolContext) -> ToolResult:
        raise NotImplementedError
