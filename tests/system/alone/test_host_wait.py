"""Host time split in two: the job's own, and the training thread waiting for a core (issue 29,
item 3). Real torch jobs under ``gpudiag profile`` on this machine's CPU, with a real process
spinning beside them or their own DataLoader workers outnumbering the cores; the H200 recording
``resnet_w14`` (recorded before the step timer read schedstat) read as it is, and again with a
wait written into its step rows to walk the GPU path's arithmetic (no GPU here to record one).

Margins: this is a 2-core VM other engineers share (load averages of 8-10 seen while these were
written), so the tests hold what does not move with that load: who is in the job's process tree,
which thread's counters the step timer reads, and whether an outside tenant's time is charged.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag.analyzers.diagnose import diagnose
from gpudiag.diagnosis import Diagnosis
from gpudiag.pace import at_own_pace
from gpudiag.reports.html import render_report
from gpudiag.reports.terminal import render_terminal
from gpudiag.rundir import read_bootstrap, read_host_cpu, read_steps
from gpudiag.steps import window_steps
from tests.conftest import SHARED
from tests.harness import gate_env, start_when_ready
from tests.paths import REPO

# Each test here makes its own competitor (spinners, CPU slices) and compares with its own quiet
# run: another test's load beside it would be a competitor it did not make, so `make test` runs
# these after the parallel lanes, alone (their folder, system/alone, marks them solo).

JOBS = REPO / "tests" / "jobs"
W14 = SHARED / "runs" / "h200-2026-11-27" / "resnet_w14"


def spinners(n: int, cpu: int) -> list[subprocess.Popen]:
    """``n`` processes outside the job (children of the test, not of the job) spinning on ``cpu``."""
    code = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def job_ended(run: Path) -> bool:
    """``gpudiag profile`` recorded the job's end (run.json leaves "running" before the analysis):
    a CPU peak measured beside the spinners would be the session's (measured once, cached)."""
    try:
        return json.loads((run / "run.json").read_text()).get("status") != "running"
    except (OSError, ValueError):
        return False


def profile(run: Path, job: list[str], *opts: str, env: dict[str, str] | None = None,
            spin: int = 0, spin_steps: int | None = None) -> Diagnosis:
    """The job under ``gpudiag profile``; with ``spin`` outside processes on the job's CPU (the
    GEMM job pins itself to the lowest one) from its first step (``tests/jobs/_timer.start_gate``),
    stopped once ``spin_steps`` step rows are written, or when the job ends."""
    cpu = min(os.sched_getaffinity(0))
    procs: list[subprocess.Popen] = []
    try:
        job_p = subprocess.Popen([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), *opts, "--",
                                  sys.executable, *job],
                                 env={**os.environ, **(env or {}), **(gate_env(run) if spin else {})},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if spin:
            procs = start_when_ready(run, job_p, lambda: spinners(spin, cpu))
        steps = run / "samples" / "steps-rank-0.jsonl"
        while procs and job_p.poll() is None:
            if ((spin_steps is not None and steps.is_file() and steps.read_text().count("\n") >= spin_steps)
                    or job_ended(run)):  # the analysis (and the CPU peak it may measure) without them
                stop(procs)
                procs = []
            time.sleep(0.05)
        _, err = job_p.communicate(timeout=600)
    finally:
        stop(procs)
    assert job_p.returncode == 0, err[-3000:]
    return Diagnosis.from_json((run / "diagnosis.json").read_text())


def test_a_process_spinning_on_the_jobs_core_is_its_wait_for_a_core_and_not_its_own(gemm_beside_two_loops):
    """Two processes outside the job spin on the GEMM job's one core for its whole run. The step
    timer reads the training thread's own counters: it ran or waited, so run + wait is its step
    (it never sleeps in a GEMM loop), and the wait is a large part of it (the scheduler shares
    the core three ways and more). The host sampler sees the spinners outside the job's tree:
    the wait is other processes'. (Measured at load 8-10: 103 ms of 155 ms waited, 79% other
    with a spinner inside the tree; outside it nearly all.) The run is the solo pass's one GEMM
    job beside two loops on its core (conftest.py), which test_own_pace_bounds reads too."""
    d, _, run = gemm_beside_two_loops
    rows = [r for r in read_steps(run)[0] if r.step > 2]
    assert all(r.wait_s is not None and r.run_s is not None for r in rows), rows[:3]
    dt = statistics.median(r.dt for r in rows)
    both = statistics.median((r.run_s + r.wait_s) / r.dt for r in rows)
    assert 0.85 <= both <= 1.05, both  # the stepping thread's counters, not another thread's
    w = d.host_wait
    assert w is not None and w.recorded, w
    assert w.untraced_wait_us >= 0.25 * dt * 1e6, (w.untraced_wait_us, dt)
    assert w.other_share is not None and w.other_share >= 0.7, w.note
    assert "other processes" in w.note


