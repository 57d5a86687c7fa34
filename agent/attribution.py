"""Which job owns a GPU process, and which user runs it: from the process's environment,
cgroup and owner; and which jobs a scheduler's prolog says hold each GPU (dcgm-exporter's HPC
job-mapping folder).

Schedulers leave their mark in every process they start: Slurm sets ``SLURM_JOB_ID``,
torchrun ``TORCHELASTIC_RUN_ID``, Kubernetes puts the pod UID in the cgroup path, and
users can set ``GPUDIAG_JOB``. Results are cached per (pid, start time), so a recycled pid
is never attributed to the job that used it before.

The uid that runs a job's processes is a second check on a signal's writer (agent/job_table.py):
a user can name any job in a signal, but cannot run another user's processes, so a signal
naming a job that runs as someone else is refused.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import threading
import time
from pathlib import Path

from gpudiag.agent.signals import ROOT_UID
from gpudiag.contract import ENV_JOB
from gpudiag.jobsignal import MAX_JOB_ID, clean_job_id

log = logging.getLogger("gpudiag.agent")

_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
# a job whose processes the GPU scrape has not seen for this long is no longer bound by them
# (the same 10 minutes after which a silent job leaves the table)
PROCESS_OWNER_TTL_S = 600.0
MAX_PROCESS_OWNERS = 4096  # bounded like the job table: one entry per job with GPU processes
# the variables in a process's environment that name its job, as /proc/<pid>/environ spells them
_JOB_VARS = (ENV_JOB.encode(), b"SLURM_JOB_ID", b"TORCHELASTIC_RUN_ID")


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2:].split()[19].decode()
    except (OSError, IndexError):
        return None


def _uid(pid: int) -> int | None:
    """The process's owner (the owner of /proc/<pid> is its effective uid)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def job_of_pid(pid: int) -> str:
    """The job id of one process, or "" when nothing identifies it."""
    env: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                k, _, v = item.partition(b"=")
                if k in _JOB_VARS:
                    env[k.decode()] = v.decode(errors="replace")
    except OSError:
        pass
    if env.get(ENV_JOB):
        return clean_job_id(env[ENV_JOB])
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


