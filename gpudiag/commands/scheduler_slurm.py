"""``gpudiag scheduler serve --backend slurm``: the controller beside slurmctld.

``serve_slurm`` is what the ``serve`` command calls for ``--backend slurm``; the options are
documented there and in the README's scheduler section.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from gpudiag.errors import BadInput

STATE_ENV = "GPUDIAG_SLURM_STATE"

_OPTIONS = [
    click.option("--backend", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
                 help="local: the embedded scheduler for this machine; slurm: a controller beside "
                      "slurmctld that steers Slurm with Nice and requeue."),
    click.option("--prometheus", default=None, metavar="URL",
                 help="(slurm) Read job signals from this Prometheus' HTTP API."),
    click.option("--agents", default=None, metavar="HOST:PORT,...",
                 help="(slurm) Read job signals from these agents' /metrics instead."),
    click.option("--interval", default="60s", show_default=True, help="(slurm) Time between rounds."),
    click.option("--dry-run", is_flag=True, help="(slurm) Decide and print, change nothing in Slurm."),
    click.option("--once", is_flag=True, help="(slurm) One round, then exit."),
    click.option("--json", "as_json", is_flag=True, help="(slurm) Print each round as JSON."),
    click.option("--restore", is_flag=True,
                 help="(slurm) On exit, put back every Nice and PreemptMode the controller changed."),
    click.option("--state", type=click.Path(path_type=Path), default=None,
                 help=f"(slurm) The ledger of changes (default: ${STATE_ENV}, "
                      "/var/lib/gpudiag/slurm-controller.json as root)."),
    click.option("--nice-max", type=int, default=None,
                 help="(slurm) Nice for the least efficient job (default: 10000 with priority/basic; "
                      "the efficiency delay in age points with priority/multifactor)."),
    click.option("--takeover/--no-takeover", default=True, show_default=True,
                 help="(slurm) Choose preemption victims (preemptible partitions' PreemptMode set to OFF "
                      "while the controller runs) or leave them to Slurm."),
    click.option("--min-change-interval", default="5m", show_default=True,
                 help="(slurm) At most one Nice change per job this often."),
]
SLURM_PARAMS = ("prometheus", "agents", "interval", "dry_run", "once", "as_json", "restore", "state",
                "nice_max", "takeover", "min_change_interval")


def slurm_options(f):  # noqa: ANN001, ANN201 - a click decorator
    """The ``--backend`` switch and the Slurm controller's options, for ``gpudiag scheduler serve``."""
    for opt in reversed(_OPTIONS):
        f = opt(f)
    return f


def default_ledger() -> Path:
    """$GPUDIAG_SLURM_STATE, else /var/lib/gpudiag/slurm-controller.json for root, else ~/.local/state."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/gpudiag/slurm-controller.json")
    return Path(os.path.expanduser("~/.local/state/gpudiag/slurm-controller.json"))


def serve_slurm(prometheus: str | None, agents: str | None, interval: str, dry_run: bool, once: bool,
                as_json: bool, restore: bool, state: Path | None, nice_max: int | None,
                takeover: bool, min_change_interval: str) -> int:
    from gpudiag.commands.profile import parse_duration
    from gpudiag.scheduler.slurm.controller import Controller, Options
    from gpudiag.scheduler.slurm.ledger import LedgerError
    from gpudiag.scheduler.slurm.loop import serve
    from gpudiag.scheduler.slurm.slurmio import SlurmIO
    from gpudiag.scheduler.slurm.sources import AgentsSource, PrometheusSource

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
    except click.BadParameter as e:
        raise BadInput(str(e.format_message())) from None
    if period <= 0:
        raise BadInput("--interval must be positive")
    if nice_max is not None and not 1 <= nice_max <= 2_147_483_645:
        raise BadInput("--nice-max must be between 1 and 2147483645")
    source = PrometheusSource(prometheus) if prometheus else AgentsSource(hosts) if hosts else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        ctl = Controller(SlurmIO(), source,
                         options=Options(dry_run=dry_run, nice_max=nice_max, takeover=takeover,
                                         min_change_interval_s=change_every),
                         ledger_path=state or default_ledger())
    except LedgerError as e:
        raise BadInput(str(e)) from None
    if dry_run and restore:
        logging.getLogger("gpudiag.scheduler.slurm").info("--dry-run: --restore reports what it would undo")
    return serve(ctl, period, once, as_json, restore)
