"""Finish-time fairness by hand, and the load sweep end to end through ``gpudiag sim --sweep``.

The three-job trace (FIFO on one node of 4 GPUs; times in seconds):
  A: 4 GPUs, submitted 0, runs 100 -> runs [0, 100]
  B: 2 GPUs, submitted 10, runs 100 -> waits for A, runs [100, 200]
  C: 2 GPUs, submitted 20, runs 50 -> waits for A, runs [100, 150] beside B
Jobs in the system: 1 on [0,10), 2 on [10,20), 3 on [20,100), 2 on [100,150), 1 on [150,200).
N (time-average over each job's lifetime) and T_fair = d * max(1, g N / C), C = 4:
  A: N = (10*1 + 10*2 + 80*3) / 100 = 2.7;      T_fair = 100 * 4 * 2.7 / 4 = 270;   rho = 100 / 270
  B: N = (20 + 240 + 100 + 50) / 190 = 410/190; T_fair = 100 * 2 * N / 4 = 107.89; rho = 190 / 107.89
  C: N = (240 + 100) / 130 = 340/130;           T_fair = 50 * 2 * N / 4 = 65.38;    rho = 130 / 65.38
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from gpudiag.scheduler.model import Cluster, Policy
from gpudiag.scheduler.sim.fairness import finish_time_fairness
from gpudiag.scheduler.sim.metrics import summarise
from gpudiag.scheduler.sim.simulator import simulate
from gpudiag.scheduler.sim.sweep import NOT_IN_BUILD, ablations
from gpudiag.scheduler.sim.traces import TraceJob
from tests.conftest import SHARED as SHARED_DATA

SHARED = SHARED_DATA / "clusters"
RHO_A = 100 / (100 * 4 * 2.7 / 4)
RHO_B = 190 / (100 * 2 * (410 / 190) / 4)
RHO_C = 130 / (50 * 2 * (340 / 130) / 4)


def test_finish_time_fairness_matches_the_hand_computed_three_job_trace():
    jobs = [TraceJob(0, 0.0, 100.0, 4, "a", "kA"), TraceJob(1, 10.0, 100.0, 2, "b", "kB"),
            TraceJob(2, 20.0, 50.0, 2, "b", "kC")]
    mfu = {j.id: (0.3, "compute-bound") for j in jobs}
    res = simulate(jobs, mfu, Cluster.uniform(1, 4), Policy.fifo())
    assert [(s.first_start, s.end) for s in res.jobs] == [(0.0, 100.0), (100.0, 200.0), (100.0, 150.0)]
    rho = finish_time_fairness([0, 10, 20], [100, 200, 150], [4, 2, 2], [100, 100, 50], 4)
    assert rho == pytest.approx([RHO_A, RHO_B, RHO_C])
    m = summarise(res)
    assert m["worst_rho"] == pytest.approx(RHO_C, abs=1e-4)          # 1.9882: C waited longest for its size
    assert m["share_rho_above_1"] == pytest.approx(2 / 3, abs=1e-4)   # B, C; A had the whole cluster


def test_ablation_names_a_field_this_build_lacks_instead_of_skipping_it():
    variants = ablations(Policy())
    assert set(variants) == {"gpudiag -efficiency", "gpudiag -team_queues", "gpudiag -reclaim",
                             "gpudiag -waste_charge"}
    assert variants["gpudiag -efficiency"].efficiency is False
    assert variants["gpudiag -team_queues"].team_queues is False
    for field in ("reclaim", "waste_charge"):
        v = variants[f"gpudiag -{field}"]
        if hasattr(Policy(), field):   # after the merge that adds it: switched off, or said to be off
            assert v.startswith("already off") if isinstance(v, str) else not getattr(v, field)
        else:
            assert v == NOT_IN_BUILD


def test_ablation_switches_off_the_fields_a_merged_policy_adds_by_name():
    @dataclasses.dataclass(frozen=True)
    class Merged(Policy):   # what Policy looks like once reclaim and waste_charge are merged
        reclaim: bool = True
        waste_charge: float = 1.0

    variants = ablations(Merged())
    assert variants["gpudiag -reclaim"].reclaim is False and variants["gpudiag -reclaim"].efficiency
    assert variants["gpudiag -waste_charge"].waste_charge == 0.0
    assert ablations(Merged(reclaim=False))["gpudiag -reclaim"].startswith("already off")


def test_cli_sweep_writes_the_page_charts_and_tables_with_easy_as_its_own_unit(tmp_path):
    if not SHARED.is_dir():
        pytest.fail(f"test data missing: {SHARED} (CI lays ../shared beside the repository)")
    out = tmp_path / "docs"
    kept = out / "scheduler-evaluation" / "whole-trace.md"   # measured apart, by the replay benchmark
    kept.parent.mkdir(parents=True)
    kept.write_text("## The whole trace\n\nmeasured apart: 0.731\n", encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "gpudiag", "sim", str(SHARED / "tiresias_60job.csv"), "--sweep",
                        "--out", str(out), "--loads", "0.6,1", "--seeds", "1", "--nodes", "2",
                        "--window-jobs", "60", "--windows", "1", "--processes", "2"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    page = (out / "scheduler-evaluation.md").read_text()
    charts = sorted((out / "scheduler-evaluation").glob("*.svg"))
    assert charts and all(c.read_text().startswith("<svg") for c in charts)
    for c in charts:   # every chart is shown on the page
        assert f"(scheduler-evaluation/{c.name})" in page
    raw = json.loads((out / "scheduler-evaluation" / "sweep.json").read_text())
    done = {(r["family"], r["load"], r["variant"]) for r in raw["runs"] if r["metrics"]}
    for fam in ("arrivals", "cluster"):
        for load in (0.6, 1.0):
            assert {(fam, load, v) for v in ("fifo", "easy", "tiresias", "gpudiag")} <= done
    # the ratio table: EASY against itself is 1 in every column, at every load of both families
    easy_rows = re.findall(r"^\| (?:0\.6|1) \| easy \|((?: [^|]+ \|){6})$", page, re.M)
    assert len(easy_rows) == 4
    assert all(cell.strip() == "1" for row in easy_rows for cell in row.split("|") if cell.strip())
    for field in ("reclaim", "waste_charge"):
        if not hasattr(Policy(), field):
            assert f"| gpudiag -{field} | {NOT_IN_BUILD} |" in page
            assert f"ablation gpudiag -{field}: {NOT_IN_BUILD}" in p.stderr
    # the 60-job trace has no 8-hour span of 160 submissions: said, not silently empty
    assert "no 8-hour span" in page
    # the whole-trace section kept beside the charts survives the page's regeneration
    assert "## The whole trace\n\nmeasured apart: 0.731" in page


def test_sweep_scenarios_hit_the_load_asked_and_pollux_windows_hold_160_jobs_in_8_hours():
    from gpudiag.scheduler.sim.sweep import GPUS_PER_NODE, offered_load, scenarios
    from gpudiag.scheduler.sim.traces import read_trace

    jobs = read_trace(SHARED / "philly.csv").jobs
    scs = scenarios(jobs, [0.5, 1.0], [0], 59, 500, 1)
    arr = [s for s in scs if s.family == "arrivals"]
    assert [round(offered_load(s.jobs, 59 * GPUS_PER_NODE), 9) for s in arr] == [0.5, 1.0]
    assert [j.gpus for j in arr[0].jobs] == [j.gpus for j in arr[1].jobs]     # one seed: the same jobs
    by_size = [s for s in scs if s.family == "cluster"]
    assert by_size[0].nodes > by_size[1].nodes                                # lower load, larger cluster
    (win,) = [s for s in scs if s.family == "windows"]
    assert len(win.jobs) == 160 and win.nodes * GPUS_PER_NODE == 64
    assert max(j.submit for j in win.jobs) < 8 * 3600


@pytest.mark.parametrize("args, says", [
    (["--sweep", "--policy", "easy"], "--sweep runs every policy"),
    (["--seeds", "2"], "--seeds only go with --sweep"),
    (["--sweep", "--loads", "0.5,x"], "--loads '0.5,x': expected offered loads"),
])
def test_cli_sweep_refuses_options_that_do_not_apply_in_one_line(args, says):
    p = subprocess.run([sys.executable, "-m", "gpudiag", "sim", str(SHARED / "tiresias_60job.csv"), *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
