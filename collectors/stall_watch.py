"""Runs inside the job (every rank): what a stall needs to be diagnosed, at no cost while none does.

Loaded by ``torch_bootstrap`` from the file beside it (standard library and torch only) when
``gpudiag profile`` runs with its stall watch on (``GPUDIAG_STALL_WATCH=1``, the default). Three
parts, each cheap because it does nothing until asked:

- **The black box** (``blackbox.py``): each step's end and duration, the phase the user marked
  (``gpudiag.phase("eval")``), and every collective called through ``torch.distributed``'s
  Python API (group, sequence number, op, first tensor's shape, entered/completed), stored in a
  shared memory map the parent reads from outside. About 1 us per step and per collective.
- **Stacks on a signal**: ``faulthandler.register`` for ``STACK_SIGNAL`` (a real-time signal no
  library uses) writes every thread's Python stack to ``samples/stacks/pid-<PID>.txt`` from
  C, so it works while the interpreter is held (a rank blocked in a C call that keeps the GIL)
  and in forked DataLoader workers (re-registered after each fork, into their own file). Only a
  process whose handler for that signal is the default is touched, and the parent signals only
  processes whose ``/proc/PID/status`` shows the signal caught. ``faulthandler.enable`` does the
  same on a fatal signal (gloo aborts a rank on a size mismatch), unless the job enabled it.
- **A watcher thread** in each training process that looks once a second for the parent's
  request (``samples/stall-request.json``) and answers with the Python stacks of every thread
  (with their names) and PyTorch's Flight Recorder dump (every collective in flight and the last
  ones completed, per process group, DDP's included), into ``incidents/<ID>/rank-<RANK>.json``.
  A rank whose interpreter is held cannot answer; the black box and the signal's stacks still
  say where it is.

Nothing here may change the job's outcome: every failure is swallowed and noted.
"""

from __future__ import annotations

import faulthandler
import functools
import inspect
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

# faulthandler's stack dump on this signal: a real-time signal, whose default action would end
# the process, so it is sent only where /proc shows it caught (collectors/stall_evidence.py)
STACK_SIGNAL = int(getattr(signal, "SIGRTMIN", 34)) + 7
POLL_S = 1.0        # how often the watcher looks for a request
FR_KEEP = 32        # Flight Recorder entries kept per process group (besides those in flight)
REQUEST = "stall-request.json"

_box: Any = None            # blackbox.Writer of this training process
_box_pid: int | None = None
_watcher: threading.Thread | None = None
_run_dir: Path | None = None
_last_step = time.perf_counter()
_pending_phase: tuple[str, float] | None = None
_stack_files: list[Any] = []   # kept open: faulthandler writes to their descriptors


