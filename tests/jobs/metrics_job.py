"""A CPU training job with a hand-rolled metrics logger: every step it reads each parameter's
norm with ``.item()`` and a 64-bin histogram of each weight with ``.tolist()``, and writes them
as one JSON line. The ``histc`` and ``norm`` operators run only to feed those reads.

    python metrics_job.py --steps 40 --report own.json [--log-every 0]

``--log-every 0`` applies the fix (no logging). The report holds the job's own step times
(``_timer.OwnTimer``) and the logging's own time per step.
"""

import argparse
import json
import os
import tempfile
import time

import torch
from _timer import OwnTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--log-every", type=int, default=1)
ap.add_argument("--report", required=True)
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(*[torch.nn.Linear(384, 384) for _ in range(4)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 384), torch.randn(32, 384)
timer, logged = OwnTimer(), []
with tempfile.TemporaryFile("w") as log:
    for step in range(1, args.steps + 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        t = time.perf_counter()
        if args.log_every and step % args.log_every == 0:
            rec = {"step": step, "loss": loss.item()}
            for name, p in model.named_parameters():
                rec[name] = {"norm": p.detach().norm().item(),
                             "hist": torch.histc(p.detach(), bins=64).tolist()}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            os.fsync(log.fileno())
        logged.append(time.perf_counter() - t)
        opt.zero_grad()
        timer.lap()
timer.write(args.report, log_seconds=logged)
