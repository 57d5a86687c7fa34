"""What a job end costs the local scheduler without cgroups: finding the launch's processes by
their environment (``runner.find_launches``), beside one user's processes with huge environments.

    python benchmarks/scheduler_env_scan.py [--procs 300] [--env-mb 1.9] [--repeat 3]

Starts ``--procs`` sleeping processes, as a second user when run as root, each with an
environment of ``--env-mb`` MB (issue 40: 300 processes of 1.9 MB held another user's ``queue``
25-30 s, since every job end read every environment whole), then times one scan three ways in
the same run: every process's whole environment (the baseline: what the daemon did), every
process's first ``ENV_READ_CAP`` bytes, and the job user's processes only (what a job end of
another user now reads). Prints the times and their ratios to the baseline.
"""

from __future__ import annotations

import argparse
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpudiag.scheduler.local.runner import ENV_READ_CAP, LAUNCH_VAR, find_launches  # noqa: E402


def whole_scan(prefix: str) -> int:
    """The daemon's scan before the cap: every process, its whole environment."""
    head, found = f"{LAUNCH_VAR}={prefix}:".encode(), 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        found += any(item.startswith(head) for item in env.split(b"\0"))
    return found


def timed(fn, repeat: int) -> float:  # noqa: ANN001 - any callable
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=300)
    ap.add_argument("--env-mb", type=float, default=1.9)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--user", default="nobody", help="whose processes (as root): not the job's user")
    a = ap.parse_args()
    per = max(1, int(a.env_mb * 1e6 / 100_000))
    env = {"PATH": "/usr/bin:/bin", **{f"BIG{i}": "x" * 99_990 for i in range(per)}}
    kw = {}
    if os.geteuid() == 0:
        pw = pwd.getpwnam(a.user)
        kw = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    procs = [subprocess.Popen(["sleep", "600"], env=env, **kw) for _ in range(a.procs)]
    try:
        base = timed(lambda: whole_scan("sched-bench"), a.repeat)
        capped = timed(lambda: find_launches("sched-bench"), a.repeat)
        mine = timed(lambda: find_launches("sched-bench", uid=os.geteuid()), a.repeat)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    print(f"{a.procs} processes of {a.user if kw else 'this user'} with {per * 0.1:.1f} MB environments; "
          f"cap {ENV_READ_CAP // 1024} KiB; best of {a.repeat}; load {os.getloadavg()[0]:.1f}")
    print(f"  whole environments (before):     {base * 1e3:8.1f} ms")
    print(f"  first {ENV_READ_CAP // 1024} KiB of each:          {capped * 1e3:8.1f} ms  "
          f"({base / capped:.0f}x less)")
    print(f"  the job user's processes only:   {mine * 1e3:8.1f} ms  ({base / mine:.0f}x less)")


if __name__ == "__main__":
    main()
