"""``perflab compare STUDY_A STUDY_B``: what changed between two studies of one plan."""

from __future__ import annotations

import json
from pathlib import Path

import click

from perflab import redact
from perflab.lab.report.compare import DEFAULT_TAIL_THRESHOLD_PCT, DEFAULT_THRESHOLD_PCT, Change, Comparison


@click.command("compare")
@click.argument("study_a", metavar="STUDY_A", type=click.Path(path_type=Path))
@click.argument("study_b", metavar="STUDY_B", type=click.Path(path_type=Path))
@click.option("--threshold", "threshold_pct", type=float, default=DEFAULT_THRESHOLD_PCT, show_default=True,
              metavar="PCT", help="A change for the worse smaller than PCT % is never a regression (with repeats, "
                                  "it must also exceed the measured noise).")
@click.option("--tail-threshold", "tail_threshold_pct", type=float, default=DEFAULT_TAIL_THRESHOLD_PCT,
              show_default=True, metavar="PCT",
              help="The same for p99 latencies, which vary more from run to run than means.")
@click.option("--all", "show_all", is_flag=True, help="Show every metric of every pair, not only those that changed.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON instead of tables.")
def compare(study_a: Path, study_b: Path, threshold_pct: float, tail_threshold_pct: float, show_all: bool,
            as_json: bool) -> None:
    """Compare two studies of the same plan (two engine versions, two machines, two dates).

    STUDY_A is the reference, STUDY_B the new one (study directories, the --out of
    `perflab run`). Measurements are paired by configuration (engine and options) and
    profile; for each pair, the change of every headline metric (throughput, TTFT, TPOT,
    ITL, E2EL; goodput, capacity, energy and cost when measured) from A to B. A change for
    the worse is a regression when it exceeds --threshold (--tail-threshold for p99s) and,
    where the studies ran repeats, the measured noise (energy adds the uncertainty its
    measurement states); so is a configuration that crashed in B. Then the decisions that changed (each step's choice, the winner engine, the
    optimized configuration) and what only one study holds.

    Exit status: 0 when nothing regressed, 1 when something did, 2 on a usage error.
    """
    from perflab.lab.report.compare import compare_studies

    result = compare_studies(study_a, study_b, threshold_pct, tail_threshold_pct)
    for w in result.warnings:
        click.echo(f"perflab: warning: {w}", err=True)
    if as_json:
        click.echo(json.dumps(redact.redact_obj(result.to_json()), indent=2))
    else:
        _print(result, show_all)
    if result.exit_code:
        raise click.exceptions.Exit(result.exit_code)


def figure_text(v: float) -> str:
    """A metric's value as the table shows it: plain digits with thousands separators, never
    an exponent (``104,600``, ``12,345.67``, ``0.42``)."""
    return f"{v:,.2f}" if abs(v) < 1e5 else f"{v:,.0f}"


def _print(c: Comparison, show_all: bool) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:  # a pipe or a file: wide enough for the table, not 80 columns
        console.width = max(console.width, 120)
    for name, view in (("A", c.a), ("B", c.b)):
        versions = ", ".join(f"{c.a.display(e)} {v}" for e, v in sorted(view.versions.items()) if v)
        console.print(f"[bold]{name}[/bold] {view.path} · {view.plan.name} · {view.hardware_spec}"
                      + (f" · {versions}" if versions else ""))
    console.print(f"A change for the worse is a regression beyond {c.threshold_pct:g} % ({c.tail_threshold_pct:g} % for "
                  "p99s), and beyond the measured noise where the studies ran repeats (energy: and its stated "
                  "uncertainty).\n")

    table = Table(title="Measurements (A → B)", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("Configuration", "Profile", "Metric", "A", "B", "Change", "Limit", ""):
        table.add_column(col, justify="right" if col in ("A", "B", "Change", "Limit") else "left",
                         no_wrap=col not in ("Configuration", "Profile"))
    style = {Change.REGRESSED: "bold red", Change.IMPROVED: "green", Change.WITHIN_NOISE: "dim"}
    for p in c.pairs:
        first = True
        va, vb = p.a.result.version, p.b.result.version
        label = f"{p.a.label} ({va} → {vb})" if va != vb else p.a.label
        if p.a.result.status != p.b.result.status or not p.a.result.status.measured:
            table.add_row(label, p.a.profile, "status", str(p.a.result.status), str(p.b.result.status), "", "",
                          Text("regressed" if p.status_regressed else "changed" if p.a.result.status != p.b.result.status
                               else "not measured", style="bold red" if p.status_regressed else ""))
            first = False
        shown = [d for d in p.deltas if show_all or d.change is not Change.WITHIN_NOISE]
        for d in shown:
            change = "n/a" if d.change_pct is None else f"{d.change_pct:+.1f}%"
            table.add_row(label if first else "", p.a.profile if first else "", d.metric.label, figure_text(d.a), figure_text(d.b),
                          change, f"±{d.limit_pct:.1f}%", Text(str(d.change), style=style[d.change]))
            first = False
        if first:  # nothing changed beyond the limits
            table.add_row(label, p.a.profile, "all metrics", "", "", "", "", Text("within noise", style="dim"))
    console.print(table)

    decisions = Table(title="Decisions", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("Decision", "A", "B", ""):
        decisions.add_column(col)
    for dec in c.decisions:
        decisions.add_row(dec.what, dec.a or "—", dec.b or "—", Text("changed", style="bold yellow") if dec.changed else "")
    console.print(decisions)

    for name, only in (("A", c.only_a), ("B", c.only_b)):
        if only:
            console.print(f"Only in {name}: " + "; ".join(f"{m.label} on {m.profile} ({m.result.status})" for m in only))
    n = len(c.regressions)
    console.print(f"[bold red]{n} measurement(s) regressed[/bold red]" if n else "[green]No regression.[/green]")
