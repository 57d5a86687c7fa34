"""GPU validation: workloads with known answers, run under ``gpudiag profile`` on a real GPU.

Why: the CPU-side tests prove the pipeline; only a real GPU proves that labels, roofline,
MFU, the NVML/GPM sampler and NCCL collective timing are right where users run them.

Workloads (``benchmarks/workloads/gpu_synthetic.py``), each profiled as a user would:
  gemm         8 bf16 8192^3 matmuls per step      -> compute-bound; analytic MFU known
  elementwise  mul/relu/add on a 2^28 fp32 tensor  -> memory-bound
  input        DataLoader, 1 ms sleep per sample   -> input-bound
  host         1500 one-element adds per step      -> host-bound
  nccl         one-rank NCCL all_reduce per step   -> checks flight-recorder timing only

Printed: expected vs measured label, gpudiag's MFU vs the analytic MFU of the GEMM (analytic
FLOPs over the traced steps' wall time from gpudiag's step timer; within 10%), the GPM
metrics NVML returned, and the sampler's CPU cost. Run directories' NVML samples and traces
are copied to $OUT for use as replay fixtures.

    python benchmarks/gpu_validation.py [--out DIR]     (needs CUDA; about 2 min on an H200)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "benchmarks" / "workloads" / "gpu_synthetic.py"
CASES = [("gemm", "compute-bound"), ("elementwise", "memory-bound"), ("input", "input-bound"),
         ("host", "host-bound"), ("nccl", None)]
SKIP, STEPS = 5, 5


def profile(kind: str, run: Path) -> tuple[int, str, float]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--skip",
                        str(SKIP), "--steps", str(STEPS), "--", sys.executable, str(WORKLOAD),
                        "--kind", kind, "--steps", "30"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    return p.returncode, p.stdout + p.stderr, time.perf_counter() - t


def step_times(run: Path) -> tuple[float, float]:
    """Median wall time of the traced steps and of the untraced ones, from the step timer.

    The profiler starts after step SKIP; step SKIP+1 is its warm-up; SKIP+2.. are traced.
    """
    rows = [json.loads(x) for x in (run / "samples" / "steps-rank-0.jsonl").read_text().splitlines()]
    traced = range(SKIP + 2, SKIP + 2 + STEPS)
    window = range(SKIP, SKIP + STEPS + 3)
    return (statistics.median(r["dt"] for r in rows if r["step"] in traced),
            statistics.median(r["dt"] for r in rows if r["step"] > 2 and r["step"] not in window))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-validation")))
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this script validates gpudiag on a GPU", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    from gpudiag.devices import match_device
    from gpudiag.diagnosis import Diagnosis

    gpu = torch.cuda.get_device_name(0)
    print(f"device: {gpu}; torch {torch.__version__}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "runs"
    shutil.rmtree(work, ignore_errors=True)
    rows, gpm, sampler = [], set(), []
    analytic = None
    for kind, expected in CASES:
        run = work / kind
        code, log, secs = profile(kind, run)
        row = {"workload": kind, "expected": expected, "exit": code, "seconds": round(secs, 1)}
        if code != 0 or not (run / "diagnosis.json").exists():
            row["measured"] = "FAILED"
            print(log[-3000:])
            rows.append(row)
            continue
        d = Diagnosis.from_json((run / "diagnosis.json").read_text())
        info = json.loads((run / "run.json").read_text())
        row.update(measured=d.verdict.label.value, confidence=d.verdict.confidence, mfu=d.mfu.value,
                   step_ms=round(d.breakdown.step_time / 1e3, 3), evidence=d.verdict.evidence,
                   warnings=d.warnings, sampler=info.get("sampler"))
        if info.get("sampler", {}).get("wall_seconds"):
            sampler.append(info["sampler"]["cpu_seconds"] / info["sampler"]["wall_seconds"])
        samples = [json.loads(x) for x in (run / "samples" / "gpu.jsonl").read_text().splitlines()[1:]]
        for s in samples:
            gpm.update(k[4:] for k, v in s.items() if k.startswith("gpm_") and isinstance(v, float))
        steps = [json.loads(x) for x in (run / "samples" / "steps-rank-0.jsonl").read_text().splitlines()]
        colls = [r.get("collectives", {}) for r in steps]
        row["steps_with_collective_timing"] = sum(1 for c in colls if c)
        row["collective_seconds"] = sum(v["seconds"] for c in colls for v in c.values())
        if kind == "gemm":
            flops = next(int(x.split()[1]) for x in log.splitlines() if x.startswith("analytic_flops"))
            peak = match_device(gpu).peak_for("c10::bfloat16")[0]
            traced_s, untraced_s = step_times(run)
            analytic = flops / traced_s / peak
            row.update(analytic_mfu=analytic, untraced_mfu=flops / untraced_s / peak,
                       throttle_reasons=sorted({s.get("throttle") for s in samples
                                                if isinstance(s.get("throttle"), int)}),
                       min_sm_clock=min((s["sm_clock_mhz"] for s in samples
                                         if isinstance(s.get("sm_clock_mhz"), int)), default=None))
        rows.append(row)
        print(f"  {kind}: {row['measured']} in {secs:.1f} s", flush=True)
        shutil.copy(run / "samples" / "gpu.jsonl", args.out / f"{kind}-gpu.jsonl")

    print("\n| workload | expected | measured | ok | confidence | MFU | step ms (traced) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ok = "yes" if r["expected"] is None or r["expected"] == r.get("measured") else "NO"
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
        print(f"| {r['workload']} | {r['expected'] or '(timing check)'} | {r.get('measured')} | {ok} | "
              f"{r.get('confidence', 0):.2f} | {mfu} | {r.get('step_ms')} |")
    gem = rows[0]
    if analytic is not None and gem.get("mfu") is not None:
        rel = gem["mfu"] / analytic - 1
        print(f"\nGEMM: gpudiag MFU {100 * gem['mfu']:.1f}% vs analytic {100 * analytic:.1f}% "
              f"(analytic FLOPs / the same steps' wall time from the step timer): {100 * rel:+.1f}% "
              f"({'within' if abs(rel) <= 0.10 else 'OUTSIDE'} 10%)")
        print(f"      untraced steps ran at {100 * gem['untraced_mfu']:.1f}% MFU; SM clock down to "
              f"{gem['min_sm_clock']} MHz, throttle reasons seen {gem['throttle_reasons']} "
              "(4 = software power cap)")
    nccl = next((r for r in rows if r["workload"] == "nccl"), {})
    print(f"NCCL flight-recorder timing: {nccl.get('steps_with_collective_timing', 0)} steps with "
          f"collective times, {nccl.get('collective_seconds', 0):.4f} s in all")
    print(f"GPM metrics read: {sorted(gpm) or 'none'}")
    if sampler:
        print(f"sampler CPU at 100 ms: median {100 * statistics.median(sampler):.2f}% of one core")
    (args.out / "results.json").write_text(json.dumps({"device": gpu, "torch": torch.__version__,
                                                       "rows": rows, "gpm_read": sorted(gpm)},
                                                      indent=1, default=str))
    for kind in ("gemm", "host"):
        src = work / kind / "traces" / "rank-0.json.gz"
        if src.exists():
            shutil.copy(src, args.out / f"{kind}-trace.json.gz")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
