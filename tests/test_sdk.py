"""``stayer.meter`` on the official SDK clients, against ``stayer sim serve`` started as a
user starts it: the same return types and streams, every call held, priced and on its
session's ledger, refusals before anything is sent, and a Budget shared by 50 threads and
by 10 processes that is never overshot (exact Decimal), in a SQLite file and in PostgreSQL
(``STAYER_TEST_PG``, else a server started here; skipped, saying why, where none can be)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import anthropic
import openai
import pytest
from pg_server import database_fixture
from service_helpers import listening

import stayer

SYSTEM = "Be exact. " * 700
#: The public names the README's "Use it from Python" and the API reference document.
DOCUMENTED = [
    "Agent", "Budget", "BudgetExceeded", "ConfigError", "EvalOutcome", "RunOutcome",
    "Session", "__version__", "eval", "meter", "run_task",
]  # fmt: skip
pg_url = database_fixture()


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with listening(["sim", "serve", "--port", "0"]) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a shared budget lives: a SQLite file, or the module's PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "budgets.db")
    return str(request.getfixturevalue("pg_url"))


def test_the_public_api_is_what_the_docs_list() -> None:
    assert sorted(stayer.__all__) == sorted(DOCUMENTED)
    for name in stayer.__all__:
        assert getattr(stayer, name) is not None


def test_a_metered_anthropic_client_prices_every_call_onto_its_session(
    sim: str, tmp_path: Path
) -> None:
    budget = stayer.Budget("1")
    session = stayer.Session("py-anthropic", home=tmp_path)
    raw = anthropic.Anthropic(base_url=sim, api_key="sk-x", max_retries=0)
    client = stayer.meter(raw, budget=budget, session=session)
    assert type(client) is type(raw)
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    first = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=100, system=system,
        messages=[{"role": "user", "content": "hi"}],
    )  # fmt: skip
    assert isinstance(first, anthropic.types.Message) and first.content[0].text == "echo: hi"
    with client.messages.stream(
        model="claude-sonnet-4-5",
        max_tokens=100,
        system=system,
        messages=[{"role": "user", "content": "hi"}],
    ) as stream:
        second = stream.get_final_message()
    ledger = session.ledger
    assert [e["usage"]["cache_read_tokens"] for e in ledger] == [
        0,
        second.usage.cache_read_input_tokens,
    ]
    assert all(e["complete"] for e in ledger)
    assert session.cost == budget.spent > 0 and budget.reserved == 0
    assert budget.remaining == Decimal(1) - budget.spent
    report = json.loads(
        subprocess.run(
            [sys.executable, "-m", "stayer.cli", "report", "py-anthropic", "--json"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "STAYER_HOME": str(tmp_path)},
        ).stdout
    )  # fmt: skip
    assert report["ledger"] == ledger and report == session.report()


def test_a_call_that_cannot_fit_raises_before_anything_is_sent(sim: str, tmp_path: Path) -> None:
    budget = stayer.Budget("0.01")
    session = stayer.Session(home=tmp_path)
    client = stayer.meter(
        anthropic.Anthropic(base_url=sim, api_key="sk-x"), budget=budget, session=session
    )
    with pytest.raises(stayer.BudgetExceeded, match="worst case"):
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=1000, system=SYSTEM,
            messages=[{"role": "user", "content": "hi"}],
        )  # fmt: skip
    assert budget.spent == 0 and budget.reserved == 0 and session.ledger == []
    # a call that fits only with fewer output tokens is sent with fewer
    small = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=4000, messages=[{"role": "user", "content": "hi"}]
    )
    assert small.content[0].text == "echo: hi"
    (entry,) = session.ledger
    assert entry["max_tokens"] < 4000 and budget.spent <= Decimal("0.01")
    tiny = stayer.Budget("0.0001")  # not even 256 output tokens of gpt-5
    oa = stayer.meter(openai.OpenAI(base_url=f"{sim}/v1", api_key="sk-x"), budget=tiny)
    with pytest.raises(stayer.BudgetExceeded):
        oa.chat.completions.create(
            model="gpt-5", max_completion_tokens=100_000,
            messages=[{"role": "user", "content": SYSTEM}],
        )  # fmt: skip


def test_openai_apis_and_async_clients_are_metered_alike(sim: str, tmp_path: Path) -> None:
    session = stayer.Session("py-openai", home=tmp_path)
    client = stayer.meter(openai.OpenAI(base_url=f"{sim}/v1", api_key="sk-x"), session=session)
    chat = client.chat.completions.create(
        model="gpt-5", messages=[{"role": "user", "content": "a"}]
    )
    chunks = list(
        client.chat.completions.create(
            model="gpt-5", messages=[{"role": "user", "content": "b"}], stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    response = client.responses.create(model="gpt-5", input="c")

    async def both() -> tuple[object, object]:
        a = stayer.meter(anthropic.AsyncAnthropic(base_url=sim, api_key="sk-x"), session=session)
        o = stayer.meter(openai.AsyncOpenAI(base_url=f"{sim}/v1", api_key="sk-x"), session=session)
        m = await a.messages.create(
            model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "d"}]
        )
        s = await o.responses.create(model="gpt-5", input="e", stream=True)
        async for _ in s:
            pass
        return m, s

    message, _ = asyncio.run(both())
    assert message.content[0].text == "echo: d"  # type: ignore[attr-defined]
    ledger = session.ledger
    assert [e["usage"]["input_tokens"] for e in ledger[:3]] == [
        chat.usage.prompt_tokens,
        chunks[-1].usage.prompt_tokens,
        response.usage.input_tokens,
    ]
    assert len(ledger) == 5 and all(e["complete"] for e in ledger)


def test_a_stream_left_early_is_read_to_its_end_and_priced(sim: str, tmp_path: Path) -> None:
    session = stayer.Session(home=tmp_path)
    client = stayer.meter(anthropic.Anthropic(base_url=sim, api_key="sk-x"), session=session)
    long = "word " * 400
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=2000, messages=[{"role": "user", "content": long}]
    ) as stream:
        next(iter(stream))  # one event, then gone
    (entry,) = session.ledger
    # message_start said 1 output token; only the end of the stream says the rest
    assert entry["complete"] and entry["usage"]["output_tokens"] > 1


def test_fifty_threads_never_overshoot_one_budget(sim: str, store: str, tmp_path: Path) -> None:
    cap = Decimal("0.02")
    budget = stayer.Budget(cap, store=store, name=f"team-{uuid.uuid4().hex[:8]}")
    session = stayer.Session(home=tmp_path)
    client = stayer.meter(
        anthropic.Anthropic(base_url=sim, api_key="sk-x", max_retries=0),
        budget=budget,
        session=session,
    )

    def call(i: int) -> str:
        try:
            client.messages.create(
                model="claude-sonnet-4-5", max_tokens=300,
                messages=[{"role": "user", "content": f"call {i} " + "word " * 200}],
            )  # fmt: skip
            return "ok"
        except stayer.BudgetExceeded:
            return "refused"

    with ThreadPoolExecutor(50) as pool:
        outcomes = list(pool.map(call, range(100)))
    assert "ok" in outcomes and "refused" in outcomes
    assert budget.spent <= cap and budget.reserved == 0
    assert len(session.ledger) == outcomes.count("ok") and session.cost == budget.spent


def _worker(budget: str, max_tokens: int, pad: int, refusal: str = "") -> str:
    """A process's script: up to n calls metered under the shared ``Budget(BUDGET, ...)``,
    each refusal naming ``refusal``; prints the calls made and their cost."""
    return textwrap.dedent(
        f"""
        import sys
        import anthropic, stayer
        sim, store, name, home, n = sys.argv[1:6]
        budget = stayer.Budget({budget}, store=store, name=name)
        session = stayer.Session(home=home)
        client = stayer.meter(anthropic.Anthropic(base_url=sim, api_key="sk-x", max_retries=0),
                              budget=budget, session=session)
        ok = 0
        for i in range(int(n)):
            try:
                client.messages.create(model="claude-sonnet-4-5", max_tokens={max_tokens},
                                       messages=[{{"role": "user",
                                                   "content": f"p{{i}} " + "w " * {pad}}}])
                ok += 1
            except stayer.BudgetExceeded as e:
                assert {refusal!r} in str(e), e
        print(ok, session.cost if ok else 0)
        """
    )


def _in_ten_processes(
    worker: str, sim: str, store: str, name: str, tmp_path: Path, calls: int
) -> list[list[str]]:
    """``worker`` run by 10 processes at once on one budget; what each printed, split."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", worker, sim, store, name, str(tmp_path / f"h{i}"), str(calls)],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(10)
    ]
    printed = [p.communicate(timeout=300)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return printed


def test_ten_processes_never_overshoot_one_budget(sim: str, store: str, tmp_path: Path) -> None:
    name = f"shared-{uuid.uuid4().hex[:8]}"
    printed = _in_ten_processes(_worker('"0.02"', 300, 200), sim, store, name, tmp_path, 6)
    made = sum(int(ok) for ok, _ in printed)
    budget = stayer.Budget("0.02", store=store, name=name)
    assert 0 < made < 60 and budget.spent <= Decimal("0.02") and budget.reserved == 0
    assert sum(Decimal(cost) for _, cost in printed) == budget.spent  # exact, to the digit


def _ask(client: anthropic.Anthropic, i: int) -> str:
    try:
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=50,
            messages=[{"role": "user", "content": f"step {i}"}],
        )  # fmt: skip
        return "ok"
    except stayer.BudgetExceeded:
        return "refused"


