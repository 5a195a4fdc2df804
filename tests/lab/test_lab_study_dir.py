"""Issue 24, items 1, 2 and 4: a study directory belongs to one plan, `perflab run` exits with
what it measured (RunExit), and a study directory that cannot be written is one line.

Every case goes through the command line (`perflab.cli.main`, in a subprocess where a study
runs so its engines are the subprocess's own; in-process where a fault is injected)."""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perflab.lab.exits import RunExit

SMALL = """
name: {name}
model: {model}
hardware: sim:a100-80g-x8
simulation: {{time_scale: 50}}
engines: [vllm]
{extra}
profiles:
  main: {{label: Main, input_len: 64, output_len: 16, num_prompts: 8}}
timeouts: {{startup_s: 60, benchmark_s: 120}}
"""

CANDIDATE = """
candidates:
  - name: Max Num Seqs
    variants:
      - {name: "64", set: {max_num_seqs: 64}}
"""


def plan_file(tmp: Path, stem: str, *, name: str = "small", model: str = "Qwen/Qwen3-8B", extra: str = "") -> Path:
    path = tmp / f"{stem}.yaml"
    path.write_text(SMALL.format(name=name, model=model, extra=extra))
    return path


def perflab(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from perflab.cli import main; main()", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def one_error_line(err: str) -> str:
    """The error line of a command that failed as it should: one `perflab: error:` line, no traceback."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("perflab: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished study of plan `small` (one engine, one profile), made once for the module."""
    tmp = tmp_path_factory.mktemp("measured")
    plan = plan_file(tmp, "small")
    r = perflab("run", str(plan), "--out", "study", "--no-live", cwd=tmp)
    assert r.returncode == 0, r.stderr
    return tmp / "study"


@pytest.fixture
def study(measured: Path, tmp_path: Path) -> Path:
    out = tmp_path / "study"
    shutil.copytree(measured, out, symlinks=True)
    return out


def _snapshot(study: Path) -> dict[str, bytes]:
    return {str(p.relative_to(study)): p.read_bytes() for p in sorted(study.rglob("*"))
            if p.is_file() and p.name not in (".perflab.lock",) and "sim-state" not in p.parts}


# ---------------------------------------------------------------------------------- 1. one plan per study


def test_another_plan_into_an_existing_out_is_refused_naming_both(study: Path, tmp_path: Path) -> None:
    before = _snapshot(study)
    other = plan_file(tmp_path, "other", name="other-study")
    r = perflab("run", str(other), "--out", str(study), "--no-live", cwd=tmp_path)
    assert r.returncode == RunExit.USAGE == 2, r.stderr
    line = one_error_line(r.stderr)
    assert "'small'" in line and "'other-study'" in line and "other.yaml" in line and "small.yaml" in line
    assert "--replace" in line
    assert _snapshot(study) == before, "the refused plan touched the study"


def test_another_model_or_hardware_is_another_study(study: Path, tmp_path: Path) -> None:
    plan = plan_file(tmp_path, "small", model="Qwen/Qwen3-32B")
    r = perflab("run", str(plan), "--out", str(study), "--no-live", cwd=tmp_path)
    assert r.returncode == 2 and "model 'Qwen/Qwen3-8B' vs 'Qwen/Qwen3-32B'" in one_error_line(r.stderr)
    plan = plan_file(tmp_path, "small")
    r = perflab("run", str(plan), "--out", str(study), "--hardware", "sim:h100-80g-x8", "--no-live", cwd=tmp_path)
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "hardware 'sim:a100-80g-x8' vs 'sim:h100-80g-x8'" in line
    assert "to resume it, run with --hardware sim:a100-80g-x8" in line


@pytest.mark.parametrize(("stem", "extra", "phrase"), [
    ("engines", "", "engines [\"vllm\"] vs [\"sglang\"]"),
    ("baseline", "baseline: {engine: vllm, serve: {max_num_seqs: 8}}", "baseline "),
    ("method", "repeats: 2", "decision "),
])
def test_the_same_name_with_other_engines_baseline_or_method_is_another_study(
        study: Path, tmp_path: Path, stem: str, extra: str, phrase: str) -> None:
    """Name, model and hardware alike, but what the study is changed: refused, nothing written
    (engines swapped once resumed silently, report.md replaced and runs/ mixed)."""
    before = _snapshot(study)
    path = plan_file(tmp_path, stem, extra=extra)
    if stem == "engines":
        path.write_text(path.read_text().replace("engines: [vllm]", "engines: [sglang]"))
    r = perflab("run", str(path), "--out", str(study), "--no-live", cwd=tmp_path)
    line = one_error_line(r.stderr)
    assert r.returncode == RunExit.USAGE, r.stderr
    assert phrase in line and f"{stem}.yaml" in line and "--replace" in line, line
    assert _snapshot(study) == before, "the refused plan touched the study"


def test_adding_a_candidate_resumes_reusing_what_was_measured(study: Path, tmp_path: Path) -> None:
    plan = plan_file(tmp_path, "small", extra=CANDIDATE)
    r = perflab("run", str(plan), "--out", str(study), "--no-live", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["exit_status"] == 0 and summary["measurements_reused"] >= 1
    assert summary["runs_launched"] == 1  # only the new candidate's variant


def test_replace_moves_the_old_study_aside_whole(study: Path, tmp_path: Path) -> None:
    before = _snapshot(study)
    other = plan_file(tmp_path, "other", name="other-study", extra="serve: {tp: 64}")  # refused at once: quick
    r = perflab("run", str(other), "--out", str(study), "--no-live", "--replace", "--json", cwd=tmp_path)
    assert r.returncode == RunExit.NOTHING_MEASURED, r.stderr
    archived = [p for p in tmp_path.iterdir() if p.name.startswith("study.replaced-")]
    assert len(archived) == 1 and str(archived[0]) in r.stderr
    assert json.loads(r.stdout)["replaced_study_moved_to"] == str(archived[0])
    assert _snapshot(archived[0]) == before, "the archived study is not the old study, whole"
    assert "name: other-study" in (study / "plan.yaml").read_text()
    with sqlite3.connect(study / "study.db") as db:  # the new plan's runs only: all refused
        assert {r[0] for r in db.execute("SELECT state FROM runs")} == {"unsupported"}


def test_a_study_from_before_plan_identities_resumes_with_its_own_plan(study: Path, tmp_path: Path) -> None:
    """Older perflab recorded no identity: it is derived from the stored plan text."""
    with sqlite3.connect(study / "study.db") as db:
        db.execute("DELETE FROM meta WHERE key = 'plan_identity'")
    meta = json.loads((study / "study.json").read_text())
    meta.pop("plan_identity", None)
    (study / "study.json").write_text(json.dumps(meta))
    other = plan_file(tmp_path, "other", name="other-study")
    r = perflab("run", str(other), "--out", str(study), "--no-live", cwd=tmp_path)
    assert r.returncode == 2 and "'small'" in one_error_line(r.stderr)
    own = plan_file(tmp_path, "small")
    r = perflab("run", str(own), "--out", str(study), "--no-live", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["runs_launched"] == 0


def test_demo_into_another_plans_directory_is_refused_and_fresh_deletes_nothing(study: Path, tmp_path: Path) -> None:
    before = _snapshot(study)
    for args in ([], ["--fresh"]):
        r = perflab("demo", "--out", str(study), "--no-live", *args, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert "demo-qwen3-32b-a100" in one_error_line(r.stderr)
        assert _snapshot(study) == before


# ---------------------------------------------------------------------------------- 2. exit statuses


@pytest.mark.parametrize(("case", "model", "extra", "status"), [
    ("all refused", "Qwen/Qwen3-8B", "serve: {tp: 64}", RunExit.NOTHING_MEASURED),
    ("all crashed", "example/no-such-model", "", RunExit.NOTHING_MEASURED),
    ("baseline crashed", "Qwen/Qwen3-8B", "baseline: {engine: vllm, serve: {max_model_len: 99999999999}}\n" + CANDIDATE,
     RunExit.BASELINE_NOT_MEASURED),
    ("no engine served, the baseline did", "Qwen/Qwen3-8B",
     "serve: {max_model_len: 99999999999}\nbaseline: {engine: vllm, serve: {max_model_len: 4096}}",
     RunExit.RECOMMENDATION_NOT_MEASURED),
])
def test_a_study_that_did_not_measure_its_answer_does_not_exit_0(tmp_path: Path, case: str, model: str, extra: str,
                                                                   status: RunExit) -> None:
    plan = plan_file(tmp_path, "p", model=model, extra=extra)
    r = perflab("run", str(plan), "--out", "json", "--no-live", "--json", cwd=tmp_path)
    assert r.returncode == status, (case, r.stderr)
    summary = json.loads(r.stdout)
    assert summary["exit_status"] == int(status) and summary["exit_name"] == status.name
    assert summary["exit_meaning"] == status.meaning
    # the text summary says it in one line on stderr (the study resumes: nothing is launched again)
    r = perflab("run", str(plan), "--out", "json", "--no-live", cwd=tmp_path)
    assert r.returncode == status, (case, r.stderr)
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("perflab: ") and f"(exit {int(status)})" in ln]
    assert said == [f"perflab: {status.meaning} (exit {int(status)}); see {Path('json') / 'report.md'}"], r.stderr


def test_run_help_lists_every_exit_status() -> None:
    from click.testing import CliRunner

    from perflab.cli import cli

    for command in ("run", "demo"):
        text = " ".join(CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output.split())
        for member in RunExit:
            assert f"{member.value} {member.meaning}" in text, (command, member)
        assert "130 Ctrl-C (SIGINT), 143 SIGTERM, 129 SIGHUP" in text


def test_the_user_guide_lists_the_exit_statuses_as_declared() -> None:
    guide = (Path(__file__).parents[2] / "docs" / "user-guide.md").read_text(encoding="utf-8")
    for member in RunExit:
        assert f"| {member.value} | {member.meaning} |" in guide, member


def test_environment_fault_carries_its_status_in_json(tmp_path: Path) -> None:
    """A machine that is not ready stops the study with exit 3, and --json says so too."""
    from perflab_sim import state
    from perflab_sim.env import STATE_ENV

    plan = plan_file(tmp_path, "p")
    plan.write_text(plan.read_text().replace("timeouts: {startup_s: 60, benchmark_s: 120}",
                                             "timeouts: {startup_s: 60, benchmark_s: 120, device_wait_s: 0.2}"))
    registry = tmp_path / "sim-state"
    # this test's process holds memory on every GPU of the simulated machine
    state.register(registry, "squatter", "squatter", list(range(8)), [70000] * 8)
    try:
        r = subprocess.run([sys.executable, "-c", "from perflab.cli import main; main()", "run", str(plan), "--out",
                            "s", "--no-live", "--json"], cwd=tmp_path, env={**os.environ, STATE_ENV: str(registry)},
                           capture_output=True, text=True, timeout=120, check=False)
    finally:
        state.unregister(registry)
    assert r.returncode == RunExit.ENVIRONMENT, r.stderr
    data = json.loads(r.stdout)
    assert data["exit_status"] == 3 and data["exit_name"] == "ENVIRONMENT" and "not ready" in data["error"]
    one_error_line(r.stderr)


# ---------------------------------------------------------------------------------- 4. one line, nothing left


def test_out_under_a_regular_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    plan = plan_file(tmp_path, "p")
    r = perflab("run", str(plan), "--out", "afile/study", "--no-live", cwd=tmp_path)
    assert r.returncode == RunExit.USAGE, r.stderr
    assert "afile/study" in one_error_line(r.stderr)
    assert (tmp_path / "afile").read_text() == "x"


def test_out_in_proc_is_one_line(tmp_path: Path) -> None:
    plan = plan_file(tmp_path, "p")
    r = perflab("run", str(plan), "--out", "/proc/perflab-no-such-dir", "--no-live", cwd=tmp_path)
    assert r.returncode in (RunExit.USAGE, RunExit.ERROR), r.stderr
    assert "/proc/perflab-no-such-dir" in one_error_line(r.stderr)


def _invoke(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from perflab.cli import main

    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    out = capsys.readouterr()
    return code, out.out, out.err


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT


def fail_writes(monkeypatch: pytest.MonkeyPatch, root: Path, err: int, *, match: str = "") -> None:
    """Writes under ``root`` (to names containing ``match``) fail with ``err``, as on a read-only
    (EROFS: at open) or full (ENOSPC: at write, once the file exists) file system — also as root,
    where chmod stops nothing. Both ways of writing are covered: os.open/os.write and open()."""
    root = root.resolve()

    def hit(path: Any) -> bool:
        try:
            p = Path(os.fsdecode(path)).resolve()
        except (TypeError, ValueError):
            return False
        return (p == root or root in p.parents) and match in p.name

    real_open, real_os_open, real_write = builtins.open, os.open, os.write
    doomed: set[int] = set()

    def os_open(path: Any, flags: int, *a: Any, **kw: Any) -> int:
        if flags & _WRITE_FLAGS and hit(path):
            if err != errno.ENOSPC:
                raise OSError(err, os.strerror(err), os.fsdecode(path))
            fd = real_os_open(path, flags, *a, **kw)
            doomed.add(fd)
            return fd
        return real_os_open(path, flags, *a, **kw)

    def os_write(fd: int, data: Any) -> int:
        if fd in doomed:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    class FullFile:
        def __init__(self, f: Any) -> None:
            self._f = f

        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name: str) -> Any:
            return getattr(self._f, name)

        def __enter__(self) -> FullFile:
            return self

        def __exit__(self, *exc: object) -> None:
            self._f.close()

    def py_open(file: Any, mode: str = "r", *a: Any, **kw: Any) -> Any:
        if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+") and hit(file):
            if err != errno.ENOSPC:
                raise OSError(err, os.strerror(err), os.fsdecode(file))
            return FullFile(real_open(file, mode, *a, **kw))
        return real_open(file, mode, *a, **kw)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(os, "write", os_write)
    monkeypatch.setattr(builtins, "open", py_open)
    import io
    import pathlib

    monkeypatch.setattr(io, "open", py_open)
    monkeypatch.setattr(pathlib.Path, "open", lambda self, mode="r", *a, **kw: py_open(self, mode, *a, **kw))


def _leftover_temp_files(study: Path) -> list[str]:
    return [str(p.relative_to(study)) for p in study.rglob("*") if "tmp" in p.name.split(".")]


def test_report_on_a_read_only_study_is_one_line(study: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(study)
    fail_writes(monkeypatch, study, errno.EROFS)
    code, _, err = _invoke(["report", str(study)], capsys)
    assert code == RunExit.ERROR, err
    line = one_error_line(err)
    assert "read-only" in line and str(study) in line
    monkeypatch.undo()
    assert _snapshot(study) == before and _leftover_temp_files(study) == []


def test_report_rebuild_on_a_read_only_study_is_one_line(study: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(study)
    fail_writes(monkeypatch, study, errno.EROFS)
    code, _, err = _invoke(["report", "--rebuild", str(study)], capsys)
    assert code == RunExit.ERROR, err
    assert "read-only" in one_error_line(err)
    monkeypatch.undo()
    assert _snapshot(study) == before


def test_a_full_disk_names_the_file_and_leaves_no_temp_file(study: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    old_html = (study / "report.html").read_bytes()
    fail_writes(monkeypatch, study, errno.ENOSPC, match="report.html")
    code, _, err = _invoke(["report", str(study)], capsys)
    assert code == RunExit.ERROR, err
    line = one_error_line(err)
    assert "the disk is full" in line and str(study / "report.html") in line
    monkeypatch.undo()
    assert _leftover_temp_files(study) == []
    assert (study / "report.html").read_bytes() == old_html, "the old report.html was damaged"
