"""``perflab export``: a study's measurements as tables other tools read.

One row per measurement, as ``perflab compare`` pairs them (:func:`perflab.lab.report.compare.load_study`:
the store, read-only, and the study's own decisions): every configuration on the main
profile, the baseline and the optimized configuration on the others. A row's keys are flat,
so ``pandas.read_csv``, ``read_json(lines=True)`` and ``read_parquet`` give a usable frame
without ``json_normalize``:

- ``study``, ``hardware``, ``simulated``; ``configuration_id`` (the configuration's key:
  engine and options), ``configuration`` (its label in the report), ``engine``,
  ``engine_version``;
- ``option.<name>``: each serving option of the configuration;
- ``profile`` and ``profile.<field>``: the workload's name and definition;
- ``status`` (:class:`perflab.contract.status.Status`), ``reason`` (why there is no number,
  or why requests failed), ``success_rate``;
- every field of :class:`perflab.bench.metrics.BenchMetrics` under its own name (empty for a
  measurement without figures), then any other key a record holds (another percentile);
- ``accuracy.<field>``: the configuration's accuracy verdict, on its main-profile row.

Nested values are flattened with dots (``accuracy.agreement.exact_match``); lists are
written as JSON text. ``vllm-sweep`` writes the directory layout ``vllm bench sweep plot``
reads instead (:func:`write_vllm_sweep`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import IO, Any, TextIO

from perflab.bench.metrics import BenchMetrics
from perflab.contract.errors import UsageError, did_you_mean
from perflab.contract.status import Status
from perflab.lab.report.compare import Measured, StudyView
from perflab.lab.store import write_atomic, write_json
from perflab.lab.study import ConfigResult

__all__ = ["FORMATS", "METRIC_COLUMNS", "PARQUET_HINT", "check_format", "export", "rows", "to_csv", "to_jsonl",
           "to_parquet", "write_vllm_sweep"]

FORMATS = ("csv", "jsonl", "parquet", "vllm-sweep")
PARQUET_HINT = "pip install 'perflab[parquet]'"
METRIC_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchMetrics) if not f.metadata.get("internal"))
"""The record's names, in its order: a column each, in every row."""


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: not an export format{did_you_mean(fmt, FORMATS)}; "
                         f"choose one of {', '.join(FORMATS)}")
    return fmt


# --------------------------------------------------------------------------- rows


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    """``value`` under ``prefix``, dicts as dotted keys, lists as JSON text (one scalar a cell)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flat(f"{prefix}.{k}", v, out)
    elif isinstance(value, (list, tuple)):
        out[prefix] = json.dumps(value)
    else:
        out[prefix] = value


def reason(res: ConfigResult) -> str | None:
    """Why a measurement has no figures (or, measured, why some of its requests failed)."""
    if res.status is Status.OK:
        return res.error
    return res.summary()


def _row(view: StudyView, m: Measured, accuracy: Mapping[str, Any] | None) -> dict[str, Any]:
    res = m.result
    profile = next(p for p in view.plan.profiles if p.name == m.profile)
    row: dict[str, Any] = {
        "study": view.plan.name, "hardware": view.hardware_spec, "simulated": view.simulated,
        "configuration_id": m.config_key, "configuration": m.label, "engine": m.engine,
        "engine_version": res.version or view.versions.get(m.engine),
    }
    for name, value in sorted(dict(m.config.get("options") or {}).items()):
        _flat(f"option.{name}", value, row)
    row["profile"] = m.profile
    _flat("profile", {"label": profile.label, **profile.definition()}, row)
    row.update({"status": str(res.status), "reason": reason(res), "success_rate": res.success_rate})
    metrics = res.metrics.to_json() if res.metrics is not None and res.status.measured else {}
    for name in METRIC_COLUMNS:
        row[name] = metrics.get(name)
    for name, value in metrics.items():
        if name not in row:
            _flat(name, value, row)
    if accuracy:
        _flat("accuracy", accuracy, row)
    return row


def rows(view: StudyView) -> list[dict[str, Any]]:
    """The study's measurements, one flat row each, every row with every column (None where
    a row has no value), in the report's order."""
    verdicts: dict[str, Mapping[str, Any]] = {}
    for step in view.outcome.steps:
        for e in step.entries:
            if e.accuracy is not None:
                verdicts.setdefault(e.config.key(), e.accuracy)
    out = [_row(view, m, verdicts.get(m.config_key) if m.profile == view.plan.main_profile else None)
           for m in view.measured.values()]
    seen: dict[str, int] = {}
    for r in out:
        for c in r:
            seen.setdefault(c, len(seen))
    columns = sorted(seen, key=lambda c: _section(c, seen[c]))
    return [{c: r.get(c) for c in columns} for r in out]


