"""Each job's truth from its own timer, the machine's peaks measured here, and the label the
truth implies (the rule in README.md). Nothing here reads gpudiag's output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TIE_MARGIN = 0.10  # two shares closer than this (of the step) are a tie: within this VM's noise

_PEAK_SNIPPET = r"""
import json, time, torch
def best(fn, budget):
    fn(); t_end = time.perf_counter() + budget; b = float("inf")
    while time.perf_counter() < t_end:
        t = time.perf_counter(); fn(); b = min(b, time.perf_counter() - t)
    return b
out = {}
F = torch.nn.functional
for th in (1, 2):
    torch.set_num_threads(th)
    # fp32 at 2048^3; bf16 at 512^3 (where the CPU has no bf16 units it is ~50x slower),
    # as matmul and as linear (autocast's path), the better of the two.
    for name, dt, n in (("fp32", torch.float32, 2048), ("bf16", torch.bfloat16, 512),
                        ("fp64", torch.float64, 1024)):
        a = torch.randn(n, n).to(dt); b = torch.randn(n, n).to(dt)
        t = min(best(lambda: a @ b, 3.0), best(lambda: F.linear(a, b), 3.0))
        out[f"{name}_gflops_{th}t"] = 2 * n**3 / t / 1e9
    x = torch.randn(64 * 2**20); y = torch.empty_like(x)
    out[f"copy_gbps_{th}t"] = 2 * x.numel() * 4 / best(lambda: y.copy_(x), 1.5) / 1e9
