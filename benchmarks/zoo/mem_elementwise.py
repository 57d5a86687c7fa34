"""Memory-bound: elementwise operators on 32 MB tensors (far beyond the caches).

A "model" of per-element parameters: h = x*a + b, h = silu(h) * c + x, loss = mean(h^2). Each
operator streams its inputs and output through DRAM and does a few FLOPs per element.
Truth: bytes moved per step counted by hand (each operator's fp32 inputs and output, forward
and backward, as eager runs them) over the step, against the copy bandwidth the runner
measures on this machine.
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


class PerElement(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.ones(n))
        self.b = nn.Parameter(torch.zeros(n))
        self.c = nn.Parameter(torch.ones(n))

    def forward(self, x: torch.Tensor, bf16: bool) -> torch.Tensor:
        a, b, c = self.a, self.b, self.c
        if bf16:
            a, b, c = a.bfloat16(), b.bfloat16(), c.bfloat16()
        h = x * a + b
        h = nn.functional.silu(h) * c + x
        return (h.float() * h.float()).mean() if bf16 else (h * h).mean()


def main() -> None:
    p = _zoo.parser(__doc__, steps=80, warmup=4)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--cols", type=int, default=2 * 1024 * 1024)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--bf16", action="store_true",
                   help="activations and the parameters' working copies in bfloat16")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    model = PerElement(args.cols)
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=args.foreach or None)
    x = torch.randn(args.rows, args.cols)
    if args.bf16:
        x = x.bfloat16()
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            loss = fwd(x, args.bf16)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    n = args.rows * args.cols
    # Tensor-sized (N elements) reads+writes per step, eager fp32:
    # forward: mul (3), add (3), silu (2), mul (3), add (3), square (2), mean (1) = 17;
    # backward: mean/square grads (3), add (x grad unused: 1), mul and c's grad (3+3, plus a
    # reduction over rows for c: 1), silu backward (3), add/b grad (1), mul and a's grad
    # (3+1) = 19. Parameter-sized traffic (N/rows each) is small beside it and left out.
    tensor_passes = 17 + 19
    bytes_per_step = tensor_passes * n * (2 if args.bf16 else 4)
    s = _zoo.median(timer.steps_ms[args.warmup:])
    truth = {"bytes_per_step": bytes_per_step, "achieved_gbps": bytes_per_step / s / 1e6,
             "tensor_passes": tensor_passes, "elements": n}
    _zoo.finish("mem_elementwise", args, timer, truth,
                {"compile": args.compile, "bf16": args.bf16, "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
