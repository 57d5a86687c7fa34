"""Data-parallel training over gloo with 100 MB of gradients a step (2 ranks, one core each).

A wide two-layer MLP (about 25 M parameters) on small batches: DDP all-reduces the whole
gradient every step, so most of the step is gloo moving and summing 100 MB on the same cores
that compute. Prints rank 0's own median step time.

    python -m torch.distributed.run --nproc_per_node 2 --master_port PORT \\
        benchmarks/workloads/ddp_big_grads.py --steps 40
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from own_timer import StepTimer
from torch import nn
from torch.nn.parallel import DistributedDataParallel

WIDTH, BATCH = 3500, 16  # 2 x 3500^2 weights: 24.5 M parameters, 98 MB of fp32 gradients


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                                                  nn.Linear(WIDTH, WIDTH)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
    timer = StepTimer()
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        timer.tick()
    if dist.get_rank() == 0:
        timer.report("ddp_big_grads")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
