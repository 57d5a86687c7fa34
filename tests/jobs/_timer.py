"""The test jobs' own step timer: from the end of one step to the end of the next, as gpudiag's
step timer measures, so the tests compare like with like; written as ``step_seconds`` in the
job's ``--report`` JSON with whatever else the job knows (its FLOPs, its phases).

Beside each step's wall time, the CPU time the job spent in it by its own clocks, which no
other process can shorten or lengthen by waiting: ``thread_cpu_seconds`` (the thread that
steps, ``time.thread_time``) and ``process_cpu_seconds`` (every thread of the process,
``time.process_time``). A step at the job's own pace can be no shorter than its training
thread's time on a core (tests/system/alone/test_own_pace_bounds.py)."""

import json
import os
import time

# A test that crowds the job's steps with busy processes starts them once the job is ready to
# step, not while it imports torch (1-3 CPU-s that eight loops on two cores stretch 5x): the job
# touches READY here and steps once GO exists.
READY, GO = "TEST_JOB_READY", "TEST_JOB_GO"


def start_gate() -> None:
    """Where the test asked (``READY``, ``GO`` in the environment): say the job is ready to step
    and wait for the test's go, at most 5 minutes."""
    ready, go = os.environ.get(READY), os.environ.get(GO)
    if not ready or not go:
        return
    with open(ready, "a"):
        pass
    deadline = time.monotonic() + 300
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.002)


class OwnTimer:
    def __init__(self) -> None:
        start_gate()
        self.seconds: list[float] = []
        self.thread_cpu: list[float] = []
        self.process_cpu: list[float] = []
        self._t = time.perf_counter()
        self._tc, self._pc = time.thread_time(), time.process_time()

    def lap(self) -> None:
        """A step ended now."""
        now, tc, pc = time.perf_counter(), time.thread_time(), time.process_time()
        self.seconds.append(now - self._t)
        self.thread_cpu.append(tc - self._tc)
        self.process_cpu.append(pc - self._pc)
        self._t, self._tc, self._pc = now, tc, pc

    def write(self, path: str, **extra: object) -> None:
        with open(path, "w") as f:
            json.dump({"step_seconds": self.seconds, "thread_cpu_seconds": self.thread_cpu,
                       "process_cpu_seconds": self.process_cpu, **extra}, f)
