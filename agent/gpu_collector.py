"""Per-GPU metrics read at scrape time (prometheus_client custom collector).

Like node_exporter and dcgm-exporter, hardware is read inside ``collect()``: no background
thread, no stale cache, and a scrape costs exactly one read of each GPU. One GPU that fails
(off the bus, Xid) is reported ``gpudiag_gpu_up 0`` and counted in
``gpudiag_gpu_errors_total``; the others are exported as usual.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpudiag import contract as c
from gpudiag.agent.attribution import gpudiag_job_id
from gpudiag.collectors.nvml import GpuBackend

log = logging.getLogger("gpudiag.agent")

# NVML clock event reasons (nvml.h nvmlClocksEventReason*), exported one series per reason.
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}

# A GPU below this SM activity (GPM), or NVML utilisation where the GPU has no GPM, is idle
# (gpudiag_gpus_idle): what `gpudiag fleet` counts as GPU-hours held while idle.
IDLE_ACTIVITY = 0.05

# (row key, metric name, help, scale to base unit)
GAUGES: list[tuple[str, str, str, float]] = [
    ("gpm_sm_activity", c.GPU_SM_ACTIVITY, "Fraction of time SMs were busy (GPM).", 0.01),
    ("gpm_sm_occupancy", c.GPU_SM_OCCUPANCY, "Resident warps over the maximum (GPM).", 0.01),
    ("gpm_any_tensor_activity", c.GPU_TENSOR_ACTIVITY,
     "Fraction of time any tensor core pipe was busy (GPM).", 0.01),
    ("gpm_dram_bw_util", c.GPU_DRAM_BANDWIDTH,
     "DRAM bandwidth used over its peak (GPM).", 0.01),
    ("gpm_fp32_activity", c.GPU_FP32_ACTIVITY, "Non-tensor FP32 pipe activity (GPM).", 0.01),
    ("gpm_fp16_activity", c.GPU_FP16_ACTIVITY, "Non-tensor FP16 pipe activity (GPM).", 0.01),
    ("gpm_pcie_tx_mib_s", c.GPU_PCIE_TX, "PCIe bytes sent (GPM).",
     2**20),
    ("gpm_pcie_rx_mib_s", c.GPU_PCIE_RX, "PCIe bytes received (GPM).",
     2**20),
    ("gpm_nvlink_tx_mib_s", c.GPU_NVLINK_TX,
     "NVLink bytes sent, all links (GPM).", 2**20),
    ("gpm_nvlink_rx_mib_s", c.GPU_NVLINK_RX,
     "NVLink bytes received, all links (GPM).", 2**20),
    ("util_gpu", c.GPU_UTILIZATION,
     "Legacy utilisation: fraction of time any kernel ran (coarse; prefer SM activity).", 0.01),
    ("mem_used", c.GPU_MEMORY_USED, "Device memory in use.", 1.0),
    ("mem_total", c.GPU_MEMORY_TOTAL, "Device memory in all.", 1.0),
    ("power_mw", c.GPU_POWER, "Power draw.", 0.001),
    ("sm_clock_mhz", c.GPU_SM_CLOCK, "SM clock.", 1e6),
    ("temp_c", c.GPU_TEMPERATURE, "GPU temperature.", 1.0),
]


def _idle(row: dict[str, Any]) -> bool | None:
    """Whether the GPU is idle; None where it reports neither SM activity nor utilisation."""
    for key in ("gpm_sm_activity", "util_gpu"):
        v = _num(row.get(key))
        if v is not None:
            return v * 0.01 < IDLE_ACTIVITY
    return None


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if f == f else None


class GpuCollector(Collector):
    """Exports every GPU of ``backend`` (None: NVML is unavailable, only ``gpudiag_nvml_up 0``);
    ``job_of`` maps a GPU's PIDs to a job id ("" if none).

    ``hpc_jobs`` (given when the agent reads a dcgm-exporter job-mapping folder) says which jobs
    the scheduler's prolog put on each GPU. Then every GPU series also carries ``hpc_job`` as
    dcgm-exporter's do: a mapped GPU is exported once per listed job, an unmapped one with
    ``hpc_job=""``. Such a series' ``job_id`` is its processes' job when the PIDs name one, else
    the mapped job's (``gpudiag_job_id``): the mapping covers what the PIDs cannot show (an agent
    without the host's PID namespace, a job between kernels).

    Scrapes are serialised by a lock: each reads every GPU once (GPM metrics are the
    difference between this read and the previous one, so reads must not interleave) and
    updates the error counts.
    """

    def __init__(self, backend: GpuBackend | None, job_of: Callable[[list[int]], str],
                 hpc_jobs: Callable[[], dict[int, list[str]]] | None = None,
                 holder: Callable[[str], int | None] | None = None,
                 names: Callable[[int], str | None] | None = None) -> None:
        self.backend = backend
        self.job_of = job_of
        self.hpc_jobs = hpc_jobs
        self.holder = holder    # job id -> the uid running it (its processes, its mapping file)
        self.names = names      # uid -> login name on this node
        self.errors: dict[str, int] = {}
        self.info = backend.describe() if backend is not None else []
        self._lock = threading.Lock()

    def collect(self) -> list[Metric]:
        with self._lock:
            return self._families()

    def _families(self) -> list[Metric]:
        up_nvml = GaugeMetricFamily(c.NVML_UP, "1 if GPU counters can be read on this node.")
        up_nvml.add_metric([], 0.0 if self.backend is None else 1.0)
        if self.backend is None:
            return [up_nvml]
        mapping = self.hpc_jobs() if self.hpc_jobs is not None else None
        labels = ["gpu", "uuid", "model", "job_id"] + (["hpc_job"] if mapping is not None else [])
        up = GaugeMetricFamily(c.GPU_UP, "1 if the GPU answered this scrape.", labels=labels)
        gauges = {name: GaugeMetricFamily(name, help_, labels=labels) for _, name, help_, _ in GAUGES}
        # per job (not per GPU): what gpudiag fleet sums, with a job's GPUs in one series, so a
        # week of 1,000 GPUs is read from ~8x fewer samples than gpudiag_gpu_up holds
        held = GaugeMetricFamily(c.GPUS_HELD, f"GPUs each job holds on this node, as {c.GPU_UP} "
                                 "counts them (job_id \"\": GPUs no job holds).", labels=["job_id"])
        idle = GaugeMetricFamily(c.GPUS_IDLE, "Of a job's GPUs here, those idle: SM activity "
                                 f"(GPM) below {IDLE_ACTIVITY:.0%}, or NVML utilisation where a GPU has "
                                 "no GPM.", labels=["job_id"])
        held_by = GaugeMetricFamily(c.GPU_JOB_OWNER,
                                    "1, labelled with the uid running a job that holds GPUs here (its "
                                    "processes' owner, else its job-mapping file's non-root owner) and "
                                    "that uid's login name on this node.",
                                    labels=["job_id", "owner_uid", "user"])
        throttle = GaugeMetricFamily(c.GPU_CLOCK_THROTTLED,
                                     "1 while the clocks are held down for this reason.",
                                     labels=[*labels, "reason"])
        errors = CounterMetricFamily(c.GPU_ERRORS, "Failed reads of this GPU.",
                                     labels=["gpu", "uuid", "model"])
        gpus_of: dict[str, int] = {}
        idle_of: dict[str, int] = {}
        for i in range(self.backend.gpu_count()):
            meta = self.info[i] if i < len(self.info) else {}
            uuid, model = str(meta.get("uuid", "")), str(meta.get("name", ""))
            try:
                row = self.backend.sample(i)
            except Exception as e:  # noqa: BLE001 - a lost GPU must not take the others down
                self.errors[str(i)] = self.errors.get(str(i), 0) + 1
                log.warning("GPU %s: read failed: %s", i, e)
                row = None
            pids = row.get("pids") if row else None
            job = self.job_of(pids if isinstance(pids, list) else [])
            if mapping is None:
                series = [[str(i), uuid, model, job]]
            else:
                series = [[str(i), uuid, model, job or gpudiag_job_id(h), h] for h in mapping.get(i, [])]
                series = series or [[str(i), uuid, model, job, ""]]
            for lv in series:
                up.add_metric(lv, 0.0 if row is None else 1.0)
                gpus_of[lv[3]] = gpus_of.get(lv[3], 0) + 1
                idle_of[lv[3]] = idle_of.get(lv[3], 0) + (row is not None and _idle(row) is True)
                if row is not None:
                    self._add_row(row, lv, gauges, throttle)
            errors.add_metric([str(i), uuid, model], float(self.errors.get(str(i), 0)))
        for job, n in sorted(gpus_of.items()):
            held.add_metric([job], float(n))
            idle.add_metric([job], float(idle_of[job]))
        self._holders(set(gpus_of) - {"", "multiple"}, held_by)
        return [up_nvml, up, *gauges.values(), held, idle, held_by, throttle, errors]

    def _holders(self, jobs: set[str], family: GaugeMetricFamily) -> None:
        for job in sorted(jobs):
            uid = self.holder(job) if self.holder is not None else None
            if uid is None:
                continue
            name = self.names(uid) if self.names is not None else None
            family.add_metric([job, str(uid), name or ""], 1.0)

    @staticmethod
    def _add_row(row: dict[str, Any], lv: list[str], gauges: dict[str, GaugeMetricFamily],
                 throttle: GaugeMetricFamily) -> None:
        for key, name, _, scale in GAUGES:
            v = _num(row.get(key))
            if v is not None:
                gauges[name].add_metric(lv, v * scale)
        mask = _num(row.get("throttle"))
        if mask is not None:
            for bit, reason in THROTTLE_REASONS.items():
                throttle.add_metric([*lv, reason], 1.0 if int(mask) & bit else 0.0)
