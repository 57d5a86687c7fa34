"""Measure this machine's CPU peaks once, so CPU-only traces get a real roofline.

No datasheet number is honest for a CPU (turbo, SMT, AVX frequency offsets, the BLAS in
use), so we measure what this machine actually sustains: the best of several float32 GEMMs
for FLOP/s, and the best of a few large array copies for memory bandwidth. GEMMs run in
numpy's BLAS and, when torch is installed, in torch's (oneDNN/MKL): the jobs we judge run
torch, and on some machines numpy's BLAS is held to a slower kernel (OPENBLAS_CORETYPE), so
numpy alone reads a peak below what a torch job reaches, and MFU above 100%. The result is
cached per CPU model and core count because measuring takes a few seconds.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from gpudiag.devices import DevicePeak

CACHE_VERSION = 2  # 2: GEMM peak is the best of numpy and torch


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_path() -> Path:
    base = os.environ.get("GPUDIAG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpudiag")
    return Path(base) / "cpu_peak.json"


def _best_gemm(matmul, a, b, n: int, repeats: int) -> float:  # noqa: ANN001 - numpy or torch
    matmul(a, b)  # warm up the BLAS threads
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        matmul(a, b)
        best = max(best, 2.0 * n**3 / (time.perf_counter() - t))
    return best


def measure(repeats: int = 10, n: int = 1024, copy_mb: int = 256) -> tuple[float, float]:
    """(FLOP/s, bytes/s) best-of-``repeats``: a busy moment lowers one try, not the best."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    best_flops = _best_gemm(np.matmul, a, b, n, repeats)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        best_flops = max(best_flops, _best_gemm(torch.mm, torch.from_numpy(a), torch.from_numpy(b),
                                                n, repeats))
    src = np.ones(copy_mb * 2**20 // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best_bw = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best_bw = max(best_bw, 2.0 * src.nbytes / (time.perf_counter() - t))  # read + write
    return best_flops, best_bw


def cpu_peak() -> DevicePeak:
    """The CPU as a device, measured once and cached."""
    key = {"version": CACHE_VERSION, "model": _cpu_model(), "cores": os.cpu_count()}
    path = cache_path()
    try:
        cached = json.loads(path.read_text())
        if all(cached.get(k) == v for k, v in key.items()):
            return _device(cached["flops"], cached["bandwidth"], cached["model"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    flops, bw = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one temp name per process: concurrent first runs never write into each other's file
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**key, "flops": flops, "bandwidth": bw}))
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only costs a re-measurement next time
    return _device(flops, bw, key["model"])


def _device(flops: float, bw: float, model: str) -> DevicePeak:
    fams = {"fp32": flops, "bf16": flops, "fp16": flops, "tf32": flops}
    return DevicePeak(name=f"CPU ({model}, {os.cpu_count()} cores)", flops=fams, bandwidth=bw,
                      source="measured: best numpy float32 GEMM and array copy on this machine")
