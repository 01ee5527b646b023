"""Model names → adapters: ``anthropic:<id>``, ``openai:<id>`` (Responses API),
``openai-chat:<id>`` (Chat Completions; with ``base_url`` any OpenAI-compatible server such
as vLLM, Ollama or DeepSeek), ``local:<id>`` (a server on this machine, such as the one
``stayer local-model start`` runs: its own provider, never priced as OpenAI), and ``sim:<id>``
(the offline simulator)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stayer.errors import ConfigError
from stayer.models.base import Model

if TYPE_CHECKING:
    from stayer.pricing import PriceBook

PROVIDERS = ("anthropic", "openai", "openai-chat", "local", "sim")


def split_spec(spec: str) -> tuple[str, str]:
    kind, sep, model_id = spec.partition(":")
    if not sep or not model_id:
        raise ConfigError(
            f"--model {spec}: expected PROVIDER:MODEL_ID with PROVIDER one of {', '.join(PROVIDERS)} "
            "(e.g. sim:claude-sonnet-4-5, anthropic:claude-sonnet-4-5, openai:gpt-5)"
        )
    if kind not in PROVIDERS:
        raise ConfigError(
            f"--model {spec}: unknown provider {kind!r}; use one of {', '.join(PROVIDERS)}"
        )
    return kind, model_id


def make_real_model(spec: str, *, base_url: str | None = None) -> Model:
    """A model that calls a provider's API (the simulator is built by the caller, which
    knows the task that its policy plays)."""
    kind, model_id = split_spec(spec)
    if kind == "anthropic":
        from stayer.models.anthropic import AnthropicModel

        return AnthropicModel(model_id, base_url=base_url)
    if kind == "openai":
        from stayer.models.openai import OpenAIResponsesModel

        return OpenAIResponsesModel(model_id, base_url=base_url)
    if kind == "openai-chat":
        from stayer.models.openai import OpenAIChatModel

        return OpenAIChatModel(model_id, base_url=base_url)
    if kind == "local":
        from stayer.models.local import LocalChatModel, running_base_url

        url = base_url or running_base_url()
        if url is None:
            raise ConfigError(
                f"--model {spec}: no --base-url and no local model running; "
                "start one with `stayer local-model start`"
            )
        return LocalChatModel(model_id, base_url=url)
    raise ConfigError(f"--model {spec}: the simulator is not a real provider")


def known_sim_model(model_id: str, prices: PriceBook) -> None:
    """Refuse ``sim:model_id`` when no price data knows it, with the closest names: it is a
    typo (``sim:claude-sonet-4-5``) far more often than a model, and would cost "unknown"."""
    from stayer.models.caching import provider_of

    provider = provider_of(model_id)
    if prices.knows(model_id, provider):
        return
    close = [f"sim:{m}" for m in prices.closest(model_id, provider)]
    hint = (
        f"did you mean {' or '.join(close)}?"
        if close
        else "e.g. sim:claude-sonnet-4-5 or sim:gpt-5"
    )
    raise ConfigError(
        f"--model sim:{model_id}: no {provider} model of that name in the price data; {hint}"
    )
