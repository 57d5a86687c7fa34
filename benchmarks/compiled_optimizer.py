"""What compiling a per-tensor optimizer's step (``torch.compile(opt.step)``) keeps of the eager
step on this machine: the eager step and the compiled one timed alone, by shape, and the eager
step split into its calls' overhead (the same step over tiny tensors) and the work on the larger
tensors (the rest). Prints, per case, compiled / eager (the ratio against the eager baseline run
in the same process) and what share of the eager work the compiled step still takes, which
``whatif.FUSED_PASSES`` assumes.

Why: the advice's compiled-update prediction takes the eager loop's overhead per call away and
keeps a share of its work. On a CPU, inductor's fused update is one C++ loop over each tensor,
with no more vectorisation than ATen's own kernels, so that share need not be below 1.

    python benchmarks/compiled_optimizer.py [--repeat 200] [--opts AdamW,SGD]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch


def _params(blocks: int, width: int) -> list[torch.nn.Parameter]:
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width)]
    ps = list(torch.nn.Sequential(*layers).parameters())
    for p in ps:
        p.grad = torch.randn_like(p)
    return ps


def _time_step(opt_name: str, blocks: int, width: int, compiled: bool, repeat: int) -> float:
    """Median microseconds of one optimizer step, its state warmed (and compiled) first."""
    torch.manual_seed(0)
    kw = {"momentum": 0.9} if opt_name == "SGD" else {}
    opt = getattr(torch.optim, opt_name)(_params(blocks, width), lr=1e-3, foreach=False, **kw)
    step = torch.compile(opt.step) if compiled else opt.step
    for _ in range(20):
        step()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=200, help="timed steps per case (median)")
    ap.add_argument("--opts", default="AdamW,SGD", help="torch.optim classes, comma-separated")
    ap.add_argument("--blocks", type=int, default=8, help="Linear+LayerNorm blocks (4 tensors each)")
    ap.add_argument("--widths", default="64,128,192,256,512",
                    help="layer widths; the first is the tiny baseline whose step is all overhead")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    widths = [int(w) for w in args.widths.split(",")]
    print(f"torch {torch.__version__}, 1 thread, {args.blocks} blocks ({4 * args.blocks} tensors), "
          f"median of {args.repeat} steps")
    for name in args.opts.split(","):
        base_e = _time_step(name, args.blocks, widths[0], False, args.repeat)
        base_c = _time_step(name, args.blocks, widths[0], True, args.repeat)
        print(f"{name} width {widths[0]}: eager {base_e:.0f} us, compiled {base_c:.0f} us "
              f"(x{base_c / base_e:.2f}): the calls' overhead")
        for w in widths[1:]:
            e = _time_step(name, args.blocks, w, False, args.repeat)
            c = _time_step(name, args.blocks, w, True, args.repeat)
            work_e, work_c = e - base_e, c - base_c
            kept = f"{work_c / work_e:.2f}" if work_e > 0 else "n/a"
            print(f"{name} width {w}: eager {e:.0f} us, compiled {c:.0f} us, x{c / e:.2f}; "
                  f"work beyond the tiny case: eager {work_e:.0f} us, compiled {work_c:.0f} us "
                  f"(compiled keeps {kept} of it)")


if __name__ == "__main__":
    main()
