"""A study's integrity: one writer, a machine that is ready, storage faults that lose nothing.

* :class:`StudyLock` — an OS file lock (``flock``) on ``<study>/.perflab.lock`` held for the
  whole ``perflab run``; a second run on the same directory exits 2 naming the holder's pid.
  ``perflab report`` reads without it. The lock dies with its process (no stale-lock cleanup).
* :func:`device_holders` / :func:`wait_until_ready` — before each launch, the devices a
  configuration will use must be free: a process holding accelerator memory on them (NVML's
  compute processes, ``npu-smi info``'s process table, the simulator's memory registry) means
  the machine is not ready. perflab waits (``timeouts.device_wait_s``) and then stops the study
  with :class:`MachineNotReady` naming the holder — it never launches into a busy device and
  records the engine's "Free memory on device ..." crash as the configuration's result.
* :class:`StorageFault` — disk full, read-only directory, a corrupt ``study.db``: one line,
  exit 1; everything already measured is in the run directories and the database.
* :func:`check_plan` — a study directory belongs to one plan: its identity
  (:func:`plan_identity`: name, model, hardware) is recorded in the study's meta, and
  another plan is refused with :class:`PlanMismatch` (exit 2) naming both;
  :func:`archive_study` moves the old study aside for ``--replace``.

See docs/reliability.md for the whole fault matrix.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from perflab.contract.errors import PerflabError, UsageError
from perflab.lab.exits import RunExit

if TYPE_CHECKING:
    from perflab.contract.types import Accelerator
    from perflab.lab.plan import Plan

# a study directory's files: the store's index and its meta mirror (declared here, below the
# store, because these checks read them without opening a Store)
DB_NAME = "study.db"
META_FILE = "study.json"
LOCK_NAME = ".perflab.lock"
DEFAULT_DEVICE_WAIT_S = 60.0
DEVICE_POLL_S = 2.0


class StudyLocked(PerflabError):
    """Another ``perflab run`` writes this study directory."""

    exit_code = RunExit.USAGE


class MachineNotReady(PerflabError):
    """The devices (or a port) a launch needs are held by someone else, or a teardown left
    something behind: the environment is at fault, not the configuration."""

    exit_code = RunExit.ENVIRONMENT

    def __init__(self, message: str, leftovers: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.leftovers = list(leftovers)


class StorageFault(PerflabError):
    """The study directory cannot be written (disk full, read-only) or its database is corrupt."""

    exit_code = RunExit.ERROR


class PlanMismatch(UsageError):
    """``--out`` holds the study of another plan."""

    exit_code = RunExit.USAGE


# ---------------------------------------------------------------------------------- lock


class StudyLock:
    """``with StudyLock(dir):`` — exclusive, non-blocking; raises :class:`StudyLocked`."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def holder(self) -> str:
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except OSError:
            text = ""
        return text or "unknown pid"

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StudyLocked(
                f"{self.path.parent}: another perflab run ({self.holder()}) is writing this study; "
                f"wait for it to finish or stop it (`perflab report` can read the study meanwhile)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> StudyLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# ---------------------------------------------------------------------------------- storage

STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def storage_fault(exc: BaseException, where: Path) -> StorageFault | None:
    """The one-line error for an exception that is a storage fault, else None."""
    import sqlite3

    if isinstance(exc, StorageFault):
        return exc
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        what = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                errno.EROFS: "the file system is read-only"}.get(exc.errno or 0, os.strerror(exc.errno or 0).lower())
        return StorageFault(f"{where}: cannot write the study ({what}: {exc.filename or exc}); everything measured so "
                            f"far is kept — free the space / fix the permissions and re-run the same command to resume")
    if isinstance(exc, sqlite3.DatabaseError):
        # sqlite's text ("database or disk is full") names no file: name the study's database
        text = str(exc)
        db = where / DB_NAME
        if "full" in text:
            return StorageFault(f"{where}: cannot write the study (the disk is full: {db}: {text}); everything measured "
                                f"so far is kept — free the space and re-run the same command to resume")
        if "readonly" in text or "read-only" in text:
            return StorageFault(f"{where}: cannot write the study (read-only: {db}: {text}); fix the permissions and "
                                f"re-run")
        return StorageFault(f"{where}/study.db: {text}; rebuild it from the run directories with "
                            f"`perflab report --rebuild {where}`")
    return None


