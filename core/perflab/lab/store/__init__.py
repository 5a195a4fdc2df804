"""The study directory: a SQLite index over one directory per run.

Layout of a study directory::

    study.db            runs and measurements (this module)
    plan.yaml           the plan as given (or plan.toml)
    hardware.json       the probed hardware snapshot
    study.log           the structured log (JSON lines)
    runs/007-vllm-fp8/  launch.json, engine.log, hardware.json, bench-<profile>.json, outcome.json,
                        point-<profile>-<load>.json (a curve's load points, as measured)
    report.md, report.json, chart.png
    sim-state/          the simulated machine's memory registry (simulated studies)

A *run* is one launch of a configuration (all its replicas), benchmarked on one or more
profiles; a *measurement* is one (configuration, profile) result of a run. Lookups go by the
configuration's key and the profile's key, so re-running a plan reuses every measurement
whose configuration and workload are unchanged — that is how a study resumes. A curve (a
sweep, a max-load search) is one measurement, stored when it ends; its load points are
stored as they are measured, and a resume of a curve that was interrupted measures only the
points it lacks (:meth:`Store.points`).

Every write commits at once: a study killed at any moment keeps what it measured.

The run directories are the source of truth, the database their index: each run directory
holds ``run.json`` (its keys, configuration, state) and one ``measurement-<profile>.json`` per
measurement, written atomically (temp file + rename) inside the same transaction as the
database row (the row commits only once the file is there), and ``study.json`` mirrors the
study's meta. :func:`rebuild` recreates a missing or corrupt ``study.db`` from them
(``perflab report --rebuild``); an empty ``study.db`` beside existing run directories is
rebuilt, never written over them.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab import redact
from perflab.bench.metrics import BenchMetrics, metrics_json, read_metrics
from perflab.contract.status import Status
from perflab.contract.types import CrashCause, Unsupported, to_jsonable
from perflab.lab.measured import EXTRA_FIELDS, MeasurementExtras
from perflab.lab.store.integrity import DB_NAME, META_FILE
from perflab.lab.study import ConfigResult

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    started  REAL NOT NULL,
    finished REAL,
    state    TEXT NOT NULL,      -- running | done | interrupted | failed
    argv     TEXT,
    pid      INTEGER             -- the perflab process of the session
);
CREATE TABLE IF NOT EXISTS runs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id  INTEGER NOT NULL REFERENCES sessions(id),
    config_key  TEXT NOT NULL,
    engine      TEXT NOT NULL,
    config      TEXT NOT NULL,   -- JSON: Configuration.canonical()
    step        TEXT,
    label       TEXT,
    profiles    TEXT NOT NULL,   -- JSON list of profile names asked for
    state       TEXT NOT NULL,   -- running | done | unsupported | crashed | timeout | failed | interrupted
    dir         TEXT NOT NULL,   -- relative to the study directory
    started     REAL NOT NULL,
    finished    REAL,
    version     TEXT,
    script      TEXT,
    reasons     TEXT,            -- JSON list of Unsupported
    cause       TEXT,            -- JSON CrashCause
    error       TEXT,
    log         TEXT,            -- relative path of the (first) engine log
    engine_seconds REAL,         -- accelerators x (teardown - launch), engine time
    accelerators INTEGER         -- devices the launch held (at least 1)
);
CREATE INDEX IF NOT EXISTS runs_by_config ON runs(config_key);
CREATE TABLE IF NOT EXISTS measurements (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    config_key  TEXT NOT NULL,
    profile_key TEXT NOT NULL,
    profile     TEXT NOT NULL,
    status      TEXT NOT NULL,   -- ok | crashed | failed
    metrics     TEXT,            -- JSON, vLLM --save-result names
    num_prompts INTEGER,
    error       TEXT,
    cause       TEXT,
    created     REAL NOT NULL,
    extra       TEXT             -- JSON: the measurement's extras (perflab.lab.measured.EXTRA_FIELDS)
);
CREATE INDEX IF NOT EXISTS measurements_by_key ON measurements(config_key, profile_key);
CREATE TABLE IF NOT EXISTS points (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    config_key  TEXT NOT NULL,
    profile_key TEXT NOT NULL,
    point       TEXT NOT NULL,   -- the load point of a curve: "max_concurrency=16" (perflab.lab.run.executor.point_name)
    data        TEXT NOT NULL,   -- JSON: its measurement (status, metrics, num_prompts, error, extras)
    created     REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS points_by_key ON points(config_key, profile_key);
"""


