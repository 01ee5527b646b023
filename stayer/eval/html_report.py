"""``report.html``: one self-contained page (inline SVG, no scripts, nothing fetched) that
can be mailed or opened offline — a header (when, which stayer, the settings, total cost
and time), the configurations and their comparisons, the cost–success plot, the outcome
grid per task, cost per trial, and every trial, linked to a page per run (``runs/ID.html``:
the transcript, per-step cost, context and cache, cache breaks and compactions).

Plots are written as SVG directly (``stayer.svgplot``): rendering a report takes
milliseconds, so re-running an evaluation whose trials are all done is instant.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec

from stayer.eval.records import (
    ConfigSummary,
    EvalDocument,
    EvalSummary,
    ParetoPoint,
    TaskResults,
    TrialRecord,
    as_trials,
)
from stayer.money import Usd, usd_sum
from stayer.records import Record, decode, to_json
from stayer.svgplot import Point, Series, line_chart, points_chart, strip_chart

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222;line-height:1.4}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.note{color:#666}
.header{display:grid;grid-template-columns:max-content auto;gap:2px 1em;margin:1em 0}.header dt{color:#666}
.header dd{margin:0}td.grid{text-align:center;min-width:6em}td.left{text-align:left}
pre{white-space:pre-wrap;background:#f7f7f7;padding:.5em;margin:.2em 0;max-height:24em;overflow:auto}
.msg{border-left:3px solid #ccc;padding-left:.6em;margin:.8em 0}.msg.assistant{border-color:#1f77b4}
.msg.tool{border-color:#2ca02c}td a{white-space:nowrap}.msg.user{border-color:#999}.plots{display:flex;flex-wrap:wrap;gap:1em}
"""


