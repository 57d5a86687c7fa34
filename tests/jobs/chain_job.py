"""Inference of a model built from many small operators between a few GEMMs, with its own step
timer: the host-bound job of "predicted vs applied" (``--compile`` applies the fix).

    python chain_job.py --steps 300 --report own.json [--compile]
    python chain_job.py --phases b120,a60 --steps 600 --report own.json   # "a": compiled

Each block is one GEMM followed by a chain of elementwise operators on a small activation:
eager PyTorch pays its dispatch cost per operator, ``torch.compile`` fuses each chain into one
loop and calls the GEMMs as before. Steps are marked with ``gpudiag.step()`` under ``gpudiag
profile`` (no optimizer).
"""

import argparse
import json
import time

import torch
from _phases import schedule

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--blocks", type=int, default=8)
ap.add_argument("--chain", type=int, default=16)
ap.add_argument("--width", type=int, default=256)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--compile", action="store_true")
ap.add_argument("--phases", default="b1")
ap.add_argument("--report", required=True)
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
weights = [torch.randn(args.width, args.width) / args.width**0.5 for _ in range(args.blocks)]


def forward(x: torch.Tensor) -> torch.Tensor:
    for w in weights:
        x = x @ w
        for i in range(args.chain):  # elementwise work: scale, shift, squash, mix
            x = torch.tanh(x * 0.9 + 0.01 * i) if i % 3 == 0 else x * 1.01 - 0.001 * i
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
own = []
with torch.no_grad():
    t = time.perf_counter()
    for phase in plan:
        fns[phase](x)
        mark()
        now = time.perf_counter()
        own.append(now - t)
        t = now
with open(args.report, "w") as f:
    json.dump({"step_seconds": own, "phases": plan}, f)
