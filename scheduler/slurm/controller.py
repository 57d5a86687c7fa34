"""One controller round beside slurmctld: read, decide with the policy core, change little.

Per round: one ``squeue --json``, ``scontrol show node|partition|config`` (the four at once), the
signal source; then, with the cluster's claim renewed (``claim``: one controller per cluster) and
the ledger (``ledger``) reconciled against what Slurm shows (a reload of slurm.conf told by the
reload mark, never by statistics):

1. **Evidence** first: without a signal source that answers and at least one running GPU job
   with a usable signal, gpudiag changes nothing (no Nice, no takeover: Slurm decides) and says
   why in one line.
2. **Partitions** (``takeover``): REQUEUE partitions are held at PreemptMode=OFF so that gpudiag,
   not Slurm's fixed order, chooses victims - only where Slurm then has no other partition's job
   to preempt in their place (``unsafe_holds``); every waiting job gpudiag cannot judge or serve
   is handed to Slurm's own preemption.
3. **Victims**: the policy core's ``schedule`` (tiers, gang placement, ``choose_victims``: least
   MFU x GPUs x time since checkpoint lost) - only in a round where nothing suggests Slurm is
   preempting itself (a reset partition, a partition just taken, a job in Slurm's grace), only
   for a head without victims still stopping, and only where its CPUs and memory will fit.
   ``scontrol requeue``: SIGTERM, ``KillWait``, SIGKILL, then held (BeginTime).
   **Quota reclaim** (``reclaim``): the pass's reclaim victims of a head whose account is under
   its ``--quota`` are requeued the same way, also in quiet partitions (REQUEUE, no higher tier),
   after the head is lifted first in Slurm's order (Nice) so the freed GPUs go to it.
4. **Efficiency** (``efficiency``): Nice for pending GPU jobs.

Every change is an ``Action`` with its reason, written ahead to the ledger (``actions.apply``);
each PreemptMode or requeue write is made only if Slurm, read again just before it, still shows
what the round decided on (``fresh``; the writing is ``writes``); ``dry_run`` decides without
writing anything.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from gpudiag.scheduler.model import Policy, Signal, TeamShare
from gpudiag.scheduler.policy import schedule
from gpudiag.scheduler.priority import job_class, signal_usable
from gpudiag.scheduler.signals import SignalRead, SignalSource
from gpudiag.scheduler.slurm import claim
from gpudiag.scheduler.slurm.actions import PREEMPT_OFF, Action, reconcile
from gpudiag.scheduler.slurm.adapter import Model, model_of
from gpudiag.scheduler.slurm.arrays import adopt_split_tasks
from gpudiag.scheduler.slurm.efficiency import (
    DEFAULT_MAX_CHANGES,
    DEFAULT_MIN_CHANGE_INTERVAL_S,
    MULTIFACTOR,
    lift_all,
    neutral_jobs,
    nice_actions,
    nice_scale,
)
from gpudiag.scheduler.slurm.history import history_path, load_history, save_history
from gpudiag.scheduler.slurm.ledger import Lease, Ledger, LedgerError, LedgerStore, conf_reloaded
from gpudiag.scheduler.slurm.outages import SourceOutages
from gpudiag.scheduler.slurm.qos import PARTITION_PRIO, qos_tiers
from gpudiag.scheduler.slurm.reclaim import lift_ends, lifted_jobs, quiet_partitions
from gpudiag.scheduler.slurm.says import Said, mode_line
from gpudiag.scheduler.slurm.serve_jobs import Serving, serve_waiting
from gpudiag.scheduler.slurm.slurmconf import cluster_identity, duration_s, memory_is_consumable
from gpudiag.scheduler.slurm.slurmio import SlurmError, SlurmIO, SlurmUnreachable
from gpudiag.scheduler.slurm.sources import slurm_signals
from gpudiag.scheduler.slurm.squeue import BadSlurmOutput, SlurmJob
from gpudiag.scheduler.slurm.takeover import (
    ModeView,
    busy_partitions,
    eligible,
    mode_actions,
    reconcile_modes,
    unsafe_holds,
)
from gpudiag.scheduler.slurm.writes import Writer, write_round

log = logging.getLogger("gpudiag.scheduler.slurm")

# The lease outlives three missed rounds and never less than 15 s: a round that runs long (a
# slow slurmctld) renews it between commands, so only a controller that died or hangs loses it.
LEASE_ROUNDS = 3
MIN_LEASE_S = 15.0


def lease_for(interval_s: float) -> float:
    return max(MIN_LEASE_S, LEASE_ROUNDS * interval_s)


@dataclass
class RoundResult:
    at: float
    skipped: str = ""
    signals: dict = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    jobs: dict = field(default_factory=dict)
    held: list[str] = field(default_factory=list)             # partitions gpudiag holds after the round
    handed_back: dict[int, str] = field(default_factory=dict)  # waiting job -> why Slurm serves it
    not_reclaimed: dict[int, str] = field(default_factory=dict)  # a reclaim decided, not enacted: why

    def to_dict(self) -> dict:
        return {**asdict(self), "actions": [{k: v for k, v in asdict(a).items() if k != "ref"}
                                            for a in self.actions]}


@dataclass
class Options:
    dry_run: bool = False
    nice_max: int | None = None
    min_change_interval_s: float = DEFAULT_MIN_CHANGE_INTERVAL_S
    max_changes: int = DEFAULT_MAX_CHANGES
    takeover: bool = True
    lease_s: float = MIN_LEASE_S
    min_runtime_s: float | None = None          # None: the cluster's PreemptExemptTime
    quotas: dict[str, float] = field(default_factory=dict)
    need_multifactor: bool = False              # --efficiency-delay without --nice-max
    partitions: frozenset[str] | None = None    # --partitions: the only ones managed (None: all)


class Refused(ValueError):
    """An option this cluster's Slurm cannot honour (the CLI exits 2 with this line)."""


