"""Teams (``stayer.teams``): team.toml, threads that message and hand off, one budget tree.

The example team runs through the real command line (real bwrap sandbox, real journal);
the budget property runs teams in process against the simulator with a no-op tool, so
that many random caps and shares are cheap to try.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stayer.agent import Hooks, Limits
from stayer.context.policies import make_policy
from stayer.events import event_record
from stayer.guard.budget import Budget
from stayer.journal import open_store
from stayer.journal.log import load_log
from stayer.models.base import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec
from stayer.models.sim import SimModel
from stayer.models.sim_policies import filler
from stayer.pricing import PriceBook
from stayer.sandbox.locate import locate_bwrap
from stayer.teams.config import load_team, shares
from stayer.teams.handoff import HandoffSizes, price_handoff
from stayer.teams.runner import Team, TeamServices
from stayer.tokens import MessageCounter, TiktokenCounter
from stayer.tools.base import ToolContext, ToolResult
from stayer.tools.submit import SubmitTool

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "team-fix-median"
PRICES = PriceBook()
D = Decimal
needs_bwrap = pytest.mark.skipif(locate_bwrap() is None, reason="bubblewrap not installed")


def stayer(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    env["STAYER_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        env=env,
        cwd=cwd or home.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


# --- team.toml --------------------------------------------------------------------------

GOOD = """
entry = "lead"
[agents.lead]
model = "sim:claude-sonnet-4-5"
budget_share = 0.25
talks_to = ["helper"]
[agents.helper]
model = "sim:claude-haiku-4-5"
talks_to = ["lead"]
"""


def test_team_toml_shares_split_the_rest(tmp_path):
    f = tmp_path / "team.toml"
    f.write_text(GOOD + "[agents.third]\nmodel = 'sim:gpt-5'\n")
    assert shares(load_team(f)) == {"lead": 0.25, "helper": 0.375, "third": 0.375}


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (
            lambda t: t.replace('entry = "lead"', 'entry = "boss"'),
            "entry: 'boss' is not one of the agents",
        ),
        (
            lambda t: t.replace('talks_to = ["lead"]', 'talks_to = ["ghost"]'),
            "agents.helper.talks_to: 'ghost'",
        ),
        (
            lambda t: t.replace("budget_share = 0.25", "budget_share = 1.5"),
            "agents.lead.budget_share",
        ),
        (
            lambda t: t.replace("budget_share = 0.25", 'budget_share = "half"'),
            "agents.lead.budget_share",
        ),
        (
            lambda t: t + "[agents.x]\nmodel = 'sim:gpt-5'\nbudget_share = 0.9\n",
            "budget_share values add up to 1.15",
        ),
        (
            lambda t: t.replace(
                'model = "sim:claude-haiku-4-5"', 'model = "sim:claude-haiku-4-5"\ntools = ["rm"]'
            ),
            "agents.helper.tools",
        ),
        (
            lambda t: t.replace("[agents.lead]", '[agents.lead]\ncolour = "red"'),
            "agents.lead.colour",
        ),
        (lambda t: t.replace("sim:claude-haiku-4-5", "sim:claude-haiku-9"), "agents.helper.model"),
        (lambda t: t + "[[broken", "malformed TOML"),
    ],
)
def test_bad_team_toml_is_one_line_exit_2_nothing_written(tmp_path, edit, field):
    f = tmp_path / "team.toml"
    f.write_text(edit(GOOD))
    home = tmp_path / "home"
    r = stayer(home, "run", str(EXAMPLE), "--team", str(f), "--sandbox", "local")
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and str(f) in line and field in line, line
    assert not (home / "runs").exists()


def test_team_missing_file_and_missing_model(tmp_path):
    r = stayer(tmp_path / "home", "run", str(EXAMPLE), "--team", str(tmp_path / "nope.toml"))
    assert r.returncode == 2 and "--team" in r.stderr and "no such file" in r.stderr
    r = stayer(tmp_path / "home", "run", str(EXAMPLE))
    assert r.returncode == 2 and "--model" in r.stderr


# --- the example, end to end --------------------------------------------------------------


@needs_bwrap
def test_example_team_succeeds_with_messages_both_ways_and_cost_per_agent(tmp_path):
    home = tmp_path / "home"
    r = stayer(
        home, "run", str(EXAMPLE), "--team", str(EXAMPLE / "team.toml"), "--run-id", "t1", "--json"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "succeeded" and doc["reward"] == 1.0
    agents = {row["agent"]: row for row in doc["agents"]}
    assert set(agents) == {"coordinator", "worker"}
    assert all(row["steps"] >= 2 for row in agents.values())
    # The team's total is the sum over its agents, and over its ledger.
    assert D(doc["cost_usd"]) == sum(D(row["cost_usd"]) for row in agents.values())
    assert D(doc["cost_usd"]) == sum(D(e["cost_usd"]) for e in doc["ledger"])
    assert doc["steps"] == len(doc["ledger"])
    # The handoff's priced history choice is on the coordinator's ledger entry.
    quotes = [e["route"]["handoff"] for e in doc["ledger"] if (e["route"] or {}).get("handoff")]
    assert len(quotes) == 1 and quotes[0]["asked"] is None
    q = quotes[0]
    assert q["passed"] == min(q["expected_cost_usd"], key=lambda k: D(q["expected_cost_usd"][k]))
    # Messages both ways, journaled in each thread's stream: sent and received.
    store = open_store(home)
    try:
        log = load_log(store, "t1")
    finally:
        store.close()
    assert set(log.threads) == {"coordinator", "worker"}
    sent = [
        json.loads(log.blobs[p])
        for t in log.threads.values()
        for k, p in t.agent_events.values()
        if k == "message.sent"
    ]
    received = [
        json.loads(log.blobs[p])
        for t in log.threads.values()
        for k, p in t.agent_events.values()
        if k == "message.received"
    ]
    assert {(m["sender"], m["to"], m["kind"]) for m in sent} == {
        ("coordinator", "worker", "handoff"),
        ("worker", "coordinator", "report"),
    }
    assert {m["id"] for m in received} == {m["id"] for m in sent}
    assert all(D(m["read_cost_usd"]) > 0 for m in received)
    # The report lists messages, with what each cost its receiver to read.
    rep = json.loads(stayer(home, "report", "t1", "--json").stdout)
    assert {(m["sender"], m["to"]) for m in rep["messages"]} == {
        ("coordinator", "worker"),
        ("worker", "coordinator"),
    }
    assert D(rep["totals"]["cost_usd"]) == D(doc["cost_usd"])
    # The threads as A2A v0.3 tasks: one per agent, one context, messages both ways.
    tasks = json.loads(stayer(home, "export", "a2a", "t1").stdout)
    assert [t["id"] for t in tasks] == ["t1/coordinator", "t1/worker"]
    for t in tasks:
        assert (
            t["kind"] == "task" and t["contextId"] == "t1" and t["status"]["state"] == "completed"
        )
        assert t["status"]["timestamp"] and t["artifacts"][0]["parts"][0]["text"]
        assert {m["role"] for m in t["history"]} == {"user", "agent"}
    assert D(tasks[0]["metadata"]["stayer"]["cost_usd"]) + D(
        tasks[1]["metadata"]["stayer"]["cost_usd"]
    ) == D(doc["cost_usd"])
    r = stayer(home, "export", "a2a", "nope")
    assert r.returncode == 2 and "no such run" in r.stderr


# --- priced handoffs ------------------------------------------------------------------------


def test_a_team_run_of_small_prompts_flags_no_cache_break(tmp_path):
    """Before: every step but each agent's first flagged ``below_minimum``: noise, since
    nothing below the provider's cacheable minimum can be cached (or lost)."""
    r = stayer(
        tmp_path / "home", "run", str(EXAMPLE), "--team", str(EXAMPLE / "team.toml"), "--json"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    small = [e for e in doc["ledger"] if (e.get("context_tokens") or 0) < 1024]
    assert small and all(e["cache_break"] is None for e in doc["ledger"])
    assert "cache break" not in r.stderr


def test_handoff_price_prefers_history_for_short_receivers_and_less_for_long():
    rates = PRICES.rates("claude-sonnet-4-5", "anthropic", None, 10_000)
    sizes = HandoffSizes(brief=200, summary=500, full=20_000)
    short = price_handoff(
        rates, sizes, 1, "sim:claude-sonnet-4-5", relevance=0.3, rediscovery_steps=10
    )
    long = price_handoff(
        rates, sizes, 200, "sim:claude-sonnet-4-5", relevance=0.3, rediscovery_steps=10
    )
    # A short-lived receiver cannot afford to find the context again; a long-lived one
    # cannot afford to carry all of it at every step.
    assert short.chosen == "full" and long.chosen != "full"
    assert all(v is not None and v > 0 for v in long.costs.values())
    assert price_handoff(None, sizes, 10, "x").chosen == "none"  # unpriced: the brief alone


def test_a_priced_handoff_is_its_handoff_event() -> None:
    from stayer.events import Handoff, event_record

    sizes = HandoffSizes(brief=200, summary=500, full=20_000)
    quote = price_handoff(None, sizes, 10, "sim:x")
    event = quote.event("lead", "worker", None, "none")
    assert isinstance(event, Handoff) and (event.agent, event.to, event.passed) == (
        "lead",
        "worker",
        "none",
    )
    kind, payload = event_record(event)
    assert kind == "handoff" and payload == {
        "agent": "lead",
        "kind": "handoff",
        "chosen": "none",
        "receiver_model": "sim:x",
        "expected_steps": 10,
        "tokens": {"brief": 200, "summary": 500, "full": 20_000},
        "expected_cost_usd": {"none": None, "summary": None, "full": None},
        "to": "worker",
        "asked": None,
        "passed": "none",
    }


# --- the budget property with concurrent threads ------------------------------------------


@dataclass
class Busy:
    """A team member that works: the entry agent hands off to ``peer`` and keeps working;
    the helper works; each step is text of up to ``out`` tokens and a no-op observation of
    up to ``obs`` tokens; after ``steps`` steps it submits."""

    seed: int
    steps: int
    out: int
    obs: int

    def next_message(self, request: ModelRequest) -> Message:
        step = 1 + sum(1 for m in request.messages if m.role == "assistant")
        rng = random.Random(self.seed * 1_000_003 + step)
        text = filler(rng.randint(0, self.out), rng)
        names = {t.name: t for t in request.tools}
        if step == 1 and "handoff" in names:
            peer = names["handoff"].parameters["properties"]["to"]["enum"][0]
            call = ToolCall(
                f"c{step}",
                "handoff",
                json.dumps({"to": peer, "brief": "help", "history": rng.choice(["none", "full"])}),
            )
        elif step > self.steps:
            call = ToolCall(f"c{step}", "submit", json.dumps({"summary": "done"}))
        else:
            call = ToolCall(f"c{step}", "observe", json.dumps({"tokens": rng.randint(0, self.obs)}))
        return Message("assistant", text, (call,))


class Observe:
    spec = ToolSpec(
        "observe",
        "An observation of about `tokens` tokens.",
        {"type": "object", "properties": {"tokens": {"type": "integer"}}},
    )

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(0)  # let the other threads in, as a real command would
        return ToolResult(filler(args.get("tokens", 0), random.Random(args.get("tokens", 0))))


@dataclass
class Billed:
    """The simulator, with every reply priced outside the loop (what the provider bills)."""

    sim: SimModel
    bill: list[Decimal]

    def __post_init__(self) -> None:
        self.spec, self.provider, self.model_id = (
            self.sim.spec,
            self.sim.provider,
            self.sim.model_id,
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        response = await self.sim.complete(request)
        self.bill.append(
            PRICES.cost(response.usage, self.model_id, self.provider, response.service_tier).total
        )
        return response


def team_spec(tmp_path: Path, models: tuple[str, str], share: float, steps: tuple[int, int]) -> Any:
    f = tmp_path / f"team-{random.random()}.toml"
    f.write_text(
        f'entry = "a"\n[agents.a]\nmodel = "sim:{models[0]}"\nbudget_share = {share}\nmax_steps = {steps[0]}\ntalks_to = ["b"]\n'
        f'[agents.b]\nmodel = "sim:{models[1]}"\nmax_steps = {steps[1]}\ntalks_to = ["a"]\n'
    )
    return load_team(f)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 10_000),
    cap=st.decimals(D("0.0005"), D("0.05"), places=5),
    share=st.sampled_from([0.1, 0.3, 0.5, 0.9]),
    models=st.tuples(
        *[st.sampled_from(["claude-sonnet-4-5", "claude-haiku-4-5", "gpt-5", "deepseek-chat"])] * 2
    ),
    steps=st.tuples(st.integers(2, 12), st.integers(1, 12)),
    out=st.integers(0, 3000),
    obs=st.integers(0, 4000),
)
def test_max_cost_holds_with_concurrent_threads(
    tmp_path, seed, cap, share, models, steps, out, obs
):
    spec = team_spec(tmp_path, models, share, steps)
    counter = MessageCounter(TiktokenCounter())
    bill: list[Decimal] = []
    built = {
        name: Billed(
            SimModel(
                agent.model.removeprefix("sim:"),
                Busy(seed + i, agent.max_steps, out, obs),
                counter,
                latency_s=0.001,
            ),
            bill,
        )
        for i, (name, agent) in enumerate(spec.agents.items())
    }
    budget = Budget(cap)
    services = TeamServices(
        prices=PRICES,
        counter=counter,
        tool_context=ToolContext(sandbox=None, workspace=""),  # type: ignore[arg-type]
        budget=budget,
        limits=Limits(max_output_tokens=2048),
        models=built,  # type: ignore[arg-type]
        tools=lambda: [Observe(), SubmitTool()],
        policy=lambda: make_policy("none"),
    )
    result = asyncio.run(Team(spec, services).run("work", "prop"))
    billed = sum(bill, D(0))
    assert billed <= cap, f"billed {billed} over the cap {cap}"
    assert result.cost_usd == billed  # every billed call is on the team's ledger
    assert budget.spent + budget.reserved == billed and budget.reserved == 0
    per_agent = {e.agent for e in result.ledger}
    assert per_agent <= {"a", "b"}
    a_cost = sum((e.cost.total for e in result.ledger if e.agent == "a"), D(0))
    assert a_cost <= (cap * D(str(share))).quantize(D("1e-9"))  # a thread stays within its share


