"""The API reference builds from the docstrings with no broken reference, and the public
names (``stayer.__all__``) are the ones docs/python.md documents."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import stayer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
from build_api import build  # noqa: E402

pytest.importorskip("pdoc")


def test_the_reference_builds_with_every_public_name(tmp_path: Path) -> None:
    assert build(tmp_path) == []
    page = (tmp_path / "stayer.html").read_text()
    for name in stayer.__all__:
        assert f'id="{name}"' in page or f'href="stayer/{name}.html"' in page, name
    for module in ("openai_agents", "pydantic_ai", "litellm"):
        assert (tmp_path / "stayer" / "integrations" / f"{module}.html").is_file()


def test_a_broken_reference_fails_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stayer import library

    monkeypatch.setattr(
        library.run_task, "__doc__", "See ``stayer.no_such_name`` and ``stayer.Budget``."
    )
    problems = build(tmp_path)
    assert problems == ["stayer.html: stayer.no_such_name: names nothing documented"]


def test_all_is_the_documented_list() -> None:
    table = (ROOT / "docs" / "python.md").read_text().split("## Stability")[0]
    cells = re.findall(r"^\| (`[^|]*)\|", table, re.M)  # the first column of each row
    documented = {name for cell in cells for name in re.findall(r"`(\w+)", cell)}
    assert documented | {"__version__"} == set(stayer.__all__)
