"""Fixtures of the launch tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.cluster import running_cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """The real SLURM cluster the SLURM tests submit to, one per test session (tests/slurm/cluster.py)."""
    with running_cluster() as state:
        yield state
