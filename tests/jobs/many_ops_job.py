"""Training of a deep, narrow model at a tiny batch, with its own step timer: thousands of small
operators a step, whose time is mostly their dispatch (Python, the dispatcher), not their work.
The compile case of "predicted vs applied" (``--phases``: the "a" steps run the model under
``torch.compile``, as a user would write it; the optimizer stays eager).

    python many_ops_job.py --steps 200 --report own.json
    python many_ops_job.py --phases b60,a30 --steps 270 --report own.json
    python many_ops_job.py --sync-every 3 ...   # a .item() every 3 blocks (a data-dependent check)
    python many_ops_job.py --hand-adam ...      # Adam written as a Python loop, no torch.optim

Each block is a Linear, a LayerNorm, a GELU and a residual add at ``--width`` (64) over a batch
of ``--batch`` (4); with 48 blocks, forward, backward and a per-parameter SGD step record about
7,000 operators a step. ``--sync-every N`` reads a scalar back (``.item()``) every N blocks,
which torch.compile cannot trace through: the graph breaks there; ``--log-loss`` reads the
loss back after each step, as training loops log it, which breaks no graph of the model.
``--hand-adam`` updates the parameters with Adam written in Python, one tensor at a time (8
operators each, 7 of them in place), as some research code does, and marks its steps with
``gpudiag.step()`` (no torch.optim optimizer ends them); its own timer times that loop apart.
"""

import argparse
import time

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
ap.add_argument("--hand-adam", action="store_true", help="a hand-written Adam loop, not torch.optim")
ap.add_argument("--torch-adam", action="store_true",
                help="torch.optim.Adam one tensor at a time (foreach=False, a CPU's default)")
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


class HandAdam:
    """Adam as a Python loop over the parameters: 8 operators a tensor."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float = 1e-3) -> None:
        self.params, self.lr, self.t = params, lr, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        c1, c2 = 1 - 0.9 ** self.t, 1 - 0.999 ** self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            m.mul_(0.9).add_(p.grad, alpha=0.1)
            v.mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
            p.addcdiv_(m, (v / c2).sqrt_().add_(1e-8), value=-self.lr / c1)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def mark_step() -> None:
    """gpudiag.step() where gpudiag is importable: a loop without torch.optim ends its steps so."""
    try:
        from gpudiag import step
    except ImportError:
        return
    step()


model = Net()
opt = (HandAdam(list(model.parameters())) if args.hand_adam
       else torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False) if args.torch_adam
       else torch.optim.SGD(model.parameters(), lr=1e-3, foreach=False))
plan = schedule(args.phases, args.steps)
fns = {"b": torch.compile(model) if args.compile else model}
if "a" in plan:
    fns["a"] = torch.compile(model)
x = torch.randn(args.batch, args.width)
y = torch.randn(args.batch, args.width)
own = OwnTimer()
opt_seconds: list[float] = []
for phase in plan:
    loss = torch.nn.functional.mse_loss(fns[phase](x), y)
    loss.backward()
    t0 = time.perf_counter()
    opt.step()
    opt.zero_grad()
    opt_seconds.append(time.perf_counter() - t0)
    if args.log_loss:
        logged = loss.item()  # a value read after the step: no graph of the model ends there
    if args.hand_adam:
        mark_step()
    own.lap()
own.write(args.report, phases=plan, optimizer_seconds=opt_seconds,
          param_tensors=len(list(model.parameters())))
