"""What the held-out-4 jobs share: a training step whose thread is blocked (asleep, not
computing) for part of it outside torch's operators, the DataLoader and collectives, and the
truth of that block by the job's own clocks.

``blocked(timer)`` times the blocking call with ``perf_counter`` (wall) and ``thread_time``
(the training thread's CPU): a thread asleep in a ``recv``, ``fsync``, lock, ``waitpid``, sleep
or ``Queue.get`` shows wall time with almost no CPU. ``blocked_truth`` is the in-job truth: the
step (mean of the steady steps), the time inside the blocking call per step, its share of the
step and the rest; ``zoo_truth`` counts the blocked share as host time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager

import _zoo
import torch
import torch.nn as nn

PART = "blocked"


@contextmanager
def blocked(timer: _zoo.Timer) -> Iterator[None]:
    """Time a blocking call: wall time as the part ``blocked``, its thread CPU ``blocked_cpu``."""
    c0 = time.thread_time()
    with timer.part(PART):
        yield
    timer._part_now[PART + "_cpu"] = (timer._part_now.get(PART + "_cpu", 0.0)
                                      + (time.thread_time() - c0) * 1e3)


def mlp(width: int, layers: int, classes: int = 10) -> nn.Sequential:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(width, classes))


def mlp_flops(batch: int, width: int, layers: int, classes: int = 10) -> int:
    """Hand-counted: 2*M*N*K per GEMM, 3 GEMMs per Linear per training step (forward, the two of
    backward; the first layer's input gradient is computed too, the input needs none but autograd
    skips it: counted anyway, < 1/layers of the total)."""
    return 6 * batch * (layers * width * width + width * classes)


def blocked_truth(args: argparse.Namespace, timer: _zoo.Timer, what: str) -> dict:
    """The step (mean of the steps after --warmup), the blocked time per step and the rest."""
    w = args.warmup
    steps = timer.steps_ms[w:]
    n = max(len(steps), 1)
    step = sum(steps) / n
    b = sum(timer.parts.get(PART, [0.0] * len(timer.steps_ms))[w:]) / n
    bc = sum(timer.parts.get(PART + "_cpu", [0.0] * len(timer.steps_ms))[w:]) / n
    return {"step_mean_ms": step, "blocked_ms": b, "blocked_cpu_ms": bc,
            "blocked_share": b / step if step else 0.0, "rest_ms": step - b,
            "blocked_what": what,
            "blocked_median_ms": _zoo.median(timer.parts.get(PART, [0.0])[w:])}


def train_step(model: nn.Module, fwd, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.cross_entropy(fwd(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()
