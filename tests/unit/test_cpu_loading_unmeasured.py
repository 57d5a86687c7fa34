"""Workers for a loader that is CPU work are not predicted without the cores to run them on.

A real recording (``tests/fixtures/cpu-augment-loader``): the batch is made on the training
thread (the loader's own timing: on a core 99% of its wait), but the run was too short for the
host sampler to measure the cores the machine left the job. gpudiag predicted "at least 7
workers, -86%" as if the cores were free; applied alone, 7 workers ran 1.03x (no gain)."""

from __future__ import annotations

import shutil

import pytest

from gpudiag.analyzers.diagnose import diagnose
from gpudiag.diagnosis import Bottleneck, Diagnosis
from tests.paths import TESTS

FIXTURE = TESTS / "fixtures" / "cpu-augment-loader"


@pytest.fixture(scope="module")
def augmenting(tmp_path_factory: pytest.TempPathFactory) -> Diagnosis:
    copy = tmp_path_factory.mktemp("aug") / "run"
    shutil.copytree(FIXTURE, copy)
    return diagnose(copy, jobs=1)


def test_workers_for_cpu_loading_get_no_step_where_the_cores_were_not_measured(augmenting):
    d = augmenting
    assert d.verdict.label is Bottleneck.INPUT, d.verdict.summary
    assert d.traits.loader_busy is not None and d.traits.loader_busy >= 0.9
    assert d.traits.cores_used is None   # the premise: the host sampler did not measure the job
    rec = next(r for r in d.verdict.recommendations if r.action == "dataloader-workers")
    assert rec.predicted_step_s is None, rec
    assert "not measured" in rec.why and "CPU work" in rec.why, rec.why
    assert "at least" not in rec.text   # no worker count from a bound it could not compute


def test_cpu_loading_known_from_the_loaders_own_timing_is_told_to_make_batches_cheaper(augmenting):
    actions = [r.action for r in augmenting.verdict.recommendations]
    assert "cheaper-input" in actions, actions


def test_a_cpu_jobs_input_wait_is_not_called_idle_cpu(augmenting):
    """The CPU made the batches: what waited was the model, not the CPU."""
    assert "CPU is idle" not in augmenting.verdict.summary
    assert "no model operator running" in augmenting.verdict.summary
