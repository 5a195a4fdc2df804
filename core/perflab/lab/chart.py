"""The study's PNG chart: baseline vs optimized total token throughput per profile.

matplotlib is imported here only, with the Agg backend (no display needed), so that the rest
of perflab starts without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perflab.lab.report import ReportContext
    from perflab.lab.study import StudyOutcome


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
        fig.tight_layout()
        tmp = path.with_suffix(".tmp.png")
        fig.savefig(tmp, format="png")
        tmp.replace(path)
    finally:
        plt.close(fig)
    return path
