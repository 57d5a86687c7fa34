"""``gpudiag scheduler serve``: the daemon's state and its answers; ``loop`` runs it.

One thread, one event loop (``loop.Loop``), one SQLite file. Nothing a user controls may stall
or end it: job files are opened without following links or blocking (``jobfiles``) and read
within bounds (``untrusted``), a submit's check of the command runs as the user beside the
loop (``usercheck``), its answer sent when that check ends, and a full state folder refuses
what it cannot record in one line (``room``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpudiag.errors import BadInput
from gpudiag.scheduler.local import jobfiles, protocol, runner, userlimits
from gpudiag.scheduler.local.clients import Conn
from gpudiag.scheduler.local.config import (
    DB_NAME,
    LOCK_NAME,
    prepare_daemon_dir,
)
from gpudiag.scheduler.local.containment import Containment
from gpudiag.scheduler.local.engine import Engine, Layout, Machine, stored_signal
from gpudiag.scheduler.local.lifecycle import Jobs, log_line
from gpudiag.scheduler.local.protocol import Peer, Refused
from gpudiag.scheduler.local.room import StateFull
from gpudiag.scheduler.local.store import ACTIVE, CANCELLED, FINAL, PENDING, RUNNING, JobRow, Store
from gpudiag.scheduler.local.teams import NotInTeam, Teams
from gpudiag.scheduler.local.usercheck import CommandCheck
from gpudiag.scheduler.model import TIER_NAMES, Policy, Signal, Tier
from gpudiag.scheduler.priority import MfuBook
from gpudiag.scheduler.reasons import Pass, Why
from gpudiag.scheduler.signals import SignalRead, SignalSource
from gpudiag.scheduler.stalled import stalled_decisions

SIGNAL_PERIOD_S = 5.0     # the agent hears from a job every 15 s; reading it 3x as often suffices
RECENT_FINISHED = 20      # `gpudiag queue` without --all: this many ended jobs
MAX_LOG_OFFSET = 1 << 62  # off_t is 64-bit signed: a larger offset is a malformed request


@dataclass
class Deferred:
    """An answer that waits for a check running as the submitting user: ``done`` turns the
    check's verdict (None, or why not) into the answer."""

    check: CommandCheck
    done: Callable[[str | None], dict]