class Controller:
    def __init__(self, io: SlurmIO, source: SignalSource | None, policy: Policy | None = None,
                 options: Options | None = None, ledger_path: Path | None = None) -> None:
        self.io, self.source = io, source
        self.policy = policy or Policy()
        self.opt = options or Options()
        self.ledger_path = ledger_path
        self.store = LedgerStore(ledger_path, readonly=self.opt.dry_run)
        self.hist_path = history_path(ledger_path) if ledger_path else None
        self.history, warn = load_history(self.hist_path, self.policy.history_half_life_s, _now())
        if warn:
            log.warning("%s", warn)
        self.said = Said()                          # what the log was told, each thing once
        self._parts_read: dict = {}
        self.tenancy = claim.Tenancy(str(ledger_path or "(in memory)"), self.opt.lease_s)
        self._mark_failed = ""                      # why RELOAD_MARK could not be made (said once)
        self._outages = SourceOutages()
        self._sig_down_since: float | None = None   # the signal source has been unavailable since

    # --- the ledger --------------------------------------------------------------------------------
    def renew(self, ledger: Ledger, now: float | None = None) -> None:
        """Take or renew the lease; a live lease of another process is refused."""
        t = _now() if now is None else now
        held = ledger.lease
        if held is not None and held.live(t) and not held.mine():
            raise LedgerError(f"{self.ledger_path}: another controller (pid {held.pid} on {held.host}) holds "
                              f"its lease for {held.expires - t:.0f} s more; stop it first")
        if held is not None and not held.mine() and ledger.holds_preemption:
            log.warning("the previous controller's lease (pid %d on %s) lapsed: this one takes its ledger "
                        "over", held.pid, held.host)
        ledger.lease = Lease(os.getpid(), socket.gethostname(), t, t + self.opt.lease_s)
        if not self.opt.dry_run:
            self.tenancy.renew(ledger, t)

    def release(self) -> None:
        """The loop ends: the cluster's claim is given up (``claim.Tenancy.release``)."""
        if not self.opt.dry_run:
            self.tenancy.release(self.store.read(), _now())

    def _bind(self, ledger: Ledger, cfg: dict[str, str]) -> None:
        ident = cluster_identity(cfg)
        if ledger.cluster is None or not (ledger.nice or ledger.modes or ledger.requeued):
            ledger.cluster = ident
        elif ledger.cluster != ident:
            raise LedgerError(f"{self.ledger_path} belongs to cluster {ledger.cluster} and this is {ident}: "
                              "run --restore-only against that cluster, or give this one its own --state")
        self.tenancy.bind(ledger, cfg)

    # --- reading -----------------------------------------------------------------------------------
    def _read_signals(self, now: float) -> SignalRead:
        if self.source is None:
            return SignalRead(available=False, why="no signal source (--prometheus or --agents)")
        return self.source.read(now)

    def round(self, now: float) -> RoundResult:
        """One round; raises SlurmUnreachable (the loop backs off) and LedgerError (the ledger is
        not ours to use); skips the round on malformed output."""
        res = RoundResult(at=now)
        try:
            with ThreadPoolExecutor(4) as pool:   # four answers from slurmctld at once, not in a row
                reads = [pool.submit(f) for f in (self.io.jobs, self.io.nodes, self.io.partitions,
                                                  self.io.config)]
                jobs, nodes, parts, cfg = (r.result() for r in reads)
            marked = self.io.marked        # RELOAD_MARK in the same answer as the partitions
            self._parts_read = parts
            conf = self.io.slurm_conf(cfg)
            qos = qos_tiers(cfg, self.io.qos, self.io.json_ok is True)
        except SlurmUnreachable:
            raise
        except (BadSlurmOutput, SlurmError) as e:
            res.skipped = f"round skipped, nothing changed: {e}"
            log.error("%s", res.skipped)
            return res
        if self.opt.need_multifactor and cfg.get("PriorityType") != MULTIFACTOR:
            raise Refused(f"--efficiency-delay: this Slurm uses {cfg.get('PriorityType', '?')}, whose Nice "
                          "counts submissions, not seconds; give --nice-max N (the least efficient job's "
                          "Nice) instead")
        managed = self.opt.partitions
        if managed is not None and managed - set(parts):
            raise Refused(f"--partitions: this Slurm has no {', '.join(sorted(managed - set(parts)))} "
                          f"(it has {', '.join(sorted(parts))})")
        by_id = {j.id: j for j in jobs}
        snapshot = self.store.read()    # decided on; written back (with the lease) before any change
        self._bind(snapshot, cfg)
        if not self.opt.dry_run:        # one controller per cluster: before any value is read as an original
            self.tenancy.renew(snapshot, now)
        reloaded = conf_reloaded(snapshot, cfg.get("BOOT_TIME"), marked)
        reconcile(snapshot, by_id, res.notes)
        adopt_split_tasks(snapshot, jobs)
        for n in res.notes:
            log.info("%s", n)
        modes = reconcile_modes(snapshot, parts, reloaded, conf)
        res.notes += modes.notes
        for n in modes.notes:
            log.warning("%s", n)
        requeued = {jid: r.at for jid, r in snapshot.requeued.items()
                    if r.done and jid in by_id and by_id[jid].holds}
        in_flight = {snapshot.requeued[jid].for_job for jid in requeued}
        sig = self._read_signals(now)
        self._outages.update(sig.down)
        signals = slurm_signals(sig, jobs) if sig.available else {}   # each job's own user's only
        res.signals = {"available": sig.available, "why": sig.why, "jobs": len(signals)}
        res.jobs = {"pending": sum(j.state == "PENDING" for j in jobs), "running": sum(j.holds for j in jobs)}
        kill_wait = duration_s(cfg.get("KillWait", "30 sec"))
        min_runtime = self.opt.min_runtime_s if self.opt.min_runtime_s is not None else \
            duration_s(cfg.get("PreemptExemptTime", "0"))
        policy = replace(self.policy, min_runtime_s=min_runtime)
        quiet = quiet_partitions(parts, modes, nodes, cfg.get("PreemptType", "")) \
            if self.opt.takeover and self.io.json_ok is True and self.opt.quotas else set()
        quiet &= managed if managed is not None else quiet
        model = model_of(jobs, nodes, parts, modes.held | quiet, kill_wait, now, requeued)
        self._observe(model, by_id, signals, now, policy)
        no_evidence = self._evidence(sig, signals, model, policy)
        res.notes += [no_evidence] if no_evidence else []
        takeover = self.opt.takeover and not no_evidence and self.io.json_ok is True
        if self.opt.takeover and self.io.json_ok is False:
            res.notes.append("this squeue has no --json (no requeue flag, no preempt_time): Slurm chooses "
                             "preemption victims; gpudiag only changes Nice")
        want = eligible(parts, modes, nodes, cfg.get("PreemptType", "")) if takeover else set()
        want &= managed if managed is not None else want
        # the layout's answer, said once: from every partition gpudiag may hold, not from this
        # round's (a partition Slurm is preempting in sits a round out, and said it again)
        unsafe = unsafe_holds(parts, modes.original, nodes, want)
        if takeover:
            self.said.layout(res, unsafe)
        if not no_evidence:
            self.said.steering(mode_line(takeover, want - set(unsafe), qos, unsafe))
        busy_why = busy_partitions(jobs, want)
        want -= set(busy_why)
        res.notes += [f"partition {p}: {w}" for p, w in busy_why.items()]
        busy_why.update(self._safe(parts, modes, nodes, want))
        if self.opt.dry_run:   # decide as a real run would once it holds what it would take
            for r in model.running:
                r.job.preemptible = by_id[r.job.id].partition in want | quiet and by_id[r.job.id].requeue
        decisions = []
        if model.cluster.nodes:
            decisions = schedule(model.cluster, model.pending, model.running, signals, self.history.book, now,
                                 policy, self._teams(model))
            res.decisions = [{"kind": d.kind, "job_id": d.job_id, "reason": d.reason} for d in decisions]
        serving, requeues, handed_back, give_back = None, [], {}, set(modes.held)
        why_back = dict.fromkeys(modes.held, no_evidence or "takeover off (--no-takeover)")
        if takeover:
            serving = Serving(jobs, by_id, model, modes, parts, nodes, decisions, want,
                              lambda j: self._has_evidence(j, signals, policy, now), requeued, in_flight,
                              dict(snapshot.handed_back), memory_is_consumable(cfg), policy.min_runtime_s,
                              now, quiet, self.opt.quotas)
            blocked = self._victims_blocked(jobs, modes, want)
            requeues, handed_back, give_back = serve_waiting(serving, allow_victims=not blocked)
            res.notes += [blocked] if blocked else []
            why_back = {p: "a waiting job is Slurm's to serve (see handed_back)" for p in give_back}
        why_back.update(busy_why)
        why_back.update(self._safe(parts, modes, nodes, want - give_back))
        res.handed_back = handed_back
        self.said.reclaims(res, serving, requeues)
        for jid in set(handed_back) - set(snapshot.handed_back):
            log.info("job %d: left to Slurm's preemption: %s", jid, handed_back[jid])
        res.actions += mode_actions(parts, modes, want - give_back - set(why_back), why_back)
        res.actions += requeues
        res.actions += lift_ends(by_id, snapshot.nice)
        if not no_evidence and policy.efficiency and (qos is None or qos.nice_ok):
            scale = self.opt.nice_max if self.opt.nice_max is not None else nice_scale(cfg, policy)
            lifted = lifted_jobs(snapshot.nice) | {int(a.target) for a in requeues if a.kind == "lift"}
            top_qos = qos.top if qos is not None else frozenset()
            res.actions += nice_actions(jobs, parts, snapshot.nice, set(snapshot.theirs) | lifted, signals,
                                        self.history.book, now, policy, scale, self.opt.min_change_interval_s,
                                        self.opt.max_changes, neutral_jobs(jobs, parts, managed, top_qos))
        self._sig_down_since = None if sig.available else self._sig_down_since or now
        out_s = now - (self._sig_down_since or now)
        if out_s > policy.max_signal_age_s:
            res.actions += lift_all(jobs, snapshot.nice, f"signals unavailable for {out_s:.0f} s, longer "
                                    f"than the {policy.max_signal_age_s:.0f} s staleness limit")

        marked = self._mark(cfg, marked)

        def prepare(ledger: Ledger) -> None:
            self._bind(ledger, cfg)
            self.renew(ledger, now)
            reconcile(ledger, by_id, [])
            adopt_split_tasks(ledger, jobs)
            reconcile_modes(ledger, parts, reloaded, conf)
            ledger.boot, ledger.marked = cfg.get("BOOT_TIME"), bool(marked)
            ledger.handed_back = dict(handed_back)

        self._apply(res, now, serving, by_id, prepare)
        changed = {a.target: a.new for a in res.actions if a.kind == "preempt_mode" and a.applied}
        res.held = sorted(p for p in modes.held | set(changed) if changed.get(p, PREEMPT_OFF) == PREEMPT_OFF)
        if not self.opt.dry_run:
            save_history(self.hist_path, self.history, now)
        return res

    def _teams(self, model: Model) -> dict[str, TeamShare] | None:
        """--quota TEAM=N: a Slurm account's quota; its use is the GPUs its running jobs hold now."""
        if not self.opt.quotas:
            return None
        used: dict[str, float] = {}
        for r in model.running:
            used[r.job.team] = used.get(r.job.team, 0.0) + r.job.gpus
        return {t: TeamShare(q, used.get(t, 0.0)) for t, q in self.opt.quotas.items()}

    def _observe(self, model: Model, by_id: dict[int, SlurmJob], signals: dict[int, Signal], now: float,
                 policy: Policy) -> None:
        """Key history: each job run's first usable signal teaches its key (once per run)."""
        for r in model.running:
            s = signals.get(r.job.id)
            j = by_id[r.job.id]
            if signal_usable(s, policy):
                self.history.observe(f"{j.id}@{j.submit:.0f}#{j.restarts}", r.job.key, job_class(r.job.gpus),
                                     s.mfu, s.label, now)

    def _has_evidence(self, j: SlurmJob, signals: dict[int, Signal], policy: Policy, now: float) -> bool:
        if signal_usable(signals.get(j.id), policy):
            return True
        h = self.history.book.lookup(f"{j.user}/{j.name}", now)
        return h is not None and h.weight >= policy.min_history_weight

    def _evidence(self, sig: SignalRead, signals: dict[int, Signal], model: Model, policy: Policy) -> str:
        """"" when gpudiag may act on signals; else why not (logged once when it changes)."""
        if not sig.available:   # each source that is out is named once (SourceOutages)
            why = f"signals unavailable ({'none answered: ' + ', '.join(sig.down) if sig.down else sig.why})"
        elif not self.history.book.keys and not any(signal_usable(signals.get(r.job.id), policy)
                                                    for r in model.running):
            why = "no usable MFU signal (no running GPU job reports one, and no key history yet)"
        else:
            why = ""
        why = f"{why}: Slurm chooses preemption victims and no Nice is changed" if why else ""
        self.said.evidence(why)
        return why

    @staticmethod
    def _safe(parts: dict, modes: ModeView, nodes: dict, hold: set[str]) -> dict[str, str]:
        """Drops from ``hold`` (in place) the partitions whose hold would let Slurm preempt another
        partition's jobs in their place (``takeover.unsafe_holds``); returns them -> why."""
        why = unsafe_holds(parts, modes.original, nodes, hold)
        hold -= set(why)
        return why

    def _mark(self, cfg: dict[str, str], marked: bool | None) -> bool:
        """RELOAD_MARK made where gpudiag may hold partitions and it is missing: True when it is
        there now (what tells the next round a reload from an ``scontrol update``)."""
        if marked or self.opt.dry_run or not self.opt.takeover or cfg.get("PreemptType") != PARTITION_PRIO:
            return bool(marked)
        try:
            self.io.create_mark()
        except SlurmUnreachable:
            raise
        except SlurmError as e:
            if str(e) != self._mark_failed:
                log.warning("cannot make the reload mark (%s): a held partition back at its slurm.conf mode "
                            "counts as a reload, whether slurm.conf was reloaded or not", e)
                self._mark_failed = str(e)
            return False
        return True

    @staticmethod
    def _victims_blocked(jobs: list[SlurmJob], modes: ModeView, want: set[str]) -> str:
        if modes.reset:
            return f"partitions {', '.join(modes.reset)} were reset: no victims this round"
        if want - modes.held:
            return f"taking {', '.join(sorted(want - modes.held))} over: victims from the next round"
        busy = [j.id for j in jobs if j.holds and j.preempt_time > 0]
        if busy:
            return f"Slurm is preempting job {busy[0]}: no victims chosen this round"
        return ""

    # --- writing -----------------------------------------------------------------------------------
    def _apply(self, res: RoundResult, now: float, serving: Serving | None, by_id: dict[int, SlurmJob],
               prepare: Callable[[Ledger], None]) -> None:
        if self.opt.dry_run:
            for a in res.actions:
                log.info("would %s %s: %s -> %s (%s)%s", a.kind, a.target, a.old, a.new, a.reason,
                         f" [skipped: {a.error}]" if a.error else "")
            return
        write_round(res, Writer(self.io, self.store, self.renew, self.opt.lease_s / 3), now, by_id, serving,
                    self._parts_read, prepare)


def _now() -> float:
    return time.time()
