"""gpudiag: GPU performance diagnostics for ML training jobs."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
