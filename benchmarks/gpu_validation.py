"""GPU validation: workloads with known answers, profiled on a real GPU, diagnosed by gpudiag.

Why: the CPU-side tests prove the pipeline; only a real GPU proves that the labels, the
roofline and MFU are right where users run them. Each workload has an expected label and
the GEMM workload has an analytic MFU (known FLOPs over a step time timed with CUDA events,
without the profiler) that gpudiag's trace-derived MFU must match within 10%.

It also records real NVML readings (GPM metrics on Hopper, legacy counters elsewhere)
while the workloads run, so they can be committed as replay fixtures. Until
``gpudiag profile`` exists (next issue) the workloads arm ``torch.profiler`` themselves,
exactly as the bootstrap will.

    python benchmarks/gpu_validation.py --out DIR        (needs CUDA; < 6 min on an H100)
    python benchmarks/gpu_validation.py --out DIR --cpu  (a quick dry run of the plumbing)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analyzers.diagnose import DeviceChoice, diagnose  # noqa: E402

GPM_METRICS = {
    "sm_activity": 2, "sm_occupancy": 3, "any_tensor_activity": 5, "dram_bw_util": 10,
    "fp32_activity": 12, "fp16_activity": 13, "pcie_tx_mib_s": 20, "pcie_rx_mib_s": 21,
    "nvlink_rx_mib_s": 60, "nvlink_tx_mib_s": 61,
}


class NvmlRecorder:
    """Samples every visible GPU at ``interval`` into a JSONL file; one bad metric is "n/a"."""

    def __init__(self, path: Path, interval: float = 0.1) -> None:
        self.path = path
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.cpu_seconds = 0.0
        self.wall_seconds = 0.0
        self.samples = 0
        self.gpm_read: set[str] = set()
        self.error: str | None = None
        self.marks: list[tuple[float, str]] = []

    def __enter__(self) -> NvmlRecorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()

    def mark(self, label: str) -> None:
        self.marks.append((time.time(), label))

    def _run(self) -> None:
        try:
            import pynvml as nv

            nv.nvmlInit()
        except Exception as e:  # noqa: BLE001 - report whatever NVML says, keep running
            self.error = f"NVML unavailable: {e}"
            return
        t_wall = time.perf_counter()
        t_cpu = time.thread_time()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        gpm = []
        for h in handles:
            try:
                ok = bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            except Exception:  # noqa: BLE001
                ok = False
            gpm.append([nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()] if ok else None)
            if ok:
                nv.nvmlGpmSampleGet(h, gpm[-1][0])
        with self.path.open("w") as f:
            while not self.stop.wait(self.interval):
                now = time.time()
                for i, h in enumerate(handles):
                    row: dict[str, Any] = {"t": now, "gpu": i}
                    row.update(self._legacy(nv, h))
                    if gpm[i] is not None:
                        row.update(self._gpm(nv, h, gpm[i]))
                        gpm[i].reverse()
                    f.write(json.dumps(row) + "\n")
                self.samples += 1
                if self.samples % 10 == 0:
                    f.flush()
        self.cpu_seconds = time.thread_time() - t_cpu
        self.wall_seconds = time.perf_counter() - t_wall

    @staticmethod
    def _legacy(nv: Any, h: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        calls: dict[str, Callable[[], Any]] = {
            "name": lambda: nv.nvmlDeviceGetName(h),
            "util_gpu": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
            "util_mem": lambda: nv.nvmlDeviceGetUtilizationRates(h).memory,
            "mem_used": lambda: nv.nvmlDeviceGetMemoryInfo(h).used,
            "mem_total": lambda: nv.nvmlDeviceGetMemoryInfo(h).total,
            "power_mw": lambda: nv.nvmlDeviceGetPowerUsage(h),
            "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "throttle": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
            "pids": lambda: [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)],
        }
        for k, fn in calls.items():
            try:
                v = fn()
                out[k] = v.decode() if isinstance(v, bytes) else v
            except Exception as e:  # noqa: BLE001
                out[k] = f"n/a: {e}"
        return out

    def _gpm(self, nv: Any, h: Any, samples: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            nv.nvmlGpmSampleGet(h, samples[1])
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            mg.sample1, mg.sample2 = samples[0], samples[1]
            for j, mid in enumerate(GPM_METRICS.values()):
                mg.metrics[j].metricId = mid
            nv.nvmlGpmMetricsGet(mg)
            for j, name in enumerate(GPM_METRICS):
                m = mg.metrics[j]
                if m.nvmlReturn == 0:
                    out[f"gpm_{name}"] = m.value
                    self.gpm_read.add(name)
                else:
                    out[f"gpm_{name}"] = f"n/a: nvml error {m.nvmlReturn}"
        except Exception as e:  # noqa: BLE001
            out["gpm_error"] = str(e)
        return out


def profiled(steps_fn: Callable[[], None], trace_dir: Path, dev: str, active: int = 5) -> None:
    """Run steps under torch.profiler with the schedule the bootstrap will use."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    trace_dir.mkdir(parents=True, exist_ok=True)

    def write(prof: torch.profiler.profile) -> None:
        raw = trace_dir / "rank-0.json"
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(trace_dir / "rank-0.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()

    sched = torch.profiler.schedule(wait=1, warmup=2, active=active, repeat=1)
    with torch.profiler.profile(activities=acts, record_shapes=True, schedule=sched,
                                on_trace_ready=write) as prof:
        for _ in range(1 + 2 + active + 1):
            steps_fn()
            prof.step()


def gemm_workload(dev: str, n: int) -> tuple[Callable[[], None], float]:
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    a = torch.randn(n, n, device=dev, dtype=dt)
    b = torch.randn(n, n, device=dev, dtype=dt)
    reps = 8

    def step() -> None:
        for _ in range(reps):
            torch.mm(a, b)
        if dev == "cuda":
            torch.cuda.synchronize()

    return step, reps * 2.0 * n**3


def memory_workload(dev: str, numel: int) -> Callable[[], None]:
    x = torch.randn(numel, device=dev)

    def step() -> None:
        y = x * 2.0
        y = torch.relu(y)
        y = y + x
        y.mul_(0.5)
        if dev == "cuda":
            torch.cuda.synchronize()

    return step


def input_workload(dev: str) -> Callable[[], None]:
    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> torch.Tensor:
            time.sleep(0.001)
            return torch.randn(256)

    it = iter(torch.utils.data.DataLoader(Slow(), batch_size=32, num_workers=0))
    w = torch.randn(256, 256, device=dev)

    def step() -> None:
        x = next(it).to(dev)
        (x @ w).sum()
        if dev == "cuda":
            torch.cuda.synchronize()

    return step


def host_workload(dev: str) -> Callable[[], None]:
    t = torch.zeros(1, device=dev)

    def step() -> None:
        nonlocal t
        for _ in range(1500):
            t = t + 1
        if dev == "cuda":
            torch.cuda.synchronize()

    return step


def time_steps(fn: Callable[[], None], dev: str, n: int = 20) -> float:
    """Mean step time without the profiler, after the clocks have ramped up (5 warm-ups)."""
    for _ in range(5):
        fn()
    if dev == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    if dev == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-validation")))
    ap.add_argument("--cpu", action="store_true", help="dry run on the CPU with tiny sizes")
    args = ap.parse_args()
    dev = "cpu" if args.cpu else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu for a dry run", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    gpu_name = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    print(f"device: {gpu_name}; torch {torch.__version__}", flush=True)
    choice = DeviceChoice()
    if dev == "cpu":
        from collectors.cpu_peak import cpu_peak

        choice = DeviceChoice(cpu_peak=cpu_peak)

    rows = []
    with NvmlRecorder(args.out / "nvml_samples.jsonl") as rec:
        n = 8192 if dev == "cuda" else 512
        gemm, gemm_flops = gemm_workload(dev, n)
        cases = [
            ("gemm_bf16", gemm, "compute-bound"),
            ("elementwise", memory_workload(dev, 1 << 28 if dev == "cuda" else 1 << 22), "memory-bound"),
            ("slow_dataset", input_workload(dev), "input-bound"),
            ("tiny_kernels", host_workload(dev), "host-bound"),
        ]
        for name, fn, expected in cases:
            rec.mark(name)
            t0 = time.perf_counter()
            profiled(fn, work / name, dev)
            d = diagnose(work / name, choice, jobs=1)
            rows.append({
                "workload": name, "expected": expected, "measured": d.verdict.label.value,
                "confidence": d.verdict.confidence, "mfu": d.mfu.value, "mfu_reason": d.mfu.reason,
                "evidence": d.verdict.evidence, "device": d.device.name, "seconds": time.perf_counter() - t0,
                "step_ms": d.breakdown.step_time / 1e3,
            })
            print(f"  {name}: {d.verdict.label.value} ({time.perf_counter() - t0:.1f} s)", flush=True)
            if name == "gemm_bf16":
                rec.mark("gemm-timing")
                step_s = time_steps(gemm, dev)  # right after the profiled run: clocks are up
        rec.mark("end")

    peak = None
    gem = rows[0]
    if dev == "cuda":
        from analyzers.diagnose import _trace_device

        dp = _trace_device(gpu_name, None)
        peak = dp.peak_for("c10::bfloat16")[0] if dp else None
    analytic = gemm_flops / step_s / peak if peak else None

    print("\n| workload | expected | measured | ok | confidence | MFU (gpudiag) | step ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        ok = "yes" if r["expected"] == r["measured"] else "NO"
        print(f"| {r['workload']} | {r['expected']} | {r['measured']} | {ok} | {r['confidence']:.2f} "
              f"| {mfu} | {r['step_ms']:.2f} |")
    if analytic is not None and gem["mfu"] is not None:
        rel = gem["mfu"] / analytic - 1
        print(f"\nGEMM analytic MFU {100 * analytic:.1f}% ({gemm_flops / 1e12:.2f} TFLOP/step, "
              f"{step_s * 1e3:.2f} ms/step unprofiled wall clock, peak {peak / 1e12:.0f} TFLOP/s); "
              f"gpudiag {100 * gem['mfu']:.1f}% -> {100 * rel:+.1f}% "
              f"({'within' if abs(rel) <= 0.10 else 'OUTSIDE'} 10%)")
    print(f"GPM metrics read: {sorted(rec.gpm_read) or 'none'}; NVML: {rec.error or 'ok'}")
    if rec.wall_seconds:
        print(f"sampler: {rec.samples} samples, {rec.cpu_seconds:.3f} s CPU over {rec.wall_seconds:.1f} s "
              f"= {100 * rec.cpu_seconds / rec.wall_seconds:.2f}% of one core at 100 ms")
    (args.out / "results.json").write_text(json.dumps(
        {"device": gpu_name, "torch": torch.__version__, "rows": rows, "analytic_mfu": analytic,
         "gemm_step_s": step_s, "gemm_flops": gemm_flops, "gpm_read": sorted(rec.gpm_read),
         "marks": rec.marks, "sampler_cpu_s": rec.cpu_seconds, "sampler_wall_s": rec.wall_seconds},
        indent=1, default=str))
    for name, *_ in cases:
        src = work / name / "rank-0.json.gz"
        if src.exists() and src.stat().st_size < 15 * 2**20:
            shutil.copy(src, args.out / f"trace_{name}.json.gz")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
