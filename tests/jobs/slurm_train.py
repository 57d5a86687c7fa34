"""A CPU training job for the Slurm tests: input-bound or compute-bound, checkpoints on SIGTERM.

    python slurm_train.py --kind input --ckpt ck.json --events ev.jsonl --seconds 600
    python slurm_train.py --kind compute ...

``--kind input`` feeds a small model through a single-process DataLoader whose samples are slow
to produce (gpudiag labels it input-bound, at a low MFU); ``--kind compute`` runs wide fp32
matmuls with data already in memory. On SIGTERM (what ``scontrol requeue`` and Slurm's
preemption send first) the job saves its step to ``--ckpt`` at the next step boundary, then
keeps appending ``alive`` events until it is killed, so a test sees when the checkpoint was
written and how long the job really lived after SIGTERM (the grace it got). A restarted job
(Slurm requeue) resumes from the checkpoint. Every event is one JSON line in ``--events``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset

ap = argparse.ArgumentParser()
ap.add_argument("--kind", choices=("input", "compute"), required=True)
ap.add_argument("--ckpt", required=True)
ap.add_argument("--events", required=True)
ap.add_argument("--seconds", type=float, default=600.0, help="train this long, then exit 0")
args = ap.parse_args()

torch.set_num_threads(1)   # the test VM has two cores shared by several jobs
term_at: list[float] = []


def event(kind: str, **kw: object) -> None:
    with open(args.events, "a") as f:
        f.write(json.dumps({"event": kind, "t": time.time(), "pid": os.getpid(),
                            "slurm_job": os.environ.get("SLURM_JOB_ID"),
                            "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0")), **kw}) + "\n")


signal.signal(signal.SIGTERM, lambda *_: term_at.append(time.time()) if not term_at else None)


class SlowSamples(Dataset):
    """Samples that take a few ms each to "decode": the step waits in DataLoader.__next__."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.004)
        return torch.randn(64), torch.randn(1)


start_step = 0
if os.path.exists(args.ckpt):
    with open(args.ckpt) as f:
        start_step = json.load(f)["step"]
event("start", step=start_step)

if args.kind == "input":
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    batches = iter(DataLoader(SlowSamples(), batch_size=16, num_workers=0))
else:
    # large enough that the step (~20 ms) dwarfs the profiler's cost per event: at 512 x 256 a
    # 5.6 ms step, slowed 1.6x traced, read host-bound beside the suite's load (a CI run, its
    # controller then gave the efficient key a nice)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
    x, y = torch.randn(512, 1024), torch.randn(512, 1)
    batches = iter(lambda: (x, y), None)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
t0 = time.time()
step = start_step
while time.time() - t0 < args.seconds:
    if term_at:
        tmp = args.ckpt + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step}, f)
        os.replace(tmp, args.ckpt)
        event("checkpointed", step=step, term_at=term_at[0])
        while True:   # until SIGKILL: how long after SIGTERM this process lived
            event("alive")
            time.sleep(0.2)
    xb, yb = next(batches)
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    opt.step()
    opt.zero_grad()
    step += 1
event("done", step=step)
