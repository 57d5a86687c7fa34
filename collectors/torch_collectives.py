"""Collective timing inside the profiled job, per step: blocking calls, async ones, DDP's, NCCL's.

Loaded by ``torch_bootstrap`` from the file beside it (standard library and torch only, as the
bootstrap: the job's Python may not have gpudiag). Each step row gets, per collective type,
``count``, ``seconds`` (how long the collectives ran) and ``exposed`` (how long the step waited
for them, where that is known):

- blocking ``torch.distributed`` calls (gloo): their wall time, all of it waited for;
- ``async_op=True`` calls: from the call to the completion of their future (how long the step
  waited is the caller's business: not known);
- DDP's gradient all-reduce (gloo; with NCCL the flight recorder below times it): DDP's
  reducer calls the process group from C++, past any Python wrapper, so a communication hook
  times each bucket from its launch during backward to its completion; the step waits from
  the last bucket's launch (backward's end) to the last completion, and only that is exposed.
  The hook does what DDP does by default (divide by the world size, all-reduce) or what the
  job registers itself, which it then calls: the job's own hook still runs, timed;
- NCCL: PyTorch's flight recorder measures each collective with CUDA events
  (``TORCH_NCCL_ENABLE_TIMING``), polled when the step rows are flushed.

Each row also gets ``comm_cpu_s``: the CPU seconds the collectives' own threads ran over the
step (gloo's, ``CommThreads``), what communication took from the cores beside its time.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all", "all_to_all_single",
               "barrier", "send", "recv", "gather", "scatter")

# The flight recorder's ring buffer (its size comes from gpudiag profile, collectors/job.py):
# torch 2.8 renamed TORCH_NCCL_TRACE_BUFFER_SIZE to TORCH_FR_BUFFER_SIZE, and later versions
# warn on every rank when the old name is set (NVIDIA/nvidia-resiliency-ext#163 uses the same
# version split), so the name is chosen for the torch the job runs.
FR_NEW_NAME_SINCE = (2, 8)


def _short(name: str) -> str:
    return name.replace("_into_tensor", "").replace("_tensor", "").replace("_single", "")


class StepCollectives:
    """What ran in the current step; ``drain`` gives the row's ``collectives`` and resets."""

    def __init__(self) -> None:
        self.blocking: dict[str, list[float]] = {}
        self.done: list[tuple[str, float, float, bool]] = []  # (name, start, end, ddp), any thread
        # inside gpudiag's DDP hook (which times the bucket itself): the collectives the hook, or
        # a hook of the job's it calls, issues through torch.distributed are not timed twice
        self.in_ddp_hook = False

    def record_blocking(self, name: str, seconds: float) -> None:
        c = self.blocking.setdefault(name, [0, 0.0])
        c[0] += 1
        c[1] += seconds

    def record_async(self, name: str, start: float, end: float, ddp: bool) -> None:
        self.done.append((name, start, end, ddp))  # list.append is atomic under the GIL

    def drain(self) -> dict[str, dict[str, float]]:
        if not self.blocking and not self.done:
            return {}
        out: dict[str, dict[str, float]] = {
            k: {"count": int(v[0]), "seconds": v[1], "exposed": v[1]} for k, v in self.blocking.items()}
        self.blocking = {}
        done, self.done = self.done, []
        for name in {d[0] for d in done}:
            mine = [d for d in done if d[0] == name]
            c = out.setdefault(name, {"count": 0, "seconds": 0.0})
            c["count"] += len(mine)
            c["seconds"] += _union([(s, e) for _, s, e, _ in mine])  # in flight, queued included
            ddp = [d for d in mine if d[3]]
            if ddp:  # the step waits from the last bucket's launch to the last completion
                wait = max(0.0, max(e for _, _, e, _ in ddp) - max(s for _, s, _, _ in ddp))
                c["exposed"] = c.get("exposed", 0.0) + wait
        return out


