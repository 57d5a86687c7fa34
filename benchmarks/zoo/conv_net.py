"""Compute-bound convolutions: four 3x3 convolutions of 64 channels on 32x32 images, batch 32.

Truth: achieved FLOP/s from FLOPs counted by hand (2*Cin*Cout*9*H*W per image per convolution,
three times per step for forward and backward) against the runner's measured fp32 GEMM peak.
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--bf16", action="store_true", help="torch.autocast(cpu, bfloat16)")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    c = args.channels
    layers: list[nn.Module] = [nn.Conv2d(3, c, 3, padding=1), nn.ReLU()]
    for _ in range(args.layers):
        layers += [nn.Conv2d(c, c, 3, padding=1), nn.ReLU()]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))
    x = torch.randn(args.batch, 3, 32, 32)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=args.foreach or None)
    y = torch.randint(0, 10, (args.batch,))
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                out = fwd(x)
            loss = nn.functional.cross_entropy(out.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    hw = 32 * 32
    fwd_flops = args.batch * hw * 2 * 9 * (3 * c + args.layers * c * c)
    # The first convolution's input needs no gradient: its backward is one GEMM, not two.
    flops = 3 * fwd_flops - args.batch * hw * 2 * 9 * 3 * c
    s = _zoo.median(timer.steps_ms[args.warmup:])
    truth = {"flops_per_step": flops, "achieved_gflops": flops / s / 1e6,
             "dtype": "bf16" if args.bf16 else "fp32"}
    _zoo.finish("conv_net", args, timer, truth,
                {"batch": args.batch, "bf16": args.bf16, "channels_last": args.channels_last,
                 "compile": args.compile, "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
