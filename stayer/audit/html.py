"""``stayer audit --html``: one self-contained file, plots inline as SVG.

Per session, three plots over its calls in time order: context size (the prompt each call
sent; sub-agent calls as dots, cache breaks as red marks), cumulative cost, and the cache
hit ratio of each call. matplotlib draws them (the ``report`` extra:
``pip install 'stayer[report]'``); each figure is a ``Figure`` of its own, never pyplot's
global state. Only the costliest ``MAX_PLOTTED`` sessions get plots, so a report over
thousands of sessions stays small and quick; the table lists them all.
"""

from __future__ import annotations

import html as _html
import io
from typing import Any

from stayer.audit.analysis import SessionReport, iso, money
from stayer.audit.calls import MAIN_CHAIN
from stayer.audit.report import WHAT_IF_NOTE, AuditReport, what_if_table

MAX_PLOTTED = 50

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}h2{margin-top:2em}.plots{display:flex;flex-wrap:wrap;gap:1em}
.plots svg{width:380px;height:auto}.note{color:#666}
"""


def check_available() -> str | None:
    """None when plots can be drawn, else what to install."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "plots need matplotlib; install it with pip install 'stayer[report]'"
    return None


def _svg(draw: Any) -> str:
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2, 2.6), dpi=96)
    ax = fig.add_subplot()
    draw(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.StringIO()
    # Text as text, not glyph outlines: a fifth of the size, and searchable.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _plots(s: SessionReport) -> str:
    assert s.series is not None
    x = list(range(1, len(s.series.context) + 1))
    main = [(i, c) for i, c, ch in zip(x, s.series.context, s.series.chain, strict=True) if ch == MAIN_CHAIN]
    sub = [(i, c) for i, c, ch in zip(x, s.series.context, s.series.chain, strict=True) if ch != MAIN_CHAIN]
    breaks = [b.call for b in s.cache_breaks]

    def context(ax: Any) -> None:
        if main:
            ax.plot(*zip(*main, strict=True), lw=1.2, label="main")
        if sub:
            ax.plot(*zip(*sub, strict=True), ".", ms=3, label="sub-agents")
        for b in breaks:
            ax.axvline(b, color="tab:red", lw=0.6, alpha=0.6)
        ax.set_title("context size per call (tokens)", fontsize=9)
        ax.set_xlabel("call", fontsize=8)
        if main and sub:
            ax.legend(fontsize=7)

    def cost(ax: Any) -> None:
        ax.plot(x, s.series.cumulative_cost, lw=1.2, color="tab:green")
        ax.set_title("cumulative cost (USD)", fontsize=9)
        ax.set_xlabel("call", fontsize=8)

    def hits(ax: Any) -> None:
        ax.plot(x, s.series.hit_ratio, ".", ms=3, color="tab:purple")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title("cache hit ratio per call", fontsize=9)
        ax.set_xlabel("call", fontsize=8)

    return "".join(_svg(f) for f in (context, cost, hits))


def _row(cells: list[str], tag: str = "td") -> str:
    return "<tr>" + "".join(f"<{tag}>{_html.escape(c)}</{tag}>" for c in cells) + "</tr>"


def write_html(report: AuditReport) -> str:
    """The whole report as one HTML document (no external resources)."""
    doc = report.to_json()
    t = doc["totals"]
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>stayer audit</title>",
        f"<style>{_CSS}</style></head><body><h1>stayer audit</h1>",
        f"<p>{t['calls']:,} calls in {len(report.sessions):,} sessions · cost "
        f"{_html.escape(t['cost_usd'])} USD · cache hit ratio {t['cache_hit_ratio']:.1%} · "
        f"{t['cache_breaks']:,} cache breaks costing {_html.escape(t['cache_break_cost_usd'])} USD extra · "
        f"{doc['skipped_lines']:,} unreadable lines skipped</p>",
        "<table>",
        _row(["session", "project", "calls", "cost (USD)", "hit ratio", "breaks", "break cost (USD)", "quadratic"], "th"),
    ]
    ranked = sorted(report.sessions, key=lambda s: s.total.cost_priced, reverse=True)
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
    if report.what_if:
        header, rows = what_if_table(report.what_if)
        out.append("<h2>What-if (estimates, USD)</h2><table>" + _row(list(header), "th"))
        out += [_row(r) for r in rows]
        out.append(f"</table><p class='note'>{_html.escape(WHAT_IF_NOTE)}</p>")
    if len(ranked) > MAX_PLOTTED:
        out.append(f"<p class='note'>Plots for the {MAX_PLOTTED} costliest sessions.</p>")
    for s in ranked[:MAX_PLOTTED]:
        if s.series is None:
            continue
        out.append(
            f"<h2>{_html.escape(s.id)}</h2><p class='note'>{_html.escape(s.source)} · "
            f"{_html.escape(s.project)} · {iso(s.first_ts)} → {iso(s.last_ts)} · "
            f"{s.total.calls:,} calls · {_html.escape(money(s.total.cost))} USD</p>"
        )
        out.append(f"<div class='plots'>{_plots(s)}</div>")
        if s.cache_breaks:
            out.append("<table>" + _row(["call", "chain", "reason", "lost tokens", "idle (s)", "extra cost (USD)"], "th"))
            for b in s.cache_breaks:
                j = b.to_json()
                out.append(
                    _row(
                        [
                            str(j["call"]),
                            j["chain"],
                            j["reason"],
                            f"{j['lost_tokens']:,}",
                            "" if j["gap_s"] is None else f"{j['gap_s']:,.0f}",
                            j["extra_cost_usd"],
                        ]
                    )
                )
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)
