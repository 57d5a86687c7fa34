"""The diagnosis of three real H200 runs against the truth measured beside them.

The runs (``../shared/runs/h200-2026-11-27``, read in place; their truth in
``../shared/runs/README.md``) were recorded by ``gpudiag profile`` at its defaults on an NVIDIA
H200 with 16 host cores: a GPT-style LM, and a ResNet-50 fed by a DataLoader with 0 and with 14
workers. What each test holds is the README's truth, with the margin the issue asks for.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from gpudiag.analyzers.diagnose import diagnose
from gpudiag.diagnosis import Bottleneck, Diagnosis
from tests.conftest import SHARED, labels_of

RUNS = SHARED / "runs" / "h200-2026-11-27"
pytestmark = pytest.mark.skipif(not RUNS.is_dir(), reason=f"the H200 recordings are not at {RUNS}")

# ../shared/runs/README.md: the LM's analytic FLOPs per step (printed in its job.log) and its
# step alone; MFU at the H200's bf16 peak
GPT_FLOPS = 7.42e12
GPT_ALONE_S = 29.4e-3
BF16_PEAK = 989.4e12
GPT_MFU = GPT_FLOPS / GPT_ALONE_S / BF16_PEAK  # 25.5%
MFU_TOLERANCE = 0.10  # the issue's: within 10% of analytic
# the same ResNet-50 with num_workers=14 ran 40-58 ms per step in three runs that hour; the
# issue holds the prediction to 25% of the applied fix, taken at the middle of that range
RESNET_W14_S = 48e-3
RESNET_W14_RANGE_S = (40e-3, 58e-3)
PREDICTION_TOLERANCE = 0.25


@pytest.fixture(scope="module")
def runs() -> dict[str, Diagnosis]:
    return {name: diagnose(RUNS / name, jobs=1) for name in ("gpt", "resnet_w0", "resnet_w14")}


def test_the_lm_reads_memory_bound_as_its_truth_says(runs) -> None:
    """The GPU is busy most of the LM's real step, most of it in kernels below the ridge point
    (layer norms, GELU, softmax backward, the fused AdamW): memory-bound, or a stated tie with
    it; never host-bound, which the profiled steps alone read (56% host gaps)."""
    v = runs["gpt"].verdict
    assert Bottleneck.MEMORY in labels_of(v), v.summary
    assert v.label is not Bottleneck.HOST, v.summary


def test_the_lms_mfu_counts_the_analytic_flops(runs) -> None:
    """The FLOPs gpudiag counts from the recorded shapes are the analytic ones (7.42 TFLOP per
    step): where its MFU misses the truth, the step it divides by is why, not the FLOPs."""
    assert runs["gpt"].mfu.flops_per_step == pytest.approx(GPT_FLOPS, rel=0.01)


def test_the_lms_mfu_is_within_ten_percent_of_analytic(runs) -> None:
    """The reference leaves out the steps after the window that CUPTI, left attached, slowed
    (34.9 ms against 28.4 ms before it); keeping them read 33.5 ms and an MFU of 22.4%, 12% under
    the truth (25.5% at 29.4 ms alone)."""
    mfu = runs["gpt"].mfu.value
    assert mfu is not None and abs(mfu / GPT_MFU - 1) <= MFU_TOLERANCE, runs["gpt"].mfu.reason


def test_workers_for_the_augmenting_loader_are_predicted_within_25_percent_of_the_fix(runs) -> None:
    """num_workers=0: the process burnt 14 cores (its 16 intra-op threads spinning) while the
    main thread made each batch in ~0.46 s. Counted as CPU seconds, that is 7 s per step and the
    workers could not bring the 500 ms step under 459 ms (main before this change); counted as
    the loading thread's time, 15 cores make a batch per ~33 ms and the rest of the step (the
    GPU's work and its launches) bounds it. The fix applied (14 workers) ran 40-58 ms."""
    d = runs["resnet_w0"]
    assert d.verdict.label is Bottleneck.INPUT
    rec = next(r for r in d.verdict.recommendations if r.action == "dataloader-workers")
    assert rec.predicted_step_s is not None, rec.why
    ratio = rec.predicted_step_s / RESNET_W14_S
    assert 1 - PREDICTION_TOLERANCE <= ratio <= 1 + PREDICTION_TOLERANCE, (
        f"predicted {rec.predicted_step_s * 1e3:.1f} ms against {RESNET_W14_S * 1e3:.0f} ms measured "
        f"(range {RESNET_W14_RANGE_S[0] * 1e3:.0f}-{RESNET_W14_RANGE_S[1] * 1e3:.0f} ms): {rec.why}")
    assert "at least 1" in rec.text  # ten or more workers, not "2" (main: from CPU seconds)


