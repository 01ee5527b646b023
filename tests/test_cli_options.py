"""One flag, one meaning (issue 36): an option that several commands take is declared once
(stayer.cli.options), so that its type, bounds, envvar and help are the same in every
command. The flags below mean something else in some commands: each other meaning is
listed with the commands that share it, and those must agree among themselves."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from typer.main import get_command

from stayer.cli import app

# flag → its other meanings, each the commands that share it; the commands not listed
# share the flag's one other declaration.
OTHER_MEANINGS: dict[str, list[set[str]]] = {
    # tasks checked at once; a worker's slots (bounded 1 to 1,000)
    "--concurrency": [{"tasks check"}, {"worker"}],
    # the whole job's cap over its samples; a tenant's budget over all its runs
    "--max-cost": [{"rollouts"}, {"tenants create", "tenants budget"}],
    # the prices' model, models to compare, a filter, the model that counts tokens, …
    "--model": [{c} for c in ("estimate", "eval", "run", "rollouts", "whatif", "runs")]
    + [{"tools list"}],
    # worker processes; compile jobs
    "--jobs": [{"audit"}, {"local-model build"}],
    # a directory of trial records; of rollouts; a file of A2A tasks
    "--out": [{"eval"}, {"rollouts"}, {"export a2a"}],
    # one context policy; what the simulator says
    "--policy": [{"run"}, {"sim serve"}],
    # no free port for the API; a port on 127.0.0.1 for llama.cpp
    "--port": [{"serve"}, {"local-model start"}],
    # no task to default to; the kinds a host runs; images to build
    "--sandbox": [{"serve", "worker"}, {"sandbox exec"}, {"tasks import-tb"}],
    # a filter on runs; the task whose MCP servers are listed
    "--task": [{"runs"}, {"tools list"}],
    # the help says what is selected: calls or runs; images or runs
    "--since": [{"audit"}, {"runs"}],
    "--older-than": [{"images prune"}, {"runs prune"}],
}


def declarations() -> dict[str, dict[tuple[Any, ...], list[str]]]:
    """flag → each distinct declaration of it → the commands declaring it so."""
    found: dict[str, dict[tuple[Any, ...], list[str]]] = defaultdict(lambda: defaultdict(list))

    def walk(command: Any, path: str) -> None:
        for p in command.params:
            if p.param_type_name != "option":
                continue
            info = p.type_descriptor.parameter_info
            shape = (
                tuple(p.opts),
                tuple(p.secondary_opts),
                p.type_descriptor.annotation,
                p.help,
                p.envvar,
                p.metavar,
                info.min,
                info.max,
            )
            found[p.opts[0]][shape].append(path)
        subs = getattr(command, "commands", {})
        for name in list(subs):
            walk(subs[name], f"{path} {name}".strip())

    walk(get_command(app), "")
    return found


def test_an_option_that_commands_share_is_one_declaration() -> None:
    different = {}
    for flag, shapes in declarations().items():
        groups = OTHER_MEANINGS.get(flag, [])
        listed = set().union(*groups)
        for meaning in [*groups, None]:  # None: the commands not listed
            mine = [
                (shape, paths)
                for shape, paths in shapes.items()
                for path in paths
                if (path in meaning if meaning is not None else path not in listed)
            ]
            if len({shape for shape, _ in mine}) > 1:
                different[flag] = sorted({tuple(paths) for _, paths in mine})
    assert different == {}, different


def test_the_flags_with_their_own_meaning_are_still_there() -> None:
    # A listed command that no longer takes the flag: the list above is out of date.
    found = declarations()
    for flag, groups in OTHER_MEANINGS.items():
        declared = {path for paths in found[flag].values() for path in paths}
        listed = set().union(*groups)
        assert listed <= declared, (flag, listed - declared)
