"""Shared test fixtures: real traces live in ../shared/traces beside the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"

# Every folder of ../shared/traces whose trace has GPU kernels (negative/ has none).
GPU_TRACE_DIRS = sorted(
    p.name for p in TRACES.iterdir() if p.is_dir() and p.name != "negative"
) if TRACES.is_dir() else []


@pytest.fixture(scope="session")
def traces() -> Path:
    if not TRACES.is_dir():
        pytest.fail(f"test data missing: {TRACES} (CI lays ../shared beside the repository)")
    return TRACES


@pytest.fixture(autouse=True, scope="session")
def _cpu_peak_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the measured-CPU-peak cache out of the home directory."""
    import os

    os.environ.setdefault("GPUDIAG_CACHE_DIR", str(tmp_path_factory.mktemp("gpudiag-cache")))
