"""A fresh view of Slurm just before each write that decides who Slurm may preempt.

A round's view is seconds old and Slurm preempts about a second after a higher-tier job arrives;
a PreemptMode=OFF landing mid-preemption makes Slurm kill the job it meant to requeue. So each
PreemptMode or requeue write is skipped, with one line, when what it relied on changed;
``after_take`` gives a just-taken partition back if Slurm began preempting there. docs/slurm.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpudiag.scheduler.slurm.actions import PREEMPT_OFF, Action
from gpudiag.scheduler.slurm.slurmconf import Partition, same_mode
from gpudiag.scheduler.slurm.slurmio import SlurmError, SlurmIO, SlurmUnreachable
from gpudiag.scheduler.slurm.squeue import BadSlurmOutput, SlurmJob

# squeue read again this many times, this far apart, right after a take before the partitions go
# back to Slurm: slurmctld applying the mode changes (a reconfigure of its partitions each) can
# fail one read on a loaded machine (a CI run at load 6-8 gave two partitions back at once), and
# half a second is far within any job's GraceTime
AFTER_TAKE_READS = 3
AFTER_TAKE_RETRY_S = 0.25

NOT_CHANGED = "not changed"
NOT_REQUEUED = "not requeued"


@dataclass
class Fresh:
    io: SlurmIO
    jobs: Mapping[int, SlurmJob]              # the round's squeue, by id
    parts: Mapping[str, Partition]            # the round's partitions
    mode_for: Mapping[str, str]               # a victim's partition -> the mode its requeue relies on
    done: set[int] = field(default_factory=set)   # jobs this round requeued: their changes are ours
    reads: int = 0

    def before(self, a: Action) -> str:
        """"" when the write may go ahead; else why not (ending in "not changed"/"not requeued")."""
        end = NOT_REQUEUED if a.kind == "requeue" else NOT_CHANGED
        try:
            jobs = {j.id: j for j in self.io.jobs()}
            parts = self.io.partitions()
        except SlurmUnreachable:
            raise                      # not a "no" from Slurm: the outage, named once by the loop
        except (SlurmError, BadSlurmOutput) as e:
            return f"cannot read Slurm again before the write ({e}): {end}"
        self.reads += 1
        why = self._mode(a, jobs, parts) if a.kind == "preempt_mode" else self._requeue(a, jobs, parts)
        if not why and a.kind == "requeue":
            self.done.add(int(a.target))
        return f"{why}: {end}" if why else ""

    def after_take(self, taken: Mapping[str, str]) -> list[Action]:
        """Partitions just taken (name -> original mode) in which Slurm is preempting a job now:
        the writes that give them back."""
        if not taken:
            return []
        jobs: list[SlurmJob] | None = None
        for attempt in range(AFTER_TAKE_READS):
            try:
                jobs = self.io.jobs()
                break
            except (SlurmError, BadSlurmOutput) as e:
                failed = e
                if attempt + 1 < AFTER_TAKE_READS:
                    time.sleep(AFTER_TAKE_RETRY_S)
        if jobs is None:
            return [Action("preempt_mode", name, PREEMPT_OFF, orig, "preemption given back to Slurm: "
                           f"squeue could not be read right after taking it ({failed})")
                    for name, orig in taken.items()]
        out = []
        for name, orig in sorted(taken.items()):
            busy = [j.id for j in jobs if j.partition == name and j.holds and j.preempt_time > 0]
            if busy:
                out.append(Action("preempt_mode", name, PREEMPT_OFF, orig,
                                  f"preemption given back to Slurm: it began preempting job {busy[0]} as "
                                  "gpudiag took the partition; at OFF it would kill the job"))
        return out

    # --- the checks ----------------------------------------------------------------------------------
    def _on(self, nodes: set[str], jobs: Mapping[int, SlurmJob]) -> list[SlurmJob]:
        return [j for j in jobs.values() if j.holds and nodes.intersection(j.nodes)]

    def _mode(self, a: Action, jobs: Mapping[int, SlurmJob], parts: Mapping[str, Partition]) -> str:
        p = parts.get(a.target)
        if p is None:
            return f"partition {a.target} is gone from Slurm"
        if not same_mode(p.preempt_mode, a.old):
            return f"partition {a.target} is PreemptMode={p.preempt_mode} now, not {a.old} as the round read"
        if a.new.upper() != PREEMPT_OFF:
            return ""
        nodes = set(p.nodes)
        busy = [j.id for j in self._on(nodes, jobs) if j.preempt_time > 0]
        if busy:
            return f"Slurm is preempting job {busy[0]} on partition {a.target}'s nodes"
        for j in jobs.values():
            q = parts.get(j.partition)
            if (j.state == "PENDING" and j.id not in self.jobs and q is not None
                    and q.priority_tier > p.priority_tier and nodes.intersection(q.nodes)):
                return (f"job {j.id} arrived in higher-tier partition {j.partition} since this round read "
                        "squeue: Slurm may be choosing its victims now")
        return ""

    def _requeue(self, a: Action, jobs: Mapping[int, SlurmJob], parts: Mapping[str, Partition]) -> str:
        was = self.jobs[int(a.target)]
        v = jobs.get(was.id)
        if v is None or v.state != "RUNNING":
            return f"job {was.id} is no longer running ({v.state if v else 'gone'})"
        if v.restarts != was.restarts or v.preempt_time > 0:
            return f"job {was.id} was requeued or is being preempted since this round read squeue"
        if a.for_job is not None:
            h = jobs.get(a.for_job)
            if h is None or h.state != "PENDING":
                return f"job {a.for_job} is no longer pending ({h.state if h else 'gone'})"
        p = parts.get(v.partition)
        want = self.mode_for.get(v.partition, PREEMPT_OFF)
        if p is None or not same_mode(p.preempt_mode, want):
            return (f"partition {v.partition} is PreemptMode={p.preempt_mode if p else '?'} now, not "
                    f"{want} as the decision relied on")
        nodes = set(was.nodes)
        skip = self.done | {was.id}
        then = {(j.id, j.restarts) for j in self._on(nodes, self.jobs) if j.id not in skip}
        now = {(j.id, j.restarts) for j in self._on(nodes, jobs) if j.id not in skip}
        if then != now:
            diff = sorted(then ^ now)[0][0]
            return f"the jobs on {','.join(sorted(nodes))} changed since this round read squeue (job {diff})"
        return ""
