"""A CPU training job of many small ops, with its own step timer and its analytic FLOPs.

The profiler's per-op cost is largest relative to the work here (hundreds of tiny ops per
step), so this is where traced steps are dilated most: the job under test for "the verdict
and MFU of the job as it runs unprofiled". It times every step itself (no profiler involved)
and writes those times and the analytic model FLOPs per step to ``--report FILE`` at exit.

    python small_ops_job.py --steps 60 --report own.json [--compete 11:16 --compete-kind slices]

``--compete FIRST:LAST`` runs another process on the job's CPU over those steps (``_compete``).
"""

import argparse
import json
import time

import torch
from _compete import Competitor

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--layers", type=int, default=24)
ap.add_argument("--width", type=int, default=128)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--compete", default="")
ap.add_argument("--compete-kind", default="cpu")
ap.add_argument("--report", required=True)
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)  # one core: the test machine's other core runs the tests and gpudiag
layers = []
for _ in range(args.layers):
    layers += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
model = torch.nn.Sequential(*layers)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(args.batch, args.width)
y = torch.randn(args.batch, args.width)

# Model FLOPs (matmuls only, the PaLM definition): forward 2*B*in*out per layer; backward
# 2*B*in*out for the weight gradient, and as much again for the input gradient except in the
# first layer, whose input needs none.
per_matmul = 2 * args.batch * args.width * args.width
flops_per_step = per_matmul * (3 * args.layers - 1)

own = []
with Competitor(Competitor.parse(args.compete), args.compete_kind) as competitor:
    for step in range(1, args.steps + 1):
        competitor.before(step)
        t = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        own.append(time.perf_counter() - t)
        competitor.after(step)

with open(args.report, "w") as f:
    json.dump({"flops_per_step": flops_per_step, "step_seconds": own}, f)
