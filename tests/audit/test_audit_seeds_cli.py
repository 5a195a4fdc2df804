"""perflab audit on the seeds (the inconsistencies issue #13 names, where they are, and no
false alarm on the vLLM-printed blocks), the command line's exit codes, table and --json."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from perflab.cli import main
from perflab.lab.report.audit import audit_paths

STUDIES = Path(__file__).resolve().parents[1] / "fixtures" / "seeds" / "studies"
SEEDS = sorted(STUDIES.glob("*.txt"))


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = 0
    try:
        main(["audit", *args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _found(audit, seed: str, rule: str) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(f.where.split("/")[-1], f.message) for f in audit.findings if seed in f.where and f.rule == rule]


def test_seeds_inconsistencies_found_where_they_are() -> None:
    a = audit_paths(SEEDS)
    assert len(SEEDS) == 5 and a.results == 67  # every result block of the five pages

    # seed 002's conclusion: "−13.8 %" where 1580.36 vs 1798.45 is −12.1 %
    assert _found(a, "002_", "table-change") == [
        ("002_df97046e8f66ab3a.txt:23 table (Conclusion) row 'Very Long Prompt'",
         "Total TPS 1580.36 vs 1798.45: stated −13.8%, recomputed −12.1%")]
    # every other change in the five pages' tables recomputes (28 in all)
    assert a.rows == 27 and sum(f.rule == "table-change" for f in a.findings) == 1

    # seed 004: peaks of 20 M tok/s, more than the whole run's tokens
    peaks = _found(a, "004_", "peak-output")
    assert ("004_b58ebedf0df33e6b.txt:9 block 1 (vLLM)",
            "peak output 20,132,659 tok/s > the 281412 output tokens of the whole run (one second cannot hold more)") in peaks
    # ... and Generation Heavy's 123795 tok/s from 18 requests of 2000 tokens
    assert any("block 23 (Generation Heavy Profile)" in w and "18 concurrent requests × 2000 tokens" in m for w, m in peaks)
    # all but the two Long Context blocks and SGLang's ShareGPT (92831 tok/s: below both bounds)
    assert len(peaks) == 21 and not any("block 2 (SGLang)" in w for w, _ in peaks)

    # seed 004: TPOTs that contradict their own latencies
    tpots = _found(a, "004_", "tpot-latency")
    assert ("004_b58ebedf0df33e6b.txt:27 block 23 (Generation Heavy Profile)",
            "mean TPOT 0.33 ms but (mean E2EL 17480.00 − mean TTFT 54.95 ms)/(2000.0 − 1) = 8.72 ms "
            "(every request 2000 tokens)") in tpots
    assert any("block 1 (vLLM)" in w and "= 80.26 ms" in m for w, m in tpots)

    # seed 004: a mean TPOT above its own P99 (0.12 vs 0.03 ms); seed 000's MindIE ITLs whose
    # mean is above their P99 are a heavy tail (stalls of seconds), not an impossibility
    assert [w for w, _ in _found(a, "004_", "stat-order")] == [
        "004_b58ebedf0df33e6b.txt:27 block 24 (Generation Heavy Profile)"]

    # no false alarm on the blocks vLLM printed: seeds 000-002 hold their throughput, TPOT and
    # duration identities; 003 has nothing to check
    by_seed = Counter((f.where.split("/")[-1][:3], f.rule) for f in a.findings)
    assert {k for k in by_seed if k[0] != "004"} == {("002", "table-change")}
    assert by_seed[("004", "throughput")] == 46


def test_cli_seeds_exit_1_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *map(str, SEEDS))
    assert code == 1, err
    assert "91 inconsistencies in 67 benchmark results and 27 table changes in 5 source(s)" in out
    assert "−12.1%" in out and "table-change" in out

    code, out, _ = run(capsys, "--json", str(SEEDS[2]))
    assert code == 1
    data = json.loads(out)
    assert data["clean"] is False and data["results_checked"] == 15 and data["table_rows_checked"] == 5
    assert data["findings"] == [{"rule": "table-change",
                                 "where": f"{SEEDS[2]}:23 table (Conclusion) row 'Very Long Prompt'",
                                 "message": "Total TPS 1580.36 vs 1798.45: stated −13.8%, recomputed −12.1%"}]


def test_cli_clean_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(SEEDS[1]))  # seed 001: consistent
    assert code == 0, err
    assert out.startswith("consistent: no finding in 15 benchmark results and 5 table changes")
    code, out, _ = run(capsys, "--json", str(SEEDS[1]))
    assert code == 0 and json.loads(out)["clean"] is True


def test_cli_bad_input_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, str(tmp_path / "missing.txt"))
    assert code == 2
    assert err.strip() == f"perflab: error: cannot read {tmp_path / 'missing.txt'}: no such file or directory"
    (tmp_path / "bad.json").write_text("{not json")
    code, _, err = run(capsys, str(tmp_path / "bad.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not valid JSON" in err
    code, _, err = run(capsys, str(tmp_path))  # a directory that is no study
    assert code == 2 and err.strip() == f"perflab: error: {tmp_path}: not a study directory (no study.db); " \
                                        "expected the --out of a `perflab run`"
    code, _, err = run(capsys)
    assert code == 2 and "Missing argument" in err


def test_edited_page_is_caught(tmp_path: Path) -> None:
    """The same checks on a copy: fix seed 002's percentage and it is clean; break a block's
    throughput and the block is named."""
    page = tmp_path / "002.md"
    shutil.copy(SEEDS[2], page)
    text = page.read_text().replace("(-13.8%)", "(-12.1%)")
    page.write_text(text)
    assert audit_paths([page]).clean
    page.write_text(text.replace("Output token throughput (tok/s):         832.43", "Output token throughput (tok/s):         932.43", 1))
    (f,) = audit_paths([page]).findings
    assert f.rule == "throughput" and f.where.startswith(f"{page}:") and "932.43" in f.message
