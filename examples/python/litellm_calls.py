"""LiteLLM calls (what mini-swe-agent makes), priced and capped by stayer through
LiteLLM's callback interface, on the simulator.

    python examples/python/litellm_calls.py
"""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no price download

import litellm  # noqa: E402
from _sim import check, sim_url  # noqa: E402

import stayer  # noqa: E402
from stayer.integrations.litellm import BudgetRefused, install  # noqa: E402

url = sim_url()
budget, session = stayer.Budget("0.50"), stayer.Session()
handler = install(budget=budget, session=session)
system = {"role": "system", "content": "Be exact. " * 300}
reported = 0  # the output tokens LiteLLM reported
for model, base in (("anthropic/claude-sonnet-4-5", url), ("openai/gpt-5", f"{url}/v1")):
    reply = litellm.completion(
        model=model, api_base=base, api_key="sk-sim", max_tokens=200,
        messages=[system, {"role": "user", "content": f"hello from litellm ({model})"}],
    )  # fmt: skip
    print(reply.choices[0].message.content)
    reported += reply.usage.completion_tokens


async def streamed() -> int:
    chunks = await litellm.acompletion(
        model="openai/gpt-5", api_base=f"{url}/v1", api_key="sk-sim", stream=True,
        messages=[system, {"role": "user", "content": "and streamed"}],
    )  # fmt: skip
    return len([c async for c in chunks])


print(f"{asyncio.run(streamed())} chunks")
assert handler.flush(), "a call was never settled"
check(session, budget)
assert reported == sum(e["usage"]["output_tokens"] for e in session.ledger[:2])
litellm.callbacks.remove(handler)
tiny = install(budget=stayer.Budget("0.000001"))
try:
    litellm.completion(
        model="openai/gpt-5", api_base=f"{url}/v1", api_key="sk-sim",
        messages=[{"role": "user", "content": "again"}],
    )  # fmt: skip
except BudgetRefused as e:
    print(f"refused: {e}")
else:
    raise AssertionError("a call over its budget was sent")
assert tiny.budget.spent == 0 and tiny.budget.reserved == 0
