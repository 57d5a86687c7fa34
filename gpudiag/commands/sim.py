"""``gpudiag sim``: replay a cluster trace under a scheduling policy and print how it did."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from gpudiag.commands.policy_options import policy_options, with_options
from gpudiag.commands.sim_sweep import DEFAULT_LOADS
from gpudiag.errors import BadInput
from gpudiag.scheduler.model import Cluster, Policy
from gpudiag.scheduler.sim.sweep import POLICIES

if TYPE_CHECKING:
    from gpudiag.scheduler.sim.traces import Trace

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


def _flag(param: str) -> str:
    return {"loads_text": "--loads", "mfu_file": "--mfu", "node_sizes_": "--node-sizes",
            "as_json": "--json"}.get(param, "--" + param.replace("_", "-"))


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
@click.option("--sweep", is_flag=True,
              help="Instead of one replay: every policy and the ablation at each of --loads, over --seeds "
                   "windows of the trace (load by arrival rate and by cluster size on --nodes x 8 GPUs), "
                   "plus --windows 8-hour 160-job windows on 64 GPUs; writes scheduler-evaluation.md and "
                   "its SVG charts under --out (docs/scheduler-evaluation.md says how it is made).")
@click.option("--out", default="docs", show_default=True, type=click.Path(file_okay=False, path_type=str),
              help="--sweep: folder of the page (the charts and the raw sweep.json go in a subfolder).")
@click.option("--loads", "loads_text", default=DEFAULT_LOADS, show_default=True,
              help="--sweep: offered loads, comma-separated.")
@click.option("--seeds", type=int, default=3, show_default=True,
              help="--sweep: seeds (trace windows) per load.")
@click.option("--window-jobs", type=int, default=10000, show_default=True,
              help="--sweep: consecutive trace jobs per seed's window.")
@click.option("--windows", type=int, default=8, show_default=True,
              help="--sweep: 8-hour 160-job windows (Pollux/Sia style); 0 for none.")
@click.option("--processes", type=int, default=None, help="--sweep: worker processes [default: CPU count].")
def sim(trace: str, nodes: int, gpus_per_node: int, node_sizes_: str | None, rack_size: int, policy: str,
        seed: int, mfu_file: str | None, min_runtime: str, efficiency_delay: str, as_json: bool, sweep: bool,
        out: str, loads_text: str, seeds: int, window_jobs: int, windows: int, processes: int | None) -> None:
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
      gpudiag sim philly.csv --sweep --out docs
    """
    from gpudiag.scheduler.sim.metrics import summarise
    from gpudiag.scheduler.sim.sweep import policy_named, replay

    for name, v in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node), ("--rack-size", rack_size)):
        if v < 1:
            raise BadInput(f"{name} must be at least 1 (got {v})")
    ctx = click.get_current_context()
    given = {p for p in ctx.params if ctx.get_parameter_source(p) is ParameterSource.COMMANDLINE}
    options = {"min_runtime": min_runtime, "efficiency_delay": efficiency_delay}
    if sweep:
        _sweep(given, trace, out, loads_text, seeds, nodes, window_jobs, windows, processes, options)
        return
    sweep_only = given & {"out", "loads_text", "seeds", "window_jobs", "windows", "processes"}
    if sweep_only:
        raise BadInput(", ".join(sorted(_flag(p) for p in sweep_only)) + " only go with --sweep")
    groups = _groups(given, node_sizes_, nodes, gpus_per_node)
    shape = " + ".join(f"{n} nodes x {g} GPUs" for n, g in groups)
    if policy not in POLICIES:
        raise BadInput(f"--policy {policy!r}: use one of {', '.join(POLICIES)}")
    tr, mfu = _jobs(trace, seed, mfu_file)
    res = replay(tr.jobs, mfu, Cluster.of_sizes(groups, rack_size),
                 policy_named(policy, with_options(Policy(), options)))
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
    else:
        _print(m, policy, shape, rack_size)


def _sweep(given: set[str], trace: str, out: str, loads_text: str, seeds: int, nodes: int, window_jobs: int,
           windows: int, processes: int | None, options: dict[str, str]) -> None:
    """``--sweep``: every policy on its own windows, seeds and 8-GPU nodes (single-replay options refused)."""
    clash = given & {"policy", "seed", "mfu_file", "node_sizes_", "gpus_per_node", "rack_size", "as_json"}
    if clash:
        raise BadInput("--sweep runs every policy on its own windows of the trace, seeds and 8-GPU "
                       "nodes: leave out " + ", ".join(sorted(_flag(p) for p in clash)))
    from gpudiag.commands import sim_sweep
    sim_sweep.run(trace, out, loads_text, seeds, nodes, window_jobs, windows, processes,
                  with_options(Policy(), options), quiet=False)


def _groups(given: set[str], node_sizes_: str | None, nodes: int,
            gpus_per_node: int) -> list[tuple[int, int]]:
    """The cluster's (nodes, GPUs per node) groups: --node-sizes, or --nodes x --gpus-per-node."""
    if node_sizes_ is None:
        return [(nodes, gpus_per_node)]
    also = [_flag(p) for p in ("nodes", "gpus_per_node") if p in given]
    if also:
        raise BadInput(f"--node-sizes describes every node: leave out {' and '.join(also)}")
    return node_sizes(node_sizes_)


def _jobs(trace: str, seed: int, mfu_file: str | None) -> tuple[Trace, dict[int, tuple[float, str]]]:
    """The trace, and each job's (MFU, label): the synthetic model's, replaced by ``mfu_file``'s."""
    from gpudiag.scheduler.sim.mfu_model import read_mfu_file, synthesise
    from gpudiag.scheduler.sim.traces import read_trace

    tr = read_trace(trace)
    mfu = synthesise(tr.jobs, seed)
    if mfu_file:
        mfu, missing = read_mfu_file(mfu_file, tr.jobs, mfu)
        if missing:
            click.echo(f"gpudiag sim: {missing} job(s) not in {mfu_file} keep their synthetic MFU", err=True)
    return tr, mfu


def _print(m: dict[str, Any], policy: str, shape: str, rack_size: int) -> None:
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
