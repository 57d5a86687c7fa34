"""Array tasks and the Nice gpudiag gave their array.

A job array waits as one record (its ``array_job_id`` is its own id, ``array_task_string`` says
which tasks are left); when a task starts, Slurm 22.05 splits it off under a job id of its own
(the last task keeps the array's id) and the task carries the Nice the record had then - seen in
tests/system/slurm_faults/test_slurm_safety.py. A task requeued later waits under that id with that
Nice. Read as a
job of its own, the task's Nice would look like its original, and gpudiag would add its penalty
a second time (5000 -> 10000) and "restore" it to gpudiag's own value on stop.

So a split-off task whose Nice is the value gpudiag gave its array is adopted into the ledger by
its own id, with the array's original: its penalty is then kept or dropped by its own signal (by
the task's own id), never stacked, and restored like any other.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpudiag.scheduler.slurm.ledger import JobRef, Ledger, NiceEntry
from gpudiag.scheduler.slurm.squeue import SlurmJob


def adopt_split_tasks(ledger: Ledger, jobs: Iterable[SlurmJob]) -> list[int]:
    """Give each split-off task carrying its array's gpudiag Nice a ledger entry of its own (the
    array's original); returns the task ids adopted."""
    out = []
    for j in jobs:
        if not j.split_task or j.id in ledger.nice or j.id in ledger.theirs:
            continue
        e = ledger.nice.get(j.array_job_id)
        if e is None or e.lifted or not e.ours(j.nice) or j.nice == e.original:
            continue
        ledger.nice[j.id] = NiceEntry(JobRef.of(j), original=e.original, set=j.nice, want=None, at=e.at)
        out.append(j.id)
    return out
