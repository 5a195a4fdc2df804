"""report.html's line charts (load curves, samples over time) as SVG text, written directly.

A grid of panels, one line per configuration in the same colour in every panel, one legend
for the figure. matplotlib took about 0.6 s of CPU per chart to lay out and draw the same
(most of ``perflab report``'s time, and every ``run`` paid it); this takes milliseconds, needs no
plotting library (report.html keeps these charts without ``perflab[charts]``), and writes the
same bytes for the same data. Text is SVG ``<text>`` in a generic sans-serif family, which every
browser has. Series longer than a panel is wide are thinned to their extremes per pixel
column, so a long run's chart stays small and keeps its peaks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

#: matplotlib's default colour cycle (tab10), as chart.png and pareto.png use it
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
LIMIT_COLOUR = "#c92a2a"
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
#: a panel's margins around its plot area (px): tick labels and the axis label left and below
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 24, 40
TITLE_H, LEGEND_ROW_H = 24, 16
CHAR_W = 0.6  # a sans-serif character's mean width per unit of font size, for laying out the legend


@dataclass(frozen=True)
class Line:
    """One configuration in one panel: ``points`` (x, y) in x order; ``missed``: points crossed
    (an SLO missed); ``markers``: a dot on each point; ``vlines``: x positions drawn as faint
    dotted lines of its colour (where one benchmark of a launch ended and the next began);
    ``joined`` False: the points alone, no line (a scatter); ``ring``: a ring round each point."""

    label: str
    points: tuple[tuple[float, float], ...]
    missed: tuple[tuple[float, float], ...] = ()
    markers: bool = False
    vlines: tuple[float, ...] = ()
    joined: bool = True
    ring: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    lines: tuple[Line, ...]
    limit: float | None = None  # a dashed horizontal line (an SLO's limit)


def nice_ticks(lo: float, hi: float, target: int = 5) -> tuple[list[float], float]:
    """Ticks at 1, 2, 2.5 or 5 × 10^k within [lo, hi], at most about ``target`` of them; and the step."""
    span = hi - lo
    mag = 10.0 ** math.floor(math.log10(span / target))
    step = mag * 10
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if span / (m * mag) <= target:
            step = m * mag
            break
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + step * 1e-9:
        ticks.append(k * step)
        k += 1
    return ticks, step


def tick_text(value: float, step: float, scale: tuple[float, str]) -> str:
    div, suffix = scale
    v, s = value / div, step / div
    exponent = math.floor(math.log10(s) + 1e-9)
    quarter = round(s / 10.0 ** exponent, 3) == 2.5  # 0.25, 2.5: one more digit than the step's power
    decimals = max(0, -exponent + (1 if quarter else 0))
    text = f"{v:.{decimals}f}"
    if text.lstrip("-").strip("0.") == "":
        return "0"
    return text + suffix


def _scale(ticks: Sequence[float]) -> tuple[float, str]:
    """Thousands and up as k, M, G (a panel's axis in 80 px of labels)."""
    top = max((abs(t) for t in ticks), default=0.0)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if top >= div:
            return (1e3 if suffix == "k" else div), suffix
    return 1.0, ""


def _domain(values: Sequence[float]) -> tuple[float, float]:
    """The data's range with 5 % on each side (matplotlib's margins); a flat one widened."""
    if not values:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def downsample(points: Sequence[tuple[float, float]], columns: int) -> list[tuple[float, float]]:
    """At most about 4 points per pixel column (each column's first, lowest, highest and last), in
    order: what a line of that width can show, its peaks kept."""
    if len(points) <= 4 * columns or columns < 1:
        return list(points)
    x0, x1 = points[0][0], points[-1][0]
    width = (x1 - x0) or 1.0
    keep: set[int] = set()
    bucket: list[int] = []
    current = None
    for i, (x, _) in enumerate(points):
        col = min(columns - 1, int((x - x0) / width * columns))
        if col != current and bucket:
            keep.update((bucket[0], bucket[-1], min(bucket, key=lambda j: points[j][1]),
                         max(bucket, key=lambda j: points[j][1])))
            bucket = []
        current = col
        bucket.append(i)
    if bucket:
        keep.update((bucket[0], bucket[-1], min(bucket, key=lambda j: points[j][1]),
                     max(bucket, key=lambda j: points[j][1])))
    return [points[i] for i in sorted(keep)]


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, text: str, *, size: float = 9, anchor: str = "middle", extra: str = "") -> str:
    return (f'<text x="{_f(x)}" y="{_f(y)}" font-size="{size:g}" text-anchor="{anchor}"{extra}>'
            f"{escape(text)}</text>")


def _cross(x: float, y: float, colour: str, r: float = 3.5) -> str:
    return (f'<path d="M{_f(x - r)},{_f(y - r)}L{_f(x + r)},{_f(y + r)}M{_f(x - r)},{_f(y + r)}L{_f(x + r)},{_f(y - r)}" '
            f'stroke="{colour}" stroke-width="1.4" fill="none"/>')


