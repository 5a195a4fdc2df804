"""`perflab plan schema`: the plan document's JSON Schema, for editors and validators."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def plan() -> None:
    """Plan files (see docs/plan-reference.md)."""


@plan.command("schema")
@click.option("--write", "write", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write the schema to FILE instead of printing it.")
def schema(write: Path | None) -> None:
    """Print the JSON Schema of plan files (generated from perflab.lab.plan_schema).

    Point an editor at it to complete and check plans as they are written: with the YAML
    language server (VS Code's YAML extension, Neovim, Helix ...), a plan's first line

    # yaml-language-server: $schema=plan.schema.json

    names the file (a path relative to the plan, or a URL). The schema checks keys, types and
    bounds; `perflab run` still checks what it cannot state (known engines, files, references).
    """
    from perflab.lab.plan_schema import schema_text

    text = schema_text()
    if write is None:
        click.echo(text, nl=False)
        return
    try:
        write.write_text(text, encoding="utf-8")
    except OSError as exc:
        from perflab.contract.errors import UsageError

        raise UsageError(f"{write}: cannot write the schema ({exc.strerror or exc})") from None
    click.echo(f"Wrote {write}")
