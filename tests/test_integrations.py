"""What the examples do not show of ``stayer.integrations``: LiteLLM's calls sent with fewer
output tokens when only fewer fit, its refusal carrying the ``BudgetExceeded``, and a
budget shared by LiteLLM's threads never overshot; bad model names refused in one line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from service_helpers import listening

import stayer


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with listening(["sim", "serve", "--port", "0"]) as url:
        yield url


@pytest.fixture
def litellm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price download
    import litellm

    before = list(litellm.callbacks)
    yield litellm
    litellm.callbacks[:] = before


def test_litellm_calls_are_lowered_to_fit_and_never_overshoot(
    litellm: Any, sim: str, tmp_path: Path
) -> None:
    from stayer.integrations.litellm import BudgetRefused, install

    cap = Decimal("0.02")
    budget, session = stayer.Budget(cap), stayer.Session(home=tmp_path)
    handler = install(budget=budget, session=session)

    def call(i: int) -> str:
        try:
            litellm.completion(
                model="anthropic/claude-sonnet-4-5", api_base=sim, api_key="sk-x",
                max_tokens=4000, messages=[{"role": "user", "content": f"{i} " + "w " * 200}],
            )  # fmt: skip
            return "ok"
        except BudgetRefused as e:
            assert isinstance(e.error, stayer.BudgetExceeded)
            return "refused"

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(call, range(24)))
    assert handler.flush()
    ledger = session.ledger
    assert "ok" in outcomes and "refused" in outcomes
    assert len(ledger) == outcomes.count("ok")
    assert all(e["max_tokens"] < 4000 for e in ledger)  # 4000 never fit: sent with fewer
    assert budget.spent == session.cost <= cap and budget.reserved == 0


def test_a_model_name_of_no_known_provider_is_refused() -> None:
    from stayer.integrations.pydantic_ai import model

    with pytest.raises(stayer.ConfigError, match="anthropic:MODEL or openai:MODEL"):
        model("gemini:x")
