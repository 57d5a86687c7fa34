"""Fewer intra-op threads where other processes leave a CPU job fewer cores than it has threads,
and not elsewhere (``analyzers.advice_threads``)."""

from __future__ import annotations

import dataclasses
import shutil
import statistics
from pathlib import Path

from gpudiag.analyzers.advice import recommend
from gpudiag.analyzers.classify import HOST_NOTABLE
from gpudiag.analyzers.compile_facts import CompileFacts
from gpudiag.analyzers.diagnose import diagnose
from gpudiag.diagnosis import Bottleneck, HostWait, JobTraits
from gpudiag.pace import at_own_pace
from gpudiag.rundir import BootstrapMeta, read_host_cpu, read_steps
from tests.paths import TESTS
from tests.unit.test_advice_rules import breakdown, inputs

# blind check 21's job A (JSON parsing in the training process, torch's 2 threads, a 2-core
# VM at load 3-8): the job used 0.61 cores, other processes 1.39, and took 66.8 ms of each
# 102 ms untraced step; one thread ran it at 0.14x its mean step
PARSING = breakdown(35e3, input_wait=4e3, compute_bound=8e3, memory_bound=18e3)
CROWDED = JobTraits(training=True, optimizer=True, single_process_loader=True, cores_used=0.61,
                    cpus=2, intra_op_threads=2, other_cores=1.39, cpu_step_s=0.102)
MACHINE = HostWait(recorded=True, note="", untraced_machine_us=66.8e3, untraced_wall_us=102e3)


def advice(traits: JobTraits, wait: HostWait | None, device: str = "cpu") -> list[str]:
    a = dataclasses.replace(inputs(PARSING, traits=traits, label=Bottleneck.MEMORY), host_wait=wait,
                            device_kind=device)
    return [r.action for r in recommend(a).advised]


def test_a_cpu_job_whose_threads_outnumber_the_cores_others_leave_is_told_to_use_fewer_first():
    a = dataclasses.replace(inputs(PARSING, traits=CROWDED, label=Bottleneck.MEMORY), host_wait=MACHINE)
    advised = recommend(a).advised
    assert advised[0].action == "fewer-intra-op-threads" and len(advised) > 1, [r.action for r in advised]
    [rec] = [r for r in advised if r.action == "fewer-intra-op-threads"]
    # the workers, where listed, are told to go with fewer threads (blind check 23: one worker
    # alone 0.68-1.69x beside busy loops, with one thread 0.17-0.36x)
    for w in [r for r in [*advised, *recommend(a).not_advised] if r.action == "dataloader-workers"]:
        assert ("torch.set_num_threads(1) in the training process, not in the workers" in w.text
                or "set_num_threads" in w.why), w
    assert "torch.set_num_threads(1)" in rec.text and "66.8 ms of each 102 ms" in rec.text, rec.text
    # short operators (none counted here): the untraced step at the job's own pace, from that step
    assert rec.step_s == 0.102 and abs(rec.predicted_step_s - (102e3 - 66.8e3) * 1e-6) < 1e-9, rec
    assert rec.best_step_s is None and "its own pace" in rec.why, rec.why


def test_threads_that_have_their_cores_or_a_machine_that_takes_little_are_not_told_it():
    """An idle machine (the threads have their cores: fewer would leave one idle), other
    processes' part under a tenth of the step and no thread waiting as long, one thread
    already, or a GPU job whose DataLoader has workers."""
    idle = dataclasses.replace(CROWDED, cores_used=1.9, other_cores=0.05)
    assert "fewer-intra-op-threads" not in advice(idle, MACHINE)
    little = HostWait(recorded=True, note="", untraced_machine_us=8e3, untraced_wall_us=102e3)
    assert "fewer-intra-op-threads" not in advice(CROWDED, little)
    assert "fewer-intra-op-threads" not in advice(dataclasses.replace(CROWDED, intra_op_threads=1), MACHINE)
    assert "fewer-intra-op-threads" not in advice(CROWDED, None)
    gpu_job = dataclasses.replace(CROWDED, single_process_loader=False)  # the threads feed no loader
    assert "fewer-intra-op-threads" not in advice(gpu_job, MACHINE, device="gpu")


def test_the_count_is_the_whole_cores_left():
    """Eight threads, 2.4 of 8 cores left: two threads."""
    many = dataclasses.replace(CROWDED, cpus=8, intra_op_threads=8, cores_used=2.4, other_cores=5.6)
    a = dataclasses.replace(inputs(PARSING, traits=many, label=Bottleneck.MEMORY), host_wait=MACHINE)
    [rec] = [r for r in recommend(a).advised if r.action == "fewer-intra-op-threads"]
    assert "torch.set_num_threads(2)" in rec.text, rec.text


def test_a_recorded_job_whose_two_threads_had_the_idle_machines_two_cores_is_not_told_it(tmp_path: Path):
    """Blind check 20's job (2 threads, a worker, the idle 2-core VM: 2.0 cores left to it)."""
    copy = tmp_path / "run"
    shutil.copytree(TESTS / "fixtures" / "cpu-fft-worker-own-stalls", copy)
    d = diagnose(copy, jobs=1)
    assert d.traits.intra_op_threads == 2 and d.traits.cores_used is not None
    assert "fewer-intra-op-threads" not in [r.action for r in d.verdict.recommendations]