def test_a_thread_out_of_share_reports_its_wrap_up_to_its_delegator(tmp_path):
    spec = team_spec(tmp_path, ("claude-haiku-4-5", "claude-sonnet-4-5"), 0.5, (30, 30))
    counter = MessageCounter(TiktokenCounter())
    bill: list[Decimal] = []
    seen: list[tuple[str, dict[str, Any]]] = []

    class Waiter(Busy):
        def next_message(self, request: ModelRequest) -> Message:  # the entry hands off, then waits
            step = 1 + sum(1 for m in request.messages if m.role == "assistant")
            if step == 1:
                return Message(
                    "assistant",
                    "",
                    (
                        ToolCall(
                            "c1",
                            "handoff",
                            json.dumps({"to": "b", "brief": "work", "history": "none"}),
                        ),
                    ),
                )
            reports = [m.content for m in request.messages if "[report b#" in m.content]
            if reports:
                return Message(
                    "assistant",
                    "",
                    (ToolCall(f"c{step}", "submit", json.dumps({"summary": reports[0]})),),
                )
            return Message(
                "assistant",
                "",
                (
                    ToolCall(
                        f"c{step}", "wait_for_message", json.dumps({"from": "b", "timeout": 60})
                    ),
                ),
            )

    built = {
        "a": Billed(SimModel("claude-haiku-4-5", Waiter(0, 30, 0, 0), counter), bill),
        "b": Billed(SimModel("claude-sonnet-4-5", Busy(1, 30, 200, 3000), counter), bill),
    }
    services = TeamServices(
        prices=PRICES,
        counter=counter,
        tool_context=ToolContext(sandbox=None, workspace=""),  # type: ignore[arg-type]
        budget=Budget(D("0.08")),
        limits=Limits(max_output_tokens=1024),
        models=built,  # type: ignore[arg-type]
        tools=lambda: [Observe(), SubmitTool()],
        policy=lambda: make_policy("none"),
        observers=[Hooks(event=lambda e: seen.append(event_record(e)))],
    )
    result = asyncio.run(Team(spec, services).run("work", "share"))
    report = next(p for k, p in seen if k == "message.sent" and p["kind"] == "report")
    assert report["sender"] == "b" and report["to"] == "a"
    assert report["content"].startswith("b finished (budget_exhausted")
    assert result.status == "submitted" and "budget_exhausted" in result.summary
    assert result.cost_usd == sum(bill, D(0)) <= D("0.08")


