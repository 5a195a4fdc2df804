"""perflab audit on ``--save-result`` JSON files written by ``perflab bench`` (vLLM's keys):
a real run is consistent (with the per-request lists too); an edited number is caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perflab.cli import main
from perflab.lab.report.audit import audit_paths

from .conftest import FakeOpenAIServer


def _bench(capsys: pytest.CaptureFixture[str], server: FakeOpenAIServer, out: Path, *extra: str) -> Path:
    try:
        main(["bench", "--base-url", server.base_url, "--model", "ok", "--num-prompts", "24", "--max-concurrency", "4",
              "--random-input-len", "32", "--random-output-len", "8", "--save-result", "--result-dir", str(out),
              "--result-filename", "r.json", *extra])
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr().err
    capsys.readouterr()
    return out / "r.json"


def test_bench_result_json_is_consistent(fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    plain = _bench(capsys, fake_server, tmp_path / "plain")
    detailed = _bench(capsys, fake_server, tmp_path / "detailed", "--save-detailed")
    a = audit_paths([plain, detailed])
    assert a.results == 2 and a.clean, a.findings
    assert "itls" in json.loads(detailed.read_text())  # min/max and exact TPOT were checkable


def test_bench_result_json_edited(fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str],
                                  tmp_path: Path) -> None:
    path = _bench(capsys, fake_server, tmp_path, "--save-detailed")
    data = json.loads(path.read_text())
    data["mean_tpot_ms"] *= 3  # a TPOT its own requests do not give
    data["max_concurrent_requests"] = 6  # perflab's client counts exactly: above --max-concurrency 4
    path.write_text(json.dumps(data))
    rules = sorted(f.rule for f in audit_paths([path]).findings)
    assert "tpot-latency" in rules and "peak-concurrency" in rules
    try:
        main(["audit", "--json", str(path)])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    found = json.loads(capsys.readouterr().out)["findings"]
    assert code == 1
    assert {"rule": "peak-concurrency", "where": str(path), "message": "peak concurrent requests 6.00 > max concurrency 4"} in found
