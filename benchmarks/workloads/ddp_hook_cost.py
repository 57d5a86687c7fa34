"""What gpudiag's collective hooks cost on gloo, measured apart (run under torchrun, 2 ranks).

In the same two processes, with the bootstrap armed (``--skip`` huge: it never traces):
- a blocking 4-element ``all_reduce`` through gpudiag's timing wrapper against the unwrapped
  call, in alternated blocks: microseconds per call;
- DDP training steps of two copies of one model, one with DDP's built-in all-reduce (created
  before the bootstrap was armed) and one with gpudiag's timing hook (its default path: divide,
  sum, one callback), alternated: milliseconds per step, and their ratio.
Rank 0 prints one JSON line.

    python -m torch.distributed.run --nproc_per_node 2 benchmarks/workloads/ddp_hook_cost.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--width", type=int, default=3500, help="2 x width^2 parameters (3500: 98 MB)")
ap.add_argument("--pairs", type=int, default=5)
args = ap.parse_args()

dist.init_process_group("gloo")
torch.set_num_threads(1)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, args.width))


builtin = DistributedDataParallel(model())
os.environ.update(GPUDIAG_RUN_DIR=tempfile.mkdtemp(), GPUDIAG_SKIP=str(10**9), GPUDIAG_STEPS="1")
from gpudiag.collectors import torch_bootstrap as tb  # noqa: E402 - armed after `builtin` exists

tb.arm(torch)
tb._on_step(False)  # the bootstrap's state exists from the first step on, as in a job
hooked = DistributedDataParallel(model())
assert getattr(hooked, "_gpudiag_timed", False), "gpudiag's hook is not installed"
x, y = torch.randn(16, args.width), torch.randn(16, args.width)


def ddp_steps(m: nn.Module, n: int = 3) -> tuple[float, float]:
    """(wall, this process's CPU) seconds per step: the CPU, gloo's threads included, is what a
    busy machine blurs least."""
    t, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        m.zero_grad(set_to_none=True)
        nn.functional.mse_loss(m(x), y).backward()
    return (time.perf_counter() - t) / n, (time.process_time() - c) / n


small = torch.ones(4)
raw = dist.all_reduce.__wrapped__


def calls(fn, n: int = 200) -> float:  # noqa: ANN001
    t = time.perf_counter()
    for _ in range(n):
        fn(small)
    return (time.perf_counter() - t) / n


ddp_steps(builtin, 2)
ddp_steps(hooked, 2)
a, b, c, w = [], [], [], []
for i in range(args.pairs):
    order = (builtin, hooked) if i % 2 == 0 else (hooked, builtin)
    got = {id(m): ddp_steps(m) for m in order}
    a.append(got[id(builtin)])
    b.append(got[id(hooked)])
    c.append(calls(raw))
    w.append(calls(dist.all_reduce))
tb._get_state().collectives.drain()
if dist.get_rank() == 0:
    print(json.dumps({
        "ddp_builtin_ms": 1e3 * statistics.median(w for w, _ in a),
        "ddp_hooked_ms": 1e3 * statistics.median(w for w, _ in b),
        "ddp_ratio": statistics.median(h[0] / p[0] for h, p in zip(b, a, strict=True)),
        "ddp_builtin_cpu_ms": 1e3 * statistics.median(c for _, c in a),
        "ddp_hooked_cpu_ms": 1e3 * statistics.median(c for _, c in b),
        "ddp_cpu_ratio": statistics.median(h[1] / p[1] for h, p in zip(b, a, strict=True)),
        "gradient_mb": 2 * args.width * (args.width + 1) * 4 / 1e6,
        "all_reduce_raw_us": 1e6 * statistics.median(c), "all_reduce_timed_us": 1e6 * statistics.median(w),
    }), flush=True)
dist.destroy_process_group()