# columns added since schema 1: (table, column, type); added to an older study.db when opened
_ADDED_COLUMNS = (("runs", "engine_seconds", "REAL"), ("runs", "accelerators", "INTEGER"),
                  ("measurements", "extra", "TEXT"), ("sessions", "pid", "INTEGER"))


@dataclass
class ProfileMeasurement(MeasurementExtras):
    """One profile's benchmark inside a run: made by the executor, stored as a
    ``measurements`` row and ``measurement-<profile>.json`` (typed until then).

    ``metrics`` is the mean of ``repeats`` for numeric keys; the extras beside it (repeats,
    noise, load points, capacity, what stopped it early, what was observed) are
    :class:`perflab.lab.measured.MeasurementExtras`', kept as :data:`EXTRA_FIELDS`."""

    status: Status  # ok | stopped-early | crashed | failed | stalled | unsupported (the workload does not fit)
    # the benchmark's; the accuracy measurement (perflab.lab.accuracy.ACCURACY_PROFILE) keeps its
    # record here too, every key of it in ``extra`` (read by key, stored as it came)
    metrics: BenchMetrics | None = None
    num_prompts: int | None = None
    error: str | None = None
    cause: CrashCause | None = None

    def __post_init__(self) -> None:
        self.metrics = read_metrics(self.metrics)


@dataclass
class RunRecord:
    """How one launch of a configuration ended, with its measurements: made by the executor,
    stored as a ``runs`` row and ``run.json`` by :meth:`Store.finish_run` (typed until then)."""

    state: Status  # done | unsupported | crashed | timeout | failed | stalled | interrupted
    measurements: dict[str, ProfileMeasurement] = field(default_factory=dict)  # by profile name
    version: str | None = None
    script: str | None = None
    reasons: tuple[Unsupported, ...] = ()
    cause: CrashCause | None = None
    error: str | None = None
    log: str | None = None  # path of the (first) engine log
    leftovers: list[str] = field(default_factory=list)  # what teardown left behind (stops the study)
    # accelerators x (teardown - launch) in the engine's time (simulated time on the simulator:
    # wall x time scale); 0 when nothing was launched
    engine_seconds: float = 0.0
    accelerators: int = 1


def slug(text: str, limit: int = 40) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()
    return s[:limit].strip("-") or "run"


# a name that is its own file stem: lower case (one file per name on case-insensitive disks
# too), no '.' (no '..', no hidden file), and not ending like a derived stem (-<12 hex>)
_OWN_STEM = re.compile(r"(?![a-z0-9_-]*-[0-9a-f]{12}$)[a-z0-9][a-z0-9_-]{0,59}")


def file_stem(name: str) -> str:
    """The part of a file name that stands for a user's name (a profile's: ``bench-<stem>.json``).

    Names may hold any text ('a/b', '..', 'Short Prompt'); the stem is always a safe file name,
    one per name: a plain name (``sharegpt``, ``short_prompt``) is its own stem, any other is a
    readable slug and 12 hex digits of the name's SHA-256, so 'a/b', 'a b' and 'A-B' never share
    a file."""
    if _OWN_STEM.fullmatch(name):
        return name
    return f"{slug(name, 40)}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


RUN_FILE = "run.json"


def _measurement_file(profile: str) -> str:
    return f"measurement-{file_stem(profile)}.json"


def _point_file(profile: str, point: str) -> str:
    return f"point-{slug(profile, 60)}-{slug(point, 60)}.json"


def _measurement_json(m: ProfileMeasurement) -> dict[str, Any]:
    """A measurement as a point's row and file keep it (a curve's point: measured, no cause)."""
    return {"status": str(m.status), "metrics": metrics_json(m.metrics), "num_prompts": m.num_prompts, "error": m.error,
            **to_jsonable(m.extra())}


def _measurement_from_json(data: dict[str, Any]) -> ProfileMeasurement:
    return ProfileMeasurement(Status(data["status"]), metrics=data.get("metrics"), num_prompts=data.get("num_prompts"),
                              error=data.get("error"),
                              **{k: data[k] for k in EXTRA_FIELDS if data.get(k) is not None})


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


