"""Load PyTorch profiler (Kineto) traces into compact columns, one rank at a time.

The public face of trace loading: find the rank files of a target, and turn one file into
a ``RankTrace``. The work is split in two modules with one job each: ``trace_decode`` turns
bytes into typed events (msgspec, batched, salvaging torch's invalid JSON) and
``trace_columns`` folds those events into numpy columns. Peak memory is the raw bytes of one
rank plus its kept events.

The only exception that leaves this module is ``gpudiag.errors.TraceError``.
"""

from __future__ import annotations

from pathlib import Path

from gpudiag.analyzers.trace_columns import (
    COMM_KERNEL_RE,
    DATALOADER_PREFIX,
    DATALOADER_SUFFIX,
    KCLASS_COMM,
    KCLASS_COMPUTE,
    KCLASS_MEMORY,
    KCLASS_OTHER,
    MEMORY_KERNEL_RE,
    OTHER_KERNEL_RE,
    STEP_RE,
    RankTrace,
    fold_events,
)
from gpudiag.analyzers.trace_decode import DECODE_BATCH, decode_trace, read_trace_bytes
from gpudiag.errors import TraceError
from gpudiag.rundir import is_run_dir

__all__ = [
    "COMM_KERNEL_RE", "DATALOADER_PREFIX", "DATALOADER_SUFFIX", "DECODE_BATCH", "KCLASS_COMM",
    "KCLASS_COMPUTE", "KCLASS_MEMORY", "KCLASS_OTHER", "MEMORY_KERNEL_RE", "OTHER_KERNEL_RE",
    "STEP_RE", "TRACE_SUFFIXES", "RankTrace", "TraceError", "check_unique_ranks",
    "decode_trace", "find_trace_files", "load_rank", "read_trace_bytes",
]


def load_rank(path: Path, rank_hint: int | None = None) -> RankTrace:
    """Read one rank file into columns. Raises TraceError on anything unusable."""
    data = read_trace_bytes(path)
    events, props, dist = decode_trace(data, str(path))
    del data
    return fold_events(events, props, dist, str(path), rank_hint)


# --- finding rank files ------------------------------------------------------------------

TRACE_SUFFIXES = (".json", ".json.gz")


def find_trace_files(target: Path) -> list[Path]:
    """Trace files for a file, a folder of rank files, or a gpudiag run directory."""
    if not target.exists():
        raise TraceError(f"{target}: no such file or directory")
    if target.is_file():
        return [target]
    if is_run_dir(target):
        target = target / "traces"
    files = sorted(p for p in target.iterdir()
                   if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                   and p.name not in ("run.json", "diagnosis.json"))
    if not files:
        raise TraceError(f"{target}: no trace files (*.json, *.json.gz) in this folder")
    return files


def check_unique_ranks(ranks: list[tuple[int, str]]) -> None:
    seen: dict[int, str] = {}
    for rank, path in ranks:
        if rank in seen:
            raise TraceError(
                f"two files claim rank {rank}: {seen[rank]} and {path}; "
                "keep one trace per rank in the folder"
            )
        seen[rank] = path