def fmt(value: Any, digits: int = 3) -> str:
    """A cell for people: "—" for nothing, floats rounded."""
    if value is None or value == "":
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def usd(value: Any) -> str:
    return "—" if value in (None, "") else Usd.parse(value).format()


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Cells are escaped text, except those given as ``("html", markup)``."""

    def cell(v: Any) -> str:
        if isinstance(v, tuple) and v and v[0] == "html":
            return f"<td>{v[1]}</td>"
        return f"<td>{html.escape(fmt(v))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def page(title: str, body: Sequence[str]) -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def total_cost(records: Sequence[TrialRecord]) -> str:
    return str(usd_sum(r.cost for r in records))


def header(doc: EvalDocument | EvalSummary, records: Sequence[TrialRecord]) -> str:
    full = doc if isinstance(doc, EvalDocument) else None
    settings = to_json(full.settings) if full else {}
    rows = [
        ("date", full.finished if full else "—"),
        ("stayer", full.stayer_version if full else "—"),
        ("suite", full.suite if full else "—"),
        (
            "trials",
            f"{full.trials_total if full else len(records)} ({full.trials_reused if full else 0} reused from an earlier run)",
        ),
        ("total cost", usd(total_cost(records))),
        (
            "wall time",
            f"{fmt(full.wall_s if full else None, 1)} s (trials together: {sum(r.wall_s or 0 for r in records):,.1f} s)",
        ),
        *((k.replace("_", " "), fmt(v)) for k, v in settings.items()),
    ]
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in rows)
    return f"<dl class=header>{items}</dl>"


def _known(amount: str | None) -> float | None:
    """A money string as a float to plot; None where there is none or it is unknown."""
    known = Usd.parse(amount).amount
    return None if known is None else float(known)


def pareto_plot(configs: Sequence[ConfigSummary], front: Sequence[ParetoPoint]) -> str:
    points = [
        Point(cost, c.success_rate, c.label, c.ci_low, c.ci_high)
        for c in configs
        if (cost := _known(c.mean_cost_usd)) is not None and c.success_rate is not None
    ]
    frontier = [
        (cost, p.success_rate)
        for p in front
        if (cost := _known(p.mean_cost_usd)) is not None and p.success_rate is not None
    ]
    return points_chart(
        points,
        front=frontier,
        ylim=(0.0, 1.0),
        title="cost vs success (dashed: Pareto frontier)",
        xlabel="mean cost per trial (USD)",
        ylabel="success rate (Wilson 95 % interval)",
    )


def outcome_grid(tasks: Sequence[TaskResults], configs: Sequence[ConfigSummary]) -> str:
    """Tasks × configurations as a table coloured by success: labels are plain text."""
    head = (
        "<tr><th>task</th>" + "".join(f"<th>{html.escape(c.label)}</th>" for c in configs) + "</tr>"
    )
    rows = []
    for t in tasks:
        cells = []
        for c in configs:
            r = t.results[c.id]
            rate = r.successes / r.trials if r.trials else None
            text = f"{r.successes}/{r.trials}" + (
                f" (+{r.infra_errors} infra)" if r.infra_errors else ""
            )
            color = "#eee" if rate is None else f"hsl({round(120 * rate)},60%,80%)"
            cells.append(f"<td class=grid style='background:{color}'>{html.escape(text)}</td>")
        rows.append(f"<tr><td>{html.escape(t.task)}</td>{''.join(cells)}</tr>")
    return f"<table>{head}{''.join(rows)}</table><p class=note>solved / judged trials per task</p>"


def cost_distribution(configs: Sequence[ConfigSummary], records: Sequence[TrialRecord]) -> str:
    groups = [
        (
            c.label,
            [
                float(r.cost.amount)
                for r in records
                if r.config_key == c.id and r.cost.amount is not None
            ],
        )
        for c in configs
    ]
    return strip_chart(groups, title="cost per trial (bar: mean)", xlabel="cost per trial (USD)")


def run_link(record: TrialRecord) -> Any:
    run_id = record.run_id
    if not run_id:
        return None
    return ("html", f"<a href='runs/{html.escape(run_id)}.html'>{html.escape(run_id)}</a>")


def render(
    doc: EvalDocument | EvalSummary,
    records: Sequence[TrialRecord | dict[str, Any]],
    title: str = "stayer eval",
) -> str:
    """The page of ``doc`` and its trials' records (or their JSON documents)."""
    records = as_trials(records)
    configs = doc.configs
    parts = [f"<h1>{html.escape(title)}</h1>", header(doc, records), "<h2>Configurations</h2>"]
    parts.append(
        table(
            [
                "configuration",
                "trials",
                "successes",
                "success rate",
                "95 % CI",
                "mean cost",
                "cost per success",
                "mean tokens",
                "infra errors",
            ],
            [
                [
                    c.label,
                    c.trials,
                    c.successes,
                    c.success_rate,
                    f"{fmt(c.ci_low)} – {fmt(c.ci_high)}",
                    usd(c.mean_cost_usd),
                    usd(c.cost_per_success_usd),
                    c.mean_tokens,
                    c.infra_errors,
                ]
                for c in configs
            ],
        )
    )
    ks = sorted({k for c in configs for k in c.pass_at_k}, key=int)
    parts.append(
        table(
            ["configuration", *[f"pass@{k}" for k in ks], *[f"pass^{k}" for k in ks]],
            [
                [
                    c.label,
                    *[c.pass_at_k.get(k) for k in ks],
                    *[c.pass_hat_k.get(k) for k in ks],
                ]
                for c in configs
            ],
        )
    )
    if doc.comparisons:
        parts.append("<h2>Paired comparisons</h2>")
        parts.append(
            table(
                [
                    "A",
                    "B",
                    "pairs",
                    "A only",
                    "B only",
                    "success diff (B − A)",
                    "test",
                    "p",
                    "verdict",
                    "cost diff",
                ],
                [
                    [
                        x.a.label,
                        x.b.label,
                        x.pairs,
                        x.a_only,
                        x.b_only,
                        x.success_diff,
                        x.test,
                        x.p_value,
                        x.verdict,
                        usd(x.cost_diff_usd),
                    ]
                    for x in doc.comparisons
                ],
            )
        )
    parts.append("<h2>Cost vs success</h2>" + pareto_plot(configs, doc.pareto))
    parts.append("<h2>Outcomes per task</h2>" + outcome_grid(doc.tasks, configs))
    parts.append("<h2>Cost per trial</h2>" + cost_distribution(configs, records))
    parts.append("<h2>Trials</h2>")
    labels = {c.id: c.label for c in configs}
    ordered = sorted(records, key=lambda r: (r.task, labels.get(r.config_key, ""), r.epoch))
    parts.append(
        table(
            [
                "task",
                "configuration",
                "epoch",
                "status",
                "reward",
                "steps",
                "cost",
                "wall s",
                "run",
                "why",
            ],
            [
                [
                    r.task,
                    labels.get(r.config_key, r.config_key),
                    r.epoch,
                    r.status,
                    r.reward,
                    r.steps,
                    usd(r.cost_usd),
                    r.wall_s,
                    run_link(r),
                    r.error or (r.stop_reason if isinstance(r.stop_reason, str) else None),
                ]
                for r in ordered
            ],
        )
    )
    return page(title, parts)


