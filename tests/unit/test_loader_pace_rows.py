"""The DataLoader workers' figures in the step timer's rows (``StepRow.workers_run_s`` and
``workers_busy_s``) as the diagnosis reads them: spread over the steps a read covered, their pace
per step (``host_cpu.workers_busy``), and the job's cores from the rows alone where the host
sampler gave too few samples (``host_cpu.rows_cpu``: a job of a few seconds, blind check 37)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudiag.analyzers.host_cpu import MIN_ROWS, rows_cpu, workers_busy
from gpudiag.rundir import BootstrapMeta, StepRow, read_steps


def _write(run: Path, rows: list[dict]) -> None:
    (run / "samples").mkdir(parents=True)
    (run / "samples" / "steps-rank-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_workers_read_over_several_steps_is_spread_evenly_over_them(tmp_path: Path):
    base = {"t": 1.0, "dt": 0.01, "run_s": 0.005, "wait_s": 0.0}
    _write(tmp_path, [
        {"step": 1, **base},
        {"step": 2, **base},
        {"step": 3, **base, "peer_wait_s": 0.003, "peer_run_s": 0.006, "peers": 3,
         "workers_run_s": 0.030, "workers_busy_s": 0.024, "peer_steps": 3},
        {"step": 4, **base, "peer_wait_s": 0.001, "peer_run_s": 0.002, "peers": 3},  # no workers read
        {"step": 5, **base, "peer_wait_s": 0.001, "peer_run_s": 0.002, "peers": 3,
         "workers_run_s": -1.0, "workers_busy_s": 0.01},  # torn: left out, the rest kept
    ])
    rows = read_steps(tmp_path, boot={})[0]
    assert [r.workers_run_s for r in rows[:3]] == pytest.approx([0.010] * 3)
    assert [r.workers_busy_s for r in rows[:3]] == pytest.approx([0.008] * 3)
    assert rows[3].workers_run_s is None and rows[3].workers_busy_s is None
    assert rows[4].workers_busy_s is None and rows[4].peer_wait_s == pytest.approx(0.001)


def _rows(n: int, **kw) -> list[StepRow]:
    return [StepRow(step=i + 1, t=float(i), dt=0.008, cpu_s=0.006, wait_s=0.0005, **kw) for i in range(n)]


def test_the_loaders_pace_is_its_workers_busy_time_a_step_over_the_untraced_steps():
    rows = _rows(40, workers_run_s=0.009, workers_busy_s=0.0085)
    rows[20].profiler = "traced"  # the profiler's steps are not the job's pace
    rows[20].workers_busy_s = 0.5
    assert workers_busy(rows) == pytest.approx(0.0085)
    assert workers_busy(_rows(MIN_ROWS + 1)) is None       # no workers read
    assert workers_busy(_rows(MIN_ROWS, workers_run_s=0.009, workers_busy_s=0.0085)) is None  # start-up only


def test_a_short_jobs_cores_come_from_its_rows_where_they_carry_its_workers():
    meta = BootstrapMeta(rank=0, skip=0, steps=0, cpus=2, intra_op_threads=1)
    host = rows_cpu({0: _rows(40, workers_run_s=0.009, workers_busy_s=0.0085)}, {0: meta})
    assert host is not None and host.samples == 0 and host.other_cores is None
    assert host.proc_cores == pytest.approx(0.75) and host.cores_used == pytest.approx(0.75 + 1.125)
    assert host.step_s == pytest.approx(0.008) and host.cpus == 2
    assert host.runq_cores == pytest.approx(0.0625, abs=1e-3)  # the training thread's wait alone
    # rows that do not carry the workers' CPU (a run before they were read) give nothing
    assert rows_cpu({0: _rows(40)}, {0: meta}) is None
