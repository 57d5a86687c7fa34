"""Measure this machine's CPU peaks, per dtype, so CPU-only traces get a real roofline and MFU.

No datasheet number is honest for a CPU (turbo, AVX frequency offsets, the BLAS in use, AMX
for bf16), so we measure what this machine sustains: GEMM FLOP/s per dtype family (fp32
always; bf16 and fp16 with torch, which runs them on AMX / AVX-512 units where the CPU has
them: this project's 2-core Sapphire Rapids VM did 1.07-1.10 TFLOP/s bf16 against 0.15-0.23
fp32), and memory bandwidth from large array copies.

A busy machine is the normal machine, so a peak is measured to be robust to load:
- each run is timed by the time its threads were on a core, not by the wall clock: with one
  thread, that thread's CPU clock (what another process takes of the core is not on it); with
  all of them, the process' CPU clock over the threads, held under the threads times the
  one-thread rate (no more than linear scaling: a pool thread that slept while a sibling waited
  for its core would otherwise read as work done in no time). Wall-clock runs alone read the
  fp32 peak at 65, 94.5 and ~156 GFLOP/s on the same 2-core AMD EPYC VM at different loads (its
  quiet figure: 186), and MFU 100% for a quiet job measured against the 65;
- the best of many *short* runs (a few milliseconds each, for a time budget per dtype): a
  competing process lowers some runs, rarely all; with one thread and with all of them, the
  best of both;
- a measured peak is a floor, never a ceiling: a job that runs faster than it raises it
  (``raise_floor``, called with what a diagnosis observed), and the cache keeps the highest;
- the cache is keyed by CPU model, core count and the versions of the libraries that run the
  GEMMs (torch, numpy), so a new BLAS is measured afresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpudiag.contract import ENV_CACHE_DIR
from gpudiag.devices import DevicePeak

# 3: per dtype family, best of short runs, keyed by library versions; 4: lower precision also
# timed through F.linear (autocast's path), which on a CPU without bf16 units ran bf16 23x
# faster than torch.mm (2-core AMD EPYC: 8.9-9.8 against 0.39 GFLOP/s); 5: runs timed on the
# CPU clocks (a peak cached from wall-clock runs on a busy machine may be half the real one);
# 6: fp64 measured
CACHE_VERSION = 6
# A short GEMM: 2 * 512^3 = 268 MFLOP, 1-2 ms in fp32 on one modern core, 0.25 ms in bf16 on AMX.
GEMM_N = 512
# Per dtype family and thread count, runs go on for this long (at least MIN_RUNS): long enough
# for some runs to land in a quiet moment of a loaded machine, short enough to measure every
# family in a couple of seconds.
BUDGET_S = 0.3
MIN_RUNS = 5
# Copies too large for the caches of the machines we meet (2 x 128 MB); each takes tens of
# milliseconds, so fewer runs fit the budget.
COPY_MB = 128
COPY_BUDGET_S = 0.5
COPY_MIN_RUNS = 5
# fp64 too: a job left in float64 by accident (a numpy array's default dtype) ran at 43 GFLOP/s
# against fp32's 93 on one core here, and read MFU 39% against the fp32 peak where its own was 79%
FAMILIES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict[str, str]:
    """The versions of the libraries that run the GEMMs. torch's is read from its installed
    metadata, not by importing it: the import costs 1.5 s of CPU (2-core AMD EPYC), which every
    `gpudiag profile` paid at exit to look up a cached peak. Importing is the fallback for a
    torch installed without metadata."""
    out = {"numpy": np.__version__}
    loaded = sys.modules.get("torch")
    if loaded is not None:
        out["torch"] = loaded.__version__
        return out
    try:
        out["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        try:
            import torch

            out["torch"] = torch.__version__
        except ImportError:
            pass
    return out


def cache_path() -> Path:
    base = os.environ.get(ENV_CACHE_DIR) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpudiag")
    return Path(base) / "cpu_peak.json"


def cache_key() -> dict[str, Any]:
    return {"version": CACHE_VERSION, "model": _cpu_model(), "cores": os.cpu_count(),
            "libraries": _versions()}


def wall_clock() -> float:
    return time.perf_counter()


def thread_clock() -> float:
    """The calling thread's time on a core: the clock of a run on one thread."""
    return time.thread_time()


