"""One GPU session that proves, by the jobs' own timers, what gpudiag built for the GPU (issue 45).

Why one script: a lent GPU comes for minutes, so every check runs from one prepared command that
writes its results as they come (a cut-short call keeps what it did) and interleaves the checks,
so that each is covered once before any is repeated.

What it runs, in this order (each job is ``benchmarks/workloads/gpu_realistic.py``, which times
every step itself, CUDA-synchronised):

1. **The observer's cost** (LM: GPT-style, 12 layers, d=768, bf16, fused AdamW). Per round, the
   job alone and under ``gpudiag profile`` five ways: ``prof-auto``/``prof-off`` (``--skip 20``,
   CUPTI teardown auto / off), ``mon-auto``/``mon-off`` (``--monitor``, the same), ``defaults``.
   Rounds alternate their order (ABBA), so a drift of the machine cancels. Per run: the sum of the
   job's own step times from step 21 to its end (the traced steps included: the whole run's cost),
   their median, and the median of the steps after the window; ratios against the same round's
   alone run; over the rounds, the mean ratio and its 95% interval (Student's t).
2. **Validation in three modes** (defaults, ``--skip 20``, ``--monitor``), each at least twice, for
   the LM (the runs of 1. above) and the CNN (ResNet-50, batch 128, 12 workers): the label per run
   (the same across modes), and gpudiag's MFU against the analytic MFU (analytic FLOPs over the
   median step of the job alone, at the device's bf16 peak), within 10%. The expected label is the
   one the earlier H100 truth gave (memory-bound), unless the job's own timer says otherwise: an
   input wait of 20% of the step or more (XProf's "highly input-bound") makes it input-bound.
3. **The DataLoader prediction**: the H200 ``resnet_w0`` job (ResNet-50, batch 64, 320 px with
   ColorJitter, ``num_workers=0``) under ``gpudiag profile``; its ``dataloader-workers`` advice's
   worker count applied to the same job alone; the predicted step against the measured one (±25%).
4. **Fixtures**: the run directories, packed per job into ``$OUT/<job>.tar.gz`` (run.json,
   samples/, traces/ for the first run of each mode; diagnosis.json and the job's own report for
   all), for regression tests.

    python benchmarks/gpu_session.py --out DIR [--budget 470] [--plan lm1,cnn1,dl,lm2,cnn2,lm3a] [--small]

``--small``: tiny models on the CPU (checks this script's mechanics, not gpudiag; no CUPTI there).
Results: ``DIR/session.json`` (rewritten after every run) and ``DIR/session.log``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_validation import diagnose_row, judge  # noqa: E402

JOB = HERE / "workloads" / "gpu_realistic.py"
TOLERANCE_MFU = 0.10
TOLERANCE_DL = 0.25
# Student's t, two-sided 95%, by degrees of freedom (rounds - 1)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365}
LM_CONFIGS = {  # name -> gpudiag profile options (None: the job alone)
    "alone": None,
    "prof-auto": ["--skip", "20", "--steps", "5", "--cupti-teardown", "auto"],
    "prof-off": ["--skip", "20", "--steps", "5", "--cupti-teardown", "off"],
    "mon-auto": ["--monitor", "--cupti-teardown", "auto"],
    "mon-off": ["--monitor", "--cupti-teardown", "off"],
    "defaults": [],
}
MODE_OF = {"defaults": "defaults", "prof-auto": "skip20", "mon-auto": "monitor"}  # validation modes
CNN_CONFIGS = {"alone": None, "defaults": [], "prof-auto": ["--skip", "20"], "mon-auto": ["--monitor"]}
DL_JOB = ["--workers", "0", "--batch", "64", "--size", "320", "--jitter"]


class Session:
    """The results so far, written to disk after every run."""

    def __init__(self, out: Path, budget: float, small: bool) -> None:
        self.out, self.budget, self.small = out, budget, small
        self.t0 = time.monotonic()
        self.work = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpudiag-session-{os.getpid()}"
        self.work.mkdir(parents=True, exist_ok=True)
        self.runs: list[dict] = []
        self.info: dict = {}
        self.summary: dict = {}
        self.log = open(out / "session.log", "a", buffering=1)  # the session's log

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def save(self) -> None:
        tmp = self.out / "session.json.partial"
        tmp.write_text(json.dumps({"info": self.info, "runs": self.runs, "summary": self.summary},
                                  indent=1, default=str))
        tmp.replace(self.out / "session.json")

    def job_cmd(self, kind: str, steps: int, report: Path, extra: list[str]) -> list[str]:
        return [sys.executable, str(JOB), "--kind", kind, "--steps", str(steps), "--report", str(report),
                *(["--small"] if self.small else []), *extra]

    def run(self, job: str, config: str, rnd: int, opts: list[str] | None, kind: str, steps: int,
            extra: list[str] | None = None, timeout: float = 150.0, loops: int = 0) -> dict | None:
        """One run of ``kind`` alone (opts None) or under ``gpudiag profile opts``; its row.
        ``loops``: that many busy loops run beside it, started before the job, killed after it."""
        if self.left() < 40:
            self.say(f"budget spent: {job} {config} round {rnd} not run")
            return None
        profiled = [r for r in self.runs if r["options"] is not None]
        if len(profiled) >= 2 and not any(r.get("measured") for r in profiled):
            raise SystemExit(f"stopping: the first {len(profiled)} profiled runs gave no diagnosis")
        name = f"{job}-{config}-{rnd}"
        report, run_dir = self.work / f"{name}.json", self.work / name
        cmd = self.job_cmd(kind, steps, report, extra or [])
        if opts is not None:
            cmd = [sys.executable, "-m", "gpudiag", "profile", "--out", str(run_dir), *opts, "--", *cmd]
        beside = busy_loops(loops)
        try:
            t = time.perf_counter()
            code, log = run_group(cmd, self.work, min(timeout, self.left() + 60))
            ended, wall = time.time(), time.perf_counter() - t
        finally:
            for p in beside:
                p.kill()
                p.wait()
        row: dict = {"job": job, "config": config, "round": rnd, "exit": code, "wall_s": round(wall, 1),
                     "options": opts, "extra": extra or [], "loops": loops}
        (self.work / f"{name}.log").write_text(log)
        if report.exists():
            rep = json.loads(report.read_text())
            row.update(own_steps(rep, run_dir if opts is not None else None))
            boot = run_dir / "samples" / "bootstrap-rank-0.json"
            if opts is not None and boot.exists():
                row["traced_steps"] = json.loads(boot.read_text()).get("traced_steps") or []
            end = ended
            if opts is not None and (run_dir / "run.json").exists():
                info = json.loads((run_dir / "run.json").read_text())
                end = info.get("end") or ended
                row["cupti"] = info.get("cupti_teardown")
            row["exit_after_last_step_s"] = round(end - rep["t_end"], 2)
        if opts is not None and (run_dir / "diagnosis.json").exists():
            try:
                row.update(diagnose_row(run_dir))
            except Exception as e:  # noqa: BLE001 - a row says what failed, the session goes on
                row["diagnosis_error"] = f"{type(e).__name__}: {e}"
            row["recommendations"] = recommendations(run_dir)
            row.update(own_pace(run_dir))
        if code != 0:
            row["log_tail"] = log[-1500:]
        self.runs.append(row)
        self.save()
        self.say(describe(row))
        return row

    def pack(self, job: str) -> None:
        """``$OUT/<job>.tar.gz``: every run of the job; traces only for its first run of a config."""
        dest = self.out / f"{job}.tar.gz"
        seen: set[str] = set()
        with tarfile.open(dest.with_suffix(".partial"), "w:gz") as tar:
            for r in self.runs:
                if r["job"] != job:
                    continue
                name = f"{job}-{r['config']}-{r['round']}"
                for extra in (f"{name}.json", f"{name}.log"):
                    if (self.work / extra).exists():
                        tar.add(self.work / extra, arcname=f"{name}/{extra}")
                d = self.work / name
                if not d.is_dir():
                    continue
                for part in sorted(d.iterdir()):
                    if part.name == "traces" and r["config"] in seen:
                        continue
                    if part.name in ("report.html",):
                        continue
                    tar.add(part, arcname=f"{name}/{part.name}")
                seen.add(r["config"])
        dest.with_suffix(".partial").replace(dest)


def busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each spin on a core: other work on a shared node, as in issue 38."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(n)]


def diff_row(before: Path, after: Path) -> dict:
    """``gpudiag diff BEFORE AFTER --json``: the wall-clock and own-pace changes and the verdict."""
    p = subprocess.run([sys.executable, "-m", "gpudiag", "diff", str(before), str(after), "--json"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-800:]}
    d = json.loads(p.stdout)
    keep = ("change", "ci_low", "ci_high", "significant", "direction", "before_median_us", "after_median_us")
    return {"step_change": {k: (d.get("step_change") or {}).get(k) for k in keep},
            "own_pace_change": {k: (d.get("own_pace_change") or {}).get(k) for k in keep},
            "verdict": d.get("step_time_verdict"), "machine_note": d.get("machine_note"),
            "labels": [d.get("label_before"), d.get("label_after")],
            "mfu": [d.get("mfu_before"), d.get("mfu_after")], "warnings": d.get("warnings")}


def run_group(cmd: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    """Run ``cmd`` in its own session; past ``timeout`` kill every process of that session
    (gpudiag, the job in the process group gpudiag gave it, its DataLoader workers), so nothing
    is left holding the GPU, or the output pipe, for the next run."""
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        kill_session(p.pid)
        out, _ = p.communicate()
        return -1, (out or "") + f"\ntimed out after {timeout:.0f} s: the session's processes were killed"


def kill_session(sid: int) -> None:
    """SIGKILL every process whose session is ``sid``: killing one process group is not enough,
    since ``gpudiag profile`` starts the job in a group of its own."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # after the command: state, ppid, pgrp, session
                os.kill(int(stat.parent.name), 9)
        except (OSError, ValueError, IndexError):
            continue


