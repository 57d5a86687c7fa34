"""A job's variants alone, in palindromes, without gpudiag: for a fix read again after the zoo
run (a second round where the first was noisy, or a knob read differently from the advice).

    .venv/bin/python benchmarks/zoo/run_variants.py JOB --variant NAME="--flag value" ...
        [--rounds N] [--quick] [--max-seconds S] [--out FILE]

Prints each run's step (the job's own timer: median, or mean for jobs judged by the mean) with
the load, and per variant the mean of its runs over the base's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_zoo  # noqa: E402
from zoo_jobs import ALL_JOBS  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job")
    p.add_argument("--variant", action="append", default=[], metavar='NAME="ARGS"')
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--max-seconds", type=float, default=run_zoo.GUARD[0])
    p.add_argument("--work", default="")
    p.add_argument("--out", default="")
    args = p.parse_args()
    job = {j.name: j for j in ALL_JOBS}[args.job]
    variants = {}
    for v in args.variant:
        name, _, rest = v.partition("=")
        variants[name] = shlex.split(rest)
    run_zoo.GUARD[:] = [args.max_seconds]
    work = Path(args.work or f"runs/variants-{job.name}-{time.strftime('%H%M%S')}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"uptime: {run_zoo._uptime()}", flush=True)
    runs = run_zoo.palindrome(job, variants, args.rounds, args.quick, work)
    steps = {n: [s for s in (run_zoo.step_of(job, r) for r in rs) if s] for n, rs in runs.items()}
    base = run_zoo._mean(steps["base"])
    summary = {}
    for n, xs in steps.items():
        m = run_zoo._mean(xs)
        summary[n] = {"runs_ms": xs, "mean_ms": m, "over_base": m / base if m and base else None,
                      "args": variants.get(n, [])}
        print(f"{n}: runs {[round(x, 1) for x in xs]} mean {m:.1f} ms "
              f"({summary[n]['over_base']:.2f}x base)", flush=True)
    print(f"uptime: {run_zoo._uptime()}", flush=True)
    seen = [r[k][0] for rs in runs.values() for r in rs for k in ("load_before", "load_after")]
    out = {"job": job.name, "stat": job.stat, "summary": summary,
           "load_range": [min(seen), max(seen)]}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
