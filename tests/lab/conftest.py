"""Fixtures for the lab's tests (helpers live in seedkit.py)."""

from __future__ import annotations

import pytest

from seedkit import SEED_002_PLAN, Key, SeedMeasure, seed_002_key


@pytest.fixture
def seed_measure() -> type[SeedMeasure]:
    return SeedMeasure


@pytest.fixture
def seed_002() -> tuple[str, Key]:
    return SEED_002_PLAN, seed_002_key
