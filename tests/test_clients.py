"""Agents that no one here wrote, run for real against ``stayer sim serve``, directly and
through ``stayer gateway``: Claude Code (Anthropic Messages, streaming), Codex CLI (OpenAI
Responses, streaming), each made by a ``script:`` policy to run a shell command through its
own tool and then answer, and mini-swe-agent through LiteLLM on examples/hello-file. What
each reports of its own usage and cost must equal stayer's pricing and the gateway's ledger.

The CLIs come from npm, mini-swe-agent and LiteLLM from PyPI (.ci/run installs the pinned
versions under ``~/.cache/stayer-bench``); without them these tests skip, saying why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from service_helpers import listening, start_listening

from stayer.pricing import PriceBook
from stayer.usage import Usage

AGENTS = Path(os.environ.get("STAYER_AGENTS_DIR", Path.home() / ".cache/stayer-bench/agents"))
CLAUDE = AGENTS / "node_modules/.bin/claude"
CODEX = AGENTS / "node_modules/.bin/codex"
# mini-swe-agent and LiteLLM (PyPI, pinned) in a venv of their own: .ci/run makes it
MINI = Path(os.environ.get("STAYER_MINI_SWE_AGENT", AGENTS.parent / "mini-swe-agent/venv/bin/mini"))
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _ledger(stayer: Callable[..., str], session: str, steps: int) -> dict[str, Any]:
    """``stayer report SESSION --json`` once its ``steps`` calls are on the ledger (a call
    is journaled after the gateway has answered it: a condition, not a delay)."""
    deadline = time.monotonic() + 120
    while (doc := json.loads(stayer("report", session, "--json")))["steps"] < steps:
        assert time.monotonic() < deadline, (session, doc["steps"], steps)
        time.sleep(0.2)
    return doc  # type: ignore[no-any-return]


def _stayer_home(tmp_path: Path) -> tuple[dict[str, str], Callable[..., str]]:
    """An environment with a STAYER_HOME of its own (SQLite, no provider key), and
    ``stayer ARGS`` run in it: its stdout, exit 0 asserted."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(STAYER_HOME=str(tmp_path / "stayer"), COLUMNS="300")
    env.pop("STAYER_DB", None)

    def stayer(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "stayer.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    return env, stayer


def _needs(binary: Path) -> None:
    if not binary.exists() or shutil.which("node") is None:
        pytest.skip(f"{binary.name} not installed: .ci/run installs it with npm into {AGENTS}")


@pytest.fixture
def sim(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    script = tmp_path / "turns.yaml"
    script.write_text(request.param)
    with listening(["sim", "serve", "--port", "0", "--policy", f"script:{script}"]) as url:
        yield url


CLAUDE_SCRIPT = """
- tool: Bash
  input: {command: "echo made-by-claude > out.txt", description: "write a file"}
- text: I wrote out.txt.
"""


@pytest.mark.parametrize("sim", [CLAUDE_SCRIPT], indirect=True)
def test_claude_code_runs_a_bash_tool_and_prices_as_stayer_does(sim: str, tmp_path: Path) -> None:
    _needs(CLAUDE)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": sim,
        "ANTHROPIC_API_KEY": "sk-test-not-a-key",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    done = subprocess.run(
        [str(CLAUDE), "-p", "Write a file.", "--output-format", "json", "--allowedTools", "Bash",
         "--model", "claude-sonnet-4-5"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["result"] == "I wrote out.txt." and result["num_turns"] == 2
    assert (work / "out.txt").read_text() == "made-by-claude\n"
    u = result["usage"]
    assert u["cache_read_input_tokens"] > 0  # its second call read what its first wrote
    usage = Usage(
        input_tokens=u["input_tokens"]
        + u["cache_read_input_tokens"]
        + u["cache_creation_input_tokens"],
        cache_read_tokens=u["cache_read_input_tokens"],
        cache_write_5m_tokens=u["cache_creation"]["ephemeral_5m_input_tokens"],
        cache_write_1h_tokens=u["cache_creation"]["ephemeral_1h_input_tokens"],
        output_tokens=u["output_tokens"],
    )
    cost = PriceBook.load().cost(usage, "claude-sonnet-4-5", "anthropic")
    assert cost.total is not None
    assert Decimal(str(result["total_cost_usd"])).quantize(Decimal("1e-9")) == cost.total.quantize(
        Decimal("1e-9")
    )


CODEX_SCRIPT = """
- tool: exec_command
  input: {cmd: "echo made-by-codex > note.txt"}
- text: Wrote note.txt.
"""


@pytest.mark.parametrize("sim", [CODEX_SCRIPT], indirect=True)
def test_codex_runs_its_exec_command_tool_through_the_responses_api(
    sim: str, tmp_path: Path
) -> None:
    _needs(CODEX)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    provider = f'{{name="sim",base_url="{sim}/v1",env_key="OPENAI_API_KEY",wire_api="responses"}}'
    done = subprocess.run(
        [str(CODEX), "exec", "--json", "--skip-git-repo-check",
         "--dangerously-bypass-approvals-and-sandbox",  # its own sandbox needs helpers off /tmp
         "-c", "model_provider=sim", "-c", f"model_providers.sim={provider}",
         "-m", "gpt-5", "Write a note."],
        cwd=work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        env={"PATH": os.environ["PATH"], "HOME": str(home), "OPENAI_API_KEY": "sk-test"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    said = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert said == ["Wrote note.txt."]
    assert (work / "note.txt").read_text() == "made-by-codex\n"
    (usage,) = [e["usage"] for e in events if e["type"] == "turn.completed"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0


@pytest.mark.parametrize("sim", [CODEX_SCRIPT], indirect=True)
def test_codex_through_the_gateway_matches_its_session_ledger(sim: str, tmp_path: Path) -> None:
    """Codex's own ``turn.completed`` usage equals the gateway's ledger of its session,
    token for token; the gateway files it under the ``session-id`` header Codex sends,
    which is the ``thread_id`` of its ``thread.started`` event."""
    _needs(CODEX)
    env, stayer = _stayer_home(tmp_path)

    key = json.loads(stayer("tenants", "create", "dev", "--max-cost", "5", "--json"))["api_key"]
    gw, url = start_listening(["gateway", "--port", "0", "--upstream", f"openai={sim}"], env)
    try:
        work, home = tmp_path / "work", tmp_path / "home"
        work.mkdir()
        home.mkdir()
        provider = (
            f'{{name="gw",base_url="{url}/v1",env_key="OPENAI_API_KEY",wire_api="responses"}}'
        )
        done = subprocess.run(
            [str(CODEX), "exec", "--json", "--skip-git-repo-check",
             "--dangerously-bypass-approvals-and-sandbox",
             "-c", "model_provider=gw", "-c", f"model_providers.gw={provider}",
             "-m", "gpt-5", "Write a note."],
            cwd=work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
            env={"PATH": os.environ["PATH"], "HOME": str(home), "OPENAI_API_KEY": key},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        events = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
        assert (work / "note.txt").read_text() == "made-by-codex\n"
        (thread,) = [e["thread_id"] for e in events if e["type"] == "thread.started"]
        runs = json.loads(stayer("runs", "--json"))
        report = _ledger(stayer, thread, 2)
    finally:
        gw.terminate()
        gw.wait(timeout=60)
    # one session, named by Codex's own id: not by the key, not one per call
    assert [r["id"] for r in runs["runs"]] == [thread], runs
    (usage,) = [e["usage"] for e in events if e["type"] == "turn.completed"]
    totals = report["totals"]["usage"]
    assert report["steps"] == 2  # the tool call, then the answer
    assert totals["input_tokens"] == usage["input_tokens"] > 0
    assert totals["cache_read_tokens"] == usage["cached_input_tokens"] > 0
    assert totals["output_tokens"] == usage["output_tokens"] > 0
    assert totals["reasoning_tokens"] == usage.get("reasoning_output_tokens", 0)
    # priced as stayer prices gpt-5: $1.25/M uncached input, $0.125/M cached, $10/M output
    expected = (
        Decimal(usage["input_tokens"] - usage["cached_input_tokens"]) * Decimal("1.25")
        + Decimal(usage["cached_input_tokens"]) * Decimal("0.125")
        + Decimal(usage["output_tokens"]) * 10
    ) / 1_000_000
    assert Decimal(report["totals"]["cost_usd"]) == expected


@pytest.mark.parametrize("sim", [CODEX_SCRIPT], indirect=True)
def test_codex_shows_a_budget_refusal_at_once_and_does_not_retry_it(
    sim: str, tmp_path: Path
) -> None:
    """A call the tenant's cap cannot hold is refused in the Responses API's error shape,
    with a status Codex shows as it is and does not retry (it retries a 402 five times)."""
    _needs(CODEX)
    env, stayer = _stayer_home(tmp_path)
    key = json.loads(stayer("tenants", "create", "poor", "--max-cost", "0.001", "--json"))[
        "api_key"
    ]
    gw, url = start_listening(["gateway", "--port", "0", "--upstream", f"openai={sim}"], env)
    try:
        work, home = tmp_path / "work", tmp_path / "home"
        work.mkdir()
        home.mkdir()
        provider = (
            f'{{name="gw",base_url="{url}/v1",env_key="OPENAI_API_KEY",wire_api="responses"}}'
        )
        done = subprocess.run(
            [str(CODEX), "exec", "--json", "--skip-git-repo-check",
             "--dangerously-bypass-approvals-and-sandbox",
             "-c", "model_provider=gw", "-c", f"model_providers.gw={provider}",
             "-m", "gpt-5", "Write a note."],
            cwd=work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
            env={"PATH": os.environ["PATH"], "HOME": str(home), "OPENAI_API_KEY": key},
        )  # fmt: skip
    finally:
        gw.terminate()
        gw.wait(timeout=60)
    events = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
    retries = [
        e["message"] for e in events if e["type"] == "error" and "Reconnecting" in e["message"]
    ]
    assert retries == []
    (failed,) = [e["error"]["message"] for e in events if e["type"] == "turn.failed"]
    assert "worst case does not fit" in failed and "tenant:poor" in failed
    assert done.returncode == 1 and not (work / "note.txt").exists()


@pytest.mark.parametrize("sim", [CLAUDE_SCRIPT], indirect=True)
def test_claude_code_through_the_gateway_matches_its_session_ledger(
    sim: str, tmp_path: Path
) -> None:
    """Claude Code's own usage and cost equal the gateway's ledger of its session, token
    for token; the ledger is found by the session id Claude Code sends."""
    _needs(CLAUDE)
    env, stayer = _stayer_home(tmp_path)

    key = json.loads(stayer("tenants", "create", "dev", "--max-cost", "5", "--json"))["api_key"]
    gw, url = start_listening(["gateway", "--port", "0", "--upstream", f"anthropic={sim}"], env)
    try:
        work, home = tmp_path / "work", tmp_path / "home"
        work.mkdir()
        home.mkdir()
        done = subprocess.run(
            [str(CLAUDE), "-p", "Write a file.", "--output-format", "json",
             "--allowedTools", "Bash", "--model", "claude-sonnet-4-5"],
            cwd=work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
            env={"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": url,
                 "ANTHROPIC_API_KEY": key, "DISABLE_TELEMETRY": "1",
                 "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        result = json.loads(done.stdout)
        assert (work / "out.txt").read_text() == "made-by-claude\n"
        report = _ledger(stayer, result["session_id"], result["num_turns"])
    finally:
        gw.terminate()
        gw.wait(timeout=60)
    u, totals = result["usage"], report["totals"]
    assert report["steps"] == result["num_turns"] == 2
    assert totals["usage"]["cache_read_tokens"] == u["cache_read_input_tokens"]
    assert totals["usage"]["cache_write_5m_tokens"] == u["cache_creation_input_tokens"]
    assert totals["usage"]["output_tokens"] == u["output_tokens"]
    assert totals["usage"]["input_tokens"] == (
        u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
    )
    # Claude Code adds its costs as floats: equal to the tenth of a micro-dollar
    tenth = Decimal("1e-10")
    assert Decimal(totals["cost_usd"]).quantize(tenth) == Decimal(
        str(result["total_cost_usd"])
    ).quantize(tenth)


# mini-swe-agent 2.4.6 answers in one of two ways: its default config (mini.yaml) calls a
# `bash` tool; mini_textbased.yaml wants a THOUGHT and one ```mswea_bash_command block per
# turn. Either way `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` alone submits. The first
# command's output is long enough that the later calls cross the 1,024-token minimum and
# read the provider's cache: LiteLLM must price cache reads and writes as the gateway does.
MINI_TOOL_SCRIPT = """
- tool: bash
  input: {command: "seq 1 1500"}
- tool: bash
  input: {command: "printf 'Hello, world!\\n' > HELLO"}
- tool: bash
  input: {command: "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}
"""
MINI_TEXT_SCRIPT = """
- text: "THOUGHT: Let me look around first.\\n\\n```mswea_bash_command\\nseq 1 1500\\n```"
- text: "THOUGHT: I write the file.\\n\\n```mswea_bash_command\\nprintf 'Hello, world!\\\\n' > HELLO\\n```"
- text: "THOUGHT: Done.\\n\\n```mswea_bash_command\\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\\n```"
"""


@pytest.mark.parametrize(
    ("api", "model", "config", "script"),
    [
        ("anthropic", "anthropic/claude-sonnet-4-5", ["-c", "mini.yaml"], MINI_TOOL_SCRIPT),
        (
            "openai",
            "openai/gpt-5",
            ["-c", "mini_textbased.yaml", "--model-class", "litellm_textbased"],
            MINI_TEXT_SCRIPT,
        ),
    ],
)
def test_mini_swe_agent_through_litellm_and_the_gateway_solves_hello_file(
    api: str, model: str, config: list[str], script: str, tmp_path: Path
) -> None:
    """mini-swe-agent, through LiteLLM, on examples/hello-file against the gateway: the file
    is written, and the cost mini-swe-agent records (LiteLLM's price of each response) is
    the gateway's ledger of the session, call for call."""
    if not MINI.exists():
        pytest.skip(f"mini-swe-agent not installed: .ci/run installs it into {MINI.parent.parent}")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    hello = work / "hello.txt"
    instruction = (EXAMPLES / "hello-file/instruction.md").read_text()
    assert "/app/hello.txt" in instruction
    (tmp_path / "turns.yaml").write_text(script.replace("HELLO", str(hello)))
    env, stayer = _stayer_home(tmp_path)

    def serve(*args: str) -> tuple[subprocess.Popen[str], str]:
        return start_listening([*args, "--port", "0"], env)

    key = json.loads(stayer("tenants", "create", "dev", "--max-cost", "5", "--json"))["api_key"]
    sim, sim_url = serve("sim", "serve", "--policy", f"script:{tmp_path / 'turns.yaml'}")
    gw, url = serve("gateway", "--upstream", f"{api}={sim_url}")
    # the session is named by a header LiteLLM sends on every call
    (tmp_path / "session.yaml").write_text(
        "model:\n  model_kwargs:\n    extra_headers: {x-stayer-session: mini-hello}\n"
    )
    trajectory = tmp_path / "run.traj.json"
    base = {"anthropic": url, "openai": f"{url}/v1"}[api]
    try:
        done = subprocess.run(
            [str(MINI), "-m", model, *config, "-c", str(tmp_path / "session.yaml"),
             "-t", instruction.replace("/app/hello.txt", str(hello)),
             "--yolo", "--exit-immediately", "-o", str(trajectory)],
            cwd=work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
            env={"PATH": os.environ["PATH"], "HOME": str(home), "MSWEA_CONFIGURED": "1",
                 "LITELLM_LOCAL_MODEL_COST_MAP": "True", f"{api.upper()}_API_KEY": key,
                 f"{api.upper()}_BASE_URL": base},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        report = _ledger(stayer, "mini-hello", 3)
    finally:
        for proc in (gw, sim):
            proc.terminate()
            proc.wait(timeout=60)
    assert hello.read_text() == "Hello, world!\n"
    traj = json.loads(trajectory.read_text())
    assert traj["info"]["exit_status"] == "Submitted"
    assert traj["info"]["model_stats"]["api_calls"] == report["steps"] == 3
    answers = [m for m in traj["messages"] if m["role"] == "assistant"]
    ledger = report["ledger"]
    assert ledger[-1]["usage"]["cache_read_tokens"] > 0  # the last call read the cache
    for answer, entry in zip(answers, ledger, strict=True):
        u = answer["extra"]["response"]["usage"]
        assert entry["usage"]["output_tokens"] == u["completion_tokens"]
        assert entry["usage"]["cache_read_tokens"] == u["prompt_tokens_details"]["cached_tokens"]
        # LiteLLM adds its per-token prices as floats: equal to the tenth of a micro-dollar
        tenth = Decimal("1e-10")
        assert Decimal(entry["cost_usd"]).quantize(tenth) == Decimal(
            str(answer["extra"]["cost"])
        ).quantize(tenth), (entry, u)
    recorded = Decimal(str(traj["info"]["model_stats"]["instance_cost"]))
    assert Decimal(report["totals"]["cost_usd"]).quantize(Decimal("1e-10")) == recorded.quantize(
        Decimal("1e-10")
    )