def _sibling(stem: str) -> Any:
    name = f"gpudiag.collectors.{stem}"
    mod = sys.modules.get(name)
    if mod is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{stem}.py"))
        if spec is None or spec.loader is None:
            raise ImportError(f"gpudiag: cannot load {name} beside {__file__}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


def enabled() -> bool:
    return os.environ.get("GPUDIAG_STALL_WATCH") == "1"


# -- stacks on a signal --------------------------------------------------------------------------

def install_stack_dump(run_dir: Path) -> None:
    """Every process that imports torch under gpudiag: its stacks on STACK_SIGNAL, and on a
    fatal signal where the job has not asked for faulthandler itself."""
    global _run_dir
    _run_dir = run_dir
    _register(os.getpid())
    try:
        os.register_at_fork(after_in_child=_after_fork)
    except (AttributeError, ValueError):
        pass


def _register(pid: int) -> None:
    if _run_dir is None:   # not armed
        return
    folder = _run_dir / "samples" / "stacks"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if signal.getsignal(STACK_SIGNAL) not in (signal.SIG_DFL, None):
            return   # the job's own handler: left alone, and never signalled (SigCgt is Python's)
        f = open(folder / f"pid-{pid}.txt", "a", buffering=1)  # held for faulthandler
        _stack_files.append(f)
        faulthandler.register(STACK_SIGNAL, file=f, all_threads=True, chain=False)
        if _fatal[0] or not faulthandler.is_enabled():   # ours to (re)point, never the job's
            faulthandler.enable(file=f, all_threads=True)
            _fatal[0] = True
    except (OSError, ValueError, RuntimeError, AttributeError):
        pass


_fatal = [False]   # faulthandler's fatal-signal dump is ours (the job had not enabled it)


def _after_fork() -> None:
    """A forked child (a DataLoader worker): its own stack file, so dumps never interleave."""
    global _box, _watcher
    for f in _stack_files:
        try:
            f.close()
        except OSError:
            pass
    _stack_files.clear()
    _box, _watcher = None, None
    if _run_dir is not None:
        _register(os.getpid())


# -- the black box -----------------------------------------------------------------------------

def _writer(st: Any) -> Any:  # the bootstrap's state
    """This training process's black box, created with its first step or collective."""
    global _box, _box_pid
    if _box is not None and _box_pid == os.getpid():
        return _box
    bb = _sibling("blackbox")
    _box = bb.Writer(bb.path_for(st.run_dir, st.rank), st.rank, os.getpid(), time.time())
    _box_pid = os.getpid()
    if _pending_phase is not None:
        _box.phase(*_pending_phase)
    _start_watcher(st)
    return _box


def on_step(st: Any) -> None:
    global _last_step
    now = time.perf_counter()
    try:
        _writer(st).step(st.step, time.time(), now - _last_step, st.prof is not None)
    except Exception:  # noqa: BLE001 - never break the job
        pass
    _last_step = now


def phase_begin(name: str) -> None:
    """``gpudiag.phase(name)`` entered: no step is expected until it ends (eval, checkpoint)."""
    global _pending_phase
    _pending_phase = (str(name) or "phase", time.time())
    if _box is not None and _box_pid == os.getpid():
        _box.phase(*_pending_phase)


def phase_end() -> None:
    global _pending_phase
    _pending_phase = None
    if _box is not None and _box_pid == os.getpid():
        _box.phase("", 0.0)


# where each collective's process group and first tensor are among its arguments
_INPUT_FIRST = {"all_gather", "all_gather_into_tensor", "all_to_all_single", "reduce_scatter_tensor"}


def wrap_collectives(dist: Any, names: tuple[str, ...], state: Any, torch: Any) -> None:
    """Record each call of ``torch.distributed.<name>`` in the black box; ``state()`` is the
    bootstrap (or None outside a training process)."""
    tensor_type = torch.Tensor
    for name in names:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "_gpudiag_box", False):
            continue
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            params = []
        group_at = params.index("group") if "group" in params else None
        setattr(dist, name, _recorded(dist, name, fn, state, group_at, tensor_type))


def _pg_name(dist: Any, group: Any, cache: dict[int, bytes]) -> bytes:
    key = id(group)
    name = cache.get(key)
    if name is None:
        try:
            g = group if group is not None else dist.group.WORLD
            name = str(getattr(g, "group_name", "") or "0").encode("ascii", "replace")
        except Exception:  # noqa: BLE001
            name = b"?"
        cache[key] = name
    return name


def _described(t: Any, cache: dict[tuple[Any, Any], tuple[bytes, bytes, int]]) -> tuple[bytes, bytes, int]:
    """(shape, dtype, numel) of a tensor argument, encoded once per shape and dtype seen."""
    key = (t.shape, t.dtype)
    got = cache.get(key)
    if got is None:
        got = ("x".join(str(d) for d in t.shape).encode(), str(t.dtype).removeprefix("torch.").encode(),
               int(t.numel()))
        if len(cache) < 1024:
            cache[key] = got
    return got


