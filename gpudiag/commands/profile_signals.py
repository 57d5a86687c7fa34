"""``gpudiag profile``'s signals to the node agent: the reporter, the MFU and label it sends while
the job runs (the unprofiled estimate of the run directory), and the job's last signal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag.contract import ENV_AGENT_DIR, ENV_SIGNAL_INTERVAL
from gpudiag.rundir import RunInfo, trace_path

if TYPE_CHECKING:
    from gpudiag.collectors.job_signals import SignalReporter
    from gpudiag.diagnosis import Diagnosis, Recommendation


def _say(msg: str) -> None:
    import click

    click.echo(f"gpudiag: {msg}", err=True)


def signal_reporter(run_dir: Path, info: RunInfo, stall: Callable[[], Any] | None = None
                    ) -> SignalReporter | None:
    """Signals for the node's agent, when one runs here (its spool exists). ``stall()``: the stall
    watch's view of the job (collectors.stall_monitor.JobStall), or None."""
    import os

    from gpudiag.collectors.job_signals import SignalReporter
    from gpudiag.jobsignal import default_state_dir, job_id_from_env

    interval = float(os.environ.get(ENV_SIGNAL_INTERVAL, "15"))
    job_id = job_id_from_env(f"{info.host}:{run_dir.name}")
    state = default_state_dir()

    def extra() -> dict[str, Any]:
        from gpudiag.commands.profile_stall import stall_fields

        st = stall() if stall is not None else None
        return stall_fields(st) if st is not None else {}

    reporter = SignalReporter.for_node(state, job_id, run_dir, interval, estimator(run_dir), extra)
    if reporter is None:
        if os.environ.get(ENV_AGENT_DIR):  # named (a scheduler does): its absence is news
            info.notes.append(f"no signals sent: {ENV_AGENT_DIR}={state}, but {state / 'spool'} is "
                              "missing or not writable by this user (is `gpudiag agent` running there?)")
        return None
    info.notes.append(f"reporting to the node agent as job_id {job_id}")
    return reporter.start()


def estimator(run_dir: Path) -> Callable[[float | None], dict[str, Any]]:  # a closure
    """MFU and label while the job runs, from the unprofiled estimate of the run directory.

    The run directory is analysed again whenever a trace window is written (the first, and
    each re-trace), so the label follows the job's phase; between windows, MFU follows the
    live untraced step time (model FLOPs per step from the trace over the median of the
    most recent untraced steps, at the device's peak), never the dilated traced steps, and at
    the job's own pace: the training thread's waits for cores that processes outside the job
    held are not charged to it (``job_signals.own_step``).
    """
    cache: dict[str, Any] = {}
    trace = trace_path(run_dir, 0)

    def estimate(live_step_s: float | None) -> dict[str, Any]:
        try:
            mtime = trace.stat().st_mtime
        except OSError:
            return {}
        if cache.get("mtime") != mtime:
            from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
            from gpudiag.collectors.cpu_peak import cpu_peak, raise_floor, this_host

            choice = DeviceChoice(cpu_peak=cpu_peak, peak_floor=raise_floor, host=this_host())
            cache["d"] = diagnose(run_dir, choice, jobs=1)
            cache["mtime"] = mtime
        return signal_fields(cache["d"], live_step_s, traced_at=mtime)

    return estimate


def top_recommendation(d: Diagnosis) -> Recommendation | None:
    """The recommendation that saves the most of the step (largest ``gain``), else the first:
    what the agent exports as the job's one action (a bounded series)."""
    import re

    recs = [r for r in d.verdict.recommendations if re.fullmatch(r"[A-Za-z0-9_.:@-]{1,64}", r.action or "")]
    if not recs:
        return None
    gained = [r for r in recs if r.gain is not None and r.predicted_step_s is not None]
    return max(gained, key=lambda r: r.gain or 0.0) if gained else recs[0]


def signal_fields(d: Diagnosis, live_step_s: float | None, traced_at: float | None) -> dict[str, Any]:
    """The fields of a job signal (gpudiag/jobsignal.py, v2) from a Diagnosis."""
    from gpudiag.diagnosis import verdict_breakdown

    b = verdict_breakdown(d)
    out: dict[str, Any] = {"bottleneck": d.verdict.label.value, "confidence": d.verdict.confidence,
           "input_wait_ratio": b.input_wait / b.step_time if b.step_time > 0 else None,
           "traced_steps": max((len(r.steps) for r in d.ranks), default=0)}
    if traced_at is not None:
        out["traced_at"] = traced_at
    if d.dilation is not None:
        out["dilation"] = round(d.dilation.factor, 4)
    top = top_recommendation(d)
    if top is not None:
        out["action"] = top.action
        if top.predicted_step_s is not None:
            out["predicted_step_seconds"] = top.predicted_step_s
    mfu = d.mfu
    if live_step_s:
        # never below the device's busy time per step, as the diagnosis' own pace (gpudiag.pace):
        # the host's wait for a core overlaps the kernels it queued
        from gpudiag.analyzers.diagnose import diagnosis_device_busy_s

        live_step_s = max(live_step_s, diagnosis_device_busy_s(d).get(0, 0.0))
    if mfu.flops_per_step and mfu.peak_flops and live_step_s:
        out["mfu_ratio"] = min(1.0, mfu.flops_per_step / live_step_s / mfu.peak_flops)
    elif mfu.value is not None:
        out["mfu_ratio"] = mfu.value
    if "mfu_ratio" in out and mfu.confidence is not None:
        out["mfu_confidence"] = mfu.confidence
    return out


def final_signal(reporter: SignalReporter, d: Diagnosis | None, run_dir: Path) -> None:
    """The job's last signal: its MFU at its own recent pace, as every signal before it (the
    diagnosis' view would charge it the waits other processes caused)."""
    from gpudiag.collectors.job_signals import own_step

    fields: dict[str, Any] = {}
    if d is not None:
        try:
            traced_at = (trace_path(run_dir, 0)).stat().st_mtime
        except OSError:
            traced_at = None
        fields = signal_fields(d, own_step(run_dir), traced_at)
    reporter.finish(**fields)
    if reporter.error:
        _say(reporter.error)


