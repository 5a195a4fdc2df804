"""``perflab export`` (perflab.lab.report.export): every measurement of a stored study as one flat
row, read back as its users read it (pandas' read_csv, read_json(lines=True), read_parquet), and
``--format vllm-sweep`` read back by a copy of vLLM's sweep plotter's reader (vllm_sweep_reader).

The study (fakestudy.py) is written through the real store by the runner's measure with a fake
executor: no engine runs, so the whole file takes seconds. It holds what an export must carry: a
measurement with repeats, a refusal, a crash, one stopped early, and a load curve.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import vllm_sweep_reader as vllm_reader
from fakestudy import write_study

from perflab.cli import main
from perflab.lab.report.compare import load_study
from perflab.lab.report.export import METRIC_COLUMNS, rows


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_study(tmp_path_factory.mktemp("export") / "study")


def _export(capsysbinary: pytest.CaptureFixture[bytes], *argv: str) -> bytes:
    main(["export", *argv])
    return capsysbinary.readouterr().out


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["export", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("perflab: error: "), err
    return err


# --------------------------------------------------------------------------- the rows


def test_one_row_per_measurement_with_every_metric_column(study: Path) -> None:
    view = load_study(study)
    table = rows(view)
    assert len(table) == len(view.measured)
    by = {(r["configuration"], r["profile"]): r for r in table}
    # every configuration on the main profile; baseline and optimized on the curve
    assert set(by) == {("vLLM", "main"), ("SGLang", "main"), ("TensorRT-LLM", "main"), ("vLLM 256", "main"),
                       ("vLLM 512", "main"), ("Baseline", "curve"), ("Optimized", "curve")}
    assert all(list(r) == list(table[0]) for r in table), "every row has every column, in one order"
    assert set(METRIC_COLUMNS) <= set(table[0]) and "p90_ttft_ms" in table[0]  # the record's names, and its extras
    assert all(isinstance(v, (str, int, float, bool, type(None))) for r in table for v in r.values())

    vllm = by[("vLLM", "main")]
    assert (vllm["engine"], vllm["engine_version"], vllm["status"], vllm["study"]) == ("vllm", "0.11.0", "ok", "export-test")
    assert vllm["option.model"] == "m" and vllm["option.max_num_seqs"] is None
    assert by[("vLLM 256", "main")]["option.max_num_seqs"] == 256
    assert (vllm["profile.input_len"], vllm["profile.num_prompts"]) == (10, 10)
    assert vllm["total_token_throughput"] == 100.0 and vllm["reason"] is None
    assert by[("Optimized", "curve")]["profile.sweep.max_concurrency"] == "[1, 4]"
    # failures are rows too: their status and reason, no figures
    refused, crashed = by[("SGLang", "main")], by[("TensorRT-LLM", "main")]
    assert refused["status"] == "unsupported" and "m has no SGLang support" in refused["reason"]
    assert crashed["status"] == "crashed" and "KeyError: 'weight'" in crashed["reason"]
    assert crashed["engine_version"] == "1.2.0rc1"
    assert all(refused[m] is None and crashed[m] is None for m in METRIC_COLUMNS)
    stopped = by[("vLLM 512", "main")]
    assert stopped["status"] == "stopped-early" and stopped["reason"].startswith("stopped early")
    assert stopped["total_token_throughput"] == pytest.approx(52.56)  # its measured (partial) figures
    assert not any(c.startswith("accuracy.") for c in table[0])  # no gate in the plan


def test_the_accuracy_verdict_is_flat_columns_of_the_main_profiles_row(study: Path) -> None:
    view = load_study(study)
    entry = view.outcome.steps[0].entries[0]
    entry.accuracy = {"task": "perflab_arith", "score": 87.5, "gate": "pass", "agreement": {"exact_match": 84.4}}
    table = rows(view)
    own = [r for r in table if r["configuration_id"] == entry.config.key()]
    assert {r["profile"]: r["accuracy.score"] for r in own} == {"main": 87.5, "curve": None}
    main_row = next(r for r in own if r["profile"] == "main")
    assert (main_row["accuracy.gate"], main_row["accuracy.agreement.exact_match"]) == ("pass", 84.4)
    assert list(table[0])[-4:] == ["accuracy.task", "accuracy.score", "accuracy.gate", "accuracy.agreement.exact_match"]


# --------------------------------------------------------------------------- the formats, read back


def test_csv_on_stdout_reads_back_with_pandas(study: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    df = pd.read_csv(io.BytesIO(_export(capsysbinary, str(study))))
    table = rows(load_study(study))
    assert list(df.columns) == list(table[0]) and len(df) == len(table)
    assert pd.api.types.is_numeric_dtype(df["total_token_throughput"])
    assert df.set_index("configuration").loc["vLLM 256", "option.max_num_seqs"] == 256
    assert df["total_token_throughput"].isna().sum() == 2  # the refusal and the crash
    assert df.groupby("engine")["total_token_throughput"].max()["vllm"] == pytest.approx(410.24)


def test_jsonl_reads_back_with_pandas_as_the_same_frame(study: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    data = _export(capsysbinary, str(study), "--format", "jsonl")
    lines = data.decode().splitlines()
    assert all(json.loads(line).keys() == json.loads(lines[0]).keys() for line in lines)
    df = pd.read_json(io.BytesIO(data), lines=True)
    csv = pd.read_csv(io.BytesIO(_export(capsysbinary, str(study))))
    assert list(df.columns) == list(csv.columns)
    for col in ("configuration", "status", "total_token_throughput", "mean_ttft_ms", "option.max_num_seqs"):
        pd.testing.assert_series_equal(df[col], csv[col], check_dtype=False)


def test_parquet_reads_back_with_pandas(study: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    path = tmp_path / "s.parquet"
    _export(capsysbinary, str(study), "-f", "parquet", "-o", str(path))
    assert path.is_file()
    df = pd.read_parquet(path)
    csv = pd.read_csv(io.BytesIO(_export(capsysbinary, str(study))))
    assert list(df.columns) == list(csv.columns) and len(df) == len(csv)
    pd.testing.assert_series_equal(df["total_token_throughput"], csv["total_token_throughput"])
    assert set(df["request_rate"].dropna()) == {"inf"}  # vLLM's "inf" stays text, as the record holds it
    piped = pd.read_parquet(io.BytesIO(_export(capsysbinary, str(study), "-f", "parquet")))
    pd.testing.assert_frame_equal(piped, df)


def test_parquet_keeps_a_column_that_mixes_text_and_numbers_as_text() -> None:
    from perflab.lab.report.export import to_parquet

    table = [{"request_rate": "inf", "option.x": True, "tps": 1}, {"request_rate": 4.0, "option.x": 2, "tps": 2.5},
             {"request_rate": None, "option.x": None, "tps": None}]
    df = pd.read_parquet(io.BytesIO(to_parquet(table)))
    assert df["request_rate"].tolist()[:2] == ["inf", "4.0"] and df["option.x"].tolist()[:2] == ["True", "2"]
    assert df["tps"].tolist()[:2] == [1.0, 2.5] and df.isna().iloc[2].all()


def test_parquet_without_pyarrow_says_which_extra(study: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    err = _fails(capsys, str(study), "-f", "parquet", "-o", "x.parquet")
    assert "pip install 'perflab[parquet]'" in err


# --------------------------------------------------------------------------- vllm bench sweep plot


def test_vllm_sweep_is_what_vllms_plotter_reads(study: Path, tmp_path: Path,
                                                capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    out = tmp_path / "sweep"
    _export(capsysbinary, str(study), "-f", "vllm-sweep", "-o", str(out))
    groups = vllm_reader.load(out)
    assert len(groups) == 1
    data = groups[0][1]
    df = vllm_reader.frame(data)  # the CLI's defaults: total_token_throughput against median_ttft_ms
    # the completed measurements only: vLLM and vLLM 256 on main (two repeats each: two runs), and
    # the curve's two load points for the baseline (vLLM) and the optimized (vLLM 256), one run each
    assert sorted(df["run_number"].tolist()) == [0] * 6 + [1] * 2
    assert df["request_rate"].tolist() == [float("inf")] * 8  # vLLM's "inf", as its reader converts it
    curve = vllm_reader.frame(data, var_x="max_concurrency", var_y="total_token_throughput",
                              curve_by=["configuration"], filter_by="profile==curve")
    assert sorted(zip(curve["configuration"], curve["max_concurrency"], curve["total_token_throughput"], strict=True)) == [
        ("Baseline", 1, 100.0), ("Baseline", 4, 400.0),
        ("Optimized", 1, pytest.approx(102.56)), ("Optimized", 4, pytest.approx(410.24))]
    by_seqs = vllm_reader.frame(data, curve_by=["max_num_seqs"], filter_by="profile==main")
    assert sorted(by_seqs["max_num_seqs"].fillna(0).tolist()) == [0, 0, 256, 256]
    with pytest.raises(ValueError, match="Cannot find var_x='nope'"):
        vllm_reader.frame(data, var_x="nope")
    # vLLM's directory names (SERVE-<serve comb>-BENCH-<bench comb>) and its failure files
    names = sorted(p.name for p in out.iterdir())
    assert "SERVE--configuration=vLLM-engine=vllm-model=m-BENCH--profile=main" in names
    assert "SERVE--configuration=Baseline-engine=vllm-model=m-BENCH--profile=curve-max_concurrency=4" in names
    failures = {p.parent.name: json.loads(p.read_text()) for p in out.rglob("run=0.failure.json")}
    assert {f["error_type"] for f in failures.values()} == {"unsupported", "crashed", "stopped-early"}
    crashed = failures["SERVE--configuration=TensorRT-LLM-engine=trtllm-model=m-BENCH--profile=main"]
    assert set(crashed) == {"run_number", "error_type", "error", "serve_overrides", "bench_overrides"}
    assert crashed["serve_overrides"] == {"configuration": "TensorRT-LLM", "engine": "trtllm", "model": "m"}
    run = json.loads((out / "SERVE--configuration=vLLM-engine=vllm-model=m-BENCH--profile=main" / "run=1.json").read_text())
    assert run["total_token_throughput"] == 101.0 and run["run_number"] == 1 and run["engine"] == "vllm"


# --------------------------------------------------------------------------- mistakes: one line each


def test_mistakes_are_one_line(study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "did you mean 'parquet'" in _fails(capsys, str(study), "-f", "parqet")
    assert "no such study directory" in _fails(capsys, str(tmp_path / "nowhere"))
    assert "not a study directory" in _fails(capsys, str(tmp_path))
    assert "-o DIR" in _fails(capsys, str(study), "-f", "vllm-sweep")
    assert "a directory" in _fails(capsys, str(study), "-o", str(tmp_path))
