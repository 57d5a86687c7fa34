"""The job's own step timer, for the observer-cost benchmark's workloads.

Each workload times its steps with ``time.perf_counter`` and prints one line
``own_step_ms <median> cpu_step_ms <median> steps <n>`` at the end: medians over the steps
after the first ``WARM`` (allocator growth, lazy init) of the step's wall time (the job's own
measure of its pace, which an observer must not change) and of the CPU time the job's process
spent in it (all its threads: what the observer adds inside the job, which a busy machine's
queueing for cores does not blur as much as wall time). Nothing here knows gpudiag.
"""

from __future__ import annotations

import statistics
import time

WARM = 5


class StepTimer:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu: list[float] = []
        self._t = time.perf_counter()
        self._c = time.process_time()

    def tick(self) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        self.times.append(now - self._t)
        self.cpu.append(cpu - self._c)
        self._t, self._c = now, cpu

    def report(self, name: str) -> None:
        kept = self.times[WARM:] or self.times
        cpu = self.cpu[WARM:] or self.cpu
        print(f"{name}: own_step_ms {1e3 * statistics.median(kept):.3f} cpu_step_ms "
              f"{1e3 * statistics.median(cpu):.3f} steps {len(kept)}", flush=True)
