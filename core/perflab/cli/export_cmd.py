"""``perflab export STUDY``: a study's measurements as CSV, JSON lines, Parquet or vLLM's sweep layout."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("export")
@click.argument("study", metavar="STUDY", type=click.Path(path_type=Path))
@click.option("--format", "-f", "fmt", default="csv", show_default=True, metavar="FORMAT",
              help="csv, jsonl, parquet (needs `pip install 'perflab[parquet]'`) or vllm-sweep (a directory "
                   "`vllm bench sweep plot` reads).")
@click.option("--out", "-o", "out", type=click.Path(path_type=Path), default=None, metavar="PATH",
              help="Write to PATH instead of stdout (vllm-sweep: the directory, required).")
def export(study: Path, fmt: str, out: Path | None) -> None:
    """Export every measurement of a study: one row each, flat columns.

    STUDY is a study directory (the --out of `perflab run`). A row has the study,
    configuration (id, label, engine, engine version, each serving option as
    `option.<name>`), profile (`profile.<field>`), status and reason, every metric of the
    benchmark record under vllm bench serve's names, and the accuracy verdict
    (`accuracy.<field>`) where the plan has a gate. Failed, refused and stopped measurements
    are rows too, with their status and reason. The data goes to stdout, so it pipes:

    \b
      perflab export studies/s1 > s1.csv
      perflab export studies/s1 -f jsonl | jq .total_token_throughput
      perflab export studies/s1 -f parquet -o s1.parquet
      perflab export studies/s1 -f vllm-sweep -o sweep/ && vllm bench sweep plot sweep/

    Reads the study's store without the lock: it works while `perflab run` is still going."""
    from perflab.lab.report.export import export as run_export

    note = run_export(study, fmt, out, sys.stdout)
    if note:
        click.echo(note, err=True)
