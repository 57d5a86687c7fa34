"""A job whose optimizer's temporaries glibc maps afresh and faults in every step.

    python alloc_job.py --steps 60 --report own.json

Four Linear(768, 768) layers, batch 32, torch.optim.Adam at its CPU defaults (one tensor at a
time): each step frees and allocates temporaries of 2.4 MB (a 768 x 768 fp32 tensor), above
glibc's 128 kB mmap threshold. By default glibc unmaps them on free and the next step faults
their pages in again; with ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` set high
they stay in the heap. On the 2-core AMD EPYC VM (2026-11-29): 15.7-17.7 ms mean step (steps of
12 to 24 ms: glibc's threshold moves as blocks are freed) by default, 12.1-12.6 ms with the
thresholds set. ``--width 3072``: temporaries of 38 MB, above the 32 MB glibc's threshold can
rise to, fault in every step, however the heap stands (4 layers: 459 ms against 202 ms).
"""

import argparse

import torch
from _timer import OwnTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--width", type=int, default=768)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--report", default=None)
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
opt = torch.optim.Adam(model.parameters())
x = torch.randn(args.batch, args.width)
timer = OwnTimer()
for _ in range(args.steps):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    timer.lap()
if args.report:
    timer.write(args.report)
