"""Fold batches of decoded events into the columns of one rank (``RankTrace``).

Why column-wise: a per-event Python loop with a branch per category cost 2.5x the decode
itself (profiled on an 83 MB rank: 1.2 s of folding after 0.8 s of decoding). Here each field
is pulled out of a whole batch at once, in C (``_gather.c``: straight from the structs' slots,
3.5x what ``np.fromiter(map(attrgetter(...)))`` managed, which had cost as much as the decode),
events are classified with numpy masks and per-name tables (a name is classified once, not
once per event), and each batch leaves a few small arrays, so its decoded objects are dropped
before the next batch is read. Operator costs (``op_flops``) are cached by (name, raw shapes):
shapes repeat every step, so N traced steps parse and cost each distinct call once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, cast

import msgspec
import numpy as np

from gpudiag.analyzers.op_args import KIND_MODEL
from gpudiag.analyzers.op_flops import op_cost
from gpudiag.analyzers.trace_columns import (
    CATEGORY_CODE,
    CODE_ANNOTATION,
    CODE_PYFUNC,
    CODE_RUNTIME,
    CPU_COMM_RE,
    DATALOADER_PREFIX,
    DATALOADER_SUFFIX,
    MAX_EVENT_US,
    STEP_RE,
    RankTrace,
    annotated_collective,
    collective_record,
    kernel_classes,
)
from gpudiag.analyzers.trace_decode import NO_ID, Event, as_int, rank_of

try:
    from gpudiag.analyzers._gather import gather
except ImportError:  # installed without a C compiler (the extension is optional), or never built
    import sys

    from gpudiag.analyzers.gather_py import gather
    print("gpudiag: warning: the C column reader (analyzers/_gather.c) is not built, so traces "
          "load about 2.5x slower: reinstall gpudiag where a C compiler and Python's headers are "
          "present", file=sys.stderr)

# Per-name flags, computed once per distinct name.
_F_DATALOADER, _F_COMM, _F_ANNOT_COMM, _F_HOST_SYNC = 1, 2, 4, 8
# Runtime and driver calls that block the host until the device is done (CUDA and HIP): the
# host syncs ``analyzers.syncs`` counts on a GPU beside the operators that cause them.
HOST_SYNC_CALLS = frozenset(
    f"{p}{c}" for p in ("cuda", "hip") for c in
    ("DeviceSynchronize", "StreamSynchronize", "EventSynchronize", "Memcpy", "Memcpy2D",
     "MemcpyFromSymbol", "StreamQuery_blocking")) | {"cuCtxSynchronize", "cuStreamSynchronize",
                                                     "cuEventSynchronize", "cuMemcpyDtoH_v2"}


def column(events: Sequence[Event], idx: np.ndarray | None, attrs: tuple[str, ...], kind: str,
           dtype: Any, arg: Any = None) -> np.ndarray:
    """One field of ``events[idx]`` (every event for None) as a numpy column (``_gather.c``
    says what each ``kind`` writes)."""
    out = np.empty(len(events) if idx is None else idx.size, dtype=dtype)
    gather(out, events, idx, attrs, kind, arg)
    return out


class _Table(dict[Any, int]):
    """Value -> id; a miss calls ``new(value)`` once and remembers its answer, so that the
    common case, a value seen before, is a dict lookup in C."""

    def __init__(self, new: Callable[[Any], int]) -> None:
        super().__init__()
        self._new = new

    def __missing__(self, key: Any) -> int:
        i = self[key] = self._new(key)
        return i


class ColumnBuilder:
    """Accumulates one rank's columns, batch by batch (``add``), then ``finish``."""

    def __init__(self) -> None:
        self._codes = CATEGORY_CODE.copy()
        self.names: list[str] = []
        self._name_id = _Table(self._new_name)
        self._step_of: list[int] = []  # per name: ProfilerStep number, -1 if not a step
        self._flags: list[int] = []
        self._tid_id = _Table(lambda _tid: len(self._tid_id))
        self._cost_id: dict[tuple[Any, ...], int] = {}
        # cost table: one row per distinct costed call (flops, bytes, dtype, kind, shape text);
        # its strings join the name table after the events' names, so that the table is in
        # file order whatever the batches
        self._costs: list[tuple[float, float, str, int, str]] = []
        self.parts: dict[str, list[np.ndarray]] = defaultdict(list)
        self.steps: list[tuple[int, float, float]] = []
        self.dataloader: list[tuple[float, float]] = []
        self.dl_kinds: set[str] = set()
        self.cpu_comm: list[tuple[float, float]] = []
        self.gpu_colls: list[dict[str, Any]] = []
        self.cpu_colls: list[dict[str, Any]] = []
        self.cpu_annotated: list[dict[str, Any]] = []
        self.dropped_neg = self.dropped_missing = self.dropped_long = self.dropped_gpu = 0
        self.kept = 0

    # --- interning ----------------------------------------------------------------------

    def _intern(self, name: str) -> int:
        return self._name_id[name]

    def _new_name(self, name: str) -> int:
        """Called by the name table on a miss: the name's id, and its classification."""
        if not isinstance(name, str):
            return -1  # no name (the table maps it to -1 from now on)
        i = len(self.names)
        self.names.append(name)
        m = STEP_RE.match(name) if name.startswith("ProfilerStep") else None
        self._step_of.append(int(m.group(1)) if m else -1)
        f = 0
        if name.startswith(DATALOADER_PREFIX) and name.endswith(DATALOADER_SUFFIX):
            f |= _F_DATALOADER
        if name in HOST_SYNC_CALLS:
            f |= _F_HOST_SYNC
        if CPU_COMM_RE.match(name):
            f |= _F_COMM
            if name.startswith(("gloo:", "nccl:")):
                f |= _F_ANNOT_COMM
        self._flags.append(f)
        return i

    # --- one batch --------------------------------------------------------------------------

    def add(self, events: list[Event]) -> None:
        if not events:
            return
        code = column(events, None, ("cat",), "b", np.int8, self._codes)
        sel = np.flatnonzero(code)  # positions in ``events`` of the categories kept
        if sel.size == 0:
            return
        code = code[sel]
        names = column(events, sel, ("name",), "i", np.int32, self._name_id)  # -1: no name
        ok = (names >= 0) & column(events, sel, ("ph",), "e", bool, "X")
        ts = column(events, sel, ("ts",), "d", np.float64)
        dur = column(events, sel, ("dur",), "d", np.float64)
        is_gpu = code <= 3
        missing = ok & (np.isnan(ts) | np.isnan(dur))
        neg = ok & ~missing & (dur < 0)
        long = ok & ~missing & (dur > MAX_EVENT_US)
        bad = missing | neg | long
        if bad.any():
            self.dropped_missing += int(missing.sum())
            self.dropped_neg += int(neg.sum())
            self.dropped_long += int(long.sum())
            self.dropped_gpu += int((is_gpu & bad).sum())
        keep = ok & ~bad
        self.kept += int(keep.sum())
        g = np.flatnonzero(keep & is_gpu)
        if g.size:
            self._add_gpu(events, sel[g], code[g] - 1, names[g], ts[g], dur[g])
        host = keep & ~is_gpu
        if not host.any():
            return
        # thread ids in file order, whatever the batches: the same trace gives the same ids
        tids = np.full(sel.size, -1, dtype=np.int32)
        h = np.flatnonzero(host)
        tids[h] = column(events, sel[h], ("tid",), "i", np.int32, self._tid_id)
        r = np.flatnonzero(keep & (code == CODE_RUNTIME))
        if r.size:
            self._add_runtime(events, sel[r], ts[r], tids[r])
            sync = r[(np.asarray(self._flags, dtype=np.int8)[names[r]] & _F_HOST_SYNC) != 0]
            if sync.size:
                self.parts["s_ts"].append(ts[sync])
                self.parts["s_dur"].append(dur[sync])
                self.parts["s_tid"].append(tids[sync])
        c = np.flatnonzero(keep & (code > CODE_RUNTIME))
        if c.size:
            self._add_cpu(events, sel[c], code[c], names[c], ts[c], dur[c], tids[c])

    def _add_gpu(self, events: list[Event], pos: np.ndarray, kind: np.ndarray, names: np.ndarray,
                 ts: np.ndarray, dur: np.ndarray) -> None:
        p = self.parts
        p["g_ts"].append(ts)
        p["g_dur"].append(dur)
        p["g_kind"].append(kind.astype(np.int8))
        p["g_name"].append(names)
        p["g_stream"].append(column(events, pos, ("args", "stream"), "q", np.int64))
        p["g_corr"].append(column(events, pos, ("args", "correlation"), "q", np.int64))
        p["g_ext"].append(column(events, pos, ("args", "external_id"), "q", np.int64))
        coll = column(events, pos, ("args", "collective"), "n", bool)
        for i in np.flatnonzero(coll & (kind == 0)).tolist():
            self.gpu_colls.append(collective_record(events[pos[i]].args, ts[i], dur[i]))

    def _add_runtime(self, events: list[Event], pos: np.ndarray, ts: np.ndarray,
                     tids: np.ndarray) -> None:
        corr = column(events, pos, ("args", "correlation"), "q", np.int64)
        has = corr != NO_ID
        self.parts["r_corr"].append(corr[has])
        self.parts["r_ts"].append(ts[has])
        self.parts["r_tid"].append(tids[has])

    def _add_cpu(self, events: list[Event], pos: np.ndarray, code: np.ndarray, names: np.ndarray,
                 ts: np.ndarray, dur: np.ndarray, tids: np.ndarray) -> None:
        """The CPU events ``events[pos]``: steps and DataLoader waits are picked out by their
        names' flags first, so only the events kept as rows have their other fields read."""
        step = np.asarray(self._step_of, dtype=np.int64)[names]
        flags = np.asarray(self._flags, dtype=np.int8)[names]
        is_step = step >= 0
        for i in np.flatnonzero(is_step).tolist():
            self.steps.append((int(step[i]), float(ts[i]), float(ts[i] + dur[i])))
        is_dl = ~is_step & ((flags & _F_DATALOADER) != 0)
        for i in np.flatnonzero(is_dl).tolist():
            self.dataloader.append((float(ts[i]), float(ts[i] + dur[i])))
            name = self.names[names[i]]
            self.dl_kinds.add(name[len(DATALOADER_PREFIX):-len(DATALOADER_SUFFIX)])
        rows = np.flatnonzero(~is_step & ~is_dl & (code != CODE_PYFUNC))
        if rows.size == 0:
            return
        if rows.size < pos.size:
            pos = pos[rows]
            code, ts, dur, names, flags = code[rows], ts[rows], dur[rows], names[rows], flags[rows]
            tids = tids[rows]
        for i in np.flatnonzero((flags & _F_COMM) != 0).tolist():
            a = events[pos[i]].args
            self.cpu_comm.append((float(ts[i]), float(ts[i] + dur[i])))
            if a.collective is not None:
                self.cpu_colls.append(collective_record(a, ts[i], dur[i]))
            elif flags[i] & _F_ANNOT_COMM:
                self.cpu_annotated.append(annotated_collective(self.names[names[i]], a, ts[i], dur[i]))
        is_op = code != CODE_ANNOTATION
        cost, had = self._costs_of(events, pos, names, is_op)
        p = self.parts
        p["c_ts"].append(ts)
        p["c_dur"].append(dur)
        p["c_name"].append(names)
        p["c_tid"].append(tids)
        p["c_ext"].append(column(events, pos, ("args", "external_id"), "q", np.int64))
        p["c_cost"].append(cost)
        p["c_shapes"].append(had)
        p["c_isop"].append(is_op)

    def _costs_of(self, events: list[Event], pos: np.ndarray, names: np.ndarray, is_op: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """(cost row or -1, shapes recorded) per CPU event ``events[pos]``; annotations are never
        costed."""
        cost = np.full(pos.size, -1, dtype=np.int32)
        # PyTorch 1.8's spelling where a batch has none of today's (a trace has one or the other)
        dims = "input_dims"
        lens = column(events, pos, ("args", dims), "l", np.int64)
        if not lens.any():
            dims = "input_dims_old"
            lens = column(events, pos, ("args", dims), "l", np.int64)
        had = (lens > 0) & is_op
        rows = np.flatnonzero(had)
        if rows.size == 0:
            return cost, had
        sub = [events[j].args for j in pos[rows].tolist()]
        keys = [(n, bytes(getattr(a, dims)), bytes(a.input_type), bytes(a.concrete))
                for n, a in zip(names[rows].tolist(), sub, strict=True)]
        found = list(map(self._cost_id.get, keys))
        cost[rows] = ([self._cost(k) if i is None else i for k, i in zip(keys, found, strict=True)]
                      if None in found else cast("list[int]", found))
        return cost, had

    def _cost(self, key: tuple[int, bytes, bytes, bytes]) -> int:
        i = self._cost_id.get(key)
        if i is None:
            name, dims, types, concrete = key
            c = op_cost(self.names[name], _json(dims), _json(types), _json(concrete))
            if c is None:
                i = -1
            else:
                i = len(self._costs)
                self._costs.append((c.flops, c.bytes, c.dtype, c.kind, str(_json(dims))))
            self._cost_id[key] = i
        return i

    # --- the rank --------------------------------------------------------------------------

    def _col(self, key: str, dtype: Any) -> np.ndarray:
        parts = self.parts.pop(key, [])
        if not parts:
            return np.empty(0, dtype=dtype)
        return np.concatenate(parts).astype(dtype, copy=False)

    def finish(self, props: Any, dist: Any, path: str, rank_hint: int | None,
               salvage_dropped: int | None = None) -> RankTrace:
        rank, world, backend = rank_of(dist, rank_hint, path)
        dev_name = dev_mem = None
        if props:
            p0 = props[0]
            dev_name = p0.name if isinstance(p0.name, str) else None
            dev_mem = as_int(p0.totalGlobalMem)
        warnings = self._warnings(rank, salvage_dropped)

        gpu_ts = self._col("g_ts", np.float64)
        gpu_kind = self._col("g_kind", np.int8)
        gpu_name = self._col("g_name", np.int32)
        gpu_corr = self._col("g_corr", np.int64)
        launch, launch_tid = _join_launches(gpu_corr, self._col("r_corr", np.int64),
                                            self._col("r_ts", np.float64),
                                            self._col("r_tid", np.int32))
        cpu_ts = self._col("c_ts", np.float64)
        cpu_dur = self._col("c_dur", np.float64)
        cpu_tid = self._col("c_tid", np.int32)
        is_op = self._col("c_isop", bool)
        per_op = self._per_op(self._col("c_cost", np.int32))
        kind = per_op(3, 0, np.int8)
        self.steps.sort(key=lambda s: s[1])
        return RankTrace(
            rank=rank, path=path, world_size=world, device_name=dev_name, device_memory=dev_mem,
            backend=backend, names=self.names,
            gpu_ts=gpu_ts, gpu_dur=self._col("g_dur", np.float64),
            gpu_kind=gpu_kind, gpu_class=kernel_classes(gpu_name, gpu_kind, self.names),
            gpu_name=gpu_name, gpu_stream=self._col("g_stream", np.int64), gpu_corr=gpu_corr,
            gpu_ext=self._col("g_ext", np.int64), gpu_launch_ts=launch, gpu_launch_tid=launch_tid,
            cpu_ts=cpu_ts, cpu_dur=cpu_dur, cpu_name=self._col("c_name", np.int32),
            cpu_tid=cpu_tid, cpu_ext=self._col("c_ext", np.int64),
            cpu_flops=per_op(0, np.nan, np.float64), cpu_bytes=per_op(1, np.nan, np.float64),
            cpu_dtype=per_op(2, -1, np.int32), cpu_is_model_flop=kind == KIND_MODEL,
            cpu_kind=kind, cpu_had_shapes=self._col("c_shapes", bool),
            cpu_is_op=is_op,
            cpu_shape=per_op(4, -1, np.int32),
            steps=self.steps,
            dataloader=np.asarray(self.dataloader, dtype=np.float64).reshape(-1, 2),
            # one source only, so a collective recorded twice is not counted twice
            collectives=self.gpu_colls or self.cpu_colls or self.cpu_annotated,
            cpu_comm_intervals=np.asarray(self.cpu_comm, dtype=np.float64).reshape(-1, 2),
            dataloader_iters=sorted(self.dl_kinds),
            warnings=warnings,
            dropped_events=self.dropped_neg + self.dropped_missing + self.dropped_long,
            kept_events=self.kept, dropped_gpu_events=self.dropped_gpu,
            kept_gpu_events=int(gpu_ts.size),
            sync_ts=self._col("s_ts", np.float64), sync_dur=self._col("s_dur", np.float64),
            sync_tid=self._col("s_tid", np.int32),
        )

    def _per_op(self, cost: np.ndarray) -> Callable[[int, float, Any], np.ndarray]:
        """A reader of one column of the operators' costs (flops, bytes, dtype, kind, shape),
        one value per CPU event (``fill`` where the event was not costed). The cost table's
        dtype and shape strings are interned into the names as the table is built."""
        table = np.array([(f, b, self._intern(dt), k, self._intern(sh))
                          for f, b, dt, k, sh in self._costs], dtype=np.float64).reshape(-1, 5)
        costed = cost >= 0
        ci = cost[costed]

        def per_op(col: int, fill: float, dtype: Any) -> np.ndarray:
            out = np.full(cost.size, fill, dtype=np.float64)
            out[costed] = table[ci, col]
            return out.astype(dtype)

        return per_op

    def _warnings(self, rank: int, salvage_dropped: int | None) -> list[str]:
        w: list[str] = []
        if self.dropped_neg:
            w.append(f"rank {rank}: dropped {self.dropped_neg} events with a negative duration")
        if self.dropped_missing:
            w.append(f"rank {rank}: dropped {self.dropped_missing} events without a timestamp or "
                     "duration")
        if self.dropped_long:
            w.append(f"rank {rank}: dropped {self.dropped_long} events with implausible durations "
                     f"(longer than {MAX_EVENT_US / 3.6e9:.0f} h in a trace of a few steps: a corrupt "
                     "or hand-edited trace)")
        if salvage_dropped is not None:
            w.append(f"rank {rank}: the trace is not valid JSON (torch writes names containing "
                     f"'\"' unescaped); read it event by event and dropped {salvage_dropped} "
                     "unreadable events")
        return w


def _json(raw: bytes) -> Any:
    """A raw argument (shapes, types) parsed; None when absent or unreadable (msgspec checks a
    raw value's syntax while skipping it, not the UTF-8 inside its strings)."""
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None


def _join_launches(gpu_corr: np.ndarray, r_corr: np.ndarray, r_ts: np.ndarray,
                   r_tid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ts, thread) of the runtime call that launched each GPU activity (same correlation id;
    the last such call in the file if several); NaN / -1 when there is none."""
    launch = np.full(gpu_corr.size, np.nan)
    tid = np.full(gpu_corr.size, -1, dtype=np.int32)
    if gpu_corr.size == 0 or r_corr.size == 0:
        return launch, tid
    order = np.argsort(r_corr, kind="stable")
    sc = r_corr[order]
    last = np.ones(sc.size, dtype=bool)
    last[:-1] = sc[1:] != sc[:-1]  # the last of each run of equal ids (file order kept)
    order, sc = order[last], sc[last]
    k = np.searchsorted(sc, gpu_corr)
    k_ok = np.clip(k, 0, sc.size - 1)
    hit = (k < sc.size) & (sc[k_ok] == gpu_corr) & (gpu_corr != NO_ID)
    launch[hit] = r_ts[order[k_ok[hit]]]
    tid[hit] = r_tid[order[k_ok[hit]]]
    return launch, tid
