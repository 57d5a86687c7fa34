"""Who ran the jobs that sent no signal: Slurm's word (``squeue``, then ``sacct``), where this
host can reach a Slurm controller. The fleet page attributes a silent job's GPU-hours to its
Slurm user and account instead of "(unattributed)"; the job id comes from its GPUs' series
(``job_id="slurm:<id>"``: the GPU's processes, or the HPC job-mapping folder).

``squeue -t all`` knows the jobs the controller still holds (running, and ended within
``MinJobAge``); ``sacct`` the ones accounting recorded. Either may be missing (no Slurm client
here, accounting disabled, the controller down): that is a note on the page, never a failure,
and the node's word (the uid its agent saw) is used instead.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

from gpudiag.live.fleet import SlurmJob

SLURM_TIMEOUT_S = 30.0
SACCT_CHUNK = 500      # job ids per sacct call: a command line stays far under ARG_MAX


def _run(argv: list[str], timeout: float) -> tuple[str | None, str]:
    """(stdout, "") or (None, why it failed in one line)."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout:g} s"
    except OSError as e:
        return None, f"{argv[0]}: {e.strerror or e}"
    if p.returncode != 0:
        first = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[0]
        return None, f"{argv[0]}: {first[:200]}"
    return p.stdout, ""


def _parse(text: str, wanted: set[str], out: dict[str, SlurmJob]) -> None:
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or parts[0] not in wanted or parts[0] in out:
            continue
        user, account = parts[1].strip(), parts[2].strip()
        if user and user not in ("(null)", "N/A"):
            out[parts[0]] = SlurmJob(user, "" if account in ("(null)", "N/A") else account)


def slurm_jobs(ids: Iterable[str], timeout: float = SLURM_TIMEOUT_S) -> tuple[dict[str, SlurmJob], list[str]]:
    """Slurm job id -> (user, account) for the ids Slurm knows; notes on what could not be
    asked. Job ids are Slurm's raw ids (``%A``, ``JobIDRaw``): an array task's own id."""
    wanted = {i for i in ids if i.isdigit()}
    out: dict[str, SlurmJob] = {}
    notes: list[str] = []
    if not wanted:
        return out, notes
    if shutil.which("squeue") is None:
        return out, ["Slurm: squeue is not installed on this host, so silent jobs are attributed "
                     "by the uid their node saw"]
    text, why = _run(["squeue", "-h", "-t", "all", "-o", "%A|%u|%a"], timeout)
    if text is None:
        notes.append(f"Slurm: {why}")
    else:
        _parse(text, wanted, out)
    rest = sorted(wanted - set(out), key=int)
    if rest and shutil.which("sacct") is not None:
        for i in range(0, len(rest), SACCT_CHUNK):
            chunk = rest[i:i + SACCT_CHUNK]
            text, why = _run(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,User,Account",
                              "-j", ",".join(chunk)], timeout)
            if text is None:
                notes.append(f"Slurm accounting: {why}")
                break
            _parse(text, set(chunk), out)
    return out, notes
