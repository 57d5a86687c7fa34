"""How much time the HTML report adds to the analysis of a large job.

Why this benchmark: ``gpudiag profile`` writes report.html right after diagnosis.json, and
``gpudiag report`` renders one on demand; a report that took a noticeable share of the
analysis time would be a tax on every run. Target: rendering adds at most 20% to the
analysis time of the same run.

What is measured, in ONE process so both figures share the interpreter, caches and machine:
  * analysis: ``gpudiag.analyzers.diagnose.diagnose`` on the 8-rank trace set that
    benchmarks/analyze_speed.py builds (1 GiB by default; reused from .bench/ when present);
    the files are read once beforehand so disk speed does not flatter the ratio.
  * rendering: ``gpudiag.reports.html.render_report`` of that Diagnosis, first as analysed (no
    counters: a trace folder is not a run directory), then with the largest timeline a run
    directory can carry attached (8 GPUs x 5 counter series + step and collective time for 8
    ranks, each at the analyzer's cap of 400 points): synthetic values, real size. The first
    render includes compiling the templates, as a CLI call pays it; the best of the repeats
    shows the steady cost. Last, the same with the unprofiled view a run directory adds (both
    views: the side-by-side table and chart). The target is checked against the slowest of these.

Usage::

    python benchmarks/report_speed.py                 # 1 GiB trace set
    python benchmarks/report_speed.py --size-gb 0.1   # quicker
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyze_speed import (  # the sibling script, run from anywhere
    DEFAULT_SOURCE,
    GIB,
    WORLD_SIZE,
    _display,
    _warm_cache,
    prepare_trace_set,
)

from gpudiag.analyzers.diagnose import diagnose
from gpudiag.analyzers.timeline import MAX_POINTS
from gpudiag.diagnosis import Diagnosis, Dilation, RunSummary, Series, TimeBreakdown, Timeline
from gpudiag.reports.html import render_report

TARGET = 0.20  # rendering may add at most this fraction of the analysis time
GPU_SERIES = [("SM activity", "%", 100.0), ("tensor activity", "%", 100.0), ("DRAM bandwidth", "%", 100.0),
              ("GPU utilisation (legacy)", "%", 100.0), ("power", "W", 700.0)]


def with_full_timeline(d: Diagnosis, duration_s: float = 3600.0) -> Diagnosis:
    """``d`` plus the largest run context a report draws (what analyzers.timeline caps it to)."""
    out = copy.deepcopy(d)
    rnd = random.Random(0)
    t = [round(i * duration_s / MAX_POINTS, 3) for i in range(MAX_POINTS)]
    series = [Series(name, unit, gpu, None, t, [round(rnd.uniform(0, hi), 3) for _ in t])
              for gpu in range(WORLD_SIZE) for name, unit, hi in GPU_SERIES]
    for rank in range(WORLD_SIZE):
        series.append(Series("step time", "ms", None, rank, t, [round(rnd.uniform(200, 240), 3) for _ in t]))
        series.append(Series("collective time per step", "ms", None, rank, t,
                             [round(rnd.uniform(10, 50), 3) for _ in t]))
    out.timeline = Timeline(start=1.7e9, duration=duration_s, series=series,
                            traced=[[duration_s / 2, duration_s / 2 + 5]])
    out.run = RunSummary(command=["torchrun", "--nproc_per_node", str(WORLD_SIZE), "train.py"],
                         host="bench", start=1.7e9, end=1.7e9 + duration_s, status="completed",
                         exit_code=0, signal=None, last_step=10_000,
                         gpus=[{"name": "NVIDIA H200", "driver": "bench"}] * WORLD_SIZE,
                         gpu_counters="nvml", versions={"python": sys.version.split()[0]})
    return out


def with_both_views(d: Diagnosis, dilation: float = 1.8) -> Diagnosis:
    """``d`` with the unprofiled view a run directory's step timer adds (basis, dilation, the
    estimated step, the traced verdict): the report then draws the side-by-side table and chart
    too. Synthetic numbers of the real shape: the step ``dilation`` times shorter, the extra time
    out of the host gaps (as analyzers/unprofiled.py does it)."""
    out = copy.deepcopy(d)
    b = out.breakdown
    step = b.step_time / dilation
    extra = b.step_time - step
    host = max(0.0, b.host_overhead - extra)
    out.basis = "unprofiled-estimate"
    out.unprofiled = TimeBreakdown(**{**b.__dict__, "step_time": step, "host_overhead": host,
                                      "idle": host + b.input_wait})
    out.dilation = Dilation(traced_step_us=b.step_time, untraced_step_us=step, factor=dilation,
                            traced_steps=5, untraced_steps=10_000, untraced_spread=0.024,
                            model="benchmark: synthetic estimate", caveats=["a synthetic caveat"])
    out.traced_verdict = copy.deepcopy(out.verdict)
    return out


def time_render(d: Diagnosis, repeats: int) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        html = render_report(d)
        times.append(time.perf_counter() - t0)
        size = len(html.encode())
    return times, size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-gb", type=float, default=1.0,
                        help="total uncompressed JSON over the 8 rank files, in GiB (default 1.0)")
    parser.add_argument("--source", default=DEFAULT_SOURCE,
                        help=f"trace to replicate, relative to ../shared/traces (default {DEFAULT_SOURCE})")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the trace set goes (default: the one analyze_speed.py uses)")
    parser.add_argument("--repeats", type=int, default=5, help="renders of each report (default 5)")
    args = parser.parse_args(argv)
    ts, how = prepare_trace_set(parser, args)
    print(f"trace set: {_display(ts.folder)} ({how}): {WORLD_SIZE} ranks, "
          f"{ts.total_bytes / GIB:.3f} GiB of JSON, {ts.events_per_rank:,} events per rank")
    _warm_cache(ts.files)

    t0 = time.perf_counter()
    d = diagnose(ts.folder)
    analysis_s = time.perf_counter() - t0
    steps = sum(len(r.steps) for r in d.ranks)
    print(f"analysis   diagnose()                       {analysis_s:9.3f} s  "
          f"({len(d.ranks)} ranks, {steps} steps, label {d.verdict.label.value})")

    rows = []
    full = with_full_timeline(d)
    cases = [("as analysed (no timeline)", d), ("with a full 8-GPU timeline", full),
             ("timeline and both views", with_both_views(full))]
    for name, diag in cases:
        times, size = time_render(diag, args.repeats)
        rows.append((name, times, size))
        print(f"render     {name:<30} first {times[0]:7.3f} s, best {min(times):7.3f} s, "
              f"{size / 1e6:.2f} MB")
    worst = max(max(times) for _, times, _ in rows)
    ratio = worst / analysis_s
    print()
    print(f"render / analysis = {worst:.3f} s / {analysis_s:.3f} s = {100 * ratio:.2f}% "
          f"(slowest render above)  target <= {100 * TARGET:.0f}%: {'MET' if ratio <= TARGET else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
