"""A run's files staged on a node without the study directory and shipped to the driver
(issue #14, Ray without a shared filesystem): perflab.lab.run.backends.shipping, and the driver's side in
LiveMeasure. The Ray cluster's end-to-end runs are in test_lab_ray.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

from perflab.contract.status import Status
from perflab.lab.plan import load_plan_text
from perflab.lab.run.backends import shipping
from perflab.lab.run.backends.local import Demand, FilePart, Files, Finished, Placed, Sink, State, Ticket
from perflab.lab.run.backends.shipping import Stage, UnsafePath, receive, target
from perflab.lab.run.runner import LiveMeasure
from perflab.lab.store import RunRecord, Store, write_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL_LOG = FIXTURES / "real" / "vllm-0.32.0-cpu" / "serve-default.log"  # a real vLLM 0.32.0 (CPU) log


def _ship(stage: Stage, run_dir: Path, *, final: bool = False) -> list[Files]:
    events = list(stage.ship(final=final))
    for ev in events:
        assert receive(run_dir, ev) == []
    return events


def test_a_stage_ships_records_whole_and_logs_by_appends(tmp_path: Path) -> None:
    run_dir = tmp_path / "study" / "runs" / "003-vllm-64"
    run_dir.mkdir(parents=True)
    stage = Stage(run_dir, root=tmp_path / "node", node="n1/abc", suffix="@abc")
    assert stage.path.parent.parent == tmp_path / "node" and stage.path.name == "003-vllm-64@abc"
    assert stat.S_IMODE(stage.path.stat().st_mode) == 0o700 and stat.S_IMODE(stage.path.parent.stat().st_mode) == 0o700

    log = REAL_LOG.read_bytes()
    (stage.path / "engine.log").write_bytes(log[:5000])
    write_json(stage.path / "outcome.json", {"log": str(stage.path / "engine.log"), "workdir": str(stage.path),
                                             "other": "/elsewhere/engine.log", "nested": [{"p": str(stage.path / "x")}]})
    (stage.path / ".outcome.json.99.tmp").write_text("{half")  # write_json's file being written: not shipped
    (stage.path / "replica-2").mkdir()
    (stage.path / "replica-2" / "engine.log").write_text("replica 2\n")
    _ship(stage, run_dir)
    assert (run_dir / "engine.log").read_bytes() == log[:5000]
    assert (run_dir / "replica-2" / "engine.log").read_text() == "replica 2\n"
    assert not list(run_dir.glob(".*"))
    outcome = json.loads((run_dir / "outcome.json").read_text())
    # the records name the files where the driver has them
    assert outcome == {"log": str(run_dir / "engine.log"), "workdir": str(run_dir), "other": "/elsewhere/engine.log",
                       "nested": [{"p": str(run_dir / "x")}]}
    assert stage.driver(stage.path / "engine.log") == str(run_dir / "engine.log")

    assert list(stage.ship()) == []  # nothing changed: nothing shipped
    with (stage.path / "engine.log").open("ab") as f:
        f.write(log[5000:])
    (again,) = _ship(stage, run_dir)
    assert [(p.path, p.offset, len(p.data)) for p in again.parts] == [("engine.log", 5000, len(log) - 5000)]
    assert (run_dir / "engine.log").read_bytes() == log

    stage.remove()
    assert not stage.path.exists() and not (tmp_path / "node" / stage.path.parent.name).exists()


def test_a_large_log_ships_in_bounded_parts_as_head_and_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipping, "CHUNK", 1000)
    monkeypatch.setattr(shipping, "SHIP_CAP", 4000)
    run_dir = tmp_path / "study" / "runs" / "001-x"
    run_dir.mkdir(parents=True)
    stage = Stage(run_dir, root=tmp_path / "node", node="n1/abc")
    data = bytes(i % 251 for i in range(10_000))
    (stage.path / "engine.log").write_bytes(data[:3000])
    _ship(stage, run_dir)
    (stage.path / "engine.log").write_bytes(data)  # grew past the cap: the head goes now, the tail at the end
    events = _ship(stage, run_dir)
    assert (run_dir / "engine.log").read_bytes() == data[:3000]  # the head (cap / 2 = 2000) went before
    assert events == []
    events = _ship(stage, run_dir, final=True)
    assert all(sum(len(p.data) for p in ev.parts) <= 1000 for ev in events)
    got = (run_dir / "engine.log").read_bytes()
    marker = b"\n[perflab: 5000 bytes of engine.log (of 10000) were not shipped from node n1/abc: its first 3000 and last 2000 bytes are kept]\n"
    assert got == data[:3000] + marker + data[-2000:]


def test_a_large_record_is_replaced_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipping, "CHUNK", 100)
    run_dir = tmp_path / "study" / "runs" / "001-x"
    run_dir.mkdir(parents=True)
    stage = Stage(run_dir, root=tmp_path / "node")
    write_json(stage.path / "bench-main.json", {"requests": list(range(200))})
    events = list(stage.ship())
    assert len(events) > 3
    for ev in events[:-1]:
        receive(run_dir, ev)
        assert not (run_dir / "bench-main.json").exists()  # never half a record
    receive(run_dir, events[-1])
    assert json.loads((run_dir / "bench-main.json").read_text()) == {"requests": list(range(200))}
    assert [p.name for p in run_dir.iterdir()] == ["bench-main.json"]


@pytest.mark.parametrize("path", ["../escape.txt", "a/../../escape.txt", "/tmp/escape.txt", "", ".", "a//b",
                                  "a\\..\\b", "nul\0byte"])
def test_a_shipped_path_outside_the_run_directory_is_refused(tmp_path: Path, path: str) -> None:
    run_dir = tmp_path / "study" / "runs" / "001-x"
    run_dir.mkdir(parents=True)
    with pytest.raises(UnsafePath, match="refused a shipped file"):
        target(run_dir, path)
    refused = receive(run_dir, Files((FilePart(path, b"x"), FilePart("kept.log", b"kept\n"))))
    assert len(refused) == 1 and "refused a shipped file" in refused[0]
    assert (run_dir / "kept.log").read_text() == "kept\n"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["kept.log"]


def test_a_link_in_the_run_directory_cannot_lead_a_shipped_file_out(tmp_path: Path) -> None:
    run_dir = tmp_path / "study" / "runs" / "001-x"
    run_dir.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_dir / "sub").symlink_to(outside)
    (run_dir / "engine.log").symlink_to(outside / "engine.log")
    refused = receive(run_dir, Files((FilePart("sub/x.json", b"{}", whole=True), FilePart("engine.log", b"x"))))
    assert len(refused) == 2, refused
    assert "resolves outside the run directory" in refused[0] and "is a link in the run directory" in refused[1]
    assert list(outside.iterdir()) == []


PLAN = """
name: files
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
engines: [vllm]
profiles:
  main: {label: Main, input_len: 32, output_len: 8, num_prompts: 10}
