"""The policy core applied to the daemon's jobs: rows in, decisions and readable reasons out.

The machine is one node of the policy's model whose GPUs are the daemon's slots (GPU indices,
or CPU slots with ``--slots N``), which rows hold by their ids (``Layout``: positions exist
only within a pass). Everything here is computed from what the daemon holds in memory, so one
pass costs what the policy costs (about a millisecond per hundred queued jobs), not a database
read. The reasons ``gpudiag queue`` shows are those of the daemon's last pass
(``reasons.Pass``, kept by the daemon), put into a person's words here: slots where the machine
has slots, clock times, and a start time only where one can be estimated - from time limits and
kill deadlines, never from the default estimate of a job that has no time limit.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpudiag.contract import ENV_SLOTS
from gpudiag.scheduler.local.store import ACTIVE, FINISHING, STOPPING, JobRow
from gpudiag.scheduler.model import (
    Cluster,
    Decision,
    Job,
    Node,
    Placement,
    Policy,
    Running,
    Signal,
    Tier,
)
from gpudiag.scheduler.policy import plan
from gpudiag.scheduler.priority import MfuBook
from gpudiag.scheduler.reasons import Pass, Why

STOP_WORDS = {"preempt": "preempted", "cancel": "cancelled", "timeout": "out of time",
              "finish": "its analysis overran", "badfile": "a bad file"}


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

    def env(self, slots: Sequence[str]) -> dict[str, str]:
        value = ",".join(slots)
        return {"CUDA_VISIBLE_DEVICES": value} if self.gpus else {ENV_SLOTS: value}


def _id_key(i: str) -> tuple[int, str]:
    return (int(i), i) if i.isdigit() else (1 << 62, i)


@dataclass(frozen=True)
class Layout:
    """One pass's slots as the policy sees them. Node 0: the ids the daemon declares
    (``Machine.ids``, in order). Node 1, only while there are any: ids that running jobs hold
    and the daemon no longer declares (it was restarted with another ``--gpus``), a drained node
    (``Node.available`` False) whose GPUs their jobs keep until they end and nothing new is
    placed on. Rows hold ids; positions exist only within a pass (a job's GPUs were once stored
    as positions, and a restart with GPU 0 added moved a running job onto GPUs it never had)."""

    declared: tuple[str, ...]
    retired: tuple[str, ...] = ()

    @classmethod
    def of(cls, machine: Machine, active: Iterable[JobRow]) -> Layout:
        held = {s for r in active for s in (r.slots or ())}
        return cls(machine.ids, tuple(sorted(held - set(machine.ids), key=_id_key)))

    @property
    def cluster(self) -> Cluster:
        nodes = [Node(0, len(self.declared), 0)]
        if self.retired:
            nodes.append(Node(1, len(self.retired), 0, available=False))
        return Cluster(tuple(nodes))

    def placement(self, ids: Sequence[str]) -> Placement:
        slots = []
        for node, names in enumerate((self.declared, self.retired)):
            pos = {name: k for k, name in enumerate(names)}
            idx = tuple(sorted(pos[i] for i in ids if i in pos))
            if idx:
                slots.append((node, idx))
        return Placement(tuple(slots))

    def ids(self, placement: Placement) -> list[str]:
        names = (self.declared, self.retired)
        return [names[node][i] for node, idx in sorted(placement.slots) for i in sorted(idx)]


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


def running_of(row: JobRow, last_checkpoint: float | None, layout: Layout,
               default_estimate_s: float = Policy.default_estimate_s) -> Running:
    """A stopping job holds its slots until its kill deadline at the latest (its estimate says
    nothing any more), and its slots are on their way to being free: never a victim again. So
    does a finishing one (its command ended; its analysis is bounded by its deadline)."""
    start = row.started_t or row.submit_t
    job = job_of(row, default_estimate_s)
    ckpt = start if last_checkpoint is None else max(start, last_checkpoint)
    leaving = row.state in (STOPPING, FINISHING)
    end = row.stop_deadline if leaving and row.stop_deadline is not None else start + job.estimate_s
    return Running(job, layout.placement(row.slots or ()), start, expected_end=end,
                   last_checkpoint=ckpt, terminating=leaving)


def stored_signal(row: JobRow, now: float) -> Signal | None:
    """The last signal the job sent while it ran (kept in its row), for a requeued job."""
    if row.sig_mfu is None or row.sig_t is None:
        return None
    return Signal(row.sig_mfu, row.sig_label or "unknown", row.sig_conf or 0.0, max(0.0, now - row.sig_t))


class Engine:
    def __init__(self, machine: Machine, policy: Policy, book: MfuBook, quota: Mapping[str, int]) -> None:
        self.machine = machine
        self.policy = policy
        self.book = book
        self.quota = dict(quota)

    def _policy(self, signals_available: bool) -> Policy:
        # no agent: schedule without the efficiency factor rather than guess every job's MFU
        return self.policy if signals_available else dataclasses.replace(self.policy, efficiency=False)

    def plan(self, pending: Sequence[JobRow], active: Sequence[JobRow], signals: Mapping[int, Signal],
             ckpt: Mapping[int, float | None], now: float, signals_available: bool,
             layout: Layout | None = None) -> Pass:
        """One pass: starts (exact slots: ``layout.ids`` of a start's placement, ``layout`` being
        ``Layout.of(machine, active)``), preemptions, the head's hold, and the reasons behind them."""
        est = self.policy.default_estimate_s
        layout = layout or Layout.of(self.machine, active)
        running = [running_of(r, ckpt.get(r.id), layout, est) for r in active]
        return plan(layout.cluster, [job_of(r, est) for r in pending], running, signals, self.book,
                    now, self._policy(signals_available), self.quota)

    def decide(self, pending: Sequence[JobRow], active: Sequence[JobRow], signals: Mapping[int, Signal],
               ckpt: Mapping[int, float | None], now: float, signals_available: bool) -> list[Decision]:
        return self.plan(pending, active, signals, ckpt, now, signals_available).decisions

    def free(self, rows: Iterable[JobRow]) -> int:
        """Declared slots no active row holds."""
        held = {s for r in rows if r.state in ACTIVE for s in (r.slots or ())}
        return sum(1 for i in self.machine.ids if i not in held)

    def describe(self, why: Why, rows: Mapping[int, JobRow], now: float, row: JobRow | None = None) -> str:
        """A pending job's reason from the pass, in a person's words (``row``: the job itself,
        so the head can say why its team's quota reclaimed nothing for it)."""
        if why.starts:
            return f"starts at the next pass: {self.words(why.text, now)}"
        if not why.head:
            return self.words(why.text, now)
        parts = [f"next to start: {self.words(why.need, now)}"]
        waits = [rows[j] for j in why.waits_for if j in rows]
        if why.firm and waits:
            each = [f"job {r.id} (finishing, its analysis ends by {_clock(r.stop_deadline or now)})"
                    if r.state == FINISHING else
                    f"job {r.id} ({STOP_WORDS.get(r.stop_kind or '', 'stopping')}, grace ends "
                    f"{_clock(r.stop_deadline or now)})" for r in waits]
            parts.append(f"will start when {' and '.join(each)} stop{'s' if len(each) == 1 else ''}")
            if why.reclaim:
                parts.append(self.words(why.reclaim, now))
        elif waits and any(r.state != STOPPING and r.time_limit_s is None for r in waits):
            ids = ", ".join(str(r.id) for r in waits)
            # each of them frees enough on its own: the first to end lets it start
            short = (row.gpus if row is not None else 0) - self.free(rows.values())
            one = len(waits) > 1 and short > 0 and all(self._declared(r) >= short for r in waits)
            parts.append(f"waits for {'any one of jobs' if one else 'job' + ('s' if len(waits) > 1 else '')} "
                         f"{ids} to end (no time limit: no start time to estimate)")
        elif why.start_at is not None:
            parts.append(f"reserved from {_when(why.start_at, now)}")
        if why.lowered:
            parts.append(self.words(why.lowered, now))
        if row is not None and not why.firm and not why.reclaim:
            parts.append(self.no_reclaim(row, rows.values()))
        return "; ".join(p for p in parts if p)

    def _declared(self, row: JobRow) -> int:
        """How many of the slots ``row`` holds are declared ones (what its end gives back)."""
        return sum(1 for s in (row.slots or ()) if s in self.machine.ids)

    def no_reclaim(self, head: JobRow, rows: Iterable[JobRow]) -> str:
        """Why a blocked head took nothing back for its team's quota, where quotas are set:
        its team has none, its team holds it already (and by which jobs, whoever submitted
        them), or no job of a team over its quota could make room."""
        if not self.policy.reclaim or not self.quota:
            return ""
        unit = self.machine.unit.rstrip("s")
        q = self.quota.get(head.team)
        if q is None:
            return f"no quota reclaim: team {head.team} has no --quota"
        if head.gpus > q:
            return (f"no quota reclaim: it needs {head.gpus} {self.machine.unit if head.gpus > 1 else unit}, "
                    f"more than team {head.team}'s {q}-{unit} quota")
        holders = [r for r in rows if r.team == head.team and r.state in ACTIVE and r.state not in (STOPPING,
                                                                                                    FINISHING)]
        held = sum(r.gpus for r in holders)
        if held + head.gpus > q:
            jobs = ", ".join(f"job {r.id} of {r.user}" for r in holders[:3])
            jobs += ", ..." if len(holders) > 3 else ""
            return (f"no quota reclaim: team {head.team} holds {held} of its {q}-{unit} quota"
                    + (f" ({jobs})" if holders else ""))
        return ("no quota reclaim: no job of a team over its quota can make room (same or lower tier, "
                "past --min-runtime)")

    def words(self, text: str, now: float) -> str:
        """The policy speaks of GPUs and of times on its clock; say slots on a CPU machine and
        clock times as a person reads them."""
        if not self.machine.gpus:
            text = re.sub(r"\bGPU(s?)\b", r"slot\1", text)
        # one machine is one node: "on one node" says nothing there
        text = re.sub(r" on one node, at most (\d+) free on one", r", \1 free", text)
        text = re.sub(r", at most \d+ on one node| on one node", "", text)
        return re.sub(r"t=(-?\d+(?:\.\d+)?)s", lambda m: _when(float(m.group(1)), now), text)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _when(t: float, now: float) -> str:
    return f"{time.strftime('%a %H:%M', time.localtime(t))} (in {max(0.0, t - now) / 60:.0f} min)"
