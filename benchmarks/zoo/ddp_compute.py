"""DDP over gloo, 2 ranks, small gradients and much compute: a 4-layer CNN (32 channels, 0.03M
parameters: ~0.1 MB of gradients) on 32x32 images, batch 8 a rank, 1 thread a rank.

The all-reduce of ~0.1 MB is tiny beside each rank's convolutions, so the job is compute-bound
and no communication fix can help. Truth: the step against the same step with every
all-reduce skipped (``--no-sync-all``), alternated; FLOPs counted by hand a rank.
"""

from __future__ import annotations

import contextlib

import _zoo
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    p = _zoo.parser(__doc__, steps=40, warmup=4)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--accumulate", type=int, default=1,
                   help="all-reduce every K batches: the first K-1 under no_sync()")
    p.add_argument("--no-sync-all", action="store_true",
                   help="never all-reduce (every step under no_sync): the truth's baseline")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--compress", choices=["none", "fp16"], default="none",
                   help="DDP fp16 compression hook")
    p.set_defaults(threads=1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    c, s = 32, args.size
    model = nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU(),
        nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    if args.compress != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as hooks

        ddp.register_comm_hook(None, hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9, foreach=args.foreach or None)
    g = torch.Generator().manual_seed(args.seed + rank)
    x = torch.randn(args.batch, 3, s, s, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    timer = _zoo.Timer()
    k = max(args.accumulate, 1)
    for i in range(args.steps):  # no --max-seconds guard: the ranks must agree on the count
        last = (i + 1) % k == 0
        skip = args.no_sync_all or not last
        with timer.step("no_sync" if skip else "sync"):
            ctx = ddp.no_sync() if skip else contextlib.nullcontext()
            with ctx:
                loss = nn.functional.cross_entropy(ddp(x), y) / k
                loss.backward()
            if last:
                opt.step()
                opt.zero_grad(set_to_none=True)
    params = sum(q.numel() for q in model.parameters())
    flops = 3 * args.batch * 2 * 9 * c * s * s * (3 + 3 * c)
    truth = {"grad_mb": params * 4 / 2**20, "flops_per_step_per_rank": flops,
             "world": dist.get_world_size()}
    if rank == 0:
        _zoo.finish("ddp_compute", args, timer, truth,
                    {"batch": args.batch, "accumulate": k, "no_sync_all": args.no_sync_all,
                     "bucket_cap_mb": args.bucket_cap_mb, "compress": args.compress,
                     "threads": threads, "world": dist.get_world_size()})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
