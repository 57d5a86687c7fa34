"""Communication's share of a busy CPU step, by the wall clock (``TimeBreakdown.comm_stalled``).

A 2-rank gloo job whose all-reduce is ~92% of its step read host-bound beside the test suite
(three clean-clone CI runs in a row, 2026-12-02): the own pace took other processes' part out of
the exposed all-reduce (``own_pace.charge``, 28.7 -> 11.4 ms of a 31.2 ms step), the share put
that own-pace wait over the wall step (36%), and the job's 1 ms of Python filled the rest (62%).
The part the own pace took out of the wait is now kept apart and counted back: the share and the
fix that removes the wait read it by the wall clock, as they already did the collectives' copies.
"""

from __future__ import annotations

import pytest

from gpudiag.analyzers.classify import shares
from gpudiag.analyzers.comm_cost import cost
from gpudiag.analyzers.own_pace import charge, with_machine, without_machine
from gpudiag.diagnosis import Bottleneck, TimeBreakdown

# the traced step by the wall clock: the all-reduce 28.7 ms, Python 2.5 ms, a 31.2 ms step
WALL = TimeBreakdown(step_time=31.2e3, gpu_busy=28.7e3, comm_total=28.7e3, comm_exposed=28.7e3,
                     idle=2.5e3, host_overhead=2.5e3)


def test_an_all_reduce_that_is_most_of_a_busy_step_reads_communication_bound():
    busy = charge(WALL, "cpu", machine_us=18.8e3)   # other processes took 60% of the step
    assert busy.own_step == pytest.approx(12.4e3)
    assert busy.comm_exposed + busy.comm_stalled == pytest.approx(28.7e3)   # nothing lost
    s = shares(busy)
    assert s[Bottleneck.COMMUNICATION] == pytest.approx(28.7 / 31.2)
    assert s[Bottleneck.HOST] == pytest.approx(1 - 28.7 / 31.2)
    assert max(s, key=s.get) is Bottleneck.COMMUNICATION
    # its fix removes the wait by the wall clock, as the share reads it
    assert cost(busy) == pytest.approx(28.7e3)
    # at the job's own pace the machine's part is gone, the wait's share of it too
    own = without_machine(busy)
    assert own.comm_stalled == 0 and cost(own) == pytest.approx(busy.comm_exposed)


def test_the_estimates_machine_part_is_spread_over_a_cpu_steps_parts_as_a_traced_steps_is():
    own = TimeBreakdown(step_time=12.4e3, gpu_busy=11.4e3, comm_total=11.4e3, comm_exposed=11.4e3,
                        idle=1e3, host_overhead=1e3)
    cpu = with_machine(own, 18.8e3, "cpu")
    assert cpu.comm_stalled == pytest.approx(18.8e3 * 11.4 / 12.4)
    assert shares(cpu)[Bottleneck.COMMUNICATION] == pytest.approx((11.4 + 18.8 * 11.4 / 12.4) / 31.2)
    # a GPU's collectives run on the device: other processes on the cores do not lengthen them
    assert with_machine(own, 18.8e3, "gpu").comm_stalled == 0


def test_overlapping_names_the_frame_of_its_exposed_figure_beside_the_wall_clocks():
    """The same busy step: all-reduce-less-often quotes the exposed wait by the wall clock (28.7
    ms), so overlap-communication's 'exposed communication' at the job's own pace (about 10 ms)
    says which it is and gives the wall clock's beside it; a quiet step's text is as before."""
    from gpudiag.analyzers.whatif import communication_overlapped
    busy = charge(WALL, "cpu", machine_us=18.8e3)
    why = communication_overlapped(busy, cpu=True).why
    assert "at the job's own pace; 28.7 ms by the wall clock" in why, why
    assert "own pace" not in communication_overlapped(WALL, cpu=True).why
