"""What every zoo job shares: its command line, its own step timer and its report.

Each job times every training step itself with ``time.perf_counter()`` (from the moment it asks
for the batch to the end of everything the step does: optimizer step, syncs, checkpoint), so
its numbers are the truth gpudiag is checked against, observed or not. The report is one JSON
object, written to ``--report FILE`` and printed as the job's last line after ``ZOO_REPORT``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


def parser(description: str, steps: int, warmup: int = 5) -> argparse.ArgumentParser:
    """The options every job has; each job adds its own knobs."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help="training steps to time")
    p.add_argument("--warmup", type=int, default=warmup,
                   help="first steps left out of the summary (still timed and reported)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads(N); 0 keeps torch's default")
    p.add_argument("--report", default="", help="write the JSON report here as well")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=0.0,
                   help="stop after this long (at least --warmup + 3 steps): a guard for a "
                        "variant that runs far slower; 0: run every step")
    p.add_argument("--min-steps", type=int, default=0,
                   help="with --max-seconds: time at least this many steps (default: --warmup + 3)")
    p.add_argument("--foreach", action="store_true",
                   help="the optimizer's multi-tensor (foreach) implementation")
    return p


def setup_threads(threads: int) -> int:
    """Apply --threads and say how many intra-op threads the job runs with."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


@dataclass
class Timer:
    """Per-step wall times (ms) and named parts of steps (ms per step), by the job's own clock."""

    steps_ms: list[float] = field(default_factory=list)
    # the stepping thread's own CPU time per step (ms, ``time.thread_time``): what no other
    # process can lengthen by holding the cores, so a step at the job's own pace is no shorter
    cpu_ms: list[float] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)
    _part_now: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, kind: str = "train") -> Iterator[None]:
        self._part_now = {}
        t0, c0 = time.perf_counter(), time.thread_time()
        yield
        self.steps_ms.append((time.perf_counter() - t0) * 1e3)
        self.cpu_ms.append((time.thread_time() - c0) * 1e3)
        self.kinds.append(kind)
        for name in set(self.parts) | set(self._part_now):
            self.parts.setdefault(name, [0.0] * (len(self.steps_ms) - 1))
            self.parts[name].append(self._part_now.get(name, 0.0))

    def over(self, args: argparse.Namespace) -> bool:
        """True once --max-seconds have passed and enough steps are timed to summarise."""
        if not args.max_seconds or len(self.steps_ms) < max(args.warmup + 3, args.min_steps):
            return False
        return sum(self.steps_ms) / 1e3 > args.max_seconds

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self._part_now[name] = self._part_now.get(name, 0.0) + (time.perf_counter() - t0) * 1e3


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def finish(job: str, args: argparse.Namespace, timer: Timer, truth: dict[str, Any],
           knobs: dict[str, Any]) -> None:
    """Summarise the steady steps, write the report and print it as the last line."""
    keep = range(args.warmup, len(timer.steps_ms))
    steady = [timer.steps_ms[i] for i in keep]
    parts = {k: [v[i] for i in keep] for k, v in timer.parts.items()}
    # the training steps' CPU time (eval or save steps apart where the job names its kinds)
    cpu = [timer.cpu_ms[i] for i in keep if timer.kinds[i] == "train" or "train" not in timer.kinds]
    truth = {**truth, "cpu_step_median_ms": median(cpu)}
    report = {
        "job": job,
        "knobs": knobs,
        "threads": knobs.get("threads"),
        "pid": os.getpid(),
        "own_step_ms": [round(x, 3) for x in timer.steps_ms],
        "own_cpu_ms": [round(x, 3) for x in timer.cpu_ms],
        "steps_done": len(timer.steps_ms),
        "kinds": timer.kinds,
        "warmup": args.warmup,
        "median_ms": median(steady),
        "mean_ms": sum(steady) / max(len(steady), 1),
        "parts_mean_ms": {k: sum(v) / max(len(v), 1) for k, v in parts.items()},
        "truth": truth,
    }
    text = json.dumps(report)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    sys.stdout.flush()
    print("ZOO_REPORT " + text, flush=True)