print(json.dumps(out))
"""


def machine_peaks(work: Path) -> dict:
    """Best of short GEMMs per dtype (fp32 2048^3, bf16 512^3) and of 256 MB copies, 1 and 2 threads."""
    proc = subprocess.run([sys.executable, "-c", _PEAK_SNIPPET], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"run_zoo: measuring the machine's peaks failed: {proc.stderr[-500:]}")
    peaks = json.loads(proc.stdout.strip().splitlines()[-1])
    (work / "peaks.json").write_text(json.dumps(peaks))
    return {k: round(v, 1) for k, v in peaks.items()}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _avg_truth(runs: list[dict]) -> dict:
    """The base runs' in-job truth, numeric fields averaged."""
    reps = [r["report"]["truth"] for r in runs if r.get("report")]
    if not reps:
        return {}
    out = dict(reps[0])
    for k, v in reps[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = sum(r.get(k, v) for r in reps) / len(reps)
    return out


def truth_of(job, runs: dict[str, list[dict]], steps: dict[str, list[float]],
             peaks: dict) -> dict:
    """Shares of the step by cause, each from the job's own timer, and the facts behind them."""
    base = _mean(steps.get("base", []))
    t = _avg_truth(runs.get("base", []))
    if not base:
        return {"error": "the job failed alone", "shares": {}}
    shares: dict[str, float] = {}
    facts: list[str] = []
    if "input_wait_share" in t:
        shares["input-bound"] = t["input_wait_share"]
        facts.append(f"input wait {t['input_wait_ms']:.1f} ms of {base:.1f} ms "
                     f"({t['input_wait_share']:.0%})")
    if "blocked_share" in t and t.get("blocked_ms"):
        # held_out_4: the training thread asleep in a blocking call outside torch (timed around
        # the call in the job): host time
        shares["host-bound"] = shares.get("host-bound", 0.0) + t["blocked_share"]
        facts.append(f"blocked in {t.get('blocked_what', '?')}: {t['blocked_ms']:.1f} ms of "
                     f"{t['step_mean_ms']:.1f} ms ({t['blocked_share']:.0%}), the thread on a "
                     f"core {t.get('blocked_cpu_ms', 0):.2f} ms of it; the rest "
                     f"{t['rest_ms']:.1f} ms")
    if job.scaling and steps.get(job.scaling[0]):
        v, k = job.scaling
        tk = _mean(steps[v])
        fixed = (k * base - tk) / (k - 1)
        h = min(max(fixed / base, 0.0), 1.0)
        shares["host-bound"] = h
        facts.append(f"{k:g}x the work: {tk:.1f} ms ({tk / base:.2f}x): fixed per-step cost "
                     f"{fixed:.1f} ms ({h:.0%})")
    for var, label in getattr(job, "removes", {}).items():
        if steps.get(var):
            c = max(1 - _mean(steps[var]) / base, 0.0)
            shares[label] = shares.get(label, 0.0) + c
            facts.append(f"{' '.join(job.truth_variants.get(var, (var,)))}: "
                         f"{_mean(steps[var]):.1f} ms: {label} share {c:.0%}")
    for var in getattr(job, "probes", {}):
        if steps.get(var):
            facts.append(f"probe {' '.join(job.probes[var])}: {_mean(steps[var]):.1f} ms "
                         f"({_mean(steps[var]) / base:.2f}x)")
    if steps.get("no_syncs"):
        s = 1 - _mean(steps["no_syncs"]) / base
        facts.append(f"without the syncs {_mean(steps['no_syncs']):.2f} ms: syncs cost {s:.0%}"
                     f" ({t.get('syncs_per_step', '?')} a step)")
    if steps.get("no_sync_all"):
        c = 1 - _mean(steps["no_sync_all"]) / base
        shares["communication-bound"] = max(c, 0.0)
        facts.append(f"all-reduce {c:.0%} (step {base:.0f} ms, under no_sync() "
                     f"{_mean(steps['no_sync_all']):.0f} ms)")
    if steps.get("no_ckpt"):
        c = 1 - _mean(steps["no_ckpt"]) / base
        shares["host-bound"] = max(c, 0.0)
        facts.append(f"checkpointing {c:.0%} of the mean step ({base:.0f} ms vs "
                     f"{_mean(steps['no_ckpt']):.0f} ms without; a save "
                     f"{t.get('save_ms_median', 0):.0f} ms, {t.get('ckpt_mb', 0):.0f} MB)")
    if steps.get("fp32"):
        f32 = _mean(steps["fp32"])
        facts.append(f"fp32 instead of bf16: {f32:.0f} ms ({f32 / base:.2f}x the bf16 step)")
    if steps.get("compiled"):
        c = _mean(steps["compiled"])
        facts.append(f"compiled: {c:.1f} ms ({c / base:.2f}x)")
    if steps.get("no_eval"):
        facts.append(f"eval {t.get('eval_share_of_wall', 0):.0%} of the run's wall time")
    mfu = mfu_cpu = None
    flops = t.get("flops_per_step") or t.get("flops_per_step_per_rank")
    if flops:
        dt = t.get("dtype") if t.get("dtype") in ("bf16", "fp64") else "fp32"
        peak = peaks.get(f"{dt}_gflops_{job.peak_threads}t")
        step = t.get("train_step_median_ms") or base
        if peak:
            mfu = flops / (step / 1e3) / (peak * 1e9)
            shares["compute-bound"] = min(mfu, 1.0)
            facts.append(f"{flops / step / 1e6:.1f} GFLOP/s = MFU {mfu:.1%} of {peak:.0f} "
                         f"GFLOP/s ({dt}, {job.peak_threads} thread(s), measured here)")
            cpu = t.get("cpu_step_median_ms")
            if cpu:
                # the job's own timer on a busy machine is a wall clock, other processes' hold
                # included: MFU over the training thread's CPU time is the load-independent
                # ceiling of the own-pace MFU (which is never over a step shorter than that)
                mfu_cpu = flops / (cpu / 1e3) / (peak * 1e9)
                facts.append(f"training thread on a core {cpu:.1f} ms a step: MFU at most "
                             f"{mfu_cpu:.1%} at the job's own pace")
    if t.get("bytes_per_step"):
        bw = peaks.get(f"copy_gbps_{job.peak_threads}t")
        m = t["bytes_per_step"] / (base / 1e3) / (bw * 1e9)
        shares["memory-bound"] = min(m, 1.0)
        facts.append(f"{t['bytes_per_step'] / base / 1e6:.1f} GB/s hand-counted = {m:.0%} of "
                     f"copy bandwidth {bw:.1f} GB/s")
    if t.get("fwd_gbps"):
        facts.append(f"forward alone moves {t['fwd_gbps']:.1f} GB/s (hand-counted)")
    rest = 1.0 - sum(shares.values())
    if job.rest and rest > 0:
        shares[f"{job.rest}-bound"] = shares.get(f"{job.rest}-bound", 0.0) + rest
        facts.append(f"rest of the step ({rest:.0%}) counted {job.rest}")
    runs_b = steps.get("base", [])
    if len(runs_b) > 1:
        facts.insert(0, f"step {base:.1f} ms ±{(max(runs_b) - min(runs_b)) / 2 / base:.0%} "
                        f"({job.stat} of {len(runs_b)} runs)")
    return {"base_ms": base, "base_runs_ms": steps.get("base"), "stat": job.stat,
            "shares": {k: round(v, 3) for k, v in shares.items()}, "mfu": mfu,
            "mfu_cpu": mfu_cpu, "facts": facts, "in_job": t}


def expected_label(truth: dict) -> dict:
    """The largest share; a tie with the runner-up when within TIE_MARGIN."""
    shares = sorted(truth.get("shares", {}).items(), key=lambda kv: -kv[1])
    if not shares:
        return {"label": None, "tie_with": None}
    top = shares[0]
    tie = shares[1][0] if len(shares) > 1 and top[1] - shares[1][1] < TIE_MARGIN else None
    return {"label": top[0], "tie_with": tie, "share": top[1]}


def label_right(expected: dict, diag: dict) -> str:
    """right / right (tie) / wrong: gpudiag's label against the expected one."""
    exp = {expected.get("label"), expected.get("tie_with")} - {None}
    got = {diag.get("label"), diag.get("tie_with")} - {None}
    if not exp or not got:
        return "n/a"
    if diag.get("label") == expected.get("label") and not diag.get("tie_with"):
        return "right"
    if exp & got:
        return "right (tie)"
    return "wrong"
