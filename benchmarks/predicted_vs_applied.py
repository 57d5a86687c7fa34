"""What gpudiag predicts a fix is worth, against the fix applied: the step time each way.

    python benchmarks/predicted_vs_applied.py [--rounds 2] [--case workers|compile|ddp-buckets ...]

Each case's job (tests/jobs) runs under ``gpudiag profile`` alternating phases in one process:
as it is ("b") and with the fix applied ("a"), so the load other work puts on a shared
machine hits both alike. gpudiag traces a window inside a long "b" phase; its recommendation
for the fix (by action id) predicts the step time if the fix worked fully; the job's own timer
gives the "a" steps' time. "ratio" is predicted / measured (1.00: exact); "scaled" first scales
the prediction from the view's step to the job's own timer of the same job (the unprofiled
view: from the untraced steps around the window to the median unfixed step, which a shared
machine's load can move apart in minutes; the traced view, where gpudiag did not trust those:
to the traced steps' own time) and compares it with "paced": the fixed steps, each phase
brought to the run's median unfixed pace by the unfixed steps beside it (``paced_fixed_median``),
as the tests hold it. The first and last lines give the machine and its load average.

Cases (held out: none of them is a workload the labels were tuned on):
- workers: a DataLoader reading each sample slowly, num_workers 0 -> 4 (``dataloader-workers``);
- workers-decode: the same DataLoader decompressing each batch (CPU work), num_workers 0 -> 2;
- workers-augment: the same DataLoader augmenting each sample on the CPU in a process of 2
  intra-op threads, num_workers 0 -> 2;
- compile: inference of many small elementwise ops between GEMMs, eager -> torch.compile
  (``compile-small-ops``);
- ddp-buckets: 2-rank DDP over gloo, one bucket bigger than the model -> 4 MB buckets
  (``overlap-communication``); each layer's backward also waits as an accelerator's kernels
  would, leaving the host's cores to gloo (tests/jobs/ddp_bucket_job.py says why).

Issue 37's cases (tests/jobs; each prediction from the device's own numbers):
- compile-training: training of 48 tiny Linear-LayerNorm-GELU blocks at batch 4 (~7,000
  operators a step), eager -> the model under torch.compile, the optimizer eager
  (``compile-small-ops``: on a CPU, calls removed, not their work);
- compile-syncs: the same with a ``.item()`` every 3 blocks (graph breaks);
- bf16-autocast: a compute-bound fp32 MLP of 1024-wide GEMMs, fp32 -> torch.autocast bf16
  (``lower-precision``: advised only where the CPU's measured bf16 peak beats fp32's);
- ddp-no-sync: 2-rank DDP over gloo, 100 MB of gradients: communication's cost (exposed, the
  reducer's copies, the cores gloo's threads took) against the step under ``no_sync()``;
- ddp-accumulate: the same, gradients accumulated over 4 micro-batches, all-reduced on the last
  (``all-reduce-less-often``), time per micro-batch;
- ddp-small-buckets: the same, 25 MB -> 4 MB buckets (``overlap-communication``; on 2 ranks of a
  2-core machine no core is free for gloo beside the compute).
A fix gpudiag lists as one that would not help (``Verdict.not_advised``) prints "not advised"
with its prediction where it has one: there the check is that the fix did not help.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from gpudiag.diagnosis import Diagnosis, Recommendation

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "tests" / "jobs"
# Steps each own-timer median leaves out at the start of the job: allocator and thread-pool
# warm-up.
SKIP_STEPS = 5


@dataclass
class Case:
    """A job that alternates phases of running as it is ("b") and with the fix ("a") in one
    process (tests/jobs/_phases.py), so the load on a shared machine hits both alike; gpudiag
    traces a window in the middle of a long "b" phase (``skip``), with at least REFERENCE_STEPS
    untraced "b" steps on each side."""

    name: str
    actions: tuple[str, ...]  # the recommendation(s) whose fix this is (the first one given counts)
    job: str
    args: list[str]
    phases: str
    steps: int
    skip: int
    ranks: int = 1
    # steps at the start of each "a" phase left out of its median: prefetched batches, a compile
    settle: int = 3


# Not a recommendation: communication's cost as the diagnosis gives it (``comm_cost.cost``),
# "predicting" the step without it, which the job's steps under ``no_sync()`` measure.
COMM_COST = "communication-cost"

# torch.compile is advised for host gaps, or for memory-bound elementwise work where those are
# small: either prediction is of the compiled step
COMPILE = Case("compile", ("compile-small-ops", "fuse-memory-bound"), "chain_job.py", [], "b60,a30",
               steps=270, skip=110, settle=3)

CASES = {
    # 120 ms of reading per batch; 4 workers read one every 30 ms, less than the model's step
    # (4 forward/backward passes, ~40 ms here). The fixed steps are short (~45 ms against
    # ~170): five "a" phases spread over the run sample the machine's pace as the "b" steps do
    # (two, as before, were 1 s of a 30 s run); the window is in the third "b" phase.
    "workers": Case("workers", ("dataloader-workers",), "feed_job.py",
                    ["--workers", "0", "--fixed-workers", "4", "--read-ms", "120", "--passes", "4"],
                    "b30,a15", steps=225, skip=100, settle=3),
    # the same job decompressing a 40 MB zlib shard per batch instead of sleeping: the loading
    # is CPU work, so the prediction is bounded by the cores the machine's other work leaves
    "workers-decode": Case("workers-decode", ("dataloader-workers",), "feed_job.py",
                           ["--workers", "0", "--fixed-workers", "2", "--read-ms", "0",
                            "--decode-mb", "40", "--passes", "2"],
                           "b40,a20", steps=160, skip=70, settle=10),
    # the same job augmenting each sample on the CPU as torchvision does (crop, antialiased
    # resize, flip, jitter) in a process of 2 intra-op threads, num_workers 0 -> 2: a batch's
    # work is the main thread's time in the wait, not the CPU the threads burnt (issue 29)
    "workers-augment": Case("workers-augment", ("dataloader-workers",), "feed_job.py",
                            ["--workers", "0", "--fixed-workers", "2", "--read-ms", "0",
                             "--augment-px", "256", "--threads", "2", "--passes", "1"],
                            "b30,a15", steps=135, skip=55, settle=5),
    "compile": COMPILE,
    # the same, with another process cutting the job's CPU into 0.3 ms slices over the trace
    # window alone (steps 111-116: the warm-up and five traced steps after --skip 110;
    # tests/jobs/_compete.py): a moment the machine was busy, which the steps around the window
    # do not show (unprofiled.DISPATCH_PER_EVENT_MIN)
    "compile-busy-window": replace(COMPILE, name="compile-busy-window",
                                   args=[*COMPILE.args, "--compete", "111:116", "--compete-kind", "slices"]),
    "ddp-buckets": Case("ddp-buckets", ("overlap-communication",), "ddp_bucket_job.py",
                        ["--bucket-mb", "512", "--fixed-bucket-mb", "4", "--device-ms", "20",
                         "--width", "1536", "--batch", "32"],
                        "b30,a15", steps=135, skip=55, ranks=2, settle=3),
    "compile-training": Case("compile-training", ("compile-small-ops", "fuse-memory-bound"),
                             "many_ops_job.py", [], "b120,a40", steps=320, skip=50, settle=5),
    "compile-syncs": Case("compile-syncs", ("compile-small-ops", "fuse-memory-bound"),
                          "many_ops_job.py", ["--sync-every", "3"], "b120,a40", steps=320, skip=50,
                          settle=5),
    "bf16-autocast": Case("bf16-autocast", ("lower-precision", "bf16-activations"), "autocast_job.py",
                          ["--width", "1024", "--batch", "128"], "b30,a6", steps=72, skip=10, settle=1),
    "ddp-no-sync": Case("ddp-no-sync", (COMM_COST,), "ddp_grads_job.py", ["--fix", "no-sync"],
                        "b40,a10", steps=100, skip=12, ranks=2, settle=1),
    "ddp-accumulate": Case("ddp-accumulate", ("all-reduce-less-often",), "ddp_grads_job.py",
                           ["--fix", "accumulate", "--accumulate", "4"], "b40,a5", steps=90,
                           skip=12, ranks=2, settle=1),
    "ddp-small-buckets": Case("ddp-small-buckets", ("overlap-communication",), "ddp_grads_job.py",
                              ["--fix", "bucket", "--fixed-bucket-mb", "4"], "b40,a10", steps=100,
                              skip=12, ranks=2, settle=2),
}


def _job_cmd(case: Case, report: Path, port: int) -> list[str]:
    script = [str(JOBS / case.job), "--steps", str(case.steps), "--phases", case.phases, *case.args,
              "--report", str(report)]
    if case.ranks > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(case.ranks),
                "--master_addr", "127.0.0.1", "--master_port", str(port), *script]
    return [sys.executable, *script]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], timeout: float) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")


def _own_steps(report: Path) -> tuple[list[float], list[tuple[str, int, int]]]:
    """The job's own step times, and its phases as (kind, first, end) runs of step indices."""
    data = json.loads(report.read_text())
    times, plan = data["step_seconds"], data["phases"]
    if len(times) != len(plan):
        raise ValueError(f"{report}: {len(times)} step times for {len(plan)} phases")
    runs, start = [], 0
    for i in range(1, len(plan) + 1):
        if i == len(plan) or plan[i] != plan[start]:
            runs.append((plan[start], start, i))
            start = i
    return times, runs


