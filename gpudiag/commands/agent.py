"""``gpudiag agent``: the node daemon that exports GPU counters and job signals."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import click

from gpudiag.contract import AGENT_LISTEN, AGENT_PORT, ENV_AGENT_DIR, METRICS_PATH
from gpudiag.errors import BadInput

_LISTEN = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]*):(\d{1,5})$")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--listen", default=AGENT_LISTEN, show_default=True, metavar="ADDR:PORT",
              help=f"Where {METRICS_PATH} is served (0.0.0.0:{AGENT_PORT} to let Prometheus scrape "
                   "the node).")
@click.option("--backend", default="nvml", show_default=True, metavar="nvml|replay:FILE|none",
              help="GPU counters from NVML, replayed from a recorded samples file, or none "
                   "(a node without GPUs: host and job metrics only).")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="Job state and the spool jobs write signals into "
                   f"(default: ${ENV_AGENT_DIR}, /var/lib/gpudiag as root, else ~/.local/state/gpudiag).")
@click.option("--hpc-job-mapping-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              envvar="DCGM_HPC_JOB_MAPPING_DIR", show_envvar=True,
              help="dcgm-exporter's HPC job-mapping folder (files named by GPU index, each listing "
                   "the job ids a Slurm prolog put on that GPU): GPU series get hpc_job, and job_id "
                   "slurm:<id> where no process names the job.")
def agent(listen: str, backend: str, state_dir: Path | None, hpc_job_mapping_dir: Path | None) -> None:
    """Export this node's GPU counters and the efficiency signals of jobs run under gpudiag.

    Prometheus scrapes /metrics: per GPU (labels gpu, uuid, model, job_id) SM/tensor activity,
    DRAM bandwidth, NVLink/PCIe throughput (GPM where supported), legacy utilisation,
    memory, power, clock, temperature, throttle reasons and gpudiag_gpu_up; per job
    (gpudiag profile reports here) MFU, step time, bottleneck label with its confidence and
    the age of the trace behind it, profiler dilation, input wait and collective time. A
    job is (job_id, owner_uid): owner_uid is the uid that wrote its signals (the spool
    file's owner), so no user can report for another's job; a signal naming a job whose
    processes run as someone else is refused. Signals are taken in every second, scraped or
    not, into STATE_DIR/jobs.json (what `gpudiag scheduler serve` reads). The job label is
    called job_id because Prometheus reserves "job". With a job-mapping folder (as
    dcgm-exporter reads it), GPU series also carry hpc_job, one series per listed job.

    \b
    Example:
      gpudiag agent --listen 0.0.0.0:9835
      gpudiag profile -- python train.py     # on the same node: its signals appear
    """
    from gpudiag.agent.server import serve
    from gpudiag.collectors.nvml import check_backend_spec
    from gpudiag.jobsignal import default_state_dir

    m = _LISTEN.match(listen)
    if not m or not 0 < int(m.group(2)) < 65536:
        raise BadInput(f"--listen {listen!r}: use ADDR:PORT, e.g. {AGENT_LISTEN}")
    try:
        check_backend_spec(backend)
    except ValueError as e:
        raise BadInput(f"--backend: {e}") from None
    logging.basicConfig(level=logging.INFO, format="gpudiag agent: %(message)s")
    state = state_dir or default_state_dir()
    try:
        serve(listen, backend, state, job_mapping_dir=hpc_job_mapping_dir)
    except OSError as e:
        raise BadInput(f"cannot serve on {listen} or use {state}: {e.strerror or e}") from None