def own_steps(rep: dict, run_dir: Path | None) -> dict:
    """The job's own timings: whole run from step 21, and the steps after gpudiag's last window."""
    s = rep["step_seconds"]
    tail = s[20:] or s
    after = tail
    if run_dir is not None:
        boot = run_dir / "samples" / "bootstrap-rank-0.json"
        if boot.exists():
            meta = json.loads(boot.read_text())
            last = max(meta.get("traced_steps") or [0]) + 1  # the step that exported the trace
            after = s[last + 1:] or tail
    waits = rep.get("input_wait_seconds") or []
    return {"total_s": sum(tail), "median_ms": 1e3 * statistics.median(tail),
            "after_ms": 1e3 * statistics.median(after), "steps": len(s),
            "input_wait_share": (statistics.median(waits[5:]) / statistics.median(s[5:])
                                 if len(waits) > 5 else None),
            "analytic_flops_per_step": rep.get("analytic_flops_per_step"),
            "step_seconds": [round(x, 6) for x in s]}


def own_pace(run_dir: Path) -> dict:
    """The diagnosis' own pace: its MFU's step (and the wall-clock one beside it) and how much of
    each untraced step other processes took (``host_wait``)."""
    d = json.loads((run_dir / "diagnosis.json").read_text())
    m, h = d.get("mfu") or {}, d.get("host_wait") or {}
    return {"mfu_step_ms": (m.get("step_time_us") or 0) / 1e3, "mfu_wall": m.get("wall_value"),
            "mfu_wall_step_ms": (m.get("wall_step_time_us") or 0) / 1e3, "mfu_pace": m.get("pace"),
            "machine_ms": (h.get("untraced_machine_us") or 0) / 1e3,
            "wall_ms": (h.get("untraced_wall_us") or 0) / 1e3, "host_note": h.get("note")}


