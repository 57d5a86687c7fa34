"""Host-bound by launch overhead: gradient accumulation of 32 micro-batches of 4 samples per
optimizer step (an effective batch of 128) through a 4-layer MLP (256 wide), Adam.

Each micro-batch pays the full forward/backward operator overhead for 4 rows of work. One
timed step is one optimizer step (32 micro-batches). Truth: the same effective batch in
larger micro-batches (``--micro 32``: 4 per step; ``--micro 128``: 1), alternated: the share
the small micro-batches cost is 1 - (step at --micro 128) / step.
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=30, warmup=3)
    p.add_argument("--global-batch", type=int, default=128, help="samples per optimizer step")
    p.add_argument("--micro", type=int, default=4, help="samples per micro-batch")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)  # one intra-op thread: see the held-out-2 README section
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    w = args.width
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(w, w), nn.LayerNorm(w), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(w, 10))
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=args.foreach or None)
    n_micro = max(args.global_batch // args.micro, 1)
    xs = torch.randn(n_micro, args.micro, w)
    ys = torch.randint(0, 10, (n_micro, args.micro))
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            opt.zero_grad(set_to_none=True)
            for m in range(n_micro):
                loss = nn.functional.cross_entropy(fwd(xs[m]), ys[m]) / n_micro
                loss.backward()
            opt.step()
    flops = 6 * args.global_batch * (args.layers * w * w + w * 10)
    truth = {"flops_per_step": flops, "micro_batches": n_micro}
    _zoo.finish("grad_accum", args, timer, truth,
                {"micro": args.micro, "global_batch": args.global_batch,
                 "compile": args.compile, "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
