"""Data-parallel training over gloo (run under torchrun), with its own step timer: the
communication-bound job of "predicted vs applied" (a smaller ``--bucket-mb`` applies the fix).

    torchrun --nproc_per_node 2 ddp_bucket_job.py --bucket-mb 64 --report own.json
    torchrun ... ddp_bucket_job.py --bucket-mb 256 --fixed-bucket-mb 1 --phases b40,a20 ...

With one bucket larger than the model, DDP all-reduces every gradient after backward ends: the
step waits for all of it. Smaller buckets start while backward still runs.

Hiding communication behind compute needs somewhere for it to run: on a GPU node the kernels
leave the host's cores to gloo/NCCL, but two CPU ranks that each keep a core busy leave none
on a 2-core machine (measured here: 1 MB buckets made the step slower, 225 -> 334 ms). So each
layer's backward also waits ``--device-ms`` for an accelerator's share of the work, during
which the host's cores are free, as they are beside GPU kernels.
"""

import argparse
import time

import torch
import torch.distributed as dist
from _phases import schedule
from _timer import OwnTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--bucket-mb", type=float, default=64)
ap.add_argument("--fixed-bucket-mb", type=float, default=1)
ap.add_argument("--phases", default="b1")
ap.add_argument("--layers", type=int, default=6)
ap.add_argument("--device-ms", type=float, default=0.0)
ap.add_argument("--width", type=int, default=1024)
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--report", required=True)
args = ap.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
plan = schedule(args.phases, args.steps)


class Accelerator(torch.autograd.Function):
    """Identity forward; backward waits ``--device-ms`` (the host's cores stay free)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(args.device_ms / 1e3)
        return grad


class Device(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Accelerator.apply(x) if args.device_ms > 0 else x


def ddp(bucket_mb: float) -> torch.nn.Module:
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), Device(), torch.nn.ReLU()]
    return torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers),
                                                     bucket_cap_mb=bucket_mb)


models = {"b": ddp(args.bucket_mb)}
if "a" in plan:  # the same model with smaller buckets (its own copy: one DDP per module)
    models["a"] = ddp(args.fixed_bucket_mb)
opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
x = torch.randn(args.batch, args.width)
own = OwnTimer()
for phase in plan:
    models[phase](x).square().mean().backward()
    opts[phase].step()
    opts[phase].zero_grad()
    own.lap()
if dist.get_rank() == 0:
    own.write(args.report, phases=plan)
dist.destroy_process_group()
