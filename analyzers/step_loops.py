"""Loops a CPU step's trace shows: a Python loop over samples, and micro-batches per optimizer step.

A Python loop repeats the same operator calls, in the same order, once per iteration: in the
trace, a stretch of the step's top-level calls periodic in their names. Two kinds matter to
what a fix is worth:

- **a loop over samples** (a per-sample loss or metric: ``for i in range(batch): s = out[i]``):
  its body indexes one row (``aten::select`` and the like) and holds no backward; its backward
  is a periodic stretch of the body's ``...Backward`` nodes. ``torch.compile(model)`` does not
  touch it (it runs outside the module, and a ``.tolist()``/``.item()`` in it breaks the graph);
  what removes its calls is writing it as one batch expression (held-out zoo, py_loss: compile
  was credited with the loop's 2,300 calls, predicted -30..-91%, measured 0.92-1.37x slower;
  the loss vectorised ran 0.09-0.11x);
- **micro-batches**: the step's backward passes (a stretch of autograd nodes after forward
  calls), N of them per optimizer step: gradient accumulation, each micro-batch paying the
  whole forward/backward's per-call cost for its few rows (held-out zoo, grad_accum: 32
  micro-batches of 4, the same samples in one micro-batch 0.10x).

- **the calls after the backward** (a hand-written optimizer's loop over the parameters, a
  logged loss): outside the model, so ``torch.compile(model)`` does not replace them either;
  how many update a tensor in place tells a hand-written optimizer (``compile_facts``).

The trace holds no Python stack, so a loop is told by its repetition and what its body does;
the module it runs in is not known (a loop over samples inside a module's forward reads the
same: compile would unroll it, a graph break aside). Pure functions over one rank's columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudiag.analyzers import intervals as iv
from gpudiag.analyzers.trace_loader import RankTrace

# A stretch is a loop where its body repeats at least LOOP_MIN_REPS times in a row (a model's
# few identical blocks, or an optimizer's per-parameter loop over a handful of tensors, repeat
# fewer times; a batch of samples, many more), with a body of at most LOOP_MAX_PERIOD calls.
LOOP_MIN_REPS = 16
LOOP_MAX_PERIOD = 48
# Operators that take one row (or a few) of a tensor: a body holding one iterates over rows.
INDEX_OPS = frozenset({"aten::select", "aten::slice", "aten::narrow", "aten::index",
                       "aten::unbind"})
# A body holding a GEMM or a convolution is a model's repeated block (a transformer's layers,
# each reading one position with ``x[:, 0]``), not a loop over samples: a loss or metric per
# row is elementwise work and reductions.
MODEL_BODY_OPS = frozenset({"aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm",
                            "aten::baddbmm", "aten::einsum", "aten::conv1d", "aten::conv2d",
                            "aten::conv3d", "aten::convolution", "aten::_convolution",
                            "aten::scaled_dot_product_attention"})
_BWD = "autograd::engine::evaluate_function: "


@dataclass(frozen=True)
class LoopFacts:
    """Per traced step (the mean over the rank's steps), as traced."""

    loop_calls: float = 0.0  # top-level calls in loops over samples, forward and backward
    # their time by wall clock: from the loop's first forward call to its last (the Python between
    # the calls included), and from its first backward node to its last (a node whose operator is
    # one of the body's: the engine between them included)
    loop_us: float = 0.0
    loop_iters: float = 0.0  # iterations per step of the (largest) forward loop
    passes: float = 0.0  # backward passes per step: micro-batches per optimizer step
    body: str = ""  # the largest forward loop's body, its calls in order
    # the calls after the step's last backward node (outside the model: ``torch.compile(model)``
    # does not replace them), their time from the first's start to the last's end, and how many
    # of them update a tensor in place (``aten::mul_``: a hand-written optimizer's loop)
    after_calls: float = 0.0
    after_us: float = 0.0
    after_inplace: float = 0.0
    # forward loops whose body indexes a row and calls a GEMM or a convolution: a module called
    # once per sample (``[enc(x[i]) for i in ...]``), a recurrent cell over time steps, or a
    # model's repeated blocks reading one position each; the trace cannot tell which. Their
    # iterations per step, all of them, and the largest's body
    module_iters: float = 0.0
    module_body: str = ""

    @staticmethod
    def mean(ranks: list[LoopFacts]) -> LoopFacts:
        n = max(len(ranks), 1)
        body = next((r.body for r in ranks if r.body), "")
        return LoopFacts(sum(r.loop_calls for r in ranks) / n, sum(r.loop_us for r in ranks) / n,
                         sum(r.loop_iters for r in ranks) / n, sum(r.passes for r in ranks) / n, body,
                         sum(r.after_calls for r in ranks) / n, sum(r.after_us for r in ranks) / n,
                         sum(r.after_inplace for r in ranks) / n,
                         sum(r.module_iters for r in ranks) / n,
                         next((r.module_body for r in ranks if r.module_body), ""))


def periodic(keys: np.ndarray, max_period: int = LOOP_MAX_PERIOD,
             min_reps: int = LOOP_MIN_REPS) -> list[tuple[int, int, int]]:
    """Maximal periodic stretches of ``keys``, left to right: (start, period, repetitions),
    each covering ``period * repetitions`` items; at each start the period covering the most
    items wins, the shorter on a tie (a body of 9 is also one of 18 repeated half as often)."""
    n = keys.size
    if n < 2 * min_reps:
        return []
    # per start, the period covering the most items so far (a running best: memory O(n))
    best_cov = np.full(n, -1, dtype=np.int64)
    best_p = np.zeros(n, dtype=np.int64)
    pos = np.arange(n)
    for p in range(1, min(max_period, n // min_reps) + 1):
        match = np.zeros(n, dtype=bool)
        match[: n - p] = keys[: n - p] == keys[p:]
        # consecutive matches from i on: the next mismatch's index less i
        nxt = np.where(~match, pos, n)
        nxt = np.minimum.accumulate(nxt[::-1])[::-1]
        reps = (nxt - pos + p) // p
        cov = np.where(reps >= min_reps, reps * p, -1)
        better = cov > best_cov   # strictly: on a tie the shorter period, seen first, stays
        best_cov[better] = cov[better]
        best_p[better] = p
    out = []
    i = 0
    for c in np.flatnonzero(best_cov > 0).tolist():
        if c < i:
            continue
        p = int(best_p[c])
        r = int(best_cov[c]) // p
        out.append((c, p, r))
        i = c + p * r
    return out


def _op_of_node(name: str) -> str:
    """``autograd::engine::evaluate_function: ClampBackward1`` -> ``aten::clamp``."""
    node = name[len(_BWD):]
    cut = node.find("Backward")
    return "aten::" + node[:cut].lower() if cut > 0 else ""


def loop_mask(rt: RankTrace, idx: np.ndarray,
              lo: np.ndarray) -> tuple[LoopFacts, np.ndarray, np.ndarray, iv.Intervals]:
    """``idx``: the steps' top-level calls compile would replace, sorted by thread, then time
    (``compile_facts``); ``lo``: the steps' starts. The loops they hold, and per item of
    ``idx`` whether it is in a loop over samples (forward or its backward), and whether it
    comes after its step's last backward node (outside the model); and those calls' spans, per
    step and thread from the first's start to the last's end (the Python between them included)."""
    return _scan(rt, idx, lo)


def _scan(rt: RankTrace, idx: np.ndarray,
          lo: np.ndarray) -> tuple[LoopFacts, np.ndarray, np.ndarray, iv.Intervals]:
    mask = np.zeros(idx.size, dtype=bool)
    after = np.zeros(idx.size, dtype=bool)
    n_steps = max(lo.size, 1)
    if idx.size == 0:
        return LoopFacts(), mask, after, iv.EMPTY
    names = rt.names
    step = np.searchsorted(lo, rt.cpu_ts[idx], side="right") - 1
    tid = rt.cpu_tid[idx]
    is_bwd = np.array([names[rt.cpu_name[i]].startswith(_BWD) for i in idx.tolist()], dtype=bool)
    # backward passes: a node after a forward call (or first in its step and thread)
    first = np.ones(idx.size, dtype=bool)
    first[1:] = (step[1:] != step[:-1]) | (tid[1:] != tid[:-1])
    starts = is_bwd & (first | np.concatenate(([True], ~is_bwd[:-1])))
    calls = iters = 0.0
    spans: list[tuple[float, float]] = []
    best_body, best_iters = "", 0
    module_iters, module_body, module_best = 0, "", 0
    ends = rt.cpu_ts + rt.cpu_dur
    cut = np.flatnonzero(first).tolist() + [idx.size]
    after_spans: list[tuple[float, float]] = []
    for a, b in zip(cut, cut[1:], strict=False):
        bw = np.flatnonzero(is_bwd[a:b])
        if bw.size and a + int(bw[-1]) + 1 < b:   # the calls after the backward's last node
            t0 = a + int(bw[-1]) + 1
            after[t0:b] = True
            after_spans.append((float(rt.cpu_ts[idx[t0]]), float(ends[idx[t0:b]].max())))
        keys = rt.cpu_name[idx[a:b]]
        fwd_ops: set[str] = set()
        fwd_lo, fwd_hi = np.inf, -np.inf
        bwd: list[tuple[int, int, int]] = []
        for s, p, r in periodic(keys):
            body = [names[k] for k in keys[s:s + p].tolist()]
            if all(x.startswith(_BWD) for x in body):
                bwd.append((s, p, r))
            elif (any(x in INDEX_OPS for x in body) and not any(x.startswith(_BWD) for x in body)
                  and not any(x in MODEL_BODY_OPS for x in body)):
                fwd_ops |= set(body)
                _take(mask, a + s, a + s + p * r)
                calls += p * r
                fwd_lo = min(fwd_lo, float(rt.cpu_ts[idx[a + s]]))
                fwd_hi = max(fwd_hi, float(ends[idx[a + s + p * r - 1]]))
                iters += r
                if r > best_iters:
                    best_iters, best_body = r, ", ".join(body)
            elif any(x in INDEX_OPS for x in body) and not any(x.startswith(_BWD) for x in body):
                module_iters += r   # a GEMM or a convolution in it: the branch above says why
                if r > module_best:
                    module_best, module_body = r, ", ".join(body)
        for s, p, r in bwd:   # the loop's own backward: its nodes are the body's operators'
            ops = {_op_of_node(names[k]) for k in keys[s:s + p].tolist()}
            if fwd_ops and ops <= fwd_ops:
                _take(mask, a + s, a + s + p * r)
                calls += p * r
        if fwd_ops:
            # an irregular iteration (a stall, a branch) splits a loop into stretches: the loop
            # runs from the first's start to the last's end
            spans.append((fwd_lo, fwd_hi))
            seg = idx[a:b]
            mine = [k for k in seg[is_bwd[a:b]].tolist() if _op_of_node(names[rt.cpu_name[k]]) in fwd_ops]
            if mine:
                spans.append((float(rt.cpu_ts[mine[0]]), float(max(ends[k] for k in mine))))
    us = float(sum(hi - lo_ for lo_, hi in spans))
    inplace = sum(_in_place(names[k]) for k in rt.cpu_name[idx[after]].tolist())
    facts = LoopFacts(loop_calls=calls / n_steps, loop_us=us / n_steps, loop_iters=iters / n_steps,
                      passes=float(starts.sum()) / n_steps, body=best_body,
                      after_calls=float(after.sum()) / n_steps,
                      after_us=float(sum(hi - lo_ for lo_, hi in after_spans)) / n_steps,
                      after_inplace=float(inplace) / n_steps,
                      module_iters=module_iters / n_steps, module_body=module_body)
    tail = iv.merge(np.array([a for a, _ in after_spans]), np.array([b for _, b in after_spans]))
    return facts, mask, after, tail


def _in_place(name: str) -> bool:
    """``aten::mul_``, ``aten::addcdiv_``: an operator that updates its first argument."""
    return name.startswith("aten::") and name.endswith("_") and not name.endswith("__")


def _take(mask: np.ndarray, a: int, b: int) -> None:
    mask[a:b] = True
