"""Compute-bound in float64 by accident: the data come from numpy (float64), so the model was
made ``.double()`` to match, 4 x Linear(1024, 1024) + ReLU, batch 128, SGD with momentum.

Every GEMM runs in fp64, at about half this CPU's fp32 rate. Truth: FLOPs counted by hand over
the step against the measured fp64 GEMM peak. Knobs: ``--fp32`` (the data cast once and the
model in float32: the fix), ``--bf16`` (autocast bf16 on the fp32 model).
"""

from __future__ import annotations

import _zoo
import numpy as np
import torch
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=30, warmup=4)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--fp32", action="store_true", help="float32 data and model")
    p.add_argument("--bf16", action="store_true", help="float32 model under bf16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    w = args.width
    x_np = rng.standard_normal((args.batch, w))          # float64, as numpy makes it
    y = torch.from_numpy(rng.integers(0, 10, args.batch))
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(w, w), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(w, 10))
    low = args.fp32 or args.bf16
    if low:
        x = torch.from_numpy(x_np).float()
    else:
        model = model.double()
        x = torch.from_numpy(x_np)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9,
                          foreach=args.foreach or None)
    fwd = torch.compile(model) if args.compile else model
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss = nn.functional.cross_entropy(fwd(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    flops = 6 * args.batch * (args.layers * w * w + w * 10)
    dtype = "bf16" if args.bf16 else "fp32" if args.fp32 else "fp64"
    truth = {"flops_per_step": flops, "dtype": dtype}
    _zoo.finish("fp64_mlp", args, timer, truth,
                {"batch": args.batch, "dtype": dtype, "compile": args.compile, "threads": threads})


if __name__ == "__main__":
    main()