def pool_clock(threads: int) -> Callable[[], float]:
    """The process' time on a core over ``threads``: a run spread evenly over a pool of that
    many threads, each on its own core, took this long at its own pace."""
    return lambda: time.process_time() / threads


def best_rate(run: Callable[[], object], work: float, budget_s: float = BUDGET_S,
              min_runs: int = MIN_RUNS, clock: Callable[[], float] = wall_clock) -> float:
    """The best ``work / seconds`` of repeated runs within ``budget_s`` (of wall time), each
    timed by ``clock``: a busy moment lowers one run, not the best of many, and a run timed by a
    CPU clock is not lowered by the time other processes held its core. Short runs go on to
    ``min_runs`` for up to twice the budget; a run longer than that is its own best (one 0.7 s
    bf16 ``torch.mm`` here is too long for a busy moment to lower it much, and five of them for
    each thread count made the first ``gpudiag profile`` on this 2-core AMD EPYC VM spend
    20.7-22.7 s of CPU measuring the peaks)."""
    run()  # warm up (thread pools, packing buffers)
    best = 0.0
    runs = 0
    end = time.perf_counter() + budget_s
    while runs < 1 or time.perf_counter() < end or (runs < min_runs and time.perf_counter() < end + budget_s):
        t = clock()
        run()
        dt = clock() - t
        if dt > 0:
            best = max(best, work / dt)
        runs += 1
    return best


def _one_rate(op: Callable[[], object], work: float) -> float:
    """One run's rate by the wall clock, at the thread count already set: enough to tell a path
    many times slower than another from one worth timing."""
    t = time.perf_counter()
    op()
    dt = time.perf_counter() - t
    return work / dt if dt > 0 else float("inf")


