"""Host syncs: counted per step with their call sites, and what removing them would save.

Two sources, each for what it sees best:

- the **census** (``collectors.torch_syncs``, one step of the job without the profiler's
  recording): every sync call with its kind (``.item()``, ``.cpu()``, ``bool(t)``, nonzero, ...),
  its call site in the job's code and the time inside it, and the operators whose results fed
  only syncs (``h.abs().max()`` in ``h.abs().max().item()``), with theirs;
- the **trace** (every traced step): the sync events themselves, the scalar reads
  (``aten::_local_scalar_dense``, under ``.item()``, ``bool(t)``, ``float(t)``), the operators
  with data-dependent shapes (``aten::nonzero``, ``aten::masked_select``, ``aten::unique``) and,
  on a GPU, the runtime calls that wait for the device (``cudaStreamSynchronize``, ...), and on
  a GPU the device's idle time at each of them.

What removing them saves depends on the device, and the report says which it assumed:

- on a GPU a sync drains the queue; the device idles from when its queue ran dry until the
  host, back from the sync, has launched the next kernel, and the host waits inside the sync for
  the queue to drain. Without the syncs the host queues work ahead: a job the device limits gets
  the device's idle time at the syncs back (their share of the traced host gaps, applied to the
  verdict's host gaps, as the profiler dilates the traced ones), one the host limits only the
  host's wait inside them; the prediction is the smaller of the two.
- on a CPU nothing is queued: a sync costs only its host work. Removing the lines saves the
  calls and the operators computed only to feed them, as timed by the census at the job's own
  pace; without a census, the sync operators' traced time scaled to the verdict's step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from gpudiag.analyzers import intervals as iv
from gpudiag.analyzers.breakdown import step_windows
from gpudiag.analyzers.trace_columns import RankTrace
from gpudiag.analyzers.whatif import busy_share_step
from gpudiag.census import OPTIM_MARK, CensusSite, SyncCensus
from gpudiag.diagnosis import SyncReport, SyncSite, TimeBreakdown, TopItem
from gpudiag.units import ms

# Below this share of the step, a fix is within a step timer's run-to-run noise (a few percent
# on a shared machine: ``Verdict.noise`` is typically 1-4%): the syncs are reported, but not
# recommended as a fix.
SYNC_NOTABLE = 0.03
SITES_SHOWN = 10

SCALAR_READS = "scalar reads"
DATA_SHAPES = "data-dependent shapes"
DEVICE_WAITS = "device waits"
_OP_KINDS = [(re.compile(r"^aten::(_local_scalar_dense|equal)$"), SCALAR_READS),
             (re.compile(r"^aten::(nonzero|masked_select|_unique2?|unique_dim|unique_consecutive|"
                         r"unique_dim_consecutive)$"), DATA_SHAPES)]


@dataclass
class TraceSyncs:
    """One rank's sync events over its traced steps (per step means; picklable, small)."""

    steps: int = 0
    counts: dict[str, float] = field(default_factory=dict)  # per step, by kind
    host_us: float = 0.0  # per step: time inside the (outermost) sync events
    device_idle_us: float | None = None  # GPU: per step, the device idle at the syncs

    @property
    def per_step(self) -> float:
        return sum(self.counts.values())


def trace_syncs(rt: RankTrace) -> TraceSyncs:
    """Count the sync events of each traced step (outermost only: ``.item()``'s scalar read
    inside ``bool(t)``, a GPU's ``cudaStreamSynchronize`` inside the read, count once)."""
    lo, hi, _ = step_windows(rt)
    if lo.size == 0:
        return TraceSyncs()
    kind_of = np.full(len(rt.names), -1, dtype=np.int8)
    kinds = [SCALAR_READS, DATA_SHAPES, DEVICE_WAITS]
    for i, name in enumerate(rt.names):
        for rx, k in _OP_KINDS:
            if rx.match(name):
                kind_of[i] = kinds.index(k)
    op_kind = kind_of[rt.cpu_name] if rt.cpu_name.size else np.empty(0, dtype=np.int8)
    sel = np.flatnonzero((op_kind >= 0) & rt.cpu_is_op)
    ts = np.concatenate((rt.cpu_ts[sel], rt.sync_ts))
    dur = np.concatenate((rt.cpu_dur[sel], rt.sync_dur))
    tid = np.concatenate((rt.cpu_tid[sel], rt.sync_tid))
    kind = np.concatenate((op_kind[sel], np.full(rt.sync_ts.size, 2, dtype=np.int8)))
    outer = _outermost(ts, dur, tid)
    ts, dur, kind = ts[outer], dur[outer], kind[outer]
    inside = iv.contains((lo, hi), ts)
    ts, dur, kind = ts[inside], dur[inside], kind[inside]
    n = lo.size
    counts = {k: float((kind == i).sum()) / n for i, k in enumerate(kinds) if (kind == i).any()}
    idle = _device_idle_at(rt, ts + dur, lo, hi) / n if rt.has_gpu else None
    return TraceSyncs(steps=n, counts=counts, host_us=float(dur.sum()) / n, device_idle_us=idle)


