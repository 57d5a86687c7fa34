"""Communication-heavy: DDP over gloo, 2 ranks on this machine, ~100 MB of fp32 gradients.

Launch with ``torchrun --nproc_per_node 2 ddp_comm.py``. A 25M-parameter MLP on a small batch:
little compute per step, one 100 MB all-reduce of the gradients. Truth: the step against the
same step with every all-reduce skipped (``--no-sync-all``: every step under ``no_sync()``),
alternated; and, in an ``--accumulate K`` run, the steps under ``no_sync()`` beside the steps
that all-reduce. Every micro-batch is one timed step (same work each), so runs with and
without accumulation compare per batch; the mean over steps is the throughput.
"""

from __future__ import annotations

import contextlib
import os

import _zoo
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    p = _zoo.parser(__doc__, steps=80, warmup=4)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--accumulate", type=int, default=1,
                   help="all-reduce every K batches: the first K-1 under no_sync()")
    p.add_argument("--no-sync-all", action="store_true",
                   help="never all-reduce (every step under no_sync): the truth's baseline")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--compress", choices=["none", "fp16"], default="none",
                   help="DDP communication hook that all-reduces the gradients in fp16 "
                        "(torch's bf16 hook needs NCCL)")
    p.set_defaults(threads=1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    d = 4096
    model = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d // 2), nn.ReLU(),
                          nn.Linear(d // 2, 10))
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    if args.compress != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as hooks

        ddp.register_comm_hook(None, hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4, momentum=0.9, foreach=args.foreach or None)
    x = torch.randn(args.batch, d)
    y = torch.randint(0, 10, (args.batch,))
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
    flops = 6 * args.batch * params
    keep = range(args.warmup, len(timer.steps_ms))
    by_kind: dict[str, list[float]] = {}
    for j in keep:
        by_kind.setdefault(timer.kinds[j], []).append(timer.steps_ms[j])
    truth = {"grad_mb": params * 4 / 2**20, "flops_per_step_per_rank": flops,
             "median_by_kind_ms": {kk: _zoo.median(v) for kk, v in by_kind.items()},
             "world": dist.get_world_size()}
    if rank == 0:
        _zoo.finish("ddp_comm", args, timer, truth,
                    {"batch": args.batch, "accumulate": k, "no_sync_all": args.no_sync_all,
                     "bucket_cap_mb": args.bucket_cap_mb, "compress": args.compress,
                     "threads": threads, "world": dist.get_world_size(),
                     "rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", 0))})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