class CommThreads:
    """CPU time of the collectives' own threads (gloo's: ``pt_gloo_runloop`` runs the
    algorithm, ``gloo_tcp_loop`` the transport), per step. On a CPU they run on the cores the
    ranks compute on: where those are short, each second they run is a second the compute waits,
    a cost of communication beyond its exposed time that no trace shows. Read from each thread's
    ``/proc/self/task/<tid>/schedstat`` (Linux; nothing elsewhere), files kept open (a ``pread``
    a step per thread, a few microseconds); the threads are looked for at most once per
    ``LOOK_EVERY_S`` (a process group creates them when it is made)."""

    LOOK_EVERY_S = 5.0
    NAMES = ("gloo",)

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.looked = float("-inf")

    def _look(self) -> None:
        self.looked = time.monotonic()
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return
        for t in tids:
            tid = int(t)
            if tid in self.fds:
                continue
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if not any(n in f.read() for n in self.NAMES):
                        continue
                self.fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except (OSError, ValueError):
                continue

    def step_cpu_s(self) -> float | None:
        """CPU seconds the collectives' threads ran since the last call; None before any exists
        (or the first time they are read: no interval yet)."""
        if time.monotonic() - self.looked >= self.LOOK_EVERY_S:
            self._look()
        if not self.fds:
            return None
        total, fresh = 0, False
        for tid, fd in list(self.fds.items()):
            try:
                run = int(os.pread(fd, 128, 0).split()[0])
            except (OSError, ValueError, IndexError):  # the thread ended
                os.close(fd)
                del self.fds[tid]
                continue
            prev = self.last.get(tid)
            self.last[tid] = run
            if prev is None:
                fresh = True
                continue
            total += run - prev
        return None if fresh and total == 0 else total / 1e9


def _union(spans: list[tuple[float, float]]) -> float:
    """Seconds during which at least one of the spans was open (buckets overlap each other)."""
    total = 0.0
    end = float("-inf")
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def wrap_collectives(dist: Any, state: Any) -> None:
    """Time ``torch.distributed``'s collective calls; ``state()`` is the bootstrap or None."""
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "_gpudiag", False):
            continue
        setattr(dist, name, _timed(dist, name, fn, state))


def _timed(dist: Any, name: str, fn: Any, state: Any) -> Any:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        st = state()
        if st is None or st.collectives.in_ddp_hook:
            return fn(*args, **kwargs)
        if st.backend is None and dist.is_initialized():
            st.backend = str(dist.get_backend())
        if st.backend is not None and st.backend.startswith("nccl"):
            return fn(*args, **kwargs)  # timed on the GPU by the flight recorder instead
        t = time.perf_counter()
        if kwargs.get("async_op"):
            work = fn(*args, **kwargs)
            try:
                work.get_future().then(lambda _f: st.collectives.record_async(
                    _short(name), t, time.perf_counter(), False))
            except Exception:  # noqa: BLE001 - a backend without futures: untimed
                pass
            return work
        try:
            return fn(*args, **kwargs)
        finally:
            st.collectives.record_blocking(_short(name), time.perf_counter() - t)

    timed._gpudiag = True  # type: ignore[attr-defined]
    return timed


def patch_ddp(torch: Any, state: Any) -> None:
    """Time DDP's gradient all-reduce per bucket through a communication hook (see above)."""
    ddp_cls = torch.nn.parallel.DistributedDataParallel
    if getattr(ddp_cls, "_gpudiag", False):
        return
    init, register, builtin = (ddp_cls.__init__, ddp_cls.register_comm_hook,
                               ddp_cls._register_builtin_comm_hook)

    @functools.wraps(init)
    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        st = state()
        if st is None:
            return
        try:
            _install(torch, self, register, st)
        except Exception as e:  # noqa: BLE001 - never break the job
            st.note(f"DDP collectives untimed: {type(e).__name__}: {e}")

    @functools.wraps(register)
    def patched_register(self: Any, hook_state: object, hook: Any) -> None:
        if not getattr(self, "_gpudiag_timed", False):
            register(self, hook_state, hook)
            return None
        self._check_comm_hook(hook)
        self._gpudiag_delegate = (hook, hook_state)
        if self.logger is not None:
            self.logger._set_comm_hook_name(hook.__qualname__)
        return None

    @functools.wraps(builtin)
    def patched_builtin(self: Any, comm_hook_type: Any) -> None:
        if not getattr(self, "_gpudiag_timed", False):
            builtin(self, comm_hook_type)
            return None
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hooks = {"ALLREDUCE": None, "FP16_COMPRESS": default_hooks.fp16_compress_hook}
        kind = getattr(comm_hook_type, "name", str(comm_hook_type))
        if kind not in hooks:
            builtin(self, comm_hook_type)  # fails as DDP would: a hook is registered
            return None
        self._gpudiag_delegate = None if hooks[kind] is None else (hooks[kind], self.process_group)
        return None

    ddp_cls.__init__ = patched_init
    ddp_cls.register_comm_hook = patched_register
    ddp_cls._register_builtin_comm_hook = patched_builtin
    ddp_cls._gpudiag = True