def recommendations(run_dir: Path) -> list[dict]:
    d = json.loads((run_dir / "diagnosis.json").read_text())
    return [{k: r.get(k) for k in ("action", "predicted_step_s", "step_s", "gain", "text")}
            for r in (d.get("verdict") or {}).get("recommendations", [])]


def describe(r: dict) -> str:
    bits = [f"{r['job']} {r['config']} r{r['round']}: exit {r['exit']}, {r['wall_s']} s"]
    if "median_ms" in r:
        bits.append(f"own median {r['median_ms']:.2f} ms, after window {r['after_ms']:.2f} ms, "
                    f"total {r['total_s']:.3f} s, exit +{r.get('exit_after_last_step_s')} s")
    if r.get("measured"):
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "n/a"
        bits.append(f"{r['measured']}{' / ' + r['tie_with'] if r.get('tie_with') else ''} "
                    f"({r.get('confidence', 0):.2f}), MFU {mfu}, dilation {r.get('dilation')}")
    if r.get("cupti"):
        bits.append(f"cupti {json.dumps(r['cupti'])[:160]}")
    if r.get("diagnosis_error") or r.get("log_tail"):
        bits.append((r.get("diagnosis_error") or "") + " | " + (r.get("log_tail") or "")[-600:])
    return "; ".join(bits)