def test_fifty_threads_never_exceed_max_steps(sim: str, store: str, tmp_path: Path) -> None:
    budget = stayer.Budget("5", max_steps=7, store=store, name=f"s-{uuid.uuid4().hex[:8]}")
    session = stayer.Session(home=tmp_path)
    client = stayer.meter(
        anthropic.Anthropic(base_url=sim, api_key="sk-x", max_retries=0),
        budget=budget, session=session,
    )  # fmt: skip
    with ThreadPoolExecutor(50) as pool:
        outcomes = list(pool.map(lambda i: _ask(client, i), range(60)))
    assert outcomes.count("ok") == 7 and budget.steps == 7 and budget.remaining_steps == 0
    assert len(session.ledger) == 7 and session.cost == budget.spent
    assert isinstance(budget.spent, Decimal) and budget.remaining == Decimal(5) - budget.spent
    assert budget.reserved == 0


def test_ten_processes_never_exceed_max_steps(sim: str, store: str, tmp_path: Path) -> None:
    name = f"steps-{uuid.uuid4().hex[:8]}"
    printed = _in_ten_processes(
        _worker('"5", max_steps=13', 50, 0, "max_steps"), sim, store, name, tmp_path, 3
    )
    budget = stayer.Budget("5", max_steps=13, store=store, name=name)
    assert sum(int(ok) for ok, _ in printed) == 13 == budget.steps
    assert sum(Decimal(cost) for _, cost in printed) == budget.spent and budget.reserved == 0


