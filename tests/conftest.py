"""Shared test fixtures: real test data lives in ../shared beside the repository.

``GPUDIAG_SHARED`` names another folder for it. Without that data the run fails at start
(``pytest_configure``), for every selection of tests: a test whose data is missing must not
pass by having nothing to check (an empty parameter list, a fallback input).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_ENV = "GPUDIAG_SHARED"
SHARED = Path(os.environ.get(SHARED_ENV) or REPO.parent / "shared").resolve()
TRACES = SHARED / "traces"

# Every folder of ../shared/traces whose trace has GPU kernels (negative/ has none).
GPU_TRACE_DIRS = sorted(
    p.name for p in TRACES.iterdir() if p.is_dir() and p.name != "negative"
) if TRACES.is_dir() else []


def pytest_configure(config: pytest.Config) -> None:
    if not TRACES.is_dir():
        raise pytest.UsageError(
            f"test data missing: {TRACES} (lay the shared test data at {REPO.parent / 'shared'} "
            f"or name its folder in ${SHARED_ENV})")
    if not GPU_TRACE_DIRS:
        raise pytest.UsageError(f"test data incomplete: no GPU trace folders in {TRACES}")


@pytest.fixture(scope="session")
def traces() -> Path:
    return TRACES


@pytest.fixture(autouse=True, scope="session")
def _cpu_peak_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the measured-CPU-peak cache out of the home directory."""
    os.environ.setdefault("GPUDIAG_CACHE_DIR", str(tmp_path_factory.mktemp("gpudiag-cache")))
