"""The zoo's results as markdown: one row per job, one line per recommendation."""

from __future__ import annotations

from zoo_truth import label_right


def _ms(x: float | None) -> str:
    return "–" if x is None else (f"{x:.1f}" if x < 100 else f"{x:.0f}")


def _pct(x: float | None) -> str:
    return f"{x:.1%}" if isinstance(x, (int, float)) else "–"


def _label(d: dict) -> str:
    if not d or not d.get("label"):
        return "none"
    s = d["label"]
    if d.get("tie_with"):
        s += f" / {d['tie_with']} (tie)"
    return s


def fix_line(fx: dict) -> str:
    rec = fx["rec"]
    head = f"{fx['rank']}. `{rec.get('action')}`"
    if fx["args"] is None:
        return f"{head}: {fx['knob']}"
    pb, pa = fx.get("predicted_before_ms"), fx.get("predicted_after_ms")
    mb, ma = fx.get("measured_before_ms"), fx.get("measured_after_ms")
    pred = f"pred {_ms(pb)}→{_ms(pa)}" if pa else "no prediction"
    s = f"{head} [{fx['knob']}]: {pred}; meas {_ms(mb)}→{_ms(ma)}"
    if fx.get("ratio_scaled") is not None:
        ok = "✓" if fx["within_25"] else "✗"
        rng = "in range" if fx.get("in_stated_range") else "out of range"
        s += f"; ratio {fx['ratio_scaled']:.2f} (raw {fx['ratio_raw']:.2f}) {ok}, {rng}"
    flags = []
    if fx.get("slows_job"):
        flags.append("**SLOWS THE JOB**")
    if fx.get("predicted_slower"):
        flags.append("**predicted slower, still listed**")
    return s + (" " + " ".join(flags) if flags else "")


def markdown(meta: dict, results: list[dict]) -> str:
    lines = [
        f"Machine: {meta['cpu']}, {meta['cores']} cores; peaks measured here: "
        + ", ".join(f"{k} {v}" for k, v in meta["peaks"].items()),
        f"Load: start `{meta['uptime_start']}`; end `{meta['uptime_end']}`; "
        f"zoo wall time {meta.get('jobs_wall_s', meta['wall_s']) / 60:.1f} min (jobs), "
        f"rounds {meta['rounds']}"
        + (", quick" if meta["quick"] else ""),
        "",
        "Ratio = (predicted after/before) / (measured after/before); raw = predicted after / "
        "measured after. ✓ within ±25%. In range: the measured after/before lies between "
        "gpudiag's predicted after/before (the fix done fully, its stated bound) and 1.",
        "",
        "| job | truth (own timer) | gpudiag label (confidence) | expected from truth | right? "
        "| MFU gpudiag (own pace / wall) vs truth (its own timer; ceiling: FLOPs over its "
        "training thread's CPU time) | fixes: predicted → measured (ms, ratio) "
        "| observer (profiled / alone step), load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        g = r["gpudiag"]
        d = g.get("diagnosis") or {}
        truth = r["truth"]
        facts = "; ".join(truth.get("facts", [])) or truth.get("error", "")
        conf = d.get("confidence")
        got = _label(d) + (f" ({conf:.2f})" if conf is not None else " (–)")
        if g.get("error"):
            got = f"error: {g['error']}"
        right = label_right(r["expected"], d) if d else "n/a"
        exp = _label(r["expected"])
        if r["expected"].get("share") is not None:
            exp += f" ({r['expected']['share']:.0%})"
        mfu = f"{_pct(d.get('mfu'))} / {_pct(d.get('mfu_wall'))} vs {_pct(truth.get('mfu'))}"
        if truth.get("mfu_cpu"):  # the own-pace MFU's ceiling (zoo_truth); over it is a fault
            over = d.get("mfu") is not None and d["mfu"] > 1.1 * truth["mfu_cpu"]
            mfu += f" (ceiling {_pct(truth['mfu_cpu'])}{': **OVER**' if over else ''})"
        obs = f"{r['observer_ratio']:.2f}x" if r.get("observer_ratio") else "–"
        if r.get("load_range"):
            obs += f"<br>load {r['load_range'][0]:.1f}–{r['load_range'][1]:.1f}"
        fixes = "<br>".join(fix_line(fx) for fx in r["fixes"]) or "none"
        lines.append(f"| {r['job']} | {facts} | {got} | {exp} | {right} | {mfu} | {fixes} "
                     f"| {obs} |")
    return "\n".join(lines)
