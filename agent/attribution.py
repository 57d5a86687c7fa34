"""Which job owns a GPU process: from the process's environment or cgroup.

Schedulers leave their mark in every process they start: Slurm sets ``SLURM_JOB_ID``,
torchrun ``TORCHELASTIC_RUN_ID``, Kubernetes puts the pod UID in the cgroup path, and
users can set ``GPUDIAG_JOB``. Results are cached per (pid, start time), so a recycled pid
is never attributed to the job that used it before.
"""

from __future__ import annotations

import re

from gpudiag.jobsignal import clean_job_id

_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2:].split()[19].decode()
    except (OSError, IndexError):
        return None


def job_of_pid(pid: int) -> str:
    """The job id of one process, or "" when nothing identifies it."""
    env: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                k, _, v = item.partition(b"=")
                if k in (b"GPUDIAG_JOB", b"SLURM_JOB_ID", b"TORCHELASTIC_RUN_ID"):
                    env[k.decode()] = v.decode(errors="replace")
    except OSError:
        pass
    if env.get("GPUDIAG_JOB"):
        return clean_job_id(env["GPUDIAG_JOB"])
    if env.get("SLURM_JOB_ID"):
        return clean_job_id("slurm:" + env["SLURM_JOB_ID"])
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            m = _POD_RE.search(f.read())
        if m:
            return clean_job_id("k8s:pod" + m.group(1).replace("_", "-"))
    except OSError:
        pass
    if env.get("TORCHELASTIC_RUN_ID"):
        return clean_job_id("torchrun:" + env["TORCHELASTIC_RUN_ID"])
    return ""


class JobAttribution:
    """Callable: the one job owning these PIDs, "multiple", or ""."""

    def __init__(self, max_cache: int = 4096) -> None:
        self.cache: dict[tuple[int, str], str] = {}
        self.max_cache = max_cache

    def __call__(self, pids: list[int]) -> str:
        jobs = set()
        for pid in pids:
            if not isinstance(pid, int):
                continue
            key = (pid, _start_time(pid) or "")
            job = self.cache.get(key)
            if job is None:
                if len(self.cache) >= self.max_cache:
                    self.cache.clear()
                job = self.cache[key] = job_of_pid(pid)
            if job:
                jobs.add(job)
        if not jobs:
            return ""
        return jobs.pop() if len(jobs) == 1 else "multiple"
