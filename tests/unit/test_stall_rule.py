"""The pure parts of the stall watch, on numbers whose answer is known: the stall rule (limits,
phases, patterns), the black box's format round trip, the agent's stalled export and its MFU 0,
``top``'s STALLED cell, ``fleet``'s stall dated back to the last step, and the scheduler's action."""

from __future__ import annotations

import pytest

from gpudiag.agent.signals import JobSignal, parse_signal
from gpudiag.analyzers.stall import (
    FLOOR_S,
    PATTERN_MARGIN,
    PHASE_LIMIT_S,
    PROFILER_GRACE_S,
    STARTUP_S,
    K,
    Progress,
    StallRule,
    assess,
    rank_limit,
)
from gpudiag.collectors import blackbox
from gpudiag.live.snapshot import JobRow
from gpudiag.reports.top_view import job_cells
from gpudiag.scheduler.model import Policy, Signal
from gpudiag.scheduler.stalled import stalled_decisions

NOW = 1_800_000_000.0


def progress(**kw: object) -> Progress:
    base = {"rank": 0, "step": 100, "last_step_t": NOW - 10, "start": NOW - 1000, "dts": [0.5] * 20}
    return Progress(**{**base, **kw})


def test_the_limit_is_k_times_the_median_step_with_a_floor_or_the_users_outright():
    assert rank_limit(progress(dts=[0.5] * 20), StallRule(), NOW).limit_s == FLOOR_S      # 10 x 0.5 s < 60 s
    slow = rank_limit(progress(dts=[30.0] * 20), StallRule(), NOW)
    assert slow.limit_s == K * 30.0 and "median step 30" in slow.why
    mine = rank_limit(progress(dts=[30.0] * 20, last_step_t=NOW - 21), StallRule(after_s=20), NOW)
    assert (mine.limit_s, mine.stalled, mine.idle_s) == (20, True, 21)
    assert not rank_limit(progress(last_step_t=NOW - 19), StallRule(after_s=20), NOW).stalled


def test_before_the_first_step_a_marked_phase_and_gpudiags_own_window_get_their_own_limits():
    first = rank_limit(progress(step=0, last_step_t=None, start=NOW - 300), StallRule(after_s=5), NOW)
    assert (first.limit_s, first.stalled, first.since) == (STARTUP_S, False, NOW - 300)
    ckpt = rank_limit(progress(phase="checkpoint", phase_since=NOW - 900, last_step_t=NOW - 950),
                      StallRule(after_s=5), NOW)
    assert (ckpt.limit_s, ckpt.stalled, ckpt.since) == (PHASE_LIMIT_S, False, NOW - 900)
    assert rank_limit(progress(phase="ckpt", phase_since=NOW - PHASE_LIMIT_S - 1), StallRule(), NOW).stalled
    traced = rank_limit(progress(profiler_open=True, last_step_t=NOW - 100), StallRule(), NOW)
    assert traced.limit_s == FLOOR_S + PROFILER_GRACE_S and not traced.stalled


def test_a_pause_that_recurs_in_the_step_pattern_is_not_a_stall_but_a_longer_one_is():
    dts = [0.5] * 40 + [90.0] + [0.5] * 40 + [100.0] + [0.5] * 10   # an eval every 40 steps
    lim = rank_limit(progress(dts=dts[-64:], last_step_t=NOW - 150), StallRule(), NOW)
    assert lim.limit_s == PATTERN_MARGIN * 100.0 and not lim.stalled and "earlier steps paused" in lim.why
    assert rank_limit(progress(dts=dts[-64:], last_step_t=NOW - 201), StallRule(), NOW).stalled
    once = [0.5] * 60 + [90.0]   # one pause is not a pattern
    assert rank_limit(progress(dts=once, last_step_t=NOW - 61), StallRule(), NOW).stalled


def test_a_dead_rank_is_not_stalled_and_every_rank_is_judged():
    out = assess([progress(rank=1, alive=False, last_step_t=NOW - 500), progress(rank=0)], StallRule(), NOW)
    assert [r.rank for r in out] == [0, 1] and not any(r.stalled for r in out)


