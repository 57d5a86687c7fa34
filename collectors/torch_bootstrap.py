"""Runs inside the profiled job (every rank): step timing, profiler window, collective timing.

Injected by ``collectors/bootstrap/sitecustomize.py`` when ``gpudiag profile`` starts a job,
so the job's code is untouched. Only the standard library and torch are used here: the job
may run a Python that has torch but not gpudiag's dependencies.

What it does, cheaply, for the whole run:
- counts steps through torch's global optimizer-step hook (or ``gpudiag.step()`` for loops
  without an optimizer, which then takes over), and times each step;
- times collectives per type per step, blocking, async and DDP's, and how long the step
  waited for them (``torch_collectives``, loaded from the file beside this one);
- in the window's warm-up step only, takes a census of the job's host syncs (``torch_syncs``);
- and for ``--steps`` steps after ``--skip`` steps only, runs ``torch.profiler`` with
  ``record_shapes=True`` and writes ``traces/rank-<RANK>.json.gz``; with a re-trace interval
  (``--monitor``), it opens a new window that often and replaces the trace, so a job that
  changes phase gets a fresh one.

Every step row says whether the profiler touched that step (``"profiler"``: warm-up, traced,
export) and the meta file lists the traced steps, so readers never recompute the window: the
analysis needs exactly which steps ran unobserved, to measure how much the profiler dilated
the traced ones.

Timings go to ``samples/steps-rank-<RANK>.jsonl``, flushed about once a second, so a crash
loses at most the last second. Nothing here may change the job's outcome: every failure is
caught and written to ``samples/bootstrap-rank-<RANK>.json`` instead.
"""

from __future__ import annotations

import atexit
import functools
import gzip
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

FLUSH_EVERY_S = 1.0

_state: _Bootstrap | None = None


def _rank() -> int:
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        v = os.environ.get(var)
        if v is not None and v.isdigit():
            return int(v)
    return 0


# Values of a step row's "profiler" key; gpudiag/rundir.py reads them (PROFILER_*).
_WARMUP, _TRACED, _EXPORT = "warmup", "traced", "export"


