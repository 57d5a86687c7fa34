"""Run the held-out zoo: each job's truth by its own timer, gpudiag's verdict on it, and each fix
gpudiag recommends applied through the job's knob and measured alone.

Per job: one run under ``gpudiag profile`` (defaults), then the job alone as it is, in each truth
variant and with each recommended fix, in a palindrome (A B C C B A) so a linear drift of the
machine's pace cancels; each variant's step is the mean of its two runs. Prints a markdown
table and writes everything as JSON (``--out``).

    .venv/bin/python benchmarks/zoo/run_zoo.py [--jobs a,b] [--rounds N] [--quick] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from zoo_jobs import ALL_JOBS, JOBS, SETS, Job, fix_args  # noqa: E402
from zoo_table import markdown  # noqa: E402
from zoo_truth import expected_label, machine_peaks, truth_of  # noqa: E402

BIN = Path(sys.executable).parent
GUARD = [150.0]  # an alone run stops after this long (a fix that slows the job 50x): --max-seconds
CALM = [0.0, 0.0]  # --max-load, --max-wait: wait for the load average before each run


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def command(job: Job, extra: list[str], quick: bool) -> list[str]:
    script = str(HERE / job.script)
    args = list(job.args) + (list(job.quick) if quick else []) + extra
    if job.ranks > 1:
        return [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={job.ranks}",
                script, *args]
    return [sys.executable, script, *args]


def _run(cmd: list[str], log: Path, timeout: float) -> tuple[int | None, str]:
    """Run a command in its own session, output to ``log``; on timeout kill its whole group
    (gpudiag's job and torchrun's ranks included) and say so."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout), ""
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None, f"timed out after {timeout:.0f} s"


def wait_for_calm(max_load: float, max_wait: float) -> float:
    """Wait until the 1-minute load average is under ``max_load`` (at most ``max_wait`` s)."""
    t0 = time.time()
    while max_load and os.getloadavg()[0] > max_load and time.time() - t0 < max_wait:
        time.sleep(10)
    return time.time() - t0


def run_alone(job: Job, extra: list[str], quick: bool, work: Path, tag: str) -> dict:
    """The job alone; its own report, with the load before and after and its wall time."""
    rep = work / f"{tag}.json"
    log = work / f"{tag}.log"
    waited = wait_for_calm(CALM[0], CALM[1])
    la0, t0 = load(), time.time()
    guard = [] if job.ranks > 1 else ["--max-seconds", str(GUARD[0])]
    rc, err = _run(command(job, extra + guard + ["--report", str(rep)], quick), log, 900)
    out = {"tag": tag, "args": extra, "rc": rc, "wall_s": time.time() - t0, "waited_s": waited,
           "load_before": la0, "load_after": load()}
    if rc != 0 or not rep.exists():
        out["error"] = err or f"exit {rc}; see {log}"
        return out
    out["report"] = json.loads(rep.read_text())
    return out


def step_of(job: Job, run: dict) -> float | None:
    r = run.get("report")
    if not r:
        return None
    return r["mean_ms"] if job.stat == "mean" else r["median_ms"]


def run_gpudiag(job: Job, quick: bool, work: Path) -> dict:
    """The job under ``gpudiag profile`` with its defaults; the diagnosis as written."""
    out_dir = work / "gpudiag"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    rep = work / "profiled.json"
    # Enough steps for gpudiag's window (--skip 10, a warm-up and 5 traced, 10 after), then
    # the same time guard as alone.
    guard = [] if job.ranks > 1 else ["--max-seconds", str(GUARD[0]), "--min-steps", "40"]
    # The job's own step count even under --quick: gpudiag's window needs steps around it.
    cmd = [str(BIN / "gpudiag"), "profile", "--out", str(out_dir), "--",
           *command(job, guard + ["--report", str(rep)], False)]
    waited = wait_for_calm(CALM[0], CALM[1])
    la0, t0 = load(), time.time()
    rc, err = _run(cmd, work / "gpudiag.out", 1800)
    text = (work / "gpudiag.out").read_text(errors="replace")
    res: dict = {"rc": rc, "wall_s": time.time() - t0, "load_before": la0, "waited_s": waited,
                 "load_after": load(), "terminal": text[text.find("VERDICT"):]}
    if rep.exists():
        res["report"] = json.loads(rep.read_text())
    diag = out_dir / "diagnosis.json"
    if not diag.exists():
        res["error"] = f"no diagnosis.json ({err or f'exit {rc}'}); see {work / 'gpudiag.out'}"
        return res
    res["diagnosis"] = summarise(json.loads(diag.read_text()))
    return res


