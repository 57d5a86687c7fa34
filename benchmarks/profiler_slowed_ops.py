"""Does the torch profiler slow long CPU operators themselves? The chain job's GEMMs, traced,
against the same step compiled and unobserved, and the fastest tenth of the traced calls.

    python benchmarks/profiler_slowed_ops.py [--rounds 3]

The number behind ``rank_facts.slowed_beyond_floor``: the per-event model of the unprofiled
CPU view charged what the traced GEMMs ran slower to the gaps between the small operators
(docs/diagnosis.md). Per round, medians of 20 steps each: the eager step unobserved before and
after the traced window, the compiled step (GEMMs plus fused chains), the GEMMs alone; then 8
eager steps under torch.profiler (CPU, shapes recorded, as gpudiag records): the mean traced
step, ``aten::mm`` time per step, and its calls' 10th percentile times their count per step
(the floor the unprofiled view keeps). All are the same process, alternated, so the machine's
load hits each alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

WIDTH, HIDDEN, BATCH, BLOCKS, CHAIN = 256, 8192, 8, 24, 32  # tests/jobs/chain_job.py's defaults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    w_in = torch.randn(WIDTH, HIDDEN) / WIDTH**0.5
    w_out = torch.randn(HIDDEN, WIDTH) / HIDDEN**0.5

    def forward(x: torch.Tensor, chain: bool = True) -> torch.Tensor:
        for _ in range(BLOCKS):
            x = (x @ w_in) @ w_out
            for i in range(CHAIN if chain else 0):
                x = torch.relu(x * 0.9 + 0.01 * i) if i % 3 == 0 else x * 1.01 - 0.001 * i
        return x

    compiled = torch.compile(forward)
    x = torch.randn(BATCH, WIDTH)

    def median_ms(fn, n: int = 20, **kw) -> float:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            fn(x, **kw)
            out.append(time.perf_counter() - t)
        return 1e3 * statistics.median(out)

    with torch.no_grad():
        for _ in range(10):
            forward(x), compiled(x), forward(x, chain=False)
        for rnd in range(args.rounds):
            eager, comp, gemms = median_ms(forward), median_ms(compiled), median_ms(forward, chain=False)
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                          record_shapes=True)
            traced = []
            prof.start()
            for _ in range(8):
                t = time.perf_counter()
                forward(x)
                traced.append(time.perf_counter() - t)
            prof.stop()
            after = median_ms(forward)
            mm = sorted(e.time_range.elapsed_us() for e in prof.events() if e.name == "aten::mm")
            floor = mm[len(mm) // 10] * len(mm) / 8 / 1e3
            print(f"round {rnd}: eager {eager:.1f} ms (after the window {after:.1f}), compiled {comp:.1f}, "
                  f"GEMMs alone {gemms:.1f}; traced step {1e3 * statistics.mean(traced):.1f} ms, "
                  f"aten::mm {sum(mm) / 8 / 1e3:.1f} ms per step, its fastest tenth x calls {floor:.1f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
