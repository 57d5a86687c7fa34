"""Does ``gpudiag fleet`` answer in seconds over a long range of many GPUs?

Setup: synthetic history backfilled into a real Prometheus (``promtool tsdb create-blocks-from
openmetrics``): NODES x 8 GPUs over DAYS, one sample per GPU per SCRAPE seconds, jobs of 1-12 h
holding whole nodes with gaps between them, 80% of jobs reporting MFU and a label, 20% silent.
The numbers are the agents' own series (``gpudiag_gpu_up``, ``gpudiag_gpu_sm_activity_ratio``,
``gpudiag_job_mfu_ratio``, ``gpudiag_job_bottleneck``, ``gpudiag_job_team_info``).

Printed: the wall time of ``read_fleet`` + ``summarise`` at the step sized to the range (at most
1,000 points a series), each query cut into spans of ``--spans`` instants, and the baseline in
the same run: one query a name over the whole range (how ``gpudiag fleet`` read before spans);
their ratio, and whether the sums agree.

    python benchmarks/fleet_range.py --short              # 16 GPUs, 2 days: a minute here
    python benchmarks/fleet_range.py --gpus 1000 --days 30 --scrape 300 --spans 12,48,200 --compacted

The history is written as one file per 2-hour block and backfilled block by block (promtool
2.42 re-reads its whole input for each block it writes, so one file for a month would be read
360 times). ``--compacted`` times again once Prometheus has merged those blocks, as a server
that has run for a month holds them.

Backfilled history has no staleness markers (a scraped target's do), so a GPU's series lingers
for Prometheus' 5-minute lookback after its job ends: the sums here are for timing, not truth.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.harness: the same Prometheus helpers as the tests

LABELS = ["compute-bound", "memory-bound", "communication-bound", "input-bound", "host-bound"]


BLOCK = 7200  # promtool 2.42 writes 2-hour blocks and re-reads its whole input for each one


def jobs_of(gpus: int, start: float, end: float, seed: int = 7) -> list[tuple]:
    """(node, job_id, t0, t1, mfu or None, label, team) for NODES x 8 GPUs between start and end."""
    rng = random.Random(seed)
    jobs = []
    n = 0
    for node in range(max(1, gpus // 8)):
        t = start + rng.uniform(0, 3600)
        while t < end:
            dur = rng.uniform(3600, 12 * 3600)
            n += 1
            signal = rng.random() < 0.8
            jobs.append((node, f"slurm:{n}", t, min(end, t + dur), rng.uniform(0.05, 0.6) if signal else None,
                         rng.choice(LABELS), rng.choice(["vision", "nlp", "speech", "rl"])))
            t += dur + rng.uniform(0, 1800)
    return jobs


def history(folder: Path, gpus: int, days: float, scrape: int,
            written: Callable[[Path], None]) -> tuple[float, float, int, int]:
    """Write one OpenMetrics file per 2-hour block, handing each to ``written`` as it is done;
    (start, end, samples, files).

    One file per block, because promtool 2.42 reads its whole input once for each block it
    writes: a month in one file is 360 passes over all of it, a file per block is two passes
    over each sample. start is aligned to a block, so no two files write into one block. The
    files are backfilled (and removed) while the next ones are written: a month of 1,000 GPUs
    is some 8 GB of text."""
    end = float(int(time.time()) // BLOCK * BLOCK - BLOCK)
    start = end - int(days * 86400) // BLOCK * BLOCK
    jobs = jobs_of(gpus, start, end)
    samples = 0
    files = 0

    def ts(t0: float, t1: float):
        k = max(0, int((t0 - start) // scrape) + 1)
        while start + k * scrape < t1:
            yield start + k * scrape
            k += 1

    w0 = start
    while w0 < end:
        w1 = w0 + BLOCK
        live = [j for j in jobs if j[2] < w1 and j[3] > w0]
        path = folder / f"h{int(w0)}.om"
        with path.open("w") as f:
            for fam in ("gpudiag_gpu_up", "gpudiag_gpu_sm_activity_ratio"):
                f.write(f"# TYPE {fam} gauge\n")
                for node, job, t0, t1, mfu, _, _ in live:
                    times = [f" {t:.0f}\n" for t in ts(max(t0, w0 - 1e-9), min(t1, w1))
                             if w0 <= t < w1]
                    v = "1" if fam == "gpudiag_gpu_up" else f"{(mfu or 0.02) * 1.4:.3f}"
                    for g in range(8):
                        head = (f'{fam}{{instance="node{node:04d}:9835",job="gpudiag",gpu="{g}",'
                                f'job_id="{job}"}} {v}')
                        f.writelines(head + x for x in times)
                        samples += len(times)
            for fam in ("gpudiag_job_mfu_ratio", "gpudiag_job_bottleneck", "gpudiag_job_team_info"):
                f.write(f"# TYPE {fam} gauge\n")
                for node, job, t0, t1, mfu, label, team in live:
                    if mfu is None:
                        continue
                    extra = {"gpudiag_job_bottleneck": f',label="{label}"',
                             "gpudiag_job_team_info": f',team="{team}"'}.get(fam, "")
                    v = f"{mfu:.4f}" if fam == "gpudiag_job_mfu_ratio" else "1"
                    head = (f'{fam}{{instance="node{node:04d}:9835",job="gpudiag",job_id="{job}",'
                            f'owner_uid="1000"{extra}}} {v}')
                    times = [f" {t:.0f}\n" for t in ts(max(t0, w0 - 1e-9), min(t1, w1)) if w0 <= t < w1]
                    f.writelines(head + x for x in times)
                    samples += len(times)
            f.write("# EOF\n")
        written(path)
        files += 1
        w0 = w1
    return start, end, samples, files


def backfill(path: Path, tsdb: Path) -> None:
    """promtool on one block's file, into the TSDB folder (each block is its own folder there,
    so runs at once do not meet); the file is removed once written."""
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(path), str(tsdb)],
                   check=True, stdout=subprocess.DEVNULL)
    path.unlink()


def metric(base: str, name: str) -> float:
    """One of Prometheus's own metrics, from its /metrics page."""
    import urllib.request

    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise SystemExit(f"fleet_range: Prometheus at {base} does not export {name}")


