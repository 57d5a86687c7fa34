"""The job-signal contract between a job under ``gpudiag profile`` and its node's agent.

A job drops small JSON files into the agent's spool directory; the agent validates and
exports them (agent/signals.py). Both sides import this module, so the format has one home.

Schema 2 (what ``write_signal`` writes; the agent also accepts 1, whose files lack the v2
fields). Every field but ``job_id`` and ``ts`` is optional; a field a signal omits keeps the
value the job's previous signal gave it.

| field | meaning |
|---|---|
| ``job_id`` | the job (string, at most 128 characters; cleaned into a label value) |
| ``ts`` | unix time the signal was written |
| ``step_seconds`` | live median step time of untraced steps |
| ``mfu_ratio`` | unprofiled MFU at the job's own pace (waits other processes caused left out), 0..1 |
| ``bottleneck`` | the label (compute-bound, memory-bound, ...) of the unprofiled estimate |
| ``confidence`` | (v2) confidence of that label, 0..1 |
| ``mfu_confidence`` | (v2, optional) confidence of ``mfu_ratio``, 0..1: of the step it divides by, which a |
| | busy machine does not lower as it lowers the label's (``Mfu.confidence``) |
| ``traced_at`` | (v2) unix time of the trace the label and FLOPs come from |
| ``dilation`` | (v2) traced / untraced step time: how much the profiler slowed the steps |
| ``traced_steps`` | (v2) how many steps that trace holds |
| ``input_wait_ratio`` | share of step time waiting for input, 0..1 |
| ``run_dir`` | (v2, optional) absolute path of the job's run directory (its ``report.html``) |
| ``action`` | (v2, optional) the stable id of the diagnosis' top recommendation |
| ``predicted_step_seconds`` | (v2, optional) the step time that recommendation predicts |
| ``team`` | (v2, optional) the job's team: ``$GPUDIAG_TEAM``, else the Slurm account |
| ``collective_seconds_total`` | time in each collective since the job started |
| ``ended`` | true in the job's last signal |
| ``last_step_at`` | (v2, optional) unix time the job last finished a step (its slowest rank's last step) |
| ``stall_after_s`` | (v2, optional) no step for this long is a stall: the agent then exports the |
| | job as stalled, and its MFU as 0, on its own clock between signals |
| ``stall_cause`` | (v2, optional) why the stall that began at ``last_step_at`` holds the job |
| | (``gpudiag.incident.CAUSES``); a signal with a later ``last_step_at`` clears it |
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, TypeGuard

from gpudiag.contract import ENV_AGENT_DIR, ENV_JOB, ENV_TEAM

SIGNAL_SCHEMA_VERSION = 2
# what the agent accepts: 1 is the format before confidence/age/dilation existed
ACCEPTED_SIGNAL_VERSIONS = (1, 2)
MAX_JOB_ID = 128
MAX_RUN_DIR = 1024  # ``run_dir`` is exported as a label value: bounded
_SAFE = re.compile(r"[^A-Za-z0-9_.:@/-]")


def clean_job_id(raw: str) -> str:
    """Job ids become label values: short and printable."""
    return _SAFE.sub("_", raw.strip())[:MAX_JOB_ID]


def default_state_dir() -> Path:
    """Where the agent keeps its state and spool: $GPUDIAG_AGENT_DIR, else /var/lib/gpudiag
    for root, else ~/.local/state/gpudiag."""
    env = os.environ.get(ENV_AGENT_DIR)
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/gpudiag")
    return Path(os.path.expanduser("~/.local/state/gpudiag"))


def job_id_from_env(fallback: str) -> str:
    for var, prefix in ((ENV_JOB, ""), ("SLURM_JOB_ID", "slurm:"),
                        ("TORCHELASTIC_RUN_ID", "torchrun:")):
        v = os.environ.get(var)
        if v:
            return clean_job_id(prefix + v)
    return clean_job_id(fallback)


def team_from_env() -> str | None:
    """The job's team where its environment names one: ``GPUDIAG_TEAM`` (a scheduler or the
    user sets it), else ``SLURM_JOB_ACCOUNT`` (Slurm's account). Cleaned as a label value."""
    for var in (ENV_TEAM, "SLURM_JOB_ACCOUNT"):
        v = re.sub(r"[^A-Za-z0-9_.:@-]", "_", os.environ.get(var, "").strip())[:64]
        if v:
            return v
    return None


def valid_run_dir(text: object) -> TypeGuard[str]:
    """What the agent accepts as ``run_dir``: an absolute path of at most MAX_RUN_DIR printable
    characters (it becomes a label value)."""
    return (isinstance(text, str) and text.startswith("/") and len(text) <= MAX_RUN_DIR
            and not any(ord(c) < 32 or ord(c) == 127 for c in text))


def run_dir_field(run_dir: Path) -> str | None:
    """``run_dir`` as a signal carries it, or None for a path the agent would refuse: the signal
    then goes without it rather than be refused whole."""
    text = str(run_dir.resolve())
    return text if valid_run_dir(text) else None


def write_signal(spool: Path, sig: dict[str, Any]) -> Path:
    """Drop one signal into the spool: written to a hidden temp name, then renamed, so the
    agent never reads half a file. The file's owner is who the agent believes sent it."""
    name = f"{clean_job_id(str(sig.get('job_id', 'job'))).replace('/', '_')}-{os.getpid()}-{time.time_ns()}"
    tmp = spool / f".{name}.tmp"
    final = spool / f"{name}.json"
    data = json.dumps({"schema_version": SIGNAL_SCHEMA_VERSION, **sig}).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    return final