def _legend(entries: Sequence[tuple[str, str]], width: float, top: float) -> tuple[list[str], float]:
    """Entries (``(kind, label)``; kind a colour, ``"limit"``, ``"missed"``, or ``"dot:"`` /
    ``"ring:"`` and a colour for points not joined by a line) in rows across ``width``; the
    elements and the height used."""
    out: list[str] = []
    x, y, size = 10.0, top + 11, 9.0
    rows = 1
    for kind, label in entries:
        w = 26 + len(label) * size * CHAR_W + 14
        if x + w > width - 10 and x > 10:
            x, y, rows = 10.0, y + LEGEND_ROW_H, rows + 1
        if kind == "limit":
            out.append(f'<path d="M{_f(x)},{_f(y - 3)}h20" stroke="{LIMIT_COLOUR}" stroke-width="1" stroke-dasharray="4,2"/>')
        elif kind == "missed":
            out.append(_cross(x + 10, y - 3, "#808080"))
        elif kind.startswith("dot:"):
            out.append(f'<circle cx="{_f(x + 10)}" cy="{_f(y - 3)}" r="2" fill="{kind[4:]}"/>')
        elif kind.startswith("ring:"):
            out.append(f'<circle cx="{_f(x + 10)}" cy="{_f(y - 3)}" r="5" fill="none" stroke="{kind[5:]}" stroke-width="1.6"/>')
        else:
            out.append(f'<path d="M{_f(x)},{_f(y - 3)}h20" stroke="{kind}" stroke-width="2"/>')
        out.append(_text(x + 26, y, label, size=size, anchor="start"))
        x += w
    return out, rows * LEGEND_ROW_H + 4


