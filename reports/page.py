"""What both HTML pages (the report and the diff) share: the page environment, the data block,
the parts of a step and how a step-time bar is split, the verdict and the two views of a step.

Safety: every string from a trace or a command line is escaped, by Jinja's autoescape in the
templates and by ``svg._esc`` in the charts; the JSON block is serialised so that no value can
close its script element (``embed_json``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from gpudiag.diagnosis import Diagnosis, TimeBreakdown
from gpudiag.reports import svg, views
from gpudiag.reports.fmt import evidence_value, ms, num, pct, si_text, when

TEMPLATES = Path(__file__).parent / "templates"

# (TimeBreakdown field, label, colour): the parts of a step, in drawing order. Colours are
# shared by every chart so "memory-bound" is the same orange everywhere.
PARTS = [
    ("compute_bound", "compute-bound", svg.BLUE),
    ("memory_bound", "memory-bound", svg.ORANGE),
    ("comm_exposed", "exposed communication", svg.GREEN),
    ("memcpy_exposed", "exposed memcpy/memset", svg.PURPLE),
    ("input_wait", "input wait (DataLoader)", svg.VERMILLION),
    ("host_overhead", "host overhead", svg.YELLOW),
]
SHORT_LABELS = ["compute-bound", "memory-bound", "exposed comm", "exposed memcpy", "input wait",
                "host overhead"]  # table headers
UNSPLIT = ("compute not split by roofline", svg.SKY_BLUE)
STALLED = ("OS ran other work (of host overhead)", svg.GREY)  # TimeBreakdown.host_stalled
# TimeBreakdown.comm_work: the training thread's copies for the collectives, communication's cost
COMM_WORK = ("copies for the collectives (of compute)", svg.GREEN)
BOUND_COLOURS = {"compute": svg.BLUE, "memory": svg.ORANGE}
SLOWER, FASTER = svg.VERMILLION, svg.BLUE


_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def embed_json(data: Any) -> Markup:
    """JSON for a <script type="application/json"> element that no value can break out of.

    ``</script>`` or ``<!--`` inside a kernel name would end or confuse the element; with
    ``<``, ``>`` and ``&`` as \\u escapes the text holds no markup at all, and ``json.loads``
    of the element's text still returns the original values.
    """
    text = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    for ch, rep in _JSON_ESCAPES.items():
        text = text.replace(ch, rep)
    return Markup(text)


@lru_cache(maxsize=1)
def env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=num, ms=ms, pct=pct, when=when)
    return env


def part_segments(b: TimeBreakdown, length: float, unit_tip: bool) -> list[svg.Segment]:
    """Segments of one step-time bar; ``length`` is the bar's full length in axis units.

    Each part is drawn at its share of the step (``TimeBreakdown.fraction``) times the
    length: pure scaling. Compute time that the roofline did not split is drawn as its own
    segment so the bar still spans the whole step; so is the part of the host overhead the OS
    ran other work (a busy machine), in grey after the job's own.
    """
    segs = []
    for key, label, colour in PARTS[:2]:
        f = b.fraction(key)
        segs.append(svg.Segment(f * length, colour, f"{label}: {pct(f)}"
                                + (f", {ms(getattr(b, key))}" if unit_tip else "")))
    comm_work = b.fraction("comm_work")  # DDP's copies on the training thread: communication's
    if comm_work * length > 1e-9:
        segs.append(svg.Segment(comm_work * length, COMM_WORK[1], f"{COMM_WORK[0]}: {pct(comm_work)}"
                                + (f", {ms(b.comm_work)}" if unit_tip else "")))
    unsplit = b.fraction("compute") - b.fraction("compute_bound") - b.fraction("memory_bound") - comm_work
    if unsplit * length > 1e-9:
        segs.append(svg.Segment(unsplit * length, UNSPLIT[1], f"{UNSPLIT[0]} (part of compute "
                                f"{pct(b.fraction('compute'))})"))
    stalled = b.fraction("host_stalled")
    for key, label, colour in PARTS[2:]:
        f = b.fraction(key)
        if key == "host_overhead" and stalled > 0:
            f, label = f - stalled, "host overhead, the job's own"
        segs.append(svg.Segment(f * length, colour, f"{label}: {pct(f)}"
                                + (f", {ms(f * b.step_time)}" if unit_tip else "")))
    if stalled * length > 1e-9:
        segs.append(svg.Segment(stalled * length, STALLED[1], f"{STALLED[0]}: {pct(stalled)}"
                                + (f", {ms(b.host_stalled)}" if unit_tip else "")))
    return segs


def legend_parts(*shown: TimeBreakdown | None) -> list[tuple[str, str]]:
    """The chart's legend; the OS's part only where one of the ``shown`` breakdowns has it."""
    stalled = [STALLED] if any(b is not None and b.host_stalled > 0 for b in shown) else []
    stalled += [COMM_WORK] if any(b is not None and b.comm_work > 0 for b in shown) else []
    return [(label, colour) for _, label, colour in PARTS[:2]] + [UNSPLIT] + \
        [(label, colour) for _, label, colour in PARTS[2:]] + stalled


def verdict_ctx(d: Diagnosis) -> dict[str, Any]:
    v = d.verdict
    return {"label": v.label.value, "confidence": f"{v.confidence:.2f}", "level": v.confidence_level,
            "tie_with": v.tie_with.value if v.tie_with else None,
            "summary": si_text(v.summary), "secondary": v.secondary.value if v.secondary else None,
            "recommendations": [{"text": si_text(r.text), "action": r.action,
                                 "prediction": si_text(views.prediction_line(r))}
                                for r in v.recommendations],
            "not_advised": [{"action": r.action, "why": si_text(views.not_helping_line(r))}
                            for r in v.not_advised],
            "deductions": views.confidence_lines(v),
            "evidence": [(k, evidence_value(k, x)) for k, x in v.evidence.items()]}


def views_ctx(d: Diagnosis) -> dict[str, Any]:
    """The basis of the verdict, the dilation, its caveats and the side-by-side table."""
    both = views.has_both_views(d)
    dil = d.dilation
    rows = [{"label": r.label.strip(), "traced": ms(r.traced_us), "traced_share": pct(r.traced_share),
             "unprofiled": ms(r.unprofiled_us), "unprofiled_share": pct(r.unprofiled_share),
             "sub": r.label.startswith("  ")} for r in views.view_rows(d)] if both else []
    chart = ""
    if both and d.unprofiled is not None:
        bars = [svg.Bar("as traced", part_segments(d.breakdown, d.breakdown.step_time / 1e3, True),
                        note=ms(d.breakdown.step_time), tip="mean traced step, under the profiler"),
                svg.Bar("unprofiled (est.)", part_segments(d.unprofiled, d.unprofiled.step_time / 1e3, True),
                        note=ms(d.unprofiled.step_time),
                        tip="estimated mean step of the job as it runs unobserved")]
        chart = svg.stacked_bars("Mean step as traced and unprofiled (estimated)", bars,
                                 legend_parts(d.breakdown, d.unprofiled),
                                 "mean step time (ms)", label_w=130,
                                 desc="The same step twice: as the profiler recorded it, and with the "
                                      "profiler's extra wall time removed from the idle gaps.")
    return {"both": both, "basis": d.basis, "basis_line": views.basis_line(d),
            "dilation": views.dilation_line(dil) if dil is not None else None,
            "model": dil.model if dil is not None else None,
            # caveats that cost confidence are listed with their cost under the verdict
            "caveats": [si_text(c) for c in dil.caveats
                        if c not in {x.reason for x in d.verdict.deductions}] if dil is not None else [],
            "traced_verdict": views.traced_verdict_line(d), "rows": rows, "chart": Markup(chart),
            # the training thread's wait for a core, where the step timer recorded it
            "host_wait": d.host_wait.note if d.host_wait is not None and d.host_wait.recorded else None}
