"""A rank that waited in a collective for a crowded peer is excused the peer's crowding."""

from __future__ import annotations

import pytest

from gpudiag.pace import peers_crowded
from gpudiag.rundir import StepRow


def row(step: int, dt: float, machine: float, exposed: float, run: float) -> StepRow:
    """A step row at its own pace: ``dt`` the own step, ``machine`` other processes' part."""
    return StepRow(step=step, t=100.0 + step, dt=dt, machine_s=machine, run_s=run, wait_s=0.001,
                   collectives={"all_reduce": {"count": 1, "seconds": exposed, "exposed": exposed}})


def test_the_uncrowded_rank_is_excused_what_other_processes_took_of_the_peer_it_waited_for():
    """Rank 1 waited 15 ms for a core (other processes'), rank 0 none but 22 ms in the
    all-reduce, waiting for rank 1: both steps at the job's own pace lose the 15 ms."""
    out = peers_crowded({0: [row(5, 0.040, 0.0, 0.022, 0.020)], 1: [row(5, 0.028, 0.015, 0.005, 0.021)]})
    assert out[0][0].dt == pytest.approx(0.025) and out[0][0].machine_s == pytest.approx(0.015)
    assert out[0][0].dt + out[0][0].machine_s == pytest.approx(0.040)  # the wall clock kept
    assert out[1][0] == row(5, 0.028, 0.015, 0.005, 0.021)  # the crowded rank as it was


def test_only_the_wait_in_collectives_is_excused_and_never_below_the_ranks_time_on_a_core():
    """Rank 0 waited 4 ms in the all-reduce: only those go, however long the peer's crowding; a
    rank whose time on a core is longer than the rest keeps that."""
    out = peers_crowded({0: [row(5, 0.040, 0.0, 0.004, 0.020), row(6, 0.040, 0.0, 0.030, 0.035)],
                         1: [row(5, 0.028, 0.015, 0.005, 0.021), row(6, 0.028, 0.015, 0.005, 0.021)]})
    assert out[0][0].dt == pytest.approx(0.036)
    assert out[0][1].dt == pytest.approx(0.035)


def test_a_rank_without_collectives_or_alone_is_not_excused_anything():
    """No collective in the step: it met no one; one rank: no peer."""
    quiet = StepRow(step=5, t=105.0, dt=0.040, run_s=0.02, wait_s=0.0)
    out = peers_crowded({0: [quiet], 1: [row(5, 0.028, 0.015, 0.005, 0.021)]})
    assert out[0][0] == quiet
    alone = {0: [row(5, 0.040, 0.0, 0.022, 0.020)]}
    assert peers_crowded(alone) == alone


def test_a_collectives_entry_a_hostile_file_made_counts_no_wait():
    """A step file the job writes may hold anything: an entry that is not a mapping, or a wait
    that is not a number, counts nothing instead of failing the analysis."""
    bad = StepRow(step=5, t=105.0, dt=0.040, run_s=0.02, wait_s=0.0,
                  collectives={"all_reduce": 3, "broadcast": {"exposed": "x"}})
    out = peers_crowded({0: [bad], 1: [row(5, 0.028, 0.015, 0.005, 0.021)]})
    assert out[0][0] == bad
