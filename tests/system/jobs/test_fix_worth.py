"""What each fix is worth, where the held-out zoo's second set found applying the fix
contradicting the prediction (benchmarks/zoo/results/held-out-2-2026-11-29.md, items 1, 4, 5, 11),
each on a real CPU job under ``gpudiag profile``:

- a per-sample Python loop in the loss: ``torch.compile(model)`` was credited with the loop's
  calls (predicted -30..-91%, measured 0.92-1.37x slower); it does not reach the loop, and
  vectorising it is the fix, with its own prediction;
- gradient accumulation over many tiny micro-batches: the fix one knob away (larger
  micro-batches, fewer accumulation steps) was named nowhere;
- a periodic checkpoint's prediction started from the median step (which holds no save) and
  said "every 4.5 steps" of a save every 4.

What is checked is what the trace must give (counts, frames, which fix is listed), not a
wall-clock ratio: that is ``benchmarks/zoo``'s, with the job's own timer.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analyzers.step_loops import LOOP_MIN_REPS
from gpudiag.diagnosis import Diagnosis, Recommendation
from gpudiag.steps import window_steps
from tests.paths import TESTS

JOBS = TESTS / "jobs"
BATCH = 64  # samples per optimizer step: the loss loop's iterations


def profile(tmp: Path, job: str, *args: str) -> tuple[Diagnosis, dict]:
    run, own = tmp / "run", tmp / "own.json"
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--skip", "8",
                           "--", sys.executable, str(JOBS / job), *args, "--report", str(own)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Diagnosis.from_json((run / "diagnosis.json").read_text()), json.loads(own.read_text())


def given(d: Diagnosis) -> dict[str, Recommendation]:
    """Every fix listed, as one to do or as one that would not help."""
    return {r.action: r for r in [*d.verdict.recommendations, *d.verdict.not_advised]}


def compile_calls(rec: Recommendation) -> int:
    m = re.search(r"the (\d+) operator calls per step torch.compile would replace", rec.why)
    assert m, rec.why
    return int(m.group(1))


def test_a_loss_loop_over_samples_is_not_credited_to_compile_and_vectorising_it_is_predicted(tmp_path):
    """A hinge loss written as a loop over the batch's 64 rows (9 calls an iteration forward and
    backward): compile's prediction counts only the model's calls (fewer than the loop's
    iterations, let alone its calls) and says the loop keeps its time; the loop is named with its
    iteration count and its own fix, predicted faster than compile's."""
    d, own = profile(tmp_path, "loops_job.py", "--loss", "loop", "--batch", str(BATCH))
    assert own["loss_iterations"] == BATCH
    fixes = given(d)
    vec = fixes["vectorise-sample-loop"]
    assert vec in d.verdict.recommendations, vec
    assert f"runs {BATCH} iterations per step" in vec.text, vec.text
    assert vec.gain is not None and vec.gain > 0 and "assumes" in vec.why, vec
    # priced from the loop's own time in the trace, not the step's average per call
    m = re.search(r"the loop's (\d+) iterations, (\d+)% of the traced step", vec.why)
    assert m and int(m.group(1)) == BATCH and 0 < int(m.group(2)) <= 100, vec.why
    comp = fixes.get("compile-small-ops") or fixes.get("fuse-memory-bound")
    if comp is not None and comp.why:
        assert compile_calls(comp) < BATCH, comp.why
        assert "Python loop over samples keep theirs" in comp.why, comp.why
        assert comp.gain is None or comp.gain < vec.gain, (comp, vec)


def test_a_model_called_once_per_sample_is_named_and_compiles_graph_per_call_is_stated(tmp_path):
    """The model called on one row at a time, 64 times a step (blind set 10's per-sample
    encoder: compile promised 0.69x for 2 graphs a step; the encoder compiled alone ran 1.39x
    slower, a graph call per sample). The loop is named with its count, and compile's prediction
    says it assumes the loop compiled with the layers, and states the step with the module
    compiled alone: slower than with the loop compiled, by the graph calls it adds."""
    d, own = profile(tmp_path, "loops_job.py", "--per-sample", "--batch", str(BATCH))
    assert own["model_calls"] == BATCH
    comp = given(d)["compile-small-ops"]
    assert (f"torch.compile (the function or module that holds the loop calling the same layers "
            f"{BATCH} times a step, not the module it calls)" in comp.text), comp.text
    m = re.search(r"compiled alone is a graph call per iteration, and the step ≈ ([\d.]+) (us|ms) "
                  r"\(([\d.]+)x\)", comp.why)
    assert m and comp.gain is not None, comp.why
    # the step compiled alone pays 2 x 64 graph calls more than the loop compiled with the model:
    # slower than that prediction beyond the ratio's rounding to two digits (how much slower is
    # the graph calls' cost against this machine's step: a CI run printed 1.04x where 0.05 over the
    # prediction asked 1.04, and failed on the rounding)
    assert float(m.group(3)) > 1 - comp.gain + 0.01, (m.group(0), comp.gain)
    assert "vectorise-sample-loop" not in given(d), list(given(d))  # a model, not a loss loop


