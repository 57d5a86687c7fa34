"""Load PyTorch profiler (Kineto) traces into compact columns, one rank at a time.

Why not ``json.load``: a rank file of a large job is hundreds of MB of JSON, and a Python
object tree of it costs 5-10x that in memory (HTA's parser pays this). We decode with
msgspec into typed structs that name only the fields the analyses read (everything else in
the document is skipped by the decoder, never materialised), then fold the structs into
numpy columns and drop them. Peak memory is the raw bytes of one rank plus its kept events.

The only exception that leaves this module is ``gpudiag.errors.TraceError``.
"""

from __future__ import annotations

import gzip
import re
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
from gpudiag.analyzers.op_flops import op_cost

from gpudiag.errors import TraceError

Num = Union[int, float]


# --- the typed view of a trace: only what we use ------------------------------------------

class _Args(msgspec.Struct, frozen=True):
    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    stream: Any = None
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_dims_old: Any = msgspec.field(default=None, name="Input dims")
    input_type: Any = msgspec.field(default=None, name="Input type")
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None


class _EventTyped(msgspec.Struct, frozen=True):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


class _DeviceProp(msgspec.Struct):
    name: Any = None
    totalGlobalMem: Any = None  # noqa: N815 (the trace's spelling)
    numSms: Any = None  # noqa: N815


class _DistInfo(msgspec.Struct):
    rank: Any = None
    world_size: Any = None
    backend: Any = None
    nccl_version: Any = None


class _TraceDoc(msgspec.Struct):
    traceEvents: Any = msgspec.UNSET  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    schemaVersion: Any = None  # noqa: N815


_EVENT_LIST = msgspec.json.Decoder(list[_EventTyped])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
# Events are decoded this many at a time: the document is first split into raw (zero-copy)
# event slices, then each batch is decoded and folded into columns before the next, so the
# decoded Python objects of only one batch are alive at any time.
DECODE_BATCH = 50_000
_DOC = msgspec.json.Decoder(_TraceDoc)
_DOC_TYPED = msgspec.json.Decoder(
    msgspec.defstruct(
        "_TraceDocTyped",
        [
            ("traceEvents", Union[list[msgspec.Raw], None], None),
            ("deviceProperties", Union[list[_DeviceProp], None], None),
            ("distributedInfo", Union[_DistInfo, None], None),
            ("schemaVersion", Any, None),
        ],
    )
)


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
    dropped_events: int = 0

    @property
    def has_gpu(self) -> bool:
        return self.gpu_ts.size > 0

    @property
    def shapes_recorded(self) -> bool:
        return bool(self.cpu_had_shapes.any())


# --- reading --------------------------------------------------------------------------

def read_trace_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise TraceError(f"{path}: corrupt or truncated gzip ({e}); re-copy the file") from None
    return raw


def _hashable(v: Any) -> Any:
    return v if isinstance(v, (int, str, float)) or v is None else repr(v)


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v == v and abs(v) < 2**62:
        v = int(v)
    elif isinstance(v, str):
        try:
            v = int(v)
        except ValueError:
            return None
    if isinstance(v, int) and -(2**62) < v < 2**62:  # fits the int64 columns
        return v
    return None


def _as_num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        f = float(v)
        return f if f == f and abs(f) != float("inf") else None
    return None


def decode_trace(data: bytes, path: str) -> tuple[Iterator[Any], Any, Any]:
    """Decode to (events, deviceProperties, distributedInfo).

    ``events`` is an iterator that decodes batch by batch. A batch with an unexpectedly typed
    field is decoded loosely instead, so one odd event (a mutated or hand-edited file) is
    dropped or read field by field rather than failing the whole file.
    """
    stripped = data.lstrip()
    if not stripped:
        raise TraceError(f"{path}: file is empty")
    try:
        if stripped[:1] == b"[":
            return _batches(_RAW_LIST.decode(data), path), None, None
        doc = _DOC_TYPED.decode(data)
        if doc.traceEvents is None:
            raise TraceError(f"{path}: not a PyTorch profiler trace (no 'traceEvents' list)")
        return _batches(doc.traceEvents, path), doc.deviceProperties, doc.distributedInfo
    except msgspec.ValidationError:
        pass
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        salvaged = _salvage(data)
        if salvaged is None:
            raise TraceError(f"{path}: invalid or truncated JSON ({e})") from None
        return salvaged
    # Loose path: the document's own fields have odd types; decode everything as plain JSON.
    try:
        doc = _DOC.decode(data) if stripped[:1] == b"{" else None
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a PyTorch profiler trace ({e})") from None
    if doc is None or not isinstance(doc.traceEvents, list):
        raise TraceError(f"{path}: not a PyTorch profiler trace (no 'traceEvents' list)")
    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else None
    props = [_DeviceProp(name=p.get("name"), totalGlobalMem=p.get("totalGlobalMem"))
             for p in (props or []) if isinstance(p, dict)]
    dist = doc.distributedInfo
    dist = _DistInfo(rank=dist.get("rank"), world_size=dist.get("world_size"),
                     backend=dist.get("backend")) if isinstance(dist, dict) else None
    return iter([_loose_event(e) for e in doc.traceEvents]), props, dist


