"""A preemptible job that checkpoints in its grace period and resumes from its checkpoint.

    python ckpt_job.py --steps 60 --sleep 0.1 [--hold-at 5]

Its state is the sum 0 + 1 + ... + (step - 1). On SIGTERM it writes ``{step, total}`` to
``$GPUDIAG_CHECKPOINT_DIR/ckpt.json`` (temp file + rename) and exits 143; started again, it
loads the checkpoint, asserts the state is the one the step implies (a corrupt or foreign
checkpoint fails the job), prints ``resumed at step N (restart R)`` and goes on.
``--hold-at N``: on its first start it stops after step N until it is signalled, so a test
preempts it there however slowly a busy machine runs the test (at load 10-16 the 40 steps of
0.05 s had all run before the test, polling the logs through the CLI, submitted its on-demand job).
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--sleep", type=float, default=0.1)
ap.add_argument("--hold-at", type=int, default=0)
args = ap.parse_args()

ckpt = Path(os.environ["GPUDIAG_CHECKPOINT_DIR"]) / "ckpt.json"
restarts = int(os.environ["GPUDIAG_RESTART_COUNT"])
state = (0, 0)   # (step, total), replaced in one store so the handler never sees half an update
if ckpt.exists():
    saved = json.loads(ckpt.read_text())
    step, total = saved["step"], saved["total"]
    state = (step, total)
    assert total == step * (step - 1) // 2, f"checkpoint state {total} does not match step {step}"
    assert restarts >= 1, "a checkpoint exists but the scheduler says this is the first start"
    print(f"resumed at step {step} (restart {restarts})", flush=True)
else:
    print(f"fresh start (restart {restarts})", flush=True)


def save_and_exit(signum: int, frame: object) -> None:
    step, total = state
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "total": total}))
    os.replace(tmp, ckpt)
    print(f"checkpointed at step {step}", flush=True)
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, save_and_exit)
while state[0] < args.steps:
    time.sleep(args.sleep)
    state = (state[0] + 1, state[1] + state[0])
    print(f"step {state[0]}", flush=True)
    while restarts == 0 and state[0] == args.hold_at:
        signal.pause()   # SIGTERM's handler exits
print(f"finished at step {state[0]}", flush=True)
