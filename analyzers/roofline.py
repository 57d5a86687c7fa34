"""Roofline: is each unit of device work limited by compute or by memory bandwidth?

Work is attributed to the operator that launched it (kernel ``External id`` -> CPU op) and
judged by that operator's arithmetic intensity (FLOPs / bytes, from recorded shapes)
against the device's ridge point (peak FLOP/s / peak bytes/s). Without shapes we fall back
to what a kernel's *name* says (GEMM/conv/attention kernels vs elementwise/reduction ones),
and say so: that is a weaker signal and the verdict's confidence is lowered for it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpudiag.analyzers.op_flops import MODEL_OPS
from gpudiag.analyzers.op_tree import counted_ops
from gpudiag.analyzers.trace_loader import KCLASS_COMPUTE, RankTrace
from gpudiag.devices import DTYPE_FAMILY, DevicePeak
from gpudiag.diagnosis import Roofline, RooflinePoint

BOUND_UNKNOWN, BOUND_MEMORY, BOUND_COMPUTE = -1, 0, 1

# Kernel and op names that are dense math (tensor cores / FMA pipes) vs streaming work.
_COMPUTE_NAME_RE = re.compile(
    r"gemm|cutlass|xmma|wgmma|nvjet|matmul|_mm_|triton_.*mm|scaled_mm|conv|cudnn|winograd|"
    r"implicit_convolve|flash|fmha|attention|s884|s1688|h884|h1688|hmma|Kernel_gemm|"
    r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|conv)",
    re.IGNORECASE,
)
_MEMORY_NAME_RE = re.compile(
    r"elementwise|vectorized|reduce|copy|norm|softmax|dropout|embedding|index|scatter|gather|"
    r"cat|transpose|fill|pool|adam|sgd|foreach|multi_tensor|unrolled|memcpy|memset|"
    r"aten::(add|mul|sub|div|relu|gelu|sigmoid|tanh|copy_|fill_|zero_|sum|mean|to|_to_copy)",
    re.IGNORECASE,
)


def name_bound(name: str) -> int:
    if _COMPUTE_NAME_RE.search(name):
        return BOUND_COMPUTE
    if _MEMORY_NAME_RE.search(name):
        return BOUND_MEMORY
    return BOUND_UNKNOWN


@dataclass
class WorkBounds:
    """Per work item (GPU activity, or CPU op on a CPU trace) its bound and how we know."""

    bound: np.ndarray  # BOUND_*
    by_shapes: np.ndarray  # bool: decided from shapes (else name or unknown)
    op_index: np.ndarray  # costed CPU op the item belongs to, -1 if none
    wraps_costed: np.ndarray  # CPU traces: uncosted op with a costed op inside
    inner: np.ndarray  # counted costed CPU ops (see op_tree.counted_ops), computed once per rank
    owner: np.ndarray  # per CPU op: the counted op its work belongs to, -1 if none


def _op_bound(rt: RankTrace, device: DevicePeak | None, ops: np.ndarray) -> np.ndarray:
    """Bound of each costed op by intensity vs the ridge of its own dtype."""
    out = np.full(ops.size, BOUND_UNKNOWN, dtype=np.int8)
    if ops.size == 0 or device is None:
        return out
    flops = rt.cpu_flops[ops]
    nbytes = rt.cpu_bytes[ops]
    dtypes = rt.cpu_dtype[ops]
    ridge_by_dtype: dict[int, float] = {}
    for d in np.unique(dtypes):
        ridge_by_dtype[int(d)] = device.ridge(rt.names[d] if d >= 0 else "float")
    ridge = np.array([ridge_by_dtype[int(d)] for d in dtypes])
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(nbytes > 0, flops / nbytes, np.inf)
    out[:] = np.where(intensity >= ridge, BOUND_COMPUTE, BOUND_MEMORY)
    return out


def work_bounds(rt: RankTrace, device: DevicePeak | None) -> WorkBounds:
    """Bound of every GPU activity (GPU trace) or every CPU op (CPU-only trace)."""
    inner, owner = counted_ops(rt)
    op_bound_all = np.full(rt.cpu_ts.size, BOUND_UNKNOWN, dtype=np.int8)
    inner_idx = np.flatnonzero(inner)
    op_bound_all[inner_idx] = _op_bound(rt, device, inner_idx)

    if rt.has_gpu:
        n = rt.gpu_ts.size
        op_index = np.full(n, -1, dtype=np.int64)
        if inner_idx.size and rt.cpu_ext.size:
            # kernels of an absorbed helper (addmm's bias copy) belong to the op that owns it
            owned = np.flatnonzero((owner >= 0) & (rt.cpu_ext >= 0))
            ext_to_op = dict(zip(rt.cpu_ext[owned].tolist(), owner[owned].tolist(), strict=True))
            if ext_to_op:
                op_index = np.fromiter((ext_to_op.get(int(e), -1) for e in rt.gpu_ext.tolist()),
                                       dtype=np.int64, count=n)
        missing = (op_index < 0) & np.isfinite(rt.gpu_launch_ts)
        if missing.any() and inner_idx.size:
            op_index[missing] = _enclosing_op(rt, inner_idx, rt.gpu_launch_ts[missing],
                                              rt.gpu_launch_tid[missing])
        tf32_ops = _tf32_ops(rt, op_index)
        if tf32_ops.size:
            op_bound_all[tf32_ops] = _op_bound(rt, device, tf32_ops)
        bound = np.full(n, BOUND_UNKNOWN, dtype=np.int8)
        has_op = op_index >= 0
        bound[has_op] = op_bound_all[op_index[has_op]]
        by_shapes = has_op & (bound != BOUND_UNKNOWN)
        names_bound = _bounds_by_name(rt.gpu_name, rt.names)
        bound = np.where(by_shapes, bound, names_bound).astype(np.int8)
        bound[rt.gpu_class != KCLASS_COMPUTE] = BOUND_MEMORY
        return WorkBounds(bound=bound, by_shapes=by_shapes, op_index=op_index,
                          wraps_costed=np.zeros(rt.cpu_ts.size, dtype=bool), inner=inner,
                          owner=owner)

    wraps = _wraps_costed(rt, inner_idx)
    bound = op_bound_all.copy()
    bound[wraps] = BOUND_UNKNOWN  # judged through the costed ops inside them
    by_shapes = bound != BOUND_UNKNOWN
    names_bound = _bounds_by_name(rt.cpu_name, rt.names)
    bound = np.where(by_shapes, bound, names_bound).astype(np.int8)
    op_index = np.where(inner, np.arange(rt.cpu_ts.size), -1)
    return WorkBounds(bound=bound, by_shapes=by_shapes, op_index=op_index,
                      wraps_costed=wraps, inner=inner, owner=owner)


def _wraps_costed(rt: RankTrace, inner_idx: np.ndarray) -> np.ndarray:
    """Mask of uncosted ops with a costed op inside (autograd wrappers such as
    ``evaluate_function: AddmmBackward0`` around ``aten::mm``): their time is already the
    costed op's, so counting them as work of their own would count it twice."""
    out = np.zeros(rt.cpu_ts.size, dtype=bool)
    if inner_idx.size == 0:
        return out
    uncosted = np.flatnonzero(~np.isfinite(rt.cpu_flops) & rt.cpu_is_op)
    for t in np.unique(rt.cpu_tid[uncosted]):
        mine = inner_idx[rt.cpu_tid[inner_idx] == t]
        if mine.size == 0:
            continue
        starts = np.sort(rt.cpu_ts[mine])
        cand = uncosted[rt.cpu_tid[uncosted] == t]
        lo = np.searchsorted(starts, rt.cpu_ts[cand], side="left")
        hi = np.searchsorted(starts, rt.cpu_ts[cand] + rt.cpu_dur[cand], side="left")
        out[cand[hi > lo]] = True
    return out


