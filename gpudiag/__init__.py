"""gpudiag: GPU performance diagnostics for ML training jobs."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "step"]


def step() -> None:
    """Mark the end of a training step, for loops without an optimizer.

    Under ``gpudiag profile`` this advances step timing and the profiler window (and from
    then on the optimizer hook stops counting, so steps are never counted twice). Anywhere
    else it does nothing, so it can stay in the code.
    """
    import sys

    boot = sys.modules.get("gpudiag.collectors.torch_bootstrap")
    if boot is not None:
        boot.step()
