"""A job that takes its time to stop: what a real checkpoint in the grace period looks like.

    python slow_stop.py --stop-s 4 [--gate FILE]

Prints ``started (restart R)`` once its SIGTERM handler is installed; runs until FILE exists
(or forever); on SIGTERM prints ``SIGTERM`` at once, sleeps ``--stop-s`` seconds (the
checkpoint) and exits 143. The scheduler tests count SIGTERMs from these lines and watch the
slots while the job is stopping.
"""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--stop-s", type=float, default=4.0)
ap.add_argument("--gate", default="")
args = ap.parse_args()


def slow_exit(signum: int, frame: object) -> None:
    print("SIGTERM", flush=True)
    time.sleep(args.stop_s)
    sys.exit(143)


signal.signal(signal.SIGTERM, slow_exit)
# printed only once the handler is in place: a SIGTERM before it would kill the job at once,
# with no checkpoint and no "SIGTERM" line, and the tests wait for this line before preempting
print(f"started (restart {os.environ.get('GPUDIAG_RESTART_COUNT', '?')})", flush=True)
gate = Path(args.gate) if args.gate else None
while gate is None or not gate.exists():
    time.sleep(0.05)
print("done", flush=True)
