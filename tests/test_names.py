"""One name per concept: a public class name is declared by one module of ``stayer/``.

Two classes of one name in two modules make a reader (and an import) guess which is meant.
A module's private classes (``_Name``) may repeat another module's: no one else sees them.
``SHARED`` lists the names left declared twice, with the reason; an entry that no longer
needs its place fails too, so the list cannot go stale.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "stayer"

#: Declared twice on purpose, by these modules.
SHARED: dict[str, set[str]] = {
    # The public library budget (stayer.Budget, documented) and the engine's handle on one
    # account, which six test files build: one concept, two forms over one BudgetStore.
    "Budget": {"stayer.sdk", "stayer.guard.budget"},
}


def _declared() -> dict[str, set[str]]:
    """Each public module-level class name, and the modules that declare it."""
    where: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].add(module)
    return where


def test_a_public_class_name_is_declared_by_one_module() -> None:
    twice = {name: mods for name, mods in _declared().items() if len(mods) > 1}
    unexplained = {name: sorted(mods) for name, mods in twice.items() if name not in SHARED}
    assert not unexplained, f"give these classes distinct names: {unexplained}"
    for name, modules in SHARED.items():
        assert twice.get(name) == modules, f"SHARED[{name!r}] is out of date: {twice.get(name)}"
