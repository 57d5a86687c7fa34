"""The diagnosis of jobs it was never tuned on, on a machine other work shares.

Held-out CPU jobs built here (tests/jobs, not the benchmark workloads the labels were tuned
on), run for real under ``gpudiag profile``, each timing its own steps:
- a job slowed by a competing process in its first steps keeps its label, and its MFU follows
  its own timer, not the slowed steps;
- time the OS ran another process while the job's operators waited is shown apart from the
  job's host overhead, and a big operator sharing its name with small ones is not such a stall;
- a bf16 job is judged against the CPU's bf16 peak (AMX here), not the fp32 one;
- 2-rank DDP over gloo has its collectives in every step row, and the breakdown, the
  collectives table and the advice quote one exposed-communication figure.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analyzers import intervals as iv
from gpudiag.analyzers.breakdown import stalls
from gpudiag.analyzers.classify import HOST_NOTABLE
from gpudiag.analyzers.classify import shares as view_shares
from gpudiag.analyzers.trace_loader import load_rank
from gpudiag.analyzers.unprofiled import LOAD_CHANGE_MAX
from gpudiag.diagnosis import Bottleneck, Diagnosis
from gpudiag.pace import at_own_pace
from gpudiag.rundir import read_bootstrap, read_host_cpu, read_steps
from tests.conftest import labels_of, view_mfu
from tests.harness import torchrun, torchrun_failure, torchrun_ran
from tests.paths import TESTS

# Each test here makes its own competitor (spinners, CPU slices) and compares with its own quiet
# run: another test's load beside it would be a competitor it did not make, so `make test` runs
# these after the parallel lanes, alone (their folder, system/alone, marks them solo).

JOBS = TESTS / "jobs"
MFU_TOLERANCE = 0.15  # relative, as the issue asks
# the DataLoader job's own host overhead, at most this share of its big adds: 0.52-0.65x on the
# 2-core AMD EPYC VMs of the issue, 1.05x on a Zen 5 one (avx512_bf16; its adds 3.8 ms, its
# Python 4.0 ms a step); the adds read as host overhead put it at their own share plus that,
# 1.55x or more on the issue's VM (host 8.7-12.4 ms over adds of 4.7-5.6) and 2x on the Zen 5
HOST_OVERHEAD_OF_ADDS = 1.4
ADDS_CUT_AS_STALLS = 0.5  # the share of its big adds' time the stall cut may take (the bug: 0.99)


def profile(tmp: Path, name: str, job: str, *args: str, opts: tuple[str, ...] = (),
            ranks: int = 1) -> tuple[Diagnosis, dict, Path]:
    run, own = tmp / name, tmp / f"{name}-own.json"
    cmd = [str(JOBS / job), *args, "--report", str(own)]
    if ranks > 1:
        cmd = [*torchrun(ranks), *cmd]
    else:
        cmd = [sys.executable, *cmd]
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), *opts, "--",
                           *cmd], capture_output=True, text=True, timeout=600)
    # a torchrun job runs to its end where a rank gloo's teardown aborted once the job's report
    # was written (``torchrun_ran``; the DDP test's rank 0 did so beside a busy loop in a clean
    # clone's run, 2026-12-02: "terminate called without an active exception")
    assert proc.returncode == 0 or (ranks > 1 and torchrun_ran(proc, wrote=own)), torchrun_failure(proc)
    return Diagnosis.from_json((run / "diagnosis.json").read_text()), json.loads(own.read_text()), run


def own_mfu(d: Diagnosis, own: dict, steps: set[int], run: Path, statistic=statistics.median) -> float:
    """Analytic FLOPs over ``statistic`` of the job's own timings of ``steps`` (1-based), each less
    the part other processes took of it (gpudiag's step timer: the job's own pace, as
    ``Mfu.value``), at the peak the diagnosis used."""
    boot = read_bootstrap(run)
    machine = {r.step: r.machine_s for r in at_own_pace(read_steps(run, boot), read_host_cpu(run), boot)[0]}
    times = [t - machine.get(i + 1, 0.0) for i, t in enumerate(own["step_seconds"]) if i + 1 in steps]
    return own["flops_per_step"] / statistic(times) / d.mfu.peak_flops


@pytest.fixture(scope="module")
def quiet_gemm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Diagnosis, dict, Path]:
    """The fp32 GEMM job alone (no competitor), window at step 51 as the slowed run's."""
    return profile(tmp_path_factory.mktemp("quiet"), "quiet", "gemm_job.py", "--steps", "80",
                   opts=("--skip", "50"))