def test_steps_are_carved_and_given_back_like_dollars(sim: str, tmp_path: Path) -> None:
    parent = stayer.Budget("1", max_steps=5)
    with pytest.raises(stayer.BudgetExceeded, match="cannot spare 6 steps"):
        parent.child("0.1", max_steps=6)
    assert parent.remaining == Decimal(1)  # the dollars of a refused child came back
    with pytest.raises(stayer.ConfigError, match="max_steps"):
        parent.child("0.1")
    child = parent.child("0.5", max_steps=2)
    assert parent.remaining_steps == 3 and child.remaining_steps == 2
    client = stayer.meter(
        anthropic.Anthropic(base_url=sim, api_key="sk-x", max_retries=0),
        budget=child, session=stayer.Session(home=tmp_path),
    )  # fmt: skip
    assert [_ask(client, i) for i in range(3)] == ["ok", "ok", "refused"]
    child.close()
    assert parent.steps == 2 and parent.remaining_steps == 3
    assert parent.spent == child.spent > 0


def test_bad_input_to_the_library_is_refused_in_one_line() -> None:
    from stayer.errors import ConfigError

    with pytest.raises(TypeError, match="anthropic or openai client"):
        stayer.meter(object())
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(ConfigError, match="Budget"):
            stayer.Budget(bad)
    for steps in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigError, match="max_steps"):
            stayer.Budget(max_steps=steps)  # type: ignore[arg-type]
    parent = stayer.Budget("1")
    with pytest.raises(stayer.BudgetExceeded, match="cannot spare"):
        parent.child("2")
    child = parent.child("0.25")
    assert parent.remaining == Decimal("0.75") and child.remaining == Decimal("0.25")
    child.close()
    assert parent.remaining == Decimal(1)


def test_a_session_s_ledger_is_ledger_entry_records(sim: str, tmp_path: Path) -> None:
    from stayer.ledger import LedgerEntry

    session = stayer.Session(home=tmp_path)
    client = stayer.meter(anthropic.Anthropic(base_url=sim, api_key="sk-x"), session=session)
    client.messages.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    )
    (entry,) = session.ledger
    assert isinstance(entry, LedgerEntry) and entry.cost.total == session.cost > 0
    assert entry["cost_usd"] == str(session.cost) and entry == session.report()["ledger"][0]
    assert session.cache_breaks == [e.cache_break for e in session.ledger if e.cache_break]
