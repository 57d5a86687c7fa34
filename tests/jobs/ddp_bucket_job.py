"""Data-parallel training over gloo (run under torchrun), with its own step timer: the
communication-bound job of "predicted vs applied" (a smaller ``--bucket-mb`` applies the fix).

    torchrun --nproc_per_node 2 ddp_bucket_job.py --bucket-mb 64 --report own.json

With one bucket larger than the model, DDP all-reduces every gradient after backward ends: the
step waits for all of it. Smaller buckets start while backward still runs.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--bucket-mb", type=float, default=64)
ap.add_argument("--layers", type=int, default=6)
ap.add_argument("--width", type=int, default=1024)
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--report", required=True)
args = ap.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
layers = []
for _ in range(args.layers):
    layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers),
                                                  bucket_cap_mb=args.bucket_mb)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(args.batch, args.width)
own = []
t = time.perf_counter()
for _ in range(args.steps):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    now = time.perf_counter()
    own.append(now - t)
    t = now
if dist.get_rank() == 0:
    with open(args.report, "w") as f:
        json.dump({"step_seconds": own}, f)
dist.destroy_process_group()
