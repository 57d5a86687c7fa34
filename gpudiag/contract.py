"""The names other processes rely on, defined once: metric names, the agent's address, the
environment variables between gpudiag and a job, and the limits of a scrape.

Why one module: the agent exports ``gpudiag_job_mfu_ratio``, the scheduler, ``gpudiag top`` and
``gpudiag fleet`` read it, and the tests check it. When each of them spells the name itself, a
rename changes the exporter and leaves a reader finding nothing, silently (a reader of a metric
that is absent sees "no signal", not an error). Here a rename is one edit, and
``tests/unit/test_contract_literals.py`` fails when a second spelling appears in the code.

What is not here: the run directory's file names (``gpudiag/rundir.py`` owns that layout), the
``Diagnosis`` schema (``gpudiag/diagnosis.py``), the version (the package metadata, from
``pyproject.toml``: ``gpudiag.__version__``).

The job side of the environment: the bootstrap and the modules it loads inside the job
(``collectors/torch_bootstrap.py``, ``stall_watch.py``, ``torch_collectives.py``,
``torch_cupti.py``, ``bootstrap/sitecustomize.py``) run in the job's Python, which may not have
gpudiag installed, and load with the standard library and torch only; they spell the variables
they read themselves. The literal test checks that each such spelling is a name defined here.

Standard library only, no imports of gpudiag: every layer may import it.
"""

from __future__ import annotations

# -- the agent's address ---------------------------------------------------------------------
AGENT_HOST = "127.0.0.1"
AGENT_PORT = 9835
AGENT_LISTEN = f"{AGENT_HOST}:{AGENT_PORT}"
METRICS_PATH = "/metrics"
AGENT_URL = f"http://{AGENT_LISTEN}{METRICS_PATH}"

# -- scrape limits ---------------------------------------------------------------------------
# Bounds what a wedged or hostile endpoint can make a reader hold; a larger answer is refused
# with that reason (gpudiag/scrape.py), never cut short and parsed.
MAX_SCRAPE_BYTES = 32 * 1024 * 1024
# A refresh of `gpudiag top` or a scheduling tick must not hang on one wedged agent.
SCRAPE_TIMEOUT_S = 2.0

# -- metric names (gpudiag_<thing>_<unit>; agent/job_table.py, agent/gpu_collector.py) ----------
# per job (agent/job_table.py)
JOB_MFU = "gpudiag_job_mfu_ratio"
JOB_STEP_SECONDS = "gpudiag_job_step_seconds"
JOB_INPUT_WAIT = "gpudiag_job_input_wait_ratio"
JOB_BOTTLENECK = "gpudiag_job_bottleneck"
JOB_CONFIDENCE = "gpudiag_job_signal_confidence"
JOB_MFU_CONFIDENCE = "gpudiag_job_mfu_confidence"
JOB_SIGNAL_AGE = "gpudiag_job_signal_age_seconds"
JOB_DILATION = "gpudiag_job_profiler_dilation_ratio"
JOB_TRACED_STEPS = "gpudiag_job_signal_traced_steps"
JOB_COLLECTIVE_SECONDS = "gpudiag_job_collective_seconds"
JOB_LAST_SIGNAL = "gpudiag_job_last_signal_timestamp_seconds"
JOB_RUN_INFO = "gpudiag_job_run_info"
JOB_ENDED = "gpudiag_job_ended_timestamp_seconds"
JOB_RECOMMENDATION = "gpudiag_job_recommendation_info"
JOB_PREDICTED_STEP = "gpudiag_job_recommendation_predicted_step_seconds"
JOB_TEAM = "gpudiag_job_team_info"
JOB_OWNER = "gpudiag_job_owner_info"
JOB_STALLED = "gpudiag_job_stalled_seconds"
JOB_LAST_STEP = "gpudiag_job_last_step_timestamp_seconds"
# the agent itself (agent/job_table.py)
AGENT_JOBS = "gpudiag_agent_jobs"
AGENT_SIGNALS_APPLIED = "gpudiag_agent_signals_applied"
AGENT_SIGNALS_REJECTED = "gpudiag_agent_signals_rejected"
AGENT_INFO = "gpudiag_agent_info"
# per GPU (agent/gpu_collector.py)
GPU_UP = "gpudiag_gpu_up"
GPU_SM_ACTIVITY = "gpudiag_gpu_sm_activity_ratio"
GPU_SM_OCCUPANCY = "gpudiag_gpu_sm_occupancy_ratio"
GPU_TENSOR_ACTIVITY = "gpudiag_gpu_tensor_activity_ratio"
GPU_DRAM_BANDWIDTH = "gpudiag_gpu_dram_bandwidth_utilization_ratio"
GPU_FP32_ACTIVITY = "gpudiag_gpu_fp32_activity_ratio"
GPU_FP16_ACTIVITY = "gpudiag_gpu_fp16_activity_ratio"
GPU_PCIE_TX = "gpudiag_gpu_pcie_transmit_bytes_per_second"
GPU_PCIE_RX = "gpudiag_gpu_pcie_receive_bytes_per_second"
GPU_NVLINK_TX = "gpudiag_gpu_nvlink_transmit_bytes_per_second"
GPU_NVLINK_RX = "gpudiag_gpu_nvlink_receive_bytes_per_second"
GPU_UTILIZATION = "gpudiag_gpu_utilization_ratio"
GPU_MEMORY_USED = "gpudiag_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "gpudiag_gpu_memory_total_bytes"
GPU_POWER = "gpudiag_gpu_power_watts"
GPU_SM_CLOCK = "gpudiag_gpu_sm_clock_hertz"
GPU_TEMPERATURE = "gpudiag_gpu_temperature_celsius"
GPU_CLOCK_THROTTLED = "gpudiag_gpu_clock_throttled"
GPU_ERRORS = "gpudiag_gpu_errors"  # a counter: exposed as gpudiag_gpu_errors_total
GPU_JOB_OWNER = "gpudiag_gpu_job_owner_info"
NVML_UP = "gpudiag_nvml_up"
# per job, from the GPUs (agent/gpu_collector.py): what `gpudiag fleet` sums
GPUS_HELD = "gpudiag_gpus_held"
GPUS_IDLE = "gpudiag_gpus_idle"
# the node (agent/server.py)
HOST_CPUS = "gpudiag_host_cpus"
HOST_LOAD1 = "gpudiag_host_load1"
HOST_MEMORY_AVAILABLE = "gpudiag_host_memory_available_bytes"
# prometheus_client's process metrics of the agent (gpudiag_agent_cpu_seconds_total, ...)
AGENT_PROCESS_NAMESPACE = "gpudiag_agent"
# the prefixes a reader selects by (every per-GPU and per-job series)
GPU_PREFIX = "gpudiag_gpu_"
JOB_PREFIX = "gpudiag_job_"

