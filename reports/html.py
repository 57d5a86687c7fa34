"""A Diagnosis (or a before/after DiagnosisDiff) as one self-contained HTML file.

Why this shape: a report gets mailed, attached to tickets and opened offline long after the
run, so it is a single file with inline CSS and inline SVG, no JavaScript and nothing fetched
over the network. The full Diagnosis rides along as a JSON data block so the file is also
machine-readable. Reports render numbers, they never compute them: everything here is
formatting (units, rounding), scaling to pixels and layout; the numbers come from the
Diagnosis as the analyzers left it.

Safety: every string from a trace or a command line is escaped, by Jinja's autoescape in the
templates and by ``svg._esc`` in the charts; the JSON block is serialised so that no value can
close its script element (``embed_json``).
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpudiag.reports import svg
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from gpudiag.diagnosis import Diagnosis, DiagnosisDiff, ItemDelta, RunSummary, TimeBreakdown, TopItem

TEMPLATES = Path(__file__).parent / "templates"
TOP_ROWS = 25  # rows of kernel/operator/roofline tables; the JSON block holds what the diagnosis kept
TOP_BARS = 10  # bars in the "where device time went" chart
MAX_STEP_ROWS = 48  # rows of the per-step chart (8 ranks x 6 steps)
NAME_LABEL_W = 360  # px for kernel/operator names left of the bars

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
BOUND_COLOURS = {"compute": svg.BLUE, "memory": svg.ORANGE}
SLOWER, FASTER = svg.VERMILLION, svg.BLUE


# --- formatting --------------------------------------------------------------------------

def num(x: float | None) -> str:
    """A readable number: three significant digits, no exponent for everyday magnitudes."""
    if x is None or x != x:
        return "n/a"
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.001:
        return f"{x:.3g}"
    return f"{x:.2e}"


def ms(us: float | None) -> str:
    return "n/a" if us is None or us != us else f"{num(us / 1e3)} ms"


def gbps(v: float | None) -> str:
    """A bandwidth given in GB/s, with the prefix its size calls for (``svg.si``)."""
    return "n/a" if v is None or v != v else svg.si(v * 1e9, "B/s")


def signed_ms(us: float | None) -> str:
    """'+1.2 ms', '-0.5 ms', '0 ms': a change."""
    if us is None or us != us:
        return "n/a"
    return ("+" if us > 0 else "") + ms(us)


_PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_RATE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?) ?([kMGTP]?)(FLOP/s|B/s)(?![\w/])")


def si_text(text: str) -> str:
    """Rates in analyzer prose ('0.06718 TFLOP/s', '1550 GB/s') re-written with the prefix the
    report uses everywhere (``svg.si``: '67.2 GFLOP/s', '1.55 TB/s'). Only the formatting
    changes; the value is the same."""
    return _RATE.sub(lambda m: svg.si(float(m.group(1)) * _PREFIX[m.group(2)], m.group(3)), text)


def pct(frac: float | None, signed: bool = False) -> str:
    if frac is None or frac != frac:
        return "n/a"
    return f"{100 * frac:+.1f}%" if signed else f"{100 * frac:.1f}%"


def when(ts: float | None) -> str:
    if not ts:
        return "n/a"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def evidence_value(key: str, v: float) -> str:
    """Evidence values are shares (0..1) unless their key names a unit."""
    if key.endswith("share") or key == "mfu":
        return pct(v)
    return num(v)


def run_status(r: RunSummary) -> str:
    """'killed by SIGKILL at step 12', 'failed with exit code 3 at step 7', ..."""
    at = f" at step {r.last_step}" if r.last_step else ""
    if r.signal:
        return f"{r.status} by {r.signal}{at}"
    if r.status == "completed":
        return f"completed (exit code {r.exit_code})" + (f", last step {r.last_step}" if r.last_step else "")
    if r.status == "failed" and r.exit_code is not None:
        return f"failed with exit code {r.exit_code}{at}"
    return f"{r.status}{at}"


# --- kernel and operator names for display ----------------------------------------------

_AUTOGRAD = "autograd::engine::evaluate_function: "
_ANON = "(anonymous namespace)::"
_GENERIC = {"Kernel", "Kernel2", "device_kernel", "kernel"}  # wrappers named by their template


def _strip_groups(text: str, keep_templates: bool) -> str | None:
    """``text`` without its top-level argument lists ``(...)`` and, unless ``keep_templates``,
    template arguments ``<...>``; None when the brackets do not pair up (not a C++ name). A
    parenthesis after a space is prose, not an argument list: 'Memset (Device)' keeps it."""
    out: list[str] = []
    stack: list[str] = []  # "<", "(", or "p" for a kept (prose) parenthesis
    opening = {">": "<", ")": "("}
    prev = ""
    for ch in text:
        shown = all(g == "p" for g in stack) or (keep_templates and stack[0] == "<")
        if ch == "(" and prev.isspace() and shown:
            stack.append("p")
            keep = True
        elif ch in "<(":
            stack.append(ch)
            keep = keep_templates and stack[0] == "<"
        elif ch in ">)":
            if not stack or (stack[-1] != opening[ch] and not (ch == ")" and stack[-1] == "p")):
                return None
            keep = stack[-1] == "p" and shown or (keep_templates and stack[0] == "<")
            stack.pop()
        else:
            keep = shown
        if keep:
            out.append(ch)
        prev = ch
    return None if stack else "".join(out)


def _template_args(text: str) -> list[str] | None:
    """The top-level arguments of the template argument list that ``text`` starts with."""
    if not text.startswith("<"):
        return None
    args: list[str] = []
    depth, cur = 0, ""
    for ch in text:
        if ch in "<(":
            depth += 1
            if depth == 1:
                continue
        elif ch in ">)":
            depth -= 1
            if depth == 0:
                args.append(cur.strip())
                return args
        elif ch == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return None


def _plain(name: str) -> tuple[str, str]:
    """(name without 'void ', anonymous namespaces and the autograd prefix, suffix to add)."""
    suffix = ""
    if name.startswith(_AUTOGRAD):
        name, suffix = name[len(_AUTOGRAD):], " (autograd)"
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    return name.replace(_ANON, ""), suffix


def short_name(name: str) -> str:
    """A kernel or operator name as a person reads it: 'void ns::fn<T, 4>(float*, int)' ->
    'ns::fn', 'autograd::engine::evaluate_function: AddmmBackward0' -> 'AddmmBackward0
    (autograd)'. Anything that is not a well-formed C++ name comes back unchanged. For
    display only: tables and tooltips keep the full name."""
    plain, suffix = _plain(name)
    stripped = _strip_groups(plain, keep_templates=False)
    if stripped is None or not stripped.strip():
        return name
    return " ".join(stripped.split()) + suffix


def _arg_name(arg: str, deep: bool = False) -> str:
    """A template argument cut to what names it: 'at::native::CUDAFunctor_add<float>' ->
    'CUDAFunctor_add', 'at::native::mse_kernel_cuda(at::TensorIteratorBase&)::{lambda()#1}'
    -> 'mse_kernel_cuda'; with ``deep`` its own first template argument is named too
    ('gpu_kernel_impl_nocast<direct_copy_kernel_cuda>'). Numbers and plain types stay."""
    arg = " ".join(arg.split())
    m = re.search(r"[<({]", arg)
    head = (arg[: m.start()] if m else arg).rstrip(": ").split("::")[-1] or arg
    if deep and m and m.group() == "<":
        inner = _template_args(arg[m.start():])
        if inner:
            return head + "<" + _arg_name(inner[0]) + (", \u2026" if len(inner) > 1 else "") + ">"
    return head


def _with_templates(name: str, positions: set[int] | None, deep: bool = False) -> str | None:
    """``short_name`` plus the template arguments at ``positions`` (all when None), '…' for
    the others: what tells apart kernels that share a function name."""
    plain, suffix = _plain(name)
    fn = _strip_groups(plain, keep_templates=False)
    kept = _strip_groups(plain, keep_templates=True)
    if not fn or kept is None or "<" not in kept:
        return None
    args = _template_args(kept[kept.index("<"):])
    if not args:
        return None
    shown, skipped = [], False
    for i, a in enumerate(args):
        if positions is None or i in positions:
            shown.append(_arg_name(a, deep))
            skipped = False
        elif not skipped:
            shown.append("\u2026")
            skipped = True
    return " ".join(fn.split()) + "<" + ", ".join(shown) + ">" + suffix


def display_names(names: list[str], px: float | None = None) -> list[str]:
    """``short_name`` of each, made distinct again where two different names shorten to the
    same text (the template arguments in which they differ are added), then fitted to ``px``
    wide when given (``_fit_name``), cut so that different names still read differently."""
    out = [short_name(n) for n in names]
    for i, n in enumerate(names):  # wrappers such as cutlass::Kernel<the_real_kernel>
        if out[i].split("::")[-1] in _GENERIC:
            out[i] = _with_templates(n, None) or out[i]
    for idx in _clashes(names, out):
        argsets = []
        for i in idx:
            kept = _strip_groups(_plain(names[i])[0], keep_templates=True)
            argsets.append(_template_args(kept[kept.index("<"):]) if kept and "<" in kept else None)
        positions: set[int] | None = None
        if all(a is not None for a in argsets) and len({len(a or []) for a in argsets}) == 1:
            positions = {k for k in range(len(argsets[0] or []))
                         if len({(a or [])[k] for a in argsets}) > 1} or None
        for deep in (False, True):
            trial = {i: _with_templates(names[i], positions, deep) or out[i] for i in idx}
            if len(set(trial.values())) == len({names[i] for i in idx}):
                break
        else:  # overloads, or names that differ only deep inside: the full name
            trial = {i: "".join(_plain(names[i])) for i in idx}
        for i, t in trial.items():
            out[i] = t
    if px is None:
        return out
    fitted = [_fit_name(d, px) for d in out]
    for idx in _clashes(names, fitted):  # cut elsewhere until they differ
        for head in (0.25, 0.1, 0.0, 0.6, 0.8):
            trial = {i: _fit_name(out[i], px, head) for i in idx}
            if len(set(trial.values())) == len(idx):
                for i, t in trial.items():
                    fitted[i] = t
                break
    return fitted


def _clashes(names: list[str], shown: list[str]) -> list[list[int]]:
    """Groups of indices whose different names are shown as the same text."""
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(shown):
        groups.setdefault(d, []).append(i)
    return [idx for idx in groups.values() if len({names[i] for i in idx}) > 1]


def _fit_name(d: str, px: float, head: float = 0.42) -> str:
    """``d`` cut to ``px`` wide: first without its namespaces, then in the middle, keeping a
    trailing '<…>' (the part that tells kernels apart) whole when it takes under half."""
    if svg.text_width(d) <= px:
        return d
    cut = d.find("<") if d.endswith(">") else -1
    fn, tail = (d[:cut], d[cut:]) if cut > 0 else (d, "")
    if fn.endswith(" (autograd)"):
        fn, tail = fn[: -len(" (autograd)")], " (autograd)" + tail
    bare = fn.split("::")[-1]
    if svg.text_width(bare + tail) <= px:
        return bare + tail
    if tail and svg.text_width(tail) < 0.6 * px:
        return svg.fit(bare, px - svg.text_width(tail), head=head) + tail
    return svg.fit(bare + tail, px, head=head)


# --- the JSON data block -----------------------------------------------------------------

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
def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=num, ms=ms, pct=pct, when=when)
    return env


# --- report sections -----------------------------------------------------------------------

def _header(d: Diagnosis) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    r = d.run
    if r is not None:
        rows.append(("Command", shlex.join(r.command) if r.command else "n/a"))
        rows.append(("Host", r.host or "n/a"))
        rows.append(("Status", run_status(r)))
        rows.append(("Time", f"{when(r.start)} to {when(r.end)}" if r.end else f"from {when(r.start)}"))
        if r.gpus:
            kinds = Counter((g.get("name", "?"), g.get("driver", "?")) for g in r.gpus)
            rows.append(("GPUs", "; ".join(f"{n} \u00d7 {name} (driver {drv})"
                                           for (name, drv), n in kinds.items())))
        else:
            rows.append(("GPUs", "none recorded"))
        rows.append(("GPU counters", r.gpu_counters or "n/a"))
    dev = d.device
    trace_dev = f"; trace says {dev.trace_device_name}" if dev.trace_device_name else ""
    rows.append(("Device", f"{dev.name} ({dev.kind}; peaks from {dev.source}{trace_dev})"))
    world = f" of {d.world_size}" if d.world_size and d.world_size != len(d.ranks) else ""
    rows.append(("Ranks", f"{len(d.ranks)}{world}"))
    versions = dict(r.versions) if r is not None else {}
    recorded = versions.pop("gpudiag", None)
    parts = [f"gpudiag {d.gpudiag_version} (analysis)"]
    if recorded and recorded != d.gpudiag_version:
        parts.append(f"gpudiag {recorded} (profile)")
    if r is not None and "torch" not in versions:
        parts.append("torch not recorded")
    parts += [f"{k} {v}" for k, v in sorted(versions.items())]
    rows.append(("Versions", ", ".join(parts)))
    return rows


def _part_segments(b: TimeBreakdown, length: float, unit_tip: bool) -> list[svg.Segment]:
    """Segments of one step-time bar; ``length`` is the bar's full length in axis units.

    Each part is drawn at its share of the step (``TimeBreakdown.fraction``) times the
    length: pure scaling. Compute time that the roofline did not split is drawn as its own
    segment so the bar still spans the whole step.
    """
    segs = []
    for key, label, colour in PARTS[:2]:
        f = b.fraction(key)
        segs.append(svg.Segment(f * length, colour, f"{label}: {pct(f)}"
                                + (f", {ms(getattr(b, key))}" if unit_tip else "")))
    unsplit = b.fraction("compute") - b.fraction("compute_bound") - b.fraction("memory_bound")
    if unsplit * length > 1e-9:
        segs.append(svg.Segment(unsplit * length, UNSPLIT[1], f"{UNSPLIT[0]} (part of compute "
                                f"{pct(b.fraction('compute'))})"))
    for key, label, colour in PARTS[2:]:
        f = b.fraction(key)
        segs.append(svg.Segment(f * length, colour, f"{label}: {pct(f)}"
                                + (f", {ms(getattr(b, key))}" if unit_tip else "")))
    return segs


def _legend_parts() -> list[tuple[str, str]]:
    return [(label, colour) for _, label, colour in PARTS[:2]] + [UNSPLIT] + \
        [(label, colour) for _, label, colour in PARTS[2:]]


def _breakdown(d: Diagnosis) -> dict[str, Any]:
    slow = set(d.stragglers.ranks) if d.stragglers else set()
    bars = []
    if d.breakdown.step_time > 0:
        bars.append(svg.Bar("mean, all ranks", _part_segments(d.breakdown, d.breakdown.step_time / 1e3, True),
                            note=ms(d.breakdown.step_time), tip="mean step over all ranks"))
    for r in d.ranks:
        if r.total.step_time <= 0:
            continue
        straggler = r.rank in slow
        bars.append(svg.Bar(f"rank {r.rank}" + (" (straggler)" if straggler else ""),
                            _part_segments(r.total, r.mean_step_time / 1e3, False),
                            note=ms(r.mean_step_time), marked=straggler,
                            tip=f"rank {r.rank}: mean step {ms(r.mean_step_time)} over {len(r.steps)} "
                                f"step(s){'; straggler' if straggler else ''}"))
    charts = []
    legend = _legend_parts()
    if bars:
        charts.append(svg.stacked_bars("Step time per rank (mean per step)", bars, legend,
                                       "mean step time (ms)",
                                       desc="Each bar is one rank's mean step, split into the parts "
                                            "of the time breakdown; stragglers are marked."))
    step_bars = []
    total_steps = sum(len(r.steps) for r in d.ranks)
    for r in d.ranks:
        for s in r.steps:
            if len(step_bars) >= MAX_STEP_ROWS or s.breakdown.step_time <= 0:
                continue
            name = f"rank {r.rank} step {s.step}" if s.step is not None else f"rank {r.rank} (whole trace)"
            step_bars.append(svg.Bar(name, _part_segments(s.breakdown, s.breakdown.step_time / 1e3, True),
                                     note=ms(s.breakdown.step_time), marked=r.rank in slow))
    if step_bars:
        charts.append(svg.stacked_bars("Step time per traced step", step_bars, legend, "step time (ms)"))
    b = d.breakdown
    mean_rows = [(label, ms(getattr(b, key)), pct(b.fraction(key))) for key, label, _ in PARTS]
    mean_rows[2:2] = [("compute (total)", ms(b.compute), pct(b.fraction("compute")))]
    mean_rows += [("device busy", ms(b.gpu_busy), pct(b.fraction("gpu_busy"))),
                  ("communication (total, incl. overlapped)", ms(b.comm_total),
                   pct(b.fraction("comm_total"))),
                  ("step time", ms(b.step_time), pct(1.0 if b.step_time > 0 else None))]
    rank_rows = []
    for r in d.ranks:
        rank_rows.append({
            "rank": r.rank, "trace": r.trace, "steps": len(r.steps),
            "mean": ms(r.mean_step_time),
            "parts": [pct(r.total.fraction(key)) for key, _, _ in PARTS],
            "busy": pct(r.total.fraction("gpu_busy")), "straggler": r.rank in slow,
            "hint": r.dataloader_workers_hint,
        })
    strag = None
    if d.stragglers is not None:
        s = d.stragglers
        strag = (f"median step {ms(s.median_step_us)}, imbalance {pct(s.imbalance)} "
                 f"((max - min) / median of per-rank mean step time); stragglers: "
                 + (", ".join(f"rank {x}" for x in s.ranks) or "none"))
    note = ""
    if total_steps > len(step_bars) and step_bars:
        note = f"The per-step chart shows the first {len(step_bars)} of {total_steps} steps."
    return {"charts": [Markup(c) for c in charts], "mean_rows": mean_rows, "rank_rows": rank_rows,
            "part_labels": SHORT_LABELS, "stragglers": strag, "note": note,
            "device": "GPU" if d.device.kind == "gpu" else "CPU"}


def _no_timeline_reason(d: Diagnosis) -> str:
    if d.run is None:
        return ("This report was made from profiler traces alone, not from a gpudiag profile run "
                "directory, so there are no counters over the whole run. Run the job under "
                "gpudiag profile to get SM activity, tensor activity, DRAM bandwidth, power and "
                "step times over time.")
    if d.timeline is None or not d.timeline.series:
        return ("The run directory holds no GPU samples and no per-step records "
                f"(GPU counters: {d.run.gpu_counters or 'n/a'}).")
    return ""


def _timeline(d: Diagnosis) -> dict[str, Any]:
    reason = _no_timeline_reason(d)
    if reason:
        return {"charts": [], "reason": reason, "facts": []}
    tl = d.timeline
    assert tl is not None
    groups: dict[tuple[str, str], list] = {}
    for s in tl.series:
        groups.setdefault((s.name, s.unit), []).append(s)
    spans = [(a, b) for a, b in tl.traced]
    charts = []
    for (name, unit), series in groups.items():
        lines = []
        for i, s in enumerate(series):
            colour, dash = svg.line_style(i)
            who = f"GPU {s.gpu}" if s.gpu is not None else f"rank {s.rank}" if s.rank is not None else name
            lines.append(svg.Line(who, s.t, s.v, colour, dash))
        charts.append(Markup(svg.line_chart(
            f"{name} ({unit})", lines, "seconds since the run started", unit, spans=spans,
            span_label="traced steps", x_max=tl.duration or None, y_max=100.0 if unit == "%" else None,
            desc=f"{name} per {'GPU' if series[0].gpu is not None else 'rank'} over the whole run; "
                 "the shaded span is the traced window.")))
    facts = [f"t = 0 at {when(tl.start)}, {num(tl.duration)} s of run",
             f"{len(tl.series)} series, downsampled for drawing"]
    if d.run is not None and d.run.gpu_counters.startswith("not sampled"):
        facts.append(f"GPU counters {d.run.gpu_counters}")
    return {"charts": charts, "reason": "", "facts": facts}


def _roofline(d: Diagnosis) -> dict[str, Any]:
    r = d.roofline
    charts = []
    unit = "FLOP/s" if d.device.kind == "gpu" else "FLOP/s (CPU)"
    facts = [("method", r.method), ("dtype family", r.dtype_family or "n/a"),
             ("compute ceiling", svg.si(r.peak_flops, "FLOP/s") if r.peak_flops else "unknown"),
             ("bandwidth ceiling", svg.si(r.peak_bandwidth, "B/s") if r.peak_bandwidth else "unknown"),
             ("ridge point", f"{num(r.ridge_intensity)} FLOP/byte" if r.ridge_intensity else "n/a")]
    empty = ""
    if not r.points:
        # an empty 440 px chart says less than a sentence: no chart without points
        why = {"kernel-names": "each kernel was classed compute- or memory-bound by its name, without "
                               "the operator shapes a point needs (profile with record_shapes=True)",
               "none": "neither operator shapes nor known kernel classes were found"}
        empty = (f"No roofline points (method {r.method!r}): "
                 + why.get(r.method, "no operator had both FLOPs and bytes") + ".")
    else:
        pts = [svg.Point(p.intensity, p.achieved_flops, p.time_us, BOUND_COLOURS.get(p.bound, svg.GREY),
                         f"{p.op} {p.shape} {p.dtype}: {p.calls} calls, {ms(p.time_us)}, "
                         f"{num(p.intensity)} FLOP/byte, {svg.si(p.achieved_flops, 'FLOP/s')} achieved "
                         f"of {svg.si(p.attainable_flops, 'FLOP/s')} attainable ({p.bound}-bound)")
               for p in r.points]
        ceil = svg.Ceilings(
            peak=r.peak_flops or None, bandwidth=r.peak_bandwidth or None, ridge=r.ridge_intensity or None,
            peak_label=f"compute ceiling {svg.si(r.peak_flops, 'FLOP/s')} {r.dtype_family}",
            bandwidth_label=f"bandwidth ceiling {svg.si(r.peak_bandwidth, 'B/s')}",
            ridge_label=f"ridge {num(r.ridge_intensity)} FLOP/byte")
        charts.append(svg.loglog_scatter(
            "Roofline", pts, ceil, "arithmetic intensity (FLOP/byte)", f"achieved {unit}",
            [("compute-bound", svg.BLUE), ("memory-bound", svg.ORANGE), ("circle area: time", "#ffffff")],
            desc="Each circle is an operator and shape; circle area grows with its time."))
    split = [svg.Segment(r.compute_bound_time / 1e3, svg.BLUE, f"compute-bound: {ms(r.compute_bound_time)}"),
             svg.Segment(r.memory_bound_time / 1e3, svg.ORANGE, f"memory-bound: {ms(r.memory_bound_time)}"),
             svg.Segment(r.unattributed_time / 1e3, svg.GREY, f"unattributed: {ms(r.unattributed_time)}")]
    if any(s.value > 0 for s in split):
        charts.append(svg.stacked_bars(
            "Device compute time by roofline class (all ranks, all traced steps)",
            [svg.Bar("compute time", split)],
            [("compute-bound", svg.BLUE), ("memory-bound", svg.ORANGE), ("unattributed", svg.GREY)],
            "ms", label_w=110))
    top = sorted(r.points, key=lambda p: -p.time_us)[:TOP_ROWS]
    rows = [{"op": p.op, "short": short, "shape": p.shape, "dtype": p.dtype, "calls": p.calls,
             "time": ms(p.time_us), "flops": svg.si(p.flops, "FLOP"), "bytes": svg.si(p.bytes, "B"),
             "intensity": num(p.intensity), "achieved": svg.si(p.achieved_flops, "FLOP/s"),
             "attainable": svg.si(p.attainable_flops, "FLOP/s"), "bound": p.bound}
            for p, short in zip(top, display_names([p.op for p in top]), strict=True)]
    return {"charts": [Markup(c) for c in charts], "facts": facts, "rows": rows,
            "n_points": len(r.points), "empty": empty}


def _item_rows(items: list[TopItem]) -> list[dict[str, Any]]:
    top = items[:TOP_ROWS]
    return [{"name": t.name, "short": short, "calls": t.calls, "time": ms(t.time_us), "share": pct(t.share)}
            for t, short in zip(top, display_names([t.name for t in top]), strict=True)]


def _tables(d: Diagnosis) -> dict[str, Any]:
    top_chart = comm_chart = ""
    top = d.top_kernels or d.top_ops
    what = "kernels" if d.top_kernels else "operators"
    if top:
        shown = top[:TOP_BARS]
        labels = display_names([t.name for t in shown], NAME_LABEL_W - 12)
        bars = [svg.HBar(label, 100 * t.share, svg.BLUE, pct(t.share),
                         tip=f"{t.name}: {ms(t.time_us)} in {t.calls} calls")
                for t, label in zip(shown, labels, strict=True)]
        top_chart = svg.bar_chart(f"Top {what} by device time", bars, "% of device busy time",
                                  label_w=NAME_LABEL_W)
    comm = [c for c in d.communication if c.busbw_gbps is not None]
    if comm:
        bars = []
        for c in comm:
            bw = c.busbw_gbps or 0.0
            of_peak = f" ({pct(bw / c.link_peak_gbps)} of peak)" if c.link_peak_gbps else ""
            bars.append(svg.HBar(c.collective, bw, svg.GREEN, gbps(bw) + of_peak,
                                 tip=f"{c.collective}: bus bandwidth {gbps(bw)}{of_peak}",
                                 ref=c.link_peak_gbps,
                                 ref_tip=f"link peak {gbps(c.link_peak_gbps)}" if c.link_peak_gbps else ""))
        peaks = {c.link_peak_gbps for c in comm}
        ref_label = f"link peak {gbps(peaks.pop())}" if len(peaks) == 1 and None not in peaks else ""
        comm_chart = svg.bar_chart("Collective bus bandwidth against the link peak", bars, "GB/s",
                                   label_w=160, ref_label=ref_label,
                                   legend=[("bus bandwidth", svg.GREEN),
                                           ("link peak (black tick)", svg.BLACK)])
    coll_rows = [{"name": c.collective, "count": c.count, "time": ms(c.total_time_us),
                  "exposed": ms(c.exposed_time_us),
                  "bytes": svg.si(c.bytes, "B") if c.bytes is not None else "n/a",
                  "algbw": gbps(c.algbw_gbps), "busbw": gbps(c.busbw_gbps),
                  "peak": gbps(c.link_peak_gbps)} for c in d.communication]
    m = d.mfu
    reason = si_text(m.reason.removeprefix("not available: ") if m.value is None else m.reason)
    mfu = {"value": pct(m.value) if m.value is not None else "not available", "reason": reason,
           "rows": [("FLOPs per step per rank",
                     svg.si(m.flops_per_step, "FLOP") if m.flops_per_step else "n/a"),
                    ("FLOPs from", m.flops_source), ("dtype family", m.dtype_family or "n/a"),
                    ("peak", svg.si(m.peak_flops, "FLOP/s") if m.peak_flops else "n/a"),
                    ("step time", ms(m.step_time_us))]}
    return {"top_chart": Markup(top_chart), "top_chart_kernels": bool(d.top_kernels),
            "comm_chart": Markup(comm_chart), "kernels": _item_rows(d.top_kernels),
            "n_kernels": len(d.top_kernels), "ops": _item_rows(d.top_ops), "n_ops": len(d.top_ops),
            "collectives": coll_rows, "mfu": mfu}


def _missing(d: Diagnosis) -> list[str]:
    return [si_text(m) for m in _missing_raw(d)]


def _missing_raw(d: Diagnosis) -> list[str]:
    items = list(d.warnings)
    if d.run is not None and d.run.gpu_counters.startswith("not sampled"):
        items.append(f"GPU counters {d.run.gpu_counters}")
    reason = _no_timeline_reason(d)
    if reason:
        items.append("No counter timeline: " + reason)
    r = d.roofline
    if r.method == "kernel-names":
        items.append("Roofline from kernel names: no operator shapes could be used, so each kernel was "
                     "judged compute- or memory-bound by its name and there are no roofline points "
                     "(profile with record_shapes=True).")
    elif r.method == "none":
        items.append("No roofline: neither operator shapes nor known kernel classes were found.")
    if r.unattributed_time > 0:
        items.append(f"{ms(r.unattributed_time)} of compute time had neither recorded shapes nor a "
                     "known kernel class: it is in neither roofline class.")
    if d.mfu.value is None:
        items.append(f"MFU {d.mfu.reason}")
    if d.run is not None:
        items += [f"Run note: {n}" for n in d.run.notes]
    return items


def _verdict(d: Diagnosis) -> dict[str, Any]:
    v = d.verdict
    return {"label": v.label.value, "confidence": f"{v.confidence:.2f}", "level": v.confidence_level,
            "summary": si_text(v.summary), "secondary": v.secondary.value if v.secondary else None,
            "recommendations": [si_text(r) for r in v.recommendations],
            "evidence": [(k, evidence_value(k, x)) for k, x in v.evidence.items()]}


def render_report(d: Diagnosis) -> str:
    """The whole report for one Diagnosis as an HTML string."""
    ctx = {
        "title": f"gpudiag: {d.verdict.label.value} \u2014 {d.device.name}",
        "header": _header(d), "sources": d.sources, "verdict": _verdict(d),
        "breakdown": _breakdown(d), "timeline": _timeline(d), "roofline": _roofline(d),
        "tables": _tables(d), "missing": _missing(d), "data": embed_json(d.to_dict()),
        "generated_by": f"gpudiag {d.gpudiag_version}",
    }
    return _env().get_template("report.html.j2").render(ctx)


# --- the diff page -----------------------------------------------------------------------

def _delta_rows(items: list[ItemDelta], slower: bool) -> list[dict[str, Any]]:
    shorts = display_names([x.name for x in items])  # over both tables: one name, one label
    return [{"name": x.name, "short": short, "before": ms(x.before_us), "after": ms(x.after_us),
             "delta": signed_ms(x.delta_us),
             "ratio": (f"{x.ratio:.2f}\u00d7" if x.ratio is not None
                       else "new" if x.before_us == 0 else "gone")}
            for x, short in zip(items, shorts, strict=True) if (x.delta_us > 0) == slower and x.delta_us != 0]


def _delta_chart(title: str, items: list[ItemDelta]) -> Markup | None:
    if not items:
        return None
    labels = display_names([x.name for x in items], NAME_LABEL_W - 12)
    bars = [svg.HBar(label, x.delta_us / 1e3, SLOWER if x.delta_us > 0 else FASTER, signed_ms(x.delta_us),
                     tip=f"{x.name}: {ms(x.before_us)} before, {ms(x.after_us)} after per step")
            for x, label in zip(items, labels, strict=True)]
    return Markup(svg.bar_chart(title, bars, "change in mean time per step (ms)", label_w=NAME_LABEL_W,
                                legend=[("slower", SLOWER), ("faster", FASTER)]))


def render_diff(diff: DiagnosisDiff, before: Diagnosis, after: Diagnosis) -> str:
    """Before/after page for ``gpudiag diff``; ``before``/``after`` supply context (verdicts)."""
    bars = []
    for name, b in (("before", diff.before), ("after", diff.after)):
        if b.step_time > 0:
            bars.append(svg.Bar(name, _part_segments(b, b.step_time / 1e3, True), note=ms(b.step_time)))
    charts = []
    if bars:
        charts.append(Markup(svg.stacked_bars("Mean step time, before and after", bars, _legend_parts(),
                                              "mean step time (ms)")))
    rows = []
    # after - before per part; older DiagnosisDiffs (and their JSON) do not carry it
    delta: TimeBreakdown | None = getattr(diff, "breakdown_delta", None)
    for key, label in [(k, lab) for k, lab, _ in PARTS[:2]] + [("compute", "compute (total)")] + \
            [(k, lab) for k, lab, _ in PARTS[2:]] + [("step_time", "step time")]:
        change = getattr(delta, key, None) if delta is not None else None
        rows.append({"label": label, "before": ms(getattr(diff.before, key)),
                     "before_share": pct(diff.before.fraction(key)), "after": ms(getattr(diff.after, key)),
                     "after_share": pct(diff.after.fraction(key)), "change": signed_ms(change),
                     "dir": "" if not change else "delta-up" if change > 0 else "delta-down"})
    label_changed = diff.label_before != diff.label_after
    ctx = {
        "title": f"gpudiag diff: {diff.label_before.value} \u2192 {diff.label_after.value}",
        "diff": diff, "label_changed": label_changed,
        "step_change": pct(diff.step_time_change, signed=True),
        "direction": ("n/a" if diff.step_time_change is None else "faster" if diff.step_time_change < 0
                      else "slower" if diff.step_time_change > 0 else "unchanged"),
        "mfu_before": pct(diff.mfu_before) if diff.mfu_before is not None else "not available",
        "mfu_after": pct(diff.mfu_after) if diff.mfu_after is not None else "not available",
        "sides": [{"name": "before", "d": before, "sources": diff.before_sources,
                   "device": diff.device_before, "verdict": _verdict(before),
                   "step": ms(diff.before.step_time)},
                  {"name": "after", "d": after, "sources": diff.after_sources,
                   "device": diff.device_after, "verdict": _verdict(after),
                   "step": ms(diff.after.step_time)}],
        "charts": charts, "rows": rows, "has_delta": delta is not None,
        "kernel_chart": _delta_chart("Kernels: change in mean time per step", diff.kernels),
        "op_chart": _delta_chart("Operators: change in mean time per step", diff.ops),
        "kernels": {"slower": _delta_rows(diff.kernels, True), "faster": _delta_rows(diff.kernels, False)},
        "ops": {"slower": _delta_rows(diff.ops, True), "faster": _delta_rows(diff.ops, False)},
        "notes": diff.notes,
        "data": embed_json({"before": before.to_dict(), "after": after.to_dict(), "diff": diff.to_dict()}),
        "generated_by": f"gpudiag {after.gpudiag_version}",
    }
    return _env().get_template("diff.html.j2").render(ctx)
