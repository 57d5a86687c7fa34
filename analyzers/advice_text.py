"""The words of each piece of advice: what the job shows, and what to do about it. Each text
takes the advice's inputs and the view's shares (``classify.shares``); the catalogue that picks
them is ``advice``."""

from __future__ import annotations

from gpudiag.analyzers import advice_threads, page_faults, whatif
from gpudiag.analyzers.advice_inputs import (
    TENSOR_CORE_MULTIPLE,
    AdviceInputs,
    device_unit,
    faster_dtype,
    fastest_lower,
    has_workers,
    job_cpu,
    on_gpu,
    worker_count,
)
from gpudiag.analyzers.classify import STALLED_NOTED
from gpudiag.analyzers.compile_facts import optimizer_loop
from gpudiag.analyzers.op_flops import MODEL_OPS
from gpudiag.diagnosis import Bottleneck, Stragglers, TimeBreakdown
from gpudiag.units import ms, pct_whole


def of_step(a: AdviceInputs) -> str:
    """What a share in the advice is of: the step at the job's own pace (``classify.shares``),
    named so where other processes took part of the view's step and its rows (of the wall step)
    read otherwise. Blind check 17: "The DataLoader wait is 85% of step time" beside a
    breakdown row of 36%."""
    return ("of the step at the job's own pace" if a.view.fraction("host_stalled") >= STALLED_NOTED
            else "of step time")


def _loading(a: AdviceInputs, cpu: whatif.JobCpu | None) -> str:
    """What the wait costs in CPU, in words: decoding needs a core per worker, storage does not."""
    if cpu is None or not a.traits.single_process_loader:
        return ""
    used = whatif.loading_cores(a.view, cpu)
    if used >= whatif.CPU_LOADING:
        w = whatif.loader_work(a.view, cpu, on_gpu(a))
        beside = "its main thread" if on_gpu(a) else f"the model's {cpu.model_cores} thread(s)"
        busy = (f", on a core or waiting for one {pct_whole(cpu.loader_busy)} of its time in next(loader)"
                if cpu.loader_busy is not None else "")
        return (f" Loading is CPU work here ({ms(w.batch_us)} per batch on the thread that makes "
                f"it{busy}): workers share the {cpu.cpus} cores with {beside}, so the cores, not the "
                "number of workers, bound the step once the wait is hidden; decoding faster or on "
                "other machines goes further.")
    by = (f"the thread that makes the batch ran or waited for a core {pct_whole(cpu.loader_busy)} of its "
          "time in next(loader)" if cpu.loader_busy is not None
          else f"the job's processes use {cpu.cores_used:.2g} cores")
    return (f" The wait is not CPU work ({by}): workers waiting on storage need no core of their own.")


# What to do with prefetch_factor beside more workers, with its value: blind check 39 read
# "raise num_workers to about 9 and prefetch_factor" and could not tell to what. Two batches a
# worker (torch's default) keep the queue full in steady state; more only absorb a step's spread.
PREFETCH = (" (keep prefetch_factor at 2, torch's default, or more: the batches each worker "
            "makes ahead)")


def input_text(a: AdviceInputs, s: dict[Bottleneck, float], p: whatif.Prediction, helps: bool) -> str:
    """``p``: the fix's prediction; ``helps``: whether ``advice.recommend`` advises it."""
    cpu = job_cpu(a.traits)
    pin = ", set pin_memory=True" if on_gpu(a) else ""
    share = pct_whole(s[Bottleneck.INPUT])
    if not helps:   # a refused fix's text says so first (blind check 21 read "raise num_workers to
        # at least 1" as the advice of an entry listed as not helping)
        count = worker_count(a) if has_workers(a) else 0 if a.traits.single_process_loader else None
        now = f" with num_workers={count}" if count is not None else ""
        return (f"The DataLoader wait is {share} {of_step(a)}{now}, but more DataLoader workers "
                f"would not help here.{_loading(a, cpu)}")
    if has_workers(a):   # the loading is in workers already
        count = worker_count(a)
        more = p.workers if count else None
        raise_to = f" to about {more}" if more else ""
        now = f" with num_workers={count}" if count else ""
        return (f"The DataLoader wait is {share} {of_step(a)}{now}: raise "
                f"num_workers{raise_to}{pin}{PREFETCH}.{_loading(a, cpu)}{_with_fewer_threads(a)}")
    workers = " with num_workers=0" if a.traits.single_process_loader else ""
    need = p.workers if a.traits.single_process_loader else None
    raise_to = f" to at least {need}" if need else ""
    onto = " (or onto the GPU)" if on_gpu(a) else ""
    return (f"The DataLoader wait is {share} {of_step(a)}{workers}: raise "
            f"num_workers{raise_to}{pin}{PREFETCH}, and move decoding/augmentation out "
            f"of the training process{onto}.{_loading(a, cpu)}{_with_fewer_threads(a)}")


