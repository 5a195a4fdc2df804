"""``perflab ps`` and ``perflab kill``: the engines perflab started that are still running.

Engines are found by their ``PERFLAB_INSTANCE`` marker (see :class:`perflab.lifecycle.procs.Marker`),
which names the study directory and run that started them and the perflab process that owns
them. ``kill`` matches a study directory exactly, or engines whose owner is gone
(``--all-orphans``); it never touches another study's engines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from perflab.contract.errors import UsageError


def _age(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


@click.command("ps")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def ps(as_json: bool) -> None:
    """List the engines perflab started that are still running (study, run, pid, port, age)."""
    from perflab.lifecycle.procs import find_engines

    engines = find_engines()
    if as_json:
        click.echo(json.dumps([e.to_json() for e in engines], indent=2))
        return
    if not engines:
        click.echo("No engine started by perflab is running.")
        return
    # Plain columns, never truncated: a study path or a pid cut short is of no use.
    now = time.time()
    rows = [("STUDY", "RUN", "PID", "KEEPER", "PORT", "AGE", "OWNER", "COMMAND")]
    for e in engines:
        owner = str(e.marker.owner_pid) if e.owner_alive else f"{e.marker.owner_pid}(gone:orphan)"
        rows.append((e.marker.study, e.marker.run, str(e.pid), str(e.keeper_pid or "-"),
                     ",".join(map(str, e.ports)) or "-", _age(now - e.started), owner, e.command[:60]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        # strict=False: the last column is not padded, so it has no width
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])


@click.command("kill")
@click.argument("study_dir", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option("--all-orphans", is_flag=True, help="Every engine whose perflab process is gone (any study).")
@click.option("--grace", type=float, default=None, help="Seconds between SIGTERM and SIGKILL (default 10).")
@click.option("--dry-run", is_flag=True, help="Only list what would be stopped.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of what was stopped.")
def kill(study_dir: Path | None, all_orphans: bool, grace: float | None, dry_run: bool, as_json: bool) -> None:
    """Stop the engines of STUDY_DIR (a study or launch directory), or every orphaned engine.

    The same policy as a teardown: SIGTERM to each engine's leader, a grace, SIGTERM to the
    stragglers, SIGKILL what is left (reported). A study still running records the run
    interrupted (stopped by perflab kill; measured again on resume) and stops.
    """
    from perflab.lifecycle.procs import find_engines, request_stop, stop_engine
    from perflab.supervisor import DEFAULT_GRACE_S

    if (study_dir is None) == (not all_orphans):
        raise UsageError("give a STUDY_DIR or --all-orphans (exactly one)")
    if grace is not None and grace < 0:
        raise UsageError("--grace must be >= 0")
    if study_dir is not None:
        if not study_dir.is_dir():
            raise UsageError(f"{study_dir}: no such directory")
        study = str(study_dir.resolve())
        chosen = [e for e in find_engines() if e.marker.study == study]
    else:
        chosen = [e for e in find_engines() if e.orphan]
    results: list[dict[str, Any]] = []
    for e in chosen:
        entry = e.to_json()
        if not dry_run:
            # said before any signal: the study running this engine records its run
            # interrupted (a stop it was told about), not as the configuration's crash
            try:
                request_stop(e.marker)
            except OSError as exc:  # the stop itself matters more; the study may then call it a crash
                click.echo(f"perflab: warning: could not tell the study the stop is deliberate: {exc}", err=True)
            report = stop_engine(e, DEFAULT_GRACE_S if grace is None else grace)
            entry.update({"sigterm": report.sigterm, "killed": report.killed, "leftovers": report.leftovers})
        results.append(entry)
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        if not results:
            click.echo("No matching engine is running.")
        for r in results:
            verb = "would stop" if dry_run else "stopped"
            line = f"{verb} pid {r['pid']} ({r['study']} run {r['run']}, {len(r['pids'])} process(es))"
            if r.get("killed"):
                line += f"; SIGKILL needed: {'; '.join(r['killed'])}"
            click.echo(line)
            for left in r.get("leftovers") or []:
                click.echo(f"  still alive: {left}", err=True)
    if any(r.get("leftovers") for r in results):
        raise click.exceptions.Exit(7)
