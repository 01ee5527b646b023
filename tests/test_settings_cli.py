"""One source per setting: the CLI's options agree with the settings models in
``stayer.settings`` (names, defaults, bounds), and so do the run configurations built
from them.

A flag whose default drifts from its model's, or a command that stops checking a bound,
fails here rather than in a user's run.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import annotated_types
import click
import pytest
import typer.main
from pydantic import BaseModel
from typer.testing import CliRunner

from stayer.cli import app
from stayer.eval.runner import EvalConfig
from stayer.settings import (
    CheckSettings,
    EstimateSettings,
    EvalSettings,
    ListSettings,
    RunFlags,
    RunSettings,
    SandboxSettings,
)

# (command path, model, the model's fields the command takes (None: all), the arguments that
# make the rest of the command line valid)
ESTIMATE_BASE = ["--steps", "1", "--new-tokens", "1", "--output-tokens", "1"]
PRICES = ["--price-miss", "1", "--price-hit", "1", "--price-out", "1"]
CASES: list[tuple[str, type[BaseModel], set[str] | None, list[str]]] = [
    ("run", RunFlags, None, ["no-such-task", "--model", "sim:claude-sonnet-4-5"]),
    ("eval", EvalSettings, None, ["no-such-suite", "--model", "sim:claude-sonnet-4-5"]),
    (
        "eval",
        RunFlags,
        {"max_steps", "max_cost", "sim_latency"},
        ["no-such-suite", "--model", "sim:claude-sonnet-4-5"],
    ),
    ("sandbox exec", SandboxSettings, None, ["true"]),
    ("estimate", EstimateSettings, None, ESTIMATE_BASE + PRICES),
    ("tasks check", CheckSettings, None, ["no-such-suite"]),
    ("runs", ListSettings, {"limit"}, []),
    ("audit", ListSettings, {"jobs"}, ["no-such-log"]),
    ("whatif", RunFlags, {"max_context"}, ["no-such-trace"]),
]


def _command(path: str) -> click.Command:
    cmd: Any = typer.main.get_command(app)
    for word in path.split():
        cmd = cmd.commands[word]
    return cmd


def _fields(model: type[BaseModel], only: set[str] | None) -> dict[str, Any]:
    return {name: f for name, f in model.model_fields.items() if only is None or name in only}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize(
    ("path", "model", "only", "_base"), CASES, ids=[f"{c[0]}:{c[1].__name__}" for c in CASES]
)
def test_every_setting_is_a_flag_with_the_models_default(
    path: str, model: type[BaseModel], only: set[str] | None, _base: list[str]
) -> None:
    options = {opt: p for p in _command(path).params for opt in p.opts}
    for name, field in _fields(model, only).items():
        param = options.get(_flag(name))
        assert param is not None, (
            f"`stayer {path}` has no {_flag(name)} for {model.__name__}.{name}"
        )
        if field.is_required():
            continue
        default = param.default
        if isinstance(field.default, Decimal) or (default is not None and name == "max_cost"):
            default = Decimal(default)
        assert default == field.default, (
            f"`stayer {path} {_flag(name)}` defaults to {param.default!r}, {model.__name__}.{name} to {field.default!r}"
        )


def _beyond(field: Any) -> list[str]:
    """Values just outside the field's bounds, as flag text."""
    out = []
    for bound in field.metadata:
        if isinstance(bound, annotated_types.Le):
            out.append(str(bound.le + 1))
        elif isinstance(bound, annotated_types.Lt):
            out.append(str(bound.lt))
        elif isinstance(bound, annotated_types.Ge) and bound.ge > 0:
            out.append(str(bound.ge - 1))
        elif isinstance(bound, annotated_types.Gt):
            out.append(str(bound.gt))
    return out


BOUNDS = [
    (path, name, value, base)
    for path, model, only, base in CASES
    for name, field in _fields(model, only).items()
    for value in _beyond(field)
]


@pytest.mark.parametrize(
    ("path", "name", "value", "base"), BOUNDS, ids=[f"{b[0]} --{b[1]}={b[2]}" for b in BOUNDS]
)
def test_the_command_enforces_the_models_bounds(
    path: str, name: str, value: str, base: list[str]
) -> None:
    if _flag(name) in base:  # the base's own value of this flag is left out
        i = base.index(_flag(name))
        base = base[:i] + base[i + 2 :]
    # the flag first: `sandbox exec` takes everything after its command as the command
    result = CliRunner().invoke(app, [*path.split(), _flag(name), value, *base])
    assert result.exit_code == 2, result.output
    assert f"{_flag(name)} {value}" in result.output, result.output


def test_run_and_eval_configurations_default_as_the_settings_do() -> None:
    run = RunFlags()
    for f in dataclasses.fields(RunSettings):
        if f.name in RunFlags.model_fields:
            assert f.default == getattr(run, f.name), f"RunSettings.{f.name}"
    for f in dataclasses.fields(EvalConfig):
        if f.name in RunFlags.model_fields:
            assert f.default == getattr(run, f.name), f"EvalConfig.{f.name}"
    assert EvalConfig("m").policy_name == RunSettings.policy