def summarise(d: dict) -> dict:
    """What the zoo reads from diagnosis.json (schema 4): the verdict (label, tie_with,
    confidence, its recommendations and what it did not advise: action, text, predicted_step_s,
    why, step_s, gain), mfu.value (at the job's own pace) and mfu.wall_value (by wall clock),
    the step gpudiag judged (verdict evidence), the profiler's dilation and the sync census."""
    v = d.get("verdict") or {}
    mfu = d.get("mfu") or {}
    keys = ("action", "text", "predicted_step_s", "why", "step_s", "gain")

    def recs_of(items: list) -> list[dict]:
        return [{k: r.get(k) for k in keys} if isinstance(r, dict)
                else {"action": "unknown", "text": str(r)} for r in items or []]

    ev = v.get("evidence") or {}
    syncs = d.get("syncs") or {}
    dil = d.get("dilation") or {}
    recs = recs_of(v.get("recommendations"))
    return {"schema": d.get("schema_version"), "step_ms": ev.get("step time ms"),
            "own_step_ms": ev.get("own step ms"), "dilation": dil.get("factor"),
            "mfu_wall": mfu.get("wall_value"), "mfu_pace": mfu.get("pace"),
            "syncs_per_step": syncs.get("per_step"), "sync_saving_us": syncs.get("saving_us"),
            "device": (d.get("device") or {}).get("name"),
            "device_peaks": (d.get("device") or {}).get("peak_flops"),
            "device_bandwidth": (d.get("device") or {}).get("bandwidth"),
            "not_advised": recs_of(v.get("not_advised")),
            "secondary": v.get("secondary"), "label": v.get("label"), "tie_with": v.get("tie_with"),
            "confidence": v.get("confidence"), "summary": v.get("summary"),
            "evidence": v.get("evidence"), "noise": v.get("noise"),
            "deductions": v.get("deductions"), "basis": d.get("basis"),
            "mfu": mfu.get("value"), "mfu_reason": mfu.get("reason"),
            "mfu_step_time_us": mfu.get("step_time_us"),
            "mfu_basis": mfu.get("step_time_basis"), "warnings": d.get("warnings"),
            "recommendations": recs}


def palindrome(job: Job, variants: dict[str, list[str]], rounds: int, quick: bool,
               work: Path) -> dict[str, list[dict]]:
    """base, v1..vn, vn..v1, base; repeated ``rounds`` times."""
    names = ["base", *variants]
    order = names + names[::-1]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(rounds):
        for i, n in enumerate(order):
            tag = f"r{r}-{i:02d}-{n}"
            res = run_alone(job, [] if n == "base" else variants[n], quick, work, tag)
            s = step_of(job, res)
            shown = f"{s:.2f} ms" if s else res.get("error")
            print(f"  {tag}: {shown} "
                  f"(load {res['load_before'][0]})", flush=True)
            runs[n].append(res)
    return runs


