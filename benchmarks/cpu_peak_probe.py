"""What measuring the CPU's peaks costs: the probe as it runs, against every path timed in full.

The first ``gpudiag profile`` or ``analyze`` on a machine measures the CPU's GEMM peak per dtype
family and its copy bandwidth (``collectors.cpu_peak.measure``), then reads them from a cache.
The probe skips a path whose first run is ``DOMINATED`` times slower than the family's best so
far (bf16 ``torch.mm`` ran 23x slower than ``F.linear`` on this project's 2-core AMD EPYC VM,
0.7 s a run). This script times the probe as it runs and, in the same run, with that skip off
(every path timed: the baseline), alternating ``--rounds`` times, and prints each one's wall
and CPU seconds, the peaks each found, and the ratio. The peaks must agree: a skip that changed
a peak would be a wrong skip, and the script says so.

    python benchmarks/cpu_peak_probe.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpudiag.collectors import cpu_peak

AGREE = 0.15   # peaks of the two forms closer than this are the same peak (run-to-run noise)


def timed(skip: bool) -> tuple[float, float, dict[str, float]]:
    """(wall s, CPU s, FLOP/s per family) of one probe, with the dominated-path skip or not."""
    saved = cpu_peak.DOMINATED
    cpu_peak.DOMINATED = saved if skip else float("inf")
    try:
        w, c = time.perf_counter(), time.process_time()
        flops, _ = cpu_peak.measure()
        return time.perf_counter() - w, time.process_time() - c, flops
    finally:
        cpu_peak.DOMINATED = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two forms (default 2)")
    args = ap.parse_args()
    runs: dict[str, list[tuple[float, float, dict[str, float]]]] = {"probe": [], "every path": []}
    for _ in range(args.rounds):
        runs["every path"].append(timed(skip=False))
        runs["probe"].append(timed(skip=True))
    for name, rs in runs.items():
        peaks = {f: max(r[2].get(f, 0.0) for r in rs) / 1e9 for f in cpu_peak.FAMILIES}
        print(f"{name:>10}: wall {statistics.median(r[0] for r in rs):5.1f} s, "
              f"CPU {statistics.median(r[1] for r in rs):5.1f} s; peaks (GFLOP/s) "
              + ", ".join(f"{f} {v:.1f}" for f, v in peaks.items()))
    base, probe = runs["every path"], runs["probe"]
    def med(rs: list[tuple[float, float, dict[str, float]]], i: int) -> float:
        return statistics.median(r[i] for r in rs)

    print(f"ratio probe / every path: wall {med(probe, 0) / med(base, 0):.2f}, "
          f"CPU {med(probe, 1) / med(base, 1):.2f}")
    for f in cpu_peak.FAMILIES:
        a = max(r[2].get(f, 0.0) for r in probe)
        b = max(r[2].get(f, 0.0) for r in base)
        if b > 0 and abs(a - b) / b > AGREE:
            print(f"DISAGREE: {f} peak {a / 1e9:.1f} with the skip, {b / 1e9:.1f} timing every path")


if __name__ == "__main__":
    main()
