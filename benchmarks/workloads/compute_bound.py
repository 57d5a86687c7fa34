"""Compute-bound: a wide MLP (2048-wide Linear layers, batch 512) in float32.

Every step is dominated by large GEMMs (forward addmm, backward mm) whose arithmetic
intensity (~170 FLOP/byte) is far above a CPU's ridge point. Expected verdict: compute-bound.
"""

from __future__ import annotations

import torch
from _common import parse_args, train
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WIDTH, BATCH, CLASSES = 2048, 512, 16


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    steps = args.steps
    x = torch.randn(steps * BATCH, WIDTH)
    y = torch.randint(0, CLASSES, (steps * BATCH,))
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)
    model = nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, CLASSES),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = train(loader, model, opt, args.profile_out)
    print(f"compute_bound: final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
