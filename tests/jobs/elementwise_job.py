"""A training loop with no matmul: an elementwise affine map with a ReLU over a big feature map
(the memory-bound workload of benchmarks/workloads/memory_bound.py, smaller), so gpudiag can
label it but has no FLOPs to base an MFU on. Runs until ``--until FILE`` exists (or --steps).

    python elementwise_job.py --numel 2000000 --until /tmp/stop
"""

import argparse
import os
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--numel", type=int, default=2_000_000)
ap.add_argument("--steps", type=int, default=10**9)
ap.add_argument("--until", default="", help="stop once this file exists")
ap.add_argument("--sleep", type=float, default=0.0)
args = ap.parse_args()

scale = torch.nn.Parameter(torch.ones(args.numel))
shift = torch.nn.Parameter(torch.zeros(args.numel))
opt = torch.optim.SGD([scale, shift], lr=0.1)
x = torch.randn(args.numel)
target = x * 2 + 1
step = 0
while step < args.steps and not (args.until and os.path.exists(args.until)):
    time.sleep(args.sleep)
    loss = torch.nn.functional.mse_loss(torch.relu(x * scale + shift) + x, target)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    step += 1
print(f"elementwise_job: {step} steps, loss {loss.item():.4f}", flush=True)
