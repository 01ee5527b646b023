"""The package's layering: no import cycle and no upward import in ``stayer/``.

The layers are DESIGN.md's, bottom first (README's Layout section lists the same order).
A module may import its own layer and the layers below it; every import counts, including
those inside functions and under ``TYPE_CHECKING`` (a lazy import that points upward is
still an upward dependency). A new top-level module or package fails the test until it is
given a layer here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "stayer"

#: Bottom first. Names are the first component under ``stayer.`` (a module or a package);
#: "stayer" is the package's own ``__init__``.
LAYERS: list[set[str]] = [
    # the vocabulary and its helpers: messages, usage, money, prices, tokens; errors, settings,
    # where the cache lives
    {
        "_version",
        "errors",
        "events",
        "settings",
        "messages",
        "usage",
        "money",
        "pricing",
        "tokens",
        "sqlite_tx",
        "svgplot",
        "tables",
        "choices",
        "pgpool",
        "paths",
        "records",
        "addresses",
    },
    {"models"},
    {"workspace"},  # the workspace's files: walk, copy, change watch, snapshots
    {"sandbox"},
    {"environments"},  # task images: built over the sandbox, used by tasks
    {"context"},
    {"tools"},
    {"mcp"},  # MCP servers' tools: a client over the sandbox, as tools; [mcp] for config
    {"guard"},
    {"routing"},
    {"ledger"},  # the journal writes ledger entries, so the ledger sits below it
    {"journal"},
    {"metering"},  # a provider call read, priced, held, settled and journaled: every door's core
    {"agent"},
    {"teams", "delegation"},
    {"eval", "audit", "whatif", "prepare", "run", "estimate", "doctor"},
    {"runtime", "telemetry", "scale", "simserver", "gateway", "sdk", "library"},
    {"integrations"},  # agent frameworks metered through the library door (sdk)
    {"cli", "stayer"},  # the public API (stayer/__init__.py) re-exports from every layer
]

#: Imports the layering would allow that DESIGN.md rules out: the agent is observed by
#: the journal and the runtime through events and wrappers, never calls them.
FORBIDDEN = {("agent", "journal"), ("agent", "runtime"), ("agent", "telemetry")}

LAYER_OF = {name: n for n, layer in enumerate(LAYERS) for name in layer}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The stayer module that ``name`` (a module, or a name inside one) lives in."""
    while name not in MODULES:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str, path: Path) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name) if name.startswith("stayer") else None
            if target is not None and target != module:
                yield target


GRAPH = {module: set(_imports(module, path)) for module, path in MODULES.items()}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_module_has_a_layer() -> None:
    missing = sorted({_unit(m) for m in MODULES} - LAYER_OF.keys())
    assert not missing, (
        f"give these a layer in tests/test_layers.py (and README's Layout): {missing}"
    )


def test_no_upward_import() -> None:
    upward = []
    for module, targets in GRAPH.items():
        here = _unit(module)
        for target in targets:
            there = _unit(target)
            if (
                LAYER_OF.get(there, -1) > LAYER_OF.get(here, len(LAYERS))
                or (here, there) in FORBIDDEN
            ):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports against the layering:\n" + "\n".join(sorted(upward))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "modules that import each other: " + "; ".join(" ↔ ".join(c) for c in cycles)


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(
    graph: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert _cycles(graph) == expected
