"""The keeper (perflab.lifecycle.keeper): engines never outlive perflab.

Small stand-in process trees started through :func:`perflab.lifecycle.procs.spawn`; processes
are checked by their ``PERFLAB_INSTANCE`` marker (each test makes its own), never by name.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import psutil
import pytest

from perflab.lifecycle import procs

# A tree like an engine's: a leader with two workers; the leader forwards its first SIGTERM to
# them and exits 0 once they are gone. Every process writes down the signals it receives.
# argv: SIGNAL_DIR [worker flags...]: "orphan" (a worker that ignores SIGTERM and that the
# leader does not forward to), "grandchild" (a worker that double-forks: its child is orphaned
# at once).
TREE_SRC = r'''
import os, signal, subprocess, sys, time
sig_dir = sys.argv[1]
flags = sys.argv[2:]

def recorder(path, on_term):
    def rec(sig, frame):
        with open(path, "a") as f:
            f.write(signal.Signals(sig).name + "\n")
        if sig == signal.SIGTERM:
            on_term()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, rec)
    open(path, "a").close()  # after the handlers: its file says it records

if os.environ.get("TREE_ROLE") == "worker":
    ignore = os.environ.get("TREE_IGNORE_TERM") == "1"
    recorder(os.path.join(sig_dir, "%d.sig" % os.getpid()), (lambda: None) if ignore else (lambda: os._exit(0)))
    if os.environ.get("TREE_DOUBLE_FORK") == "1":
        if os.fork() == 0:
            os.write(1, b"GRANDCHILD %d\n" % os.getpid())
            time.sleep(60)
            os._exit(0)
    os.write(1, b"WORKER %d\n" % os.getpid())
    while True:
        time.sleep(1)

workers = []
def stop():
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        w.wait()
    os.write(1, b"LEADER stopped\n")
    os._exit(0)
recorder(os.path.join(sig_dir, "%d.sig" % os.getpid()), stop)
for i in range(2):
    workers.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env={**os.environ, "TREE_ROLE": "worker"}))
if "orphan" in flags:
    subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env={**os.environ, "TREE_ROLE": "worker", "TREE_IGNORE_TERM": "1"})
if "grandchild" in flags:
    subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env={**os.environ, "TREE_ROLE": "worker", "TREE_DOUBLE_FORK": "1"})
os.write(1, b"LEADER ready\n")
while True:
    time.sleep(1)
'''


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Tree:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.script = tmp / "tree.py"
        self.script.write_text(TREE_SRC)
        self.sig_dir = tmp / "signals"
        self.sig_dir.mkdir()
        self.marker = str(procs.Marker.new(tmp, "keeper-test"))
        self.started: list[procs.KeptProcess] = []
        self.out: list[int] = []
        self.text = b""

    def spawn(self, *flags: str, grace: float = 5.0) -> procs.KeptProcess:
        env = {**os.environ, procs.MARKER_ENV: self.marker}
        proc, fd = procs.spawn([sys.executable, str(self.script), str(self.sig_dir), *flags], env, str(self.tmp),
                               grace=grace)
        self.started.append(proc)
        self.out.append(fd)
        return proc

    def read(self) -> str:
        for fd in self.out:
            try:
                while chunk := os.read(fd, 65536):
                    self.text += chunk
            except BlockingIOError:
                pass
        return self.text.decode()

    def wait_line(self, prefix: str, n: int = 1, timeout: float = 15) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = [int(line.split()[1]) for line in self.read().splitlines() if line.startswith(prefix + " ")
                    and line.split()[1].isdigit()]
            if len(pids) >= n:
                return pids
            time.sleep(0.02)
        pytest.fail(f"no {n} x {prefix!r} within {timeout} s: {self.read()}")

    def marked(self) -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(procs.MARKER_ENV) == self.marker and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except (psutil.Error, OSError):
                continue
        return out

    def signals(self) -> dict[int, list[str]]:
        return {int(f.stem): f.read_text().split() for f in self.sig_dir.glob("*.sig")}

    def wait_gone(self, pids: list[int], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(_running(p) for p in pids) and not self.marked():
                return True
            time.sleep(0.02)
        return False


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Tree]:
    t = Tree(tmp_path)
    yield t
    for p in t.marked():  # a failing test must not leave its tree running
        try:
            p.kill()
        except psutil.Error:
            pass
    for proc in t.started:
        proc.close()
    for fd in t.out:
        os.close(fd)


def test_the_keeper_is_a_python_program_without_the_marker_and_not_our_child(tree: Tree) -> None:
    proc = tree.spawn()
    tree.wait_line("WORKER", 2)
    keeper = psutil.Process(proc.keeper_pid)
    assert keeper.cmdline()[1:3] == ["-m", "perflab.lifecycle.keeper"]
    assert procs.MARKER_ENV not in keeper.environ()  # a marker scan never finds the keeper
    assert keeper.pid not in {c.pid for c in psutil.Process().children(recursive=True)}  # double-forked
    assert psutil.Process(proc.pid).ppid() == keeper.pid  # the engine is the keeper's child
    assert os.getsid(proc.pid) == proc.pid  # in a session of its own
    assert len(tree.marked()) == 3


def test_closing_the_lifeline_stops_the_tree_one_sigterm_each_and_the_keeper_exits(tree: Tree) -> None:
    proc = tree.spawn()
    tree.wait_line("WORKER", 2)
    pids = [p.pid for p in tree.marked()]
    assert len(pids) == 3
    proc.close_lifeline()  # what perflab's death does too
    assert tree.wait_gone([*pids, proc.keeper_pid], 5), [p.pid for p in tree.marked()]
    got = tree.signals()
    assert set(got) == set(pids)
    assert all(sigs == ["SIGTERM"] for sigs in got.values()), got  # exactly one each, no SIGKILL needed
    assert "LEADER stopped" in tree.read()
    assert proc.poll() == 0  # reported by the keeper before it exited


@pytest.mark.anyio
async def test_the_keeper_reports_the_exit_and_exits_when_the_tree_is_gone(tree: Tree) -> None:
    proc = tree.spawn()
    tree.wait_line("WORKER", 2)
    kids = [p.pid for p in psutil.Process(proc.pid).children()]
    for pid in kids:
        os.kill(pid, signal.SIGKILL)
    os.kill(proc.pid, signal.SIGKILL)
    with anyio.fail_after(5):
        rc = await procs.wait_exit(proc)  # the pidfd of the engine's pid, then the keeper's report
    assert rc == -signal.SIGKILL
    assert tree.wait_gone([proc.keeper_pid, *kids], 3)  # the lifeline is still open: it exits on its own


def test_an_orphaned_worker_gets_a_short_grace(tree: Tree) -> None:
    proc = tree.spawn("orphan", grace=8.0)
    tree.wait_line("WORKER", 3)
    tracker = procs.ProcessTracker(proc, tree.marker)
    t0 = time.monotonic()
    report = procs.stop_tree(tracker, 8.0)
    took = time.monotonic() - t0
    assert procs.ORPHAN_GRACE_S <= took < 4, took
    assert len(report.killed) == 1 and "outlived its leader" in report.killed[0]
    assert report.leftovers == []
    assert len(report.sigterm) == len(set(report.sigterm)) == 2  # the leader, then the orphan
    assert all(sigs.count("SIGTERM") == 1 for sigs in tree.signals().values()), tree.signals()
    assert tree.wait_gone([proc.keeper_pid], 3)


def test_the_keeper_is_a_subreaper_orphans_are_its_children_and_get_reaped(tree: Tree) -> None:
    proc = tree.spawn("grandchild")
    (grandchild,) = tree.wait_line("GRANDCHILD")
    workers = tree.wait_line("WORKER", 3)
    parent = psutil.Process(grandchild).ppid()
    assert parent in workers
    os.kill(parent, signal.SIGKILL)  # the grandchild loses its parent: re-parented to the keeper, not init
    deadline = time.monotonic() + 5
    while psutil.Process(grandchild).ppid() != proc.keeper_pid:
        assert time.monotonic() < deadline, psutil.Process(grandchild).ppid()
        time.sleep(0.02)
    # the dead worker is a zombie of the leader, which never waits for it
    assert psutil.Process(parent).status() == psutil.STATUS_ZOMBIE
    proc.close_lifeline()
    assert tree.wait_gone([grandchild, proc.pid, proc.keeper_pid], 5)
    # stopped and reaped by the keeper: the grandchild, and the zombie once the leader was gone
    assert not psutil.pid_exists(grandchild) and not psutil.pid_exists(parent)


KILLED_OWNER_SRC = r"""
import json, os, sys, time
from perflab.lifecycle import procs
env = {**os.environ, procs.MARKER_ENV: sys.argv[1]}
proc, fd = procs.spawn([sys.executable, sys.argv[2], sys.argv[3]], env, None, grace=5.0)
print(json.dumps({"pid": proc.pid, "keeper": proc.keeper_pid}), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP])
def test_an_owner_killed_or_hung_up_leaves_no_engine(tree: Tree, how: int) -> None:
    owner = subprocess.Popen([sys.executable, "-c", KILLED_OWNER_SRC, tree.marker, str(tree.script), str(tree.sig_dir)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        info = json.loads(owner.stdout.readline())
        deadline = time.monotonic() + 15
        while len(tree.signals()) < 3:
            assert time.monotonic() < deadline, "the tree did not start"
            time.sleep(0.05)
        pids = [p.pid for p in tree.marked()]
        owner.send_signal(how)  # SIGHUP: a plain python process dies of it, like a closed SSH session
        owner.wait(5)
        assert tree.wait_gone([*pids, info["keeper"]], 5), [p.pid for p in tree.marked()]
        assert all(sigs == ["SIGTERM"] for sigs in tree.signals().values()), tree.signals()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_an_engine_that_cannot_start_raises_and_leaves_no_keeper(tmp_path: Path) -> None:
    tag = secrets.token_hex(8)  # in the keeper's own environment: finds our keeper, not others'
    before = set(psutil.Process().children())  # e.g. a session-scoped cluster of other tests
    with pytest.raises(FileNotFoundError):
        procs.spawn([str(tmp_path / "no-such-engine")], dict(os.environ), None, grace=1.0,
                    keeper_env={**os.environ, "KEEPER_TEST_TAG": tag})
    deadline = time.monotonic() + 3
    while _tagged(tag):
        assert time.monotonic() < deadline, "the keeper did not exit"
        time.sleep(0.02)
    assert set(psutil.Process().children()) - before == set()  # the first process of the double fork is reaped


def _tagged(tag: str) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("KEEPER_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


def test_marker_round_trip_and_owner() -> None:
    m = procs.Marker.new("/some/study:dir", "003-vllm fp8")
    parsed = procs.Marker.parse(str(m))
    assert parsed == m and parsed.study.endswith("/some/study:dir") and parsed.run == "003-vllm_fp8"
    assert m.owner_alive()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    p = psutil.Process(dead.pid)
    start = int(p.create_time() * 1000)
    dead.wait()
    assert not procs.Marker(m.token, dead.pid, start, m.run, m.study).owner_alive()
    assert procs.Marker.parse("0123abcd") is None and procs.Marker.parse("pl1:x:y:z") is None


# An engine that leaves files in its temporary directory, as vLLM does (a ZMQ IPC socket per
# ipc:// endpoint and a FileStore rendezvous file, never removed): prints where they are.
TMP_LITTER_SRC = r"""
import os, socket, sys, tempfile, time
d = tempfile.gettempdir()
open(os.path.join(d, "vllm_dist_0123abcd"), "w").write("x")
s = socket.socket(socket.AF_UNIX)
s.bind(os.path.join(d, "8d5f2e0c-6a4b-4f1e-9d0a-1b2c3d4e5f60"))  # never unlinked, like a killed engine's
print("TMP", d, flush=True)
print("INDUCTOR", os.environ.get("TORCHINDUCTOR_CACHE_DIR"), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["stop", "owner-killed"])
def test_the_engine_gets_its_own_tmpdir_and_what_it_leaves_there_goes_with_it(tmp_path: Path, how: str) -> None:
    parent = Path(tempfile.mkdtemp(prefix="pk-"))  # short: pytest's tmp_path is too long for AF_UNIX's 107 bytes
    script = tmp_path / "litter.py"
    script.write_text(TMP_LITTER_SRC)
    marker = str(procs.Marker.new(tmp_path, "keeper-tmp"))
    env = {**os.environ, procs.MARKER_ENV: marker, "TMPDIR": str(parent), "USER": "a/b"}  # the engine's TMPDIR: the parent
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("LOGNAME", None)
    if how == "stop":
        proc, fd = procs.spawn([sys.executable, str(script)], env, None, grace=5.0)
        info = {"keeper": proc.keeper_pid, "tmpdir": proc.tmpdir}
        owner = None
    else:  # perflab itself dies (kill -9): the keeper still cleans up
        src = ("import json, os, sys, time\nfrom perflab.lifecycle import procs\n"
               "env = json.loads(sys.argv[1])\n"
               "proc, fd = procs.spawn([sys.executable, sys.argv[2]], env, None, grace=5.0)\n"
               "print(json.dumps({'keeper': proc.keeper_pid, 'tmpdir': proc.tmpdir}), flush=True)\n"
               "time.sleep(600)\n")
        owner = subprocess.Popen([sys.executable, "-c", src, json.dumps(env), str(script)], stdout=subprocess.PIPE, text=True)
        assert owner.stdout is not None
        info = json.loads(owner.stdout.readline())
        proc, fd = None, None
    try:
        tmp = Path(info["tmpdir"])
        assert tmp.parent == parent and tmp.name.startswith("perflab-engine-")
        deadline = time.monotonic() + 15
        while len(list(tmp.iterdir())) < 2:  # the engine wrote there: it is its TMPDIR
            assert time.monotonic() < deadline, "the engine did not write its files"
            time.sleep(0.02)
        if proc is not None:
            deadline = time.monotonic() + 5
            text = b""
            while b"INDUCTOR" not in text:
                assert time.monotonic() < deadline, text
                try:
                    text += os.read(fd, 4096)
                except BlockingIOError:
                    time.sleep(0.02)
            # PyTorch Inductor's kernel cache stays where it would have been: reused by the next launch
            assert f"INDUCTOR {parent / 'torchinductor_a_b'}" in text.decode(), text
            report = procs.stop_tree(procs.ProcessTracker(proc, marker), 5.0)
            assert report.leftovers == []
            proc.close_lifeline()
        else:
            assert owner is not None
            owner.kill()
            owner.wait(5)
        deadline = time.monotonic() + 10
        while tmp.exists() or _running(int(info["keeper"])):
            assert time.monotonic() < deadline, sorted(p.name for p in tmp.iterdir()) if tmp.exists() else "keeper alive"
            time.sleep(0.02)
        assert list(parent.iterdir()) == []  # nothing else was put beside it
    finally:
        if owner is not None and owner.poll() is None:
            owner.kill()
            owner.wait()
        for p in psutil.process_iter():
            try:
                if p.environ().get(procs.MARKER_ENV) == marker:
                    p.kill()
            except (psutil.Error, OSError):
                continue
        if proc is not None:
            proc.close()
        if fd is not None:
            os.close(fd)
        shutil.rmtree(parent, ignore_errors=True)


def test_a_cache_location_the_engine_is_given_is_kept() -> None:
    from perflab.lifecycle.keeper import kept_caches

    assert kept_caches({"TORCHINDUCTOR_CACHE_DIR": "/cache/inductor", "USER": "x"}, "/tmp") == {}
    assert kept_caches({"LOGNAME": "lo", "USER": "us"}, "/var/t") == {"TORCHINDUCTOR_CACHE_DIR": "/var/t/torchinductor_lo"}


def test_no_private_tmpdir_where_a_socket_would_no_longer_fit() -> None:
    from perflab.lifecycle.keeper import SOCKET_NAME_LEN, SOCKET_PATH_MAX, TMP_PREFIX, private_tmpdir

    short = Path(tempfile.mkdtemp(prefix="pk-"))
    try:
        made = private_tmpdir({"TMPDIR": str(short)})
        assert made is not None and Path(made).parent == short and Path(made).name.startswith(TMP_PREFIX)
    finally:
        shutil.rmtree(short)
    # a parent in which a uuid-named socket fits, but not one more directory down
    room = SOCKET_PATH_MAX - 1 - SOCKET_NAME_LEN
    base = Path(tempfile.mkdtemp(prefix="pk-"))  # short: pytest's tmp_path (under xdist too) may be past the room
    try:
        deep = base
        while len(str(deep)) < room - 10:
            deep = deep / ("d" * min(40, room - 10 - len(str(deep))))
        deep.mkdir(parents=True, exist_ok=True)
        assert len(str(deep)) + 1 + SOCKET_NAME_LEN <= SOCKET_PATH_MAX
        assert private_tmpdir({"TMPDIR": str(deep)}) is None
        assert list(deep.iterdir()) == []  # the one it tried is not left behind
    finally:
        shutil.rmtree(base)


# A leader that holds POSIX shared memory, as vLLM's processes do (multiprocessing's
# shared_memory: its resource tracker starts beside it), and ignores SIGTERM: teardown must
# SIGKILL it.
SHM_STUCK_SRC = r"""
import signal, time
from multiprocessing import shared_memory
signal.signal(signal.SIGTERM, signal.SIG_IGN)
shm = shared_memory.SharedMemory(create=True, size=1 << 16)
print("SHM", shm.name, flush=True)
time.sleep(600)
"""


def test_a_killed_tree_s_resource_tracker_still_unlinks_its_shared_memory(tree: Tree) -> None:
    script = tree.tmp / "shm.py"
    script.write_text(SHM_STUCK_SRC)
    env = {**os.environ, procs.MARKER_ENV: tree.marker}
    proc, fd = procs.spawn([sys.executable, str(script)], env, None, grace=0.5)
    tree.started.append(proc)
    tree.out.append(fd)
    deadline = time.monotonic() + 15
    while "SHM " not in tree.read():
        assert time.monotonic() < deadline, tree.read()
        time.sleep(0.02)
    name = tree.read().split("SHM ")[1].split()[0]
    assert Path("/dev/shm", name).exists()
    deadline = time.monotonic() + 10  # the tracker is started beside it
    while not any(procs._cleans_up(p) for p in tree.marked()):
        assert time.monotonic() < deadline, [procs.describe(p) for p in tree.marked()]
        time.sleep(0.02)
    report = procs.stop_tree(procs.ProcessTracker(proc, tree.marker), 0.5)
    # the leader is SIGKILLed; its resource tracker, spared, then finds its peers gone and
    # unlinks the segment they leaked before it exits
    assert len(report.killed) == 1 and "did not exit within the 0.5 s grace" in report.killed[0], report.killed
    assert report.leftovers == [] and tree.marked() == []
    assert not Path("/dev/shm", name).exists()


# A leader whose child cleans up after it, like Python's resource tracker (its command line
# names it so): it ignores SIGTERM and, once its parent is gone, takes longer than the orphans'
# grace to finish — as a tracker unlinking on a busy host may.
SLOW_CLEANER_SRC = r"""
import os, signal, subprocess, sys, time
done = sys.argv[1]
cleaner = ("# from multiprocessing.resource_tracker import main\n"
           "import os, signal, sys, time\n"
           "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
           "parent = int(sys.argv[2])  # not os.getppid(): the leader may be gone by then\n"
           "print('ARMED', flush=True)\n"
           "while os.getppid() == parent:\n"
           "    time.sleep(0.02)\n"
           "time.sleep(1.5)\n"
           "open(sys.argv[1], 'w').write('cleaned')\n")
subprocess.Popen([sys.executable, "-c", cleaner, done, str(os.getpid())])
print("READY", flush=True)
signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
time.sleep(600)
"""


def test_a_cleaner_left_alone_still_gets_its_time(tree: Tree) -> None:
    script = tree.tmp / "cleaner.py"
    script.write_text(SLOW_CLEANER_SRC)
    done = tree.tmp / "cleaned"
    env = {**os.environ, procs.MARKER_ENV: tree.marker}
    proc, fd = procs.spawn([sys.executable, str(script), str(done)], env, None, grace=5.0)
    tree.started.append(proc)
    tree.out.append(fd)
    deadline = time.monotonic() + 15
    # ARMED: the cleaner ignores SIGTERM (on a busy host its interpreter may still be starting)
    while "READY" not in tree.read() or "ARMED" not in tree.read() or len(tree.marked()) < 2:
        assert time.monotonic() < deadline, tree.read()
        time.sleep(0.02)
    report = procs.stop_tree(procs.ProcessTracker(proc, tree.marker), 5.0)
    # the leader exits on SIGTERM; the cleaner, alone after the orphans' 1 s grace, is spared
    # for CLEANUP_WAIT_S and finishes on its own
    assert report.killed == [] and report.leftovers == [], report.killed
    assert done.read_text() == "cleaned"
