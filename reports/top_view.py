"""A live ``Snapshot`` as rows of text: the cells ``gpudiag top`` shows, for its terminal UI and
for ``--once`` (rich tables on stdout).

One place decides how each number reads, so the interactive view and a script's ``--once``
print the same cells. Numbers come from the snapshot; nothing here computes one. A value the
snapshot does not have reads "n/a".
"""

from __future__ import annotations

import time

from gpudiag.durations import short_age
from gpudiag.live.snapshot import DeviceRow, JobRow, Snapshot
from gpudiag.reports.fmt import ms
from gpudiag.units import pct, si

DEVICE_COLUMNS = ("NODE", "GPU", "MODEL", "SM", "TENSOR", "DRAM", "NVLINK", "PCIE", "MEMORY", "POWER", "JOB")
JOB_COLUMNS = ("JOB", "OWNER", "GPUS", "STEP", "MFU", "LABEL", "DIL", "AGE", "WASTE", "TIER", "REASON")
REASON_WIDTH = 48  # the scheduler's reason, cut here in the table (whole in --json)
NA = "n/a"


def _rate(v: float | None) -> str:
    return NA if v is None else si(v, "B/s")


def _memory(used: float | None, total: float | None) -> str:
    if used is None:
        return NA
    gib = 2**30
    return f"{used / gib:.1f}/{total / gib:.0f} GiB" if total else f"{used / gib:.1f} GiB"


def _age(seconds: float | None) -> str:
    return NA if seconds is None else short_age(seconds)  # one way to read an age: gpudiag queue's


def _cut(text: str | None, width: int) -> str:
    if not text:
        return ""
    return text if len(text) <= width else text[:width - 1] + "…"


def device_cells(d: DeviceRow) -> tuple[str, ...]:
    model = d.model.removeprefix("NVIDIA ")
    if not d.up:
        return (d.node, d.gpu, model, "down", "", "", "", "", "", "", d.jobs)
    return (d.node, d.gpu, model, pct(d.sm_active), pct(d.tensor_active), pct(d.dram_bw),
            _rate(d.nvlink_bytes_s), _rate(d.pcie_bytes_s), _memory(d.mem_used_bytes, d.mem_total_bytes),
            NA if d.power_watts is None else f"{d.power_watts:.0f} W", d.jobs or "-")


def job_cells(j: JobRow) -> tuple[str, ...]:
    label = NA if j.label is None else (j.label if j.confidence is None else f"{j.label} {j.confidence:.0%}")
    if j.stalled_seconds is not None:   # no step for this long: its MFU reads 0, its label is history
        label = f"STALLED {_age(j.stalled_seconds)} {j.stall_cause or ''}".rstrip()
    job = f"{j.job_id} (ended)" if j.ended else j.job_id  # its last values, shown this once
    return (job, j.owner or "?", NA if j.gpus is None else str(j.gpus),
            ms(None if j.step_seconds is None else j.step_seconds * 1e6), pct(j.mfu), label,
            NA if j.dilation is None else f"{j.dilation:.2f}x", _age(j.signal_age_seconds),
            NA if j.waste_gpus is None else f"{j.waste_gpus:.2f}", j.tier or "-",
            _cut(j.reason, REASON_WIDTH) or "-")


def headline(snap: Snapshot, sort: str, reverse: bool, owner: str) -> str:
    nodes = {d.node for d in snap.devices} | {s["source"] for s in snap.sources if s.get("source")}
    order = f"sort: {sort}{' (reversed)' if reverse else ''}"
    who = f"owner: {owner}" if owner else "owner: all"
    return (f"gpudiag top · {len(nodes)} node(s), {len(snap.devices)} GPU(s), {len(snap.jobs)} job(s) · "
            f"{order} · {who} · {time.strftime('%H:%M:%S', time.localtime(snap.taken_at))}")


def problems(snap: Snapshot) -> list[str]:
    """One line per source that could not be read, and the scheduler's status."""
    out = [f"{s['source']}: {s['error']}" for s in snap.sources if s.get("error")]
    if snap.scheduler:
        out.append(snap.scheduler)
    return out


def render_text(snap: Snapshot, width: int = 200) -> str:
    """``--once``: the header, both tables and what could not be read, as plain text."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    buf = StringIO()
    console = Console(file=buf, width=width, no_color=True, highlight=False, emoji=False)
    console.print(headline(snap, "waste", False, ""))
    for line in problems(snap):
        console.print(line)
    for title, columns, rows in (("GPUs", DEVICE_COLUMNS, [device_cells(d) for d in snap.devices]),
                                 ("Jobs (most wasted GPU-time first)", JOB_COLUMNS,
                                  [job_cells(j) for j in snap.jobs])):
        table = Table(title=title, title_justify="left", box=None, pad_edge=False)
        for c in columns:
            table.add_column(c, no_wrap=True, overflow="ellipsis")
        for r in rows:
            table.add_row(*r)
        console.print(table if rows else f"{title}: none")
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())
