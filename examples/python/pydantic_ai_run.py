"""A pydantic-ai ``Agent.run`` on Anthropic's and OpenAI's APIs, metered and capped by
stayer, on the simulator.

    python examples/python/pydantic_ai_run.py
"""

from __future__ import annotations

import asyncio

import anthropic
import openai
from _sim import check, refused, sim_url
from pydantic_ai import Agent

import stayer
from stayer.integrations.pydantic_ai import model


async def main() -> None:
    url = sim_url()
    budget = stayer.Budget("0.50")
    session = stayer.Session()
    claude = model(
        "anthropic:claude-sonnet-4-5",
        client=anthropic.AsyncAnthropic(base_url=url, api_key="sk-sim"),
        budget=budget,
        session=session,
    )
    gpt = model(
        "openai:gpt-5",
        client=openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim"),
        budget=budget,
        session=session,
    )
    agent = Agent(instructions="Answer in one line.")
    counted = 0
    for m in (claude, gpt):
        result = await agent.run("hello from pydantic-ai", model=m)
        print(result.output)
        counted += result.usage.output_tokens  # what pydantic-ai counted
    check(session, budget)
    assert counted == sum(e["usage"]["output_tokens"] for e in session.ledger)
    tiny = stayer.Budget("0.000001")
    capped = model(
        "anthropic:claude-sonnet-4-5",
        client=anthropic.AsyncAnthropic(base_url=url, api_key="sk-sim"),
        budget=tiny,
    )
    await refused(agent.run("again", model=capped))
    assert tiny.spent == 0


asyncio.run(main())
