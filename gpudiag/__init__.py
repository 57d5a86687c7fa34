"""gpudiag: GPU performance diagnostics for ML training jobs."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "phase", "step"]


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


class phase:  # noqa: N801 - used as ``with gpudiag.phase("eval"):``, like a function
    """Mark a stretch of the job in which no training step ends (eval, checkpoint, a data
    reshuffle), so that ``gpudiag profile``'s stall watch does not call it a stall::

        with gpudiag.phase("checkpoint"):
            save(model)

    A marked phase has its own, longer limit (30 min from its start, ``analyzers/stall.py``): a
    checkpoint that hangs is still found. Anywhere else it does nothing, so it can stay in the code.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> phase:
        import sys

        watch = sys.modules.get("gpudiag.collectors.stall_watch")
        if watch is not None:
            watch.phase_begin(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        import sys

        watch = sys.modules.get("gpudiag.collectors.stall_watch")
        if watch is not None:
            watch.phase_end()
