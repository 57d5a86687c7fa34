"""Host syncs inside the profiled job: which calls read device values back, where, and at what cost.

Loaded by ``torch_bootstrap`` from the file beside it (standard library and torch only). A
*sync* here is a call that makes the host wait for the device's result: ``.item()``,
``bool(t)`` (``if t > 0:``), ``float(t)``, ``.tolist()``, ``.numpy()``, ``.cpu()``, printing or
formatting a tensor, ``torch.cuda.synchronize``, and the operators whose output shape depends
on the data (``nonzero``, ``masked_select``, ``unique``, boolean-mask indexing), which must
read a count back before they can allocate. On a GPU each one drains the queue: the device
then idles while the host catches up. On a CPU nothing is queued, so a sync costs only its
host work: the call, and the operators computed only to feed it (``h.abs().max()`` in
``h.abs().max().item()``), which go when the line goes. Not counted: such calls inside a
DataLoader's fetch (a dataset making its samples is input work, inside the input wait), and on
a GPU job the reads of tensors already on the host (they wait for nothing).

How: a ``TorchFunctionMode`` pushed on the training thread for ONE step, the profiler's
warm-up step (already marked in the step rows and left out of every reference, so the
census's own cost never reaches a number; ``--skip`` large means no window and no census).
It sees every torch call of that thread at the Python level: for each sync it records the
kind, the call site in the job's code (the first frame outside torch) and the time inside the
call, as wall time and as the training thread's CPU time (on a busy machine the wall time of
a call holds the time the OS ran other work; its CPU time does not); for every call it records
which tensors it read and made, so that after the step the operators whose results fed only
syncs are known, with their time. Jobs under
``torch.compile`` are left alone: a mode on the stack changes what dynamo's guards see and
would recompile their graphs (the trace still counts their scalar reads).

The record is written to ``samples/syncs-rank-<RANK>.json`` (``gpudiag.rundir.read_syncs``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any

# torch methods and functions that read device data back to the host, by the name the mode
# sees (``func.__name__``), and how the report names them
SYNC_KINDS = {
    "item": ".item()", "__bool__": "bool(tensor)", "__float__": "float(tensor)",
    "__int__": "int(tensor)", "__index__": "int(tensor)", "__complex__": "complex(tensor)",
    "tolist": ".tolist()", "numpy": ".numpy()", "cpu": ".cpu()",
    "__format__": "print/format of a tensor", "__repr__": "print/format of a tensor",
    "__str__": "print/format of a tensor",
    "equal": "torch.equal", "allclose": "torch.allclose", "is_nonzero": "torch.is_nonzero",
    "nonzero": "nonzero (data-dependent shape)", "argwhere": "nonzero (data-dependent shape)",
    "masked_select": "masked_select (data-dependent shape)",
    "unique": "unique (data-dependent shape)",
    "unique_consecutive": "unique (data-dependent shape)",
    "repeat_interleave": "repeat_interleave (data-dependent shape)",
}
MASK_INDEX = "boolean-mask indexing (data-dependent shape)"
TO_HOST = ".to('cpu')"
CUDA_SYNC = "torch.cuda.synchronize"
MAX_SITES = 200  # distinct call sites kept (a loop over generated code could make thousands)
_TORCH_DIR: str | None = None  # torch's package folder: frames inside it are not the job's call site
_HERE = os.path.dirname(os.path.abspath(__file__))


def _torch_dir(torch: Any) -> str:  # the job's torch
    global _TORCH_DIR
    if _TORCH_DIR is None:
        _TORCH_DIR = os.path.dirname(os.path.abspath(str(torch.__file__))) + os.sep
    return _TORCH_DIR


def compiled(torch: Any) -> bool:
    """Whether the job has compiled anything with torch.compile (dynamo loaded and used)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return False
    try:
        return bool(dynamo.counters["stats"]["unique_graphs"]) or bool(dynamo.counters["frames"]["ok"])
    except Exception:  # noqa: BLE001 - a torch without these counters: be safe
        return True