def test_the_loaders_own_operators_carry_their_share_of_the_profilers_cost(runs) -> None:
    """With num_workers=0 the loader's operators are recorded inside the input wait (18,255 of
    21,887 events per step), so the profiler's extra time lands there too: the unprofiled view
    keeps host gaps for the job's launches instead of none (main: 5.8e-14 ms, the rest taken
    from the wait as a repair)."""
    u = runs["resnet_w0"].unprofiled
    assert u is not None
    assert 10e3 <= u.host_overhead <= 40e3
    assert any("DataLoader ran in the training process" in c for c in runs["resnet_w0"].dilation.caveats)


def test_fourteen_workers_leave_the_host_side_limiting_the_step(runs) -> None:
    """resnet_w14: the GPU busy ~16 ms of a 38-55 ms step and no input wait: the host side
    limits it (14 workers and the main process on 16 cores), not the DataLoader nor the GPU."""
    d = runs["resnet_w14"]
    v = d.verdict
    assert v.label is Bottleneck.HOST, v.summary
    view = d.unprofiled if d.unprofiled is not None else d.breakdown
    assert view.input_wait / view.step_time < 0.05
    assert view.compute / view.step_time < 0.5
    assert "dataloader-workers" not in [r.action for r in v.recommendations]


def _with_slower_after_steps(src: Path, dest: Path, factor: float) -> Path:
    """A copy of a run directory whose untraced steps after the traced window ran ``factor``
    times as long (the job's step timer only): the run of the LM that fell back to its traced
    view had them 36% slower than before the window, where this recording has 23%."""
    shutil.copytree(src, dest)
    steps = dest / "samples" / "steps-rank-0.jsonl"
    steps.chmod(0o644)
    rows = [json.loads(line) for line in steps.read_text().splitlines() if line.strip()]
    last = max(r["step"] for r in rows if r.get("profiler"))
    for r in rows:
        if r["step"] > last and not r.get("profiler"):
            r["dt"] *= factor
    steps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dest


def test_the_lm_whose_steps_after_the_window_ran_slower_does_not_read_host_bound(tmp_path) -> None:
    """One job, one label: the run of the LM whose steps after the window ran 36% slower than
    before it (the profiler's after-effect) read host-bound 0.27 from its traced steps, where the
    three others read memory-bound. Whatever view it gets, its label is memory-bound or a stated
    tie with it: even the slower side of the steps around the window proves ~20 ms of the 56 ms
    traced step the profiler's, and without it the traced steps read memory-bound."""
    rows = [json.loads(line) for line in (RUNS / "gpt" / "samples" / "steps-rank-0.jsonl").open()]
    before = statistics.median(r["dt"] for r in rows if 2 < r["step"] < 11)
    after = statistics.median(r["dt"] for r in rows if 17 < r["step"] <= 27)
    run = _with_slower_after_steps(RUNS / "gpt", tmp_path / "gpt", 1.36 * before / after)
    d = diagnose(run, jobs=1)
    assert Bottleneck.MEMORY in labels_of(d.verdict), d.verdict.summary
