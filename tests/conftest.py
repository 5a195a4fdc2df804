"""Shared pytest configuration for perflab's own tests."""

from __future__ import annotations

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
    "tests/real/test_real_transformers.py",  # 230 s alone on 2 busy cores (its two-engine study 120 s), +7 s cold layer
    "tests/lab/test_lab_integrity.py",  # 185 s
    "tests/sim/test_reproducible.py",  # 130 s
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