class Daemon:
    def __init__(self, state_dir: Path, machine: Machine, policy: Policy, quota: dict[str, int],
                 source: SignalSource | None, monitor: bool = True, agent_dir: Path | None = None,
                 cgroups: bool = True, teams: Teams | None = None) -> None:
        self.state_dir = state_dir
        self.teams = teams or Teams()
        self.machine = machine
        self.policy = policy
        self.source = source
        self.stopping = False
        self.dirty = True
        self.passes = 0   # scheduling passes begun (ping says: a test waits for the next one)
        prepare_daemon_dir(state_dir)
        self._lock = open(state_dir / LOCK_NAME, "a")  # held for the daemon's life
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInput(f"a scheduler is already running on {state_dir}") from None
        try:
            self.store = Store(state_dir / DB_NAME, machine.ids)
        except Exception as e:  # noqa: BLE001 - sqlite3/schema errors become one line
            raise BadInput(f"cannot open the scheduler database: {e}") from None
        for note in self.store.migrated:
            log_line(note)
        book = MfuBook(policy.history_half_life_s)
        for key, cls, mfu, label, t in self.store.observations():
            book.observe(key, cls, mfu, label, t)
        self.engine = Engine(machine, policy, book, quota)
        self.containment = Containment(self.store.prefix, cgroups)
        self.jobs = Jobs(self.store, state_dir, machine, monitor, book, agent_dir, self.containment)
        self.waiting: dict[int, tuple[Conn, Deferred]] = {}   # by the check's fd
        self.last_pass: Pass | None = None   # what ``gpudiag queue`` explains: the pass that decided
        self.jobs.load()
        self.signals = SignalRead(available=False, why="not read yet")
        self.signals_t = -1e18
        self.read_signals(time.time())
        try:
            for note in self.jobs.recover(time.time()):
                log_line(note)
        except StateFull as e:   # what it could not record, the passes settle (reap) as they can
            log_line(f"recovery stopped: {e}; the scheduling passes take it up")
        for row in self.jobs.active.values():   # restarted with another --gpus: one line per job
            gone = [i for i in row.slots or () if i not in machine.ids]
            if gone:
                log_line(f"job {row.id} of {row.user} holds {machine.unit} {','.join(gone)}, which this "
                         f"start does not declare ({','.join(machine.ids)}): it keeps them until it ends, "
                         "and no other job is given them")

    # -- signals ------------------------------------------------------------------------------
    def read_signals(self, now: float) -> None:
        if self.source is None:
            self.signals = SignalRead(available=False, why="no signal source configured")
        else:
            self.signals = self.source.read(now)
        self.signals_t = now
        changed = []
        for row in self.jobs.active.values():
            s = self._live(row)
            if s is not None and (s.mfu, s.label, s.confidence) != (row.sig_mfu, row.sig_label, row.sig_conf):
                changed.append((row, {"sig_mfu": s.mfu, "sig_label": s.label, "sig_conf": s.confidence,
                                      "sig_t": now - s.age_s}))
        if changed:
            try:
                self.store.update_many(changed, essential=False)
            except StateFull:
                pass   # written at a later read, once there is room
        self.jobs.late_signals(self._live, now)

    def _live(self, row: JobRow) -> Signal | None:
        """The job's signal from its own user (only), as the policy weighs it (``Signal.scheduled``:
        what the rows store, ``sig_conf`` the MFU's confidence where the agent exports one)."""
        s = self.signals.of(f"{self.store.prefix}:{row.id}", row.uid)
        return s.scheduled(self.policy.min_signal_confidence) if s is not None else None

    def signal_map(self, now: float) -> dict[int, Signal]:
        out = {}
        for row in self.jobs.active.values():
            s = self._live(row)
            if s is not None:
                out[row.id] = s
        for row in self.jobs.pending.values():
            s = stored_signal(row, now)
            if s is not None:
                out[row.id] = s
        return out

    def final_signal(self, row: JobRow) -> Signal | None:
        """A job that just ended sent its last signal as it ended: read the source once more."""
        now = time.time()
        if now - self.signals_t > 0.2:
            self.read_signals(now)
        return self._live(row)

    # -- the pass -------------------------------------------------------------------------------
    def schedule(self, now: float) -> None:
        self.passes += 1   # begun: a pass counted in ping began after every request answered before
        self.jobs.enforce(now)
        if self.jobs.reap(now, self.final_signal):
            self.dirty = True
        if now - self.signals_t >= SIGNAL_PERIOD_S:
            self.read_signals(now)
        self.act_on_stalled(now)
        if not self.jobs.pending:
            return
        active = list(self.jobs.active.values())
        ckpt = {r.id: self.jobs.checkpoint_time(r) for r in active}
        layout = Layout.of(self.machine, active)
        self.last_pass = self.engine.plan(list(self.jobs.pending.values()), active, self.signal_map(now),
                                          ckpt, now, self.signals.available, layout)
        for d in self.last_pass.decisions:
            if d.kind == "start" and d.job_id in self.jobs.pending:
                if self.store.room.short:
                    continue   # no start while the state folder is full: it could not be recorded
                self.jobs.start(self.jobs.pending[d.job_id], layout.ids(d.placement), now)
            elif d.kind == "preempt" and d.job_id in self.jobs.active:
                victim = self.jobs.active[d.job_id]
                why = self.engine.words(d.reason, now)
                try:
                    self.jobs.stop(victim, "preempt", f"preempted: {why}", now)
                except StateFull:
                    continue   # not while it could not be recorded: the next pass decides again
                what = "reclaimed for its quota by" if d.numbers.get("reclaim") else "preempted for"
                log_line(f"job {victim.id} of {victim.user} (team {victim.team}, "
                     f"{TIER_NAMES[Tier(victim.tier)]}) {what} job {d.numbers.get('for_job', '?')}: {why}")

    def act_on_stalled(self, now: float) -> None:
        """Where the admin asked for it (``--stalled``): requeue or cancel each running job the
        agent has called stalled for ``--stalled-after``; one line each (scheduler/stalled.py)."""
        # a stall that began before this run of the job (an earlier attempt's, still in the agent's
        # table until the restarted job reports) is not this run's
        running = {r.id: s for r in self.jobs.active.values()
                   if r.state == RUNNING and (s := self._live(r)) is not None
                   and (s.stalled_s is None or r.started_t is None
                        or self.signals_t - s.stalled_s >= r.started_t)}   # as of the read
        for d in stalled_decisions(running, self.policy):
            row = self.jobs.active.get(d.job_id)
            if row is not None and row.state == RUNNING:
                try:
                    self.jobs.stop(row, "preempt" if d.action == "requeue" else "cancel", d.reason, now)
                except StateFull:
                    continue   # not while it could not be recorded: the next pass decides again
                log_line(f"job {row.id} ({row.user}): {d.reason}")
                self.dirty = True

    # -- requests -------------------------------------------------------------------------------
    def handle(self, req: dict, peer: Peer) -> dict | Deferred:
        op = req["op"]
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "prefix": self.store.prefix,
                    "containment": self.containment.describe(), "passes": self.passes}
        if op == "submit":
            return self.submit(protocol.parse_submit(req), peer)
        if op == "queue":
            return self.queue(bool(req.get("all")), protocol.user_of(req))
        if op == "cancel" and ("ids" in req or "user" in req):
            return self.cancel_many(req, peer)
        row = self._job_for(protocol.job_id_of(req), peer)
        if op == "cancel":
            return self.cancel(row, peer)
        return self.logs(row, req)

    def _job_for(self, job_id: int, peer: Peer) -> JobRow:
        row = self.jobs.pending.get(job_id) or self.jobs.active.get(job_id) or self.store.job(job_id)
        if row is None:
            raise Refused(f"no job {job_id}")
        if peer.uid not in (0, row.uid):
            raise Refused(f"job {job_id} belongs to {row.user}: only its owner or root may do that")
        return row

    def submit(self, s: protocol.SubmitRequest, peer: Peer) -> Deferred:
        """Checked here: what the request says; then, as the user, that the command can run
        from its folder (``usercheck``); queued when that check says yes."""
        total = len(self.machine.ids)
        if s.gpus > total:
            raise Refused(f"--gpus {s.gpus}: needs {s.gpus} {self.machine.unit}, this machine has {total}")
        if os.geteuid() != 0 and peer.uid != os.geteuid():
            raise Refused(f"this scheduler runs as uid {os.geteuid()} and runs only that user's jobs "
                          "(run it as root to share the machine)")
        if peer.uid != os.geteuid():
            try:
                runner.credentials(peer.uid)
            except runner.UnknownUser:
                raise Refused(f"uid {peer.uid} has no user on this machine (no passwd entry): jobs run as "
                              "their submitter, so this scheduler cannot run yours (ask the admin to add the "
                              "user)") from None
        user = runner.user_name(peer.uid)
        in_check = sum(1 for c, _ in self.waiting.values() if c.peer.uid == peer.uid)
        why = userlimits.pending_refusal(user, peer.uid, self.jobs.pending.values(), in_check,
                                         self.policy.max_pending_per_user)
        if why:
            raise Refused(why)
        try:
            team = self.teams.team_for(peer.uid, user, s.team)
        except NotInTeam as e:
            raise Refused(str(e)) from None
        finally:
            while self.teams.notes:
                log_line(self.teams.notes.pop(0))
        exe = runner.monitor_command(Path(), s.cmd)[0] if self.jobs.monitor else s.cmd[0]
        try:
            check = CommandCheck(peer.uid, user, s.cwd, s.cmd[0], exe, s.env)
        except (OSError, ValueError) as e:
            why = getattr(e, "strerror", None) or e
            raise Refused(f"cannot check your command as {user}: {why}") from None
        return Deferred(check, lambda why: self._enqueue(s, peer, user, team, why))

    def _enqueue(self, s: protocol.SubmitRequest, peer: Peer, user: str, team: str, why: str | None) -> dict:
        if why is not None:
            raise Refused(why)
        row = JobRow(id=0, uid=peer.uid, user=user, team=team, name=s.name,
                     key=f"{user}/{s.name}" if s.name else "", tier=int(s.tier), gpus=s.gpus,
                     grace_s=s.grace_s,
                     time_limit_s=s.time_limit_s, cmd=s.cmd, env=s.env, cwd=s.cwd, submit_t=time.time(),
                     state=PENDING, reason="submitted")
        self.store.submit(row)
        self.jobs.pending[row.id] = row
        self.dirty = True
        return {"ok": True, "id": row.id, "agent_job_id": f"{self.store.prefix}:{row.id}"}

    def cancel(self, row: JobRow, peer: Peer) -> dict:
        now = time.time()
        who = "root" if peer.uid == 0 and row.uid != 0 else row.user
        if row.state in FINAL:
            raise Refused(f"job {row.id} has already ended ({row.state})")
        if row.state == PENDING:
            self.store.update(row, state=CANCELLED, ended_t=now, reason=f"cancelled by {who} while pending")
            del self.jobs.pending[row.id]
        else:
            self.jobs.stop(row, "cancel", f"cancelled by {who}", now)
        self.dirty = True
        return {"ok": True, "id": row.id, "state": row.state}

    def cancel_many(self, req: dict, peer: Peer) -> dict:
        """``gpudiag cancel ID ID ...`` or ``--user NAME`` (``userlimits.cancel_request``)."""
        now = time.time()
        out = userlimits.cancel_request(req, peer, self.jobs.pending, self.jobs.active, self.store,
                                        lambda i: self._job_for(i, peer),
                                        lambda r, why: self.jobs.stop(r, "cancel", why, now))
        self.dirty = True
        return out

    def queue(self, everything: bool, user: str | None = None) -> dict:
        if self.dirty:   # something changed since the last pass: let a pass decide, then explain it
            try:
                self.schedule(time.time())
                self.dirty = False
            except Exception:  # noqa: BLE001 - the listing is answered from the last pass; the loop's
                pass           # next pass runs it again and logs why it failed (loop.pass_guarded)
        now = time.time()
        last = self.last_pass
        seen = last.why if last is not None else {}
        rows_by_id = {**self.jobs.pending, **self.jobs.active}
        order = [i for i in (last.order if last is not None else ()) if i in self.jobs.pending]
        order += [i for i in self.jobs.pending if i not in seen]
        rows = [self.jobs.pending[i] for i in order] + list(self.jobs.active.values())
        if user is not None:   # gpudiag queue --user NAME / --mine
            rows = [r for r in rows if r.user == user]
        finished = self.store.jobs(FINAL, limit=None if everything else RECENT_FINISHED, user=user)
        out = []
        for r in rows + finished:
            d = r.public()
            d["tier_name"] = TIER_NAMES[Tier(r.tier)]
            if r.state == PENDING:
                d["why"] = self.engine.describe(seen[r.id], rows_by_id, now, r) if r.id in seen \
                    else "waiting for the next scheduling pass"
                if self.store.room.short:   # no start could be recorded: none is made
                    full = self.store.room.line().split(";")[0]
                    d["why"] = f"{full}: no job starts until there is room; {d['why']}"
                d["why_numbers"] = _why_numbers(seen.get(r.id))
            else:
                d["why"] = r.reason
            d["slot_ids"] = list(r.slots or ())
            out.append(d)
        sig = self.signals
        undeclared = {i: r.id for r in self.jobs.active.values() for i in r.slots or ()
                      if i not in self.machine.ids}
        return {"ok": True, "jobs": out, "unit": self.machine.unit, "total": len(self.machine.ids),
                "free": self.engine.free(self.jobs.active.values()), "undeclared": undeclared,
                "signals": {"available": sig.available, "why": sig.why, "jobs": len(sig.signals)},
                "prefix": self.store.prefix, "teams": self.teams.describe(), "quota": self.engine.quota}

    def logs(self, row: JobRow, req: dict) -> dict:
        stream = req.get("stream", "stdout")
        offset = req.get("offset", 0)
        if stream not in ("stdout", "stderr") or isinstance(offset, bool) or not isinstance(offset, int) \
                or not 0 <= offset <= MAX_LOG_OFFSET:
            raise Refused("logs: stream must be stdout or stderr and offset a byte count")
        what = f"{stream} of job {row.id}"
        try:
            with jobfiles.open_dir(self.jobs.job_dir(row), row.uid) as fd:
                data = jobfiles.read_file(fd, stream, row.uid, protocol.MAX_LOG_CHUNK, offset, what)
        except jobfiles.UnsafeFile as e:
            if e.errno != errno.ENOENT:   # no folder: the job has not started yet
                raise Refused(f"{e.strerror} (the job's folder is its user's: was it replaced?)") from None
            data = b""
        except OSError as e:
            raise Refused(f"cannot read {what}: {e.strerror or e}") from None
        ended = row.state not in (PENDING, *ACTIVE)
        out = {"ok": True, "data": protocol.to_wire(data), "next": offset + len(data),
               "ended": ended, "state": row.state}
        if ended and row.reason.startswith("could not start"):
            out["note"] = f"job {row.id} {row.reason}"
        return out

    def stop(self, *_: object) -> None:
        """SIGTERM, SIGINT: the loop ends after its current turn."""
        self.stopping = True

    def handle_line(self, line: bytes, peer: Peer) -> dict | Deferred:
        return self.handle(protocol.decode_request(line), peer)

    def guarded(self, answer: Callable[[], dict | Deferred]) -> dict | Deferred:
        """A request's answer: a refusal (a full state folder's among them) is its one line; anything
        else that goes wrong is this request's internal error, never the loop's."""
        try:
            return answer()
        except (Refused, StateFull) as e:
            return {"ok": False, "error": str(e)}
        except Exception as e:  # noqa: BLE001 - one bad request must not take the machine's queue down
            log_line(f"request failed: {type(e).__name__}: {e}")
            return {"ok": False, "error": f"internal error: {type(e).__name__}: {e}", "internal": True}


def _why_numbers(why: Why | None) -> dict:
    """The pass's reason as data, for ``gpudiag queue --json``."""
    if why is None:
        return {}
    return {"position": why.position, "head": why.head, "start_at": why.start_at,
            "waits_for": list(why.waits_for), "waits_for_stopping": why.firm, "behind": why.ahead,
            "fair_share": why.fair_share}


def main_loop(daemon: Daemon) -> None:
    from gpudiag.scheduler.local.loop import Loop

    try:
        Loop(daemon).serve()
    except KeyboardInterrupt:
        sys.exit(0)
