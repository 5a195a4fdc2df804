"""Benchmark metrics are one record, :class:`perflab.bench.metrics.BenchMetrics`, and the files
stay as they were: its fields are exactly the metric keys of a result file perflab wrote before
the record existed (tests/fixtures/bench/, written by the dict-based code), every key of such a
file survives a read and a write in its order, and a run today writes the same file.

Regenerate the fixtures (only after a deliberate change of the result format) with
``python tests/bench/test_metrics_record.py --update``; run it with the code whose files are
"today's" first on ``PYTHONPATH`` (this module imports nothing the dict-based code lacked at
import time).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from perflab.bench.request import BenchRequest
from perflab.bench.tokenizer import WhitespaceTokenizer
from perflab.bench.trace import RequestTrace

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "bench"
# (file, the run's percentiles, its goodput SLOs): vLLM's default percentile, and more of them
# with goodput (percentiles beyond p99 are keys the record keeps in ``extra``)
CASES = {"result-default.json": ((99,), ()), "result-percentiles-goodput.json": ((50, 90, 99), (("ttft", 500.0),))}
# a result file's keys beside the metrics: vLLM's per-request lists and perflab's own part
NOT_METRICS = ("latencies", "queue_times", "errors", "perflab")
FIXED_DATE = "20260101-000000"


def _traces() -> list[RequestTrace]:
    """A small run with every kind of request: several lengths, one token, a failure."""
    out = [RequestTrace.from_itl(start=0.05 * i, ttft=0.1 + 0.01 * i, itl=[0.02 + 0.001 * i] * (i % 4 + 1),
                                 output_tokens=i % 4 + 2, prompt_len=8 + i, index=i, queue_time=0.001 * i)
           for i in range(8)]
    out.append(RequestTrace.from_itl(start=0.5, ttft=0.2, itl=[], output_tokens=1, prompt_len=5, index=8))
    out.append(RequestTrace(success=False, start=0.6, error="HTTP 500", index=9))
    return out


def result_file(name: str) -> dict[str, Any]:
    """The result file a run of the fixture's case writes, its clock-dependent values fixed."""
    from perflab.bench.runner import _make_result

    percentiles, goodput = CASES[name]
    req = BenchRequest(base_urls=("http://127.0.0.1:1",), model="Qwen/Qwen3-8B", num_prompts=10, max_concurrency=4,
                       percentiles=percentiles, goodput=goodput, label="fixture")
    result = _make_result(req, _traces(), 1.25, WhitespaceTokenizer(), False, 1.0, 1)
    data = result.to_json()
    data["date"] = FIXED_DATE
    data["perflab"]["pid"] = 0
    return json.loads(json.dumps(data))


def _stored(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def _metric_part(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in NOT_METRICS}


def test_the_records_fields_are_exactly_the_metric_keys_of_a_result_file() -> None:
    from perflab.bench.metrics import FIELD_NAMES

    assert list(_metric_part(_stored("result-default.json"))) == sorted(FIELD_NAMES, key=_field_order())


def _field_order() -> Any:
    from dataclasses import fields

    from perflab.bench.metrics import BenchMetrics

    order = [f.name for f in fields(BenchMetrics)]
    return order.index


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_stored_result_file_round_trips_key_for_key_in_order(name: str) -> None:
    from perflab.bench.metrics import BenchMetrics

    stored = _stored(name)
    metrics = BenchMetrics.from_json(_metric_part(stored))
    assert json.dumps(metrics.to_json()) == json.dumps(_metric_part(stored))  # same keys, values, order
    assert metrics.total_token_throughput == stored["total_token_throughput"]
    assert metrics.percentile("ttft", 99) == stored["p99_ttft_ms"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_run_today_writes_the_stored_file(name: str) -> None:
    assert json.dumps(result_file(name)) == json.dumps(_stored(name))


def test_old_files_with_fewer_keys_and_unknown_keys_load() -> None:
    from perflab.bench.metrics import BenchMetrics

    old = {"completed": 10, "duration": 2.0, "a_newer_vllm_key": [1, 2], "p95_tpot_ms": 3.5}
    m = BenchMetrics.from_json(old)
    assert m.completed == 10 and m.total_token_throughput is None and m.rtfx is None
    assert m["a_newer_vllm_key"] == [1, 2] and m.percentile("tpot", 95) == 3.5
    assert m.to_json() == old and list(m.to_json()) == list(old)  # nothing added, nothing dropped
    assert "failed" not in m and m.get("failed") is None


def test_a_record_built_from_fields_writes_what_vllm_always_writes() -> None:
    from perflab.bench.metrics import BenchMetrics

    # vLLM writes every setting and request_goodput even when null; a figure not set is absent
    assert list(BenchMetrics(model_id="m").to_json()) == ["date", "endpoint_type", "backend", "label", "model_id",
                                                          "tokenizer_id", "num_prompts", "request_rate", "burstiness",
                                                          "max_concurrency"]
    assert BenchMetrics(duration=1.0).to_json() == {"duration": 1.0, "request_goodput": None}
    assert BenchMetrics(usage_mismatches=0).to_json() == {"usage_mismatches": 0}


def test_name_of_gives_the_fields_name() -> None:
    from perflab.bench.metrics import name_of

    assert name_of(lambda m: m.total_token_throughput) == "total_token_throughput"
    with pytest.raises(AttributeError):
        name_of(lambda m: m.no_such_metric)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- one declaration


def _scanned_names() -> frozenset[str]:
    """The measured metrics' names. Left out: the run's settings (model_id, num_prompts,
    request_rate ...), which are the plan's and the bench request's option names too, and the
    one-word figures (duration, completed, failed), which other records use as their own
    keys (the stall record, the early stop's record, Status.FAILED)."""
    from perflab.bench.metrics import FIELD_NAMES, SETTING_NAMES

    return frozenset(n for n in FIELD_NAMES - SETTING_NAMES if "_" in n or n == "rtfx")


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = _scanned_names()
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_no_module_of_the_core_or_plugins_spells_a_metrics_name_outside_the_record() -> None:
    """Code that means one metric reads the record's field (``m.mean_tpot_ms``) or the name
    derived from it (``name_of(lambda m: m.mean_tpot_ms)``), never the string ``"mean_tpot_ms"``."""
    declaration = ROOT / "core" / "perflab" / "bench" / "metrics.py"
    files = [*(ROOT / "core" / "perflab").rglob("*.py"),
             *(p for p in (ROOT / "plugins").rglob("*.py") if "build" not in p.relative_to(ROOT).parts)]
    found = [f"{p.relative_to(ROOT)}:{line}: {name!r}" for p in files if p != declaration
             for line, name in _literals(p)]
    assert not found, "metric names spelled outside BenchMetrics:\n" + "\n".join(found)


def test_the_scan_sees_a_spelled_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('x = metrics["total_token_throughput"]\n', encoding="utf-8")
    assert _literals(bad) == [(1, "total_token_throughput")]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(__doc__)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for fixture in CASES:
        (FIXTURES / fixture).write_text(json.dumps(result_file(fixture), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {FIXTURES / fixture}")
