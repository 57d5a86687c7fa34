"""A compute-bound fp32 training job of large GEMMs, with its own step timer and its analytic
FLOPs; the mixed-precision case of "predicted vs applied" (``--phases``: the "a" steps run under
``torch.autocast('cpu', dtype=torch.bfloat16)``, as a user would apply the advice).

    python autocast_job.py --steps 40 --report own.json
    python autocast_job.py --phases b12,a6 --steps 54 --report own.json

Whether bf16 is faster depends on the CPU: with AMX or AVX512_BF16 its GEMMs run several times
faster than fp32, without them (most AMD EPYCs before Zen 4) several times slower.
"""

import argparse

import torch
from _phases import schedule
from _timer import OwnTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--layers", type=int, default=3)
ap.add_argument("--width", type=int, default=2048)
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--phases", default="b1")
ap.add_argument("--report", required=True)
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(args.threads)
layers = []
for _ in range(args.layers):
    layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers)
opt = torch.optim.SGD(model.parameters(), lr=1e-5)
x = torch.randn(args.batch, args.width)
plan = schedule(args.phases, args.steps)
flops_per_step = 2 * args.batch * args.width * args.width * (3 * args.layers - 1)
own = OwnTimer()
for phase in plan:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=phase == "a"):
        loss = model(x).float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    own.lap()
own.write(args.report, phases=plan, flops_per_step=flops_per_step)