# A CPU operator whose FLOPs at the measured peak and bytes at the measured bandwidth would take
# under this fraction of its time is below both roofs: bound by neither, its time is the fixed
# cost of the call (the dispatcher, Python, the profiler's own ~2 us per recorded event). The
# numbers behind it (held-out zoo 2, grad_accum: 32 micro-batches of 4 rows, 2-core EPYC, peaks
# fp32 92.8 GFLOP/s and 18.5 GB/s): its LayerNorm, GELU and their backward on [4, 256] reached
# 1-3% of both roofs (28-49 us a call for 4-8 KB), the weight-gradient mm of K=4 3-8% under
# load; the [4, 256] x [256, 256] GEMM, which streams its 256 KB weight, 16% of the peak and
# 41% of the bandwidth, and the optimizer's adds over whole weights 100-200% of the bandwidth
# (in cache). The job's own timer put 86-91% of its step in per-call overhead (the same samples
# in one micro-batch ran 0.10x), where gpudiag read the 1-8% calls as memory-bound work (0.86,
# "high"). A tenth leaves a call's work at most a tenth of its time: what vectorising or larger
# batches would keep. GPU kernels are not judged this way (their launch cost is the host's
# already, between kernels).
DISPATCH_ROOF_FRACTION = 0.1
# ... and only a call whose work at the roofs takes under this long: less than the dispatch of
# one eager CPU call (5-20 us, PyTorch's performance tuning guide). A fraction alone is not
# enough where the machine is shared: at load 12 on 2 cores a thread runs a fraction of the
# time, and an elementwise add over 32 MB (1.8 ms at 18.5 GB/s) read 5% of the bandwidth,
# below the fraction, while its time was still its bytes'. The 4-row LayerNorm needs 0.44 us.
DISPATCH_WORK_US = 5.0


