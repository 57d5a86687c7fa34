"""One controller per cluster: a claim in the cluster's own state folder, whatever ``--state`` says.

Two controllers on two ledgers stacked their Nice changes (issue 41), and a lease inside a ledger
cannot see another ledger; so the claim lives in ``StateSaveLocation``, which every slurmctld host
shares and only root and the SlurmUser may write. Another ledger is refused while the holder lives
or still holds changes. One JSON file under ``flock``. docs/slurm.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from gpudiag.scheduler.slurm.ledger import Lease, Ledger, LedgerError

CLAIM_FILE = "gpudiag-controller.claim"
log = logging.getLogger("gpudiag.scheduler.slurm")


class ClaimRefused(LedgerError):
    """Another controller holds (or its ledger still holds changes in) this cluster."""


@dataclass
class Claim:
    ledger_id: str
    state: str          # the ledger's path, as its controller was given it
    host: str
    pid: int
    renewed: float
    expires: float
    holds: bool         # that ledger holds values gpudiag set and has not put back

    def live(self, now: float) -> bool:
        return Lease(self.pid, self.host, self.renewed, self.expires).live(now)

    def mine(self, ledger_id: str) -> bool:
        return self.ledger_id == ledger_id

    def held_by_me(self) -> bool:
        return self.pid == os.getpid() and self.host == socket.gethostname()

    def who(self) -> str:
        return f"pid {self.pid} on {self.host}, --state {self.state}"


def claim_path(cfg: dict[str, str]) -> Path | None:
    """The claim file in the cluster's StateSaveLocation; None where the config names none."""
    where = cfg.get("StateSaveLocation", "").strip()
    return Path(where) / CLAIM_FILE if where and where != "(null)" else None


def _why_not(path: Path, e: OSError) -> str:
    return (f"cannot use the cluster's controller claim {path} ({e.strerror or e}): it lives in Slurm's "
            "StateSaveLocation, which only root and the SlurmUser may write; run the controller as one of "
            "them on a slurmctld host")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise ClaimRefused(_why_not(path, e)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_claim(path: Path) -> Claim | None:
    try:
        d = json.loads(path.read_text())
        return Claim(**{k: d[k] for k in Claim.__dataclass_fields__})
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ClaimRefused(_why_not(path, e)) from None
    except (ValueError, TypeError, KeyError):
        return None     # unreadable: nobody's claim (a crash mid-write cannot leave one: rename)


def _write(path: Path, c: Claim) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gpudiag-claim-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(c), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise ClaimRefused(_why_not(path, e)) from None


def take(path: Path, ledger_id: str, state: str, holds: bool, lease_s: float, now: float) -> Claim | None:
    """Take or renew the cluster's claim for this ledger; returns the claim found before when it
    was another ledger's (lapsed, its changes restored): the caller says so once."""
    with _locked(path):
        old = read_claim(path)
        if old is not None and not old.held_by_me():
            if old.live(now):
                raise ClaimRefused(f"another gpudiag controller steers this cluster ({old.who()}; its lease "
                                   f"runs {old.expires - now:.0f} s more): one controller per cluster, or "
                                   "their Nice values stack; stop it first")
            if old.holds and not old.mine(ledger_id):
                raise ClaimRefused(f"gpudiag's changes on this cluster are in another ledger ({old.who()}, "
                                   "stopped without restoring them): run `gpudiag scheduler serve --backend "
                                   f"slurm --restore-only --state {old.state}` on {old.host} first, or run "
                                   "this controller with that --state; otherwise its Nice values would read "
                                   "as originals")
        _write(path, Claim(ledger_id, state, socket.gethostname(), os.getpid(), now, now + lease_s, holds))
        return old if old is not None and not old.mine(ledger_id) else None


def release(path: Path, ledger_id: str | None, holds: bool, now: float) -> None:
    """This ledger's controller stops: the claim is dropped when nothing is left to restore, else
    kept as lapsed (another ledger stays refused until ``--restore-only`` empties this one)."""
    if ledger_id is None:
        return
    with _locked(path):
        old = read_claim(path)
        if old is None or not old.mine(ledger_id):
            return
        if not holds:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                raise ClaimRefused(_why_not(path, e)) from None
            return
        old.expires, old.holds = min(old.expires, now), True
        _write(path, old)


class Tenancy:
    """A controller's claim on its cluster: bound to its ledger's identity when it reads the
    cluster's config, renewed with its lease (at most every third of it: a round renews its lease
    several times), given up when it stops."""

    def __init__(self, state: str, lease_s: float) -> None:
        self.state, self.lease_s = state, lease_s
        self.path: Path | None = None
        self.ledger_id: str | None = None
        self._last: tuple[str | None, bool, float] = (None, False, 0.0)   # the last write: id, holds, when

    def bind(self, ledger: Ledger, cfg: dict[str, str]) -> None:
        self.ledger_id = ledger.id = ledger.id or self.ledger_id or Ledger.new_id()
        self.path = claim_path(cfg)

    def renew(self, ledger: Ledger, now: float) -> None:
        """ClaimRefused (a LedgerError) when another controller holds the cluster."""
        if self.path is None:
            return
        ledger.id = ledger.id or self.ledger_id
        if (ledger.id, ledger.holds_changes) == self._last[:2] and now - self._last[2] < self.lease_s / 3:
            return
        before = take(self.path, ledger.id, self.state, ledger.holds_changes, self.lease_s, now)
        self._last = (ledger.id, ledger.holds_changes, now)
        if before is not None:
            log.info("the cluster's controller claim was %s's, lapsed with nothing left to restore: this "
                     "controller takes it", before.who())

    def release(self, ledger: Ledger, now: float) -> None:
        """Given up (kept as lapsed while the ledger still holds changes, so that no controller on
        another ledger reads them as originals)."""
        if self.path is not None:
            release(self.path, ledger.id or self.ledger_id, ledger.holds_changes, now)
