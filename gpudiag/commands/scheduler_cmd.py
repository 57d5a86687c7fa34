"""``gpudiag scheduler serve``: the embedded gang scheduler for one shared machine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from gpudiag.commands.oneline import OneLine
from gpudiag.commands.policy_options import policy_options, with_options
from gpudiag.commands.scheduler_slurm import SLURM_PARAMS, check_options, serve_slurm, slurm_options
from gpudiag.contract import AGENT_URL, ENV_SCHEDULER_DIR, ENV_SLOTS
from gpudiag.durations import format_duration, parse_duration
from gpudiag.errors import BadInput
from gpudiag.scheduler.model import Policy


def _machine_ids(gpus: str | None, slots: int | None) -> tuple[tuple[str, ...], bool]:
    """(ids a job sees, whether they are GPUs). ``--slots`` wins on a machine without GPUs."""
    if slots is not None:
        if gpus is not None:
            raise BadInput("give --gpus or --slots, not both")
        return tuple(str(i) for i in range(slots)), False
    if gpus is None or gpus == "all":
        try:
            import pynvml

            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
        except Exception as e:  # noqa: BLE001 - NVML's errors vary by driver; one line says which
            raise BadInput(f"cannot count GPUs (NVML: {e}); on a machine without GPUs use --slots N"
                           ) from None
        if n < 1:
            raise BadInput("NVML sees no GPUs; on a machine without GPUs use --slots N")
        return tuple(str(i) for i in range(n)), True
    ids = [x.strip() for x in gpus.split(",")]
    if not all(x.isdigit() for x in ids) or len(set(ids)) != len(ids):
        raise BadInput(f"--gpus {gpus!r}: use all, or distinct GPU indices like 0,1,2,3")
    return tuple(ids), True


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def scheduler() -> None:
    """The embedded gang scheduler: gpudiag submit / queue / cancel / logs talk to it."""


@scheduler.command(cls=OneLine)
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help=f"Database, socket and job folders (default: ${ENV_SCHEDULER_DIR}, "
                   "/var/lib/gpudiag/scheduler as root, else ~/.local/state/gpudiag/scheduler).")
@click.option("--gpus", default=None, metavar="all|0,1,2,3", help="GPUs to schedule  [default: all].")
@click.option("--slots", type=click.IntRange(1, 4096), default=None,
              help=f"Schedule N CPU slots instead (a machine without GPUs): jobs get {ENV_SLOTS}.")
@click.option("--quota", multiple=True, metavar="TEAM=N", help="A team's GPU quota (fair share); repeatable.")
@click.option("--teams", "teams_source", default="groups", show_default=True, metavar="groups|FILE",
              help="Who is in which team (a user may submit only as one of theirs): their Unix groups, or "
                   "a root-owned file of `user: team [team ...]` lines, the first the user's default. Every "
                   "user also has a team of their own name, their default unless the file says otherwise.")
@click.option("--max-pending", type=int, default=Policy().max_pending_per_user, show_default=True,
              metavar="N",
              help="Jobs one user may have waiting; more are refused with one line (0: no limit) "
                   "(Policy.max_pending_per_user).")
@policy_options(backends=True)
@click.option("--agent-dir", type=click.Path(path_type=Path), default=None,
              help="The node agent's state folder: the daemon reads its jobs.json, and every job reports "
                   "into its spool (default: the agent's default, /var/lib/gpudiag as root).")
@click.option("--agent-url", default=None, metavar="URL",
              help=f"Read signals by scraping the agent instead, e.g. {AGENT_URL}; the "
                   "agent must be running (it is asked for its folder, so jobs report to it). Beside "
                   "--agent-dir, both must name the same agent.")
@click.option("--monitor/--no-monitor", default=True, show_default=True,
              help="Run each job under `gpudiag profile --monitor` (MFU and label to the agent).")
@click.option("--cgroups/--no-cgroups", default=True, show_default=True,
              help="One cgroup v2 per job where the host allows it (root, a writable cgroup2 mount), so "
                   "no process of a job outlives it; the log's first line says which containment is in use "
                   "(docs/scheduler-daemon.md).")
@click.option("--stalled", "stalled", type=click.Choice(["off", "requeue", "cancel"]),
              default=Policy().stalled_action,
              show_default=True,
              help="What to do with a running job the agent calls stalled (no step for its limit) for "
                   "--stalled-after: requeue it, cancel it, or nothing (its MFU counts as 0 either way).")
@click.option("--stalled-after", default=format_duration(Policy().stalled_after_s), show_default=True,
              metavar="DURATION", help="How long a job must have been stalled before --stalled acts.")
@slurm_options
def serve(state_dir: Path | None, gpus: str | None, slots: int | None, quota: tuple[str, ...],
          teams_source: str, max_pending: int, min_runtime: str, efficiency_delay: str,
          agent_dir: Path | None, agent_url: str | None, monitor: bool, cgroups: bool, stalled: str,
          stalled_after: str, backend: str, **slurm: object) -> int | None:
    """Run the scheduler daemon in the foreground (jobs outlive it and are re-adopted).

    \b
    Examples:
      gpudiag scheduler serve                      # all GPUs, as root: for every user
      gpudiag scheduler serve --gpus 0,1,2,3 --quota vision=2 --quota nlp=2
      gpudiag scheduler serve --slots 4            # a machine without GPUs
      gpudiag scheduler serve --backend slurm --prometheus http://prom:9090 --restore
    """
    local = {"state_dir": state_dir, "gpus": gpus, "slots": slots, "quota": quota,
             "teams_source": teams_source, "max_pending": max_pending, "min_runtime": min_runtime,
             "efficiency_delay": efficiency_delay, "agent_dir": agent_dir, "agent_url": agent_url,
             "monitor": monitor, "cgroups": cgroups, "stalled": stalled, "stalled_after": stalled_after}
    check_options(backend, local, {k: slurm[k] for k in SLURM_PARAMS})
    if backend == "slurm":
        return serve_slurm(local, **slurm)  # type: ignore[arg-type]
    from gpudiag.jobsignal import default_state_dir as agent_default
    from gpudiag.scheduler.local.config import default_state_dir
    from gpudiag.scheduler.local.daemon import Daemon, main_loop
    from gpudiag.scheduler.local.engine import Machine
    from gpudiag.scheduler.local.signals import AgentChoiceError, choose_agent
    from gpudiag.scheduler.local.teams import Teams
    from gpudiag.scheduler.quota import parse_quotas

    ids, are_gpus = _machine_ids(gpus, slots)
    if max_pending < 0:
        raise BadInput(f"--max-pending {max_pending}: give 0 (no limit) or a positive number of jobs")
    policy = with_options(Policy(), {"min_runtime": min_runtime, "efficiency_delay": efficiency_delay})
    policy = dataclasses.replace(policy, max_pending_per_user=max_pending,
                                 stalled_action=stalled,
                                 stalled_after_s=parse_duration(stalled_after, "--stalled-after"))
    teams = Teams(teams_source)   # a teams file that cannot be trusted: one line, before anything starts
    # every job reports to the agent this daemon reads, whichever option named it
    try:
        agent_state, source, notes = choose_agent(agent_dir, agent_url, agent_default())
    except AgentChoiceError as e:
        raise BadInput(str(e)) from None
    for note in notes:
        click.echo(f"gpudiag scheduler: {note}", err=True)
    daemon = Daemon(state_dir or default_state_dir(), Machine(ids, are_gpus), policy, parse_quotas(quota),
                    source, monitor, agent_state, cgroups, teams)
    main_loop(daemon)
    return None
