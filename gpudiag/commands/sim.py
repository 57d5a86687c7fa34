"""``gpudiag sim``: replay a cluster trace under a scheduling policy and print how it did."""

from __future__ import annotations

import json
import re

import click
from click.core import ParameterSource

from gpudiag.commands.policy_options import policy_options, with_options
from gpudiag.errors import BadInput

POLICIES = ("fifo", "easy", "tiresias", "gpudiag")
_GROUP = re.compile(r"\s*(\d+)\s*x\s*(\d+)\s*")


def node_sizes(text: str) -> list[tuple[int, int]]:
    """``40x8,38x4`` -> [(40, 8), (38, 4)]: N nodes of G GPUs per group; BadInput otherwise."""
    groups = []
    for part in text.split(","):
        m = _GROUP.fullmatch(part)
        if m is None or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise BadInput(f"--node-sizes {text!r}: expected groups of N nodes x G GPUs, comma-separated, "
                           "each at least 1 (e.g. 40x8,38x4)")
        groups.append((int(m.group(1)), int(m.group(2))))
    return groups


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("trace", type=click.Path(path_type=str))
@click.option("--nodes", type=int, default=59, show_default=True, help="Nodes in the simulated cluster.")
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--node-sizes", "node_sizes_", default=None, metavar="NxG[,NxG...]",
              help="A cluster of mixed node sizes instead of --nodes/--gpus-per-node: groups of N nodes "
                   "of G GPUs, e.g. 40x8,38x4 (nodes numbered in that order, racks of --rack-size).")
@click.option("--rack-size", type=int, default=4, show_default=True, help="Nodes per rack (switch).")
@click.option("--policy", default="gpudiag", show_default=True, metavar="|".join(POLICIES))
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic MFU model.")
@click.option("--mfu", "mfu_file", type=click.Path(path_type=str), default=None,
              help="CSV job,mfu,label of measured values (e.g. recorded by gpudiag agents); "
                   "replaces the synthetic MFU of the jobs it lists.")
@policy_options
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as one JSON object.")
def sim(trace: str, nodes: int, gpus_per_node: int, node_sizes_: str | None, rack_size: int, policy: str,
        seed: int, mfu_file: str | None, min_runtime: str, efficiency_delay: str, as_json: bool) -> None:
    """Replay TRACE (Philly, Tiresias or `sacct --parsable2` format) under a policy.

    Baselines replay the trace's durations exactly: fifo (strict arrival order), easy
    (EASY backfill, exact durations as estimates), tiresias (discretised 2D-LAS, 2 queues,
    3,600 GPU-s threshold, preemptive). gpudiag adds tiers, fair share, MFU-aware priority
    (MFU learned after 10 simulated minutes or from earlier jobs of the same key) and
    topology-aware gang placement; --min-runtime and --efficiency-delay are the scheduler
    daemon's options (fifo and easy neither preempt nor weigh MFU). Each job's MFU and label
    come from a documented synthetic model seeded by --seed (see
    gpudiag/scheduler/sim/mfu_model.py) unless --mfu gives them.

    \b
    Examples:
      gpudiag sim philly.csv --policy easy --json
      gpudiag sim sacct.txt --nodes 16 --policy gpudiag --mfu measured.csv
      gpudiag sim philly.csv --node-sizes 40x8,38x4 --json
    """
    from gpudiag.scheduler.model import Cluster, Policy
    from gpudiag.scheduler.sim.metrics import summarise
    from gpudiag.scheduler.sim.mfu_model import read_mfu_file, synthesise
    from gpudiag.scheduler.sim.simulator import simulate
    from gpudiag.scheduler.sim.tiresias import simulate_tiresias
    from gpudiag.scheduler.sim.traces import read_trace

    for name, v in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node), ("--rack-size", rack_size)):
        if v < 1:
            raise BadInput(f"{name} must be at least 1 (got {v})")
    if node_sizes_ is not None:
        ctx = click.get_current_context()
        given = [f"--{p.replace('_', '-')}" for p in ("nodes", "gpus_per_node")
                 if ctx.get_parameter_source(p) is ParameterSource.COMMANDLINE]
        if given:
            raise BadInput(f"--node-sizes describes every node: leave out {' and '.join(given)}")
        groups = node_sizes(node_sizes_)
    else:
        groups = [(nodes, gpus_per_node)]
    shape = " + ".join(f"{n} nodes x {g} GPUs" for n, g in groups)
    if policy not in POLICIES:
        raise BadInput(f"--policy {policy!r}: use one of {', '.join(POLICIES)}")
    tr = read_trace(trace)
    mfu = synthesise(tr.jobs, seed)
    if mfu_file:
        mfu, missing = read_mfu_file(mfu_file, tr.jobs, mfu)
        if missing:
            click.echo(f"gpudiag sim: {missing} job(s) not in {mfu_file} keep their synthetic MFU", err=True)
    cluster = Cluster.of_sizes(groups, rack_size)
    if policy == "tiresias":
        res = simulate_tiresias(tr.jobs, mfu, cluster)
    else:
        chosen = with_options({"fifo": Policy.fifo(), "easy": Policy.easy()}.get(policy, Policy()),
                              {"min_runtime": min_runtime, "efficiency_delay": efficiency_delay})
        res = simulate(tr.jobs, mfu, cluster, chosen)
    if res.rejected:
        tr.rejected["larger than the cluster"] = res.rejected
    if not res.jobs:
        raise BadInput(f"{trace}: no job fits a cluster of {shape}")
    if tr.rejected:
        why = ", ".join(f"{n} ({why})" for why, n in sorted(tr.rejected.items()))
        click.echo(f"gpudiag sim: rejected {why}", err=True)
    m = summarise(res)
    m["rejected"] = sum(tr.rejected.values())
    if as_json:
        click.echo(json.dumps(m))
        return
    click.echo(f"{policy} on {shape} (racks of {rack_size}): "
               f"{m['jobs']} jobs, {m['rejected']} rejected")
    for k, v in m.items():
        if k in ("jobs", "rejected", "team_share", "useful_work_by_time"):
            continue
        click.echo(f"  {k:32s} {v}")
    click.echo("  useful_work_by_time              " + " ".join(f"{x:.2f}" for x in m["useful_work_by_time"]))
    click.echo("  team share (quota GPUs / used GPUs / share of quota when over it in contention):")
    for team, t in m["team_share"].items():
        share = "-" if t["contended_quota_share"] is None else f"{t['contended_quota_share']:.0%}"
        click.echo(f"    {team:12s} {t['quota_gpus']:8.1f} {t['avg_used_gpus']:8.1f} {share:>6s}")