def below_both_roofs(rt: RankTrace, wb: WorkBounds, dur: np.ndarray,
                     device: DevicePeak | None) -> np.ndarray:
    """Mask of the CPU work items (``is_cpu_work``, with a FLOP and byte count) whose time
    ``dur`` (the stalls out of it) is more than 1 / ``DISPATCH_ROOF_FRACTION`` times what their
    FLOPs at the peak of their dtype and their bytes at the memory bandwidth need, that need
    under ``DISPATCH_WORK_US``: per-call overhead, not compute or memory work. All False on a
    GPU trace or without peaks."""
    out = np.zeros(rt.cpu_ts.size, dtype=bool)
    if rt.has_gpu or device is None or device.bandwidth <= 0 or not out.size:
        return out
    cand = np.flatnonzero(is_cpu_work(rt, wb) & wb.inner & np.isfinite(rt.cpu_flops)
                          & np.isfinite(rt.cpu_bytes) & (dur > 0))
    if cand.size == 0:
        return out
    peaks: dict[int, float] = {}
    for d in np.unique(rt.cpu_dtype[cand]).tolist():
        peaks[d] = device.peak_for(rt.names[d] if d >= 0 else "float")[0]
    peak = np.array([peaks[d] for d in rt.cpu_dtype[cand].tolist()])
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.maximum(np.where(peak > 0, rt.cpu_flops[cand] / peak, np.inf),
                          rt.cpu_bytes[cand] / device.bandwidth) * 1e6  # us
    out[cand] = (need < DISPATCH_ROOF_FRACTION * dur[cand]) & (need < DISPATCH_WORK_US)
    return out


def is_cpu_work(rt: RankTrace, wb: WorkBounds) -> np.ndarray:
    """CPU work items: innermost costed ops, and top-level ops with no costed op inside."""
    inner = wb.op_index >= 0
    top_plain = (rt.cpu_depth == 0) & ~np.isfinite(rt.cpu_flops) & ~wb.wraps_costed
    work: np.ndarray = rt.cpu_is_op & (inner | top_plain)
    return work


