"""Fold decoded trace events into numpy columns: one ``RankTrace`` per rank file.

The events come from ``trace_decode`` as an iterator; each is classified (GPU activity,
runtime call, CPU operator or annotation), costed when it is an operator with recorded
shapes (``op_flops``), and appended to compact typed arrays, so the decoded objects can be
dropped batch by batch. Everything downstream reads these columns only.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpudiag.analyzers.op_flops import op_cost
from gpudiag.analyzers.trace_decode import SALVAGE_MARKER, EventArgs, as_int, rank_of

# --- event kinds ------------------------------------------------------------------------

# GPU activity categories, current and PyTorch 1.8-1.9 spelling.
_GPU_KIND = {
    "kernel": 0, "Kernel": 0,
    "gpu_memcpy": 1, "Memcpy": 1,
    "gpu_memset": 2, "Memset": 2,
}
_RUNTIME_CATS = frozenset({"cuda_runtime", "Runtime", "cuda_driver"})
_CPU_CATS = frozenset({"cpu_op", "Operator", "user_annotation", "python_function"})

# HTA's kernel classes (hta/utils/utils.py): communication = "^nccl.*Kernel", memory =
# "^Memcpy|^Memset|^dma", everything else computation. We use the same so our idle/compute/
# non-compute percentages are comparable with HTA's temporal breakdown.
COMM_KERNEL_RE = re.compile(r"^nccl.*Kernel|ncclKernel|ncclDevKernel")
MEMORY_KERNEL_RE = re.compile(r"^(Memcpy|Memset|dma)")
# HTA counts kernels whose name contains "Memcpy" or "Sync" as neither compute nor
# communication ("OTHER"); we keep them apart for the same reason.
OTHER_KERNEL_RE = re.compile(r".*Memcpy|.*Sync")
KCLASS_COMPUTE, KCLASS_COMM, KCLASS_MEMORY, KCLASS_OTHER = 0, 1, 2, 3

STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
DATALOADER_PREFIX = "enumerate(DataLoader)#"
DATALOADER_SUFFIX = ".__next__"
# CPU-side collective markers: gloo/NCCL calls are wrapped in record_param_comms and in
# c10d annotations such as "nccl:all_reduce" / "gloo:all_reduce".
_CPU_COMM_RE = re.compile(r"^(record_param_comms|c10d::|nccl:|gloo:)")


@dataclass
class RankTrace:
    """Columns of one rank. Times are microseconds on the trace's own clock."""

    rank: int
    path: str
    world_size: int | None
    device_name: str | None
    device_memory: int | None
    backend: str | None
    names: list[str]  # string table; *_name columns index into it
    # GPU activities (kernel, memcpy, memset)
    gpu_ts: np.ndarray
    gpu_dur: np.ndarray
    gpu_kind: np.ndarray  # 0 kernel, 1 memcpy, 2 memset
    gpu_class: np.ndarray  # KCLASS_*
    gpu_name: np.ndarray
    gpu_stream: np.ndarray
    gpu_corr: np.ndarray
    gpu_ext: np.ndarray
    gpu_launch_ts: np.ndarray  # ts of the runtime call that launched it; NaN if unknown
    gpu_launch_tid: np.ndarray  # thread of that runtime call (same ids as cpu_tid); -1 unknown
    # CPU operators and annotations
    cpu_ts: np.ndarray
    cpu_dur: np.ndarray
    cpu_name: np.ndarray
    cpu_tid: np.ndarray
    cpu_ext: np.ndarray
    cpu_flops: np.ndarray  # NaN where the op has no known cost
    cpu_bytes: np.ndarray
    cpu_dtype: np.ndarray  # index into names; -1 unknown
    cpu_is_model_flop: np.ndarray  # bool: matmul/conv/attention (counts toward MFU)
    cpu_kind: np.ndarray  # op_args.KIND_* of costed ops, 0 where uncosted
    cpu_had_shapes: np.ndarray  # bool: "Input Dims" recorded
    cpu_depth: np.ndarray  # nesting depth among cpu ops on the same thread (0 = top level)
    cpu_is_op: np.ndarray  # bool: an operator (cpu_op), not a user annotation
    cpu_shape: dict[int, str]  # index -> "Input Dims" text, for ops with a known cost
    # steps and dataloader waits
    steps: list[tuple[int, float, float]]  # (step number, start, end)
    dataloader: np.ndarray  # (n, 2) start, end
    # collectives (from NCCL kernels' args on GPU, or record_param_comms on CPU)
    collectives: list[dict[str, Any]]
    cpu_comm_intervals: np.ndarray  # (n, 2)
    dataloader_iters: list[str] = field(default_factory=list)  # e.g. _SingleProcessDataLoaderIter
    warnings: list[str] = field(default_factory=list)
    dropped_events: int = 0  # timed events (kernels, runtime calls, CPU ops) left out as unusable
    kept_events: int = 0
    dropped_gpu_events: int = 0
    kept_gpu_events: int = 0

    @property
    def has_gpu(self) -> bool:
        return self.gpu_ts.size > 0

    @property
    def shapes_recorded(self) -> bool:
        return bool(self.cpu_had_shapes.any())

