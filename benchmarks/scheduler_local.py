"""The local scheduler under a full queue: submit -> start latency, one scheduling pass, daemon RSS.

    python benchmarks/scheduler_local.py [--queued 1000] [--submits 100]

Targets (issue 11): submit -> start p99 < 200 ms with 1,000 queued jobs; one scheduling pass
< 10 ms at 1,000 queued jobs; daemon RSS < 100 MB. Each number is printed with a baseline
measured in the same run: the latency against starting the same command with a bare
``subprocess.Popen`` (what no scheduler costs), the pass against the same pass under the EASY
baseline policy (no priority terms), the RSS against a bare interpreter that imports the policy.

The daemon runs with ``--slots 8 --no-monitor`` (the profile wrapper's Python start-up would
measure ``gpudiag profile``, not the scheduler). A 4-slot job holds half the machine; the queue
is ``--queued`` 8-slot jobs (the head gets a reservation, the rest wait behind it); each timed
submit is an on-demand 1-slot job whose first act is to write the time it started.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpudiag.scheduler.local.containment import Containment
from gpudiag.scheduler.local.engine import Engine, Machine
from gpudiag.scheduler.local.protocol import call
from gpudiag.scheduler.local.store import PENDING, RUNNING, JobRow, read_prefix
from gpudiag.scheduler.model import Policy
from gpudiag.scheduler.priority import MfuBook

STAMP = 'date +%s.%N > "$0"'


def p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def rss_mb(pid: int) -> tuple[float, float]:
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            vals[k] = int(v.split()[0]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


def wait_file(path: Path, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text().strip()
            if text:
                return float(text)
        except FileNotFoundError:
            pass
        time.sleep(0.001)
    raise TimeoutError(path)


def submit_to_start(sock: Path, tmp: Path, n: int) -> list[float]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    out = []
    for i in range(n):
        stamp = tmp / f"s{i}"
        t0 = time.time()
        call(sock, {"op": "submit", "cmd": ["sh", "-c", STAMP, str(stamp)], "gpus": 1, "tier": "on-demand",
                    "grace_s": 1, "env": env, "cwd": "/"})
        out.append(wait_file(stamp) - t0)
    return out


def bare_start(tmp: Path, n: int) -> list[float]:
    out = []
    for i in range(n):
        stamp = tmp / f"b{i}"
        t0 = time.time()
        subprocess.Popen(["sh", "-c", STAMP, str(stamp)], start_new_session=True)
        out.append(wait_file(stamp) - t0)
    return out


def pass_times(queued: int, policy: Policy, reps: int = 50) -> tuple[list[float], float]:
    machine = Machine(tuple(str(i) for i in range(8)), False)
    engine = Engine(machine, policy, MfuBook(policy.history_half_life_s), {})
    now = time.time()

    def row(i: int, gpus: int, state: str) -> JobRow:
        return JobRow(id=i, uid=0, user="u", team=f"t{i % 4}", name="", key=f"u/k{i % 50}", tier=1, gpus=gpus,
                      grace_s=30, time_limit_s=None, cmd=["true"], env={}, cwd="/", submit_t=now - queued + i,
                      state=state, slots=["0", "1", "2", "3"] if state == RUNNING else None,
                      started_t=now - 10 if state == RUNNING else None)

    active = [row(0, 4, RUNNING)]
    pending = [row(i, 8, PENDING) for i in range(1, queued + 1)]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        engine.decide(pending, active, {}, {}, now, True)
        times.append(time.perf_counter() - t0)
    last = engine.plan(pending, active, {}, {}, now, True)   # the daemon keeps its last pass
    rows = {r.id: r for r in (*pending, *active)}
    t0 = time.perf_counter()
    for why in last.why.values():   # what `gpudiag queue` asks of it: every reason, in words
        engine.describe(why, rows, now)
    return times, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queued", type=int, default=1000)
    ap.add_argument("--submits", type=int, default=100)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpudiag-sched-bench-"))
    state = tmp / "state"
    daemon = subprocess.Popen([sys.executable, "-m", "gpudiag", "scheduler", "serve", "--state-dir",
                               str(state), "--slots", "8", "--no-monitor", "--max-pending", "0",
                               "--agent-dir", str(tmp / "no-agent")],   # one user queues --queued jobs
                              stderr=subprocess.DEVNULL)
    sock = state / "sock"
    try:
        while not sock.exists():
            time.sleep(0.05)
        time.sleep(0.2)
        base = {"op": "submit", "tier": "reserved", "grace_s": 1, "env": {}, "cwd": "/"}
        call(sock, {**base, "cmd": ["sleep", "3600"], "gpus": 4})
        t0 = time.perf_counter()
        for _ in range(args.queued):
            call(sock, {**base, "cmd": ["true"], "gpus": 8})
        fill = time.perf_counter() - t0
        lat = submit_to_start(sock, tmp, args.submits)
        bare = bare_start(tmp, args.submits)
        t0 = time.perf_counter()
        q = call(sock, {"op": "queue"})
        queue_s = time.perf_counter() - t0
        rss, hwm = rss_mb(daemon.pid)
        probe = subprocess.run([sys.executable, "-c", "import gpudiag.scheduler.policy, sqlite3, pathlib;"
                                "print(pathlib.Path('/proc/self/status').read_text())"],
                               capture_output=True, text=True).stdout
        bare_rss = next(int(x.split()[1]) for x in probe.splitlines() if x.startswith("VmRSS")) / 1024
    finally:
        daemon.terminate()
        daemon.wait()
        # its jobs (and their cgroups) outlive it by design
        Containment(read_prefix(state / "scheduler.db"), use_cgroups=False).end_all()
        shutil.rmtree(tmp, ignore_errors=True)
    ours, queue_reasons = pass_times(args.queued, Policy())
    easy, _ = pass_times(args.queued, Policy.easy())
    pending = sum(1 for j in q["jobs"] if j["state"] == "pending")
    print(f"queue: {pending} pending jobs ({args.queued} submitted in {fill:.1f} s, "
          f"{fill / args.queued * 1000:.1f} ms each)")
    print(f"submit -> start, {args.submits} on-demand jobs: p50 {p(lat, .5) * 1000:.1f} ms, "
          f"p99 {p(lat, .99) * 1000:.1f} ms (target < 200 ms); bare Popen p50 {p(bare, .5) * 1000:.1f} ms, "
          f"p99 {p(bare, .99) * 1000:.1f} ms; ratio p99 {p(lat, .99) / p(bare, .99):.1f}x")
    print(f"one scheduling pass at {args.queued} queued: median {statistics.median(ours) * 1000:.2f} ms, "
          f"p99 {p(ours, .99) * 1000:.2f} ms (target < 10 ms); EASY baseline median "
          f"{statistics.median(easy) * 1000:.2f} ms; "
          f"ratio {statistics.median(ours) / statistics.median(easy):.2f}x")
    print(f"gpudiag queue (reasons for every pending job): {queue_s * 1000:.0f} ms over the socket, "
          f"{queue_reasons * 1000:.1f} ms for the reasons in-process")
    print(f"daemon RSS {rss:.1f} MB (peak {hwm:.1f} MB, target < 100 MB); bare interpreter with the policy "
          f"imported {bare_rss:.1f} MB; ratio {rss / bare_rss:.2f}x")


if __name__ == "__main__":
    main()
