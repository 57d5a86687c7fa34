"""The node agent: a Prometheus endpoint over the GPU and job-signal collectors, and the timer
that takes in job signals whether or not anything scrapes.

Hardware is read at scrape time (no thread for that). Job signals are not hardware: a scheduler
on the same box reads ``jobs.json``, which must follow the jobs with no Prometheus about, so one
thread ingests the spool every ``INTAKE_PERIOD_S`` (a scrape also ingests, under the same lock).
"""

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

from gpudiag import contract as c
from gpudiag.agent.attribution import HpcJobMapping, JobAttribution, JobOwners
from gpudiag.agent.gpu_collector import GpuCollector
from gpudiag.agent.job_table import JobTable
from gpudiag.agent.signals import closed_to_others
from gpudiag.collectors.nvml import GpuBackend, NvmlUnavailable, open_backend
from gpudiag.collectors.users import UserNames

log = logging.getLogger("gpudiag.agent")

# Jobs report every 15 s (GPUDIAG_SIGNAL_INTERVAL) and once as they end; the local scheduler
# reads jobs.json every 5 s and right after a job ends. One listdir of the spool a second keeps
# jobs.json within a second of the spool for the cost of a stat or two.
INTAKE_PERIOD_S = 1.0


class HostCollector(Collector):
    """Node health that needs no GPU: CPU count, load and available memory."""

    def collect(self) -> Iterator[Metric]:
        cpus = GaugeMetricFamily(c.HOST_CPUS, "Logical CPUs on the node.")
        cpus.add_metric([], float(os.cpu_count() or 0))
        yield cpus
        try:
            load1 = os.getloadavg()[0]
            load = GaugeMetricFamily(c.HOST_LOAD1, "One-minute load average.")
            load.add_metric([], load1)
            yield load
        except OSError:
            pass
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        mem = GaugeMetricFamily(c.HOST_MEMORY_AVAILABLE,
                                                "Memory available for new work.")
                        mem.add_metric([], float(line.split()[1]) * 1024)
                        yield mem
                        break
        except OSError:
            pass


def build_registry(backend_spec: str, state_dir: Path, job_mapping_dir: Path | None = None
                   ) -> tuple[CollectorRegistry, JobTable, str | None]:
    """The agent's collectors, its job table, and why GPU counters are unavailable (None when
    they are). ``job_mapping_dir``: dcgm-exporter's HPC job-mapping folder, read at every scrape.

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
    names = UserNames()
    table = JobTable(state_dir, owners, names=names)

    def holder(job: str) -> int | None:
        uid = owners.uid_of(job)
        return uid if uid is not None or mapping is None else mapping.owners.get(job)

    registry.register(GpuCollector(backend, JobAttribution(owners), mapping, holder, names))
    registry.register(table)
    registry.register(HostCollector())
    registry.register(ProcessCollector(namespace=c.AGENT_PROCESS_NAMESPACE, registry=None))
    return registry, table, unavailable


def intake(table: JobTable, stop: threading.Event, period: float = INTAKE_PERIOD_S) -> None:
    """Ingest the spool every ``period`` until ``stop``: jobs.json stays fresh with no scraper.
    A failing ingest is logged and retried at the next tick, never fatal to the agent."""
    while True:
        try:
            table.ingest()
        except Exception:  # one bad tick must not end the intake for good (BLE: logged with its traceback)
            log.exception("spool intake failed; retrying in %.0f s", period)
        if stop.wait(period):
            return


def serve(listen: str, backend_spec: str, state_dir: Path, ready: threading.Event | None = None,
          job_mapping_dir: Path | None = None) -> None:
    host, _, port = listen.rpartition(":")
    registry, table, unavailable = build_registry(backend_spec, state_dir, job_mapping_dir)
    if job_mapping_dir is not None:
        log.info("GPU series carry hpc_job from the job-mapping folder %s", job_mapping_dir)
    if unavailable:
        log.warning("GPU counters are unavailable: %s (exporting host and job metrics only)",
                    unavailable)
    closed = closed_to_others(table.spool)
    if closed:
        log.warning("only this user's jobs can report to spool %s: %s", table.spool, closed)
    stop = threading.Event()
    table.ingest()   # jobs.json exists as soon as the agent runs, with or without jobs
    taker = threading.Thread(target=intake, args=(table, stop), name="gpudiag-intake", daemon=True)
    server, thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
    log.info("serving /metrics on %s:%s, spool %s", host or "127.0.0.1", server.server_port, table.spool)
    taker.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if ready is not None:
        ready.set()
    stop.wait()
    server.shutdown()
    taker.join(timeout=5)