# fp32 matmuls that ran on tensor cores as TF32: Ampere/Hopper cuBLAS/CUTLASS kernel names
# ("tensorop_s1688gemm", "s16816gemm", "tf32"). Their ceiling is the TF32 peak, not FP32's.
_TF32_KERNEL_RE = re.compile(r"tf32|tensorop_s1688|tensorop_s16816|_s1688gemm|_s16816gemm", re.I)


def _tf32_ops(rt: RankTrace, op_index: np.ndarray) -> np.ndarray:
    """fp32 ops whose kernels ran as TF32; their dtype column is switched to "tf32"."""
    has = op_index >= 0
    if not has.any():
        return np.empty(0, dtype=np.int64)
    uniq = np.unique(rt.gpu_name[has])
    tf32_names = np.array([i for i in uniq if _TF32_KERNEL_RE.search(rt.names[i])], dtype=np.int64)
    if tf32_names.size == 0:
        return np.empty(0, dtype=np.int64)
    ops = np.unique(op_index[has & np.isin(rt.gpu_name, tf32_names)])
    ops = ops[np.array([rt.cpu_dtype[o] < 0 or rt.names[rt.cpu_dtype[o]] in ("float", "float32")
                        for o in ops], dtype=bool)]
    if ops.size:
        if "tf32" not in rt.names:
            rt.names.append("tf32")
        rt.cpu_dtype[ops] = rt.names.index("tf32")
    found: np.ndarray = ops
    return found


def _enclosing_op(rt: RankTrace, ops: np.ndarray, when: np.ndarray, tid: np.ndarray
                  ) -> np.ndarray:
    """The costed op (from ``ops``, disjoint per thread) running on ``tid`` at ``when``.

    Used when a kernel's External id names no op (older traces): the runtime call that
    launched it ran inside the op that asked for it.
    """
    out = np.full(when.size, -1, dtype=np.int64)
    for t in np.unique(tid):
        sel = np.flatnonzero(tid == t)
        mine = ops[rt.cpu_tid[ops] == t]
        if mine.size == 0:
            continue
        mine = mine[np.argsort(rt.cpu_ts[mine])]
        starts = rt.cpu_ts[mine]
        ends = starts + rt.cpu_dur[mine]
        k = np.searchsorted(starts, when[sel], side="right") - 1
        ok = (k >= 0) & (when[sel] <= ends[np.clip(k, 0, None)])
        out[sel[ok]] = mine[k[ok]]
    return out


def _bounds_by_name(name_ids: np.ndarray, names: list[str]) -> np.ndarray:
    if name_ids.size == 0:
        return np.empty(0, dtype=np.int8)
    uniq = np.unique(name_ids)
    table = np.full(int(uniq.max()) + 1, BOUND_UNKNOWN, dtype=np.int8)
    for i in uniq:
        table[i] = name_bound(names[i])
    bounds: np.ndarray = table[name_ids]
    return bounds