def _recorded(dist: Any, name: str, fn: Any, state: Any, group_at: int | None,
              tensor_type: type) -> Any:
    box_mod = _sibling("blackbox")
    pgs: dict[int, bytes] = {}
    shapes: dict[tuple[Any, Any], tuple[bytes, bytes, int]] = {}
    op = name.replace("_into_tensor", "").replace("_tensor", "").replace("_single", "").encode()
    none = (b"", b"", 0)

    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        st = state()
        if st is None:
            return fn(*args, **kwargs)
        try:
            box = _writer(st)
            group = kwargs.get("group")
            if group is None and group_at is not None and len(args) > group_at:
                group = args[group_at]
            first = next((a for a in args if isinstance(a, tensor_type)), None)
            if first is None:
                first = next((a for a in kwargs.values() if isinstance(a, tensor_type)), None)
            shape, dtype, numel = _described(first, shapes) if first is not None else none
            is_async = bool(kwargs.get("async_op"))
            slot = box.enter(_pg_name(dist, group, pgs), op, shape, dtype, numel, st.step, time.time(),
                             box_mod.ISSUED if is_async else box_mod.ENTERED)
        except Exception:  # noqa: BLE001 - never break the job
            return fn(*args, **kwargs)
        try:
            out = fn(*args, **kwargs)
        except BaseException:
            box.done(slot, time.time(), box_mod.RAISED)
            raise
        if not is_async:
            box.done(slot, time.time())
        return out

    recorded._gpudiag_box = True  # type: ignore[attr-defined]
    return recorded


# -- the watcher: answers the parent's requests ------------------------------------------------

def _start_watcher(st: Any) -> None:
    global _watcher
    if _watcher is not None:
        return
    _watcher = threading.Thread(target=_watch, args=(st.run_dir, st.rank), name="gpudiag-stall-watch",
                                daemon=True)
    _watcher.start()


def _watch(run_dir: Path, rank: int) -> None:
    req = run_dir / "samples" / REQUEST
    answered: set[str] = set()
    me = os.getpid()
    while os.getpid() == me:
        time.sleep(POLL_S)
        try:
            doc = json.loads(req.read_text())
            ident = str(doc["id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if ident in answered:
            continue
        answered.add(ident)
        folder = run_dir / "incidents" / ident
        try:
            write_evidence(folder / f"rank-{rank}.json", rank)
        except Exception:  # noqa: BLE001 - the parent notes a rank that did not answer
            pass


def write_evidence(path: Path, rank: int) -> None:
    doc = {"rank": rank, "pid": os.getpid(), "t": time.time(), "threads": python_stacks()}
    doc["fr"], doc["fr_error"] = flight_recorder()
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(doc, default=str))
    tmp.replace(path)


def python_stacks() -> list[dict[str, Any]]:
    """Every thread of this process: its name and its frames, innermost first."""
    names = {t.ident: t for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        t = names.get(ident)
        frames: list[dict[str, Any]] = []
        f: FrameType | None = frame
        while f is not None and len(frames) < 64:
            frames.append({"file": f.f_code.co_filename, "line": f.f_lineno, "func": f.f_code.co_name})
            f = f.f_back
        out.append({"ident": f"0x{ident:016x}", "name": t.name if t else "?",
                    "native_id": getattr(t, "native_id", None) if t else None,
                    "daemon": bool(t.daemon) if t else None,
                    "main": t is threading.main_thread() if t else False,
                    "watcher": ident == threading.get_ident(), "frames": frames})
    return out


def flight_recorder() -> tuple[dict[str, Any] | None, str | None]:
    """PyTorch's Flight Recorder dump, trimmed to what a verdict needs, or why there is none."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, "torch is not loaded"
    try:
        import pickle

        c10d = torch._C._distributed_c10d
        fn = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
        if fn is None:
            return None, f"torch {torch.__version__} has no Flight Recorder dump"
        raw = fn(includeCollectives=True, includeStackTraces=True, onlyActive=False)
        dump = pickle.loads(raw)  # this process's own Flight Recorder
    except Exception as e:  # noqa: BLE001
        return None, f"Flight Recorder dump failed: {type(e).__name__}: {e}"
    return trim_dump(dump), None


def trim_dump(dump: dict[str, Any]) -> dict[str, Any]:
    """The last FR_KEEP entries of each process group and every entry not yet retired."""
    entries = dump.get("entries") or []
    keep: list[Any] = []
    by_pg: dict[Any, int] = {}
    for e in reversed(entries):
        pg = str(e.get("pg_id"))
        by_pg[pg] = by_pg.get(pg, 0) + 1
        if by_pg[pg] <= FR_KEEP or not e.get("retired", True):
            keep.append(e)
    out = {k: v for k, v in dump.items() if k != "entries"}
    out["entries"] = keep[::-1]
    out["entries_total"] = len(entries)
    return out
