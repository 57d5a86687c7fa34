"""What the controller changed in Slurm, so that every change can be undone, even after a restart.

One JSON file, replaced atomically (temporary file, fsync, rename) after every round that
changed something: per job the Nice it had before gpudiag touched it and the Nice gpudiag set;
per partition the PreemptMode it had before the controller took preemption over; per job the
time gpudiag requeued it (a requeued job is not chosen again while it is in its grace).
``--restore`` puts every recorded value back and empties the file.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

LEDGER_SCHEMA = 1


@dataclass
class NiceChange:
    original: int
    set: int
    at: float
    reason: str


@dataclass
class Ledger:
    nice: dict[int, NiceChange] = field(default_factory=dict)
    preempt_modes: dict[str, str] = field(default_factory=dict)
    requeued: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"schema": LEDGER_SCHEMA,
                           "nice": {str(k): asdict(v) for k, v in self.nice.items()},
                           "preempt_modes": self.preempt_modes,
                           "requeued": {str(k): v for k, v in self.requeued.items()}}, indent=1)


class LedgerError(ValueError):
    pass


def load_ledger(path: Path | None) -> Ledger:
    if path is None or not path.exists():
        return Ledger()
    try:
        d = json.loads(path.read_text())
        if d.get("schema") != LEDGER_SCHEMA:
            raise LedgerError(f"{path}: schema {d.get('schema')!r}, this gpudiag reads {LEDGER_SCHEMA}")
        return Ledger(nice={int(k): NiceChange(**v) for k, v in d.get("nice", {}).items()},
                      preempt_modes={str(k): str(v) for k, v in d.get("preempt_modes", {}).items()},
                      requeued={int(k): float(v) for k, v in d.get("requeued", {}).items()})
    except LedgerError:
        raise
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise LedgerError(f"{path}: not a gpudiag Slurm controller ledger ({e})") from None


def save_ledger(path: Path | None, ledger: Ledger) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ledger-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(ledger.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
