"""``perflab audit PATH... [--json]``: check benchmark results for internal consistency."""

from __future__ import annotations

import json
from pathlib import Path

import click

from perflab.lab.report.audit import Audit
from perflab.lab.report.audit.rules import RULES

_RULES_HELP = "\n".join(f"  {r.name:<17} {r.checks}" for r in RULES)


@click.command("audit", epilog="\b\nRules:\n" + _RULES_HELP + "\n\nTolerances: docs/user-guide.md, 'perflab audit'.")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON instead of a table.")
@click.pass_context
def audit(ctx: click.Context, paths: tuple[Path, ...], as_json: bool) -> None:
    """Check benchmark results for internal consistency.

    PATH is a perflab study directory (its report.json and report.md, else its study.db), a `vllm bench serve
    --save-result` JSON file (or perflab bench's), or a Markdown study page in the seeds'
    format (its "Serving Benchmark Result" blocks and its tables with (+x%) changes).

    Exit status: 0 when everything is consistent, 1 when something is not, 2 when a path
    cannot be read.
    """
    from perflab.lab.report.audit import audit_paths

    result = audit_paths(paths)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        _print_table(result)
    if not result.clean:
        ctx.exit(1)


def _print_table(result: Audit) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=False)
    checked = f"{result.results} benchmark results and {result.rows} table changes in {len(result.sources)} source(s)"
    if result.clean:
        console.print(f"consistent: no finding in {checked}")
        return
    table = Table(title=f"{len(result.findings)} inconsistencies in {checked}", title_justify="left",
                  box=box.SIMPLE_HEAD)
    table.add_column("rule", no_wrap=True)
    table.add_column("where", overflow="fold")
    table.add_column("finding", overflow="fold")
    for f in result.findings:
        table.add_row(f.rule, f.where, f.message)
    console.print(table)