@pytest.fixture(scope="module")
def bf16_gemm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Diagnosis, dict, Path]:
    """The GEMM job under bf16 autocast. Where this CPU's bf16 GEMM is no faster than fp32 (no
    AMX: 3 GFLOP/s through autocast on the 2-core AMD EPYC VM, 1.35 s a step, 71 s for this run
    in CI), the MFU test skips and the catalogue only needs its dtype: a batch of 32 and fewer
    steps (8 s)."""
    from gpudiag.collectors.cpu_peak import cpu_peak

    peaks = cpu_peak().flops
    fast = peaks.get("bf16", 0.0) > 1.5 * peaks["fp32"]
    size = ("--steps", "50") if fast else ("--steps", "24", "--batch", "32")
    return profile(tmp_path_factory.mktemp("bf16"), "bf16", "gemm_job.py", *size,
                   "--dtype", "bf16", opts=("--skip", "30" if fast else "10"))


@pytest.fixture(scope="module")
def eager_chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Diagnosis, dict, Path]:
    """An inference loop of many small ops (no optimizer, not compiled), as long as the slowed
    runs below (90 steps, window at step 61): the diagnosis reads up to ten untraced steps a side
    of its window and the host samples over the rest (200 steps had run 110 more, 6.3 s of the
    solo pass, that no reading needed)."""
    return profile(tmp_path_factory.mktemp("chain"), "chain", "chain_job.py", "--steps", "90",
                   opts=("--skip", "60"))


def same_label(a: Diagnosis, b: Diagnosis) -> bool:
    """The same label, or one verdict's label is the other's tie partner."""
    return bool(labels_of(a.verdict) & labels_of(b.verdict))


def test_a_job_slowed_by_a_competitor_in_its_first_steps_keeps_its_label_and_its_mfu(tmp_path, quiet_gemm):
    """A spinning process shares the job's core for its first 40 of 80 steps, then leaves; the
    trace window opens at step 51. The untraced steps around the window ran after the competitor
    left, as the traced ones did, so the estimate stands on them: its MFU is within 15% of the
    job's own timer over the steps after the competitor left (taking all untraced steps as the
    reference, as gpudiag did, would have mixed the slowed half in)."""
    quiet = quiet_gemm[0]
    d, own, run = profile(tmp_path, "slowed", "gemm_job.py", "--steps", "80", "--compete-steps", "40",
                          opts=("--skip", "50"))
    slowed = own["step_seconds"][2:40]
    after = [t for i, t in enumerate(own["step_seconds"]) if i >= 40 and not (50 <= i <= 57)]
    assert statistics.median(slowed) > 1.3 * statistics.median(after), "the competitor slowed nothing"
    assert same_label(d, quiet), (d.verdict.summary, quiet.verdict.summary)
    touched = {r.step for r in read_steps(run)[0] if r.profiler}
    truth = own_mfu(d, own, set(range(41, 81)) - touched, run)
    assert d.mfu.value is not None and abs(d.mfu.value / truth - 1) <= MFU_TOLERANCE, (
        d.mfu.value, truth, d.basis, d.dilation)


