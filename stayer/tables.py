"""Tables and lines that fit: how every command prints a table for people.

At a terminal a table fits its width: a number (``Col(number=True)``) or an id
(``whole=True``) is never cut or wrapped; other text folds (never an ellipsis), a column that
may be left out into three lines at most; when that does not fit, whole columns are left
out in the order the command gives (``drop``, highest first) and a line says which.
In a pipe (no terminal) a table is printed at its full natural width, every column whole,
and a line is never wrapped: what a script reads is what the data says.

Cells are plain text, never markup: user text needs no escaping here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

#: The narrowest a text column is folded to (a shorter text keeps its own width), and the
#: most lines a cell of a column that may be left out is folded into.
FOLD_MIN, FOLD_LINES = 10, 3


@dataclass(frozen=True)
class Col:
    """A column: its header, whether it holds numbers (right-justified, never cut or
    wrapped), and when it is left out at a narrow terminal (``drop``: highest first; None:
    never)."""

    header: str
    number: bool = False
    drop: int | None = None
    style: str | None = None
    whole: bool = False  # text never folded either (an id people copy)


class FitTable:
    """Rows of plain text under ``Col`` columns, printed by ``print_table``. ``options``
    are Rich ``Table`` options that do not change widths' rules (box, title, show_header)."""

    def __init__(self, *columns: Col | str, **options: Any) -> None:
        self.columns = [c if isinstance(c, Col) else Col(c) for c in columns]
        self.options = options
        self.rows: list[list[Text]] = []
        self.sections: set[int] = set()  # a rule above the row of this index
        self.overheads: dict[int, int] = {}  # borders and padding by number of columns

    def add_row(self, *cells: str | Text | None) -> None:
        from rich.text import Text

        assert len(cells) == len(self.columns), (cells, self.columns)
        self.rows.append([c if isinstance(c, Text) else Text(c or "") for c in cells])

    def add_section(self) -> None:
        self.sections.add(len(self.rows))


def _cell_width(text: Text) -> int:
    return max((line.cell_len for line in text.split("\n", allow_blank=True)), default=0)


def _longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def _overhead(table: FitTable, n: int) -> int:
    """Cells' width in a table of ``n`` columns that is not the columns' own: borders and
    padding, as Rich lays them out (measured on a table of one-cell columns)."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    if n not in table.overheads:
        probe = Table(**_layout_options(table.options))
        for _ in range(n):
            probe.add_column(width=1)
        wide = Console(width=10_000)
        table.overheads[n] = Measurement.get(wide, wide.options, probe).maximum - n
    return table.overheads[n]


def _layout_options(options: dict[str, Any]) -> dict[str, Any]:
    keep = ("box", "padding", "pad_edge", "show_edge", "collapse_padding", "show_lines")
    return {k: v for k, v in options.items() if k in keep}


def layout(table: FitTable, width: int | None) -> tuple[list[int], list[int], list[str]]:
    """Which columns to show (indexes), each one's width, and the headers left out, for a
    table ``width`` cells wide (None: every column at its natural width)."""
    natural, least = [], []
    for i, col in enumerate(table.columns):
        cells = [r[i] for r in table.rows]
        data = max((_cell_width(c) for c in cells), default=0)
        natural.append(max(data, len(col.header)))
        if col.number or col.whole:
            least.append(max(data, _longest_word(col.header), 1))
        else:  # one that may be left out is, rather than folded into a paragraph
            fold = FOLD_MIN if col.drop is None else -(-data // FOLD_LINES)
            least.append(min(natural[i], max(FOLD_MIN, fold, _longest_word(col.header))))
    shown = list(range(len(table.columns)))
    dropped: list[str] = []
    if width is None:
        return shown, natural, dropped
    # A droppable column with nothing in it goes first, unsaid.
    for i in list(shown):
        col = table.columns[i]
        if col.drop is not None and all(not r[i].plain.strip() for r in table.rows):
            shown.remove(i)
    order = sorted(
        (i for i in shown if table.columns[i].drop is not None),
        key=lambda i: (-(table.columns[i].drop or 0), -i),
    )
    while sum(least[i] for i in shown) + _overhead(table, len(shown)) > width and order:
        i = order.pop(0)
        shown.remove(i)
        dropped.append(table.columns[i].header)
    room = width - _overhead(table, len(shown)) - sum(least[i] for i in shown)
    widths = []
    for i in shown:  # what is left goes to the columns that want it, left to right
        more = max(0, min(room, natural[i] - least[i]))
        widths.append(least[i] + more)
        room -= more
    return shown, widths, dropped


def print_table(console: Console, table: FitTable) -> None:
    """``table`` as it fits ``console``: see the module's docstring."""
    from rich.table import Table

    terminal = console.is_terminal
    shown, widths, dropped = layout(table, console.width if terminal else None)
    if terminal and _overhead(table, len(shown)) + sum(widths) > console.width:
        _records(console, table)  # not even the columns that must stay fit: a row a block
        return
    t = Table(**table.options)
    for i, w in zip(shown, widths, strict=True):
        col = table.columns[i]
        t.add_column(
            col.header,
            justify="right" if col.number else "left",
            overflow="fold",
            width=w,
            style=col.style,
        )
    for n, row in enumerate(table.rows):
        if n in table.sections:
            t.add_section()
        t.add_row(*(row[i] for i in shown))
    with _width(console, None if terminal else _overhead(table, len(shown)) + sum(widths)):
        console.print(t)
    if dropped:
        say(
            console,
            f"(not shown at {console.width} columns: {', '.join(dropped)}; "
            "a wider terminal, a pipe or --json shows them)",
            style="dim",
        )


def _records(console: Console, table: FitTable) -> None:
    """Each row as lines of ``header: value`` under its first cell: a terminal too narrow
    for the table still gets every value whole."""
    from rich.text import Text

    title = table.options.get("title")
    if title:
        say(console, Text.from_markup(title) if isinstance(title, str) else title, style="bold")
    for n, row in enumerate(table.rows):
        if n in table.sections:
            say(console, "")
        for i, (col, cell) in enumerate(zip(table.columns, row, strict=True)):
            if i == 0 or cell.plain.strip():
                label = f"{col.header}: " if col.header else ""
                say(console, "  " * (i > 0) + label, cell, style="" if i else "bold")


def say(console: Console, *parts: str | Text | tuple[str, str], style: str | None = None) -> None:
    """One line of plain text (``parts`` as for ``Text.assemble``): wrapped at word breaks at
    a terminal, whole in a pipe."""
    from rich.text import Text

    console.print(
        Text.assemble(*parts, style=style or ""),
        highlight=False,
        soft_wrap=not console.is_terminal,
    )


@contextmanager
def _width(console: Console, width: int | None) -> Iterator[None]:
    """The console as wide as ``width`` (when wider than it is) while a table prints."""
    if width is None or width <= console.width:
        yield
        return
    before = console.width
    console.width = width
    try:
        yield
    finally:
        console.width = before
