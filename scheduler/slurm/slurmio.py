"""Slurm's own commands, run as subprocesses: the controller's only way to read or change Slurm.

Reading: ``squeue`` (``--json`` where this Slurm has it, else a fixed ``-o`` format, decided
once), ``sinfo`` (nodes and their GPUs), ``scontrol show partition|config``. Writing, one call
per changed job: ``scontrol update JobId=N Nice=M``, ``scontrol requeue N``, ``scontrol update
PartitionName=P PreemptMode=M``. A controller that cannot be reached is ``SlurmUnreachable``
(the loop backs off and changes nothing); any other failure of a command is ``SlurmError``.
"""

from __future__ import annotations

import os
import subprocess

from gpudiag.scheduler.slurm.squeue import (
    FIXED_FORMAT,
    BadSlurmOutput,
    Partition,
    SlurmJob,
    parse_config,
    parse_partitions,
    parse_sinfo_nodes,
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


class SlurmError(RuntimeError):
    pass


class SlurmUnreachable(SlurmError):
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
        return parse_squeue_fixed(self._run("squeue", "-h", "-a", "-t", "PD,R", "-o", FIXED_FORMAT))

    def ping(self) -> None:
        """SlurmUnreachable unless ``scontrol ping`` finds a controller UP."""
        try:
            out = self._run("scontrol", "ping")
        except SlurmError as e:
            raise SlurmUnreachable(f"scontrol ping: {e}") from None
        if "UP" not in out:
            raise SlurmUnreachable(f"scontrol ping: {out.strip()[:200]}")

    def nodes(self) -> dict[str, int]:
        return parse_sinfo_nodes(self._run("sinfo", "-h", "-N", "-o", "%N|%G"))

    def partitions(self) -> dict[str, Partition]:
        return parse_partitions(self._run("scontrol", "show", "partition", "-o"))

    def config(self) -> dict[str, str]:
        cfg = parse_config(self._run("scontrol", "show", "config"))
        if "KillWait" not in cfg:
            raise BadSlurmOutput("scontrol show config: no KillWait line")
        return cfg

    def set_nice(self, job_id: int, nice: int) -> None:
        self._run("scontrol", "update", f"JobId={job_id}", f"Nice={nice}")

    def requeue(self, job_id: int) -> None:
        self._run("scontrol", "requeue", str(job_id))

    def set_preempt_mode(self, partition: str, mode: str) -> None:
        self._run("scontrol", "update", f"PartitionName={partition}", f"PreemptMode={mode}")
