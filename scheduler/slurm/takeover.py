"""Which partitions gpudiag holds at PreemptMode=OFF (choosing victims itself), and which
waiting jobs it leaves to Slurm's own preemption.

Only REQUEUE partitions of ``preempt/partition_prio`` with GPU nodes a higher tier shares; a mode
an administrator set is theirs until slurm.conf is reloaded (``ledger.conf_reloaded``); a waiting
job gpudiag cannot judge or serve is Slurm's, and its candidates' partitions go back meanwhile.
docs/slurm.md, "What one round does" and "Why holding preemption is safe".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpudiag.scheduler.slurm.actions import PREEMPT_OFF, Action
from gpudiag.scheduler.slurm.ledger import Ledger
from gpudiag.scheduler.slurm.slurmconf import ConfModes, Partition, SlurmNode, same_mode
from gpudiag.scheduler.slurm.squeue import SlurmJob

TAKEOVER_MODE = "REQUEUE"
PARTITION_PRIO = "preempt/partition_prio"


@dataclass
class ModeView:
    """The round's partitions as gpudiag sees them after reconciling the ledger with Slurm."""

    original: dict[str, str]                 # partition -> mode Slurm had before gpudiag (or has)
    held: set[str]                           # held at OFF by gpudiag, confirmed
    reset: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    theirs: set[str] = field(default_factory=set)   # an administrator's until slurm.conf is reloaded


def reconcile_modes(ledger: Ledger, parts: Mapping[str, Partition], reloaded: bool | None = None,
                    conf: ConfModes | None = None) -> ModeView:
    """Resolve crash intents, reloads and administrators' changes; returns who holds what now.

    ``reloaded``: slurm.conf was reloaded since the ledger's last round (``ledger.conf_reloaded``; None:
    unknown); ``conf``: slurm.conf as it is now (None: unreadable here)."""
    view = ModeView({n: p.preempt_mode for n, p in parts.items()}, set())
    if reloaded and ledger.theirs_modes:   # slurm.conf, reloaded, is the administrators' word again
        view.notes.append(f"slurm.conf reloaded: partition(s) {', '.join(sorted(ledger.theirs_modes))} "
                          "are gpudiag's to manage again")
        ledger.theirs_modes.clear()
    for name in [n for n in ledger.theirs_modes if n not in parts]:
        del ledger.theirs_modes[name]
    for name, e in list(ledger.modes.items()):
        p = parts.get(name)
        if p is None:
            del ledger.modes[name]
            view.notes.append(f"partition {name} is gone from Slurm: forgotten")
            continue
        mode, now_conf = p.preempt_mode.upper(), conf.mode(name) if conf is not None else None
        if reloaded and now_conf is not None and same_mode(mode, now_conf) \
                and not same_mode(now_conf, e.original):
            del ledger.modes[name]      # slurm.conf changed and was reloaded: never restore the old
            view.notes.append(f"partition {name}: slurm.conf now sets PreemptMode={now_conf} and was "
                              f"reloaded: the administrator's; gpudiag forgets {e.original} and will not "
                              "restore it")
        elif mode == PREEMPT_OFF:
            e.set, e.want = PREEMPT_OFF, None
            view.held.add(name)
            view.original[name] = e.original
        elif (e.set is None or e.want is not None) and mode == e.original.upper():
            del ledger.modes[name]      # a crash's intent that never ran, or a give-back that did
        elif mode == e.original.upper() and reloaded is not False \
                and (now_conf is None or same_mode(mode, now_conf)):
            del ledger.modes[name]
            view.reset.append(name)
            view.notes.append(f"partition {name} is back at PreemptMode={p.preempt_mode} (scontrol "
                              "reconfigure or a slurmctld restart reloaded slurm.conf): no victims "
                              "chosen this round")
        else:
            del ledger.modes[name]
            ledger.theirs_modes[name] = p.preempt_mode
            view.notes.append(f"partition {name}: PreemptMode set to {p.preempt_mode} by someone else "
                              f"(scontrol update, no reload of slurm.conf) since gpudiag set {PREEMPT_OFF}: "
                              "theirs now, gpudiag no longer manages it until slurm.conf is reloaded")
    view.theirs = set(ledger.theirs_modes)
    return view


