"""The study directory: a SQLite index over one directory per run.

Layout of a study directory::

    study.db            runs and measurements (this module)
    plan.yaml           the plan as given (or plan.toml)
    hardware.json       the probed hardware snapshot
    study.log           the structured log (JSON lines)
    runs/007-vllm-fp8/  launch.json, engine.log, hardware.json, bench-<profile>.json, outcome.json
    report.md, report.json, chart.png
    sim-state/          the simulated machine's memory registry (simulated studies)

A *run* is one launch of a configuration (all its replicas), benchmarked on one or more
profiles; a *measurement* is one (configuration, profile) result of a run. Lookups go by the
configuration's key and the profile's key, so re-running a plan reuses every measurement
whose configuration and workload are unchanged — that is how a study resumes.

Every write commits at once: a study killed at any moment keeps what it measured.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab.lab.study import CRASHED, FAILED, OK, TIMEOUT, UNSUPPORTED, Result

SCHEMA_VERSION = 1
DB_NAME = "study.db"

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
    argv     TEXT
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
    log         TEXT             -- relative path of the (first) engine log
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
    created     REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS measurements_by_key ON measurements(config_key, profile_key);
"""

# run states that end a configuration whatever the profile (nothing was measured)
_STARTUP_STATES = (UNSUPPORTED, CRASHED, TIMEOUT, FAILED)


@dataclass
class ProfileMeasurement:
    """One profile's outcome inside a run, as the executor reports it."""

    status: str  # ok | crashed | failed
    metrics: dict[str, Any] | None = None
    num_prompts: int | None = None
    error: str | None = None
    cause: dict[str, Any] | None = None


@dataclass
class RunRecord:
    """How a run ended, as the executor reports it."""

    state: str  # done | unsupported | crashed | timeout | failed | interrupted
    measurements: dict[str, ProfileMeasurement] = field(default_factory=dict)  # by profile name
    version: str | None = None
    script: str | None = None
    reasons: list[dict[str, Any]] = field(default_factory=list)
    cause: dict[str, Any] | None = None
    error: str | None = None
    log: str | None = None  # path of the (first) engine log


def slug(text: str, limit: int = 40) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()
    return s[:limit].strip("-") or "run"


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


