"""The held-out-4 table: each job's truth over ``run_zoo.py --truth-only`` rounds (the blocked
share timed in the job, and what taking the wait away or moving it off the thread did), and
``gpudiag_palindrome.py``'s verdicts, what it says about the blocked thread, its fixes and the
observer's cost, as markdown.

    python benchmarks/zoo/h4_table.py --truth A.json,B.json --palindrome P.json[,Q.json]

"Names the blocking": the verdict's advice ``unblock-training-thread`` (or any advice or summary
saying the thread is asleep): gpudiag's asleep ms per step against the job's own timed ms in the
blocking call (the palindrome's alone runs are not instrumented apart: the truth rounds' mean).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from h3_table import _f, _knobs, truth_cell

BLOCK = "unblock-training-thread"
# the variant that removes the wait altogether, per job (a probe in the truth rounds)
NONE = {"tcp_reply": "no_rpc", "fsync_log": "no_log", "lock_wait": "no_publisher",
        "subprocess_step": "no_cmd", "rate_limit": "no_limit", "queue_feed": "no_latency"}


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def block_truth(rounds: list[dict], name: str) -> tuple[str, float | None, float | None]:
    """Per round: blocked ms (share), and 1 - step without the wait / step."""
    cells, bms, steps = [], [], []
    for r in rounds:
        t = r["truth"].get("in_job", {})
        base = r["truth"]["base_ms"]
        if not t.get("blocked_ms"):
            cells.append(f"nothing blocks outside the DataLoader (thread CPU "
                         f"{t.get('cpu_step_median_ms', 0):.1f} of {base:.1f} ms)")
            continue
        s = f"{t['blocked_ms']:.1f} of {base:.1f} ms ({t.get('blocked_share', 0):.0%}"
        s += f", CPU {t.get('blocked_cpu_ms', 0):.2f} ms); the rest {base - t['blocked_ms']:.1f}"
        s += f" ms, thread CPU {t.get('cpu_step_median_ms', 0) - t.get('blocked_cpu_ms', 0):.1f}"
        v = NONE.get(name)
        sv = r.get("steps_ms", {}).get(v) if v else None
        if sv:
            s += f"; without it {_mean(sv):.1f} ms (−{1 - _mean(sv) / base:.0%})"
        for k in ("prefetch", "async"):
            sk = r.get("steps_ms", {}).get(k)
            if sk:
                s += f"; {k} {_mean(sk):.1f} ms ({_mean(sk) / base:.2f}x)"
        cells.append(s)
        bms.append(t.get("blocked_ms"))
        steps.append(base)
    return "<br>".join(cells), _mean(bms), _mean(steps)


def said_blocked(d: dict) -> tuple[str, float | None, float | None]:
    """What gpudiag said about the asleep thread: (where: advised / not advised / summary /
    nowhere, ms asleep per step, its step)."""
    for where, recs in (("advised", d.get("recommendations") or []),
                        ("not advised", d.get("not_advised") or [])):
        for r in recs:
            if r.get("action") == BLOCK:
                m = re.search(r"sleeps ([\d.]+) ms of each ([\d.]+) ms step", r.get("text") or "")
                return (where, float(m.group(1)) if m else None,
                        float(m.group(2)) if m else None)
    if "asleep" in (d.get("summary") or ""):
        return "summary only", None, None
    return "nowhere", None, None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--truth", required=True)
    p.add_argument("--palindrome", required=True)
    args = p.parse_args()
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
    print("| job | truth: alone step (top shares; load), per round | blocked, timed in the job "
          "(its thread's CPU in it); the wait removed; the fix | expected label | gpudiag label "
          "(confidence), each run | right? | blocking named? gpudiag asleep / its step, each run "
          "| each fix: predicted → measured (ratio; ±25%?) | slowed the job | would not help "
          "(gpudiag) | observer: default / --skip 1e6 over alone | load |")
    print("|" + "---|" * 12)
    for name, rounds in truths.items():
        tcell, ecell, exps = truth_cell(rounds)
        bcell, _, _ = block_truth(rounds, name)
        prs = pals.get(name)
        if not prs:
            print(f"| {name} | {tcell} | {bcell} | {ecell} | not run | | | | | | | |")
            continue
        ds = [r.get("diagnosis") or {} for pr in prs for r in pr["runs"]
              if r["mode"] == "default"]
        labs = " · ".join(
            (d.get("label") or "none") + (f"/{d['tie_with']}" if d.get("tie_with") else "")
            + f" ({_f(d.get('confidence'), '{:.2f}')})" for d in ds)
        want = {x for e in exps for x in e.split("/")}
        main_exp = {e.split("/")[0] for e in exps}
        rights = []
        for d in ds:
            got = {d.get("label"), d.get("tie_with")} - {None}
            rights.append("✓" if d.get("label") in main_exp and not d.get("tie_with") else
                          "✓ (tie)" if got & want else "✗")
        named = []
        for d in ds:
            where, ms, st = said_blocked(d)
            named.append(f"{where}" + (f": {ms:.1f} / {st:.1f} ms ({ms / st:.0%})" if ms and st
                                       else ""))
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
        print(f"| {name} | {tcell} | {bcell} | {ecell} | {labs} | {' · '.join(rights)} | "
              f"{' · '.join(named)} | {'<br>'.join(fl) or 'none'} | {'; '.join(slow) or 'none'}"
              f" | {', '.join(na) or '–'} | {obs} | {min(lr):.1f}-{max(lr):.1f} |")


if __name__ == "__main__":
    main()
