"""Session reports → the ``stayer audit`` document and its Rich tables.

Details and rationale: docs/notes.md, ``stayer/audit/document.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import msgspec
import orjson
from msgspec import UNSET, UnsetType

from stayer.audit.analysis import (
    CallCostDoc,
    GroupDoc,
    Reference,
    SessionDoc,
    SessionReport,
    Tally,
    TallyDoc,
    doc_json,
    money,
)
from stayer.records import Record

if TYPE_CHECKING:  # rich is imported by the tables only: ``audit --json`` never loads it
    from rich.console import Console

    from stayer.tables import Col, FitTable

GROUPS = ("session", "day", "model")
_TOP = 10


class Scenario(Record):
    model: str | None  # None: the session's own model
    policy: str = "none"
    max_context: int | None = None


class WhatIfEstimate(Record, kw_only=True):
    """An entry of the audit document's ``what_if``: a session replayed under a scenario
    (``error``: why it was not), beside what it cost."""

    session: str
    estimate: bool = True
    actual_cost_usd: str
    actual_main_chain_cost_usd: str
    scenario: Scenario
    baseline_cost_usd: str | UnsetType = UNSET
    error: str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    policy: str | UnsetType = UNSET
    cost_usd: str | UnsetType = UNSET
    requests: int | UnsetType = UNSET
    cache_hit_ratio: float | UnsetType = UNSET
    peak_context_tokens: int | UnsetType = UNSET
    compactions: int | UnsetType = UNSET
    note: str | UnsetType = UNSET

    def get(self, key: str, default: Any = None) -> Any:
        """A field as its JSON document has it, or ``default`` (for readers written against
        the documents)."""
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, UNSET) is not UNSET


class AuditReport(msgspec.Struct):
    sessions: list[SessionReport] = msgspec.field(default_factory=list)  # those with calls
    group: str = "session"
    skipped_lines: int = 0  # in every file read, sessions without calls included
    what_if: list[WhatIfEstimate] = msgspec.field(
        default_factory=list
    )  # estimates (stayer.audit.scenarios)

    @property
    def total(self) -> Tally:
        t = Tally()
        for s in self.sessions:
            t.merge(s.total)
        return t

    def groups(self) -> list[tuple[str, Tally]]:
        if self.group == "session":
            return [(s.id, s.total) for s in self.sessions]
        merged: dict[str, Tally] = {}
        for s in self.sessions:
            for key, t in (s.by_day if self.group == "day" else s.by_model).items():
                merged.setdefault(key, Tally()).merge(t)
        return sorted(merged.items())

    def doc(self) -> AuditDoc:
        """The audit document (sessions encoded ahead by the workers stay as they are)."""
        total = self.total
        breaks = [b for s in self.sessions for b in s.cache_breaks]
        reasons: dict[str, list[Decimal | None]] = {}
        for b in breaks:
            reasons.setdefault(b.reason, []).append(b.extra_cost)
        costliest = sorted(
            ((s, c) for s in self.sessions for c in s.costliest),
            key=lambda sc: sc[1].cost,
            reverse=True,
        )[:_TOP]
        return AuditDoc(
            totals=total.doc(
                TotalsDoc,
                cache_breaks=len(breaks),
                cache_break_cost=_sum([b.extra_cost for b in breaks]),
                cache_breaks_by_reason={
                    r: BreakReasonDoc(len(c), _sum(c)) for r, c in sorted(reasons.items())
                },
            ),
            sessions=[
                s.doc() if s.json_fragment is None else orjson.Fragment(s.json_fragment)
                for s in self.sessions
            ],
            group=self.group,
            groups=[t.doc(GroupDoc, label=k) for k, t in self.groups()],
            costliest_calls=[c.doc(session=s.id) for s, c in costliest],
            what_if=self.what_if,
            skipped_lines=self.skipped_lines,
            files=sum(s.files for s in self.sessions),
            bytes=sum(s.bytes for s in self.sessions),
        )

    def to_json(self) -> dict[str, Any]:
        """The ``stayer audit --json`` document, as JSON builtins."""
        return doc_json(self.doc())


class BreakReasonDoc(Record):
    count: int
    extra_cost: str = msgspec.field(name="extra_cost_usd")


class TotalsDoc(TallyDoc, kw_only=True):
    """The document's totals: every session's calls and cache breaks."""

    cache_breaks: int
    cache_break_cost: str = msgspec.field(name="cache_break_cost_usd")
    cache_breaks_by_reason: dict[str, BreakReasonDoc]


class AuditDoc(Record, kw_only=True):
    """The ``stayer audit --json`` document."""

    totals: TotalsDoc
    sessions: list[SessionDoc | orjson.Fragment]
    group: str
    groups: list[GroupDoc]
    costliest_calls: list[CallCostDoc]
    what_if: list[WhatIfEstimate]
    skipped_lines: int
    files: int
    bytes: int


#: How the ``stayer audit --json`` document is written (``stayer.cli.common.emit_json``).
JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS


def session_fragment(report: SessionReport) -> bytes:
    """``report.to_json()`` encoded as it stands in the document written with
    :data:`JSON_OPTIONS`: an item of the top-level ``sessions`` list, two levels in, so each
    of its lines is indented four spaces more (JSON strings hold no raw newline)."""
    return orjson.dumps(report.to_json(), option=JSON_OPTIONS).replace(b"\n", b"\n    ")


def _sum(amounts: list[Decimal | None]) -> str:
    known = [a for a in amounts if a is not None]
    return money(sum(known, Decimal(0)) if len(known) == len(amounts) else None)


def build(reports: Iterable[SessionReport], group: str = "session") -> AuditReport:
    """Sessions with calls in time order (ties by source and id), so the document is
    reproducible; the others only add their unreadable lines."""
    every = list(reports)
    sessions = sorted(
        (s for s in every if s.total.calls), key=lambda s: (s.first_ts, s.source, s.id)
    )
    return AuditReport(sessions, group, skipped_lines=sum(s.skipped_lines for s in every))


def _k(n: int) -> str:
    """Token counts for a table: exact up to 9,999, then k / M (the JSON keeps them exact)."""
    if n < 10_000:
        return f"{n:,}"
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:,.1f}M"


def _usd(d: Decimal | None) -> str:
    return "unknown" if d is None else f"${d:,.4f}"


#: What the what-if columns total, said wherever they are shown.
WHAT_IF_NOTE = (
    "actual, main chain: what the session's own agent cost, the part the replay covers "
    "(sub-agents' calls are left out of every replay); session total: every call of the session. "
    "Compare a what-if with its replay, not with an actual cost."
)


def what_if_table(what_if: list[WhatIfEstimate]) -> tuple[tuple[str, ...], list[list[str]]]:
    """Header and rows of the what-if estimates, for the terminal and the HTML report alike."""
    header = (
        "session",
        "model",
        "policy",
        "actual, main chain",
        "session total",
        "replayed",
        "what-if",
    )
    rows = [
        [
            w.session,
            w.scenario.model or "(own)",
            w.scenario.policy,
            w.actual_main_chain_cost_usd,
            w.actual_cost_usd,
            w.baseline_cost_usd if isinstance(w.baseline_cost_usd, str) else "",
            w.cost_usd
            if isinstance(w.cost_usd, str)
            else w.error
            if isinstance(w.error, str)
            else "",
        ]
        for w in what_if
    ]
    return header, rows


def _table(
    title: str,
    columns: tuple[Col, ...],
    rows: list[list[str]],
    footer: list[str] | None = None,
) -> FitTable:
    """A table that fits the terminal (stayer.tables): names fold, numbers stay whole."""
    from rich import box

    from stayer.tables import FitTable

    t = FitTable(*columns, title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for r in rows:
        t.add_row(*r)
    if footer:
        t.add_section()
        t.add_row(*footer)
    return t


def _cols(header: tuple[str, ...], text: tuple[str, ...], drop: dict[str, int]) -> tuple[Col, ...]:
    """Columns under ``header``: those named in ``text`` hold text, the first among them,
    the others numbers; ``drop``: which a narrow terminal leaves out, highest first."""
    from stayer.tables import Col

    return tuple(
        Col(h, number=i > 0 and h not in text, drop=drop.get(h)) for i, h in enumerate(header)
    )


def _tally_row(key: str, tally: Tally) -> list[str]:
    u = tally.usage
    return [
        key,
        _k(tally.calls),
        _k(u.uncached_input_tokens),
        _k(u.cache_read_tokens),
        _k(u.cache_write_tokens),
        _k(u.output_tokens),
        f"{tally.cache_hit_ratio * 100:.1f}",
        _usd(tally.cost),
    ]


def recorded_rows(report: AuditReport) -> list[tuple[SessionReport, Reference]]:
    """Where a log's own totals and the audit's differ, session by session."""
    return [(s, r) for s in report.sessions for r in s.recorded if not r.matches]


def _render_recorded(report: AuditReport, console: Console, limit: int) -> None:
    """How the audit compares with the totals the logs record of themselves (SWE-agent's
    ``model_stats``, ATIF's ``final_metrics``, …): each difference with its reason."""
    from rich.text import Text

    checked = [s for s in report.sessions if s.recorded]
    if not checked:
        return
    differ = recorded_rows(report)
    odd = len({id(s) for s, _ in differ})
    console.print(
        Text(
            f"Against the logs' own totals: {len(checked) - odd} of {len(checked)} sessions "
            "match" + (", the others differ:" if odd else ".")
        )
    )
    for s, r in differ[:limit]:
        console.print(
            Text(
                f"  {s.source} {s.id}: {r.field} {r.logged} in the log, {r.audited} here: {r.why}",
                style="yellow",
            )
        )
    if len(differ) > limit:
        console.print(Text(f"  … {len(differ) - limit} more in --json (sessions[].recorded)"))


def render(report: AuditReport, console: Console, limit: int = 30) -> None:
    """Tables for people: the groups, then where the cache broke and what it cost."""
    from rich.text import Text

    from stayer.tables import print_table, say

    title = {"session": "Sessions", "day": "Days (UTC)", "model": "Models"}[report.group]
    groups = report.groups()
    if report.group == "session":
        groups.sort(key=lambda kt: kt[1].cost_units, reverse=True)
    rows = [_tally_row(key, tally) for key, tally in groups[:limit]]
    if len(groups) > limit:
        rows.append([f"… {len(groups) - limit} more"] + [""] * 7)
    total = report.total
    header: tuple[str, ...] = (
        report.group,
        "calls",
        "uncached",
        "c.read",
        "c.write",
        "output",
        "hit %",
        "cost",
    )
    columns = _cols(header, (), {"hit %": 3, "c.write": 2, "c.read": 1})
    footer = _tally_row("total", total)
    print_table(console, _table(f"stayer audit · {title}", columns, rows, footer))
    if total.unpriced_calls:
        console.print(
            Text(
                f"{total.unpriced_calls} calls have no price data "
                f"({', '.join(sorted(total.unpriced_models))}); priced part {_usd(total.cost_priced)}",
                style="yellow",
            )
        )
    _render_recorded(report, console, limit)
    breaks = sorted(
        ((s, b) for s in report.sessions for b in s.cache_breaks),
        key=lambda sb: sb[1].extra_cost or Decimal(0),
        reverse=True,
    )
    if breaks:
        rows = [
            [
                s.id,
                str(b.call),
                b.chain or "main",
                b.reason,
                _k(b.lost_tokens),
                "" if b.gap_s is None else f"{b.gap_s:,.0f} s",
                _usd(b.extra_cost),
            ]
            for s, b in breaks[:limit]
        ]
        header = ("session", "call", "chain", "reason", "lost", "idle", "extra cost")
        columns = _cols(header, ("chain", "reason"), {"chain": 2, "idle": 1})
        print_table(console, _table("Costliest cache breaks", columns, rows))
    if report.what_if:
        header, rows = what_if_table(report.what_if)
        # A replay's error is said under the table: its column holds numbers.
        for r, w in zip(rows, report.what_if, strict=True):
            if isinstance(w.error, str):
                r[-1] = "not replayed"
        columns = _cols(header, ("model", "policy"), {"session total": 2, "actual, main chain": 1})
        print_table(console, _table("What-if (estimates, USD)", columns, rows))
        for w in report.what_if:
            if isinstance(w.error, str):
                say(console, f"not replayed: {w.error}")
        say(console, WHAT_IF_NOTE)
    quadratic = [s for s in report.sessions if s.context and s.context.quadratic]
    if quadratic:
        say(
            console,
            f"{len(quadratic)} of {len(report.sessions)} sessions re-send a context that grows "
            "every call (cumulative input ~ calls²); see context.growth_per_call_tokens in --json.",
        )
