"""Small plots as inline SVG, written directly: lines, points with intervals, strips.

The eval and audit reports draw a handful of simple charts; writing the SVG takes
milliseconds, where importing matplotlib took seconds (re-rendering a report is meant to be
instant) and made plots an optional extra. Every label is text in the page (searchable,
and the browser lays it out); point labels are moved apart so that they never overlap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f")
FONT = 11  # px; labels and ticks
LINE = FONT + 3  # px between stacked labels


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]: steps of 1, 2 or 5 × 10^k."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    base = 10 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def tick_text(value: float) -> str:
    a = abs(value)
    if a >= 1e6:
        return f"{value / 1e6:g}M"
    if a >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:.6g}"


@dataclass
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    dots: bool = False  # points instead of a line
    color: str | None = None


@dataclass
class Point:
    x: float
    y: float
    label: str
    low: float | None = None  # an interval on y
    high: float | None = None


@dataclass
class _Frame:
    """Axes in a ``width`` × ``height`` picture: scales, grid, ticks, labels, title."""

    width: int
    height: int
    x: tuple[float, float]
    y: tuple[float, float]
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    left: int = 62
    right: int = 16
    top: int = 26
    bottom: int = 40
    parts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.xticks = nice_ticks(*self.x)
        self.yticks = nice_ticks(*self.y)
        self.x = (min(self.x[0], self.xticks[0]), max(self.x[1], self.xticks[-1]))
        self.y = (min(self.y[0], self.yticks[0]), max(self.y[1], self.yticks[-1]))

    def sx(self, v: float) -> float:
        lo, hi = self.x
        return self.left + (v - lo) / ((hi - lo) or 1) * (self.width - self.left - self.right)

    def sy(self, v: float) -> float:
        lo, hi = self.y
        return (
            self.height
            - self.bottom
            - (v - lo) / ((hi - lo) or 1) * (self.height - self.top - self.bottom)
        )

    def axes(self) -> None:
        p = self.parts
        x0, x1 = self.sx(self.x[0]), self.sx(self.x[1])
        y0, y1 = self.sy(self.y[0]), self.sy(self.y[1])
        for t in self.xticks:
            x = self.sx(t)
            self.tick(t, (x, y0, x, y1), (x, y0 + FONT + 4), "middle")
        for t in self.yticks:
            y = self.sy(t)
            self.tick(t, (x0, y, x1, y), (x0 - 5, y + 4), "end")
        p.append(
            f'<rect x="{x0:.1f}" y="{y1:.1f}" width="{x1 - x0:.1f}" height="{y0 - y1:.1f}" fill="none" stroke="#999"/>'
        )
        if self.title:
            p.append(
                f'<text x="{self.width / 2:.1f}" y="{FONT + 4}" text-anchor="middle" font-weight="bold">{escape(self.title)}</text>'
            )
        if self.xlabel:
            p.append(
                f'<text x="{(x0 + x1) / 2:.1f}" y="{self.height - 6}" text-anchor="middle">{escape(self.xlabel)}</text>'
            )
        if self.ylabel:
            cy = (y0 + y1) / 2
            p.append(
                f'<text x="12" y="{cy:.1f}" text-anchor="middle" transform="rotate(-90 12 {cy:.1f})">{escape(self.ylabel)}</text>'
            )

    def tick(
        self,
        value: float,
        grid: tuple[float, float, float, float],
        label_at: tuple[float, float],
        anchor: str,
    ) -> None:
        """A tick of either axis: its grid line across the plot, and its label."""
        x1, y1, x2, y2 = grid
        self.parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="#e6e6e6"/>'
        )
        lx, ly = label_at
        self.parts.append(
            f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="{anchor}">{tick_text(value)}</text>'
        )

    def svg(self, description: str) -> str:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" '
            f'width="{self.width}" height="{self.height}" font-family="system-ui,sans-serif" '
            f'font-size="{FONT}" role="img"><title>{escape(description)}</title>'
            + "".join(self.parts)
            + "</svg>"
        )


def _span(
    values: Sequence[float], fixed: tuple[float, float] | None, from_zero: bool = True
) -> tuple[float, float]:
    if fixed is not None:
        return fixed
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return (0.0, 1.0)
    lo, hi = min(finite), max(finite)
    if from_zero:
        lo = min(lo, 0.0)
    return (lo, hi if hi > lo else lo + 1)


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    xlabel: str,
    ylabel: str = "",
    ylim: tuple[float, float] | None = None,
    marks: Sequence[float] = (),
    width: int = 420,
    height: int = 260,
) -> str:
    """Lines (or dots) over a shared x axis; ``marks`` are vertical red lines (events)."""
    xs = [p[0] for s in series for p in s.points] + list(marks)
    ys = [p[1] for s in series for p in s.points]
    f = _Frame(
        width, height, _span(xs, None, from_zero=False), _span(ys, ylim), title, xlabel, ylabel
    )
    f.axes()
    y0, y1 = f.sy(f.y[0]), f.sy(f.y[1])
    for m in marks:
        f.parts.append(
            f'<line x1="{f.sx(m):.1f}" y1="{y0:.1f}" x2="{f.sx(m):.1f}" y2="{y1:.1f}" stroke="#d62728" stroke-opacity="0.5"/>'
        )
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        if s.dots:
            f.parts.extend(
                f'<circle cx="{f.sx(x):.1f}" cy="{f.sy(y):.1f}" r="2" fill="{color}"/>'
                for x, y in s.points
            )
        elif s.points:
            path = " ".join(f"{f.sx(x):.1f},{f.sy(y):.1f}" for x, y in s.points)
            f.parts.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>'
            )
    if len(series) > 1:  # a legend, top left inside the axes
        for i, s in enumerate(series):
            color = s.color or PALETTE[i % len(PALETTE)]
            y = f.top + 14 + i * LINE
            f.parts.append(
                f'<rect x="{f.left + 8}" y="{y - 8}" width="10" height="10" fill="{color}"/>'
            )
            f.parts.append(f'<text x="{f.left + 22}" y="{y + 1}">{escape(s.label)}</text>')
    return f.svg(title)


def _place_labels(
    anchors: list[tuple[float, float, str]], top: float, bottom: float
) -> list[float]:
    """Baselines for labels right of their points, moved down (then up) until no two of
    them that would overlap horizontally share a line."""
    order = sorted(range(len(anchors)), key=lambda i: anchors[i][1])
    placed: list[tuple[float, float, float]] = []  # x start, x end, baseline
    out = [0.0] * len(anchors)
    for i in order:
        x, y, text = anchors[i]
        x0, x1 = x + 7, x + 7 + 0.6 * FONT * len(text)
        base = max(top + FONT, y - 5)

        def clashes(b: float, x0: float = x0, x1: float = x1) -> bool:
            return any(abs(b - pb) < LINE and x0 < px1 and px0 < x1 for px0, px1, pb in placed)

        while clashes(base) and base < bottom:
            base += LINE
        placed.append((x0, x1, base))
        out[i] = base
    return out


def points_chart(
    points: Sequence[Point],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    front: Sequence[tuple[float, float]] = (),
    ylim: tuple[float, float] | None = None,
    width: int = 640,
    height: int = 360,
) -> str:
    """Labelled points with intervals on y, and a dashed frontier through some of them."""
    xs = [p.x for p in points] + [x for x, _ in front]
    ys = [v for p in points for v in (p.y, p.low, p.high) if v is not None]
    lo, hi = _span(xs, None)
    f = _Frame(
        width, height, (lo, hi + (hi - lo) * 0.25), _span(ys, ylim), title, xlabel, ylabel, left=70
    )
    f.axes()
    if front:
        path = " ".join(f"{f.sx(x):.1f},{f.sy(y):.1f}" for x, y in sorted(front))
        f.parts.append(
            f'<polyline points="{path}" fill="none" stroke="#888" stroke-dasharray="5,4"/>'
        )
    anchors = [(f.sx(p.x), f.sy(p.y), p.label) for p in points]
    baselines = _place_labels(anchors, f.top, f.height - f.bottom)
    for i, p in enumerate(points):
        color = PALETTE[i % len(PALETTE)]
        x, y = anchors[i][0], anchors[i][1]
        if p.low is not None and p.high is not None:
            a, b = f.sy(p.low), f.sy(p.high)
            f.parts.append(
                f'<line x1="{x:.1f}" y1="{a:.1f}" x2="{x:.1f}" y2="{b:.1f}" stroke="{color}"/>'
            )
            for e in (a, b):
                f.parts.append(
                    f'<line x1="{x - 4:.1f}" y1="{e:.1f}" x2="{x + 4:.1f}" y2="{e:.1f}" stroke="{color}"/>'
                )
        f.parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}"><title>{escape(p.label)}</title></circle>'
        )
        f.parts.append(
            f'<text x="{x + 7:.1f}" y="{baselines[i]:.1f}" fill="{color}">{escape(p.label)}</text>'
        )
    return f.svg(title)


def strip_chart(
    groups: Sequence[tuple[str, Sequence[float]]], *, title: str, xlabel: str, width: int = 640
) -> str:
    """One row per group: every value as a dot, the mean as a bar; labels left of the rows."""
    label_width = min(260, 14 + int(0.6 * FONT * max((len(g) for g, _ in groups), default=4)))
    height = 60 + LINE * 2 * max(len(groups), 1)
    values = [v for _, vs in groups for v in vs]
    f = _Frame(
        width,
        height,
        _span(values, None),
        (0, max(len(groups), 1)),
        title,
        xlabel,
        left=label_width,
    )
    f.yticks = []
    f.axes()
    for i, (label, vs) in enumerate(groups):
        color = PALETTE[i % len(PALETTE)]
        y = f.sy(len(groups) - i - 0.5)
        f.parts.append(
            f'<text x="{label_width - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>'
        )
        f.parts.extend(
            f'<circle cx="{f.sx(v):.1f}" cy="{y:.1f}" r="3" fill="{color}" fill-opacity="0.6"/>'
            for v in vs
        )
        if vs:
            m = f.sx(sum(vs) / len(vs))
            f.parts.append(
                f'<line x1="{m:.1f}" y1="{y - 9:.1f}" x2="{m:.1f}" y2="{y + 9:.1f}" stroke="#222" stroke-width="2"><title>mean</title></line>'
            )
    return f.svg(title)