def _install(torch: Any, ddp: Any, register: Any, st: Any) -> None:
    dist = torch.distributed
    if (getattr(ddp, "_use_python_reducer", False) or getattr(ddp, "_delay_all_reduce_all_params", False)
            or not hasattr(ddp, "reducer")):
        return
    if str(dist.get_backend(ddp.process_group)).startswith("nccl"):
        return  # the flight recorder times NCCL, DDP's collectives included
    ddp._gpudiag_delegate = None
    colls = st.collectives
    group = ddp.process_group

    # no annotations: DDP's _check_comm_hook compares them with dist.GradBucket and Future[Tensor]
    def gpudiag_timed_allreduce(_state, bucket):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        delegate = ddp._gpudiag_delegate
        if delegate is not None:
            colls.in_ddp_hook = True
            try:
                fut = delegate[0](delegate[1], bucket)
            finally:
                colls.in_ddp_hook = False

            def done(f: Any) -> Any:
                colls.record_async("all_reduce", t, time.perf_counter(), True)
                return f.value()

            return fut.then(done)
        # DDP's default (torch's allreduce_hook): divide by the world size, sum; one callback
        # that times the bucket and hands DDP the reduced buffer
        tensor = bucket.buffer()
        tensor.div_(group.size())

        def reduced(f: Any) -> Any:
            colls.record_async("all_reduce", t, time.perf_counter(), True)
            return f.value()[0]

        # through dist.all_reduce as the job would call it (the stall watch's black box records
        # it), with the timing wrapper told to pass it through: this hook times it, once
        colls.in_ddp_hook = True
        try:
            work = dist.all_reduce(tensor, group=group, async_op=True)
        finally:
            colls.in_ddp_hook = False
        return work.get_future().then(reduced)

    register(ddp, None, gpudiag_timed_allreduce)
    ddp._gpudiag_timed = True


def set_flight_recorder_env(torch_version: str, gpu_build: bool = True) -> None:
    """Ask for the flight recorder's buffer under the name this torch reads, unless the job
    set either name itself (``gpudiag profile`` passes the size in GPUDIAG_FR_BUFFER_SIZE).
    Only for a torch built for a GPU: the recorder times NCCL, which a CPU build has not, and a
    gloo job would pay for entries nobody reads."""
    size = os.environ.get("GPUDIAG_FR_BUFFER_SIZE")
    if (not size or not gpu_build or "TORCH_FR_BUFFER_SIZE" in os.environ
            or "TORCH_NCCL_TRACE_BUFFER_SIZE" in os.environ):
        return
    try:
        version = tuple(int(x) for x in torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        version = FR_NEW_NAME_SINCE
    name = "TORCH_FR_BUFFER_SIZE" if version >= FR_NEW_NAME_SINCE else "TORCH_NCCL_TRACE_BUFFER_SIZE"
    os.environ[name] = size


def poll_flight_recorder(st: Any) -> None:
    """NCCL collective durations from PyTorch's flight recorder (GPU time, not launch).

    NCCL calls return before the collective runs, so their wall time says nothing; with
    TORCH_NCCL_ENABLE_TIMING the flight recorder measures each one with CUDA events.
    Completed entries are attributed to the buffered step that was running when they
    were created; older ones to the first buffered step.
    """
    try:
        import pickle

        import torch

        fn = torch._C._distributed_c10d._dump_nccl_trace  # private, NCCL builds only
        try:
            dump = fn(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        except TypeError:  # older signature
            dump = fn()
        entries = pickle.loads(dump).get("entries", [])
    except Exception as e:  # noqa: BLE001
        st.note(f"NCCL flight recorder unavailable, NCCL collectives untimed: {e}")
        st.backend = "nccl-untimed"
        return
    new = [e for e in entries if e.get("record_id", -1) > st.fr_last_record]
    if new and st.fr_last_record >= 0 and new[0]["record_id"] > st.fr_last_record + 1:
        st.note("more collectives per second than the flight recorder buffer holds: "
                "some NCCL collectives were not timed (raise TORCH_FR_BUFFER_SIZE)")
    for entry in new:
        if entry.get("state") != "completed" or entry.get("duration_ms") is None:
            break  # keep order: later entries are picked up at the next flush
        st.fr_last_record = entry["record_id"]
        created = entry.get("time_created_ns", 0) / 1e9
        row = next((r for r in st.buffer if r["t0"] <= created < r["t"]), st.buffer[0])
        name = str(entry.get("profiling_name", "nccl:unknown")).split(":", 1)[-1]
        c = row.setdefault("collectives", {}).setdefault(name, {"count": 0, "seconds": 0.0})
        c["count"] += 1
        c["seconds"] += float(entry["duration_ms"]) / 1e3
