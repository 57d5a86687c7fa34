"""DDP over gloo (run under torchrun) that reports its own bucket count and a checksum of its
trained weights: what gpudiag's timing hook must leave unchanged (DDP's math) and count once.

    torchrun --nproc_per_node 2 ddp_hook_job.py --report out.json [--own-hook]

``--own-hook`` registers torch's ``allreduce_hook`` itself (the job's own communication hook,
which gpudiag times by calling it).
"""

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--own-hook", action="store_true")
ap.add_argument("--report", required=True)
args = ap.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
net = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.3)
if args.own_hook:
    model.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(dist.get_rank())  # each rank its own data: averaging matters
for _ in range(args.steps):
    model(torch.randn(8, 256, generator=g)).square().mean().backward()
    opt.step()
    opt.zero_grad()
data = model._get_ddp_logging_data()
sizes = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes"))
if dist.get_rank() == 0:
    with open(args.report, "w") as f:
        json.dump({"buckets": len(sizes.split(",")),
                   "checksum": float(sum(p.double().sum() for p in net.parameters()))}, f)
# both ranks done, and DDP's reducer (which holds the process group and its comm hook) gone,
# before the group is destroyed: a rank that tore down first aborted at exit ("terminate called
# without an active exception", SIGABRT) in suite runs beside a CPU hog and at load 24
dist.barrier()
del model, opt
dist.destroy_process_group()