class JobOwners:
    """job id -> uid of the processes the GPU scrape last saw running it. Thread-safe.

    A non-root owner wins over root: helpers a job's launcher runs as root do not make the
    job root's, while a job that runs only as root is bound to root.
    """

    def __init__(self, ttl: float = PROCESS_OWNER_TTL_S, max_jobs: int = MAX_PROCESS_OWNERS) -> None:
        self.ttl = ttl
        self.max_jobs = max_jobs
        self._seen: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def saw(self, job: str, uid: int, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            old = self._seen.get(job)
            if uid == ROOT_UID and old is not None and old[0] != ROOT_UID and now - old[1] <= self.ttl:
                uid = old[0]
            if old is None and len(self._seen) >= self.max_jobs:
                self._seen = {j: v for j, v in self._seen.items() if now - v[1] <= self.ttl}
                if len(self._seen) >= self.max_jobs:
                    return  # every entry is live: the newest job stays unbound by processes
            self._seen[job] = (uid, now)

    def uid_of(self, job: str, now: float | None = None) -> int | None:
        """The uid running ``job``'s processes, or None if none was seen within the TTL."""
        now = time.time() if now is None else now
        with self._lock:
            v = self._seen.get(job)
        return v[0] if v is not None and now - v[1] <= self.ttl else None


class JobAttribution:
    """Callable: the one job owning these PIDs, "multiple", or "". Tells ``owners`` (when
    given) which uid runs each job it finds. Thread-safe."""

    def __init__(self, owners: JobOwners | None = None, max_cache: int = 4096) -> None:
        self.cache: dict[tuple[int, str], tuple[str, int | None]] = {}
        self.max_cache = max_cache
        self.owners = owners
        self._lock = threading.Lock()

    def __call__(self, pids: list[int]) -> str:
        jobs = set()
        for pid in pids:
            if not isinstance(pid, int) or isinstance(pid, bool):
                continue
            key = (pid, _start_time(pid) or "")
            with self._lock:
                hit = self.cache.get(key)
            if hit is None:
                hit = (job_of_pid(pid), _uid(pid))
                with self._lock:
                    if len(self.cache) >= self.max_cache:
                        self.cache.clear()
                    self.cache[key] = hit
            job, uid = hit
            if job:
                jobs.add(job)
                if self.owners is not None and uid is not None:
                    self.owners.saw(job, uid)
        if not jobs:
            return ""
        return jobs.pop() if len(jobs) == 1 else "multiple"


# --- dcgm-exporter's HPC job mapping ---------------------------------------------------------
# dcgm-exporter (--hpc-job-mapping-dir, or this variable) reads a folder that the scheduler's
# prolog fills and its epilog empties: one file per GPU, named by the GPU's index ("0", "1", ...)
# or, for a MIG instance, GPU.INSTANCE ("2.0"); each line one job id. It exports a mapped GPU's
# metrics once per listed job with the label hpc_job="<id>", and an unmapped GPU's without it.
# Reading the same folder the same way lets a site that already runs those scripts attribute
# gpudiag's GPU series with no new plumbing.
HPC_JOB_MAPPING_ENV = "DCGM_HPC_JOB_MAPPING_DIR"
_GPU_FILE = re.compile(r"^([0-9]+)(?:\.([0-9]+))?$")
# bounds, as for the job table: the folder is a root-owned convention, but a file that grows
# without bound, or thousands of them, must neither stall a scrape nor explode label values
MAX_MAPPING_FILES = 1024
MAX_MAPPING_BYTES = 64 * 1024
MAX_JOBS_PER_GPU = 16
# Slurm's prolog writes $SLURM_JOB_ID; a job under gpudiag profile reports as slurm:<id>
# (gpudiag.jobsignal.job_id_from_env), so that is the job_id a bare id maps to.
SLURM_JOB_PREFIX = "slurm:"


def gpudiag_job_id(hpc_job: str) -> str:
    """The ``job_id`` of gpudiag's series for a job id read from a mapping file: a bare id is a
    Slurm job's; an id that already names its scheduler (``sched-1a2b:7``) is kept."""
    return clean_job_id(hpc_job if ":" in hpc_job else SLURM_JOB_PREFIX + hpc_job)


def _read_mapping_file(path: Path) -> tuple[list[str], int]:
    """The job ids of one mapping file (a regular file, opened without following links, at most
    MAX_MAPPING_BYTES read), stripped, blank lines skipped, and the file's owner. A line cut by
    that bound, or longer than a job id may be, is skipped: a shortened id would name another job."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return [], ROOT_UID
        raw = os.read(fd, MAX_MAPPING_BYTES + 1)
    finally:
        os.close(fd)
    lines = raw[:MAX_MAPPING_BYTES].decode("utf-8", "replace").splitlines()
    if len(raw) > MAX_MAPPING_BYTES and lines:
        lines.pop()
    return [line.strip() for line in lines if line.strip() and len(line.strip()) <= MAX_JOB_ID], st.st_uid


def read_job_mapping(folder: Path, owners: dict[str, int] | None = None) -> dict[int, list[str]]:
    """GPU index -> the job ids its mapping files list, in file order, each once (a MIG
    instance's file counts for its GPU: gpudiag exports whole GPUs). Files whose names are not
    GPU ids are skipped, as dcgm-exporter skips them. OSError when the folder cannot be listed.

    ``owners`` (when given) gets each listed job's mapping-file owner where that is not root: a
    prolog that writes the file as the job's user, or hands it to them, names who runs the job
    (``gpudiag_gpu_job_owner_info``: how a fleet page attributes a job that sends no signal)."""
    out: dict[int, list[str]] = {}
    names = sorted(os.listdir(folder))[:MAX_MAPPING_FILES]
    for name in names:
        m = _GPU_FILE.match(name)
        if not m:
            continue
        try:
            jobs, uid = _read_mapping_file(folder / name)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ELOOP):  # removed by an epilog meanwhile; a link
                log.warning("job mapping %s unreadable: %s", folder / name, e)
            continue
        listed = out.setdefault(int(m.group(1)), [])
        for job in jobs:
            job = clean_job_id(job)
            if job and job not in listed and len(listed) < MAX_JOBS_PER_GPU:
                listed.append(job)
                if owners is not None and uid != ROOT_UID:
                    owners.setdefault(gpudiag_job_id(job), uid)
    return {gpu: jobs for gpu, jobs in out.items() if jobs}


class HpcJobMapping:
    """Callable: the mapping folder's GPU -> job ids at this moment ({} while the folder is
    missing, which is logged once each time it goes away, as a node between jobs may have none)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.owners: dict[str, int] = {}   # gpudiag job id -> its mapping file's (non-root) owner
        self._missing_logged = False

    def __call__(self) -> dict[int, list[str]]:
        owners: dict[str, int] = {}
        try:
            mapping = read_job_mapping(self.folder, owners)
        except OSError as e:
            if not self._missing_logged:
                log.warning("HPC job mapping folder %s unreadable (%s): GPU series carry no hpc_job "
                            "until it exists", self.folder, e.strerror or e)
                self._missing_logged = True
            self.owners = {}
            return {}
        self._missing_logged = False
        self.owners = owners
        return mapping
