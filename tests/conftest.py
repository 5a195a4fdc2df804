"""Shared pytest configuration for perflab's own tests."""

from __future__ import annotations

import pytest

# Out-of-tree example plugins carry their own test suites, run against the *installed*
# plugin by tests/plugin_kit; they are not collected as part of perflab's suite.
collect_ignore_glob = ["external_plugins/*"]

#: The files that take longest (seconds on the 2-core CI machine, measured), run first. xdist
#: hands whole files to its workers in collection order (``--dist loadfile
#: --no-loadscope-reorder`` in pyproject.toml); longest first leaves only short files for the
#: end, so neither worker idles while the other finishes a long one. (xdist's own order, most
#: tests first, put the real-engine lane's few long tests last: the run's critical path.)
LONGEST_FIRST = (
    "tests/real/test_real_vllm.py",  # ~340 s, and the first real test provisions vLLM (~110 s)
    "tests/lab/test_demo_stored.py",  # ~180 s
    "tests/real/test_accuracy_real.py",  # ~250 s
    "tests/real/test_real_vllm_faults.py",  # ~220 s
    "tests/lab/test_lab_ray.py",  # ~215 s
    "tests/lab/test_lab_slo_example.py",  # ~140 s
    "tests/lab/test_lab_parallel.py",  # ~135 s
    "tests/lab/test_lab_e2e.py",  # ~75 s
    "tests/lab/test_accuracy_gate.py",  # ~60 s
    "tests/lab/test_lab_early_stop.py",  # ~60 s
    "tests/lab/test_lab_resume.py",  # ~60 s
    "tests/sim/test_reproducible.py",  # ~55 s
    "tests/real/test_real_server_metrics.py",  # ~50 s
)


@pytest.hookimpl(trylast=True)  # after the directories' own hooks (tests/real marks its tests)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # a stable sort: every file's tests keep their order, the other files theirs
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