def test_dataloader_workers_outnumbering_the_cores_are_the_jobs_own(tmp_path):
    """Four DataLoader workers decompressing shards on two cores: the training thread waits for
    a core, and the workers (the job's process tree) are counted as its own, not as another
    tenant. The step rows are one thread's: its time on a core and waiting for one add up to no
    more than its step (the median within 5%, for the read's jitter at the step's edge), where
    the process's counters would add up its threads. (How much of its step the loop runs is the
    machine's: 0.72 quiet, 0.91 in a full run of the suite on this 2-core VM; no bound on it.)
    The share the job's own work takes of the wait depends on how busy the rest of the machine
    is (10% at load 10 on this VM, where others held most of both cores; 0% once in a full run
    of the suite): the test asks that the workers are in the sampled tree at all. 150 steps:
    whose work held the cores needs a 1 s host sample inside the untraced steps, and 70 steps of
    20 ms left none either side of the window in the project's CI ("who held the cores is
    unknown")."""
    run = tmp_path / "feed"
    d = profile(run, [str(JOBS / "feed_job.py"), "--steps", "150", "--workers", "4", "--read-ms", "0",
                      "--decode-mb", "16", "--report", str(tmp_path / "own.json")], "--skip", "30")
    rows = [r for r in read_steps(run)[0] if r.step > 2 and r.profiler is None]
    assert statistics.median((r.run_s + r.wait_s) / r.dt for r in rows) <= 1.05, "not one thread's counters"
    w = d.host_wait
    assert w is not None and w.recorded, w
    # the training thread waits for a core in many of its steps; its median step can have none
    # where it sleeps on the batch queue (a clean clone's solo pass, 2026-12-03: a median of 4 us
    # over the steps around the window read 0, while 71 of 141 untraced steps waited, 0.41 ms
    # on average)
    assert sum(1 for r in rows if r.wait_s > 0) >= len(rows) // 10, [r.wait_s for r in rows]
    # the host sampler's tree holds the four workers beside the main process; how much of the
    # wait they caused is the machine's to say (0 where the rest of it holds both cores and the
    # workers sit on a full prefetch queue, as a full run of the suite can make it)
    procs = [json.loads(x)["processes"] for x in (run / "samples" / "host.jsonl").read_text().splitlines()]
    assert max(procs) >= 5, procs
    assert w.own_share is not None, w.note
    assert w.own_share + w.other_share == pytest.approx(1.0, abs=0.002)
    # the workers' threads are read at each step too (collectors.thread_waits), at a cost the job
    # measured on its own clock, under 1% of its step
    reads = read_bootstrap(run)[0].thread_waits
    assert reads["workers"] == 4 and reads["threads"] >= 4, reads
    # the batches its workers hold ready (4 x torch's default prefetch_factor of 2): the steps
    # after the window that drain them are no reference for the job's pace (steps.prefetch_depth)
    assert read_bootstrap(run)[0].dataloader_prefetch == 8
    assert reads["cost_per_step_s"] <= 0.01 * statistics.median(r.dt for r in rows), reads
    # every step up to the last read has its part of the wait (a read every k-th step, when
    # reading costs more than the budget, is spread over the k; a busy machine makes the reads
    # slower and k larger: the steps after the last read wait for the next)
    last = max(i for i, r in enumerate(rows) if r.peer_wait_s is not None)
    assert sum(r.peer_wait_s is not None for r in rows[:last + 1]) >= 0.9 * (last + 1), rows


def test_the_exported_mfu_of_a_job_another_tenant_slowed_stays_near_its_quiet_value(tmp_path):
    """The GEMM job quiet, and with two outside processes spinning on its core for its first 25
    of 50 steps (the trace window, steps 11-15, inside them). Its diagnosis reads the slowed
    steps by wall clock (MFU 0.28x the quiet run's, measured; the issue saw 0.23x on 16 cores
    with 8 loops); its MFU, and the one its last signal exports to the agent, are at its own
    pace, each step less the wait others' processes caused: 0.94x measured. Held to 0.6-1.6x:
    the quiet run's own pace on this shared VM moves too, and the uncorrected value sits far
    below."""
    def run(name: str, spin: int) -> tuple[Diagnosis, dict]:
        state = tmp_path / f"{name}-agent"
        (state / "spool").mkdir(parents=True)
        d = profile(tmp_path / name, [str(JOBS / "gemm_job.py"), "--steps", "50", "--report",
                                      str(tmp_path / f"{name}.json")], "--skip", "10",
                    env={"GPUDIAG_AGENT_DIR": str(state), "GPUDIAG_SIGNAL_INTERVAL": "2"},
                    spin=spin, spin_steps=25)
        sigs = [json.loads(f.read_text()) for f in (state / "spool").glob("*.json")]
        [last] = [s for s in sigs if s.get("ended")]
        return d, last

    quiet, quiet_sig = run("quiet", 0)
    busy, busy_sig = run("busy", 2)
    assert busy.mfu.wall_value is not None and busy.mfu.wall_value < 0.7 * quiet.mfu.value, (
        "the spinners slowed nothing", busy.mfu, quiet.mfu)
    ratio = busy_sig["mfu_ratio"] / quiet_sig["mfu_ratio"]
    assert 0.6 <= ratio <= 1.6, (ratio, busy_sig, quiet_sig)
    # and the diagnosis' MFU is at the job's own pace too, with the wall clock's beside it (issue 38)
    assert 0.6 <= busy.mfu.value / quiet.mfu.value <= 1.6, (busy.mfu, quiet.mfu)
    assert "other processes took" in busy.mfu.pace


