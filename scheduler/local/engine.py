"""The policy core applied to the daemon's jobs: rows in, decisions and readable reasons out.

The machine is one node of the policy's model whose GPUs are the daemon's slots (GPU indices,
or CPU slots with ``--slots N``). Everything here is computed from what the daemon holds in
memory, so one pass costs what the policy costs (about a millisecond per hundred queued jobs),
not a database read. The reasons for ``gpudiag queue`` come from one pass over the whole queue,
not one ``explain`` per job (that would be quadratic at a thousand queued jobs).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.local.store import STOPPING, JobRow
from gpudiag.scheduler.model import (
    Cluster,
    Decision,
    Job,
    Node,
    Placement,
    Policy,
    Running,
    Signal,
    TeamShare,
    Tier,
)
from gpudiag.scheduler.policy import order_queue, plan_pass, schedule, wait_reasons
from gpudiag.scheduler.priority import MfuBook


@dataclass(frozen=True)
class Machine:
    """The slots the daemon hands out: ``ids`` are what a job sees (CUDA_VISIBLE_DEVICES or
    GPUDIAG_SLOTS); the policy sees indices 0..n-1 of one node."""

    ids: tuple[str, ...]
    gpus: bool    # True: GPUs (CUDA_VISIBLE_DEVICES); False: CPU slots (GPUDIAG_SLOTS)

    @property
    def cluster(self) -> Cluster:
        return Cluster((Node(0, len(self.ids), 0),))

    @property
    def unit(self) -> str:
        return "GPUs" if self.gpus else "slots"

    def env(self, slots: Sequence[int]) -> dict[str, str]:
        value = ",".join(self.ids[i] for i in slots)
        return {"CUDA_VISIBLE_DEVICES": value} if self.gpus else {"GPUDIAG_SLOTS": value}


def job_of(row: JobRow, default_estimate_s: float = Policy.default_estimate_s) -> Job:
    """The policy's Job for a row (cached on the row: rows change state, not what was asked).
    Without ``--time-limit`` backfill assumes ``Policy.default_estimate_s``."""
    job = row.extra.get("job")
    if job is None:
        job = Job(id=row.id, gpus=row.gpus, submit=row.submit_t,
                  estimate_s=row.time_limit_s or default_estimate_s, user=row.user, team=row.team,
                  key=row.key, tier=Tier(row.tier), preemptible=True, grace_s=row.grace_s)
        row.extra["job"] = job
    return job


def running_of(row: JobRow, last_checkpoint: float | None,
               default_estimate_s: float = Policy.default_estimate_s) -> Running:
    start = row.started_t or row.submit_t
    job = job_of(row, default_estimate_s)
    ckpt = start if last_checkpoint is None else max(start, last_checkpoint)
    return Running(job, Placement(((0, tuple(row.slots or ())),)), start,
                   expected_end=start + job.estimate_s, last_checkpoint=ckpt,
                   terminating=row.state == STOPPING)


def stored_signal(row: JobRow, now: float) -> Signal | None:
    """The last signal the job sent while it ran (kept in its row), for a requeued job."""
    if row.sig_mfu is None or row.sig_t is None:
        return None
    return Signal(row.sig_mfu, row.sig_label or "unknown", row.sig_conf or 0.0, max(0.0, now - row.sig_t))


def teams_of(quota: Mapping[str, int], active: Sequence[JobRow]) -> dict[str, TeamShare]:
    """Quota against the GPUs the team holds now (a point reading, not a decayed average)."""
    used: dict[str, float] = {}
    for r in active:
        used[r.team] = used.get(r.team, 0.0) + r.gpus
    return {t: TeamShare(float(q), used.get(t, 0.0)) for t, q in quota.items()}


class Engine:
    def __init__(self, machine: Machine, policy: Policy, book: MfuBook, quota: Mapping[str, int]) -> None:
        self.machine = machine
        self.policy = policy
        self.book = book
        self.quota = dict(quota)

    def _policy(self, signals_available: bool) -> Policy:
        # no agent: schedule without the efficiency factor rather than guess every job's MFU
        return self.policy if signals_available else dataclasses.replace(self.policy, efficiency=False)

    def decide(self, pending: Sequence[JobRow], active: Sequence[JobRow], signals: Mapping[int, Signal],
               ckpt: Mapping[int, float | None], now: float, signals_available: bool) -> list[Decision]:
        """One pass: starts (exact slots), preemptions, and the head's hold."""
        est = self.policy.default_estimate_s
        running = [running_of(r, ckpt.get(r.id), est) for r in active]
        return schedule(self.machine.cluster, [job_of(r, est) for r in pending], running, signals, self.book,
                        now, self._policy(signals_available), teams_of(self.quota, active))

    def reasons(self, pending: Sequence[JobRow], active: Sequence[JobRow], signals: Mapping[int, Signal],
                now: float, signals_available: bool) -> tuple[list[int], dict[int, str]]:
        """(pending job ids in scheduling order, why each one waits), from one planning pass."""
        policy = self._policy(signals_available)
        est = self.policy.default_estimate_s
        running = [running_of(r, None, est) for r in active]
        state = ClusterState(self.machine.cluster)
        for r in running:
            state.occupy(r.placement)
        queue = order_queue([job_of(r, est) for r in pending], running, signals, self.book, now, policy,
                            state.max_gpus, teams_of(self.quota, active), state.total_gpus)
        by_end = sorted(((r.expected_end, r.job.id, r.placement) for r in running), key=lambda x: x[0])
        decided = {d.job_id: d for d in plan_pass(state, queue, by_end, now, policy)}
        order = [j.id for j in queue.jobs]
        out: dict[int, str] = {}
        for job_id, (starts, text) in wait_reasons(state, queue, decided, policy).items():
            out[job_id] = f"starts at the next pass: {text}" if starts else self.words(text, now)
        return order, out

    def words(self, text: str, now: float) -> str:
        """The policy speaks of GPUs and of times on its clock; say slots on a CPU machine and
        clock times as a person reads them."""
        if not self.machine.gpus:
            text = text.replace("GPUs", "slots").replace("GPU-h", "slot-h")
        # one machine is one node: "on one node" says nothing there
        text = re.sub(r" on one node, at most (\d+) free on one", r", \1 free", text)
        text = re.sub(r", at most \d+ on one node| on one node", "", text)

        def when(m: re.Match) -> str:
            t = float(m.group(1))
            return f"{time.strftime('%a %H:%M', time.localtime(t))} (in {max(0.0, t - now) / 60:.0f} min)"

        return re.sub(r"t=(-?\d+(?:\.\d+)?)s", when, text)