def _outermost(ts: np.ndarray, dur: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Mask of the events not inside another of these events on the same thread."""
    keep = np.zeros(ts.size, dtype=bool)
    order = np.lexsort((-dur, ts, tid))
    last_tid, end = None, -np.inf
    for k in order.tolist():
        if tid[k] != last_tid:
            last_tid, end = tid[k], -np.inf
        if ts[k] >= end:
            keep[k] = True
            end = ts[k] + dur[k]
    return keep


def _device_idle_at(rt: RankTrace, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    """Device idle time (all streams) in the gaps that hold a sync's end, within the steps:
    from when the device's queue ran dry to its next activity. A gap holding several syncs
    counts once; a sync that returned while the device was busy (another stream) adds none."""
    busy = iv.merge(rt.gpu_ts, rt.gpu_ts + rt.gpu_dur)
    s, e = busy
    if s.size == 0 or ends.size == 0:
        return 0.0
    i = np.searchsorted(e, ends, side="right") - 1  # the busy interval that ended last before
    ok = (i >= 0) & (i + 1 < s.size)
    ok[ok] &= ends[ok] < s[i[ok] + 1]
    gaps = np.unique(i[ok])
    if gaps.size == 0:
        return 0.0
    gap = (e[gaps], s[gaps + 1])
    return float(iv.measure_in(gap, lo, hi).sum())


def mean_trace_syncs(parts: list[TraceSyncs]) -> TraceSyncs | None:
    """The ranks' mean (ranks run the same code); None when no rank had traced steps."""
    parts = [p for p in parts if p.steps > 0]
    if not parts:
        return None
    kinds = list(dict.fromkeys(k for p in parts for k in p.counts))  # in the ranks' order, not a set's
    idle = [p.device_idle_us for p in parts if p.device_idle_us is not None]
    return TraceSyncs(steps=min(p.steps for p in parts),
                      counts={k: float(np.mean([p.counts.get(k, 0.0) for p in parts])) for k in kinds},
                      host_us=float(np.mean([p.host_us for p in parts])),
                      device_idle_us=float(np.mean(idle)) if idle else None)


def sync_report(census: SyncCensus | None, trace: TraceSyncs | None, device_kind: str,
                view: TimeBreakdown, traced: TimeBreakdown) -> SyncReport | None:
    """The job's host syncs and their predicted cost in the verdict's view (``view``);
    ``traced``: the traced steps' mean breakdown. None when there is nothing to report from."""
    usable = census if census is not None and census.skipped is None else None
    if usable is None and (trace is None or trace.per_step <= 0):
        return None
    notes = []
    if census is not None and census.skipped:
        notes.append(f"no census of call sites: {census.skipped}")
    if census is not None and census.note:
        notes.append(census.note)
    if usable is not None and usable.dropped_sites:
        notes.append(f"{usable.dropped_sites} sync calls at further call sites were counted out "
                     "(the census keeps 200 sites)")
    trace_n = trace.per_step if trace is not None else None
    feeding_top: list[TopItem] = []
    if usable is not None:
        usable, optim = _without_optims(usable)
        if optim:
            notes.append(f"{optim} sync calls a step are torch.optim's own (its step reads each "
                         "parameter's step counter back with .item() on a CPU): not the job's to "
                         "remove, and not counted here (compile-optimizer-step takes them with the loop)")
    if usable is not None:
        # a GPU's sync waits for the device (wall time); a CPU's is host work, its CPU time (a
        # busy machine's preemption inside a call is not the call's cost)
        wall = device_kind == "gpu"
        by_kind: dict[str, float] = {}
        for s in usable.sites:
            by_kind[s.kind] = by_kind.get(s.kind, 0.0) + s.calls
        per_step = float(sum(by_kind.values()))

        def t(s: CensusSite) -> float:
            return s.seconds if wall else s.cpu_seconds

        k = 1.0 if wall else census_pace(usable, view)
        host = sum(t(s) for s in usable.sites) * 1e6 * k
        feeding_ops = float(usable.feeding_ops)
        feeding = (usable.feeding_s if wall else usable.feeding_cpu_s) * 1e6 * k
        after = 0.0 if wall else usable.after_cpu_s * 1e6 * k
        feeding_top = [TopItem(op, calls, (w if wall else c) * 1e6 * k,
                               (w if wall else c) * 1e6 * k / feeding if feeding > 0 else 0.0)
                       for op, calls, w, c in usable.feeding_top]
        sites = [SyncSite(f"{s.file}:{s.line}", s.function, s.kind, float(s.calls), t(s) * 1e6 * k)
                 for s in sorted(usable.sites, key=lambda s: (-t(s), -s.calls))[:SITES_SHOWN]]
        timed = "wall time" if wall else "the thread's CPU time"
        source = (f"census of step {usable.step} (every torch call of the training thread, without "
                  f"the profiler's recording; times: {timed})" +
                  (f"; the trace counts {trace_n:.3g} sync events per traced step"
                   if trace_n is not None else ""))
    else:
        assert trace is not None  # no census: the trace is what there is to report from
        by_kind = dict(trace.counts)
        per_step, host, feeding_ops, feeding, sites = trace.per_step, trace.host_us, 0.0, 0.0, []
        after = 0.0
        source = f"the trace's sync events over {trace.steps} traced steps (no census: no call sites)"
    step = view.step_time
    idle = None
    if device_kind == "gpu":
        idle, saving, assumption = _gpu_saving(trace, view, traced)
    else:
        saving, assumption = _cpu_saving(usable, host, feeding, trace, view, traced, after)
    return SyncReport(per_step=per_step, by_kind=by_kind, sites=sites, source=source,
                      trace_per_step=trace_n, host_us=host, feeding_ops=feeding_ops,
                      feeding_us=feeding, device_idle_us=idle, saving_us=max(0.0, min(saving, step)),
                      step_us=step, assumption=assumption,
                      census_step=usable.step if usable is not None else None, notes=notes,
                      feeding_top=feeding_top, own_step_us=step - view.host_stalled, after_us=after,
                      in_module_per_step=_in_module(usable))


def _in_module(c: SyncCensus | None) -> float | None:
    """Sync calls per step the census saw inside an nn.Module call; None where it did not read
    where they were (no census, or one from before it did)."""
    if c is None or not c.sites or any(s.in_module is None for s in c.sites):
        return None
    return float(sum(s.calls for s in c.sites if s.in_module))


def _without_optims(c: SyncCensus) -> tuple[SyncCensus, int]:
    """The census less the sites torch.optim's step made (``OPTIM_MARK``), and their calls."""
    own = [s for s in c.sites if not s.function.endswith(OPTIM_MARK)]
    return replace(c, sites=own), sum(s.calls for s in c.sites) - sum(s.calls for s in own)


def _gpu_saving(trace: TraceSyncs | None, view: TimeBreakdown, traced: TimeBreakdown
                ) -> tuple[float | None, float, str]:
    """The smaller of two bounds. The device idles at each sync from when its queue runs dry
    until the host, back, has launched the next kernel: a device-bound job (the host ahead of
    it elsewhere) gets that idle time back. The host waits inside each sync for the queue to
    drain: a host-bound job (the device ahead) gets only that wait back, its own work between
    syncs stays. Which bound binds is the one that is smaller."""
    own_gaps = max(0.0, view.host_overhead - view.host_waiting)
    if trace is None or trace.device_idle_us is None or traced.host_overhead <= 0:
        return None, 0.0, "no traced device timeline to read the idle time at the syncs from"
    share = min(1.0, trace.device_idle_us / traced.host_overhead)
    idle = share * own_gaps
    saving = min(idle, trace.host_us)
    which = ("the device's idle time at them" if idle <= trace.host_us
             else "the host's wait inside them")
    return idle, saving, (
        f"a GPU idles at each sync from when its queue runs dry until the host has launched the "
        f"next kernel ({ms(trace.device_idle_us)} per traced step, {100 * share:.0f}% of the traced "
        f"host gaps: {ms(idle)} of the step's own host gaps, {ms(own_gaps)}), and the host waits "
        f"inside the syncs ({ms(trace.host_us)} per traced step); without them the host queues work "
        f"ahead, and the step gains the smaller of the two, here {which}: a job the device limits "
        "gets the device's idle time back, one its host limits only the host's wait")


def census_pace(c: SyncCensus, view: TimeBreakdown) -> float:
    """What brings the census's timings to the verdict's step: the view's step over the census
    step's wall time, where the census step ran slower (at most 1). The census's mode runs in
    Python on every torch call of its step, so a step of hundreds of tiny calls runs several
    times slower under it, the calls that feed the syncs with it. Blind check 40: a loop of 401
    calls a step (the census step 10.8 ms against 4.0 ms) was told removing 3 reads saved 1.38 ms
    of a 4.1 ms step (0.67x); without them it ran 0.91-0.95x."""
    if not c.wall_s or view.step_time <= 0 or c.wall_s * 1e6 <= view.step_time:
        return 1.0
    return view.step_time / (c.wall_s * 1e6)


def _cpu_saving(census: SyncCensus | None, host: float, feeding: float, trace: TraceSyncs | None,
                view: TimeBreakdown, traced: TimeBreakdown, after: float = 0.0) -> tuple[float, str]:
    """On a CPU, with a census: the calls, the operators that fed only them, and the Python right
    after each up to the next torch call (``after``: what the loop does with the values it
    read, which goes with the lines that read them), at the view's pace (``census_pace``)."""
    if census is not None:
        k = census_pace(census, view)
        paced = (f"; timed under the census, which ran its step {1 / k:.2g}x slower than the "
                 f"verdict's ({ms(census.wall_s * 1e6 if census.wall_s else 0.0)} against "
                 f"{ms(view.step_time)}), and brought to that step's pace by the same ratio"
                 if k < 1 else "")
        return host + feeding + after, (
            f"on a CPU a sync waits for nothing: removing the lines saves the calls' host work "
            f"({ms(host)} per step), that of the {census.feeding_ops} operators per step "
            f"computed only to feed them ({ms(feeding)}) and the Python right after them up to the "
            f"next torch call ({ms(after)}: what the loop does with the values, formatting or "
            f"writing them), as timed in step {census.step} at the job's own pace{paced}; the rest "
            "of the step keeps its time")
    scale = view.step_time / traced.step_time if traced.step_time > 0 else 1.0
    return host * min(1.0, scale), (
        f"on a CPU a sync waits for nothing: removing them saves the sync operators' own time "
        f"({ms(host)} per traced step, scaled by {min(1.0, scale):.2g} to the verdict's step); "
        "no census timed the operators computed only to feed them, so the saving may be larger")


def evidence(r: SyncReport) -> dict[str, float]:
    """The verdict's evidence numbers for the syncs."""
    return {"syncs_per_step": r.per_step, "sync_share": r.share}


def advice_text(r: SyncReport) -> str:
    where = ", ".join(f"{s.site} {s.kind} x{s.per_step:.3g}" for s in r.sites[:3])
    kinds = ", ".join(f"{k} x{v:.3g}" for k, v in sorted(r.by_kind.items(), key=lambda kv: -kv[1])[:4])
    return (f"The loop reads tensor values back to Python (host syncs) {r.per_step:.3g} times per "
            f"step ({kinds}), {100 * r.share:.1f}% of the step at its own pace"
            + (f"; busiest: {where}" if where else "") +
            ": keep values on the device (accumulate losses and metrics as tensors, read them "
            "every N steps), drop checks of device values from the loop, and avoid "
            "data-dependent shapes (torch.where instead of boolean-mask indexing).")


def predicted_step_us(r: SyncReport) -> tuple[float, str]:
    """The step without the syncs' lines. On a CPU the saving is the job's own time (CPU time),
    and the machine's other work keeps its share of the shorter step: on cores the job shares,
    each ms of its own work brings the other processes' part with it (``whatif.busy_share_step``; a
    CI clone beside other work: a 49 ms wall step of 13 ms own pace read 0.75x predicted from the
    wall step less the saving, where the job without its logging ran 0.18x)."""
    own = r.own_step_us
    if r.device_idle_us is not None or not own or own >= r.step_us or own <= r.saving_us:
        return r.step_us - r.saving_us, r.assumption
    step = busy_share_step(r.step_us, own, r.saving_us)
    return step, r.assumption + (f"; the machine's other work keeps its share of the step ("
                                 f"{ms(r.step_us - own)} of {ms(r.step_us)} now); where it keeps "
                                 f"its time instead, {ms(r.step_us - r.saving_us)}: the step lies "
                                 "between")
