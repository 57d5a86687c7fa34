"""Does ``gpudiag fleet`` answer in seconds over a long range of many GPUs?

Setup: synthetic history backfilled into a real Prometheus (``promtool tsdb create-blocks-from
openmetrics``): NODES x 8 GPUs over DAYS, one sample per GPU per SCRAPE seconds, jobs of 1-12 h
holding whole nodes with gaps between them, 80% of jobs reporting MFU and a label, 20% silent.
The numbers are the agents' own series (``gpudiag_gpu_up``, ``gpudiag_gpu_sm_activity_ratio``,
``gpudiag_job_mfu_ratio``, ``gpudiag_job_bottleneck``, ``gpudiag_job_team_info``).

Printed: the wall time of ``read_fleet`` + ``summarise`` at the step sized to the range (at most
1,000 points a series), and the baseline: the same ``gpus`` query at the scrape interval (what
an unsized step would ask, capped at Prometheus' 11,000 points), in the same run; their ratio.

    python benchmarks/fleet_range.py --short              # 16 GPUs, 2 days: a minute here
    python benchmarks/fleet_range.py --gpus 1000 --days 30 --scrape 60   # the issue's month

Backfilled history has no staleness markers (a scraped target's do), so a GPU's series lingers
for Prometheus' 5-minute lookback after its job ends: the sums here are for timing, not truth.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.harness: the same Prometheus helpers as the tests

LABELS = ["compute-bound", "memory-bound", "communication-bound", "input-bound", "host-bound"]


def history(path: Path, gpus: int, days: float, scrape: int, seed: int = 7) -> tuple[float, float, int]:
    """Write the OpenMetrics file; (start, end, samples)."""
    rng = random.Random(seed)
    end = float(int(time.time()) // scrape * scrape - 3600)
    start = end - days * 86400
    nodes = max(1, gpus // 8)
    jobs = []  # (node, job_id, t0, t1, mfu or None, label, team)
    n = 0
    for node in range(nodes):
        t = start + rng.uniform(0, 3600)
        while t < end:
            dur = rng.uniform(3600, 12 * 3600)
            n += 1
            signal = rng.random() < 0.8
            jobs.append((node, f"slurm:{n}", t, min(end, t + dur), rng.uniform(0.05, 0.6) if signal else None,
                         rng.choice(LABELS), rng.choice(["vision", "nlp", "speech", "rl"])))
            t += dur + rng.uniform(0, 1800)
    samples = 0
    with path.open("w") as f:
        def ts(t0: float, t1: float):  # noqa: ANN202
            k = int((t0 - start) // scrape) + 1
            while start + k * scrape < t1:
                yield start + k * scrape
                k += 1

        for fam in ("gpudiag_gpu_up", "gpudiag_gpu_sm_activity_ratio"):
            f.write(f"# TYPE {fam} gauge\n")
            for node, job, t0, t1, mfu, _, _ in jobs:
                for g in range(8):
                    lab = f'{{instance="node{node:04d}:9835",job="gpudiag",gpu="{g}",job_id="{job}"}}'
                    v = "1" if fam == "gpudiag_gpu_up" else f"{(mfu or 0.02) * 1.4:.3f}"
                    for t in ts(t0, t1):
                        f.write(f"{fam}{lab} {v} {t:.0f}\n")
                        samples += 1
        for fam in ("gpudiag_job_mfu_ratio", "gpudiag_job_bottleneck", "gpudiag_job_team_info"):
            f.write(f"# TYPE {fam} gauge\n")
            for node, job, t0, t1, mfu, label, team in jobs:
                if mfu is None:
                    continue
                extra = {"gpudiag_job_bottleneck": f',label="{label}"',
                         "gpudiag_job_team_info": f',team="{team}"'}.get(fam, "")
                lab = (f'{{instance="node{node:04d}:9835",job="gpudiag",job_id="{job}",'
                       f'owner_uid="1000"{extra}}}')
                v = f"{mfu:.4f}" if fam == "gpudiag_job_mfu_ratio" else "1"
                for t in ts(t0, t1):
                    f.write(f"{fam}{lab} {v} {t:.0f}\n")
                    samples += 1
        f.write("# EOF\n")
    return start, end, samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--scrape", type=int, default=60, help="seconds between samples")
    ap.add_argument("--short", action="store_true", help="16 GPUs over 2 days")
    args = ap.parse_args()
    if args.short:
        args.gpus, args.days = 16, 2.0
    from gpudiag.live.fleet import summarise
    from gpudiag.live.fleet_query import QUERIES, range_query, read_fleet
    from tests.harness import free_port, wait_http

    tmp = Path(tempfile.mkdtemp(prefix="gpudiag-fleet-bench-"))
    proc = None
    try:
        t = time.perf_counter()
        start, end, samples = history(tmp / "history.om", args.gpus, args.days, args.scrape)
        gen_s = time.perf_counter() - t
        t = time.perf_counter()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q",
                        str(tmp / "history.om"), str(tmp / "tsdb")], check=True,
                       stdout=subprocess.DEVNULL)
        backfill_s = time.perf_counter() - t
        (tmp / "history.om").unlink()
        port = free_port()
        (tmp / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'tsdb'}", "--storage.tsdb.retention.time=400d",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/-/ready", timeout=120)
        t = time.perf_counter()
        data = read_fleet(base, start, end)
        read_s = time.perf_counter() - t
        s = summarise(data)
        fleet_s = time.perf_counter() - t
        per_query = []
        for name, expr in QUERIES.items():
            q0 = time.perf_counter()
            got = range_query(base, expr, start, end, data.step)
            per_query.append(f"{name} {time.perf_counter() - q0:.2f} s "
                             f"({sum(len(x.points) for x in got):,} points)")
        fine = max(args.scrape, (end - start) / 11000)
        t = time.perf_counter()
        range_query(base, QUERIES["gpus"], start, end, fine, timeout=600)
        base_s = time.perf_counter() - t
        print(f"{args.gpus} GPUs x {args.days:g} days, a sample every {args.scrape} s: {samples:,} samples "
              f"(written in {gen_s:.1f} s, backfilled in {backfill_s:.1f} s)")
        print(f"gpudiag fleet (step {data.step:g} s, {len(s.jobs)} jobs, {s.gpu_hours:,.0f} GPU-hours): "
              f"{fleet_s:.2f} s for all {len(QUERIES)} queries and the sums ({read_s:.2f} s reading, "
              f"{fleet_s - read_s:.2f} s summing)")
        print("  each query again: " + "; ".join(per_query))
        print(f"baseline: the gpus query alone at a {fine:g} s step: {base_s:.2f} s; "
              f"ratio fleet/baseline {fleet_s / base_s:.2f}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