def _kept(i: int, exclude: set[int]) -> bool:
    return i >= SKIP_STEPS and (i + 1) not in exclude


def phase_median(report: Path, phase: str, settle: int, exclude: set[int]) -> float:
    """Median of the job's own step times in ``phase`` ("a" or "b"), leaving out the first
    ``settle`` steps of each such phase, the job's first SKIP_STEPS steps, and ``exclude``
    (1-based step numbers: the steps the profiler touched)."""
    times, runs = _own_steps(report)
    return statistics.median(times[i] for kind, first, end in runs if kind == phase
                             for i in range(first + settle, end) if _kept(i, exclude))


# Unfixed steps on each side of a fixed phase that give it the machine's pace of its moment.
NEIGHBOURS = 8


def paced_fixed_median(report: Path, settle: int, exclude: set[int], before_s: float) -> float:
    """Median of the fixed ("a") steps, each brought to the run's median unfixed step
    (``before_s``) by the unfixed steps beside its phase (up to NEIGHBOURS a side): their
    median over ``before_s`` is how much faster or slower the machine ran the job then.
    A shared VM's pace moves by a third within seconds, so the run-wide medians of the two
    phases compare different moments (a compile run on 2026-11-27: unfixed phases 42, 43
    and 30 ms, fixed 30, 23 and 22 ms; the run-wide medians 42.0 and 23.3 ms)."""
    times, runs = _own_steps(report)
    paced = []
    for k, (kind, first, end) in enumerate(runs):
        if kind != "a":
            continue
        left = [i for i in range(first - 1, runs[k - 1][1] - 1, -1) if _kept(i, exclude)] if k else []
        right = [i for i in range(end, runs[k + 1][2]) if _kept(i, exclude)] if k + 1 < len(runs) else []
        beside = [times[i] for i in left[:NEIGHBOURS] + right[:NEIGHBOURS]]
        if beside:
            pace = statistics.median(beside) / before_s
            paced += [times[i] / pace for i in range(first + settle, end) if _kept(i, exclude)]
    return statistics.median(paced)


