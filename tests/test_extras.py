"""The core installs small; what one feature alone needs is an extra, and the feature says in one
line which extra it lacks (issue 27 item 5).

The real size check is ``benchmarks/bench_install_size.py`` (fresh venvs, site-packages growth);
here, cheaply: the core's declared dependencies name none of the heavy or feature-only packages,
and subprocesses where those packages cannot be imported (``sys.modules[name] = None``, as in
tests/test_core_without_sim.py) stand for an environment without the extras.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the packages a core install must not pull in: charts (matplotlib, and numpy with it), the
#: alternative HTTP stack, the Ray backend, the browser test and the test runner
NOT_IN_THE_CORE = ("matplotlib", "numpy", "aiohttp", "ray", "playwright", "pytest")


def _blocked(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where none of NOT_IN_THE_CORE can be imported."""
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in NOT_IN_THE_CORE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", prelude + code, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_core_depends_on_no_feature_only_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = {_name(r) for r in project["dependencies"]}
    assert not core & set(NOT_IN_THE_CORE), core & set(NOT_IN_THE_CORE)
    extras = project["optional-dependencies"]
    assert {_name(r) for r in extras["charts"]} == {"matplotlib"}
    assert {_name(r) for r in extras["aiohttp"]} == {"aiohttp"}
    # requirements.txt installs both, so the README's demo keeps its charts and CI tests the aiohttp client
    editable = next(line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("-e ."))
    assert {"charts", "aiohttp"} <= set(editable.partition("[")[2].rstrip("]").split(","))


def test_http_stack_aiohttp_without_aiohttp_names_the_extra_in_one_line() -> None:
    """Refused while the request is checked, before anything is sent (the port is closed: a
    request would fail differently)."""
    done = _blocked("from perflab.cli import main\nsys.argv = ['perflab', *sys.argv[1:]]\nmain()\n",
                    "bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--num-prompts", "1",
                    "--http-stack", "aiohttp")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'perflab[aiohttp]'" in lines[0], done.stderr


def test_the_demo_run_and_report_modules_import_without_the_extras() -> None:
    """What `perflab demo`, `run` and `report` load at import time needs none of NOT_IN_THE_CORE
    (matplotlib is imported inside perflab.lab.report.chart's functions only)."""
    done = _blocked(
        "import importlib\n"
        "for m in ('perflab.cli', 'perflab.cli.lab_cmd', 'perflab.lab.demo', 'perflab.lab.run.runner',\n"
        "          'perflab.lab.run.executor', 'perflab.lab.run.backends.local', 'perflab.lab.report.publish',\n"
        "          'perflab.lab.report.html', 'perflab.lab.report.chart', 'perflab.lab.report.stored',\n"
        "          'perflab.bench.runner', 'perflab.bench.client', 'perflab_sim', 'perflab_sim.plugin'):\n"
        "    importlib.import_module(m)\n"
        "from perflab.lab.demo import demo_plan\n"
        "from perflab.plugins import load\n"
        "demo_plan(known_engines=load().engine_names())\n")
    assert done.returncode == 0, done.stderr


def test_a_report_without_matplotlib_is_written_and_names_the_charts_extra(tmp_path: Path) -> None:
    """Seed 002's study (the demo's plan, answered from the seeds' records: no engine runs)
    written by the report writer `perflab run`, `report` and `demo` use, with matplotlib and
    the other extras unimportable: report.md, report.json and report.html are written, and
    one line says what perflab[charts] adds."""
    code = (
        "import anyio\n"
        "from pathlib import Path\n"
        "from seedkit import SEED_002_PLAN, SeedMeasure, seed_002_key\n"
        "from perflab.lab.plan import load_plan_text\n"
        "from perflab.lab.report import ReportContext\n"
        "from perflab.lab.report.publish import write_report\n"
        "from perflab.lab.study import conduct\n"
        "plan = load_plan_text(SEED_002_PLAN)\n"
        "outcome = anyio.run(lambda: conduct(plan, SeedMeasure(seed_002_key)))\n"
        "ctx = ReportContext(display={}, versions={}, hardware={'accelerators': [], 'host': 'h'},\n"
        "                    hardware_spec='sim:a100-80g-x8', simulated=True, time_scale=30.0)\n"
        "paths = write_report(outcome, ctx, Path(sys.argv[1]))\n"
        "print(sorted(paths))\n")
    out = tmp_path / "study"
    out.mkdir()
    done = _blocked(code, str(out), cwd=ROOT / "tests" / "lab")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("report.md", "report.json", "report.html"):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "chart.png").exists()
    lines = [*done.stdout.splitlines(), *done.stderr.splitlines(), *(out / "report.md").read_text().splitlines()]
    said = [line for line in lines if "perflab[charts]" in line]
    assert said, "no line names perflab[charts]:\n" + done.stderr
