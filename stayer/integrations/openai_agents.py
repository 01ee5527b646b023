"""The OpenAI Agents SDK, metered: ``run_config(budget=…)`` is an ``agents.RunConfig``
whose model provider builds every model from one ``stayer.meter``-ed ``AsyncOpenAI``
client, so each call a ``Runner.run`` makes (tool turns, handoffs, compaction included) is
held against the budget before it is sent, priced and on the session's ledger; a call that
cannot fit raises ``stayer.BudgetExceeded`` out of ``Runner.run``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stayer.sdk import Budget, Session, meter

if TYPE_CHECKING:
    import openai
    from agents import RunConfig
    from agents.models.openai_provider import OpenAIProvider


def model_provider(
    client: openai.AsyncOpenAI | None = None,
    *,
    budget: Budget | None = None,
    session: Session | str | None = None,
    use_responses: bool | None = None,
) -> OpenAIProvider:
    """An ``agents`` model provider over ``client`` (default: ``AsyncOpenAI()`` from the
    environment) metered against ``budget`` into ``session``. ``use_responses``: the
    Responses API (the SDK's default) or Chat Completions."""
    import openai
    from agents.models.openai_provider import OpenAIProvider

    metered = meter(client or openai.AsyncOpenAI(), budget=budget, session=session)
    return OpenAIProvider(openai_client=metered, use_responses=use_responses)


def run_config(
    client: openai.AsyncOpenAI | None = None,
    *,
    budget: Budget | None = None,
    session: Session | str | None = None,
    use_responses: bool | None = None,
    **settings: Any,
) -> RunConfig:
    """``agents.RunConfig(model_provider=model_provider(…), **settings)``: pass it as
    ``Runner.run(agent, input, run_config=…)``."""
    from agents import RunConfig

    provider = model_provider(client, budget=budget, session=session, use_responses=use_responses)
    return RunConfig(model_provider=provider, **settings)
