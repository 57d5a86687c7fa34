"""Memory-bound: elementwise training on 16M-element tensors, no matmuls.

The "model" is a per-element affine map with a ReLU (a learnable scale and shift over a
big feature map, like a norm layer's affine part) trained against a target with an MSE
loss. Each op streams 64 MB tensors through memory doing ~1 FLOP per element, so the
arithmetic intensity (~0.1 FLOP/byte) is far below the CPU's ridge point.
Expected verdict: memory-bound.
"""

from __future__ import annotations

import torch
from _common import maybe_profile, parse_args
from torch import nn

NUMEL = 16 * 2**20  # 16M float32 elements = 64 MB per tensor


class ElementwiseAffine(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(n))
        self.shift = nn.Parameter(torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.shift) + x


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    x = torch.randn(NUMEL)
    target = x * 2 + 1
    model = ElementwiseAffine(NUMEL)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.tensor(float("nan"))
    with maybe_profile(args.profile_out) as prof:
        for _ in range(args.steps):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            prof.step()
    print(f"memory_bound: final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
