"""One job's whole check in one palindrome: gpudiag's verdict, every fix it recommends applied,
and the observer's cost, all by the job's own timer.

    .venv/bin/python benchmarks/zoo/gpudiag_palindrome.py --jobs a,b|SET [--steps N] [--out F]

Per job, in this order (symmetric, so a linear drift of the machine's pace cancels for every
pair): ``gpudiag profile`` (defaults), the job alone, ``gpudiag profile --skip 1000000`` (never
traces: the sampler, step timer and hooks only), each recommended fix alone (from the first
run's advice, through the job's knob in ``zoo_jobs.py``), the same fixes reversed, skip, alone,
and ``gpudiag profile`` again. Every run times the same number of steps (``--steps``, 40: the
default window needs 10 skipped + 1 warm-up + 5 traced + steps after); a fix run may stop after
``--max-seconds`` (a fix that makes the job far slower). The truth (``run_zoo.py --truth-only``)
is measured apart, without gpudiag. Records the lead's commit (``--gpudiag-repo``'s HEAD) at
each gpudiag run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_zoo  # noqa: E402
from zoo_jobs import ALL_JOBS, SETS, fix_args  # noqa: E402


def _head(repo: str) -> str:
    if not repo:
        return ""
    return subprocess.run(["git", "-C", repo, "log", "--oneline", "-1"], capture_output=True,
                          text=True).stdout.strip()[:120]


def one(job, mode: str, extra: list[str], steps: int, max_s: float, work: Path, tag: str,
        repo: str) -> dict:
    rep = work / f"{tag}.json"
    guard = [] if job.ranks > 1 else ["--max-seconds", str(max_s)]
    if mode in ("default", "skip") and job.ranks == 1:
        guard += ["--min-steps", str(steps)]
    cmd = run_zoo.command(job, ["--steps", str(steps), *extra, *guard, "--report", str(rep)],
                          False)
    out_dir = work / f"{tag}-run"
    if mode != "alone":
        if out_dir.exists():
            shutil.rmtree(out_dir)
        skip = ["--skip", "1000000"] if mode == "skip" else []
        cmd = [str(run_zoo.BIN / "gpudiag"), "profile", "--out", str(out_dir), *skip, "--", *cmd]
    up0, la0, t0 = run_zoo._uptime(), run_zoo.load(), time.time()
    head = _head(repo) if mode != "alone" else ""
    rc, err = run_zoo._run(cmd, work / f"{tag}.log", 900)
    res = {"tag": tag, "mode": mode, "args": extra, "rc": rc, "wall_s": time.time() - t0,
           "load_before": la0, "load_after": run_zoo.load(), "uptime_before": up0,
           "uptime_after": run_zoo._uptime(), "gpudiag_head": head}
    if rep.exists():
        r = json.loads(rep.read_text())
        res["step_ms"] = r["mean_ms"] if job.stat == "mean" else r["median_ms"]
        res["median_ms"], res["mean_ms"], res["steps_done"] = (r["median_ms"], r["mean_ms"],
                                                               r["steps_done"])
    else:
        res["error"] = err or f"exit {rc}"
    diag = out_dir / "diagnosis.json"
    if mode == "default":
        text = (work / f"{tag}.log").read_text(errors="replace")
        res["terminal"] = text[text.find("VERDICT"):] if "VERDICT" in text else text[-3000:]
        if diag.exists():
            res["diagnosis"] = run_zoo.summarise(json.loads(diag.read_text()))
        else:
            res["error"] = res.get("error", "") + " no diagnosis.json"
    return res


def check(job, steps: int, max_s: float, work: Path, repo: str) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    print(f"== {job.name}: {job.what}\n  uptime: {run_zoo._uptime()}", flush=True)
    runs: list[dict] = []

    def go(mode: str, name: str, extra: list[str]) -> dict:
        r = one(job, mode, extra, steps, max_s, work, f"{len(runs):02d}-{name}", repo)
        r["name"] = name
        runs.append(r)
        d = r.get("diagnosis") or {}
        lab = f" {d.get('label')}/{d.get('tie_with')} ({d.get('confidence')})" if d else ""
        print(f"  {r['tag']}: {r.get('step_ms', r.get('error'))} ms (load "
              f"{r['load_before'][0]}-{r['load_after'][0]}){lab}", flush=True)
        return r

    g1 = go("default", "default", [])
    recs = (g1.get("diagnosis") or {}).get("recommendations", [])
    fixes, variants = [], {}
    for i, rec in enumerate(recs):
        args, note = fix_args(job, {**rec, "text": rec.get("text") or "",
                                    "why": rec.get("why") or ""})
        fx = {"rank": i + 1, "rec": rec, "knob": note, "args": args, "variant": None}
        if args is not None:
            same = [k for k, v in variants.items() if v == args]
            fx["variant"] = same[0] if same else f"fix{i + 1}"
            variants.setdefault(fx["variant"], args)
        fixes.append(fx)
    go("alone", "alone", [])
    go("skip", "skip", [])
    for n in list(variants) + list(variants)[::-1]:
        go("alone", n, variants[n])
    go("skip", "skip", [])
    go("alone", "alone", [])
    go("default", "default", [])
    steps_of = {}
    for r in runs:
        if "step_ms" in r:
            steps_of.setdefault(r["name"], []).append(r["step_ms"])
    mean = {k: sum(v) / len(v) for k, v in steps_of.items()}
    base = mean.get("alone")
    for fx in fixes:
        if not fx["variant"] or not base or fx["variant"] not in mean:
            continue
        after = mean[fx["variant"]]
        fx["measured_before_ms"], fx["measured_after_ms"] = base, after
        fx["measured_runs_ms"] = steps_of[fx["variant"]]
        rec = fx["rec"]
        if rec.get("predicted_step_s") and rec.get("step_s"):
            pb, pa = rec["step_s"] * 1e3, rec["predicted_step_s"] * 1e3
            fx["predicted_before_ms"], fx["predicted_after_ms"] = pb, pa
            fx["ratio_scaled"] = (pa / pb) / (after / base)
            fx["within_25"] = abs(fx["ratio_scaled"] - 1) <= 0.25
            fx["in_stated_range"] = pa / pb <= after / base <= 1.0
        fx["slows_job"] = bool(after > base * 1.05
                               and min(steps_of[fx["variant"]]) > max(steps_of["alone"]))
        fx["predicted_slower"] = bool(rec.get("predicted_step_s") and rec.get("step_s")
                                      and rec["predicted_step_s"] > rec["step_s"])
    obs = {m: (mean[m] / base if base and m in mean else None) for m in ("default", "skip")}
    print(f"  observer: default {obs['default']}, skip {obs['skip']}; fixes: "
          + "; ".join(f"{f['rec'].get('action')} {f.get('measured_after_ms')}" for f in fixes),
          flush=True)
    seen = [x for r in runs for x in (r["load_before"][0], r["load_after"][0])]
    return {"job": job.name, "what": job.what, "stat": job.stat, "runs": runs,
            "mean_ms": mean, "fixes": fixes, "observer": obs,
            "load_range": [min(seen), max(seen)]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--max-seconds", type=float, default=40.0)
    p.add_argument("--work", default="")
    p.add_argument("--out", default="")
    p.add_argument("--gpudiag-repo", default="", help="record this repository's HEAD per run")
    args = p.parse_args()
    by = {j.name: j for j in ALL_JOBS}
    names = [m.name for n in args.jobs.split(",") for m in SETS.get(n, [])] + [
        n for n in args.jobs.split(",") if n not in SETS]
    work = Path(args.work or f"runs/palindrome-{time.strftime('%H%M%S')}").resolve()
    out = Path(args.out) if args.out else work / "palindrome.json"
    results = []
    for n in names:
        results.append(check(by[n], args.steps, args.max_seconds, work / n, args.gpudiag_repo))
        out.write_text(run_zoo._scrub(json.dumps({"jobs": results}, indent=1, default=str), work))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