def _with_fewer_threads(a: AdviceInputs) -> str:
    """Where the model's intra-op threads outnumber the cores the machine's other work leaves
    (``advice_threads.crowded``), the workers' text names fewer threads with them: a worker takes
    turns with those threads, whose operators each wait for the slowest. Blind check 23 (2-core
    VM, two busy loops, four loaders at torch's 2 threads): 1 worker alone ran 0.68x, 0.94x,
    0.95x and 1.69x by the mean step; 1 worker at one thread 0.17-0.36x; one thread alone
    0.19-0.43x. It names the training process: blind check 24 read "run the workers with
    torch.set_num_threads(1)" as a setting for the workers, which run one thread already."""
    found = advice_threads.crowded(a)
    if found is None:
        return ""
    cpu = found[0]
    left = advice_threads.cores_left(cpu)
    return (f" The model's {cpu.threads} intra-op threads outnumber the {left:.2g} cores the "
            "machine's other work leaves it, and a worker takes turns with them: add the workers "
            "and call torch.set_num_threads("
            f"{advice_threads.threads_to_use(cpu)}) in the training process, not in the workers, "
            "which run one thread each already (fewer-intra-op-threads); that gives the workers the "
            "cores the threads held.")


def cpu_loading(a: AdviceInputs) -> bool:
    """A single-process loader whose wait is CPU work (decoding, augmenting): by the loader's own
    timing where the step timer recorded it (the thread that makes the batch on a core or
    waiting for one), else by the host samples."""
    if not a.traits.single_process_loader:
        return False
    if a.traits.loader_busy is not None:
        return a.traits.loader_busy >= whatif.CPU_LOADING
    cpu = job_cpu(a.traits)
    return cpu is not None and whatif.loading_cores(a.view, cpu) >= whatif.CPU_LOADING


def workers_cpu_loading(a: AdviceInputs) -> float | None:
    """A loader with workers whose batches are CPU work: each worker on a core or waiting for one
    at least ``CPU_LOADING`` of the time (the step timer's ``workers_busy_s`` over the workers and
    the step), the time its batch takes its workers (us); None where not, or not recorded. Blind
    check 39: two workers doing FFTs on 2 cores were refused more workers (no core for them) and
    compile, and the job was told nothing to do."""
    busy, n, step = a.traits.workers_busy_s, worker_count(a), a.traits.cpu_step_s
    if busy is None or n <= 0 or not step:
        return None
    return busy * 1e6 if busy / (n * step) >= whatif.CPU_LOADING else None


def held_share(a: AdviceInputs, s: dict[Bottleneck, float]) -> float:
    """The input share with the training thread's wait for cores the job's DataLoader workers
    held (``AdviceInputs.loader_held_us``), as the label counts it: blind check 41's 3 workers
    augmenting on 2 cores kept up (a 1.5% wait) while the model waited ~20% of its step for the
    cores they held, and the job read input-bound with no input advice."""
    return s[Bottleneck.INPUT] + (a.loader_held_us / a.view.step_time if a.view.step_time > 0 else 0.0)


def workers_unmeasured(a: AdviceInputs) -> str | None:
    """Why no step is predicted for more workers, or None: the loading is CPU work, so workers
    need cores of their own, and the cores the machine leaves the job were not measured (the host
    sampler saw too few untraced steps). Predicting as if the cores were free told a blind
    augmenting job on 2 busy cores "at least 7 workers", -86%; applied, it ran 1.03x."""
    if job_cpu(a.traits) is not None or not cpu_loading(a):
        return None
    return ("the loading is CPU work (the thread that makes the batch ran or waited for a core "
            f"{pct_whole(a.traits.loader_busy or 0.0)} of its time in next(loader)), so workers need "
            "cores of their own, and how many the machine's other work leaves was not measured (the "
            "host sampler saw too few untraced steps: profile a longer run, a larger --skip)")


# The host samples' untraced steps (the whole run's) against the steps around the traced window
# (their mean, the same statistic): past this ratio either way the run went through another
# regime than the one diagnosed, and cores measured over it do not bound the window's step.
REGIME_X = 2.0