@dataclass
class RooflineAcc:
    """Roofline inputs summed over ranks, so each rank's columns can be dropped early."""

    # (op, shape, dtype) -> [calls, flops, bytes, time in us]
    groups: dict[tuple[str, str, str], list[float]] = field(
        default_factory=lambda: defaultdict(lambda: [0, 0.0, 0.0, 0.0]))
    dtype_flops: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cb_time: float = 0.0
    mb_time: float = 0.0
    unknown_time: float = 0.0
    shapes_time: float = 0.0
    work_time: float = 0.0  # all device work (compute kernels, or CPU work items)
    uncosted_time: float = 0.0  # the part of it in ops without a cost formula

    def add(self, rt: RankTrace, wb: WorkBounds) -> None:
        if rt.has_gpu:
            work = rt.gpu_class == KCLASS_COMPUTE
            dur = rt.gpu_dur
        else:
            work = is_cpu_work(rt, wb)
            dur = rt.cpu_dur
        self.cb_time += float(dur[work & (wb.bound == BOUND_COMPUTE)].sum())
        self.mb_time += float(dur[work & (wb.bound == BOUND_MEMORY)].sum())
        self.unknown_time += float(dur[work & (wb.bound == BOUND_UNKNOWN)].sum())
        self.shapes_time += float(dur[work & wb.by_shapes].sum())
        self.work_time += float(dur[work].sum())
        self.uncosted_time += float(dur[work & (wb.op_index < 0)].sum())
        model = rt.cpu_is_model_flop & wb.inner
        for d, f in zip(rt.cpu_dtype[model].tolist(), rt.cpu_flops[model].tolist(), strict=False):
            self.dtype_flops[rt.names[d] if d >= 0 else "float"] += f
        sel = work & (wb.op_index >= 0)
        op_time: dict[int, float] = defaultdict(float)
        for oi, d in zip(wb.op_index[sel].tolist(), dur[sel].tolist(), strict=False):
            op_time[oi] += d
        for oi, t in op_time.items():
            shape = rt.cpu_shape[oi]
            key = (rt.names[rt.cpu_name[oi]], rt.names[shape] if shape >= 0 else "",
                   rt.names[rt.cpu_dtype[oi]] if rt.cpu_dtype[oi] >= 0 else "float")
            g = self.groups[key]
            g[0] += 1
            g[1] += float(rt.cpu_flops[oi])
            g[2] += float(rt.cpu_bytes[oi])
            g[3] += t

    def merge(self, other: RooflineAcc) -> None:
        for k, g in other.groups.items():
            mine = self.groups[k]
            for i in range(4):
                mine[i] += g[i]
        for dt, v in other.dtype_flops.items():
            self.dtype_flops[dt] += v
        self.cb_time += other.cb_time
        self.mb_time += other.mb_time
        self.unknown_time += other.unknown_time
        self.shapes_time += other.shapes_time
        self.work_time += other.work_time
        self.uncosted_time += other.uncosted_time

    def dominant_dtype(self) -> str:
        """The dtype carrying most model FLOPs ("float" when nothing is known)."""
        return max(self.dtype_flops, key=self.dtype_flops.__getitem__) if self.dtype_flops else "float"

    def model_rates(self) -> dict[str, float]:
        """Per dtype family, the best FLOP/s any (op, shape) with an exact FLOP formula reached:
        a lower bound of the device's peak (traced time includes the profiler's cost)."""
        out: dict[str, float] = {}
        for (op, _shape, dt), (_calls, flops, _nbytes, t) in self.groups.items():
            if op in MODEL_OPS and t > 0 and flops > 0:
                fam = DTYPE_FAMILY.get(dt.lower(), "fp32")
                out[fam] = max(out.get(fam, 0.0), flops / (t * 1e-6))
        return out

    def uncosted_share(self) -> float | None:
        """Share of device work time in ops with no FLOP formula (None: no work at all)."""
        return self.uncosted_time / self.work_time if self.work_time > 0 else None

    def __getstate__(self) -> dict[str, Any]:
        return {"groups": dict(self.groups), "dtype_flops": dict(self.dtype_flops),
                "cb_time": self.cb_time, "mb_time": self.mb_time,
                "unknown_time": self.unknown_time, "shapes_time": self.shapes_time,
                "work_time": self.work_time, "uncosted_time": self.uncosted_time}

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.groups = defaultdict(lambda: [0, 0.0, 0.0, 0.0], st["groups"])
        self.dtype_flops = defaultdict(float, st["dtype_flops"])
        for k in ("cb_time", "mb_time", "unknown_time", "shapes_time", "work_time", "uncosted_time"):
            setattr(self, k, st[k])


