"""What the controller learned about each key's MFU, kept across restarts beside the ledger.

The ``MfuBook`` is rebuilt at start by replaying the stored observations through
``MfuBook.observe`` (one decay rule); bounded by age (``MAX_HALF_LIVES``) and count
(``MAX_OBSERVATIONS``); each observation names its run (``id@submit#restarts``) so a run teaches
its key once. A file of its own (``<ledger>.history.json``): the ledger is rewritten several times
a round and must stay small. docs/slurm.md.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpudiag.scheduler.model import UNKNOWN
from gpudiag.scheduler.priority import MfuBook

HISTORY_SCHEMA = 1
MAX_HALF_LIVES = 10
MAX_OBSERVATIONS = 50_000


def history_path(ledger: Path) -> Path:
    return ledger.with_name(ledger.name + ".history.json")


@dataclass
class History:
    book: MfuBook
    seen: set[str] = field(default_factory=set)          # job runs that taught their key already
    rows: list[list] = field(default_factory=list)       # [run, key, class, mfu, label, t]
    dirty: bool = False
    unlabelled: dict[str, list] = field(default_factory=dict)   # run -> its row, label UNKNOWN

    def observe(self, run: str, key: str, cls: str, mfu: float, label: str, now: float) -> bool:
        """Whether the history changed. A run already seen changes it once more at most: the
        first known label of a run that taught its key an UNKNOWN one. (Taught once and for
        all, a Slurm test's input-bound key stayed "unknown" after its jobs' first signals on a
        loaded VM gave no label, 2026-12-01, and its jobs were never capped as GPU-idle.)"""
        if run in self.seen:
            row = self.unlabelled.get(run) if label != UNKNOWN else None
            if row is None:
                return False
            del self.unlabelled[run]
            row[4] = label
            self.book.relabel(key, label)
            self.dirty = True
            return True
        self.book.observe(key, cls, mfu, label, now)
        self.seen.add(run)
        row = [run, key, cls, mfu, label, now]
        self.rows.append(row)
        if label == UNKNOWN:
            self.unlabelled[run] = row
        self.dirty = True
        return True


def _unlabelled(rows: list[list]) -> dict[str, list]:
    """The rows whose run taught its key no label yet, by run (``History.unlabelled``)."""
    return {str(r[0]): r for r in rows if r[4] == UNKNOWN}


def load_history(path: Path | None, half_life_s: float, now: float) -> tuple[History, str]:
    """(history, a warning or ""): an unreadable file starts an empty history and says so."""
    h = History(MfuBook(half_life_s))
    if path is None or not path.exists():
        return h, ""
    try:
        d = json.loads(path.read_text())
        if d.get("schema") != HISTORY_SCHEMA:
            return h, f"{path}: history schema {d.get('schema')!r}, expected {HISTORY_SCHEMA}: starting empty"
        rows = sorted((r for r in d["rows"] if now - float(r[5]) <= MAX_HALF_LIVES * half_life_s),
                      key=lambda r: float(r[5]))[-MAX_OBSERVATIONS:]
        for run, key, cls, mfu, label, t in rows:
            h.book.observe(str(key), str(cls), float(mfu), str(label), float(t))
            h.seen.add(str(run))
        h.rows = [list(r) for r in rows]
        h.unlabelled = _unlabelled(h.rows)
    except (OSError, ValueError, TypeError, KeyError, IndexError) as e:
        return History(MfuBook(half_life_s)), f"{path}: unreadable MFU history ({e}): starting empty"
    return h, ""


def save_history(path: Path | None, h: History, now: float) -> None:
    if path is None or not h.dirty:
        return
    h.rows = [r for r in h.rows if now - r[5] <= MAX_HALF_LIVES * h.book.half_life_s][-MAX_OBSERVATIONS:]
    h.seen = {r[0] for r in h.rows}
    h.unlabelled = _unlabelled(h.rows)
    fd, tmp = tempfile.mkstemp(prefix=".history-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"schema": HISTORY_SCHEMA, "rows": h.rows}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    h.dirty = False