def workers_other_regime(a: AdviceInputs) -> str | None:
    """Why no step is predicted for more workers, or None: the cores the job used were measured
    over untraced steps whose mean is REGIME_X or more times (or less than 1/REGIME_X of) the
    mean of the steps the verdict is of. Blind check 42: an MLP whose two intra-op threads spun
    for seconds a step while another session loaded the machine, then ran at 42.6 ms around the
    window; the prediction started from the run's mean step, 1,365 ms, said -26% with a worker,
    and a worker measured 1.06-1.09x (slower); the same job profiled quiet said "would not help"."""
    cpu, ref = job_cpu(a.traits), a.reference_mean_us
    if cpu is None or not cpu.step_us or not ref or ref <= 0:
        return None
    x = cpu.step_us / ref
    if 1 / REGIME_X < x < REGIME_X:
        return None
    return (f"the job's cores were measured over its untraced steps, whose mean ({ms(cpu.step_us)}) is "
            f"{x:.3g}x the mean of the steps around the traced window ({ms(ref)}): the run went "
            "through another regime than the one diagnosed (a busier machine, a phase of the job), "
            "and those cores do not bound this step; profile a stretch where the job runs as it "
            "does around the window")


def cheaper_input_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    cpu, in_workers = job_cpu(a.traits), workers_cpu_loading(a)
    if in_workers is not None:
        made = (f"{ms(in_workers)} a batch of its {worker_count(a)} workers' time, on a core or "
                "waiting for one" + (f"; the training thread waited {ms(a.loader_held_us)} a step for "
                                     "cores they held" if a.loader_held_us > 0 else ""))
    else:
        batch_us = whatif.loader_work(a.view, cpu, on_gpu(a)).batch_us if cpu else a.view.input_wait
        made = f"{ms(batch_us)} a batch on the thread that makes it"
    return (f"The DataLoader wait is {pct_whole(s[Bottleneck.INPUT])} {of_step(a)} and it is CPU work "
            f"({made}): make each batch cheaper to "
            "produce - decode once and store the decoded (or smaller) samples, move augmentation "
            "to the accelerator, or load on other machines - since workers only move that work to "
            "other cores, and only where cores are free.")


def _comm_detail(a: AdviceInputs) -> str:
    if not a.collectives:
        return ""
    c = a.collectives[0]
    out = f" ({c.collective}"
    if c.exposed_per_step_us is not None:
        out += f": {ms(c.exposed_per_step_us)} exposed per step"
    if c.busbw_gbps is not None:
        out += f", bus bandwidth {c.busbw_gbps:.3g} GB/s"
        if c.link_peak_gbps:
            out += f" = {pct_whole(c.busbw_gbps / c.link_peak_gbps)} of the link's peak"
    return out + ")"


def exposed_share(a: AdviceInputs) -> float:
    """Exposed communication's share of the step at the job's own pace, as ``classify.shares``
    reads it (a busy machine's part of the step left out, so the advice applies as on a quiet one)."""
    own = a.view.own_step
    return a.view.comm_exposed / own if own > 0 else 0.0


def comm_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    t = a.traits
    if t.fsdp:
        how = "overlap it with compute (FSDP backward_prefetch and forward_prefetch)"
    elif t.ddp:
        per_step = _collectives_per_step(a)
        how = ("overlap it with backward: a smaller DDP bucket_cap_mb starts each bucket's "
               "all-reduce while backward still runs" if per_step is not None and per_step < 2 else
               f"overlap the last of it with backward: DDP already all-reduces {per_step:.0f} buckets "
               "a step while backward runs, so what is left exposed is the last buckets' (a smaller "
               "bucket_cap_mb makes them smaller)" if per_step is not None else
               "overlap it with backward (DDP's bucket_cap_mb sets how early each all-reduce starts)")
    elif t.training:
        how = ("overlap it with backward: all-reduce gradients in buckets as backward produces them "
               "(DistributedDataParallel, or async_op=True per bucket)")
    else:
        how = "overlap it with compute (async_op=True, and wait only where the result is needed)"
    link = ", and check the interconnect" if on_gpu(a) else ""
    return (f"Communication not overlapped with compute is {pct_whole(exposed_share(a))} {of_step(a)}"
            f"{_comm_detail(a)}: {how}{link}.")


