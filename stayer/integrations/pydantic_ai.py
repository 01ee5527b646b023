"""pydantic-ai, metered: ``model("anthropic:claude-sonnet-4-5", budget=…)`` is a
pydantic-ai model whose provider holds a ``stayer.meter``-ed SDK client, so every request
an ``Agent.run`` makes (retries and output-validation turns included) is held against the
budget before it is sent, priced and on the session's ledger; a request that cannot fit
raises ``stayer.BudgetExceeded``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stayer.sdk import Budget, Session, meter

if TYPE_CHECKING:
    from pydantic_ai.models import Model


def model(
    spec: str,
    *,
    client: Any = None,
    budget: Budget | None = None,
    session: Session | str | None = None,
    responses: bool = False,
) -> Model:
    """``spec`` is ``anthropic:MODEL`` or ``openai:MODEL``; ``client`` the SDK's async
    client to meter (default: one from the environment). ``responses``: OpenAI's
    Responses API instead of Chat Completions."""
    from stayer.errors import ConfigError

    provider, _, name = spec.partition(":")
    if provider == "anthropic":
        import anthropic
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        metered = meter(client or anthropic.AsyncAnthropic(), budget=budget, session=session)
        return AnthropicModel(name, provider=AnthropicProvider(anthropic_client=metered))
    if provider == "openai":
        import openai
        from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
        from pydantic_ai.providers.openai import OpenAIProvider

        metered = meter(client or openai.AsyncOpenAI(), budget=budget, session=session)
        kind = OpenAIResponsesModel if responses else OpenAIChatModel
        return kind(name, provider=OpenAIProvider(openai_client=metered))
    raise ConfigError(f"model {spec!r}: expected anthropic:MODEL or openai:MODEL")
