"""A 2-rank gloo job whose all_reduce dominates each step (run under torchrun)."""

import argparse

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--numel", type=int, default=8 * 1024 * 1024)
args = ap.parse_args()

dist.init_process_group("gloo")
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
grad_bucket = torch.ones(args.numel)
for _ in range(args.steps):
    model(torch.randn(16, 64)).sum().backward()
    dist.all_reduce(grad_bucket)  # a 32 MB "gradient bucket": the step's real cost
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
print(f"rank {dist.get_rank() if dist.is_initialized() else '?'} done", flush=True)
