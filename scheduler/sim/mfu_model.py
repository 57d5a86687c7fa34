"""Each replayed job's MFU and bottleneck label: synthesised from a seed, or read from a file.

Per key a label (``LABEL_MIX``) and a base MFU (``MFU_BETA``), per job a log-normal factor
(``JOB_SIGMA``) clipped to [``MFU_MIN``, ``MFU_MAX``]; fixed before any policy was measured.
``--mfu FILE`` (``job,mfu,label``) replaces it. Sources and numbers: docs/scheduler-modelling.md.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from gpudiag.errors import BadInput
from gpudiag.scheduler.model import LABELS
from gpudiag.scheduler.priority import job_class
from gpudiag.scheduler.sim.traces import TraceJob

LABEL_MIX: dict[str, dict[str, float]] = {
    "1 GPU": {"compute-bound": 0.35, "memory-bound": 0.25, "input-bound": 0.25, "host-bound": 0.15},
    "2-8 GPUs": {"compute-bound": 0.30, "memory-bound": 0.20, "communication-bound": 0.25,
                 "input-bound": 0.15, "host-bound": 0.10},
    ">8 GPUs": {"compute-bound": 0.25, "memory-bound": 0.15, "communication-bound": 0.40,
                "input-bound": 0.10, "host-bound": 0.10},
}
MFU_BETA: dict[str, tuple[float, float]] = {   # (a, b): mean a / (a + b)
    "compute-bound": (7.0, 13.0),        # mean 0.35
    "memory-bound": (3.0, 17.0),         # mean 0.15
    "communication-bound": (3.0, 17.0),  # mean 0.15
    "input-bound": (2.0, 31.0),          # mean 0.06
    "host-bound": (2.0, 31.0),           # mean 0.06
}
JOB_SIGMA = 0.25
MFU_MIN, MFU_MAX = 0.005, 0.8


def synthesise(jobs: list[TraceJob], seed: int) -> dict[int, tuple[float, str]]:
    """job id -> (MFU, label), deterministic in ``seed`` and the trace."""
    rng = np.random.default_rng(seed)
    per_key: dict[str, tuple[float, str]] = {}
    out: dict[int, tuple[float, str]] = {}
    for j in sorted(jobs, key=lambda j: (j.submit, j.id)):
        base = per_key.get(j.key)
        if base is None:
            mix = LABEL_MIX[job_class(j.gpus)]
            labels = list(mix)
            label = labels[int(rng.choice(len(labels), p=np.array([mix[x] for x in labels])))]
            a, b = MFU_BETA[label]
            base = per_key[j.key] = (float(rng.beta(a, b)), label)
        mfu = base[0] * math.exp(rng.normal(0.0, JOB_SIGMA) - JOB_SIGMA ** 2 / 2)
        out[j.id] = (min(MFU_MAX, max(MFU_MIN, mfu)), base[1])
    return out


def read_mfu_file(path: str | Path, jobs: list[TraceJob],
                  synthetic: dict[int, tuple[float, str]]) -> tuple[dict[int, tuple[float, str]], int]:
    """Measured (MFU, label) per job from ``path``; returns the table and how many jobs were not in it."""
    try:
        with Path(path).open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise BadInput(f"cannot read --mfu file {path}: {getattr(e, 'strerror', None) or e}") from None
    if not rows or not {"job", "mfu"} <= set(rows[0]):
        raise BadInput(f"--mfu file {path}: needs a header with columns job,mfu[,label]")
    measured: dict[str, tuple[float, str]] = {}
    for n, r in enumerate(rows, 2):
        try:
            mfu = float(r["mfu"])
        except (TypeError, ValueError):
            raise BadInput(f"--mfu file {path} line {n}: mfu {r['mfu']!r} is not a number") from None
        label = (r.get("label") or "unknown").strip()
        if not 0.0 <= mfu <= 1.0 or label not in LABELS:
            raise BadInput(f"--mfu file {path} line {n}: mfu must be 0..1 and label one of "
                           f"{', '.join(LABELS)}")
        measured[str(r["job"]).strip()] = (mfu, label)
    out = dict(synthetic)
    missing = 0
    for j in jobs:
        if j.name in measured:
            out[j.id] = measured[j.name]
        else:
            missing += 1
    return out, missing
