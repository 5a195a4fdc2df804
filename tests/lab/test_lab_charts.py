"""The report's charts: the Pareto chart's point labels never cover one another, however
crowded the curves; report.html's SVG charts (perflab.lab.report.svgchart): readable ticks,
long series thinned to their extremes, the same bytes for the same data."""

from __future__ import annotations

import itertools

from perflab.lab.report.chart import pareto_figure
from perflab.lab.report.svgchart import downsample, nice_ticks, series_svg, tick_text


def _crowded(configs: int = 7, loads: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)) -> dict:
    """Curves a few pixels apart, every point labelled: where fixed offsets piled labels up."""
    out = []
    for i in range(configs):
        points = [{"load": {"max_concurrency": c}, "per_user": 40 - 4.2 * j + 0.3 * i,
                   "per_accelerator": 20 * (j + 1) ** 1.6 + 6 * i, "slo_met": j < 6}
                  for j, c in enumerate(loads)]
        out.append({"label": f"configuration {i}", "points": points})
    return {"label": "Crowded", "configurations": out, "frontier": [out[-1]["points"][0], out[-1]["points"][-1]]}


def test_pareto_point_labels_do_not_overlap():
    fig = pareto_figure([_crowded(), _crowded(3)], None, title="crowded", simulated=True)
    fig.canvas.draw()  # the figure as saved: limits, layout and every text final
    renderer = fig.canvas.get_renderer()
    for ax, n in zip(fig.axes, (7 * 8, 3 * 8), strict=True):
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert len(boxes) == n  # every point keeps its label
        overlapping = [(ax.texts[a].get_text(), ax.texts[b].get_text())
                       for a, b in itertools.combinations(range(len(boxes)), 2) if boxes[a].overlaps(boxes[b])]
        assert overlapping == []


def test_ticks_and_their_text():
    ticks, step = nice_ticks(-50, 1050)
    assert ticks == [0, 250, 500, 750, 1000] and step == 250
    assert [tick_text(t, step, (1.0, "")) for t in ticks] == ["0", "250", "500", "750", "1000"]
    ticks, step = nice_ticks(-0.05, 1.05)
    assert [tick_text(t, step, (1.0, "")) for t in ticks] == ["0", "0.25", "0.50", "0.75", "1.00"]
    ticks, step = nice_ticks(0, 3e5)
    assert [tick_text(t, step, (1e3, "k")) for t in ticks] == ["0", "100k", "200k", "300k"]


def test_long_series_keep_their_extremes_and_the_same_data_the_same_bytes():
    points = [(float(t), 100.0 if t == 5003 else -5.0 if t == 7001 else float(t % 7)) for t in range(20_000)]
    thin = downsample(points, 350)
    assert len(thin) <= 4 * 350 and (5003.0, 100.0) in thin and (7001.0, -5.0) in thin
    assert thin[0] == points[0] and thin[-1] == points[-1] and thin == sorted(thin)
    series = [("vLLM", [(t, {"running": y}) for t, y in points])]
    svg = series_svg("Engine metrics over time", series, ["running"])
    assert svg == series_svg("Engine metrics over time", series, ["running"])
    assert svg.startswith("<svg ") and svg.count("L") < 4 * 350 + 50 and "running" in svg