def interval(ratios: list[float]) -> dict:
    """Mean of per-round ratios and its two-sided 95% interval (Student's t)."""
    n = len(ratios)
    if n == 0:
        return {}
    mean = statistics.fmean(ratios)
    if n < 2:
        return {"n": n, "mean": mean}
    half = T95.get(n - 1, 1.96) * statistics.stdev(ratios) / math.sqrt(n)
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half, "ratios": ratios}


def observer_summary(runs: list[dict]) -> dict:
    """Per config: whole-run total, median and after-window median against the same round's alone."""
    out: dict = {}
    alone = {r["round"]: r for r in runs if r["job"] == "lm" and r["config"] == "alone" and "total_s" in r}
    for cfg in LM_CONFIGS:
        if cfg == "alone":
            continue
        rows = [r for r in runs if r["job"] == "lm" and r["config"] == cfg and "total_s" in r
                and r["round"] in alone]
        out[cfg] = {key: interval([r[key] / alone[r["round"]][key] for r in rows])
                    for key in ("total_s", "median_ms", "after_ms")}
    return out


def validation_summary(runs: list[dict], peak: float) -> dict:
    """Per job: analytic MFU from its alone runs; per validation run: label, MFU vs analytic; judge."""
    rows, out = [], {}
    for job in ("lm", "cnn"):
        alone = [r for r in runs if r["job"] == job and r["config"] == "alone" and "median_ms" in r]
        if not alone:
            continue
        step = statistics.median(r["median_ms"] for r in alone) / 1e3
        analytic = alone[0]["analytic_flops_per_step"] / step / peak
        wait = statistics.median(r["input_wait_share"] or 0.0 for r in alone)
        expected = "input-bound" if wait >= 0.20 else "memory-bound"
        out[job] = {"alone_ms": step * 1e3, "analytic_mfu": analytic, "input_wait_share": wait,
                    "expected": expected}
        for r in runs:
            if r["job"] != job or r["config"] not in MODE_OF:
                continue
            row = dict(r, mode=MODE_OF[r["config"]], expected=expected)
            row["mfu_vs_analytic"] = r["mfu"] / analytic - 1 if r.get("mfu") else None
            rows.append(row)
    lines, passed = judge(rows)
    out["judge"] = {"lines": lines, "passed": passed}
    out["table"] = [{k: r.get(k) for k in ("job", "mode", "round", "expected", "measured", "tie_with",
                                           "confidence", "mfu", "mfu_vs_analytic", "dilation", "basis",
                                           "traced_label")} for r in rows]
    return out


def dl_workers(run: dict) -> tuple[int | None, float | None, float | None]:
    """The ``dataloader-workers`` advice: (workers it asks for, step it starts from, predicted step)."""
    for rec in run.get("recommendations") or []:
        if rec["action"] == "dataloader-workers":
            m = re.search(r"at least (\d+)", rec.get("text") or "")
            return (int(m.group(1)) if m else None), rec.get("step_s"), rec.get("predicted_step_s")
    return None, None, None


def window(row: dict) -> tuple[int, int]:
    """The job's own step indices that gpudiag's window touched: the profiler's warm-up (from 3
    steps before the first traced one) to the step after the export. The job's own step i ends
    at about gpudiag's step i + 1 (gpudiag counts optimizer steps from the first)."""
    tr = row.get("traced_steps") or []
    return (min(tr) - 3, max(tr) + 1) if tr else (19, 27)


def paired(row: dict) -> dict:
    """Within one run (one process, one GPU state): the median of the 10 steps before the window
    and of every step after it, their ratio, and the window's own cost in seconds (its steps
    less as many steps at the after-pace). An alone run is cut where a --skip 20 window would be."""
    s = row["step_seconds"]
    lo, hi = window(row)
    before, after = s[max(3, lo - 10):lo], s[hi + 1:]
    if not before or not after:
        return {}
    b, a = statistics.median(before), statistics.median(after)
    return {"before_ms": 1e3 * b, "after_ms": 1e3 * a, "after_over_before": a / b,
            "window_cost_s": sum(s[lo:hi + 1]) - (hi + 1 - lo) * a}


