"""A 2-rank gloo training job that all-reduces each gradient tensor by itself (no DDP): one
call per tensor, weights and biases of an MLP, each call paying gloo's fixed cost.

    torchrun --standalone --nproc_per_node=2 allreduce_job.py --steps 30 --report own.json [--flat]

``--flat`` applies the fix: the gradients flattened into one buffer, all-reduced once, copied
back. Rank 0 writes the job's own step times (``_timer.OwnTimer``) to ``--report``.
"""

import argparse

import torch
import torch.distributed as dist
from _timer import OwnTimer
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--layers", type=int, default=16)
ap.add_argument("--width", type=int, default=128)
ap.add_argument("--flat", action="store_true")
ap.add_argument("--report", required=True)
args = ap.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(16, args.width), torch.randn(16, args.width)
timer = OwnTimer()
for _ in range(args.steps):
    torch.nn.functional.mse_loss(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    if args.flat:
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        for g, r in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(r)
    else:
        for g in grads:
            dist.all_reduce(g)
    opt.step()
    opt.zero_grad()
    timer.lap()
dist.barrier()
if dist.get_rank() == 0:
    timer.write(args.report)
dist.destroy_process_group()
