"""Build the API reference from the docstrings (pdoc), failing on any broken reference.

    python docs/build_api.py OUT_DIR

Documents ``stayer`` (its ``__all__``), ``stayer.eval`` with ``stayer.eval.engine`` (what
``stayer.eval(...)`` is) and ``stayer.integrations``. Fails (exit 1, one line each) on a
warning from pdoc, a link to a page or anchor that was not built, a reStructuredText role
left unrendered, or a ``stayer.NAME`` in code that names nothing documented.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path

SPECS = (
    "stayer",
    "stayer.integrations",
    r"!stayer\.(?!integrations|eval$|eval\.engine$)",
)


def build(out: Path) -> list[str]:
    """Write the reference into ``out``; the problems found (none: it is sound)."""
    import pdoc
    import pdoc.doc
    import pdoc.render

    pdoc.render.configure(docformat="restructuredtext", search=False, show_source=False)
    pdoc.doc.Module.from_name.cache_clear()  # the docstrings as they are now
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pdoc.pdoc(*SPECS, output_directory=out)
    problems = []
    pages = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*.html")}
    anchors = {name: set(re.findall(r'\bid="([^"]+)"', html)) for name, html in pages.items()}
    for name, html in pages.items():
        here = Path(name).parent
        for href in re.findall(r'href="([^"]+)"', html):
            if re.match(r"[a-z]+:", href):
                continue  # an external link
            page, _, anchor = href.partition("#")
            target = os.path.normpath(here / page) if page else name
            if target not in pages:
                problems.append(f"{name}: link to {href}: no such page")
            elif anchor and anchor not in anchors[target]:
                problems.append(f"{name}: link to {href}: no such anchor")
        for role in re.findall(r":(?:class|func|meth|mod|attr):`[^`]*`", html):
            problems.append(f"{name}: {role}: a role pdoc does not render; write ``NAME``")
        for code in re.findall(r"<code>(stayer(?:\.\w+)+)</code>", html):
            problems.append(f"{name}: {code}: names nothing documented")
    return problems


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    found = build(Path(sys.argv[1]))
    for line in found:
        print(line, file=sys.stderr)
    sys.exit(1 if found else 0)
