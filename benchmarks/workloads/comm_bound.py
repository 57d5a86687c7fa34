"""Communication-bound: 2-rank data-parallel training over gloo of an embedding-heavy model.

A fastText-style bag-of-words classifier: an embedding table for a 128K-token vocabulary
(128,256 x 32 floats, 16 MB) feeding a small linear head. Forward and backward touch only
the 2,048 rows a batch uses (sparse gradient), but like DDP the job all-reduces a dense,
persistent gradient bucket the size of the whole table every step, after backward, so
communication is not overlapped with compute. The bucket and the update are in place (no
allocation per step), as in DDP with gradient_as_bucket_view: the step's memory work is
small next to moving 16 MB between the ranks.

    python -m torch.distributed.run --nproc_per_node 2 --master_port PORT \\
        benchmarks/workloads/comm_bound.py --profile-out DIR

writes DIR/rank-0.json.gz and DIR/rank-1.json.gz. Expected verdict: communication-bound.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import maybe_profile, parse_args
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, DIM, CLASSES = 128_256, 32, 8
BATCH, TOKENS = 32, 64  # per rank: 32 documents of 64 token ids


class BagOfWords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, DIM, mode="mean", sparse=True)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # one core per rank
    steps = args.steps
    g = torch.Generator().manual_seed(rank)  # each rank its own shard of the data
    tokens = torch.randint(0, VOCAB, (steps * BATCH, TOKENS), generator=g)
    labels = tokens[:, 0] % CLASSES
    loader = DataLoader(TensorDataset(tokens, labels), batch_size=BATCH)
    model = BagOfWords()
    for p in model.parameters():  # the same initial weights on every rank
        dist.broadcast(p.data, src=0)
    lr = 0.5
    params = list(model.parameters())
    buckets = [torch.zeros_like(p) for p in params]  # persistent dense gradient buckets
    loss_fn = nn.CrossEntropyLoss()
    loss = torch.tensor(float("nan"))
    with maybe_profile(args.profile_out) as prof:
        for xb, yb in loader:
            for p in params:
                p.grad = None
            loss = loss_fn(model(xb), yb)
            loss.backward()
            with torch.no_grad():
                for p, bucket in zip(params, buckets, strict=True):
                    bucket.zero_()
                    bucket.add_(p.grad)  # sparse rows into the dense bucket
                    dist.all_reduce(bucket)  # SUM; the mean is folded into the step size
                    p.add_(bucket, alpha=-lr / world)
            prof.step()
    if rank == 0:
        print(f"comm_bound: final loss {loss.item():.4f} ({world} ranks)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
