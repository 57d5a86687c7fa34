"""The verdict and MFU of a job as it runs unprofiled: the same whichever way it is profiled.

The profiler slows the steps it traces (on the CPU and on a GPU's host side); the step timer
sees every step. These tests hold the unprofiled estimate against the truth: recorded H100
runs with their known answer, and real CPU jobs that time themselves and know their FLOPs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analyzers.classify import (
    EXTREME_DILATION,
    INPUT_HIGH,
    PENALTY_EXTREME_DILATION,
    extreme_dilation,
    with_deductions,
)
from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
from gpudiag.diagnosis import Bottleneck, Diagnosis
from gpudiag.rundir import (
    PROFILER_EXPORT,
    PROFILER_TRACED,
    PROFILER_WARMUP,
    read_bootstrap,
    read_steps,
)
from tests.conftest import SHARED
from tests.paths import REPO, TESTS

RUNS = SHARED / "runs"
JOB = TESTS / "jobs" / "small_ops_job.py"
# ../shared/runs/README.md: the GPT job alone runs 28.8 ms per step; 5.64 TFLOP per step
# analytic; MFU 19.8% of the H100's 989.4 TFLOP/s bf16 peak.
GPT_ANALYTIC_MFU = 5.64e12 / 28.8e-3 / 989.4e12
MFU_TOLERANCE = 0.10  # relative, as the issue asks


def shared_run(name: str) -> Path:
    path = RUNS / name
    if not path.is_dir():
        pytest.fail(f"test data missing: {path} (CI lays ../shared beside the repository)")
    return path


def test_h100_gpt_reads_memory_bound_with_its_real_mfu_not_host_bound():
    """Traced, the GPT job looks host-bound (the profiler doubled its steps); unprofiled, the GPU
    is busy ~90% of the real step and most kernel time is memory-bound."""
    d = diagnose(shared_run("h100-gpt-small"), jobs=1)
    assert d.basis == "unprofiled-estimate"
    assert d.traced_verdict is not None and d.traced_verdict.label is Bottleneck.HOST
    assert d.verdict.label is Bottleneck.MEMORY, d.verdict.summary
    assert d.dilation is not None and d.dilation.factor > 1.4
    assert d.mfu.step_time_basis == "untraced steps"
    assert abs(d.mfu.value / GPT_ANALYTIC_MFU - 1) <= MFU_TOLERANCE, (d.mfu.value, GPT_ANALYTIC_MFU)
    u = d.unprofiled
    assert u is not None and u.gpu_busy / u.step_time > 0.85
    assert u.compute + u.comm_exposed + u.memcpy_exposed + u.idle == pytest.approx(u.step_time)
    assert u.idle == pytest.approx(u.input_wait + u.host_overhead)


def test_h100_resnet_falls_back_to_its_traced_view_and_says_why():
    """Its untraced steps just before the window ran 21.5 ms, just after 25.3 ms (the 8-worker
    DataLoader warming up), while the job alone settles at 13.4 ms: no reference to scale by. The
    traced view is used (memory-bound, or a tie with host-bound: the profiler's host time is in
    it), MFU is over the traced steps, and the confidence carries each reason."""
    d = diagnose(shared_run("h100-resnet18-dl8"), jobs=1)
    assert d.basis == "profiled-steps" and not d.dilation.trusted and d.unprofiled is None
    assert d.verdict.label is Bottleneck.MEMORY, d.verdict.summary
    assert d.verdict.tie_with in (None, Bottleneck.HOST)
    assert d.mfu.step_time_basis == "traced steps"
    assert d.mfu.step_time_us == pytest.approx(d.breakdown.step_time)  # one step time per view
    reasons = " | ".join(x.reason for x in d.verdict.deductions)
    assert "pace changed across the traced window" in reasons and "used as is" in reasons
    assert d.verdict.confidence < 0.5 and d.verdict.confidence_level == "low"


def test_a_trace_alone_says_its_breakdown_is_of_profiled_steps():
    d = diagnose(shared_run("h100-gpt-small") / "traces", jobs=1)
    assert d.basis == "profiled-steps" and d.dilation is None and d.unprofiled is None
    assert d.mfu.step_time_basis == "traced steps"


def test_a_version_1_diagnosis_still_reads():
    d = diagnose(shared_run("h100-gpt-small"), jobs=1).to_dict()
    d["schema_version"] = 1
    for key in ("basis", "dilation", "unprofiled", "traced_verdict"):
        d.pop(key)
    d["mfu"].pop("step_time_basis")
    old = Diagnosis.from_dict(d)
    assert old.basis == "profiled-steps" and old.dilation is None


def test_a_version_2_diagnosis_with_string_recommendations_still_reads():
    d = diagnose(shared_run("h100-gpt-small"), jobs=1).to_dict()
    d["schema_version"] = 2
    d["verdict"]["recommendations"] = ["Fuse things.", "Overlap other things."]
    for key in ("deductions", "tie_with", "noise"):
        d["verdict"].pop(key)
    d.pop("traits")
    old = Diagnosis.from_dict(d)
    assert [r.text for r in old.verdict.recommendations] == ["Fuse things.", "Overlap other things."]
    assert all(r.action == "unknown" and r.predicted_step_s is None and "schema 2" in r.why
               for r in old.verdict.recommendations)
    assert old.verdict.deductions == [] and old.traits is None


def profile(tmp: Path, name: str, *opts: str, steps: int = 90) -> tuple[Diagnosis, dict, Path]:
    run, own = tmp / name, tmp / f"{name}-own.json"
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), *opts, "--",
                           sys.executable, str(JOB), "--steps", str(steps), "--report", str(own)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return Diagnosis.from_json((run / "diagnosis.json").read_text()), json.loads(own.read_text()), run


def test_the_bootstrap_marks_the_steps_it_traced_and_monitor_retraces(tmp_path):
    d, _, run = profile(tmp_path, "mon", "--monitor", "--retrace", "1s", "--skip", "3", steps=400)
    meta = read_bootstrap(run)[0]
    assert len(meta.windows) >= 2, meta.windows  # re-traced while the job ran
    assert all(w["last"] - w["first"] + 1 >= 2 for w in meta.windows)  # --monitor: >= 2 steps each
    rows = read_steps(run)[0]
    marks = {r.step: r.profiler for r in rows}
    traced = [s for s, m in marks.items() if m == PROFILER_TRACED]
    assert set(meta.traced_steps) <= set(traced) and len(traced) >= 2 * len(meta.traced_steps)
    assert PROFILER_WARMUP in marks.values() and PROFILER_EXPORT in marks.values()
    # the trace on disk is the last window's
    assert meta.traced_steps == list(range(meta.windows[-1]["first"], meta.windows[-1]["last"] + 1))
    assert len(d.ranks[0].steps) == len(meta.traced_steps)


def test_profile_out_naming_a_file_is_one_line_and_exit_2(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("keep me")
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(f), "--",
                           sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "not a folder" in proc.stderr
    assert "Traceback" not in proc.stderr and f.read_text() == "keep me"


def test_cpu_peak_is_measured_once_in_the_parent_for_all_ranks(tmp_path):
    """Ranks analysed in worker processes are judged against one CPU peak, resolved before
    the workers start."""
    calls = []
    from gpudiag.collectors.cpu_peak import cpu_peak

    def counted():
        calls.append(1)
        return cpu_peak()

    traces = tmp_path / "traces"
    traces.mkdir()
    src = REPO / "tests" / "fixtures"
    cpu = sorted(src.rglob("*cpu*.json*"))
    if not cpu:
        _, _, run = profile(tmp_path, "two", steps=40)
        cpu = [run / "traces" / "rank-0.json.gz"]
    for rank in range(2):
        (traces / f"rank-{rank}.json.gz").write_bytes(cpu[0].read_bytes())
    # the same trace twice needs distinct ranks: the loader takes rank from the file name
    d = diagnose(traces, DeviceChoice(cpu_peak=counted), jobs=2)
    assert len(calls) == 1
    assert d.device.kind == "cpu" and len(d.ranks) == 2


def test_an_input_bound_cpu_job_under_monitor_stays_input_bound(tmp_path):
    """On the CPU the profiler dilates the operators themselves; its extra time must come out of
    them (and the gaps), not out of the DataLoader wait: this job sleeps 4 ms per sample in a
    single-process DataLoader (seen: read memory-bound at 0.95 when the wait was cut instead)."""
    run = tmp_path / "run"
    workload = REPO / "benchmarks" / "workloads" / "input_bound.py"
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--monitor", "--out", str(run), "--",
                           sys.executable, str(workload), "--steps", "40"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    d = Diagnosis.from_json((run / "diagnosis.json").read_text())
    why = (d.verdict.summary, d.breakdown, d.unprofiled, d.dilation)
    assert d.verdict.label is Bottleneck.INPUT, why
    # XProf's "highly input-bound": at least 20% of the step waiting for input, in the view the
    # verdict describes (the unprofiled estimate; the traced steps where the machine's load
    # changed across the window). The CPU share itself moves with this shared machine's load, so
    # no tighter bound than the label's own.
    view = d.unprofiled if d.basis == "unprofiled-estimate" else d.breakdown
    # of the job's own step: less what other processes took of it (issue 38), as the verdict reads
    assert view.input_wait / (view.step_time - view.host_stalled) >= INPUT_HIGH, why
    if d.unprofiled is not None:  # the profiler's cost came out of the ops and gaps, not the wait
        # ...up to the untraced step's room for it: a CI clone's untraced steps ran 67.9 ms against
        # a traced wait of 68.9 ms (the job is all wait), and the wait is then the step's idle time
        kept = min(d.breakdown.input_wait, d.unprofiled.idle)
        assert d.unprofiled.input_wait == pytest.approx(kept, rel=1e-6), why



def test_an_extreme_dilation_lowers_the_confidence_and_says_why():
    """Traced steps slowed 5x or more are mostly the profiler: the real step's split is a model."""
    d = diagnose(shared_run("h100-gpt-small"), jobs=1)
    assert extreme_dilation(d.dilation.factor) == []  # 2x: no deduction
    [cost] = extreme_dilation(EXTREME_DILATION * 2)
    assert cost.amount == PENALTY_EXTREME_DILATION
    assert "estimated, not measured" in cost.reason and "10x" in cost.reason
    worse = with_deductions(d.verdict, [cost])
    assert worse.label is d.verdict.label
    assert worse.confidence == pytest.approx(d.verdict.confidence - PENALTY_EXTREME_DILATION, abs=0.01)