def _collectives_per_step(a: AdviceInputs) -> float | None:
    """All-reduces (or the job's busiest collective) per step and rank, in the view (the
    table's counts are summed over the ranks)."""
    if not a.collectives or not a.steps_per_rank:
        return None
    return a.collectives[0].count / a.steps_per_rank / max(a.ranks, 1)


def comm_cost_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    b = a.view
    parts = [f"{ms(b.comm_exposed_wall)} exposed"]   # by the wall clock, as the share
    if b.comm_work > 0:
        parts.append(f"{ms(b.comm_work)} of the training thread's copies into and out of DDP's buckets")
    if b.comm_contention > 0:
        parts.append(f"{ms(b.comm_contention)} of compute slowed beside the collectives (the cores "
                     "and memory they took)")
    k = whatif.ACCUMULATE_STEPS
    # a job that calls dist.all_reduce itself has no no_sync() or comm hook (blind check 33: a
    # manual 32 MB all-reduce a step was told to use "DDP's no_sync()")
    how, fewer = (("under DDP's no_sync() and all-reduce on the last",
                   "DDP's bf16_compress_hook or fp16_compress_hook, PowerSGD") if a.traits.ddp else
                  ("and all-reduce their sum once, on the last",
                   "all-reduce a bf16 or fp16 copy, or a low-rank one as PowerSGD does"))
    return (f"Communication costs {pct_whole(s[Bottleneck.COMMUNICATION])} {of_step(a)} "
            f"({', '.join(parts)}): all-reduce less often - accumulate gradients over {k} micro-batches "
            f"{how} (each step then moves the same bytes for {k} times the samples, where the larger "
            f"effective batch suits the training) - or send fewer bytes ({fewer})"
            + ("; on a CPU, gloo's threads run on the ranks' own cores: where the ranks share one "
               "machine, one process with more intra-op threads needs no all-reduce at all"
               if not on_gpu(a) and a.ranks > 1 else "")
            + ".")


def own_launch_share(b: TimeBreakdown) -> float:
    """The job's own host work (Python, launches, syncs) over the step: the host gaps less the
    training thread's wait for a core (``host_waiting``), which no launch-overhead fix removes."""
    waiting = max(b.host_waiting, b.host_stalled)
    return (b.host_overhead - waiting) / b.step_time if b.step_time > 0 else 0.0


def contention_share(b: TimeBreakdown) -> float:
    """The training thread's wait for cores the job's own workers and threads held, over the step."""
    return max(0.0, b.host_waiting - b.host_stalled) / b.step_time if b.step_time > 0 else 0.0


def contention_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    t = a.traits
    workers = max(t.dataloader_workers, default=0)
    free = (f" ({t.cpus} cores, {workers} DataLoader workers, {t.intra_op_threads} intra-op "
            "threads)" if t.cpus and t.intra_op_threads else "")
    whose = ("while the job's own workers and threads hold them"
             if a.host_wait is None or a.host_wait.own_share is not None else
             "(who held them the host sampler could not say: where it is the job's own workers and "
             "threads)")
    return (f"The training thread waits for a core {pct_whole(contention_share(a.view))} of step time "
            f"{whose}{free}: leave it a core - fewer "
            "intra-op threads (torch.set_num_threads), DataLoader workers sized to the cores left "
            "free, augmentation moved to the GPU (torchvision.transforms.v2 on CUDA tensors).")


def graphs_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"The GPU is idle {pct_whole(own_launch_share(a.view))} of step time on the job's own host "
            "work (launches, Python, syncs) with no input wait: capture "
            "the step with CUDA graphs or torch.compile(mode='reduce-overhead'), remove host syncs "
            "(.item(), .cpu(), print of tensors) from the loop, and grow the batch so each launch "
            "does more work.")


def compiled_graphs_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    n = f"{a.syncs.per_step:.3g} host syncs a step" if a.syncs is not None else "few host syncs"
    return (f"The step is compiled, yet the GPU is idle {pct_whole(own_launch_share(a.view))} of step "
            f"time on the job's own host work with no input wait and {n}, too few to cost it: "
            "capture the step with CUDA graphs (torch.compile(mode='reduce-overhead') or "
            "torch.cuda.graphs), check for graph breaks (TORCH_LOGS=graph_breaks), and grow the "
            "batch so each launch does more work.")


def syncs_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"The GPU is idle {pct_whole(s[Bottleneck.HOST])} {of_step(a)} with no input wait although "
            "the step is compiled: remove host syncs (.item(), .cpu(), print of tensors) and graph "
            "breaks from the loop, and grow the batch so each launch does more work.")


