"""``gpudiag scheduler serve --backend slurm``: the controller beside slurmctld.

``serve_slurm`` is what the ``serve`` command calls for ``--backend slurm``; the options are
documented there and in docs/slurm.md. Every option ``serve`` accepts is honoured by the backend
that runs or refused with one line (exit 2): ``check_options`` holds that table.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gpudiag.contract import ENV_SLURM_STATE
from gpudiag.errors import BadInput

if TYPE_CHECKING:
    from gpudiag.scheduler.model import Policy

F = TypeVar("F", bound=Callable[..., Any])

STATE_ENV = ENV_SLURM_STATE
# Mirrors scheduler/slurm/loop.py MIN_INTERVAL_S (kept here so --help needs no import of it).
MIN_INTERVAL = "5s"

_OPTIONS = [
    click.option("--backend", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
                 help="local: the embedded scheduler for this machine; slurm: a controller beside "
                      "slurmctld that steers Slurm with Nice and requeue (docs/slurm.md)."),
    click.option("--prometheus", default=None, metavar="URL",
                 help="(slurm) Read job signals from this Prometheus' HTTP API."),
    click.option("--agents", default=None, metavar="HOST:PORT,...",
                 help="(slurm) Read job signals from these agents' /metrics instead."),
    click.option("--interval", default="60s", show_default=True,
                 help=f"(slurm) Time between rounds (at least {MIN_INTERVAL}); the lease is 3 rounds."),
    click.option("--dry-run", is_flag=True,
                 help="(slurm) Decide and print, change nothing in Slurm or the ledger."),
    click.option("--once", is_flag=True, help="(slurm) One round, then exit."),
    click.option("--json", "as_json", is_flag=True, help="(slurm) Print each round as JSON."),
    click.option("--restore", is_flag=True,
                 help="(slurm) On exit, put back every Nice and PreemptMode the controller changed."),
    click.option("--restore-only", is_flag=True,
                 help="(slurm) Undo everything the ledger holds and exit, running no round; exit 1 naming "
                      "what could not be restored (the unit's ExecStopPost)."),
    click.option("--watchdog", is_flag=True,
                 help="(slurm) Run no rounds: give preemption back to Slurm whenever the controller's "
                      "lease in the ledger lapses (a controller that died or hangs)."),
    click.option("--state", type=click.Path(path_type=Path), default=None,
                 help=f"(slurm) The ledger of changes (default: ${STATE_ENV}, "
                      "/var/lib/gpudiag/slurm-controller.json as root); MFU history beside it. One "
                      "controller per cluster whatever its --state: a second one is refused, naming the "
                      "first (its claim is in Slurm's StateSaveLocation)."),
    click.option("--nice-max", type=int, default=None,
                 help="(slurm) Nice for the least efficient job (default: 10000 with priority/basic; "
                      "the efficiency delay in age points with priority/multifactor)."),
    click.option("--takeover/--no-takeover", default=True, show_default=True,
                 help="(slurm) Choose preemption victims (REQUEUE partitions held at PreemptMode=OFF "
                      "while the controller runs and has evidence) or leave them to Slurm."),
    click.option("--min-change-interval", default="5m", show_default=True,
                 help="(slurm) At most one Nice change per job this often."),
    click.option("--partitions", default=None, metavar="NAME,...",
                 help="(slurm) Manage only these partitions: hold their preemption, change their jobs' "
                      "Nice; the others are Slurm's alone (default: every partition). Jobs of the top "
                      "PriorityTier are never given a Nice penalty either way."),
]
SLURM_PARAMS = ("prometheus", "agents", "interval", "dry_run", "once", "as_json", "restore", "restore_only",
                "watchdog", "state", "nice_max", "takeover", "min_change_interval", "partitions")
# ``serve`` options of the local scheduler that the Slurm controller honours; every other one
# given with --backend slurm is refused (with the hint below where there is a Slurm equivalent).
SLURM_HONOURS = ("quota", "min_runtime", "efficiency_delay")
SLURM_HINTS = {"state_dir": "the controller's ledger is --state", "agent_url": "use --agents HOST:PORT",
               "agent_dir": "use --prometheus URL or --agents HOST:PORT",
               "gpus": "Slurm's nodes say how many GPUs there are",
               "slots": "Slurm's nodes say what there is",
               "monitor": "a Slurm job runs `gpudiag profile --monitor` in its own script",
               "cgroups": "Slurm's own cgroup plugin contains its jobs",
               "teams_source": "Slurm's associations say which accounts a user may submit to",
               "max_pending": "Slurm's own limit: sacctmgr modify user NAME set MaxSubmitJobs=N",
               "stalled": "the controller counts a stalled job's MFU as 0, but requeues or cancels "
                          "stalled jobs only in the local scheduler for now",
               "stalled_after": "see --stalled"}


def slurm_options(f: F) -> F:  # a click decorator
    """The ``--backend`` switch and the Slurm controller's options, for ``gpudiag scheduler serve``."""
    for opt in reversed(_OPTIONS):
        f = opt(f)
    return f


def _given(name: str) -> bool:
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    src = ctx.get_parameter_source(name)
    return src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")


def _flag(name: str) -> str:
    return "--" + {"as_json": "json", "teams_source": "teams"}.get(name, name).replace("_", "-")


def check_options(backend: str, local: Mapping[str, object], slurm: Mapping[str, object]) -> None:
    """One line and exit 2 for an option the chosen backend would not honour."""
    if backend == "slurm":
        for name in local:
            if name not in SLURM_HONOURS and _given(name):
                hint = SLURM_HINTS.get(name, "it is the local scheduler's")
                raise BadInput(f"{_flag(name)} does not apply to --backend slurm: {hint}")
    else:
        for name in slurm:
            if name != "backend" and _given(name):
                raise BadInput(f"{_flag(name)} is the Slurm controller's: add --backend slurm, "
                               "or leave it out")


