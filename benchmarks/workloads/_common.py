"""Shared CLI and profiler setup for the CPU benchmark workloads.

Every workload is a standalone script: ``python WORKLOAD.py [--profile-out DIR]``. With
``--profile-out`` the training loop runs under ``torch.profiler.profile`` with the schedule
gpudiag expects (wait 1, warm up 1, record 5 steps) and writes ``DIR/rank-<RANK>.json.gz``;
without it the script just trains.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

WAIT, WARMUP, ACTIVE = 1, 1, 5
# Steps a profiled loop must run for the trace to be written: the trace is exported when
# the ACTIVE window closes, at the PROFILED_STEPS-th ``prof.step()``.
PROFILED_STEPS = WAIT + WARMUP + ACTIVE


def parse_args(description: str, argv: list[str] | None = None,
               default_steps: int = PROFILED_STEPS) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--profile-out", metavar="DIR", type=Path, default=None,
                        help="profile the loop and write DIR/rank-<RANK>.json.gz")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=default_steps,
                        help="training steps to run (under `gpudiag profile`: more than "
                             "--skip + --steps + 1)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    return args


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class _NoProfiler:
    def step(self) -> None:
        pass


@contextlib.contextmanager
def maybe_profile(out_dir: Path | None) -> Iterator[profile | _NoProfiler]:
    """The profiler for a training loop (call ``.step()`` once per iteration), or a no-op.

    ``repeat=1`` records a single window: a loop longer than ``PROFILED_STEPS`` neither
    rewrites the trace every 7 steps nor overwrites it with a partial window at exit.
    """
    if out_dir is None:
        yield _NoProfiler()
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"rank-{rank()}.json.gz"

    def write(prof: profile) -> None:
        prof.export_chrome_trace(str(path))

    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
        on_trace_ready=write,
    ) as prof:
        yield prof


def train(loader, model: torch.nn.Module, opt: torch.optim.Optimizer,
          profile_out: Path | None) -> torch.Tensor:
    """The plain classification loop the workloads share (cross-entropy, one optimizer step per
    batch), under ``maybe_profile``; returns the last loss. What makes each workload bound by
    what it is lies in its data, model and loader, not in this loop."""
    loss_fn = torch.nn.CrossEntropyLoss()
    loss = torch.tensor(float("nan"))
    with maybe_profile(profile_out) as prof:
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            prof.step()
    return loss