def test_a_loss_written_over_the_batch_is_not_told_to_vectorise(tmp_path):
    """The same job with its loss as one batch expression: no loop over samples, no such fix."""
    d, _ = profile(tmp_path, "loops_job.py", "--loss", "batch", "--batch", str(BATCH))
    fixes = given(d)
    assert "vectorise-sample-loop" not in fixes and "larger-micro-batches" not in fixes, list(fixes)


def test_many_small_micro_batches_per_optimizer_step_are_told_to_grow_with_a_prediction(tmp_path):
    """Gradient accumulation of 16 micro-batches of 4: the trace's 16 backward passes per
    optimizer step are named, the fix is larger micro-batches and fewer accumulation steps, and
    its prediction splits each pass's fixed cost from the per-sample work."""
    d, own = profile(tmp_path, "loops_job.py", "--loss", "batch", "--batch", str(BATCH), "--micro", "4")
    n = own["micro_batches"]
    assert n == BATCH // 4 and n >= LOOP_MIN_REPS
    rec = given(d)["larger-micro-batches"]
    assert rec in d.verdict.recommendations, rec
    assert f"runs {n} forward/backward passes" in rec.text, rec.text
    assert "fixed cost of each pass" in rec.why and "per-sample work" in rec.why, rec.why
    assert rec.gain is not None and 0 < rec.gain < 1, rec
    # torch.compile(model) runs a forward and a backward graph per pass, not per step (blind
    # set 9's 40 micro-batches: told 0.77x with 2 graphs a step, measured 1.39x slower)
    compiled = given(d)["compile-small-ops"]
    assert f"in {2 * n} graphs" in compiled.why, compiled.why


def test_a_periodic_save_is_predicted_on_the_mean_step_with_its_real_period(tmp_path):
    """A save every 4 steps: the advice says "every 4 steps" (the gap between saves, not the
    rows over the saves), and its prediction starts from the mean step, saves included, which
    the verdict's median step is shorter than."""
    d, own = profile(tmp_path, "save_job.py", "--steps", "40", "--every", "4",
                     "--out", str(tmp_path / "ckpt.pt"))
    assert len(own["save_seconds"]) == 10
    import statistics

    rec = given(d)["checkpoint-less-often"]
    assert "every 4 steps" in rec.text and "every 8 steps" in rec.why, (rec.text, rec.why)
    # the job's own median step holds no save (3 steps in 4 do not save): the mean is longer.
    # Judged by the job's own timer over the steps the prediction reads (the untraced ones just
    # around the trace window, ``steps.window_steps``): over all the steps after the skip, the
    # traced ones and the export in them, a CI clone read a 53.9 ms median against the
    # prediction's 52.6 ms mean, and over every untraced step one beside a busy helper read 39.39
    # against 39.38 ms
    w = window_steps(tmp_path / "run")[0]
    rows = [*w.before_rows, *w.after_rows]
    around = [own["step_seconds"][r.step - 1] for r in rows]
    timed = [r.dt + r.machine_s for r in rows]   # gpudiag's step timer, by wall clock
    assert len(around) >= 8, around
    for steps, whose in ((around, "the job's own timer"), (timed, "gpudiag's step timer")):
        if statistics.mean(steps) <= 1.02 * statistics.median(steps):
            # the premise failed, not gpudiag: a CI clone's busy lanes ran this job's untraced
            # steps from 12.8 to 69.8 ms, the saves within that noise (mean 33.7 against a 34.7 ms
            # median)
            pytest.skip(f"{whose} over the steps around the window: mean {statistics.mean(steps) * 1e3:.3g} "
                        f"ms, median {statistics.median(steps) * 1e3:.3g} ms: its saves are within this "
                        "machine's noise")
    # and the prediction starts from the mean of those steps, saves included, not their median.
    # Held to gpudiag's own timer over the same steps: its steps end where the job's do not, and
    # beside a CI clone's lanes (steps 24-94 ms) the mean of one (56.8 ms) fell under the median of
    # the other (57.8 ms) though each timer's mean was over its own median. (The verdict's median
    # step is no yardstick: with 40 steps there is no untraced view, and the traced steps carry
    # the profiler: a CI clone run read a 24.2 ms traced median against a 20.7 ms mean of the
    # untraced steps, whose own median was about 13 ms.)
    assert rec.step_s == pytest.approx(statistics.fmean(timed)), (rec.step_s, timed)
    assert rec.step_s > statistics.median(timed), (rec.step_s, timed)
    assert "mean step" in rec.why, rec.why
