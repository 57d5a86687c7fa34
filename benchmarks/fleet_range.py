"""Does ``gpudiag fleet`` answer within 30 s and 500 MB for 10,000 jobs, with a page under 3 MB,
and are its GPU-hours right at a long range (a 5-minute job in a week)?

Setup: synthetic history backfilled into a real Prometheus (``promtool tsdb create-blocks-from
openmetrics``): NODES x 8 GPUs over HISTORY days, one sample per GPU per SCRAPE seconds, jobs of
JOB_HOURS holding whole nodes with gaps between them, one job in ten a 5-minute one; 80% of jobs
under gpudiag (a signal, a label, a team and a user; most with an MFU and a recommendation,
some without an MFU, as a job without matmuls), 20% silent. The series are the agents' own:
``gpudiag_gpu_up`` per GPU, ``gpudiag_gpus_held`` and ``gpudiag_gpus_idle`` per job and node,
``gpudiag_job_*`` from the signals; ``--old-nodes`` of the nodes run an agent from before
``gpudiag_gpus_held`` (per-GPU series only: fleet reads their GPU-hours from those).

Printed, for ``gpudiag fleet`` over the last DAYS (the HISTORY before it is the previous
period the page compares with):

- the command itself (``python -m gpudiag fleet ... --out``) in a child process: wall time,
  peak RSS (``ru_maxrss``), the page's and the CSV's size;
- accuracy: each job's GPU-hours against the history's truth (its samples in the range x 8 GPUs
  x SCRAPE), the worst job and the worst 5-minute job;
- ``read_series`` cut into spans of ``--spans`` windows against the baseline in the same run:
  one query a name over the whole range; their ratio, and whether the sums agree.

    python benchmarks/fleet_range.py --short              # 16 GPUs, 2 days: a few minutes here
    python benchmarks/fleet_range.py --gpus 1000 --days 7 --history 14 --scrape 120 --keep DIR

The history is written as one file per 2-hour block and backfilled block by block (promtool
2.42 re-reads its whole input for each block it writes). ``--compacted`` times again once
Prometheus has merged those blocks, as a server that has run for weeks holds them.
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
GPUS_PER_NODE = 8


def jobs_of(gpus: int, start: float, end: float, hours: tuple[float, float], seed: int = 7) -> list[dict]:
    """Whole-node jobs back to back with gaps, one in ten lasting 5 minutes."""
    rng = random.Random(seed)
    jobs = []
    n = 0
    for node in range(max(1, gpus // GPUS_PER_NODE)):
        t = start + rng.uniform(0, 3600)
        while t < end:
            dur = 300.0 if rng.random() < 0.1 else rng.uniform(hours[0] * 3600, hours[1] * 3600)
            n += 1
            signal = rng.random() < 0.8
            mfu = rng.uniform(0.05, 0.6) if signal and rng.random() < 0.85 else None
            jobs.append({"node": node, "id": f"slurm:{n}", "t0": t, "t1": min(end, t + dur), "signal": signal,
                         "mfu": mfu, "label": rng.choice(LABELS),
                         "team": rng.choice(["vision", "nlp", "speech", "rl"]),
                         "user": f"user{rng.randrange(40)}", "idle": rng.random() < 0.15,
                         "step": rng.uniform(0.2, 2.0), "gain": rng.uniform(0.0, 0.6)})
            t += dur + rng.uniform(0, 1800)
    return jobs


def samples_of(t0: float, t1: float, scrape: int) -> list[float]:
    """A job's sample times: the scrape grid's points (whole multiples of SCRAPE) in [t0, t1)."""
    k = int(t0 // scrape)
    while k * scrape < t0:
        k += 1
    out = []
    while k * scrape < t1:
        out.append(float(k * scrape))
        k += 1
    return out


def _write_block(f, live: list[dict], w0: float, w1: float, scrape: int,  # a file
                 old_every: int) -> int:
    n = 0
    fams: dict[str, list[str]] = {}
    for j in live:
        ts = samples_of(max(j["t0"], w0), min(j["t1"], w1), scrape)
        if not ts:
            continue
        node = f'instance="node{j["node"]:04d}:9835",job="gpudiag"'
        for g in range(GPUS_PER_NODE):
            gl = f'{node},gpu="{g}",job_id="{j["id"]}"'
            fams.setdefault("gpudiag_gpu_up", []).extend(f"{{{gl}}} 1 {t:.0f}" for t in ts)
            n += len(ts)
        if not (old_every and j["node"] % old_every == 0):     # an agent with per-job GPU series
            jg = f'{node},job_id="{j["id"]}"'
            fams.setdefault("gpudiag_gpus_held", []).extend(f"{{{jg}}} {GPUS_PER_NODE} {t:.0f}" for t in ts)
            idle = GPUS_PER_NODE if j["idle"] else 0
            fams.setdefault("gpudiag_gpus_idle", []).extend(f"{{{jg}}} {idle} {t:.0f}" for t in ts)
            n += 2 * len(ts)
        if not j["signal"]:
            continue
        jl = f'{node},job_id="{j["id"]}",owner_uid="1000"'
        per = {"gpudiag_job_last_signal_timestamp_seconds": (jl, None),
               "gpudiag_job_bottleneck": (f'{jl},label="{j["label"]}"', "1"),
               "gpudiag_job_team_info": (f'{jl},team="{j["team"]}"', "1"),
               "gpudiag_job_owner_info": (f'{jl},user="{j["user"]}"', "1"),
               "gpudiag_job_step_seconds": (jl, f"{j['step']:.4f}"),
               "gpudiag_job_recommendation_info": (f'{jl},action="dataloader-workers"', "1"),
               "gpudiag_job_recommendation_predicted_step_seconds":
                   (jl, f"{j['step'] * (1 - j['gain']):.4f}")}
        if j["mfu"] is not None:
            per["gpudiag_job_mfu_ratio"] = (jl, f"{j['mfu']:.4f}")
        for fam, (lab, v) in per.items():
            fams.setdefault(fam, []).extend(f"{{{lab}}} {v if v is not None else f'{t:.0f}'} {t:.0f}"
                                            for t in ts)
            n += len(ts)
    for fam, lines in fams.items():
        f.write(f"# TYPE {fam} gauge\n")
        f.writelines(f"{fam}{line}\n" for line in lines)
    return n


def free_gpus(jobs: list[dict], gpus: int, start: float, end: float) -> list[dict]:
    """A node's GPUs between its jobs, exported as an agent does: job_id "" (idle)."""
    out = []
    for node in range(max(1, gpus // GPUS_PER_NODE)):
        t = start
        for j in sorted((j for j in jobs if j["node"] == node), key=lambda j: j["t0"]):
            if j["t0"] > t:
                out.append({"node": node, "id": "", "t0": t, "t1": j["t0"], "signal": False, "idle": True})
            t = max(t, j["t1"])
        if t < end:
            out.append({"node": node, "id": "", "t0": t, "t1": end, "signal": False, "idle": True})
    return out


def history(folder: Path, gpus: int, days: float, scrape: int, hours: tuple[float, float],
            written: Callable[[Path], None], old_every: int = 0) -> tuple[float, float, int, int, list[dict]]:
    """One OpenMetrics file per 2-hour block, each handed to ``written`` as it is done;
    (start, end, samples, files, jobs). start is aligned to a block, so no two files write into
    one block; the files are backfilled (and removed) while the next are written."""
    end = float(int(time.time()) // BLOCK * BLOCK - BLOCK)
    start = end - int(days * 86400) // BLOCK * BLOCK
    jobs = jobs_of(gpus, start, end, hours)
    held = sorted(jobs + free_gpus(jobs, gpus, start, end), key=lambda j: (j["node"], j["t0"]))
    samples = files = 0
    w0 = start
    while w0 < end:
        w1 = w0 + BLOCK
        path = folder / f"h{int(w0)}.om"
        with path.open("w") as f:
            live = [j for j in held if j["t0"] < w1 and j["t1"] > w0]
            samples += _write_block(f, live, w0, w1, scrape, old_every)
            f.write("# EOF\n")
        written(path)
        files += 1
        w0 = w1
    return start, end, samples, files, jobs


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


# the command in a child that reports its own peak RSS (RUSAGE_CHILDREN would mix in promtool's)
CHILD = ("import atexit, resource, sys\n"
         "u = lambda: resource.getrusage(resource.RUSAGE_SELF)\n"
         "atexit.register(lambda: sys.stderr.write('MAXRSS_KB %d CPU_S %.2f\\n' % "
         "(u().ru_maxrss, u().ru_utime + u().ru_stime)))\n"
         "sys.argv = ['gpudiag', *sys.argv[1:]]\n"
         "from gpudiag.cli import run\n"
         "run()\n")


def command(base: str, start: float, end: float, scrape: int, out: Path) -> dict:
    """``gpudiag fleet`` as a person runs it, in a child process: its wall time and peak RSS,
    the page's and the CSV's size; then its --json for the accuracy check."""
    args = ["fleet", "--prometheus", base, "--from", f"{start:.0f}", "--to", f"{end:.0f}",
            "--scrape-interval", f"{scrape}s", "--no-slurm"]
    prom_cpu = metric(base, "process_cpu_seconds_total")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, *args, "--out", str(out)], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    prom_cpu = metric(base, "process_cpu_seconds_total") - prom_cpu
    tail = p.stderr.rsplit("MAXRSS_KB ", 1)[1].split()
    rss_kb, cpu_s = int(tail[0]), float(tail[2])
    doc = json.loads(subprocess.run([sys.executable, "-m", "gpudiag", *args, "--json"], check=True, cwd=REPO,
                                    capture_output=True, text=True).stdout)
    return {"wall_s": wall, "cpu_s": cpu_s, "prom_cpu_s": prom_cpu, "rss_mb": rss_kb / 1024,
            "page_bytes": out.stat().st_size, "csv_bytes": out.with_suffix(".csv").stat().st_size, "doc": doc}


def accuracy(doc: dict, jobs: list[dict], start: float, end: float, scrape: int) -> str:
    """Each job's GPU-hours against the truth: its samples in (start, end] x 8 GPUs x scrape."""
    got = {j["job_id"]: j["gpu_hours"] for j in doc["jobs"]}
    worst, worst_short, missing = (0.0, ""), (0.0, ""), 0
    for j in jobs:
        if not j["id"]:
            continue
        ts = [t for t in samples_of(j["t0"], j["t1"], scrape) if start < t <= end]
        if not ts:
            continue
        truth = len(ts) * GPUS_PER_NODE * scrape / 3600
        if j["id"] not in got:
            missing += 1
            continue
        err = abs(got[j["id"]] / truth - 1)
        worst = max(worst, (err, j["id"]))
        if j["t1"] - j["t0"] <= 300:
            worst_short = max(worst_short, (err, j["id"]))
    return (f"worst job {worst[0]:.2%} ({worst[1]}), worst 5-minute job {worst_short[0]:.2%} "
            f"({worst_short[1]}), jobs missing {missing}")


def timed(base: str, start: float, end: float, scrape: int, what: str, span_points: list[int]) -> None:
    """read_series in spans of each SPAN_POINTS given, and the baseline in the same run: one
    query a name over the whole range."""
    from gpudiag.live.fleet import summarise
    from gpudiag.live.fleet_query import FleetData, grid_for, read_series
    from gpudiag.live.prom_client import Prometheus

    prom, grid = Prometheus(base), grid_for(start, end)

    def run(points: int) -> tuple[float, object]:
        t = time.perf_counter()
        series = read_series(prom, grid, points, timeout=600)
        insts = {x.labels.get("instance", "") for v in series.values() for x in v}
        s = summarise(FleetData(base, grid, series, {i: float(scrape) for i in insts}))
        return time.perf_counter() - t, s

    from gpudiag.live.prom_client import PrometheusUnavailable

    try:
        base_s, ref = run(grid.n)
    except PrometheusUnavailable as e:
        print(f"{what}: baseline, one query a name over the whole range: failed: {e}")
        return
    print(f"{what}: baseline, one query a name over the whole range ({grid.n} windows of {grid.step:g} s, "
          f"{len(ref.jobs):,} jobs, {ref.totals.gpu_hours:,.0f} GPU-hours): {base_s:.2f} s read + summed")
    for points in span_points:
        secs, s = run(points)
        same = len(s.jobs) == len(ref.jobs) and abs(s.totals.gpu_hours - ref.totals.gpu_hours) < 1e-6 * \
            max(ref.totals.gpu_hours, 1)
        print(f"  spans of {points} windows ({-(-grid.n // points)} queries a name): {secs:.2f} s; ratio to "
              f"the baseline {secs / base_s:.2f}; same sums: {same}")
        if not same:
            raise SystemExit("fleet_range: spans changed the sums")


def report(base: str, start: float, end: float, scrape: int, jobs: list[dict], tmp: Path, what: str,
           points: list[int]) -> None:
    import os

    got = command(base, start, end, scrape, tmp / "fleet.html")
    doc = got["doc"]
    before = doc["previous"]["totals"]["jobs"] if doc["previous"] else 0
    print(f"{what}: gpudiag fleet over {(end - start) / 86400:g} days, {len(doc['jobs']):,} jobs "
          f"(previous period: {before:,}): {got['wall_s']:.1f} s (CPU: {got['cpu_s']:.1f} s gpudiag, "
          f"{got['prom_cpu_s']:.1f} s Prometheus), "
          f"peak RSS {got['rss_mb']:.0f} MB, page {got['page_bytes'] / 2**20:.2f} MB, "
          f"CSV {got['csv_bytes'] / 2**20:.2f} MB (load average {os.getloadavg()[0]:.1f})")
    print(f"  accuracy: {accuracy(doc, jobs, doc['start'], doc['end'], scrape)}")
    if points:
        timed(base, start, end, scrape, what, points)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--days", type=float, default=7.0, help="the range read")
    ap.add_argument("--history", type=float, default=14.0, help="days of history (the previous period too)")
    ap.add_argument("--scrape", type=int, default=120, help="seconds between samples")
    ap.add_argument("--job-hours", default="0.5,4", help="job lengths, min,max hours")
    ap.add_argument("--old-nodes", type=int, default=10, metavar="N",
                    help="every Nth node runs an agent from before gpudiag_gpus_held (0: none)")
    ap.add_argument("--short", action="store_true", help="16 GPUs, 2 days of a 4-day history")
    ap.add_argument("--workers", type=int, default=2, help="promtool runs at a time")
    ap.add_argument("--spans", default="150",
                    help="comma-separated windows per query to time against one query a name (default: 150; "
                         "'' times the command alone)")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="keep the history in DIR, and time an earlier run's again if DIR holds one")
    ap.add_argument("--compacted", action="store_true",
                    help="time again once Prometheus has compacted the 2-hour blocks")
    args = ap.parse_args()
    if args.short:
        args.gpus, args.days, args.history = 16, 2.0, 4.0
    hours = tuple(float(x) for x in args.job_hours.split(","))
    from tests.harness import free_port, wait_http

    tmp = args.keep or Path(tempfile.mkdtemp(prefix="gpudiag-fleet-bench-"))
    saved = tmp / "range.json"
    proc = None
    try:
        shape = {"gpus": args.gpus, "history": args.history, "scrape": args.scrape, "job_hours": list(hours),
                 "old_nodes": args.old_nodes}
        if saved.exists():     # --keep of an earlier run: its history again, as it is now
            kept = json.loads(saved.read_text())
            if isinstance(kept, list) or kept["shape"] != shape:
                # the truth is made again from the history's shape: another shape's jobs would be
                # compared with these (every job 'missing' or thousands of percent off)
                was = "not recorded" if isinstance(kept, list) else kept["shape"]
                raise SystemExit(f"fleet_range: {tmp} holds a history of another shape ({was}; asked: "
                                 f"{shape}): give its options again, or another --keep folder")
            start, end, samples, files = kept["range"]
            jobs = jobs_of(args.gpus, start, end, hours)
            backfill_s = 0.0
        else:
            tmp.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            slots = threading.Semaphore(args.workers)   # at most WORKERS files wait or run in promtool
            futures = []
            with ThreadPoolExecutor(args.workers) as pool:
                def written(path: Path) -> None:
                    slots.acquire()
                    futures.append(pool.submit(backfill, path, tmp / "tsdb"))
                    futures[-1].add_done_callback(lambda _f: slots.release())

                start, end, samples, files, jobs = history(tmp, args.gpus, args.history, args.scrape, hours,
                                                           written, args.old_nodes)
            for f in futures:
                f.result()   # a promtool failure ends the benchmark with its error
            backfill_s = time.perf_counter() - t
            saved.write_text(json.dumps({"shape": shape, "range": [start, end, samples, files]}))
        port = free_port()
        (tmp / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'tsdb'}", "--storage.tsdb.retention.time=400d",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/-/ready", timeout=120)
        print(f"{args.gpus} GPUs x {args.history:g} days, a sample every {args.scrape} s: "
              f"{samples:,} samples in {files} block files, "
              + (f"written and backfilled in {backfill_s:.1f} s" if backfill_s
                 else f"kept in {tmp} by an earlier run"))
        points = [int(x) for x in args.spans.split(",") if x]
        how = "as kept" if backfill_s == 0 else "as backfilled"
        r0 = end - args.days * 86400
        report(base, r0, end, args.scrape, jobs, tmp, f"{how} ({blocks(base)} blocks)", points)
        if args.compacted:
            t = time.perf_counter()
            settle(base)
            print(f"  Prometheus compacted the blocks in {time.perf_counter() - t:.0f} s")
            report(base, r0, end, args.scrape, jobs, tmp, f"compacted ({blocks(base)} blocks)", points)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