class Store:
    """The SQLite index of one study directory."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "runs").mkdir(exist_ok=True)
        self.db = sqlite3.connect(self.dir / DB_NAME, isolation_level=None, timeout=30)
        self.db.row_factory = sqlite3.Row
        self.db.executescript(_SCHEMA)
        if self.get_meta("schema_version") is None:
            self.set_meta("schema_version", SCHEMA_VERSION)
        self.session_id: int | None = None

    @classmethod
    def open_existing(cls, directory: Path) -> Store:
        from perflab.errors import UsageError

        if not (Path(directory) / DB_NAME).is_file():
            raise UsageError(f"{directory}: not a study directory (no {DB_NAME}); expected the --out of a `perflab run`")
        return cls(directory)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ meta

    def set_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row["value"]) if row else default

    # ------------------------------------------------------------------ sessions

    def begin_session(self, argv: list[str] | None = None) -> int:
        cur = self.db.execute(
            "INSERT INTO sessions(started, state, argv) VALUES (?, 'running', ?)", (time.time(), json.dumps(argv or []))
        )
        self.session_id = int(cur.lastrowid or 0)
        # runs left "running" by a session that was killed outright did not finish
        self.db.execute("UPDATE runs SET state = 'interrupted' WHERE state = 'running'")
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
            " VALUES (?, ?, ?, ?, ?, ?, ?, 'running', '', ?)",
            (self.session_id, config_key, engine, json.dumps(config), step, label, json.dumps(profiles), time.time()),
        )
        run_id = int(cur.lastrowid or 0)
        rel = Path("runs") / f"{run_id:03d}-{slug(label)}"
        (self.dir / rel).mkdir(parents=True, exist_ok=True)
        self.db.execute("UPDATE runs SET dir = ? WHERE id = ?", (str(rel), run_id))
        return run_id, self.dir / rel

    def add_measurement(self, run_id: int, config_key: str, profile_key: str, profile: str, m: ProfileMeasurement) -> None:
        self.db.execute(
            "INSERT INTO measurements(run_id, config_key, profile_key, profile, status, metrics, num_prompts, error, cause, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, config_key, profile_key, profile, m.status, json.dumps(m.metrics) if m.metrics is not None else None,
             m.num_prompts, m.error, json.dumps(m.cause) if m.cause else None, time.time()),
        )

    def finish_run(self, run_id: int, rec: RunRecord) -> None:
        log = rec.log
        if log is not None:
            try:
                log = str(Path(log).resolve().relative_to(self.dir.resolve()))
            except ValueError:
                pass
        self.db.execute(
            "UPDATE runs SET state = ?, finished = ?, version = ?, script = ?, reasons = ?, cause = ?, error = ?, log = ?"
            " WHERE id = ?",
            (rec.state, time.time(), rec.version, rec.script, json.dumps(rec.reasons), json.dumps(rec.cause) if rec.cause else None,
             rec.error, log, run_id),
        )

    def mark_interrupted(self, run_id: int) -> None:
        self.db.execute("UPDATE runs SET state = 'interrupted', finished = ? WHERE id = ? AND state = 'running'",
                        (time.time(), run_id))

    def runs(self) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM runs ORDER BY id"))

    def measurements(self) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM measurements ORDER BY id"))

    # ------------------------------------------------------------------ lookups

    def _result_from_run(self, run: sqlite3.Row, status: str) -> Result:
        return Result(
            status=status,
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

    def lookup(self, config_key: str, profile_key: str, *, retry_failed: bool = False) -> Result | None:
        """The stored result of one (configuration, profile), or None if it must be measured.

        A successful measurement always counts. Failures (crashes, timeouts, failed
        benchmarks) count unless ``retry_failed`` — then only those of the current session do,
        so a configuration is retried once per invocation, not once per step. A preflight
        refusal counts for every profile.
        """
        this_session = self.session_id if retry_failed else None

        def failure_counts(session_id: int) -> bool:
            return not retry_failed or session_id == this_session

        row = self.db.execute(
            "SELECT m.*, r.session_id AS session_id FROM measurements m JOIN runs r ON r.id = m.run_id"
            " WHERE m.config_key = ? AND m.profile_key = ? ORDER BY (m.status = 'ok') DESC, m.id DESC",
            (config_key, profile_key),
        ).fetchall()
        for m in row:
            if m["status"] != OK and not failure_counts(m["session_id"]):
                continue
            run = self.db.execute("SELECT * FROM runs WHERE id = ?", (m["run_id"],)).fetchone()
            res = self._result_from_run(run, m["status"])
            res.reused = m["session_id"] != self.session_id
            res.metrics = _loads(m["metrics"])
            res.num_prompts = m["num_prompts"]
            if m["status"] != OK:
                res.error = m["error"] or res.error
                res.cause = _loads(m["cause"]) or res.cause
            return res
        # a run that ended before measuring anything decides every profile
        for run in self.db.execute(
            "SELECT * FROM runs WHERE config_key = ? AND state IN (?, ?, ?, ?) ORDER BY id DESC",
            (config_key, *_STARTUP_STATES),
        ):
            measured = self.db.execute("SELECT COUNT(*) FROM measurements WHERE run_id = ?", (run["id"],)).fetchone()[0]
            if measured:
                continue  # it died mid-benchmark: the measurements above say which profile
            if run["state"] != UNSUPPORTED and not failure_counts(run["session_id"]):
                continue
            res = self._result_from_run(run, run["state"])
            res.reused = run["session_id"] != self.session_id
            return res
        return None

    def finished_count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM runs WHERE state NOT IN ('running', 'interrupted')").fetchone()[0])


def write_json(path: Path, value: Any) -> None:
    """Write JSON atomically (a kill mid-write leaves the old file or none, never half)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
