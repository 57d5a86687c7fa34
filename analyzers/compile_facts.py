"""What ``torch.compile`` would change in a CPU job's step, counted from its trace.

On a CPU the operators are the host's work: there is no device running behind the host, so
compile removes no "launch gaps" - it removes calls. An eager step calls one operator at a time
from Python (each call: Python, the dispatcher, the autograd graph, an allocation); the
compiled step calls one kernel per run of fused operators, and still calls the GEMMs and
convolutions (extern kernels, with their own work). Each compiled graph costs a call of its
own (guards, runtime wrappers), and a graph ends where Python needs a value (``.item()``).
What compile does not touch keeps its time: the optimizer step and ``zero_grad`` (unless
compiled too), autograd's per-parameter ``AccumulateGrad``, DataLoader waits, collectives and
DDP's bucket copies, the syncs themselves.

So this module counts, per traced step: the top-level operator calls compile would replace
(``calls``), the calls the compiled graph would make instead (``kernels``: GEMM/convolution
calls, plus one per run of other calls between them), the graphs (one per stretch of the
region between syncs, twice in training: forward and backward), and the time of what stays.
A Python loop over samples (``step_loops``: a per-sample loss) is not in the region: compiling
the model does not reach it, so its calls are counted apart and keep their time; nor are the
calls after the backward (a hand-written optimizer, a logged loss). An optimizer that updates
one tensor at a time, by hand or torch.optim's default on a CPU, is ``optimizer_loop``: compiling
its step is a fix of its own.
``whatif.compiled_cpu`` turns them into a prediction. Measured on this project's 2-core AMD EPYC
(torch 2.13, tiny tensors): a compiled kernel call cost 0.4-0.9x an eager operator call of the
same model (``docs/diagnosis.md``), so the call count, not the kernels' work, decides.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from gpudiag.analyzers import intervals as iv
from gpudiag.analyzers.breakdown import CpuWork, cpu_comm_ops, step_windows
from gpudiag.analyzers.step_loops import LoopFacts, loop_mask
from gpudiag.analyzers.trace_loader import RankTrace

# What compile leaves as it is: the optimizer (``Optimizer.step#SGD.step``, its zero_grad),
# autograd's per-parameter accumulation, DDP's reducer (bucket copies), collectives' launches.
_KEPT_RE = re.compile(r"^Optimizer\.(step|zero_grad)#|^autograd::engine::evaluate_function: "
                      r"torch::autograd::AccumulateGrad|reducer::|^c10d::")
# The optimizer's own time: what gradient accumulation runs once per K micro-batches
_OPT_RE = re.compile(r"^Optimizer\.(step|zero_grad)#")
_OPT_STEP_RE = re.compile(r"^Optimizer\.step#")
_ACCUM_RE = re.compile(r"^autograd::engine::evaluate_function: torch::autograd::AccumulateGrad")
# nn.GRU, nn.LSTM and nn.RNN: Dynamo does not trace them (torch 2.13 says "Dynamo does not
# support RNN, GRU, or LSTM" and runs them eagerly, their backward too)
RNN_RE = re.compile(r"^aten::(gru|lstm|rnn_tanh|rnn_relu)$")
# A value read back into Python ends a compiled graph (a graph break): the sync stays eager.
# ``.item()``, ``bool(t)``, ``.tolist()`` all read through this one operator
SYNC_RE = re.compile(r"^aten::_local_scalar_dense$")
# Calls that stay calls in compiled code (inductor calls them as extern kernels): GEMMs and
# convolutions, forward and backward, counted once each (not their wrappers: linear, matmul).
_EXTERN_RE = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|addbmm|convolution|convolution_backward)$")


@dataclass(frozen=True)
class CompileFacts:
    """Per traced step (the mean over the rank's steps), as traced."""

    calls: float = 0.0  # top-level operator calls compile would replace
    kernels: float = 0.0  # calls the compiled graph would make: extern GEMMs/convs + fused runs
    graphs: float = 0.0  # compiled graphs per step (1 + syncs, forward and backward in training)
    extern_us: float = 0.0  # time of the extern calls' own operators (their work stays)
    # time of what compile leaves as it is (optimizer, AccumulateGrad, DDP's reducer), outside
    # DataLoader waits and collectives (the breakdown's own parts, kept too)
    kept_us: float = 0.0
    kept_calls: float = 0.0  # top-level calls in it
    syncs: float = 0.0  # values read back into Python inside the forward (graph breaks)
    step_us: float = 0.0  # the traced step these are of
    opt_us: float = 0.0  # the optimizer's step and zero_grad (part of ``kept_us``)
    accum_us: float = 0.0  # autograd's AccumulateGrad (part of ``kept_us``): once per backward pass
    # loops over samples (not in ``calls``: compile of the model does not replace them) and
    # backward passes per step (``step_loops``)
    loops: LoopFacts = LoopFacts()
    params: float = 0.0  # parameter tensors (AccumulateGrad nodes per backward pass)
    hand_optimizer: bool = False  # the calls after the backward are a hand-written optimizer
    # a torch.optim optimizer's step: its top-level operator calls and its time (part of
    # ``opt_us``); one tensor at a time (foreach and fused off, as on a CPU by default) makes
    # several calls a tensor
    opt_calls: float = 0.0
    opt_step_us: float = 0.0
    # the operators' work in a per-tensor optimizer loop (``operator_work``): the hand-written
    # loop's calls after the backward, and torch.optim's step's calls
    after_work_us: float = 0.0
    opt_work_us: float = 0.0
    # the events the profiler recorded in that loop (nested ones too), each of which cost it the
    # profiler's fixed time per event (``unprofiled._cpu_per_event``): the hand-written loop's,
    # and torch.optim's step's
    after_events: float = 0.0
    opt_events: float = 0.0
    rnn_calls: float = 0.0  # nn.GRU/LSTM/RNN calls in the region: torch.compile runs them eagerly
    # the work of the calls compile would replace and of the loops' calls (``call_work``), the
    # GEMMs' and convolutions' aside: compiled, the calls go and this stays
    work_us: float = 0.0
    # of that work, what fused runs would not do if each run cost its longest member (inductor
    # reading a run's data once): the most fusion could save (``fused_runs_saving``)
    fusable_us: float = 0.0
    # the top-level operator calls' time per step as each call of an operator typically takes
    # (its median call, times its calls: a call the OS preempted does not count as long), and
    # the part of it in operators whose median call is LONG_CALL_US or more (``long_share``)
    typical_us: float = 0.0
    long_us: float = 0.0

    @staticmethod
    def mean(ranks: list[CompileFacts]) -> CompileFacts:
        n = max(len(ranks), 1)
        return CompileFacts(**{f.name: sum(getattr(r, f.name) for r in ranks) / n
                               for f in fields(CompileFacts) if f.name not in ("loops", "hand_optimizer")},
                            loops=LoopFacts.mean([r.loops for r in ranks]),
                            hand_optimizer=any(r.hand_optimizer for r in ranks))


# An operator whose median call takes this long (us) is long: beside busy loops a thread's wait
# for a core (a scheduler slice, 1-3 ms) at its end is a small part of it (``advice_threads``)
LONG_CALL_US = 2000.0


def long_share(f: CompileFacts) -> float | None:
    """The share of the top-level operators' typical time per step that is in long operators
    (median call LONG_CALL_US or more); None where no call was counted. By the median call, not
    the mean: a 1D conv net's five 86 ms convolutions a step sat beside ~400 calls of its
    optimizer's per-tensor updates, 2 ms a call on average, and beside busy loops a short call
    preempted mid-way lasts a scheduler slice."""
    return f.long_us / f.typical_us if f.typical_us > 0 else None


def _typical(rt: RankTrace, mark: np.ndarray) -> tuple[float, float]:
    """(each operator's median call times its calls, summed; the same over the operators whose
    median call is LONG_CALL_US or more) of the events in ``mark``, us."""
    names, dur = rt.cpu_name[mark], rt.cpu_dur[mark]
    if names.size == 0:
        return 0.0, 0.0
    o = np.lexsort((dur, names))
    names, dur = names[o], dur[o]
    start = np.flatnonzero(np.r_[True, names[1:] != names[:-1]])
    count = np.diff(np.r_[start, names.size])
    median = (dur[start + (count - 1) // 2] + dur[start + count // 2]) / 2
    typical = median * count
    return float(typical.sum()), float(typical[median >= LONG_CALL_US].sum())


def compile_facts(rt: RankTrace, cw: CpuWork | None, training: bool) -> CompileFacts:
    """The counts of one CPU rank (empty for a GPU rank: there compile closes launch gaps,
    ``whatif.compiled``)."""
    lo, hi, _ = step_windows(rt)
    if cw is None or lo.size == 0:
        return CompileFacts()
    n = lo.size
    inside = iv.contains((lo, hi), rt.cpu_ts)
    kept_mark = _named(rt, _KEPT_RE)
    comm = cpu_comm_ops(rt)
    # the kept work's time (DataLoader waits and collectives are the breakdown's own parts)
    kept_work = iv.subtract(iv.merge(rt.cpu_ts[kept_mark], (rt.cpu_ts + rt.cpu_dur)[kept_mark]), cw.waits)
    opt_mark = _named(rt, _OPT_RE)
    opt_work = iv.subtract(iv.merge(rt.cpu_ts[opt_mark], (rt.cpu_ts + rt.cpu_dur)[opt_mark]), cw.waits)
    acc_mark = _named(rt, _ACCUM_RE) & rt.cpu_is_op
    acc_work = iv.subtract(iv.merge(rt.cpu_ts[acc_mark], (rt.cpu_ts + rt.cpu_dur)[acc_mark]), cw.waits)
    in_kept = iv.contains(iv.union(iv.union(kept_work, cw.waits),
                                   iv.merge(rt.cpu_ts[comm], (rt.cpu_ts + rt.cpu_dur)[comm])), rt.cpu_ts)
    top = inside & rt.cpu_is_op & (rt.cpu_depth == 0)
    region = top & ~in_kept
    sync = _named(rt, SYNC_RE) & inside
    extern = _named(rt, _EXTERN_RE) & inside & rt.cpu_is_op & ~in_kept
    # a top-level call that holds an extern call or a sync stays a call: a barrier between runs
    idx = np.flatnonzero(region)
    idx = idx[np.lexsort((rt.cpu_ts[idx], rt.cpu_tid[idx]))]
    # a loop over samples stays as it is: torch.compile(model) does not reach it; nor the calls
    # after the backward (a hand-written optimizer's loop over the parameters, a metric)
    loops, in_loop, after, after_spans = loop_mask(rt, idx, lo)
    outside = in_loop | after
    ends = rt.cpu_ts + rt.cpu_dur
    looped = iv.contains(iv.merge(rt.cpu_ts[idx[outside]], ends[idx[outside]]), rt.cpu_ts)
    extern &= ~looped
    holds_extern = _holds(rt, idx, extern)
    holds_sync = _holds(rt, idx, sync) & ~holds_extern
    barrier = holds_extern | holds_sync | outside
    runs = _runs(barrier, rt.cpu_tid[idx])
    work = np.zeros(idx.size)
    counted = ~after & ~holds_extern
    work[counted] = call_work(rt, idx[counted])
    syncs = _forward_syncs(rt, region, sync, lo, hi) / n
    # the calls after the backward keep their time, the Python between them included
    tail = iv.subtract(after_spans, cw.waits)
    params = float((acc_mark & inside).sum()) / n / max(loops.passes, 1.0)
    hand = hand_optimizer(loops, params)
    step_mark = _named(rt, _OPT_STEP_RE)
    step_span = iv.merge(rt.cpu_ts[step_mark], ends[step_mark])
    in_step = top & iv.contains(step_span, rt.cpu_ts)
    typical_us, long_us = _typical(rt, top)
    return CompileFacts(typical_us=typical_us / n, long_us=long_us / n,
        calls=float(region.sum() - outside.sum()) / n,
        kernels=(float(extern.sum()) + float((holds_sync & ~outside).sum()) + runs) / n,
        # a forward and a backward graph per pass: micro-batches call the compiled model each
        graphs=(1.0 + syncs) * (2.0 if training else 1.0) * max(loops.passes, 1.0),
        extern_us=float(cw.dur[extern].sum()) / n,
        kept_us=float(iv.measure_in(iv.union(kept_work, tail), lo, hi).sum()) / n,
        kept_calls=float((top & in_kept).sum() + after.sum()) / n, syncs=syncs,
        step_us=float((hi - lo).sum()) / n,
        opt_us=float(iv.measure_in(iv.union(opt_work, tail) if hand else opt_work, lo, hi).sum()) / n,
        accum_us=float(iv.measure_in(acc_work, lo, hi).sum()) / n, loops=loops,
        params=params, hand_optimizer=hand,
        opt_calls=float(in_step.sum()) / n, rnn_calls=float((region & _named(rt, RNN_RE)).sum()) / n,
        after_work_us=operator_work(rt, idx[after], lo) / n,
        work_us=float(work.sum()) / n, fusable_us=fused_runs_saving(work, barrier, rt.cpu_tid[idx]) / n,
        opt_work_us=operator_work(rt, np.flatnonzero(in_step), lo) / n,
        opt_step_us=float(iv.measure_in(iv.subtract(step_span, cw.waits), lo, hi).sum()) / n,
        after_events=float((inside & iv.contains(after_spans, rt.cpu_ts)).sum()) / n,
        opt_events=float((inside & iv.contains(step_span, rt.cpu_ts)).sum()) / n)


# A hand-written optimizer (a Python loop over the parameters, no ``torch.optim``): after the
# backward, at least HAND_CALLS_PER_PARAM calls per parameter tensor (SGD with momentum is 2-3
# in-place operators a tensor, Adam 8), at least HAND_INPLACE_SHARE of them in-place updates
# (held-out zoo, py_optimizer: Adam over 194 tensors, 1,552 calls after the backward, 7 of each
# 8 in place; compile of the model measured 0.82-0.85x where crediting it with the loop
# predicted 0.28x). A ``torch.optim`` optimizer is told by its own marker and is kept anyway.
HAND_CALLS_PER_PARAM = 2.0
HAND_INPLACE_SHARE = 0.25


def hand_optimizer(loops: LoopFacts, params: float) -> bool:
    """Whether the calls after the backward are a hand-written optimizer's loop over the
    ``params`` parameter tensors (AccumulateGrad nodes per backward pass)."""
    return (params >= 1 and loops.after_calls >= HAND_CALLS_PER_PARAM * params
            and loops.after_inplace >= HAND_INPLACE_SHARE * loops.after_calls)


@dataclass(frozen=True)
class OptimizerLoop:
    """An optimizer that updates one parameter tensor at a time: its operator calls and time
    per traced step (with the Python between the calls), over ``params`` tensors."""

    calls: float
    us: float
    params: float
    by_hand: bool  # a loop of the job's own after the backward, not a torch.optim step
    work_us: float = 0.0  # the operators' work in ``us`` (``operator_work``): it stays compiled
    events: float = 0.0  # events the profiler recorded in ``us`` (nested ones too)


def optimizer_loop(f: CompileFacts) -> OptimizerLoop | None:
    """The job's optimizer where it updates the parameters one tensor at a time: a hand-written
    loop (``hand_optimizer``), or a torch.optim step making at least HAND_CALLS_PER_PARAM calls
    a tensor (foreach and fused off, the default for CPU tensors: the blind set's RMSprop, 1,337
    calls over 162 tensors, 42% of its step; compiling its step measured 0.71x). A foreach,
    fused or compiled step makes a few calls for all tensors: None."""
    if f.params < 1:
        return None
    if f.hand_optimizer:
        return OptimizerLoop(f.loops.after_calls, f.loops.after_us, f.params, by_hand=True,
                             work_us=f.after_work_us, events=f.after_events)
    if f.opt_calls >= HAND_CALLS_PER_PARAM * f.params and f.opt_step_us > 0:
        return OptimizerLoop(f.opt_calls, f.opt_step_us, f.params, by_hand=False, work_us=f.opt_work_us,
                             events=f.opt_events)
    return None


def operator_work(rt: RankTrace, calls: np.ndarray, lo: np.ndarray) -> float:
    """The work in ``calls`` (event indices, in the steps starting at ``lo``): each call's time
    beyond the fastest call of the same operator among them (that one: its dispatch on the
    smallest tensor, all overhead). Compiled, the calls go and their work stays, fused into one
    loop a tensor that on a CPU is no faster (``whatif.compiled_update``, ``COMPILED_WORK``).
    Blind set 7's AdamW over 512x512 weights: 4.5 of its step's 6.6 ms (traced) was work;
    counted as calls, compiling the step was predicted 0.65x, measured 0.99x.

    A call's time is the median over the traced steps of its place in the loop (the k-th call of
    an operator in a step: a per-tensor loop updates the same tensors in the same order each
    step), so a call the OS preempted, or that faulted a page in, in one step is not work:
    blind check 42's Adam over 162 tensors of 64x64 at most counted 1.73 ms of work a step, most
    of it a few calls of 20-80 us against medians of 2-7 us, where the tensors' arithmetic is
    about 0.5 ms, and its compiled step was predicted 0.77x against 0.67-0.68x measured."""
    if calls.size == 0:
        return 0.0
    name, dur, ts = rt.cpu_name[calls], rt.cpu_dur[calls], rt.cpu_ts[calls]
    step = np.searchsorted(lo, ts, side="right")
    order = np.lexsort((ts, name, step))
    name, dur, step = name[order], dur[order], step[order]
    # the k-th call of each operator in each step
    first = np.r_[True, (name[1:] != name[:-1]) | (step[1:] != step[:-1])]
    start = np.maximum.accumulate(np.where(first, np.arange(name.size), 0))
    kth = np.arange(name.size) - start
    key = name.astype(np.int64) * (int(kth.max()) + 1) + kth
    keys, inv, count = np.unique(key, return_inverse=True, return_counts=True)
    by = np.argsort(inv, kind="stable")
    bounds = np.r_[0, np.cumsum(count)]
    med = np.array([np.median(dur[by[a:b]]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    op = keys // (int(kth.max()) + 1)
    fastest = np.full(int(op.max()) + 1, np.inf)
    np.minimum.at(fastest, op, med)
    return float(((med - fastest[op]) * count).sum())


# What one eager operator call costs with no work in it, at most: OVERHEAD_CAP_X times the
# region's cheap calls (their OVERHEAD_QUANTILE: views, selects, a ReLU on a few rows) for each
# operator call it makes (itself and those nested in it: a backward node's, a LayerNorm's
# native_layer_norm), the dispatch, autograd's node and an allocation each. A call longer than
# its operator's median call, or than that cap, did work for the rest (a LayerNorm over 256 kB:
# 300 us a call, every call). On this project's 2-core AMD EPYC (torch 2.13): a select 1.7-2.0
# us, a ReLU on 96x256 4.1-5.8 us, a MulBackward0 node of 8x64 rows about 10 us.
OVERHEAD_QUANTILE = 0.05
OVERHEAD_CAP_X = 3.0


def call_work(rt: RankTrace, calls: np.ndarray) -> np.ndarray:
    """The work in each of ``calls`` (event indices; none of them holds a GEMM or a
    convolution): its time beyond what a call of its operator costs with no work in it (its
    median call among them: the fastest is a lucky one, and a tiny operator's calls spread 1.4-7
    us around a 2.4 us mean; at most the cap above). On a CPU ``torch.compile`` removes calls and
    keeps their work (``whatif.compiled_cpu``): blind set 10's transformer block and CNN, whose
    calls were mostly work, were promised 0.89x and 0.98x for their calls and ran 1.02x and
    1.10x compiled."""
    if calls.size == 0:
        return np.zeros(0)
    name, dur = rt.cpu_name[calls], rt.cpu_dur[calls]
    cap = OVERHEAD_CAP_X * float(np.quantile(dur, OVERHEAD_QUANTILE)) * (1 + _nested(rt, calls))
    order = np.lexsort((dur, name))
    first = np.flatnonzero(np.r_[True, name[order][1:] != name[order][:-1]])
    count = np.diff(np.r_[first, order.size])
    typical = np.zeros(int(name.max()) + 1)
    typical[name[order][first]] = dur[order][first + count // 2]
    out: np.ndarray = np.maximum(0.0, dur - np.minimum(typical[name], cap))
    return out


def _nested(rt: RankTrace, calls: np.ndarray) -> np.ndarray:
    """Per call: the operator calls that start inside it on its thread."""
    out = np.zeros(calls.size)
    ops = np.flatnonzero(rt.cpu_is_op)
    for tid in np.unique(rt.cpu_tid[calls]).tolist():
        mine = rt.cpu_tid[calls] == tid
        ts = np.sort(rt.cpu_ts[ops[rt.cpu_tid[ops] == tid]])
        s = rt.cpu_ts[calls[mine]]
        e = s + rt.cpu_dur[calls[mine]]
        out[mine] = np.searchsorted(ts, e, side="left") - np.searchsorted(ts, s, side="right")
    return out


_BACKWARD_RE = re.compile(r"^autograd::engine::")
_READ_BACK_RE = re.compile(r"^aten::(item|_local_scalar_dense|is_nonzero)$")


def _forward_syncs(rt: RankTrace, region: np.ndarray, sync: np.ndarray, lo: np.ndarray,
                   hi: np.ndarray) -> float:
    """Syncs that split the forward: after the region's first call in their step and before its
    backward's first node (without a backward, its last call). A value read after the forward
    (the loss logged after the step, a metric) ends no graph of the model."""
    if not sync.any() or not region.any():
        return 0.0
    bwd = region & _named(rt, _BACKWARD_RE)

    def per_step(mask: np.ndarray, values: np.ndarray, fill: float,
                 at: Callable[..., None]) -> np.ndarray:
        out = np.full(lo.size, fill)
        k = np.searchsorted(lo, rt.cpu_ts[mask], side="right") - 1
        ok = k >= 0
        at(out, k[ok], values[mask][ok])
        return out

    # the forward's first call: not a read-back itself (the last step's loss logged at the start
    # of this step's window, where the optimizer's hook ends the step)
    first = per_step(region & ~_named(rt, _READ_BACK_RE), rt.cpu_ts, np.inf, np.minimum.at)
    last = per_step(bwd, rt.cpu_ts, np.inf, np.minimum.at)  # the backward's first node
    none = ~np.isfinite(last)
    last[none] = per_step(region, rt.cpu_ts + rt.cpu_dur, -np.inf, np.maximum.at)[none]
    ts = rt.cpu_ts[sync]
    k = np.searchsorted(lo, ts, side="right") - 1
    ok = (k >= 0) & (ts < hi[np.clip(k, 0, None)])
    return float(((ts > first[k.clip(0)]) & (ts < last[k.clip(0)]) & ok).sum())


def _named(rt: RankTrace, rx: re.Pattern[str]) -> np.ndarray:
    """Per CPU event: whether its name matches ``rx``."""
    hit = np.array([bool(rx.search(s)) for s in rt.names] or [False], dtype=bool)
    return hit[rt.cpu_name] if rt.cpu_name.size else np.zeros(0, dtype=bool)


def _holds(rt: RankTrace, idx: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """For each call ``idx`` (sorted by thread, then time): whether an event of ``inner`` on its
    thread starts inside it (the call itself included)."""
    out = np.zeros(idx.size, dtype=bool)
    j = np.flatnonzero(inner)
    if j.size == 0 or idx.size == 0:
        return out
    for tid in np.unique(rt.cpu_tid[idx]).tolist():
        mine = rt.cpu_tid[idx] == tid
        ts = np.sort(rt.cpu_ts[j[rt.cpu_tid[j] == tid]])
        s = rt.cpu_ts[idx[mine]]
        e = s + rt.cpu_dur[idx[mine]]
        k = np.searchsorted(ts, s, side="left")
        out[mine] = (k < ts.size) & (ts[np.clip(k, 0, max(ts.size - 1, 0))] < e) if ts.size else False
    return out


def fused_runs_saving(work: np.ndarray, barrier: np.ndarray, tid: np.ndarray) -> float:
    """Per the calls' ``work`` (in thread, then time order), what fusing each maximal run of
    non-barrier calls into one pass would save if the run cost its longest member's work: the
    run's work less its largest. An upper end: a CPU's compiled kernels also do what ATen's
    did, and can be the slower (blind set 10's CNN ran 1.10x compiled; blind set 11's 0.87x)."""
    saved = 0.0
    total = top = 0.0
    prev_tid = None
    for w, b, t in zip(work.tolist(), barrier.tolist(), tid.tolist(), strict=True):
        if b or t != prev_tid:
            saved += total - top
            total = top = 0.0
            prev_tid = t
        if not b:
            total += w
            top = max(top, w)
    return saved + total - top


def _runs(barrier: np.ndarray, tid: np.ndarray) -> float:
    """Maximal runs of non-barrier calls, per thread, in time order."""
    runs = 0
    prev_tid = None
    in_run = False
    for b, t in zip(barrier.tolist(), tid.tolist(), strict=True):
        if t != prev_tid:
            in_run = False
            prev_tid = t
        if b:
            in_run = False
        elif not in_run:
            runs += 1
            in_run = True
    return float(runs)
