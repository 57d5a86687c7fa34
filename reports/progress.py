"""A progress bar on standard error while traces are analysed (``rich``).

Why: a job's traces take from a second to minutes to read; a silent terminal for a minute
looks hung. The bar shows bytes read of the whole job (with an ETA) and one line per rank
in flight, only the ranks being read, so 128 ranks never print 128 lines. It appears only
once an analysis has run for ``SHOW_AFTER_S`` (short ones stay quiet), only on a terminal
(``for_stderr`` returns None when stderr is a pipe or a file), and never with ``--quiet``.
It is drawn from the caller's thread on each update, at most ``REFRESH_S`` apart: no thread
of its own runs while worker processes are forked.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from gpudiag.contract import ENV_PROGRESS_AFTER_S

# An analysis shorter than this shows nothing.
SHOW_AFTER_S = 1.0
REFRESH_S = 0.1


class TraceProgress:
    """``rank_pool.ProgressSink`` drawn with rich on a terminal stream."""

    def __init__(self, stream: TextIO, show_after_s: float = SHOW_AFTER_S) -> None:
        self.stream = stream
        self.show_after_s = show_after_s
        self._t0 = time.monotonic()
        self._last = 0.0
        self._progress: Any = None
        self._total = 0
        self._ranks = 0
        self._done_ranks = 0
        self._tasks: dict[int, Any] = {}
        self._pending: dict[int, tuple[str, int, int]] = {}  # key -> (label, size, read)
        self._read = 0
        self._overall: Any = None

    # --- ProgressSink ---------------------------------------------------------------------

    def start(self, total_bytes: int, ranks: int) -> None:
        self._t0 = time.monotonic()
        self._total, self._ranks = total_bytes, ranks

    def rank_started(self, key: int, label: str, size: int) -> None:
        self._pending[key] = (label, size, 0)
        if self._progress is not None:
            self._add_task(key)
        self._tick()

    def advance(self, key: int, nbytes: int) -> None:
        self._read += nbytes
        label, size, read = self._pending.get(key, ("", 0, 0))
        self._pending[key] = (label, size, read + nbytes)
        if self._progress is not None and key in self._tasks:
            self._progress.update(self._tasks[key], completed=read + nbytes)
        self._tick()

    def rank_done(self, key: int) -> None:
        self._done_ranks += 1
        self._pending.pop(key, None)
        task = self._tasks.pop(key, None)
        if task is not None:
            self._progress.remove_task(task)
        self._tick(force=True)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    # --- drawing --------------------------------------------------------------------------

    def _tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._progress is None:
            if now - self._t0 < self.show_after_s:
                return
            self._open()
        if not force and now - self._last < REFRESH_S:
            return
        self._last = now
        self._progress.update(self._overall, completed=self._read,
                              description=f"{self._done_ranks}/{self._ranks} ranks")
        self._progress.refresh()

    def _open(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        console = Console(file=self.stream, force_terminal=True)
        self._progress = Progress(
            TextColumn("{task.description:>14}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=console,
            auto_refresh=False, transient=True)
        self._progress.start()
        self._overall = self._progress.add_task("", total=max(self._total, 1),
                                                completed=self._read)
        for key in self._pending:
            self._add_task(key)

    def _add_task(self, key: int) -> None:
        label, size, read = self._pending[key]
        self._tasks[key] = self._progress.add_task(label, total=max(size, 1), completed=read)


# Seconds before the bar appears, if not SHOW_AFTER_S (tests set 0 to see it on small inputs).
AFTER_ENV = ENV_PROGRESS_AFTER_S


def for_stderr(quiet: bool = False, stream: TextIO | None = None) -> TraceProgress | None:
    """A progress bar on stderr when it is a terminal and not ``quiet``; else None."""
    stream = stream or sys.stderr
    if quiet or not _is_tty(stream):
        return None
    try:
        after = float(os.environ.get(AFTER_ENV, SHOW_AFTER_S))
    except ValueError:
        after = SHOW_AFTER_S
    return TraceProgress(stream, show_after_s=after)


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
