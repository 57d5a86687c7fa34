"""Slurm's own commands, run as subprocesses: the controller's only way to read or change Slurm.

Reads: ``squeue`` (``--json`` where present), ``scontrol show node|partition|config|job``. Writes:
``scontrol update`` (Nice for many jobs in one call, PreemptMode) and ``scontrol requeue``. Failures
are ``SlurmUnreachable`` (``MungeUnavailable`` or slurmctld, named once), ``SlurmDenied`` or
``SlurmError``. A reload of slurm.conf is told by ``RELOAD_MARK``, a partition slurm.conf does not
define, gone after a reload. docs/slurm.md.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence

from gpudiag.scheduler.slurm.slurmconf import (
    ConfModes,
    Partition,
    SlurmNode,
    conf_modes,
    parse_config,
    parse_nodes,
    parse_partitions,
)
from gpudiag.scheduler.slurm.squeue import (
    FIXED_FORMAT,
    BadSlurmOutput,
    SlurmJob,
    parse_squeue_fixed,
    parse_squeue_json,
)

# Slurm's clients retry for MessageTimeout (default 10 s) before they give up on slurmctld;
# a little more than that lets them say so themselves.
COMMAND_TIMEOUT_S = 30.0
# What Slurm's clients print when slurmctld does not answer (src/common/slurm_protocol_api.c and
# the slurm_strerror texts of SLURM_COMMUNICATIONS_*, SLURMCTLD_COMMUNICATIONS_* errors).
UNREACHABLE_WORDS = ("Unable to contact slurm controller", "Connection refused", "Socket timed out",
                     "Communication connection failure", "Zero Bytes were transmitted",
                     "Unable to establish controller", "Slurm backup controller in standby")
# What scontrol prints when the caller may not make a change (slurm_strerror of ESLURM_ACCESS_DENIED
# and ESLURM_USER_ID_MISSING): partition updates need root, SlurmUser or an Administrator.
DENIED_WORDS = ("Access/permission denied", "Invalid user id")
PRIVILEGE_HINT = ("Slurm lets only root, its SlurmUser or an Administrator (sacctmgr AdminLevel) update "
                  "partitions and other users' jobs: run the controller as one of them")


# What Slurm's clients print when they cannot sign a request (auth/munge): munged is down,
# its socket gone or its key unreadable; slurmctld is not what is out then.
MUNGE_WORDS = ("Munge encode failed", "Munge decode failed", "has authentication error",
               "Protocol authentication error")


class SlurmError(RuntimeError):
    pass


class SlurmUnreachable(SlurmError):
    """slurmctld does not answer; ``what`` names the outage (``slurmctld at HOST:PORT``)."""

    def __init__(self, message: str, what: str = "slurmctld") -> None:
        super().__init__(message)
        self.what = what


class MungeUnavailable(SlurmUnreachable):
    """The local munged cannot sign requests: every Slurm command fails until it is back."""


class SlurmDenied(SlurmError):
    pass


# A partition slurm.conf does not define, created by the controller: a reload of slurm.conf removes
# it (``reloaded``). Hidden and inactive (no job can be submitted to it or run in it), no nodes.
RELOAD_MARK = "gpudiag-reload-mark"
MARK_SPEC = ("State=INACTIVE", "Hidden=YES", "Default=NO", "PriorityTier=0", "PreemptMode=OFF")
# Job ids per ``scontrol update JobId=...`` call: far below any command-line limit.
MAX_IDS_PER_CALL = 500
# What scontrol 22.05 prints per job a multi-job update fails for (update_job.c): "<error> for job
# <id>", or "<array id>: <error>" for an array's tasks.
_FOR_JOB = re.compile(r"^(?P<why>.*\S) for job (?P<id>\d+)\s*$")
_ARRAY_JOB = re.compile(r"^(?P<id>\d+)(?:_\S+)?: (?P<why>.+)$")


class SlurmIO:
    """Runs Slurm's commands with the caller's environment (SLURM_CONF, PATH)."""

    def __init__(self, env: dict[str, str] | None = None, timeout: float = COMMAND_TIMEOUT_S) -> None:
        self.env = env
        self.timeout = timeout
        self.json_ok: bool | None = None     # squeue --json supported? decided on first read
        self.calls = 0                       # commands run (the benchmark and tests count them)
        self.ctld = "slurmctld"              # "slurmctld at HOST:PORT" once the config was read
        self.marked: bool | None = None      # the last partitions read had RELOAD_MARK (None: none read)

    def _run(self, *argv: str) -> str:
        return self._check(argv, self._spawn(argv))

    def _spawn(self, argv: Sequence[str]) -> subprocess.CompletedProcess:
        self.calls += 1
        try:
            return subprocess.run(list(argv), capture_output=True, text=True, timeout=self.timeout,
                                  env=self.env if self.env is not None else os.environ)
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]}: not found on PATH (is Slurm's client installed?)") from None
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(f"{self.ctld} unreachable: {' '.join(argv[:3])} gave no answer in "
                                   f"{self.timeout:.0f} s", self.ctld) from None

    def _check(self, argv: Sequence[str], p: subprocess.CompletedProcess) -> str:
        munge = _munge_outage(p.stderr)
        if munge:   # squeue --json exits 0 with an "errors" list when it cannot sign its request
            raise MungeUnavailable(munge, munge.split(" unreachable", 1)[0])
        if p.returncode != 0:
            err = [ln for ln in (p.stderr or p.stdout).strip().splitlines() if ln.strip("* \t")]
            msg = err[-1] if err else f"exit {p.returncode}"
            if any(w.lower() in (p.stderr + p.stdout).lower() for w in UNREACHABLE_WORDS):
                raise SlurmUnreachable(f"{self.ctld} unreachable: {msg}", self.ctld)
            if any(w.lower() in msg.lower() for w in DENIED_WORDS):
                raise SlurmDenied(f"{' '.join(argv[:4])}: {msg}: {PRIVILEGE_HINT}")
            raise SlurmError(f"{' '.join(argv[:4])}: {msg}")
        return p.stdout

    def jobs(self) -> list[SlurmJob]:
        if self.json_ok is not False:
            try:
                out = self._run("squeue", "--json")
            except SlurmUnreachable:
                raise
            except SlurmError as e:
                said = str(e).split(": ", 1)[-1]   # squeue's words, not the command ("squeue --json")
                if self.json_ok is None and ("unrecognized option" in said or "invalid option" in said
                                             or "json" in said.lower()):
                    self.json_ok = False
                else:
                    raise
            else:
                self.json_ok = True
                try:
                    return parse_squeue_json(out)
                except BadSlurmOutput:
                    # 22.05's squeue --json exits 0 with {"errors": [slurm_load_jobs ...]} when
                    # slurmctld is away: ask it directly before calling the output malformed
                    self.ping()
                    raise
        return parse_squeue_fixed(self._run("squeue", "-h", "-a", "-t", "PD,R,CF,CG", "-o", FIXED_FORMAT))

    def ping(self) -> None:
        """SlurmUnreachable unless ``scontrol ping`` finds a controller UP (its message says
        which controller is down, as ``scontrol ping`` names it)."""
        try:
            out = self._run("scontrol", "ping")
        except SlurmUnreachable:
            raise
        except SlurmError as e:
            raise SlurmUnreachable(f"{self.ctld} unreachable: {e}", self.ctld) from None
        if "UP" not in out:
            down = re.search(r"Slurmctld\((\w+)\) at (\S+) is DOWN", out)
            why = f"scontrol ping: {down.group(1)} at {down.group(2)} is DOWN" if down else \
                f"scontrol ping: {out.strip()[:200]}"
            raise SlurmUnreachable(f"{self.ctld} unreachable: {why}", self.ctld)

    def nodes(self) -> dict[str, SlurmNode]:
        return parse_nodes(self._run("scontrol", "show", "node", "-o"))

    def partitions(self) -> dict[str, Partition]:
        """Every partition but ``RELOAD_MARK``; ``marked`` says whether this answer had the mark.
        ``-a``: without it Slurm hides hidden partitions (the mark is one) and those of groups
        the caller is not in from users other than root and the SlurmUser (user nobody saw no
        mark), and the controller must see every partition it reasons about."""
        parts = parse_partitions(self._run("scontrol", "-a", "show", "partition", "-o"))
        self.marked = parts.pop(RELOAD_MARK, None) is not None
        return parts

    def config(self) -> dict[str, str]:
        cfg = parse_config(self._run("scontrol", "show", "config"))
        if "KillWait" not in cfg:
            raise BadSlurmOutput("scontrol show config: no KillWait line")
        host = cfg.get("SlurmctldHost[0]", cfg.get("ControlMachine", "")).split("(")[0]
        if host:
            self.ctld = f"slurmctld at {host}:{cfg.get('SlurmctldPort', '6817')}"
        return cfg

    def slurm_conf(self, cfg: dict[str, str]) -> ConfModes | None:
        """slurm.conf as it is now (``SLURM_CONF`` of the config), None where this host has no
        copy to read (a configless client)."""
        path = cfg.get("SLURM_CONF", "")
        if not path or path == "(null)":
            return None
        try:
            return conf_modes(path)
        except (OSError, ValueError):
            return None

    def job_state(self, job_id: int) -> str:
        """One job's JobState (``scontrol show job N -o``); "GONE" when Slurm no longer knows it."""
        try:
            out = self._run("scontrol", "show", "job", "-o", str(job_id))
        except SlurmUnreachable:
            raise
        except SlurmError as e:
            if "Invalid job id" in str(e):
                return "GONE"
            raise
        for tok in out.split():
            if tok.startswith("JobState="):
                return tok.split("=", 1)[1]
        raise BadSlurmOutput(f"scontrol show job {job_id}: no JobState")

    def set_nice(self, job_id: int, nice: int) -> None:
        self._run("scontrol", "update", f"JobId={job_id}", f"Nice={nice}")

    def set_nice_many(self, job_ids: Sequence[int], nice: int) -> dict[int, str]:
        """One Nice for several jobs, ``MAX_IDS_PER_CALL`` per ``scontrol update JobId=a,b,c``:
        {job id: why not} for the jobs Slurm refused (each named in scontrol's own words); a job
        not named was changed. A failure that names no job (slurmctld or munge out, no
        privilege, an answer in another shape) raises, as for one job."""
        failed: dict[int, str] = {}
        for k in range(0, len(job_ids), MAX_IDS_PER_CALL):
            chunk = [int(j) for j in job_ids[k:k + MAX_IDS_PER_CALL]]
            argv = ("scontrol", "update", "JobId=" + ",".join(map(str, chunk)), f"Nice={nice}")
            p = self._spawn(argv)
            if p.returncode == 0 and not _munge_outage(p.stderr):
                continue
            per_job = _per_job_errors(p.stderr, chunk)
            whole = any(w.lower() in p.stderr.lower() for w in UNREACHABLE_WORDS + DENIED_WORDS)
            if per_job is None or whole:
                self._check(argv, p)      # raises with the whole call's cause
                raise SlurmError(f"{' '.join(argv[:3])}: exit {p.returncode}")
            failed.update(per_job)
        return failed

    def qos(self) -> str:
        """``sacctmgr -nP show qos format=Name,Priority`` (slurmdbd's QOS, for ``qos.qos_tiers``)."""
        return self._run("sacctmgr", "-nP", "show", "qos", "format=Name,Priority")

    def create_mark(self) -> None:
        self._run("scontrol", "create", f"PartitionName={RELOAD_MARK}", *MARK_SPEC)

    def delete_mark(self) -> None:
        self._run("scontrol", "delete", f"PartitionName={RELOAD_MARK}")

    def requeue(self, job_id: int) -> None:
        self._run("scontrol", "requeue", str(job_id))

    def set_preempt_mode(self, partition: str, mode: str) -> None:
        self._run("scontrol", "update", f"PartitionName={partition}", f"PreemptMode={mode}")


