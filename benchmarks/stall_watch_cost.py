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


_FR_LOOP = """
import os, socket, sys, time, torch, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
x = torch.ones(16)
for _ in range(500):
    dist.all_reduce(x)
t, c = time.perf_counter(), time.process_time()
for _ in range(int(sys.argv[1])):
    dist.all_reduce(x)
print((time.perf_counter() - t) / int(sys.argv[1]), (time.process_time() - c) / int(sys.argv[1]))
"""


def micro(calls: int = 100_000) -> dict[str, float]:
    """Microseconds of the in-job pieces per call, on this process's clock: the black box's
    write at a step, the recorded collective (a real tensor argument, the wrapped call a no-op),
    and the Flight Recorder's record of a gloo all_reduce (a world of one, its buffer 2000
    entries against off, alternated)."""
    import time
    from types import SimpleNamespace

    import torch

    from gpudiag.collectors import blackbox, stall_watch

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        (run / "samples").mkdir()
        w = blackbox.Writer(blackbox.path_for(run, 0), 0, os.getpid(), 0.0)
        t = time.process_time()
        for i in range(calls):
            w.step(i, 1.0, 0.1, False)
        out["black box, per step"] = (time.process_time() - t) / calls * 1e6
        st = SimpleNamespace(run_dir=run, rank=0, step=1, prof=None)
        stall_watch._box, stall_watch._box_pid, stall_watch._watcher = w, os.getpid(), object()
        fake = SimpleNamespace(group=SimpleNamespace(WORLD=SimpleNamespace(group_name="0")))
        noop = lambda tensor, op=None, group=None, async_op=False: None  # noqa: E731
        wrapped = stall_watch._recorded(fake, "all_reduce", noop, lambda: st, 2, torch.Tensor)
        x = torch.ones(16, 64)
        t = time.process_time()
        for _ in range(calls // 10):
            wrapped(x)
        out["recorded collective, per call"] = (time.process_time() - t) / (calls // 10) * 1e6
        t = time.process_time()
        for _ in range(calls // 10):
            noop(x)
        out["recorded collective, per call"] -= (time.process_time() - t) / (calls // 10) * 1e6
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_TRACE"))}
    per: dict[str, list[float]] = {"0": [], "2000": []}
    for size in ("0", "2000", "2000", "0", "0", "2000", "2000", "0"):
        r = subprocess.run([sys.executable, "-c", _FR_LOOP, "3000"], capture_output=True, text=True,
                           env={**env, "TORCH_FR_BUFFER_SIZE": size}, check=True)
        per[size].append(float(r.stdout.split()[1]))
    out["gloo all_reduce of 16 floats, CPU per call (FR off)"] = statistics.median(per["0"]) * 1e6
    out["Flight Recorder's record, CPU per collective"] = (statistics.median(per["2000"])
                                                            - statistics.median(per["0"])) * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--json", default=None, help="write the per-run medians here")
    ap.add_argument("--micro", action="store_true", help="only the per-call costs of the in-job pieces")
    args = ap.parse_args()
    if args.micro:
        load = os.getloadavg()
        print(f"per call (process CPU time; load average {load[0]:.2f}, {os.cpu_count()} CPUs):")
        for k, v in micro().items():
            print(f"  {k:52s} {v:8.2f} us")
        return
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