def as_fault(exc: BaseException, where: Path) -> PerflabError | None:
    """The environment fault ``exc`` is (machine not ready, storage), else None (a bug)."""
    if isinstance(exc, (MachineNotReady, StorageFault)):
        return exc
    return storage_fault(exc, where)


def write_fault(exc: BaseException, where: Path) -> PerflabError | None:
    """Like :func:`as_fault`, and any other ``OSError`` while writing into ``where`` is one
    line naming the file too (a report that cannot be written is never a traceback)."""
    fault = as_fault(exc, where)
    if fault is None and isinstance(exc, OSError):
        fault = StorageFault(f"{where}: cannot write {exc.filename or 'the study'} "
                             f"({exc.strerror or type(exc).__name__}); everything measured so far is kept")
    return fault


def out_dir_fault(exc: OSError, out_dir: Path) -> PerflabError:
    """Why ``--out`` cannot be made a study directory, in one line: a storage fault (read-only,
    full, permissions: exit 1), else a path that cannot hold a directory (under a regular file,
    in /proc: exit 2)."""
    fault = storage_fault(exc, out_dir)
    if fault is not None:
        return fault
    why = exc.strerror or type(exc).__name__
    return UsageError(f"--out {out_dir}: cannot create the study directory there ({why}: {exc.filename or out_dir}); "
                      f"choose a directory you can write")


# ---------------------------------------------------------------------------------- one plan per study

PLAN_IDENTITY_META = "plan_identity"


def plan_identity(plan: Plan) -> dict[str, str]:
    """What makes a study directory one plan's: its name, model and hardware (after
    ``--hardware``); another name, model or machine is another study. A plan of the same
    identity must also keep the study's frame (:func:`plan_frame`). ``hash`` is recorded
    for tools."""
    fields = {"name": plan.name, "model": plan.model, "hardware": plan.hardware}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return {**fields, "hash": digest}


def _stored_meta(study_dir: Path) -> dict[str, Any] | None:
    """The meta of the study in ``study_dir`` (study.db, else its mirror study.json); None
    when there is no study there."""
    import sqlite3

    db_path = study_dir / DB_NAME
    if db_path.is_file():
        try:
            db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
            try:
                rows = db.execute("SELECT key, value FROM meta").fetchall()
            finally:
                db.close()
            return {k: json.loads(v) for k, v in rows}
        except (sqlite3.Error, ValueError):
            pass  # a corrupt database: its mirror says whose study it is
    mirror = study_dir / META_FILE
    if mirror.is_file():
        try:
            meta = json.loads(mirror.read_text(encoding="utf-8"))
            return meta if isinstance(meta, dict) else None
        except (OSError, ValueError):
            return None
    return None


def stored_identity(study_dir: Path) -> tuple[dict[str, str], str] | None:
    """(identity, plan path) of the study in ``study_dir``; None when there is none, or it
    cannot be told. A study written before identities were recorded gets its identity from
    its stored plan text and hardware."""
    meta = _stored_meta(study_dir)
    if not meta:
        return None
    path = str(meta.get("plan_path") or study_dir / "plan.yaml")
    ident = meta.get(PLAN_IDENTITY_META)
    if isinstance(ident, dict) and ident.get("hash"):
        return {k: str(v) for k, v in ident.items()}, path
    text = meta.get("plan_text")
    if not text:
        return None
    from perflab.lab.plan import load_plan_text

    try:
        old = load_plan_text(text, path=Path(path).name, check_files=False)
    except PerflabError:
        return None  # a plan this perflab cannot read: nothing to compare with
    spec = meta.get("hardware_spec")
    if spec and spec != old.hardware:
        import dataclasses

        old = dataclasses.replace(old, hardware=str(spec))
    return plan_identity(old), path


# What a study is, besides its identity: a plan that changes any of these is another study,
# refused. Left out on purpose: candidates and combinations (each measurement is keyed by its
# configuration, so adding, removing or editing one keeps every other measurement valid: the
# study resumes), new profiles (the same), what only the report shows (title, objective,
# notes, the model's display name and metadata, cost, guards) and how a measurement is run,
# not what it is (timeouts, early_stop: --retry-failed and --no-early-stop measure again).
FRAME_FIELDS = ("engines", "baseline", "main_profile", "serve", "engine_serve", "min_success_rate",
                "min_improvement_pct", "time_scale", "sim_engine_versions", "engine_versions")
