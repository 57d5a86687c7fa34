"""GPU counters through NVML (nvidia-ml-py), or replayed from a recording.

Both backends produce the same rows through the same ``Sampler``, so tests and the agent
can run on machines without a GPU by replaying real recordings (``tests/fixtures/h200``).

Every metric is read on its own: an unsupported or failing call yields ``"n/a: <why>"``
for that metric and never takes the others down (nitop's ``Device`` does the same). On
Hopper and later, GPM metrics (SM activity, tensor activity, DRAM bandwidth...) are read
over the sampling interval; older GPUs get only the legacy utilisation counters, which say
"a kernel was running" rather than how busy the SMs were, and rows say which they carry.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpudiag.rundir import read_jsonl

# GPM metric ids (nvml.h, NVML_GPM_METRIC_*) under the names our rows use.
GPM_METRICS: dict[str, int] = {
    "sm_activity": 2, "sm_occupancy": 3, "any_tensor_activity": 5, "dram_bw_util": 10,
    "fp32_activity": 12, "fp16_activity": 13, "pcie_tx_mib_s": 20, "pcie_rx_mib_s": 21,
    "nvlink_rx_mib_s": 60, "nvlink_tx_mib_s": 61,
}
SAMPLES_SCHEMA_VERSION = 1
# NVML's GPM docs: "The interval between two nvmlGpmSampleGet() calls should be greater than
# 100ms due to the internal sample refresh rate". Shorter windows read 0: on an H100 busy
# with a bf16 GEMM loop (SM activity ~95%), 4 windows each read 0 at 1 ms, 3 of 4 at 10 ms,
# 2 of 4 at 50 ms, none at 90, 100 or 200 ms; concurrent agent scrapes ~1 ms apart exported
# 0.0. So a read sooner than this after its window's start returns the previous window's
# values instead of opening a new window. 95 ms, not 100: the sampler's default 100 ms ticks
# jitter by a few ms either way.
GPM_MIN_INTERVAL_S = 0.095


# ``--backend none``: GPU counters off. open_backend raises NvmlUnavailable with this reason,
# exactly what NvmlBackend raises when nvmlInit fails, so everything after it (profile,
# agent) takes the same no-NVML path. For nodes and containers that must not load NVML, and
# for tests of that path that do not depend on whether this machine has a GPU.
NO_BACKEND = "none"
NO_BACKEND_REASON = "GPU counters turned off (--backend none)"


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine; the message says why (NVML's own words)."""