def test_the_black_box_reads_back_what_the_rank_wrote(tmp_path):
    (tmp_path / "samples").mkdir()
    w = blackbox.Writer(blackbox.path_for(tmp_path, 3), 3, 4242, NOW - 60)
    for i in range(1, 71):   # more steps than the ring holds
        w.step(i, NOW - 70 + i, 0.1 * i, profiler=i == 70)
    w.phase("eval", NOW - 1)
    done = w.enter(b"0", b"all_reduce", b"16x64", b"float32", 1024, 70, NOW - 0.5)
    w.done(done, NOW - 0.4)
    w.enter(b"0", b"broadcast", b"16", b"float32", 16, 70, NOW - 0.3)
    box = blackbox.read(blackbox.path_for(tmp_path, 3))
    assert (box.rank, box.pid, box.step, box.last_step_t, box.phase, box.profiler_open) == \
        (3, 4242, 70, NOW, "eval", True)
    assert len(box.dts) == blackbox.DTS
    assert box.dts[-1] == pytest.approx(7.0) and box.dts[0] == pytest.approx(0.7)
    assert [(s.seq, s.op, s.shape, s.state) for s in box.slots] == [
        (1, "all_reduce", "16x64", "completed"), (2, "broadcast", "16", "in flight")]
    (tmp_path / "samples" / "blackbox-rank-9.bin").write_bytes(b"not a black box")
    assert set(blackbox.read_all(tmp_path)) == {3}


def sig(**kw: object) -> JobSignal:
    return JobSignal(**{"job_id": "j", "ts": NOW, "mfu_ratio": 0.4, **kw})


def test_the_agent_calls_a_job_stalled_on_its_own_clock_and_exports_mfu_zero_for_it():
    s = sig(last_step_at=NOW - 100, stall_after_s=60.0)
    assert s.stalled_for(NOW) == 100 and s.mfu_at(NOW) == 0.0
    assert s.stalled_for(NOW - 50) is None and s.mfu_at(NOW - 50) == 0.4   # 50 s after the last step
    assert sig(last_step_at=NOW - 100, stall_after_s=60.0, ended=True).stalled_for(NOW) is None
    assert sig().stalled_for(NOW) is None   # a job that sends no progress is never called stalled
    raw = b'{"schema_version": 2, "job_id": "j", "ts": 1, "last_step_at": 1, "stall_after_s": 0}'
    with pytest.raises(ValueError):
        parse_signal(raw)          # a zero limit would call every job stalled
    with pytest.raises(ValueError):
        parse_signal(raw.replace(b'"stall_after_s": 0', b'"stall_cause": "<b>"'))


def test_top_marks_a_stalled_job_and_its_cause():
    cells = job_cells(JobRow(job_id="slurm:7", gpus=2, mfu=0.0, label="compute-bound", confidence=0.9,
                             stalled_seconds=125.0, stall_cause="idle"))
    assert cells[5] == "STALLED 2m05s idle" and cells[4] == "0.0%"


# the fleet's side of the stall rule: test_fleet_sums.py (a stall dated back to the last step)


def test_the_scheduler_acts_on_a_stalled_job_only_where_the_admin_enabled_it():
    stuck = Signal(mfu=0.0, label="compute-bound", confidence=0.9, age_s=5, stalled_s=3600.0,
                   stall_cause="hung")
    fine = Signal(mfu=0.4, label="compute-bound", confidence=0.9, age_s=5)
    young = Signal(mfu=0.0, label="compute-bound", confidence=0.9, age_s=5, stalled_s=100.0)
    assert stalled_decisions({1: stuck, 2: fine, 3: young}, Policy()) == []   # off by default
    (d,) = stalled_decisions({1: stuck, 2: fine, 3: young}, Policy(stalled_action="requeue"))
    assert (d.job_id, d.action) == (1, "requeue")
    assert d.reason == "stalled: no step for 1h (hung), the limit is 30m (--stalled-after): requeue"
