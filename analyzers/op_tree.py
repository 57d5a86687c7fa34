"""Which costed operators are counted, so that no work is counted twice or dropped.

Operators nest: ``aten::linear`` calls ``aten::addmm``, ``aten::conv2d`` calls
``aten::convolution`` ... ``aten::cudnn_convolution``, and each level is costed from its own
shapes. Counting only the innermost costed op counts the multiply once. But ops also call
small helpers that are costed too: on the CPU ``aten::addmm`` broadcasts its bias with an
``aten::copy_`` before the GEMM, ``native_batch_norm`` zeroes a 2-element counter, and taking
those as the innermost op dropped every forward addmm of an MLP (its MFU read half the
analytic value) and half of ResNet's batch-norm time. So an inner op replaces its parent only
when it is the *same work* one level down: the same kind (``op_args.KIND_*``) and, with its
same-kind siblings, at least ``SAME_WORK_SHARE`` of the parent's cost.

* an op whose same-kind children are the same work is *shadowed*: they are counted instead;
* an op inside a counted op is *absorbed* into it (its time and kernels belong to that op,
  its own cost is not counted): the bias copy is part of the addmm. A matmul, convolution or
  attention op is never absorbed into an op of another kind, which would hide model FLOPs;
* every other costed op is *counted*.
"""

from __future__ import annotations

import numpy as np

from gpudiag.analyzers.op_args import KIND_MODEL
from gpudiag.analyzers.trace_columns import RankTrace

# The same work passed one level down has the same shapes, hence the same cost (linear ->
# addmm, conv2d -> cudnn_convolution, autocast's re-dispatch of an op to itself); a level
# may add or drop a bias or a scale, so "same" is at least 90% of the parent's cost.
# Helpers are far below it (a bias copy is 1/K of its matmul's FLOPs).
SAME_WORK_SHARE = 0.9


def counted_ops(rt: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """(mask of counted CPU ops, owner of every CPU op).

    ``owner[i]`` is the counted op that op ``i``'s work belongs to: ``i`` itself when it is
    counted, its counted ancestor when absorbed, -1 when uncosted or shadowed. CPU ops on one
    thread either nest or are disjoint, so sorting by (thread, start, longest first) lists
    every op after its ancestors, and a stack of open ops gives each one its costed parent.
    """
    n = rt.cpu_ts.size
    owner = np.full(n, -1, dtype=np.int64)
    costed = np.flatnonzero(np.isfinite(rt.cpu_flops))
    if costed.size == 0:
        return np.zeros(n, dtype=bool), owner
    order = costed[np.lexsort((-rt.cpu_dur[costed], rt.cpu_ts[costed], rt.cpu_tid[costed]))]
    ts = rt.cpu_ts[order].tolist()
    end = (rt.cpu_ts[order] + rt.cpu_dur[order]).tolist()
    tid = rt.cpu_tid[order].tolist()
    kind = rt.cpu_kind[order].tolist()
    m = order.size
    parent = [-1] * m
    stack: list[int] = []  # positions in ``order`` of the ops open at the current time
    cur_tid = None
    for j in range(m):
        if tid[j] != cur_tid:
            stack = []
            cur_tid = tid[j]
        while stack and end[stack[-1]] <= ts[j]:
            stack.pop()
        parent[j] = stack[-1] if stack else -1
        stack.append(j)
    # the cost that says "same work": FLOPs for model ops, bytes for memory-bound ones
    metric = np.where(rt.cpu_kind[order] == KIND_MODEL, rt.cpu_flops[order],
                      rt.cpu_bytes[order]).tolist()
    same_kind_children = [0.0] * m
    for j in range(m):
        p = parent[j]
        if p >= 0 and kind[p] == kind[j]:
            same_kind_children[p] += metric[j]
    shadowed = [c > 0 and c >= SAME_WORK_SHARE * metric[j] for j, c in enumerate(same_kind_children)]
    own = [-1] * m
    for j in range(m):  # parents come first in this order
        p = parent[j]
        o = own[p] if p >= 0 else -1
        if o >= 0 and not (kind[j] == KIND_MODEL and kind[o] != KIND_MODEL):
            own[j] = o
        elif not shadowed[j]:
            own[j] = j
    own_arr = np.asarray(own, dtype=np.int64)
    has = own_arr >= 0
    owner[order[has]] = order[own_arr[has]]
    counted = np.zeros(n, dtype=bool)
    counted[order[own_arr == np.arange(m)]] = True
    return counted, owner
