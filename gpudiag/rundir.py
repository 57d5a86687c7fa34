"""The run directory: one folder per ``gpudiag profile`` run, readable after any crash.

    run.json        what ran, where, when, how it ended (schema-versioned)
    samples/        append-only JSONL: gpu.jsonl, host.jsonl, steps-rank-N.jsonl
    traces/         rank-N.json.gz, written whole or not at all
    diagnosis.json  the Diagnosis of what was collected

``run.json`` is rewritten atomically (write to a temp file, rename), so a reader sees the
old or the new version, never half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpudiag.errors import BadInput

RUN_SCHEMA_VERSION = 1


@dataclass
class RunInfo:
    command: list[str]
    cwd: str
    host: str
    start: float
    options: dict[str, Any]
    versions: dict[str, str]
    status: str = "running"  # running | completed | failed | killed | interrupted
    end: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    gpu_counters: str = "not started"  # "nvml", "replay:<file>", or "not sampled: <why>"
    pid: int | None = None
    last_step: int | None = None
    notes: list[str] = field(default_factory=list)
    sampler: dict[str, Any] = field(default_factory=dict)  # samples, cpu_seconds, wall_seconds
    schema_version: int = RUN_SCHEMA_VERSION
    kind: str = "gpudiag-run"


def write_run(run_dir: Path, info: RunInfo) -> None:
    tmp = run_dir / ".run.json.partial"
    tmp.write_text(json.dumps(asdict(info), indent=1))
    os.replace(tmp, run_dir / "run.json")


def read_run(run_dir: Path) -> RunInfo:
    path = run_dir / "run.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not a readable gpudiag run ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != "gpudiag-run":
        raise BadInput(f"{path}: not a gpudiag run.json")
    if data.get("schema_version") != RUN_SCHEMA_VERSION:
        raise BadInput(f"{path}: run schema version {data.get('schema_version')!r} is not "
                       f"supported (this gpudiag reads {RUN_SCHEMA_VERSION})")
    known = set(RunInfo.__dataclass_fields__)
    return RunInfo(**{k: v for k, v in data.items() if k in known})


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Object rows of an append-only JSONL file. A torn line (a crash mid-write) or a
    missing file loses only that line or nothing: readers of run directories never fail
    on what a crash left behind."""
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text()
    except OSError:
        return rows
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def prepare_run_dir(path: Path) -> Path:
    """Create the run directory (and its parts); BadInput if it cannot be written."""
    if path.exists() and any(path.iterdir()):
        raise BadInput(f"--out {path}: folder exists and is not empty; choose a new one")
    try:
        for sub in ("samples", "traces"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise BadInput(f"--out {path}: cannot write there ({e.strerror or e})") from None
    return path