# --- one run ---------------------------------------------------------------------------------


class _ToolCall(Record):
    name: str = "?"
    arguments: str = ""


class _CacheBreak(Record, kw_only=True):
    reason: str = ""
    detail: str | None = None


class _Compaction(Record, kw_only=True):
    tokens_before: int = 0
    tokens_after: int = 0
    reason: str = ""


class _Step(Record, kw_only=True):
    """What a run page shows of a ledger entry (its JSON, as ``result.json`` holds it)."""

    kind: str | None = None
    step: int = 0
    model: str | None = None
    context_tokens: int | None = None
    cache_hit_ratio: float = 0.0
    cost_usd: str = "unknown"
    tool_calls: list[_ToolCall] = msgspec.field(default_factory=list)
    tool_errors: int = 0
    cache_break: _CacheBreak | None = None
    compaction: _Compaction | None = None


class _Verifier(Record, kw_only=True):
    output_tail: str | None = None


class ResultPage(Record, kw_only=True):
    """What a run page shows of a run's ``result.json`` (read without ``stayer.run``: a
    re-rendered evaluation loads neither the agent nor the price data)."""

    run_id: str = ""
    task: str | None = None
    model: str | None = None
    status: str | None = None
    reward: float | None = None
    steps: int | None = None
    cost_usd: str | None = None
    stop_reason: str | None = None
    started: str | None = None
    finished: str | None = None
    summary: str | None = None
    verifier: _Verifier | None = None
    ledger: list[_Step] = msgspec.field(default_factory=list)


class TranscriptMessage(Record, kw_only=True):
    role: str = "?"
    content: str | None = None
    tool_calls: list[_ToolCall] = msgspec.field(default_factory=list)
    kind: str | None = None


def read_run(run_dir: Path) -> tuple[ResultPage, list[TranscriptMessage]] | None:
    """A run's result document and transcript, or None if it left no result."""
    try:
        result = decode((run_dir / "result.json").read_bytes(), ResultPage)
    except (OSError, ValueError):  # msgspec's errors are ValueErrors
        return None
    transcript = []
    try:
        for line in (run_dir / "trajectory.jsonl").read_bytes().splitlines():
            if line.strip():
                try:
                    transcript.append(decode(line, TranscriptMessage))
                except ValueError:
                    break  # a torn last line
    except OSError:
        pass
    return result, transcript