# -- environment variables -------------------------------------------------------------------
# set by `gpudiag profile` for the job (collectors/job.py), read by the bootstrap inside it
ENV_RUN_DIR = "GPUDIAG_RUN_DIR"
ENV_SKIP = "GPUDIAG_SKIP"
ENV_STEPS = "GPUDIAG_STEPS"
ENV_RETRACE_S = "GPUDIAG_RETRACE_S"
ENV_STALL_WATCH = "GPUDIAG_STALL_WATCH"
ENV_FR_BUFFER_SIZE = "GPUDIAG_FR_BUFFER_SIZE"
ENV_CUPTI_TEARDOWN = "GPUDIAG_CUPTI_TEARDOWN"
# set by a scheduler (or the user) for a job, read by the job's signal writer (gpudiag/jobsignal.py)
ENV_JOB = "GPUDIAG_JOB"
ENV_TEAM = "GPUDIAG_TEAM"
ENV_AGENT_DIR = "GPUDIAG_AGENT_DIR"
ENV_SIGNAL_INTERVAL = "GPUDIAG_SIGNAL_INTERVAL"
ENV_RESTART_COUNT = "GPUDIAG_RESTART_COUNT"
ENV_CHECKPOINT_DIR = "GPUDIAG_CHECKPOINT_DIR"
ENV_SLOTS = "GPUDIAG_SLOTS"
# where gpudiag's own state lives, when not the default
ENV_SCHEDULER_PREFIX = "GPUDIAG_SCHEDULER"  # the scheduler's own variables: never passed on to a job
ENV_SCHEDULER_DIR = "GPUDIAG_SCHEDULER_DIR"
ENV_SCHEDULER_LAUNCH = "GPUDIAG_SCHEDULER_LAUNCH"
ENV_SLURM_STATE = "GPUDIAG_SLURM_STATE"
ENV_CACHE_DIR = "GPUDIAG_CACHE_DIR"
ENV_PROGRESS_AFTER_S = "GPUDIAG_PROGRESS_AFTER_S"
# `gpudiag fleet`'s Prometheus and how to log in to it (its options' click envvar=)
ENV_PROMETHEUS = "GPUDIAG_PROMETHEUS"
ENV_PROMETHEUS_USER = "GPUDIAG_PROMETHEUS_USER"
ENV_PROMETHEUS_PASSWORD_FILE = "GPUDIAG_PROMETHEUS_PASSWORD_FILE"
ENV_PROMETHEUS_TOKEN_FILE = "GPUDIAG_PROMETHEUS_BEARER_TOKEN_FILE"
ENV_PROMETHEUS_CA_FILE = "GPUDIAG_PROMETHEUS_CA_FILE"
ENV_PROMETHEUS_INSECURE = "GPUDIAG_PROMETHEUS_INSECURE"