class _Record:
    """What the mode saw in its step: the sync calls by site, and the dataflow of every call."""

    def __init__(self, torch_dir: str) -> None:
        self.torch_dir = torch_dir
        self.data_dir = os.path.join(torch_dir, "utils", "data") + os.sep
        self.optim_dir = os.path.join(torch_dir, "optim") + os.sep
        self.module_file = os.path.join(torch_dir, "nn", "modules", "module.py")
        # -> [calls, wall, cpu, inside an nn.Module call (1) or not (0)]
        self.sites: dict[tuple[str, int, str, str], list[float]] = {}
        self.dropped_sites = 0
        self.calls = 0  # torch calls seen
        # per node: (name, wall seconds, thread CPU seconds, is_sync, mutates); consumers per node
        self.nodes: list[tuple[str, float, float, bool, bool]] = []
        self.consumers: list[list[int]] = []
        self.made: dict[int, tuple[int, Any]] = {}  # id(tensor) -> (node, weakref to it)
        # per node: the job's Python before it (wall, thread CPU seconds), from the end of the
        # previous torch call (the census's own bookkeeping after that call left out)
        self.gaps: list[tuple[float, float]] = []
        self.last_end: tuple[float, float] | None = None
        self.tail = (0.0, 0.0)  # the Python after the last call, up to the census's end

    def site(self) -> tuple[str, int, str, str, bool] | None:
        """(file, line, function, via, in_module): the first frame outside torch and gpudiag;
        ``via`` the torch function the job called that made the sync (``clip_grad_norm_``), if
        any; ``in_module`` whether an ``nn.Module`` call is on the stack (a forward's read-back,
        which splits a compiled graph, against one in the training loop, which does not: blind
        check 40's loop read a loss and a gradient norm after ``opt.step()`` and was told the
        forward read them). None inside a DataLoader's fetch (a dataset's ``__getitem__`` making a
        sample): that is input work, in the input wait, not a read-back of the training step's
        values."""
        f: FrameType | None = sys._getframe(3)
        via = ""
        found = None
        in_module = False
        while f is not None:
            fn = f.f_code.co_filename
            if fn == self.module_file and f.f_code.co_name in ("_call_impl", "_wrapped_call_impl"):
                in_module = True
            if found is None and not (fn.startswith(self.torch_dir) or fn.startswith(_HERE)):
                found = (fn, f.f_lineno, f.f_code.co_name, via)
            elif found is None:
                name = f.f_code.co_name
                if fn.startswith(self.torch_dir) and (not via or _public(name)):
                    via = name  # the outermost public torch function: the one the job called
                    if fn.startswith(self.optim_dir):
                        via += OPTIM_MARK
            if fn.startswith(self.data_dir):
                return None
            f = f.f_back
        return (*(found or ("<unknown>", 0, "", via)), in_module)

    def add_sync(self, kind: str, seconds: float, cpu: float) -> bool:
        """Count one sync at its call site; False where it is none (``site``) or torch.optim's
        own (counted at its site, marked, but no read-back of the job's: Adam's step reads each
        parameter's step counter with ``.item()`` on a CPU, and the Python after it is the
        optimizer's; blind set 10 was told to remove 162 of them at its ``opt.step()`` line)."""
        where = self.site()
        if where is None:
            return False
        fn, line, func, via, in_module = where
        key = (fn, line, kind, func if not via else f"{func} via {via}")
        c = self.sites.get(key)
        if c is None:
            if len(self.sites) >= MAX_SITES:
                self.dropped_sites += 1
                return True
            c = self.sites[key] = [0, 0.0, 0.0, 0]
        c[0] += 1
        c[1] += seconds
        c[2] += cpu
        c[3] = max(c[3], int(in_module))
        return not via.endswith(OPTIM_MARK)

    def add_node(self, name: str, seconds: float, cpu: float, sync: bool, inputs: list[Any],
                 outputs: list[Any]) -> None:
        n = len(self.nodes)
        mutates = name.endswith("_") and not name.endswith("__")
        for t in inputs:
            got = self.made.get(id(t))
            if got is not None and got[1]() is t:
                self.consumers[got[0]].append(n)
                if any(o is t for o in outputs):
                    mutates = True  # in place: the tensor it changes lives on
        self.nodes.append((name, seconds, cpu, sync, mutates))
        self.consumers.append([])
        for t in outputs:
            try:
                self.made[id(t)] = (n, weakref.ref(t))
            except TypeError:
                pass

    def after(self, only: list[bool]) -> tuple[float, float]:
        """(wall, CPU seconds) of the job's Python right after a sync or an operator that fed
        only syncs, up to the next torch call: what the loop does with the values it read back
        (formatting them, a JSON line, a write), which goes with the reads (the third blind zoo's
        metrics_log: its logger's JSON, Python and fsync left in, removing the logging was
        predicted 0.42-0.48x where it measured 0.26-0.27x)."""
        wall = cpu = 0.0
        for n, fed in enumerate(only):
            if not fed:
                continue
            w, c = self.gaps[n + 1] if n + 1 < len(self.gaps) else self.tail
            wall += w
            cpu += c
        return wall, cpu

    def feeding(self, only: list[bool]) -> tuple[int, float, float, dict[str, list[float]]]:
        """(ops, wall seconds, CPU seconds, per op name [calls, wall, CPU]) of the calls whose
        results were used only by syncs or by other such calls (``only``): the work that goes
        when the syncs' lines go."""
        ops, seconds, cpu_s = 0, 0.0, 0.0
        names: dict[str, list[float]] = {}
        for n, (name, s, cs, sync, _) in enumerate(self.nodes):
            if sync or not only[n]:
                continue
            ops += 1
            seconds += s
            cpu_s += cs
            c = names.setdefault(name, [0, 0.0, 0.0])
            c[0] += 1
            c[1] += s
            c[2] += cs
        return ops, seconds, cpu_s, names

    def only(self) -> list[bool]:
        """Per node: a sync, or a call whose results were used only by syncs or such calls."""
        only = [False] * len(self.nodes)
        for n in range(len(self.nodes) - 1, -1, -1):
            _, _, _, sync, mutates = self.nodes[n]
            users = self.consumers[n]
            only[n] = sync or (not mutates and bool(users) and all(only[u] for u in users))
        return only