# ../shared/runs/README.md: the H200 GPT job alone runs 29.4 ms per step, 7.42 TFLOP analytic:
# MFU 25.5% of 989.4 TFLOP/s. Its steps after the window ran 34.9 ms against 28.4 ms before it.
H200_GPT_ANALYTIC_MFU = 7.42e12 / 29.4e-3 / 989.4e12


def test_h200_gpt_reference_leaves_out_the_steps_cupti_slowed_after_the_window():
    """CUPTI stayed attached after the window (torch's default): the steps after it are the
    observer's, so the reference is the steps before it, named, and the job's MFU comes out."""
    from reports.views import dilation_line

    d = diagnose(shared_run("h200-2026-11-27/gpt"), jobs=1)
    dil = d.dilation
    assert d.basis == "unprofiled-estimate" and dil.trusted
    assert dil.reference_steps == list(range(3, 11)) and dil.untraced_steps == 8
    assert dil.untraced_step_us == pytest.approx(dil.before_step_us)
    assert "steps 18-27" in dil.left_out and "CUPTI" in dil.left_out and "23% slower" in dil.left_out
    assert any("left out of the reference" in x.reason for x in d.verdict.deductions)
    assert "those after it left out" in dilation_line(dil) and "steps 3-10" in dilation_line(dil)
    assert abs(d.mfu.value / H200_GPT_ANALYTIC_MFU - 1) <= MFU_TOLERANCE, d.mfu.value
    again = type(d).from_json(d.to_json())  # the new fields survive the JSON round trip
    assert again.dilation.reference_steps == dil.reference_steps and again.dilation.left_out


def test_h100_runs_keep_both_sides_or_their_fallback():
    """The H100 GPT's sides agree (both used); the H100 ResNet's after side was slower only for
    a while (steps 28-40 back at the job's pace): not the observer's, so its fallback stands."""
    gpt = diagnose(shared_run("h100-gpt-small"), jobs=1).dilation
    assert gpt.left_out is None and gpt.reference_steps == [*range(3, 11), *range(18, 28)]
    res = diagnose(shared_run("h100-resnet18-dl8"), jobs=1).dilation
    assert res.left_out is None and not res.trusted
