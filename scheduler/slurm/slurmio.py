"""Slurm's own commands, run as subprocesses: the controller's only way to read or change Slurm.

Reading: ``squeue`` (``--json`` where this Slurm has it, else a fixed ``-o`` format, decided
once; one call per round), ``scontrol show node|partition|config``, and ``scontrol show job N``
for the one job a requeue is for. Writing, one call per change: ``scontrol update JobId=N
Nice=M``, ``scontrol requeue N``, ``scontrol update PartitionName=P PreemptMode=M``. A controller
that cannot be reached is ``SlurmUnreachable`` (the loop backs off and changes nothing); a
command Slurm refuses for lack of privilege is ``SlurmDenied`` (its message says who may); any
other failure of a command is ``SlurmError``.
"""

from __future__ import annotations

import os
import subprocess

from gpudiag.scheduler.slurm.slurmconf import (
    Partition,
    SlurmNode,
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


class SlurmError(RuntimeError):
    pass


class SlurmUnreachable(SlurmError):
    pass


class SlurmDenied(SlurmError):
    pass


class SlurmIO:
    """Runs Slurm's commands with the caller's environment (SLURM_CONF, PATH)."""

    def __init__(self, env: dict[str, str] | None = None, timeout: float = COMMAND_TIMEOUT_S) -> None:
        self.env = env
        self.timeout = timeout
        self.json_ok: bool | None = None     # squeue --json supported? decided on first read
        self.calls = 0                       # commands run (the benchmark and tests count them)

    def _run(self, *argv: str) -> str:
        self.calls += 1
        try:
            p = subprocess.run(list(argv), capture_output=True, text=True, timeout=self.timeout,
                               env=self.env if self.env is not None else os.environ)
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]}: not found on PATH (is Slurm's client installed?)") from None
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(f"{' '.join(argv[:3])}: no answer in {self.timeout:.0f} s") from None
        if p.returncode != 0:
            err = [ln for ln in (p.stderr or p.stdout).strip().splitlines() if ln.strip("* \t")]
            msg = err[-1] if err else f"exit {p.returncode}"
            if any(w.lower() in (p.stderr + p.stdout).lower() for w in UNREACHABLE_WORDS):
                raise SlurmUnreachable(f"{argv[0]}: {msg}")
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
                if self.json_ok is None and ("unrecognized option" in str(e) or "invalid option" in str(e)
                                             or "json" in str(e).lower()):
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
        """SlurmUnreachable unless ``scontrol ping`` finds a controller UP."""
        try:
            out = self._run("scontrol", "ping")
        except SlurmError as e:
            raise SlurmUnreachable(f"scontrol ping: {e}") from None
        if "UP" not in out:
            raise SlurmUnreachable(f"scontrol ping: {out.strip()[:200]}")

    def nodes(self) -> dict[str, SlurmNode]:
        return parse_nodes(self._run("scontrol", "show", "node", "-o"))

    def partitions(self) -> dict[str, Partition]:
        return parse_partitions(self._run("scontrol", "show", "partition", "-o"))

    def config(self) -> dict[str, str]:
        cfg = parse_config(self._run("scontrol", "show", "config"))
        if "KillWait" not in cfg:
            raise BadSlurmOutput("scontrol show config: no KillWait line")
        return cfg

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

    def requeue(self, job_id: int) -> None:
        self._run("scontrol", "requeue", str(job_id))

    def set_preempt_mode(self, partition: str, mode: str) -> None:
        self._run("scontrol", "update", f"PartitionName={partition}", f"PreemptMode={mode}")