def grid_svg(title: str, panels: Sequence[Panel], *, panel_w: float, panel_h: float, ncols: int = 3,
             missed_label: str | None = None) -> str:
    """The figure: ``title``, one legend (a line per configuration label, in the order they first
    appear; the limit; ``missed_label`` for the crosses when any), then the panels, ``ncols`` a row."""
    cols = max(1, min(ncols, len(panels)))
    rows = -(-len(panels) // cols) if panels else 0
    width = cols * panel_w
    labels = list(dict.fromkeys(line.label for p in panels for line in p.lines))
    colour = {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}
    alone = {line.label: "ring:" if line.ring else "dot:" for p in panels for line in p.lines if not line.joined}
    entries: list[tuple[str, str]] = [(alone.get(label, "") + colour[label], label) for label in labels]
    limits = sorted({p.limit for p in panels if p.limit is not None})
    if limits:
        entries.append(("limit", "limit " + ", ".join(f"{v:g}" for v in limits)))
    if missed_label and any(line.missed for p in panels for line in p.lines):
        entries.append(("missed", missed_label))
    legend, legend_h = _legend(entries, width, TITLE_H)
    top = TITLE_H + legend_h
    height = top + rows * panel_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_f(width)}" height="{_f(height)}" '
           f'viewBox="0 0 {_f(width)} {_f(height)}" font-family="{FONT}" fill="#222">',
           f'<rect width="{_f(width)}" height="{_f(height)}" fill="#fff"/>',
           _text(width / 2, 16, title, size=11),
           *legend]
    for i, panel in enumerate(panels):
        ox, oy = (i % cols) * panel_w, top + (i // cols) * panel_h
        out += _panel(panel, ox, oy, panel_w, panel_h, colour)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _panel(p: Panel, ox: float, oy: float, w: float, h: float, colour: dict[str, str]) -> list[str]:
    left, top = ox + LEFT, oy + TOP
    pw, ph = w - LEFT - RIGHT, h - TOP - BOTTOM
    xs = [x for line in p.lines for x, _ in (*line.points, *line.missed)]
    ys = [y for line in p.lines for _, y in (*line.points, *line.missed)] + ([p.limit] if p.limit is not None else [])
    x0, x1 = _domain(xs)
    y0, y1 = _domain(ys)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = []
    if p.title:
        out.append(_text(left + pw / 2, oy + 15, p.title, size=9.5))
    xt, xstep = nice_ticks(x0, x1)
    yt, ystep = nice_ticks(y0, y1)
    xscale, yscale = _scale(xt), _scale(yt)
    grid = "".join(f"M{_f(sx(t))},{_f(top)}v{_f(ph)}" for t in xt) + "".join(f"M{_f(left)},{_f(sy(t))}h{_f(pw)}" for t in yt)
    out.append(f'<path d="{grid}" stroke="#e3e3e3" stroke-width="0.8"/>')
    out += [_text(sx(t), top + ph + 12, tick_text(t, xstep, xscale), size=8) for t in xt]
    out += [_text(left - 4, sy(t) + 3, tick_text(t, ystep, yscale), size=8, anchor="end") for t in yt]
    out.append(_text(left + pw / 2, top + ph + 28, p.xlabel, size=8.5))
    if p.ylabel:
        cy = top + ph / 2
        out.append(_text(ox + 11, cy, p.ylabel, size=8.5, extra=f' transform="rotate(-90 {_f(ox + 11)} {_f(cy)})"'))
    if p.limit is not None:
        out.append(f'<path d="M{_f(left)},{_f(sy(p.limit))}h{_f(pw)}" stroke="{LIMIT_COLOUR}" stroke-width="1" '
                   f'stroke-dasharray="4,2"/>')
    for line in p.lines:
        c = colour[line.label]
        if line.vlines:
            d = "".join(f"M{_f(sx(v))},{_f(top)}v{_f(ph)}" for v in line.vlines if x0 <= v <= x1)
            out.append(f'<path d="{d}" stroke="{c}" stroke-opacity="0.35" stroke-width="0.8" stroke-dasharray="1,2"/>')
        pts = downsample(line.points, int(pw)) if line.joined else list(line.points)
        if pts and line.joined:
            path = "M" + "L".join(f"{_f(sx(x))},{_f(sy(y))}" for x, y in pts)
            out.append(f'<path d="{path}" stroke="{c}" stroke-width="1.3" fill="none" stroke-linejoin="round"/>')
        if line.markers:
            out += [f'<circle cx="{_f(sx(x))}" cy="{_f(sy(y))}" r="2" fill="{c}"/>' for x, y in pts]
        if line.ring:
            out += [f'<circle cx="{_f(sx(x))}" cy="{_f(sy(y))}" r="6" fill="none" stroke="{c}" stroke-width="1.6"/>'
                    for x, y in pts]
        out += [_cross(sx(x), sy(y), c) for x, y in line.missed]
    out.append(f'<rect x="{_f(left)}" y="{_f(top)}" width="{_f(pw)}" height="{_f(ph)}" fill="none" '
               f'stroke="#444" stroke-width="0.8"/>')
    return out


# --------------------------------------------------------------------------- the report's two charts


def load_curves_svg(title: str, load_name: str, curves: Sequence[tuple[str, Sequence[dict[str, Any]]]],
                    figures: Sequence[tuple[str, str, float | None]]) -> str:
    """One panel per figure (``(metric key, axis label, limit or None)``) against the load, one
    line per configuration (``(label, points)``, points as the executor records them: ``load``,
    ``metrics``, ``slo_met``); the points that missed the SLO crossed, a limit dashed."""
    panels = []
    for key, ylabel, limit in figures:
        lines = []
        for label, points in curves:
            xy = sorted((float(next(iter(p["load"].values()))), float(v), p.get("slo_met")) for p in points
                        if p.get("load") and isinstance(v := (p.get("metrics") or {}).get(key), (int, float)))
            if xy:
                lines.append(Line(label, tuple((x, y) for x, y, _ in xy),
                                  missed=tuple((x, y) for x, y, met in xy if met is False), markers=True))
        panels.append(Panel("", load_name, ylabel, tuple(lines), limit))
    return grid_svg(title, panels, panel_w=413, panel_h=298, missed_label="SLO missed")


def series_svg(title: str, series: Sequence[tuple[str, Sequence[tuple[float, Mapping[str, float]]]]],
               names: Sequence[str], *, boundaries: Mapping[str, Sequence[float]] | None = None,
               titles: Mapping[str, str] | None = None) -> str:
    """Values over time: one panel per value name (titled ``titles[name]``), one line per
    configuration (``(label, [(t, values)])``); ``boundaries``: per label, the times where one
    benchmark of a launch ended and the next began (a sweep's loads, repeats), drawn as faint
    vertical lines."""
    panels = []
    for name in names:
        lines = []
        for label, samples in series:
            pts = tuple((t, float(v[name])) for t, v in samples if isinstance(v.get(name), (int, float)))
            if pts:  # few samples: each one shown
                lines.append(Line(label, pts, markers=len(pts) <= 40, vlines=tuple((boundaries or {}).get(label, ()))))
        panels.append(Panel((titles or {}).get(name, name), "engine seconds", "", tuple(lines)))
    return grid_svg(title, panels, panel_w=413, panel_h=250)


def front_svg(title: str, xlabel: str, panels: Sequence[tuple[str, float | None]],
              trials: Sequence[tuple[float, Sequence[float], bool]], front: Sequence[tuple[float, Sequence[float]]],
              recommended: tuple[float, Sequence[float]] | None) -> str:
    """A Pareto front over a ranking figure (x) and latencies (y, one panel each: ``(axis
    label, limit or None)``): every trial a dot, crossed where it is not feasible (``trials``:
    ``(figure, latencies, feasible)``), the front's points joined in figure order, the
    recommended point ringed."""
    out = []
    for k, (ylabel, limit) in enumerate(panels):
        lines = [Line("trials", tuple((x, ys[k]) for x, ys, feasible in trials if feasible),
                      missed=tuple((x, ys[k]) for x, ys, feasible in trials if not feasible), markers=True, joined=False),
                 Line("Pareto front", tuple(sorted((x, ys[k]) for x, ys in front)), markers=True)]
        if recommended is not None:
            lines.append(Line("recommended", ((recommended[0], recommended[1][k]),), joined=False, ring=True))
        out.append(Panel(ylabel, xlabel, ylabel, tuple(lines), limit))
    return grid_svg(title, out, panel_w=413, panel_h=298, missed_label="infeasible (SLO missed, or not eligible)")
