"""Which rank files to analyse, and analysing them in parallel worker processes.

Each rank is loaded, analysed and reduced to a small picklable partial result inside one
worker; the parent only ever holds partials. A worker holds one rank at a time (one batch
of bytes plus that rank's compact columns), so peak memory is the number of workers times
that, whatever the number of ranks. Ranks are handed out one at a time as workers free up,
largest file first, so one big rank does not start last and leave the other cores idle.

Progress (bytes read of each rank file) goes through a ``ProgressSink``; workers post it on a
queue that the parent drains while it waits. Nothing here draws it: ``reports.progress`` does.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_mod
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpudiag.analyzers.trace_decode import rank_of
from gpudiag.analyzers.trace_stream import ByteSource, TraceStream
from gpudiag.errors import BadInput, TraceError


class ProgressSink(Protocol):
    """What an analysis reports while it runs (all calls from the parent process)."""

    def start(self, total_bytes: int, ranks: int) -> None: ...
    def rank_started(self, key: int, label: str, size: int) -> None: ...
    def advance(self, key: int, nbytes: int) -> None: ...
    def rank_done(self, key: int) -> None: ...
    def finish(self) -> None: ...


@dataclass(frozen=True)
class RankFile:
    """One trace file: its rank (from its header, its name, or its place in the folder)."""

    path: Path
    rank: int
    hint: int  # place in the folder, the rank of last resort
    size: int
    has_device: bool  # the header names a device (deviceProperties)


# --- choosing the files --------------------------------------------------------------------

def parse_ranks(spec: str) -> list[int]:
    """"0,3,7" or "0-3,8" as a sorted list of ranks; BadInput for anything else."""
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise BadInput(f"--ranks {spec!r}: expected ranks like 0,3,7 or 0-3,8") from None
        if a < 0 or b < a:
            raise BadInput(f"--ranks {spec!r}: {part!r} is not a rank or an increasing range")
        out.update(range(a, b + 1))
    return sorted(out)


def parse_steps(spec: str) -> tuple[int, int]:
    """"5" or "5-8": the first and last ProfilerStep number to analyse."""
    lo, sep, hi = spec.strip().partition("-")
    try:
        a = int(lo)
        b = int(hi) if sep else a
    except ValueError:
        raise BadInput(f"--steps {spec!r}: expected a step number or a range like 5-8 "
                       "(ProfilerStep numbers)") from None
    if a < 0 or b < a:
        raise BadInput(f"--steps {spec!r}: not an increasing range of step numbers")
    return a, b


def describe_ranks(ranks: Sequence[int]) -> str:
    """0,1,2,3,7 -> "0-3, 7"."""
    out: list[str] = []
    rs = sorted(ranks)
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


def peek(path: Path, hint: int) -> RankFile:
    """Rank and device presence from the file's header (its first bytes only)."""
    stream = TraceStream(ByteSource(path))
    dist = props = None
    try:
        stream.open_header()
        dist, props = stream.dist, stream.props
    except TraceError:
        pass  # unreadable: the full load says why
    finally:
        stream.close()
    rank, _, _ = rank_of(dist, hint, str(path))
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    return RankFile(path, rank, hint, size, props is not None)


def select(files: list[RankFile], ranks: list[int] | None) -> list[RankFile]:
    if ranks is None:
        return files
    have = {f.rank for f in files}
    missing = [r for r in ranks if r not in have]
    if missing:
        raise BadInput(f"--ranks: rank {describe_ranks(missing)} not in the traces (ranks "
                       f"present: {describe_ranks(sorted(have))})")
    want = set(ranks)
    return [f for f in files if f.rank in want]


# --- running ------------------------------------------------------------------------------

# A worker posts progress at most once per this many bytes read, so the queue carries a few
# hundred messages per GB, not one per read.
POST_BYTES = 8 * 2**20

# The worker process's progress queue, set once by the pool's initializer.
_worker_queue: Any = None


def _init_worker(q: Any) -> None:
    global _worker_queue  # per worker process: the pool's initializer sets it once
    _worker_queue = q