def _torch_rate(op: Callable[[], object], work: float, threads: int, budget_s: float) -> float:
    """``op``'s rate on one thread (its CPU clock) and on ``threads`` (the process' CPU clock
    over them, no more than ``threads`` times the one-thread rate, or the wall clock), the best."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = best_rate(op, work, budget_s, clock=thread_clock)
        if threads == 1:
            return one
        torch.set_num_threads(threads)
        pool = best_rate(op, work, budget_s, clock=pool_clock(threads))
        # and by the wall clock, whose best run is one the pool really did: its threads spin
        # while a sibling waits for its core, which the CPU clock counts as work
        wall = best_rate(op, work, budget_s)
        return max(one, wall, min(pool, threads * one))
    finally:
        torch.set_num_threads(before)


# A path (torch.mm or F.linear) whose first run is this many times slower than the family's
# best path so far is not timed further: it cannot be the peak (bf16 torch.mm ran 23x slower
# than F.linear here), and timing it took seconds a run.
DOMINATED = 8.0


def _gemm_peaks(n: int = GEMM_N, budget_s: float = BUDGET_S) -> dict[str, float]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    work = 2.0 * n**3
    peaks = {"fp32": best_rate(lambda: np.matmul(a, b), work, budget_s)}
    try:
        import torch
    except ImportError:
        return peaks
    threads = torch.get_num_threads()
    for family, name in FAMILIES.items():
        dt = getattr(torch, name)
        ta, tb = torch.from_numpy(a).to(dt), torch.from_numpy(b).to(dt)
        best = 0.0
        # torch.mm and F.linear (what a model's layers and autocast call) take different
        # kernels for a lower precision on some CPUs: the better of the two is the peak;
        # F.linear first, the path a model's lower precision takes
        ops = [lambda ta=ta, tb=tb: torch.mm(ta, tb)]
        if family in ("bf16", "fp16"):
            ops.insert(0, lambda ta=ta, tb=tb: torch.nn.functional.linear(ta, tb))
        try:
            for op in ops:
                if best > 0 and _one_rate(op, work) * DOMINATED < best:
                    continue
                best = max(best, _torch_rate(op, work, threads, budget_s))
        except RuntimeError:  # a dtype this build cannot multiply on the CPU
            pass
        if best > 0:
            peaks[family] = max(peaks.get(family, 0.0), best)
    return peaks


def _copy_bandwidth(copy_mb: int = COPY_MB) -> float:
    src = np.ones(copy_mb * 2**20 // 8, dtype=np.float64)
    dst = np.empty_like(src)
    return best_rate(lambda: np.copyto(dst, src), 2.0 * src.nbytes,  # read + write
                     budget_s=COPY_BUDGET_S, min_runs=COPY_MIN_RUNS, clock=thread_clock)


def measure() -> tuple[dict[str, float], float]:
    """(FLOP/s per dtype family, bytes/s), each the best of repeated short runs."""
    return _gemm_peaks(), _copy_bandwidth()


def _read_cache(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or any(cached.get(k) != v for k, v in key.items()):
        return None
    flops = cached.get("flops")
    if not isinstance(flops, dict) or not isinstance(cached.get("bandwidth"), (int, float)):
        return None
    return cached


def _write_cache(path: Path, data: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one temp name per process: concurrent first runs never write into each other's file
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only costs a re-measurement next time


# How long a first measurement waits for another process' measurement of the same cache before
# measuring on its own (one takes 5-10 s here; a crashed measurer's lock goes with its process).
LOCK_WAIT_S = 120.0


@contextlib.contextmanager
def _measuring(path: Path) -> Iterator[None]:
    """Hold the cache's lock while measuring: jobs started together on a fresh machine (three
    under the local scheduler's daemon, in its tests) each measured the peaks at once, 21 s of
    CPU apiece on 2 cores, and each measurement lowered the others'. The later ones wait and
    read the first one's figures. An unwritable cache folder measures without a lock."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the lock


def cpu_peak() -> DevicePeak:
    """The CPU as a device: measured once per CPU model, core count and library versions."""
    key = cache_key()
    path = cache_path()
    cached = _read_cache(path, key)
    if cached is None:
        with _measuring(path):
            cached = _read_cache(path, key)  # measured by another process while this one waited
            if cached is None:
                flops, bw = measure()
                cached = {**key, "flops": flops, "bandwidth": bw}
                _write_cache(path, cached)
    return _device({k: float(v) for k, v in cached["flops"].items()}, float(cached["bandwidth"]),
                   key["model"])


def raise_floor(flops: dict[str, float]) -> None:
    """A job ran a family faster than its cached peak: keep the higher figure (a measured peak
    is a floor of what the machine can do, so the job's rate is one more measurement of it)."""
    key = cache_key()
    path = cache_path()
    cached = _read_cache(path, key)
    if cached is None:
        return
    mine = cached["flops"]
    raised = {f: v for f, v in flops.items() if f in FAMILIES and v > float(mine.get(f, 0.0))}
    if raised:
        _write_cache(path, {**cached, "flops": {**mine, **raised}})


def this_host() -> str:
    """This machine's host name, as ``run.json`` records it (``collectors.run``): a run
    directory naming it was recorded on the CPU whose peak this module measures."""
    return socket.gethostname()


def _device(flops: dict[str, float], bw: float, model: str) -> DevicePeak:
    return DevicePeak(name=f"CPU ({model}, {os.cpu_count()} cores)", flops=dict(flops), bandwidth=bw,
                      source="measured: best of short GEMMs per dtype (numpy and torch) and array "
                             "copies on this machine")
