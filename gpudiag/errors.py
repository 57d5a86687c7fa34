"""Error types whose message is shown to the user as one line.

Scripts rely on exit codes (DESIGN.md: 0 ok, 1 the job failed, 2 bad input), so every
failure the user can fix by changing their input is a ``BadInput`` and nothing else.
"""

from __future__ import annotations


class GpudiagError(Exception):
    """Base for errors gpudiag reports itself; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class BadInput(GpudiagError):
    """The input (a trace, a run directory, an option) cannot be used as given."""

    exit_code = 2


class TraceError(BadInput):
    """A trace file is unreadable, truncated, or not a PyTorch profiler trace.

    This is the only exception the trace loader lets escape: callers (and the property
    test that feeds it mutated traces) can rely on that.
    """
