"""OpenMP's passive wait policy named and costed (``analyzers.omp_wait``): the blind check of
2026-12-02 ran a 2-thread MLP 1.6x slower under ``OMP_WAIT_POLICY=PASSIVE`` than with the policy
unset and nothing said so. The advice reads the training thread's sleep and wake-ups per step
(``HostWait.untraced_asleep_us``, ``untraced_slices``), only for a job with more than one
intra-op thread under the policy, and only where each thread would have a core to spin on."""

from __future__ import annotations

import dataclasses

import pytest

from gpudiag.analyzers import omp_wait
from gpudiag.analyzers.advice import recommend
from gpudiag.diagnosis import Bottleneck, HostWait, JobTraits
from tests.unit.test_advice_rules import breakdown, inputs

STEP = 22.8e3


def passive(asleep_us: float = 9.1e3, slices: float = 220.0, threads: int | None = 2,
            other_cores: float = 0.1, gpu: bool = False):
    w = HostWait(recorded=True, note="test", passive_threads=threads, untraced_asleep_us=asleep_us,
                 untraced_slices=slices)
    traits = JobTraits(training=True, optimizer=True, cores_used=1.4, cpus=2, intra_op_threads=2,
                       other_cores=other_cores)
    a = dataclasses.replace(inputs(breakdown(STEP, compute_bound=15e3, memory_bound=5e3),
                                   traits=traits, label=Bottleneck.COMPUTE), host_wait=w)
    return dataclasses.replace(a, device_kind="gpu") if gpu else a


def by_action(a):
    out = recommend(a)
    return ({r.action: r for r in out.advised}, {r.action: r for r in out.not_advised})


def test_a_passive_jobs_wake_ups_are_named_with_the_step_they_would_give_back():
    advised, _ = by_action(passive())
    rec = advised["omp-wait-policy"]
    assert "OMP_WAIT_POLICY=PASSIVE" in rec.text and "Unset OMP_WAIT_POLICY" in rec.text, rec.text
    assert "woken 220 times a step" in rec.text
    lo, hi = (min(220 * c, omp_wait.MOST * STEP) for c in omp_wait.WAKE_US)
    assert rec.predicted_step_s == pytest.approx((STEP - lo) * 1e-6)
    assert rec.best_step_s == pytest.approx((STEP - hi) * 1e-6) and hi == omp_wait.MOST * STEP


@pytest.mark.parametrize("case", ["one thread or not passive", "few wake-ups", "on a GPU",
                                  "clocks not read"])
def test_no_passive_policy_advice_where_the_threads_do_not_sleep_for_each_other(case):
    a = {"one thread or not passive": passive(threads=None),
         "few wake-ups": passive(slices=10),
         "on a GPU": passive(gpu=True),
         "clocks not read": passive(slices=None)}[case]   # type: ignore[arg-type]
    advised, refused = by_action(a)
    assert "omp-wait-policy" not in advised and "omp-wait-policy" not in refused


def test_spinning_is_not_advised_where_other_processes_leave_no_core_per_thread():
    """Beside a busy loop on a 2-core machine a spinning thread takes the core its peer needs."""
    advised, refused = by_action(passive(other_cores=1.0))
    assert "omp-wait-policy" not in advised
    why = refused["omp-wait-policy"].why
    assert why.startswith("would not help: spinning threads hold their cores") and "2 cores" in why, why
