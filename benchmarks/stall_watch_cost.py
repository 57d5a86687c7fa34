"""What the stall watch and the Flight Recorder cost a steady job, by the job's own step timer.

Three arms, alternated A B C C B A in each round so that drift (other work on the machine, its
clock) hits them alike, and compared by the median of per-round ratios:

- A, **alone**: the job under torchrun, nothing of gpudiag, the Flight Recorder off;
- B, **observed without the watch**: ``gpudiag profile --no-stall-watch`` with the Flight
  Recorder off (its step timer, collective timing and samplers; no trace window: ``--skip`` past
  the end);
- C, **observed with the watch**: ``gpudiag profile`` as it runs by default: the stall watch
  (black box, stack signal handler, watcher thread, the parent's once-a-second read) and the
  Flight Recorder's ring buffer of 2000 entries.

C / B is the watch and the Flight Recorder alone; C / A is everything gpudiag does to the job
outside a trace window. The job is ``workloads/steady_collectives.py``: each step the same
compute, a blocking all_reduce and a broadcast (gloo on the CPU; ``--backend nccl`` on a GPU).

    python benchmarks/stall_watch_cost.py [--rounds 3] [--steps 300] [--ranks 2] [--backend gloo]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "benchmarks" / "workloads" / "steady_collectives.py"
ARMS = ("alone", "no-watch", "watch")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(arm: str, args: argparse.Namespace, tmp: Path, n: int) -> float:
    report = tmp / f"{arm}-{n}.json"
    job = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks),
           "--master_addr", "127.0.0.1", "--master_port", str(_port()), str(JOB), "--steps", str(args.steps),
           "--backend", args.backend, "--report", str(report)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUDIAG_", "TORCH_FR_", "TORCH_NCCL_TRACE"))}
    env["GPUDIAG_AGENT_DIR"] = str(tmp / "no-agent")
    if arm == "alone":
        cmd = job
    else:
        cmd = [sys.executable, "-m", "gpudiag", "profile", "--out", str(tmp / f"{arm}-{n}"),
               "--skip", "1000000", "--backend", "none",
               *(["--no-stall-watch"] if arm == "no-watch" else []), "--", *job]
        if arm == "no-watch":
            env["GPUDIAG_FR_BUFFER_SIZE"] = ""   # the Flight Recorder off, as for the job alone
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    return json.loads(report.read_text())["median_step_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--json", default=None, help="write the per-run medians here")
    args = ap.parse_args()
    got: dict[str, list[float]] = {a: [] for a in ARMS}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(args.rounds):
            for i, arm in enumerate((*ARMS, *reversed(ARMS))):
                got[arm].append(run(arm, args, tmp, r * 10 + i))
    pairs = {a: [statistics.fmean(got[a][2 * r:2 * r + 2]) for r in range(args.rounds)] for a in ARMS}
    load = os.getloadavg()
    print(f"steady job: {args.ranks} ranks, {args.backend}, {args.steps} steps; load average {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs")
    for a in ARMS:
        print(f"  {a:9s} median step {statistics.median(got[a]) * 1e3:8.3f} ms   runs: "
              + " ".join(f"{v * 1e3:.3f}" for v in got[a]))
    for num, den, what in (("watch", "no-watch", "stall watch + Flight Recorder"),
                           ("watch", "alone", "all of gpudiag outside a trace window"),
                           ("no-watch", "alone", "gpudiag without the watch")):
        ratios = [n / d for n, d in zip(pairs[num], pairs[den], strict=True)]
        print(f"  {what:38s} {num}/{den}: median ratio {statistics.median(ratios):.4f}  rounds: "
              + " ".join(f"{x:.4f}" for x in ratios))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": got, "load": load, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()
