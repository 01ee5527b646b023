"""Issue 36: a run wired by observers, typed events, a typed run report.

The agent takes five arguments and reports to observers; what it reports are
``stayer.events`` Structs, whose JSON form (``event_record``) is the journal's and the
runtime feed's; ``execute`` returns a ``RunReport`` whose JSON form is ``result.json``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path

from stayer.agent import Agent, AgentSettings, Hooks, Limits
from stayer.events import Breaker, Event, Failover, event_record
from stayer.pricing import PriceBook
from stayer.tokens import MessageCounter, TiktokenCounter
from stayer.tools.base import ToolContext

REPO = Path(__file__).resolve().parent.parent


def test_the_agent_takes_at_most_eight_parameters() -> None:
    assert len(inspect.signature(Agent.__init__).parameters) - 1 <= 8


def test_event_records_keep_the_journal_shape() -> None:
    assert event_record(Failover(agent="main", from_model="a", to="b", error="503")) == (
        "failover",
        {"agent": "main", "from": "a", "to": "b", "error": "503"},
    )
    trip = {"reason": "loop", "detail": "d", "step": 3, "action": "stop", "soft": False}
    assert event_record(Breaker(agent="main", **trip)) == ("breaker", {"agent": "main", **trip})


def test_observers_hear_typed_events_messages_and_steps_in_order() -> None:
    from stayer.models.sim import SimModel
    from stayer.models.sim_policies import parse_policy

    counter = MessageCounter(TiktokenCounter())
    model = SimModel(
        "claude-sonnet-4-5",
        parse_policy(
            "synthetic:steps=5,obs_tokens=10,out_tokens=10", solution=None, counter=counter.counter
        ),
        counter,
    )
    heard: list[tuple[str, object]] = []

    def hooks(name: str) -> Hooks:
        def event(e: Event) -> None:
            assert isinstance(e, Event)
            heard.append((name, type(e).__name__))

        return Hooks(
            step=lambda e: heard.append((name, e.step)),
            message=lambda m: heard.append((name, m.role)),
            event=event,
        )

    agent = Agent(
        model,
        [],
        ToolContext(sandbox=None, workspace=""),  # type: ignore[arg-type]
        AgentSettings(PriceBook.load(), counter, Limits(max_steps=2)),
        [hooks("first"), hooks("second")],
    )
    result = asyncio.run(agent.run("Do the task.", "run-1"))
    assert result.steps == 2
    steps = [(n, s) for n, s in heard if isinstance(s, int)]
    assert steps == [("first", 1), ("second", 1), ("first", 2), ("second", 2)]
    assert ("first", "user") in heard and ("second", "assistant") in heard
    events = [e for _, e in heard if isinstance(e, str) and e[0].isupper()]
    assert "Breaker" in events  # the step limit, as a typed event


def test_execute_returns_a_report_whose_json_is_result_json(tmp_path, monkeypatch) -> None:
    from stayer.run import RunReport, RunSettings, execute, prepare

    monkeypatch.setenv("STAYER_HOME", str(tmp_path / "home"))
    config = RunSettings(
        str(REPO / "examples" / "hello-file"), "sim:claude-sonnet-4-5", sandbox="local"
    )
    report = asyncio.run(execute(prepare(config)))
    assert isinstance(report, RunReport) and report.steps >= 1
    written = json.loads((Path(report.run_dir) / "result.json").read_text())
    assert report.to_json() == written and list(written) == list(report.to_json())
    assert report["status"] == written["status"] and set(report) == set(written)
    assert RunReport.read(written).to_json() == written
    assert report.usage.input_tokens == written["usage"]["input_tokens"]