class GpuBackend(Protocol):
    def gpu_count(self) -> int: ...

    def sample(self, index: int) -> dict[str, Any]: ...

    def describe(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


def _na(e: BaseException) -> str:
    return f"n/a: {e}"


class NvmlBackend:
    """Live NVML. Construct it to find out whether NVML works here (NvmlUnavailable if not)."""

    def __init__(self) -> None:
        try:
            import pynvml as nv
        except ImportError as e:  # nvidia-ml-py is a core dependency; say so if it is gone
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({e})") from None
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise NvmlUnavailable(str(e)) from None
        self.nv = nv
        # sample() swaps each GPU's GPM sample pair: callers on several threads (concurrent
        # agent scrapes) must not interleave reads of one GPU
        self._lock = threading.Lock()
        self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        self._gpm: list[list[Any] | None] = []
        self._gpm_start: list[float] = []  # monotonic time of each GPU's window start sample
        self._gpm_last: list[dict[str, Any] | None] = []  # each GPU's last window's values
        for h in self.handles:
            try:
                ok = bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            except Exception:  # noqa: BLE001 - old driver or GPU: no GPM, legacy counters only
                ok = False
            pair = None
            if ok:
                try:
                    pair = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                    nv.nvmlGpmSampleGet(h, pair[0])
                except Exception:  # noqa: BLE001
                    pair = None
            self._gpm.append(pair)
            self._gpm_start.append(time.monotonic())
            self._gpm_last.append(None)

    def gpu_count(self) -> int:
        return len(self.handles)

    def describe(self) -> list[dict[str, Any]]:
        nv = self.nv
        out = []
        for i, h in enumerate(self.handles):
            d: dict[str, Any] = {"index": i, "gpm": self._gpm[i] is not None}
            for key, fn in (("name", nv.nvmlDeviceGetName), ("uuid", nv.nvmlDeviceGetUUID)):
                try:
                    v = fn(h)
                    d[key] = v.decode() if isinstance(v, bytes) else v
                except Exception as e:  # noqa: BLE001
                    d[key] = _na(e)
            try:
                d["driver"] = nv.nvmlSystemGetDriverVersion()
            except Exception as e:  # noqa: BLE001
                d["driver"] = _na(e)
            out.append(d)
        return out

    def sample(self, index: int) -> dict[str, Any]:
        with self._lock:
            return self._sample(index)

    def _sample(self, index: int) -> dict[str, Any]:
        nv = self.nv
        h = self.handles[index]
        row: dict[str, Any] = {}
        calls: dict[str, Callable[[], Any]] = {
            "name": lambda: nv.nvmlDeviceGetName(h),
            "util_gpu": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
            "util_mem": lambda: nv.nvmlDeviceGetUtilizationRates(h).memory,
            "mem_used": lambda: nv.nvmlDeviceGetMemoryInfo(h).used,
            "mem_total": lambda: nv.nvmlDeviceGetMemoryInfo(h).total,
            "power_mw": lambda: nv.nvmlDeviceGetPowerUsage(h),
            "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "throttle": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
            "pids": lambda: [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)],
        }
        for key, fn in calls.items():
            try:
                v = fn()
                row[key] = v.decode() if isinstance(v, bytes) else v
            except Exception as e:  # noqa: BLE001 - one metric never takes the others down
                row[key] = _na(e)
        pair = self._gpm[index]
        if pair is not None:
            now = time.monotonic()
            if now - self._gpm_start[index] >= GPM_MIN_INTERVAL_S:
                self._gpm_last[index] = self._read_gpm(h, pair)
                pair.reverse()  # this sample becomes the next interval's start
                self._gpm_start[index] = now
            last = self._gpm_last[index]
            row.update(last if last is not None else
                       {f"gpm_{m}": "n/a: first GPM window still open" for m in GPM_METRICS})
        return row

    def _read_gpm(self, h: Any, pair: list[Any]) -> dict[str, Any]:
        nv = self.nv
        out: dict[str, Any] = {}
        try:
            nv.nvmlGpmSampleGet(h, pair[1])
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            mg.sample1, mg.sample2 = pair[0], pair[1]
            for j, mid in enumerate(GPM_METRICS.values()):
                mg.metrics[j].metricId = mid
            nv.nvmlGpmMetricsGet(mg)
            for j, name in enumerate(GPM_METRICS):
                m = mg.metrics[j]
                out[f"gpm_{name}"] = m.value if m.nvmlReturn == 0 else f"n/a: nvml error {m.nvmlReturn}"
        except Exception as e:  # noqa: BLE001
            for name in GPM_METRICS:
                out[f"gpm_{name}"] = _na(e)
        return out

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down: nothing left to report to
            pass