def compile_small_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"{pct_whole(s[Bottleneck.HOST])} {of_step(a)} is dispatch overhead and gaps between "
            f"operators (many tiny ops): fuse them with torch.compile ({compile_target(a)}), or batch "
            "the work into fewer, larger tensor ops." + module_loop_text(a))


def compile_target(a: AdviceInputs) -> str:
    """What to give torch.compile: the model, or, where a loop calls the same layers a slice
    at a time, what holds the loop (blind set 12: a reader who stopped at "the model" compiled
    the cell alone, 1.10x slower, where the loop's function compiled ran 0.40x)."""
    f = a.compile_facts
    if f is None or f.loops.module_iters < 1:
        return "the model: its forward and backward"
    return (f"the function or module that holds the loop calling the same layers "
            f"{f.loops.module_iters:.0f} times a step, not the module it calls")


def module_loop_text(a: AdviceInputs) -> str:
    """Where a loop calls the same layers on one slice at a time: which loop, why not the
    module alone (each call of a compiled module is a graph call of its own), and the batch."""
    f = a.compile_facts
    if f is None or f.loops.module_iters < 1:
        return ""
    return (f" The loop calls them on one slice each (x[i], x[:, t]; its body: {f.loops.module_body}); "
            "compiled alone, the module it calls would be a graph call per iteration. Where the "
            "iterations do not depend on each other (samples, not a recurrence), better, call the "
            "layers once on the whole batch.")


def optimizer_loop_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    f = a.compile_facts
    assert f is not None
    loop = optimizer_loop(f)
    assert loop is not None
    share = pct_whole(loop.us / f.step_us if f.step_us else 0.0)
    counts = (f"{loop.calls:.0f} operator calls a step over {loop.params:.0f} parameter tensors, "
              f"{share} of the traced step")
    if loop.by_hand:
        return (f"The optimizer is a Python loop: after the backward, {counts}. torch.compile of the "
                "model does not reach it: compile the function that updates the parameters too "
                "(torch.compile on the optimizer's step), so each tensor's update is one fused kernel.")
    return (f"The optimizer's step updates one tensor at a time ({counts}): compile it "
            "(torch.compile(optimizer.step), as PyTorch's compiled-optimizer recipe does), so each "
            "tensor's update is one fused kernel; torch.compile of the model does not reach it.")


def vectorise_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    f = a.compile_facts
    assert f is not None
    lp = f.loops
    per = lp.loop_calls / lp.loop_iters if lp.loop_iters else 0.0
    return (f"A Python loop over samples runs {lp.loop_iters:.0f} iterations per step ({per:.0f} "
            f"operator calls each, forward and backward; its body: {lp.body}): write it as one "
            "expression over the batch (index with gather or masks instead of a row at a time, or "
            "torch.vmap a per-sample function). torch.compile of the model does not reach a loop "
            "outside it, and a .tolist() or .item() in it breaks a compiled graph.")


def micro_batches_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    f = a.compile_facts
    assert f is not None
    n = f.loops.passes
    after = max(1, round(n / whatif.LARGER_MICRO))
    return (f"Each optimizer step runs {n:.0f} forward/backward passes (gradient accumulation), and "
            "each pays its operator calls, the Python between them and AccumulateGrad whatever its "
            f"size: use larger micro-batches and fewer accumulation steps ({after} of "
            f"{n / after:.2g}x the size for the same samples per optimizer step), as far as memory "
            "allows.")


def batch_small_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"{pct_whole(s[Bottleneck.HOST])} {of_step(a)} is dispatch overhead and gaps between "
            "operators although the step is compiled: batch the work into fewer, larger tensor "
            "ops, vectorise Python loops, and grow the batch.")


def _largest(a: AdviceInputs) -> str:
    return f" (largest: {', '.join(a.top_memory_ops[:3])})" if a.top_memory_ops else ""


def fuse_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    fusable = [n for n in a.top_memory_ops if n not in MODEL_OPS]
    largest = f" (largest: {', '.join(fusable[:3])})" if fusable else ""
    return (f"Memory-bound {device_unit(a)} work is {pct_whole(s[Bottleneck.MEMORY])} {of_step(a)}"
            f"{largest}: fuse chains of elementwise and normalisation ops with torch.compile"
            + ("" if a.compile_facts is None or a.compile_facts.loops.module_iters < 1
               else f" ({compile_target(a)})")
            + ", so each reads and writes its data once (it also closes the gaps between ops)."
            + module_loop_text(a))