# No event in a trace of a few training steps lasts an hour: a longer one is a corrupt or
# edited timestamp, and kept it would swallow every union it joins (one 10^18 us kernel makes
# the GPU "busy" for the whole step). Dropped and counted instead.
MAX_EVENT_US = 3.6e9

def _hashable(v: Any) -> Any:
    return v if isinstance(v, (int, str, float)) or v is None else repr(v)


def fold_events(events: Iterator[Any], props: Any, dist: Any, path: str, rank_hint: int | None) -> RankTrace:
    names: list[str] = []
    name_ids: dict[str, int] = {}

    def nid(s: str) -> int:
        i = name_ids.get(s)
        if i is None:
            i = name_ids[s] = len(names)
            names.append(s)
        return i

    g_ts = array('d')
    g_dur = array('d')
    g_kind = array('b')
    g_name = array('i')
    g_stream = array('q')
    g_corr = array('q')
    g_ext = array('q')
    c_ts = array('d')
    c_dur = array('d')
    c_name = array('i')
    c_tid = array('i')
    c_ext = array('q')
    c_flops = array('d')
    c_bytes = array('d')
    c_dtype = array('i')
    c_model = array('b')
    c_kind = array('b')
    c_shapes = array('b')
    c_isop = array('b')
    c_shape_txt: dict[int, str] = {}
    rt_corr: dict[int, tuple[float, int]] = {}
    steps: list[tuple[int, float, float]] = []
    dataloader: list[tuple[float, float]] = []
    dl_kinds: set[str] = set()
    cpu_comm: list[tuple[float, float]] = []
    gpu_colls: list[dict[str, Any]] = []
    cpu_colls: list[dict[str, Any]] = []
    cpu_annotated: list[dict[str, Any]] = []
    tid_ids: dict[Any, int] = {}
    dropped_neg = dropped_missing = dropped_long = dropped_gpu = kept = 0
    nan = float("nan")

    salvage_dropped = None
    for ev in events:
        if ev.ph != "X":
            if ev.ph == SALVAGE_MARKER:
                salvage_dropped = int(ev.name)
            continue
        cat = ev.cat
        ts = ev.ts
        dur = ev.dur
        if not isinstance(cat, str) or not isinstance(ev.name, str):
            continue
        gk = _GPU_KIND.get(cat)
        is_rt = cat in _RUNTIME_CATS
        is_cpu = cat in _CPU_CATS
        if gk is None and not is_rt and not is_cpu:
            continue
        if (not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts != ts
                or not isinstance(dur, (int, float)) or isinstance(dur, bool) or dur != dur):
            dropped_missing += 1
            dropped_gpu += gk is not None
            continue
        if dur < 0 or dur > MAX_EVENT_US:
            if dur < 0:
                dropped_neg += 1
            else:
                dropped_long += 1
            if gk is not None:
                dropped_gpu += 1
            continue
        kept += 1
        a = ev.args
        if gk is not None:
            name = ev.name
            g_ts.append(ts)
            g_dur.append(dur)
            g_kind.append(gk)
            g_name.append(nid(name))
            stream = as_int(a.stream) if a is not None else None
            g_stream.append(-1 if stream is None else stream)
            corr = as_int(a.correlation) if a is not None else None
            g_corr.append(-1 if corr is None else corr)
            ext = as_int(a.external_id) if a is not None else None
            g_ext.append(-1 if ext is None else ext)
            if a is not None and a.collective is not None and gk == 0:
                gpu_colls.append(_collective(a, ts, dur))
        elif is_rt:
            corr = as_int(a.correlation) if a is not None else None
            if corr is not None:
                rt_corr[corr] = (ts, tid_ids.setdefault(_hashable(ev.tid), len(tid_ids)))
        else:
            name = ev.name
            if name.startswith("ProfilerStep"):
                m = STEP_RE.match(name)
                if m:
                    steps.append((int(m.group(1)), float(ts), float(ts + dur)))
                    continue
            if name.startswith(DATALOADER_PREFIX) and name.endswith(DATALOADER_SUFFIX):
                dataloader.append((ts, ts + dur))
                dl_kinds.add(name[len(DATALOADER_PREFIX):-len(DATALOADER_SUFFIX)])
                continue
            if cat == "python_function":
                continue
            if _CPU_COMM_RE.match(name):
                cpu_comm.append((ts, ts + dur))
                if a is not None and a.collective is not None:
                    cpu_colls.append(_collective(a, ts, dur))
                elif name.startswith(("gloo:", "nccl:")):
                    # torch 2.x gloo: "gloo:all_reduce" with the tensor's dims and dtype, no
                    # "Collective name" (and no record_param_comms)
                    cpu_annotated.append(_annotated_collective(name, a, ts, dur))
            tid = tid_ids.setdefault(_hashable(ev.tid), len(tid_ids))
            c_isop.append(cat != "user_annotation")
            c_ts.append(ts)
            c_dur.append(dur)
            c_name.append(nid(name))
            c_tid.append(tid)
            ext = as_int(a.external_id) if a is not None else None
            c_ext.append(-1 if ext is None else ext)
            dims = None
            if a is not None:
                dims = a.input_dims if a.input_dims is not None else a.input_dims_old
            if dims is not None and cat != "user_annotation":
                cost = op_cost(name, dims, a.input_type, a.concrete)
                c_shapes.append(True)
                if cost is not None:
                    c_shape_txt[len(c_flops)] = str(dims)
                    c_flops.append(cost.flops)
                    c_bytes.append(cost.bytes)
                    c_dtype.append(nid(cost.dtype))
                    c_model.append(cost.model_flop)
                    c_kind.append(cost.kind)
                    continue
            else:
                c_shapes.append(False)
            c_flops.append(nan)
            c_bytes.append(nan)
            c_dtype.append(-1)
            c_model.append(False)
            c_kind.append(0)

    rank, world, backend = rank_of(dist, rank_hint, path)
    dev_name = dev_mem = None
    if props:
        p0 = props[0]
        dev_name = p0.name if isinstance(p0.name, str) else None
        dev_mem = as_int(p0.totalGlobalMem)

    warnings: list[str] = []
    if dropped_neg:
        warnings.append(f"rank {rank}: dropped {dropped_neg} events with a negative duration")
    if dropped_missing:
        warnings.append(f"rank {rank}: dropped {dropped_missing} events without a timestamp or duration")
    if dropped_long:
        warnings.append(f"rank {rank}: dropped {dropped_long} events with implausible durations (longer "
                        f"than {MAX_EVENT_US / 3.6e9:.0f} h in a trace of a few steps: a corrupt or "
                        "hand-edited trace)")
    if salvage_dropped is not None:
        warnings.append(f"rank {rank}: the trace is not valid JSON (torch writes names containing "
                        f"'\"' unescaped); read it event by event and dropped {salvage_dropped} "
                        "unreadable events")

    gpu_ts = np.asarray(g_ts, dtype=np.float64)
    gpu_corr = np.asarray(g_corr, dtype=np.int64)
    no_launch = (nan, -1)
    launch = np.fromiter((rt_corr.get(c, no_launch)[0] for c in g_corr), dtype=np.float64,
                         count=len(g_corr))
    launch_tid = np.fromiter((rt_corr.get(c, no_launch)[1] for c in g_corr), dtype=np.int32,
                             count=len(g_corr))
    gpu_name = np.asarray(g_name, dtype=np.int32)
    gpu_class = _kernel_classes(gpu_name, np.asarray(g_kind, dtype=np.int8), names)

    cpu_ts = np.asarray(c_ts, dtype=np.float64)
    cpu_dur = np.asarray(c_dur, dtype=np.float64)
    cpu_tid = np.asarray(c_tid, dtype=np.int32)
    steps.sort(key=lambda s: s[1])
    is_op = np.asarray(c_isop, dtype=bool)
    return RankTrace(
        rank=rank, path=path, world_size=world, device_name=dev_name, device_memory=dev_mem,
        backend=backend, names=names,
        gpu_ts=gpu_ts, gpu_dur=np.asarray(g_dur, dtype=np.float64),
        gpu_kind=np.asarray(g_kind, dtype=np.int8), gpu_class=gpu_class, gpu_name=gpu_name,
        gpu_stream=np.asarray(g_stream, dtype=np.int64), gpu_corr=gpu_corr,
        gpu_ext=np.asarray(g_ext, dtype=np.int64), gpu_launch_ts=launch,
        gpu_launch_tid=launch_tid,
        cpu_ts=cpu_ts, cpu_dur=cpu_dur, cpu_name=np.asarray(c_name, dtype=np.int32),
        cpu_tid=cpu_tid, cpu_ext=np.asarray(c_ext, dtype=np.int64),
        cpu_flops=np.asarray(c_flops, dtype=np.float64),
        cpu_bytes=np.asarray(c_bytes, dtype=np.float64),
        cpu_dtype=np.asarray(c_dtype, dtype=np.int32),
        cpu_is_model_flop=np.asarray(c_model, dtype=bool),
        cpu_kind=np.asarray(c_kind, dtype=np.int8),
        cpu_had_shapes=np.asarray(c_shapes, dtype=bool),
        cpu_depth=_op_depth(cpu_ts, cpu_dur, cpu_tid, is_op),
        cpu_is_op=is_op,
        cpu_shape=c_shape_txt,
        steps=steps,
        dataloader=np.asarray(dataloader, dtype=np.float64).reshape(-1, 2),
        # one source only, so a collective recorded twice is not counted twice
        collectives=gpu_colls or cpu_colls or cpu_annotated,
        cpu_comm_intervals=np.asarray(cpu_comm, dtype=np.float64).reshape(-1, 2),
        dataloader_iters=sorted(dl_kinds),
        warnings=warnings,
        dropped_events=dropped_neg + dropped_missing + dropped_long,
        kept_events=kept, dropped_gpu_events=dropped_gpu, kept_gpu_events=len(g_ts),
    )