def default_ledger() -> Path:
    """$GPUDIAG_SLURM_STATE, else /var/lib/gpudiag/slurm-controller.json for root, else ~/.local/state."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/gpudiag/slurm-controller.json")
    return Path(os.path.expanduser("~/.local/state/gpudiag/slurm-controller.json"))


@dataclasses.dataclass
class _Settings:
    """The controller's options, checked and parsed."""

    hosts: list[str]  # --agents
    period: float  # --interval, seconds
    change_every: float  # --min-change-interval, seconds
    policy: Policy
    min_runtime: float | None  # --min-runtime where given (else the cluster's PreemptExemptTime)
    managed: frozenset[str]  # --partitions


def _settings(local: dict[str, Any], prometheus: str | None, agents: str | None, interval: str,
              once: bool, restore: bool, restore_only: bool, watchdog: bool, nice_max: int | None,
              min_change_interval: str, partitions: str | None) -> _Settings:
    """The options checked against each other and parsed: one line and exit 2 for each wrong one."""
    from gpudiag.commands.policy_options import with_options
    from gpudiag.durations import parse_duration
    from gpudiag.scheduler.model import Policy
    from gpudiag.scheduler.slurm.loop import MIN_INTERVAL_S

    if sum((restore_only, watchdog, once)) > 1:
        raise BadInput("give one of --restore-only, --watchdog and --once")
    if prometheus and agents:
        raise BadInput("give --prometheus or --agents, not both")
    if prometheus and not prometheus.startswith(("http://", "https://")):
        raise BadInput(f"--prometheus {prometheus!r}: use a URL like http://prometheus:9090")
    hosts = [a.strip() for a in (agents or "").split(",") if a.strip()]
    for h in hosts:
        if "://" not in h and (":" not in h or not h.rsplit(":", 1)[1].isdigit()):
            raise BadInput(f"--agents {h!r}: use HOST:PORT[,HOST:PORT...]")
    if agents is not None and not hosts:
        raise BadInput("--agents: give at least one HOST:PORT")
    try:
        period = parse_duration(interval, "--interval")
        change_every = parse_duration(min_change_interval, "--min-change-interval")
        # --min-runtime given or not, the round replaces it (the cluster's PreemptExemptTime)
        policy = with_options(Policy(), local)
        min_runtime = parse_duration(str(local["min_runtime"]), "--min-runtime") \
            if _given("min_runtime") else None
    except click.BadParameter as e:
        raise BadInput(str(e.format_message())) from None
    if period < MIN_INTERVAL_S:
        raise BadInput(f"--interval {interval}: at least {MIN_INTERVAL_S:.0f} s (each round reads squeue and "
                       "scontrol from slurmctld)")
    if nice_max is not None and not 1 <= nice_max <= 2_147_483_645:
        raise BadInput("--nice-max must be between 1 and 2147483645")
    if (restore_only or watchdog) and (prometheus or agents or restore or partitions):
        raise BadInput("--restore-only and --watchdog read only the ledger: leave out --prometheus, "
                       "--agents, --restore, --partitions")
    managed = frozenset(p.strip() for p in (partitions or "").split(",") if p.strip())
    if partitions is not None and not managed:
        raise BadInput("--partitions: give at least one partition name (NAME[,NAME...])")
    return _Settings(hosts, period, change_every, policy, min_runtime, managed)


def serve_slurm(local: dict[str, Any], prometheus: str | None, agents: str | None, interval: str,
                dry_run: bool, once: bool, as_json: bool, restore: bool, restore_only: bool, watchdog: bool,
                state: Path | None, nice_max: int | None, takeover: bool, min_change_interval: str,
                partitions: str | None = None) -> int:
    """``gpudiag scheduler serve --backend slurm``: the controller's loop of rounds, or
    ``--restore-only``, or ``--watchdog``."""
    from gpudiag.scheduler.quota import parse_quotas
    from gpudiag.scheduler.slurm.controller import Controller, Options, lease_for
    from gpudiag.scheduler.slurm.ledger import LedgerError, LedgerStore
    from gpudiag.scheduler.slurm.loop import restore_only as do_restore_only
    from gpudiag.scheduler.slurm.loop import serve
    from gpudiag.scheduler.slurm.loop import watchdog as dog
    from gpudiag.scheduler.slurm.slurmio import SlurmIO
    from gpudiag.scheduler.slurm.sources import AgentsSource, PrometheusSource

    s = _settings(local, prometheus, agents, interval, once, restore, restore_only, watchdog, nice_max,
                  min_change_interval, partitions)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ledger = state or default_ledger()
    io = SlurmIO()
    if restore_only:
        return do_restore_only(io, LedgerStore(ledger, readonly=dry_run), as_json, dry_run)
    if watchdog:
        return dog(io, LedgerStore(ledger))
    source = PrometheusSource(prometheus) if prometheus else AgentsSource(s.hosts) if s.hosts else None
    opts = Options(dry_run=dry_run, nice_max=nice_max, takeover=takeover,
                   min_change_interval_s=s.change_every, lease_s=lease_for(s.period),
                   min_runtime_s=s.min_runtime,
                   quotas={t: float(n) for t, n in parse_quotas(tuple(local.get("quota") or ())).items()},
                   need_multifactor=_given("efficiency_delay") and nice_max is None,
                   partitions=s.managed if partitions is not None else None)
    try:
        ctl = Controller(io, source, s.policy, options=opts, ledger_path=ledger)
    except LedgerError as e:
        raise BadInput(str(e)) from None
    return serve(ctl, s.period, once, as_json, restore)