# Kineto writes one event per block starting with "  {" on its own line.
_EVENT_START = re.compile(rb"\n[ \t]*\{")


def _salvage(data: bytes) -> tuple[Iterator[Any], Any, Any] | None:
    """Events of a complete document that is not valid JSON, one block at a time.

    torch writes annotation names containing '"' unescaped (seen with torch 2.13 and
    record_function('"x')), which makes the whole file invalid JSON although every other
    event is fine. Only complete documents are salvaged: a truncated file stays an error.
    Dropped events are reported through the ``_SALVAGE_DROPPED`` marker event.
    """
    body = data.rstrip()
    start = data.find(b'"traceEvents"')
    if start < 0 or not body.endswith(b"}"):
        return None
    open_bracket = data.find(b"[", start)
    end = data.rfind(b"]")
    if open_bracket < 0 or end <= open_bracket:
        return None
    try:
        head = _DOC_TYPED.decode(data[:start] + b'"traceEvents": []}')
        props, dist = head.deviceProperties, head.distributedInfo
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        props, dist = None, None
    section = data[open_bracket + 1:end]
    cuts = [m.start() for m in _EVENT_START.finditer(section)]
    if not cuts:
        return None
    events: list[Any] = []
    dropped = 0
    for a, b in zip(cuts, [*cuts[1:], len(section)], strict=True):
        chunk = section[a:b].strip().rstrip(b",").strip()
        if not chunk:
            continue
        try:
            events.append(msgspec.json.decode(chunk, type=_EventTyped))
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            try:
                events.append(_loose_event(msgspec.json.decode(chunk)))
            except (msgspec.DecodeError, UnicodeDecodeError):
                dropped += 1
    if not events:
        return None
    events.append(_EventTyped(ph="gpudiag-salvage", name=str(dropped)))
    return iter(events), props, dist


def _batches(raw: list[msgspec.Raw], path: str) -> Iterator[Any]:
    for i in range(0, len(raw), DECODE_BATCH):
        chunk = raw[i:i + DECODE_BATCH]
        blob = b"[" + b",".join(chunk) + b"]"
        try:
            try:
                events = _EVENT_LIST.decode(blob)
            except msgspec.ValidationError:
                events = [_loose_event(e) for e in msgspec.json.decode(blob)]
        except (msgspec.DecodeError, UnicodeDecodeError) as e:
            raise TraceError(f"{path}: invalid JSON inside traceEvents ({e})") from None
        del blob
        yield from events


def _loose_event(raw: Any) -> Any:
    if not isinstance(raw, dict):
        return _EventTyped()
    args = raw.get("args")
    targs = None
    if isinstance(args, dict):
        targs = _Args(
            external_id=args.get("External id"), correlation=args.get("correlation"),
            stream=args.get("stream"), input_dims=args.get("Input Dims"),
            input_dims_old=args.get("Input dims"), input_type=args.get("Input type"),
            collective=args.get("Collective name"), in_nelems=args.get("In msg nelems"),
            out_nelems=args.get("Out msg nelems"), group_size=args.get("Group size"),
            dtype=args.get("dtype"),
        )
    return _EventTyped(ph=raw.get("ph"), cat=raw.get("cat"), name=raw.get("name"),
                       pid=raw.get("pid"), tid=raw.get("tid"), ts=raw.get("ts"),
                       dur=raw.get("dur"), args=targs)


def load_rank(path: Path, rank_hint: int | None = None) -> RankTrace:
    """Read one rank file into columns. Raises TraceError on anything unusable."""
    data = read_trace_bytes(path)
    events, props, dist = decode_trace(data, str(path))
    del data
    return _fold(events, props, dist, str(path), rank_hint)


