"""An fp32 MLP training job with its analytic FLOPs and its own step timer, on torch's default
intra-op threads (one per core: the job uses every core it may run on, as a real one does).

    python mlp_job.py --steps 120 --report own.json [--mark-step 25 --mark FILE] [--split-threads]
                      [--spin]

``--mark-step N --mark FILE`` creates FILE when step N ends, so that a test can stop the load
it put beside the job at a known step (the step timer's file is flushed once a second: too
late to say when step N ended). ``--split-threads`` pins the training thread to the lowest CPU
the job may run on and every other thread of the process (torch's intra-op threads) to the
next: a load on that CPU crowds the intra-op threads while the training thread has its core.
The report has the job's own step times and its model FLOPs per step (matmuls only: forward
2*B*in*out per layer; backward the same for the weight gradient, and again for the input
gradient except in the first layer).
"""

import argparse
import os
import sys
import threading
from pathlib import Path

# Its intra-op threads sleep at the end of a parallel region (OpenMP's passive wait policy)
# unless --spin: with the default policy a thread that waits for a peer spins for up to
# 300,000 pauses (libgomp), and beside other processes that spin is time on a core no counter
# tells from work (docs/diagnosis.md, "The job's own pace"). Set before torch loads libgomp.
if "--spin" not in sys.argv:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from _timer import OwnTimer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=120)
ap.add_argument("--layers", type=int, default=3)
ap.add_argument("--width", type=int, default=256)
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--mark-step", type=int, default=0)
ap.add_argument("--mark", default="")
ap.add_argument("--split-threads", action="store_true")
ap.add_argument("--spin", action="store_true", help="OpenMP's default wait policy (see above)")
ap.add_argument("--report", required=True)
args = ap.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-5)
x = torch.randn(args.batch, args.width)
per_matmul = 2 * args.batch * args.width * args.width
flops_per_step = per_matmul * (3 * args.layers - 1)


def split_threads() -> list[int]:
    """The training thread on the lowest CPU, the process's other threads on the next one (once
    a matmul has started torch's intra-op pool); returns the (training, others) CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--split-threads needs two CPUs")
    (model(x)).sum().backward()  # the intra-op pool exists from here
    me = threading.get_native_id()
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        os.sched_setaffinity(tid, {cpus[0] if tid == me else cpus[1]})
    opt.zero_grad()
    return cpus[:2]


pinned = split_threads() if args.split_threads else None
own = OwnTimer()
for i in range(args.steps):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    own.lap()
    if i + 1 == args.mark_step and args.mark:
        Path(args.mark).touch()
own.write(args.report, flops_per_step=flops_per_step, threads=torch.get_num_threads(), pinned=pinned)