def test_a_window_the_machine_slowed_keeps_the_gaps_torch_compile_would_remove(tmp_path, eager_chain):
    """The small-operator chain again, with another process cutting its CPU into 0.3 ms slices
    over the trace window alone (steps 61-66): every operator ran about 2x slower there, none
    stalled, and the steps around the window give no sign of it. Charged to the profiler per
    event, that slow-down left the gaps between the small operators empty (0 ms in six runs of
    the compile case; torch.compile's gain read as what fusing memory-bound work saves); brought
    to the reference's pace (``unprofiled.DISPATCH_PER_EVENT_MIN``), they keep most of what the
    quiet run's hold, and where they are still over the advice's threshold, torch.compile is
    advised. (On an AMD EPYC the quiet run's gaps are 10.9% of its step, a point over that
    threshold, and the slowed run's 6.7%: whether the advice appears there is within the noise,
    so the test holds the gaps, which the old model emptied, and the advice only where they
    reach the threshold.)"""
    quiet = eager_chain[0]
    d, own, _ = profile(tmp_path, "slowed-chain", "chain_job.py", "--steps", "90", "--compete", "61:66",
                        "--compete-kind", "slices", opts=("--skip", "60"))
    times = own["step_seconds"]
    assert statistics.median(times[61:66]) > 1.5 * statistics.median(times[45:60]), "nothing slowed it"
    # the premise: the steps around the window give no sign of the slow-down. A CI clone's solo
    # lane ran the steps after it 20% slower than those before (56 against 46.7 ms, no page fault
    # on either side), and 1 of 4 runs on the quiet VM 15.5% (49.7 against 57.4 ms by the job's
    # own timer): the job's pace moved, and gpudiag rightly fell back to the profiled steps.
    # Judged by the job's own timer, on the untraced steps on either side
    before, after = statistics.median(times[45:60]), statistics.median(times[68:83])
    if max(before, after) / min(before, after) - 1 > LOAD_CHANGE_MAX:
        pytest.skip(f"the job's pace moved across the window: its own steps ran "
                    f"{before * 1e3:.3g} ms before it and {after * 1e3:.3g} ms after it")
    assert d.basis == "unprofiled-estimate", d.dilation.caveats
    # the window's slow-down is found: as the machine's part of its steps where other processes
    # held the cores (the job's own pace, issue 38: on a busy machine most of it), else through
    # the gaps (the competitor is the job's own child, so its part stays in the window)
    paces = [float(m) for c in d.dilation.caveats for m in re.findall(r"ran ([\d.]+)x slower", c)]
    own_pace = d.host_wait.traced_machine_us or 0.0
    assert (paces and paces[0] > 1.3) or own_pace >= 0.3 * d.breakdown.step_time, (
        d.dilation.caveats, own_pace)
    # (the quiet run's own reference can be unsteady on this VM: 1 run in 7; then its traced
    # gaps brought to its untraced step stand for it)
    ref = (quiet.unprofiled.host_overhead if quiet.unprofiled is not None
           else quiet.breakdown.host_overhead * quiet.dilation.untraced_step_us / quiet.breakdown.step_time)
    # The margin, from four pairs of runs on the 2-core AMD EPYC: the quiet run's gaps are
    # bimodal (3.7 or 11.2-11.6 ms a step), the slowed run's 3.7-6.3 ms, so the slowed run kept
    # 0.32-1.7x of the quiet run's; the old model kept 0 in six runs. A fifth is the bound: 1.6x
    # under the lowest ratio seen, and still far from the empty gaps this test guards against.
    assert d.unprofiled.host_overhead >= ref / 5, (d.unprofiled.host_overhead, ref)
    # where they are notable, compile is weighed: advised, or listed as a fix that would not
    # help where its predicted gain is under 1% (issue 37's never-slower rule; a CI clone run
    # at load 4 listed it so)
    weighed = [r.action for r in [*d.verdict.recommendations, *d.verdict.not_advised]]
    if view_shares(d.unprofiled)[Bottleneck.HOST] >= HOST_NOTABLE:
        assert "compile-small-ops" in weighed, weighed
    assert same_label(d, quiet), (d.verdict.summary, quiet.verdict.summary)


