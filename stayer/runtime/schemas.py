"""Request and response bodies of the HTTP API (pydantic: validated in, documented in
``/openapi.json``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, model_validator
from pydantic.json_schema import GetJsonSchemaHandler, JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from stayer.choices import POLICY_HELP
from stayer.ledger import OutcomeUnknown
from stayer.records import from_json, to_json
from stayer.runtime.actions import ActionView
from stayer.runtime.db import ServiceRun
from stayer.settings import RunSettings

#: A run's cap; above this, a typo is likelier than a real budget.
MAX_RUN_COST = Decimal(100_000)


def _lone_surrogate(value: Any, where: str) -> str | None:
    """The path of the first string in ``value`` that UTF-8 cannot encode (JSON's
    ``"\\ud800"``), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "body"
    elif isinstance(value, dict):
        for k, v in value.items():
            found = _lone_surrogate(k, f"{where}.{k!a}".lstrip(".")) or _lone_surrogate(
                v, f"{where}.{k}".lstrip(".") if isinstance(k, str) and k.isprintable() else where
            )
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if found := _lone_surrogate(v, f"{where}[{i}]"):
                return found
    return None


class ApiIn(BaseModel):
    """A request body: text in it is Unicode that UTF-8 can carry (a lone surrogate was
    stored, then made every answer that showed it a 500)."""

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any) -> Any:
        where = _lone_surrogate(data, "")
        if where is not None:
            raise ValueError(f"{where}: not valid Unicode (a lone surrogate)")
        return data


def _shown(text: str) -> str:
    """``text`` as UTF-8 can carry it (a lone surrogate stored before it was refused)."""
    return text.encode("utf-8", "replace").decode("utf-8")


class _AsRecord:
    """A msgspec record as a pydantic field: its value is the record (a JSON document is
    checked into one), written by ``stayer.records.to_json``, and shown in
    ``/openapi.json`` with msgspec's schema of it."""

    def __get_pydantic_core_schema__(
        self, source: type[msgspec.Struct], handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(
            lambda v: v if isinstance(v, source) else from_json(v, source),
            serialization=core_schema.plain_serializer_function_ser_schema(to_json),
            metadata={"record": source},
        )

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        found = msgspec.json.schema(schema["metadata"]["record"])
        return _inline(found, found.get("$defs", {}))


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    """``schema`` with its ``$ref``s to ``defs`` replaced by what they name."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return _inline(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
        return {k: _inline(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


R = TypeVar("R", bound=msgspec.Struct)
#: ``Recorded[T]``: the record type ``T`` as a field of a response body.
Recorded = Annotated[R, _AsRecord()]


class RunCreate(ApiIn):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        description="A task under the server's --tasks-dir.",
    )
    model: str = Field(
        min_length=3, max_length=200, description="PROVIDER:MODEL, e.g. sim:claude-sonnet-4-5."
    )
    max_cost: Decimal | None = Field(
        default=None,
        gt=0,
        le=MAX_RUN_COST,
        description="Hard cap in USD, carved from the tenant's budget.",
    )
    max_steps: int = Field(default=RunSettings.max_steps, ge=1, le=10_000)
    policy: str = Field(
        default=RunSettings.policy,
        max_length=100,
        description=f"Context policy: {POLICY_HELP}.",
    )
    sim_policy: str | None = Field(
        default=None, max_length=500, description="For sim: models; replay: is refused."
    )
    sim_latency: float = Field(default=0.0, ge=0, le=600, allow_inf_nan=False)
    webhook: str | None = Field(
        default=None, max_length=2000, description="URL that receives signed status changes."
    )
    metadata: dict[str, str] = Field(default_factory=dict, max_length=50)
    team: dict[str, Any] | None = Field(
        default=None,
        description="A team of agents instead of one: team.toml's contents as an object (docs/teams.md).",
    )
    mcp_servers: dict[str, dict[str, Any]] | None = Field(
        default=None,
        max_length=20,
        description="MCP servers of this run, as [mcp.servers] in stayer.toml: NAME → "
        "{command, env} (stdio, in the run's sandbox) or {url, headers} (streamable HTTP, "
        "public addresses only, as webhooks). trust = host is refused (docs/mcp.md).",
    )
    mcp_tools: Literal["eager", "lazy", "auto"] = Field(
        default="auto",
        description="MCP schemas in the prompt (eager), behind tool_search (lazy), or the cheaper.",
    )
    confirm_tools: list[Literal["bash", "read_file", "write_file", "edit_file", "memory"]] = Field(
        default_factory=list,
        description="Tools whose every call waits for a person's approval (requires_action).",
    )


class RunPatch(ApiIn):
    model_config = ConfigDict(extra="forbid")

    max_cost: Decimal = Field(
        gt=0, le=MAX_RUN_COST, description="A larger cap; a run paused at its cap resumes."
    )


class Decision(ApiIn):
    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(pattern=r"^act-[0-9]{1,9}$", description="The pending action's call_id.")
    decision: Literal["approve", "reject"]
    message: str | None = Field(
        default=None, max_length=10_000, description="Said to the agent with the decision."
    )


class UsageOut(BaseModel):
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


class RunOut(BaseModel):
    id: str
    tenant: str
    task: str
    model: str
    status: str
    stop_reason: str | None
    steps: int
    usage: UsageOut
    cost_usd: str = Field(description="Decimal USD as a string, or 'unknown'.")
    reward: float | None
    error: str | None
    cancel_requested: bool
    pending_action: Recorded[ActionView] | None = Field(
        default=None,
        description="The call awaiting a decision, with wait_cost: when the prompt cache expires and what that costs.",
    )
    metadata: dict[str, str]
    created_at: str
    updated_at: str

    @classmethod
    def of(cls, run: ServiceRun, pending_action: ActionView | None = None) -> RunOut:
        return cls(
            id=run.id,
            tenant=run.tenant,
            task=run.task,
            model=run.model,
            status=run.status,
            stop_reason=run.stop_reason,
            steps=run.steps,
            usage=UsageOut.model_validate(run.usage, from_attributes=True),
            cost_usd=run.cost_usd,
            reward=run.reward,
            error=run.error,
            cancel_requested=run.cancel_requested,
            pending_action=pending_action,
            metadata={_shown(k): _shown(v) for k, v in run.request.metadata.items()},
            created_at=run.created_at,
            updated_at=run.updated_at,
        )


class RunList(BaseModel):
    data: list[RunOut]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null on the last."
    )


class MessageIn(ApiIn):
    model_config = ConfigDict(extra="forbid")

    content: str = Field(
        min_length=1,
        max_length=100_000,
        description="Said to the agent; it reads it at its next step.",
    )


class MessageOut(BaseModel):
    run_id: str
    n: int = Field(description="The message's number in the run, from 1.")


class TaskOut(BaseModel):
    name: str
    files: int


class ActionList(BaseModel):
    data: list[Recorded[ActionView]]


class Ledger(BaseModel):
    run_id: str
    # The stored result's entries, forwarded as they are (their keys sorted); an
    # unfinished run's in LedgerEntry's order.
    ledger: list[dict[str, Any]]
    # Side-effecting calls whose outcome a crash lost.
    outcome_unknown: list[Recorded[OutcomeUnknown]] = []
