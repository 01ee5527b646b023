"""``underspecified``: what the tests require that the instruction never states.

A static comparison of the test files with the instruction: output files the tests read
(``/app/…`` paths, or quoted file names, that the environment does not provide) and keys
the tests look up in what the agent wrote (``x["key"]``, ``x.get("key")``), neither named
by the instruction nor present in the environment's files. An agent cannot know them
except by luck, so a failure says little about the agent.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from stayer.eval.probes import TaskFacts, environment_files
from stayer.eval.task import Task

_MIN_KEY = 3  # shorter keys ("id", "x") match by accident
_MAX_ENV_TEXT = 1024 * 1024


def unmentioned(task: Task, facts: TaskFacts) -> list[str]:
    """What the tests require and the instruction never says, one phrase each."""
    env = environment_files(task)
    env_dirs = {str(Path(p).parent) for p in env} | {"/app"}
    said = task.instruction
    missing = []
    for path in facts.mentioned_files:
        verifiers_own = (
            path in facts.reward_paths or path.removeprefix("/app/") in facts.reward_paths
        )
        if path in env or path in env_dirs or verifiers_own or _names(path, said):
            continue
        missing.append(f"the file {path}")
    env_text = "\n".join(
        f.read_text(errors="replace") for f in env.values() if f.stat().st_size <= _MAX_ENV_TEXT
    )
    keys = set()
    for name, text in facts.texts.items():
        if name.endswith(".py"):
            keys |= _looked_up_keys(text)
    for key in sorted(keys):
        if not re.search(rf"\b{re.escape(key)}\b", said) and key not in env_text:
            missing.append(f"the key {key!r}")
    return missing


def _names(path: str, text: str) -> bool:
    relative = path.removeprefix("/app/")
    return any(
        re.search(rf"(?<![\w.-]){re.escape(p)}(?![\w-])", text)
        for p in (path, relative, Path(path).name)
    )


def _looked_up_keys(source: str) -> set[str]:
    """String keys read by subscript or ``.get`` and not defined by the test itself (as a
    dict literal's key or a subscript assignment)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    read: set[str] = set()
    own: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and _is_key(node.slice)
            and not _is_process_state(node.value)
        ):
            (own if isinstance(node.ctx, ast.Store) else read).add(node.slice.value)  # type: ignore[attr-defined]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and _is_key(node.args[0])
            and not _is_process_state(node.func.value)
        ):
            read.add(node.args[0].value)  # type: ignore[attr-defined]
        elif isinstance(node, ast.Dict):
            own.update(k.value for k in node.keys if k is not None and _is_key(k))  # type: ignore[attr-defined]
    return read - own


def _is_process_state(node: ast.AST) -> bool:
    """``os.environ``, ``sys.modules`` and the like: keys of the process, not of the work."""
    name = (
        node.attr
        if isinstance(node, ast.Attribute)
        else node.id
        if isinstance(node, ast.Name)
        else ""
    )
    return name in {"environ", "modules", "argv", "headers"}


def _is_key(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and len(node.value) >= _MIN_KEY
        and node.value.isidentifier()
    )