def _collective(a: EventArgs, ts: float, dur: float) -> dict[str, Any]:
    return {
        "name": str(a.collective), "ts": float(ts), "dur": float(dur),
        "in_nelems": as_int(a.in_nelems), "out_nelems": as_int(a.out_nelems),
        "group_size": as_int(a.group_size), "dtype": a.dtype if isinstance(a.dtype, str) else None,
    }


def _annotated_collective(name: str, a: EventArgs | None, ts: float, dur: float) -> dict[str, Any]:
    dims = (a.input_dims if a is not None else None) or []
    first = dims[0] if isinstance(dims, list) and dims else None
    nelems = None
    if isinstance(first, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in first):
        nelems = 1
        for x in first:
            nelems *= x
    types = a.input_type if a is not None else None
    dtype = types[0] if isinstance(types, list) and types and isinstance(types[0], str) else None
    return {"name": name.split(":", 1)[1], "ts": float(ts), "dur": float(dur),
            "in_nelems": as_int(nelems), "out_nelems": None, "group_size": None, "dtype": dtype}


def _kernel_classes(gpu_name: np.ndarray, gpu_kind: np.ndarray, names: list[str]) -> np.ndarray:
    """Class per GPU activity by HTA's name rules, evaluated once per distinct name."""
    out = np.zeros(gpu_name.size, dtype=np.int8)
    if gpu_name.size == 0:
        return out
    uniq = np.unique(gpu_name)
    table = np.zeros(int(uniq.max()) + 1, dtype=np.int8)
    for i in uniq:
        n = names[i]
        if COMM_KERNEL_RE.search(n):
            table[i] = KCLASS_COMM
        elif MEMORY_KERNEL_RE.match(n):
            table[i] = KCLASS_MEMORY
        elif OTHER_KERNEL_RE.match(n):
            table[i] = KCLASS_OTHER
    out[:] = table[gpu_name]
    out[gpu_kind != 0] = KCLASS_MEMORY  # memcpy/memset activities whatever their name
    return out


def _op_depth(ts: np.ndarray, dur: np.ndarray, tid: np.ndarray, is_op: np.ndarray) -> np.ndarray:
    """Nesting depth among operators only: user annotations wrap ops but are not ops."""
    depth = np.zeros(ts.size, dtype=np.int16)
    if is_op.any():
        depth[is_op] = _nesting_depth(ts[is_op], dur[is_op], tid[is_op])
    return depth


def _nesting_depth(ts: np.ndarray, dur: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Depth of each CPU event inside others on its thread (0 = not nested)."""
    depth = np.zeros(ts.size, dtype=np.int16)
    if ts.size == 0:
        return depth
    order = np.lexsort((-dur, ts, tid))
    ends = ts + dur
    stack: list[float] = []
    cur_tid = -1
    ts_l = ts.tolist()
    end_l = ends.tolist()
    tid_l = tid.tolist()
    depth_l = [0] * ts.size
    for i in order.tolist():
        t = tid_l[i]
        if t != cur_tid:
            stack = []
            cur_tid = t
        s = ts_l[i]
        while stack and stack[-1] <= s:
            stack.pop()
        depth_l[i] = len(stack)
        stack.append(end_l[i])
    depth[:] = depth_l
    return depth
