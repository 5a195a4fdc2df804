"""The study's PNG charts: baseline vs optimized total token throughput per profile
(``chart.png``), and, for profiles with load curves, the Pareto chart (``pareto.png``):
output tokens/s per accelerator vs output tokens/s per user, one line per configuration.

matplotlib (the ``perflab[charts]`` extra) is imported here only, and only to draw: a chart
whose inputs have not changed since it was written (its PNG carries their digest) is kept as it
is, so re-running a finished study or writing its report again draws nothing. Without
matplotlib the report is written without these two files (:func:`charts_available`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perflab.lab.decide import Slo
    from perflab.lab.report import ReportContext
    from perflab.lab.study import StudyOutcome

#: the PNG text chunk holding the digest of what a chart was drawn from
DIGEST_KEY = "perflab-inputs"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def charts_available() -> bool:
    """Whether matplotlib is installed: found, not imported (that takes 0.4 s)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # a module left half-imported, or made unimportable
        return False


def inputs_digest(spec: Any) -> str:
    """What a chart is drawn from: ``spec`` (JSON), this module's code and matplotlib's version."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    try:
        h.update(importlib.metadata.version("matplotlib").encode())
    except importlib.metadata.PackageNotFoundError:  # importable without its metadata (vendored): the code decides
        pass
    h.update(json.dumps(spec, sort_keys=True, default=str).encode())
    return h.hexdigest()


def png_text(path: Path) -> dict[str, str]:
    """A PNG's ``tEXt`` chunks (keyword -> text); {} for a file that is missing or not a PNG."""
    try:
        data = path.read_bytes()
    except OSError:
        return {}
    if not data.startswith(PNG_MAGIC):
        return {}
    out: dict[str, str] = {}
    pos = len(PNG_MAGIC)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"tEXt":
            key, _, value = data[pos + 8:pos + 8 + length].partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"IEND":
            break
        pos += 12 + length
    return out


def is_current(path: Path, digest: str) -> bool:
    return png_text(path).get(DIGEST_KEY) == digest


def _save(fig: Any, path: Path, digest: str, *, layout: bool = True) -> Path:
    """Lay out (unless done) and write ``fig`` as PNG atomically (a reader never sees half a
    file), the digest of its inputs in a text chunk."""
    import io

    from perflab.lab.store import write_atomic

    if layout:
        fig.tight_layout()
    buf = io.BytesIO()  # rendered first: only the write itself can meet the disk's faults
    fig.savefig(buf, format="png", metadata={DIGEST_KEY: digest})
    return write_atomic(path, buf.getvalue())


