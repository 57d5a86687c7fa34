"""``gpudiag profile``'s stall watch, wired: the rule, the verdict and the pages around the
collector that watches (``collectors/stall_monitor.py``), and what is left to say when the job
ends (an incident still open, a crash in a collective, a straggler).

Command-level glue: the collector does not analyse and the analyzers do not touch processes, so
the closures that join them live here, as ``profile``'s MFU estimator does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gpudiag.incident import Evidence, Incident, incidents_dir, read_incident, write_incident
from gpudiag.rundir import stacks_dir


def _say(msg: str) -> None:
    click.echo(msg, err=True)


def judge(rule: Any) -> Callable[[dict[int, Any], float], list[Any]]:  # over a stall.StallRule
    """(black boxes, now) -> each rank's limit, by the stall rule."""
    from gpudiag.analyzers.stall import Progress, assess

    def run(boxes: dict[int, Any], now: float) -> list[Any]:
        return assess([Progress(rank=b.rank, step=b.step, last_step_t=b.last_step_t, start=b.start,
                                phase=b.phase, phase_since=b.phase_since, profiler_open=b.profiler_open,
                                dts=b.dts, alive=b.alive) for b in boxes.values()], rule, now)

    return run


def save(inc: Incident, run_dir: Path, name: str) -> Path:
    """incident.json and incident.html in incidents/<name>/; the page's path. A page that cannot
    be written is one line; the JSON is the record."""
    folder = incidents_dir(run_dir) / name
    write_incident(folder, inc)
    page = folder / "incident.html"
    try:
        from gpudiag.reports.incident import render_html

        page.write_text(render_html(inc), encoding="utf-8")
    except Exception as e:  # noqa: BLE001 - the record is written; the page is a convenience
        _say(f"gpudiag: incident page not written: {type(e).__name__}: {e}")
    return page


def on_incident(run_dir: Path) -> Callable[[Evidence], str]:  # a closure
    """Evidence -> verdict, saved and printed; returns the cause for the agent."""
    def run(ev: Evidence) -> str:
        from gpudiag.analyzers.hang import verdict
        from gpudiag.reports.incident import render_text

        inc = Incident(evidence=ev, verdict=verdict(ev))
        page = save(inc, run_dir, ev.id)
        _say(render_text(inc, where=f"{page} (the job keeps running; gpudiag hang-report {run_dir})"))
        return inc.verdict.kind

    return run


def on_resolved(run_dir: Path) -> Callable[[str, float, str], None]:  # a closure
    def run(ident: str, when: float, why: str) -> None:
        resolve(run_dir, ident, when, why)
        _say(f"gpudiag: incident {ident}: {why}")

    return run


def resolve(run_dir: Path, ident: str, when: float, why: str) -> None:
    path = incidents_dir(run_dir) / ident / "incident.json"
    try:
        inc = read_incident(path)
    except Exception:  # noqa: BLE001 - nothing to resolve
        return
    if inc.resolved_at is None:
        inc.resolved_at, inc.resolution = when, why
        save(inc, run_dir, ident)


def stall_fields(state: Any) -> dict[str, Any]:  # collectors.stall_monitor.JobStall
    """The fields of a job signal that let the agent call the job stalled (gpudiag/jobsignal.py)."""
    out: dict[str, Any] = {}
    if state.last_step_at is not None:
        out["last_step_at"] = state.last_step_at
    if state.stall_after_s is not None:
        out["stall_after_s"] = state.stall_after_s
    if state.stalled and state.cause:
        out["stall_cause"] = state.cause
    return out


def after_job(run_dir: Path, monitor: Any, status: str, how: str, stopped: bool) -> None:
    """When the job has ended: close an open incident; where it failed on its own (``stopped``: a
    signal was passed on to it), read what its ranks left behind; name a straggler."""
    from gpudiag.analyzers.hang import verdict
    from gpudiag.analyzers.straggler_steps import find_straggler
    from gpudiag.collectors.stall_collect import exit_evidence
    from gpudiag.reports.incident import render_text
    from gpudiag.rundir import read_steps

    now = time.time()
    state = monitor.current() if monitor is not None else None
    if state is not None and state.incident is not None:
        resolve(run_dir, state.incident, now, f"the job {how} while stalled")
    elif monitor is not None and status in ("failed", "killed") and not stopped:
        ev = exit_evidence(run_dir, "exit", now)
        if ev is not None:
            v = verdict(ev)
            if v.kind in ("desync", "mismatch", "hung", "exited"):
                inc = Incident(evidence=ev, verdict=v, resolved_at=now, resolution=f"the job {how}")
                page = save(inc, run_dir, "exit")
                _say(render_text(inc, where=str(page)))
    try:
        slow = find_straggler(read_steps(run_dir))
    except Exception:  # noqa: BLE001 - a torn step file is not worth failing the run's end
        slow = None
    if slow is not None:
        inc = Incident(evidence=Evidence(id="straggler", source="steps", detected_at=now), verdict=slow)
        page = save(inc, run_dir, "straggler")
        _say(render_text(inc, where=str(page)))
    for msg in monitor.errors if monitor is not None else []:
        _say(f"gpudiag: {msg}")
    for f in (stacks_dir(run_dir)).glob("pid-*.txt"):   # processes never asked, never crashed
        try:
            if f.stat().st_size == 0:
                f.unlink()
        except OSError:
            pass