# appended to a site's ``via`` where the torch function the job called is torch.optim's (the
# analyzer reads it: ``gpudiag.census.OPTIM_MARK``, the same text)
OPTIM_MARK = " in torch.optim"
_WRAPPERS = {"decorate_context", "wrapper", "inner", "fn", "wrapped", "_fn"}


def _public(name: str) -> bool:
    """A torch function's own name, not a decorator's wrapper or a private helper."""
    return not name.startswith("_") and name not in _WRAPPERS and not name.startswith("<")


def _tensors(torch: Any, value: Any, out: list[Any], depth: int = 0) -> list[Any]:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif depth < 2 and isinstance(value, (list, tuple)):
        for v in value:
            _tensors(torch, v, out, depth + 1)
    return out


def _mask_index(torch: Any, index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _to_host(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``t.to(...)`` from a device to the host, waiting for it (not ``non_blocking=True``)."""
    if not args or not isinstance(args[0], torch.Tensor) or args[0].device.type == "cpu":
        return False
    if kwargs.get("non_blocking"):
        return False
    for a in (*args[1:], kwargs.get("device")):
        if isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu":
            return True
    return False


def _clock_cost() -> tuple[float, float]:
    """(wall, CPU) seconds that reading both clocks around a call adds to what it measures (the
    thread's CPU clock is a system call: 0.7 us of a 2.6 us ``abs`` on this project's VM), the
    median of back-to-back readings, taken from each call's time."""
    perf, cpu = time.perf_counter, time.thread_time
    walls, cpus = [], []
    for _ in range(201):
        t, c = perf(), cpu()
        walls.append(perf() - t)
        cpus.append(cpu() - c)
    walls.sort()
    cpus.sort()
    return walls[100], cpus[100]


def _make_mode(torch: Any, rec: _Record) -> Any:
    from torch.overrides import TorchFunctionMode

    perf, cpu = time.perf_counter, time.thread_time
    wall0, cpu0 = _clock_cost()
    # on a GPU job, reading a tensor that is on the host already waits for nothing
    gpu = bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    host_side = set(SYNC_KINDS.values()) | {MASK_INDEX}

    class SyncCensusMode(TorchFunctionMode):  # type: ignore[misc]  # torch is not read (pyproject: Any)
        """Times every torch call of the thread, names the syncs, and keeps the dataflow."""

        active = True

        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            kwargs = kwargs or {}
            if not self.active:
                return func(*args, **kwargs)
            name = getattr(func, "__name__", "")
            kind = SYNC_KINDS.get(name)
            if kind is None:
                if name in ("__getitem__", "__setitem__") and len(args) > 1 and _mask_index(torch, args[1]):
                    kind = MASK_INDEX
                elif name == "to" and _to_host(torch, args, kwargs):
                    kind = TO_HOST
            if (gpu and kind in host_side and args and isinstance(args[0], torch.Tensor)
                    and args[0].device.type == "cpu"):
                kind = None
            t, c = perf(), cpu()
            last = rec.last_end
            out = func(*args, **kwargs)
            s, cs = max(0.0, perf() - t - wall0), max(0.0, cpu() - c - cpu0)
            try:
                rec.calls += 1
                sync = kind is not None and rec.add_sync(kind, s, cs)
                rec.add_node(name, s, cs, sync, _tensors(torch, args, []),
                             _tensors(torch, out, []))
                rec.gaps.append((max(0.0, t - last[0] - wall0), max(0.0, c - last[1] - cpu0))
                                if last is not None else (0.0, 0.0))
            except Exception:  # noqa: BLE001 - the census must never break the job
                pass
            rec.last_end = (perf(), cpu())
            return out

    return SyncCensusMode()


class SyncCensus:
    """One step's census: ``start`` on the training thread, ``stop`` there a step later."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.rec = _Record(_torch_dir(torch))
        self.mode = _make_mode(torch, self.rec)
        self.thread = threading.get_ident()
        self.started = time.perf_counter()
        self._sync_orig: list[tuple[Any, str, Any]] = []

    def start(self) -> None:
        self.mode.__enter__()
        self._wrap_cuda_syncs()

    def _wrap_cuda_syncs(self) -> None:
        """``torch.cuda.synchronize`` and the stream/event waits are no torch functions the
        mode sees: wrapped for the census step only."""
        cuda = self.torch.cuda
        if not cuda.is_available():
            return
        rec = self.rec
        for owner, attr in ((cuda, "synchronize"), (cuda.Stream, "synchronize"),
                            (cuda.Event, "synchronize")):
            orig = getattr(owner, attr, None)
            if orig is None:
                continue

            def wrapped(*a: Any, _orig: Any = orig, **k: Any) -> Any:
                t, c = time.perf_counter(), time.thread_time()
                try:
                    return _orig(*a, **k)
                finally:
                    if threading.get_ident() == self.thread:
                        rec.add_sync(CUDA_SYNC, time.perf_counter() - t, time.thread_time() - c)

            setattr(owner, attr, wrapped)
            self._sync_orig.append((owner, attr, orig))

    def stop(self, step: int) -> dict[str, Any]:
        """End the census (on the thread that started it) and return its record."""
        for owner, attr, orig in self._sync_orig:
            setattr(owner, attr, orig)
        self._sync_orig = []
        note = ""
        try:
            from torch.overrides import _get_current_function_mode

            if _get_current_function_mode() is self.mode:
                self.mode.__exit__(None, None, None)
            else:  # the job pushed a mode of its own above ours: ours stays, inert
                self.mode.active = False
                note = ("the job's own TorchFunctionMode was above the census's at the step's end: "
                        "the census mode stays on its stack, inert")
        except Exception as e:  # noqa: BLE001
            self.mode.active = False
            note = f"census mode not removed: {type(e).__name__}: {e}"
        wall = time.perf_counter() - self.started
        rec = self.rec
        if rec.last_end is not None:
            rec.tail = (max(0.0, time.perf_counter() - rec.last_end[0]),
                        max(0.0, time.thread_time() - rec.last_end[1]))
        only = rec.only()
        ops, seconds, cpu_s, names = rec.feeding(only)
        after_s, after_cpu_s = rec.after(only)
        top = sorted(names.items(), key=lambda kv: -kv[1][1])[:10]
        out: dict[str, Any] = {
            "step": step, "wall_s": wall, "torch_calls": rec.calls,
            "device": "cuda" if self.torch.cuda.is_available() and self.torch.cuda.is_initialized()
            else "cpu",
            "sites": [{"file": f, "line": ln, "kind": k, "function": fn, "calls": int(c[0]),
                       "seconds": c[1], "cpu_seconds": c[2], "in_module": bool(c[3])}
                      for (f, ln, k, fn), c in rec.sites.items()],
            "dropped_sites": rec.dropped_sites,
            "feeding": {"ops": ops, "seconds": seconds, "cpu_seconds": cpu_s,
                        "after_seconds": after_s, "after_cpu_seconds": after_cpu_s,
                        "top": [{"op": n, "calls": int(c[0]), "seconds": c[1], "cpu_seconds": c[2]}
                                for n, c in top]},
        }
        if note:
            out["note"] = note
        self.rec = _Record(rec.torch_dir)  # drop the step's references
        return out


# -- the bootstrap's three calls (kept here so the bootstrap changes by three lines) -----------

def begin(st: Any, torch: Any) -> None:  # the bootstrap's state, the job's torch
    """When a trace window opens (its warm-up step starts): start the census, unless the job
    compiles (``compiled``) or a census is already running."""
    if getattr(st, "sync_census", None) is not None:
        return
    if compiled(torch):
        st.sync_record = {"skipped": "the job uses torch.compile: a TorchFunctionMode would change "
                                     "what dynamo's guards see and recompile its graphs"}
        return
    census = SyncCensus(torch)
    census.start()
    st.sync_census = census


def end(st: Any) -> None:
    """At the warm-up step's end: pop the mode, keep the record (written after the window, in
    its export step, so the traced steps never pay for the analysis of the record)."""
    census = getattr(st, "sync_census", None)
    if census is None:
        return
    st.sync_census = None
    st.sync_record = census.stop(st.step)


def write(st: Any) -> None:
    """samples/syncs-rank-<RANK>.json, atomically (a reader sees the old census or the new)."""
    import json

    rec = getattr(st, "sync_record", None)
    if rec is None:
        return
    st.sync_record = None
    path = st.run_dir / "samples" / f"syncs-rank-{st.rank}.json"
    try:
        tmp = path.with_suffix(".partial")
        tmp.write_text(json.dumps({"rank": st.rank, **rec}))
        tmp.replace(path)
    except OSError as e:
        st.note(f"cannot write the sync census: {e}")