def pace_table(rows: list[dict], peak: float | None, summaries: list[dict]) -> list[str]:
    """Issue 38 on a GPU (phases pace1/pace2): per run, the job's own median step (alone or
    profiled, quiet or beside the loops), gpudiag's label, MFU at the job's own pace and by wall
    clock, and the analytic MFU at the quiet alone run's step; then each ``gpudiag diff``."""
    runs = [r for r in rows if r["job"] == "pace" and r.get("step_seconds")]
    if not runs:
        return []
    quiet = [x for r in runs if r["config"] == "alone" for x in r["step_seconds"][20:]]
    flops = next((r["analytic_flops_per_step"] for r in runs if r.get("analytic_flops_per_step")), None)
    analytic = flops / statistics.median(quiet) / peak if quiet and flops and peak else None
    out = ["", "The job's own pace on a busy host (LM; loops: busy loops beside it)"
           + (f"; analytic MFU at the quiet alone step: {100 * analytic:.1f}%" if analytic else ""),
           "| config | round | loops | own timer median (ms) | label (confidence) | MFU own pace | "
           "MFU by wall | other processes' part of the untraced step |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        label = f"{r['measured']} ({r['confidence']:.2f})" if r.get("measured") else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        wall = f"{100 * r['mfu_wall']:.1f}%" if r.get("mfu_wall") else "-"
        part = (f"{r['machine_ms']:.1f} of {r['wall_ms']:.1f} ms" if r.get("wall_ms") else "-")
        own = 1e3 * statistics.median(r["step_seconds"][20:])
        out.append(f"| {r['config']} | {r['round']} | {r.get('loops', 0)} | {own:.2f} | {label} | {mfu} | "
                   f"{wall} | {part} |")
    for summary in summaries:
        for name, d in (summary.get("pace_diffs") or {}).items():
            if "error" in d:
                out.append(f"- diff {name}: failed: {d['error'][:200]}")
                continue
            own, wall = d["own_pace_change"], d["step_change"]
            out.append(f"- diff {name}: own pace {own['change']:+.1%} ({own['direction']}), wall clock "
                       f"{wall['change']:+.1%} ({wall['direction']}); {d.get('machine_note') or ''}")
    return out


def tables(paths: list[Path]) -> str:
    """The closing note's tables from recorded sessions (raw ``session.json`` files, or the
    compact one in tests/fixtures/h200-2026-11-28): observer cost, validation, DataLoader."""
    rows, peak, lines = [], None, []
    for i, path in enumerate(paths):
        data = json.loads(path.read_text())
        for r in data["runs"]:
            rows.append(dict(r, call=r.get("call", i + 1)))
        peak = (data.get("info") or next(iter((data.get("calls") or {}).values()), {})).get("peak_flops")
    lines += ["Observer cost, LM, within each run: steps after the window over the 10 before it",
              "| config | runs | after/before per run | mean (95% interval) | window's cost per run (s) |",
              "|---|---|---|---|---|"]
    for cfg in LM_CONFIGS:
        got = [(r, paired(r)) for r in rows
               if r["job"] == "lm" and r["config"] == cfg and r.get("step_seconds")]
        got = [(r, p) for r, p in got if p]
        if not got:
            continue
        ratios = [p["after_over_before"] for _, p in got]
        iv = interval(ratios)
        span = f"{iv['mean']:.3f}" + (f" ({iv['low']:.3f}-{iv['high']:.3f})" if "low" in iv else "")
        costs = " ".join(f"{p['window_cost_s']:.2f}" for _, p in got) if cfg != "alone" else "-"
        lines.append(f"| {cfg} | {len(got)} | {' '.join(f'{x:.3f}' for x in ratios)} | {span} | {costs} |")
    lines += ["", "Observer cost, LM, whole run from step 21 against the same round's alone run",
              "| call, round, steps | " + " | ".join(c for c in LM_CONFIGS if c != "alone") + " |",
              "|---|" + "---|" * (len(LM_CONFIGS) - 1)]
    for key in sorted({(r["call"], r["round"]) for r in rows if r["job"] == "lm"}):
        alone = next((r for r in rows if r["job"] == "lm" and (r["call"], r["round"]) == key
                      and r["config"] == "alone" and r.get("step_seconds")), None)
        if alone is None:
            continue
        total = sum(alone["step_seconds"][20:])
        cells = []
        for cfg in LM_CONFIGS:
            if cfg == "alone":
                continue
            r = next((r for r in rows if r["job"] == "lm" and (r["call"], r["round"]) == key
                      and r["config"] == cfg and r.get("step_seconds")), None)
            cells.append(f"{sum(r['step_seconds'][20:]) / total:.3f}" if r else "")
        lines.append(f"| {key[0]}, {key[1]}, {len(alone['step_seconds'])} | " + " | ".join(cells) + " |")
    lines += ["", "Validation: gpudiag's label and MFU per run, against the analytic MFU at the job-alone "
              "pace (pooled alone runs) and at the run's own pace (its untraced steps outside the window)",
              "| job | mode | call, round | label (tie) | confidence | MFU | vs alone pace | vs own pace |",
              "|---|---|---|---|---|---|---|---|"]
    for job in ("lm", "cnn"):
        alone = [x for r in rows if r["job"] == job and r["config"] == "alone"
                 for x in r["step_seconds"][10:]]
        flops = next((r["analytic_flops_per_step"] for r in rows if r["job"] == job
                      and r.get("analytic_flops_per_step")), None)
        if not alone or not flops or not peak:
            continue
        analytic = flops / statistics.median(alone) / peak
        lines.append(f"| {job} | alone | | | | {100 * analytic:.1f}% analytic | "
                     f"{statistics.median(alone) * 1e3:.2f} ms | |")
        for r in rows:
            if r["job"] != job or r["config"] not in MODE_OF or not r.get("mfu"):
                continue
            lo, hi = window(r)
            s = r["step_seconds"]
            own = flops / statistics.median(s[5:lo] + s[hi + 1:]) / peak
            tie = f" ({r['tie_with']})" if r.get("tie_with") else ""
            lines.append(f"| {job} | {MODE_OF[r['config']]} | {r['call']}, {r['round']} | "
                         f"{r['measured']}{tie} | {r['confidence']:.2f} | {100 * r['mfu']:.1f}% | "
                         f"{r['mfu'] / analytic - 1:+.1%} | {r['mfu'] / own - 1:+.1%} |")
    pace = pace_table(rows, peak, [json.loads(p.read_text()).get("summary", {}) for p in paths])
    # a session without the LM and CNN phases (2026-11-30's) prints its own tables alone
    lines = lines + pace if any(r["job"] in ("lm", "cnn") for r in rows) else pace[1:]
    for r in rows:
        if r["job"] == "dl" and r["config"] == "w0-profile":
            need, before, predicted = dl_workers(r)
            fixed = next((x for x in rows if x["job"] == "dl" and x["config"] == f"w{need}-alone"), None)
            w0 = next((x for x in rows if x["job"] == "dl" and x["config"] == "w0-alone"), None)
            if fixed and predicted:
                measured = statistics.median(fixed["step_seconds"][10:])
                w0_ms = 1e3 * statistics.median(w0["step_seconds"][4:]) if w0 else float("nan")
                lines += ["", "DataLoader prediction (num_workers=0 -> the advice's workers, applied alone)",
                          "| w0 alone (own) | gpudiag's step | advice | predicted | applied (own) | ratio |",
                          "|---|---|---|---|---|---|",
                          f"| {w0_ms:.1f} ms | {1e3 * before:.1f} ms | {need} workers | "
                          f"{1e3 * predicted:.1f} ms | {1e3 * measured:.1f} ms | "
                          f"{predicted / measured:.2f} |"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-session")))
    ap.add_argument("--budget", type=float, default=470.0, help="seconds; no run starts after it")
    ap.add_argument("--lm-steps", type=int, default=120)
    ap.add_argument("--cnn-steps", type=int, default=40)
    ap.add_argument("--small", action="store_true", help="tiny models on the CPU: checks the script only")
    ap.add_argument("--plan", default="lm1,cnn1,dl,lm2,cnn2,lm3a",
                    help="phases in order: lm1 lm2 (every config), lm3 (all but defaults), lm3a lm4a (alone "
                         "and the auto configs), cnn1 cnn2a (alone and three modes), cnn2 (the modes), dl, "
                         "dlbusy (dl beside a busy loop per four cores), pace1 pace2 (the LM quiet and beside"
                         " two busy loops per core, alone and profiled, and gpudiag diff between them)")
    ap.add_argument("--tables", type=Path, nargs="+", metavar="SESSION_JSON",
                    help="print the tables of recorded sessions and exit (no GPU needed)")
    args = ap.parse_args()
    if args.tables:
        print(tables(args.tables))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    s = Session(args.out, args.budget, args.small)
    import torch

    if args.small:
        from gpudiag.collectors.cpu_peak import cpu_peak

        gpu, peak = "CPU (dry run)", cpu_peak().peak_for("float")[0]
    elif not torch.cuda.is_available():
        print("no CUDA device: this session needs one (--small checks the script on a CPU)", file=sys.stderr)
        return 2
    else:
        from gpudiag.devices import match_device

        gpu = torch.cuda.get_device_name(0)
        peak = match_device(gpu).peak_for("c10::bfloat16")[0]
    import gpudiag

    s.info = {"device": gpu, "peak_flops": peak, "torch": torch.__version__, "python": sys.version.split()[0],
              "gpudiag": gpudiag.__version__, "gpudiag_from": str(Path(gpudiag.__file__).parent),
              "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
                            "--format=csv,noheader"], capture_output=True, text=True)
        s.info["nvidia_smi"] = q.stdout.strip()
    s.save()
    s.say(f"device {gpu}, bf16 peak {peak / 1e12:.1f} TFLOP/s, torch {torch.__version__}, "
          f"gpudiag from {s.info['gpudiag_from']}")

    def summarise() -> None:
        s.summary["observer"] = observer_summary(s.runs)
        s.summary["validation"] = validation_summary(s.runs, peak)
        s.save()

    def lm_round(rnd: int, configs: list[str]) -> None:
        order = configs if rnd % 2 else list(reversed(configs))
        for cfg in order:
            s.run("lm", cfg, rnd, LM_CONFIGS[cfg], "lm", args.lm_steps)
        summarise()
        s.pack("lm")

    def cnn_round(rnd: int, configs: list[str]) -> None:
        order = configs if rnd % 2 else list(reversed(configs))
        for cfg in order:
            # the first alone run exits as the job would (the H200's 14-worker job sat 70 s
            # between its last step and its exit: docs/benchmarks.md); every other run shuts its
            # workers down after the last step, so no run waits on that
            natural = cfg == "alone" and not any(r["job"] == "cnn" and r["config"] == "alone" for r in s.runs)
            s.run("cnn", cfg, rnd, CNN_CONFIGS[cfg], "cnn", args.cnn_steps,
                  [] if natural else ["--close-loader"], timeout=60 if natural else 120)
        summarise()
        s.pack("cnn")

    dl_job = DL_JOB

    def dataloader(job: str = "dl", loops: int = 0) -> None:
        """The workers advice of the ``num_workers=0`` job, applied to the same job alone; with
        ``loops``, every run of it beside that many busy loops (the advice must count the cores
        they leave)."""
        key = "dataloader" if not loops else "dataloader_busy"
        # beside busy loops the job's 16 intra-op threads spin at every operator's end: on the
        # H200 (2026-11-30) a step took 18.3 s against 507 ms quiet, and 24 steps with the
        # default window (after step 10) outran a 200 s limit before the trace; so beside loops
        # a short run traced early
        steps, opts = (24, []) if not loops else (8, ["--skip", "2", "--steps", "3"])
        r = s.run(job, "w0-profile", 1, opts, "cnn", steps, dl_job, timeout=200 if not loops else 300,
                  loops=loops)
        if not r:
            return
        need, before, predicted = dl_workers(r)
        s.summary[key] = {"advice_workers": need, "step_s": before, "predicted_step_s": predicted,
                          "loops": loops}
        s.save()
        if need is None:
            s.say(f"no dataloader-workers advice with a worker count: {r.get('recommendations')}")
            s.pack(job)
            return
        alone0 = s.run(job, "w0-alone", 1, None, "cnn", 16 if not loops else 6, dl_job,
                       timeout=120 if not loops else 150, loops=loops)
        fixed = dl_job.copy()
        fixed[1] = str(need)
        applied = s.run(job, f"w{need}-alone", 1, None, "cnn", 60, fixed + ["--close-loader"], timeout=150,
                        loops=loops)
        if applied and "step_seconds" in applied:
            steady = applied["step_seconds"][10:] or applied["step_seconds"]
            measured = statistics.median(steady)
            s.summary[key].update({
                "measured_step_s": measured, "ratio_predicted_over_measured": (predicted or 0) / measured,
                "within": abs((predicted or 0) / measured - 1) <= TOLERANCE_DL,
                "w0_alone_step_s": (statistics.median(alone0["step_seconds"][4:]) if alone0 and
                                    "step_seconds" in alone0 else None)})
            s.say(f"DataLoader ({loops} loops beside): advice {need} workers, predicted {before} -> "
                  f"{predicted} s; applied: {measured:.4f} s "
                  f"({s.summary[key]['ratio_predicted_over_measured']:.2f}x)")
        s.save()
        s.pack(job)

    def pace_round(rnd: int) -> None:
        """Issue 38 on a GPU: the LM quiet and beside twice as many busy loops as cores, alone
        (its own timer: the truth) and under gpudiag's defaults; then ``gpudiag diff`` of every
        quiet profiled run against every busy one (own pace: no significant change) and of the
        quiet runs against each other."""
        n = 2 * (os.cpu_count() or 2)
        order = [("alone", None, 0), ("defaults", [], 0), ("alone-busy", None, n), ("defaults-busy", [], n)]
        for cfg, opts, loops in (order if rnd % 2 else order[::-1]):
            s.run("pace", cfg, rnd, opts, "lm", args.lm_steps, loops=loops)
        done = {(r["config"], r["round"]) for r in s.runs if r["job"] == "pace" and r.get("measured")}
        quiet = sorted(k for k in done if k[0] == "defaults")
        busy = sorted(k for k in done if k[0] == "defaults-busy")
        pairs = [(q, b) for q in quiet for b in busy] + [(q[0], q[1]) for q in (quiet, busy) if len(q) > 1]
        diffs = s.summary.setdefault("pace_diffs", {})
        for a, b in pairs:
            name = f"{a[0]}-{a[1]} -> {b[0]}-{b[1]}"
            if name not in diffs and s.left() > 20:
                diffs[name] = diff_row(s.work / f"pace-{a[0]}-{a[1]}", s.work / f"pace-{b[0]}-{b[1]}")
                s.say(f"diff {name}: {json.dumps(diffs[name])[:900]}")
        s.save()
        s.pack("pace")

    every_lm, auto_lm = list(LM_CONFIGS), ["alone", "prof-auto", "mon-auto"]
    phases = {"lm1": lambda: lm_round(1, every_lm), "lm2": lambda: lm_round(2, every_lm),
              "lm3": lambda: lm_round(3, auto_lm[:1] + [c for c in every_lm[1:] if c != "defaults"]),
              "lm3a": lambda: lm_round(3, auto_lm), "lm4a": lambda: lm_round(4, auto_lm),
              "cnn1": lambda: cnn_round(1, list(CNN_CONFIGS)),
              "cnn2": lambda: cnn_round(2, [c for c in CNN_CONFIGS if c != "alone"]),
              "cnn2a": lambda: cnn_round(2, list(CNN_CONFIGS)), "dl": dataloader,
              "dlbusy": lambda: dataloader("dlb", (os.cpu_count() or 4) // 4),
              "pace1": lambda: pace_round(1), "pace2": lambda: pace_round(2)}
    for phase in args.plan.split(","):
        if phase not in phases:
            print(f"--plan: unknown phase {phase!r}: use {', '.join(phases)}", file=sys.stderr)
            return 2
    for phase in args.plan.split(","):
        s.say(f"phase {phase}")
        phases[phase]()
    summarise()
    s.say("observer: " + json.dumps({k: {m: {x: round(y, 4) for x, y in v.items() if x != "ratios"}
                                          for m, v in d.items()} for k, d in s.summary["observer"].items()}))
    s.say("validation: " + " | ".join(s.summary["validation"]["judge"]["lines"]))
    s.say(f"dataloader: {s.summary.get('dataloader')}; beside loops: {s.summary.get('dataloader_busy')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
