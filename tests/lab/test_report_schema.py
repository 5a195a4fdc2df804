"""report.json's JSON Schema (perflab.lab.report.schema): valid JSON Schema, published current in
docs/report.schema.json, and reports validate against it — every key they write is declared
(the schema refuses unknown keys), with its type. The demo's own report.json is checked by
tests/lab/test_demo_stored.py, which runs the demo.

Regenerate the docs copy after changing the models: ``python tests/lab/test_report_schema.py --update``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest
from fakestudy import write_study

from perflab.lab.report import SCHEMA_VERSION, build_json, render_markdown, report_context
from perflab.lab.report.audit import audit_written_report
from perflab.lab.report.schema import ReportDocument, json_schema, schema_text
from perflab.lab.report.stored import stored_outcome
from perflab.lab.store import Store

ROOT = Path(__file__).resolve().parents[2]
DOCS_COPY = ROOT / "docs" / "report.schema.json"
VALIDATOR = jsonschema.Draft202012Validator(json_schema())


def report_of(study: Path) -> dict[str, Any]:
    """report.json as `perflab report` writes it (without drawing the charts)."""
    store = Store.open_existing(study)
    try:
        outcome = anyio.run(stored_outcome, store)
        ctx = report_context(store)
        data = json.loads(json.dumps(build_json(outcome, ctx)))
        audit_written_report(render_markdown(outcome, ctx), data)  # adds "audit", as the written file has it
    finally:
        store.close()
    return data


def problems(data: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(data)]


def test_the_schema_is_valid_json_schema_and_the_docs_copy_is_current() -> None:
    jsonschema.Draft202012Validator.check_schema(json_schema())
    assert DOCS_COPY.read_text(encoding="utf-8") == schema_text(), \
        "docs/report.schema.json is stale: python tests/lab/test_report_schema.py --update"


def test_a_study_with_repeats_refusals_crashes_and_curves_validates(tmp_path: Path) -> None:
    data = report_of(write_study(tmp_path / "study"))
    assert next(iter(data)) == "schema_version" and data["schema_version"] == SCHEMA_VERSION
    assert not problems(data)
    ReportDocument.model_validate(data)  # the models themselves, not only their schema
    statuses = {e["result"]["status"] for s in data["steps"] for e in s["entries"]}
    assert {"ok", "unsupported", "crashed", "stopped-early"} <= statuses


def test_the_schema_refuses_an_undeclared_key_a_wrong_type_and_another_version(tmp_path: Path) -> None:
    data = report_of(write_study(tmp_path / "study"))
    assert problems({**data, "surprise": 1}) and problems({**data, "schema_version": SCHEMA_VERSION + 1})
    entry = data["steps"][0]["entries"][0]
    bad = json.loads(json.dumps(data))
    bad["steps"][0]["entries"][0]["result"] = {**entry["result"], "status": "splendid"}
    assert any("splendid" in p for p in problems(bad))
    bad["steps"][0]["entries"][0]["result"] = {**entry["result"], "total_token_throughput": "fast"}
    assert problems(bad)


@pytest.mark.parametrize("missing", ["steps", "baseline", "schema_version"])
def test_the_schema_requires_the_documents_keys(tmp_path: Path, missing: str) -> None:
    data = report_of(write_study(tmp_path / "study"))
    assert problems({k: v for k, v in data.items() if k != missing})


if __name__ == "__main__":  # python tests/lab/test_report_schema.py --update
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/lab/test_report_schema.py --update")
    DOCS_COPY.write_text(schema_text(), encoding="utf-8")
    print(f"wrote {DOCS_COPY}")
