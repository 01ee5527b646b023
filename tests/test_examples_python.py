"""Every example under ``examples/python/`` runs offline against ``stayer sim serve`` and
checks the cost it prints against its session's ledger; here each is run as a user runs
it, and the printed cost is checked once more against ``stayer report SESSION``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from service_helpers import listening

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p for p in (ROOT / "examples" / "python").glob("*.py") if p.name[0] != "_")


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with listening(["sim", "serve", "--port", "0"]) as url:
        yield url


def test_there_is_an_example_per_integration() -> None:
    modules = {p.stem for p in (ROOT / "stayer" / "integrations").glob("[!_]*.py")}
    assert {p.stem.rsplit("_", 1)[0] for p in EXAMPLES} == modules


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_the_example_runs_and_its_cost_is_the_ledgers(
    example: Path, sim: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "STAYER_HOME": str(tmp_path),
        "STAYER_SIM_URL": sim,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM would fetch its prices otherwise
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    r = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=300, env=env,
        cwd=example.parent,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    found = re.search(r"session (\S+): (\d+) calls, cost \$([0-9.]+)", r.stdout)
    assert found and "refused: budget" in r.stdout, r.stdout
    report = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "report", found[1], "--json"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    doc = json.loads(report.stdout)
    assert len(doc["ledger"]) == int(found[2])
    assert Decimal(doc["totals"]["cost_usd"]) == Decimal(found[3]) > 0