def test_a_gpu_recording_without_the_wait_still_analyses_and_says_the_split_is_missing():
    """resnet_w14 (H200, recorded before the step timer read schedstat): analysed as before,
    with no wait charged, and the diagnosis says the split was not recorded."""
    d = diagnose(W14, jobs=1)
    assert d.host_wait is not None and not d.host_wait.recorded
    assert "not recorded" in d.host_wait.note
    assert d.host_wait.note in d.warnings
    assert d.breakdown.host_waiting == 0 and d.breakdown.host_stalled == 0
    assert d.verdict.label.value == "host-bound"
    assert "free-a-core" not in [r.action for r in d.verdict.recommendations]
    back = Diagnosis.from_json(d.to_json())
    assert back.host_wait == d.host_wait


def test_a_gpu_jobs_wait_for_a_core_is_kept_out_of_the_launch_overhead_advice(tmp_path):
    """The GPU path's arithmetic on a real H200 trace: resnet_w14 copied with 12 ms of wait for a
    core written into each step row (what a GPU session would record; the real figure is still
    to be measured). Each traced step's host gaps hold it (up to all of them); its host sampler
    says the job's 14 workers held nearly all the busy cores, so it is the job's own
    contention: CUDA graphs' prediction leaves it in the step, and freeing a core is advised
    with a prediction from that part alone."""
    run = tmp_path / "w14"
    shutil.copytree(W14, run)
    steps = run / "samples" / "steps-rank-0.jsonl"
    rows = [json.loads(x) for x in steps.read_text().splitlines()]
    for r in rows:
        r["wait_s"] = min(0.012, r["dt"] / 2)
        r["run_s"] = r["dt"] - r["wait_s"]
    steps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = diagnose(run, jobs=1)
    w = d.host_wait
    assert w.recorded and w.untraced_wait_us == pytest.approx(12e3, rel=1e-6)
    assert w.own_share >= 0.8, w.note  # 14 busy workers against a quiet rest of the machine
    # each traced step's host gaps hold its row's wait, and the part other processes caused (the
    # row's machine share at the job's own pace, gpudiag.pace) as host_stalled
    boot = read_bootstrap(run)
    own = at_own_pace(read_steps(run, boot), read_host_cpu(run), boot)
    [win] = [x for x in window_steps(run, boot=boot, steps=own) if x.rank == 0]
    assert len(win.traced_rows) == len(d.ranks[0].steps)
    for s, r in zip(d.ranks[0].steps, win.traced_rows, strict=True):
        b = s.breakdown
        assert b.host_waiting == pytest.approx(min(12e3, b.host_overhead))
        share = r.machine_s / (r.dt + r.machine_s)
        assert 0 <= share < 0.2, share  # the workers' contention is the job's own
        assert b.host_stalled == pytest.approx(min(share * b.step_time, b.host_waiting))
    u = d.unprofiled
    assert u is not None and u.host_waiting == pytest.approx(min(12e3, u.host_overhead))
    recs = {r.action: r for r in d.verdict.recommendations}
    assert "free-a-core" in recs, list(recs)
    free = recs["free-a-core"]
    assert free.predicted_step_s == pytest.approx((u.step_time - (u.host_waiting - u.host_stalled)) * 1e-6)
    graphs = recs.get("cuda-graphs-or-compile")
    if graphs is not None:  # the job's own launch overhead alone: the wait stays in its step
        # (compile also fuses memory-bound runs: at most their time)
        assert (graphs.predicted_step_s * 1e6
                >= u.step_time - (u.host_overhead - u.host_waiting) - u.memory_bound - 1)
        assert "waited for a core" in graphs.why
    # shown as measured: a row of its own under the host overhead, and the sentence
    text = render_terminal(d)
    assert "waiting for a core" in text and "Host time: the training thread waited" in text
    page = render_report(d)
    assert "training thread waiting for a core" in page and 'class="host-wait"' in page
