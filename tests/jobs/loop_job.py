"""A small CPU training loop for profile tests: runs N steps (or forever), then exits with a code.

    python loop_job.py --steps 20 --exit-code 3
    python loop_job.py --forever            # until killed
    python loop_job.py --no-optimizer       # steps marked with gpudiag.step()
"""

import argparse
import sys
import time

import torch
from _timer import start_gate

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--forever", action="store_true")
ap.add_argument("--exit-code", type=int, default=0)
ap.add_argument("--sleep", type=float, default=0.0, help="seconds of fake input wait per step")
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--no-optimizer", action="store_true")
ap.add_argument("--echo-stdin", action="store_true")
args = ap.parse_args()

if args.echo_stdin:
    print(f"stdin: {sys.stdin.readline().strip()}", flush=True)

model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(args.batch, 256)
y = torch.randn(args.batch, 1)
start_gate()
step = 0
while args.forever or step < args.steps:
    time.sleep(args.sleep)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    if args.no_optimizer:
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
        import gpudiag

        gpudiag.step()
    else:
        opt.step()
        opt.zero_grad()
    step += 1
    print(f"step {step}", flush=True)
sys.exit(args.exit_code)
