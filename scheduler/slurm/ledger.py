"""The controller's write-ahead ledger: from it, everything gpudiag changed in Slurm can be undone
after a crash at any instant.

Intent (``want``, with the ``original`` read only when the target has no entry) before the change,
``set`` after; undo puts ``original`` back where the value is still ours. Bound to one cluster and
to jobs by ``JobRef``; a ``lease`` renewed every round; ``boot``/``marked`` tell a reload
(``conf_reloaded``). One JSON file under ``flock``, replaced atomically. docs/slurm.md, "Undo,
whatever happens".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpudiag.scheduler.slurm.squeue import SlurmJob

LEDGER_SCHEMA = 2


class LedgerError(ValueError):
    """The ledger cannot be used: unreadable, another cluster's, or leased by a live controller."""


@dataclass
class JobRef:
    """One job of one cluster: Slurm resets the submit time on a requeue and counts restarts, so a
    job is the same when its id matches and either its submit time does or it restarted since."""

    id: int
    submit: float
    restarts: int

    @classmethod
    def of(cls, j: SlurmJob) -> JobRef:
        return cls(j.id, j.submit, j.restarts)

    def matches(self, j: SlurmJob) -> bool:
        return j.id == self.id and (j.submit == self.submit or j.restarts > self.restarts)


@dataclass
class NiceEntry:
    ref: JobRef
    original: int
    set: int | None          # the last value gpudiag confirmed (None: none yet)
    want: int | None         # a change recorded, not yet confirmed
    at: float
    lifted: bool = False     # a quota reclaim's lift (``reclaim``): not the efficiency's to change

    def ours(self, nice: int) -> bool:
        return nice in (self.set, self.want)


@dataclass
class ModeEntry:
    """A partition whose PreemptMode gpudiag changed (held at OFF) or is changing."""

    original: str
    set: str | None          # "OFF" once confirmed
    want: str | None         # "OFF" (taking over) or ``original`` (giving back), not yet confirmed
    at: float

    def ours(self, mode: str) -> bool:
        return mode.upper() in {m.upper() for m in (self.set, self.want) if m} - {self.original.upper()}


@dataclass
class Requeue:
    """A victim gpudiag requeued (or is about to): while it still holds its GPUs, the job it was
    for gets no other victim, and no victim is chosen twice."""

    ref: JobRef
    at: float
    for_job: int | None
    done: bool


@dataclass
class Lease:
    pid: int
    host: str
    renewed: float
    expires: float

    def live(self, now: float) -> bool:
        """Unexpired and, on this host, its process still there: a controller that died here (what
        systemd's ExecStopPost follows) frees its ledger at once; on another host, time tells."""
        return now < self.expires and self.holder_alive()

    def holder_alive(self) -> bool:
        if self.host != socket.gethostname():
            return True
        try:   # a reused pid runs something else; a zombie has an empty cmdline
            return b"gpudiag" in Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False

    def mine(self) -> bool:
        return self.pid == os.getpid() and self.host == socket.gethostname()


@dataclass
class Ledger:
    cluster: dict[str, str] | None = None
    lease: Lease | None = None
    nice: dict[int, NiceEntry] = field(default_factory=dict)
    modes: dict[str, ModeEntry] = field(default_factory=dict)
    requeued: dict[int, Requeue] = field(default_factory=dict)
    handed_back: dict[int, str] = field(default_factory=dict)   # pending job id -> why Slurm serves it
    theirs: dict[int, JobRef] = field(default_factory=dict)     # jobs whose Nice someone else set
    # partitions whose PreemptMode an administrator set at runtime (``scontrol update``) over
    # gpudiag's: theirs until slurm.conf is reloaded (``conf_reloaded``)
    theirs_modes: dict[str, str] = field(default_factory=dict)
    boot: str | None = None         # slurmctld's BOOT_TIME as of the last round (None: none yet)
    marked: bool = False            # RELOAD_MARK made by gpudiag and present at the last round
    id: str | None = None           # this ledger's identity, named by the cluster's claim (``claim``)

    @property
    def holds_preemption(self) -> bool:
        return bool(self.modes)

    @property
    def holds_changes(self) -> bool:
        """Values gpudiag set in Slurm and has not put back (a Nice, a PreemptMode)."""
        return bool(self.nice or self.modes)

    def to_json(self) -> str:
        return json.dumps({"schema": LEDGER_SCHEMA, "cluster": self.cluster,
                           "lease": asdict(self.lease) if self.lease else None,
                           "nice": {str(k): asdict(v) for k, v in self.nice.items()},
                           "modes": {k: asdict(v) for k, v in self.modes.items()},
                           "requeued": {str(k): asdict(v) for k, v in self.requeued.items()},
                           "handed_back": {str(k): v for k, v in self.handed_back.items()},
                           "theirs": {str(k): asdict(v) for k, v in self.theirs.items()},
                           "theirs_modes": self.theirs_modes, "boot": self.boot, "marked": self.marked,
                           "id": self.id},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, d: dict) -> Ledger:
        return cls(cluster=d.get("cluster"), lease=Lease(**d["lease"]) if d.get("lease") else None,
                   nice={int(k): NiceEntry(**{**v, "ref": JobRef(**v["ref"])})
                         for k, v in d.get("nice", {}).items()},
                   modes={str(k): ModeEntry(**v) for k, v in d.get("modes", {}).items()},
                   requeued={int(k): Requeue(**{**v, "ref": JobRef(**v["ref"])})
                             for k, v in d.get("requeued", {}).items()},
                   handed_back={int(k): str(v) for k, v in d.get("handed_back", {}).items()},
                   theirs={int(k): JobRef(**v) for k, v in d.get("theirs", {}).items()},
                   theirs_modes={str(k): str(v) for k, v in d.get("theirs_modes", {}).items()},
                   boot=d.get("boot"), marked=bool(d.get("marked")), id=d.get("id"))

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex


