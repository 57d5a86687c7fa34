"""Host-bound: a deep stack of tiny Linear layers at batch size 1, plus Python-loop math.

Each step issues hundreds of operators on tensors of a few dozen elements (48 bias-free
16x16 Linear layers with tanh, a loss summed one element at a time): every one costs a few
microseconds of dispatcher and Python overhead and almost no arithmetic, so the CPU spends
the step between and around operators rather than in them.
Expected verdict: host-bound.
"""

from __future__ import annotations

import torch
from _common import maybe_profile, parse_args
from torch import nn

WIDTH, DEPTH = 16, 48


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH, bias=False), nn.Tanh()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(1, WIDTH)
    y = torch.randn(1, WIDTH)
    loss = torch.tensor(float("nan"))
    with maybe_profile(args.profile_out) as prof:
        for _ in range(args.steps):
            opt.zero_grad(set_to_none=True)
            out = model(x)
            # a hand-rolled loss, one element-sized op at a time
            loss = torch.zeros(())
            for j in range(WIDTH):
                d = out[0, j] - y[0, j]
                loss = loss + d * d
            loss = loss / WIDTH
            loss.backward()
            opt.step()
            prof.step()
    print(f"host_bound: final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
