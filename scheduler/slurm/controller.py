"""One controller round beside slurmctld: read, decide with the policy core, change little.

Per round: ``squeue`` (pending and running), ``sinfo`` (GPUs per node), ``scontrol show
partition|config``, the signal source; then

1. **Efficiency** (pending GPU jobs): the policy core's ``efficiency_factor`` (the job's own
   signal - a requeued job has one -, else what earlier jobs of its key reached, against its
   class median; GPU-idle labels capped) becomes ``Nice = original + (1 - factor) x nice_max``,
   quantised to ``NICE_STEPS`` so MFU jitter does not change it every round. Only values that
   differ are written, at most ``max_changes`` per round and one per job per
   ``min_change_interval_s``; a factor back at 1 (the signal recovered) puts the original back;
   a Nice someone else changed is theirs (the entry is dropped, never fought over). Signals
   unavailable (Prometheus down): no efficiency change at all; stale or weak ones the policy
   ignores. Nice only orders pending jobs within a partition tier: Slurm's PriorityTier still
   goes first.
2. **Victims**: the policy core's ``schedule`` (tiers, gang placement, ``choose_victims``: least
   MFU x GPUs x time since checkpoint lost). Slurm 22.05's ``preempt/partition_prio`` sorts its
   candidates by PriorityTier, then node count, then job-list order, and nothing gpudiag can set
   changes that, so the controller takes preemption of the preemptible partitions over (their
   PreemptMode set to OFF, recorded, restored on ``--restore``) and requeues its own choice with
   ``scontrol requeue`` - re-checking first that the head is still pending. The victim gets
   SIGTERM, ``KillWait`` seconds, SIGKILL, and is held (BeginTime) for Slurm's requeue delay.
   Without takeover (``takeover=False``) Slurm chooses and gpudiag only reports its choice.

Every change is an ``Action`` with its reason, logged; ``dry_run`` decides without writing.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from gpudiag.scheduler.model import Policy, Running, Signal
from gpudiag.scheduler.policy import schedule
from gpudiag.scheduler.priority import MfuBook, efficiency_factor, job_class, signal_usable
from gpudiag.scheduler.signals import SignalRead, SignalSource
from gpudiag.scheduler.slurm.adapter import job_of, model_of, tiers_of
from gpudiag.scheduler.slurm.ledger import Ledger, NiceChange, load_ledger, save_ledger
from gpudiag.scheduler.slurm.slurmio import SlurmError, SlurmIO, SlurmUnreachable
from gpudiag.scheduler.slurm.sources import slurm_signals
from gpudiag.scheduler.slurm.squeue import BadSlurmOutput, SlurmJob, duration_s

log = logging.getLogger("gpudiag.scheduler.slurm")

# With priority/basic every submission gets a priority one below the previous one, so Nice n
# files a job behind the next n submissions; 10,000 is several days of a busy cluster's
# submissions, the scale of the policy's efficiency delay. priority/multifactor: derived from
# PriorityWeightAge / PriorityMaxAge so that Nice equals the policy's delay in age points.
DEFAULT_NICE_MAX = 10_000
SLURM_NICE_LIMIT = 2_147_483_645     # scontrol rejects |Nice| above this (NICE_OFFSET - 3)
NICE_STEPS = 20                      # factor quantised to 5 % steps: no change for jitter
DEFAULT_MIN_CHANGE_INTERVAL_S = 300.0
DEFAULT_MAX_CHANGES = 200            # scontrol calls per round, whatever the queue
PREEMPT_OFF = "OFF"


@dataclass
class Action:
    kind: str            # "nice" | "restore" | "requeue" | "preempt_mode"
    target: str          # job id or partition name
    old: str
    new: str
    reason: str
    applied: bool = False
    error: str = ""
    for_job: int | None = None   # a requeue: the pending job it makes room for


@dataclass
class RoundResult:
    at: float
    skipped: str = ""
    signals: dict = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    jobs: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**asdict(self), "actions": [asdict(a) for a in self.actions]}


@dataclass
class Options:
    dry_run: bool = False
    nice_max: int | None = None
    min_change_interval_s: float = DEFAULT_MIN_CHANGE_INTERVAL_S
    max_changes: int = DEFAULT_MAX_CHANGES
    takeover: bool = True


def nice_scale(cfg: dict[str, str], policy: Policy) -> int:
    """Nice for factor 0 when not given: the policy's delay, in this Slurm's priority units."""
    if cfg.get("PriorityType") == "priority/multifactor":
        try:
            w, age = float(cfg.get("PriorityWeightAge", "0")), duration_s(cfg.get("PriorityMaxAge", "0"))
        except (ValueError, BadSlurmOutput):
            w, age = 0.0, 0.0
        if w > 0 and age > 0:
            return int(min(SLURM_NICE_LIMIT, max(1.0, w * min(1.0, policy.max_efficiency_delay_s / age))))
    return DEFAULT_NICE_MAX


class Controller:
    def __init__(self, io: SlurmIO, source: SignalSource | None, policy: Policy | None = None,
                 options: Options | None = None, ledger_path: Path | None = None) -> None:
        self.io, self.source = io, source
        self.policy = policy or Policy()
        self.opt = options or Options()
        self.ledger_path = ledger_path
        self.ledger: Ledger = load_ledger(ledger_path)
        self.book = MfuBook(self.policy.history_half_life_s)
        self.observed: set[int] = set()

    # --- reading ---------------------------------------------------------------------------------
    def _read_signals(self, now: float) -> SignalRead:
        if self.source is None:
            return SignalRead(available=False, why="no signal source (--prometheus or --agents)")
        return self.source.read(now)

    def round(self, now: float) -> RoundResult:
        """One round; raises SlurmUnreachable (the loop backs off), skips on malformed output."""
        res = RoundResult(at=now)
        try:
            jobs = self.io.jobs()
            nodes, parts, cfg = self.io.nodes(), self.io.partitions(), self.io.config()
        except SlurmUnreachable:
            raise
        except (BadSlurmOutput, SlurmError) as e:
            res.skipped = f"round skipped, nothing changed: {e}"
            log.error("%s", res.skipped)
            return res
        sig = self._read_signals(now)
        signals = slurm_signals(sig, jobs) if sig.available else {}   # each job's own user's only
        res.signals = {"available": sig.available, "why": sig.why, "jobs": len(signals)}
        res.jobs = {"pending": sum(j.state == "PENDING" for j in jobs),
                    "running": sum(j.state == "RUNNING" for j in jobs)}
        if not sig.available:
            res.notes.append(f"signals unavailable ({sig.why}): no efficiency changes this round")
        by_id = {j.id: j for j in jobs}
        self._forget_gone(by_id, now)
        modes = {p.name: self.ledger.preempt_modes.get(p.name, p.preempt_mode) for p in parts.values()}
        grace = duration_s(cfg.get("KillWait", "30 sec"))
        policy = replace(self.policy, min_runtime_s=duration_s(cfg.get("PreemptExemptTime", "0")))
        cluster, pending, running = model_of(jobs, nodes, parts, modes, grace)
        self._observe(running, signals, now, policy)
        if self.opt.takeover:
            res.actions += self._takeover(parts, modes)
        if sig.available and policy.efficiency:
            scale = self.opt.nice_max if self.opt.nice_max is not None else nice_scale(cfg, policy)
            res.actions += self._efficiency(jobs, parts, modes, grace, signals, now, policy, scale)
        if cluster.nodes:
            running = [self._mark_terminating(r, now) for r in running]
            decisions = schedule(cluster, pending, running, signals, self.book, now, policy)
            res.decisions = [{"kind": d.kind, "job_id": d.job_id, "reason": d.reason} for d in decisions]
            if self.opt.takeover:
                res.actions += self._victims(decisions, by_id)
        self._apply(res.actions, now)
        return res

    def _forget_gone(self, by_id: dict[int, SlurmJob], now: float) -> None:
        for jid in [j for j in self.ledger.nice if j not in by_id]:
            del self.ledger.nice[jid]
        for jid, t in list(self.ledger.requeued.items()):
            if jid not in by_id or now - t > 3600:
                del self.ledger.requeued[jid]

    def _observe(self, running: list[Running], signals: dict[int, Signal], now: float,
                 policy: Policy) -> None:
        """Key history: each running job's first usable signal teaches its key (once per job)."""
        for r in running:
            s = signals.get(r.job.id)
            if r.job.id not in self.observed and signal_usable(s, policy):
                self.book.observe(r.job.key, job_class(r.job.gpus), s.mfu, s.label, now)
                self.observed.add(r.job.id)

    def _mark_terminating(self, r: Running, now: float) -> Running:
        t = self.ledger.requeued.get(r.job.id)
        if t is None:
            return r
        return replace(r, terminating=True, expected_end=t + r.job.grace_s)

    # --- deciding --------------------------------------------------------------------------------
    def _takeover(self, parts: dict, modes: dict[str, str]) -> list[Action]:
        out = []
        for name, p in parts.items():
            if modes[name].upper() != PREEMPT_OFF and p.preempt_mode.upper() != PREEMPT_OFF:
                out.append(Action("preempt_mode", name, p.preempt_mode, PREEMPT_OFF,
                                  "gpudiag chooses preemption victims (least useful work lost); Slurm's "
                                  "partition_prio order cannot be steered per job; restored on --restore"))
        return out

    def _efficiency(self, jobs: list[SlurmJob], parts: dict, modes: dict[str, str], grace: float,
                    signals: dict[int, Signal], now: float, policy: Policy, scale: int) -> list[Action]:
        tiers = tiers_of(parts)
        out: list[Action] = []
        step = max(1, scale // NICE_STEPS)
        for j in jobs:
            if j.state != "PENDING" or j.gpus <= 0 or j.priority == 0:
                continue
            entry = self.ledger.nice.get(j.id)
            if entry is not None and j.nice != entry.set:
                log.info("job %d: Nice %d set by someone else (gpudiag set %d): left alone", j.id, j.nice,
                         entry.set)
                del self.ledger.nice[j.id]
                continue
            original = entry.original if entry else j.nice
            job = job_of(j, tiers, modes, grace)
            hist = self.book.lookup(job.key, now)
            factor, why = efficiency_factor(job, signals.get(j.id), hist, policy,
                                            self.book.class_median(job_class(job.gpus)))
            delta = int(round((1.0 - factor) * scale / step)) * step
            want = max(-SLURM_NICE_LIMIT, min(SLURM_NICE_LIMIT, original + delta))
            if want == j.nice:
                continue
            if entry is not None and now - entry.at < self.opt.min_change_interval_s:
                continue
            if len(out) >= self.opt.max_changes:
                log.info("more than %d Nice changes due: the rest wait for the next round",
                         self.opt.max_changes)
                break
            kind = "restore" if delta == 0 else "nice"
            reason = (f"efficiency factor {factor:.2f}: {why}" if delta else
                      f"efficiency back to neutral ({why}): original Nice restored")
            out.append(Action(kind, str(j.id), str(j.nice), str(want), reason))
        return out

    def _victims(self, decisions: list, by_id: dict[int, SlurmJob]) -> list[Action]:
        out = []
        for d in decisions:
            if d.kind != "preempt" or d.job_id in self.ledger.requeued:
                continue
            head = d.numbers.get("for_job")
            out.append(Action("requeue", str(d.job_id), "RUNNING", "PENDING", d.reason, for_job=head,
                              error="" if head in by_id else "head not in squeue"))
        return out

    # --- writing ---------------------------------------------------------------------------------
    def _head_still_waits(self, head: int | None) -> bool:
        """The head a victim is for must still be pending when we requeue (Slurm may have started it)."""
        try:
            return any(j.id == head and j.state == "PENDING" for j in self.io.jobs())
        except (BadSlurmOutput, SlurmError):
            return False

    def _apply(self, actions: list[Action], now: float) -> None:
        changed = False
        for a in actions:
            verb = "would" if self.opt.dry_run else "will"
            if self.opt.dry_run or a.error:
                log.info("%s %s %s: %s -> %s (%s)%s", verb, a.kind, a.target, a.old, a.new, a.reason,
                         f" [skipped: {a.error}]" if a.error else "")
                continue
            try:
                if a.kind in ("nice", "restore"):
                    jid = int(a.target)
                    self.io.set_nice(jid, int(a.new))
                    prev = self.ledger.nice.get(jid)
                    if a.kind == "restore":
                        self.ledger.nice.pop(jid, None)
                    else:
                        self.ledger.nice[jid] = NiceChange(prev.original if prev else int(a.old), int(a.new),
                                                           now, a.reason)
                elif a.kind == "preempt_mode":
                    self.ledger.preempt_modes.setdefault(a.target, a.old)
                    self.io.set_preempt_mode(a.target, a.new)
                elif a.kind == "requeue":
                    if not self._head_still_waits(a.for_job):
                        a.error = "the job it was for is no longer pending: not requeued"
                        log.info("requeue %s skipped: %s", a.target, a.error)
                        continue
                    self.io.requeue(int(a.target))
                    self.ledger.requeued[int(a.target)] = now
                a.applied, changed = True, True
                log.info("%s %s: %s -> %s (%s)", a.kind, a.target, a.old, a.new, a.reason)
            except SlurmError as e:
                a.error = str(e)
                log.warning("%s %s failed: %s", a.kind, a.target, e)
                if isinstance(e, SlurmUnreachable):
                    break
        if changed:
            save_ledger(self.ledger_path, self.ledger)

    def restore(self) -> list[Action]:
        """Put back every Nice and PreemptMode gpudiag set (a Nice changed since by others stays)."""
        try:
            current = {j.id: j for j in self.io.jobs()}
        except (BadSlurmOutput, SlurmError) as e:
            log.error("restore: cannot read squeue (%s): the ledger %s keeps what to undo", e,
                      self.ledger_path)
            return []
        actions = []
        for jid, entry in self.ledger.nice.items():
            j = current.get(jid)
            if j is not None and j.nice == entry.set:
                actions.append(Action("restore", str(jid), str(j.nice), str(entry.original),
                                      "controller stopping with --restore"))
        for name, mode in self.ledger.preempt_modes.items():
            actions.append(Action("preempt_mode", name, PREEMPT_OFF, mode,
                                  "stopping with --restore: Slurm chooses preemption victims again"))
        if self.opt.dry_run:
            self._apply(actions, 0.0)
            return actions
        for a in actions:
            try:
                if a.kind == "restore":
                    self.io.set_nice(int(a.target), int(a.new))
                    self.ledger.nice.pop(int(a.target), None)
                else:
                    self.io.set_preempt_mode(a.target, a.new)
                    self.ledger.preempt_modes.pop(a.target, None)
                a.applied = True
                log.info("restored %s %s: %s -> %s", a.kind, a.target, a.old, a.new)
            except SlurmError as e:
                a.error = str(e)
                log.error("restore %s %s failed (kept in the ledger): %s", a.kind, a.target, e)
        # what was not restored stays recorded; jobs whose Nice others changed are theirs now
        self.ledger.nice = {k: v for k, v in self.ledger.nice.items()
                            if any(a.target == str(k) and a.error for a in actions)}
        self.ledger.requeued.clear()
        save_ledger(self.ledger_path, self.ledger)
        return actions
