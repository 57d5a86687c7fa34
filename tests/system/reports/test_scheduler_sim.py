"""The simulator's baselines against hand-computed traces and against an independent reference.

The reference below re-implements FIFO and EASY from their written rules in the plainest way
(lists, full scans, no buckets, no vectorised filtering), so the production code's fast paths
must reproduce every job's start time. The Tiresias 60-job trace and a Philly prefix are replayed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.scheduler.model import Cluster, Policy
from gpudiag.scheduler.sim.metrics import KEYS, summarise
from gpudiag.scheduler.sim.mfu_model import synthesise
from gpudiag.scheduler.sim.simulator import simulate
from gpudiag.scheduler.sim.tiresias import RESTORE_S, THRESHOLD_GPU_S, simulate_tiresias
from gpudiag.scheduler.sim.traces import TraceJob, read_trace
from tests.conftest import SHARED as SHARED_DATA

SHARED = SHARED_DATA / "clusters"


@pytest.fixture(scope="module")
def clusters() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"test data missing: {SHARED} (CI lays ../shared beside the repository)")
    return SHARED


def _jobs(rows: list[tuple[float, int, float]]) -> list[TraceJob]:
    return [TraceJob(i, t, d, g, "default", f"k{i}") for i, (t, g, d) in enumerate(rows)]


def _starts(jobs, policy, nodes, per=8, rack=4):
    mfu = {j.id: (0.3, "compute-bound") for j in jobs}
    res = simulate(jobs, mfu, Cluster.uniform(nodes, per, rack), policy)
    return {s.trace_id: s.first_start for s in res.jobs}, res


def reference(jobs: list[TraceJob], nodes: int, per: int, backfill: bool) -> dict[int, float]:
    """FIFO / EASY written out plainly from the rules in scheduler/placement.py's docstring."""
    free = [per] * nodes
    pending: list[TraceJob] = []
    running: list[tuple[float, int, list[tuple[int, int]]]] = []
    start: dict[int, float] = {}
    todo = sorted(jobs, key=lambda j: (j.submit, j.id))

    def fit(fr, g, allowed=lambda n, k: True):
        if g <= per:
            ok = [n for n in range(nodes) if fr[n] >= g and allowed(n, g)]
            return [(min(ok, key=lambda n: (fr[n], n)), g)] if ok else None
        k = -(-g // per)
        ok = [n for n in range(nodes) if fr[n] == per and allowed(n, per)][:k]
        return [(n, per) for n in ok[:-1]] + [(ok[-1], g - per * (k - 1))] if len(ok) == k else None

    def run(j, plan, now):
        for n, g in plan:
            free[n] -= g
        running.append((now + j.duration, j.id, plan))
        start[j.id] = now

    while todo or running:
        now = min([todo[0].submit] if todo else [] + [], default=float("inf"))
        if running:
            now = min(now, min(r[0] for r in running))
        for r in [r for r in running if r[0] == now]:
            running.remove(r)
            for n, g in r[2]:
                free[n] += g
        while todo and todo[0].submit == now:
            pending.append(todo.pop(0))
        while pending and (plan := fit(free, pending[0].gpus)):
            run(pending.pop(0), plan, now)
        if not pending or not backfill:
            continue
        head = pending[0]
        copy = free[:]
        shadow = None
        for end in sorted({r[0] for r in running}):
            for r in running:
                if r[0] == end:
                    for n, g in r[2]:
                        copy[n] += g
            if fit(copy, head.gpus):
                shadow = end
                break
        # a whole-node head needs its nodes wholly free: none of their GPUs is spare
        spare = {n: 0 if head.gpus > per else copy[n] - g for n, g in fit(copy, head.gpus)}

        def allowed(n: int, k: int, spare: dict = spare) -> bool:
            return n not in spare or spare[n] >= k

        for j in list(pending[1:]):
            plan = fit(free, j.gpus) if now + j.duration <= shadow else fit(free, j.gpus, allowed)
            if plan:
                if now + j.duration > shadow:
                    for n, g in plan:
                        if n in spare:
                            spare[n] -= g
                pending.remove(j)
                run(j, plan, now)
    return start


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("name", ["fifo", "easy"])
def test_tiresias_60_job_trace_matches_the_reference(clusters, name, nodes):
    jobs = read_trace(clusters / "tiresias_60job.csv").jobs
    got, res = _starts(jobs, Policy.fifo() if name == "fifo" else Policy.easy(), nodes)
    want = reference(jobs, nodes, 8, backfill=name == "easy")
    assert got == want
    assert res.rejected == 0 and len(res.jobs) == 60


@pytest.mark.parametrize("name", ["fifo", "easy"])
def test_a_contended_philly_prefix_matches_the_reference(clusters, name):
    jobs = read_trace(clusters / "philly.csv").jobs[:1500]
    jobs = [j for j in jobs if j.gpus <= 6 * 8]
    got, _ = _starts(jobs, Policy.fifo() if name == "fifo" else Policy.easy(), 6)
    want = reference(jobs, 6, 8, backfill=name == "easy")
    differing = [i for i in want if got[i] != want[i]]
    assert not differing, differing[:5]


def test_hand_computed_fifo_and_easy():
    # one node of 4 GPUs: A fills it until 100; B (2 GPUs) starts then; C (4) must wait for B;
    # D (1 GPU, 20 s) fits beside B at 100 and ends at 120, before C's reserved start at 150.
    jobs = _jobs([(0, 4, 100), (10, 2, 50), (20, 4, 10), (30, 1, 20)])
    fifo, _ = _starts(jobs, Policy.fifo(), 1, per=4, rack=1)
    easy, res = _starts(jobs, Policy.easy(), 1, per=4, rack=1)
    assert fifo == {0: 0, 1: 100, 2: 150, 3: 160}        # strict order: D waits behind C
    assert easy == {0: 0, 1: 100, 2: 150, 3: 100}        # D backfills, C is not delayed
    m = summarise(res)
    assert m["avg_jct_s"] == pytest.approx((100 + 140 + 140 + 90) / 4)
    assert m["gpu_utilisation"] == pytest.approx((400 + 100 + 40 + 20) / (4 * 160))
    # a long D would delay C: it may not backfill
    long_d = _jobs([(0, 4, 100), (10, 2, 50), (20, 4, 10), (30, 1, 80)])
    assert _starts(long_d, Policy.easy(), 1, per=4, rack=1)[0][3] == 160


def test_hand_computed_tiresias_demotes_and_preempts():
    # one GPU: E runs 5000 s from 0; F (50 s) arrives at 100. Both in queue 0, E first; at
    # 3600 GPU-s E drops to queue 1, F preempts it; E resumes at 3650 paying the restore time.
    jobs = _jobs([(0, 1, 5000), (100, 1, 50)])
    res = simulate_tiresias(jobs, {0: (0.3, "compute-bound"), 1: (0.3, "compute-bound")},
                            Cluster.uniform(1, 1, 1))
    e, f = res.jobs
    assert f.first_start == THRESHOLD_GPU_S and f.end == THRESHOLD_GPU_S + 50
    assert e.end == THRESHOLD_GPU_S + 50 + RESTORE_S + (5000 - THRESHOLD_GPU_S)
    m = summarise(res)
    assert m["preemptions"] == 1 and m["lost_gpu_seconds"] == RESTORE_S


def test_tiresias_on_the_60_job_trace_completes_everything(clusters):
    jobs = read_trace(clusters / "tiresias_60job.csv").jobs
    res = simulate_tiresias(jobs, synthesise(jobs, 0), Cluster.uniform(2, 8, 4))
    assert all(s.end >= s.job.submit + s.duration for s in res.jobs)
    assert sum(s.segments[-1][1] - s.segments[-1][0] >= 0 for s in res.jobs) == 60
    # no job ran more GPU-time than its work plus its restore overheads
    for s in res.jobs:
        ran = sum(e - b for b, e, _ in s.segments)
        assert ran == pytest.approx(s.duration + RESTORE_S * s.preemptions)


def test_gpudiag_learns_a_keys_low_mfu_and_lets_others_go_first():
    # one GPU. Key "slow" ran before (learned after 10 min: MFU 2%, input-bound), key "fast"
    # too (40%). A blocker holds the GPU 2000..3500; one job of each key arrives meanwhile, slow first.
    rows = [(0, 1, 700), (1, 1, 700), (2000, 1, 1500), (3100, 1, 100), (3101, 1, 100)]
    jobs = [TraceJob(i, t, d, g, "default", k) for i, ((t, g, d), k) in
            enumerate(zip(rows, ["slow", "fast", "blocker", "slow", "fast"], strict=True))]
    mfu = {0: (0.02, "input-bound"), 1: (0.4, "compute-bound"), 2: (0.3, "compute-bound"),
           3: (0.02, "input-bound"), 4: (0.4, "compute-bound")}
    cl = Cluster.uniform(1, 1, 1)
    easy = simulate(jobs, mfu, cl, Policy.easy())
    gd = simulate(jobs, mfu, cl, Policy())
    assert easy.jobs[3].first_start < easy.jobs[4].first_start     # arrival order
    assert gd.jobs[4].first_start < gd.jobs[3].first_start         # the efficient key first
    assert gd.jobs[3].first_start - gd.jobs[3].job.submit <= Policy().aging_bound_s


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudiag", "sim", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_json_has_exactly_the_promised_keys(clusters):
    for policy in ("fifo", "easy", "tiresias", "gpudiag"):
        p = _cli(str(clusters / "tiresias_60job.csv"), "--nodes", "2", "--policy", policy, "--json")
        assert p.returncode == 0, p.stderr
        m = json.loads(p.stdout)
        assert tuple(m) == KEYS and m["jobs"] == 60 and len(m["useful_work_by_time"]) == 10
        assert m["useful_work_by_time"][-1] == pytest.approx(1.0, abs=1e-3)


def test_cli_node_sizes_builds_a_mixed_cluster_and_refuses_bad_syntax_in_one_line(clusters):
    trace = str(clusters / "tiresias_60job.csv")
    same = [_cli(trace, *a, "--policy", "easy", "--json")
            for a in (("--node-sizes", "2x8"), ("--nodes", "2"))]
    assert all(p.returncode == 0 for p in same)
    a, b = (json.loads(p.stdout) for p in same)
    assert a.pop("sim_wall_s") > 0 and b.pop("sim_wall_s") > 0 and a == b   # the same uniform cluster
    mixed = _cli(trace, "--node-sizes", "1x8, 3x2", "--policy", "gpudiag")
    assert mixed.returncode == 0, mixed.stderr
    assert mixed.stdout.startswith("gpudiag on 1 nodes x 8 GPUs + 3 nodes x 2 GPUs (racks of 4): 60 jobs")
    for bad, words in ((("--node-sizes", "40x8,x4"), "expected groups of N nodes x G GPUs"),
                       (("--node-sizes", "2x0"), "expected groups"),
                       (("--node-sizes", "2x8", "--gpus-per-node", "4"), "leave out --gpus-per-node")):
        p = _cli(trace, *bad)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and words in p.stderr, (bad, p.stderr)
        assert "Traceback" not in p.stderr


def test_same_seed_same_numbers_other_seed_other_mfu(clusters):
    jobs = read_trace(clusters / "philly.csv").jobs[:3000]
    a, b, c = synthesise(jobs, 1), synthesise(jobs, 1), synthesise(jobs, 2)
    assert a == b and a != c
    keys: dict[str, set] = {}
    for j in jobs:
        keys.setdefault(j.key, set()).add(a[j.id][1])
    assert all(len(v) == 1 for v in keys.values())      # one label per key, as documented


def test_an_on_demand_job_preempts_the_spot_job_that_loses_least_and_the_victim_resumes():
    # one node of 2 GPUs, two 1-GPU spot jobs running (MFU 40% and 5%); an on-demand 1-GPU job
    # arrives after both ran 45 min. The 5% one is the victim: SIGTERM, its grace, then requeued
    # with its work up to the last 30-min checkpoint; it finishes after the on-demand job.
    from gpudiag.scheduler.model import Tier
    from gpudiag.scheduler.sim.simulator import CHECKPOINT_INTERVAL_S

    jobs = [TraceJob(0, 0.0, 7200.0, 1, "a", "hi", tier=Tier.SPOT),
            TraceJob(1, 0.0, 7200.0, 1, "a", "lo", tier=Tier.SPOT),
            TraceJob(2, 2700.0, 600.0, 2, "b", "urgent", tier=Tier.ON_DEMAND)]
    mfu = {0: (0.4, "compute-bound"), 1: (0.05, "input-bound"), 2: (0.3, "compute-bound")}
    res = simulate(jobs, mfu, Cluster.uniform(1, 2, 1), Policy())
    hi, lo, urgent = res.jobs
    assert hi.preemptions == 1 and lo.preemptions == 1   # a 2-GPU head needs both GPUs
    grace = urgent.job.grace_s
    assert urgent.first_start == 2700.0 + grace
    for s in (hi, lo):
        assert s.lost_gpu_s == pytest.approx(2700.0 + grace - CHECKPOINT_INTERVAL_S)
        assert s.end == pytest.approx(urgent.end + 7200.0 - CHECKPOINT_INTERVAL_S)
    assert summarise(res)["preemptions"] == 2
    easy = simulate(jobs, mfu, Cluster.uniform(1, 2, 1), Policy.easy())
    assert summarise(easy)["preemptions"] == 0 and easy.jobs[2].first_start == 7200.0


def test_the_victim_is_the_job_losing_least_useful_work():
    from gpudiag.scheduler.model import Tier

    jobs = [TraceJob(0, 0.0, 7200.0, 1, "a", "hi", tier=Tier.SPOT),
            TraceJob(1, 0.0, 7200.0, 1, "a", "lo", tier=Tier.SPOT),
            TraceJob(2, 2700.0, 600.0, 1, "b", "urgent", tier=Tier.ON_DEMAND)]
    mfu = {0: (0.4, "compute-bound"), 1: (0.05, "input-bound"), 2: (0.3, "compute-bound")}
    hi, lo, urgent = simulate(jobs, mfu, Cluster.uniform(1, 2, 1), Policy()).jobs
    assert (hi.preemptions, lo.preemptions) == (0, 1)
    assert urgent.first_start == 2700.0 + urgent.job.grace_s


@pytest.mark.parametrize("name", ["fifo", "easy", "tiresias"])
def test_tiresias_60_job_trace_first_jobs_by_hand(clusters, name):
    # 2 nodes x 8 GPUs. Best fit: job 0 (1 GPU) node 0; job 1 (8) node 1; jobs 2 (2), 3 (1) and
    # 4 (4) fill node 0 exactly, each at its submit time. Job 5 (8 GPUs, t=132) needs a whole
    # node: node 1 frees when job 1 ends (30 + 147 = 177), node 0 only at 220 (job 4). Under
    # Tiresias every job is still in queue 0 (job 1 attained 8 x 102 s < 3,600 GPU-s): no
    # preemption, and job 5 is selected once 8 GPUs are free by count, at 177.
    jobs = read_trace(clusters / "tiresias_60job.csv").jobs
    mfu = synthesise(jobs, 0)
    cl = Cluster.uniform(2, 8, 4)
    res = simulate_tiresias(jobs, mfu, cl) if name == "tiresias" else simulate(
        jobs, mfu, cl, Policy.fifo() if name == "fifo" else Policy.easy())
    start = {s.trace_id: s.first_start for s in res.jobs}
    assert [start[i] for i in range(6)] == [0, 30, 53, 79, 99, 177]


def test_team_queues_give_a_late_team_its_share_of_a_busy_cluster():
    # one node of 2 GPUs; teams a and b offer equal load (quota 1 GPU each). a submits four
    # 1-GPU jobs of 1000 s at t=0..3, b four at t=4..7. EASY runs a's four first (b from 2000).
    # Per-team queues: at 1000 a holds 1 GPU (a1) and b none, so b0 goes before a2; at 1001 a
    # holds none and b one, so a2; the teams then alternate.
    jobs = [TraceJob(i, float(i), 1000.0, 1, "a" if i < 4 else "b", f"k{i}") for i in range(8)]
    mfu = {j.id: (0.3, "compute-bound") for j in jobs}
    cl = Cluster.uniform(1, 2, 1)
    easy = {s.trace_id: s.first_start for s in simulate(jobs, mfu, cl, Policy.easy()).jobs}
    fair = {s.trace_id: s.first_start for s in simulate(jobs, mfu, cl, Policy()).jobs}
    assert [easy[i] for i in range(8)] == [0, 1, 1000, 1001, 2000, 2001, 3000, 3001]
    assert [fair[i] for i in range(8)] == [0, 1, 1001, 2001, 1000, 2000, 3000, 3001]


def test_a_low_mfu_job_behind_a_steady_stream_of_high_mfu_jobs_starts_within_its_aging_bound():
    """The adversarial case for the aging bound: on one node of 4 GPUs, team a's long job holds
    2 GPUs (a is over its quota) when a 2-GPU job of a's low-MFU key arrives; team b (under its
    quota, a high-MFU key) submits a 1-GPU job of 30 min every 5 min, three times what the 2
    GPUs left can run, for a day. Per-team queues and the efficiency term put every b job ahead
    of the low-MFU job until it is overdue: it has waited the drain time, capped at
    ``team_overdue_s``; then only overdue jobs submitted at most ``max_efficiency_delay_s``
    after it may pass it, so it starts within ``Policy.aging_bound_s`` plus the time for two of
    b's running jobs to end - passed by dozens of later jobs, never starved."""
    policy = Policy(team_overdue_s=6 * 3600.0, max_efficiency_delay_s=3600.0)
    learn = [TraceJob(i, float(i), 700.0, 1, "a" if i < 2 else "b", "slow" if i < 2 else "fast")
             for i in range(4)]
    long = TraceJob(4, 1000.0, 10 * 86400.0, 2, "a", "long")
    low = TraceJob(5, 2000.0, 3600.0, 2, "a", "slow")
    stream = [TraceJob(6 + i, 2000.0 + 300.0 * i, 1800.0, 1, "b", "fast") for i in range(288)]
    jobs = [*learn, long, low, *stream]
    mfu = {j.id: (0.02, "input-bound") if j.key == "slow" else (0.45, "compute-bound") for j in jobs}
    res = simulate(jobs, mfu, Cluster.uniform(1, 4, 1), policy)
    start = {s.trace_id: s.first_start for s in res.jobs}
    passed = sum(1 for j in stream if start[j.id] < start[low.id])
    assert passed > 20                                                    # adversarial indeed
    assert start[low.id] - low.submit <= policy.aging_bound_s + 1800.0   # ... and bounded
    assert res.aging_violations == 0
    easy = simulate(jobs, mfu, Cluster.uniform(1, 4, 1), Policy.easy())
    assert {s.trace_id: s.first_start for s in easy.jobs}[low.id] - low.submit <= 1800.0