# The H200 ResNet-50 of 2026-11-30 (tests/fixtures/h200-2026-11-30/dlbusy, its README): a
# num_workers=0 loader on 16 intra-op threads, 16 cores, beside four busy loops; 507 ms a step
# alone, 18.3 s here. The run was cut before its trace (and its bootstrap file), so the advice's
# inputs come from its recorded step rows and host samples through the pace's own code, with the
# bootstrap the job's command line and the device give: 16 cores, 16 threads, num_workers=0.
H200_RUN = TESTS / "fixtures" / "h200-2026-11-30" / "dlbusy"


def h200_loader() -> tuple[JobTraits, HostWait]:
    boot = {0: BootstrapMeta(rank=0, cpus=16, intra_op_threads=16, dataloader_workers=[0])}
    rows = read_steps(H200_RUN, boot)
    host = read_host_cpu(H200_RUN)
    own = [r for r in at_own_pace(rows, host, boot)[0] if r.step > 2]
    span = [h for h in host if own[0].t - own[0].dt - own[0].machine_s <= h.t <= own[-1].t]
    other = statistics.median(h.machine_busy - h.cores for h in span if h.machine_busy is not None)
    wall = statistics.median(r.dt + r.machine_s for r in own)
    traits = JobTraits(training=True, optimizer=True, single_process_loader=True,
                       cores_used=statistics.median(h.cores for h in span), cpus=16, intra_op_threads=16,
                       other_cores=other, cpu_step_s=wall)
    return traits, HostWait(recorded=True, note="", untraced_wall_us=wall * 1e6,
                            untraced_machine_us=(wall - statistics.median(r.dt for r in own)) * 1e6)


def test_a_gpu_jobs_loader_threads_crowded_by_other_processes_are_told_and_the_count_is_the_cores_left():
    """The GPU job's loading runs on its 16 intra-op threads (num_workers=0): beside the loops,
    fewer threads leads, as for a CPU job, and the count is the cores the loops leave, not the
    cores the job's spinning process used. With the machine's part under a tenth, not told."""
    traits, wait = h200_loader()
    assert wait.untraced_machine_us >= HOST_NOTABLE * wait.untraced_wall_us, wait  # the recorded case
    loading = breakdown(18.3e6, input_wait=17.5e6, compute_bound=0.4e6, memory_bound=0.4e6)
    a = dataclasses.replace(inputs(loading, traits=traits, label=Bottleneck.INPUT), host_wait=wait,
                            device_kind="gpu")
    advised = recommend(a).advised
    assert advised[0].action == "fewer-intra-op-threads", [r.action for r in advised]
    assert "torch.set_num_threads(12)" in advised[0].text, advised[0].text
    assert "its DataLoader's work runs on them" in advised[0].text, advised[0].text
    # its threads' spinning, not a wait, was the 36x: no pace reads it, so no prediction
    assert advised[0].predicted_step_s is None and "a run with it applied tells" in advised[0].why
    little = dataclasses.replace(wait, untraced_machine_us=0.05 * wait.untraced_wall_us)
    advised = recommend(dataclasses.replace(a, host_wait=little)).advised
    assert "fewer-intra-op-threads" not in [r.action for r in advised]


def test_fewer_threads_lead_only_where_the_operators_are_short():
    """Blind check 24 beside two busy loops: one thread ran 0.37-0.90x on three jobs whose traced
    operators took 66-242 us a call, and 0.96-1.00x on a 2048-wide MLP at 5.9 ms a call, whose
    lower-precision entry ran 0.68-0.73x. Blind check 26's 1D conv net, five 86 ms convolutions
    a step among ~400 short calls (2 ms a call on average), ran 0.92x with one thread and 0.59x
    in bf16. Long is by the operators' typical (median) call, weighted by their time
    (``CompileFacts.long_us`` of ``typical_us``): the small-op model leads with fewer threads;
    the conv net lists it after the fixes with a prediction, says why, and states a range."""
    small = CompileFacts(calls=1411, kept_calls=1620, step_us=199.1e3, typical_us=80e3, long_us=0.0)
    conv = CompileFacts(calls=150, kept_calls=250, step_us=808e3, typical_us=700e3, long_us=640e3)
    base = dataclasses.replace(inputs(PARSING, traits=CROWDED, label=Bottleneck.MEMORY), host_wait=MACHINE)
    first = recommend(dataclasses.replace(base, compile_facts=small)).advised
    assert first[0].action == "fewer-intra-op-threads", [r.action for r in first]
    later = recommend(dataclasses.replace(base, compile_facts=conv)).advised
    actions = [r.action for r in later]
    assert "fewer-intra-op-threads" in actions and actions[0] != "fewer-intra-op-threads", actions
    rec = later[actions.index("fewer-intra-op-threads")]
    assert "Its operators are long (91% of their time in operators of 2 ms a call or more" in rec.text, \
        rec.text
    assert "gain little" not in rec.text  # blind check 25: one thread still ran 0.67x and 0.80x there
    # a range: from the own pace (35.2 ms of 102) to today's step, the middle shown
    assert abs(rec.best_step_s - 35.2e-3) < 1e-9 and abs(rec.predicted_step_s - (35.2e-3 + 0.102) / 2) < 1e-9
    assert "its other end" in rec.why and "operators are long" in rec.why, rec.why
    # under half the typical time in long operators: short
    half = dataclasses.replace(conv, long_us=0.45 * conv.typical_us)
    half_first = recommend(dataclasses.replace(base, compile_facts=half)).advised[0]
    assert half_first.action == "fewer-intra-op-threads", half_first