def run_job(job: Job, rounds: int, quick: bool, work: Path, peaks: dict,
            truth_only: bool = False) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    t_job = time.time()
    up0 = _uptime()
    print(f"== {job.name}: {job.what}\n  uptime: {up0}", flush=True)
    if truth_only:  # the truth alone, before gpudiag is asked anything, and the probes
        g = {"rc": None, "wall_s": 0.0, "load_before": load(), "load_after": load(),
             "skipped": "--truth-only"}
    else:
        g = run_gpudiag(job, quick, work)
    diag = g.get("diagnosis") or {}
    print(f"  gpudiag: {diag.get('label')} tie={diag.get('tie_with')} "
          f"conf={diag.get('confidence')} ({g['wall_s']:.0f} s) {g.get('error', '')}",
          flush=True)
    variants: dict[str, list[str]] = {k: list(v) for k, v in job.truth_variants.items()}
    if truth_only:
        variants.update({k: list(v) for k, v in job.probes.items()})
    fixes = []
    for i, rec in enumerate(diag.get("recommendations", [])):
        args, note = fix_args(job, rec)
        fx = {"rank": i + 1, "rec": rec, "knob": note, "args": args, "variant": None}
        if args is not None:
            same = [k for k, v in variants.items() if v == args]
            fx["variant"] = same[0] if same else f"fix{i + 1}"
            if not same:
                variants[fx["variant"]] = args
        fixes.append(fx)
    runs = palindrome(job, variants, rounds, quick, work)
    steps = {n: [s for s in (step_of(job, r) for r in rs) if s] for n, rs in runs.items()}
    truth = truth_of(job, runs, steps, peaks)
    exp = expected_label(truth)
    base = _mean(steps["base"])
    for fx in fixes:
        if fx["variant"] is None:
            continue
        after = _mean(steps.get(fx["variant"], []))
        fx["measured_before_ms"], fx["measured_after_ms"] = base, after
        fx["measured_runs_ms"] = steps.get(fx["variant"], [])
        rec = fx["rec"]
        if rec.get("predicted_step_s") and rec.get("step_s") and base and after:
            pb, pa = rec["step_s"] * 1e3, rec["predicted_step_s"] * 1e3
            fx["predicted_before_ms"], fx["predicted_after_ms"] = pb, pa
            fx["ratio_raw"] = pa / after
            fx["ratio_scaled"] = (pa / pb) / (after / base)
            fx["within_25"] = abs(fx["ratio_scaled"] - 1) <= 0.25
            # gpudiag states its prediction as the fix done fully (docs/diagnosis.md): an upper
            # bound on the gain, so the stated range of the fixed step is [predicted, today's];
            # where it states a faster other end (``best_step_s``), [that end, today's]
            lo = min(pa, rec["best_step_s"] * 1e3) if rec.get("best_step_s") else pa
            fx["in_stated_range"] = lo / pb <= after / base <= 1.0
        runs_b, runs_a = steps["base"], steps.get(fx["variant"], [])
        # Slower beyond noise: 5% on the mean, and every run with the fix slower than every
        # run without it.
        fx["slows_job"] = bool(base and after and after > base * 1.05
                               and min(runs_a) > max(runs_b))
        fx["predicted_slower"] = bool(rec.get("predicted_step_s") and rec.get("step_s")
                                      and rec["predicted_step_s"] > rec["step_s"])
    prof = g.get("report")
    observer = None
    if prof and base:
        observer = (prof["mean_ms"] if job.stat == "mean" else prof["median_ms"]) / base
    return {"job": job.name, "what": job.what, "stat": job.stat, "gpudiag": g,
            "runs": runs, "steps_ms": steps, "truth": truth, "expected": exp, "fixes": fixes,
            "observer_ratio": observer, "wall_s": time.time() - t_job,
            "uptime_start": up0, "uptime_end": _uptime(),
            "load_range": _load_range(g, runs)}


def _scrub(text: str, work: Path) -> str:
    """The results without this machine's paths (they are committed): the run folder as WORK,
    the repository as '.'."""
    root = str(HERE.parent.parent)
    return text.replace(str(work), "WORK").replace(root, ".").replace(
        str(Path(sys.executable).parent), "BIN")


def _uptime() -> str:
    """``uptime`` as printed, without the clock (load averages and how long the machine is up)."""
    out = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return out.split(" ", 1)[-1] if out[:2].isdigit() else out


