"""Data-parallel training over gloo with large gradients (run under torchrun), with its own step
timer: the communication-cost case of "predicted vs applied".

    torchrun --nproc_per_node 2 ddp_grads_job.py --steps 30 --report own.json
    torchrun ... ddp_grads_job.py --phases b20,a10 --fix no-sync --steps 60 --report own.json

A few wide Linear layers (``--width`` 2048, ``--layers`` 6: 100 MB of fp32 gradients) at a small
batch, so each step's all-reduce moves more bytes than its compute touches. On a CPU gloo's
threads run the all-reduce on the same cores as the ranks' compute: what communication costs
is what the step would be without it, not only the part of it no operator overlaps.

``--fix`` is what the "a" steps do:
- ``no-sync``: backward under ``DistributedDataParallel.no_sync()``: no all-reduce at all (the
  step without its collectives; gradients diverge across ranks, so only for measuring);
- ``accumulate``: gradient accumulation: each "a" step runs ``--accumulate`` micro-batches, the
  all-reduce (and the optimizer) on the last one only; its time is reported per micro-batch;
- ``bucket``: DDP with ``--fixed-bucket-mb`` buckets (its own copy of the model);
- ``fp16``: gradients compressed to fp16 for the all-reduce (DDP's fp16_compress_hook).
"""

import argparse
import os

import torch
import torch.distributed as dist
from _phases import schedule
from _timer import OwnTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--layers", type=int, default=6)
ap.add_argument("--width", type=int, default=2048)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--bucket-mb", type=float, default=25)
ap.add_argument("--fix", choices=["no-sync", "accumulate", "bucket", "fp16"], default="no-sync")
ap.add_argument("--accumulate", type=int, default=4)
ap.add_argument("--fixed-bucket-mb", type=float, default=100)
ap.add_argument("--phases", default="b1")
ap.add_argument("--report", required=True)
args = ap.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
plan = schedule(args.phases, args.steps)


def net() -> torch.nn.Module:
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def ddp(bucket_mb: float) -> torch.nn.parallel.DistributedDataParallel:
    return torch.nn.parallel.DistributedDataParallel(net(), bucket_cap_mb=bucket_mb)


models = {"b": ddp(args.bucket_mb)}
if "a" in plan and args.fix in ("bucket", "fp16"):
    models["a"] = ddp(args.fixed_bucket_mb if args.fix == "bucket" else args.bucket_mb)
    if args.fix == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        models["a"].register_comm_hook(None, default_hooks.fp16_compress_hook)
else:
    models["a"] = models["b"]
opts = {k: torch.optim.SGD(m.parameters(), lr=1e-6) for k, m in models.items()}
x = torch.randn(args.batch, args.width)


def gloo_cpu_s() -> float:
    """CPU seconds gloo's own threads have run so far (Linux; 0 elsewhere): how much of the
    machine the collectives took, whichever core they ran on."""
    total = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as f:
                if "gloo" not in f.read():
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except OSError:
        return 0.0
    return total / 1e9


gloo = []
own = OwnTimer()
for phase in plan:
    model, opt = models[phase], opts[phase]
    if phase == "a" and args.fix == "no-sync":
        with model.no_sync():
            model(x).square().mean().backward()
    elif phase == "a" and args.fix == "accumulate":
        for _ in range(args.accumulate - 1):
            with model.no_sync():
                model(x).square().mean().backward()
        model(x).square().mean().backward()
    else:
        model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    own.lap()
    gloo.append(gloo_cpu_s())
    if phase == "a" and args.fix == "accumulate":  # per micro-batch, as the "b" steps
        own.seconds[-1] /= args.accumulate
if dist.get_rank() == 0:
    own.write(args.report, phases=plan, gloo_cpu_s=gloo)
else:  # each other rank's own clocks beside it: a peer's slower cycles hold rank 0 in the all-reduce
    own.write(f"{args.report}.rank{dist.get_rank()}", phases=plan, gloo_cpu_s=gloo)
dist.destroy_process_group()
