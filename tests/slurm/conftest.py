"""The `slurm` marker and the `slurm_cluster` fixture for tests of the Slurm executor."""

from __future__ import annotations

import pytest

from tests.slurm.cluster import register_marker, slurm_cluster

__all__ = ["slurm_cluster"]


def pytest_configure(config: pytest.Config) -> None:
    register_marker(config)
