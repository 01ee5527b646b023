"""Plots written as SVG: readable ticks, labels that never overlap, valid markup."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from stayer.svgplot import (
    FONT,
    LINE,
    Point,
    Series,
    line_chart,
    nice_ticks,
    points_chart,
    strip_chart,
)


def test_ticks_are_round_and_cover_the_data():
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 0.0123) == [0, 0.005, 0.01, 0.015]
    ticks = nice_ticks(3, 187_000)
    assert ticks[0] <= 3 and ticks[-1] >= 187_000 and len(ticks) <= 8
    assert nice_ticks(5, 5)  # a single value still gets an axis


def test_labels_of_points_close_together_do_not_overlap():
    # Five configurations with nearly the same cost and success: their labels would sit on
    # top of each other where they are drawn.
    points = [Point(0.010 + i * 1e-5, 0.8, f"sim:model-{i} policy=auto") for i in range(5)]
    svg = points_chart(points, title="t", xlabel="cost", ylabel="success", ylim=(0.0, 1.0))
    ET.fromstring(svg)  # well-formed
    baselines = sorted(float(y) for y in re.findall(r'<text x="[0-9.]+" y="([0-9.]+)" fill=', svg))
    assert len(baselines) == 5
    assert all(b - a >= LINE - 1e-6 for a, b in zip(baselines, baselines[1:], strict=False))


def test_charts_escape_text_and_hold_no_nan():
    series = [
        Series("a<b", [(1, 10.0), (2, 30.0), (3, 20.0)]),
        Series("dots", [(1, 5.0)], dots=True),
    ]
    for svg in (
        line_chart(series, title="x & y", xlabel="step", marks=[2]),
        strip_chart([("cfg <1>", [0.1, 0.2]), ("empty", [])], title="cost", xlabel="USD"),
    ):
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg") and "nan" not in svg.lower()
        assert "a&lt;b" in svg or "cfg &lt;1&gt;" in svg
        assert f'font-size="{FONT}"' in svg
