"""Training of a deep, narrow model at a tiny batch, with its own step timer: thousands of small
operators a step, whose time is mostly their dispatch (Python, the dispatcher), not their work.
The compile case of "predicted vs applied" (``--phases``: the "a" steps run the model under
``torch.compile``, as a user would write it; the optimizer stays eager).

    python many_ops_job.py --steps 200 --report own.json
    python many_ops_job.py --phases b60,a30 --steps 270 --report own.json
    python many_ops_job.py --sync-every 3 ...   # a .item() every 3 blocks (a data-dependent check)

Each block is a Linear, a LayerNorm, a GELU and a residual add at ``--width`` (64) over a batch
of ``--batch`` (4); with 48 blocks, forward, backward and a per-parameter SGD step record about
7,000 operators a step. ``--sync-every N`` reads a scalar back (``.item()``) every N blocks,
which torch.compile cannot trace through: the graph breaks there; ``--log-loss`` reads the
loss back after each step, as training loops log it, which breaks no graph of the model.
"""

import argparse

import torch
from _phases import schedule
from _timer import OwnTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=200)
ap.add_argument("--blocks", type=int, default=48)
ap.add_argument("--width", type=int, default=64)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--sync-every", type=int, default=0)
ap.add_argument("--log-loss", action="store_true", help="read the loss back each step (after backward)")
ap.add_argument("--compile", action="store_true", help="the 'b' steps compiled too")
ap.add_argument("--phases", default="b1")
ap.add_argument("--report", required=True)
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(args.width, args.width)
        self.norm = torch.nn.LayerNorm(args.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.norm(self.lin(x)))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(args.blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, b in enumerate(self.blocks, 1):
            x = b(x)
            if args.sync_every and i % args.sync_every == 0 and x.abs().max().item() > 1e4:
                x = x / 2  # a data-dependent guard, as jobs write them
        return x


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=False)
plan = schedule(args.phases, args.steps)
fns = {"b": torch.compile(model) if args.compile else model}
if "a" in plan:
    fns["a"] = torch.compile(model)
x = torch.randn(args.batch, args.width)
y = torch.randn(args.batch, args.width)
own = OwnTimer()
for phase in plan:
    loss = torch.nn.functional.mse_loss(fns[phase](x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if args.log_loss:
        logged = loss.item()  # a value read after the step: no graph of the model ends there
    own.lap()
own.write(args.report, phases=plan)