def conf_reloaded(ledger: Ledger, boot: str | None, marked: bool | None) -> bool | None:
    """Was slurm.conf reloaded since the ledger's last round? True, False, or None (unknown: no
    round yet, or the reload mark was never made). ``boot``: slurmctld's BOOT_TIME now;
    ``marked``: the partitions read now have ``RELOAD_MARK``."""
    if ledger.boot is None or boot is None:
        return None
    if boot != ledger.boot:
        return True                  # slurmctld restarted: it read slurm.conf again
    if not ledger.marked or marked is None:
        return None
    return not marked                # only a reload of slurm.conf removes the mark


def parse_ledger(text: str, where: str) -> Ledger:
    try:
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("schema") != LEDGER_SCHEMA:
            schema = d.get("schema") if isinstance(d, dict) else None
            raise LedgerError(f"{where}: ledger schema {schema!r}, this gpudiag reads {LEDGER_SCHEMA}"
                              + (" (schema 1: run --restore-only with the gpudiag that wrote it)"
                                 if schema == 1 else ""))
        return Ledger.from_json(d)
    except LedgerError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise LedgerError(f"{where}: not a gpudiag Slurm controller ledger ({e})") from None


class LedgerStore:
    """The ledger file; ``path=None`` keeps it in memory only; ``readonly`` (``--dry-run``) reads
    the file and never writes it."""

    def __init__(self, path: Path | None, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        self._memory = Ledger()
        self.writes = 0

    def _load(self) -> Ledger:
        if self.path is None:
            return Ledger.from_json(json.loads(self._memory.to_json()))
        try:
            return parse_ledger(self.path.read_text(), str(self.path))
        except FileNotFoundError:
            return Ledger()
        except OSError as e:
            raise LedgerError(f"{self.path}: cannot read the ledger: {e}") from None

    def read(self) -> Ledger:
        with self._locked():
            return self._load()

    def peek(self) -> Ledger:
        """The ledger as last written, without the lock (writes are renames, so never torn).
        The watchdog's read: a controller stopped (SIGSTOP, a hung file system) inside one of
        its updates holds the lock, and a watchdog that waited for it would never give
        preemption back (the project's CI: the lease lapsed with the watchdog asleep in
        ``flock`` until the test killed the stopped controller, 25 s on)."""
        return self._load()

    @contextlib.contextmanager
    def update(self) -> Iterator[Ledger]:
        """Read, let the caller change, write back - all under the lock; nothing written on error."""
        with self._locked():
            ledger = self._load()
            yield ledger
            self._save(ledger)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.path is None or self.readonly:   # a reader needs no lock: writes are renames
            yield
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise LedgerError(f"{self.path}: cannot lock the ledger: {e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _save(self, ledger: Ledger) -> None:
        if self.readonly:
            return
        self.writes += 1
        if self.path is None:
            self._memory = ledger
            return
        try:
            fd, tmp = tempfile.mkstemp(prefix=".ledger-", dir=self.path.parent)
        except OSError as e:
            raise LedgerError(f"{self.path}: cannot write the ledger ({e}): changing nothing") from None
        try:
            with os.fdopen(fd, "w") as f:
                f.write(ledger.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:   # full or read-only disk: no intent recorded, so no change is made
            Path(tmp).unlink(missing_ok=True)
            raise LedgerError(f"{self.path}: cannot write the ledger ({e}): changing nothing") from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