def eligible(parts: Mapping[str, Partition], modes: ModeView, nodes: Mapping[str, SlurmNode],
             preempt_type: str) -> set[str]:
    """Partitions gpudiag may hold: REQUEUE ones with GPU nodes that a higher tier shares."""
    if preempt_type != PARTITION_PRIO:
        return set()
    out = set()
    for name, p in parts.items():
        if modes.original[name].upper() != TAKEOVER_MODE or name in modes.theirs:
            continue
        gpu_nodes = {n for n in p.nodes if n in nodes and nodes[n].gpus > 0}
        if any(q.priority_tier > p.priority_tier and gpu_nodes & set(q.nodes) for q in parts.values()):
            out.add(name)
    return out


def unsafe_holds(parts: Mapping[str, Partition], original: Mapping[str, str], nodes: Mapping[str, SlurmNode],
                 hold: set[str]) -> dict[str, str]:
    """Partitions of ``hold`` that holding would expose another partition's jobs -> why.

    Held at OFF, a partition's jobs are no victims to ``preempt/partition_prio``; a higher-tier job
    arriving on its nodes then makes Slurm preempt whatever else is preemptible there: a CANCEL
    partition's job is killed where Slurm alone would have requeued the spot job (seen in
    tests/system/slurm_faults/test_slurm_safety.py). So P is held only if every partition R that a
    higher tier Q over
    P could preempt (R's tier below Q's, R's mode not OFF, R and Q sharing a node) is held too; a
    partition left out exposes the others in turn, so this runs to a fixed point. What remains is
    a set of partitions in which Slurm, for every higher-tier job, has no victim at all: gpudiag's
    choice is then the only one, and nobody else's job pays for it.

    Every node counts, GPU or not: a held partition's jobs are out of Slurm's reach on its
    CPU-only nodes too, and a higher-tier job that asks for no GPUs may land on any node of its
    partition. With spot over a GPU node and a CPU node, and a CANCEL partition on the CPU node,
    Slurm killed the CANCEL job for such a job while spot was held (issue 41's first finding);
    looking at GPU nodes only, the rule had not seen it."""
    kept, why = set(hold), {}
    changed = True
    while changed:
        changed = False
        for name in sorted(kept):
            p = parts[name]
            mine = set(p.nodes)
            for q in sorted(parts.values(), key=lambda x: x.name):
                if q.priority_tier <= p.priority_tier or not mine & set(q.nodes):
                    continue
                exposed = [r for r in sorted(parts.values(), key=lambda x: x.name)
                           if r.name != name and r.name not in kept and r.priority_tier < q.priority_tier
                           and original.get(r.name, r.preempt_mode).upper() != PREEMPT_OFF
                           and set(q.nodes) & set(r.nodes)]
                if exposed:
                    r = exposed[0]
                    shared = sorted(set(q.nodes) & set(r.nodes))
                    where = "" if all(nodes[n].gpus > 0 for n in shared if n in nodes) else \
                        f" on {', '.join(n for n in shared if n in nodes and nodes[n].gpus == 0)} (no GPUs)"
                    mode = original.get(r.name, r.preempt_mode)
                    why[name] = (f"not held: a job of {q.name} would make Slurm preempt partition {r.name}'s "
                                 f"jobs (PreemptMode={mode}){where} in place of {name}'s; Slurm chooses "
                                 "victims there, as it would alone")
                    break
            if name in why:
                kept.discard(name)
                changed = True
    return why


