"""A steady distributed training job for the stall watch's cost: every step the same compute,
a blocking all_reduce of a gradient bucket and a small broadcast (under torchrun; gloo on the
CPU, NCCL on a GPU with --backend nccl). Rank 0 writes its own step timer to --report.

    torchrun --nproc_per_node 2 benchmarks/workloads/steady_collectives.py --steps 300 --report t.json
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--warmup", type=int, default=20, help="steps left out of the reported median")
ap.add_argument("--width", type=int, default=512)
ap.add_argument("--numel", type=int, default=256 * 1024, help="elements all-reduced per step")
ap.add_argument("--backend", default="gloo")
ap.add_argument("--report", default=None)
args = ap.parse_args()

dist.init_process_group(args.backend)
local = int(os.environ.get("LOCAL_RANK", 0))
dev = torch.device(f"cuda:{local}") if args.backend == "nccl" else torch.device("cpu")
if dev.type == "cuda":
    torch.cuda.set_device(dev)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                            torch.nn.Linear(args.width, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, args.width, device=dev)
y = torch.randint(0, 10, (64,), device=dev)
bucket = torch.ones(args.numel, device=dev)
state = torch.zeros(16, device=dev)
times = []
t = time.perf_counter()
for _ in range(args.steps):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    dist.all_reduce(bucket)
    dist.broadcast(state, 0)
    opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    now = time.perf_counter()
    times.append(now - t)
    t = now
if dist.get_rank() == 0 and args.report:
    with open(args.report, "w") as f:
        json.dump({"median_step_s": statistics.median(times[args.warmup:]), "steps": len(times)}, f)
dist.barrier()
dist.destroy_process_group()
