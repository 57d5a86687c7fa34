"""DDP over gloo, 2 ranks, large gradients and little compute: 16 x Linear(1024, 1024)
(16.8M parameters, 64 MB of fp32 gradients in 3 buckets) on a batch of 1 a rank, 1 thread a
rank; gradients kept allocated as views of DDP's buckets (no copy).

Each step's forward and backward are ~0.1 GFLOP a rank; the all-reduce of 64 MB over gloo on
one machine is the step. Truth: the step against the same step with every all-reduce skipped
(``--no-sync-all``), alternated. Every micro-batch is one timed step (same work each), so
runs with and without ``--accumulate K`` compare per batch (mean step).
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
    p.add_argument("--batch", type=int, default=1, help="per rank")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=16)
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
    w = args.width
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(w, w), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(w, 10))
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb,
                                  gradient_as_bucket_view=True)
    if args.compress != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as hooks

        ddp.register_comm_hook(None, hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4, foreach=args.foreach or None)
    g = torch.Generator().manual_seed(args.seed + rank)
    x = torch.randn(args.batch, w, generator=g)
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
                opt.zero_grad(set_to_none=False)
    params = sum(q.numel() for q in model.parameters())
    keep = range(args.warmup, len(timer.steps_ms))
    by_kind: dict[str, list[float]] = {}
    for j in keep:
        by_kind.setdefault(timer.kinds[j], []).append(timer.steps_ms[j])
    truth = {"grad_mb": params * 4 / 2**20, "flops_per_step_per_rank": 6 * args.batch * params,
             "median_by_kind_ms": {kk: _zoo.median(v) for kk, v in by_kind.items()},
             "world": dist.get_world_size()}
    if rank == 0:
        _zoo.finish("ddp_bigrad", args, timer, truth,
                    {"batch": args.batch, "accumulate": k, "no_sync_all": args.no_sync_all,
                     "bucket_cap_mb": args.bucket_cap_mb, "compress": args.compress,
                     "threads": threads, "world": dist.get_world_size()})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
