"""The study's PNG charts: baseline vs optimized total token throughput per profile
(``chart.png``), and, for profiles with load curves, the Pareto chart (``pareto.png``):
output tokens/s per accelerator vs output tokens/s per user, one line per configuration.

matplotlib is imported here only, with the Agg backend (no display needed), so that the rest
of perflab starts without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perflab.lab.decide import Slo
    from perflab.lab.report import ReportContext
    from perflab.lab.study import StudyOutcome


def _save(fig: Any, path: Path) -> Path:
    """Lay out and write ``fig`` as PNG atomically (a reader never sees half a file)."""
    import io

    from perflab.lab.store import write_atomic

    fig.tight_layout()
    buf = io.BytesIO()  # rendered first: only the write itself can meet the disk's faults
    fig.savefig(buf, format="png")
    return write_atomic(path, buf.getvalue())


def write_chart(o: StudyOutcome, ctx: ReportContext, path: Path, *, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    labels = [c.profile.label for c in o.cases]
    base = [c.baseline.tps or 0.0 for c in o.cases]
    opt = [(c.optimized.tps or 0.0) if c.optimized else 0.0 for c in o.cases]
    width = 0.38
    xs = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(labels) + 2), 4.5), dpi=110)
    try:
        b1 = ax.bar([x - width / 2 for x in xs], base, width, label=f"Baseline: {o.baseline.label}", color="#9aa5b1")
        opt_label = f"Optimized: {o.optimized.label}" if o.optimized else "Optimized: none"
        b2 = ax.bar([x + width / 2 for x in xs], opt, width, label=opt_label, color="#2b8a3e")
        for rect, c in zip(b2, o.cases, strict=True):
            change = c.change_pct
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
        ax.set_title(title + (" — simulated" if ctx.simulated else ""), fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        return _save(fig, path)
    finally:
        plt.close(fig)


def write_pareto(pareto: Sequence[dict[str, Any]], ctx: ReportContext, slo: Slo, path: Path, *, title: str) -> Path:
    """One panel per profile of :func:`perflab.lab.report.pareto_data`: each configuration's
    curve in load order, each point labelled with its load, the points that missed the SLO
    crossed, the frontier's points ringed and joined."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    n = len(pareto)
    fig, axes = plt.subplots(1, n, figsize=(6.4 * n, 4.8), dpi=110, squeeze=False)
    try:
        for ax, prof in zip(axes[0], pareto, strict=True):
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
                    ax.annotate(load, (p["per_user"], p["per_accelerator"]), xytext=(3, 3),
                                textcoords="offset points", fontsize=6, color=line.get_color())
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
            ax.set_title(f"{prof['label']}" + (" — simulated" if ctx.simulated else ""), fontsize=10)
            ax.grid(alpha=0.3)
            ax.margins(0.08)
            ax.legend(fontsize=7, loc="best")
        fig.suptitle(title, fontsize=10)
        return _save(fig, path)
    finally:
        plt.close(fig)