_FRAME_DECISION_SKIP = ("early_stop", "guards")


def plan_frame(plan: Plan) -> dict[str, Any]:
    """The plan's frame (:data:`FRAME_FIELDS`, its decision method and its profiles), as JSON,
    read from its text with the known secrets masked — as the study stores it — so that a
    secret never decides and the stored copy compares equal to its own file."""
    from perflab import redact
    from perflab.contract.types import to_jsonable
    from perflab.lab.plan import load_plan_text

    if plan.text:
        with contextlib.suppress(PerflabError):
            plan = load_plan_text(redact.scrub_plan(plan.text), path=Path(plan.path.name if plan.path else "plan.yaml"),
                                  check_files=False)
    frame: dict[str, Any] = {f: to_jsonable(getattr(plan, f)) for f in FRAME_FIELDS}
    frame["serve"] = to_jsonable(plan.serve.plan_options())  # the options set, not every field of a ServeConfig
    decision = to_jsonable(plan.decision)
    frame["decision"] = {k: v for k, v in decision.items() if k not in _FRAME_DECISION_SKIP}
    frame["profiles"] = {p.name: to_jsonable(p) for p in plan.profiles}
    return frame


def _frame_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two frames, one phrase each; profiles may only be added."""
    def short(v: Any) -> str:
        text = json.dumps(v, sort_keys=True)
        return text if len(text) <= 60 else text[:57] + "..."

    out = [f"{k} {short(old.get(k))} vs {short(new.get(k))}" for k in (*FRAME_FIELDS, "decision")
           if old.get(k) != new.get(k)]
    for name, prof in (old.get("profiles") or {}).items():
        if name not in new["profiles"]:
            out.append(f"profile {name!r} removed")
        elif new["profiles"][name] != prof:
            out.append(f"profile {name!r} changed")
    return out


def _stored_frame(study_dir: Path) -> tuple[dict[str, Any], str] | None:
    meta = _stored_meta(study_dir) or {}
    text = meta.get("plan_text")
    if not text:
        return None
    from perflab.lab.plan import load_plan_text

    path = str(meta.get("plan_path") or study_dir / "plan.yaml")
    try:
        old = load_plan_text(text, path=Path(path).name, check_files=False)
    except PerflabError:
        return None  # a plan this perflab cannot read: its identity decided
    return plan_frame(old), path


def check_plan(study_dir: Path, plan: Plan, *, remedy: str) -> bool:
    """Refuse ``plan`` when ``study_dir`` holds the study of another plan
    (:class:`PlanMismatch`, naming both and ``remedy``): another identity (name, model,
    hardware), or the same with another frame (:func:`plan_frame`: engines, baseline,
    workloads, serving options, method). True when a study of this plan is there (it
    resumes), False when there is none."""
    found = stored_identity(study_dir)
    if found is None:
        return (study_dir / "study.db").is_file()
    old, old_path = found
    new = plan_identity(plan)
    if old["hash"] == new["hash"]:
        stored = _stored_frame(study_dir)
        changes = _frame_changes(stored[0], plan_frame(plan)) if stored is not None else []
        if changes:
            new_path = str(plan.path) if plan.path is not None else "(built in)"
            raise PlanMismatch(
                f"{study_dir} holds the study of plan {old.get('name')!r} ({old_path}), and {new_path} changes what "
                f"that study is: {'; '.join(changes)} (a study may gain candidates, combinations and profiles, "
                f"nothing else); {remedy}")
        return True
    diff = "; ".join(f"{k} {old.get(k)!r} vs {new[k]!r}" for k in ("name", "model", "hardware") if old.get(k) != new[k])
    new_path = str(plan.path) if plan.path is not None else "(built in)"
    if all(old.get(k) == new[k] for k in ("name", "model")):  # the same plan on another machine
        remedy = f"to resume it, run with --hardware {old.get('hardware')}; or {remedy}"
    raise PlanMismatch(f"{study_dir} holds the study of plan {old.get('name')!r} ({old_path}), not of plan "
                       f"{new['name']!r} ({new_path}): {diff}; {remedy}")


def archive_study(study_dir: Path) -> Path:
    """Move the study in ``study_dir`` aside to ``<dir>.replaced-<UTC time>`` (kept whole,
    never deleted) and leave ``study_dir`` empty; the archive's path."""
    src = Path(study_dir).resolve()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = src.with_name(f"{src.name}.replaced-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = src.with_name(f"{src.name}.replaced-{stamp}-{n}")
    try:
        src.rename(dest)
        src.mkdir()
    except OSError as exc:
        raise UsageError(f"--replace: cannot move the study in {study_dir} aside to {dest} "
                         f"({exc.strerror or exc}); move it yourself or choose another --out") from None
    return dest


# ---------------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class DeviceHolder:
    """A process holding memory on a device a launch needs (or a port it needs)."""

    what: str  # "cuda:0", "ascend:3", "port 8000"
    pid: int | None
    command: str
    mib: int | None = None
    study: str | None = None  # "perflab study DIR, run runs/007-x" when it is one of ours

    def describe(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "a process perflab cannot see"
        text = f"{self.what} is held by {who}"
        if self.command:
            text += f" ({self.command})"
        if self.mib is not None:
            text += f", {self.mib} MiB"
        if self.study:
            text += f" — {self.study}"
        return text


def _command(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        cmd = proc.cmdline()
        text = " ".join(cmd) if cmd else proc.name()
    except (psutil.Error, OSError):
        return ""
    return text if len(text) <= 120 else text[:117] + "..."


def perflab_owner(pid: int) -> str | None:
    """"perflab study DIR, run runs/NNN-x" when ``pid`` (or an ancestor) is an engine perflab
    launched in a study's run directory, or whose marker names them; "perflab" for a perflab
    process elsewhere."""
    from perflab.lifecycle.procs import MARKER_ENV, Marker

    try:
        proc: psutil.Process | None = psutil.Process(pid)
    except (psutil.Error, OSError):
        return None
    for _ in range(6):
        if proc is None:
            break
        try:
            cwd = Path(proc.cwd())
        except (psutil.Error, OSError):
            cwd = None
        if cwd is not None:
            for d in (cwd, *cwd.parents[:2]):
                if d.parent.name == "runs" and (d.parent.parent / "study.db").exists():
                    return f"perflab study {d.parent.parent}, run runs/{d.name}"
        try:
            env = proc.environ()
            if MARKER_ENV in env:
                # its marker names the study and run (an engine a Ray agent runs in a stage on
                # its node has no study directory around it: perflab.lab.run.backends.shipping)
                marker = Marker.parse(env[MARKER_ENV])
                if marker is not None:
                    return f"perflab study {marker.study}, run runs/{marker.run}"
                return "an engine launched by perflab"
            proc = proc.parent()
        except (psutil.Error, OSError):
            break
    return None


def _standin_holders(memory: Any, env: Mapping[str, str], kind: str, devices: Sequence[int]) -> list[DeviceHolder]:
    """Holders as the activated environment's device-memory stand-in reports them
    (:data:`perflab.hardware.standins.DEVICE_MEMORY_ENV`)."""
    return [DeviceHolder(f"{kind}:{d}", pid, _command(pid) or name, mib, perflab_owner(pid))
            for d, pid, name, mib in memory(env, devices)]


def _nvml_holders(devices: Sequence[int]) -> list[DeviceHolder]:
    """Compute processes on each CUDA device (pynvml.nvmlDeviceGetComputeRunningProcesses,
    nvidia-ml-py; ``usedGpuMemory`` in bytes, None when the driver hides it)."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    out = []
    try:
        for d in devices:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(d)
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:
                continue
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                mib = int(used) // (1024 * 1024) if isinstance(used, int) else None
                out.append(DeviceHolder(f"cuda:{d}", int(p.pid), _command(int(p.pid)), mib, perflab_owner(int(p.pid))))
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return out


def _npusmi_holders(env: Mapping[str, str], devices: Sequence[int]) -> list[DeviceHolder]:
    """The process table of ``npu-smi info`` (parsed by perflab.hardware.npusmi_parse),
    mapped from (NPU id, chip id) to the logic ids launches use."""
    from perflab.hardware.npusmi_parse import merge, parse_info, parse_mapping

    exe = shutil.which("npu-smi", path=env.get("PATH", os.defpath))
    if exe is None:
        return []
    try:
        info = parse_info(subprocess.run([exe, "info"], env=dict(env), capture_output=True, text=True,
                                         timeout=30, check=False).stdout)
        mapping = subprocess.run([exe, "info", "-m"], env=dict(env), capture_output=True, text=True,
                                 timeout=15, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    logic = {(c.npu_id, c.chip_id): c.logic_id for c in merge(info, parse_mapping(mapping))}
    out = []
    for p in info.processes:
        d = logic.get((p.npu_id, p.chip_id))
        if d is not None and d in devices:
            out.append(DeviceHolder(f"ascend:{d}", p.pid, _command(p.pid) or p.name, p.memory_mb, perflab_owner(p.pid)))
    return out


def invisible_holders(start: Sequence[Accelerator], now: Sequence[Accelerator],
                      devices_by_kind: Mapping[str, Sequence[int]]) -> list[DeviceHolder]:
    """Memory in use on the devices a launch needs that no visible process holds (another
    container's, a driver-hidden one): more than the supervisor's tolerance above what the
    study started with (``start``: the study's hardware; ``now``: a probe now). Never the
    host CPU's RAM (kind ``cpu``): every process on the machine uses it, and a VM that hands
    freed pages back to its host (free page reporting) shows memory freed by the previous
    engine as in use for a minute after it exited — the supervisor's leftover check skips it
    for the same reason."""
    from perflab.hardware import CPU_KIND
    from perflab.supervisor import MEMORY_TOLERANCE

    before = {(a.kind, a.index): a.memory_used_mib for a in start}
    out = []
    for a in now:
        if a.kind == CPU_KIND or a.index not in devices_by_kind.get(a.kind, ()):
            continue
        grown = a.memory_used_mib - before.get((a.kind, a.index), a.memory_used_mib)
        if grown > max(MEMORY_TOLERANCE * a.memory_total_mib, 64):
            out.append(DeviceHolder(f"{a.kind}:{a.index}", None, "", grown))
    return out


def device_holders(env: Mapping[str, str], devices_by_kind: Mapping[str, Sequence[int]],
                   ports: Iterable[int] = (), host: str = "127.0.0.1") -> list[DeviceHolder]:
    """Who holds the devices (and fixed ports) a launch needs; [] when the machine is ready."""
    from perflab.hardware.standins import DEVICE_MEMORY_ENV, standin
    from perflab.lifecycle.ports import port_is_free, port_owners

    memory = standin(env, DEVICE_MEMORY_ENV)  # an activated machine's own registry (perflab-sim)
    found: list[DeviceHolder] = []
    for kind, devices in devices_by_kind.items():
        if not devices:
            continue
        if memory is not None:
            found += _standin_holders(memory, env, kind, devices)
        elif kind == "cuda":
            found += _nvml_holders(devices)
        elif kind == "ascend":
            found += _npusmi_holders(env, devices)
    busy = [p for p in ports if not port_is_free(host, p)]
    if busy:
        owners = {o.port: o for o in port_owners(busy)}
        for p in busy:
            o = owners.get(p)
            pid = o.pid if o is not None else None
            found.append(DeviceHolder(f"port {p}", pid, (_command(pid) if pid else "") or (o.name or "" if o else ""),
                                      None, perflab_owner(pid) if pid else None))
    return found


async def wait_until_ready(check: Any, wait_s: float, on_wait: Any = None) -> None:
    """Call ``check()`` (-> list of DeviceHolder) until it is empty or ``wait_s`` passed; then
    raise :class:`MachineNotReady` naming the holders."""
    import anyio
    import anyio.to_thread

    deadline = time.monotonic() + wait_s
    told = False
    while True:
        holders = await anyio.to_thread.run_sync(check)
        if not holders:
            return
        if time.monotonic() >= deadline:
            raise MachineNotReady(
                "the machine is not ready: " + "; ".join(h.describe() for h in holders)
                + f" (waited {wait_s:g} s; nothing was launched — stop it, or raise timeouts.device_wait_s, "
                  "and re-run the same command to resume)"
            )
        if on_wait is not None and not told:
            on_wait(holders)
            told = True
        await anyio.sleep(min(DEVICE_POLL_S, max(0.05, deadline - time.monotonic())))


__all__ = [
    "DEFAULT_DEVICE_WAIT_S",
    "DeviceHolder",
    "MachineNotReady",
    "PlanMismatch",
    "StorageFault",
    "StudyLock",
    "StudyLocked",
    "archive_study",
    "as_fault",
    "check_plan",
    "device_holders",
    "invisible_holders",
    "out_dir_fault",
    "perflab_owner",
    "plan_identity",
    "storage_fault",
    "stored_identity",
    "wait_until_ready",
    "write_fault",
]
