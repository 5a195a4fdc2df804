"""Study integrity under faults: one writer, environment faults are not results, storage
faults lose nothing, bounds (docs/reliability.md)."""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perflab.cli import main as perflab_main
from perflab.contract.errors import UsageError
from perflab.lab.plan import load_plan_text
from perflab.lab.store.integrity import LOCK_NAME, StudyLock, StudyLocked

TINY = """
name: tiny
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
candidates:
  - name: Max Num Seqs
    variants:
      - {name: "64", set: {max_num_seqs: 64}}
profiles:
  main: {label: Main, input_len: 32, output_len: 8, num_prompts: 6}
timeouts: {startup_s: 60, benchmark_s: 60, device_wait_s: 0}
"""


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        perflab_main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return list(con.execute(sql))
    finally:
        con.close()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _plan(tmp_path: Path, text: str = TINY) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _child(code: str) -> subprocess.Popen[str]:
    """A helper process that prints 'ready' once it holds what ``code`` takes."""
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()


# ------------------------------------------------------------------------------ one writer


def test_second_run_on_the_same_directory_exits_2_naming_the_holder(tmp_path: Path) -> None:
    """A real first `perflab run` holds the lock; a second on the same --out exits 2 naming
    its pid, touches nothing; `perflab report` is not blocked by the lock."""
    plan = _plan(tmp_path, TINY.replace("num_prompts: 6", "num_prompts: 400, request_rate: 2"))
    out = tmp_path / "study"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-c", "from perflab.cli import main; main()", "run", str(plan), "--out", str(out), "--no-live"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (out / LOCK_NAME).is_file() and f"pid {first.pid}" in (out / LOCK_NAME).read_text():
                break
            time.sleep(0.1)
        else:
            pytest.fail("the first run never took the lock")
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and f"pid {first.pid}" in lines[0] and "another perflab run" in lines[0], second.stderr
        assert first.poll() is None  # the first one goes on, undisturbed
        while time.monotonic() < deadline and "plan_text" not in _read(out / "study.json"):
            time.sleep(0.1)
        report = subprocess.run([*cmd[:3], "report", str(out)], env=env, capture_output=True, text=True, timeout=60)
        assert report.returncode == 0 and "incomplete" in report.stderr, report.stderr  # no lock needed to read
    finally:
        # SIGTERM ends perflab within the teardown grace (default 10 s), engine torn down
        first.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        try:
            first.wait(timeout=60)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
        took = time.monotonic() - t0
    assert first.returncode == 128 + signal.SIGTERM and took < 15  # RunExit: interrupted = 128 + the signal
    # nothing the second run could have done: no run marked crashed
    assert not _rows(out / "study.db", "SELECT id FROM runs WHERE state IN ('crashed', 'failed')")


def test_the_lock_is_per_directory_and_dies_with_its_process(tmp_path: Path) -> None:
    holder = _child(f"import sys, time; from perflab.lab.store.integrity import StudyLock; l = StudyLock({str(tmp_path)!r}); "
                    "l.acquire(); print('ready', flush=True); time.sleep(60)")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(StudyLocked, match=rf"pid {holder.pid}"):
            StudyLock(tmp_path).acquire()
        with StudyLock(tmp_path / "other"):  # another study is not locked
            pass
    finally:
        _stop(holder)
    with StudyLock(tmp_path):  # killed holder: the OS dropped its lock, nothing stale
        assert f"pid {os.getpid()}" in (tmp_path / LOCK_NAME).read_text()


# ------------------------------------------------------------------------------ environment


