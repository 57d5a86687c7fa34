"""Load PyTorch profiler (Kineto) traces into compact columns, one rank at a time.

The public face of trace loading: find the rank files of a target, and turn one file into
a ``RankTrace``. The work is split into modules with one job each: ``trace_stream`` reads the
file (gzip or not) a chunk at a time and cuts its events into batches, ``trace_decode`` is
the typed view msgspec decodes them into (salvaging torch's invalid JSON), ``trace_fold``
folds each batch into numpy columns (``trace_columns``). Peak memory is one batch plus the
columns of the events kept (about 60 bytes per kept event), never the file.

The only exception that leaves this module is ``gpudiag.errors.TraceError``.
"""

from __future__ import annotations

from collections.abc import Callable
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
)
from gpudiag.analyzers.trace_fold import ColumnBuilder
from gpudiag.analyzers.trace_stream import BATCH_BYTES, ByteSource, TraceStream
from gpudiag.errors import TraceError
from gpudiag.rundir import DIAGNOSIS_JSON, RUN_JSON, is_run_dir, traces_dir

__all__ = [
    "BATCH_BYTES", "COMM_KERNEL_RE", "DATALOADER_PREFIX", "DATALOADER_SUFFIX", "KCLASS_COMM",
    "KCLASS_COMPUTE", "KCLASS_MEMORY", "KCLASS_OTHER", "MEMORY_KERNEL_RE", "OTHER_KERNEL_RE",
    "STEP_RE", "TRACE_SUFFIXES", "RankTrace", "TraceError", "check_unique_ranks",
    "find_trace_files", "load_rank", "load_bytes",
]


def load_rank(path: Path, rank_hint: int | None = None,
              on_bytes: Callable[[int], None] | None = None) -> RankTrace:
    """Read one rank file into columns. Raises TraceError on anything unusable.

    ``on_bytes(n)`` is told of every n bytes read from the file (progress)."""
    return _fold(TraceStream(ByteSource(path, on_bytes=on_bytes)), str(path), rank_hint)


def load_bytes(data: bytes, name: str = "<bytes>", rank_hint: int | None = None) -> RankTrace:
    """The same for a trace already in memory (tests, small inputs)."""
    return _fold(TraceStream(ByteSource(data=data)), name, rank_hint)


def _fold(stream: TraceStream, path: str, rank_hint: int | None) -> RankTrace:
    b = ColumnBuilder()
    stream.run(b.add)
    return b.finish(stream.props, stream.dist, path, rank_hint, stream.salvage_dropped)


# --- finding rank files ------------------------------------------------------------------

TRACE_SUFFIXES = (".json", ".json.gz")


def find_trace_files(target: Path) -> list[Path]:
    """Trace files for a file, a folder of rank files, or a gpudiag run directory."""
    if not target.exists():
        raise TraceError(f"{target}: no such file or directory")
    if target.is_file():
        return [target]
    if is_run_dir(target):
        target = traces_dir(target)
    files = sorted(p for p in target.iterdir()
                   if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                   and p.name not in (RUN_JSON, DIAGNOSIS_JSON))
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