class _Bootstrap:
    def __init__(self, run_dir: Path, skip: int, steps: int, retrace_s: float = 0.0) -> None:
        self.run_dir = run_dir
        self.skip = skip
        self.steps = steps
        self.retrace_s = retrace_s  # 0: one window only
        self.next_window_at = 0.0  # monotonic time before which no new window opens
        self.phase: str | None = None  # what the profiler is doing in the step now running
        self.window: list[int] = []  # traced steps of the window being recorded
        self.traced_steps: list[int] = []  # traced steps of the trace on disk
        self.windows: list[dict[str, Any]] = []
        self.rank = _rank()
        self.pid = os.getpid()  # forked children (DataLoader workers) must not write as us
        self.step = 0
        self.explicit = False  # gpudiag.step() seen: the optimizer hook stops counting
        self.t_step = time.perf_counter()
        self.sched_fds: dict[int, int] = {}  # thread id -> its open schedstat file
        self.sched = _thread_sched(self.sched_fds)  # the stepping thread's counters, last step
        self.peers = _sibling("thread_waits").PeerWaits()  # the job's other threads' waits
        self.collectives = _collectives().StepCollectives()
        self.comm_threads = _collectives().CommThreads()
        self.faults = _sibling("page_faults").StepFaults()  # page faults and kernel time per step
        self.fault_us: float | None = None  # what one fault costs here (measured once)
        self.buffer: list[dict[str, Any]] = []
        self.backend: str | None = None  # default process group backend, once known
        self.fr_last_record = -1  # flight recorder entries already accounted for
        self.last_flush = time.monotonic()
        self.prof: Any = None
        self.prof_done = False
        self.discard = False  # a window cut short at exit after a complete one: not written
        self.notes: list[str] = []
        self.dataloader_workers: set[int] = set()
        self.prefetch = 0  # the most batches one of its loaders' workers hold ready
        # the stepping thread's time in next(loader) this step: wall, on a core, runnable
        # waiting for one (``_patch_dataloader``); the rest it was blocked (storage, a sleep,
        # the workers' queue)
        self.input = [0.0, 0.0, 0.0]
        self.save_s = 0.0  # the stepping process's time in torch.save this step (``_patch_save``)
        self.cupti: dict[str, Any] = {}  # CUPTI teardown of the last window (torch_cupti)
        (run_dir / "samples").mkdir(parents=True, exist_ok=True)
        (run_dir / "traces").mkdir(parents=True, exist_ok=True)
        self.steps_path = run_dir / "samples" / f"steps-rank-{self.rank}.jsonl"

    # -- steps ---------------------------------------------------------------------------
    def on_step(self, explicit: bool) -> None:
        if explicit:
            self.explicit = True
        elif self.explicit:
            return
        now, sched = _clock_and_sched(self.sched_fds)
        self.step += 1
        row: dict[str, Any] = {"step": self.step, "t": time.time(), "dt": now - self.t_step}
        if self.phase is not None:
            row["profiler"] = self.phase
            if self.phase == _TRACED:
                self.window.append(self.step)
            self.phase = None
        colls = self.collectives.drain()
        if colls:
            row["collectives"] = colls
        comm_cpu = self.comm_threads.step_cpu_s()
        if comm_cpu is not None:
            row["comm_cpu_s"] = comm_cpu
        row["t0"] = time.time() - row["dt"]
        row.update(self.faults.on_step())
        if self.save_s > 0:
            row["save_s"], self.save_s = round(self.save_s, 6), 0.0
        if self.input[0] > 0:
            row["input_s"], row["input_run_s"], row["input_wait_s"] = (round(x, 6) for x in self.input)
            self.input = [0.0, 0.0, 0.0]
        if sched is not None and self.sched is not None and sched[0] == self.sched[0]:
            row["run_s"] = (sched[1] - self.sched[1]) / 1e9
            row["wait_s"] = (sched[2] - self.sched[2]) / 1e9
            row["slices"] = sched[3] - self.sched[3]
        self.sched = sched
        if sched is not None:
            try:
                if self.step == 1 or time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
                    self.peers.discover(sched[0])
                elif self.peers.threads_changed():
                    self.peers.discover(sched[0], fresh=True)
                row.update(self.peers.on_step(row["dt"]))
            except Exception as e:  # noqa: BLE001 - the step's row is written without them
                self.note(f"the other threads' waits for a core were not read: {type(e).__name__}: {e}")
        self.t_step = now
        self.buffer.append(row)
        if time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
            self.flush()
        self._profiler_step()

    def flush(self) -> None:
        if not self.buffer:
            return
        if self.backend == "nccl":
            _collectives().poll_flight_recorder(self)
        try:
            with self.steps_path.open("a") as f:
                f.write("\n".join(json.dumps(r, separators=(",", ":")) for r in self.buffer) + "\n")
        except OSError as e:
            self.note(f"cannot write step timings: {e}")
        self.buffer = []
        self.last_flush = time.monotonic()

    # -- profiler window -----------------------------------------------------------------
    def _profiler_step(self) -> None:
        if self.prof_done:
            return
        try:
            import torch

            if self.prof is None:
                if self.step < self.skip or time.monotonic() < self.next_window_at:
                    return
                if torch.autograd.profiler._is_profiler_enabled:
                    self.note("the job runs its own torch profiler: gpudiag does not start a "
                              "second one (its traces are not collected); sampling continues")
                    self.prof_done = True
                    return
                acts = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    acts.append(torch.profiler.ProfilerActivity.CUDA)
                sched = torch.profiler.schedule(wait=0, warmup=1, active=self.steps, repeat=1)
                self.prof = torch.profiler.profile(activities=acts, record_shapes=True,
                                                   schedule=sched, on_trace_ready=self._write_trace)
                # ProfilerStep#0 is the warm-up step, #1..#steps the traced ones; the job's
                # own step numbers are in the steps file, marked as they happen.
                self.window = []
                self.cupti = _sibling("torch_cupti").before_window()
                self.prof.start()
                self.phase = _WARMUP
                _sibling("torch_syncs").begin(self, torch)  # host syncs, in the warm-up step
                return
            _sibling("torch_syncs").end(self)
            self.prof.step()
            self.phase = _TRACED
            if self.prof_done:  # the window completed and was written (inside the next step)
                self.phase = _EXPORT
                self.prof.stop()
                self._after_stop()
                self._end_window()
        except Exception as e:  # noqa: BLE001 - never break the job
            self.note(f"torch profiler failed: {type(e).__name__}: {e}")
            self.prof_done = True

    def _write_trace(self, prof: Any) -> None:
        if self.discard:
            self.prof_done = True
            return
        final = self.run_dir / "traces" / f"rank-{self.rank}.json.gz"
        raw = final.with_name(f".rank-{self.rank}.json.partial")
        try:
            prof.export_chrome_trace(str(raw))
            tmp = final.with_name(f".rank-{self.rank}.json.gz.partial")
            with raw.open("rb") as src, gzip.open(tmp, "wb", compresslevel=3) as dst:
                shutil.copyfileobj(src, dst)
            tmp.replace(final)  # readers never see a half-written trace
            self.traced_steps = list(self.window)
            self.windows.append({"first": self.window[0] if self.window else None,
                                 "last": self.window[-1] if self.window else None,
                                 "t": time.time(), "file": final.name})
            self.write_meta()
        except Exception as e:  # noqa: BLE001
            self.note(f"cannot write the trace: {type(e).__name__}: {e}")
        finally:
            raw.unlink(missing_ok=True)
        self.prof_done = True

    def _after_stop(self) -> None:
        """Once the profiler stopped: record the CUPTI teardown it did, and let go of the
        profiler, whose events would otherwise stay in the job's memory for its life."""
        import torch

        self.cupti = _sibling("torch_cupti").after_window(
            self.cupti, bool(torch.cuda.is_available()))
        self.prof = None
        _sibling("torch_syncs").write(self)
        self._measure_fault_cost()
        self.write_meta()

    def _measure_fault_cost(self) -> None:
        """Once, in the step that exports the first trace (no pace is read from it) or at exit:
        what a page fault costs this process, which the allocator advice turns faults into time
        with (``analyzers.page_faults``)."""
        if self.fault_us is None:
            try:
                self.fault_us = _sibling("page_faults").fault_cost_us()
            except Exception as e:  # noqa: BLE001 - never break the job
                self.note(f"the page fault cost was not measured: {type(e).__name__}: {e}")

    def _end_window(self) -> None:
        """After a window: done for good, or (re-trace interval set) wait and open another."""
        if self.retrace_s > 0:
            self.prof_done = False
            self.next_window_at = time.monotonic() + self.retrace_s

    def finish(self) -> None:
        """At exit: a window still open is cut short and written (fewer steps than asked)."""
        if os.getpid() != self.pid:
            return
        try:
            _sibling("torch_syncs").end(self)
            if self.prof is not None and not self.prof_done:
                if self.windows:  # a re-trace cut short: the last complete trace stays
                    self.discard = True
                    self.prof.stop()
                    self._after_stop()
                else:
                    self.note(f"the job ended inside the profiling window (step {self.step}): "
                              "the trace holds the steps completed so far")
                    prof = self.prof
                    prof.stop()
                    self._after_stop()
                    if not self.prof_done:
                        self._write_trace(prof)
        except Exception as e:  # noqa: BLE001
            self.note(f"profiler stop failed: {type(e).__name__}: {e}")
        self._measure_fault_cost()
        self.flush()
        self.write_meta()

    # -- notes and meta --------------------------------------------------------------------
    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            self.write_meta()

    def write_meta(self) -> None:
        torch = sys.modules.get("torch")
        meta = {"rank": self.rank, "pid": os.getpid(), "steps_seen": self.step,
                "torch": getattr(torch, "__version__", None),
                "skip": self.skip, "steps": self.steps, "notes": self.notes,
                "dataloader_workers": sorted(self.dataloader_workers),
                "dataloader_prefetch": self.prefetch,
                "explicit_steps": self.explicit, "traced_steps": self.traced_steps,
                "windows": self.windows[-20:], "retrace_s": self.retrace_s,
                "cupti_teardown": self.cupti, "thread_waits": self.peers.meta(),
                # what the DataLoader advice weighs a wait's CPU use against (analyzers.host_cpu)
                "cpus": _cpus(), "intra_op_threads": _threads(torch), "fault_us": self.fault_us,
                # as the job left it (set before torch loads libgomp): a passive policy's threads
                # sleep at each parallel region's end (analyzers.host_wait.passive_threads)
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
        path = self.run_dir / "samples" / f"bootstrap-rank-{self.rank}.json"
        try:
            tmp = path.with_suffix(".partial")
            tmp.write_text(json.dumps(meta))
            tmp.replace(path)
        except OSError:
            pass


def _thread_sched(fds: dict[int, int]) -> tuple[int, int, int, int] | None:
    """(thread id, ns on a core, ns runnable but waiting for one, times put on a core) of the
    calling thread, from
    its ``/proc/self/task/<tid>/schedstat`` (Linux; None elsewhere). Read at each step boundary
    by the thread that ends the step (the optimizer's hook or ``gpudiag.step()`` runs in the
    training loop's thread, whatever DataLoader workers or intra-op threads exist), so each
    step row says how long that thread waited for a core: the part of a GPU job's host gaps
    the OS gave to other work. ``fds`` keeps each thread's file open: a ``pread`` at offset 0
    re-reads it, 1.8 us of CPU against 12 us for an open and read each step (this project's
    2-core VM).

    The time on a core is the thread's CPU clock (``time.thread_time_ns``), not schedstat's
    first field: the kernel brings a running thread's ``sum_exec_runtime`` up to date only at
    a tick or a switch, so read by the thread itself it lags by up to a tick (4 ms at HZ=250:
    a 5 ms step's time on a core read 4 or 8 ms, and the time it slept, the step less the two,
    +0.6 ms in most steps and -3.4 ms in a few). The CPU clock brings it up to date first."""
    try:
        tid = threading.get_native_id()
        fd = fds.get(tid)
        if fd is None:
            fd = fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        _, wait, slices = os.pread(fd, 128, 0).split()
        return tid, time.thread_time_ns(), int(wait), int(slices)
    except (OSError, ValueError, AttributeError):
        return None


def _clock_and_sched(fds: dict[int, int]) -> tuple[float, tuple[int, int, int, int] | None]:
    """``time.perf_counter()`` and the calling thread's counters (``_thread_sched``) at one
    instant: the wall clock that ends a step and the waits that step held must be read together.
    Read apart, a preemption between them puts its wait in one step's counters and its wall in
    the next step's: beside `make test` (load 8 on 2 cores), when the step timer read its counters
    after the collectives and faults, 7 of 35 steps of a 10 ms sleep loop read a wait longer than
    the step, the steps after them an own pace up to 2x the truth, and `diff` of a 10 ms
    regression (+85% by the job's sleeps) a noise floor of 7-56% and intervals as wide as
    +38..+89% and +49..+143%; read together, six runs: 5% and +82..+88%. The counters are
    read on both sides of the clock and again while a wait landed between them (the kernel adds
    a wait when the thread gets its core back, so a preemption shows as a changed wait)."""
    before = _thread_sched(fds)
    for _ in range(3):
        now = time.perf_counter()
        after = _thread_sched(fds)
        if before is None or after is None or after[0] != before[0] or after[2] == before[2]:
            return now, after
        before = after
    return now, after


def _cpus() -> int | None:
    """Cores this process may run on (its affinity mask, which a batch system narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _threads(torch: Any) -> int | None:  # torch, when the job imported it
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except Exception:  # noqa: BLE001 - a broken torch must not break the job's exit
        return None


_config: tuple[Path, int, int, float] | None = None


def _get_state() -> _Bootstrap | None:
    """The state, created on the first step or collective of a training process.

    Lazily, so processes that import torch but never train (torchrun's launcher, tools)
    write nothing, and forked workers never write as their parent.
    """
    global _state
    if _state is not None:
        return _state if _state.pid == os.getpid() else None
    if _config is None:
        return None
    _state = _Bootstrap(*_config)
    atexit.register(_state.finish)
    _chain_sigterm()
    return _state


def _on_step(explicit: bool) -> None:
    st = _get_state()
    if st is None:
        return
    before = st.step
    try:
        st.on_step(explicit)
    except Exception as e:  # noqa: BLE001 - never break the job
        st.note(f"step accounting failed: {type(e).__name__}: {e}")
    if st.step != before and _STALL_WATCH:
        _sibling("stall_watch").on_step(st)


def step() -> None:
    """``gpudiag.step()``: the end of one training step, for loops without an optimizer."""
    _on_step(explicit=True)


def _collectives() -> Any:
    return _sibling("torch_collectives")


def _sibling(stem: str) -> Any:
    """A module beside this one (``torch_collectives``, ``torch_cupti``, ``thread_waits``),
    loaded under gpudiag's name (the job's Python may not have gpudiag, and its sys.path is
    never extended)."""
    name = f"gpudiag.collectors.{stem}"
    mod = sys.modules.get(name)
    if mod is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).with_name(f"{stem}.py"))
        if spec is None or spec.loader is None:
            raise ImportError(f"gpudiag: cannot load {name} beside {__file__}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


def _armed_state() -> _Bootstrap | None:
    return _get_state() if _config is not None else None


def arm(torch: Any) -> None:
    """Called once torch is imported in a process started by ``gpudiag profile``."""
    global _config
    run_dir = os.environ.get("GPUDIAG_RUN_DIR")
    if not run_dir or _config is not None:
        return
    try:
        _config = (Path(run_dir), int(os.environ.get("GPUDIAG_SKIP", "10")),
                   int(os.environ.get("GPUDIAG_STEPS", "5")),
                   float(os.environ.get("GPUDIAG_RETRACE_S", "0")))
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(lambda *_: _on_step(explicit=False))
        import torch.distributed as dist

        _sibling("torch_cupti").watch_graphs(torch)
        colls = _collectives()
        colls.set_flight_recorder_env(str(torch.__version__), _gpu_build(torch))
        colls.wrap_collectives(dist, _armed_state)
        _arm_stall_watch(torch, dist, Path(run_dir))
        if dist.is_available():
            colls.patch_ddp(torch, _armed_state)
        _patch_dataloader(torch)
        _patch_save(torch)
    except Exception as e:  # noqa: BLE001 - the job must run even if we cannot observe it
        print(f"gpudiag: bootstrap failed, the job runs unobserved: {e}", file=sys.stderr)


_STALL_WATCH = False


def _arm_stall_watch(torch: Any, dist: Any, run_dir: Path) -> None:
    """The stall watch (``stall_watch``, beside this file) where ``gpudiag profile`` asked for it:
    stacks on a signal in every process, each collective and step in the rank's black box."""
    global _STALL_WATCH
    watch = _sibling("stall_watch")
    if not watch.enabled():
        return
    watch.install_stack_dump(run_dir)
    watch.wrap_collectives(dist, _collectives().COLLECTIVES, _armed_state, torch)
    _STALL_WATCH = True


def _gpu_build(torch: Any) -> bool:  # the job's torch
    """Whether this torch was built for CUDA or ROCm (without touching the device)."""
    version = getattr(torch, "version", None)
    return bool(getattr(version, "cuda", None) or getattr(version, "hip", None))


def _patch_dataloader(torch: Any) -> None:
    dl = torch.utils.data.DataLoader
    orig_iter = dl.__iter__

    @functools.wraps(orig_iter)
    def it(self: Any) -> Any:
        st = _get_state()
        if st is not None:
            workers = int(getattr(self, "num_workers", 0))
            st.dataloader_workers.add(workers)
            if workers > 0:  # the batches its workers can hold ready (torch's default factor: 2)
                st.prefetch = max(st.prefetch, workers * int(getattr(self, "prefetch_factor", None) or 2))
        out = orig_iter(self)
        if st is not None:  # its workers' threads are the job's: their waits are read too
            st.peers.add_workers(getattr(w, "pid", None) for w in getattr(out, "_workers", ()))
        return out

    dl.__iter__ = it
    base = getattr(torch.utils.data.dataloader, "_BaseDataLoaderIter", None)
    if base is None:
        return
    orig_next = base.__next__

    @functools.wraps(orig_next)
    def nxt(self: Any) -> Any:
        """The batch, with the thread's time in it on a core and waiting for one (schedstat):
        decoding runs, a read or a sleep blocks; the diagnosis tells them apart by this
        (``analyzers.host_cpu``), and never takes a busy machine's share out of a block."""
        st = _get_state()
        if st is None or os.getpid() != st.pid:
            return orig_next(self)
        t0, s0 = _clock_and_sched(st.sched_fds)
        try:
            return orig_next(self)
        finally:
            t1, s1 = _clock_and_sched(st.sched_fds)
            if s0 is not None and s1 is not None and s0[0] == s1[0]:
                st.input[0] += t1 - t0
                st.input[1] += (s1[1] - s0[1]) / 1e9
                st.input[2] += (s1[2] - s0[2]) / 1e9

    base.__next__ = nxt


def _patch_save(torch: Any) -> None:
    """Time ``torch.save`` in the job's process (a checkpoint: pickling and writing, on the
    thread that calls it), so a periodic save's share of the steps can be named; a save from
    another thread (an asynchronous checkpoint) is not the step's and is not counted."""
    orig = torch.save
    main = threading.main_thread()

    @functools.wraps(orig)
    def save(*args: Any, **kwargs: Any) -> Any:
        st = _get_state()
        if st is None or os.getpid() != st.pid or threading.current_thread() is not main:
            return orig(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            st.save_s += time.perf_counter() - t0

    torch.save = save


def _chain_sigterm() -> None:
    """On SIGTERM (torchrun stopping workers, a scheduler's kill), flush, then die the same way.

    Only when the job has not installed its own handler: we never change how a job reacts.
    """
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def handler(signum: int, frame: Any) -> None:
        if _state is not None:
            _state.finish()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass
