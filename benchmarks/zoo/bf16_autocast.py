"""Mixed precision: an MLP (3 x Linear(512, 512), batch 64) trained under
``torch.autocast("cpu", dtype=torch.bfloat16)``.

Whether bf16 pays depends on the CPU: where it has no bf16 arithmetic (AMX, AVX512-BF16) the
GEMMs convert and run slower than fp32. Truth: the step under bf16 autocast against the same
step in fp32 (``--no-bf16``), alternated; achieved FLOP/s from FLOPs counted by hand.
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--no-bf16", action="store_true", help="train in fp32 (no autocast)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10))
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_bf16):
                out = fwd(x)
            loss = nn.functional.cross_entropy(out.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    flops = 3 * 2 * args.batch * (args.width * args.width * args.layers + args.width * 10)
    s = _zoo.median(timer.steps_ms[args.warmup:])
    truth = {"flops_per_step": flops, "achieved_gflops": flops / s / 1e6,
             "dtype": "fp32" if args.no_bf16 else "bf16"}
    _zoo.finish("bf16_autocast", args, timer, truth,
                {"batch": args.batch, "bf16": not args.no_bf16, "compile": args.compile,
                 "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