def build_roofline(acc: RooflineAcc, device: DevicePeak | None, max_points: int = 60) -> Roofline:
    """Roofline points per (op, shape, dtype) and the compute/memory time split."""
    dtype = acc.dominant_dtype()
    points = []
    if device is not None:
        peak, family = device.peak_for(dtype)
        bw = device.bandwidth
        for (op, shape, dt), (calls, flops, nbytes, t) in acc.groups.items():
            if t <= 0 or flops <= 0:  # no place on a log-scale roofline; its time is counted
                continue
            pk, _ = device.peak_for(dt)
            intensity = flops / nbytes if nbytes > 0 else float("inf")
            points.append(RooflinePoint(
                op=op, shape=shape, dtype=dt, calls=int(calls), flops=flops, bytes=nbytes,
                time_us=t, intensity=intensity, achieved_flops=flops / (t * 1e-6),
                attainable_flops=min(pk, intensity * bw),
                bound="compute" if intensity >= pk / bw else "memory",
            ))
        points.sort(key=lambda p: -p.time_us)
    else:
        peak, family, bw = 0.0, DTYPE_FAMILY.get(dtype, "fp32"), 0.0
    total = acc.cb_time + acc.mb_time + acc.unknown_time
    if total <= 0:
        method = "none"
    elif acc.shapes_time >= 0.5 * total:
        method = "shapes"
    elif acc.cb_time + acc.mb_time > 0:
        method = "kernel-names"
    else:
        method = "none"
    return Roofline(
        method=method, peak_flops=peak, peak_bandwidth=bw,
        ridge_intensity=peak / bw if bw else 0.0, dtype_family=DTYPE_FAMILY.get(dtype, family),
        compute_bound_time=acc.cb_time, memory_bound_time=acc.mb_time,
        unattributed_time=acc.unknown_time, points=points[:max_points],
    )


# A point may sit this far above a roof before it is called a counting bug: datasheet peaks
# are rounded, and the boost clock they assume can be exceeded by a few percent.
ROOF_TOLERANCE = 1.05
# Data that fits in the on-chip cache is read faster than main memory allows (an in-place
# ReLU on a 26 MB activation just written by batch norm runs at 4 TB/s on an H100 whose HBM
# gives 3.35), so the bandwidth roof binds only calls that move more than the largest
# last-level cache among the devices we know (H100/H200 50 MB L2, A100 40 MB) with room.
CACHE_RESIDENT_BYTES = 128 * 2**20


def roof_violations(acc: RooflineAcc, device: DevicePeak | None) -> list[str]:
    """One warning per (op, shape, dtype) whose achieved rate is above the compute roof of its
    dtype or above the bandwidth roof.

    Both are impossible for work counted right: FLOPs are the model's and bytes a lower bound
    (``op_flops``), so such a point means its cost was over-counted or its time
    under-attributed (ResNet-50's strided stem counted at 4x, a point at 1.6 PFLOP/s on a
    989 TFLOP/s H100). It is named so the formula can be fixed.
    """
    if device is None or device.source.startswith("measured"):
        # a measured peak (the CPU's) is the best of a few samples on a shared machine, one
        # thread for the copy: a floor of what the device can do, not a ceiling
        return []
    out = []
    for (op, shape, dt), (calls, flops, nbytes, t) in acc.groups.items():
        if t <= 0:
            continue
        seconds = t * 1e-6
        peak, family = device.peak_for(dt)
        if flops / seconds > peak * ROOF_TOLERANCE:
            out.append(f"roofline: {op} {shape} ({dt}) counted at {flops / seconds / 1e12:.4g} "
                       f"TFLOP/s, above the {peak / 1e12:.4g} TFLOP/s {family} peak: its FLOPs "
                       "are over-counted or its time under-attributed")
        elif (nbytes / seconds > device.bandwidth * ROOF_TOLERANCE
              and nbytes / max(calls, 1) > CACHE_RESIDENT_BYTES):
            out.append(f"roofline: {op} {shape} ({dt}) counted at {nbytes / seconds / 1e9:.4g} "
                       f"GB/s, above the {device.bandwidth / 1e9:.4g} GB/s memory bandwidth: "
                       "its bytes are over-counted or its time under-attributed")
    return out
