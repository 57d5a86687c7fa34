"""A steady CPU training job for overhead measurements: an MLP on synthetic batches.

    python benchmarks/workloads/steady_train.py --steps 400

Each step does the same work (fixed shapes, no I/O), so plain and profiled runs can be
compared step for step.
"""

import argparse

import torch
from own_timer import StepTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=400)
ap.add_argument("--width", type=int, default=1024)
args = ap.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
    torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
    torch.nn.Linear(args.width, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(128, args.width)
y = torch.randint(0, 10, (128,))
timer = StepTimer()
for _ in range(args.steps):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    timer.tick()
timer.report(f"steady_train (loss {loss.item():.3f})")
