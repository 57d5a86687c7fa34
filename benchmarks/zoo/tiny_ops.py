"""Host/dispatch-bound: thousands of tiny operators per step on a batch of 4.

60 blocks of Linear(32, 32), LayerNorm, GELU, a scale and a residual add: each operator's
arithmetic is a few hundred FLOPs, so the step is the dispatcher's and Python's per-operator
cost. Truth: how the step grows with the batch (``--batch 4`` against ``--batch 64``, 16x the
arithmetic, same operators): a step that barely grows is fixed per-operator cost.
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.scale = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.gelu(self.norm(self.lin(x))) * self.scale


def main() -> None:
    p = _zoo.parser(__doc__, steps=700, warmup=20)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--blocks", type=int, default=60)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    d = 32
    model = nn.Sequential(*[Block(d) for _ in range(args.blocks)], nn.Linear(d, 1))
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=args.foreach or None)
    x = torch.randn(args.batch, d)
    y = torch.randn(args.batch, 1)
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            loss = nn.functional.mse_loss(fwd(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    per_block = 2 * args.batch * d * d
    truth = {"flops_per_step": 3 * per_block * (args.blocks + 1),
             "params": sum(q.numel() for q in model.parameters())}
    _zoo.finish("tiny_ops", args, timer, truth,
                {"batch": args.batch, "compile": args.compile, "foreach": args.foreach,
                 "threads": threads})


if __name__ == "__main__":
    main()
