"""The verdict and MFU of a job as it runs unprofiled: the same whichever way it is profiled.

The profiler slows the steps it traces (on the CPU and on a GPU's host side); the step timer
sees every step. These tests hold the unprofiled estimate against the truth: recorded H100
runs with their known answer, and real CPU jobs that time themselves and know their FLOPs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analyzers.classify import EXTREME_DILATION, INPUT_HIGH, account_for_dilation
from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
from gpudiag.diagnosis import Bottleneck, Diagnosis
from gpudiag.rundir import PROFILER_EXPORT, PROFILER_TRACED, PROFILER_WARMUP, read_bootstrap, read_steps
from tests.conftest import REPO, SHARED

RUNS = SHARED / "runs"
JOB = Path(__file__).parent / "jobs" / "small_ops_job.py"
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


def test_h100_resnet_reads_memory_bound_and_says_its_untraced_steps_are_unsteady():
    d = diagnose(shared_run("h100-resnet18-dl8"), jobs=1)
    assert d.verdict.label is Bottleneck.MEMORY, d.verdict.summary
    assert d.mfu.step_time_basis == "untraced steps"
    assert any("vary a lot" in c for c in d.dilation.caveats)


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


def profile(tmp: Path, name: str, *opts: str, steps: int = 90) -> tuple[Diagnosis, dict, Path]:
    run, own = tmp / name, tmp / f"{name}-own.json"
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), *opts, "--",
                           sys.executable, str(JOB), "--steps", str(steps), "--report", str(own)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return Diagnosis.from_json((run / "diagnosis.json").read_text()), json.loads(own.read_text()), run


def analytic_mfu(d: Diagnosis, own: dict, run: Path) -> float:
    """The job's analytic FLOPs over the median of its own timings of the steps that ran with
    the profiler off, at the peak the diagnosis used. The same steps as gpudiag's reference: on
    a shared 2-core machine a job's step time is bimodal under load, and a median over another
    set of steps can land in the other mode."""
    off = {r.step for r in read_steps(run)[0] if r.profiler is None and r.step > 2}
    times = [t for i, t in enumerate(own["step_seconds"]) if i + 1 in off]
    return own["flops_per_step"] / statistics.median(times) / d.mfu.peak_flops


def test_many_small_ops_job_gets_one_label_and_mfu_however_it_is_profiled(tmp_path):
    """Defaults, another --skip and --monitor: the profiler dilates the traced steps of this
    job most (hundreds of tiny ops per step), yet label and MFU agree, and MFU is within 10% of
    the job's analytic MFU."""
    runs = {name: profile(tmp_path, name, *opts) for name, opts in
            (("defaults", ()), ("skip25", ("--skip", "25")), ("monitor", ("--monitor",)))}
    labels = {name: d.verdict.label for name, (d, _, _) in runs.items()}
    assert len(set(labels.values())) == 1, labels
    ratios = {}
    for name, (d, own, run) in runs.items():
        assert d.basis == "unprofiled-estimate" and d.mfu.step_time_basis == "untraced steps"
        assert d.dilation.factor > 1.1, (name, d.dilation)  # dilation is real here...
        truth = analytic_mfu(d, own, run)
        ratios[name] = d.mfu.value / truth
    # ...yet each run's MFU is within 10% of that run's analytic MFU, and the runs agree with one
    # another as closely. Each run is held to its own truth: on a shared machine the job's real
    # speed (and the CPU peak measured per session) moves with the load, the tool must follow it.
    assert all(abs(r - 1) <= MFU_TOLERANCE for r in ratios.values()), ratios
    assert max(ratios.values()) / min(ratios.values()) - 1 <= MFU_TOLERANCE, ratios


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
    assert d.basis == "unprofiled-estimate"
    why = (d.verdict.summary, d.breakdown, d.unprofiled, d.dilation)
    assert d.verdict.label is Bottleneck.INPUT, why
    # XProf's "highly input-bound": at least 20% of the step waiting for input (the CPU share
    # itself moves with this shared machine's load, so no tighter bound than the label's own)
    assert d.unprofiled.input_wait / d.unprofiled.step_time >= INPUT_HIGH, why



def test_an_extreme_dilation_lowers_the_confidence_and_says_why():
    """Traced steps slowed 5x or more are mostly the profiler: the real step's split is a model."""
    d = diagnose(shared_run("h100-gpt-small"), jobs=1)
    v = d.verdict
    assert account_for_dilation(v, d.dilation.factor) == v  # 1.6x: left alone
    worse = account_for_dilation(v, EXTREME_DILATION * 2)
    assert worse.label is v.label and worse.confidence < v.confidence
    assert "estimated, not measured" in worse.summary and "10x" in worse.summary