_HEAD = ("study", "hardware", "simulated", "configuration_id", "configuration", "engine", "engine_version")


def _section(column: str, order: int) -> tuple[int, int | str]:
    """A column's place: the head, the options (by name: every row's options together), the
    profile, the status, the metrics, the accuracy; within a section, as first seen (``order``)."""
    if column in _HEAD:
        return 0, order
    if column.startswith("option."):
        return 1, column
    if column == "profile" or column.startswith("profile."):
        return 2, order
    if column in ("status", "reason", "success_rate"):
        return 3, order
    if column.startswith("accuracy."):
        return 5, order
    return 4, order


# --------------------------------------------------------------------------- formats


def to_csv(table: Sequence[Mapping[str, Any]], stream: IO[str]) -> None:
    """A header, then a line per row; an empty cell for no value."""
    if not table:
        return
    writer = csv.DictWriter(stream, fieldnames=list(table[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)


def to_jsonl(table: Iterable[Mapping[str, Any]], stream: IO[str]) -> None:
    """One JSON object a line, every line with the same keys."""
    for r in table:
        stream.write(json.dumps(r) + "\n")


def _one_type(table: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows with each column of one Parquet type: a column that mixes text, flags and
    numbers (``request_rate``: ``"inf"`` or a rate; an option ``true`` here, ``2`` there) holds
    text. (Ints beside floats pyarrow makes floats itself.)"""
    out = [dict(r) for r in table]
    for col in (table[0] if table else {}):
        kinds = {bool if isinstance(v, bool) else str if isinstance(v, str) else float
                 for r in out if (v := r[col]) is not None}
        if len(kinds) > 1:
            for r in out:
                if r[col] is not None:
                    r[col] = str(r[col])
    return out


def to_parquet(table: Sequence[Mapping[str, Any]]) -> bytes:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(f"--format parquet needs pyarrow: {PARQUET_HINT}") from None
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(_one_type(table)), buffer)
    return buffer.getvalue()


# --------------------------------------------------------------------------- vllm bench sweep


def _sanitize_filename(filename: str) -> str:
    """vLLM's ``sanitize_filename`` (vllm/benchmarks/sweep/utils.py, vLLM 0.32.0)."""
    return filename.replace("/", "_").replace("..", "__").strip("'").strip('"')


def _comb_name(comb: Mapping[str, Any]) -> str:
    """vLLM's ``ParameterSweepItem.name`` of a combination without ``_benchmark_name``:
    ``as_text(sep="-")`` (vllm/benchmarks/sweep/param_sweep.py, vLLM 0.32.0)."""
    return "-".join(f"{k}={v}" for k, v in comb.items())


def _comb_dir(root: Path, serve: Mapping[str, Any], bench: Mapping[str, Any]) -> Path:
    """vLLM's ``_get_comb_base_path`` (vllm/benchmarks/sweep/serve.py, vLLM 0.32.0):
    ``SERVE--<serve comb>-BENCH--<bench comb>``; a name past what a file system takes is cut,
    with a hash of the whole (the plotter finds results by ``**/summary.json``, not by name)."""
    name = _sanitize_filename("-".join(("SERVE-", _comb_name(serve), "BENCH-", _comb_name(bench))))
    if len(name.encode()) > 200:
        name = name.encode()[:180].decode(errors="ignore") + "-" + hashlib.sha256(name.encode()).hexdigest()[:12]
    return root / name


def _sweep_units(m: Measured) -> list[tuple[dict[str, Any], str, dict[str, Any] | None, list[dict[str, Any]], str | None]]:
    """What vLLM would have run as separate benchmark combinations: each load point of a
    curve, else the measurement itself, as ``(load, status, metrics, repeats, reason)``."""
    res = m.result
    if res.points:
        return [(dict(p.get("load") or {}), str(p.get("status") or res.status), p.get("metrics"),
                 list(p.get("repeats") or []), p.get("error")) for p in res.points]
    metrics = res.metrics.to_json() if res.metrics is not None else None
    return [({}, str(res.status), metrics, list(res.repeats), reason(res))]


def write_vllm_sweep(view: StudyView, root: Path) -> list[Path]:
    """Write the study as the experiment directory of ``vllm bench sweep serve``, which
    ``vllm bench sweep plot ROOT`` reads (vLLM 0.32.0: vllm/benchmarks/sweep/plot.py reads every
    ``**/summary.json`` under it, each a JSON list of run records; serve.py writes them).

    A measurement is one combination: its serve parameters are the configuration's label in the
    report, its engine and its options, its bench parameters the profile (and the load of a
    curve's point, one combination each, so ``--curve-by configuration --var-x max_concurrency``
    draws the curves; an option a configuration leaves to the engine is absent, which the
    plotter's grouping drops). Each run record is vLLM's
    result file (BenchMetrics' names are ``--save-result``'s) with ``run_number`` and those
    parameters merged in, as vLLM's ``_update_run_data`` does; with repeats, one run each (the
    plot's error bars). Only a complete measurement (``ok``) is a result: any other gets
    ``run=0.failure.json`` in vLLM's shape, with the status as ``error_type`` and the reason
    as ``error``. Returns the files written."""
    written: list[Path] = []
    for m in view.measured.values():
        serve = {"configuration": m.label, "engine": m.engine, **dict(m.config.get("options") or {})}
        for load, status, metrics, repeats, why in _sweep_units(m):
            bench = {"profile": m.profile, **load}
            base = _comb_dir(root, serve, bench)
            base.mkdir(parents=True, exist_ok=True)
            if status != Status.OK or metrics is None:
                failure = {"run_number": 0, "error_type": status, "error": why, "serve_overrides": serve,
                           "bench_overrides": bench}
                written.append(write_atomic(base / "run=0.failure.json", json.dumps(failure, indent=2) + "\n"))
                continue
            runs = repeats if len(repeats) > 1 else [metrics]
            data = [{**run, "run_number": i, **serve, **bench} for i, run in enumerate(runs)]
            for i, record in enumerate(data):
                write_json(base / f"run={i}.json", record)
                written.append(base / f"run={i}.json")
            write_json(base / "summary.json", data)
            written.append(base / "summary.json")
    return written


# --------------------------------------------------------------------------- the command


def export(study: Path, fmt: str, out: Path | None, stdout: TextIO) -> str | None:
    """Export ``study`` as ``fmt`` to ``out`` (None: ``stdout``). Returns what to tell the user
    on stderr (None: nothing, the data went to stdout)."""
    from perflab.lab.report.compare import load_study

    check_format(fmt)
    if fmt == "vllm-sweep" and out is None:
        raise UsageError("--format vllm-sweep writes a directory: give it with -o DIR")
    if fmt == "parquet":
        to_parquet([])  # pyarrow missing: say so before reading the study
        if out is None and stdout.isatty():
            raise UsageError("--format parquet is binary: write it with -o FILE, or pipe it")
    view = load_study(study)
    table = rows(view)
    if fmt == "vllm-sweep":
        assert out is not None
        if out.exists() and not out.is_dir():
            raise UsageError(f"-o {out}: not a directory (--format vllm-sweep writes one)")
        written = write_vllm_sweep(view, out)
        results = sum(1 for p in written if p.name == "summary.json")
        failures = sum(1 for p in written if p.name.endswith(".failure.json"))
        return f"Wrote {out}: {results} result(s), {failures} failure(s); plot with `vllm bench sweep plot {out}`"
    if fmt == "parquet":
        data: bytes | str = to_parquet(table)
    else:
        text = io.StringIO()
        (to_csv if fmt == "csv" else to_jsonl)(table, text)
        data = text.getvalue()
    if out is None:
        if isinstance(data, bytes):
            stdout.flush()
            stdout.buffer.write(data)
        else:
            stdout.write(data)
        return None
    if out.is_dir():
        raise UsageError(f"-o {out}: a directory; --format {fmt} writes one file")
    write_atomic(out, data)
    return f"Wrote {out}: {len(table)} measurement(s)"