"""


class _Remote:
    """A backend whose node ships the run's files, one path escaping the run directory."""

    parallel = 1

    def demand(self, config: Any) -> Demand:
        return Demand(None, 1)

    async def run(self, ticket: Ticket, sink: Sink) -> None:
        sink(Placed("node-1", ()))
        sink(State("running"))
        sink(Files((FilePart("engine.log", b"INFO started\n"), FilePart("../../../escape.log", b"x")), "node-1"))
        sink(Files((FilePart("outcome.json", b'{"state": "done"}\n', whole=True),), "node-1"))
        sink(Finished(RunRecord(Status.DONE)))


def test_the_driver_writes_shipped_files_and_refuses_an_escape(tmp_path: Path) -> None:
    plan = load_plan_text(PLAN, path="p.yaml")
    store = Store(tmp_path / "study")
    store.begin_session()
    logged: list[dict[str, Any]] = []

    def capture(_: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        logged.append({"level": method, **event})
        raise structlog.DropEvent

    log = structlog.wrap_logger(None, processors=[capture])
    measure = LiveMeasure(store, {}, _Remote(), retry_failed=False, on_event=lambda kind, **kw: None, log=log,
                          plan=plan)
    anyio.run(lambda: measure(plan.baseline_config(), [plan.main], step="1", label="vLLM"))
    (run_dir,) = (tmp_path / "study" / "runs").iterdir()
    assert (run_dir / "engine.log").read_text() == "INFO started\n"
    assert json.loads((run_dir / "outcome.json").read_text()) == {"state": "done"}
    assert not (tmp_path / "escape.log").exists() and not any(p.name == "escape.log" for p in tmp_path.rglob("*"))
    refused = [e for e in logged if e["event"] == "lab.files-refused"]
    assert len(refused) == 1 and "../../../escape.log" in refused[0]["reason"] and refused[0]["node"] == "node-1"
    store.close()


def test_the_node_stage_root_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipping.tempfile, "gettempdir", lambda: str(tmp_path))
    root = shipping.stage_root()
    assert root.parent == tmp_path.resolve() and stat.S_IMODE(root.stat().st_mode) == 0o700
    assert root.stat().st_uid == os.getuid()
    study = tmp_path / "a" / "study"
    base = shipping.study_stage(study)
    assert base.parent == root and base.name.startswith("study-")
    assert shipping.study_tag(study) != shipping.study_tag(tmp_path / "b" / "study")  # same name, other study
    shipping.forget_study(study)
    assert not base.exists()
