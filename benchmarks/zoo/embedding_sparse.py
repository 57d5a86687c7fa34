"""Embedding/sparse: an EmbeddingBag of 2M rows x 64 with sparse gradients, and a small MLP.

Each step gathers 4096 bags of 32 random rows (8 MB of scattered reads), and the optimizer
updates only the rows touched (sparse gradient, SGD). ``--dense`` makes the gradient dense:
the whole 512 MB table is updated each step. Truth: the step against its work: 4x the bags
(``--batch 16384``) and, alternated, the step with a dense gradient.
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=150, warmup=5)
    p.add_argument("--batch", type=int, default=4096, help="bags per step")
    p.add_argument("--bag", type=int, default=32, help="rows per bag")
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dense", action="store_true", help="dense gradient for the table")
    p.add_argument("--compile", action="store_true", help="torch.compile the MLP")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    emb = nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=not args.dense)
    mlp = nn.Sequential(nn.Linear(args.dim, 256), nn.ReLU(), nn.Linear(256, 1))
    mlp_run = torch.compile(mlp) if args.compile else mlp
    opt = torch.optim.SGD(list(emb.parameters()) + list(mlp.parameters()), lr=0.01,
                          foreach=args.foreach or None)
    g = torch.Generator().manual_seed(args.seed)
    batches = [torch.randint(0, args.rows, (args.batch, args.bag), generator=g)
               for _ in range(8)]
    y = torch.rand(args.batch, 1)
    timer = _zoo.Timer()
    for i in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            out = mlp_run(emb(batches[i % len(batches)]))
            loss = nn.functional.binary_cross_entropy_with_logits(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    gathered = args.batch * args.bag * args.dim * 4
    truth = {"gathered_bytes_per_step": gathered, "table_mb": args.rows * args.dim * 4 / 2**20,
             "flops_per_step": 6 * args.batch * (args.dim * 256 + 256)}
    _zoo.finish("embedding_sparse", args, timer, truth,
                {"batch": args.batch, "dense": args.dense, "compile": args.compile,
                 "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