def test_time_the_os_ran_another_process_is_not_read_as_the_jobs_host_overhead(tmp_path):
    """A process spinning on the job's core over the trace window alone: the scheduler gives
    each a few milliseconds in turn, so some of the job's 10 us operators took milliseconds
    (measured: 9.7 and 15.3 ms per traced step). That time sits in the host gaps the cut leaves,
    but it is the machine's load: the verdict's host share and the advice leave it out
    (a traced view on a busy machine read it as dispatch overhead torch.compile would remove),
    and the estimate of the job unobserved drops it with the profiler's cost."""
    d, own, run = profile(tmp_path, "os-chain", "chain_job.py", "--steps", "90", "--compete", "61:66",
                        "--compete-kind", "cpu", opts=("--skip", "60"))
    times = own["step_seconds"]
    assert statistics.median(times[61:66]) > 1.5 * statistics.median(times[45:60]), "nothing slowed it"
    b = d.breakdown
    assert 1e3 <= b.host_stalled <= b.host_overhead, (b.host_stalled, b.host_overhead)
    assert any("the OS ran other work" in w for w in d.warnings), d.warnings
    traced = d.traced_verdict or d.verdict
    assert traced.evidence["host-bound share"] == pytest.approx(  # of the job's own step (issue 38)
        (b.host_overhead - b.host_stalled) / (b.step_time - b.host_stalled), abs=1e-4), traced.evidence
    # and the label of the traced steps rests on the rest of them: it costs confidence
    assert any(x.reason.startswith("the OS ran other work") and x.amount >= 0.01
               for x in traced.deductions), traced.deductions
    if d.unprofiled is not None:  # the steps around the window ran without the competitor:
        # the estimate holds no stall but what other processes took of those steps themselves
        rows = at_own_pace(read_steps(run), read_host_cpu(run), read_bootstrap(run))[0]
        ref = [r for r in rows if r.step in set(d.dilation.reference_steps)]
        machine = 1e6 * (statistics.median(r.dt + r.machine_s for r in ref)
                         - statistics.median(r.dt for r in ref))
        assert d.unprofiled.host_stalled <= 0.1 * b.host_stalled + machine + 1e-6, (d.unprofiled, machine)


