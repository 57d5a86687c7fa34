"""Communication by hand, without DDP: 2 ranks over gloo, 48 x Linear(384, 384) + ReLU
(7.1M parameters, 27 MB of fp32 gradients in 98 tensors), batch 2 a rank, 1 thread a rank;
after the whole backward each gradient is all-reduced by ``dist.all_reduce``, one blocking call
per tensor, then averaged (the loop many hand-written data-parallel scripts start as).

Nothing overlaps: every all-reduce waits after the backward. Truth: the step against the same
step with every all-reduce skipped (``--no-sync-all``), alternated (mean step). Knobs:
``--flat`` (the gradients in one flat buffer, one all-reduce), ``--accumulate K``
(all-reduce every K micro-batches, gradients summed locally between: each micro-batch a timed
step), ``--compress fp16`` (the gradients sent as fp16).
"""

from __future__ import annotations

import _zoo
import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=30, warmup=4)
    p.add_argument("--batch", type=int, default=2, help="per rank")
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--accumulate", type=int, default=1,
                   help="all-reduce every K micro-batches (gradients summed locally between)")
    p.add_argument("--no-sync-all", action="store_true",
                   help="never all-reduce: the truth's baseline")
    p.add_argument("--flat", action="store_true", help="one all-reduce of a flat buffer")
    p.add_argument("--compress", choices=["none", "fp16"], default="none")
    p.set_defaults(threads=1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    w = args.width
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(w, w), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(w, 10))
    for q in model.parameters():  # same start on every rank
        dist.broadcast(q.data, 0)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=args.foreach or None)
    g = torch.Generator().manual_seed(args.seed + rank)
    x = torch.randn(args.batch, w, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    k = max(args.accumulate, 1)

    def all_reduce_grads() -> None:
        grads = [q.grad for q in params]
        if args.flat:
            flat = torch.cat([gr.reshape(-1) for gr in grads])
            bufs = [flat]
        else:
            bufs = grads
        for b in bufs:
            if args.compress == "fp16":
                h = b.half()
                dist.all_reduce(h)
                b.copy_(h)
            else:
                dist.all_reduce(b)
            b.div_(world)
        if args.flat:
            off = 0
            for gr in grads:
                n = gr.numel()
                gr.copy_(flat[off:off + n].view_as(gr))
                off += n

    timer = _zoo.Timer()
    for i in range(args.steps):  # no --max-seconds guard: the ranks must agree on the count
        last = (i + 1) % k == 0
        with timer.step("sync" if last and not args.no_sync_all else "local"):
            loss = nn.functional.cross_entropy(model(x), y) / k
            loss.backward()
            if last:
                if not args.no_sync_all:
                    with timer.part("all_reduce"):
                        all_reduce_grads()
                opt.step()
                opt.zero_grad(set_to_none=True)
    n_params = sum(q.numel() for q in params)
    truth = {"grad_mb": n_params * 4 / 2**20, "grad_tensors": len(params),
             "flops_per_step_per_rank": 6 * args.batch * n_params, "world": world}
    if rank == 0:
        _zoo.finish("allreduce_manual", args, timer, truth,
                    {"batch": args.batch, "accumulate": k, "no_sync_all": args.no_sync_all,
                     "flat": args.flat, "compress": args.compress, "threads": threads,
                     "world": world})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
