"""The held-out-3 table: each job's truth over several ``run_zoo.py --truth-only`` rounds, and
``gpudiag_palindrome.py``'s verdicts, fixes and observer cost, as markdown.

    python benchmarks/zoo/h3_table.py --truth A.json,B.json --palindrome P.json --peaks F.json

MFU truth: the job's hand-counted FLOPs over its alone step in the palindromes (the alone runs
beside the profiled ones)
against ``--peaks`` (measured on a quiet machine: a peak measured at load 12 reads 3x low).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _f(x, fmt="{:.1f}"):
    return "–" if x is None else fmt.format(x)


def _knobs(r: dict) -> dict:
    base = r["runs"].get("base") or [{}]
    return (base[0].get("report") or {}).get("knobs", {})


def truth_cell(rounds: list[dict]) -> tuple[str, str, list[str]]:
    exp = []
    parts = []
    for r in rounds:
        e = r["expected"]
        lab = e["label"] + (f"/{e['tie_with']}" if e.get("tie_with") else "")
        exp.append(lab)
        sh = ", ".join(f"{k.split('-')[0]} {v:.0%}" for k, v in
                       sorted(r["truth"]["shares"].items(), key=lambda kv: -kv[1])[:2])
        parts.append(f"{r['truth']['base_ms']:.0f} ms ({sh}; load "
                     f"{r['load_range'][0]:.0f}-{r['load_range'][1]:.0f})")
    return "<br>".join(parts), " · ".join(exp), exp


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--truth", required=True)
    p.add_argument("--palindrome", required=True)
    p.add_argument("--peaks", required=True)
    args = p.parse_args()
    peaks = json.loads(Path(args.peaks).read_text())
    truths: dict[str, list[dict]] = {}
    for f in args.truth.split(","):
        for r in json.loads(Path(f).read_text())["jobs"]:
            truths.setdefault(r["job"], []).append(r)
    for name, rounds in truths.items():  # a round run with other defaults (the job changed)
        last = _knobs(rounds[-1])
        truths[name] = [r for r in rounds if _knobs(r) == last]
    pals: dict[str, list[dict]] = {}
    for f in args.palindrome.split(","):
        for r in json.loads(Path(f).read_text())["jobs"]:
            pals.setdefault(r["job"], []).append(r)
    print("| job | truth: alone step (top shares; load), per round | expected label | gpudiag "
          "label (confidence), each run | right? | MFU gpudiag own pace / wall (its first run) "
          "vs truth | each fix: predicted → measured (ratio; ±25%?) | slowed the job | "
          "would not help (gpudiag) | observer: default / --skip 1e6 over alone | load |")
    print("|" + "---|" * 11)
    for name, rounds in truths.items():
        tcell, ecell, exps = truth_cell(rounds)
        prs = pals.get(name)
        if not prs:
            print(f"| {name} | {tcell} | {ecell} | not run | | | | | | | |")
            continue
        ds = [r.get("diagnosis") or {} for pr in prs for r in pr["runs"]
              if r["mode"] == "default"]
        labs = " · ".join(
            (d.get("label") or "none") + (f"/{d['tie_with']}" if d.get("tie_with") else "")
            + f" ({_f(d.get('confidence'), '{:.2f}')})" for d in ds)
        want = {x for e in exps for x in e.split("/")}
        rights = []
        for d in ds:
            got = {d.get("label"), d.get("tie_with")} - {None}
            main_exp = {e.split("/")[0] for e in exps}
            rights.append("✓" if d.get("label") in main_exp and not d.get("tie_with") else
                          "✓ (tie)" if got & want else "✗")
        d1 = ds[0] if ds else {}
        base = rounds[0]["truth"]
        flops = (base["in_job"].get("flops_per_step")
                 or base["in_job"].get("flops_per_step_per_rank"))
        steps = [pr["mean_ms"]["alone"] for pr in prs if pr["mean_ms"].get("alone")]
        dt = base["in_job"].get("dtype") if base["in_job"].get("dtype") in ("bf16", "fp64") \
            else "fp32"
        pk = peaks.get(f"{dt}_gflops_1t")
        mfu_t = flops / (sum(steps) / len(steps) / 1e3) / (pk * 1e9) if flops and pk else None
        mfu = (f"{_f(d1.get('mfu') and d1['mfu'] * 100)}% / "
               f"{_f(d1.get('mfu_wall') and d1['mfu_wall'] * 100)}% vs "
               f"{_f(mfu_t and mfu_t * 100)}% ({dt}, {pk:.0f} GFLOP/s)" if pk else "")
        fl, slow = [], []
        for fx in [f for pr in prs for f in pr["fixes"]]:
            rec = fx["rec"]
            head = f"{fx['rank']}. `{rec.get('action')}`"
            if fx["args"] is None:
                fl.append(f"{head}: {fx['knob']}")
                continue
            pa, pb = fx.get("predicted_after_ms"), fx.get("predicted_before_ms")
            ma, mb = fx.get("measured_after_ms"), fx.get("measured_before_ms")
            s = f"{head} [{fx['knob']}]: "
            s += f"pred {_f(pb)}→{_f(pa)}" if pa else "no prediction"
            s += f"; meas {_f(mb)}→{_f(ma)}"
            if fx.get("ratio_scaled") is not None:
                s += (f"; ratio {fx['ratio_scaled']:.2f} "
                      f"{'✓' if fx['within_25'] else '✗'}")
            fl.append(s)
            if fx.get("slows_job"):
                slow.append(f"`{rec.get('action')}` {mb:.1f}→{ma:.1f} ms")
        na = sorted({r.get("action") for d in ds for r in d.get("not_advised") or []})
        obs = "<br>".join(f"{_f(pr['observer'].get('default'), '{:.2f}x')} / "
                          f"{_f(pr['observer'].get('skip'), '{:.2f}x')}" for pr in prs)
        lr = [x for pr in prs for x in pr["load_range"]]
        print(f"| {name} | {tcell} | {ecell} | {labs} | {' · '.join(rights)} | {mfu} | "
              f"{'<br>'.join(fl) or 'none'} | {'; '.join(slow) or 'none'} | "
              f"{', '.join(na) or '–'} | {obs} | {min(lr):.1f}-{max(lr):.1f} |")


if __name__ == "__main__":
    main()