@dataclass
class Result:
    case: str
    action: str
    predicted_s: float | None  # None: not advised, with no prediction (a precondition failed)
    measured_s: float  # the fixed ("a") steps, the job's own timer
    paced_s: float  # the same, each phase brought to the run's median unfixed pace (paced_fixed_median)
    before_s: float  # the job as it is ("b"), its own timer, untraced steps
    view_step_s: float  # the step of the diagnosis' view
    view_own_s: float  # the job's own timer over the same steps as the view (see scaled_predicted_s)
    basis: str
    why: str
    diagnosis: Diagnosis
    advised: bool = True  # False: listed as a fix that would not help (Verdict.not_advised)

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.measured_s if self.predicted_s is not None else float("nan")

    @property
    def scaled_predicted_s(self) -> float:
        """The prediction scaled from the view's step to the job's own timer of the same job:
        for the unprofiled view (the untraced steps around the traced window), its median
        unfixed step, two measures of the same unfixed job that differ only by when, on a shared
        machine, they were taken; for the traced view (the reference around the window was not
        trusted), the step timer's mean over the traced steps themselves: the view's step is the
        profiled step, and scaling it to an unprofiled one would count the profiler twice."""
        if self.predicted_s is None:
            return float("nan")
        return self.predicted_s * self.view_own_s / self.view_step_s

    @property
    def scaled_ratio(self) -> float:
        """Both at the pace of the run's median unfixed step."""
        return self.scaled_predicted_s / self.paced_s


