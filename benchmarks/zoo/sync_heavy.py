"""Sync-heavy: ``.item()``, ``.cpu()`` and ``.tolist()`` every few operators (per-layer logging).

A 24-block MLP (256 wide, batch 32) that, after every block, reads the activation's mean with
``.item()``, its largest magnitude with ``.cpu()`` and every other block a few values with
``.tolist()``, and the loss with ``.item()`` each step. On a GPU each call waits for the device;
on the CPU each is a reduction plus a copy out. Truth: the step with them against the step
with ``--no-syncs`` (the calls and the reductions they read removed), alternated.
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=1000, warmup=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--no-syncs", action="store_true",
                   help="remove the .item()/.cpu()/.tolist() calls (and what they read)")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    blocks = nn.ModuleList(
        nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU())
        for _ in range(args.blocks))
    head = nn.Linear(args.width, 1)
    run_blocks = [torch.compile(b) for b in blocks] if args.compile else list(blocks)
    opt = torch.optim.SGD(list(blocks.parameters()) + list(head.parameters()), lr=1e-3,
                          momentum=0.9, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.width)
    y = torch.randn(args.batch, 1)
    timer = _zoo.Timer()
    log: list[float] = []
    syncs_per_step = 0
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            h = x
            n = 0
            for i, b in enumerate(run_blocks):
                h = b(h)
                if not args.no_syncs:
                    log.append(h.mean().item())
                    log.append(float(h.abs().max().cpu()))
                    n += 2
                    if i % 2 == 0:
                        log.extend(h[0, :4].tolist())
                        n += 1
            loss = nn.functional.mse_loss(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if not args.no_syncs:
                log.append(loss.item())
                n += 1
            syncs_per_step = n
            if len(log) > 10000:
                log.clear()
    flops = 6 * args.batch * args.width * args.width * args.blocks
    truth = {"syncs_per_step": syncs_per_step, "flops_per_step": flops}
    _zoo.finish("sync_heavy", args, timer, truth,
                {"batch": args.batch, "no_syncs": args.no_syncs, "compile": args.compile,
                 "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
