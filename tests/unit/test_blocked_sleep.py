"""The training thread's sleep in a blocking call is read beyond the short sleeps of a parallel
region's end (``analyzers.host_wait.blocked_s``), hand-worked on rows with the figures the
2-core AMD EPYC VM measured (``SHORT_SLEEP_S``), and the step timer's count of wake-ups is read
back from the steps file (``rundir.read_steps``)."""

from __future__ import annotations

import json

import pytest

from gpudiag.analyzers.host_wait import SHORT_SLEEP_S, asleep_s, blocked_s
from gpudiag.rundir import StepRow, read_steps


def row(dt_ms: float, run_ms: float, slices: int | None, **kw: float) -> StepRow:
    return StepRow(step=5, t=0.0, dt=dt_ms / 1e3, run_s=run_ms / 1e3, wait_s=0.0, slices=slices, **kw)


def test_many_short_sleeps_at_parallel_regions_ends_are_no_blocking_call():
    r = row(5.24, 4.22, 24)             # the MLP: 1.02 ms asleep over 24 wake-ups
    assert asleep_s(r) == pytest.approx(1.02e-3)
    assert blocked_s(r) == 0.0          # 24 x 50 us covers it


def test_one_long_sleep_is_a_blocking_call_less_its_wake_up():
    r = row(12.82, 7.6, 1)              # a reply awaited in recv
    assert blocked_s(r) == pytest.approx(5.22e-3 - SHORT_SLEEP_S)


def test_a_crowded_peers_wait_is_left_out_of_the_sleep():
    # 3 ms asleep; the slowest peer waited 2 ms for a core and ran 2 ms, less than the training
    # thread's 7 (quiet, its run sits beside the training thread's): the sleep waited for its
    # whole 2 ms wait (``pace.peer_part``); 10 wake-ups take 0.5 ms
    r = row(10.0, 7.0, 10, peer_wait_s=2e-3, peer_run_s=2e-3)
    assert blocked_s(r) == pytest.approx(0.5e-3)


def test_a_run_recorded_before_the_count_keeps_its_whole_sleep():
    r = row(12.0, 7.0, None)
    assert blocked_s(r) == asleep_s(r) == pytest.approx(5e-3)


def test_the_wake_up_count_is_read_back_and_a_hostile_one_dropped(tmp_path):
    samples = tmp_path / "samples"
    samples.mkdir()
    rows = [{"step": 1, "t": 1.0, "dt": 0.01, "run_s": 0.005, "wait_s": 0.0, "slices": 7},
            {"step": 2, "t": 2.0, "dt": 0.01, "run_s": 0.005, "wait_s": 0.0, "slices": -3},
            {"step": 3, "t": 3.0, "dt": 0.01, "run_s": 0.005, "wait_s": 0.0, "slices": True},
            {"step": 4, "t": 4.0, "dt": 0.01, "run_s": 0.005, "wait_s": 0.0, "slices": "9"}]
    (samples / "steps-rank-0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = read_steps(tmp_path)[0]
    assert [r.slices for r in got] == [7, None, None, None]


def test_passive_intra_op_threads_are_read_from_the_bootstrap_and_a_hostile_policy_ignored():
    from gpudiag.analyzers.host_wait import passive_threads
    from gpudiag.rundir import BootstrapMeta

    def meta(policy: object, threads: object) -> dict[int, BootstrapMeta]:
        return {0: BootstrapMeta(rank=0, omp_wait_policy=policy, intra_op_threads=threads)}  # type: ignore[arg-type]

    assert passive_threads(meta("passive ", 2)) == 2
    assert passive_threads(meta("PASSIVE", 1)) is None      # one thread: no peer to wait for
    assert passive_threads(meta("ACTIVE", 2)) is None
    assert passive_threads(meta(None, 2)) is None           # unset: libgomp spins first
    assert passive_threads(meta(["PASSIVE"], 2)) is None    # a hostile file's value
    assert passive_threads(meta("PASSIVE", "2")) is None
    assert passive_threads(None) is None
