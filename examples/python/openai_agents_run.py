"""An OpenAI Agents SDK ``Runner.run``, metered and capped by stayer, on the simulator.

python examples/python/openai_agents_run.py
"""

from __future__ import annotations

import asyncio

import openai
from _sim import check, refused, sim_url
from agents import Agent, Runner, set_tracing_disabled

import stayer
from stayer.integrations.openai_agents import run_config


async def main() -> None:
    set_tracing_disabled(True)  # offline: no trace export
    budget = stayer.Budget("0.50")
    session = stayer.Session()
    client = openai.AsyncOpenAI(base_url=f"{sim_url()}/v1", api_key="sk-sim")
    config = run_config(client, budget=budget, session=session)
    agent = Agent(name="greeter", instructions="Answer in one line.", model="gpt-5")
    result = await Runner.run(agent, "hello from the agents SDK", run_config=config)
    print(result.final_output)
    check(session, budget)
    usage = result.context_wrapper.usage  # what the SDK counted, call by call
    assert usage.input_tokens == sum(e["usage"]["input_tokens"] for e in session.ledger)
    tiny = stayer.Budget("0.000001")  # cannot hold even one call: refused before sending
    await refused(Runner.run(agent, "again", run_config=run_config(client, budget=tiny)))
    assert tiny.spent == 0


asyncio.run(main())