def _munge_outage(stderr: str) -> str:
    """"munge at SOCKET unreachable: why" when a client's stderr says it could not sign its request."""
    if not any(w.lower() in stderr.lower() for w in MUNGE_WORDS):
        return ""
    sock = re.search(r'Failed to access "([^"]+)": *([^\n]*)', stderr)
    if sock:
        return f"munge at {sock.group(1)} unreachable: {sock.group(2).strip() or 'cannot be reached'}"
    why = next((ln.split("error:", 1)[-1].strip() for ln in stderr.splitlines() if "Munge" in ln
                and "failed" in ln), "Slurm's requests cannot be signed (authentication error)")
    return f"munge (the local munged) unreachable: {why}"


def _per_job_errors(stderr: str, ids: Sequence[int]) -> dict[int, str] | None:
    """{job id: error} from a multi-job ``scontrol update``'s stderr; None when a line names no
    job of ``ids`` (the call failed as a whole, or in words this does not know)."""
    out: dict[int, str] = {}
    asked = set(ids)
    for line in stderr.splitlines():
        if not line.strip():
            continue
        m = _FOR_JOB.match(line.strip()) or _ARRAY_JOB.match(line.strip())
        if m is None or int(m.group("id")) not in asked:
            return None
        out[int(m.group("id"))] = m.group("why").strip()
    return out or None
