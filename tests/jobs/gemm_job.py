"""A compute-bound training job of large GEMMs, with its own step timer and its analytic FLOPs;
optionally in bf16 (autocast) or float64 (the model and input in double), and optionally slowed
by a competing process in its first steps.

    python gemm_job.py --steps 80 --report own.json [--dtype bf16|fp64] [--compete-steps 40]

``--compete-steps N`` runs a process that spins on the same CPU as the job (``_compete``) until
step N ends: the job runs about half as fast while it lives, as it would beside another
tenant's work that then finishes. The report has the job's own step times and
its model FLOPs per step (matmuls only: forward 2*B*in*out per layer; backward the same for the
weight gradient, and again for the input gradient except in the first layer).
"""

import argparse
import os

import torch
from _compete import Competitor
from _timer import OwnTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=80)
ap.add_argument("--layers", type=int, default=3)
ap.add_argument("--width", type=int, default=1024)
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--dtype", choices=["fp32", "bf16", "fp64"], default="fp32")
ap.add_argument("--compete-steps", type=int, default=0)
ap.add_argument("--report", required=True)
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # quiet or not, on one CPU
competitor = Competitor(Competitor.parse(f"1:{args.compete_steps}" if args.compete_steps else ""))
model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-5)
x = torch.randn(args.batch, args.width)
if args.dtype == "fp64":
    model, x = model.double(), x.double()
per_matmul = 2 * args.batch * args.width * args.width
flops_per_step = per_matmul * (3 * args.layers - 1)

with competitor:
    own = OwnTimer()
    for i in range(args.steps):
        competitor.before(i + 1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        own.lap()
        competitor.after(i + 1)
own.write(args.report, flops_per_step=flops_per_step, compete_steps=args.compete_steps)
