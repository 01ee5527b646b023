"""Resume after a crash: in-process crashes at chosen instants (both stores), and the
``resume`` / ``runs`` / ``report`` commands with their bad-input cases.

The random-SIGKILL suite is ``test_resume_faults.py`` (marked slow)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from pg_server import database_fixture

from stayer.errors import ConfigError
from stayer.eval.resume import prepare_resume
from stayer.journal import (
    JournaledModel,
    JournaledTool,
    JournalError,
    LeaseLost,
    ReplayDiverged,
    RunFinished,
    RunJournal,
    load_log,
    open_store,
)
from stayer.models.base import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec
from stayer.models.sim import SimModel
from stayer.models.sim_policies import filler
from stayer.pricing import PriceBook
from stayer.run import RunSettings, execute, prepare
from stayer.sandbox.locate import locate_bwrap
from stayer.tools.base import ToolContext, ToolResult
from stayer.usage import Usage

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
needs_bwrap = pytest.mark.skipif(locate_bwrap() is None, reason="bubblewrap not installed")


class Crash(BaseException):
    """Stands for the process dying: nothing in the loop catches it."""


@dataclass
class WorkPolicy:
    """``steps`` steps of real shell work in the workspace (relative paths, so the local
    sandbox runs it), then submit."""

    steps: int

    def next_message(self, request: ModelRequest) -> Message:
        step = 1 + sum(1 for m in request.messages if m.role == "assistant")
        if step > self.steps:
            call = ToolCall(f"c{step}", "submit", json.dumps({"summary": "done"}))
            return Message(role="assistant", content="Done.", tool_calls=(call,))
        text = filler(120, random.Random(step))
        command = f"printf 'work {step} %s\\n' '{text[:80]}' >> log.txt && mkdir -p d && echo {step} > d/s{step % 3} && wc -l < log.txt"
        call = ToolCall(f"c{step}", "bash", json.dumps({"command": command}))
        return Message(role="assistant", content=f"work step {step}: {text}", tool_calls=(call,))


class ProviderCalls:
    """The simulated provider, counting the calls that reach it; ``crash_at`` (1-based,
    this process's calls) dies while that call is in flight."""

    def __init__(self, inner: SimModel, crash_at: int | None = None) -> None:
        self.inner, self.crash_at, self.calls = inner, crash_at, 0
        self.spec, self.provider, self.model_id = inner.spec, inner.provider, inner.model_id

    def account(self, request: ModelRequest) -> object:
        return self.inner.account(request)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls == self.crash_at:
            await asyncio.sleep(0)
            raise Crash(f"killed during model call {self.calls}")
        return await self.inner.complete(request)


def make_task(tmp: Path) -> Path:
    task = tmp / "task"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("Do the work, one step at a time.\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "environment" / "seed.txt").write_text("seed\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    return task


def tree(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


@pytest.fixture(params=["sqlite", "postgres"])
def env(request, tmp_path, monkeypatch):
    """STAYER_HOME (and STAYER_DB) for one test, plus a task."""
    monkeypatch.setenv("STAYER_HOME", str(tmp_path / "home"))
    if request.param == "postgres":
        monkeypatch.setenv("STAYER_DB", request.getfixturevalue("pg_url"))
    else:
        monkeypatch.delenv("STAYER_DB", raising=False)
    return make_task(tmp_path)


pg_url = database_fixture()


STEPS = 12


def _model(prepared, crash_at=None) -> ProviderCalls:
    return ProviderCalls(
        SimModel("claude-sonnet-4-5", WorkPolicy(STEPS), prepared.counter), crash_at
    )


def start(task: Path, run_id: str, crash_at=None, crash_on_step=None):
    """Run ``run_id`` from the start; returns (doc or None if it crashed, provider)."""
    prepared = prepare(
        RunSettings(
            str(task),
            "sim:claude-sonnet-4-5",
            max_steps=30,
            run_id=run_id,
            sim_policy="synthetic:steps=1",
            sandbox="local",
        )
    )
    prepared.model = provider = _model(prepared, crash_at)
    return _drive(prepared, None, crash_on_step), provider


def resume(run_id: str, crash_at=None):
    prepared, journal = prepare_resume(run_id)
    prepared.model = provider = _model(prepared, crash_at)
    return _drive(prepared, journal, None), provider


def _drive(prepared, journal, crash_on_step):
    def on_step(entry):
        if entry.step == crash_on_step:
            raise Crash(f"killed after step {entry.step}, before its events were flushed")

    try:
        return asyncio.run(execute(prepared, on_step=on_step, journal=journal))
    except Crash:
        return None  # (the loop gave its lease up on the way out; a killed one cannot)


def rid(name: str) -> str:
    """A run id unique across tests (the Postgres database is shared by the module)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def usage_by_step(doc) -> list[tuple[int, dict]]:
    return [(e["step"], e["usage"]) for e in doc["ledger"] if e.get("kind") != "lost_in_flight"]


def journal_events(run_id: str):
    store = open_store(Path(os.environ["STAYER_HOME"]))
    try:
        return store.events(run_id)
    finally:
        store.close()


def assert_same_run(doc, base, home: Path):
    for key in ("status", "reward", "steps", "stop_reason"):
        assert doc[key] == base[key], key
    assert usage_by_step(doc) == usage_by_step(base)
    assert tree(home / "runs" / doc["run_id"] / "workspace") == tree(
        home / "runs" / base["run_id"] / "workspace"
    )
    finished = [e.data["n"] for e in journal_events(doc["run_id"]) if e.kind == "model_finished"]
    assert sorted(finished) == list(range(len(finished)))  # no completed call twice
    lost = [e for e in doc["ledger"] if e.get("kind") == "lost_in_flight"]
    u = doc["usage"]
    assert u["input_tokens"] == sum(e["usage"]["input_tokens"] for e in doc["ledger"])
    expected = Decimal(base["cost_usd"]) + sum(Decimal(e["cost_usd"]) for e in lost)
    assert Decimal(doc["cost_usd"]) == expected
    return lost


def test_crash_mid_model_call_resumes_exactly_and_records_the_lost_call(env):
    base_id = rid("base")
    k = rid("k")
    home = Path(os.environ["STAYER_HOME"])
    base, _ = start(env, base_id)
    assert base["steps"] == STEPS + 1
    crashed, provider = start(env, k, crash_at=6)
    assert crashed is None and provider.calls == 6
    doc, provider = resume(k)
    lost = assert_same_run(doc, base, home)
    # Calls 1-5 came from the journal; the 6th was issued again once, then the rest.
    assert provider.calls == base["steps"] - 5
    assert len(lost) == 1 and lost[0]["step"] == 6 and lost[0]["estimated"] is True
    step6 = next(e for e in doc["ledger"] if e["step"] == 6 and e.get("kind") != "lost_in_flight")
    assert lost[0]["usage"] == step6["usage"] and lost[0]["cost_usd"] == step6["cost_usd"]
    started = [e.data["n"] for e in journal_events(k) if e.kind == "model_started"]
    assert started.count(5) == 2 and len(started) == base["steps"] + 1
    # The replayed history is the whole conversation again (replay:PATH reads it).
    trajectory = (home / "runs" / k / "trajectory.jsonl").read_text().splitlines()
    assert trajectory == (home / "runs" / base_id / "trajectory.jsonl").read_text().splitlines()


def test_the_live_total_of_a_resumed_run_is_its_final_cost(env):
    """``stayer resume``'s step lines count the call lost at the crash, as the result does
    (before: the last line's total left it out: $0.176088 against $0.184262)."""
    import io

    from rich.console import Console

    from stayer.cli.common import usd
    from stayer.cli.run import step_printer

    k = rid("k")
    crashed, _ = start(env, k, crash_at=6)
    assert crashed is None
    prepared, journal = prepare_resume(k)
    prepared.model = _model(prepared)
    out = io.StringIO()
    printer = step_printer(Console(file=out, width=400), journal.lost)
    doc = asyncio.run(execute(prepared, on_step=printer, journal=journal))
    lines = out.getvalue().splitlines()
    assert any("lost in flight" in line for line in lines)
    assert f"total {usd(Decimal(doc['cost_usd']))} " in lines[-1]
    lost = sum(Decimal(e["cost_usd"]) for e in doc["ledger"] if e.get("kind") == "lost_in_flight")
    assert lost > 0 and f"total {usd(Decimal(doc['cost_usd']) - lost)} " not in lines[-1]
    assert any(e.get("kind") == "lost_in_flight" for e in doc["ledger"])


def test_crash_before_a_step_is_flushed_re_executes_its_tools_not_its_model_call(env):
    base_id = rid("base")
    k = rid("k")
    home = Path(os.environ["STAYER_HOME"])
    base, _ = start(env, base_id)
    crashed, _ = start(env, k, crash_on_step=7)
    assert crashed is None
    kinds = [e.kind for e in journal_events(k)]
    assert kinds.count("model_finished") == 7 and kinds.count("step") == 6  # step 7 was not flushed
    doc, provider = resume(k)
    assert assert_same_run(doc, base, home) == []
    assert provider.calls == base["steps"] - 7  # step 7's reply came from the journal


def test_two_crashes_then_resume(env):
    base_id = rid("base")
    k = rid("k")
    home = Path(os.environ["STAYER_HOME"])
    base, _ = start(env, base_id)
    assert start(env, k, crash_at=3)[0] is None
    assert resume(k, crash_at=5)[0] is None  # dies again, at run call 2 + 5 = 7
    doc, _ = resume(k)
    lost = assert_same_run(doc, base, home)
    assert [e["step"] for e in lost] == [3, 7]
    log = load_log(open_store(home), k)
    assert log.resumes == 2


def test_torn_last_write_resumes_from_the_last_complete_event(env):
    base_id = rid("base")
    k = rid("k")
    home = Path(os.environ["STAYER_HOME"])
    base, _ = start(env, base_id)
    start(env, k, crash_on_step=5)
    # The last complete model reply's blob is cut short, as by a torn write.
    store = open_store(home)
    last = [e for e in store.events(k) if e.kind == "model_finished"][-1]
    with store._tx() as cur:
        cur.execute(
            "UPDATE stayer_blobs SET data = ? WHERE hash = ?", (b"\x00torn", last.data["message"])
        )
    store.close()
    doc, provider = resume(k)
    lost = assert_same_run(doc, base, home)
    # The reply was lost with the torn write: call 5 is issued again and counted as lost.
    assert [e["step"] for e in lost] == [5] and provider.calls == base["steps"] - 4


def test_a_changed_task_is_refused_rather_than_resumed_inexactly(env):
    k = rid("k")
    start(env, k, crash_at=4)
    (env / "instruction.md").write_text("Something else entirely.\n")
    with pytest.raises(ReplayDiverged, match="replay diverged at model call 1"):
        resume(k)


def test_finished_unknown_and_held_runs(env):
    base_id = rid("base")
    k = rid("k")
    base, _ = start(env, base_id)
    with pytest.raises(RunFinished) as finished:
        prepare_resume(base_id)
    assert finished.value.result == base
    with pytest.raises(JournalError, match="no such run"):
        prepare_resume("nope")
    start(env, k, crash_at=3)
    prepared, journal = prepare_resume(k)  # this session now holds the lease
    with pytest.raises(JournalError, match="being run by another process"):
        prepare_resume(k)
    journal.release()
    prepared.store.close()


class Provider:
    spec, provider, model_id = "sim:claude-sonnet-4-5", "anthropic", "claude-sonnet-4-5"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        reply = Message("assistant", f"child says {request.messages[-1].content}")
        return ModelResponse(reply, Usage(input_tokens=50, output_tokens=5), {}, self.model_id, 0.0)


class Touch:
    """A plain tool: appends to a workspace file."""

    spec = ToolSpec(
        "touch", "append", {"type": "object", "properties": {"task": {"type": "string"}}}
    )

    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self, args: dict, ctx: ToolContext) -> ToolResult:
        self.runs += 1
        with open(Path(ctx.workspace) / "touched", "a") as f:
            f.write(args["task"] + "\n")
        return ToolResult(f"touched {args['task']}")


class Delegate:
    """A tool that makes calls of its own, like a sub-agent: a model call and a tool call,
    and an effect on the agent (``adopted``) besides its result."""

    spec = ToolSpec(
        "delegate", "delegate", {"type": "object", "properties": {"task": {"type": "string"}}}
    )

    def __init__(self, model, touch) -> None:  # noqa: ANN001
        self.model, self.touch, self.adopted = model, touch, []

    async def __call__(self, args: dict, ctx: ToolContext) -> ToolResult:
        reply = await self.model.complete(
            ModelRequest("child", [], [Message("user", args["task"])])
        )
        done = await self.touch(args, ctx)
        self.adopted.append(reply.message.content)
        return ToolResult(f"{reply.message.content}; {done.output}")


def test_a_tool_with_calls_of_its_own_is_replayed_not_skipped(tmp_path):
    store, ws, prices = open_store(tmp_path / "home", ""), tmp_path / "ws", PriceBook.load()
    ws.mkdir()
    ctx = ToolContext(sandbox=None, workspace=str(ws))  # type: ignore[arg-type]

    def wire(journal):  # noqa: ANN001, ANN202
        provider, touch = Provider(), Touch()
        touch_j = JournaledTool(touch, journal)
        delegate = Delegate(JournaledModel(provider, journal), touch_j)
        return provider, touch, delegate, JournaledTool(delegate, journal)

    first = RunJournal.create(store, "d", {"task": "t", "model": "m"}, ws, prices)
    first.take_snapshot(0)
    provider, touch, delegate, tool = wire(first)
    outputs = [(asyncio.run(tool({"task": "one"}, ctx))).output]
    first.take_snapshot(1)
    outputs.append(asyncio.run(tool({"task": "two"}, ctx)).output)
    first.flush()
    first.release()  # and the process dies
    assert provider.calls == 2 and touch.runs == 2

    row, log = RunJournal.load(store, "d")
    again = RunJournal.reopen(store, row, log, ws, prices)
    again.restore_workspace(lambda path: None)
    provider, touch, delegate, tool = wire(again)
    replayed = [asyncio.run(tool({"task": t}, ctx)).output for t in ("one", "two")]
    assert replayed == outputs
    assert delegate.adopted == ["child says one", "child says two"]  # its effects, again
    assert provider.calls == 0  # both nested model calls came from the journal
    assert touch.runs == 1  # the nested plain tool ran again only after the snapshot
    assert (ws / "touched").read_text() == "one\ntwo\n"
    assert asyncio.run(tool({"task": "three"}, ctx)).output == "child says three; touched three"
    assert provider.calls == 1
    store.close()


# --- the commands -------------------------------------------------------------------


def stayer(
    *args: str, home: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    full_env = {
        k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"
    }
    full_env.update({"STAYER_HOME": str(home)}, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=home.parent,
        timeout=timeout,
    )


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def gated_trajectory(path: Path, gate: Path, started: Path) -> Path:
    """A recorded run for ``replay:``: three plain steps, then one whose command waits for
    ``gate`` to exist (after creating ``started``), then two more. The killed run blocks
    there for as long as the test needs, however slow the machine: no race with its work."""
    commands = [
        "echo one",
        "echo two",
        "echo three",
        f"touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done; echo gate open",
        "echo five",
        "echo six",
    ]
    lines = [
        json.dumps(
            {
                "role": "assistant",
                "content": f"step {i}",
                "tool_calls": [
                    {"id": f"c{i}", "name": "bash", "arguments": json.dumps({"command": c})}
                ],
            }
        )
        for i, c in enumerate(commands, 1)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_killed_run_shows_as_interrupted_then_resumes_with_the_same_result(tmp_path):
    home = tmp_path / "home"
    gate, started = tmp_path / "gate", tmp_path / "started"
    trajectory = gated_trajectory(tmp_path / "trajectory.jsonl", gate, started)
    # --sandbox local: the command must see the gate on the host (the journal is the subject here)
    args = [
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:gpt-5",
        "--json",
        "--sandbox",
        "local",
        "--sim-policy",
        f"replay:{trajectory}",
        "--command-timeout",
        "3600",
    ]
    gate.touch()
    base = json.loads(stayer(*args, "--run-id", "base", home=home).stdout)
    assert base["steps"] == 7  # six commands and the submission
    gate.unlink()
    started.unlink()
    env = {k: v for k, v in os.environ.items() if k != "STAYER_DB"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stayer.cli", *args, "--run-id", "k"],
        cwd=tmp_path,
        env={**env, "STAYER_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not started.exists():  # step 4's command is running: steps 1-3 are journaled
            assert proc.poll() is None, "the run ended before reaching the gate"
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    gate.touch()  # lets the orphaned command, and the resumed run's, go on
    listed = {r["id"]: r for r in json.loads(stayer("runs", "--json", home=home).stdout)["runs"]}
    assert listed["k"]["status"] == "interrupted" and listed["base"]["status"] == "failed"
    assert set(listed["k"]) == {
        "id",
        "task",
        "model",
        "status",
        "steps",
        "cost_usd",
        "started",
        "updated",
    }
    partial = json.loads(stayer("report", "k", "--json", home=home).stdout)
    assert partial["status"] == "interrupted" and 3 <= len(partial["ledger"]) < base["steps"]
    r = stayer("resume", "k", "--json", home=home)
    assert r.returncode == 1, r.stderr  # this work does not pass the verifier: failed, as base
    doc = json.loads(r.stdout)
    assert set(doc) == set(base)
    assert (doc["status"], doc["reward"], doc["steps"]) == (
        base["status"],
        base["reward"],
        base["steps"],
    )
    assert usage_by_step(doc) == usage_by_step(base)
    report = json.loads(stayer("report", "k", "--json", home=home).stdout)
    assert report["status"] == "failed" and report["totals"]["cost_usd"] == doc["cost_usd"]
    assert [e["usage"] for e in report["ledger"]] == [e["usage"] for e in doc["ledger"]]
    assert report["journal"]["resumes"] == 1
    # The resumed run's trajectory is complete: it replays like any other recorded run.
    replayed = stayer(
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:gpt-5",
        "--json",
        "--sandbox",
        "local",
        "--sim-policy",
        f"replay:{home / 'runs' / 'k'}",
        home=home,
    )
    assert json.loads(replayed.stdout)["steps"] == base["steps"]
    # Resuming a finished run says so in one line and prints its result (exit 0).
    again = stayer("resume", "k", "--json", home=home)
    assert again.returncode == 0 and "already finished" in one_line(again.stderr)
    assert json.loads(again.stdout) == doc
    human = stayer("report", "k", home=home)
    assert human.returncode == 0 and "total" in human.stdout


def test_bad_input_is_one_line_exit_2(tmp_path):
    home = tmp_path / "home"
    for cmd in (["resume", "nope"], ["report", "nope"]):
        r = stayer(*cmd, "--json", home=home)
        assert r.returncode == 2 and r.stdout == "" and "no such run" in one_line(r.stderr)
    assert not home.exists()  # nothing written
    r = stayer("runs", "--json", home=home)
    assert r.returncode == 0 and json.loads(r.stdout)["runs"] == []
    assert not home.exists()
    r = stayer("runs", "--limit", "0", home=home)
    assert r.returncode == 2 and "--limit" in one_line(r.stderr)

    home.mkdir()
    (home / "stayer.db").write_bytes(b"not a database" * 100)
    for cmd in (["resume", "x"], ["report", "x"], ["runs"]):
        r = stayer(*cmd, "--json", home=home)
        assert r.returncode == 2 and "cannot open the journal database" in one_line(r.stderr)

    newer = tmp_path / "newer"
    open_store(newer, "").close()
    con = sqlite3.connect(newer / "stayer.db")
    con.execute("UPDATE stayer_meta SET value = '7' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    for cmd in (
        ["resume", "x"],
        ["report", "x"],
        ["runs"],
        ["run", str(EXAMPLES / "hello-file"), "--model", "sim:gpt-5"],
    ):
        r = stayer(*cmd, "--json", home=newer)
        assert r.returncode == 2 and "schema version 7 is newer" in one_line(r.stderr)

    r = stayer("runs", "--json", home=home, env={"STAYER_DB": "postgresql://u:pw@127.0.0.1:1/x"})
    assert r.returncode == 2 and "cannot open the journal database" in one_line(r.stderr)
    assert "pw@" not in r.stderr
    r = stayer("runs", "--json", home=home, env={"STAYER_DB": "sqlite:///x"})
    assert r.returncode == 2 and "STAYER_DB" in one_line(r.stderr)


def test_config_error_names_the_run(env):
    """A run whose task directory has gone cannot be prepared again: one line, naming it."""
    start(env, "k", crash_at=3)
    shutil.rmtree(env)
    with pytest.raises(ConfigError, match=str(env)):
        prepare_resume("k")


def test_a_lost_call_is_held_and_charged_against_the_cap(env, monkeypatch):
    """The attempt in flight at the crash was billed: on resume the re-issued call holds the
    budget for both attempts, and both are charged, so the cap holds over the whole run."""
    from stayer.guard.guard import Guard

    holds = []
    original = Guard.reserve

    def spy(self, rates_at, prompt_tokens, cache_ttl="5m", attempts=1, **kw):
        holds.append(attempts)
        return original(self, rates_at, prompt_tokens, cache_ttl, attempts, **kw)

    monkeypatch.setattr(Guard, "reserve", spy)
    cap = Decimal("0.08")
    k = rid("cap")
    config = RunSettings(
        str(env),
        "sim:claude-sonnet-4-5",
        max_steps=30,
        run_id=k,
        max_cost=cap,
        sim_policy="synthetic:steps=1",
        sandbox="local",
    )
    prepared = prepare(config)
    prepared.model = _model(prepared, crash_at=4)
    assert _drive(prepared, None, None) is None
    holds.clear()
    doc, _ = resume(k)
    assert 2 in holds  # the re-issue of call 4 held two attempts' worst case
    lost = [e for e in doc["ledger"] if e.get("kind") == "lost_in_flight"]
    assert len(lost) == 1
    assert Decimal(doc["cost_usd"]) <= cap


def test_a_corrupt_shared_blob_is_reported_never_read_as_a_shorter_run_or_re_paid(env):
    """One blob both runs refer to (the same model reply) is damaged: report, resume and
    runs say which run and event, exit 2, and nothing is dropped or re-issued."""
    home = Path(os.environ["STAYER_HOME"])
    base_id, k = rid("base"), rid("k")
    start(env, base_id)
    assert start(env, k, crash_at=9)[0] is None
    store = open_store(home)
    events = store.events(k)
    reply = next(e for e in events if e.kind == "model_finished" and e.data["n"] == 2)
    assert reply.data["message"] in {e.data.get("message") for e in store.events(base_id)}  # shared
    with store._tx() as cur:
        cur.execute(
            "UPDATE stayer_blobs SET data = ? WHERE hash = ?",
            (b"\x00not the reply", reply.data["message"]),
        )
    store.close()
    db = {"STAYER_DB": os.environ.get("STAYER_DB", "")}
    for run_id in (k, base_id):
        r = stayer("report", run_id, "--json", home=home, env=db)
        assert r.returncode == 2 and r.stdout == "", r.stdout[:200]
        line = one_line(r.stderr)
        seq = next(
            e.seq for e in journal_events(run_id) if e.kind == "model_finished" and e.data["n"] == 2
        )
        assert f"run {run_id}: journal corrupt at event {seq} " in line and "model_finished" in line
    r = stayer("resume", k, "--json", home=home, env=db)
    assert (
        r.returncode == 2
        and r.stdout == ""
        and f"run {k}: journal corrupt at event {reply.seq} " in one_line(r.stderr)
    )
    with pytest.raises(JournalError, match="journal corrupt"):
        resume(k)  # in process: its provider would count any call
    assert [(e.seq, e.kind) for e in journal_events(k)] == [
        (e.seq, e.kind) for e in events
    ]  # nothing dropped
    r = stayer("runs", "--json", home=home, env=db)
    assert r.returncode == 2
    listed = {d["id"]: d["status"] for d in json.loads(r.stdout)["runs"]}
    assert listed[k] == listed[base_id] == "corrupt"
    assert {line.split(":")[1].strip() for line in r.stderr.splitlines() if "corrupt" in line} >= {
        f"run {k}",
        f"run {base_id}",
    }


def test_a_step_stopped_mid_way_is_kept_as_cut_short_and_replays_as_journaled(tmp_path):
    """A step whose model call was answered but that a stop (the agent time limit) cut
    short: its call is on the ledger, in the journal, and a replay reports it unchanged."""
    store, ws, prices = open_store(tmp_path / "home", ""), tmp_path / "ws", PriceBook.load()
    ws.mkdir()
    request = lambda: ModelRequest("system", [], [Message("user", "hi")])  # noqa: E731
    journal = RunJournal.create(store, "c", {"task": "t", "model": "m"}, ws, prices)
    assert journal.cut_short() is None  # no call made: nothing to keep
    asyncio.run(JournaledModel(Provider(), journal).complete(request()))
    entry = journal.cut_short()
    assert (entry["kind"], entry["step"], entry["model_calls"], entry["usage"]["input_tokens"]) == (
        "cut_short",
        1,
        1,
        50,
    )
    assert Decimal(entry["cost_usd"]) > 0 and journal.cost_text() == entry["cost_usd"]
    assert journal.cut_short() is None  # kept once
    journal.flush()
    journal.release()
    assert store.run("c").cost_usd == entry["cost_usd"]
    row, log = RunJournal.load(store, "c")
    assert log.steps[1] == entry
    again = RunJournal.reopen(store, row, log, ws, prices)
    provider = Provider()
    asyncio.run(JournaledModel(provider, again).complete(request()))
    assert (
        provider.calls == 0 and again.cut_short() == entry
    )  # the journaled step, not a second one
    store.close()


def test_a_lost_attempt_is_said_only_by_the_journal_that_wrote_it(tmp_path):
    """A rescuer whose lease lapses mid-call (a loaded machine) is taken over while its
    re-issued call is in flight. The new holder writes both lost attempts and says so; the
    old one, whose write is refused, says nothing: each line has its ledger entry."""
    store, ws, prices = open_store(tmp_path / "home", ""), tmp_path / "ws", PriceBook.load()
    ws.mkdir()
    request = lambda: ModelRequest("system", [], [Message("user", "hi")])  # noqa: E731
    header = {"task": "t", "model": "m"}
    # Owners on other hosts, leases of 0 s: each is taken over as a stalled one would be.
    stalled = RunJournal.create(store, "r", header, ws, prices, owner="h1:1:1:a", ttl_s=0)

    class Stalls(Provider):
        async def complete(self, request: ModelRequest) -> ModelResponse:
            raise Crash("stopped with call 1 in flight")

    with pytest.raises(Crash):
        asyncio.run(JournaledModel(Stalls(), stalled).complete(request()))  # attempt 1 lost

    def reopen(owner: str, said: list[str]) -> RunJournal:
        row, log = RunJournal.load(store, "r")
        return RunJournal.reopen(
            store, row, log, ws, prices, owner=owner, ttl_s=0, warn=said.append
        )

    said_by_first, said_by_second = [], []
    first = reopen("h2:2:2:b", said_by_first)

    class TakenOverMidCall(Provider):
        async def complete(self, request: ModelRequest) -> ModelResponse:
            second = reopen("h3:3:3:c", said_by_second)  # attempt 2, this one, is in flight
            await JournaledModel(Provider(), second).complete(request)
            return await super().complete(request)

    with pytest.raises(LeaseLost):
        asyncio.run(JournaledModel(TakenOverMidCall(), first).complete(request()))
    _row, log = RunJournal.load(store, "r")
    assert [c.attempt for c in log.lost] == [1, 2]
    assert len(said_by_second) == 2 and all("lost_in_flight" in line for line in said_by_second)
    assert said_by_first == []  # its lost entry was never written
    store.close()
