"""Memory-bound by irregular access: two rounds of graph message passing written with
``index_select`` and ``index_add_`` (a GNN without a graph library): 50k nodes, 200k random
edges, 32 features, each round gathering the source rows, scaling them by an edge weight,
summing them into the destinations, then Linear(32, 32) + ReLU; SGD.

Each round moves 200k x 32 x 4 bytes (26 MB) several times through random gathers and scatter-adds forward,
and as much again backward; the FLOPs are few. Truth: bytes counted by hand (each gather and
scatter's rows read and written, forward and backward) against the measured copy bandwidth;
the rest counted memory (gathers and scatters run below copy bandwidth). Knobs: ``--sorted``
(edges sorted by destination, then source: the same sums with local access), ``--compile``.
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


class Round(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, h, src, dst, ew):
        msg = h.index_select(0, src) * ew[:, None]
        agg = torch.zeros_like(h).index_add_(0, dst, msg)
        return torch.relu(self.lin(agg + h))


class Net(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.r1, self.r2 = Round(d), Round(d)
        self.out = nn.Linear(d, 4)

    def forward(self, h, src, dst, ew):
        return self.out(self.r2(self.r1(h, src, dst, ew), src, dst, ew))


def main() -> None:
    p = _zoo.parser(__doc__, steps=20, warmup=3)
    p.add_argument("--nodes", type=int, default=50_000)
    p.add_argument("--edges", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--sorted", action="store_true", help="edges sorted by (dst, src)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    n, e, d = args.nodes, args.edges, args.dim
    src = torch.randint(0, n, (e,))
    dst = torch.randint(0, n, (e,))
    if args.sorted:
        order = torch.argsort(dst * n + src)
        src, dst = src[order], dst[order]
    ew = torch.rand(e)
    h0 = torch.randn(n, d)
    y = torch.randint(0, 4, (n,))
    model = Net(d)
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, foreach=args.foreach or None)
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            loss = nn.functional.cross_entropy(fwd(h0, src, dst, ew), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    row = d * 4
    # per round, forward: gather (read E rows, write E rows), scale (read+write E rows),
    # scatter-add (read E rows, read+write their destinations: 2E rows), zeros (N rows),
    # add/linear/relu (~6 N rows). Backward: about the same again for the edge work (the
    # gather's backward is a scatter-add and the scatter's a gather) plus the scale's
    # gradient (2E rows). Two rounds.
    per_round_fwd = (2 * e + 2 * e + 3 * e + 7 * n) * row
    per_round_bwd = (2 * e + 2 * e + 3 * e + 2 * e + 7 * n) * row
    bytes_ = 2 * (per_round_fwd + per_round_bwd)
    flops = 2 * (6 * n * d * d + 3 * e * d)
    truth = {"bytes_per_step": bytes_, "flops_per_step": flops}
    _zoo.finish("gnn_scatter", args, timer, truth,
                {"nodes": n, "edges": e, "sorted": args.sorted, "compile": args.compile,
                 "threads": threads})


if __name__ == "__main__":
    main()
