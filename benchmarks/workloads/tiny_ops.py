"""Per-op overhead: thousands of tiny operators a step at batch 4 (host-bound on any device).

A stack of narrow residual blocks (Linear 32x32, LayerNorm, GELU, add) deep enough that a step
runs a few thousand operators forward and backward on tensors of a few hundred elements: the
step is dispatcher and Python time, not arithmetic. Prints the job's own median step time.

    python benchmarks/workloads/tiny_ops.py --steps 300
"""

from __future__ import annotations

import argparse

import torch
from own_timer import StepTimer
from torch import nn

WIDTH, DEPTH, BATCH = 32, 120, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.norm(self.lin(x)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(*[Block() for _ in range(DEPTH)], nn.Linear(WIDTH, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)
    timer = StepTimer()
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        timer.tick()
    timer.report("tiny_ops")


if __name__ == "__main__":
    main()
