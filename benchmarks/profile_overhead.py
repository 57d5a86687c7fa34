"""What does ``gpudiag profile`` cost a job? By the job's own timer, and per collector apart.

Part 1, end to end. Each job (``--jobs``) runs alone and under ``gpudiag profile`` in each mode
(``--modes``): ``skip`` (``--skip 100000``: it never traces, so only what is always on: the host
sampler, the step timer, the collective hooks), ``default`` (a 5-step trace window after 10
steps, the sync census in its warm-up step, the analysis after the job) and ``monitor``. The
runs of a pair go alone-first, the next pair's last (ABBA): machines drift (neighbours,
thermals), so the figure is the median of per-pair ratios of the job's OWN median step time
(each workload prints ``own_step_ms``), never gpudiag's. Target: at most 3% (issue 37). Beside
it, the same ratio of the CPU the job's process spent per step (``cpu_step_ms``): on a machine
other work keeps busy, wall time swings by tens of percent between runs and CPU time far less;
what a collector adds inside the job shows in both.
``--before PYTHONPATH`` adds the same modes run by another gpudiag (say, an older checkout laid
out as an installed package), for a before/after in one alternation.

Part 2, per collector, measured apart (``observer_parts.py``; CPU time, robust to a busy
machine): the step timer's microseconds per step, the host and GPU samplers' share of a core,
the sync census's extra time in the one step per window it runs in, and on two gloo ranks the
timed all_reduce against the unwrapped one and a DDP step with gpudiag's timing hook against
DDP's built-in all-reduce (``workloads/ddp_hook_cost.py``). Each is put against each job's step.

    python benchmarks/profile_overhead.py [--jobs tiny_ops,sync_heavy,ddp_big_grads] [--pairs 3]
        [--modes skip,default] [--before DIR] [--no-parts]

Print the machine's load average beside the numbers (it is printed at the start and the end).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "benchmarks" / "workloads"
sys.path.insert(0, str(REPO / "benchmarks"))
import observer_parts  # noqa: E402 - beside this script

OWN = re.compile(r"own_step_ms ([0-9.]+) cpu_step_ms ([0-9.]+)")
MODES = {"skip": ["--skip", "100000"], "default": [], "monitor": ["--monitor"]}
TARGET = 0.03


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def job_command(name: str, steps: int | None) -> list[str]:
    py = sys.executable
    if name == "ddp_big_grads":
        return [py, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", _port(), str(WORKLOADS / "ddp_big_grads.py"),
                "--steps", str(steps or 40)]
    default = {"tiny_ops": 400, "sync_heavy": 300, "steady_train": 300}[name]
    return [py, str(WORKLOADS / f"{name}.py"), "--steps", str(steps or default)]


def own_ms(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """One run; the job's own median step (ms): wall time, and the CPU its process spent (rank
    0's, all its threads), from its output. Run from a scratch folder: ``python -m gpudiag``
    from the repository's root would import the checkout's gpudiag before the one ``--before``
    names."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800,
                       cwd=tempfile.gettempdir())
    m = OWN.search(p.stdout)
    if p.returncode != 0 or m is None:
        raise SystemExit(f"run failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return float(m.group(1)), float(m.group(2))


def variants(name: str, steps: int | None, modes: list[str], before: str | None, tmp: Path
             ) -> dict[str, callable]:
    """Variant -> a function running it once (a fresh command each time: new port, new run dir)."""
    base = dict(os.environ)
    out: dict[str, callable] = {"alone": lambda: own_ms(job_command(name, steps), base)}
    for who, env in (("", base), ("before:", {**base, "PYTHONPATH": before or ""})):
        if who and not before:
            continue
        for mode in modes:
            def run(mode: str = mode, env: dict = env, who: str = who) -> float:
                out_dir = Path(tempfile.mkdtemp(dir=tmp))
                return own_ms([sys.executable, "-m", "gpudiag", "profile", "--out",
                               str(out_dir / "run"), *MODES[mode], "--",
                               *job_command(name, steps)], env)
            out[f"{who}{mode}"] = run
    return out


def end_to_end(jobs: list[str], pairs: int, modes: list[str], before: str | None,
               steps: int | None) -> dict[str, float]:
    """Per job: ABBA pairs of every variant; prints the table; returns each job's alone median."""
    alone: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in jobs:
            runs = variants(name, steps, modes, before, Path(tmp))
            got: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
            for i in range(pairs):
                order = list(runs) if i % 2 == 0 else list(runs)[::-1]
                for k in order:
                    got[k].append(runs[k]())
                print(f"  {name} pair {i + 1}: " + ", ".join(
                    f"{k} {got[k][-1][0]:.2f} ({got[k][-1][1]:.2f} CPU)" for k in runs), flush=True)
            alone[name] = statistics.median(w for w, _ in got["alone"])
            print(f"{name}: the job's own median step per run, ms (wall / CPU); ratio to alone "
                  f"(median of {pairs} per-pair ratios), wall and CPU")
            for k, v in got.items():
                line = f"  {k:<16}" + " ".join(f"{w:7.2f}/{c:<7.2f}" for w, c in v)
                if k != "alone":
                    wall, cpu = (statistics.median(x[j] / a[j] for x, a in zip(v, got["alone"], strict=True))
                                 for j in (0, 1))
                    met = "met" if wall <= 1 + TARGET else "NOT met"
                    line += f"  wall {100 * (wall - 1):+.1f}% ({met}), CPU {100 * (cpu - 1):+.1f}%"
                print(line)
    return alone


def collectors(alone: dict[str, float]) -> None:
    """Part 2: each collector apart, and what it is of each job's step."""
    st = observer_parts.run("step-timer")
    in_job = observer_parts.run("step-timer-in-job")
    host = observer_parts.run("host-sampler")
    gpu = observer_parts.run("gpu-sampler")
    census = observer_parts.run("sync-census")
    hooks, err = _hook_cost({})
    # the flight recorder's buffer (what gpudiag asked for before it did so for GPU builds only):
    # the same two ranks with and without it, alternated
    fr: dict[str, list[dict]] = {"off": [], "on": []}
    for i in range(2):
        for k in (("off", "on") if i == 0 else ("on", "off")):
            got, _ = _hook_cost({"TORCH_FR_BUFFER_SIZE": "2000"} if k == "on" else {})
            if got is not None:
                fr[k].append(got)
    print("Per collector, measured apart:")
    print(f"  step timer: {st['us_per_step']:.1f} us of CPU per step; in tiny_ops's loop "
          f"({in_job['step_ms']:.2f} ms of CPU a step) {100 * (in_job['ratio'] - 1):+.2f}% with it "
          "(blocks with and without, alternated)")
    print(f"  host sampler: {100 * host['core_share']:.3f}% of one core at its {host['interval_s']:g} s "
          f"interval ({host['ms_per_tree_walk']:.2f} ms per walk of the process tree, "
          f"{host['processes']} processes on the machine)")
    print(f"  GPU sampler (replay, {gpu['interval_s'] * 1e3:.0f} ms): "
          f"{100 * gpu['core_share']:.3f}% of one core")
    extra = census["census_step_ms"] - census["step_ms"]
    print(f"  sync census: a {census['step_ms']:.2f} ms step of sync_heavy took "
          f"{census['census_step_ms']:.2f} ms with it on (+{extra:.2f} ms, once per trace window; "
          f"its record {census['stop_ms']:.2f} ms, written in the window's export step)")
    if fr["on"] and fr["off"]:
        fields = ("ddp_builtin_ms", "all_reduce_raw_us")
        on, off = ({f: statistics.median(r[f] for r in fr[k]) for f in fields} for k in ("on", "off"))
        print(f"  flight recorder buffer on gloo (TORCH_FR_BUFFER_SIZE=2000, no longer set for CPU builds): "
              f"DDP step {on['ddp_builtin_ms']:.1f} vs {off['ddp_builtin_ms']:.1f} ms without, small "
              f"all_reduce {on['all_reduce_raw_us']:.0f} vs {off['all_reduce_raw_us']:.0f} us")
    if hooks is None:
        print(f"  collective hooks: not measured ({err[-500:]})")
    else:
        print(f"  collective hooks (2 gloo ranks): a blocking all_reduce "
              f"{hooks['all_reduce_timed_us']:.0f} us timed vs {hooks['all_reduce_raw_us']:.0f} us "
              "unwrapped; a DDP step with "
              f"{hooks['gradient_mb']:.0f} MB of gradients {hooks['ddp_hooked_ms']:.1f} ms with gpudiag's "
              f"hook vs {hooks['ddp_builtin_ms']:.1f} ms with DDP's built-in all-reduce "
              f"({100 * (hooks['ddp_ratio'] - 1):+.1f}%; CPU {hooks['ddp_hooked_cpu_ms']:.1f} vs "
              f"{hooks['ddp_builtin_cpu_ms']:.1f} ms, {100 * (hooks['ddp_cpu_ratio'] - 1):+.1f}%)")
    for name, ms in alone.items():
        parts = {"step timer": st["us_per_step"] / 1e3 / ms,
                 "host sampler (if it shares the job's core)": host["core_share"]}
        if name == "ddp_big_grads" and hooks is not None:
            parts["DDP timing hook"] = hooks["ddp_ratio"] - 1
        print(f"  {name} ({ms:.2f} ms a step): " +
              ", ".join(f"{k} {100 * v:+.2f}%" for k, v in parts.items()))


def _hook_cost(env: dict[str, str]) -> tuple[dict | None, str]:
    """``workloads/ddp_hook_cost.py`` on two gloo ranks, with ``env`` added."""
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", _port(),
                        str(WORKLOADS / "ddp_hook_cost.py")], capture_output=True, text=True,
                       timeout=1800, env={**os.environ, **env}, cwd=tempfile.gettempdir())
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    return (json.loads(lines[-1]) if lines else None), p.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="tiny_ops,sync_heavy,ddp_big_grads")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--modes", default="skip,default")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: per job)")
    ap.add_argument("--before", default=None, metavar="PYTHONPATH",
                    help="also run the modes with the gpudiag importable from there")
    ap.add_argument("--no-parts", action="store_true", help="skip part 2 (each collector apart)")
    ap.add_argument("--parts-only", action="store_true", help="part 2 only (each collector apart)")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} cores", flush=True)
    jobs = [j for j in args.jobs.split(",") if j]
    alone = {} if args.parts_only else end_to_end(
        jobs, args.pairs, [m for m in args.modes.split(",") if m], args.before, args.steps)
    if not args.no_parts:
        collectors(alone)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
