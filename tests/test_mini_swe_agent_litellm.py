"""mini-swe-agent, run for real (its own venv, pinned by .ci/run under
``~/.cache/stayer-bench``), metered in-process by stayer's LiteLLM callback against
``stayer sim serve``: each of its calls is on stayer's ledger at the cost mini-swe-agent
records, and the budget's caps (steps, dollars) refuse the call that does not fit.

stayer is not installed into that venv: a launcher run by the venv's Python puts this
tree first on ``sys.path`` and stayer's own site-packages last (only what the agent's
venv lacks, msgspec, comes from there), installs the callback, then runs mini's CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
import textwrap
from decimal import Decimal
from pathlib import Path

import pytest
from service_helpers import start_listening
from test_clients import EXAMPLES, MINI, MINI_TOOL_SCRIPT

import stayer

pytestmark = pytest.mark.slow  # three runs of mini-swe-agent, each importing LiteLLM
TREE = Path(__file__).resolve().parent.parent
LAUNCH = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, os.environ["STAYER_TREE"])
    sys.path.append(os.environ["STAYER_SITE"])  # stayer's deps the agent's venv lacks
    import stayer
    from stayer.integrations.litellm import BudgetRefused, install
    cap = json.loads(os.environ["STAYER_CAP"])
    budget = stayer.Budget(cap["max_cost"], max_steps=cap["max_steps"], name="mini",
                           store=os.environ["STAYER_BUDGETS"])
    handler = install(budget=budget, session=stayer.Session("mini", home=os.environ["STAYER_HOME"]))
    from minisweagent.run.mini import app
    code = 0
    try:
        app()
    except SystemExit as e:
        code = e.code or 0
    except BudgetRefused as e:
        print("refused:", e.error, file=sys.stderr)
        code = 3
    finally:
        handler.flush()
    sys.exit(code)
    """
)


def _run_mini(tmp_path: Path, max_cost: str | None, max_steps: int | None) -> tuple[int, str]:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    hello = work / "hello.txt"
    instruction = (EXAMPLES / "hello-file/instruction.md").read_text()
    (tmp_path / "turns.yaml").write_text(MINI_TOOL_SCRIPT.replace("HELLO", str(hello)))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    sim, url = start_listening(
        ["sim", "serve", "--policy", f"script:{tmp_path / 'turns.yaml'}", "--port", "0"], env
    )
    try:
        done = subprocess.run(
            [str(MINI.parent / "python"), "-c", LAUNCH, "-m", "anthropic/claude-sonnet-4-5",
             "-c", "mini.yaml", "-t", instruction.replace("/app/hello.txt", str(hello)),
             "--yolo", "--exit-immediately", "-o", str(tmp_path / "run.traj.json")],
            cwd=work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
            env={"PATH": os.environ["PATH"], "HOME": str(home), "MSWEA_CONFIGURED": "1",
                 "LITELLM_LOCAL_MODEL_COST_MAP": "True", "ANTHROPIC_API_KEY": "sk-x",
                 "ANTHROPIC_BASE_URL": url, "STAYER_TREE": str(TREE),
                 "STAYER_SITE": sysconfig.get_paths()["purelib"],
                 "STAYER_CAP": json.dumps({"max_cost": max_cost, "max_steps": max_steps}),
                 "STAYER_BUDGETS": str(tmp_path / "budgets.db"),
                 "STAYER_HOME": str(tmp_path / "stayer")},
        )  # fmt: skip
    finally:
        sim.terminate()
        sim.wait(timeout=60)
    return done.returncode, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(autouse=True)
def _installed() -> None:
    if not MINI.exists():
        pytest.skip(f"mini-swe-agent not installed: .ci/run installs it into {MINI.parent.parent}")


def test_mini_swe_agents_calls_are_on_stayers_ledger_at_its_own_cost(tmp_path: Path) -> None:
    code, out = _run_mini(tmp_path, None, None)
    assert code == 0, out
    assert (tmp_path / "work/hello.txt").read_text() == "Hello, world!\n"
    traj = json.loads((tmp_path / "run.traj.json").read_text())
    assert traj["info"]["exit_status"] == "Submitted"
    ledger = stayer.Session("mini", home=tmp_path / "stayer").ledger
    answers = [m for m in traj["messages"] if m["role"] == "assistant"]
    assert len(ledger) == len(answers) == traj["info"]["model_stats"]["api_calls"] == 3
    assert ledger[-1]["usage"]["cache_read_tokens"] > 0  # the last call read the cache
    tenth = Decimal("1e-10")  # LiteLLM adds its per-token prices as floats
    for answer, entry in zip(answers, ledger, strict=True):
        assert (
            entry["usage"]["output_tokens"]
            == answer["extra"]["response"]["usage"]["completion_tokens"]
        )
        assert Decimal(entry["cost_usd"]).quantize(tenth) == Decimal(
            str(answer["extra"]["cost"])
        ).quantize(tenth)
    budget = stayer.Budget(name="mini", store=tmp_path / "budgets.db")
    assert budget.spent == sum(Decimal(e["cost_usd"]) for e in ledger) > 0
    assert budget.steps == 3


@pytest.mark.parametrize(
    ("max_cost", "max_steps", "said"), [(None, 2, "max_steps"), ("0.01", None, "worst case")]
)
def test_a_cap_refuses_mini_swe_agents_call_before_it_is_sent(
    tmp_path: Path, max_cost: str | None, max_steps: int | None, said: str
) -> None:
    code, out = _run_mini(tmp_path, max_cost, max_steps)
    assert code == 3 and "refused:" in out and said in out, out
    ledger = stayer.Session("mini", home=tmp_path / "stayer").ledger
    budget = stayer.Budget(
        max_cost, max_steps=max_steps, name="mini", store=tmp_path / "budgets.db"
    )
    assert len(ledger) == budget.steps < 3 and budget.reserved == 0
    assert budget.spent == sum(Decimal(e["cost_usd"]) for e in ledger)
    if max_cost is not None:
        assert budget.spent <= Decimal(max_cost)
    else:
        assert budget.steps == max_steps