def test_a_weights_gradient_is_work_though_the_biases_adds_share_its_name(tmp_path):
    """``aten::add_`` accumulates a 2048x2048 weight's gradient in about 2.5 ms and a bias's in
    10 us: taken by name alone, the big ones were 20x their kind's median and cut as stalls of
    the OS, and their memory traffic read as host overhead (the DataLoader job: 8.7-12.4 ms of
    its host time per step in 13 runs). A kind is the name and its input shapes.

    Judged on the big adds themselves, not on the run's stall total: the machine's other work
    stalls the job for real (2.4-3.2 ms per step in runs beside other engineers' jobs here), and
    that is not the bug."""
    d, _, run = profile(tmp_path, "feed", "feed_job.py", "--steps", "30", "--workers", "0",
                        "--read-ms", "20", "--passes", "4", opts=("--skip", "10"))
    [trace] = (run / "traces").glob("rank-*.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    steps = sum(1 for e in events if e.get("name", "").startswith("ProfilerStep#"))

    def big_add(e: dict) -> bool:
        dims = e.get("args", {}).get("Input Dims") or [[]]
        return e.get("name") == "aten::add_" and len(dims[0]) == 2 and dims[0][0] * dims[0][1] >= 1 << 20

    big = [e for e in events if big_add(e)]
    adds = sum(e["dur"] for e in big) / steps
    # the gradients and the optimizer's updates of the two big weights: 4.7-5.6 ms per step on
    # the 2-core AMD EPYC VM; a bias's add is ~10 us. 1 ms says they are there, on a faster CPU too.
    assert adds > 1e3, adds
    # name-only kinds cut each big add but its kind's 10 us median: 0.99x the adds. Right, none
    # is cut on a quiet machine; a busy one may stall an add 20x its own median now and then.
    cut = iv.measure_in(stalls(load_rank(trace)), [e["ts"] for e in big],
                        [e["ts"] + e["dur"] for e in big]).sum() / steps
    assert cut < ADDS_CUT_AS_STALLS * adds, (cut, adds)
    # the job's own host overhead (less the OS's stalls) is its ~3 ms of Python, not the adds:
    # 0.52-0.54x the adds on a 2-core AMD EPYC in the issue, 0.58-0.65x in 4 runs on another,
    # under 0.5x on Intel Xeon, 1.05x on a Zen 5 EPYC whose adds are faster (HOST_OVERHEAD_OF_ADDS)
    b = d.breakdown
    assert b.host_overhead - b.host_stalled < HOST_OVERHEAD_OF_ADDS * adds, (b, adds)


def test_a_bf16_job_is_judged_against_the_bf16_peak(bf16_gemm):
    """bf16 autocast on this CPU runs its GEMMs on AMX, several times the fp32 rate: MFU against
    the fp32 peak read 3-5x too high. Its FLOPs ran in bf16 (the ops' input types say so), so
    MFU is against the measured bf16 peak, within 15% of the job's own analytic MFU."""
    d, own, run = bf16_gemm
    peaks = d.device.peak_flops
    assert d.mfu.dtype_family == "bf16" and d.mfu.dtype_mix == {"bf16": 1.0}, d.mfu
    assert d.mfu.peak_flops == pytest.approx(peaks["bf16"])
    if peaks["bf16"] <= 1.5 * peaks["fp32"]:
        pytest.skip(f"this CPU's bf16 GEMM ({peaks['bf16'] / 1e9:.0f} GFLOP/s) is no faster than fp32")
    truth = view_mfu(d, own, run)
    assert abs(d.mfu.value / truth - 1) <= MFU_TOLERANCE, (d.mfu.value, truth, d.mfu.reason)
    # and no advice to do what it already does
    assert not {"lower-precision", "bf16-activations"} & {r.action for r in d.verdict.recommendations}


def test_ddp_over_gloo_has_collectives_in_every_step_row_and_one_exposed_figure(tmp_path):
    """DDP's reducer all-reduces buckets from C++ on gloo's threads, past any Python wrapper:
    the bootstrap times them through a communication hook, every step. The trace's gloo
    all-reduces run beside backward; only what no compute hides is exposed, and the breakdown,
    the collectives table and the recommendation give that one figure."""
    d, _, run = profile(tmp_path, "ddp", "ddp_bucket_job.py", "--steps", "30", "--bucket-mb", "256",
                        opts=("--skip", "12"), ranks=2)
    for rank, rows in read_steps(run).items():
        assert len(rows) == 30, rank
        for r in rows:
            ar = r.collectives.get("all_reduce")
            assert ar and ar["count"] >= 1 and ar["seconds"] > 0 and 0 <= ar["exposed"] <= r.dt, (rank, r)
    view = d.unprofiled if d.basis == "unprofiled-estimate" else d.breakdown
    assert view.comm_exposed > 0
    table = sum(c.exposed_per_step_us for c in d.communication)
    assert table == pytest.approx(view.comm_exposed, rel=1e-6)
    assert all(c.exposed_time_us <= c.total_time_us for c in d.communication)
    figure = f"{view.comm_exposed / 1e3:.3g} ms exposed per step"
    # advised where overlapping is predicted to help; where what gloo's threads cost the compute
    # beside it (measured) eats the gain, listed as a fix that would not help (issue 37)
    [comm] = [r for r in [*d.verdict.recommendations, *d.verdict.not_advised]
              if r.action == "overlap-communication"]
    assert figure in comm.text and "bucket_cap_mb" in comm.text, comm.text
    assert d.traits.ddp and d.traits.training


# -- advice for the job in front of it ----------------------------------------------------------



def actions(d: Diagnosis) -> set[str]:
    return {r.action for r in d.verdict.recommendations}


def shares(d: Diagnosis) -> dict[str, float]:
    return {k.removesuffix(" share"): v for k, v in d.verdict.evidence.items() if k.endswith(" share")}


@pytest.fixture(scope="module")
def gpu(traces: Path) -> dict[str, Diagnosis]:
    from gpudiag.analyzers.diagnose import diagnose

    return {name: diagnose(traces / name, jobs=1)
            for name in ("a100-nccl-2rank", "a100-triton", "v100-16gb-diff", "a100-alexnet", "mi250")}


@pytest.fixture(scope="module")
def gpt() -> Diagnosis:
    from gpudiag.analyzers.diagnose import diagnose
    from tests.conftest import SHARED

    return diagnose(SHARED / "runs" / "h100-gpt-small", jobs=1)


def test_every_recommendation_in_the_catalogue_has_a_job_it_must_not_be_given_to(
        gpu, gpt, quiet_gemm, bf16_gemm, eager_chain):
    """Each fix is absent where the trace shows it does not apply, on real traces and jobs
    whose bottleneck it would otherwise address (the share it works on is notable there)."""
    from gpudiag.analyzers.advice import ACTIONS

    cpu_fp32, cpu_bf16, chain = quiet_gemm[0], bf16_gemm[0], eager_chain[0]
    assert chain.traits.optimizer is False and chain.traits.training is False
    assert gpu["a100-triton"].traits.compiled and gpu["v100-16gb-diff"].traits.compiled
    assert gpt.traits.sdpa and gpt.mfu.dtype_family == "bf16"
    # (diagnosis, actions that must not appear, why)
    cases = [
        # an inference loop has no optimizer, and a single-process job nothing to all-reduce
        (chain, {"fused-optimizer", "overlap-communication", "all-reduce-less-often", "fix-straggler",
                 "dataloader-workers", "cheaper-input", "checkpoint-less-often",
                 "larger-micro-batches", "compile-optimizer-step", "allocator-keep-memory"},
         "inference, one rank, no DataLoader, no torch.save, no micro-batches, no MB-sized temporaries"),
        (gpu["a100-alexnet"], {"fused-optimizer"}, "inference on a GPU"),
        # a CPU job is not told about CUDA graphs, pinned copies, tensor cores, fused attention
        (chain, {"cuda-graphs-or-compile", "cuda-graphs", "remove-host-syncs", "pinned-async-copies",
                 "tensor-core-shapes", "fused-attention", "batch-small-ops",
                 "unblock-training-thread"}, "CPU, not compiled, no blocking call"),
        (cpu_fp32, {"tensor-core-shapes", "fused-attention", "pinned-async-copies", "fp32-instead",
                    "vectorise-sample-loop"},
         "CPU GEMMs in fp32, no Python loop over samples"),
        # a compiled job is not told to compile
        (gpu["a100-triton"], {"cuda-graphs-or-compile", "compile-small-ops"}, "compiled, host-bound"),
        (gpu["v100-16gb-diff"], {"fuse-memory-bound"}, "compiled, memory-bound"),
        # a GPU job is not given the CPU's small-op advice, nor the compiled one's if not compiled
        # and host gaps with no wait for a core recorded are not read as cores its threads hold
        (gpu["a100-nccl-2rank"], {"compile-small-ops", "batch-small-ops", "remove-host-syncs",
                                  "cuda-graphs", "free-a-core", "fewer-intra-op-threads",
                                  "omp-wait-policy"},
         "GPU, host-bound, not compiled"),
        # a bf16 job is not told to use bf16; one on SDPA not told to use it; low MFU is not near peak
        (gpt, {"lower-precision", "bf16-activations", "fused-attention", "fewer-flops"},
         "bf16, SDPA, MFU 20%"),
        (cpu_bf16, {"lower-precision", "bf16-activations"}, "bf16 on the CPU"),
        # an optimizer already fused or foreach
        (gpu["mi250"], {"fused-optimizer", "overlap-communication", "fix-straggler"},
         "fused optimizer, one rank"),
    ]
    covered = set()
    for d, absent, why in cases:
        given = actions(d)
        assert not given & absent, (why, given & absent, d.verdict.summary)
        covered |= absent
    assert covered == set(ACTIONS), set(ACTIONS) - covered
    # the negatives above are not empty checks: the shares those fixes work on are notable there
    assert shares(gpu["a100-triton"])["host-bound"] >= 0.1
    assert shares(gpu["v100-16gb-diff"])["memory-bound"] >= 0.1
    assert shares(gpt)["memory-bound"] >= 0.1 and shares(gpt)["compute-bound"] >= 0.1
    assert shares(gpu["a100-alexnet"])["host-bound"] >= 0.1
    assert shares(cpu_fp32)["compute-bound"] + shares(cpu_fp32)["memory-bound"] >= 0.1


def test_cpu_advice_names_no_gpu_feature(quiet_gemm, bf16_gemm, eager_chain):
    """Seen: CPU jobs told to enable TF32, use tensor-core shapes and SDPA."""
    for d, _, _ in (quiet_gemm, bf16_gemm, eager_chain):
        text = " ".join(r.text for r in d.verdict.recommendations)
        for gpu_only in ("TF32", "tensor core", "tensor-core", "scaled_dot_product_attention",
                         "CUDA graph", "pin_memory", "non_blocking", "interconnect"):
            assert gpu_only not in text, (gpu_only, text)


def test_the_advice_that_applies_is_given_ranked_by_predicted_gain(gpu, eager_chain):
    """Where the fix applies it is there, with a prediction; the fixes for the verdict's label
    come first, and each group is ranked by predicted gain (issue 37: the first fix fits the
    verdict); none listed predicts a step that is not faster."""
    from gpudiag.analyzers.advice import CATALOGUE

    # compiled, host-bound, one sync a step that costs nothing: CUDA graphs, not "remove syncs"
    assert gpu["a100-triton"].syncs.share < 0.03
    assert "cuda-graphs" in actions(gpu["a100-triton"])
    assert "remove-host-syncs" not in actions(gpu["a100-triton"])
    assert "cuda-graphs-or-compile" in actions(gpu["a100-nccl-2rank"])
    addresses = {c.action: c.addresses for c in CATALOGUE}
    for d in (*gpu.values(), eager_chain[0]):
        labels = {d.verdict.label, d.verdict.tie_with}
        recs = d.verdict.recommendations
        fits = [addresses[r.action] in labels for r in recs]
        assert fits == sorted(fits, reverse=True), [(r.action, f) for r, f in zip(recs, fits, strict=True)]
        for group in ([r for r, f in zip(recs, fits, strict=True) if f],
                      [r for r, f in zip(recs, fits, strict=True) if not f]):
            gains = [r.gain for r in group if r.gain is not None]
            assert gains == sorted(gains, reverse=True), [(r.action, r.gain) for r in recs]
            first_none = next((i for i, r in enumerate(group) if r.gain is None), len(group))
            assert all(r.gain is None for r in group[first_none:])  # no prediction: after the others
        for r in recs:
            assert r.why, r
            if r.predicted_step_s is not None:
                assert 0 <= r.predicted_step_s < r.step_s, r


def test_workers_advice_tells_a_wait_on_storage_from_decoding(tmp_path):
    """The same input-bound job, its batch once read from slow storage (a sleep) and once
    decompressed (zlib): the host samples tell them apart, so the storage wait is told any
    number of workers may hide it, and the decoding is told the cores bound the step."""
    common = ("--workers", "0", "--passes", "1")
    # each job's untraced steps after its trace window span at least two of the host sampler's
    # 1 s intervals, whatever their phase: decoding steps ~35 ms on this project's 2-core EPYC VM,
    # and at 80 steps its 2.1 s after the window held one whole interval in a run (no cores
    # read, the advice's input missing)
    storage, _, _ = profile(tmp_path, "storage", "feed_job.py", *common, "--steps", "80",
                            "--read-ms", "60")
    decoding, _, _ = profile(tmp_path, "decoding", "feed_job.py", *common, "--steps", "160",
                             "--read-ms", "0", "--decode-mb", "30")
    for d in (storage, decoding):
        assert d.traits.single_process_loader and d.traits.cores_used is not None, d.traits
    [s] = [r for r in storage.verdict.recommendations if r.action == "dataloader-workers"]
    # decoding: workers are advised where the cores let them shorten the step; on a machine whose
    # other work leaves the job no core for them they would not help, and say so (issue 37)
    [c] = [r for r in [*decoding.verdict.recommendations, *decoding.verdict.not_advised]
           if r.action == "dataloader-workers"]
    assert "The wait is not CPU work" in s.text and "cannot do in less" not in s.why, (s, storage.traits)
    assert "Loading is CPU work here" in c.text, (c, decoding.traits)
    if c in decoding.verdict.not_advised:
        assert "no core of their own" in c.why, (c, decoding.traits)
        if decoding.verdict.label is Bottleneck.INPUT:  # the input advice that can help leads
            assert decoding.verdict.recommendations[0].action == "cheaper-input", decoding.verdict
    else:
        assert "cannot do in less" in c.why, (c, decoding.traits)
