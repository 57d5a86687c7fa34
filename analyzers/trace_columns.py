"""The columns of one rank (``RankTrace``): what every analysis reads, and how events map
onto them (categories, kernel classes, steps, DataLoader waits, collectives, op nesting).

``trace_fold`` fills them from decoded events; these definitions are shared with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from gpudiag.analyzers.trace_decode import EventArgs, as_int

# --- event kinds ------------------------------------------------------------------------

# Category codes. GPU activities (current and PyTorch 1.8-1.9 spelling) are 1-3 (kind + 1:
# kernel, memcpy, memset), runtime calls 4, CPU operators and annotations 5-7; 0 is skipped.
class _Codes(dict):
    """Category -> code; any other category (or none) is 0, remembered after its first lookup
    so that lookups stay in C."""

    def __missing__(self, key: Any) -> int:
        self[key] = 0
        return 0

    def copy(self) -> _Codes:
        return _Codes(self)


CATEGORY_CODE = _Codes({
    "kernel": 1, "Kernel": 1, "gpu_memcpy": 2, "Memcpy": 2, "gpu_memset": 3, "Memset": 3,
    "cuda_runtime": 4, "Runtime": 4, "cuda_driver": 4,
    "cpu_op": 5, "Operator": 5, "user_annotation": 6, "python_function": 7,
})
CODE_RUNTIME, CODE_CPU_OP, CODE_ANNOTATION, CODE_PYFUNC = 4, 5, 6, 7

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
CPU_COMM_RE = re.compile(r"^(record_param_comms|c10d::|nccl:|gloo:)")


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
    cpu_is_op: np.ndarray  # bool: an operator (cpu_op), not a user annotation
    cpu_shape: np.ndarray  # index into names of the "Input Dims" text of costed ops; -1 none
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
    # runtime calls that blocked the host until the device was done (cudaStreamSynchronize,
    # cudaDeviceSynchronize, a blocking cudaMemcpy, ...: ``trace_fold.HOST_SYNC_CALLS``)
    sync_ts: np.ndarray = field(default_factory=lambda: np.empty(0))
    sync_dur: np.ndarray = field(default_factory=lambda: np.empty(0))
    sync_tid: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    # nesting depth among cpu ops on the same thread (0 = top level): see ``cpu_depth``
    _depth: np.ndarray | None = field(default=None, repr=False)

    @property
    def cpu_depth(self) -> np.ndarray:
        """Nesting depth of each CPU event among the operators of its thread (0 = top level).
        Computed on first use: only CPU-only traces need it (a sort of every CPU op, a tenth
        of the analysis of a GPU trace that never reads it)."""
        if self._depth is None:
            self._depth = op_depth(self.cpu_ts, self.cpu_dur, self.cpu_tid, self.cpu_is_op)
        return self._depth

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

def collective_record(a: EventArgs, ts: float, dur: float) -> dict[str, Any]:
    """A collective from the args of an NCCL kernel or a ``record_param_comms`` op."""
    return {
        "name": str(a.collective), "ts": float(ts), "dur": float(dur),
        "in_nelems": as_int(a.in_nelems), "out_nelems": as_int(a.out_nelems),
        "group_size": as_int(a.group_size), "dtype": a.dtype,
    }


def annotated_collective(name: str, a: EventArgs, ts: float, dur: float) -> dict[str, Any]:
    """torch 2.x gloo: "gloo:all_reduce" with the tensor's dims and dtype, no "Collective
    name" (and no record_param_comms)."""
    dims = _parse(a.input_dims) or []
    first = dims[0] if isinstance(dims, list) and dims else None
    nelems = None
    if isinstance(first, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in first):
        nelems = 1
        for x in first:
            nelems *= x
    types = _parse(a.input_type)
    dtype = types[0] if isinstance(types, list) and types and isinstance(types[0], str) else None
    return {"name": name.split(":", 1)[1], "ts": float(ts), "dur": float(dur),
            "in_nelems": as_int(nelems), "out_nelems": None, "group_size": None, "dtype": dtype}


def _parse(raw: msgspec.Raw) -> Any:
    if not len(raw):
        return None
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):  # raw values are not UTF-8 checked
        return None


def kernel_classes(gpu_name: np.ndarray, gpu_kind: np.ndarray, names: list[str]) -> np.ndarray:
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


def op_depth(ts: np.ndarray, dur: np.ndarray, tid: np.ndarray, is_op: np.ndarray) -> np.ndarray:
    """Nesting depth among operators only: user annotations wrap ops but are not ops."""
    depth = np.zeros(ts.size, dtype=np.int16)
    if is_op.any():
        depth[is_op] = _nesting_depth(ts[is_op], dur[is_op], tid[is_op])
    return depth


def _nesting_depth(ts: np.ndarray, dur: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Depth of each CPU event inside others on its thread (0 = not nested).

    The definition is a stack walk in (thread, start, longest first) order: pop what ended at
    or before this start, the depth is what stays open. Walked in Python it cost 0.4 us per op
    (a fifth of the decode time of a CPU-heavy trace), so it is counted with numpy instead:
    depth = ops before it on the thread - those that ended by its start. The two agree
    whenever every op ends no later than the op it opened inside (a stack whose ends never
    increase pops exactly what has ended); that is checked, and the walk is kept for the
    threads of a trace where it does not hold (clock rounding can end a child after its
    parent).
    """
    depth = np.zeros(ts.size, dtype=np.int16)
    if ts.size == 0:
        return depth
    order = np.lexsort((-dur, ts, tid))
    s, d, t = ts[order], dur[order], tid[order]
    e = s + d
    bounds = np.flatnonzero(np.diff(t)) + 1
    out = np.empty(ts.size, dtype=np.int64)
    for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), ts.size], strict=True):
        got = _counted_depth(s[lo:hi], d[lo:hi], e[lo:hi])
        out[lo:hi] = got if got is not None else _walked_depth(s[lo:hi], e[lo:hi])
    depth[order] = out
    return depth


def _counted_depth(s: np.ndarray, d: np.ndarray, e: np.ndarray) -> np.ndarray | None:
    """Depths of one thread's ops (sorted by start, longest first) by counting; None when
    the stack walk could disagree."""
    n = s.size
    pos = np.arange(n)
    ended = np.searchsorted(np.sort(e), s, side="right")  # all ops with end <= this start
    # ...less those at or after this one: zero-length ops starting at the same time, which
    # sort last among the ops of that start
    run_end = np.searchsorted(s, s, side="right")
    run_start = np.searchsorted(s, s, side="left")
    zeros = np.concatenate(([0], np.cumsum(d == 0)))
    z_in_run = zeros[run_end] - zeros[run_start]
    ended -= run_end - np.maximum(pos, run_end - z_in_run)
    depth = pos - ended
    if depth.min(initial=0) < 0 or depth.max(initial=0) > np.iinfo(np.int16).max:
        return None
    # the op each one opened inside is the last op before it one level up: it must not end first
    for k in range(1, int(depth.max(initial=0)) + 1):
        kids = np.flatnonzero(depth == k)
        ups = np.flatnonzero(depth == k - 1)
        j = np.searchsorted(ups, kids) - 1
        if (j < 0).any() or (e[kids] > e[ups[j]]).any():
            return None
    return depth


def _walked_depth(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    stack: list[float] = []
    out = []
    for start, end in zip(s.tolist(), e.tolist(), strict=True):
        while stack and stack[-1] <= start:
            stack.pop()
        out.append(len(stack))
        stack.append(end)
    return np.asarray(out, dtype=np.int64)
