"""`perflab plugin new`: scaffold a third-party engine plugin."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def plugin() -> None:
    """Create engine plugins (see docs/writing-plugins.md)."""


@plugin.command("new")
@click.argument("name")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Directory in which to create perflab-plugin-NAME/.")
@click.option("--executable", help="The engine's server program (default: NAME).")
@click.option("--force", is_flag=True, help="Overwrite an existing, non-empty package directory.")
def new(name: str, directory: Path, executable: str | None, force: bool) -> None:
    """Write a ready-to-install plugin package for engine NAME (a name no installed engine,
    nor one of perflab's own, has).

    The package implements every engine hook for an OpenAI-compatible server binary, and its
    tests run perflab's conformance suite (including a launch/ready/teardown cycle against a
    bundled stand-in server), so `pip install -e '.[test]' && pytest` passes out of the box.

    Example: perflab plugin new llama-cpp --executable llama-server
    """
    from perflab.cli import get_pm
    from perflab.scaffold import check_free, create, names_for

    names = names_for(name, executable)
    check_free(names, {engine: rec.provider for engine, rec in get_pm().engines.items()})
    root = create(name, directory, executable, force)
    click.echo(f"Created {root}")
    click.echo(f"  engine {names.engine!r}, distribution {names.distribution}, module {names.module}")
    click.echo("Next:")
    click.echo(f"  cd {root} && pip install -e '.[test]' && pytest")
    click.echo("  perflab engines list")