def run_case(case: Case, work: Path, timeout: float = 1200) -> Result:
    """One run of the case's job under gpudiag profile: the prediction for the fix, and the
    fixed steps' own time."""
    from gpudiag.rundir import PROFILER_TRACED, read_steps

    run, own = work / "run", work / "own.json"
    _run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--skip", str(case.skip),
          "--", *_job_cmd(case, own, _free_port())], timeout)
    d = Diagnosis.from_json((run / "diagnosis.json").read_text())
    rows = read_steps(run)[0]
    touched = {r.step for r in rows if r.profiler}
    view = d.unprofiled if d.unprofiled is not None else d.breakdown
    advised = True
    if case.actions == (COMM_COST,):
        from gpudiag.analyzers.comm_cost import cost

        c = cost(view)
        rec = Recommendation(COMM_COST, "", (view.step_time - c) * 1e-6,
                             f"communication's cost {c / 1e3:.3g} ms a step (exposed "
                             f"{view.comm_exposed / 1e3:.3g}, copies {view.comm_work / 1e3:.3g}, cores "
                             f"{view.comm_contention / 1e3:.3g}), label {d.verdict.label.value}")
    else:
        rec = next((r for r in d.verdict.recommendations if r.action in case.actions), None)
        if rec is None:
            rec = next((r for r in d.verdict.not_advised if r.action in case.actions), None)
            advised = False
    if rec is None or (advised and rec.predicted_step_s is None):
        raise AssertionError(f"{case.name}: no {case.actions} prediction (label {d.verdict.label.value}, "
                             f"actions {[r.action for r in d.verdict.recommendations]}, not advised "
                             f"{[r.action for r in d.verdict.not_advised]}, basis {d.basis}"
                             f"{': ' + rec.why if rec else ''})")
    before = phase_median(own, "b", 0, touched)
    # the traced view: the step timer over the traced steps (gpudiag's rows, whose step
    # boundaries are the trace's; the job's own laps put the trace export in the last of them)
    view_own = before if d.unprofiled is not None else statistics.mean(
        r.dt for r in rows if r.profiler == PROFILER_TRACED)
    return Result(case.name, rec.action, rec.predicted_step_s, phase_median(own, "a", case.settle, touched),
                  paced_fixed_median(own, case.settle, touched, before), before, view.step_time * 1e-6,
                  view_own, d.basis, rec.why, d, advised)


def machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
            f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="runs per case (medians are printed per run)")
    ap.add_argument("--case", action="append", choices=sorted(CASES), default=None)
    args = ap.parse_args()
    names = args.case or list(CASES)
    print(f"machine: {machine()}")
    print(f"{'case':<21}{'action':<23}{'view':<11}{'before':>9}{'predicted':>11}{'measured':>10}"
          f"{'paced':>9}{'ratio':>7}{'scaled':>8}")
    with tempfile.TemporaryDirectory(prefix="gpudiag-pva-") as tmp:
        for name in names:
            case = CASES[name]
            for i in range(args.rounds):
                work = Path(tmp) / name / str(i)
                work.mkdir(parents=True)
                r = run_case(case, work)
                view = "unprofiled" if r.basis == "unprofiled-estimate" else "traced"
                pred = f"{r.predicted_s * 1e3:>9.1f}ms" if r.predicted_s is not None else f"{'none':>11}"
                print(f"{r.case:<21}{r.action:<23}{view:<11}{r.before_s * 1e3:>7.1f}ms"
                      f"{pred}{r.measured_s * 1e3:>8.1f}ms{r.paced_s * 1e3:>7.1f}ms"
                      f"{r.ratio:>7.2f}{r.scaled_ratio:>8.2f}"
                      + ("" if r.advised else "  not advised"), flush=True)
                print(f"    view step {r.view_step_s * 1e3:.1f} ms; label {r.diagnosis.verdict.label.value}"
                      f"; {r.why}", flush=True)
    print(f"machine after: {machine()}")


if __name__ == "__main__":
    main()
