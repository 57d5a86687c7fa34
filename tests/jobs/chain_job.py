"""Inference of a model built from many small operators between a few GEMMs, with its own step
timer: the host-bound job of "predicted vs applied" (``--compile`` applies the fix).

    python chain_job.py --steps 300 --report own.json [--compile]
    python chain_job.py --phases b120,a60 --steps 600 --report own.json   # "a": compiled
    python chain_job.py --steps 140 --compete 111:116 --report own.json   # a busy moment

Each block is two GEMMs (width -> hidden -> width, weights shared by the blocks: 16 MB, read
from the last-level cache by eager and compiled steps alike) followed by a chain of elementwise
operators on a small activation (batch x width):
eager PyTorch pays its dispatch cost per operator, ``torch.compile`` fuses each chain into one
loop and calls the GEMMs as before. The GEMMs are sized so the compiled step is mostly their
work, not torch.compile's own per-call cost (guards, the graph's call: about 1 ms on this
project's loaded 2-core VM, which gpudiag's prediction does not include), and the chain is
cheap arithmetic (multiply, add, ReLU): fused, it costs next to nothing, as the prediction
assumes; a chain of tanh costs its arithmetic even fused (measured here: 8.6 ms per step of
fused kernels beside 17 ms of GEMMs), which it does not count. Steps are marked
with ``gpudiag.step()`` under ``gpudiag profile`` (no optimizer). ``--compete FIRST:LAST`` runs
another process on the job's CPU over those steps (``_compete``): a moment the machine is busy.
"""

import argparse

import torch
from _compete import Competitor
from _phases import schedule
from _timer import OwnTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--blocks", type=int, default=24)
ap.add_argument("--hidden", type=int, default=8192)
ap.add_argument("--chain", type=int, default=32)
ap.add_argument("--width", type=int, default=256)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--compile", action="store_true")
ap.add_argument("--phases", default="b1")
ap.add_argument("--compete", default="")
ap.add_argument("--compete-kind", default="cpu")
ap.add_argument("--report", required=True)
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
w_in = torch.randn(args.width, args.hidden) / args.width**0.5
w_out = torch.randn(args.hidden, args.width) / args.hidden**0.5


def forward(x: torch.Tensor) -> torch.Tensor:
    for _ in range(args.blocks):
        x = (x @ w_in) @ w_out
        for i in range(args.chain):  # elementwise work: scale, shift, clamp
            x = torch.relu(x * 0.9 + 0.01 * i) if i % 3 == 0 else x * 1.01 - 0.001 * i
    return x


plan = schedule(args.phases, args.steps)
fns = {"b": torch.compile(forward) if args.compile else forward}
if "a" in plan:
    fns["a"] = torch.compile(forward)
try:
    import gpudiag
    mark = gpudiag.step
except ImportError:
    def mark() -> None:
        pass

x = torch.randn(args.batch, args.width)
with torch.no_grad(), Competitor(Competitor.parse(args.compete), args.compete_kind) as competitor:
    own = OwnTimer()
    for step, phase in enumerate(plan, 1):
        competitor.before(step)
        fns[phase](x)
        mark()
        own.lap()
        competitor.after(step)
own.write(args.report, phases=plan)