def busy_partitions(jobs: Sequence[SlurmJob], want: set[str]) -> dict[str, str]:
    """Partitions with a job in Slurm's GraceTime -> why they keep their mode for now.

    Slurm reads a partition's PreemptMode again when a victim's GraceTime ends, and at OFF it
    kills the job it meant to requeue (seen in
    tests/system/slurm_faults/test_slurm_safety.py's reconfigure test).
    So such a partition stays (or goes back) at its original mode until that job is requeued."""
    return {j.partition: f"Slurm is preempting job {j.id} in it: it keeps its mode until that job is requeued"
            for j in jobs if j.holds and j.preempt_time > 0 and j.partition in want}


def mode_actions(parts: Mapping[str, Partition], modes: ModeView, want: set[str],
                 why_not: Mapping[str, str]) -> list[Action]:
    """Take what should be held and is not; give back what is held and should not be."""
    out = []
    for name in sorted(want - modes.held):
        out.append(Action("preempt_mode", name, parts[name].preempt_mode, PREEMPT_OFF,
                          "gpudiag chooses this partition's preemption victims (least useful work lost); "
                          "Slurm's order cannot be steered per job; restored on stop"))
    for name in sorted(modes.held - want):
        out.append(Action("preempt_mode", name, PREEMPT_OFF, modes.original[name],
                          f"preemption given back to Slurm: {why_not.get(name, 'no longer taken over')}"))
    return out


def candidates(parts: Mapping[str, Partition], jobs: Sequence[SlurmJob], original: Mapping[str, str],
               min_runtime_s: float, now: float, stopping: Callable[[SlurmJob], bool]
               ) -> dict[str, list[SlurmJob]]:
    """Per partition with waiting jobs: the running jobs Slurm could preempt for them."""
    waiting = {j.partition for j in jobs if j.state == "PENDING"}
    running = [j for j in jobs if j.state == "RUNNING" and not stopping(j) and now - j.start >= min_runtime_s]
    out: dict[str, list[SlurmJob]] = {}
    for q in waiting:
        if q not in parts:
            continue
        tier, nodes = parts[q].priority_tier, set(parts[q].nodes)
        out[q] = [j for j in running if j.partition in parts and parts[j.partition].priority_tier < tier
                  and original.get(j.partition, "OFF").upper() != PREEMPT_OFF and nodes.intersection(j.nodes)]
    return out


def fits_after(head: SlurmJob, node_names: Sequence[str], freed: Sequence[SlurmJob],
               nodes: Mapping[str, SlurmNode], memory: bool, holding: Sequence[SlurmJob] = ()) -> str:
    """"" when the head's CPUs (and memory, where Slurm allocates it) fit on these nodes once the
    ``freed`` jobs are gone; else what stays short, in words.

    ``holding``: every job holding resources (the freed ones included). A victim frees its CPUs
    only where no other job shares its cores: under ``OverSubscribe`` the jobs on a node hold
    more CPUs than the node has allocated, and a requeue that frees no core did not help (issue
    41 saw one tried first). So what a node gets back is at most what the jobs that stay do not
    cover of its allocated CPUs."""
    k = max(1, len(node_names))
    gone = {j.id for j in freed}
    for n in node_names:
        node = nodes.get(n)
        if node is None:
            return f"node {n} unknown"
        share = [j for j in freed if n in j.nodes]
        back = sum(j.cpus / max(1, len(j.nodes)) for j in share)
        if holding:
            stay = sum(j.cpus / max(1, len(j.nodes)) for j in holding if j.holds and n in j.nodes
                       and j.id not in gone)
            back = min(back, max(0.0, node.cpus_alloc - stay))
        cpus = node.cpus - node.cpus_alloc + back
        if head.cpus / k > cpus + 1e-9:
            return f"needs {head.cpus / k:g} CPUs on {n}, {cpus:g} would be free"
        if memory and head.mem_mb > 0:
            mem = node.mem_mb - node.mem_alloc_mb + sum(j.mem_mb / max(1, len(j.nodes)) for j in share)
            if head.mem_mb / k > mem + 1e-9:
                return f"needs {head.mem_mb / k:g} MB on {n}, {mem:g} MB would be free"
    return ""