def write_chart(o: StudyOutcome, ctx: ReportContext, path: Path, *, title: str) -> Path:
    labels = [c.profile.label for c in o.cases]
    base = [c.baseline.tps or 0.0 for c in o.cases]
    opt = [(c.optimized.tps or 0.0) if c.optimized else 0.0 for c in o.cases]
    changes = [c.change_pct for c in o.cases]
    baseline_label = f"Baseline: {o.baseline.label}"
    opt_label = f"Optimized: {o.optimized.label}" if o.optimized else "Optimized: none"
    full_title = title + (" — simulated" if ctx.simulated else "")
    digest = inputs_digest(["chart", labels, base, opt, changes, baseline_label, opt_label, full_title])
    if is_current(path, digest):
        return path
    from matplotlib.figure import Figure

    width = 0.38
    xs = list(range(len(labels)))
    fig = Figure(figsize=(max(6.0, 1.6 * len(labels) + 2), 4.5), dpi=110)
    ax = fig.subplots()
    b1 = ax.bar([x - width / 2 for x in xs], base, width, label=baseline_label, color="#9aa5b1")
    b2 = ax.bar([x + width / 2 for x in xs], opt, width, label=opt_label, color="#2b8a3e")
    for rect, change in zip(b2, changes, strict=True):
        if change is None:
            continue
        ax.annotate(f"{change:+.1f}%", (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                    xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8,
                    color="#2b8a3e" if change >= 0 else "#c92a2a")
    for rect, value in zip(b1, base, strict=True):
        if value == 0.0:
            ax.annotate("n/a", (rect.get_x() + rect.get_width() / 2, 0), xytext=(0, 3),
                        textcoords="offset points", ha="center", fontsize=7)
    top = max([*base, *opt, 1.0])
    ax.set_ylim(0, top * 1.22)  # room for the labels and the legend
    ax.set_xticks(xs, labels, rotation=15 if len(labels) > 4 else 0)
    ax.set_ylabel("Total token throughput (tok/s)")
    ax.set_title(full_title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return _save(fig, path, digest)


def write_pareto(pareto: Sequence[dict[str, Any]], ctx: ReportContext, slo: Slo, path: Path, *, title: str) -> Path:
    """One panel per profile of :func:`perflab.lab.report.pareto_data` (:func:`pareto_figure`)."""
    limits = [slo.percentile, slo.limits()] if slo else None
    digest = inputs_digest(["pareto", list(pareto), limits, title, ctx.simulated])
    if is_current(path, digest):
        return path
    return _save(pareto_figure(pareto, slo, title=title, simulated=ctx.simulated), path, digest, layout=False)


def pareto_figure(pareto: Sequence[dict[str, Any]], slo: Slo, *, title: str, simulated: bool) -> Any:
    """The Pareto chart, laid out: per profile each configuration's curve in load order, each
    point labelled with its load where the label covers no other label (:func:`place_labels`),
    the points that missed the SLO crossed, the frontier's points ringed and joined."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(pareto)
    fig = Figure(figsize=(6.4 * n, 4.8), dpi=110)
    canvas = FigureCanvasAgg(fig)
    axes = fig.subplots(1, n, squeeze=False)
    labels: list[list[tuple[tuple[float, float], str, str]]] = []
    for ax, prof in zip(axes[0], pareto, strict=True):
        mine: list[tuple[tuple[float, float], str, str]] = []
        for cfg in prof["configurations"]:
            xs = [p["per_user"] for p in cfg["points"]]
            ys = [p["per_accelerator"] for p in cfg["points"]]
            (line,) = ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.5, label=cfg["label"])
            missed = [p for p in cfg["points"] if p.get("slo_met") is False]
            if missed:
                ax.scatter([p["per_user"] for p in missed], [p["per_accelerator"] for p in missed], marker="x",
                           s=40, color=line.get_color(), zorder=4)
            for p in cfg["points"]:
                load = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in p["load"].values())
                mine.append(((p["per_user"], p["per_accelerator"]), load, line.get_color()))
        labels.append(mine)
        front = sorted(prof["frontier"], key=lambda f: f["per_user"])
        ax.plot([f["per_user"] for f in front], [f["per_accelerator"] for f in front], linestyle=":",
                color="black", linewidth=1, zorder=1)
        ax.scatter([f["per_user"] for f in front], [f["per_accelerator"] for f in front], s=90,
                   facecolors="none", edgecolors="black", linewidths=1.4, zorder=3, label="Pareto frontier")
        if slo and any(p.get("slo_met") is False for c in prof["configurations"] for p in c["points"]):
            limits = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.limits().items())
            ax.scatter([], [], marker="x", color="grey", label=f"SLO missed (p{slo.percentile:g} {limits})")
        ax.set_xlabel("Output tokens/s per user (1000 / mean TPOT)")
        ax.set_ylabel("Output tokens/s per accelerator")
        ax.set_title(f"{prof['label']}" + (" — simulated" if simulated else ""), fontsize=10)
        ax.grid(alpha=0.3)
        ax.margins(0.08)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()  # the axes in their final places: the labels are placed in their pixels
    renderer = canvas.get_renderer()
    for ax, mine in zip(axes[0], labels, strict=True):
        place_labels(ax, mine, renderer)
    return fig


#: where a point's label may go, in points from the point (tried in order, then further out):
#: up-right first, as the labels always were
LABEL_OFFSETS = ((3, 3), (3, -3), (-3, 3), (-3, -3), (0, 6), (0, -6), (6, 0), (-6, 0))
LABEL_REACH = (1.0, 2.0, 3.0, 4.5, 6.0, 8.0)


def place_labels(ax: Any, items: Sequence[tuple[tuple[float, float], str, str]], renderer: Any,
                 fontsize: float = 6) -> list[Any]:
    """Annotate each ``(data point, text, colour)`` of ``ax`` at the first offset (greedy, in
    order) where its box, in the renderer's pixels, overlaps no label placed before it, covers
    no point and stays in the axes; failing that, where it overlaps no label; failing both
    (nowhere free within reach), at the first offset. Returns the annotations."""
    markers = []
    for xy, _, _ in items:
        px, py = ax.transData.transform(xy)
        markers.append((px - 3, py - 3, px + 3, py + 3))
    frame = ax.get_window_extent(renderer)
    placed: list[tuple[float, float, float, float]] = []
    out = []

    def hits(box: tuple[float, float, float, float], others: Sequence[tuple[float, float, float, float]]) -> bool:
        return any(box[0] < o[2] and o[0] < box[2] and box[1] < o[3] and o[1] < box[3] for o in others)

    for xy, text, colour in items:
        chosen = None
        for strict in (True, False):
            for reach in LABEL_REACH:
                for dx, dy in LABEL_OFFSETS:
                    ha = "left" if dx > 0 else "right" if dx < 0 else "center"
                    va = "bottom" if dy > 0 else "top" if dy < 0 else "center"
                    t = ax.annotate(text, xy, xytext=(dx * reach, dy * reach), textcoords="offset points",
                                    fontsize=fontsize, color=colour, ha=ha, va=va)
                    e = t.get_window_extent(renderer)
                    box = (e.x0 - 1, e.y0 - 1, e.x1 + 1, e.y1 + 1)  # a pixel apart at least
                    inside = frame.x0 <= box[0] and box[2] <= frame.x1 and frame.y0 <= box[1] and box[3] <= frame.y1
                    if not hits(box, placed) and (not strict or (inside and not hits(box, markers))):
                        chosen = (t, box)
                        break
                    t.remove()
                if chosen:
                    break
            if chosen:
                break
        if chosen is None:
            dx, dy = LABEL_OFFSETS[0]
            t = ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", fontsize=fontsize, color=colour)
            e = t.get_window_extent(renderer)
            chosen = (t, (e.x0, e.y0, e.x1, e.y1))
        placed.append(chosen[1])
        out.append(chosen[0])
    return out