class Store:
    """The SQLite index of one study directory."""

    def __init__(self, directory: Path, *, readonly: bool = False) -> None:
        from perflab.lab.store.integrity import storage_fault

        self.dir = Path(directory)
        self.session_id: int | None = None
        self.readonly = readonly
        try:
            if not readonly:
                self.dir.mkdir(parents=True, exist_ok=True)
                (self.dir / "runs").mkdir(exist_ok=True)
            self.db = sqlite3.connect(self.dir / DB_NAME, isolation_level=None, timeout=30)
            self.db.row_factory = sqlite3.Row
            if readonly:
                self.db.execute("SELECT COUNT(*) FROM runs").fetchone()  # a corrupt file fails here
            else:
                self.db.executescript(_SCHEMA)
                _add_columns(self.db)
                if self.get_meta("schema_version") is None:
                    self.set_meta("schema_version", SCHEMA_VERSION)
                dirs = run_dirs(self.dir)
                if (not self.db.execute("SELECT 1 FROM runs LIMIT 1").fetchone()
                        and any((d / RUN_FILE).is_file() for d in dirs)):
                    # an empty (or new) study.db beside measured runs: index them, never reuse their ids
                    self.db.close()
                    rebuild(self.dir)
                    self.db = sqlite3.connect(self.dir / DB_NAME, isolation_level=None, timeout=30)
                    self.db.row_factory = sqlite3.Row
                elif dirs:  # new runs never land in an existing run directory
                    _raise_sequence(self.db, max(int(d.name.split("-", 1)[0]) for d in dirs))
        except (OSError, sqlite3.DatabaseError) as exc:
            fault = storage_fault(exc, self.dir)
            if fault is None:
                raise
            raise fault from None

    @classmethod
    def open_existing(cls, directory: Path) -> Store:
        """Open a study to read it (``perflab report``: no lock, no schema writes)."""
        from perflab.contract.errors import UsageError

        if not (Path(directory) / DB_NAME).is_file():
            if run_dirs(Path(directory)):
                raise UsageError(f"{directory}: {DB_NAME} is missing; recreate it from the run directories with "
                                 f"`perflab report --rebuild {directory}`")
            raise UsageError(f"{directory}: not a study directory (no {DB_NAME}); expected the --out of a `perflab run`")
        return cls(directory, readonly=True)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ meta

    def set_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(redact.redact_obj(value))))
        # the mirror in study.json lets `perflab report --rebuild` recreate the meta
        meta = {r["key"]: json.loads(r["value"]) for r in self.db.execute("SELECT key, value FROM meta")}
        write_json(self.dir / META_FILE, meta)

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row["value"]) if row else default

    # ------------------------------------------------------------------ sessions

    def begin_session(self, argv: list[str] | None = None) -> int:
        import os

        # runs left "running" by a session that was killed outright (SIGKILL, a power cut: the
        # study lock this caller holds says that process is gone) did not finish: interrupted,
        # with the reason — never a result, never reused
        left = self.db.execute("SELECT r.id, s.pid FROM runs r LEFT JOIN sessions s ON s.id = r.session_id"
                               " WHERE r.state = ?", (Status.RUNNING,)).fetchall()
        for row in left:
            self.mark_interrupted(row["id"], killed_reason(row["pid"]))
        cur = self.db.execute(
            "INSERT INTO sessions(started, state, argv, pid) VALUES (?, 'running', ?, ?)",
            (time.time(), json.dumps(redact.redact_obj(argv or [])), os.getpid()),
        )
        self.session_id = int(cur.lastrowid or 0)
        return self.session_id

    def end_session(self, state: str) -> None:
        if self.session_id is not None:
            self.db.execute("UPDATE sessions SET state = ?, finished = ? WHERE id = ?", (state, time.time(), self.session_id))

    # ------------------------------------------------------------------ runs

    def begin_run(self, config_key: str, engine: str, config: dict[str, Any], step: str, label: str,
                  profiles: list[str]) -> tuple[int, Path]:
        assert self.session_id is not None, "begin_session() first"
        cur = self.db.execute(
            "INSERT INTO runs(session_id, config_key, engine, config, step, label, profiles, state, dir, started)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, '', ?)",
            (self.session_id, config_key, engine, json.dumps(redact.redact_obj(config)), redact.scrub(step), redact.scrub(label),
             json.dumps(profiles), Status.RUNNING, time.time()),
        )
        run_id = int(cur.lastrowid or 0)
        rel = Path("runs") / f"{run_id:03d}-{slug(label)}"
        (self.dir / rel).mkdir(parents=True, exist_ok=False)  # never over an existing run
        self.db.execute("UPDATE runs SET dir = ? WHERE id = ?", (str(rel), run_id))
        self._write_run_file(run_id)
        return run_id, self.dir / rel

    def _write_run_file(self, run_id: int) -> None:
        """The run's row, as run.json in its directory (what --rebuild reads)."""
        row = self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        data = {k: row[k] for k in row.keys()}  # noqa: SIM118 - a sqlite3.Row iterates its values
        for k in ("config", "profiles", "reasons", "cause"):
            data[k] = _loads(data[k])
        write_json(self.dir / row["dir"] / RUN_FILE, data)

    def _transaction(self) -> Any:
        """BEGIN ... COMMIT, or ROLLBACK if the body (the file write) fails."""
        import contextlib

        @contextlib.contextmanager
        def tx() -> Any:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

        return tx()

    def add_measurement(self, run_id: int, config_key: str, profile_key: str, profile: str, m: ProfileMeasurement) -> None:
        """Store one measurement: its file in the run directory and its row, together (the row
        commits only once the file is written)."""
        created = time.time()
        run_dir = self.db.execute("SELECT dir FROM runs WHERE id = ?", (run_id,)).fetchone()["dir"]
        with self._transaction():
            self.db.execute(
                "INSERT INTO measurements(run_id, config_key, profile_key, profile, status, metrics, num_prompts, error, cause,"
                " created, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, config_key, profile_key, profile, str(m.status), json.dumps(metrics_json(m.metrics)) if m.metrics is not None else None,
                 m.num_prompts, redact.scrub(m.error or "") or None, _cause_json(m.cause), created,
                 json.dumps(m.extra(), default=str)),
            )
            write_json(self.dir / run_dir / _measurement_file(profile), {
                "run_id": run_id, "config_key": config_key, "profile_key": profile_key, "profile": profile,
                "status": str(m.status), "metrics": metrics_json(m.metrics), "num_prompts": m.num_prompts, "error": m.error,
                "cause": to_jsonable(m.cause), "created": created, **m.extra(),
            })

    def add_point(self, run_id: int, config_key: str, profile_key: str, profile: str, point: str,
                  m: ProfileMeasurement) -> None:
        """Store one measured load point of a curve (a sweep's, a max-load search's probe) as
        soon as it exists: its file in the run directory and its row, together. A curve is
        one profile's measurement, stored when the curve ends; its finished points are what
        a resume keeps of a curve that was interrupted (:meth:`points`)."""
        created = time.time()
        data = _measurement_json(m)
        run_dir = self.db.execute("SELECT dir FROM runs WHERE id = ?", (run_id,)).fetchone()["dir"]
        with self._transaction():
            self.db.execute("INSERT INTO points(run_id, config_key, profile_key, point, data, created)"
                            " VALUES (?, ?, ?, ?, ?, ?)",
                            (run_id, config_key, profile_key, point, json.dumps(redact.redact_obj(data), default=str),
                             created))
            write_json(self.dir / run_dir / _point_file(profile, point), {
                "run_id": run_id, "config_key": config_key, "profile_key": profile_key, "profile": profile,
                "point": point, "created": created, **data})

    def points(self, config_key: str, profile_key: str, *, stopped: bool = True) -> dict[str, ProfileMeasurement]:
        """The measured load points, by point, that interrupted runs of (configuration,
        profile) finished before their curve ended (Ctrl-C, a kill, a lost node, an
        environment fault): a resumed curve measures only the others. The newest of each
        point counts; ``stopped=False`` leaves out points that were stopped early."""
        out: dict[str, ProfileMeasurement] = {}
        for row in self.db.execute(
                "SELECT p.point, p.data FROM points p JOIN runs r ON r.id = p.run_id WHERE p.config_key = ?"
                " AND p.profile_key = ? AND r.state = ? ORDER BY p.id DESC", (config_key, profile_key, Status.INTERRUPTED)):
            m = _measurement_from_json(json.loads(row["data"]))
            if row["point"] in out or not m.status.measured or (m.status is Status.STOPPED_EARLY and not stopped):
                continue
            out[row["point"]] = m
        return out

    def finish_run(self, run_id: int, rec: RunRecord) -> None:
        log = rec.log
        if log is not None:
            try:
                log = str(Path(log).resolve().relative_to(self.dir.resolve()))
            except ValueError:
                pass
        with self._transaction():
            self.db.execute(
                "UPDATE runs SET state = ?, finished = ?, version = ?, script = ?, reasons = ?, cause = ?, error = ?, log = ?,"
                " engine_seconds = ?, accelerators = ? WHERE id = ?",
                (str(rec.state), time.time(), rec.version, redact.scrub(rec.script or "") or None,
                 json.dumps(redact.redact_obj(to_jsonable(rec.reasons))), _cause_json(rec.cause),
                 redact.scrub(rec.error or "") or None, log, rec.engine_seconds, rec.accelerators, run_id),
            )
            self._write_run_file(run_id)

    def mark_interrupted(self, run_id: int, reason: str | None = None) -> None:
        """The run did not produce a result (Ctrl-C, the environment, perflab itself): it is
        never reused; ``reason`` says why."""
        self.db.execute("UPDATE runs SET state = ?, finished = ?, error = COALESCE(?, error) WHERE id = ? AND state = ?",
                        (Status.INTERRUPTED, time.time(), reason, run_id, Status.RUNNING))
        row = self.db.execute("SELECT dir FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is not None and row["dir"] and (self.dir / row["dir"]).is_dir():  # killed before its directory existed
            self._write_run_file(run_id)

    def runs(self) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM runs ORDER BY id"))

    def measurements(self) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM measurements ORDER BY id"))

    # ------------------------------------------------------------------ lookups

    def _result_from_run(self, run: sqlite3.Row, status: str) -> ConfigResult:
        return ConfigResult(
            status=Status(status),
            reasons=_loads(run["reasons"]) or [],
            cause=_loads(run["cause"]),
            error=run["error"],
            script=run["script"],
            version=run["version"],
            run_id=run["id"],
            run_dir=run["dir"],
            log=run["log"],
            replicas=int((_loads(run["config"]) or {}).get("options", {}).get("replicas", 1)),
        )

    def lookup(self, config_key: str, profile_key: str, *, retry_failed: bool = False) -> ConfigResult | None:
        """The stored result of one (configuration, profile), or None if it must be measured.

        A successful measurement and a refusal always count. The failures that
        :attr:`Status.retried` names (crashes, timeouts, stalls, failed benchmarks) count
        unless ``retry_failed`` — then only those of the current session do, so a
        configuration is retried once per invocation, not once per step. A preflight refusal
        counts for every profile.
        """

        def counts(status: str, session_id: int) -> bool:
            return not (retry_failed and Status(status).retried) or session_id == self.session_id

        row = self.db.execute(
            "SELECT m.*, r.session_id AS session_id FROM measurements m JOIN runs r ON r.id = m.run_id"
            " WHERE m.config_key = ? AND m.profile_key = ? ORDER BY (m.status = 'ok') DESC, m.id DESC",
            (config_key, profile_key),
        ).fetchall()
        for m in row:
            if not counts(m["status"], m["session_id"]):
                continue
            run = self.db.execute("SELECT * FROM runs WHERE id = ?", (m["run_id"],)).fetchone()
            res = self._result_from_run(run, m["status"])
            res.reused = m["session_id"] != self.session_id
            res.metrics = read_metrics(_loads(m["metrics"]))
            res.num_prompts = m["num_prompts"]
            for k, v in (_loads(m["extra"] if "extra" in m.keys() else None) or {}).items():  # noqa: SIM118 - a Row's keys
                if k in EXTRA_FIELDS and v is not None:
                    setattr(res, k, v)
            if res.status.measured:  # ok or stopped early
                res.error = m["error"]  # the failed requests' reasons, when some failed
            elif res.status is Status.UNSUPPORTED:  # refused for this profile only (its workload does not fit)
                res.error = m["error"]
                res.reasons = [{"what": m["profile"], "why": m["error"], "source": "perflab", "severity": "error"}]
            else:
                res.error = m["error"] or res.error
                res.cause = _loads(m["cause"]) or res.cause
            return res
        # a run that ended before measuring anything decides every profile
        startup = Status.startup_failures()
        for run in self.db.execute(
            f"SELECT * FROM runs WHERE config_key = ? AND state IN ({', '.join('?' * len(startup))}) ORDER BY id DESC",
            (config_key, *startup),
        ):
            measured = self.db.execute("SELECT COUNT(*) FROM measurements WHERE run_id = ?", (run["id"],)).fetchone()[0]
            if measured:
                continue  # it died mid-benchmark: the measurements above say which profile
            if not counts(run["state"], run["session_id"]):
                continue
            res = self._result_from_run(run, run["state"])
            res.reused = run["session_id"] != self.session_id
            return res
        return None


    def run_engine_hours(self, run_id: int) -> float | None:
        """One run's engine-hours (None: a run from before engine-hours, or none recorded)."""
        if "engine_seconds" not in {r[1] for r in self.db.execute("PRAGMA table_info(runs)")}:
            return None
        row = self.db.execute("SELECT engine_seconds FROM runs WHERE id = ?", (run_id,)).fetchone()
        return round(float(row[0]) / 3600, 6) if row is not None and row[0] is not None else None

    def engine_hours(self) -> dict[str, float]:
        """Engine-hours of the study: ``spent`` (every run's accelerators × launch→teardown,
        engine time), ``full_method_estimate`` (spent, plus what each stopped-early
        measurement would have taken to its full num_prompts: its run's accelerators ×
        (estimated full − elapsed) engine seconds) and ``saved_pct``."""
        if "engine_seconds" not in {r[1] for r in self.db.execute("PRAGMA table_info(runs)")}:
            return {"spent": 0.0, "full_method_estimate": 0.0, "saved_pct": 0.0}  # a study from before engine-hours
        spent = float(self.db.execute("SELECT COALESCE(SUM(engine_seconds), 0) FROM runs").fetchone()[0])
        more = 0.0
        for row in self.db.execute("SELECT m.extra, r.accelerators FROM measurements m JOIN runs r ON r.id = m.run_id"
                                   " WHERE m.status = ?", (str(Status.STOPPED_EARLY),)):
            stopped = (_loads(row["extra"]) or {}).get("stopped_early") or {}
            gap = float(stopped.get("estimated_full_s") or 0.0) - float(stopped.get("elapsed_s") or 0.0)
            more += max(0.0, gap) * int(row["accelerators"] or 1)
        full = spent + more
        return {"spent": round(spent / 3600, 4), "full_method_estimate": round(full / 3600, 4),
                "saved_pct": round((full - spent) / full * 100, 1) if full > 0 else 0.0}


def killed_reason(pid: int | None) -> str:
    """Why a run found ``running`` by a later invocation is interrupted: its perflab was
    killed outright (nothing else leaves a run ``running``: every other end records one)."""
    who = f"perflab (pid {pid})" if pid else "perflab"
    return f"{who} was killed while this run was going (no result; it is measured again on resume)"


def _add_columns(db: sqlite3.Connection) -> None:
    """Add the columns an older study.db lacks (``_ADDED_COLUMNS``)."""
    for table, column, kind in _ADDED_COLUMNS:
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _cause_json(cause: CrashCause | None) -> str | None:
    """A CrashCause as the database keeps it (secrets as ***)."""
    return json.dumps(redact.redact_obj(to_jsonable(cause))) if cause is not None else None


def write_json(path: Path, value: Any) -> None:
    """Write JSON atomically (:func:`write_atomic`); secrets as ***."""
    write_atomic(path, (json.dumps(redact.redact_obj(value), indent=2, default=str) + "\n").encode("utf-8"))


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write ``path`` atomically (a kill or a full disk mid-write leaves the old file or none,
    never half): a hidden temp file beside it, fsync, rename. If anything fails the temp file
    is removed and the ``OSError`` names ``path`` itself (a write error on an open file
    carries no file name of its own)."""
    import os

    if isinstance(data, str):
        data = data.encode("utf-8")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    return path


def run_dirs(directory: Path) -> list[Path]:
    """The run directories of a study (``runs/NNN-label``)."""
    runs = Path(directory) / "runs"
    if not runs.is_dir():
        return []
    return sorted(d for d in runs.iterdir() if d.is_dir() and re.match(r"\d+-", d.name))


def _raise_sequence(db: sqlite3.Connection, at_least: int) -> None:
    """Make the next run id larger than ``at_least`` (and than every indexed run)."""
    current = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'runs'").fetchone()
    top = max(at_least, db.execute("SELECT COALESCE(MAX(id), 0) FROM runs").fetchone()[0])
    if current is not None and int(current[0]) >= top:
        return
    db.execute("DELETE FROM sqlite_sequence WHERE name = 'runs'")
    db.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('runs', ?)", (top,))


def rebuild(directory: Path) -> dict[str, int]:
    """Recreate ``study.db`` from the run directories (the source of truth).

    A corrupt database is kept beside as ``study.db.corrupt-<time>``; runs still "running"
    (their process is gone: the caller holds the study lock) become interrupted. Returns the
    counts of runs and measurements indexed.
    """
    from perflab.contract.errors import UsageError

    directory = Path(directory)
    meta_path = directory / META_FILE
    dirs = run_dirs(directory)
    if not meta_path.is_file() and not dirs:
        raise UsageError(f"{directory}: nothing to rebuild from (no {META_FILE}, no run directories)")
    db_path = directory / DB_NAME
    if db_path.exists():
        db_path.replace(directory / f"{DB_NAME}.corrupt-{int(time.time())}")
    for extra in ("-wal", "-shm", "-journal"):
        side = directory / f"{DB_NAME}{extra}"
        if side.exists():
            side.unlink()
    db = sqlite3.connect(db_path, isolation_level=None)
    db.executescript(_SCHEMA)
    runs = measurements = 0
    try:
        db.execute("BEGIN")
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        meta.setdefault("schema_version", SCHEMA_VERSION)
        for k, v in meta.items():
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (k, json.dumps(v)))
        sessions: set[int] = set()
        for d in dirs:
            try:
                run = json.loads((d / RUN_FILE).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # a run directory from before run.json, or a half-created one
            state = Status(run.get("state") or Status.INTERRUPTED)
            if state is Status.RUNNING:  # its perflab was killed outright: the run has no result
                state = Status.INTERRUPTED
                run["error"] = run.get("error") or killed_reason(None)
            sid = int(run.get("session_id") or 0)
            if sid not in sessions:
                sessions.add(sid)
                db.execute("INSERT INTO sessions(id, started, finished, state, argv) VALUES (?, ?, ?, 'done', '[]')",
                           (sid, run.get("started") or 0.0, run.get("finished")))
            db.execute(
                "INSERT INTO runs(id, session_id, config_key, engine, config, step, label, profiles, state, dir, started,"
                " finished, version, script, reasons, cause, error, log, engine_seconds, accelerators)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run["id"], sid, run["config_key"], run["engine"], json.dumps(run.get("config")), run.get("step"),
                 run.get("label"), json.dumps(run.get("profiles") or []), state, str(d.relative_to(directory)),
                 run.get("started") or 0.0, run.get("finished"), run.get("version"), run.get("script"),
                 json.dumps(run.get("reasons") or []), json.dumps(run["cause"]) if run.get("cause") else None,
                 run.get("error"), run.get("log"), run.get("engine_seconds"), run.get("accelerators")),
            )
            runs += 1
            for f in sorted(d.glob("measurement-*.json"), key=lambda f: f.stat().st_mtime):
                try:
                    m = json.loads(f.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                db.execute(
                    "INSERT INTO measurements(run_id, config_key, profile_key, profile, status, metrics, num_prompts,"
                    " error, cause, created, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run["id"], m["config_key"], m["profile_key"], m["profile"], m["status"],
                     json.dumps(m["metrics"]) if m.get("metrics") is not None else None, m.get("num_prompts"),
                     m.get("error"), json.dumps(m["cause"]) if m.get("cause") else None, m.get("created") or 0.0,
                     json.dumps({k: m.get(k) for k in EXTRA_FIELDS})),
                )
                measurements += 1
            for f in sorted(d.glob("point-*.json"), key=lambda f: f.stat().st_mtime):
                try:
                    pt = json.loads(f.read_text(encoding="utf-8"))
                    data = {k: pt.get(k) for k in ("status", "metrics", "num_prompts", "error", *EXTRA_FIELDS)}
                    db.execute("INSERT INTO points(run_id, config_key, profile_key, point, data, created)"
                               " VALUES (?, ?, ?, ?, ?, ?)", (run["id"], pt["config_key"], pt["profile_key"], pt["point"],
                                                              json.dumps(data), pt.get("created") or 0.0))
                except (OSError, ValueError, KeyError):
                    continue
        if dirs:  # new runs get ids after every existing directory's, even unindexed ones
            _raise_sequence(db, max(int(d.name.split("-", 1)[0]) for d in dirs))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    finally:
        db.close()
    return {"runs": runs, "measurements": measurements}
