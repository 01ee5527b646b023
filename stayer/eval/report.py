"""``report.html``: one self-contained page (inline SVG, no scripts, no links) that can be
mailed or opened offline: the cost–success Pareto plot, the per-task outcome grid, cost
distributions, and the tables behind them.

Plots need matplotlib (``pip install 'stayer[report]'``); without it the page still has
every table and says how to get the plots.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.note{color:#666}
"""


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prologue and doctype: inline SVG


def _figure(width: float, height: float) -> Any:
    # The object API (no pyplot): no global figure registry, no GUI backend.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def pareto_plot(configs: Sequence[dict[str, Any]], front: Sequence[dict[str, Any]]) -> str:
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    for c in configs:
        if c["mean_cost_usd"] in ("unknown", None) or c["success_rate"] is None:
            continue
        x, y = float(Decimal(c["mean_cost_usd"])), c["success_rate"]
        ax.errorbar(x, y, yerr=[[y - c["ci_low"]], [c["ci_high"] - y]], fmt="o", capsize=4)
        ax.annotate(c["label"], (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    if front:
        ax.plot(
            [float(Decimal(p["mean_cost_usd"])) for p in front],
            [p["success_rate"] for p in front],
            "--s", color="grey", markerfacecolor="none", markersize=14, label="Pareto frontier",
        )
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("mean cost per trial (USD)")
    ax.set_ylabel("success rate (Wilson 95 % interval)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    return _svg(fig)


def outcome_grid(tasks: Sequence[dict[str, Any]], configs: Sequence[dict[str, Any]]) -> str:
    ids = [c["id"] for c in configs]
    fig = _figure(1.6 + 1.4 * len(ids), 1.0 + 0.32 * len(tasks))
    ax = fig.add_subplot()
    cells = []
    for row in tasks:
        cells.append([
            row["results"][i]["successes"] / row["results"][i]["trials"] if row["results"][i]["trials"] else float("nan")
            for i in ids
        ])
    ax.imshow(cells, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    for y, row in enumerate(tasks):
        for x, i in enumerate(ids):
            r = row["results"][i]
            text = f"{r['successes']}/{r['trials']}" + (f" +{r['infra_errors']} infra" if r["infra_errors"] else "")
            ax.text(x, y, text, ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(ids)), [c["label"] for c in configs], rotation=20, ha="right", fontsize=8)
    ax.set_yticks(range(len(tasks)), [t["task"] for t in tasks], fontsize=8)
    ax.set_title("solved / judged trials per task", fontsize=9)
    return _svg(fig)


def cost_distribution(configs: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]]) -> str:
    fig = _figure(7, 3.5)
    ax = fig.add_subplot()
    data, labels = [], []
    for c in configs:
        costs = [
            float(Decimal(r["cost_usd"])) for r in records
            if r["config_key"] == c["id"] and r["cost_usd"] != "unknown"
        ]
        if costs:
            data.append(costs)
            labels.append(c["label"])
    if data:
        ax.boxplot(data, orientation="horizontal", showmeans=True)
        ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_xlabel("cost per trial (USD)")
    ax.grid(alpha=0.3, axis="x")
    return _svg(fig)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render(doc: dict[str, Any], records: Sequence[dict[str, Any]], title: str = "stayer eval") -> str:
    configs = doc["configs"]
    parts = [f"<h1>{html.escape(title)}</h1>"]
    parts.append("<h2>Configurations</h2>")
    parts.append(_table(
        ["configuration", "trials", "successes", "success rate", "95 % CI", "mean cost (USD)",
         "cost per success (USD)", "mean tokens", "infra errors"],
        [[c["label"], c["trials"], c["successes"], c["success_rate"],
          f"{_fmt(c['ci_low'])} – {_fmt(c['ci_high'])}", c["mean_cost_usd"],
          c["cost_per_success_usd"], c["mean_tokens"], c["infra_errors"]] for c in configs],
    ))
    ks = sorted({k for c in configs for k in c["pass_at_k"]}, key=int)
    parts.append(_table(
        ["configuration", *[f"pass@{k}" for k in ks], *[f"pass^{k}" for k in ks]],
        [[c["label"], *[c["pass_at_k"].get(k) for k in ks], *[c["pass_hat_k"].get(k) for k in ks]] for c in configs],
    ))
    if doc["comparisons"]:
        parts.append("<h2>Paired comparisons</h2>")
        parts.append(_table(
            ["A", "B", "pairs", "A only", "B only", "success diff (B − A)", "test", "p", "verdict", "cost diff (USD)"],
            [[x["a"]["label"], x["b"]["label"], x["pairs"], x["a_only"], x["b_only"], x["success_diff"],
              x["test"], x["p_value"], x["verdict"], x["cost_diff_usd"]] for x in doc["comparisons"]],
        ))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        parts.append("<p class=note>Plots need matplotlib: <code>pip install 'stayer[report]'</code>.</p>")
    else:
        parts.append("<h2>Cost vs success</h2>" + pareto_plot(configs, doc["pareto"]))
        parts.append("<h2>Outcomes per task</h2>" + outcome_grid(doc["tasks"], configs))
        parts.append("<h2>Cost per trial</h2>" + cost_distribution(configs, records))
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        + "\n".join(parts) + "</body></html>\n"
    )