def run_page(result: ResultPage, transcript: Sequence[TranscriptMessage]) -> str:
    """One run: summary, per-step plots, the ledger with cache breaks and compactions, and
    the transcript."""
    ledger = [e for e in result.ledger if e.kind != "lost_in_flight"]
    title = f"run {result.run_id}"
    parts = [
        "<p><a href='../report.html'>← evaluation report</a></p>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    facts = [
        ("task", result.task),
        ("model", result.model),
        ("status", result.status),
        ("reward", result.reward),
        ("steps", result.steps),
        ("cost", usd(result.cost_usd)),
        ("stop reason", result.stop_reason),
        ("started", result.started),
        ("finished", result.finished),
    ]
    parts.append(
        "<dl class=header>"
        + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(fmt(v))}</dd>" for k, v in facts)
        + "</dl>"
    )
    if result.summary:
        parts.append(f"<h2>Summary</h2><pre>{html.escape(result.summary)}</pre>")
    tail = result.verifier.output_tail if result.verifier else None
    if tail and result.status != "succeeded":
        parts.append(f"<h2>Verifier output</h2><pre>{html.escape(tail)}</pre>")
    if ledger:
        steps = [e.step for e in ledger]
        running, costs = Decimal(0), []
        for e in ledger:
            running += Usd.parse(e.cost_usd).amount or Decimal(0)
            costs.append((e.step, float(running)))
        breaks = [e.step for e in ledger if e.cache_break]
        parts.append("<h2>Per step</h2><div class=plots>")
        parts.append(
            line_chart(
                [Series("cost", costs)], title="cumulative cost (USD)", xlabel="step", marks=breaks
            )
        )
        parts.append(
            line_chart(
                # Calls lost in flight or cut short carry no context size: they are not plotted.
                [
                    Series(
                        "context",
                        [
                            (e.step, e.context_tokens)
                            for e in ledger
                            if e.context_tokens is not None
                        ],
                    )
                ],
                title="context (tokens); red: cache breaks",
                xlabel="step",
                marks=breaks,
            )
        )
        parts.append(
            line_chart(
                [
                    Series(
                        "hit ratio",
                        list(zip(steps, [e.cache_hit_ratio for e in ledger], strict=True)),
                        dots=True,
                    )
                ],
                title="cache hit ratio",
                xlabel="step",
                ylim=(0.0, 1.0),
            )
        )
        parts.append("</div>")
        parts.append(
            table(
                [
                    "step",
                    "model",
                    "context",
                    "cache %",
                    "cost",
                    "tools",
                    "tool errors",
                    "cache break",
                    "compaction",
                ],
                [
                    [
                        e.step,
                        e.model,
                        f"{e.context_tokens:,}" if e.context_tokens is not None else None,
                        f"{e.cache_hit_ratio * 100:.1f}",
                        usd(e.cost_usd),
                        ", ".join(c.name for c in e.tool_calls) or "—",
                        e.tool_errors,
                        f"{e.cache_break.reason}: {e.cache_break.detail or ''}"
                        if e.cache_break
                        else None,
                        (
                            f"{e.compaction.tokens_before:,} → {e.compaction.tokens_after:,} ({e.compaction.reason})"
                            if e.compaction
                            else None
                        ),
                    ]
                    for e in ledger
                ],
            )
        )
    if transcript:
        parts.append("<h2>Transcript</h2>")
        for m in transcript:
            calls = "".join(
                f"<pre>→ {html.escape(c.name)} {html.escape(call_text(c.arguments))}</pre>"
                for c in m.tool_calls
            )
            kind = f" · {html.escape(m.kind)}" if m.kind else ""
            parts.append(
                f"<div class='msg {html.escape(m.role)}'><b>{html.escape(m.role)}</b>{kind}"
                f"<pre>{html.escape(m.content or '')}</pre>{calls}</div>"
            )
    return page(title, parts)


def call_text(arguments: str) -> str:
    """A tool call's arguments for reading: a bash command as the command itself."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(args, dict) and set(args) == {"command"} and isinstance(args["command"], str):
        return args["command"]
    return json.dumps(args, indent=1, ensure_ascii=False)


def write_run_pages(out: Path, records: Sequence[TrialRecord], write: Any) -> int:
    """``out/runs/ID.html`` for every trial whose run left a result; the number written."""
    written = 0
    for r in records:
        if not r.run_id or not isinstance(r.run_dir, str) or not r.run_dir:
            continue
        found = read_run(Path(r.run_dir))
        if found is None:
            continue
        write(out / "runs" / f"{r.run_id}.html", run_page(*found))
        written += 1
    return written