def test_foreign_memory_on_the_device_stops_the_study_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Another process holds simulated memory on cuda:0 (registered like a real engine in the
    simulated machine's registry): nothing is launched, no crash recorded, exit 3, one line."""
    out = tmp_path / "study"
    sim_state = out / "sim-state"
    holder = _child("import time; from pathlib import Path; from perflab_sim import state; "
                    f"state.register(Path({str(sim_state)!r}), 'foreign', 'python', [0], [60000]); "
                    "print('ready', flush=True); time.sleep(60)")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        code, _, err = _cli(["run", str(_plan(tmp_path)), "--out", str(out), "--no-live"], capsys)
    finally:
        _stop(holder)
    assert code == 3, err
    line = [ln for ln in err.splitlines() if ln.startswith("perflab: error:")]
    assert len(line) == 1 and "not ready" in line[0] and f"cuda:0 is held by pid {holder.pid}" in line[0] and "60000 MiB" in line[0]
    runs = _rows(out / "study.db", "SELECT state, error FROM runs")
    assert [r[0] for r in runs] == ["interrupted"] and "not ready" in runs[0][1]
    assert not _rows(out / "study.db", "SELECT id FROM measurements")
    assert not (out / "runs" / "001-vllm" / "engine.log").exists()  # nothing was launched
    report = json.loads((out / "report.json").read_text())
    assert "not ready" in report["stop_reason"]
    # the holder is gone: the same command resumes and measures everything
    code, _, err = _cli(["run", str(_plan(tmp_path)), "--out", str(out), "--no-live"], capsys)
    assert code == 0, err
    assert {r[0] for r in _rows(out / "study.db", "SELECT state FROM runs WHERE id > 1")} == {"done"}


def test_device_wait_is_bounded_and_configurable() -> None:
    assert load_plan_text(TINY).timeouts.device_wait_s == 0
    assert load_plan_text(TINY.replace(", device_wait_s: 0", "")).timeouts.device_wait_s == 60
    with pytest.raises(UsageError, match="timeouts.device_wait_s"):
        load_plan_text(TINY.replace("device_wait_s: 0", "device_wait_s: -1"))


# ------------------------------------------------------------------------------ storage


def test_disk_full_mid_study_keeps_what_was_measured_and_resume_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while the second configuration's measurement is written: one line, exit 1, the
    first configuration's measurement kept (file and row), no half-written file, the second
    run interrupted (not a result); once space is back, the same command resumes."""
    out = tmp_path / "study"
    real_write = os.write

    def full_disk(fd: int, data: bytes) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if "/runs/002-" in target and "measurement-" in target:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    code, _, err = _cli(["run", str(_plan(tmp_path)), "--out", str(out), "--no-live"], capsys)
    monkeypatch.setattr(os, "write", real_write)
    assert code == 1, err
    line = [ln for ln in err.splitlines() if ln.startswith("perflab: error:")]
    assert len(line) == 1 and "disk is full" in line[0] and "resume" in line[0]
    db = out / "study.db"
    assert _rows(db, "SELECT id, state FROM runs") == [(1, "done"), (2, "interrupted")]
    assert _rows(db, "SELECT run_id, status FROM measurements") == [(1, "ok")]
    assert (out / "runs" / "001-vllm" / "measurement-main.json").is_file()
    assert not list((out / "runs").glob("002-*/measurement-*")) and not list(out.rglob("*.tmp"))

    code, stdout, err = _cli(["run", str(_plan(tmp_path)), "--out", str(out), "--no-live", "--json"], capsys)
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["complete"] and summary["runs_launched"] == 1 and summary["measurements_reused"] >= 1


def test_report_rebuild_recreates_a_corrupt_or_missing_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "study"
    code, _, err = _cli(["run", str(_plan(tmp_path)), "--out", str(out), "--no-live"], capsys)
    assert code == 0, err
    before = json.loads((out / "report.json").read_text())
    runs_before = _rows(out / "study.db", "SELECT id, config_key, state, dir FROM runs ORDER BY id")
    (out / "study.db").write_bytes(b"this is not a database" * 100)

    code, _, err = _cli(["report", str(out)], capsys)
    assert code == 1 and "perflab report --rebuild" in err and len(err.strip().splitlines()) == 1

    code, stdout, err = _cli(["report", str(out), "--rebuild"], capsys)
    assert code == 0, err
    assert "Rebuilt" in stdout and list(out.glob("study.db.corrupt-*"))
    after = json.loads((out / "report.json").read_text())
    assert after["conclusion"] == before["conclusion"] and after["recommended_command"] == before["recommended_command"]
    assert _rows(out / "study.db", "SELECT id, config_key, state, dir FROM runs ORDER BY id") == runs_before

    # an empty study.db never overwrites the run directories: the run re-indexes them and reuses
    (out / "study.db").unlink()
    (out / "study.db").touch()
    code, stdout, err = _cli(["run", str(_plan(tmp_path)), "--out", str(out), "--no-live", "--json"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["runs_launched"] == 0
    assert sorted(p.name for p in (out / "runs").iterdir()) == [r[3].split("/")[-1] for r in runs_before]


# ------------------------------------------------------------------------------ bounds


def test_billion_laughs_yaml_is_refused_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 12):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 9)}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    t0 = time.monotonic()
    code, _, err = _cli(["run", str(path), "--out", str(tmp_path / "o"), "--no-live"], capsys)
    assert time.monotonic() - t0 < 5
    assert code == 2 and "aliases expand to more than" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(UsageError, match="aliases expand"):
        load_plan_text("a: &a [*a]\n")  # a recursive alias
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["../../x", "/etc/x", "a/b", "..", ".hidden", "x..y"])
def test_plan_name_cannot_leave_the_studies_directory(name: str) -> None:
    with pytest.raises(UsageError, match=r"name: expected a short study name"):
        load_plan_text(TINY.replace("name: tiny", f"name: {json.dumps(name)}"))


def test_ordinary_plan_names_are_accepted() -> None:
    for name in ("qwen3.5-9b-h100", "seed_002", "A1"):
        assert load_plan_text(TINY.replace("name: tiny", f"name: {name}")).name == name


def test_new_runs_never_land_in_an_existing_run_directory(tmp_path: Path) -> None:
    """Run directories the database does not know (an older study, a lost study.db) are
    never written over: run ids continue after the highest directory."""
    from perflab.lab.store import Store

    old = tmp_path / "runs" / "007-vllm"
    old.mkdir(parents=True)
    (old / "engine.log").write_text("measured long ago\n")
    store = Store(tmp_path)
    store.begin_session()
    run_id, run_dir = store.begin_run("k", "vllm", {"engine": "vllm"}, "step", "vllm", ["main"])
    store.close()
    assert run_id == 8 and run_dir.name == "008-vllm"
    assert (old / "engine.log").read_text() == "measured long ago\n"


def test_a_holder_that_is_one_of_our_engines_is_named_by_study_and_run(tmp_path: Path) -> None:
    from perflab.lab.store.integrity import device_holders

    other = tmp_path / "other-study"
    run_dir = other / "runs" / "004-vllm-fp8"
    run_dir.mkdir(parents=True)
    (other / "study.db").touch()
    state = tmp_path / "sim-state"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from pathlib import Path; from perflab_sim import state; "
         f"state.register(Path({str(state)!r}), 'vllm', 'python', [1], [30000]); print('ready', flush=True); "
         "time.sleep(60)"], cwd=run_dir, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        from perflab_sim import machine_env

        env = {**machine_env("a100-80g-x8"), "PERFLAB_SIM_STATE_DIR": str(state)}  # a simulated machine's registry
        found = device_holders(env, {"cuda": [0, 1]})
        assert [h.what for h in found] == ["cuda:1"]
        text = found[0].describe()
        assert f"pid {holder.pid}" in text and f"perflab study {other}, run runs/004-vllm-fp8" in text
        assert device_holders(env, {"cuda": [0]}) == []
    finally:
        _stop(holder)


def test_memory_no_visible_process_holds_is_a_holder_on_an_accelerator_never_in_host_ram() -> None:
    """Device memory that grew since the study began with no process to show for it is held by
    someone perflab cannot see (another container). Host RAM is not: every process uses it, and
    a VM that reports freed pages to its host shows the previous engine's memory as in use for
    a minute after it exited (seen on the real vLLM CPU lane: 626-876 MiB, a 30-60 s wait)."""
    from perflab.contract.types import Accelerator
    from perflab.lab.store.integrity import invisible_holders

    def acc(kind: str, used: int, index: int = 0) -> Accelerator:
        return Accelerator(vendor="v", kind=kind, index=index, name=kind, memory_total_mib=24_000, memory_used_mib=used)

    start = [acc("cuda", 1000), acc("cuda", 1000, 1), acc("cpu", 1000)]
    now = [acc("cuda", 3000), acc("cuda", 1500, 1), acc("cpu", 3000)]
    found = invisible_holders(start, now, {"cuda": [0, 1], "cpu": [0]})
    assert [(h.what, h.pid, h.mib) for h in found] == [("cuda:0", None, 2000)]  # cuda:1 within the 3 % tolerance
    assert "a process perflab cannot see" in found[0].describe()
    assert invisible_holders(start, now, {"cuda": [1]}) == []  # only the devices the launch needs
    assert invisible_holders(start, now, {"cpu": [0]}) == []


@pytest.mark.parametrize(("text", "what"), [("database or disk is full", "the disk is full"),
                                            ("attempt to write a readonly database", "read-only")])
def test_a_full_or_read_only_study_db_is_named_in_the_one_line(tmp_path: Path, text: str, what: str) -> None:
    # was: "cannot write the study (the disk is full: database or disk is full)" -- sqlite's text
    # names no file, so the line named none (issue 24.4: a full disk names the file)
    from perflab.lab.store.integrity import storage_fault

    fault = storage_fault(sqlite3.OperationalError(text), tmp_path)
    assert fault is not None
    line = str(fault)
    assert "\n" not in line and f"({what}: {tmp_path / 'study.db'}: {text})" in line