def autocast_after_allocator(a: AdviceInputs) -> bool:
    """bf16 autocast on a CPU whose job faults in pages every step: autocast's bf16 copies of
    the weights are new blocks every step and would fault in too, so its prediction is from the
    step after allocator-keep-memory (``advice._autocast_cpu``) and the text says to apply that
    first."""
    return (not on_gpu(a) and a.autocast is not None and a.faults is not None
            and a.faults.faults >= page_faults.MIN_MOVED_FAULTS)


ALLOCATOR_FIRST = (" Apply allocator-keep-memory first: autocast makes new bf16 copies of the weights "
                   "every step, and under glibc's defaults they fault in every step as the job's "
                   "temporaries do now (bf16 alone can then be slower than fp32); the prediction is "
                   "from the step after it.")


def bf16_bytes_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    if a.autocast is not None and not on_gpu(a):
        # the layers were timed: the same autocast line as lower-precision, said as it is
        return (f"Memory-bound {device_unit(a)} work is {pct_whole(s[Bottleneck.MEMORY])} {of_step(a)} in "
                f"fp32{_largest(a)}: run the forward in bf16 (torch.autocast('cpu', "
                "dtype=torch.bfloat16)); the layers' GEMMs then read bf16 copies of the weights and "
                "the activations move half the bytes."
                + (ALLOCATOR_FIRST if autocast_after_allocator(a) else ""))
    return (f"Memory-bound {device_unit(a)} work is {pct_whole(s[Bottleneck.MEMORY])} {of_step(a)} in fp32"
            f"{_largest(a)}: keep activations in bf16 (torch.autocast) to halve the bytes moved.")


def fused_opt_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return ("The optimizer updates parameters one tensor at a time: pass foreach=True (or "
            "fused=True) to it, so each update is a few large kernels instead of many small ones.")


def copies_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    f = a.view.memcpy_exposed / a.view.step_time
    return (f"Memory copies not hidden by compute are {pct_whole(f)} of step time: use pinned host "
            "memory with non_blocking=True copies and avoid per-step host<->device transfers.")


def precision_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    fam, ratio = faster_dtype(a) or fastest_lower(a) or ("bf16", 1.0)
    mfu = f", MFU {pct_whole(a.mfu.value)}" if a.mfu.value is not None else ""
    if on_gpu(a):
        how = "run matmuls in bf16 (torch.autocast)" + (
            " or allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True)"
            if "tf32" in a.device_peaks else "")
    else:
        how = ("run matmuls in bf16 (torch.autocast('cpu', dtype=torch.bfloat16)): this CPU's "
               f"measured {fam} GEMM peak is {1 / ratio:.2g}x its fp32 one")
    return (f"Compute-bound {device_unit(a)} work is {pct_whole(s[Bottleneck.COMPUTE])} {of_step(a)} in fp32"
            f"{mfu}: {how}." + (ALLOCATOR_FIRST if autocast_after_allocator(a) else ""))


def attention_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return ("Attention is built from matmuls and a softmax: use "
            "torch.nn.functional.scaled_dot_product_attention (fused, flash/memory-efficient "
            "kernels), which never writes the attention matrix to memory.")


def shapes_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"MFU is {pct_whole(a.mfu.value or 0.0)} and the largest GEMMs have dimensions that are not "
            f"multiples of {TENSOR_CORE_MULTIPLE}: pad hidden sizes, vocabulary and batch to "
            "multiples of 64 so they run on tensor cores without padding.")


def near_peak_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"Compute-bound {device_unit(a)} work is {pct_whole(s[Bottleneck.COMPUTE])} {of_step(a)} at MFU "
            f"{pct_whole(a.mfu.value or 0.0)}, near what the math allows: gains now come from doing "
            "fewer FLOPs (a smaller model, less recomputation) or from more devices.")


def straggler_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    st = a.stragglers
    assert st is not None
    worst = worst_rank(st)
    slow = st.per_rank_step_us.get(str(worst), 0) / st.median_step_us - 1
    return (f"Rank {worst} is {pct_whole(slow)} slower per step than the median rank; every other rank "
            "waits for it at each collective: check that node's clocks and thermals, its input "
            "shard, and CPU contention.")


def worst_rank(st: Stragglers) -> int:
    return max(st.ranks, key=lambda r: st.per_rank_step_us.get(str(r), 0))

