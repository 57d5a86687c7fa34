"""The cost of each of ``gpudiag profile``'s collectors, measured apart (for profile_overhead.py).

Each part runs in its own process (``python observer_parts.py PART``: the bootstrap patches
torch process-wide) and prints one JSON line. CPU time, not wall time, where a collector runs
beside the job (a busy machine blurs wall time far more than the few microseconds measured),
and alternated blocks with and without a collector where it runs inside the job's own steps.

- ``step-timer``: the bootstrap's accounting at each step's end (``_on_step``: the row, the
  thread's schedstat, the collectives drained), microseconds per step; ``step-timer-in-job``: the
  same inside tiny_ops's loop, blocks with and without it alternated, the ratio of CPU per step.
- ``host-sampler``: gpudiag's host sampler (its default 1 s interval) on a job's process tree:
  its thread's CPU per second, and per sample.
- ``gpu-sampler``: the NVML sampler at its default 100 ms, fed by the replay backend through the
  same code path (this machine has no GPU): its CPU per second.
- ``sync-census``: one step of sync_heavy's loop with the census on (``collectors.torch_syncs``)
  against the same step without, alternated: what the census adds to the one step per trace
  window it runs in (never outside a window).
- the collective hooks run two ranks: ``benchmarks/workloads/ddp_hook_cost.py``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "benchmarks" / "workloads"
REPLAY = REPO / "tests" / "fixtures" / "h200" / "nvml_samples.jsonl"


def step_timer(calls: int = 20000) -> dict:
    import torch

    from gpudiag.collectors import torch_bootstrap as tb

    with tempfile.TemporaryDirectory() as d:
        os.environ.update(GPUDIAG_RUN_DIR=d, GPUDIAG_SKIP=str(10**9), GPUDIAG_STEPS="1")
        tb.arm(torch)
        tb._on_step(False)  # creates the state
        blocks = []
        for _ in range(5):
            c = time.thread_time()
            for _ in range(calls // 5):
                tb._on_step(False)
            blocks.append((time.thread_time() - c) / (calls // 5))
        tb._get_state().flush()
    return {"us_per_step": 1e6 * statistics.median(blocks)}


def step_timer_in_job(blocks: int = 15, steps: int = 20) -> dict:
    """The same in tiny_ops's own loop (thousands of small operators a step): blocks of steps
    with the bootstrap's optimizer-step hook registered and without it, alternated in one process
    (drift cancels), the thread's CPU time per step."""
    sys.path.insert(0, str(WORKLOADS))
    import tiny_ops as job
    import torch
    from torch import nn
    from torch.optim import optimizer as opt_mod

    from gpudiag.collectors import torch_bootstrap as tb

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(*[job.Block() for _ in range(job.DEPTH)], nn.Linear(job.WIDTH, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(job.BATCH, job.WIDTH), torch.randn(job.BATCH, 1)

    def block() -> float:
        c = time.thread_time()
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return (time.thread_time() - c) / steps

    block()
    without = dict(opt_mod._global_optimizer_post_hooks)
    with tempfile.TemporaryDirectory() as d:
        os.environ.update(GPUDIAG_RUN_DIR=d, GPUDIAG_SKIP=str(10**9), GPUDIAG_STEPS="1")
        tb.arm(torch)
        armed = dict(opt_mod._global_optimizer_post_hooks)
        off, on = [], []
        for i in range(blocks):
            for hooks, acc in ((without, off), (armed, on))[:: 1 if i % 2 == 0 else -1]:
                opt_mod._global_optimizer_post_hooks.clear()
                opt_mod._global_optimizer_post_hooks.update(hooks)
                acc.append(block())
    return {"step_ms": 1e3 * statistics.median(off), "ratio": statistics.median(
        b / a for a, b in zip(off, on, strict=True))}


def host_sampler(seconds: float = 10.0) -> dict:
    from gpudiag.collectors.host import HostSampler, ProcessTree

    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        tree = ProcessTree(job.pid)
        tree.pids()
        c = time.thread_time()
        for _ in range(50):
            tree.pids()
        per_tree = (time.thread_time() - c) / 50
        with tempfile.TemporaryDirectory() as d:
            s = HostSampler(job.pid, Path(d) / "host.jsonl")
            s.start()
            time.sleep(0.1)
            native = s._thread.native_id
            t0, c0 = time.monotonic(), _thread_cpu(native)
            time.sleep(seconds)
            share = (_thread_cpu(native) - c0) / (time.monotonic() - t0)
            s.stop()
    finally:
        job.kill()
    procs = sum(1 for e in os.scandir("/proc") if e.name.isdigit())
    return {"core_share": share, "ms_per_tree_walk": 1e3 * per_tree, "processes": procs,
            "interval_s": 1.0}


def _thread_cpu(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def gpu_sampler(seconds: float = 10.0) -> dict:
    from gpudiag.collectors.nvml import ReplayBackend, Sampler

    with tempfile.TemporaryDirectory() as d:
        s = Sampler(ReplayBackend(REPLAY), Path(d) / "gpu.jsonl", interval=0.1).start()
        time.sleep(seconds)
        st = s.stop()
    return {"core_share": st.cpu_seconds / st.wall_seconds, "samples": st.samples,
            "interval_s": 0.1}


def sync_census(pairs: int = 15) -> dict:
    sys.path.insert(0, str(WORKLOADS))
    import sync_heavy as job
    import torch
    from torch import nn

    from gpudiag.collectors.torch_syncs import SyncCensus

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = nn.ModuleList(nn.Linear(job.WIDTH, job.WIDTH) for _ in range(job.DEPTH))
    head = nn.Linear(job.WIDTH, 1)
    opt = torch.optim.SGD([*layers.parameters(), *head.parameters()], lr=1e-3)
    x, y = torch.randn(job.BATCH, job.WIDTH), torch.randn(job.BATCH, 1)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        h, kept = x, []
        for layer in layers:
            h = torch.relu(layer(h))
            kept.append((h.abs().max().item(), h.mean().cpu()))
        loss = nn.functional.mse_loss(head(h), y)
        loss.backward()
        opt.step()
        kept.append(loss.item())

    for _ in range(5):
        step()
    plain, census, stops = [], [], []
    for k in range(pairs):
        c = time.thread_time()
        step()
        plain.append(time.thread_time() - c)
        c = time.thread_time()
        s = SyncCensus(torch)
        s.start()
        step()
        t = time.thread_time()
        s.stop(k)
        stops.append(time.thread_time() - t)
        census.append(t - c)
    return {"step_ms": 1e3 * statistics.median(plain), "census_step_ms": 1e3 * statistics.median(census),
            "stop_ms": 1e3 * statistics.median(stops)}


PARTS = {"step-timer": step_timer, "step-timer-in-job": step_timer_in_job, "host-sampler": host_sampler,
         "gpu-sampler": gpu_sampler, "sync-census": sync_census}


def run(part: str) -> dict:
    """One part in a fresh process: its JSON line."""
    p = subprocess.run([sys.executable, __file__, part], capture_output=True, text=True, timeout=600,
                       check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    threading.current_thread().name = sys.argv[1]
    print(json.dumps(PARTS[sys.argv[1]]()))
