"""Another tenant's work for test jobs, over a range of steps: a process spinning on the job's
own CPU ("cpu": the job runs about half as fast while it lives, in the scheduler's time slices
of milliseconds), or one there that spins and sleeps by turns every 0.3 ms ("slices":
every operator of the job is cut into short pieces and runs slower, as on a machine whose pace
dropped for a moment, with no operator standing out as stalled). The job is pinned to that CPU.

    steps = Competitor.parse("111:116")      # spin from the start of step 111 to the end of 116
    with Competitor(steps) as c:
        for i in range(n):
            c.before(i + 1); work(); c.after(i + 1)
"""

from __future__ import annotations

import os
import subprocess
import sys


class Competitor:
    def __init__(self, steps: range | None, kind: str = "cpu") -> None:
        if kind not in ("cpu", "slices"):
            raise SystemExit(f"competitor kind {kind!r}: expected cpu or slices")
        self.steps, self.kind = steps, kind
        self.proc: subprocess.Popen | None = None
        self.cpu = min(os.sched_getaffinity(0))
        if steps is not None:
            os.sched_setaffinity(0, {self.cpu})  # the job on one CPU, where the competitor spins

    @staticmethod
    def parse(text: str) -> range | None:
        """``FIRST:LAST`` (job steps counted from 1, both included), or "" for none."""
        if not text:
            return None
        first, _, last = text.partition(":")
        lo, hi = int(first), int(last or first)
        if not 1 <= lo <= hi:
            raise SystemExit(f"--compete {text!r}: expected FIRST:LAST steps, 1 <= FIRST <= LAST")
        return range(lo, hi + 1)

    def before(self, step: int) -> None:
        if self.steps is not None and step == self.steps.start and self.proc is None:
            work = "while True: pass"
            if self.kind == "slices":
                work = ("import time\nwhile True:\n    t = time.perf_counter() + 3e-4\n"
                        "    while time.perf_counter() < t: pass\n    time.sleep(3e-4)")
            code = f"import os; os.sched_setaffinity(0, {{{self.cpu}}})\n{work}"
            self.proc = subprocess.Popen([sys.executable, "-c", code])

    def after(self, step: int) -> None:
        if self.steps is not None and step == self.steps[-1]:
            self.stop()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __enter__(self) -> Competitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