def _fold(events: Iterator[Any], props: Any, dist: Any, path: str, rank_hint: int | None) -> RankTrace:
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
    dropped_neg = dropped_missing = 0
    nan = float("nan")

    salvage_dropped = None
    for ev in events:
        if ev.ph != "X":
            if ev.ph == "gpudiag-salvage":
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
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts != ts:
            dropped_missing += 1
            continue
        if not isinstance(dur, (int, float)) or isinstance(dur, bool) or dur != dur:
            dropped_missing += 1
            continue
        if dur < 0:
            dropped_neg += 1
            continue
        a = ev.args
        if gk is not None:
            name = ev.name
            g_ts.append(ts)
            g_dur.append(dur)
            g_kind.append(gk)
            g_name.append(nid(name))
            stream = _as_int(a.stream) if a is not None else None
            g_stream.append(-1 if stream is None else stream)
            corr = _as_int(a.correlation) if a is not None else None
            g_corr.append(-1 if corr is None else corr)
            ext = _as_int(a.external_id) if a is not None else None
            g_ext.append(-1 if ext is None else ext)
            if a is not None and a.collective is not None and gk == 0:
                gpu_colls.append(_collective(a, ts, dur))
        elif is_rt:
            corr = _as_int(a.correlation) if a is not None else None
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
            ext = _as_int(a.external_id) if a is not None else None
            c_ext.append(-1 if ext is None else ext)
            dims = None
            if a is not None:
                dims = a.input_dims if a.input_dims is not None else a.input_dims_old
            if dims is not None and cat != "user_annotation":
                cost = op_cost(name, dims, a.input_type)
                c_shapes.append(True)
                if cost is not None:
                    c_shape_txt[len(c_flops)] = str(dims)
                    c_flops.append(cost.flops)
                    c_bytes.append(cost.bytes)
                    c_dtype.append(nid(cost.dtype))
                    c_model.append(cost.model_flop)
                    continue
            else:
                c_shapes.append(False)
            c_flops.append(nan)
            c_bytes.append(nan)
            c_dtype.append(-1)
            c_model.append(False)

    rank, world, backend = _rank_of(dist, rank_hint, path)
    dev_name = dev_mem = None
    if props:
        p0 = props[0]
        dev_name = p0.name if isinstance(p0.name, str) else None
        dev_mem = _as_int(p0.totalGlobalMem)

    warnings: list[str] = []
    if dropped_neg:
        warnings.append(f"rank {rank}: dropped {dropped_neg} events with a negative duration")
    if dropped_missing:
        warnings.append(f"rank {rank}: dropped {dropped_missing} events without a timestamp or duration")
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
        dropped_events=dropped_neg + dropped_missing,
    )


def _collective(a: _Args, ts: float, dur: float) -> dict[str, Any]:
    return {
        "name": str(a.collective), "ts": float(ts), "dur": float(dur),
        "in_nelems": _as_int(a.in_nelems), "out_nelems": _as_int(a.out_nelems),
        "group_size": _as_int(a.group_size), "dtype": a.dtype if isinstance(a.dtype, str) else None,
    }


def _annotated_collective(name: str, a: _Args | None, ts: float, dur: float) -> dict[str, Any]:
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
            "in_nelems": _as_int(nelems), "out_nelems": None, "group_size": None, "dtype": dtype}


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


_RANK_FROM_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def _rank_of(dist: Any, rank_hint: int | None, path: str) -> tuple[int, int | None, str | None]:
    rank = world = None
    backend = None
    if dist is not None:
        rank = _as_int(dist.rank)
        world = _as_int(dist.world_size)
        backend = dist.backend if isinstance(dist.backend, str) else None
    if rank is None:
        m = _RANK_FROM_NAME.search(Path(path).name)
        rank = int(m.group(1)) if m else rank_hint
    return (0 if rank is None else rank), world, backend


# --- finding rank files ------------------------------------------------------------------

TRACE_SUFFIXES = (".json", ".json.gz")


def find_trace_files(target: Path) -> list[Path]:
    """Trace files for a file, a folder of rank files, or a gpudiag run directory."""
    if not target.exists():
        raise TraceError(f"{target}: no such file or directory")
    if target.is_file():
        return [target]
    if (target / "run.json").is_file() and (target / "traces").is_dir():
        target = target / "traces"
    files = sorted(p for p in target.iterdir()
                   if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                   and p.name not in ("run.json", "diagnosis.json"))
    if not files:
        raise TraceError(f"{target}: no trace files (*.json, *.json.gz) in this folder")
    return files


def check_unique_ranks(ranks: list[tuple[int, str]]) -> None:
    seen: dict[int, str] = {}
    for rank, path in ranks:
        if rank in seen:
            raise TraceError(
                f"two files claim rank {rank}: {seen[rank]} and {path}; "
                "keep one trace per rank in the folder"
            )
        seen[rank] = path
