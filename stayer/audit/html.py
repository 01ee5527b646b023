"""``stayer audit --html``: one self-contained file, plots inline as SVG.

Per session, three plots over its calls in time order: context size (the prompt each call
sent; sub-agent calls as dots, cache breaks as red marks), cumulative cost, and the cache
hit ratio of each call, written as SVG directly (``stayer.svgplot``: milliseconds, no
plotting library). Before them: a header (date, stayer version, totals), the token
breakdown, cache breaks by reason, the costliest calls and the what-if estimates. Only the
costliest ``MAX_PLOTTED`` sessions get plots, so a report over thousands of sessions stays
small and quick; the table lists them all.
"""

from __future__ import annotations

import html as _html
from datetime import UTC, datetime

from stayer._version import __version__
from stayer.audit.analysis import SessionReport, iso, money
from stayer.audit.calls import MAIN_CHAIN
from stayer.audit.document import WHAT_IF_NOTE, AuditReport, what_if_table
from stayer.svgplot import Series, line_chart

MAX_PLOTTED = 50

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}h2{margin-top:2em}.plots{display:flex;flex-wrap:wrap;gap:1em}
.plots svg{max-width:100%;height:auto}.note{color:#666}.header{display:grid;grid-template-columns:max-content auto;gap:2px 1em}
.header dt{color:#666}.header dd{margin:0}
"""


def _plots(s: SessionReport) -> str:
    assert s.series is not None
    x = list(range(1, len(s.series.context) + 1))
    main = [
        (i, c)
        for i, c, ch in zip(x, s.series.context, s.series.chain, strict=True)
        if ch == MAIN_CHAIN
    ]
    sub = [
        (i, c)
        for i, c, ch in zip(x, s.series.context, s.series.chain, strict=True)
        if ch != MAIN_CHAIN
    ]
    breaks = [b.call for b in s.cache_breaks]
    context = [Series("main", main)] + ([Series("sub-agents", sub, dots=True)] if sub else [])
    return "".join(
        (
            line_chart(
                context,
                title="context size per call (tokens); red: cache breaks",
                xlabel="call",
                marks=breaks,
            ),
            line_chart(
                [
                    Series(
                        "cost",
                        list(zip(x, map(float, s.series.cumulative_cost), strict=True)),
                        color="#2ca02c",
                    )
                ],
                title="cumulative cost (USD)",
                xlabel="call",
            ),
            line_chart(
                [
                    Series(
                        "hit ratio",
                        list(zip(x, s.series.hit_ratio, strict=True)),
                        dots=True,
                        color="#9467bd",
                    )
                ],
                title="cache hit ratio per call",
                xlabel="call",
                ylim=(0.0, 1.0),
            ),
        )
    )


def _row(cells: list[str], tag: str = "td") -> str:
    return "<tr>" + "".join(f"<{tag}>{_html.escape(c)}</{tag}>" for c in cells) + "</tr>"


def write_html(report: AuditReport) -> str:
    """The whole report as one HTML document (no external resources)."""
    doc = report.doc()
    t = doc.totals
    u = t.usage
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>stayer audit</title>",
        f"<style>{_CSS}</style></head><body><h1>stayer audit</h1>",
        "<dl class='header'>"
        + "".join(
            f"<dt>{_html.escape(k)}</dt><dd>{_html.escape(v)}</dd>"
            for k, v in (
                ("date", datetime.now(UTC).isoformat(timespec="seconds")),
                ("stayer", __version__),
                (
                    "sessions",
                    f"{len(report.sessions):,} ({doc.files:,} files, {doc.bytes:,} bytes)",
                ),
                ("calls", f"{t.calls:,}"),
                ("total cost", f"{t.cost} USD"),
                ("cache hit ratio", f"{t.cache_hit_ratio:.1%}"),
                (
                    "cache breaks",
                    f"{t.cache_breaks:,}, costing {t.cache_break_cost} USD extra",
                ),
                ("unreadable lines", f"{doc.skipped_lines:,} skipped"),
            )
        )
        + "</dl>",
        "<h2>Tokens</h2><table>",
        _row(["kind", "tokens", "share of input"], "th"),
        *(
            _row(
                [
                    label,
                    f"{n:,}",
                    f"{n / u.input_tokens:.1%}" if u.input_tokens and of_input else "",
                ]
            )
            for label, n, of_input in (
                ("input, all", u.input_tokens, True),
                ("\u2003uncached", u.uncached_input_tokens, True),
                ("\u2003cache reads", u.cache_read_tokens, True),
                ("\u2003cache writes", u.cache_write_tokens, True),
                ("output", u.output_tokens, False),
                ("\u2003of which reasoning", u.reasoning_tokens, True),
            )
        ),
        "</table>",
    ]
    if t.cache_breaks_by_reason:
        out.append(
            "<h2>Cache breaks by reason</h2><table>"
            + _row(["reason", "count", "extra cost (USD)"], "th")
        )
        out.extend(
            _row([r, str(v.count), v.extra_cost]) for r, v in t.cache_breaks_by_reason.items()
        )
        out.append("</table>")
    if doc.costliest_calls:
        out.append(
            "<h2>Costliest calls</h2><table>"
            + _row(["session", "call", "when", "model", "context", "cost (USD)"], "th")
        )
        out.extend(
            _row(
                [
                    c.session or "",
                    str(c.call),
                    c.ts,
                    c.model,
                    f"{c.context_tokens:,}",
                    c.cost,
                ]
            )
            for c in doc.costliest_calls
        )
        out.append("</table>")
    out += [
        "<h2>Sessions</h2><table>",
        _row(
            [
                "session",
                "project",
                "calls",
                "cost (USD)",
                "hit ratio",
                "breaks",
                "break cost (USD)",
                "quadratic",
            ],
            "th",
        ),
    ]
    ranked = sorted(report.sessions, key=lambda s: s.total.cost_units, reverse=True)
    for s in ranked:
        out.append(
            _row(
                [
                    s.id,
                    s.project,
                    f"{s.total.calls:,}",
                    money(s.total.cost),
                    f"{s.total.cache_hit_ratio:.1%}",
                    str(len(s.cache_breaks)),
                    money(s.break_cost),
                    "yes" if s.context and s.context.quadratic else "no",
                ]
            )
        )
    out.append("</table>")
    checked = [s for s in report.sessions if s.recorded]
    if checked:
        out.append(
            "<h2>Against the logs' own totals</h2><table>"
            + _row(["session", "source", "field", "in the log", "audited", "why they differ"], "th")
        )
        out += [
            _row([s.id, s.source, r.field, str(r.logged), str(r.audited), r.why or "they match"])
            for s in checked
            for r in s.recorded
        ]
        out.append("</table>")
    if report.what_if:
        header, rows = what_if_table(report.what_if)
        out.append("<h2>What-if (estimates, USD)</h2><table>" + _row(list(header), "th"))
        out += [_row(r) for r in rows]
        out.append(f"</table><p class='note'>{_html.escape(WHAT_IF_NOTE)}</p>")
    if len(ranked) > MAX_PLOTTED:
        out.append(f"<p class='note'>Plots for the {MAX_PLOTTED} costliest sessions.</p>")
    for s in ranked[:MAX_PLOTTED]:
        if s.series is None or not s.series.ts:  # (a log of totals only has no calls to plot)
            continue
        out.append(
            f"<h2>{_html.escape(s.id)}</h2><p class='note'>{_html.escape(s.source)} · "
            f"{_html.escape(s.project)} · {iso(s.first_ts)} → {iso(s.last_ts)} · "
            f"{s.total.calls:,} calls · {_html.escape(money(s.total.cost))} USD</p>"
        )
        out.append(f"<div class='plots'>{_plots(s)}</div>")
        if s.cache_breaks:
            out.append(
                "<table>"
                + _row(
                    ["call", "chain", "reason", "lost tokens", "idle (s)", "extra cost (USD)"], "th"
                )
            )
            for b in s.cache_breaks:
                j = b.doc()
                out.append(
                    _row(
                        [
                            str(j.call),
                            j.chain,
                            j.reason,
                            f"{j.lost_tokens:,}",
                            "" if j.gap_s is None else f"{j.gap_s:,.0f}",
                            j.extra_cost,
                        ]
                    )
                )
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)
