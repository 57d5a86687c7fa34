"""The observer's cost on a zoo job by the job's own timer: the job alone, under
``gpudiag profile`` (defaults: 5 traced steps after 10), and under ``gpudiag profile --skip
1000000`` (never traces: the host sampler, step timer and hooks only), in a palindrome
(alone, default, skip, skip, default, alone) so a linear drift of the machine's pace cancels.

    .venv/bin/python benchmarks/zoo/observer_cost.py JOB [--rounds N] [--steps N] [--threads N]
        [--out FILE]

The step is the job's median (mean for jobs judged by the mean) over its steps after warm-up,
the traced steps included in the default run (they are the job's steps as observed). Beside it,
for the default run, the same statistic over the steps outside the trace window (the warm-up,
traced and export steps gpudiag marked in its steps file left out: what observing costs the
rest of the job), and the window's own cost: the time its steps took beyond that pace, once per
window, also as a share of a 1,000-step job. In a 40-step job the window is a seventh of the
steps; in a training run of thousands it is the second figure, not the first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_zoo  # noqa: E402
from _zoo import median  # noqa: E402
from zoo_jobs import ALL_JOBS  # noqa: E402


def one(job, mode: str, steps: int, work: Path, tag: str, threads: int = 0,
        window_at: int = 10) -> dict:
    rep = work / f"{tag}.json"
    extra = ["--steps", str(steps), "--report", str(rep)] + (["--threads", str(threads)] if threads else [])
    cmd = run_zoo.command(job, extra, False)
    if mode != "alone":
        skip = ["--skip", "1000000" if mode == "skip" else str(window_at)]
        cmd = [str(run_zoo.BIN / "gpudiag"), "profile", "--out", str(work / f"{tag}-run"),
               *skip, "--", *cmd]
    la0, t0 = run_zoo.load(), time.time()
    rc, err = run_zoo._run(cmd, work / f"{tag}.log", 900)
    out = {"tag": tag, "mode": mode, "rc": rc, "wall_s": time.time() - t0, "load_before": la0,
           "load_after": run_zoo.load()}
    if rep.exists():
        r = json.loads(rep.read_text())
        out["step_ms"] = r["mean_ms"] if job.stat == "mean" else r["median_ms"]
        if mode == "default":
            out.update(outside_window(r, work / f"{tag}-run", job.stat))
        out.update(around_window(r, work / f"{tag}-run", job.stat, window_at))
    else:
        out["error"] = err or f"exit {rc}"
    return out


def window_indices(run: Path) -> list[int]:
    """The job's own step indices (0-based) that gpudiag marked as its window's (warm-up, traced,
    export) in rank 0's steps file, sorted; none for a run without one (alone, or never traced)."""
    path = run / "samples" / "steps-rank-0.jsonl"
    if not path.exists():
        return []
    return sorted({row["step"] - 1 for row in map(json.loads, path.read_text().splitlines())
                   if row.get("profiler")})


def outside_window(report: dict, run: Path, stat: str) -> dict:
    """The job's statistic over its steady steps outside gpudiag's trace window, and what the
    window's steps took beyond it (ms, summed). The window's steps are those the steps file of
    rank 0 marks (``profiler``: warm-up, traced, export); gpudiag's step ``n`` is the job's
    ``n``-th optimizer step, the job's own list's index ``n - 1``."""
    marked = set(window_indices(run))
    if not marked:
        return {}
    steps, warm = report["own_step_ms"], report["warmup"]
    rest = [ms for i, ms in enumerate(steps) if i >= warm and i not in marked]
    if not rest:
        return {}
    pace = sum(rest) / len(rest) if stat == "mean" else median(rest)
    extra = sum(steps[i] - pace for i in marked if i < len(steps))
    return {"outside_ms": pace, "window_extra_ms": extra, "window_steps": len(marked)}


def around_window(report: dict, run: Path, stat: str, window_at: int) -> dict:
    """The job's statistic before gpudiag's trace window and after it (from two steps past
    its last marked step to the end), for every mode at the same step indices: a run alone or
    under ``--skip`` large has no window, so its ranges are where the default run's would be
    (warm-up, then ``--skip`` steps; 7 marked: warm-up, 5 traced, export). What the default
    run's after/before ratio shows beyond the others' is what the window left behind: a cost
    that outlives the trace (the #37 question: metrics_log ran +5% outside its window in a
    60-step run on 2026-11-29)."""
    steps, warm = report["own_step_ms"], report["warmup"]
    marked = window_indices(run)
    first, last = (marked[0], marked[-1]) if marked else (window_at, window_at + 6)
    before, after = steps[warm:first], steps[last + 3:]
    if len(before) < 3 or len(after) < 3:
        return {}
    agg = (lambda xs: sum(xs) / len(xs)) if stat == "mean" else median
    return {"before_ms": agg(before), "after_ms": agg(after)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--work", default="")
    p.add_argument("--threads", type=int, default=0,
                   help="the job's intra-op threads (default: its own); 1 keeps a core free for "
                        "gpudiag's own processes, where another tenant holds the other core")
    p.add_argument("--window-at", type=int, default=10,
                   help="the default run's --skip: where its trace window opens (a later one "
                        "leaves steps before it to compare the steps after it with)")
    p.add_argument("--out", default="")
    args = p.parse_args()
    job = {j.name: j for j in ALL_JOBS}[args.job]
    work = Path(args.work or f"runs/observer-{job.name}-{time.strftime('%H%M%S')}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    order = ["alone", "default", "skip", "skip", "default", "alone"]
    runs: dict[str, list[dict]] = {m: [] for m in order[:3]}
    print(f"uptime: {run_zoo._uptime()}", flush=True)
    for r in range(args.rounds):
        for i, m in enumerate(order):
            res = one(job, m, args.steps, work, f"r{r}-{i}-{m}", args.threads, args.window_at)
            runs[m].append(res)
            print(f"  {res['tag']}: {res.get('step_ms', res.get('error'))} ms "
                  f"(load {res['load_before'][0]})", flush=True)
    mean = {m: run_zoo._mean([x["step_ms"] for x in rs if "step_ms" in x]) for m, rs in runs.items()}
    for m in ("default", "skip"):
        if mean[m] and mean["alone"]:
            print(f"{m}: {mean[m]:.1f} ms vs alone {mean['alone']:.1f} ms: "
                  f"{mean[m] / mean['alone']:.3f}x", flush=True)
    outside = run_zoo._mean([x["outside_ms"] for x in runs["default"] if "outside_ms" in x])
    extra = run_zoo._mean([x["window_extra_ms"] for x in runs["default"] if "window_extra_ms" in x])
    if outside and mean["alone"] and extra is not None:
        print(f"default outside its trace window: {outside:.1f} ms: {outside / mean['alone']:.3f}x "
              f"alone; the window's steps took {extra:.0f} ms beyond that pace, "
              f"{100 * extra / (1000 * mean['alone']):.1f}% of a 1,000-step job", flush=True)
    ratios = {m: [x["after_ms"] / x["before_ms"] for x in rs if "after_ms" in x] for m, rs in runs.items()}
    if all(ratios.values()):
        print("after the window / before it (each run): " + "; ".join(
            f"{m} {', '.join(f'{v:.3f}' for v in vs)}" for m, vs in ratios.items()), flush=True)
    print(f"uptime: {run_zoo._uptime()}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"job": job.name, "stat": job.stat, "runs": runs,
                                              "mean_ms": mean, "outside_ms": outside,
                                              "window_extra_ms": extra}, indent=1))


if __name__ == "__main__":
    main()
