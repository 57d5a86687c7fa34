"""Import numpy without its BLAS threads spinning on nothing (used by ``gpudiag analyze``).

numpy's OpenBLAS starts one thread per core when numpy is imported, and each idle thread
spins for 2^28 CPU cycles (OpenBLAS's default ``OPENBLAS_THREAD_TIMEOUT``, ~0.1 s) before it
sleeps. ``gpudiag analyze`` never multiplies matrices in the parent before its workers start,
so that spin is pure cost: 0.04-0.15 CPU-s per run on this project's 2-core VM (``python -c
"import numpy"``: 0.15-0.25 s of user time against 0.08-0.11 s), taken from the workers it
overlaps. 2^20 cycles (~0.3 ms) still keeps the threads awake between back-to-back GEMMs, as
``collectors.cpu_peak`` runs them. OpenBLAS reads the variable once, when it is loaded, so it
is set only around the import and removed again: processes started later (a training job
under ``gpudiag profile``) never see it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# 2^N CPU cycles an idle OpenBLAS thread spins before sleeping (OpenBLAS accepts 4..30).
THREAD_TIMEOUT_EXPONENT = "20"
_VAR = "OPENBLAS_THREAD_TIMEOUT"


@contextmanager
def quiet_blas_threads() -> Iterator[None]:
    """Within: a first import of numpy starts BLAS threads that soon sleep. A value the user
    set is kept; nothing changes when numpy is already imported."""
    if _VAR in os.environ:
        yield
        return
    os.environ[_VAR] = THREAD_TIMEOUT_EXPONENT
    try:
        yield
    finally:
        os.environ.pop(_VAR, None)
