"""``perflab ps`` / ``perflab kill``, and engines that do not outlive a killed ``perflab run``.

Engines are recognised by their ``PERFLAB_INSTANCE`` marker, scoped to a study directory and a
run (never by name, never "any marker"): each test uses its own temporary study directories,
so other work on the machine is neither counted nor touched.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from perflab.lifecycle import procs

# A stand-in engine: a leader listening on a port, with one worker.
STANDIN_SRC = r"""
import os, socket, subprocess, sys, time
if len(sys.argv) > 1:
    time.sleep(600)
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
w = subprocess.Popen([sys.executable, __file__, "worker"])
os.write(1, b"PORT %d\n" % s.getsockname()[1])
time.sleep(600)
"""


def perflab(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perflab", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def of_study(study: Path, run: str | None = None) -> list[psutil.Process]:
    """Live processes whose marker names this study directory (and this run, if given)."""
    want = str(study.resolve())
    out = []
    for p in psutil.process_iter():
        try:
            m = procs.Marker.parse(p.environ().get(procs.MARKER_ENV))
            if m is not None and m.study == want and run in (None, m.run) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def wait_none(study: Path, within: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within
    while (left := of_study(study)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def kill_all(study: Path) -> None:
    for p in of_study(study):
        try:
            p.kill()
        except psutil.Error:
            pass


class Standins:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.script = tmp / "standin.py"
        self.script.write_text(STANDIN_SRC)
        self.kept: list[procs.KeptProcess] = []
        self.fds: list[int] = []
        self.studies: list[Path] = []
        self.orphans: list[subprocess.Popen[bytes]] = []

    def study(self, name: str) -> Path:
        d = self.tmp / name
        d.mkdir()
        self.studies.append(d)
        return d

    def kept_engine(self, study: Path, run: str) -> procs.KeptProcess:
        env = {**os.environ, procs.MARKER_ENV: str(procs.Marker.new(study, run))}
        proc, fd = procs.spawn([sys.executable, str(self.script)], env, str(study), grace=2.0)
        self.kept.append(proc)
        self.fds.append(fd)
        return proc

    def orphan_engine(self, study: Path, run: str) -> subprocess.Popen[bytes]:
        """An engine whose perflab (and keeper) are gone: its owner in the marker is dead."""
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        start_ms = int(psutil.Process(dead.pid).create_time() * 1000)
        dead.wait()
        marker = procs.Marker("0" * 16, dead.pid, start_ms, run, str(study.resolve()))
        p = subprocess.Popen([sys.executable, str(self.script)], env={**os.environ, procs.MARKER_ENV: str(marker)},
                             stdout=subprocess.DEVNULL, start_new_session=True)
        self.orphans.append(p)
        return p

    def wait_started(self, study: Path, n: int = 2, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while len(of_study(study)) < n:
            assert time.monotonic() < deadline, f"{study} did not start"
            time.sleep(0.05)


@pytest.fixture
def standins(tmp_path: Path) -> Iterator[Standins]:
    s = Standins(tmp_path)
    yield s
    for study in s.studies:
        kill_all(study)
    for p in s.orphans:
        p.wait(5)  # our child: reap it
    for k in s.kept:
        k.close()
    for fd in s.fds:
        os.close(fd)


def ps_json() -> list[dict[str, object]]:
    r = perflab("ps", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_ps_lists_our_engines_and_kill_stops_one_study_only(standins: Standins) -> None:
    a, b, c = standins.study("study-a"), standins.study("study-b"), standins.study("study-c")
    ka = standins.kept_engine(a, "001-vllm")
    kb = standins.kept_engine(b, "002-sglang")
    orphan = standins.orphan_engine(c, "007-trtllm")
    for s in (a, b, c):
        standins.wait_started(s)

    deadline = time.monotonic() + 10
    while True:
        listed = {e["study"]: e for e in ps_json() if e["study"] in {str(a), str(b), str(c)}}
        if len(listed) == 3 and all(e["ports"] for e in listed.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert set(listed) == {str(a), str(b), str(c)}
    ea, eb, ec = listed[str(a)], listed[str(b)], listed[str(c)]
    assert (ea["run"], ea["pid"], ea["keeper_pid"], ea["orphan"]) == ("001-vllm", ka.pid, ka.keeper_pid, False)
    assert (eb["run"], eb["pid"], eb["keeper_pid"]) == ("002-sglang", kb.pid, kb.keeper_pid)
    assert (ec["run"], ec["pid"], ec["keeper_pid"], ec["orphan"]) == ("007-trtllm", orphan.pid, None, True)
    for e in (ea, eb, ec):
        assert len(e["pids"]) == 2 and len(e["ports"]) == 1 and 0 <= e["age_s"] < 60  # type: ignore[arg-type,operator]
    table = perflab("ps")
    assert table.returncode == 0 and "007-trtllm" in table.stdout

    # --all-orphans picks the orphan and never a live perflab's engine (dry run: touch nothing
    # else on this machine)
    r = perflab("kill", "--all-orphans", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    would = {e["study"] for e in json.loads(r.stdout)}
    assert str(c) in would and not {str(a), str(b)} & would

    # kill STUDY_DIR: that study's engine only, one SIGTERM to its leader
    r = perflab("kill", str(a), "--json", "--grace", "3")
    assert r.returncode == 0, r.stderr
    (stopped,) = json.loads(r.stdout)
    assert stopped["pid"] == ka.pid and stopped["sigterm"][0] == ka.pid and stopped["killed"] == []
    assert wait_none(a, 3) == []
    assert len(of_study(b)) == 2 and len(of_study(c)) == 2  # the other studies' engines are untouched

    r = perflab("kill", str(c))
    assert r.returncode == 0 and f"stopped pid {orphan.pid}" in r.stdout, r.stdout + r.stderr
    assert wait_none(c, 3) == []
    assert len(of_study(b)) == 2


def test_kill_usage_errors_are_one_line(tmp_path: Path) -> None:
    for args in (["kill"], ["kill", str(tmp_path), "--all-orphans"], ["kill", str(tmp_path / "nope")]):
        r = perflab(*args)
        assert r.returncode == 2, r
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    r = perflab("kill", str(tmp_path))
    assert r.returncode == 0 and "No matching engine" in r.stdout


# --------------------------------------------------------------------------- a killed `perflab run`

LONG_PLAN = """
name: outlive
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
profiles:
  main: {label: Main, input_len: 32, output_len: 8, num_prompts: 10}
  long: {label: Long, input_len: 16, output_len: 4, num_prompts: 3000, request_rate: 1}
