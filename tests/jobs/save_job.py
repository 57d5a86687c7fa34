"""A training job that checkpoints its model and optimizer with ``torch.save`` every few steps,
on the training thread, timing each save itself (``save_seconds`` in its ``--report``).
``--durable`` checkpoints as a careful job does: into an open file, flushed and fsync-ed, then
read back and checksummed; ``save_seconds`` is then the whole checkpoint and ``call_seconds``
its torch.save alone.

    python save_job.py --steps 40 --every 4 --out /tmp/ckpt.pt --report own.json [--durable]
"""

import argparse
import hashlib
import os
import time

import torch
from _timer import OwnTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--every", type=int, default=4)
ap.add_argument("--width", type=int, default=1024)
ap.add_argument("--out", required=True)
ap.add_argument("--report", required=True)
ap.add_argument("--durable", action="store_true")
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                            torch.nn.Linear(args.width, args.width))
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
x = torch.randn(32, args.width)
own = OwnTimer()
saves, calls = [], []


def checkpoint() -> None:
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
    if not args.durable:
        torch.save(state, args.out)
        return
    with open(args.out, "wb") as f:
        t = time.perf_counter()
        torch.save(state, f)
        calls.append(time.perf_counter() - t)
        f.flush()
        os.fsync(f.fileno())
    with open(args.out, "rb") as f:
        hashlib.sha256(f.read()).hexdigest()


for step in range(1, args.steps + 1):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    if step % args.every == 0:
        t = time.perf_counter()
        checkpoint()
        saves.append(time.perf_counter() - t)
    own.lap()
own.write(args.report, save_seconds=saves, call_seconds=calls)