class ReplayBackend:
    """Rows from a recorded samples file, in order, per GPU, cycling at the end.

    Recordings are JSONL rows as ``Sampler`` writes them (``t`` and ``gpu`` plus metrics).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        rows: dict[int, list[dict[str, Any]]] = {}
        try:
            lines = path.read_text().splitlines()
        except OSError as e:
            raise NvmlUnavailable(f"cannot read replay file {path}: {e.strerror or e}") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise NvmlUnavailable(f"{path}:{n}: not JSON") from None
            if not isinstance(row, dict):
                raise NvmlUnavailable(f"{path}:{n}: not a samples row")
            if "gpu" not in row:
                if row.get("kind") == "gpu-samples":
                    continue  # the header a Sampler writes
                raise NvmlUnavailable(f"{path}:{n}: not a samples row (no 'gpu')")
            try:
                gpu = int(row["gpu"])
            except (TypeError, ValueError):
                raise NvmlUnavailable(f"{path}:{n}: bad 'gpu' value") from None
            if "error" not in row:
                rows.setdefault(gpu, []).append(row)
        if not rows:
            raise NvmlUnavailable(f"{path}: no samples to replay")
        self.rows = [rows[i] for i in sorted(rows)]
        self.pos = [0] * len(self.rows)
        self._lock = threading.Lock()  # each read advances a position: one reader at a time

    def gpu_count(self) -> int:
        return len(self.rows)

    def describe(self) -> list[dict[str, Any]]:
        return [{"index": i, "name": r[0].get("name", "unknown"), "uuid": f"replay-{i}",
                 "gpm": any(k.startswith("gpm_") for k in r[0]), "driver": "replay",
                 "replay_of": self.path.name} for i, r in enumerate(self.rows)]

    def sample(self, index: int) -> dict[str, Any]:
        with self._lock:
            rows = self.rows[index]
            row = rows[self.pos[index] % len(rows)]
            self.pos[index] += 1
        return {k: v for k, v in row.items() if k not in ("t", "gpu")}

    def close(self) -> None:
        pass


BACKEND_SPECS = "nvml|replay:FILE|none"


def check_backend_spec(spec: str) -> None:
    """ValueError unless ``spec`` is one of BACKEND_SPECS (without opening anything)."""
    if spec not in ("nvml", NO_BACKEND) and not (spec.startswith("replay:") and len(spec) > len("replay:")):
        raise ValueError(f"unknown GPU backend {spec!r}: use nvml, replay:FILE or none")


def open_backend(spec: str) -> GpuBackend:
    """``nvml``, ``replay:FILE`` or ``none``; NvmlUnavailable when there are no counters to read."""
    check_backend_spec(spec)
    if spec == NO_BACKEND:
        raise NvmlUnavailable(NO_BACKEND_REASON)
    if spec == "nvml":
        return NvmlBackend()
    return ReplayBackend(Path(spec[len("replay:"):]))


@dataclass
class SamplerStats:
    samples: int = 0
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    errors: int = 0


class Sampler:
    """Samples every GPU at a fixed interval into an append-only JSONL file.

    Each interval's rows are written and flushed together, so a crash of anything loses at
    most the interval in progress.
    """

    def __init__(self, backend: GpuBackend, out: Path, interval: float,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.backend = backend
        self.out = out
        self.interval = interval
        self.on_error = on_error
        self.stats = SamplerStats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpudiag-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> SamplerStats:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.stats

    def sample_once(self, f: Any) -> None:
        now = time.time()
        lines = []
        for i in range(self.backend.gpu_count()):
            try:
                row = {"t": now, "gpu": i, **_finite(self.backend.sample(i))}
            except Exception as e:  # noqa: BLE001 - a GPU off the bus: keep the others
                self.stats.errors += 1
                row = {"t": now, "gpu": i, "error": str(e)}
            lines.append(json.dumps(row, separators=(",", ":")))
        f.write("\n".join(lines) + "\n")
        f.flush()
        self.stats.samples += 1

    def _run(self) -> None:
        t_wall = time.perf_counter()
        t_cpu = time.thread_time()
        try:
            with self.out.open("a") as f:
                f.write(json.dumps({"schema_version": SAMPLES_SCHEMA_VERSION, "kind": "gpu-samples",
                                    "interval_s": self.interval}) + "\n")
                next_t = time.monotonic()
                while True:
                    self.sample_once(f)
                    next_t += self.interval
                    delay = next_t - time.monotonic()
                    if delay < 0:  # fell behind (slow NVML): skip, do not burst
                        next_t = time.monotonic()
                        delay = 0
                    if self._stop.wait(delay):
                        break
        except OSError as e:
            if self.on_error:
                self.on_error(f"GPU sampler stopped: {e}")
        finally:
            self.stats.cpu_seconds = time.thread_time() - t_cpu
            self.stats.wall_seconds = time.perf_counter() - t_wall


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """GPM returns NaN for a metric it could not compute (first interval, idle engines):
    that is "not available", and NaN is not valid JSON for other readers."""
    return {k: ("n/a: not a number" if isinstance(v, float) and (v != v or v in (_INF, -_INF))
                else v) for k, v in row.items()}


_INF = float("inf")


def read_samples(path: Path) -> list[dict[str, Any]]:
    """GPU rows of a samples file (the header and torn lines are skipped)."""
    return [r for r in read_jsonl(path) if "gpu" in r]