class _Poster:
    """Accumulates bytes read and posts (key, bytes) to the parent now and then."""

    def __init__(self, key: int, post: Callable[[int, int], None]) -> None:
        self.key, self.post, self.pending = key, post, 0

    def __call__(self, n: int) -> None:
        self.pending += n
        if self.pending >= POST_BYTES:
            self.post(self.key, self.pending)
            self.pending = 0

    def flush(self) -> None:
        if self.pending:
            self.post(self.key, self.pending)
            self.pending = 0


def _run_one(task: tuple[Callable[..., Any], int, tuple[Any, ...]]) -> Any:
    fn, key, args = task
    q = _worker_queue
    poster = _Poster(key, (lambda k, n: q.put((k, n))) if q is not None else (lambda k, n: None))
    try:
        return fn(*args, on_bytes=poster)
    finally:
        poster.flush()


def run_ranks(fn: Callable[..., Any], files: list[RankFile], args: Callable[[RankFile], tuple[Any, ...]],
              jobs: int | None, progress: ProgressSink | None = None) -> list[Any]:
    """``fn(*args(f), on_bytes=...)`` for every file, in ``jobs`` worker processes (one per
    core by default); results in the order of ``files``.

    With one worker (or one file), or where this process already runs other threads (forking
    it could leave a child waiting on a lock one of them held), everything runs in this
    process: the same code path, and what ``--jobs 1`` means. Results do not depend on the
    number of workers: each rank is computed alone and the caller combines them in rank order.
    """
    workers = max(1, min(jobs or os.cpu_count() or 1, len(files)))
    if threading.active_count() > 1:
        # the pool forks, and a child forked while another thread of this process held a lock
        # (logging's, a stream's, the allocator's) waits on it forever: gpudiag's CLI has one
        # thread here, but a caller that embeds diagnose() in a threaded process (a daemon, a
        # pytest-xdist worker, whose execnet thread is always running) does not. A project CI
        # run hung 78 min in such a fork (HTA's pool, 2026-12-01); its ranks are read here
        workers = 1
    if progress is not None:
        progress.start(sum(f.size for f in files), len(files))
    try:
        if workers == 1:
            return [_inline(fn, i, f, args(f), progress) for i, f in enumerate(files)]
        return _pooled(fn, files, args, workers, progress)
    finally:
        if progress is not None:
            progress.finish()


def _inline(fn: Callable[..., Any], key: int, f: RankFile, a: tuple[Any, ...],
            progress: ProgressSink | None) -> Any:
    if progress is None:
        return fn(*a, on_bytes=None)
    progress.rank_started(key, _label(f), f.size)
    out = fn(*a, on_bytes=lambda n: progress.advance(key, n))
    progress.rank_done(key)
    return out


def _label(f: RankFile) -> str:
    return f"rank {f.rank}"


def _pooled(fn: Callable[..., Any], files: list[RankFile], args: Callable[[RankFile], tuple[Any, ...]],
            workers: int, progress: ProgressSink | None) -> list[Any]:
    # fork: workers start in milliseconds with the parent's modules already imported; the
    # parent starts no thread of its own before they exist (progress is drawn from this thread)
    ctx = multiprocessing.get_context("fork")
    q = ctx.SimpleQueue() if progress is not None else None
    order = sorted(range(len(files)), key=lambda i: -files[i].size)  # largest first
    results: list[Any] = [None] * len(files)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(q,)) as pool:
        running: dict[Future[Any], int] = {}
        todo = iter(order)

        def submit() -> None:
            i = next(todo, None)
            if i is None:
                return
            running[pool.submit(_run_one, (fn, i, args(files[i])))] = i
            if progress is not None:
                progress.rank_started(i, _label(files[i]), files[i].size)

        for _ in range(workers):
            submit()
        while running:
            done, _ = wait(running, timeout=0.1, return_when=FIRST_COMPLETED)
            _drain(q, progress)
            for fut in done:
                i = running.pop(fut)
                results[i] = fut.result()  # a worker's TraceError is raised here, as is
                if progress is not None:
                    progress.rank_done(i)
                submit()
        _drain(q, progress)
    return results


def _drain(q: Any, progress: ProgressSink | None) -> None:
    if q is None or progress is None:
        return
    try:
        while not q.empty():
            key, n = q.get()
            progress.advance(key, n)
    except (OSError, EOFError, queue_mod.Empty):
        pass
