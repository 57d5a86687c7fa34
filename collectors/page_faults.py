"""The training process's page faults and kernel time per step, and what one fault costs here.

Why: glibc's malloc serves a block of 128 kB or more from a fresh mapping (mmap) and hands it
back to the kernel when it is freed (munmap), until a freed block raises its threshold. A
training step that makes MB-sized temporaries (an optimizer's on large tensors, an embedding's
gradients) then faults in every page of them each step, with the kernel zeroing each page: time
no operator owns, spent inside whichever operator first writes the memory. Seen on the project's
2-core AMD EPYC VM (2026-11-29): 4 x Linear(768, 768) with Adam, 3,400-3,800 faults and
7.1-8.8 ms of kernel time in a 20.4-20.9 ms mean step; with ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` set high the step was 12.1-12.8 ms, 6 faults a step. The same job's
steps after one ``malloc(16 MB)`` + ``free``, or after an empty ``torch.profiler`` session,
ran 0.92x: the threshold moved.

One ``getrusage`` per step (about a microsecond): the process's minor faults, its kernel and
total CPU seconds. Process-wide, so intra-op threads' faults count; DataLoader workers are
other processes and do not.
"""

from __future__ import annotations

import ctypes
import mmap
import resource
import time
from typing import Any

# The probe's mapping: large enough that its faults dwarf the clock's resolution, small enough
# to cost the job a few tens of milliseconds once (in the step that exports a trace, which no
# pace is read from).
PROBE_BYTES = 16 << 20
PROBE_REPS = 3


class StepFaults:
    """The process's resource usage at the last step boundary; ``on_step`` gives the deltas."""

    def __init__(self) -> None:
        self.last = resource.getrusage(resource.RUSAGE_SELF)

    def on_step(self) -> dict[str, Any]:
        now = resource.getrusage(resource.RUSAGE_SELF)
        last, self.last = self.last, now
        return {"minflt": now.ru_minflt - last.ru_minflt,
                "sys_s": round(now.ru_stime - last.ru_stime, 6),
                "cpu_s": round(now.ru_utime + now.ru_stime - last.ru_utime - last.ru_stime, 6)}


def fault_cost_us(size: int = PROBE_BYTES, reps: int = PROBE_REPS) -> float | None:
    """Microseconds one minor fault costs this process: a fresh anonymous mapping written once
    (each page faulted in and zeroed), less the same write again (no faults), plus its unmapping,
    over the faults counted. The cheapest of ``reps`` (another process on the core only ever
    adds). Memory from ``mmap`` directly, never from malloc: the probe leaves glibc's thresholds
    as the job had them. None where no fault was counted (a kernel that pre-faults)."""
    best: float | None = None
    for _ in range(reps):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        m = mmap.mmap(-1, size)
        buf = (ctypes.c_char * size).from_buffer(m)
        addr = ctypes.addressof(buf)
        ctypes.memset(addr, 1, size)
        t1 = time.perf_counter()
        ctypes.memset(addr, 2, size)
        t2 = time.perf_counter()
        del buf
        m.close()
        t3 = time.perf_counter()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        if faults <= 0:
            continue
        cost = max(0.0, (t1 - t0) - (t2 - t1) + (t3 - t2)) / faults * 1e6
        best = cost if best is None else min(best, cost)
    return None if best is None else round(best, 4)
