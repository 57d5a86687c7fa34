"""Compute-bound: an fp32 MLP of 2048x2048 GEMMs on a batch of 256.

Nearly all of the step is the six GEMMs per layer (forward, and the two of backward), so the
step is the FLOPs over what the CPU's GEMM achieves. Truth: achieved FLOP/s from the FLOPs
counted by hand (2*M*N*K per GEMM, 3 GEMMs per Linear per step), and MFU against the peak the
zoo's runner measures on this machine (best of short 2048^3 fp32 matmuls).
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=4)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--bf16", action="store_true", help="torch.autocast(cpu, bfloat16)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers)
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.width)
    y = torch.randn(args.batch, args.width)
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                out = fwd(x)
            loss = nn.functional.mse_loss(out.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    flops = 3 * 2 * args.batch * args.width * args.width * args.layers
    s = _zoo.median(timer.steps_ms[args.warmup:])
    truth = {"flops_per_step": flops, "achieved_gflops": flops / s / 1e6,
             "dtype": "bf16" if args.bf16 else "fp32"}
    _zoo.finish("gemm_mlp", args, timer, truth,
                {"batch": args.batch, "bf16": args.bf16, "compile": args.compile,
                 "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