# --- kill -9 during a team run, then resume ---------------------------------------------------

TEAM_KILLS = 8


def usage_by_agent_step(doc: dict) -> list[tuple[str, int, dict]]:
    return sorted(
        (e["agent"], e["step"], e["usage"])
        for e in doc["ledger"]
        if e.get("kind") != "lost_in_flight"
    )


@pytest.mark.slow
@needs_bwrap
def test_team_killed_at_random_instants_resumes_to_the_same_result(tmp_path):
    """Each of ``TEAM_KILLS`` team runs is killed with SIGKILL at an instant drawn over the
    uninterrupted run's duration, then resumed: same status, reward, steps per agent, usage
    per step and workspace; each thread's completed model calls are journaled once."""
    import signal
    import time
    from collections import Counter

    from test_resume_faults import Harness, tree

    h = Harness(tmp_path / "home", "")
    team = str(EXAMPLE / "team.toml")
    args = ["--team", team, "--sim-latency", "0.2", "--json"]
    # The example's task with its solution (the team's worker runs it).
    (h.task / "solution" / "solve.sh").write_text((EXAMPLE / "solution" / "solve.sh").read_text())
    for name in ("instruction.md",):
        (h.task / name).write_text((EXAMPLE / name).read_text())
    for sub in ("environment", "tests"):
        import shutil

        shutil.rmtree(h.task / sub)
        shutil.copytree(EXAMPLE / sub, h.task / sub)

    def start(run_id: str, capture: bool = False) -> tuple[subprocess.Popen, float]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stayer.cli", "run", str(h.task), *args, "--run-id", run_id],
            env=h.env,
            cwd=h.home.parent,
            stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        while True:
            store = open_store(h.home, None, create=False)
            try:
                if store is not None and store.run(run_id) is not None:
                    return proc, time.monotonic()
            finally:
                if store is not None:
                    store.close()
            assert proc.poll() is None, f"run {run_id} exited before it was journaled"
            time.sleep(0.01)

    proc, registered = start("base", capture=True)
    out, _ = proc.communicate(timeout=300)
    duration = time.monotonic() - registered
    base = json.loads(out)
    assert base["status"] == "succeeded", base

    def files(run_id: str) -> dict[str, bytes]:  # the verifier's bytecode holds the source's mtime
        return {
            k: v
            for k, v in tree(h.home / "runs" / run_id / "workspace").items()
            if "__pycache__" not in k
        }

    base_tree = files("base")
    seed = int(os.environ.get("STAYER_FAULT_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    kinds: Counter[str] = Counter()
    for i in range(TEAM_KILLS):
        run_id, delay = f"k{i}", rng.uniform(0, duration * 0.8)  # the verifier takes the rest
        where = f"seed {seed}, run {run_id} killed after {delay:.2f}s"
        proc, registered = start(run_id)
        time.sleep(max(0.0, registered + delay - time.monotonic()))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        r = h.resume(run_id)
        assert "Traceback" not in r.stderr, (where, r.stderr)
        doc = json.loads(r.stdout)
        assert (doc["status"], doc["reward"], doc["steps"]) == (
            base["status"],
            base["reward"],
            base["steps"],
        ), where
        assert usage_by_agent_step(doc) == usage_by_agent_step(base), where
        assert files(run_id) == base_tree, where
        log_events = h.events(run_id)
        finished = Counter(
            (e.data.get("thread"), e.data["n"]) for e in log_events if e.kind == "model_finished"
        )
        assert all(c == 1 for c in finished.values()), (where, finished)  # no paid call repeated
        assert sum(finished.values()) == base["steps"], where
        lost = [e for e in doc["ledger"] if e.get("kind") == "lost_in_flight"]
        kinds[
            "mid model call"
            if lost
            else "between calls"
            if "already finished" not in r.stderr
            else "after finish"
        ] += 1
    print(f"\nteam: {TEAM_KILLS} kills (seed {seed}) over a {duration:.1f}s run: {dict(kinds)}")


# --- messaging tools ------------------------------------------------------------------------


@dataclass
class Script:
    """Says ``turns`` in order (tool name, arguments), then submits."""

    turns: list[tuple[str, dict[str, Any]]]

    def next_message(self, request: ModelRequest) -> Message:
        step = 1 + sum(1 for m in request.messages if m.role == "assistant")
        name, args = (
            self.turns[step - 1]
            if step <= len(self.turns)
            else ("submit", {"summary": f"done after {step - 1}"})
        )
        return Message("assistant", "", (ToolCall(f"c{step}", name, json.dumps(args)),))


def scripted_team(
    tmp_path: Path, scripts: dict[str, Script], talks: dict[str, list[str]]
) -> tuple[Any, dict[str, list[str]]]:
    f = tmp_path / "team.toml"
    f.write_text(
        'entry = "a"\n'
        + "".join(
            f'[agents.{n}]\nmodel = "sim:gpt-5"\ntalks_to = {json.dumps(talks[n])}\n'
            for n in scripts
        )
    )
    counter = MessageCounter(TiktokenCounter())
    spec = load_team(f)
    seen: dict[str, list[str]] = {n: [] for n in scripts}
    services = TeamServices(
        prices=PRICES,
        counter=counter,
        tool_context=ToolContext(sandbox=None, workspace=""),  # type: ignore[arg-type]
        budget=Budget(None),
        limits=Limits(),
        models={n: SimModel("gpt-5", s, counter) for n, s in scripts.items()},  # type: ignore[arg-type]
        tools=lambda: [Observe(), SubmitTool()],
        policy=lambda: make_policy("none"),
    )
    team = Team(spec, services)
    for name, thread in team.threads.items():
        thread_hook = thread._on_message

        def hook(m: Message, name: str = name, inner: Any = thread_hook) -> None:
            seen[name].append(m.content)
            inner(m)

        thread._on_message = hook  # type: ignore[method-assign]
    return team, seen


def test_messages_reach_the_receiver_appended_and_peers_are_enforced(tmp_path):
    scripts = {
        "a": Script(
            [
                ("send_message", {"to": "c", "content": "hi c"}),
                ("send_message", {"to": "b", "content": "start"}),
                ("send_message", {"to": "b", "content": "more"}),
                ("wait_for_message", {"from": "b", "timeout": 60}),
            ]
        ),
        "b": Script([("wait_for_message", {"timeout": 0}), ("observe", {"tokens": 1})]),
        "c": Script([]),
    }
    team, seen = scripted_team(tmp_path, scripts, {"a": ["b"], "b": ["a"], "c": []})
    result = asyncio.run(team.run("go", "msg"))
    assert result.status == "submitted"
    assert any("send_message: 'c' is not an agent you may talk to (b)" in c for c in seen["a"])
    # b started on a's first message to it; the second arrived while it worked.
    assert seen["b"][0].startswith("Message from a:\nstart")
    assert any("[message a#2 from a]\nmore" in c for c in seen["b"])
    assert any(c.startswith("[report b#1 from b]\nb finished (submitted") for c in seen["a"])
    assert team.threads["c"].task is None  # never messaged by anyone allowed to: never started
