"""The job-signal contract between a job under ``gpudiag profile`` and its node's agent.

A job drops small JSON files into the agent's spool directory; the agent validates and
exports them (agent/signals.py). Both sides import this module, so the format has one home.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

SIGNAL_SCHEMA_VERSION = 1
MAX_JOB_ID = 128
_SAFE = re.compile(r"[^A-Za-z0-9_.:@/-]")


def clean_job_id(raw: str) -> str:
    """Job ids become label values: short and printable."""
    return _SAFE.sub("_", raw.strip())[:MAX_JOB_ID]


def default_state_dir() -> Path:
    """Where the agent keeps its state and spool: $GPUDIAG_AGENT_DIR, else /var/lib/gpudiag
    for root, else ~/.local/state/gpudiag."""
    env = os.environ.get("GPUDIAG_AGENT_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/gpudiag")
    return Path(os.path.expanduser("~/.local/state/gpudiag"))


def job_id_from_env(fallback: str) -> str:
    for var, prefix in (("GPUDIAG_JOB", ""), ("SLURM_JOB_ID", "slurm:"),
                        ("TORCHELASTIC_RUN_ID", "torchrun:")):
        v = os.environ.get(var)
        if v:
            return clean_job_id(prefix + v)
    return clean_job_id(fallback)


def write_signal(spool: Path, sig: dict[str, Any]) -> Path:
    """Drop one signal into the spool: written to a hidden temp name, then renamed, so the
    agent never reads half a file."""
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