def _load_range(g: dict, runs: dict[str, list[dict]]) -> list[float]:
    """The lowest and highest 1-minute load average seen before or after any of the job's runs."""
    seen = [g["load_before"][0], g["load_after"][0]]
    for rs in runs.values():
        for r in rs:
            seen += [r["load_before"][0], r["load_after"][0]]
    return [min(seen), max(seen)]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", default="",
                   help="comma-separated job names or sets (held_out_1 … held_out_4; "
                        "default: held_out_1)")
    p.add_argument("--truth-only", action="store_true",
                   help="no gpudiag: each job's truth variants and probes alone, palindromes")
    p.add_argument("--rounds", type=int, default=1, help="palindromes of alone runs per job")
    p.add_argument("--quick", action="store_true", help="fewer steps per run")
    p.add_argument("--out", default="", help="results JSON (default: WORK/zoo.json)")
    p.add_argument("--work", default="", help="run folder (default: runs/zoo-<time>)")
    p.add_argument("--max-load", type=float, default=0.0,
                   help="before each run, wait until the 1-min load average is under this "
                        "(0: never wait); the load is recorded either way")
    p.add_argument("--max-wait", type=float, default=600.0,
                   help="the longest wait for --max-load, in seconds, then run anyway")
    p.add_argument("--max-seconds", type=float, default=GUARD[0],
                   help="stop a run after this long (at least its warm-up + 3 steps; the "
                        "profiled one at least 40 steps): a guard for a fix that slows a job 50x")
    p.add_argument("--resume", action="store_true",
                   help="keep the jobs already in WORK/partial.json, run the others")
    p.add_argument("--table", default="", metavar="FILE",
                   help="print the markdown table of an earlier --out FILE, run nothing")
    p.add_argument("--peaks", default="", metavar="FILE",
                   help="the machine's peaks (a peaks.json an earlier run wrote) instead of "
                        "measuring them now; with --table, recompute each truth with them")
    p.add_argument("--compact", default="", metavar="FILE",
                   help="with --table: also write the results to FILE without each run's "
                        "per-step lists (what is committed under benchmarks/zoo/results/)")
    args = p.parse_args()
    given = json.loads(Path(args.peaks).read_text()) if args.peaks else None
    if args.table:
        saved = json.loads(Path(args.table).read_text())
        if given:
            retruth(saved, given)
        print(markdown(saved["meta"], saved["jobs"]))
        if args.compact:
            Path(args.compact).write_text(json.dumps(compact(saved), indent=None,
                                                     separators=(",", ":")) + "\n")
        return
    names = [m.name for n in args.jobs.split(",") if n for m in SETS.get(n, [])] + [
        n for n in args.jobs.split(",") if n and n not in SETS]
    unknown = set(names) - {j.name for j in ALL_JOBS}
    if unknown:
        p.error(f"unknown job(s) {sorted(unknown)}; known: {[j.name for j in ALL_JOBS]}, "
                f"sets: {sorted(SETS)}")
    # In the order given (the label kinds first when time is short), else the table's order.
    by_name = {j.name: j for j in ALL_JOBS}
    jobs = [by_name[n] for n in names] if names else list(JOBS)
    work = Path(args.work or f"runs/zoo-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    CALM[:] = [args.max_load, args.max_wait]
    GUARD[:] = [args.max_seconds]
    t0 = time.time()
    up0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime at start: {up0}", flush=True)
    peaks = given or machine_peaks(work)
    print(f"machine peaks ({'given' if given else 'own measurement'}): {peaks}", flush=True)
    results = []
    if args.resume and (work / "partial.json").exists():
        results = json.loads((work / "partial.json").read_text())
        print(f"resumed: {[r['job'] for r in results]}", flush=True)
    done = {r["job"] for r in results}
    for job in jobs:
        if job.name in done:
            continue
        results.append(run_job(job, args.rounds, args.quick, work / job.name, peaks,
                               args.truth_only))
        (work / "partial.json").write_text(json.dumps(results, indent=1, default=str))
    results.sort(key=lambda r: [j.name for j in ALL_JOBS].index(r["job"]))
    up1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    meta = {"uptime_start": up0, "uptime_end": up1, "wall_s": time.time() - t0,
            "jobs_wall_s": sum(r.get("wall_s", 0) for r in results),
            "peaks": peaks, "rounds": args.rounds, "quick": args.quick,
            "cpu": _cpu_model(), "cores": os.cpu_count()}
    out = Path(args.out) if args.out else work / "zoo.json"
    out.write_text(_scrub(json.dumps({"meta": meta, "jobs": results}, indent=1, default=str),
                          work))
    print()
    print(markdown(meta, results))
    print(f"\nresults: {out}")


def compact(saved: dict) -> dict:
    """The results less each run's per-step lists (own_step_ms, kinds): the medians, means,
    truths and gpudiag's reading stay."""
    def strip(rep: dict | None) -> None:
        if rep:
            for k in ("own_step_ms", "kinds"):
                rep.pop(k, None)
    for r in saved["jobs"]:
        strip(r["gpudiag"].get("report"))
        for runs in r["runs"].values():
            for run in runs:
                strip(run.get("report"))
    return saved


def retruth(saved: dict, peaks: dict) -> None:
    """Each job's truth and expected label again from its saved runs, with other peaks (a peak
    measured on a busy machine is low, and the FLOP share read against it high)."""
    by_name = {j.name: j for j in ALL_JOBS}
    saved["meta"]["peaks"] = {k: round(v, 1) for k, v in peaks.items()}
    for r in saved["jobs"]:
        r["truth"] = truth_of(by_name[r["job"]], r["runs"], r["steps_ms"], peaks)
        r["expected"] = expected_label(r["truth"])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
