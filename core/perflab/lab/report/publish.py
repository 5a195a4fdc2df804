"""A study's report files: report.md, report.json, chart.png, pareto.png, front.svg and report.html.

Above :mod:`perflab.lab.report` (the Markdown and JSON), :mod:`perflab.lab.report.chart`,
:mod:`perflab.lab.report.html` and :mod:`perflab.lab.report.audit` (which checks the page before it is
written): those read the report's context and rendering from below, never this writer.
"""

from __future__ import annotations

import json
from pathlib import Path

from perflab import redact
from perflab.lab.report import (
    CHART_NAME,
    FRONT_NAME,
    PARETO_NAME,
    ReportContext,
    build_json,
    front_chart,
    pareto_data,
    render_markdown,
    title_of,
)
from perflab.lab.report.audit import audit_written_report
from perflab.lab.report.chart import charts_available, write_chart, write_pareto
from perflab.lab.report.html import write_html
from perflab.lab.store import write_atomic, write_json
from perflab.lab.study import StudyOutcome


def write_report(o: StudyOutcome, ctx: ReportContext, directory: Path) -> dict[str, Path]:
    """Write report.md, report.json, chart.png, with load curves pareto.png, and report.html
    into ``directory``; return their paths. Without matplotlib (``perflab[charts]``) there is no
    chart.png nor pareto.png, and report.md and report.html say so where they would be."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": directory / "report.md", "json": directory / "report.json"}
    charts = charts_available()
    pareto = pareto_data(o)
    if charts:
        try:
            paths["chart"] = write_chart(o, ctx, directory / CHART_NAME, title=title_of(o, ctx))
            if pareto:
                paths["pareto"] = write_pareto(pareto, ctx, o.plan.decision.slo, directory / PARETO_NAME,
                                               title=title_of(o, ctx))
        except ImportError:  # found but broken (a partial install): the report without its PNG charts
            charts = False
            paths.pop("chart", None)
    if not charts:  # an earlier run's charts would show other figures than these
        for name in (CHART_NAME, PARETO_NAME):
            (directory / name).unlink(missing_ok=True)
    if (front := front_chart(o, ctx)) is not None:  # an SLO plan's Pareto front: no plotting library needed
        paths["front"] = write_atomic(directory / FRONT_NAME, front.encode("utf-8"))
    else:
        (directory / FRONT_NAME).unlink(missing_ok=True)
    data = json.loads(json.dumps(build_json(o, ctx)))
    markdown = audit_written_report(render_markdown(o, ctx, charts=charts), data)  # perflab audit: "Consistency check", "audit"
    text = redact.scrub(markdown)
    write_atomic(paths["markdown"], text)
    write_json(paths["json"], data)
    paths["html"] = write_html(text, o, ctx, directory)  # report.md's text with the charts, one page (perflab.lab.report.html)
    return paths


__all__ = ["write_report"]