def blocks(base: str) -> int:
    return int(metric(base, "prometheus_tsdb_blocks_loaded"))


def settle(base: str, quiet_s: float = 150.0) -> None:
    """Wait until Prometheus has run no compaction for QUIET_S (its compactor wakes every minute
    and runs every plan it has, so two quiet wake-ups mean nothing is left to merge)."""
    last, since = metric(base, "prometheus_tsdb_compactions_total"), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(10)
        now = metric(base, "prometheus_tsdb_compactions_total")
        if now != last:
            last, since = now, time.monotonic()


def timed(base: str, start: float, end: float, what: str, span_points: list[int]) -> None:
    """Time read_fleet + summarise with the range cut into spans of each SPAN_POINTS given, and
    the baseline in the same run: one query a name over the whole range (no spans), as before."""
    from gpudiag.live.fleet import summarise
    from gpudiag.live.fleet_query import read_fleet, step_for

    def run(points: int) -> tuple[float, float, object]:
        t = time.perf_counter()
        data = read_fleet(base, start, end, span_points=points, timeout=600)
        read_s = time.perf_counter() - t
        s = summarise(data)
        return time.perf_counter() - t, read_s, s

    steps = int((end - start) // step_for(start, end)) + 1
    base_s, base_read, ref = run(steps)
    print(f"{what}: baseline, one query a name over the whole range ({steps} instants, step "
          f"{step_for(start, end):g} s, {len(ref.jobs):,} jobs, {ref.gpu_hours:,.0f} GPU-hours): "
          f"{base_s:.2f} s ({base_read:.2f} s reading, {base_s - base_read:.2f} s summing)")
    for points in span_points:
        fleet_s, read_s, s = run(points)
        same = (len(s.jobs) == len(ref.jobs) and abs(s.gpu_hours - ref.gpu_hours) < 1e-6 * ref.gpu_hours
                and abs(s.useful_gpu_hours - ref.useful_gpu_hours) < 1e-6 * max(ref.useful_gpu_hours, 1))
        print(f"  spans of {points} instants ({-(-steps // points)} queries a name): {fleet_s:.2f} s "
              f"({read_s:.2f} s reading, {fleet_s - read_s:.2f} s summing); ratio to the baseline "
              f"{fleet_s / base_s:.2f}; same sums: {same}")
        if not same:
            raise SystemExit("fleet_range: spans changed the sums")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--scrape", type=int, default=60, help="seconds between samples")
    ap.add_argument("--short", action="store_true", help="16 GPUs over 2 days")
    ap.add_argument("--workers", type=int, default=2, help="promtool runs at a time")
    ap.add_argument("--spans", default="48",
                    help="comma-separated instants per query to time (gpudiag's default: 48)")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="keep the history in DIR, and time an earlier run's again if DIR holds one")
    ap.add_argument("--compacted", action="store_true",
                    help="time again once Prometheus has compacted the 2-hour blocks (as a month-old "
                         "server holds them)")
    args = ap.parse_args()
    if args.short:
        args.gpus, args.days = 16, 2.0
    from tests.harness import free_port, wait_http

    tmp = args.keep or Path(tempfile.mkdtemp(prefix="gpudiag-fleet-bench-"))
    saved = tmp / "range.json"
    proc = None
    try:
        if saved.exists():     # --keep of an earlier run: its history again, as it is now
            start, end, samples, files = json.loads(saved.read_text())
            backfill_s = 0.0
        else:
            tmp.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            # at most WORKERS block files wait or run in promtool at once
            slots = threading.Semaphore(args.workers)
            futures = []
            with ThreadPoolExecutor(args.workers) as pool:
                def written(path: Path) -> None:
                    slots.acquire()
                    futures.append(pool.submit(backfill, path, tmp / "tsdb"))
                    futures[-1].add_done_callback(lambda _f: slots.release())

                start, end, samples, files = history(tmp, args.gpus, args.days, args.scrape, written)
            for f in futures:
                f.result()   # a promtool failure ends the benchmark with its error
            backfill_s = time.perf_counter() - t
            saved.write_text(json.dumps([start, end, samples, files]))
        port = free_port()
        (tmp / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'tsdb'}", "--storage.tsdb.retention.time=400d",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/-/ready", timeout=120)
        print(f"{args.gpus} GPUs x {args.days:g} days, a sample every {args.scrape} s: {samples:,} samples "
              f"in {files} block files, " + (f"written and backfilled in {backfill_s:.1f} s" if backfill_s
                                             else f"kept in {tmp} by an earlier run"))
        points = [int(x) for x in args.spans.split(",")]
        how = "as kept" if backfill_s == 0 else "as backfilled"
        timed(base, start, end, f"{how} ({blocks(base)} blocks)", points)
        if args.compacted:
            t = time.perf_counter()
            settle(base)
            print(f"  Prometheus compacted the blocks in {time.perf_counter() - t:.0f} s")
            timed(base, start, end, f"compacted ({blocks(base)} blocks)", points)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
