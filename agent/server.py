"""The node agent: a Prometheus endpoint over the GPU and job-signal collectors."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpudiag.agent.attribution import HpcJobMapping, JobAttribution, JobOwners
from gpudiag.agent.gpu_collector import GpuCollector
from gpudiag.agent.job_table import JobTable
from gpudiag.collectors.nvml import GpuBackend, NvmlUnavailable, open_backend

log = logging.getLogger("gpudiag.agent")


class HostCollector(Collector):
    """Node health that needs no GPU: CPU count, load and available memory."""

    def collect(self) -> Iterator[Metric]:
        cpus = GaugeMetricFamily("gpudiag_host_cpus", "Logical CPUs on the node.")
        cpus.add_metric([], float(os.cpu_count() or 0))
        yield cpus
        try:
            load1 = os.getloadavg()[0]
            load = GaugeMetricFamily("gpudiag_host_load1", "One-minute load average.")
            load.add_metric([], load1)
            yield load
        except OSError:
            pass
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        mem = GaugeMetricFamily("gpudiag_host_memory_available_bytes",
                                                "Memory available for new work.")
                        mem.add_metric([], float(line.split()[1]) * 1024)
                        yield mem
                        break
        except OSError:
            pass


def build_registry(backend_spec: str, state_dir: Path,
                   job_mapping_dir: Path | None = None) -> tuple[CollectorRegistry, str | None]:
    """The agent's collectors, and why GPU counters are unavailable (None when they are).
    ``job_mapping_dir``: dcgm-exporter's HPC job-mapping folder, read at every scrape.

    The GPU collector is registered before the job table, so each scrape attributes GPU
    processes to jobs (and their owners) before it ingests signals, which are checked
    against those owners.
    """
    registry = CollectorRegistry(auto_describe=False)
    try:
        backend: GpuBackend | None = open_backend(backend_spec)
        unavailable = None
    except NvmlUnavailable as e:
        backend, unavailable = None, str(e)
    owners = JobOwners()
    mapping = HpcJobMapping(job_mapping_dir) if job_mapping_dir is not None else None
    registry.register(GpuCollector(backend, JobAttribution(owners), mapping))
    registry.register(JobTable(state_dir, owners))
    registry.register(HostCollector())
    registry.register(ProcessCollector(namespace="gpudiag_agent", registry=None))
    return registry, unavailable


def serve(listen: str, backend_spec: str, state_dir: Path, ready: threading.Event | None = None,
          job_mapping_dir: Path | None = None) -> None:
    host, _, port = listen.rpartition(":")
    registry, unavailable = build_registry(backend_spec, state_dir, job_mapping_dir)
    if job_mapping_dir is not None:
        log.info("GPU series carry hpc_job from the job-mapping folder %s", job_mapping_dir)
    if unavailable:
        log.warning("GPU counters are unavailable: %s (exporting host and job metrics only)",
                    unavailable)
    server, thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
    log.info("serving /metrics on %s:%s, spool %s", host or "127.0.0.1", server.server_port,
             state_dir / "spool")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if ready is not None:
        ready.set()
    stop.wait()
    server.shutdown()
