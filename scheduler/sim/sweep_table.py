"""The sweep's raw replays (``sweep.run_sweep``) as rows per family, load and policy: seed means,
ratios against EASY at the same load and seed, and the issue's targets checked for gpudiag.

Why ratios per seed: loads of one seed replay the same jobs with the same MFU, so a ratio taken
within a seed compares the policies on identical work; the mean of those ratios is what the
targets are read from (a mean of raw values would let one heavy seed decide).
"""

from __future__ import annotations

import math
import statistics

from gpudiag.scheduler.sim.sweep import BASELINE

# (metrics key, column header, divisor for display: hours for times)
H = 3600.0
METRICS = (("offered_load", "offered load", 1.0), ("arrival_utilisation", "utilisation while arriving", 1.0),
           ("gpu_utilisation", "utilisation", 1.0),
           ("avg_jct_s", "mean JCT h", H), ("p99_jct_s", "p99 JCT h", H), ("makespan_s", "makespan h", H),
           ("useful_work_weighted_wait_s", "useful-work-weighted wait h", H),
           ("high_mfu_avg_jct_s", "high-MFU mean JCT h", H),
           ("max_wait_low_mfu_s", "longest low-MFU wait h", H),
           ("teams_at_90pct", "teams >= 90% of quota", 1.0), ("teams_over_quota", "teams over quota", 1.0),
           ("min_quota_share", "lowest team quota share", 1.0), ("worst_rho", "worst rho", 1.0),
           ("share_rho_above_1", "share rho > 1", 1.0))
RATIOS = (("avg_jct_s", "mean JCT"), ("useful_work_weighted_wait_s", "UW wait"),
          ("high_mfu_avg_jct_s", "high-MFU JCT"), ("max_wait_low_mfu_s", "longest low-MFU wait"),
          ("worst_rho", "worst rho"))
# issue 20: "where the cluster queues (utilisation >= 0.5)", read as the utilisation while jobs
# arrive (sweep.arrival_utilisation): over the makespan, a window's weeks-long drain hides the queue
QUEUES_AT = 0.5
ALL_WINDOWS = "windows-all"   # the 8-hour windows' mean: load 0 stands for "all windows"


def ratio(a: float | None, b: float | None) -> float:
    """a / b; 1 when both are 0 (equal), NaN when only b is (no baseline to compare with)."""
    if a is None or b is None:
        return math.nan
    if b == 0:
        return 1.0 if a == 0 else math.nan
    return a / b


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.fmean(xs) if xs else None


def table(runs: list[dict]) -> dict[str, list[dict]]:
    """family -> rows {load, variant, seeds, mean: {key: value}, ratio: {key: vs EASY},
    target_lo_wait: longest low-MFU wait / EASY's longest wait (the issue's bound), teams: {team: share}}."""
    by: dict[tuple, dict] = {}
    for r in runs:
        if r["metrics"] is not None:
            by[(r["family"], r["load"], r["seed"], r["variant"])] = r["metrics"]
            if r["family"] == "windows":   # each window is its own load; and all of them as seeds of one row
                by[(ALL_WINDOWS, 0.0, r["seed"], r["variant"])] = r["metrics"]
    out: dict[str, list[dict]] = {}
    keys = sorted({(f, load, v) for f, load, _, v in by}, key=lambda k: (k[0], k[1]))
    for fam, load, variant in keys:
        seeds = sorted(s for f, lo, s, v in by if (f, lo, v) == (fam, load, variant))
        ms = [by[(fam, load, s, variant)] for s in seeds]
        pairs = [(m, by.get((fam, load, s, BASELINE))) for m, s in zip(ms, seeds, strict=True)]
        row = {"load": load, "variant": variant, "seeds": len(seeds),
               "mean": {k: _mean([m.get(k) for m in ms]) for k, _, _ in METRICS},
               "ratio": {k: _mean([ratio(m[k], b[k]) if b else math.nan for m, b in pairs])
                         for k, _ in RATIOS},
               "target_lo_wait": _mean([ratio(m["max_wait_low_mfu_s"], b["max_queue_delay_s"]) if b
                                        else math.nan for m, b in pairs]),
               "teams": {t: _mean([m["team_share"].get(t, {}).get("contended_quota_share") for m in ms])
                         for t in sorted({t for m in ms for t in m["team_share"]})}}
        out.setdefault(fam, []).append(row)
    return out


def targets(rows: list[dict], variant: str = "gpudiag") -> list[dict]:
    """Issue 20's targets for ``variant`` at each load: (name, value, met?) - None where it does not apply."""
    easy = {r["load"]: r for r in rows if r["variant"] == BASELINE}
    out = []
    for r in rows:
        if r["variant"] != variant or r["load"] not in easy:
            continue
        e, q = easy[r["load"]], r["ratio"]
        queues = (r["mean"]["arrival_utilisation"] or 0.0) >= QUEUES_AT
        over, met90 = r["mean"]["teams_over_quota"], r["mean"]["teams_at_90pct"]

        def check(v: float | None, ok: bool, applies: bool = True) -> tuple:
            return (v, None if not applies or v is None or math.isnan(v) else ok)

        out.append({"load": r["load"], "queues": queues, "checks": {
            "mean JCT <= EASY's": check(q["avg_jct_s"], (q["avg_jct_s"] or math.inf) <= 1.0),
            "longest low-MFU wait <= 2x EASY's longest wait": check(r["target_lo_wait"],
                                                                    (r["target_lo_wait"] or math.inf) <= 2.0),
            "UW wait >= 10% lower": check(q["useful_work_weighted_wait_s"],
                                          (q["useful_work_weighted_wait_s"] or math.inf) <= 0.9, queues),
            "high-MFU JCT >= 10% lower": check(q["high_mfu_avg_jct_s"],
                                               (q["high_mfu_avg_jct_s"] or math.inf) <= 0.9, queues),
            "every over-quota team >= 90%": check(met90 / over if over else None,
                                                  over is not None and met90 == over, queues),
            "worst rho <= EASY's": check(q["worst_rho"], (q["worst_rho"] or math.inf) <= 1.0 + 1e-9, queues),
        }, "easy_seeds": e["seeds"]})
    return out