timeouts: {startup_s: 60, benchmark_s: 600}
"""


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    try:
        with sqlite3.connect(db) as con:
            return list(con.execute(sql))
    except sqlite3.OperationalError:
        return []


def _long_run(study: Path) -> Path | None:
    """The run directory of the launch that benchmarks LONG_PLAN's "long", once its engine has
    served the benchmark's first tokens; else None. "main" is measured by another launch (the
    engine-selection step's), torn down before this one starts: an engine of the study seen
    right after "main" is measured may be that one going away, and between the two launches
    there is none."""
    for rel, profiles in _rows(study / "study.db", "SELECT dir, profiles FROM runs WHERE state = 'running'"):
        run_dir = study / str(rel)
        if "long" not in json.loads(str(profiles)) or not of_study(study, run_dir.name):
            continue
        try:
            base_url = json.loads((run_dir / "launch.json").read_text())["base_url"]
            with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as r:
                text = r.read().decode()
        except (OSError, ValueError, KeyError):  # not written yet, or not serving yet
            return None
        served = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("vllm:prompt_tokens_total")]
        return run_dir if sum(served) > 0 else None
    return None


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP], ids=["kill-9", "sighup"])
def test_a_killed_or_hung_up_perflab_run_leaves_no_engine(tmp_path: Path, how: int) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(LONG_PLAN)
    study = tmp_path / "study"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PERFLAB_SIM_STATE_DIR": str(tmp_path / "sim-state")}
    proc = subprocess.Popen([sys.executable, "-m", "perflab", "run", str(plan), "--out", str(study), "--no-live"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # like a shell's job; SIGHUP is what a closed SSH session sends
    try:
        deadline = time.monotonic() + 120
        while (run_dir := _long_run(study)) is None:  # mid-benchmark: "long"'s launch serves it
            assert proc.poll() is None, f"perflab run exited early ({proc.returncode})"
            assert time.monotonic() < deadline, "the study did not reach its long benchmark"
            time.sleep(0.1)
        launch = json.loads((run_dir / "launch.json").read_text())  # launch.json records the engine's pids
        assert launch["pid"] in {p.pid for p in of_study(study, run_dir.name)}, launch
        assert isinstance(launch["keeper_pid"], int) and psutil.pid_exists(launch["keeper_pid"])
        t0 = time.monotonic()
        os.kill(proc.pid, how)
        left = wait_none(study, 5)
        took = time.monotonic() - t0
        assert left == [], f"engine processes survived {signal.Signals(how).name} of perflab run: {left}"
        code = proc.wait(10)
        # SIGHUP is handled like SIGINT/SIGTERM and exits 128 + its number, as the docs say
        assert code == (129 if how == signal.SIGHUP else -signal.SIGKILL), code
        # the keeper exits once the tree is gone (moments later on a loaded machine)
        keeper_deadline = time.monotonic() + 5
        while psutil.pid_exists(launch["keeper_pid"]) and time.monotonic() < keeper_deadline:
            try:
                if psutil.Process(launch["keeper_pid"]).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        assert not psutil.pid_exists(launch["keeper_pid"]) or \
            psutil.Process(launch["keeper_pid"]).status() == psutil.STATUS_ZOMBIE
        print(f"{signal.Signals(how).name}: engine gone {took:.2f} s after the signal")
        if how == signal.SIGKILL:  # the next invocation says why the run it finds "running" has no result
            from perflab.lab.store import Store

            store = Store(study)
            store.begin_session()
            errors = [r["error"] for r in store.runs() if r["state"] == "interrupted"]
            store.close()
            assert errors and f"perflab (pid {proc.pid}) was killed while this run was going" in errors[-1], errors
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_all(study)


@pytest.mark.slow
def test_perflab_kill_on_a_running_study_records_the_run_interrupted_not_crashed(tmp_path: Path) -> None:
    """``perflab kill STUDY`` while the study benchmarks: the stop is deliberate (kill says so
    in the run directory before any signal), so the run is ``interrupted`` with that reason —
    never the configuration's crash ("exited with code 0 although perflab did not stop it"),
    never reused — and the study stops with one line (exit 3), keeping what it measured."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(LONG_PLAN)
    study = tmp_path / "study"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PERFLAB_SIM_STATE_DIR": str(tmp_path / "sim-state")}
    proc = subprocess.Popen([sys.executable, "-m", "perflab", "run", str(plan), "--out", str(study), "--no-live"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while _long_run(study) is None:  # "main" measured, "long"'s launch serving it
            assert proc.poll() is None, f"perflab run exited early ({proc.returncode})"
            assert time.monotonic() < deadline, "the study did not reach its long benchmark"
            time.sleep(0.1)
        killed = perflab("kill", str(study))
        assert killed.returncode == 0, killed.stderr
        assert "stopped pid" in killed.stdout, f"kill found no engine of the running study: {killed.stdout!r}"
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired as exc:
            log = (study / "study.log").read_text(encoding="utf-8", errors="replace")[-4000:]
            raise AssertionError(f"perflab run went on after `perflab kill` ({killed.stdout.strip()});\n"
                                 f"stderr: {exc.stderr!r}\nstudy.log tail:\n{log}") from exc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_all(study)
    assert proc.returncode == 3, err
    # exit 3's documented meaning (--help, --json's exit_meaning, the user guide) covers this stop
    from perflab.lab.exits import RunExit
    assert "`perflab kill`" in RunExit(proc.returncode).meaning
    lines = [ln for ln in err.splitlines() if ln.startswith("perflab: error:")]
    assert len(lines) == 1 and "stopped by `perflab kill`" in lines[0] and "Traceback" not in err, err
    # the progress line and study.log say the same: no "crashed", no "although perflab did not stop it"
    assert not [ln for ln in err.splitlines() if ln.rstrip().endswith(": crashed")], err
    assert "although perflab did not stop it" not in (study / "study.log").read_text(encoding="utf-8")
    runs = _rows(study / "study.db", "SELECT state, error, cause FROM runs")
    assert runs[-1][0] == "interrupted" and "crashed" not in [r[0] for r in runs], runs
    assert "stopped by `perflab kill` (pid" in str(runs[-1][1]) and runs[-1][2] is None
    assert _rows(study / "study.db", "SELECT profile, status FROM measurements") == [("main", "ok")]
